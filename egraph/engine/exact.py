"""Exact DAG extraction as an ILP over the e-graph (HiGHS through scipy.optimize.milp), used to certify the default
extraction (egraph/engine/extract.py: Knuth, sharing-aware rounds, single-class switches) on e-graphs that fit, or to
replace it where it is not optimal. The formulation is extraction-gym's: a binary x_e per usable e-node reachable from
the roots, an activity r_k per class (sum of its x_e = r_k, the roots' r = 1, x_e <= r_c for each child class c), the
objective sum cost_e x_e; acyclicity by topological levels (t_k >= t_c + 1 where x_e picks an edge k -> c) only on
edges inside a strongly connected component of the class graph, the only place a cycle can close. Where an e-node pays
for fewer children than it reads (extract.EGraphView.cost_kids: a SLICE of a BUFFER passes its own range), paid classes
p_k and paid e-nodes y_e >= x_e + p_k - 1 carry the cost instead."""
from __future__ import annotations
import time
from dataclasses import dataclass
import numpy as np
from egraph.engine.extract import INF, dag_cost, reached_classes, acyclic, usable_members

EXACT_MAX_CLASSES = 5_000    # reachable e-classes above which no ILP is built (certification says "not proven")
EXACT_SECONDS = 5.0          # HiGHS's time limit when the caller gives none

def scipy_milp():
  """(milp, LinearConstraint, Bounds, csr_array), or None where scipy (a dependency) cannot be imported. Imported here,
  where an ILP is solved (~0.45 s the first time): callify without certification never pays for it."""
  try:
    from scipy.optimize import milp, LinearConstraint, Bounds
    from scipy.sparse import csr_array
  except ImportError: return None
  return milp, LinearConstraint, Bounds, csr_array

@dataclass
class Exact:
  """The ILP's answer: `status` "optimal" (proven), "feasible" (time limit, an incumbent and HiGHS's dual bound),
  "unknown" (no incumbent in time), "infeasible" (no DAG under the roots), "too big" or "no scipy" (not built); `choice` one e-node per class the DAG
  reaches (-1 elsewhere), None without an incumbent."""
  status: str
  cost: int | None = None
  bound: float = 0.0
  choice: list[int] | None = None
  seconds: float = 0.0
  variables: int = 0
  classes: int = 0
  note: str = ""

def _usable(g, costs, allowed, roots) -> tuple[list[int], dict[int, list[int]]]:
  """(the classes reachable from `roots` through usable e-nodes, class -> its usable e-nodes). An e-node is usable when
  it has a cost and is allowed; reachability goes through every usable e-node's children."""
  members = usable_members(g, costs, allowed)
  seen, order, stack = set(), [], list(roots)
  while stack:
    k = stack.pop()
    if k in seen: continue
    seen.add(k); order.append(k)
    for e in members.get(k, ()): stack += [c for c in g.kids[e] if c not in seen]
  return order, members

def _sccs(classes: list[int], succ: dict[int, set[int]]) -> dict[int, int]:
  """class -> its strongly connected component's id (Tarjan, iterative), for the classes given."""
  index, low, comp, on, st, n = {}, {}, {}, set(), [], 0
  for s in classes:
    if s in index: continue
    work = [(s, iter(succ.get(s, ())))]
    index[s] = low[s] = n; n += 1; st.append(s); on.add(s)
    while work:
      v, it = work[-1]
      for w in it:
        if w not in index:
          index[w] = low[w] = n; n += 1; st.append(w); on.add(w)
          work.append((w, iter(succ.get(w, ())))); break
        if w in on: low[v] = min(low[v], index[w])
      else:
        work.pop()
        if work: low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          while True:
            w = st.pop(); on.discard(w); comp[w] = v
            if w == v: break
  return comp

