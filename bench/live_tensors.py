"""A small realize in a loop while a program holds other lazy tensors (a list of results realized later, running
statistics, a schedule's pending values): callsat's own Tensor against tinygrad 0.14's (DEV=CPU), each (side, count) a
fresh process, the sides alternating; values checked against numpy.

  python bench/live_tensors.py [--counts 0 100 1000 5000] [--procs 3] [--iters 300] [--out notes/benchmarks.md]

Each process makes `count` lazy tensors (`z * i + 1` over a realized 16-element z: an op of two sources, never
realized), then realizes `(x @ y)` for 16x16 x, y `iters` times (after 50 warm-up ones) and reports the median
microseconds per iteration; a realize rewrites every live tensor built on what it realized, which it must find among
them (tinygrad: tensors reachable from the realized UOps through their children; callsat: skips graphs that cannot hold
a realized node, egraph/frontend/tensor.py _apply_map). Ratio: tinygrad / callsat (> 1: callsat faster)."""
from __future__ import annotations
import argparse, datetime, json, os, statistics, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def worker(side: str, count: int, iters: int) -> dict:
  import numpy as np
  if side == "callsat":
    sys.path.insert(0, ROOT)
    from egraph import Tensor, synchronize
  else:
    os.environ.setdefault("DEV", "CPU")
    from tinygrad import Tensor, Device
    synchronize = lambda: Device[Device.DEFAULT].synchronize()
  rng = np.random.default_rng(0)
  a, b, c = (rng.standard_normal(s, dtype=np.float32) for s in ((16, 16), (16, 16), (16,)))
  x, y, z = Tensor(a).realize(), Tensor(b).realize(), Tensor(c).realize()
  live = [z * float(i) + 1 for i in range(count)]
  times = []
  for i in range(iters + 50):
    t0 = time.perf_counter()
    out = (x @ y).realize()
    synchronize()
    if i >= 50: times.append(time.perf_counter() - t0)
  ok = bool(np.allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)) and \
    all(np.allclose(t.numpy(), c * i + 1, rtol=1e-6) for i, t in list(enumerate(live))[:: max(1, count // 10)])
  return {"us": statistics.median(times) * 1e6, "ok": ok}

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--counts", nargs="+", type=int, default=[0, 100, 1000, 5000])
  ap.add_argument("--procs", type=int, default=3)
  ap.add_argument("--iters", type=int, default=300)
  ap.add_argument("--out")
  ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.worker:
    print(json.dumps(worker(a.worker[0], int(a.worker[1]), a.iters)))
    return
  res: dict = {}
  for p in range(a.procs):
    for count in a.counts:
      for side in (("callsat", "tinygrad") if p % 2 == 0 else ("tinygrad", "callsat")):
        r = subprocess.run([sys.executable, __file__, "--worker", side, str(count), "--iters", str(a.iters)],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0: raise SystemExit(f"{side} with {count} live tensors failed:\n{r.stderr[-2000:]}")
        res.setdefault((side, count), []).append(json.loads(r.stdout.strip().splitlines()[-1]))
  lines = [f"`python bench/live_tensors.py --counts {' '.join(map(str, a.counts))} --procs {a.procs} --iters {a.iters}` "
           f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}): us per "
           "`(x @ y).realize()` (16x16), median over iterations, median over processes; values right in every process: "
           f"{all(r['ok'] for v in res.values() for r in v)}.", "",
           "| live lazy tensors | callsat us | tinygrad us | tinygrad / callsat |", "|---|---|---|---|"]
  for count in a.counts:
    cs, tg = (statistics.median(r["us"] for r in res[(s, count)]) for s in ("callsat", "tinygrad"))
    lines.append(f"| {count} | {cs:.0f} | {tg:.0f} | {tg / cs:.2f}x |")
  text = "\n".join(lines)
  print(text)
  if a.out:
    with open(a.out, "a") as fh: fh.write("\n" + text + "\n")

if __name__ == "__main__": main()
