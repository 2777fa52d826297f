"""The LLVM backend against the numpy reference on random programs: each program is callified, then its CALL runs natively
(device CPU) on one copy of storage and through lower.reference.evaluate on another; every buffer must agree.

The strategy here covers what the backend must get right beyond graphgen's float32 graphs: bool/uint8/int32/int64/float16
values and casts between them, integer division and modulo by zero and negatives, non-contiguous views (permute, flip,
shrink, pad, expand, reshape of those), reductions over any axes, in-place assigns that read their own target through
a flip or permutation, and shared inputs."""
import math
import gc
import numpy as np
from hypothesis import given, settings, HealthCheck, strategies as st
from egraph import callify
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Node, Ops, new_buffer, const
from egraph.ir.storage import Storage
from lower.runtime import run_call
from lower.reference import evaluate
from rules.testing.strategies import factorizations, movement   # one random movement op (the soundness checker draws the same)

SET = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
SHAPES = [(16,), (4, 4), (2, 8), (2, 2, 4), (1, 4, 4), (8,), (2, 4), (3, 5), (1,), (2, 3, 1)]
DTYPES = [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool]
FLOAT_UNARY = [Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.RECIPROCAL, Ops.SIN, Ops.TRUNC]
INT_BINARY = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR]
FLOAT_BINARY = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]

def data(rng, n, dt):
  if dt.is_float(): return (rng.standard_normal(n) * 2).astype(dt.np)
  if dt == dtypes.bool: return rng.integers(0, 2, n).astype(bool)
  if dt == dtypes.uint8: return rng.integers(0, 256, n).astype(np.uint8)
  return rng.integers(-20, 20, n).astype(dt.np)

def cst(v, dt, shape): return const(v, dt, "CPU").reshape((1,) * len(shape)).expand(shape)

@st.composite
def programs(draw, max_steps=8):
  storage, rng = Storage(), np.random.default_rng(draw(st.integers(0, 2**16)))
  main = draw(st.sampled_from(DTYPES))
  inputs = []
  for _ in range(draw(st.integers(1, 3))):
    shp, dt = draw(st.sampled_from(SHAPES)), draw(st.sampled_from([main, main, *DTYPES]))
    b = new_buffer(math.prod(shp), dt, "CPU")
    storage.set_data(b, data(rng, b.arg.size, dt))
    inputs.append(b)
  pool = [b.reshape(draw(st.sampled_from(factorizations(b.numel)))) for b in inputs]
  for _ in range(draw(st.integers(1, max_steps))):
    x = draw(st.sampled_from(pool))
    dt = x.dtype
    kind = draw(st.sampled_from(["unary", "binary", "binary", "move", "move", "move", "reduce", "reduce", "cast", "where",
                                 "contiguous", "assign", "assign"]))
    if kind == "unary":
      y = Node(draw(st.sampled_from(FLOAT_UNARY if dt.is_float() else [Ops.NEG, Ops.TRUNC])), None, (x,))
    elif kind == "binary":
      same = [p for p in pool if p.shape == x.shape and p.dtype == dt]
      other = draw(st.sampled_from(same)) if same and draw(st.booleans()) else cst(draw(st.integers(-3, 3)), dt, x.shape)
      y = Node(draw(st.sampled_from(FLOAT_BINARY if dt.is_float() else INT_BINARY)), None, (x, other))
    elif kind == "where":
      c = x if dt == dtypes.bool else Node(Ops.CMPLT, None, (x, cst(1, dt, x.shape)))
      other = [p for p in pool if p.shape == x.shape]
      a = draw(st.sampled_from(other))
      y = Node(Ops.WHERE, None, (c, a, cst(2, a.dtype, x.shape)))
    elif kind == "cast":
      to = draw(st.sampled_from(DTYPES))
      if dt.is_float() and not to.is_float() and to != dtypes.bool:   # float -> int of NaN/inf/out of range is undefined in C
        x = Node(Ops.MAX, None, (Node(Ops.SUB, None, (x, cst(0, dt, x.shape))), cst(-100, dt, x.shape)))
        x = Node(Ops.WHERE, None, (Node(Ops.CMPLT, None, (x, cst(100, dt, x.shape))), x, cst(0, dt, x.shape)))
      y = x.cast(to)
    elif kind == "move": y = movement(draw, x)
    elif kind == "reduce":
      if not x.shape: continue
      axes = tuple(sorted(draw(st.sets(st.integers(0, len(x.shape) - 1), min_size=1))))
      y = Node(Ops.REDUCE, None, (x,), (draw(st.sampled_from([Ops.ADD, Ops.MAX, Ops.MUL] if dt != dtypes.float16 else [Ops.ADD, Ops.MAX])), axes))
    elif kind == "contiguous":
      if x.has_buffer_identity(): continue
      y = x.contiguous()
    else:   # in place into an input, reading itself through a view (flip / permutation) or another value
      b = draw(st.sampled_from(inputs))
      tv = b.reshape(draw(st.sampled_from(factorizations(b.numel))))
      if draw(st.booleans()) and len(tv.shape) > 1 and tv.shape[0] == tv.shape[1]: src = tv.permute((1, 0) + tuple(range(2, len(tv.shape))))
      else: src = tv.flip([True] * len(tv.shape))
      cands = [p for p in pool if p.shape == tv.shape and p.dtype == tv.dtype]
      v = draw(st.sampled_from([src] + cands))
      if tv.dtype != dtypes.bool and draw(st.booleans()): v = Node(Ops.ADD, None, (v, src))
      y = tv.after(tv.store(v))
    pool.append(y)
  cands = pool[len(inputs):] or pool
  roots = draw(st.lists(st.sampled_from(cands), min_size=1, max_size=3, unique_by=lambda n: n.id))
  return roots, storage

