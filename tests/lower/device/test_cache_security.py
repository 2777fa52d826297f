"""Caches trust only what this user wrote: the CPU disk cache and the CUDA emulator cache refuse a directory another user
could write (they run uncached), authenticate entries with a per-user key, discard bad entries without aborting, follow
no symlink and evict only their own entries. CI runs as root: ownership is checked by chown'ing to nobody (65534)."""
import hashlib, os, pwd, stat
from pathlib import Path
import numpy as np
import pytest
import lower.device.cache
from lower.device import cuda_driver as drv
from lower.device import securefs
from lower.device.cache import DiskCache, KernelCache, looks_like_object
from egraph import Tensor

def _run(monkeypatch, disk, scale: float) -> KernelCache:
  """x * scale + 1 on a fresh KernelCache over `disk` (a fresh process, as far as the cache knows); values checked. The
  scale is a constant (CALLSAT_SCALARS=const): each scale its own kernel, so one can be planted in place of another."""
  monkeypatch.setenv("CALLSAT_SCALARS", "const")
  c = KernelCache(disk)
  monkeypatch.setattr(lower.device.cache, "CACHE", c)
  X = np.random.default_rng(3).standard_normal((37, 41)).astype(np.float32)
  np.testing.assert_allclose((Tensor(X, device="CPU") * scale + 1).numpy(), X * np.float32(scale) + 1, rtol=1e-6)
  return c

def _bins(root) -> dict[str, bytes]: return {p.name: p.read_bytes() for p in (Path(root) / "llvm").glob("*.bin")}

def _nobody() -> int | None:
  try: return pwd.getpwnam("nobody").pw_uid
  except KeyError: return None

def test_planted_object_with_recomputed_hash_is_not_run(tmp_path, monkeypatch):
  _run(monkeypatch, tmp_path / "evil", 5.0)
  _run(monkeypatch, tmp_path / "c", 3.0)
  evil, mine = _bins(tmp_path / "evil"), _bins(tmp_path / "c")
  payload = next(raw[48:] for n, raw in evil.items() if n not in mine)     # the x*5+1 module's object
  for name in set(mine) - set(evil):   # the x*3+1 module: its object swapped, the unkeyed sha256 recomputed
    key = name[:-4].encode()
    forged = DiskCache.MAGIC + len(payload).to_bytes(8, "little") + hashlib.sha256(key + payload).digest() + payload
    (tmp_path / "c" / "llvm" / name).write_bytes(forged)
  c = _run(monkeypatch, tmp_path / "c", 3.0)      # values checked: x*3+1, not x*5+1
  assert c._disk.corrupt >= 1 and c.modules >= 1

def test_signed_non_object_is_discarded_not_run(tmp_path, monkeypatch):
  c = _run(monkeypatch, tmp_path, 2.0)
  d = c._disk
  for name in _bins(tmp_path):   # even an entry that authenticates (our key) is checked to be an object before MCJIT gets it
    data = b"\x7fELF" + b"not an object" * 20
    d.put(name[:-4], data)
  c = _run(monkeypatch, tmp_path, 2.0)            # LLVM would abort the process on these (rc 134)
  assert c._disk.corrupt >= 1 and c.disk_hits == 0
  assert not looks_like_object(b"garbage") and DiskCache(tmp_path / "x", check=looks_like_object).get("k") is None

def test_made_private_with_a_private_key(tmp_path, monkeypatch):
  _run(monkeypatch, tmp_path / "c", 1.5)
  for p in (tmp_path / "c", tmp_path / "c" / "llvm"): assert stat.S_IMODE(p.stat().st_mode) == 0o700
  key = tmp_path / "c" / "key"
  assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
  assert _run(monkeypatch, tmp_path / "c", 1.5).disk_hits >= 1

def _refused(tmp_path, monkeypatch, capfd, root: Path):
  before = sorted(p.name for p in root.rglob("*"))
  c = _run(monkeypatch, root, 4.0)
  assert c._disk.refused and c.disk_hits == 0 and sorted(p.name for p in root.rglob("*")) == before
  err = capfd.readouterr().err
  assert err.count("disk cache off") == 1 and "not private" in err

def test_world_writable_directory_is_refused(tmp_path, monkeypatch, capfd):
  (tmp_path / "c").mkdir(); os.chmod(tmp_path / "c", 0o777)
  _refused(tmp_path, monkeypatch, capfd, tmp_path / "c")

@pytest.mark.skipif(os.geteuid() != 0 or _nobody() is None, reason="chown to another user needs root")
def test_directory_of_another_user_is_refused(tmp_path, monkeypatch, capfd):
  root = tmp_path / "c"
  _run(monkeypatch, root, 4.0)                        # a full cache ...
  for p in [root, *root.rglob("*")]: os.chown(p, _nobody(), -1, follow_symlinks=False)   # ... that now belongs to nobody
  securefs._SAID.clear()
  _refused(tmp_path, monkeypatch, capfd, root)

def test_symlinked_subdirectory_is_refused_and_left_alone(tmp_path, monkeypatch):
  victim = tmp_path / "victim"; victim.mkdir()
  (victim / "precious.bin").write_bytes(b"x" * 5000)
  (tmp_path / "c").mkdir(mode=0o700)
  (tmp_path / "c" / "llvm").symlink_to(victim)
  c = _run(monkeypatch, tmp_path / "c", 6.0)
  assert c._disk.refused and c._disk.evict() == 0 and (victim / "precious.bin").read_bytes() == b"x" * 5000
  assert [p.name for p in victim.iterdir()] == ["precious.bin"]

