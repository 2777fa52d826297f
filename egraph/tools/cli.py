"""`callsat` command line: `callsat demo [--model NAME]`, `callsat order` (saturation vs rule orders over a corpus),
`callsat explain` (why a realized tensor became a view, a fresh buffer or an alias), `callsat export` (.egg / JSON),
`callsat cuda [--model NAME] [--out FILE] [--emulate]` (the model's CALL as a CUDA translation unit + launch plan),
`callsat capture --script PROG --out FILE` (a tinygrad program's graphs as a corpus; order/explain/export read it with
`--corpus FILE`)."""
from __future__ import annotations
import argparse, importlib.util, json, os, runpy, subprocess, sys, time
import numpy as np
from egraph.ir.errors import CallsatError
from egraph.ir.ops import substitute
from egraph.ir.storage import STORAGE
from egraph.frontend.tensor import Tensor
from egraph.engine.driver import callify
from egraph.frontend.models import MODELS
from egraph.tools.explain import explain as run_explain
from egraph.tools.export import export as run_export, require_graphviz
from egraph.tools import ordering
from egraph.ir import corpus
from lower.render.cuda import render as C
from lower.device import cuda as cuda_dev
from lower.runtime import read

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout holding this egraph package

def demo(args) -> int:
  out, ref = MODELS[args.model]()
  res = callify(out, cost=args.cost, schedule=args.schedule)
  print(f"model: {args.model}   output {out.shape} {out.dtype.name} on {out.device}")
  print(res.report)
  if args.schedule == "saturate":   # what saturation wins over applying the same rules in tinygrad's order
    print(ordering.versus_order(res, callify(out, cost=args.cost, schedule="reference", cache=False)))
  print(f"  buffer_map {len(res.buffer_map)} entries; CALL has {len(res.call.src) - 1} args")
  t1 = time.perf_counter()
  got = out.numpy()
  print(f"  realize (callify again + execute on {out.device}): {1e3 * (time.perf_counter() - t1):.1f} ms")
  err = float(np.max(np.abs(got.astype(np.float64) - ref)))
  ok = np.allclose(got, ref, rtol=1e-4, atol=1e-5)
  print(f"  check vs numpy: max abs error {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
  return 0 if ok else 1

def outputs(*paths) -> None:
  """Every output path's directory must exist: said before any work, not as a traceback after it."""
  for p in paths:
    if p and p != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(p))):
      raise CallsatError(f"cannot write {p!r}: directory {os.path.dirname(os.path.abspath(p))!r} does not exist")

def at_least(name: str, v: int, lo: int) -> None:
  if v < lo: raise CallsatError(f"{name} must be >= {lo}, got {v}")

def order(args) -> int:
  at_least("--orders/-k", args.orders, 0); at_least("--workers", args.workers, 1); at_least("--generated", args.generated, 0)
  if args.solver_s is not None and not args.solver_s > 0: raise CallsatError(f"--solver-s must be > 0, got {args.solver_s}")
  if args.corpus: names = [n for n, _ in corpus.pick(args.corpus, args.graphs)] if args.graphs else corpus.names(args.corpus)
  else: names = [ordering.check_name(g) for g in args.graphs] if args.graphs else ordering.corpus_names(args.generated)
  outputs(args.csv, args.json, args.plot and ordering.plot_path(args.plot))
  if args.plot: ordering.require_matplotlib()      # say what to install before running anything
  if args.ray is not None:
    ordering.require_ray()                         # say what to install before running anything
    if args.workers > 1: raise CallsatError("--workers and --ray exclude each other: with --ray the cluster's CPUs run the sweep")
  def progress(i: int, n: int, r) -> None:        # long sweeps: one line per graph as it finishes, on stderr
    if isinstance(r, ordering.Failure): print(f"[{i}/{n}] {r.graph}: FAILED {r.error}", file=sys.stderr, flush=True); return
    print(f"[{i}/{n}] {r.graph}: saturated {r.saturated.cost}, orders {min((o.cost for o in r.orders), default='-')}.."
          f"{max((o.cost for o in r.orders), default='-')}", file=sys.stderr, flush=True)
  failures = [] if args.keep_going else None
  results = ordering.sweep(names, k=args.orders, seed=args.seed, workers=args.workers, ray=args.ray, progress=progress,
                           corpus=args.corpus, failures=failures, certify=args.certify, fusion=args.fusion,
                           solver_s=args.solver_s)
  print(ordering.table(results))
  dep = sum(r.order_dependent for r in results)
  print(f"\n{dep}/{len(results)} graphs depend on the rule order; saturation is never worse than an order on "
        f"{sum(r.saturated_best for r in results)}/{len(results)}")
  if args.fusion == "cost": print(ordering.predicted_summary(results))
  if args.certify: print(ordering.certificate_summary(results))
  if args.csv:
    with open(args.csv, "w") as f: f.write(ordering.to_csv(results))
  if args.json:
    with open(args.json, "w") as f: f.write(ordering.to_json(results))
  if args.plot: print(f"plot written to {ordering.plot(results, args.plot)}")
  if failures:
    print(f"\n{len(failures)} graph(s) failed and are not in the table:\n" + "\n".join(f"  {f.graph}: {f.error}" for f in failures))
    return 1
  return 0

