"""Value tests for the LLVM backend's special kernel paths against numpy: non-temporal (streaming) stores on unaligned
buffers and odd sizes, axis collapsing, and the packed, K-blocked matmul on ragged and strided shapes. No timings."""
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Node, Ops, new_buffer
from lower.schedule import finalize
from lower.schedule import kernelize as sched
from lower.schedule.kernel import Kernel, Param, Store, Expr, Idx, Var, const
from lower.device.compiler import compile_kernels, module_text
from lower.schedule.mem import arg_binding as _arg_binding
from lower.device.native import launch
from egraph.ir.storage import Storage, STORAGE as STORAGE_
from lower.runtime import run_call
from lower.reference import evaluate

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
  monkeypatch.setattr(finalize, "STREAM_MIN_BYTES", 0)
  S = Storage()
  def buf(a):
    b = new_buffer(a.size, dtypes.float32, "CPU"); S.set_data(b, a.reshape(-1)); return b
  x_np, y_np = RNG.standard_normal((37, 53), dtype=np.float32), RNG.standard_normal((37, 53), dtype=np.float32)
  x, y = buf(x_np).reshape((37, 53)), buf(y_np).reshape((37, 53))
  res = callify(Node(Ops.MUL, None, (Node(Ops.ADD, None, (x, y)), x)),                       # contiguous: collapsed, streamed
                Node(Ops.ADD, None, (x.permute((1, 0)), y.permute((1, 0)))),                 # transposed: 2-D, plain stores
                Node(Ops.MAX, None, (x.flip((False, True)), y)))                            # collapsed? no (flip): plain
  prog = sched.kernelize(res.call.src[0], _arg_binding(res.call)[0])
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
  # B read transposed (q @ k.T: a strided column axis), and both: the gathering B packer, the strided edge
  bt = Tensor(np.ascontiguousarray(b_np.T))
  np.testing.assert_allclose((a @ bt.permute((1, 0))).numpy(), a_np @ b_np, rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose((at.permute((1, 0)) @ bt.permute((1, 0))).numpy(), a_np @ b_np, rtol=2e-4, atol=2e-4)
  res = callify((a @ bt.permute((1, 0))).node)
  ks = [st.kernel for st in sched.kernelize(res.call.src[0], _arg_binding(res.call)[0]).steps if st.kernel]
  assert N < 32 or M < 8 or any(k.tile == ("matmul", 8, 32) for k in ks)

def _stream_kernel(n: int, out_dt, in_dts, build) -> Kernel:
  """out[i] = build(loads...) over i < n, marked stream; the last input is also offered as an invariant load s = p[2]."""
  i = Var("i0", n)
  lds = [Expr('load', dt, (), (j + 1, Idx.var(i), ())) for j, dt in enumerate(in_dts)]
  inv = Expr('load', in_dts[-1], (), (len(in_dts), Idx.const(2), ()))
  ps = (Param("p0", out_dt, n, out_dt.itemsize, True, False, True),) + tuple(
    Param(f"p{j + 1}", dt, n, dt.itemsize, True, True) for j, dt in enumerate(in_dts))
  return Kernel(f"s_{n}", ps, (i,), Store(0, Idx.var(i), build(*lds, inv)), stream=True)

def _E(op, dt, *src): return Expr(op, dt, tuple(src))

F32, I32, I64, BOOL = dtypes.float32, dtypes.int32, dtypes.int64, dtypes.bool
STREAM_CASES = {   # name: (out dtype, input dtypes, kernel value, numpy value, explicit vector path?)
  "where_max_div": (F32, (F32, F32),
                    lambda a, b, s: _E(Ops.WHERE, F32, _E(Ops.CMPLT, BOOL, a, b), _E(Ops.MUL, F32, _E(Ops.MAX, F32, a, b), s),
                                       _E(Ops.FDIV, F32, _E(Ops.NEG, F32, a), b)),
                    lambda a, b: np.where(a < b, np.maximum(a, b) * b[2], -a / b), True),
  "sqrt_recip": (F32, (F32,), lambda a, s: _E(Ops.ADD, F32, _E(Ops.SQRT, F32, a), _E(Ops.RECIPROCAL, F32, a)),
                 lambda a: np.sqrt(a) + np.float32(1) / a, True),
  "int_to_float": (F32, (I32, I64), lambda a, b, s: _E(Ops.MUL, F32, _E(Ops.CAST, F32, a), _E(Ops.CAST, F32, _E(Ops.MAX, I64, b, s))),
                   lambda a, b: a.astype(np.float32) * np.maximum(b, b[2]).astype(np.float32), True),
  "float_to_int": (I32, (F32,), lambda a, s: _E(Ops.SUB, I32, _E(Ops.CAST, I32, _E(Ops.MUL, F32, a, const(4, F32))), _E(Ops.CAST, I32, s)),
                   lambda a: (a * np.float32(4)).astype(np.int32) - np.int32(a[2]), True),
  "bool_out": (BOOL, (I32, I32), lambda a, b, s: _E(Ops.CMPNE, BOOL, _E(Ops.XOR, I32, a, s), b),
               lambda a, b: (a ^ b[2]) != b, True),
  "bool_to_float": (F32, (F32, F32), lambda a, b, s: _E(Ops.ADD, F32, _E(Ops.CAST, F32, _E(Ops.CMPEQ, BOOL, a, b)), a),
                    lambda a, b: (a == b).astype(np.float32) + a, True),
  "idiv_vector": (I32, (I32, I32), lambda a, b, s: _E(Ops.IDIV, I32, a, b), None, True),   # <= 32 bits: exact in doubles
  "idiv64_fallback": (I64, (I64, I64), lambda a, b, s: _E(Ops.IDIV, I64, a, b), None, False),
}

@pytest.mark.parametrize("case", list(STREAM_CASES))
def test_streaming_vector_path_values(case):
  out_dt, in_dts, build, want_fn, vec = STREAM_CASES[case]
  ks = [_stream_kernel(n, out_dt, in_dts, build) for n in (3, 16, 77, 1000, 4133)]
  text = module_text([(ks[-1], "x")])
  assert "!nontemporal" in text and ("%stage" not in text) == vec
  cs = compile_kernels([(k, f"sv_{case}_{j}") for j, k in enumerate(ks)])
  for k, cc in zip(ks, cs):
    n = k.domain[0].size
    ins = []
    for dt in in_dts:
      x = RNG.standard_normal(n) * 8
      if dt.is_int(): x = np.round(x); x[x == 0] = 1
      ins.append(x.astype(dt.np))
    if case == "bool_to_float": ins[1][::3] = ins[0][::3]
    if want_fn is None: want = np.trunc(ins[0] / ins[1]).astype(out_dt.np)   # C division (no zero divisors here)
    else:
      with np.errstate(all="ignore"): want = want_fn(*ins).astype(out_dt.np)
    for off in (0, 1, 5):
      raw = np.zeros((n + off + 80) * out_dt.itemsize, np.uint8)
      out = raw[off * out_dt.itemsize:(off + n) * out_dt.itemsize].view(out_dt.np)
      for threads in (1, 2):
        out[:] = 0
        launch(cc, [out.ctypes.data] + [x.ctypes.data for x in ins], work=1 << 30, threads=threads)
        np.testing.assert_array_equal(out, want)
        assert not raw[:off * out_dt.itemsize].any() and not raw[(off + n) * out_dt.itemsize:].any()

def test_matmul_kernels_share_precompiled_helpers():
  # packing and the scalar edge are one process-wide helper module; kernels only call it
  from lower.render.llvm import matmul as L
  M, K, N = 21, 70, 97
  S = Storage()
  def buf(a):
    b = new_buffer(a.size, dtypes.float32, "CPU"); S.set_data(b, a.reshape(-1)); return b
  a_np, b_np = RNG.standard_normal((M, K)).astype(np.float32), RNG.standard_normal((K, N)).astype(np.float32)
  A, B = buf(a_np).reshape((M, K)), buf(b_np).reshape((K, N))
  prod = Node(Ops.MUL, None, (A.reshape((M, 1, K)).expand((M, N, K)), B.permute((1, 0)).reshape((1, N, K)).expand((M, N, K))))
  res = callify(Node(Ops.REDUCE, None, (prod,), (Ops.ADD, (2,))).reshape((M, N)))
  bind, bufs = _arg_binding(res.call)
  (st,) = [s for s in sched.kernelize(res.call.src[0], bind).steps if s.kernel]
  k = st.kernel
  assert k.tile == ("matmul", 8, 32)
  text = module_text([(k, "mmx")])
  body = text[text.index("define void @mmx"):]
  assert all(f"call void @callsat_mm_{h}(" in body for h in ("pack_b", "edge")) and "@llvm.fma.f32(" not in body
  assert "@callsat_mm_pack_a(" not in body   # A is contiguous along k: the micro-kernel reads its rows directly
  # A read transposed (k strided): its tiles are packed
  at = buf(np.ascontiguousarray(a_np.T)).reshape((K, M)).permute((1, 0))
  prod_t = Node(Ops.MUL, None, (at.reshape((M, 1, K)).expand((M, N, K)), B.permute((1, 0)).reshape((1, N, K)).expand((M, N, K))))
  res_t = callify(Node(Ops.REDUCE, None, (prod_t,), (Ops.ADD, (2,))).reshape((M, N)))
  (kt,) = [s.kernel for s in sched.kernelize(res_t.call.src[0], _arg_binding(res_t.call)[0]).steps if s.kernel]
  assert kt.tile == ("matmul", 8, 32) and "call void @callsat_mm_pack_a(" in module_text([(kt, "mmt")])
  engine = L.mm_helpers()[0]
  (c,) = compile_kernels([(k, "mmx")])
  assert L.mm_helpers()[0] is engine
  out = np.full(M * N, np.nan, np.float32)
  assert k.store.param == 0
  ptrs = [out.ctypes.data] + [S[bufs[m.root[1]]].ctypes.data + m.off for m in st.mems[1:]]
  for threads in (1, 2):
    out[:] = np.nan
    launch(c, ptrs, work=1 << 30, threads=threads)
    np.testing.assert_allclose(out.reshape(M, N), a_np @ b_np, rtol=2e-4, atol=2e-4)

@pytest.mark.parametrize("shape,axis", [((300, 100), 0), ((64, 300), 0), ((5, 70, 530), 1), ((9, 33, 12), (0, 1)), ((4, 6), 0), ((20, 8200), 0)])
def test_column_reduces(shape, axis):
  # reduces along a strided axis with a unit-stride output axis (x.sum(axis=0)): COL_W columns per reduce step, also
  # split across threads at any column
  from lower.render.llvm import module as L
  from lower.device import native
  from egraph.ir.storage import STORAGE
  xn = (RNG.standard_normal(shape) * 3).astype(np.float32)
  x = Tensor(xn).realize()
  ax = axis if isinstance(axis, tuple) else (axis,)
  pad = ((1, 2),) + ((0, 0),) * (len(shape) - 1)
  cases = [(x.sum(axis=axis), xn.sum(axis=ax), 1e-4), (x.max(axis=axis), xn.max(axis=ax), 0),
           (x.mean(axis=axis) * 2 + 1, xn.mean(axis=ax) * 2 + 1, 1e-4), (x.pad(pad).sum(axis=axis), np.pad(xn, pad).sum(axis=ax), 1e-4),
           (x.cast(dtypes.int32).sum(axis=axis), xn.astype(np.int32).sum(axis=ax), 0),
           (x.cast(dtypes.float16).sum(axis=axis), xn.astype(np.float16).sum(axis=ax, dtype=np.float32).astype(np.float16), 2e-2)]
  res = callify(cases[0][0].node)
  ks = [st.kernel for st in sched.kernelize(res.call.src[0], _arg_binding(res.call)[0]).steps if st.kernel]
  assert any(L.col_reduce(k) for k in ks) == (shape[-1] >= 8), [k.name for k in ks]
  for t, want, tol in cases:
    res = callify(t.node)
    for nt in (1, 2):
      old = native.PARALLEL_WORK, native.THREADS
      native.PARALLEL_WORK, native.THREADS = 0, nt
      try: run_call(res.call)
      finally: native.PARALLEL_WORK, native.THREADS = old
      got = STORAGE[res.call.src[1]].reshape(want.shape)   # the CALL's output buffer (its first argument)
      np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol * 10)

