"""Node graph -> egglog rows, in bulk. This is where callify's pass 1 lives: realize points are found, wrapped in
CONTIGUOUS, and given a fresh buffer view; contiguity facts are computed once here so the rules stay local.

Every inserted node gets an integer id; the handle `(N id)` names its e-class. Rows go to TSV files read with egglog's
`input` command and lifted into terms by the `load` rules in one iteration, whatever the depth of the graph."""
from __future__ import annotations
import math
import numpy as np
from dataclasses import dataclass, field
from egraph.ir.ops import Node, Ops, GroupOp, ParamArg, toposort, substitute, empty_view, empty_multi, shard_axes, HOST_DEVICES, const_key
from egraph.ir.dtype import dtypes
from egraph.ir.errors import UnsupportedOpError, DeviceError, ShapeError
from egraph.ir.view import contiguous_range, view_index
from egraph.ir.symbolic import is_symbolic

COMPUTED_TARGET = "computed-target"  # arg marker of an AFTER whose target is not storage (it is never extracted)
_VARIADIC = (Ops.CALL, Ops.FUNCTION, Ops.SINK, Ops.TUPLE)
_DISK_OK = GroupOp.Movement | GroupOp.Storage | {Ops.COPY, Ops.AFTER, Ops.STORE, Ops.CONTIGUOUS, Ops.DETACH, Ops.BITCAST}

def is_host(device) -> bool: return isinstance(device, str) and device.startswith(HOST_DEVICES)

class UnwritableViewError(ShapeError):
  """An assign through a view of storage that does not name each of its elements exactly once (EXPAND, PAD, CAST)."""

def writable_chain(x: Node) -> bool:
  """Does the movement chain x name each element of x.base at most once, and none outside it? RESHAPE/SHRINK/PERMUTE/FLIP
  always do; a chain with PAD or EXPAND does when no padded or broadcast element is in view (a[::2] pads, then shrinks)."""
  n, seen = x, False
  while n.op in GroupOp.Movement or n.op is Ops.DETACH:
    if n.op in (Ops.PAD, Ops.EXPAND): seen = True
    n = n.src[0]
  if not seen: return True
  idx = view_index(x)
  return bool((idx >= 0).all()) and np.unique(idx).size == idx.size

def assigns_into_computed(n: Node, realized: frozenset = frozenset()) -> bool:
  """An AFTER whose written target is not a buffer view: callify gives it a fresh buffer (spec rule 8). With `realized`
  (Node ids of realize points: tinygrad 0.14's reading), a view of a realize point is the storage that point gets."""
  t = n
  while t.op in (Ops.AFTER, Ops.BITCAST, Ops.MULTI):
    t = t.src[0]
    if not writable_chain(t): return True    # not a writable view: the written value needs its own buffer
    t = t.base
  return t.op not in GroupOp.Storage and t.id not in realized

def realize_points(roots: list[Node], topo: list[Node]) -> list[Node]:
  """Original nodes that get storage (spec §4.1): bases of the roots, every CONTIGUOUS and AFTER, host COPYs."""
  keys: dict[int, Node] = {}
  for r in roots:
    b = r.base
    if b.device is not None and not b.has_buffer_identity() and b.op is not Ops.AFTER and b.shape is not None: keys[b.id] = b
  for n in topo:
    if n.device is None: continue
    if n.op in (Ops.CONTIGUOUS, Ops.AFTER) or (n.op is Ops.COPY and is_host(n.src[0].device)): keys[n.id] = n
    if n.op is Ops.FUNCTION and n.arg.precompile:   # an opaque call reads its inputs from storage
      for x in n.src[1:]:
        if x.device is not None and not x.has_buffer_identity() and x.op is not Ops.AFTER: keys.setdefault(x.id, x)
  return list(keys.values())

