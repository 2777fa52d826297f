"""callsat's first package: the IR (floor 1), the e-graph engine (floor 3) and the front ends (floor 6).

The package face re-exports lazily (a module `__getattr__`), so `import egraph.ir` loads no egglog and no front end."""
import importlib

_EXPORTS = {
  "CallsatError": "egraph.errors", "ShapeError": "egraph.errors", "DTypeError": "egraph.errors",
  "DeviceError": "egraph.errors", "UnsupportedOpError": "egraph.errors", "LimitError": "egraph.errors",
  "EngineError": "egraph.errors",
  "dtypes": "egraph.dtype", "DType": "egraph.dtype",
  "Node": "egraph.ir", "Ops": "egraph.ir", "GroupOp": "egraph.ir",
  "Variable": "egraph.symbolic",
  "Limits": "egraph.runner", "Schedule": "egraph.runner", "StopReason": "egraph.runner",
  "CostModel": "egraph.cost", "CallifyReport": "egraph.report",
  "callify": "egraph.driver", "CallifyResult": "egraph.driver",
  "Tensor": "egraph.tensor", "function": "egraph.tracing",
}
__all__ = list(_EXPORTS)

def __getattr__(name: str):
  if (mod := _EXPORTS.get(name)) is None: raise AttributeError(f"module 'egraph' has no attribute {name!r}")
  value = getattr(importlib.import_module(mod), name)
  globals()[name] = value
  return value

def __dir__(): return sorted(set(globals()) | set(_EXPORTS))
