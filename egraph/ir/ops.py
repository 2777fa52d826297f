"""Tensor IR: immutable, hash-consed Nodes (op, dtype, src, arg) with shape/device inferred once at construction.

Shapes are plain tuples of ints in `arg` (not nodes, unlike tinygrad): that keeps the graph small and lets the e-graph
carry them as interned arguments. Every check raises at construction, naming the op and the shapes.
"""
from __future__ import annotations
import itertools, math, struct, weakref
from _weakref import _remove_dead_weakref
from dataclasses import dataclass
from typing import Any
from egraph.ir.dtype import DType, dtypes
from egraph.ir.errors import CallsatError, ShapeError, DTypeError, DeviceError, UnsupportedOpError
from egraph.ir.optable import Ops, GroupOp, ALU_OPS, TAKES
from egraph.ir.symbolic import HostDim, BoundVar, Variable, is_symbolic, max_value, map_dims, dims_in

@dataclass(frozen=True)
class BufferArg:
  """A global buffer: `uid` is its identity, `size` is in elements of the node's dtype."""
  uid: int
  size: int
  device: str

@dataclass(frozen=True)
class ParamArg:
  """A positional parameter of a CALL/FUNCTION body (slot >= 0) or a symbolic variable (slot -1, name, range)."""
  slot: int
  shape: tuple[int, ...]
  device: str | tuple[str, ...] | None
  name: str | None = None
  vmin_vmax: tuple[int, int] | None = None
  shard: bool = False     # on a tuple of devices: a per-device value (it replaced a BUFFER), not a logical one

@dataclass(frozen=True)
class OpaqueArg:
  """An op of a host framework (tinygrad) carried through callify by shape, dtype and device only: `name` is the host's
  op, `ident` tells apart host nodes that callify must not merge. No executor of callsat can compute it."""
  name: str
  shape: tuple | None
  device: str | tuple | None
  ident: int
  axis: int | None = None   # on a tuple of devices: the axis a logical value is split along (the host knows it)

@dataclass(frozen=True)
class CallInfo:
  name: str | None = None
  precompile: bool = False
  temps: frozenset = frozenset()   # arg slots only this CALL writes and reads: executors bind them to scratch memory

# ---------------------------------------------------------------------------------------------------------------------
# devices

# the device kinds, written once: the IR accepts these (CPU:n, CUDA:n, DISK:/path; EXT:name is a host framework's
# device, never run), lower/device/backend.py's backends claim them
DEVICE_KINDS = ("CPU", "PYTHON", "NPY", "CUDA", "DISK")
HOST_DEVICES = ("NPY", "PYTHON", "DISK")
_NUMBERED = ("CPU", "PYTHON", "NPY", "CUDA")   # kinds with an ordinal (DISK takes a path)

_CANONICAL: dict[str, str] = {}   # each device string once (a fresh buffer per realize point asks again)

def canonical_device(d: str | tuple | None) -> str | tuple | None:
  """'CPU:0' -> 'CPU', 'cpu' -> 'CPU'; raises DeviceError for an unknown device."""
  if d is None: return None
  if d.__class__ is str and (c := _CANONICAL.get(d)) is not None: return c
  if isinstance(d, tuple): return tuple(canonical_device(x) for x in d)
  if not isinstance(d, str): raise DeviceError(f"device must be a string, got {d!r}")
  if d.upper().startswith("DISK:"): return "DISK:" + d[5:]
  if d.upper().startswith("EXT:") and len(d) > 4: return "EXT:" + d[4:]   # a host framework's device (tinygrad NULL): never run here
  name, _, num = d.upper().partition(":")
  if name not in _NUMBERED or (num and not num.isdigit()):
    raise DeviceError(f"unknown device {d!r}; known: CPU, CPU:n, PYTHON, NPY, CUDA, DISK:/path, EXT:name")
  c = _CANONICAL[d] = name if num in ("", "0") else f"{name}:{num}"
  return c

# ---------------------------------------------------------------------------------------------------------------------
# Node

def const_key(arg):
  """Float constants are keyed by their bits, so -0.0 and 0.0 stay two nodes and a NaN constant is shared."""
  v, d = arg
  return (struct.pack("<d", v), d) if isinstance(v, float) else arg

class _Ref(weakref.ref):
  """A weak reference to a Node that knows its hash-cons key (weakref.KeyedRef without its Python-level constructor)."""
  __slots__ = ("key",)

