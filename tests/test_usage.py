"""Usage tests in tinygrad's style: test/unit/test_callify.py (spec §5.1, 13 tests) with our API, then assign, view
aliasing (quirk Q1), bad input, seeding, purity of `callify`, and the CLI demo. Every test checks values.

Only the public API is used: `from egraph import Tensor, dtypes, callify` (plus `egraph.*Error` and `Ops` to look at nodes).
"""
import os, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
import egraph
from egraph import Tensor, dtypes, callify, Ops

REPO = Path(__file__).resolve().parents[1]

def _ops(n) -> list:
  return [x.op for x in n.toposort(enter_calls=True)]

# ---------------------------------------------------------------------------------------------------------------------
# tinygrad test/unit/test_callify.py, one test each

def test_basic():
  a, b = Tensor([1., 2, 3]), Tensor([4., 5, 6])
  out = a + b
  out.callify()
  # lazy: the tensor is now AFTER(its buffer, CALL); nothing has run yet
  assert out.node.op is Ops.AFTER and out.node.src[0].op is Ops.BUFFER and out.node.src[1].op is Ops.CALL
  assert out.tolist() == [5.0, 7.0, 9.0]
  assert out.node.op is Ops.BUFFER  # reading realized it: the tensor now points at the buffer

def test_const():
  t = Tensor(2.0) + Tensor(3.0)
  assert t.device is None
  res = callify(t)
  assert res.call.op is Ops.CALL and len(res.call.src) == 1        # no arguments
  assert res.call.src[0].op is Ops.SINK and res.call.src[0].src == ()  # empty body
  assert res.buffer_map == {}
  before = t.node
  t.callify()
  assert t.node is before        # nothing to do for a device-less constant expression
  assert t.item() == 5.0

def test_sum():
  c = Tensor.ones(16).contiguous()
  t = c.sum()
  res = callify(t)
  # the CONTIGUOUS is a realize point of its own: it gets its own 16-element buffer (materialized, then reduced)
  assert c.node.op is Ops.CONTIGUOUS and c.node in res.buffer_map
  cbuf = res.buffer_map[c.node]
  assert cbuf.op is Ops.BUFFER and cbuf.shape == (16,)
  red = [k for k in res.buffer_map if k.op is Ops.REDUCE]
  assert len(red) == 1 and res.buffer_map[red[0]].shape == (1,)   # the scalar sum lives in a 1-element buffer
  assert t.item() == 16.0 and t.dtype == dtypes.float32
  # realize (a second, independent callify: fresh buffers again) mapped the live CONTIGUOUS tensor too
  assert c.node.op is Ops.BUFFER and c.node.shape == (16,) and c.node is not cbuf
  assert c.numpy().tolist() == [1.0] * 16

def test_sum_contiguous_after_merge():
  # the reference's EX2 shape: CONTIGUOUS(AFTER(buf, STORE(buf, ones))) is not copied again; both map to buf
  x = Tensor.zeros(16).contiguous().realize()
  buf = x.node
  x.assign(Tensor.ones(16))
  y = x.contiguous()
  assert y.node.op is Ops.CONTIGUOUS and y.node.src[0] is x.node and x.node.op is Ops.AFTER
  s = y.sum()
  res = callify(s)
  assert res.buffer_map[x.node] is buf and res.buffer_map[y.node] is buf
  assert res.report.stores == 2   # ones into buf, the sum into its scalar buffer
  assert s.item() == 16.0
  assert x.node is buf and y.node is buf and x.tolist() == [1.0] * 16

def test_multi_output():
  a, b = Tensor([1., 2, 3]), Tensor([4., 5, 6])
  c, d = a + b, a * b
  c.callify(d)
  assert c.node.op is d.node.op is Ops.AFTER and c.node.src[1] is d.node.src[1]  # one CALL for both
  assert c.node.src[0] is not d.node.src[0]
  assert c.tolist() == [5.0, 7.0, 9.0]
  assert d.tolist() == [4.0, 10.0, 18.0]

def test_two_callify_independent():
  a, b = Tensor([1., 2, 3]), Tensor([4., 5, 6])
  c, d = Tensor([10., 20, 30]), Tensor([1., 2, 3])
  x, y = a + b, c - d
  x.callify(); y.callify()
  assert x.node.src[1] is not y.node.src[1]
  assert x.tolist() == [5.0, 7.0, 9.0]
  assert y.tolist() == [9.0, 18.0, 27.0]

def test_two_callify_shared_input():
  a = Tensor([1., 2, 3]).contiguous().realize()
  assert a.node.op is Ops.BUFFER
  abuf = a.node
  b, c = a + 1, a * 2
  b.callify(); c.callify()
  assert b.tolist() == [2.0, 3.0, 4.0]
  assert c.tolist() == [2.0, 4.0, 6.0]
  assert a.node is abuf and a.tolist() == [1.0, 2.0, 3.0]

def test_chained_callify():
  a = Tensor([1., 2, 3])
  b = a + 1
  b.callify()
  b.realize()
  assert b.node.op is Ops.BUFFER
  c = b + 1
  c.callify()
  assert c.tolist() == [3.0, 4.0, 5.0]
  assert b.tolist() == [2.0, 3.0, 4.0]

