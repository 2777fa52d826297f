"""A realize that returns while its CALL's last kernel runs (run_call with wait=False, lower/device/pool.py's post and
finish): every reader of storage waits for it first, nothing it runs on is freed, rebound or reused under it, and another
thread, another storage, a fork and the next CALL all see finished values. Values against numpy; no timings."""
import ctypes, gc, os, threading, time
import numpy as np
import pytest
from egraph import Tensor, callify, synchronize, CallsatError
from egraph.ir.dtype import dtypes
from egraph.ir.ops import new_buffer
from egraph.ir.storage import Storage, STORAGE, POOL
from lower.device import compiler, native, pool
from lower.runtime import run_call
from test_pool import _scale_kernel, exits_cleanly

RNG = np.random.default_rng(11)
split = pytest.mark.skipif(pool.pool() is None or native.THREADS < 2, reason="needs the native kernel threads and 2 CPUs")
N = 1 << 22   # (x + y) * x - 1 on 4M floats: above PARALLEL_WORK, split in one round of 16 chunks, a few ms

def _pair():
  a, b = RNG.standard_normal(N, dtype=np.float32), RNG.standard_normal(N, dtype=np.float32)
  return a, b, Tensor(a).realize(), Tensor(b).realize()

def f(x, y): return (x + y) * x - 1

@split
def test_realize_returns_with_the_kernel_pending_and_reads_wait_for_it():
  a, b, x, y = _pair()
  synchronize()
  out = f(x, y).realize()
  assert STORAGE.pending is not None   # the kernel was left running
  np.testing.assert_allclose(out.numpy(), f(a, b), rtol=1e-6)
  assert STORAGE.pending is None and pool.pool().posted is None
  for _ in range(5):   # a loop: each realize finishes the last before it starts (it may read it)
    x = (x + y) * 0.5
    x.realize()
  want = a
  for _ in range(5): want = (want + b) * np.float32(0.5)
  np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)

@split
def test_every_storage_accessor_waits():
  a, b, x, y = _pair()
  for read in (lambda buf: STORAGE.get(buf).copy(), lambda buf: STORAGE[buf].copy(),
               lambda buf: STORAGE.allocate(buf).copy(), lambda buf: STORAGE.copy()[buf]):
    out = f(x, y).realize()
    assert STORAGE.pending is not None
    np.testing.assert_allclose(read(out.node.base), f(a, b), rtol=1e-6)

@split
def test_an_output_dropped_while_pending_is_released_only_after():
  a, b, x, y = _pair()
  synchronize(); gc.collect()   # no earlier test's garbage goes back to the pool meanwhile
  returned = POOL.returned
  f(x, y).realize()   # dropped at once: its CALL, kept by the pending run, keeps the buffer (and its memory) until it ends
  assert STORAGE.pending is not None and POOL.returned == returned
  out = (f(x, y) + 1).realize()   # allocates an output of that size class: never the pending one's memory
  np.testing.assert_allclose(out.numpy(), f(a, b) + 1, rtol=1e-6)
  assert POOL.returned > returned   # the first output's memory went back once its kernel was done

@split
def test_other_threads_and_storages_see_finished_values():
  a, b, x, y = _pair()
  out = f(x, y).realize()
  got = {}
  def other():   # another thread on the same storage waits for the run in flight; on its own storage it needs no wait
    got["same"] = STORAGE[out.node.base].copy()
    S = Storage()
    bx, by = new_buffer(N, dtypes.float32, "CPU"), new_buffer(N, dtypes.float32, "CPU")
    S.set_data(bx, b); S.set_data(by, a)
    res = callify(f(Tensor(bx), Tensor(by)))   # the pending CALL's schedule: its plan is locked, this run prepares its own
    run_call(res.call, S)
    got["other"] = S[res.call.src[1]].copy()
  t = threading.Thread(target=other); t.start(); t.join()
  np.testing.assert_allclose(got["same"], f(a, b), rtol=1e-6)
  np.testing.assert_allclose(got["other"], f(b, a), rtol=1e-6)
  np.testing.assert_allclose(out.numpy(), f(a, b), rtol=1e-6)

@split
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_fork_finishes_the_pending_kernel_first():
  # a long posted job (16M elements, one round): the child must see it finished, not half written or waiting forever
  n = 1 << 24
  (c,) = compiler.compile_kernels([(_scale_kernel(n), "pending_fork")])
  a, out = np.arange(n, dtype=np.float32), np.zeros(n, np.float32)
  run = native.Launch(c, [out.ctypes.data, a.ctypes.data], work=native.PARALLEL_WORK, threads=2)
  (cuts,) = run.rounds(2, native.CHUNKS_PER_THREAD)
  assert pool.pool().post(c.thunk, ctypes.addressof(run.argv), cuts, 1) is not None
  pid = os.fork()
  if pid == 0:
    ok = False
    try: ok = pool.pool().posted is None and np.array_equal(out, a * 3)
    finally: os._exit(0 if ok else 3)
  exits_cleanly(pid, "the forked child hung on the parent's posted job", 60)
  assert pool.pool().posted is None
  np.testing.assert_array_equal(out, a * 3)

