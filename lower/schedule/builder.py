"""The kernel builder: one STORE's value (or a realized intermediate) as a kernel-IR Expr over its target's domain,
movement ops turned into index arithmetic, realized nodes read from temporaries (Group), multi-device values placed
per device; and the kernels a STORE target needs (targets)."""
from __future__ import annotations
import math
from dataclasses import dataclass
from egraph.ir.dtype import DType, dtypes
from egraph.ir.errors import CallsatError, UnsupportedOpError
from egraph.ir.ops import Node, Ops, GroupOp, is_shard
from egraph.fusion.policy import IDENTITY
from lower.schedule.kernel import Idx, Var, Bound, Expr, const, flat_index, unflatten, within
from lower.schedule.mem import Ctx, Mem, Spec, storage_mem
from lower.schedule import decomp

UNSUPPORTED = {Ops.FUNCTION: "FUNCTION", Ops.TUPLE: "TUPLE", Ops.GETTUPLE: "GETTUPLE", Ops.BIND: "BIND"}
HALF = (dtypes.float16, dtypes.bfloat16)

def _acc_dtype(dt: DType, rop) -> DType:
  """What a reduce of `dt` accumulates in: halves' sums and products in float32, fp8 always (it has no -inf for max)."""
  return dtypes.float32 if dt in dtypes.fp8s or (dt in HALF and rop is not Ops.MAX) else dt

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

def _invariant(body: Expr, rvars: list) -> tuple:
  """The vars of `rvars` that no index or PAD mask in `body` uses (the body's value does not change along them)."""
  used: set = set()
  for x in body.walk():
    if x.op == 'load': used |= x.arg[1].vars(); used.update(v for b in x.arg[2] for v in b.idx.vars())
    elif x.op == 'valid': used.update(v for b in x.arg for v in b.idx.vars())
  return tuple(v for v in rvars if v not in used)

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
  if _acc_dtype(x.dtype, n.arg[0]) != x.dtype: y = y.cast(dtypes.float32)   # partials kept in float32, as one reduce accumulates
  part = Node(Ops.REDUCE, None, (y,), (n.arg[0], tuple(i for i in range(len(shape)) if i != a)))
  return Node(Ops.REDUCE, None, (part,), (n.arg[0], tuple(range(len(shape))))).reshape(n.shape).cast(n.dtype)

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

