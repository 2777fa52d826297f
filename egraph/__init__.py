"""callsat's first package: the IR (floor 1), the e-graph engine (floor 3) and the front ends (floor 6).

The package face re-exports lazily (a module `__getattr__`), so `import egraph.ir.ops` loads no egglog and no front end."""
from egraph.ir.face import lazy_exports

_EXPORTS = {
  "CallsatError": "egraph.ir.errors", "ShapeError": "egraph.ir.errors", "DTypeError": "egraph.ir.errors",
  "DeviceError": "egraph.ir.errors", "UnsupportedOpError": "egraph.ir.errors", "LimitError": "egraph.ir.errors",
  "EngineError": "egraph.ir.errors",
  "dtypes": "egraph.ir.dtype", "DType": "egraph.ir.dtype",
  "Node": "egraph.ir.ops", "Ops": "egraph.ir.ops", "GroupOp": "egraph.ir.ops",
  "Variable": "egraph.ir.symbolic",
  "Limits": "egraph.engine.runner", "Schedule": "egraph.engine.runner", "StopReason": "egraph.engine.runner",
  "CostModel": "egraph.engine.cost", "CallifyReport": "egraph.engine.report",
  "callify": "egraph.engine.driver", "CallifyResult": "egraph.engine.driver",
  "Tensor": "egraph.frontend.tensor", "synchronize": "egraph.frontend.tensor", "function": "egraph.frontend.tracing",
}
__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
