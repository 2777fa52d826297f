"""Exact extraction (egraph/engine/exact.py): the ILP's DAG cost equals brute force on small generated e-graphs (cycles,
self-loops, unusable e-nodes and e-nodes that pay for fewer classes than they read included), and the certificate's
verdicts."""
import itertools
from dataclasses import dataclass
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from egraph.engine import exact as ex
from egraph.engine.extract import acyclic, dag_cost, reached_classes
from egraph.frontend.tensor import Tensor
from egraph.engine import extract as ext
from egraph.engine.driver import callify
from egraph.engine.runner import Limits
from egraph.ir.errors import CallsatError
from egraph.ir.storage import STORAGE
from lower.runtime import run_call, read

pytestmark = pytest.mark.skipif(ex.scipy_milp() is None, reason="scipy.optimize.milp is not importable")

@dataclass
class ListGraph:
  """An e-graph as lists: e-node e is in class cls[e], reads classes kids[e] and pays for cost_kids[e]."""
  cls: list
  kids: list
  cost_kids: list
  n_classes: int
  @property
  def op(self): return ["X"] * len(self.cls)   # extract's walks look for SLICE by name: none here

def brute_force(g: ListGraph, costs, roots) -> int | None:
  """The minimum dag_cost over every acyclic choice (None: no choice reaches a DAG)."""
  members = [[e for e, k in enumerate(g.cls) if k == c and costs[e] is not None] for c in range(g.n_classes)]
  best = None
  for pick in itertools.product(*[m or [-1] for m in members]):
    choice = list(pick)
    try: reached = reached_classes(choice, roots, g.kids, g.n_classes)
    except Exception: continue   # a reached class has no e-node
    if not acyclic(choice, roots, g.kids, g.n_classes): continue
    keep = [-1] * g.n_classes
    for k in reached: keep[k] = choice[k]
    c = dag_cost(g, costs, keep, roots)
    best = c if best is None else min(best, c)
  return best

@st.composite
def egraphs(draw):
  n = draw(st.integers(2, 5))
  cls, kids, cost_kids, costs = [], [], [], []
  for k in range(n):
    for _ in range(draw(st.integers(1, 3))):
      ks = tuple(draw(st.lists(st.integers(0, n - 1), max_size=2)))
      cls.append(k); kids.append(ks)
      cost_kids.append(ks[1:] if ks and draw(st.booleans()) and draw(st.booleans()) else ks)   # sometimes pays less
      costs.append(draw(st.one_of(st.none(), st.integers(0, 9))) if draw(st.booleans()) else draw(st.integers(0, 9)))
  roots = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2))))
  return ListGraph(cls, kids, cost_kids, n), costs, roots

@settings(max_examples=150, deadline=None)
@given(egraphs())
def test_exact_equals_brute_force(case):
  g, costs, roots = case
  want = brute_force(g, costs, roots)
  got = ex.exact_extract(g, costs, roots, seconds=10)
  if want is None:
    assert got.status in ("infeasible",) and got.choice is None
    return
  assert got.status == "optimal" and got.cost == want
  assert acyclic(got.choice, roots, g.kids, g.n_classes)
  assert dag_cost(g, costs, got.choice, roots) == want

def test_shared_term_beats_tree_cost():
  # class 0 (root) = A(1, 2); class 1 = B(3) cost 1 | C() cost 5; class 2 = D(3) cost 1 | E() cost 5; class 3 a leaf
  # costing 7. Tree cost prefers C and E (5 < 1 + 7 each): 11; the DAG that shares the leaf costs 1 + 1 + 1 + 7 = 10.
  g = ListGraph([0, 1, 1, 2, 2, 3], [(1, 2), (3,), (), (3,), (), ()], [(1, 2), (3,), (), (3,), (), ()], 4)
  costs = [1, 1, 5, 1, 5, 7]
  got = ex.exact_extract(g, costs, [0])
  assert got.status == "optimal" and got.cost == 10 and got.choice[:4] == [0, 1, 3, 5]
  assert brute_force(g, costs, [0]) == 10

