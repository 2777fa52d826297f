"""callsat's kernels and user path vs numpy on a quiet machine and beside a CPU-bound process (issue 27): one process,
quiet and busy rounds interleaved, contenders interleaved inside each round; medians.

  python bench/busy.py [--rounds 7] [--out notes/benchmarks.md]

Each contender starts after SETTLE_S of sleep (the previous one's spinning threads idle). Busy: a
`python -c 'while True: pass'` pinned with taskset to the last CPU this process may use, started before and
killed after each busy round (so quiet rounds are quiet). Per workload:
  kernel  callsat's CALL run again on prepared buffers (lower.runtime.run_call: the prepared plan)
  kernel1 the same on one thread (lower.device.native.THREADS = 1): what a split kernel must not fall below under load
  user    what a user writes: `(Tensor(x) @ Tensor(y)).realize()` over host arrays made once (callify cache hit, new
          output buffer, launch)
  numpy   the same in numpy (OpenBLAS for matmul, at this process's thread count)
Reported: ms, kernel/numpy and user/numpy speed ratios (numpy time / ours), busy ratio / quiet ratio, and user speed as
a share of the kernel's, and the busy split kernel's speed as a share of the quiet one-thread kernel's (on 2 CPUs with one
taken, numpy's one thread keeps its core while a split kernel gets half its second one, 1.5 cores against 2: a kernel
that runs 2x faster on two threads keeps at most 0.75 of its quiet ratio vs numpy there, but the split kernel should
stay at or above one thread's speed). Values checked against numpy once per workload."""
from __future__ import annotations
import argparse, datetime, os, statistics, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np

# before each contender: OpenBLAS's threads spin ~0.1 s after a call and take the second core (a kernel timed right after
# numpy's matmul 1024^3 ran 1.5-2.3x slower), our pool's workers spin briefly too
SETTLE_S = 0.3

def timeit(f, reps: int) -> float:
  from egraph import synchronize   # realize returns while its kernel may still run: the time ends when it has finished
  f(); synchronize()   # once untimed: each contender starts warm (see bench/kernels.py)
  t = time.perf_counter()
  for _ in range(reps): f()
  synchronize()
  return (time.perf_counter() - t) / reps

def workloads(rng):
  from egraph import Tensor
  out = {}
  for n in (256, 512, 1024):
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    out[f"matmul {n}^3"] = (a, b, lambda x, y: x @ y, lambda x, y: x @ y, 1e-3)
  x = rng.standard_normal(16 << 20, dtype=np.float32)
  out["elementwise 16M"] = (x, x[::-1].copy(), lambda p, q: (p + q) * p - 1, lambda p, q: (p + q) * p - 1, 1e-5)
  r = rng.standard_normal((4096, 4096), dtype=np.float32)
  out["row sum 4096^2"] = (r, None, lambda p, q: p.sum(1), lambda p, q: p.sum(1), 1e-3)
  return out, Tensor

def prepared(T, fn, a, b):
  """The workload's CALL over realized inputs, run once (compiled, planned): `run()` runs its prepared plan again."""
  from egraph import callify
  from lower.runtime import run_call
  ta, tb = T(a).realize(), (T(b).realize() if b is not None else None)
  res = callify(fn(ta, tb))
  run_call(res.call)
  return lambda: run_call(res.call)

def one_thread(f):
  """`f` run with callsat's kernels on one thread."""
  from lower.device import native
  def g():
    old, native.THREADS = native.THREADS, 1
    try: f()
    finally: native.THREADS = old
  return g

def hog(cpu: int) -> subprocess.Popen:
  return subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"])

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--out")
  ap.add_argument("--only", nargs="*", help="workload names to run (default all)")
  a = ap.parse_args()
  cpus = sorted(os.sched_getaffinity(0))
  try:
    from threadpoolctl import threadpool_limits   # OpenBLAS at this process's thread count, as ours
    threadpool_limits(len(cpus))
  except ImportError: pass                        # OpenBLAS's default: every CPU, the same here
  rng = np.random.default_rng(0)
  ws, T = workloads(rng)
  if a.only: ws = {k: v for k, v in ws.items() if any(o in k for o in a.only)}
  load0 = os.getloadavg()[0]
  runs = {}
  for name, (x, y, ours, ref, tol) in ws.items():
    want = ref(x, y)
    got = ours(T(x), T(y) if y is not None else None).numpy()
    assert np.allclose(got, want, rtol=tol, atol=tol * 10), f"{name}: wrong values"
    kernel = prepared(T, ours, x, y)
    tx, ty = T(x).realize(), (T(y).realize() if y is not None else None)
    user = lambda ours=ours, tx=tx, ty=ty: ours(tx, ty).realize()
    npf = lambda ref=ref, x=x, y=y: ref(x, y)
    reps = max(1, int(0.05 / max(timeit(npf, 1), 1e-5)))
    runs[name] = (kernel, one_thread(kernel), user, npf, reps)
  res = {(n, phase, who): [] for n in runs for phase in ("quiet", "busy") for who in ("kernel", "kernel1", "user", "numpy")}
  for r in range(a.rounds):
    for phase in (("quiet", "busy") if r % 2 == 0 else ("busy", "quiet")):
      h = hog(cpus[-1]) if phase == "busy" else None
      if h: time.sleep(0.2)
      try:
        for n, (kernel, kernel1, user, npf, reps) in runs.items():
          for who, f in (("kernel", kernel), ("kernel1", kernel1), ("user", user), ("numpy", npf)):
            time.sleep(SETTLE_S)
            res[(n, phase, who)].append(timeit(f, reps))
      finally:
        if h: h.kill(); h.wait()
  med = {k: statistics.median(v) * 1e3 for k, v in res.items()}
  lines = [f"`python bench/busy.py --rounds {a.rounds}` ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
           f"load {load0:.1f}, {len(cpus)} CPUs, busy: a spinning process pinned to CPU {cpus[-1]}): ms medians over rounds; "
           "speed ratios are numpy's time / ours (> 1: callsat faster).", "",
           "| workload | phase | kernel ms | kernel, 1 thread ms | user ms | numpy ms | kernel vs numpy | user vs numpy | "
           "user / kernel speed |", "|---|---|---|---|---|---|---|---|---|"]
  for n in runs:
    for phase in ("quiet", "busy"):
      k, k1, u, p = (med[(n, phase, w)] for w in ("kernel", "kernel1", "user", "numpy"))
      lines.append(f"| {n} | {phase} | {k:.2f} | {k1:.2f} | {u:.2f} | {p:.2f} | {p / k:.2f}x | {p / u:.2f}x | {k / u:.2f} |")
  lines += ["", "| workload | kernel busy/quiet ratio | user busy/quiet ratio | busy kernel speed / quiet 1-thread kernel speed |",
            "|---|---|---|---|"]
  for n in runs:
    rk = [med[(n, ph, "numpy")] / med[(n, ph, "kernel")] for ph in ("quiet", "busy")]
    ru = [med[(n, ph, "numpy")] / med[(n, ph, "user")] for ph in ("quiet", "busy")]
    lines.append(f"| {n} | {rk[1] / rk[0]:.2f} | {ru[1] / ru[0]:.2f} | {med[(n, 'quiet', 'kernel1')] / med[(n, 'busy', 'kernel')]:.2f} |")
  text = "\n".join(lines)
  print(text)
  if a.out:
    with open(a.out, "a") as fh: fh.write("\n" + text + "\n")

if __name__ == "__main__": main()
