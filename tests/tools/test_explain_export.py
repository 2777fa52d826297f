"""`callsat explain` (why a realized tensor became a view, a fresh buffer, an alias or a shared buffer) and
`callsat export` (replayable .egg, egraph-serialize JSON, SVG): content checked against callify itself."""
import json, re, sys
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.ir.ops import Node, Ops, toposort
from egraph.ir.errors import CallsatError
from egraph.tools.explain import explain
from egraph.tools.export import egg_text, replay, constructor_sizes, json_graph, require_graphviz, export, json_choice
from egraph.engine.driver import saturate
from egraph.engine.encode import encode
from egraph.engine.extract import EGraphView, knuth, dag_cost
from egraph.engine.cost import COST_PRESETS
from egraph.tools.ordering import build
from egraph.tools.cli import main

def _views():
  a = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4)).realize()
  b = a[1:].contiguous()
  return (a * 2 + b).sum(axis=1), b

def _assign_then_contiguous():
  a = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4)).realize()
  t = Tensor(np.zeros((2, 4), dtype=np.float32)).realize()
  target = t.node
  t.assign(a * 2)
  return Tensor(t.node.contiguous()), target

def _buffer(v: Node) -> Node:
  while v.op is not Ops.BUFFER: v = v.src[0]
  return v

# ---- explain ---------------------------------------------------------------------------------------------------------

def test_contiguous_slice_is_a_view_by_contiguous_to_view():
  out, b = _views()
  ex = explain(out, b, labels=["out", "b"])
  p = ex.point("b")
  assert p.kind == "view" and p.decided_by == "contiguous_to_view"
  assert p.rules == ["materialize_contiguous", "contiguous_to_view"]
  assert "contiguous_to_view" in p.matching and "SLICE(4, 4, buf" in p.storage
  chosen = [m for m in p.members if m.status == "chosen"]
  assert len(chosen) == 1 and chosen[0].op == "RESHAPE" and chosen[0].introduced_by == "contiguous_to_view"
  # the costs that decided it: the view is cheaper than storing a copy, which is the materialized form
  assert p.chosen_cost < p.alternative_cost == p.materialized_cost
  assert p.alternative == "AFTER by materialize_contiguous"
  marker = [m for m in p.members if m.op == "CONTIGUOUS"]
  assert marker and marker[0].local_cost is None and marker[0].status.startswith("unextractable")
  # callify agrees: b maps to the SLICE view of a's buffer at element 4
  bm = callify(out, b, cache=False).buffer_map[b.node]
  assert [n.arg for n in toposort([bm]) if n.op is Ops.SLICE] == [(4, 4)]
  text = str(ex)
  assert "view: a zero-copy view" in text and "decided   by contiguous_to_view" in text

def test_computed_value_is_a_fresh_buffer_by_materialize_contiguous():
  out, b = _views()
  p = explain(out, b).point(0)
  assert p.kind == "fresh" and p.decided_by == "materialize_contiguous" and p.rules == ["materialize_contiguous"]
  assert p.alternative is None and p.chosen_cost == p.materialized_cost and p.shared_with == []
  assert p.node.startswith("REDUCE") and "out0" in p.names

def test_contiguous_of_an_assign_is_an_alias_by_contiguous_of_assign():
  c, target = _assign_then_contiguous()
  ex = explain(c, labels=["c"])
  p = ex.point("c")
  assert p.kind == "alias" and p.decided_by == "contiguous_of_assign" and "contiguous_of_assign" in p.rules
  assert p.buffer == f"buf{_buffer(target).arg.uid}"          # the assigned buffer itself, no copy
  after = [q for q in ex.points if q.node.startswith("AFTER")]
  assert len(after) == 1 and after[0].kind == "alias" and p.shared_with == [f"#{after[0].index}"]
  # the store into a fresh buffer exists in the class but breaks the assign's identity constraint
  assert any(m.op == "AFTER" and m.status.startswith("not allowed") for m in p.members)
  assert _buffer(callify(c, cache=False).buffer_map[c.node]) is _buffer(target)