def corpus_graph(path: str, name: str | None) -> corpus.Graph:
  """Graph `name` of a corpus file; without a name, the corpus must hold exactly one graph."""
  if name is None:
    have = corpus.names(path)
    if len(have) != 1: raise CallsatError(f"--corpus {path}: give --graph NAME (it has {len(have)} graphs: {', '.join(have[:5])}"
                                          f"{', ...' if len(have) > 5 else ''})")
    name = have[0]
  return corpus.get(path, name)

def load_tensors(args) -> tuple[list, list[str]]:
  """(output tensors, labels) from `--model NAME` (its output, labelled "out"), `--corpus FILE --graph NAME` (the graph's
  roots as Nodes, labelled out0, out1, ...) or `--script PATH --entry FN`: FN() may return a Tensor, a list/tuple of
  Tensors (labelled out0, out1, ...) or a dict {label: Tensor}."""
  if args.corpus is not None:
    if args.script is not None: raise CallsatError("--corpus and --script exclude each other")
    g = corpus_graph(args.corpus, args.graph)
    return list(g.roots), [f"out{i}" for i in range(len(g.roots))]
  if args.graph is not None: raise CallsatError("--graph names a graph of --corpus FILE; give --corpus too")
  if args.script is None:
    if args.model not in MODELS: raise CallsatError(f"unknown model {args.model!r}; choose one of {sorted(MODELS)}")
    out, _ = MODELS[args.model]()
    return [out], ["out"]
  try: ns = runpy.run_path(args.script, run_name="callsat_script")
  except FileNotFoundError as e: raise CallsatError(f"script {args.script!r} not found") from e
  fn = ns.get(args.entry)
  if not callable(fn): raise CallsatError(f"script {args.script!r} defines no function {args.entry!r} (use --entry NAME)")
  res = fn()
  if isinstance(res, Tensor): pairs = [("out0", res)]
  elif isinstance(res, dict): pairs = [(str(k), v) for k, v in res.items()]
  elif isinstance(res, (list, tuple)): pairs = [(f"out{i}", v) for i, v in enumerate(res)]
  else: raise CallsatError(f"{args.entry}() returned {type(res).__name__}; return a Tensor, a list of Tensors or a dict of them")
  bad = [k for k, v in pairs if not isinstance(v, Tensor)]
  if bad or not pairs: raise CallsatError(f"{args.entry}() must return Tensors; not Tensors: {bad or 'nothing returned'}")
  return [v for _, v in pairs], [k for k, _ in pairs]

def explain(args) -> int:
  outputs(args.json)
  tensors, labels = load_tensors(args)
  ex = run_explain(*tensors, labels=labels, cost=args.cost, schedule=args.schedule)
  ex = ex.select([int(t) if t.isdigit() else t for t in args.tensors or []])
  if args.json == "-": print(json.dumps(ex.to_dict(), indent=1)); return 0
  print(ex)
  if args.json:
    with open(args.json, "w") as f: json.dump(ex.to_dict(), f, indent=1)
    print(f"\nexplanation written to {args.json}")
  return 0

