"""Spec §7 invariants 1-10 and 15 as hypothesis properties over random graphs."""
import numpy as np
from hypothesis import given, settings, HealthCheck
from egraph import callify
from egraph.ir.ops import Node, Ops, GroupOp, CallInfo, toposort, substitute, new_buffer
from egraph.ir.dtype import dtypes
from graphgen import graphs, reference_values, executed_values

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

def top_level(body): return toposort([body], enter_calls=False)

def is_storage_view(v: Node) -> bool:
  n = v
  while n.op in GroupOp.Movement or n.op is Ops.SLICE: n = n.src[0]
  return n.op is Ops.BUFFER and not any(m.op in (Ops.AFTER, Ops.STORE, Ops.CALL, Ops.CONTIGUOUS) for m in toposort([v]))

@SETTINGS
@given(graphs())
def test_structure_invariants(g):
  res = callify(*g.roots)
  C, M = res.call, res.buffer_map
  body, args = C.src[0], C.src[1:]
  originals = {n.id for n in toposort(g.roots, enter_calls=False)}
  assert not any(v in M for v in M.values())                                             # 1 values are never keys
  assert all(k.id in originals for k in M)                                               # 2 keys are original nodes
  for k, v in M.items():                                                                 # 3 type preservation
    assert (v.shape, v.dtype, v.device) == (k.shape, k.dtype, k.device), (k, v)
    assert is_storage_view(v), v                                                         # 4 values are storage views
  assert C.op is Ops.CALL and C.dtype == dtypes.void and body.op is Ops.SINK and C.arg == CallInfo()   # 5
  assert len(set(a.id for a in args)) == len(args)
  assert all(a.op is Ops.BUFFER or (a.op is Ops.SLICE and a.src[0].op is Ops.BUFFER) for a in args)
  top = top_level(body)
  assert not any(n.op is Ops.BUFFER or (n.op is Ops.SLICE and n.src[0].op is Ops.BUFFER) for n in top)   # 6
  params = {n.arg.slot: n for n in top if n.op is Ops.PARAM and n.arg.slot >= 0}                         # 7
  assert sorted(params) == list(range(len(args)))
  for i, p in params.items(): assert (p.dtype, p.shape, p.device) == (args[i].dtype, args[i].shape, args[i].device)
  assert all(r.op is Ops.AFTER for r in body.src)                                        # 8 roots are AFTERs

@SETTINGS
@given(graphs())
def test_fixpoint(g):                                                                   # 9 idempotence
  res = callify(*g.roots)
  again = callify(*substitute(list(g.roots), res.buffer_map))
  assert again.buffer_map == {} and again.call.src[0].src == () and len(again.call.src) == 1

@SETTINGS
@given(graphs())
def test_cache_normalisation(g):                                                        # 10 same graph, other buffers
  fresh = {b: new_buffer(b.arg.size, b.dtype, b.device) for b in g.inputs}
  fresh.update({n: new_buffer(n.arg.size, n.dtype, n.device) for n in toposort(g.roots, enter_calls=False)
                if n.op is Ops.BUFFER and n not in fresh})
  other = substitute(list(g.roots), fresh)
  assert callify(*g.roots, cache=False).call.src[0] is callify(*other, cache=False).call.src[0]

@SETTINGS
@given(graphs())
def test_semantic_preservation(g):                                                      # 15 values survive
  res = callify(*g.roots)
  keys = list(res.buffer_map)
  for k, want, got in zip(keys, reference_values(g, keys), executed_values(g, res.call, res.buffer_map, keys)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{k}")
