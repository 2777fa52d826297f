"""Bridge bugs found by running tinygrad's own tests, each pinned against stock tinygrad: the same values and the same
kernel count, with the structural cache on (a second run is rebound from it) and off.

* A BITCAST of a realized buffer read by a kernel stays in that kernel, as tinygrad 0.14's callify leaves it: the bridge
  folded it into a retyped view, so `a.bitcast(dtypes.bfloat16).numpy()` (a bf16 -> float32 kernel) got a `__bf16*`
  argument, which clang here cannot compile (15 losses in test_dtype.py: every `test_bitcast`). tinygrad folds a BITCAST
  into a view only under a CONTIGUOUS or COPY, as an assign's target, or as a realize point.
* An assign into a computed value drops the value it overwrites, as tinygrad's callify does (it replaces
  AFTER(t, STORE(t, v)) whose t is no buffer by CONTIGUOUS(v)): the bridge computed a lazy `Tensor.uniform` the assign
  overwrites (6 kernels, stock 1) and stored a host copy into a fresh buffer before copying it into the assign's (2,
  stock 1); test_nn.py's test_lstm_cell scheduled 28 kernels against stock's 24."""
import contextlib, shutil
import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")
import tinygrad.tensor as tg_tensor   # noqa: E402
from tinygrad import Tensor, GlobalCounters, Context, dtypes, nn   # noqa: E402
from egraph import tinygrad as bridge   # noqa: E402
from egraph.bridge.cache import StructureCache, from_env   # noqa: E402

@contextlib.contextmanager
def _calls():
  """The CALLs the pass in use (stock or bridged) returns inside the block."""
  inner, seen = tg_tensor.transform_to_call, []
  def recording(sink):
    call, bmap = inner(sink)
    seen.append(call)
    return call, bmap
  tg_tensor.transform_to_call = recording
  try: yield seen
  finally: tg_tensor.transform_to_call = inner

@contextlib.contextmanager
def _stock():
  bridge.uninstall()
  yield

def _run(build, device: str, bridged: bool):
  """(values, kernel count, dtypes of every CALL argument) of the tensors `build` makes, realized on `device`."""
  with Context(DEV=device):
    Tensor.manual_seed(1234)
    GlobalCounters.reset()
    with (bridge.installed(strict=True) if bridged else _stock()), _calls() as calls:
      outs = build()
      Tensor.realize(*outs)
      kernels = GlobalCounters.kernel_count
      vals = [o.numpy() for o in outs] if device != "NULL" else []
  return vals, kernels, {a.dtype for c in calls for a in c.src[1:]}

@pytest.fixture(params=["cache", "no-cache"])
def cache(request):
  bridge.set_cache(StructureCache() if request.param == "cache" else None)
  yield request.param
  bridge.set_cache(from_env())

def _same_as_stock(build, device: str, values: bool = True) -> None:
  want, want_k, want_dt = _run(build, device, bridged=False)
  for _ in range(2):   # the second run of the structure is rebound from the cache when it is on
    got, k, dt = _run(build, device, bridged=True)
    assert k == want_k, f"{k} kernels bridged, stock {want_k}"
    assert dt <= want_dt, f"CALL arguments of dtypes stock never passes: {dt - want_dt}"
    if values:
      for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

# ---- a BITCAST read by a kernel stays in the kernel ---------------------------------------------------------------------

def _bf16_of_int16():
  a = Tensor(np.arange(-16, 16, dtype=np.int16)).realize()
  return [a.bitcast(dtypes.bfloat16).float()]   # what .numpy() of a bf16 tensor realizes

def _bf16_of_half():   # the pair hypothesis found in TestBitCast.test_shape_change_bitcast
  h = Tensor(np.linspace(-3, 3, 32, dtype=np.float16).reshape(2, 2, 8)).realize()
  return [h.bitcast(dtypes.bfloat16).float()]

def _bf16_of_int32():   # size-changing: the last dim doubles
  return [Tensor(np.arange(8, dtype=np.int32).reshape(2, 4) * 70001).realize().bitcast(dtypes.bfloat16).float()]

