"""Lowering the ~10k-UOp graphs of bench/callify_vs_tinygrad.py: callify, then lower/'s kernelize (program_of: the
kernels and their order, no compile), each timed in this process; lowering / callify is the same-run ratio.

  python bench/lower_graphs.py [--kinds chain transformer] [--repeat 3]

The dag (8448 nodes) is left out by default: its kernel expressions take minutes to build (lower/schedule/builder)."""
from __future__ import annotations
import argparse, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from egraph import Tensor, callify
from lower.schedule.work import program_of
from callify_vs_tinygrad import PROGRAMS
from fusion import GRAPH_SIZES

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--kinds", nargs="+", default=["chain", "transformer"])
  ap.add_argument("--repeat", type=int, default=3)
  args = ap.parse_args()
  print("| graph | kernels | callify s | lowering s | lowering / callify |\n|---|---|---|---|---|")
  for kind in args.kinds:
    cs, ls = [], []
    for _ in range(args.repeat):
      outs = [t.node for t in PROGRAMS[kind](Tensor, GRAPH_SIZES[kind])]
      t0 = time.perf_counter(); call = callify(*outs, cache=False).call; t1 = time.perf_counter()
      prog = program_of(call); t2 = time.perf_counter()
      cs.append(t1 - t0); ls.append(t2 - t1)
    c, l = statistics.median(cs), statistics.median(ls)
    print(f"| {kind} ({GRAPH_SIZES[kind]}) | {sum(s.kernel is not None for s in prog.steps)} | {c:.3f} | {l:.3f} | {l / c:.1f}x |", flush=True)

if __name__ == "__main__": main()
