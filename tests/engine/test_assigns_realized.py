"""callify(assigns="realized"): tinygrad 0.14 reads an assign into a view of a realize point as a write into that
point's storage (the bridge's mode); the default gives it a fresh buffer (spec rule 8). The assign's value is the same;
in 0.14's reading the point's storage then holds what was written (tinygrad's tensor is the assign from then on)."""
import numpy as np
import pytest
from egraph.frontend.tensor import Tensor
from egraph.engine.driver import callify
from egraph.engine.encode import encode
from egraph.ir.errors import CallsatError
from egraph.ir.ops import Ops
from lower.runtime import run_call, read
from egraph.ir.storage import STORAGE

def _base(v):
  while v.op is not Ops.BUFFER: v = v.src[0]
  return v

def _program(device="CPU"):
  """c = (a*2).contiguous(); then an assign of -1 into c[1:4] (tinygrad's c[1:4].assign(...), as IR)."""
  c = (Tensor(np.arange(6, dtype=np.float32), device=device) * 2).contiguous().node
  v = c.shrink(((1, 4),))
  asg = v.after(v.store(Tensor(np.full(3, -1.0, dtype=np.float32), device=device).node))
  return c, asg

@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_the_assign_writes_the_points_storage(device):
  c, asg = _program(device)
  fresh, realized = callify(asg, c, cache=False), callify(asg, c, cache=False, assigns="realized")
  vals = {}
  for name, res in (("fresh", fresh), ("realized", realized)):
    st = STORAGE.copy()
    run_call(res.call, st)
    vals[name] = (read(res.buffer_map[asg], st), read(res.buffer_map[c], st))
  for name in vals: np.testing.assert_array_equal(vals[name][0], [-1, -1, -1])   # the assign's value: the same
  np.testing.assert_array_equal(vals["fresh"][1], [0, 2, 4, 6, 8, 10])            # rule 8: c keeps its value
  np.testing.assert_array_equal(vals["realized"][1], [0, -1, -1, -1, 8, 10])      # 0.14: c's storage was written
  assert _base(realized.buffer_map[asg]) is _base(realized.buffer_map[c])
  assert _base(fresh.buffer_map[asg]) is not _base(fresh.buffer_map[c])
  assert realized.report.buffers < fresh.report.buffers

def test_realized_is_part_of_the_cache_key():
  c, asg = _program()
  assert callify(asg, c, assigns="realized").report.buffers < callify(asg, c).report.buffers

def test_unknown_assigns_mode_is_refused():
  c, asg = _program()
  with pytest.raises(CallsatError, match="assigns must be one of"): encode([asg], "inplace")

def test_pins_follow_the_mode():
  c, asg = _program()
  assert not encode([asg, c]).pins and encode([asg, c], "realized").pins

def test_contiguous_range_of_a_per_device_buffer_is_a_view():
  """A replicated (tuple-device) BUFFER: a contiguous slice of it is each device's own SLICE, no copy (as tinygrad)."""
  from egraph.ir.ops import new_buffer
  from egraph.ir.dtype import dtypes
  b = new_buffer(12, dtypes.float32, ("PYTHON", "PYTHON:1"))
  v = b.reshape((4, 3)).shrink(((1, 3), (0, 3))).contiguous()
  res = callify(v, cache=False)
  assert res.report.views == 1 and res.report.buffers == 0 and res.report.stores == 0
  st = STORAGE.copy()
  st.set_data(b, np.concatenate([np.arange(12), np.arange(12)]).astype(np.float32))   # each device's copy
  run_call(res.call, st)
  np.testing.assert_array_equal(read(res.buffer_map[v], st), np.arange(3, 9, dtype=np.float32).reshape(2, 3))

def test_bitcast_is_a_view_only_where_tinygrad_folds_it():
  """tinygrad 0.14 folds a BITCAST into a retyped view only under a CONTIGUOUS or COPY, as a STORE's target or as a
  realize point; one a kernel reads stays in that kernel (the CALL passes the buffer in its own dtype: a bfloat16 view
  there gave tinygrad a `__bf16*` kernel argument clang cannot compile). The spec's reading (rule 3) views every one."""
  from egraph.ir.ops import Node, new_buffer
  from egraph.ir.dtype import dtypes
  b = new_buffer(8, dtypes.int16, "CPU")
  read_by_kernel = Node(Ops.CAST, dtypes.float32, (Node(Ops.BITCAST, dtypes.bfloat16, (b,)),))
  realized_itself = Node(Ops.BITCAST, dtypes.int32, (b.shrink(((2, 6),)),))
  for assigns, args in (("fresh", {dtypes.bfloat16, dtypes.float32}), ("realized", {dtypes.int16, dtypes.float32})):
    res = callify(read_by_kernel, realized_itself, cache=False, assigns=assigns)
    assert {a.dtype for a in res.call.src[1:]} == args, assigns
    view = res.buffer_map[realized_itself]   # a view of b, no copy, in both
    assert view.dtype == dtypes.int32 and _base(view) is b and res.report.stores == 1
    st = STORAGE.copy()
    st.set_data(b, np.arange(-4, 4, dtype=np.int16))
    run_call(res.call, st)
    np.testing.assert_array_equal(read(res.buffer_map[realized_itself], st), np.arange(-4, 4, dtype=np.int16)[2:6].view(np.int32))
