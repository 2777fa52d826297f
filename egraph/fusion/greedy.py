"""The partition's local search (egraph/fusion/solve.py): a stored set being searched (`State`), single flips from the
cheapest start (`search`), the model's filter of what is worth flipping on big graphs (`worth_flipping`), and the
anchor: what lower/'s rules mode realizes (`rules_realized`, over IR Nodes or e-class ids). Every costing stops at the
solver's deadline (Late)."""
from __future__ import annotations
import itertools, math, operator, time
from egraph.ir.ops import Node, Ops, GroupOp, toposort
from egraph.fusion.timemodel import TimeModel, TRANSCENDENTAL, DIVISION
from egraph.fusion.policy import NESTED_REDUCE_WORK, PASS_THROUGH

INF = float("inf")
LOADS = frozenset({Ops.BUFFER, Ops.PARAM, Ops.SLICE, Ops.AFTER})   # what a kernel reads from memory (an AFTER: a write's result)

def rules_realized(values, op, src, shape, deadline: float = INF) -> set | None:
  """What lower/'s rules-mode heuristics realize in the kernels computing `values` (a copy of
  lower/schedule/kernelize._nested_reduces and of the builder's REDUCE-under-a-broadcast split: egraph does not import lower/),
  over any handles: `op(x)` an Ops, `src(x)` its sources, `shape(x)` a tuple or None. A big REDUCE (NESTED_REDUCE_WORK)
  read by an ALU op or under another REDUCE, the computed operand of a big EXPAND under a REDUCE, and a REDUCE reached
  through a widening EXPAND get a kernel of their own. Kernels stop at loads; every node is walked once over the union
  of the kernels (what one kernel realizes is realized for all: lowering then reads it from memory in each). None past
  `deadline`. Each walk is a reachability, so its order is free: each node's op is read once, the nodes of one op
  found in C (compress), loads start out walked, and the builder's walk keeps a stack per flag instead of pairs."""
  seen, stack, loads = set(values), list(values), LOADS   # the union of the kernels' regions: every node once
  while stack:
    if op(n := stack.pop()) not in loads:
      for x in src(n):
        if x not in seen: seen.add(x); stack.append(x)
  if time.perf_counter() > deadline: return None
  red, exp, alu, through = Ops.REDUCE, Ops.EXPAND, GroupOp.ALU, PASS_THROUGH
  nodes = list(seen); ops = list(map(op, nodes))
  def of(o) -> list: return list(itertools.compress(nodes, map(operator.is_, ops, itertools.repeat(o))))
  at_loads = set(itertools.compress(nodes, map(loads.__contains__, ops)))   # walks start with these walked: none enters one
  reds = of(red)
  bigs = {n for n in reds if (s := shape(src(n)[0])) is not None and math.prod(s) >= NESTED_REDUCE_WORK}
  under, stack = at_loads.copy(), list(itertools.chain.from_iterable(map(src, reds)))   # below a REDUCE of the same kernel
  while stack:
    if (n := stack.pop()) not in under: under.add(n); stack += src(n)
  nested = bigs & under   # a big REDUCE under another
  if bigs:   # a big REDUCE read by an ALU op
    for n in itertools.compress(nodes, map(alu.__contains__, ops)):
      for c in src(n):
        while op(c) in through and (ss := src(c)): c = ss[0]
        if c in bigs: nested.add(c)
  widening, widens = set(), {}   # widens: per (operand shape, shape), as EXPANDs repeat a few broadcasts
  for n in of(exp):
    if (s0 := shape(src(n)[0])) is not None:
      if (w := widens.get(key := (s0, sh := shape(n)))) is None: w = widens[key] = any(a == 1 and t != 1 for a, t in zip(s0, sh))
      if w: widening.add(n)
    if n in under and (sh := shape(n)) is not None and math.prod(sh) >= NESTED_REDUCE_WORK:   # a big broadcast's operand
      c = src(n)[0]
      while op(c) in through and (ss := src(c)): c = ss[0]
      if (op(c) in alu or op(c) is red) and (cs := shape(c)) is not None and math.prod(cs) > 1: nested.add(c)
  if time.perf_counter() > deadline: return None
  # the builder's walk from each kernel's root (never split itself): a nested node, or a REDUCE reached through a
  # widening EXPAND, gets its own kernel. Through a widening EXPAND (`wide`) until such a REDUCE, else `plain`.
  out, plain, wide, stop = set(), [], [], nested.union(reds)
  for v in values:
    if op(v) not in loads: (wide if v in widening else plain).extend(src(v))
  walked_plain, walked_wide = at_loads.copy(), at_loads.copy()
  while plain or wide:
    while wide:
      if (n := wide.pop()) in walked_wide: continue
      walked_wide.add(n)
      if n in stop: out.add(n); plain += src(n)   # its own kernel: below it nothing is through a widening EXPAND
      else: wide += src(n)
    while plain:
      if (n := plain.pop()) in walked_plain: continue
      walked_plain.add(n)
      if n in nested: out.add(n)
      if n in widening: wide += src(n)
      else: plain += src(n)
  return out

def hoisted(n: Node) -> int:
  """How many times fewer an EXPAND's source is computed than the EXPAND is read: LLVM hoists loop-invariant code
  (lower/schedule/work._uses counts it so), so a source is computed once per iteration of the loops it varies in, outside the
  trailing loops it is broadcast along (a row broadcast (N, 1) -> (N, M): N times, not N * M). The EXPAND's own axis
  order stands for the kernel's loops (a permute above it is not followed)."""
  h = 1
  for s, t in zip(reversed(n.src[0].shape), reversed(n.arg)):
    if s == 1 and t != 1: h *= t
    elif s != 1: break
  return h if isinstance(h, int) and h > 0 else 1   # an EXPAND onto an empty axis: nothing is computed, nothing to divide

