"""A pre-norm transformer block (layernorm, single-head attention, output projection, ReLU MLP; T tokens x D features,
float32) through callsat on device CPU against the same math in numpy (OpenBLAS, same thread count), in one process,
interleaved rounds, medians. The CALL is callified once; each round is one run_call (what a model's forward pass costs
once compiled).

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/block.py --rounds 20 [--out notes/benchmarks.md]"""
import argparse, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from egraph import Tensor, callify
from lower.device import native
from lower.runtime import run_call

def build(T: int, D: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  xn = rng.standard_normal((T, D)).astype(np.float32)
  W = {k: (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for k in ("q", "k", "v", "o", "f1", "f2")}
  x, w = Tensor(xn).realize(), {k: Tensor(v).realize() for k, v in W.items()}
  def ln(t):
    c = t - t.mean(axis=1, keepdim=True)
    return c / (c * c).mean(axis=1, keepdim=True).add(1e-5).sqrt()
  h = ln(x)
  att = ((h @ w["q"]) @ (h @ w["k"]).transpose(1, 0) * (1 / np.sqrt(D))).softmax() @ (h @ w["v"])
  y = x + att @ w["o"]
  out = y + (ln(y) @ w["f1"]).relu() @ w["f2"]
  def np_ln(t):
    c = t - t.mean(1, keepdims=True); return c / np.sqrt((c * c).mean(1, keepdims=True) + 1e-5)
  def ref():
    h = np_ln(xn)
    s = (h @ W["q"]) @ (h @ W["k"]).T / np.sqrt(D)
    e = np.exp(s - s.max(1, keepdims=True))
    y = xn + ((e / e.sum(1, keepdims=True)) @ (h @ W["v"])) @ W["o"]
    return y + np.maximum(np_ln(y) @ W["f1"], 0) @ W["f2"]
  return out, ref

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=20)
  ap.add_argument("--sizes", default="256x512,1024x256")
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  rows = []
  for size in args.sizes.split(","):
    T, D = map(int, size.split("x"))
    out, ref = build(T, D)
    res = callify(out.node)
    from lower.schedule.kernelize import kernelize
    from lower.schedule.mem import arg_binding
    kernels = sum(st.kernel is not None for st in kernelize(res.call.src[0], arg_binding(res.call)[0]).steps)
    run_call(res.call)
    np.testing.assert_allclose(out.numpy(), ref(), rtol=2e-3, atol=2e-3)
    ts = {"callsat": [], "numpy": []}
    for _ in range(args.rounds):
      for k, f in (("callsat", lambda: run_call(res.call)), ("numpy", ref)):
        f(); t0 = time.perf_counter(); f(); ts[k].append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.3)   # OpenBLAS's threads spin ~0.1 s after a call, on the cores our kernel threads are pinned to
    med = {k: statistics.median(v) for k, v in ts.items()}
    rows.append(f"| T={T} D={D} | {med['callsat']:.2f} | {med['numpy']:.2f} | {med['numpy'] / med['callsat']:.2f}x | {kernels} |")
  text = "\n".join([f"`python bench/block.py --rounds {args.rounds}` — transformer block forward (pre-norm, 1 head, ReLU MLP), "
                    f"medians of {args.rounds} interleaved rounds, llvm threads={native.THREADS}, values checked against numpy; load "
                    f"{os.getloadavg()[0]:.2f}.", "", "| shape | callsat run_call ms | numpy ms | numpy / callsat | kernels |",
                    "|---|---|---|---|---|", *rows])
  print(text)
  if args.out:
    with open(args.out, "a") as f: f.write(f"\n## Transformer block forward ({time.strftime('%Y-%m-%d')})\n\n{text}\n")

if __name__ == "__main__": main()
