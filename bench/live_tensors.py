"""Realizes while a program holds many other tensors: callsat's own Tensor against tinygrad 0.14's (DEV=CPU), each
(loop, side, count) a fresh process, the sides alternating; values checked against numpy.

  python bench/live_tensors.py [--loops realize sgd] [--counts 0 100 1000 5000] [--params 10 100 300] [--procs 3]
                               [--iters 300] [--out FILE]

  realize  `--counts` lazy tensors (`z * i + 1` over a realized 16-element z: an op of two sources, never realized: a list
           of results realized later, running statistics), then `(x @ y).realize()` for 16x16 x, y, timed `iters` times
           after 50 warm-up ones
  sgd      `--params` parameters of 64 floats and their gradients: each step assigns every parameter `p - lr * g`, then
           realizes them all at once (an optimizer step), timed over iters / 10 steps after 3 warm-up ones
Reported: the median microseconds per realize (per step). A realize and an assign rewrite every live tensor built on
what they change, which they must find among all of them (tinygrad: through its UOps' children; callsat: skipping the
graphs that cannot hold a changed node, egraph/frontend/tensor.py _apply_map). Ratio: tinygrad / callsat (> 1: callsat
faster)."""
from __future__ import annotations
import argparse, datetime, json, os, statistics, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def worker(loop: str, side: str, count: int, iters: int) -> dict:
  import numpy as np
  if side == "callsat":
    sys.path.insert(0, ROOT)
    from egraph import Tensor, synchronize
  else:
    os.environ.setdefault("DEV", "CPU")
    from tinygrad import Tensor, Device
    synchronize = lambda: Device[Device.DEFAULT].synchronize()
  rng = np.random.default_rng(0)
  if loop == "sgd": return _sgd(Tensor, synchronize, rng, count, max(1, iters // 10))
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

def _sgd(Tensor, synchronize, rng, count: int, steps: int) -> dict:
  import numpy as np
  p0 = [rng.standard_normal(64, dtype=np.float32) for _ in range(count)]
  g0 = [rng.standard_normal(64, dtype=np.float32) for _ in range(count)]
  ps, gs = [Tensor(a).realize() for a in p0], [Tensor(a).realize() for a in g0]
  times = []
  for i in range(steps + 3):
    t0 = time.perf_counter()
    for p, g in zip(ps, gs): p.assign(p - 0.01 * g)
    Tensor.realize(*ps)
    synchronize()
    if i >= 3: times.append(time.perf_counter() - t0)
  n = steps + 3
  ok = all(np.allclose(p.numpy(), a - n * np.float32(0.01) * g, rtol=1e-4, atol=1e-5) for p, a, g in list(zip(ps, p0, g0))[:: max(1, count // 10)])
  return {"us": statistics.median(times) * 1e6, "ok": ok}

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--loops", nargs="+", choices=["realize", "sgd"], default=["realize", "sgd"])
  ap.add_argument("--counts", nargs="+", type=int, default=[0, 100, 1000, 5000])
  ap.add_argument("--params", nargs="+", type=int, default=[10, 100, 300])
  ap.add_argument("--procs", type=int, default=3)
  ap.add_argument("--iters", type=int, default=300)
  ap.add_argument("--out")
  ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.worker:
    print(json.dumps(worker(a.worker[0], a.worker[1], int(a.worker[2]), a.iters)))
    return
  res: dict = {}
  for p in range(a.procs):
    for loop in a.loops:
      for count in (a.counts if loop == "realize" else a.params):
        for side in (("callsat", "tinygrad") if p % 2 == 0 else ("tinygrad", "callsat")):
          r = subprocess.run([sys.executable, __file__, "--worker", loop, side, str(count), "--iters", str(a.iters)],
                             capture_output=True, text=True, timeout=1800)
          if r.returncode != 0: raise SystemExit(f"{loop}, {side}, {count} tensors failed:\n{r.stderr[-2000:]}")
          res.setdefault((loop, side, count), []).append(json.loads(r.stdout.strip().splitlines()[-1]))
  lines = [f"`python bench/live_tensors.py --loops {' '.join(a.loops)} --counts {' '.join(map(str, a.counts))} --params "
           f"{' '.join(map(str, a.params))} --procs {a.procs} "
           f"--iters {a.iters}` ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}): "
           "us per realize (realize: `(x @ y).realize()` 16x16 beside that many live lazy tensors; sgd: one step over that "
           "many parameters), median over iterations, median over processes; values right in every process: "
           f"{all(r['ok'] for v in res.values() for r in v)}.", "",
           "| loop | tensors | callsat us | tinygrad us | tinygrad / callsat |", "|---|---|---|---|---|"]
  for loop in a.loops:
    for count in (a.counts if loop == "realize" else a.params):
      cs, tg = (statistics.median(r["us"] for r in res[(loop, s, count)]) for s in ("callsat", "tinygrad"))
      lines.append(f"| {loop} | {count} | {cs:.0f} | {tg:.0f} | {tg / cs:.2f}x |")
  text = "\n".join(lines)
  print(text)
  if a.out:
    with open(a.out, "a") as fh: fh.write("\n" + text + "\n")

if __name__ == "__main__": main()
