"""lower/schedule/kernelize._order, indexed by root, against the pairwise comparison it replaced (the oracle below), on the
groups of real CALLs: assigns into views and overlapping slices (reads that must see the state before the CALL's
writes), shared values, the fusion corpus and random graphs."""
import os, sys
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Node, Ops
from egraph.ir.storage import Storage
from lower.schedule import kernelize
from lower.device import cache
from lower.schedule.work import program_of

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "render"))   # test_llvm_ops's hand-built CALLs
import fusion_programs
from test_llvm_ops import buf, P, call, cst   # the hand-built CALLs of test_war_order_and_snapshots

def pairwise_order(groups: list) -> tuple[list, dict]:
  """The order before the root index: every pair of groups compared."""
  n = len(groups)
  succ = [set() for _ in range(n)]
  def ov(xs, ys): return any(x.overlaps(y) for x in xs for y in ys)
  for i in range(n):
    for j in range(i + 1, n):
      a, b = groups[i], groups[j]
      if ov(a.writes, b.writes) or ov(a.writes, b.ra) or ov(a.ra, b.writes): succ[i].add(j)
  snaps: dict = {}
  for k in range(n):
    for m in groups[k].rd:
      writers = [w for w in range(n) if w != k and ov(groups[w].writes, [m])]
      if any(kernelize.reaches(succ, w, k) for w in writers): snaps.setdefault(k, []).append(m); continue
      for w in writers: succ[k].add(w)
  return kernelize.ordered(succ), snaps

def _views_and_assigns():
  a = Tensor(np.arange(12, dtype=np.float32)).realize()
  b = Tensor(np.arange(12, dtype=np.float32) * 2).realize()
  a[2:8].assign(a[0:6] + 1)          # reads a range it overwrites: a snapshot
  b.assign(b.flip(0) * a)            # reads itself reversed, and a through the assign above
  c = (a + b).sum() + a[::2].max()
  return [a, b, c]

def _shared():
  x = Tensor(np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)).realize()
  e = (x * 2).exp()
  return [e.sum(0), e.max(1), (e @ x).relu(), x.softmax(-1)]

def _war_and_snapshots():
  """CALLs whose reads need the state before their writes: the old a read directly beside the new a (a snapshot), a
  slice argument aliasing a whole-buffer one, writes after reads."""
  S = Storage()
  a, b, c = buf(S, np.arange(4), dtypes.float32), buf(S, np.ones(4), dtypes.float32), buf(S, np.zeros(4), dtypes.float32)
  p0, p1, p2 = P(0, 4), P(1, 4), P(2, 4)
  w = p0.after(p0.store(Node(Ops.ADD, None, (p1, p1))))
  r = p2.after(p2.store(Node(Ops.MUL, None, (p0, p1))))
  mix = p2.after(p2.store(Node(Ops.SUB, None, (w, p0))))
  sl = Node(Ops.SLICE, dtypes.float32, (a,), (1, 2))
  q0, q1 = P(0, 4), P(1, 2)
  w2 = q0.after(q0.store(cst(9.0, dtypes.float32, (4,))))
  r2 = P(2, 4).after(P(2, 4).store(Node(Ops.ADD, None, (q1.pad(((1, 1),)), P(3, 4)))))
  return [call(Node.sink(w, r), a, b, c), call(Node.sink(r, w), a, b, c), call(Node.sink(mix, r, w), a, b, c),
          call(Node.sink(w2, r2), a, sl, c, b)]

CASES = {"views and assigns": _views_and_assigns, "shared": _shared, "war and snapshots": _war_and_snapshots}

def _groups_of(outs) -> list:
  got = []
  real = kernelize._order
  def spy(groups):
    got.append(list(groups)); return real(groups)
  kernelize._order, saved, cache.CACHE = spy, cache.CACHE, cache.KernelCache()   # a fresh cache: no schedule is reused
  try:
    for c in ([callify(*[t.node for t in outs], cache=False).call] if isinstance(outs[0], Tensor) else outs): program_of(c)
  finally: kernelize._order, cache.CACHE = real, saved
  return got