def live_topo(roots: list[Node], topo: list[Node], realized: frozenset = frozenset()) -> tuple[list[Node], set[int]]:
  """(topo without what only the overwritten target of an assign into a computed value reads, the ids of those assigns'
  STOREs whose target is dropped). tinygrad's callify (spec rule 8, tinygrad 0.14 alike) replaces AFTER(t, STORE(t, v))
  whose t is no buffer by CONTIGUOUS(v) before it collects realize points and assigns: t's old value is dead, so a
  realize point or an assign only t reads (a lazy init the assign overwrites, its RNG counter update) is not stored."""
  reach: dict[int, bool] = {r.id: True for r in roots}   # id -> read whole (True) or a dropped-target STORE (False)
  dead_target = False
  for n in reversed(topo):   # parents first
    if (whole := reach.get(n.id)) is None: continue
    if not whole: kids = (n.src[1],)   # STORE(t, v) of an assign into a computed t: only v is read
    elif n.op is Ops.AFTER and len(n.src) == 2 and n.src[1].op is Ops.STORE and assigns_into_computed(n, realized):
      reach.setdefault(n.src[1].id, False); dead_target = True; continue
    else: kids = n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src
    for s in kids: reach[s.id] = True
  if not dead_target: return topo, set()
  return [n for n in topo if n.id in reach], {i for i, whole in reach.items() if not whole}

def folded_bitcasts(topo: list[Node], keys: list[Node]) -> set[int]:
  """BITCASTs tinygrad 0.14's callify reads as retyped views of storage: the source of a CONTIGUOUS or COPY, a STORE's
  target or a realize point, reached through movement ops that keep one contiguous range (and other such BITCASTs).
  Any other BITCAST stays in its kernel: a view there would pass the CALL a buffer of a dtype tinygrad would not
  (a bfloat16 one, which clang here cannot compile)."""
  starts = [n.src[0] for n in topo if n.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.STORE) and n.src]
  starts += [k for k in keys if k.op not in (Ops.CONTIGUOUS, Ops.AFTER)]
  out: set[int] = set()
  for x in starts:
    top = n = x
    while True:
      while n.op in GroupOp.Movement or n.op is Ops.DETACH: n = n.src[0]
      if n.op is not Ops.BITCAST or n.id in out or contiguous_range(top, n) is None: break
      out.add(n.id); top = n = n.src[0]
  return out

