"""The four fp8 dtypes on the host (egraph.ir.dtype): the table against tinygrad 0.14's, decoding all 256 patterns and
encoding a sweep (ties, subnormals, overflow, inf, NaN, -0) bit for bit against tinygrad's fp8_to_float /
float_to_fp8, and the numpy reference (lower/numeric.py) computing in float32 and rounding back as tinygrad rounds."""
import math
import ml_dtypes
import numpy as np
import pytest
from egraph.ir.dtype import dtypes, to_fp8_bits, as_np, least_upper_dtype, sum_acc_dtype, FP8
from egraph.ir.errors import DTypeError
from egraph.ir.ops import Ops
from lower import numeric
from fp8_oracle import sweep, tinygrad_bits, tinygrad_values, tinygrad_dtype

FP8S = dtypes.fp8s
ids = lambda d: d.name

@pytest.mark.parametrize("dt", FP8S, ids=ids)
def test_table_matches_tinygrad(dt):
  tg, td = tinygrad_dtype(dt)
  assert (dt.priority, dt.itemsize, dt.finfo()) == (td.priority, td.itemsize, tg.dtypes.finfo(td))
  assert dtypes.from_any(td.name) is dt and dtypes.from_any(dt.name) is dt and dtypes.from_numpy(dt.np) is dt
  assert dt.is_float() and dt in dtypes.floats and dt in dtypes.all
  v = tinygrad_values(dt)
  f = FP8[dt.name]
  assert v[f.max_bits] == np.nanmax(v[np.isfinite(v)])   # max_bits is the largest finite value
  assert (dt.name == "fp8e5m2") == bool(np.isinf(v).any())   # only e5m2 has inf

@pytest.mark.parametrize("dt", FP8S, ids=ids)
def test_decode_all_256_patterns(dt):
  want = tinygrad_values(dt)
  got = np.arange(256, dtype=np.uint8).view(dt.np).astype(np.float64)
  assert np.array_equal(np.isnan(got), np.isnan(want))
  ok = ~np.isnan(want)
  assert np.array_equal(got[ok], want[ok]) and np.array_equal(np.signbit(got[ok]), np.signbit(want[ok]))

@pytest.mark.parametrize("dt", FP8S, ids=ids)
def test_encode_sweep(dt):
  xs = sweep(dt)
  np.testing.assert_array_equal(to_fp8_bits(xs, dt), tinygrad_bits(xs, dt))
  with np.errstate(over="ignore"): x32 = xs.astype(np.float32)   # float32/16 and bfloat16 inputs: the value they hold
  np.testing.assert_array_equal(to_fp8_bits(x32, dt), tinygrad_bits(x32, dt))
  for src in (np.float16, ml_dtypes.bfloat16):
    with np.errstate(over="ignore"): h = xs.astype(src)
    np.testing.assert_array_equal(as_np(h, dt).view(np.uint8), tinygrad_bits(h.astype(np.float64), dt))

def test_saturation_inf_nan_and_zero_by_type():
  """What the sweep checks, spelled out: finite overflow saturates, inf and NaN as each type has them, fnuz has no -0."""
  x = [1e6, -1e6, np.inf, -np.inf, np.nan, -0.0, 2.0 ** -30]
  assert to_fp8_bits(x, dtypes.fp8e4m3).tolist() == [0x7E, 0xFE, 0x7F, 0xFF, 0x7F, 0x80, 0x00]
  assert to_fp8_bits(x, dtypes.fp8e5m2).tolist() == [0x7B, 0xFB, 0x7C, 0xFC, 0x7F, 0x80, 0x00]
  for d in (dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz): assert to_fp8_bits(x, d).tolist() == [0x7F, 0xFF, 0x80, 0x80, 0x80, 0x00, 0x00]
  assert to_fp8_bits([-2.0 ** -30], dtypes.fp8e4m3fnuz).tolist() == [0]   # a negative underflow is +0 in fnuz

def test_bad_dtype_is_named():
  with pytest.raises(DTypeError, match="float32 is not an fp8"): to_fp8_bits([1.0], dtypes.float32)

def test_promotion_includes_fp8_as_tinygrad():
  """Every pair against tinygrad's least_upper_dtype (also over all dtypes in tests/frontend/test_dtypes_tensor.py)."""
  tg, _ = tinygrad_dtype(dtypes.fp8e4m3)
  back = {getattr(tg.dtypes, d.name): d for d in dtypes.all}
  for a in dtypes.all:
    for b in FP8S:
      want = tg.least_upper_dtype(getattr(tg.dtypes, a.name), getattr(tg.dtypes, b.name))
      assert least_upper_dtype(a, b) is back[want] and least_upper_dtype(b, a) is back[want], (a, b)
  assert least_upper_dtype(dtypes.int64, dtypes.uint64) is dtypes.float32   # tinygrad's weak float: the default float
  assert all(sum_acc_dtype(d) is dtypes.float32 for d in FP8S)

@pytest.mark.parametrize("dt", FP8S, ids=ids)
def test_reference_ops_round_back_as_tinygrad(dt):
  """numeric.alu: the float32 result of the op rounded with float_to_fp8 (ml_dtypes' own fp8 add would overflow to NaN
  or inf); casts in and out; constants."""
  v = tinygrad_values(dt)
  fin = v[np.isfinite(v)]
  a = as_np(np.repeat(fin, 8)[::7], dt)
  b = as_np(np.roll(np.repeat(fin, 8)[::7], 5), dt)
  fa, fb = a.astype(np.float32), b.astype(np.float32)
  for op, f in ((Ops.ADD, np.add), (Ops.MUL, np.multiply), (Ops.SUB, np.subtract), (Ops.MAX, np.maximum)):
    got = numeric.alu(op, dt, a, b)
    assert got.dtype == dt.np
    np.testing.assert_array_equal(got.view(np.uint8), tinygrad_bits(f(fa, fb), dt), err_msg=op.name)
  assert numeric.alu(Ops.CMPLT, dt, a, b).tolist() == (fa < fb).tolist()
  big = FP8[dt.name].max_bits
  assert numeric.alu(Ops.ADD, dt, *(np.array([big], np.uint8).view(dt.np),) * 2).view(np.uint8).tolist() == [big]
  xs = sweep(dt, 200)
  np.testing.assert_array_equal(numeric.cast(xs, dtypes.float64, dt).view(np.uint8), tinygrad_bits(xs, dt))
  np.testing.assert_array_equal(numeric.cast(np.arange(-300, 300), dtypes.int64, dt).view(np.uint8), tinygrad_bits(np.arange(-300, 300), dt))
  assert numeric.wrap_const(1e9, dt).view(np.uint8) == big and math.isnan(float(numeric.wrap_const(math.nan, dt)))
  np.testing.assert_array_equal(numeric.cast(np.arange(256, dtype=np.uint8).view(dt.np), dt, dtypes.float64), tinygrad_values(dt))
