"""Value tests for the LLVM backend's special kernel paths against numpy: non-temporal (streaming) stores on unaligned
buffers and odd sizes, axis collapsing, and the packed, K-blocked matmul on ragged and strided shapes. No timings."""
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.dtypes import dtypes
from egraph.ir import Node, Ops, new_buffer
from lower import schedule as sched
from lower.kernel import Kernel, Param, Store, Expr, Idx, Var, const
from lower.llvm import compile_kernels, launch, module_text, _arg_binding
from lower.runtime import Storage, run_call
from lower.numpy import evaluate

RNG = np.random.default_rng(1)

def _ew(n: int, c: int, dt=dtypes.float32) -> Kernel:
  """out[i + c] = (a[i] + b[i]) * a[i] - 1 over i < n, marked stream."""
  i = Var("i0", n)
  ld = lambda p: Expr('load', dt, (), (p, Idx.var(i), ()))
  val = Expr(Ops.SUB, dt, (Expr(Ops.MUL, dt, (Expr(Ops.ADD, dt, (ld(1), ld(2))), ld(1))), const(1, dt)))
  ps = (Param("p0", dt, n + c, dt.itemsize, True, False, True), Param("p1", dt, n, dt.itemsize, True, True),
        Param("p2", dt, n, dt.itemsize, True, True))
  return Kernel(f"e_{n}", ps, (i,), Store(0, Idx.var(i) + c, val), stream=True)

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int64, dtypes.float16, dtypes.uint8], ids=lambda d: d.name)
def test_streaming_stores_unaligned_odd_sizes(dt):
  ks = [_ew(n, c, dt) for n in (1, 5, 17, 100, 4099, 9001) for c in (0, 3)]
  assert "!nontemporal" in module_text([(ks[-1], "x")])
  cs = compile_kernels([(k, f"nt_{dt.name}_{j}") for j, k in enumerate(ks)])
  for k, cc in zip(ks, cs):
    n, c = k.domain[0].size, k.store.idx.c
    a, b = (RNG.standard_normal(n) * 4).astype(dt.np), (RNG.standard_normal(n) * 4).astype(dt.np)
    with np.errstate(all="ignore"): want = (a + b) * a - dt.np.type(1)
    for off in range(0, 64 // dt.itemsize + 1):   # every alignment of the output
      raw = np.zeros((n + c + off + 80) * dt.itemsize, np.uint8)
      out = raw[off * dt.itemsize:(off + n + c) * dt.itemsize].view(dt.np)
      for threads in (1, 2):
        out[:] = 7
        launch(cc, [out.ctypes.data, a.ctypes.data, b.ctypes.data], work=1 << 30, threads=threads)
        np.testing.assert_array_equal(out[c:], want)
        assert (out[:c] == 7).all() and not raw[:off * dt.itemsize].any() and not raw[(off + n + c) * dt.itemsize:].any()

def test_scheduler_streams_large_contiguous_outputs(monkeypatch):
  monkeypatch.setattr(sched, "STREAM_MIN_BYTES", 0)
  S = Storage()
  def buf(a):
    b = new_buffer(a.size, dtypes.float32, "CPU"); S.set_data(b, a.reshape(-1)); return b
  x_np, y_np = RNG.standard_normal((37, 53), dtype=np.float32), RNG.standard_normal((37, 53), dtype=np.float32)
  x, y = buf(x_np).reshape((37, 53)), buf(y_np).reshape((37, 53))
  res = callify(Node(Ops.MUL, None, (Node(Ops.ADD, None, (x, y)), x)),                       # contiguous: collapsed, streamed
                Node(Ops.ADD, None, (x.permute((1, 0)), y.permute((1, 0)))),                 # transposed: 2-D, plain stores
                Node(Ops.MAX, None, (x.flip((False, True)), y)))                            # collapsed? no (flip): plain
  prog = sched.schedule(res.call.src[0], _arg_binding(res.call)[0])
  ks = [s.kernel for s in prog.steps if s.kernel]
  assert sum(k.stream for k in ks) == 1
  st = next(k for k in ks if k.stream)
  assert len(st.domain) == 1 and st.domain[0].size == 37 * 53
  nat, ref = S.copy(), S.copy()
  run_call(res.call, nat)
  evaluate([res.call], ref)
  for u in ref: np.testing.assert_allclose(nat[u], ref[u], rtol=1e-6)

def test_collapse_keeps_views_right():
  # padded/shrunk/reshaped views: collapsing must only merge axes used as one flat index
  xn = RNG.standard_normal((6, 8, 5)).astype(np.float32)
  x = Tensor(xn)
  np.testing.assert_allclose(((x + 1).reshape((48, 5))).numpy(), (xn + 1).reshape(48, 5), rtol=1e-6)
  np.testing.assert_allclose((x.permute((1, 0, 2)) * 2).numpy(), xn.transpose(1, 0, 2) * 2, rtol=1e-6)
  np.testing.assert_allclose((x[:, 2:6, :] - x[:, 0:4, :]).numpy(), xn[:, 2:6] - xn[:, 0:4], rtol=1e-6)
  np.testing.assert_allclose((x.pad(((0, 0), (1, 1), (0, 0))) + 1).numpy(), np.pad(xn, ((0, 0), (1, 1), (0, 0))) + 1, rtol=1e-6)

@pytest.mark.parametrize("M,K,N", [(37, 300, 290), (8, 513, 32), (70, 19, 545), (9, 4, 33)])
def test_packed_matmul_ragged(M, K, N):
  a_np, b_np = RNG.standard_normal((M, K)).astype(np.float32), RNG.standard_normal((K, N)).astype(np.float32)
  a, b = Tensor(a_np), Tensor(b_np)
  np.testing.assert_allclose((a @ b).numpy(), a_np @ b_np, rtol=2e-4, atol=2e-4)
  # A read transposed (a strided k axis): packing takes any strides
  at = Tensor(np.ascontiguousarray(a_np.T))
  np.testing.assert_allclose((at.permute((1, 0)) @ b).numpy(), a_np @ b_np, rtol=2e-4, atol=2e-4)
