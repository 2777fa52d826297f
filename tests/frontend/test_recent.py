"""Realize keeps the graphs of its last few calls (egraph/frontend/tensor.py RECENT), so a loop that builds the same
expression gets its nodes back from the hash-cons table; and keeps no buffer the user let go: checked by weak
references to the input buffers."""
import gc, weakref
import numpy as np
import pytest
from egraph import Tensor, synchronize
import egraph.frontend.tensor as T

def _arr(*s): return np.random.default_rng(1).standard_normal(s).astype(np.float32)

def test_a_loop_rebuilds_its_expression_from_the_kept_graph():
  """The second `x @ y` is the first one's node (a hash-cons hit), and every realize's value is numpy's."""
  a, b = _arr(16, 8), _arr(8, 4)
  x, y = Tensor(a).realize(), Tensor(b).realize()
  roots = []
  for _ in range(3):
    t = x @ y
    roots.append(t.node)
    np.testing.assert_allclose(t.realize().numpy(), a @ b, rtol=1e-5, atol=1e-5)
  assert roots[1] is roots[2] and T._RECENT
  del roots

def _input_ref(x: Tensor):
  return weakref.ref(x.node.base)

def test_a_dropped_input_is_not_kept_alive():
  """Dropping a tensor over a kept graph's input drops the kept graphs: its buffer dies with the user's references."""
  x, y = Tensor(_arr(16, 8)).realize(), Tensor(_arr(8, 4)).realize()
  (x @ y).realize(); (x @ y).realize(); synchronize()
  assert T._RECENT
  rx, ry = _input_ref(x), _input_ref(y)
  del x
  gc.collect()
  assert rx() is None and ry() is not None and not T._RECENT
  del y
  gc.collect()
  assert ry() is None

def test_an_input_pointed_elsewhere_is_not_kept_alive():
  """A realize that points an input's tensor at other storage (an assign into a computed value) drops the kept graphs:
  the old buffer dies though the tensor lives on."""
  x, y = Tensor(_arr(16, 8)).realize(), Tensor(_arr(8, 4)).realize()
  (x @ y).realize(); synchronize()
  assert T._RECENT
  ry = _input_ref(y)
  y.assign(y * 2 + 1).realize()
  gc.collect()
  if ry() is not None:   # an assign may write in place: then the buffer is the tensor's still
    assert y.node.base is ry()
  else: assert not any(ry() in i for _, i in T._RECENT)

def test_big_graphs_and_host_uploads_are_not_kept():
  """A CALL over more than RECENT_BYTES of buffers keeps no graph; nor does a graph over a host array's upload (no
  tensor stands on the NPY buffer once its tensor is realized)."""
  T._RECENT.clear()
  n = 1 << 11
  x = Tensor(np.ones((n, n), np.float32)).realize()
  (x * 2).realize(); synchronize()
  assert not T._RECENT
  z = Tensor(_arr(4, 4))
  (z * 3).realize()
  assert not T._RECENT

