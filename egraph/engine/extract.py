"""Extraction in Python over `EGraph.freeze()`: a bottom-up Knuth/Dijkstra pass picks one e-node per e-class by tree
cost (exact, Python ints, cycles are fine), then the chosen DAG is costed with every shared e-node counted once.
egglog's own extractor is tree-cost only and blows up on shared DAGs, so it is not used. Given an `abort_at` time
(time.perf_counter()), the loops check it every TICK steps and raise OutOfBudget once it has passed."""
from __future__ import annotations
import collections, collections.abc, functools, heapq, itertools, operator, time
import numpy as np
from egraph.ir.ops import Node, Ops
from egraph.engine.encode import Encoding, COMPUTED_TARGET
from egraph.engine.cost import CostModel
from egraph.ir.errors import EngineError
from egraph.engine.runner import OutOfBudget, checkpoint

TICK = 4096   # loop steps between deadline checks (~1 ms of work)
INF = float("inf")

class Unextractable(EngineError):
  """An e-class needed for the CALL has no extractable e-node (a run stopped before the rule that gives it one)."""

_CTORS = ("L", "U", "B", "R", "V", "Cons", "Nil")
_ARITY = {"L": 0, "U": 1, "B": 2, "R": 3, "V": 1, "Cons": 2, "Nil": 0}   # child classes per constructor
_MAXA = max(_ARITY.values())
_PRICED = frozenset({"STORE", "BUFFER", "PARAM", "SLICE"})   # the ops CostModel.enode_cost prices beyond `nodes`
_SPECIAL = _PRICED | {"CONTIGUOUS", "AFTER", "Cons", "Nil", "FUNCTION"}   # local_costs looks at these one by one
_STORAGE_FORMS = frozenset({"AFTER", "SLICE", "BUFFER", "PARAM", "RESHAPE", "SHRINK", "PERMUTE", "FLIP", "MULTI"})

_INPUTS, _OUTPUT, _SUBSUMED = operator.attrgetter("inputs"), operator.attrgetter("output"), operator.attrgetter("subsumed")

def _first_numbers(seq: np.ndarray) -> tuple[np.ndarray, int]:
  """(each element's number in order of first appearance, how many distinct): dict.fromkeys's numbering in C. Raw
  e-class ids are dense, so each id's first position is found in a table over them (np.unique's sort where not)."""
  if not len(seq): return seq, 0
  lo, hi = int(seq.min()), int(seq.max())
  if hi - lo > 4 * len(seq) + 4096:
    _, first, inv = np.unique(seq, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64); rank[np.argsort(first)] = np.arange(len(first))
    return rank[inv.ravel()], len(first)
  x = seq - lo
  first = np.full(hi - lo + 1, len(x)); np.minimum.at(first, x, np.arange(len(x)))   # each id's first position
  starts = np.zeros(len(x) + 1, np.int64); starts[first] = 1   # 1 where an id first appears (the sentinel len(x) too)
  rank = np.cumsum(starts[:-1]) - 1
  return rank[first[x]], int(rank[-1]) + 1

def _raw_ids(fns, i64) -> bool:
  """Does value_to_i64 read an e-class Value's raw id (its printed form Value(id))? Checked on one row, else Values are
  hashed."""
  rows = next((f.rows for n in _CTORS if n in fns and (f := fns[n]).rows), None)
  if rows is None: return False
  try: return str(v := rows[0].output) == f"Value({i64(v)})"
  except Exception: return False   # noqa: BLE001 -- a panic from egglog's typed accessor: not raw