def compare(roots, storage):
  was = gc.isenabled()
  gc.disable()   # a cyclic-GC pass mid-compare would release the buffers of nodes that died in a cycle (a finalizer)
  try: return _compare(roots, storage)
  finally:
    if was: gc.enable()

def _compare(roots, storage):
  res = callify(*roots)
  native, ref = storage.copy(), storage.copy()
  run_call(res.call, native)
  evaluate([res.call], ref)
  native, ref = {u: native[u] for u in native}, {u: ref[u] for u in ref}   # what each executor left
  assert set(native) == set(ref)
  for uid in ref:
    got, want = native[uid], ref[uid]
    if want.dtype == np.float16: np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3, err_msg=f"buffer {uid}")
    elif want.dtype.kind == 'f': np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5, err_msg=f"buffer {uid}")
    else: np.testing.assert_array_equal(got, want, err_msg=f"buffer {uid}")
  return res

@settings(SET, max_examples=260)
@given(programs())
def test_random_programs_match_reference(p):
  compare(*p)

def _graphgen():
  try:
    import sys, os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from graphgen import graphs
    return graphs()
  except Exception:   # graphgen moves (rules/testing/strategies.py); fall back to the local strategy
    return programs().map(lambda p: type("G", (), {"roots": p[0], "storage": p[1]})())

@settings(SET, max_examples=60)
@given(_graphgen())
def test_graphgen_graphs_match_reference(g):
  compare(list(g.roots), g.storage)

@settings(SET, max_examples=80)
@given(programs(), st.sampled_from([2, 3]))
def test_random_programs_split_across_threads(p, nt):
  # every kernel split into nt chunks whatever its size (chunk edges inside vectors, streams and tiles), on the native
  # threads where the pool has room and on the Python workers otherwise
  from lower.device import native
  old = native.PARALLEL_WORK, native.THREADS
  native.PARALLEL_WORK, native.THREADS = 0, nt
  try: compare(*p)
  finally: native.PARALLEL_WORK, native.THREADS = old
