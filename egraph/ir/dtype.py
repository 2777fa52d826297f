"""dtypes and tinygrad 0.14's promotion lattice (Python scalars are weak). bfloat16 lives on the host as ml_dtypes'
bfloat16 (a numpy extension type: arithmetic rounds to bfloat16 after every op, as tinygrad's CPU device does).

The four fp8 dtypes live on the host as ml_dtypes' float8 types (fp8e4m3 is float8_e4m3fn: no inf, NaN 0x7f/0xff; the
fnuz types have no -0, NaN 0x80), but a value enters them only through `to_fp8_bits`, tinygrad's float_to_fp8: round
to nearest even, finite overflow saturates to the largest finite value (ml_dtypes gives NaN or inf there), inf and NaN
as FP8 says. `as_np` is the one host conversion into any dtype; lower/numeric.py computes fp8 ops in float32."""
from __future__ import annotations
from dataclasses import dataclass
import ml_dtypes
import numpy as np
from egraph.ir.errors import DTypeError

@dataclass(frozen=True, eq=False)
class DType:
  """Interned: equal fields give the same object (construction, copy and pickle alike), so equality is identity and
  hashing is C-level (a hash-cons key holds a dtype: the dataclass __hash__ was a Python call per lookup)."""
  name: str
  itemsize: int
  kind: str          # 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'v' void
  priority: int      # tinygrad's: promotion picks the least common ancestor with the lowest priority
  def __new__(cls, name: str, itemsize: int, kind: str, priority: int):
    if (d := _INTERNED.get(k := (name, itemsize, kind, priority))) is None: d = _INTERNED[k] = object.__new__(cls)
    return d
  def __reduce__(self): return (DType, (self.name, self.itemsize, self.kind, self.priority))
  def __repr__(self): return f"dtypes.{self.name}"
  @property
  def np(self): return None if self.kind == 'v' else _NP[self.name]
  @property
  def bits(self) -> int: return 8 * self.itemsize
  def is_float(self): return self.kind == 'f'
  def is_int(self): return self.kind in 'iu'
  def is_unsigned(self): return self.kind == 'u'
  def bounds(self) -> tuple:
    """(smallest, largest) value of an int or bool dtype."""
    if self.kind == 'b': return False, True
    if self.kind == 'u': return 0, (1 << self.bits) - 1
    if self.kind == 'i': return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
    raise DTypeError(f"{self.name}: min and max are defined for ints and bool")
  @property
  def min(self): return self.bounds()[0]
  @property
  def max(self): return self.bounds()[1]
  def finfo(self) -> tuple[int, int]:
    """(exponent bits, mantissa bits) of a float dtype."""
    if (f := _FINFO.get(self.name)) is None: raise DTypeError(f"{self.name}: finfo is defined for floats")
    return f

_INTERNED: dict[tuple, DType] = {}
_F8 = {"fp8e4m3": ml_dtypes.float8_e4m3fn, "fp8e5m2": ml_dtypes.float8_e5m2, "fp8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
       "fp8e5m2fnuz": ml_dtypes.float8_e5m2fnuz}
_NP = {"bool": np.dtype(np.bool_), "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8), "int16": np.dtype(np.int16),
       "uint16": np.dtype(np.uint16), "int32": np.dtype(np.int32), "uint32": np.dtype(np.uint32),
       "int64": np.dtype(np.int64), "uint64": np.dtype(np.uint64), "float16": np.dtype(np.float16),
       "bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
       **{k: np.dtype(v) for k, v in _F8.items()}}
_FINFO = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52), "fp8e4m3": (4, 3),
          "fp8e5m2": (5, 2), "fp8e4m3fnuz": (4, 3), "fp8e5m2fnuz": (5, 2)}

