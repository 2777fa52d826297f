"""Every tinygrad dtype and the integer and power ops through the Tensor front end, on CPU (native LLVM) and PYTHON
(the reference), against numpy, and against tinygrad 0.14 where numpy has no such rule (promotion, float->int casts,
division by zero, the Threefry RNG)."""
import itertools
import ml_dtypes
import numpy as np
import pytest
from egraph.ir.dtype import dtypes, least_upper_dtype, sum_acc_dtype
from egraph.ir.errors import DTypeError
from egraph.frontend.tensor import Tensor

DEVICES = ("CPU", "PYTHON")
INTS = [d for d in dtypes.ints]
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]

def _np(d): return np.float32 if d in (dtypes.bfloat16, *dtypes.fp8s) else d.np   # what .numpy() gives

try: import tinygrad.dtype as _tg
except ImportError: _tg = None

def _into(x, d):
  """x converted to d as tinygrad converts: numpy's conversion, but into fp8 tinygrad's own float_to_fp8 (ml_dtypes'
  overflows to NaN/inf where tinygrad saturates); None for fp8 without tinygrad."""
  if d not in dtypes.fp8s: return np.asarray(x).astype(d.np)
  if _tg is None: return None
  td = getattr(_tg.dtypes, d.name)
  bits = [_tg.float_to_fp8(float(v), td) for v in np.asarray(x).astype(np.float64).reshape(-1)]
  return np.array(bits, np.uint8).reshape(np.shape(x)).view(d.np)

# ---- construction: numpy inputs keep their dtype and values ----------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_numpy_inputs_keep_dtype_and_values(device):
  cases = [np.array([1e300, -2.5], np.float64), np.array([2**63 + 5, 7], np.uint64), np.array([-128, 127], np.int8),
           np.array([-32768, 5], np.int16), np.array([65535, 1], np.uint16), np.array([2**32 - 1, 3], np.uint32),
           np.array([1.5, -3.25], ml_dtypes.bfloat16)]
  for a in cases:
    t = Tensor(a, device=device)
    assert t.dtype == dtypes.from_numpy(a.dtype)
    got = t.numpy()
    if a.dtype == ml_dtypes.bfloat16: assert got.dtype == np.float32 and (got == a.astype(np.float32)).all()
    else: assert got.dtype == a.dtype and (got == a).all()
  assert Tensor([1.0, 2.0], dtype="float64").dtype == dtypes.float64
  assert Tensor([1.0, 2.0]).dtype == dtypes.float32 and Tensor([1, 2]).dtype == dtypes.int32   # Python data: defaults
  with pytest.raises(DTypeError, match="complex"): Tensor(np.zeros(2, np.complex64))

def test_literals_wrap_to_the_inferred_dtype():
  """tinygrad: a Python int that does not fit the dtype wraps (Tensor([2**40]) is int32 0)."""
  assert Tensor([2**40], device="PYTHON").numpy().tolist() == [0]
  assert (Tensor([1], dtype=dtypes.int8, device="PYTHON") + 200).numpy().tolist() == [-55]
  assert (Tensor([1], dtype=dtypes.uint8, device="PYTHON") - 2).numpy().tolist() == [255]

# ---- promotion follows tinygrad 0.14 ---------------------------------------------------------------------------------

def test_promotion_matches_tinygrad():
  tg = pytest.importorskip("tinygrad.dtype")
  name = {d.name: d for d in dtypes.all}
  tmap = {d: getattr(tg.dtypes, d.name) for d in dtypes.all}
  for a, b in itertools.product(dtypes.all, repeat=2):
    want = tg.least_upper_dtype(tmap[a], tmap[b])
    want = dtypes.float32 if want in (tg.dtypes.weakfloat,) else name[next(k for k, v in tmap.items() if v == want).name]
    assert least_upper_dtype(a, b) == want, (a, b)
    assert (Tensor.zeros(2, dtype=a) + Tensor.zeros(2, dtype=b)).dtype == want
  for d in dtypes.all:
    assert sum_acc_dtype(d) == name[next(k for k, v in tmap.items() if v == tg.sum_acc_dtype(tmap[d])).name]

