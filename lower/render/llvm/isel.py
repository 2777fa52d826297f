"""Instruction selection for LLVM IR, written once for scalars (lower/render/llvm/function.py's LLVMRenderer) and <W x T> vectors
(lower/render/llvm/stream.py's VecRenderer): the value and memory types of every dtype, constants, and every ALU op, CAST and
BITCAST with lower/numeric.py's semantics, bit for bit (ints wrap, division by zero and out-of-range shifts and
float -> int casts are defined: LLVM's own forms are UB or poison there, so the edges are explicit selects).

bfloat16 is a float32 value in registers that always holds a bfloat16 (every op rounds to nearest even on the bits,
NaN to the canonical quiet NaN, as ml_dtypes) and an i16 in memory. float16 is LLVM's `half` (x86 computes it in
float and rounds after every op, as numpy). An fp8 is its i8 bits in registers and memory (so loads, stores, WHERE
and bitcasts move the bits, as numpy does): ops and casts decode it to float32 (exact), compute there and encode the
result with tinygrad's float_to_fp8 (nearest even, finite overflow saturating), as lower/numeric.py; the formats come
from egraph.ir.dtype.FP8."""
from __future__ import annotations
import struct
import numpy as np
from egraph.ir.dtype import DType, dtypes, FP8, to_fp8_bits
from egraph.ir.errors import UnsupportedOpError
from egraph.ir.ops import Ops
from egraph.ir.optable import THREEFRY_PARITY, THREEFRY_ROTATIONS, THREEFRY_GROUPS

VT = {"bool": "i1", "int8": "i8", "uint8": "i8", "int16": "i16", "uint16": "i16", "int32": "i32", "uint32": "i32",
      "int64": "i64", "uint64": "i64", "float16": "half", "bfloat16": "float", "float32": "float", "float64": "double",
      **{n: "i8" for n in FP8}}
MT = {**VT, "bool": "i8", "bfloat16": "i16"}     # in memory
SUF = {k: {"half": "f16", "float": "f32", "double": "f64"}.get(v, v) for k, v in VT.items()}
MSUF = {**SUF, "bool": "i8", "bfloat16": "i16"}   # masked loads/stores move bools and bfloat16s as their memory type

def lconst(v, dt: DType) -> str:
  """A constant of `dt` as LLVM spells it (ints wrap into the dtype, floats are rounded to it first)."""
  if dt == dtypes.bool: return "true" if v else "false"
  if dt.is_int():
    u = int(v) % (1 << dt.bits)
    return str(u - (1 << dt.bits) if u >> (dt.bits - 1) else u)
  if dt == dtypes.float16: return "0xH%04X" % int(np.array(v, np.float16).view(np.uint16))
  if dt in dtypes.fp8s: return str(int(to_fp8_bits(v, dt).view(np.int8)))
  with np.errstate(all="ignore"): x = float(np.array(v, dt.np).astype(np.float64))
  return "0x%016X" % struct.unpack("<Q", struct.pack("<d", x))[0]

def reg_size(dt: DType) -> int:
  """Bytes of a value of `dt` in a register (bfloat16 and fp8 compute as float32)."""
  return 4 if dt == dtypes.bfloat16 or dt in dtypes.fp8s else dt.itemsize

_FBIN = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}
_CMP = {Ops.CMPLT: ("fcmp olt", "icmp slt", "icmp ult"), Ops.CMPNE: ("fcmp une", "icmp ne", "icmp ne"),
        Ops.CMPEQ: ("fcmp oeq", "icmp eq", "icmp eq")}                    # float, signed, unsigned
_BOOL = {Ops.ADD: "or", Ops.SUB: "xor", Ops.MUL: "and", Ops.IDIV: "and", Ops.MAX: "or", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}
_EXP2_P = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3, 5.550332471162809e-2, 2.402264791363012e-1,
           6.931472028550421e-1, 1.0)   # 2**f on [-1/2, 1/2], Horner order (Cephes exp2f)
