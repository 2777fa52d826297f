"""The one backend interface (lower/device/backend.py): every device kind has one registered backend, a CALL goes to
the highest-ranked backend of the devices it touches, and a backend's storage binding is written once."""
import numpy as np
import pytest
from egraph import Tensor
from egraph.ir.dtype import dtypes
from egraph.ir.errors import CallsatError, DeviceError, UnsupportedOpError
from egraph.ir.ops import DEVICE_KINDS, new_buffer
from egraph.ir.storage import Storage, UnallocatedBufferError
from lower.device.backend import Backend, BACKENDS, register, backend_for, buffer_array
import lower.runtime  # noqa: F401  (registers the backends)

def test_every_device_kind_has_one_backend():
  assert set(BACKENDS) == set(DEVICE_KINDS)
  assert {k: b.name for k, b in BACKENDS.items()} == {"CPU": "native", "NPY": "native", "DISK": "native", "PYTHON": "python", "CUDA": "cuda"}

def test_routing_by_rank_and_multi_device():
  assert backend_for({"CPU", "NPY"}, False).name == "native"
  assert backend_for({"CPU", "PYTHON"}, False).name == "python"   # the reference reads every host device
  assert backend_for({"CPU", "CUDA"}, False).name == "cuda"
  with pytest.raises(UnsupportedOpError, match="multi-device .*CUDA"): backend_for({"CUDA"}, True)
  with pytest.raises(DeviceError, match="no backend runs devices"): backend_for({"EXT"}, False)

def test_registration_refuses_unknown_kinds_and_a_second_backend():
  class Other(Backend): name, devices = "other", ("CPU",)
  class Unknown(Backend): name, devices = "unknown", ("TPU",)
  with pytest.raises(CallsatError, match="two backends: native, other"): register(Other())
  with pytest.raises(CallsatError, match="unknown device kind 'TPU'"): register(Unknown())
  assert BACKENDS["CPU"].name == "native"

def test_buffer_array_allocates_written_buffers_and_refuses_unwritten_reads():
  S, b = Storage(), new_buffer(4, dtypes.float32, "CPU")
  with pytest.raises(UnallocatedBufferError, match="is read but was never allocated"): buffer_array(S, b, written=False)
  a = buffer_array(S, b, written=True)
  assert a.shape == (4,) and a.dtype == np.float32 and buffer_array(S, b, written=False) is a

def test_each_backend_runs_the_same_program():
  x = np.arange(6, dtype=np.float32)
  for dev in ("CPU", "PYTHON"):
    np.testing.assert_array_equal((Tensor(x, device=dev) * 2 + 1).numpy(), x * 2 + 1)
