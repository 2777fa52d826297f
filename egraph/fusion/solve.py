"""Fusion by cost (issue 14): which intermediates get a buffer, chosen by extraction under a calibrated time model.

* Candidates (`add_candidates`, at insertion): a computed value with several consumers, a REDUCE, a value broadcast by
  an EXPAND (a matmul-shaped reduce's operands are among them). Each gets a fresh buffer view f and the fact
  (candidate x f); the rule `store_candidate` puts the stored form AFTER(f, STORE(f, x)) into x's class.
* Extraction picks every class's computed form as before (tree costs cannot price fusion: a fused value costs once per
  kernel that contains it). The partition, the set S of candidate classes whose stored member is taken, is chosen
  over the candidates: `Partition.cost(S)` is the sum over the resulting kernels (one per STORE: the CALL's own and the
  stored candidates') of TimeModel.kernel_seconds(KernelWork), read off the IR by `Kernels` (bytes of each input read
  once, flops with recompute multiplicity: a fused value is computed in every kernel that reads it, once per element
  of each broadcast and of each reduce it sits inside). `solve` runs a greedy local search (single flips from the
  cheaper of all-stored and rules-like), then, up to MILP_MAX_CANDIDATES candidates and within the remaining time
  budget, states the choice as a MILP (`Ilp`) solved by HiGHS (scipy.optimize.milp); every answer is re-costed by
  Partition.cost. Up to EXHAUSTIVE_MAX candidates every subset is costed instead (exact, and no scipy import).
* `StoredIds` is the extracted DAG with the chosen stored members: a stored class reads as its AFTER, the STORE inside
  it as the computed form (~k), which makes the cyclic class {x, AFTER(f, STORE(f, x))} an acyclic CALL.
The CALL's SINK carries arg "cost" (`mark`): lowering (lower/schedule/kernelize.py) then takes the stores as the partition and
drops its own fusion heuristics."""
from __future__ import annotations
import itertools, math, time
from egraph.ir.errors import CallsatError
from egraph.ir.env import env_value
from egraph.ir.ops import Ops, toposort, HOST_DEVICES
from egraph.engine.encode import Encoding
from egraph.engine.extract import EGraphView, INF
from egraph.engine.report import PartitionReport
from egraph.fusion.timemodel import TimeModel, NoTimeModel
from egraph.fusion.greedy import Late, search as _search, worth_flipping
from egraph.fusion.candidates import COST_S_PER_CLASS, SHARED_MAX_NODES, StoredIds, stored_members
from egraph.fusion import candidates as solver_settings   # SOLVER_FLOOR_S / SOLVER_SHARE read per call: a study may raise them
from egraph.fusion.milp import Ilp, MILP_MAX_TERMS, TooBig
from egraph.engine.exact import scipy_milp
from egraph.fusion.partition import Partition, rules_like, rules_like_ids, tinygrad_like

MODES = ("rules", "cost")

EXHAUSTIVE_MAX = 6          # candidates up to which every subset is costed (64 partitions: 0.2-10 ms on the corpus; HiGHS took 14-54 ms)

MILP_MAX_CANDIDATES = 64    # candidates up to which HiGHS runs after the greedy: 20 take it ~6 s, 120 over 60 s (notes/fusion.md)

MILP_ROUNDS = 2           # MILP solves: constants from the rules-like partition, then from the first answer

LOCAL_RESERVE = 0.3       # of the solver's remaining time, at most 0.5 ms per candidate, kept from HiGHS for the local search

MARGIN = 0.10             # a partition other than the rules-like one must be predicted this much faster (the model's error)

def solver_deadline(spent: float, budget_deadline: float = INF) -> float:
  """When the partition search stops: callify's remaining budget, and a share of what callify spent so far (the
  extraction must stay a small part of callify: the local search's last passes rarely pay for themselves)."""
  return min(budget_deadline, time.perf_counter() + max(solver_settings.SOLVER_FLOOR_S, solver_settings.SOLVER_SHARE * spent))

