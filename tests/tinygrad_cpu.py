"""For test modules that run tinygrad programs on its CPU device: skip the module where that device does not compile
(tinygrad's PYTHON device would take minutes on their sizes)."""
import pytest

def require_cpu() -> None:
  """Call at module level, after pytest.importorskip("tinygrad")."""
  from tinygrad import Tensor, Context
  try:
    with Context(DEV="CPU"): (Tensor([1.0, 2.0]) + 1).numpy()
  except Exception: pytest.skip("tinygrad's CPU device does not compile here", allow_module_level=True)
