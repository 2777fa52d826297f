"""Strided views: is a movement chain over storage one contiguous element range? (spec §2 contiguous_view_offset)"""
from __future__ import annotations
import math
import numpy as np
from egraph.ir.ops import Node, Ops, GroupOp
from egraph.ir.symbolic import is_symbolic

ENUMERATE_LIMIT = 1 << 18   # base elements up to which a chain strides cannot follow (a PAD, a splitting reshape) is enumerated

NP_MOVE = {Ops.RESHAPE: lambda m, x: x.reshape(m.arg), Ops.EXPAND: lambda m, x: np.broadcast_to(x, m.arg),
            Ops.PAD: lambda m, x: np.pad(x, m.arg, constant_values=-1), Ops.PERMUTE: lambda m, x: x.transpose(m.arg),
            Ops.SHRINK: lambda m, x: x[tuple(slice(a, b) for a, b in m.arg)], Ops.DETACH: lambda m, x: x,
            Ops.FLIP: lambda m, x: x[tuple(slice(None, None, -1) if f else slice(None) for f in m.arg)]}

def view_index(x: Node, base: Node | None = None) -> np.ndarray:
  """The flat element index into `base` (default: x.base) of each element of the movement chain x (-1 where a PAD fills)."""
  chain = []
  while x is not base and (x.op in GroupOp.Movement or x.op is Ops.DETACH): chain.append(x); x = x.src[0]
  idx = np.arange(math.prod(x.shape), dtype=np.int64).reshape(x.shape)
  for m in reversed(chain): idx = NP_MOVE[m.op](m, idx)
  return idx

def _enumerated_range(chain: list[Node], base: Node) -> tuple[int, int] | None:
  """The strided check's fallback: the flat index of every element of the chain (-1 where a PAD fills), in row-major
  order, is one run offset, offset+1, ... (tinygrad's strided slices pad, reshape and shrink; the result can still be
  one range)."""
  if any(is_symbolic(d) for m in chain for d in m.shape) or math.prod(base.shape) > ENUMERATE_LIMIT: return None
  flat = view_index(chain[0], base).reshape(-1)
  if flat.size == 0: return (0, 0)
  off = int(flat[0])
  return (off, flat.size) if off >= 0 and np.array_equal(flat, np.arange(off, off + flat.size)) else None

def _strides(shape):
  out, acc = [], 1
  for s in reversed(shape): out.append(acc); acc *= s
  return tuple(reversed(out))

def _reshape(shape, strides, new):
  """numpy's no-copy reshape: the strides for `new`, or None if the view would need a copy."""
  if math.prod(shape) == 0: return _strides(new)
  old = [(s, st) for s, st in zip(shape, strides) if s != 1]
  out, i = [], 0
  for ns in new:
    if ns == 1: out.append(None); continue
    if i >= len(old): return None
    # take old dims until their product reaches ns; they must be mergeable (row-major adjacent)
    prod, j = old[i][0], i
    while prod < ns and j + 1 < len(old):
      if old[j][1] != old[j+1][1] * old[j+1][0]: return None
      j += 1; prod *= old[j][0]
    if prod == ns: out.append(old[j][1]); i = j + 1; continue
    if prod > ns and j == i and prod % ns == 0:  # split one old dim
      sub = prod // ns
      out.append(old[i][1] * sub); old[i] = (sub, old[i][1]); continue
    return None
  if i != len(old): return None
  return tuple(0 if st is None else st for st in out)

def contiguous_range(x: Node, base: Node) -> tuple[int, int] | None:
  """(offset, numel) in elements if `x`, a movement chain over `base` (read row-major), is one contiguous range."""
  chain = []
  n = x
  while n is not base:
    if n.op not in GroupOp.Movement and n.op is not Ops.DETACH: return None
    chain.append(n); n = n.src[0]
  shape, strides, off = base.shape, _strides(base.shape), 0
  for m in reversed(chain):
    if m.op is Ops.DETACH: continue
    if m.op is Ops.RESHAPE:
      if (st := _reshape(shape, strides, m.arg)) is None: return _enumerated_range(chain, base)
      shape, strides = m.arg, st
    elif m.op is Ops.SHRINK:
      off += sum(s * st for (s, _), st in zip(m.arg, strides)); shape = m.shape
    elif m.op is Ops.PERMUTE:
      shape, strides = tuple(shape[i] for i in m.arg), tuple(strides[i] for i in m.arg)
    elif m.op is Ops.FLIP:
      off += sum((s - 1) * st for s, st, f in zip(shape, strides, m.arg) if f and s > 0)
      strides = tuple(-st if f else st for st, f in zip(strides, m.arg))
    elif m.op is Ops.EXPAND:
      strides = tuple(0 if a != s else st for s, a, st in zip(shape, m.arg, strides)); shape = m.arg
    else: return _enumerated_range(chain, base)   # a PAD: only the enumeration can say no padded value is in view
  numel = math.prod(shape)
  if numel == 0: return (0, 0)
  want = 1
  for s, st in reversed(list(zip(shape, strides))):
    if s == 1: continue
    if st != want: return None
    want *= s
  return (off, numel)
