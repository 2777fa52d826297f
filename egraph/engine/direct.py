"""The all-materialized CALL's DAG read straight off the graph, without an Encoding: callify's path when its limits
leave no time for the e-graph, so that encoding rows for it would be wasted (encoding takes 9-19x the toposort).

`plan` numbers the same vertices `build.materialized_call` reads off the Encoding (each realize point's AFTER and
STORE into its fresh buffer at ~(2i) and ~(2i+1), a CONTIGUOUS of storage as that storage), prices them as
`extract.baseline_cost` does, and `build.build_plan` builds the CALL with the same loop. It returns None for the graphs
only encode's path handles (calls, multi-device and DISK values, bound dimensions, zero-size values, assigns into
computed values, a CONTIGUOUS whose source may be storage only once materialized): encode raises what they should."""
from __future__ import annotations
from dataclasses import dataclass, field
from egraph.ir.ops import Node, Ops, GroupOp, empty_view, binds_dims, const_key
from egraph.engine.encode import Encoding, realize_points, assigns_into_computed, is_host, ASSIGNS
from egraph.engine.cost import CostModel
from rules.vocabulary import RELATIONS, OP_TERMS

_NOT_PLAIN = frozenset({Ops.CALL, Ops.FUNCTION, Ops.TUPLE, Ops.GETTUPLE, Ops.SINK, Ops.BIND, Ops.MULTI})
_PRICED_OPS = frozenset({Ops.CONTIGUOUS, Ops.AFTER, Ops.STORE, Ops.BUFFER, Ops.PARAM, Ops.SLICE})   # as baseline_cost
_NAME = {o: o.name for o in Ops}   # Enum.name is a Python-level property

@dataclass
class Plan:
  """The all-materialized CALL as a DAG of int vertices: `nodes[v]` the node v stands for (an original node, the
  CONTIGUOUS a realize point is read through, a fresh buffer view), `O`/`K` op names and kids (an AFTER and its STORE
  from the end of the lists), the SINK's AFTERs, each key's realized vertex, and the baseline cost."""
  nodes: list[Node]
  O: list
  K: list
  sink: list[int] = field(default_factory=list)
  roots: list[int] = field(default_factory=list)
  keys: list[Node] = field(default_factory=list)
  fresh_uids: set[int] = field(default_factory=set)
  cost: int = 0
  pairs: int = 0   # realize points stored into a fresh buffer
  dropped: int = 0   # what the markers `plan(drop=True)` skipped would cost: cost + dropped is the baseline
  in_order: bool = True   # `sink` is the SINK's order (else a walk from the roots orders it, as `build_call` does)

  @property
  def size(self) -> int:
    """E-nodes loading the encoding would make, at least: the vertices, and an AFTER and a STORE per fresh buffer."""
    return len(self.nodes) + 2 * self.pairs

  def template(self, v: int) -> tuple: n = self.nodes[v]; return n.op, n.dtype, n.arg
  def make(self, v: int, src: tuple[Node, ...]) -> Node: return self.nodes[v].over(src)

