"""tinygrad 0.14's own example models, stock vs callsat's bridge (strict, fallback, fallback with
CALLSAT_BRIDGE_FUSION=cost, cost-anchored: the same with CALLSAT_BRIDGE_EXPLORE=0 (predicted hints only), fallback with
CALLSAT_BRIDGE_BACKEND=callsat: callsat's own kernels, callsat-cost: both, the cost-mode stores priced on callsat's own
time model): values, first-call time, steady-state step time and the bridge's counts.

  python bench/models.py [--rounds 1] [--steps N] [--models gpt2-gen ...] [--modes stock strict ...] [--out FILE]
                         [--json FILE] [--disk-cache] [--timeout S] [--tinygrad DIR]

The models are imported from tinygrad's example code (--tinygrad, default ../shared/tinygrad-tests, put on sys.path),
never copied: examples/gpt2.py (Transformer, its forward_jit and KV cache), examples/beautiful_mnist.py (Model and its
TinyJit train_step), extra/models/resnet.py (ResNet18), extra/models/bert.py (Bert). Small dims, seeded random weights
and inputs (nothing is downloaded):

  gpt2-gen    generation as examples/gpt2.py runs it: TinyJit forward_jit, the token and start_pos bound Variables,
              temperature 0.8 (multinomial sampling: tinygrad's RNG inside the JIT); .tolist() of the sampled token
  gpt2-decode the same Transformer without JIT: each token a new Tensor, greedy, read back with .item()
  mnist       beautiful_mnist's train_step (TinyJit, Adam; its own randint draws BS of the uint8 noise images); loss.item()
  mnist-grad  the same Model's loss and gradients under TinyJit, a new batch each call, no optimizer: loss, and each
              gradient's absolute and squared sums (the step's values without Adam's amplification of rounding)
  resnet18    ResNet18 forward under TinyJit on 1x3x32x32 (a new input each step); output summary
  bert        Bert (the encoder with its embeddings) forward, no JIT, 2 x 32 tokens; output summary
  eager-mlp   an MLP trained with SGD without TinyJit: zero_grad, backward, step, loss.item() per step

Each (model, mode, round) is a fresh process (`--worker MODEL MODE`) printing one JSON line, on DEV=CPU (clang) with
tinygrad's disk cache off (CACHELEVEL=0: every process compiles its kernels, so the first call is scheduling + compile +
run in every mode) and the bridge's measured verdicts not kept (cost mode measures its hints anew in every process, and
mode callsat times each new structure's Program against tinygrad's kernels anew: its first call pays both compiles);
--disk-cache keeps both across the run's processes (the verdicts in a directory of the run's own). Per round and
model the modes run in a rotated order, so drift hits all modes. In a worker the bridge is installed before the model
is built (weight init realizes through it too), then:
  first call  call 0, timed: scheduling, compile, run (a JIT model's plain first run)
  warm call   call 1, timed, not in the steady numbers (TinyJit captures here; the bridge's measured decisions are
              made at a structure's second run, CALLSAT_BRIDGE_DECIDE_AT: for a loop, mostly here)
  steady      calls 2 .. steps+1, each timed; the worker reports their median. A JIT model replays its captured
              kernels; gpt2-decode is one token (new Tensor in, .item() out); eager-mlp one optimizer step + .item().
Values (tokens, losses, output summaries) of every call are compared with the stock process of the same round,
exactly: a float counts as equal only if it is the same float (callsat is to change no value); where they differ the
table gives the largest absolute difference, the largest relative one (to the larger value: an output summary's sum
can be near 0, which inflates it), the first call that differs, and whether every value is still within tinygrad's own
float tolerance (test_ops.py's helper_test_op: |a - b| <= 1e-6 + 1e-3 |b|; ints, tokens, must be identical). Strict
and fallback hand tinygrad the kernels it would run and must match exactly; the cost option moves kernel boundaries
(a value stored between kernels is not contracted into an FMA, a reduce split off gets other unrolls), so it is held to
the tolerance, as the cost issue states; so is callsat (its own kernels sum in their own order). first ratio = mode / stock (lower is better, the
target is <= 1.3); speed = stock steady / mode steady (higher is better, the target is >= 0.97), both from medians
over rounds; "speed, CPU time" is the same ratio in the process's CPU time per step (less moved by other load).

Time: each process mostly schedules and compiles its model (mnist's first train_step alone is 20-35 s on 2 cores), so
one round of 6 models x 4 modes takes about 6-9 minutes here; --models/--modes/--rounds trim it."""
from __future__ import annotations
import argparse, atexit, datetime, json, math, os, shutil, signal, statistics, subprocess, sys, tempfile, time, traceback
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINYGRAD_TESTS = os.path.join(os.path.dirname(ROOT), "shared", "tinygrad-tests")
MODES = ["stock", "strict", "fallback", "cost", "cost-anchored", "callsat", "callsat-cost"]

