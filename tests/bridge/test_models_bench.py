"""bench/models.py's value verdicts: exact for strict/fallback, tinygrad's own float tolerance for the cost option."""
import math, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import models   # noqa: E402

def test_identical_runs():
  assert models.compare([[1, 2.5], [3]], [[1, 2.5], [3]]) == (True, 0.0, 0.0, None, True)

def test_float_within_tolerance_is_not_identical():
  same, dabs, drel, first, close = models.compare([[1.0], [2.0 + 1e-5]], [[1.0], [2.0]])
  assert (same, first, close) == (False, 1, True)
  assert math.isclose(dabs, 1e-5, rel_tol=1e-6) and math.isclose(drel, 1e-5 / (2.0 + 1e-5), rel_tol=1e-6)

def test_float_beyond_tolerance():
  assert models.compare([[2.01]], [[2.0]])[4] is False
  assert models.compare([[1e-5]], [[0.0]])[4] is False   # atol 1e-6 near zero

def test_token_must_be_identical():
  same, _, _, first, close = models.compare([[7], [8]], [[7], [9]])
  assert (same, first, close) == (False, 1, False)

def test_nan_equal_and_shape_mismatch():
  assert models.compare([[float("nan")]], [[float("nan")]])[0] is True
  assert models.compare([[float("nan")]], [[1.0]])[4] is False
  assert models.compare([[1.0, 2.0]], [[1.0]]) == (False, math.inf, math.inf, 0, False)
