"""Limits bound callify (issue 15 item 6): the node limit is checked before the e-graph is built and between steps and
reports the size reached; past the time budget callify builds the all-materialized CALL straight from the encoding
(`materialized_call`), which must equal the e-graph's unoptimized form and realize the same values (like the baseline
schedule it copies where the optimized CALL aliases, so the aliasing invariant 12 is not asked of it). No timings are
asserted: stop reasons, paths taken and values only."""
import math
import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck
from egraph import Tensor, function, callify, Limits, Variable
from egraph.ir.ops import Node, Ops, CallInfo, new_buffer, toposort, bindings
from egraph.ir.dtype import dtypes
from egraph.ir.errors import EngineError
from egraph.engine.encode import encode
from egraph.engine.cost import COST_PRESETS
from egraph.engine.runner import StopReason, OutOfBudget, LIMIT_PRESETS
from egraph.engine.extract import EGraphView
import egraph.engine.driver as drv
import egraph.engine.build as bld
import egraph.engine.extract as ext
from egraph.engine.driver import materialized_call, saturate, extract_call, storage_view, parameterize, loaded_size, Budget
from rules.testing.soundness import call_violations
from egraph.ir.storage import Storage
from graphgen import Graph, graphs, rule_graphs, reference_values, executed_values, chain
from rules.testing.strategies import PLANTED

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NOW = Limits(seconds=0)   # no time at all: always the direct path

def decoded_call(enc, schedule):
  """The CALL extraction picks from the e-graph, the old way round: decode every term, then `parameterize`."""
  ex = extract_call(saturate(enc, schedule), COST_PRESETS["bytes"])
  realized = [ex.terms[c] for c in ex.root_classes]
  assigns = tuple(n for n in toposort(realized, enter_calls=False) if n.op is Ops.AFTER)
  body, args = parameterize(Node(Ops.SINK, dtypes.void, assigns))
  return Node(Ops.CALL, dtypes.void, (body, *args), CallInfo()), {k: storage_view(t) for k, t in zip(enc.keys, realized)}

@SETTINGS
@given(graphs(dtype=None))
def test_materialized_call_is_the_unoptimized_e_graph_form(g):
  """Node for node the CALL and buffer_map that baseline extraction gives on the same encoding (same fresh buffers)."""
  enc = encode(g.roots)
  if not enc.keys: return
  m = materialized_call(enc)
  try: call, bmap = decoded_call(enc, "baseline")
  except EngineError: return   # a form only an optimize rule gives (an assign's several writes): nothing to compare
  assert m.call is call and m.buffer_map == bmap

@SETTINGS
@given(graphs(dtype=None))
def test_materialized_call_is_build_call_over_materialized_ids(g):
  """The fallback's specialized build (flat lists, the PARAMs numbered before the body is built) is node for node the
  generic `build_call` over the same ids, with the same counts, also where extraction would raise."""
  enc = encode(g.roots)
  if not enc.keys: return
  m, ids = materialized_call(enc), bld.MaterializedIds(enc)
  b = drv.build_call(ids, ids.roots, enc.keys, enc.fresh_buffers, drv.has_bound_dims(enc))
  assert m.call is b.call and m.buffer_map == b.buffer_map and (m.stores, m.buffers, m.views) == (b.stores, b.buffers, b.views)

def test_dtypes_are_interned():
  """Equal dtypes are one object however made (hash-cons keys hash them by identity)."""
  import copy, pickle
  from egraph.ir.dtype import DType
  assert DType("float32", 4, 'f', 14) is dtypes.float32 and pickle.loads(pickle.dumps(dtypes.int8)) is dtypes.int8
  assert copy.deepcopy(dtypes.bool) is dtypes.bool and dtypes.float32 == dtypes.float and dtypes.float32 != dtypes.int32

@pytest.mark.parametrize("rule", PLANTED)
def test_materialized_call_matches_with_each_rule_planted(rule):
  @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
  @given(rule_graphs(rule))
  def check(g): test_materialized_call_is_the_unoptimized_e_graph_form.hypothesis.inner_test(g)
  check()

def test_contiguous_of_what_becomes_storage_keeps_that_storage():
  """CONTIGUOUS of a CONTIGUOUS of storage, or of a zero-size value's empty buffer, is that storage (the materialize
  phase merges them, contiguous_of_storage), never a copy."""
  b = new_buffer(16, dtypes.float32, "CPU")
  inner = Node(Ops.CONTIGUOUS, dtypes.float32, (b.reshape((4, 4)),))
  empty = b.reshape((4, 4)).shrink(((0, 0), (0, 4))).contiguous()
  for roots in ([inner.contiguous()], [inner.contiguous().contiguous(), Node(Ops.ADD, None, (inner.contiguous(), inner))],
                [empty.contiguous().contiguous(), empty]):
    enc = encode(roots)
    m = materialized_call(enc)
    assert (m.call, m.buffer_map) == decoded_call(enc, "baseline")
    assert len(set(m.buffer_map.values()) - {b.reshape((4, 4))}) <= 1 and m.stores == (len(roots) == 2 and roots[1].op is Ops.ADD)

