"""Build the committed tinygrad graph corpora (notes/corpus.md): the programs below, run on tinygrad 0.14's NULL device
(graphs only, no compute) under egraph.bridge.capture, each graph named <program>/<k>; with --tests, also the graphs of
tinygrad's own NULL-device tests (pytest with -p egraph.bridge.capture), named <test id>/<k>, repeats across tests dropped.
With --models, the graphs of bench/models.py's models (tinygrad's own example and model code: GPT-2 prefill of
8 tokens and decode steps, the MNIST training step, ResNet-18, BERT, the eager MLP's steps), the calls after the model
is built (its weight loading left out), named <model>/<k>, then the programs below (--only: some; --only with no name:
none). Records carry tinygrad's arithmetic as callsat ops where
callsat can say them (Capture's default; --opaque keeps it OPAQUE).

    python bench/capture_corpus.py [--out bench/corpus/tinygrad.jsonl.gz] [--tests ../shared/tinygrad-tests]
        [--test-files test/null/test_schedule.py ...] [--max-test-graphs 400] [--max-nodes 10000] [--only NAME ...]
    python bench/capture_corpus.py --models [--out bench/corpus/models.jsonl.gz] [--tinygrad ../shared/tinygrad-tests]

Same tinygrad, same programs: same bytes (seeded RNG, buffers numbered per record, gzip without a time stamp)."""
from __future__ import annotations
import os
os.environ["DEV"] = "NULL"     # before tinygrad is imported: every tensor lives on NULL unless a program says otherwise
os.environ["NULL_ALLOW_COPYOUT"] = "1"   # the models read their outputs back (.item(), .tolist()): NULL gives zeros
import argparse, json, subprocess, sys, tempfile, time
import numpy as np
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tinygrad import Tensor, nn, dtypes, Variable   # noqa: E402
from tinygrad.helpers import Context   # noqa: E402
from egraph.bridge.capture import Capture   # noqa: E402
from egraph.ir import corpus   # noqa: E402

def mlp():
  l1, l2 = nn.Linear(64, 128), nn.Linear(128, 10)
  Tensor.realize(l2(l1(Tensor.randn(16, 64)).relu()).softmax())

def mlp_train():
  l1, l2 = nn.Linear(32, 64), nn.Linear(64, 10)
  opt = nn.optim.SGD(nn.state.get_parameters([l1, l2]), lr=0.01, momentum=0.9)
  x, y = Tensor.randn(8, 32), Tensor([1, 2, 3, 4, 5, 6, 7, 8])
  with Context(TRAINING=1):
    for _ in range(2):
      opt.zero_grad()
      loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y).backward()
      Tensor.realize(loss, *opt.schedule_step())

def attention():
  q, k, v = (Tensor.randn(2, 4, 16, 8) for _ in range(3))
  Tensor.realize(q.scaled_dot_product_attention(k, v, is_causal=True))

def layernorm():
  ln = nn.LayerNorm(64)
  Tensor.realize(ln(Tensor.randn(8, 16, 64)), Tensor.randn(4, 32).layernorm(axis=-1))

def conv2d():
  c = nn.Conv2d(3, 8, 3, padding=1)
  Tensor.realize(c(Tensor.randn(2, 3, 16, 16)).relu())

class Block:
  """A GPT-2 block: pre-LN attention (causal) and a GELU MLP, both residual."""
  def __init__(self, d: int, heads: int):
    self.ln1, self.ln2, self.heads = nn.LayerNorm(d), nn.LayerNorm(d), heads
    self.qkv, self.proj, self.fc, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
  def __call__(self, x: Tensor) -> Tensor:
    B, T, D = x.shape
    q, k, v = [t.reshape(B, T, self.heads, D // self.heads).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, dim=2)]
    x = x + self.proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, D))
    return x + self.out(self.fc(self.ln2(x)).gelu())

def gpt2_block():
  Tensor.realize(Block(32, 4)(Tensor.randn(2, 8, 32)))

def gpt2_block_train():
  blk = Block(32, 4)
  opt = nn.optim.Adam(nn.state.get_parameters(blk), lr=1e-3)
  with Context(TRAINING=1):
    opt.zero_grad()
    loss = blk(Tensor.randn(2, 8, 32)).square().mean().backward()
    Tensor.realize(loss, *opt.schedule_step())

