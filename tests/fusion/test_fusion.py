"""fusion="cost" (issue 14): candidates get stored forms, the partition is chosen by the time model, lowering takes it
as given. Values are checked against numpy and against fusion="rules" on the same programs."""
import dataclasses, itertools, math, sys, time
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.ir.ops import Node, Ops, GroupOp, toposort
from egraph.ir.errors import CallsatError
from egraph.engine.runner import Limits, Schedule
from egraph.fusion.timemodel import TimeModel
from egraph.fusion import solve as fusion
from egraph.fusion import candidates
from egraph.fusion import greedy
from egraph.fusion import milp as fmilp
from egraph.fusion import partition
from egraph.fusion import policy
from egraph.fusion.solve import solve, fusion_mode
from egraph.engine.exact import scipy_milp
from egraph.fusion.partition import Partition
from egraph.fusion.candidates import mark
from egraph.fusion.greedy import worth_flipping
from lower.schedule import kernelize as kz
from lower.schedule.mem import arg_binding
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
  assert res.call.src[0].arg == policy.COST_SINK and rres.call.src[0].arg is None
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
  p = res.report.partition
  if p.method == "none (no candidates)": return   # #5527's forms: nothing shared, nothing to choose
  assert p.method.startswith(("milp", "exhaustive")) or "in time" in p.note   # a loaded machine may leave HiGHS without a solution
  assert p.bound_s <= p.predicted_s <= p.rules_s and p.gap >= 0 and (p.fused_s is None or p.bound_s <= p.fused_s)
  if p.method.startswith("exhaustive"): assert p.candidates <= fusion.EXHAUSTIVE_MAX and p.gap == 0 and p.mip_gap is None
  else: assert p.method.startswith("greedy") or p.mip_gap >= 0 and (p.model_gap is not None or "(time limit)" in p.method)

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
  a, b = Tensor(arr(1, 256)).realize(), Tensor(arr(256, 256)).realize()
  e = (a.exp().sin() + 2).sqrt().log()             # 256 values, each a chain of transcendentals, broadcast down 256 rows
  res = callify(e * b, e + b, fusion="cost", cache=False)
  assert res.report.partition.stored == 1 and len(_stores(res)) == 3
  assert any(s.src[1].shape == (1, 256) for s in _stores(res))
  r = Tensor(arr(256, 1)).realize()
  er = (r.exp().sin() + 2).sqrt().log()            # broadcast along the rows: hoisted out of the inner loop, 256 evaluations fused
  assert callify(er * b, er + b, fusion="cost", cache=False).report.partition.stored == 0
  c = a.reshape((1, 256)).expand((256, 256)) + b   # one add per element: recomputing beats a store and a read back
  res = callify(c * b, c - b, fusion="cost", cache=False)
  assert res.report.partition.stored == 0 and len(_stores(res)) == 2 and res.report.partition.candidates >= 1
  want = (e * b).numpy()
  np.testing.assert_allclose(want, np.log(np.sqrt(np.sin(np.exp(a.numpy())) + 2)) * b.numpy(), rtol=1e-5, atol=1e-5)

def _shared_partition():
  ts = shared(*(Tensor(z).realize() for z in (A, B, W, V, X)))
  rres = callify(*ts, fusion="rules", cache=False)
  stores = [(s.src[1], s.src[1].nbytes) for s in _stores(rres)]
  cands = {n.id: n for s, _ in stores for n in toposort([s], enter_calls=False)
           if n.op in (Ops.REDUCE, Ops.EXP2, Ops.MUL) and n.shape == (64, 64) or n.op is Ops.REDUCE}
  return ts, Partition(TimeModel.load("CPU"), stores, cands)

def test_worth_flipping_keeps_what_the_optimum_stores():
  """greedy.worth_flipping's bound: a candidate it leaves out is not stored by the MILP's answer; launch 0 keeps all,
  an hour's launch none."""
  _, p = _shared_partition()
  cs = sorted(p.cands)
  S, _ = solve(p, method="milp", margin=0.0)
  assert S <= set(worth_flipping(p, cs))
  for launch, want in ((0.0, cs), (3600.0, [])):
    q = Partition(dataclasses.replace(p.model, launch_s=launch), p.stores, p.cands)
    assert worth_flipping(q, cs) == want

