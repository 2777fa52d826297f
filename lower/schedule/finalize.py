"""Finalizing a kernel spec: its Mems become params (noalias, alignment, read/write-only), a value that reads its own
target elsewhere goes through a temporary, matmuls are marked for tiling, flat axes collapsed and large write-once
outputs marked for streaming stores."""
from __future__ import annotations
import collections, math
from dataclasses import replace
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Ops
from lower.schedule.kernel import Idx, Var, Bound, Expr, Param, Store, Kernel, flat_index
from lower.schedule.mem import Ctx, Mem, Spec, Step

STREAM_MIN_BYTES = 8 << 20   # outputs at least this large (4x a core's L2) get non-temporal stores (Kernel.stream)

def via_temp(s: Spec, ctx: Ctx) -> tuple[Spec, Spec]:
  """`s` as (compute into a temporary, copy it to s's target)."""
  t = ctx.temp(s.mem.dtype, math.prod(v.size for v in s.domain))
  first = Spec(s.domain, t, flat_index(tuple(Idx.var(v) for v in s.domain), tuple(v.size for v in s.domain)), s.value, s.kind)
  return first, Spec(s.domain, s.mem, s.idx, Expr('load', t.dtype, (), ((t, False), first.idx, ())), "c")

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

def finalize(s: Spec, redirect: dict, ctx: Ctx) -> list[Step]:
  if (packed := _packed(s, ctx)) is not None: return [st for p in packed for st in finalize(p, redirect, ctx)]
  resolve = lambda k: redirect.get(k[0], k[0]) if k[1] else k[0]
  loads = [(resolve(e.arg[0]), e.arg[1], e.arg[2]) for e in s.value.walk() if e.op == 'load']
  unsafe = any(m.overlaps(s.mem) and (m != s.mem or i != s.idx) for m, i, v in loads)
  if unsafe:   # the value reads its own target elsewhere: compute into a temporary, then copy back
    first, copy = via_temp(s, ctx)
    return finalize(first, redirect, ctx) + finalize(copy, {}, ctx)
  mems: list[Mem] = list(dict.fromkeys([s.mem] + [m for m, _, _ in loads]))   # the target first, then in order of first load
  pidx = {m: i for i, m in enumerate(mems)}
  read = {m for m, _, _ in loads}
  def leaf(x: Expr) -> Expr:   # a load's (Mem, direct) key becomes its param number; 'valid' masks stay
    return Expr('load', x.dtype, (), (pidx[resolve(x.arg[0])], x.arg[1], x.arg[2])) if x.op == 'load' else x
  value = _rebuild(s.value, leaf)
  params = []
  shared = {r for r, c in collections.Counter(m.root for m in mems).items() if c > 1}   # only Mems of one root overlap
  for i, m in enumerate(mems):
    noalias = m.root not in shared or not any(m.overlaps(o) for j, o in enumerate(mems) if j != i)
    align = m.dtype.itemsize if m.off % m.dtype.itemsize == 0 else 1
    params.append(Param(f"p{i}", m.dtype, m.count, align, noalias, readonly=i != 0, writeonly=i == 0 and m not in read))
  shape = "_".join(str(v.size) for v in s.domain) or "0"
  k = Kernel(f"{s.kind}_{shape}", tuple(params), s.domain, Store(0, s.idx, value))
  k = _detect_matmul(_collapse(_unit_lead(k)))   # collapsed first: a conv's spatial axes are one matmul column axis
  if not k.tile: k = _stream(k)
  work = math.prod(v.size for v in s.domain) * max(1, value.count()) * _reduce_size(value)
  return [Step(k, tuple(mems), work)]

# ---------------------------------------------------------------------------------------------------------------------
# packing a convolution's operands (im2col)

PACK_MIN_WORK = 1 << 15      # multiply-adds below which a product-sum keeps its plain nest
PACK_MAX_ELEMENTS = 1 << 24  # an operand's packed copy larger than this is not made

def _r_stride(ix: Idx, rvars: tuple) -> int | None:
  """The stride of the flat reduce index over `rvars` (C order) if `ix` reads along it (affine, proportional
  coefficients); None otherwise."""
  cs = [ix.coef(r) for r in rvars]
  if any(c is None for c in cs): return None
  step = 1
  for r, c in zip(reversed(rvars), reversed(cs)):
    if c != cs[-1] * step: return None
    step *= r.size
  return cs[-1]

def _flat_operand(e: Expr, rvars: tuple) -> bool:
  """A load that reads along the flat reduce index, with no mask over the reduce vars."""
  if e.op != 'load': return False
  _, ix, valid = e.arg
  return _r_stride(ix, rvars) is not None and not any(set(rvars) & b.idx.vars() for b in valid)

def _vars_of(e: Expr) -> set: return set().union(*(ix.vars() for ix in _expr_idxs(e)))

def _crossed(ops: tuple, live: list) -> bool:
  """Does each of the two operands read an output var the other does not (C[i, j] = sum_k A[i, k] B[k, j]: a matmul)?"""
  if len(ops) != 2: return False
  a, b = ({v for v in live if v in _vars_of(x)} for x in ops)
  return bool(a - b) and bool(b - a)

