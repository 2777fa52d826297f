"""Graphs with no decision to make (egraph/engine/direct.py `no_decision`, `settled_on_graph`): no optimize rule can match, so
callify builds the all-stored CALL without the e-graph (`report.settled`), off the graph or off the encoding.
It must be node for node the CALL saturation and extraction
build for the same graph, under every cost model and both assign readings; graphs where a rule may match go through
the e-graph."""
import pytest
from hypothesis import given, settings, HealthCheck, strategies as st
from egraph.engine import driver
from egraph.engine.driver import callify
from egraph.ir.ops import Node, Ops, new_buffer, substitute, toposort
from egraph.ir.dtype import dtypes
from egraph.engine.direct import COVERED
from egraph.ir.errors import CallsatError
from egraph.ir.symbolic import Variable
from rules.registry import RULES
from graphgen import graphs, rule_graphs

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

def both(roots, **kw):
  """(shortcut on, shortcut off) results of callify on `roots`, or the error each raised."""
  out = []
  for on in (True, False):
    driver.SHORTCUT["on"] = on
    try: out.append(callify(*roots, cache=False, fusion="rules", **kw))
    except CallsatError as e: out.append(e)
    finally: driver.SHORTCUT["on"] = True
  return out

def assert_same_call(a, b) -> None:
  """Same body (hash-consed: the same node), same args up to the fresh buffers each minted, same buffer_map."""
  assert a.call.src[0] is b.call.src[0]
  fresh = {}
  for x, y in zip(a.call.src[1:], b.call.src[1:], strict=True):
    if x.op is Ops.BUFFER and x.arg.uid in a.report.fresh_uids:
      assert y.arg.uid in b.report.fresh_uids and (x.dtype, x.arg.size, x.arg.device) == (y.dtype, y.arg.size, y.arg.device)
      fresh[x] = y
    else: assert x is y
  for x, y in zip(toposort(list(a.buffer_map.values())), toposort(list(b.buffer_map.values())), strict=True):
    if x.op is Ops.BUFFER and x.arg.uid in a.report.fresh_uids: fresh.setdefault(x, y)
  assert list(a.buffer_map) == list(b.buffer_map)
  got = substitute(list(a.buffer_map.values()), fresh)
  assert all(g is w for g, w in zip(got, b.buffer_map.values(), strict=True))
  assert (a.report.stores, a.report.buffers, a.report.views) == (b.report.stores, b.report.buffers, b.report.views)

def check(roots, **kw) -> bool:
  """The shortcut's CALL is the e-graph's; True when the shortcut was taken."""
  a, b = both(roots, **kw)
  if isinstance(a, Exception) or isinstance(b, Exception):
    assert type(a) is type(b) and str(a) == str(b)
    return False
  assert not b.report.settled
  if a.report.settled: assert_same_call(a, b)
  elif a.report.realize_points and not a.report.fallback: assert a.report.iterations > 0   # through the e-graph
  return bool(a.report.settled)

def test_every_optimize_rule_has_a_condition():
  """A new optimize rule must get a condition in `no_decision` (or the shortcut would skip its rewrites)."""
  import rules.callify  # noqa: F401  (registers the rules)
  assert {r.name for r in RULES.values() if r.phase == "optimize"} == COVERED

@SETTINGS
@given(st.one_of(graphs(dtype=None), *[rule_graphs(n) for n in sorted(COVERED)]),
       st.sampled_from(["fresh", "realized"]), st.sampled_from(["bytes", "nodes", "kernels", "buffers"]))
def test_the_shortcut_is_the_e_graphs_call(g, assigns, cost): check(list(g.roots), assigns=assigns, cost=cost)

def buf(n=16, dt=dtypes.float32): return new_buffer(n, dt, "CPU")

def test_plain_compute_is_settled_and_markers_are_dropped():
  """An elementwise chain with a DETACH and a CONTIGUOUS_BACKWARD: no view, no alias, so no decision; the markers
  are gone from the CALL as extraction drops them (drop_detach, drop_contiguous_backward)."""
  a, b = buf(), buf()
  x = Node(Ops.ADD, None, (Node(Ops.DETACH, None, (a,)), b))
  y = Node(Ops.REDUCE, None, (Node(Ops.MUL, None, (Node(Ops.CONTIGUOUS_BACKWARD, None, (x,)), a)).contiguous(),), (Ops.ADD, (0,)))
  assert check([y, x]) and check([y, x], assigns="realized")
  res = callify(y, x, cache=False, fusion="rules")
  assert res.report.settled and res.report.iterations == 0 and res.report.e_nodes == 0
  ops = {n.op for n in toposort([res.call])}
  assert Ops.DETACH not in ops and Ops.CONTIGUOUS_BACKWARD not in ops
  assert res.report.stores == 3 and res.report.views == 0 and "settled" in str(res.report)

