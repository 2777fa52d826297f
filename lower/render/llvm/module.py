"""Kernel IR -> LLVM IR text (one function per kernel): render_llvm picks the form; the pieces of a function are in
lower/render/llvm/function.py (its ALU ops and casts in lower/render/llvm/isel.py), the streaming renderers in lower/render/llvm/stream.py, the
tiled matmul in lower/render/llvm/matmul.py. Compiling is lower/device/compiler.py's, running lower/device/native.py's.

Every kernel is `void @name(ptr p0, ..., i64 start, i64 end[, ptr err])`: it runs the outermost domain axis over
[start, end), so one function serves one thread or a split across threads (ctypes releases the GIL). Loop counters and
accumulators are allocas in the entry block (SROA turns them into phis). Float reductions carry `reassoc nsz` (they do
not vectorize without it); elementwise float math has no fast-math flags, so it is bit-exact with numpy except where
LLVM's libm calls differ and for float32 exp2 and log2, which are callsat's own polynomials (Isel.exp2f/log2f: within
2 ulp, and they vectorize; a libm call does not). NaNs are kept (no `nnan`): MAX is llvm.maximum (NaN-propagating, as np.maximum).
`noalias` is claimed only for params the scheduler proved disjoint from every other param; alignment only as the
element size (numpy arrays are only 16-byte aligned). Kernels marked ("matmul", MR, NR) go to lower/render/llvm/matmul.py. A
column reduce (one reduce whose loads run along the innermost output var with unit stride and along the reduce with a
stride) accumulates COL_W columns per reduce step (col_reduce; a float32 sum adds COL_SUM_BLOCK steps at a time into
float64 totals); a transposing kernel walks TILE_T x TILE_T blocks (_transposing). A long float32 sum in the plain nest
is blocked by the renderer base (lower/render/base.py sum_blocks). Kernels marked `stream` get aligned non-temporal vector stores:
straight from explicit vector IR of the value when it
vectorizes that way (VecRenderer: no auto-vectorizer, ~half the compile time), else through a stack
block. Loops that hold hand-written vector code or scalar edges carry metadata that keeps the
vectorizer and unroller off them (compile time).

CHECK_BOUNDS=1: every load and store index is checked against its param's size; a violation stores (param + 1) into
the extra `err` out-param and returns; the runner raises BoundsError naming the kernel and the buffer.
"""
from __future__ import annotations
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Ops
from lower.schedule.kernel import Kernel, Expr, Var
from lower.render.llvm.function import LLVMRenderer, reduce_init, signature
from lower.render.llvm.isel import VT, MT
from lower.render.base import sum_blocks
from lower.render.llvm.stream import render_stream, streams
from lower.render.llvm.matmul import render_matmul

COL_SUM_BLOCK = 64   # reduce steps a float32 column sum adds into its float32 accumulators before the float64 totals
COL_W = 4096   # output columns a column reduce accumulates at once (16 KiB of float accumulators): each row is read
               # contiguously across them (256 columns per step measured 6.2-7.6 ms for a 4096^2 column sum, 4096: 4.7-4.9)

def col_reduce(k: Kernel):
  """(reduce, j) when the kernel's value holds one reduce whose loads run along the innermost output var j with unit
  stride and along the reduce with a larger one (x.sum(axis=0), a batch mean): rendered one reduce-step for COL_W
  columns at a time, the loads stream along rows. Plain, each output walked a column: 124 ms vs numpy's 5 for a
  4096^2 column sum. Else None."""
  if k.checked: return None
  reds = [x for x in k.store.value.walk() if x.op == 'reduce']
  live = [v for v in k.domain if v.size > 1]
  if len(reds) != 1 or not live or live[-1].size < 8: return None
  R, j = reds[0], live[-1]
  unit = False
  for ld in (x for x in R.src[0].walk() if x.op == 'load'):
    ix = ld.arg[1]
    cj, cr = ix.coef(j), [ix.coef(r) for r in R.arg[1]]
    if cj not in (0, 1) or None in cr: return None
    if cj == 1 and any(abs(c) == 1 for c in cr): return None   # contiguous along the reduce: the plain nest is right
    unit = unit or (cj == 1 and any(abs(c) > 1 for c in cr))
  return (R, j) if unit else None

def _store(f: LLVMRenderer, k: Kernel):
  v = f.value(k.store.value)
  p = k.params[k.store.param]
  ix = f.idx(k.store.idx)
  f.check(k.store.param, ix)
  g = f.ptr(k.store.param, ix)
  v = f.to_mem(p.dtype, v)
  f.emit(f"store {MT[p.dtype.name]} {v}, ptr {g}, align {p.align}")

