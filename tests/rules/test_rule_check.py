"""rules.check on every registered rule (CALLSAT_CHECK_EXAMPLES graphs each, 200 by default), and deliberately unsound
rules that it must catch: by value, by aliasing (only independent storage contents reveal it) and by the canary."""
import numpy as np
import pytest
from egraph.ir.ops import Node, Ops, new_buffer
from egraph.ir.dtype import dtypes
from egraph.ir.storage import Storage
from rules import RULES
from rules.registry import Rule
from rules.testing.checker import check, examples_from_env, planter_for, CheckResult
from rules.testing.soundness import check_egraph

N = examples_from_env(200)

UNTESTED = {"precompile_call"}   # no generator builds a precompiled FUNCTION yet: the checker says so instead of "ok"

@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_is_sound_on_its_left_sides(name):
  res = check(name, examples=N)
  if name in UNTESTED: assert res.sound and res.untested and res.status == "UNTESTED" and not res.ok, str(res); return
  assert isinstance(res, CheckResult) and res.ok, str(res)
  assert res.examples == N
  if planter_for(RULES[name]):   # the generated graphs really contain the left side
    assert res.fire_rate >= 0.5, f"{name} fired on only {res.fired}/{res.examples} generated graphs"

def test_value_unsound_rule_is_caught_and_shrunk():
  bad = Rule("bad_negate", "DETACH(x) = NEG(x) (wrong on purpose)", "optimize", '(= d (U "DETACH" a x))', '(union d (U "NEG" a x))')
  res = check(bad, examples=100)
  assert not res.ok and "bad_negate" in res.problem
  assert "DETACH" in res.counterexample and "expected" in res.problem
  # shrunk: a small graph (a buffer, the value under DETACH, the DETACH)
  assert len(res.counterexample.splitlines()) <= 4, res.counterexample
  assert "bad_negate" not in RULES   # the candidate was only registered during the check

def test_unsound_rule_in_a_ruleset_report():
  bad = Rule("bad_drop_neg", "NEG(x) = x (wrong on purpose)", "optimize", '(= d (U "NEG" a x))', '(union d x)')
  rep = check(["drop_detach", bad], examples=60)
  assert rep["drop_detach"].ok and not rep["bad_drop_neg"].ok and not rep.ok
  assert "UNSOUND" in str(rep)

def _twin_buffers():
  s = Storage()
  data = np.random.default_rng(3).standard_normal(16).astype(np.float32)
  a, b = new_buffer(16, dtypes.float32, "CPU"), new_buffer(16, dtypes.float32, "CPU")
  s.set_data(a, data); s.set_data(b, data)      # equal contents: values alone cannot tell a from b
  return s, a.reshape((4, 4)), b.reshape((4, 4))

def test_aliasing_needs_independent_storage(monkeypatch):
  """SUB(x, y) = SUB(x, x) agrees by value when x and y hold equal data; only re-randomized storage shows it reads
  the wrong buffer."""
  bad = Rule("bad_alias", "SUB(x, y) = SUB(x, x) (wrong on purpose)", "optimize", '(= d (B "SUB" a x y))', '(union d (B "SUB" a x x))')
  monkeypatch.setitem(RULES, bad.name, bad)
  s, a, b = _twin_buffers()
  roots = [Node(Ops.SUB, None, (a, b)).contiguous()]
  v1, m1 = check_egraph(roots, s, ("bad_alias",), storages=1)
  assert m1.get("bad_alias") and not v1
  v2, _ = check_egraph(roots, s, ("bad_alias",), storages=2)
  assert v2

def test_canary_catches_a_shape_changing_merge():
  bad = Rule("bad_reshape_merge", "RESHAPE(x) = x (wrong on purpose)", "optimize", '(= r (U "RESHAPE" a x))', '(union r x)')
  res = check(bad, examples=50)
  assert not res.ok
  assert "bad merge" in res.problem and "bad_reshape_merge" in res.problem and "e-class holds" in res.problem

def test_missing_hypothesis_says_what_to_install(monkeypatch):
  import builtins
  from egraph.ir.errors import CallsatError
  from rules.testing import strategies
  real = builtins.__import__
  def fake(name, *a, **k):
    if name.startswith("hypothesis"): raise ImportError("no hypothesis")
    return real(name, *a, **k)
  monkeypatch.setattr(builtins, "__import__", fake)
  with pytest.raises(CallsatError, match=r"pip install callsat\[test\]"): strategies.graphs()
  with pytest.raises(CallsatError, match=r"pip install callsat\[test\]"): check("drop_detach", examples=1)

def test_false_storage_fact_is_caught_structurally():
  """Issue: 'every RESHAPE has buffer identity' changes no value, so values alone passed it (ok on 50 graphs); the
  derived (storage r) fact on a reshape of a computed value is false."""
  bad = Rule("reshape_is_storage", "every RESHAPE has buffer identity (wrong on purpose)", "optimize", '(= r (U "RESHAPE" a x))', '(storage r)')
  res = check(bad, examples=50)
  assert not res.ok and not res.sound and res.status == "UNSOUND" and "UNSOUND" in str(res)
  assert "structural invariant" in res.problem and "false fact (storage x) on RESHAPE" in res.problem and "reshape_is_storage" in res.problem
  assert "RESHAPE" in res.counterexample and len(res.counterexample.splitlines()) <= 8, res.counterexample

def test_unknown_op_relation_or_arity_is_refused_at_registration():
  from rules.registry import register, validate
  for q in ['(= r (U "NOSUCHOP" a x))', '(= r (U "RESHAPE" a))', '(= r (U "RESHAPE" a x)) (stor r)', '(= r (U "RESHAPE" a x)) (storage r r)']:
    bad = Rule("bad_vocab", "names something that does not exist", "optimize", q, '(union r r)')
    with pytest.raises(ValueError, match="bad_vocab"): register(bad)
    with pytest.raises(ValueError, match="bad_vocab"): check(bad, examples=5)
    assert "bad_vocab" not in RULES
  for r in RULES.values(): validate(r)     # every registered rule passes

def test_rule_that_never_fires_is_untested_not_ok():
  never = Rule("never_fires", "WHERE(c, x, x) = x: sound, but no generated graph has one", "optimize", '(= w (R "WHERE" a c x x))', '(union w x)')
  res = check(never, examples=20)
  assert res.sound and res.untested and not res.ok and res.fired == 0
  assert str(res).startswith("never_fires: UNTESTED") and not check([never], examples=5).ok