def plan(roots: list[Node], topo: list[Node], model: CostModel, assigns: str = "fresh", drop: bool = False) -> Plan | None:
  """The Plan of `roots` (`topo`: toposort(roots, enter_calls=False)), or None where encode must decide. `drop`: a
  DETACH or CONTIGUOUS_BACKWARD is its source (`materialized_call(drop=True)`, for `settled_on_graph`'s graphs)."""
  if assigns not in ASSIGNS: return None
  first = realize_points(roots, ())   # the roots' bases; the loop adds the rest in graph order, as realize_points does
  bases = list(dict.fromkeys(r.base for r in roots))
  in_order = len(bases) <= len(first) and all(k is b for k, b in zip(first, bases))   # `in_encoding_order`
  if binds_dims(topo): return None   # bind_dims: encode's path
  keys = {k.id: k for k in first}   # realize_points' loop is folded into the one below
  realized = keys if assigns == "realized" else frozenset()   # a target is below its assign: its key is in by then
  # vertices: one per node, and per realize point stored a CONTIGUOUS and its fresh view (at most 3 nodes)
  cap = len(topo) + 4 * (len(first) + sum(1 for n in topo if n.op is Ops.CONTIGUOUS or n.op is Ops.COPY)) + 1
  p = Plan([], [None] * (3 * cap), [None] * (3 * cap), in_order=in_order)
  nodes, O, K, sink, fresh_uids = p.nodes, p.O, p.K, p.sink, p.fresh_uids
  plain = type(model).enode_cost is CostModel.enode_cost
  cost = 0
  def vertex(n: Node, kids: list[int] | None) -> int:
    nonlocal cost
    v = len(nodes); nodes.append(n); O[v], K[v] = _NAME[n.op], kids
    if kids is not None:
      cost += model.nodes if plain and n.op not in _PRICED_OPS else model.enode_cost(O[v], n, None, False) or 0
    return v

  def materialize(c: Node, value: int) -> int:
    """c = CONTIGUOUS(value's node) stored into a fresh buffer: the AFTER vertex (encode's mint_fresh, then the
    materialize rule)."""
    nonlocal cost
    f = empty_view(c.shape, c.dtype, c.device)
    chain = []
    while f.src: chain.append(f); f = f.src[0]
    fresh_uids.add(f.arg.uid)
    fv = len(nodes); nodes.append(f); O[fv], K[fv] = "BUFFER", []
    cost += model.enode_cost("BUFFER", f, None, True) or 0
    for m in reversed(chain): fv = vertex(m, [fv])
    i = vertex(c, None)   # never visited: its AFTER stands for it
    a = ~(2 * i)
    O[a], K[a], O[a - 1], K[a - 1] = "AFTER", [fv, a - 1], "STORE", [fv, value]
    cost += model.enode_cost("STORE", None, nodes[fv], False) + model.enode_cost("AFTER", c, None, False)
    p.pairs += 1
    sink.append(a)
    return a

  seen: dict[Node, int] = {}   # node -> the vertex its consumers read (nodes hash by identity)
  get, add, name = seen.__getitem__, nodes.append, _NAME.__getitem__
  AFTER, CONTIGUOUS, STORE, RESHAPE, COPY = Ops.AFTER, Ops.CONTIGUOUS, Ops.STORE, Ops.RESHAPE, Ops.COPY
  for n in topo:   # `vertex`, inline: one per node (200k of them at the scale this path is for)
    op, dev = n.op, n.device
    if op in _NOT_PLAIN or (dev is not None and (dev.__class__ is tuple or dev.startswith("DISK:"))): return None
    if (op is CONTIGUOUS or op is AFTER) and dev is not None: keys.setdefault(n.id, n)
    if n in seen: continue   # the CONTIGUOUS a realize point is read through, made already
    if drop and op in _MARKERS:   # priced into the baseline only
      p.dropped += model.nodes if plain else model.enode_cost(_NAME[op], n, None, False) or 0
      seen[n] = seen[n.src[0]]; continue
    if op is CONTIGUOUS:
      x = n.src[0]
      if dev is None: seen[n] = seen[x]; continue   # nothing to allocate on: a no-op on values
      if x.has_buffer_identity(): seen[n] = seen[x]; continue   # contiguous_of_storage: no fresh buffer
      y = x
      while y.op is RESHAPE: y = y.src[0]
      if n.numel == 0 or y.op is CONTIGUOUS: return None   # zero_size, or maybe storage once materialized
      seen[n] = materialize(n, seen[x]); continue
    if op is AFTER and assigns_into_computed(n, realized): return None
    seen[n] = v = len(nodes); add(n); O[v] = o = name(op); K[v] = list(map(get, n.src))
    cost += model.nodes if plain and op not in _PRICED_OPS else \
            model.enode_cost(o, n, n.src[0] if op is STORE else None, False) or 0
    if op is AFTER: sink.append(v)
    elif n.id in keys or (op is COPY and dev is not None and is_host(n.src[0].device) and keys.setdefault(n.id, n)):
      # a root's base or a host COPY: its consumers read CONTIGUOUS(it), stored
      if n.numel == 0: return None
      w = n.contiguous()
      seen[n] = seen[w] = materialize(w, v)
  p.keys = list(keys.values())
  p.roots = [seen[k] for k in keys.values()]
  p.cost = cost
  return p

# ---- graphs with no decision to make ----------------------------------------------------------------------------------

# the optimize rules `no_decision` rules out, one condition each (tests/engine/test_no_decision.py fails when a rule is
# added to the optimize phase without a condition here)
COVERED = frozenset({"contiguous_to_view", "bitcast_to_view", "copy_of_view", "contiguous_of_assign",
                     "contiguous_of_assign_n", "assign_copy_in_place", "contiguous_idempotent", "drop_detach",
                     "drop_contiguous_backward", "storage_through_reshape", "store_candidate"})
# every fact row but fresh and storage (which every graph has): a relation added later makes a graph undecided here
_FACTS = tuple(r.row for r in RELATIONS if r.lifted and r.name not in ("fresh", "storage"))
_OP_ROWS = tuple(t.row for t in OP_TERMS)
_MARKERS = GroupOp.ValueMarker
DROPPED = frozenset(o.name for o in _MARKERS)   # as e-node names (materialized_call(drop=True) reads through them)
_THROUGH = DROPPED | {"RESHAPE"}
_REALIZED = frozenset({"CONTIGUOUS", "AFTER"})

