"""How near the truth are a training step's values: beautiful_mnist's Model (tinygrad's example code, seeded random
weights as bench/models.py loads them), loss and every parameter's gradient on one batch, computed by stock tinygrad
(float32), by callsat's kernels (CALLSAT_BRIDGE_BACKEND=callsat, strict; float32) and by stock tinygrad in float64 (the
same weights and batch, cast: the reference). Each a fresh process on DEV=CPU.

  python bench/grad_accuracy.py [--batch 16] [--seed 0] [--tinygrad DIR] [--out FILE]

Per parameter: the largest error relative to the largest float64 gradient entry (max|g - g64| / max|g64|), for stock and
for callsat. bench/models.py compares callsat with stock; where the two differ beyond tinygrad's tolerance, this says
which one the float64 computation agrees with."""
from __future__ import annotations
import argparse, datetime, os, subprocess, sys, tempfile
import numpy as np
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from models import TINYGRAD_TESTS, _load_random   # noqa: E402  (bench/ is not a package: its scripts import each other)

MODES = ("stock", "callsat", "float64")

def worker(mode: str, batch: int, seed: int, out: str) -> None:
  if mode == "callsat":
    import egraph.tinygrad as br
    br.install(strict=True, backend="callsat")
  from tinygrad import Tensor, Context, nn, dtypes
  import examples.beautiful_mnist as bm
  rng = np.random.default_rng(seed)
  model = bm.Model()
  _load_random(model, rng)
  params = nn.state.get_parameters(model)
  X = Tensor(rng.integers(0, 256, (batch, 1, 28, 28), dtype="uint8"))
  Y = Tensor(rng.integers(0, 10, batch, dtype="uint8"))
  if mode == "float64":
    for p in params:
      if dtypes.is_float(p.dtype): p.replace(p.cast(dtypes.float64).realize())
  with Context(TRAINING=1):
    for p in params: p.grad, p.requires_grad = None, True
    loss = model(X.cast(dtypes.float64) if mode == "float64" else X).sparse_categorical_crossentropy(Y).backward()
    grads = {k: p.grad.numpy().astype(np.float64) for k, p in nn.state.get_state_dict(model).items() if p.grad is not None}
  np.savez(out, __loss__=np.float64(loss.item()), **grads)

def run(mode: str, args, path: str) -> None:
  env = {**os.environ, "DEV": "CPU", "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, args.tinygrad, os.environ.get("PYTHONPATH")]))}
  env.pop("CALLSAT_BRIDGE_BACKEND", None)
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--batch", str(args.batch), "--seed", str(args.seed),
         "--tinygrad", args.tinygrad, "--to", path]
  p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
  if p.returncode: raise SystemExit(f"{mode} worker failed:\n{p.stderr[-2000:]}")

def table(res: dict) -> list[str]:
  ref = res["float64"]
  lines = ["| value | float64 | stock error | callsat error | nearer float64 |", "|---|---|---|---|---|"]
  for k in ref.files:
    t = ref[k]
    scale = np.abs(t).max() or 1.0
    es, ec = (float(np.abs(res[m][k] - t).max() / scale) for m in ("stock", "callsat"))
    name, shown = ("loss", f"{float(t):.7g}") if k == "__loss__" else (f"grad {k} {t.shape}", f"max {scale:.3g}")
    lines.append(f"| {name} | {shown} | {es:.2e} | {ec:.2e} | {'callsat' if ec < es else 'stock' if es < ec else 'same'} |")
  return lines

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--tinygrad", default=TINYGRAD_TESTS)
  ap.add_argument("--out", help="append the table to this markdown file")
  ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
  ap.add_argument("--to", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    sys.path.insert(0, args.tinygrad)
    return worker(args.worker, args.batch, args.seed, args.to)
  with tempfile.TemporaryDirectory() as d:
    res = {}
    for m in MODES:
      run(m, args, os.path.join(d, f"{m}.npz"))
      res[m] = np.load(os.path.join(d, f"{m}.npz"))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"`python bench/grad_accuracy.py --batch {args.batch} --seed {args.seed}` ({when}): beautiful_mnist's Model, one "
           "batch, error = max|g - g64| / max|g64| per value.", "", *table(res), ""]
  print("\n".join(out))
  if args.out:
    with open(args.out, "a") as f: f.write("\n".join(out) + "\n")

if __name__ == "__main__":
  main()
