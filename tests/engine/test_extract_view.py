"""The extraction's fast paths give the general paths' answers: EGraphView's columns read in numpy equal the plain
row-by-row reading (raw e-class ids and interned Values alike), the first-appearance numbering equals dict.fromkeys's
(dense table and sort), and the vectorized forced-Knuth test equals the e-node by e-node one."""
import collections, heapq, itertools, random
import numpy as np
import pytest
from egraph import Tensor
from egraph.engine.encode import encode
from egraph.engine.cost import COST_PRESETS
from egraph.engine.driver import saturate
from egraph.engine import extract as ext
from egraph.fusion import candidates
def _graph(kind: str):
  """A saturated e-graph: a small chain (rules mode), or a softmax-and-matmul program with candidates (cost mode)."""
  rng = np.random.default_rng(0)
  a, b = (Tensor(rng.standard_normal((64, 64)).astype(np.float32)).realize() for _ in range(2))
  if kind == "chain":
    x = a
    for i in range(40): x = (x * 1.01 + b).relu() if i % 3 else (x + 1).contiguous()
    ts = [x]
  else: ts = [((a @ b).softmax() @ b).exp(), (a * b).sum(axis=1)]
  enc = encode([t.node for t in ts], "fresh")
  if kind == "cost": candidates.add_candidates(enc)
  sat = saturate(enc)
  return sat.runner.freeze(), sat.runner.egraph, enc

def _reference(frozen, egraph, enc) -> dict:
  """The view read row by row in Python: Values hashed, classes numbered in first appearance (each row's output before
  its children, constructors in order, then the N rows)."""
  fns, vstr, i64 = frozen.functions, egraph.value_to_string, egraph.value_to_i64
  op, arg, rows_ = [], [], []
  for name in ext._CTORS:
    if name not in fns: continue
    skip = 0 if name in ("Cons", "Nil") else 2
    for r in fns[name].rows:
      if r.subsumed: continue
      ins = r.inputs
      op.append(vstr(ins[0]) if skip else name); arg.append(i64(ins[1]) if skip else 0)
      rows_.append((r.output, ins[skip:]))
  num: dict = {}
  for o, ks in rows_:
    for v in (o, *ks): num.setdefault(v, len(num))
  nrows = fns["N"].rows
  for r in nrows: num.setdefault(r.output, len(num))
  cls, kids = [num[o] for o, _ in rows_], [tuple(num[k] for k in ks) for _, ks in rows_]
  class_of_id = {i64(r.inputs[0]): num[r.output] for r in nrows}
  info = [None] * len(num)
  for i, k in class_of_id.items():
    if info[k] is None and enc.nodes[i] is not None: info[k] = enc.nodes[i]
  parents = [[] for _ in num]
  for e, ks in enumerate(kids):
    for k in dict.fromkeys(ks): parents[k].append(e)
  return dict(op=op, arg=arg, cls=cls, kids=kids, n_classes=len(num), class_of_id=class_of_id, info=info,
              parents=parents, n_kids=[len(set(ks)) for ks in kids])

@pytest.mark.parametrize("kind", ["chain", "cost"])
@pytest.mark.parametrize("raw", [True, False])
def test_view_columns_are_the_row_by_row_reading(kind, raw, monkeypatch):
  """Raw ids (egglog 13.2) and interned Values (the path for an egglog whose value_to_i64 reads no raw id) both give
  the plain reading's e-nodes, classes, parents and class facts, as Python ints in lists."""
  frozen, egraph, enc = _graph(kind)
  if not raw: monkeypatch.setattr(ext, "_raw_ids", lambda fns, i64: False)
  g, ref = ext.EGraphView(frozen, egraph, enc), _reference(frozen, egraph, enc)
  for f, want in ref.items():
    got = getattr(g, f)
    if f == "info": assert len(got) == len(want) and all(x is y for x, y in zip(got, want)), f
    elif f == "class_of_id": assert list(got.items()) == list(want.items()), f
    else: assert got == want, f
  assert all(type(x) is int for x in itertools.chain(g.cls, g.arg, *g.kids, *g.parents, g.n_kids))
  assert g.cls_array.tolist() == g.cls and [tuple(k for k in r if k >= 0) for r in g.kid_array.tolist()] == g.kids