def fusion_mode(value: str | None = None) -> str:
  """`value`, else env CALLSAT_FUSION (read now, when callify runs), else "cost"."""
  m = value if value is not None else (env_value("CALLSAT_FUSION") or "cost")
  if m not in MODES: raise CallsatError(f"callify: fusion must be one of {MODES}, got {m!r}")
  return m

def cost_plan(enc: Encoding) -> tuple[TimeModel | None, str]:
  """Cost mode's time model for `enc`, else None and why the rules decide: no model for its device, or more than
  SHARED_MAX_NODES inserted nodes (no partition can be costed in the solver's share of callify there: the answer would
  be the rules-like one, after a bigger e-graph and a second walk for it)."""
  if len(enc.original) > SHARED_MAX_NODES:
    return None, f"{len(enc.original)} inserted nodes > {SHARED_MAX_NODES}: too big to cost a partition in the solver's share"
  tm = time_model(enc)
  return tm, "" if tm is not None else "no time model for this graph's device"

def time_model(enc: Encoding) -> TimeModel | None:
  """The time model of the device every realize point is on, or None (several devices, a host or sharded device, no
  calibration): cost mode then keeps the rules."""
  devs = {k.device for k in enc.keys}
  if len(devs) != 1 or not isinstance(d := next(iter(devs)), str) or d.split(":")[0] in HOST_DEVICES: return None
  try: return TimeModel.load(d)
  except NoTimeModel: return None

ANCHORS = ("rules", "tinygrad")   # what a partition is compared with: callsat's rules, or tinygrad's own schedule (the bridge)