def test_milp_and_greedy_agree_and_report_bound_and_gap():
  ts, p = _shared_partition()
  res = callify(*ts, fusion="cost", cache=False)
  S1, milp = solve(p, method="milp", margin=0.0)
  S2, greedy = solve(p, method="greedy", margin=0.0)
  assert milp.method == "milp" and greedy.method == "greedy" and milp.candidates == greedy.candidates == len(p.cands)
  assert milp.predicted_s <= greedy.predicted_s + 1e-12 and greedy.bound_s <= milp.predicted_s + 1e-12
  assert milp.bound_s <= milp.predicted_s and milp.gap >= 0 and 0 <= milp.mip_gap <= fmilp.MIP_GAP and abs(milp.model_gap) < 0.5
  assert greedy.gap == pytest.approx((greedy.predicted_s - greedy.bound_s) / greedy.predicted_s) and greedy.mip_gap is None
  assert milp.predicted_s == pytest.approx(p.cost(S1)) and greedy.predicted_s == pytest.approx(p.cost(S2))
  assert milp.predicted_s == pytest.approx(_brute(p)[0])
  assert res.call.src[0].arg == "cost" and "fusion    cost: exhaustive" in str(res.report)   # auto: few candidates
  assert res.report.to_dict()["partition"]["method"].startswith("exhaustive")
  S3, kept = solve(p, method="milp", margin=1.0)   # nothing beats the rules-like partition by 100%: it is kept
  assert S3 == partition.rules_like(p) and kept.method == "milp, rules-like kept" and kept.predicted_s == kept.rules_s >= milp.predicted_s

def _brute(p: Partition) -> tuple[float, frozenset]:
  """The test oracle: every subset of the candidates, costed by Partition.cost."""
  cs = sorted(p.cands)
  return min((p.cost(frozenset(x)), frozenset(x)) for k in range(len(cs) + 1) for x in itertools.combinations(cs, k))

def _random_program(seed: int, n: int = 512):
  """8-12 random ops (add, mul, exp, a column sum, sqrt) over two (n, n) inputs and a broadcast (1, n) one: (stores,
  candidates) of its rules-mode CALL, up to 9 candidates (every computed node other than a STORE's value). Broadcasts
  run along the leading axis: a value broadcast along a trailing one is hoisted out of that loop (greedy.hoisted), which
  makes recomputing it nearly free and the choice trivial."""
  g = np.random.default_rng(seed)
  pool = [Tensor(g.standard_normal(s).astype(np.float32)).realize() for s in ((n, n), (n, n), (1, n))]
  for _ in range(g.integers(8, 13)):
    k, a, b = g.integers(0, 5), pool[g.integers(len(pool))], pool[g.integers(len(pool))]
    pool.append([lambda: a + b, lambda: a * b, lambda: (a * 0.1).exp(), lambda: a.sum(axis=0, keepdim=True) * 0.01, lambda: (a * a + 1).sqrt()][k]())
  rres = callify(*dict.fromkeys(pool[-2:]), fusion="rules", cache=False)
  stores = [(s.src[1], s.src[1].nbytes) for s in _stores(rres)]
  roots = {v.id for v, _ in stores}
  cands = [n for n in toposort([v for v, _ in stores], enter_calls=False) if n.id not in roots and (n.op is Ops.REDUCE or n.op in GroupOp.ALU)]
  return stores, {n.id: n for n in cands[:9]}

def test_milp_is_the_brute_force_optimum_on_random_programs():
  """The MILP's answer, re-costed by Partition.cost, is the optimum over every subset, on 12 generated programs under
  the time model with one reduce rate (the MILP fixes a kernel's re-read share from a reference partition: with the
  reduce and elementwise rates equal the share does not matter and the formulation is exact), combine max and sum."""
  tm = TimeModel.load("CPU")
  lin = dataclasses.replace(tm, throughput={**tm.throughput, "reduce": tm.throughput["elementwise"]})
  sp, sizes, stored = scipy_milp(), [], 0
  for seed in range(12):
    stores, cands = _random_program(seed)
    sizes.append(len(cands))
    for m in (lin, dataclasses.replace(lin, combine="sum")):
      p = Partition(m, stores, cands)
      opt, S = _brute(p)
      R = partition.rules_like(p)
      ilp = fmilp.Ilp(p, p.cost(R))
      got, obj, bound, mip_gap, cut = ilp.run(R, math.inf, sp, gap=1e-7)
      assert p.cost(got) == pytest.approx(opt, rel=1e-9) and obj == pytest.approx(opt, rel=1e-6) and bound <= obj * (1 + 1e-6)
      assert not cut and mip_gap <= 1e-6
      stored += len(got)
  assert sum(s >= 5 for s in sizes) >= 8 and stored >= 5   # not trivial: most have several candidates, some get stored

