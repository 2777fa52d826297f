"""Calibrate the time model on tinygrad's own kernels (issue 28): the bridge's cost mode prices the kernels tinygrad will
run, not callsat's. The programs are bench/calibrate.py's calibration set, built with tinygrad's Tensor; each is one
tinygrad kernel (checked), captured by TinyJit and timed as a replay (what a model's step pays per kernel: the launch
included), min over interleaved rounds. Its work (bytes, ops, kind) is what the bridge's shadow reads for the same
program: callsat's KernelWork of the same graph (lower/schedule/work.py). The fit is calibrate.fit's, without the
read-back (tinygrad writes no streaming stores) and with one thread unless tinygrad splits a kernel. A kernel's launch
is what one more kernel costs a step (`launch_costs`): in a TinyJit replay (launch_s) and in an eager realize through
the bridge (eager_launch_s: tinygrad schedules and lowers every kernel on every call there) and per node of a kernel
there (`eager_node_cost`, eager_node_s: lowering grows with the kernel's AST); the single-kernel replays
above also pay the replay's fixed cost, added to every prediction they are compared with.

Written to egraph/fusion/timemodel.json as device "tinygrad-<version>/<device>" (the bridge loads it for that tinygrad
version and device; a device without one gets no hints), with every kernel's measured and predicted time, the mean
|log(predicted / measured)| over all kernels and over the held-out 'mixed' ones (the bridge hints only where a predicted
gain exceeds the held-out error) and the Spearman rank correlation of predicted vs measured. --plot writes an SVG
scatter of the two.

  python bench/calibrate_tinygrad.py [--rounds 5] [--device CPU] [--out egraph/fusion/timemodel.json] [--plot notes/x.svg]"""
from __future__ import annotations
import argparse, json, math, os, platform, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
import calibrate as C
from egraph import callify
from egraph.fusion.timemodel import DATA, TimeModel, tinygrad_device_key
from lower.schedule.work import program_work

def tiny_calls(rng, device: str) -> dict:
  """name -> a TinyJit replay of that calibration program in tinygrad (captured, one kernel each)."""
  from tinygrad import Tensor as TT, TinyJit, GlobalCounters
  class T(TT):   # the programs' inputs on `device`
    def __new__(cls, data): return TT(data, device=device)
  progs = C.kernels(rng, T)
  out = {}
  for name, t in progs.items():
    # a fresh Tensor over the program's lazy graph per call (realizing one points every tensor of that graph at the
    # result; the UOp held here stays the program)
    jit = TinyJit(lambda u=t.uop: TT(u).realize())
    for _ in range(3): GlobalCounters.reset(); jit()
    if GlobalCounters.kernel_count != 1:
      raise SystemExit(f"calibration program {name!r} is {GlobalCounters.kernel_count} tinygrad kernels, expected 1")
    out[name] = jit
  return out

def launch_costs(device: str, rounds: int, k: int = 8) -> dict:
  """What one more kernel costs a step: k independent 64-element adds against one, as a TinyJit replay (`jit`: the
  replay's own fixed cost cancels; the single-kernel 'launch' program's time is that fixed cost plus one launch) and
  realized eagerly through the bridge (`eager`: tinygrad schedules, lowers and runs each kernel on every call outside a
  JIT; the bridge's plain rules CALL). Min over interleaved rounds of the mean over enough calls."""
  from tinygrad import Tensor as TT, TinyJit
  rng = np.random.default_rng(1)
  xs = [TT(rng.standard_normal(64).astype(np.float32), device=device).realize() for _ in range(2 * k)]
  def adds(n): return lambda: TT.realize(*[xs[i] + xs[k + i] for i in range(n)])
  calls = {f"jit {n}": TinyJit(adds(n)) for n in (1, k)} | {f"eager {n}": adds(n) for n in (1, k)}
  t = _bridged(calls, rounds, 0.02)
  return {m: (t[f"{m} {k}"] - t[f"{m} 1"]) / (k - 1) for m in ("jit", "eager")}

