"""Export the callify e-graph of a graph: (a) a replayable egglog program (`.egg`), (b) egraph-serialize JSON for
extraction-gym, (c) SVG drawings of the extracted CALL and of the e-graph (needs the `graphviz` package and `dot`).

(a) `egg_text`: the prelude `egraph.engine.language.program(...)`, every inserted row as a fact (`(un_row 5 "CONTIGUOUS" 8 4)`)
    and the schedule as `run-schedule` commands. Any egglog 13.2 replays it (`egglog out.egg`, or
    `bindings.EGraph().run_program(*eg.parse_program(text))`) to the e-graph callify saturates, with the same
    e-classes and e-nodes per constructor. Comments list the arg table (what each arg id means) and the realize points.
(b) `json_graph`: `bindings.EGraph.serialize` (egraph-serialize's format), cleaned for extraction-gym: only the term
    constructors (L/U/B/R/V/Cons/Nil) are kept; the op name and arg id, which egglog serializes as primitive children,
    become the node's `op` text ("RESHAPE (2, 4)"); the `cost` is the callify cost model's cost of that e-node; e-nodes
    callify may never extract (CONTIGUOUS markers, AFTERs into computed values, forms that break the identity
    constraints of extraction, see notes/design.md) are left out, so any extractor that reads the file solves callify's
    extraction problem. E-classes are named "c<k>" as in `callsat explain`; `root_eclasses` are the realize points.
    `raw=True` returns egglog's serialization untouched (all tables, unit costs)."""
from __future__ import annotations
import json, math, shutil
from egraph.ir.ops import Node, Ops, toposort
from egraph.ir.errors import CallsatError
from egraph.engine.encode import encode, Encoding
from egraph.engine.runner import Runner, Schedule, Limits, SCHEDULE_PRESETS, resolve, guarded, declarations, ordered_ruleset, OPTIMIZE_STEP
from egraph.engine.cost import CostModel, COST_PRESETS
from rules.vocabulary import EXTRACTABLE as CONSTRUCTORS
from egraph.engine.driver import callify, roots_of, saturate
from egraph.tools.explain import arg_text
import egglog.bindings as eb

_SPAN = eb.RustSpan("callsat/export", 0, 0)

def _encode(roots: list[Node]) -> Encoding:
  enc = encode(roots)
  if not enc.keys: raise CallsatError("export: the graph has no realize point (nothing for callify to do)")
  return enc

# ---- (a) egglog text -------------------------------------------------------------------------------------------------

def _lit(v) -> str:
  if isinstance(v, str): return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
  return str(int(v))

def _comment(s: str) -> str: return " ".join(str(s).split())

def egg_text(*tensors, schedule: str | Schedule = "saturate", enc: Encoding | None = None) -> str:
  """A replayable egglog program: prelude, the inserted rows as facts, and the schedule callify runs."""
  sched: Schedule = resolve(schedule, SCHEDULE_PRESETS, "schedule")
  enc = enc if enc is not None else _encode(roots_of(tensors))
  Runner(sched)     # validates the schedule (unknown rules, rules with ordered)
  out = [f";; callsat export: the callify e-graph of {len(enc.keys)} realize point(s), schedule {sched.name}",
         ";; replay: egglog this-file.egg  (egglog 13.2), or bindings.EGraph().run_program(*eg.parse_program(text))",
         ";; arg ids (the i64 after each op name): id = dtype arg"]
  out += [f";;   {i} = {getattr(d, 'name', d)} {_comment(repr(a))}" for i, (d, a) in enumerate(enc.args) if i]
  out += [";; realize points: (N id) names the realized e-class"]
  out += [f";;   #{j}: (N {enc.key_ids[k.id]}) {k.op.name} {_comment(k.shape)}" for j, k in enumerate(enc.keys)]
  out.append(declarations(sched))
  out.append(";; the inserted graph: one fact per row (what callify loads with `input`)")
  for rel, rows in enc.rows.items():
    out.extend(f"({rel} {' '.join(map(_lit, r))})" for r in rows)
  out.append(";; the schedule")
  out.append("(run-schedule (saturate (run load)))")
  if sched.ordered is None:
    out.append("(run-schedule (saturate (run materialize)))")
    if sched.rules != ():
      out.append(f"(run-schedule (saturate {OPTIMIZE_STEP}))" if sched.max_iterations is None
                 else f"(run-schedule (repeat {sched.max_iterations} {OPTIMIZE_STEP}))")
  else:
    seq = " ".join(f"(saturate (run {ordered_ruleset(n)}))" for n in sched.ordered)
    out.append("(run-schedule (saturate (run capture)))")
    out.append(f"(run-schedule (saturate (seq {seq})))" if sched.max_iterations is None
               else f"(run-schedule (repeat {sched.max_iterations} (seq {seq})))")
    out.append("(run-schedule (saturate (run fallback)))")
  return "\n".join(out) + "\n"