@pytest.mark.parametrize("shape,perm,blocked", [((100, 70), (1, 0), True), ((33, 64), (1, 0), True), ((3, 40, 50), (0, 2, 1), True),
                                                ((40, 3, 50), (2, 1, 0), False), ((64, 32), (1, 0), True), ((20, 64), (1, 0), False)])
def test_transposes_walk_blocks(shape, perm, blocked):
  # a store along j with a load strided along j: TILE_T x TILE_T blocks, ragged edges, split across threads at any row
  from lower.render.llvm import module as L
  from lower.device import native
  from egraph.ir.storage import STORAGE
  for dt in (np.float32, np.int64, np.uint8):
    xn = (RNG.standard_normal(shape) * 50).astype(dt)
    x = Tensor(xn).realize()
    t = (x.permute(perm) + x.permute(perm)).contiguous() if dt == np.uint8 else x.permute(perm).contiguous()
    want = xn.transpose(perm) + xn.transpose(perm) if dt == np.uint8 else xn.transpose(perm)
    res = callify(t.node)
    ks = [st.kernel for st in sched.kernelize(res.call.src[0], _arg_binding(res.call)[0]).steps if st.kernel]
    assert any(L._transposing(k) for k in ks) == blocked, [k.name for k in ks]
    for nt in (1, 2, 3):
      old = native.PARALLEL_WORK, native.THREADS
      native.PARALLEL_WORK, native.THREADS = 0, nt
      try: run_call(res.call)
      finally: native.PARALLEL_WORK, native.THREADS = old
      np.testing.assert_array_equal(STORAGE[res.call.src[1]].reshape(want.shape), want)

