"""The bridge's cost-mode option (CALLSAT_BRIDGE_FUSION, egraph/bridge/shadow.py): with it on, tinygrad programs give
stock tinygrad's values (and numpy's) on tinygrad's CPU device while the partition's extra realize points come back as
CONTIGUOUS in the CALL body (cost) or as STOREs of the CALL (cost-store), and the kernel counts change; with it off
nothing changes. No timing here (bench/fusion_tinygrad.py measures)."""
import dataclasses
import numpy as np
import os
import pytest

tinygrad = pytest.importorskip("tinygrad")
from tinygrad import Tensor, GlobalCounters, Context, nn   # noqa: E402
from tinygrad.uop.ops import UOp, Ops as TOps   # noqa: E402
from egraph import tinygrad as bridge   # noqa: E402
from tinygrad_cpu import require_cpu   # noqa: E402
from egraph.ir.errors import CallsatError   # noqa: E402
from egraph.ir.ops import Ops   # noqa: E402
from egraph.bridge.convert import to_callsat   # noqa: E402
from egraph.bridge import shadow, measure, install   # noqa: E402
from egraph.bridge.shadow import Shadow, bridge_fusion, cost_hints   # noqa: E402

require_cpu()
DEV = "CPU"

def _np_softmax(v): e = np.exp(v - v.max(-1, keepdims=True)); return e / e.sum(-1, keepdims=True)

def _softmax(rng):
  x = rng.standard_normal((64, 128)).astype(np.float32)
  return lambda: [Tensor(x).softmax(-1)], lambda: [_np_softmax(x)]

def _layernorm(rng):
  x, g, b = (rng.standard_normal(s).astype(np.float32) for s in ((64, 128), (128,), (128,)))
  def ref():
    c = x - x.mean(-1, keepdims=True)
    return [c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5) * g + b]
  return lambda: [Tensor(x).layernorm() * Tensor(g) + Tensor(b)], ref

def _shared(rng):   # one expensive value read by two reduces over different axes
  x, y = (rng.standard_normal((64, 96)).astype(np.float32) * 0.5 for _ in range(2))
  def build():
    e = (Tensor(x) * Tensor(y)).exp()
    return [e.sum(0).reshape(1, -1) + e.max(1).reshape(-1, 1)]
  return build, lambda: [(e := np.exp(x * y)).sum(0)[None, :] + e.max(1)[:, None]]

def _mlp_step(rng):
  x = rng.standard_normal((16, 32)).astype(np.float32)
  w1, w2 = rng.standard_normal((64, 32)).astype(np.float32) * 0.2, rng.standard_normal((8, 64)).astype(np.float32) * 0.2
  def build():
    l1, l2 = nn.Linear(32, 64, bias=False), nn.Linear(64, 8, bias=False)
    l1.weight, l2.weight = Tensor(w1).realize(), Tensor(w2).realize()
    opt = nn.optim.SGD([l1.weight, l2.weight], lr=0.5)
    with Context(TRAINING=1):
      opt.zero_grad()
      loss = l2(l1(Tensor(x)).relu()).log_softmax(-1).mean()
      loss.backward(); opt.step()
    return [loss, l1.weight, l2.weight]
  def ref():
    h = x @ w1.T; r = np.maximum(h, 0); z = r @ w2.T
    dz = 1 / z.size - _np_softmax(z) * (z.shape[-1] / z.size)   # d mean(log_softmax(z)) / dz
    gw2, dr = dz.T @ r, dz @ w2
    gw1 = ((h > 0) * dr).T @ x
    # the loss, realized with the step, reads the updated weights in stock tinygrad too: compared with stock only
    return [None, w1 - 0.5 * gw1, w2 - 0.5 * gw2]
  return build, ref

PROGRAMS = {"softmax": _softmax, "layernorm": _layernorm, "shared": _shared, "mlp_step": _mlp_step}
# values the CONTIGUOUS must cover: none fixed (priced on tinygrad's calibrated kernels, softmax stores its reduces where
# callsat's CPU model stored its exp: which values is the calibration's call; where they go is what is tested)
HINTED = {"softmax": set(), "layernorm": set(), "shared": set(), "mlp_step": set()}

