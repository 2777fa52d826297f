"""The fusion benchmark (issue 14): every program of bench/fusion_programs.py under callify's fusion="rules" and
fusion="cost", in one process, modes interleaved in each round. Steady-state realize time: each program is callified
once per mode (compile and callify excluded: the first run_call compiles), then each sample is run_call repeated to
last at least --min-ms, and the table shows medians over rounds: time, kernels, bytes moved (KernelWork: read + written
per kernel), peak memory (lower/schedule/work.peak_bytes: the temporaries' arena peak plus every buffer the CALL writes) and the
time model's prediction (egraph/fusion/timemodel.py). Values are checked against numpy first. The machine is shared and noisy
(bursts of other jobs, and
other tenants' memory traffic, last seconds and only ever add time): each round takes --pairs adjacent (rules, cost)
sample pairs per program, the order alternating, --pairs x --more more for a program whose modes lower to different
kernels. The rules / cost column is the median of the paired ratios (both samples of a pair see the same load), the
"fastest" column the ratio of the two modes' fastest samples (each a >= --min-ms average; under load it is noisier than
the paired median: a quiet window is rare and lands in one mode). A program whose two CALLs lower to the same kernels
(names and KernelWork) is marked `=` and counted as 1.00 in the geomean and the worst list: its ratio is 1 by
construction; its measured spread, the noise floor, is reported beside. On a shared machine a kernel split across
threads waits for a worker another job has descheduled, once per kernel: `CALLSAT_THREADS=1 python bench/fusion.py ...`
runs every kernel on one thread (the time model then splits none either: egraph/fusion/timemodel.py), which compares the
partitions with that noise gone. Every kernel is also timed alone (lower/schedule/work.step_seconds) against its predicted time: the
Spearman rank correlation, and a scatter plot with --plot.

  python bench/fusion.py --rounds 5 [--pairs 3] [--more 2] [--modes rules,cost] [--only substr] [--group NAME] [--out notes/benchmarks.md]
      [--plot notes/fusion_kernels.png]
  python bench/fusion.py --solver [--solver-floor 0.05] [--only substr]   # the partition solver alone: method, time, gaps

--solver callifies every corpus program and the ~10k-UOp graphs of bench/callify_vs_tinygrad.py in cost mode and
prints each partition report (no realize); --solver-floor sets candidates.SOLVER_FLOOR_S (a large one: the solve unlimited).

Until callify takes fusion= (issue 14 part 2), only rules mode runs, and cost is reported unavailable."""
from __future__ import annotations
import argparse, inspect, math, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from egraph import Tensor, callify
from egraph.fusion import candidates
from egraph.ir.ops import substitute
from egraph.fusion.timemodel import TimeModel
from lower.device import native
from lower.runtime import read, run_call
from lower.schedule.work import peak_bytes, program_of, program_work, step_seconds
from fusion_programs import PROGRAMS
from callify_vs_tinygrad import PROGRAMS as GRAPHS

def has_fusion() -> bool: return "fusion" in inspect.signature(callify).parameters

def spearman(x, y) -> float:
  """Spearman's rank correlation (average ranks for ties)."""
  def ranks(v):
    v = np.asarray(v, float); order = np.argsort(v, kind="stable"); r = np.empty(len(v))
    r[order] = np.arange(len(v))
    for val in np.unique(v): r[v == val] = r[v == val].mean()
    return r
  rx, ry = ranks(x), ranks(y)
  return float(np.corrcoef(rx, ry)[0, 1]) if len(rx) > 1 else float("nan")