@pytest.mark.parametrize("shape", [(1 << 21,), (2048, 1024), (3, 1024, 1024), (2 ** 21 + 7,)])
def test_full_reduces_split_into_partials(shape):
  # a reduce of everything over >= SPLIT_REDUCE_WORK inputs: partial reduces over P slices (one kernel, split across
  # threads), then one over them; a size no P divides stays one kernel
  xn = RNG.standard_normal(shape).astype(np.float32)
  x = Tensor(xn).realize()
  split = any(d % 16 == 0 and d > 16 for d in shape)
  res = callify(x.sum().node)
  ks = [st.kernel for st in sched.kernelize(res.call.src[0], _arg_binding(res.call)[0]).steps if st.kernel]
  assert len(ks) == (2 if split else 1), [k.name for k in ks]
  for t, want, tol in [(x.sum(), xn.sum(dtype=np.float64), 1e-3), (x.max(), xn.max(), 0), (x.mean() * 3, xn.mean(dtype=np.float64) * 3, 1e-3),
                       (x.permute(tuple(reversed(range(len(shape))))).abs().sum(), np.abs(xn).sum(dtype=np.float64), 1e-4),
                       ((x * 100).cast(dtypes.int32).sum(), (xn * 100).astype(np.int32).sum(dtype=np.int32), 0),
                       ((x * 0.01).cast(dtypes.float16).sum(), (xn * 0.01).astype(np.float16).sum(dtype=np.float32).astype(np.float16), 2e-3)]:
    np.testing.assert_allclose(np.float64(t.numpy()), np.float64(want), rtol=tol, atol=tol)

