"""Kernel IR -> LLVM IR text (one function per kernel). Compiling and running live in lower/jit.py, the tiled matmul
renderer in lower/matmul.py.

Every kernel is `void @name(ptr p0, ..., i64 start, i64 end[, ptr err])`: it runs the outermost domain axis over
[start, end), so one function serves one thread or a split across threads (ctypes releases the GIL). Loop counters and
accumulators are allocas in the entry block (SROA turns them into phis). Float reductions carry `reassoc nsz` (they do
not vectorize without it); elementwise float math has no fast-math flags, so it is bit-exact with numpy except where
LLVM's libm calls differ and for float32 exp2 and log2, which are callsat's own polynomials (_Isel.exp2f/log2f: within
2 ulp, and they vectorize; a libm call does not). NaNs are kept (no `nnan`): MAX is llvm.maximum (NaN-propagating, as np.maximum).
`noalias` is claimed only for params the scheduler proved disjoint from every other param; alignment only as the
element size (numpy arrays are only 16-byte aligned). Kernels marked ("matmul", MR, NR) go to lower/matmul.py. A
column reduce (one reduce whose loads run along the innermost output var with unit stride and along the reduce with a
stride) accumulates COL_W columns per reduce step (_col_reduce); a transposing kernel walks TILE_T x TILE_T blocks
(_transposing). Kernels
marked `stream` get aligned non-temporal vector stores: straight from explicit vector IR of the value when it
vectorizes that way (_vec_ok / _render_stream_vec: no auto-vectorizer, ~half the compile time), else through a stack
block (_render_stream). Loops that hold hand-written vector code or scalar edges carry metadata that keeps the
vectorizer and unroller off them (compile time).

CHECK_BOUNDS=1: every load and store index is checked against its param's size; a violation stores (param + 1) into
the extra `err` out-param and returns; the runner raises BoundsError naming the kernel and the buffer.
"""
from __future__ import annotations
import itertools, platform, struct
import numpy as np
from egraph.dtype import DType, dtypes
from egraph.errors import CallsatError
from egraph.ir import Ops
from lower.kernel import Kernel, Expr, Idx, Var, Div


# ---------------------------------------------------------------------------------------------------------------------
# rendering

VT = {"bool": "i1", "uint8": "i8", "int32": "i32", "int64": "i64", "float16": "half", "float32": "float"}
MT = {**VT, "bool": "i8"}
SUF = {"bool": "i1", "uint8": "i8", "int32": "i32", "int64": "i64", "float16": "f16", "float32": "f32"}
MSUF = {**SUF, "bool": "i8"}   # masked loads/stores move bools as their in-memory i8

def lconst(v, dt: DType) -> str:
  if dt == dtypes.bool: return "true" if v else "false"
  if dt.is_int(): return str(int(v))
  if dt == dtypes.float16: return "0xH%04X" % int(np.array(v, np.float16).view(np.uint16))
  return "0x%016X" % struct.unpack("<Q", struct.pack("<d", float(np.float32(v))))[0]

def _zero(dt): return lconst(0, dt)

def _postorder(e: Expr, get, put, one) -> None:
  """put(id(x), one(x)) for each node x of the Expr DAG `e` that get(id(x)) does not have yet, sources first;
  iterative (chains can be long). A reduce's body is left to one(reduce): it is computed inside the reduce's loops."""
  stack = [(e, False)]
  while stack:
    x, done = stack.pop()
    if get(id(x)) is not None: continue
    if done or not x.src or x.op == 'reduce': put(id(x), one(x)); continue
    stack.append((x, True)); stack.extend((s, False) for s in x.src if get(id(s)) is None)

_FBIN = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}
_CMP = {Ops.CMPLT: ("fcmp olt", "icmp slt", "icmp ult"), Ops.CMPNE: ("fcmp une", "icmp ne", "icmp ne"),
        Ops.CMPEQ: ("fcmp oeq", "icmp eq", "icmp eq")}                    # float, signed, unsigned
_BOOL = {Ops.ADD: "or", Ops.SUB: "xor", Ops.MUL: "and", Ops.IDIV: "and", Ops.MAX: "or", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}
_EXP2_P = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3, 5.550332471162809e-2, 2.402264791363012e-1,
           6.931472028550421e-1, 1.0)   # 2**f on [-1/2, 1/2], Horner order (Cephes exp2f)
_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
          2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)   # ln(1 + t) = t - t^2/2 + t^3 P(t), Horner order (Cephes logf)
_FUN = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}