@dataclass
class Encoding:
  """The inserted graph: ids, the arg intern table, the rows, and the realize points with their e-class ids."""
  roots: list[Node]
  nodes: list[Node] = field(default_factory=list)            # id -> Node (originals and nodes minted here)
  ids: dict[int, int] = field(default_factory=dict)          # Node.id -> id
  args: list[tuple] = field(default_factory=lambda: [(None, None)])   # arg id -> (dtype, arg); 0 = "derive"
  arg_ids: dict = field(default_factory=dict)
  rows: dict[str, list[tuple]] = field(default_factory=dict)
  keys: list[Node] = field(default_factory=list)             # realize points (original nodes), in graph order
  key_ids: dict[int, int] = field(default_factory=dict)      # Node.id of a key -> id of its realized e-class
  fresh: dict[int, int] = field(default_factory=dict)        # realize id -> fresh storage view id
  fresh_buffers: set[int] = field(default_factory=set)       # BufferArg uids minted here
  pins: dict[int, int] = field(default_factory=dict)         # assign id -> id of the target it must write
  stores_into_computed: set[int] = field(default_factory=set)  # STORE ids under an AFTER into a computed value
  computed_args: set[int] = field(default_factory=set)       # arg ids marking AFTERs into computed values
  original: dict[int, tuple] = field(default_factory=dict)   # id -> (op, arg id, child ids) of the original e-node
  calls: dict[int, tuple] = field(default_factory=dict)      # precompiled FUNCTION Node.id -> (outputs, CALL)
  axes: dict[int, int | None] = field(default_factory=dict)  # Node.id -> shard axis of multi-device values
  nil: int = -1
  graph_nodes: int = 0                                       # original nodes under the roots (CALL bodies not entered)

  def arg_id(self, dtype, arg, op: str = "") -> int:
    k = (op, dtype, const_key(arg) if op == "CONST" else arg)   # True == 1 and -0.0 == 0.0: the op and bits tell them apart
    if (i := self.arg_ids.get(k)) is None: i = self.arg_ids[k] = len(self.args); self.args.append((dtype, arg))
    return i

  def row(self, rel: str, *vals) -> None: self.rows.setdefault(rel, []).append(vals)

  def new_id(self, n: Node | None) -> int:
    i = len(self.nodes); self.nodes.append(n)
    if n is not None: self.ids[n.id] = i
    return i

  def emit(self, n: Node, child_ids: list[int], arg_id: int | None = None, original: bool = True) -> int:
    """One row for node n with the given child ids; returns its id."""
    i = self.new_id(n)
    a = self.arg_id(n.dtype, (n.arg, n.src[0]) if n.op in (Ops.CALL, Ops.FUNCTION) else n.arg, n.op.name) if arg_id is None else arg_id
    op = n.op.name
    if n.op in _VARIADIC or (n.op is Ops.AFTER and len(child_ids) != 2) or len(child_ids) > 3:
      child_ids = [self.cons(child_ids)]
      self.row("var_row", i, op, a, child_ids[0])
    else: self.row(("leaf_row", "un_row", "bin_row", "ter_row")[len(child_ids)], i, op, a, *child_ids)
    if original: self.original[i] = (op, a, tuple(child_ids))
    if n.has_buffer_identity(): self.row("storage_row", i)
    return i

  def cons(self, ids: list[int]) -> int:
    if self.nil < 0: self.nil = self.new_id(None); self.row("nil_row", self.nil)
    tail = self.nil
    for h in reversed(ids):
      c = self.new_id(None); self.row("cons_row", c, h, tail); tail = c
    return tail

  def emit_tree(self, n: Node, original: bool = True) -> int:
    """Emit n and whichever of its children are not inserted yet (for nodes minted here: views, fresh buffers).
    Alternatives found by analysis (views) are not `original`: the all-materialized baseline may not use them."""
    stack = [(n, False)]
    while stack:   # children first, never descending below what is already inserted (views sit on top of big graphs)
      m, ready = stack.pop()
      if m.id in self.ids: continue
      kids = m.src[1:] if m.op in (Ops.CALL, Ops.FUNCTION) else m.src
      if ready: self.emit(m, [self.ids[s.id] for s in kids], original=original); continue
      stack.append((m, True)); stack.extend((s, False) for s in kids if s.id not in self.ids)
    return self.ids[n.id]

  def fresh_view(self, n: Node) -> int:
    """Emit a fresh storage view for realize point n (its own buffer); returns its id."""
    f = empty_multi(n, self.axes.get(n.id, self.axes.get(n.src[0].id) if n.src else None)) if isinstance(n.device, tuple) else \
        empty_view(n.shape, n.dtype, n.device)
    self.fresh_buffers.add(_buffer_of(f).arg.uid)
    return self.emit_tree(f)

  def mint_fresh(self, realize_id: int, n: Node, view: int | None = None) -> None:
    self.fresh[realize_id] = self.fresh_view(n) if view is None else view
    self.row("fresh_row", realize_id, self.fresh[realize_id])

ASSIGNS = ("fresh", "realized")