def test_exhaustive_is_the_optimum_for_few_candidates(monkeypatch):
  """Up to EXHAUSTIVE_MAX candidates solve costs every subset: the brute-force optimum (bound = predicted, gap 0),
  without scipy; the rules-like partition is kept unless the best beats it by the margin; past the deadline the greedy
  runs and says why; above the bound the MILP runs."""
  monkeypatch.setitem(sys.modules, "scipy.optimize", None)   # never imported for so few candidates
  n = 0
  for seed in range(12):
    stores, cands = _random_program(seed)
    if len(cands) > fusion.EXHAUSTIVE_MAX: continue
    p = Partition(TimeModel.load("CPU"), stores, cands)
    S, rep = solve(p, margin=0.0)
    opt, _ = _brute(p)
    assert rep.method == "exhaustive" and rep.predicted_s == pytest.approx(opt) == p.cost(S) and rep.bound_s == rep.predicted_s and rep.gap == 0
    assert rep.fused_s == p.cost(frozenset()) and rep.rules_s == p.cost(partition.rules_like(p)) and rep.evaluations > 0
    S2, kept = solve(p, margin=1.0)   # nothing is 100 % faster: the rules-like partition
    assert S2 == partition.rules_like(p) and kept.method.endswith("rules-like kept") or S == S2 == partition.rules_like(p)
    S3, late = solve(p, deadline=time.perf_counter() - 1)
    assert "out of time costing every partition" in late.note and not late.method.startswith("exhaustive")
    n += 1
  assert n >= 3
  monkeypatch.setattr(fusion, "EXHAUSTIVE_MAX", 0)
  _, rep = solve(Partition(TimeModel.load("CPU"), *_random_program(0)))
  assert rep.method.startswith("greedy") and "scipy not installed" in rep.note

def test_rules_like_partition_is_what_lowering_realizes():
  """partition.rules_like mirrors lower/'s rules-mode splits: the cost-mode CALL storing exactly those candidates lowers to
  as many kernels as the rules-mode CALL (softmax: the max and the sum under a broadcast; a matmul under a relu)."""
  a, w = Tensor(A).realize(), Tensor(W).realize()
  for t in (a.softmax(), (a @ w + 1).relu(), a - a.mean(axis=0, keepdim=True)):
    rres = callify(t, fusion="rules", cache=False)
    stores = [(s.src[1], s.src[1].nbytes) for s in _stores(rres)]
    cands = {n.id: n for s, _ in stores for n in toposort([s], enter_calls=False) if n.op is Ops.REDUCE}
    R = partition.rules_like(Partition(TimeModel.load("CPU"), stores, cands))
    rk = [s for s in kz.kernelize(rres.call.src[0], arg_binding(rres.call)[0]).steps if s.kernel is not None]
    assert len(R) + len(stores) == len(rk)

def test_env_switch_cache_key_and_bad_mode(monkeypatch):
  a = Tensor(A).realize()
  y = (a.exp() + 1).sum(axis=0)
  monkeypatch.delenv("CALLSAT_FUSION", raising=False)
  assert fusion_mode() == "cost" and callify(y).report.fusion == "cost"
  monkeypatch.setenv("CALLSAT_FUSION", "rules")
  r = callify(y)                                    # the env is read when callify runs: not a cache hit of the cost run
  assert r.report.fusion == "rules" and not r.report.cache_hit
  monkeypatch.setenv("CALLSAT_FUSION", "cost")
  r = callify(y)
  assert r.report.fusion == "cost" and r.report.cache_hit
  assert callify(y).report.cache_hit and callify(y, fusion="rules").report.fusion == "rules"
  monkeypatch.setenv("CALLSAT_FUSION", "fast")
  with pytest.raises(CallsatError, match="fusion"): callify(y)
  with pytest.raises(CallsatError, match="fusion"): callify(y, fusion="none")

