"""Differential fuzzing: random Tensor programs (elementwise incl. floor division, modulo and shifts, reduce, movement,
matmul, contiguous, assign, multi-output realize) over every dtype are drawn once as a recipe, then built and realized
through callify on every runnable device and compared with numpy (ml_dtypes for bfloat16). 200 programs in the
default run; `-m slow` runs 2,000."""
import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck, strategies as st
from egraph import Tensor
from egraph.ir.dtype import dtypes
from lower.runtime import RUNNABLE

DEVICES = [d for d in ("CPU", "PYTHON") if d in RUNNABLE]
SHAPES = [(16,), (4, 4), (2, 8), (2, 2, 4), (1, 4, 4), (8,), (2, 4), (3,), (3, 5)]

def _factorizations(n):
  out = [(n,), (1, n), (n, 1)]
  out += [(a, n // a) for a in range(2, n) if n % a == 0]
  return out

@st.composite
def programs(draw, max_steps=8):
  dtype = draw(st.sampled_from(["float32", "float32", "int32", "int8", "uint8", "int16", "uint16", "uint32", "int64", "uint64",
                                "float16", "bfloat16", "float64"]))
  seed = draw(st.integers(0, 2**16))
  inputs = draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3))
  steps = []
  for _ in range(draw(st.integers(1, max_steps))):
    kind = draw(st.sampled_from(["bin", "bin", "un", "reduce", "reshape", "permute", "slice", "pad", "flip", "expand",
                                 "matmul", "contig", "contig", "assign", "where"]))
    steps.append((kind, draw(st.integers(0, 99)), draw(st.integers(0, 99)), draw(st.integers(0, 99)), draw(st.integers(0, 99))))
  outs = draw(st.lists(st.integers(0, 99), min_size=1, max_size=3))
  return dtype, seed, inputs, steps, outs

