"""Python scalars meeting a tensor (egraph/frontend/promote.py `specializes`, hostdata.py `scalar_operand`): a value that
is not its kernel's code enters as a 1-element argument, so a loop over new scalars compiles its kernels once and hits
callify's result cache; the values that specialize (0, 1, -1, 2, 0.5, bools, exponents, divisors, shifts, half and
low-precision dtypes) stay CONSTs. Values against numpy either way."""
import math
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.ir.dtype import dtypes
from egraph.ir.errors import DTypeError
from egraph.ir.ops import Ops, toposort
from egraph.frontend.promote import specializes, SPECIAL_VALUES
from lower.device.cache import CACHE
from egraph.ir.storage import STORAGE

X = np.linspace(-3, 3, 64, dtype=np.float32)

def _consts(t: Tensor) -> list:
  return [n.arg[0] for n in toposort([t.node]) if n.op is Ops.CONST]

def _scalar_args(t: Tensor) -> int:
  """Realized 1-element buffers under t: the scalar arguments."""
  return sum(1 for n in toposort([t.node]) if n.op is Ops.BUFFER and n.arg.size == 1 and n in STORAGE)

def test_a_loop_over_new_scalars_compiles_once():
  """The first iteration compiles; nine new scalars after it compile nothing and hit callify's cache."""
  y = X + 4   # positive: its sum is not a cancellation
  (Tensor(y) * 0.37).sum(0).numpy()
  c0 = CACHE.compiled
  for i in range(1, 10):
    s = 0.37 + i / 7
    t = (Tensor(y) * s).sum(0)
    assert callify(t).report.cache_hit
    np.testing.assert_allclose(t.numpy(), (y * np.float32(s)).sum(), rtol=1e-5)
  assert CACHE.compiled == c0

def test_an_sgd_step_with_a_decaying_rate_compiles_once():
  w0, g0 = np.ones(32, np.float32), np.arange(32, dtype=np.float32)
  w, g, ref = Tensor(w0).realize(), Tensor(g0).realize(), w0.copy()
  w.assign(w - 0.3 * g).realize(); ref -= np.float32(0.3) * g0
  c0 = CACHE.compiled
  for i in range(1, 8):
    lr = 0.3 / (1 + i)
    w.assign(w - lr * g).realize(); ref -= np.float32(lr) * g0
  np.testing.assert_allclose(w.numpy(), ref, rtol=1e-6)
  assert CACHE.compiled == c0

def test_a_mask_from_a_loop_counter_compiles_once():
  a = np.arange(40, dtype=np.int32)
  (Tensor(a) < 7).where(Tensor(a), 0).sum().numpy()
  c0 = CACHE.compiled
  for i in range(8, 20):
    assert (Tensor(a) < i).where(Tensor(a), 0).sum().item() == a[:i].sum()
  assert CACHE.compiled == c0

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                   np.uint32, np.uint64])
def test_scalar_arguments_give_numpys_values(dtype):
  """Each argument dtype, in add, mul, sub, max, compare and where, the scalar on either side."""
  a = (np.arange(24) % 11 + 3).astype(dtype)
  s = 7 if np.dtype(dtype).kind in "iu" else 3.25
  t = Tensor(a)
  for got, want in [(t + s, a + dtype(s)), (t * s, a * dtype(s)), (s - t if np.dtype(dtype).kind != "u" else t - s, None),
                    (t.maximum(s), np.maximum(a, dtype(s))), (t < s, a < dtype(s)), ((t < s).where(s, t), np.where(a < s, dtype(s), a))]:
    if want is None: want = (dtype(s) - a) if np.dtype(dtype).kind != "u" else a - dtype(s)
    assert _scalar_args(got) >= 1
    np.testing.assert_array_equal(got.numpy(), want)

@pytest.mark.parametrize("v", [math.inf, -math.inf, math.nan, 1e-30, -2.5e38])
def test_special_floats_are_arguments_and_right(v):
  t = Tensor(X) * v
  assert _scalar_args(t) == 1 and not [c for c in _consts(t) if c != 0]
  with np.errstate(all="ignore"): want = X * np.float32(v)
  np.testing.assert_array_equal(t.numpy(), want)

@pytest.mark.parametrize("v", sorted(SPECIAL_VALUES))
def test_special_values_stay_constants(v):
  t = Tensor(X) * v + v
  assert _scalar_args(t) == 0 and float(v) in _consts(t)
  np.testing.assert_allclose(t.numpy(), X * np.float32(v) + np.float32(v), rtol=1e-6)

def test_values_that_are_the_code_stay_constants():
  """Exponents, integer divisors and moduli, shift amounts, bools, half precision and fp8: CONSTs, values right."""
  a = np.arange(1, 17, dtype=np.int32)
  cases = [(Tensor(X) ** 3, X ** 3), (Tensor(a) // 3, a // 3), (Tensor(a) % 5, a % 5), (Tensor(a) << 3, a << 3),
           (Tensor(a) >> 1, a >> 1), (Tensor(a) * True, a), (Tensor(X).cast(dtypes.float16) * 3.7, (X.astype(np.float16) * np.float16(3.7)))]
  for t, want in cases:
    assert _scalar_args(t) == 0, t
    np.testing.assert_allclose(t.numpy().astype(np.float64), np.asarray(want, np.float64), rtol=1e-3)
  assert specializes(3.7, dtypes.bfloat16, "CPU") and specializes(3.7, dtypes.fp8e4m3, "CPU")
  assert specializes(3.7, dtypes.float32, None) and specializes(3.7, dtypes.float32, ("CPU", "CPU:1"))
  assert not specializes(3.7, dtypes.float32, "CPU") and not specializes(7, dtypes.int32, "CPU", "ADD")
  assert specializes(7, dtypes.int32, "CPU", "FDIV") and not specializes(7.0, dtypes.float32, "CPU", "FDIV")

def test_const_mode_keeps_every_scalar_a_constant(monkeypatch):
  monkeypatch.setenv("CALLSAT_SCALARS", "const")
  t = Tensor(X) * 0.37
  assert _scalar_args(t) == 0 and 0.37 in [round(c, 6) for c in _consts(t)]
  np.testing.assert_allclose(t.numpy(), X * np.float32(0.37), rtol=1e-6)
  monkeypatch.setenv("CALLSAT_SCALARS", "fast")
  with pytest.raises(DTypeError, match="CALLSAT_SCALARS"): Tensor(X) * 0.37

def test_a_pure_constant_expression_stays_device_less():
  t = Tensor(2.0) * 3.5 + 1.25
  assert _scalar_args(t) == 0 and t.item() == 8.25

def test_the_report_says_which_value_each_scalar_argument_holds():
  """On a miss and on a cache hit, the CALL's scalar arguments with their values (the report's `scalars`)."""
  y = X + 4
  r1 = callify((Tensor(y) * 0.37 + 2.25).sum(0))
  r2 = callify((Tensor(y) * 1.75 + 3.5).sum(0))
  assert r2.report.cache_hit
  assert sorted(r1.report.scalars.values()) == [pytest.approx(0.37), 2.25] and sorted(r2.report.scalars.values()) == [1.75, 3.5]
  assert "scalars" in str(r2.report) and "= 3.5" in str(r2.report)
