"""tinygrad 0.14 UOps <-> callsat IR, for the bridge (`egraph.tinygrad`). Imported only by the bridge: tinygrad is never a
requirement of callsat's own path.

Into callsat, what callify decides on keeps its structure: BUFFER, CONTIGUOUS, AFTER, STORE, COPY, CAST, BITCAST, DETACH,
CONTIGUOUS_BACKWARD and the movement ops (tinygrad's (offset, size) PAD/SHRINK and prefix EXPAND rewritten to callsat's
forms). Every other op (ALU, REDUCE, THREEFRY, CALL/FUNCTION bodies, RANGE, UNSHARD...) travels as OPAQUE with its
dtype, shape and device: callify never needs its arithmetic, and the way back rebuilds the original UOp over new sources.
Back out, callsat's CALL is rebuilt as tinygrad UOps: OPAQUE from its original, storage from the buffers callsat chose
(fresh ones become new tinygrad BUFFERs), views as SHRINK(BUFFER)[.BITCAST], PARAMs typed like their args."""
from __future__ import annotations
import itertools
from dataclasses import dataclass, field, fields
from tinygrad.uop.ops import UOp, Ops as TOps, shape_to_shape_arg, CallInfo as CallInfo_, ParamArg as ParamArg_
from tinygrad.dtype import dtypes as tdt, AddrSpace
from egraph.ir.ops import Node, Ops, GroupOp, OpaqueArg, BufferArg, ParamArg, CallInfo, DEVICE_KINDS, toposort
from egraph.ir.dtype import dtypes, DType
from egraph.ir.errors import CallsatError, UnsupportedOpError
from egraph.ir.symbolic import HostDim

class BridgeRefusal(UnsupportedOpError):
  """The bridge cannot take this tinygrad graph; `reason` names the op, dtype or form (`op:X`, `dtype:X`, `form:X`)."""
  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"callsat bridge cannot take this graph ({reason})" + (f": {detail}" if detail else ""))
    self.reason, self.detail = reason, detail

class DiskViewError(CallsatError, RuntimeError):
  """tinygrad's own error for a non-contiguous view of a DISK buffer (0.14 raises it where it makes the view's buffer):
  the bridge raises it in both modes, as stock tinygrad would on the same graph."""
  def __init__(self, u: UOp):
    super().__init__(f"non-contiguous view is not supported for {u.device} buffer ({u.op.name} {u.shape})")

_DT = {tdt.bool: dtypes.bool, tdt.int8: dtypes.int8, tdt.uint8: dtypes.uint8, tdt.int16: dtypes.int16,
       tdt.uint16: dtypes.uint16, tdt.int32: dtypes.int32, tdt.uint32: dtypes.uint32, tdt.int64: dtypes.int64,
       tdt.uint64: dtypes.uint64, tdt.float16: dtypes.float16, tdt.bfloat16: dtypes.bfloat16,
       tdt.float32: dtypes.float32, tdt.float64: dtypes.float64, **{getattr(tdt, d.name): d for d in dtypes.fp8s}}
_TDT = {v: k for k, v in _DT.items()}
_WEAK = {tdt.weakint: dtypes.int64, tdt.weakfloat: dtypes.float32}   # never stored: tinygrad refuses to realize them
_DIRECT = {TOps.CONTIGUOUS: Ops.CONTIGUOUS, TOps.CONTIGUOUS_BACKWARD: Ops.CONTIGUOUS_BACKWARD, TOps.DETACH: Ops.DETACH,
           TOps.CAST: Ops.CAST, TOps.BITCAST: Ops.BITCAST, TOps.AFTER: Ops.AFTER, TOps.STORE: Ops.STORE}
_MOVE = {TOps.RESHAPE, TOps.EXPAND, TOps.PAD, TOps.SHRINK, TOps.PERMUTE, TOps.FLIP}
BUFFER_UID_BASE = 1 << 48   # tinygrad buffer numbers live apart from the uids callsat mints

def to_dtype(dt, what: str = "") -> DType:
  if (d := _DT.get(dt)) is not None: return d
  if (d := _WEAK.get(dt)) is not None: return d
  if dt == tdt.void: return dtypes.void
  raise BridgeRefusal(f"dtype:{dt.name}", what)

def to_device(d):
  """tinygrad's device names: callsat's own where they mean the same, `EXT:<name>` (never run by callsat) otherwise."""
  if (r := _DEVICES.get(d)) is not None: return r
  if d is None: return None
  if isinstance(d, tuple): r = tuple(to_device(x) for x in d)
  else: r = d if d.partition(":")[0].upper() in DEVICE_KINDS else f"EXT:{d}"
  if len(_DEVICES) < 4096: _DEVICES[d] = r   # a process names few devices: bounded all the same
  return r