def test_time_budget_reaches_the_solver():
  a = Tensor(A).realize()
  res = callify(a.softmax(), fusion="cost", limits=Limits(seconds=5.0), cache=False)
  assert res.report.partition is not None and 0 < res.report.partition.budget_s <= 5.0
  assert res.report.partition.method.startswith("exhaustive")   # 3 candidates
  p = Partition(TimeModel.load("CPU"), [], {})
  assert solve(p, deadline=float("inf"))[1].budget_s is None and solve(p, deadline=time.perf_counter() + 2)[1].budget_s <= 2
  _, p = _shared_partition()
  scipy_milp()   # imported already: the deadline below is the solver's alone
  S, rep = solve(p, deadline=time.perf_counter() + 1e-4, method="milp")   # no time: HiGHS's limit, or the greedy, says so
  assert rep.budget_s <= 1e-4   # past the deadline nothing more is costed: the first start is the answer, uncosted
  assert rep.predicted_s == pytest.approx(p.cost(S)) if rep.predicted_s is not None else "out of time" in rep.note, rep
  assert "(time limit)" in rep.method or ("greedy" in rep.method and rep.note), rep
  res = callify(a.softmax(), fusion="cost", limits=Limits(seconds=1e-9), cache=False)   # no time: the all-materialized fallback
  assert res.report.fallback and res.report.partition is None and res.report.fusion == "cost"

def test_cost_mode_without_scipy_falls_back_to_the_greedy(monkeypatch):
  """Where scipy cannot be imported cost mode runs the greedy, says why, and the values are right."""
  monkeypatch.setitem(sys.modules, "scipy.optimize", None)
  monkeypatch.setattr(fusion, "EXHAUSTIVE_MAX", 0)   # attention's 6 candidates would be costed every way, scipy or not
  assert scipy_milp() is None
  got, res = run(attention, "cost", monkeypatch)
  want, _ = run(attention, "rules", monkeypatch)
  p = res.report.partition
  assert p.method.startswith("greedy") and "scipy not installed" in p.note and p.mip_gap is None
  np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)

def test_too_many_candidates_for_the_milp_import_no_scipy(monkeypatch):
  """Above MILP_MAX_CANDIDATES the greedy runs alone: scipy (~0.5 s to import) is not imported for it."""
  calls = []
  monkeypatch.setattr(fusion, "scipy_milp", lambda: calls.append(1))
  monkeypatch.setattr(fusion, "EXHAUSTIVE_MAX", 0)
  monkeypatch.setattr(fusion, "MILP_MAX_CANDIDATES", 1)
  got, res = run(attention, "cost", monkeypatch)
  p = res.report.partition
  assert calls == [] and p.method.startswith("greedy") and "candidates: greedy" in p.note and "scipy" not in p.note
  want, _ = run(attention, "rules", monkeypatch)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)

def test_no_candidates_no_partition_costing():
  """A graph with no candidate (an elementwise chain) skips the partition: nothing to choose, nothing costed."""
  a = Tensor(A).realize()
  res = callify((a * 2 + 1).exp(), fusion="cost", cache=False)
  assert res.report.partition.method == "none (no candidates)" and res.report.partition.predicted_s is None
  assert "none (no candidates)" in str(res.report)

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
  assert kz.COST_SINK is policy.COST_SINK   # one policy (egraph/fusion/policy.py)
  a, w = Tensor(A).realize(), Tensor(W).realize()
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
  from egraph.tools import ordering
  assert "store_candidate" in ordering.orderable_rules()
  r = ordering.run_graph("model:mlp", k=2, fusion="cost")
  assert all(x.predicted_s is not None for x in [r.saturated, r.reference, *r.orders])
  assert r.saturated.predicted_s <= r.reference.predicted_s
  assert ordering.run_graph("model:mlp", k=1, fusion="rules").saturated.predicted_s is None