def eager_node_cost(device: str, rounds: int, steps: tuple = (16, 64)) -> float:
  """What one more node of a kernel costs an eager call through the bridge: calibrate.chain of `steps` links on 64
  elements (one kernel each), realized eagerly, less the graph's own build (timed alone: the user's Python pays it in
  any schedule), per node of callsat's graph of the same chain (what the shadow's KernelWork.nodes counts)."""
  from tinygrad import Tensor as TT
  from egraph import Tensor as CT
  from egraph.fusion.greedy import LOADS
  from egraph.ir.ops import toposort
  x = np.random.default_rng(2).standard_normal(64).astype(np.float32)
  tx = TT(x, device=device).realize()
  nodes = {k: sum(n.op not in LOADS for n in toposort([C.chain(CT(x), k).node])) for k in steps}
  calls = {}
  for k in steps: calls |= {f"build {k}": lambda k=k: C.chain(tx, k), f"eager {k}": lambda k=k: C.chain(tx, k).realize()}
  t = _bridged(calls, rounds, 0.05)
  lo, hi = steps
  return ((t[f"eager {hi}"] - t[f"build {hi}"]) - (t[f"eager {lo}"] - t[f"build {lo}"])) / (nodes[hi] - nodes[lo])

def _bridged(calls: dict, rounds: int, min_s: float) -> dict:
  """measure(calls) with the bridge installed giving its plain rules CALL (an eager call's baseline), each call warmed
  three times first."""
  import egraph.tinygrad as bridge
  saved = os.environ.pop("CALLSAT_BRIDGE_FUSION", None)
  try:
    with bridge.installed():
      for f in calls.values():
        for _ in range(3): f()
      return measure(calls, rounds, min_s)
  finally:
    if saved is not None: os.environ["CALLSAT_BRIDGE_FUSION"] = saved

def measure(calls: dict, rounds: int, min_s: float = 0.005) -> dict:
  """name -> min over rounds (interleaved) of the mean replay time over enough replays to last min_s."""
  ts = {k: [] for k in calls}
  for _ in range(rounds):
    for k, f in calls.items():
      t0 = time.perf_counter(); f(); one = time.perf_counter() - t0
      reps = max(1, int(min_s / max(one, 1e-7)))
      t0 = time.perf_counter()
      for _ in range(reps): f()
      ts[k].append((time.perf_counter() - t0) / reps)
  return {k: min(v) for k, v in ts.items()}