class EGraphView:
  """The frozen e-graph as flat Python lists: e-nodes (class, op, arg id, child classes) and class facts."""
  def __init__(self, frozen, egraph, enc: Encoding, abort_at: float = INF):
    self.enc, fns = enc, frozen.functions
    vstr, i64 = egraph.value_to_string, egraph.value_to_i64
    # each row's inputs as int64 columns in one C-level pass: Values as their raw ids where egglog 13.2's value_to_i64
    # reads them (a C call; hashing a Value costs several times more; a String Value's raw id is its interned index),
    # else interned as met (the arg column then read again with value_to_i64)
    raw = _raw_ids(fns, i64)
    conv = i64 if raw else collections.defaultdict(itertools.count().__next__).__getitem__
    self.op, self.arg, seqs, blocks = [], [], [], []   # blocks: per constructor, (rows, arity)
    for name in _CTORS:
      if name not in fns: continue
      checkpoint(abort_at, "reading the e-graph")
      rows = fns[name].rows
      if any(map(_SUBSUMED, rows)): rows = [r for r in rows if not r.subsumed]
      n, a, skip = len(rows), _ARITY[name], 0 if name in ("Cons", "Nil") else 2
      cols = np.fromiter(map(conv, itertools.chain.from_iterable(map(_INPUTS, rows))), np.int64, n * (skip + a)).reshape(n, skip + a)
      if skip:
        ops = cols[:, 0].tolist()
        smap = {v: vstr(rows[r].inputs[0]) for v, r in dict(zip(ops, range(n))).items()}   # one string per op
        self.op += map(smap.__getitem__, ops)
        self.arg += cols[:, 1].tolist() if raw else map(i64, map(operator.itemgetter(1), map(_INPUTS, rows)))
      else: self.op += [name] * n; self.arg += [0] * n
      seq = np.empty((n, 1 + a), np.int64)   # each row's output before its children: the numbering's order
      seq[:, 0] = np.fromiter(map(conv, map(_OUTPUT, rows)), np.int64, n); seq[:, 1:] = cols[:, skip:]
      seqs.append(seq.ravel()); blocks.append((n, a))
    nrows = fns["N"].rows
    seqs.append(np.fromiter(map(conv, map(_OUTPUT, nrows)), np.int64, len(nrows)))
    num, self.n_classes = _first_numbers(np.concatenate(seqs))   # classes numbered in first appearance
    checkpoint(abort_at, "reading the e-graph")
    ne, at = len(self.op), 0
    self.cls_array = np.empty(ne, np.int64)          # the class and child-class columns as arrays (extract._forced)
    self.kid_array = np.full((ne, _MAXA), -1, np.int64)   # -1: no child there
    self.kids: list[tuple[int, ...]] = []
    for (n, a), e0 in zip(blocks, itertools.accumulate([n for n, _ in blocks], initial=0)):
      b = num[at:at + n * (1 + a)].reshape(n, 1 + a); at += n * (1 + a)
      self.cls_array[e0:e0 + n], self.kid_array[e0:e0 + n, :a] = b[:, 0], b[:, 1:]
      self.kids += zip(*b[:, 1:].T.tolist()) if a else [()] * n
    self.cls: list[int] = self.cls_array.tolist()
    ncls = num[at:].tolist()
    self.class_of_id = dict(zip(map(i64, itertools.chain.from_iterable(map(_INPUTS, nrows))), ncls))
    # each e-node's distinct child classes (Knuth's pending counts), a child counted at its first position, and the
    # parents of each class from those (e-nodes ascending, each once) as one list cut at parent_at, class by class
    km = self.kid_array
    first = km >= 0
    for j in range(1, _MAXA): first[:, j] &= np.logical_and.reduce([km[:, j] != km[:, i] for i in range(j)])
    self.n_kids: list[int] = first.sum(1).tolist()
    k = km[first]   # row-major: e ascending, kept within each class by the stable sort
    self.parent_list: list[int] = np.nonzero(first)[0][np.argsort(k, kind="stable")].tolist()
    self.parent_at: list[int] = np.concatenate(([0], np.cumsum(np.bincount(k, minlength=self.n_classes)))).tolist()
    self.info: list[Node | None] = [None] * self.n_classes     # an IR node of each class (for shapes and dtypes)
    info, nodes = self.info, enc.nodes
    for i, k in self.class_of_id.items():
      if info[k] is None and (n := nodes[i]) is not None: info[k] = n
    self.forbidden_args = set(enc.computed_args)

  def parents_of(self, k: int) -> list[int]:
    """The e-nodes reading class k, ascending, each once."""
    return self.parent_list[self.parent_at[k]:self.parent_at[k + 1]]

  @functools.cached_property
  def parents(self) -> list[list[int]]:
    """parents_of every class."""
    at = self.parent_at
    return list(map(self.parent_list.__getitem__, map(slice, at[:-1], at[1:])))

  @functools.cached_property
  def fresh_class(self) -> dict[int, set[int]]:
    """Realize class -> its fresh storage classes (several after merges)."""
    out: dict[int, set[int]] = {}
    for r, f in self.enc.fresh.items(): out.setdefault(self.class_of_id[r], set()).add(self.class_of_id[f])
    return out

  @functools.cached_property
  def fresh_classes(self) -> set[int]: return set().union(*self.fresh_class.values())

  @property
  def n_enodes(self) -> int: return len(self.op)

  @functools.cached_property
  def original_node(self) -> dict[int, Node]:
    """e-node index -> the inserted IR node it encodes (decode reuses it when the children match)."""
    sig = dict(zip(zip(self.op, self.arg, self.kids), itertools.count()))   # the last e-node of each signature
    out, nodes, coi = {}, self.enc.nodes, self.class_of_id.__getitem__
    for i, (op, a, kids) in self.enc.original.items():
      if (n := nodes[i]) is not None and (e := sig.get((op, a, tuple(map(coi, kids))))) is not None: out.setdefault(e, n)
    return out

  @staticmethod
  def original_src(n: Node) -> tuple:
    kids = n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src
    return (kids,) if n.op in (Ops.CALL, Ops.FUNCTION, Ops.SINK, Ops.TUPLE) or (n.op is Ops.AFTER and len(kids) != 2) or len(kids) > 3 else kids

  def local_costs(self, model: CostModel, abort_at: float = INF) -> list[int | None]:
    fresh, args, info, cls, kids, forbidden = self.enc.fresh_buffers, self.enc.args, self.info, self.cls, self.kids, self.forbidden_args
    plain = type(model).enode_cost is CostModel.enode_cost   # the base model prices only storage ops: no IR node needed
    flat = model.nodes
    def one(e: int, op: str, a: int) -> int | None:
      if op == "CONTIGUOUS" or (op == "AFTER" and a in forbidden): return None
      if op == "Cons" or op == "Nil": return 0
      if op == "FUNCTION" and args[a][1][0].precompile: return None   # only its CALL form runs
      if plain and op not in _PRICED: return flat
      return model.enode_cost(op, info[cls[e]], info[kids[e][0]] if op == "STORE" else None, op == "BUFFER" and args[a][1].uid in fresh)
    if plain:   # most e-nodes cost `nodes`: only the others are looked at one by one (the stored forms' in line)
      out, ops, argl, cost = [flat] * self.n_enodes, self.op, self.arg, model.enode_cost
      for i, e in enumerate(itertools.compress(range(self.n_enodes), map(_SPECIAL.__contains__, ops))):
        if not i % TICK: checkpoint(abort_at, "costing e-nodes")
        if (op := ops[e]) == "STORE": out[e] = cost(op, info[cls[e]], info[kids[e][0]], False)
        elif op == "BUFFER": out[e] = cost(op, info[cls[e]], None, args[argl[e]][1].uid in fresh)
        elif op == "AFTER":
          if argl[e] in forbidden: out[e] = None
        else: out[e] = one(e, op, argl[e])
      return out
    out = []
    for e, (op, a) in enumerate(zip(self.op, self.arg)):
      if not e % TICK: checkpoint(abort_at, "costing e-nodes")
      out.append(one(e, op, a))
    return out

  @functools.cached_property
  def cost_kids(self) -> list[tuple[int, ...]]:
    """The child classes whose cost an e-node pays. A SLICE of a BUFFER is passed to the CALL as its own argument: it
    reads its range, not the whole buffer (the SLICE pays its own bytes)."""
    buffer_classes = {k for k, o in zip(self.cls, self.op) if o == "BUFFER"}
    return [() if o == "SLICE" and ks[0] in buffer_classes else ks for o, ks in zip(self.op, self.kids)]

  def pinned_allowed(self) -> list[bool]:
    """Identity constraints on extraction: an assign's e-class is a write into that assign's own target, and a realized
    e-class is a storage form (a write, a view, a buffer), never the computation it holds the value of."""
    pin = {self.class_of_id[a]: self.class_of_id[t] for a, t in self.enc.pins.items()}
    realized = {self.class_of_id[i] for i in self.enc.key_ids.values()}
    heads = {k: ks[0] for k, o, ks in zip(self.cls, self.op, self.kids) if o == "Cons"} if pin else {}   # list class -> head
    def pinned(k: int, op: str, ks: tuple) -> bool:   # an AFTER with several writes lists its target first: AFTER(Cons(target, ...))
      return op == "AFTER" and bool(ks) and pin[k] in (ks[0], heads.get(ks[0]) if len(ks) == 1 else None)
    out, cls, op, kids = [True] * self.n_enodes, self.cls, self.op, self.kids   # only the pinned and realized classes' e-nodes are looked at
    for e in np.flatnonzero(np.isin(self.cls_array, list(pin.keys() | realized))).tolist():
      k, o = cls[e], op[e]
      out[e] = pinned(k, o, kids[e]) if k in pin else k not in realized or o in _STORAGE_FORMS
    return out


