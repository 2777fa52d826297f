"""The spec's worked examples (§4.6) in our IR, the report, limits, schedules, cost models and errors of callify."""
import json, time, math
import numpy as np
import pytest
from egraph import callify, Limits, Schedule, CostModel, CallsatError, EngineError
from egraph.ir.ops import Node, Ops, ParamArg, new_buffer, const, toposort, render
from egraph.ir.dtype import dtypes
from egraph.ir.storage import Storage
from lower.runtime import run_call
from lower.reference import evaluate

def buf(shape, storage=None, dtype=dtypes.float32, device="CPU", data=None):
  b = new_buffer(math.prod(shape), dtype, device)
  if storage is not None:
    storage.set_data(b, np.arange(b.arg.size, dtype=dtype.np) + 1 if data is None else data)
  return b.reshape(shape)

def P(slot, shape, dtype=dtypes.float32, device="CPU"): return Node(Ops.PARAM, dtype, (), ParamArg(slot, shape, device))

def test_ex1_add_of_two_buffers():
  a, b = buf((3,)), buf((3,))
  add = Node(Ops.ADD, None, (a, b))
  res = callify(add, fusion="rules")   # the spec's CALL exactly (cost mode marks its SINK for lower/)
  body, args = res.call.src[0], res.call.src[1:]
  out = res.buffer_map[add]
  assert out.op is Ops.BUFFER and out.arg.uid not in (a.arg.uid, b.arg.uid) and out.shape == (3,)
  p0, p1, p2 = P(0, (3,)), P(1, (3,)), P(2, (3,))
  assert body is Node(Ops.SINK, dtypes.void, (p0.after(p0.store(Node(Ops.ADD, None, (p1, p2)))),))   # output buffer first
  assert list(args) == [out, a, b]

def test_ex1_host_copies_are_materialized():
  s = Storage()
  ha, hb = buf((3,), s, device="NPY"), buf((3,), s, device="NPY")
  ca, cb = Node(Ops.COPY, dtypes.float32, (ha,), "CPU"), Node(Ops.COPY, dtypes.float32, (hb,), "CPU")
  add = Node(Ops.ADD, None, (ca, cb))
  res = callify(add)
  assert set(res.buffer_map) == {ca, cb, add}
  assert len(res.call.src[0].src) == 3 and res.report.stores == 3 and res.report.buffers == 3
  run_call(res.call, s)
  np.testing.assert_equal(evaluate([res.buffer_map[add]], s)[0], [2, 4, 6])

def test_ex2_contiguous_after_merge():
  ones = const(1.0, dtypes.float32, "CPU").reshape((1,)).expand((16,))
  b = buf((16,))
  after = b.after(b.store(ones))
  c = after.contiguous()
  red = Node(Ops.REDUCE, None, (c,), (Ops.ADD, (0,)))
  res = callify(red)
  M = res.buffer_map
  assert M[after] is b and M[c] is b                     # CONTIGUOUS(AFTER(buffer)) shares the assign's buffer
  assert M[red].shape == (1,) and M[red].op is Ops.BUFFER
  assert res.report.stores == 2 and res.report.matches.get("contiguous_of_assign", 0) >= 1
  s = Storage(); run_call(res.call, s)
  assert evaluate([M[red]], s)[0].item() == 16.0

def test_ex3_multi_output():
  a, b = buf((3,)), buf((3,))
  add, mul = Node(Ops.ADD, None, (a, b)), Node(Ops.MUL, None, (a, b))
  res = callify(add, mul)
  assert set(res.buffer_map) == {add, mul} and res.buffer_map[add] is not res.buffer_map[mul]
  assert len(res.call.src) == 5 and len(res.call.src[0].src) == 2

def test_ex4_contiguous_range_is_a_slice_view():
  s = Storage()
  a = buf((8,), s)
  c = a.shrink(((2, 6),)).reshape((2, 2)).contiguous()
  res = callify(c)
  v = res.buffer_map[c]
  assert v.op is Ops.RESHAPE and v.src[0].op is Ops.SLICE and v.src[0].arg == (2, 4) and v.src[0].src[0] is a
  assert res.call.src[0].src == () and res.report.stores == 0 and res.report.cost < res.report.baseline_cost
  np.testing.assert_equal(evaluate([v], s)[0], [[3, 4], [5, 6]])
  s[a.arg.uid][3] = 100                                  # views alias their source (quirk Q1, kept deliberately)
  assert evaluate([v], s)[0][0, 1] == 100