def solve(p: Partition, deadline: float = INF, method: str = "auto", passes: int = 3, margin: float = MARGIN,
          rounds: int = MILP_ROUNDS, anchor: str = "rules") -> tuple[frozenset, PartitionReport]:
  """The cheapest set of candidates to store. Up to EXHAUSTIVE_MAX candidates (auto): every subset costed. Else first
  the greedy: single flips (at most `passes` passes) from the cheaper of all-stored and the rules-like partition.
  Then "milp" (auto: up to MILP_MAX_CANDIDATES and MILP_MAX_TERMS, with scipy): the Ilp with its constants from the
  rules-like partition, then (`rounds`) from its own answer, until the deadline; an answer better than the greedy's
  is re-costed by Partition.cost and polished by the local search. The result is the anchor partition unless
  predicted `margin` faster; the report gives the method, bound and gaps. `anchor`: "rules" (the rules-like partition)
  or "tinygrad" (what tinygrad's own schedule stores, fusion/stock.py; the rules-like partition is then one more start
  of the local search); the report's rules_s is the anchor's predicted time."""
  t0 = time.perf_counter()
  cs, notes = sorted(p.cands), []
  budget = max(deadline - t0, 0.0) if deadline < INF else None
  if anchor not in ANCHORS: raise CallsatError(f"partition anchor must be one of {ANCHORS}, got {anchor!r}")
  # the anchor and the out-of-time answer: linear (partition_ids leaves it the time)
  R = (rules_like(p) if anchor == "rules" else tinygrad_like(p)) if cs else frozenset()
  rl = rules_like(p, deadline) if anchor == "tinygrad" and cs else None   # callsat's rules: one more start
  if method == "auto" and 0 < len(cs) <= EXHAUSTIVE_MAX:
    if (ans := _exhaustive(p, cs, R, deadline, margin)) is not None:
      S, rep = ans
      rep.budget_s, rep.seconds, rep.evaluations = budget, time.perf_counter() - t0, p.evaluations
      return S, rep
    notes.append("out of time costing every partition")
  ti, too_many = time.perf_counter(), method == "auto" and len(cs) > MILP_MAX_CANDIDATES   # no MILP: scipy is not imported
  sp = scipy_milp() if method != "greedy" and cs and not too_many else None
  if (ti := time.perf_counter() - ti) > 0.01:   # scipy's first import (~0.5 s, once per process) is not the solver's time
    deadline += ti; notes.append(f"scipy imported in {ti:.2f}s, outside the budget")
  if too_many: notes.append(f"{len(cs)} > {MILP_MAX_CANDIDATES} candidates: greedy")
  elif method != "greedy" and cs and sp is None: notes.append("scipy not installed: greedy")
  flips = cs   # above the MILP's bound only the candidates that might pay for a launch are flipped (greedy.worth_flipping)
  if len(cs) > MILP_MAX_CANDIDATES: flips = worth_flipping(p, cs, deadline); notes.append(f"{len(flips)} might pay for a launch")
  ilp, found, anchor_t = None, None, None   # found: (true cost, S, objective, bound, mip gap, cut)
  if sp is not None:
    anchor_t = p.cost(R if R is not None else frozenset(cs))
    try: ilp = Ilp(p, anchor_t, MILP_MAX_TERMS if method == "auto" else 1 << 62, deadline)
    except TooBig: notes.append(f"ILP over {MILP_MAX_TERMS} terms: greedy")
    except Late: notes.append("out of time building the ILP: greedy")
  starts = ([] if R is None else [R]) + [frozenset(cs)]   # the anchor first: whatever else is costed, the margin test has it
  if flips is not cs:   # the anchor first (fewer kernels to cost), then every flippable candidate stored, if different
    starts = [R if R is not None else frozenset()]; starts += [x] if (x := frozenset(flips) | starts[0]) != starts[0] else []
  if rl is not None and rl not in starts: starts.insert(1, rl)
  st, done, totals = _search(p, starts, flips, deadline, passes)
  rules_t = None if R is None else anchor_t if anchor_t is not None else totals.get(R)
  ref = R if R is not None else frozenset()
  for _ in range(rounds if ilp is not None else 0):   # then HiGHS, with what is left but a reserve for polishing its answer
    now = time.perf_counter()
    if now > deadline or (r := ilp.run(ref, deadline - min(LOCAL_RESERVE * (deadline - now), 5e-4 * len(cs)), sp)) is None: break
    t = p.cost(r[0])
    if found is None or t < found[0]: found = (t, *r)
    if r[0] == ref or r[4]: break
    ref = r[0]
  if ilp is not None and found is None: notes.append("HiGHS found no solution in time: greedy")
  fused = p.cost(frozenset()) if found is not None else None
  if found is not None and (st is None or found[0] < st.total):
    st2, done2, _ = _search(p, [found[1], frozenset()], cs, deadline, passes)
    if st2 is not None and (st is None or st2.total < st.total): st, done = st2, done2
  if st is None:   # not even the first start was costed in time: the rules-like partition (else the first start), uncosted
    first = R if R is not None else starts[0]
    notes.append("out of time before a partition was costed: " + ("the rules-like one" if first == R else "the first start") + " kept")
    return first, PartitionReport("greedy (out of time)", len(cs), len(first), None, None, 0.0, 0.0, budget,
                                  time.perf_counter() - t0, p.evaluations, rules_t, None, None, "; ".join(notes))
  bestS, best = st.S, math.fsum(st.t.values())
  if found is not None:
    method = "milp" + (" (time limit)" if found[5] else "")
    if bestS != found[1]:
      notes.append(f"{'local search' if best < found[0] - 1e-15 else 'a start'} beat the ILP's answer by {1 - best / found[0]:.1%}")
    bound, mip_gap = min(found[3], best, rules_t or INF), found[4]
    model_gap = None if found[5] or found[0] <= 0 else (found[0] - found[2]) / found[0]   # a cut incumbent's slack is no error
  elif not cs: method, bound, mip_gap, model_gap = "none (no candidates)", best, None, None
  else:
    method, mip_gap, model_gap = "greedy" + ("" if done else " (stopped at the deadline)"), None, None
    try: bound = min(p.lower_bound(deadline), best)
    except Late: bound = min(p.model.launch_s, best)
  if rules_t is not None and R is not None and bestS != R and best > rules_t * (1 - margin):
    bestS, best, method = R, rules_t, method + ", rules-like kept"
  rep = PartitionReport(method, len(cs), len(bestS), best, fused, bound, (best - bound) / best if best > 0 else 0.0, budget,
                        time.perf_counter() - t0, p.evaluations, rules_t, mip_gap, model_gap, "; ".join(notes))
  return bestS, rep