class _Isel:
  """Instruction selection, written once for scalars (_Fn) and <W x T> vectors (_VecFn): the semantics of every ALU op
  and CAST per dtype (lower/reference.py's: C integer wrap, x//0 == 0, NaN-propagating max, ...). A subclass supplies
  t/emit/intrinsic and the spellings: ty(dt) the value type, sfx(dt) an intrinsic's type suffix, cst(v, dt) a
  constant operand, zero(dt) a zero operand."""
  what = "render"
  def alu(self, op, dt: DType, sdts: tuple, a: list, fflags: str = "") -> str:
    """`op` on the SSA values `a` (of dtypes `sdts`) giving a `dt`; `fflags` go on float add/mul (reduce combines)."""
    sdt = sdts[-1] if op is not Ops.WHERE else dt
    ty, sty, bt, r, E = self.ty(dt), self.ty(sdt), self.ty(dtypes.bool), self.t(), self.emit
    if op is Ops.CAST: return self.cast(sdts[0], dt, a[0])
    if op is Ops.BITCAST: E(f"{r} = bitcast {self.ty(sdts[0])} {a[0]} to {ty}"); return r
    if op is Ops.WHERE: E(f"{r} = select {bt} {a[0]}, {ty} {a[1]}, {ty} {a[2]}"); return r
    if op in _CMP:
      E(f"{r} = {_CMP[op][0 if sdt.is_float() else 1 if sdt.kind == 'i' else 2]} {sty} {a[0]}, {a[1]}"); return r
    if sdt == dtypes.bool:
      if op in (Ops.NEG, Ops.TRUNC): return a[0]
      if op is Ops.MOD:
        nb = self.t(); E(f"{nb} = xor {sty} {a[1]}, {self.cst(True, sdt)}"); E(f"{r} = and {sty} {a[0]}, {nb}"); return r
      E(f"{r} = {_BOOL[op]} {sty} {a[0]}, {a[1]}"); return r
    if dt.is_float():
      if op in _FBIN: E(f"{r} = {_FBIN[op]}{fflags} {ty} {a[0]}, {a[1]}"); return r
      if op is Ops.NEG: E(f"{r} = fneg {ty} {a[0]}"); return r
      if op is Ops.RECIPROCAL: E(f"{r} = fdiv {ty} {self.cst(1.0, dt)}, {a[0]}"); return r
      if op is Ops.MAX:   # llvm.maximum propagates NaN, as np.maximum
        f = self.intrinsic(f"llvm.maximum.{self.sfx(dt)}", ty, f"{ty}, {ty}")
        E(f"{r} = call {ty} @{f}({ty} {a[0]}, {ty} {a[1]})"); return r
      if op is Ops.EXP2 and dt == dtypes.float32: return self.exp2f(a[0])
      if op is Ops.LOG2 and dt == dtypes.float32: return self.log2f(a[0])
      f = self.intrinsic(f"llvm.{_FUN[op]}.{self.sfx(dt)}", ty, ty)
      E(f"{r} = call {ty} @{f}({ty} {a[0]})"); return r
    # integers: wrap like C
    signed, zero = dt.kind == 'i', self.zero(dt)
    if op is Ops.NEG: E(f"{r} = sub {ty} {zero}, {a[0]}"); return r
    if op is Ops.TRUNC: return a[0]
    if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR):
      E(f"{r} = {op.name.lower()} {ty} {a[0]}, {a[1]}"); return r
    if op is Ops.MAX:
      f = self.intrinsic(f"llvm.{'smax' if signed else 'umax'}.{self.sfx(dt)}", ty, f"{ty}, {ty}")
      E(f"{r} = call {ty} @{f}({ty} {a[0]}, {ty} {a[1]})"); return r
    if op in (Ops.IDIV, Ops.MOD):   # x//0 == 0, x%0 == x, MIN//-1 == MIN (wraps): LLVM's div/rem would be UB there
      x, y = a
      z, bs = self.t(), self.t()
      E(f"{z} = icmp eq {ty} {y}, {zero}")
      if signed:
        m1, bad = self.t(), self.t()
        E(f"{m1} = icmp eq {ty} {y}, {self.cst(-1, dt)}"); E(f"{bad} = or {bt} {z}, {m1}")
        E(f"{bs} = select {bt} {bad}, {ty} {self.cst(1, dt)}, {ty} {y}")
      else: E(f"{bs} = select {bt} {z}, {ty} {self.cst(1, dt)}, {ty} {y}")
      q = self.t()
      if op is Ops.IDIV:
        E(f"{q} = {'sdiv' if signed else 'udiv'} {ty} {x}, {bs}")
        if signed:
          ng, q2 = self.t(), self.t()
          E(f"{ng} = sub {ty} {zero}, {x}"); E(f"{q2} = select {bt} {m1}, {ty} {ng}, {ty} {q}"); q = q2
        E(f"{r} = select {bt} {z}, {ty} {zero}, {ty} {q}"); return r
      E(f"{q} = {'srem' if signed else 'urem'} {ty} {x}, {bs}")
      E(f"{r} = select {bt} {z}, {ty} {x}, {ty} {q}"); return r
    raise CallsatError(f"LLVM backend: cannot {self.what} {op} on {dt.name}")

  # small emitters for the polynomial functions below (each returns the new SSA value)
  def _ins(self, o: str, t: str, u: str, v: str) -> str:
    r = self.t(); self.emit(f"{r} = {o} {t} {u}, {v}"); return r
  def _conv(self, o: str, v: str, a: str, b: str) -> str:
    r = self.t(); self.emit(f"{r} = {o} {a} {v} to {b}"); return r
  def _sel(self, c: str, t: str, u: str, v: str) -> str:
    r = self.t(); self.emit(f"{r} = select {self.ty(dtypes.bool)} {c}, {t} {u}, {t} {v}"); return r
  def _call(self, name: str, dt: DType, *xs: str) -> str:
    t = self.ty(dt)
    fn = self.intrinsic(f"llvm.{name}.{self.sfx(dt)}", t, ", ".join([t] * len(xs)))
    r = self.t(); self.emit(f"{r} = call {t} @{fn}({', '.join(f'{t} {v}' for v in xs)})"); return r
  def _horner(self, coefs: tuple, x: str) -> str:
    ty, p = self.ty(dtypes.float32), self.cst(coefs[0], dtypes.float32)
    for c in coefs[1:]: p = self._ins("fadd", ty, self._ins("fmul", ty, p, x), self.cst(c, dtypes.float32))
    return p

  def exp2f(self, x: str) -> str:
    """2**x in float32 as plain IR, so loops with it vectorize (a call to libm's exp2f does not, and softmax's exps
    ran one at a time): x = n + f with |f| <= 1/2, 2**f = 1 + f*P(f) (Cephes' degree-5 P); for n >= -125 the result is
    p * 2**n (two power-of-two factors: n = 128 overflows to inf), below it the denormal's bits are built as an integer,
    round(p * 2**(n + 149)): no multiply ever makes a denormal (x86 takes a ~100-cycle assist for each, and softmax of
    large logits is full of exps that underflow). Within 2 ulp of libm; NaN and +-inf as exp2f."""
    f32, i32 = dtypes.float32, dtypes.int32
    ty, ity, fc, ic = self.ty(f32), self.ty(i32), lambda v: self.cst(v, f32), lambda v: self.cst(v, i32)
    op, iop = lambda o, u, v: self._ins(o, ty, u, v), lambda o, u, v: self._ins(o, ity, u, v)
    pow2 = lambda k: self._conv("bitcast", iop("shl", iop("add", k, ic(127)), ic(23)), ity, ty)
    xc = self._call("minnum", f32, self._call("maxnum", f32, x, fc(-151.0)), fc(129.0))
    n = self._call("roundeven", f32, xc)
    p = self._horner(_EXP2_P, op("fsub", xc, n))
    ni = self._conv("fptosi", n, ty, ity)
    nc = self._call("smax", i32, ni, ic(-125))
    n1 = iop("ashr", nc, ic(1))
    big = op("fmul", op("fmul", p, pow2(n1)), pow2(iop("sub", nc, n1)))
    m = self._conv("fptosi", self._call("roundeven", f32, op("fmul", p, pow2(iop("add", ni, ic(149))))), ty, ity)
    v = self._sel(iop("icmp slt", ni, ic(-125)), ty, self._conv("bitcast", m, ity, ty), big)
    return self._sel(op("fcmp uno", x, x), ty, x, v)

  def log2f(self, x: str) -> str:
    """log2(x) in float32 as plain IR (vectorizes, as exp2f): x = m * 2**e with m in [sqrt(1/2), sqrt(2)), ln(m) by
    Cephes' logf polynomial, then e + ln(m) * log2(e) with log2(e) split (Cephes log2f); denormal inputs scaled by
    2**23 first. Within 2 ulp of libm away from x = 1 (absolute 1e-7 near it); 0, negatives, inf and NaN as log2f."""
    f32, i32 = dtypes.float32, dtypes.int32
    ty, ity, fc, ic = self.ty(f32), self.ty(i32), lambda v: self.cst(v, f32), lambda v: self.cst(v, i32)
    op, iop = lambda o, u, v: self._ins(o, ty, u, v), lambda o, u, v: self._ins(o, ity, u, v)
    den = op("fcmp olt", x, fc(2.0 ** -126))
    bits = self._conv("bitcast", self._sel(den, ty, op("fmul", x, fc(2.0 ** 23)), x), ty, ity)
    e = iop("add", iop("sub", iop("and", iop("ashr", bits, ic(23)), ic(255)), ic(127)), self._sel(den, ity, ic(-23), ic(0)))
    m = self._conv("bitcast", iop("or", iop("and", bits, ic(0x7FFFFF)), ic(0x3F800000)), ity, ty)
    big = op("fcmp ogt", m, fc(1.4142135623730951))
    m = self._sel(big, ty, op("fmul", m, fc(0.5)), m)
    ef = self._conv("sitofp", iop("add", e, self._conv("zext", big, self.ty(dtypes.bool), ity)), ity, ty)
    t = op("fsub", m, fc(1.0))
    z = op("fmul", t, t)
    y = op("fsub", op("fmul", t, op("fmul", z, self._horner(_LOG_P, t))), op("fmul", z, fc(0.5)))   # ln(1 + t) - t
    r = op("fmul", y, fc(0.44269504088896340736))
    r = op("fadd", op("fadd", op("fadd", op("fadd", r, op("fmul", t, fc(0.44269504088896340736))), y), t), ef)
    r = self._sel(op("fcmp oeq", x, fc(float("inf"))), ty, fc(float("inf")), r)
    r = self._sel(op("fcmp oeq", x, fc(0.0)), ty, fc(float("-inf")), r)
    return self._sel(op("fcmp ult", x, fc(0.0)), ty, fc(float("nan")), r)   # negatives and NaN (unordered) give NaN

  def cast(self, src: DType, dst: DType, x: str) -> str:
    if src == dst: return x
    st, dt, r, E = self.ty(src), self.ty(dst), self.t(), self.emit
    if dst == dtypes.bool: E(f"{r} = {'fcmp une' if src.is_float() else 'icmp ne'} {st} {x}, {self.zero(src)}"); return r
    if src == dtypes.bool: E(f"{r} = {'uitofp' if dst.is_float() else 'zext'} {st} {x} to {dt}"); return r
    if src.is_float() and dst.is_float():
      E(f"{r} = {'fpext' if dst.itemsize > src.itemsize else 'fptrunc'} {st} {x} to {dt}"); return r
    if src.is_float():   # float -> int: truncate toward zero (as numpy/C on x86: via a 32- or 64-bit convert)
      wide = self.ty(dtypes.int64 if dst.itemsize == 8 else dtypes.int32)
      y = self.t(); E(f"{y} = fptosi {st} {x} to {wide}")
      z = self.t(); E(f"{z} = freeze {wide} {y}")
      if dst.itemsize < 4: E(f"{r} = trunc {wide} {z} to {dt}"); return r
      return z
    if dst.is_float(): E(f"{r} = {'sitofp' if src.kind == 'i' else 'uitofp'} {st} {x} to {dt}"); return r
    if dst.itemsize == src.itemsize: return x
    if dst.itemsize > src.itemsize: E(f"{r} = {'sext' if src.kind == 'i' else 'zext'} {st} {x} to {dt}"); return r
    E(f"{r} = trunc {st} {x} to {dt}"); return r

