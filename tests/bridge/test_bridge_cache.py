"""The bridge's structural cache (egraph/bridge/cache.py): a graph of a structure seen before is rebound, never given
another graph's CALL. Each check compares a cached result with the one decided anew for the same graph (body by
identity, args and buffer_map up to the numbering of fresh buffers), or realizes values against stock tinygrad."""
import gc, threading, weakref
import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")
from tinygrad import Tensor, Variable, dtypes, Context, nn   # noqa: E402
from tinygrad.uop.ops import UOp, Ops as TOps   # noqa: E402
from tinygrad.dtype import AddrSpace   # noqa: E402
from egraph import tinygrad as bridge   # noqa: E402
from egraph.bridge.cache import StructureCache, structure, from_env   # noqa: E402
from egraph.bridge.convert import BridgeRefusal   # noqa: E402
from egraph.ir.errors import CallsatError   # noqa: E402

@pytest.fixture
def cache():
  c = StructureCache()
  bridge.set_cache(c)
  yield c
  bridge.set_cache(from_env())

def _canon(call: UOp, bmap: dict, sink: UOp):
  """The result with the graph's nodes named by toposort position and fresh buffers by first appearance."""
  pos = {u: i for i, u in enumerate(sink.toposort())}
  fresh: dict = {}
  def c(u):
    if u in pos: return ("g", pos[u])
    if u.op is TOps.BUFFER and u.arg.addrspace is AddrSpace.GLOBAL:
      return ("fresh", fresh.setdefault(u.arg.slot, len(fresh)), u.dtype, u.arg.device, c(u.src[0]))
    return (u.op, u.dtype, u.arg, tuple(c(s) for s in u.src))
  return call.src[0], tuple(c(a) for a in call.src[1:]), sorted((pos[k], repr(c(v))) for k, v in bmap.items())

def _decided(make, cache):
  """(cached result, result decided anew) for a fresh graph of `make`'s structure, after one call filled the cache."""
  bridge.transform_to_call(UOp.sink(*[t.uop for t in make()]))
  sink = UOp.sink(*[t.uop for t in make()])
  hits = cache.hits
  got = bridge.transform_to_call(sink)
  assert cache.hits == hits + 1, "the second graph of the same structure missed"
  bridge.set_cache(None)
  try: want = bridge.transform_to_call(sink)
  finally: bridge.set_cache(cache)
  return _canon(*got, sink), _canon(*want, sink), got

def _copy_in(): return [Tensor([1.0, 2.0, 3.0], device="PYTHON")]
def _item():
  a = Tensor.empty(4, 4, device="PYTHON").realize()
  return [(a + 3).sum()]
def _contig_sum():
  b = Tensor.empty(4, 4, device="PYTHON").realize()
  return [(b * 2).contiguous().sum(1)]
def _sgd():
  w, g = Tensor.empty(8, device="PYTHON").realize(), Tensor.empty(8, device="PYTHON").realize()
  return [w.assign(w * 0.99 - 0.01 * g)]
def _views():
  a = Tensor.empty(6, 4, device="PYTHON").realize()
  return [a[2:4].contiguous(), a[1:].bitcast(dtypes.int32).contiguous(), (a.T + 1).contiguous()]
def _layernorm():
  ln = nn.LayerNorm(5)
  return [ln(Tensor.empty(3, 5, device="PYTHON").realize())]

@pytest.mark.parametrize("make", [_copy_in, _item, _contig_sum, _sgd, _views, _layernorm], ids=lambda f: f.__name__[1:])
def test_cached_result_is_the_one_decided_anew(make, cache):
  got, want, (call, bmap) = _decided(make, cache)
  assert got[0] is want[0], "the body (tinygrad's schedule-cache key) differs"
  assert got[1:] == want[1:]

def test_cached_result_names_the_new_graphs_buffers_and_new_fresh_ones(cache):
  a = Tensor.empty(4, 4, device="PYTHON").realize()
  call1, map1 = bridge.transform_to_call(UOp.sink((a * 2).contiguous().uop))
  b = Tensor.empty(4, 4, device="PYTHON").realize()
  call2, map2 = bridge.transform_to_call(UOp.sink((b * 2).contiguous().uop))
  assert cache.hits == 1 and call1.src[0] is call2.src[0]
  assert b.uop.base in call2.src[1:] and a.uop.base not in call2.src[1:]
  fresh1 = {u for u in call1.src[1:] if u is not a.uop.base}
  fresh2 = {u for u in call2.src[1:] if u is not b.uop.base}
  assert fresh1 and fresh2 and not fresh1 & fresh2, "a fresh buffer was handed out twice"
  assert all(k in UOp.sink((b * 2).contiguous().uop).toposort() for k in map2)