@pytest.fixture(autouse=True)
def _unanchored(request, monkeypatch, tmp_path):
  """The hint mechanics are tested with every hint the partition chooses (shadow.ANCHOR off, no measured check); the
  anchor's own tests (marked `anchored`) keep the anchor, the measured check's (marked `measured`) the check."""
  if "anchored" not in request.keywords: monkeypatch.setattr(shadow, "ANCHOR", False)
  if "measured" not in request.keywords:
    monkeypatch.setenv("CALLSAT_BRIDGE_MEASURE", "0")
    yield
    return
  monkeypatch.setenv("CALLSAT_BRIDGE_DECIDE_AT", "1")   # decided at the first run (the default waits for a second)
  # each its own caches: a verdict cached under another test's margin is not its own
  bridge.set_cache(bridge.StructureCache())
  monkeypatch.setenv("CALLSAT_BRIDGE_VERDICTS_DIR", str(tmp_path / "verdicts"))
  yield
  bridge.set_cache(bridge.from_env())

def _run(name: str, mode: str | None, monkeypatch) -> tuple[list, int, dict]:
  """(values, kernels, bridge stats) of one program: stock tinygrad (mode None) or the strict bridge in `mode`."""
  build, _ = PROGRAMS[name](np.random.default_rng(7))
  if mode is not None: monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", mode)
  with Context(DEV=DEV):
    bridge.reset_stats()
    ctx = bridge.installed(strict=True) if mode is not None else _Stock()
    with ctx:
      outs = build()
      GlobalCounters.reset()
      Tensor.realize(*outs)
      kernels = GlobalCounters.kernel_count
      return [o.numpy() for o in outs], kernels, bridge.stats()

class _Stock:
  def __enter__(self): bridge.uninstall()
  def __exit__(self, *a): return False

@pytest.mark.parametrize("mode", ["cost", "cost-store"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_values_match_stock_and_numpy(name, mode, monkeypatch):
  stock, _, _ = _run(name, None, monkeypatch)
  ours, _, st = _run(name, mode, monkeypatch)
  assert st["bridged"] > 0 and st["hints"] > 0, st
  ref = PROGRAMS[name](np.random.default_rng(7))[1]()
  for a, b, r in zip(ours, stock, ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    if r is not None: np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize("name", list(PROGRAMS))
def test_kernel_counts_change_where_the_partition_stores(name, monkeypatch):
  _, stock, _ = _run(name, None, monkeypatch)
  _, off, st_off = _run(name, "rules", monkeypatch)
  _, on, st_on = _run(name, "cost", monkeypatch)
  _, store, _ = _run(name, "cost-store", monkeypatch)
  assert off == stock and st_off["hints"] == 0 and st_on["hints"] > 0
  # a hint never merges kernels; where it adds one depends on the calibration (priced on tinygrad's kernels, a kernel
  # launch costs ~50 us and most hints land where tinygrad already ends a kernel)
  assert on >= stock and store >= stock

def _body(name: str, mode: str, monkeypatch):
  """The CALL body the bridge returns for one program's graph (callsat's pass called directly) and its hints."""
  build, _ = PROGRAMS[name](np.random.default_rng(7))
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", mode)
  with Context(DEV=DEV):
    outs = build()
    call, bmap = bridge.transform_to_call(UOp.sink(*[o.uop for o in outs]))
  return call.src[0], bridge.last_hints()

@pytest.mark.parametrize("name", list(PROGRAMS))
def test_contiguous_where_the_partition_stores(name, monkeypatch):
  body, _ = _body(name, "rules", monkeypatch)
  assert not [u for u in body.toposort() if u.op is TOps.CONTIGUOUS]
  stores_off = sum(u.op is TOps.STORE for u in body.toposort())
  body, h = _body(name, "cost", monkeypatch)
  cs = [u for u in body.toposort() if u.op is TOps.CONTIGUOUS]
  assert len(cs) == len(h.idents) > 0 and h.partition is not None and h.partition.stored >= len(cs)
  assert {u.src[0].op for u in cs} <= {TOps.REDUCE, *(getattr(TOps, n) for n in ("ADD", "MUL", "EXP2", "RECIPROCAL", "SQRT", "MAX", "SUB",
                                                                                 "WHERE", "CAST", "NEG"))}
  assert HINTED[name] <= {u.src[0].op.name for u in cs}
  assert {u.op for u in h.uops} == {u.src[0].op for u in cs}
  assert all(u.src[0].dtype not in (tinygrad.dtypes.weakint, tinygrad.dtypes.weakfloat) for u in cs)
  body, h = _body(name, "cost-store", monkeypatch)
  assert not [u for u in body.toposort() if u.op is TOps.CONTIGUOUS]
  assert sum(u.op is TOps.STORE for u in body.toposort()) == stores_off + len(h.idents)

def test_off_is_the_default(monkeypatch):
  monkeypatch.delenv("CALLSAT_BRIDGE_FUSION", raising=False)
  assert bridge_fusion() == "rules"
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "")
  assert bridge_fusion() == "rules"

@pytest.mark.parametrize("name", ["softmax", "shared"])
def test_callsat_fusion_does_not_reach_the_bridge(name, monkeypatch):
  """What the bridge stores beyond tinygrad's realize points is CALLSAT_BRIDGE_FUSION's choice: CALLSAT_FUSION=cost (a
  setting for callsat's own path) leaves the bridge's CALL as it is."""
  monkeypatch.delenv("CALLSAT_FUSION", raising=False)
  body, _ = _body(name, "rules", monkeypatch)
  monkeypatch.setenv("CALLSAT_FUSION", "cost")
  body2, _ = _body(name, "rules", monkeypatch)
  assert [(u.op, u.dtype, u.arg) for u in body2.toposort()] == [(u.op, u.dtype, u.arg) for u in body.toposort()]

def test_the_mode_follows_the_environment_on_every_call(monkeypatch):
  """The bridge reads CALLSAT_BRIDGE_FUSION on each call (its own fast read of os.environ): every set, change and unset
  of os.environ is seen at once, a non-ASCII value is read back as os.environ holds it."""
  monkeypatch.delenv("CALLSAT_BRIDGE_FUSION", raising=False)
  assert bridge_fusion() == "rules"
  for m in ("cost", "cost-store", "rules", "cost"):
    os.environ["CALLSAT_BRIDGE_FUSION"] = m
    assert bridge_fusion() == m
  del os.environ["CALLSAT_BRIDGE_FUSION"]
  assert bridge_fusion() == "rules"
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "cöst")
  with pytest.raises(CallsatError, match="'cöst'"): bridge_fusion()

def test_bad_mode_raises_in_both_bridge_modes(monkeypatch):
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "fast")
  with pytest.raises(CallsatError, match="CALLSAT_BRIDGE_FUSION"): bridge_fusion()
  for strict in (True, False):
    with Context(DEV=DEV), bridge.installed(strict=strict):
      with pytest.raises(CallsatError, match="CALLSAT_BRIDGE_FUSION"): (Tensor.ones(4, 4).contiguous() + 1).realize()