def exact_extract(g, costs: list[int | None], roots: list[int], allowed: list[bool] | None = None,
                  seconds: float = EXACT_SECONDS, max_classes: int = EXACT_MAX_CLASSES) -> Exact:
  """The minimum-DAG-cost choice under `roots` (every class reached paid once, as extract.dag_cost), by ILP. `g` needs
  `cls`, `kids`, `cost_kids` and `n_classes` (an EGraphView, or any e-graph given as lists)."""
  t0 = time.perf_counter()
  classes, members = _usable(g, costs, allowed, roots)
  if len(classes) > max_classes:
    return Exact("too big", classes=len(classes), note=f"{len(classes)} reachable e-classes > {max_classes}")
  if any(k not in members for k in roots):
    return Exact("infeasible", classes=len(classes), note="a root class has no usable e-node")
  sp = scipy_milp()
  if sp is None: return Exact("no scipy", classes=len(classes), note="scipy.optimize.milp cannot be imported")
  milp, LinearConstraint, Bounds, csr_array = sp
  enodes = [e for k in classes for e in members.get(k, ())]
  xi = {e: i for i, e in enumerate(enodes)}
  ri = {k: len(enodes) + i for i, k in enumerate(classes)}
  nv = len(enodes) + len(classes)
  split = any(g.cost_kids[e] != g.kids[e] for e in enodes)   # some e-node pays for fewer classes than it reads
  if split:
    pi = {k: nv + i for i, k in enumerate(classes)}; nv += len(classes)
    yi = {e: nv + i for i, e in enumerate(enodes)}; nv += len(enodes)
  succ: dict[int, set[int]] = {}
  for e in enodes: succ.setdefault(g.cls[e], set()).update(g.kids[e])
  comp = _sccs(classes, succ)
  size: dict[int, int] = {}
  for k in classes: size[comp[k]] = size.get(comp[k], 0) + 1
  cyclic = [k for k in classes if size[comp[k]] > 1]
  ti = {k: nv + i for i, k in enumerate(cyclic)}; nv += len(cyclic)
  rows, cols, vals, lo, hi = [], [], [], [], []
  def row(entries, lb, ub):
    r = len(lo)
    for c, v in entries: rows.append(r); cols.append(c); vals.append(v)
    lo.append(lb); hi.append(ub)
  lb, ub = np.zeros(nv), np.ones(nv)
  for k in classes:
    row([(xi[e], 1.0) for e in members.get(k, ())] + [(ri[k], -1.0)], 0.0, 0.0)   # one e-node iff the class is reached
  for k in roots: lb[ri[k]] = 1.0
  for e in enodes:
    k = g.cls[e]
    for c in set(g.kids[e]):
      if c == k: ub[xi[e]] = 0.0; continue   # reads its own class: never part of a DAG
      row([(xi[e], 1.0), (ri[c], -1.0)], -INF, 0.0)
      if c in ti and comp[c] == comp[k]:   # an edge inside a cycle: t_k - t_c >= 1 where chosen (M = the SCC's size)
        m = float(size[comp[k]])
        row([(ti[k], 1.0), (ti[c], -1.0), (xi[e], -m)], 1.0 - m, INF)
    if split:
      row([(yi[e], 1.0), (xi[e], -1.0), (pi[k], -1.0)], -1.0, INF)   # y_e >= x_e + p_k - 1
      for c in set(g.cost_kids[e]): row([(pi[c], 1.0), (yi[e], -1.0)], 0.0, INF)   # a paid e-node pays its cost kids
  if split:
    for k in roots: lb[pi[k]] = 1.0
  for k in cyclic: ub[ti[k]] = float(size[comp[k]] - 1)
  obj = np.zeros(nv)
  for e in enodes: obj[yi[e] if split else xi[e]] = float(costs[e])
  integrality = np.zeros(nv); integrality[:len(enodes)] = 1
  a = csr_array((vals, (rows, cols)), shape=(len(lo), nv))
  res = milp(obj, integrality=integrality, bounds=Bounds(lb, ub),
             constraints=LinearConstraint(a, np.array(lo), np.array(hi)) if lo else None,
             options={"time_limit": max(seconds, 0.01), "mip_rel_gap": 0.0})
  took = time.perf_counter() - t0
  bound = float(getattr(res, "mip_dual_bound", None) or 0.0)
  if res.x is None:
    status = "infeasible" if res.status == 2 else "unknown"
    return Exact(status, bound=bound, seconds=took, variables=nv, classes=len(classes), note=res.message)
  choice = [-1] * g.n_classes
  for e in enodes:
    if res.x[xi[e]] > 0.5: choice[g.cls[e]] = e
  # the ILP's choice as extract's: only the classes it reaches, costed by the same walk (its objective may count a
  # class the ILP kept active without need; the walk is the truth)
  reached = reached_classes(choice, roots, g.kids, g.n_classes)
  keep = [-1] * g.n_classes
  for k in reached: keep[k] = choice[k]
  if not acyclic(keep, roots, g.kids, g.n_classes):   # cannot happen with the level constraints: said, not trusted
    return Exact("unknown", bound=bound, seconds=took, variables=nv, classes=len(classes), note="the ILP's DAG has a cycle")
  cost = dag_cost(g, costs, keep, roots)
  status = "optimal" if res.status == 0 else "feasible"
  return Exact(status, cost, max(bound, 0.0) if status == "feasible" else float(cost), keep, took, nv, len(classes))

@dataclass
class Certificate:
  """How the default extraction's cost stands against the exact one: `verdict` is "optimal (proven)",
  "gap <= x %" (the ILP stopped at its time limit with that dual bound), "not optimal: ..." (the ILP found a cheaper
  DAG) or "not proven (why)"."""
  default_cost: int
  exact: Exact
  verdict: str
  gap: float | None      # (default - proven lower bound) / default; 0.0 proven optimal; None not proven

  @property
  def improves(self) -> bool:
    """The ILP's DAG is cheaper than the default's."""
    return self.exact.cost is not None and self.exact.cost < self.default_cost

def certify(default_cost: int, ex: Exact) -> Certificate:
  """The verdict on `default_cost` given the ILP's answer."""
  if ex.status == "optimal":
    if ex.cost > default_cost:   # the default's DAG is one of the ILP's solutions: a higher optimum is a formulation fault
      return Certificate(default_cost, ex, f"not proven (the ILP's optimum {ex.cost} is above the default's {default_cost})", None)
    if ex.cost == default_cost: return Certificate(default_cost, ex, "optimal (proven)", 0.0)
    gap = (default_cost - ex.cost) / default_cost if default_cost else 0.0
    return Certificate(default_cost, ex, f"not optimal: exact cost {ex.cost} is {gap:.1%} lower (proven optimal)", gap)
  if ex.status == "feasible":
    best = min(default_cost, ex.cost)
    gap = max(0.0, (default_cost - ex.bound) / default_cost) if default_cost else 0.0
    if gap <= 0.0: return Certificate(default_cost, ex, "optimal (proven)", 0.0)
    head = f"not optimal: the ILP found cost {ex.cost}; " if best < default_cost else ""
    return Certificate(default_cost, ex, f"{head}gap <= {gap:.1%} (ILP time limit, {ex.seconds:.2f}s)", gap)
  return Certificate(default_cost, ex, f"not proven ({ex.note or ex.status})", None)