# ---- the models: build(steps, rng) -> call(i) -> the values of call i (a list of ints or floats) --------------------------
# Small dims: a process's time is mostly tinygrad scheduling and compiling the model's kernels, which sizes barely move.

GPT2 = dict(dim=64, n_heads=4, n_layers=2, norm_eps=1e-5, vocab_size=512, max_seq_len=128)
MNIST_BS, MNIST_N = 16, 256      # batch drawn by train_step's own Tensor.randint from MNIST_N random images
RESNET_HW = 32
BERT = dict(hidden_size=64, intermediate_size=256, max_position_embeddings=64, num_attention_heads=4, num_hidden_layers=2,
            type_vocab_size=2, vocab_size=512, attention_probs_dropout_prob=0.1, hidden_dropout_prob=0.1)
BERT_SHAPE = (2, 32)
MLP = (64, 128, 128, 10)         # eager-mlp layer widths; batch 64

def _load_random(model, rng) -> None:
  """Seeded numpy weights loaded with tinygrad's load_state_dict, as the examples load downloaded ones (each a copy
  realized through the pass: through the bridge when installed). The constructors' own random init is never realized:
  its RNG kernels would take most of a process's time to compile, in every mode alike."""
  import numpy as np
  from tinygrad import Tensor, dtypes
  from tinygrad.nn.state import get_state_dict, load_state_dict
  sd = {}
  for k, v in get_state_dict(model).items():
    if not dtypes.is_float(v.dtype) or k.endswith("running_mean"): a = np.zeros(v.shape)
    elif k.endswith("running_var"): a = np.ones(v.shape)
    elif len(v.shape) == 1: a = (1.0 if k.endswith("weight") else 0.0) + 0.1 * rng.standard_normal(v.shape)   # norm scales, biases
    else: a = rng.standard_normal(v.shape) / np.sqrt(np.prod(v.shape[1:]))   # fan-in scaled: sane activations
    sd[k] = Tensor(a, dtype=v.dtype)
  load_state_dict(model, sd, verbose=False)

def _realize_all(*objs) -> None:
  """Realize the rest of the objects' state (optimizer state) before the first call, so the first call times the
  model's step, not initialization; this realize goes through the bridge too."""
  from tinygrad import Tensor
  from tinygrad.nn.state import get_state_dict
  Tensor.realize(*{id(t): t for o in objs for t in get_state_dict(o).values()}.values())

def _summary(t) -> list[float]:
  """An output's fingerprint: its first 4 elements, its sum and its absolute sum (float32 values as Python floats)."""
  a = t.numpy().astype("float64").ravel()
  return [float(x) for x in a[:4]] + [float(a.sum()), float(abs(a).sum())]

def gpt2_gen(steps: int, rng):
  from examples.gpt2 import Transformer
  from tinygrad import Variable
  model = Transformer(**GPT2)
  _load_random(model, rng)
  tok = [13]   # a one-token prompt: every step takes the Variable token path, as generate() does for batch 1
  def call(i: int) -> list[int]:
    # generate()'s step: bound token and start_pos Variables into forward_jit, .tolist() of the sampled token
    start_pos = Variable("start_pos", 1 if i else 0, GPT2["max_seq_len"] - 1).bind(i)
    out = model.forward_jit(Variable("tokens", 0, GPT2["vocab_size"] - 1).bind(tok[-1]), start_pos, 0.8).tolist()
    tok.append(out[0])
    return out
  call.model = model   # bench/capture_corpus.py --models also runs a prefill through it
  return call