@pytest.mark.parametrize("other", ["dtype", "shape", "device", "constant", "op", "aliasing"])
def test_other_graphs_miss(other, cache):
  """Same program text, something else differs: a different key, so no hit."""
  def make(dt=dtypes.float32, n=4, dev="PYTHON", k=2.0, op="mul", alias=False):
    a = Tensor.empty(n, dtype=dt, device=dev).realize()
    b = a if alias else Tensor.empty(n, dtype=dt, device=dev).realize()
    return UOp.sink(((a * k if op == "mul" else a + k) + b).contiguous().uop)
  variant = {"dtype": dict(dt=dtypes.float16), "shape": dict(n=5), "device": dict(dev="PYTHON:1"), "constant": dict(k=3.0),
             "op": dict(op="add"), "aliasing": dict(alias=True)}[other]
  bridge.transform_to_call(make())
  assert structure(make()).key == structure(make()).key
  assert structure(make(**variant)).key != structure(make()).key
  hits = cache.hits
  bridge.transform_to_call(make(**variant))
  assert cache.hits == hits

def test_negative_zero_and_nan_constants_are_apart():
  a = Tensor.empty(3, device="PYTHON").realize()
  keys = {structure(UOp.sink((a * k).contiguous().uop)).key for k in (0.0, -0.0, float("nan"))}
  assert len(keys) == 3

def test_bound_values_share_an_entry_and_keep_their_own_values(cache):
  """A bound Variable's value is an argument: other values hit the same entry and compute their own numbers."""
  x = Tensor(np.arange(24, dtype=np.float32).reshape(6, 4), device="PYTHON").realize()
  got = []
  with bridge.installed(strict=True):
    for i in (2, 5, 3):
      v = Variable("v", 1, 6).bind(i)
      got.append(x[:v].sum(0).contiguous().realize().numpy())
  want = [np.arange(24, dtype=np.float32).reshape(6, 4)[:i].sum(0) for i in (2, 5, 3)]
  for g, w in zip(got, want): np.testing.assert_array_equal(g, w)
  assert cache.hits >= 2

def test_a_bound_value_equal_to_a_shape_shares_the_entry(cache):
  """v bound to 3 beside `x[:3]`: tinygrad makes the two 3s one UOp, but the walk never enters the binding, so v=5
  beside `x[:3]` is the same structure (a decode loop's position meeting a shape); each gets its own values."""
  x = Tensor(np.arange(6, dtype=np.float32), device="PYTHON").realize()
  make = lambda i: x[:Variable("v", 1, 6).bind(i)].sum() + x[:3].sum()
  keys = {structure(UOp.sink(make(i).uop)).key for i in (3, 5)}
  assert len(keys) == 1
  assert structure(UOp.sink(make(3).uop)).key != structure(UOp.sink((x[:Variable("v", 1, 6).bind(3)].sum() + x[:4].sum()).uop)).key
  with bridge.installed(strict=True): out = [make(i).item() for i in (3, 5, 3, 2)]
  assert out == [6.0, 13.0, 6.0, 4.0] and cache.hits >= 2

def test_a_binding_read_elsewhere_keys_its_value():
  """A binding STORE that something besides its Variable's AFTER reads: the key keeps every value."""
  v = Variable("v", 1, 9)
  a, b = v.bind(3), v.bind(4)
  sink = lambda x: UOp.sink(x, x.src[1])   # the STORE itself as a root
  assert structure(sink(a)).key != structure(sink(b)).key
  assert structure(UOp.sink(a)).key == structure(UOp.sink(b)).key

def test_entries_keep_no_buffer_alive(cache):
  a = Tensor.empty(64, device="PYTHON").realize()
  ref = weakref.ref(a.uop.base)
  bridge.transform_to_call(UOp.sink((a * 2).contiguous().uop))
  assert cache.stats()["entries"] == 1
  del a; gc.collect()
  assert ref() is None, "the cache keeps the graph's buffer alive"

def test_bounded_least_recently_used():
  c = StructureCache(entries=2)
  for k in "abc": c.put((k,), object(), 1)
  assert c.get(("a",)) is None and c.get(("c",)) is not None and c.stats()["evicted"] == 1
  c = StructureCache(entries=10, nodes=5)
  c.put("a", object(), 4); c.put("b", object(), 3)
  assert c.stats()["entries"] == 1 and c.stats()["nodes"] == 3
  with pytest.raises(CallsatError, match="limits"): StructureCache(entries=-1)

