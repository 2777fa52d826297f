"""Native kernel threads: a split kernel runs its chunks on pthreads that never touch Python.

Python worker threads (ThreadPoolExecutor) cost 0.1-0.2 ms per split launch, most of it GIL handoffs between the caller
and the woken worker (measured on a 512^3 matmul: the caller's own chunk started 0.13 ms after the submit, the worker's
0.07 ms later). Here one ctypes call (the GIL released throughout) posts a job to native workers and works on it itself;
workers spin briefly after a job (back-to-back kernels find them awake), then sleep on a futex. Each kernel module
carries an `argv` thunk per kernel (lower/device/compiler.py) so a worker can call any signature.

Chunks are claimed, not assigned: a job is cut into several chunks per thread and every thread (the caller too) takes
the next one from a shared counter until none is left, so a thread that shares its core with another process simply
takes fewer. The caller never waits on a worker that has not started: once every chunk is claimed it cancels a posted
worker still asleep (state posted -> cancelled, a compare-and-swap the worker's own start races with) and waits only for
those running a chunk. With a fixed split, a CPU-bound process on one of 2 cores halved a matmul's speed. A worker the
caller still waits on past 1.5x its own chunks' mean time was most likely preempted on its CPU, where it would wait for
its turn while the caller's CPU sat idle (the scheduler leaves a pinned thread, and one that ran just now, where it is):
the caller moves it to its own CPU before it sleeps, and the worker pins itself back when its job is done. Beside a
process spinning on one of 2 CPUs a row sum, an elementwise kernel and a 512^3 matmul ran 1.07-1.26x faster for it;
quiet, within noise (bench/pool_ab.py).

A launch may also be posted and finished later (Pool.post, Posted.finish: the two halves of run): the workers start on it
while the caller goes back to Python (the front end's realize builds the next graph meanwhile), and whoever needs the
result first takes the chunks still unclaimed and waits for the rest. The pool stays locked until then.

Per-worker block (WORKER_BYTES, cache-line separated fields the caller and the worker write):
  +0 i32 seq (posted jobs; the worker's futex word)   +8 the job block   +40 cpu   +48 i32 stop (Pool.close)
  +64 i32 state: 1 posted, 2 running, 3 done, 4 cancelled (the caller's futex word)   +72 i32 the worker's tid
  +76 i32 moved (the caller moved it to its own CPU: it pins itself back)   +88 its own CPU's mask (a cpu_set_t)
Job block (one per pool; a split launch holds the pool's lock): +0 i64 next chunk, +8 chunks, +16 thunk, +24 argv, +32 cuts.
Linux x86-64 only (futex, gettid and sched_setaffinity via syscall(2), sched_getcpu, pthread_setaffinity_np); elsewhere
available() is False and lower/device/native.py uses the Python workers of lower/device/threads.py."""
from __future__ import annotations
import atexit, ctypes, os, platform, sys, threading
import numpy as np
from lower.device.llvmjit import JIT_LOCK
from lower.device.compile_proc import compile_module
from lower.device.threads import PIN

WORKER_BYTES = 128
MASK_BYTES = 128          # a cpu_set_t of 1024 CPUs, as glibc's
SPIN_CYCLES = 200_000     # ~0.08 ms at 2.6 GHz: a worker idles this long, spinning, before it sleeps
WAIT_SPIN_NS = 80_000     # the caller spins this long on a running worker before it sleeps
MOVE_AFTER = 1.5          # ... and moves it to its own CPU past this many times its own chunks' mean time (see above;
                          # at most 1e4: the limit is worked out in i64 ns)