@pytest.mark.parametrize("d", FLOATS + [dtypes.uint8, dtypes.int8, dtypes.bool])
def test_sum_dtype(d):
  t = Tensor(np.ones(6, dtype=_np(d)) if d != dtypes.bfloat16 else np.ones(6, ml_dtypes.bfloat16), device="PYTHON")
  s = t.sum()
  assert s.dtype == (d if d.is_float() else sum_acc_dtype(d)) and s.numpy().item() == 6

# ---- integer ops against numpy ---------------------------------------------------------------------------------------

def _ints(d, rng, n=64, nonzero=False):
  lo, hi = max(d.min, -1000), min(d.max, 1000)
  x = rng.integers(lo, hi + 1, n).astype(d.np)
  x[:4] = np.array([d.min, d.max, 0, 1 if d.kind == 'u' else -1], dtype=object).astype(d.np)
  return np.where(x == 0, np.ones_like(x), x) if nonzero else x

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", INTS)
def test_floordiv_mod_shift_pow_vs_numpy(device, d):
  rng = np.random.default_rng(INTS.index(d))
  a, b = _ints(d, rng), _ints(d, rng, nonzero=True)
  b = np.where((a == d.min) & (b.astype(np.int64) == -1), np.ones_like(b), b)   # numpy warns on INT_MIN // -1
  ta, tb = Tensor(a, device=device), Tensor(b, device=device)
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal((ta // tb).numpy(), a // b)
    np.testing.assert_array_equal((ta % tb).numpy(), a % b)
    np.testing.assert_array_equal((ta // 3).numpy(), a // d.np.type(3))
    np.testing.assert_array_equal((ta % 3).numpy(), a % d.np.type(3))
    np.testing.assert_array_equal((100 // tb).numpy(), (np.full_like(b, 100) // b))
    c = (np.arange(64) % d.bits).astype(d.np)
    np.testing.assert_array_equal((ta << Tensor(c, device=device)).numpy(), a << c)
    np.testing.assert_array_equal((ta >> Tensor(c, device=device)).numpy(), a >> c)
    np.testing.assert_array_equal((ta << 3).numpy(), (a << d.np.type(3)))
    np.testing.assert_array_equal((ta >> 2).numpy(), (a >> d.np.type(2)))
    e = (np.arange(64) % 5).astype(d.np)
    np.testing.assert_array_equal((ta ** Tensor(e, device=device)).numpy(), a ** e)
    np.testing.assert_array_equal((ta ** 3).numpy(), a ** d.np.type(3))
    np.testing.assert_array_equal((2 ** Tensor(e, device=device)).numpy(), d.np.type(2) ** e)

@pytest.mark.parametrize("device", DEVICES)
def test_division_by_zero_and_overflow_as_tinygrad(device):
  """Values tinygrad 0.14 gives (its PYTHON device; CPU is UB in C): x // 0 is 0 or -1, x % 0 is x."""
  a = Tensor([5, -5, 0, -2**31], device=device)
  assert (a // 0).numpy().tolist() == [0, -1, 0, -1]
  assert (a % 0).numpy().tolist() == [5, -5, 0, -2**31]
  assert (a // -1).numpy().tolist() == [-5, 5, 0, -2**31]   # INT_MIN // -1 wraps
  assert (Tensor([-7], device=device) // 2).numpy().tolist() == [-4] and (Tensor([-7], device=device) % 3).numpy().tolist() == [2]
  assert (Tensor([7.5], device=device) // 2).numpy().tolist() == [3.0] and (Tensor([-7.5], device=device) % 2).numpy().tolist() == [0.5]
  assert (Tensor([200], dtype=dtypes.uint8, device=device) << 3).numpy().tolist() == [64]
  assert (Tensor([-16], device=device) >> 2).numpy().tolist() == [-4]
  assert (Tensor([1], device=device) << 40).numpy().tolist() == [0] and (Tensor([-1], device=device) >> 40).numpy().tolist() == [-1]

def test_pow_rules():
  assert (Tensor([2, 3]) ** 3).dtype == dtypes.int32 and (Tensor([2.0]) ** Tensor([3])).numpy().tolist() == [8.0]
  with pytest.raises(DTypeError, match="base needs to be float"): Tensor([2]) ** -1
  with pytest.raises(DTypeError, match="SHL"): Tensor([1.0]) << 2
  x = np.array([0.5, 2.0, 3.0], np.float32)
  for device in DEVICES:
    np.testing.assert_allclose((Tensor(x, device=device) ** 1.5).numpy(), x ** 1.5, rtol=1e-6)
    np.testing.assert_allclose((2.0 ** Tensor(x, device=device)).numpy(), 2.0 ** x, rtol=1e-6)
    assert (Tensor([2, -1, 3], device=device) ** Tensor([-1, -3, 0], device=device)).numpy().tolist() == [0, -1, 1]

# ---- casts: float -> int follows tinygrad's CPU device (measured with tinygrad 0.14 + clang on x86-64) ------------------

SPECIAL = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 300.7, -1.5, 1e20], dtype=np.float32)
TINYGRAD_CPU = {  # tinygrad 0.14.0, device CPU (clang -O2, x86-64), Tensor(SPECIAL).cast(d).numpy()
  "int8": [0, 0, 0, 0, 0, 44, -1, 0], "uint8": [0, 0, 0, 0, 0, 44, 255, 0], "int16": [0, 0, 0, 0, 0, 300, -1, 0],
  "uint16": [0, 0, 0, 0, 0, 300, 65535, 0], "int32": [-2**31] * 5 + [300, -1, -2**31],
  "uint32": [2**32 - 1] * 3 + [3000000000, 2**32 - 1, 300, 2**32 - 1, 2**32 - 1],
  "int64": [-2**63] * 3 + [3000000000, -3000000000, 300, -1, -2**63],
  "uint64": [2**64 - 1] * 3 + [3000000000, 2**64 - 1, 300, 2**64 - 1, 2**64 - 1], "bool": [True] * 8}

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(TINYGRAD_CPU))
def test_float_to_int_casts_match_tinygrad_cpu(device, name):
  for src in (np.float32, np.float64):
    assert Tensor(SPECIAL.astype(src), device=device).cast(name).numpy().tolist() == TINYGRAD_CPU[name]

@pytest.mark.parametrize("device", DEVICES)
def test_casts_between_all_pairs(device):
  """Every pair: ints wrap, int->float rounds, float->float rounds, to bool is != 0 (numpy, where numpy defines it)."""
  vals = np.array([0, 1, -1, 3, 100, -128, 127, 255], np.int64)
  for a, b in itertools.product(dtypes.all, repeat=2):
    if (src := (vals != 0) if a == dtypes.bool else _into(vals, a)) is None: continue
    got = Tensor(src, device=device).cast(b).numpy()
    with np.errstate(all="ignore"):
      if (want := (src != 0) if b == dtypes.bool else _into(src, b)) is None: continue
      want = want.astype(_np(b))
    if a.is_float() and b.is_int():   # in range: trunc then wrap; a negative float to uint32/uint64 is the max (x86)
      want = np.asarray(src).astype(np.int64).astype(b.np)
      if b.kind == 'u' and b.itemsize >= 4: want = np.where(np.asarray(src) < 0, np.array(b.max, b.np), want)
    np.testing.assert_array_equal(got, want, err_msg=f"{a.name} -> {b.name}")

@pytest.mark.parametrize("device", DEVICES)
def test_bitcasts_between_equal_sizes(device):
  raw = np.arange(16, dtype=np.uint8) * 17
  for a, b in itertools.product(dtypes.all, repeat=2):
    if a.itemsize != b.itemsize or dtypes.bool in (a, b): continue
    src = raw.view(a.np)
    got = Tensor(src, device=device).bitcast(b).numpy()
    want = src.view(b.np).astype(_np(b))
    np.testing.assert_array_equal(got.view(np.uint8) if b != dtypes.bfloat16 else got, want.view(np.uint8) if b != dtypes.bfloat16 else want)

# ---- rand: tinygrad's numbers, bit for bit ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_rand_is_tinygrads_bit_for_bit(device):
  tiny = pytest.importorskip("tinygrad")
  T, td = tiny.Tensor, tiny.dtypes
  for seed, draws in ((0, [((4,), "float32"), ((3, 5), "float32")]), (42, [((7,), "float16"), ((2, 3), "float64")]),
                      (1337, [((1000,), "float32"), ((9,), "bfloat16")])):
    Tensor.manual_seed(seed); T.manual_seed(seed)
    for shape, dt in draws:
      ours = Tensor.rand(*shape, dtype=dt, device=device).numpy()
      theirs = T.rand(*shape, dtype=getattr(td, dt), device="PYTHON").numpy()
      assert ours.shape == theirs.shape and ours.tobytes() == theirs.astype(ours.dtype).tobytes(), (seed, shape, dt)
  Tensor.manual_seed(3); T.manual_seed(3)
  np.testing.assert_allclose(Tensor.randn(64, device=device).numpy(), T.randn(64, device="PYTHON").numpy(), atol=2e-6)

# ---- the classic ops on every dtype, both devices, against numpy -----------------------------------------------------

def _vals(d, rng, n=48):
  if d == dtypes.bool: return rng.integers(0, 2, n).astype(bool)
  if d.is_float(): return (rng.standard_normal(n) * 4).astype(d.np)
  return rng.integers(0 if d.is_unsigned() else -50, 50, n).astype(d.np)

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", dtypes.all, ids=lambda d: d.name)
def test_elementwise_and_reduce_ops_every_dtype(device, d):
  """One CALL per dtype holding every op the dtype accepts; bfloat16/float16 within their precision."""
  rng = np.random.default_rng(d.priority)
  a, b = _vals(d, rng), _vals(d, rng)
  ta, tb = Tensor(a, device=device), Tensor(b, device=device)
  f = (lambda x: x.astype(np.float32)) if d in (dtypes.bfloat16, *dtypes.fp8s) else (lambda x: x)
  A, B = f(a), f(b)
  cases = [(ta < tb, A < B), (ta == tb, A == B), (ta != tb, A != B), (ta.maximum(tb), np.maximum(A, B)),
           (ta.max(), A.max()), ((ta > tb).where(ta, tb), np.where(A > B, A, B))]
  if d != dtypes.bool:
    with np.errstate(all="ignore"):
      cases += [(ta + tb, (a + b).astype(d.np)), (ta - tb, (a - b).astype(d.np)), (ta * tb, (a * b).astype(d.np)),
                (-ta, (-a).astype(d.np)), (ta.sum(0).cast(d), a.sum(0, dtype=np.float32 if d.itemsize == 2 and d.is_float() else None).astype(d.np))]
  if d.is_int() or d == dtypes.bool: cases += [(ta & tb, a & b), (ta | tb, a | b), (ta ^ tb, a ^ b)]
  if d.is_float():
    p = np.abs(A) + 0.5
    tp = Tensor(np.abs(a) + d.np.type(0.5), device=device)
    cases += [(ta / tb, A / B), (tp.sqrt(), np.sqrt(p)), (tp.log2(), np.log2(p)), (ta.exp2(), np.exp2(A)), (ta.sin(), np.sin(A)),
              (ta.trunc(), np.trunc(A)), (ta.floor(), np.floor(A)), (tp.reciprocal(), 1 / p)]
  Tensor.realize(*[t for t, _ in cases])
  tol = {dtypes.float16: 2e-3, dtypes.bfloat16: 1e-2, dtypes.float32: 2e-6, dtypes.float64: 1e-12,
         **{f8: 2.0 ** -(f8.finfo()[1] + 1) for f8 in dtypes.fp8s}}.get(d, 0)   # fp8: half an ulp (x4 below)
  for i, (t, want) in enumerate(cases):
    got = t.numpy()
    want = np.asarray(want)
    if d.is_float() and got.dtype.kind == "f":
      want = want.astype(d.np).astype(got.dtype)   # the reference rounds to the dtype once per op, so does numpy here
      np.testing.assert_allclose(got, want, rtol=tol * 4, atol=tol * 4, err_msg=f"case {i}")
    else: np.testing.assert_array_equal(got, want, err_msg=f"case {i}")
