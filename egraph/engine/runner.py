"""Running the e-graph: an egglog EGraph wrapped with phases, limits checked between bounded steps, and stop reasons.

egglog runs cannot be interrupted, so the optimize phase runs one iteration per step and the limits are checked
between steps (`check_limits`, which also records the size reached). The load and materialize phases take a fixed
number of iterations whatever the graph and leave a valid (all-materialized) CALL behind for extraction; they are not
limited, but a Runner given an `abort_at` time raises OutOfBudget between them, and between optimize steps, once it
has passed (callify then builds the all-materialized CALL without the e-graph). A `reserve` keeps time for what
follows the run: the time limit stops optimizing `reserve(size)` seconds early.

Two modes share the rule definitions:
- saturation (the default): pure unions, materialize then optimize; the result does not depend on rule order;
- ordered (`Schedule(ordered=(rule names...))`): the phase-ordering model of a pattern-matcher pipeline. Every rule is
  its own ruleset and is applied destructively (`Rule.egglog(destructive=True)` subsumes the matched term, so later
  rules cannot match it), one rule after the other to saturation, the whole sequence repeated to a fixpoint. The
  materialize rules take part in the sequence: placing `materialize_contiguous` before `contiguous_to_view` stores a
  view instead of folding it. After the fixpoint each realize point also gets its all-materialized form as a dominated
  fallback (a store costs more than any rule outcome), so extraction and the report's baseline are always defined.

The bad-merge canary (`Schedule(canary=True)` or env `CALLSAT_CANARY=1`) checks, after the materialize phase and
after every optimize step, that no e-class holds two shapes, two dtypes or two different constants, and raises an
EngineError naming the rules that fired since the last clean check.

A Runner given a StepHook (what `callsat explain` uses) applies the same rules one at a time, each as its own
ruleset, and calls the hook after loading and after every step that matched; the rules are pure unions, so it
reaches the same fixpoint as the phased run."""
from __future__ import annotations
import contextlib, functools, os, shutil, tempfile, threading, time, weakref
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Protocol
import egglog.bindings as eb
from egraph.ir.errors import EngineError, CallsatError
from egraph.engine.language import program
from rules.vocabulary import EXTRACTABLE as CONSTRUCTORS
from rules.orders import REFERENCE_ORDER, MATERIALIZE_FIRST
from rules.registry import RULES

class OutOfBudget(Exception):
  """Raised between bounded steps (saturation, extraction, building the CALL) past the caller's `abort_at` time."""
  def __init__(self, where: str):
    super().__init__(f"out of time budget {where}")
    self.where, self.stats = where, None   # stats: the RunStats of the saturation it stopped, if it stopped one

def checkpoint(abort_at: float, where: str) -> None:
  """Raise OutOfBudget if time.perf_counter() is past `abort_at`."""
  if time.perf_counter() > abort_at: raise OutOfBudget(where)

class StopReason(str, Enum):
  """Why the optimize phase stopped (egg's StopReason); compares equal to its value string."""
  SATURATED = "saturated"
  NODE_LIMIT = "node_limit"
  ITERATION_LIMIT = "iteration_limit"
  TIME_LIMIT = "time_limit"
  def __str__(self) -> str: return self.value

# one optimize iteration: the optimize rules, then the materialize rules again (a merge made by an optimize rule can give
# them new matches, e.g. a CONTIGUOUS whose source became storage once DETACH/CONTIGUOUS_BACKWARD was dropped)
OPTIMIZE_STEP = "(seq (run optimize) (run materialize))"

@dataclass(frozen=True)
class Limits:
  """Bounds on a run: e-nodes in the graph, optimize iterations, wall-clock seconds. callify spends `seconds` after
  encoding on saturating, extracting and building the CALL, and builds the all-materialized CALL straight from the
  encoding when that will not fit (or when loading alone would pass `nodes`)."""
  nodes: int = 2_000_000
  iterations: int = 1_000
  seconds: float = 60.0

LIMIT_PRESETS = {"default": Limits(), "small": Limits(nodes=50_000, iterations=20, seconds=5.0),
                 "none": Limits(nodes=10**12, iterations=10**9, seconds=float("inf"))}

