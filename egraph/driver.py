"""The callify driver: encode -> saturate -> extract -> build the CALL (PARAMs numbered) and buffer_map -> CallifyResult.

`saturate` (encode -> Runner -> load, materialize, optimize) and `extract_call` (freeze -> EGraphView -> costs ->
extract; `.terms` decodes) are the pipeline's two halves; explain, export and the soundness checker call them too, so
every tool sees the e-graph and the extraction callify sees. `build_call` turns the chosen e-classes into the CALL in
one rebuild (what `parameterize` of the decoded terms gives). Under Limits callify plans its time (`Budget`): when the
e-graph will not fit, or runs out of time, it builds the all-materialized CALL straight from the encoding
(`materialized_call`), the form the e-graph would give with no optimize rule.
E-class identity replaces tinygrad's tags: each realize point (an original node) names the e-class of its realized
form, so after extraction its storage is read straight off the chosen term."""
from __future__ import annotations
import dataclasses, gc, time
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Protocol
from egraph.ir import Node, Ops, GroupOp, ParamArg, CallInfo, toposort, substitute, new_buffer, map_args, const_key
from egraph.dtype import dtypes
from egraph.errors import CallsatError, EngineError, ShapeError
from egraph.symbolic import BoundVar, Variable, dims_in, map_dims
from egraph.encode import encode, Encoding
from egraph.direct import plan, Plan
from egraph.runner import (Runner, Limits, Schedule, StepHook, StopReason, OutOfBudget, LIMIT_PRESETS, SCHEDULE_PRESETS,
                           resolve, checkpoint)
from egraph.cost import CostModel, COST_PRESETS
from egraph.extract import EGraphView, ChosenIds, Unextractable, Terms, extract, decode, baseline_cost, TICK, INF
from egraph.report import CallifyReport
from egraph.fusion import fusion_mode, cost_plan, add_candidates, partition_ids, mark, temporaries, solver_deadline

@dataclass
class CallifyResult:
  call: Node                      # CALL(SINK(roots...), *args)
  buffer_map: dict[Node, Node]    # original node -> storage view
  report: CallifyReport

def storage_view(n: Node) -> Node:
  """The storage a realized term lives in: AFTERs and value markers (DETACH, CONTIGUOUS_BACKWARD: unoptimized forms
  keep them) stripped from the view chain, reshapes collapsed."""
  chain = []
  while n.op is not Ops.BUFFER and n.op is not Ops.PARAM:
    if n.op is Ops.AFTER or n.op is Ops.DETACH or n.op is Ops.CONTIGUOUS_BACKWARD: n = n.src[0]; continue
    if n.op not in GroupOp.Movement and n.op not in (Ops.SLICE, Ops.MULTI, Ops.BITCAST):   # BITCAST: a retyped assign target
      raise EngineError(f"extraction chose a non-storage form {n.op.name} for a realized value")
    chain.append((n.op, n.dtype, n.arg)); n = n.src[0]
  return view_over(n, chain)

def view_over(n: Node, chain: list[tuple]) -> Node:
  """A view chain, (op, dtype, arg) outermost first, rebuilt over storage n with reshapes collapsed."""
  for op, dtype, arg in reversed(chain):
    if op is Ops.RESHAPE: n = n.src[0].reshape(arg) if n.op is Ops.RESHAPE else n.reshape(arg)
    else: n = Node(op, dtype, (n,), arg)
  return n

def parameterize(body: Node) -> tuple[Node, list[Node]]:
  """Replace global BUFFERs and whole SLICE(BUFFER)s by PARAM(slot) in first-visit pre-order (spec §4.4), then bound
  symbolic dimensions by their variables, passing each value as a trailing BIND arg: the body is the cache key."""
  args, slots, seen, stack = [], {}, set(), [body]
  while stack:
    n = stack.pop()
    if n.id in seen: continue
    seen.add(n.id)
    if n.op is Ops.BUFFER or (n.op is Ops.SLICE and n.src[0].op is Ops.BUFFER):
      slots[n] = n.param(len(args))
      args.append(n); continue
    stack.extend(reversed(n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src))
  return bind_dims(substitute([body], slots)[0], args)

