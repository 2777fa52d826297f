"""The tinygrad bridge on tinygrad programs: each program is realized with tinygrad's own pass and with callsat's
(strict: no fallback), and the two must agree in values (tinygrad's PYTHON device, no compiler needed) and in kernel
counts (its NULL device). Shapes stay tiny: PYTHON interprets every kernel."""
import os
import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")
from tinygrad import Tensor, GlobalCounters, Context, dtypes   # noqa: E402
from egraph import tinygrad as bridge   # noqa: E402
from egraph.bridge.convert import BridgeRefusal   # noqa: E402
from egraph.ir.errors import CallsatError   # noqa: E402

from bridge_programs import PROGRAMS   # noqa: E402

def _run(build, device: str, bridged: bool):
  """(values, kernel count) of one program built on `device`, with or without the bridge (strict)."""
  with Context(DEV=device):
    Tensor.manual_seed(1234)
    GlobalCounters.reset()
    ctx = bridge.installed(strict=True) if bridged else _Stock()
    with ctx:
      outs = build()
      Tensor.realize(*outs)
      kernels = GlobalCounters.kernel_count
      vals = [o.numpy() for o in outs] if device != "NULL" else []
    return vals, kernels

class _Stock:
  def __enter__(self): bridge.uninstall()
  def __exit__(self, *a): return False

@pytest.mark.parametrize("name", list(PROGRAMS))
def test_values_match_stock(name):
  stock, _ = _run(PROGRAMS[name], "PYTHON", bridged=False)
  calls0 = bridge.stats()["bridged"]
  ours, _ = _run(PROGRAMS[name], "PYTHON", bridged=True)
  assert bridge.stats()["bridged"] > calls0, "the bridge never ran"
  assert len(ours) == len(stock)
  for a, b in zip(ours, stock):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("name", list(PROGRAMS))
def test_kernel_counts_match_stock(name):
  _, stock = _run(PROGRAMS[name], "NULL", bridged=False)
  _, ours = _run(PROGRAMS[name], "NULL", bridged=True)
  assert ours == stock

def _graphs(build) -> list:
  """Every graph the program hands tinygrad's pass (NULL device, stock pass)."""
  import tinygrad.tensor as tt
  got, own = [], tt.transform_to_call
  def hook(sink):
    got.append(sink)
    return own(sink)
  with Context(DEV="NULL"):
    Tensor.manual_seed(1234)
    tt.transform_to_call = hook
    try: Tensor.realize(*build())
    finally: tt.transform_to_call = own
  return got

def _decided(sink, consts: bool):
  """The bridge's CALL and buffer_map of one graph (rules mode, no cache), as a key with fresh buffers numbered in
  order (egraph.bridge.cache.structure), and the inert constants the conversion left out."""
  from tinygrad.uop.ops import UOp
  from egraph.bridge.convert import to_callsat, to_tinygrad
  from egraph.bridge.cache import structure
  from egraph.engine.driver import callify
  cv, roots = to_callsat(sink, consts=consts)
  res = callify(*roots, cache=False, assigns="realized", fusion="rules")
  call, bmap = to_tinygrad(cv, res.call, res.buffer_map)
  assert call is call.src[0].call(*call.src[1:])   # built directly where the graph has no RANGE: what .call builds
  keys = list(bmap)
  return structure(UOp.sink(call, *[bmap[k] for k in keys]), strip=False).key, keys, len(cv.inert)

def test_constants_left_out_give_the_same_call():
  """Leaving constant leaves out of the conversion (rules mode: nothing callify decides reads them) gives the CALL and
  buffer_map the full conversion gives, node for node, on every graph of every program; the CALL is the UOp tinygrad's
  `.call` builds over the same body and args."""
  left_out = graphs = 0
  for name, build in PROGRAMS.items():
    if "shard" in name: continue   # several devices: the NULL device has one
    for sink in _graphs(build):
      full, lean = _decided(sink, True), _decided(sink, False)
      assert lean[:2] == full[:2], name
      left_out += lean[2]; graphs += 1
  assert graphs > 20
  assert left_out > 0, "no constant was left out: the test compares nothing"

@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_fp8_bit_for_bit_as_stock(device):
  """The fp8 program's values exactly as stock tinygrad's, on its interpreter and on its CPU device (clang; there
  tinygrad emulates fp8 through half: its numbers differ from float_to_fp8's, and the bridge keeps them)."""
  stock, _ = _run(PROGRAMS["fp8"], device, bridged=False)
  ours, _ = _run(PROGRAMS["fp8"], device, bridged=True)
  for a, b in zip(ours, stock):
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()

def test_disk_roundtrip(tmp_path):
  path = str(tmp_path / "t.bin")
  for bridged in (False, True):
    ctx = bridge.installed(strict=True) if bridged else _Stock()
    with ctx:
      t = Tensor.empty(6, device=f"disk:{path}", dtype=dtypes.float32)
      t.assign(Tensor([1.0, 2, 3, 4, 5, 6], device="PYTHON").to(t.device)).realize()
      got = t.to("PYTHON").numpy()
      np.testing.assert_array_equal(got, [1, 2, 3, 4, 5, 6])
      np.testing.assert_array_equal(t[2:4].to("PYTHON").numpy(), [3, 4])