def node_ops(m: TimeModel, n: Node, evals: int) -> float:
  """The model's ops of `evals` evaluations of n (TimeModel.ops of its share of KernelWork)."""
  if n.op is Ops.REDUCE: return evals * (n.src[0].numel // max(n.numel, 1))
  if n.op in GroupOp.ALU or n.op is Ops.CAST:
    return evals * (m.transcendental_ops if n.op in TRANSCENDENTAL else m.division_ops if n.op in DIVISION else 1)
  return 0

class Late(Exception):
  """The solver's deadline passed while a partition was being costed."""

class State:
  """A partition being searched: the stored set, each kernel's time and the candidates it meets, and per candidate
  the kernels that meet it (only they change when it flips). Costing stops with Late past `deadline`."""
  def __init__(self, p, S: frozenset, deadline: float = INF):
    self.p, self.S, self.t, self.meets, self.users = p, frozenset(), {}, {}, {c: set() for c in p.cands}
    self.S = S
    for key, v, w in p.roots(S):
      if time.perf_counter() > deadline: raise Late()
      self._set(key, *p.kernel(v, w, S))
    self.total = sum(self.t.values())

  def _set(self, key, t: float | None, meets: frozenset = frozenset()) -> None:
    for c in self.meets.pop(key, ()): self.users[c].discard(key)
    self.t.pop(key, None)
    if t is None: return
    self.t[key], self.meets[key] = t, meets
    for c in meets: self.users[c].add(key)

  def delta(self, c: int) -> tuple[float, frozenset, dict]:
    """(cost change, new set, new kernel times) of flipping candidate c."""
    T, p = self.S ^ {c}, self.p
    new: dict = {}
    for key in self.users[c] | {("c", c)}:
      if key[0] == "c" and key[1] not in T: new[key] = (None,); continue
      v, w = (p.stores[key[1]] if key[0] == "s" else (p.cands[key[1]], p.cands[key[1]].nbytes))
      new[key] = p.kernel(v, w, T)
    return sum((x[0] or 0.0) - self.t.get(k, 0.0) for k, x in new.items()), T, new

  def apply(self, d: float, T: frozenset, new: dict) -> None:
    for key, x in new.items(): self._set(key, *x)
    self.S, self.total = T, self.total + d

def search(p, starts: list, cs: list, deadline: float, passes: int) -> tuple[State | None, bool, dict]:
  """The local search (single flips of `cs`, at most `passes` passes) from the cheapest of `starts`, each costed in
  turn until the deadline: (state, finished, each costed start's cost)."""
  st, totals = None, {}
  for S in starts:
    try: x = State(p, S, deadline)
    except Late: break   # the later starts would be later still
    totals[S] = x.total
    if st is None or x.total < st.total: st = x
  if st is None: return None, False, totals
  for _ in range(passes):
    improved = False
    for c in cs:
      if time.perf_counter() > deadline: return st, False, totals
      d, T, new = st.delta(c)
      if d < -1e-15: st.apply(d, T, new); improved = True
    if not improved: break
  return st, True, totals

def worth_flipping(p, cs: list, deadline: float = INF) -> list:
  """The candidates whose stored form might pay for its own kernel's launch. Storing c saves at most the recompute of
  its cone (down to memory) wherever it is fused: at most total(c) evaluations, each its cone's ops at the slowest rate
  and its bytes at the slowest bandwidth (strided where the cone permutes), unsplit. total(n) is the larger of n's own
  size (a kernel root: a STORE value or a stored candidate) and the sum over its consumers of theirs times the reduce
  factor (n fused into them), and a shared part of a cone counts once per path: upper bounds, so a candidate left out
  could not pay for launch_s. One pass each way over the graph; past `deadline` every candidate is kept (the search
  stops at the deadline by itself)."""
  m, cands = p.model, p.cands
  if time.perf_counter() > deadline: return list(cs)
  order = toposort([v for v, _ in p.stores] + [cands[c] for c in cs], enter_calls=False)   # children first
  per: dict[int, tuple[float, float, bool]] = {}   # node id -> (ops, bytes, permutes) per evaluation of its all-fused cone
  for i, n in enumerate(order):
    if not i % 4096 and time.perf_counter() > deadline: return list(cs)
    if n.op in LOADS: per[n.id] = (0.0, float(n.dtype.itemsize), False); continue
    f = n.src[0].numel // max(n.numel, 1) if n.op is Ops.REDUCE else 1
    o, b, t = float(node_ops(m, n, 1)), 0.0, n.op is Ops.PERMUTE
    for s in n.src: so, sb, st = per.get(s.id, (0.0, 0.0, False)); o, b, t = o + f * so, b + f * sb, t or st
    per[n.id] = (o, b, t)
  roots = {v.id for v, _ in p.stores} | set(cands)
  fused: dict[int, float] = {}   # node id -> evaluations its consumers make of it (summed over them)
  total: dict[int, float] = {}
  for n in reversed(order):   # consumers first: a node's sum is complete when it is reached
    total[n.id] = t = max(fused.get(n.id, 0.0), n.numel if n.id in roots else 0)
    if n.op in LOADS: continue
    f = n.src[0].numel // max(n.numel, 1) if n.op is Ops.REDUCE else 1
    for s in n.src: fused[s.id] = fused.get(s.id, 0.0) + t * f
  P = max(m.par_speedup, 1.0)
  rate, bw, bws = P / min(m.throughput.values()), min(m.bw_mem, m.readback, m.bw_cache) / P, min(m.bw_mem, m.readback, m.bw_cache, m.bw_strided) / P
  return [c for c in cs if total[c] * (per[c][0] * rate + per[c][1] / (bws if per[c][2] else bw)) >= m.launch_s]
