"""CALL body -> an ordered list of kernels (lower/kernel.py) plus a buffer plan.

* One store group per STORE (in lower/reference.py's effect order); a nested CALL is scheduled recursively as one group.
  Its arguments bind to their storage when they are one contiguous range of it, also through AFTERs (the storage after
  those writes, which the group order keeps first); any other argument (a strided view, a MULTI's logical value,
  computed data) is copied into a temporary right before the call.
* Multi-device (sharded) CALLs: storage on a tuple of devices holds every device's copy, device-major (Mem.dstride
  apart). A STORE into a MULTI becomes one kernel per device over its shard, into per-device storage one kernel per
  device over the whole value; values are logical, and MULTI is index arithmetic: element i along the shard axis is on
  device i // shard size. When that device is the kernel's own (elementwise, reduces along other axes, a permute of the
  shard axis, ...) a kernel reads only its device's memory and all devices share one compiled kernel; otherwise (a
  reduce over the shard axis, a shrink across shards, a COPY off the devices) it reads the other devices' copies
  directly (CPU:n are all host memory) and Program.peers records it. Multi-device temporaries are split along their
  shard axis (ir.shard_axes), each device computing its part. Kernels of one STORE that read each other's targets all
  compute into temporaries before any copy back. A STORE into a view of a MULTI raises UnsupportedOpError.
* The value of a STORE is fused into one kernel over the target's shape. Movement ops (reshape, permute, expand, shrink,
  pad, flip) and SLICE views become index arithmetic (kernel.Idx); nothing is copied for them.
* A REDUCE is computed in place, as an accumulator loop nest, unless a broadcasting EXPAND lies between it and the
  store (then every output element would recompute it): such a REDUCE is split into its own kernel writing a
  contiguous temporary, which the consumer reads through the same index arithmetic. softmax is therefore 3 kernels
  (max, sum of exp, the division), a row sum or a matmul is one. A big REDUCE below another REDUCE (_nested_reduces)
  is realized too, so softmax(a @ b) runs the matmul once, tiled, and the softmax's kernels read it.
* Bounded fusion: a pass over the value graph estimates the per-element expression size; when a node exceeds FUSE_CAP,
  its largest inputs are realized into temporaries (their own kernels). Compile time is ~quadratic in function size,
  so a 100k-op chain becomes ~100k/FUSE_CAP kernels of bounded size.
* Effects follow lower/reference.py exactly: a read through AFTER sees the state at the time its kernel runs (its deps
  and everything ordered before it), a direct read of storage sees the state before the CALL's writes. Groups keep
  numpy's order where they conflict (write/write, write/after-read); a direct reader is moved before every writer of
  the storage it reads, and when that is impossible (the writer must precede it) the storage is snapshotted at the start.
  Inside one kernel, a store whose value reads its own target at another index (flip of itself, a reduce over itself)
  goes to a temporary and is copied back by a second kernel.
* Adjacent domain axes that every index uses only as one flat index (coef(outer) == size(inner) * coef(inner), also
  inside floor Div/Mod atoms) are collapsed into one axis: a contiguous elementwise kernel over [R, C] is one loop of
  R*C, which vectorizes and splits across threads as one range.
* A kernel whose only live axis is domain[0], storing contiguously (unit stride) into a write-only, disjoint output of
  at least STREAM_MIN_BYTES, is marked `stream`: the renderer writes it with non-temporal stores (no write-allocate).
"""
from __future__ import annotations
import itertools, math, sys
from dataclasses import dataclass, field
from egraph.dtype import DType, dtypes
from egraph.errors import CallsatError, UnsupportedOpError
from egraph.ir import Node, Ops, GroupOp, toposort, is_shard, shard_axes
from lower.kernel import Idx, Var, Bound, Expr, Param, Store, Kernel, const, flat_index, unflatten

FUSE_CAP = 400           # max estimated expression nodes per kernel
NESTED_REDUCE_WORK = 1 << 15   # a REDUCE inside another's body with at least this many inputs gets its own kernel
STREAM_MIN_BYTES = 8 << 20   # outputs at least this large (4x a core's L2) get non-temporal stores (Kernel.stream)
UNSUPPORTED = {Ops.FUNCTION: "FUNCTION", Ops.TUPLE: "TUPLE", Ops.GETTUPLE: "GETTUPLE", Ops.BIND: "BIND"}
IDENTITY = frozenset({Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CONTIGUOUS, Ops.COPY})

@dataclass(frozen=True)
class Mem:
  """A typed, contiguous byte range of one storage root: ('arg', uid) for a BUFFER, ('tmp', n) for a temporary."""
  root: tuple
  off: int          # bytes
  dtype: DType
  count: int        # elements
  dstride: int = 0  # per-device storage (a BUFFER on a tuple of devices): bytes from one device's copy to the next
  @property
  def nbytes(self) -> int: return self.count * self.dtype.itemsize
  def on(self, d: int) -> "Mem":
    """Device d's copy of per-device storage (device 0's for a plain Mem)."""
    return Mem(self.root, self.off + d * self.dstride, self.dtype, self.count)
  def overlaps(self, o: "Mem") -> bool:
    return self.root == o.root and self.nbytes > 0 and o.nbytes > 0 and self.off < o.off + o.nbytes and o.off < self.off + self.nbytes

@dataclass
class Spec:
  """A kernel before its memory is resolved: loads carry (Mem, direct) keys instead of param numbers."""
  domain: tuple
  mem: Mem
  idx: Idx
  value: Expr
  kind: str = "e"

@dataclass
class Step:
  kernel: Kernel | None         # None: a snapshot (memcpy src -> dst)
  mems: tuple                   # one Mem per kernel param; (src, dst) for a snapshot
  work: int = 0                 # estimated element-ops, for the thread split

@dataclass
class Program:
  steps: list
  temps: dict                   # tmp root -> nbytes
  written: set                  # ('arg', uid) roots written
  peers: set = field(default_factory=set)   # (kernel device, device read): reads of another device's storage

