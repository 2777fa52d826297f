"""One LLVM function from kernel IR: the types and constants, instruction selection (Isel: every ALU op and cast, per
dtype, with lower/reference.py's semantics, written once for scalars and <W x T> vectors), the scalar renderer
(LLVMRenderer: loops as allocas, indices, loads, reduces, bounds checks), the signature every kernel has and the loop
metadata that keeps the vectorizer and unroller off hand-written loops. lower/llvm.py puts kernels together from these."""
from __future__ import annotations
import itertools, struct
import numpy as np
from egraph.dtype import DType, dtypes
from egraph.errors import CallsatError
from egraph.ir import Ops
from lower.kernel import Kernel, Var
from lower.renderer import Renderer

VT = {"bool": "i1", "uint8": "i8", "int32": "i32", "int64": "i64", "float16": "half", "float32": "float"}
MT = {**VT, "bool": "i8"}
SUF = {"bool": "i1", "uint8": "i8", "int32": "i32", "int64": "i64", "float16": "f16", "float32": "f32"}
MSUF = {**SUF, "bool": "i8"}   # masked loads/stores move bools as their in-memory i8

def lconst(v, dt: DType) -> str:
  if dt == dtypes.bool: return "true" if v else "false"
  if dt.is_int(): return str(int(v))
  if dt == dtypes.float16: return "0xH%04X" % int(np.array(v, np.float16).view(np.uint16))
  return "0x%016X" % struct.unpack("<Q", struct.pack("<d", float(np.float32(v))))[0]


_FBIN = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}
_CMP = {Ops.CMPLT: ("fcmp olt", "icmp slt", "icmp ult"), Ops.CMPNE: ("fcmp une", "icmp ne", "icmp ne"),
        Ops.CMPEQ: ("fcmp oeq", "icmp eq", "icmp eq")}                    # float, signed, unsigned
_BOOL = {Ops.ADD: "or", Ops.SUB: "xor", Ops.MUL: "and", Ops.IDIV: "and", Ops.MAX: "or", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}
_EXP2_P = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3, 5.550332471162809e-2, 2.402264791363012e-1,
           6.931472028550421e-1, 1.0)   # 2**f on [-1/2, 1/2], Horner order (Cephes exp2f)
_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
          2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)   # ln(1 + t) = t - t^2/2 + t^3 P(t), Horner order (Cephes logf)
_FUN = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}

class Isel:
  """Instruction selection, written once for scalars (LLVMRenderer) and <W x T> vectors (lower/llvm_stream.py's VecRenderer): the semantics of every ALU op
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

class LLVMRenderer(Isel, Renderer):
  """The scalar renderer: SSA values, loop counters and accumulators as entry-block allocas (SROA makes them phis)."""
  VT, tmp, fmt = VT, "t", "%{}.{}"
  code_for_idx = {"div": lambda a, b: f"sdiv i64 {a}, {b}", "mod": lambda a, b: f"srem i64 {a}, {b}",
                  "mul": lambda a, b: f"mul nsw i64 {a}, {b}", "add": lambda a, b: f"add nsw i64 {a}, {b}",
                  "ge": lambda a, b: f"icmp sge i64 {a}, {b}", "lt": lambda a, b: f"icmp slt i64 {a}, {b}",
                  "and": lambda a, b: f"and i1 {a}, {b}"}
  def __init__(self, k: Kernel):
    super().__init__(k)
    self.allocas, self.decls, self.fails = [], set(), []
  def label(self, name: str): self.lines.append(f"{name[1:]}:")
  def intrinsic(self, name: str, ret: str, args: str) -> str:
    self.decls.add(f"declare {ret} @{name}({args})")
    return name
  def ty(self, dt: DType) -> str: return VT[dt.name]
  def sfx(self, dt: DType) -> str: return SUF[dt.name]
  def cst(self, v, dt: DType) -> str: return lconst(v, dt)
  def zero(self, dt: DType) -> str: return lconst(0, dt)
  def lit(self, c: int) -> str: return str(c)
  def op(self, o: str, a: str, b: str) -> str:
    r = self.t(); self.emit(f"{r} = {self.code_for_idx[o](a, b)}"); return r

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

  # the renderer's hooks
  def range(self, v: Var, body): self.loop(v, "0", str(v.size), body)
  def read(self, pi: int, ix: str, ok: str | None) -> str:
    """Param pi at ix; under a mask `ok` the index is 0 where it is off (no access outside the buffer)."""
    p = self.k.params[pi]
    if ok is not None:
      y = self.t(); self.emit(f"{y} = select i1 {ok}, i64 {ix}, i64 0"); ix = y
    self.check(pi, ix)
    g = self.ptr(pi, ix)
    v = self.t("v")
    self.emit(f"{v} = load {MT[p.dtype.name]}, ptr {g}, align {p.align}")
    if p.dtype == dtypes.bool:
      y = self.t(); self.emit(f"{y} = icmp ne i8 {v}, 0"); v = y
    return v
  def acc_new(self, rop, dt: DType) -> str:
    acc = self.t("acc")
    self.allocas.append(f"{acc} = alloca {VT[dt.name]}")
    self.emit(f"store {VT[dt.name]} {reduce_init(rop, dt)}, ptr {acc}")
    return acc
  def acc_add(self, acc: str, rop, dt: DType, v: str):
    a, ty = self.t(), VT[dt.name]
    self.emit(f"{a} = load {ty}, ptr {acc}")
    r = self.alu(rop, dt, (dt, dt), [a, v], " reassoc nsz")   # float reductions do not vectorize without it
    self.emit(f"store {ty} {r}, ptr {acc}")
  def acc_get(self, acc: str, dt: DType) -> str:
    r = self.t("red"); self.emit(f"{r} = load {VT[dt.name]}, ptr {acc}"); return r

def reduce_init(rop, dt: DType) -> str:
  if rop is Ops.ADD: return lconst(0, dt)
  if rop is Ops.MUL: return lconst(1, dt)
  if dt.is_float(): return "0xFFF0000000000000" if dt == dtypes.float32 else "0xHFC00"
  if dt == dtypes.bool: return "false"
  if dt == dtypes.uint8: return "0"
  return str(-(1 << (8 * dt.itemsize - 1)))

def signature(k: Kernel, fname: str) -> str:
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

def noloop(decls: set) -> str:
  """`, !llvm.loop !N` for a latch branch: a loop the vectorizer and unroller leave alone (hand-written vector code or
  a scalar edge; compile time), with its metadata added to `decls`."""
  n = next(_LOOP_IDS)
  decls.add(f"!{n} = distinct !{{!{n}, !9001, !9002}}")
  decls |= {'!9001 = !{!"llvm.loop.vectorize.enable", i1 false}', '!9002 = !{!"llvm.loop.unroll.disable"}'}
  return f", !llvm.loop !{n}"