def bind_dims(body: Node, args: list[Node]) -> tuple[Node, list[Node]]:
  """The parameterized body with its bound symbolic dimensions replaced by their variables, their values appended to
  `args` as BIND nodes."""
  bound: dict = {}
  for n in toposort([body], enter_calls=False):
    for d in dims_in(_dims_arg(n)):
      if isinstance(d, BoundVar):
        if bound.setdefault(d.var.key, d) != d:
          raise ShapeError(f"callify: variable {d.var.name} is bound to {int(bound[d.var.key])} and {int(d)} in one graph")
  if bound: body = map_args([body], lambda d: d.var if isinstance(d, BoundVar) else d)[0]
  return body, args + [Node(Ops.BIND, dtypes.int32, (), (d.var, int(d))) for d in bound.values()]

def _dims_arg(n: Node):
  """The part of a node's arg that can hold symbolic dimensions."""
  return n.arg.shape if n.op is Ops.PARAM else () if n.op in (Ops.CALL, Ops.FUNCTION, Ops.BIND) else n.arg

def bindings(call: Node) -> tuple[Node, dict]:
  """(the CALL without its BIND args and with plain sizes for its variables, {variable key: value}): what runs."""
  for a in call.src[1:]:
    if a.op is Ops.BIND and not (a.src == () and isinstance(a.arg, tuple) and isinstance(a.arg[0], Variable)):
      raise CallsatError(f"CALL: a BIND argument must bind a Variable to a value, got {a.arg!r}")
  binds = {a.arg[0].key: int(a.arg[0].bind(a.arg[1])) for a in call.src[1:] if a.op is Ops.BIND}
  if not binds: return call, {}
  body = map_args([call.src[0]], lambda d: binds.get(d.key, d) if isinstance(d, Variable) else d)[0]
  return Node(Ops.CALL, dtypes.void, (body, *(a for a in call.src[1:] if a.op is not Ops.BIND)), call.arg), binds

def roots_of(xs) -> list[Node]:
  """The graph roots under Tensors or Nodes (a SINK gives its sources)."""
  out = []
  for x in xs:
    n = getattr(x, "node", x)
    if not isinstance(n, Node): raise CallsatError(f"callify takes Tensors or Nodes, got {type(x).__name__}")
    if n.op is Ops.SINK: out.extend(n.src)
    else: out.append(n)
  return out

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
  buffer_map, views = _buffer_map(keys, roots, O, K, ids)
  stores = len({built[v].id for v in walked if O[v] == "STORE"})
  buffers = sum(1 for a in args if a.op is Ops.BUFFER and a.arg.uid in fresh_buffers)
  return BuiltCall(Node(Ops.CALL, dtypes.void, (body, *args), CallInfo()), buffer_map, stores, buffers, views)

_DONE = object()
_VIEW_OPS = frozenset({o.name for o in GroupOp.Movement} | {"SLICE", "MULTI", "BITCAST"})   # BITCAST: a retyped assign target
_SKIP_OPS = frozenset({"AFTER", "DETACH", "CONTIGUOUS_BACKWARD"})   # what storage_view strips

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
  def __init__(self, enc: Encoding):
    self.enc, self.nodes, self.orig, fresh = enc, enc.nodes, enc.original, enc.fresh
    zero = {r[0] for r in enc.rows.get("zero_row", ())}
    pre = {g: r for g, r in enc.rows.get("precompiled_row", ())}
    self.cons = {c: (h, t) for c, h, t in enc.rows.get("cons_row", ())}
    special = {i: o for i, (o, a, _) in self.orig.items()
               if o == "CONTIGUOUS" or (o == "AFTER" and a in enc.computed_args) or (o == "GETTUPLE" and i in pre)}
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

def _buffer_map(keys, roots, O, K, ids) -> tuple[dict, int]:
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