def _disk_forms(tmp, tag):
  """tinygrad 0.14's DISK forms: setitem into a file still being written, a bitcast read through a view, a 1-D bitcast
  between views, a disk-to-disk copy through the host."""
  dt = Tensor([[1], [2]], device="PYTHON").to(f"disk:{tmp / (tag + 'a')}")
  dt[1] = [3]
  (tmp / (tag + "b")).write_bytes(bytes(range(256)) * 2)
  u8 = Tensor.empty(16, 32, device=f"disk:{tmp / (tag + 'b')}", dtype=dtypes.uint8)
  src = Tensor([1, 2, 3, 4], dtype=dtypes.int32, device="PYTHON").to(f"disk:{tmp / (tag + 'c')}")
  dst = Tensor.empty(4, device=f"disk:{tmp / (tag + 'd')}", dtype=dtypes.int32)
  dst.assign(src.to("PYTHON")).realize()
  return [dt.tolist(), u8[1].bitcast(dtypes.uint16).to("PYTHON").tolist(),
          u8.reshape(-1)[8:24].bitcast(dtypes.uint32).reshape(2, 2).to("PYTHON").tolist(), dst.to("PYTHON").tolist()]

def test_disk_forms_match_stock(tmp_path):
  stock = _disk_forms(tmp_path, "s")
  calls0 = bridge.stats()["bridged"]
  with bridge.installed(strict=True): ours = _disk_forms(tmp_path, "b")
  assert bridge.stats()["bridged"] > calls0 and ours == stock and stock[0] == [[1], [3]]

@pytest.mark.parametrize("mode", ["strict", "fallback"])
def test_disk_non_contiguous_views_raise_tinygrads_error(tmp_path, mode):
  """tinygrad raises 'non-contiguous view is not supported' for strided/permuted DISK views; the bridge keeps it."""
  dt = Tensor([[0, 1, 2], [3, 4, 5]], device="PYTHON").to(f"disk:{tmp_path / 'p'}").realize()
  with bridge.installed(strict=mode == "strict"):
    for read in (lambda: dt.T.tolist(), lambda: dt.reshape(-1)[::2].tolist()):
      with pytest.raises(RuntimeError, match="non-contiguous view is not supported"): read()

def test_strict_refuses_by_name_and_fallback_counts():
  bridge.reset_stats()
  opts = lambda: (Tensor([1.0, 2.0], device="PYTHON") + 1).contiguous(arg=(1,)).realize()   # CONTIGUOUS with options
  with bridge.installed(strict=True):
    with pytest.raises(BridgeRefusal, match=r"form:contiguous-with-options"): opts()
  with bridge.installed(strict=False): assert opts().tolist() == [2.0, 3.0]
  s = bridge.stats()
  assert s["refused"] == 1 and s["fallback"] == 1 and s["reasons"] == {"form:contiguous-with-options": 2}
  assert "1 fell back" in bridge.summary() and "form:contiguous-with-options" in bridge.summary()

def test_install_idempotent_and_context_restores():
  import tinygrad.tensor as tt
  bridge.uninstall(); bridge.uninstall()
  assert tt.transform_to_call is bridge.STOCK_TRANSFORM and bridge.is_installed() is None
  bridge.install(); bridge.install()
  assert tt.transform_to_call is not bridge.STOCK_TRANSFORM and bridge.is_installed() == "fallback"
  with bridge.installed(strict=True): assert bridge.is_installed() == "strict"
  assert bridge.is_installed() == "fallback"
  bridge.uninstall()
  with bridge.installed(): pass
  assert tt.transform_to_call is bridge.STOCK_TRANSFORM

def test_opaque_ops_refused_by_callsat_executors():
  """callsat carries tinygrad's arithmetic opaque: its own executors must refuse it by name, never compute it."""
  from tinygrad.uop.ops import UOp
  from egraph.bridge.convert import to_callsat
  from egraph.engine.driver import callify
  from lower.runtime import run_call
  x = Tensor.rand(3, device="PYTHON")
  cv, roots = to_callsat(UOp.sink(x.uop))
  res = callify(*roots, cache=False)
  with pytest.raises(CallsatError, match="host framework's op"): run_call(res.call)

def test_body_is_deterministic():
  """The CALL body is tinygrad's schedule-cache key: the same graph gives the same body in every process."""
  import subprocess, sys
  code = ("from tinygrad import Tensor, nn\nfrom tinygrad.uop.ops import UOp\nfrom egraph.tinygrad import transform_to_call\n"
          "Tensor.manual_seed(0)\nl=nn.Linear(4,3)\nx=Tensor.empty(2,4, device='NULL')\n"
          "c,_=transform_to_call(UOp.sink((l(x).relu()+x[:, :3]).contiguous().uop))\nprint(c.src[0].key.hex())")
  env = {**os.environ, "DEV": "NULL", "PYTHONHASHSEED": "random"}
  keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout for _ in range(2)}
  assert len(keys) == 1
