"""Floor 1 (IR): the one bounded cache every per-graph cache is built on (callify's results, the kernel cache's schedules
and code slabs): least recently used entries go once the entries' bytes pass a limit, each cache with its own setting."""
from __future__ import annotations
import os, threading
from collections import OrderedDict
from typing import Callable
from egraph.ir.errors import CallsatError

def mb_setting(name: str, default: float) -> int:
  """Env `name` as a number of MB (a float; 0: keep nothing), in bytes; a bad value is an error naming it."""
  v = os.environ.get(name, "")
  try: mb = float(v) if v else default
  except ValueError: raise CallsatError(f"{name} must be a number of MB, got {v!r}") from None
  if mb < 0: raise CallsatError(f"{name} must be >= 0 MB, got {v!r}")
  return int(mb * 2**20)

class ByteLRU:
  """key -> value with a size in bytes each (the caller's estimate); past `limit` bytes the least recently used entries
  are dropped (`on_evict(key, value)` told of each), never the one just put unless the limit is 0. `get` and `touch`
  make an entry the most recent. Thread-safe; `on_evict` runs under the lock (it must not call back into this cache)."""
  def __init__(self, limit: int, on_evict: Callable | None = None):
    self.limit, self.on_evict = limit, on_evict
    self._d: OrderedDict = OrderedDict()   # key -> (value, nbytes), least recently used first
    self.lock = threading.RLock()
    self.nbytes = 0
    self.evicted = 0

  def __len__(self) -> int: return len(self._d)
  def __contains__(self, key) -> bool: return key in self._d

  def get(self, key, default=None):
    with self.lock:
      if (e := self._d.get(key)) is None: return default
      self._d.move_to_end(key)
      return e[0]

  def touch(self, key) -> None:
    with self.lock:
      if key in self._d: self._d.move_to_end(key)

  def put(self, key, value, nbytes: int) -> None:
    """Store (or replace, or resize) an entry as the most recent, then evict down to the limit."""
    with self.lock:
      if (old := self._d.pop(key, None)) is not None: self.nbytes -= old[1]
      self._d[key] = (value, nbytes)
      self.nbytes += nbytes
      while self.nbytes > self.limit and (len(self._d) > 1 or self.limit == 0):   # 0: keep nothing, not even the newest
        k, (v, n) = self._d.popitem(last=False)
        self.nbytes -= n; self.evicted += 1
        if self.on_evict is not None: self.on_evict(k, v)

  def pop(self, key, default=None):
    with self.lock:
      if (e := self._d.pop(key, None)) is None: return default
      self.nbytes -= e[1]
      return e[0]

  def clear(self) -> None:
    """Drop every entry, each told to `on_evict` as an eviction would be (a cache's own bookkeeping stays right)."""
    with self.lock:
      items, self._d, self.nbytes = list(self._d.items()), OrderedDict(), 0
      if self.on_evict is not None:
        for k, (v, _) in items: self.on_evict(k, v)

  def __repr__(self): return f"<ByteLRU {len(self._d)} entries, {self.nbytes} of {self.limit} bytes, {self.evicted} evicted>"
