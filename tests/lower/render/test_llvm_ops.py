"""The LLVM backend op by op against the numpy reference (device CPU), plus effect order, the kernel cache, checked mode,
DEBUG output, bounded fusion, matmul tiling and errors."""
import numpy as np
import pytest
from egraph import callify, Tensor
from egraph.ir.dtype import dtypes
from egraph.ir.errors import UnsupportedOpError
from egraph.ir.ops import Node, Ops, ParamArg, CallInfo, new_buffer, const
from egraph.ir.storage import Storage
from lower.runtime import run_call
from lower.reference import evaluate
from lower.device.cache import CACHE
from lower.schedule import kernelize as sched
from lower.schedule.kernel import Kernel, Param, Store, Expr, Idx, Var
from lower.device.compiler import compile_kernels
from lower.device.native import BoundsError, launch

def buf(S, data, dt):
  a = np.asarray(data).astype(dt.np).reshape(-1)
  b = new_buffer(a.size, dt, "CPU")
  S.set_data(b, a)
  return b

def P(slot, n, dt=dtypes.float32): return Node(Ops.PARAM, dt, (), ParamArg(slot, (n,), "CPU"))
def call(body, *args): return Node(Ops.CALL, dtypes.void, (body, *args), CallInfo())
def cst(v, dt, shape): return const(v, dt, "CPU").reshape((1,) * len(shape)).expand(shape)

def both(c, S):
  """Run CALL c natively and with the reference on copies of S; compare every buffer; return the native storage."""
  nat, ref = S.copy(), S.copy()
  run_call(c, nat)
  evaluate([c], ref)
  assert set(nat) == set(ref)
  for u in ref:
    if ref[u].dtype.kind == 'f': np.testing.assert_allclose(nat[u], ref[u], rtol=1e-3 if ref[u].dtype == np.float16 else 1e-6, atol=1e-6)
    else: np.testing.assert_array_equal(nat[u], ref[u])
  return nat

def graph(*roots, S, fusion=None):
  res = callify(*roots, fusion=fusion)
  return both(res.call, S), res

RNG = np.random.default_rng(0)
VALS = {dtypes.float32: RNG.standard_normal(24) * 3, dtypes.float16: RNG.standard_normal(24) * 3,
        dtypes.int32: np.array([-7, 7, 0, 5, -5, 3, 2**31 - 1, -2**31, 1, -1, 9, 100] * 2),
        dtypes.int64: np.array([-7, 7, 0, 5, -5, 3, 2**63 - 1, -2**63, 1, -1, 9, 100] * 2),
        dtypes.uint8: np.array([0, 1, 2, 3, 255, 128, 7, 9, 100, 5, 250, 17] * 2),
        dtypes.bool: np.array([0, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 1] * 2)}
OTHER = {dt: np.roll(v, 5) for dt, v in VALS.items()}

def _ok(op, dt):
  if op in (Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.SIN, Ops.RECIPROCAL, Ops.FDIV): return dt.is_float()
  if op in (Ops.AND, Ops.OR, Ops.XOR, Ops.IDIV, Ops.MOD): return not dt.is_float()
  return True

@pytest.mark.parametrize("dt", list(VALS), ids=lambda d: d.name)
def test_every_alu_op(dt):
  S = Storage()
  a, b = buf(S, VALS[dt], dt).reshape((4, 6)), buf(S, OTHER[dt], dt).reshape((4, 6))
  roots = []
  for op in sorted(Ops.__members__.values(), key=lambda o: o.value):
    if op in (Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.RECIPROCAL, Ops.SIN, Ops.TRUNC) and _ok(op, dt): roots.append(Node(op, None, (a,)))
    elif op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR,
                Ops.XOR) and _ok(op, dt):
      roots.append(Node(op, None, (a, b)))
  roots.append(Node(Ops.WHERE, None, (Node(Ops.CMPLT, None, (a, b)), a, b)))
  graph(*[r.contiguous() for r in roots], S=S)