@SETTINGS
@given(graphs(dtype=None))
def test_build_call_is_parameterize_of_the_decoded_terms(g):
  """callify builds its CALL from the chosen e-classes in one rebuild: node for node the decode -> parameterize one."""
  enc = encode(g.roots)
  if not enc.keys: return
  sat = saturate(enc)
  ex = extract_call(sat, COST_PRESETS["bytes"])
  b = drv.build_call(ext.ChosenIds(sat.graph, ex.choice), ex.root_classes, enc.keys, enc.fresh_buffers)
  call, bmap = decoded_call(enc, "saturate")
  assert b.call is call and b.buffer_map == bmap

@SETTINGS
@given(graphs(dtype=None))
def test_the_fallback_is_sound(g): fallback_is_sound(g)

@pytest.mark.parametrize("rule", PLANTED)
def test_the_fallback_is_sound_with_each_rule_planted(rule):
  @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
  @given(rule_graphs(rule))
  def check(g): fallback_is_sound(g)
  check()

def test_an_assign_with_several_writes_extracts():
  """AFTER(t, STORE, STORE) lists its target first: extraction keeps it pinned to t (it used to find no form)."""
  st = Storage()
  t, x = new_buffer(16, dtypes.float32, "CPU"), new_buffer(16, dtypes.float32, "CPU")
  for b in (t, x): st.set_data(b, np.arange(16, dtype=np.float32))
  n = Node(Ops.NEG, None, (x,))
  g = Graph([t.after(t.store(n), t.store(Node(Ops.MUL, None, (n, n)))).contiguous()], st, [t, x])
  assert callify(*g.roots, cache=False).report.fallback is None
  fallback_is_sound(g)

def test_an_assign_into_computed_inside_another_assigns_value():
  """The oracle rewrites an assign into a computed value that sits inside another one's value (it used to leave the
  inner one, and then refused its STORE into NEG: a rare hypothesis failure); callify and its fallback agree."""
  st = Storage()
  x = new_buffer(4, dtypes.float32, "CPU"); st.set_data(x, np.arange(4, dtype=np.float32))
  t1 = Node(Ops.NEG, None, (x,)); a1 = t1.after(t1.store(Node(Ops.ADD, None, (x, x))))
  t2 = Node(Ops.EXP2, None, (x,)); a2 = t2.after(t2.store(Node(Ops.MUL, None, (a1, x))))
  g = Graph([a2.contiguous()], st, [x])
  np.testing.assert_array_equal(reference_values(g, list(g.roots))[0], [0, 2, 8, 18])
  fallback_is_sound(g)

