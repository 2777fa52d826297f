"""Realize loops with realize returning while its last kernel runs (CALLSAT_ASYNC=1, the default) against realize
waiting for it (CALLSAT_ASYNC=0): the Python of the next iteration overlaps the kernel or not. Each (workload, setting)
runs in a fresh process, settings alternating, --rounds times; a process times --blocks blocks of a loop (each ending in
egraph.synchronize(), so the last kernel is inside the time) and reports the fastest and the median block per
iteration; values checked against numpy once per process.

  python bench/pipelined.py [--rounds 3] [--only elementwise ...] [--out notes/benchmarks.md]
"""
from __future__ import annotations
import argparse, datetime, json, os, statistics, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

def _workloads(np, rng):
  """name -> (inputs, the loop body on Tensors, numpy's value of one iteration)."""
  out = {}
  for n in (1 << 18, 1 << 20, 1 << 22):
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    out[f"elementwise (a+b)*a-1, {n >> 10}K"] = ((a, b), lambda x, y: (x + y) * x - 1, lambda x, y: (x + y) * x - 1)
  for n in (1024, 2048):
    r = rng.standard_normal((n, n), dtype=np.float32)
    out[f"row sums {n}^2"] = ((r,), lambda x: x.sum(1), lambda x: x.sum(1))
  for n in (256, 512):
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    out[f"matmul {n}^3"] = ((a, b), lambda x, y: x @ y, lambda x, y: x @ y)
  s = rng.standard_normal((1024, 1024), dtype=np.float32)
  def np_softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
  out["row softmax 1024^2"] = ((s,), lambda x: x.softmax(1), np_softmax)
  return out

def child(name: str, blocks: int) -> dict:
  import numpy as np
  from egraph import Tensor, synchronize
  ins, ours, ref = _workloads(np, np.random.default_rng(0))[name]
  ts = [Tensor(x).realize() for x in ins]
  got = ours(*ts).numpy()
  ok = bool(np.allclose(got, ref(*ins), rtol=1e-3, atol=1e-3))
  t0 = time.perf_counter()
  for _ in range(3): ours(*ts).realize()
  synchronize()
  reps = max(5, int(0.08 / max((time.perf_counter() - t0) / 3, 1e-6)))
  per = []
  for _ in range(blocks):
    t0 = time.perf_counter()
    for _ in range(reps): ours(*ts).realize()
    synchronize()
    per.append((time.perf_counter() - t0) / reps)
  return {"min_ms": min(per) * 1e3, "med_ms": statistics.median(per) * 1e3, "ok": ok, "reps": reps}

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--blocks", type=int, default=7)
  ap.add_argument("--only", nargs="*")
  ap.add_argument("--out")
  ap.add_argument("--child")
  a = ap.parse_args()
  if a.child: print(json.dumps(child(a.child, a.blocks))); return
  import numpy as np
  names = [n for n in _workloads(np, np.random.default_rng(0)) if not a.only or any(o in n for o in a.only)]
  load0, res = os.getloadavg()[0], {(n, s): [] for n in names for s in ("1", "0")}
  for r in range(a.rounds):
    for n in names:
      for s in (("1", "0") if r % 2 == 0 else ("0", "1")):
        env = {**os.environ, "CALLSAT_ASYNC": s}
        out = subprocess.run([sys.executable, __file__, "--child", n, "--blocks", str(a.blocks)], env=env,
                             capture_output=True, text=True, check=True).stdout
        res[(n, s)].append(json.loads(out.strip().splitlines()[-1]))
  lines = [f"`python bench/pipelined.py --rounds {a.rounds}` ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
           f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}, {len(os.sched_getaffinity(0))} CPUs): per iteration, the fastest block of "
           f"each process then the median over {a.rounds} processes per setting; speed-up = waiting / pipelined.", "",
           "| loop | waiting ms (fastest / median block) | pipelined ms (fastest / median block) | speed-up (fastest) | speed-up (median) | values |",
           "|---|---|---|---|---|---|"]
  ups = []
  for n in names:
    w, p = res[(n, "0")], res[(n, "1")]
    wm, pm = statistics.median(x["min_ms"] for x in w), statistics.median(x["min_ms"] for x in p)
    wd, pd = statistics.median(x["med_ms"] for x in w), statistics.median(x["med_ms"] for x in p)
    ups.append(wm / pm)
    ok = all(x["ok"] for x in w + p)
    lines.append(f"| {n} | {wm:.3f} / {wd:.3f} | {pm:.3f} / {pd:.3f} | {wm / pm:.2f}x | {wd / pd:.2f}x | {'right' if ok else '**WRONG**'} |")
  lines += ["", f"geomean speed-up (fastest blocks): {statistics.geometric_mean(ups):.2f}x"]
  text = "\n".join(lines)
  print(text)
  if a.out:
    with open(a.out, "a") as fh: fh.write("\n" + text + "\n")

if __name__ == "__main__": main()
