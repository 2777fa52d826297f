"""The scalar renderer (_Fn) and the explicit-vector renderer (_VecFn) share one instruction selection (_Isel): every op
and cast they both accept must give the same bits on either path. Each case runs as a plain kernel and as a `stream`
kernel (explicit vector IR on x86) over the same inputs, including NaN, inf and -0.0 for floats and the extremes for
integers, at a size with a masked head, full vectors and a masked tail."""
import platform
import numpy as np
import pytest
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Ops, GroupOp, ALU_OPS
from lower.schedule.kernel import Kernel, Param, Store, Expr, Idx, Var, const
from lower.schedule import decomp
from lower.device.compiler import compile_kernels, module_text
from lower.render.llvm.stream import _vec_ok
from lower.device.native import launch

N = 333
RNG = np.random.default_rng(3)
DTS = [d for d in dtypes.all if d != dtypes.bool]

def _data(dt, n, special=True):
  if dt == dtypes.bool: return RNG.integers(0, 2, n).astype(np.bool_)
  if dt.is_float():
    x = (RNG.standard_normal(n) * 8).astype(dt.np)
    if special: x[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0]
    return RNG.permutation(x)
  info = np.iinfo(dt.np)
  x = RNG.integers(info.min, int(info.max) + 1, n, dtype=dt.np)
  x[:5] = [info.min, info.max, 0, 1, info.max // 2]
  return RNG.permutation(x)

def _kernel(val, out_dt, in_dts, stream):
  i = Var("i0", N)
  ps = (Param("p0", out_dt, N, out_dt.itemsize, True, False, True),) + tuple(
    Param(f"p{j + 1}", d, N, d.itemsize, True, True) for j, d in enumerate(in_dts))
  return Kernel(f"r_{N}", ps, (i,), Store(0, Idx.var(i), val), stream=stream)

def _cases(dt):
  """(name, out dtype, input dtypes, build(loads) -> Expr) for every op and cast of `dt` that _VecFn can emit."""
  out = []
  for op in sorted(GroupOp.ALU, key=lambda o: o.value):
    if op is Ops.WHERE: continue   # below
    if not ALU_OPS[op].accepts(dt): continue
    rdt = dtypes.bool if op in GroupOp.Comparison else dt
    E = lambda *s, op=op, rdt=rdt: decomp.alu(op, rdt, s)   # as the kernel builder makes it (decomposed where it must be)
    if op in GroupOp.Unary: out.append((op.name, rdt, (dt,), E))
    elif op in GroupOp.Ternary: out.append((op.name, rdt, (dt, dt, dt), E))
    else:
      out.append((op.name, rdt, (dt, dt), E))
      out.append((op.name + "_const", rdt, (dt,), lambda a, E=E: E(a, const(3, dt))))
  out.append(("WHERE", dt, (dtypes.bool, dt, dt), lambda c, a, b: Expr(Ops.WHERE, dt, (c, a, b))))
  out.append(("CAST_from_bool", dt, (dtypes.bool,), lambda a: Expr(Ops.CAST, dt, (a,))))
  for to in DTS + [dtypes.bool]:
    if to == dt: continue
    out.append((f"CAST_{to.name}", to, (dt,), lambda a, to=to: Expr(Ops.CAST, to, (a,))))
    if to.itemsize == dt.itemsize and to != dtypes.bool:   # (the scheduler makes a bool BITCAST a CAST)
      out.append((f"BITCAST_{to.name}", to, (dt,), lambda a, to=to: Expr(Ops.BITCAST, to, (a,))))
  return out

@pytest.mark.parametrize("dt", DTS, ids=lambda d: d.name)
def test_scalar_and_vector_paths_agree(dt):
  i = Var("i0", N)
  cases, kernels = [], []
  for name, out_dt, in_dts, build in _cases(dt):
    val = build(*[Expr('load', d, (), (j + 1, Idx.var(i), ())) for j, d in enumerate(in_dts)])
    ks = _kernel(val, out_dt, in_dts, False), _kernel(val, out_dt, in_dts, True)
    if not _vec_ok(ks[1]): continue   # e.g. int64 -> uint8 (a <64 x i64> is over 256 bytes per vector), int64 IDIV
    cases.append((name, out_dt, in_dts)); kernels += [(ks[0], f"sc_{name}"), (ks[1], f"vec_{name}")]
  assert len(cases) >= 20
  if platform.machine() in ("x86_64", "AMD64"): assert "%stage" not in module_text([kernels[-1]])
  compiled = compile_kernels(kernels)
  for j, (name, out_dt, in_dts) in enumerate(cases):
    ins = [_data(d, N) for d in in_dts]   # float -> int of NaN, inf and out-of-range values is defined too
    res = []
    for c in compiled[2 * j:2 * j + 2]:
      raw = np.zeros((N + 9) * out_dt.itemsize, np.uint8)
      o = raw[out_dt.itemsize:(N + 1) * out_dt.itemsize].view(out_dt.np)   # an unaligned output: a masked head
      with np.errstate(all="ignore"): launch(c, [o.ctypes.data] + [x.ctypes.data for x in ins], threads=1)
      res.append(o.view(np.uint8).copy())
    np.testing.assert_array_equal(res[1], res[0], err_msg=f"{dt.name} {name}: the vector path differs from the scalar one")
