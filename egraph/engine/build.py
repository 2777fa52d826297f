"""The CALL built over a DAG of int ids, in one rebuild with its PARAMs in place: the extracted e-classes
(`build_call`), the Encoding's own ids (`materialized_call`, the all-materialized form) or the graph's plan of that form
without an Encoding (`build_plan`, egraph/engine/direct.py); and what they share (each realize point's storage view, bound
dimensions passed as BIND args)."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable, Protocol
from egraph.ir.ops import Node, Ops, GroupOp, ParamArg, CallInfo, toposort, map_args, dims_arg
from egraph.ir.dtype import dtypes
from egraph.ir.errors import EngineError, ShapeError
from egraph.ir.symbolic import BoundVar, dims_in
from egraph.engine.encode import Encoding
from egraph.engine.direct import Plan, DROPPED
from egraph.engine.runner import checkpoint
from egraph.engine.extract import TICK, INF

def view_over(n: Node, chain: list[tuple]) -> Node:
  """A view chain, (op, dtype, arg) outermost first, rebuilt over storage n with reshapes collapsed."""
  for op, dtype, arg in reversed(chain):
    if op is Ops.RESHAPE: n = n.src[0].reshape(arg) if n.op is Ops.RESHAPE else n.reshape(arg)
    else: n = Node(op, dtype, (n,), arg)
  return n

def bind_dims(body: Node, args: list[Node]) -> tuple[Node, list[Node]]:
  """The parameterized body with its bound symbolic dimensions replaced by their variables, their values appended to
  `args` as BIND nodes."""
  bound: dict = {}
  for n in toposort([body], enter_calls=False):
    for d in dims_in(dims_arg(n)):
      if isinstance(d, BoundVar):
        if bound.setdefault(d.var.key, d) != d:
          raise ShapeError(f"callify: variable {d.var.name} is bound to {int(bound[d.var.key])} and {int(d)} in one graph")
  if bound: body = map_args([body], lambda d: d.var if isinstance(d, BoundVar) else d)[0]
  return body, args + [Node(Ops.BIND, dtypes.int32, (), (d.var, int(d))) for d in bound.values()]

# ---- a CALL built over ids: the extracted e-classes, or the Encoding's own ids (the all-materialized fallback) ------

@dataclass
class BuiltCall:
  """A CALL with its buffer_map, and the report's counts."""
  call: Node
  buffer_map: dict[Node, Node]
  stores: int
  buffers: int
  views: int

class IdDag(Protocol):
  """A CALL body as a DAG of int ids: each id's children, op name, and node (over its built children)."""
  def kids(self, v: int) -> list[int]: ...
  def op(self, v: int) -> str: ...
  def template(self, v: int) -> tuple:
    """(Ops, dtype or None, arg) of a view op (what `view_over` rebuilds)."""
  def make(self, v: int, src: tuple[Node, ...]) -> Node: ...

