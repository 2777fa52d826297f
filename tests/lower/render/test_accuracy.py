"""Accuracy of big float32 reductions on the native backends (issue 15, item 7): sums of tens of millions of float32
values within 10x numpy's error against the exact (float64) sum, sums of broadcast constants of 10^10-10^12 elements
folded to n*c (within 2e-6 relative, and instant), mean and var, row and column sums, the same bits whatever the thread
split, half inputs summed in float32, and the CUDA renderer's blocked sums on the CPU emulator. Values only: no timings."""
import shutil
import numpy as np
import pytest
from egraph import callify
from egraph.frontend.tensor import Tensor
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Node, Ops, new_buffer
from egraph.ir.storage import Storage
from lower.render.cuda import render as cuda
from lower.device import cuda as cuda_dev
from lower.device import native
N = 20_000_000          # big enough that one float32 accumulator drifts (it was 3e-5 off for 0.1), ~0.1 s a sum
ULP = 2.0 ** -24        # a floor for numpy's error where it happens to be exact

def rel(got, exact) -> float: return float(np.max(np.abs(np.asarray(got, np.float64) - exact) / np.abs(exact)))

@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(7)
  return {"0.1": np.full(N, 0.1, np.float32), "uniform": rng.random(N, dtype=np.float32),
          "normal+3": (rng.standard_normal(N, dtype=np.float32) + 3).astype(np.float32)}

@pytest.mark.parametrize("kind", ["0.1", "uniform", "normal+3"])
def test_sum_within_10x_numpy(data, kind):
  x = data[kind]
  exact = x.astype(np.float64).sum()
  got = Tensor(x).sum().numpy()
  assert got.dtype == np.float32
  assert rel(got, exact) <= 10 * max(rel(x.sum(), exact), ULP), (rel(got, exact), rel(x.sum(), exact))

def test_sum_of_odd_length_is_blocked():
  """A length with no partial-sum split (prime): one kernel, one reduce over all of it, blocked in the renderer."""
  n = 19_999_999
  x = np.full(n, 0.1, np.float32)
  exact = float(np.float32(0.1)) * n
  assert rel(Tensor(x).sum().numpy(), exact) <= 10 * max(rel(x.sum(), exact), ULP)

@pytest.mark.parametrize("shape", [(10**5, 10**5), (10**6, 10**5), (10**6, 10**6), (7, 10**6, 142857)])
@pytest.mark.parametrize("c", [0.1, 1 / 3, -2.5e-3])
def test_constant_sums_fold_to_n_times_c(shape, c):
  n, c32 = np.prod(shape, dtype=np.float64), float(np.float32(c))
  t = Tensor.full(shape, c)
  assert rel(t.sum().numpy(), n * c32) <= 2e-6
  assert rel(t.mean().numpy(), c32) <= 2e-6
  lead = tuple(range(len(shape) - 1))   # every axis but the last: one value per column
  assert rel(t.sum(axis=lead).numpy(), np.prod(shape[:-1], dtype=np.float64) * c32) <= 2e-6
  assert rel(Tensor.ones(shape).sum().numpy(), n) <= 2e-6

def test_broadcast_rows_fold_the_broadcast_axis():
  rng = np.random.default_rng(3)
  r = rng.random(1000, dtype=np.float32) + 0.5
  t = Tensor(r).reshape(1, 1000).expand(10**7, 1000)      # 10^10 elements, one row repeated
  exact = r.astype(np.float64)
  assert rel(t.sum(axis=0).numpy(), 10**7 * exact) <= 2e-6
  assert rel(t.sum().numpy(), 10**7 * exact.sum()) <= 2e-6
  assert rel(t.max().numpy(), r.max()) == 0

def test_mean_and_var(data):
  x = data["normal+3"]
  x64 = x.astype(np.float64)
  m, v = x64.mean(), x64.var(ddof=1)
  t = Tensor(x)
  assert rel(t.mean().numpy(), m) <= 10 * max(rel(x.mean(), m), ULP)
  assert rel(t.var().numpy(), v) <= 10 * max(rel(x.var(ddof=1), v), ULP)
  assert rel(t.std().numpy(), np.sqrt(v)) <= 10 * max(rel(x.std(ddof=1), np.sqrt(v)), ULP)

