"""Tensor: tinygrad's front end over the Node IR (floor 6). It builds lazy graphs; `realize`/`callify` hand them to
`egraph.engine.driver` and execution to `lower.runtime`.

Semantics follow tinygrad: numpy-style right-aligned broadcasting, tinygrad dtype promotion with weak Python scalars,
REDUCE-keeps-dims under the hood, and realize substitutes the buffer map into every live Tensor.
"""
from __future__ import annotations
import itertools, math, os, weakref
from collections import deque
from _weakref import _remove_dead_weakref
from typing import Any, Iterator
import numpy as np
from egraph.ir.dtype import DType, dtypes, least_upper_dtype, sum_acc_dtype
from egraph.ir.errors import CallsatError, ShapeError, DTypeError, DeviceError, UnsupportedOpError
from egraph.ir.env import env_value
from egraph.ir.storage import STORAGE
from egraph.engine.driver import callify
from lower.runtime import run_call, read
from egraph.ir.ops import Node, Ops, const, empty_view, substitute, canonical_device, new_buffer
from egraph.frontend import rng
from egraph.frontend.indexing import basic_index
from egraph.frontend.promote import py_dtype, weak_dtype, fit, const_like, broadcast_shape, broadcast_to
from egraph.frontend.hostdata import host_node, to_numpy, storage_base, check_writable, scalar_operand

DEFAULT_DEVICE = "CPU"

# every live Tensor, so realize can point all of them at the new buffers: counter -> weak reference. Keyed by a counter
# (not a WeakSet) because Tensor.__eq__ builds a graph: a set must never compare two Tensors. A plain dict whose
# references drop their own entry in C (a WeakValueDictionary's set and removal are Python calls: ~4 us per tensor,
# and a matmul makes five)
_all_tensors: dict[int, weakref.ref] = {}
_tensor_ids = itertools.count()

class _TRef(weakref.ref):
  __slots__ = ("key",)

def _forget(ref: _TRef, table=_all_tensors, remove=_remove_dead_weakref) -> None: remove(table, ref.key)

Scalar = (bool, int, float)

# The graphs of the last RECENT realizes, kept alive where their CALL's buffers are small: a loop that builds the same
# expression again gets every node back from the hash-cons table instead of making it (a 64^3 `(x @ y).realize()` loop
# 105 -> 86 us). They keep no storage the user let go: a graph is kept only while live tensors stand on all its input
# buffers, and when one of those tensors dies (Tensor.__del__) or is pointed elsewhere by a realize (_apply_map) every
# kept graph is dropped; where the buffers are bigger than RECENT_BYTES the kernels dwarf the rebuild: nothing is kept.
RECENT, RECENT_BYTES = 2, 16 << 20
_RECENT: deque = deque(maxlen=RECENT)   # (roots, their input BUFFERs) per kept graph

def _recent_inputs(res) -> frozenset | None:
  """The BUFFERs a realize's graph holds (callify's `inputs`), or None where its CALL's buffers pass RECENT_BYTES. The
  graph is kept only if every one of them is what a live tensor stands on (_apply_map): a buffer no tensor holds any
  more (a host array's upload, a Python scalar's) is never kept alive by it."""
  if sum(a.nbytes for a in res.call.src[1:] if a.op is Ops.BUFFER) > RECENT_BYTES: return None
  return frozenset(res.inputs)

def _leaf(n: Node) -> Node:
  """Where a tensor's chain of one-source nodes ends (a view's buffer, an upload's host buffer): what it stands on, as
  _apply_map walks it."""
  while len(n.src) == 1 and n.op is not Ops.CALL and n.op is not Ops.FUNCTION: n = n.src[0]
  return n

def _unkeep(b: Node) -> None:
  """Drop every kept graph if buffer `b` is one of their inputs (a copy of the deque is walked: another thread's
  realize or Tensor.__del__ may change it meanwhile)."""
  if any(b in ins for _, ins in tuple(_RECENT)): _RECENT.clear()


def _realize_waits() -> bool:
  """CALLSAT_ASYNC=0: realize returns only once its kernels have finished (default 1: its last may still run)."""
  if (v := env_value("CALLSAT_ASYNC") or "1") not in ("0", "1"): raise CallsatError(f"CALLSAT_ASYNC={v!r}: expected 0 or 1")
  return v == "0"

def synchronize() -> None:
  """Wait until every realize has finished: realize returns while its CALL's last kernel may still run on the kernel
  threads (anything that reads storage waits for it first; a timer around realize calls this, as tinygrad's
  Device.synchronize)."""
  STORAGE.settle()

def _promoted(x: Node, y: Node, op: str) -> tuple[Node, Node]:
  """Two tensors' nodes as operands of a binary op: cast to their least upper dtype, broadcast to one shape."""
  dt = least_upper_dtype(x.dtype, y.dtype)
  shape = broadcast_shape(x.shape, y.shape, op=op)
  return broadcast_to(x.cast(dt), shape), broadcast_to(y.cast(dt), shape)

def _summed(n: Node, axes: tuple[int, ...], keepdim: bool, dtype) -> Node:
  """sum over `axes` (sorted, in range): accumulated in sum_acc_dtype (small ints in int32/uint32, halves and fp8 in
  float32) or `dtype`; a half or fp8 sum is cast back (tinygrad)."""
  r = _reduced(n.cast(sum_acc_dtype(n.dtype) if dtype is None else dtype), Ops.ADD, axes, keepdim)
  return r.cast(n.dtype) if dtype is None and n.dtype in (dtypes.float16, dtypes.bfloat16, *dtypes.fp8s) else r