class _Fn(_Isel):
  def __init__(self, k: Kernel):
    self.k, self.lines, self.allocas, self.n, self.decls = k, [], [], 0, set()
    self.scopes: list[dict] = [{}]
    self.vars: dict = {}
    self.fails: list = []
  def t(self, prefix="t") -> str:
    self.n += 1
    return f"%{prefix}.{self.n}"
  def emit(self, s: str): self.lines.append("  " + s)
  def label(self, name: str): self.lines.append(f"{name[1:]}:")
  def get(self, key):
    for s in reversed(self.scopes):
      if key in s: return s[key]
    return None
  def put(self, key, v): self.scopes[-1][key] = v
  def intrinsic(self, name: str, ret: str, args: str) -> str:
    self.decls.add(f"declare {ret} @{name}({args})")
    return name
  def ty(self, dt: DType) -> str: return VT[dt.name]
  def sfx(self, dt: DType) -> str: return SUF[dt.name]
  def cst(self, v, dt: DType) -> str: return lconst(v, dt)
  def zero(self, dt: DType) -> str: return _zero(dt)

  # loops: body() emits into the loop; counters are allocas
  def loop(self, v: Var, lo: str, hi: str, body):
    addr = self.t(v.name + ".addr")
    self.allocas.append(f"{addr} = alloca i64")
    cond, bodyl, exitl = self.t(v.name + ".cond"), self.t(v.name + ".body"), self.t(v.name + ".exit")
    self.emit(f"store i64 {lo}, ptr {addr}")
    self.emit(f"br label {cond}")
    self.label(cond)
    cur = self.t(v.name)
    self.emit(f"{cur} = load i64, ptr {addr}")
    c = self.t()
    self.emit(f"{c} = icmp slt i64 {cur}, {hi}")
    self.emit(f"br i1 {c}, label {bodyl}, label {exitl}")
    self.label(bodyl)
    self.scopes.append({}); self.vars[v] = cur
    body()
    self.scopes.pop()
    nxt = self.t()
    self.emit(f"{nxt} = add nuw nsw i64 {cur}, 1")
    self.emit(f"store i64 {nxt}, ptr {addr}")
    self.emit(f"br label {cond}")
    self.label(exitl)

  def blocks(self, name: str, lo: str, hi: str, step: int, body):
    """for b in [lo, hi) step `step`: body(b, min(b + step, hi)) (SSA values)."""
    addr, cond, bl, ex = self.t(name + ".addr"), self.t(name + ".cond"), self.t(name + ".body"), self.t(name + ".exit")
    self.allocas.append(f"{addr} = alloca i64")
    self.emit(f"store i64 {lo}, ptr {addr}"); self.emit(f"br label {cond}")
    self.label(cond)
    cur, ok = self.t(name), self.t()
    self.emit(f"{cur} = load i64, ptr {addr}"); self.emit(f"{ok} = icmp slt i64 {cur}, {hi}"); self.emit(f"br i1 {ok}, label {bl}, label {ex}")
    self.label(bl)
    end, nx, lt = self.t(), self.t(), self.t()
    self.emit(f"{nx} = add nsw i64 {cur}, {step}"); self.emit(f"{lt} = icmp slt i64 {nx}, {hi}")
    self.emit(f"{end} = select i1 {lt}, i64 {nx}, i64 {hi}")
    body(cur, end)
    self.emit(f"store i64 {nx}, ptr {addr}"); self.emit(f"br label {cond}")
    self.label(ex)

  # index expressions
  def idx(self, i: Idx) -> str:
    if i.is_const: return str(i.c)
    key = ("idx", i)
    if (v := self.get(key)) is not None: return v
    acc = None
    for a, k in i.terms:
      if isinstance(a, Var): x = self.vars[a]
      else:
        inner = self.idx(a.x)
        x = self.t()
        self.emit(f"{x} = {'sdiv' if isinstance(a, Div) else 'srem'} i64 {inner}, {a.d}")
      if k != 1:
        y = self.t(); self.emit(f"{y} = mul nsw i64 {x}, {k}"); x = y
      if acc is None: acc = x
      else:
        y = self.t(); self.emit(f"{y} = add nsw i64 {acc}, {x}"); acc = y
    if i.c:
      y = self.t(); self.emit(f"{y} = add nsw i64 {acc}, {i.c}"); acc = y
    self.put(key, acc)
    return acc

  def check(self, pi: int, ix: str):
    if not self.k.checked: return
    p = self.k.params[pi]
    bad, ok = self.t(), self.t("ok")
    self.emit(f"{bad} = icmp uge i64 {ix}, {p.size}")
    self.emit(f"br i1 {bad}, label %fail{pi}, label {ok}")
    self.fails.append(pi)
    self.label(ok)

  def ptr(self, pi: int, ix: str) -> str:
    p = self.k.params[pi]
    g = self.t("p")
    self.emit(f"{g} = getelementptr inbounds {MT[p.dtype.name]}, ptr %{p.name}, i64 {ix}")
    return g

  # values
  def value(self, e: Expr) -> str:
    _postorder(e, self.get, self.put, self._one)   # memo: the scopes (a value inside a loop is not reused outside)
    return self.get(id(e))

  def _one(self, e: Expr) -> str:
    if e.op == 'const': return lconst(e.arg, e.dtype)
    if e.op == 'load': return self.load(e)
    if e.op == 'valid': return self.valid(e.arg)
    if e.op == 'reduce': return self.reduce(e)
    return self.alu(e.op, e.dtype, tuple(s.dtype for s in e.src), [self.get(id(s)) for s in e.src])

  def valid(self, valid) -> str:
    key = ("valid", valid)
    if (v := self.get(key)) is not None: return v
    conds = []
    for b in valid:
      bi = self.idx(b.idx)
      if b.idx.vmin < b.lo:
        c = self.t(); self.emit(f"{c} = icmp sge i64 {bi}, {b.lo}"); conds.append(c)
      if b.idx.vmax >= b.hi:
        c = self.t(); self.emit(f"{c} = icmp slt i64 {bi}, {b.hi}"); conds.append(c)
    ok = conds[0] if conds else "true"
    for c in conds[1:]:
      y = self.t(); self.emit(f"{y} = and i1 {ok}, {c}"); ok = y
    self.put(key, ok)
    return ok

  def load(self, e: Expr) -> str:
    pi, i, valid = e.arg
    p = self.k.params[pi]
    ix = self.idx(i)
    ok = None
    if valid:
      ok = self.valid(valid)
      y = self.t(); self.emit(f"{y} = select i1 {ok}, i64 {ix}, i64 0"); ix = y
    self.check(pi, ix)
    g = self.ptr(pi, ix)
    v = self.t("v")
    self.emit(f"{v} = load {MT[p.dtype.name]}, ptr {g}, align {p.align}")
    if p.dtype == dtypes.bool:
      y = self.t(); self.emit(f"{y} = icmp ne i8 {v}, 0"); v = y
    if ok is not None:
      y = self.t(); self.emit(f"{y} = select i1 {ok}, {VT[p.dtype.name]} {v}, {VT[p.dtype.name]} {_zero(p.dtype)}"); v = y
    return v

  def reduce(self, e: Expr) -> str:
    rop, rvars = e.arg
    dt = e.dtype
    ty = VT[dt.name]
    acc = self.t("acc")
    self.allocas.append(f"{acc} = alloca {ty}")
    self.emit(f"store {ty} {_reduce_init(rop, dt)}, ptr {acc}")
    def nest(d):
      if d == len(rvars):
        v = self.value(e.src[0])
        a = self.t()
        self.emit(f"{a} = load {ty}, ptr {acc}")
        r = self.alu(rop, dt, (dt, dt), [a, v], " reassoc nsz")   # float reductions do not vectorize without it
        self.emit(f"store {ty} {r}, ptr {acc}")
        return
      self.loop(rvars[d], "0", str(rvars[d].size), lambda: nest(d + 1))
    nest(0)
    r = self.t("red")
    self.emit(f"{r} = load {ty}, ptr {acc}")
    return r