def test_shadow_prices_tinygrad_arithmetic():
  with Context(DEV=DEV):
    x = Tensor(np.ones((8, 16), np.float32)).realize()
    y = (x * 2 + 1).softmax(-1)
    cv, roots = to_callsat(UOp.sink(y.uop))
  assert {n.arg.name for n in roots[0].toposort() if n.op is Ops.OPAQUE} >= {"EXP2", "REDUCE", "MUL"}
  shadow = Shadow(cv, DEV).build(roots)
  ops = {n.op for n in shadow[0].toposort()}
  assert {Ops.EXP2, Ops.REDUCE, Ops.RECIPROCAL, Ops.EXPAND} <= ops and Ops.OPAQUE not in ops
  assert shadow[0].shape == roots[0].shape == (8, 16) and shadow[0].device == "CPU"

def test_no_hints_for_realize_points_on_two_devices():
  with Context(DEV=DEV):
    x = Tensor(np.ones((4, 4), np.float32)).realize()
    y = x.to("PYTHON") + 1
    cv, roots = to_callsat(UOp.sink(y.uop, (x * 2).uop))
  h = cost_hints(cv, roots)
  assert not h.idents and "devices" in h.note

# ---- the anchor (issue 28): priced on tinygrad's calibrated kernels, hints only past the model's error ----------------

def _hints_of(name: str, monkeypatch):
  build, _ = PROGRAMS[name](np.random.default_rng(7))
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "cost")
  with Context(DEV=DEV):
    outs = build()
    cv, roots = to_callsat(UOp.sink(*[o.uop for o in outs]), consts=True)
    return cost_hints(cv, roots), outs

