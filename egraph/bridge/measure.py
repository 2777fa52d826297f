"""The bridge's measured check of cost-mode hints (issue 28): the first time a graph structure gets hints, tinygrad
compiles and runs the hinted and the unhinted CALL on scratch copies of their buffers, interleaved, and the bridge keeps
the faster (the hints only when the median of the rounds' time ratios says they win by more than MARGIN). The decision
is then cached with the structure (egraph/bridge/cache.py) and kept per user (egraph/bridge/verdicts.py), so a wrong
prediction costs one measurement, not a slow step on every call.

The scratch copies make the check side-effect free: every storage BUFFER of both CALLs (inputs, outputs, assign targets)
is replaced by a fresh buffer of the same device, dtype and size, filled with the original's bytes where it holds data
(timing on the program's own values: denormals and NaNs cost what they cost), so an assign is never applied twice and no
live buffer is written. Times are wall clock over the whole schedule (its launches included: more kernels cost a user
their dispatch too); each round runs both, which one first alternating. A graph realized outside a JIT (`eager`) is
timed as an eager call pays it: tinygrad's scheduling and lowering of every kernel (from its caches) with the run, each
round (~0.3 ms a kernel on a CPU: a replay would hide what extra kernels cost there). Off with CALLSAT_BRIDGE_MEASURE=0.

A measured decision waits for its structure's DECIDE_AT-th sighting (CALLSAT_BRIDGE_DECIDE_AT, default 2): before, the
graph gets the plain rules CALL (tinygrad's kernels, as strict bridging gives it). A graph run once (weight init, a
setup step) then never pays a measurement or a second compile, and a first call costs what strict's does; a loop's
graphs are decided at their second run. A graph TinyJit is capturing is decided at once (the capture is replayed for
good, and its graphs need not be the first call's). 1 decides at the first sighting; so does a bridge without its
structural cache (CALLSAT_BRIDGE_CACHE=0: sightings are counted there)."""
from __future__ import annotations
import dataclasses, os, statistics, time
from dataclasses import dataclass
from tinygrad import Context, Device
from tinygrad.uop.ops import UOp, Ops as TOps
from tinygrad.dtype import AddrSpace
import tinygrad.engine.realize as _tg_realize
from tinygrad.engine.realize import ExecContext, compile_linear
from tinygrad.schedule import create_linear_with_vars
from egraph.ir.errors import CallsatError

ENV = "CALLSAT_BRIDGE_MEASURE"
DECIDE_ENV, DECIDE_AT = "CALLSAT_BRIDGE_DECIDE_AT", 2
MARGIN = 0.03         # hints are kept only when measured faster than the unhinted CALL by more than this share
ROUNDS = (5, 41)      # interleaved rounds of both schedules: at least, at most ...
BUDGET_S = 0.3        # ... stopping past this much time spent running them (compiling not counted)

@dataclass(frozen=True)
class Measured:
  """Both schedules' best wall time (s) over `rounds` interleaved rounds, the median of the rounds' hinted/stock ratios
  (each round runs both back to back: drift between rounds cancels), and whether the hints are kept: by the median
  ratio, which one lucky round cannot move, and by the best times, which a burst of load in some rounds cannot (on 2
  busy cores a 5-round check of MNIST's step once kept a schedule 10 % slower by its median ratio alone)."""
  stock_s: float
  hinted_s: float
  rounds: int
  seconds: float   # the whole check: scratch buffers, scheduling, compiling, running
  ratio: float = 1.0

  @property
  def keep(self) -> bool: return self.ratio < 1 - MARGIN and self.hinted_s < self.stock_s * (1 - MARGIN)

  def __str__(self) -> str:
    return (f"measured {self.stock_s * 1e6:.0f} -> {self.hinted_s * 1e6:.0f} us (best of {self.rounds}; median ratio "
            f"{self.ratio:.3f})")

def decide_at() -> int:
  """The sighting of a structure at which its measured decision is made (module docstring), read when asked."""
  v = os.environ.get(DECIDE_ENV, "")
  if v == "": return DECIDE_AT
  if not v.isdigit() or int(v) < 1: raise CallsatError(f"{DECIDE_ENV} must be a sighting count >= 1, got {v!r}")
  return int(v)

def margin() -> float: return MARGIN   # read when asked (a verdict's key names the margin it was decided under)

def _storage(u: UOp) -> bool: return u.op is TOps.BUFFER and u.arg.addrspace is AddrSpace.GLOBAL

def scratch(calls: list[UOp]) -> list[UOp]:
  """`calls` over fresh buffers: one per distinct storage BUFFER (shared by the calls, as the originals are), with the
  original's bytes where it has any. CallsatError for storage a scratch copy cannot stand in for (several devices in one
  buffer, a DISK)."""
  subs: dict = {}
  for c in calls:
    for u in c.toposort():
      if not _storage(u) or u in subs: continue
      if not isinstance(u.device, str) or u.device.startswith("DISK"):
        raise CallsatError(f"cannot measure over a buffer on {u.device}")
      new = subs[u] = UOp(TOps.BUFFER, u.dtype, u.src, dataclasses.replace(u.arg, slot=next(UOp.unique_num)))
      if (old := u.realized) is not None and old.is_initialized():
        new.buffer.ensure_allocated().copy_from(old)
  return [c.substitute(subs) for c in calls]

def _prepare(call: UOp):
  """The compiled schedule of one CALL (never captured by a TinyJit being recorded) and its variable values."""
  with Context(CAPTURING=0):
    linear, var_vals = create_linear_with_vars(call)
    return compile_linear(linear), var_vals

def _run(linear: UOp, var_vals: dict, device: str) -> float:
  ctx = ExecContext(var_vals, update_stats=False)
  t0 = time.perf_counter()
  for c in linear.src: _tg_realize.pm_exec.rewrite(c, ctx)   # read now: the backend's hook runs callsat's Programs
  Device[device].synchronize()
  return time.perf_counter() - t0

def _eager(call: UOp, device: str) -> float:
  t0 = time.perf_counter()
  lin, vv = _prepare(call)
  return time.perf_counter() - t0 + _run(lin, vv, device)

def measure(stock: UOp, hinted: UOp, device: str, eager: bool = False) -> Measured:
  """Run both CALLs' schedules on scratch buffers, interleaved (which goes first alternates), and report the best times;
  `eager`: each run schedules and lowers its CALL again, as a realize outside a JIT does."""
  t0 = time.perf_counter()
  calls = scratch([stock, hinted])
  runs = [_prepare(c) for c in calls]
  for lin, vv in runs: _run(lin, vv, device)   # warm: first-touch allocation, the runtime's own first-call work
  best, spent, ratios = [float("inf")] * 2, 0.0, []
  while len(ratios) < ROUNDS[1] and (len(ratios) < ROUNDS[0] or spent < BUDGET_S):
    t = [0.0, 0.0]
    for i in ((0, 1) if len(ratios) % 2 == 0 else (1, 0)):
      t[i] = _eager(calls[i], device) if eager else _run(*runs[i], device)
      best[i], spent = min(best[i], t[i]), spent + t[i]
    ratios.append(t[1] / t[0])
  return Measured(best[0], best[1], len(ratios), time.perf_counter() - t0, statistics.median(ratios))