def _reduce_init(rop, dt: DType) -> str:
  if rop is Ops.ADD: return _zero(dt)
  if rop is Ops.MUL: return lconst(1, dt)
  if dt.is_float(): return "0xFFF0000000000000" if dt == dtypes.float32 else "0xHFC00"
  if dt == dtypes.bool: return "false"
  if dt == dtypes.uint8: return "0"
  return str(-(1 << (8 * dt.itemsize - 1)))

def _signature(k: Kernel, fname: str) -> str:
  ps = []
  for p in k.params:
    attrs = ["noalias"] if p.noalias else []
    attrs.append("nocapture")
    if p.readonly: attrs.append("readonly")
    if p.writeonly: attrs.append("writeonly")
    ps.append(f"ptr {' '.join(attrs)} align {p.align} %{p.name}")
  ps += ["i64 %start", "i64 %end"] + (["ptr %err"] if k.checked else [])
  return f"define void @{fname}({', '.join(ps)}) nounwind"

_LOOP_IDS = itertools.count(9100, 2)

def _noloop(decls: set) -> str:
  """`, !llvm.loop !N` for a latch branch: a loop the vectorizer and unroller leave alone (hand-written vector code or
  a scalar edge; compile time), with its metadata added to `decls`."""
  n = next(_LOOP_IDS)
  decls.add(f"!{n} = distinct !{{!{n}, !9001, !9002}}")
  decls |= {'!9001 = !{!"llvm.loop.vectorize.enable", i1 false}', '!9002 = !{!"llvm.loop.unroll.disable"}'}
  return f", !llvm.loop !{n}"