def build_call(ids: IdDag, roots: list[int], keys: list[Node], fresh_buffers: set[int], bound_dims: bool = True,
               abort_at: float = INF) -> BuiltCall:
  """The CALL over the DAG under `roots` (the realize points' forms, in `keys` order), built once with its PARAMs in
  place: the ids are ordered as `toposort` orders the decoded terms, the SINK holds their AFTERs, PARAMs are numbered
  in `parameterize`'s pre-order walk, so the CALL is node for node `parameterize(SINK(...))` of the decoded terms,
  without building them first. Each realize point's storage is its view chain rebuilt over its buffer (`storage_view`).
  Past `abort_at` a loop raises OutOfBudget."""
  K: dict[int, list[int]] = {}   # children
  O: dict[int, str] = {}         # op names
  kids, op, make = ids.kids, ids.op, ids.make
  order, stack, done = [], list(reversed(roots)), _DONE   # a vertex under _DONE is finished when _DONE pops
  while stack:
    if (v := stack.pop()) is done: order.append(stack.pop()); continue
    if v in K: continue
    ks = K[v] = kids(v)
    O[v] = op(v)
    if not len(K) % TICK: checkpoint(abort_at, "ordering the CALL body")
    stack += (v, done)
    stack += reversed(ks)
  sink = [v for v in order if O[v] == "AFTER"]
  args: list[Node] = []
  slot_of: dict[Node, int] = {}
  built: dict[int, Node] = {}
  get, walked, stack = built.__getitem__, set(), list(reversed(sink))
  # one walk numbers and builds: PARAMs are numbered at first visit (pre-order), a vertex is built when it finishes,
  # when every buffer under it has its PARAM; vertices outside it (roots that are views of inputs) are built after
  while stack:
    if (v := stack.pop()) is done:
      v = stack.pop(); built[v] = make(v, tuple(map(get, K[v])))
      if not len(built) % TICK: checkpoint(abort_at, "building the CALL body")
      continue
    if v in walked: continue
    walked.add(v)
    o = O[v]
    if o == "BUFFER": n = make(v, ())
    elif o == "SLICE" and O[K[v][0]] == "BUFFER": n = make(v, (make(K[v][0], ()),))   # a whole SLICE(BUFFER): one arg
    else: stack += (v, done); stack += reversed(K[v]); continue
    if n not in slot_of: slot_of[n] = len(args); args.append(n)
    built[v] = n.param(slot_of[n])
  for v in order:
    if v not in built: built[v] = make(v, tuple(map(get, K[v])))
  body = Node(Ops.SINK, dtypes.void, tuple(dict.fromkeys(built[v] for v in sink)))
  body, args = bind_dims(body, args) if bound_dims else (body, args)
  buffer_map, views = buffer_map_of(keys, roots, O, K, ids)
  stores = len({built[v].id for v in walked if O[v] == "STORE"})
  buffers = sum(1 for a in args if a.op is Ops.BUFFER and a.arg.uid in fresh_buffers)
  return BuiltCall(Node(Ops.CALL, dtypes.void, (body, *args), CallInfo()), buffer_map, stores, buffers, views)

_DONE = object()
_VIEW_OPS = frozenset({o.name for o in GroupOp.Movement} | {"SLICE", "MULTI", "BITCAST"})   # BITCAST: a retyped assign target
_SKIP_OPS = frozenset({"AFTER"}) | DROPPED   # what storage_view strips

def has_bound_dims(enc: Encoding) -> bool:
  """Does any interned arg hold a bound symbolic dimension? (Only then does a CALL body need `bind_dims`.)"""
  return any(isinstance(d, BoundVar) for _, a in enc.args for d in dims_in(a.shape if isinstance(a, ParamArg) else a))