POOL_IR = r"""
declare i64 @syscall(i64, ...)
declare i32 @sched_getcpu()
declare i32 @clock_gettime(i32, ptr)
declare i64 @llvm.readcyclecounter()
declare void @llvm.x86.sse2.pause()
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
declare i64 @llvm.smax.i64(i64, i64)

; claim chunks of the job (next, n, thunk, argv, cuts) one at a time and run them, until none is left
define internal i64 @chunks(ptr %job) nounwind {
entry:
  %np = getelementptr i8, ptr %job, i64 8
  %thp = getelementptr i8, ptr %job, i64 16
  %avp = getelementptr i8, ptr %job, i64 24
  %cp = getelementptr i8, ptr %job, i64 32
  br label %loop
loop:
  %k = phi i64 [0, %entry], [%k1, %run]
  %i = atomicrmw add ptr %job, i64 1 acq_rel
  %n = load i64, ptr %np, align 8
  %more = icmp slt i64 %i, %n
  br i1 %more, label %run, label %out
run:
  %th = load ptr, ptr %thp, align 8
  %av = load ptr, ptr %avp, align 8
  %cuts = load ptr, ptr %cp, align 8
  %sp = getelementptr i64, ptr %cuts, i64 %i
  %s = load i64, ptr %sp, align 8
  %i1 = add i64 %i, 1
  %ep = getelementptr i64, ptr %cuts, i64 %i1
  %e = load i64, ptr %ep, align 8
  call void %th(ptr %av, i64 %s, i64 %e)
  %k1 = add i64 %k, 1
  br label %loop
out:
  ret i64 %k
}

; CLOCK_MONOTONIC in ns (vDSO)
define internal i64 @now() nounwind {
  %ts = alloca [2 x i64], align 8
  %r = call i32 @clock_gettime(i32 1, ptr %ts)
  %s = load i64, ptr %ts, align 8
  %np = getelementptr i64, ptr %ts, i64 1
  %n = load i64, ptr %np, align 8
  %sn = mul i64 %s, 1000000000
  %t = add i64 %sn, %n
  ret i64 %t
}

; the worker: wait for seq to move (spin SPIN cycles, then futex-wait); return when told to stop (Pool.close), else
; take the job (state posted -> running; a job the caller cancelled is left alone), run chunks, publish state done
define ptr @callsat_pool_worker(ptr %w) nounwind {
entry:
  %tid = call i64 (i64, ...) @syscall(i64 186)                                         ; gettid: the caller moves it by it
  %tid32 = trunc i64 %tid to i32
  %tidp = getelementptr i8, ptr %w, i64 72
  store atomic i32 %tid32, ptr %tidp release, align 4
  %jp = getelementptr i8, ptr %w, i64 8
  %job = load ptr, ptr %jp, align 8
  %stp = getelementptr i8, ptr %w, i64 64
  %qp = getelementptr i8, ptr %w, i64 48
  br label %idle
idle:                                        ; last: the seq seen last (seq starts at 0)
  %last = phi i32 [0, %entry], [%last, %sleep], [%seq, %take], [%seq, %work]
  %t0 = call i64 @llvm.readcyclecounter()
  br label %spin
spin:
  %seq = load atomic i32, ptr %w acquire, align 4
  %new = icmp ne i32 %seq, %last
  br i1 %new, label %claim, label %check
check:
  call void @llvm.x86.sse2.pause()
  %t = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %t, %t0
  %long = icmp ugt i64 %dt, SPIN
  br i1 %long, label %sleep, label %spin
sleep:
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %w, i32 128, i32 %last, ptr null)   ; FUTEX_WAIT_PRIVATE while seq == last
  br label %idle
claim:
  %quit = load atomic i32, ptr %qp acquire, align 4
  %stop = icmp ne i32 %quit, 0
  br i1 %stop, label %exit, label %take
take:
  %cx = cmpxchg ptr %stp, i32 1, i32 2 acq_rel acquire
  %ok = extractvalue { i32, i1 } %cx, 1
  br i1 %ok, label %work, label %idle
exit:
  ret ptr null
work:
  call void @repin(ptr %w)
  %ran = call i64 @chunks(ptr %job)
  store atomic i32 3, ptr %stp release, align 4
  %r2 = call i64 (i64, ...) @syscall(i64 202, ptr %stp, i32 129, i32 1)              ; FUTEX_WAKE_PRIVATE
  call void @repin(ptr %w)
  br label %idle
}

; a worker the caller widened (flag +76 set after its sched_setaffinity) pins itself back to its own CPU (mask at +88)
define internal void @repin(ptr %w) nounwind {
entry:
  %fp = getelementptr i8, ptr %w, i64 76
  %f = atomicrmw xchg ptr %fp, i32 0 acq_rel
  %wide = icmp ne i32 %f, 0
  br i1 %wide, label %pin, label %out
pin:
  %mp = getelementptr i8, ptr %w, i64 88
  %m = load ptr, ptr %mp, align 8
  %r = call i64 (i64, ...) @syscall(i64 203, i64 0, i64 128, ptr %m)                   ; sched_setaffinity(self)
  br label %out
out:
  ret void
}

; the caller waited past its limit on a running worker: most likely another process preempted it on its CPU, where it
; would wait for its turn while the caller's CPU goes idle (the scheduler keeps a pinned thread, and a thread that ran
; recently, where it is), so move it to the caller's CPU before the caller sleeps; the affinity first, then the flag, so
; the worker's repin (at its job's end, or its next job's start) always follows
define internal void @move(ptr %w) nounwind {
entry:
  %mask = alloca [16 x i64], align 8
  call void @llvm.memset.p0.i64(ptr %mask, i8 0, i64 128, i1 false)
  %me32 = call i32 @sched_getcpu()
  %me = zext i32 %me32 to i64
  %fits = icmp ult i64 %me, 1024                                                       ; -1: sched_getcpu failed
  br i1 %fits, label %go, label %out
go:
  %word = lshr i64 %me, 6
  %sh = and i64 %me, 63
  %bit = shl i64 1, %sh
  %mp = getelementptr i64, ptr %mask, i64 %word
  store i64 %bit, ptr %mp, align 8
  %tp = getelementptr i8, ptr %w, i64 72
  %t = load atomic i32, ptr %tp acquire, align 4
  %t64 = sext i32 %t to i64
  %r = call i64 (i64, ...) @syscall(i64 203, i64 %t64, i64 128, ptr %mask)             ; sched_setaffinity(worker)
  %fp = getelementptr i8, ptr %w, i64 76
  store atomic i32 1, ptr %fp release, align 4
  br label %out
out:
  ret void
}

; the caller's first half: post the job to up to `want` workers on other CPUs than the caller's (used[i] = 1 for each
; posted; the caller zeroes `used`)
define void @callsat_pool_post(ptr %ws, i64 %nw, ptr %job, i64 %want, ptr %used) nounwind {
entry:
  %me32 = call i32 @sched_getcpu()
  %me = sext i32 %me32 to i64
  br label %post.cond
post.cond:
  %wi = phi i64 [0, %entry], [%wi.next, %post.next]
  %np = phi i64 [0, %entry], [%np.next, %post.next]
  %more = icmp slt i64 %np, %want
  %wok = icmp slt i64 %wi, %nw
  %go = and i1 %more, %wok
  br i1 %go, label %post.body, label %done
post.body:
  %wo = mul i64 %wi, 128
  %w = getelementptr i8, ptr %ws, i64 %wo
  %cpup = getelementptr i8, ptr %w, i64 40
  %cpu = load i64, ptr %cpup, align 8
  %mine = icmp eq i64 %cpu, %me
  br i1 %mine, label %post.next, label %post
post:
  %usedp = getelementptr i64, ptr %used, i64 %wi
  store i64 1, ptr %usedp
  %stp = getelementptr i8, ptr %w, i64 64
  store atomic i32 1, ptr %stp monotonic, align 4
  %old = load atomic i32, ptr %w monotonic, align 4
  %nseq = add i32 %old, 1
  store atomic i32 %nseq, ptr %w release, align 4
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %w, i32 129, i32 1)                  ; FUTEX_WAKE_PRIVATE
  br label %post.next
post.next:
  %wi.next = add i64 %wi, 1
  %np1 = add i64 %np, 1
  %np.next = select i1 %mine, i64 %np, i64 %np1
  br label %post.cond
done:
  ret void
}

; the caller's second half: run chunks here too, then cancel each posted worker that has not started and wait for those
; that did; returns 1 when a worker was still running its chunk once the caller had no chunk left (the caller waited)
define i64 @callsat_pool_finish(ptr %ws, i64 %nw, ptr %job, ptr %used) nounwind {
entry:
  %waited = alloca i64
  store i64 0, ptr %waited
  %moved = alloca i64
  %ts = alloca [2 x i64], align 8
  %c0 = call i64 @now()
  %k = call i64 @chunks(ptr %job)
  %c1 = call i64 @now()
  ; the limit on a wait before the worker is moved: MOVE_AFTER x the caller's own chunks' mean time (a worker that runs
  ; takes no longer than about one chunk to end its last), at least SPIN_NS; 4x SPIN_NS when the caller ran no chunk
  %kk = call i64 @llvm.smax.i64(i64 %k, i64 1)
  %cdt = sub i64 %c1, %c0
  %per = sdiv i64 %cdt, %kk
  %perm = mul i64 %per, MOVE_PERMILLE
  %perl = sdiv i64 %perm, 1000
  %lim1 = call i64 @llvm.smax.i64(i64 %perl, i64 SPIN_NS)
  %ran = icmp sgt i64 %k, 0
  %lim = select i1 %ran, i64 %lim1, i64 MOVE_IDLE_NS
  br label %wait.cond
wait.cond:
  %vi = phi i64 [0, %entry], [%vi1, %wait.next]
  %vmore = icmp slt i64 %vi, %nw
  br i1 %vmore, label %wait.w, label %done
wait.w:
  %vup = getelementptr i64, ptr %used, i64 %vi
  %vu = load i64, ptr %vup
  %isu = icmp ne i64 %vu, 0
  br i1 %isu, label %wait.start, label %wait.next
wait.start:
  %vo = mul i64 %vi, 128
  %v = getelementptr i8, ptr %ws, i64 %vo
  %vst = getelementptr i8, ptr %v, i64 64
  %cx = cmpxchg ptr %vst, i32 1, i32 4 acq_rel acquire                                ; never started: cancelled
  %cancelled = extractvalue { i32, i1 } %cx, 1
  br i1 %cancelled, label %wait.next, label %wait.t0
wait.t0:
  %st0 = load atomic i32, ptr %vst acquire, align 4
  %busy = icmp ne i32 %st0, 3
  br i1 %busy, label %wait.mark, label %wait.next
wait.mark:
  store i64 1, ptr %waited
  store i64 0, ptr %moved
  %wt0 = call i64 @now()
  br label %wait.spin
wait.spin:
  %st = load atomic i32, ptr %vst acquire, align 4
  %fin = icmp eq i32 %st, 3
  br i1 %fin, label %wait.next, label %wait.more
wait.more:
  call void @llvm.x86.sse2.pause()
  %wt = call i64 @now()
  %wdt = sub i64 %wt, %wt0
  %wlong = icmp sgt i64 %wdt, SPIN_NS
  br i1 %wlong, label %wait.sleep, label %wait.spin
wait.sleep:                                   ; past the spin: sleep until the limit, then move the worker and sleep
  %mv = load i64, ptr %moved
  %ismv = icmp ne i64 %mv, 0
  br i1 %ismv, label %wait.block, label %wait.due
wait.due:
  %left = sub i64 %lim, %wdt
  %early = icmp sgt i64 %left, 0
  br i1 %early, label %wait.timed, label %wait.move
wait.timed:
  %lsec = udiv i64 %left, 1000000000
  %lns = urem i64 %left, 1000000000
  store i64 %lsec, ptr %ts, align 8
  %tsn = getelementptr i64, ptr %ts, i64 1
  store i64 %lns, ptr %tsn, align 8
  %r4 = call i64 (i64, ...) @syscall(i64 202, ptr %vst, i32 128, i32 %st, ptr %ts)    ; FUTEX_WAIT_PRIVATE, timed
  br label %wait.spin
wait.move:
  call void @move(ptr %v)
  store i64 1, ptr %moved
  br label %wait.block
wait.block:
  %r3 = call i64 (i64, ...) @syscall(i64 202, ptr %vst, i32 128, i32 %st, ptr null)   ; FUTEX_WAIT_PRIVATE while state == st
  br label %wait.spin
wait.next:
  %vi1 = add i64 %vi, 1
  br label %wait.cond
done:
  %w = load i64, ptr %waited
  ret i64 %w
}

; both halves at once (a split launch that waits)
define void @callsat_pool_run(ptr %ws, i64 %nw, ptr %job, i64 %want) nounwind {
entry:
  %used = alloca i64, i64 %nw
  %bytes = mul i64 %nw, 8
  call void @llvm.memset.p0.i64(ptr %used, i8 0, i64 %bytes, i1 false)
  call void @callsat_pool_post(ptr %ws, i64 %nw, ptr %job, i64 %want, ptr %used)
  %w = call i64 @callsat_pool_finish(ptr %ws, i64 %nw, ptr %job, ptr %used)
  ret void
}
"""