@pytest.mark.anchored
def test_anchor_drops_hints_within_the_models_error(monkeypatch):
  """With the calibration's error made huge no predicted gain exceeds it: no hints, the report says why and gives the
  predicted stock and hinted times; with no error at all, the same graph's strictly better partition would be hinted."""
  tm, err = shadow.tinygrad_model("CPU")
  assert err > 0   # the shipped calibration measured its held-out error
  monkeypatch.setattr(shadow, "_MODELS", {k: (tm, 50.0) for k in shadow._MODELS} | {shadow.tinygrad_device_key(
    shadow.version("tinygrad"), "CPU"): (tm, 50.0)})
  h, _ = _hints_of("softmax", monkeypatch)
  assert not h.idents and "within the model's error" in h.note and h.stock_s is not None and h.hinted_s is not None
  assert h.hinted_s <= h.stock_s   # the solver never chooses a partition predicted slower than the rules-like one

@pytest.mark.anchored
def test_uncalibrated_tinygrad_gets_no_hints_and_says_so(monkeypatch):
  monkeypatch.setattr(shadow, "version", lambda name: "0.0.0-uncalibrated")
  monkeypatch.setattr(shadow, "_MODELS", {})
  h, _ = _hints_of("softmax", monkeypatch)
  assert not h.idents and "no calibration of tinygrad 0.0.0-uncalibrated's kernels on CPU" in h.note

@pytest.mark.anchored
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_anchored_cost_mode_gives_stock_values_and_never_more_kernels_without_hints(name, monkeypatch):
  """Default cost mode on the test programs: values equal to stock exactly where no hint was given (the CALL is
  strict's), and never more kernels than stock when the anchor dropped every hint."""
  stock, nk_stock, _ = _run(name, None, monkeypatch)
  ours, nk, st = _run(name, "cost", monkeypatch)
  if st["hints"] == 0:
    assert nk == nk_stock
    for a, b in zip(ours, stock): np.testing.assert_array_equal(a, b)
  else:
    for a, b in zip(ours, stock): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

@pytest.mark.anchored
def test_explore_hands_the_rules_like_stores_to_the_measured_check_where_no_win_is_predicted(monkeypatch):
  """With the calibration's error made huge no hint passes the anchor; exploring, callsat's rules-like stores come back
  marked explored (for the measured check alone), without it nothing does."""
  tm, _ = shadow.tinygrad_model("CPU")
  monkeypatch.setattr(shadow, "_MODELS", {shadow.tinygrad_device_key(shadow.version("tinygrad"), "CPU"): (tm, 50.0)})
  h, _ = _hints_of("layernorm", monkeypatch)
  assert not h.idents and not h.explored
  build, _ = PROGRAMS["layernorm"](np.random.default_rng(7))
  with Context(DEV=DEV):
    cv, roots = to_callsat(UOp.sink(*[o.uop for o in build()]), consts=True)
  x = cost_hints(cv, roots, explore=True)
  assert x.explored and x.idents and "explored" in x.note and "hints dropped" in x.note
  assert all(u.op in (TOps.REDUCE,) or u.op.name in shadow._ALU for u in x.uops)
  monkeypatch.setattr(shadow, "ANCHOR", False)
  free = cost_hints(cv, roots)   # the partition's own stores, unanchored
  if free.idents and free.hinted_s < free.stock_s:   # a gain within the error: the partition's stores are explored
    assert x.idents == free.idents and "of the partition's stores" in x.note
  else: assert "of callsat's rules-like stores" in x.note

@pytest.mark.anchored
def test_explore_takes_the_partitions_stores_where_it_predicts_a_gain_within_the_error(monkeypatch):
  """A predicted gain too small for the model's error: exploring measures the partition's own stores (the model's best
  guess), not callsat's rules-like ones; a predicted loss: the rules-like ones."""
  tm, _ = shadow.tinygrad_model("CPU")
  monkeypatch.setattr(shadow, "_MODELS", {shadow.tinygrad_device_key(shadow.version("tinygrad"), "CPU"): (tm, 50.0)})
  stock = {}
  real = shadow.partition_ids
  def partition(*a):   # the solver's answer with its predicted time set below (a gain) or above (a loss) stock's
    ids, rep = real(*a)
    return ids, dataclasses.replace(rep, predicted_s=rep.rules_s * stock["ratio"])
  monkeypatch.setattr(shadow, "partition_ids", partition)
  build, _ = PROGRAMS["softmax"](np.random.default_rng(7))
  with Context(DEV=DEV):
    cv, roots = to_callsat(UOp.sink(*[o.uop for o in build()]), consts=True)
  monkeypatch.setattr(shadow, "ANCHOR", False)
  stock["ratio"] = 0.9
  free = cost_hints(cv, roots)
  monkeypatch.setattr(shadow, "ANCHOR", True)
  gain = cost_hints(cv, roots, explore=True)
  assert free.idents and gain.explored and gain.idents == free.idents and "of the partition's stores" in gain.note
  stock["ratio"] = 1.1
  loss = cost_hints(cv, roots, explore=True)
  assert loss.explored and "of callsat's rules-like stores" in loss.note and "no faster than the schedule without them" in loss.note
  assert gain.alternative == loss.idents != gain.idents and not loss.alternative   # the rules-like stores come second