def test_eviction_removes_only_its_own_entries(tmp_path):
  d = DiskCache(tmp_path, max_mb=0)
  other = tmp_path / "other.bin"; other.write_bytes(b"y" * 100)
  assert d.put("k", b"z" * 1000) is True
  llvm = tmp_path / "llvm"
  (llvm / "foreign.bin").write_bytes(b"q" * 3000)             # never written by the cache
  (llvm / "link.bin").symlink_to(other)                       # a symlink: never followed
  d.max_bytes = 0
  assert d.put("k2", b"w" * 1000) is True and d.evict() >= 0
  assert sorted(p.name for p in llvm.iterdir()) == ["foreign.bin", "link.bin"] and other.read_bytes() == b"y" * 100

# ---------------------------------------------------------------------------------------------------------------------
# CUDA: the emulator (and nvcc) cache

def test_cuda_cache_is_per_user_not_in_tmp(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
  d = drv.cache_dir(env)
  assert d.path == str(tmp_path / "xdg" / "callsat" / "cuda") and stat.S_IMODE(os.stat(d.path).st_mode) == 0o700
  assert drv.cache_dir({"HOME": str(tmp_path / "home")}).path == str(tmp_path / "home" / ".cache" / "callsat" / "cuda")

_SRC = '__global__ void k(float* o, const float* a) { int i = threadIdx.x; o[i] = a[i] * 3.0f + 1.0f; }\n'
_PLAN = {"source": _SRC, "kernels": {"k": {"params": ["float*", "const float*"], "barriers": False}},
         "buffers": {"o": {"nbytes": 32, "kind": "arg", "written": True}, "a": {"nbytes": 32, "kind": "arg", "written": False}},
         "steps": [{"op": "launch", "kernel": "k", "grid": [1, 1, 1], "block": [8, 1, 1], "args": [["o", 0], ["a", 0]]}]}

def _emulate(monkeypatch, cache: Path) -> np.ndarray:
  monkeypatch.setenv("CALLSAT_CUDA_CACHE", str(cache))
  a = np.arange(8, dtype=np.float32); o = np.zeros(8, np.float32)
  drv.execute(_PLAN, {"o": o, "a": a}, drv.Emulator())
  return o

@pytest.fixture
def emu_name():
  if drv.shutil.which("g++") is None and drv.shutil.which("c++") is None: pytest.skip("no C++ compiler")
  e = drv.Emulator()
  with open(drv.EMU_HEADER) as f: header = f.read()
  src = header + _SRC + drv.launcher_source({"kernels": _PLAN["kernels"]}) + e.opt
  return "emu-" + hashlib.sha256(src.encode()).hexdigest()[:32] + ".so"

def _evil_so(tmp_path) -> bytes:
  """A library whose kernel computes a*5+1: what another user plants."""
  d = tmp_path / "evil"; d.mkdir()
  (d / "kernels.cu").write_text(_SRC.replace("3.0f", "5.0f"))
  (d / "launcher.cpp").write_text(drv.launcher_source({"kernels": _PLAN["kernels"]}))
  drv.subprocess.run([drv.shutil.which("g++") or "c++", "-std=c++17", "-fPIC", "-shared", "-w", "-include", drv.EMU_HEADER,
                      "-I", str(d), str(d / "launcher.cpp"), "-o", str(d / "kernels.so")], check=True)
  return (d / "kernels.so").read_bytes()

def test_cuda_planted_library_is_not_loaded(tmp_path, monkeypatch, emu_name):
  cache = tmp_path / "cuda"
  np.testing.assert_array_equal(_emulate(monkeypatch, cache), np.arange(8) * 3 + 1)
  evil = _evil_so(tmp_path)
  (cache / emu_name).write_bytes(os.urandom(32) + evil)       # signed with a key that is not ours
  np.testing.assert_array_equal(_emulate(monkeypatch, cache), np.arange(8) * 3 + 1)
  assert securefs.SignedDir(str(cache)).get(emu_name)[:4] == b"\x7fELF"   # discarded and rebuilt, signed again

def test_cuda_cache_of_another_user_is_refused(tmp_path, monkeypatch, capfd, emu_name):
  cache = tmp_path / "shared"; cache.mkdir()
  os.chmod(cache, 0o777)                        # what `mkdir /tmp/callsat-cuda-<uid>` by someone else looks like to us
  if os.geteuid() == 0 and _nobody() is not None: os.chmod(cache, 0o755); os.chown(cache, _nobody(), -1)
  (cache / emu_name).write_bytes(b"\0" * 32 + _evil_so(tmp_path))
  securefs._SAID.clear()
  np.testing.assert_array_equal(_emulate(monkeypatch, cache), np.arange(8) * 3 + 1)
  err = capfd.readouterr().err
  assert err.count("run uncached") == 1 and "not private" in err

def test_cuda_symlinked_entry_is_not_followed(tmp_path, monkeypatch, emu_name):
  cache = tmp_path / "cuda"; cache.mkdir(mode=0o700)
  victim = tmp_path / "victim.txt"; victim.write_text("keep me")
  (cache / emu_name).symlink_to(victim)
  for n in ("kernels.cu", "launcher.cpp"): (cache / n).symlink_to(victim)
  np.testing.assert_array_equal(_emulate(monkeypatch, cache), np.arange(8) * 3 + 1)
  assert victim.read_text() == "keep me" and not (cache / emu_name).is_symlink()