def constructor_sizes(egraph) -> dict[str, int]:
  """E-nodes per term constructor of a bindings EGraph (what `print-size` says), and the e-classes they form."""
  out = guarded("counting e-nodes", lambda: egraph.run_program(*egraph.parse_program("(print-size)")))
  sizes = {name: n for name, n in out[0].sizes if name in CONSTRUCTORS}
  fns = guarded("reading the e-graph", egraph.freeze).functions
  sizes["e-classes"] = len({r.output for name in CONSTRUCTORS if name in fns for r in fns[name].rows if not r.subsumed})
  return sizes

def replay(text: str):
  """Run an exported program in a fresh egglog e-graph; returns it."""
  eg = eb.EGraph()
  guarded("replaying the exported program", lambda: eg.run_program(*eg.parse_program(text)))
  return eg

# ---- (b) egraph-serialize JSON ---------------------------------------------------------------------------------------

def json_graph(*tensors, cost: str | CostModel = "bytes", schedule: str | Schedule = "saturate",
               limits: str | Limits | None = None, raw: bool = False, enc: Encoding | None = None) -> dict:
  """The saturated e-graph in egraph-serialize's JSON format (a dict; `json.dumps` it), ready for extraction-gym."""
  model: CostModel = resolve(cost, COST_PRESETS, "cost model")
  enc = enc if enc is not None else _encode(roots_of(tensors))
  sat = saturate(enc, schedule, limits)
  runner = sat.runner
  tracked = [enc.key_ids[k.id] for k in enc.keys]
  ser = guarded("serializing the e-graph", lambda: runner.egraph.serialize(
    [eb.Call(_SPAN, "N", [eb.Lit(_SPAN, eb.Int(t))]) for t in tracked]))
  if ser.truncated_functions or ser.discarded_functions:
    raise CallsatError(f"export: egglog truncated {ser.truncated_functions} / discarded {ser.discarded_functions}")
  data = json.loads(ser.to_json())
  if raw: return data
  g = sat.graph
  costs, allowed = g.local_costs(model), g.pinned_allowed()
  nodes = data["nodes"]
  sig = {(g.op[e], g.arg[e], g.kids[e]): e for e in range(g.n_enodes)}
  prim = lambda nid: nodes[nid]["op"]
  cls: dict[str, int] = {}          # serialized class -> EGraphView class
  for nid, n in nodes.items():
    if n["op"] == "N": cls[n["eclass"]] = g.class_of_id[int(prim(n["children"][0]))]
  terms = {nid: n for nid, n in nodes.items() if n["op"] in CONSTRUCTORS}
  enode: dict[str, int] = {}
  todo = dict(terms)
  while todo:                       # classes without an inserted handle are found through their e-nodes, children first
    progress = False
    for nid, n in list(todo.items()):
      ctor, ch = n["op"], n["children"]
      if ctor in ("Cons", "Nil"): key, kids = (ctor, 0), ch
      else: key, kids = (prim(ch[0]).strip('"'), int(prim(ch[1]))), ch[2:]
      kc = [cls.get(nodes[c]["eclass"]) for c in kids]
      if None in kc: continue
      e = sig.get((*key, tuple(kc)))
      if e is None: raise CallsatError(f"export: serialized e-node {nid} {key} is not in the frozen e-graph")
      enode[nid] = e; cls.setdefault(n["eclass"], g.cls[e]); del todo[nid]; progress = True
    if not progress: raise CallsatError(f"export: {len(todo)} serialized e-nodes could not be matched")
  paid = g.cost_kids   # a child whose cost an e-node does not pay (a SLICE's buffer: its own CALL argument) is not a child here
  keep = {nid for nid, e in enode.items() if costs[e] is not None and allowed[e]}
  while True:                       # drop e-nodes with a child class that has nothing extractable left
    live = {g.cls[enode[nid]] for nid in keep}
    drop = {nid for nid in keep if any(k not in live for k in paid[enode[nid]])}
    if not drop: break
    keep -= drop
  rep: dict[int, str] = {}
  for nid in sorted(keep, key=lambda x: enode[x]): rep.setdefault(g.cls[enode[nid]], nid)
  out_nodes = {}
  for nid in sorted(keep, key=lambda x: enode[x]):
    e = enode[nid]
    text = g.op[e] + ((" " + a) if (a := arg_text(enc, g.op[e], g.arg[e])) else "")
    if unpaid := [k for k in g.kids[e] if k not in paid[e]]: text += " of " + ", ".join(f"c{k}" for k in unpaid)
    out_nodes[nid] = {"op": text, "children": [rep[k] for k in paid[e]], "eclass": f"c{g.cls[e]}",
                      "cost": float(costs[e]), "subsumed": False}
  roots = list(dict.fromkeys(f"c{g.class_of_id[t]}" for t in tracked))
  return {"nodes": out_nodes, "root_eclasses": roots,
          "class_data": {f"c{k}": {"type": "T"} for k in sorted({g.cls[enode[n]] for n in keep})}}