def _gain_within_the_error(monkeypatch) -> None:
  """The calibration's error made huge and the solver's partition predicted 10 % faster than stock: no hint passes,
  exploring measures the partition's stores, then the rules-like ones."""
  tm, _ = shadow.tinygrad_model("CPU")
  monkeypatch.setattr(shadow, "_MODELS", {shadow.tinygrad_device_key(shadow.version("tinygrad"), "CPU"): (tm, 50.0)})
  real = shadow.partition_ids
  def partition(*a):
    ids, rep = real(*a)
    return ids, dataclasses.replace(rep, predicted_s=rep.rules_s * 0.9)
  monkeypatch.setattr(shadow, "partition_ids", partition)

@pytest.mark.anchored
@pytest.mark.measured
def test_the_rules_like_stores_are_measured_where_the_explored_partition_loses(monkeypatch):
  """End to end: the partition's stores measured no faster, the rules-like ones measured faster: those are kept (values
  within float reassociation of stock's), and a later process (a fresh structural cache, the same kept verdicts) takes
  them from the verdict without measuring."""
  _gain_within_the_error(monkeypatch)
  ratios, seen = [1.0, 0.5], []
  def fake(stock, hinted, device, eager=False):
    seen.append(hinted)
    return measure.Measured(1e-3, 1e-3 * ratios[len(seen) - 1], 5, 0.0, ratios[len(seen) - 1])
  monkeypatch.setattr(install, "measure", fake)
  stock, _, _ = _run("softmax", None, monkeypatch)
  ours, _, st = _run("softmax", "cost", monkeypatch)
  h = bridge.last_hints()
  assert st["measured"] == 2 and st["measure_dropped"] == 1 and h.idents and "then" in h.note and "rules-like" in h.note, st
  for a, b in zip(ours, stock): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  kept = h.idents
  bridge.set_cache(bridge.StructureCache())
  again, _, st2 = _run("softmax", "cost", monkeypatch)
  assert st2["measured"] == 0 and st2["verdicts_reused"] >= 1 and bridge.last_hints().idents == kept and len(seen) == 2, st2
  for a, b in zip(again, ours): np.testing.assert_array_equal(a, b)

def test_explore_setting_is_checked(monkeypatch):
  for v, want in (("", True), ("0", False), ("1", True)):   # on by default
    monkeypatch.setenv("CALLSAT_BRIDGE_EXPLORE", v)
    assert shadow.explore_setting() is want
  monkeypatch.setenv("CALLSAT_BRIDGE_EXPLORE", "yes")
  with pytest.raises(CallsatError, match="CALLSAT_BRIDGE_EXPLORE must be 0 or 1"): shadow.explore_setting()

@pytest.mark.anchored
@pytest.mark.measured
@pytest.mark.parametrize("margin,explore", [(0.999, None), (-100.0, None), (-100.0, "0")])
def test_explored_hints_are_kept_only_when_measured_faster(margin, explore, monkeypatch):
  """End to end, the anchor blocking every predicted hint: cost mode explores by default; explored hints lost to a
  margin nothing beats give stock's kernels and values exactly; kept under a margin everything beats, they give stock's
  values within float reassociation; CALLSAT_BRIDGE_EXPLORE=0 explores nothing (stock's kernels, no measurement)."""
  tm, _ = shadow.tinygrad_model("CPU")
  monkeypatch.setattr(shadow, "_MODELS", {shadow.tinygrad_device_key(shadow.version("tinygrad"), "CPU"): (tm, 50.0)})
  monkeypatch.setattr(measure, "MARGIN", margin)
  if explore is None: monkeypatch.delenv("CALLSAT_BRIDGE_EXPLORE", raising=False)
  else: monkeypatch.setenv("CALLSAT_BRIDGE_EXPLORE", explore)
  stock, nk_stock, _ = _run("layernorm", None, monkeypatch)
  ours, nk, st = _run("layernorm", "cost", monkeypatch)
  if explore == "0":
    assert st["measured"] == 0 and st["explored"] == 0 and st["hints"] == 0 and nk == nk_stock, st
    for a, b in zip(ours, stock): np.testing.assert_array_equal(a, b)
    return
  assert st["measured"] >= 1 and st["explored"] >= 1 and bridge.last_hints().explored, st
  if margin > 0:
    assert st["hints"] == 0 and nk == nk_stock
    for a, b in zip(ours, stock): np.testing.assert_array_equal(a, b)
  else:
    assert st["hints"] > 0
    for a, b in zip(ours, stock): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