STREAM_STAGE = 8192      # bytes of the on-stack staging block of a streaming kernel (L1-resident)
NT_MD = "!9000 = !{i32 1}"

def _head_count(E, first: str, sh: int):
  """%h = min(%n, elements from output element `first` (byte offset `first` << sh from %obase) to the next 64-byte
  boundary): the scalar or masked head before the aligned non-temporal vector stores."""
  E(f"%d.b = shl i64 {first}, {sh}")
  E("%d.a = add i64 %obase, %d.b")
  E("%d.m = and i64 %d.a, 63")
  E("%d.r = sub i64 64, %d.m")
  E("%d.r2 = and i64 %d.r, 63")
  E(f"%h0 = lshr i64 %d.r2, {sh}")
  E("%h.lt = icmp slt i64 %h0, %n")
  E("%h = select i1 %h.lt, i64 %h0, i64 %n")

def _streams(k: Kernel) -> bool:
  return k.stream and not k.checked and len(k.domain) == 1 and platform.machine() in ("x86_64", "AMD64")

def _render_stream(k: Kernel, fname: str) -> tuple[str, set]:
  """A `stream` kernel: out[i + c] = value(i) for i in [start, end), written with non-temporal stores.

  The non-temporal store must be a 64-byte aligned vector store (scalar `!nontemporal` stores block the loop
  vectorizer; numpy buffers are only 16-byte aligned), while the value is any scalar expression. So the range is cut
  into segments that end on 64-byte boundaries of the output, at most STREAM_STAGE bytes each; each segment's values
  are computed by the plain (auto-vectorized) loop into a stack block, which is then copied out: a masked vector store
  up to the first aligned address (only the first segment of a range has one), aligned <64 bytes> `!nontemporal`
  stores, a masked store for the last partial vector (masked-off lanes never touch memory). An sfence ends the kernel, so the stores are visible to whichever thread
  joins this one."""
  f = _Fn(k)
  p = k.params[k.store.param]
  v0 = k.domain[0]
  ty, isz = MT[p.dtype.name], p.dtype.itemsize
  lanes, blk, c = 64 // isz, STREAM_STAGE // isz, k.store.idx.c
  vt = f"<{lanes} x {ty}>"
  sh = isz.bit_length() - 1
  E = f.emit
  f.allocas += [f"%stage = alloca {ty}, i64 {blk + lanes}, align 64", "%seg.addr = alloca i64", "%cp.addr = alloca i64"]
  E(f"%obase = ptrtoint ptr %{p.name} to i64")
  E("store i64 %start, ptr %seg.addr")
  E("br label %seg.cond")
  f.label("%seg.cond")
  E("%b = load i64, ptr %seg.addr")
  E("%seg.more = icmp slt i64 %b, %end")
  E("br i1 %seg.more, label %seg.body, label %seg.exit")
  f.label("%seg.body")
  # segment end: the last 64-byte boundary of the output at or below b + blk, or end
  E(f"%nx = add i64 %b, {blk}")
  E(f"%nx.g = add i64 %nx, {c}")
  E(f"%nx.b = shl i64 %nx.g, {sh}")
  E("%nx.a = add i64 %obase, %nx.b")
  E("%nx.m = and i64 %nx.a, 63")
  E(f"%nx.me = lshr i64 %nx.m, {sh}")
  E("%nx2 = sub i64 %nx, %nx.me")
  E("%nx.lt = icmp slt i64 %nx2, %end")
  E("%e = select i1 %nx.lt, i64 %nx2, i64 %end")
  def body():
    val = f.value(k.store.value)
    li = f.t(); E(f"{li} = sub i64 {f.vars[v0]}, %b")
    g = f.t("p"); E(f"{g} = getelementptr inbounds {ty}, ptr %stage, i64 {li}")
    if p.dtype == dtypes.bool:
      y = f.t(); E(f"{y} = zext i1 {val} to i8"); val = y
    E(f"store {ty} {val}, ptr {g}, align {isz}")
  f.loop(v0, "%b", "%e", body)
  # copy the stage out: head (scalar, to the first aligned address), aligned NT vectors, tail (scalar)
  E("%n = sub i64 %e, %b")
  E(f"%dg = add i64 %b, {c}")
  E(f"%dst = getelementptr inbounds {ty}, ptr %{p.name}, i64 %dg")
  _head_count(E, "%dg", sh)
  E("%nv0 = sub i64 %n, %h")
  E(f"%nv1 = lshr i64 %nv0, {(lanes).bit_length() - 1}")
  E(f"%nv = shl i64 %nv1, {(lanes).bit_length() - 1}")
  E("%vend = add i64 %h, %nv")
  mt = f"<{lanes} x i1>"
  msk = f.intrinsic(f"llvm.masked.store.v{lanes}{MSUF[p.dtype.name]}", "void", f"{vt}, ptr, i32, {mt}")
  iota = "<" + ", ".join(f"i64 {j}" for j in range(lanes)) + ">"
  def masked(tag, at, count):   # stage[at:at+count] -> dst[at:at+count], count < lanes: one masked vector store
    E(f"%{tag}.sp = getelementptr inbounds {ty}, ptr %stage, i64 {at}")
    E(f"%{tag}.v = load {vt}, ptr %{tag}.sp, align {isz}")
    E(f"%{tag}.dp = getelementptr inbounds {ty}, ptr %dst, i64 {at}")
    E(f"%{tag}.c0 = insertelement <{lanes} x i64> poison, i64 {count}, i64 0")
    E(f"%{tag}.c = shufflevector <{lanes} x i64> %{tag}.c0, <{lanes} x i64> poison, <{lanes} x i32> zeroinitializer")
    E(f"%{tag}.m = icmp ult <{lanes} x i64> {iota}, %{tag}.c")
    E(f"call void @{msk}({vt} %{tag}.v, ptr %{tag}.dp, i32 {isz}, {mt} %{tag}.m)")
  masked("hd", "0", "%h")
  E("store i64 %h, ptr %cp.addr")
  E("br label %nt.cond")
  f.label("%nt.cond")
  E("%nt.j = load i64, ptr %cp.addr")
  E("%nt.ok = icmp slt i64 %nt.j, %vend")
  E("br i1 %nt.ok, label %nt.body, label %nt.exit")
  f.label("%nt.body")
  E(f"%nt.sp = getelementptr inbounds {ty}, ptr %stage, i64 %nt.j")
  E(f"%nt.v = load {vt}, ptr %nt.sp, align {isz}")
  E(f"%nt.dp = getelementptr inbounds {ty}, ptr %dst, i64 %nt.j")
  E(f"store {vt} %nt.v, ptr %nt.dp, align 64, !nontemporal !9000")
  E(f"%nt.n = add nuw nsw i64 %nt.j, {lanes}")
  E("store i64 %nt.n, ptr %cp.addr")
  E("br label %nt.cond" + _noloop(f.decls))
  f.label("%nt.exit")
  E("%tl.r = sub i64 %n, %vend")
  masked("tl", "%vend", "%tl.r")
  E("store i64 %e, ptr %seg.addr")
  E("br label %seg.cond" + _noloop(f.decls))
  f.label("%seg.exit")
  E("call void @llvm.x86.sse.sfence()")
  out = [_signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void", "}"]
  return "\n".join(out), f.decls | {"declare void @llvm.x86.sse.sfence()", NT_MD}