_DEVICES: dict = {}

def from_device(d):
  if isinstance(d, tuple): return tuple(from_device(x) for x in d)
  return d[4:] if isinstance(d, str) and d.startswith("EXT:") else d

def _ints(shape, what: str) -> tuple[int, ...]:
  if shape is None: return None
  if not all(isinstance(s, int) for s in shape): raise BridgeRefusal("form:symbolic-shape", f"{what} has shape {shape}")
  return tuple(shape)

def param_like(u: UOp, slot: int) -> UOp:
  """`u.param_like(slot)`; for a single-device BUFFER the PARAM it builds, made from the buffer's own shape src and arg
  (the same object) without working out the buffer's axis, shape and address space."""
  if u.op is TOps.BUFFER and type(a := u.arg) is ParamArg_ and type(a.device) is str and a.addrspace is AddrSpace.GLOBAL:
    return UOp(TOps.PARAM, src=u.src, arg=ParamArg_(slot, *[getattr(a, f) for f in _PARAM_REST]))   # replace(a, slot=slot)
  return u.param_like(slot)

_PARAM_REST = tuple(f.name for f in fields(ParamArg_))[1:]   # ParamArg's fields after `slot`, its first

def _concrete(x) -> bool:
  return type(x) is int or type(x) is bool or isinstance(x, Ops) or (type(x) is tuple and all(map(_concrete, x)))

def int_move(op: Ops, x: UOp, shape: tuple[int, ...], arg) -> UOp:
  """callsat's movement op `op` with int `arg` over `x` (int `shape`), not a no-op, as the UOps tinygrad 0.14's
  movement method builds (hash-consed: the same objects), without its checks (callsat checked the shapes) and its
  simplify (a no-op on int shape args). The steps depend on (op, arg, shape) alone: made once per process (bounded)."""
  if (steps := _STEPS.get(key := (op, arg, shape))) is None:
    steps = _move_steps(op, shape, arg)
    if len(_STEPS) >= STEPS_SIZE: _STEPS.pop(next(iter(_STEPS)))   # oldest out; a racing thread makes an entry twice
    _STEPS[key] = steps
  for o, srcs, a in steps: x = UOp(o, x.dtype, (x, *srcs), a)
  return x

_STEPS: dict = {}
STEPS_SIZE = 8192

def _move_steps(op: Ops, shape: tuple[int, ...], arg) -> tuple:
  """(tinygrad op, shape srcs, arg) per UOp tinygrad's method stacks on the source: SHRINK and PAD as (offset, size) and
  (before, new size), an EXPAND as a squeeze, an EXPAND of the new axes on the left and a PERMUTE back (its
  `_broadcast_to`)."""
  S = shape_to_shape_arg
  if op is Ops.RESHAPE: return ((TOps.RESHAPE, (S(arg),), None),)
  if op is Ops.PERMUTE or op is Ops.FLIP: return ((TOps.PERMUTE if op is Ops.PERMUTE else TOps.FLIP, (), arg),)
  if op is Ops.SHRINK or op is Ops.PAD:
    marg = [(a, b - a) for a, b in arg] if op is Ops.SHRINK else [(a, d + a + b) for (a, b), d in zip(arg, shape)]
    return ((TOps.SHRINK if op is Ops.SHRINK else TOps.PAD, tuple(map(S, zip(*marg))), None),)
  # EXPAND (callsat's keeps the rank)
  at = tuple(i for i, (d, nd) in enumerate(zip(shape, arg)) if d == 1 and nd != 1)
  kept = tuple(i for i in range(len(shape)) if i not in at)
  perm = tuple(at.index(i) if i in at else len(at) + kept.index(i) for i in range(len(shape)))
  return ((TOps.RESHAPE, (S(tuple(shape[i] for i in kept)),), None), (TOps.EXPAND, (S(tuple(arg[i] for i in at)),), None),
          *(((TOps.PERMUTE, (), perm),) if perm != tuple(range(len(shape))) else ()))

_SERIAL = itertools.count()   # conversions alive at once (threads) never share a symbolic dimension's key

