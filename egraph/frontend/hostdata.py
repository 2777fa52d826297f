"""Floor 6 (front end): host data entering a graph (lists and numpy arrays as a lazy COPY from an NPY buffer; Python
scalars as realized 1-element kernel arguments) and the checks an assign's target must pass (a view of storage naming each
element once)."""
from __future__ import annotations
import threading, weakref
import numpy as np
from egraph.ir.dtype import DType, as_np
from egraph.ir.errors import ShapeError
from egraph.ir.storage import host_buffer, STORAGE
from egraph.ir.ops import Node, Ops, GroupOp, new_buffer
from egraph.engine.encode import UnwritableViewError, writable_chain
from egraph.frontend.promote import fit, const_like, specializes

def host_node(arr: np.ndarray, dtype: DType, device) -> Node:
  """Host data as a lazy COPY from an NPY buffer to `device` (what tinygrad does for lists and numpy arrays)."""
  arr = as_np(arr, dtype)  # not ascontiguousarray: that makes 0-d arrays 1-d
  view = host_buffer(arr.reshape(-1), dtype).reshape(arr.shape)
  return view if device == "NPY" else Node(Ops.COPY, dtype, (view,), device)

def scalar_node(v, dtype: DType, device: str, shape: tuple = ()) -> Node:
  """A Python scalar as a kernel argument: a realized 1-element buffer on `device` (a host-memory device) holding it,
  broadcast to `shape`, so the graph, its CALL and its kernels are the same whatever the value (a new value is a new
  buffer: every cache hits; no copy, no realize point). `egraph.frontend.promote.specializes` says which scalars stay
  CONSTs instead."""
  data = np.full(1, v, dtype=dtype.np)
  key = (dtype, device, data.tobytes())   # one buffer per value while it lives: a value used twice is one kernel argument
  with _SCALAR_LOCK:
    if (buf := _SCALARS.get(key)) is None:
      buf = _SCALARS[key] = new_buffer(1, dtype, device)
      STORAGE.set_data(buf, data)
  return buf.reshape(()).reshape((1,) * len(shape)).expand(shape)

# (dtype, device, bytes) -> the live argument buffer holding that value; never written (no Tensor of it exists), so
# graphs share it; an entry goes with its buffer
_SCALARS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_SCALAR_LOCK = threading.Lock()

def scalar_operand(v, dtype: DType, device, shape: tuple = (), op: str = "") -> Node:
  """A Python scalar meeting a tensor in `op`, broadcast to `shape`: a CONST where its value is the code
  (`specializes`), else a kernel argument (`scalar_node`)."""
  v = fit(v, dtype)
  return const_like(v, dtype, device, shape) if specializes(v, dtype, device, op) else scalar_node(v, dtype, device, shape)

def to_numpy(data) -> tuple[np.ndarray, bool]:
  """(array, from_python): Python ints default to int32 and floats to float32, numpy arrays keep their ints."""
  if isinstance(data, np.ndarray): return data, False
  try: arr = np.array(data)
  except ValueError as e: raise ShapeError(f"Tensor: ragged nested sequence ({e})") from e
  if arr.dtype == object: raise ShapeError(f"Tensor: ragged or non-numeric nested sequence of type {type(data).__name__}")
  return arr, not isinstance(data, np.generic)

def storage_base(n: Node) -> Node | None:
  """The BUFFER/SLICE a writable view (a movement chain naming each element once) looks into, else None (a computed target)."""
  if not writable_chain(n): return None
  n = n.base
  return n if n.op in (Ops.BUFFER, Ops.SLICE) else None

def check_writable(t: Node) -> None:
  """Raise UnwritableViewError if t is a view of storage that does not name each element once (tinygrad silently drops
  such assigns; callsat refuses them, notes/quirks.md). A computed target is fine: it gets a fresh buffer."""
  n, bad = t, None
  while True:
    if n.op in GroupOp.Movement or n.op is Ops.DETACH:
      if bad is None and not writable_chain(n):
        bad = next((m.op.name for m in view_chain(n) if m.op in (Ops.PAD, Ops.EXPAND)), "PAD")
      n = n.base
    elif n.op is Ops.CAST: bad = bad or "CAST"; n = n.src[0]
    elif n.op in (Ops.AFTER, Ops.BITCAST, Ops.MULTI): n = n.src[0]
    else: break
  if bad is not None and n.op in GroupOp.Storage:
    raise UnwritableViewError(f"assign: the target {t.shape} is a view of storage through {bad}, which does not name each element once")

def view_chain(n: Node) -> list[Node]:
  out = []
  while n.op in GroupOp.Movement or n.op is Ops.DETACH: out.append(n); n = n.src[0]
  return out