def knuth(g: EGraphView, costs: list[int | None], allowed: list[bool] | None = None,
          abort_at: float = INF) -> tuple[list[int], list[int]]:
  """Minimum tree cost per class (Knuth's generalisation of Dijkstra). Returns (best cost, chosen e-node) per class."""
  return _knuth(g, costs, allowed, abort_at)[:2]

def _forced(g: EGraphView, ok: list[int | None]) -> bool:
  """Can every class be given at most one e-node? Then Knuth's choice is that e-node wherever it is reachable, whatever
  the costs. An e-node whose child class has a single e-node that reads its own class back (a stored form
  AFTER(f, STORE(f, x)) in x's class) is only ready once its class is done, so it never counts."""
  live = np.flatnonzero(np.fromiter(map(operator.is_not, ok, itertools.repeat(None)), bool, len(ok)))
  cl = g.cls_array[live]
  cnt = np.bincount(cl, minlength=g.n_classes)
  if not len(cl) or cnt.max() <= 1: return True
  one = cnt[cl] == 1
  last = np.full(g.n_classes, -1); last[cl[one]] = live[one]   # a single-member class's e-node
  es, k = live[~one], cl[~one]   # the e-nodes of classes with several
  j = g.kid_array[es]   # their child classes (-1: none)
  single = (j >= 0) & (cnt[j] == 1)
  reads_back = single & (g.kid_array[last[j]] == k[:, None, None]).any(2)   # child j's one e-node reads k
  return bool(np.bincount(k[~reads_back.any(1)], minlength=g.n_classes).max() <= 1)