@pytest.mark.parametrize("name", list(CASES) + ["corpus:" + p.name for p in fusion_programs.PROGRAMS[::5]])
def test_indexed_order_is_the_pairwise_order(name):
  if name.startswith("corpus:"):
    roots, _ = fusion_programs.by_name(name[7:]).build(np.random.default_rng(0))
  else: roots = CASES[name]()
  seen = _groups_of(roots)
  assert seen
  for groups in seen: assert kernelize._order(groups) == pairwise_order(groups)
  if name == "war and snapshots": assert any(pairwise_order(g)[1] for g in seen) and any(len(g) > 1 for g in seen)

def test_a_store_group_walks_only_its_own_value():
  """Each group's passes see its value down to the AFTERs it reads, not the earlier values behind their STOREs (that
  walk made lowering quadratic in the stores: 18.5 s for 480 on bench/callify_vs_tinygrad.py's chain)."""
  x = Tensor(np.arange(8, dtype=np.float32)).realize()
  ys = []
  for i in range(40):
    x = (x * 1.5 + i).contiguous()   # one realize point per step, each reading the one before through its AFTER
    ys.append(x)
  seen = []
  real = kernelize._realize_set
  def spy(order, cap, known=frozenset()):
    seen.append(len(order)); return real(order, cap, known)
  kernelize._realize_set = spy
  try: prog = program_of(callify(x.node, cache=False).call)
  finally: kernelize._realize_set = real
  assert len(seen) == 40 and max(seen) < 16, seen   # a few nodes each (i a scalar argument: its buffer's view), not 40 steps' worth
  want = np.arange(8, dtype=np.float32)
  for i in range(40): want = want * 1.5 + i
  np.testing.assert_allclose(x.numpy(), want, rtol=1e-5)
  assert sum(s.kernel is not None for s in prog.steps) == 40

def test_groups_share_what_the_fusion_cap_realizes(monkeypatch):
  """A value too big for one kernel, read by two stores, is realized once: the second group reads the first group's
  temporary (each computed its own before: bench/callify_vs_tinygrad.py's dag at 1500 steps lowered to 8836 kernels in
  ~100 s, now 425 in ~8 s). The reader is ordered after the writer, and the values are numpy's."""
  x0 = np.arange(64, dtype=np.float32) / 64
  x = Tensor(x0).realize()
  s, want = x, x0.astype(np.float64)
  for i in range(300): s, want = s * 1.0001 + 0.5, want * 1.0001 + 0.5   # 600 ops: over FUSE_CAP, split once
  def kernels(*ts): return [st for st in program_of(callify(*ts, cache=False, fusion="rules").call).steps if st.kernel is not None]
  one, two = kernels(s + 1), kernels(s + 1, s * 2)
  assert len(one) == 2 and len(two) == 3
  tmp = {m.root for st in two for m in st.mems if m.root[0] == "tmp"}
  assert len(tmp) == 1
  (root,) = tmp
  first_write = min(i for i, st in enumerate(two) if st.mems[st.kernel.store.param].root == root)
  assert all(first_write < i for i, st in enumerate(two) if root in [m.root for m in st.mems] and st.mems[st.kernel.store.param].root != root)
  monkeypatch.setenv("CALLSAT_FUSION", "rules")
  a, b = s + 1, s * 2
  Tensor.realize(a, b)   # one CALL, the two stores above
  for t, w in ((a, want + 1), (b, want * 2)): np.testing.assert_allclose(t.numpy(), w, rtol=1e-5)

def test_toposort_stops_at_the_ids_it_is_given():
  """`stop` lists a node without entering it (what earlier groups realized: a group's walk ends there), except a root."""
  from egraph.ir.ops import toposort, new_buffer
  a, b = new_buffer(4, dtypes.float32, "CPU"), new_buffer(4, dtypes.float32, "CPU")
  s = Node(Ops.ADD, None, (a, b))
  t = Node(Ops.MUL, None, (s, a))
  assert toposort([t], stop={s.id}) == [s, a, t]
  assert toposort([t]) == [a, b, s, t]
  assert toposort([s], stop={s.id}) == [a, b, s]   # a root is entered
