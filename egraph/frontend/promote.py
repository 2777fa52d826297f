"""Floor 6 (front end): tinygrad's dtype promotion and broadcasting for Tensor ops: the dtype of a Python scalar, a weak
scalar meeting a tensor, a value fitted to a dtype, constants broadcast to a shape, numpy-style right-aligned shapes."""
from __future__ import annotations
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
