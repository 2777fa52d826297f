"""Storage: the numpy arrays behind BUFFERs, shared by the front end, the executors and the research kit.

Every device is backed by host numpy arrays: a BUFFER's elements live in a 1-D array keyed by its uid; a DISK:/path
buffer is a memory map of that file."""
from __future__ import annotations
import os
from typing import Iterator
import numpy as np
from egraph.dtype import DType, dtypes
from egraph.errors import CallsatError, DeviceError, ShapeError
from egraph.ir import Node, Ops, new_buffer

class UnallocatedBufferError(CallsatError, LookupError):
  """A BUFFER is read but storage never allocated it."""

def _uid(x: int | Node) -> int: return x.arg.uid if isinstance(x, Node) else x
def elements(buf: Node) -> int:
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
    """The array of `buf`, zero-filled on first use (a DISK buffer maps its file)."""
    if buf.op is Ops.BUFFER and isinstance(buf.arg.device, str) and buf.arg.device.startswith("DISK:") and buf.arg.uid not in self._bufs:
      a = self._bufs[buf.arg.uid] = disk_map(buf)
      return a
    if buf.op is not Ops.BUFFER: raise CallsatError(f"allocate: expected a BUFFER, got {buf.op.name}")
    if (a := self._bufs.get(buf.arg.uid)) is None: a = self._bufs[buf.arg.uid] = np.zeros(elements(buf), dtype=buf.dtype.np)
    return a

  def set_data(self, buf: Node, data) -> np.ndarray:
    """Write `data` (any shape, buf.arg.size elements) into `buf`; in place if allocated, so existing views see it."""
    a = np.asarray(data).astype(buf.dtype.np, copy=False).reshape(-1)
    if a.size != elements(buf): raise ShapeError(f"set_data: {a.size} elements for BUFFER uid={buf.arg.uid} of size {elements(buf)}")
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
