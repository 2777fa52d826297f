"""Why did a realized tensor end up where it is? `explain(*tensors)` re-runs callify's phases on the encoded graph one
rule at a time, records which rules changed each realize point's e-class (new members, merged classes, new facts), then
extracts exactly as callify does and reports, per realize point: what it became (a zero-copy view, a fresh buffer, an
alias of an assigned buffer, a buffer shared with another realize point), the rules that fired on its e-class, its
e-class members with their costs, and the costs that decided extraction.

Provenance comes from snapshots: after every rule step that matched, the e-graph is frozen and each realize class's
members (op, arg id), inserted handles `(N id)` and facts are compared with the previous snapshot. The rules are pure
unions, so applying them one at a time reaches the same fixpoint as callify's phased saturation (the e-graph sizes
agree; tests check it). Only saturation schedules are explained (`rules` subsets included); the ordered, destructive
mode is compared with saturation by `callsat order`."""
from __future__ import annotations
import re, time
from collections import Counter
from dataclasses import dataclass, field, asdict
from egraph.ir.ops import Node, Ops, GroupOp, toposort
from egraph.ir.errors import CallsatError
from egraph.engine.encode import encode, COMPUTED_TARGET
from egraph.engine.runner import Runner, Schedule, Limits, SCHEDULE_PRESETS, StopReason, resolve, stepwise_phases
from egraph.engine.cost import CostModel, COST_PRESETS
from egraph.engine.extract import EGraphView, knuth, baseline_cost
from rules.vocabulary import EXTRACTABLE as CONSTRUCTORS, FACTS
from egraph.engine.driver import Saturation, Extraction, saturate, extract_call, storage_view, roots_of
from egraph.fusion.solve import fusion_mode, cost_plan
from egraph.fusion.candidates import add_candidates
from rules.registry import RULES

KINDS = ("view", "fresh", "alias", "shared", "existing")

@dataclass
class RuleEvent:
  """One rule step that changed a realize point's e-class."""
  phase: str
  round: int
  rule: str
  matches: int                                   # matches of the rule in that step (whole e-graph)
  added: list[str] = field(default_factory=list)    # e-node kinds new in the class ("AFTER", "RESHAPE (1, 4)")
  merged: list[str] = field(default_factory=list)   # inserted nodes whose class was merged into this one
  facts: list[str] = field(default_factory=list)    # facts newly true of the class ("storage")

@dataclass
class Member:
  """One e-node of a realize point's e-class."""
  enode: int
  op: str
  arg: str
  children: list[str]            # child classes as "c<k> OP shape"
  local_cost: int | None         # None: unextractable
  tree_cost: int | None          # local + best of each child; None when it cannot be chosen
  introduced_by: str             # "inserted" or the rule whose step first put such an e-node in the class
  status: str                    # "chosen", "alternative", or why it cannot be chosen

