"""Basic indexing of a node, tinygrad-style: ints (negative too), slices with any step, None and `...` become one
SHRINK, a FLIP for negative steps, the pad+reshape+shrink trick for steps > 1 and a final RESHAPE."""
from __future__ import annotations
import itertools
import numpy as np
from egraph.ir.errors import ShapeError, UnsupportedOpError
from egraph.ir.ops import Node
from egraph.ir.symbolic import is_symbolic, max_value

class TensorIndexError(ShapeError, IndexError):
  """An index out of range: a ShapeError that is also an IndexError, so Python's sequence protocols still work."""

def basic_index(node: Node, idx) -> Node:
  """`node[idx]` as movement ops; raises TensorIndexError for an index out of range."""
  idx = idx if isinstance(idx, tuple) else (idx,)
  for i in idx:
    if isinstance(i, bool) or is_symbolic(i) or not (i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice))):
      raise UnsupportedOpError(f"getitem: unsupported index {i!r} (only ints, slices, None and ...)")
  if sum(i is Ellipsis for i in idx) > 1: raise ShapeError("getitem: an index can only have a single ellipsis")
  n_real = sum(i is not None and i is not Ellipsis for i in idx)
  if n_real > len(node.shape): raise TensorIndexError(f"getitem: too many indices ({n_real}) for shape {node.shape}")
  fill = (slice(None),) * (len(node.shape) - n_real)
  idx = idx[:(k := idx.index(Ellipsis))] + fill + idx[k + 1:] if Ellipsis in idx else idx + fill
  bounds, flips, steps, lens, out, d = [], [], [], [], [], 0
  for i in idx:
    if i is None: out.append(1); continue
    size = node.shape[d]; d += 1
    if isinstance(i, slice) and is_symbolic(i.stop) and i.start in (None, 0) and i.step in (None, 1):
      if not i.stop.var.vmax <= max_value(size): raise TensorIndexError(f"getitem: {i.stop!r} can exceed axis {d - 1} of shape {node.shape}")
      bounds.append((0, i.stop)); flips.append(False); steps.append(1); lens.append(i.stop); out.append(i.stop)   # a[:v]
    elif isinstance(i, slice):
      start, stop, step = i.indices(size)
      n = len(range(start, stop, step))
      if n == 0: b = (0, 0)
      elif step > 0: b = (start, start + (n - 1) * step + 1)
      else: b = (start + (n - 1) * step, start + 1)  # take the range, flip it, then stride from its first element
      bounds.append(b); flips.append(step < 0 and n > 1); steps.append(abs(step) if n > 1 else 1); lens.append(n)
      out.append(n)
    else:
      if not -size <= i < size: raise TensorIndexError(f"getitem: index {i} is out of range for axis {d - 1} of shape {node.shape}")
      i = int(i) + size if i < 0 else int(i)
      bounds.append((i, i + 1)); flips.append(False); steps.append(1); lens.append(1)
  x = node.shrink(bounds).flip(flips)
  if any(s > 1 for s in steps):
    # pad each strided axis of length (n-1)*s+1 to n*s, split it into (n, s) and keep column 0
    x = x.pad([(0, n * s - L) for n, s, L in zip(lens, steps, x.shape)])
    x = x.reshape(tuple(itertools.chain.from_iterable((n, s) if s > 1 else (n,) for n, s in zip(lens, steps))))
    x = x.shrink(tuple(itertools.chain.from_iterable(((0, n), (0, 1)) if s > 1 else ((0, n),) for n, s in zip(lens, steps))))
  return x.reshape(tuple(out))