def gpt2_train():
  """Two blocks, token and position embeddings, a tied LM head, cross entropy, AdamW: one training step."""
  V, T, D = 64, 8, 32
  wte, wpe, blocks, ln = nn.Embedding(V, D), nn.Embedding(T, D), [Block(D, 4), Block(D, 4)], nn.LayerNorm(D)
  opt = nn.optim.AdamW(nn.state.get_parameters([wte, wpe, blocks, ln]), lr=1e-3)
  tok = Tensor([[1, 5, 9, 2, 7, 3, 3, 0], [4, 4, 8, 1, 0, 2, 6, 5]])
  with Context(TRAINING=1):
    opt.zero_grad()
    x = wte(tok) + wpe(Tensor.arange(T).reshape(1, T))
    for b in blocks: x = b(x)
    loss = (ln(x) @ wte.weight.T).sparse_categorical_crossentropy(tok[:, 1:].pad(((0, 0), (0, 1)))).backward()
    Tensor.realize(loss, *opt.schedule_step())

def kv_cache():
  cache = Tensor.zeros(2, 16, 4, 8).contiguous().realize()
  for i in range(3):
    cache[:, i:i + 1].assign(Tensor.randn(2, 1, 4, 8)).realize()
  Tensor.realize((cache[:, :3] * 2).sum(axis=1))

def resnet_block():
  c1, c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.Conv2d(8, 8, 3, padding=1, bias=False)
  b1, b2 = nn.BatchNorm2d(8), nn.BatchNorm2d(8)
  x = Tensor.randn(2, 8, 8, 8)
  with Context(TRAINING=1):   # batch statistics: the running means and variances are assigned
    Tensor.realize((b2(c2(b1(c1(x)).relu())) + x).relu())
  Tensor.realize((b2(c2(b1(c1(x)).relu())) + x).relu())   # inference: the running statistics are read

def resnet_train():
  """A ResNet basic block with a strided projection shortcut, global pool and a linear head: one SGD step in training
  mode (batch statistics, running statistics assigned)."""
  c1, c2, cs = (nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                nn.Conv2d(4, 8, 1, stride=2, bias=False))
  b1, b2, bs, fc = nn.BatchNorm2d(8), nn.BatchNorm2d(8), nn.BatchNorm2d(8), nn.Linear(8, 10)
  opt = nn.optim.SGD(nn.state.get_parameters([c1, c2, cs, b1, b2, bs, fc]), lr=0.1, momentum=0.9, nesterov=True)
  x = Tensor.randn(4, 4, 8, 8)
  with Context(TRAINING=1):
    opt.zero_grad()
    h = (b2(c2(b1(c1(x)).relu())) + bs(cs(x))).relu()
    loss = fc(h.mean(axis=(2, 3))).sparse_categorical_crossentropy(Tensor([1, 2, 3, 4])).backward()
    Tensor.realize(loss, *opt.schedule_step())

def cat():
  a, b, c = Tensor.randn(4, 8), Tensor.randn(2, 8), Tensor.randn(4, 8)
  Tensor.realize(a.cat(b, c, dim=0), Tensor.stack(a, c, dim=1), a.cat(c, dim=1).contiguous())

def gather():
  x, idx = Tensor.randn(8, 16), Tensor([[0, 3], [1, 2], [5, 5], [7, 0], [1, 1], [2, 2], [3, 3], [4, 4]])
  emb = nn.Embedding(100, 16)
  Tensor.realize(x.gather(1, idx), x[Tensor([1, 5, 7])], emb(Tensor([[1, 2, 3], [4, 5, 6]])))

def fancy_index():
  x = Tensor.arange(60).reshape(3, 4, 5).float().contiguous().realize()
  Tensor.realize(x[Tensor([0, 2]), :, Tensor([1, 3])], x[1, Tensor([0, 3]), 1:3], x[..., Tensor([4, 0, 2])])

def arange():
  Tensor.realize(Tensor.arange(16), Tensor.arange(2, 30, 3).float() * 0.5, Tensor.eye(8), Tensor.ones(6, 6).triu(1))

def cumsum():
  x = Tensor.randn(4, 32)
  Tensor.realize(x.cumsum(axis=1), *x.cummax(axis=0), Tensor.ones(100).cumsum())

def rand():
  Tensor.realize(Tensor.rand(4, 8), Tensor.randn(16), Tensor.randint(10, low=0, high=7), Tensor.uniform(3, 3, low=-1, high=1))
  with Context(TRAINING=1): Tensor.realize(Tensor.ones(8, 8).dropout(0.5))

def pools():
  x = Tensor.randn(2, 4, 12, 12)
  Tensor.realize(x.max_pool2d(2), x.avg_pool2d(3, stride=2), x.max_pool2d((2, 3), stride=(2, 1), padding=1))

def assign_slices():
  a = Tensor.zeros(8, 8).contiguous().realize()
  a[1:3] = Tensor.ones(2, 8)
  a[:, 4] = Tensor.arange(8).float()
  a[5:7, 2:6].assign(Tensor.full((2, 4), 3.0))
  Tensor.realize(a)
  b = Tensor.arange(10).contiguous().realize()
  b[2:5] = b[5:8]   # an overlapping copy within one buffer
  b.realize()

