"""The kernel cache: a kernel compiles once per process, keyed by its body (lower.schedule.kernel.Kernel.key: the kernel IR without
its name: params with dtype/size/alignment/aliasing, domain, index expressions, values). Schedules are cached per CALL body
and argument aliasing, so running the same model on new data neither schedules nor compiles anything.

Misses of one run are compiled together, in modules of at most MODULE_OPS expression nodes, so the fixed cost of a
module (pass pipeline setup, codegen, engine) is paid once per batch rather than once per kernel.

Optional on-disk cache (off by default) of each module's object code, so a new process skips O3 and codegen too:
CALLSAT_CACHE_DIR=/path turns it on there, CALLSAT_CACHE=1 at $XDG_CACHE_HOME/callsat (~/.cache/callsat), CALLSAT_CACHE=0
turns it off whatever else is set; both are read when this module is imported, `CACHE.disk = path` (or None) sets it at
run time. CALLSAT_CACHE_MAX_MB (default 256) bounds the directory (within ~2 %): the least recently used entries go.
The directory must be private (lower.device.securefs.private_dir) and entries are signed with the user's key: a loaded object
is run, so nothing another user could have written is."""
from __future__ import annotations
import weakref, hashlib, hmac, os, random, stat, sys, time
from egraph.ir.lru import ByteLRU, mb_setting
from lower.device.compiler import compile_kernels, debug_level
from lower.device.llvmjit import JIT_LOCK, Slab
from lower.device.securefs import NOFOLLOW, mac, private_dir, read_file, say_once, user_cache_root, user_key, write_file
from lower.schedule.kernel import Kernel

MODULE_OPS = 3000

def disk_dir(env=os.environ) -> str | None:
  """The on-disk cache directory the environment asks for, or None (off)."""
  on = env.get("CALLSAT_CACHE", "")
  if on == "0": return None
  if d := env.get("CALLSAT_CACHE_DIR"): return d
  if on: return user_cache_root(env)
  return None

def looks_like_object(data: bytes) -> bool:
  """A relocatable object of this platform's format (ELF ET_REL on Linux): MCJIT aborts the process on anything else."""
  if sys.platform.startswith("linux"): return data[:4] == b"\x7fELF" and len(data) > 64 and int.from_bytes(data[16:18], sys.byteorder) == 1
  if sys.platform == "darwin": return data[:4] in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe")
  return True

