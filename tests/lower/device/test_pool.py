"""The native kernel threads (lower/device/pool.py) and the prepared per-CALL plans of run_native: values against numpy on split
launches (1-4 chunks), concurrent callers, a forked child, the Python-worker fallback, bounds errors from a worker's
chunk, and plans that must not outlive the arrays they point into. No timings."""
import ctypes, gc, os, subprocess, sys, threading, time, weakref
import numpy as np
import pytest
from egraph import callify
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Node, Ops, new_buffer, const
from lower.device import compiler
from lower.device import native
from lower.device import pool
from lower.device import threads
from lower.device.cache import CACHE
from lower.schedule.kernel import Kernel, Param, Store, Expr, Idx, Var, const as kconst
from egraph.ir.storage import Storage
from lower.runtime import run_call

RNG = np.random.default_rng(7)
needs_pool = pytest.mark.skipif(pool.pool() is None, reason="native kernel threads need Linux x86-64")

def exits_cleanly(pid: int, hung: str, seconds: float = 120) -> None:
  """Wait for forked child `pid` to exit 0; past `seconds` kill it and fail with `hung`."""
  for _ in range(int(seconds * 10)):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done: break
    time.sleep(0.1)
  else:
    os.kill(pid, 9); os.waitpid(pid, 0)
    pytest.fail(hung)
  assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

def _scale_kernel(n: int) -> Kernel:
  """out[i] = a[i] * 3 over i < n."""
  i = Var("i0", n)
  f = dtypes.float32
  val = Expr(Ops.MUL, f, (Expr('load', f, (), (1, Idx.var(i), ())), kconst(3.0, f)))
  ps = (Param("p0", f, n, 4, True, False, True), Param("p1", f, n, 4, True, True))
  return Kernel(f"scale_{n}", ps, (i,), Store(0, Idx.var(i), val))

@needs_pool
@pytest.mark.parametrize("n", [2, 7, 1000, 100_003])
def test_split_launch_covers_every_element_once(n):
  (c,) = compiler.compile_kernels([(_scale_kernel(n), f"pool_scale_{n}")])
  assert c.thunk
  a = np.arange(n, dtype=np.float32)   # each element says which index it came from
  want = a * np.float32(3)
  for nthreads in (1, 2, 3, 4):
    out = np.full(n, np.nan, np.float32)
    run = native.Launch(c, [out.ctypes.data, a.ctypes.data], work=1 << 30, threads=nthreads)
    run(); run()   # a prepared launch runs again on the same pointers
    np.testing.assert_allclose(out, want, rtol=1e-6)
    cuts = run.cuts(nthreads)
    if cuts is not None: assert cuts[0] == 0 and cuts[-1] == n and all(x <= y for x, y in zip(cuts, cuts[1:]))

def _matmul(S, M=192):
  def buf(x):
    b = new_buffer(x.size, dtypes.float32, "CPU"); S.set_data(b, x.reshape(-1)); return b
  a_np, b_np = RNG.standard_normal((M, M)).astype(np.float32), RNG.standard_normal((M, M)).astype(np.float32)
  A, B = buf(a_np).reshape((M, M)), buf(b_np).reshape((M, M))
  prod = Node(Ops.MUL, None, (A.reshape((M, 1, M)).expand((M, M, M)), B.permute((1, 0)).reshape((1, M, M)).expand((M, M, M))))
  return callify(Node(Ops.REDUCE, None, (prod,), (Ops.ADD, (2,))).reshape((M, M))), a_np @ b_np

