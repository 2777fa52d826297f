"""The kernel cache: a kernel compiles once per process, keyed by its body (lower.kernel.Kernel.key: the kernel IR without
its name: params with dtype/size/alignment/aliasing, domain, index expressions, values). Schedules are cached per CALL body
and argument aliasing, so running the same model on new data neither schedules nor compiles anything.

Misses of one run are compiled together, in modules of at most MODULE_OPS expression nodes, so the fixed cost of a
module (pass pipeline setup, codegen, engine) is paid once per batch rather than once per kernel.

Optional on-disk cache (off by default) of each module's object code, so a new process skips O3 and codegen too:
CALLSAT_CACHE_DIR=/path turns it on there, CALLSAT_CACHE=1 at $XDG_CACHE_HOME/callsat (~/.cache/callsat), CALLSAT_CACHE=0
turns it off whatever else is set; both are read when this module is imported, `CACHE.disk = path` (or None) sets it at
run time. CALLSAT_CACHE_MAX_MB (default 256) bounds the directory (within ~2 %): the least recently used entries go."""
from __future__ import annotations
import weakref, hashlib, os, random, secrets, sys, time
from lower.compiler import compile_kernels, debug_level
from lower.kernel import Kernel

MODULE_OPS = 3000

def disk_dir(env=os.environ) -> str | None:
  """The on-disk cache directory the environment asks for, or None (off)."""
  on = env.get("CALLSAT_CACHE", "")
  if on == "0": return None
  if d := env.get("CALLSAT_CACHE_DIR"): return d
  if on: return os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "callsat")
  return None

class DiskCache:
  """Module objects on disk, one file per key (lower.llvmjit.object_key) under <root>/llvm: MAGIC, payload length (8 bytes),
  sha256(key + payload), payload. A write goes to a temp file that os.replace renames over the entry, so a reader sees a
  whole old or a whole new file and concurrent writers of one key write the same bytes. No fsync: an entry cut short or
  garbled by a crash fails the length/hash check, which makes it a miss (recompiled, rewritten), never a crash. Writes
  now and then (see put) remove the entries with the oldest mtime (a hit touches its entry) until the total is under
  max_mb."""
  MAGIC, HEAD = b"CSOBJ\x00\x01\n", 48
  STALE_TMP_S = 3600    # temp files of writers that died before the rename

  def __init__(self, root, max_mb: float | None = None):
    self.root = os.fspath(root)
    self.path = os.path.join(self.root, "llvm")
    if max_mb is None:
      try: max_mb = float(os.environ.get("CALLSAT_CACHE_MAX_MB", "256"))
      except ValueError: max_mb = 256
    self.max_bytes = int(max_mb * 2**20)
    self.corrupt = 0        # entries that failed the check (read as misses)
    self.errors = 0         # writes that failed (read-only or full disk): the kernel still runs, only uncached

  def file(self, key: str) -> str: return os.path.join(self.path, key + ".bin")

  def get(self, key: str) -> bytes | None:
    f = self.file(key)
    try:
      with open(f, "rb") as fh: raw = fh.read()
    except OSError: return None
    H = self.HEAD
    if len(raw) < H or raw[:8] != self.MAGIC or int.from_bytes(raw[8:16], "little") != len(raw) - H or \
       hashlib.sha256(key.encode() + raw[H:]).digest() != raw[16:H]:
      self.corrupt += 1
      if _debug(): print(f"disk cache: corrupt entry {f} ({len(raw)} bytes): recompiling", file=sys.stderr)
      return None
    try: os.utime(f)
    except OSError: pass
    return raw[H:]

  def put(self, key: str, data: bytes) -> bool:
    tmp = None
    try:
      os.makedirs(self.path, exist_ok=True)
      # unique per writer; 0o644 under the umask (mkstemp's 0o600 would hide a shared directory's entries from others)
      tmp = os.path.join(self.path, f".tmp-{key[:16]}-{os.getpid()}-{secrets.token_hex(4)}")
      head = self.MAGIC + len(data).to_bytes(8, "little") + hashlib.sha256(key.encode() + data).digest()
      with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as fh: fh.write(head + data)
      os.replace(tmp, self.file(key)); tmp = None
      # a scan stats every entry (~2 us each: 0.3 s at 256 MB of 2 KB objects), so it runs on a random share of the
      # writes, one per max_bytes/64 written on average over all processes: the directory overshoots by ~1/64
      if random.random() * self.max_bytes < 64 * len(data): self.evict()
      return True
    except OSError as e:
      self.errors += 1
      if _debug(): print(f"disk cache: cannot write {self.file(key)}: {e}", file=sys.stderr)
      return False
    finally:
      if tmp is not None:
        try: os.remove(tmp)
        except OSError: pass

  def entries(self) -> list[tuple[float, int, str]]:
    """(mtime, bytes, path) of every entry; stale temp files are removed on the way."""
    out, now = [], time.time()
    try: it = list(os.scandir(self.path))
    except OSError: return out
    for e in it:
      try: st = e.stat()
      except OSError: continue       # evicted or renamed by another process meanwhile
      if e.name.endswith(".bin"): out.append((st.st_mtime, st.st_size, e.path))
      elif e.name.startswith(".tmp-") and now - st.st_mtime > self.STALE_TMP_S:
        try: os.remove(e.path)
        except OSError: pass
    return out

  def evict(self) -> int:
    """Remove the least recently used entries until the directory holds at most max_bytes; returns how many went."""
    es = self.entries()
    total, n = sum(s for _, s, _ in es), 0
    for _, size, p in sorted(es):
      if total <= self.max_bytes: break
      try: os.remove(p); n += 1
      except OSError: pass
      total -= size
    return n

