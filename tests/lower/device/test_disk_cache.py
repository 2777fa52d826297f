"""The on-disk kernel cache (lower.device.cache.DiskCache): a fresh process loads its modules' objects instead of compiling them,
with the values numpy gives; corrupt entries, another CPU, eviction, concurrent writers, an unwritable directory and the
environment switches."""
import json, os, subprocess, sys, threading
from pathlib import Path
import numpy as np
import pytest
import lower.device.cache
from lower.device import compiler
from lower.device import llvmjit
from lower.device.cache import DiskCache, KernelCache, disk_dir
from egraph import Tensor

REPO = Path(__file__).resolve().parents[3]

# one elementwise module and one tiled matmul module (two realizations); prints the cache stats and both results
SCRIPT = r"""
import json, os, numpy as np
from egraph import Tensor
from lower.device.cache import CACHE
if os.environ.get("PRE"):     # another matmul first: the renderer's loop-metadata counter moves on
  (Tensor(np.ones((48, 48), np.float32), device="CPU") @ Tensor(np.ones((48, 48), np.float32), device="CPU")).numpy()
rng = np.random.default_rng(0)
A, B = rng.standard_normal((64, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)
a, b = Tensor(A, device="CPU"), Tensor(B, device="CPU")
mm, ew = (a @ b).numpy(), ((a + b) * a - 1).numpy()
print(json.dumps(dict(disk=CACHE.disk, compiled=CACHE.compiled, modules=CACHE.modules, disk_hits=CACHE.disk_hits,
                      disk_misses=CACHE.disk_misses, mm=mm.tolist(), ew=ew.tolist())))
"""

def _expected():
  rng = np.random.default_rng(0)
  A, B = rng.standard_normal((64, 64), dtype=np.float32), rng.standard_normal((64, 64), dtype=np.float32)
  return A @ B, (A + B) * A - 1