def _col_block(f: LLVMRenderer, k: Kernel, R: Expr, j: Var, lo: str, hi: str):
  """Columns [lo, hi) of a column reduce, COL_W at a time: acc[c] = init; for the reduce vars: for c: acc[c] op=
  body(j = jb + c); for c: store the value with the reduce read from acc[c]. A float32 sum of more than COL_SUM_BLOCK
  steps adds each block of them into tot[c], a float64 (each column's adds are one by one: no vector lanes split them)."""
  rop, rvars = R.arg
  dt, ty = R.dtype, VT[R.dtype.name]
  accs, tots = f.t("accs"), f.t("tots")
  f.allocas.append(f"{accs} = alloca [{COL_W} x {ty}], align 64")
  cut = sum_blocks(rop, dt, rvars, COL_SUM_BLOCK)
  if cut: f.allocas.append(f"{tots} = alloca [{COL_W} x double], align 64")
  c, f64 = Var(f"{j.name}c", COL_W), dtypes.float64
  def tot():
    g = f.t("tot"); f.emit(f"{g} = getelementptr inbounds [{COL_W} x double], ptr {tots}, i64 0, i64 {f.vars[c]}"); return g
  def block(jb, jend):
    n = f.t("n"); f.emit(f"{n} = sub i64 {jend}, {jb}")
    def cols(inner):
      def b():
        jv, slot = f.t(j.name), f.t("slot")
        f.emit(f"{jv} = add nsw i64 {jb}, {f.vars[c]}")
        f.vars[j] = jv
        f.emit(f"{slot} = getelementptr inbounds [{COL_W} x {ty}], ptr {accs}, i64 0, i64 {f.vars[c]}")
        inner(slot)
      f.loop(c, "0", n, b)
    def init(slot):
      f.emit(f"store {ty} {reduce_init(rop, dt)}, ptr {slot}")
      if cut: f.emit(f"store double 0.0, ptr {tot()}")
    cols(init)
    def step(slot):
      v, a = f.value(R.src[0]), f.t()
      f.emit(f"{a} = load {ty}, ptr {slot}")
      f.emit(f"store {ty} {f.alu(rop, dt, (dt, dt), [a, v])}, ptr {slot}")
    def flush(slot):   # tot[c] += acc[c]; acc[c] = 0
      a, t, g = f.t(), f.t(), tot()
      f.emit(f"{a} = load {ty}, ptr {slot}"); f.emit(f"{t} = load double, ptr {g}")
      f.emit(f"store double {f.alu(Ops.ADD, f64, (f64, f64), [t, f.alu(Ops.CAST, f64, (dt,), [a])])}, ptr {g}")
      f.emit(f"store {ty} {reduce_init(rop, dt)}, ptr {slot}")
    def nest(d):
      if d == len(rvars): cols(step); return
      v = rvars[d]
      if cut and d == cut[0]:
        def blk(b, e): f.loop(v, b, e, lambda: nest(d + 1)); cols(flush)
        f.blocks(v.name + "b", "0", str(v.size), cut[1], blk)
      else: f.loop(v, "0", str(v.size), lambda: nest(d + 1))
    nest(0)
    def out(slot):
      r = f.t("red")
      if cut:
        t = f.t(); f.emit(f"{t} = load double, ptr {tot()}"); r = f.alu(Ops.CAST, dt, (f64,), [t])
      else: f.emit(f"{r} = load {ty}, ptr {slot}")
      f.put(id(R), r)
      _store(f, k)
    cols(out)
  f.blocks("jb", lo, hi, COL_W, block)

TILE_T = 32  # the square block a transposing kernel walks (two 32x32 float tiles: 8 KiB, in L1)

def _transposing(k: Kernel):
  """(o, j): the two innermost live domain vars when the store runs along j with unit stride and some load runs along j
  with a stride of TILE_T or more but along o with unit stride (a transpose copy): walked in TILE_T x TILE_T blocks so
  that both sides stay in cache lines already fetched. Plain, a 4096^2 transpose took 69 ms. Else None."""
  if k.checked or any(x.op == 'reduce' for x in k.store.value.walk()): return None
  live = [v for v in k.domain if v.size > 1]
  if len(live) < 2 or live[-1].size < TILE_T or live[-2].size < TILE_T or k.store.idx.coef(live[-1]) != 1: return None
  o, j = live[-2], live[-1]
  if o is not k.domain[0] and k.domain.index(o) != k.domain.index(j) - 1: return None   # only size-1 vars may sit between
  for ld in (x for x in k.store.value.walk() if x.op == 'load'):
    cj, co = ld.arg[1].coef(j), ld.arg[1].coef(o)
    if cj is not None and co is not None and abs(cj) >= TILE_T and abs(co) == 1: return o, j
  return None

def _blocked(f: LLVMRenderer, o: Var, j: Var, olo: str, ohi: str, body):
  """for ob in [olo, ohi) step TILE_T: for jb in [0, |j|) step TILE_T: for o in the block: for j in the block: body()."""
  f.blocks(o.name + "b", olo, ohi, TILE_T, lambda o0, o1: f.blocks(j.name + "b", "0", str(j.size), TILE_T,
    lambda j0, j1: f.loop(o, o0, o1, lambda: f.loop(j, j0, j1, body))))

def render_llvm(k: Kernel, fname: str) -> tuple[str, set]:
  """One kernel as an LLVM function (text) and the intrinsic declarations it needs."""
  if k.tile and k.tile[0] == "matmul" and not k.checked and all(p.dtype == dtypes.float32 for p in k.params):
    return render_matmul(k, fname)   # calls the helpers (mm_helpers); float32 only, other dtypes take the plain nest
  if streams(k): return render_stream(k, fname)
  f = LLVMRenderer(k)
  col, tr = col_reduce(k), _transposing(k)
  def nest(d):
    if d == len(k.domain): _store(f, k); return
    v = k.domain[d]
    if col is not None and v is col[1]: _col_block(f, k, *col, "%start" if d == 0 else "0", "%end" if d == 0 else str(v.size))
    elif tr is not None and v is tr[0]:
      _blocked(f, *tr, "%start" if d == 0 else "0", "%end" if d == 0 else str(v.size), lambda: nest(k.domain.index(tr[1]) + 1))
    elif d == 0: f.loop(v, "%start", "%end", lambda: nest(1))
    elif v.size == 1: nest(d + 1)
    else: f.loop(v, "0", str(v.size), lambda: nest(d + 1))
  nest(0)
  out = [signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void"]
  for pi in sorted(set(f.fails)):
    out += [f"fail{pi}:", f"  store i32 {pi + 1}, ptr %err", "  ret void"]
  return "\n".join(out + ["}"]), f.decls