def test_settled_off_the_graph_or_off_the_encoding():
  """A graph `settled_on_graph` can read settles without encoding (`plan(drop=True)`); one it is unsure of (a CONTIGUOUS
  of a movement op) is encoded, and `no_decision` settles it when no rule can match there either."""
  a, b = buf(), buf()
  plain = Node(Ops.MUL, None, (Node(Ops.DETACH, None, (Node(Ops.ADD, None, (a, b)),)), a)).contiguous()
  moved = Node(Ops.ADD, None, (a, b)).reshape((4, 4)).permute((1, 0)).contiguous()
  for roots, graph in (([plain], True), ([moved], False)):
    assert check(roots)
    rep = callify(*roots, cache=False, fusion="rules").report
    assert rep.settled and ("read off the graph" in rep.settled) is graph and ("plan" in rep.seconds) is graph
    assert ("encode" in rep.seconds) is not graph and rep.baseline_cost >= rep.cost

def test_an_assign_of_computed_values_is_settled():
  t, a = buf(), buf()
  assert check([t.after(t.store(Node(Ops.ADD, None, (t, a))))])

def test_a_bound_dimension_is_settled():
  v = Variable("i", 1, 8).bind(3)
  a = buf(8)
  x = Node(Ops.ADD, None, (a.shrink(((0, v),)), a.shrink(((0, v),)))).contiguous()
  assert check([x])

@pytest.mark.parametrize("make, rule", [
  (lambda a: a.reshape((4, 4)).shrink(((1, 3), (0, 4))).contiguous(), "contiguous_to_view"),
  (lambda a: Node(Ops.BITCAST, dtypes.int32, (a,)).contiguous(), "bitcast_to_view"),
  (lambda a: Node(Ops.ADD, None, (a, a)).contiguous().contiguous(), "contiguous_idempotent"),
  (lambda a: a.after(a.store(Node(Ops.ADD, None, (a, a)))).contiguous(), "contiguous_of_assign"),
  (lambda a: Node(Ops.ADD, None, (a, a)).contiguous().reshape((4, 4)).contiguous(), "storage_through_reshape"),
])
def test_a_graph_a_rule_may_rewrite_goes_through_the_e_graph(make, rule):
  """Each of these holds a node an optimize rule matches: the e-graph decides (and the rule fired)."""
  a = buf()
  r = make(a)
  assert not check([r])
  res = callify(r, cache=False, fusion="rules")
  assert not res.report.settled and res.report.iterations > 0
  assert res.report.matches.get(rule, 0) > 0 or rule == "storage_through_reshape"

def test_realize_points_equal_once_markers_drop_share_one_buffer():
  """CONTIGUOUS(x) beside CONTIGUOUS_BACKWARD(x), and two CONTIGUOUS of one value that differ only by a DETACH: the
  e-graph merges them once the markers drop (one store); neither shortcut may store them twice (hypothesis found the
  first: off the encoding it was stored twice)."""
  a, b = buf(16, dtypes.int32), buf(16, dtypes.int32)
  x = Node(Ops.ADD, None, (a, a))
  side = [x.contiguous(), Node(Ops.CONTIGUOUS_BACKWARD, None, (x,))]
  inner = [Node(Ops.ADD, None, (Node(Ops.DETACH, None, (a,)), b)).contiguous(), Node(Ops.ADD, None, (a, b)).contiguous()]
  for roots in (side, inner):
    for assigns in ("fresh", "realized"):
      check(roots, assigns=assigns)
    res = callify(*roots, cache=False, fusion="rules")
    assert not res.report.settled and res.report.stores == 1
    assert res.buffer_map[roots[0]] is res.buffer_map[roots[1]]

def test_a_deep_shared_graph_with_a_marker_is_settled():
  """A chain of 300 values each read twice (2^300 paths) under a DETACH: the merge check numbers classes, so it visits
  each node once (keys nested per path hashed whole subgraphs again: a 301-node tinygrad MLP step spent 17 ms there),
  and the graph is settled as the e-graph's CALL."""
  a = buf(16, dtypes.float32)
  x = Node(Ops.DETACH, None, (a,))
  for i in range(300): x = Node(Ops.ADD if i % 2 else Ops.MUL, None, (x, x))
  roots = [x.contiguous()]
  res = callify(*roots, cache=False, fusion="rules")
  assert res.report.settled and res.report.stores == 1
  check(roots)
