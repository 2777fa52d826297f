"""The bridge's stand-in for tinygrad's own schedule (egraph/fusion/stock.py, cost mode's anchor) against the schedule
tinygrad makes, graph by graph, on bench/models.py's models: for every graph the bridge decides (plain rules CALL,
DEV=CPU), the kernels tinygrad schedules for the CALL it returns and the stand-in's count over the same graph's shadow
(one kernel per computed realize point, one per stored intermediate, one more per assign reading its target).

  python bench/tinygrad_stock.py [--models resnet18 bert ...] [--calls 3]

Each model in a fresh process. A graph holding a tinygrad FUNCTION or CALL (a precompiled function, TRAINING's
gradients: the shadow keeps it opaque, so neither the stand-in nor the cost model sees the kernels in it) is counted
apart."""
from __future__ import annotations
import argparse, json, os, subprocess, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import models as M

def worker(name: str, calls: int) -> dict:
  sys.path.insert(0, M.TINYGRAD_TESTS)
  import numpy as np
  from tinygrad import Context
  from tinygrad.schedule import create_linear_with_vars
  from tinygrad.uop.ops import Ops as TOps
  import egraph.tinygrad as bridge
  import egraph.bridge.install as inst
  from egraph.bridge.convert import to_callsat
  from egraph.bridge.shadow import Shadow
  from egraph.fusion.stock import kernel_values, tinygrad_realized
  from egraph.ir.ops import Ops, toposort
  rows, decide = [], inst._decide
  def checked(big_sink, mode, *a, **k):
    call, bmap, hints = decide(big_sink, mode, *a, **k)
    cv, roots = to_callsat(big_sink, consts=True)
    shadow = Shadow(cv, "CPU", folds=True).build(roots)
    if not {r.device for r in shadow if r.device is not None} <= {"CPU"}: return call, bmap, hints
    vals, self_reads = kernel_values(shadow)
    with Context(CAPTURING=0): linear, _ = create_linear_with_vars(call)
    theirs = sum(1 for c in linear.src if c.op is TOps.CALL and c.src[0].op is TOps.SINK)
    bodies = any(n.op in (Ops.CALL, Ops.FUNCTION) or n.op is Ops.OPAQUE and (u := cv.opaque[n.arg.ident][0]) is not None and
                 u.op in (TOps.CALL, TOps.FUNCTION) for n in toposort(shadow, enter_calls=False))
    rows.append((theirs, len(vals) + self_reads + len(tinygrad_realized(vals)), bodies))
    return call, bmap, hints
  inst._decide = checked
  os.environ.pop("CALLSAT_BRIDGE_FUSION", None)
  bridge.install(strict=True)
  step = M.MODELS[name](calls, np.random.default_rng(0))
  for i in range(calls): step(i)
  return {"model": name, "rows": rows}

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--models", nargs="+", default=list(M.MODELS), choices=list(M.MODELS))
  ap.add_argument("--calls", type=int, default=3)
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.worker: print(json.dumps(worker(a.worker, a.calls))); return
  env = os.environ | {"DEV": "CPU", "CACHELEVEL": "0"}
  print("| model | graphs | same count | tinygrad's kernels | the stand-in's | graphs with a CALL body (tinygrad / stand-in) |")
  print("|---|---|---|---|---|---|")
  for name in a.models:
    out = subprocess.run([sys.executable, __file__, "--worker", name, "--calls", str(a.calls)], env=env, capture_output=True, text=True)
    if out.returncode: print(f"| {name} | failed: {out.stderr.strip().splitlines()[-1:]} |"); continue
    rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    plain, bodies = [r for r in rows if not r[2]], [r for r in rows if r[2]]
    same = sum(r[0] == r[1] for r in plain)
    body = f"{len(bodies)} ({sum(r[0] for r in bodies)} / {sum(r[1] for r in bodies)})" if bodies else "0"
    print(f"| {name} | {len(plain)} | {same} | {sum(r[0] for r in plain)} | {sum(r[1] for r in plain)} | {body} |", flush=True)

if __name__ == "__main__": main()