@dataclass
class Conversion:
  """One tinygrad graph in callsat IR: the images of its UOps and what the way back needs."""
  image: dict = field(default_factory=dict)        # UOp -> Node
  origins: dict = field(default_factory=dict)      # Node.id -> [UOp, ...] whose image it is
  opaque: dict = field(default_factory=dict)       # OPAQUE ident -> (UOp, converted src positions)
  buffers: dict = field(default_factory=dict)      # callsat BUFFER uid -> tinygrad BUFFER
  keep: list = field(default_factory=list)         # Nodes alive for the conversion's life (hash-consing is weak)
  files: set = field(default_factory=set)          # COPYs onto a disk read through views (realized)
  aliases: set = field(default_factory=set)        # UOps whose image is another UOp's (never buffer_map keys)
  params: dict = field(default_factory=dict)       # callsat PARAM Node.id -> tinygrad PARAM (function bodies)
  calls: dict = field(default_factory=dict)        # callsat CallInfo name -> tinygrad FUNCTION arg
  dims: dict = field(default_factory=dict)         # tinygrad symbolic dimension (UOp) -> HostDim
  dim_uops: dict = field(default_factory=dict)     # HostDim key -> tinygrad UOp
  serial: int = field(default_factory=lambda: next(_SERIAL))
  bound_vars: bool = False                         # did the graph hold a bound variable (a call input)?
  inert: set = field(default_factory=set)          # constant leaves not converted (`to_callsat(consts=False)`)
  ranges: bool = False                             # did the graph hold a RANGE (then a CALL's body may leak one)?
  shapes: dict = field(default_factory=dict)       # tinygrad shape -> callsat's (a graph repeats a few shapes)

  def img(self, u: UOp) -> Node:
    """u's image; an inert constant read where callify sees values (a STORE's source) is converted when first read."""
    if (n := self.image.get(u)) is None:
      n = self.image[u] = _convert(self, u)
      if u not in self.aliases: self.origins.setdefault(n.id, []).append(u)   # an alias's image is its value's
    return n

  def dim(self, d):
    """A tinygrad dimension as callsat's: ints stay, an expression becomes a HostDim worth its maximum."""
    if isinstance(d, int): return d
    if (h := self.dims.get(d)) is None:
      h = self.dims[d] = HostDim(int(d.vmax), (self.serial, len(self.dims)), d.op.name, self.algebra)
      self.dim_uops[h.key] = d
    return h

  def algebra(self, op: str, a, b):
    """A sum or difference of dimensions as tinygrad simplifies it (HostDim's algebra); None for a foreign dimension."""
    ua, ub = (self.dim_uops.get(x.key) if isinstance(x, HostDim) else int(x) for x in (a, b))
    if ua is None or ub is None: return None
    r = ua + ub if op == "add" else ua - ub
    if isinstance(r, UOp): r = r.simplify()
    return int(r.arg) if isinstance(r, UOp) and r.op is TOps.CONST else self.dim(r)

  def shape(self, shape):
    if shape is None: return None
    if (r := self.shapes.get(shape)) is None: r = self.shapes[shape] = tuple(self.dim(d) for d in shape)
    return r

def _opaque(cv: Conversion, u: UOp, srcs: tuple[int, ...]) -> Node:
  if cv.inert: srcs = tuple(i for i in srcs if u.src[i] not in cv.inert)   # kept as they are on the way back
  shape = cv.shape(u._shape) if u.dtype != tdt.void else None
  dev = to_device(u.device)   # weak values keep their device (tinygrad's); they are never realize points here
  axis = None
  if isinstance(dev, tuple):
    try: axis = u.axis
    except Exception: axis = None   # tinygrad cannot say (several sharded axes): callify treats it as replicated
  arg = OpaqueArg(u.op.name, shape, dev, len(cv.opaque), axis if isinstance(axis, int) else None)
  cv.opaque[arg.ident] = (u, srcs)
  return Node(Ops.OPAQUE, to_dtype(u.dtype, u.op.name), tuple(cv.image[u.src[i]] for i in srcs), arg)

def _views_storage(u: UOp) -> bool:
  b = u.base
  while b.op in (TOps.AFTER, TOps.BITCAST, TOps.UNSHARD): b = b.src[0].base
  return b.op is TOps.BUFFER

def _image_views_storage(n: Node) -> bool:
  """Does callsat see the target of an assign as storage (else it would write a fresh buffer, not tinygrad's)?"""
  while True:
    while n.op in GroupOp.Movement or n.op in (Ops.DETACH, Ops.AFTER, Ops.BITCAST, Ops.MULTI): n = n.src[0]
    return n.op in GroupOp.Storage

def _int_marg(u: UOp) -> bool:
  try: return u.op in (TOps.PERMUTE, TOps.FLIP) or all(isinstance(v, int) for v in _flat(u.marg)) and all(isinstance(d, int) for d in u.shape)
  except Exception: return False