def _rules_like_per_kernel(p: Partition) -> frozenset:
  """The oracle: lower/'s rules-mode splits walked kernel by kernel (each STORE's region on its own, the old
  partition.rules_like), against greedy.rules_realized's one walk over the union of the regions."""
  out, W = set(), greedy.NESTED_REDUCE_WORK
  def unview(n):
    while n.op in GroupOp.Movement or n.op in (Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CONTIGUOUS, Ops.COPY): n = n.src[0]
    return n
  big = lambda r: r.op is Ops.REDUCE and math.prod(r.src[0].shape) >= W
  widens = lambda n: n.op is Ops.EXPAND and any(s == 1 and t != 1 for s, t in zip(n.src[0].shape, n.arg))
  for v, _ in p.stores:
    order, seen, stack = [], set(), [(v, False)]
    while stack:
      n, done = stack.pop()
      if done: order.append(n); continue
      if n.id in seen: continue
      seen.add(n.id); stack.append((n, True))
      if n.op not in greedy.LOADS: stack.extend((s, False) for s in n.src if s.id not in seen)
    under, nested = set(), set()
    for n in reversed(order):
      if n.op is Ops.REDUCE or n.id in under: under.update(s.id for s in n.src)
    for n in order:
      if n.op in GroupOp.ALU: nested.update(c.id for c in map(unview, n.src) if big(c))
      if n.id not in under or n.shape is None: continue
      if big(n): nested.add(n.id)
      elif (n.op is Ops.EXPAND and math.prod(n.shape) >= W and ((c := unview(n.src[0])).op in GroupOp.ALU or c.op is Ops.REDUCE)
            and math.prod(c.shape) > 1): nested.add(c.id)
    walked, stack = set(), [(v, False, True)]
    while stack:
      n, b, top = stack.pop()
      if (n.id, b) in walked or n.op in greedy.LOADS: continue
      walked.add((n.id, b))
      if not top and (n.id in nested or (n.op is Ops.REDUCE and b)): out.add(n.id); b = False
      stack.extend((s, b or widens(n), False) for s in n.src)
  return frozenset(out & set(p.cands))

def _extracted(ts):
  """(Partition over the decoded terms, its candidates' classes, and what rules_like_ids reads) of a cost-mode e-graph."""
  from egraph.engine.encode import encode
  from egraph.engine.driver import saturate, extract_call
  from egraph.engine.cost import COST_PRESETS
  from egraph.engine.extract import reached_classes
  enc = encode([t.node for t in ts], "fresh")
  cands = candidates.add_candidates(enc)
  sat = saturate(enc)
  ex, g = extract_call(sat, COST_PRESETS["bytes"]), sat.graph
  reached = reached_classes(ex.choice, ex.root_classes, g.kids, g.n_classes)
  rset = set(reached)
  members = {k: m for k, m in candidates.stored_members(g, enc, cands).items() if k in rset}
  terms = ex.terms
  stores = [(n.src[1], n.src[1].nbytes) for n in toposort([terms[c] for c in ex.root_classes], enter_calls=False) if n.op is Ops.STORE]
  return Partition(TimeModel.load("CPU"), stores, {terms[k].id: terms[k] for k in members}), terms, g, ex.choice, reached, members

def test_rules_like_one_walk_and_over_ids_are_the_per_kernel_walk():
  """greedy.rules_realized walks each node once over the union of the kernels; over the decoded terms (rules_like) and
  over e-class ids without decoding (rules_like_ids, the partition's answer when there is no time to cost) it stores
  the candidates the per-kernel walk does, on the test programs at 256^2 (above NESTED_REDUCE_WORK) and random ones."""
  big = [RNG.standard_normal((256, 256)).astype(np.float32) for _ in range(5)]
  progs = [prog(*(Tensor(z).realize() for z in big)) for prog in PROGRAMS]
  nonempty = 0
  for ts in progs:
    p, terms, g, choice, reached, members = _extracted(ts)
    R = partition.rules_like(p)
    assert R == _rules_like_per_kernel(p) == frozenset(terms[k].id for k in partition.rules_like_ids(g, choice, reached, members))
    nonempty += bool(R)
  for seed in range(6):
    stores, cands = _random_program(seed)
    p = Partition(TimeModel.load("CPU"), stores, cands)
    R = partition.rules_like(p); nonempty += bool(R)
    assert R == _rules_like_per_kernel(p)
  assert nonempty >= 3