# the hash-cons table, key -> _Ref: a WeakValueDictionary's get and set are Python calls (a fifth of making a node);
# an entry goes when its node dies, and only while its reference is dead (as WeakValueDictionary removes it). A key
# holds the sources themselves (they hash and compare by identity, and the node keeps them alive anyway): no ids tuple
_cache: dict = {}
# its helpers are bound as defaults: at interpreter exit a module's globals are cleared while nodes still die
def _drop(ref: _Ref, table=_cache, remove=_remove_dead_weakref) -> None: remove(table, ref.key)
_ids = itertools.count()
_get, _new, _next_id = _cache.get, object.__new__, _ids.__next__

class Node:
  """An immutable, hash-consed IR node. Structurally equal nodes are the same object."""
  __slots__ = ("op", "dtype", "src", "arg", "id", "shape", "device", "__weakref__")
  op: Ops; dtype: DType; src: tuple[Node, ...]; arg: Any; id: int; shape: tuple[int, ...] | None; device: Any

  def __new__(cls, op: Ops, dtype: DType | None = None, src: tuple[Node, ...] = (), arg: Any = None):
    src = tuple(src)
    if dtype is None: dtype = _infer_dtype(op, src, arg)
    key = (op, dtype, src, const_key(arg) if op is Ops.CONST else arg)
    if (ref := _cache.get(key)) is not None and (ret := ref()) is not None: return ret
    return _make(key, op, dtype, src, arg, *_infer(op, dtype, src, arg))

  def over(self, src: tuple[Node, ...]) -> Node:
    """This node over `src`. When each new source has the dtype, shape and device of the one it replaces, inference
    (which reads only those, GETTUPLE aside) gives this node's shape and device and passes again: it is skipped."""
    old = self.src
    if src == old: return self
    op = self.op
    if len(src) != len(old) or op is Ops.GETTUPLE: return Node(op, self.dtype, src, self.arg)
    for s, o in zip(src, old):   # shapes compare by repr past identity: a bound dimension equals its value as an int
      if (s.shape is not o.shape or s.dtype is not o.dtype or s.device != o.device) and \
         (s.dtype is not o.dtype or s.device != o.device or s.shape != o.shape or repr(s.shape) != repr(o.shape)):
        return Node(op, self.dtype, src, self.arg)
    key = (op, dtype := self.dtype, src, const_key(arg := self.arg) if op is _CONST else (arg := self.arg))
    if (ref := _get(key)) is not None and (ret := ref()) is not None: return ret
    ret = _new(Node)   # _make, inline: the fallback CALL makes ~200k nodes here
    ret.op, ret.dtype, ret.src, ret.arg, ret.id, ret.shape, ret.device = op, dtype, src, arg, _next_id(), self.shape, self.device
    ref = _cache[key] = _Ref(ret, _drop)
    ref.key = key
    return ret

  def __reduce__(self): return (Node, (self.op, self.dtype, self.src, self.arg))
  def __repr__(self): return f"<{self.op.name} {self.dtype.name} {self.shape} #{self.id}>"

  @property
  def numel(self) -> int: return math.prod(self.shape)
  @property
  def nbytes(self) -> int: return self.numel * self.dtype.itemsize
  @property
  def base(self) -> Node:
    """Strip movement ops and DETACH."""
    n = self
    while n.op in GroupOp.Movement or n.op is Ops.DETACH: n = n.src[0]
    return n

  def has_buffer_identity(self) -> bool:
    """True for storage seen through RESHAPEs only (a reshape of a buffer is still the buffer)."""
    n = self
    while n.op in (Ops.RESHAPE, Ops.MULTI): n = n.src[0]
    return n.op in GroupOp.Storage

  def toposort(self, enter_calls: bool = True) -> list[Node]: return toposort([self], enter_calls)

  # small constructors, so callers read like tinygrad
  def alu(self, op: Ops, *srcs: Node) -> Node: return Node(op, None, (self, *srcs))
  # the same shape only by repr too: a bound dimension equals its value as an int but is not the same dimension (== first:
  # most reshapes change the shape, and the repr of two shapes costs more than comparing them)
  def reshape(self, shape) -> Node:
    return self if (t := tuple(shape)) == self.shape and repr(t) == repr(self.shape) else Node(Ops.RESHAPE, self.dtype, (self,), t)
  def expand(self, shape) -> Node:
    return self if (t := tuple(shape)) == self.shape and repr(t) == repr(self.shape) else Node(Ops.EXPAND, self.dtype, (self,), t)
  def permute(self, order) -> Node:
    return self if tuple(order) == tuple(range(len(self.shape))) else Node(Ops.PERMUTE, self.dtype, (self,), tuple(order))
  def shrink(self, arg) -> Node:
    arg = tuple((_dim(s), _dim(e)) for s, e in arg)
    return self if repr(arg) == repr(tuple((0, s) for s in self.shape)) else Node(Ops.SHRINK, self.dtype, (self,), arg)
  def pad(self, arg) -> Node:
    arg = tuple((int(b), int(a)) for b, a in arg)
    return self if all(b == 0 and a == 0 for b, a in arg) else Node(Ops.PAD, self.dtype, (self,), arg)
  def flip(self, arg) -> Node: return self if not any(arg) else Node(Ops.FLIP, self.dtype, (self,), tuple(bool(x) for x in arg))
  def cast(self, dtype: DType) -> Node: return self if dtype == self.dtype else Node(Ops.CAST, dtype, (self,))
  def contiguous(self) -> Node: return Node(Ops.CONTIGUOUS, self.dtype, (self,))
  def after(self, *deps: Node) -> Node: return Node(Ops.AFTER, self.dtype, (self, *deps)) if deps else self
  def store(self, value: Node) -> Node: return Node(Ops.STORE, dtypes.void, (self, value))
  def sink(*srcs: Node) -> Node: return Node(Ops.SINK, dtypes.void, tuple(srcs))

  def param(self, slot: int) -> Node:
    """PARAM(slot) standing for this storage (a BUFFER, a whole SLICE of one) in a CALL body: its shape and device."""
    return _known(Ops.PARAM, self.dtype, (), ParamArg(slot, self.shape, self.device, shard=isinstance(self.device, tuple)),
                  self.shape, self.device)

  def stored(self, value: Node) -> tuple[Node, Node]:
    """(STORE(self, value), AFTER(self, STORE)): a realize point written into its buffer, checked as STORE checks it and
    made without dispatching inference (the all-materialized CALL makes one pair per realize point)."""
    if value.shape is not self.shape and value.shape != self.shape:
      raise ShapeError(f"STORE: value shape {value.shape} does not match target shape {self.shape}")
    if value.dtype is not self.dtype and value.dtype != self.dtype:
      raise DTypeError(f"STORE: value dtype {value.dtype.name} does not match target dtype {self.dtype.name}")
    dev, shape = self.device if self.device is not None else value.device, self.shape
    # the value's own shape object when it is the same shape: consumers that read the AFTER where the value was
    # (Node.over) then see the shape they had, by identity
    if value.shape is not shape and repr(value.shape) == repr(shape): shape = value.shape
    st = _known(Ops.STORE, dtypes.void, (self, value), None, shape, dev)
    return st, _known(Ops.AFTER, self.dtype, (self, st), None, shape, self.device)