class MaterializedIds:
  """The e-graph's unoptimized form over the Encoding's ids, without the e-graph: each realize point stored into its
  fresh buffer (a zero-size one only allocated), an assign into a computed value stored into its fresh buffer, a
  CONTIGUOUS of what is storage once materialized is that storage (and one without a fresh buffer its source: a
  realized value a precompiled call reads), a precompiled call's output is its CALL: what the materialize phase adds
  and extraction picks with no optimize rule (`baseline_cost` prices it; like it, views and aliases are not taken, so
  a contiguous view or a CONTIGUOUS of an assign is a copy). ~(2i) and ~(2i+1) are the AFTER and the STORE into
  realize point i's fresh buffer."""
  def __init__(self, enc: Encoding, drop: bool = False):
    """`drop`: a DETACH or CONTIGUOUS_BACKWARD is its source, as drop_detach and drop_contiguous_backward make it and
    extraction keeps it (for `no_decision`'s graphs; the limits' fallback prices and builds the unoptimized form)."""
    self.enc, self.nodes, self.orig, fresh = enc, enc.nodes, enc.original, enc.fresh
    zero = {r[0] for r in enc.rows.get("zero_row", ())}
    pre = {g: r for g, r in enc.rows.get("precompiled_row", ())}
    self.cons = {c: (h, t) for c, h, t in enc.rows.get("cons_row", ())}
    special = {i: o for i, (o, a, _) in self.orig.items()
               if o == "CONTIGUOUS" or (o == "AFTER" and a in enc.computed_args) or (o == "GETTUPLE" and i in pre)
               or (drop and o in DROPPED)}
    memo: dict[int, int] = {}
    def storage(r: int) -> bool:
      """Is r's e-class storage once materialized: a buffer (view) that some inserted node is, up to what the
      CONTIGUOUS below its reshapes became (congruence gives the class that node's storage fact)?"""
      if r < 0: return False
      if self.nodes[r].has_buffer_identity(): return True
      chain = []
      while r >= 0 and self.orig[r][0] in ("RESHAPE", "MULTI"):
        chain.append(self.nodes[r]); r = memo.get(k := self.orig[r][2][0], k)
      if not chain or r < 0 or not (n := self.nodes[r]).has_buffer_identity(): return False
      for m in reversed(chain): n = Node(m.op, m.dtype, (n,), m.arg)
      return n.id in enc.ids
    def resolve(i: int) -> int:   # specials are resolved in id order: a CONTIGUOUS's source is memoized already
      while (o := special.get(i)) is not None:
        if (r := memo.get(i)) is not None: return r
        if o == "CONTIGUOUS":
          r = resolve(self.orig[i][2][0])
          # a source that is storage once materialized (a buffer, a view of one, a zero-size value's empty buffer): the
          # CONTIGUOUS joins its class (contiguous_of_storage) and extraction keeps the source's storage
          if i not in fresh or storage(r): return r
          if i in zero: i = fresh[i]; continue                  # zero_size
          return ~(2 * i)                                       # materialize_contiguous
        if o == "AFTER": return ~(2 * i)                        # materialize_assign
        if o in DROPPED: i = self.orig[i][2][0]; continue     # drop_detach, drop_contiguous_backward
        i = pre[i]                                              # precompile_call
      return i
    for i in special: memo[i] = resolve(i)
    self.redirect = {i: r for i, r in memo.items() if r != i}
    self.roots = [self.to(enc.key_ids[k.id]) for k in enc.keys]

  def to(self, i: int) -> int: return self.redirect.get(i, i)

  def listed(self, ks: tuple) -> tuple | list:
    """An original e-node's child ids, a Cons list flattened."""
    if len(ks) != 1 or self.nodes[ks[0]] is not None: return ks
    out, c = [], ks[0]
    while c in self.cons: h, c = self.cons[c]; out.append(h)
    return out

  def kids(self, v: int) -> list[int]:
    rget = self.redirect.get
    if v >= 0:
      ks = self.orig[v][2]
      if len(ks) == 1 and self.nodes[ks[0]] is None: ks = self.listed(ks)
      return list(map(rget, ks, ks))
    i, is_store = divmod(~v, 2)
    op, _, ks = self.orig[i]
    f = self.to(self.enc.fresh[i])
    if not is_store: return [f, ~(2 * i + 1)]
    return [f, self.to(ks[0] if op == "CONTIGUOUS" else self.listed(self.orig[ks[1]][2])[1])]   # AFTER(t, STORE(t, v))

  def op(self, v: int) -> str: return self.orig[v][0] if v >= 0 else "STORE" if ~v & 1 else "AFTER"

  def template(self, v: int) -> tuple: n = self.nodes[v]; return n.op, n.dtype, n.arg

  def make(self, v: int, src: tuple[Node, ...]) -> Node:
    if v < 0: return Node(Ops.STORE, dtypes.void, src) if ~v & 1 else Node(Ops.AFTER, src[0].dtype, src)
    n = self.nodes[v]
    if (o := n.op) is Ops.CALL or o is Ops.FUNCTION: src = (n.src[0], *src)
    return n.over(src)   # a BUFFER's PARAM and views keep its shape: most nodes skip inference