def _reduced(n: Node, op: Ops, axes: tuple[int, ...], keepdim: bool) -> Node:
  """REDUCE (which keeps dims) over `axes`, the reduced dims reshaped away unless `keepdim`."""
  r = Node(Ops.REDUCE, n.dtype, (n,), (op, axes)) if axes else n
  return r if keepdim else r.reshape(tuple(s for i, s in enumerate(n.shape) if i not in axes))

def _argfix(args) -> tuple:
  """f(2, 3), f((2, 3)) and f([2, 3]) all mean (2, 3)."""
  return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)

def _prod(xs) -> int: return math.prod(xs)

CLEAN_MAX = 1 << 16   # node ids _apply_map remembers as walked clean under the last keys (then it starts over)
_CLEAN: tuple = (frozenset(), set())
# leaf ids _leaves keeps in all (~10 MB), then it starts over: a plain dict, not egraph/ir/lru.ByteLRU, whose locked get
# (0.49 against 0.09 us) an assign pays per live lazy tensor (an SGD step over 300 parameters: ~45k lookups)
LEAVES_MAX = 1 << 18
LEAVES_WALK = 512     # nodes _leaves visits at most in a graph: a larger one is left to substitute's shared walk
_LEAVE_SETS: dict[int, frozenset | None] = {}
_leaves_held = 0

def _leaves(n: Node) -> frozenset | None:
  """The ids of the nodes without sources in n's graph, CALL bodies not entered (as substitute walks it): a node in
  that graph has all its leaves among them. None for a graph of more than LEAVES_WALK nodes (many tensors over one large
  graph would each walk all of it; substitute walks it once for them all). Kept per node id (graphs never change; ids
  are never reused)."""
  global _leaves_held
  if (got := _LEAVE_SETS.get(n.id, _LEAVE_SETS)) is _LEAVE_SETS:
    seen, stack, leaves = {n.id}, [n], set()
    while stack and len(seen) <= LEAVES_WALK:
      x = stack.pop()
      if not x.src: leaves.add(x.id)
      for s in (x.src[1:] if x.op is Ops.CALL or x.op is Ops.FUNCTION else x.src):
        if s.id not in seen: seen.add(s.id); stack.append(s)
    got = frozenset(leaves) if not stack else None
    cost = len(got) if got is not None else 1
    if _leaves_held + cost > LEAVES_MAX: _LEAVE_SETS.clear(); _leaves_held = 0
    _LEAVE_SETS[n.id] = got
    _leaves_held += cost
  return got

def _apply_map(mapping: dict[Node, Node], held: set | None = None) -> set:
  """Substitute `mapping` into the graph of every live Tensor at once (tinygrad's _apply_map_to_tensors). `held`:
  buffers to look for; returned, those some live tensor still stands on (the buffer under its view chain)."""
  found: set = set()
  if not mapping: return found
  # the table is copied in one C call (iterating it raised when another thread made a tensor meanwhile). Most tensors
  # are a chain of one-source nodes: down to a leaf (a realized tensor, a CONST: model weights are many) nothing
  # changes; down to a key (the realized tensor itself, a view of it) the chain is rebuilt over the key's value; only
  # a chain that reaches a node of several sources takes substitute's walk of the graph, unless no key can be in it:
  # the node is older than every key (a node's sources are made before it: ids only grow), it was walked clean under
  # these same keys before (graphs never change; a loop realizing one kept expression maps the same keys each time),
  # or no key's leaves are all among its graph's leaves (_leaves). Walking every live lazy tensor's graph cost a small
  # realize 8.5 ms beside 1,000 of them, and an SGD step's 300 assigns 0.4 s (bench/live_tensors.py, notes)
  global _CLEAN
  oldest, keys = min(k.id for k in mapping), frozenset(k.id for k in mapping)
  if _CLEAN[0] != keys or len(_CLEAN[1]) > CLEAN_MAX: _CLEAN = (keys, set())
  clean, rest, stops = _CLEAN[1], [], []
  needs = None   # each key's leaves, worked out once a graph gets this far (most realizes have no such graph)
  for r in _all_tensors.copy().values():
    if (t := r()) is None: continue
    if not (n := t.node).src and n not in mapping:   # a leaf, the commonest tensor (weights, optimizer state)
      if held and n in held: found.add(n)
      continue
    chain = []
    while n not in mapping:
      if len(n.src) != 1 or n.op is Ops.CALL or n.op is Ops.FUNCTION: break
      chain.append(n); n = n.src[0]
    else:
      if _RECENT: _unkeep(n)   # a kept graph's input: no tensor stands on it now
      v = mapping[n]
      for c in reversed(chain): v = c.over((v,))
      t.node = v
      continue
    if n.src:
      if n.id <= oldest or n.id in clean: continue
      if (lv := _leaves(n)) is None: rest.append(t); stops.append(n); continue
      if needs is None: needs = [frozenset((k.id,)) if not k.src else _leaves(k) for k in mapping]
      for need in needs:
        if need is None or need <= lv: rest.append(t); stops.append(n); break
      else: clean.add(n.id)
    elif held and n in held: found.add(n)
  for t, stop, n in zip(rest, stops, substitute([t.node for t in rest], mapping)):
    if n is not t.node: t.node = n
    else: clean.add(stop.id)
  return found