class dtypes:
  void = DType("void", 0, 'v', -1)
  bool = DType("bool", 1, 'b', 0)
  int8 = DType("int8", 1, 'i', 1)
  uint8 = DType("uint8", 1, 'u', 2)
  int16 = DType("int16", 2, 'i', 3)
  uint16 = DType("uint16", 2, 'u', 4)
  int32 = DType("int32", 4, 'i', 5)
  uint32 = DType("uint32", 4, 'u', 6)
  int64 = DType("int64", 8, 'i', 7)
  uint64 = DType("uint64", 8, 'u', 8)
  fp8e4m3 = DType("fp8e4m3", 1, 'f', 10)
  fp8e5m2 = DType("fp8e5m2", 1, 'f', 11)
  fp8e4m3fnuz = DType("fp8e4m3fnuz", 1, 'f', 10)
  fp8e5m2fnuz = DType("fp8e5m2fnuz", 1, 'f', 11)
  float16 = DType("float16", 2, 'f', 12)
  bfloat16 = DType("bfloat16", 2, 'f', 13)
  float32 = DType("float32", 4, 'f', 14)
  float64 = DType("float64", 8, 'f', 15)
  char, uchar, short, ushort, int, uint, long, ulong = int8, uint8, int16, uint16, int32, uint32, int64, uint64
  half, float, double = float16, float32, float64
  default_float, default_int = float32, int32
  fp8s = (fp8e4m3, fp8e5m2, fp8e4m3fnuz, fp8e5m2fnuz)
  all = (bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, *fp8s, float16, bfloat16, float32, float64)
  ints = (int8, uint8, int16, uint16, int32, uint32, int64, uint64)
  floats = (*fp8s, float16, bfloat16, float32, float64)

  @staticmethod
  def from_any(x) -> DType:
    """A DType from a DType, a name ('float32', 'float', 'double'), a numpy dtype or a Python type."""
    if isinstance(x, DType): return x
    if x is float: return dtypes.float32
    if x is int: return dtypes.int32
    if x is bool: return dtypes.bool
    if isinstance(x, str) and x in _BY_NAME: return _BY_NAME[x]
    try: npd = np.dtype(x)
    except TypeError: npd = None
    if npd is not None and (d := _BY_NP.get(npd)) is not None: return d
    raise DTypeError(f"unknown dtype {x!r}; supported: {', '.join(d.name for d in dtypes.all)}")

  @staticmethod
  def from_numpy(npd) -> DType:
    """The dtype of a numpy array's dtype: every numpy dtype that has a tinygrad dtype keeps it."""
    npd = np.dtype(npd)
    if (d := _BY_NP.get(npd)) is not None: return d
    raise DTypeError(f"numpy dtype {npd} has no tinygrad dtype; supported: {', '.join(d.name for d in dtypes.all)}")

_BY_NAME = {d.name: d for d in dtypes.all} | {"float": dtypes.float32, "int": dtypes.int32, "half": dtypes.float16,
                                              "double": dtypes.float64, "char": dtypes.int8, "uchar": dtypes.uint8,
                                              "short": dtypes.int16, "ushort": dtypes.uint16, "uint": dtypes.uint32,
                                              "long": dtypes.int64, "ulong": dtypes.uint64,
                                              **{f"float8_{n[3:]}": getattr(dtypes, n) for n in _F8}}   # tinygrad's .name
_BY_NP = {d.np: d for d in dtypes.all}

# tinygrad 0.14's promotion lattice without its weak types (an edge through weakint or weakfloat is kept as the edge it
# stands for): bool < int8, uint8; the signed ints and the unsigned ints climb to int64 / uint64, which both promote to
# the four fp8s; those to float16 and bfloat16; those to float32, then float64
_LATTICE = {dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,),
            dtypes.int32: (dtypes.int64,), dtypes.int64: dtypes.fp8s,
            dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
            dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: dtypes.fp8s,
            **{f: (dtypes.float16, dtypes.bfloat16) for f in dtypes.fp8s},
            dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,),
            dtypes.float64: ()}

def _ancestors(d: DType) -> set[DType]:
  out, todo = {d}, [d]
  while todo:
    for p in _LATTICE[todo.pop()]:
      if p not in out: out.add(p); todo.append(p)
  return out

_LUB: dict = {}   # (up to 3 dtypes, the default float) -> least_upper_dtype: every binary op asks (a finite table)

def least_upper_dtype(*ds: DType) -> DType:
  """The smallest dtype every argument promotes to (tinygrad's least_upper_dtype). Where tinygrad's answer is its weak
  float (int64 with uint64: their only common ancestors are floats), this is the default float."""
  if len(ds) > 3: return _lub(ds)
  if (got := _LUB.get(key := (ds, dtypes.default_float))) is None: got = _LUB[key] = _lub(ds)
  return got