def test_contiguous_of_contiguous_shares_one_buffer():
  a = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4)).realize()
  inner = (a + 1).contiguous()
  outer = Tensor(Node(Ops.CONTIGUOUS, None, (inner.node,)))
  ex = explain(outer, inner, labels=["outer", "inner"])
  po, pi = ex.point("outer"), ex.point("inner")
  assert po.e_class == pi.e_class and po.buffer == pi.buffer
  assert sorted([po.kind, pi.kind]) == ["fresh", "shared"]
  shared = po if po.kind == "shared" else pi
  owner = pi if shared is po else po
  assert f"minted for #{owner.index}" in shared.summary and shared.shared_with == [f"#{owner.index}"]
  bm = callify(outer, inner, cache=False).buffer_map
  assert _buffer(bm[outer.node]) is _buffer(bm[inner.node])

def test_precompiled_output_is_written_by_its_call():
  from egraph import function
  @function(precompile=True)
  def split(x): return x + 1, (x * x).contiguous()
  a = Tensor([1., 2, 3, 4]).realize()
  y, sq = split(a)
  ex = explain(y * 3, sq, labels=["y3", "sq"])
  p = ex.point("sq")
  assert p.kind == "fresh" and "written by a precompiled CALL" in p.summary
  assert "written by a STORE" in ex.point("y3").summary

@pytest.mark.parametrize("name", ["model:mlp", "model:views", "gen:0", "gen:1", "gen:2", "gen:3", "gen:6", "gen:8"])
def test_explain_reaches_callifys_egraph_and_decisions(name):
  """Rule-at-a-time reaches the e-graph callify saturates; the kinds agree with callify's buffer_map."""
  roots, _ = build(name)
  ex = explain(*roots)
  res = callify(*roots, cache=False)
  rep = res.report
  assert (ex.e_nodes, ex.e_classes, ex.cost, ex.baseline_cost) == (rep.e_nodes, rep.e_classes, rep.cost, rep.baseline_cost)
  keys = list(res.buffer_map)
  assert len(keys) == len(ex.points)
  bufs = [_buffer(res.buffer_map[k]).arg.uid for k in keys]
  for j, (k, p) in enumerate(zip(keys, ex.points)):
    v = res.buffer_map[k]
    assert (p.kind == "view") == any(n.op is Ops.SLICE for n in toposort([v])), (name, p)
    assert sorted(p.shared_with) == sorted(f"#{i}" for i in range(len(keys)) if i != j and bufs[i] == bufs[j]), (name, p)
    if p.kind == "alias": assert "contiguous_of_assign" in p.rules or p.node.startswith("AFTER")
    if p.kind == "fresh": assert p.decided_by in ("materialize_contiguous", "materialize_assign")
    assert sum(m.status == "chosen" for m in p.members) == 1


@pytest.mark.parametrize("name", ["model:mlp", "gen:6"])
def test_explain_follows_callifys_fusion_mode(name, monkeypatch):
  """explain's e-graph is callify's in either mode (CALLSAT_FUSION, or fusion=; cost by default), candidates' stored
  forms included in cost mode."""
  roots, _ = build(name)
  monkeypatch.delenv("CALLSAT_FUSION", raising=False)
  ex, rep = explain(*roots), callify(*roots, cache=False).report
  assert rep.fusion == "cost" and (ex.e_nodes, ex.e_classes, ex.cost) == (rep.e_nodes, rep.e_classes, rep.cost)
  monkeypatch.setenv("CALLSAT_FUSION", "rules")
  ex2, rep2 = explain(*roots, fusion="cost"), callify(*roots, cache=False).report
  assert rep2.fusion == "rules" and (ex2.e_nodes, ex2.e_classes) == (ex.e_nodes, ex.e_classes) != (rep2.e_nodes, rep2.e_classes)
  ex3 = explain(*roots)
  if rep2.settled:   # no decision in rules mode: callify built the CALL without the e-graph explain shows, at its cost
    assert (rep2.e_nodes, rep2.iterations) == (0, 0) and ex3.e_nodes > 0 and ex3.cost == rep2.cost
  else: assert (ex3.e_nodes, ex3.e_classes, ex3.cost) == (rep2.e_nodes, rep2.e_classes, rep2.cost)

