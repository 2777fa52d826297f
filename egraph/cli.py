"""`callsat` command line: `callsat demo [--model NAME]`."""
from __future__ import annotations
import argparse, sys, time
import numpy as np

def _mlp(T):
  """2-layer MLP with softmax on random data; returns (output tensor, numpy reference)."""
  T.manual_seed(0)
  x, w1, b1, w2, b2 = T.randn(32, 64), T.randn(64, 128) * 0.1, T.randn(128) * 0.1, T.randn(128, 10) * 0.1, T.randn(10) * 0.1
  Tx = [t.realize() for t in (x, w1, b1, w2, b2)]
  h = (x @ w1 + b1).relu().contiguous()   # a realized hidden layer, as a model would keep it
  logits = h @ w2 + b2
  e = (logits - logits.max(axis=1, keepdim=True)).exp().contiguous()
  out = e / e.sum(axis=1, keepdim=True)
  nx, nw1, nb1, nw2, nb2 = (t.numpy().astype(np.float64) for t in Tx)
  nl = np.maximum(nx @ nw1 + nb1, 0) @ nw2 + nb2
  ne = np.exp(nl - nl.max(axis=1, keepdims=True))
  return out, ne / ne.sum(axis=1, keepdims=True)

def _views(T):
  """Realized buffer, a contiguous slice (zero-copy view), an in-place assign and a multi-output realize."""
  T.manual_seed(1)
  a = T.randn(8, 16).realize()
  na = a.numpy().astype(np.float64)
  rows = a[2:6].contiguous()               # one contiguous range of a: becomes a SLICE view, no copy
  s = (rows * 2).sum(axis=1)
  return s, (na[2:6] * 2).sum(axis=1)

MODELS = {"mlp": _mlp, "views": _views}

def demo(args) -> int:
  from egraph import Tensor, callify
  out, ref = MODELS[args.model](Tensor)
  t0 = time.perf_counter()
  res = callify(out, cost=args.cost, schedule=args.schedule)
  print(f"model: {args.model}   output {out.shape} {out.dtype.name} on {out.device}")
  print(res.report)
  print(f"  buffer_map {len(res.buffer_map)} entries; CALL has {len(res.call.src) - 1} args")
  t1 = time.perf_counter()
  got = out.numpy()
  print(f"  realize (callify again + execute on {out.device}): {1e3 * (time.perf_counter() - t1):.1f} ms")
  err = float(np.max(np.abs(got.astype(np.float64) - ref)))
  ok = np.allclose(got, ref, rtol=1e-4, atol=1e-5)
  print(f"  check vs numpy: max abs error {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
  return 0 if ok else 1

def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="callsat", description="Schedule tensor graphs by equality saturation.")
  sub = p.add_subparsers(dest="cmd", required=True)
  d = sub.add_parser("demo", help="callify a small model, print the report, execute it and check it against numpy")
  d.add_argument("--model", choices=sorted(MODELS), default="mlp")
  d.add_argument("--cost", default="bytes", help="cost model preset: bytes, kernels, buffers, nodes")
  d.add_argument("--schedule", default="saturate", help="schedule preset: saturate, once, baseline")
  args = p.parse_args(argv)
  from egraph.errors import CallsatError
  try: return {"demo": demo}[args.cmd](args)
  except CallsatError as e:
    print(f"callsat: error: {e}", file=sys.stderr); return 2
