"""The elementwise semantics of every op and cast over every dtype, in numpy: what the reference executor computes and
what the native kernels must match (notes/semantics.md, "Integers, casts and new ops", says why each rule is so).

Integers wrap in their dtype. Division by zero is defined: IDIV gives 0 (FLOORDIV 0, or -1 for a negative dividend, as
tinygrad's decomposition gives), MOD/FLOORMOD give the dividend.
Shifts by a count outside [0, bits) give 0 (SHL, and SHR of a non-negative value) or -1 (SHR of a negative value).
Float -> int casts follow tinygrad's CPU device on x86-64: to int32/int64 a NaN or out-of-range value gives the
dtype's minimum; to uint32/uint64 (and anything negative) its maximum; int8/int16/uint8/uint16 go through int32 and
keep the low bits. bfloat16 and float16 arithmetic rounds to the dtype after every op (ml_dtypes / numpy). fp8 ops
compute in float32 and round back after every op, casts into fp8 as tinygrad's float_to_fp8 (egraph.ir.dtype.as_np:
nearest even, saturating): ml_dtypes' own fp8 arithmetic overflows to NaN/inf instead."""
from __future__ import annotations
import numpy as np
from egraph.ir.dtype import DType, dtypes, as_np
from egraph.ir.errors import DTypeError
from egraph.ir.ops import Ops, GroupOp
from egraph.ir.optable import THREEFRY_PARITY, THREEFRY_ROTATIONS, THREEFRY_GROUPS

def _udt_np(d: np.dtype) -> np.dtype: return np.dtype(f"u{d.itemsize}")

def wrap_const(v, dt: DType) -> np.ndarray:
  """A scalar of `dt` as a 0-d array; ints wrap like C."""
  if dt.is_int(): return np.array(int(v) % (1 << dt.bits), dtype=_udt_np(dt.np)).view(dt.np)
  return as_np(v, dt)

def cdivmod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """C division (truncating) and remainder (sign of the dividend); x / 0 = 0 and x % 0 = x; INT_MIN / -1 wraps."""
  zero = b == 0
  bs = np.where(zero, np.ones_like(b), b)
  with np.errstate(all="ignore"):
    r = np.fmod(a, bs)
    q = (a - r) // bs       # exact, so floor == trunc
  return np.where(zero, np.zeros_like(q), q), np.where(zero, a, r)

def floordivmod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Python's floor division and modulo (tinygrad's FLOORDIV/FLOORMOD) built from C's as tinygrad decomposes them:
  x // 0 is 0 for x >= 0 and -1 for x < 0, x % 0 = x."""
  q, r = cdivmod(a, b)
  if a.dtype.kind == 'u': return q, r
  fix = (r != 0) & ((a < 0) != (b < 0))     # tinygrad's decomposition: so x // 0 is -1 for x < 0, as on its devices
  with np.errstate(all="ignore"):
    return np.where(fix, q - np.ones_like(q), q), np.where(fix, r + b, r)

def _shift(a: np.ndarray, c: np.ndarray, left: bool) -> np.ndarray:
  u = _udt_np(a.dtype)
  inside = (c >= 0) & (c < a.dtype.itemsize * 8)
  cs = np.where(inside, c, np.zeros_like(c)).astype(u)
  with np.errstate(all="ignore"):
    if left: out = (np.asarray(a).astype(u) << cs).astype(a.dtype)
    else: out = a >> cs.astype(a.dtype)          # arithmetic for signed dtypes
  fill = np.where(a < 0, np.full_like(a, -1), np.zeros_like(a)) if (not left and a.dtype.kind == 'i') else np.zeros_like(a)
  return np.where(inside, out, fill)

def int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """a ** b in a's int dtype, wrapping; a negative exponent gives the truncated 1 / a**-b (1, +-1 for a = -1, else 0)."""
  neg = b < 0 if b.dtype.kind == 'i' else np.zeros(b.shape, bool)
  e = np.where(neg, np.zeros_like(b), b).astype(np.uint64)
  u = a.astype(_udt_np(a.dtype))
  out, base = np.ones_like(u), u.copy()
  with np.errstate(all="ignore"):
    while np.any(e):    # square and multiply: <= 64 rounds
      out = np.where(e & 1, out * base, out)
      base, e = base * base, e >> np.uint64(1)
  out = out.view(a.dtype)
  if a.dtype.kind == 'i':
    one = np.ones_like(a)
    out = np.where(neg, np.where(a == 1, one, np.where(a == -1, np.where(b % 2 == 0, one, -one), np.zeros_like(a))), out)
  return out

