"""Floor 6 (front end): tinygrad's dtype promotion and broadcasting for Tensor ops: the dtype of a Python scalar, a weak
scalar meeting a tensor, a value fitted to a dtype, constants broadcast to a shape, numpy-style right-aligned shapes,
and which Python scalars stay constants in the kernel (`specializes`) rather than become its arguments."""
from __future__ import annotations
import math, os
from egraph.ir.dtype import DType, dtypes
from egraph.ir.errors import ShapeError, DTypeError
from egraph.ir.ops import Node, const
from egraph.ir.symbolic import is_symbolic

def py_dtype(v) -> DType:
  """Default dtype of a Python scalar."""
  return dtypes.bool if isinstance(v, bool) else dtypes.default_int if isinstance(v, int) else dtypes.default_float

def weak_dtype(v, d: DType) -> DType:
  """Promotion of a tensor of dtype `d` with a weak Python scalar `v` (tinygrad): the tensor's dtype wins unless the
  scalar is of a higher kind (float scalar with an int/bool tensor, int scalar with a bool tensor)."""
  if isinstance(v, bool): return d
  if isinstance(v, int): return dtypes.default_int if d == dtypes.bool else d
  return d if d.is_float() else dtypes.default_float

def fit(v, d: DType):
  """A Python value representable in `d`: ints wrap like the hardware does (so ~x can use -1 for uint8)."""
  if d.kind == 'b': return bool(v)
  if d.kind in 'iu':
    try: v, bits = int(v), 8 * d.itemsize
    except (ValueError, OverflowError) as e: raise DTypeError(f"cannot represent {v!r} as {d.name}") from e
    v &= (1 << bits) - 1
    return v - (1 << bits) if d.kind == 'i' and v >= 1 << (bits - 1) else v
  return float(v)

def const_like(v, d: DType, device, shape: tuple[int, ...] = ()) -> Node:
  """A constant broadcast to `shape`: CONST reshaped to (1,)*ndim and expanded (EXPAND keeps rank)."""
  return const(fit(v, d), d, device).reshape((1,) * len(shape)).expand(shape)

# ---- Python scalars: kernel constants or kernel arguments ----------------------------------------------------------------
# A Python number meeting a tensor becomes a 1-element argument buffer (egraph/frontend/hostdata.py `scalar_node`), so a
# loop whose scalar changes compiles one kernel and hits every cache; these stay CONSTs, because their value is the code:
SPECIAL_VALUES = frozenset({0, 1, -1, 2, 0.5})   # x*1, x+0, x*-1, x*2, x*0.5, x-0 ...: folded or strength-reduced
CONST_OPS = frozenset({"POW", "IDIV", "MOD", "FLOORDIV", "FLOORMOD", "SHL", "SHR", "MULACC"})   # exponents, divisors, shifts
ARG_DTYPES = frozenset({dtypes.float32, dtypes.float64, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
                        dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64})   # numpy stores these as the kernel would
HOST_DEVICES = ("CPU", "PYTHON", "NPY")   # their buffers are host arrays: an argument is a realized buffer, no copy-in
SCALAR_MODES = ("args", "const")

def scalar_mode() -> str:
  """CALLSAT_SCALARS: "args" (default: scalars as kernel arguments, one kernel per structure) or "const" (every scalar
  a constant in the kernel: a new value compiles a new kernel). Read when a scalar enters a graph."""
  m = os.environ.get("CALLSAT_SCALARS") or "args"
  if m not in SCALAR_MODES: raise DTypeError(f"CALLSAT_SCALARS must be one of {SCALAR_MODES}, got {m!r}")
  return m

def specializes(v, d: DType, device, op: str = "") -> bool:
  """Does the scalar v (fitted to d) stay a constant in the kernel? Yes for bools and SPECIAL_VALUES, for the operands of
  CONST_OPS and of an integer division, for dtypes numpy does not store bit-exactly as callsat's kernels round (half, bfloat16, fp8: their
  CONSTs round as the kernel does), on no device (a pure-constant expression), several devices or a device that is
  not host memory (DISK, CUDA: HOST_DEVICES), and when
  CALLSAT_SCALARS=const; an inf or nan is an argument like any other value."""
  if isinstance(v, bool) or d not in ARG_DTYPES or op in CONST_OPS or op == "FDIV" and not d.is_float(): return True
  if not isinstance(device, str) or device.partition(":")[0] not in HOST_DEVICES: return True
  if (math.isfinite(v) if isinstance(v, float) else True) and v in SPECIAL_VALUES: return True
  return scalar_mode() == "const"

def broadcast_shape(*shapes: tuple[int, ...], op: str) -> tuple[int, ...]:
  nd = max(len(s) for s in shapes)
  out = []
  for sizes in zip(*[(1,) * (nd - len(s)) + tuple(s) for s in shapes]):
    big = {s for s in sizes if s != 1 or is_symbolic(s)}   # a symbolic dim never broadcasts, even when bound to 1
    if len(big) > 1: raise ShapeError(f"{op}: cannot broadcast shapes {' and '.join(str(tuple(s)) for s in shapes)}")
    out.append(big.pop() if big else 1)
  return tuple(out)

def broadcast_to(n: Node, shape: tuple[int, ...]) -> Node:
  return n.reshape((1,) * (len(shape) - len(n.shape)) + n.shape).expand(shape)
