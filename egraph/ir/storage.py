"""Storage: the numpy arrays behind BUFFERs, shared by the front end, the executors and the research kit.

Every device is backed by host numpy arrays: a BUFFER's elements live in a 1-D array keyed by its uid; a DISK:/path
buffer is a memory map of that file."""
from __future__ import annotations
import os, sys, threading, weakref
from collections import OrderedDict
from typing import Iterator
import numpy as np
from egraph.ir.dtype import DType, dtypes, as_np
from egraph.ir.errors import CallsatError, DeviceError, ShapeError
from egraph.ir.ops import Node, Ops, new_buffer

class UnallocatedBufferError(CallsatError, LookupError):
  """A BUFFER is read but storage never allocated it."""

def _uid(x: int | Node) -> int: return x.arg.uid if isinstance(x, Node) else x
def elements(buf: Node) -> int:
  """Elements of storage: on a tuple of devices every device holds its own `size` (device-major)."""
  return buf.arg.size * (len(buf.arg.device) if isinstance(buf.arg.device, tuple) else 1)

POOL_MIN = 1 << 16   # smaller arrays come from numpy directly: malloc serves them warm and a pool would only add work

def bucket(nbytes: int) -> int:
  """The pool's size class of `nbytes`: rounded up to 1/8 of its power of two (at most 12.5% slack), like tinygrad's
  LRU allocator keyed by size, but close sizes share blocks."""
  g = max(64, 1 << max(0, (nbytes - 1).bit_length() - 3))
  return -(-nbytes // g) * g

class BufferPool:
  """Freed storage memory, by size class, handed to later allocations (tinygrad's LRUAllocator): a realize in a loop
  reuses warm pages instead of page-faulting fresh ones. Least recently freed blocks go first past `limit` bytes.
  Thread-safe (an RLock: a release can run inside another pool call of the same thread, from a finalizer)."""
  def __init__(self, limit: int | None = None):
    self.limit = int(os.environ.get("CALLSAT_POOL_MB", "1024")) << 20 if limit is None else limit
    self.lock, self._free, self._order = threading.RLock(), {}, OrderedDict()   # size class -> blocks; id -> size class (LRU)
    self.hits = self.misses = self.returned = self.dropped = self.cached = 0

  def take(self, nbytes: int, zero: bool) -> np.ndarray:
    """A uint8 block of at least `nbytes` (its size class): a freed one when there is one (dirty unless `zero`)."""
    b = bucket(nbytes)
    with self.lock:
      if blocks := self._free.get(b):
        raw = blocks.pop(); del self._order[id(raw)]; self.cached -= b; self.hits += 1
        if zero: raw[:nbytes] = 0
        return raw
      self.misses += 1
    return np.zeros(b, np.uint8) if zero else np.empty(b, np.uint8)   # zeros: calloc'd pages, zero until touched

  def give(self, raw: np.ndarray) -> None:
    with self.lock:
      b = raw.nbytes
      self._free.setdefault(b, []).append(raw); self._order[id(raw)] = b; self.cached += b; self.returned += 1
      while self.cached > self.limit and self._order:   # evict the least recently freed
        i, ob = self._order.popitem(last=False)
        blocks = self._free[ob]
        blocks.pop(next(j for j, x in enumerate(blocks) if id(x) == i)); self.cached -= ob

  def clear(self) -> None:
    with self.lock: self._free.clear(); self._order.clear(); self.cached = 0
  def _after_fork(self) -> None: self.lock = threading.RLock()   # a fork while another thread held it
  def __repr__(self): return f"<BufferPool {self.cached} bytes cached, {self.hits} hits, {self.misses} misses>"

POOL = BufferPool()
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=lambda: POOL._after_fork())

class _Owned(weakref.ref):
  """A weak reference to a BUFFER node whose array a Storage holds (its uid; the Storage, weakly): when the node dies
  the array is released. A plain weak reference with a callback (weakref.finalize's bookkeeping cost ~2 us per
  realize output); dropping it (Storage.free) cancels the callback."""
  __slots__ = ("uid", "store")

def _release(ref: _Owned) -> None:
  """A BUFFER node died: nothing can name its storage any more."""
  if (s := ref.store()) is not None: s.release(ref.uid)

