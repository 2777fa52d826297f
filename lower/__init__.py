"""callsat's lowering (floor 4): the numpy reference executor, the kernel IR and scheduler, the LLVM and CUDA
renderers, compile and launch, and the runtime front door `run_call`. The face re-exports lazily."""
from egraph.ir.face import lazy_exports

_EXPORTS = {"run_call": "lower.runtime", "read": "lower.runtime", "check_device": "lower.runtime",
            "RUNNABLE": "lower.runtime", "evaluate": "lower.reference", "eval_node": "lower.reference"}
__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