def _vec_ok(k: Kernel) -> bool:
  """A stream kernel whose value _VecFn can emit as explicit vector IR: loads unit-stride in the (only) loop var or
  invariant, no PAD masks, no reduces, no integer division, no bool arithmetic, at most 256 bytes per vector."""
  v0, lanes = k.domain[0], 64 // k.params[k.store.param].dtype.itemsize
  seen, stack = set(), [k.store.value]
  while stack:
    x = stack.pop()
    if id(x) in seen: continue
    seen.add(id(x)); stack.extend(x.src)
    if x.dtype.itemsize * lanes > 256: return False
    if x.op == 'const': continue
    if x.op == 'load':
      _, ix, valid = x.arg
      if valid or not (ix.is_const or ix.terms == ((v0, 1),)): return False
      continue
    if x.op in ('reduce', 'valid') or x.op in (Ops.IDIV, Ops.MOD): return False
    if x.op not in (Ops.CAST, Ops.BITCAST, Ops.WHERE) and any(s.dtype == dtypes.bool for s in x.src): return False
    if x.op is Ops.CAST and x.src[0].dtype == dtypes.bool and x.dtype == dtypes.bool: continue
  return True

class _VecFn(_Isel):
  """Explicit <lanes x T> IR for a stream kernel's value at `lanes` consecutive indices starting at an i64 SSA value,
  optionally under a lane mask (masked loads: masked-off lanes never touch memory). Emits into the _Fn `f`; the ALU
  ops and casts are _Isel's, spelled for vectors."""
  what = "vectorize"
  def __init__(self, f: "_Fn", lanes: int):
    self.f, self.W = f, lanes
    self.t, self.emit, self.intrinsic = f.t, f.emit, f.intrinsic
  def ty(self, dt: DType) -> str: return f"<{self.W} x {VT[dt.name]}>"
  def sfx(self, dt: DType) -> str: return f"v{self.W}{SUF[dt.name]}"
  def cst(self, v, dt: DType) -> str: return f"splat ({VT[dt.name]} {lconst(v, dt)})"
  def zero(self, dt: DType) -> str: return "zeroinitializer"
  def splat(self, dt: DType, s: str) -> str:
    W, ty = self.W, VT[dt.name]
    a, b = self.t(), self.t()
    self.emit(f"{a} = insertelement <{W} x {ty}> poison, {ty} {s}, i64 0")
    self.emit(f"{b} = shufflevector <{W} x {ty}> {a}, <{W} x {ty}> poison, <{W} x i32> zeroinitializer")
    return b
  def value(self, e: Expr, base: str, mask: str | None) -> str:
    memo: dict = {}
    _postorder(e, memo.get, memo.__setitem__, lambda x: self.one(x, [memo[id(s)] for s in x.src], base, mask))
    return memo[id(e)]
  def one(self, e: Expr, a: list, base: str, mask: str | None) -> str:
    f, E, W = self.f, self.emit, self.W
    dt = e.dtype
    if e.op == 'const': return self.cst(e.arg, dt)
    if e.op == 'load':
      pi, ix, _ = e.arg
      p = f.k.params[pi]
      mty = MT[p.dtype.name]
      if ix.is_const:
        g = f.ptr(pi, str(ix.c)); s = f.t("v")
        E(f"{s} = load {mty}, ptr {g}, align {p.align}")
        if p.dtype == dtypes.bool:
          y = f.t(); E(f"{y} = icmp ne i8 {s}, 0"); s = y
        return self.splat(dt, s)
      off = f.t(); E(f"{off} = add nsw i64 {base}, {ix.c}")
      g = f.ptr(pi, off); v = f.t("v")
      vm = f"<{W} x {mty}>"
      if mask is None: E(f"{v} = load {vm}, ptr {g}, align {p.align}")
      else:
        fn = f.intrinsic(f"llvm.masked.load.v{W}{MSUF[p.dtype.name]}", vm, f"ptr, i32, <{W} x i1>, {vm}")
        E(f"{v} = call {vm} @{fn}(ptr {g}, i32 {p.align}, <{W} x i1> {mask}, {vm} zeroinitializer)")
      if p.dtype == dtypes.bool:
        y = f.t(); E(f"{y} = icmp ne {vm} {v}, zeroinitializer"); v = y
      return v
    return self.alu(e.op, dt, tuple(s.dtype for s in e.src), a)