def _dims(x: Node) -> tuple: return x.shape

class _Ctx:
  """Shared state of one program: temp numbering, shard axes of multi-device values, cross-device reads."""
  def __init__(self): self.tmp, self.axes, self.peers = itertools.count(), {}, set()
  def temp(self, dtype: DType, count: int) -> Mem: return Mem(("tmp", next(self.tmp)), 0, dtype, count)

# ---------------------------------------------------------------------------------------------------------------------
# storage views

def storage_mem(n: Node, bind: dict) -> tuple[Mem | None, bool]:
  """The contiguous storage `n` is (RESHAPE/AFTER/DETACH/SLICE chain down to a PARAM or BUFFER), and whether an AFTER
  was passed; (None, _) if `n` is computed or a non-contiguous view."""
  after, chain = False, []
  while True:
    if n.op is Ops.AFTER: after = True; n = n.src[0]
    elif n.op in (Ops.RESHAPE, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD): n = n.src[0]
    elif n.op is Ops.SLICE: chain.append(n); n = n.src[0]
    else: break
  if n.op is Ops.PARAM:
    if n.arg.slot < 0: raise UnsupportedOpError("LLVM backend: symbolic PARAM (slot -1) is not supported yet")
    if n.arg.slot not in bind: raise CallsatError(f"PARAM slot={n.arg.slot}: no such argument ({len(bind)} given)")
    m = bind[n.arg.slot]
    if m.count != n.numel or m.dtype != n.dtype:
      raise CallsatError(f"PARAM slot={n.arg.slot}: argument is {m.dtype.name}({m.count},), the PARAM says {n.dtype.name}{n.shape}")
  elif n.op is Ops.BUFFER: m = Mem(("buf", n.arg.uid), 0, n.dtype, n.arg.size, _dstride(n))
  else: return None, after
  for s in reversed(chain):   # on a tuple of devices a SLICE is the same range of every device's copy
    off, count = s.arg
    m = Mem(m.root, m.off + off * m.dtype.itemsize, s.dtype, count, m.dstride)
  return m, after

def _dstride(b: Node) -> int: return b.arg.size * b.dtype.itemsize if isinstance(b.arg.device, tuple) else 0

def view_mem(n: Node, bind: dict) -> Mem | None:
  """The storage `n` is when it is one contiguous element range of it, through movement ops and AFTERs (an AFTER is
  its storage after its effects), else None."""
  m, _ = storage_mem(n, bind)
  if m is not None: return m
  chain, b = [], n
  while b.op in (Ops.AFTER, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD) or (b.op in GroupOp.Movement and b.op is not Ops.PAD):
    if b.op in GroupOp.Movement: chain.append(b)
    b = b.src[0]
  m, _ = storage_mem(b, bind)
  if m is None: return None
  from egraph.view import contiguous_range   # callify's own test for views, on the chain without its AFTERs
  x = b
  for c in reversed(chain): x = Node(c.op, c.dtype, (x,), c.arg)
  if (r := contiguous_range(x, b)) is None: return None
  return Mem(m.root, m.off + r[0] * m.dtype.itemsize, n.dtype, r[1], m.dstride)

def _through(n: Node, idx: tuple, valid: tuple) -> tuple[tuple, tuple]:
  """Index and validity in n.src[0] of element `idx` of the movement op `n`."""
  x, a = n.src[0], n.arg
  if n.op is Ops.RESHAPE: return unflatten(flat_index(idx, n.shape), x.shape), valid
  if n.op is Ops.PERMUTE:
    out = [None] * len(a)
    for i, p in enumerate(a): out[p] = idx[i]
    return tuple(out), valid
  if n.op is Ops.EXPAND: return tuple(Idx.const(0) if s == 1 and t != 1 else i for i, s, t in zip(idx, x.shape, a)), valid
  if n.op is Ops.SHRINK: return tuple(i + s for i, (s, _) in zip(idx, a)), valid
  if n.op is Ops.FLIP: return tuple((-i) + (s - 1) if f else i for i, f, s in zip(idx, a, x.shape)), valid
  if n.op is Ops.PAD:
    out, v = [], list(valid)
    for i, (b, _), s in zip(idx, a, x.shape):
      j = i - b
      if j.vmin < 0 or j.vmax >= s: v.append(Bound(j, 0, s))
      out.append(j)
    return tuple(out), tuple(v)
  raise CallsatError(f"not a movement op: {n.op}")

def _valid_possible(valid: tuple) -> bool:
  return all(b.idx.vmax >= b.lo and b.idx.vmin < b.hi for b in valid)

# ---------------------------------------------------------------------------------------------------------------------
# fusion cap

def _unview(n: Node) -> Node:
  """n below its movement and identity ops."""
  while n.op in GroupOp.Movement or n.op in IDENTITY: n = n.src[0]
  return n

def _realize_set(order: list, cap: int) -> set:
  """Nodes of a value graph (`order`: its toposort) realized to keep every kernel's expression under `cap` nodes."""
  size, realize = {}, set()
  for n in order:
    if n.op in (Ops.PARAM, Ops.BUFFER, Ops.CONST, Ops.STORE, Ops.CALL, Ops.SINK) or not n.src: size[n.id] = 1; continue
    if n.op in GroupOp.Movement or n.op in IDENTITY or n.op in (Ops.AFTER, Ops.SLICE, Ops.MULTI):
      size[n.id] = size[n.src[0].id]; continue
    kids = list({s.id: s for s in n.src}.values())
    s = 1 + sum(size[k.id] for k in kids)
    while s > cap:
      k = max(kids, key=lambda k: size[k.id])
      if size[k.id] <= 1: break
      b = _unview(k)
      realize.add(b.id)
      s -= size[k.id] - 1
      size[k.id] = size[b.id] = 1
    size[n.id] = s
  return realize