def test_ex4_non_contiguous_view_is_stored():
  s = Storage()
  a = buf((8,), s)
  c = a.reshape((2, 4)).shrink(((0, 2), (1, 3))).contiguous()
  res = callify(c)
  v = res.buffer_map[c]
  assert v.op is Ops.RESHAPE and v.src[0].op is Ops.BUFFER and v.src[0].arg.size == 4
  run_call(res.call, s)
  np.testing.assert_equal(evaluate([v], s)[0], [[2, 3], [6, 7]])

def test_ex5_assign_in_place():
  s = Storage()
  a = buf((3,), s)
  one = const(1.0, dtypes.float32, "CPU").reshape((1,)).expand((3,))
  after = a.after(a.store(Node(Ops.ADD, None, (a, one))))
  res = callify(after)
  assert res.buffer_map == {after: a}
  p0 = P(0, (3,))
  assert res.call.src[0].src == (p0.after(p0.store(Node(Ops.ADD, None, (p0, one)))),) and res.call.src[1:] == (a,)
  run_call(res.call, s)
  np.testing.assert_equal(s[a.arg.uid], [2, 3, 4])

def test_ex5_assign_into_computed_value_gets_a_fresh_buffer():
  s = Storage()
  a = buf((3,), s)
  t = Node(Ops.MUL, None, (a, a))
  one = const(1.0, dtypes.float32, "CPU").reshape((1,)).expand((3,))
  after = t.after(t.store(Node(Ops.ADD, None, (a, one))))
  res = callify(after)
  out = res.buffer_map[after]
  assert out.op is Ops.BUFFER and out is not a
  assert not any(n.op is Ops.MUL for n in toposort([res.call.src[0]]))   # the MUL disappears
  run_call(res.call, s)
  np.testing.assert_equal(evaluate([out], s)[0], [2, 3, 4])

def test_ex10_double_callify_nests_the_call():
  s = Storage()
  a, b = buf((3,), s), buf((3,), s)
  add = Node(Ops.ADD, None, (a, b))
  r1 = callify(add)
  lazy = r1.buffer_map[add].after(r1.call)                # what Tensor.callify leaves on the tensor
  r2 = callify(lazy)
  assert r2.buffer_map == {lazy: r1.buffer_map[add]}
  inner = [n for n in toposort([r2.call.src[0]], enter_calls=False) if n.op is Ops.CALL]
  assert len(inner) == 1 and inner[0].src[0] is r1.call.src[0] and all(x.op is Ops.PARAM for x in inner[0].src[1:])
  run_call(r2.call, s)
  np.testing.assert_equal(evaluate([r1.buffer_map[add]], s)[0], [2, 4, 6])

def test_detach_and_contiguous_backward_are_removed():
  a = buf((4,))
  x = Node(Ops.DETACH, dtypes.float32, (Node(Ops.CONTIGUOUS_BACKWARD, dtypes.float32, (Node(Ops.NEG, None, (a,)),)),))
  res = callify(Node(Ops.ADD, None, (x, x)))
  ops = {n.op for n in toposort([res.call.src[0]])}
  assert Ops.DETACH not in ops and Ops.CONTIGUOUS_BACKWARD not in ops
  assert res.report.matches["drop_detach"] >= 1 and res.report.matches["drop_contiguous_backward"] >= 1

def test_zero_size_result():
  a = buf((4, 4))
  z = Node(Ops.NEG, None, (a.shrink(((1, 1), (0, 4))),))
  res = callify(z)
  v = res.buffer_map[z]
  assert v.shape == (0, 4) and res.report.stores == 0
  run_call(res.call, Storage())

def test_device_less_constants_need_nothing():
  c = Node(Ops.ADD, None, (const(2.0, dtypes.float32), const(3.0, dtypes.float32)))
  res = callify(c)
  assert res.buffer_map == {} and res.call.src == (Node(Ops.SINK, dtypes.void, ()),)

def test_param_normalisation_gives_one_cache_key():
  def graph():
    a, b = buf((4, 4)), buf((4, 4))
    return Node(Ops.MUL, None, (Node(Ops.ADD, None, (a, b)).contiguous(), a.shrink(((0, 2), (0, 4))).pad(((1, 1), (0, 0)))))
  b1, b2 = callify(graph(), cache=False).call.src[0], callify(graph(), cache=False).call.src[0]
  assert b1 is b2

def test_pure_no_mutation():
  a = buf((4,))
  add = Node(Ops.ADD, None, (a, a))
  before = render(add)
  callify(add); callify(add)
  assert render(add) == before

# ---- report, schedules, limits, cost models -------------------------------------------------------------------------