@pytest.mark.parametrize("src", list(VALS), ids=lambda d: d.name)
def test_casts_and_bitcasts(src):
  S = Storage()
  vals = VALS[src] if not src.is_float() else np.clip(VALS[src], -100, 100)
  a = buf(S, vals, src).reshape((4, 6))
  roots = [a.cast(to).contiguous() for to in VALS if to != src]
  for to in VALS:
    if to != src and to.itemsize == src.itemsize: roots.append(Node(Ops.BITCAST, to, (Node(Ops.ADD, None, (a, a)),)).contiguous())
  if src.itemsize in (2, 4): roots.append(Node(Ops.BITCAST, dtypes.uint8, (Node(Ops.MAX, None, (a, a)),)).contiguous())
  graph(*roots, S=S)

def test_movement_ops_are_index_arithmetic():
  S = Storage()
  x = buf(S, np.arange(24), dtypes.float32).reshape((2, 3, 4))
  views = [x.permute((2, 0, 1)), x.flip((True, False, True)), x.shrink(((1, 2), (0, 3), (1, 3))), x.pad(((1, 0), (0, 2), (1, 1))),
           x.reshape((1, 2, 3, 4)).expand((3, 2, 3, 4)), x.permute((1, 0, 2)).reshape((6, 4)).flip((True, False)).reshape((24,)),
           x.pad(((0, 0), (1, 1), (0, 0))).reshape((2, 20)).shrink(((0, 2), (3, 17))),
           Node(Ops.EXP2, None, (x,)).pad(((1, 1), (0, 0), (2, 0))), cst(5.0, dtypes.float32, (2, 3, 4)).pad(((1, 1), (0, 0), (0, 1)))]
  nat, res = graph(*[Node(Ops.ADD, None, (v, v)) for v in views], S=S)
  ks = [s.kernel for s in sched.kernelize(res.call.src[0], _bind(res.call)).steps]
  assert len(ks) == len(views)   # one kernel each: no copies for the views

def _bind(c):
  from lower.schedule.mem import arg_binding as _arg_binding
  return _arg_binding(c)[0]

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool], ids=lambda d: d.name)
def test_reductions_over_any_axes(dt):
  S = Storage()
  x = buf(S, np.resize(VALS[dt], 60), dt).reshape((3, 4, 5))
  roots = []
  for axes in [(0,), (1,), (2,), (0, 2), (0, 1, 2)]:
    for rop in (Ops.ADD, Ops.MAX, Ops.MUL):
      if rop is Ops.MUL and dt.is_float(): continue
      roots.append(Node(Ops.REDUCE, None, (x,), (rop, axes)))
  roots.append(Node(Ops.REDUCE, None, (x.permute((2, 0, 1)).flip((True, False, False)),), (Ops.ADD, (1, 2))))
  graph(*[r.contiguous() for r in roots], S=S)

def test_softmax_and_nested_reductions():
  S = Storage()
  x = buf(S, RNG.standard_normal(48), dtypes.float32).reshape((6, 8))
  m = Node(Ops.REDUCE, None, (x,), (Ops.MAX, (1,)))
  e = Node(Ops.EXP2, None, (Node(Ops.SUB, None, (x, m.expand((6, 8)))),))
  s = Node(Ops.REDUCE, None, (e,), (Ops.ADD, (1,)))
  sm = Node(Ops.FDIV, None, (e, s.expand((6, 8))))
  nested = Node(Ops.REDUCE, None, (Node(Ops.REDUCE, None, (x,), (Ops.ADD, (1,))),), (Ops.MAX, (0,)))
  _, res = graph(sm.contiguous(), nested.contiguous(), S=S, fusion="rules")   # lower/'s splits (cost mode fuses all at 6x8)
  p = sched.kernelize(res.call.src[0], _bind(res.call))
  assert len(p.steps) == 4   # max and sum split into their own kernels (they are broadcast), the nested reduce fused

