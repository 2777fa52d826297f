"""The bridge's conversion back to tinygrad: `int_move` builds a movement op with int arguments as the very UOps
tinygrad 0.14's movement methods build (UOps are hash-consed, so `is` compares whole graphs), for every op, rank and
argument drawn."""
import math
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
tinygrad = pytest.importorskip("tinygrad")
from tinygrad import Tensor   # noqa: E402
from egraph.ir import Ops   # noqa: E402
from egraph.tinygrad_convert import int_move   # noqa: E402

@st.composite
def moves(draw):
  """(op, shape, callsat arg, tinygrad method call) for a movement op that is not a no-op."""
  shape = tuple(draw(st.lists(st.sampled_from([1, 1, 2, 3, 4, 6]), min_size=0, max_size=4)))
  nd = len(shape)
  op = draw(st.sampled_from([Ops.RESHAPE, Ops.PERMUTE, Ops.FLIP, Ops.SHRINK, Ops.PAD, Ops.EXPAND]))
  if op is Ops.RESHAPE:
    n = math.prod(shape)
    arg = draw(st.sampled_from([(n,), (1, n), (n, 1, 1), tuple(d for d in shape if d != 1), (1,) + shape]))
    call = lambda x: x.reshape(arg)
  elif op is Ops.PERMUTE:
    arg = tuple(draw(st.permutations(range(nd))))
    call = lambda x: x.permute(arg)
  elif op is Ops.FLIP:
    arg = tuple(draw(st.lists(st.booleans(), min_size=nd, max_size=nd)))
    call = lambda x: x.flip(tuple(i for i, f in enumerate(arg) if f))
  elif op is Ops.SHRINK:
    arg = tuple(draw(st.tuples(st.integers(0, d - 1), st.integers(1, d)).filter(lambda p: p[0] < p[1])) for d in shape)
    call = lambda x: x.shrink(arg)
  elif op is Ops.PAD:
    arg = tuple(draw(st.tuples(st.integers(0, 2), st.integers(0, 2))) for _ in shape)
    call = lambda x: x.pad(arg)
  else:
    arg = tuple(draw(st.sampled_from([d, 2, 5])) if d == 1 else d for d in shape)
    call = lambda x: x.expand(arg)
  noop = op is Ops.RESHAPE and arg == shape or op is Ops.PERMUTE and arg == tuple(range(nd)) or \
         op is Ops.FLIP and not any(arg) or op is Ops.SHRINK and arg == tuple((0, d) for d in shape) or \
         op is Ops.PAD and not any(a or b for a, b in arg) or op is Ops.EXPAND and arg == shape
  return op, shape, arg, call, noop

@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(moves())
def test_int_move_is_what_tinygrad_builds(m):
  op, shape, arg, call, noop = m
  if noop: return   # the bridge returns the source before building anything
  x = Tensor.empty(*shape).uop
  assert int_move(op, x, shape, arg) is call(x)
