"""Runtime: numpy-backed storage for BUFFERs, host buffers, and execution of CALLs.

Every device is backed by host numpy arrays. A CALL on "CPU" (and host-only CALLs) runs as native code through the LLVM
backend (lower/jit.py); a CALL that touches device "PYTHON" runs through the numpy reference executor (lower/numpy.py).
A CALL on "CUDA" runs on the GPU through lower/cuda.py (DeviceError without a driver/GPU). A sharded CALL on CPU devices
(("CPU", "CPU:1"), ...) runs natively too, as per-device kernels (lower/schedule.py).
"""
from __future__ import annotations
import os, weakref
from typing import Iterator
import numpy as np
from egraph.dtypes import DType, dtypes
from egraph.errors import CallsatError, DeviceError, ShapeError, UnsupportedOpError
from egraph.ir import Node, Ops, new_buffer, toposort, is_shard

class UnallocatedBufferError(CallsatError, LookupError):
  """A BUFFER is read but storage never allocated it."""

def _uid(x: int | Node) -> int: return x.arg.uid if isinstance(x, Node) else x
def _elements(buf: Node) -> int:
  """Elements of storage: on a tuple of devices every device holds its own `size` (device-major)."""
  return buf.arg.size * (len(buf.arg.device) if isinstance(buf.arg.device, tuple) else 1)

class Storage:
  """uid -> 1-D numpy array holding a BUFFER's elements. Keys may be given as uids or BUFFER nodes."""
  def __init__(self): self._bufs: dict[int, np.ndarray] = {}
  def __contains__(self, x: int | Node) -> bool: return _uid(x) in self._bufs
  def __len__(self) -> int: return len(self._bufs)
  def __iter__(self) -> Iterator[int]: return iter(self._bufs)
  def __getitem__(self, x: int | Node) -> np.ndarray:
    if (a := self._bufs.get(_uid(x))) is None: raise UnallocatedBufferError(f"BUFFER uid={_uid(x)} is not allocated")
    return a
  def get(self, x: int | Node, default=None) -> np.ndarray | None: return self._bufs.get(_uid(x), default)

  def allocate(self, buf: Node) -> np.ndarray:
    if buf.op is Ops.BUFFER and isinstance(buf.arg.device, str) and buf.arg.device.startswith("DISK:") and buf.arg.uid not in self._bufs:
      a = self._bufs[buf.arg.uid] = disk_map(buf)
      return a
    """The array of `buf`, zero-filled on first use."""
    if buf.op is not Ops.BUFFER: raise CallsatError(f"allocate: expected a BUFFER, got {buf.op.name}")
    if (a := self._bufs.get(buf.arg.uid)) is None: a = self._bufs[buf.arg.uid] = np.zeros(_elements(buf), dtype=buf.dtype.np)
    return a

  def set_data(self, buf: Node, data) -> np.ndarray:
    """Write `data` (any shape, buf.arg.size elements) into `buf`; in place if allocated, so existing views see it."""
    a = np.asarray(data).astype(buf.dtype.np, copy=False).reshape(-1)
    if a.size != _elements(buf): raise ShapeError(f"set_data: {a.size} elements for BUFFER uid={buf.arg.uid} of size {_elements(buf)}")
    dst = self.allocate(buf)
    dst[...] = a
    return dst

  def free(self, x: int | Node) -> None: self._bufs.pop(_uid(x), None)
  def copy(self) -> "Storage":
    """An independent copy (every array copied): run a CALL on it without touching this one."""
    out = Storage(); out._bufs = {u: a.copy() for u, a in self._bufs.items()}
    return out
  @property
  def nbytes(self) -> int: return sum(a.nbytes for a in self._bufs.values())
  def __repr__(self): return f"<Storage {len(self)} buffers, {self.nbytes} bytes>"

STORAGE = Storage()

def host_buffer(array, dtype: DType | str | None = None, storage: Storage = STORAGE) -> Node:
  """A new 1-D BUFFER on "NPY" holding a flattened copy of `array` (converted to `dtype`, default: array's dtype)."""
  a = np.asarray(array)
  dt = dtypes.from_numpy(a.dtype) if dtype is None else dtypes.from_any(dtype)
  buf = new_buffer(a.size, dt, "NPY")
  storage.set_data(buf, a)
  return buf