# ---- (c) SVG ---------------------------------------------------------------------------------------------------------

def require_graphviz():
  """The graphviz module, if it and Graphviz's `dot` binary are installed; otherwise a CallsatError saying what to install."""
  try:
    import graphviz
  except ImportError as e:
    raise CallsatError("SVG export needs the graphviz Python package and Graphviz's `dot` program: "
                       "pip install -e '.[graph]' (or pip install graphviz) and install Graphviz "
                       "(apt-get install graphviz / brew install graphviz)") from e
  if shutil.which("dot") is None:
    raise CallsatError("SVG export needs Graphviz's `dot` program on PATH (apt-get install graphviz / brew install graphviz); "
                       "the graphviz Python package is installed")
  return graphviz

def _label(n: Node) -> str:
  if n.op is Ops.BUFFER: arg = f"buf{n.arg.uid}"
  elif n.op is Ops.PARAM: arg = f"slot {n.arg.slot}"
  elif n.op in (Ops.CALL, Ops.FUNCTION, Ops.SINK): arg = ""
  else: arg = "" if n.arg is None else str(n.arg)
  if len(arg) > 30: arg = arg[:27] + "..."
  shape = "" if n.shape is None else f" {n.shape}"
  return f"{n.op.name}{shape}" + (f"\n{arg}" if arg else "")

def call_dot(call: Node):
  """The CALL (body and arguments) as a graphviz Digraph: one box per node, edges from a node to its sources."""
  gv = require_graphviz()
  d = gv.Digraph("CALL", graph_attr={"rankdir": "BT"}, node_attr={"shape": "box", "fontname": "helvetica", "fontsize": "10"})
  for n in toposort([call], enter_calls=True):
    color = {Ops.STORE: "lightsalmon", Ops.AFTER: "lightblue", Ops.PARAM: "palegreen", Ops.SLICE: "khaki",
             Ops.BUFFER: "palegreen"}.get(n.op)
    d.node(f"n{n.id}", _label(n), **({"style": "filled", "fillcolor": color} if color else {}))
    for i, s in enumerate(n.src): d.edge(f"n{s.id}", f"n{n.id}", label=str(i) if len(n.src) > 1 else None)
  return d

