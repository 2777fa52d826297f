"""Floor 3, fusion by cost: a partition problem (`Partition`: candidates, their kernels, `cost(S)`), the anchors (callsat's
rules: `rules_like`, `rules_like_ids`; tinygrad's own schedule: `tinygrad_like`) and the problem read off an extraction
(`partition_ids`)."""
from __future__ import annotations
import time
from operator import attrgetter
from egraph.ir.ops import Node, Ops
from egraph.engine.extract import EGraphView, ChosenIds, INF
from egraph.fusion.timemodel import TimeModel
from egraph.fusion.greedy import LOADS as _LOADS, Late, rules_realized
from egraph.fusion.kernels import Kernels, storage_root
from egraph.fusion.stock import tinygrad_realized
from egraph.fusion.policy import PASS_THROUGH

class Partition:
  """The kernels of a CALL body (its STOREs) and the candidates that may be stored; `cost(S)` in model seconds.
  A kernel's work depends only on the stored candidates its walk meets (its boundary), so kernel times are memoized
  by (root, boundary), and a flip of candidate c re-costs only the kernels whose walk meets c (`State`)."""
  def __init__(self, model: TimeModel, stores: list[tuple[Node, int]], cands: dict[int, Node]):
    self.model, self.stores, self.cands = model, stores, cands   # stores: (value, bytes written); cands: node id -> node
    self.k = Kernels(set(cands), model.device, model.hoists)
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
          r = storage_root(n); inputs[r.id] = max(inputs.get(r.id, 0), min(min(evals.get(n.id, 0), n.numel) * n.dtype.itemsize, r.nbytes))
    tb = (sum(inputs.values()) + sum(w for _, w in self.stores)) / m.bw_cache
    tc = sum(m.ops(w) for w in works) / max(m.throughput.values())
    return m.launch_s + (max(tb, tc) if m.combine == "max" else tb + tc)

def rules_like(p: Partition, deadline: float = INF) -> frozenset | None:
  """The candidates lower/'s rules-mode heuristics realize in the kernels of p's STOREs (greedy.rules_realized): the
  solver's anchor, so that cost mode is never predicted slower than the rules. None past `deadline`."""
  out = rules_realized([v for v, _ in p.stores], _op, _src, _shape, deadline)
  return None if out is None else frozenset(n.id for n in out if n.id in p.cands)

def tinygrad_like(p: Partition) -> frozenset:
  """The candidates tinygrad 0.14's rangeify stores in the kernels of p's STOREs (fusion/stock.py): the bridge's anchor.
  A stored view (a RESHAPE of a REDUCE) names the candidate it views."""
  out = set()
  for n in tinygrad_realized([v for v, _ in p.stores]):
    while n.id not in p.cands and n.op in PASS_THROUGH and n.src: n = n.src[0]
    if n.id in p.cands: out.add(n.id)
  return frozenset(out)

_op, _src, _shape = attrgetter("op"), attrgetter("src"), attrgetter("shape")

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