def bitcast():
  x = Tensor.randn(16).realize()
  Tensor.realize(x.bitcast(dtypes.int32), x.bitcast(dtypes.uint32) >> 23, Tensor.arange(8, dtype=dtypes.int32).bitcast(dtypes.float32),
                 x.cast(dtypes.half).bitcast(dtypes.uint16))

def softmax():
  x = Tensor.randn(8, 32)
  Tensor.realize(x.softmax(), x.log_softmax(axis=0), x.sparse_categorical_crossentropy(Tensor.arange(8)))

def views():
  """Contiguous views of realized buffers: what callify folds into zero-copy slices."""
  a = Tensor.randn(8, 16).realize()
  Tensor.realize(a[2:5].contiguous(), a.reshape(16, 8)[4:].contiguous(), a.T.contiguous(), a[:, :4].contiguous(), a[3].contiguous())

def reductions():
  x = Tensor.randn(6, 10)
  Tensor.realize(x.sum(), x.max(axis=1), x.argmax(axis=0), x.mean(axis=1, keepdim=True), x.std(), x.var(axis=0), x.min(axis=1))

def movement():
  x = Tensor.randn(4, 6)
  Tensor.realize(x.pad(((1, 2), (0, 3))), x.flip(0), x.repeat(2, 2), x.permute(1, 0).reshape(2, 12), x.shrink(((1, 3), (2, 5))) * 2)