def disk_map(buf: Node) -> np.ndarray:
  """A DISK:/path BUFFER is the first size*itemsize bytes of that file (created or grown with zeros), memory-mapped:
  every buffer on one path aliases the same bytes, as in the reference."""
  path, nbytes = buf.arg.device[5:], buf.arg.size * buf.dtype.itemsize
  try:
    if not os.path.exists(path) or os.path.getsize(path) < nbytes:
      with open(path, "ab") as f: f.truncate(nbytes)
    if nbytes == 0: return np.zeros(0, dtype=buf.dtype.np)
    return np.memmap(path, dtype=buf.dtype.np, mode="r+", shape=(buf.arg.size,))
  except OSError as e: raise DeviceError(f"{buf.arg.device}: cannot map {nbytes} bytes of {path!r}: {e}") from e

RUNNABLE = ("CPU", "PYTHON", "NPY", "DISK", "CUDA")

def check_device(d) -> None:
  """Raise DeviceError unless `d` (a canonical device, a tuple of them, or None) runs here."""
  if d is None: return
  if isinstance(d, tuple):
    for x in d: check_device(x)
    return
  if d.partition(":")[0] not in RUNNABLE:
    raise DeviceError(f"device {d!r} cannot execute yet: only {', '.join(RUNNABLE)} (CPU:n, CUDA:n, DISK:/path) run")

_ROUTES: "weakref.WeakKeyDictionary[Node, str]" = weakref.WeakKeyDictionary()   # CALL -> backend, checked once

def run_call(call: Node, storage: Storage = STORAGE) -> None:
  """Execute a CALL from callify: its SINK body runs with PARAM(slot=i) bound to `call.src[1+i]` (BUFFER or SLICE(BUFFER)).
  Output buffers are allocated on demand. A CALL is validated once; running it again only dispatches."""
  if call.op is not Ops.CALL: raise CallsatError(f"run_call: expected a CALL, got {call.op.name}")
  if (route := _ROUTES.get(call)) is None:
    if call.src[0].op is not Ops.SINK: raise CallsatError(f"run_call: the body must be a SINK, got {call.src[0].op.name}")
    route = _ROUTES[call] = _route(call)
  if route == "bind":
    from egraph.callify import bindings
    call, _ = bindings(call)   # symbolic dimensions take their bound values; BIND args leave the call
    if (route := _ROUTES.get(call)) is None: route = _ROUTES[call] = _route(call)
  if route == "python":
    from lower.numpy import evaluate
    evaluate([call], storage)
  elif route == "cuda":
    from lower.cuda import run_cuda   # the GPU through libcuda; DeviceError naming what is missing without one
    run_cuda(call, storage)
  else:
    from lower.jit import run_native
    run_native(call, storage)

def _route(call: Node) -> str:
  """Validate a CALL's args and devices; the backend that runs it ("bind" when BIND args must be applied first)."""
  if any(a.op is Ops.BIND for a in call.src[1:]):
    from egraph.callify import bindings
    bindings(call)   # validates the BIND args
    return "bind"
  for i, a in enumerate(call.src[1:]):
    if not (a.op is Ops.BUFFER or (a.op is Ops.SLICE and a.src[0].op is Ops.BUFFER)):
      raise CallsatError(f"run_call: argument {i} is {a.op.name}; expected BUFFER or SLICE(BUFFER)")
  python = multi = cuda = False
  for n in toposort([call]):   # one walk (bodies can be 100k nodes): devices checked, the backend chosen
    check_device(n.device)
    if n.op is Ops.PARAM: check_device(n.arg.device)
    python = python or _on(n.device, "PYTHON") or (n.op is Ops.PARAM and _on(n.arg.device, "PYTHON"))
    multi = multi or isinstance(n.device, tuple)
    cuda = cuda or _on(n.device, "CUDA")
  if multi and cuda and not python:
    raise UnsupportedOpError("run_call: multi-device (sharded) CALLs on CUDA are not supported (the CUDA backend runs one GPU "
                             "per CALL); shard over CPU devices (('CPU', 'CPU:1'), ...) or PYTHON devices")
  return "python" if python else "cuda" if cuda else "native"

def _on(d, kind: str) -> bool:
  if isinstance(d, tuple): return any(_on(x, kind) for x in d)
  return isinstance(d, str) and d.partition(":")[0] == kind

def read(node: Node, storage: Storage = STORAGE) -> np.ndarray:
  """A standalone copy of the values of a pure graph over realized storage (e.g. RESHAPE(BUFFER)). Graphs with effects
  (STORE/CALL) are refused: reading must not write; run the CALL first."""
  for n in toposort([node], enter_calls=False):
    if n.op in (Ops.STORE, Ops.CALL): raise CallsatError(f"read: the graph contains {n.op.name}; run it (run_call) and read the buffer instead")
  if node.shape is None: raise CallsatError(f"read: {node.op.name} has no value")
  from lower.numpy import evaluate
  v = evaluate([node], storage)[0]
  return np.array(v[0] if is_shard(node) else v, copy=True, order="C")   # a replicated value: device 0's copy
