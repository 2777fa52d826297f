"""Every rule is sound: with only that rule enabled, every e-node of every e-class evaluates (numpy reference) to its
class's value. Witness graphs make sure each rule really fires; random graphs look for counterexamples."""
import math
import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck
from egraph.ir.ops import Node, Ops, ParamArg, CallInfo, new_buffer
from egraph.ir.dtype import dtypes
from egraph.ir.storage import Storage
from rules import RULES, rules_in
from rules.testing.soundness import check_egraph
from graphgen import graphs

def _buf(storage, shape, seed=0, device="CPU"):
  b = new_buffer(math.prod(shape), dtypes.float32, device)
  storage.set_data(b, np.random.default_rng(seed).standard_normal(b.arg.size).astype(np.float32))
  return b.reshape(shape)

def _precompiled(a):
  p = Node(Ops.PARAM, dtypes.float32, (), ParamArg(0, a.shape, "CPU"))
  f = Node(Ops.FUNCTION, dtypes.void, (Node(Ops.TUPLE, dtypes.void, (Node(Ops.MUL, None, (p, p)),)), a), CallInfo("sq", precompile=True))
  return Node(Ops.ADD, None, (Node(Ops.GETTUPLE, None, (f,), 0), a))

def witness(name: str):
  """A small graph on which rule `name` matches."""
  s = Storage()
  a, b = _buf(s, (4, 4)), _buf(s, (4, 4), 1)
  add = Node(Ops.ADD, None, (a, b))
  graphs_ = {
    "materialize_contiguous": [add.contiguous()],
    "materialize_assign": [add.after(add.store(Node(Ops.MUL, None, (a, b))))],
    "zero_size": [add.shrink(((1, 1), (0, 4))).contiguous()],
    "contiguous_of_storage": [Node(Ops.CONTIGUOUS, dtypes.float32, (a,))],
    "bitcast_to_view": [Node(Ops.ADD, None, (Node(Ops.BITCAST, dtypes.int32, (a.shrink(((1, 3), (0, 4))),)),) * 2)],
    "precompile_call": [_precompiled(a)],
    "copy_of_view": [Node(Ops.COPY, dtypes.float32, (a.shrink(((1, 3), (0, 4))),), "PYTHON")],
    "assign_copy_in_place": [b.after(b.store(Node(Ops.COPY, dtypes.float32, (_buf(s, (4, 4), 2, "NPY"),), "CPU")))],
    "contiguous_to_view": [a.shrink(((1, 3), (0, 4))).contiguous(), add.contiguous().shrink(((2, 3), (0, 4))).contiguous()],
    "contiguous_of_assign": [a.after(a.store(add)).contiguous()],
    "contiguous_of_assign_n": [a.after(a.store(add), b.store(add)).contiguous()],
    "contiguous_idempotent": [add.contiguous().contiguous()],
    "drop_detach": [Node(Ops.DETACH, dtypes.float32, (add,))],
    "drop_contiguous_backward": [Node(Ops.CONTIGUOUS_BACKWARD, dtypes.float32, (add,))],
    "storage_through_reshape": [Node(Ops.CONTIGUOUS, dtypes.float32, (a,)).reshape((16,)).contiguous().reshape((2, 8)).contiguous()],
    "store_candidate": [Node(Ops.MUL, None, (add, a)), Node(Ops.REDUCE, None, (add,), (Ops.ADD, (1,)))],   # shared, a reduce
  }
  return graphs_[name], s

@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_fires_and_is_sound(name):
  roots, storage = witness(name)
  rules = (name,) if RULES[name].phase == "optimize" else ()
  violations, matches = check_egraph(roots, storage, rules)
  assert matches.get(name, 0) > 0, f"witness for {name} did not fire it: {matches}"
  assert not violations, "\n".join(map(str, violations))

def test_copy_in_place_into_a_computed_value_is_sound():
  """assign_copy_in_place on an assign into a computed value (tinygrad merges the COPY into the AFTER whatever the
  target): the copy lands in the assign's fresh buffer; the overwritten target, a realize point with an assign under
  it, is dropped before encoding (rule 8)."""
  s = Storage()
  a, b = _buf(s, (4, 4)), _buf(s, (4, 4), 1)
  t = Node(Ops.MUL, None, (Node(Ops.ADD, None, (a, b.after(b.store(a)))).contiguous(), a))
  roots = [t.after(t.store(Node(Ops.COPY, dtypes.float32, (_buf(s, (4, 4), 2, "NPY"),), "CPU")))]
  violations, matches = check_egraph(roots, s, ("assign_copy_in_place",), structure=True)
  assert matches.get("assign_copy_in_place", 0) > 0 and not violations, "\n".join(map(str, violations))

def test_every_rule_is_documented():
  for r in RULES.values():
    assert r.doc and "\n" not in r.doc and r.phase in ("materialize", "optimize")

@pytest.mark.parametrize("name", [r.name for r in rules_in("optimize")])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(g=graphs(max_steps=8))
def test_rule_sound_on_random_graphs(name, g):
  violations, _ = check_egraph(g.roots, g.storage, (name,))
  assert not violations, "\n".join(map(str, violations))

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(g=graphs(max_steps=10))
def test_all_rules_together_sound(g):
  violations, _ = check_egraph(g.roots, g.storage, None)
  assert not violations, "\n".join(map(str, violations))

def test_checker_catches_an_unsound_rule(monkeypatch):
  """A deliberately wrong rule (CONTIGUOUS(x) = NEG-free x... here: DETACH(x) = x's negation) must be caught."""
  from rules.registry import Rule
  bad = Rule("bad_negate", "DETACH(x) = NEG(x) (wrong on purpose)", "optimize",
             '(= d (U "DETACH" a x))', '(union d (U "NEG" a x))')
  monkeypatch.setitem(RULES, bad.name, bad)
  roots, storage = witness("drop_detach")
  violations, matches = check_egraph(roots, storage, ("bad_negate",))
  assert matches.get("bad_negate", 0) > 0 and violations

def test_the_all_stored_check_reads_an_assign_into_a_computed_value_as_its_value():
  """The all-stored CALL check (run when store_candidate fires) takes its expected values from the oracle, which reads
  an assign into a computed value as a fresh buffer holding it (spec rule 8); evaluating the graph's keys as they are
  raised "STORE: the target goes through NEG" (found by test_all_rules_together_sound)."""
  a, b = new_buffer(16, dtypes.float32, "CPU"), new_buffer(16, dtypes.float32, "CPU")
  st = Storage()
  st.set_data(a, np.arange(16, dtype=np.float32)); st.set_data(b, np.full(16, 3, np.float32))
  x = Node(Ops.MUL, None, (a, b))
  y = Node(Ops.ADD, None, (x, x))
  n = Node(Ops.NEG, None, (a,))
  assign = n.after(n.store(Node(Ops.ADD, None, (y, b))))
  w = Node(Ops.WHERE, None, (Node(Ops.CMPLT, None, (a, b)), y, Node(Ops.MUL, None, (y, a))))
  violations, matches = check_egraph([assign, w], st, None)
  assert matches.get("store_candidate") and violations == []