def _nested_reduces(order: list) -> set:
  """What a reduce's body would recompute, realized so that it runs once on its own (parallel, maybe tiled) domain:
  a big REDUCE (NESTED_REDUCE_WORK inputs or more) below another REDUCE, and a computed value broadcast (EXPAND to
  NESTED_REDUCE_WORK elements or more) inside a reduce's body. Fused, softmax(a @ b) computed the matmul inside the
  max, the sum and the division (3 times, untiled, ~100x slower each), (a @ b).sum() ran the matmul on the sum's
  1-element domain, and layernorm(x) @ w recomputed the layernorm for every output column (and was not tiled). A big
  REDUCE under elementwise ops is realized as well: (a @ b + 1).relu() fused was an untiled matmul (2.2 s at 1024^3).
  `order`: the value graph's toposort."""
  under: set = set()
  for n in reversed(order):                 # consumers first
    if n.op in (Ops.STORE, Ops.CALL): continue
    if n.op is Ops.REDUCE or n.id in under: under.update(s.id for s in n.src)
  big = lambda r: r.op is Ops.REDUCE and math.prod(r.src[0].shape) >= NESTED_REDUCE_WORK
  out = set()
  for n in order:
    if n.op in GroupOp.ALU:   # a big reduce under elementwise ops ((a @ b + 1).relu()): realized, it stays tileable
      out.update(c.id for c in map(_unview, n.src) if big(c))
    if n.id not in under or n.shape is None: continue
    if big(n): out.add(n.id)
    elif n.op is Ops.EXPAND and math.prod(n.shape) >= NESTED_REDUCE_WORK:
      c = _unview(n.src[0])
      if (c.op in GroupOp.ALU or c.op is Ops.REDUCE) and math.prod(c.shape) > 1: out.add(c.id)
  return out

SPLIT_REDUCE_WORK = 1 << 21   # a reduce of everything this big is split: P partial reduces, then one over them

