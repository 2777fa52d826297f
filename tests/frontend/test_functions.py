"""FUNCTION / TUPLE / GETTUPLE: plain functions stay FUNCTIONs (inlined by the lowering), precompiled ones become opaque
CALLs with their own output buffers (spec §4.2.1, EX6), including GETTUPLE remapping (quirk Q3 fixed)."""
import numpy as np
import pytest
from egraph import Tensor, function, callify, CallsatError
from egraph.ir.ops import Ops, toposort

@function
def axpy(x, y): return x * 2 + y

@function(precompile=True)
def twice(x): return x * 2

@function(precompile=True)
def split(x): return x + 1, (x * x).contiguous()

def ops_in(body): return [n.op for n in toposort([body], enter_calls=False)]

@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_plain_function_values_and_stays_a_function(device):
  a, b = Tensor([1., 2, 3], device=device).realize(), Tensor([10., 20, 30], device=device).realize()
  out = axpy(a, b) * 3
  res = callify(out)
  body = res.call.src[0]
  assert Ops.FUNCTION in ops_in(body) and Ops.CALL not in ops_in(body)
  np.testing.assert_allclose(out.numpy(), [36, 72, 108])

def test_precompiled_function_is_an_opaque_call_ex6():
  a = Tensor([1., 2, 3, 4]).realize()
  y = twice(a) * 2   # 2 stays a constant: no scalar argument (egraph/frontend/promote.py)
  res = callify(y)
  roots = res.call.src[0].src
  inner = [n for n in toposort([res.call.src[0]], enter_calls=False) if n.op is Ops.CALL]
  assert len(roots) == 2 and len(inner) == 1 and inner[0].arg.precompile and inner[0].arg.name == "twice"
  assert roots[0].op is Ops.AFTER and roots[0].src[1] is inner[0]                 # AFTER(P_out, CALL_s(...))
  assert len(res.call.src) == 4                                                   # s output, a, final
  assert list(res.buffer_map) == [y.node] and res.report.matches["precompile_call"] == 1
  np.testing.assert_allclose(y.numpy(), [4, 8, 12, 16])

def test_gettuple_of_a_precompiled_function_is_mapped_q3_fixed():
  a = Tensor([1., 2, 3]).realize()
  z = twice(a)
  res = callify(z)
  assert z.node in res.buffer_map and res.buffer_map[z.node].op is Ops.BUFFER
  z.realize()
  assert z.node.op is Ops.BUFFER                                                  # reading does not recompute
  np.testing.assert_allclose(z.numpy(), [2, 4, 6])

def test_double_call_and_computed_input():
  a = Tensor([1., 2, 3]).realize()
  np.testing.assert_allclose(twice(twice(a)).numpy(), [4, 8, 12])
  np.testing.assert_allclose(twice(a + 1).numpy(), [4, 6, 8])                     # a computed input is realized first

def test_multi_output_and_contiguous_redirect():
  a = Tensor([1., 2, 3]).realize()
  p, q = split(a)
  res = callify(p, q)
  inner = [n for n in toposort([res.call.src[0]], enter_calls=False) if n.op is Ops.CALL][0]
  # the contiguous output is stored straight into its output buffer: no CONTIGUOUS left in the inner body
  assert Ops.CONTIGUOUS not in ops_in(inner.src[0]) and sum(o is Ops.STORE for o in ops_in(inner.src[0])) == 2
  Tensor.realize(p, q)
  np.testing.assert_allclose(p.numpy(), [2, 3, 4]); np.testing.assert_allclose(q.numpy(), [1, 4, 9])

def test_trace_is_cached_and_checked():
  a = Tensor([1., 2]).realize()
  twice(a); twice(a)
  assert len(twice.traces) >= 1 and all(isinstance(k, tuple) for k in twice.traces)
  with pytest.raises(CallsatError, match="Tensors"): twice(3)
  @function
  def bad(x): return 3
  with pytest.raises(CallsatError, match="must return"): bad(a)