@pytest.mark.parametrize("M", [72, 600, 1040])
def test_tiled_matmul_chunks_are_coarse_and_cover_every_row(M):
  # every call of a tiled matmul packs all of B: its chunks are MM_CHUNK_ROWS rows (or the rows per thread), not 8
  S = Storage()
  res, want = _matmul(S, M)
  run_call(res.call, S)
  np.testing.assert_allclose(S[res.call.src[1]].reshape(M, M), want, rtol=1e-4, atol=1e-3)
  (launch,) = [s for s in CACHE.plans[res.call].steps if type(s) is not tuple]
  assert launch.c.kernel.tile
  for nt in (1, 2, 3, 16):
    step = launch.step(nt)
    assert step % 8 == 0 and step == max(8, min(native.MM_CHUNK_ROWS, M // nt) // 8 * 8)
    for cuts in (launch.rounds(nt, 8) or []):
      assert cuts[0] % step == 0 and all(x % step == 0 for x in cuts[:-1]) and cuts == sorted(set(cuts))
    rs = launch.rounds(nt, 8)
    if rs is not None: assert rs[0][0] == 0 and rs[-1][-1] == M and all(a[-1] == b[0] for a, b in zip(rs, rs[1:]))

@needs_pool
def test_concurrent_callers_get_right_values():
  # one caller holds the pool at a time; the others run their kernel on their own thread
  S = Storage()
  res, want = _matmul(S)
  run_call(res.call, S)
  errs = []
  def work():
    try:
      S2 = S.copy()
      for _ in range(20):
        run_call(res.call, S2)
        np.testing.assert_allclose(S2[res.call.src[1]].reshape(want.shape), want, rtol=1e-3, atol=1e-3)
    except Exception as e: errs.append(e)
  ts = [threading.Thread(target=work) for _ in range(3)]
  for t in ts: t.start()
  for t in ts: t.join(timeout=120)
  assert not errs and not any(t.is_alive() for t in ts)

@needs_pool
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_child_makes_its_own_threads():
  # a forked child inherits the pool's memory but none of its threads: it must start new ones, not wait forever
  S = Storage()
  res, want = _matmul(S)
  run_call(res.call, S)
  old = pool.pool()
  pid = os.fork()
  if pid == 0:
    ok = False
    try:
      out = S[res.call.src[1]]; out[:] = 0
      CACHE.plans.clear()
      run_call(res.call, S)
      ok = pool.pool() is not old and np.allclose(out.reshape(want.shape), want, rtol=1e-3, atol=1e-3)
    finally: os._exit(0 if ok else 3)
  exits_cleanly(pid, "the forked child hung in a split launch")   # a lost job would hang it

def test_python_workers_when_native_threads_are_off():
  code = ("import numpy as np; from lower.device import pool, threads; from test_pool import _matmul; from lower.runtime import Storage, run_call\n"
          "S = Storage(); res, want = _matmul(S); run_call(res.call, S)\n"
          "assert pool.pool() is None and threads._WORKERS, 'expected the Python workers'\n"
          "np.testing.assert_allclose(S[res.call.src[1]].reshape(want.shape), want, rtol=1e-3, atol=1e-3); print('ok')")
  env = {**os.environ, "CALLSAT_NATIVE_THREADS": "0", "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.getcwd()])}
  r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]

@needs_pool
def test_bounds_error_from_a_workers_chunk():
  n = 64
  i = Var("i0", n)
  f = dtypes.float32
  bad = Expr('load', f, (), (1, Idx.var(i) + (n - 4), ()))   # reads past the end in the last chunk (the worker's)
  k = Kernel("pool_bad", (Param("p0", f, n, 4, True, False, True), Param("p1", f, n, 4, True, True)), (i,), Store(0, Idx.var(i), bad),
             checked=True)
  (c,) = compiler.compile_kernels([(k, "pool_bad")])
  out, src = np.zeros(n, np.float32), np.ones(n, np.float32)
  with pytest.raises(native.BoundsError, match="pool_bad.*p1"): native.launch(c, [out.ctypes.data, src.ctypes.data], work=1 << 30, threads=2)

def test_plan_reused_and_dropped_with_its_arrays():
  S = Storage()
  x = RNG.standard_normal(1000).astype(np.float32)
  b = new_buffer(1000, dtypes.float32, "CPU"); S.set_data(b, x)
  res = callify(Node(Ops.ADD, None, (b, const(1.0, dtypes.float32, "CPU").reshape((1,)).expand((1000,)))))
  run_call(res.call, S)
  assert res.call in CACHE.plans
  out = res.call.src[1]
  S[out][:] = 0; run_call(res.call, S)                         # the prepared plan, same arrays
  np.testing.assert_allclose(S[out], x + 1, rtol=1e-6)
  # new storage, new arrays: the plan's arrays are gone (their memory may be reused); the full path must run
  y = RNG.standard_normal(1000).astype(np.float32)
  del S; gc.collect()
  S2 = Storage(); S2.set_data(b, y)
  run_call(res.call, S2)
  np.testing.assert_allclose(S2[out], y + 1, rtol=1e-6)
  S2.set_data(b, x)   # replaced input array: not the plan's
  run_call(res.call, S2)
  np.testing.assert_allclose(S2[out], x + 1, rtol=1e-6)

def test_plan_not_taken_on_a_storage_without_its_buffers():
  # a CALL with no inputs: its only array (the output) dies with the first storage; a new storage holds nothing, which
  # must not pass for "the same arrays" (the plan would write into freed memory and leave the output unallocated)
  res = callify(Node(Ops.MUL, None, (const(2.0, dtypes.float32, "CPU").reshape((1,)).expand((5000,)),
                                      const(3.0, dtypes.float32, "CPU").reshape((1,)).expand((5000,)))).contiguous())
  S = Storage()
  run_call(res.call, S)
  np.testing.assert_array_equal(S[res.call.src[1]], np.full(5000, 6, np.float32))
  del S; gc.collect()
  S2 = Storage()
  run_call(res.call, S2)
  np.testing.assert_array_equal(S2[res.call.src[1]], np.full(5000, 6, np.float32))

@needs_pool
def test_chunks_no_worker_takes_run_on_the_caller():
  # a pool whose workers all sit on one CPU: the caller (on that CPU or not) runs every chunk it could not hand out
  me = threads._sched_getcpu()
  p = pool.Pool([me, me])
  n = 10_000
  (c,) = compiler.compile_kernels([(_scale_kernel(n), "pool_tail")])
  a = np.arange(n, dtype=np.float32)
  for nt in (2, 3, 5):
    out = np.full(n, np.nan, np.float32)
    run = native.Launch(c, [out.ctypes.data, a.ctypes.data], work=1 << 30, threads=nt)
    assert p.run(c.thunk, ctypes.addressof(run.argv), run.cuts(nt))
    np.testing.assert_array_equal(out, a * 3)

@needs_pool
def test_a_dropped_pool_stops_its_workers_before_its_code_goes():
  # a pool's workers run code of its own slab: dropping the pool disposes that engine (its code unmapped), so the workers
  # must have exited first. They used to live on, and one still spinning (or woken) after the dispose died of SIGSEGV
  tasks = lambda: len(os.listdir("/proc/self/task"))
  def back_to(limit: int) -> bool:   # another part of the process may run a short-lived thread of its own meanwhile (the
    for _ in range(300):             # full suite once did): a worker left behind never goes, a passing thread does
      if tasks() <= limit: return True
      time.sleep(0.01)
    return False
  n = 10_000
  (c,) = compiler.compile_kernels([(_scale_kernel(n), "pool_drop")])
  a = np.arange(n, dtype=np.float32)
  cpus = sorted(os.sched_getaffinity(0))
  before = tasks()
  for _ in range(20):
    p = pool.Pool(cpus)
    assert len(p.tids) == len(cpus) and tasks() >= before + len(cpus)
    slab = weakref.ref(p.engine)
    out = np.full(n, np.nan, np.float32)
    run = native.Launch(c, [out.ctypes.data, a.ctypes.data], work=1 << 30, threads=len(cpus) + 1)
    assert p.run(c.thunk, ctypes.addressof(run.argv), run.cuts(len(cpus) + 1))
    np.testing.assert_array_equal(out, a * 3)
    del p; gc.collect()         # right after the job: the workers are still spinning in the pool's code
    assert slab() is None       # the slab went, and its engine was disposed
    assert back_to(before)      # with the workers: none left behind
  p = pool.Pool(cpus)
  p.close(); p.close()          # closed explicitly (idempotent): no more split launches through it
  assert back_to(before) and not p.run(c.thunk, 0, [0, 1])

def test_threads_setting(monkeypatch):
  monkeypatch.setenv("CALLSAT_THREADS", "3"); assert native._threads() == 3
  monkeypatch.setenv("CALLSAT_THREADS", "many")
  with pytest.raises(Exception, match="CALLSAT_THREADS"): native._threads()
  monkeypatch.delenv("CALLSAT_THREADS"); assert native._threads() == len(os.sched_getaffinity(0))

@needs_pool
def test_launches_stay_right_while_a_workers_core_is_busy():
  """A CPU-bound process on the workers' core: workers start late or not at all (the caller cancels them), claim
  chunks mid-job, or wake during the next job; every launch still covers each element once."""
  import subprocess, sys
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) < 2: pytest.skip("needs 2 CPUs")
  other = next(c for c in cpus if c != threads._sched_getcpu())
  p = pool.Pool([other, other])
  hog = subprocess.Popen(["taskset", "-c", str(other), sys.executable, "-c", "while True: pass"])
  try:
    n = 50_000
    (c,) = compiler.compile_kernels([(_scale_kernel(n), "pool_busy")])
    a = np.arange(n, dtype=np.float32)
    for i in range(300):
      out = np.full(n, np.nan, np.float32)
      run = native.Launch(c, [out.ctypes.data, a.ctypes.data], work=1 << 30, threads=3)
      for cuts in run.rounds(3, 1 + i % 5): assert p.run(c.thunk, ctypes.addressof(run.argv), cuts, 2)
      np.testing.assert_array_equal(out, a * 3)
  finally: hog.kill(); hog.wait()

def test_medium_kernels_in_a_run_split():
  """A kernel below PARALLEL_WORK but at least PARALLEL_WORK_RUN is split when a kernel of that size is next to it
  (the run pays the workers' wake-up once); alone, or next only to a copy or a small kernel, it is not."""
  big, mid, small = native.PARALLEL_WORK, native.PARALLEL_WORK_RUN, native.PARALLEL_WORK_RUN - 1
  copy = ((0, 0), (1, 0), 64)
  steps = [(0, [], mid), (1, [], mid), copy, (2, [], mid), (3, [], small), (4, [], big), (5, [], mid), copy, (6, [], mid)]
  works = [s[2] for s in native.split_runs(steps)]
  assert works == [big, big, 64, mid, small, big, big, 64, mid]

def test_optimizer_update_over_several_tensors_is_right():
  """An SGD-like update of three medium tensors in one CALL (their kernels now split as a run): numpy's values."""
  rng = np.random.default_rng(3)
  from egraph import Tensor
  ws = [rng.standard_normal(300_000).astype(np.float32) for _ in range(3)]
  gs = [rng.standard_normal(300_000).astype(np.float32) for _ in range(3)]
  ts = [(Tensor(w).realize(), Tensor(g).realize()) for w, g in zip(ws, gs)]
  outs = [w - g * 0.05 for w, g in ts]
  before = native.STATS["rounds"]
  Tensor.realize(*outs)
  if native.THREADS > 1: assert native.STATS["rounds"] - before >= 3   # each update split (one round each)
  for o, w, g in zip(outs, ws, gs): np.testing.assert_allclose(o.numpy(), w - g * np.float32(0.05), rtol=1e-6)

def _launches(t):
  """The Launches of the plan `t`'s CALL ran on (run once, waited)."""
  res = callify(t.node)
  run_call(res.call)
  return [s for s in CACHE.plans.get(res.call).steps if type(s) is not tuple]

@pytest.mark.parametrize("cols", [40, 1000, 4099])
def test_column_reduces_split_in_wide_chunks(cols):
  """A column reduce walks every row for the columns a chunk gives it: chunks are COL_CHUNK columns (multiples of 16,
  fewer when there are fewer per thread), never the fine chunks of other kernels; each column computed once, right."""
  from egraph import Tensor
  xn = RNG.standard_normal((600, cols)).astype(np.float32)
  x = Tensor(xn).realize()
  (run,) = [L for L in _launches((x * x).sum(axis=0)) if L.col]
  for nt in (2, 3, 8):
    step = run.step(nt)
    assert step % 16 == 0 and step == max(16, min(native.COL_CHUNK, cols // nt) // 16 * 16)
    for cuts in run.rounds(nt, native.CHUNKS_PER_THREAD) or []:
      assert all((b - a) % step == 0 or b == cols for a, b in zip(cuts, cuts[1:]))
  for nt in (1, 2, 3):
    native.THREADS, old = nt, native.THREADS
    try: np.testing.assert_allclose((x * x).sum(axis=0).numpy(), (xn * xn).sum(0), rtol=1e-4, atol=1e-3)
    finally: native.THREADS = old

def test_a_leading_unit_axis_does_not_keep_a_kernel_on_one_thread():
  """A keepdim column reduce's (1, n) and a batch of one: the size-1 vars leave the kernel's domain, whose first var
  is what a split cuts; the values stay numpy's."""
  from egraph import Tensor
  xn = RNG.standard_normal((2048, 1024)).astype(np.float32)
  x = Tensor(xn).realize()
  t = x.sum(axis=0, keepdim=True)
  (run,) = _launches(t)
  assert run.c.kernel.domain[0].size == 1024 and run.rounds(2, native.CHUNKS_PER_THREAD) is not None
  np.testing.assert_allclose(t.numpy(), xn.sum(0, keepdims=True), rtol=1e-4, atol=1e-3)
  b = Tensor(xn.reshape(1, 2048, 1024)).realize()
  np.testing.assert_allclose((b.exp() + 1).numpy(), np.exp(xn.reshape(1, 2048, 1024)) + 1, rtol=1e-5)

def test_a_reduce_split_along_another_var_keeps_fine_chunks():
  """A batched matmul over 8 heads reads like a column reduce, but its split cuts the heads: no column chunks (with
  them, 8 heads were fewer than two chunks and the kernel ran on one thread)."""
  from egraph import Tensor
  a, b = RNG.standard_normal((8, 256, 64)).astype(np.float32), RNG.standard_normal((8, 64, 256)).astype(np.float32)
  t = Tensor(a).realize() @ Tensor(b).realize()
  (run,) = _launches(t)
  assert run.c.kernel.domain[0].size == 8 and not run.col and run.rounds(2, native.CHUNKS_PER_THREAD) is not None
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-4, atol=1e-4)

@needs_pool
@pytest.mark.parametrize("pin", [True, False])
def test_a_worker_the_caller_waits_on_too_long_moves_to_the_callers_cpu_and_back(pin):
  """A worker still on its chunk well past the caller's own chunks (as when another process preempts it on its CPU) is
  moved to the caller's CPU, which the caller leaves idle while it sleeps, and takes its own affinity back once its job
  is done: its CPU, or unpinned (CALLSAT_PIN=0) every CPU of the pool."""
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) < 2: pytest.skip("needs 2 CPUs")
  mine, other = cpus[0], cpus[1]
  p = pool.Pool([mine, other], pin=pin)
  own = {other} if pin else {mine, other}
  seen, main = {}, threading.get_ident()
  def chunk(argv, s, e):   # the caller's chunk ends once the worker has taken the other, which then runs 20x longer
    if threading.get_ident() != main:
      seen["tid"] = threading.get_native_id()
      time.sleep(0.2)
      seen["inside"] = os.sched_getaffinity(0)
    else:
      for _ in range(500):
        if "tid" in seen: break
        time.sleep(0.01)
      time.sleep(0.01)
    seen.setdefault("done", []).append((s, e))
  thunk = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(chunk)
  old = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {mine})   # the caller's thread on `mine`: the worker there is not posted, the other one is
  try:
    for _ in range(3):
      seen.clear()
      assert p.run(ctypes.cast(thunk, ctypes.c_void_p).value, 0, [0, 1, 2], 1)
      assert sorted(seen["done"]) == [(0, 1), (1, 2)]
      assert seen["inside"] == {mine}   # moved while it ran
      status = f"/proc/self/task/{seen['tid']}/status"
      for _ in range(200):              # set back by the worker after it published its job done
        if os.sched_getaffinity(seen["tid"]) == own: break
        time.sleep(0.005)
      assert os.sched_getaffinity(seen["tid"]) == own, open(status).read()
  finally:
    os.sched_setaffinity(0, old)
    p.close()