_CONST = Ops.CONST

def _make(key: tuple, op: Ops, dtype: DType, src: tuple, arg, shape, device) -> Node:
  """A new Node, entered in the hash-cons table under `key` (which it is not in)."""
  ret = object.__new__(Node)
  ret.op, ret.dtype, ret.src, ret.arg, ret.id, ret.shape, ret.device = op, dtype, src, arg, next(_ids), shape, device
  ref = _cache[key] = _Ref(ret, _drop)
  ref.key = key
  return ret

def _known(op: Ops, dtype: DType, src: tuple, arg, shape, device) -> Node:
  """The node with a shape and device its caller derived (hash-consed as Node() would)."""
  key = (op, dtype, src, arg)
  if (ref := _get(key)) is not None and (ret := ref()) is not None: return ret
  return _make(key, op, dtype, src, arg, shape, device)

def _dim(x): return x if is_symbolic(x) else int(x)

def const(value, dtype: DType, device=None) -> Node:
  """A scalar constant; its device may be None (a pure-constant expression stays device-less)."""
  if dtype.kind == 'b': value = bool(value)
  elif dtype.kind in 'iu':
    bits = 8 * dtype.itemsize   # wrap like C (and numpy), so const(-1, uint8) is const(255, uint8): one node
    value = int(value) % (1 << bits)
    if dtype.kind == 'i' and value >= 1 << (bits - 1): value -= 1 << bits
  else: value = float(value)
  return Node(Ops.CONST, dtype, (), (value, canonical_device(device)))

_buffer_uids = itertools.count(1)