class Case:
  """One program under one mode: its CALL, the roots' storage views, static numbers and the samples."""
  def __init__(self, prog, roots, ref, mode: str, model: TimeModel):
    nodes = [r.node for r in roots]
    self.res = callify(*nodes, fusion=mode) if has_fusion() else callify(*nodes)
    self.views, self.prog, self.ref, self.mode = substitute(nodes, self.res.buffer_map), prog, ref, mode
    run_call(self.res.call)   # compile
    self.works = program_work(self.res.call)
    self.names = [s.kernel.name if s.kernel is not None else "copy" for s in program_of(self.res.call).steps]
    self.kernels = len(self.works)
    self.moved = sum(w.nbytes for w in self.works)
    self.peak = peak_bytes(self.res.call)
    self.predicted = model.program_seconds(self.works)
    self.kpred = [model.kernel_seconds(w) for w in self.works]
    self.samples: list[float] = []
    self.reps = 1

  def check(self) -> None:
    for v, want in zip(self.views, self.ref()):
      np.testing.assert_allclose(read(v).reshape(np.shape(want)), want, rtol=self.prog.rtol, atol=self.prog.rtol,
                                 err_msg=f"{self.prog.name} ({self.mode})")

  def calibrate_reps(self, min_s: float) -> None:
    t0 = time.perf_counter(); run_call(self.res.call); t = time.perf_counter() - t0
    self.reps = max(1, math.ceil(min_s / max(t, 1e-6)))

  def sample(self) -> None:
    call = self.res.call
    run_call(call)
    t0 = time.perf_counter()
    for _ in range(self.reps): run_call(call)
    self.samples.append((time.perf_counter() - t0) / self.reps)

def _same(a: Case, b: Case) -> bool:
  """Do both modes' CALLs lower to the same kernels (names and work)?"""
  return a.names == b.names and a.works == b.works

def plot(points, path: str, rho: float) -> None:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    raise SystemExit("--plot needs matplotlib: python -m pip install -e '.[plot]'") from None
  fig, ax = plt.subplots(figsize=(6.5, 6))
  kinds = sorted({k for _, _, k in points})
  for kind in kinds:
    xs = [p * 1e6 for p, m, k in points if k == kind]; ys = [m * 1e6 for p, m, k in points if k == kind]
    ax.scatter(xs, ys, s=14, label=kind, alpha=0.75)
  lo = min(min(p, m) for p, m, _ in points) * 1e6 / 1.5; hi = max(max(p, m) for p, m, _ in points) * 1e6 * 1.5
  ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="predicted = measured")
  ax.set_xscale("log"); ax.set_yscale("log"); ax.set_xlim(lo, hi); ax.set_ylim(lo, hi)
  ax.set_xlabel("predicted kernel time, us (egraph/fusion/timemodel.py)"); ax.set_ylabel("measured kernel time, us (alone, warm)")
  ax.set_title(f"fusion benchmark kernels: Spearman rho = {rho:.3f} ({len(points)} kernels)")
  ax.legend(); fig.tight_layout(); fig.savefig(path, dpi=110)
  print(f"wrote {path}")

GRAPH_SIZES = {"chain": 4800, "dag": 8448, "transformer": 99}   # ~10k tinygrad UOps each (bench/callify_vs_tinygrad.py)