def test_gemm():
  x = Tensor.ones(8, 8).contiguous() @ Tensor.eye(8).contiguous()
  x.callify()
  assert x.shape == (8, 8) and x.dtype == dtypes.float32
  assert x.tolist() == [[1.0] * 8] * 8

def test_int_dtype():
  a, b = Tensor([1, 2, 3], dtype=dtypes.int), Tensor([4, 5, 6], dtype=dtypes.int)
  out = a + b
  out.callify()
  assert out.dtype == dtypes.int32
  got = out.numpy()
  assert got.dtype == np.int32 and got.tolist() == [5, 7, 9]

def test_reduce():
  t = Tensor([1., 2, 3, 4]).sum()
  t.callify()
  assert t.shape == () and t.item() == 10.0

def test_multiple_ops():
  a, b = Tensor([1., 2, 3]), Tensor([4., 5, 6])
  out = (a + b) * (a - b)
  out.callify()
  na, nb = np.array([1., 2, 3]), np.array([4., 5, 6])
  assert out.tolist() == ((na + nb) * (na - nb)).tolist() == [-15.0, -21.0, -27.0]

def test_double_callify():
  a, b = Tensor([1., 2, 3]), Tensor([4., 5, 6])
  out = a + b
  out.callify()
  first = out.node
  out.callify()
  n = out.node
  # EX10: AFTER(BUFFER out, CALL2(SINK(AFTER(P0, CALL1(body1, ...))), ...)), the same output buffer both times
  assert n.op is Ops.AFTER and n.src[0].op is Ops.BUFFER and n.src[1].op is Ops.CALL
  assert n.src[0] is first.src[0]
  outer = n.src[1]
  inner_calls = [x for x in outer.src[0].toposort(enter_calls=False) if x.op is Ops.CALL]
  assert len(inner_calls) == 1
  inner = inner_calls[0]
  assert inner.src[0] is first.src[1].src[0]          # the inner body is the first callify's body, unchanged
  assert all(s.op is Ops.PARAM for s in inner.src[1:])  # its arguments became the outer CALL's PARAMs
  assert all(s.op is Ops.BUFFER for s in outer.src[1:])
  assert out.tolist() == [5.0, 7.0, 9.0]
  assert out.node is first.src[0]

def test_double_callify_multi_output():
  a, b = Tensor([1., 2, 3]), Tensor([4., 5, 6])
  c, d = a + b, a * b
  c.callify(d)
  c.callify(d)
  assert c.node.src[1] is d.node.src[1] and c.node.src[1].op is Ops.CALL
  assert Ops.CALL in [x.op for x in c.node.src[1].src[0].toposort(enter_calls=False)]  # nested
  assert c.tolist() == [5.0, 7.0, 9.0]
  assert d.tolist() == [4.0, 10.0, 18.0]

# ---------------------------------------------------------------------------------------------------------------------
# assign

def test_assign_in_place():
  a = Tensor([1., 2, 3]).realize()
  buf = a.node
  assert buf.op is Ops.BUFFER
  a.assign(a + 1)
  assert a.node.op is Ops.AFTER and a.node.src[0] is buf   # lazy write into a's own storage
  res = callify(a)
  assert res.buffer_map == {a.node: buf}
  a.realize()
  assert a.node is buf and a.tolist() == [2.0, 3.0, 4.0]
  a += 10
  assert a.node is not buf
  assert a.tolist() == [12.0, 13.0, 14.0] and a.node is buf

def test_assign_shape_and_dtype_mismatch():
  a = Tensor([1., 2, 3]).realize()
  with pytest.raises(egraph.ShapeError) as e: a.assign(Tensor([1., 2]))
  assert "(2,)" in str(e.value) and "(3,)" in str(e.value)
  with pytest.raises(egraph.DTypeError) as e: a.assign(Tensor([1, 2, 3], dtype=dtypes.int32))
  assert "int32" in str(e.value) and "float32" in str(e.value)
  assert a.tolist() == [1.0, 2.0, 3.0]  # a failed assign leaves the tensor alone

# ---------------------------------------------------------------------------------------------------------------------
# views alias their source, as in the reference (quirk Q1)

def test_contiguous_range_is_an_aliasing_view():
  a = Tensor(np.arange(8, dtype=np.float32)).realize()
  abuf = a.node
  b = a[2:6].contiguous()
  res = callify(b)
  # a zero-copy SLICE of a's buffer, mapped in the buffer_map (the reference leaves it unmapped), and no store at all
  v = res.buffer_map[b.node]
  assert v.op is Ops.SLICE and v.src[0] is abuf and v.arg == (2, 4)
  assert res.call.src[0].src == () and len(res.call.src) == 1
  b.realize()
  assert b.node is v and b.tolist() == [2.0, 3.0, 4.0, 5.0]
  # Q1: b aliases a's storage, so an in-place write to a shows through b (a copy would still read [2, 3, 4, 5])
  a.assign(a * 10).realize()
  assert a.node is abuf
  assert b.tolist() == [20.0, 30.0, 40.0, 50.0]

