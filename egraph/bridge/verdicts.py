"""The measured check's verdicts kept per user across processes (issue 28): a later process that meets a structure
measured before pays neither the measurement nor, when the hints lost, choosing them; its first call is strict's.

One small signed file per structure in the user's private cache directory ($CALLSAT_BRIDGE_VERDICTS_DIR, else
<user cache>/bridge-verdicts; lower/device/securefs: this user's and not group/world-writable, entries HMAC-signed under
the user's key, anything else ignored and removed), named by a SHA-256 over the structure's key (egraph/bridge/cache.py),
the bridge mode, tinygrad's version, the device and the check's margin. What a verdict holds is only which hints to keep
(the CALL is always decided anew): a verdict that kept hints is used only when this process's choice of hints is the
same set, so even a verdict read for another graph could not change a value. At most MAX_ENTRIES files (the oldest
out). CALLSAT_BRIDGE_VERDICTS=0 (or CALLSAT_CACHE=0) turns it off; a directory that cannot be used is reported once and
the bridge runs without it."""
from __future__ import annotations
import hashlib, json, os, threading
from dataclasses import dataclass
from lower.device.securefs import SignedDir, say_once, user_cache_root
from egraph.ir.env import env_switch, env_value

ENV, DIR_ENV = "CALLSAT_BRIDGE_VERDICTS", "CALLSAT_BRIDGE_VERDICTS_DIR"
MAX_ENTRIES = 4096
FORMAT = 2

@dataclass(frozen=True)
class Verdict:
  keep: bool
  idents: tuple      # the hints measured (sorted OPAQUE idents)
  stock_s: float
  hinted_s: float
  rounds: int
  ratio: float      # the median of the rounds' hinted/stock time ratios

  def to_bytes(self) -> bytes:
    return json.dumps({"format": FORMAT, "keep": self.keep, "idents": list(self.idents), "stock_s": self.stock_s,
                       "hinted_s": self.hinted_s, "rounds": self.rounds, "ratio": self.ratio}).encode()

  @staticmethod
  def from_bytes(data: bytes) -> Verdict | None:
    try:
      d = json.loads(data)
      if d.get("format") != FORMAT: return None
      v = Verdict(bool(d["keep"]), tuple(int(i) for i in d["idents"]), float(d["stock_s"]), float(d["hinted_s"]), int(d["rounds"]),
                  float(d["ratio"]))
    except (ValueError, KeyError, TypeError): return None
    return v

def digest(*parts) -> str:
  """The entry name of a structure: SHA-256 over the repr of its parts (a repr holding an address only ever misses)."""
  return hashlib.sha256(repr(parts).encode()).hexdigest()

class Verdicts:
  """The directory's verdicts: get/put by digest, bounded to `max_entries` files."""
  def __init__(self, path: str, max_entries: int = MAX_ENTRIES):
    self.dir, self.max_entries = SignedDir(path), max_entries
    self._lock = threading.Lock()

  def get(self, name: str) -> Verdict | None:
    data = self.dir.get(name)
    return None if data is None else Verdict.from_bytes(data)

  def put(self, name: str, v: Verdict) -> None:
    with self._lock:
      try:
        self.dir.put(name, v.to_bytes())
        self._bound()
      except OSError as e: say_once(f"cannot write a bridge verdict in {self.dir.path}: {e.strerror or e}")

  def _bound(self) -> None:
    names = [n for n in os.listdir(self.dir.fd) if len(n) == 64 and not n.startswith(".")]
    if len(names) <= self.max_entries: return
    def mtime(n):
      try: return os.stat(n, dir_fd=self.dir.fd, follow_symlinks=False).st_mtime
      except OSError: return 0.0
    for n in sorted(names, key=mtime)[:len(names) - self.max_entries]:
      try: os.unlink(n, dir_fd=self.dir.fd)
      except OSError: pass

_STORE: dict = {}   # (path) -> Verdicts, or None where it was refused

def enabled() -> bool:
  """Does the environment ask for kept verdicts (CALLSAT_BRIDGE_VERDICTS on, CALLSAT_CACHE not 0)? Read per call."""
  return env_switch(ENV) and env_value("CALLSAT_CACHE") != "0"

def store() -> Verdicts | None:
  """The verdict store the environment asks for (read per call: tests and benches switch it), or None (off, refused)."""
  if not enabled(): return None
  path = env_value(DIR_ENV) or os.path.join(user_cache_root(), "bridge-verdicts")
  if path not in _STORE:
    try: _STORE[path] = Verdicts(path)
    except OSError as e:
      say_once(f"{e.strerror or e}: the bridge's measured verdicts are not kept"); _STORE[path] = None
  return _STORE[path]