def materialized_call(enc: Encoding) -> BuiltCall:
  """The all-materialized CALL straight from the Encoding (no e-graph), linear in the graph: callify's fallback when
  its limits leave no time to saturate and extract. `build_call` over `MaterializedIds`, node for node, specialized:
  a vertex v indexes flat lists (~(2i), ~(2i+1) from their end); the SINK's AFTERs are in id order where
  `in_encoding_order` says so (else one walk orders them); one walk numbers the PARAMs (pre-order from the SINK) and
  builds each vertex as it finishes (every buffer under it has its PARAM by then)."""
  ids = MaterializedIds(enc)
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
  done = _DONE   # a vertex under _DONE is finished when _DONE pops
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
  buffer_map, views = _buffer_map(keys, roots, O, K, ids)
  buffers = sum(1 for a in args if a.op is Ops.BUFFER and a.arg.uid in fresh_uids)
  return BuiltCall(Node(Ops.CALL, dtypes.void, (body, *args), CallInfo()), buffer_map, len(stores), buffers, views)

# ---- the result cache: the same graph over other buffers reuses the saturated result ---------------------------------

@dataclass
class _Entry:
  """A cached result, with what rebinding it to another graph of the same key needs, found once (a hit is on every
  realize of a program in a loop)."""
  topo: list[Node]           # the graph it was computed for, in canonical order
  result: CallifyResult
  buffers: list[int]         # positions of the graph's BUFFERs in topo
  keys: list[int]            # position of each buffer_map key in topo
  minted: list[Node]         # the BUFFERs callify minted for values (CALL args, storage views): a hit mints new ones
  symbolic: bool             # does the graph bind symbolic dimensions (then BIND args and views take new values)

  @staticmethod
  def of(topo: list[Node], res: CallifyResult) -> _Entry:
    pos = {n.id: i for i, n in enumerate(topo)}
    # a temporary (CallInfo.temps) keeps its BUFFER: no executor gives it storage
    temps = {res.call.src[1 + i] for i in getattr(res.call.arg, "temps", ())}
    minted = {b: None for v in [*res.call.src[1:], *res.buffer_map.values()] for b in toposort([v])
              if b.op is Ops.BUFFER and b.arg.uid in res.report.fresh_uids and b not in temps}
    symbolic = any(isinstance(d, BoundVar) for n in topo for d in dims_in(_dims_arg(n)))
    return _Entry(topo, res, [i for i, n in enumerate(topo) if n.op is Ops.BUFFER], [pos[k.id] for k in res.buffer_map],
                  list(minted), symbolic)

_CACHE: OrderedDict = OrderedDict()
CACHE_SIZE = 32

def graph_key(roots: list[Node], topo: list[Node] | None = None) -> tuple[tuple, list[Node]]:
  """A key equal for graphs that differ only in which input buffers they read (buffers are named by position);
  `topo`: toposort(roots, enter_calls=False), if made already."""
  if topo is None: topo = toposort(roots, enter_calls=False)
  pos = {n.id: i for i, n in enumerate(topo)}
  parts = tuple((n.op, n.dtype, (n.arg.size, n.arg.device) if n.op is Ops.BUFFER else
                 (n.arg, n.src[0].id) if n.op in (Ops.CALL, Ops.FUNCTION) else const_key(n.arg) if n.op is Ops.CONST else
                 map_dims(n.arg, _unbind),
                 tuple(pos[s.id] for s in (n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src))) for n in topo)
  return (parts, tuple(pos[r.id] for r in roots)), topo

def _unbind(d): return d.var if isinstance(d, BoundVar) else d