def gpt2_decode(steps: int, rng):
  from examples.gpt2 import Transformer
  from tinygrad import Tensor, Variable
  model = Transformer(**GPT2)
  _load_random(model, rng)
  tok = [13]
  def call(i: int) -> list[int]:
    start_pos = Variable("start_pos", 1 if i else 0, GPT2["max_seq_len"] - 1).bind(i)
    tok.append(model.forward(Tensor([[tok[-1]]]), start_pos, 0.0).item())   # no JIT: the token as a new Tensor
    return [tok[-1]]
  return call

def mnist(steps: int, rng):
  import examples.beautiful_mnist as bm
  from tinygrad import Tensor, nn
  os.environ["BS"] = str(MNIST_BS)   # train_step's batch: getenv("BS", 512), read when it traces
  model = bm.Model()
  _load_random(model, rng)
  bm.opt = nn.optim.Adam(nn.state.get_parameters(model))   # train_step reads the module's global `opt`
  X = Tensor(rng.integers(0, 256, (MNIST_N, 1, 28, 28), dtype="uint8"))   # uint8 images, as mnist() gives them
  Y = Tensor(rng.integers(0, 10, MNIST_N, dtype="uint8"))
  Tensor.realize(X, Y); _realize_all(bm.opt)
  return lambda i: [model.train_step(X, Y).item()]

def mnist_grad(steps: int, rng):
  """beautiful_mnist's Model, its loss and gradients under TinyJit on a new batch each call, no optimizer: the training
  step's values without Adam's first step, which divides each gradient by its own magnitude (a gradient near 0 that
  differs in its 4th digit moves a weight by up to 2 lr, so mnist's losses part from stock's after step 1)."""
  import examples.beautiful_mnist as bm
  from tinygrad import Tensor, TinyJit, Context, nn
  model = bm.Model()
  _load_random(model, rng)
  params = nn.state.get_parameters(model)
  X = [Tensor(rng.integers(0, 256, (MNIST_BS, 1, 28, 28), dtype="uint8")) for _ in range(steps + 2)]
  Y = [Tensor(rng.integers(0, 10, MNIST_BS, dtype="uint8")) for _ in range(steps + 2)]
  Tensor.realize(*X, *Y)
  @TinyJit
  @Context(TRAINING=1)
  def grads(x: Tensor, y: Tensor) -> Tensor:
    for p in params: p.grad, p.requires_grad = None, True
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    gs = [p.grad for p in params if p.grad is not None]   # (BatchNorm's running statistics get none)
    return Tensor.stack(loss, *[g.abs().sum() for g in gs], *[g.square().sum() for g in gs]).realize()
  return lambda i: grads(X[i], Y[i]).tolist()   # absolute and squared sums: no cancellation for a tolerance to meet

def resnet18(steps: int, rng):
  from extra.models.resnet import ResNet18
  from tinygrad import Tensor, TinyJit
  model = ResNet18()
  _load_random(model, rng)
  imgs = [Tensor(rng.standard_normal((1, 3, RESNET_HW, RESNET_HW), dtype="float32")) for _ in range(steps + 2)]
  Tensor.realize(*imgs)
  jit = TinyJit(lambda x: model(x).realize())
  return lambda i: _summary(jit(imgs[i]))

def bert(steps: int, rng):
  from extra.models.bert import Bert
  from tinygrad import Tensor
  model = Bert(**BERT)
  _load_random(model, rng)
  ids = [Tensor(rng.integers(0, BERT["vocab_size"], BERT_SHAPE, dtype="int32")) for _ in range(steps + 2)]
  mask, types = Tensor(np_ones := rng.integers(1, 2, BERT_SHAPE, dtype="int32")), Tensor(np_ones * 0)
  Tensor.realize(*ids, mask, types)
  return lambda i: _summary(model(ids[i], mask, types))