def _knuth(g: EGraphView, costs: list[int | None], allowed: list[bool] | None, abort_at: float,
           tree: bool = True) -> tuple[list, list, bool]:
  """(best, choice, forced): Knuth's pass; where `_forced`, the same choice by readiness alone (no heap, no order), and
  without `tree` the tree costs are not summed there (best stays INF: extract costs the chosen DAG instead)."""
  best, choice = [INF] * g.n_classes, [-1] * g.n_classes
  pending = g.n_kids.copy()
  ok = costs.copy()   # None: never chosen
  if allowed is not None:
    for e in itertools.compress(range(len(ok)), map(operator.not_, allowed)): ok[e] = None
  leaves = [e for e in np.flatnonzero(g.kid_array[:, 0] < 0).tolist() if ok[e] is not None]   # ready from the start, ascending
  cls, par, at, bget = g.cls, g.parent_list, g.parent_at, best.__getitem__
  steps, tick = 0, TICK if abort_at < INF else -1
  if _forced(g, ok):   # one candidate per class: it is chosen once its children are, in any order
    ck = g.cost_kids if tree else None
    stack = leaves
    pop, push = stack.pop, stack.append
    while stack:
      steps += 1
      if steps == tick: checkpoint(abort_at, "extracting (Knuth)"); tick += TICK
      e = pop()
      if choice[k := cls[e]] >= 0: continue
      choice[k] = e
      if tree: best[k] = ok[e] + sum(map(bget, ck[e]))
      for p in par[at[k]:at[k + 1]]:
        if (n := pending[p]) > 1: pending[p] = n - 1
        else:
          pending[p] = 0
          if ok[p] is not None and choice[cls[p]] < 0: push(p)
    return best, choice, True
  done, ck = [False] * g.n_classes, g.cost_kids
  heap = [(ok[e], e) for e in leaves]
  heapq.heapify(heap)
  pop, push = heapq.heappop, heapq.heappush
  while heap:
    steps += 1
    if steps == tick: checkpoint(abort_at, "extracting (Knuth)"); tick += TICK
    c, e = pop(heap)
    k = cls[e]
    if done[k]: continue
    done[k], best[k], choice[k] = True, c, e
    for p in par[at[k]:at[k + 1]]:
      if (n := pending[p]) > 1: pending[p] = n - 1
      else:
        pending[p] = 0
        if (cp := ok[p]) is not None and not done[cls[p]]: push(heap, (cp + sum(map(bget, ck[p])), p))
  return best, choice, False