def _env(tmp_path, **kv):
  env = {k: v for k, v in os.environ.items() if not k.startswith("CALLSAT_CACHE") and k not in ("DEBUG", "XDG_CACHE_HOME")}
  return {**env, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home"), **kv}

def _start(env): return subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

def _result(p) -> dict:
  out, err = p.communicate(timeout=300)
  assert p.returncode == 0, out + err
  r = json.loads(out.strip().splitlines()[-1])
  mm, ew = _expected()
  np.testing.assert_allclose(np.array(r["mm"], np.float32), mm, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.array(r["ew"], np.float32), ew, rtol=1e-6, atol=1e-6)
  return r

def test_fresh_process_loads_from_disk(tmp_path):
  env = _env(tmp_path, CALLSAT_CACHE_DIR=str(tmp_path / "c"))
  # two processes start on the empty cache at once: both compile or load, both write, both are right
  firsts = [_result(p) for p in [_start(env), _start(env)]]
  for r in firsts: assert r["disk"] == str(tmp_path / "c") and r["modules"] + r["disk_hits"] == 2 and r["modules"] == r["disk_misses"]
  files = sorted((tmp_path / "c" / "llvm").iterdir())
  assert len(files) >= 2 and all(f.suffix == ".bin" for f in files)     # one per module (no temp files left)
  r = _result(_start(env))
  assert (r["compiled"], r["modules"], r["disk_hits"], r["disk_misses"]) == (0, 0, 2, 0)
  assert sorted((tmp_path / "c" / "llvm").iterdir()) == files
  # other kernels rendered first (the renderer's loop-metadata counter has moved on): the same keys
  r = _result(_start({**env, "PRE": "1"}))
  assert r["disk_hits"] == 2 and r["modules"] == r["disk_misses"] >= 1

def test_module_text_independent_of_history(monkeypatch):
  import itertools, lower.render.llvm.function
  rng = np.random.default_rng(2)
  a, b = Tensor(rng.standard_normal((8, 300), dtype=np.float32), device="CPU"), Tensor(rng.standard_normal((300, 40), dtype=np.float32), device="CPU")
  c = KernelCache()
  monkeypatch.setattr(lower.device.cache, "CACHE", c)
  np.testing.assert_allclose((a @ b).numpy(), a.numpy() @ b.numpy(), rtol=1e-5, atol=1e-4)
  ks = [(k, f"k{i}") for i, k in enumerate(f.kernel for f in c._fns.values())]
  t0 = compiler.module_text(ks)
  assert "!llvm.loop !" in t0
  monkeypatch.setattr(lower.render.llvm.function, "_LOOP_IDS", itertools.count(99_990, 2))   # ids of other digit counts sort differently
  assert compiler.module_text(ks) == t0 == compiler.module_text(ks)

def test_off_without_env_var(tmp_path):
  r = _result(_start(_env(tmp_path)))
  assert r["disk"] is None and r["modules"] == 2 and r["disk_hits"] == r["disk_misses"] == 0
  assert not (tmp_path / "home").exists()
  assert disk_dir({}) is None and disk_dir({"CALLSAT_CACHE": "0", "CALLSAT_CACHE_DIR": "/x"}) is None
  assert disk_dir({"CALLSAT_CACHE_DIR": "/x"}) == "/x" and disk_dir({"CALLSAT_CACHE": "1", "XDG_CACHE_HOME": "/c"}) == "/c/callsat"
  assert disk_dir({"CALLSAT_CACHE": "1"}) == os.path.expanduser("~/.cache/callsat")

# ---------------------------------------------------------------------------------------------------------------------
# in process: a fresh KernelCache stands for a fresh process (run_native reads lower.device.cache.CACHE at each call)

def _run(monkeypatch, disk, scale: float) -> tuple[KernelCache, np.ndarray]:
  """(x * scale + 1) @ y on a new KernelCache over `disk`; checks the values against numpy."""
  c = KernelCache(disk)
  monkeypatch.setattr(lower.device.cache, "CACHE", c)
  rng = np.random.default_rng(1)
  X, Y = rng.standard_normal((40, 24), dtype=np.float32), rng.standard_normal((24, 48), dtype=np.float32)
  out = ((Tensor(X, device="CPU") * scale + 1) @ Tensor(Y, device="CPU")).numpy()
  np.testing.assert_allclose(out, (X * np.float32(scale) + 1) @ Y, rtol=1e-5, atol=1e-4)
  return c, out

def _entries(root) -> list[Path]: return sorted((Path(root) / "llvm").glob("*.bin"))

@pytest.mark.parametrize("damage", ["truncate", "flip_payload", "flip_hash", "empty", "garbage"])
def test_corrupt_entry_is_recompiled(tmp_path, monkeypatch, damage):
  c, _ = _run(monkeypatch, tmp_path, 2.5)
  files = _entries(tmp_path)
  assert c.modules == c.disk_misses == len(files) >= 1
  for f in files:
    raw = bytearray(f.read_bytes())
    if damage == "truncate": raw = raw[:len(raw) // 2]
    elif damage == "flip_payload": raw[-7] ^= 0x5A
    elif damage == "flip_hash": raw[20] ^= 1
    elif damage == "empty": raw = bytearray()
    else: raw = bytearray(b"\x7fELF" * 64)
    f.write_bytes(bytes(raw))
  c, _ = _run(monkeypatch, tmp_path, 2.5)
  assert (c.disk_hits, c.modules, c._disk.corrupt) == (0, len(files), len(files))
  c, _ = _run(monkeypatch, tmp_path, 2.5)          # rewritten whole by the recompile
  assert (c.disk_hits, c.modules, c._disk.corrupt) == (len(files), 0, 0)

def test_other_cpu_features_miss(tmp_path, monkeypatch):
  c, _ = _run(monkeypatch, tmp_path, -1.5)
  n = len(_entries(tmp_path))
  cpu, feats = llvmjit.host_cpu()
  monkeypatch.setattr(llvmjit, "host_cpu", lambda: (cpu, feats + ",-avx512f"))
  c, _ = _run(monkeypatch, tmp_path, -1.5)
  assert (c.disk_hits, c.modules) == (0, n) and len(_entries(tmp_path)) == 2 * n
  monkeypatch.setattr(llvmjit, "host_cpu", lambda: ("some-other-cpu", feats))
  c, _ = _run(monkeypatch, tmp_path, -1.5)
  assert (c.disk_hits, c.modules) == (0, n)
  monkeypatch.undo()
  c, _ = _run(monkeypatch, tmp_path, -1.5)
  assert (c.disk_hits, c.modules) == (n, 0)

def test_unwritable_directory_still_runs(tmp_path, monkeypatch):
  (tmp_path / "f").write_text("a file where the cache directory should be")
  c, _ = _run(monkeypatch, tmp_path / "f", 0.5)
  assert c.modules >= 1 and c.disk_hits == 0 and c._disk.errors == c.modules

def test_api_switch(tmp_path):
  c = KernelCache()
  assert c.disk is None
  c.disk = tmp_path
  assert c.disk == str(tmp_path) and c._disk.path == str(tmp_path / "llvm")
  c.disk = None
  assert c.disk is None

# ---------------------------------------------------------------------------------------------------------------------
# DiskCache alone

def test_roundtrip_and_eviction_oldest_first(tmp_path):
  d = DiskCache(tmp_path, max_mb=3000 / 2**20)     # 3000 bytes: two 1000-byte entries (+ 48-byte headers) fit
  assert d.get("k0") is None
  for i in range(3):
    assert d.put(f"k{i}", bytes([i]) * 1000)
    os.utime(d.file(f"k{i}"), (1000 + i, 1000 + i))   # distinct mtimes, oldest first
  assert d.get("k0") is None and d.get("k1") == b"\x01" * 1000 and d.get("k2") == b"\x02" * 1000
  for i in (1, 2): os.utime(d.file(f"k{i}"), (2000 + i, 2000 + i))
  assert d.get("k1") == b"\x01" * 1000               # a hit touches its entry: k1 is now newer than k2
  assert d.put("k3", b"\x03" * 1000)                 # so this write evicts k2
  assert d.get("k2") is None and d.get("k1") == b"\x01" * 1000 and d.get("k3") == b"\x03" * 1000
  stale = Path(d.path) / ".tmp-dead-1-00"
  stale.write_bytes(b"x"); os.utime(stale, (1, 1))
  d.evict()
  assert not stale.exists() and d.corrupt == 0

def test_concurrent_writers_and_readers(tmp_path):
  d, data, seen, errs = DiskCache(tmp_path), os.urandom(50_000), set(), []
  def writer():
    for _ in range(30): d.put("k", data)
  def reader():
    for _ in range(200):
      g = d.get("k")
      if g is not None and g != data: errs.append(len(g))
      seen.add(g is not None)
  ts = [threading.Thread(target=f) for f in (writer, writer, reader, reader)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert not errs and d.corrupt == 0 and d.get("k") == data
  assert [p.name for p in Path(d.path).iterdir()] == ["k.bin"]

def test_debug_says_loaded_from_disk(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("DEBUG", "1")
  _run(monkeypatch, tmp_path, 3.0)
  err = capsys.readouterr().err
  assert "compiled" in err and "from the disk cache" not in err
  c, _ = _run(monkeypatch, tmp_path, 3.0)
  err = capsys.readouterr().err
  assert c.disk_hits >= 1 and "loaded" in err and "from the disk cache" in err and "compiled " not in err
