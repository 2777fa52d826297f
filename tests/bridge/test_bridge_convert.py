"""The bridge's conversion back to tinygrad: `int_move` builds a movement op with int arguments as the very UOps
tinygrad 0.14's movement methods build (UOps are hash-consed, so `is` compares whole graphs), for every op, rank and
argument drawn; `param_like` a buffer argument's PARAM as tinygrad's method builds it."""
import math
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
tinygrad = pytest.importorskip("tinygrad")
from tinygrad import Tensor   # noqa: E402
from egraph.ir.ops import Ops   # noqa: E402
from egraph.bridge.convert import int_move   # noqa: E402

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

def test_every_tinygrad_dtype_maps_to_callsats():
  """Each of tinygrad's storable dtypes (fp8 included) is the callsat dtype named as tinygrad's attribute, same size."""
  from tinygrad import dtypes as tdt
  from egraph.ir.dtype import dtypes
  from egraph.bridge.convert import to_dtype
  for t in tdt.all:
    d = to_dtype(t)
    assert d in dtypes.all and d.itemsize == t.itemsize and getattr(tdt, d.name) is t

@pytest.mark.parametrize("device", ["CPU", "NULL", "DISK:/tmp/callsat-param-like"])
@pytest.mark.parametrize("dtype", ["float32", "int8", "bool", "half", "uint64", "bfloat16", "fp8e4m3", "fp8e5m2fnuz"])
def test_param_like_is_tinygrads(device, dtype):
  """A buffer argument's PARAM, built from the buffer's own src and arg, is the object tinygrad's param_like builds."""
  from tinygrad import dtypes
  from tinygrad.uop.ops import UOp
  from egraph.bridge.convert import param_like
  for n in (1, 5, 64):
    b = UOp.new_buffer(device, n, getattr(dtypes, dtype))
    for slot in (0, 3):
      assert param_like(b, slot) is b.param_like(slot)
  x = Tensor.empty(4, 4).uop.shrink(((0, 2), (0, 4)))   # not a buffer: tinygrad's own method
  assert param_like(x, 1) is x.param_like(1)