def test_first_numbers_is_dict_fromkeys_numbering():
  """The dense id table and the sort (ids spread too far for a table) both number ids in first appearance."""
  rng = np.random.default_rng(1)
  for seq in [rng.integers(0, 50, 300), rng.integers(-7, 3, 40), rng.integers(0, 1 << 40, 300) // 7 * 7,
              np.array([5, 5, 5]), np.array([], np.int64)]:
    num = dict(zip(dict.fromkeys(seq.tolist()), itertools.count()))
    got, n = ext._first_numbers(np.asarray(seq, np.int64))
    assert got.tolist() == [num[x] for x in seq.tolist()] and n == len(num)

def _forced_reference(g, ok) -> bool:
  """extract._forced e-node by e-node (Counter and dicts)."""
  live = [e for e, c in enumerate(ok) if c is not None]
  cl = [g.cls[e] for e in live]
  cnt, last, multi = collections.Counter(cl), dict(zip(cl, live)), {}
  for e, k in zip(live, cl):
    if cnt[k] > 1 and not any(cnt[j] == 1 and k in g.kids[last[j]] for j in g.kids[e]):
      multi[k] = multi.get(k, 0) + 1
      if multi[k] > 1: return False
  return True

def test_forced_is_the_e_node_by_e_node_test():
  """On the cost-mode e-graph (stored forms: classes with an e-node that reads its class back) with every e-node, the
  pinned ones, and random subsets live: the same answer, both answers met."""
  frozen, egraph, enc = _graph("cost")
  g = ext.EGraphView(frozen, egraph, enc)
  costs, allowed = g.local_costs(COST_PRESETS["bytes"]), g.pinned_allowed()
  oks = [costs, [c if a else None for c, a in zip(costs, allowed)], [1] * g.n_enodes]
  rnd = random.Random(0)
  oks += [[c if rnd.random() < p else None for c in oks[1]] for p in (0.3, 0.9, 0.99) for _ in range(4)]
  seen = set()
  for ok in oks:
    want = _forced_reference(g, ok)
    assert ext._forced(g, ok) == want
    seen.add(want)
  assert seen == {True, False}

def _assign_graph():
  """Assigns (pinned classes, an AFTER listing several writes) and a slice of a realized buffer (a SLICE e-node)."""
  a = Tensor(np.zeros(6, np.float32)).realize()
  v = a[::2]; v.assign(Tensor([1., 2, 3]))
  b = Tensor([1., 2, 3, 4]).realize()
  c = (b + 1).contiguous()
  c.assign(c * b); c.assign(c + 1)
  enc = encode([a.node, c.node, b[1:3].contiguous().node, (b[0:2] * 2).node], "fresh")
  sat = saturate(enc)
  return sat.runner.freeze(), sat.runner.egraph, enc

def _pinned_reference(g) -> list[bool]:
  """pinned_allowed e-node by e-node."""
  pin = {g.class_of_id[a]: g.class_of_id[t] for a, t in g.enc.pins.items()}
  realized = {g.class_of_id[i] for i in g.enc.key_ids.values()}
  heads = {k: ks[0] for k, o, ks in zip(g.cls, g.op, g.kids) if o == "Cons"}
  return [(o == "AFTER" and bool(ks) and pin[k] in (ks[0], heads.get(ks[0]) if len(ks) == 1 else None)) if k in pin
          else k not in realized or o in ext._STORAGE_FORMS for k, o, ks in zip(g.cls, g.op, g.kids)]

class _Priced(ext.CostModel):
  """The base model through an override: local_costs then costs every e-node one by one (the general path)."""
  def enode_cost(self, op, node, target, fresh): return super().enode_cost(op, node, target, fresh)