def eager_mlp(steps: int, rng):
  from tinygrad import Tensor, nn, Context
  layers = [nn.Linear(a, b) for a, b in zip(MLP, MLP[1:])]
  _load_random(layers, rng)
  opt = nn.optim.SGD(nn.state.get_parameters(layers), lr=0.01, momentum=0.9)
  X = Tensor(rng.standard_normal((64, MLP[0]), dtype="float32"))
  Y = Tensor(rng.integers(0, MLP[-1], 64, dtype="int32"))
  Tensor.realize(X, Y); _realize_all(opt)
  def call(i: int) -> list[float]:
    with Context(TRAINING=1):
      opt.zero_grad()
      loss = X.sequential([f for l in layers[:-1] for f in (l, Tensor.relu)] + [layers[-1]]).sparse_categorical_crossentropy(Y)
      loss.backward()
      opt.step()
    return [loss.item()]
  return call

MODELS = {"gpt2-gen": gpt2_gen, "gpt2-decode": gpt2_decode, "mnist": mnist, "mnist-grad": mnist_grad, "resnet18": resnet18,
          "bert": bert, "eager-mlp": eager_mlp}
# steady calls per process: a few seconds each at most (non-JIT steps take 0.1-0.5 s of tinygrad scheduling on 2 cores)
STEPS = {"gpt2-gen": 20, "gpt2-decode": 12, "mnist": 6, "mnist-grad": 6, "resnet18": 10, "bert": 6, "eager-mlp": 10}
SIZES = {"gpt2-gen": "Transformer dim 64, 4 heads, 2 layers, vocab 512, 1-token prompt",
         "gpt2-decode": "same model, greedy, no JIT", "mnist": f"Model, Adam, BS {MNIST_BS} of {MNIST_N} 28x28 uint8",
         "mnist-grad": f"same Model, loss and gradients, BS {MNIST_BS}, a new batch per call",
         "resnet18": f"ResNet18 (1000 classes), 1x3x{RESNET_HW}x{RESNET_HW}",
         "bert": f"Bert hidden 64, 2 layers, 4 heads, ffn 256, vocab 512, {BERT_SHAPE[0]}x{BERT_SHAPE[1]} tokens",
         "eager-mlp": f"MLP {'-'.join(map(str, MLP))}, batch 64, SGD momentum 0.9"}

# ---- one (model, mode) in a fresh process ---------------------------------------------------------------------------------

def _stats(br) -> dict:
  """The bridge's counts so far, {} for stock."""
  return {} if br is None else br.stats()

def worker(model: str, mode: str, steps: int, tinygrad_tests: str) -> dict:
  out: dict = {"model": model, "mode": mode}
  try:
    sys.path.insert(0, tinygrad_tests)
    sys.setrecursionlimit(100_000)   # deep tinygrad graphs; the same in every mode
    import numpy as np
    from tinygrad import Tensor
    br = None   # stock never imports callsat: tinygrad as it ships
    if mode != "stock":
      import egraph.tinygrad as br
      br.install(strict=mode == "strict")   # cost: fallback, with CALLSAT_BRIDGE_FUSION=cost in the env; callsat: with
                                            # CALLSAT_BRIDGE_BACKEND=callsat (callsat's kernels)
    Tensor.manual_seed(0); np.random.seed(0)   # tinygrad's RNG: gpt2-gen's sampling, beautiful_mnist's batches
    t0 = time.perf_counter()
    call = MODELS[model](steps, np.random.default_rng(0))   # weights and inputs
    out["build_ms"] = (time.perf_counter() - t0) * 1e3
    t0, c0 = time.perf_counter(), time.process_time()
    values = [call(0)]
    out["first_ms"], out["first_cpu_ms"] = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    t0 = time.perf_counter()
    values.append(call(1))
    out["warm_ms"] = (time.perf_counter() - t0) * 1e3
    before, times, cpus = _stats(br), [], []
    from tinygrad import GlobalCounters
    for i in range(2, steps + 2):
      if i == steps + 1: GlobalCounters.reset()   # the last step's kernels: the same work in every mode?
      t0, c0 = time.perf_counter(), time.process_time()
      values.append(call(i))
      times.append(time.perf_counter() - t0); cpus.append(time.process_time() - c0)
    after = _stats(br)
    total, pre = _flat(after), _flat(before)
    out["kernels"] = [GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem]
    out.update(steady_ms=statistics.median(times) * 1e3, steady_cpu_ms=statistics.median(cpus) * 1e3, values=values, stats=after, total=total,
               steady={k: v - pre.get(k, 0) for k, v in total.items() if k in COUNTED})
  except BaseException as e:   # reported in the table, never fatal to the bench
    out["error"] = f"{type(e).__name__}: {e}"[:400]
    out["traceback"] = traceback.format_exc()[-1500:]
  return out