def solver_table(progs, floor: float) -> None:
  """The partition solver on each program and 10k-UOp graph: method, candidates, solver time and budget, gaps."""
  candidates.SOLVER_FLOOR_S = floor
  callify(Tensor(np.ones((4, 4), np.float32)).realize().exp().sum(), fusion="cost", cache=False)   # scipy's import, once
  print("| program | method | candidates | stored | solver ms | budget ms | callify ms | mip gap | model gap | gap |\n|" + "---|" * 10)
  rng = np.random.default_rng(0)
  items = [(p.name, lambda p=p: [r.node for r in p.build(rng)[0]]) for p in progs] + \
          [(f"{k} ({n})", lambda k=k, n=n: [t.node for t in GRAPHS[k](Tensor, n)]) for k, n in GRAPH_SIZES.items()]
  for name, build in items:
    t0 = time.perf_counter(); res = callify(*build(), fusion="cost", cache=False); total = time.perf_counter() - t0
    r = res.report.partition
    if r is None: print(f"| {name} | - ({res.report.fusion_note or res.report.fallback}) |" + " |" * 8); continue
    pct = lambda x: "-" if x is None else f"{x:.1%}"
    print(f"| {name} | {r.method} | {r.candidates} | {r.stored} | {r.seconds * 1e3:.1f} | "
          f"{'-' if r.budget_s is None else f'{r.budget_s * 1e3:.0f}'} | {total * 1e3:.0f} | {pct(r.mip_gap)} | {pct(r.model_gap)} | "
          f"{pct(r.gap)} |" + (f" {r.note}" if r.note else ""))

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--modes", default="rules,cost")
  ap.add_argument("--pairs", type=int, default=3, help="adjacent sample pairs (modes alternating) per program per round")
  ap.add_argument("--more", type=int, default=2, help="programs whose modes lower to different kernels: this many times --pairs more pairs")
  ap.add_argument("--min-ms", type=float, default=30.0, help="each sample is run_call repeated to last at least this")
  ap.add_argument("--only", default=None, help="programs whose name contains this")
  ap.add_argument("--group", default=None, help="programs of this group (bench/fusion_programs.py: models, softmax, ...)")
  ap.add_argument("--out", default=None, help="append the table to this markdown file")
  ap.add_argument("--no-kernels", action="store_true", help="skip timing every kernel alone (no rank correlation)")
  ap.add_argument("--plot", default=None, help="write the predicted-vs-measured kernel scatter plot (PNG) here")
  ap.add_argument("--solver", action="store_true", help="only the partition solver's report per program (no realize)")
  ap.add_argument("--solver-floor", type=float, default=candidates.SOLVER_FLOOR_S, help="--solver: the solver's minimum time (s)")
  args = ap.parse_args()
  chosen = lambda p: (args.only is None or args.only in p.name) and (args.group is None or p.group == args.group)
  if args.solver: return solver_table([p for p in PROGRAMS if chosen(p)], args.solver_floor)
  modes = [m for m in args.modes.split(",") if m]
  notes = []
  if "cost" in modes and not has_fusion():
    notes.append("cost mode unavailable: egraph.callify has no fusion= parameter yet (issue 14 part 2); rules mode only, no cost numbers")
    print(notes[-1], file=sys.stderr)
    modes = [m for m in modes if m != "cost"]
  if not modes: raise SystemExit("no mode to run")
  model = TimeModel.load("CPU")
  progs = [p for p in PROGRAMS if chosen(p)]
  cases: dict = {}
  rng = np.random.default_rng(0)
  for p in progs:
    roots, ref = p.build(rng)
    for m in modes:
      c = cases[(p.name, m)] = Case(p, roots, ref, m, model)
      c.check()
      c.calibrate_reps(args.min_ms / 1e3)
  both = "rules" in modes and "cost" in modes
  same = {p.name: both and _same(cases[(p.name, "rules")], cases[(p.name, "cost")]) for p in progs}
  load0, cpu0 = os.getloadavg()[0], time.process_time()
  for r in range(args.rounds):
    for p in progs:
      order = modes if r % 2 == 0 else modes[::-1]
      # adjacent pairs, the order alternating: both samples of a pair see the same load
      for _ in range(args.pairs * (1 if same[p.name] else 1 + args.more)):
        for m in order: cases[(p.name, m)].sample()
        order = order[::-1]
  points = []
  for p in ([] if args.no_kernels else progs):   # every kernel alone, predicted vs measured
    for m in modes:
      c = cases[(p.name, m)]
      ks = step_seconds(c.res.call, samples=5)
      c.kmeasured = ks
      points += [(pr, me, w.kind) for pr, me, w in zip(c.kpred, ks, c.works)]
  rho = spearman([a for a, _, _ in points], [b for _, b, _ in points]) if points else float("nan")
  med = {k: statistics.median(c.samples) for k, c in cases.items()}
  prho = {m: spearman([cases[(p.name, m)].predicted for p in progs], [med[(p.name, m)] for p in progs]) for m in modes}
  head = "| program | group | " + " | ".join(f"{m} ms" for m in modes) + (" | rules / cost (paired median) | fastest" if both else "") + \
         " | kernels | MB moved | peak MB | predicted ms |"
  rows = [head, "|" + "---|" * (head.count("|") - 1)]
  sl = lambda f: " / ".join(f(cases[(p.name, m)]) for m in modes)
  speed = []
  for p in progs:
    ms = [med[(p.name, m)] * 1e3 for m in modes]
    sp = ""
    if both:
      rc = [a / b for a, b in zip(cases[(p.name, "rules")].samples, cases[(p.name, "cost")].samples)]
      pm = statistics.median(rc); mn = min(cases[(p.name, "rules")].samples) / min(cases[(p.name, "cost")].samples)
      speed.append((1.0 if same[p.name] else pm, p.name, same[p.name], mn, pm))
      sp = f" | = (1.00; {pm:.2f}x) | {mn:.2f}x" if same[p.name] else f" | {pm:.2f}x | {mn:.2f}x"
    rows.append(f"| {p.name} | {p.group} | " + " | ".join(f"{x:.2f}" for x in ms) + sp +
                f" | {sl(lambda c: str(c.kernels))} | {sl(lambda c: f'{c.moved / 1e6:.1f}')} | {sl(lambda c: f'{c.peak / 1e6:.1f}')}"
                f" | {sl(lambda c: f'{c.predicted * 1e3:.2f}')} |")
  summary = [f"kernel time rank correlation (Spearman, predicted vs measured, {len(points)} kernels timed alone): {rho:.3f}",
             "program time rank correlation (predicted vs measured median): " + ", ".join(f"{m} {r:.3f}" for m, r in prho.items())]
  if both:
    geo = lambda xs: math.exp(statistics.mean(math.log(x) for x in xs))
    diff = [x for x in speed if not x[2]]; w = sorted(diff)
    eq = [x for x in speed if x[2]]
    summary += [f"geomean speedup rules / cost (median paired ratio, = programs at 1.00): {geo([x[0] for x in speed]):.3f}x; "
                f"over the {len(diff)} programs whose kernels differ: {geo([x[0] for x in diff]) if diff else float('nan'):.3f}x; worst 5: " +
                ", ".join(f"{x[1]} {x[0]:.3f}x" for x in w[:5]),
                f"the same by the fastest samples (= programs at 1.00): {geo([1.0 if x[2] else x[3] for x in speed]):.3f}x; worst 5: " +
                ", ".join(f"{x[1]} {x[3]:.3f}x" for x in sorted(diff, key=lambda x: x[3])[:5]),
                f"programs whose CALLs lower to the same kernels (marked =, 1.00 by construction): {len(eq)}" +
                (f"; their measured ratios, the noise floor: median paired {min(x[4] for x in eq):.3f}x .. {max(x[4] for x in eq):.3f}x, "
                 f"fastest samples {min(x[3] for x in eq):.3f}x .. {max(x[3] for x in eq):.3f}x" if eq else "")]
  cmd = "python bench/fusion.py " + " ".join(sys.argv[1:])
  text = "\n".join([f"`{cmd}` — {len(progs)} programs, modes {', '.join(modes)} interleaved, medians of {args.rounds} rounds x {args.pairs} "
                    f"adjacent pairs ({args.pairs * (1 + args.more)} where the kernels differ), "
                    f"each sample run_call repeated to >= {args.min_ms:g} ms; values checked against numpy; llvm threads={native.THREADS}"
                    f"{' (CALLSAT_THREADS=1: no kernel split, in the model too)' if native.THREADS == 1 else ''}; "
                    f"load {load0:.2f} -> {os.getloadavg()[0]:.2f}, {time.process_time() - cpu0:.0f} s CPU while sampling. Slashed columns: "
                    + " / ".join(modes) + ".", "", *rows, "",
                    *[f"- {s}" for s in notes + summary]])
  print(text)
  if args.plot: plot(points, args.plot, rho)
  if args.out:
    with open(args.out, "a") as f: f.write(f"\n## Fusion benchmark: rules vs cost ({time.strftime('%Y-%m-%d %H:%M')})\n\n{text}\n")

if __name__ == "__main__": main()
