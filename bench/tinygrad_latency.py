"""The bridge's latency: callsat's `transform_to_call` (egraph.tinygrad, conversion both ways included) vs tinygrad 0.14's
own pass, on the same tinygrad graph, in the same run.

  python bench/tinygrad_latency.py [--procs 3] [--programs synth-1k synth-10k synth-50k gpt2 resnet18] [--out notes/benchmarks.md]

Each (side, program, repeat) is a fresh process on DEV=NULL (nothing computes): imports, weights realized, one warm-up
call of the side's pass on a tiny unrelated graph (pattern compilation and other one-time setup is not the pass), then
the program's graph is built fresh and the first call on it is timed with the GC off, as `Tensor.realize` runs it. The
big sink is what realize hands the pass: `UOp.sink(*[t.uop for t in to_realize])`. Medians over --procs processes; the
two sides alternate so load drift hits both. The bridged phases (in, callify, out) come from timing wrappers around the
names `egraph.tinygrad.transform_to_call` calls, so the timed function is the bridge's own."""
from __future__ import annotations
import argparse, datetime, gc, json, os, statistics, subprocess, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- the programs (tinygrad Tensor API; each returns the Tensors to realize) ---------------------------------------------

def synth(steps: int):
  """A DAG of three lanes over realized 64x64 buffers: elementwise ops, row reductions broadcast back, a contiguous
  realize point every 10 steps and an assign into one of four realized accumulators every 25."""
  from tinygrad import Tensor
  w = [Tensor.empty(64, 64).realize() for _ in range(8)]
  accs = [Tensor.zeros(64).contiguous().realize() for _ in range(4)]
  lanes = w[:3]
  for i in range(steps):
    a, b, c = lanes[i % 3], lanes[(i + 1) % 3], w[i % 8]
    k = i % 4
    x = a * c + b if k == 0 else (a - c).relu() if k == 1 else a.maximum(b) * 0.5 if k == 2 else a + b.sum(axis=1, keepdim=True) * (1 / 64)
    if i % 10 == 9: x = x.contiguous()
    if i % 25 == 24: acc = accs[(i // 25) % 4]; acc.assign(acc + x.sum(axis=0))
    lanes[i % 3] = x
  return lanes + accs

def gpt2(layers: int = 12, d: int = 768, heads: int = 12, seq: int = 64, vocab: int = 50257):
  """GPT-2 small's forward (pre-LN blocks, causal attention, tied shapes but a separate head) on 1 x seq tokens."""
  from tinygrad import Tensor, nn, dtypes
  class Block:
    def __init__(s):
      s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
      s.qkv, s.proj, s.fc, s.out = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def __call__(s, x):
      B, T, _ = x.shape
      q, k, v = [t.reshape(B, T, heads, d // heads).transpose(1, 2) for t in s.qkv(s.ln1(x)).chunk(3, dim=-1)]
      x = x + s.proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, d))
      return x + s.out(s.fc(s.ln2(x)).gelu())
  wte, wpe, blocks = nn.Embedding(vocab, d), nn.Embedding(1024, d), [Block() for _ in range(layers)]
  ln_f, head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
  model = [wte, wpe, blocks, ln_f, head]
  tok = Tensor.empty(1, seq, dtype=dtypes.int32)
  def forward():
    x = wte(tok) + wpe(Tensor.arange(seq).reshape(1, seq))
    for b in blocks: x = b(x)
    return [head(ln_f(x))]
  return model, [tok], forward

def resnet18(classes: int = 1000, hw: int = 224):
  """ResNet-18's forward in eval mode (Conv2d, BatchNorm with running stats, basic residual blocks) on 1x3xhwxhw."""
  from tinygrad import Tensor, nn
  class Basic:
    def __init__(s, cin, cout, stride):
      s.c1, s.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm(cout)
      s.c2, s.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm(cout)
      s.down = [nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm(cout)] if stride != 1 or cin != cout else []
    def __call__(s, x): return (s.b2(s.c2(s.b1(s.c1(x)).relu())) + x.sequential(s.down)).relu()
  c1, b1, fc = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm(64), nn.Linear(512, classes)
  blocks = [Basic(ci, co, st) for ci, co, st in
            [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]]
  img = Tensor.empty(1, 3, hw, hw)
  def forward():
    x = b1(c1(img)).relu().max_pool2d(kernel_size=3, stride=2, padding=1)
    for b in blocks: x = b(x)
    return [fc(x.mean((2, 3)))]
  return [c1, b1, blocks, fc], [img], forward

SYNTH_STEPS = {"synth-1k": 300, "synth-10k": 3060, "synth-50k": 15300}   # ~1k, 10k, 50k UOps; the exact count is reported
PROGRAMS = [*SYNTH_STEPS, "gpt2", "resnet18"]

def build(program: str):
  """Setup (weights realized on NULL) and a function that builds the program's graph fresh."""
  if program in SYNTH_STEPS: return lambda: synth(SYNTH_STEPS[program])
  from tinygrad import Tensor
  from tinygrad.nn.state import get_parameters
  model, inputs, forward = {"gpt2": gpt2, "resnet18": resnet18}[program]()
  Tensor.realize(*get_parameters(model), *inputs)
  return forward

def warm_graph():
  """Tiny and unrelated: the ops the programs use, on other shapes."""
  from tinygrad import Tensor
  a, b, acc = Tensor.empty(3, 5).realize(), Tensor.empty(3, 5).realize(), Tensor.zeros(5).contiguous().realize()
  x = ((a * b + 1).relu().maximum(a) - a.sum(axis=1, keepdim=True)).contiguous()
  acc.assign(acc + x.sum(axis=0))
  return [x.permute(1, 0).pad(((1, 0), (0, 1))).exp(), acc]

# ---- one measurement, in a fresh process ------------------------------------------------------------------------------

def worker(side: str, program: str) -> dict:
  sys.setrecursionlimit(1_000_000)
  from tinygrad.uop.ops import UOp
  import egraph.tinygrad as br
  phases = {}
  if side == "bridged":
    def timed(name, f):
      def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        if name == "callify": phases["callify_phases"] = dict(r.report.seconds)
        return r
      return g
    br.to_callsat, br.callify, br.to_tinygrad = timed("in", br.to_callsat), timed("callify", br.callify), timed("out", br.to_tinygrad)
  fn = br.transform_to_call if side == "bridged" else br.STOCK_TRANSFORM
  make = build(program)
  fn(UOp.sink(*[t.uop for t in warm_graph()]))
  phases.clear()
  sink = UOp.sink(*[t.uop for t in make()])   # built after the warm-up: nothing about it is cached anywhere yet
  gc.collect(); gc.disable()
  t0, c0 = time.perf_counter(), time.process_time()
  try: call, bmap = fn(sink)
  except Exception as e: return {"side": side, "program": program, "error": f"{type(e).__name__}: {getattr(e, 'reason', '')} {e}"[:300]}
  secs, cpu = time.perf_counter() - t0, time.process_time() - c0
  gc.enable()
  if side == "bridged": phases["rest"] = secs - sum(phases.get(k, 0.0) for k in ("in", "callify", "out"))
  return {"side": side, "program": program, "seconds": secs, "cpu": cpu, "uops": len(sink.toposort()), "mapped": len(bmap),
          "call_uops": len(call.toposort()), "phases": phases}

def run_one(side: str, program: str, timeout: int) -> dict:
  env = {**os.environ, "DEV": "NULL", "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
  p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", side, program], env=env, capture_output=True,
                     text=True, timeout=timeout)
  if p.returncode: return {"side": side, "program": program, "error": (p.stderr or p.stdout)[-300:]}
  return json.loads(p.stdout.strip().splitlines()[-1])

# ---- the table --------------------------------------------------------------------------------------------------------

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--procs", type=int, default=3, help="fresh processes per side and program (median)")
  ap.add_argument("--programs", nargs="+", default=PROGRAMS, choices=PROGRAMS)
  ap.add_argument("--timeout", type=int, default=900)
  ap.add_argument("--out", help="append the table to this markdown file")
  ap.add_argument("--worker", nargs=2, metavar=("SIDE", "PROGRAM"), help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker: print(json.dumps(worker(*args.worker))); return
  rows, errors = [], []
  for prog in args.programs:
    runs = {"stock": [], "bridged": []}
    for r in range(args.procs):
      for side in (("stock", "bridged") if r % 2 == 0 else ("bridged", "stock")):
        res = run_one(side, prog, args.timeout)
        if "error" in res: errors.append(res); print(f"{prog} {side}: {res['error']}", file=sys.stderr); continue
        runs[side].append(res)
        print(f"{prog:10s} {side:8s} {res['uops']:6d} UOps {res['seconds'] * 1e3:9.1f} ms", file=sys.stderr)
    if not runs["stock"] or not runs["bridged"]: continue
    med = lambda side, f: statistics.median(f(x) for x in runs[side])
    st, bt = med("stock", lambda x: x["seconds"]), med("bridged", lambda x: x["seconds"])
    cpu = med("bridged", lambda x: x["cpu"]) / med("stock", lambda x: x["cpu"])
    ph = {k: med("bridged", lambda x: x["phases"].get(k, 0.0)) for k in ("in", "callify", "out", "rest")}
    cp = {k: med("bridged", lambda x: x["phases"].get("callify_phases", {}).get(k, 0.0)) for k in runs["bridged"][0]["phases"].get("callify_phases", {})}
    rows.append((prog, runs["stock"][0]["uops"], st, bt, cpu, ph, cp, {s: [round(x["seconds"] * 1e3, 1) for x in runs[s]] for s in runs}))
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  cmd = " ".join(["python bench/tinygrad_latency.py", *sys.argv[1:]])
  lines = [f"`{cmd}` ({stamp}, load {os.getloadavg()[0]:.1f}, "
           f"{os.cpu_count()} CPUs, DEV=NULL): medians of {args.procs} fresh processes per side, first call on the graph, "
           "GC off as in realize; ratio = bridged / stock (lower is better); CPU time: the same medians of process "
           "time, less moved by other load on the machine.", "",
           "| program | UOps | stock ms | bridged ms | bridged / stock | same, CPU time | bridged: in / callify / out / rest ms | runs stock; bridged (ms) |",
           "|---|---|---|---|---|---|---|---|"]
  for prog, n, st, bt, cpu, ph, _, all_ in rows:
    lines.append(f"| {prog} | {n:,} | {st * 1e3:.1f} | {bt * 1e3:.1f} | {bt / st:.2f}x | {cpu:.2f}x | "
                 f"{ph['in'] * 1e3:.0f} / {ph['callify'] * 1e3:.0f} / {ph['out'] * 1e3:.0f} / {ph['rest'] * 1e3:.0f} | "
                 f"{', '.join(map(str, all_['stock']))}; {', '.join(map(str, all_['bridged']))} |")
  lines += ["", "in: tinygrad -> callsat IR, out: back to tinygrad UOps, rest: the rest of the timed call (mostly freeing the "
            "conversion's Nodes as it returns; each part is a median of its own). callify's own "
            "phases (ms, medians): " + "; ".join(f"{prog}: " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in cp.items() if v >= 5e-4)
                                          for prog, _, _, _, _, _, cp, _ in rows) + "."]
  if errors: lines += ["", "Errors: " + "; ".join(f"{e['program']} {e['side']}: {e['error']}" for e in errors)]
  print("\n".join(lines))
  if args.out:
    with open(args.out, "a") as f: f.write("\n" + "\n".join(lines) + "\n")

if __name__ == "__main__":
  main()