def fallback_is_sound(g):
  """The fallback CALL keeps the structural invariants and realizes the values the saturated CALL and the reference do."""
  fb, full = callify(*g.roots, limits=NOW, cache=False), callify(*g.roots, cache=False)
  if not fb.buffer_map: return
  assert fb.report.stop_reason is StopReason.TIME_LIMIT and fb.report.fallback is not None
  assert call_violations(list(g.roots), fb.call, fb.buffer_map) == []
  assert list(fb.buffer_map) == list(full.buffer_map)
  keys = list(fb.buffer_map)
  for k, want, got, sat in zip(keys, reference_values(g, keys), executed_values(g, fb.call, fb.buffer_map, keys),
                               executed_values(g, full.call, full.buffer_map, keys)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{k}")
    np.testing.assert_allclose(got, sat, rtol=1e-5, atol=1e-6, err_msg=f"{k}")

# ---- the fallback on what the generators do not draw: sharded, DISK, precompiled calls, symbolic shapes, assigns ----

@function(precompile=True)
def twice(x): return x * 2

def _sharded(_):
  x = np.arange(8, dtype=np.float32).reshape(4, 2)
  a = Tensor(x, device="PYTHON").shard(("PYTHON", "PYTHON:1"), axis=0)
  rep = Tensor([10., 20], device="PYTHON").shard(("PYTHON", "PYTHON:1"), axis=None)
  return [((a * 2 + rep).sum(axis=1), (x * 2 + [10, 20]).sum(axis=1)),
          (a.reshape(2, 4)[:1].contiguous(), x.reshape(2, 4)[:1])]

def _disk(tmp):
  np.arange(6, dtype=np.float32).tofile(tmp / "in.bin")
  e = Tensor.empty(2, 3, device=f"DISK:{tmp / 'in.bin'}")
  out = (e.to("PYTHON") * 3).to(f"DISK:{tmp / 'out.bin'}")
  return [(e[1:, ::2].flip(1).to("CPU"), [[5, 3]]), (out.to("CPU"), np.arange(6).reshape(2, 3) * 3)]

def _precompiled(_):
  a = Tensor([1., 2, 3]).realize()
  return [(twice(twice(a).contiguous()) + 1, [5, 9, 13])]

def _symbolic(_):
  a = Tensor(np.arange(8, dtype=np.float32)).realize()
  return [(a[:Variable("v", 1, 8).bind(3)] * 2, [0, 2, 4])]

def _assigns(_):
  a = Tensor(np.zeros(6, np.float32)).realize()
  v = a[::2]; v.assign(Tensor([1., 2, 3]))
  b = Tensor([1., 2, 3, 4]).realize()
  c = (b + 1).contiguous()
  return [(a, [1, 0, 2, 0, 3, 0]), (c.assign(c * b), [2, 6, 12, 20]), (b[1:3].contiguous(), [2, 3])]

@pytest.mark.parametrize("program", [_sharded, _disk, _precompiled, _symbolic, _assigns])
def test_the_fallback_realizes_what_the_e_graph_does(program, tmp_path, monkeypatch):
  """Every realize of these programs takes the direct path (the default limits leave no time) and gets the values; its
  CALL is node for node `build_call` over the same ids, whichever way it orders the SINK (`in_encoding_order`)."""
  taken = []
  real = drv.materialized_call
  def checked(enc):
    m, ids = real(enc), bld.MaterializedIds(enc)
    b = drv.build_call(ids, ids.roots, enc.keys, enc.fresh_buffers, drv.has_bound_dims(enc))
    assert m.call is b.call and m.buffer_map == b.buffer_map
    taken.append(bld.in_encoding_order(enc))
    return m
  monkeypatch.setattr(drv, "materialized_call", checked)
  monkeypatch.setitem(LIMIT_PRESETS, "default", NOW)
  for t, want in program(tmp_path):
    res = callify(t)
    assert res.report.fallback is not None and call_violations([t.node], bindings(res.call)[0], res.buffer_map) == []
    np.testing.assert_allclose(t.numpy(), want)
  assert taken

def test_a_run_stopped_before_a_value_has_a_form_falls_back(monkeypatch):
  """A precompiled call reading a realized value needs an optimize rule (contiguous_idempotent) for its input's form:
  stopped before it, extraction has nothing to pick, and the materialized CALL stands in."""
  monkeypatch.setitem(LIMIT_PRESETS, "default", Limits(iterations=0))
  a = Tensor([1., 2, 3]).realize()
  y = twice(twice(a).contiguous())
  r = callify(y).report
  assert r.stop_reason is StopReason.ITERATION_LIMIT and r.fallback.startswith("iteration_limit: stopped before")
  np.testing.assert_allclose(y.numpy(), [4, 8, 12])

# ---- stop reasons, paths and the report ------------------------------------------------------------------------------

@pytest.mark.parametrize("seconds", [0, 1e-6, -1])
def test_no_time_gives_time_limit_and_the_materialized_call(seconds):
  x = chain(600)
  res, full = callify(x, limits=Limits(seconds=seconds), cache=False), callify(x, cache=False)
  r = res.report
  assert r.stop_reason is StopReason.TIME_LIMIT and r.fallback.startswith("time limit: predicted")
  assert r.e_nodes == 0 and r.stop_nodes == 0 and r.iterations == 0 and "direct" in r.seconds
  assert r.cost == r.baseline_cost and r.stores == r.realize_points and r.views == 0
  assert res.call.src[0] is materialized_call(encode([x])).call.src[0]   # bodies name buffers by PARAM: encodings agree
  assert full.report.fallback is None and full.report.views > 0 and full.report.cost < r.cost
  assert call_violations([x], res.call, res.buffer_map) == []

def test_node_limit_below_the_loaded_graph_builds_no_e_graph():
  x = chain(200)
  size = loaded_size(encode([x]))
  res = callify(x, limits=Limits(nodes=size - 1), cache=False)
  r = res.report
  assert r.stop_reason is StopReason.NODE_LIMIT and f"~{size} e-nodes > {size - 1}" in r.fallback
  assert r.stop_nodes == 0 and r.e_nodes == 0 and "at 0 e-nodes" not in str(r)
  assert callify(x, limits=Limits(nodes=size), cache=False).report.fallback is None   # the estimate is the loaded size

def test_node_limit_between_steps_reports_the_size_reached():
  """Host copies of contiguous slices: the first optimize step adds a COPY of each SLICE view. A limit at the loaded
  size lets that one step run, then stops: the size reached is reported, one step past the limit."""
  hb = new_buffer(64, dtypes.float32, "NPY")
  roots = [Node(Ops.COPY, dtypes.float32, (hb.reshape((8, 8)).shrink(((i, i + 1), (0, 8))),), "CPU") for i in range(8)]
  size = loaded_size(encode(roots))
  free = callify(*roots, cache=False).report
  r = callify(*roots, limits=Limits(nodes=size), cache=False).report
  assert free.stop_reason is StopReason.SATURATED and free.iterations == 2 and free.stop_nodes == size + 8
  assert r.stop_reason is StopReason.NODE_LIMIT and r.fallback is None and r.iterations == 1
  assert r.stop_nodes == size + 8 == r.e_nodes and f"stop: node_limit at {size + 8} e-nodes" in str(r)

def test_the_runner_records_the_size_at_each_check():
  from egraph.engine.runner import Runner, SCHEDULE_PRESETS
  enc = encode([chain(30)])
  run = Runner(SCHEDULE_PRESETS["saturate"])
  run.load(enc.rows, encoding=enc); run.materialize()
  assert run.check_limits(Limits(), run.clock, 0) is None and run.stats.size == run.size() == loaded_size(enc)

@pytest.mark.parametrize("where", ["after inserting the rows", "after the load phase", "after the materialize phase",
                                   "after 0 optimize step(s)", "reading the e-graph", "costing e-nodes",
                                   "extracting (Knuth)", "ordering the CALL body", "building the CALL body"])
def test_out_of_budget_at_any_step_falls_back(where, monkeypatch):
  """Each bounded step checks the budget: running out there gives the materialized CALL, saying where it stopped."""
  import egraph.engine.runner as run
  real = run.checkpoint
  def at(abort_at, w):
    if w == where and abort_at < float("inf"): raise OutOfBudget(w)   # the fallback itself has no deadline
    real(abort_at, w)
  for mod in (run, ext, bld): monkeypatch.setattr(mod, "checkpoint", at)
  monkeypatch.setattr(ext, "TICK", 1); monkeypatch.setattr(bld, "TICK", 1)
  x = chain(60)
  res = callify(x, limits=Limits(seconds=60), cache=False)
  r = res.report
  assert r.stop_reason is StopReason.TIME_LIMIT and r.fallback == f"time limit: out of time {where}"
  assert res.call.src[0] is materialized_call(encode([x])).call.src[0]
  assert ("optimize" in r.seconds) is ("step" not in where and not where.startswith("after"))

def test_the_deadline_is_real_past_abort_at(monkeypatch):
  """Without stubs: a budget whose abort time has passed (the fallback predicted to need it all) falls back."""
  monkeypatch.setattr(Budget, "FALLBACK", 1e12)
  res = callify(chain(60), limits=Limits(seconds=5), cache=False)
  assert res.report.fallback == "time limit: out of time after inserting the rows" and "insert" in res.report.seconds

def test_fallback_results_are_not_cached():
  x = chain(100)
  a = callify(x, limits=NOW)
  b = callify(x, limits=NOW)
  c = callify(x)
  assert a.report.fallback and b.report.fallback and not b.report.cache_hit
  assert c.report.fallback is None and not c.report.cache_hit and callify(x).report.cache_hit

def test_report_says_which_path_ran():
  r = callify(chain(100), limits=NOW, cache=False).report
  d = r.to_dict()
  assert d["fallback"] == r.fallback and d["stop_nodes"] == 0 and d["stop_reason"] == "time_limit"
  assert "fallback  all-materialized CALL built without the e-graph (time limit: predicted" in str(r)
  full = callify(chain(100), cache=False).report
  assert full.to_dict()["fallback"] is None and "fallback" not in str(full) and full.stop_nodes == full.e_nodes

def test_the_budget_predicts_from_the_encoding_rate():
  enc = encode([chain(300)])
  b = Budget.plan(enc, 2.0, 0.01)
  assert b.rows == sum(len(r) for r in enc.rows.values()) and math.isclose(b.per_row * b.rows, 0.01)
  assert b.abort_at < b.start + 1.5 * 2.0 + 0.3 and b.too_slow(loaded_size(enc)) is None
  assert "left" in Budget.plan(enc, 0.0, 0.01).too_slow(loaded_size(enc))

def test_extraction_without_a_budget_is_unbounded():
  """explain, export and the checker extract with no abort time: nothing checks the clock against them."""
  sat = saturate(encode([chain(40)]))
  assert sat.runner.abort_at == float("inf") and isinstance(sat.graph, EGraphView)
  assert extract_call(sat, COST_PRESETS["bytes"]).terms