def export(args) -> int:
  if not (args.egg or args.json or args.svg): raise CallsatError("export: give at least one of --egg, --json, --svg")
  outputs(args.egg, args.json, args.svg)
  if args.svg: require_graphviz()
  tensors, _ = load_tensors(args)
  for path in run_export(*tensors, egg=args.egg, json_path=args.json, svg_path=args.svg, cost=args.cost,
                         schedule=args.schedule, raw_json=args.raw_json):
    print(f"wrote {path}")
  return 0

def _source_args(p) -> None:
  p.add_argument("--model", default="views", help=f"a demo model: {', '.join(sorted(MODELS))} (default views)")
  p.add_argument("--script", metavar="PATH", help="a Python file defining a function that returns output Tensors")
  p.add_argument("--entry", default="build", help="the function in --script (default build)")
  p.add_argument("--corpus", metavar="FILE", help="a graph corpus (callsat capture, notes/corpus.md); pick one with --graph")
  p.add_argument("--graph", metavar="NAME", help="the graph of --corpus to use (optional if it holds one graph)")
  p.add_argument("--cost", default="bytes", help="cost model preset: bytes, kernels, buffers, nodes")
  p.add_argument("--schedule", default="saturate", help="schedule preset")

def cuda(args) -> int:
  outputs(args.out)
  out, ref = MODELS[args.model]()
  res = callify(out)
  lw = C.plans([res.call])[0]
  text = C.plan_comment(lw.plan) + lw.plan["source"]
  if args.out:
    with open(args.out, "w") as f: f.write(text)
    print(f"{len(lw.plan['kernels'])} kernel(s), {len(lw.plan['steps'])} step(s) written to {args.out}")
  else: sys.stdout.write(text)
  if args.emulate:
    S = STORAGE.copy()
    cuda_dev.run_emulated(res.call, S)
    got = read(substitute([out.node], res.buffer_map)[0], S)
    ok = np.allclose(got, ref, rtol=1e-4, atol=1e-5)
    print(f"emulated on the CPU (lower/device/cuda_emu.h): {'OK' if ok else 'MISMATCH'} vs numpy", file=sys.stderr)
    return 0 if ok else 1
  return 0

def capture(args) -> int:
  """Runs `python -m egraph.bridge.capture` in a child process: tinygrad (and whatever the program does to it) stays out of
  this one, and DEV is set before tinygrad is imported, as `DEV=NULL python prog.py` would."""
  outputs(args.out)
  if not os.path.isfile(args.script): raise CallsatError(f"script {args.script!r} not found")
  if importlib.util.find_spec("tinygrad") is None:
    raise CallsatError("capture needs tinygrad 0.14.0: pip install -e '.[tinygrad]' (or pip install tinygrad==0.14.0)")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])}   # this egraph
  argv = ["--script", args.script, "--out", args.out] + (["--unique"] if args.unique else []) + (["--opaque"] if args.opaque else [])
  for k in ("entry", "name", "device"):
    if getattr(args, k): argv += [f"--{k}", getattr(args, k)]
  if args.device: env["DEV"] = args.device
  return subprocess.run([sys.executable, "-m", "egraph.bridge.capture", *argv], env=env).returncode

def capture_arguments(p: argparse.ArgumentParser) -> None:
  """The options of `callsat capture` (also `python -m egraph.bridge.capture`, which the CLI runs in a child process)."""
  p.add_argument("--script", required=True, metavar="PATH", help="the tinygrad program (run as __main__)")
  p.add_argument("--entry", metavar="FN", help="call FN() after the script ran and realize the Tensors it returns "
                                               "(default: build, if the script defines it)")
  p.add_argument("--out", required=True, metavar="FILE", help="the corpus to write: .jsonl, or .jsonl.gz")
  p.add_argument("--name", metavar="PREFIX", help="records are named PREFIX/0, PREFIX/1, ... (default: the script's name)")
  p.add_argument("--device", metavar="DEV", help="tinygrad's default device, e.g. NULL (graphs only, no compute)")
  p.add_argument("--unique", action="store_true", help="skip a graph equal to one already captured")
  p.add_argument("--opaque", action="store_true", help="keep tinygrad's arithmetic OPAQUE (default: ALU/REDUCE/CONST "
                                                       "ops recorded as callsat ops where callsat can say them)")

