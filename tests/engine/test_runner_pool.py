"""The declared e-graph pool (egraph/engine/runner.py DeclaredPool): a reused e-graph gives what a new one gives, and each
thread keeps its own (egglog's EGraph lives and dies on the thread that made it)."""
import threading
import pytest
from egraph import callify
from egraph.ir.ops import Node, Ops, new_buffer
from egraph.ir.dtype import dtypes
from egraph.engine.runner import DECLARED

def _graphs():
  a, b = new_buffer(12, dtypes.float32, "CPU").reshape((3, 4)), new_buffer(12, dtypes.float32, "CPU").reshape((3, 4))
  add = Node(Ops.ADD, None, (a, b))
  view = a.shrink(((1, 2), (0, 4))).contiguous()
  red = Node(Ops.ADD, None, (add.contiguous(), view.expand((3, 4)))).contiguous()
  return {"add": [add], "view": [view, red], "assign": [a.after(a.store(add))]}

def _fingerprint(res):
  r = res.report
  return res.call.src[0], r.e_nodes, r.e_classes, r.cost, r.stores, r.views, dict(r.matches)

def test_reused_e_graph_gives_what_a_new_one_gives():
  g = _graphs()
  fresh = {}
  def first():   # a new thread: a pool of its own, so each graph's first callify declares a new e-graph
    for name, roots in g.items(): fresh[name] = _fingerprint(callify(*roots, cache=False, fusion="rules"))
  t = threading.Thread(target=first); t.start(); t.join()
  for _ in range(2):   # this thread's pool: every callify after the first reuses one popped back to its declared state
    for name, roots in reversed(list(g.items())):
      assert _fingerprint(callify(*roots, cache=False, fusion="rules")) == fresh[name], name

def test_threads_each_get_their_own():
  g, errors = _graphs(), []
  want = _fingerprint(callify(*g["view"], cache=False, fusion="rules"))
  def work():
    try:
      for _ in range(3): assert _fingerprint(callify(*g["view"], cache=False, fusion="rules")) == want
    except Exception as e: errors.append(e)
  ts = [threading.Thread(target=work) for _ in range(4)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert not errors, errors

def test_pool_is_bounded_per_thread():
  for _ in range(2 * DECLARED.keep + 2): callify(*_graphs()["add"], cache=False, fusion="rules")
  assert DECLARED.waiting() and all(n <= DECLARED.keep for n in DECLARED.waiting().values())

@pytest.mark.parametrize("memory_fs", [True, False], ids=["memory-fs", "temp-dir"])
def test_row_folders_go_with_their_threads(tmp_path, monkeypatch, memory_fs):
  """Each thread loads rows through a folder of its own, kept between callifies and removed when the thread ends: in
  the memory filesystem where there is one, else in the temp dir."""
  import gc, tempfile
  import egraph.engine.runner as runner
  monkeypatch.setattr(runner, "_MEMORY_FS", str(tmp_path) if memory_fs else str(tmp_path / "absent"))
  monkeypatch.setattr(tempfile, "tempdir", None if memory_fs else str(tmp_path))
  def work():
    for _ in range(2): callify(*_graphs()["view"], cache=False, fusion="rules")
    assert len(list(tmp_path.iterdir())) >= 1
  ts = [threading.Thread(target=work) for _ in range(3)]
  for t in ts: t.start(); t.join()
  gc.collect()
  assert list(tmp_path.iterdir()) == []
