"""MULTI (spec EX9): sharded and replicated tensors, per-shard buffers, elementwise and reduce across shards, values on
the PYTHON devices (the same programs on CPU devices, natively: test_multi_native.py)."""
import numpy as np
import pytest
from egraph import Tensor, callify, dtypes, ShapeError, UnsupportedOpError
from egraph.ir.ops import Ops, toposort

DEVS = ("PYTHON", "PYTHON:1")
X = np.arange(8, dtype=np.float32).reshape(4, 2)

def sharded(axis=0): return Tensor(X, device="PYTHON").shard(DEVS, axis=axis)

def test_ex9_elementwise_on_a_sharded_tensor():
  a = sharded()
  assert a.node.op is Ops.MULTI and a.device == DEVS and a.shape == (4, 2)
  b = a + 1
  res = callify(b)
  out = res.buffer_map[b.node]
  assert out.op is Ops.MULTI and out.arg == 0 and out.src[0].shape == (2, 2)            # per-shard storage
  buf = out.src[0].src[0]
  assert buf.op is Ops.BUFFER and buf.arg.size == 4 and buf.device == DEVS
  root = res.call.src[0].src[0]
  assert root.op is Ops.AFTER and root.src[0].op is Ops.MULTI and all(p.device == DEVS for p in toposort([root]) if p.op is Ops.PARAM)
  np.testing.assert_equal(b.numpy(), X + 1)

@pytest.mark.parametrize("axis", [0, 1])
def test_reduce_across_and_along_shards(axis):
  a = sharded(axis)
  np.testing.assert_equal((a * 2).sum(axis=0).numpy(), (X * 2).sum(axis=0))
  np.testing.assert_equal((a * 2).sum(axis=1).numpy(), (X * 2).sum(axis=1))
  np.testing.assert_equal(a.max().numpy(), X.max())

def test_replicated_and_mixed():
  rep = Tensor([10., 20], device="PYTHON").shard(DEVS, axis=None)
  assert rep.node.op is Ops.RESHAPE or rep.node.op is Ops.BUFFER
  np.testing.assert_equal((sharded() + rep).numpy(), X + [10, 20])
  np.testing.assert_equal((rep * 3).numpy(), [30, 60])

def test_movement_and_copy_out():
  a = sharded()
  c = a.permute(1, 0).contiguous()
  res = callify(c)
  assert res.buffer_map[c.node].op is Ops.MULTI and res.buffer_map[c.node].arg == 1   # the sharded axis moved
  np.testing.assert_equal(c.numpy(), X.T)
  np.testing.assert_equal((a.to("PYTHON") * 3).numpy(), X * 3)

def test_same_graph_on_new_shards_hits_the_cache():
  r1, r2 = callify(sharded() * 2 + 1), callify(sharded() * 2 + 1)
  assert r2.report.cache_hit and r1.call.src[0] is r2.call.src[0]

def test_errors():
  with pytest.raises(ShapeError, match="split"): Tensor(np.ones((3, 2), np.float32), device="PYTHON").shard(DEVS, axis=0)
  np.testing.assert_equal((Tensor([1., 2]).shard(("CPU", "CPU:1")) + 1).numpy(), [2, 3])   # native: tests/frontend/test_multi_native.py
  with pytest.raises(UnsupportedOpError, match="CUDA"): (Tensor([1., 2]).shard(("CUDA", "CUDA:1")) + 1).numpy()

def test_contiguous_view_of_a_sharded_tensor_is_a_per_shard_slice():
  Y = np.arange(16, dtype=np.float32).reshape(4, 4)
  a = Tensor(Y, device="PYTHON").shard(DEVS, axis=0)
  c = a.reshape(2, 2, 4)[:, 1:2].contiguous()
  res = callify(c)
  v = res.buffer_map[c.node]
  assert v.op is Ops.MULTI and v.src[0].src[0].op is Ops.SLICE and res.report.views == 1 and res.report.stores == 0
  np.testing.assert_equal(c.numpy(), Y.reshape(2, 2, 4)[:, 1:2])

def test_bitcast_view_of_a_sharded_tensor_keeps_its_dtype_q2_fixed():
  Y = np.arange(16, dtype=np.float32).reshape(4, 4)
  a = Tensor(Y, device="PYTHON").shard(DEVS, axis=0)
  b = a.reshape(2, 2, 4)[:, 1:2].bitcast(dtypes.int32)
  v = callify(b).buffer_map[b.node]
  assert v.dtype == dtypes.int32 and v.src[0].src[0].dtype == dtypes.int32
  np.testing.assert_equal(b.numpy(), Y.reshape(2, 2, 4)[:, 1:2].view(np.int32))

def test_a_view_across_shards_is_stored():
  Y = np.arange(16, dtype=np.float32).reshape(4, 4)
  c = Tensor(Y, device="PYTHON").shard(DEVS, axis=0)[1:3].contiguous()
  assert callify(c).report.views == 0
  np.testing.assert_equal(c.numpy(), Y[1:3])
