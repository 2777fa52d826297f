"""Render the CUDA test corpus ahead of time for bench/gpu_check.sh (which runs on a GPU machine without egglog).

    python bench/make_gpu_corpus.py [--out bench/gpu_corpus] [--random N]

Writes, under --out:
  corpus.cu            one translation unit with every kernel of every case (compiled once on the GPU machine)
  manifest.json        per case: the launch plan (lower/device/cuda_driver.py format, without the source), buffer dtypes and
                       tolerances; plus the benchmark cases (sizes only: their inputs are generated on the GPU machine)
  cases/NAME.npz       the case's inputs (every non-temporary buffer before the CALL: in_<buffer>) and the expected
                       values of the buffers it writes (out_<buffer>), from the numpy reference (lower/reference.py);
                       bfloat16 buffers as their uint16 bits

`corpus()` is also the corpus of tests/lower/render/test_cuda.py: the example models of egraph/tools/cli.py, hand-written Tensor
programs (tiled matmuls with ragged edges, block reductions, softmax, views), every ALU op, cast and bitcast over all 13
dtypes, THREEFRY, reduces over narrow ints, halves and float64, and random programs from rules/testing/strategies.py's
graphs() and tests/lower/render/test_llvm_random.py's programs()."""
from __future__ import annotations
import argparse, contextlib, json, os, sys
from dataclasses import dataclass
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path: sys.path.insert(0, ROOT)

@dataclass
class Case:
  name: str
  call: object              # the CALL node
  storage: object           # egraph.ir.storage.Storage holding its inputs

