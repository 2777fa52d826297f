"""Extraction in Python over `EGraph.freeze()`: a bottom-up Knuth/Dijkstra pass picks one e-node per e-class by tree
cost (exact, Python ints, cycles are fine), then the chosen DAG is costed with every shared e-node counted once.
egglog's own extractor is tree-cost only and blows up on shared DAGs, so it is not used. Given an `abort_at` time
(time.perf_counter()), the loops check it every TICK steps and raise OutOfBudget once it has passed."""
from __future__ import annotations
import functools, heapq, time
from egraph.ir import Node, Ops
from egraph.encode import Encoding, COMPUTED_TARGET
from egraph.cost import CostModel
from egraph.errors import EngineError
from egraph.runner import OutOfBudget, checkpoint

TICK = 4096   # loop steps between deadline checks (~1 ms of work)
INF = float("inf")

class Unextractable(EngineError):
  """An e-class needed for the CALL has no extractable e-node (a run stopped before the rule that gives it one)."""

_CTORS = ("L", "U", "B", "R", "V", "Cons", "Nil")
_STORAGE_FORMS = frozenset({"AFTER", "SLICE", "BUFFER", "PARAM", "RESHAPE", "SHRINK", "PERMUTE", "FLIP", "MULTI"})

class EGraphView:
  """The frozen e-graph as flat Python lists: e-nodes (class, op, arg id, child classes) and class facts."""
  def __init__(self, frozen, egraph, enc: Encoding, abort_at: float = INF):
    self.enc, cls, strs = enc, {}, {}
    def c(v):
      if (i := cls.get(v)) is None: i = cls[v] = len(cls)
      return i
    def s(v):
      if (r := strs.get(v)) is None: r = strs[v] = egraph.value_to_string(v)
      return r
    i64 = egraph.value_to_i64
    self.cls, self.op, self.arg, self.kids = [], [], [], []
    fns = frozen.functions
    for name in _CTORS:
      if name not in fns: continue
      for j, r in enumerate(fns[name].rows):
        if not j % TICK: checkpoint(abort_at, "reading the e-graph")
        if r.subsumed: continue
        ins = r.inputs
        self.cls.append(c(r.output))
        if name in ("Cons", "Nil"): self.op.append(name); self.arg.append(0); self.kids.append(tuple(c(v) for v in ins))
        else: self.op.append(s(ins[0])); self.arg.append(i64(ins[1])); self.kids.append(tuple(c(v) for v in ins[2:]))
    self.class_of_id = {i64(r.inputs[0]): c(r.output) for r in fns["N"].rows}
    self.n_classes = len(cls)
    self.info: list[Node | None] = [None] * self.n_classes     # an IR node of each class (for shapes and dtypes)
    for i, k in self.class_of_id.items():
      if (n := enc.nodes[i]) is not None and self.info[k] is None: self.info[k] = n
    self.fresh_class: dict[int, set[int]] = {}     # realize class -> its fresh storage classes (several after merges)
    for r, f in enc.fresh.items(): self.fresh_class.setdefault(self.class_of_id[r], set()).add(self.class_of_id[f])
    self.fresh_classes = set().union(*self.fresh_class.values())
    self.parents: list[list[int]] = [[] for _ in range(self.n_classes)]
    for e, ks in enumerate(self.kids):
      for k in set(ks): self.parents[k].append(e)
    self.forbidden_args = set(enc.computed_args)

  @property
  def n_enodes(self) -> int: return len(self.op)

  @functools.cached_property
  def original_node(self) -> dict[int, Node]:
    """e-node index -> the inserted IR node it encodes (decode reuses it when the children match)."""
    sig = {(self.op[e], self.arg[e], self.kids[e]): e for e in range(self.n_enodes)}
    out = {}
    for i, (op, a, kids) in self.enc.original.items():
      if (n := self.enc.nodes[i]) is not None and (e := sig.get((op, a, tuple(self.class_of_id[k] for k in kids)))) is not None:
        out.setdefault(e, n)
    return out

  @staticmethod
  def original_src(n: Node) -> tuple:
    kids = n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src
    return (kids,) if n.op in (Ops.CALL, Ops.FUNCTION, Ops.SINK, Ops.TUPLE) or (n.op is Ops.AFTER and len(kids) != 2) or len(kids) > 3 else kids

  def local_costs(self, model: CostModel, abort_at: float = INF) -> list[int | None]:
    out = []
    fresh = self.enc.fresh_buffers
    for e in range(self.n_enodes):
      if not e % TICK: checkpoint(abort_at, "costing e-nodes")
      op = self.op[e]
      if op == "CONTIGUOUS" or (op == "AFTER" and self.arg[e] in self.forbidden_args): out.append(None); continue
      if op in ("Cons", "Nil"): out.append(0); continue
      if op == "FUNCTION" and self.enc.args[self.arg[e]][1][0].precompile: out.append(None); continue   # only its CALL form runs
      node = self.info[self.cls[e]]
      target = self.info[self.kids[e][0]] if op == "STORE" else None
      isfresh = op == "BUFFER" and self.enc.args[self.arg[e]][1].uid in fresh
      out.append(model.enode_cost(op, node, target, isfresh))
    return out

  @functools.cached_property
  def cost_kids(self) -> list[tuple[int, ...]]:
    """The child classes whose cost an e-node pays. A SLICE of a BUFFER is passed to the CALL as its own argument: it
    reads its range, not the whole buffer (the SLICE pays its own bytes)."""
    buffer_classes = {self.cls[e] for e in range(self.n_enodes) if self.op[e] == "BUFFER"}
    return [() if self.op[e] == "SLICE" and self.kids[e][0] in buffer_classes else self.kids[e] for e in range(self.n_enodes)]

  def pinned_allowed(self) -> list[bool]:
    """Identity constraints on extraction: an assign's e-class is a write into that assign's own target, and a realized
    e-class is a storage form (a write, a view, a buffer), never the computation it holds the value of."""
    pin = {self.class_of_id[a]: self.class_of_id[t] for a, t in self.enc.pins.items()}
    realized = {self.class_of_id[i] for i in self.enc.key_ids.values()}
    heads = {self.cls[e]: self.kids[e][0] for e in range(self.n_enodes) if self.op[e] == "Cons"}   # list class -> head
    out = []
    for e in range(self.n_enodes):
      k, op = self.cls[e], self.op[e]
      if k in pin:   # an AFTER with several writes lists its target first: AFTER(Cons(target, ...))
        ks = self.kids[e]
        out.append(op == "AFTER" and bool(ks) and pin[k] in (ks[0], heads.get(ks[0]) if len(ks) == 1 else None))
      else: out.append(k not in realized or op in _STORAGE_FORMS)
    return out