def _reuse(e: _Entry, topo: list[Node], t0: float) -> CallifyResult:
  """The cached result rebound to this graph's buffers and variable values, with freshly minted output buffers."""
  old, et = e.result, e.topo
  m = {o: n for i in e.buffers if (o := et[i]) is not (n := topo[i])}
  for b in e.minted: m[b] = new_buffer(b.arg.size, b.dtype, b.arg.device)
  args = substitute(list(old.call.src[1:]), m)
  values = substitute(list(old.buffer_map.values()), m)
  if e.symbolic:
    binds: dict = {}
    for n in topo: dims_in(_dims_arg(n), binds)
    new_value = {d.var.key: d for d in binds if isinstance(d, BoundVar)}
    args = [Node(Ops.BIND, a.dtype, (), (a.arg[0], int(new_value[a.arg[0].key]))) if a.op is Ops.BIND else a for a in args]
    values = map_args(values, lambda d: new_value.get(d.var.key, d) if isinstance(d, BoundVar) else d)
  report = dataclasses.replace(old.report, cache_hit=True, seconds={"cache": time.perf_counter() - t0})
  return CallifyResult(Node(Ops.CALL, dtypes.void, (old.call.src[0], *args), old.call.arg),
                       {topo[i]: v for i, v in zip(e.keys, values)}, report)

def callify(*tensors, cost: str | CostModel = "bytes", schedule: str | Schedule = "saturate",
            limits: str | Limits | None = None, cache: bool = True, assigns: str = "fresh",
            fusion: str | None = None) -> CallifyResult:
  """Turn the graph under `tensors` into one CALL by equality saturation. Pure: no tensor is changed.
  With `cache`, a graph equal to an earlier one up to its input buffers reuses that result without saturating.
  `assigns="realized"` reads an assign into a view of a realize point as tinygrad 0.14 does (see encode).
  `fusion` ("rules" | "cost", default env CALLSAT_FUSION, else "cost"): who decides which intermediates get a buffer,
  lower/'s heuristics or the time model's partition (egraph/fusion.py)."""
  t0 = time.perf_counter()
  model: CostModel = resolve(cost, COST_PRESETS, "cost model")
  sched: Schedule = resolve(schedule, SCHEDULE_PRESETS, "schedule")
  lim: Limits = resolve(limits if limits is not None else "default", LIMIT_PRESETS, "limits")
  roots = roots_of(tensors)
  fus = fusion_mode(fusion)
  t1 = time.perf_counter()
  topo = toposort(roots, enter_calls=False)
  topo_s = time.perf_counter() - t1
  key = None
  # the key costs a third of encoding: only a graph of a cached one's size can hit (a fallback needs no key at all)
  if cache and any(len(e.topo) == len(topo) for e in _CACHE.values()):
    key = (graph_key(roots, topo)[0], model, sched, lim, assigns, fus)
    if (hit := _CACHE.get(key)) is not None:
      _CACHE.move_to_end(key)
      return _reuse(hit, topo, t0)
  was = gc.isenabled()
  gc.disable()   # callify allocates ~10 objects per node and makes no reference cycles: the cyclic GC only costs time (~25%)
  try: res = _callify(roots, model, sched, lim, t0, assigns, fus, topo, topo_s)
  finally:
    if was: gc.enable()
  if cache and res.report.fallback is None:   # a fallback answers this call's time, not the graph: the next call may saturate
    if key is None: key = (graph_key(roots, topo)[0], model, sched, lim, assigns, fus)
    _CACHE[key] = _Entry.of(topo, res)
    while len(_CACHE) > CACHE_SIZE: _CACHE.popitem(last=False)
  return res

# ---- the pipeline, built once ----------------------------------------------------------------------------------------

@dataclass
class Saturation:
  """A saturated e-graph: the encoding, the Runner that holds the e-graph (its stats), and a frozen view of it."""
  enc: Encoding
  runner: Runner
  @cached_property
  def graph(self) -> EGraphView: return EGraphView(self.runner.freeze(), self.runner.egraph, self.enc, self.runner.abort_at)