def run_one(model: str, mode: str, steps: int, args) -> dict:
  env = {**os.environ, "DEV": "CPU", "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
  # no cache outlives a process unless asked: tinygrad's compile cache, and the bridge's measured verdicts (those in a
  # directory of this bench run's own, so the first round measures and the user's are neither read nor written)
  if not args.disk_cache: env["CACHELEVEL"], env["CALLSAT_BRIDGE_VERDICTS"] = "0", "0"
  else: env["CALLSAT_BRIDGE_VERDICTS_DIR"] = args.verdicts_dir
  for k in ("CALLSAT_BRIDGE_FUSION", "CALLSAT_BRIDGE_BACKEND", "CALLSAT_BRIDGE_EXPLORE"): env.pop(k, None)
  if mode in ("cost", "cost-anchored", "callsat-cost"): env["CALLSAT_BRIDGE_FUSION"] = "cost"
  if mode == "cost-anchored": env["CALLSAT_BRIDGE_EXPLORE"] = "0"
  if mode in ("callsat", "callsat-cost"): env["CALLSAT_BRIDGE_BACKEND"] = "callsat"
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", model, mode, "--steps", str(steps), "--tinygrad", args.tinygrad]
  # its own session: on a timeout the worker and tinygrad's compile pool under it are ended together
  p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  try: out, err = p.communicate(timeout=args.timeout)
  except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL); p.communicate()
    return {"model": model, "mode": mode, "error": f"timeout after {args.timeout} s"}
  lines = [l for l in out.splitlines() if l.startswith("{")]
  if p.returncode or not lines: return {"model": model, "mode": mode, "error": f"exit {p.returncode}: {(err or out)[-300:]}"}
  return json.loads(lines[-1])

# ---- comparing and the table ----------------------------------------------------------------------------------------------

ATOL, RTOL = 1e-6, 1e-3   # tinygrad's own float tolerance: test/backend/test_ops.py, helper_test_op's defaults

def compare(a: list, b: list) -> tuple[bool, float, float, int | None, bool]:
  """(identical?, max absolute difference, max relative difference, first call that differs, all within tinygrad's
  tolerance?) of a run's values `a` against the stock run's `b`. An int (a token) is within tolerance only if equal."""
  if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)): return False, math.inf, math.inf, 0, False
  same, dabs, drel, first, close = True, 0.0, 0.0, None, True
  for i, (ca, cb) in enumerate(zip(a, b)):
    for x, y in zip(ca, cb):
      if x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)): continue
      same, first = False, i if first is None else first
      d = abs(x - y) if not (math.isnan(x) or math.isnan(y)) else math.inf
      dabs, drel = max(dabs, d), max(drel, d / max(abs(x), abs(y)))
      close = close and isinstance(x, float) and isinstance(y, float) and d <= ATOL + RTOL * abs(y)
  return same, dabs, drel, first, close

COUNTED = ("calls", "bridged", "fallback", "refused", "hinted", "hints", "hint_errors", "measured", "measure_dropped",
           "measure_seconds", "verdicts_reused", "undecided", "backend_callsat", "backend_tinygrad", "backend_runs", "cache.hits", "cache.misses",
           "cache.uncacheable", "cache.evicted")

def _flat(stats: dict) -> dict:
  """stats() as {name: number}, the structural cache's counts as cache.NAME (whatever keys this bridge reports)."""
  out = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
  out.update({f"cache.{k}": v for k, v in (stats.get("cache") or {}).items() if isinstance(v, (int, float))})
  return out

