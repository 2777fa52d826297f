"""lower.runtime: Storage, host buffers, run_call (validation, devices, outputs) and read."""
import numpy as np
import pytest
from egraph.ir.dtype import dtypes
from egraph.ir.errors import CallsatError, DeviceError, ShapeError
from egraph.ir.ops import Node, Ops, ParamArg, CallInfo, const, new_buffer
from egraph.ir import storage
from egraph.ir.storage import Storage, UnallocatedBufferError, host_buffer
from lower.runtime import run_call, read

@pytest.fixture
def S(): return Storage()

def P(slot, shape, dt=dtypes.float32, device="CPU"): return Node(Ops.PARAM, dt, (), ParamArg(slot, shape, device))
def call(body, *args): return Node(Ops.CALL, dtypes.void, (body, *args), CallInfo())
def add_body(n, dt=dtypes.float32, device="CPU"):
  p0, p1, p2 = P(0, (n,), dt, device), P(1, (n,), dt, device), P(2, (n,), dt, device)
  return p0.after(p0.store(p1.alu(Ops.ADD, p2))).sink()

def test_storage_basics(S):
  b = new_buffer(3, dtypes.int32, "CPU")
  assert b not in S and b.arg.uid not in S and S.get(b) is None and len(S) == 0
  with pytest.raises(UnallocatedBufferError, match=str(b.arg.uid)): S[b]
  a = S.allocate(b)
  assert a is S.allocate(b) and a.dtype == np.int32 and a.shape == (3,) and not a.any()   # idempotent, zeros
  assert b in S and S[b.arg.uid] is a and list(S) == [b.arg.uid] and S.nbytes == 12
  S.set_data(b, [[1, 2, 3]])
  assert S[b] is a and list(a) == [1, 2, 3]   # in place: earlier views see it
  with pytest.raises(ShapeError): S.set_data(b, [1, 2])
  with pytest.raises(CallsatError): S.allocate(b.reshape((3, 1)))
  c = S.copy()
  c[b][0] = 99
  assert S[b][0] == 1 and c[b][0] == 99   # independent arrays
  S.free(b)
  assert b not in S and S.nbytes == 0 and b in c

def test_host_buffer(S):
  b = host_buffer(np.arange(6, dtype=np.float64).reshape(2, 3), storage=S)
  assert b.op is Ops.BUFFER and b.device == "NPY" and b.dtype == dtypes.float64 and b.shape == (6,)   # numpy keeps its dtype
  np.testing.assert_array_equal(S[b], np.arange(6, dtype=np.float64))
  c = host_buffer([1.7, -1.2], dtypes.int32, storage=S)
  assert c.dtype == dtypes.int32 and list(S[c]) == [1, -1]
  src = np.array([1, 2], dtype=np.uint8)
  d = host_buffer(src, storage=S)
  src[0] = 9   # a copy, not the caller's array
  assert S[d][0] == 1 and d.dtype == dtypes.uint8

def test_default_storage():
  b = host_buffer(np.array([1.0, 2.0], dtype=np.float32))
  try:
    assert b in storage.STORAGE
    np.testing.assert_array_equal(read(b.reshape((2, 1))), [[1], [2]])
  finally: storage.STORAGE.free(b)

def test_run_call(S):
  a, b = host_buffer(np.array([1, 2, 3], np.float32), storage=S), host_buffer(np.array([10, 20, 30], np.float32), storage=S)
  out = new_buffer(3, dtypes.float32, "CPU")
  assert run_call(call(add_body(3), out, a, b), S) is None
  np.testing.assert_array_equal(read(out, S), [11, 22, 33])
  run_call(call(add_body(3), a, a, b), S)   # in place: read and write the same buffer
  np.testing.assert_array_equal(read(a, S), [11, 22, 33])

def test_run_call_slice_args_and_devices(S):
  big = host_buffer(np.arange(8, dtype=np.int32), storage=S)
  out = new_buffer(2, dtypes.int32, "CPU:1")
  sl = lambda o: Node(Ops.SLICE, dtypes.int32, (big,), (o, 2))
  run_call(call(add_body(2, dtypes.int32, "CPU:1"), out, sl(0), sl(6)), S)
  np.testing.assert_array_equal(read(out, S), [6, 8])
  run_call(call(add_body(2, dtypes.int32, "PYTHON"), sl(2), sl(0), sl(6)), S)
  np.testing.assert_array_equal(read(big, S), [0, 1, 6, 8, 4, 5, 6, 7])

@pytest.mark.parametrize("dev", ["CUDA", "CUDA:1"])
def test_run_call_rejects_later_devices(S, dev):
  a = host_buffer(np.ones(2, np.float32), storage=S)
  out = new_buffer(2, dtypes.float32, dev)
  p0, p1 = P(0, (2,), device=dev), P(1, (2,), device="NPY")
  c = call(p0.after(p0.store(Node(Ops.COPY, None, (p1,), dev))).sink(), out, a)
  with pytest.raises(DeviceError, match=dev.split(":")[0]): run_call(c, S)
  assert out not in S

def test_run_call_validates(S):
  a = host_buffer(np.ones(2, np.float32), storage=S)
  with pytest.raises(CallsatError, match="expected a CALL"): run_call(a, S)
  with pytest.raises(CallsatError, match="SINK"): run_call(call(a, a), S)
  with pytest.raises(CallsatError, match="argument 0 is ADD"): run_call(call(add_body(2), a.alu(Ops.ADD, a), a, a), S)
  var = Node(Ops.PARAM, dtypes.int32, (), ParamArg(-1, (), None, "v", (1, 8)))
  with pytest.raises(CallsatError, match="BIND"): run_call(call(add_body(2), Node(Ops.BIND, dtypes.int32, (var, const(3, dtypes.int32))), a, a), S)
  with pytest.raises(UnallocatedBufferError): run_call(call(add_body(2), a, a, new_buffer(2, dtypes.float32, "CPU")), S)

def test_read(S):
  b = host_buffer(np.arange(6, dtype=np.float32), storage=S)
  r = read(b.reshape((2, 3)).permute((1, 0)), S)
  np.testing.assert_array_equal(r, [[0, 3], [1, 4], [2, 5]])
  assert r.flags.c_contiguous and not np.shares_memory(r, S[b])
  np.testing.assert_array_equal(read(b.alu(Ops.MUL, b).shrink(((4, 6),)), S), [16, 25])
  with pytest.raises(CallsatError, match="STORE"): read(b.after(b.store(b)), S)
  with pytest.raises(CallsatError, match="CALL"): read(b.after(call(add_body(6), b, b, b)), S)
  with pytest.raises(UnallocatedBufferError): read(new_buffer(2, dtypes.float32, "CPU"), S)
  np.testing.assert_array_equal(S[b], np.arange(6))