def _lub(ds: tuple) -> DType:
  best = min(set.intersection(*(_ancestors(d) for d in ds)), key=lambda d: (d.priority, d.name))   # fp8s tie: by name
  return dtypes.default_float if best.is_float() and not any(d.is_float() for d in ds) else best

def least_upper_float(d: DType) -> DType:
  return d if d.is_float() else least_upper_dtype(d, dtypes.default_float)

def sum_acc_dtype(d: DType) -> DType:
  """Accumulation dtype of sum() (tinygrad): unsigned ints in uint32 or wider, other ints and bool in int32 or wider,
  floats in float32 or wider."""
  if d.is_unsigned(): return least_upper_dtype(d, dtypes.uint32)
  if d.is_int() or d == dtypes.bool: return least_upper_dtype(d, dtypes.int32)
  return least_upper_dtype(d, dtypes.float32)

# ---------------------------------------------------------------------------------------------------------------------
# fp8: tinygrad 0.14's float_to_fp8 / fp8_to_float semantics (the LLVM and CUDA backends read the same table)

@dataclass(frozen=True)
class Fp8Format:
  """An fp8 format: `mant` mantissa bits, exponent `bias`, `max_bits` the largest finite pattern (where finite overflow
  saturates), `nan_bits` / `inf_bits` the pattern NaN / +-inf become before the sign is OR'ed in (0x80 | sign is 0x80:
  the fnuz types' one NaN needs no case of its own), `fnuz`: 0x80 is NaN, so nothing rounds to -0."""
  mant: int
  bias: int
  max_bits: int
  nan_bits: int
  inf_bits: int
  fnuz: bool
  @property
  def emin(self) -> int: return 1 - self.bias   # exponent of the smallest normal
  @property
  def exp_bits(self) -> int: return 7 - self.mant

FP8 = {"fp8e4m3": Fp8Format(3, 7, 0x7E, 0x7F, 0x7F, False), "fp8e5m2": Fp8Format(2, 15, 0x7B, 0x7F, 0x7C, False),
       "fp8e4m3fnuz": Fp8Format(3, 8, 0x7F, 0x80, 0x80, True), "fp8e5m2fnuz": Fp8Format(2, 16, 0x7F, 0x80, 0x80, True)}

def to_fp8_bits(x, dt: DType) -> np.ndarray:
  """The uint8 patterns of values x (any real numbers, rounded to float64 first as tinygrad's float(x)) in fp8 dtype
  `dt`: round to nearest even, subnormals kept, finite overflow saturating to the largest finite value."""
  if (f := FP8.get(dt.name)) is None: raise DTypeError(f"{dt.name} is not an fp8 dtype")
  x = np.asarray(x).astype(np.float64)
  a = np.abs(x)
  with np.errstate(all="ignore"):
    # q: the exponent of the fp8 spacing around a (fixed below the normals); above 2**(emin+40) every value saturates
    q = np.clip(np.frexp(a)[1] - 1, f.emin, f.emin + 40) - f.mant
    count = np.rint(np.ldexp(a, -q))   # exact scaling, then round half to even: the mantissa with its hidden bit
    # (exponent field << mant) + mantissa; a rounding carry into the next binade adds up by itself (0 has frexp's
    # exponent 0, not a binade: count 0 is the pattern 0)
    bits = np.where(count == 0, 0.0, np.minimum((q + f.mant - f.emin) * float(1 << f.mant) + count, f.max_bits))
  bits = np.where(np.isnan(x), f.nan_bits, np.where(np.isinf(x), f.inf_bits, bits)).astype(np.uint8)
  neg = np.signbit(x) & ~(f.fnuz & (bits == 0))
  return bits | (neg.astype(np.uint8) << np.uint8(7))

def as_np(x, dt: DType) -> np.ndarray:
  """x (numbers or an array) as a numpy array of dt's host type: into fp8 as tinygrad rounds (to_fp8_bits), else
  numpy's conversion. An array already of that type is returned as is."""
  if isinstance(x, np.ndarray) and x.dtype == dt.np: return x
  if dt.name in FP8: return to_fp8_bits(x, dt).view(dt.np)
  return np.asarray(x).astype(dt.np, copy=False)