def counts(runs: list[dict]) -> str:
  """The bridge's counts of a (model, mode), whole process and steady steps: one number where every round agrees,
  else min-max."""
  def cell(part, k, fmt=str):
    vs = [r[part].get(k) for r in runs if r[part].get(k) is not None]
    return None if not vs else fmt(vs[0]) if min(vs) == max(vs) else f"{fmt(min(vs))}-{fmt(max(vs))}"
  def line(part):
    c = lambda k: cell(part, k) or "0"
    out = f"{c('calls')} calls, {c('bridged')} bridged, {c('fallback')} fb, {c('refused')} ref"
    if cell(part, "cache.hits") is not None: out += f", cache {c('cache.hits')} hit / {c('cache.misses')} miss"
    if cell(part, "cache.uncacheable") not in (None, "0"): out += f" / {c('cache.uncacheable')} uncacheable"
    if cell(part, "hinted") not in (None, "0"): out += f", {c('hinted')} hinted ({c('hints')} points)"
    if cell(part, "hint_errors") not in (None, "0"): out += f", {c('hint_errors')} hint errors"
    if cell(part, "measured") not in (None, "0"):
      out += f", {c('measured')} measured ({c('measure_dropped')} dropped, {cell(part, 'measure_seconds', lambda v: f'{v:.1f}')} s)"
    if cell(part, "verdicts_reused") not in (None, "0"): out += f", {c('verdicts_reused')} verdicts reused"
    if cell(part, "undecided") not in (None, "0"): out += f", {c('undecided')} undecided (a first run)"
    if cell(part, "backend_callsat") is not None:   # CALLSAT_BRIDGE_BACKEND=callsat: who ran the CALLs
      out += f", callsat's kernels {c('backend_callsat')} / tinygrad's {c('backend_tinygrad')} calls, {c('backend_runs')} runs"
    return out
  if not runs[0]["total"].get("calls"): return "-"
  reasons = {k: v for r in runs for k, v in r["stats"].get("reasons", {}).items()}
  reasons.update({f"tinygrad's kernels: {k}": v for r in runs for k, v in r["stats"].get("backend_reasons", {}).items()})
  return (f"all: {line('total')}; steady: {line('steady')}"
          + ("; reasons: " + ", ".join(f"{k} {v}" for k, v in list(reasons.items())[:3]) if reasons else ""))