def no_decision(enc: Encoding) -> str | None:
  """Why no optimize rule can match the e-graph `enc` loads, or None when one may: then materialize's all-stored form is
  the e-graph's only form of each realize point, and `materialized_call(enc)` is the CALL saturation and extraction
  would build, without building the e-graph. Conservative: a graph it is unsure of goes through the e-graph."""
  rows = enc.rows
  if any(rows.get(r) for r in _FACTS): return None   # views (3 rules), copy_into, candidates; precompiled, zero: not plain
  if enc.calls or enc.axes or enc.computed_args: return None   # precompiled calls, multi-device, assigns into computed values
  op: dict[int, str] = {}
  for rel in _OP_ROWS:
    for r in rows.get(rel, ()): op[r[0]] = r[1]
  if not DROPPED.isdisjoint(op.values()) and _merges_through_markers(rows): return None
  src = {r[0]: r[3] for r in rows.get("un_row", ())}
  for _, o, _, x in rows.get("un_row", ()):
    if o != "CONTIGUOUS": continue
    while op.get(x) in _THROUGH: x = src[x]
    # CONTIGUOUS over a realized value, through RESHAPEs (storage_through_reshape) and dropped markers (drop_detach,
    # drop_contiguous_backward; elsewhere `materialized_call(drop=True)` takes their source, as extraction does):
    # contiguous_of_assign, contiguous_idempotent, and contiguous_of_storage once the value is storage
    if op.get(x) in _REALIZED: return None
  return "no optimize rule matches: the all-stored form is the only one"

def _merges_through_markers(rows: dict) -> bool:
  """Would dropping the markers (drop_detach, drop_contiguous_backward) make two e-classes congruent: two rows the same
  op, arg and sources once a marker is its source? The IR is hash-consed, so only a marker can hide such a pair; the
  e-graph merges them (two realize points of one value share one buffer), the all-stored form would not. A variadic
  row (its sources a list) counts as merging."""
  if rows.get("var_row"): return True
  parent: dict[int, int] = {}
  for i, o, _, x in rows.get("un_row", ()):
    if o in DROPPED: parent[i] = x
  def canon(i: int) -> int:
    while i in parent: i = parent[i]
    return i
  seen: set = set()
  for rel in ("leaf_row", "un_row", "bin_row", "ter_row"):
    for r in rows.get(rel, ()):
      if r[0] in parent: continue
      key = (r[1], r[2], *map(canon, r[3:]))
      if key in seen: return True
      seen.add(key)
  return False

def _merges_on_graph(topo: list[Node]) -> bool:
  """`_merges_through_markers` on the graph: two nodes equal once their markers are their sources."""
  canon: dict[Node, int] = {}   # node -> the number of its class (a nested key would hash each whole subgraph again)
  seen: dict = {}
  for n in topo:
    if n.op in _MARKERS: canon[n] = canon[n.src[0]]; continue
    key = (n.op, n.dtype, tuple([canon[s] for s in n.src]), const_key(n.arg) if n.op is Ops.CONST else n.arg)
    if key in seen: return True
    canon[n] = seen[key] = len(seen)
  return False

_MOVEMENT = GroupOp.Movement

def settled_on_graph(roots: list[Node], topo: list[Node]) -> bool:
  """`no_decision` read off the graph, before encoding, conservatively (False: encode and ask `no_decision`): no BITCAST
  (bitcast_to_view), no COPY of a movement op (copy_of_view), no assign storing a COPY (assign_copy_in_place), no
  CONTIGUOUS of a movement op, a marker, a CONTIGUOUS or an AFTER (views, contiguous_of_assign, contiguous_idempotent,
  and what is storage once materialized), no marker as a realize point. `plan` refuses the rest of encode's forms."""
  if any(r.base.op in _MARKERS for r in roots): return False
  marked = False
  for n in topo:
    op = n.op
    if op is Ops.BITCAST: return False
    if op is Ops.COPY and n.src[0].op in _MOVEMENT: return False
    if op is Ops.AFTER and len(n.src) == 2 and n.src[1].op is Ops.STORE and n.src[1].src[1].op is Ops.COPY: return False
    if op is Ops.CONTIGUOUS and n.device is not None:
      x = n.src[0].op
      if x in _MOVEMENT or x in _MARKERS or x is Ops.CONTIGUOUS or x is Ops.AFTER: return False
    marked = marked or op in _MARKERS
  return not marked or not _merges_on_graph(topo)