def test_explanation_data_and_lookup():
  out, b = _views()
  ex = explain(out, b, labels=["out", "b"])
  d = json.loads(json.dumps(ex.to_dict()))
  assert [p["kind"] for p in d["points"]] == ["fresh", "view"] and d["cost"] < d["baseline_cost"]
  assert ex.point(1) is ex.point("b") is ex.point("out1") is ex.point("#1")
  assert [p.kind for p in ex.select(["b"]).points] == ["view"]
  with pytest.raises(CallsatError, match=r"no realize point named 'zz'.*#0, out0, out"): ex.point("zz")
  with pytest.raises(CallsatError, match="ordered"): explain(out, b, schedule="reference")
  with pytest.raises(CallsatError, match="labels"): explain(out, b, labels=["x"])
  # a schedule without the view rule: the slice is stored
  from egraph.engine.runner import Schedule
  p = explain(out, b, schedule=Schedule("noview", rules=("drop_detach",))).point(1)
  assert p.kind == "fresh" and "contiguous_to_view" not in p.rules

# ---- export: .egg ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,schedule", [("model:views", "saturate"), ("model:mlp", "saturate"), ("gen:1", "saturate"),
                                           ("gen:2", "saturate"), ("gen:1", "reference"), ("gen:2", "baseline")])
def test_egg_replays_to_the_same_egraph(name, schedule):
  roots, _ = build(name)
  enc = encode(roots)
  text = egg_text(schedule=schedule, enc=enc)
  assert re.search(r'^\(leaf_row \d+ "BUFFER" \d+\)$', text, re.M) and "(run-schedule (saturate (run load)))" in text
  for j, k in enumerate(enc.keys): assert f";;   #{j}: (N {enc.key_ids[k.id]}) {k.op.name}" in text
  replayed = replay(text)
  runner = saturate(encode(roots), schedule).runner
  assert constructor_sizes(replayed) == constructor_sizes(runner.egraph)
  if schedule == "saturate":   # extraction over the replayed e-graph gives callify's cost
    g = EGraphView(replayed.freeze(), replayed, enc)
    costs = g.local_costs(COST_PRESETS["bytes"])
    _, choice = knuth(g, costs, g.pinned_allowed())
    cost = dag_cost(g, costs, choice, [g.class_of_id[enc.key_ids[k.id]] for k in enc.keys])
    assert cost == callify(*roots, cache=False).report.cost

# ---- export: egraph-serialize JSON -----------------------------------------------------------------------------------

def test_json_is_egraph_serialize_for_extraction_gym():
  out, b = _views()
  enc = encode([out.node, b.node])
  d = json.loads(json.dumps(json_graph(enc=enc)))
  assert set(d) == {"nodes", "root_eclasses", "class_data"}
  nodes = d["nodes"]
  for nid, n in nodes.items():
    assert set(n) == {"op", "children", "eclass", "cost", "subsumed"} and n["cost"] >= 0
    assert all(c in nodes for c in n["children"]) and n["eclass"] in d["class_data"]
  assert not any(n["op"].startswith(("CONTIGUOUS", "N(")) for n in nodes.values())   # never extractable
  classes = {n["eclass"] for n in nodes.values()}
  assert len(d["root_eclasses"]) == 2 and set(d["root_eclasses"]) <= classes
  # the view's class offers the RESHAPE(SLICE) view and the store; a cheapest-tree extractor over the file picks the view
  enc2 = encode([out.node, b.node])
  g = saturate(enc2).graph
  costs = g.local_costs(COST_PRESETS["bytes"])
  best, _ = knuth(g, costs, g.pinned_allowed())
  chosen = json_choice(d)
  def tree_cost(nid):
    n = nodes[nid]
    return n["cost"] + sum(tree_cost(next(x for x in chosen if nodes[x]["eclass"] == nodes[c]["eclass"])) for c in n["children"])
  root_b = d["root_eclasses"][1]
  ops_b = sorted(n["op"].split()[0] for n in nodes.values() if n["eclass"] == root_b)
  assert ops_b == ["AFTER", "RESHAPE"]
  pick_b = next(x for x in chosen if nodes[x]["eclass"] == root_b)
  assert nodes[pick_b]["op"].startswith("RESHAPE")
  # the file states callify's extraction problem: its cheapest trees cost what callify's extraction finds
  assert sorted(tree_cost(next(x for x in chosen if nodes[x]["eclass"] == r)) for r in d["root_eclasses"]) == \
         sorted(best[g.class_of_id[enc2.key_ids[k.id]]] for k in enc2.keys)