def table(results: dict, args) -> list[str]:
  """results[(model, mode)] = list of per-round dicts (round index inside)."""
  lines = ["| model | mode | values = stock | first call ms | first / stock | warm call ms | steady ms | speed = stock / mode | "
           "speed, CPU time | last step: kernels, GFLOP, MB | bridge counts | errors |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for model in args.models:
    stock = {r["round"]: r for r in results.get((model, "stock"), []) if "error" not in r}
    med = lambda runs, k: statistics.median(r[k] for r in runs) if runs else None
    s_first, s_steady = med(list(stock.values()), "first_ms"), med(list(stock.values()), "steady_ms")
    s_cpu = med([r for r in stock.values() if "steady_cpu_ms" in r], "steady_cpu_ms")
    for mode in args.modes:
      runs = results.get((model, mode), [])
      ok, errs = [r for r in runs if "error" not in r], [r for r in runs if "error" in r]
      if mode == "stock": eq = "(reference)"
      elif not ok or not stock: eq = "n/a"
      else:
        cmp = [compare(r["values"], stock[r["round"]]["values"]) for r in ok if r["round"] in stock]
        n_same = sum(c[0] for c in cmp)
        dabs, drel = max((c[1] for c in cmp), default=0.0), max((c[2] for c in cmp), default=0.0)
        at = min((c[3] for c in cmp if c[3] is not None), default=None)
        tol = "within tinygrad's tolerance" if all(c[4] for c in cmp) else "**beyond tinygrad's tolerance**"
        eq = (f"yes, {n_same}/{len(cmp)} rounds" if n_same == len(cmp) else
              f"**no**, {n_same}/{len(cmp)} rounds; max diff {dabs:.3g} (rel {drel:.2g}) from call {at}; {tol}")
      first, steady = med(ok, "first_ms"), med(ok, "steady_ms")
      warm = med([r for r in ok if "warm_ms" in r], "warm_ms")
      fr = f"{first / s_first:.2f}x" if first and s_first and mode != "stock" else ""
      sp = f"{s_steady / steady:.2f}x" if steady and s_steady and mode != "stock" else ""
      cpu = med([r for r in ok if "steady_cpu_ms" in r], "steady_cpu_ms")
      sc = f"{s_cpu / cpu:.2f}x" if cpu and s_cpu and mode != "stock" else ""
      err = "; ".join(sorted({r["error"] for r in errs}))
      ks = sorted({tuple(r["kernels"]) for r in ok if "kernels" in r})
      kc = "; ".join(f"{k} / {o / 1e9:.3g} / {m / 1e6:.3g}" for k, o, m in ks) or "-"
      if mode != "stock" and ks and ks != sorted({tuple(r["kernels"]) for r in stock.values() if "kernels" in r}): kc = f"**{kc}** (not stock's)"
      lines.append(f"| {model} | {mode} | {eq} | {f'{first:.0f}' if first else '-'} | {fr} | {f'{warm:.0f}' if warm else '-'} "
                   f"| {f'{steady:.2f}' if steady else '-'} "
                   f"| {sp} | {sc} | {kc} | {counts(ok) if ok else '-'} | {err.replace('|', '/')} |")
  return lines

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--rounds", type=int, default=1, help="fresh processes per (model, mode); medians over rounds (one "
                  "round of every model and mode takes 6-9 minutes on 2 cores, mostly tinygrad compiling in each process)")
  ap.add_argument("--steps", type=int, help=f"steady calls per process (default per model: {STEPS})")
  ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
  ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
  ap.add_argument("--tinygrad", default=TINYGRAD_TESTS, help="tinygrad's source tree with examples/ and extra/")
  ap.add_argument("--disk-cache", action="store_true",
                  help="keep tinygrad's compile cache (CACHELEVEL) and the bridge's measured verdicts across processes")
  ap.add_argument("--timeout", type=int, default=300, help="seconds per worker process")
  ap.add_argument("--out", help="append the table to this markdown file")
  ap.add_argument("--json", help="write every process's result (values, timings, stats) to this file")
  ap.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    print(json.dumps(worker(*args.worker, args.steps or STEPS[args.worker[0]], args.tinygrad))); return
  if "stock" not in args.modes: args.modes = ["stock", *args.modes]   # the reference for values and ratios
  args.verdicts_dir = tempfile.mkdtemp(prefix="callsat-bench-verdicts-")   # --disk-cache: this run's, gone at the end
  atexit.register(shutil.rmtree, args.verdicts_dir, True)
  t_start, load0, results = time.perf_counter(), os.getloadavg()[0], {}
  for rnd in range(args.rounds):
    for mi, model in enumerate(args.models):
      k = (rnd + mi) % len(args.modes)
      for mode in args.modes[k:] + args.modes[:k]:   # rotated: each mode goes first in some round
        t0 = time.perf_counter()
        res = run_one(model, mode, args.steps or STEPS[model], args)
        res["round"], res["wall_s"] = rnd, time.perf_counter() - t0
        results.setdefault((model, mode), []).append(res)
        msg = res["error"] if "error" in res else f"first {res['first_ms']:8.0f} ms  steady {res['steady_ms']:8.2f} ms"
        print(f"round {rnd} {model:11s} {mode:8s} {msg}  ({res['wall_s']:.0f} s)", file=sys.stderr, flush=True)
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  cmd = " ".join(["python bench/models.py", *sys.argv[1:]])
  lines = [f"`{cmd}` ({stamp}, load {load0:.1f} -> {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, DEV=CPU, "
           f"CACHELEVEL={'default' if args.disk_cache else 0}, {time.perf_counter() - t_start:.0f} s): {args.rounds} round(s), "
           "each (model, mode) a fresh process, modes in rotated order. Values compared exactly with the stock process "
           "of the same round; first call = call 0 (schedule + compile + run), median over rounds, ratio mode / stock; "
           "steady = median over rounds of each process's median step (calls 2+), speed = stock / mode. "
           "Bridge counts from egraph.tinygrad.stats(): all = the whole process (weight loading included), steady = during "
           "the steady steps (fb: fell back, ref: refused in strict mode; cache: the bridge's structural cache).", "",
           "Models: " + "; ".join(f"{m}: {SIZES[m]}, {args.steps or STEPS[m]} steady steps" for m in args.models) + ".", "",
           *table(results, args)]
  print("\n".join(lines))
  if args.json:
    with open(args.json, "w") as f: json.dump([r for rs in results.values() for r in rs], f)
  if args.out:
    with open(args.out, "a") as f: f.write("\n" + "\n".join(lines) + "\n")

if __name__ == "__main__":
  main()
