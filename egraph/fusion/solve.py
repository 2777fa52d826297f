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
import dataclasses, itertools, math, os, time
from operator import attrgetter
from egraph.ir.errors import CallsatError
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Node, Ops, GroupOp, empty_view, toposort, HOST_DEVICES
from egraph.engine.encode import Encoding
from egraph.engine.extract import EGraphView, ChosenIds, INF
from egraph.engine.report import PartitionReport
from egraph.fusion.timemodel import TimeModel, KernelWork, NoTimeModel, TRANSCENDENTAL, DIVISION, STREAM_BYTES
from egraph.fusion.policy import COST_SINK
from egraph.fusion.greedy import LOADS as _LOADS, hoisted, node_ops as _node_ops, Late, search as _search, worth_flipping, rules_realized

MODES = ("rules", "cost")
EXHAUSTIVE_MAX = 6          # candidates up to which every subset is costed (64 partitions: 0.2-10 ms on the corpus; HiGHS took 14-54 ms)
MILP_MAX_CANDIDATES = 64    # candidates up to which HiGHS runs after the greedy: 20 take it ~6 s, 120 over 60 s (notes/fusion.md)
MILP_MAX_TERMS = 60_000     # nonzeros of the MILP's rows: a bigger one is not built (the build and solve outgrow the budget)
MILP_ROUNDS = 2           # MILP solves: constants from the rules-like partition, then from the first answer
LOCAL_RESERVE = 0.3       # of the solver's remaining time, at most 0.5 ms per candidate, kept from HiGHS for the local search
MIP_GAP = 0.01            # HiGHS stops within 1 % of its bound: the model is not that accurate (MARGIN), the search is costly
MAX_CANDIDATES = 4096     # more are left fused: the local search's passes stay linear-ish on 10k-node graphs
SOLVER_SHARE, SOLVER_FLOOR_S = 0.1, 0.05   # the solver's time: this share of what callify spent before it (extraction must stay under
                                           # 20 % of callify: a 25 % share could not), at least the floor
COST_S_PER_CLASS = 1e-5   # per class reached, a floor under decoding, toposort, rules_like and one costing: 10 us on the 10k transformer,
                          # 540 on the 10k dag (overlapping kernels)
SHARED_MAX_NODES = int(SOLVER_FLOOR_S / COST_S_PER_CLASS)   # 5000: above, the solver's budget (10 % of ~40 us per node) never covers a costing
MARGIN = 0.10             # a partition other than the rules-like one must be predicted this much faster (the model's error)

def solver_deadline(spent: float, budget_deadline: float = INF) -> float:
  """When the partition search stops: callify's remaining budget, and a share of what callify spent so far (the
  extraction must stay a small part of callify: the local search's last passes rarely pay for themselves)."""
  return min(budget_deadline, time.perf_counter() + max(SOLVER_FLOOR_S, SOLVER_SHARE * spent))

def fusion_mode(value: str | None = None) -> str:
  """`value`, else env CALLSAT_FUSION (read now, when callify runs), else "cost"."""
  m = value if value is not None else (os.environ.get("CALLSAT_FUSION", "") or "cost")
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

# ---- candidates, at insertion -----------------------------------------------------------------------------------------

_COMPUTED = frozenset(o.name for o in GroupOp.ALU | {Ops.REDUCE, Ops.CAST})
_MOVES = frozenset(o.name for o in GroupOp.Movement)
_MARKERS = frozenset(o.name for o in GroupOp.ValueMarker)

def _widens(n: Node) -> bool: return n.op is Ops.EXPAND and any(s == 1 and t != 1 for s, t in zip(n.src[0].shape, n.arg))