def saturate(enc: Encoding, schedule: str | Schedule = "saturate", limits: str | Limits | None = None,
             hook: StepHook | None = None, abort_at: float = INF, reserve: Callable[[int], float] | None = None,
             clock: float | None = None) -> Saturation:
  """Load `enc` into a fresh e-graph and run the load, materialize and optimize phases of `schedule` under `limits`.
  With a `hook` the rules apply one at a time and the hook sees every step (the same fixpoint). Past `abort_at` a step
  boundary (and reading the e-graph) raises OutOfBudget; `reserve(e-nodes)` is the time kept for extraction; the time
  limit counts from `clock` (default: the Runner's creation)."""
  runner = Runner(resolve(schedule, SCHEDULE_PRESETS, "schedule"), hook, abort_at, reserve, clock)
  try:
    runner.load(enc.rows, encoding=enc)
    runner.materialize()
    runner.optimize(resolve(limits if limits is not None else "default", LIMIT_PRESETS, "limits"))
  except OutOfBudget as e: e.stats = runner.stats; raise
  return Saturation(enc, runner)

@dataclass
class Extraction:
  """What extraction chose: per e-node local costs, the realize classes, one e-node per class, the DAG cost; `terms`
  decodes every class reachable from the realize classes (on first use)."""
  graph: EGraphView
  costs: list[int | None]
  root_classes: list[int]
  choice: list[int]
  cost: int
  reached: list[int] | None = None   # the classes the chosen DAG reaches (extract.chosen_dag; None: one has no choice)
  @cached_property
  def terms(self) -> Terms: return decode(self.graph, self.choice, self.root_classes, self.reached)   # decoded on first use

def extract_call(sat: Saturation, model: CostModel, deadline: float = INF) -> Extraction:
  """Extract the CALL form callify uses: pinned (storage-form) extraction with sharing-aware refinement (skipped past
  `deadline`); past the Runner's `abort_at` it raises OutOfBudget."""
  g, abort_at = sat.graph, sat.runner.abort_at
  costs = g.local_costs(model, abort_at)
  root_classes = [g.class_of_id[sat.enc.key_ids[k.id]] for k in sat.enc.keys]
  choice, cost, reached = extract(g, costs, root_classes, g.pinned_allowed(), deadline=deadline, abort_at=abort_at)
  return Extraction(g, costs, root_classes, choice, cost, reached)

# ---- callify under its limits: the e-graph when it fits, else the all-materialized CALL built directly -----------------

@dataclass
class Budget:
  """Callify's plan under Limits: its time runs from the end of encoding, and the time each step will take is
  predicted from how long encoding took per row (the same machine, the same moment), in multiples measured on chain
  and DAG graphs of 10k-200k nodes (bench/callify_limits.py) with headroom. Saturation, extraction and the CALL must
  end by `start + seconds`; the promise kept is `start + 1.5 * seconds + 0.3`, so the e-graph path gives up at
  `abort_at`, when there is just time left to build the all-materialized CALL instead."""
  start: float
  seconds: float
  per_row: float     # seconds encoding took per row
  rows: int
  # multiples of the encode time per row (EXTRACT: per e-node) measured 0.6-0.75 to load, 1.7-2.9 to extract and
  # build the CALL, 0.7-1.2 to build the CALL directly (notes/benchmarks.md); FIXED: a Runner's declarations, temp files
  LOAD, EXTRACT, FALLBACK, FIXED = 1.0, 3.5, 1.5, 0.02
  TOPO = 5.0   # encoding takes 5.2-8.9x the toposort (same graphs)

  @classmethod
  def plan(cls, enc: Encoding, seconds: float, encode_s: float) -> Budget:
    rows = sum(len(r) for r in enc.rows.values())
    return cls(time.perf_counter(), seconds, encode_s / max(rows, 1), rows)

  @classmethod
  def no_e_graph(cls, lim: Limits, nodes: int, topo_s: float) -> str | None:
    """Why the e-graph cannot fit, seen before encoding (`nodes` in the graph, its toposort took `topo_s`): encoding
    takes at least TOPO times the toposort, the e-graph path LOAD + EXTRACT / 2 times encoding at least. None: encode
    and let the plan decide."""
    if nodes > lim.nodes: return f"node limit: {nodes} graph nodes > {lim.nodes}"
    need = cls.FIXED + cls.TOPO * topo_s * (cls.LOAD + cls.EXTRACT / 2)
    return f"time limit: predicted {need:.2f}s at least to saturate and extract, {lim.seconds:g}s allowed" if need > lim.seconds else None

  def extract_s(self, e_nodes: int) -> float: return self.EXTRACT * self.per_row * e_nodes
  def fallback_s(self) -> float: return self.FALLBACK * self.per_row * self.rows
  @property
  def abort_at(self) -> float: return self.start + 1.5 * self.seconds + 0.3 - self.fallback_s()

  def too_slow(self, e_nodes: int) -> str | None:
    """Why the e-graph path should not start (predicted past the budget), or None."""
    need = self.FIXED + self.LOAD * self.per_row * self.rows + self.extract_s(e_nodes)
    left = self.start + self.seconds - time.perf_counter()
    return f"predicted {need:.2f}s to saturate and extract, {max(left, 0):.2f}s left" if need > left else None

