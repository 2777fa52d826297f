"""The CUDA renderer over all 17 dtypes, under the CPU emulator (lower/device/cuda_emu.h), against the numpy reference
(lower/reference.py, i.e. lower/numeric.py): every ALU op each dtype accepts on edge values (every pair of them for binary
ops), every CAST pair, every same-size BITCAST, THREEFRY, and ADD/MUL/MAX reduces in the serial and block forms. Ints,
bools, casts and bitcasts match bit for bit; float results match exactly too (NaN for NaN, -0 == 0) except the
transcendental ops and float sums, within a tolerance. The CALLs are built directly (PARAM stores, no callify) and all
compile as one translation unit: one g++ run."""
import shutil
import numpy as np
import pytest
from egraph.ir.dtype import DType, dtypes, as_np
from egraph.ir.errors import UnsupportedOpError
from egraph.ir.ops import Node, Ops, ALU_OPS, new_buffer, ParamArg, CallInfo
from egraph.ir.storage import Storage
from lower import numeric
from lower.render.cuda import render as cuda
from lower.device import cuda as cuda_dev
from lower.render.cuda import ops as cuda_ops
from lower.device import cuda_driver as drv
from lower.reference import evaluate

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")

UNARY = (Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.RECIPROCAL, Ops.SIN, Ops.TRUNC)
BINARY = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND,
          Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.FLOORDIV, Ops.FLOORMOD, Ops.POW)
APPROX = {Ops.EXP2: 1, Ops.LOG2: 1, Ops.SIN: 1, Ops.POW: 1}     # libm-dependent: compared with a tolerance
TOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12,   # fp8: a libm ulp may move one fp8 ulp
       "fp8e4m3": 0.13, "fp8e4m3fnuz": 0.13, "fp8e5m2": 0.26, "fp8e5m2fnuz": 0.26}

def accepts(op, dt: DType) -> bool: return ALU_OPS[op].accepts(dt)   # the op table's dtype rule

