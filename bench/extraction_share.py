"""Extraction's share of callify on the ~10k-UOp graphs of bench/callify_vs_tinygrad.py (issue 14's Must: <= 20 %).

  python bench/extraction_share.py [--repeat 3] [--kinds chain dag transformer] [--modes rules cost] [--digest]
  [--profile FILE.prof]

Per graph and fusion mode, the run with the least callify time of `--repeat` (cache=False, one process): callify, the
extract phase (freeze, EGraphView, local costs, Knuth, refinement), the partition phase (decode, candidates' stored
forms, the solver) and (extract + partition) / callify. `--digest` prints a hash of each CALL (before/after checks)."""
from __future__ import annotations
import argparse, cProfile, hashlib, os, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "bench"))
from egraph import Tensor, callify
from egraph.ir.ops import toposort, Ops
from callify_vs_tinygrad import PROGRAMS
from fusion import GRAPH_SIZES

def digest(call) -> str:
  """A hash of the CALL's structure (ops, dtypes, args up to buffer identity, sources by position)."""
  topo = toposort(list(call.src), enter_calls=False)
  pos = {n.id: i for i, n in enumerate(topo)}
  h = hashlib.sha256()
  for n in topo:
    arg = (n.arg.size, n.arg.device) if n.op is Ops.BUFFER else n.arg
    h.update(repr((n.op, n.dtype, arg, [pos[s.id] for s in (n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src)])).encode())
  return h.hexdigest()[:12]

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--kinds", nargs="+", default=list(GRAPH_SIZES))
  ap.add_argument("--modes", nargs="+", default=["rules", "cost"])
  ap.add_argument("--digest", action="store_true")
  ap.add_argument("--profile", default=None, help="cProfile every callify into this file")
  args = ap.parse_args()
  callify(Tensor.empty(4, 4).exp().sum(), fusion="cost", cache=False)   # scipy's import and warm-up, once
  prof = cProfile.Profile() if args.profile else None
  print("| graph | mode | callify s | extract s | partition s | (extract + partition) / callify | partition method |\n|" + "---|" * 7)
  for kind in args.kinds:
    for mode in args.modes:
      runs = []
      for _ in range(args.repeat):
        outs = [t.node for t in PROGRAMS[kind](Tensor, GRAPH_SIZES[kind])]
        if prof: prof.enable()
        t0 = time.perf_counter(); res = callify(*outs, fusion=mode, cache=False); total = time.perf_counter() - t0
        if prof: prof.disable()
        runs.append((total, res))
      total, res = min(runs, key=lambda r: r[0])
      s, p = res.report.seconds, res.report.partition
      ex, pa = s.get("extract", 0.0), s.get("partition", 0.0)
      print(f"| {kind} ({GRAPH_SIZES[kind]}) | {mode} | {total:.3f} | {ex:.3f} | {pa:.3f} | {(ex + pa) / total:.0%} | "
            f"{p.method if p else '-'} |" + (f" {digest(res.call)}" if args.digest else "") +
            (f" fallback: {res.report.fallback}" if res.report.fallback else ""), flush=True)
  if prof: prof.dump_stats(args.profile)

if __name__ == "__main__": main()
