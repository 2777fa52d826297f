"""tinygrad 0.14's own fp8 conversions as the oracle for the fp8 tests (tests skip where tinygrad is absent), and the
values they sweep: every fp8 value, the midpoints between neighbours (ties), one float32 and one float64 step either
side of each, the overflow thresholds, subnormals, +-inf, NaN, -0 and random magnitudes over the whole range."""
import numpy as np
import pytest

def tinygrad_dtype(dt):
  tg = pytest.importorskip("tinygrad.dtype")
  return tg, getattr(tg.dtypes, dt.name)

def tinygrad_bits(xs, dt) -> np.ndarray:
  """float_to_fp8 of each value (as the Python float tinygrad takes)."""
  tg, td = tinygrad_dtype(dt)
  return np.array([tg.float_to_fp8(float(x), td) for x in np.asarray(xs, np.float64).reshape(-1)], np.uint8)

def tinygrad_values(dt) -> np.ndarray:
  """fp8_to_float of all 256 bit patterns, as float64."""
  tg, td = tinygrad_dtype(dt)
  return np.array([tg.fp8_to_float(b, td) for b in range(256)], np.float64)

def sweep(dt, n_random: int = 4000, seed: int = 0) -> np.ndarray:
  v = tinygrad_values(dt)
  fin = np.unique(np.abs(v[np.isfinite(v)]))
  mids = (fin[1:] + fin[:-1]) / 2
  top = fin.max() + (fin.max() - fin[-2]) / 2   # the overflow threshold: where nearest even would leave the range
  m32 = mids.astype(np.float32)
  pts = [fin, mids, np.nextafter(mids, np.inf), np.nextafter(mids, 0), np.nextafter(m32, np.float32(np.inf)),
         np.nextafter(m32, np.float32(0)), [top, np.nextafter(top, 0), np.nextafter(top, np.inf), fin.max() * 4, 1e30,
         3.4e38, 1e300, fin[1] / 2, fin[1] / 4, 1e-30, 5e-324, np.inf, np.nan, 0.0],
         np.random.default_rng(seed).standard_normal(n_random) * np.exp2(np.random.default_rng(seed + 1).integers(-24, 20, n_random))]
  x = np.concatenate([np.asarray(p, np.float64) for p in pts])
  return np.concatenate([x, -x])
