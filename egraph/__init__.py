"""callsat's first package: the IR (floor 1), the e-graph engine (floor 3) and the front ends (floor 6).

The package face re-exports lazily (a module `__getattr__`), so `import egraph.ir` loads no egglog and no front end."""
from egraph.face import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