def _draw_many(strategy, n: int) -> list:
  from hypothesis import given, settings, HealthCheck
  out = []
  @settings(max_examples=n, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
  @given(strategy)
  def collect(x): out.append(x)
  collect()
  return out[:n]

def _tensor_cases() -> list:
  """Tensor programs; each returns its output tensors (inputs are realized in egraph.ir.storage.STORAGE)."""
  from egraph import Tensor
  def rnd(*shape, seed): Tensor.manual_seed(seed); return Tensor.randn(*shape).realize()
  def mm_ragged(): return [(rnd(70, 45, seed=1) @ rnd(45, 100, seed=2)).contiguous()]
  def mm_square(): return [(rnd(128, 96, seed=3) @ rnd(96, 64, seed=4)).contiguous()]
  def mm_transposed(): return [(rnd(40, 33, seed=5).T @ rnd(40, 64, seed=6)).contiguous()]
  def mm_b_transposed(): return [(rnd(45, 33, seed=5) @ rnd(70, 33, seed=6).T).contiguous()]   # q @ k.T
  def bmm(): return [(rnd(3, 40, 20, seed=7) @ rnd(3, 20, 48, seed=8)).contiguous()]   # batched: the plain form on CUDA
  def row_sum(): return [rnd(8, 1000, seed=7).sum(axis=1)]
  def full_sum(): return [rnd(5000, seed=8).sum()]
  def col_max(): return [rnd(300, 20, seed=9).max(axis=0)]
  def softmax():
    x = rnd(16, 300, seed=10)
    e = (x - x.max(axis=1, keepdim=True)).exp()
    return [e / e.sum(axis=1, keepdim=True)]
  def elementwise():
    a, b = rnd(1000, seed=11), rnd(1000, seed=12)
    return [(a + b) * a - 1]
  def views():
    x = rnd(6, 8, seed=13)
    return [x.flip(0).permute(1, 0).pad(((1, 2), (0, 3))).contiguous(), x[1:5, 2:7].sum(axis=0)]
  return [("mm_ragged", mm_ragged), ("mm_square", mm_square), ("mm_transposed", mm_transposed), ("mm_b_transposed", mm_b_transposed),
          ("bmm", bmm), ("row_sum", row_sum),
          ("full_sum", full_sum), ("col_max", col_max), ("softmax", softmax), ("elementwise", elementwise), ("views", views)]

def _alu_cases() -> list:
  """Every ALU op, cast and bitcast per dtype (all 13: as tests/lower/render/test_llvm_ops.py), as raw graphs over CPU buffers;
  then THREEFRY and reduces over the narrow, half and double dtypes."""
  from egraph.ir.dtype import dtypes
  from egraph.ir.ops import Node, Ops, new_buffer
  from egraph.ir.storage import Storage
  rng = np.random.default_rng(0)
  def ints(dt):
    v = [0, 1, 2, 3, 5, 7, 9, 100, dt.bits - 1, dt.bits, dt.max, dt.max // 2 + 1]
    v += [-1, -7, -5, dt.min, -100, -3, -2, dt.min + 1, 17, 31, 64, 6] if dt.kind == 'i' else [250, 128, 17, 31, 64, 6, 10, 11, 12, 13, 14, 15]
    return np.array([x % (1 << dt.bits) for x in v], np.uint64).astype(dt.np)   # wrapped into dt, as numeric.wrap_const
  vals = {dt: ints(dt) for dt in dtypes.ints}
  vals.update({dt: rng.standard_normal(24) * 3 for dt in dtypes.floats})
  vals[dtypes.bool] = np.array([0, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 1] * 2)
  unary = [Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.RECIPROCAL, Ops.SIN, Ops.TRUNC]
  binary = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR,
            Ops.SHL, Ops.SHR, Ops.FLOORDIV, Ops.FLOORMOD, Ops.POW]
  def ok(op, dt):
    if op in (Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.SIN, Ops.RECIPROCAL, Ops.FDIV): return dt.is_float()
    if op in (Ops.AND, Ops.OR, Ops.XOR, Ops.IDIV, Ops.MOD): return not dt.is_float()
    if op in (Ops.SHL, Ops.SHR, Ops.FLOORDIV, Ops.FLOORMOD): return dt.is_int()
    if op is Ops.POW: return dt != dtypes.bool
    return True
  out = []
  def buf(S, data, d):
    b = new_buffer(len(data), d, "CPU"); S.set_data(b, np.asarray(data).astype(d.np)); return b
  for dt, v in vals.items():
    S = Storage()
    a, b = buf(S, v, dt).reshape((4, 6)), buf(S, np.roll(v, 5), dt).reshape((4, 6))
    roots = [Node(op, None, (a,)) for op in unary if ok(op, dt)]
    roots += [Node(op, None, (a, b)) for op in binary if ok(op, dt)]
    roots.append(Node(Ops.WHERE, None, (Node(Ops.CMPLT, None, (a, b)), a, b)))
    cv = np.clip(v, -100, 100) if dt.is_float() else v
    c = buf(S, cv, dt).reshape((4, 6))
    roots += [c.cast(to) for to in vals if to != dt]
    roots += [Node(Ops.BITCAST, to, (Node(Ops.ADD, None, (a, a)),)) for to in vals
              if to != dt and to.itemsize == dt.itemsize and dtypes.bool not in (to, dt)]
    out.append((f"alu_{dt.name}", [r.contiguous() for r in roots], S))
  S = Storage()
  x, k = (buf(S, rng.integers(0, 2**64, 256, np.uint64, endpoint=False), dtypes.uint64) for _ in range(2))
  out.append(("threefry", [Node(Ops.THREEFRY, dtypes.uint64, (x, k)).contiguous()], S))
  for dt in (dtypes.int8, dtypes.uint8, dtypes.bfloat16, dtypes.float64, dtypes.float16, dtypes.uint64):
    S = Storage()
    data = rng.standard_normal(8 * 300) + 0.3 if dt.is_float() else rng.integers(-200, 200, 8 * 300).astype(np.uint64).astype(dt.np)
    x = buf(S, data, dt).reshape((8, 300))
    roots = [Node(Ops.REDUCE, None, (x,), (rop, (1,))) for rop in (Ops.ADD, Ops.MAX)]
    roots += [Node(Ops.REDUCE, None, (x.reshape((8, 30, 10)),), (Ops.MUL, (2,))), Node(Ops.REDUCE, None, (x,), (Ops.ADD, (0,)))]
    out.append((f"reduce_{dt.name}", [r.contiguous() for r in roots], S))
  return out

@contextlib.contextmanager
def host_rand():
  """Tensor.rand draws from numpy here: the inputs' values do not matter to the kernels under test, and the Threefry
  graph would otherwise have to run natively on the CPU (LLVM) before the CUDA corpus could be built."""
  from egraph import Tensor
  from egraph.ir.dtype import dtypes
  saved, gen = Tensor.__dict__["rand"], np.random.default_rng(1234)
  def rand(*shape, dtype=None, device=None):
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return Tensor(gen.random(shape).astype(np.float32), dtype or dtypes.float32, device).contiguous()
  Tensor.rand = staticmethod(rand)
  try: yield
  finally: Tensor.rand = saved

def corpus(random: int = 24, graphs: int = 16) -> list[Case]:
  """The CUDA test corpus (see the module docstring); `random`/`graphs`: how many hypothesis programs of each kind."""
  with host_rand(): return _corpus(random, graphs)

def _corpus(random: int, graphs: int) -> list[Case]:
  from egraph import callify
  from egraph.frontend.models import MODELS
  from egraph.ir.storage import STORAGE
  cases = []
  for name in sorted(MODELS):
    out, _ = MODELS[name]()
    cases.append(Case(f"model_{name}", callify(out).call, STORAGE.copy()))
  for name, f in _tensor_cases():
    cases.append(Case(f"tensor_{name}", callify(*f()).call, STORAGE.copy()))
  for name, roots, S in _alu_cases():
    cases.append(Case(name, callify(*roots).call, S))
  if graphs:
    from rules.testing.strategies import graphs as G
    for i, g in enumerate(_draw_many(G(dtype=None), graphs)):
      cases.append(Case(f"graphs_{i}", callify(*g.roots).call, g.storage))
  if random:
    sys.path.insert(0, os.path.join(ROOT, "tests", "lower"))
    try: from test_llvm_random import programs
    finally: sys.path.remove(os.path.join(ROOT, "tests", "lower"))
    for i, (roots, S) in enumerate(_draw_many(programs(), random)):
      cases.append(Case(f"random_{i}", callify(*roots).call, S))
  return cases

def tolerance(dtype: str) -> tuple[float, float]:
  """(rtol, atol) for comparing a GPU/emulated buffer with the numpy reference."""
  return {"float16": (2e-3, 2e-3), "bfloat16": (1e-2, 1e-2), "float32": (1e-4, 1e-5), "float64": (1e-9, 1e-12),
          # fp8: one ulp (a libm ulp may move the rounding), a subnormal step near 0
          "fp8e4m3": (0.13, 2.0 ** -9), "fp8e4m3fnuz": (0.13, 2.0 ** -10), "fp8e5m2": (0.26, 2.0 ** -16),
          "fp8e5m2fnuz": (0.26, 2.0 ** -17)}.get(dtype, (0.0, 0.0))

def bench_cases() -> list:
  """CALLs whose inputs the GPU machine generates: elementwise bandwidth and a tiled matmul."""
  from egraph.ir.dtype import dtypes
  from egraph.ir.ops import Node, Ops, new_buffer, ParamArg, CallInfo
  from egraph.ir.ops import const
  def P(slot, shape): return Node(Ops.PARAM, dtypes.float32, (), ParamArg(slot, shape, "CUDA"))
  def call(body, *args): return Node(Ops.CALL, dtypes.void, (body, *args), CallInfo())
  n = 1 << 26
  o, a, b = P(0, (n,)), P(1, (n,)), P(2, (n,))
  v = Node(Ops.SUB, None, (Node(Ops.MUL, None, (Node(Ops.ADD, None, (a, b)), a)), const(1.0, dtypes.float32, "CUDA").reshape((1,)).expand((n,))))
  ew = call(o.after(o.store(v)).sink(), *(new_buffer(n, dtypes.float32, "CUDA") for _ in range(3)))
  m = 2048
  c, x, y = P(0, (m, m)), P(1, (m, m)), P(2, (m, m))
  prod = Node(Ops.MUL, None, (x.reshape((m, m, 1)).expand((m, m, m)), y.reshape((1, m, m)).expand((m, m, m))))
  mm = Node(Ops.REDUCE, None, (prod,), (Ops.ADD, (1,))).reshape((m, m))
  mmc = call(c.after(c.store(mm)).sink(), *(new_buffer(m * m, dtypes.float32, "CUDA") for _ in range(3)))
  return [("bandwidth_elementwise", ew, {"bytes": 12 * n}), ("matmul_2048", mmc, {"flops": 2 * m ** 3})]

def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=os.path.join(ROOT, "bench", "gpu_corpus"))
  ap.add_argument("--random", type=int, default=24)
  ap.add_argument("--graphs", type=int, default=16)
  args = ap.parse_args(argv)
  from lower.render.cuda import render as cuda
  from lower.reference import evaluate
  cases = corpus(args.random, args.graphs)
  benches = bench_cases()
  lows = cuda.plans([c.call for c in cases] + [b[1] for b in benches])
  os.makedirs(os.path.join(args.out, "cases"), exist_ok=True)
  for f in os.listdir(os.path.join(args.out, "cases")): os.remove(os.path.join(args.out, "cases", f))
  with open(os.path.join(args.out, "corpus.cu"), "w") as f: f.write(lows[0].plan["source"])
  manifest = {"kernels": lows[0].plan["kernels"], "cases": [], "bench": []}
  for c, lw in zip(cases, lows):
    ref = c.storage.copy()
    evaluate([c.call], ref)
    arrays = {}
    for name, b in lw.plan["buffers"].items():
      if b["kind"] == "tmp": continue
      n = lw.nodes[name]
      a = c.storage.get(n.arg.uid)
      arrays[f"in_{name}"] = a if a is not None else np.zeros(n.arg.size, n.dtype.np)
      if b["written"]: arrays[f"out_{name}"] = ref[n.arg.uid]
    # bfloat16 and fp8 (ml_dtypes types) would load back as raw void bytes: their bits go in as uint16 / uint8
    # (gpu_check.sh reads them)
    arrays = {k: a.view(np.uint16) if a.dtype.name == "bfloat16" else a.view(np.uint8) if a.dtype.name.startswith("float8")
              else a for k, a in arrays.items()}
    np.savez_compressed(os.path.join(args.out, "cases", c.name + ".npz"), **arrays)
    plan = {k: v for k, v in lw.plan.items() if k not in ("source", "kernels")}
    manifest["cases"].append({"name": c.name, "plan": plan,
                              "tolerance": {n: tolerance(b["dtype"]) for n, b in plan["buffers"].items() if b["kind"] != "tmp"}})
  for (name, _, extra), lw in zip(benches, lows[len(cases):]):
    plan = {k: v for k, v in lw.plan.items() if k not in ("source", "kernels")}
    manifest["bench"].append({"name": name, "plan": plan, **extra})
  with open(os.path.join(args.out, "manifest.json"), "w") as f: json.dump(manifest, f, indent=1)
  total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(args.out) for fn in fns)
  print(f"{len(cases)} cases + {len(benches)} benchmarks, {len(manifest['kernels'])} kernels, {total / 1024:.0f} KiB in {args.out}")
  return 0

if __name__ == "__main__":
  sys.exit(main())