class DiskCache:
  """Module objects on disk, one file per key (lower.device.llvmjit.object_key) under <root>/llvm: MAGIC, payload length (8 bytes),
  HMAC-SHA256(user key, key, payload), payload. <root> and <root>/llvm are made 0700 and refused (one stderr line, run
  uncached) unless private to this user; the key is <root>/key (0600). Names inside are opened relative to the directory's
  fd without following symlinks. A write goes to a temp file that os.replace renames over the entry, so a reader sees a
  whole old or a whole new file. No fsync: an entry cut short, garbled or planted fails the length/HMAC (or `check`) test
  and is discarded: a miss (recompiled, rewritten), never a crash. Writes now and then (see put) remove the entries with
  the oldest mtime (a hit touches its entry) until the total is under max_mb; only regular *.bin files in our format go."""
  MAGIC, HEAD = b"CSOBJ\x00\x02\n", 48
  STALE_TMP_S = 3600    # temp files of writers that died before the rename

  def __init__(self, root, max_mb: float | None = None, check=None):
    self.root = os.fspath(root)
    self.path = os.path.join(self.root, "llvm")
    if max_mb is None:
      try: max_mb = float(os.environ.get("CALLSAT_CACHE_MAX_MB", "256"))
      except ValueError: max_mb = 256
    self.max_bytes = int(max_mb * 2**20)
    self.check = check      # payload -> bool: a signed entry that fails it is discarded too
    self.corrupt = 0        # entries that failed the check (read as misses)
    self.errors = 0         # writes that failed (read-only or full disk, refused directory): the kernel still runs, uncached
    self.refused: str | None = None
    self._fd = self._key = None

  def __del__(self):
    if getattr(self, "_fd", None) is not None: os.close(self._fd); self._fd = None

  def _dir(self) -> int | None:
    """The fd of <root>/llvm, opened (and checked) on first use; None when refused: said once, run uncached."""
    if self._fd is None and self.refused is None:
      try:
        top = private_dir(self.root)
        try: self._key, self._fd = user_key(top), private_dir("llvm", top)
        finally: os.close(top)
      except OSError as e:
        self.refused = str(e.strerror or e)
        say_once(f"disk cache off: {self.refused}")
    return self._fd

  def file(self, key: str) -> str: return os.path.join(self.path, key + ".bin")

  def get(self, key: str) -> bytes | None:
    if (fd := self._dir()) is None or (raw := read_file(fd, key + ".bin")) is None: return None
    H, data = self.HEAD, raw[self.HEAD:]
    if len(raw) < H or raw[:8] != self.MAGIC or int.from_bytes(raw[8:16], "little") != len(data) or \
       not hmac.compare_digest(mac(self._key, key.encode(), data), raw[16:H]) or (self.check and not self.check(data)):
      self.corrupt += 1
      if _debug(): print(f"disk cache: corrupt entry {self.file(key)} ({len(raw)} bytes): recompiling", file=sys.stderr)
      try: os.unlink(key + ".bin", dir_fd=fd)
      except OSError: pass
      return None
    try: os.utime(key + ".bin", dir_fd=fd, follow_symlinks=False)
    except (OSError, NotImplementedError): pass
    return data

  def put(self, key: str, data: bytes) -> bool:
    try:
      if (fd := self._dir()) is None: raise OSError(f"refused: {self.refused}")
      write_file(fd, key + ".bin", self.MAGIC + len(data).to_bytes(8, "little") + mac(self._key, key.encode(), data) + data)
      # a scan stats every entry (~2 us each: 0.3 s at 256 MB of 2 KB objects), so it runs on a random share of the
      # writes, one per max_bytes/64 written on average over all processes: the directory overshoots by ~1/64
      if random.random() * self.max_bytes < 64 * len(data): self.evict()
      return True
    except OSError as e:
      self.errors += 1
      if _debug(): print(f"disk cache: cannot write {self.file(key)}: {e}", file=sys.stderr)
      return False

  def _ours(self, fd: int, name: str, size: int) -> bool:
    """An entry this cache wrote: our MAGIC and a length matching the file (eviction touches nothing else)."""
    try: h = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=fd)
    except OSError: return False
    try: head = os.read(h, 16)
    finally: os.close(h)
    return len(head) == 16 and head[:8] == self.MAGIC and int.from_bytes(head[8:], "little") == size - self.HEAD

  def entries(self) -> list[tuple[float, int, str]]:
    """(mtime, bytes, name) of every entry; stale temp files are removed on the way. Symlinks and other files are skipped."""
    out, now = [], time.time()
    if (fd := self._dir()) is None: return out
    try: names = os.listdir(fd)
    except OSError: return out
    for n in names:
      try: st = os.stat(n, dir_fd=fd, follow_symlinks=False)
      except OSError: continue       # evicted or renamed by another process meanwhile
      if not stat.S_ISREG(st.st_mode): continue
      if n.endswith(".bin") and self._ours(fd, n, st.st_size): out.append((st.st_mtime, st.st_size, n))
      elif n.startswith(".tmp-") and now - st.st_mtime > self.STALE_TMP_S:
        try: os.unlink(n, dir_fd=fd)
        except OSError: pass
    return out

  def evict(self) -> int:
    """Remove the least recently used entries until the directory holds at most max_bytes; returns how many went."""
    es = self.entries()
    total, n = sum(s for _, s, _ in es), 0
    for _, size, name in sorted(es):
      if total <= self.max_bytes: break
      try: os.unlink(name, dir_fd=self._fd); n += 1
      except OSError: pass
      total -= size
    return n

def _debug() -> bool: return debug_level() >= 1

# Resident cost of compiled code, measured on x86-64 Linux (bench/loops.py's RSS rows): an engine, a module linked into
# it, and its object's bytes once loaded (sections are page-aligned copies); an estimate, on the high side. llvmlite
# 0.50's leak of ~70 KB per pass-pipeline run is not here: after the first CALLSAT_COMPILE_INPROC modules it happens in
# the compile helper process (lower/device/compile_proc.py), which is replaced now and then.
ENGINE_BYTES = 800 << 10
MODULE_BYTES = 16 << 10
SLAB_MODULES = 64          # modules per slab before a new one starts (an evicted slab frees at most this many)
SCHEDULE_BYTES = 8 << 10   # a schedule entry besides its kernel keys (the Program, its Mems, the memory plan, the body)

def slab_bytes(s: Slab) -> int: return ENGINE_BYTES + s.modules * MODULE_BYTES + 2 * s.nbytes