@dataclass(frozen=True)
class Schedule:
  """Which optimize rules run and how many iterations at most ('saturate' = until nothing changes or a limit).
  With `ordered`, the named rules (any phase) run destructively in that sequence, repeated to a fixpoint (or
  `max_iterations` rounds): the pattern-matcher model. `canary` checks e-class consistency after every step."""
  name: str = "saturate"
  rules: tuple[str, ...] | None = None     # optimize rule names; None = all of them
  max_iterations: int | None = None        # None = saturate (ordered: rounds of the whole sequence)
  ordered: tuple[str, ...] | None = None   # ordered, destructive mode: rule names in application order
  canary: bool = False                     # bad-merge canary after every step (also env CALLSAT_CANARY=1)

SCHEDULE_PRESETS = {"saturate": Schedule(), "baseline": Schedule("baseline", rules=()), "once": Schedule("once", max_iterations=1),
                    "reference": Schedule("reference", ordered=REFERENCE_ORDER),
                    "materialize_first": Schedule("materialize_first", ordered=MATERIALIZE_FIRST)}

def ordered_schedule(order, name: str | None = None, **kw) -> Schedule:
  """A Schedule for the ordered, destructive mode over `order` (rule names)."""
  order = tuple(order)
  return Schedule(name or "ordered:" + ",".join(order), ordered=order, **kw)

def resolve(value, presets: dict, kind: str):
  if value is None: return presets[next(iter(presets))]
  if isinstance(value, str):
    if value not in presets: raise CallsatError(f"unknown {kind} preset {value!r}; choose one of {sorted(presets)}")
    return presets[value]
  return value

def guarded(what: str, fn, *args):
  """Call into egglog; a Rust panic (pyo3 PanicException is a BaseException) becomes an EngineError saying what failed."""
  try: return fn(*args)
  except (KeyboardInterrupt, SystemExit): raise
  except BaseException as e:
    if isinstance(e, CallsatError): raise
    raise EngineError(f"egglog failed while {what}: {type(e).__name__}: {e}") from e

@dataclass
class RunStats:
  iterations: int = 0
  matches: dict[str, int] = field(default_factory=dict)
  stop_reason: StopReason = StopReason.SATURATED
  rounds: dict[str, int] = field(default_factory=dict)   # rounds per phase the rewrite loop ran (materialize: stepwise only)
  seconds: dict[str, float] = field(default_factory=dict)
  trace: list[tuple[int, str, int]] = field(default_factory=list)   # (step, rule, matches): one entry per rule that fired per step
  canary_checks: int = 0
  size: int = 0      # e-nodes at the last limit check: where the run stopped

# ordered mode: the CONTIGUOUS/AFTER each realize point starts from, captured before any destructive rule runs, and the
# fallback that adds its all-materialized form at the end
ORDERED_EXTRA = """
(relation fallback_of (T T T))
(ruleset capture)
(ruleset fallback)
(rule ((= c (U "CONTIGUOUS" a x)) (fresh c f)) ((fallback_of c f x)) :ruleset capture :name "capture_contiguous")
(rule ((= u (B "AFTER" a t (B "STORE" s t2 v))) (fresh u f)) ((fallback_of u f v)) :ruleset capture :name "capture_assign")
(rule ((fallback_of c f x)) ((union c (B "AFTER" 0 f (B "STORE" 0 f x)))) :ruleset fallback :name "materialized_fallback")
"""

def ordered_ruleset(name: str) -> str: return "o_" + name

def ordered_rule_text(name: str) -> str: return RULES[name].egglog(ruleset=ordered_ruleset(name), destructive=True)

STEP_PREFIX = "step__"   # stepwise mode: each rule's own ruleset and rule name

def declarations(schedule: Schedule, stepwise: bool = False) -> str:
  """The egglog text that declares the language and the rules `schedule` runs (what a Runner starts with); made once
  per schedule and rule set (the research kit swaps rules in and out of RULES)."""
  return _declarations(schedule, stepwise, tuple(RULES.values()))