def test_matmul_is_tiled_and_right():
  for (M, K, N) in [(8, 4, 32), (37, 19, 70), (64, 64, 64)]:
    a, b = Tensor(RNG.standard_normal((M, K)).astype(np.float32)), Tensor(RNG.standard_normal((K, N)).astype(np.float32))
    np.testing.assert_allclose((a @ b).numpy(), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4)
  res = callify((a @ b).node)
  p = sched.kernelize(res.call.src[0], _bind(res.call))
  assert any(s.kernel.tile == ("matmul", 8, 32) for s in p.steps if s.kernel)

def test_big_reduce_inside_another_gets_its_own_kernel():
  # softmax(a @ b): the matmul is one tiled kernel read by max, sum and the division (fused, each recomputed it untiled);
  # (a @ b).sum(): the matmul runs on its own 2-D domain, not inside the sum's 1-element one
  M = 64
  an, bn = RNG.standard_normal((M, M)).astype(np.float32), RNG.standard_normal((M, M)).astype(np.float32)
  a, b = Tensor(an).realize(), Tensor(bn).realize()
  for t, want, n_kernels in [((a @ b).softmax(), None, 4), ((a @ b).sum(), (an @ bn).sum(), 2)]:
    res = callify(t.node)
    ks = [s.kernel for s in sched.kernelize(res.call.src[0], _bind(res.call)).steps if s.kernel]
    assert sum(k.tile == ("matmul", 8, 32) for k in ks) == 1 and len(ks) == n_kernels, [k.name for k in ks]
    if want is None:
      m = an @ bn; e = np.exp(m - m.max(1, keepdims=True)); want = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-5)
  # a computed operand (a layernorm) broadcast into the matmul is realized first: the matmul stays tiled, and the
  # layernorm runs once instead of once per output column
  c = a - a.mean(axis=1, keepdim=True)
  h = c / (c * c).mean(axis=1, keepdim=True).add(1e-5).sqrt()
  res = callify((h @ b).node)
  ks = [s.kernel for s in sched.kernelize(res.call.src[0], _bind(res.call)).steps if s.kernel]
  assert sum(k.tile == ("matmul", 8, 32) for k in ks) == 1, [k.name for k in ks]
  cn = an - an.mean(1, keepdims=True)
  np.testing.assert_allclose((h @ b).numpy(), (cn / np.sqrt((cn * cn).mean(1, keepdims=True) + 1e-5)) @ bn, rtol=1e-4, atol=1e-4)
  # a matmul under an elementwise epilogue ((a @ b + 1).relu()) is realized, so it stays tiled
  t = (a @ b + 1.0).relu()
  res = callify(t.node)
  ks = [s.kernel for s in sched.kernelize(res.call.src[0], _bind(res.call)).steps if s.kernel]
  assert sum(k.tile == ("matmul", 8, 32) for k in ks) == 1 and len(ks) == 2, [k.name for k in ks]
  np.testing.assert_allclose(t.numpy(), np.maximum(an @ bn + 1, 0), rtol=1e-4, atol=1e-4)
  # below NESTED_REDUCE_WORK inputs a nested reduce stays fused (one kernel)
  x = Tensor(RNG.standard_normal((8, 8, 8)).astype(np.float32)).realize()
  y = x.sum(axis=2).max(axis=1)
  res = callify(y.node)
  assert len([s for s in sched.kernelize(res.call.src[0], _bind(res.call)).steps if s.kernel]) == 1
  np.testing.assert_allclose(y.numpy(), x.numpy().sum(2).max(1), rtol=1e-5)

def test_in_place_reads_of_the_target():
  S = Storage()
  a = buf(S, np.arange(16), dtypes.float32)
  v = a.reshape((4, 4))
  flip = v.after(v.store(Node(Ops.ADD, None, (v.flip((True, True)), v))))        # reads itself elsewhere: temp + copy back
  same = a.after(a.store(Node(Ops.MUL, None, (a, a))))                                # same index: in place
  nat, res = graph(flip, S=S)
  np.testing.assert_array_equal(nat[a.arg.uid].reshape(4, 4), np.arange(16).reshape(4, 4)[::-1, ::-1] + np.arange(16).reshape(4, 4))
  graph(same, S=S)
  t = v.after(v.store(v.permute((1, 0))))
  graph(t, S=S)

