"""tinygrad stock vs callsat's bridge with the cost-mode option (issue 14), on tinygrad's CPU device: programs of
bench/fusion_programs.py's kinds written as tinygrad Tensor code. Modes: `stock` (tinygrad's own pass and thresholds),
`cost` (CALLSAT_BRIDGE_FUSION=cost: the partition's extra realize points as CONTIGUOUS in the CALL body) and
`cost-store` (the same points stored by the bridge's CALL, as a program's own .contiguous() is). Per program and mode:
kernels of one realize, hints (CONTIGUOUS handed to tinygrad), values against stock, and steady-state run time: the
program under TinyJit (captured once per mode, so neither callify nor tinygrad's scheduler is timed), each sample
repeated to last >= --min-ms, modes interleaved in every round (their order rotating), medians over --rounds.

  python bench/fusion_tinygrad.py --rounds 5 [--min-ms 20] [--only substr] [--modes stock,cost,cost-store] [--out notes/benchmarks.md]"""
from __future__ import annotations
import argparse, math, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("DEV", "CPU")
import numpy as np
from tinygrad import Tensor, TinyJit, GlobalCounters, Context, nn
from tinygrad.uop.ops import Ops as TOps
from egraph import tinygrad as bridge

PROGRAMS: list[tuple[str, object]] = []   # (name, setup(rng) -> (step(*inputs) -> Tensor, inputs))
def program(name):
  def deco(f): PROGRAMS.append((name, f)); return f
  return deco

def _t(rng, *shape, scale=1.0): return Tensor((rng.standard_normal(shape) * scale).astype(np.float32)).realize()

@program("row softmax 1024^2")
def _(rng): return (lambda x: x.softmax(-1)), [_t(rng, 1024, 1024)]
@program("log softmax rows 1024^2")
def _(rng): return (lambda x: x.log_softmax(-1)), [_t(rng, 1024, 1024)]
@program("column softmax 1024^2")
def _(rng): return (lambda x: x.softmax(0)), [_t(rng, 1024, 1024)]
@program("layernorm 1024^2 (gain, bias)")
def _(rng):
  g, b = _t(rng, 1024), _t(rng, 1024)
  return (lambda x: x.layernorm() * g + b), [_t(rng, 1024, 1024)]
@program("shared exp used by two reduces 1024^2")
def _(rng): return (lambda x, y: (e := (x * y).exp()).sum(0).reshape(1, -1) + e.max(1).reshape(-1, 1)), [_t(rng, 1024, 1024), _t(rng, 1024, 1024)]
@program("shared value reads 4 buffers, broadcast")
def _(rng):
  def f(a, b, c, d):
    s = (a * b + c * d).sqrt()
    return (s.reshape(256, 1, 256) + s.reshape(1, 256, 256)).sum(2)
  return f, [_t(rng, 256, 256).abs() for _ in range(4)]
@program("attention 8 heads x 64, T=256")
def _(rng): return (lambda q, k, v: q.scaled_dot_product_attention(k, v)), [_t(rng, 1, 8, 256, 64, scale=0.3) for _ in range(3)]
@program("MLP forward 256x512x1024x256 + softmax")
def _(rng):
  l1, l2 = nn.Linear(512, 1024), nn.Linear(1024, 256)
  Tensor.realize(*nn.state.get_parameters([l1, l2]))
  return (lambda x: l2(l1(x).relu()).softmax(-1)), [_t(rng, 256, 512)]
@program("MLP step (forward, backward, SGD) 128x256x512x64")
def _(rng):
  l1, l2 = nn.Linear(256, 512), nn.Linear(512, 64)
  opt = nn.optim.SGD(nn.state.get_parameters([l1, l2]), lr=1e-3)
  Tensor.realize(*nn.state.get_parameters([l1, l2]))
  def step(x):
    with Context(TRAINING=1):
      opt.zero_grad()
      loss = l2(l1(x).relu()).log_softmax(-1).mean()
      loss.backward(); opt.step()
    return loss
  return step, [_t(rng, 128, 256)]
@program("lerp a*(1-w)+b*w, w broadcast row 2048^2")
def _(rng):
  def f(a, b, w): return (a * (1 - w.exp()) + b * w.exp()).sum(1)
  return f, [_t(rng, 2048, 2048), _t(rng, 2048, 2048), _t(rng, 1, 2048)]
@program("batch norm 1024^2")
def _(rng): return (lambda x: (x - x.mean(0)) / (x.var(0, correction=0) + 1e-5).sqrt()), [_t(rng, 1024, 1024)]
@program("1x1 conv of relu(x*s+b) 16x64->64, 32x32")
def _(rng):
  s, b, w = _t(rng, 1, 64, 1, 1), _t(rng, 1, 64, 1, 1), _t(rng, 64, 64, 1, 1, scale=0.1)
  return (lambda x: (x * s + b).relu().conv2d(w)), [_t(rng, 16, 64, 32, 32)]

MODES = ("stock", "cost", "cost-store")

