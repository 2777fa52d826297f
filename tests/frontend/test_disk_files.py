"""DISK:/path files: a read maps the file read-only and never changes it (a missing or too small file is a DeviceError),
only a write creates or grows a file, a failed map leaves nothing behind, and a read map that is later written is
remapped (or a DeviceError when the file is read-only). CI runs as root: the read-only cases run in a forked child that
drops to nobody (65534) and maps through Storage (no threads or e-graph in a forked child)."""
import os, pickle, pwd, shutil, signal, tempfile
import numpy as np
import pytest
from egraph import Tensor, DeviceError, dtypes
from egraph.ir.ops import new_buffer
from egraph.ir.storage import Storage, disk_map

def _state(p) -> tuple: st = os.stat(p); return st.st_size, st.st_mtime_ns, p.read_bytes()

def test_reading_past_the_end_is_an_error_and_keeps_the_file(tmp_path):
  p = tmp_path / "short.bin"
  np.arange(2, dtype=np.float32).tofile(p); os.chmod(p, 0o444)
  before = _state(p)
  with pytest.raises(DeviceError, match="8 bytes, too small for 16 x float32"): Tensor.empty(16, device=f"DISK:{p}")
  with pytest.raises(DeviceError, match="too small"): disk_map(new_buffer(16, dtypes.float32, f"DISK:{p}"))
  assert _state(p) == before

@pytest.mark.parametrize("dev", ["PYTHON", "CPU"])
def test_reading_a_missing_file_creates_nothing(tmp_path, dev):
  p = tmp_path / "none.bin"
  e = Tensor.empty(4, device=f"DISK:{p}")
  with pytest.raises(DeviceError, match="a read never creates a file"): e.to(dev).numpy()
  assert not p.exists()

def test_read_maps_read_only_and_a_write_remaps(tmp_path):
  p = tmp_path / "a.bin"
  np.arange(4, dtype=np.float32).tofile(p)
  e = Tensor.empty(4, device=f"DISK:{p}")
  np.testing.assert_equal(e.to("CPU").numpy(), [0, 1, 2, 3])
  assert os.path.getsize(p) == 16
  Tensor([7., 8, 9, 10]).to(f"DISK:{p}").realize()                # a write: same file, mapped read-write now
  np.testing.assert_equal(np.fromfile(p, dtype=np.float32), [7, 8, 9, 10])
  np.testing.assert_equal(e.to("PYTHON").numpy(), [7, 8, 9, 10])  # the earlier read map sees the write
  s = Storage(); b = new_buffer(4, dtypes.float32, f"DISK:{p}")
  assert not s.allocate(b, write=False).flags.writeable and s.allocate(b).flags.writeable

def test_only_a_write_creates_or_grows(tmp_path):
  p = tmp_path / "new.bin"
  Tensor([1., 2, 3, 4]).to(f"DISK:{p}").realize()
  assert os.path.getsize(p) == 16
  Tensor(np.arange(6, dtype=np.float32)).to(f"DISK:{p}").realize()
  np.testing.assert_equal(np.fromfile(p, dtype=np.float32), np.arange(6))

def test_failed_huge_map_leaves_no_file(tmp_path):
  p = tmp_path / "huge.bin"
  with pytest.raises(DeviceError, match="for writing"): disk_map(new_buffer(2**62, dtypes.uint8, f"DISK:{p}"), write=True)
  assert not p.exists()
  p.write_bytes(b"12345678")
  with pytest.raises(DeviceError): disk_map(new_buffer(2**62, dtypes.uint8, f"DISK:{p}"), write=True)
  assert p.read_bytes() == b"12345678"

def _as_nobody(fn):
  """fn() in a forked child running as nobody: ('ok', value) or ('err', exception type name, message)."""
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      os.close(r); signal.alarm(60); os.setgid(65534); os.setuid(pwd.getpwnam("nobody").pw_uid)
      try: out = ("ok", fn())
      except Exception as e: out = ("err", type(e).__name__, str(e))
      os.write(w, pickle.dumps(out))
    finally: os._exit(0)
  os.close(w)
  with os.fdopen(r, "rb") as f: data = f.read()
  os.waitpid(pid, 0)
  return pickle.loads(data)

@pytest.mark.skipif(os.geteuid() != 0 or not hasattr(os, "fork"), reason="dropping to another user needs root")
def test_read_only_file_is_readable_by_a_normal_user_and_not_writable():
  try: pwd.getpwnam("nobody")
  except KeyError: pytest.skip("no user nobody")
  d = tempfile.mkdtemp(prefix="callsat-disk-")    # outside pytest's 0700 tmp tree: nobody must reach it
  try:
    os.chmod(d, 0o755)
    p = os.path.join(d, "ro.bin")
    np.arange(4, dtype=np.float32).tofile(p); os.chmod(p, 0o444)
    st, b = os.stat(p), new_buffer(4, dtypes.float32, f"DISK:{p}")
    assert _as_nobody(lambda: Storage().allocate(b, write=False).tolist()) == ("ok", [0, 1, 2, 3])
    def write():
      s = Storage(); s.allocate(b, write=False); s.set_data(b, [5., 6, 7, 8])   # a read map asked to write: remapped
    got = _as_nobody(write)
    assert got[0] == "err" and got[1] == "DeviceError" and "Permission denied" in got[2]
    assert os.stat(p).st_mtime_ns == st.st_mtime_ns and np.fromfile(p, dtype=np.float32).tolist() == [0, 1, 2, 3]
  finally: shutil.rmtree(d)