def _per_device_marg(u: UOp) -> bool:
  """Does a movement op's argument depend on the device (a RANGE over the devices), not only on bound variables?"""
  if _int_marg(u): return False
  try: return any(isinstance(v, UOp) and any(x.op is TOps.RANGE for x in v.toposort()) for v in _flat(u.marg))
  except Exception: return True

def _flat(x):
  for a in x: yield from (_flat(a) if isinstance(a, tuple) else (a,))

def _retype(cv: Conversion, x: Node, dtype: DType) -> Node:
  """x as `dtype` for callsat's typing only: tinygrad stores a weak (or other) value into a typed target and converts it
  itself; the way back drops this node."""
  arg = OpaqueArg("RETYPE", x.shape, x.device, len(cv.opaque))
  cv.opaque[arg.ident] = (None, (0,))
  return Node(Ops.OPAQUE, dtype, (x,), arg)

def movement(cv: Conversion, u: UOp, x: Node) -> Node:
  """tinygrad movement op `u` over x (u.src[0]'s image) as callsat's; BridgeRefusal for a form it cannot say."""
  shape = cv.shape(u.shape)
  if u.op is TOps.RESHAPE: return Node(Ops.RESHAPE, x.dtype, (x,), shape)
  if u.op is TOps.PERMUTE: return Node(Ops.PERMUTE, x.dtype, (x,), tuple(u.arg))
  if u.op is TOps.FLIP: return Node(Ops.FLIP, x.dtype, (x,), tuple(bool(f) for f in u.arg))
  if u.op is TOps.EXPAND:   # tinygrad prepends axes and broadcasts: RESHAPE to add them as size 1, then EXPAND
    k = len(shape) - len(x.shape)
    if k < 0: raise BridgeRefusal("form:expand", f"EXPAND {x.shape} -> {shape}")
    return Node(Ops.EXPAND, x.dtype, (x.reshape((1,) * k + x.shape),), shape)
  src_shape = u.src[0].shape
  if u.op is TOps.SHRINK:   # (offset, size) -> (start, end); a symbolic end is tinygrad's own expression offset+size
    arg = tuple((cv.dim(o), cv.dim(sz) if isinstance(o, int) and o == 0 else cv.dim(o + sz)) for o, sz in u.marg)
    n = Node(Ops.SHRINK, x.dtype, (x,), arg)
  else:                     # (offset, size) -> (before, after)
    n = Node(Ops.PAD, x.dtype, (x,), tuple((cv.dim(o), cv.dim(sz - o - d)) for (o, sz), d in zip(u.marg, src_shape)))
  if not _same_dims(n.shape, shape): raise BridgeRefusal("form:symbolic-movement", f"{u.op.name} {u.marg} -> {u.shape}")
  return n

def _same_dims(a, b) -> bool: return len(a) == len(b) and all(type(x) is type(y) and x == y for x, y in zip(a, b))