@pytest.mark.parametrize("which", ["chain", "cost", "assign"])
def test_costs_pins_and_the_chosen_dag_are_the_general_paths(which):
  """local_costs' in-line stored forms equal the e-node by e-node costing (every preset), pinned_allowed's looking at
  the pinned and realized classes only equals the e-node by e-node rule, and chosen_dag's one walk gives dag_cost and
  the reached classes (a chosen SLICE: dag_cost's own walk; a class without a choice: dag_cost's answer, no classes)."""
  g = ext.EGraphView(*(_assign_graph() if which == "assign" else _graph(which)))
  for model in COST_PRESETS.values():
    assert g.local_costs(model) == g.local_costs(_Priced(**{f: getattr(model, f) for f in ("name", "bytes", "buffers", "kernels", "nodes")}))
  allowed = g.pinned_allowed()
  assert allowed == _pinned_reference(g)
  costs, roots = g.local_costs(COST_PRESETS["bytes"]), [g.class_of_id[g.enc.key_ids[k.id]] for k in g.enc.keys]
  choice, cost, reached = ext.extract(g, costs, roots, allowed)
  assert (cost, reached) == (ext.dag_cost(g, costs, choice, roots), ext.reached_classes(choice, roots, g.kids, g.n_classes))
  assert ext.chosen_dag(g, costs, choice, roots) == (cost, reached)
  if which == "assign":
    assert g.enc.pins and "SLICE" in (g.op[choice[k]] for k in reached)
    k = reached[-1]; broken = choice.copy(); broken[k] = -1
    with pytest.raises(ext.Unextractable): ext.dag_cost(g, costs, broken, roots)
    with pytest.raises(ext.Unextractable): ext.chosen_dag(g, costs, broken, roots)

def test_stored_members_through_the_fresh_buffer_are_through_the_candidate():
  """stored_members looks for the stored form among the fresh buffer class's parents: the same (AFTER, STORE) as among
  the candidate class's (every candidate row of the cost-mode graph)."""
  frozen, egraph, enc = _graph("cost")
  g = ext.EGraphView(frozen, egraph, enc)
  fresh = {r[0]: r[1] for r in enc.rows.get("candidate_row", ())}
  want = {}
  for i in fresh:
    k, fc = g.class_of_id[i], g.class_of_id[fresh[i]]
    for s in g.parents[k]:
      if g.op[s] != "STORE" or g.kids[s] != (fc, k): continue
      a = next((a for a in g.parents[g.cls[s]] if g.op[a] == "AFTER" and g.cls[a] == k and g.kids[a] == (fc, g.cls[s])), None)
      if a is not None: want[k] = (a, s); break
  assert want and candidates.stored_members(g, enc, list(fresh)) == want

def _knuth_reference(g, costs, allowed, tree=True):
  """Knuth's pass with a heap on every graph (no forced path), e-node by e-node: (best, choice)."""
  ok = costs if allowed is None else [c if a else None for c, a in zip(costs, allowed)]
  best, choice, done, pending = [ext.INF] * g.n_classes, [-1] * g.n_classes, [False] * g.n_classes, [len(set(ks)) for ks in g.kids]
  heap = [(c, e) for e, (c, p) in enumerate(zip(ok, pending)) if p == 0 and c is not None]
  heapq.heapify(heap)
  while heap:
    c, e = heapq.heappop(heap)
    if done[k := g.cls[e]]: continue
    done[k], best[k], choice[k] = True, c, e
    for p in g.parents[k]:
      pending[p] -= 1
      if not pending[p] and ok[p] is not None and not done[g.cls[p]]:
        heapq.heappush(heap, (ok[p] + sum(best[x] for x in g.cost_kids[p]), p))
  return best, choice

@pytest.mark.parametrize("which", ["chain", "cost", "assign"])
def test_knuth_is_the_heap_pass(which):
  """_knuth (the forced path where each class has one candidate, else the heap) chooses as the plain heap pass does,
  with its tree costs where asked, pinned or not, on costs that tie and that do not; both paths are taken."""
  g = ext.EGraphView(*(_assign_graph() if which == "assign" else _graph(which)))
  costs, rnd, paths = g.local_costs(COST_PRESETS["bytes"]), random.Random(1), set()
  for allowed in (None, g.pinned_allowed()):
    for cs in (costs, [c if c is None else c + rnd.randrange(4) for c in costs]):
      best, choice = _knuth_reference(g, cs, allowed)
      b, c, forced = ext._knuth(g, cs, allowed, ext.INF)
      assert c == choice and (b == best or forced and [x for x, k in zip(b, c) if k >= 0] == [x for x, k in zip(best, choice) if k >= 0])
      assert ext._knuth(g, cs, allowed, ext.INF, tree=False)[1] == choice
      paths.add(forced)
  assert paths == ({False} if which == "assign" else {True})   # the assigns' e-graph has classes with several candidates