def egraph_dot(data: dict, chosen: set[str] = frozenset()):
  """A cleaned egraph-serialize dict (json_graph) as a Digraph: one cluster per e-class, e-nodes inside, edges to the
  child class (its representative e-node); `chosen` e-nodes are drawn bold."""
  gv = require_graphviz()
  d = gv.Digraph("egraph", graph_attr={"compound": "true", "rankdir": "BT", "fontname": "helvetica"},
                 node_attr={"shape": "box", "fontname": "helvetica", "fontsize": "9"})
  by_class: dict[str, list[str]] = {}
  for nid, n in data["nodes"].items(): by_class.setdefault(n["eclass"], []).append(nid)
  roots = set(data["root_eclasses"])
  safe = lambda s: s.replace("-", "_")
  for c, nids in by_class.items():
    with d.subgraph(name=f"cluster_{c}") as sg:
      sg.attr(label=c + (" (realize)" if c in roots else ""), style="rounded" + (",bold" if c in roots else ""))
      for nid in nids:
        n = data["nodes"][nid]
        sg.node(safe(nid), f"{n['op']}\ncost {n['cost']:g}", **({"style": "bold,filled", "fillcolor": "lightblue"} if nid in chosen else {}))
  for nid, n in data["nodes"].items():
    for ch in n["children"]:
      d.edge(safe(nid), safe(ch), lhead=f"cluster_{data['nodes'][ch]['eclass']}")
  return d

def svg(dot) -> str: return dot.pipe(format="svg").decode()

def json_choice(data: dict) -> set[str]:
  """Cheapest-tree choice per e-class over a json_graph dict (bottom-up fixpoint): the e-node ids chosen."""
  best: dict[str, float] = {}
  pick: dict[str, str] = {}
  nodes = data["nodes"]
  changed = True
  while changed:
    changed = False
    for nid, n in nodes.items():
      kids = [nodes[c]["eclass"] for c in n["children"]]
      if any(k not in best for k in kids): continue
      c = n["cost"] + sum(best[k] for k in kids)
      if c < best.get(n["eclass"], math.inf): best[n["eclass"]], pick[n["eclass"]] = c, nid; changed = True
  return set(pick.values())

def export(*tensors, egg: str | None = None, json_path: str | None = None, svg_path: str | None = None,
           cost: str | CostModel = "bytes", schedule: str | Schedule = "saturate", raw_json: bool = False) -> list[str]:
  """Write the requested files; with `svg_path` X.svg, the CALL goes to X.svg and the e-graph to X.egraph.svg.
  Returns the paths written."""
  if svg_path: require_graphviz()      # say what to install before doing any work
  enc = _encode(roots_of(tensors))     # one encoding: the .egg, the JSON and the drawing name the same buffers
  written = []
  if egg:
    with open(egg, "w") as f: f.write(egg_text(schedule=schedule, enc=enc))
    written.append(egg)
  if json_path:
    with open(json_path, "w") as f: json.dump(json_graph(cost=cost, schedule=schedule, raw=raw_json, enc=enc), f, indent=1)
    written.append(json_path)
  if svg_path:
    res = callify(*tensors, cost=cost, schedule=schedule, cache=False)
    with open(svg_path, "w") as f: f.write(svg(call_dot(res.call)))
    data = json_graph(cost=cost, schedule=schedule, enc=enc)
    second = (svg_path[:-4] if svg_path.endswith(".svg") else svg_path) + ".egraph.svg"
    with open(second, "w") as f: f.write(svg(egraph_dot(data, json_choice(data))))
    written += [svg_path, second]
  return written