# ---- the measured check (issue 28): hints kept only when tinygrad runs them faster ---------------------------------------

def test_a_measured_win_needs_the_median_ratio_and_the_best_times():
  """Hints are kept only when the rounds' median ratio and the two best times both say faster by more than the margin:
  a burst of load in some rounds moves one of them, not both."""
  M, m = measure.Measured, measure.MARGIN
  assert M(1e-3, 0.5e-3, 5, 0.0, 0.5).keep
  assert not M(1e-3, 1e-3, 5, 0.0, 0.5).keep                 # the median says faster, the best times do not
  assert not M(1e-3, 0.5e-3, 5, 0.0, 1.0).keep               # the best times say faster, the median does not
  assert not M(1e-3, 1e-3 * (1 - m), 5, 0.0, 1 - m).keep     # exactly the margin is not more than it

@pytest.mark.measured
@pytest.mark.parametrize("name", ["softmax", "mlp_step"])
def test_measured_check_drops_hints_that_do_not_win(name, monkeypatch):
  """A margin no schedule can beat: every structure with hints is measured, its hints dropped, and the CALL is the
  rules-mode one (stock's values exactly, stock's kernels), the report saying why with both times. mlp_step assigns
  its weights: the measurement ran on scratch copies, so the SGD update is applied once."""
  monkeypatch.setattr(measure, "MARGIN", 0.999)
  stock, nk_stock, _ = _run(name, None, monkeypatch)
  ours, nk, st = _run(name, "cost", monkeypatch)
  assert st["measured"] >= 1 and st["measure_dropped"] == st["measured"] and st["hints"] == 0, st
  assert nk == nk_stock
  for a, b in zip(ours, stock): np.testing.assert_array_equal(a, b)
  h = bridge.last_hints()
  assert not h.idents and "measured" in h.note and h.measured.stock_s > 0 and h.measured.hinted_s > 0

@pytest.mark.measured
@pytest.mark.parametrize("name", ["softmax", "mlp_step"])
def test_measured_check_keeps_hints_that_win(name, monkeypatch):
  """A margin every schedule beats: the hints stay (CONTIGUOUS in the CALL, more kernels), values still stock's within
  float reassociation, the weights updated once."""
  monkeypatch.setattr(measure, "MARGIN", -100.0)
  stock, _, _ = _run(name, None, monkeypatch)
  ours, _, st = _run(name, "cost", monkeypatch)
  assert st["measured"] >= 1 and st["measure_dropped"] == 0 and st["hints"] > 0, st
  for a, b in zip(ours, stock): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert bridge.last_hints().measured is not None

def _softmax_runs(monkeypatch, margin: float) -> list[dict]:
  """Three softmax graphs of one structure (other buffers) through the strict bridge in cost mode, the measured check
  under `margin`: each one's values checked against numpy; the bridge's stats after each."""
  monkeypatch.setattr(measure, "MARGIN", margin)
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "cost")
  with Context(DEV=DEV), bridge.installed(strict=True):
    bridge.reset_stats()
    runs = []
    for seed in range(3):
      x = np.random.default_rng(seed).standard_normal((64, 128)).astype(np.float32)
      np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), _np_softmax(x), rtol=1e-5, atol=1e-6)
      runs.append(bridge.stats())
  return runs

@pytest.mark.measured
def test_a_measured_decision_is_reused_for_the_same_structure(monkeypatch):
  """The second graph of the same structure (other buffers) is a structural-cache hit: no second measurement, the
  same verdict."""
  st = _softmax_runs(monkeypatch, 0.999)[-1]
  assert st["measured"] == 1 and st["cache"]["hits"] >= 2, st