def test_raw_json_is_egglogs_serialization():
  out, b = _views()
  d = json_graph(out, b, raw=True)
  ops = {n["op"] for n in d["nodes"].values()}
  assert {"N", "U", "leaf_row", "fresh"} <= ops and len(d["root_eclasses"]) == 2

# ---- export: SVG -----------------------------------------------------------------------------------------------------

def _graphviz_missing():
  try: require_graphviz(); return None
  except CallsatError as e: return str(e)

@pytest.mark.skipif(_graphviz_missing() is not None, reason=f"{_graphviz_missing()}")
def test_svg_of_call_and_egraph(tmp_path):
  out, b = _views()
  written = export(out, b, svg_path=str(tmp_path / "v.svg"))
  assert written == [str(tmp_path / "v.svg"), str(tmp_path / "v.egraph.svg")]
  call, eg = (open(p).read() for p in written)
  assert "<svg" in call and "STORE" in call and "PARAM" in call and "SLICE" in call
  assert "<svg" in eg and "(realize)" in eg and "RESHAPE" in eg

def test_svg_without_graphviz_says_what_to_install(monkeypatch):
  import shutil
  monkeypatch.setitem(sys.modules, "graphviz", None)
  with pytest.raises(CallsatError, match=r"pip install -e '\.\[graph\]'"): require_graphviz()
  monkeypatch.delitem(sys.modules, "graphviz")
  pytest.importorskip("graphviz")
  monkeypatch.setattr(shutil, "which", lambda name: None)
  with pytest.raises(CallsatError, match="apt-get install graphviz"): require_graphviz()

# ---- the command line ------------------------------------------------------------------------------------------------

SCRIPT = """
import numpy as np
from egraph import Tensor
def build():
  a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
  rows = a[1:].contiguous()
  return {"rows": rows, "total": (rows * 3).sum()}
"""

def test_cli_explain(tmp_path, capsys):
  script = tmp_path / "model.py"; script.write_text(SCRIPT)
  assert main(["explain", "--script", str(script), "--tensor", "rows", "--json", str(tmp_path / "e.json")]) == 0
  text = capsys.readouterr().out
  assert "rows: CONTIGUOUS float32 (2, 4)" in text and "=> view" in text and "contiguous_to_view" in text
  d = json.loads((tmp_path / "e.json").read_text())
  assert [p["kind"] for p in d["points"]] == ["view"] and "rows" in d["points"][0]["names"]
  assert main(["explain", "--model", "views", "--tensor", "0"]) == 0
  assert "=> fresh" in capsys.readouterr().out
  assert main(["explain", "--model", "views", "--tensor", "nope"]) == 2
  assert "no realize point named 'nope'" in capsys.readouterr().err
  assert main(["explain", "--script", str(script), "--entry", "missing"]) == 2
  assert "defines no function 'missing'" in capsys.readouterr().err

def test_cli_export(tmp_path, capsys, monkeypatch):
  egg, js = tmp_path / "v.egg", tmp_path / "v.json"
  assert main(["export", "--model", "views", "--egg", str(egg), "--json", str(js)]) == 0
  assert f"wrote {egg}" in capsys.readouterr().out
  sizes = constructor_sizes(replay(egg.read_text()))
  d = json.loads(js.read_text())
  assert sizes["e-classes"] >= len({n["eclass"] for n in d["nodes"].values()}) > 0 and len(d["root_eclasses"]) == 2
  assert main(["export", "--model", "views"]) == 2 and "at least one of" in capsys.readouterr().err
  monkeypatch.setitem(sys.modules, "graphviz", None)
  assert main(["export", "--model", "views", "--svg", str(tmp_path / "x.svg")]) == 2
  assert "graphviz" in capsys.readouterr().err and not (tmp_path / "x.svg").exists()