def encode(roots: list[Node], assigns: str = "fresh", topo: list[Node] | None = None) -> Encoding:
  """Insert the graph under `roots`: consumers of a realize point see CONTIGUOUS(point), as tinygrad's rule 6 does.
  `assigns`: an assign into a view of a computed realize point gets a fresh buffer ("fresh", spec rule 8) or writes
  that point's own storage after it is stored ("realized", tinygrad 0.14's callify). "realized" is tinygrad 0.14's
  reading of BITCAST too: only the BITCASTs its pass folds are views (`folded_bitcasts`); "fresh" makes every BITCAST of
  a contiguous range of storage one (spec rule 3). In both, an assign into a computed value drops its target's old
  value (`live_topo`). `topo`: toposort(roots, enter_calls=False), if made already."""
  if assigns not in ASSIGNS: raise UnsupportedOpError(f"callify: assigns must be one of {ASSIGNS}, got {assigns!r}")
  enc = Encoding(list(roots))
  if topo is None: topo = toposort(roots, enter_calls=False)
  enc.graph_nodes, enc.keys = len(topo), realize_points(roots, topo)
  realized = frozenset(k.id for k in enc.keys) if assigns == "realized" else frozenset()
  topo, dropped = live_topo(roots, topo, realized)   # an assign into a computed value drops its target's old value
  if dropped: enc.keys = realize_points(roots, topo)
  folded = folded_bitcasts(topo, enc.keys) if assigns == "realized" else None
  pending: dict[int, int] = {}                 # id of a computed assign's AFTER -> its fresh view (minted at its STORE)
  if any(isinstance(n.device, tuple) for n in topo): enc.axes = shard_axes(roots)
  is_key = {k.id for k in enc.keys}
  wrapped: dict[int, int] = {}   # Node.id -> id that consumers reference
  contigs: list[tuple[int, Node]] = []
  bitcasts: list[tuple[int, Node]] = []
  copies: list[Node] = []                      # movement views that a COPY reads
  copies_into: list[tuple[int, Node]] = []     # (assign id, host COPY it stores): the copy may land in place
  uses: dict[int, int] = {}
  consumers: dict[int, list[Node]] = {}        # for a dropped-target STORE: its AFTER
  for n in topo:
    for s in n.src: uses[s.id] = uses.get(s.id, 0) + 1
    if dropped:
      for s in n.src:
        if s.id in dropped: consumers.setdefault(s.id, []).append(n)
  for r in roots: uses[r.id] = uses.get(r.id, 0) + 1
  for n in topo:
    if n.op is Ops.BIND: raise UnsupportedOpError("callify: BIND nodes belong in CALL args; bind a Variable in a shape instead")
    if isinstance(n.device, str) and n.device.startswith("DISK:") and n.op not in _DISK_OK:
      raise DeviceError(f"callify: {n.op.name} {n.shape} on {n.device}: DISK tensors only support copies and movement ops")
    if n.id in enc.ids: wrapped.setdefault(n.id, enc.ids[n.id]); continue   # already inserted as a wrapper
    if n.op is Ops.CONTIGUOUS and n.device is None:          # nothing to allocate on: a no-op on values
      wrapped[n.id] = wrapped[n.src[0].id]; enc.ids[n.id] = wrapped[n.id]; continue
    kids = n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src
    if n.id in dropped:   # STORE(t, v) of an assign into a computed t, t dropped: the store into its fresh view f
      aft = next(p for p in consumers[n.id] if p.op is Ops.AFTER)
      pending[aft.id] = enc.fresh_view(aft)
      child_ids = [pending[aft.id], wrapped[n.src[1].id]]
    elif n.id in pending: child_ids = [pending[n.id], wrapped[n.src[1].id]]   # AFTER(f, STORE(f, v)): t is not read
    else: child_ids = [enc.ids[s.id] if n.op is Ops.CONTIGUOUS and s.contiguous() is n else wrapped[s.id] for s in kids]
    computed = n.op is Ops.AFTER and assigns_into_computed(n, realized)
    if computed and not (len(n.src) == 2 and n.src[1].op is Ops.STORE):
      raise UnsupportedOpError(f"callify: AFTER into a computed {n.src[0].op.name} must have exactly one STORE dependency")
    i = enc.emit(n, child_ids, enc.arg_id(n.dtype, COMPUTED_TARGET, "AFTER") if computed else None)
    v = n.src[1].src[1] if n.op is Ops.AFTER and len(n.src) == 2 and n.src[1].op is Ops.STORE else None
    if computed:
      enc.mint_fresh(i, n, pending.get(n.id)); enc.stores_into_computed.add(child_ids[1])
      if (a := enc.arg_id(n.dtype, COMPUTED_TARGET, "AFTER")) not in enc.computed_args: enc.computed_args.add(a); enc.row("computed_arg", a)
    elif n.op is Ops.AFTER and n.device is not None:
      enc.pins[i] = child_ids[0]     # an assign writes its own target: extraction must keep that storage
    else: v = None
    # a host COPY stored by an assign (into storage or a computed value's fresh buffer) may land there (tinygrad merges
    # the COPY's realize point into the AFTER's)
    if v is not None and v.op is Ops.COPY and v.id in is_key and uses.get(v.id) == 1: copies_into.append((i, v))
    if n.op is Ops.CONTIGUOUS: contigs.append((i, n))
    if n.op is Ops.BITCAST and (folded is None or n.id in folded): bitcasts.append((i, n))
    if n.op is Ops.COPY and n.src[0].base is not n.src[0]: copies.append(n.src[0])
    wrapped[n.id] = i
    if n.id in is_key and n.op not in (Ops.CONTIGUOUS, Ops.AFTER):
      w = n.contiguous()
      if w.id in enc.ids: wrapped[n.id] = enc.ids[w.id]
      else: wrapped[n.id] = enc.emit(w, [i]); contigs.append((wrapped[n.id], w))
  for k in enc.keys: enc.key_ids[k.id] = wrapped[k.id]
  for i, c in contigs: _contiguous_facts(enc, i, c)
  for i, c in bitcasts: _bitcast_facts(enc, i, c)
  for x in copies:
    if (view := _slice_view(enc, x, x)) is not None: enc.row("view_row", enc.ids[x.id], enc.emit_tree(view, original=False))
  for i, v in copies_into: enc.row("copy_into_row", i, wrapped[v.id])
  for g in topo:
    if g.op is Ops.GETTUPLE and g.src[0].op is Ops.FUNCTION and g.src[0].arg.precompile:
      outs, call = precompiled_call(enc, g.src[0])
      enc.row("precompiled_row", enc.ids[g.id], enc.emit_tree(outs[g.arg].after(call)))
  return enc