BIN = [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("maximum", np.maximum)]
# int-only: the divisor made nonzero and the shift count in range on both sides (numpy defines neither edge as tinygrad)
def _nz(y): return (y == 0).where(1, y) if isinstance(y, Tensor) else (y or 1)
INT_BIN = [("floordiv", lambda x, y: x // _nz(y), lambda a, b: a // np.where(b == 0, 1, b).astype(a.dtype)),
           ("mod", lambda x, y: x % _nz(y), lambda a, b: a % np.where(b == 0, 1, b).astype(a.dtype)),
           ("lshift", lambda x, y: x << (y & (x.dtype.bits - 1)), lambda a, b: a << (b & (a.dtype.itemsize * 8 - 1))),
           ("rshift", lambda x, y: x >> (y & (x.dtype.bits - 1)), lambda a, b: a >> (b & (a.dtype.itemsize * 8 - 1)))]

def run(program, device):
  """Build the program on `device`; returns (outputs, numpy references)."""
  dtype, seed, inputs, steps, outs = program
  dt = dtypes.from_any(dtype)
  np_dt = dt.np
  rng = np.random.default_rng(seed)
  def data(shape):
    return (rng.standard_normal(shape) if dt.is_float() else rng.integers(0 if dt.is_unsigned() else -9, 10, shape)).astype(np_dt)
  pool = []
  for shp in inputs:
    d = data(shp)
    pool.append((Tensor(d, device=device).realize(), d.astype(np.float32) if dt == dtypes.bfloat16 else d))
  for kind, i, j, k, l in steps:
    x, xr = pool[i % len(pool)]
    s = x.shape
    if kind == "bin":
      y, yr = pool[j % len(pool)]
      if y.shape != s: y, yr = (k % 5) - 2, np.array((k % 5) - 2).astype(np_dt)
      if dt.is_int() and l % 2:
        name, f, g = INT_BIN[k % len(INT_BIN)]
        with np.errstate(all="ignore"): t, r = f(x, y), g(xr, np.asarray(yr, np_dt))
      else:
        name, f = BIN[k % len(BIN)]
        with np.errstate(all="ignore"): t, r = getattr(x, name)(y), f(xr, yr).astype(np_dt)
    elif kind == "un":
      ops = [("neg", np.negative), ("relu", lambda a: np.maximum(a, 0)), ("abs", np.abs)]
      if dt.is_float(): ops.append(("sqrt", lambda a: np.sqrt(a)))
      name, f = ops[k % len(ops)]
      if name == "sqrt": x, xr = x.abs(), np.abs(xr)
      with np.errstate(all="ignore"): t, r = getattr(x, name)(), f(xr)
    elif kind == "reduce":
      if not s: continue
      axis = k % len(s)
      # tinygrad sums small ints in int32/uint32: cast back to compare with numpy's sum in the same ring
      if l % 2: t, r = x.sum(axis=axis).cast(dt), xr.sum(axis=axis, dtype=np.float32 if dt.itemsize == 2 and dt.is_float() else None).astype(np_dt)
      else: t, r = x.max(axis=axis), xr.max(axis=axis)
    elif kind == "reshape":
      fs = _factorizations(x.numel()); shp = fs[k % len(fs)]
      t, r = x.reshape(shp), xr.reshape(shp)
    elif kind == "permute":
      order = tuple(np.random.default_rng(k).permutation(len(s)))
      t, r = x.permute(order), xr.transpose(order)
    elif kind == "slice":
      if not s or s[0] < 2: continue
      a = k % s[0]; b = a + 1 + l % (s[0] - a)
      t, r = x[a:b], xr[a:b]
    elif kind == "pad":
      if not s: continue
      arg = [(0, 0)] * (len(s) - 1) + [(k % 3, l % 3)]
      t, r = x.pad(tuple(arg)), np.pad(xr, arg)
    elif kind == "flip":
      if not s: continue
      t, r = x.flip(k % len(s)), np.flip(xr, k % len(s))
    elif kind == "expand":
      n = 1 + k % 3
      t, r = x.unsqueeze(0).expand(n, *s), np.broadcast_to(xr[None], (n, *s))
    elif kind == "matmul":
      if len(s) != 2: continue
      y, yr = pool[j % len(pool)]
      mm = lambda a, b: (a.astype(np.float32) @ b.astype(np.float32)).astype(np_dt) if dt.itemsize == 2 and dt.is_float() else a @ b
      if len(y.shape) == 2 and y.shape[0] == s[1]: t, r = (x @ y).cast(dt), mm(xr, yr)
      else: t, r = (x @ x.T).cast(dt), mm(xr, xr.T)
    elif kind == "contig": t, r = x.contiguous(), xr
    elif kind == "assign":       # into a fresh realized buffer, whole or through a strided/permuted/shrunk view of it
      n = x.numel()
      if j % 2 == 0 or n == 0:
        d = data(s)
        tgt = Tensor(d, device=device).realize()
        if k % 2: tgt += x; r = (d + xr).astype(np_dt)
        else: tgt.assign(x); r = xr
        t = tgt
      else:                      # storage of step*n (+1) elements; the view names n of them, maybe transposed
        step, off = 1 + l % 3, (l // 3) % 2
        d = data((step * n + off,))
        buf = Tensor(d, device=device).realize()
        flat = np.arange(d.size)[off::step][:n]
        v, idx = buf[off::step][:n].reshape(s), flat.reshape(s)
        if len(s) >= 2 and k % 3 == 0:
          v, idx, xr2, x2 = v.permute(1, 0, *range(2, len(s))), idx.swapaxes(0, 1), xr.swapaxes(0, 1), x.permute(1, 0, *range(2, len(s)))
        else: xr2, x2 = xr, x
        want = d.copy(); want[idx] = xr2
        v.assign(x2)             # lazy: buf now reads after the write, realized with the outputs
        t, r = buf, want
    elif kind == "where":
      t, r = (x > 0).where(x, -x), np.where(xr > 0, xr, -xr)
    r = np.asarray(r)
    pool.append((t, r.astype(np.float32) if dt == dtypes.bfloat16 else r))
  chosen = list(dict.fromkeys(o % len(pool) for o in outs))
  Tensor.realize(*[pool[c][0] for c in chosen])     # multi-output: one CALL for all of them
  return [pool[c][0].numpy() for c in chosen], [pool[c][1] for c in chosen]

def check(program):
  for dev in DEVICES:
    got, want = run(program, dev)
    for g, w in zip(got, want):
      assert g.shape == w.shape, (dev, g.shape, w.shape)
      tol = {"float32": 1e-4, "float64": 1e-9, "float16": 2e-2, "bfloat16": 1e-1}.get(program[0], 0)
      if g.dtype.kind == "f": np.testing.assert_allclose(g, w.astype(g.dtype), rtol=tol, atol=tol, err_msg=dev)
      else: np.testing.assert_array_equal(g, w, err_msg=dev)

@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(programs())
def test_programs_match_numpy(program): check(program)

@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(programs(max_steps=12))
def test_programs_match_numpy_slow(program): check(program)

def test_fuzz_covers_both_devices_and_every_step_kind():
  """The recipe interpreter really builds every kind of step on both devices (not skipped by shapes)."""
  assert DEVICES == ["CPU", "PYTHON"]
  prog = ("float32", 1, [(4, 4), (4, 4)], [("bin", 0, 1, 0, 0), ("un", 2, 0, 1, 0), ("reduce", 3, 0, 0, 1),
          ("reshape", 0, 0, 3, 0), ("permute", 1, 0, 5, 0), ("slice", 0, 0, 1, 2), ("pad", 1, 0, 1, 2), ("flip", 0, 0, 1, 0),
          ("expand", 1, 0, 1, 0), ("matmul", 0, 1, 0, 0), ("contig", 2, 0, 0, 0), ("assign", 0, 0, 1, 0), ("where", 1, 0, 0, 0)],
          list(range(2, 15)))
  for dev in DEVICES:
    got, want = run(prog, dev)
    assert len(got) == 13
  check(prog)

@pytest.mark.parametrize("dtype", ["float32", "int8", "bfloat16"])
def test_fuzz_assign_through_strided_and_permuted_views(dtype):
  """The assign step's view targets: steps 1-3, offsets 0-1, transposed or not, over 1-3-d values (issue item 3)."""
  steps = [("reshape", 0, 0, 1, 0), ("assign", 0, 1, 1, 4), ("assign", 1, 1, 0, 2), ("assign", 2, 1, 3, 5), ("assign", 0, 3, 2, 1)]
  prog = (dtype, 3, [(4, 4), (2, 2, 4), (3,)], steps, [3, 4, 5, 6, 7])
  for dev in DEVICES:
    got, want = run(prog, dev)
    assert [g.size for g in got[1:]] == [33, 48, 10, 32]   # storage of step*n+off elements: the views really are strided
  check(prog)

def test_repro_permute_arg_collides_with_flip_arg():
  """Regression (found by the slow fuzz run): arg ids interned by == gave PERMUTE (1, 0) the FLIP arg (True, False)."""
  a = Tensor(np.arange(16, dtype=np.float32).reshape(2, 8), device="PYTHON").realize()
  s = a + a
  f = s.flip(0)          # FLIP arg (True, False)
  m = f @ f.T            # .T is PERMUTE arg (1, 0) == (True, False) as a dict key
  Tensor.realize(s, m)
  np.testing.assert_allclose(m.numpy(), (np.flip(2 * a.numpy(), 0) @ np.flip(2 * a.numpy(), 0).T))
