"""The kernel pool's preempted-worker move (lower/device/pool.py, MOVE_AFTER) on and off, in one process: two pools made
side by side (the same code, one never moves a worker), the process's pool switched between them every block, the
order alternating by round; prepared kernels (bench/busy.py's) quiet and beside a CPU-bound process pinned to the last
CPU. In-process because fresh processes on this 2-vCPU VM differ by more than the effect (see notes/benchmarks.md).

  python bench/pool_ab.py [--rounds 12] [--phases quiet busy] [--out notes/benchmarks.md]"""
from __future__ import annotations
import argparse, datetime, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
from busy import hog, prepared, timeit
from egraph import Tensor
from lower.device import pool as P

def workloads(rng) -> dict:
  """name -> (run once, reps per block)."""
  r = rng.standard_normal((4096, 4096), dtype=np.float32)
  x = rng.standard_normal(16 << 20, dtype=np.float32)
  a5, a2 = (rng.standard_normal((n, n), dtype=np.float32) for n in (512, 256))
  t2 = Tensor(a2).realize()
  return {"row sum 4096^2": (prepared(Tensor, lambda p, q: p.sum(1), r, None), 20),
          "elementwise 16M": (prepared(Tensor, lambda p, q: (p + q) * p - 1, x, x[::-1].copy()), 8),
          "matmul 512^3": (prepared(Tensor, lambda p, q: p @ q, a5, a5), 30),
          "user matmul 256^3": (lambda: (t2 @ t2).realize(), 200)}

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--rounds", type=int, default=12)
  ap.add_argument("--phases", nargs="+", default=["quiet", "busy"], choices=["quiet", "busy"])
  ap.add_argument("--out")
  a = ap.parse_args()
  if P.pool() is None: sys.exit("pool_ab.py: the native kernel pool is unavailable here (Linux x86-64 only)")
  ws = workloads(np.random.default_rng(0))   # made (and run once) on the process's pool, closed next
  cpus, move = sorted(os.sched_getaffinity(0)), P.MOVE_AFTER
  P.pool().close()
  pools = {}
  try:
    for name, after in (("move", move), ("never", 1e9)):   # 1e9 x a chunk's time: never
      P.MOVE_AFTER = after
      pools[name] = P.Pool(cpus)
  finally: P.MOVE_AFTER = move
  res: dict = {}
  for r in range(a.rounds):
    for phase in a.phases:
      h = hog(cpus[-1]) if phase == "busy" else None
      time.sleep(0.2)
      try:
        for w, (f, reps) in ws.items():
          for m in (("move", "never") if r % 2 else ("never", "move")):
            P._POOL = pools[m]
            time.sleep(0.05)
            res.setdefault((w, phase, m), []).append(timeit(f, reps) * 1e3)
      finally:
        if h: h.kill(); h.wait()
  lines = [f"`python bench/pool_ab.py --rounds {a.rounds} --phases {' '.join(a.phases)}` "
           f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {len(cpus)} CPUs): ms medians over rounds; "
           "never / move > 1: moving is faster.", "", "| workload | phase | move ms | never ms | never / move |", "|---|---|---|---|---|"]
  for w in ws:
    for phase in a.phases:
      mv, nv = (statistics.median(res[(w, phase, m)]) for m in ("move", "never"))
      lines.append(f"| {w} | {phase} | {mv:.3f} | {nv:.3f} | {nv / mv:.2f}x |")
  text = "\n".join(lines)
  print(text)
  if a.out:
    with open(a.out, "a") as fh: fh.write("\n" + text + "\n")

if __name__ == "__main__": main()