class Tensor:
  """A lazy tensor: `.node` is its graph. Building ops never executes; realize/numpy do."""
  __slots__ = ("node", "__weakref__")
  __array_ufunc__ = None  # numpy scalars on the left defer to our reflected ops

  def __init__(self, data: Any, dtype=None, device=None):
    """data: a Node or Tensor (wrapped, cast if `dtype` differs), a Python scalar (a CONST), or a nested list / numpy
    array (host data copied lazily from NPY to `device`, default CPU)."""
    dtype = None if dtype is None else dtypes.from_any(dtype)
    if isinstance(data, (Node, Tensor)):
      n = data if isinstance(data, Node) else data.node
      if device is not None and canonical_device(device) != n.device:
        raise DeviceError(f"Tensor: node {n.op.name} {n.shape} lives on {n.device}, not {device}; use .to()")
      n = n if dtype is None else n.cast(dtype)
    elif isinstance(data, Scalar):
      # Python scalars stay device-less unless asked: Tensor(2.0)+Tensor(3.0) is a pure constant expression
      n = const(fit(data, d := dtype or py_dtype(data)), d, None if device is None else canonical_device(device))
    else:
      if isinstance(data, (bytes, str, dict, set)) or data is None:
        raise DTypeError(f"Tensor: cannot make a tensor from {type(data).__name__}")
      dev = canonical_device(device or DEFAULT_DEVICE)
      arr, from_py = to_numpy(data)
      if dtype is None:
        dtype = dtypes.from_numpy(arr.dtype)
        if from_py and dtype.is_int(): dtype = dtypes.default_int
        elif from_py and dtype.is_float(): dtype = dtypes.default_float
      n = host_node(arr, dtype, dev)
    self.node: Node = n
    k = next(_tensor_ids)
    ref = _all_tensors[k] = _TRef(self, _forget)
    ref.key = k

  # --- properties
  @property
  def shape(self) -> tuple[int, ...]: return self.node.shape
  @property
  def dtype(self) -> DType: return self.node.dtype
  @property
  def device(self): return self.node.device
  @property
  def ndim(self) -> int: return len(self.node.shape)
  def numel(self) -> int: return _prod(self.shape)
  def element_size(self) -> int: return self.dtype.itemsize
  def nbytes(self) -> int: return self.numel() * self.dtype.itemsize
  def __len__(self) -> int:
    if not self.shape: raise ShapeError("len() of a 0-d tensor")
    return self.shape[0]
  def __iter__(self) -> Iterator[Tensor]: return (self[i] for i in range(len(self)))
  def __repr__(self): return f"<Tensor {self.node.op.name} shape={self.shape} dtype={self.dtype.name} device={self.device}>"
  def __bool__(self): raise UnsupportedOpError("the truth value of a Tensor is ambiguous; use .item() or .numpy()")
  __hash__ = object.__hash__  # __eq__ builds a graph, identity stays the hash

  # --- creation
  @staticmethod
  def manual_seed(seed: int = 0) -> None: rng.manual_seed(seed)

  @staticmethod
  def full(shape, fill_value, dtype=None, device=None) -> Tensor:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(s, (int, np.integer)) or s < 0 for s in shape): raise ShapeError(f"full: bad shape {shape}")
    dt = py_dtype(fill_value) if dtype is None else dtypes.from_any(dtype)
    return Tensor(const_like(fill_value, dt, canonical_device(device or DEFAULT_DEVICE), tuple(int(s) for s in shape)))
  @staticmethod
  def ones(*shape, dtype=None, device=None) -> Tensor: return Tensor.full(_argfix(shape), 1.0, dtype or dtypes.default_float, device)
  @staticmethod
  def zeros(*shape, dtype=None, device=None) -> Tensor: return Tensor.full(_argfix(shape), 0.0, dtype or dtypes.default_float, device)
  @staticmethod
  def empty(*shape, dtype=None, device=None) -> Tensor:
    v = empty_view(_argfix(shape), dtypes.from_any(dtype or dtypes.default_float), canonical_device(device or DEFAULT_DEVICE))
    # a disk tensor is the file's bytes: map them now, read-only (they may already hold data); a missing file is made
    # by the first write, a too small one is a DeviceError here
    if v.device.startswith("DISK:") and os.path.exists(v.device[5:]): STORAGE.allocate(v.base, write=False)
    return Tensor(v)
  @staticmethod
  def arange(start, stop=None, step=1, dtype=None, device=None) -> Tensor:
    if stop is None: start, stop = 0, start
    if step == 0: raise ShapeError("arange: step must not be zero")
    dt = dtypes.from_any(dtype) if dtype is not None else \
      dtypes.default_float if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.default_int
    return Tensor(np.arange(start, stop, step), dt, device)
  @staticmethod
  def eye(n: int, m: int | None = None, dtype=None, device=None) -> Tensor:
    return Tensor(np.eye(n, m), dtype or dtypes.default_float, device)
  @staticmethod
  def rand(*shape, dtype=None, device=None) -> Tensor:
    """Uniform [0, 1): tinygrad's Threefry counter RNG, bit for bit (egraph/frontend/rng.py; reseed with manual_seed)."""
    dt = dtypes.from_any(dtype or dtypes.default_float)
    return Tensor(rng.rand(_argfix(shape), dt, canonical_device(device or DEFAULT_DEVICE))).contiguous()
  @staticmethod
  def randn(*shape, dtype=None, device=None) -> Tensor:
    """Normal(0, 1) by Box-Muller over two uniform draws, as tinygrad computes it."""
    src = Tensor.rand(2, *_argfix(shape), dtype=dtypes.float32, device=device)
    return (src[0] * (2 * math.pi)).cos().mul(((1 - src[1]).log() * -2).sqrt()).cast(dtype or dtypes.default_float)
  @staticmethod
  def uniform(*shape, low=0.0, high=1.0, dtype=None, device=None) -> Tensor:
    return ((high - low) * Tensor.rand(*shape, device=device)).cast(dtype or dtypes.default_float) + low
  @staticmethod
  def randint(*shape, low=0, high=10, dtype=dtypes.int32, device=None) -> Tensor:
    if not dtypes.from_any(dtype).is_int(): raise DTypeError(f"randint: dtype {dtype} must be an int dtype")
    if low >= high: raise ShapeError(f"randint requires low < high, got low={low}, high={high}")
    return Tensor.uniform(*shape, low=low, high=high, dtype=dtype, device=device)
  def full_like(self, fill_value, dtype=None) -> Tensor:
    return Tensor.full(self.shape, fill_value, dtype or self.dtype, self.device or DEFAULT_DEVICE)
  def ones_like(self, dtype=None) -> Tensor: return self.full_like(1, dtype)
  def zeros_like(self, dtype=None) -> Tensor: return self.full_like(0, dtype)

  # --- realization
  @staticmethod
  def _pending(ts) -> list[Tensor]:
    """The tensors realize has work for: on a device and not already storage."""
    return [t for t in ts if t.node.device is not None and not t.node.has_buffer_identity()]

  def realize(self, *lst: Tensor) -> Tensor:
    """Callify the pending tensors, point every live tensor at the new buffers, then run the CALL, whose last kernel
    may still be running on return (`synchronize`; CALLSAT_ASYNC=0 waits). Works as `t.realize(a, b)` and
    `Tensor.realize(a, b)`."""
    if not (ts := Tensor._pending((self, *lst))): return self
    wait = _realize_waits()   # checked before anything changes
    roots = tuple(dict.fromkeys(t.node for t in ts))
    res = callify(*roots)
    ins = _recent_inputs(res)
    held = _apply_map(res.buffer_map, ins)
    # the CALL's last kernel may still be running when this returns: storage finishes it before anyone reads (the next
    # realize, numpy(), any array it hands out), so building the next graph overlaps it
    run_call(res.call, wait=wait)
    if ins is not None and len(held) == len(ins): _RECENT.append((roots, ins))
    return self

  def __del__(self):
    # a kept graph (RECENT) never outlives the user's tensors over its inputs: one dies, the kept graphs go
    if _RECENT:
      try: _unkeep(_leaf(self.node))
      except Exception: pass   # at interpreter exit the module's globals may be gone

  def callify(self, *lst: Tensor) -> Tensor:
    """Like realize but lazy: tensors become AFTER(storage, CALL), executed by a later realize."""
    if not (ts := Tensor._pending((self, *lst))): return self
    res = callify(*dict.fromkeys(t.node for t in ts))
    _apply_map({k: v.after(res.call) for k, v in res.buffer_map.items()})
    return self

  def numpy(self) -> np.ndarray:
    """A copy of the values; bfloat16 and fp8 come back as float32 (numpy has no such dtypes), as in tinygrad."""
    self.realize()
    out = np.array(read(self.node), dtype=self.dtype.np).reshape(self.shape)
    return out.astype(np.float32) if self.dtype in (dtypes.bfloat16, *dtypes.fp8s) else out
  def tolist(self): return self.numpy().tolist()
  def item(self):
    if self.numel() != 1: raise ShapeError(f"item: tensor of shape {self.shape} has {self.numel()} elements, not 1")
    return self.numpy().reshape(()).item()

  def to(self, device) -> Tensor:
    dev = canonical_device(device)
    if dev == self.device: return self
    if self.device is None:
      # a device-less constant expression: put its constants on `dev` instead of copying from nowhere
      consts = [n for n in self.node.toposort() if n.op is Ops.CONST and n.arg[1] is None]
      return Tensor(substitute([self.node], {c: const(c.arg[0], c.dtype, dev) for c in consts})[0])
    return Tensor(Node(Ops.COPY, self.dtype, (self.node,), dev))

  def shard(self, devices, axis: int | None = 0) -> Tensor:
    """Place this tensor's values on a tuple of devices: split along `axis` (each device holds one shard, a MULTI view),
    or replicated on every device with axis=None. The values are realized and placed now (a data-loading step)."""
    devs = canonical_device(tuple(devices) if isinstance(devices, (list, tuple)) else devices)
    if not isinstance(devs, tuple) or len(devs) < 1: raise DeviceError(f"shard: need a tuple of devices, got {devices!r}")
    arr = self.numpy()
    if axis is None:
      buf = new_buffer(arr.size, self.dtype, devs)
      STORAGE.set_data(buf, np.broadcast_to(arr.reshape(-1), (len(devs), arr.size)))
      return Tensor(buf.reshape(self.shape))
    axis = self._axis(axis)
    if self.shape[axis] % len(devs): raise ShapeError(f"shard: axis {axis} of shape {self.shape} does not split over {len(devs)} devices")
    shards = np.stack(np.split(arr, len(devs), axis))
    buf = new_buffer(shards[0].size, self.dtype, devs)
    STORAGE.set_data(buf, shards)
    return Tensor(Node(Ops.MULTI, self.dtype, (buf.reshape(shards.shape[1:]),), axis))

  def contiguous(self) -> Tensor:
    n = self.node
    return self if n.op is Ops.CONTIGUOUS or n.device is None or n.has_buffer_identity() else Tensor(n.contiguous())
  def contiguous_backward(self) -> Tensor: return Tensor(Node(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.node,)))
  def detach(self) -> Tensor: return Tensor(Node(Ops.DETACH, self.dtype, (self.node,)))

  def assign(self, x) -> Tensor:
    """self.node = AFTER(target, STORE(target, x)): a write into self's storage (a fresh buffer if self is computed)."""
    if self.device is None: raise DeviceError(f"assign: target of shape {self.shape} has no device")
    if not isinstance(x, Tensor):
      x = Tensor(const_like(x, self.dtype, self.device, self.shape)) if isinstance(x, Scalar) else Tensor(x, self.dtype, self.device)
    if x is self: return self
    if x.shape != self.shape: raise ShapeError(f"assign: value shape {x.shape} does not match target shape {self.shape}")
    if x.dtype != self.dtype: raise DTypeError(f"assign: value dtype {x.dtype.name} does not match target dtype {self.dtype.name}")
    if x.device is not None and x.device != self.device:
      raise DeviceError(f"assign: value device {x.device} does not match target device {self.device}")
    tgt = self.node
    check_writable(tgt)
    write = tgt.after(tgt.store(x.node))
    b = storage_base(tgt)
    if b is not None:
      # every tensor that reads this storage now reads it after the write (tinygrad's assign); self is the write itself
      _apply_map({b: b.after(write)})
    self.node = write
    return self

  # --- broadcasting and promotion
  def _operands(self, y, op: str, reverse: bool = False) -> tuple[Node, Node]:
    """(x, y) as nodes of one broadcast shape and one promoted dtype; `y` may be a Tensor, Python scalar or array-like."""
    if isinstance(y, np.generic): y = y.item()
    if isinstance(y, Scalar):
      dt = weak_dtype(y, self.dtype)
      shape = broadcast_shape(self.shape, (), op=op)
      xn, yn = broadcast_to(self.node.cast(dt), shape), scalar_operand(y, dt, self.device, shape, op)
    else:
      if not isinstance(y, Tensor): y = Tensor(y, device=self.device or DEFAULT_DEVICE)
      xn, yn = _promoted(self.node, y.node, op)
    return (yn, xn) if reverse else (xn, yn)

  def _binary(self, op: Ops, y, reverse=False) -> Tensor: return Tensor(Node(op, None, self._operands(y, op.name, reverse)))
  def mulacc(self, y, z) -> Tensor:
    """self * y + z as one op (tinygrad's MULACC), rounded after the multiply as after the add; y, z tensors or scalars."""
    a, b = self._operands(y, "MULACC")
    a, c = Tensor(a)._operands(z, "MULACC")
    return Tensor(Node(Ops.MULACC, None, (a, broadcast_to(b.cast(a.dtype), a.shape), c)))

  # --- elementwise
  def add(self, y, reverse=False) -> Tensor: return self._binary(Ops.ADD, y, reverse)
  def sub(self, y, reverse=False) -> Tensor: return self._binary(Ops.SUB, y, reverse)
  def mul(self, y, reverse=False) -> Tensor: return self._binary(Ops.MUL, y, reverse)
  def div(self, y, reverse=False, rounding_mode=None) -> Tensor:
    """True division (ints and bools go to the default float first); rounding_mode "trunc" or "floor" as tinygrad:
    ints divide exactly (IDIV / FLOORDIV), floats round the quotient x * (1/y)."""
    a, b = self._operands(y, "FDIV", reverse)
    if a.dtype.is_int() and rounding_mode in ("trunc", "floor"):
      return Tensor(Node(Ops.IDIV if rounding_mode == "trunc" else Ops.FLOORDIV, None, (a, b)))
    if rounding_mode not in (None, "trunc", "floor"): raise UnsupportedOpError(f"div: rounding_mode={rounding_mode!r}")
    if not a.dtype.is_float(): a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
    if rounding_mode is None: return Tensor(Node(Ops.FDIV, None, (a, b)))
    q = Tensor(Node(Ops.MUL, None, (a, b.alu(Ops.RECIPROCAL))))
    return q.trunc() if rounding_mode == "trunc" else q.floor()
  def mod(self, y, reverse=False) -> Tensor:
    """Python's modulo (sign of the divisor): FLOORMOD for ints, x - floor(x / y) * y for floats."""
    a, b = self._operands(y, "MOD", reverse)
    if a.dtype.is_int(): return Tensor(Node(Ops.FLOORMOD, None, (a, b)))
    a, b = Tensor(a), Tensor(b)
    return a - a.div(b, rounding_mode="floor") * b
  def fmod(self, y) -> Tensor:
    """C's remainder (sign of the dividend): MOD for ints, x - trunc(x / y) * y for floats."""
    a, b = self._operands(y, "MOD")
    if a.dtype.is_int(): return Tensor(Node(Ops.MOD, None, (a, b)))
    a, b = Tensor(a), Tensor(b)
    return a - a.div(b, rounding_mode="trunc") * b
  def lshift(self, y, reverse=False) -> Tensor: return self._binary(Ops.SHL, y, reverse)
  def rshift(self, y, reverse=False) -> Tensor: return self._binary(Ops.SHR, y, reverse)
  def pow(self, y, reverse=False) -> Tensor:
    """POW of the promoted operands; an int base with a negative (or float) Python exponent needs a float (tinygrad)."""
    a, b = self._operands(y, "POW", reverse)
    if not a.dtype.is_float() and isinstance(y, Scalar) and not (isinstance(y, int) and (reverse or y >= 0)):
      raise DTypeError(f"POW: base needs to be float for the exponent {y!r} (the base is {a.dtype.name})")
    if a.dtype == dtypes.bool: a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
    return Tensor(Node(Ops.POW, None, (a, b)))
  def maximum(self, y) -> Tensor: return self._binary(Ops.MAX, y)
  def minimum(self, y) -> Tensor:
    a, b = self._operands(y, "minimum")
    # -max(-a,-b) for floats keeps MAX's NaN handling; ints use a compare (no overflow at INT_MIN, works for uint8/bool)
    if a.dtype.is_float(): return Tensor(Node(Ops.NEG, None, (Node(Ops.MAX, None, (a.alu(Ops.NEG), b.alu(Ops.NEG))),)))
    return Tensor(Node(Ops.WHERE, None, (a.alu(Ops.CMPLT, b), a, b)))
  def clip(self, min_=None, max_=None) -> Tensor:
    x = self if min_ is None else self.maximum(min_)
    return x if max_ is None else x.minimum(max_)

  def where(self, x, y) -> Tensor:
    """cond.where(x, y) (also Tensor.where(cond, x, y)); x and y may be Python scalars (weak) or tensors."""
    dev = self.device
    x, y = [v.item() if isinstance(v, np.generic) else v for v in (x, y)]
    x, y = [v if isinstance(v, (Tensor, *Scalar)) else Tensor(v, device=dev or DEFAULT_DEVICE) for v in (x, y)]
    if isinstance(x, Tensor) and isinstance(y, Tensor): dt = least_upper_dtype(x.dtype, y.dtype)
    elif isinstance(x, Tensor): dt = weak_dtype(y, x.dtype)
    elif isinstance(y, Tensor): dt = weak_dtype(x, y.dtype)
    else: dt = least_upper_dtype(py_dtype(x), py_dtype(y))
    if dev is None: dev = next((v.device for v in (x, y) if isinstance(v, Tensor) and v.device is not None), None)
    shape = broadcast_shape(*(v.shape if isinstance(v, Tensor) else () for v in (self, x, y)), op="WHERE")
    xn, yn = [broadcast_to(v.node.cast(dt), shape) if isinstance(v, Tensor) else scalar_operand(v, dt, dev, shape, "WHERE")
              for v in (x, y)]
    cond = self.node if self.dtype == dtypes.bool else self.node.alu(Ops.CMPNE, const_like(0, self.dtype, self.device, self.shape))
    return Tensor(Node(Ops.WHERE, None, (broadcast_to(cond, shape), xn, yn)))

  def _unary(self, op: Ops) -> Tensor: return Tensor(self.node.alu(op))
  def _float(self) -> Tensor: return self if self.dtype.is_float() else self.cast(dtypes.default_float)
  def neg(self) -> Tensor: return self.logical_not() if self.dtype == dtypes.bool else self._unary(Ops.NEG)
  def logical_not(self) -> Tensor:
    b = self if self.dtype == dtypes.bool else self.cast(dtypes.bool)
    return Tensor(b.node.alu(Ops.CMPNE, const_like(True, dtypes.bool, b.device, b.shape)))
  def exp2(self) -> Tensor: return self._float()._unary(Ops.EXP2)
  def log2(self) -> Tensor: return self._float()._unary(Ops.LOG2)
  def exp(self) -> Tensor: return (self._float() * (1 / math.log(2))).exp2()
  def log(self) -> Tensor: return self._float().log2() * math.log(2)
  def sqrt(self) -> Tensor: return self._float()._unary(Ops.SQRT)
  def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()
  def reciprocal(self) -> Tensor: return self._float()._unary(Ops.RECIPROCAL)
  def sin(self) -> Tensor: return self._float()._unary(Ops.SIN)
  def cos(self) -> Tensor: return ((math.pi / 2) - self._float()).sin()
  def sigmoid(self) -> Tensor: return (1 + (self._float() * (-1 / math.log(2))).exp2()).reciprocal()
  def tanh(self) -> Tensor: return 2.0 * (2.0 * self._float()).sigmoid() - 1.0
  def relu(self) -> Tensor: return (self > 0).where(self, 0)
  def square(self) -> Tensor: return self * self
  def abs(self) -> Tensor: return self if self.dtype.kind in 'bu' else (self < 0).where(-self, self)
  def trunc(self) -> Tensor: return self._unary(Ops.TRUNC) if self.dtype.is_float() else self
  def floor(self) -> Tensor:
    if not self.dtype.is_float(): return self
    b = self.trunc()
    return (self < b).where(b - 1, b)
  def ceil(self) -> Tensor:
    if not self.dtype.is_float(): return self
    b = self.trunc()
    return (self > b).where(b + 1, b)

  def cast(self, dtype) -> Tensor:
    dt = dtypes.from_any(dtype)
    return self if dt == self.dtype else Tensor(self.node.cast(dt))
  def bitcast(self, dtype) -> Tensor:
    """Reinterpret the bytes; a size change rescales the last dim (as in tinygrad)."""
    dt = dtypes.from_any(dtype)
    return self if dt == self.dtype else Tensor(Node(Ops.BITCAST, dt, (self.node,)))
  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)

  def _bitwise(self, op: Ops, y, reverse=False) -> Tensor:
    a, b = self._operands(y, op.name, reverse)
    if a.dtype.is_float(): raise DTypeError(f"{op.name}: needs an int or bool dtype, got {a.dtype.name}")
    return Tensor(Node(op, None, (a, b)))
  def bitwise_not(self) -> Tensor:
    """~x: logical not for bools, XOR with all-ones for ints (order-reversing, so min = ~max(~x) without overflow)."""
    if self.dtype == dtypes.bool: return self.logical_not()
    if self.dtype.is_float(): raise DTypeError(f"bitwise_not: needs an int or bool dtype, got {self.dtype.name}")
    return self._bitwise(Ops.XOR, -1)

  __add__ = add; __sub__ = sub; __mul__ = mul; __truediv__ = div; __mod__ = mod; __pow__ = pow
  __lshift__ = lshift; __rshift__ = rshift
  def __floordiv__(self, y): return self.div(y, rounding_mode="floor")
  def __rfloordiv__(self, y): return self.div(y, True, rounding_mode="floor")
  def __rmod__(self, y): return self.mod(y, True)
  def __rpow__(self, y): return self.pow(y, True)
  def __rlshift__(self, y): return self.lshift(y, True)
  def __rrshift__(self, y): return self.rshift(y, True)
  def __radd__(self, y): return self.add(y, True)
  def __rsub__(self, y): return self.sub(y, True)
  def __rmul__(self, y): return self.mul(y, True)
  def __rtruediv__(self, y): return self.div(y, True)
  def __and__(self, y): return self._bitwise(Ops.AND, y)
  def __or__(self, y): return self._bitwise(Ops.OR, y)
  def __xor__(self, y): return self._bitwise(Ops.XOR, y)
  def __rand__(self, y): return self._bitwise(Ops.AND, y, True)
  def __ror__(self, y): return self._bitwise(Ops.OR, y, True)
  def __rxor__(self, y): return self._bitwise(Ops.XOR, y, True)
  def __neg__(self): return self.neg()
  def __invert__(self): return self.bitwise_not()
  def __abs__(self): return self.abs()
  # in-place ops assign into self, as in tinygrad
  def __iadd__(self, y): return self.assign(self.add(y))
  def __isub__(self, y): return self.assign(self.sub(y))
  def __imul__(self, y): return self.assign(self.mul(y))
  def __itruediv__(self, y): return self.assign(self.div(y))
  def __ifloordiv__(self, y): return self.assign(self // y)
  def __imod__(self, y): return self.assign(self % y)
  def __ilshift__(self, y): return self.assign(self << y)
  def __irshift__(self, y): return self.assign(self >> y)
  def __lt__(self, y): return self._binary(Ops.CMPLT, y)
  def __gt__(self, y): return self._binary(Ops.CMPLT, y, True)
  def __le__(self, y): return (self > y).logical_not()   # a<=b is not(b<a)
  def __ge__(self, y): return (self < y).logical_not()
  def __eq__(self, y): return self._binary(Ops.CMPEQ, y)  # type: ignore[override]
  def __ne__(self, y): return self._binary(Ops.CMPNE, y)  # type: ignore[override]

  # --- reductions (REDUCE keeps dims; keepdim=False reshapes them away)
  def _axes(self, axis) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    out = set()
    for a in ((axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)):
      if not -self.ndim <= a < self.ndim: raise ShapeError(f"reduce: axis {a} is out of range for shape {self.shape}")
      out.add(int(a) % self.ndim)
    return tuple(sorted(out))
  def _reduce(self, op: Ops, axis, keepdim: bool) -> Tensor: return Tensor(_reduced(self.node, op, self._axes(axis), keepdim))
  def sum(self, axis=None, keepdim=False, dtype=None) -> Tensor:
    """In sum_acc_dtype or `dtype` (_summed)."""
    return Tensor(_summed(self.node, self._axes(axis), keepdim, dtype))
  def prod(self, axis=None, keepdim=False, dtype=None) -> Tensor:
    """In its own dtype (or `dtype`), as tinygrad 0.14: no accumulation dtype, unlike sum."""
    return self.cast(self.dtype if dtype is None else dtype)._reduce(Ops.MUL, axis, keepdim)
  def max(self, axis=None, keepdim=False) -> Tensor: return self._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis=None, keepdim=False) -> Tensor:
    # an order-reversing bijection turns min into max: negation for floats, ~x for ints/bools (exact at INT_MIN and 0u)
    if self.dtype.is_float(): return -((-self).max(axis, keepdim))
    return ~((~self).max(axis, keepdim))
  def mean(self, axis=None, keepdim=False) -> Tensor:
    """A float result: ints/bools are cast to the default float first."""
    cnt = _prod(self.shape[a] for a in self._axes(axis))
    return self._float().sum(axis, keepdim) / cnt
  def var(self, axis=None, keepdim=False, correction=1) -> Tensor:
    x = self._float()
    cnt = _prod(self.shape[a] for a in self._axes(axis))
    return (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim) / max(0, cnt - correction)
  def std(self, axis=None, keepdim=False, correction=1) -> Tensor: return self.var(axis, keepdim, correction).sqrt()
  def softmax(self, axis=-1) -> Tensor:
    e = (self._float() - self._float().max(axis, keepdim=True)).exp()
    return e / e.sum(axis, keepdim=True)

  # --- movement
  def _axis(self, a: int, nd: int | None = None) -> int:
    nd = self.ndim if nd is None else nd
    if not -nd <= a < nd: raise ShapeError(f"axis {a} is out of range for shape {self.shape}")
    return a % nd if nd else 0

  def reshape(self, *shape) -> Tensor:
    """-1 infers one dim, None keeps the dim at that position."""
    shape = tuple(self.shape[i] if s is None else int(s) for i, s in enumerate(_argfix(shape)))
    if shape.count(-1) > 1: raise ShapeError(f"reshape: only one -1 allowed, got {shape}")
    if -1 in shape:
      rest = _prod(s for s in shape if s != -1)
      if rest == 0 or self.numel() % rest: raise ShapeError(f"reshape: cannot reshape {self.shape} to {shape}")
      shape = tuple(self.numel() // rest if s == -1 else s for s in shape)
    return self if shape == self.shape else Tensor(self.node.reshape(shape))
  def view(self, *shape) -> Tensor: return self.reshape(*shape)
  def permute(self, *order) -> Tensor: return Tensor(self.node.permute(tuple(self._axis(a) for a in _argfix(order))))
  def expand(self, *shape) -> Tensor:
    """-1 (or None) keeps a dim; extra leading dims are prepended as in numpy broadcasting."""
    shape = _argfix(shape)
    if len(shape) < self.ndim: raise ShapeError(f"expand: cannot expand {self.shape} to {shape} (fewer dims)")
    old = (1,) * (len(shape) - self.ndim) + self.shape
    new = tuple(o if s is None or s == -1 else int(s) for o, s in zip(old, shape))
    return Tensor(self.node.reshape(old).expand(new))
  def shrink(self, arg) -> Tensor:
    """((start, end) | None per dim); None keeps the whole dim."""
    if len(arg) != self.ndim: raise ShapeError(f"shrink: {arg} does not match shape {self.shape}")
    return Tensor(self.node.shrink(tuple((0, s) if a is None else a for a, s in zip(arg, self.shape))))
  def pad(self, arg, value=0.0) -> Tensor:
    """((before, after) | None per dim), or torch's flat form (last dim first). Negative pads shrink.
    A nonzero fill is `where(padded mask of ones, padded x, value)`: PAD itself only fills zeros, and x - value + value
    would not round-trip inf/NaN or large ints."""
    if all(isinstance(p, (int, np.integer)) for p in arg):
      if len(arg) % 2 or len(arg) // 2 > self.ndim: raise ShapeError(f"pad: flat padding {arg} does not fit shape {self.shape}")
      flat = [(int(arg[i]), int(arg[i + 1])) for i in range(0, len(arg), 2)][::-1]
      arg = [(0, 0)] * (self.ndim - len(flat)) + flat
    if len(arg) != self.ndim: raise ShapeError(f"pad: {arg} does not match shape {self.shape}")
    arg = [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in arg]
    x = self
    if any(b < 0 or a < 0 for b, a in arg):
      x = x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(arg, self.shape)))
      arg = [(max(b, 0), max(a, 0)) for b, a in arg]
    if all(b == 0 and a == 0 for b, a in arg): return x
    out = x.node.pad(arg)
    if value == 0: return Tensor(out)
    mask = const_like(True, dtypes.bool, x.device, x.shape).pad(arg)
    return Tensor(Node(Ops.WHERE, None, (mask, out, const_like(value, x.dtype, x.device, out.shape))))
  def flip(self, axis) -> Tensor:
    axes = {self._axis(a) for a in ((axis,) if isinstance(axis, (int, np.integer)) else axis)}
    return Tensor(self.node.flip(tuple(i in axes for i in range(self.ndim))))
  def transpose(self, dim0=1, dim1=0) -> Tensor:
    order = list(range(self.ndim))
    a, b = self._axis(dim0), self._axis(dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor: return self.transpose()
  def flatten(self, start_dim=0, end_dim=-1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._axis(start_dim), self._axis(end_dim)
    return self.reshape(self.shape[:s] + (_prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def squeeze(self, dim=None) -> Tensor:
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    d = self._axis(dim)
    return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])
  def unsqueeze(self, dim) -> Tensor:
    d = self._axis(dim, self.ndim + 1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

  def __getitem__(self, idx) -> Tensor:
    """ints (negative too), slices with any step, None and ... (egraph/frontend/indexing.py)."""
    return Tensor(basic_index(self.node, idx))

  # --- matmul
  def dot(self, w: Tensor) -> Tensor:
    """tinygrad's formulation: broadcast-multiply with the contracted axis last, then sum it. 1-D operands as in numpy."""
    if not isinstance(w, Tensor): w = Tensor(w, device=self.device or DEFAULT_DEVICE)
    n1, n2 = self.ndim, w.ndim
    if n1 == 0 or n2 == 0: raise ShapeError(f"matmul: both operands need at least 1 dim, got {self.shape} and {w.shape}")
    if self.shape[-1] != w.shape[axis_w := -min(n2, 2)]:
      raise ShapeError(f"matmul: cannot multiply shapes {self.shape} and {w.shape} ({self.shape[-1]} != {w.shape[axis_w]})")
    # made on nodes (a Tensor per step cost a third of a small matmul's graph build)
    ones = (1,) * min(n1 - 1, n2 - 1, 1)
    x = self.node.reshape((*self.shape[:-1], *ones, self.shape[-1]))
    w2 = w.node.reshape((*w.shape[:-2], *ones, *w.shape[axis_w:]))
    order = list(range(nd := len(w2.shape)))
    order[-1], order[axis_w % nd] = order[axis_w % nd], order[-1]
    try: a, b = _promoted(x, w2.permute(order), "MUL")
    except ShapeError as e: raise ShapeError(f"matmul: batch dims of {self.shape} and {w.shape} do not broadcast") from e
    return Tensor(_summed(Node(Ops.MUL, None, (a, b)), (len(a.shape) - 1,), False, None).cast(a.dtype))
  matmul = dot
  def __matmul__(self, w): return self.dot(w)
  def __rmatmul__(self, w): return Tensor(w, device=self.device or DEFAULT_DEVICE).dot(self)
