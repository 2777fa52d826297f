"""Fusion by cost (issue 14): which intermediates get a buffer, chosen by extraction under a calibrated time model.

* Candidates (`add_candidates`, at insertion): a computed value with several consumers, a REDUCE, a value broadcast by
  an EXPAND (a matmul-shaped reduce's operands are among them). Each gets a fresh buffer view f and the fact
  (candidate x f); the rule `store_candidate` puts the stored form AFTER(f, STORE(f, x)) into x's class.
* Extraction picks every class's computed form as before (tree costs cannot price fusion: a fused value costs once per
  kernel that contains it). The partition, the set S of candidate classes whose stored member is taken, is chosen
  over the candidates: `Partition.cost(S)` is the sum over the resulting kernels (one per STORE: the CALL's own and the
  stored candidates') of TimeModel.kernel_seconds(KernelWork), read off the IR by `Kernels` (bytes of each input read
  once, flops with recompute multiplicity: a fused value is computed in every kernel that reads it, once per element
  of each broadcast and of each reduce it sits inside). `solve` enumerates every S exactly up to EXACT_MAX candidates
  within the remaining time budget, and runs a greedy local search (single flips from S = {} and S = all) above it.
* `StoredIds` is the extracted DAG with the chosen stored members: a stored class reads as its AFTER, the STORE inside
  it as the computed form (~k), which makes the cyclic class {x, AFTER(f, STORE(f, x))} an acyclic CALL.
The CALL's SINK carries arg "cost" (`mark`): lowering (lower/kernelize.py) then takes the stores as the partition and
drops its own fusion heuristics."""
from __future__ import annotations
import math, os, time
from egraph.errors import CallsatError
from egraph.dtype import dtypes
from egraph.ir import Node, Ops, GroupOp, empty_view, toposort, HOST_DEVICES
from egraph.encode import Encoding
from egraph.extract import EGraphView, ChosenIds, INF
from egraph.report import PartitionReport
from egraph.timemodel import TimeModel, KernelWork, NoTimeModel, TRANSCENDENTAL, DIVISION

MODES = ("rules", "cost")
EXACT_MAX = 12            # candidates up to which every partition is enumerated (2^12 = 4096 costings, each incremental)
MAX_CANDIDATES = 4096     # more are left fused: the local search's passes stay linear-ish on 10k-node graphs
COST_SINK = "cost"        # the SINK arg of a cost-mode CALL
SOLVER_SHARE, SOLVER_FLOOR_S = 0.25, 0.05   # the solver's time: this share of what callify spent before it, at least the floor
MARGIN = 0.10             # a partition other than the rules-like one must be predicted this much faster (the model's error)
NESTED_REDUCE_WORK = 1 << 15   # lower/kernelize's: a REDUCE this big below another REDUCE or an ALU op is realized

def solver_deadline(spent: float, budget_deadline: float = INF) -> float:
  """When the partition search stops: callify's remaining budget, and a share of what callify spent so far (the
  extraction must stay a small part of callify: the local search's last passes rarely pay for themselves)."""
  return min(budget_deadline, time.perf_counter() + max(SOLVER_FLOOR_S, SOLVER_SHARE * spent))

def fusion_mode(value: str | None = None) -> str:
  """`value`, else env CALLSAT_FUSION (read now, when callify runs), else "rules"."""
  m = value if value is not None else (os.environ.get("CALLSAT_FUSION", "") or "rules")
  if m not in MODES: raise CallsatError(f"callify: fusion must be one of {MODES}, got {m!r}")
  return m

def time_model(enc: Encoding) -> TimeModel | None:
  """The time model of the device every realize point is on, or None (several devices, a host or sharded device, no
  calibration): cost mode then keeps the rules."""
  devs = {k.device for k in enc.keys}
  if len(devs) != 1 or not isinstance(d := next(iter(devs)), str) or d.split(":")[0] in HOST_DEVICES: return None
  try: return TimeModel.load(d)
  except NoTimeModel: return None

# ---- candidates, at insertion -----------------------------------------------------------------------------------------

_COMPUTED = frozenset(o.name for o in GroupOp.ALU | {Ops.REDUCE, Ops.CAST})
_MOVES = frozenset(o.name for o in GroupOp.Movement)
_MARKERS = ("DETACH", "CONTIGUOUS_BACKWARD")

