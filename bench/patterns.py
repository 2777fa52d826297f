"""Common tensor patterns through callsat on device CPU vs the same numpy expression, one process, interleaved,
medians: reductions along rows, columns and everything, softmax, transposes, batch statistics, matmul epilogues,
logsumexp. Each callsat row is one run_call of a CALL callified once; values are checked against numpy first.

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/patterns.py --rounds 9 [--out notes/benchmarks.md]"""
import argparse, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from egraph import Tensor, callify
from lower.device import native
from lower.runtime import run_call

def cases():
  rng = np.random.default_rng(0)
  xn = rng.standard_normal((4096, 4096)).astype(np.float32); x = Tensor(xn).realize()
  an = rng.standard_normal((1024, 1024)).astype(np.float32); a = Tensor(an).realize()
  sm = lambda v: (lambda e: e / e.sum(-1, keepdims=True))(np.exp(v - v.max(-1, keepdims=True)))
  T, H, Dh = 256, 8, 64
  qn, kn, vn = (rng.standard_normal((T, H * Dh)).astype(np.float32) for _ in range(3))
  q, k, v = (Tensor(t).realize() for t in (qn, kn, vn))
  heads = lambda t: t.reshape(T, H, Dh).permute(1, 0, 2)
  nheads = lambda t: t.reshape(T, H, Dh).transpose(1, 0, 2)
  mha = (((heads(q) @ heads(k).transpose(1, 2)) * (1 / 8.0)).softmax() @ heads(v)).permute(1, 0, 2).reshape(T, H * Dh)
  mha_np = lambda: (sm(nheads(qn) @ nheads(kn).transpose(0, 2, 1) / 8.0) @ nheads(vn)).transpose(1, 0, 2).reshape(T, H * Dh)
  return [
    ("sum of 16M f32", x.sum(), lambda: xn.sum()),
    ("row sums 4096^2", x.sum(axis=1), lambda: xn.sum(1)),
    ("column sums 4096^2", x.sum(axis=0), lambda: xn.sum(0)),
    ("row softmax 4096^2", x.softmax(), lambda: sm(xn)),
    ("transpose copy 4096^2", x.transpose(1, 0).contiguous(), lambda: np.ascontiguousarray(xn.T)),
    ("batch norm (column mean/var) 4096^2", (x - x.mean(axis=0)) / (x.var(axis=0) + 1e-5).sqrt(),
     lambda: (xn - xn.mean(0)) / np.sqrt(xn.var(0) + 1e-5)),
    ("relu(a @ a + 1), 1024^3", (a @ a + 1.0).relu(), lambda: np.maximum(an @ an + 1, 0)),
    ("a.T @ a, 1024^3", a.transpose(1, 0) @ a, lambda: an.T @ an),
    ("softmax(a @ a.T), 1024^3", (a @ a.transpose(1, 0)).softmax(), lambda: sm(an @ an.T)),
    ("attention, 8 heads x 64, T=256 (bmm)", mha, mha_np),
    ("logsumexp rows 1024^2", (a - a.max(axis=1, keepdim=True)).exp().sum(axis=1).log(),
     lambda: np.log(np.exp(an - an.max(1, keepdims=True)).sum(1))),
  ]

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=9)
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  rows = []
  for name, t, ref in cases():
    res = callify(t.node)
    np.testing.assert_allclose(t.numpy(), ref(), rtol=1e-3, atol=1e-3)
    ts = {"callsat": [], "numpy": []}
    for _ in range(args.rounds):
      for k, f in (("callsat", lambda: run_call(res.call)), ("numpy", ref)):
        f(); t0 = time.perf_counter(); f(); ts[k].append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.2)   # OpenBLAS's spinning threads off the cores before the next contender
    med = {k: statistics.median(v) for k, v in ts.items()}
    rows.append(f"| {name} | {med['callsat']:.2f} | {med['numpy']:.2f} | {med['numpy'] / med['callsat']:.2f}x |")
  text = "\n".join([f"`python bench/patterns.py --rounds {args.rounds}` — medians of {args.rounds} interleaved rounds, ms, llvm "
                    f"threads={native.THREADS}, numpy with OpenBLAS at the same count; values checked; load {os.getloadavg()[0]:.2f}.", "",
                    "| pattern | callsat run_call | numpy | numpy / callsat |", "|---|---|---|---|", *rows])
  print(text)
  if args.out:
    with open(args.out, "a") as f: f.write(f"\n## Common patterns vs numpy ({time.strftime('%Y-%m-%d')})\n\n{text}\n")

if __name__ == "__main__": main()