def loaded_size(enc: Encoding) -> int:
  """E-nodes the e-graph holds after loading and materializing `enc`: one per term row, an AFTER and a STORE per
  realize point stored (a little more than egglog counts where rows coincide)."""
  terms = sum(len(enc.rows.get(r, ())) for r in ("leaf_row", "un_row", "bin_row", "ter_row", "var_row", "cons_row", "nil_row"))
  return terms + 2 * len(enc.fresh)

def _callify(roots: list[Node], model: CostModel, sched: Schedule, lim: Limits, t0: float, assigns: str = "fresh",
             fusion: str = "rules", topo: list[Node] | None = None, topo_s: float = 0.0) -> CallifyResult:
  if topo is None: topo = toposort(roots, enter_calls=False)
  if (why := Budget.no_e_graph(lim, len(topo), topo_s)) is not None and (res := _from_graph(roots, topo, topo_s, model, sched, lim, assigns, fusion, why)):
    return res
  enc = encode(roots, assigns, topo)
  tm, why = cost_plan(enc) if fusion == "cost" else (None, "")   # cost mode: candidates get stored forms (egraph/fusion.py)
  cands = add_candidates(enc) if tm is not None else {}
  report = CallifyReport(cost_model=model.name, schedule=sched.name, graph_nodes=enc.graph_nodes, realize_points=len(enc.keys),
                         fusion="cost" if tm is not None else "rules", fusion_note=why)
  report.seconds["encode"] = time.perf_counter() - t0
  if not enc.keys:
    return CallifyResult(Node(Ops.CALL, dtypes.void, (Node(Ops.SINK, dtypes.void, ()),), CallInfo()), {}, report)
  budget = Budget.plan(enc, lim.seconds, report.seconds["encode"])
  report.baseline_cost = baseline_cost(enc, model)
  report.fresh_uids = set(enc.fresh_buffers)
  size = loaded_size(enc)
  if size > lim.nodes:
    return _direct(enc, report, StopReason.NODE_LIMIT, f"node limit: loading makes ~{size} e-nodes > {lim.nodes}")
  if (why := budget.too_slow(size)) is not None: return _direct(enc, report, StopReason.TIME_LIMIT, "time limit: " + why)
  try:
    sat = saturate(enc, sched, lim, abort_at=budget.abort_at, reserve=budget.extract_s, clock=budget.start)
    st = sat.runner.stats
    report.iterations, report.matches, report.stop_reason = st.iterations, dict(st.matches), st.stop_reason
    report.stop_nodes = st.size
    report.seconds.update(st.seconds)
    t1 = time.perf_counter()
    report.e_nodes, report.e_classes = sat.graph.n_enodes, sat.graph.n_classes
    ex = extract_call(sat, model, deadline=budget.start + lim.seconds)
    report.cost = ex.cost
    report.seconds["extract"] = time.perf_counter() - t1
    ids = ChosenIds(sat.graph, ex.choice)
    if tm is not None:   # the partition gets what is left of the time budget
      t3 = time.perf_counter()
      ids, report.partition = partition_ids(sat.graph, ex.choice, ex.terms, ex.root_classes, enc, cands, tm,
                                            solver_deadline(t3 - t0, budget.start + lim.seconds))
      report.seconds["partition"] = time.perf_counter() - t3
    t2 = time.perf_counter()
    b = build_call(ids, ex.root_classes, enc.keys, enc.fresh_buffers, has_bound_dims(enc),
                   budget.abort_at)
    report.seconds["decode"] = time.perf_counter() - t2
  except OutOfBudget as e:
    if (st := e.stats) is not None:   # saturation stopped: what it did is reported
      report.iterations, report.matches, report.stop_nodes = st.iterations, dict(st.matches), st.size
      report.seconds.update(st.seconds)
    return _direct(enc, report, StopReason.TIME_LIMIT, f"time limit: out of time {e.where}")
  except Unextractable as e:
    if report.stop_reason is StopReason.SATURATED: raise
    return _direct(enc, report, report.stop_reason, f"{report.stop_reason}: stopped before every value had a form ({e})")
  report.stores, report.buffers, report.views = b.stores, b.buffers, b.views
  if time.perf_counter() - budget.start > lim.seconds and report.stop_reason is StopReason.SATURATED:
    report.stop_reason = StopReason.TIME_LIMIT   # saturated in time, but extraction and decoding ran past the budget
  if tm is None: return CallifyResult(b.call, b.buffer_map, report)
  call = mark(b.call, temporaries(b.call, enc, b.buffer_map))
  report.temps = len(call.arg.temps)
  return CallifyResult(call, b.buffer_map, report)