@dataclass
class PointExplanation:
  index: int                     # position among the realize points ("#index")
  names: list[str]               # labels it answers to: "#i", output labels ("out0", user labels)
  node: str                      # the original node: op, dtype, shape
  e_class: int
  kind: str                      # one of KINDS
  summary: str                   # one sentence: what it became and why
  storage: str                   # the buffer_map value (storage view) of the extracted term
  buffer: str                    # "buf<uid>" of the storage it lives in
  shared_with: list[str]         # other realize points living in the same buffer
  decided_by: str                # the rule (or "inserted") that put the chosen e-node in the class
  chosen_cost: int               # tree cost of the chosen e-node
  alternative: str | None        # the cheapest other extractable member ("OP by RULE") ...
  alternative_cost: int | None   # ... and its tree cost
  materialized_cost: int | None  # tree cost of the all-materialized form (a STORE into this point's fresh buffer)
  rules: list[str]               # rules that changed this class, in firing order (no repeats)
  matching: list[str]            # rules whose left side matches this class at the fixpoint (checked by egglog)
  events: list[RuleEvent]
  members: list[Member]

  def __str__(self) -> str:
    alt = (f"; cheapest alternative {self.alternative} costs {self.alternative_cost}" if self.alternative else
           "; no extractable alternative")
    mat = f"; all-materialized form {self.materialized_cost}" if self.materialized_cost is not None else ""
    lines = [f"{'/'.join(self.names)}: {self.node}  [e-class c{self.e_class}]",
             f"  => {self.kind}: {self.summary}",
             f"  storage   {self.storage}" + (f"  (shared with {', '.join(self.shared_with)})" if self.shared_with else ""),
             f"  decided   by {self.decided_by}: chosen costs {self.chosen_cost}{alt}{mat}",
             "  rules     " + (", ".join(self.rules) or "none changed this e-class")
             + (f"   (left sides matching at the fixpoint: {', '.join(self.matching)})" if self.matching else "")]
    for ev in self.events:
      what = [*(f"+{a}" for a in ev.added), *(f"merged {m}" for m in ev.merged), *(f"fact {f}" for f in ev.facts)]
      lines.append(f"    {ev.phase} round {ev.round}: {ev.rule} ({ev.matches} matches): {'; '.join(what)}")
    lines.append("  members (tree cost = own cost + cheapest form of each child class)")
    w = max(len(f"{m.op} {m.arg}") for m in self.members) if self.members else 0
    for m in sorted(self.members, key=lambda m: (m.status != "chosen", m.tree_cost is None, m.tree_cost or 0)):
      mark = "*" if m.status == "chosen" else " "
      cost = f"local {'-' if m.local_cost is None else m.local_cost:>6} tree {'-' if m.tree_cost is None else m.tree_cost:>8}"
      lines.append(f"   {mark} {f'{m.op} {m.arg}':<{w}}  {cost}  via {m.introduced_by:<24} {m.status}"
                   + (f"  <- {', '.join(m.children)}" if m.children else ""))
    return "\n".join(lines)

@dataclass
class Explanation:
  points: list[PointExplanation]
  cost: int                      # the extracted CALL's cost (each shared e-class once), as callify's report
  baseline_cost: int             # the all-materialized CALL's cost
  cost_model: str
  schedule: str
  e_nodes: int
  e_classes: int
  matches: dict[str, int]        # total matches per rule over the rule-at-a-time run
  rounds: dict[str, int]         # rounds per phase until nothing changed
  stop_reason: StopReason
  seconds: float

  def point(self, name) -> PointExplanation:
    """A realize point by output index (int or "out0"), user label, or realize index ("#2")."""
    key = f"out{name}" if isinstance(name, int) else str(name)
    for p in self.points:
      if key in p.names: return p
    names = [n for p in self.points for n in p.names]
    raise CallsatError(f"explain: no realize point named {name!r}; the realize points are {', '.join(names)} "
                       "(an output that is already storage, e.g. a realized input, is not a realize point)")

  def select(self, names) -> "Explanation":
    """The same explanation restricted to the named points (None or empty: all)."""
    if not names: return self
    picked = list(dict.fromkeys(id(p) for p in (self.point(n) for n in names)))
    return Explanation(**{**self.__dict__, "points": [p for p in self.points if id(p) in picked]})

  def to_dict(self) -> dict: return asdict(self)

  def __str__(self) -> str:
    saved = 1 - self.cost / self.baseline_cost if self.baseline_cost else 0.0
    head = [f"explain: {len(self.points)} realize point(s); schedule {self.schedule}, cost model {self.cost_model}",
            f"  e-graph {self.e_nodes} e-nodes, {self.e_classes} e-classes; rounds " +
            ", ".join(f"{k} {v}" for k, v in self.rounds.items()) + f"; stop: {self.stop_reason}",
            f"  CALL cost {self.cost} vs {self.baseline_cost} all-materialized baseline ({saved:.0%} saved)",
            "  kinds: view = zero-copy SLICE of existing storage; fresh = a new buffer written by a STORE; "
            "alias = the assigned buffer itself; shared = a buffer minted for another realize point"]
    return "\n\n".join(["\n".join(head), *(str(p) for p in self.points)])

