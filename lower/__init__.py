"""callsat's lowering (floor 4): the numpy reference executor, the kernel IR and scheduler, the LLVM and CUDA
renderers, compile and launch, and the runtime front door `run_call`. The face re-exports lazily."""
import importlib

_EXPORTS = {"run_call": "lower.runtime", "read": "lower.runtime", "check_device": "lower.runtime",
            "RUNNABLE": "lower.runtime", "evaluate": "lower.reference", "eval_node": "lower.reference"}
__all__ = list(_EXPORTS)

def __getattr__(name: str):
  if (mod := _EXPORTS.get(name)) is None: raise AttributeError(f"module 'lower' has no attribute {name!r}")
  value = getattr(importlib.import_module(mod), name)
  globals()[name] = value
  return value

def __dir__(): return sorted(set(globals()) | set(_EXPORTS))