def _split_full_reduce(n: Node) -> Node | None:
  """REDUCE of every axis of x (one output value) over SPLIT_REDUCE_WORK inputs or more, as partial reduces over P
  slices of x's first axis that P (256..16) divides, then one reduce over those (x's axis a split as (P, d/P): index
  arithmetic stays affine). Alone, the reduce is one kernel on a 1-element domain, one thread; the partial reduces
  are a kernel over P rows that splits across threads."""
  x = n.src[0]
  if isinstance(n.device, tuple) or x.shape is None or math.prod(n.shape) != 1 or math.prod(x.shape) < SPLIT_REDUCE_WORK: return None
  if set(n.arg[1]) != {a for a, d in enumerate(x.shape) if d != 1}: return None
  for a, d in enumerate(x.shape):
    if (P := next((p for p in (256, 128, 64, 32, 16) if d % p == 0 and d > p), None)) is not None: break
  else: return None
  shape = x.shape[:a] + (P, x.shape[a] // P) + x.shape[a + 1:]
  y = x.reshape(shape)
  if x.dtype == dtypes.float16 and n.arg[0] is not Ops.MAX: y = y.cast(dtypes.float32)   # partials kept in float32, as one reduce accumulates
  part = Node(Ops.REDUCE, None, (y,), (n.arg[0], tuple(i for i in range(len(shape)) if i != a)))
  return Node(Ops.REDUCE, None, (part,), (n.arg[0], tuple(range(len(shape))))).reshape(n.shape).cast(n.dtype)

def _realize_order(order: list, realize: set) -> list:
  """(node, reached-through-AFTER) for every realized node of the value graph whose toposort is `order`, children first."""
  if not realize: return []
  flags: dict = {order[-1].id: {False}}
  for n in reversed(order):
    fs = flags.get(n.id, set())
    for i, s in enumerate(n.src):
      if n.op in (Ops.STORE, Ops.CALL): continue
      flags.setdefault(s.id, set()).update({True} if n.op is Ops.AFTER and i == 0 else fs if n.op is not Ops.AFTER else set())
  return [(n, f) for n in order if n.id in realize for f in sorted(flags.get(n.id, ()))]

# ---------------------------------------------------------------------------------------------------------------------
# building kernels for one store group

@dataclass(frozen=True)
class _Temp:
  """A realized intermediate. On a tuple of devices every device holds its part (mem.on(d)): its shard along `axis`
  (shape is the shard's), or with axis None the whole value."""
  mem: Mem
  shape: tuple
  axis: int | None = None
  devs: tuple | None = None

class _Group:
  def __init__(self, ctx: _Ctx, bind: dict):
    self.ctx, self.bind = ctx, bind
    self.specs: list[Spec] = []
    self.finals: list[Spec] = []        # the STORE's own kernels, after every temporary
    self.temps: dict = {}               # (node id, after, axis) -> _Temp
    self.realize: set = set()
    self.kdev: tuple = (None, None, None)   # the kernel being built runs for: (device, device tuple, index in it)

  # one kernel: domain vars, a builder with CSE memo
  def kernel(self, shape: tuple, mem: Mem, store_idx_of, node: Node, after: bool, kind_hint: str = "e", kdev: tuple | None = None,
             lidx=None, dev: Idx | None = None, final: bool = False) -> None:
    """lidx: domain index -> the index of `node` it stores (a device's shard of a logical value); dev: the device of a
    per-device `node`."""
    if math.prod(shape) == 0: return
    saved, self.kdev = self.kdev, kdev or self.kdev
    try:
      domain = tuple(Var(f"i{d}", int(s)) for d, s in enumerate(shape))   # int(): a nested body keeps bound symbolic dims
      idx = tuple(Idx.var(v) for v in domain)
      b = _Builder(self, len(domain))
      val = b.value(node, lidx(idx) if lidx else idx, (), after, False, top=True, dev=dev)
      (self.finals if final else self.specs).append(Spec(domain, mem, store_idx_of(idx), val, "r" if b.reduces else kind_hint))
    finally: self.kdev = saved

  def temp_of(self, n: Node, after: bool, whole: bool = False) -> _Temp:
    """n realized into a temporary. A multi-device value is split along its shard axis (each device computes its shard),
    unless `whole` (its bytes are read as one array): then every device computes all of it."""
    devs = n.device if isinstance(n.device, tuple) else None
    a = None if devs is None or whole or is_shard(n) else self.ctx.axes.get(n.id)
    if a is not None and (n.shape[a] == 0 or n.shape[a] % len(devs)): a = None
    key = (n.id, after, a)
    if (t := self.temps.get(key)) is None:
      D = len(devs) if devs else 1
      shape = tuple(s // D if i == a else s for i, s in enumerate(n.shape))
      count, isz = math.prod(shape), n.dtype.itemsize
      root = self.ctx.temp(dtypes.uint8 if n.dtype == dtypes.bool else n.dtype, count).root
      t = self.temps[key] = _Temp(Mem(root, 0, n.dtype, count, -(-count * isz // 64) * 64 if devs else 0), shape, a, devs)
      for d in range(D):   # every device's part before any reader: a reader may read another device's part
        lidx = None if a is None else (lambda idx, o=d * shape[a]: idx[:a] + (idx[a] + o,) + idx[a + 1:])
        self.kernel(shape, t.mem.on(d), lambda idx: flat_index(idx, shape), n, after, kdev=(devs[d], devs, d) if devs else (n.device, None, None),
                    lidx=lidx, dev=Idx.const(d) if devs and is_shard(n) else None)
    return t

class _Builder:
  def __init__(self, g: _Group, depth: int):
    self.g, self.memo, self.reduces, self.nvars = g, {}, 0, depth

  def load(self, m: Mem, flat: Idx, valid: tuple, direct: bool, dtype: DType) -> Expr:
    if not _valid_possible(valid) or m.count == 0: return const(0, dtype)
    valid = tuple(b for b in valid if b.idx.vmin < b.lo or b.idx.vmax >= b.hi)
    return Expr('load', m.dtype, (), ((m, direct), flat, valid))

  def place(self, devs: tuple | None, m: Mem, dev: Idx | None) -> tuple[Mem, Idx]:
    """The Mem to load for device `dev` (None: the kernel's own device, else device 0) of per-device storage `m`, and
    the element offset to add. A device known only at run time reads every device's copy through one span."""
    if not m.dstride: return m, Idx.const(0)
    kname, kdevs, kd = self.g.kdev
    if dev is None: dev = Idx.const(kd if kdevs == devs else devs.index(kname) if kname in devs else 0)
    if dev.is_const and 0 <= dev.c < len(devs):
      if devs[dev.c] != kname: self.g.ctx.peers.add((kname, devs[dev.c]))
      return m.on(dev.c), Idx.const(0)
    if m.dstride % m.dtype.itemsize:
      raise UnsupportedOpError(f"LLVM backend: a read across devices of a {m.dtype.name} view whose per-device stride ({m.dstride} bytes) "
                               "is not a whole number of elements")
    self.g.ctx.peers.update((kname, x) for x in devs if x != kname)   # CPU:n share the host's memory: a direct read
    es = m.dstride // m.dtype.itemsize
    return Mem(m.root, m.off, m.dtype, es * (len(devs) - 1) + m.count), dev * es

  def temp(self, n: Node, idx: tuple, valid: tuple, after: bool, dev: Idx | None) -> Expr:
    t = self.g.temp_of(n, after)
    if t.axis is not None:   # a shard per device: the device is the index along the axis over the shard size
      a, S = t.axis, t.shape[t.axis]
      dev = idx[a] // S
      idx = idx[:a] + (idx[a] - dev * S if dev.is_const else idx[a] % S,) + idx[a + 1:]
    m, off = self.place(t.devs, t.mem, dev)
    return self.load(m, flat_index(idx, t.shape) + off, valid, False, n.dtype)

  def value(self, n: Node, idx: tuple, valid: tuple, after: bool, bcast: bool, top: bool = False, dev: Idx | None = None) -> Expr:
    """dev: the device a per-device value (egraph.ir.is_shard) is read on (set by MULTI; None: the kernel's own)."""
    key = (n.id, idx, valid, after, bcast, top, dev)
    if (e := self.memo.get(key)) is not None: return e
    e = self._value(n, idx, valid, after, bcast, top, dev)
    self.memo[key] = e
    return e

  def _value(self, n: Node, idx, valid, after, bcast, top, dev) -> Expr:
    op, g = n.op, self.g
    if op in UNSUPPORTED: raise UnsupportedOpError(f"LLVM backend: {op.name} is not supported yet (a later issue adds it)")
    if not _valid_possible(valid): return const(0, n.dtype)
    if n.id in g.realize and not top and op not in (Ops.PARAM, Ops.BUFFER, Ops.CONST):
      return self.temp(n, idx, valid, after, dev)
    if op is Ops.CONST: return const(n.arg[0], n.dtype)
    if op is Ops.AFTER: return self.value(n.src[0], idx, valid, True, bcast, dev=dev)
    if op is Ops.MULTI:   # the logical value of per-device shards: element i along the axis is on device i // shard size
      x, a = n.src[0], n.arg
      if (S := x.shape[a]) == 0: return const(0, n.dtype)
      d = idx[a] // S
      return self.value(x, idx[:a] + (idx[a] - d * S if d.is_const else idx[a] % S,) + idx[a + 1:], valid, after, bcast, dev=d)
    if op in IDENTITY:   # COPY between host devices (NPY, DISK memmaps, CPU) is a read of the source's storage
      return self.value(n.src[0], idx, valid, after, bcast, dev=None if op is Ops.COPY else dev)
    if op in GroupOp.Movement:
      cidx, cvalid = _through(n, idx, valid)
      widen = op is Ops.EXPAND and any(s == 1 and t > 1 for s, t in zip(n.src[0].shape, n.arg))
      v = self.value(n.src[0], cidx, cvalid, after, bcast or widen, dev=dev)
      if len(cvalid) > len(valid) and v.op != 'load' and not (v.op == 'const' and not v.arg):
        # PAD fills with zero: a computed (or constant) value is masked too, not only the loads under it
        v = Expr(Ops.WHERE, n.dtype, (Expr('valid', dtypes.bool, (), cvalid[len(valid):]), v, const(0, n.dtype)))
      return v
    if op in (Ops.PARAM, Ops.BUFFER, Ops.SLICE):
      m, aft = storage_mem(n, g.bind)
      devs = n.device
      if m is None:   # SLICE of computed data: realize it, then view the temporary's bytes
        x = n.src[0]
        t = g.temp_of(x, after, whole=True)
        m, devs = Mem(t.mem.root, t.mem.off + n.arg[0] * x.dtype.itemsize, n.dtype, n.arg[1], t.mem.dstride), t.devs
      m, off = self.place(devs, m, dev)
      return self.load(m, flat_index(idx, n.shape) + off, valid, not (after or aft), n.dtype)
    if op is Ops.BITCAST:
      x = n.src[0]
      if x.dtype.itemsize == n.dtype.itemsize:
        v = self.value(x, idx, valid, after, bcast)
        return Expr(Ops.CAST if dtypes.bool in (x.dtype, n.dtype) else Ops.BITCAST, n.dtype, (v,))
      m, aft = storage_mem(x, g.bind)
      devs = x.device
      if m is None:
        t = g.temp_of(x, after, whole=True)
        m, aft, devs = t.mem, False, t.devs
      m, off = self.place(devs, Mem(m.root, m.off, n.dtype, n.numel, m.dstride), None)
      return self.load(m, flat_index(idx, n.shape) + off, valid, not (after or aft), n.dtype)
    if op is Ops.CAST:
      v = self.value(n.src[0], idx, valid, after, bcast)
      return v if n.src[0].dtype == n.dtype else Expr(Ops.CAST, n.dtype, (v,))
    if op in GroupOp.ALU:
      srcs = []
      for s in n.src: srcs.append(self.value(s, idx, valid, after, bcast))
      return Expr(op, n.dtype, tuple(srcs))
    if op is Ops.REDUCE:
      if bcast and not top: return self.temp(n, idx, valid, after, dev)
      if (split := _split_full_reduce(n)) is not None:   # a big reduce to one value: partial sums first, in parallel
        g.realize.add(split.src[0].src[0].id)
        return self.value(split, idx, valid, after, bcast, top, dev)
      rop, axes = n.arg
      x = n.src[0]
      rvars, cidx = [], list(idx)
      for a in sorted(set(axes)):
        if x.shape[a] == 1: continue
        v = Var(f"r{self.nvars}", int(x.shape[a])); self.nvars += 1
        rvars.append(v); cidx[a] = Idx.var(v) if v.size > 1 else Idx.const(0)
      body = self.value(x, tuple(cidx), valid, after, bcast)
      if not rvars: return body
      self.reduces += 1
      acc = dtypes.float32 if n.dtype == dtypes.float16 and rop is not Ops.MAX else n.dtype
      if acc != n.dtype: body = Expr(Ops.CAST, acc, (body,))
      r = Expr('reduce', acc, (body,), (rop, tuple(rvars)))
      return r if acc == n.dtype else Expr(Ops.CAST, n.dtype, (r,))
    if op in (Ops.STORE, Ops.CALL, Ops.SINK): raise CallsatError(f"LLVM backend: {op.name} used as a value")
    raise UnsupportedOpError(f"LLVM backend: {op.name} is not supported")

# ---------------------------------------------------------------------------------------------------------------------
# targets

WRITABLE = frozenset({Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP})

def _target(t: Node, bind: dict):
  """(Mem, idx -> flat Idx) of a STORE target: a movement view (RESHAPE/SHRINK/PERMUTE/FLIP) of AFTER/SLICE/PARAM."""
  chain, n = [], t
  while True:
    m, _ = storage_mem(n, bind)
    if m is not None: break
    if n.op in WRITABLE or n.op in (Ops.AFTER, Ops.DETACH): chain.append(n); n = n.src[0]; continue
    raise CallsatError(f"STORE: the target goes through {n.op.name} {n.shape}, which is not a writable view of storage")
  base = n
  def index(idx):
    # lower/reference.py refuses a RESHAPE of a non-contiguous view in a target (numpy would copy); the index arithmetic
    # here writes the elements that view names either way
    for c in chain:
      if c.op not in (Ops.AFTER, Ops.DETACH): idx, _ = _through(c, idx, ())
    return flat_index(idx, base.shape)
  return m, index

def _targets(t: Node, bind: dict) -> list:
  """(Mem, store index, domain shape, kernel device, value index) for each kernel a STORE into `t` needs: one per
  device of a multi-device target (its shard of a MULTI, or its copy of per-device storage), else one."""
  devs = t.device
  if not isinstance(devs, tuple):
    m, index = _target(t, bind)
    return [(m, index, t.shape, (devs, None, None), None)]
  m = t
  while m.op in (Ops.AFTER, Ops.DETACH): m = m.src[0]   # an earlier write's AFTER: the same storage
  if m.op is Ops.MULTI:   # device d writes its shard: the logical value at the shard's indices
    x, a = m.src[0], m.arg
    m, index = _target(x, bind)
    def shifted(d):
      return lambda idx: idx[:a] + (idx[a] + d * x.shape[a],) + idx[a + 1:]
    return [(m.on(d), index, x.shape, (dv, devs, d), shifted(d)) for d, dv in enumerate(devs)]
  if not is_shard(t):
    ops, n = [], t
    while n.src and n.op is not Ops.MULTI: ops.append(n.op.name); n = n.src[0]
    raise UnsupportedOpError(f"LLVM backend: a STORE through {'/'.join(ops)} into {n.op.name} on {devs} is not supported "
                             "(only into a whole MULTI or into per-device storage)")
  m, index = _target(t, bind)   # per-device storage: every device gets the value (a replicated value: a copy each)
  return [(m.on(d), index, t.shape, (dv, devs, d), None) for d, dv in enumerate(devs)]

# ---------------------------------------------------------------------------------------------------------------------
# the schedule

@dataclass
class _GroupPlan:
  specs: list | None            # kernels of a STORE group (None for a nested call)
  steps: list | None            # finalized steps of a nested call
  writes: list                  # Mems
  ra: list                      # Mems read through AFTER (state at run time)
  rd: list                      # Mems read directly (state before the CALL's writes)

def _iter_exprs(e: Expr):
  """Every node of the Expr DAG `e` once."""
  return e.walk()

def _effects(body: Node) -> list[Node]:
  from lower.reference import _schedule
  return [n for n in _schedule([body]) if n.op in (Ops.STORE, Ops.CALL)]

def _call_group(call: Node, bind: dict, ctx: _Ctx) -> _GroupPlan:
  """A nested CALL as one group: its program with PARAM(i) bound to argument i's storage. An argument that is a
  contiguous view of storage (through AFTERs: the storage after their writes) binds to it; any other (a strided view,
  a MULTI's logical value, computed data) is first copied into a temporary, read at the time the call runs."""
  g, inner, copied = _Group(ctx, bind), {}, {}
  for i, a in enumerate(call.src[1:]):
    if (m := view_mem(a, bind)) is None:
      order = toposort([a], enter_calls=False)
      g.realize |= _realize_set(order, FUSE_CAP)
      for n, _ in _realize_order(order, g.realize): g.temp_of(n, True)
      m = g.temp_of(a, True, whole=True).mem
      copied[i] = a
    inner[i] = m
  prog = schedule(call.src[0], inner, ctx)
  for i, a in copied.items():
    if inner[i].root in prog.written:
      raise UnsupportedOpError(f"LLVM backend: a nested CALL writes its argument {i}, which is {a.op.name} {a.shape}, not a contiguous view of storage")
  steps = [st for s in g.specs for st in _finalize(s, {}, ctx)] + prog.steps
  reads = [m for s in steps for m in (s.mems[:1] if s.kernel is None else s.mems)]
  writes = [m for s in steps if s.kernel is not None for m in s.mems[s.kernel.store.param:s.kernel.store.param + 1]]
  return _GroupPlan(None, steps, writes, reads, [])

def _store_group(eff: Node, bind: dict, ctx: _Ctx) -> _GroupPlan:
  tgt, val = eff.src
  outs = _targets(tgt, bind)
  g = _Group(ctx, bind)
  order = toposort([val], enter_calls=False)   # one walk of the value serves the three passes below
  g.realize = _realize_set(order, FUSE_CAP) | _nested_reduces(order)
  for n, after in _realize_order(order, g.realize): g.temp_of(n, after)   # children first: bounded recursion
  for m, index, shape, kdev, lidx in outs: g.kernel(shape, m, index, val, False, kdev=kdev, lidx=lidx, final=True)
  specs = g.specs + _apart(g.finals, ctx)
  keys = [x.arg[0] for s in specs for x in _iter_exprs(s.value) if x.op == 'load']
  return _GroupPlan(specs, None, [o[0] for o in outs if math.prod(o[2])],
                    [k[0] for k in keys if not k[1] and k[0].root[0] != "tmp"],
                    [k[0] for k in keys if k[1] and k[0].root[0] != "tmp"])

def _apart(specs: list, ctx: _Ctx) -> list:
  """The per-device kernels of one STORE run one after another: when one reads what another writes, each computes
  into a temporary first and the copies back come after all of them."""
  hit = any(k[0].overlaps(o.mem) for i, s in enumerate(specs) for k in (x.arg[0] for x in _iter_exprs(s.value) if x.op == 'load') for j, o in enumerate(specs) if i != j)
  if not hit: return specs
  pairs = [_via_temp(s, ctx) for s in specs]
  return [p[0] for p in pairs] + [p[1] for p in pairs]

def _via_temp(s: Spec, ctx: _Ctx) -> tuple[Spec, Spec]:
  """`s` as (compute into a temporary, copy it to s's target)."""
  t = ctx.temp(s.mem.dtype, math.prod(v.size for v in s.domain))
  first = Spec(s.domain, t, flat_index(tuple(Idx.var(v) for v in s.domain), tuple(v.size for v in s.domain)), s.value, s.kind)
  return first, Spec(s.domain, s.mem, s.idx, Expr('load', t.dtype, (), ((t, False), first.idx, ())), "c")

def schedule(body: Node, bind: dict, ctx: _Ctx | None = None) -> Program:
  """Kernels for the SINK `body` with PARAM(slot) bound to bind[slot] (a Mem)."""
  ctx = ctx or _Ctx()
  if sys.getrecursionlimit() < 20000: sys.setrecursionlimit(20000)   # value building recurses up to ~FUSE_CAP deep
  from lower.inline import inline_functions   # plain FUNCTIONs are inlined; precompiled ones are nested CALLs
  body = inline_functions(body)
  multi = False
  for n in toposort([body], enter_calls=False):
    if n.op in UNSUPPORTED: raise UnsupportedOpError(f"LLVM backend: {n.op.name} is not supported yet (a later issue adds it)")
    multi = multi or isinstance(n.device, tuple)
  if multi: ctx.axes.update(shard_axes([body]))   # how multi-device temporaries are split
  groups = [_call_group(eff, bind, ctx) if eff.op is Ops.CALL else _store_group(eff, bind, ctx) for eff in _effects(body)]
  order, snaps = _order(groups)
  steps, snap_mem = [], {}
  for gi, ms in snaps.items():
    for m in ms:
      if m not in snap_mem:
        t = ctx.temp(dtypes.uint8, m.nbytes)
        snap_mem[m] = Mem(t.root, 0, m.dtype, m.count)
        steps.append(Step(None, (m, snap_mem[m])))
  for gi in order:
    gp = groups[gi]
    if gp.steps is not None: steps.extend(gp.steps); continue
    redirect = {m: snap_mem[m] for m in snaps.get(gi, ())}
    for s in gp.specs: steps.extend(_finalize(s, redirect, ctx))
  temps = {}
  for s in steps:
    for m in s.mems:
      if m.root[0] == "tmp": temps[m.root] = max(temps.get(m.root, 0), m.off + m.nbytes)
  written = {s.mems[s.kernel.store.param].root for s in steps if s.kernel is not None}
  return Program(steps, temps, written, set(ctx.peers))

def _order(groups: list) -> tuple[list, dict]:
  """A topological order of the groups and, per group, the Mems its direct reads must take from a snapshot."""
  n = len(groups)
  succ = [set() for _ in range(n)]
  def ov(xs, ys): return any(x.overlaps(y) for x in xs for y in ys)
  for i in range(n):
    for j in range(i + 1, n):
      a, b = groups[i], groups[j]
      if ov(a.writes, b.writes) or ov(a.writes, b.ra) or ov(a.ra, b.writes): succ[i].add(j)
  def reaches(s, t):
    seen, stack = {s}, [s]
    while stack:
      x = stack.pop()
      if x == t: return True
      for y in succ[x]:
        if y not in seen: seen.add(y); stack.append(y)
    return False
  snaps: dict = {}
  for k in range(n):
    for m in groups[k].rd:
      writers = [w for w in range(n) if w != k and ov(groups[w].writes, [m])]
      if any(reaches(w, k) for w in writers): snaps.setdefault(k, []).append(m); continue
      for w in writers: succ[k].add(w)
  indeg = [0] * n
  for i in range(n):
    for j in succ[i]: indeg[j] += 1
  import heapq
  ready = [i for i in range(n) if indeg[i] == 0]
  heapq.heapify(ready)
  out = []
  while ready:
    i = heapq.heappop(ready); out.append(i)
    for j in succ[i]:
      indeg[j] -= 1
      if indeg[j] == 0: heapq.heappush(ready, j)
  assert len(out) == n, "cycle in the kernel order"
  return out, snaps

# ---------------------------------------------------------------------------------------------------------------------
# finalizing: memory -> params, intra-kernel overlap, matmul detection

def _rebuild(e: Expr, leaf) -> Expr:
  """`e` with every 'load' and 'valid' node x replaced by leaf(x); a node above them is rebuilt only where a source
  changed, and shared nodes stay shared (iteratively: chains can be long)."""
  memo: dict = {}
  stack = [(e, False)]
  while stack:
    x, done = stack.pop()
    if id(x) in memo: continue
    if not done:
      stack.append((x, True)); stack.extend((s, False) for s in x.src if id(s) not in memo); continue
    if x.op in ('load', 'valid'): memo[id(x)] = leaf(x)
    else:
      src = tuple(memo[id(s)] for s in x.src)
      memo[id(x)] = x if all(a is b for a, b in zip(src, x.src)) else Expr(x.op, x.dtype, src, x.arg)
  return memo[id(e)]

def _finalize(s: Spec, redirect: dict, ctx: _Ctx) -> list[Step]:
  resolve = lambda k: redirect.get(k[0], k[0]) if k[1] else k[0]
  loads = [(resolve(e.arg[0]), e.arg[1], e.arg[2]) for e in _iter_exprs(s.value) if e.op == 'load']
  unsafe = any(m.overlaps(s.mem) and (m != s.mem or i != s.idx) for m, i, v in loads)
  if unsafe:   # the value reads its own target elsewhere: compute into a temporary, then copy back
    first, copy = _via_temp(s, ctx)
    return _finalize(first, redirect, ctx) + _finalize(copy, {}, ctx)
  mems: list[Mem] = [s.mem]
  for m, _, _ in loads:
    if m not in mems: mems.append(m)
  pidx = {m: i for i, m in enumerate(mems)}
  read = {m for m, _, _ in loads}
  def leaf(x: Expr) -> Expr:   # a load's (Mem, direct) key becomes its param number; 'valid' masks stay
    return Expr('load', x.dtype, (), (pidx[resolve(x.arg[0])], x.arg[1], x.arg[2])) if x.op == 'load' else x
  value = _rebuild(s.value, leaf)
  params = []
  for i, m in enumerate(mems):
    noalias = not any(m.overlaps(o) for j, o in enumerate(mems) if j != i)
    align = m.dtype.itemsize if m.off % m.dtype.itemsize == 0 else 1
    params.append(Param(f"p{i}", m.dtype, m.count, align, noalias, readonly=i != 0, writeonly=i == 0 and m not in read))
  shape = "_".join(str(v.size) for v in s.domain) or "0"
  k = Kernel(f"{s.kind}_{shape}", tuple(params), s.domain, Store(0, s.idx, value))
  k = _detect_matmul(k)
  if not k.tile: k = _stream(_collapse(k))
  work = math.prod(v.size for v in s.domain) * max(1, value.count()) * _reduce_size(value)
  return [Step(k, tuple(mems), work)]

def _reduce_size(e: Expr) -> int:
  best, seen, stack = 1, set(), [(e, 1)]
  while stack:
    x, mult = stack.pop()
    if (id(x), mult) in seen: continue
    seen.add((id(x), mult))
    if x.op == 'reduce': mult *= math.prod(v.size for v in x.arg[1])
    best = max(best, mult)
    stack.extend((c, mult) for c in x.src)
  return best

def _detect_matmul(k: Kernel) -> Kernel:
  """C[i, j] = sum_k A[i, k] * B[k, j] in float32 with unit stride along j in C: mark it for register tiling (B with
  another column stride, e.g. transposed as in q @ k.T, is packed by a gathering helper)."""
  live = [v for v in k.domain if v.size > 1]
  e = k.store.value
  if len(live) not in (2, 3) or e.op != 'reduce' or e.arg[0] is not Ops.ADD or len(e.arg[1]) != 1 or e.dtype != dtypes.float32: return k
  if live[0] is not k.domain[0] and k.domain[0].size != 1: return k
  mul = e.src[0]
  if mul.op is not Ops.MUL or any(x.op != 'load' or x.arg[2] for x in mul.src): return k
  bv = live[0] if len(live) == 3 else None   # a batch (bmm): one C[i, j] plane per index, A, B and C offset by it
  i, j, kv = live[-2], live[-1], e.arg[1][0]
  if bv is not None:
    if k.domain[1:3] != (i, j) or any(x.arg[1].coef(bv) is None for x in mul.src) or k.store.idx.coef(bv) is None: return k
    if mul.src[0].arg[0] == mul.src[1].arg[0] and mul.src[0].arg[1].coef(bv) != mul.src[1].arg[1].coef(bv): return k
  a, b = mul.src
  def aff(ix: Idx, v): return ix.coef(v)
  if aff(a.arg[1], j) != 0: a, b = b, a
  A, B, C = a.arg[1], b.arg[1], k.store.idx
  if any(x is None for x in (aff(A, i), aff(A, kv), aff(B, kv), aff(B, j), aff(C, i), aff(C, j))): return k
  if A.coef(j) != 0 or B.coef(i) != 0 or B.coef(j) == 0 or C.coef(j) != 1 or C.coef(kv) != 0: return k
  if any(not (isinstance(t, Var)) for x in (A, B, C) for t, _ in x.terms): return k
  if any(t not in (i, j, kv, bv) for x in (A, B, C) for t, _ in x.terms): return k
  if j.size < 32 or i.size < 8 or kv.size < 4 or (bv is None and k.domain[0] is not i): return k
  return Kernel(k.name.replace("r_", "mm_", 1), k.params, k.domain, k.store, ("matmul", 8, 32),
                (a.arg[0], A, b.arg[0], B, i, j, kv), k.checked)

# ---------------------------------------------------------------------------------------------------------------------
# axis collapsing and streaming stores

def _kernel_idxs(k: Kernel) -> list:
  out = [k.store.idx]
  for x in _iter_exprs(k.store.value):
    if x.op == 'load': out.append(x.arg[1]); out.extend(b.idx for b in x.arg[2])
    elif x.op == 'valid': out.extend(b.idx for b in x.arg)
  return out

def _flat_in(ix: Idx, o: Var, i: Var) -> bool:
  """`ix` uses (o, i) only as the flat o*size(i) + i (times a constant), at every level of Div/Mod nesting."""
  co = ci = 0
  for a, c in ix.terms:
    if a == o: co = c
    elif a == i: ci = c
    elif not isinstance(a, Var) and not _flat_in(a.x, o, i): return False
  return co == ci * i.size

def _subst_expr(e: Expr, m: dict) -> Expr:
  def bounds(valid): return tuple(Bound(b.idx.subst(m), b.lo, b.hi) for b in valid)
  def leaf(x: Expr) -> Expr:
    if x.op == 'valid': return Expr('valid', x.dtype, (), bounds(x.arg))
    p, ix, valid = x.arg
    return Expr('load', x.dtype, (), (p, ix.subst(m), bounds(valid)))
  return _rebuild(e, leaf)

def _collapse(k: Kernel) -> Kernel:
  """Merge adjacent live domain axes that every index uses as one flat index (outermost pairs first)."""
  while True:
    live = [v for v in k.domain if v.size > 1]
    if len(live) < 2: return k
    idxs = _kernel_idxs(k)
    for o, i in zip(live, live[1:]):
      if all(_flat_in(ix, o, i) for ix in idxs): break
    else: return k
    f = Var(o.name, o.size * i.size)
    m = {o: Idx.const(0), i: Idx(((f, 1),), 0)}
    dom = tuple(f if v == o else v for v in k.domain if v != i)
    if k.domain[0].size == 1 and o is not k.domain[0]: dom = tuple(v for v in dom if v.size > 1) or dom
    k = Kernel(k.name, k.params, dom, Store(k.store.param, k.store.idx.subst(m), _subst_expr(k.store.value, m)),
               k.tile, k.matmul, k.checked, k.stream)

def _stream(k: Kernel) -> Kernel:
  if not k.domain or any(v.size > 1 for v in k.domain[1:]): return k
  p, v = k.params[k.store.param], k.domain[0]
  if not (p.writeonly and p.noalias and p.align == p.dtype.itemsize) or p.size * p.dtype.itemsize < STREAM_MIN_BYTES: return k
  if k.store.idx.terms != ((v, 1),): return k
  if any(x.op == 'reduce' for x in _iter_exprs(k.store.value)): return k
  return Kernel(k.name, k.params, k.domain, k.store, k.tile, k.matmul, k.checked, True)

def arg_binding(call: Node) -> tuple[dict, list[Node]]:
  """PARAM slot -> Mem with canonical roots ('arg', j) (j: first argument on the same BUFFER), and the BUFFER nodes:
  how every backend binds a CALL's arguments."""
  bufs, canon, bind = [], {}, {}
  for i, a in enumerate(call.src[1:]):
    b = a if a.op is Ops.BUFFER else a.src[0]
    if b.arg.uid not in canon: canon[b.arg.uid] = len(bufs); bufs.append(b)
    off = 0 if a.op is Ops.BUFFER else a.arg[0] * b.dtype.itemsize
    bind[i] = Mem(("arg", canon[b.arg.uid]), off, a.dtype, a.numel, _dstride(b))
  return bind, bufs