def add_candidates(enc: Encoding, limit: int = MAX_CANDIDATES) -> dict[int, str]:
  """Mint a fresh buffer view for every candidate intermediate of `enc` and emit its (candidate x f) row. Returns
  {candidate id: why}. Above SHARED_MAX_NODES inserted nodes a shared value is no candidate: no partition can be
  costed in the solver's budget there (partition_ids), so the answer is the rules-like one, which stores only reduces
  and broadcast operands; stored forms of shared values would only grow the e-graph (callify runs the rules there,
  cost_plan; the bridge's hints take that answer). Left out: sources of a CONTIGUOUS (already realize points: a second
  stored form would merge the realized class with its own computation), assign targets and STORE targets, symbolic and
  sharded values."""
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
  shared = len(orig) <= SHARED_MAX_NODES
  for i, (op, _, _) in orig.items():
    if op == "REDUCE": why[i] = "reduce"
    elif shared and uses.get(i, 0) > 1: why.setdefault(i, "shared")
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
  out, op, kids, cls = {}, g.op, g.kids, g.cls
  for i in cands:   # both read the fresh buffer's class, whose parents are few (k's are all its users), in e-node order
    k, fc = g.class_of_id[i], g.class_of_id[fresh[i]]
    for s in (ps := g.parents_of(fc)):
      if op[s] != "STORE" or kids[s] != (fc, k): continue
      a = next((a for a in ps if op[a] == "AFTER" and cls[a] == k and kids[a] == (fc, cls[s])), None)
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

def mark(call: Node, temps: frozenset = frozenset()) -> Node:
  """The CALL with its SINK marked as a cost-mode partition (lowering then adds no realize points of its own) and
  `temps` as its temporary args (CallInfo.temps)."""
  body = call.src[0]
  return Node(Ops.CALL, call.dtype, (Node(Ops.SINK, body.dtype, body.src, COST_SINK), *call.src[1:]),
              dataclasses.replace(call.arg, temps=temps))

def temporaries(call: Node, enc: Encoding, buffer_map: dict[Node, Node]) -> frozenset:
  """The arg slots of the stored candidates' buffers. No tensor lives in them (none is the storage under a
  `buffer_map` value), so executors keep them in scratch memory, as lowering's own temporaries, instead of storage
  allocated on every realize."""
  cand = {enc.nodes[f].base.arg.uid for _, f in enc.rows.get("candidate_row", ())}
  held = {r.arg.uid for v in buffer_map.values() if (r := _storage_root(v)).op is Ops.BUFFER}
  return frozenset(i for i, a in enumerate(call.src[1:]) if a.op is Ops.BUFFER and a.arg.uid in cand and a.arg.uid not in held)

# ---- the partition cost ------------------------------------------------------------------------------------------------

_FREE = frozenset({Ops.CONST, Ops.BITCAST, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.COPY, Ops.MULTI}) | GroupOp.Movement

def _unview(n: Node) -> Node:
  while n.op in GroupOp.Movement and n.op is not Ops.PAD: n = n.src[0]
  return n

def _storage_root(n: Node) -> Node:
  while n.src and n.op not in (Ops.BUFFER, Ops.PARAM): n = n.src[0]
  return n