def _render_stream_vec(k: Kernel, fname: str) -> tuple[str, set]:
  """A `stream` kernel whose value vectorizes explicitly (_vec_ok): no stack block, no auto-vectorizer. One masked
  vector step up to the first 64-byte boundary of the output, then aligned <64 bytes> `!nontemporal` vector stores
  straight from the vector loop, one masked step for the tail; an sfence at the end."""
  f = _Fn(k)
  p = k.params[k.store.param]
  ty, isz = MT[p.dtype.name], p.dtype.itemsize
  W, c, sh = 64 // isz, k.store.idx.c, isz.bit_length() - 1
  vf, E = _VecFn(f, W), f.emit
  vm, mt = f"<{W} x {ty}>", f"<{W} x i1>"
  msk = f.intrinsic(f"llvm.masked.store.v{W}{MSUF[p.dtype.name]}", "void", f"{vm}, ptr, i32, {mt}")
  iota = "<" + ", ".join(f"i64 {j}" for j in range(W)) + ">"
  def step(tag: str, base: str, count: str | None, nt: bool):
    mask = None
    if count is not None:
      mask = f"%{tag}.m"; E(f"{mask} = icmp ult <{W} x i64> {iota}, {vf.splat(dtypes.int64, count)}")
    val = vf.value(k.store.value, base, mask)
    if p.dtype == dtypes.bool:
      y = f.t(); E(f"{y} = zext {mt} {val} to {vm}"); val = y
    o = f.t(); E(f"{o} = add nsw i64 {base}, {c}")
    g = f.ptr(k.store.param, o)
    if mask is None: E(f"store {vm} {val}, ptr {g}, align 64" + (", !nontemporal !9000" if nt else ""))
    else: E(f"call void @{msk}({vm} {val}, ptr {g}, i32 {isz}, {mt} {mask})")
  E(f"%obase = ptrtoint ptr %{p.name} to i64")
  E("%n = sub i64 %end, %start")
  E(f"%d.g = add i64 %start, {c}")
  _head_count(E, "%d.g", sh)
  E("%h.any = icmp sgt i64 %h, 0")
  E("br i1 %h.any, label %head, label %v.pre")
  f.label("%head")
  step("hd", "%start", "%h", False)
  E("br label %v.pre")
  f.label("%v.pre")
  E("%vstart = add i64 %start, %h")
  E("%nv0 = sub i64 %n, %h")
  E(f"%nv1 = ashr i64 %nv0, {W.bit_length() - 1}")
  E(f"%nv = shl i64 %nv1, {W.bit_length() - 1}")
  E("%vend = add i64 %vstart, %nv")
  E("br label %v.cond")
  f.label("%v.cond")
  E("%vi = phi i64 [%vstart, %v.pre], [%vi.next, %v.body]")
  E("%v.ok = icmp slt i64 %vi, %vend")
  E("br i1 %v.ok, label %v.body, label %v.exit")
  f.label("%v.body")
  step("vb", "%vi", None, True)
  E(f"%vi.next = add nsw i64 %vi, {W}")
  E("br label %v.cond" + _noloop(f.decls))
  f.label("%v.exit")
  E("%tl.r = sub i64 %end, %vend")
  E("%tl.any = icmp sgt i64 %tl.r, 0")
  E("br i1 %tl.any, label %tail, label %done")
  f.label("%tail")
  step("tl", "%vend", "%tl.r", False)
  E("br label %done")
  f.label("%done")
  E("call void @llvm.x86.sse.sfence()")
  out = [_signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void", "}"]
  return "\n".join(out), f.decls | {"declare void @llvm.x86.sse.sfence()", NT_MD}