def test_war_order_and_snapshots():
  S = Storage()
  a, b, c = buf(S, np.arange(4), dtypes.float32), buf(S, np.ones(4), dtypes.float32), buf(S, np.zeros(4), dtypes.float32)
  p0, p1, p2 = P(0, 4), P(1, 4), P(2, 4)
  w = p0.after(p0.store(Node(Ops.ADD, None, (p1, p1))))              # writes a
  r = p2.after(p2.store(Node(Ops.MUL, None, (p0, p1))))              # reads a directly: must see the old a
  both(call(Node.sink(w, r), a, b, c), S)
  both(call(Node.sink(r, w), a, b, c), S)
  # reads both the old a (directly) and the new a (through AFTER): a snapshot
  mix = p2.after(p2.store(Node(Ops.SUB, None, (w, p0))))
  nat = both(call(Node.sink(mix), a, b, c), S)
  np.testing.assert_array_equal(nat[c.arg.uid], 2 - np.arange(4))
  # a slice argument aliasing a whole-buffer argument
  sl = Node(Ops.SLICE, dtypes.float32, (a,), (1, 2))
  q0, q1 = P(0, 4), P(1, 2)
  w2 = q0.after(q0.store(cst(9.0, dtypes.float32, (4,))))
  r2 = P(2, 4).after(P(2, 4).store(Node(Ops.ADD, None, (q1.pad(((1, 1),)), P(3, 4)))))
  both(call(Node.sink(w2, r2), a, sl, c, b), S)

def test_nested_call_and_views():
  S = Storage()
  a, b = buf(S, np.arange(3), dtypes.float32), buf(S, np.arange(3), dtypes.float32)
  add = Node(Ops.ADD, None, (a.reshape((3,)), b))
  r1 = callify(add)
  lazy = r1.buffer_map[add].after(r1.call)
  r2 = callify(Node(Ops.MUL, None, (lazy, lazy)))
  both(r2.call, S)
  x = buf(S, np.arange(8), dtypes.int32)
  v = x.shrink(((2, 6),)).reshape((2, 2)).contiguous()
  graph(Node(Ops.ADD, None, (v, v)), S=S)

def test_kernel_cache_hits_compile_nothing():
  def model(x, w): return ((Tensor(x) @ Tensor(w)).relu().sum(axis=1) * 2).numpy()
  x, w = RNG.standard_normal((9, 7)).astype(np.float32), RNG.standard_normal((7, 5)).astype(np.float32)
  model(x, w)
  before = CACHE.compiled
  out = model(x + 1, w * 2)
  assert CACHE.compiled == before
  np.testing.assert_allclose(out, (np.maximum((x + 1) @ (w * 2), 0).sum(1) * 2), rtol=1e-4)

def test_checked_mode_reports_out_of_bounds(monkeypatch):
  i = Var("i0", 8)
  bad = Idx.var(i) + 1                              # a corrupted index: reads p1[8] on the last element
  k = Kernel("e_8", (Param("p0", dtypes.float32, 8, 4, True, False, True), Param("p1", dtypes.float32, 8, 4, True, True)),
             (i,), Store(0, Idx.var(i), Expr('load', dtypes.float32, (), (1, bad, ()))), checked=True)
  (c,) = compile_kernels([(k, "bad_kernel")])
  out, src = np.zeros(8, np.float32), np.arange(8, dtype=np.float32)
  with pytest.raises(BoundsError, match="bad_kernel.*p1"): launch(c, [out.ctypes.data, src.ctypes.data])
  # the env var turns checking on for whole programs, which still run when in bounds
  monkeypatch.setenv("CHECK_BOUNDS", "1")
  S = Storage()
  a = buf(S, np.arange(12), dtypes.float32).reshape((3, 4))
  graph(Node(Ops.ADD, None, (a.flip((True, False)), a.pad(((0, 0), (1, 0))).shrink(((0, 3), (0, 4))))).contiguous(), S=S)