def _worker_tids(p) -> list[int]:
  """The kernel tids the pool's workers published (each writes its own as it starts)."""
  for _ in range(500):
    tids = [ctypes.c_int32.from_address(p.base + i * pool.WORKER_BYTES + 72).value for i in range(len(p.cpus))]
    if all(tids): return tids
    time.sleep(0.01)
  pytest.fail("a worker never published its tid")

@needs_pool
@pytest.mark.parametrize("pin", [True, False])
def test_workers_are_pinned_unless_callsat_pin_is_off(monkeypatch, pin):
  # CALLSAT_PIN (lower/device/threads.PIN) decides for the native workers too: one CPU each, or every CPU of the pool
  monkeypatch.setattr(pool, "PIN", pin)
  cpus = sorted(os.sched_getaffinity(0))
  p = pool.Pool(cpus)
  try:
    for cpu, tid in zip(cpus, _worker_tids(p)): assert os.sched_getaffinity(tid) == ({cpu} if pin else set(cpus))
  finally: p.close()

def test_move_after_out_of_range_is_refused(monkeypatch):
  monkeypatch.setattr(pool, "MOVE_AFTER", 0)
  with pytest.raises(ValueError, match="MOVE_AFTER"): pool.Pool(sorted(os.sched_getaffinity(0)))