@pytest.mark.parametrize("shape", [(2000, 10000), (10000, 2000), (2_000_000, 10)])
@pytest.mark.parametrize("kind", ["0.1", "uniform"])
def test_row_and_column_sums(data, shape, kind):
  x = data[kind][:shape[0] * shape[1]].reshape(shape)
  t = Tensor(x)
  for axis in (0, 1):
    exact = x.astype(np.float64).sum(axis=axis)
    got = t.sum(axis=axis).numpy()
    # numpy sums columns row by row (3e-5 off for 2000 rows of 0.1, 2e-2 for 3e6): the bound there is absolute
    assert rel(got, exact) <= (10 * max(rel(x.sum(axis=axis), exact), ULP) if axis == 1 else 2e-6), (axis, rel(got, exact))
  m64 = x.astype(np.float64).mean(axis=0)
  assert rel(t.mean(axis=0).numpy(), m64) <= 2e-6

@pytest.mark.parametrize("threads,pool", [(1, True), (2, True), (2, False), (3, False)])
def test_same_bits_whatever_the_thread_split(monkeypatch, data, threads, pool):
  """Kernels split over output rows (each output is summed by one thread), a full sum into partial sums first: the
  same bits with 1-3 threads, on the native pool or on Python workers (lower/device/threads.py), in many rounds."""
  x = data["uniform"][:12_000_000]
  def sums(): return [Tensor(x).sum().numpy(), Tensor(x.reshape(3000, 4000)).sum(axis=1).numpy(),
                      Tensor(x.reshape(4000, 3000)).sum(axis=0).numpy()]
  monkeypatch.setattr(native, "THREADS", 1)
  want = sums()
  monkeypatch.setattr(native, "THREADS", threads)
  monkeypatch.setattr(native, "ROUND_WORK", 1 << 21)
  if not pool: monkeypatch.setattr(native, "pool", lambda disk=None: None)
  got = sums()
  for a, b in zip(want, got): np.testing.assert_array_equal(a, b)
  assert rel(got[0], x.astype(np.float64).sum()) <= 10 * max(rel(x.sum(), x.astype(np.float64).sum()), ULP)

@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
def test_half_inputs_sum_in_blocked_float32(dt):
  h = Tensor.full((20_000_000,), 0.1, dtype=dt).realize()
  c = float(Tensor.full((1,), 0.1, dtype=dt).cast(dtypes.float32).numpy()[0])
  assert rel(h.sum(dtype=dtypes.float32).numpy(), 2e7 * c) <= 2e-6
  assert rel(h.cast(dtypes.float32).mean().numpy(), c) <= 2e-6

def test_python_reference_is_numpy():
  x = np.full(N, 0.1, np.float32)
  assert Tensor(x, device="PYTHON").sum().numpy() == x.sum()

@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")
@pytest.mark.parametrize("mode", ["auto", "serial"])
def test_cuda_blocked_sums_on_the_emulator(mode):
  """Block form: 256 threads, 4096 steps each; serial: one thread per row, 2^20 steps (was 1e-2 off for 0.1)."""
  S = Storage()
  shape = (2, 1 << 20)
  b = new_buffer(shape[0] * shape[1], dtypes.float32, "CPU")
  S.set_data(b, np.full(shape[0] * shape[1], 0.1, np.float32))
  r = callify(Node(Ops.REDUCE, None, (b.reshape(shape),), (Ops.ADD, (1,))))
  (lw,) = cuda.plans([r.call], reduce=mode)
  assert "double" in lw.kernels[0].source
  emu = cuda_dev.emulator()
  got = S.copy()
  cuda_dev.run_lowered(lw, got, emu, emu.load(lw.plan))
  assert rel(got[r.call.src[1]], float(np.float32(0.1)) * shape[1]) <= 2e-6