def knuth(g: EGraphView, costs: list[int | None], allowed: list[bool] | None = None,
          abort_at: float = INF) -> tuple[list[int], list[int]]:
  """Minimum tree cost per class (Knuth's generalisation of Dijkstra). Returns (best cost, chosen e-node) per class."""
  best, choice, done = [INF] * g.n_classes, [-1] * g.n_classes, [False] * g.n_classes
  pending = [len(set(k)) for k in g.kids]
  heap = [(costs[e], e) for e in range(g.n_enodes) if pending[e] == 0 and costs[e] is not None and (allowed is None or allowed[e])]
  heapq.heapify(heap)
  steps = 0
  while heap:
    steps += 1
    if not steps % TICK: checkpoint(abort_at, "extracting (Knuth)")
    c, e = heapq.heappop(heap)
    k = g.cls[e]
    if done[k]: continue
    done[k], best[k], choice[k] = True, c, e
    for p in g.parents[k]:
      pending[p] -= 1
      if pending[p] == 0 and costs[p] is not None and (allowed is None or allowed[p]) and not done[g.cls[p]]:
        heapq.heappush(heap, (costs[p] + sum(best[x] for x in g.cost_kids[p]), p))
  return best, choice

def baseline_cost(enc: Encoding, model: CostModel) -> int:
  """Cost of the everything-materialized CALL, read off the encoding: every inserted node once, and every realize
  point as a STORE into its fresh buffer plus the AFTER that orders it (the form the materialize phase adds)."""
  total = 0
  for i, (op, a, kids) in enc.original.items():
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
            refine_below: int = 20_000, rounds: int = 3, deadline: float = INF, abort_at: float = INF) -> tuple[list[int], int]:
  """(choice, DAG cost). Knuth picks by tree cost; on e-graphs under `refine_below` classes, a few sharing-aware
  rounds follow: e-nodes the current DAG already pays for cost nothing, Knuth runs again, and the new choice is kept
  if its DAG cost is lower (tree cost counts a shared subterm once per use, which can hide the cheaper DAG). No
  refinement round runs past `deadline` (a time.perf_counter() value): the Knuth choice is already valid. Past
  `abort_at` the first Knuth pass raises OutOfBudget."""
  _, choice = knuth(g, costs, allowed, abort_at)
  best = dag_cost(g, costs, choice, roots)
  if g.n_classes >= refine_below: return choice, best
  for _ in range(rounds):
    if time.perf_counter() > deadline: break
    paid = set()
    stack, seen = list(roots), set()
    while stack:
      k = stack.pop()
      if k in seen: continue
      seen.add(k); paid.add(choice[k]); stack.extend(g.kids[choice[k]])
    try: _, cand = knuth(g, [0 if e in paid and c is not None else c for e, c in enumerate(costs)], allowed, min(deadline, abort_at))
    except OutOfBudget: break
    c = dag_cost(g, costs, cand, roots)
    if c >= best: break
    choice, best = cand, c
  return choice, best