@functools.lru_cache(maxsize=64)
def _declarations(schedule: Schedule, stepwise: bool, rules: tuple) -> str:
  if schedule.ordered is not None:
    text = [program([]), ORDERED_EXTRA]
    for n in dict.fromkeys(schedule.ordered): text += [f"(ruleset {ordered_ruleset(n)})", ordered_rule_text(n)]
    return "\n".join(text)
  if stepwise:
    text = [program([r for r in RULES.values() if r.phase == "load"])]
    for n in dict.fromkeys(n for _, names in stepwise_phases(schedule) for n in names):   # a materialize rule runs in both
      text += [f"(ruleset {STEP_PREFIX}{n})", RULES[n].egglog(ruleset=STEP_PREFIX + n, name=STEP_PREFIX + n)]
    return "\n".join(text)
  return program([r for r in RULES.values() if r.phase != "optimize" or schedule.rules is None or r.name in schedule.rules])

def stepwise_phases(schedule: Schedule) -> list[tuple[str, list[str]]]:
  """The stepwise mode's phases and their rules, in the phased run's order (an optimize round also re-runs the
  materialize rules, as OPTIMIZE_STEP does)."""
  mat = [r.name for r in RULES.values() if r.phase == "materialize"]
  opt = [r.name for r in RULES.values() if r.phase == "optimize" and (schedule.rules is None or r.name in schedule.rules)]
  return [("materialize", mat), ("optimize", opt + mat)]

def canary_enabled(schedule: Schedule) -> bool:
  return schedule.canary or os.environ.get("CALLSAT_CANARY", "") not in ("", "0")

class StepHook(Protocol):
  """Observes a stepwise run: `loaded` once the graph is in, `step` after every rule step that matched."""
  def loaded(self, runner: "Runner") -> None: ...
  def step(self, phase: str, rnd: int, rule: str, matches: int) -> None: ...

_SCRATCH = threading.local()

# rows go through memory where the system has a tmpfs: a rewritten file on a disk filesystem can be flushed on close
# (ext4 does so for a file truncated and rewritten), measured 3.5 ms a load on a busy machine against 0.07 in /dev/shm
_MEMORY_FS = "/dev/shm"

def _scratch_parent() -> str | None:
  return _MEMORY_FS if os.path.isdir(_MEMORY_FS) and os.access(_MEMORY_FS, os.W_OK | os.X_OK) else None

class _Folder:
  """A temporary folder removed when this object goes (its thread ends) or the process exits."""
  def __init__(self):
    self.path = tempfile.mkdtemp(prefix="callsat-", dir=_scratch_parent())
    weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)   # finalize also runs at exit

def _scratch() -> str:
  """This thread's folder for the rows egglog reads (`input` takes files): made once, its files rewritten by each load
  (a folder made and removed per callify cost ~1 ms)."""
  if (f := getattr(_SCRATCH, "folder", None)) is None or not os.path.isdir(f.path): f = _SCRATCH.folder = _Folder()
  return f.path

class DeclaredPool:
  """egglog e-graphs with the callify language declared, by declaration text: declaring costs 10-15 ms, which every
  callify of a tiny graph paid. A Runner takes one (`take`), `(push)`es, and gives it back after `(pop)` (`give`).
  Per thread: an egglog EGraph must live and die on the thread that made it; at most `keep` wait per text."""
  def __init__(self, keep: int = 2):
    self.keep, self._local = keep, threading.local()

  def _free(self) -> dict:
    if (f := getattr(self._local, "free", None)) is None: f = self._local.free = {}
    return f

  def take(self, text: str, what: str):
    if free := self._free().get(text): return free.pop()
    g = eb.EGraph()
    guarded(what, lambda: g.run_program(*g.parse_program(text)))
    return g

  def give(self, text: str, g) -> None:
    try: g.run_program(*g.parse_program("(pop)"))
    except Exception: return   # never pooled in an unknown state (or from another thread): it is dropped
    free = self._free().setdefault(text, [])
    if len(free) < self.keep: free.append(g)

  def waiting(self) -> dict[str, int]:
    """This thread's idle e-graphs per declaration text."""
    return {t: len(v) for t, v in self._free().items()}

DECLARED = DeclaredPool()

# ---- scheduling policies (egg's RewriteScheduler): what one round of a phase runs; Runner._rounds owns the loop -------

