"""The all-materialized CALL from the graph without encoding (egraph/engine/direct.py): node for node what the Encoding's
fallback builds (`materialized_call(encode(roots))`), its keys, counts and baseline cost, over its own fresh buffers;
callify takes it when the toposort's time already says the e-graph cannot fit."""
import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck
from egraph import Tensor, callify, Limits
from egraph.ir.ops import Node, Ops, toposort, substitute
from egraph.ir.dtype import dtypes
from egraph.engine.encode import encode
from egraph.engine.extract import baseline_cost
from egraph.engine.cost import COST_PRESETS, CostModel
from egraph.ir.errors import CallsatError
from egraph.engine.runner import StopReason
from egraph.engine.direct import plan
from egraph.engine.build import materialized_call, build_plan
from egraph.engine.driver import Budget
from rules.testing.soundness import call_violations
from rules.testing.strategies import PLANTED
from graphgen import graphs, rule_graphs, chain

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

class Doubled(CostModel):
  """A cost model that prices every e-node itself (no `nodes` shortcut)."""
  def enode_cost(self, op, node, target, fresh):
    c = super().enode_cost(op, node, target, fresh)
    return None if c is None else 2 * c + (op == "AFTER")

def same_as_encoded(roots: list[Node], assigns: str = "fresh") -> bool:
  """Plan and encode agree (False: the plan left this graph to encode)."""
  topo = toposort(roots, enter_calls=False)
  p = plan(roots, topo, COST_PRESETS["bytes"], assigns)
  try: enc = encode(roots, assigns)
  except CallsatError:
    assert p is None   # what encode refuses, the plan leaves to it (so the error is encode's)
    return False
  if p is None: return False
  assert p.keys == enc.keys
  for model in (COST_PRESETS["bytes"], COST_PRESETS["kernels"], Doubled("doubled")):
    assert plan(roots, topo, model, assigns).cost == baseline_cost(enc, model)
  if not enc.keys: return True
  m, b = materialized_call(enc), build_plan(p)
  assert b.call.src[0] is m.call.src[0]   # the body names buffers by PARAM slot: the same node
  assert (b.stores, b.buffers, b.views) == (m.stores, m.buffers, m.views)
  fresh = {}   # the plan's fresh buffers -> the encoding's, by arg position
  for x, y in zip(b.call.src[1:], m.call.src[1:], strict=True):
    if x.op is Ops.BUFFER and x.arg.uid in p.fresh_uids:
      assert y.arg.uid in enc.fresh_buffers and (x.dtype, x.arg.size, x.arg.device) == (y.dtype, y.arg.size, y.arg.device)
      fresh[x] = y
    else: assert x is y
  assert list(b.buffer_map) == list(m.buffer_map)
  got = substitute(list(b.buffer_map.values()), fresh)
  assert all(g is w for g, w in zip(got, m.buffer_map.values(), strict=True))
  return True

@SETTINGS
@given(graphs(dtype=None))
def test_the_plan_is_the_encodings_fallback(g): same_as_encoded(list(g.roots))

@pytest.mark.parametrize("rule", PLANTED)
def test_the_plan_is_the_encodings_fallback_with_each_rule_planted(rule):
  @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
  @given(rule_graphs(rule))
  def check(g):
    same_as_encoded(list(g.roots))
    same_as_encoded(list(g.roots), "realized")
  check()