def test_no_time_to_cost_stores_the_rules_like_partition(monkeypatch):
  """When decoding and costing cannot fit the solver's budget, partition_ids stores the rules-like candidates read off
  the ids (nothing costed, nothing decoded for it) and says so; the values are right."""
  monkeypatch.setattr(fusion, "COST_S_PER_CLASS", 1.0)
  a = Tensor(arr(256, 256)).realize()
  t = (a - a.max(axis=1, keepdim=True)).exp()
  res = callify(t / t.sum(axis=1, keepdim=True), fusion="cost", cache=False)
  rep = res.report.partition
  assert rep.method == "rules-like (no time to cost)" and rep.predicted_s is None and rep.evaluations == 0 and "no time" in rep.note
  assert len(_stores(res)) == 1 + rep.stored and rep.stored >= 1   # the max and the sum under a broadcast
  e = np.exp(a.numpy() - a.numpy().max(axis=1, keepdims=True))
  np.testing.assert_allclose((t / t.sum(axis=1, keepdim=True)).numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)

def test_graphs_too_big_to_cost_run_the_rules(monkeypatch):
  """Above SHARED_MAX_NODES inserted nodes cost mode runs the rules (no partition could be costed there), says why in
  the report, and gives the rules-mode CALL and values."""
  a = Tensor(arr(256, 256)).realize()
  t = (a - a.max(axis=1, keepdim=True)).exp()
  y = t / t.sum(axis=1, keepdim=True)
  small = callify(y, fusion="cost", cache=False)
  assert small.report.fusion == "cost" and small.report.partition is not None and not small.report.fusion_note
  monkeypatch.setattr(fusion, "SHARED_MAX_NODES", 3)
  big, rules = callify(y, fusion="cost", cache=False), callify(y, fusion="rules", cache=False)
  assert big.report.fusion == "rules" and big.report.partition is None and "too big to cost" in big.report.fusion_note
  assert "> 3: too big" in str(big.report) and big.call.src[0] is rules.call.src[0]
  e = np.exp(a.numpy() - a.numpy().max(axis=1, keepdims=True))
  np.testing.assert_allclose(y.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)

def test_big_graphs_mint_no_shared_candidates(monkeypatch):
  """Above SHARED_MAX_NODES inserted nodes only reduces and broadcast operands get stored forms (what the rules-like
  answer can store); below, shared values too."""
  from egraph.engine.encode import encode
  ts = shared(*(Tensor(z).realize() for z in (A, B, W, V, X)))
  small = candidates.add_candidates(encode([t.node for t in ts], "fresh"))
  monkeypatch.setattr(candidates, "SHARED_MAX_NODES", 1)
  big = candidates.add_candidates(encode([t.node for t in ts], "fresh"))
  assert "shared" in small.values() and "shared" not in big.values() and set(big.values()) <= {"reduce", "broadcast"}
  assert {i for i, w in small.items() if w != "shared"} == set(big)

@pytest.mark.parametrize("shape", [(3, 0), (0, 3), (2, 0, 4)])
def test_empty_values_in_cost_mode(shape, monkeypatch):
  """Zero-size values are candidates too: the partition's evaluation counts are 0 (they divided by them)."""
  monkeypatch.setenv("CALLSAT_FUSION", "cost")
  x = np.ones(shape, np.float32)
  t = Tensor(x).realize()
  e = (t * 2).exp()
  outs = [e.sum(axis=1), e.max(axis=0) if shape[0] else e.sum(axis=0), (e * t).std(axis=-1), e.reshape(*shape, 1).expand(*shape, 3).sum(axis=-1)]
  want = [np.exp(x * 2).sum(1), np.exp(x * 2).sum(0), (np.exp(x * 2) * x).std(-1, ddof=1) if shape[-1] > 1 else None, np.exp(x * 2) * 3]
  for o, w in zip(outs, want):
    g = o.numpy()
    assert g.shape == o.shape and (w is None or g.shape == w.shape)
    if w is not None and w.size: np.testing.assert_allclose(g, w, rtol=1e-6)