_BASELINE_LOOKS = frozenset({"CONTIGUOUS", "AFTER", "STORE", "BUFFER", "PARAM", "SLICE"})   # what baseline_cost prices itself

def baseline_cost(enc: Encoding, model: CostModel, drop: frozenset = frozenset()) -> int:
  """Cost of the everything-materialized CALL, read off the encoding: every inserted node once, and every realize
  point as a STORE into its fresh buffer plus the AFTER that orders it (the form the materialize phase adds); the ops
  in `drop` (markers replaced by their source) cost nothing."""
  total, plain = 0, type(model).enode_cost is CostModel.enode_cost
  for i, (op, a, kids) in enc.original.items():
    if op in drop: continue
    if plain and op not in _BASELINE_LOOKS: total += model.nodes; continue   # the base model prices the rest at nodes
    node = enc.nodes[i]
    if op == "CONTIGUOUS" or (op == "AFTER" and enc.args[a][1] == COMPUTED_TARGET):
      if i in enc.fresh:
        f = enc.nodes[enc.fresh[i]]
        total += model.enode_cost("STORE", None, f, False) + model.enode_cost("AFTER", node, None, False)
      continue
    if op == "STORE" and i in enc.stores_into_computed: continue
    fresh = op == "BUFFER" and node.arg.uid in enc.fresh_buffers
    c = model.enode_cost(op, node, enc.nodes[kids[0]] if op == "STORE" else None, fresh)
    total += c or 0
  return total