def test_non_contiguous_view_is_a_copy():
  a = Tensor(np.arange(8, dtype=np.float32)).realize()
  b = a.reshape(2, 4)[:, 1:3].contiguous()
  res = callify(b)
  assert res.buffer_map[b.node].base.op is Ops.BUFFER and res.buffer_map[b.node].base is not a.node
  assert b.tolist() == [[1.0, 2.0], [5.0, 6.0]]
  a.assign(a * 10).realize()
  assert b.tolist() == [[1.0, 2.0], [5.0, 6.0]]  # its own buffer: no aliasing

def test_fp8_rounds_and_saturates_as_tinygrad():
  """fp8 casts round to nearest even and saturate finite overflow (tinygrad's float_to_fp8); .numpy() is float32."""
  t = Tensor([1.0, 1.0625, 500.0, -1e6]).cast("float8_e4m3")
  assert t.dtype.name == "fp8e4m3" and t.numpy().dtype == np.float32
  assert t.tolist() == [1.0, 1.0, 448.0, -448.0] and t.bitcast("uint8").tolist() == [0x38, 0x38, 0x7E, 0xFE]
  assert (t[:2] * 3).tolist() == [3.0, 3.0] and (t[2:3] + t[2:3]).tolist() == [448.0]   # saturates, no inf

# ---------------------------------------------------------------------------------------------------------------------
# bad input: every error is a CallsatError subclass with a useful message

def test_broadcast_mismatch_names_both_shapes():
  with pytest.raises(egraph.ShapeError) as e: Tensor([1., 2, 3]) + Tensor([1., 2])
  assert "(3,)" in str(e.value) and "(2,)" in str(e.value)
  with pytest.raises(egraph.ShapeError) as e: Tensor.ones(2, 3) * Tensor.ones(4, 3)
  assert "(2, 3)" in str(e.value) and "(4, 3)" in str(e.value)

@pytest.mark.parametrize("make,err", [
  (lambda: Tensor([1., 2]) + Tensor([1., 2, 3]), egraph.ShapeError),
  (lambda: Tensor([1., 2], dtype="complex64"), egraph.DTypeError),
  (lambda: Tensor([1., 2]).cast("float8_e3m4"), egraph.DTypeError),
  (lambda: Tensor([1., 2], device="TPU"), egraph.DeviceError),
  (lambda: Tensor.ones(2, device="TPU"), egraph.DeviceError),
  (lambda: Tensor([1., 2]).to("TPU"), egraph.DeviceError),
  (lambda: Tensor([1., 2]).reshape(3), egraph.ShapeError),
  (lambda: Tensor([1., 2]).sum(axis=1), egraph.ShapeError),
  (lambda: Tensor([1., 2]) & 1, egraph.DTypeError),
])
def test_bad_input_raises_callsat_errors(make, err):
  with pytest.raises(err) as e: make()
  assert isinstance(e.value, egraph.CallsatError)
  if err is egraph.DeviceError: assert "TPU" in str(e.value)

# ---------------------------------------------------------------------------------------------------------------------
# seeding, purity

def test_manual_seed_reproducible():
  Tensor.manual_seed(7)
  x1, u1 = Tensor.randn(3, 4).numpy(), Tensor.rand(5).numpy()
  Tensor.manual_seed(7)
  x2, u2 = Tensor.randn(3, 4).numpy(), Tensor.rand(5).numpy()
  np.testing.assert_array_equal(x1, x2)
  np.testing.assert_array_equal(u1, u2)
  assert ((u1 >= 0) & (u1 < 1)).all() and not np.array_equal(x1.reshape(-1)[:5], u1)
  Tensor.manual_seed(8)
  assert not np.array_equal(Tensor.randn(3, 4).numpy(), x1)

def test_callify_is_pure():
  a = Tensor([1., 2, 3])
  h = (a * 2).contiguous()
  t = (h + 1).sum()
  nodes = (a.node, h.node, t.node)
  res = callify(t)
  assert (a.node, h.node, t.node) == nodes          # no tensor changed
  assert set(res.buffer_map) >= {h.node}            # though h is a realize point of the CALL
  assert callify(t).call.src[0] is res.call.src[0]  # same graph -> same parameterized body
  assert t.item() == 15.0 and h.tolist() == [2.0, 4.0, 6.0]

# ---------------------------------------------------------------------------------------------------------------------
# CLI

@pytest.mark.parametrize("args", [[], ["--model", "views"], ["--model", "mlp"]])
def test_cli_demo(args):
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  p = subprocess.run([sys.executable, "-m", "egraph", "demo", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stdout + p.stderr
  assert "OK" in p.stdout and "MISMATCH" not in p.stdout
  if not args:   # the default model shows a decision saturation makes better than tinygrad's rule order, in words
    assert "% less" in p.stdout and "a copy stored in a fresh buffer under the reference order; existing storage itself" \
      " (no copy) under saturation" in p.stdout