def _convert(cv: Conversion, u: UOp) -> Node:
  op = u.op
  if op is TOps.BUFFER and u.arg.addrspace is AddrSpace.GLOBAL and not u.is_variable:
    size = _ints(u.shape, "BUFFER")[0]
    n = Node(Ops.BUFFER, to_dtype(u.dtype, "BUFFER"), (), BufferArg(BUFFER_UID_BASE + u.arg.slot, size, to_device(u.device)))
    cv.buffers[n.arg.uid] = u
    return n
  virtual = u.device is None or u.dtype in _WEAK
  if op is TOps.AFTER and u.is_bound_var:   # a call input, never an assign
    cv.bound_vars = True
    return _opaque(cv, u, ())
  if op is TOps.AFTER and virtual:
    # an assign with nowhere to store: tinygrad reads AFTER(t, STORE(t, v)) into a computed t as v (CONTIGUOUS of a
    # virtual value is not realized); otherwise it stays what it is
    st = u.src[1] if len(u.src) == 2 else None
    if st is not None and st.op is TOps.STORE and st.src[0] is u.src[0] and not u.src[0].has_buffer_identity():
      cv.aliases.add(u)
      return cv.img(st.src[1])
    return _opaque(cv, u, tuple(range(len(u.src))))
  if op in _MOVE and not virtual:
    if isinstance(u.device, tuple) and _per_device_marg(u):   # a per-device select of a lazy shard: carried (an assign
      return _opaque(cv, u, tuple(range(len(u.src))))          # through it is refused below)
    try: return movement(cv, u, cv.img(u.src[0]))
    except CallsatError as e:   # a symbolic form callsat's movement ops cannot say: carried opaque unless it views storage
      if _views_storage(u): raise BridgeRefusal("form:symbolic-view", getattr(e, "detail", str(e))) from None
      return _opaque(cv, u, tuple(range(len(u.src))))
  if op is TOps.UNSHARD and not virtual and len(u.arg) == 1 and len(u.src) == 2 and u.src[1].op is TOps.RANGE:
    x = cv.img(u.src[0])   # per-device values -> one logical value split along the axis: callsat's MULTI
    if isinstance(x.device, tuple): return Node(Ops.MULTI, x.dtype, (x,), u.arg[0])
  if op is TOps.COPY and not virtual:
    n = Node(Ops.COPY, to_dtype(u.dtype), (cv.img(u.src[0]),), to_device(u.arg))
    return n.contiguous() if u in cv.files else n
  if op in _DIRECT and not virtual:
    if op is TOps.CONTIGUOUS and (len(u.src) != 1 or u.arg is not None): raise BridgeRefusal("form:contiguous-with-options", str(u.arg))
    srcs = tuple(cv.img(s) for s in u.src)
    if op is TOps.STORE and len(srcs) == 2 and srcs[1].dtype != srcs[0].dtype: srcs = (srcs[0], _retype(cv, srcs[1], srcs[0].dtype))
    dt = dtypes.void if op is TOps.STORE else to_dtype(u.dtype, op.name)
    try: return Node(_DIRECT[op], dt, srcs, None)
    except CallsatError as e: raise BridgeRefusal(f"form:{op.name.lower()}", str(e)) from None
  if op is TOps.PARAM and u.arg.addrspace is AddrSpace.GLOBAL and not virtual:   # an argument inside a function body
    n = Node(Ops.PARAM, to_dtype(u.dtype, "PARAM"), (), ParamArg(u.arg.slot, cv.shape(u.shape), to_device(u.device),
                                                                 shard=False))   # logical, as tinygrad reads it
    cv.params[n.id] = u
    return n
  if op is TOps.TUPLE: return Node(Ops.TUPLE, dtypes.void, tuple(cv.img(s) for s in u.src))
  if op is TOps.FUNCTION and u.arg.precompile:   # callsat's precompile_call decides how its inputs and outputs are stored
    if u.src[0].op is not TOps.TUPLE: raise BridgeRefusal("form:precompiled-function", f"body is {u.src[0].op.name}, not TUPLE")
    info = CallInfo(f"tg{cv.serial}.{len(cv.calls)}", precompile=True)
    cv.calls[info.name] = u.arg
    return Node(Ops.FUNCTION, dtypes.void, tuple(cv.img(s) for s in u.src), info)
  if op is TOps.GETTUPLE and cv.img(u.src[0]).op is Ops.FUNCTION: return Node(Ops.GETTUPLE, None, (cv.img(u.src[0]),), u.arg)
  body = 1 if op in (TOps.CALL, TOps.FUNCTION) else 0   # a body is scoped to its call: it stays tinygrad's
  return _opaque(cv, u, tuple(range(body, len(u.src))))

# the ops a UOp's device comes from (tinygrad 0.14's `UOp.device`; every other op has a source's, MSELECT/MSTACK pick
# among sources'): no DISK device anywhere in a graph unless one of these has it
_DEVICE_ROOTS = frozenset({TOps.BUFFER, TOps.PARAM, TOps.COPY, TOps.STAGE, TOps.ALLREDUCE})

def _on_disk(u: UOp) -> bool: return isinstance(u.device, str) and u.device.startswith(("DISK", "TINYFS"))