@dataclass(frozen=True)
class Step:
  """One egglog command of a round: `what` it does (for errors), the `rule` a stepwise hook is told of, and where a
  canary check follows it (None: no check)."""
  command: str
  what: str
  rule: str | None = None
  canary: str | None = None

def _matches(outs, rule: str) -> int:
  return sum(o.report.num_matches_per_rule.get(rule, 0) for o in outs if isinstance(o, eb.RunScheduleOutput))

class RewriteScheduler:
  """A phase's rounds: `round(phase, k)` gives round k's steps ([] = nothing to run); `finish` runs once after the
  loop. `check_each_step`: limits are checked before every step, not only before every round."""
  check_each_step = False
  def __init__(self, schedule: Schedule): self.schedule = schedule
  def round(self, phase: str, k: int) -> list[Step]: raise NotImplementedError
  def finish(self, runner: "Runner") -> None: pass

class Saturating(RewriteScheduler):
  """Every optimize rule once per iteration (then the materialize rules again), until nothing changes."""
  def round(self, phase, k):
    if self.schedule.rules == (): return []
    return [Step(f"(run-schedule {OPTIMIZE_STEP})", "running the optimize phase", canary=f"optimize iteration {k}")]

class Ordered(RewriteScheduler):
  """The pattern-matcher model: each rule of the sequence run destructively to saturation in turn; rounds repeat until
  one changes nothing. The captured all-materialized fallbacks are added at the end."""
  check_each_step = True
  def round(self, phase, k):
    return [Step(f"(run-schedule (saturate (run {ordered_ruleset(n)})))", f"running rule {n} (ordered mode)",
                 canary=f"rule {n} in round {k}") for n in self.schedule.ordered]
  def finish(self, runner):
    for o in runner.command("(run-schedule (saturate (run fallback)))", "adding the materialized fallbacks"): runner._count(o)

class Stepwise(RewriteScheduler):
  """Every rule of the phase applied once, each its own step a hook sees (explain); the materialize phase runs the
  same way, without limits."""
  def __init__(self, schedule: Schedule):
    super().__init__(schedule)
    self.names = dict(stepwise_phases(schedule))
  def round(self, phase, k):
    return [Step(f"(run {STEP_PREFIX}{n} 1)", f"running rule {n} (stepwise)", rule=n) for n in self.names[phase]]