# ---- provenance: what each rule step changed in the realize classes -------------------------------------------------

class _Snapshots:
  """Members (op, arg id) counts, inserted handles and facts of each tracked e-class, read from a frozen e-graph."""
  def __init__(self, runner: Runner, tracked: list[int]):
    self.runner, self.tracked, self._strs = runner, tracked, {}

  def take(self) -> dict[int, tuple[Counter, frozenset, Counter]]:
    eg = self.runner.egraph
    fns = self.runner.freeze().functions
    i64 = eg.value_to_i64
    def s(v):
      if (r := self._strs.get(v)) is None: r = self._strs[v] = eg.value_to_string(v)
      return r
    handles: dict = {}
    val = {}
    for r in fns["N"].rows:
      i = i64(r.inputs[0]); val[i] = r.output; handles.setdefault(r.output, set()).add(i)
    want = {val[t] for t in self.tracked}
    members = {v: Counter() for v in want}
    facts = {v: Counter() for v in want}
    low = {v: min(h) for v, h in handles.items()}
    for name in CONSTRUCTORS:
      if name not in fns: continue
      for r in fns[name].rows:
        if r.subsumed or r.output not in want: continue
        kids = r.inputs if name in ("Cons", "Nil") else r.inputs[2:]
        key = ((name, 0) if name in ("Cons", "Nil") else (s(r.inputs[0]), i64(r.inputs[1]))) + (tuple(low.get(k, -1) for k in kids),)
        members[r.output][key] += 1
    for name in FACTS:
      if name not in fns: continue
      for r in fns[name].rows:
        if r.inputs and r.inputs[0] in want: facts[r.inputs[0]][name] += 1
    return {t: (members[val[t]], frozenset(handles[val[t]]), facts[val[t]]) for t in self.tracked}

def _describe_node(n: Node | None) -> str:
  if n is None: return "(list)"
  dt = n.dtype.name if n.dtype is not None else "-"
  return f"{n.op.name} {dt} {n.shape}" if n.shape is not None else f"{n.op.name} {dt}"

def arg_text(enc, op: str, arg_id: int) -> str:
  if op in ("Cons", "Nil"): return ""
  _, arg = enc.args[arg_id]
  if arg is None: return ""
  if op == "BUFFER": return f"buf{arg.uid}[{arg.size}]"
  if arg == COMPUTED_TARGET: return "(into a computed value)"
  if op in ("CALL", "FUNCTION"): return "(call)"
  t = repr(arg)
  return t if len(t) <= 40 else t[:37] + "..."

def _chain_has_slice(t: Node) -> bool:
  if t.op is Ops.AFTER: return False
  while True:
    if t.op is Ops.SLICE: return True
    if not t.src or t.op not in GroupOp.Movement: return False
    t = t.src[0]

def _buffer_of(sv: Node) -> Node:
  while sv.op not in (Ops.BUFFER, Ops.PARAM): sv = sv.src[0]
  return sv

class _Provenance:
  """The stepwise runner's hook (a StepHook): after every rule step that matched, the realize classes are compared with the last
  snapshot and the differences recorded as events; the first rule that put each member kind in a class is kept."""
  def __init__(self, enc, tracked: list[int]):
    self.enc, self.tracked, self.snaps = enc, tracked, None
    self.events: dict[int, list[RuleEvent]] = {t: [] for t in tracked}
    self.first: dict[int, dict[tuple, str]] = {t: {} for t in tracked}   # (op, arg, child handles) and (op, arg) -> rule

  def loaded(self, runner: Runner) -> None:
    self.snaps = _Snapshots(runner, self.tracked)
    self.snap = self.snaps.take()
    for t in self.tracked:
      for m in self.snap[t][0]: self.first[t].setdefault(m, "inserted"); self.first[t].setdefault(m[:2], "inserted")

  def step(self, phase: str, rnd: int, name: str, n: int) -> None:
    new = self.snaps.take()
    for t in self.tracked:
      (m0, h0, f0), (m1, h1, f1) = self.snap[t], new[t]
      added, merged, facts = m1 - m0, sorted(h1 - h0), f1 - f0
      if not (added or merged or facts): continue
      for m in added: self.first[t].setdefault(m, name); self.first[t].setdefault(m[:2], name)
      self.events[t].append(RuleEvent(phase, rnd, name, n, [f"{op} {arg_text(self.enc, op, a)}".strip() for op, a, _ in added],
                                      [f"#{i} {_describe_node(self.enc.nodes[i])}" for i in merged], sorted(facts)))
    self.snap = new