COL_W = 4096   # output columns a column reduce accumulates at once (16 KiB of float accumulators): each row is read
               # contiguously across them (256 columns per step measured 6.2-7.6 ms for a 4096^2 column sum, 4096: 4.7-4.9)

def _col_reduce(k: Kernel):
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

def _store(f: _Fn, k: Kernel):
  v = f.value(k.store.value)
  p = k.params[k.store.param]
  ix = f.idx(k.store.idx)
  f.check(k.store.param, ix)
  g = f.ptr(k.store.param, ix)
  if p.dtype == dtypes.bool:
    y = f.t(); f.emit(f"{y} = zext i1 {v} to i8"); v = y
  f.emit(f"store {MT[p.dtype.name]} {v}, ptr {g}, align {p.align}")

def _col_block(f: _Fn, k: Kernel, R: Expr, j: Var, lo: str, hi: str):
  """Columns [lo, hi) of a column reduce, COL_W at a time: acc[c] = init; for the reduce vars: for c: acc[c] op=
  body(j = jb + c); for c: store the value with the reduce read from acc[c]."""
  rop, rvars = R.arg
  dt, ty = R.dtype, VT[R.dtype.name]
  accs = f.t("accs")
  f.allocas.append(f"{accs} = alloca [{COL_W} x {ty}], align 64")
  c = Var(f"{j.name}c", COL_W)
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
    cols(lambda slot: f.emit(f"store {ty} {_reduce_init(rop, dt)}, ptr {slot}"))
    def step(slot):
      v, a = f.value(R.src[0]), f.t()
      f.emit(f"{a} = load {ty}, ptr {slot}")
      f.emit(f"store {ty} {f.alu(rop, dt, (dt, dt), [a, v])}, ptr {slot}")
    def nest(d):
      if d == len(rvars): cols(step); return
      f.loop(rvars[d], "0", str(rvars[d].size), lambda: nest(d + 1))
    nest(0)
    def out(slot):
      r = f.t("red"); f.emit(f"{r} = load {ty}, ptr {slot}")
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

def _blocked(f: _Fn, o: Var, j: Var, olo: str, ohi: str, body):
  """for ob in [olo, ohi) step TILE_T: for jb in [0, |j|) step TILE_T: for o in the block: for j in the block: body()."""
  f.blocks(o.name + "b", olo, ohi, TILE_T, lambda o0, o1: f.blocks(j.name + "b", "0", str(j.size), TILE_T,
    lambda j0, j1: f.loop(o, o0, o1, lambda: f.loop(j, j0, j1, body))))

def render_llvm(k: Kernel, fname: str) -> tuple[str, set]:
  """One kernel as an LLVM function (text) and the intrinsic declarations it needs."""
  if k.tile and k.tile[0] == "matmul" and not k.checked:
    from lower.matmul import mm_helpers, render_matmul
    mm_helpers()
    return render_matmul(k, fname)
  if _streams(k): return _render_stream_vec(k, fname) if _vec_ok(k) else _render_stream(k, fname)
  f = _Fn(k)
  col, tr = _col_reduce(k), _transposing(k)
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
  out = [_signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void"]
  for pi in sorted(set(f.fails)):
    out += [f"fail{pi}:", f"  store i32 {pi + 1}, ptr %err", "  ret void"]
  return "\n".join(out + ["}"]), f.decls
