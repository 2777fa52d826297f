"""Named rule sets as data (floor 2: `registry`, `callify`) and the rule checker (floor 5: `check`, a hypothesis
soundness check against the numpy reference). The face re-exports lazily, so the engine importing `rules.registry`
loads no checker."""
import importlib

_EXPORTS = {"Rule": "rules.registry", "RULES": "rules.registry", "PHASES": "rules.registry", "register": "rules.registry",
            "rules_in": "rules.registry", "check": "rules.checker", "CheckResult": "rules.checker"}
__all__ = list(_EXPORTS)

def __getattr__(name: str):
  if (mod := _EXPORTS.get(name)) is None: raise AttributeError(f"module 'rules' has no attribute {name!r}")
  if mod == "rules.registry": importlib.import_module("rules.callify")   # the registry is full once the rule sets loaded
  value = getattr(importlib.import_module(mod), name)
  globals()[name] = value
  return value

def __dir__(): return sorted(set(globals()) | set(_EXPORTS))