def test_stored_intermediates_are_temporaries(monkeypatch):
  """A stored candidate's buffer holds no tensor: the CALL marks it (CallInfo.temps), lowering binds it to scratch in
  its arena, and no storage is allocated for it (nor by the numpy reference); the checker accepts the CALL and the
  values are the reference's and the rules mode's."""
  from egraph.ir.storage import STORAGE
  from lower.device.native import memory_plan
  from lower.reference import evaluate
  from rules.testing.soundness import call_violations
  monkeypatch.setenv("CALLSAT_FUSION", "cost")
  for prog in (attention, layernorm, shared):
    ts = prog(*(Tensor(z).realize() for z in (A, B, W, V, X)))
    res = callify(*ts, cache=False)
    args, temps = res.call.src[1:], res.call.arg.temps
    held = {v.base.arg.uid for v in res.buffer_map.values()}
    assert len(temps) == res.report.temps == res.report.partition.stored > 0
    assert all(args[i].op is Ops.BUFFER and args[i].arg.uid not in held for i in temps)
    assert {i for i, a in enumerate(args) if a.op is Ops.BUFFER and a.arg.uid not in held and a.arg.uid in res.report.fresh_uids} == temps
    assert call_violations([t.node for t in ts], res.call, res.buffer_map) == []
    bind, bufs = arg_binding(res.call)
    assert {i for i, m in bind.items() if m.root[0] == "tmp"} == temps and all(bind[i].root == ("tmp", ~i) for i in temps)
    prog_ = kz.kernelize(res.call.src[0], bind)
    offs, peak, _ = memory_plan(prog_)
    assert all(("tmp", ~i) in offs for i in temps) and peak >= max(args[i].nbytes for i in temps)
    ks = [st for st in prog_.steps if st.kernel is not None]
    for i in temps:   # written before it is read (its reads order the groups as a write does)
      w = [j for j, st in enumerate(ks) if st.mems[st.kernel.store.param].root == ("tmp", ~i)]
      r = [j for j, st in enumerate(ks) if any(m.root == ("tmp", ~i) for k, m in enumerate(st.mems) if k != st.kernel.store.param)]
      assert len(w) == 1 and r and w[0] < min(r)
    ref = STORAGE.copy()
    evaluate([res.call], ref)   # the numpy oracle keeps them as scratch too
    run_call(res.call)
    assert all(args[i].arg.uid not in STORAGE and args[i].arg.uid not in ref for i in temps) and all(uid in STORAGE for uid in held)
    for uid in held: np.testing.assert_allclose(STORAGE.get(uid), ref.get(uid), rtol=1e-4, atol=1e-4)
    rres = callify(*ts, fusion="rules", cache=False)
    run_call(rres.call)
    for k, v in res.buffer_map.items(): np.testing.assert_allclose(read(v), read(rres.buffer_map[k]), rtol=1e-4, atol=1e-4)

def test_temporaries_of_a_lazy_call_inside_another(monkeypatch):
  """A cost-mode CALL left lazy (Tensor.callify) runs later inside another CALL: its temporaries are the outer
  program's scratch, and the values are numpy's."""
  monkeypatch.setenv("CALLSAT_FUSION", "cost")
  a, b = Tensor(A).realize(), Tensor(B).realize()
  s = a.softmax(axis=1)
  s.callify()
  assert s.node.op is Ops.AFTER and s.node.src[1].op is Ops.CALL and s.node.src[1].arg.temps
  e = np.exp(A - A.max(axis=1, keepdims=True))
  np.testing.assert_allclose((s * b + 1).numpy(), e / e.sum(axis=1, keepdims=True) * B + 1, rtol=1e-5, atol=1e-5)

def test_checker_refuses_bad_temporaries():
  """A temporary is garbage when the CALL starts: reading it before a store, or keeping a tensor in it, is refused."""
  from egraph.ir.ops import CallInfo, new_buffer, const
  from egraph.ir.dtype import dtypes
  from rules.testing.soundness import call_violations
  x, t, out = (new_buffer(16, dtypes.float32, "CPU") for _ in range(3))
  px, pt, po = x.param(0), t.param(1), out.param(2)
  def c(v, like): return const(v, dtypes.float32, "CPU").reshape((1,)).expand(like.shape)
  st = pt.store(px.alu(Ops.MUL, c(2.0, px)))
  good = po.store(pt.after(st).alu(Ops.ADD, c(1.0, pt)))
  bad = po.store(pt.alu(Ops.ADD, c(1.0, pt)))   # reads the scratch before anything is stored into it
  def call(v, temps): return Node(Ops.CALL, dtypes.void, (Node.sink(po.after(v)), x, t, out), CallInfo(temps=frozenset(temps)))
  root = Node(Ops.CONTIGUOUS, dtypes.float32, (x.alu(Ops.ADD, c(1.0, x)),))
  assert call_violations([root], call(good, {1}), {root: out}) == []
  assert any("reads temporary PARAM 1" in m for m in call_violations([root], call(bad, {1}), {root: out}))
  assert any("temporary arg 2 holds a realized value" in m for m in call_violations([root], call(good, {1, 2}), {root: out}))
  assert any("temporary arg 5 is not a BUFFER" in m for m in call_violations([root], call(good, {5}), {root: out}))