def edges(dt: DType) -> np.ndarray:
  if dt == dtypes.bool: return np.array([False, True])
  if dt.is_int():
    vs = [0, 1, 2, 3, 5, 7, 100, dt.bits - 1, dt.bits, dt.max, dt.max - 1, dt.max // 2 + 1]
    if dt.kind == 'i': vs += [-1, -2, -3, -7, -100, dt.min, dt.min + 1]
    return np.concatenate([numeric.wrap_const(v, dt).reshape(1) for v in vs])
  big = {"float16": [6e4, 300.7], "bfloat16": [3e38, 2.0 ** 40, 300.7]}.get(dt.name, [3e38, 2.0 ** 31, 2.0 ** 63, 1e10, 300.7])
  if dt in dtypes.fp8s: big = [3e38, 57344.0, 448.0, 240.0, 300.7, 2.0 ** -9, -2.0 ** -16, 0.0029]   # max, subnormals
  vs = [0.0, -0.0, 1.0, -1.0, 0.5, -1.5, 2.5, 3.0, -7.25, 1e-3, 100.0, -255.9, np.inf, -np.inf, np.nan, 1e-6] + big
  return as_np(np.array(vs, np.float64), dt)

def cast_values(dt: DType) -> np.ndarray:
  """Edge values plus every float -> int boundary the rules name (2**64 itself excepted: numeric.cast gives 0 there)."""
  # just above a bfloat16 / float16 tie: rounding twice (through float) would land on the even neighbour below
  if dt.is_int() and dt.itemsize >= 4:
    ties = [(1 << 24) + (1 << 16) + 1, -(1 << 24) - (1 << 16) - 1, (1 << 31) + (1 << 23) + 1, (1 << 60) + (1 << 52) + 1]
    return np.concatenate([edges(dt)] + [numeric.wrap_const(v, dt).reshape(1) for v in ties])
  if not dt.is_float(): return edges(dt)
  b = [2.0 ** 31, 2.0 ** 31 - 1, -2.0 ** 31, -2.0 ** 31 - 1, 2.0 ** 32, 2.0 ** 32 - 1, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64 - 4096,
       -2.0 ** 64, 1 + 2.0 ** -8 + 2.0 ** -40, 1 + 2.0 ** -11 + 2.0 ** -40, -(1 + 2.0 ** -8 + 2.0 ** -40), 65535.9, 65536.0, -32769.0,
       128.5, -129.5, 255.5, 256.0, -0.5, -0.9999, 0.9999, 1e30, -1e30]
  with np.errstate(over="ignore"): v = np.concatenate([edges(dt), as_np(np.array(b, np.float64), dt)])
  return v[v.astype(np.float64) != 2.0 ** 64]   # 2**64 - 4096 rounds to it in float32 and bfloat16

class Prog:
  """One CALL built by hand: input buffers (host data in `S`), and outputs each a PARAM stored with one value."""
  def __init__(self, name: str):
    self.name, self.S, self.bufs, self.stores, self.tol = name, Storage(), [], [], {}
  def param(self, buf: Node) -> Node:
    self.bufs.append(buf)
    return Node(Ops.PARAM, buf.dtype, (), ParamArg(len(self.bufs) - 1, (buf.arg.size,), "CPU"))
  def input(self, data: np.ndarray, dt: DType) -> Node:
    b = new_buffer(data.size, dt, "CPU")
    self.S.set_data(b, as_np(np.asarray(data), dt).reshape(-1))
    return self.param(b)
  def out(self, v: Node, what: str, tol: float = 0.0):
    b = new_buffer(int(np.prod(v.shape)), v.dtype, "CPU")
    p = self.param(b)
    self.stores.append(p.after(p.store(v.reshape((b.arg.size,)))))
    self.tol[b.arg.uid] = (what, tol)
  def call(self) -> Node:
    return Node(Ops.CALL, dtypes.void, (self.stores[0].sink(*self.stores[1:]), *self.bufs), CallInfo())

def op_prog(dt: DType) -> Prog:
  """Every op dt accepts: unary ones on the edge values, binary ones on every pair of them, WHERE."""
  P, e = Prog(f"ops_{dt.name}"), edges(dt)
  a, b = P.input(np.repeat(e, e.size), dt), P.input(np.tile(e, e.size), dt)
  u = P.input(e, dt)
  ftol = TOL.get(dt.name, 0.0)
  for op in UNARY:
    if accepts(op, dt): P.out(Node(op, None, (u,)), f"{op.name} {dt.name}", ftol if op in APPROX else 0.0)
  for op in BINARY:
    if accepts(op, dt): P.out(Node(op, None, (a, b)), f"{op.name} {dt.name}", ftol if op in APPROX else 0.0)
  P.out(Node(Ops.WHERE, None, (Node(Ops.CMPLT, None, (a, b)), a, b)), f"WHERE {dt.name}")
  if accepts(Ops.MULACC, dt): P.out(Node(Ops.MULACC, None, (a, b, P.input(np.roll(np.tile(e, e.size), 1), dt))), f"MULACC {dt.name}")
  return P

def cast_prog(dt: DType) -> Prog:
  """dt cast to each of the 17 dtypes, and bitcast to each other dtype of its size (NaNs left out of half bitcasts:
  their payload is not kept through float, as on the GPU)."""
  P, v = Prog(f"casts_{dt.name}"), cast_values(dt)
  x = P.input(v, dt)
  for to in dtypes.all:
    if to != dt: P.out(x.cast(to), f"CAST {dt.name} -> {to.name}")
  same = [to for to in dtypes.all if to.itemsize == dt.itemsize and to != dt and dtypes.bool not in (to, dt)]
  if same:
    w = v[~np.isnan(v.astype(np.float64))] if dt.is_float() else v
    y = P.input(w, dt)
    for to in same: P.out(Node(Ops.BITCAST, to, (y,)), f"BITCAST {dt.name} -> {to.name}")
  return P

def reduce_prog(dt: DType) -> Prog:
  """ADD/MUL/MAX over rows of 8 (serial) and 64 (split across a block) elements."""
  P, rng = Prog(f"reduce_{dt.name}"), np.random.default_rng(dt.itemsize)
  for n in (8, 64):
    if dt.is_float(): data = rng.standard_normal(4 * n) * (1.0 if n == 8 else 0.5) + 0.4
    elif dt == dtypes.bool: data = rng.random(4 * n) < 0.9
    else: data = numeric.wrap_const(0, dt) + rng.integers(-300, 300, 4 * n).astype(np.int64).astype(dt.np)
    x = P.input(data, dt).reshape((4, n))
    for rop in (Ops.ADD, Ops.MUL, Ops.MAX):
      tol = TOL.get(dt.name, 0.0) * (4 if dt.itemsize == 2 else 1) if rop is not Ops.MAX else 0.0
      P.out(Node(Ops.REDUCE, None, (x,), (rop, (1,))), f"REDUCE {rop.name} {dt.name} x{n}", tol)
  return P

_R = np.random.default_rng(7)
TF_X = np.concatenate([np.array([0, 1, 2**32 - 1, 2**32, 2**64 - 1], np.uint64), _R.integers(0, 2**64, 59, np.uint64)])
TF_KEY = np.concatenate([np.array([0, 2**64 - 1, 1, 0x1BD11BDA, 12345], np.uint64), _R.integers(0, 2**64, 59, np.uint64)])

def threefry_prog() -> Prog:
  P = Prog("threefry")
  P.out(Node(Ops.THREEFRY, dtypes.uint64, (P.input(TF_X, dtypes.uint64), P.input(TF_KEY, dtypes.uint64))), "THREEFRY")
  return P

def same(got: np.ndarray, want: np.ndarray, tol: float) -> bool:
  if want.dtype.kind in 'iub': return np.array_equal(got, want)
  with np.errstate(invalid="ignore"): g, w = got.astype(np.float64), want.astype(np.float64)
  if tol: return np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True)
  return bool(np.all((g == w) | (np.isnan(g) & np.isnan(w))))