def new_buffer(size: int, dtype: DType, device: str | tuple) -> Node:
  """A fresh global buffer (a new uid every call); on a tuple of devices each device holds `size` elements."""
  if dtype == dtypes.void: raise DTypeError("BUFFER: cannot allocate a void buffer")
  arg = BufferArg(next(_buffer_uids), int(size), canonical_device(device))
  if arg.size < 0: raise ShapeError(f"BUFFER: bad arg {arg!r}")
  return _make((Ops.BUFFER, dtype, (), arg), Ops.BUFFER, dtype, (), arg, (arg.size,), arg.device)   # a new uid: a new key

def empty_view(shape: tuple[int, ...], dtype: DType, device: str) -> Node:
  """A fresh buffer viewed with `shape` (BUFFER for 1-D, RESHAPE(BUFFER) otherwise). Symbolic dimensions get a buffer
  of their maximum size, shrunk to the bound size."""
  if all(d.__class__ is int for d in shape):   # one per realize point: the RESHAPE of a new buffer is new, made directly
    v = new_buffer(math.prod(shape), dtype, device)
    if len(shape) == 1: return v
    shape = tuple(shape)
    return _make((Ops.RESHAPE, dtype, (v,), shape), Ops.RESHAPE, dtype, (v,), shape, shape, v.device)
  big = tuple(max_value(d) for d in shape)
  v = new_buffer(math.prod(big), dtype, device).reshape(big)
  return v.shrink(tuple((0, d) for d in shape)) if big != tuple(map(int, shape)) or any(map(is_symbolic, shape)) else v

def is_shard(n: Node) -> bool:
  """A per-device value (each device of a tuple holds its own array of `n.shape`): a tuple-device BUFFER/PARAM and views
  of it. MULTI turns one into a logical value; everything else on a tuple device is logical (replicated)."""
  while isinstance(n.device, tuple):
    if n.op is Ops.BUFFER or (n.op is Ops.PARAM and n.arg.shard): return True
    if n.op not in GroupOp.Movement and n.op not in (Ops.AFTER, Ops.SLICE, Ops.DETACH): return False
    n = n.src[0]
  return False

def shard_axes(roots: list[Node], seed: dict[int, int | None] | None = None) -> dict[int, int | None]:
  """Node.id -> the axis along which a logical multi-device value is split over its devices (None: replicated).
  `seed` gives leaves their axes (a body's PARAMs: the axes of the CALL's arguments)."""
  ax: dict[int, int | None] = dict(seed or {})
  for n in toposort(roots, enter_calls=False):
    if n.id in ax: continue
    if not isinstance(n.device, tuple) or not n.src: ax[n.id] = None; continue
    if n.op is Ops.MULTI: ax[n.id] = n.arg; continue
    if n.op is Ops.OPAQUE: ax[n.id] = n.arg.axis; continue
    if n.op in (Ops.CALL, Ops.FUNCTION): ax[n.id] = None; continue
    srcs = [ax[s.id] for s in n.src if isinstance(s.device, tuple) and s.shape is not None and s.shape == n.src[0].shape and ax[s.id] is not None]
    a = srcs[0] if srcs and not is_shard(n) else None
    if a is not None and n.op is Ops.PERMUTE: a = n.arg.index(a)
    elif a is not None and n.op is Ops.REDUCE and a in n.arg[1]: a = None
    elif a is not None and n.op in (Ops.SHRINK, Ops.PAD) and n.shape[a] != n.src[0].shape[a]: a = None
    elif a is not None and n.op is Ops.RESHAPE:
      pre = math.prod(n.src[0].shape[:a])
      a = next((i for i in range(len(n.shape)) if math.prod(n.shape[:i]) == pre and n.shape[i] % len(n.device) == 0), None)
    ax[n.id] = a
  return ax

