"""dtypes and tinygrad 0.14's promotion lattice (Python scalars are weak). bfloat16 lives on the host as ml_dtypes'
bfloat16 (a numpy extension type: arithmetic rounds to bfloat16 after every op, as tinygrad's CPU device does)."""
from __future__ import annotations
from dataclasses import dataclass
import ml_dtypes
import numpy as np
from egraph.errors import DTypeError

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
_NP = {"bool": np.dtype(np.bool_), "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8), "int16": np.dtype(np.int16),
       "uint16": np.dtype(np.uint16), "int32": np.dtype(np.int32), "uint32": np.dtype(np.uint32),
       "int64": np.dtype(np.int64), "uint64": np.dtype(np.uint64), "float16": np.dtype(np.float16),
       "bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
_FINFO = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}

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
  float16 = DType("float16", 2, 'f', 12)
  bfloat16 = DType("bfloat16", 2, 'f', 13)
  float32 = DType("float32", 4, 'f', 14)
  float64 = DType("float64", 8, 'f', 15)
  char, uchar, short, ushort, int, uint, long, ulong = int8, uint8, int16, uint16, int32, uint32, int64, uint64
  half, float, double = float16, float32, float64
  default_float, default_int = float32, int32
  all = (bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, float64)
  ints = (int8, uint8, int16, uint16, int32, uint32, int64, uint64)
  floats = (float16, bfloat16, float32, float64)

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
                                              "long": dtypes.int64, "ulong": dtypes.uint64}
_BY_NP = {d.np: d for d in dtypes.all}

# tinygrad 0.14's promotion lattice without its weak and fp8 types (an edge through weakint or weakfloat is kept as
# the edge it stands for): bool < int8, uint8; the signed ints and the unsigned ints climb to int64 / uint64, which
# both promote to float16 and bfloat16; those to float32, then float64
_LATTICE = {dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,),
            dtypes.int32: (dtypes.int64,), dtypes.int64: (dtypes.float16, dtypes.bfloat16),
            dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
            dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
            dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,),
            dtypes.float64: ()}

def _ancestors(d: DType) -> set[DType]:
  out, todo = {d}, [d]
  while todo:
    for p in _LATTICE[todo.pop()]:
      if p not in out: out.add(p); todo.append(p)
  return out

def least_upper_dtype(*ds: DType) -> DType:
  """The smallest dtype every argument promotes to (tinygrad's least_upper_dtype). Where tinygrad's answer is its weak
  float (int64 with uint64: their only common ancestors are floats), this is the default float."""
  best = min(set.intersection(*(_ancestors(d) for d in ds)), key=lambda d: d.priority)
  return dtypes.default_float if best.is_float() and not any(d.is_float() for d in ds) else best

def least_upper_float(d: DType) -> DType:
  return d if d.is_float() else least_upper_dtype(d, dtypes.default_float)

def sum_acc_dtype(d: DType) -> DType:
  """Accumulation dtype of sum() (tinygrad): unsigned ints in uint32 or wider, other ints and bool in int32 or wider,
  floats in float32 or wider."""
  if d.is_unsigned(): return least_upper_dtype(d, dtypes.uint32)
  if d.is_int() or d == dtypes.bool: return least_upper_dtype(d, dtypes.int32)
  return least_upper_dtype(d, dtypes.float32)