def _check_disk(topo) -> None:
  """tinygrad 0.14 gives DISK tensors rules of their own (copies pushed past movement ops, DISK COPY items, its own
  'non-contiguous view' errors). The bridge takes the forms it reproduces: reads of a RESHAPE/SHRINK/BITCAST chain by a
  COPY off the disk, and whole-buffer writes AFTER(buf, STORE(buf, COPY onto the disk)); anything else is refused."""
  for u in topo:
    if not _on_disk(u) or u.op in (TOps.BUFFER, TOps.SINK): continue
    if u.op in _MOVE or u.op is TOps.BITCAST: continue   # checked where it is read
    if u.op is TOps.CONTIGUOUS and _file_view(u.src[0]): continue   # a view of a file or a file written, read where copied
    if u.op is TOps.CONTIGUOUS and _file_chain(u.src[0]): raise DiskViewError(u.src[0])
    if u.op is TOps.COPY and not _on_disk(u.src[0]): continue       # checked where it is stored
    if u.op in (TOps.AFTER, TOps.STORE):
      st = u.src[1] if u.op is TOps.AFTER and len(u.src) == 2 else u
      if st.op is TOps.STORE and st.src[0].base.op is TOps.BUFFER and st.src[0].shape == st.src[0].base.shape or \
         st.op is TOps.STORE and st.src[0].op is TOps.RESHAPE and st.src[0].src[0].op is TOps.BUFFER:
        if st.src[1].op is TOps.COPY: continue
    raise BridgeRefusal("form:disk", f"{u.op.name} on {u.device}")
  for u in topo:
    if u.op is TOps.COPY and _on_disk(u.src[0]) and not _on_disk(u):
      x = u.src[0].src[0] if u.src[0].op is TOps.CONTIGUOUS else u.src[0]
      if _file_view(x): continue
      if _file_chain(x): raise DiskViewError(x)
      raise BridgeRefusal("form:disk", f"a copy off {u.src[0].device} of a {u.src[0].op.name} chain")

def _disk_view(x: UOp) -> bool:
  """A RESHAPE/SHRINK chain over a DISK buffer that is one contiguous range of it (tinygrad's contiguous_view), with
  BITCASTs on top, right on the buffer or between 1-D views: what callsat's view analysis turns into one SLICE of the
  file, as tinygrad does."""
  y = x.src[0] if x.op is TOps.BITCAST else x
  while y.op in (TOps.RESHAPE, TOps.SHRINK) or y.op is TOps.BITCAST and len(y.shape) == len(y.src[0].shape) == 1: y = y.src[0]
  if y.op is TOps.BITCAST: y = y.src[0]
  return y.op is TOps.BUFFER and (x is y or x.contiguous_view() is not None)

def _file_view(x: UOp) -> bool: return _disk_view(x) or _written_file_view(x)

def _file_chain(x: UOp) -> bool:
  """A movement chain over a DISK buffer or a file being written (a view of it or not)."""
  y = x
  while y.op in _MOVE or y.op is TOps.CONTIGUOUS: y = y.src[0]
  return x is not y and (y.op is TOps.BUFFER and _on_disk(y) or y.op is TOps.COPY and _on_disk(y) and not _on_disk(y.src[0]))

def _written_file_view(x: UOp) -> bool:
  """A contiguous RESHAPE/SHRINK chain over a file being written (COPY onto the disk of a host value): a view of it."""
  y = x
  while y.op in (TOps.RESHAPE, TOps.SHRINK): y = y.src[0]
  if y.op is not TOps.COPY or _on_disk(y.src[0]): return False
  chain = []   # walked here: tinygrad's contiguous_view() misses some of these (x[1] of a (2, 1) file)
  while x is not y: chain.append(x); x = x.src[0]
  dense = True   # is the view so far one contiguous range (row-major over its shape)?
  for m in reversed(chain):
    if m.op is TOps.RESHAPE and not dense: return False
    if m.op is TOps.SHRINK:   # contiguous iff the axes before the first narrowed one are 1 and those after it full
      cut = [i for i, ((a, b), d) in enumerate(zip(m.marg, m.src[0].shape)) if (a, b) != (0, d)]   # tinygrad 0.14: (offset, size)
      dense = dense and (not cut or all(m.shape[i] == 1 for i in range(cut[0])) and cut[-1] == cut[0])
  return dense

def _inert(u: UOp, inert: set) -> bool:
  """A CONST without sources or a STACK of such (a shape argument): no storage, no realize point, nothing callify
  decides; the OPAQUE ops reading it keep it as it is."""
  return u.op is TOps.CONST and not u.src or u.op is TOps.STACK and all(s in inert for s in u.src)

