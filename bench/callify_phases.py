"""Callify time by phase on deep elementwise chains and wide shared DAGs (IR nodes counted in our IR).

  python bench/callify_phases.py [--sizes 1000 10000 50000 100000] [--repeat 3] [--out notes/benchmarks.md]
"""
from __future__ import annotations
import argparse, datetime, math, os, random, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from egraph.engine.driver import callify
from egraph.ir.ops import Node, Ops, new_buffer, const, toposort
from egraph.ir.dtype import dtypes

def chain(n: int) -> list[Node]:
  """x_{i+1} = x_i (+|*) a, with a CONTIGUOUS every 10 steps and a contiguous slice every 25: n IR nodes, depth ~n."""
  a = new_buffer(64, dtypes.float32, "CPU")
  one = const(1.0, dtypes.float32, "CPU").reshape((1,)).expand((64,))
  x, count, i = a, 2, 0   # count IR nodes as they are made: a, one's CONST/RESHAPE/EXPAND
  while count < n:
    x = Node(Ops.ADD if i % 2 else Ops.MUL, None, (x, one if i % 3 else a)); count += 1
    if i % 10 == 9: x = x.contiguous(); count += 1
    if i % 25 == 24: x = x.reshape((8, 8)).shrink(((2, 6), (0, 8))).contiguous().reshape((32,)).pad(((16, 16),)); count += 5
    i += 1
  return [x]

def dag(n: int, seed: int = 0) -> list[Node]:
  """Layers of width ~sqrt(n)/2; each node combines two random nodes of the previous layer (sharing, many parents)."""
  rng = random.Random(seed)
  w = max(2, int(math.sqrt(n) / 2))
  layer = [new_buffer(64, dtypes.float32, "CPU") for _ in range(w)]
  count = w
  while count < n:
    nxt = []
    for j in range(w):
      x, y = rng.choice(layer), rng.choice(layer)
      z = Node(rng.choice([Ops.ADD, Ops.MUL, Ops.MAX]), None, (x, y))
      if rng.random() < 0.2: z = z.contiguous()
      nxt.append(z)
    layer, count = nxt, count + w
  return layer

def run(kind: str, n: int, repeat: int) -> dict:
  roots = {"chain": chain, "dag": dag}[kind](n)
  nodes = len(toposort(roots, enter_calls=False))
  runs = []
  for _ in range(repeat):
    t0 = time.perf_counter(); res = callify(*roots, cache=False); total = time.perf_counter() - t0
    runs.append((total, res.report))
  total, rep = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
  return {"kind": kind, "nodes": nodes, "total": total, "report": rep}

def main():
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
  p.add_argument("--repeat", type=int, default=3)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  phases = ["encode", "insert", "load", "materialize", "optimize", "extract", "decode"]
  lines = ["| graph | IR nodes | e-nodes | iters | stores | views | " + " | ".join(phases) + " | total s |",
           "|---|---|---|---|---|---|" + "---|" * len(phases) + "---|"]
  for kind in ("chain", "dag"):
    for n in args.sizes:
      r = run(kind, n, args.repeat); rep = r["report"]
      lines.append(f"| {kind} | {r['nodes']} | {rep.e_nodes} | {rep.iterations} | {rep.stores} | {rep.views} | " +
                   " | ".join(f"{rep.seconds.get(ph, 0):.3f}" for ph in phases) + f" | {r['total']:.3f} |")
      print(lines[-1], flush=True)
  if args.out:
    cmd = "python bench/callify_phases.py " + " ".join(sys.argv[1:])
    with open(args.out, "a") as f:
      f.write(f"\n## callify by phase ({datetime.date.today()})\n\n`{cmd}` — medians of {args.repeat} runs, seconds, "
              f"one process on this 2-core machine.\n\n" + "\n".join(lines) + "\n")

if __name__ == "__main__": main()