def empty_multi(n: Node, axis: int | None) -> Node:
  """Fresh storage for a logical multi-device value: one shard per device along `axis`, or a full copy on every device."""
  devs = n.device
  if axis is None or n.shape[axis] % len(devs): return empty_view(n.shape, n.dtype, devs)   # replicated
  shard = tuple(d // len(devs) if i == axis else d for i, d in enumerate(n.shape))
  return Node(Ops.MULTI, n.dtype, (empty_view(shard, n.dtype, devs),), axis)

def map_args(roots: list[Node], fn) -> list[Node]:
  """Rebuild `roots` with every symbolic dimension in args (and PARAM shapes) replaced by fn(dim); bodies not entered."""
  new: dict[int, Node] = {}
  for n in toposort(roots, enter_calls=False):
    body = n.op in (Ops.CALL, Ops.FUNCTION)
    srcs = tuple(s if body and i == 0 else new[s.id] for i, s in enumerate(n.src))
    arg = (ParamArg(n.arg.slot, map_dims(n.arg.shape, fn), n.arg.device, n.arg.name, n.arg.vmin_vmax, n.arg.shard) if n.op is Ops.PARAM
           else n.arg if body or n.op is Ops.BIND else map_dims(n.arg, fn))
    new[n.id] = n if srcs == n.src and arg is n.arg or (srcs == n.src and arg == n.arg and _same_dims(arg, n.arg)) else Node(n.op, n.dtype, srcs, arg)
  return [new[r.id] for r in roots]

def _same_dims(a, b) -> bool: return repr(a) == repr(b)

# ---------------------------------------------------------------------------------------------------------------------
# inference

def _fmt(src) -> str: return ", ".join(str(s.shape) for s in src)

_VOID = frozenset({Ops.SINK, Ops.STORE, Ops.CALL, Ops.FUNCTION, Ops.TUPLE})

def _infer_dtype(op: Ops, src: tuple[Node, ...], arg) -> DType:
  if op in _VOID: return dtypes.void
  if op in GroupOp.Comparison: return dtypes.bool
  if op is Ops.WHERE: return src[1].dtype
  if op is Ops.GETTUPLE: return src[0].src[0].src[arg].dtype if src[0].op is Ops.FUNCTION else src[0].src[arg].dtype
  if src: return src[0].dtype
  raise DTypeError(f"{op.name}: a dtype is required")

def _first_device(src):
  for s in src:
    if s.device is not None: return s.device
  return None

def _check_perm(op, order, n):
  if sorted(order) != list(range(n)): raise ShapeError(f"{op.name}: {tuple(order)} is not a permutation of {n} axes")

def _infer(op: Ops, dtype: DType, src: tuple[Node, ...], arg) -> tuple[tuple[int, ...] | None, Any]:
  """(shape, device) of a new node; raises on malformed input."""
  if (rule := _INFER.get(op)) is None: raise UnsupportedOpError(f"unknown op {op}")
  return rule(op, dtype, src, arg)

# one (shape, device) rule per op, looked up once (an if-chain over the ops was half the cost of making a node)
def _x(src): return src[0] if src else None
def _buffer(op, dtype, src, arg):
  if not isinstance(arg, BufferArg) or arg.size < 0: raise ShapeError(f"BUFFER: bad arg {arg!r}")
  return (arg.size,), arg.device
def _opaque(op, dtype, src, arg):
  if not isinstance(arg, OpaqueArg): raise ShapeError(f"OPAQUE: bad arg {arg!r}")
  return arg.shape, arg.device
def _const(op, dtype, src, arg):
  if dtype == dtypes.void: raise DTypeError("CONST: void dtype")
  return (), arg[1]
def _gettuple(op, dtype, src, arg):
  x = _x(src)
  inner = x.src[0] if x.op is Ops.FUNCTION else x
  if inner.op is not Ops.TUPLE or not 0 <= arg < len(inner.src): raise ShapeError(f"GETTUPLE[{arg}]: source is not a tuple of that size")
  return inner.src[arg].shape, _first_device(src)
def _after(op, dtype, src, arg):
  if not src: raise ShapeError("AFTER: needs a source")
  return src[0].shape, src[0].device
def _store(op, dtype, src, arg):
  tgt, val = src
  if tgt.shape != val.shape: raise ShapeError(f"STORE: value shape {val.shape} does not match target shape {tgt.shape}")
  if tgt.dtype is not val.dtype and tgt.dtype != val.dtype:
    raise DTypeError(f"STORE: value dtype {val.dtype.name} does not match target dtype {tgt.dtype.name}")
  return tgt.shape, _first_device(src)

_INFER = {
  Ops.BUFFER: _buffer, Ops.PARAM: lambda op, dtype, src, arg: (tuple(arg.shape), arg.device), Ops.OPAQUE: _opaque,
  Ops.CONST: _const, Ops.SLICE: lambda op, dtype, src, arg: (_slice_shape(_x(src), dtype, arg), _first_device(src)),
  Ops.BIND: lambda op, dtype, src, arg: ((), None),
  **{o: (lambda op, dtype, src, arg: (None, _first_device(src))) for o in (Ops.SINK, Ops.CALL, Ops.FUNCTION, Ops.TUPLE)},
  Ops.GETTUPLE: _gettuple, Ops.AFTER: _after, Ops.STORE: _store,
  Ops.COPY: lambda op, dtype, src, arg: (_x(src).shape, canonical_device(arg)),
  Ops.MULTI: lambda op, dtype, src, arg: (_multi_shape(_x(src), arg), _x(src).device),
  **{o: (lambda op, dtype, src, arg: (_x(src).shape, _first_device(src))) for o in GroupOp.Marker | {Ops.CAST}},
  Ops.BITCAST: lambda op, dtype, src, arg: (_bitcast_shape(_x(src), dtype), _first_device(src)),
  **{o: (lambda op, dtype, src, arg: (_alu_shape(op, src), _first_device(src))) for o in GroupOp.ALU},
  Ops.REDUCE: lambda op, dtype, src, arg: (_reduce_shape(_x(src), arg), _first_device(src)),
  **{o: (lambda op, dtype, src, arg: (_movement_shape(op, _x(src).shape, arg), _first_device(src))) for o in GroupOp.Movement}}

def _slice_shape(x: Node, dtype: DType, arg) -> tuple[int, ...]:
  off, count = arg
  if x.shape is None or len(x.shape) != 1: raise ShapeError(f"SLICE: source must be 1-D storage, got shape {x.shape}")
  if off < 0 or (off * x.dtype.itemsize + count * dtype.itemsize) > x.shape[0] * x.dtype.itemsize:
    raise ShapeError(f"SLICE: range offset={off} count={count} ({dtype.name}) is outside storage of shape {x.shape} ({x.dtype.name})")
  return (count,)

def _multi_shape(x: Node, axis) -> tuple[int, ...]:
  if not isinstance(x.device, tuple): raise DeviceError(f"MULTI: source must live on a tuple of devices, got {x.device!r}")
  if not isinstance(axis, int) or not 0 <= axis < len(x.shape): raise ShapeError(f"MULTI: axis {axis!r} out of range for shape {x.shape}")
  shp = list(x.shape); shp[axis] *= len(x.device)
  return tuple(shp)

def _bitcast_shape(x: Node, dtype: DType) -> tuple[int, ...]:
  if not x.shape:
    if x.dtype.itemsize != dtype.itemsize: raise ShapeError(f"BITCAST: scalar {x.dtype.name} -> {dtype.name} changes size")
    return ()
  nbytes = x.shape[-1] * x.dtype.itemsize
  if nbytes % dtype.itemsize: raise ShapeError(f"BITCAST: last dim {x.shape[-1]} x {x.dtype.name} does not divide into {dtype.name}")
  return x.shape[:-1] + (nbytes // dtype.itemsize,)

def _alu_shape(op: Ops, src: tuple[Node, ...]) -> tuple[int, ...]:
  x = src[0]
  info = ALU_OPS[op]
  if len(src) != info.arity: raise ShapeError(f"{op.name}: takes {info.arity} sources, got {len(src)}")
  shape = x.shape
  for s in src:
    if s.shape != shape: raise ShapeError(f"{op.name}: shape mismatch {_fmt(src)}")
  vals = src[1:] if op is Ops.WHERE else src
  d = vals[0].dtype
  for s in vals:
    if s.dtype is not d and s.dtype != d: raise DTypeError(f"{op.name}: dtype mismatch {', '.join(s.dtype.name for s in vals)}")
  if op is Ops.WHERE and x.dtype != dtypes.bool: raise DTypeError(f"WHERE: condition must be bool, got {x.dtype.name}")
  if not info.accepts(d): raise DTypeError(f"{op.name}: needs {TAKES[info.takes][1]}, got {d.name}")
  dev = x.device
  for s in src:
    if s.device != dev:   # some source differs from the first: more than one device unless it is None
      devs = {s.device for s in src if s.device is not None}
      if len(devs) > 1: raise DeviceError(f"{op.name}: sources on different devices {sorted(map(str, devs))}")
      break
  return shape

def _reduce_shape(x: Node, arg) -> tuple[int, ...]:
  rop, axes = arg
  if rop not in GroupOp.ReduceOps: raise UnsupportedOpError(f"REDUCE: unsupported reduce op {rop}")
  if any(not 0 <= a < len(x.shape) for a in axes): raise ShapeError(f"REDUCE: axes {axes} out of range for shape {x.shape}")
  if len(set(axes)) != len(axes) or list(axes) != sorted(axes): raise ShapeError(f"REDUCE: axes {axes} must be sorted and unique")
  return tuple(1 if i in axes else s for i, s in enumerate(x.shape))

def _movement_shape(op: Ops, shape: tuple[int, ...], arg) -> tuple[int, ...]:
  n = len(shape)
  if op is Ops.RESHAPE:
    if any(s < 0 for s in arg) or math.prod(arg) != math.prod(shape):
      raise ShapeError(f"RESHAPE: cannot reshape {shape} to {tuple(arg)}")
    return tuple(arg)
  if op is Ops.EXPAND:
    if len(arg) != n or any(s != a and s != 1 for s, a in zip(shape, arg)):
      raise ShapeError(f"EXPAND: cannot expand {shape} to {tuple(arg)} (only size-1 axes expand)")
    return tuple(arg)
  if op is Ops.PERMUTE:
    _check_perm(op, arg, n)
    return tuple(shape[i] for i in arg)
  if op is Ops.SHRINK:
    # a host's bounds (HostDim, worth their maximum) are checked by the host when it binds them; callsat never does
    if len(arg) != n or any(not 0 <= s <= e <= max_value(d) and not (isinstance(e, HostDim) or isinstance(s, HostDim))
                            for (s, e), d in zip(arg, shape)):
      raise ShapeError(f"SHRINK: {arg} is out of range for shape {shape}")
    return tuple(e if s == 0 and not is_symbolic(s) else e - s for s, e in arg)   # (0, v) keeps v symbolic
  if op is Ops.PAD:
    if len(arg) != n or any(b < 0 or a < 0 for b, a in arg): raise ShapeError(f"PAD: bad padding {arg} for shape {shape}")
    return tuple(b + d + a for (b, a), d in zip(arg, shape))
  if op is Ops.FLIP:
    if len(arg) != n: raise ShapeError(f"FLIP: {arg} does not match shape {shape}")
    return shape
  raise UnsupportedOpError(op)

# ---------------------------------------------------------------------------------------------------------------------
# traversal and printing

def toposort(roots, enter_calls: bool = True, deps_first: bool = False, leaves: frozenset = frozenset(),
             stop: set | frozenset = frozenset()) -> list[Node]:
  """Children before parents, iteratively (graphs can be 100k deep). Without enter_calls, CALL/FUNCTION bodies are skipped.
  With deps_first an AFTER visits its dependencies before its value (so a computed value sees their writes). Nodes whose
  op is in `leaves`, and nodes other than the roots whose id is in `stop`, are listed but not entered."""
  roots = list(roots)
  if not (deps_first or leaves or stop): return _post_order(roots, () if enter_calls else _CALLS)
  order, seen, stack, top = [], set(), [(r, False) for r in reversed(roots)], {r.id for r in roots} if stop else ()
  while stack:
    n, done = stack.pop()
    if done: order.append(n); continue
    if n.id in seen: continue
    seen.add(n.id)
    stack.append((n, True))
    kids = n.src[1:] if not enter_calls and n.op in (Ops.CALL, Ops.FUNCTION) else () if n.op in leaves or \
           (n.id in stop and n.id not in top) else n.src
    if deps_first and n.op is Ops.AFTER: kids = n.src[1:] + n.src[:1]
    stack.extend((s, False) for s in reversed(kids) if s.id not in seen)
  return order

_NO_DIMS = (Ops.CALL, Ops.FUNCTION, Ops.BIND)

def effect_order(roots: list[Node]) -> list[Node]:
  """The order effects run in (the reference executor's and the scheduler's): children first, CALL bodies not entered,
  an AFTER's deps before its `x` (a computed `x` then sees their writes)."""
  return toposort(roots, enter_calls=False, deps_first=True)

def bindings(call: Node) -> tuple[Node, dict]:
  """What runs, for every executor and the engine's cache: (the CALL without its BIND args and with plain sizes for its
  variables, {variable key: value})."""
  for a in call.src[1:]:
    if a.op is Ops.BIND and not (a.src == () and isinstance(a.arg, tuple) and isinstance(a.arg[0], Variable)):
      raise CallsatError(f"CALL: a BIND argument must bind a Variable to a value, got {a.arg!r}")
  binds = {a.arg[0].key: int(a.arg[0].bind(a.arg[1])) for a in call.src[1:] if a.op is Ops.BIND}
  if not binds: return call, {}
  body = map_args([call.src[0]], lambda d: binds.get(d.key, d) if isinstance(d, Variable) else d)[0]
  return Node(Ops.CALL, dtypes.void, (body, *(a for a in call.src[1:] if a.op is not Ops.BIND)), call.arg), binds

def dims_arg(n: Node):
  """The part of a node's arg that can hold symbolic dimensions."""
  return n.arg.shape if n.op is Ops.PARAM else () if n.op in _NO_DIMS else n.arg

def binds_dims(nodes) -> bool:
  """Does any of `nodes` hold a bound symbolic dimension in its arg (`dims_arg`; each distinct arg looked at once, no
  call per node: the fallback asks this of 200k-node graphs)?"""
  args = {n.arg for n in nodes if n.arg is not None and n.op not in _NO_DIMS}
  return any(isinstance(d, BoundVar) for a in args for d in dims_in(a.shape if isinstance(a, ParamArg) else a))

_CALLS, _FINISH = (Ops.CALL, Ops.FUNCTION), object()

def _post_order(roots: list[Node], skip_body: tuple) -> list[Node]:
  """toposort's common case, flat: a node under _FINISH is finished when _FINISH pops (no tuple per visit); a source
  seen by then is skipped when popped, as toposort skips it when pushing. The same order."""
  order, seen, stack, finish = [], set(), roots[::-1], _FINISH
  add, push, pop, out = seen.add, stack.append, stack.pop, order.append
  while stack:
    if (n := pop()) is finish: out(pop()); continue
    if n in seen: continue
    add(n); push(n); push(finish)
    stack += reversed(n.src[1:] if n.op in skip_body else n.src)
  return order

def _argstr(n: Node) -> str:
  a = n.arg
  if a is None: return ""
  if n.op is Ops.BUFFER: return f"[uid={a.uid},{a.size},{a.device}]"
  if n.op is Ops.PARAM: return f"[slot={a.slot},{a.device}" + (f",{a.name}" if a.name else "") + "]"
  if n.op is Ops.CONST: return f"[{a[0]!r}" + (f",{a[1]}" if a[1] else "") + "]"
  if n.op is Ops.CALL or n.op is Ops.FUNCTION:
    return f"[{a.name or ''}{',precompile' if a.precompile else ''}{',temps=' + str(sorted(a.temps)) if a.temps else ''}]"
  if n.op is Ops.REDUCE: return f"[{a[0].name},{a[1]}]"
  return f"[{a}]"

def render(root: Node | list[Node], enter_calls: bool = True) -> str:
  """A readable listing: `%i = OP[arg](%srcs) : dtype shape dev`, children first."""
  roots = root if isinstance(root, (list, tuple)) else [root]
  names: dict[int, str] = {}
  lines = []
  for n in toposort(roots, enter_calls):
    names[n.id] = f"%{len(names)}"
    srcs = ",".join(names.get(s.id, "<body>") for s in n.src)
    info = f" : {n.dtype.name}" + (f" {n.shape}" if n.shape is not None else "") + (f" {n.device}" if n.device else "")
    lines.append(f"{names[n.id]:>5} = {n.op.name}{_argstr(n)}({srcs}){info}")
  return "\n".join(lines)

def substitute(roots: list[Node], mapping: dict[Node, Node]) -> list[Node]:
  """Rebuild `roots` with every key of `mapping` replaced by its value (values are final and not traversed).
  CALL/FUNCTION bodies are never entered: their PARAMs are scoped to the call."""
  if not mapping: return list(roots)
  new: dict[int, Node] = {}
  for n in toposort(roots, enter_calls=False):
    if n in mapping: new[n.id] = mapping[n]; continue
    body = n.op in (Ops.CALL, Ops.FUNCTION)
    srcs = tuple(s if body and i == 0 else new[s.id] for i, s in enumerate(n.src))
    new[n.id] = n if srcs == n.src else Node(n.op, n.dtype, srcs, n.arg)
  return [new[r.id] for r in roots]

def multi_arg(a: Node) -> Node | None:
  """The MULTI a CALL argument is (through AFTERs) when its shards are storage: a sharded output or input."""
  while a.op in (Ops.AFTER, Ops.DETACH): a = a.src[0]
  return a if a.op is Ops.MULTI and a.src[0].has_buffer_identity() else None

def shard_params(body: Node, sharded: dict[int, Node]) -> Node:
  """`body` with each logical PARAM whose argument is a MULTI (slot -> multi_arg) read as MULTI(its shards' PARAM):
  executors bind the shards' storage, so the body's writes land in it."""
  if not sharded: return body
  sub = {p: Node(Ops.MULTI, p.dtype, (Node(Ops.PARAM, p.dtype, (), ParamArg(p.arg.slot, m.src[0].shape, p.device, shard=True)),), m.arg)
         for p in toposort([body], enter_calls=False)
         if p.op is Ops.PARAM and (m := sharded.get(p.arg.slot)) is not None and not p.arg.shard}
  return substitute([body], sub)[0]