def _view_graph():
  a = buf((8, 8))
  return [a.shrink(((2, 4), (0, 8))).contiguous(), Node(Ops.ADD, None, (a, a)).contiguous()]

def test_report_fields_and_json():
  res = callify(*_view_graph())
  r = res.report
  assert r.e_nodes > 0 and r.e_classes > 0 and r.iterations >= 1 and r.stop_reason == "saturated"
  assert r.cost < r.baseline_cost and r.views == 1 and r.stores == 1
  assert {"encode", "insert", "load", "materialize", "optimize", "extract", "decode"} <= set(r.seconds)
  d = json.loads(json.dumps(r.to_dict()))
  assert d["matches"]["contiguous_to_view"] >= 1 and "stop: saturated" in str(r)

def test_baseline_schedule_materializes_everything():
  res = callify(*_view_graph(), schedule="baseline")
  assert res.report.views == 0 and res.report.stores == 2 and res.report.cost == res.report.baseline_cost

def test_iteration_limit_still_gives_a_valid_call():
  g = _view_graph()
  res = callify(*g, limits=Limits(iterations=0))
  assert res.report.stop_reason == "iteration_limit" and res.report.stores == 2
  s = Storage(); s.set_data(g[0].src[0].src[0].src[0], np.arange(64)); run_call(res.call, s)

def test_node_and_time_limits_are_reported():
  assert callify(*_view_graph(), limits=Limits(nodes=1)).report.stop_reason == "node_limit"
  assert callify(*_view_graph(), limits=Limits(seconds=-1)).report.stop_reason == "time_limit"

def test_stop_reasons_are_one_enum_from_one_check():
  """Saturation, the ordered mode and explain's stepwise run all stop through Runner.check_limits, with StopReason."""
  from egraph.engine.runner import StopReason, Runner, SCHEDULE_PRESETS
  from egraph.tools.explain import explain
  from egraph.engine.encode import encode
  assert [r.value for r in StopReason] == ["saturated", "node_limit", "iteration_limit", "time_limit"]
  for sched in ("saturate", "reference"):
    for lim, want in ((Limits(nodes=1), StopReason.NODE_LIMIT), (Limits(seconds=-1), StopReason.TIME_LIMIT),
                      (Limits(iterations=0), StopReason.ITERATION_LIMIT), (Limits(), StopReason.SATURATED)):
      got = callify(*_view_graph(), schedule=sched, limits=lim, cache=False).report.stop_reason
      assert got is want and got == want.value, (sched, lim)
  assert explain(*_view_graph(), limits=Limits(nodes=1)).stop_reason is StopReason.NODE_LIMIT
  assert explain(*_view_graph()).stop_reason is StopReason.SATURATED
  r = Runner(SCHEDULE_PRESETS["saturate"])
  enc = encode(_view_graph())
  r.load(enc.rows, encoding=enc)
  assert r.check_limits(Limits(), time.perf_counter(), 0) is None
  assert r.check_limits(Limits(iterations=3), time.perf_counter(), 3) is StopReason.ITERATION_LIMIT
  assert r.check_limits(Limits(nodes=r.size() - 1), time.perf_counter(), 0) is StopReason.NODE_LIMIT

def test_the_time_budget_covers_extraction(monkeypatch):
  """Saturation may finish inside Limits.seconds while extraction runs past it: the report says time_limit, and the
  CALL is still the extracted, valid one."""
  import egraph.engine.driver as drv
  real = drv.extract_call
  def slow(sat, model, deadline=float("inf"), **kw):
    out = real(sat, model, deadline, **kw)
    time.sleep(0.4)
    return out
  monkeypatch.setattr(drv, "extract_call", slow)
  g = _view_graph()
  res = callify(*g, limits=Limits(seconds=0.3), cache=False)
  assert res.report.stop_reason == "time_limit" and res.report.views == 1 and res.report.stores == 1

def test_schedule_object_selects_rules():
  res = callify(*_view_graph(), schedule=Schedule("no-views", rules=("drop_detach",)))
  assert "contiguous_to_view" not in res.report.matches and res.report.views == 0

def test_cost_models_are_selectable():
  for name in ("bytes", "kernels", "buffers", "nodes"):
    assert callify(*_view_graph(), cost=name).report.cost_model == name
  class Stubborn(CostModel):
    def enode_cost(self, op, node, target, fresh): return None if op == "SLICE" else super().enode_cost(op, node, target, fresh)
  assert callify(*_view_graph(), cost=Stubborn("stubborn")).report.views == 0   # forbidding views forces stores

