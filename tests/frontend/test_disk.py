"""DISK:/path devices (numpy memmap): copies to disk (EX7) and from disk, movement ops on disk views, no compute on disk."""
import numpy as np
import pytest
from egraph import Tensor, callify, DeviceError
from egraph.ir.ops import Ops

def test_copy_to_disk_writes_the_file_ex7(tmp_path):
  path = tmp_path / "disk.bin"
  t = Tensor([1., 2, 3, 4]).realize()
  d = t.to(f"DISK:{path}")
  res = callify(d)
  v = res.buffer_map[d.node]
  assert v.op is Ops.BUFFER and v.device == f"DISK:{path}" and res.report.stores == 1
  d.realize()
  np.testing.assert_equal(np.fromfile(path, dtype=np.float32), [1, 2, 3, 4])
  assert d.node.op is Ops.BUFFER

@pytest.mark.parametrize("dev", ["PYTHON", "CPU"])   # the reference executor, native kernels
def test_copy_from_disk_and_views_of_disk(tmp_path, dev):
  path = tmp_path / "in.bin"
  np.arange(6, dtype=np.float32).tofile(path)
  e = Tensor.empty(2, 3, device=f"DISK:{path}")
  np.testing.assert_equal(e.to(dev).numpy(), np.arange(6).reshape(2, 3))
  np.testing.assert_equal(e.permute(1, 0).to(dev).numpy(), np.arange(6).reshape(2, 3).T)
  np.testing.assert_equal(e[1:, ::2].flip(1).to(dev).numpy(), [[5, 3]])
  np.testing.assert_equal((e.to(dev) * 2).sum(axis=1).numpy(), [6, 24])
  (e.to(dev) * 3).to(f"DISK:{tmp_path / 'out.bin'}").realize()   # computed on dev, copied to another disk file
  np.testing.assert_equal(np.fromfile(tmp_path / "out.bin", dtype=np.float32), np.arange(6) * 3)

def test_disk_buffers_on_one_path_alias_the_file(tmp_path):
  path = tmp_path / "a.bin"
  Tensor([5., 6, 7]).to(f"DISK:{path}").realize()
  again = Tensor.empty(3, device=f"DISK:{path}")
  np.testing.assert_equal(again.to("PYTHON").numpy(), [5, 6, 7])

def test_no_compute_on_disk(tmp_path):
  e = Tensor.empty(4, device=f"DISK:{tmp_path / 'x.bin'}")
  with pytest.raises(DeviceError, match="DISK"): (e * e).realize()
