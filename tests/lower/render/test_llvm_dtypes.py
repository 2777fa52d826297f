"""The LLVM backend over every dtype against the reference (lower/numeric.py's semantics, through lower/reference.py):
every ALU op on every dtype it accepts, every CAST pair, every BITCAST pair, THREEFRY, reduces, and the streaming
explicit-vector form. Edge values throughout: 0, -0.0, +-1, the extremes, NaN, +-inf, shifts past the width,
division by zero, INT_MIN // -1. Ints and casts bit for bit; transcendental float ops within a tolerance."""
import platform
import numpy as np
import pytest
from egraph.ir.dtype import dtypes, as_np
from egraph.ir.errors import DTypeError, UnsupportedOpError
from egraph.ir.ops import Node, Ops, GroupOp, ALU_OPS, ParamArg, CallInfo, new_buffer
from egraph.ir.storage import Storage
from lower.runtime import run_call
from lower.reference import evaluate
from lower import numeric
from lower.schedule.kernel import Kernel, Param, Store, Expr, Idx, Var, const
from lower.schedule import decomp
from lower.device.compiler import compile_kernels, module_text
from lower.render.llvm.stream import _vec_ok
from lower.device.native import launch

RNG = np.random.default_rng(7)
DTS = list(dtypes.all)
N = 48
INEXACT = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW})
RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-13,   # fp8: one ulp of the rounding after
        "fp8e4m3": 0.13, "fp8e4m3fnuz": 0.13, "fp8e5m2": 0.26, "fp8e5m2fnuz": 0.26}     # an inexact op may differ

def values(dt, n=N, seed=0):
  """n values of dt: the edge values first, then random ones."""
  rng = np.random.default_rng(seed)
  if dt == dtypes.bool: return rng.integers(0, 2, n).astype(bool)
  if dt.is_float():
    edge = [0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 0.5, -2.5, 3.0, 2.0 ** 31, -2.0 ** 31 - 1e3, 2.0 ** 63,
            -2.0 ** 63, 2.0 ** 64, 1e30, -1e30, 65504.0, 70000.0, 300.0, -129.0, 1e-40, 255.5, -0.75]
    x = np.concatenate([edge, rng.standard_normal(n) * 10])[:n]
    with np.errstate(all="ignore"): return as_np(x, dt)
  edge = [0, 1, -1, 2, -2, 3, -7, dt.min, dt.max, dt.min + 1, dt.max - 1, dt.bits - 1, dt.bits, dt.bits + 1, 100, 5]
  x = np.concatenate([np.array(edge, dtype=object), rng.integers(-1 << 62, 1 << 62, n, dtype=np.int64).astype(object)])[:n]
  return wrap(x, dt)

def wrap(xs, dt) -> np.ndarray:
  """Python ints wrapped into dt as C does."""
  return np.array([int(v) % (1 << dt.bits) for v in xs], dtype=np.uint64).astype(np.dtype(f"u{dt.itemsize}")).view(dt.np)

def P(slot, shape, dt): return Node(Ops.PARAM, dt, (), ParamArg(slot, shape, "CPU"))

def run(ins: list, outs: list):
  """ins: numpy arrays; outs: (dtype, shape, build(params) -> Node). Runs one CALL (a STORE per output) natively and
  with the reference; returns [(native, reference)] per output."""
  S, bufs = Storage(), []
  for a in ins:
    b = new_buffer(a.size, dtypes.from_numpy(a.dtype), "CPU"); S.set_data(b, a.reshape(-1)); bufs.append(b)
  ps = [P(i, (a.size,), dtypes.from_numpy(a.dtype)).reshape(a.shape) for i, a in enumerate(ins)]
  stores, uids = [], []
  for j, (dt, shape, build) in enumerate(outs):
    n = int(np.prod(shape))
    b = new_buffer(n, dt, "CPU"); S.set_data(b, np.zeros(n, dt.np)); bufs.append(b); uids.append(b.arg.uid)
    o = P(len(ins) + j, (n,), dt)
    stores.append(o.after(o.store(build(ps).reshape((n,)))))
  c = Node(Ops.CALL, dtypes.void, (Node.sink(*stores), *bufs), CallInfo())
  nat, ref = S.copy(), S.copy()
  run_call(c, nat)
  evaluate([c], ref)
  return [(nat[u], ref[u]) for u in uids]

