"""callsat's callify vs tinygrad's `transform_to_call` on the same Tensor programs, in the same run.

  python bench/callify_vs_tinygrad.py [--sizes 1000 10000 50000 100000] [--repeat 3] [--out notes/benchmarks.md]

Each (implementation, graph, size) runs in its own subprocess (peak RSS is per process). Sizes are counted as tinygrad
UOps of the same Tensor program (shape-argument nodes included), so both sides use one unit; callsat's own IR count is
shown beside it. tinygrad is an optional dependency (`pip install tinygrad==0.14.0`); without it only callsat runs.
"""
from __future__ import annotations
import argparse, datetime, json, math, os, resource, statistics, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- the programs: written once against the tinygrad Tensor API, which callsat's Tensor mirrors ---------------------

def chain(T, steps: int):
  a = T.empty(64)
  x = T.empty(64)
  for i in range(steps):
    x = x * a + 1.0 if i % 2 else (x - a) * 0.5
    if i % 10 == 9: x = x.contiguous()
  return [x]

def dag(T, steps: int):
  w = max(2, int(math.sqrt(steps) / 2))
  layer = [T.empty(64) for _ in range(w)]
  k = 0
  for _ in range(max(1, steps // w)):
    nxt = []
    for j in range(w):
      x, y = layer[(j * 7 + k) % w], layer[(j * 3 + 1 + k) % w]
      z = (x + y) if (j + k) % 3 == 0 else (x * y) if (j + k) % 3 == 1 else x.maximum(y)
      nxt.append(z.contiguous() if (j + k) % 5 == 0 else z)
    layer, k = nxt, k + 1
  return layer

def transformer(T, layers: int, B=2, S=16, D=32, H=4):
  x = T.empty(B, S, D)
  for _ in range(layers):
    wq, wk, wv, wo, w1, w2 = T.empty(D, D), T.empty(D, D), T.empty(D, D), T.empty(D, D), T.empty(D, 4 * D), T.empty(4 * D, D)
    mu = x.mean(axis=-1, keepdim=True); xc = x - mu
    h = xc / ((xc * xc).mean(axis=-1, keepdim=True) + 1e-5).sqrt()
    q, k, v = [(h @ w).reshape(B, S, H, D // H).permute(0, 2, 1, 3) for w in (wq, wk, wv)]
    att = (q @ k.permute(0, 1, 3, 2)) * (1.0 / math.sqrt(D // H))
    att = (att - att.max(axis=-1, keepdim=True)).exp()
    att = att / att.sum(axis=-1, keepdim=True)
    o = (att @ v).permute(0, 2, 1, 3).reshape(B, S, D) @ wo
    x = (x + o).contiguous()
    x = (x + ((x @ w1).relu() @ w2)).contiguous()
  return [x]

PROGRAMS = {"chain": chain, "dag": dag, "transformer": transformer}

# ---- one measurement, in a subprocess ---------------------------------------------------------------------------------

def tiny_count(kind: str, param: int) -> int:
  from tinygrad import Tensor
  from tinygrad.uop.ops import UOp
  return len(UOp.sink(*[t.uop for t in PROGRAMS[kind](Tensor, param)]).toposort())

def measure(impl: str, kind: str, param: int, repeat: int) -> dict:
  sys.setrecursionlimit(1_000_000)
  times = []
  if impl == "tinygrad":
    from tinygrad import Tensor
    from tinygrad.uop.ops import UOp
    from tinygrad.tensor import transform_to_call
    for _ in range(repeat):
      sink = UOp.sink(*[t.uop for t in PROGRAMS[kind](Tensor, param)])
      t0 = time.perf_counter(); call, bmap = transform_to_call(sink); times.append(time.perf_counter() - t0)
    extra = {"uops": len(sink.toposort()), "mapped": len(bmap)}
  else:
    sys.path.insert(0, ROOT)
    from egraph import Tensor, callify
    from egraph.ir.ops import toposort
    for _ in range(repeat):
      outs = PROGRAMS[kind](Tensor, param)
      t0 = time.perf_counter(); res = callify(*outs, cache=False); times.append(time.perf_counter() - t0)
    extra = {"ir_nodes": len(toposort([t.node for t in outs])), "mapped": len(res.buffer_map),
             "phases": {k: round(v, 4) for k, v in res.report.seconds.items()}, "stores": res.report.stores}
  return {"impl": impl, "kind": kind, "param": param, "median_s": statistics.median(times),
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}

def sub(*args) -> dict:
  # tinygrad needs a device to build graphs; NULL has no effect on callify (the spec's listings were made with it)
  env = {**os.environ, "DEV": "NULL"}
  out = subprocess.run([sys.executable, __file__, "--one", *map(str, args)], capture_output=True, text=True, cwd=ROOT, env=env)
  if out.returncode: raise RuntimeError(out.stderr[-2000:])
  return json.loads(out.stdout.strip().splitlines()[-1])

def param_for(kind: str, uops: int, have_tiny: bool) -> int:
  """The program parameter whose tinygrad UOp count is closest to `uops` (callsat's IR count without tinygrad)."""
  lo, hi = 1, 2
  count = (lambda p: sub("count", kind, p, 0)["uops"]) if have_tiny else (lambda p: sub("callsat", kind, p, 1)["ir_nodes"])
  while count(hi) < uops: lo, hi = hi, hi * 2
  while hi - lo > max(1, lo // 50):
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if count(mid) < uops else (lo, mid)
  return hi

def slope(xs, ys) -> float:
  lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
  mx, my = statistics.mean(lx), statistics.mean(ly)
  return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)

def main():
  if sys.argv[1:2] == ["--one"]:
    impl, kind, param, repeat = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    print(json.dumps({"uops": tiny_count(kind, param)} if impl == "count" else measure(impl, kind, param, repeat))); return
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000, 100000])
  p.add_argument("--kinds", nargs="+", default=list(PROGRAMS))
  p.add_argument("--repeat", type=int, default=3)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  try: import tinygrad; have_tiny = True  # noqa: F401
  except ImportError: have_tiny = False; print("tinygrad not installed: measuring callsat only (pip install tinygrad==0.14.0)")
  rows, lines = [], ["| graph | tinygrad UOps | callsat IR nodes | callsat s | tinygrad s | ratio | callsat MB | tinygrad MB | callsat phases (s) |",
                     "|---|---|---|---|---|---|---|---|---|"]
  for kind in args.kinds:
    for n in args.sizes:
      param = param_for(kind, n, have_tiny)
      c = sub("callsat", kind, param, args.repeat)
      t = sub("tinygrad", kind, param, args.repeat) if have_tiny else None
      uops = t["uops"] if t else None
      rows.append((kind, uops or c["ir_nodes"], c, t))
      ph = " ".join(f"{k}={v:.2f}" for k, v in c["phases"].items())
      lines.append(f"| {kind} | {uops or '-'} | {c['ir_nodes']} | {c['median_s']:.3f} | " +
                   (f"{t['median_s']:.3f} | {c['median_s'] / t['median_s']:.2f}x | " if t else "- | - | ") +
                   f"{c['peak_rss_mb']:.0f} | {t['peak_rss_mb']:.0f} | {ph} |".replace("| None |", "| - |") if t else
                   f"{c['peak_rss_mb']:.0f} | - | {ph} |")
      print(lines[-1], flush=True)
  exps = []
  for kind in args.kinds:
    r = [x for x in rows if x[0] == kind]
    if len(r) < 2: continue
    e = f"{kind}: callsat N^{slope([x[1] for x in r], [x[2]['median_s'] for x in r]):.2f}"
    if have_tiny: e += f", tinygrad N^{slope([x[1] for x in r], [x[3]['median_s'] for x in r]):.2f}"
    exps.append(e)
  print("scaling exponents (log-log least squares over the sizes):", "; ".join(exps))
  if args.out:
    cmd = "python bench/callify_vs_tinygrad.py " + " ".join(sys.argv[1:])
    with open(args.out, "a") as f:
      f.write(f"\n## callify vs tinygrad 0.14 `transform_to_call` ({datetime.date.today()})\n\n`{cmd}` — medians of "
              f"{args.repeat} runs per size, each implementation in its own process; sizes in tinygrad UOps of the same "
              f"Tensor program; ratio = callsat / tinygrad (lower is better).\n\n" + "\n".join(lines) +
              f"\n\nScaling exponents: {'; '.join(exps)}.\n")

if __name__ == "__main__": main()
