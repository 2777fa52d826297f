"""fusion="cost" (issue 14): candidates get stored forms, the partition is chosen by the time model, lowering takes it
as given. Values are checked against numpy and against fusion="rules" on the same programs."""
import math, time
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.ir import Node, Ops, toposort
from egraph.errors import CallsatError
from egraph.runner import Limits, Schedule
from egraph.timemodel import TimeModel
from egraph import fusion
from egraph.fusion import Partition, solve, mark, fusion_mode
from lower import kernelize as kz
from lower.mem import arg_binding
from lower.runtime import run_call, read
from rules.registry import RULES

RNG = np.random.default_rng(0)
def arr(*shape): return RNG.standard_normal(shape).astype(np.float32)
A, B, W, V, X = arr(64, 64), arr(64, 64), arr(64, 32), arr(64, 64), arr(32, 64)

def softmax(a, b, w, v, x): return [a.softmax()]
def layernorm(a, b, w, v, x):
  m = a.mean(axis=1, keepdim=True)
  c = a - m
  return [c * ((c * c).mean(axis=1, keepdim=True) + 1e-5).rsqrt() * b]
def attention(a, b, w, v, x): return [((a @ b.transpose()) * 0.125).softmax() @ v]
def matmul_epilogue(a, b, w, v, x): return [(a @ w + 1).relu()]
def shared(a, b, w, v, x):
  e = (a * b).exp()
  return [e.sum(axis=1), e * a, (e + b).max(axis=0)]
def lerp_5527(a, b, w, v, x): return [a + (b - a) * v]                 # tinygrad #5527, both forms
def lerp_5527_b(a, b, w, v, x): return [a * (1 - v) + b * v]
def mlp(a, b, w, v, x): return [((a @ w).relu() @ x).softmax()]

PROGRAMS = [softmax, layernorm, attention, matmul_epilogue, shared, lerp_5527, lerp_5527_b, mlp]

def run(prog, mode, monkeypatch):
  monkeypatch.setenv("CALLSAT_FUSION", mode)
  ts = prog(*(Tensor(z).realize() for z in (A, B, W, V, X)))
  res = callify(*ts, cache=False)
  for t in ts: t.realize()
  return [t.numpy() for t in ts], res

@pytest.mark.parametrize("prog", PROGRAMS, ids=lambda p: p.__name__)
def test_cost_and_rules_give_the_same_values(prog, monkeypatch):
  got, res = run(prog, "cost", monkeypatch)
  want, rres = run(prog, "rules", monkeypatch)
  assert res.report.fusion == "cost" and rres.report.fusion == "rules"
  assert res.call.src[0].arg == fusion.COST_SINK and rres.call.src[0].arg is None
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
  p = res.report.partition
  assert p.method.startswith("exact") and p.bound_s <= p.predicted_s <= p.rules_s and p.bound_s <= p.fused_s
  assert p.method != "exact" or (p.gap == 0.0 and p.bound_s == p.predicted_s)   # else the rules-like partition was kept

def test_numpy_values_of_the_cost_partition(monkeypatch):
  (got,), _ = run(attention, "cost", monkeypatch)
  s = (A @ B.T) * 0.125
  e = np.exp(s - s.max(axis=1, keepdims=True))
  np.testing.assert_allclose(got, (e / e.sum(axis=1, keepdims=True)) @ V, rtol=1e-4, atol=1e-4)
  (got,), _ = run(layernorm, "cost", monkeypatch)
  c = A - A.mean(axis=1, keepdims=True)
  np.testing.assert_allclose(got, c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5) * B, rtol=1e-4, atol=1e-4)

def _stores(res) -> list[Node]: return [n for n in toposort([res.call.src[0]], enter_calls=False) if n.op is Ops.STORE]

