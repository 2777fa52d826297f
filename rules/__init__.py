"""Named rule sets as data (floor 2: `registry`, `callify`, `vocabulary`, `orders`) and the rule checker (floor 5:
`check`, a hypothesis soundness check against the numpy reference). The face re-exports lazily, so the engine importing `rules.registry`
loads no checker."""
import importlib
from egraph.ir.face import lazy_exports

_EXPORTS = {"Rule": "rules.registry", "RULES": "rules.registry", "PHASES": "rules.registry", "register": "rules.registry",
            "rules_in": "rules.registry", "check": "rules.testing.checker", "CheckResult": "rules.testing.checker"}
__all__ = list(_EXPORTS)

def _load_rule_sets(mod: str) -> None:
  if mod == "rules.registry": importlib.import_module("rules.callify")   # the registry is full once the rule sets loaded

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), before=_load_rule_sets)