def use(mode: str) -> None:
  """Put the process in `mode` (the bridge reads CALLSAT_BRIDGE_FUSION when it runs)."""
  if mode == "stock": bridge.uninstall(); return
  os.environ["CALLSAT_BRIDGE_FUSION"] = mode
  bridge.install(strict=True)

def code_of(jit) -> tuple:
  """The captured program's kernels, each as its source (copies as their op): equal tuples run the same kernels."""
  return tuple(c.src[0].src[2].arg if c.src[0].op is TOps.PROGRAM else c.src[0].op.name for c in jit.captured._linear.src)

class Case:
  """One program under one mode: kernels and hints of one realize, its values, and the jitted step."""
  def __init__(self, name: str, setup, mode: str):
    use(mode)
    self.mode, rng = mode, np.random.default_rng(0)
    Tensor.manual_seed(0)
    step, self.inputs = setup(rng)
    bridge.reset_stats()
    GlobalCounters.reset()
    out = step(*self.inputs); out.realize()
    self.kernels = GlobalCounters.kernel_count
    st = bridge.stats()
    self.hints, self.hint_s = (st["hints"], st["hint_seconds"]) if mode != "stock" else (0, 0.0)
    self.value = out.numpy()
    self.jit = TinyJit(lambda *xs: step(*xs).realize())
    for _ in range(3): self.jit(*self.inputs)   # captured on the second call; replays from the third
    self.code = code_of(self.jit)
    self.samples: list[float] = []
    self.reps = 1

  def sample(self, min_s: float) -> None:
    while True:
      t = time.perf_counter()
      for _ in range(self.reps): self.jit(*self.inputs)
      Tensor.realize(*self.inputs)
      dt = time.perf_counter() - t
      if dt >= min_s or self.reps >= 1 << 12: break
      self.reps = max(self.reps * 2, int(self.reps * min_s / max(dt, 1e-6)) + 1)
    self.samples.append(dt / self.reps)

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--min-ms", type=float, default=20.0)
  ap.add_argument("--only", default="")
  ap.add_argument("--modes", default=",".join(MODES))
  ap.add_argument("--out", help="append the table to this markdown file")
  a = ap.parse_args()
  modes = a.modes.split(",")
  t0, rows = time.time(), []
  for name, setup in PROGRAMS:
    if a.only not in name: continue
    cases = {m: Case(name, setup, m) for m in modes}
    ok = {m: bool(np.allclose(c.value, cases[modes[0]].value, rtol=2e-3, atol=1e-4)) for m, c in cases.items()}
    for r in range(a.rounds):
      for m in modes[r % len(modes):] + modes[:r % len(modes)]: cases[m].sample(a.min_ms / 1e3)
    med = {m: statistics.median(c.samples) for m, c in cases.items()}
    rows.append((name, cases, med, ok))
    print(f"{name:50s} " + "  ".join(f"{m} {c.kernels}k {c.hints}h {med[m] * 1e3:8.3f} ms{'' if ok[m] else ' VALUES DIFFER'}"
                                      for m, c in cases.items()), flush=True)
  bridge.uninstall()
  load = os.getloadavg()
  head = "| program | " + " | ".join(f"{m} kernels" for m in modes) + " | hints | choosing them s | " + " | ".join(f"{m} ms" for m in modes) + \
         " | " + " | ".join(f"stock / {m}" for m in modes if m != "stock") + " |"
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  ratios, same = {m: [] for m in modes if m != "stock"}, {m: [] for m in modes if m != "stock"}
  for name, cases, med, ok in rows:
    for m in ratios:
      ratios[m].append(med["stock"] / med[m])
      same[m].append(1.0 if cases[m].code == cases["stock"].code else med["stock"] / med[m])
    lines.append(f"| {name} | " + " | ".join(f"{cases[m].kernels}" for m in modes) + " | " +
                 "/".join(str(cases[m].hints) for m in modes if m != "stock") + " | " +
                 "/".join(f"{cases[m].hint_s:.2f}" for m in modes if m != "stock") + " | " +
                 " | ".join(f"{med[m] * 1e3:.3f}" + ("" if ok[m] else " (values differ)") for m in modes) + " | " +
                 " | ".join(f"{med['stock'] / med[m]:.2f}x" + (" =" if cases[m].code == cases["stock"].code else "") for m in ratios) + " |")
  gm = lambda v: math.exp(sum(map(math.log, v)) / len(v))
  geo = {m: f"**{gm(v):.2f}x** ({gm(same[m]):.2f}x with `=` as 1.00)" for m, v in ratios.items() if v}
  lines.append("| **geomean** |" + " |" * (2 * len(modes) + 2) + " " + " | ".join(geo.values()) + " |")
  txt = "\n".join(lines) + "\n\n`=`: the mode's captured kernels are stock's, source for source (its ratio is noise).\n" \
        + f"{len(rows)} programs, {a.rounds} rounds, samples >= {a.min_ms:g} ms, " \
        f"{time.time() - t0:.0f} s, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}\n"
  print(txt)
  if a.out:
    with open(a.out, "a") as f: f.write("\n" + txt)

if __name__ == "__main__": main()