def _point_names(enc, roots: list[Node], labels: list[str]) -> list[list[str]]:
  """Per realize point: "#j", then "out<i>" and the user label of every output it serves."""
  names: list[list[str]] = [[f"#{j}"] for j in range(len(enc.keys))]
  index = {k.id: j for j, k in enumerate(enc.keys)}
  for i, (lab, r) in enumerate(zip(labels, roots)):
    for cand in (r, r.base):
      if cand.id in index:
        for nm in (f"out{i}", lab):
          if nm not in names[index[cand.id]]: names[index[cand.id]].append(nm)
        break
  return names

def _status(g: EGraphView, e: int, k: int, chosen: bool, costs, allowed, pinned: bool, tree) -> str:
  """Why a member of class k was or was not extracted."""
  op = g.op[e]
  if chosen: return "chosen"
  if costs[e] is None:
    return ("unextractable: a CONTIGUOUS marker (its value must be stored, viewed or merged)" if op == "CONTIGUOUS"
            else "unextractable: an AFTER into a computed value" if op == "AFTER"
            else "unextractable: only the CALL form of a precompiled FUNCTION runs")
  if not allowed[e]:
    return ("not allowed: an assign must be extracted as a write into its own target" if pinned
            else "not allowed: a realized value must be a storage form (a write, a view, a buffer)")
  return "no extractable children" if tree is None else "alternative"