def extract(g: EGraphView, costs: list[int | None], roots: list[int], allowed: list[bool] | None = None,
            refine_below: int = 20_000, rounds: int = 3, deadline: float = INF,
            abort_at: float = INF) -> tuple[list[int], int, list[int] | None]:
  """(choice, DAG cost, the classes the chosen DAG reaches or None where one has no choice: `chosen_dag`). Knuth picks
  by tree cost; on e-graphs under `refine_below` classes, a few sharing-aware rounds follow: e-nodes the current DAG
  already pays for cost nothing, Knuth runs again, and the new choice is kept if its DAG cost is lower (tree cost
  counts a shared subterm once per use, which can hide the cheaper DAG). No refinement round runs past `deadline` (a
  time.perf_counter() value): the Knuth choice is already valid. Past `abort_at` the first Knuth pass raises
  OutOfBudget."""
  if (one := _single(g, costs, allowed, roots, abort_at)) is not None:   # one e-node per class, well-founded: no choice to make
    choice, reached = one
    return choice, _dag_cost_of(g, costs, choice, roots, reached), reached
  _, choice, forced = _knuth(g, costs, allowed, abort_at, tree=False)
  best, reached = chosen_dag(g, costs, choice, roots)
  if g.n_classes >= refine_below or forced: return choice, best, reached   # forced: every round would choose the same
  for _ in range(rounds):
    if time.perf_counter() > deadline: break
    paid = {choice[k] for k in (reached if reached is not None else reached_classes(choice, roots, g.kids, g.n_classes, False))}
    try: _, cand = knuth(g, [0 if e in paid and c is not None else c for e, c in enumerate(costs)], allowed, min(deadline, abort_at))
    except OutOfBudget: break
    c, r = chosen_dag(g, costs, cand, roots)
    if c >= best: break
    choice, best, reached = cand, c, r
  if g.n_classes < SWITCH_BELOW and reached is not None and time.perf_counter() < deadline:
    choice, best, reached = _switches(g, costs, allowed, roots, choice, best, reached, deadline)
  return choice, best, reached

SWITCH_BELOW = 2_000   # e-graphs with fewer classes get _switches (each try walks the chosen DAG)

def _switches(g: EGraphView, costs: list[int | None], allowed: list[bool] | None, roots: list[int], choice: list[int],
              best: int, reached: list[int], deadline: float) -> tuple[list[int], int, list[int]]:
  """Single-class switches after the sharing-aware rounds: a reached class takes another usable e-node over classes the
  chosen DAG already reaches (no cycle) when the DAG cost drops, until no switch helps or `deadline`. The rounds zero
  the cost of every e-node the current DAG pays for, the chosen ones included, so they cannot see that a class could
  read a term the DAG has anyway (a BITCAST of a PARAM another branch reads) instead of its own (a bitcast view, a
  second PARAM)."""
  members = usable_members(g, costs, allowed)
  improved = True
  while improved and time.perf_counter() < deadline:
    improved, paid = False, bytearray(g.n_classes)
    for k in reached: paid[k] = 1
    for k in reached:
      for e in members.get(k, ()):
        # only e-nodes over classes the DAG has anyway: one that brings new classes is what tree cost already weighed
        if e == choice[k] or not all(paid[c] for c in g.kids[e]): continue
        trial = choice.copy(); trial[k] = e
        if not acyclic(trial, roots, g.kids, g.n_classes): continue
        c, r = chosen_dag(g, costs, trial, roots)
        if r is not None and c < best:
          choice, best, reached, improved = trial, c, r, True
          break
      if improved or time.perf_counter() > deadline: break
  return choice, best, reached

def usable_members(g, costs: list[int | None], allowed: list[bool] | None) -> dict[int, list[int]]:
  """Class -> its usable e-nodes (a cost, allowed), ascending; a class with none is not a key."""
  members: dict[int, list[int]] = {}
  for e, k in enumerate(g.cls):
    if costs[e] is not None and (allowed is None or allowed[e]): members.setdefault(k, []).append(e)
  return members

def acyclic(choice: list[int], roots: list[int], kids: list[tuple], n: int) -> bool:
  """Is the DAG `choice` picks under `roots` free of cycles (every chosen class finished before it is met again)?"""
  state, stack = bytearray(n), list(roots)   # 1 entered, 2 finished
  while stack:
    k = stack.pop()
    if k < 0: state[~k] = 2; continue
    if state[k] == 2: continue
    if state[k] == 1: return False   # entered and not finished: on the current path
    if choice[k] < 0: state[k] = 2; continue   # no choice: chosen_dag says so, not a cycle
    state[k] = 1
    stack.append(~k); stack += kids[choice[k]]
  return True

