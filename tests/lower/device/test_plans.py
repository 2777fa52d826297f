"""Prepared plans (lower/device/native.py): a new CALL of a schedule run before takes that schedule's last plan with the
changed pointers patched (a realize loop's fresh outputs, a TinyJit replay's new inputs); values are the same as the full
path's, earlier results are never written again, and concurrent runs of one schedule never share a plan's pointers."""
import threading
import numpy as np
import pytest
from egraph import Tensor, callify
from lower.runtime import read, run_call
from lower.device import native

@pytest.fixture
def launches(monkeypatch):
  """Counts the Launch objects run_native prepares (the full path makes one per kernel; a rebind none)."""
  made = []
  class Counted(native.Launch):
    __slots__ = ()
    def __init__(self, *a, **k):
      made.append(1)
      super().__init__(*a, **k)
  monkeypatch.setattr(native, "Launch", Counted)
  return made

def test_a_realize_loop_rebinds_the_schedules_plan(launches):
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((47, 41), dtype=np.float32), rng.standard_normal((41, 23), dtype=np.float32)   # shapes no other test runs
  x, y = Tensor(a).realize(), Tensor(b).realize()
  outs = [(x @ y).realize() for _ in range(2)]   # one kernel, no temporaries: the schedule keeps its plan
  first = len(launches)
  assert first >= 1
  outs += [(x @ y).realize() for _ in range(3)]   # fresh output buffers: pointers patched, no launch prepared
  assert len(launches) == first
  z = Tensor(rng.standard_normal((47, 41), dtype=np.float32)).realize()
  outs.append((z @ y).realize())                  # a new input too
  assert len(launches) == first
  for o in outs[:-1]: np.testing.assert_allclose(o.numpy(), a @ b, rtol=1e-5, atol=1e-5)   # earlier results untouched
  np.testing.assert_allclose(outs[-1].numpy(), z.numpy() @ b, rtol=1e-5, atol=1e-5)

def test_a_rebound_plan_with_temporaries_gives_the_full_paths_values(launches, monkeypatch):
  """A CALL with several kernels and temporaries in its plan's arena, run over new inputs and outputs: the schedule
  holds such a plan weakly, so while an earlier CALL that ran on it lives (kept here) the next is rebound to it."""
  rebinds, real = [], native.Plan.rebind
  monkeypatch.setattr(native.Plan, "rebind", lambda self, *a: rebinds.append(1) or real(self, *a))
  rng = np.random.default_rng(1)
  def prog(t): return ((t - t.max(1, keepdim=True)).exp() / (t - t.max(1, keepdim=True)).exp().sum(1, keepdim=True)) @ t.T
  vals = [rng.standard_normal((33, 17), dtype=np.float32) for _ in range(4)]
  results = [callify(prog(Tensor(v).realize())) for v in vals]
  for r in results: run_call(r.call)
  assert rebinds and native.STATS["peak"] > 0, "no rebind of a plan with temporaries"
  for v, r in zip(vals, results):
    (got,) = r.buffer_map.values()
    e = np.exp(v - v.max(1, keepdims=True))
    np.testing.assert_allclose(read(got).reshape(33, 33), (e / e.sum(1, keepdims=True)) @ v.T, rtol=1e-4, atol=1e-5)

def test_two_live_calls_of_one_schedule_run_alternately_each_on_its_own_buffers():
  """CALL A runs, CALL B of the same schedule takes A's plan (rebound to B's buffers, which stay alive), then A runs
  again after its input changed in place: A's output has the new values (the plan is rebound back to A, not run on
  B's pointers because B's buffers are still where they were)."""
  from egraph.ir.storage import STORAGE
  rng = np.random.default_rng(3)
  a, c, b = (rng.standard_normal(s, dtype=np.float32) for s in ((29, 31), (29, 31), (31, 13)))
  x, z, y = Tensor(a).realize(), Tensor(c).realize(), Tensor(b).realize()
  ra, rb = callify(x @ y), callify(z @ y)
  run_call(ra.call); run_call(rb.call)
  STORAGE.get(x.node.base.arg.uid)[:] = (a * 2).reshape(-1)   # A's input, changed in place
  run_call(ra.call)
  (oa,), (ob,) = ra.buffer_map.values(), rb.buffer_map.values()
  np.testing.assert_allclose(read(oa).reshape(29, 13), (a * 2) @ b, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(read(ob).reshape(29, 13), c @ b, rtol=1e-4, atol=1e-4)

def test_concurrent_runs_of_one_schedule_give_right_values():
  """Threads realizing the same structure over their own inputs: a plan busy in one thread is never rebound by another
  (that one prepares its own), so every result is its own inputs'."""
  rng = np.random.default_rng(2)
  b = rng.standard_normal((64, 64), dtype=np.float32)
  y = Tensor(b).realize()
  errors = []
  def work(t: int):
    try:
      for i in range(30):
        a = rng.standard_normal((64, 64), dtype=np.float32) + t
        got = ((Tensor(a) @ y).relu() + i).numpy()
        np.testing.assert_allclose(got, np.maximum(a @ b, 0) + i, rtol=1e-4, atol=1e-4)
    except BaseException as e: errors.append(e)
  ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert not errors, errors[0]