def test_threads_realizing_and_dropping_tensors():
  """Four threads each realize their own loop while dropping the tensors under it: the kept graphs change under all of
  them at once; every value is numpy's and no thread raises."""
  import threading
  errors = []
  def work(seed):
    try:
      rng = np.random.default_rng(seed)
      for _ in range(30):
        a, b = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
        x, y = Tensor(a).realize(), Tensor(b).realize()
        for _ in range(3): np.testing.assert_allclose((x @ y + 1).realize().numpy(), a @ b + 1, rtol=1e-5, atol=1e-5)
        del x, y
    except Exception as e: errors.append(e)
  ts = [threading.Thread(target=work, args=(s,)) for s in range(4)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert not errors, errors

def test_a_python_scalars_buffer_is_not_kept_alive():
  """A graph over a Python scalar (its own 1-element buffer, which no tensor stands on) is not kept: once its result
  is dropped, every buffer of its graph but the input's (its tensor lives on) dies. Zero-size values too, whose CALL
  has no kernel and leaves the scalar out of its arguments (kept graphs once looked only at those, and held it)."""
  from egraph.ir.ops import toposort, Ops
  for shape in ((2, 3), (0, 3)):
    T._RECENT.clear()
    x = Tensor(np.ones(shape, np.float32)).realize()
    y = (x * 3.5 + 1.25).sum(1)
    refs = [weakref.ref(b) for b in toposort([y.node]) if b.op is Ops.BUFFER and b is not x.node.base]
    np.testing.assert_allclose(y.numpy(), np.full(shape[0], 4.75 * shape[1], np.float32), rtol=1e-6)
    del y
    gc.collect()
    assert refs and all(r() is None for r in refs), shape

def test_live_lazy_tensors_are_walked_only_where_a_realized_node_can_be():
  """A realize points every live tensor built on what it realized at the new storage, and skips the graphs that cannot
  hold it: older than every realized node, or walked clean under the same realized nodes before (the loop case). A
  tensor made later on the kept expression's node is still rewritten; every value is numpy's."""
  a, b, c = _arr(16, 8), _arr(8, 4), _arr(16, 4)
  x, y, z = Tensor(a).realize(), Tensor(b).realize(), Tensor(c).realize()
  older = [z * float(i) + 1 for i in range(20)]     # lazy, of several sources, made before any key
  for _ in range(3): (x @ y).realize()              # the same kept node is realized each time
  later = [z * float(i) - 1 for i in range(20)]     # lazy, made after the key: walked once, then remembered clean
  for _ in range(3): (x @ y).realize()
  assert T._CLEAN[0] and T._CLEAN[1]
  m = x @ y
  on_m = m + z                                      # lazy over the kept key's node
  key = m.node
  assert any(n is key for n in on_m.node.toposort())
  (x @ y).realize()                                 # realizes `key` again: m and on_m now stand on its storage
  assert not any(n is key for n in on_m.node.toposort()) and not any(n is key for n in m.node.toposort())
  np.testing.assert_allclose(on_m.numpy(), a @ b + c, rtol=1e-5, atol=1e-5)
  for i, t in enumerate(older): np.testing.assert_allclose(t.numpy(), c * i + 1, rtol=1e-6)
  for i, t in enumerate(later): np.testing.assert_allclose(t.numpy(), c * i - 1, rtol=1e-6)

@pytest.mark.parametrize("walk", [512, 3])
def test_an_assign_rewrites_the_lazy_tensors_that_read_its_target_and_no_others(monkeypatch, walk):
  """assign points every live tensor reading the target's storage at the write; the graphs of other lazy tensors (their
  leaves do not hold the target) are left as they are, and the leaf sets kept for that stay under their bound. With a
  walk of 3 nodes no graph's leaves are known: every one goes through substitute, with the same result."""
  monkeypatch.setattr(T, "LEAVES_MAX", 64)
  monkeypatch.setattr(T, "LEAVES_WALK", walk)
  ps = [Tensor(_arr(8) + i).realize() for i in range(40)]
  gs = [Tensor(_arr(8) * i).realize() for i in range(40)]
  want = [p.numpy() for p in ps]
  reads = [p * 2 + g for p, g in zip(ps, gs)]           # lazy, of several sources, made before the assigns
  before = [r.node for r in reads]
  for i, (p, g) in enumerate(zip(ps, gs)):
    p.assign(p - 0.5 * g)
    assert reads[i].node is not before[i]              # reads its target: now after the write
    assert all(reads[j].node is before[j] for j in range(i + 1, 40))   # not its target: untouched
    assert T._leaves_held <= 64
  Tensor.realize(*ps)
  for i, (p, g, r) in enumerate(zip(ps, gs, reads)):
    new = want[i] - np.float32(0.5) * g.numpy()
    np.testing.assert_allclose(p.numpy(), new, rtol=1e-6)
    np.testing.assert_allclose(r.numpy(), new * 2 + g.numpy(), rtol=1e-6)