def _debug() -> bool: return debug_level() >= 1

class KernelCache:
  def __init__(self, disk=None):
    self._fns: dict = {}
    self.compiled = 0        # kernels compiled
    self.modules = 0         # LLVM modules compiled
    self.hits = 0
    self.disk_hits = 0       # modules loaded from the disk cache (neither optimized nor compiled)
    self.disk_misses = 0     # modules compiled while the disk cache was on (and written to it)
    self.schedules: dict = {}
    self.plans = weakref.WeakKeyDictionary()   # CALL -> native.Plan: its launches prepared on the storage it last ran on
    self.disk = disk

  @property
  def disk(self) -> str | None: return self._disk.root if self._disk else None
  @disk.setter
  def disk(self, path): self._disk = DiskCache(path) if path else None
  @property
  def disk_cache(self) -> DiskCache | None:
    """The on-disk object cache in use (None: off), for the modules compiled outside this cache (matmul helpers, pool)."""
    return self._disk

  def __len__(self): return len(self._fns)
  def clear(self): self._fns.clear(); self.schedules.clear(); self.plans.clear()

  def get(self, kernels: list[Kernel]) -> list:
    keys = [k.key() for k in kernels]
    missing: dict = {}
    for k, key in zip(kernels, keys):
      if key in self._fns: self.hits += 1
      elif key not in missing: missing[key] = k
    batch, ops = [], 0
    def flush():
      nonlocal batch, ops
      if not batch: return
      cs = compile_kernels([(k, name) for _, k, name in batch], disk=self._disk)
      for key, c in zip([b[0] for b in batch], cs): self._fns[key] = c
      if cs[0].loaded: self.disk_hits += 1
      else:
        self.compiled += len(batch); self.modules += 1
        if self._disk: self.disk_misses += 1
      batch, ops = [], 0
    for key, k in missing.items():
      n = k.ops()
      if batch and ops + n > MODULE_OPS: flush()
      batch.append((key, k, f"{k.name}_{hashlib.sha1(key.encode()).hexdigest()[:10]}")); ops += n
    flush()
    return [self._fns[key] for key in keys]

CACHE = KernelCache(disk_dir())