def test_bad_presets_and_inputs_raise_callsat_errors():
  with pytest.raises(CallsatError, match="cost model"): callify(*_view_graph(), cost="nope")
  with pytest.raises(CallsatError, match="schedule"): callify(*_view_graph(), schedule="nope")
  with pytest.raises(CallsatError, match="unknown rules"): callify(*_view_graph(), schedule=Schedule("x", rules=("nope",)))
  with pytest.raises(CallsatError, match="Tensors or Nodes"): callify(3)

def test_egglog_panics_become_engine_errors():
  from egraph.engine.runner import guarded
  def boom(): raise BaseException("rust panic")   # pyo3's PanicException derives from BaseException
  with pytest.raises(EngineError, match="while testing"): guarded("testing", boom)

def test_deep_chain_has_no_recursion_limit():
  a = buf((4,))
  x = a
  for i in range(100_000): x = Node(Ops.ADD if i % 2 else Ops.MUL, None, (x, a))
  res = callify(x.contiguous())
  assert res.report.stores == 1 and res.report.graph_nodes == 100_002

def test_chain_of_contiguous_callifies():
  a = buf((4,))
  x = a
  for i in range(2000):
    x = Node(Ops.ADD, None, (x, a))
    if i % 10 == 0: x = x.contiguous()
  res = callify(x)
  assert res.report.stores == 201 and res.report.buffers == 201

def test_cache_reuses_saturation_for_new_buffers_and_mints_fresh_outputs():
  def graph(s):
    a, b = buf((4, 4), s), buf((4, 4), s, data=np.full(16, 2.0))
    return Node(Ops.MUL, None, (Node(Ops.ADD, None, (a, b)).contiguous(), a.shrink(((0, 2), (0, 4))).pad(((1, 1), (0, 0)))))
  s1, s2 = Storage(), Storage()
  g1, g2 = graph(s1), graph(s2)
  r1, r2 = callify(g1), callify(g2)
  assert not r1.report.cache_hit and r2.report.cache_hit and "cache hit" in str(r2.report)
  assert r1.call.src[0] is r2.call.src[0]                                   # same body: the schedule-cache key
  assert set(r2.buffer_map) <= set(toposort([g2])) and g2 in r2.buffer_map
  fresh1 = {a.arg.uid for a in r1.call.src[1:] if a.op is Ops.BUFFER}
  fresh2 = {a.arg.uid for a in r2.call.src[1:] if a.op is Ops.BUFFER}
  assert not fresh1 & fresh2                                                  # new data never lands in the old buffers
  run_call(r1.call, s1); run_call(r2.call, s2)
  for g, r, s in ((g1, r1, s1), (g2, r2, s2)): np.testing.assert_allclose(evaluate([r.buffer_map[g]], s)[0], evaluate([g], s)[0])

def test_cache_entry_keeps_no_buffer_of_its_graph_alive():
  """A cached result holds ghosts, not the graph's inputs or its minted outputs: they die with the user's references,
  and a hit over new buffers still computes the right values."""
  import gc, weakref
  from egraph import Tensor
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  y = (x * 3 + 1).sum(1)
  refs = [weakref.ref(b) for b in toposort([y.node]) if b.op is Ops.BUFFER]
  assert refs
  np.testing.assert_allclose(y.numpy(), [12, 39])
  out = [weakref.ref(b) for b in toposort([y.node]) if b.op is Ops.BUFFER]
  del x, y
  gc.collect()
  assert all(r() is None for r in refs + out)
  z = Tensor(np.ones((2, 3), np.float32))
  np.testing.assert_allclose((z * 3 + 1).sum(1).numpy(), [12, 12])

def test_roots_memo_hit_is_the_keyed_hit_and_keeps_nothing_alive(monkeypatch):
  """The same root nodes again skip the toposort and the key (RootsMemo) and give what the keyed hit gives: this
  graph's nodes as buffer_map keys, its buffers bound, fresh outputs, right values; the memo holds no node alive; an
  entry the result cache dropped, or other settings, are not the memo's."""
  import gc, weakref
  import egraph.engine.driver as drv
  s = Storage()
  a = buf((4, 4), s)
  g = Node(Ops.ADD, None, (Node(Ops.MUL, None, (a, a)).contiguous(), a))
  first = callify(g)
  keyed = []
  real = drv.graph_key
  monkeypatch.setattr(drv, "graph_key", lambda *x: keyed.append(1) or real(*x))
  again = callify(g)
  assert again.report.cache_hit and keyed == []
  assert again.call.src[0] is first.call.src[0] and set(again.buffer_map) == set(first.buffer_map)
  b = a.base
  assert b in again.call.src[1:] and set(again.inputs) == {b}
  out1, out2 = ({x.arg.uid for x in r.call.src[1:] if x.op is Ops.BUFFER and x is not b} for r in (first, again))
  assert out2 and not out1 & out2                                            # fresh outputs each time
  run_call(again.call, s)
  np.testing.assert_allclose(evaluate([again.buffer_map[g]], s)[0], evaluate([g], s)[0])
  assert not callify(g, cost="nodes").report.cache_hit and keyed             # other settings: not the memo's entry
  drv._CACHE.clear()                                                         # the result cache dropped the entry
  keyed.clear()
  assert not callify(g).report.cache_hit and keyed == [1]                    # a miss, keyed and stored again
  ref = weakref.ref(b)
  del g, a, b, first, again
  gc.collect()
  assert ref() is None                                                       # nothing the memo holds keeps the graph