def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="callsat", description="Schedule tensor graphs by equality saturation.")
  sub = p.add_subparsers(dest="cmd", required=True)
  d = sub.add_parser("demo", help="callify a small model, print the report, execute it and check it against numpy")
  d.add_argument("--model", choices=sorted(MODELS), default="ema")
  d.add_argument("--cost", default="bytes", help="cost model preset: bytes, kernels, buffers, nodes")
  d.add_argument("--schedule", default="saturate", help="schedule preset: saturate, once, baseline")
  o = sub.add_parser("order", help="run a corpus under saturation and under K random rule orders (ordered, destructive mode)")
  o.add_argument("--orders", "-k", type=int, default=8, help="random orders per graph")
  o.add_argument("--generated", type=int, default=8, help="generated graphs in the corpus (besides the demo models)")
  o.add_argument("--graph", dest="graphs", action="append", help="corpus entry model:NAME or gen:SEED, or a graph name of "
                                                                   "--corpus (repeatable)")
  o.add_argument("--corpus", metavar="FILE", help="sweep the graphs of a corpus file (callsat capture) instead of the "
                                                  "built-in corpus; cost-only, nothing is executed")
  o.add_argument("--keep-going", action="store_true", help="a graph that fails is listed after the table (exit 1) "
                                                               "instead of stopping the sweep")
  o.add_argument("--certify", action="store_true", help="check the saturated run's extraction against an exact ILP "
                                                           "(HiGHS): proven optimal, its gap, or not proven; with both times")
  o.add_argument("--fusion", choices=("rules", "cost"), help="who decides the kernel boundaries (default: env CALLSAT_FUSION, "
                 "else cost); with cost every schedule's partition is priced by the time model and the orders include "
                 "store_candidate")
  o.add_argument("--solver-s", type=float, metavar="S", help="with --fusion cost: each run's partition search gets at "
                 "least S seconds (callify's own share of its time varies with load; a study should not)")
  o.add_argument("--seed", type=int, default=0)
  o.add_argument("--workers", type=int, default=1, help="processes")
  o.add_argument("--ray", metavar="ADDRESS", help="run the sweep as Ray tasks, one per graph: ray://HOST:10001, auto, or "
                                                 "local (start a local instance); needs pip install -e '.[ray]'")
  o.add_argument("--csv"); o.add_argument("--json"); o.add_argument("--plot", metavar="PNG")
  e = sub.add_parser("explain", help="why each realized tensor became a view, a fresh buffer, an alias or a shared buffer")
  _source_args(e)
  e.add_argument("--tensor", dest="tensors", action="append", metavar="NAME",
                 help="an output index (0), label (out0, or a --script dict key) or realize index (#2); repeatable; default all")
  e.add_argument("--json", metavar="PATH", help="also write the explanation as JSON ('-': print only the JSON)")
  x = sub.add_parser("export", help="write the e-graph as a replayable .egg, egraph-serialize JSON, and/or SVG drawings")
  _source_args(x)
  x.add_argument("--egg", metavar="PATH", help="egglog program: prelude, inserted rows as facts, schedule")
  x.add_argument("--json", metavar="PATH", help="egraph-serialize JSON (extraction-gym), costs from --cost")
  x.add_argument("--raw-json", action="store_true", help="egglog's serialization untouched (all tables, unit costs)")
  x.add_argument("--svg", metavar="PATH", help="the CALL to PATH and the e-graph to PATH minus .svg plus .egraph.svg "
                                               "(needs pip install -e '.[graph]' and Graphviz's dot)")
  c = sub.add_parser("cuda", help="render a model's CALL as one CUDA translation unit with its launch plan")
  c.add_argument("--model", choices=sorted(MODELS), default="mlp")
  c.add_argument("--out", metavar="FILE", help="write the .cu here (default: stdout)")
  c.add_argument("--emulate", action="store_true", help="also run it on the CPU emulator and check it against numpy")
  t = sub.add_parser("capture", help="run a tinygrad program and save every graph it callifies as a corpus (needs tinygrad)")
  capture_arguments(t)
  args = p.parse_args(argv)
  try: return {"demo": demo, "order": order, "explain": explain, "export": export, "cuda": cuda, "capture": capture}[args.cmd](args)
  except CallsatError as e:
    print(f"callsat: error: {e}", file=sys.stderr); return 2