@pytest.fixture(scope="module")
def results():
  """Every program run once, in one emulator module: {what: (got, want, inputs)}."""
  progs = [f(dt) for dt in dtypes.all for f in (op_prog, cast_prog, reduce_prog)] + [threefry_prog()]
  lows = cuda.plans([p.call() for p in progs])
  emu = cuda_dev.emulator()
  mod = emu.load(lows[0].plan)
  out = {}
  for p, lw in zip(progs, lows):
    got, ref = p.S.copy(), p.S.copy()
    cuda_dev.run_lowered(lw, got, emu, mod)
    evaluate([p.call()], ref)
    for uid, (what, tol) in p.tol.items(): out[what] = (got[uid], ref[uid], tol)
  return out

def check(results, prefix: str):
  rows = {k: v for k, v in results.items() if k.startswith(prefix)}
  assert rows, prefix
  def where(g, w, tol):
    i = [j for j in range(w.size) if not same(g[j:j + 1], w[j:j + 1], tol)][:6]
    return f"at {i}: got {g[i].tolist()}, want {w[i].tolist()}"
  bad = [f"{k}: {where(g, w, tol)}" for k, (g, w, tol) in rows.items() if not same(g, w, tol)]
  assert not bad, "\n".join(bad)

@pytest.mark.parametrize("dt", [d.name for d in dtypes.all])
def test_ops(results, dt):
  rows = [k for k in results if k.endswith(f" {dt}") and not k.startswith(("CAST", "BITCAST", "REDUCE"))]
  assert len(rows) >= 4
  for k in rows: check(results, k)

@pytest.mark.parametrize("dt", [d.name for d in dtypes.all])
def test_casts_and_bitcasts(results, dt):
  check(results, f"CAST {dt} ->")
  if dt not in ("bool",): check(results, f"BITCAST {dt} ->")

@pytest.mark.parametrize("dt", [d.name for d in dtypes.all])
def test_reduces(results, dt):
  for n in (8, 64):
    for rop in ("ADD", "MUL", "MAX"): check(results, f"REDUCE {rop} {dt} x{n}")

def test_threefry_matches_numeric(results):
  got, _, _ = results["THREEFRY"]
  assert np.array_equal(got, numeric.threefry2x32(TF_X, TF_KEY))

def test_every_pair_is_covered(results):
  assert sum(k.startswith("CAST ") for k in results) == len(dtypes.all) * (len(dtypes.all) - 1)
  assert {k.split()[1] for k in results if k.startswith("BITCAST")} == {d.name for d in dtypes.all if d != dtypes.bool}

