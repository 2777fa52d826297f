"""The bridge's latency: callsat's `transform_to_call` (egraph.tinygrad, conversion both ways included) vs tinygrad 0.14's
own pass, on the same tinygrad graphs, in the same run, from 4-UOp graphs to 50k.

  python bench/tinygrad_latency.py [--procs 3] [--programs tiny synth-1k synth-10k synth-50k gpt2 resnet18] [--repeats N]
                                   [--out notes/benchmarks.md]

Each program is a real tinygrad program's step: the graph measured is the sink its own `realize` (or `.item()`,
`opt.step()`) hands the pass, caught at tinygrad.tensor.transform_to_call before any pass has seen it. The tiny programs
(4 to 300 UOps): copy-in (realize of a new `Tensor([1., 2, 3])`), item (`(a + 3).sum().item()`), contig-sum
(`(b * 2).contiguous().sum(1)`), sgd-assign (`w.assign(w * 0.99 - 0.01 * g)`), kv-write (a decode step's KV-cache
write into one position, as examples/gpt2.py without JIT), slice-view (`w[2:6].contiguous()` and a slice of a computed
value), sgd-momentum (nn.optim.SGD's step, one parameter), layernorm (nn.LayerNorm forward), adam (nn.optim.Adam's step, two parameters),
attention (a causal attention
block with residual), mlp-train (a 2-layer MLP's forward, cross-entropy loss, backward and Adam step); the big ones:
synth-N (a DAG of elementwise ops, reductions, contiguous points and assigns over realized buffers), GPT-2 small's
forward and ResNet-18's eval forward. Programs with state (weights, optimizer moments, an assigned w) are set up once,
one step run through tinygrad's own pass where the steady state needs it, and their state Tensors are put back to that
realized state before each new step's graph is built; every step gets new input buffers (new data, new gradients).

Each (side, program, process) is a fresh process on DEV=NULL (nothing computes): imports, setup, one warm-up call of the
side's pass on a tiny unrelated graph (pattern compilation and other one-time setup is not the pass), then two
measurements, each call timed alone with the GC off as `Tensor.realize` runs it:
  first     the first call of the pass on a graph of this structure in the process (the graph built after the warm-up);
  repeated  the next --repeats steps' graphs (same structure, new buffers), built one by one and each call timed alone:
            the median of those calls (default by size, 50 for tiny graphs down to 3 for the 10k+ ones).
Medians over --procs processes; the two sides alternate so load drift hits both. The bridged phases (in, callify, out,
and key / rebind where the bridge has a structural cache) come from timing wrappers around the names
`egraph.tinygrad.transform_to_call` calls, so the timed function is the bridge's own; a phase the call skipped counts 0."""
from __future__ import annotations
import argparse, datetime, gc, json, os, statistics, subprocess, sys, time
from typing import TYPE_CHECKING
if TYPE_CHECKING: from tinygrad.uop.ops import UOp   # tinygrad is optional: imported where it runs
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
  """GPT-2 small's forward (pre-LN blocks, causal attention, tied shapes but a separate head) on 1 x seq tokens
  (a new token buffer each step)."""
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
  def new_input(): return Tensor.empty(1, seq, dtype=dtypes.int32)
  def forward(tok):
    x = wte(tok) + wpe(Tensor.arange(seq).reshape(1, seq))
    for b in blocks: x = b(x)
    return [head(ln_f(x))]
  return model, new_input, forward

def resnet18(classes: int = 1000, hw: int = 224):
  """ResNet-18's forward in eval mode (Conv2d, BatchNorm with running stats, basic residual blocks) on 1x3xhwxhw
  (a new image buffer each step)."""
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
  def new_input(): return Tensor.empty(1, 3, hw, hw)
  def forward(img):
    x = b1(c1(img)).relu().max_pool2d(kernel_size=3, stride=2, padding=1)
    for b in blocks: x = b(x)
    return [fc(x.mean((2, 3)))]
  return [c1, b1, blocks, fc], new_input, forward

