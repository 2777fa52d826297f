"""dtypes and tinygrad's promotion lattice (Python scalars are weak)."""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np
from egraph.errors import DTypeError

@dataclass(frozen=True, eq=True)
class DType:
  name: str
  itemsize: int
  kind: str          # 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'v' void
  priority: int
  def __repr__(self): return f"dtypes.{self.name}"
  @property
  def np(self): return None if self.kind == 'v' else np.dtype(_NP_NAMES[self.name])
  def is_float(self): return self.kind == 'f'
  def is_int(self): return self.kind in 'iu'

_NP_NAMES = {"bool": "bool", "uint8": "uint8", "int32": "int32", "int64": "int64", "float16": "float16", "float32": "float32"}

class dtypes:
  void = DType("void", 0, 'v', -1)
  bool = DType("bool", 1, 'b', 0)
  uint8 = DType("uint8", 1, 'u', 1)
  int32 = DType("int32", 4, 'i', 5)
  int64 = DType("int64", 8, 'i', 7)
  float16 = DType("float16", 2, 'f', 9)
  float32 = DType("float32", 4, 'f', 11)
  int, float, half, uchar, long = int32, float32, float16, uint8, int64
  default_float, default_int = float32, int32
  all = (bool, uint8, int32, int64, float16, float32)

  @staticmethod
  def from_any(x) -> DType:
    """A DType from a DType, a name ('float32', 'float'), a numpy dtype or a Python type."""
    if isinstance(x, DType): return x
    if x is float: return dtypes.float32
    if x is int: return dtypes.int32
    if x is bool: return dtypes.bool
    if isinstance(x, str) and x in _BY_NAME: return _BY_NAME[x]
    try: npd = np.dtype(x)
    except TypeError: npd = None
    if npd is not None and npd.name in _BY_NAME: return _BY_NAME[npd.name]
    if npd is not None and npd.name == "float64": return dtypes.float32
    raise DTypeError(f"unknown dtype {x!r}; supported: {', '.join(d.name for d in dtypes.all)}")

  @staticmethod
  def from_numpy(npd) -> DType:
    npd = np.dtype(npd)
    if npd.name == "float64": return dtypes.float32
    if npd.kind in "iu" and npd.name not in _BY_NAME: return dtypes.int64 if npd.itemsize > 4 or npd.kind == 'u' else dtypes.int32
    return dtypes.from_any(npd)

_BY_NAME = {d.name: d for d in dtypes.all} | {"float": dtypes.float32, "int": dtypes.int32, "half": dtypes.float16,
                                              "uchar": dtypes.uint8, "long": dtypes.int64}

# tinygrad's promotion lattice restricted to our dtypes: bool < uint8 < int32 < int64 < float16 < float32
_LATTICE = {dtypes.bool: (dtypes.uint8,), dtypes.uint8: (dtypes.int32,), dtypes.int32: (dtypes.int64,),
            dtypes.int64: (dtypes.float16,), dtypes.float16: (dtypes.float32,), dtypes.float32: ()}

def _ancestors(d: DType) -> set[DType]:
  out, todo = {d}, [d]
  while todo:
    for p in _LATTICE[todo.pop()]:
      if p not in out: out.add(p); todo.append(p)
  return out

def least_upper_dtype(*ds: DType) -> DType:
  """The smallest dtype every argument promotes to (tinygrad's least_upper_dtype)."""
  common = set.intersection(*(_ancestors(d) for d in ds))
  return min(common, key=lambda d: d.priority)

def sum_acc_dtype(d: DType) -> DType:
  """Accumulation dtype of sum(): small ints accumulate in int32, as in tinygrad."""
  if d.kind in 'bu' or (d.kind == 'i' and d.itemsize < 4): return dtypes.int32
  return d