@pytest.mark.parametrize("B,M,K,N", [(3, 37, 19, 70), (4, 8, 64, 32), (2, 64, 33, 100)])
def test_batched_matmul_is_tiled(B, M, K, N):
  # (B, M, K) @ (B, K, N): one tiled plane per batch index, the batch range split across threads; also a shared
  # (broadcast) right operand, a transposed one, and a @ a.T from one buffer
  from lower.device import native
  from lower.schedule.kernel import mm_batched
  an, bn = RNG.standard_normal((B, M, K)).astype(np.float32), RNG.standard_normal((B, K, N)).astype(np.float32)
  wn = RNG.standard_normal((K, N)).astype(np.float32)
  a, b, w = Tensor(an).realize(), Tensor(bn).realize(), Tensor(wn).realize()
  bt = Tensor(np.ascontiguousarray(bn.transpose(0, 2, 1))).realize()
  ab_w = a @ w
  for t, want in [(a @ b, an @ bn), (ab_w, an @ wn), (a @ bt.transpose(1, 2), an @ bn), (a @ a.transpose(1, 2), an @ an.transpose(0, 2, 1))]:
    res = callify(t.node)
    ks = [st.kernel for st in sched.kernelize(res.call.src[0], _arg_binding(res.call)[0]).steps if st.kernel]
    assert any(k.tile for k in ks) == (M >= 8 and want.shape[-1] >= 32), [k.name for k in ks]
    # a shared right operand makes the batch and row axes one row axis (collapsed before tiling): one plain matmul
    assert any(mm_batched(k) for k in ks) == (M >= 8 and want.shape[-1] >= 32 and t is not ab_w), [k.name for k in ks]
    for nt in (1, 2):
      old = native.PARALLEL_WORK, native.THREADS
      native.PARALLEL_WORK, native.THREADS = 0, nt
      try: run_call(res.call)
      finally: native.PARALLEL_WORK, native.THREADS = old
      np.testing.assert_allclose(STORAGE_[res.call.src[1]].reshape(want.shape), want, rtol=2e-4, atol=2e-4)