def _single(g: EGraphView, costs: list[int | None], allowed: list[bool] | None, roots: list[int],
            abort_at: float = INF) -> tuple[list[int], list[int]] | None:
  """(choice, the classes `roots` reach) where every class has at most one usable e-node and every one of them is
  well-founded (its children's e-nodes are, no cycle): Knuth would choose exactly those (the rules-mode e-graphs of
  bench/callify_vs_tinygrad.py are so), found by one depth-first walk that checks for cycles, the roots' classes first
  (their pre-order is reached_classes'), then every other class. None: Knuth decides."""
  live = np.fromiter(map(operator.is_not, costs, itertools.repeat(None)), bool, len(costs))
  if allowed is not None: live &= np.fromiter(allowed, bool, len(allowed))
  cl = g.cls_array[live]
  if len(cl) and np.bincount(cl, minlength=g.n_classes).max() > 1: return None
  cand = np.full(g.n_classes, -1, np.int64); cand[cl] = np.flatnonzero(live)
  choice, kids, state, reached = cand.tolist(), g.kids, bytearray(g.n_classes), []   # state: 1 entered, 2 finished
  steps, tick = 0, TICK if abort_at < INF else -1
  for start in itertools.chain((roots,), ([k] for k in range(g.n_classes) if not state[k] and choice[k] >= 0)):
    stack = list(start)
    while stack:
      if (k := stack.pop()) < 0: state[~k] = 2; continue
      if (s := state[k]) == 2: continue
      if s or (e := choice[k]) < 0: return None   # a cycle, or an e-node over a class with none: not every class is chosen
      steps += 1
      if steps == tick: checkpoint(abort_at, "extracting"); tick += TICK
      state[k] = 1
      if start is roots: reached.append(k)
      stack.append(~k); stack += kids[e]
  return choice, reached

def chosen_dag(g: EGraphView, costs: list[int | None], choice: list[int], roots: list[int]) -> tuple[int, list[int] | None]:
  """(dag_cost, the classes reached through the chosen e-nodes' children) in one walk. Where a reached class has no
  choice the cost is dag_cost's (which raises as it would) and the classes are None (reached_classes raises for them)."""
  reached = reached_classes(choice, roots, g.kids, g.n_classes, False)
  if -1 in map(choice.__getitem__, reached): return dag_cost(g, costs, choice, roots), None
  return _dag_cost_of(g, costs, choice, roots, reached), reached

def _dag_cost_of(g: EGraphView, costs: list[int | None], choice: list[int], roots: list[int], reached: list[int]) -> int:
  """dag_cost from the classes the chosen e-nodes' children reach: the walks differ only below a chosen SLICE
  (cost_kids), so only then is the DAG costed by dag_cost's own walk."""
  es = list(map(choice.__getitem__, reached))
  if "SLICE" in map(g.op.__getitem__, es): return dag_cost(g, costs, choice, roots)
  return sum(map(costs.__getitem__, es))

def reached_classes(choice: list[int], roots: list[int], kids: list[tuple], n: int, strict: bool = True) -> list[int]:
  """The classes reached from `roots` through the chosen e-nodes' `kids`; `strict`: a class without a choice raises."""
  seen, out, stack = bytearray(n), [], list(roots)
  while stack:
    k = stack.pop()
    if seen[k]: continue
    seen[k] = 1; out.append(k)
    if (e := choice[k]) >= 0: stack += kids[e]
    elif strict: raise Unextractable(f"extraction: e-class {k} has no extractable e-node")
  return out

def dag_cost(g: EGraphView, costs: list[int | None], choice: list[int], roots: list[int]) -> int:
  """Cost of the chosen DAG under `roots`: every class reached is paid once (sharing-aware)."""
  return sum([costs[choice[k]] for k in reached_classes(choice, roots, g.cost_kids, g.n_classes)])