def test_the_plan_covers_the_benchmark_shapes():
  """Chains of contiguous and sliced values, an assign into a buffer, a host copy, a root that is a view: planned;
  a CONTIGUOUS of a CONTIGUOUS (storage once materialized, maybe) is left to encode."""
  a, b = Tensor(np.arange(16, dtype=np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
  host = Tensor(np.arange(16, dtype=np.float32), device="NPY")
  a.assign(b * 2)
  assert a.node.op is Ops.AFTER and a.node.src[0].op is Ops.BUFFER
  for roots in ([chain(300)], [a.node, (host.to("CPU") + 1).reshape(4, 4).node, (b + 1).contiguous().node]):
    assert same_as_encoded(roots)
  inner = (b + 1).contiguous().node
  assert not same_as_encoded([inner.contiguous()])

@pytest.mark.parametrize("why", ["zero-size", "sharded", "bound"])
def test_graphs_the_plan_leaves_to_encode(why):
  """What only the encoding's path handles: the plan says None, and callify still falls back (through encode)."""
  if why == "zero-size": x = Tensor.zeros(3, 0).contiguous() + 0
  elif why == "sharded": x = Tensor(np.ones((4, 2), np.float32), device="PYTHON").shard(("PYTHON", "PYTHON:1"), axis=0) * 2
  else:
    from egraph import Variable
    v = Variable("n", 1, 8).bind(3)
    x = Tensor.ones(8).shrink(((0, v),)) * 2
  roots = [x.node]
  assert plan(roots, toposort(roots, enter_calls=False), COST_PRESETS["bytes"]) is None
  r = callify(x, limits=Limits(seconds=0), cache=False).report
  assert r.fallback.startswith("time limit: predicted") and "encode" in r.seconds and "not encoded" not in r.fallback

def test_callify_skips_encoding_when_the_toposort_says_no_time():
  x = chain(400)
  res = callify(x, limits=Limits(seconds=0), cache=False)
  r = res.report
  assert r.stop_reason is StopReason.TIME_LIMIT and r.fallback.startswith("time limit: predicted")
  assert r.fallback.endswith("not encoded") and "encode" not in r.seconds and {"toposort", "plan", "direct"} <= set(r.seconds)
  enc = encode([x])
  assert r.e_nodes == r.stop_nodes == r.iterations == 0 and r.cost == r.baseline_cost == baseline_cost(enc, COST_PRESETS["bytes"])
  assert res.call.src[0] is materialized_call(enc).call.src[0] and r.stores == r.realize_points == len(enc.keys)
  assert call_violations([x], res.call, res.buffer_map) == []
  assert "not encoded" in str(r)

def test_a_node_limit_below_the_graph_skips_encoding():
  x = chain(200)
  n = len(toposort([x], enter_calls=False))
  r = callify(x, limits=Limits(nodes=n - 1), cache=False).report
  assert r.stop_reason is StopReason.NODE_LIMIT and r.fallback.startswith("node limit: loading makes at least")
  assert "encode" not in r.seconds and r.stop_nodes == 0

def test_the_prediction_needs_a_slow_toposort():
  """Before encoding, the e-graph is ruled out only when even TOPO x the toposort's time cannot fit."""
  lim = Limits(seconds=1.0)
  assert Budget.no_e_graph(lim, 1000, 0.001) is None
  assert Budget.no_e_graph(lim, 1000, 1.0).startswith("time limit: predicted")
  assert Budget.no_e_graph(Limits(nodes=10), 11, 0.0).startswith("node limit")
  x = chain(50)
  assert callify(x, limits=Limits(seconds=60), cache=False).report.fallback is None

def test_the_cache_key_is_made_only_where_it_can_hit_or_is_stored(monkeypatch):
  """The key costs a third of encoding: a fallback needs none, a graph of no cached graph's size only to be stored."""
  import egraph.engine.driver as drv
  made = []
  real = drv.graph_key
  monkeypatch.setattr(drv, "graph_key", lambda *a: made.append(1) or real(*a))
  x = chain(137)
  n = len(toposort([x], enter_calls=False))
  if n in drv._SIZES: pytest.skip("a graph of this size is cached already")
  assert callify(x, limits=Limits(seconds=0)).report.fallback and made == []
  assert callify(x).report.fallback is None and made == [1]   # stored under its key
  assert callify(x).report.cache_hit and made == [1]   # the same roots again: the roots' memo, no key
  assert callify(chain(137)).report.cache_hit and made == [1, 1]   # an equal graph over other buffers: keyed

@SETTINGS
@given(graphs(dtype=None))
def test_toposorts_flat_walk_is_the_general_walk(g):
  """toposort's common case (no leaves, stop or deps_first) walks flat; the general walk, forced by a leaf op no graph
  has, gives the same order, with and without entering CALL bodies."""
  roots = list(g.roots) + [Node(Ops.SINK, dtypes.void, tuple(g.roots))]
  for enter in (True, False):
    a, b = toposort(roots, enter), toposort(roots, enter, leaves=frozenset({Ops.OPAQUE}))
    assert len(a) == len(b) and all(x is y for x, y in zip(a, b))