def test_cycles_are_cut():
  # class 0 = F(1) 1 | G() 5; class 1 = H(0) 1 | I() 3: F and H (2) would be a cycle; F and I (4) beats G (5)
  g = ListGraph([0, 0, 1, 1], [(1,), (), (0,), ()], [(1,), (), (0,), ()], 2)
  got = ex.exact_extract(g, [1, 5, 1, 3], [0])
  assert got.status == "optimal" and got.cost == 4 and got.choice == [0, 3] and brute_force(g, [1, 5, 1, 3], [0]) == 4

def test_verdicts():
  opt = ex.Exact("optimal", 10, 10.0, [0], 0.1, 4, 2)
  assert ex.certify(10, opt).verdict == "optimal (proven)" and ex.certify(10, opt).gap == 0.0
  worse = ex.certify(12, opt)
  assert worse.verdict.startswith("not optimal") and worse.improves and worse.gap == pytest.approx(2 / 12)
  cut = ex.certify(10, ex.Exact("feasible", 10, 9.0, [0], 5.0, 4, 2))
  assert cut.verdict.startswith("gap <= 10.0%") and cut.gap == pytest.approx(0.1)
  assert ex.certify(10, ex.Exact("too big", note="9000 reachable e-classes > 5000")).verdict == \
    "not proven (9000 reachable e-classes > 5000)"
  assert ex.certify(9, opt).gap is None   # an optimum above a feasible DAG's cost is a fault, never "proven"

def test_too_big_is_not_built():
  g = ListGraph([0, 1, 2], [(1,), (2,), ()], [(1,), (2,), ()], 3)
  got = ex.exact_extract(g, [1, 1, 1], [0], max_classes=2)
  assert got.status == "too big" and got.choice is None and "3 reachable e-classes > 2" in got.note

# ---- callify(extraction=...) -------------------------------------------------------------------------------------------

def _bitcast_program():
  """A float32 buffer read directly and through a BITCAST (the corpus's bitcast graphs: a view and the bitcast of the
  read buffer compete)."""
  x = Tensor(np.random.default_rng(3).standard_normal(16).astype(np.float32)).realize()
  return x.bitcast("int32") + x.exp().bitcast("int32")

def _values(res, out):
  st = STORAGE.copy()
  run_call(res.call, st)
  return read(res.buffer_map[out.node], st)

def test_certify_proves_the_default_optimal():
  out = _bitcast_program()
  r = callify(out, cache=False, extraction="certify").report
  assert r.certificate == "optimal (proven)" and r.exact_cost == r.cost and "certify" in r.seconds
  assert "extract   optimal (proven) (ILP" in str(r)
  assert callify(out, cache=False).report.certificate == ""   # default: no ILP, nothing said

def test_exact_takes_the_ilps_dag_where_the_default_is_worse(monkeypatch):
  out = _bitcast_program()
  want = _values(callify(out, cache=False), out)
  monkeypatch.setattr(ext, "SWITCH_BELOW", 0)   # the default without its switch search loses on this graph
  worse = callify(out, cache=False, extraction="certify").report
  assert worse.certificate.startswith("not optimal: exact cost") and worse.exact_cost < worse.cost
  res = callify(out, cache=False, extraction="exact")
  assert res.report.cost == worse.exact_cost and res.report.certificate.endswith("; the ILP's DAG taken")
  np.testing.assert_array_equal(_values(res, out), want)   # the ILP's DAG computes the same values

def test_without_an_e_graph_the_certificate_says_why():
  x = Tensor(np.arange(8, dtype=np.float32)).realize()
  r = callify((x + 1).contiguous(), cache=False, extraction="certify", fusion="rules").report
  assert r.settled and r.certificate == "optimal (proven): no decision, one form" and r.exact_cost is None
  r = callify(_bitcast_program(), cache=False, extraction="certify", limits=Limits(nodes=1)).report
  assert r.fallback and r.certificate == f"not proven (no e-graph: {r.fallback})"

def test_extraction_mode_is_checked_and_keys_the_cache():
  out = _bitcast_program()
  with pytest.raises(CallsatError, match="extraction must be one of"): callify(out, extraction="ilp")
  assert callify(out).report.certificate == ""
  assert callify(out, extraction="certify").report.certificate == "optimal (proven)"   # not the default's cached entry