class ChosenIds:
  """The extracted DAG for `driver.build_call`: e-class ids, each standing for its chosen e-node (Cons lists flattened)."""
  def __init__(self, g: EGraphView, choice: list[int]): self.g, self.choice = g, choice

  def enode(self, k: int) -> int:
    """The e-node id k stands for (a subclass may read some ids through other members: egraph/fusion/solve.py: StoredIds)."""
    if (e := self.choice[k]) < 0: raise Unextractable(f"extraction: e-class {k} has no extractable e-node")
    return e

  def kids(self, k: int) -> list[int]:
    g = self.g
    ks = g.kids[self.enode(k)]
    if len(ks) != 1 or g.op[self.choice[ks[0]]] not in ("Cons", "Nil"): return list(ks)
    out, c = [], ks[0]
    while g.op[e := self.enode(c)] == "Cons": h, c = g.kids[e]; out.append(h)
    return out

  def op(self, k: int) -> str: return self.g.op[self.enode(k)]

  def template(self, k: int) -> tuple:
    e = self.enode(k)
    dtype, arg = self.g.enc.args[self.g.arg[e]]
    return Ops[self.g.op[e]], dtype if self.g.arg[e] else None, arg

  def make(self, k: int, src: tuple) -> Node:
    o, dtype, arg = self.template(k)
    if o is Ops.CALL or o is Ops.FUNCTION: arg, body = arg; src = (body, *src)
    return Node(o, dtype, src, arg)

class Terms(collections.abc.Mapping):
  """decode's answer, class -> IR Node (a Cons list: a tuple), built on first use: `terms[k]` decodes only k's subterm
  (a cost-mode partition with no time to cost reads none); iterating, `len` and `in` decode everything under the roots
  first, so as a mapping it is the eager decode's dict."""
  def __init__(self, g: EGraphView, choice: list[int], roots: list[int], reached: list[int] | None = None):
    self.g, self.choice, self.roots, self.out, self.full, self._reached = g, choice, roots, {}, False, reached

  @property
  def reached(self) -> list[int]:
    """The classes under the roots (reached_classes: one without a choice raises), from the extraction where it had them."""
    if self._reached is None: self._reached = reached_classes(self.choice, self.roots, self.g.kids, self.g.n_classes)
    return self._reached

  def __getitem__(self, k: int) -> Node:
    if (n := self.out.get(k)) is None and k not in self.out: _decode_into(self.out, self.g, self.choice, [k]); n = self.out[k]
    return n

  def _all(self) -> dict:
    if not self.full: _decode_into(self.out, self.g, self.choice, self.roots); self.full = True
    return self.out

  def __iter__(self): return iter(self._all())
  def __len__(self) -> int: return len(self._all())
  def __contains__(self, k) -> bool: return k in self._all()

def decode(g: EGraphView, choice: list[int], roots: list[int], reached: list[int] | None = None) -> Terms:
  """Chosen e-nodes -> IR Nodes, children first, without recursion, on first use (Terms). Cons lists become tuples."""
  return Terms(g, choice, roots, reached)

def _decode_into(out: dict, g: EGraphView, choice: list[int], roots: list[int]) -> None:
  """Decode the classes under `roots` into `out` (classes already there are reused)."""
  orig, kids_of, ops, argi, args, osrc = g.original_node, g.kids, g.op, g.arg, g.enc.args, g.original_src
  stack = list(roots)   # k: visit class k, ~k: build it (its children are built)
  while stack:
    if (k := stack.pop()) >= 0:
      if k in out: continue
      if (e := choice[k]) < 0: raise Unextractable(f"extraction: e-class {k} has no extractable e-node")
      stack.append(~k); stack += [x for x in kids_of[e] if x not in out]; continue
    if (k := ~k) in out: continue
    e = choice[k]
    op, kids = ops[e], [out[x] for x in kids_of[e]]
    if (n := orig.get(e)) is not None and tuple(kids) == osrc(n): out[k] = n; continue   # reuse the input node
    if op == "Nil": out[k] = (); continue
    if op == "Cons": out[k] = (kids[0], *kids[1]); continue
    srcs = kids[0] if len(kids) == 1 and isinstance(kids[0], tuple) else tuple(kids)   # a V node's list
    dtype, arg = args[argi[e]]
    o = Ops[op]
    if o in (Ops.CALL, Ops.FUNCTION): arg, body = arg; srcs = (body, *srcs)
    out[k] = Node(o, dtype if argi[e] else None, srcs, arg)