def precompiled_call(enc: Encoding, f: Node) -> tuple[list[Node], Node]:
  """A precompiled FUNCTION as an opaque CALL writing fresh output buffers (spec §4.2.1): (output views, CALL).
  Inputs are read from storage; an output that is a CONTIGUOUS is materialized straight into its output buffer, and one
  that is storage of the body (with what it waits for: a custom kernel writing it) becomes the output buffer itself."""
  if (hit := enc.calls.get(f.id)) is not None: return hit
  body, n_in = f.src[0], len(f.src) - 1
  inputs = [x if x.has_buffer_identity() or x.op is Ops.AFTER or x.device is None else x.contiguous() for x in f.src[1:]]
  seed = {p.id: enc.axes.get(f.src[1 + p.arg.slot].id) for p in toposort([body], enter_calls=False)
          if p.op is Ops.PARAM and 0 <= p.arg.slot < n_in and isinstance(p.device, tuple) and not p.arg.shard}
  axes = shard_axes(list(body.src), seed) if seed else {}   # outputs are split as the body splits them
  outs = [empty_multi(s, axes.get(s.id)) if isinstance(s.device, tuple) else empty_view(s.shape, s.dtype, s.device)
          for s in body.src]
  enc.fresh_buffers.update(_buffer_of(o).arg.uid for o in outs)
  items, subs = [], {}
  for j, s in enumerate(body.src):   # a sharded output is a logical PARAM over a MULTI; a replicated one writes every device
    t = Node(Ops.PARAM, s.dtype, (), ParamArg(n_in + j, s.shape, s.device, shard=isinstance(s.device, tuple) and outs[j].op is not Ops.MULTI))
    deps: list[Node] = []
    while s.op is Ops.AFTER: deps.extend(s.src[1:]); s = s.src[0]   # what the output waits for travels with it
    if s.op is Ops.CONTIGUOUS and s not in subs: subs[s] = t.after(t.store(s.src[0])); items.append(s.after(*deps))
    elif s.op in (Ops.BUFFER, Ops.MULTI) and s.has_buffer_identity() and s not in subs:   # the body's own buffer (not an
      subs[s] = t; items.append(s.after(*deps))                                              # input PARAM) IS the output
    else: items.append(t.after(t.store(s.after(*deps))))
  sink = Node(Ops.SINK, dtypes.void, tuple(substitute(items, subs)))
  hit = enc.calls[f.id] = (outs, Node(Ops.CALL, dtypes.void, (sink, *inputs, *outs), f.arg))
  return hit

def _buffer_of(v: Node) -> Node:
  while v.op is not Ops.BUFFER: v = v.src[0]
  return v

def _contiguous_facts(enc: Encoding, i: int, c: Node) -> None:
  """Fresh buffer, zero-size and view facts for one CONTIGUOUS e-node."""
  x = c.src[0]
  if x.has_buffer_identity(): return          # contiguous_of_storage covers it; no fresh buffer to mint
  enc.mint_fresh(i, c)
  if c.numel == 0: enc.row("zero_row", i); return
  if (view := _slice_view(enc, x.src[0] if x.op is Ops.BITCAST else x, c)) is not None:
    enc.row("view_row", enc.ids[x.id], enc.emit_tree(view, original=False))