def buffer_map_of(keys, roots, O, K, ids) -> tuple[dict, int]:
  """Each realized key -> its storage (a BUFFER's or PARAM's view chain), and how many keys are zero-copy SLICE views."""
  buffer_map, views = {}, 0
  for k, r in zip(keys, roots):
    chain, v = [], r
    while (o := O[v]) != "BUFFER" and o != "PARAM":
      if o not in _SKIP_OPS:
        if o not in _VIEW_OPS: raise EngineError(f"extraction chose a non-storage form {o} for a realized value")
        chain.append(ids.template(v))
      v = K[v][0]
    buffer_map[k] = view_over(ids.make(v, ()), chain)
    views += O[r] != "AFTER" and any(t[0] is Ops.SLICE for t in chain)
  return buffer_map, views

def in_encoding_order(enc: Encoding) -> bool:
  """Does the ordering walk of `build_call` over `MaterializedIds` finish the AFTERs in id order? Yes when the keys
  begin with the roots' bases (so it walks from the roots, as encode's toposort did, numbering in post-order) and no
  realize point is redirected out of that order or drops a subtree (precompiled calls, zero-size values, assigns into
  computed values)."""
  if enc.computed_args or "precompiled_row" in enc.rows or "zero_row" in enc.rows: return False
  bases = list(dict.fromkeys(r.base for r in enc.roots))
  return len(bases) <= len(enc.keys) and all(k is b for k, b in zip(enc.keys, bases))

def materialized_call(enc: Encoding, drop: bool = False) -> BuiltCall:
  """The all-materialized CALL straight from the Encoding (no e-graph), linear in the graph: callify's fallback when
  its limits leave no time to saturate and extract. `build_call` over `MaterializedIds`, node for node, specialized:
  a vertex v indexes flat lists (~(2i), ~(2i+1) from their end); the SINK's AFTERs are in id order where
  `in_encoding_order` says so (else one walk orders them); one walk numbers the PARAMs (pre-order from the SINK) and
  builds each vertex as it finishes (every buffer under it has its PARAM by then)."""
  ids = MaterializedIds(enc, drop)
  nodes, orig, listed, fresh = ids.nodes, ids.orig, ids.listed, enc.fresh
  n_ids = len(nodes)
  R = list(range(n_ids))
  for i, r in ids.redirect.items(): R[i] = r
  rget = R.__getitem__
  K: list = [None] * (3 * n_ids)   # children; v >= 0 from the front, ~(2i) and ~(2i+1) (< 2 * n_ids) from the back
  O: list = [None] * (3 * n_ids)   # op names
  def expand(v: int) -> list[int]:
    if v >= 0:
      O[v], _, ks = orig[v]
      ks = K[v] = list(map(rget, listed(ks) if len(ks) == 1 and nodes[ks[0]] is None else ks))
      return ks
    i, is_store = divmod(~v, 2)   # AFTER(f, STORE(f, value)) into realize point i's fresh buffer f
    f = rget(fresh[i])
    if not is_store: O[v] = "AFTER"; ks = K[v] = [f, v - 1]; return ks
    op, _, iks = orig[i]
    O[v] = "STORE"; ks = K[v] = [f, rget(iks[0] if op == "CONTIGUOUS" else listed(orig[iks[1]][2])[1])]; return ks
  if in_encoding_order(enc):
    sink = [R[i] for i in sorted({i for i, (o, _, _) in orig.items() if o == "AFTER" and R[i] == i} |
                                 {i for i, r in ids.redirect.items() if r == ~(2 * i)})]
  else: sink = _ordered_sink(ids.roots, O, K, expand)
  return _materialize(nodes, O, K, expand, sink, ids.roots, enc.keys, enc.fresh_buffers, has_bound_dims(enc), ids)

