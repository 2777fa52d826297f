"""The user path vs the kernel (reliability item 1): a loop of `((a + b) * a - 1).realize()` on 16M float32 Tensors
against the same CALL run on pre-allocated, warm buffers (bench/kernels.py's "as scheduled" elementwise row: run_call
on a prepared plan), in each of --procs fresh processes; each process interleaves the two per round and reports medians.
Prints a markdown table of min / median / max over processes, and the storage's bytes before and after the loop.

  python bench/realize_loop.py --procs 10 --rounds 30
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

def child(n: int, rounds: int) -> dict:
  import numpy as np
  from egraph import Tensor, callify, synchronize
  from egraph.ir.storage import STORAGE
  from lower.runtime import run_call
  rng = np.random.default_rng(0)
  a_np, b_np = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
  a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
  res = callify((a + b) * a - 1)      # the kernel on buffers allocated once and kept warm
  run_call(res.call)
  user = lambda: (((a + b) * a - 1).realize(), synchronize())[0]   # realize may return while its kernel runs: timed to its end
  for _ in range(3): user(); run_call(res.call)
  b0 = STORAGE.nbytes
  tu, tk = [], []
  for _ in range(rounds):
    t0 = time.perf_counter(); user(); tu.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); run_call(res.call); tk.append(time.perf_counter() - t0)
  ok = bool(np.allclose(user().numpy(), (a_np + b_np) * a_np - 1))
  mu, mk = statistics.median(tu) * 1e3, statistics.median(tk) * 1e3
  return {"user_ms": mu, "kernel_ms": mk, "speed": mk / mu, "grew_bytes": STORAGE.nbytes - b0, "ok": ok}

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--procs", type=int, default=10)
  ap.add_argument("--rounds", type=int, default=30)
  ap.add_argument("--n", type=int, default=16 * 1024 * 1024)
  ap.add_argument("--child", action="store_true")
  args = ap.parse_args()
  if args.child: print(json.dumps(child(args.n, args.rounds))); return
  rows = []
  for _ in range(args.procs):
    out = subprocess.run([sys.executable, __file__, "--child", "--n", str(args.n), "--rounds", str(args.rounds)],
                         capture_output=True, text=True, check=True).stdout
    rows.append(json.loads(out.strip().splitlines()[-1]))
  print(f"`((a + b) * a - 1).realize()` on {args.n} float32, {args.procs} fresh processes x {args.rounds} rounds "
        f"(medians per process; speed = kernel time / realize time), load {os.getloadavg()[0]:.2f}\n")
  print("| | min | median | max |\n|---|---|---|---|")
  for k, name in [("user_ms", "realize loop (ms)"), ("kernel_ms", "kernel on warm buffers (ms)"), ("speed", "speed vs kernel (x)"),
                  ("grew_bytes", "storage growth over the loop (bytes)")]:
    v = sorted(r[k] for r in rows)
    print(f"| {name} | {v[0]:.3g} | {statistics.median(v):.3g} | {v[-1]:.3g} |")
  print(f"\nall values right: {all(r['ok'] for r in rows)}")

if __name__ == "__main__": main()
