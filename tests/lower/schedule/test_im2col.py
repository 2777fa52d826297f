"""A convolution's product-sum (lower/schedule/finalize.py _packed): its input, read through a padded kernel window
over several reduce vars, is copied once per output position and reduce step into a temporary (im2col), so the sum is
over one reduce var with plain strides — the tiled matmul when the shape allows, else a contiguous dot per output.
Values against numpy's own convolution; the kernels' forms checked on the schedule."""
import numpy as np
import pytest
from egraph import Tensor, callify
from lower.schedule import kernelize as sched
from lower.schedule.mem import arg_binding
from lower.schedule.kernel import Var

RNG = np.random.default_rng(7)

def conv1d(x: Tensor, w: Tensor, pad: int, stride: int) -> Tensor:
  """tinygrad's pooling chain in one dimension: the padded rows repeated k times, read with a row length one longer,
  so row r starts r elements later (the window), then strided."""
  C, L = x.shape
  Co, _, K = w.shape
  Lp = L + 2 * pad
  xp = x.pad(((0, 0), (pad, pad)))
  rep = xp.reshape(C, 1, Lp).expand(C, K, Lp).reshape(C, K * Lp).pad(((0, 0), (0, K))).reshape(C, K, Lp + 1)
  lout = (Lp - K) // stride + 1
  win = rep.shrink(((0, C), (0, K), (0, lout * stride))).reshape(C, K, lout, stride).shrink(((0, C), (0, K), (0, lout), (0, 1)))
  win = win.reshape(1, C, K, lout)
  return (win * w.reshape(Co, C, K, 1)).sum((1, 2))

def ref(xn, wn, pad, stride):
  xp = np.pad(xn, ((0, 0), (pad, pad)))
  K = wn.shape[2]
  lout = (xp.shape[1] - K) // stride + 1
  win = np.stack([xp[:, j * stride:j * stride + K] for j in range(lout)], -1)   # C, K, lout
  return np.einsum("ckl,ock->ol", win, wn)

def kernels(t: Tensor):
  res = callify(t.node)
  return [st.kernel for st in sched.kernelize(res.call.src[0], arg_binding(res.call)[0]).steps if st.kernel]

@pytest.mark.parametrize("C,L,Co,K,pad,stride,tiled", [(16, 64, 32, 3, 1, 1, True), (8, 81, 24, 5, 2, 2, True),
                                                       (3, 100, 40, 7, 3, 1, True), (32, 17, 64, 3, 0, 1, False)])
def test_conv_is_packed_then_one_reduce(C, L, Co, K, pad, stride, tiled):
  xn, wn = RNG.standard_normal((C, L)).astype(np.float32), RNG.standard_normal((Co, C, K)).astype(np.float32)
  t = conv1d(Tensor(xn).realize(), Tensor(wn).realize(), pad, stride)
  ks = kernels(t)
  packs = [k for k in ks if k.name.startswith("c_")]
  assert len(packs) == 1 and len(packs[0].domain) >= 3, [k.name for k in ks]   # (output position, C, K): one copy
  sums = [k for k in ks if any(e.op == 'reduce' for e in k.store.value.walk())]
  assert len(sums) == 1
  red = next(e for e in sums[0].store.value.walk() if e.op == 'reduce')
  assert red.arg[1] == (Var(red.arg[1][0].name, C * K),)   # one reduce var over the flat (C, K)
  assert bool(sums[0].tile) == tiled
  np.testing.assert_allclose(t.numpy(), ref(xn, wn, pad, stride), rtol=1e-4, atol=1e-4)

def test_small_sums_keep_their_nest():
  # under PACK_MIN_WORK multiply-adds the copy is not worth its kernel
  xn, wn = RNG.standard_normal((2, 8)).astype(np.float32), RNG.standard_normal((3, 2, 3)).astype(np.float32)
  t = conv1d(Tensor(xn), Tensor(wn), 1, 1)
  assert not any(k.name.startswith("c_") for k in kernels(t))
  np.testing.assert_allclose(t.numpy(), ref(xn, wn, 1, 1), rtol=1e-5, atol=1e-5)

def test_matmul_is_not_packed():
  # a plain matmul reads along its one reduce var already: no copy
  a, b = (Tensor(RNG.standard_normal(s).astype(np.float32)).realize() for s in ((64, 96), (96, 80)))
  ks = kernels(a @ b)
  assert len(ks) == 1 and ks[0].tile

@pytest.mark.parametrize("fusion", ["rules", "cost"])
def test_products_of_computed_values_over_one_reduce_var_stay_fused(fusion, monkeypatch):
  # layernorm's sum of (x - mean)^2 and batch norm's variance: no window to pack, and copying the computed operands
  # (twice, the same value) made them 2x and 5x slower than the fused nest
  monkeypatch.setenv("CALLSAT_FUSION", fusion)
  xn = RNG.standard_normal((256, 192)).astype(np.float32)
  x = Tensor(xn).realize()
  c = x - x.mean(axis=1, keepdim=True)
  for t, want in (((c * c).sum(axis=1), ((xn - xn.mean(1, keepdims=True)) ** 2).sum(1)),
                  (x.var(axis=0, correction=0), xn.var(0)),
                  (((x + 1) * (x - 1)).sum(axis=1), ((xn + 1) * (xn - 1)).sum(1))):
    assert not any(k.name.startswith("c_") for k in kernels(t)), [k.name for k in kernels(t)]
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-3)

def test_a_matmul_of_computed_operands_is_still_tiled():
  a, b = (RNG.standard_normal(s).astype(np.float32) for s in ((96, 128), (128, 80)))
  t = (Tensor(a).realize() + 1) @ (Tensor(b).realize() * 2)
  assert any(k.tile for k in kernels(t))
  np.testing.assert_allclose(t.numpy(), (a + 1) @ (b * 2), rtol=1e-4, atol=1e-3)