class Storage:
  """uid -> 1-D numpy array holding a BUFFER's elements. Keys may be given as uids or BUFFER nodes.
  Lifetime: an array lives as long as its BUFFER node (a weakref.finalize on the node releases it); a live Tensor, CALL,
  view (SLICE/RESHAPE of the buffer) or cache entry holds the node, so nothing that can still read a buffer loses it.
  Released memory goes back to the pool unless some numpy view of it is still alive. Updates are single dict operations
  (atomic under the GIL): threads and finalizers (which run wherever the last reference drops) need no lock."""
  # an executor's run still writing (lower/runtime.run_call with wait False): an object with finish(), called before
  # any array is handed out (settle)
  pending = None

  def __init__(self, pool: BufferPool | None = None):
    self._bufs: dict[int, np.ndarray] = {}
    self._raw: dict[int, np.ndarray] = {}     # uid -> the pool block its array views
    self._fin: dict[int, _Owned] = {}
    self._me = weakref.ref(self)
    self.pool = POOL if pool is None else pool
  def __contains__(self, x: int | Node) -> bool: return _uid(x) in self._bufs
  def __len__(self) -> int: return len(self._bufs)
  def __iter__(self) -> Iterator[int]: return iter(list(self._bufs))
  def __getitem__(self, x: int | Node) -> np.ndarray:
    if self.pending is not None: self.settle()
    if (a := self._bufs.get(_uid(x))) is None: raise UnallocatedBufferError(f"BUFFER uid={_uid(x)} is not allocated")
    return a
  def get(self, x: int | Node, default=None) -> np.ndarray | None:
    if self.pending is not None: self.settle()
    return self._bufs.get(_uid(x), default)
  def settle(self) -> None:
    """Wait for the run still writing into this storage, if any (threads may race here: finish is idempotent)."""
    if (p := self.pending) is not None:
      p.finish()
      if self.pending is p: self.pending = None

  def allocate(self, buf: Node, zero: bool = True, write: bool = True) -> np.ndarray:
    """The array of `buf`, zero-filled on first use (`zero=False`: the caller overwrites every element) (a DISK buffer
    maps its file: read-only with write=False, and a read-only map asked for writing is remapped read-write)."""
    if self.pending is not None: self.settle()
    disk = buf.op is Ops.BUFFER and isinstance(buf.arg.device, str) and buf.arg.device.startswith("DISK:")
    if (a := self._bufs.get(buf.arg.uid) if buf.op is Ops.BUFFER else None) is not None and \
       not (disk and write and not a.flags.writeable): return a
    if disk:
      if a is None: return self._own(buf, disk_map(buf, write), None)
      self._bufs[buf.arg.uid] = a = disk_map(buf, True)   # one file, shared pages: views of the read map see the writes
      return a
    if buf.op is not Ops.BUFFER: raise CallsatError(f"allocate: expected a BUFFER, got {buf.op.name}")
    n, dt = elements(buf), buf.dtype.np
    if (nb := n * dt.itemsize) < POOL_MIN: return self._own(buf, np.zeros(n, dtype=dt), None)
    raw = self.pool.take(nb, zero)
    return self._own(buf, raw[:nb].view(dt), raw)

  def _own(self, buf: Node, a: np.ndarray, raw) -> np.ndarray:
    uid = buf.arg.uid
    if (got := self._bufs.setdefault(uid, a)) is not a:   # another thread allocated it first: use that one
      if raw is not None: del a; self.pool.give(raw)
      return got
    if raw is not None: self._raw[uid] = raw
    f = self._fin[uid] = _Owned(buf, _release)
    f.uid, f.store = uid, self._me
    return a

  def set_data(self, buf: Node, data) -> np.ndarray:
    """Write `data` (any shape, buf.arg.size elements) into `buf`; in place if allocated, so existing views see it."""
    if self.pending is not None: self.settle()
    a = as_np(np.asarray(data), buf.dtype).reshape(-1)
    if a.size != elements(buf): raise ShapeError(f"set_data: {a.size} elements for BUFFER uid={buf.arg.uid} of size {elements(buf)}")
    dst = self.allocate(buf, zero=False)
    dst[...] = a
    return dst

  def borrow(self, buf: Node, a: np.ndarray) -> None:
    """Bind `buf` to memory someone else owns (a host framework's buffer), replacing what it was bound to: never
    pooled, never freed here; the owner keeps it alive while CALLs run on it."""
    if a.ndim != 1 or a.dtype != buf.dtype.np or a.size != elements(buf):
      raise ShapeError(f"borrow: {a.dtype}{a.shape} for BUFFER uid={buf.arg.uid} ({elements(buf)} x {buf.dtype.name})")
    if self.pending is not None: self.settle()
    uid = buf.arg.uid
    if uid in self._raw or uid in self._fin: self.free(uid)
    self._bufs[uid] = a

  def release(self, uid: int) -> None:
    """Drop uid's array; its memory goes back to the pool when no other array views it. (No settle: a pending run holds
    its CALL, so none of the buffers it runs on can be released before it has finished.)"""
    self._fin.pop(uid, None)
    a, raw = self._bufs.pop(uid, None), self._raw.pop(uid, None)
    if raw is None: return
    del a
    # refs: `raw` here and getrefcount's argument; any more is a numpy view someone still holds (it keeps the memory)
    if sys.getrefcount(raw) == 2: self.pool.give(raw)
    else: self.pool.dropped += 1

  def free(self, x: int | Node) -> None:
    if self.pending is not None: self.settle()
    self._fin.pop(_uid(x), None)   # its weak reference dies with the entry: no callback
    self.release(_uid(x))
  def copy(self) -> "Storage":
    """An independent copy (every array copied): run a CALL on it without touching this one."""
    if self.pending is not None: self.settle()
    out = Storage(self.pool)
    for u, a in list(self._bufs.items()):
      if (f := self._fin.get(u)) is not None and (b := f()) is not None: out._own(b, a.copy(), None)
    return out
  @property
  def nbytes(self) -> int: return sum(a.nbytes for a in list(self._bufs.values()))
  def __repr__(self): return f"<Storage {len(self)} buffers, {self.nbytes} bytes>"