def test_fp8_casts_match_tinygrad():
  """The prelude's fp8 conversions under the emulator, bit for bit against tinygrad's float_to_fp8 (from float32 and
  float64 over the sweep: ties, subnormals, overflow, inf, NaN, -0) and fp8_to_float (all 256 patterns)."""
  from fp8_oracle import sweep, tinygrad_bits, tinygrad_values
  progs, want = [], {}
  for dt in dtypes.fp8s:
    P, x64 = Prog(f"fp8_{dt.name}"), sweep(dt, 1000)
    with np.errstate(over="ignore"): x32 = x64.astype(np.float32)
    for src, x in ((dtypes.float32, x32), (dtypes.float64, x64)):
      P.out(Node(Ops.BITCAST, dtypes.uint8, (P.input(x, src).cast(dt),)), f"{src.name} -> {dt.name}")
      want[f"{src.name} -> {dt.name}"] = tinygrad_bits(x, dt)
    P.out(Node(Ops.BITCAST, dt, (P.input(np.arange(256, dtype=np.uint8), dtypes.uint8),)).cast(dtypes.float32), f"{dt.name} -> float32")
    want[f"{dt.name} -> float32"] = tinygrad_values(dt).astype(np.float32)
    progs.append(P)
  lows = cuda.plans([p.call() for p in progs])
  emu = cuda_dev.emulator()
  mod = emu.load(lows[0].plan)
  for p, lw in zip(progs, lows):
    got = p.S.copy()
    cuda_dev.run_lowered(lw, got, emu, mod)
    for uid, (what, _) in p.tol.items():
      g, w = got[uid], want[what]
      if w.dtype == np.uint8: np.testing.assert_array_equal(g, w, err_msg=what)
      else: assert np.array_equal(g.view(np.uint32)[~np.isnan(w)], w.view(np.uint32)[~np.isnan(w)]) and np.isnan(g[np.isnan(w)]).all(), what

def test_unrenderable_raises_unsupported():
  """What the renderer cannot spell names the op and the dtype."""
  with pytest.raises(UnsupportedOpError, match="THREEFRY.*uint32"): cuda_ops.alu(Ops.THREEFRY, dtypes.uint32, (dtypes.uint32,) * 2, ["a", "b"])
  with pytest.raises(UnsupportedOpError, match="BITCAST int32 ->.*int64"): cuda_ops.bitcast(dtypes.int32, dtypes.int64, "a")
  with pytest.raises(UnsupportedOpError, match="SQRT.*int8"): cuda_ops.alu(Ops.SQRT, dtypes.int8, (dtypes.int8,), ["a"])

def test_constants_and_nvcc_spellings():
  """Negative constants are parenthesized (`-(-1)` must not read `--1`); minimums spelled without overflow; non-finite
  floats through their bits; bfloat16 constants rounded as ml_dtypes rounds."""
  assert cuda_ops.cconst(-1, dtypes.int8) == "(((signed char)-1))" and cuda_ops.cconst(-2**31, dtypes.int32) == "(-2147483647 - 1)"
  assert cuda_ops.cconst(2**64 - 1, dtypes.uint64) == "18446744073709551615ull" and cuda_ops.cconst(-1, dtypes.uint32) == "4294967295u"
  assert cuda_ops.cconst(float("inf"), dtypes.float64).startswith("cs_f64(") and cuda_ops.cconst(-1.5, dtypes.float64) == "(-0x1.8000000000000p+0)"
  assert cuda_ops.cconst(1 + 2**-8 + 2**-20, dtypes.bfloat16) == float(1 + 2**-7).hex() + "f"
  assert cuda_ops.cconst(1e9, dtypes.fp8e4m3) == "((unsigned char)126u)"   # fp8: its byte, saturated as tinygrad

@pytest.mark.skipif(drv.nvcc_path() is None, reason="nvcc is not on PATH (nor in $CUDA_HOME/bin, /usr/local/cuda/bin)")
def test_nvcc_compiles_every_dtype_kernel():
  progs = [f(dt) for dt in dtypes.all for f in (op_prog, cast_prog, reduce_prog)] + [threefry_prog()]
  src = cuda.plans([p.call() for p in progs])[0].plan["source"]
  assert drv.nvcc_ptx(src, "sm_90").count(".entry ") == src.count('extern "C" __global__')