def _reduce_below(order: list[Node], root: Node, stored) -> set[int]:
  """Ids of the nodes of a kernel (`order`: consumers first) with a fused REDUCE at or below them: a loop, which LLVM
  does not hoist (greedy.hoisted applies only to loop-free sources)."""
  red: set[int] = set()
  for n in reversed(order):
    if n.op in _LOADS or (n is not root and n.id in stored): continue
    if n.op is Ops.REDUCE or any(s.id in red for s in n.src): red.add(n.id)
  return red

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
    evals, red = {root.id: root.numel}, _reduce_below(order, root, stored)
    for n in order:
      m = evals.get(n.id, 0)
      if n.op in _LOADS or (n is not root and n.id in stored): continue
      f = n.src[0].numel // max(n.numel, 1) if n.op is Ops.REDUCE else 1
      if n.op is Ops.EXPAND and n.src[0].id not in red: m = max(1, m // hoisted(n))   # loop-free: hoisted out of the loops it does not vary in
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
    dram = sum(min(a, cap) for i, (a, cap) in reads.items() if i in stored and cap >= STREAM_BYTES)   # streamed out, read from DRAM
    return KernelWork(bread, written, flops, self.kind(root, stored, red, flops), self.device, trans, 0,
                      1 - distinct / execs if execs else 0.0, divs, dram)

  def kind(self, root: Node, stored, red: bool, flops: int) -> str:
    """"matmul" where lower/ tiles: a matmul-shaped reduce whose two operands are read from memory."""
    if (xs := _matmul_operands(root)) is not None and all(x.op in _LOADS or x.id in stored for x in xs): return "matmul"
    return "reduce" if red else "copy" if flops == 0 else "elementwise"

def _matmul_operands(root: Node) -> tuple[Node, ...] | None:
  """The operands (below their views) of a matmul-shaped reduce: a float32 sum over one axis of a product, at least 256
  outputs each summing at least 4 products; lower/ tiles it when both are in memory."""
  if root.op is Ops.REDUCE and root.arg[0] is Ops.ADD and len(root.arg[1]) == 1 and root.dtype == dtypes.float32 and \
     (mul := _unview(root.src[0])).op is Ops.MUL and root.numel >= 256 and root.src[0].numel // root.numel >= 4:
    return tuple(_unview(s) for s in mul.src)
  return None

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

  def lower_bound(self, deadline: float = INF) -> float:
    """A floor under every partition: one launch, every input read and every output written once at cache bandwidth,
    each value computed once at the fastest kind's throughput (every kernel pays at least its share of each). Late past
    `deadline`."""
    m, allc, works = self.model, frozenset(self.cands), []
    for v, w in self.stores + [(n, 0) for n in self.cands.values()]:
      if time.perf_counter() > deadline: raise Late()
      works.append(self.k.work(v, w, allc))
    inputs: dict[int, int] = {}   # storage root -> the most of it one load reads (every partition reads it somewhere)
    for v, _ in self.stores:
      if time.perf_counter() > deadline: raise Late()
      evals, order, _ = self.k.walk(v, allc)
      for n in order:
        if n.op in _LOADS:
          r = _storage_root(n); inputs[r.id] = max(inputs.get(r.id, 0), min(min(evals.get(n.id, 0), n.numel) * n.dtype.itemsize, r.nbytes))
    tb = (sum(inputs.values()) + sum(w for _, w in self.stores)) / m.bw_cache
    tc = sum(m.ops(w) for w in works) / max(m.throughput.values())
    return m.launch_s + (max(tb, tc) if m.combine == "max" else tb + tc)

def rules_like(p: Partition, deadline: float = INF) -> frozenset | None:
  """The candidates lower/'s rules-mode heuristics realize in the kernels of p's STOREs (greedy.rules_realized): the
  solver's anchor, so that cost mode is never predicted slower than the rules. None past `deadline`."""
  out = rules_realized([v for v, _ in p.stores], _op, _src, _shape, deadline)
  return None if out is None else frozenset(n.id for n in out if n.id in p.cands)

_op, _src, _shape = attrgetter("op"), attrgetter("src"), attrgetter("shape")

class TooBig(Exception):
  """The ILP outgrew MILP_MAX_TERMS while being built."""

def scipy_milp():
  """(milp, LinearConstraint, Bounds, csr_array), or None where scipy (a dependency) cannot be imported: the greedy
  then runs. Imported here, where the solver runs (~0.45 s): neither rules mode, a few candidates, nor this module's
  import pays for it."""
  try:
    from scipy.optimize import milp, LinearConstraint, Bounds
    from scipy.sparse import csr_array
  except ImportError: return None
  return milp, LinearConstraint, Bounds, csr_array

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
    red = _reduce_below(order, v, frozenset())   # hoisting only where no REDUCE is fused below in any partition (else conservative)
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
        r = _storage_root(n)
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
    mm, xs = None, _matmul_operands(v)
    if xs is not None and all(x.op in _LOADS or (x is not v and x.id in p.cands) for x in xs):
      mv = self.var(0, 1)
      for y in [rv] + [self.s[x.id] for x in xs if x.op not in _LOADS]: self.ge([(y, 1), (mv, -1)], 0)
      mm = (mv, _node_ops(m, v, evals[v.id]) + _node_ops(m, mul := _unview(v.src[0]), evals.get(mul.id, 0)))
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

def solve(p: Partition, deadline: float = INF, method: str = "auto", passes: int = 3, margin: float = MARGIN,
          rounds: int = MILP_ROUNDS) -> tuple[frozenset, PartitionReport]:
  """The cheapest set of candidates to store. Up to EXHAUSTIVE_MAX candidates (auto): every subset costed. Else first
  the greedy: single flips (at most `passes` passes) from the cheaper of all-stored and the rules-like partition.
  Then "milp" (auto: up to MILP_MAX_CANDIDATES and MILP_MAX_TERMS, with scipy): the Ilp with its constants from the
  rules-like partition, then (`rounds`) from its own answer, until the deadline; an answer better than the greedy's
  is re-costed by Partition.cost and polished by the local search. The result is the rules-like partition unless
  predicted `margin` faster; the report gives the method, bound and gaps."""
  t0 = time.perf_counter()
  cs, notes = sorted(p.cands), []
  budget = max(deadline - t0, 0.0) if deadline < INF else None
  R = rules_like(p) if cs else frozenset()   # the anchor and the out-of-time answer: linear (partition_ids leaves it the time)
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
  ilp, found, anchor = None, None, None   # found: (true cost, S, objective, bound, mip gap, cut)
  if sp is not None:
    anchor = p.cost(R if R is not None else frozenset(cs))
    try: ilp = Ilp(p, anchor, MILP_MAX_TERMS if method == "auto" else 1 << 62, deadline)
    except TooBig: notes.append(f"ILP over {MILP_MAX_TERMS} terms: greedy")
    except Late: notes.append("out of time building the ILP: greedy")
  starts = ([] if R is None else [R]) + [frozenset(cs)]   # the anchor first: whatever else is costed, the margin test has it
  if flips is not cs:   # the anchor first (fewer kernels to cost), then every flippable candidate stored, if different
    starts = [R if R is not None else frozenset()]; starts += [x] if (x := frozenset(flips) | starts[0]) != starts[0] else []
  st, done, totals = _search(p, starts, flips, deadline, passes)
  rules_t = None if R is None else anchor if anchor is not None else totals.get(R)
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

def partition_ids(g: EGraphView, choice: list[int], terms, root_classes: list[int], enc: Encoding,
                  cands, model: TimeModel, deadline: float = INF) -> tuple[StoredIds, PartitionReport]:
  """The extracted DAG with the cheapest partition's candidates stored, and the report: the kernels are the STOREs of
  the realized terms (`terms`: the decoded extraction, extract.Terms: the classes it reaches, and its terms, read only
  when there is time to cost) plus each stored candidate. When decoding and one costing of the graph cannot fit before
  `deadline` (COST_S_PER_CLASS per class reached), nothing is costed: the rules-like partition is read off the e-class
  ids (`rules_like_ids`)."""
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
  S, rep = solve(Partition(model, stores, {i: terms[k] for i, k in cls_of.items()}), deadline)
  return StoredIds(g, choice, {cls_of[i]: members[cls_of[i]] for i in S}), rep

_OPS = {o.name: o for o in Ops}

def rules_like_ids(g: EGraphView, choice: list[int], reached: list[int], members, deadline: float = INF) -> frozenset:
  """fusion.rules_like over the extracted DAG's e-class ids, without decoding: ops from the chosen e-nodes, sources
  their child classes (a V node's Cons list flattened, as ChosenIds does), shapes from each class's inserted IR node
  (g.info; None: unknown, never big). Past `deadline` (it is linear: only a pathological graph gets there) nothing is
  stored."""
  es = list(map(choice.__getitem__, reached))
  if -1 in es: ChosenIds(g, choice).enode(reached[es.index(-1)])   # raises Unextractable, as decoding would
  op = dict(zip(reached, map(_OPS.get, map(g.op.__getitem__, es))))
  src = dict(zip(reached, map(g.kids.__getitem__, es)))
  if None in op.values():   # a V node's Cons / Nil list: its elements are the sources
    ids = ChosenIds(g, choice)
    for k, ks in src.items():
      if len(ks) == 1 and ks[0] in op and op[ks[0]] is None: src[k] = ids.kids(k)
  info = g.info
  def shape(k: int): return None if (n := info[k]) is None else n.shape
  values = [v for k, o in op.items() if o is Ops.STORE and len(ks := src[k]) == 2 and (info[v := ks[1]] is None or info[v].shape is not None)]
  out = rules_realized(values, op.__getitem__, src.__getitem__, shape, deadline)
  return frozenset() if out is None else frozenset(k for k in out if k in members)