def to_callsat(big_sink: UOp, topo=None, consts: bool = True) -> tuple[Conversion, list[Node]]:
  """The callsat image of big_sink's graph and the roots to callify (`topo`: big_sink's whole toposort, when the caller
  has walked it already). `consts=False` leaves constant leaves out (`_inert`: a third to a half of a tiny graph's
  UOps); cost mode's shadow reads them, so it converts them."""
  cv = Conversion()
  inert = cv.inert
  if topo is None: topo = big_sink.toposort()
  if any(_on_disk(u) for u in topo if u.op in _DEVICE_ROOTS):
    _check_disk(topo)
    # a file written by a COPY and read (through a view of it, or copied off) is realized as tinygrad's DISK COPY item is
    cv.files = {s for u in topo if u.op in (TOps.RESHAPE, TOps.SHRINK, TOps.COPY) for s in u.src[:1]
                if s.op is TOps.COPY and _on_disk(s) and not _on_disk(s.src[0])}
  for u in topo:
    if u is big_sink: continue
    if not consts and _inert(u, inert): inert.add(u); continue
    if u.op is TOps.RANGE: cv.ranges = True
    n = cv.img(u)
    if n.op is Ops.AFTER and _views_storage(u.src[0]) and not _image_views_storage(n.src[0]):
      raise BridgeRefusal("form:assign-target", f"an assign into {u.src[0].op.name} of storage that callsat cannot follow")
  cv.keep = list(cv.image.values())
  # callify realizes the bases of these as tinygrad does; a virtual base (no device, weak dtype) has nowhere to go
  return cv, list(dict.fromkeys(cv.image[x] for x in big_sink.src if not x.base.is_virtual))

# ---- back to tinygrad ------------------------------------------------------------------------------------------------

class _Back:
  """callsat Nodes -> tinygrad UOps for one CALL and its buffer_map (fresh buffers shared between them)."""
  def __init__(self, cv: Conversion, contiguous: frozenset = frozenset()):
    self.cv, self.memo, self.fresh, self.moves, self.contiguous = cv, {}, {}, {}, contiguous

  def d(self, x):
    """callsat dimensions (and nested tuples of them) as tinygrad's."""
    if isinstance(x, tuple): return tuple(self.d(a) for a in x)
    return self.cv.dim_uops[x.key] if isinstance(x, HostDim) else x

  def buffer(self, n: Node) -> UOp:
    if (u := self.cv.buffers.get(n.arg.uid)) is not None: return u
    if (u := self.fresh.get(n.arg.uid)) is None:
      u = self.fresh[n.arg.uid] = UOp.new_buffer(from_device(n.device), n.arg.size, _TDT[n.dtype])
    return u

  def __call__(self, root: Node, params: list[UOp] | None = None, memo: dict | None = None) -> UOp:
    memo = self.memo if memo is None else memo   # a CALL/FUNCTION body is its own scope (its PARAMs are its args)
    for n in toposort([root], enter_calls=False):
      if n.id in memo: continue
      kids = [memo[s.id] for s in (n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src)]
      memo[n.id] = self.one(n, kids, params)
    return memo[root.id]

  def call(self, n: Node, args: list[UOp]) -> UOp:
    """A nested CALL (a precompiled function's, built by callify) or a FUNCTION, its body in its own scope."""
    tg_arg = self.cv.calls.get(n.arg.name)
    if tg_arg is None: raise BridgeRefusal(f"op:{n.op.name}", "a call the bridge did not convert")
    body = self(n.src[0], args, {})
    if n.op is Ops.FUNCTION: return UOp(TOps.FUNCTION, tdt.void, (body, *args), tg_arg)
    return UOp(TOps.CALL, tdt.void, (body, *args), tg_arg)

  def movement(self, n: Node, s: list[UOp]) -> UOp:
    """tinygrad's movement methods check through the shape of the freshly rebuilt source (a recursive shape pass over the
    new body) and simplify their shape args: with int dimensions `int_move` builds what they build; a symbolic
    (op, arg, source shape) goes through them once, later ones reuse what they built when that was one op over the
    source."""
    op, x = n.op, s[0]
    if repr(n.shape) == repr(n.src[0].shape) and (op is not Ops.PERMUTE or n.arg == tuple(range(len(n.shape)))) and \
       (op is not Ops.FLIP or not any(n.arg)): return x   # a no-op: tinygrad's methods return the source
    key = (op, n.arg, n.src[0].shape)
    if _concrete(key): return int_move(op, x, n.src[0].shape, n.arg)
    if m := self.moves.get(key): return UOp(m[0], x.dtype, (x,) + m[1], m[2])
    if op is Ops.RESHAPE: r = x.reshape(self.d(n.arg))
    elif op is Ops.EXPAND: r = x.expand(self.d(n.arg))
    elif op is Ops.PERMUTE: r = x.permute(n.arg)
    elif op is Ops.SHRINK: r = x.shrink(self.d(n.arg))
    elif op is Ops.PAD: r = x.pad(self.d(n.arg))
    else: r = x.flip(tuple(i for i, f in enumerate(n.arg) if f))
    if key not in self.moves: self.moves[key] = (r.op, r.src[1:], r.arg) if r.src[:1] == (x,) and r.dtype == x.dtype else False
    return r

  def one(self, n: Node, s: list[UOp], params) -> UOp:
    op = n.op
    if op is Ops.OPAQUE:
      u, pos = self.cv.opaque[n.arg.ident]
      if u is None: return s[0]   # a RETYPE
      new = list(u.src)
      for i, k in enumerate(pos): new[k] = s[i]
      r = u if all(a is b for a, b in zip(new, u.src)) else u.replace(src=tuple(new))
      return r.contiguous() if n.arg.ident in self.contiguous else r   # a realize point cost mode chose (tinygrad_fusion)
    if op is Ops.BUFFER: return self.buffer(n)
    if op is Ops.MULTI: return s[0].unshard(n.arg)
    if op in (Ops.CALL, Ops.FUNCTION): return self.call(n, s)
    if op is Ops.TUPLE: return UOp(TOps.TUPLE, tdt.void, tuple(s))
    if op is Ops.GETTUPLE: return s[0].gettuple(n.arg)
    if op is Ops.PARAM:
      if (orig := self.cv.params.get(n.id)) is not None: return orig   # a function body's own argument
      if params is None or not 0 <= n.arg.slot < len(params):   # an output slot callify added to a precompiled call
        return UOp.param(n.arg.slot, _TDT[n.dtype], self.d(n.arg.shape), from_device(n.device), addrspace=AddrSpace.GLOBAL)
      return param_like(params[n.arg.slot], n.arg.slot)   # typed, shaped and split like its argument, as tinygrad's own
    if op is Ops.SLICE:   # tinygrad's view: SHRINK(BUFFER) in the buffer's elements, retyped by BITCAST
      off, count = n.arg
      size = count * n.dtype.itemsize // n.src[0].dtype.itemsize
      v = s[0].shrink(((off, off + size),))
      return v if n.dtype == n.src[0].dtype else v.bitcast(_TDT[n.dtype])
    if op in GroupOp.Movement: return self.movement(n, s)
    if op is Ops.CAST: return s[0].cast(_TDT[n.dtype])
    if op is Ops.BITCAST: return s[0].bitcast(_TDT[n.dtype])
    if op is Ops.COPY: return UOp(TOps.COPY, s[0].dtype, (s[0],), from_device(n.arg))
    if op is Ops.STORE: return s[0].store(s[1])
    if op is Ops.AFTER: return s[0].after(*s[1:])
    if op is Ops.SINK: return UOp.sink(*s)
    if op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD):
      return UOp({Ops.CONTIGUOUS: TOps.CONTIGUOUS, Ops.DETACH: TOps.DETACH, Ops.CONTIGUOUS_BACKWARD: TOps.CONTIGUOUS_BACKWARD}[op],
                 s[0].dtype, (s[0],))
    raise BridgeRefusal(f"op:{op.name}", "callify produced an op the bridge cannot give back to tinygrad")

