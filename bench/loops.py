"""callsat's own Tensor in a loop, as a user writes one (issue 27): a Python scalar that changes every iteration
against the same loop with a fixed scalar, and a new shape every iteration; each (loop, process) a fresh process.

  python bench/loops.py [--procs 3] [--iters 200] [--rss-iters 2000] [--loops ...] [--env NAME=MB ...] [--out notes/benchmarks.md]

Loops (x: a 4 MB float32 array made once, `Tensor(x)` each iteration as a user's new input):
  scale     (Tensor(x) * s).sum(0).numpy()             s = 0.37 every iteration (fixed) or 0.37 + i / 1000 (new)
  lr-step   w.assign(w - lr * g).realize()             an SGD step on a realized w, lr = 0.1 (fixed) or 0.1 / (1 + i) (new)
  mask      (Tensor.arange(n) < i).where(x, 0).sum()  a mask from a loop counter (int): i fixed at 7 or the counter
Reported per loop: ms per iteration (median over iterations after 3 warm-up ones, median over processes), new / fixed,
kernels compiled during the timed iterations (lower.device.cache.CACHE.compiled), values checked against numpy each
iteration. The RSS rows run --rss-iters iterations of `scale` with a new scalar each time, and of a new shape each time
(`Tensor(x[:k]) * 0.37` for k = n - i: a new structure every iteration), and report the growth of the process's
resident set (VmRSS) from iteration 100 to the end, beside the caches' own estimate of what they hold, the slabs they
evicted, where modules were compiled (this process, or the compile helper process: lower/device/compile_proc.py) and
llvmlite's leak in this process (~70 KB per module compiled here, not freed by any eviction)."""
from __future__ import annotations
import argparse, datetime, json, os, statistics, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

N = 1 << 20   # 4 MB of float32

def rss_mb() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"): return int(line.split()[1]) / 1024
  return float("nan")

def loop(name: str, new: bool, iters: int) -> dict:
  import numpy as np
  from egraph import Tensor
  from lower.device.cache import CACHE
  rng = np.random.default_rng(0)
  x = rng.standard_normal(N, dtype=np.float32)
  if name == "scale":
    def step(i):
      s = 0.37 + i / 1000 if new else 0.37
      got = (Tensor(x) * s).sum(0).numpy()
      return got, (x * np.float32(s)).sum(dtype=np.float64)
  elif name == "lr-step":
    w0 = rng.standard_normal(N, dtype=np.float32)
    w, ref = Tensor(w0).realize(), w0.copy()
    g = Tensor(x).realize()
    def step(i):
      lr = 0.1 / (1 + i) if new else 0.1
      w.assign(w - lr * g).realize()
      ref[:] = ref - np.float32(lr) * x
      return w.numpy()[:8], ref[:8]
  elif name == "mask":
    def step(i):
      k = i if new else 7
      got = (Tensor.arange(N) < k).where(Tensor(x), 0).sum().numpy()
      return got, x[:k].sum(dtype=np.float64)
  else: raise SystemExit(f"unknown loop {name}")
  times, ok = [], True
  c0 = None
  for i in range(iters + 3):
    if i == 3: c0 = CACHE.compiled
    t0 = time.perf_counter()
    got, want = step(i)
    if i >= 3: times.append(time.perf_counter() - t0)
    ok = ok and bool(np.allclose(got, want, rtol=1e-4, atol=1e-3))
  return {"ms": statistics.median(times) * 1e3, "compiled": CACHE.compiled - c0, "ok": ok}

def rss(kind: str, iters: int) -> dict:
  import numpy as np
  from egraph import Tensor
  from lower.device.cache import CACHE
  x = np.random.default_rng(0).standard_normal(N, dtype=np.float32)
  start = None
  for i in range(iters):
    if i == 100: start = rss_mb()
    if kind == "new-scalar": (Tensor(x) * (0.37 + i / 1000)).sum(0).numpy()
    else: (Tensor(x[:N - i]) * 0.37).sum(0).numpy()
  from egraph.engine.driver import _CACHE
  from lower.device.compile_proc import HELPER
  st = CACHE.stats()
  return {"rss0": start, "rss1": rss_mb(), "compiled": CACHE.compiled, "modules": CACHE.modules,
          "held": (st["kernel_bytes"] + st["schedule_bytes"] + _CACHE.nbytes) / 2**20, "evicted": st["slabs_evicted"],
          "helper": HELPER.compiled, "helpers": HELPER.started}

