"""callify under a time limit: total time against the promise `encode + 1.5 * seconds + 0.3`, the path taken (the
e-graph; the all-materialized CALL built from the encoding; or built from the graph without encoding, when the
toposort's time already rules the e-graph out) and the phases. `encode` is the graph's encoding timed on its own (the
graph path does not encode). `--calibrate` measures the multiples driver.Budget predicts with (unlimited runs).

  python bench/callify_limits.py [--sizes 200000] [--seconds 0.5 1 2] [--kinds chain dag] [--repeat 3] [--calibrate]
"""
from __future__ import annotations
import argparse, gc, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from callify_phases import chain, dag
from egraph.engine.driver import callify, materialized_call, Budget
from egraph.engine.encode import encode
from egraph.engine.runner import Limits
from egraph.ir.ops import toposort

PHASES = ("toposort", "plan", "insert", "load", "materialize", "optimize", "extract", "decode", "direct")

def limited(roots, seconds: float, repeat: int) -> tuple[float, object, float]:
  """The median run (by total seconds) of callify under Limits(seconds=...): (seconds, report, CPU seconds)."""
  runs = []
  for _ in range(repeat):
    res = None   # the last run's CALL goes first: freeing it is not this run's time, nor its nodes this run's cache hits
    lim = Limits(seconds=seconds)
    gc.collect()   # nor the cyclic GC's pass over the last run's survivors (an allocation before callify's own clock set it off)
    t0, c0 = time.perf_counter(), time.process_time()   # CPU time too: on a shared machine wall time is the load's
    res = callify(*roots, limits=lim, cache=False)
    runs.append((time.perf_counter() - t0, res.report, time.process_time() - c0))
  return sorted(runs, key=lambda r: r[0])[len(runs) // 2]

def encode_s(roots, repeat: int) -> float:
  """The median time of encoding the graph (toposort included, the GC off, as callify runs it)."""
  ts = []
  for _ in range(repeat):
    gc.collect(); gc.disable()
    t = time.perf_counter(); encode(roots); ts.append(time.perf_counter() - t)
    gc.enable()
  return statistics.median(ts)

def calibrate(kind: str, roots) -> str:
  """Measured LOAD, EXTRACT, FALLBACK multiples of encode's per-row time and TOPO (encode over the toposort)."""
  t0 = time.perf_counter(); rep = callify(*roots, limits="none", cache=False).report; total = time.perf_counter() - t0
  gc.disable()   # as callify does
  t1 = time.perf_counter(); topo = toposort(roots, enter_calls=False); topo_s = time.perf_counter() - t1
  enc = encode(roots)
  b = Budget.plan(enc, 0.0, rep.seconds["encode"])
  t1 = time.perf_counter(); materialized_call(enc); direct = time.perf_counter() - t1
  gc.enable()
  load = total - sum(rep.seconds.get(p, 0) for p in ("encode", "optimize", "extract", "decode"))   # with the Runner's setup
  unit = b.per_row
  return (f"| {kind} | {len(topo)} | {b.rows} | {rep.e_nodes} | {rep.seconds['encode']:.2f} | "
          f"{load / (unit * b.rows):.2f} | {(rep.seconds['extract'] + rep.seconds['decode']) / (unit * rep.e_nodes):.2f} | "
          f"{direct / (unit * b.rows):.2f} | {rep.seconds['encode'] / topo_s:.1f} | {total:.2f} |")

def main():
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", type=int, nargs="+", default=[200000])
  p.add_argument("--seconds", type=float, nargs="+", default=[0.5, 1.0, 2.0])
  p.add_argument("--kinds", nargs="+", default=["chain", "dag"])
  p.add_argument("--repeat", type=int, default=3)
  p.add_argument("--calibrate", action="store_true")
  args = p.parse_args()
  if args.calibrate:
    print("| graph | IR nodes | rows | e-nodes | encode s | LOAD | EXTRACT | FALLBACK | TOPO | unlimited s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in args.kinds:
      for n in args.sizes: print(calibrate(kind, {"chain": chain, "dag": dag}[kind](n)), flush=True)
    return
  print("| graph | IR nodes | s | total s | total CPU s | encode s | after encode s | bound 1.5s+0.3 | met | stop | path | "
        + " | ".join(PHASES) + " |")
  print("|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(PHASES))
  for kind in args.kinds:
    for n in args.sizes:
      roots = {"chain": chain, "dag": dag}[kind](n)
      nodes = len(toposort(roots, enter_calls=False))
      enc_s = encode_s(roots, args.repeat)
      for s in args.seconds:
        total, rep, cpu = limited(roots, s, args.repeat)
        after, bound = total - enc_s, 1.5 * s + 0.3
        why = rep.fallback and ("predicted" if "predicted" in rep.fallback else rep.fallback.split("out of time ")[-1])
        path = "e-graph" if rep.fallback is None else \
               f"{'graph' if 'not encoded' in rep.fallback else 'encoding'} ({why})"
        print(f"| {kind} | {nodes} | {s:g} | {total:.2f} | {cpu:.2f} | {enc_s:.2f} | {after:.2f} | {bound:.2f} | "
              f"{'yes' if after <= bound else 'NO'} | {rep.stop_reason} | {path} | " +
              " | ".join(f"{rep.seconds[ph]:.2f}" if ph in rep.seconds else "" for ph in PHASES) + " |", flush=True)
  print(f"\nload average {os.getloadavg()[0]:.1f} over {os.cpu_count()} CPUs")

if __name__ == "__main__": main()