@split
def test_pool_post_and_finish():
  p = pool.pool()
  n = 200_000
  (c,) = compiler.compile_kernels([(_scale_kernel(n), "pending_scale")])
  a, out = np.arange(n, dtype=np.float32), np.full(n, np.nan, np.float32)
  run = native.Launch(c, [out.ctypes.data, a.ctypes.data], work=native.PARALLEL_WORK, threads=2)
  (cuts,) = run.rounds(2, native.CHUNKS_PER_THREAD)   # one round
  h = p.post(c.thunk, ctypes.addressof(run.argv), cuts, 1)
  assert h is not None and p.posted is h
  assert not p.run(c.thunk, ctypes.addressof(run.argv), cuts, 1)   # the pool is held until the posted job is finished
  assert p.post(c.thunk, ctypes.addressof(run.argv), cuts, 1) is None
  t = threading.Thread(target=h.finish); t.start(); t.join()   # any thread may finish it
  h.finish()   # again: nothing
  np.testing.assert_array_equal(out, a * 3)
  assert p.posted is None and p.run(c.thunk, ctypes.addressof(run.argv), cuts, 1)

@split
def test_a_checked_kernel_is_never_left_running(monkeypatch):
  monkeypatch.setenv("CHECK_BOUNDS", "1")   # its error slot is read after the run: the run waits
  a, b, x, y = _pair()
  synchronize()
  out = f(x, y).realize()
  assert STORAGE.pending is None
  np.testing.assert_allclose(out.numpy(), f(a, b), rtol=1e-6)

@split
def test_the_setting_makes_realize_wait(monkeypatch):
  a, b, x, y = _pair()
  synchronize()
  monkeypatch.setenv("CALLSAT_ASYNC", "0")
  out = f(x, y).realize()
  assert STORAGE.pending is None and pool.pool().posted is None
  np.testing.assert_allclose(out.numpy(), f(a, b), rtol=1e-6)
  monkeypatch.setenv("CALLSAT_ASYNC", "yes")
  z = f(x, y)
  with pytest.raises(CallsatError, match="CALLSAT_ASYNC"): z.realize()
  monkeypatch.setenv("CALLSAT_ASYNC", "1")
  np.testing.assert_allclose(z.numpy(), f(a, b), rtol=1e-6)   # the refused realize changed nothing

@split
def test_a_matmul_in_two_coarse_chunks_is_cut_at_the_workers_share():
  # a tiled matmul 256^3 splits into one chunk per thread (each packs all of B): left running, it is cut in two at the
  # worker's share, moved by who waited for whom; any cut gives the same values
  a, b = RNG.standard_normal((256, 256), dtype=np.float32), RNG.standard_normal((256, 256), dtype=np.float32)
  x, y = Tensor(a).realize(), Tensor(b).realize()
  synchronize()
  out = (x @ y).realize()
  assert STORAGE.pending is not None
  (launch,) = [st for st in STORAGE.pending.plan.steps if type(st) is not tuple]
  assert launch.uneven
  np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)
  for share in (0.0, 0.3, 1.0):   # the cut stays a row tile inside the rows
    launch.share = share
    out = (x @ y).realize()   # the next CALL of the schedule takes the same plan, so the same launch
    assert STORAGE.pending is not None and STORAGE.pending.plan.steps[-1] is launch
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)
  launch.share = 0.5
  launch.adapt(True); assert launch.share < 0.5   # the caller waited: the worker had too much
  before = launch.share; launch.adapt(False); assert launch.share > before
  for _ in range(12): launch.adapt(True); launch.adapt(False)   # swinging: the move shrinks to its floor
  assert abs(launch.move) == native.SHARE_STEP / 8
  for _ in range(40): launch.adapt(False)
  assert launch.share == native.SHARE_MAX
  for _ in range(40): launch.adapt(True)
  assert launch.share == 1 - native.SHARE_MAX

@split
def test_finish_says_whether_the_caller_waited():
  p, n = pool.pool(), 1 << 24
  (c,) = compiler.compile_kernels([(_scale_kernel(n), "pending_waited")])
  a, out = np.arange(n, dtype=np.float32), np.zeros(n, np.float32)
  run = native.Launch(c, [out.ctypes.data, a.ctypes.data], work=native.PARALLEL_WORK, threads=2)
  def state(h):   # the state word of the worker the job was posted to (pool.py: 1 posted, 2 running, 3 done)
    (i,) = [i for i in range(len(p.cpus)) if h.used[i]]
    return ctypes.c_int32.from_address(p.base + i * pool.WORKER_BYTES + 64).value
  h = p.post(c.thunk, ctypes.addressof(run.argv), [0, n - 1, n], 1)   # the worker's chunk is nearly all of it (~10 ms)
  deadline = time.monotonic() + 30
  while state(h) == 1 and time.monotonic() < deadline: pass   # until the worker has taken it; the caller takes the rest
  h.finish()
  assert h.waited and np.array_equal(out, a * 3)
  out[:] = 0
  h = p.post(c.thunk, ctypes.addressof(run.argv), [0, 1, n], 1)
  deadline = time.monotonic() + 30
  while state(h) != 3 and time.monotonic() < deadline: pass   # the worker ran every chunk before the caller came
  h.finish()
  assert not h.waited and np.array_equal(out, a * 3)