def _bitcast_in_compute():
  a = Tensor(np.arange(12, dtype=np.int16).reshape(3, 4)).realize()
  return [a.bitcast(dtypes.uint16) + 1, a[1:].bitcast(dtypes.half) * 2]

def _bitcast_views():   # where tinygrad does fold the bitcast into a view: realized as itself, zero kernels
  a = Tensor(np.arange(16, dtype=np.int16)).realize()
  return [a[2:10].bitcast(dtypes.int32), a.bitcast(dtypes.uint16)]

BITCASTS = {f.__name__[1:]: f for f in [_bf16_of_int16, _bf16_of_half, _bf16_of_int32, _bitcast_in_compute, _bitcast_views]}

@pytest.mark.skipif(shutil.which("clang") is None, reason="tinygrad's CPU device compiles with clang")
@pytest.mark.parametrize("name", list(BITCASTS))
def test_bitcast_on_cpu_as_stock(name, cache):
  """On tinygrad's CPU device (clang): a kernel with a bf16 buffer argument does not compile here, stock or bridged."""
  _same_as_stock(BITCASTS[name], "CPU")

@pytest.mark.parametrize("name", list(BITCASTS))
def test_bitcast_args_as_stock(name, cache):
  """The CALLs pass no buffer of a dtype stock's do not (on tinygrad's NULL device: no compiler needed)."""
  _same_as_stock(BITCASTS[name], "NULL", values=False)

def test_bf16_bitcast_is_no_call_argument():
  """The repro: stock reads `short*` and bitcasts in the kernel; the bridge passed `BITCAST(BUFFER short)` as bf16."""
  _, _, dts = _run(_bf16_of_int16, "NULL", bridged=True)
  assert dtypes.bfloat16 not in dts and dtypes.int16 in dts

# ---- an assign into a computed value drops the value it overwrites ---------------------------------------------------

def _assign_over_lazy_init():
  w = Tensor.uniform(64, 16)
  return [w.assign(Tensor(np.full((64, 16), 7, np.float32)))]

def _assign_over_computed():
  r = Tensor(np.ones((64, 16), np.float32)).realize()
  w = r + 1
  return [w.assign(Tensor(np.arange(64 * 16, dtype=np.float32).reshape(64, 16)))]

def _assign_over_computed_still_read():   # the old value has another reader: it is computed for that reader only
  r = Tensor(np.ones((4, 4), np.float32)).realize()
  w = r * 3
  y = w + 1
  return [y, w.assign(Tensor(np.full((4, 4), 2, np.float32)))]

def _lstm_cell():   # tinygrad's test_nn.py TestNN.test_lstm_cell, without torch
  layer = nn.LSTMCell(32, 16)
  rng = np.random.default_rng(0)
  for w in (layer.weight_hh, layer.weight_ih, layer.bias_hh, layer.bias_ih):
    w.assign(rng.standard_normal(w.shape).astype(np.float32) * 0.1)
  inp = Tensor.randn(1, 32)
  h, c = layer(inp)
  h.realize(), c.realize()
  h2, c2 = layer(inp, (h, c))
  return [h, c, h2, c2]

ASSIGNS = {f.__name__[1:]: f for f in [_assign_over_lazy_init, _assign_over_computed, _assign_over_computed_still_read,
                                       _lstm_cell]}

@pytest.mark.parametrize("name", list(ASSIGNS))
def test_assign_over_computed_values_as_stock(name, cache):
  _same_as_stock(ASSIGNS[name], "PYTHON")

@pytest.mark.parametrize("name", list(ASSIGNS))
def test_assign_over_computed_kernel_counts_as_stock(name, cache):
  _same_as_stock(ASSIGNS[name], "NULL", values=False)

def test_assign_over_lazy_init_runs_one_kernel():
  """The repro: the uniform init the assign overwrites is never computed (stock: 1 kernel, the host copy)."""
  assert _run(_assign_over_lazy_init, "NULL", bridged=False)[1] == 1
  assert _run(_assign_over_lazy_init, "NULL", bridged=True)[1] == 1
