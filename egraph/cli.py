"""`callsat` command line: `callsat demo [--model NAME]`, `callsat order` (saturation vs rule orders over a corpus),
`callsat explain` (why a realized tensor became a view, a fresh buffer or an alias), `callsat export` (.egg / JSON)."""
from __future__ import annotations
import argparse, sys, time
import numpy as np
from egraph.errors import CallsatError

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

def order(args) -> int:
  from egraph import ordering
  names = args.graphs or ordering.corpus_names(args.generated)
  if args.plot: ordering.require_matplotlib()      # say what to install before running anything
  if args.ray: raise CallsatError("--ray is not implemented yet; use --workers N (processes)")
  results = ordering.sweep(names, k=args.orders, seed=args.seed, workers=args.workers)
  print(ordering.table(results))
  dep = sum(r.order_dependent for r in results)
  print(f"\n{dep}/{len(results)} graphs depend on the rule order; saturation is never worse than an order on "
        f"{sum(r.saturated_best for r in results)}/{len(results)}")
  if args.csv:
    with open(args.csv, "w") as f: f.write(ordering.to_csv(results))
  if args.json:
    with open(args.json, "w") as f: f.write(ordering.to_json(results))
  if args.plot: ordering.plot(results, args.plot); print(f"plot written to {args.plot}")
  return 0

def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="callsat", description="Schedule tensor graphs by equality saturation.")
  sub = p.add_subparsers(dest="cmd", required=True)
  d = sub.add_parser("demo", help="callify a small model, print the report, execute it and check it against numpy")
  d.add_argument("--model", choices=sorted(MODELS), default="mlp")
  d.add_argument("--cost", default="bytes", help="cost model preset: bytes, kernels, buffers, nodes")
  d.add_argument("--schedule", default="saturate", help="schedule preset: saturate, once, baseline")
  o = sub.add_parser("order", help="run a corpus under saturation and under K random rule orders (ordered, destructive mode)")
  o.add_argument("--orders", "-k", type=int, default=8, help="random orders per graph")
  o.add_argument("--generated", type=int, default=8, help="generated graphs in the corpus (besides the demo models)")
  o.add_argument("--graph", dest="graphs", action="append", help="corpus entry model:NAME or gen:SEED (repeatable)")
  o.add_argument("--seed", type=int, default=0)
  o.add_argument("--workers", type=int, default=1, help="processes")
  o.add_argument("--ray", metavar="ADDRESS", help="(not implemented) run the sweep on a ray cluster")
  o.add_argument("--csv"); o.add_argument("--json"); o.add_argument("--plot", metavar="PNG")
  args = p.parse_args(argv)
  try: return {"demo": demo, "order": order}[args.cmd](args)
  except CallsatError as e:
    print(f"callsat: error: {e}", file=sys.stderr); return 2