def same(nat, ref, msg, rtol=None):
  """Bit for bit (NaNs only as NaNs), or within rtol for floats."""
  if ref.dtype.kind == 'f' or ref.dtype in (dtypes.bfloat16.np, *(d.np for d in dtypes.fp8s)):
    n, r = nat.astype(np.float64), ref.astype(np.float64)
    if rtol is not None: np.testing.assert_allclose(n, r, rtol=rtol, atol=rtol, equal_nan=True, err_msg=msg); return
    np.testing.assert_array_equal(n, r, err_msg=msg)
    ok = ~np.isnan(r)
    np.testing.assert_array_equal(np.signbit(n[ok]), np.signbit(r[ok]), err_msg=msg + " (sign of zero)")
  else: np.testing.assert_array_equal(nat, ref, err_msg=msg)

def _srcs(op, ps): return tuple(ps[k % len(ps)] for k in range(ALU_OPS[op].arity))   # MULACC: (a, b, a)

def ops_for(dt, srcs):
  """(op, node) for every ALU op that accepts dt."""
  out = []
  for op in sorted(GroupOp.ALU - {Ops.WHERE}, key=lambda o: o.value):
    try: out.append((op, Node(op, None, _srcs(op, srcs))))
    except DTypeError: pass
  return out

@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
def test_every_alu_op(dt):
  a, b = values(dt, seed=1), np.roll(values(dt, seed=2), 11)
  if dt.is_int():   # shift counts and divisors at the edges too: by 0, -1, the width and past it; MIN // -1
    b[:8] = wrap([0, -1, dt.bits, dt.bits - 1, dt.bits + 1, 1, 0, -1], dt)
    a[6:8] = wrap([dt.min] * 2, dt)
  probe = ops_for(dt, (P(0, (N,), dt), P(1, (N,), dt)))
  outs = [(nd.dtype, (N,), lambda ps, op=op: Node(op, None, _srcs(op, ps))) for op, nd in probe]
  outs.append((dt, (N,), lambda ps: Node(Ops.WHERE, None, (Node(Ops.CMPLT, None, (ps[0], ps[1])), ps[0], ps[1]))))
  res = run([a, b], outs)
  assert len(res) >= (4 if dt == dtypes.bool else 12)
  for (op, _), (nat, ref) in zip(probe + [(Ops.WHERE, None)], res):
    same(nat, ref, f"{op.name} on {dt.name}", RTOL[dt.name] if dt.is_float() and op in INEXACT else None)

@pytest.mark.parametrize("src", DTS, ids=lambda d: d.name)
def test_every_cast(src):
  a = values(src, seed=3)
  res = run([a], [(dst, (N,), lambda ps, dst=dst: ps[0].cast(dst)) for dst in DTS if dst != src])
  for dst, (nat, ref) in zip([d for d in DTS if d != src], res): same(nat, ref, f"CAST {src.name} -> {dst.name}")

@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_every_bitcast(size):
  group = [d for d in DTS if d.itemsize == size]   # (a BITCAST to or from bool is a CAST: 0/1 bytes, != 0)
  ins = [values(d, seed=4 + i) for i, d in enumerate(group)]
  outs, names = [], []
  for i, s in enumerate(group):
    for d in group:
      if d != s:
        outs.append((d, (N,), lambda ps, i=i, d=d: Node(Ops.BITCAST, d, (ps[i],)))); names.append(f"{s.name} -> {d.name}")
  for nm, (nat, ref) in zip(names, run(ins, outs)):
    np.testing.assert_array_equal(nat.view(f"u{size}"), ref.view(f"u{size}"), err_msg=f"BITCAST {nm}")