_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
          2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)   # ln(1 + t) = t - t^2/2 + t^3 P(t), Horner order (Cephes logf)
_FUN = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}
_EXACT = frozenset({Ops.MAX, Ops.NEG, Ops.TRUNC, Ops.WHERE, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})   # a bfloat16 in, one out

class Isel:
  """Instruction selection, written once for scalars and vectors. A subclass supplies t/emit/intrinsic and the
  spellings: ty(dt) the value type, mty(dt) the memory type, sfx(dt) an intrinsic's type suffix, cst(v, dt) a constant
  operand, zero(dt) a zero operand."""
  what = "render"
  # the ALU ops spelled here; the others are expanded into these by lower/schedule/decomp.py before rendering
  code_for_op = frozenset({Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.RECIPROCAL, Ops.SIN, Ops.TRUNC, Ops.ADD, Ops.SUB, Ops.MUL,
                         Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR,
                         Ops.WHERE, Ops.SHL, Ops.SHR, Ops.POW, Ops.THREEFRY})
  def alu(self, op, dt: DType, sdts: tuple, a: list, fflags: str = "") -> str:
    """`op` on the SSA values `a` (of dtypes `sdts`) giving a `dt`; `fflags` go on float add/mul (reduce combines)."""
    sdt = sdts[-1] if op is not Ops.WHERE else dt
    if op is Ops.CAST: return self.cast(sdts[0], dt, a[0])
    if op is Ops.BITCAST: return self.bitcast(sdts[0], dt, a[0])
    if (sdt in dtypes.fp8s or dt in dtypes.fp8s) and op is not Ops.WHERE:   # WHERE selects the bits
      f32 = dtypes.float32
      a = [self.fp8_decode(s, x) if s in dtypes.fp8s else x for s, x in zip(sdts, a)]
      r = self._alu(op, f32 if dt in dtypes.fp8s else dt, f32, a, fflags)
      return self.fp8_encode(dt, r) if dt in dtypes.fp8s else r
    r = self._alu(op, dt, sdt, a, fflags)
    return self.bf16_round(r) if dt == dtypes.bfloat16 and op not in _EXACT else r

  def _alu(self, op, dt: DType, sdt: DType, a: list, fflags: str) -> str:
    if op not in self.code_for_op: raise UnsupportedOpError(f"LLVM backend: {op.name} is not rendered (lower/schedule/decomp.py expands it)")
    ty, sty, bt, r, E = self.ty(dt), self.ty(sdt), self.ty(dtypes.bool), self.t(), self.emit
    if op is Ops.WHERE: E(f"{r} = select {bt} {a[0]}, {ty} {a[1]}, {ty} {a[2]}"); return r
    if op in _CMP:
      E(f"{r} = {_CMP[op][0 if sdt.is_float() else 1 if sdt.kind == 'i' else 2]} {sty} {a[0]}, {a[1]}"); return r
    if sdt == dtypes.bool:
      if op in (Ops.NEG, Ops.TRUNC): return a[0]
      if op is Ops.MOD:
        nb = self.t(); E(f"{nb} = xor {sty} {a[1]}, {self.cst(True, sdt)}"); E(f"{r} = and {sty} {a[0]}, {nb}"); return r
      if op in _BOOL: E(f"{r} = {_BOOL[op]} {sty} {a[0]}, {a[1]}"); return r
      raise UnsupportedOpError(f"LLVM backend: cannot {self.what} {op.name} on bool")
    if dt.is_float():
      if op in _FBIN: E(f"{r} = {_FBIN[op]}{fflags} {ty} {a[0]}, {a[1]}"); return r
      if op is Ops.NEG: E(f"{r} = fneg {ty} {a[0]}"); return r
      if op is Ops.RECIPROCAL: E(f"{r} = fdiv {ty} {self.cst(1.0, dt)}, {a[0]}"); return r
      if op is Ops.MAX: return self._call("maximum", dt, a[0], a[1])   # llvm.maximum propagates NaN, as np.maximum
      if op is Ops.POW: return self._call("pow", dt, a[0], a[1])       # C's pow, as np.power
      if op is Ops.EXP2 and VT[dt.name] == "float": return self.exp2f(a[0])
      if op is Ops.LOG2 and VT[dt.name] == "float": return self.log2f(a[0])
      if op in _FUN: return self._call(_FUN[op], dt, a[0])
      raise UnsupportedOpError(f"LLVM backend: cannot {self.what} {op.name} on {dt.name}")
    # integers: wrap like C
    signed, zero = dt.kind == 'i', self.zero(dt)
    if op is Ops.NEG: E(f"{r} = sub {ty} {zero}, {a[0]}"); return r
    if op is Ops.TRUNC: return a[0]
    if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR):
      E(f"{r} = {op.name.lower()} {ty} {a[0]}, {a[1]}"); return r
    if op is Ops.MAX: return self._call("smax" if signed else "umax", dt, a[0], a[1])
    if op in (Ops.IDIV, Ops.MOD):
      q, m = self.divmod(dt, a[0], a[1])
      return q if op is Ops.IDIV else m
    if op in (Ops.SHL, Ops.SHR): return self.shift(op, dt, a[0], a[1])
    if op is Ops.POW: return self.ipow(dt, a[0], a[1])
    if op is Ops.THREEFRY and dt == dtypes.uint64: return self.threefry(a[0], a[1])
    raise UnsupportedOpError(f"LLVM backend: cannot {self.what} {op.name} on {dt.name}")

  def divmod(self, dt: DType, x: str, y: str) -> tuple[str, str]:
    """C's x / y and x % y in `dt` with x / 0 = 0, x % 0 = x, MIN / -1 = MIN (LLVM's div/rem are UB there). Up to 32 bits
    the quotient is trunc(x / y) in float (<= 16 bits) or double: exact (the rounding error is below 1/|y|, the
    least distance of a non-integer x/y from an integer), and it vectorizes (x86 has no vector integer division)."""
    ty, bt, signed = self.ty(dt), self.ty(dtypes.bool), dt.kind == 'i'
    z = self._ins("icmp eq", ty, y, self.zero(dt))
    m1 = self._ins("icmp eq", ty, y, self.cst(-1, dt)) if signed else None
    bs = self._sel(self._ins("or", bt, z, m1) if signed else z, ty, self.cst(1, dt), y)
    if dt.itemsize <= 4:
      fdt = dtypes.float32 if dt.itemsize <= 2 else dtypes.float64
      ft, cv = self.ty(fdt), "sitofp" if signed else "uitofp"
      qf = self._ins("fdiv", ft, self._conv(cv, x, ty, ft), self._conv(cv, bs, ty, ft))
      q = self._conv("fptosi" if signed else "fptoui", qf, ft, ty)
    else: q = self._ins("sdiv" if signed else "udiv", ty, x, bs)
    if signed: q = self._sel(m1, ty, self._ins("sub", ty, self.zero(dt), x), q)
    q = self._sel(z, ty, self.zero(dt), q)
    return q, self._ins("sub", ty, x, self._ins("mul", ty, q, y))   # y = 0: q = 0, so x % 0 = x

  def shift(self, op, dt: DType, x: str, c: str) -> str:
    """x << c or x >> c (arithmetic for signed dtypes); a count outside [0, bits) gives 0, or -1 for SHR of a negative
    signed x (LLVM's shifts are poison there)."""
    ty = self.ty(dt)
    inside = self._ins("icmp ult", ty, c, self.cst(dt.bits, dt))
    if op is Ops.SHR and dt.kind == 'i': return self._ins("ashr", ty, x, self._sel(inside, ty, c, self.cst(dt.bits - 1, dt)))
    s = self._ins("shl" if op is Ops.SHL else "lshr", ty, x, self._sel(inside, ty, c, self.zero(dt)))
    return self._sel(inside, ty, s, self.zero(dt))

  def ipow(self, dt: DType, x: str, e: str) -> str:
    """x ** e wrapping in `dt` by square and multiply over e's bits (unrolled: it vectorizes); a negative e gives the
    truncated 1 / x ** -e: 1 for x = 1, +-1 for x = -1, else 0."""
    ty, signed = self.ty(dt), dt.kind == 'i'
    out, base = self.cst(1, dt), x
    for i in range(dt.bits - 1 if signed else dt.bits):
      if i: base = self._ins("mul", ty, base, base)
      bit = self._ins("icmp ne", ty, self._ins("and", ty, e, self.cst(1 << i, dt)), self.zero(dt))
      out = self._sel(bit, ty, self._ins("mul", ty, out, base), out)
    if not signed: return out
    one, m1 = self.cst(1, dt), self.cst(-1, dt)
    odd = self._ins("icmp ne", ty, self._ins("and", ty, e, one), self.zero(dt))
    neg = self._sel(self._ins("icmp eq", ty, x, one), ty, one,
                    self._sel(self._ins("icmp eq", ty, x, m1), ty, self._sel(odd, ty, m1, one), self.zero(dt)))
    return self._sel(self._ins("icmp slt", ty, e, self.zero(dt)), ty, neg, out)

  def threefry(self, x: str, key: str) -> str:
    """tinygrad's THREEFRY: Threefry-2x32 (20 rounds) of the uint64 counter x under the uint64 key, as
    lower/numeric.py's threefry2x32; rotations are llvm.fshl (one instruction, vectorizes)."""
    u32, u64 = dtypes.uint32, dtypes.uint64
    t32, t64 = self.ty(u32), self.ty(u64)
    add = lambda u, v: self._ins("add", t32, u, v)
    lo = lambda v: self._conv("trunc", v, t64, t32)
    hi = lambda v: lo(self._ins("lshr", t64, v, self.cst(32, u64)))
    x0, x1, k0, k1 = lo(x), hi(x), lo(key), hi(key)
    ks = [k1, self._ins("xor", t32, self._ins("xor", t32, k0, k1), self.cst(THREEFRY_PARITY, u32)), k0]
    a, b = add(x0, ks[2]), add(x1, ks[0])
    for i in range(THREEFRY_GROUPS):
      for r in THREEFRY_ROTATIONS[i % 2]:
        a = add(a, b)
        b = self._ins("xor", t32, a, self._call("fshl", u32, b, b, self.cst(r, u32)))
      a, b = add(a, ks[i % 3]), add(add(b, ks[(i + 1) % 3]), self.cst(i + 1, u32))
    hb = self._ins("shl", t64, self._conv("zext", b, t32, t64), self.cst(32, u64))
    return self._ins("or", t64, hb, self._conv("zext", a, t32, t64))

  # bfloat16: a float32 register value that holds a bfloat16; i16 bits in memory
  def bf16_round(self, x: str) -> str:
    """float32 x rounded to bfloat16 (nearest even on the bits, as ml_dtypes; NaN -> the quiet NaN of its sign)."""
    i32, ft, it = dtypes.int32, self.ty(dtypes.float32), self.ty(dtypes.int32)
    b = self._conv("bitcast", x, ft, it)
    lsb = self._ins("and", it, self._ins("lshr", it, b, self.cst(16, i32)), self.cst(1, i32))
    m = self._ins("and", it, self._ins("add", it, self._ins("add", it, b, self.cst(0x7FFF, i32)), lsb), self.cst(-65536, i32))
    nan = self._ins("or", it, self._ins("and", it, b, self.cst(-(1 << 31), i32)), self.cst(0x7FC00000, i32))
    return self._conv("bitcast", self._sel(self._ins("fcmp uno", ft, x, x), it, nan, m), it, ft)
  def bf16_bits(self, x: str) -> str:
    it = self.ty(dtypes.int32)
    b = self._ins("lshr", it, self._conv("bitcast", x, self.ty(dtypes.float32), it), self.cst(16, dtypes.int32))
    return self._conv("trunc", b, it, self.ty(dtypes.int16))
  def bf16_from_bits(self, v: str) -> str:
    it = self.ty(dtypes.int32)
    b = self._ins("shl", it, self._conv("zext", v, self.ty(dtypes.int16), it), self.cst(16, dtypes.int32))
    return self._conv("bitcast", b, it, self.ty(dtypes.float32))
  def to_bf16(self, src: DType, x: str) -> str:
    """A float of dtype `src` rounded to bfloat16 once (ml_dtypes rounds doubles directly)."""
    if src == dtypes.float16: x = self._conv("fpext", x, self.ty(src), self.ty(dtypes.float32))
    return self.bf16_round(self.f32_odd(x) if src == dtypes.float64 else x)
  def f32_odd(self, x: str) -> str:
    """double x to float rounded to odd (toward zero, the last bit set if inexact): rounding that once more to a
    format 2+ bits narrower (bfloat16, half) gives what rounding x directly would (no double rounding)."""
    dt, ft, it, i32 = self.ty(dtypes.float64), self.ty(dtypes.float32), self.ty(dtypes.int32), dtypes.int32
    f = self._conv("fptrunc", x, dt, ft)
    back = self._conv("fpext", f, ft, dt)
    away = self._ins("fcmp ogt", dt, self._call("fabs", dtypes.float64, back), self._call("fabs", dtypes.float64, x))
    fb = self._conv("bitcast", f, ft, it)
    fb = self._sel(away, it, self._ins("sub", it, fb, self.cst(1, i32)), fb)   # toward zero: one ulp back
    fb = self._sel(self._ins("fcmp une", dt, back, x), it, self._ins("or", it, fb, self.cst(1, i32)), fb)
    return self._conv("bitcast", fb, it, ft)

  # fp8: i8 bits, decoded to float32 for every op and cast
  def fp8_decode(self, dt: DType, v: str) -> str:
    """The fp8 bits v as the float32 they stand for (exact; NaN the quiet NaN of its sign, as ml_dtypes)."""
    f, i32 = FP8[dt.name], dtypes.int32
    it, ft, ic = self.ty(i32), self.ty(dtypes.float32), lambda c: self.cst(c, i32)
    b = self._conv("zext", v, self.ty(dt), it)
    mag, sign = self._ins("and", it, b, ic(0x7F)), self._ins("shl", it, self._ins("and", it, b, ic(0x80)), ic(24))
    # a normal is its bits moved into float32's fields and rebiased; exponent field 0: mantissa * 2**(emin - mant)
    norm = self._ins("add", it, self._ins("shl", it, mag, ic(23 - f.mant)), ic((127 - f.bias) << 23))
    sub = self._conv("bitcast", self._ins("fmul", ft, self._conv("uitofp", mag, it, ft), self.cst(2.0 ** (f.emin - f.mant), dtypes.float32)), ft, it)
    r = self._sel(self._ins("icmp ult", it, mag, ic(1 << f.mant)), it, sub, norm)
    if f.fnuz: nan = self._ins("icmp eq", it, b, ic(0x80))
    elif f.inf_bits == f.nan_bits: nan = self._ins("icmp eq", it, mag, ic(0x7F))   # e4m3: no inf, one NaN per sign
    else:   # IEEE-like: exponent all ones is inf (mantissa 0) or NaN
      nan = self._ins("icmp ugt", it, mag, ic(f.inf_bits))
      r = self._sel(self._ins("icmp eq", it, mag, ic(f.inf_bits)), it, ic(0x7F800000), r)
    r = self._sel(nan, it, ic(0x7FC00000), r)
    return self._conv("bitcast", self._ins("or", it, r, sign), it, ft)

  def fp8_encode(self, dt: DType, x: str) -> str:
    """float32 x as fp8 bits, as tinygrad's float_to_fp8: nearest even on the bits (subnormals by a longer shift),
    finite overflow saturating to the largest finite pattern, NaN and +-inf as egraph.ir.dtype.FP8 says, no -0 in fnuz."""
    f, i32 = FP8[dt.name], dtypes.int32
    it, ic, s = self.ty(i32), lambda c: self.cst(c, i32), 23 - f.mant
    b = self._conv("bitcast", x, self.ty(dtypes.float32), it)
    a = self._ins("and", it, b, ic(0x7FFFFFFF))
    eb = self._ins("sub", it, self._ins("lshr", it, a, ic(23)), ic(127 - f.bias))   # the fp8 biased exponent
    sub = self._ins("icmp slt", it, eb, ic(1))
    # normal: the rebiased bits, `s` low bits to round off; subnormal: the mantissa with its hidden bit, shifted
    # 1 - eb further (at most 31: below that everything rounds to 0, float32 subnormals too)
    base = self._sel(sub, it, self._ins("or", it, self._ins("and", it, a, ic(0x7FFFFF)), ic(0x800000)),
                     self._ins("sub", it, a, ic((127 - f.bias) << 23)))
    sh = self._sel(sub, it, self._call("smin", i32, self._ins("sub", it, ic(s + 1), eb), ic(31)), ic(s))
    r = self._ins("lshr", it, base, sh)
    rem = self._ins("sub", it, base, self._ins("shl", it, r, sh))
    half = self._ins("shl", it, ic(1), self._ins("sub", it, sh, ic(1)))
    bt = self.ty(dtypes.bool)
    tie_odd = self._ins("and", bt, self._ins("icmp eq", it, rem, half), self._conv("trunc", r, it, bt))
    up = self._ins("or", bt, self._ins("icmp ugt", it, rem, half), tie_odd)
    r = self._call("umin", i32, self._ins("add", it, r, self._conv("zext", up, bt, it)), ic(f.max_bits))
    r = self._sel(self._ins("icmp eq", it, a, ic(0x7F800000)), it, ic(f.inf_bits), r)
    r = self._sel(self._ins("icmp ugt", it, a, ic(0x7F800000)), it, ic(f.nan_bits), r)
    neg = self._ins("and", it, self._ins("lshr", it, b, ic(24)), ic(0x80))
    if f.fnuz: neg = self._sel(self._ins("icmp eq", it, r, ic(0)), it, ic(0), neg)   # no -0: 0x80 is NaN
    return self._conv("trunc", self._ins("or", it, r, neg), it, self.ty(dt))

  def to_f32(self, src: DType, x: str) -> str:
    """A value of `src` (not fp8) as float32, rounded once: doubles to odd, so the fp8 rounding after it is direct."""
    ft = self.ty(dtypes.float32)
    if src == dtypes.float64: return self.f32_odd(x)
    if src == dtypes.float16: return self._conv("fpext", x, self.ty(src), ft)
    if src.is_float(): return x   # float32, and bfloat16's register
    return self._conv("uitofp" if src.kind in 'ub' else "sitofp", x, self.ty(src), ft)   # exact below 2**24; above, saturated either way

  # memory
  def from_mem(self, dt: DType, v: str) -> str:
    """A value loaded as mty(dt) as a value of ty(dt)."""
    if dt == dtypes.bool: return self._ins("icmp ne", self.mty(dt), v, self.zero(dtypes.uint8))
    return self.bf16_from_bits(v) if dt == dtypes.bfloat16 else v
  def to_mem(self, dt: DType, v: str) -> str:
    if dt == dtypes.bool: return self._conv("zext", v, self.ty(dt), self.mty(dt))
    return self.bf16_bits(v) if dt == dtypes.bfloat16 else v

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

  def bitcast(self, src: DType, dst: DType, x: str) -> str:
    """The bits of x as `dst` (same itemsize; bool goes through CAST, the scheduler sees to that)."""
    if src == dst: return x
    if src == dtypes.bfloat16: x, src = self.bf16_bits(x), dtypes.int16
    if dst == dtypes.bfloat16:
      if src == dtypes.float16: x = self._conv("bitcast", x, self.ty(src), self.ty(dtypes.int16))
      return self.bf16_from_bits(x)
    return x if self.ty(src) == self.ty(dst) else self._conv("bitcast", x, self.ty(src), self.ty(dst))

  def cast(self, src: DType, dst: DType, x: str) -> str:
    """x converted to `dst` as lower/numeric.py's cast (float -> int: tinygrad's CPU device on x86-64)."""
    if src == dst: return x
    if src in dtypes.fp8s: x, src = self.fp8_decode(src, x), dtypes.float32
    if dst in dtypes.fp8s: return self.fp8_encode(dst, self.to_f32(src, x))
    st, dt = self.ty(src), self.ty(dst)
    if dst == dtypes.bool: return self._ins("fcmp une" if src.is_float() else "icmp ne", st, x, self.zero(src))
    if src == dtypes.bool: return self._conv("uitofp" if dst.is_float() else "zext", x, st, dt)
    if src.is_float() and dst.is_float():
      if dst == dtypes.bfloat16: return self.to_bf16(src, x)
      if st == dt: return x
      # double -> half: LLVM calls __truncdfhf2, which the JIT does not link; through float rounded to odd instead
      if src == dtypes.float64 and dst == dtypes.float16: x, st = self.f32_odd(x), self.ty(dtypes.float32)
      return self._conv("fpext" if reg_size(dst) > reg_size(src) else "fptrunc", x, st, dt)
    if src.is_float(): return self.float_to_int(src, dst, x)
    if dst.is_float():
      cv = "sitofp" if src.kind == 'i' else "uitofp"
      if dst == dtypes.float16:   # through float: exact below 2**24, inf either way above (no 64-bit int libcall)
        return self._conv("fptrunc", self._conv(cv, x, st, self.ty(dtypes.float32)), self.ty(dtypes.float32), dt)
      if dst != dtypes.bfloat16: return self._conv(cv, x, st, dt)
      return self.to_bf16(dtypes.float64, self._conv(cv, x, st, self.ty(dtypes.float64)))   # ml_dtypes: through double
    if dst.itemsize == src.itemsize: return x
    return self._conv(("sext" if src.kind == 'i' else "zext") if dst.itemsize > src.itemsize else "trunc", x, st, dt)

  def float_to_int(self, src: DType, dst: DType, x: str) -> str:
    """Truncation toward zero; to int32/int64 NaN and out-of-range give the minimum, to uint32/uint64 NaN, negatives and
    out-of-range the maximum; 8- and 16-bit ints go through int32 and keep the low bits (fptosi/fptoui are poison out
    of range: the selects pick a defined value there)."""
    if src == dtypes.float16: x, src = self._conv("fpext", x, self.ty(src), self.ty(dtypes.float32)), dtypes.float32
    ft, bt = self.ty(src), self.ty(dtypes.bool)
    fc = lambda v: self.cst(v, dtypes.float64 if VT[src.name] == "double" else dtypes.float32)
    if dst.kind == 'u' and dst.itemsize >= 4:
      ok = self._ins("and", bt, self._ins("fcmp ogt", ft, x, fc(-1.0)), self._ins("fcmp olt", ft, x, fc(2.0 ** dst.bits)))
      return self._sel(ok, self.ty(dst), self._conv("fptoui", x, ft, self.ty(dst)), self.cst(dst.max, dst))
    via = dst if dst.itemsize >= 4 else dtypes.int32
    lim = 2.0 ** (via.bits - 1)   # trunc(x) >= -lim iff x > -lim - 1; values in (-lim - 1, -lim) truncate to -lim anyway
    ok = self._ins("and", bt, self._ins("fcmp oge", ft, x, fc(-lim)), self._ins("fcmp olt", ft, x, fc(lim)))
    r = self._sel(ok, self.ty(via), self._conv("fptosi", x, ft, self.ty(via)), self.cst(via.min, via))
    return r if via == dst else self._conv("trunc", r, self.ty(via), self.ty(dst))
