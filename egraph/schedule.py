"""Running the e-graph: an egglog EGraph wrapped with phases, limits checked between bounded steps, and stop reasons.

egglog runs cannot be interrupted, so the optimize phase runs one iteration per step and the limits are checked
between steps. The load and materialize phases are not limited: they take a fixed number of iterations whatever the
graph, and they leave a valid (all-materialized) CALL behind for extraction."""
from __future__ import annotations
import os, shutil, tempfile, time
from dataclasses import dataclass, field
import egglog.bindings as eb
from egraph.errors import EngineError, CallsatError
from egraph.language import program, CONSTRUCTORS
from rules import RULES

STOP_REASONS = ("saturated", "node_limit", "iteration_limit", "time_limit")

@dataclass(frozen=True)
class Limits:
  """Bounds on the optimize phase: e-nodes in the graph, iterations, wall-clock seconds."""
  nodes: int = 2_000_000
  iterations: int = 1_000
  seconds: float = 60.0

LIMIT_PRESETS = {"default": Limits(), "small": Limits(nodes=50_000, iterations=20, seconds=5.0),
                 "none": Limits(nodes=10**12, iterations=10**9, seconds=float("inf"))}

@dataclass(frozen=True)
class Schedule:
  """Which optimize rules run and how many iterations at most ('saturate' = until nothing changes or a limit)."""
  name: str = "saturate"
  rules: tuple[str, ...] | None = None     # optimize rule names; None = all of them
  max_iterations: int | None = None        # None = saturate

SCHEDULE_PRESETS = {"saturate": Schedule(), "baseline": Schedule("baseline", rules=()), "once": Schedule("once", max_iterations=1)}

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
  stop_reason: str = "saturated"
  seconds: dict[str, float] = field(default_factory=dict)

class Runner:
  """One egglog e-graph holding an encoded graph; runs the phases under limits."""
  def __init__(self, schedule: Schedule):
    self.schedule, self.stats = schedule, RunStats()
    rules = [r for r in RULES.values() if r.phase != "optimize" or schedule.rules is None or r.name in schedule.rules]
    unknown = set(schedule.rules or ()) - set(RULES)
    if unknown: raise CallsatError(f"schedule {schedule.name!r} names unknown rules {sorted(unknown)}")
    self.egraph = eb.EGraph()
    self._cmd(program(rules), "declaring the callify language")

  def _cmd(self, text: str, what: str):
    return guarded(what, lambda: self.egraph.run_program(*self.egraph.parse_program(text)))

  def load(self, rows: dict[str, list[tuple]]) -> None:
    """Bulk-load rows with `input` (one TSV file per relation), then lift them into terms."""
    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="callsat-")
    try:
      cmds = []
      for rel, rs in rows.items():
        path = os.path.join(tmp, rel + ".tsv")
        with open(path, "w") as f: f.write("".join("\t".join(map(str, r)) + "\n" for r in rs))
        cmds.append(f'(input {rel} "{path}")')
      if cmds: self._cmd(" ".join(cmds), "reading the inserted rows")
    finally: shutil.rmtree(tmp, ignore_errors=True)
    self.stats.seconds["insert"] = time.perf_counter() - t0
    self._phase("load", "(run-schedule (saturate (run load)))")

  def materialize(self) -> None: self._phase("materialize", "(run-schedule (saturate (run materialize)))")

  def _phase(self, name: str, text: str) -> None:
    t0 = time.perf_counter()
    for out in self._cmd(text, f"running the {name} phase"): self._count(out)
    self.stats.seconds[name] = time.perf_counter() - t0

  def _count(self, out) -> bool:
    if not isinstance(out, eb.RunScheduleOutput): return False
    for rule, n in out.report.num_matches_per_rule.items():
      if rule in RULES and n: self.stats.matches[rule] = self.stats.matches.get(rule, 0) + n
    return out.report.updated

  def size(self) -> int:
    out = self._cmd("(print-size)", "counting e-nodes")
    return sum(n for name, n in out[0].sizes if name in CONSTRUCTORS)

  def optimize(self, limits: Limits) -> None:
    """Run the optimize rules one iteration at a time until saturated or a limit is hit."""
    t0 = time.perf_counter()
    cap = limits.iterations if self.schedule.max_iterations is None else min(limits.iterations, self.schedule.max_iterations)
    reason = "saturated"
    while self.schedule.rules != ():
      if self.size() > limits.nodes: reason = "node_limit"; break
      if self.stats.iterations >= cap: reason = "iteration_limit"; break
      if time.perf_counter() - t0 > limits.seconds: reason = "time_limit"; break
      changed = any([self._count(o) for o in self._cmd("(run optimize 1)", "running the optimize phase")])
      self.stats.iterations += 1
      if not changed: break
    self.stats.stop_reason = reason
    self.stats.seconds["optimize"] = time.perf_counter() - t0

  def freeze(self): return guarded("reading the e-graph", self.egraph.freeze)