@pytest.mark.parametrize("which", ["chain", "cost", "assign"])
def test_single_member_walk_is_knuths_choice(which, monkeypatch):
  """_single (every class one usable e-node: one cycle-checking walk) chooses as the heap pass does and reaches the
  classes reached_classes does, in its order; extract answers as through Knuth. A class left without an e-node under a
  reached one, or a cycle, hands the choice back to Knuth (None)."""
  g = ext.EGraphView(*(_assign_graph() if which == "assign" else _graph(which)))
  costs, allowed = g.local_costs(COST_PRESETS["bytes"]), g.pinned_allowed()
  roots = [g.class_of_id[g.enc.key_ids[k.id]] for k in g.enc.keys]
  one = ext._single(g, costs, allowed, roots)
  if which == "chain":   # rules mode: one e-node per class
    choice, reached = one
    assert choice == _knuth_reference(g, costs, allowed)[1] and reached == ext.reached_classes(choice, roots, g.kids, g.n_classes)
    got = ext.extract(g, costs, roots, allowed)
    monkeypatch.setattr(ext, "_single", lambda *a, **k: None)
    assert got == ext.extract(g, costs, roots, allowed)
    leaf = next(e for e in reversed(reached) if not g.kids[choice[e]] and g.parents_of(e))   # a used leaf class loses its e-node
    gone = costs.copy(); gone[choice[leaf]] = None
    assert ext._single(g, gone, allowed, roots) is None
    g.kids = g.kids.copy(); k = reached[len(reached) // 2]; g.kids[choice[k]] = (*g.kids[choice[k]], roots[0])   # a cycle
    assert ext._single(g, costs, allowed, roots) is None
  else: assert one is None   # several candidates in a class (stored forms, assign targets)

def test_acyclic_finds_cycles_through_chosen_e_nodes_only():
  # classes 0..3; e-node e's child classes in kids[e]; choice[k] is class k's chosen e-node
  kids = [(1, 2), (3,), (3,), (), (0,)]   # e-node 4 (a member of class 3) reads class 0: a cycle when chosen
  assert ext.acyclic([0, 1, 2, 3], [0], kids, 4)        # a diamond 0 -> {1, 2} -> 3: shared, no cycle
  assert not ext.acyclic([0, 1, 2, 4], [0], kids, 4)    # 3 chose e-node 4: 0 -> 1 -> 3 -> 0
  assert ext.acyclic([0, 1, -1, 3], [0], kids, 4)       # a class with no choice is not a cycle (chosen_dag says so)
  assert ext.acyclic([0, 1, 2, 4], [1], [(1, 2), (3,), (3,), (), ()], 4)

def test_switches_only_ever_lower_the_dag_cost():
  # on saturated e-graphs the choice after the switch search is a well-founded DAG costing the refined choice or less
  rng = np.random.default_rng(1)
  x = Tensor(rng.standard_normal(16).astype(np.float32)).realize()
  programs = [[x.bitcast("int32") + x.exp().bitcast("int32")],   # the bitcast shape the search was made for
              [((x * 2).exp() + x).sum(), (x + 1).contiguous() * x]]
  for i, ts in enumerate(programs):
    enc = encode([t.node for t in ts], "fresh")
    g = saturate(enc).graph
    costs, allowed = g.local_costs(COST_PRESETS["bytes"]), g.pinned_allowed()
    roots = [g.class_of_id[enc.key_ids[k.id]] for k in enc.keys]
    choice, best, reached = ext.extract(g, costs, roots, allowed)
    assert reached is not None and ext.acyclic(choice, roots, g.kids, g.n_classes)
    assert best == ext.dag_cost(g, costs, choice, roots)
    before = ext.SWITCH_BELOW
    try:
      ext.SWITCH_BELOW = 0
      _, unswitched, _ = ext.extract(g, costs, roots, allowed)
    finally: ext.SWITCH_BELOW = before
    assert best < unswitched if i == 0 else best <= unswitched   # the bitcast: the view's own PARAM goes (273 -> 209)
  xv = x.numpy()
  np.testing.assert_array_equal(programs[0][0].numpy(), xv.view(np.int32) + x.exp().numpy().view(np.int32))   # exp: ours
