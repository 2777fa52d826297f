"""Spec §4.6 examples added by the seed-coverage work (EX4 bitcast view, EX5 view assign, EX5d copy assign) and the
§7 invariants 11-14 (coverage, aliasing, fresh buffers, write set) as properties over random graphs."""
import numpy as np
from hypothesis import given, settings, HealthCheck
from egraph import Tensor, dtypes, callify
from egraph.ir.ops import Node, Ops, GroupOp, toposort, new_buffer, const
from egraph.engine.encode import realize_points, live_topo
from graphgen import graphs

def storage_of(v: Node) -> Node:
  while v.op in GroupOp.Movement or v.op in (Ops.SLICE, Ops.AFTER): v = v.src[0]
  return v

def test_ex4_bitcast_of_a_contiguous_view_is_a_retyped_slice():
  a = Tensor(np.arange(8, dtype=np.float32)).realize()
  b = a[2:6].bitcast(dtypes.int32)
  res = callify(b)
  v = res.buffer_map[b.node]
  assert v.op is Ops.SLICE and v.dtype == dtypes.int32 and v.src[0] is a.node and v.arg == (2, 4)
  assert res.report.stores == 0
  np.testing.assert_equal(b.numpy(), np.arange(8, dtype=np.float32)[2:6].view(np.int32))

def test_ex4_copy_of_a_contiguous_view_passes_a_slice_arg():
  a = Tensor(np.arange(8, dtype=np.float32)).realize()
  c = a[2:6].to("PYTHON")
  res = callify(c)
  args = res.call.src[1:]
  assert res.buffer_map[c.node].op is Ops.BUFFER and res.buffer_map[c.node].device == "PYTHON"
  assert any(x.op is Ops.SLICE and x.src[0] is a.node and x.arg == (2, 4) for x in args)        # the SLICE is the CALL arg
  np.testing.assert_equal(c.numpy(), [2, 3, 4, 5])

def test_ex5_view_assign():
  a = Tensor([1., 2, 3, 4]).realize()
  buf = a.node
  x = Tensor([7., 8]).realize()
  a[1:3].assign(x)
  res = callify(a)
  M = res.buffer_map
  inner = [k for k in M if k.op is Ops.AFTER and k.src[0].op is Ops.SHRINK]
  assert len(inner) == 1 and M[inner[0]].op is Ops.SHRINK and M[inner[0]].src[0] is buf   # inner AFTER -> SHRINK(BUFFER a)
  assert M[a.node] is buf                                                                   # outer AFTER -> BUFFER a
  assert res.report.stores == 1 and res.report.buffers == 0
  np.testing.assert_equal(a.numpy(), [1, 7, 8, 4])
  assert a.node is buf

def test_ex5d_assign_of_a_host_copy_lands_in_place():
  b = Tensor([0., 0, 0]).realize()
  buf = b.node
  c = Tensor([1., 2, 3])                              # a lazy COPY from NPY
  b.assign(c)
  res = callify(b)
  assert set(res.buffer_map.values()) == {buf} and len(res.buffer_map) == 2             # the AFTER and the COPY
  assert res.report.stores == 1 and res.report.buffers == 0 and res.report.matches["assign_copy_in_place"] >= 1
  np.testing.assert_equal(b.numpy(), [1, 2, 3])

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

@SETTINGS
@given(graphs())
def test_invariants_11_to_14(g):
  res = callify(*g.roots, cache=False)
  C, M = res.call, res.buffer_map
  body, args = C.src[0], C.src[1:]
  topo = toposort(g.roots, enter_calls=False)
  # 11 coverage: every realize point of the live graph is mapped (no exceptions needed: views, zero-size and GETTUPLE are
  # mapped too); an assign into a computed value drops its target's old value, so that target's realize points go
  live = live_topo(g.roots, topo)[0]
  assert set(realize_points(g.roots, live)) == set(M)
  for n in live:
    if n.device is not None and (n.op in (Ops.CONTIGUOUS, Ops.AFTER) or (n.op is Ops.COPY and n.src[0].device == "NPY")):
      assert n in M
  inputs = {n for n in topo if n.op is Ops.BUFFER}
  fresh = {a for a in args if a.op is Ops.BUFFER and a not in inputs}
  # 12 aliasing: an assign maps to its own target; CONTIGUOUS of such an assign shares it
  for k, v in M.items():
    if k.op is Ops.AFTER and len(k.src) == 2 and k.src[1].op is Ops.STORE and storage_of(k.src[0]).op is Ops.BUFFER \
       and not any(m.op in (Ops.PAD, Ops.EXPAND) for m in toposort([k.src[0]])):
      assert v is k.src[0] or storage_of(v) is storage_of(k.src[0]), (k, v)
      c = k.contiguous()
      if c in M and k.src[0].has_buffer_identity(): assert storage_of(M[c]) is storage_of(v)
  # 13 fresh buffers: a value that is not an input's storage is a fresh buffer passed to the CALL (zero-size: nothing to pass)
  for k, v in M.items():
    b = storage_of(v)
    assert b in inputs or b in fresh or (b.op is Ops.BUFFER and b.arg.size == 0), (k, v)
  assert len(fresh) <= len(M)
  # 14 write set: written buffers are the targets of top-level AFTERs with a STORE or CALL dependency
  written = set()
  for n in toposort([body], enter_calls=False):
    if n.op is Ops.AFTER and any(d.op in (Ops.STORE, Ops.CALL) for d in n.src[1:]):
      p = storage_of(n.src[0])
      assert p.op is Ops.PARAM
      written.add(storage_of(args[p.arg.slot]))
  for k, v in M.items():
    b = storage_of(v)
    assert b in written or b in inputs or b.arg.size == 0, (k, v)
  assert {storage_of(a) for a in fresh if a.arg.size} <= written

def test_coverage_of_an_assign_into_a_computed_value():
  # the example hypothesis found: AFTER(c, STORE(c, v)) with c a computed CONTIGUOUS; c's old value is dead (spec rule 8),
  # so c is no realize point of the live graph and gets no buffer
  b = new_buffer(16, dtypes.float32, "CPU")
  one = const(1.0, dtypes.float32, "CPU").reshape((1,)).expand((16,))
  c = Node(Ops.CONTIGUOUS, None, (Node(Ops.ADD, None, (b, one)),))
  root = c.after(c.store(Node(Ops.MUL, None, (b, one))))
  M = callify(root, cache=False).buffer_map
  topo = toposort([root], enter_calls=False)
  assert c not in M and set(realize_points([root], live_topo([root], topo)[0])) == set(M) == {root}