def _ordered_sink(roots: list[int], O: list, K: list, expand: Callable[[int], list[int]]) -> list[int]:
  """The AFTERs under `roots` in the order a post-order walk from them finishes them (`build_call`'s SINK)."""
  order, stack, done, seen = [], list(reversed(roots)), _DONE, bytearray(len(K))
  while stack:
    if (v := stack.pop()) is done: order.append(stack.pop()); continue
    if seen[v]: continue
    seen[v] = 1
    stack += (v, done)
    stack += reversed(K[v] if K[v] is not None else expand(v))
  return [v for v in order if O[v] == "AFTER"]

def build_plan(p: Plan) -> BuiltCall:
  """`materialized_call(encode(roots))` from the graph's Plan, without encoding: the same body, buffer_map and counts
  over other fresh buffers."""
  def unexpanded(v: int) -> list[int]: raise EngineError(f"direct plan: vertex {v} has no kids")
  sink = p.sink if p.in_order else _ordered_sink(p.roots, p.O, p.K, unexpanded)
  return _materialize(p.nodes, p.O, p.K, unexpanded, sink, p.roots, p.keys, p.fresh_uids, False, p)

def _materialize(nodes: list[Node], O: list, K: list, expand: Callable[[int], list[int]], sink: list[int], roots: list[int],
                 keys: list[Node], fresh_uids: set[int], bound_dims: bool, ids: IdDag) -> BuiltCall:
  """The all-materialized CALL over flat vertex lists (`K[v]` None: not yet `expand`ed): one walk from the SINK's
  AFTERs numbers the PARAMs (pre-order from the SINK) and builds each vertex as it finishes (every buffer under it has
  its PARAM by then)."""
  done = _DONE
  args: list[Node] = []
  slot_of: dict[Node, int] = {}
  built: list = [None] * len(K)
  walked = bytearray(len(K))
  get, stores, CALL, FUNCTION, STORE = built.__getitem__, set(), Ops.CALL, Ops.FUNCTION, Ops.STORE
  stack = list(reversed(sink))
  while stack:   # PARAMs numbered at first visit, as `parameterize` walks; a vertex built when it finishes
    if (v := stack.pop()) is done:
      v = stack.pop()
      if v < 0:
        if ~v & 1: continue   # the STORE is made with its AFTER
        t, (_, val) = get(K[v][0]), K[v - 1]
        built[v - 1], built[v] = st = t.stored(get(val)); stores.add(st[0])
        continue
      src = tuple(map(get, K[v]))
      if (o := (n := nodes[v]).op) is CALL or o is FUNCTION: src = (n.src[0], *src)
      built[v] = n = n.over(src)   # a BUFFER's PARAM and views keep its shape: most nodes skip inference
      if o is STORE: stores.add(n)
      continue
    if walked[v]: continue
    walked[v] = 1
    ks = K[v] if K[v] is not None else expand(v)
    if (o := O[v]) == "SLICE" and K[ks[0]] is None: expand(ks[0])
    if o != "BUFFER" and (o != "SLICE" or O[ks[0]] != "BUFFER"): stack += (v, done); stack += reversed(ks); continue
    n = nodes[v] if o == "BUFFER" else nodes[v].over((nodes[ks[0]],))   # a whole SLICE(BUFFER): one arg
    if n not in slot_of: slot_of[n] = len(args); args.append(n)
    built[v] = n.param(slot_of[n])
  body = Node(Ops.SINK, dtypes.void, tuple(dict.fromkeys(built[v] for v in sink)))
  body, args = bind_dims(body, args) if bound_dims else (body, args)
  for v in roots:   # the storage chains of realize points that are views (not walked from the SINK)
    while (ks := K[v] if K[v] is not None else expand(v)) and O[v] != "BUFFER" and O[v] != "PARAM": v = ks[0]
  buffer_map, views = buffer_map_of(keys, roots, O, K, ids)
  buffers = sum(1 for a in args if a.op is Ops.BUFFER and a.arg.uid in fresh_uids)
  return BuiltCall(Node(Ops.CALL, dtypes.void, (body, *args), CallInfo()), buffer_map, len(stores), buffers, views)