class _Decision:
  """Reads one extraction's decision off the realize classes: members with costs, the buffer each point lives in."""
  def __init__(self, sat: Saturation, ex: Extraction, prov: _Provenance):
    g, enc = sat.graph, sat.enc
    self.g, self.enc, self.ex, self.prov = g, enc, ex, prov
    self.allowed = g.pinned_allowed()
    self.best, _ = knuth(g, ex.costs, self.allowed)   # tree costs, for the members' table
    self.by_class: dict[int, list[int]] = {}
    for e, k in enumerate(g.cls): self.by_class.setdefault(k, []).append(e)
    self.pin = {g.class_of_id[a]: g.class_of_id[t] for a, t in enc.pins.items()}
    self.low_handle: dict[int, int] = {}
    for i, c in g.class_of_id.items(): self.low_handle[c] = min(i, self.low_handle.get(c, i))
    self.owner: dict[int, int] = {}           # fresh buffer uid -> the realize point it was minted for
    for j, t in enumerate(prov.tracked):
      if (f := enc.fresh.get(t)) is not None: self.owner.setdefault(_buffer_of(enc.nodes[f]).arg.uid, j)
    self.storages = [storage_view(ex.terms[k]) for k in ex.root_classes]
    self.bufs = [_buffer_of(sv) for sv in self.storages]

  def bufname(self, b: Node) -> str:
    if b.op is Ops.PARAM: return f"param{b.arg.slot}" if hasattr(b.arg, "slot") else "param"
    return f"buf{b.arg.uid}"

  def bufdesc(self, b: Node) -> str:
    if b.op is Ops.BUFFER and (j := self.owner.get(b.arg.uid)) is not None: return f"fresh buffer {self.bufname(b)} of #{j}"
    return f"input buffer {self.bufname(b)}" if b.op is Ops.BUFFER else f"parameter {self.bufname(b)}"

  def members(self, t: int, k: int) -> list[Member]:
    g, costs, choice = self.g, self.ex.costs, self.ex.choice
    def kid_text(x: int) -> str:
      return f"c{x} " + (_describe_node(g.info[x]) if g.info[x] is not None else (g.op[choice[x]] if choice[x] >= 0 else "?"))
    out = []
    for e in self.by_class.get(k, []):
      op, tree = g.op[e], None
      if costs[e] is not None and self.allowed[e] and all(self.best[x] != float("inf") for x in g.kids[e]):
        tree = costs[e] + sum(self.best[x] for x in g.cost_kids[e])
      full = (op, g.arg[e], tuple(self.low_handle.get(x, -1) for x in g.kids[e]))
      first = self.prov.first[t]
      out.append(Member(e, op, arg_text(self.enc, op, g.arg[e]), [kid_text(x) for x in g.kids[e]], costs[e], tree,
                        first.get(full, first.get(full[:2], "inserted")),
                        _status(g, e, k, e == choice[k], costs, self.allowed, k in self.pin, tree)))
    return out

  def kind(self, j: int, k: int) -> tuple[str, str]:
    """(kind, one-sentence summary) of realize point j in class k."""
    term, sv, b = self.ex.terms[k], self.storages[j], self.bufs[j]
    owner, fresh = self.owner, self.enc.fresh_buffers
    if _chain_has_slice(term):
      sl = next(n for n in toposort([sv]) if n.op is Ops.SLICE)
      return "view", (f"a zero-copy view: SLICE of {self.bufdesc(b)} at element {sl.arg[0]}, {sl.arg[1]} elements; "
                      "nothing is stored")
    if b.op is Ops.BUFFER and b.arg.uid in fresh and owner.get(b.arg.uid) != j and b.arg.uid in owner:
      return "shared", f"lives in the fresh buffer {self.bufname(b)} minted for #{owner[b.arg.uid]}: their e-classes hold the same value"
    if b.op is Ops.BUFFER and b.arg.uid in fresh:
      by_call = term.op is Ops.AFTER and any(d.op is Ops.CALL for d in term.src[1:])
      return "fresh", f"a fresh buffer {self.bufname(b)} ({b.nbytes} B) written by " + ("a precompiled CALL" if by_call else "a STORE")
    if term.op is Ops.AFTER: return "alias", f"an alias of the assigned {self.bufdesc(b)}: the assign's own write serves it, no copy"
    return "existing", f"already storage: {self.bufdesc(b)}, no copy"

  def point(self, j: int, key: Node, t: int, k: int, names: list[str], matching: list[str]) -> PointExplanation:
    g, members = self.g, self.members(t, k)
    chosen = next(m for m in members if m.status == "chosen")
    alts = [m for m in members if m.status == "alternative"]
    alt = min(alts, key=lambda m: m.tree_cost) if alts else None
    fresh_here = g.fresh_class.get(k, set())
    mats = [m for e, m in zip(self.by_class.get(k, []), members)
            if g.op[e] == "AFTER" and g.kids[e][:1] and g.kids[e][0] in fresh_here and m.tree_cost is not None]
    kind, summary = self.kind(j, k)
    if chosen.introduced_by != "inserted": summary += f" (the form {chosen.introduced_by} added)"
    uid = lambda b: b.arg.uid if b.op is Ops.BUFFER else ("param", id(b))
    others = [f"#{i}" for i in range(len(self.bufs)) if i != j and uid(self.bufs[i]) == uid(self.bufs[j])]
    events = self.prov.events[t]
    return PointExplanation(
      j, names, _describe_node(key), k, kind, summary, _term_text(self.storages[j]), self.bufname(self.bufs[j]), others,
      chosen.introduced_by, chosen.tree_cost, f"{alt.op} {alt.arg}".strip() + f" by {alt.introduced_by}" if alt else None,
      alt.tree_cost if alt else None, min((m.tree_cost for m in mats), default=None),
      list(dict.fromkeys(ev.rule for ev in events)), matching, events, members)

