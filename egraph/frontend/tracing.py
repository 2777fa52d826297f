"""`@function`: trace a Tensor function once per input signature into a FUNCTION node over positional PARAMs.

A plain function stays a FUNCTION in the CALL (the lowering inlines it); `@function(precompile=True)` becomes an opaque
CALL with its own output buffers when callified (spec §4.2.1)."""
from __future__ import annotations
import functools
from egraph.ir.ops import Node, Ops, ParamArg, CallInfo
from egraph.ir.dtype import dtypes
from egraph.ir.errors import CallsatError
from egraph.frontend.tensor import Tensor

class Function:
  def __init__(self, fxn, precompile: bool = False, name: str | None = None):
    self.fxn, self.info = fxn, CallInfo(name or fxn.__name__, precompile)
    self.traces: dict[tuple, tuple[Node, bool]] = {}
    functools.update_wrapper(self, fxn)

  def trace(self, *args) -> tuple[Node, bool]:
    """(TUPLE body over PARAMs, whether the function returned a tuple) for these argument types."""
    sig = tuple((a.shape, a.dtype, a.device) for a in args)
    if (hit := self.traces.get(sig)) is None:
      params = [Tensor(Node(Ops.PARAM, a.dtype, (), ParamArg(i, a.shape, a.device))) for i, a in enumerate(args)]
      out = self.fxn(*params)
      many = isinstance(out, (tuple, list))
      outs = list(out) if many else [out]
      if not outs or not all(isinstance(o, Tensor) for o in outs):
        raise CallsatError(f"function {self.info.name}: must return a Tensor or a tuple of Tensors, got {type(out).__name__}")
      hit = self.traces[sig] = (Node(Ops.TUPLE, dtypes.void, tuple(o.node for o in outs)), many)
    return hit

  def __call__(self, *args):
    if not all(isinstance(a, Tensor) for a in args): raise CallsatError(f"function {self.info.name}: arguments must be Tensors")
    body, many = self.trace(*args)
    f = Node(Ops.FUNCTION, dtypes.void, (body, *(a.node for a in args)), self.info)
    outs = [Tensor(Node(Ops.GETTUPLE, None, (f,), i)) for i in range(len(body.src))]
    return tuple(outs) if many else outs[0]

def function(fxn=None, *, precompile: bool = False, name: str | None = None):
  """Decorator: `@function` or `@function(precompile=True)`."""
  if fxn is None: return lambda f: Function(f, precompile, name)
  return Function(fxn, precompile, name)