def dag_cost(g: EGraphView, costs: list[int | None], choice: list[int], roots: list[int]) -> int:
  """Cost of the chosen DAG under `roots`: every class reached is paid once (sharing-aware)."""
  seen, stack, total = set(), list(roots), 0
  while stack:
    k = stack.pop()
    if k in seen: continue
    seen.add(k)
    e = choice[k]
    if e < 0: raise Unextractable(f"extraction: e-class {k} has no extractable e-node")
    total += costs[e]
    stack.extend(g.cost_kids[e])
  return total

class ChosenIds:
  """The extracted DAG for `driver.build_call`: e-class ids, each standing for its chosen e-node (Cons lists flattened)."""
  def __init__(self, g: EGraphView, choice: list[int]): self.g, self.choice = g, choice

  def enode(self, k: int) -> int:
    """The e-node id k stands for (a subclass may read some ids through other members: egraph/fusion.StoredIds)."""
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

def decode(g: EGraphView, choice: list[int], roots: list[int]) -> dict[int, Node]:
  """Chosen e-nodes -> IR Nodes, children first, without recursion. Cons lists become tuples of Nodes."""
  out: dict[int, object] = {}
  stack = [(r, False) for r in roots]
  while stack:
    k, ready = stack.pop()
    if k in out: continue
    e = choice[k]
    if e < 0: raise Unextractable(f"extraction: e-class {k} has no extractable e-node")
    if not ready:
      stack.append((k, True)); stack.extend((x, False) for x in g.kids[e] if x not in out); continue
    op, kids = g.op[e], [out[x] for x in g.kids[e]]
    if (n := g.original_node.get(e)) is not None and tuple(kids) == g.original_src(n): out[k] = n; continue   # reuse the input node
    if op == "Nil": out[k] = (); continue
    if op == "Cons": out[k] = (kids[0], *kids[1]); continue
    srcs = kids[0] if len(kids) == 1 and isinstance(kids[0], tuple) else tuple(kids)   # a V node's list
    dtype, arg = g.enc.args[g.arg[e]]
    o = Ops[op]
    if o in (Ops.CALL, Ops.FUNCTION): arg, body = arg; srcs = (body, *srcs)
    out[k] = Node(o, dtype if g.arg[e] else None, srcs, arg)
  return out