def svg(points: list[tuple[str, float, float]], path: str, title: str) -> None:
  """A log-log scatter of (name, measured s, predicted s), the diagonal drawn: no plotting library needed."""
  xs = [v for _, m, p in points for v in (m, p)]
  lo, hi = math.log10(min(xs)) - 0.2, math.log10(max(xs)) + 0.2
  W, P = 520, 60
  at = lambda v: P + (math.log10(v) - lo) / (hi - lo) * (W - 2 * P)
  el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{W}" font-family="sans-serif" font-size="10">',
        f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="12">{title}</text>',
        f'<line x1="{P}" y1="{W - P}" x2="{W - P}" y2="{P}" stroke="#999" stroke-dasharray="4"/>',
        f'<rect x="{P}" y="{P}" width="{W - 2 * P}" height="{W - 2 * P}" fill="none" stroke="#333"/>',
        f'<text x="{W / 2}" y="{W - 20}" text-anchor="middle">measured (log, {10 ** lo * 1e6:.3g} .. {10 ** hi * 1e6:.3g} us)</text>',
        f'<text x="15" y="{W / 2}" transform="rotate(-90 15 {W / 2})" text-anchor="middle">predicted (log)</text>']
  for name, m, p in points:
    x, y = at(m), W - at(p)
    el.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{"#c33" if name.startswith("mixed") else "#36c"}"/>')
    el.append(f'<text x="{x + 6:.1f}" y="{y + 3:.1f}">{name.replace("mixed: ", "")}</text>')
  with open(path, "w") as f: f.write("\n".join(el + ["</svg>"]))

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--device", default="CPU", help="tinygrad's device (only one with a calibration gets hints)")
  ap.add_argument("--out", default=DATA)
  ap.add_argument("--plot", help="write the predicted-vs-measured scatter here (SVG)")
  a = ap.parse_args()
  import tinygrad
  from importlib.metadata import version
  rng = np.random.default_rng(0)
  # the work of each program, as the shadow prices it: callsat's KernelWork of the same graph (one kernel each)
  works = {}
  for k, v in C.kernels(rng).items():
    ws = program_work(callify(v).call)
    if len(ws) != 1: raise SystemExit(f"calibration kernel {k!r} lowered to {len(ws)} callsat kernels, expected 1")
    works[k] = ws[0]
  calls = tiny_calls(np.random.default_rng(0), a.device)
  load = os.getloadavg()[0]
  t = measure(calls, a.rounds)
  launch = launch_costs(a.device, a.rounds)
  launch["eager_node"] = eager_node_cost(a.device, a.rounds)
  m = C.fit(works, t, t["ew"])   # tinygrad's CPU kernels run on one thread: no split speedup to fit
  key = tinygrad_device_key(version("tinygrad"), a.device)
  # a kernel costs a step its marginal launch; the 'launch' program's replay (the fit's launch_s) adds the replay's fixed
  # cost, which every program measured here pays once and a schedule pays once whatever its kernels
  fixed = max(0.0, t["launch"] - launch["jit"])
  # tinygrad's clang kernels recompute a broadcast value in every iteration (no hoisting: a conv recomputes the BatchNorm
  # and ReLU of its input per output channel and window, 12.8M ops by tinygrad's own count where hoisting predicts 5M)
  m = TimeModel.from_dict(key, m.to_dict() | {"parallel_work": 1 << 62, "par_speedup": 1.0, "launch_s": launch["jit"],
                                              "eager_launch_s": launch["eager"], "eager_node_s": launch["eager_node"],
                                              "hoists": False})
  pred = {k: m.kernel_seconds(works[k]) + fixed for k in t}
  err = statistics.mean(abs(math.log(pred[k] / t[k])) for k in t)
  held = [k for k in t if k.startswith("mixed")]
  err_held = statistics.mean(abs(math.log(pred[k] / t[k])) for k in held)
  from scipy.stats import spearmanr
  rho = float(spearmanr([t[k] for k in t], [pred[k] for k in t]).statistic)
  print(f"{'kernel':<28} {'kind':<12} {'bytes':>10} {'ops':>11} {'measured us':>12} {'model us':>10}")
  for k in t: print(f"{k:<28} {works[k].kind:<12} {works[k].nbytes:>10} {works[k].flops:>11} {t[k] * 1e6:>12.1f} {pred[k] * 1e6:>10.1f}")
  print(f"error: mean |log(pred/meas)| {err:.3f} (held-out 'mixed' kernels {err_held:.3f}), Spearman rank correlation {rho:.3f}")
  print(f"launch per kernel: {launch['jit'] * 1e6:.1f} us in a TinyJit replay (its fixed cost {fixed * 1e6:.1f} us), "
        f"{launch['eager'] * 1e6:.1f} us in an eager realize through the bridge, plus {launch['eager_node'] * 1e6:.1f} us per node")
  try:
    with open(a.out) as f: data = json.load(f)
  except FileNotFoundError: data = {"devices": {}}
  cal = {"command": f"python bench/calibrate_tinygrad.py --rounds {a.rounds} --device {a.device}",
         "date": time.strftime("%Y-%m-%d %H:%M"), "tinygrad": version("tinygrad"), "tinygrad_path": os.path.dirname(tinygrad.__file__),
         "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "load": round(load, 2), "launch": launch, "replay_fixed_s": fixed,
         "log_error": err, "log_error_held_out": err_held,
         "spearman": rho, "kernels": {k: {"seconds": t[k], "predicted": pred[k], "kind": works[k].kind, "bytes": works[k].nbytes,
                                          "flops": works[k].flops} for k in t}}
  data.setdefault("devices", {})[key] = m.to_dict() | {"log_error": err_held}   # the kernels the fit never saw: the honest error
  data.setdefault("tinygrad_calibrations", {})[key] = cal
  with open(a.out, "w") as f: json.dump(data, f, indent=1)
  if a.plot: svg([(k, t[k], pred[k]) for k in t], a.plot, f"{key}: predicted vs measured per kernel, rank corr {rho:.2f}")
  print(f"wrote {key} to {a.out}" + (f", plot {a.plot}" if a.plot else ""))

if __name__ == "__main__": main()
