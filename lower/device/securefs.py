"""Floor 4 (lowering): private per-user cache directories, shared by the native kernel cache (lower/device/cache.py) and
the CUDA one (lower/device/cuda_driver.py). Whatever lies in a cache is run, so a cache trusts only what this user wrote:
the directory is this user's and not group/world-writable, names inside are opened without following symlinks (relative to
the directory's fd), and entries carry an HMAC under a per-user key (0600) kept there. Standard library only (bench/gpu_check.sh
imports it on a machine without egglog)."""
from __future__ import annotations
import hashlib, hmac, os, secrets, stat, sys


class CacheRefused(OSError):
  """A cache directory another user could write (or that cannot be made): run uncached."""

_SAID: set = set()
def say_once(msg: str) -> None:
  """One line on stderr per message and process (a refused cache is reported, not fatal)."""
  if msg not in _SAID: _SAID.add(msg); print(f"callsat: {msg}", file=sys.stderr)

def user_cache_root(env=os.environ) -> str:
  """$XDG_CACHE_HOME/callsat, else ~/.cache/callsat: the user's own, never a guessable shared path."""
  return os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "callsat")

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

def private_dir(path: str, dir_fd: int | None = None) -> int:
  """An fd of directory `path` (relative to dir_fd: never through a symlink), made 0700 if missing; CacheRefused unless
  it belongs to this user and no group or other user can write it."""
  try:
    if dir_fd is None: os.makedirs(path, mode=0o700, exist_ok=True)
    else:
      try: os.mkdir(path, 0o700, dir_fd=dir_fd)
      except FileExistsError: pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | (NOFOLLOW if dir_fd is not None else 0), dir_fd=dir_fd)
  except OSError as e: raise CacheRefused(e.errno, f"cannot use cache directory {path!r}: {e.strerror}") from e
  st = os.fstat(fd)
  if st.st_uid != os.geteuid() or st.st_mode & 0o022:
    os.close(fd)
    raise CacheRefused(f"cache directory {path!r} is not private (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}; "
                       f"this is uid {os.geteuid()})")
  return fd

def user_key(dir_fd: int) -> bytes:
  """The 32-byte HMAC key in <dir>/key (0600, this user's), made on first use; a racing maker's key wins (os.link)."""
  for _ in range(3):
    try:
      fd = os.open("key", os.O_RDONLY | NOFOLLOW, dir_fd=dir_fd)
      try:
        st, key = os.fstat(fd), os.read(fd, 64)
      finally: os.close(fd)
      if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or len(key) != 32:
        raise CacheRefused(f"cache key is not this user's private 32-byte file (mode {stat.S_IMODE(st.st_mode):o})")
      return key
    except FileNotFoundError: pass
    tmp = f".key-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=dir_fd)
    try: os.write(fd, secrets.token_bytes(32))
    finally: os.close(fd)
    try: os.link(tmp, "key", src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError: pass
    finally: os.unlink(tmp, dir_fd=dir_fd)
  raise CacheRefused("cannot make the cache key")

def mac(key: bytes, *parts: bytes) -> bytes:
  """HMAC-SHA256 over length-prefixed parts (so no two part lists sign alike)."""
  h = hmac.new(key, digestmod=hashlib.sha256)
  for p in parts: h.update(len(p).to_bytes(8, "little")); h.update(p)
  return h.digest()

def read_file(dir_fd: int, name: str) -> bytes | None:
  """The bytes of regular file `name` in the directory (no symlink followed), None when absent or not a plain file."""
  try: fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=dir_fd)
  except OSError: return None
  try:
    if not stat.S_ISREG(os.fstat(fd).st_mode): return None
    with os.fdopen(os.dup(fd), "rb") as f: return f.read()
  finally: os.close(fd)

def write_file(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
  """Write `name` whole: a fresh temp file (O_EXCL, no symlink followed) renamed over it."""
  tmp = f".tmp-{name[:24]}-{os.getpid()}-{secrets.token_hex(4)}"
  try:
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dir_fd), "wb") as f: f.write(data)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd); tmp = None
  finally:
    if tmp is not None:
      try: os.unlink(tmp, dir_fd=dir_fd)
      except OSError: pass

class SignedDir:
  """A private cache directory whose entries are `mac(key, name, data) + data`: get returns None for anything else."""
  def __init__(self, path: str):
    self.path, self.fd = path, private_dir(path)
    try: self.key = user_key(self.fd)
    except OSError: os.close(self.fd); raise
  def __del__(self):
    if getattr(self, "fd", None) is not None: os.close(self.fd); self.fd = None
  def get(self, name: str) -> bytes | None:
    raw = read_file(self.fd, name)
    if raw is None or len(raw) < 32: return None
    if not hmac.compare_digest(raw[:32], mac(self.key, name.encode(), raw[32:])):
      try: os.unlink(name, dir_fd=self.fd)     # a bad entry is discarded (rebuilt), never used
      except OSError: pass
      return None
    return raw[32:]
  def put(self, name: str, data: bytes) -> None: write_file(self.fd, name, mac(self.key, name.encode(), data) + data)
