"""Running compiled kernels: a launch (split across threads when its work is large: the native pool, else Python
workers) and the native runner, which kernelizes a CALL, compiles the misses through the kernel cache and runs it, keeping
a prepared plan per CALL."""
from __future__ import annotations
import ctypes, math, os, sys, threading, time, weakref
from dataclasses import replace
from egraph.ir.errors import CallsatError
from egraph.ir.env import env_value
from egraph.ir.ops import Ops, toposort
from egraph.ir.storage import elements
from lower.device.backend import Backend, buffer_array
from lower.device import cache
from lower.device.compiler import Compiled, debug_level
from lower.render.llvm.module import col_reduce
from lower.schedule.kernel import Var, mm_batched
from lower.schedule.kernelize import kernelize
from lower.schedule.mem import arg_binding
from lower.device.pool import pool
from lower.device.threads import run_split

class BoundsError(CallsatError, IndexError):
  """CHECK_BOUNDS=1: a kernel indexed outside a buffer."""

def check_bounds() -> bool: return env_value("CHECK_BOUNDS") not in ("", "0")

def _threads() -> int:
  """CALLSAT_THREADS, else every CPU this process may use."""
  try: n = int(os.environ.get("CALLSAT_THREADS") or 0)
  except ValueError: raise CallsatError(f"CALLSAT_THREADS={os.environ['CALLSAT_THREADS']!r} is not an integer") from None
  return max(1, n or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

THREADS = _threads()
PARALLEL_WORK = 1 << 21          # estimated element-ops above which a kernel is split across THREADS
# ... or above which, in a CALL with another such kernel right before or after it, it is split too: the workers'
# futex wake-up (~50 us, more than a medium kernel gains from a second thread when they sleep) is paid once for the run
# of them (an optimizer update over several tensors; a 3 MB update: 43 -> 29 us once they are awake)
PARALLEL_WORK_RUN = 1 << 20
ROUND_WORK = 1 << 25             # element-ops per round of a long kernel (~5-20 ms): Ctrl-C waits at most one round
CHUNKS_PER_THREAD = 8            # native workers claim chunks: a thread on a busy core takes fewer (lower/device/pool.py)
# a tiled matmul call packs all of B (K x N) for the rows it is given, so its chunks are at least this many rows (fewer
# when there are fewer per thread): 8-row chunks packed B once per 8 rows and ran 1024^3 at a third of its speed
MM_CHUNK_ROWS = 256
# a column reduce (lower/render/llvm/module.py col_reduce) split along its output columns walks every row for the
# columns it is given: its chunks are this many columns (multiples of 16, a vector; fewer when there are fewer per
# thread), since each row's loop setup and scalar tail is paid per chunk. Batch norm's 4096^2 variance: ~50-column
# chunks (8 per thread) 5.1-5.3 ms, 512 columns 3.8-4.6, 1024 2.8, 2048 (one chunk per thread) 2.8, one thread 6.5
COL_CHUNK = 1024
# a launch left running in two coarse chunks gives the worker this share of the rows at most (and the caller at least
# 1 - SHARE_MAX), moved per run (SHARE_STEP first) toward the cut at which neither waits for the other
SHARE_MAX, SHARE_STEP = 0.95, 1 / 32
PLAN_BYTES = 512                 # a prepared launch's resident bytes (its argument array, cuts), counted per kernel
ARENA_HELD = 64 << 10            # a schedule entry holds its last plan strongly up to this much temporaries' arena
STATS = {"rounds": 0, "peak": 0}   # rounds run (long kernels); the peak temporary bytes of the last CALL planned

class Launch:
  """One kernel launch with its pointers fixed: the argument array the native workers read, the chunk cuts per thread
  count and the error slot are built once, so a prepared launch run again costs one ctypes call (run_native keeps them
  per CALL)."""
  __slots__ = ("c", "ptrs", "work", "threads", "err", "extra", "argv", "n0", "mr", "_cuts", "share", "uneven", "move", "col")
  def __init__(self, c: Compiled, ptrs: list[int], work: int = 0, threads: int | None = None):
    k = c.kernel
    self.c, self.ptrs, self.work, self.threads = c, list(ptrs), work, threads
    self.err = ctypes.c_int32(0) if k.checked else None
    self.extra = (ctypes.byref(self.err),) if k.checked else ()
    self.argv = (ctypes.c_void_p * (len(ptrs) + bool(k.checked)))(*ptrs, *([ctypes.addressof(self.err)] if k.checked else []))
    self.n0, self.mr, self._cuts = k.domain[0].size if k.domain else 1, k.tile[1] if k.tile and not mm_batched(k) else 0, {}
    # a column reduce split along its columns: domain[0] its only live var (checked first: col_reduce walks the value)
    self.col = self.n0 > 1 and all(v.size == 1 for v in k.domain[1:]) and (cr := col_reduce(k)) is not None and cr[1] == k.domain[0]
    # left running in two coarse chunks: the worker's share of the rows and its last move (post, adapt)
    self.share, self.uneven, self.move = 0.5, False, SHARE_STEP

  def step(self, nt: int) -> int:
    """Chunk bounds are multiples of this: 1; for a tiled matmul a multiple of its row tile, MM_CHUNK_ROWS or the rows
    per thread if fewer; for a column reduce COL_CHUNK columns or the columns per thread if fewer (a multiple of 16)."""
    if (mr := self.mr): return max(mr, min(MM_CHUNK_ROWS, self.n0 // max(1, nt)) // mr * mr)
    return max(16, min(COL_CHUNK, self.n0 // max(1, nt)) // 16 * 16) if self.col else 1

  def cuts(self, nt: int) -> list[int] | None:
    """Chunk bounds for nt threads (multiples of step(nt)), or None when the kernel runs on one thread."""
    if nt <= 1 or self.work < PARALLEL_WORK or self.n0 < 2 * self.step(nt): return None
    if (cs := self._cuts.get(nt)) is None:
      n0, step = self.n0, self.step(nt)
      cs = self._cuts[nt] = [0] + [((n0 * t // nt) // step) * step for t in range(1, nt)] + [n0]
    return cs

  def rounds(self, nt: int, per: int = 1) -> list[list[int]] | None:
    """Per round, chunk bounds (multiples of step(nt)) for nt threads taking `per` chunks each, or None
    when the kernel runs as one call. A long kernel runs in rounds of ~ROUND_WORK element-ops: Python runs between them,
    so a signal (Ctrl-C) raises there, not after the kernel."""
    if self.work < PARALLEL_WORK or self.n0 < 2 * self.step(nt): return None
    if (rs := self._cuts.get((nt, per, ROUND_WORK))) is None:
      n0, step, nt = self.n0, self.step(nt), max(1, nt)
      r = max(1, min(self.work // ROUND_WORK, n0 // (step * nt)))
      bs = [0] + [((n0 * i // r) // step) * step for i in range(1, r)] + [n0]
      parts = nt * per if nt > 1 else 1
      rs = self._cuts[(nt, per, ROUND_WORK)] = None if r == 1 and nt == 1 else \
        [sorted({a, b, *(a + (((b - a) * t // parts) // step) * step for t in range(1, parts))}) for a, b in zip(bs, bs[1:])]
    return rs

  def __call__(self) -> None:
    c, err, ptrs, extra = self.c, self.err, self.ptrs, self.extra
    if err is not None: err.value = 0
    nt = THREADS if self.threads is None else self.threads
    p = pool(cache.CACHE.disk_cache) if nt > 1 and c.thunk else None
    rs = self.rounds(nt, CHUNKS_PER_THREAD if p is not None else 1)
    if rs is None: c.fn(*ptrs, 0, self.n0, *extra)
    else:
      for cuts in rs:   # between rounds the interpreter checks for signals: a KeyboardInterrupt surfaces here
        STATS["rounds"] += 1
        if len(cuts) == 2: c.fn(*ptrs, cuts[0], cuts[1], *extra)
        elif p is not None:
          if not p.run(c.thunk, ctypes.addressof(self.argv), cuts, nt - 1): c.fn(*ptrs, cuts[0], cuts[-1], *extra)   # pool busy
        else: run_split(c.fn, ptrs, cuts, extra)
    if err is not None and err.value:
      p = c.kernel.params[err.value - 1]
      raise BoundsError(f"kernel {c.name}: index out of bounds on buffer {p.name} ({p.dtype.name}[{p.size}])")

  def post(self):
    """Start this launch on the native workers and return its pool.Posted (finish() completes it), or None once it has
    run here: a kernel not split, split in several rounds, bounds-checked (its error slot is read after it) or the
    pool busy. Split in two or more chunks per thread, the chunks are claimed as they go; in fewer (a tiled matmul's
    chunks each pack all of B) on 2 threads it is cut in two at the worker's `share`: in equal halves the worker took
    one while the caller ran Python and the caller the other when it came back, so the kernel ended no sooner than
    waiting (0.83-1.0x). The share moves each time by who waited for whom (adapt)."""
    nt = THREADS if self.threads is None else self.threads
    if self.err is None and nt > 1 and self.c.thunk and (p := pool(cache.CACHE.disk_cache)) is not None and \
       (rs := self.rounds(nt, CHUNKS_PER_THREAD)) is not None and len(rs) == 1:
      cuts, self.uneven = rs[0], len(rs[0]) <= 2 * nt
      if self.uneven:
        if nt != 2: self(); return None
        step, n0 = self.mr or 1, self.n0
        cuts = [0, min(max(round(self.share * n0 / step) * step, step), n0 - step), n0]
      if (h := p.post(self.c.thunk, ctypes.addressof(self.argv), cuts, nt - 1)) is not None: STATS["rounds"] += 1; return h
    self()
    return None

  def adapt(self, waited: bool) -> None:
    """After a run left going in two coarse chunks: the caller waited for the worker (its share was too big) or not.
    The move halves when its direction turns and doubles when it keeps it (SHARE_STEP / 8 to SHARE_STEP * 2): it
    settles fast, and then swings by little (each swing is time one side waits)."""
    if not self.uneven: return
    m = -abs(self.move) if waited else abs(self.move)
    m = m * 2 if (m > 0) == (self.move > 0) else m / 2
    self.move = max(SHARE_STEP / 8, min(2 * SHARE_STEP, abs(m))) * (1 if m > 0 else -1)
    self.share = min(SHARE_MAX, max(1 - SHARE_MAX, self.share + self.move))

def launch(c: Compiled, ptrs: list[int], work: int = 0, threads: int | None = None) -> None:
  """Run a compiled kernel on `ptrs` (one per param), split across threads when `work` is large enough."""
  Launch(c, ptrs, work, threads)()

def _buffers_in(body): return {n.arg.uid: n for n in toposort([body]) if n.op is Ops.BUFFER}

def _covers(k, m) -> bool:
  """Does kernel k's store write every element of its Mem m (one row-major sweep of the whole domain)? Then the buffer
  needs no zero-fill before it runs."""
  idx, dom = k.store.idx, [v for v in k.domain if v.size > 1]
  if idx.c != 0 or any(not isinstance(a, Var) for a, _ in idx.terms) or math.prod(v.size for v in dom) != m.count: return False
  stride = 1
  for a, coef in sorted(idx.terms, key=lambda t: t[1]):
    if coef != stride: return False
    stride *= a.size
  return len(idx.terms) == len(dom) and {a for a, _ in idx.terms} == set(dom)

def memory_plan(prog) -> tuple[dict, int, set]:
  """(temp root -> arena offset, the arena's peak bytes, argument roots fully written before anything reads them).
  Temporaries live from their first step to their last; those whose lifetimes do not overlap share bytes (greedy,
  largest first, 64-byte aligned)."""
  life: dict = {}
  for i, s in enumerate(prog.steps):
    for m in s.mems:
      if m.root[0] == "tmp": a, _ = life.get(m.root, (i, i)); life[m.root] = (a, i)
  placed, offs = [], {}
  for r in sorted(prog.temps, key=lambda r: (-prog.temps[r], r)):
    size, (a, b) = -(-prog.temps[r] // 64) * 64, life.get(r, (0, len(prog.steps)))
    off = 0
    for o, n, pa, pb in sorted((x for x in placed if x[2] <= b and a <= x[3])):   # live at the same time: no overlap
      if off + size <= o: break
      off = max(off, o + n)
    placed.append((off, size, a, b)); offs[r] = off
  covered, seen = set(), set()
  for s in prog.steps:
    roots = [m.root for m in s.mems]
    if s.kernel is not None:
      st = s.mems[s.kernel.store.param]
      if st.root not in seen and st.root[0] == "arg" and st.off == 0 and st.dstride == 0 and roots.count(st.root) == 1 and _covers(s.kernel, st):
        covered.add(st.root)
    seen.update(roots)
  return offs, max((o + n for o, n, _, _ in placed), default=0), covered

class Plan:
  """A CALL's steps ready to run again: prepared launches and copies over the arrays it ran on (`arrays`: (uid, weak
  reference) per schedule root, in _Sched.roots order, checked by identity on each run), its temporaries' arena (kept:
  the pointers point into it; back to the storage pool when the plan dies) and a lock: one run (or rebind) at a time.
  The schedule entry keeps its last plan too: a new CALL of the same schedule (a realize loop's fresh output, a TinyJit
  replay's new input) rebinds the roots whose arrays changed, pointer by pointer, instead of preparing every launch."""
  __slots__ = ("checked", "arrays", "steps", "temps", "pool", "lock", "call", "__weakref__")
  def __init__(self, checked, arrays, steps, temps, pool, call):
    self.checked, self.arrays, self.steps, self.temps, self.pool = checked, arrays, steps, temps, pool
    self.lock, self.call = threading.Lock(), weakref.ref(call)   # the CALL it is bound to now
  def __del__(self):
    if self.temps is not None and self.pool is not None: self.pool.give(self.temps)

  def current(self, call, storage) -> bool:
    """Is the plan bound to `call` (not rebound to another CALL of its schedule since: whose buffers may be alive too),
    with every root's array still in `storage` under its uid?"""
    return self.call() is call and all((x := a()) is not None and storage.get(u) is x for u, a in self.arrays)

  def rebind(self, call, sch: "_Sched", roots: list) -> None:
    """Bind the plan to `call`: its launches and copies pointed at the arrays of `roots` (a (BUFFER, array) pair per
    schedule root, as _arrays gives) where they changed."""
    steps, self.call = self.steps, weakref.ref(call)
    for i, (b, a) in enumerate(roots):
      r = sch.roots[i][0]
      u, ref = self.arrays[i]
      if u == b.arg.uid and ref() is a: continue
      base = a.ctypes.data
      for si, slot, off in sch.uses[r]:
        st = steps[si]
        if type(st) is tuple: steps[si] = (base + off, st[1], st[2]) if slot == 0 else (st[0], base + off, st[2])
        else: st.ptrs[slot] = st.argv[slot] = base + off
      self.arrays[i] = (b.arg.uid, weakref.ref(a))

  def run(self, wait: bool = True):
    """Run the steps; with `wait` False the last launch may be left running on the workers: its pool.Posted, else None."""
    steps = self.steps
    last = len(steps) - 1 if not wait and steps and type(steps[-1]) is not tuple else len(steps)
    for i in range(last):
      if type(s := steps[i]) is tuple: ctypes.memmove(*s)
      else: s()
    return steps[last].post() if last < len(steps) else None

class Pending:
  """A CALL's last launch still running (run_native with wait False), kept with what it runs on: its plan (locked: no
  rebind moves a pointer under the workers; its arena stays) and the CALL (its BUFFERs, so their storage, stay).
  finish() waits for it; idempotent and thread-safe."""
  __slots__ = ("posted", "plan", "call", "lock")
  def __init__(self, posted, plan: Plan, call):
    self.posted, self.plan, self.call, self.lock = posted, plan, call, threading.Lock()
  def finish(self) -> None:
    with self.lock:
      if (plan := self.plan) is None: return
      self.posted.finish()
      plan.steps[-1].adapt(self.posted.waited)
      self.plan = self.call = self.posted = None
      plan.lock.release()

class _Sched:
  """A schedule entry: the body's kernelized program for one argument aliasing, with what every run of it needs worked
  out once: the kernels (and their keys: their text; no compiled code is held, the kernel cache may evict it), the
  memory plan, the storage roots in allocation order with whether each is written and must be zero-filled first, and
  the steps as (kernel index, [(root, byte offset)], work) or a copy ((dst root, off), (src root, off), bytes)."""
  __slots__ = ("prog", "kernels", "keys", "offs", "peak", "roots", "inner", "steps", "uses", "plan", "nbytes")
  def __init__(self, prog, checked: bool):
    self.prog = prog
    if checked:
      for s in prog.steps:
        if s.kernel is not None: s.kernel = replace(s.kernel, checked=True)
    self.kernels = [s.kernel for s in prog.steps if s.kernel is not None]
    self.keys = [k.key() for k in self.kernels]
    self.offs, self.peak, covered = memory_plan(prog)
    roots = {m.root for s in prog.steps for m in s.mems if m.root[0] != "tmp"} | {r for r in prog.written if r[0] != "tmp"}
    self.roots = [(r, r in prog.written, r not in covered) for r in sorted(roots, key=str)]
    self.inner = any(r[0] == "buf" for r, _, _ in self.roots)
    steps, ki = [], 0
    for s in prog.steps:
      if s.kernel is None:
        src, dst = s.mems
        steps.append(((dst.root, dst.off), (src.root, src.off), src.nbytes))
      else:
        steps.append((ki, [(m.root, m.off) for m in s.mems], s.work)); ki += 1
    self.steps = split_runs(steps)
    # root -> (step, slot, byte offset) of each pointer into it: what a plan's rebind patches (temporaries never move)
    self.uses: dict = {r: [] for r, _, _ in self.roots}
    for si, st in enumerate(self.steps):
      for slot, (r, o) in enumerate(st[:2] if type(st[0]) is tuple else st[1]):   # a copy's (dst, src), a kernel's mems
        if r in self.uses: self.uses[r].append((si, slot, o))
    # the last plan made for this entry (run_native): held here when its temporaries' arena is small (counted in the
    # entry's bytes), weakly otherwise (a big arena stays as long as a CALL that ran on it, not as a cached schedule)
    self.plan = None
    self.nbytes = cache.SCHEDULE_BYTES + 3 * sum(map(len, self.keys)) + PLAN_BYTES * len(self.kernels) + \
      (self.peak if self.peak <= ARENA_HELD else 0)

def split_runs(steps: list) -> list:
  """steps with each kernel of a run of at least two adjacent kernels of PARALLEL_WORK_RUN or more element-ops counted
  as PARALLEL_WORK at least (split: the run pays the workers' wake-up once)."""
  big = [type(s[0]) is not tuple and s[2] >= PARALLEL_WORK_RUN for s in steps]
  return [(s[0], s[1], max(s[2], PARALLEL_WORK)) if big[i] and ((i > 0 and big[i - 1]) or (i + 1 < len(steps) and big[i + 1])) else s
          for i, s in enumerate(steps)]

def binding_key(call, checked: bool) -> tuple:
  """(bind or None, the BUFFER nodes, the schedule key): a CALL whose arguments are distinct whole BUFFERs (what the
  front end's realize makes) binds argument i to its own root at offset 0, so its key needs only each one's dtype, size
  and whether it is per-device storage; arg_binding (its Mems hash in Python) is left for a miss."""
  args, body = call.src[1:], call.src[0]
  if not getattr(call.arg, "temps", ()) and all(a.op is Ops.BUFFER for a in args) and len({a.arg.uid for a in args}) == len(args):
    return None, args, (body, "plain", tuple((a.dtype, a.arg.size, isinstance(a.arg.device, tuple)) for a in args), checked)
  bind, bufs = arg_binding(call)
  return bind, bufs, (body, tuple(bind[i] for i in range(len(bind))), checked)

def run_native(call, storage, wait: bool = True) -> Pending | None:
  """Execute a CALL with compiled kernels: kernelize (cached per body + argument aliasing: a new CALL of a known body
  costs its arguments' arrays and one Launch per kernel), compile misses, run. A CALL run again on the same storage
  arrays takes the prepared plan: after a kernel has swept the caches, the full path's Python (bindings, lookups,
  pointer math) took ~0.1 ms, 10% of a 512^3 matmul. A new CALL of a schedule run before takes that schedule's last
  plan with the changed pointers patched (Plan.rebind). With `wait` False the CALL's last launch may still be running
  on the workers when this returns: the Pending that finishes it (else None)."""
  CACHE = cache.CACHE   # read at each call (a test swaps in a fresh cache)
  checked = check_bounds()
  plan = CACHE.plans.get(call)
  if plan is not None and plan.checked == checked and plan.lock.acquire(blocking=False):
    if plan.current(call, storage): return _go(plan, call, wait)
    plan.lock.release()
  bufs, sch = _schedule(call, checked, CACHE)
  inner = _buffers_in(call.src[0]) if sch.inner else None
  roots = _arrays(sch, bufs, inner, storage)
  dbg = debug_level()
  if type(plan := sch.plan) is weakref.ref: plan = plan()
  if not dbg and plan is not None and plan.checked == checked and plan.lock.acquire(blocking=False):
    STATS["peak"] = sch.peak
    try: plan.rebind(call, sch, roots)
    except BaseException: plan.lock.release(); raise
    CACHE.plans[call] = plan
    return _go(plan, call, wait)
  compiled = CACHE.get(sch.kernels, sch.keys)
  base = {r: a.ctypes.data for (r, _, _), (_, a) in zip(sch.roots, roots)}
  arena, mpool = (storage.pool.take(sch.peak + 64, zero=False), storage.pool) if sch.peak else (None, None)
  STATS["peak"] = sch.peak
  if arena is not None:
    at = arena.ctypes.data + (-arena.ctypes.data) % 64
    for r, o in sch.offs.items(): base[r] = at + o
  steps = []
  for s in sch.steps:
    if type(s[0]) is tuple:
      (dr, do), (sr, so), nb = s
      steps.append((base[dr] + do, base[sr] + so, nb))
    else:
      ki, mems, work = s
      steps.append(Launch(compiled[ki], [base[r] + o for r, o in mems], work))
  if dbg:   # DEBUG runs take the full path each time, timing each kernel
    for st in steps:
      if type(st) is tuple: ctypes.memmove(*st); continue
      t0 = time.perf_counter()
      st()
      print(f"  {st.c.name:<40} {(time.perf_counter() - t0) * 1e3:9.3f} ms", file=sys.stderr)
    if arena is not None: mpool.give(arena)   # the temporaries are dead once the CALL has run
    return None
  plan = Plan(checked, [(b.arg.uid, weakref.ref(a)) for b, a in roots], steps, arena, mpool, call)
  plan.lock.acquire()
  pending = _go(plan, call, wait)   # a run that raises keeps no plan
  CACHE.plans[call] = plan
  sch.plan = plan if sch.peak <= ARENA_HELD else weakref.ref(plan)
  return pending

def _go(plan: Plan, call, wait: bool) -> Pending | None:
  """Run a plan whose lock the caller holds: released when the run is over, or handed to the Pending of a run left
  going."""
  try: posted = plan.run(wait)
  except BaseException: plan.lock.release(); raise
  if posted is None: plan.lock.release(); return None
  return Pending(posted, plan, call)

def _arrays(sch: _Sched, bufs, inner, storage) -> list:
  """(BUFFER node, storage array) of each of the schedule's roots for this CALL: written buffers are allocated on demand
  (no zero-fill when a kernel writes all of it first), read-only ones must exist."""
  out = []
  for r, written, zero in sch.roots:
    b = bufs[r[1]] if r[0] == "arg" else inner[r[1]]
    if (a := storage.get(b.arg.uid)) is None: a = buffer_array(storage, b, written, zero=zero)
    if a.size != (n := elements(b)) or a.dtype != b.dtype.np or a.ndim != 1:   # per-device storage: every device's copy, device-major
      raise CallsatError(f"BUFFER uid={b.arg.uid}: storage holds {a.dtype}{a.shape}, the node says {b.dtype.name}({n},)")
    out.append((b, a))
  return out

def _schedule(call, checked: bool, CACHE) -> tuple:
  """(the CALL's BUFFER nodes, its schedule entry), kernelized on a miss."""
  bind, bufs, key = binding_key(call, checked)
  if (sch := CACHE.schedules.get(key)) is None:
    if bind is None: bind, _ = arg_binding(call)
    sch = _Sched(kernelize(call.src[0], bind), checked)
    CACHE.schedules.put(key, sch, sch.nbytes)
  return bufs, sch

def prepare(call) -> tuple[int, frozenset]:
  """Kernelize and compile a CALL without running it (a lowering error surfaces here, not at its first run): the
  number of its kernels, and the uids of the argument BUFFERs it writes only in part (run_native zero-fills those when
  it allocates them: a caller binding memory of its own for a fresh one must zero it)."""
  bufs, sch = _schedule(call, check_bounds(), cache.CACHE)
  cache.CACHE.get(sch.kernels, sch.keys)
  return len(sch.kernels), frozenset(bufs[r[1]].arg.uid for r, written, zero in sch.roots if r[0] == "arg" and written and zero)

def written_args(call) -> frozenset:
  """The uids of the argument BUFFERs a CALL's kernels and copies write (nested bodies' writes through their arguments
  included: the schedule's), kernelized if it was not."""
  bufs, sch = _schedule(call, check_bounds(), cache.CACHE)
  return frozenset(bufs[r[1]].arg.uid for r, written, _ in sch.roots if r[0] == "arg" and written)

class NativeBackend(Backend):
  """The CPU device kind (CPU:n shards too) and host-only CALLs (NPY, DISK): LLVM-compiled kernels on this machine."""
  name, devices, rank = "native", ("CPU", "NPY", "DISK"), 0
  def run(self, call, storage, wait: bool = True) -> Pending | None: return run_native(call, storage, wait)