def _widens(n: Node) -> bool: return n.op is Ops.EXPAND and any(s == 1 and t != 1 for s, t in zip(n.src[0].shape, n.arg))

def add_candidates(enc: Encoding, limit: int = MAX_CANDIDATES) -> dict[int, str]:
  """Mint a fresh buffer view for every candidate intermediate of `enc` and emit its (candidate x f) row. Returns
  {candidate id: why}. Left out: sources of a CONTIGUOUS (already realize points: a second stored form would merge the
  realized class with its own computation), assign targets and STORE targets, symbolic and sharded values."""
  orig, nodes = enc.original, enc.nodes
  base: dict[int, tuple[int, bool]] = {}   # movement id -> (id below the movement chain, an EXPAND widened on the way)
  uses: dict[int, int] = {}
  why: dict[int, str] = {}
  out_of: set[int] = set()
  for i, (op, _, kids) in orig.items():   # ids are in insertion order: children first
    if op in _MOVES and nodes[i] is not None:
      b, w = base.get(kids[0], (kids[0], False)); base[i] = (b, w or _widens(nodes[i])); continue
    if op == "CONTIGUOUS":
      k = kids[0]
      while k in orig and orig[k][0] in _MARKERS: k = orig[k][2][0]
      out_of.add(k)
    if op in ("AFTER", "STORE") and kids: out_of.add(base.get(kids[0], (kids[0], False))[0])
    for k in set(kids):
      b, w = base.get(k, (k, False))
      uses[b] = uses.get(b, 0) + 1
      if w: why.setdefault(b, "broadcast")
  for i, (op, _, _) in orig.items():
    if op == "REDUCE": why[i] = "reduce"
    elif uses.get(i, 0) > 1: why.setdefault(i, "shared")
  out: dict[int, str] = {}
  for i in sorted(why):
    n = nodes[i]
    if len(out) >= limit or n is None or i in out_of or orig.get(i, ("",))[0] not in _COMPUTED: continue
    if not isinstance(n.device, str) or n.device.split(":")[0] in HOST_DEVICES or n.device.startswith("DISK"): continue
    if not all(isinstance(d, int) for d in n.shape) or n.numel == 0 or not n.dtype.itemsize: continue
    f = empty_view(n.shape, n.dtype, n.device)
    enc.fresh_buffers.add(f.base.arg.uid)
    enc.row("candidate_row", i, enc.emit_tree(f, original=False))
    out[i] = why[i]
  return out

def stored_members(g: EGraphView, enc: Encoding, cands) -> dict[int, tuple[int, int]]:
  """Candidate class -> (its AFTER e-node, the STORE e-node inside it): the stored forms store_candidate added."""
  fresh = {r[0]: r[1] for r in enc.rows.get("candidate_row", ())}
  out = {}
  for i in cands:
    k, fc = g.class_of_id[i], g.class_of_id[fresh[i]]
    for s in g.parents[k]:
      if g.op[s] != "STORE" or g.kids[s] != (fc, k): continue
      a = next((a for a in g.parents[g.cls[s]] if g.op[a] == "AFTER" and g.cls[a] == k and g.kids[a] == (fc, g.cls[s])), None)
      if a is not None: out[k] = (a, s); break
  return out

class StoredIds(ChosenIds):
  """The extracted DAG (driver.build_call's IdDag) with the classes in `stored` read through their stored member; the
  STORE inside reads the computed form, the id ~k."""
  def __init__(self, g: EGraphView, choice: list[int], stored: dict[int, tuple[int, int]]):
    super().__init__(g, choice)
    self.stored = stored
    self.store_of = {g.cls[s]: k for k, (_, s) in stored.items()}   # store class -> its candidate class

  def enode(self, k: int) -> int:
    if k < 0: return super().enode(~k)
    return self.stored[k][0] if k in self.stored else super().enode(k)

  def kids(self, k: int) -> list[int]:
    ks = super().kids(k)
    if (c := self.store_of.get(k)) is not None and c in self.stored: ks = [~x if x == c else x for x in ks]
    return ks

def mark(call: Node) -> Node:
  """The CALL with its SINK marked as a cost-mode partition (lowering then adds no realize points of its own)."""
  body = call.src[0]
  return Node(Ops.CALL, call.dtype, (Node(Ops.SINK, body.dtype, body.src, COST_SINK), *call.src[1:]), call.arg)

# ---- the partition cost ------------------------------------------------------------------------------------------------