@pytest.mark.measured
def test_hints_wait_for_a_structures_second_run(monkeypatch):
  """With the default CALLSAT_BRIDGE_DECIDE_AT a structure's first graph gets the plain rules CALL (no hints chosen, no
  measurement, counted undecided); its second is decided (hints chosen and measured once), the third reuses that."""
  monkeypatch.delenv("CALLSAT_BRIDGE_DECIDE_AT")
  seen = [(st["undecided"], st["measured"], st["hinted"]) for st in _softmax_runs(monkeypatch, -100.0)]   # hints always win
  assert seen[0][0] >= 1 and seen[0][1:] == (0, 0), seen
  assert seen[1][0] == seen[0][0] and seen[1][1] == 1 and seen[1][2] >= 1, seen
  assert seen[2][:2] == seen[1][:2] and seen[2][2] > seen[1][2], seen

@pytest.mark.measured
def test_measuring_failure_drops_hints_in_fallback_and_raises_in_strict(monkeypatch):
  import egraph.tinygrad as br
  def broken(stock, hinted, device, eager=False): raise RuntimeError("no timer today")
  monkeypatch.setattr(br, "measure", broken)
  stock, _, _ = _run("softmax", None, monkeypatch)
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "cost")
  build, _ = PROGRAMS["softmax"](np.random.default_rng(7))
  with Context(DEV=DEV):
    bridge.reset_stats()
    with bridge.installed(strict=False):
      out = build()[0].numpy()
    st = bridge.stats()
    np.testing.assert_array_equal(out, stock[0])
    assert st["measure_errors"] == 1 and st["hints"] == 0 and "measuring failed" in bridge.last_hints().note
    assert st["cache"]["stored"] == 0   # fallback's answer for this call only: strict, same structure, meets the error
    with bridge.installed(strict=True), pytest.raises(RuntimeError, match="no timer today"): build()[0].numpy()

def test_scratch_copies_buffers_and_leaves_the_originals_alone():
  with Context(DEV=DEV):
    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    y = (x * 2).realize()
    call = UOp.sink(x.uop.base, y.uop.base)
    (new,) = measure.scratch([call])
  olds = {u for u in call.toposort() if u.op is TOps.BUFFER}
  news = [u for u in new.toposort() if u.op is TOps.BUFFER]
  assert len(news) == 2 and not olds & set(news)
  np.testing.assert_array_equal(news[0].buffer.numpy(), np.arange(8, dtype=np.float32))
  np.testing.assert_array_equal(news[1].buffer.numpy(), np.arange(8, dtype=np.float32) * 2)
  with Context(DEV=DEV):
    news[0].buffer.copy_from(Tensor(np.zeros(8, np.float32)).realize().uop.base.buffer)
    np.testing.assert_array_equal(x.numpy(), np.arange(8, dtype=np.float32))
  np.testing.assert_array_equal(news[0].buffer.numpy(), np.zeros(8, np.float32))

def test_a_reduce_reading_no_memory_is_folded_when_pricing_tinygrads_kernels():
  """An arange (tinygrad builds it as a reduce over constants) stays OPAQUE in a shadow that prices tinygrad's kernels
  (tinygrad folds it into index arithmetic) and is a REDUCE otherwise; a reduce over a buffer is a REDUCE in both."""
  with Context(DEV=DEV):
    x = Tensor(np.ones(16, np.float32)).realize()
    cv, roots = to_callsat(UOp.sink((x * Tensor.arange(16).float()).uop, (x.reshape(16, 1) * x.reshape(1, 16)).sum(1).uop), consts=True)
  def count(folds, op): return [sum(n.op is op for n in r.toposort()) for r in Shadow(cv, DEV, folds=folds).build(roots)]
  assert count(False, Ops.REDUCE) == [1, 1] and count(False, Ops.OPAQUE) == [0, 0]
  assert count(True, Ops.REDUCE) == [0, 1] and count(True, Ops.OPAQUE) == [1, 0]

