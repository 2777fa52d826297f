"""compile_module (a module's text -> its code linked into a lower.device.llvmjit.Slab) and the compile helper: a child
process that turns a module's IR text into its object (parse, verify, the O2/O3 pipeline, codegen), so that the process
running the kernels never runs llvmlite's pass pipeline, which leaks ~70 KB per run (llvmlite 0.50:
LLVMPY_CreatePassBuilder `new`s a PassInstrumentationCallbacks that nothing frees). The leak lands in the child, which is
replaced after HELPER_MODULES modules; the parent only loads objects.

Used after the first CALLSAT_COMPILE_INPROC modules of a process (default 32; 0: from the first, `off`: never), so short
runs and tests pay no process start (~0.15 s); a long loop over new structures holds bounded memory.

Protocol over the child's stdin/stdout: a request is `<BI` (pipeline level, text bytes) + UTF-8 text; a reply `<BI`
(1: object, 0: error) + payload (the object, or the error text). The child exits on end of input."""
from __future__ import annotations
import atexit, os, struct, subprocess, sys
from pathlib import Path
from lower.device.llvmjit import JIT_LOCK, Slab, emit_object, object_key

HELPER_MODULES = 256   # modules a child compiles before it is replaced: bounds its leak (~18 MB) and code held
_HEAD = struct.Struct("<BI")
_ROOT = str(Path(__file__).resolve().parents[2])   # the folder holding the `lower` package, for the child's sys.path

def inproc_setting(env=os.environ) -> int | None:
  """Modules compiled in this process before the helper takes over (None: never)."""
  v = env.get("CALLSAT_COMPILE_INPROC", "32").strip().lower()
  if v in ("off", "never", "inf"): return None
  try: return max(0, int(v))
  except ValueError:
    raise ValueError(f"CALLSAT_COMPILE_INPROC={v!r}: expected a number of modules (0: always the helper) or 'off'") from None

def _child_code() -> str:
  return f"import sys; sys.path[:0] = [{_ROOT!r}]; from lower.device.compile_proc import serve; serve()"

class HelperCrashed(RuntimeError):
  """The compile helper died on a module twice (LLVM aborted in it): the module, not the helper, is at fault."""

class CompileHelper:
  """One child process at a time, started on demand, replaced after HELPER_MODULES modules or when it dies. Not
  thread-safe: callers hold lower.device.llvmjit.JIT_LOCK."""
  def __init__(self):
    self._proc: subprocess.Popen | None = None
    self._pid = os.getpid()     # a forked child must not talk to its parent's helper
    self._served = 0            # modules the current child compiled
    self.started = 0            # children started (stats)
    self.compiled = 0           # modules compiled by children
    self.restarts_after_death = 0

  def _start(self) -> subprocess.Popen:
    self._proc, self._served, self._pid = subprocess.Popen([sys.executable, "-c", _child_code()], stdin=subprocess.PIPE,
                                                           stdout=subprocess.PIPE), 0, os.getpid()
    self.started += 1
    return self._proc

  def close(self) -> None:
    p, self._proc = self._proc, None
    if p is None or self._pid != os.getpid(): return
    try: p.stdin.close()
    except OSError: pass
    try: p.wait(timeout=5)
    except subprocess.TimeoutExpired: p.kill(); p.wait()
    p.stdout.close()

  def _ask(self, text: bytes, level: int) -> tuple[bool, bytes] | None:
    """(ok, payload), or None if the child died (it is then reaped)."""
    if self._proc is None or self._pid != os.getpid() or self._proc.poll() is not None: self._proc = None; self._start()
    p = self._proc
    try:
      p.stdin.write(_HEAD.pack(level, len(text)) + text); p.stdin.flush()
      head = _read(p.stdout, _HEAD.size)
      if head is not None:
        ok, n = _HEAD.unpack(head)
        if (payload := _read(p.stdout, n)) is not None: return bool(ok), payload
    except (BrokenPipeError, OSError): pass
    self._proc = None
    try: p.kill()
    except OSError: pass
    p.wait()
    for f in (p.stdin, p.stdout):
      try: f.close()   # closing stdin flushes what the dead child never read: BrokenPipeError
      except OSError: pass
    return None

  def compile(self, text: str, level: int) -> bytes | None:
    """The module's object, or None where the child reported an error (the caller compiles in-process to raise it with
    its own type and message). A child that dies is replaced and asked once more; dying twice raises HelperCrashed."""
    data = text.encode()
    got = self._ask(data, level)
    if got is None:
      self.restarts_after_death += 1
      if (got := self._ask(data, level)) is None:
        raise HelperCrashed("LLVM crashed compiling a kernel module (twice, in the compile helper process; "
                            "CALLSAT_COMPILE_INPROC=off compiles in this process instead)")
    ok, payload = got
    if not ok: return None
    self.compiled += 1; self._served += 1
    if self._served >= HELPER_MODULES: self.close()
    return payload

def _read(f, n: int) -> bytes | None:
  buf = b""
  while len(buf) < n:
    if not (chunk := f.read(n - len(buf))): return None
    buf += chunk
  return buf

HELPER = CompileHelper()
atexit.register(HELPER.close)

_inproc = 0   # modules compiled in this process so far (the compile helper takes over after CALLSAT_COMPILE_INPROC)

def compile_module(text: str, disk=None, level: int = 3, slab: Slab | None = None) -> tuple[Slab, bool]:
  """The module `text` compiled (emit_object) and linked into `slab` (None: a new one of its own). Its object comes from
  `disk` (a lower.device.cache.DiskCache) when there (MCJIT then only loads and relocates it: no parse, O3 or codegen),
  else from the compile helper process once this process has compiled CALLSAT_COMPILE_INPROC modules, else from this
  process; a compiled object is stored to `disk`. Symbols the module calls but does not define (the matmul helpers) must
  be registered first. Returns (slab, loaded from disk)."""
  global _inproc
  with JIT_LOCK:
    slab = Slab() if slab is None else slab
    key = object_key(text, level) if disk is not None else None
    obj = disk.get(key) if disk is not None else None
    loaded = obj is not None
    if obj is None:
      if (n := inproc_setting()) is not None and _inproc >= n: obj = HELPER.compile(text, level)
      if obj is None: obj = emit_object(text, level); _inproc += 1   # in-process (also: the helper's error, raised here)
      if disk is not None: disk.put(key, obj)
    slab.add(obj)
    return slab, loaded

def serve() -> None:
  """The child's loop: read a request, reply with the object or the error, until end of input."""
  cin, cout = sys.stdin.buffer, sys.stdout.buffer
  sys.stdout = sys.stderr   # nothing else may write into the reply stream
  while (head := _read(cin, _HEAD.size)) is not None:
    level, n = _HEAD.unpack(head)
    if (text := _read(cin, n)) is None: break
    try: ok, payload = 1, emit_object(text.decode(), level)
    except Exception as e: ok, payload = 0, f"{type(e).__name__}: {e}".encode()   # noqa: BLE001 - every error goes back as a reply
    cout.write(_HEAD.pack(ok, len(payload)) + payload); cout.flush()