def test_expensive_shared_value_is_stored_once_cheap_one_fused():
  a, b = Tensor(arr(256, 1)).realize(), Tensor(arr(256, 256)).realize()
  e = (a.exp().sin() + 2).sqrt().log()             # 256 values, each a chain of transcendentals, broadcast to 256 x 256
  res = callify(e * b, e + b, fusion="cost", cache=False)
  assert res.report.partition.stored == 1 and len(_stores(res)) == 3
  assert any(s.src[1].shape == (256, 1) for s in _stores(res))
  c = a.reshape((1, 256)).expand((256, 256)) + b   # one add per element: recomputing beats a store and a read back
  res = callify(c * b, c - b, fusion="cost", cache=False)
  assert res.report.partition.stored == 0 and len(_stores(res)) == 2 and res.report.partition.candidates >= 1
  want = (e * b).numpy()
  np.testing.assert_allclose(want, np.log(np.sqrt(np.sin(np.exp(a.numpy())) + 2)) * b.numpy(), rtol=1e-5, atol=1e-5)

def test_greedy_and_exact_agree_and_report_bound_and_gap(monkeypatch):
  ts = shared(*(Tensor(z).realize() for z in (A, B, W, V, X)))
  res = callify(*ts, fusion="cost", cache=False)
  body = res.call.src[0]
  tm = TimeModel.load("CPU")
  rres = callify(*ts, fusion="rules", cache=False)
  stores = [(s.src[1], s.src[1].nbytes) for s in _stores(rres)]
  cands = {n.id: n for s, _ in stores for n in toposort([s], enter_calls=False) if n.op in (Ops.REDUCE, Ops.EXP2, Ops.MUL) and n.shape == (64, 64) or n.op is Ops.REDUCE}
  p = Partition(tm, stores, cands)
  S1, exact = solve(p, exact_max=32, margin=0.0)
  S2, greedy = solve(p, exact_max=0, margin=0.0)
  assert exact.method == "exact" and greedy.method == "greedy" and exact.candidates == greedy.candidates == len(cands)
  assert exact.predicted_s <= greedy.predicted_s + 1e-12 and greedy.bound_s <= exact.predicted_s + 1e-12
  assert greedy.gap == pytest.approx((greedy.predicted_s - greedy.bound_s) / greedy.predicted_s)
  assert exact.predicted_s == pytest.approx(p.cost(S1)) and greedy.predicted_s == pytest.approx(p.cost(S2))
  assert all(p.cost(frozenset(s)) >= exact.predicted_s - 1e-12 for s in ([], list(cands), list(cands)[:1]))
  assert body.arg == "cost" and "fusion    cost: exact" in str(res.report) and res.report.to_dict()["partition"]["method"].startswith("exact")
  S3, kept = solve(p, exact_max=32, margin=1.0)   # nothing beats the rules-like partition by 100%: it is kept
  assert S3 == fusion.rules_like(p) and kept.method == "exact, rules-like kept" and kept.predicted_s == kept.rules_s >= exact.predicted_s

def test_rules_like_partition_is_what_lowering_realizes():
  """fusion.rules_like mirrors lower/'s rules-mode splits: the cost-mode CALL storing exactly those candidates lowers to
  as many kernels as the rules-mode CALL (softmax: the max and the sum under a broadcast; a matmul under a relu)."""
  a, w = Tensor(A).realize(), Tensor(W).realize()
  for t in (a.softmax(), (a @ w + 1).relu(), a - a.mean(axis=0, keepdim=True)):
    rres = callify(t, fusion="rules", cache=False)
    stores = [(s.src[1], s.src[1].nbytes) for s in _stores(rres)]
    cands = {n.id: n for s, _ in stores for n in toposort([s], enter_calls=False) if n.op is Ops.REDUCE}
    R = fusion.rules_like(Partition(TimeModel.load("CPU"), stores, cands))
    rk = [s for s in kz.kernelize(rres.call.src[0], arg_binding(rres.call)[0]).steps if s.kernel is not None]
    assert len(R) + len(stores) == len(rk)

