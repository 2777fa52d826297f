"""Buffer lifetimes (item 1): storage lives as long as its BUFFER node, freed memory is pooled and reused, a CALL's
temporaries share one arena by lifetime, fully written outputs skip the zero-fill."""
import gc, os
import numpy as np
import pytest
from egraph import Tensor, dtypes
from egraph.ir.ops import new_buffer
from egraph.ir.storage import STORAGE, Storage, BufferPool, bucket
from lower.device import native
from lower.runtime import read
from lower.schedule.mem import Mem, Step
from lower.schedule.kernelize import Program
from lower.schedule.kernel import Idx, Kernel, Store, Var, Param, Expr

def test_loop_storage_stays_flat():
  # 1,000 iterations of the loop on a 4 MB input after 20 warm-up ones: the storage holds what it held before
  x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
  want = (x * 3).sum(0)
  for _ in range(20): (Tensor(x) * 3).sum(0).numpy()
  gc.collect()
  b0, n0, h0 = STORAGE.nbytes, len(STORAGE), STORAGE.pool.hits
  for _ in range(1000): got = (Tensor(x) * 3).sum(0).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
  assert STORAGE.nbytes - b0 < 150 << 20 and STORAGE.nbytes - b0 <= 4 << 20 and len(STORAGE) <= n0 + 2
  assert STORAGE.pool.hits - h0 >= 1000   # every iteration's 4 MB host copy reused a freed block
  assert STORAGE.pool.cached <= STORAGE.pool.limit

def test_buffer_freed_with_its_last_reader():
  # the callify result cache holds the buffers of the graph an entry was made for: the second realize of the same graph
  # reuses that entry with fresh buffers, which only Tensors hold
  for _ in range(2): t = (Tensor(np.ones((256, 256), np.float32)) + 1).realize()
  uid = t.node.base.arg.uid
  assert uid in STORAGE
  v = t[64:128]            # a view (SLICE/SHRINK of the buffer) keeps the base alive
  del t; gc.collect()
  assert uid in STORAGE and float(read(v.node).sum()) == 2 * 64 * 256
  del v; gc.collect()
  assert uid not in STORAGE

def test_freed_memory_is_reused():
  p = BufferPool(limit=64 << 20)
  S = Storage(p)
  b = new_buffer(100_000, dtypes.float32, "CPU")
  S.set_data(b, np.arange(100_000, dtype=np.float32))
  addr = S[b].ctypes.data
  del b; gc.collect()
  assert len(S) == 0 and p.returned == 1 and p.cached == bucket(400_000)
  c = new_buffer(99_000, dtypes.float32, "CPU")   # same size class
  a = S.allocate(c)
  assert a.ctypes.data == addr and p.hits == 1 and not a.any()   # warm memory, zero-filled on request
  d = new_buffer(99_000, dtypes.float32, "CPU")
  S.allocate(d, zero=False); assert p.misses == 2

def test_memory_still_viewed_is_not_recycled():
  p = BufferPool(); S = Storage(p)
  b = new_buffer(50_000, dtypes.float32, "CPU")
  S.set_data(b, np.full(50_000, 7, np.float32))
  keep = S[b][10:20]       # someone holds a numpy view of the storage
  del b; gc.collect()
  assert p.returned == 0 and p.dropped == 1 and (keep == 7).all()

def test_pool_limit_evicts_least_recently_freed():
  p = BufferPool(limit=3 << 20)
  blocks = [p.take(1 << 20, zero=False) for _ in range(4)]
  first = blocks[0]
  for b in blocks: p.give(b)
  assert p.cached == 3 << 20 and all(x is not first for xs in p._free.values() for x in xs)

def test_storage_copy_is_independent_and_keeps_lifetimes():
  b = new_buffer(20_000, dtypes.float32, "CPU")
  S = Storage(); S.set_data(b, np.ones(20_000, np.float32))
  S2 = S.copy(); S2[b][:] = 5
  assert S[b][0] == 1 and S2[b][0] == 5
  del b; gc.collect()
  assert len(S) == 0 and len(S2) == 0

def _temp_program():
  i = Var("i", 1000)
  val = Expr('const', dtypes.float32, (), 1.0)
  k = Kernel("k", (Param("p0", dtypes.float32, 1000, 64),), (i,), Store(0, Idx.var(i), val))
  t = lambda n: Mem(("tmp", n), 0, dtypes.float32, 1000)
  steps = [Step(k, (t(0),)), Step(k, (t(1),)), Step(None, (t(0), t(1))), Step(k, (t(2),)), Step(k, (t(3),))]
  return Program(steps, {("tmp", n): 4000 for n in range(4)}, set())

def test_memory_plan_shares_temporaries_with_disjoint_lifetimes():
  offs, peak, covered = native.memory_plan(_temp_program())
  # tmp0 and tmp1 live together (steps 0-2); tmp2 and tmp3 after them: two 4032-byte slots instead of four
  assert offs[("tmp", 0)] != offs[("tmp", 1)] and peak == 2 * 4032 < 4 * 4000
  assert offs[("tmp", 2)] == offs[("tmp", 3)] == 0

def test_call_peak_bytes_and_values_with_shared_temporaries():
  x = np.random.default_rng(1).standard_normal((300, 400)).astype(np.float32)
  a = Tensor(x)
  y = (((a * 2).contiguous().exp().sum(1, keepdim=True) + a).contiguous().max(0) + (a - 1).contiguous().min(1).sum())
  got = y.numpy()
  want = ((np.exp(x * 2).sum(1, keepdims=True) + x).max(0) + (x - 1).min(1).sum())
  np.testing.assert_allclose(got, want, rtol=1e-4)
  assert native.STATS["peak"] >= 0

def test_fully_written_output_skips_the_zero_fill():
  # a pooled block with old data is reused for an output a kernel writes completely: no zero-fill, right values
  x = np.random.default_rng(2).standard_normal(1 << 18).astype(np.float32)
  a = Tensor(x).realize()
  for _ in range(3): r = (a + 1).realize()
  np.testing.assert_allclose(r.numpy(), x + 1)
  h = STORAGE.pool.hits
  r = (a * 2).realize()
  assert STORAGE.pool.hits > h
  np.testing.assert_array_equal(r.numpy(), x * 2)
  # a partial write into a fresh buffer still sees zeros elsewhere
  z = Tensor.zeros(1 << 18).contiguous().realize()
  z[: 1 << 10].assign(Tensor(x[: 1 << 10])).realize()
  got = z.numpy()
  np.testing.assert_array_equal(got[: 1 << 10], x[: 1 << 10]); assert not got[1 << 10:].any()

@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_pool_and_frees_work_after_fork():
  # the child reuses the parent's callify result (saturation itself, in egglog's threads, does not survive a fork)
  x = np.arange(1 << 20, dtype=np.float32)
  prog = lambda: (Tensor(x) * 3 + 1).numpy()
  prog()
  pid = os.fork()
  if pid == 0:
    ok = False
    try: ok = all(np.array_equal(prog(), x * 3 + 1) for _ in range(5)) and STORAGE.pool.hits > 0
    finally: os._exit(0 if ok else 1)
  _, st = os.waitpid(pid, 0)
  assert os.WEXITSTATUS(st) == 0