def _bitcast_facts(enc: Encoding, i: int, c: Node) -> None:
  """A BITCAST of one contiguous range of storage is that range, retyped (spec rule 3)."""
  if c.numel and (view := _slice_view(enc, c.src[0], c)) is not None: enc.row("view_row", i, enc.emit_tree(view, original=False))

def _into_shards(x: Node, m: Node) -> tuple[Node, int] | None:
  """The movement chain x over MULTI m applied to each shard instead (tinygrad's multi rewrite), with the new shard
  axis; None if a movement op cuts across the sharded axis."""
  chain, n = [], x
  while n is not m: chain.append(n); n = n.src[0]
  cur, axis, D = m.src[0], m.arg, len(m.device)
  for op in reversed(chain):
    full = op.src[0].shape[axis]
    if op.op is Ops.RESHAPE:
      pre = math.prod(op.src[0].shape[:axis])
      new = next((i for i in range(len(op.arg)) if math.prod(op.arg[:i]) == pre and op.arg[i] % D == 0), None)
      if new is None: return None
      cur, axis = cur.reshape(tuple(d // D if i == new else d for i, d in enumerate(op.arg))), new
    elif op.op is Ops.SHRINK and op.arg[axis] == (0, full):
      cur = cur.shrink(tuple((0, cur.shape[axis]) if i == axis else r for i, r in enumerate(op.arg)))
    elif op.op is Ops.PERMUTE: cur, axis = cur.permute(op.arg), op.arg.index(axis)
    elif op.op is Ops.FLIP and not op.arg[axis]: cur = cur.flip(op.arg)
    elif op.op is Ops.EXPAND and op.arg[axis] == full:
      cur = cur.expand(tuple(cur.shape[axis] if i == axis else d for i, d in enumerate(op.arg)))
    else: return None
  return cur, axis

def _shard_view(x: Node, m: Node, out: Node) -> Node | None:
  """A contiguous range of every shard of a sharded buffer: MULTI(SLICE(buffer).reshape(shard shape)), retyped to
  out.dtype (the reference loses the dtype here, quirk Q2)."""
  if (r := _into_shards(x, m)) is None: return None
  cur, axis = r
  buf = cur.base
  if buf.op is not Ops.BUFFER or (out.dtype != x.dtype and axis == len(out.shape) - 1): return None
  if (rng := contiguous_range(cur, buf)) is None: return None
  shard = tuple(d // len(m.device) if i == axis else d for i, d in enumerate(out.shape))
  view = Node(Ops.SLICE, out.dtype, (buf,), (rng[0], math.prod(shard))).reshape(shard)
  return Node(Ops.MULTI, out.dtype, (view,), axis)

def _slice_view(enc: Encoding, x: Node, out: Node) -> Node | None:
  """`out` (x's value, maybe retyped) as SLICE(storage, offset, count).reshape(out.shape) if x is one contiguous range
  of storage: a buffer, a SLICE, a PARAM, or a value realized in this CALL (its CONTIGUOUS wrapper)."""
  b = x.base
  if b.op is Ops.MULTI and b is not x and b.src[0].has_buffer_identity(): return _shard_view(x, b, out)
  if b.device is None or (b is x and x.dtype == out.dtype): return None
  if isinstance(b.device, tuple) and b.op is not Ops.BUFFER: return None   # a per-device buffer: each device's own range
  if any(map(is_symbolic, x.shape + out.shape)): return None   # a SLICE has a fixed size: no views of symbolic shapes
  if b.op in GroupOp.Storage: stor = b
  elif b.op is Ops.CONTIGUOUS or (b.op is Ops.AFTER and b.src[0].has_buffer_identity()): stor = b
  elif b.id in enc.key_ids: stor = b.contiguous()   # the wrapper consumers read
  else: return None
  if stor.op is not Ops.CONTIGUOUS and stor.id not in enc.ids: return None
  if (rng := contiguous_range(x, b)) is None: return None
  off, _ = rng
  if stor.op is Ops.SLICE and stor.dtype == stor.src[0].dtype: stor, off = stor.src[0], stor.arg[0] + off
  src = stor.reshape((stor.numel,))
  if src.op is Ops.RESHAPE and src.src[0].op is Ops.RESHAPE: src = src.src[0].src[0].reshape(src.shape)
  return Node(Ops.SLICE, out.dtype, (src,), (off, out.numel)).reshape(out.shape)