def test_cache_hits_keep_temporaries_and_mint_outputs(monkeypatch):
  """A cost-mode program realized again hits callify's cache: the outputs are new buffers, the temporaries the same
  BUFFERs (no executor gives them storage), and the values follow the new inputs."""
  from egraph.ir.storage import STORAGE
  monkeypatch.setenv("CALLSAT_FUSION", "cost")
  a1, a2 = Tensor(A).realize(), Tensor(B).realize()
  r1, r2 = callify(a1.softmax(axis=1)), callify(a2.softmax(axis=1))
  assert r2.report.cache_hit and r1.call.arg.temps == r2.call.arg.temps and r1.call.arg.temps
  assert all(r1.call.src[1 + i] is r2.call.src[1 + i] for i in r1.call.arg.temps)
  (o1,), (o2,) = r1.buffer_map.values(), r2.buffer_map.values()
  assert o1.base is not o2.base
  run_call(r1.call); run_call(r2.call)
  for o, x in ((o1, A), (o2, B)):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(read(o).reshape(x.shape), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
  assert all(r1.call.src[1 + i].arg.uid not in STORAGE for i in r1.call.arg.temps)

def test_tinygrad_anchor_is_tinygrads_stores_and_the_search_starts_there():
  """anchor="tinygrad": the report's anchor time is the cost of what tinygrad's own schedule stores (fusion/stock.py)
  and the answer is never predicted slower than it; an unknown anchor is refused by name."""
  _, p = _shared_partition()
  T = partition.tinygrad_like(p)
  assert T <= set(p.cands)
  S, rep = solve(p, method="greedy", anchor="tinygrad")
  assert rep.rules_s == pytest.approx(p.cost(T)) and rep.predicted_s <= rep.rules_s + 1e-15
  assert rep.predicted_s == pytest.approx(p.cost(S))
  with pytest.raises(CallsatError, match="anchor must be one of"): solve(p, anchor="stock")

def test_a_model_that_does_not_hoist_prices_broadcast_recompute():
  """Without hoisting (tinygrad's kernels) a value broadcast along the inner axis is computed once per element that
  reads it; with it (callsat's), once per row."""
  r = Tensor(arr(256, 1)).realize()
  b = Tensor(arr(256, 256)).realize()
  er = (r.exp().sin() + 2).sqrt().log()
  rres = callify(er * b, fusion="rules", cache=False)
  stores = [(s.src[1], s.src[1].nbytes) for s in _stores(rres)]
  m = TimeModel.load("CPU")
  flops = {h: Partition(dataclasses.replace(m, hoists=h), stores, {}).k.work(stores[0][0], stores[0][1], frozenset()).flops
           for h in (True, False)}
  chain = {h: f - 256 * 256 for h, f in flops.items()}   # the chain's ops, beside the product's one per element
  assert chain[True] > 0 and chain[False] == 256 * chain[True]

def test_a_kernels_nodes_are_what_it_computes():
  """KernelWork.nodes (what tinygrad lowers per eager call): the nodes a kernel computes, its loads and the stored
  values it reads not counted; storing a shared value takes its nodes out of the kernels that read it."""
  a, b = Tensor(arr(64, 64)).realize(), Tensor(arr(64, 64)).realize()
  e = (a * b).exp()
  res = callify(e + 1, e * 2, fusion="rules", cache=False)
  stores = [(s.src[1], s.src[1].nbytes) for s in _stores(res)]
  ids = {n.id: n for s, _ in stores for n in toposort([s], enter_calls=False) if n.op is Ops.EXP2}
  p = Partition(TimeModel.load("CPU"), stores, ids)
  def nodes(S): return sum(p.k.work(v, w, frozenset(S)).nodes for _, v, w in p.roots(frozenset(S)))
  inner = [n for s, _ in stores for n in toposort([s], enter_calls=False) if n.op not in greedy.LOADS]
  assert nodes(()) == len(inner) and 0 < nodes(ids) < nodes(())