@pytest.mark.measured
@pytest.mark.parametrize("jit", [False, True])
def test_a_graph_outside_a_jit_is_measured_as_an_eager_call(jit, monkeypatch):
  """Outside a TinyJit capture the measured check times each run with its scheduling and lowering (what an eager call
  pays per kernel); under a capture it times the run alone, decided again for the capture (the JIT's first call ran the
  same structure eagerly). Values are numpy's either way."""
  import egraph.tinygrad as br
  from tinygrad import TinyJit
  seen = []
  def spy(stock, hinted, device, eager=False):
    seen.append(eager)
    return measure.measure(stock, hinted, device, eager)
  monkeypatch.setattr(br, "measure", spy)
  monkeypatch.setattr(measure, "MARGIN", -100.0)
  monkeypatch.setenv("CALLSAT_BRIDGE_DECIDE_AT", "1")
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "cost")
  monkeypatch.setattr(shadow, "ANCHOR", False)
  x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
  with Context(DEV=DEV), bridge.installed(strict=True):
    bridge.reset_stats()
    f = (lambda t: t.softmax(-1).realize())
    g = TinyJit(f) if jit else f
    for _ in range(3): np.testing.assert_allclose(g(Tensor(x)).numpy(), _np_softmax(x), rtol=1e-5, atol=1e-6)
    st = bridge.stats()
  assert seen == ([True, False] if jit else [True]), seen
  assert st["measured"] == len(seen) and st["measure_seconds"] > 0, st

def test_measure_setting_is_checked(monkeypatch):
  monkeypatch.setenv("CALLSAT_BRIDGE_MEASURE", "yes")
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "cost")
  with Context(DEV=DEV), bridge.installed(strict=False), pytest.raises(CallsatError, match="CALLSAT_BRIDGE_MEASURE"):
    (Tensor([1.0, 2.0]) + 1).numpy()

# ---- verdicts kept per user (egraph/bridge/verdicts.py) ------------------------------------------------------------------

def _fresh_process():
  """What a new process starts with: no structural cache entry (the verdict directory is the user's, kept)."""
  bridge.set_cache(bridge.StructureCache())

@pytest.mark.measured
@pytest.mark.parametrize("margin", [0.999, -100.0])
def test_a_verdict_is_kept_for_the_next_process(margin, monkeypatch):
  """Measured once, the verdict is reused by a later process: no second measurement; a lost verdict does not even
  choose the hints again (cost_hints is not called), a won one applies them again; values are stock's."""
  import egraph.tinygrad as br
  monkeypatch.setattr(measure, "MARGIN", margin)
  stock, _, _ = _run("softmax", None, monkeypatch)
  first, _, st1 = _run("softmax", "cost", monkeypatch)
  assert st1["measured"] == 1 and st1["verdicts_reused"] == 0
  _fresh_process()
  if margin > 0:
    def no_choice(cv, roots, *_): raise AssertionError("hints chosen again after a lost verdict")
    monkeypatch.setattr(br, "cost_hints", no_choice)
  second, _, st2 = _run("softmax", "cost", monkeypatch)
  assert st2["measured"] == 0 and st2["verdicts_reused"] == 1 and (st2["hints"] > 0) == (margin < 0), st2
  assert bridge.last_hints().measured is not None
  for a, b, c in zip(first, second, stock):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)

@pytest.mark.measured
def test_a_tampered_verdict_is_measured_again(monkeypatch, tmp_path):
  monkeypatch.setattr(measure, "MARGIN", 0.999)
  _run("softmax", "cost", monkeypatch)
  d = tmp_path / "verdicts"
  names = [p for p in d.iterdir() if len(p.name) == 64]
  assert len(names) == 1
  raw = bytearray(names[0].read_bytes()); raw[-3] ^= 1; names[0].write_bytes(bytes(raw))
  _fresh_process()
  _, _, st = _run("softmax", "cost", monkeypatch)
  assert st["measured"] == 1 and st["verdicts_reused"] == 0, st

def test_verdicts_are_bounded_and_read_back(tmp_path):
  from egraph.bridge.verdicts import Verdicts, Verdict, digest
  vs = Verdicts(str(tmp_path / "v"), max_entries=3)
  names = [digest("graph", i) for i in range(5)]
  for i, n in enumerate(names): vs.put(n, Verdict(i % 2 == 0, (i, i + 1), 1e-3, 2e-3, 5, 2.0))
  kept = {i for i, n in enumerate(names) if vs.get(n) is not None}
  assert len(kept) == 3   # which go depends on the file system's mtime resolution: the oldest, ties in any order
  for i in kept: assert vs.get(names[i]) == Verdict(i % 2 == 0, (i, i + 1), 1e-3, 2e-3, 5, 2.0)

def test_verdict_setting_is_checked(monkeypatch):
  monkeypatch.setenv("CALLSAT_BRIDGE_VERDICTS", "maybe")
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "cost")
  with Context(DEV=DEV), bridge.installed(strict=False), pytest.raises(CallsatError, match="CALLSAT_BRIDGE_VERDICTS"):
    (Tensor([1.0, 2.0]) + 1).numpy()