# ---- the tiny programs: each a step of a real program; setup once, then `step()` gives the next step's trigger --------

def _state(*ts):
  """Put these Tensors back to their realized state (taken now) before each step: the steady state of a training loop,
  where realize leaves each one its buffer, without running the step's schedule."""
  saved = [(t, t.uop) for t in ts]
  def restore():
    for t, u in saved: t.uop = u
  return restore

def _params(*objs):
  from tinygrad import Tensor
  from tinygrad.nn.state import get_parameters
  ps = get_parameters(list(objs))
  Tensor.realize(*ps)
  return ps

def copy_in():
  """A new input tensor from Python data: what realizing it hands the pass (a COPY of a new host buffer)."""
  from tinygrad import Tensor
  return lambda: (lambda: Tensor([1., 2, 3]).realize())

def item():
  """`.item()` of a reduction over a realized buffer (`data()` realizes `x.contiguous()`)."""
  from tinygrad import Tensor
  def step():
    a = Tensor.empty(4, 4)
    return lambda: (a + 3).sum().item()
  return step

def contig_sum():
  from tinygrad import Tensor
  def step():
    b = Tensor.empty(4, 4)
    return lambda: (b * 2).contiguous().sum(1).realize()
  return step

def sgd_assign():
  """A hand-written SGD update of a realized w by a new realized gradient."""
  from tinygrad import Tensor
  w = Tensor.empty(16, 16).realize()
  restore = _state(w)
  def step():
    restore(); g = Tensor.empty(16, 16)
    return lambda: w.assign(w * 0.99 - 0.01 * g).realize()
  return step

def kv_write():
  """A decode step's cache write, as examples/gpt2.py's attention does it without JIT: new keys and values stacked into
  one position of a realized KV cache (`cache[:, :, p:p+1].assign(...)`): callsat decides where the assign writes."""
  from tinygrad import Tensor
  cache = Tensor.zeros(2, 1, 16, 4, 8).contiguous().realize()
  restore = _state(cache)
  def step():
    restore(); xk, xv = Tensor.empty(1, 1, 4, 8), Tensor.empty(1, 1, 4, 8)
    return lambda: cache[:, :, 5:6, :, :].assign(Tensor.stack(xk, xv)).realize()
  return step

def slice_view():
  """Rows of a realized matrix read as a new tensor (`w[2:6].contiguous()`): a zero-copy view or a copy, callsat's
  choice."""
  from tinygrad import Tensor
  w = Tensor.empty(16, 32).realize()
  def step():
    b = Tensor.empty(16, 32)
    return lambda: Tensor.realize(w[2:6].contiguous(), (b[4:8] * 2).contiguous())
  return step

def _optimizer(opt_cls, shapes, **kw):
  """nn.optim's step on parameters with new realized gradients each step; one step run first (tinygrad's own pass) so
  the optimizer's state (lr, moments, beta powers) is realized, as from a training loop's second step on."""
  from tinygrad import Tensor, Context
  from tinygrad.nn.state import get_parameters
  ps = [Tensor.empty(*s).realize() for s in shapes]
  with Context(TRAINING=1):
    opt = opt_cls(ps, **kw)
    for p in ps: p.grad = Tensor.empty(*p.shape)
    opt.step()
  restore = _state(*get_parameters(opt))
  def run():
    with Context(TRAINING=1): opt.step()
  def step():
    restore()
    for p in ps: p.grad = Tensor.empty(*p.shape)
    return run
  return step

def sgd_momentum():
  from tinygrad import nn
  return _optimizer(nn.optim.SGD, [(16, 16)], lr=0.01, momentum=0.9)

def adam():
  from tinygrad import nn
  return _optimizer(nn.optim.Adam, [(16, 16), (16,)], lr=0.01)