def _ir() -> str:
  if not 0 < MOVE_AFTER <= 1e4: raise ValueError(f"pool.MOVE_AFTER must be in (0, 1e4], got {MOVE_AFTER}")
  subs = {"SPIN_NS": WAIT_SPIN_NS, "MOVE_IDLE_NS": 4 * WAIT_SPIN_NS, "MOVE_PERMILLE": round(MOVE_AFTER * 1000), "SPIN": SPIN_CYCLES}
  ir = POOL_IR
  for k, v in subs.items(): ir = ir.replace(k, str(v))   # SPIN_NS before SPIN
  return ir

def available() -> bool:
  return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64") and hasattr(os, "sched_getaffinity")

class Pool:
  """Native workers, one per CPU this process may use, pinned there (`pin`, default CALLSAT_PIN=1; the caller's thread is
  never pinned). The workers
  run code of the pool's own slab (`engine`) on the pool's memory, so a pool stops and joins them (close) before it lets
  go of either: its slab's engine is disposed, its code unmapped, once the last reference to it goes."""
  tids: list = []
  closed = False
  posted = None

  def __init__(self, cpus: list[int], disk=None, pin: bool | None = None):
    with JIT_LOCK:   # llvmlite is not thread-safe (lower/device/llvmjit.py)
      self.engine, _ = compile_module(_ir(), disk, level=2)
      run, post, finish, entry = (self.engine.get_function_address(f"callsat_pool_{f}") for f in ("run", "post", "finish", "worker"))
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    self._run = ctypes.CFUNCTYPE(None, vp, i64, vp, i64)(run)
    self._post = ctypes.CFUNCTYPE(None, vp, i64, vp, i64, vp)(post)
    self._finish = ctypes.CFUNCTYPE(i64, vp, i64, vp, vp)(finish)
    self.posted: Posted | None = None   # the split launch in flight (post), if any: it holds the lock
    self.pid, self.cpus, self.lock = os.getpid(), list(cpus), threading.Lock()
    # the workers' blocks, the job block, then each worker's CPU as a cpu_set_t (MASK_BYTES)
    self._mem = np.zeros(len(cpus) * WORKER_BYTES + 64 + 64 + len(cpus) * MASK_BYTES, np.uint8)
    self.base = self._mem.ctypes.data + (-self._mem.ctypes.data) % 64
    self.job = self.base + len(cpus) * WORKER_BYTES
    at = self.job + 64 - self._mem.ctypes.data
    masks = self._mem[at:at + len(cpus) * MASK_BYTES].view(np.uint64).reshape(len(cpus), -1)
    self.pin = PIN if pin is None else pin   # CALLSAT_PIN=0: every worker may run on any of the CPUs
    for i, cpu in enumerate(cpus):
      for c in ([cpu] if self.pin else cpus): masks[i, c // 64] |= np.uint64(1 << (c % 64))
    self._job = (ctypes.c_int64 * 5).from_address(self.job)
    libc = ctypes.CDLL(None, use_errno=True)
    create, setaff = libc.pthread_create, libc.pthread_setaffinity_np
    create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    setaff.argtypes = [ctypes.c_ulong, ctypes.c_size_t, ctypes.c_void_p]
    self._join, self._syscall = libc.pthread_join, libc.syscall   # kept for close (also run from __del__)
    self._join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    self._syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    self.tids = []
    for i, cpu in enumerate(cpus):
      w = self.base + i * WORKER_BYTES
      ctypes.c_int64.from_address(w + 8).value = self.job
      ctypes.c_int64.from_address(w + 40).value = cpu
      ctypes.c_int64.from_address(w + 88).value = own = masks[i].ctypes.data
      tid = ctypes.c_ulong(0)
      if (rc := create(ctypes.byref(tid), None, entry, w)) != 0: raise OSError(rc, f"pthread_create for kernel worker {i}: {os.strerror(rc)}")
      setaff(tid.value, MASK_BYTES, own)   # best effort: unpinned still runs correctly
      self.tids.append(tid.value)

  def run(self, thunk: int, argv: int, cuts: list[int], helpers: int | None = None) -> bool:
    """Chunks [cuts[t], cuts[t+1]) of thunk(argv, start, end), claimed by the caller and up to `helpers` workers
    (default: one per chunk after the first); False (nothing run) when another thread of this process is inside a split
    launch right now, or one was posted and not finished (the caller then runs the kernel itself)."""
    if not self.lock.acquire(blocking=False): return False
    try:
      if self.closed: return False
      self._load(thunk, argv, cuts)
      self._run(self.base, len(self.cpus), self.job, len(cuts) - 2 if helpers is None else helpers)
    finally: self.lock.release()
    return True

  def post(self, thunk: int, argv: int, cuts: list[int], helpers: int | None = None) -> Posted | None:
    """run's first half: the job posted to the workers and left running; the caller takes its own share of the chunks
    and waits in Posted.finish (the pool stays locked until then). None (nothing posted) where run would return False."""
    if not self.lock.acquire(blocking=False): return None
    if self.closed: self.lock.release(); return None
    used = (ctypes.c_int64 * len(self.cpus))()
    self._load(thunk, argv, cuts)
    self._post(self.base, len(self.cpus), self.job, len(cuts) - 2 if helpers is None else helpers, used)
    self.posted = p = Posted(self, used)
    return p

  def _load(self, thunk: int, argv: int, cuts: list[int]) -> None:
    """Write the job block, and the cuts array it points at (kept by the pool until the next job)."""
    c = self._cuts = (ctypes.c_int64 * len(cuts))(*cuts)
    j = self._job
    j[0], j[1], j[2], j[3], j[4] = 0, len(cuts) - 1, thunk, argv, ctypes.addressof(c)

  def close(self) -> None:
    """Stop the workers and wait until they have exited (each is told through its stop word and a new seq, then woken).
    Until then a worker may be spinning, or wake from its futex, in this pool's code: disposing the slab's engine under
    it (dropping the last reference to a pool with live workers) crashed the process with SIGSEGV at a PC in the unmapped
    code. Idempotent; later runs return False. In a forked child the workers were the parent's: nothing to stop."""
    if self.pid != os.getpid():   # before the lock: a fork during a parent's split launch left the child's copy held
      self.closed, self.tids = True, []
      return
    if (p := self.posted) is not None: p.finish()   # a posted job holds the lock until it is finished
    with self.lock:   # no split launch in flight
      if self.closed: return
      self.closed = True
      tids, self.tids = self.tids, []
      for i in range(len(tids)):
        w = self.base + i * WORKER_BYTES
        ctypes.c_int32.from_address(w + 48).value = 1    # stop, then a new seq: the worker reads seq first, then stop
        seq = ctypes.c_int32.from_address(w)
        seq.value = (seq.value + 1) & 0x7FFFFFFF
        self._syscall(202, w, 129, 1)                   # FUTEX_WAKE_PRIVATE
      for tid in tids: self._join(tid, None)             # ctypes releases the GIL meanwhile

  def __del__(self):
    # at interpreter exit llvmlite disposes nothing (its engines stay mapped) and the process takes the threads down
    if "lock" in self.__dict__ and not sys.is_finalizing(): self.close()

class Posted:
  """A split launch in flight (Pool.post): finish() takes the chunks no worker has claimed, waits for the workers that
  did, and unlocks the pool. Idempotent and thread-safe: whoever needs the result first finishes it."""
  __slots__ = ("pool", "used", "lock", "waited")
  def __init__(self, pool: Pool, used):
    self.pool, self.used, self.lock = pool, used, threading.Lock()   # used: the workers it was posted to
    self.waited = False   # once finished: a worker was still on its chunk when the caller had none left
  def finish(self) -> None:
    with self.lock:
      if (p := self.pool) is None: return
      self.waited = bool(p._finish(p.base, len(p.cpus), p.job, self.used))
      self.pool = None
      p.posted = None
      p.lock.release()

_POOL: Pool | None = None
_POOL_FAILED = False
_MAKING = threading.Lock()

def _finish_posted():
  """Finish the job in flight, if any: before a fork (a child inherits no workers to finish it) and at exit (the
  interpreter's teardown may free the memory the workers write)."""
  if _POOL is not None and (p := _POOL.posted) is not None: p.finish()
atexit.register(_finish_posted)

def _after_fork_in_child():
  global _MAKING
  _MAKING = threading.Lock()   # a fork while another thread held it would leave the child's copy locked for good
if hasattr(os, "register_at_fork"): os.register_at_fork(before=_finish_posted, after_in_child=_after_fork_in_child)

def pool(disk=None) -> Pool | None:
  """The process's pool, made on first use (its module's object from `disk`, a lower.device.cache.DiskCache, when on; made
  again in a forked child, which inherits no threads); None where native threads are unavailable or could not start
  (lower/device/native.py then uses Python workers)."""
  global _POOL, _POOL_FAILED
  if _POOL is not None and _POOL.pid == os.getpid(): return _POOL
  if _POOL_FAILED or not available() or os.environ.get("CALLSAT_NATIVE_THREADS", "1") in ("", "0"): return None
  with _MAKING:   # two threads' first split launches must not start two sets of workers
    if _POOL is None or _POOL.pid != os.getpid():
      try: _POOL = Pool(sorted(c for c in os.sched_getaffinity(0) if c < MASK_BYTES * 8), disk)   # CPUs a cpu_set_t holds
      except (OSError, AttributeError): _POOL_FAILED = True; return None
  return _POOL
