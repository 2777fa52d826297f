"""The callify run report as plain data: printable and JSON-ready."""
from __future__ import annotations
from dataclasses import dataclass, field, asdict
from egraph.engine.runner import StopReason

@dataclass
class PartitionReport:
  """fusion="cost": how the set of stored intermediates was chosen (egraph/fusion/solve.py), times in model seconds."""
  method: str = ""          # "exhaustive" (every subset, up to fusion.EXHAUSTIVE_MAX candidates) | "milp" (HiGHS on the
                            # linearized model) | "greedy" (local search) | "none (no candidates)";
                            # "(time limit)" / "(stopped at the deadline)" when cut, ", rules-like kept" under the margin
  candidates: int = 0       # candidate classes that had a stored form to choose
  stored: int = 0           # of those, stored
  predicted_s: float | None = 0.0   # the chosen partition's predicted run time; None: nothing costed (no candidates, or out of time)
  fused_s: float | None = 0.0   # nothing stored (every candidate fused into each consumer's kernel); None: not costed in time
  bound_s: float = 0.0      # a lower bound: milp, HiGHS's dual bound on the linearized model (at most the best found)
  gap: float = 0.0          # (predicted - bound) / predicted
  budget_s: float | None = None   # the time the solver was given (callify's remaining Limits.seconds, at most a share of
                                  # callify's time so far: fusion.solver_deadline); None: unlimited
  seconds: float = 0.0      # the solver's own time
  evaluations: int = 0      # kernels costed
  rules_s: float | None = None   # the rules-like partition's predicted time (fusion.rules_like: what lower/'s rules realize)
  mip_gap: float | None = None   # milp: HiGHS's relative gap between its incumbent and dual bound (the linearized model)
  model_gap: float | None = None   # milp: (true cost of the ILP's answer - the ILP's objective) / true cost: the linearization's error
  note: str = ""            # why a method did not run (no scipy, too many candidates, out of time)

  def __str__(self) -> str:
    if self.predicted_s is None: return f"{self.method}" + (f" ({self.note})" if self.note else "")
    budget = f", budget {self.budget_s * 1e3:.1f}ms" if self.budget_s is not None else ""
    rules = f"rules-like {self.rules_s * 1e6:.1f}us, " if self.rules_s is not None else ""
    milp = f", mip gap {self.mip_gap:.1%}, model gap {self.model_gap:+.1%}" if self.mip_gap is not None and self.model_gap is not None else ""
    return (f"{self.method}: {self.stored}/{self.candidates} stored, predicted {self.predicted_s * 1e6:.1f}us "
            f"({rules}all fused {'-' if self.fused_s is None else f'{self.fused_s * 1e6:.1f}us'}, "
            f"bound {self.bound_s * 1e6:.1f}us, gap {self.gap:.1%}{milp}), "
            f"{self.evaluations} kernels costed in {self.seconds * 1e3:.1f}ms{budget}" + (f"; {self.note}" if self.note else ""))

@dataclass
class CallifyReport:
  e_nodes: int = 0
  e_classes: int = 0
  iterations: int = 0
  matches: dict[str, int] = field(default_factory=dict)
  stop_reason: StopReason = StopReason.SATURATED
  stop_nodes: int = 0       # e-nodes when the e-graph stopped growing (what the node limit compares); 0: never built
  fallback: str | None = None   # why the CALL was built straight from the encoding, all-materialized (no e-graph)
  settled: str = ""         # why no e-graph was needed: no optimize rule could match, the all-stored form is the CALL
  cost: int = 0
  baseline_cost: int = 0
  cost_model: str = "bytes"
  schedule: str = "saturate"
  graph_nodes: int = 0
  realize_points: int = 0
  buffers: int = 0          # fresh buffers in the CALL
  temps: int = 0            # of them, scratch (CallInfo.temps): cost mode's stored intermediates, read by no tensor
  stores: int = 0
  views: int = 0            # realize points served by a zero-copy view
  seconds: dict[str, float] = field(default_factory=dict)
  cache_hit: bool = False   # the graph matched an earlier one up to its input buffers: nothing was saturated
  fusion: str = "rules"     # who chose the kernel boundaries: "rules" (lower/'s heuristics) or "cost" (the partition)
  partition: PartitionReport | None = None   # fusion="cost": the partition's method, bound and gap
  fusion_note: str = ""     # why cost mode was asked for but the rules ran (no time model for the device, too big to cost)
  certificate: str = ""     # extraction "certify"/"exact": how `cost` stands against the exact ILP (egraph/engine/exact.py)
  exact_cost: int | None = None   # the ILP's DAG cost (None: not solved)
  exact_seconds: float = 0.0      # the ILP's build and solve time (`seconds`' "certify"; not in "extract")
  scalars: dict[int, object] = field(default_factory=dict)   # CALL arg slot -> the Python scalar a 1-element host
                                                              # argument holds (the front end's scalar arguments)
  fresh_uids: set[int] = field(default_factory=set, repr=False)

  def to_dict(self) -> dict:
    d = asdict(self); d.pop("fresh_uids"); return d

  def __str__(self) -> str:
    saved = 1 - self.cost / self.baseline_cost if self.baseline_cost else 0.0
    rules = ", ".join(f"{k}={v}" for k, v in sorted(self.matches.items(), key=lambda kv: -kv[1])) or "none"
    times = " ".join(f"{k}={v*1e3:.1f}ms" for k, v in self.seconds.items())
    return "\n".join([
      f"callify: {self.graph_nodes} graph nodes, {self.realize_points} realize points" + (" (cache hit: reused)" if self.cache_hit else ""),
      f"  e-graph   {self.e_nodes} e-nodes, {self.e_classes} e-classes, {self.iterations} iterations, stop: {self.stop_reason}"
      + (f" at {self.stop_nodes} e-nodes" if self.stop_reason is StopReason.NODE_LIMIT and self.stop_nodes else ""),
      *([f"  fallback  all-materialized CALL built without the e-graph ({self.fallback})"] if self.fallback else []),
      *([f"  settled   all-materialized CALL built without the e-graph ({self.settled})"] if self.settled else []),
      f"  rules     {rules}",
      f"  cost      {self.cost} ({self.cost_model}) vs {self.baseline_cost} all-materialized baseline ({saved:.0%} saved)",
      *([f"  extract   {self.certificate}" + (f" (ILP {self.exact_seconds * 1e3:.0f}ms)" if self.exact_seconds else "")]
        if self.certificate else []),
      f"  CALL      {self.buffers} fresh buffers" + (f" ({self.temps} of them temporaries)" if self.temps else "")
      + f", {self.stores} stores, {self.views} zero-copy views",
      f"  fusion    {self.fusion}" + (f" ({self.fusion_note})" if self.fusion_note else "") + (f": {self.partition}" if self.partition else ""),
      *(["  scalars   " + ", ".join(f"arg{k} = {v!r}" for k, v in self.scalars.items())] if self.scalars else []),
      f"  time      {times} total={sum(self.seconds.values())*1e3:.1f}ms"])