def test_env_setting(monkeypatch):
  monkeypatch.setenv("CALLSAT_BRIDGE_CACHE", "0"); assert from_env() is None
  monkeypatch.setenv("CALLSAT_BRIDGE_CACHE", "7"); assert from_env().max_entries == 7
  monkeypatch.setenv("CALLSAT_BRIDGE_CACHE", "lots")
  with pytest.raises(CallsatError, match="CALLSAT_BRIDGE_CACHE"): from_env()

def test_refusals_are_cached_and_still_counted(cache):
  bridge.reset_stats()
  opts = lambda: (Tensor([1.0, 2.0], device="PYTHON") + 1).contiguous(arg=(1,)).realize()   # CONTIGUOUS with options
  with bridge.installed(strict=True):
    for _ in range(2):
      with pytest.raises(BridgeRefusal, match=r"form:contiguous-with-options"): opts()
  with bridge.installed(strict=False): opts()
  s = bridge.stats()
  assert s["refused"] >= 2 and s["reasons"].get("form:contiguous-with-options", 0) >= 3 and cache.hits >= 1

def test_values_equal_stock_under_threads(cache):
  """Threads realize graphs of one structure with their own data through the bridge: each gets its own numbers."""
  rng = np.random.default_rng(0)
  data = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(16)]
  out, errors = [None] * len(data), []
  def work(i):
    try:
      x = Tensor(data[i], device="PYTHON")
      out[i] = ((x * 2 + 1).relu().sum(1) - x.max(1)).numpy()
    except Exception as e: errors.append(e)
  with bridge.installed(strict=True):
    work(0)   # fills the cache: the threads then rebind at once, and decide anew where they race it
    ts = [threading.Thread(target=work, args=(i,)) for i in range(1, len(data))]
    for t in ts: t.start()
    for t in ts: t.join()
  assert not errors, errors
  for d, o in zip(data, out): np.testing.assert_allclose(o, np.maximum(d * 2 + 1, 0).sum(1) - d.max(1), rtol=1e-6)
  assert cache.hits > 0

def test_sgd_loop_values_equal_stock(cache):
  """An eager optimizer loop, every step after the first from the cache, against stock tinygrad step by step."""
  def run(bridged):
    with Context(DEV="PYTHON"):
      Tensor.manual_seed(3)
      l = nn.Linear(4, 2)
      opt = nn.optim.SGD(nn.state.get_parameters(l), lr=0.1)
      xs = np.random.default_rng(3).standard_normal((5, 3, 4)).astype(np.float32)
      losses = []
      ctx = bridge.installed(strict=True) if bridged else _nothing()
      with ctx, Context(TRAINING=1):
        for i in range(5):
          opt.zero_grad(); loss = l(Tensor(xs[i])).square().mean(); loss.backward(); opt.step()
          losses.append(loss.item())
      return losses, l.weight.numpy()
  stock, ours = run(False), run(True)
  assert stock[0] == ours[0]
  np.testing.assert_array_equal(stock[1], ours[1])
  assert cache.hits > 0

class _nothing:
  def __enter__(self): return self
  def __exit__(self, *a): return False

def test_a_result_without_failed_hints_is_not_cached(cache, monkeypatch):
  """Cost mode, fallback: choosing the hints raises, the CALL goes on without them and that is counted; it is not
  cached, so strict mode on the same structure meets the error (and a later call may choose hints again)."""
  import egraph.tinygrad as br
  def broken(cv, roots, *_): raise RuntimeError("no hints today")
  monkeypatch.setattr(br, "cost_hints", broken)
  monkeypatch.setenv("CALLSAT_BRIDGE_FUSION", "cost")
  monkeypatch.setenv("CALLSAT_BRIDGE_DECIDE_AT", "1")   # every call decides (the default runs a first sighting plain)
  data = np.arange(16, dtype=np.float32).reshape(4, 4)
  prog = lambda: (Tensor(data, device="PYTHON").realize() + 3).sum().numpy()
  bridge.reset_stats()
  with bridge.installed(strict=False):
    for _ in range(2): assert prog() == (data + 3).sum()
  s = bridge.stats()
  assert s["bridged"] >= 4 and s["hint_errors"] == s["bridged"] and cache.stats()["stored"] == 0
  with bridge.installed(strict=True):
    with pytest.raises(RuntimeError, match="no hints today"): prog()