def _packed(s: Spec, ctx: Ctx) -> list[Spec] | None:
  """A float32 sum of products whose operands do not read along one flat reduce index (a convolution: its input read
  through the kernel window over several reduce vars, masked at the padding; or a product of computed operands over one
  reduce var shaped as a matmul): each such operand is first copied to a temporary laid out (its output vars, the
  reduce vars) — im2col — so the product-sum is over one reduce var k with plain strides: the tiled matmul when its
  shape allows, else a contiguous, vectorized dot product per output. None when the spec is not such a sum (or too
  small, or a copy would be too large)."""
  e = s.value
  if e.op != 'reduce' or e.arg[0] is not Ops.ADD or e.dtype != dtypes.float32 or e.src[0].op is not Ops.MUL: return None
  rvars = tuple(v for v in e.arg[1] if v.size > 1)
  ops = e.src[0].src
  live = [v for v in s.domain if v.size > 1]
  # one reduce var: plain strides already when every operand is a flat load; with no window (no load off the flat
  # index), computed operands stay fused in the plain nest (copying layernorm's (x - mean) twice made it 2x slower,
  # batch norm's variance 5x) unless the copies make a tiled matmul
  flat = [_flat_operand(x, rvars) for x in ops]
  if not rvars or len(rvars) == 1 and (all(flat) or all(f or x.op != 'load' for f, x in zip(flat, ops)) and not _crossed(ops, live)):
    return None
  if any(x.op == 'reduce' for o in ops for x in o.walk()): return None
  if math.prod(v.size for v in live) * math.prod(v.size for v in rvars) < PACK_MIN_WORK: return None
  k = Var(f"k{rvars[0].name}", math.prod(v.size for v in rvars))
  specs, new = [], []
  for x in ops:
    if _flat_operand(x, rvars): new.append(x); continue
    used = _vars_of(x)
    outs = tuple(v for v in live if v in used)
    dom = outs + rvars
    if (n := math.prod(v.size for v in dom)) > PACK_MAX_ELEMENTS: return None
    t = ctx.temp(x.dtype, n)
    specs.append(Spec(dom, t, flat_index(tuple(Idx.var(v) for v in dom), tuple(v.size for v in dom)), x, "c"))
    new.append(Expr('load', x.dtype, (), ((t, False), specs[-1].idx, ())))
  def along_k(x: Expr) -> Expr:   # the reduce vars' flat combination becomes k
    m, ix, valid = x.arg
    c = _r_stride(ix, rvars)
    rest = Idx(tuple((a, q) for a, q in ix.terms if a not in rvars), ix.c)
    return Expr('load', x.dtype, (), (m, rest + Idx(((k, c),), 0), valid))
  mul = Expr(Ops.MUL, e.src[0].dtype, tuple(along_k(x) for x in new), e.src[0].arg)
  return specs + [Spec(s.domain, s.mem, s.idx, Expr('reduce', e.dtype, (mul,), (Ops.ADD, (k,))), s.kind)]

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

def _expr_idxs(e: Expr) -> list:
  """Every index an Expr reads: its loads' and their masks', its 'valid' masks'."""
  out = []
  for x in e.walk():
    if x.op == 'load': out.append(x.arg[1]); out.extend(b.idx for b in x.arg[2])
    elif x.op == 'valid': out.extend(b.idx for b in x.arg)
  return out

def _kernel_idxs(k: Kernel) -> list: return [k.store.idx] + _expr_idxs(k.store.value)

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

def _unit_lead(k: Kernel) -> Kernel:
  """`k` without its size-1 domain vars (each is 0 throughout) when the first is one: a split across threads cuts the
  first domain var, so a leading 1 (a keepdim reduce's (1, n), a batch of one) kept the kernel on one thread."""
  if not k.domain or k.domain[0].size != 1 or all(v.size == 1 for v in k.domain): return k
  return _over(k, tuple(v for v in k.domain if v.size > 1), {v: Idx.const(0) for v in k.domain if v.size == 1})

def _over(k: Kernel, domain: tuple, m: dict) -> Kernel:
  """`k` over `domain`, each var of `m` replaced by its Idx in the store and the value."""
  return replace(k, domain=domain, store=Store(k.store.param, k.store.idx.subst(m), _subst_expr(k.store.value, m)))

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
    k = _over(k, tuple(f if v == o else v for v in k.domain if v != i), m)

def _stream(k: Kernel) -> Kernel:
  if not k.domain or any(v.size > 1 for v in k.domain[1:]): return k
  p, v = k.params[k.store.param], k.domain[0]
  if not (p.writeonly and p.noalias and p.align == p.dtype.itemsize) or p.size * p.dtype.itemsize < STREAM_MIN_BYTES: return k
  if k.store.idx.terms != ((v, 1),): return k
  if any(x.op == 'reduce' for x in k.store.value.walk()): return k
  return replace(k, stream=True)