_LOADS = frozenset({Ops.BUFFER, Ops.PARAM, Ops.SLICE, Ops.AFTER})
_FREE = frozenset({Ops.CONST, Ops.BITCAST, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.COPY, Ops.MULTI}) | GroupOp.Movement

def _unview(n: Node) -> Node:
  while n.op in GroupOp.Movement and n.op is not Ops.PAD: n = n.src[0]
  return n

_IDENT = frozenset({Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CONTIGUOUS, Ops.COPY})

def _unview_id(n: Node) -> Node:
  while n.op in GroupOp.Movement or n.op in _IDENT: n = n.src[0]
  return n

def _storage_root(n: Node) -> Node:
  while n.src and n.op not in (Ops.BUFFER, Ops.PARAM): n = n.src[0]
  return n

class Kernels:
  """KernelWork of one kernel per root value (a STORE's value, or a stored candidate), read off the IR, for a given set
  of stored candidate node ids; `region(root)` is the candidates a kernel reaches when nothing is stored."""
  def __init__(self, cand_ids: set[int], device: str = "CPU"):
    self.cands, self.device = cand_ids, device

  def walk(self, root: Node, stored) -> tuple[dict[int, int], list[Node], set[int]]:
    """(evaluations per node id, the nodes consumers first, candidates reached) of the kernel computing `root`."""
    order, seen, stack, reached = [], set(), [(root, False)], set()
    while stack:   # iterative post-order, then reversed: consumers before their sources
      n, done = stack.pop()
      if done: order.append(n); continue
      if n.id in seen: continue
      seen.add(n.id)
      if n is not root and n.id in self.cands: reached.add(n.id)
      stack.append((n, True))
      if n.op in _LOADS or (n is not root and n.id in stored): continue
      stack.extend((s, False) for s in n.src if s.id not in seen)
    order.reverse()
    evals = {root.id: root.numel}
    for n in order:
      m = evals.get(n.id, 0)
      if n.op in _LOADS or (n is not root and n.id in stored): continue
      f = n.src[0].numel // max(n.numel, 1) if n.op is Ops.REDUCE else 1
      for s in n.src: evals[s.id] = max(evals.get(s.id, 0), m * f)   # a shared value is memoized within one scope
    return evals, order, reached

  def work(self, root: Node, written: int, stored, walked=None) -> KernelWork:
    """walked: this kernel's walk (evaluations, order) when the caller already has it."""
    evals, order = walked or self.walk(root, stored)[:2]
    flops = trans = divs = execs = distinct = 0
    reads: dict[int, list] = {}
    red = False
    for n in order:
      m = evals.get(n.id, 0)
      if n.op in _LOADS or (n is not root and n.id in stored):
        s = n if n.id in stored else _storage_root(n)
        r = reads.setdefault(s.id, [0, s.nbytes if s.shape is not None else 0])
        r[0] += min(m, n.numel) * n.dtype.itemsize
        execs, distinct = execs + m, distinct + min(m, n.numel)
      elif n.op is Ops.REDUCE: red, flops = True, flops + m * (n.src[0].numel // max(n.numel, 1))
      elif n.op in GroupOp.ALU or n.op is Ops.CAST:
        flops += m
        if n.op in TRANSCENDENTAL: trans += m
        elif n.op in DIVISION: divs += m
    bread = sum(min(a, cap) if cap else a for a, cap in reads.values())
    return KernelWork(bread, written, flops, self.kind(root, stored, red, flops), self.device, trans, 0,
                      1 - distinct / execs if execs else 0.0, divs)

  def kind(self, root: Node, stored, red: bool, flops: int) -> str:
    """"matmul" where lower/ tiles: a float32 sum over one axis of a product of two operands read from memory."""
    if root.op is Ops.REDUCE and root.arg[0] is Ops.ADD and len(root.arg[1]) == 1 and root.dtype == dtypes.float32 and \
       (mul := _unview(root.src[0])).op is Ops.MUL and root.numel >= 256 and root.src[0].numel // root.numel >= 4 and \
       all((x := _unview(s)).op in _LOADS or x.id in stored for s in mul.src): return "matmul"
    return "reduce" if red else "copy" if flops == 0 else "elementwise"

class Partition:
  """The kernels of a CALL body (its STOREs) and the candidates that may be stored; `cost(S)` in model seconds.
  A kernel's work depends only on the stored candidates its walk meets (its boundary), so kernel times are memoized
  by (root, boundary), and a flip of candidate c re-costs only the kernels whose walk meets c (`State`)."""
  def __init__(self, model: TimeModel, stores: list[tuple[Node, int]], cands: dict[int, Node]):
    self.model, self.stores, self.cands = model, stores, cands   # stores: (value, bytes written); cands: node id -> node
    self.k = Kernels(set(cands), model.device)
    self.memo: dict = {}
    self.evaluations = 0

  def kernel(self, root: Node, written: int, S) -> tuple[float, frozenset]:
    """(seconds, candidates its walk meets) of the kernel computing `root` with the candidates in S stored."""
    evals, order, reached = self.k.walk(root, S)
    key = (root.id, frozenset(c for c in reached if c in S))
    if (t := self.memo.get(key)) is None:
      self.evaluations += 1
      t = self.memo[key] = self.model.kernel_seconds(self.k.work(root, written, key[1], (evals, order)))
    return t, frozenset(reached)

  def roots(self, S) -> list[tuple]:
    """(key, value, bytes written) of every kernel with S stored: the body's STOREs, then each stored candidate."""
    return [(("s", j), v, w) for j, (v, w) in enumerate(self.stores)] + [(("c", c), self.cands[c], self.cands[c].nbytes) for c in sorted(S)]

  def cost(self, S) -> float: return sum(self.kernel(v, w, S)[0] for _, v, w in self.roots(S))

  def lower_bound(self) -> float:
    """A floor under every partition: one launch, every input read and every output written once at cache bandwidth,
    each value computed once at the fastest kind's throughput (every kernel pays at least its share of each)."""
    m, allc = self.model, frozenset(self.cands)
    works = [self.k.work(v, w, allc) for v, w in self.stores] + [self.k.work(n, 0, allc) for n in self.cands.values()]
    inputs: dict[int, int] = {}   # storage root -> the most of it one load reads (every partition reads it somewhere)
    for v, _ in self.stores:
      evals, order, _ = self.k.walk(v, allc)
      for n in order:
        if n.op in _LOADS: r = _storage_root(n); inputs[r.id] = max(inputs.get(r.id, 0), min(min(evals.get(n.id, 0), n.numel) * n.dtype.itemsize, r.nbytes))
    tb = (sum(inputs.values()) + sum(w for _, w in self.stores)) / m.bw_cache
    tc = sum(m.ops(w) for w in works) / max(m.throughput.values())
    return m.launch_s + (max(tb, tc) if m.combine == "max" else tb + tc)

def rules_like(p: Partition, deadline: float = INF) -> frozenset | None:
  """The candidates lower/'s rules-mode heuristics realize, per STORE value (a copy of lower/kernelize._nested_reduces
  and of the builder's REDUCE-under-a-broadcast split: egraph does not import lower/): the solver's anchor, so that
  cost mode is never predicted slower than the rules. None past `deadline` (each STORE's whole region is walked)."""
  out: set[int] = set()
  big = lambda r: r.op is Ops.REDUCE and math.prod(r.src[0].shape) >= NESTED_REDUCE_WORK
  for v, _ in p.stores:
    if time.perf_counter() > deadline: return None
    order, seen, stack = [], set(), [(v, False)]   # the kernel's region: down to storage (AFTER reads are loads)
    while stack:
      n, done = stack.pop()
      if done: order.append(n); continue
      if n.id in seen: continue
      seen.add(n.id); stack.append((n, True))
      if n.op not in _LOADS: stack.extend((s, False) for s in n.src if s.id not in seen)
    under, nested = set(), set()
    for n in reversed(order):
      if n.op is Ops.REDUCE or n.id in under: under.update(s.id for s in n.src)
    for n in order:
      if n.op in GroupOp.ALU: nested.update(c.id for c in map(_unview_id, n.src) if big(c))
      if n.id not in under or n.shape is None: continue
      if big(n): nested.add(n.id)
      elif n.op is Ops.EXPAND and math.prod(n.shape) >= NESTED_REDUCE_WORK:
        c = _unview_id(n.src[0])
        if (c.op in GroupOp.ALU or c.op is Ops.REDUCE) and math.prod(c.shape) > 1: nested.add(c.id)
    walked, stack = set(), [(v, False, True)]   # the builder's walk: a REDUCE reached under a widening EXPAND is split
    while stack:
      n, b, top = stack.pop()
      if (n.id, b) in walked or n.op in _LOADS: continue
      walked.add((n.id, b))
      if not top and (n.id in nested or (n.op is Ops.REDUCE and b)): out.add(n.id); b = False   # its own kernel
      stack.extend((s, b or _widens(n), False) for s in n.src)
  return frozenset(out & set(p.cands))

class Late(Exception):
  """The solver's deadline passed while a partition was being costed."""

class State:
  """A partition being searched: the stored set, each kernel's time and the candidates it meets, and per candidate
  the kernels that meet it (only they change when it flips). Costing stops with Late past `deadline`."""
  def __init__(self, p: Partition, S: frozenset, deadline: float = INF):
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

def _state(p: Partition, S: frozenset, deadline: float) -> State | None:
  try: return State(p, S, deadline)
  except Late: return None

def solve(p: Partition, deadline: float = INF, exact_max: int = EXACT_MAX, passes: int = 3,
          margin: float = MARGIN) -> tuple[frozenset, PartitionReport]:
  """The cheapest set of candidates to store: every subset up to `exact_max` candidates (exact unless the deadline
  cuts it), above it a greedy local search (single flips, at most `passes` passes) from the cheaper of everything
  stored and the rules-like partition (each costed only while the deadline allows); the result is the rules-like
  partition unless predicted `margin` faster. The report gives the method, bound and gap."""
  t0 = time.perf_counter()
  cs = sorted(p.cands)
  R = rules_like(p, deadline) if cs else frozenset()
  done, fused = True, None
  if len(cs) <= exact_max:
    st = State(p, frozenset())
    fused = best = st.total
    bestS, method = frozenset(), "exact"
    for code in range(1, 1 << len(cs)):   # Gray code: each step flips one candidate (an incremental costing)
      if time.perf_counter() > deadline: done = False; break
      st.apply(*st.delta(cs[(code & -code).bit_length() - 1]))
      if st.total < best - 1e-15: best, bestS = st.total, st.S
    best = opt = p.cost(bestS) if cs else best   # re-summed: incremental updates accumulate rounding
    rules_t = best if not cs else p.cost(R) if R is not None else None
  else:
    method = "greedy"
    st = State(p, frozenset(cs))   # small kernels: cheap to cost however big the graph
    rs = _state(p, R, deadline) if R is not None else None
    rules_t = rs.total if rs is not None else None
    if rs is not None and rs.total < st.total: st = rs
    for _ in range(passes):
      improved = False
      for c in cs:
        if time.perf_counter() > deadline: done = False; break
        d, T, new = st.delta(c)
        if d < -1e-15: st.apply(d, T, new); improved = True
      if not improved or not done: break
    bestS, best = st.S, math.fsum(st.t.values())
    opt = best
  if rules_t is not None and R is not None and bestS != R and best > rules_t * (1 - margin): bestS, best, method = R, rules_t, method + ", rules-like kept"
  if method.startswith("exact") and done: bound = opt
  else: bound = min(p.lower_bound(), opt) if time.perf_counter() < deadline else p.model.launch_s
  rep = PartitionReport(method + ("" if done else " (stopped at the deadline)"), len(cs), len(bestS), best, fused, bound,
                        (best - bound) / best if best > 0 else 0.0, max(deadline - t0, 0.0) if deadline < INF else None,
                        time.perf_counter() - t0, p.evaluations, rules_t)
  return bestS, rep

def partition_ids(g: EGraphView, choice: list[int], terms: dict[int, Node], root_classes: list[int], enc: Encoding,
                  cands, model: TimeModel, deadline: float = INF) -> tuple[StoredIds, PartitionReport]:
  """The extracted DAG with the cheapest partition's candidates stored, and the report: the kernels are the STOREs of
  the realized terms (`terms`: the decoded extraction) plus each stored candidate."""
  members = stored_members(g, enc, cands)
  stores = [(n.src[1], n.src[1].nbytes) for n in toposort([terms[c] for c in root_classes], enter_calls=False)
            if n.op is Ops.STORE and n.src[1].shape is not None]
  cls_of = {terms[k].id: k for k in members if k in terms}
  S, rep = solve(Partition(model, stores, {i: terms[k] for i, k in cls_of.items()}), deadline)
  return StoredIds(g, choice, {cls_of[i]: members[cls_of[i]] for i in S}), rep