def dtypes_mix():
  x = Tensor.randn(8, 8)
  Tensor.realize(x.half() @ x.half(), x.cast(dtypes.bfloat16).sum(dtype=dtypes.float32), (x * 100).cast(dtypes.int8),
                 Tensor.arange(64, dtype=dtypes.int64).reshape(8, 8) // 3, (x > 0).where(x, 0.0))

def matmul():
  a, b, c = Tensor.randn(16, 32), Tensor.randn(32, 8), Tensor.randn(4, 16, 32)
  Tensor.realize(a @ b, (a @ b).T @ a, c @ b, Tensor.einsum("bij,jk->bik", c, b))

def host_input():
  """Inputs from numpy and Python lists: COPYs onto the device."""
  x = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
  Tensor.realize(x * Tensor([1.0, 2, 3, 4, 5, 6]), Tensor(np.eye(3, dtype=np.int32)) + 1)

def symbolic():
  x = Tensor.randn(16, 8).realize()
  v = Variable("n", 1, 16)
  for n in (3, 5): Tensor.realize(x[:v.bind(n)].sum(axis=0))

def rnn():
  """An Elman RNN unrolled over 4 steps, realizing the state each step: one graph per step."""
  w, u = Tensor.randn(16, 16), Tensor.randn(8, 16)
  h = Tensor.zeros(2, 16).contiguous().realize()
  for _ in range(4): h = (h @ w + Tensor.randn(2, 8) @ u).tanh().realize()

def topk_sort():
  x = Tensor.randn(32)
  Tensor.realize(*x.topk(4), x.sort()[0])

PROGRAMS = {f.__name__: f for f in (
  mlp, mlp_train, attention, layernorm, conv2d, gpt2_block, gpt2_block_train, gpt2_train, kv_cache, resnet_block,
  resnet_train, cat, gather, fancy_index, arange, cumsum, rand, pools, assign_slices, bitcast, softmax, views, reductions,
  movement, dtypes_mix, matmul, host_input, symbolic, rnn, topk_sort)}

OPAQUE = {"on": False}   # --opaque

def capture_program(name: str, max_nodes: int) -> tuple[list[str], str]:
  """(records, summary line) of one program; graphs over max_nodes nodes are dropped (the corpus stays small)."""
  Tensor.manual_seed(0)
  cap = Capture(name, unique=True, opaque=OPAQUE["on"])
  with cap: PROGRAMS[name]()
  keep = [r for r in cap.records if len(json.loads(r)["nodes"]) <= max_nodes]
  return keep, cap.summary() + (f"; {len(cap.records) - len(keep)} over {max_nodes} nodes dropped" if len(keep) < len(cap.records) else "")

def capture_models(tinygrad: str, names: list[str] | None, calls: int, max_nodes: int, opaque: bool) -> list[str]:
  """The graphs of bench/models.py's models on NULL: `calls` calls of each after it is built (gpt2-gen's first call is
  also an 8-token prefill through model.forward), repeats within a model dropped."""
  sys.path[:0] = [tinygrad, os.path.join(ROOT, "bench")]
  import models as bench_models
  out = []
  for name in names or bench_models.MODELS:
    t0 = time.perf_counter()
    Tensor.manual_seed(0)
    cap = Capture(name, unique=True, opaque=opaque)
    call = bench_models.MODELS[name](calls, np.random.default_rng(0))
    with cap:
      if name == "gpt2-gen":   # a prompt of 8 tokens in one forward: the prefill graph
        call.model.forward(Tensor([[13, 7, 99, 4, 250, 31, 8, 17]]), 0, 0.0).realize()
      for i in range(calls): call(i)
    keep = [r for r in cap.records if len(json.loads(r)["nodes"]) <= max_nodes]
    print(f"{name}: {cap.summary()}; {len(keep)} kept ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    out += keep
  return out

def capture_tests(tests: str, files: list[str], limit: int, max_nodes: int, seen: set[str]) -> list[str]:
  """Graphs of tinygrad's own tests (each file one pytest run, DEV=NULL), first occurrences only, at most `limit` in all.
  A test's record keeps its name (test id/k); a graph equal to one already in the corpus is dropped."""
  out: list[str] = []
  for f in files:
    with tempfile.TemporaryDirectory() as tmp:
      rec = os.path.join(tmp, "capture.jsonl")
      env = {**os.environ, "DEV": "NULL", "CALLSAT_CAPTURE": rec, "PYTHONPATH": os.pathsep.join([ROOT, tests])}
      p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "egraph.bridge.capture", f],
                         cwd=tests, env=env, capture_output=True, text=True)
      tail = [l for l in p.stdout.splitlines() if l.startswith("callsat capture") or " passed" in l or " failed" in l]
      print(f"{f}: {'; '.join(tail[-2:])}", file=sys.stderr)
      if not os.path.exists(rec): continue
      for line in open(rec):
        body = json.loads(line)
        key = json.dumps([body["roots"], body["nodes"]])
        if key in seen or len(body["nodes"]) > max_nodes or len(body["nodes"]) < 4: continue
        seen.add(key); out.append(line.rstrip("\n"))
  # an even spread over the files and tests when over the limit: every k-th record
  return out if len(out) <= limit else [out[round(i * len(out) / limit)] for i in range(limit)]

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default=os.path.join(ROOT, "bench", "corpus", "tinygrad.jsonl.gz"))
  ap.add_argument("--only", nargs="*", help=f"programs to run (default all: {', '.join(PROGRAMS)})")
  ap.add_argument("--tests", help="tinygrad's test folder (../shared/tinygrad-tests): also capture its NULL tests")
  ap.add_argument("--test-files", nargs="*", default=["test/null/test_schedule.py", "test/null/test_tensor.py",
                                                      "test/null/test_schedule_cache.py"])
  ap.add_argument("--max-test-graphs", type=int, default=400)
  ap.add_argument("--max-nodes", type=int, default=10000, help="drop graphs with more nodes than this")
  ap.add_argument("--models", nargs="*", help="capture bench/models.py's models instead (all, or the ones named)")
  ap.add_argument("--calls", type=int, default=3, help="--models: calls of each model captured")
  ap.add_argument("--tinygrad", default=os.path.join(os.path.dirname(ROOT), "shared", "tinygrad-tests"),
                  help="--models: tinygrad's example and model code (put on sys.path)")
  ap.add_argument("--opaque", action="store_true", help="keep tinygrad's arithmetic OPAQUE (corpus version 1's content)")
  args = ap.parse_args()
  if args.models is not None:
    if args.out == ap.get_default("out"): args.out = os.path.join(ROOT, "bench", "corpus", "models.jsonl.gz")
    records = capture_models(os.path.abspath(args.tinygrad), args.models, args.calls, args.max_nodes, args.opaque)
    OPAQUE["on"] = args.opaque
    for name in args.only if args.only is not None else PROGRAMS:   # the programs too, with their arithmetic
      recs, line = capture_program(name, args.max_nodes)
      print(f"{name}: {line}", file=sys.stderr)
      records += recs
    n = corpus.save(args.out, records)
    print(f"{n} graphs written to {args.out} ({os.path.getsize(args.out)} bytes)")
    return
  records, seen = [], set()
  OPAQUE["on"] = args.opaque
  for name in args.only or PROGRAMS:
    t0 = time.perf_counter()
    recs, line = capture_program(name, args.max_nodes)
    print(f"{name}: {line} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    records += recs
    seen.update(json.dumps([(b := json.loads(r))["roots"], b["nodes"]]) for r in recs)
  if args.tests: records += capture_tests(os.path.abspath(args.tests), args.test_files, args.max_test_graphs, args.max_nodes, seen)
  bad = [json.loads(r)["name"] for r in records if corpus.dumps(corpus.loads(r)) != r]
  if bad: raise SystemExit(f"records that do not read back to the same text: {bad}")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  n = corpus.save(args.out, records)
  print(f"{n} graphs written to {args.out} ({os.path.getsize(args.out)} bytes)")

if __name__ == "__main__": main()