def test_cache_misses_on_other_structure_and_options():
  a = buf((4,))
  callify(Node(Ops.ADD, None, (a, a)))   # warms the cache with ADD
  assert not callify(Node(Ops.MUL, None, (a, a))).report.cache_hit
  assert not callify(Node(Ops.ADD, None, (a, a)), cost="nodes").report.cache_hit
  assert callify(Node(Ops.ADD, None, (a, a))).report.cache_hit
  b, c = buf((4,)), buf((4,))
  assert not callify(Node(Ops.ADD, None, (b, c))).report.cache_hit          # two buffers where there was one

def test_cache_and_encoding_tell_signed_zeros_and_flip_from_permute_apart():
  from egraph import Tensor
  a = Tensor([1., 2]).realize()
  np.testing.assert_equal((1 / (a * -0.0)).numpy(), [-np.inf, -np.inf])
  np.testing.assert_equal((1 / (a * 0.0)).numpy(), [np.inf, np.inf])
  m = Tensor(np.arange(4, dtype=np.float32).reshape(2, 2)).realize()
  np.testing.assert_equal((m.flip(0) + m.T).numpy(), np.flip(np.arange(4).reshape(2, 2), 0) + np.arange(4).reshape(2, 2).T)

@pytest.mark.parametrize("assigns", ["fresh", "realized"])
def test_assign_into_computed_value_drops_what_only_its_target_reads(assigns):
  """Rule 8 replaces AFTER(t, STORE(t, v)) by CONTIGUOUS(v) before realize points and assigns are collected (the
  reference and tinygrad 0.14 alike): a realize point and an assign that only the overwritten t reads are not stored
  (a lazy init the assign overwrites, with its RNG counter update); a host COPY v lands in the fresh buffer itself."""
  s = Storage()
  a, ctr = buf((3,), s), buf((3,), s)
  bump = ctr.after(ctr.store(Node(Ops.ADD, None, (ctr, ctr))))            # an assign only the dead init reads
  init = Node(Ops.MUL, None, (Node(Ops.MUL, None, (a, bump)).contiguous(), a))
  host = Node(Ops.COPY, dtypes.float32, (buf((3,), s, device="NPY", data=np.array([7., 8., 9.], np.float32)),), "CPU")
  asg = init.after(init.store(host))
  res = callify(asg, cache=False, assigns=assigns)
  assert set(res.buffer_map) == {asg, host} and res.buffer_map[asg] is res.buffer_map[host]
  assert res.report.stores == 1 and res.report.buffers == 1                 # the copy, straight into its buffer
  assert not any(n.op in (Ops.MUL, Ops.CONTIGUOUS) for n in toposort([res.call.src[0]]))
  before = s.copy()
  run_call(res.call, s)
  np.testing.assert_equal(evaluate([res.buffer_map[asg]], s)[0], [7, 8, 9])
  np.testing.assert_equal(s[ctr.arg.uid], before[ctr.arg.uid])   # the dead assign never ran

def test_assign_into_computed_value_whose_old_value_is_read_elsewhere():
  """The overwritten value is still computed for another reader, and that reader sees it, not the assign."""
  s = Storage()
  a = buf((3,), s)
  t = Node(Ops.MUL, None, (a, a)).contiguous()
  y = Node(Ops.ADD, None, (t, a))
  asg = t.after(t.store(Node(Ops.ADD, None, (a, a))))
  res = callify(y, asg, cache=False)
  run_call(res.call, s)
  np.testing.assert_equal(evaluate([res.buffer_map[y]], s)[0], [2, 6, 12])
  np.testing.assert_equal(evaluate([res.buffer_map[asg]], s)[0], [2, 4, 6])