def explain(*tensors, labels=None, cost: str | CostModel = "bytes", schedule: str | Schedule = "saturate",
            limits: str | Limits | None = None, fusion: str | None = None) -> Explanation:
  """Explain every realize point of the graph under `tensors` (Tensors or Nodes). `labels` names the outputs (default
  out0, out1, ...); `Explanation.point(name)` picks one by label, output index or "#i" (realize index). `fusion` (default
  env CALLSAT_FUSION, as callify reads it): with "cost" the e-graph holds the candidates' stored forms, as callify's does
  (which of them the partition stores is callify's report.partition, not explained here)."""
  t0 = time.perf_counter()
  model: CostModel = resolve(cost, COST_PRESETS, "cost model")
  sched: Schedule = resolve(schedule, SCHEDULE_PRESETS, "schedule")
  roots = roots_of(tensors)
  labels = list(labels) if labels is not None else [f"out{i}" for i in range(len(roots))]
  if len(labels) != len(roots): raise CallsatError(f"explain: {len(labels)} labels for {len(roots)} outputs")
  enc = encode(roots)
  if fusion_mode(fusion) == "cost" and cost_plan(enc)[0] is not None: add_candidates(enc)
  if not enc.keys:
    Runner(sched, hook=_Provenance(enc, []))   # validates the schedule as a non-empty graph would
    return Explanation([], 0, 0, model.name, sched.name, 0, 0, {}, {}, StopReason.SATURATED, time.perf_counter() - t0)
  prov = _Provenance(enc, [enc.key_ids[k.id] for k in enc.keys])
  sat = saturate(enc, sched, limits, hook=prov)
  ex = extract_call(sat, model)
  dec = _Decision(sat, ex, prov)
  matching = _matching_rules(sat.runner, [r for _, names in stepwise_phases(sched) for r in names], prov.tracked)
  names = _point_names(enc, roots, labels)
  points = [dec.point(j, key, t, k, names[j], matching[t])
            for j, (key, t, k) in enumerate(zip(enc.keys, prov.tracked, ex.root_classes))]
  st = sat.runner.stats
  return Explanation(points, ex.cost, baseline_cost(enc, model), model.name, sched.name, sat.graph.n_enodes,
                     sat.graph.n_classes, dict(st.matches), dict(st.rounds), st.stop_reason, time.perf_counter() - t0)

_BOUND = re.compile(r"^\(= (\w+) ")

def _matching_rules(runner: Runner, names: list[str], tracked: list[int]) -> dict[int, list[str]]:
  """Per tracked handle id: the rules whose query holds with its first bound variable equal to that e-class, asked of
  egglog with `check` at the fixpoint. The rules are unions, so these are the rules that did (or would) apply to it;
  the events say which one changed the class first."""
  out: dict[int, list[str]] = {t: [] for t in tracked}
  for name in names:
    q = RULES[name].query
    if (m := _BOUND.match(q)) is None: continue
    for t in tracked:
      try: runner.egraph.run_program(*runner.egraph.parse_program(f"(check {q} (= {m.group(1)} (N {t})))"))   # not
    # runner.command: a failed check is the answer "no", not an engine failure
      except Exception: continue    # the check failed: the rule does not match this class
      out[t].append(name)
  return out

def _term_text(n: Node) -> str:
  """A storage view as text: RESHAPE((2, 4), SLICE(4, 4, buf7))."""
  if n.op is Ops.BUFFER: return f"buf{n.arg.uid}"
  if n.op is Ops.PARAM: return "PARAM"
  arg = n.arg if n.op is not Ops.SLICE else f"{n.arg[0]}, {n.arg[1]}"
  return f"{n.op.name}({arg}, {_term_text(n.src[0])})" if n.src else n.op.name