@pytest.mark.parametrize("n", [1001, 1 << 21])   # a plain (auto-vectorized) loop, a streaming kernel's explicit vectors
def test_exp2_polynomial_within_2_ulp(n):
  # float32 exp2 is callsat's own polynomial (so loops with it vectorize): within 2 ulp of libm over the whole range,
  # NaN, +-inf, overflow and underflow as exp2f
  xs = np.linspace(-155, 130, n, dtype=np.float32)
  xs[:8] = [np.nan, np.inf, -np.inf, 0, -0.0, 128, -126, 127.99999]
  got = Tensor(xs).exp2().numpy()
  with np.errstate(over="ignore"): want = np.exp2(xs)
  normal = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)
  ulp = np.abs(got[normal].astype(np.float64) - want[normal]) / np.spacing(want[normal]).astype(np.float64)
  assert ulp.max() <= 2, ulp.max()
  np.testing.assert_array_equal(got[:7], want[:7])   # exact: NaN, +-inf, 1, overflow to inf, 2**-126
  sub = ~normal & np.isfinite(want)   # denormal results: within one denormal step
  assert np.all(np.abs(got[sub].astype(np.float64) - want[sub]) <= 2 * 1.401298464324817e-45)

@pytest.mark.parametrize("n", [1001, 1 << 21])
def test_log2_polynomial_within_2_ulp(n):
  # float32 log2 is callsat's own polynomial too: within 2 ulp of libm over normal and denormal inputs; 0, negatives,
  # inf and NaN exact
  xs = np.exp2(np.linspace(-149, 127.9, n)).astype(np.float32)
  xs[:9] = [0, -0.0, -1, np.inf, -np.inf, np.nan, 1, 2, 1e-40]
  got = Tensor(xs).log2().numpy()
  with np.errstate(all="ignore"): want = np.log2(xs)
  np.testing.assert_array_equal(got[:9], want[:9])
  fin = np.isfinite(want) & (want != 0)
  ulp = np.abs(got[fin].astype(np.float64) - want[fin]) / np.spacing(np.abs(want[fin])).astype(np.float64)
  assert ulp.max() <= 2, ulp.max()
