"""Floor 3, fusion by cost: the partition stated as a MILP (`Ilp`) and solved by HiGHS (scipy.optimize.milp)."""
from __future__ import annotations
import time
from egraph.ir.ops import Node, Ops
from egraph.engine.extract import INF
from egraph.fusion.timemodel import STREAM_BYTES
from egraph.fusion.greedy import LOADS as _LOADS, hoisted, node_ops as _node_ops, Late
from egraph.fusion.kernels import matmul_operands, reduce_below, storage_root, unview
from egraph.fusion.partition import Partition

MILP_MAX_TERMS = 60_000     # nonzeros of the MILP's rows: a bigger one is not built (the build and solve outgrow the budget)

MIP_GAP = 0.01            # HiGHS stops within 1 % of its bound: the model is not that accurate (MARGIN), the search is costly

class TooBig(Exception):
  """The ILP outgrew MILP_MAX_TERMS while being built."""

class Ilp:
  """The partition as a MILP under the time model, solved by HiGHS (scipy.optimize.milp). Binary s_c: candidate c stored.
  Per kernel k (each STORE value; each candidate c, which exists iff s_c) over its all-fused cone, with reach = the OR
  of y over d's nearest candidate consumers (k's root: s_c, or 1 for a STORE), every OR exact (u >= each, u <= sum):
    y[k,d] = reach AND NOT s_d (candidate d computed in k), z[k,d] = reach AND s_d (d read from its buffer);
    e[k,d] >= f * e[k,x] - M s_d: d's evaluations, the most over its uncut paths (f: the evaluations per evaluation of
    its consumer x, through broadcasts and reduces); other nodes are evaluated max_x f * e[k,x] times (a variable per
    set of nearest candidates); an input buffer is read iff the OR of its loads' nearest candidates;
    bytes = written s + sum z * bytes + sum OR * input bytes;  ops = sum e * the node's model ops;
    tb >= bytes / bw_cache, tb >= bytes / bw_mem - M (1 - mem) with binary mem forced past cache_bytes;
    T >= combine(tb, ops * rate) ("max": an epigraph, "sum": tb + ops * rate);  t >= T, t >= par_speedup T - M big, with
    binary big allowed only when a floor of the kernel's work (ops at their thriftiest path's evaluations) reaches
    parallel_work; a matmul-shaped root runs at the matmul rate when mm <= s_x for its operands x.
  Objective: sum launch * (s_c or 1) + t. Exact for everything but (1) a reduce's re-read share (the rate of its ops),
  fixed per kernel from a reference partition (`objective(S)`), (2) each kernel's read bytes of a buffer, taken
  all-or-nothing (as many as the all-fused kernel reads). A node's evaluations are capped where they alone would take
  longer than the anchor partition (`cap_s`, at the fastest throughput): never optimal, and HiGHS wants bounded
  coefficients (a fully fused transformer block evaluates some values 1e20 times)."""
  SCALE = 1e6   # objective in microseconds: HiGHS's tolerances are absolute and relative to O(1) numbers

  def __init__(self, p: Partition, cap_s: float, max_terms: int = 60_000, deadline: float = INF):
    self.p, self.cs, self.terms, self.max_terms, self.cap_s = p, sorted(p.cands), 0, max_terms, cap_s
    self.lb, self.ub, self.integ, self.rows = [], [], [], []   # rows: ([(var, coef)], lo): sum >= lo
    self.one = self.var(1, 1)
    self.s = {c: self.var(0, 1, True) for c in self.cs}
    self.kern = []   # per kernel: root, written, root var, [(var, bytes)], [(var, ops)], hi ops, mm, mem, big, tb, T, t,
                     # the read vars of read-backs (at bw_readback)
    for v, w, rv in [(v, w, self.one) for v, w in p.stores] + [(p.cands[c], p.cands[c].nbytes, self.s[c]) for c in self.cs]:
      if time.perf_counter() > deadline: raise Late()
      self.kern.append(self._kernel(v, w, rv))

  def var(self, lo: float, hi: float, integer: bool = False) -> int:
    self.lb.append(lo); self.ub.append(hi); self.integ.append(int(integer)); return len(self.lb) - 1

  def ge(self, terms: list, lo: float) -> None:
    self.rows.append((terms, lo)); self.terms += len(terms)
    if self.terms > self.max_terms: raise TooBig()

  def _any(self, ys: frozenset, memo: dict) -> int:
    """A variable >= each of ys and <= their sum: their OR."""
    if len(ys) == 1: return next(iter(ys))
    if (u := memo.get(ys)) is None:
      u = memo[ys] = self.var(0, 1)
      for y in ys: self.ge([(u, 1), (y, -1)], 0)
      self.ge([(y, 1) for y in ys] + [(u, -1)], 0)
    return u

  def _kernel(self, v: Node, written: int, rv: int) -> tuple:
    p, m = self.p, self.p.model
    evals, order, _ = p.k.walk(v, frozenset())
    red = reduce_below(order, v, frozenset())   # hoisting only where no REDUCE is fused below in any partition (else conservative)
    cap = lambda unit: self.cap_s * max(m.throughput.values()) / unit if unit else INF   # more evaluations cost more than the anchor
    Y, E, memo = {v.id: rv}, {v.id: (rv, v.numel)}, {}   # E: candidate (or the root) -> (variable, scale): its evaluations
    F = {v.id: {v.id: 1}}   # node -> {nearest candidate consumer (or the root): most evaluations per evaluation of it}
    low = {v.id: v.numel}   # evaluations along the thriftiest path: a floor under any partition's (the split's test)
    comp, work, groups, loads, reads, hi_ops, dram = {}, {}, {}, {}, [], 0.0, set()   # loads: storage root -> [bytes, cap, consumers]
    for n in order:
      f = F.pop(n.id)
      self.terms += len(f)   # the dict merges below cost as much as the rows they become
      if self.terms > self.max_terms: raise TooBig()
      if n.op in _LOADS:
        r = storage_root(n)
        e = loads.setdefault(r.id, [0, r.nbytes if r.shape is not None else 0, frozenset()])
        e[0] += min(evals.get(n.id, 0), n.numel) * n.dtype.itemsize; e[2] |= frozenset(f)
        continue
      unit = _node_ops(m, n, 1)
      if n is not v and n.id in p.cands:
        reach, sd = self._any(frozenset(Y[x] for x in f), memo), self.s[n.id]
        y = Y[n.id] = self.var(0, 1)
        z, e = self.var(0, 1), self.var(0, 1)
        self.ge([(y, 1), (reach, -1), (sd, 1)], 0); self.ge([(z, 1), (reach, -1), (sd, -1)], -1)
        self.ge([(reach, 1), (y, -1)], 0); self.ge([(y, -1), (sd, -1)], -1); self.ge([(reach, 1), (z, -1)], 0); self.ge([(sd, 1), (z, -1)], 0)
        hi = min(evals[n.id], cap(unit)) or 1.0   # e: evaluations / hi, at most 1 (HiGHS wants O(1) values, not 1e20); 1: an empty value
        ks = [(E[x][0], k * E[x][1] / hi) for x, k in f.items()]
        for x, k in ks: self.ge([(e, 1), (x, -k), (sd, max(k for _, k in ks))], 0)   # e >= k e_x unless stored
        reads.append((z, min(evals[n.id], n.numel) * n.dtype.itemsize))
        if n.nbytes >= STREAM_BYTES: dram.add(z)   # read back from DRAM (TimeModel: dram_bytes)
        E[n.id], f = (e, hi), {n.id: 1}
        if unit: comp[e] = comp.get(e, 0.0) + unit * hi
      elif unit and len(f) == 1 and (k := next(iter(f.values()))) * E[x := next(iter(f))][1] <= cap(unit):
        comp[E[x][0]] = comp.get(E[x][0], 0.0) + unit * k * E[x][1]
      elif unit:   # evaluated as often as its widest uncut path: g >= k e_x for each nearest candidate x, g <= 1
        hi = min(max(k * E[x][1] for x, k in f.items()), cap(unit)) or 1.0
        if (g := groups.get(key := (frozenset(f.items()), hi))) is None:
          g = groups[key] = self.var(0, 1)
          for x, k in f.items(): self.ge([(g, 1), (E[x][0], -k * E[x][1] / hi)], 0)
        comp[g] = comp.get(g, 0.0) + unit * hi
      if unit:
        r = self._any(frozenset(Y[x] for x in f), memo)
        work[r], hi_ops = work.get(r, 0.0) + unit * min(low[n.id], cap(unit)), hi_ops + unit * min(evals[n.id], cap(unit))
      mult = n.src[0].numel // max(n.numel, 1) if n.op is Ops.REDUCE else 1 / hoisted(n) if n.op is Ops.EXPAND and n.src[0].id not in red else 1
      for x in n.src:
        d = F.setdefault(x.id, {})
        for c, k in f.items(): d[c] = max(d.get(c, 0), k * mult)
        low[x.id] = min(low.get(x.id, INF), low[n.id] * mult)
    reads += [(self._any(frozenset(Y[x] for x in c), memo), min(b, cap) if cap else b) for b, cap, c in loads.values()]
    mm, xs = None, matmul_operands(v)
    if xs is not None and all(x.op in _LOADS or (x is not v and x.id in p.cands) for x in xs):
      mv = self.var(0, 1)
      for y in [rv] + [self.s[x.id] for x in xs if x.op not in _LOADS]: self.ge([(y, 1), (mv, -1)], 0)
      mm = (mv, _node_ops(m, v, evals[v.id]) + _node_ops(m, mul := unview(v.src[0]), evals.get(mul.id, 0)))
    hi_b, hi_w = written + sum(b for _, b in reads), hi_ops + sum(b for _, b in reads) / 4
    mem = self.var(0, 1, True) if hi_b > m.cache_bytes else None   # 1: past the cache, at bw_mem
    big = self.var(0, 1, True) if hi_w >= m.parallel_work and m.par_speedup != 1 else None   # 1: split across threads
    if mem is not None:   # mem >= (bytes - cache) / (most bytes - cache), in MB
      self.ge([(mem, (hi_b - m.cache_bytes) / 1e6)] + [(x, -b / 1e6) for x, b in [(rv, written)] + reads], -m.cache_bytes / 1e6)
    if big is not None:   # big <= work / parallel_work, in Mops, with each op's floor of evaluations (never more than the truth)
      self.ge([(big, -m.parallel_work / 1e6)] + [(x, o / 1e6) for x, o in work.items()] + [(x, b / 4e6) for x, b in reads], 0.0)
    return v, written, rv, reads, list(comp.items()), hi_ops, mm, mem, big, self.var(0, INF), self.var(0, INF), self.var(0, INF), dram

  def objective(self, S: frozenset) -> tuple[list, list]:
    """(objective, the kernel-time rows) with each kernel's rate per op from its kernel under partition S. Per kernel:
    tb >= bytes / bw_cache, tb >= bytes / bw_mem - Mb (1 - mem) (read-backs at bw_readback in both);
    T >= combine(tb, tc); t >= T, t >= par_speedup T -
    Mt big (big-M with M the most T can be: every variable 1)."""
    p, m, K = self.p, self.p.model, self.SCALE
    c, rows, tp, P = [0.0] * len(self.lb), [], m.throughput, m.par_speedup
    for v, written, rv, reads, comp, hi_ops, mm, mem, big, tb, T, t, dram in self.kern:
      w = p.k.work(v, written, S)
      rate = (1 - w.reread) / tp["elementwise"] + w.reread / tp["reduce"] if w.kind in ("reduce", "matmul") else 1 / tp[w.kind]
      bs = [(rv, written)] + reads
      bw = lambda x, other: m.readback if x in dram else other   # a read-back is at bw_readback, in cache or past it
      rows.append(([(tb, 1.0)] + [(x, -K * b / bw(x, m.bw_cache)) for x, b in bs], 0.0))
      if mem is not None:
        past = [(x, K * b / bw(x, m.bw_mem)) for x, b in bs]
        mb = sum(q for _, q in past)
        rows.append(([(tb, 1.0), (mem, -mb)] + [(x, -q) for x, q in past], -mb))
      tc = [(x, -K * o * rate) for x, o in comp]
      if mm is not None: tc.append((mm[0], K * mm[1] * max(rate - 1 / tp["matmul"], 0.0)))
      if m.combine == "max": rows += [([(T, 1.0), (tb, -1.0)], 0.0), ([(T, 1.0)] + tc, 0.0)]
      else: rows.append(([(T, 1.0), (tb, -1.0)] + tc, 0.0))
      c[rv] += K * m.launch_s
      if big is None: c[T] += P   # never split (or splitting gains nothing)
      else:
        hi = min(K * sum(b / bw(x, m.bw_mem if mem is not None else m.bw_cache) for x, b in bs) + K * rate * hi_ops, 4 * K * self.cap_s)
        c[t] += 1.0
        rows += [([(t, 1.0), (T, -1.0)], 0.0), ([(t, 1.0), (T, -P), (big, (P - 1) * hi)], 0.0)]
    return c, rows

  def run(self, S: frozenset, deadline: float, sp, gap: float = MIP_GAP) -> tuple | None:
    """(stored set, objective s, dual bound s, mip gap, hit the time limit) of the MILP with constants from S; None
    when HiGHS found no solution in time."""
    milp, LinearConstraint, Bounds, csr_array = sp
    c, extra = self.objective(S)
    data, ri, ci, lo = [], [], [], []
    for i, (terms, l) in enumerate(self.rows + extra):
      for x, k in terms: data.append(k); ri.append(i); ci.append(x)
      lo.append(l)
    A = csr_array((data, (ri, ci)), shape=(len(lo), len(self.lb)))
    res = milp(c, integrality=self.integ, bounds=Bounds(self.lb, self.ub), constraints=LinearConstraint(A, lo, INF),
               options={"time_limit": max(deadline - time.perf_counter(), 1e-3), "presolve": True, "mip_rel_gap": gap})
    if res.x is None: return None
    S = frozenset(c for c in self.cs if res.x[self.s[c]] > 0.5)
    bound = getattr(res, "mip_dual_bound", None)
    return S, res.fun / self.SCALE, (res.fun if bound is None else bound) / self.SCALE, getattr(res, "mip_gap", 0.0), res.status == 1
