"""The bad-merge canary: an e-class with two shapes, dtypes or constants raises EngineError naming the rules that fired
since the last clean check, during saturation (Runner), and through callify when enabled."""
import pytest
from egraph import Tensor, callify
from egraph.engine.encode import encode
from egraph.ir.errors import EngineError
from egraph.engine.runner import Runner, Schedule, Limits
from rules import RULES
from rules.registry import Rule

BAD_CONST = Rule("bad_const_merge", "every two constants are equal (wrong on purpose)", "optimize",
                 '(= c (L "CONST" a)) (= d (L "CONST" b)) (!= a b)', '(union c d)')
BAD_SHAPE = Rule("bad_reshape_merge", "RESHAPE(x) = x (wrong on purpose)", "optimize", '(= r (U "RESHAPE" a x))', '(union r x)')

def _graph():
  a = Tensor([[1., 2], [3, 4]]).realize()
  return [((a + 1) * 2).reshape(4).contiguous().node]   # two CONSTs: 1 and 2 stay constants (frontend.promote)

def _run(roots, rules, canary=True, encoding=True):
  enc = encode(roots)
  r = Runner(Schedule("t", rules=rules, canary=canary))
  r.load(enc.rows, encoding=enc if encoding else None); r.materialize(); r.optimize(Limits(iterations=20))
  return r

def test_clean_run_checks_every_iteration():
  r = _run(_graph(), None)
  assert r.stats.canary_checks >= r.stats.iterations + 1 and not r.class_conflicts()

def test_shape_merge_names_the_rule(monkeypatch):
  monkeypatch.setitem(RULES, BAD_SHAPE.name, BAD_SHAPE)
  with pytest.raises(EngineError, match=r"bad merge after optimize iteration 1: an e-class holds .*bad_reshape_merge"):
    _run(_graph(), ("bad_reshape_merge", "drop_detach"))

def test_constant_merge_without_the_encoding(monkeypatch):
  monkeypatch.setitem(RULES, BAD_CONST.name, BAD_CONST)
  with pytest.raises(EngineError, match="different constants.*bad_const_merge"):
    _run(_graph(), ("bad_const_merge",), encoding=False)

def test_canary_off_lets_it_through(monkeypatch):
  monkeypatch.setitem(RULES, BAD_SHAPE.name, BAD_SHAPE)
  r = _run(_graph(), ("bad_reshape_merge",), canary=False)
  assert r.stats.canary_checks == 0 and r.class_conflicts()   # the conflict is there, found on demand

def test_canary_through_callify_env(monkeypatch):
  monkeypatch.setitem(RULES, BAD_CONST.name, BAD_CONST)
  monkeypatch.setenv("CALLSAT_CANARY", "1")
  with pytest.raises(EngineError, match="bad_const_merge"):
    callify(*_graph(), schedule=Schedule("bad", rules=("bad_const_merge",)), cache=False)
  monkeypatch.setenv("CALLSAT_CANARY", "0")
  callify(*_graph(), schedule=Schedule("bad", rules=("bad_const_merge",)), cache=False)   # no canary: no error