def run(args: list[str], env: list[str] = ()) -> dict:
  p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], capture_output=True, text=True,
                     env={**os.environ, "PYTHONPATH": ROOT, **dict(e.split("=", 1) for e in env)})
  if p.returncode != 0: return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"rc {p.returncode}"}
  return json.loads(p.stdout.strip().splitlines()[-1])

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--procs", type=int, default=3)
  ap.add_argument("--iters", type=int, default=200)
  ap.add_argument("--rss-iters", type=int, default=2000)
  ap.add_argument("--loops", nargs="*", default=["scale", "lr-step", "mask"], help="none: the RSS rows only")
  ap.add_argument("--out")
  ap.add_argument("--env", nargs="*", default=[], help="NAME=VALUE settings for the RSS rows' processes (cache bounds)")
  ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.child:
    c = a.child
    print(json.dumps(loop(c[1], c[2] == "new", int(c[3])) if c[0] == "loop" else rss(c[1], int(c[2])))); return
  lines = [f"`python bench/loops.py --procs {a.procs} --iters {a.iters} --rss-iters {a.rss_iters}"
           f"{' --env ' + ' '.join(a.env) if a.env else ''}` "
           f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}, "
           f"{os.cpu_count()} CPUs, CALLSAT_SCALARS={os.environ.get('CALLSAT_SCALARS', '') or '(default)'}): medians over "
           f"{a.procs} fresh processes per loop and kind, fixed and new interleaved.", "",
           "| loop | fixed scalar ms/iter | new scalar ms/iter | new / fixed | kernels compiled (fixed; new) | values |",
           "|---|---|---|---|---|---|"]
  for name in a.loops:
    res = {"fixed": [], "new": []}
    for p in range(a.procs):
      for kind in (("fixed", "new") if p % 2 == 0 else ("new", "fixed")):
        r = run(["loop", name, kind, str(a.iters)])
        if "error" in r: print(f"{name} {kind}: {r['error']}", file=sys.stderr); continue
        res[kind].append(r); print(name, kind, r, file=sys.stderr)
    if not res["fixed"] or not res["new"]: lines.append(f"| {name} | error | | | | |"); continue
    f, n = (statistics.median(r["ms"] for r in res[k]) for k in ("fixed", "new"))
    comp = "; ".join(str(max(r["compiled"] for r in res[k])) for k in ("fixed", "new"))
    ok = all(r["ok"] for k in res for r in res[k])
    lines.append(f"| {name} | {f:.2f} | {n:.2f} | {n / f:.2f}x | {comp} | {'right' if ok else '**wrong**'} |")
  lines += ["", "| RSS over iterations | MB at iteration 100 | MB at the end | growth MB | kernels compiled | caches' estimate MB at the end "
            "(kernel + schedule + callify) | slabs evicted | modules compiled here; in the compile helper (helpers started) | "
            "llvmlite's leak here, estimated MB (modules compiled here x 70 KB) |", "|---|---|---|---|---|---|---|---|---|"]
  for kind in ("new-scalar", "new-shape"):
    r = run(["rss", kind, str(a.rss_iters)], a.env)
    if "error" in r: lines.append(f"| {kind} | error: {r['error']} | | | | | | | |"); continue
    here = r["modules"] - r["helper"]
    lines.append(f"| {kind}, {a.rss_iters} iterations | {r['rss0']:.0f} | {r['rss1']:.0f} | {r['rss1'] - r['rss0']:+.0f} | {r['compiled']} | "
                 f"{r['held']:.0f} | {r['evicted']} | {here}; {r['helper']} ({r['helpers']}) | {here * 70 / 1024:.1f} |")
  text = "\n".join(lines)
  print(text)
  if a.out:
    with open(a.out, "a") as fh: fh.write("\n" + text + "\n")

if __name__ == "__main__": main()
