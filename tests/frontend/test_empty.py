"""Tensors with a zero in any axis: every elementwise, movement, reduce and matmul op gives tinygrad 0.14's result
(values, shape and dtype) on CPU and PYTHON; tinygrad on its CPU device is the oracle (sum -> 0, max of an empty axis
-> the dtype's minimum, mean/var -> nan, matmul -> zeros)."""
import numpy as np
import pytest
from egraph import Tensor

tg = pytest.importorskip("tinygrad")
DEVICES = ["CPU", "PYTHON"]
SHAPES = [(0,), (3, 0), (0, 3), (2, 0, 4), (0, 0)]
DTYPES = ["float32", "int32", "uint8", "bool"]

def _data(shape, dt):
  n = int(np.prod(shape))
  return (np.arange(n) % 5 - 2).astype(np.float32 if dt == "float32" else np.int32).astype(dt).reshape(shape)

def _check(f, shape, dt, dev):
  """f(Tensor) on callsat and on tinygrad's CPU device: same shape, dtype and values."""
  d = _data(shape, dt)
  want = f(tg.Tensor(d, device="CPU")).numpy()
  got = f(Tensor(d, device=dev)).numpy()
  assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
  np.testing.assert_array_equal(got, want)

ELEMENTWISE = {
  "add": lambda t: t + t, "mul_const": lambda t: t * 3, "neg": lambda t: -t if t.dtype.name != "bool" else t,
  "cmp": lambda t: t < 1, "where": lambda t: (t > 0).where(t, t), "cast": lambda t: t.cast("float32"),
  "exp": lambda t: t.cast("float32").exp(), "relu": lambda t: t.cast("float32").relu(), "abs": lambda t: t.cast("int32").abs(),
}
MOVEMENT = {
  "reshape": lambda t: t.reshape(*reversed(t.shape)), "permute": lambda t: t.permute(*reversed(range(t.ndim))),
  "expand": lambda t: t.reshape(1, *t.shape).expand(2, *t.shape), "pad": lambda t: t.pad(((1, 1),) * t.ndim),
  "shrink": lambda t: t.shrink(tuple((0, s) for s in t.shape)), "flip": lambda t: t.flip(0), "contiguous": lambda t: t.contiguous(),
  "flatten": lambda t: t.flatten(), "slice": lambda t: t[:1],
}
REDUCE = ["sum", "max", "min", "prod", "mean", "var", "std"]

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(ELEMENTWISE) + list(MOVEMENT))
def test_elementwise_and_movement(dev, shape, name):
  for dt in DTYPES[:2]: _check({**ELEMENTWISE, **MOVEMENT}[name], shape, dt, dev)

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("dt", DTYPES)
def test_reduce(dev, shape, op, dt):
  for axis in [None, *range(len(shape))]:
    _check(lambda t: getattr(t, op)(axis=axis), shape, dt, dev)
  _check(lambda t: getattr(t, op)(axis=-1, keepdim=True), shape, dt, dev)

MATMUL = [((3, 0), (0, 3)), ((0, 3), (3, 2)), ((2, 3), (3, 0)), ((0,), (0,)), ((2, 0), (0,)), ((4, 3, 0), (0, 2)), ((0, 2, 3), (3, 4))]

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("shapes", MATMUL, ids=str)
@pytest.mark.parametrize("dt", ["float32", "int32"])
def test_matmul(dev, shapes, dt):
  a, b = _data(shapes[0], dt), _data(shapes[1], dt)
  want = (tg.Tensor(a, device="CPU") @ tg.Tensor(b, device="CPU")).numpy()
  got = (Tensor(a, device=dev) @ Tensor(b, device=dev)).numpy()
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_array_equal(got, want)

def test_issue_examples():
  for dev in DEVICES:
    assert Tensor.ones(3, 0, device=dev).sum(1).tolist() == [0, 0, 0]
    assert (Tensor.ones(3, 0, device=dev) @ Tensor.ones(0, 3, device=dev)).tolist() == [[0] * 3] * 3
    assert Tensor.ones(2, 0, 4, device=dev, dtype="int32").max(1).tolist() == [[-2**31] * 4] * 2