class KernelCache:
  """Compiled kernels by key, in slabs (lower.device.llvmjit.Slab: engines shared by up to SLAB_MODULES modules), and
  schedules by CALL body. Both bounded, least recently used first out: CALLSAT_KERNEL_CACHE_MB (default 256) over the
  slabs' resident estimate (`slab_bytes`; a slab goes whole, with every kernel in it: a later use recompiles, or loads
  from the disk cache; its engine is disposed once no Compiled holds it), CALLSAT_SCHEDULE_CACHE_MB
  (default 64) over the schedules' (their kernels' keys, which are the kernels' text, and SCHEDULE_BYTES each). A
  kernel in use keeps its slab's code alive (a Compiled holds it) whatever the cache drops. Thread-safe: lookups take
  the cache's lock, compiles JIT_LOCK (one at a time)."""
  def __init__(self, disk=None, kernel_mb: float | None = None, schedule_mb: float | None = None):
    self._fns: dict = {}     # kernel key -> Compiled
    self.slabs = ByteLRU(mb_setting("CALLSAT_KERNEL_CACHE_MB", 256) if kernel_mb is None else int(kernel_mb * 2**20),
                         on_evict=self._evict_slab)   # Slab -> the keys of the kernels compiled into it
    self.schedules = ByteLRU(mb_setting("CALLSAT_SCHEDULE_CACHE_MB", 64) if schedule_mb is None else int(schedule_mb * 2**20))
    self.lock = self.slabs.lock
    self._slab: Slab | None = None   # where the next module goes
    self.compiled = 0        # kernels compiled
    self.modules = 0         # LLVM modules compiled
    self.hits = 0
    self.disk_hits = 0       # modules loaded from the disk cache (neither optimized nor compiled)
    self.disk_misses = 0     # modules compiled while the disk cache was on (and written to it)
    self.plans = weakref.WeakKeyDictionary()   # CALL -> native.Plan: its launches prepared on the storage it last ran on
    self.disk = disk

  @property
  def disk(self) -> str | None: return self._disk.root if self._disk else None
  @disk.setter
  def disk(self, path): self._disk = DiskCache(path, check=looks_like_object) if path else None
  @property
  def disk_cache(self) -> DiskCache | None:
    """The on-disk object cache in use (None: off), for the modules compiled outside this cache (matmul helpers, pool)."""
    return self._disk

  def __len__(self): return len(self._fns)
  def clear(self):
    with self.lock: self._fns.clear(); self.slabs.clear(); self.schedules.clear(); self.plans.clear(); self._slab = None
  def stats(self) -> dict:
    """Sizes and counters: kernels and slabs held, their estimated bytes, evictions."""
    return {"kernels": len(self._fns), "slabs": len(self.slabs), "kernel_bytes": self.slabs.nbytes, "slabs_evicted": self.slabs.evicted,
            "schedules": len(self.schedules), "schedule_bytes": self.schedules.nbytes, "schedules_evicted": self.schedules.evicted,
            "compiled": self.compiled, "modules": self.modules, "hits": self.hits, "disk_hits": self.disk_hits}

  def _evict_slab(self, slab: Slab, keys: list) -> None:
    for key in keys:
      if (c := self._fns.get(key)) is not None and c.slab is slab: del self._fns[key]
    if self._slab is slab: self._slab = None

  def get(self, kernels: list[Kernel], keys: list[str] | None = None) -> list:
    """The Compiled of each kernel (`keys`: their keys, when known), compiling the misses together."""
    if keys is None: keys = [k.key() for k in kernels]
    out: dict = {}
    with self.lock:
      for key in keys:
        if key in out: continue
        if (c := self._fns.get(key)) is not None: out[key] = c; self.hits += 1; self.slabs.touch(c.slab)
    if len(out) < len(set(keys)):
      with JIT_LOCK: self._compile({key: k for k, key in zip(kernels, keys) if key not in out}, out)
    return [out[key] for key in keys]

  def _compile(self, missing: dict, out: dict) -> None:
    """Compile `missing` (key -> Kernel) in modules of at most MODULE_OPS nodes into the current slab; JIT_LOCK held."""
    with self.lock:   # another thread may have compiled some while this one waited for JIT_LOCK
      for key in list(missing):
        if (c := self._fns.get(key)) is not None: out[key] = c; del missing[key]
    batch, ops = [], 0
    def flush():
      nonlocal batch, ops
      if not batch: return
      with self.lock:
        slab = self._slab
        if slab is None or slab.modules >= SLAB_MODULES or slab not in self.slabs: slab = self._slab = Slab()
      cs = compile_kernels([(k, name) for _, k, name in batch], disk=self._disk, slab=slab)
      with self.lock:
        keys = self.slabs.get(slab) or []
        for (key, _, _), c in zip(batch, cs): self._fns[key] = out[key] = c; keys.append(key)
        if cs[0].loaded: self.disk_hits += 1
        else:
          self.compiled += len(batch); self.modules += 1
          if self._disk: self.disk_misses += 1
        self.slabs.put(slab, keys, slab_bytes(slab))
      batch, ops = [], 0
    for key, k in missing.items():
      n = k.ops()
      if batch and ops + n > MODULE_OPS: flush()
      batch.append((key, k, f"{k.name}_{hashlib.sha1(key.encode()).hexdigest()[:10]}")); ops += n
    flush()

CACHE = KernelCache(disk_dir())
