"""Fusion by cost on the user path: a program's Tensor expression rebuilt and realized in a loop (each iteration
builds the lazy graph again; callify's cache answers after the first), in fresh processes. In each process both modes
run, CALLSAT_FUSION set before each realize (read when callify runs): the first realize of each (callify, solver,
compile, run; the mode going first alternates between processes), then the loop's realizes alternating between them.
Prints min / median / max over processes of each mode's first realize and loop median, and the medians over processes
of the rules / cost ratios (first realize; loop).

  python bench/fusion_user_path.py [--procs 5] [--iters 40] [--only substr]
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _programs():
  import numpy as np
  from egraph import Tensor
  rng = np.random.default_rng(0)
  def data(*shape): return Tensor(rng.standard_normal(shape, dtype=np.float32)).realize()
  x, w, b = data(1024, 1024), data(1024), data(1024)
  q, k, v = data(256, 64), data(256, 64), data(256, 64)
  h, w1, w2 = data(256, 512), data(512, 1024), data(1024, 256)
  def layernorm():
    c = x - x.mean(axis=1, keepdim=True)
    return c * ((c * c).mean(axis=1, keepdim=True) + 1e-5).rsqrt() * w + b
  return {
    "row softmax 1024^2": lambda: x.softmax(),
    "batch norm 1024^2": lambda: (x - x.mean(axis=0)) / (x.var(axis=0, correction=0) + 1e-5).sqrt(),
    "layernorm 1024^2": layernorm,
    "attention T=256 D=64": lambda: ((q @ k.transpose()) * 0.125).softmax() @ v,
    "MLP forward 256x512x1024x256": lambda: ((h @ w1).relu() @ w2).softmax(),
  }

def child(name: str, iters: int, first_mode: str) -> dict:
  from egraph import synchronize   # realize may return while its last kernel runs: each time ends when it has finished
  prog = _programs()[name]
  modes = (first_mode, "cost" if first_mode == "rules" else "rules")
  out = {m: {"loop": []} for m in modes}
  for m in modes:
    os.environ["CALLSAT_FUSION"] = m
    t0 = time.perf_counter(); prog().realize(); synchronize(); out[m]["first"] = time.perf_counter() - t0
  for i in range(iters):
    for m in (modes if i % 2 == 0 else modes[::-1]):
      os.environ["CALLSAT_FUSION"] = m
      t0 = time.perf_counter(); prog().realize(); synchronize(); out[m]["loop"].append(time.perf_counter() - t0)
  return {m: {"first": r["first"], "loop": statistics.median(r["loop"])} for m, r in out.items()}

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--procs", type=int, default=5)
  ap.add_argument("--iters", type=int, default=40)
  ap.add_argument("--only", default=None)
  ap.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child: print(json.dumps(child(args.child[0], int(args.child[1]), args.child[2]))); return
  names = [n for n in _programs() if args.only is None or args.only in n]
  print(f"`python bench/fusion_user_path.py --procs {args.procs} --iters {args.iters}`: fresh processes, both modes in each"
        f" (alternating); min / median / max over processes, ratios: median over processes of the per-process ratio\n")
  print("| program | first realize rules ms | first realize cost ms | loop rules ms | loop cost ms | first rules / cost | loop rules / cost |")
  print("|---|---|---|---|---|---|---|")
  for name in names:
    runs = []
    for i in range(args.procs):
      out = subprocess.run([sys.executable, __file__, "--child", name, str(args.iters), "rules" if i % 2 == 0 else "cost"],
                           cwd=ROOT, capture_output=True, text=True, check=True)
      runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    def mmm(mode, key): xs = sorted(r[mode][key] * 1e3 for r in runs); return f"{xs[0]:.2f} / {statistics.median(xs):.2f} / {xs[-1]:.2f}"
    ratio = lambda key: statistics.median(r["rules"][key] / r["cost"][key] for r in runs)
    print(f"| {name} | {mmm('rules', 'first')} | {mmm('cost', 'first')} | {mmm('rules', 'loop')} | {mmm('cost', 'loop')} | "
          f"{ratio('first'):.2f}x | {ratio('loop'):.2f}x |", flush=True)

if __name__ == "__main__":
  sys.path.insert(0, ROOT)
  main()