def _from_graph(roots: list[Node], topo: list[Node], topo_s: float, model: CostModel, sched: Schedule, lim: Limits,
                assigns: str, fusion: str, why: str) -> CallifyResult | None:
  """The fallback without encoding (`direct.plan`), where the toposort's time says the e-graph will not fit: None where
  the graph needs encode's path, or the plan shows loading would fit the node limit after all."""
  t = time.perf_counter()
  if (p := plan(roots, topo, model, assigns)) is None: return None
  if why.startswith("node limit"):
    if p.size <= lim.nodes: return None
    why = f"node limit: loading makes at least {p.size} e-nodes > {lim.nodes}"
  reason = StopReason.NODE_LIMIT if why.startswith("node limit") else StopReason.TIME_LIMIT
  report = CallifyReport(cost_model=model.name, schedule=sched.name, graph_nodes=len(topo), realize_points=len(p.keys),
                         stop_reason=reason, fallback=why + "; not encoded", cost=p.cost, baseline_cost=p.cost,
                         fresh_uids=p.fresh_uids, fusion=fusion,
                         fusion_note="no e-graph: no partition" if fusion == "cost" else "")
  report.seconds.update(toposort=topo_s, plan=time.perf_counter() - t)
  if not p.keys: return CallifyResult(Node(Ops.CALL, dtypes.void, (Node(Ops.SINK, dtypes.void, ()),), CallInfo()), {}, report)
  t = time.perf_counter()
  b = build_plan(p)
  report.seconds["direct"] = time.perf_counter() - t
  report.stores, report.buffers, report.views = b.stores, b.buffers, b.views
  return CallifyResult(b.call, b.buffer_map, report)

def _direct(enc: Encoding, report: CallifyReport, reason: StopReason, why: str) -> CallifyResult:
  """The fallback: the all-materialized CALL built from the Encoding, reported with why."""
  t = time.perf_counter()
  b = materialized_call(enc)
  report.seconds["direct"] = time.perf_counter() - t
  report.stop_reason, report.fallback, report.cost = reason, why, report.baseline_cost
  report.stores, report.buffers, report.views = b.stores, b.buffers, b.views
  return CallifyResult(b.call, b.buffer_map, report)