def test_debug_prints_kernels(monkeypatch, capsys):
  monkeypatch.setenv("DEBUG", "2")
  S = Storage()
  a = buf(S, np.arange(6), dtypes.float32)
  graph(Node(Ops.ADD, None, (Node(Ops.SIN, None, (a,)), cst(0.25, dtypes.float32, (6,)))).contiguous(), S=S)
  err = capsys.readouterr().err
  assert " ms" in err and "define void" in err and "kernel e_6" in err

def test_long_chain_is_split_into_bounded_kernels():
  S = Storage()
  a = buf(S, RNG.standard_normal(4), dtypes.float32)
  p0, p1 = P(0, 4), P(1, 4)
  x = p1
  for i in range(20_000): x = Node(Ops.ADD if i % 3 else Ops.MUL, None, (x, p1))
  c = call(Node.sink(p0.after(p0.store(x))), new_buffer(4, dtypes.float32, "CPU"), a)
  p = sched.kernelize(c.src[0], _bind(c))
  assert len(p.steps) >= 20_000 // sched.FUSE_CAP and all(s.kernel.ops() <= 2 * sched.FUSE_CAP for s in p.steps)
  with np.errstate(all="ignore"): both(c, S)

def test_fusion_cap_counts_the_dag_not_the_tree():
  """x = x * w + x, 40 times: a tree of ~3^40 nodes, a DAG of ~80 the kernel builds once each: one kernel, not split.
  Past FUSE_CAP distinct nodes it is split, each kernel within the cap; the values match numpy."""
  S = Storage()
  w = RNG.standard_normal(4).astype(np.float32) * 0.1
  a, b = buf(S, RNG.standard_normal(4), dtypes.float32), buf(S, w, dtypes.float32)
  p0, p1, p2 = P(0, 4), P(1, 4), P(2, 4)
  def prog(n):
    x = p1
    for _ in range(n): x = Node(Ops.ADD, None, (Node(Ops.MUL, None, (x, p2)), x))
    return call(Node.sink(p0.after(p0.store(x))), new_buffer(4, dtypes.float32, "CPU"), a, b)
  small, big = prog(40), prog(3 * sched.FUSE_CAP)
  assert len(sched.kernelize(small.src[0], _bind(small)).steps) == 1
  p = sched.kernelize(big.src[0], _bind(big))
  assert 2 <= len(p.steps) <= 10 and all(s.kernel.ops() <= 2 * sched.FUSE_CAP for s in p.steps)
  for c in (small, big): both(c, S)

def test_unsupported_ops_raise_naming_the_op():
  S = Storage()
  a = buf(S, np.arange(2), dtypes.float32)
  var = Node(Ops.PARAM, dtypes.int32, (), ParamArg(-1, (), None, "v", (1, 8)))
  p0 = P(0, 2)
  body = Node.sink(p0.after(p0.store(Node(Ops.ADD, None, (p0, Node(Ops.CAST, dtypes.float32, (var,)).reshape((1,)).expand((2,)))))))
  with pytest.raises(UnsupportedOpError, match="PARAM"): run_call(call(body, a), S)

def test_python_device_runs_the_reference():
  S = Storage()
  a = new_buffer(2, dtypes.float32, "PYTHON"); S.set_data(a, [1, 2])
  p = Node(Ops.PARAM, dtypes.float32, (), ParamArg(0, (2,), "PYTHON"))
  before = CACHE.compiled
  run_call(call(Node.sink(p.after(p.store(Node(Ops.ADD, None, (p, p))))), a), S)
  assert CACHE.compiled == before and list(S[a]) == [2, 4]