def test_size_changing_bitcasts():
  pairs = [(dtypes.float32, dtypes.uint8), (dtypes.uint8, dtypes.float32), (dtypes.int64, dtypes.int16), (dtypes.bfloat16, dtypes.uint32),
           (dtypes.float64, dtypes.bfloat16), (dtypes.uint16, dtypes.float64)]
  ins = [values(s, 32, seed=9).reshape(4, 8) for s, _ in pairs]
  outs = [(d, (4, 8 * s.itemsize // d.itemsize), lambda ps, i=i, d=d: Node(Ops.BITCAST, d, (ps[i],))) for i, (s, d) in enumerate(pairs)]
  for (s, d), (nat, ref) in zip(pairs, run(ins, outs)):
    np.testing.assert_array_equal(nat.view(np.uint8), ref.view(np.uint8), err_msg=f"BITCAST {s.name} -> {d.name}")

@pytest.mark.parametrize("dt", dtypes.fp8s, ids=lambda d: d.name)
def test_fp8_casts_match_tinygrad(dt):
  """Compiled casts into fp8 from float32 and float64 (one rounding, no double rounding through float) over the sweep,
  and out of all 256 patterns, bit for bit against tinygrad's float_to_fp8 / fp8_to_float."""
  from fp8_oracle import sweep, tinygrad_bits, tinygrad_values
  x64 = sweep(dt)
  with np.errstate(over="ignore"): x32 = x64.astype(np.float32)
  bits = np.arange(256, dtype=np.uint8)
  (n32, _), (n64, _), (back, _) = run([x32, x64, bits], [
    (dt, x32.shape, lambda ps: ps[0].cast(dt)), (dt, x64.shape, lambda ps: ps[1].cast(dt)),
    (dtypes.float32, (256,), lambda ps: Node(Ops.BITCAST, dt, (ps[2],)).cast(dtypes.float32))])
  np.testing.assert_array_equal(n32.view(np.uint8), tinygrad_bits(x32, dt))
  np.testing.assert_array_equal(n64.view(np.uint8), tinygrad_bits(x64, dt))
  want = tinygrad_values(dt)
  np.testing.assert_array_equal(back, want.astype(np.float32))
  ok = ~np.isnan(want)
  assert np.array_equal(np.signbit(back[ok]), np.signbit(want[ok]))

def test_threefry():
  x = RNG.integers(0, 1 << 63, N, dtype=np.uint64) * np.uint64(2) + np.arange(N, dtype=np.uint64)
  k = np.roll(x, 3)
  x[:3], k[:3] = [0, 2 ** 64 - 1, 1], [0, 2 ** 64 - 1, 0x1BD11BDA]
  (nat, ref), = run([x, k], [(dtypes.uint64, (N,), lambda ps: Node(Ops.THREEFRY, None, (ps[0], ps[1])))])
  np.testing.assert_array_equal(ref, numeric.threefry2x32(x, k))
  np.testing.assert_array_equal(nat, ref)

@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
def test_reduces(dt):
  x = values(dt, 48, seed=5)
  if dt.is_float(): x = as_np(RNG.standard_normal(48) * 2, dt); x[5] = -0.0
  x = x.reshape(6, 8)
  outs = [(dt, shape, lambda ps, rop=rop, ax=ax: Node(Ops.REDUCE, None, (ps[0],), (rop, ax)))
          for rop in (Ops.ADD, Ops.MAX, Ops.MUL) for ax, shape in (((1,), (6, 1)), ((0,), (1, 8)), ((0, 1), (1, 1)))]
  for j, (nat, ref) in enumerate(run([x], outs)):
    same(nat, ref, f"reduce {j} of {dt.name}", RTOL[dt.name] * 4 if dt.is_float() else None)

# the streaming explicit-vector form: kernels straight from kernel IR, against lower/numeric.py

def _vec_value(dt, a, b):
  """An elementwise value over loads a, b of dt exercising its ops and casts, and its numpy twin."""
  E = lambda op, d, *s: Expr(op, d, s)
  B = dtypes.bool
  if dt == dtypes.bool:
    i8 = dtypes.int8   # bool arithmetic stays scalar (_vec_ok): compares, casts and selects only
    s = E(Ops.ADD, i8, E(Ops.CAST, i8, a), E(Ops.CAST, i8, b))
    return (E(Ops.WHERE, B, a, E(Ops.CMPNE, B, s, const(1, i8)), E(Ops.CAST, B, E(Ops.CAST, dtypes.float32, b))),
            lambda x, y: np.where(x, (x.astype(np.int8) + y.astype(np.int8)) != 1, y))
  if dt.is_float():
    f32, i32 = dtypes.float32, dtypes.int32
    v = E(Ops.MAX, dt, E(Ops.SUB, dt, E(Ops.MUL, dt, a, b), E(Ops.FDIV, dt, a, b)), E(Ops.NEG, dt, b))
    v = E(Ops.ADD, dt, v, E(Ops.CAST, dt, E(Ops.CAST, i32, a)))
    v = E(Ops.WHERE, dt, E(Ops.CMPLT, B, a, b), v, E(Ops.CAST, dt, E(Ops.CAST, f32, E(Ops.TRUNC, dt, a))))
    def ref(x, y):
      al = lambda op, *xs: numeric.alu(op, dt, *xs)
      w = al(Ops.MAX, al(Ops.SUB, al(Ops.MUL, x, y), al(Ops.FDIV, x, y)), al(Ops.NEG, y))
      w = al(Ops.ADD, w, numeric.cast(numeric.cast(x, dt, i32), i32, dt))
      return np.where(x < y, w, numeric.cast(numeric.cast(al(Ops.TRUNC, x), dt, f32), f32, dt))
    return v, ref
  c = lambda v: const(v, dt)
  v = E(Ops.ADD, dt, decomp.alu(Ops.FLOORDIV, dt, (a, b)), decomp.alu(Ops.FLOORMOD, dt, (b, a)))   # as the builder makes them
  v = E(Ops.XOR, dt, v, E(Ops.SHL, dt, a, E(Ops.AND, dt, b, c(dt.bits * 2 - 1))))
  v = E(Ops.SUB, dt, v, E(Ops.SHR, dt, b, E(Ops.AND, dt, a, c(dt.bits * 2 - 1))))
  v = E(Ops.MUL, dt, v, E(Ops.POW, dt, a, E(Ops.AND, dt, b, c(7))))
  v = E(Ops.ADD, dt, v, E(Ops.CAST, dt, E(Ops.CAST, dtypes.float32, E(Ops.MAX, dt, a, b))))
  if dt == dtypes.uint64: v = E(Ops.XOR, dt, v, E(Ops.THREEFRY, dt, a, b))
  def ref(x, y):
    al = lambda op, *xs: numeric.alu(op, dt, *xs)
    cc = lambda v: numeric.wrap_const(v, dt)
    w = al(Ops.ADD, al(Ops.FLOORDIV, x, y), al(Ops.FLOORMOD, y, x))
    w = al(Ops.XOR, w, al(Ops.SHL, x, al(Ops.AND, y, cc(dt.bits * 2 - 1))))
    w = al(Ops.SUB, w, al(Ops.SHR, y, al(Ops.AND, x, cc(dt.bits * 2 - 1))))
    w = al(Ops.MUL, w, al(Ops.POW, x, al(Ops.AND, y, cc(7))))
    w = al(Ops.ADD, w, numeric.cast(numeric.cast(al(Ops.MAX, x, y), dt, dtypes.float32), dtypes.float32, dt))
    return al(Ops.XOR, w, al(Ops.THREEFRY, x, y)) if dt == dtypes.uint64 else w
  return v, ref

@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the streaming form is x86's")
@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
def test_vector_path(dt):
  n = 4133   # a masked head, full vectors, a masked tail
  i = Var("i0", n)
  a, b = (Expr('load', dt, (), (j + 1, Idx.var(i), ())) for j in range(2))
  val, ref = _vec_value(dt, a, b)
  ps = (Param("p0", dt, n, dt.itemsize, True, False, True),) + tuple(Param(f"p{j}", dt, n, dt.itemsize, True, True) for j in (1, 2))
  ks = [Kernel(f"v_{dt.name}", ps, (i,), Store(0, Idx.var(i), val), stream=s) for s in (False, True)]
  assert _vec_ok(ks[1]) == (dt.itemsize <= 4 or dt.is_float())   # 64-bit integer division stays scalar
  assert ("%stage" not in module_text([(ks[1], "x")])) == _vec_ok(ks[1])
  x, y = values(dt, n, seed=11), np.roll(values(dt, n, seed=12), 7)
  with np.errstate(all="ignore"): want = ref(x, y)
  for c in compile_kernels([(k, f"v{j}") for j, k in enumerate(ks)]):
    raw = np.zeros((n + 9) * dt.itemsize, np.uint8)
    o = raw[dt.itemsize:(n + 1) * dt.itemsize].view(dt.np)   # unaligned: a masked head
    launch(c, [o.ctypes.data, x.ctypes.data, y.ctypes.data], threads=2)
    same(o, want, f"{dt.name} stream={c.kernel.stream}")
    assert not raw[:dt.itemsize].any() and not raw[(n + 1) * dt.itemsize:].any()

def test_an_op_without_a_form_raises_naming_op_and_dtype():
  i = Var("i0", 8)
  a = Expr('load', dtypes.float32, (), (1, Idx.var(i), ()))
  ps = (Param("p0", dtypes.float32, 8, 4), Param("p1", dtypes.float32, 8, 4))
  k = Kernel("bad", ps, (i,), Store(0, Idx.var(i), Expr(Ops.SHL, dtypes.float32, (a, a))))
  with pytest.raises(UnsupportedOpError, match="SHL on float32"): module_text([(k, "bad")])
