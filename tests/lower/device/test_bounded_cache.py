"""The kernel cache bounded by bytes (lower/device/cache.py): slabs of compiled code and schedules evicted least
recently used first, values right after eviction (recompiled), a kernel in use kept alive, and the same under threads."""
import threading
import numpy as np
import pytest
from egraph import Tensor
from lower.device import cache as kcache
from lower.device.cache import KernelCache

@pytest.fixture
def tiny(monkeypatch):
  """A kernel cache that keeps about two slabs of 2 modules each, and a few schedules."""
  monkeypatch.setattr(kcache, "SLAB_MODULES", 2)
  c = KernelCache(kernel_mb=2 * kcache.ENGINE_BYTES / 2**20 + 0.2, schedule_mb=0.05)
  monkeypatch.setattr(kcache, "CACHE", c)
  return c

def _shape_loop(k0: int, n: int):
  rng = np.random.default_rng(k0)
  for k in range(k0, k0 + n):
    x = rng.standard_normal(k).astype(np.float32)
    np.testing.assert_allclose((Tensor(x) * 0.37 + 1).sum(0).numpy(), (x * np.float32(0.37) + 1).sum(), rtol=1e-4)

def test_slabs_and_schedules_are_evicted_and_values_stay_right(tiny):
  _shape_loop(100, 12)                        # 12 structures: more slabs and schedules than the bounds hold
  s = tiny.stats()
  assert s["slabs_evicted"] >= 1 and s["slabs"] <= 3 and s["kernel_bytes"] <= tiny.slabs.limit + kcache.ENGINE_BYTES
  assert s["schedules_evicted"] >= 1 and s["schedule_bytes"] <= tiny.schedules.limit + 64 << 10
  assert len(tiny) < s["compiled"]            # evicted kernels left the key table with their slab
  before = tiny.compiled
  _shape_loop(100, 2)                         # the first structures again: evicted, so compiled again, still right
  assert tiny.compiled > before

def test_a_kernel_in_use_outlives_its_evicted_slab(tiny):
  from lower.device.native import launch
  x = np.arange(64, dtype=np.float32)
  np.testing.assert_allclose((Tensor(x) * 2 + 1).numpy(), x * 2 + 1)   # 2 and 1 specialize: one kernel, (out, x)
  held = list(tiny._fns.values())   # the host copy-in and the arithmetic
  _shape_loop(300, 10)
  assert not any(c.slab in tiny.slabs or c in tiny._fns.values() for c in held)   # evicted; each holds its slab's code
  outs = []
  for c in held:
    st = c.kernel.store.param
    arrays = [np.zeros(p.size, p.dtype.np) if i == st else x.copy() for i, p in enumerate(c.kernel.params)]
    launch(c, [a.ctypes.data for a in arrays])
    outs.append(arrays[st])
  assert any(np.array_equal(o, x * 2 + 1) for o in outs)

def test_evicted_slabs_dispose_their_engines(tiny):
  # an evicted slab nothing holds goes with its engine (disposed: its code unmapped); kernels compiled after, and the
  # native pool's split launches, still give right values
  import gc, weakref
  _shape_loop(700, 2)
  engines = [weakref.ref(s.engine) for s in list(tiny.slabs._d)]
  _shape_loop(800, 12)
  gc.collect()
  assert tiny.stats()["slabs_evicted"] >= 1 and all(e() is None for e in engines)
  x = np.random.default_rng(1).standard_normal(1 << 22).astype(np.float32)
  np.testing.assert_allclose((Tensor(x) * 3 - 1).numpy(), x * 3 - 1, rtol=1e-6)   # split across threads where there are some

def test_threads_with_a_tiny_cache_give_right_values(tiny):
  errs = []
  def work(t):
    try: _shape_loop(500 + 40 * t, 10)
    except Exception as e: errs.append(repr(e))
  ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
  for x in ts: x.start()
  for x in ts: x.join()
  assert errs == [] and tiny.stats()["slabs_evicted"] >= 1