STORAGE = Storage()

def host_buffer(array, dtype: DType | str | None = None, storage: Storage = STORAGE) -> Node:
  """A new 1-D BUFFER on "NPY" holding a flattened copy of `array` (converted to `dtype`, default: array's dtype)."""
  a = np.asarray(array)
  dt = dtypes.from_numpy(a.dtype) if dtype is None else dtypes.from_any(dtype)
  buf = new_buffer(a.size, dt, "NPY")
  storage.set_data(buf, a)
  return buf

def disk_map(buf: Node, write: bool = False) -> np.ndarray:
  """A DISK:/path BUFFER is the first size*itemsize bytes of that file, memory-mapped: every buffer on one path aliases the
  same bytes, as in the reference. A read maps the file read-only and never changes it (missing or too small: DeviceError);
  `write` maps it read-write, creating or growing it with zeros, and a failed map leaves the file as it was."""
  path, nbytes, dt, dev = buf.arg.device[5:], buf.arg.size * buf.dtype.itemsize, buf.dtype.np, buf.arg.device
  if not write:
    try: size = os.stat(path).st_size
    except OSError as e: raise DeviceError(f"{dev}: cannot read {path!r}: {e.strerror} (a read never creates a file)") from e
    if size < nbytes:
      raise DeviceError(f"{dev}: {path!r} is {size} bytes, too small for {buf.arg.size} x {buf.dtype.name} ({nbytes} bytes); "
                        "a read never grows a file")
    if nbytes == 0: return np.zeros(0, dtype=dt)
    try: return np.memmap(path, dtype=dt, mode="r", shape=(buf.arg.size,))
    except (OSError, ValueError) as e: raise DeviceError(f"{dev}: cannot map {nbytes} bytes of {path!r}: {e}") from e
  try: old = os.stat(path).st_size
  except FileNotFoundError: old = None
  except OSError as e: raise DeviceError(f"{dev}: cannot write {path!r}: {e.strerror}") from e
  try:
    if old is None or old < nbytes:
      with open(path, "ab") as f: f.truncate(nbytes)
    if nbytes == 0: return np.zeros(0, dtype=dt)
    return np.memmap(path, dtype=dt, mode="r+", shape=(buf.arg.size,))
  except (OSError, ValueError, OverflowError, MemoryError) as e:
    try:   # undo: no 0-byte or grown file is left behind by a map that failed
      if old is None: os.remove(path)
      elif old < nbytes: os.truncate(path, old)
    except OSError: pass
    raise DeviceError(f"{dev}: cannot map {nbytes} bytes of {path!r} for writing: {e}") from e