def threefry2x32(x: np.ndarray, key: np.ndarray) -> np.ndarray:
  """tinygrad's THREEFRY (Threefry-2x32, 20 rounds) of uint64 counters under uint64 keys, bit for bit."""
  u32 = np.uint32
  x, key = np.asarray(x, np.uint64), np.asarray(key, np.uint64)
  x0, x1 = x.astype(u32), (x >> np.uint64(32)).astype(u32)
  k0, k1 = key.astype(u32), (key >> np.uint64(32)).astype(u32)
  ks = [k1, k0 ^ k1 ^ u32(THREEFRY_PARITY), k0]
  rot = THREEFRY_ROTATIONS
  with np.errstate(all="ignore"):
    a, b = x0 + ks[2], x1 + ks[0]
    for i in range(THREEFRY_GROUPS):
      for r in rot[i % 2]:
        a = a + b
        b = a ^ ((b << u32(r)) + (b >> u32(32 - r)))
      a, b = a + ks[i % 3], b + ks[(i + 1) % 3] + u32(i + 1)
  return (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)

def float_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  with np.errstate(all="ignore"): return np.power(a, b)

_UNARY = {Ops.NEG: np.negative, Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SQRT: np.sqrt, Ops.RECIPROCAL: np.reciprocal,
          Ops.SIN: np.sin}
_BINARY = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.true_divide, Ops.MAX: np.maximum,
           Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
           Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
           Ops.IDIV: lambda a, b: cdivmod(a, b)[0], Ops.MOD: lambda a, b: cdivmod(a, b)[1],
           Ops.FLOORDIV: lambda a, b: floordivmod(a, b)[0], Ops.FLOORMOD: lambda a, b: floordivmod(a, b)[1],
           Ops.SHL: lambda a, b: _shift(a, b, True), Ops.SHR: lambda a, b: _shift(a, b, False),
           Ops.THREEFRY: threefry2x32}
_BOOL_VIA_INT = frozenset({Ops.NEG, Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD})

def alu(op: Ops, dt: DType, *xs: np.ndarray) -> np.ndarray:
  """One ALU op; `dt` is the dtype of its (last) operand."""
  if op is Ops.WHERE: return np.where(*xs)
  if op is Ops.MULACC: return alu(Ops.ADD, dt, alu(Ops.MUL, dt, xs[0], xs[1]), xs[2])   # two roundings, fp8 too
  if dt in dtypes.fp8s:   # in float32 (exact for fp8 operands), then rounded back as tinygrad's float_to_fp8
    r = alu(op, dtypes.float32, *(x.astype(np.float32) for x in xs))
    return r if r.dtype == np.bool_ else as_np(r, dt)
  if op in GroupOp.FloatOnly and not dt.is_float(): raise DTypeError(f"{op.name}: needs a float dtype, got {dt.name}")
  if op is Ops.TRUNC: return np.trunc(xs[0]) if dt.is_float() else xs[0].copy()
  if op is Ops.POW: return float_pow(*xs) if dt.is_float() else int_pow(*xs)
  f = _UNARY[op] if op in GroupOp.Unary else _BINARY[op]
  if dt == dtypes.bool and op in _BOOL_VIA_INT: return f(*(x.astype(np.uint8) for x in xs)) != 0
  with np.errstate(all="ignore"): return f(*xs)

def cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """x (of dtype src) converted to dst, with the float -> int rules of tinygrad's CPU device."""
  if dst == dtypes.bool: return np.asarray(x) != 0
  if src in dtypes.fp8s: x, src = np.asarray(x).astype(np.float32), dtypes.float32   # exact
  if dst in dtypes.fp8s: return as_np(x, dst)
  if not (src.is_float() and dst.is_int()):
    with np.errstate(all="ignore"): return np.asarray(x).astype(dst.np)
  f = np.asarray(x).astype(np.float64)
  with np.errstate(all="ignore"):
    t = np.trunc(f)
    if dst.kind == 'u' and dst.itemsize >= 4:
      bad = np.isnan(f) | (t < 0) | (t >= 2.0 ** dst.bits)   # a float bound: 2**64 - 1 is not a float64
      return np.where(bad, np.array(dst.max, dst.np), np.where(bad, 0, t).astype(dst.np))
    via = dst if dst.itemsize >= 4 else dtypes.int32
    bad = np.isnan(f) | (t < via.min) | (t > via.max)
    # float64 cannot hold int64's max: 2**63 compares equal to it, so test the bound in floats
    if via == dtypes.int64: bad |= t >= 2.0 ** 63
    out = np.where(bad, np.array(via.min, via.np), np.where(bad, 0, t).astype(via.np))
  return out.astype(dst.np)
