"""The op table's recipe followed once, end to end: MULACC (a * b + c, tinygrad's fused multiply-add) is one line in
egraph/ir/ops.py's table, one method of the front end, one line of numpy semantics (the oracle) and one decomposition
(lower/schedule/decomp.py); the renderers spell everything else. Checked on CPU (LLVM), PYTHON (the reference) and the
CUDA renderer under its CPU emulator, on every dtype MULACC accepts, against the oracle's two roundings."""
import shutil
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.ir.dtype import dtypes
from egraph.ir.errors import DTypeError
from egraph.ir.ops import Ops, GroupOp, ALU_OPS, toposort
from egraph.ir.storage import STORAGE
from lower import numeric
from lower.reference import evaluate
from lower.schedule.decomp import DECOMPOSITIONS
from lower.render.llvm.function import LLVMRenderer
from lower.render.llvm.stream import VecRenderer
from lower.render.cuda.render import CUDARenderer
from lower.render.cuda import render as cuda
from lower.device import cuda as cuda_dev

DTS = [dt for dt in dtypes.all if ALU_OPS[Ops.MULACC].accepts(dt)]

def _inputs(dt, seed=0):
  rng = np.random.default_rng(seed)
  if dt.is_float(): return [rng.standard_normal((3, 37)).astype(np.float32) * s for s in (3.0, 3.0, 5.0)]
  return [rng.integers(-300, 300, (3, 37)) for _ in range(3)]

def _oracle(dt, xs):
  a, b, c = (numeric.cast(np.asarray(x), dtypes.float32 if dt.is_float() else dtypes.int64, dt) for x in xs)
  return numeric.alu(Ops.ADD, dt, numeric.alu(Ops.MUL, dt, a, b), c)

def _same(got, want, dt):
  if not dt.is_float(): return np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(dt.np))
  g, w = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
  assert g.shape == w.shape and np.all((g == w) | (np.isnan(g) & np.isnan(w))), (g, w)

def test_every_renderer_spells_or_gets_decomposed_every_alu_op():
  for R in (LLVMRenderer, VecRenderer, CUDARenderer):
    assert R.code_for_op | set(DECOMPOSITIONS) == GroupOp.ALU and not R.code_for_op & set(DECOMPOSITIONS), R.__name__

def test_the_table_gives_mulacc_its_arity_dtypes_and_tinygrad_name():
  info = ALU_OPS[Ops.MULACC]
  assert (info.arity, info.tinygrad, Ops.MULACC in GroupOp.Ternary) == (3, None, True)
  with pytest.raises(DTypeError, match="MULACC: needs an int or float dtype, got bool"):
    Tensor([True]).mulacc(Tensor([True]), Tensor([False]))

@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_mulacc_on_cpu_and_python_is_the_oracles(dt, device):
  xs = _inputs(dt)
  a, b, c = (Tensor(x, device=device).cast(dt) for x in xs)
  c = c[0]   # broadcast along the rows
  out = a.mulacc(b, c)
  assert Ops.MULACC in {n.op for n in toposort([out.node])}
  want = _oracle(dt, [xs[0], xs[1], np.broadcast_to(xs[2][0], xs[0].shape)])
  _same(out.numpy(), want, dt)

@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")
def test_mulacc_under_the_cuda_emulator_is_the_oracles():
  calls = []
  for dt in DTS:
    xs = _inputs(dt, seed=dt.itemsize)
    a, b, c = (Tensor(x).cast(dt).realize() for x in xs)
    calls.append(callify(a.mulacc(b, c).contiguous().node).call)
  lows = cuda.plans(calls)
  emu = cuda_dev.emulator()
  mod = emu.load(lows[0].plan)
  for dt, call, lw in zip(DTS, calls, lows):
    got, ref = STORAGE.copy(), STORAGE.copy()
    cuda_dev.run_lowered(lw, got, emu, mod)
    evaluate([call], ref)
    out = call.src[1].arg.uid   # the one written buffer
    g, w = got[out], ref[out]
    if dt in (dtypes.float32, dtypes.float64):   # nvcc (and g++ with FMA) may contract a*b+c: one rounding, not two
      np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-6 if dt == dtypes.float32 else 1e-14, atol=1e-6)
    else: _same(g, w, dt)