class Group:
  def __init__(self, ctx: Ctx, bind: dict):
    self.ctx, self.bind = ctx, bind
    self.specs: list[Spec] = []
    self.finals: list[Spec] = []        # the STORE's own kernels, after every temporary
    self.realize: set = set()
    self.split_broadcast_reduces = True   # a REDUCE under a broadcast gets its own kernel (off for fusion="cost": kernelize)
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
    if (t := self.ctx.realized.get(key)) is None:   # any group's temporary is read, not computed again (kernelize orders them)
      D = len(devs) if devs else 1
      shape = tuple(s // D if i == a else s for i, s in enumerate(n.shape))
      count, isz = math.prod(shape), n.dtype.itemsize
      root = self.ctx.temp(dtypes.uint8 if n.dtype == dtypes.bool else n.dtype, count).root
      t = self.ctx.realized[key] = _Temp(Mem(root, 0, n.dtype, count, -(-count * isz // 64) * 64 if devs else 0), shape, a, devs)
      for d in range(D):   # every device's part before any reader: a reader may read another device's part
        lidx = None if a is None else (lambda idx, o=d * shape[a]: idx[:a] + (idx[a] + o,) + idx[a + 1:])
        self.kernel(shape, t.mem.on(d), lambda idx: flat_index(idx, shape), n, after, kdev=(devs[d], devs, d) if devs else (n.device, None, None),
                    lidx=lidx, dev=Idx.const(d) if devs and is_shard(n) else None)
      self.ctx.realized_ids.add(n.id)
    return t

class _Builder:
  def __init__(self, g: Group, depth: int):
    self.g, self.memo, self.reduces, self.nvars = g, {}, 0, depth

  def load(self, m: Mem, flat: Idx, valid: tuple, direct: bool, dtype: DType) -> Expr:
    if not _valid_possible(valid) or m.count == 0: return const(0, dtype)
    valid = tuple(b for b in valid if b.idx.vmin < b.lo or b.idx.vmax >= b.hi)
    return Expr('load', m.dtype, (), ((m, direct), within(flat, valid), valid))

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
      raise UnsupportedOpError(f"lowering: a read across devices of a {m.dtype.name} view whose per-device stride ({m.dstride} bytes) "
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
    """dev: the device a per-device value (egraph.ir.ops.is_shard) is read on (set by MULTI; None: the kernel's own)."""
    key = (n.id, idx, valid, after, bcast, top, dev)
    if (e := self.memo.get(key)) is not None: return e
    e = self._value(n, idx, valid, after, bcast, top, dev)
    self.memo[key] = e
    return e

  def _value(self, n: Node, idx, valid, after, bcast, top, dev) -> Expr:
    op, g = n.op, self.g
    if op in UNSUPPORTED: raise UnsupportedOpError(f"lowering: {op.name} is not supported yet (a later issue adds it)")
    if not _valid_possible(valid): return const(0, n.dtype)
    if (n.id in g.realize or n.id in g.ctx.realized_ids) and not top and op not in (Ops.PARAM, Ops.BUFFER, Ops.CONST):
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
    if op in GroupOp.Movement: return self.movement(n, idx, valid, after, bcast, dev)
    if op in (Ops.PARAM, Ops.BUFFER, Ops.SLICE): return self.storage(n, idx, valid, after, dev)
    if op is Ops.BITCAST: return self.bitcast(n, idx, valid, after, bcast)
    if op is Ops.CAST:
      v = self.value(n.src[0], idx, valid, after, bcast)
      return v if n.src[0].dtype == n.dtype else Expr(Ops.CAST, n.dtype, (v,))
    if op in GroupOp.ALU:
      srcs = []
      for s in n.src: srcs.append(self.value(s, idx, valid, after, bcast))
      return decomp.alu(op, n.dtype, tuple(srcs))
    if op is Ops.REDUCE:
      if bcast and not top and g.split_broadcast_reduces: return self.temp(n, idx, valid, after, dev)
      if (split := _split_full_reduce(n)) is not None:   # a big reduce to one value: partial sums first, in parallel
        g.realize.add(split.src[0].src[0].id)
        return self.value(split, idx, valid, after, bcast, top, dev)
      return self.reduce(n, idx, valid, after, bcast)
    if op in (Ops.STORE, Ops.CALL, Ops.SINK): raise CallsatError(f"lowering: {op.name} used as a value")
    raise UnsupportedOpError(f"lowering: {op.name} is not supported")

  def movement(self, n: Node, idx, valid, after, bcast, dev) -> Expr:
    """A movement op: index arithmetic into its source (an EXPAND that widens marks the source broadcast)."""
    cidx, cvalid = _through(n, idx, valid)
    widen = n.op is Ops.EXPAND and any(s == 1 and t > 1 for s, t in zip(n.src[0].shape, n.arg))
    v = self.value(n.src[0], cidx, cvalid, after, bcast or widen, dev=dev)
    if len(cvalid) > len(valid) and v.op != 'load' and not (v.op == 'const' and not v.arg):
      # PAD fills with zero: a computed (or constant) value is masked too, not only the loads under it
      v = Expr(Ops.WHERE, n.dtype, (Expr('valid', dtypes.bool, (), cvalid[len(valid):]), v, const(0, n.dtype)))
    return v

  def storage(self, n: Node, idx, valid, after, dev) -> Expr:
    """A load of PARAM/BUFFER/SLICE storage (a SLICE of computed data reads its realized temporary's bytes)."""
    m, aft = storage_mem(n, self.g.bind)
    devs = n.device
    if m is None:   # SLICE of computed data: realize it, then view the temporary's bytes
      x = n.src[0]
      t = self.g.temp_of(x, after, whole=True)
      m, devs = Mem(t.mem.root, t.mem.off + n.arg[0] * x.dtype.itemsize, n.dtype, n.arg[1], t.mem.dstride), t.devs
    m, off = self.place(devs, m, dev)
    return self.load(m, flat_index(idx, n.shape) + off, valid, not (after or aft), n.dtype)

  def bitcast(self, n: Node, idx, valid, after, bcast) -> Expr:
    """Same-size BITCAST is an op on the value; another size reads the source's storage (realized if computed) as n.dtype."""
    x = n.src[0]
    if x.dtype.itemsize == n.dtype.itemsize:
      v = self.value(x, idx, valid, after, bcast)
      if dtypes.bool not in (x.dtype, n.dtype): return Expr(Ops.BITCAST, n.dtype, (v,))
      # a bool is the byte 0 or 1: a cast to or from uint8, whose bits an fp8 then takes as they are
      u8 = dtypes.uint8
      if x.dtype in dtypes.fp8s: v = Expr(Ops.BITCAST, u8, (v,))
      if n.dtype not in dtypes.fp8s: return Expr(Ops.CAST, n.dtype, (v,))
      return Expr(Ops.BITCAST, n.dtype, (Expr(Ops.CAST, u8, (v,)),))
    m, aft = storage_mem(x, self.g.bind)
    devs = x.device
    if m is None:
      t = self.g.temp_of(x, after, whole=True)
      m, aft, devs = t.mem, False, t.devs
    m, off = self.place(devs, Mem(m.root, m.off, n.dtype, n.numel, m.dstride), None)
    return self.load(m, flat_index(idx, n.shape) + off, valid, not (after or aft), n.dtype)

  def reduce(self, n: Node, idx, valid, after, bcast) -> Expr:
    """A REDUCE in place: a 'reduce' Expr over fresh vars for its (non-unit) axes; float16 and bfloat16 sums and
    products, and every fp8 reduce, accumulate in float32 (as lower/reference.py's). Axes a float sum or max does not vary along fold away."""
    rop, axes = n.arg
    x = n.src[0]
    rvars, cidx = [], list(idx)
    for a in sorted(set(axes)):
      if x.shape[a] == 1: continue
      v = Var(f"r{self.nvars}", int(x.shape[a])); self.nvars += 1
      rvars.append(v); cidx[a] = Idx.var(v) if v.size > 1 else Idx.const(0)
    body = self.value(x, tuple(cidx), valid, after, bcast)
    if not rvars: return body
    acc = _acc_dtype(n.dtype, rop)
    if acc != n.dtype: body = Expr(Ops.CAST, acc, (body,))
    # a float sum or max of a body that does not vary along some reduce vars folds them: n*c in float64, rounded once
    # (a sum of a 10^12-element constant tensor looped for 3 s and was 1.6 % off)
    dead = () if rop is Ops.MUL or not acc.is_float() or not all(v.size for v in rvars) else _invariant(body, rvars)
    rvars = [v for v in rvars if v not in dead]
    r = body
    if rvars:
      self.reduces += 1
      r = Expr('reduce', acc, (body,), (rop, tuple(rvars)))
    if dead and rop is Ops.ADD:
      w = r if acc == dtypes.float64 else Expr(Ops.CAST, dtypes.float64, (r,))
      w = Expr(Ops.MUL, dtypes.float64, (w, const(math.prod(v.size for v in dead), dtypes.float64)))
      r = w if acc == dtypes.float64 else Expr(Ops.CAST, acc, (w,))
    return r if acc == n.dtype else Expr(Ops.CAST, n.dtype, (r,))
# ---------------------------------------------------------------------------------------------------------------------
# targets

WRITABLE = frozenset({Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP})

def _target(t: Node, bind: dict):
  """(Mem, idx -> flat Idx) of a STORE target: a movement view (RESHAPE/SHRINK/PERMUTE/FLIP) of AFTER/SLICE/PARAM."""
  chain, n = [], t
  while True:
    m, _ = storage_mem(n, bind)
    if m is not None: break
    # a PAD/EXPAND in a target is one whose padded or broadcast elements are out of view (a[::2]); Tensor.assign and
    # encode.writable_chain refuse the others, so the validity _through returns is always true here
    if n.op in WRITABLE or n.op in (Ops.AFTER, Ops.DETACH, Ops.PAD, Ops.EXPAND): chain.append(n); n = n.src[0]; continue
    raise CallsatError(f"STORE: the target goes through {n.op.name} {n.shape}, which is not a writable view of storage")
  base = n
  def index(idx):
    # lower/reference.py refuses a RESHAPE of a non-contiguous view in a target (numpy would copy); the index arithmetic
    # here writes the elements that view names either way
    for c in chain:
      if c.op not in (Ops.AFTER, Ops.DETACH): idx, _ = _through(c, idx, ())
    return flat_index(idx, base.shape)
  return m, index

def _under_after(n: Node) -> Node:
  while n.op in (Ops.AFTER, Ops.DETACH): n = n.src[0]
  return n

def _window_targets(win: tuple, multi: Node, bind: dict) -> list:
  """targets of a STORE into a SHRINK window of a MULTI (an assign to a slice of a sharded value): device d writes the
  part of the window its shard holds, shard-local; a device whose shard the window misses gets no kernel."""
  x, a = multi.src[0], multi.arg
  m, index = _target(x, bind)
  size, (lo, hi) = x.shape[a], win[a]
  out = []
  for d, dv in enumerate(multi.device):
    s0, s1 = max(lo, d * size), min(hi, (d + 1) * size)
    if s0 >= s1: continue
    shape = tuple(s1 - s0 if i == a else e - b for i, (b, e) in enumerate(win))
    offs = tuple(s0 - d * size if i == a else b for i, (b, _) in enumerate(win))   # the kernel's index -> shard-local
    out.append((m.on(d), lambda idx, offs=offs: index(tuple(v + o for v, o in zip(idx, offs))), shape, (dv, multi.device, d),
                lambda idx, s0=s0: idx[:a] + (idx[a] + s0 - lo,) + idx[a + 1:]))   # ... -> the stored value's
  return out

def targets(t: Node, bind: dict) -> list:
  """(Mem, store index, domain shape, kernel device, value index) for each kernel a STORE into `t` needs: one per
  device of a multi-device target (its shard of a MULTI, or its copy of per-device storage), else one."""
  devs = t.device
  if not isinstance(devs, tuple):
    m, index = _target(t, bind)
    return [(m, index, t.shape, (devs, None, None), None)]
  m = _under_after(t)   # an earlier write's AFTER: the same storage
  if m.op is Ops.MULTI:   # device d writes its shard: the logical value at the shard's indices
    x, a = m.src[0], m.arg
    m, index = _target(x, bind)
    def shifted(d):
      return lambda idx: idx[:a] + (idx[a] + d * x.shape[a],) + idx[a + 1:]
    return [(m.on(d), index, x.shape, (dv, devs, d), shifted(d)) for d, dv in enumerate(devs)]
  if m.op is Ops.SHRINK and (w := _under_after(m.src[0])).op is Ops.MULTI and all(isinstance(v, int) for r in m.arg for v in r):
    return _window_targets(m.arg, w, bind)
  if not is_shard(t):
    ops, n = [], t
    while n.src and n.op is not Ops.MULTI: ops.append(n.op.name); n = n.src[0]
    raise UnsupportedOpError(f"lowering: a STORE through {'/'.join(ops)} into {n.op.name} on {devs} is not supported "
                             "(only into a whole MULTI or into per-device storage)")
  m, index = _target(t, bind)   # per-device storage: every device gets the value (a replicated value: a copy each)
  return [(m.on(d), index, t.shape, (dv, devs, d), None) for d, dv in enumerate(devs)]