def test_same_precompiled_graph_twice_hits_the_cache():
  a, b = Tensor([1., 2]).realize(), Tensor([5., 6]).realize()
  r1, r2 = callify(twice(a) + 1), callify(twice(b) + 1)
  assert r2.report.cache_hit and r1.call.src[0] is r2.call.src[0]

# ---- spec §5.2 scenarios (tinygrad's test_call.py) that apply ------------------------------------------------------

@function(precompile=True)
def colsum(x): return x.sum(axis=0)

def test_reshape_precompile_after_an_assign_through_a_reshape():
  a = Tensor.zeros(4, 8).contiguous().realize()
  a.reshape(8, 4).assign(Tensor.ones(8, 4) * 2)
  y = colsum(a) * 3
  np.testing.assert_allclose(y.numpy(), np.full(8, 24.0))

def test_call_precompiled_on_empty_input():
  a = Tensor.empty(4, 8)
  y = twice(a) * 2   # 2 stays a constant: no scalar argument (egraph/frontend/promote.py)
  res = callify(y)
  assert any(n.op is Ops.CALL and n.arg.precompile for n in toposort([res.call.src[0]], enter_calls=False))
  assert y.shape == (4, 8)   # the values of an empty tensor are undefined: the reference executor refuses to read them

def test_double_call_contiguous():
  a = Tensor([1., 2, 3]).realize()
  np.testing.assert_allclose(twice(twice(a).contiguous()).numpy(), [4, 8, 12])

def test_precompile_schedule_cache_hit():
  a, b = Tensor([1., 2, 3, 4]).realize(), Tensor([5., 6, 7, 8]).realize()
  r1, r2 = callify(colsum(a.reshape(2, 2)) + 1, cache=False), callify(colsum(b.reshape(2, 2)) + 1, cache=False)
  assert r1.call.src[0] is r2.call.src[0]

def test_precompile_symbolic_input():
  from egraph import Variable
  v = Variable("n", 1, 8)
  a = Tensor(np.arange(8, dtype=np.float32), device="PYTHON").realize()   # native (CPU): tests/lower/schedule/test_nested_call_args.py
  np.testing.assert_allclose(twice(a[:v.bind(5)]).numpy(), [0, 2, 4, 6, 8])
  np.testing.assert_allclose((twice(a[:v.bind(3)]) + 1).numpy(), [1, 3, 5])

def test_precompile_on_a_sharded_input():
  devs = ("PYTHON", "PYTHON:1")
  a = Tensor(np.arange(8, dtype=np.float32).reshape(4, 2), device="PYTHON").shard(devs, axis=0)
  np.testing.assert_allclose(twice(a).numpy(), np.arange(8).reshape(4, 2) * 2)

@function(precompile=True)
def sharded_pair(x): return x + 1, x * 2, x.sum(0)

@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_precompiled_outputs_keep_the_shard_axis_of_the_body(device):
  """A precompiled body over a sharded input writes sharded outputs (MULTI output buffers, shards bound by the
  executors), a reduce over the shard axis a replicated one; values as numpy."""
  devs = (f"{device}:0", f"{device}:1")
  an = np.arange(8, dtype=np.float32).reshape(4, 2)
  t1, t2, t3 = sharded_pair(Tensor(an).shard(devs, axis=0))
  res = callify(t1, t2, t3)
  call = next(n for n in toposort([res.call.src[0]], enter_calls=False) if n.op is Ops.CALL)
  outs = call.src[-3:]
  assert [o.op is Ops.MULTI for o in outs] == [True, True, False] and [o.arg for o in outs[:2]] == [0, 0]
  assert outs[0].src[0].shape == (2, 2) and outs[2].shape == (2,)   # one shard per device; the sum replicated
  np.testing.assert_array_equal(t1.numpy(), an + 1)
  np.testing.assert_array_equal(t2.numpy(), an * 2)
  np.testing.assert_array_equal(t3.numpy(), an.sum(0))
  np.testing.assert_array_equal((sharded_pair(Tensor(an).shard(devs, axis=0))[0] + 2).numpy(), an + 3)