class Runner:
  """One egglog e-graph holding an encoded graph; runs the phases under limits (one `check_limits()` decides stops)."""
  def __init__(self, schedule: Schedule, hook: StepHook | None = None, abort_at: float = float("inf"),
               reserve: Callable[[int], float] | None = None, clock: float | None = None):
    """With a `hook` the run is stepwise: one rule at a time, the hook told of every step. Past `abort_at` (a
    time.perf_counter() value) the next step boundary raises OutOfBudget; `reserve(e-nodes)` is the time kept for
    what follows the run (the time limit stops optimizing that much earlier). The time limit counts from `clock`
    (default: now)."""
    self.schedule, self.stats, self.hook, stepwise = schedule, RunStats(), hook, hook is not None
    self.clock = time.perf_counter() if clock is None else clock   # the time budget runs from here: load and materialize count
    self.abort_at, self.reserve = abort_at, reserve
    self.stepwise = stepwise
    self.encoding = None                   # the Encoding loaded (gives the canary shapes and dtypes); see load()
    self.canary = canary_enabled(schedule)
    self._since: dict[str, int] = {}       # matches per rule since the last clean canary check
    named = set(schedule.rules or ()) | set(schedule.ordered or ())
    unknown = named - set(RULES)
    if unknown: raise CallsatError(f"schedule {schedule.name!r} names unknown rules {sorted(unknown)}")
    if schedule.ordered is not None and schedule.rules is not None:
      raise CallsatError(f"schedule {schedule.name!r}: give either rules or ordered, not both")
    if stepwise and schedule.ordered is not None:
      raise CallsatError(f"explain follows saturation schedules; {schedule.name!r} is ordered (destructive). "
                         "Compare orders with `callsat order` instead")
    if stepwise and schedule.max_iterations is not None:
      raise CallsatError(f"explain runs to saturation; schedule {schedule.name!r} stops after {schedule.max_iterations} iteration(s)")
    self.scheduler = Stepwise(schedule) if stepwise else Ordered(schedule) if schedule.ordered is not None else Saturating(schedule)
    self._decl = declarations(schedule, stepwise)
    self.egraph = DECLARED.take(self._decl, "declaring the callify language"
                                + (" (ordered mode)" if self.ordered else " (stepwise)" if stepwise else ""))
    self.command("(push)", "saving the declared e-graph")   # release() pops back to it for the next Runner

  def release(self) -> None:
    """Done with the e-graph: it goes back to this thread's pool in its declared state (idempotent). A Runner never
    released (one whose Saturation a caller keeps) just lets its e-graph go."""
    g, self.egraph = self.egraph, None
    if g is not None: DECLARED.give(self._decl, g)

  @property
  def ordered(self) -> bool: return self.schedule.ordered is not None

  def command(self, text: str, what: str) -> list:
    """Run egglog commands; a failure becomes an EngineError saying `what` was being done."""
    return guarded(what, lambda: self.egraph.run_program(*self.egraph.parse_program(text)))

  def load(self, rows: dict[str, list[tuple]], encoding=None) -> None:
    """Bulk-load rows with `input` (one TSV file per relation), then lift them into terms. With `encoding` (the
    Encoding the rows come from) the canary also checks shapes and dtypes; without it only constants."""
    if encoding is not None: self.encoding = encoding
    t0 = time.perf_counter()
    tmp = _scratch()
    cmds = []
    for rel, rs in rows.items():
      path = os.path.join(tmp, rel + ".tsv")
      with contextlib.suppress(FileNotFoundError): os.unlink(path)   # a new file, not a truncated one (see _MEMORY_FS)
      with open(path, "w") as f: f.write("".join("\t".join(map(str, r)) + "\n" for r in rs))
      cmds.append(f'(input {rel} "{path}")')
    if cmds: self.command(" ".join(cmds), "reading the inserted rows")
    self.stats.seconds["insert"] = time.perf_counter() - t0
    checkpoint(self.abort_at, "after inserting the rows")
    self._phase("load", "(run-schedule (saturate (run load)))")
    checkpoint(self.abort_at, "after the load phase")
    if self.hook is not None: self.hook.loaded(self)

  def materialize(self) -> None:
    """The all-stored baseline. In ordered mode the materialize rules run inside the sequence instead; this only
    records each realize point's starting form for the fallback."""
    if self.ordered: self._phase("materialize", "(run-schedule (saturate (run capture)))")
    elif self.stepwise: self._rounds("materialize", self.scheduler, None, self.clock)
    else:
      self._phase("materialize", "(run-schedule (saturate (run materialize)))")
      self.check_canary("the materialize phase")
    checkpoint(self.abort_at, "after the materialize phase")

  def _phase(self, name: str, text: str) -> None:
    t0 = time.perf_counter()
    for out in self.command(text, f"running the {name} phase"): self._count(out)
    self.stats.seconds[name] = time.perf_counter() - t0

  def _count(self, out) -> bool:
    if not isinstance(out, eb.RunScheduleOutput): return False
    for rule, n in out.report.num_matches_per_rule.items():
      if rule.startswith(STEP_PREFIX): rule = rule[len(STEP_PREFIX):]
      if rule in RULES and n:
        self.stats.matches[rule] = self.stats.matches.get(rule, 0) + n
        self._since[rule] = self._since.get(rule, 0) + n
        self.stats.trace.append((self.stats.iterations, rule, n))
    return out.report.updated

  def size(self) -> int:
    out = self.command("(print-size)", "counting e-nodes")
    return sum(n for name, n in out[0].sizes if name in CONSTRUCTORS)

  def _cap(self, limits: Limits) -> int:
    return limits.iterations if self.schedule.max_iterations is None else min(limits.iterations, self.schedule.max_iterations)

  def check_limits(self, limits: Limits, t0: float, rounds: int) -> StopReason | None:
    """The one place a run decides to stop early: the limit hit (nodes, iterations, seconds since t0 with the
    reserve kept), or None. Records the size reached; past `abort_at` it raises OutOfBudget instead."""
    checkpoint(self.abort_at, f"after {rounds} optimize step(s)")
    size = self.stats.size = self.size()
    if size > limits.nodes: return StopReason.NODE_LIMIT
    if rounds >= self._cap(limits): return StopReason.ITERATION_LIMIT
    if time.perf_counter() + (self.reserve(size) if self.reserve else 0.0) - t0 > limits.seconds: return StopReason.TIME_LIMIT
    return None

  def optimize(self, limits: Limits) -> None:
    """Run the optimize phase under `limits` with the schedule's policy (saturate, ordered or stepwise). The time limit
    counts from the Runner's clock (its creation by default): loading and the materialize phase spend the same budget."""
    start = time.perf_counter()
    self.stats.stop_reason = self._rounds("optimize", self.scheduler, limits, self.clock)
    self.stats.size = self.size()
    self.stats.seconds["optimize"] = time.perf_counter() - start

  def _rounds(self, phase: str, policy: "RewriteScheduler", limits: Limits | None, t0: float) -> StopReason:
    """The one rewrite loop: rounds of the policy's steps until a round changes nothing or a limit is hit. Limits are
    checked before every round (and before every step where the policy asks); the canary after every step that names
    itself; the hook told of every rule step that matched."""
    rnd, reason = 0, StopReason.SATURATED
    while steps := policy.round(phase, rnd + 1):
      if limits is not None and (hit := self.check_limits(limits, t0, rnd)) is not None: reason = hit; break
      changed = False
      for k, st in enumerate(steps):
        if k and policy.check_each_step and limits is not None and (hit := self.check_limits(limits, t0, 0)) is not None:
          reason = hit; break
        outs = self.command(st.command, st.what)
        changed |= any([self._count(o) for o in outs])
        if st.rule is not None and self.hook is not None and (n := _matches(outs, STEP_PREFIX + st.rule)): self.hook.step(phase, rnd + 1, st.rule, n)
        if st.canary is not None: self.check_canary(st.canary)
      rnd += 1
      if phase == "optimize": self.stats.iterations = rnd
      if reason is not StopReason.SATURATED or not changed: break
    self.stats.rounds[phase] = rnd
    policy.finish(self)
    return reason

  # ---- the bad-merge canary ------------------------------------------------------------------------------------------

  def class_conflicts(self) -> list[str]:
    """E-classes that hold two shapes, two dtypes or two different constants, described. Shapes and dtypes need the
    Encoding (load(..., encoding=)); constants are checked from the e-graph alone."""
    fr = self.freeze()
    fns, eg = fr.functions, self.egraph
    enc = self.encoding
    out = []
    consts: dict = {}
    if "L" in fns:
      for r in fns["L"].rows:
        if r.subsumed or eg.value_to_string(r.inputs[0]) != "CONST": continue
        consts.setdefault(r.output, set()).add(eg.value_to_i64(r.inputs[1]))
    for k, args in consts.items():
      if len(args) > 1:
        vals = sorted(str(enc.args[a]) if enc is not None else f"arg#{a}" for a in args)
        out.append(f"an e-class holds different constants {', '.join(vals)}")
    if enc is None or "N" not in fns: return out
    members: dict = {}
    for r in fns["N"].rows:
      i = eg.value_to_i64(r.inputs[0])
      if i < len(enc.nodes) and (n := enc.nodes[i]) is not None: members.setdefault(r.output, []).append(n)
    for k, ns in members.items():
      sigs = {(n.shape, n.dtype) for n in ns}
      if len(sigs) > 1:
        ex = sorted({f"{n.op.name} {n.dtype.name if n.dtype else None} {n.shape}" for n in ns})
        out.append("an e-class holds " + " and ".join(ex[:4]))
    return out

  def check_canary(self, where: str, force: bool = False) -> None:
    """Raise EngineError if an e-class is inconsistent, naming the rules that fired since the last clean check."""
    if not (self.canary or force): return
    self.stats.canary_checks += 1
    bad = self.class_conflicts()
    if bad:
      rules = ", ".join(f"{r} ({n} matches)" for r, n in sorted(self._since.items())) or "none (the inserted graph itself)"
      raise EngineError(f"bad merge after {where}: {bad[0]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")
                        + f"; rules fired since the last clean check: {rules}")
    self._since.clear()

  def freeze(self): return guarded("reading the e-graph", self.egraph.freeze)