def layernorm():
  from tinygrad import Tensor, nn
  ln = nn.LayerNorm(32); _params(ln)
  def step():
    x = Tensor.empty(8, 32)
    return lambda: ln(x).realize()
  return step

def attention(d: int = 32, heads: int = 4, seq: int = 8):
  """A causal self-attention block with residual (qkv and output projections, scaled_dot_product_attention)."""
  from tinygrad import Tensor, nn
  qkv, proj = nn.Linear(d, 3 * d), nn.Linear(d, d); _params(qkv, proj)
  def block(x):
    q, k, v = [t.reshape(1, seq, heads, d // heads).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1)]
    return x + proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(1, seq, d))
  def step():
    x = Tensor.empty(1, seq, d)
    return lambda: block(x).realize()
  return step

def mlp_train(d_in: int = 32, hidden: int = 64, classes: int = 10, batch: int = 8):
  """One training step of a 2-layer MLP: forward, sparse cross-entropy, backward, nn.optim.Adam's step (one graph)."""
  from tinygrad import Tensor, nn, dtypes, Context
  from tinygrad.nn.state import get_parameters
  l1, l2 = nn.Linear(d_in, hidden), nn.Linear(hidden, classes)
  ps = _params(l1, l2)
  with Context(TRAINING=1): opt = nn.optim.Adam(ps, lr=0.01)
  def run(x, y):
    with Context(TRAINING=1):
      opt.zero_grad()
      l2(l1(x).relu()).sparse_categorical_crossentropy(y).backward()
      opt.step()
  def batch_():
    return Tensor.empty(batch, d_in), Tensor.empty(batch, dtype=dtypes.int32)
  run(*batch_())   # the first step, tinygrad's own pass: Adam's state realized
  restore = _state(*get_parameters(opt))
  def step():
    restore(); x, y = batch_()
    return lambda: run(x, y)
  return step

TINY = {"copy-in": copy_in, "item": item, "contig-sum": contig_sum, "sgd-assign": sgd_assign, "kv-write": kv_write,
        "slice-view": slice_view, "sgd-momentum": sgd_momentum,
        "layernorm": layernorm, "adam": adam, "attention": attention, "mlp-train": mlp_train}
SYNTH_STEPS = {"synth-1k": 300, "synth-10k": 3060, "synth-50k": 15300}   # ~1k, 10k, 50k UOps; the exact count is reported
PROGRAMS = [*TINY, *SYNTH_STEPS, "gpt2", "resnet18"]
GROUPS = {"tiny": list(TINY), "big": [*SYNTH_STEPS, "gpt2", "resnet18"], "all": PROGRAMS}

def build(program: str):
  """Setup (weights realized on NULL, through tinygrad's own pass) and `step()`: builds the next step's inputs and
  returns the call that makes the program realize its graph (the graph itself is built inside that call)."""
  from tinygrad import Tensor
  if program in TINY: return TINY[program]()
  if program in SYNTH_STEPS:
    def step():
      outs = synth(SYNTH_STEPS[program])
      return lambda: Tensor.realize(*outs)
    return step
  from tinygrad.nn.state import get_parameters
  model, new_input, forward = {"gpt2": gpt2, "resnet18": resnet18}[program]()
  Tensor.realize(*get_parameters(model))
  def step():
    x = new_input()
    return lambda: Tensor.realize(*forward(x))
  return step

class _Caught(Exception): pass

def capture(trigger) -> UOp:
  """The sink `trigger()` hands tinygrad's transform_to_call, caught before any pass sees it (the call then stops there)."""
  import tinygrad.tensor as tt
  got, own = [], tt.transform_to_call
  def catch(big_sink):
    got.append(big_sink); raise _Caught
  tt.transform_to_call = catch
  try: trigger()
  except _Caught: pass
  finally: tt.transform_to_call = own
  if len(got) != 1: raise RuntimeError(f"the program's step reached the pass {len(got)} times, not once")
  return got[0]

def warm_graph():
  """Tiny and unrelated: the ops the programs use, on other shapes."""
  from tinygrad import Tensor
  a, b, acc = Tensor.empty(3, 5).realize(), Tensor.empty(3, 5).realize(), Tensor.zeros(5).contiguous().realize()
  x = ((a * b + 1).relu().maximum(a) - a.sum(axis=1, keepdim=True)).contiguous()
  acc.assign(acc + x.sum(axis=0))
  return [x.permute(1, 0).pad(((1, 0), (0, 1))).exp(), acc]

def default_repeats(uops: int) -> int:
  return max(3, min(50, 20_000 // max(uops, 1)))

# ---- one measurement, in a fresh process ------------------------------------------------------------------------------

PHASES = {"to_callsat": "in", "callify": "callify", "to_tinygrad": "out", "structure": "key", "rebind": "rebind"}

def worker(side: str, program: str, repeats: int) -> dict:
  sys.setrecursionlimit(1_000_000)
  from tinygrad.uop.ops import UOp
  import egraph.tinygrad as br
  phases: dict = {}
  if side == "bridged":   # wrap whichever of these names the bridge has; a call that skips one leaves its phase absent
    def timed(name, f):
      def g(*a, **k):
        t0 = time.perf_counter()
        try: r = f(*a, **k)
        finally: phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        if name == "callify" and (rep := getattr(r, "report", None)) is not None:
          phases["callify_phases"] = dict(getattr(rep, "seconds", {}))
        return r
      return g
    for attr, name in PHASES.items():
      if callable(getattr(br, attr, None)): setattr(br, attr, timed(name, getattr(br, attr)))
  fn = br.transform_to_call if side == "bridged" else br.STOCK_TRANSFORM
  step = build(program)
  fn(UOp.sink(*[t.uop for t in warm_graph()]))
  cache0 = dict(br.cache_stats()) if side == "bridged" and callable(getattr(br, "cache_stats", None)) else None

  def one(sink):
    phases.clear()
    gc.collect(); gc.disable()
    t0, c0 = time.perf_counter(), time.process_time()
    try: call, bmap = fn(sink)
    finally: secs, cpu = time.perf_counter() - t0, time.process_time() - c0; gc.enable()
    ph = {k: v for k, v in phases.items() if k != "callify_phases"}
    if side == "bridged": ph["rest"] = secs - sum(ph.values())
    return {"seconds": secs, "cpu": cpu, "mapped": len(bmap), "call_uops": len(call.toposort()), "phases": ph,
            "callify_phases": phases.get("callify_phases", {})}

  err = lambda e: f"{type(e).__name__}: {getattr(e, 'reason', '')} {e}"[:300]
  sink = capture(step())   # built after the warm-up: nothing about this structure is cached anywhere yet
  uops = len(sink.toposort())
  try: first = one(sink)
  except Exception as e: return {"side": side, "program": program, "uops": uops, "error": "first call: " + err(e)}
  del sink
  out = {"side": side, "program": program, "uops": uops, **first, "repeated": [], "repeated_cpu": [], "repeated_phases": []}
  n = repeats or default_repeats(uops)
  sizes = set()
  for i in range(n):
    sink = capture(step())   # the next step: same structure, new buffers
    try: r = one(sink)
    except Exception as e: out["error"] = f"repeated call {i + 1}: " + err(e); break
    out["repeated"].append(r["seconds"]); out["repeated_cpu"].append(r["cpu"]); out["repeated_phases"].append(r["phases"])
    sizes.add((r["call_uops"], r["mapped"]))
    del sink, r
  out["repeated_shapes_differ"] = sorted(s for s in sizes if s != (first["call_uops"], first["mapped"]))
  if cache0 is not None:
    c = br.cache_stats()
    out["cache"] = {k: c.get(k, 0) - cache0.get(k, 0) for k in ("hits", "misses", "stored", "uncacheable")}
  return out

def run_one(side: str, program: str, repeats: int, timeout: int) -> dict:
  env = {**os.environ, "DEV": "NULL", "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
  try:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", side, program, str(repeats)], env=env,
                       capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired: return {"side": side, "program": program, "error": f"timed out after {timeout} s"}
  if p.returncode: return {"side": side, "program": program, "error": (p.stderr or p.stdout)[-300:]}
  return json.loads(p.stdout.strip().splitlines()[-1])

# ---- the table --------------------------------------------------------------------------------------------------------

def ms(s: float) -> str:
  v = s * 1e3
  return f"{v:.2f}" if v < 1 else f"{v:.1f}" if v < 100 else f"{v:.0f}"

PHASE_COLS = ("in", "callify", "out", "key", "rebind", "rest")

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--procs", type=int, default=3, help="fresh processes per side and program (median)")
  ap.add_argument("--programs", nargs="+", default=["all"], choices=[*GROUPS, *PROGRAMS],
                  help="programs, or groups: tiny, big, all (default)")
  ap.add_argument("--repeats", type=int, default=0,
                  help="repeated steps timed per process (0: by size, 50 for tiny graphs down to 3 from 6.7k UOps)")
  ap.add_argument("--timeout", type=int, default=900)
  ap.add_argument("--out", help="append the table to this markdown file")
  ap.add_argument("--worker", nargs=3, metavar=("SIDE", "PROGRAM", "REPEATS"), help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker: print(json.dumps(worker(args.worker[0], args.worker[1], int(args.worker[2])))); return
  programs = list(dict.fromkeys(p for name in args.programs for p in GROUPS.get(name, [name])))
  rows, errors = [], []
  for prog in programs:
    runs = {"stock": [], "bridged": []}
    for r in range(args.procs):
      for side in (("stock", "bridged") if r % 2 == 0 else ("bridged", "stock")):
        res = run_one(side, prog, args.repeats, args.timeout)
        if "error" in res: errors.append(res); print(f"{prog} {side}: {res['error']}", file=sys.stderr)
        if "seconds" not in res: continue
        if not res["repeated"]: res["repeated"], res["repeated_cpu"] = [res["seconds"]], [res["cpu"]]   # so a row still shows
        runs[side].append(res)
        print(f"{prog:12s} {side:8s} {res['uops']:6d} UOps  first {ms(res['seconds']):>8s} ms  repeated "
              f"{ms(statistics.median(res['repeated'])):>8s} ms (median of {len(res['repeated'])})"
              + (f"  cache {res['cache']}" if res.get("cache") else ""), file=sys.stderr)
    if not runs["stock"] or not runs["bridged"]: continue
    med = lambda side, f: statistics.median(f(x) for x in runs[side])
    first = {s: med(s, lambda x: x["seconds"]) for s in runs}
    rep = {s: med(s, lambda x: statistics.median(x["repeated"])) for s in runs}
    cpu_first = med("bridged", lambda x: x["cpu"]) / med("stock", lambda x: x["cpu"])
    cpu_rep = (med("bridged", lambda x: statistics.median(x["repeated_cpu"]))
               / med("stock", lambda x: statistics.median(x["repeated_cpu"])))
    ph = {k: med("bridged", lambda x: x["phases"].get(k, 0.0)) for k in PHASE_COLS}
    ph_rep = {k: med("bridged", lambda x: statistics.median(p.get(k, 0.0) for p in x["repeated_phases"] or [{}]))
              for k in PHASE_COLS}
    cp_keys = dict.fromkeys(k for x in runs["bridged"] for k in x.get("callify_phases", {}))
    cp = {k: med("bridged", lambda x: x.get("callify_phases", {}).get(k, 0.0)) for k in cp_keys}
    cache = [x["cache"] for x in runs["bridged"] if x.get("cache")]
    hits = (f"{sum(c['hits'] for c in cache)} / {sum(len(x['repeated_phases']) for x in runs['bridged']) + len(runs['bridged'])}"
            if cache else "-")
    differ = sorted({tuple(s) for x in runs["bridged"] for s in x.get("repeated_shapes_differ", [])})
    nrep = sorted({len(x["repeated"]) for s in runs for x in runs[s]})
    rows.append(dict(prog=prog, uops=runs["stock"][0]["uops"], first=first, rep=rep, cpu_first=cpu_first, cpu_rep=cpu_rep,
                     ph=ph, ph_rep=ph_rep, cp=cp, hits=hits, differ=differ, nrep=nrep,
                     runs={s: [ms(x["seconds"]) for x in runs[s]] for s in runs}))
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  cmd = " ".join(["python bench/tinygrad_latency.py", *sys.argv[1:]])
  nreps = sorted({n for row in rows for n in row["nrep"]})
  lines = [f"`{cmd}` ({stamp}, load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, DEV=NULL): medians of {args.procs} "
           "fresh processes per side. first: the first call of the pass on a graph of this structure in the process; "
           f"repeated: each process's median over the next {'/'.join(map(str, nreps)) or '-'} steps' graphs (same "
           "structure, new buffers), each call timed alone; GC off as in realize; ratio = bridged / stock (lower is "
           "better); CPU: the same ratios in process time, less moved by other load on the machine.", "",
           "| program | UOps | stock first ms | bridged first ms | first: bridged / stock | stock repeated ms | "
           "bridged repeated ms | repeated: bridged / stock | CPU: first; repeated | bridged first: in / callify / out / "
           "key / rebind / rest ms | bridged repeated: in / callify / out / key / rebind / rest ms | cache hits / calls | "
           "first-call runs stock; bridged (ms) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for w in rows:
    lines.append(f"| {w['prog']} | {w['uops']:,} | {ms(w['first']['stock'])} | {ms(w['first']['bridged'])} | "
                 f"{w['first']['bridged'] / w['first']['stock']:.2f}x | {ms(w['rep']['stock'])} | {ms(w['rep']['bridged'])} | "
                 f"{w['rep']['bridged'] / w['rep']['stock']:.2f}x | {w['cpu_first']:.2f}x; {w['cpu_rep']:.2f}x | "
                 f"{' / '.join(ms(w['ph'][k]) for k in PHASE_COLS)} | {' / '.join(ms(w['ph_rep'][k]) for k in PHASE_COLS)} | "
                 f"{w['hits']} | {', '.join(w['runs']['stock'])}; {', '.join(w['runs']['bridged'])} |")
  lines += ["", "in: tinygrad -> callsat IR, out: back to tinygrad UOps, key / rebind: the structural cache's key and rebind "
            "(0 where the bridge has none or skipped it), rest: the rest of the timed call (mostly freeing the conversion's "
            "Nodes as it returns); each part is a median of its own. cache hits / calls: the bridged processes' structural "
            "cache hits over their first and repeated calls. callify's own phases on the first call (ms, medians): "
            + "; ".join(f"{w['prog']}: " + (", ".join(f"{k} {v * 1e3:.1f}" for k, v in w["cp"].items() if v >= 5e-5) or "-")
                        for w in rows) + "."]
  if any(w["differ"] for w in rows):
    lines += ["", "Repeated calls whose CALL differs in size from the first call's (call UOps, buffer_map entries): "
              + "; ".join(f"{w['prog']}: {w['differ']}" for w in rows if w["differ"]) + "."]
  if errors: lines += ["", "Errors: " + "; ".join(f"{e['program']} {e['side']}: {e['error']}" for e in errors)]
  print("\n".join(lines))
  if args.out:
    with open(args.out, "a") as f: f.write("\n" + "\n".join(lines) + "\n")

if __name__ == "__main__":
  main()