def to_tinygrad(cv: Conversion, call: Node, buffer_map: dict, contiguous: frozenset = frozenset()) -> tuple[UOp, dict]:
  """callsat's CALL and buffer_map as tinygrad's: bound variables join the args as ALU PARAMs (tinygrad's cache key);
  the OPAQUE values whose idents are in `contiguous` are read through a CONTIGUOUS (tinygrad realizes them)."""
  back = _Back(cv, contiguous)
  args = [back(a) for a in call.src[1:]]
  if any(a.op is Ops.BIND for a in call.src[1:]): raise BridgeRefusal("form:bind", "symbolic BIND arguments")
  body = back(call.src[0], args)
  bound = [u for u in body.toposort() if u.op is TOps.AFTER and u.is_bound_var] if cv.bound_vars else []
  if bound:
    body = body.substitute({b: b.param_like(len(args) + i) for i, b in enumerate(bound)})
    args += bound
  out = {}
  for k, v in buffer_map.items():
    val = back(v)
    for u in cv.origins.get(k.id, ()):
      if u.op is TOps.GETTUPLE and u.src[0].op is TOps.FUNCTION and u.src[0].arg.precompile:
        continue   # tinygrad keeps a precompiled function's outputs lazy (its backward runs through them)
      out[u] = val if val.shape == u.shape else val.shrink_to(u.shape)
  if body.op is not TOps.SINK or cv.ranges: return body.call(*args), out   # .call checks that no RANGE leaks out
  return UOp(TOps.CALL, tdt.void, (body, *args), _CALL_ARG), out   # what .call builds: no RANGE, nothing to check

_CALL_ARG = CallInfo_(None, None, False, False, None)