def _exhaustive(p: Partition, cs: list, R: frozenset | None, deadline: float,
                margin: float) -> tuple[frozenset, PartitionReport] | None:
  """Every subset of the candidates costed (exact under the model: bound = best, gap 0), the rules-like one first so a
  tie keeps it, then by size; None when the deadline passes first."""
  totals: dict = {}
  for S in itertools.chain([] if R is None else [R], (frozenset(c) for n in range(len(cs) + 1) for c in itertools.combinations(cs, n))):
    if time.perf_counter() > deadline: return None
    if S not in totals: totals[S] = p.cost(S)
  best = min(totals, key=totals.__getitem__)
  method, rules_t = "exhaustive", totals.get(R)
  if rules_t is not None and best != R and totals[best] > rules_t * (1 - margin): best, method = R, "exhaustive, rules-like kept"
  return best, PartitionReport(method, len(cs), len(best), totals[best], totals[frozenset()], totals[best], 0.0, rules_s=rules_t)

def partition_ids(g: EGraphView, choice: list[int], terms, root_classes: list[int], enc: Encoding, cands, model: TimeModel,
                  deadline: float = INF, method: str = "auto", anchor: str = "rules",
                  margin: float = MARGIN) -> tuple[StoredIds, PartitionReport]:
  """The extracted DAG with the cheapest partition's candidates stored, and the report: the kernels are the STOREs of
  the realized terms (`terms`: the decoded extraction, extract.Terms: the classes it reaches, and its terms, read only
  when there is time to cost) plus each stored candidate. When decoding and one costing of the graph cannot fit before
  `deadline` (COST_S_PER_CLASS per class reached), nothing is costed: the rules-like partition is read off the e-class
  ids (`rules_like_ids`). `method`, `anchor`, `margin`: solve's."""
  t0 = time.perf_counter()
  budget = max(deadline - t0, 0.0) if deadline < INF else None
  if not cands:   # nothing to choose: the kernels are what they are (a 10k-node chain costed them all for nothing)
    return StoredIds(g, choice, {}), PartitionReport("none (no candidates)", predicted_s=None, fused_s=None, budget_s=budget)
  reached = terms.reached   # the extraction's walk (reached_classes)
  members = stored_members(g, enc, cands)
  rset = set(reached)
  members = {k: m for k, m in members.items() if k in rset}   # the candidates in the extracted DAG
  if len(reached) * COST_S_PER_CLASS > deadline - time.perf_counter():
    R = rules_like_ids(g, choice, reached, members, deadline + len(reached) * COST_S_PER_CLASS)
    note = f"{len(reached)} classes: no time to decode and cost one partition (budget {budget * 1e3:.0f}ms)" if budget is not None else ""
    return StoredIds(g, choice, {k: members[k] for k in R}), PartitionReport(
      "rules-like (no time to cost)", len(members), len(R), None, None, 0.0, 0.0, budget, time.perf_counter() - t0, 0, None, None, None, note)
  stores = [(n.src[1], n.src[1].nbytes) for n in toposort([terms[c] for c in root_classes], enter_calls=False)
            if n.op is Ops.STORE and n.src[1].shape is not None]
  cls_of = {terms[k].id: k for k in members}
  S, rep = solve(Partition(model, stores, {i: terms[k] for i, k in cls_of.items()}), deadline, method, margin=margin, anchor=anchor)
  return StoredIds(g, choice, {cls_of[i]: members[cls_of[i]] for i in S}), rep