def test_env_switch_cache_key_and_bad_mode(monkeypatch):
  a = Tensor(A).realize()
  y = (a.exp() + 1).sum(axis=0)
  monkeypatch.delenv("CALLSAT_FUSION", raising=False)
  assert fusion_mode() == "rules" and callify(y).report.fusion == "rules"
  monkeypatch.setenv("CALLSAT_FUSION", "cost")
  r = callify(y)                                    # the env is read when callify runs: not a cache hit of the rules run
  assert r.report.fusion == "cost" and not r.report.cache_hit
  assert callify(y).report.cache_hit and callify(y, fusion="rules").report.fusion == "rules"
  monkeypatch.setenv("CALLSAT_FUSION", "fast")
  with pytest.raises(CallsatError, match="fusion"): callify(y)
  with pytest.raises(CallsatError, match="fusion"): callify(y, fusion="none")

def test_time_budget_reaches_the_solver():
  a = Tensor(A).realize()
  res = callify(a.softmax(), fusion="cost", limits=Limits(seconds=5.0), cache=False)
  assert res.report.partition is not None and 0 < res.report.partition.budget_s <= 5.0
  p = Partition(TimeModel.load("CPU"), [], {})
  assert solve(p, deadline=float("inf"))[1].budget_s is None and solve(p, deadline=time.perf_counter() + 2)[1].budget_s <= 2
  res = callify(a.softmax(), fusion="cost", limits=Limits(seconds=1e-9), cache=False)   # no time: the all-materialized fallback
  assert res.report.fallback and res.report.partition is None and res.report.fusion == "cost"

def test_rules_mode_is_unchanged():
  """No candidate facts in rules mode: store_candidate never fires and the CALL is the one without the rule."""
  ts = attention(*(Tensor(z).realize() for z in (A, B, W, V, X)))
  res = callify(*ts, fusion="rules", cache=False)
  others = tuple(n for n, r in RULES.items() if r.phase == "optimize" and n != "store_candidate")
  without = callify(*ts, fusion="rules", schedule=Schedule("without", rules=others), cache=False)
  assert "store_candidate" not in res.report.matches and res.report.partition is None
  assert res.call.src[0] is without.call.src[0] and len(res.call.src) == len(without.call.src)

def test_lowering_computes_unsplit_reduces():
  """A cost-mode CALL whose partition stores nothing: every reduce (softmax's max and sum under a broadcast, a matmul
  under elementwise ops, a reduce of a reduce) is computed where it is read, and the values stay right."""
  assert kz.COST_SINK == fusion.COST_SINK
  a, b, w = Tensor(A).realize(), Tensor(B).realize(), Tensor(W).realize()
  for t, want in [(a.softmax(), None), ((a @ w + 1).relu(), np.maximum(A @ W + 1, 0)), (a.sum(axis=1).max(), A.sum(axis=1).max()),
                  (a - a.mean(axis=0, keepdim=True), A - A.mean(axis=0, keepdims=True))]:
    res = callify(t, fusion="rules", cache=False)
    call = mark(res.call)
    ks = [s for s in kz.kernelize(call.src[0], arg_binding(call)[0]).steps if s.kernel is not None]
    rk = [s for s in kz.kernelize(res.call.src[0], arg_binding(res.call)[0]).steps if s.kernel is not None]
    assert len(ks) <= len(rk)
    run_call(call)
    (out,) = [v for v in res.buffer_map.values()]
    val = read(out)
    if want is None: e = np.exp(A - A.max(axis=1, keepdims=True)); want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(val.reshape(np.shape(want)), want, rtol=1e-4, atol=1e-4)

def test_ordering_kit_covers_the_fusion_rule():
  """`callsat order` with fusion="cost": random orders run store_candidate too; the saturated partition is never
  predicted slower than the reference order's (which has no candidate stores)."""
  from egraph import ordering
  assert "store_candidate" in ordering.orderable_rules()
  r = ordering.run_graph("model:mlp", k=2, fusion="cost")
  assert all(x.predicted_s is not None for x in [r.saturated, r.reference, *r.orders])
  assert r.saturated.predicted_s <= r.reference.predicted_s
  assert ordering.run_graph("model:mlp", k=1, fusion="rules").saturated.predicted_s is None
