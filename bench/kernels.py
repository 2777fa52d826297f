"""LLVM backend kernels vs numpy, in one process, contenders interleaved per round; medians.

  elementwise (a+b)*a-1 on 8M float64    vs numpy out= and the expression
  floor // and % of two 16M int32 arrays vs numpy // and % (nonzero divisors)
  elementwise (a+b)*a-1 on 16M float32   vs numpy (out= passes and the plain expression) and vs a STREAM triad
                                         (a = b + s*c, our kernel) measured in the same run; both as scheduled
                                         (non-temporal stores: Kernel.stream) and, for reference, the same kernels
                                         forced to plain stores
  row sum of 4096x4096                   vs numpy x.sum(axis=1); column sum (axis=0) and the sum of all 16M elements of
                                         a float32 vector, vs numpy (both blocked float32 sums, notes/semantics.md)
  matmul 512^3                           vs numpy A@B (OpenBLAS; both at the same thread count, checked with threadpoolctl)
  compile latency per kernel (cold: the kernel cache cleared) and on a cache hit (compiles: 0)
  tinygrad's CPU device on the same three kernels, when tinygrad and clang are installed (--no-tinygrad leaves it out)
  load average before and after (the machine is shared: read the ratios, which come from the same rounds)
  --accuracy: instead, the relative error of big float32 sums against the exact value (2e8 copies of 0.1, callsat vs
  numpy; constant tensors of 1e10-1e12 elements; sum, row/column sums of 4096x4096 uniform values), and their times

Each contender is called once untimed immediately before its timed call. Without that, a contender's time depended on
what ran before it: OpenBLAS's matmul ran right after our 1-thread matmul had pulled A and B into cache, while ours ran
after numpy's 64 MiB row sum had evicted them and with our pool thread asleep (~0.1-0.8 ms to wake): 2.2-2.6 ms for
the same kernel that takes 1.1-1.3 ms warm.

Run (OpenBLAS's CORETYPE override slows a current numpy; unset it for this command only, see the env notes):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/kernels.py --rounds 15 --out notes/benchmarks.md
  python bench/kernels.py --accuracy      (the accuracy table alone; needs ~2 GB for the 2e8-element sum)
"""
from __future__ import annotations
import argparse, datetime, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from egraph import callify, Tensor
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Node, Ops, new_buffer, const
from egraph.ir.storage import Storage
from lower.runtime import run_call
from lower.device import llvmjit
from lower.render.llvm import matmul
from lower.device import native
from lower.device.cache import CACHE

def timeit(f) -> float:
  t0 = time.perf_counter(); f(); return (time.perf_counter() - t0) * 1e3

def buf(S, a):
  b = new_buffer(a.size, dtypes.from_numpy(a.dtype), "CPU"); S.set_data(b, a.reshape(-1)); return b

def cst(v, shape, dt=dtypes.float32): return const(v, dt, "CPU").reshape((1,) * len(shape)).expand(shape)

def blas_info() -> str:
  try:
    from threadpoolctl import threadpool_info
    i = [x for x in threadpool_info() if x["user_api"] == "blas"][0]
    return f"{i['internal_api']} {i['version']} {i['architecture']} threads={i['num_threads']}"
  except Exception as e: return f"threadpoolctl unavailable ({e}); OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}"

def tinygrad_contenders(a_np, b_np, x_np, A_np, B_np, threads: int) -> tuple[dict, str]:
  """tinygrad's CPU device (clang renderer, NUM_CPU_THREADS=threads) on the same arrays, replayed through TinyJit so
  that only its kernels and launch path are timed; ({}, why) when tinygrad or clang is missing."""
  import shutil
  if shutil.which("clang") is None: return {}, "tinygrad column skipped: no clang on PATH (tinygrad's CPU device needs it)"
  os.environ["DEV"], os.environ["NUM_CPU_THREADS"] = "CPU", str(threads)
  try:
    from tinygrad import Tensor, TinyJit, Device
  except ImportError as e: return {}, f"tinygrad column skipped: {e}"
  dev = Device[Device.DEFAULT]
  a, b, x, A, B = (Tensor(v).realize() for v in (a_np, b_np, x_np, A_np, B_np))
  jits = {"ew": TinyJit(lambda a, b: ((a + b) * a - 1).realize()), "rowsum": TinyJit(lambda x: x.sum(axis=1).realize()),
          "matmul": TinyJit(lambda A, B: (A @ B).realize())}
  args = {"ew": (a, b), "rowsum": (x,), "matmul": (A, B)}
  ref = {"ew": (a_np + b_np) * a_np - 1, "rowsum": x_np.sum(axis=1), "matmul": A_np @ B_np}
  def run(k):
    r = jits[k](*args[k]); dev.synchronize(); return r
  for k in jits:   # capture the JIT (it records on the second call) and check the values once
    for _ in range(3): r = run(k)
    np.testing.assert_allclose(r.numpy(), ref[k], rtol=1e-3, atol=1e-3)
  from importlib.metadata import version
  ver = version("tinygrad")
  return {f"{k} tinygrad": (lambda k=k: run(k)) for k in jits}, f"tinygrad {ver} DEV=CPU (clang), NUM_CPU_THREADS={threads}, TinyJit replay"

def accuracy() -> str:
  """A markdown table: relative errors of big float32 sums (callsat CPU, numpy) against the exact float64 value."""
  rows = ["| sum | callsat rel. error | numpy rel. error | callsat realize, ms |", "|---|---|---|---|"]
  def row(name, x, t, exact, axis=None):
    t.sum(axis=axis).numpy()   # compile and warm
    t0 = time.perf_counter(); got = t.sum(axis=axis).numpy(); ms = (time.perf_counter() - t0) * 1e3
    err = lambda v: f"{float(np.max(np.abs(np.asarray(v, np.float64) - exact) / np.abs(exact))):.1e}"
    rows.append(f"| {name} | {err(got)} | "
                f"{err(x.sum(axis=axis)) if x is not None else 'not run (np.broadcast_to sums ~1e9 elements/s)'} | {ms:.1f} |")
  x = np.full(2 * 10 ** 8, 0.1, np.float32)
  row("2e8 x 0.1 (800 MB)", x, Tensor(x).realize(), float(np.float32(0.1)) * x.size)
  del x
  for n in (10 ** 10, 10 ** 11, 10 ** 12):
    shape = (n // 10 ** 6, 10 ** 6)
    row(f"Tensor.full({shape}, 0.1), {n:.0e} elements", np.broadcast_to(np.float32(0.1), shape) if n <= 10 ** 10 else None,
        Tensor.full(shape, 0.1), float(np.float32(0.1)) * n)
  u = np.random.default_rng(0).random((4096, 4096), dtype=np.float32)
  t = Tensor(u).realize()
  row("4096x4096 uniform, all", u, t, u.astype(np.float64).sum())
  row("4096x4096 uniform, rows (axis=1)", u, t, u.astype(np.float64).sum(axis=1), 1)
  row("4096x4096 uniform, columns (axis=0)", u, t, u.astype(np.float64).sum(axis=0), 0)
  return "\n".join(rows)

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=15)
  ap.add_argument("--out", default=None)
  ap.add_argument("--n", type=int, default=16 * 1024 * 1024)
  ap.add_argument("--no-tinygrad", action="store_true", help="leave tinygrad's CPU device out")
  ap.add_argument("--accuracy", action="store_true", help="only the accuracy table of big float32 sums")
  args = ap.parse_args()
  if args.accuracy: print(accuracy()); return
  load0 = os.getloadavg()
  rng = np.random.default_rng(0)
  S = Storage()
  N = args.n
  a_np, b_np = rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
  a, b = buf(S, a_np), buf(S, b_np)
  ew = callify(Node(Ops.SUB, None, (Node(Ops.MUL, None, (Node(Ops.ADD, None, (a, b)), a)), cst(1.0, (N,)))))
  triad = callify(Node(Ops.ADD, None, (b, Node(Ops.MUL, None, (a, cst(3.0, (N,)))))))
  N64, NI = N // 2, N
  a64_np, b64_np = rng.standard_normal(N64), rng.standard_normal(N64)
  a64, b64 = buf(S, a64_np), buf(S, b64_np)
  ew64 = callify(Node(Ops.SUB, None, (Node(Ops.MUL, None, (Node(Ops.ADD, None, (a64, b64)), a64)), cst(1.0, (N64,), dtypes.float64))))
  xi_np = rng.integers(-2 ** 31, 2 ** 31, NI, dtype=np.int32)
  yi_np = rng.integers(-1000, 1000, NI, dtype=np.int32); yi_np[yi_np == 0] = 7
  xi, yi = buf(S, xi_np), buf(S, yi_np)
  idiv = callify(Node(Ops.FLOORDIV, None, (xi, yi)), Node(Ops.FLOORMOD, None, (xi, yi)))
  R = 4096
  x_np = rng.standard_normal((R, R), dtype=np.float32)
  x = buf(S, x_np).reshape((R, R))
  rs = callify(Node(Ops.REDUCE, None, (x,), (Ops.ADD, (1,))))
  cs = callify(Node(Ops.REDUCE, None, (x,), (Ops.ADD, (0,))))
  fs = callify(Node(Ops.REDUCE, None, (a,), (Ops.ADD, (0,))))
  M = 512
  A_np, B_np = rng.standard_normal((M, M), dtype=np.float32), rng.standard_normal((M, M), dtype=np.float32)
  A, B = buf(S, A_np).reshape((M, M)), buf(S, B_np).reshape((M, M))
  prod = Node(Ops.MUL, None, (A.reshape((M, 1, M)).expand((M, M, M)), B.permute((1, 0)).reshape((1, M, M)).expand((M, M, M))))
  mm = callify(Node(Ops.REDUCE, None, (prod,), (Ops.ADD, (2,))).reshape((M, M)))

  # compile latency: cold (cache cleared), per kernel, each compiled alone; then a cache hit
  from lower.schedule.kernelize import kernelize
  from lower.schedule.mem import arg_binding as _arg_binding
  llvmjit.llvm_setup()
  cold = {}
  for name, res in [("elementwise", ew), ("row sum", rs), ("matmul (tiled)", mm), ("triad", triad)]:
    ks = [s.kernel for s in kernelize(res.call.src[0], _arg_binding(res.call)[0]).steps if s.kernel]
    ts = []
    for _ in range(5):
      CACHE.clear()
      ts.append(timeit(lambda: CACHE.get(ks)))
    cold[name] = (statistics.median(ts[1:]), len(ks))
  cold["matmul helpers (packing, edge: once per process)"] = (matmul.mm_helpers()[1], 4)   # paid by the first matmul compile
  CACHE.clear()
  for res in (ew, triad, rs, cs, fs, mm, ew64, idiv): run_call(res.call, S)        # warm: schedule + compile once
  c0 = CACHE.compiled
  hit = statistics.median([timeit(lambda: CACHE.get([s.kernel for s in kernelize(ew.call.src[0], _arg_binding(ew.call)[0]).steps]))
                           for _ in range(5)])
  hit_compiles = CACHE.compiled - c0

  from dataclasses import replace
  def plain_stores(res):
    """The single kernel of `res` with stream=False (plain stores), launched directly on the same buffers."""
    bind, bufs = _arg_binding(res.call)
    (s,) = kernelize(res.call.src[0], bind).steps
    assert s.kernel.stream, "expected a streaming kernel"
    c = CACHE.get([replace(s.kernel, stream=False)])[0]
    ptrs = [S[bufs[m.root[1]]].ctypes.data + m.off for m in s.mems]
    return lambda: native.launch(c, ptrs, s.work)
  ew_plain, triad_plain = plain_stores(ew), plain_stores(triad)

  out_t, out64 = np.empty(N, np.float32), np.empty(N64)
  def np_out64(): np.add(a64_np, b64_np, out=out64); np.multiply(out64, a64_np, out=out64); np.subtract(out64, 1, out=out64)
  def np_out(): np.add(a_np, b_np, out=out_t); np.multiply(out_t, a_np, out=out_t); np.subtract(out_t, 1, out=out_t)
  def one_thread(call):
    old = native.THREADS; native.THREADS = 1
    try: run_call(call, S)
    finally: native.THREADS = old
  def blas():   # OpenBLAS's threads spin after a call and take the second core: let them sleep before the next contender
    A_np @ B_np
  contenders = {
    "ew llvm": lambda: run_call(ew.call, S), "ew llvm plain": ew_plain, "triad llvm": lambda: run_call(triad.call, S),
    "triad llvm plain": triad_plain, "ew llvm 1t": lambda: one_thread(ew.call), "ew numpy out=": np_out,
    "ew numpy expr": lambda: (a_np + b_np) * a_np - 1,
    "ew64 llvm": lambda: run_call(ew64.call, S), "ew64 numpy out=": np_out64,
    "ew64 numpy expr": lambda: (a64_np + b64_np) * a64_np - 1,
    "idiv llvm": lambda: run_call(idiv.call, S), "idiv numpy": lambda: (xi_np // yi_np, xi_np % yi_np),
    "rowsum llvm": lambda: run_call(rs.call, S), "rowsum numpy": lambda: x_np.sum(axis=1),
    "colsum llvm": lambda: run_call(cs.call, S), "colsum numpy": lambda: x_np.sum(axis=0),
    "sum llvm": lambda: run_call(fs.call, S), "sum numpy": lambda: a_np.sum(),
    "matmul llvm": lambda: run_call(mm.call, S), "matmul llvm 1t": lambda: one_thread(mm.call), "matmul numpy": blas,
  }
  tg, tg_note = (({}, "tinygrad column skipped (--no-tinygrad)") if args.no_tinygrad
                 else tinygrad_contenders(a_np, b_np, x_np, A_np, B_np, native.THREADS))
  contenders.update(tg)
  times = {k: [] for k in contenders}
  for _ in range(args.rounds):
    for k, f in contenders.items():
      f()   # untimed, right before: every contender starts with its own operands cached and its threads awake
      times[k].append(timeit(f))
    time.sleep(0.3)   # OpenBLAS threads stop spinning before the next round's first contender
  med = {k: statistics.median(v) for k, v in times.items()}
  # correctness of what was timed
  np.testing.assert_allclose(S[ew.buffer_map[next(iter(ew.buffer_map))].base if False else ew.call.src[1]], (a_np + b_np) * a_np - 1, rtol=1e-6)
  np.testing.assert_allclose(S[rs.call.src[1]], x_np.sum(axis=1), rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(S[cs.call.src[1]], x_np.sum(axis=0), rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(S[fs.call.src[1]], a_np.astype(np.float64).sum(), rtol=0, atol=1e-7 * float(np.abs(a_np).sum()))
  np.testing.assert_array_equal(S[ew64.call.src[1]], (a64_np + b64_np) * a64_np - 1)
  outs = {S[x].tobytes() for x in idiv.call.src[1:]}
  assert {(xi_np // yi_np).tobytes(), (xi_np % yi_np).tobytes()} <= outs, "floor // and % differ from numpy"
  np.testing.assert_allclose(S[mm.call.src[1]].reshape(M, M), A_np @ B_np, rtol=1e-3, atol=1e-3)

  load1 = os.getloadavg()
  gbs = lambda nbytes, ms: nbytes / ms / 1e6
  triad_bw = gbs(12 * N, med["triad llvm"])
  triad_plain_bw = gbs(12 * N, med["triad llvm plain"])
  ew_bw = gbs(12 * N, med["ew llvm"])
  gfl = lambda ms: 2 * M ** 3 / ms / 1e6
  cpu, _ = llvmjit.host_cpu()
  lines = [f"## LLVM backend kernels ({datetime.date.today().isoformat()})", "",
           f"`{'env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ' if 'OPENBLAS_CORETYPE' not in os.environ else ''}python bench/kernels.py "
           f"--rounds {args.rounds}" + (f" --out {args.out}" if args.out else "") + f"` — medians of {args.rounds} interleaved rounds in one "
           f"process, ms; host CPU `{cpu}`, llvm threads={native.THREADS}; BLAS: {blas_info()}; load average (1/5/15 min) "
           f"before {'/'.join(f'{x:.2f}' for x in load0)}, after {'/'.join(f'{x:.2f}' for x in load1)}.", "",
           "| kernel | llvm | reference | ratio (ref / llvm) | note |", "|---|---|---|---|---|",
           f"| elementwise (a+b)*a-1, 16M f32 | {med['ew llvm']:.2f} ({ew_bw:.1f} GB/s) | "
           f"numpy out=: {med['ew numpy out=']:.2f}; expr: {med['ew numpy expr']:.2f} | "
           f"{med['ew numpy out='] / med['ew llvm']:.2f}x / {med['ew numpy expr'] / med['ew llvm']:.2f}x | 1 thread {med['ew llvm 1t']:.2f}; "
           f"{100 * ew_bw / triad_bw:.0f}% of triad |",
           f"| elementwise (a+b)*a-1, 8M f64 | {med['ew64 llvm']:.2f} ({gbs(24 * N64, med['ew64 llvm']):.1f} GB/s) | numpy out=: "
           f"{med['ew64 numpy out=']:.2f}; expr: {med['ew64 numpy expr']:.2f} | {med['ew64 numpy out='] / med['ew64 llvm']:.2f}x / "
           f"{med['ew64 numpy expr'] / med['ew64 llvm']:.2f}x | |",
           f"| floor // and %, 16M int32 | {med['idiv llvm']:.2f} | numpy // and %: {med['idiv numpy']:.2f} | "
           f"{med['idiv numpy'] / med['idiv llvm']:.2f}x | two kernels (one each), vector division in doubles |",
           f"| STREAM triad a=b+s*c, 16M f32 | {med['triad llvm']:.2f} ({triad_bw:.1f} GB/s) | | | 12 B/elem, same run, NT stores |",
           f"| elementwise, plain stores | {med['ew llvm plain']:.2f} ({gbs(12 * N, med['ew llvm plain']):.1f} GB/s) | | | "
           f"{100 * gbs(12 * N, med['ew llvm plain']) / triad_plain_bw:.0f}% of plain-store triad |",
           f"| STREAM triad, plain stores | {med['triad llvm plain']:.2f} ({triad_plain_bw:.1f} GB/s) | | | |",
           f"| row sum 4096x4096 f32 | {med['rowsum llvm']:.2f} ({gbs(4 * R * R, med['rowsum llvm']):.1f} GB/s) | numpy: {med['rowsum numpy']:.2f} | "
           f"{med['rowsum numpy'] / med['rowsum llvm']:.2f}x | |",
           f"| column sum 4096x4096 f32 | {med['colsum llvm']:.2f} ({gbs(4 * R * R, med['colsum llvm']):.1f} GB/s) | numpy: "
           f"{med['colsum numpy']:.2f} | {med['colsum numpy'] / med['colsum llvm']:.2f}x | |",
           f"| sum of 16M f32 | {med['sum llvm']:.2f} ({gbs(4 * N, med['sum llvm']):.1f} GB/s) | numpy: {med['sum numpy']:.2f} | "
           f"{med['sum numpy'] / med['sum llvm']:.2f}x | partial sums, then one |",
           f"| matmul 512^3 f32 | {med['matmul llvm']:.2f} ({gfl(med['matmul llvm']):.0f} GFLOPS) | numpy: {med['matmul numpy']:.2f} "
           f"({gfl(med['matmul numpy']):.0f} GFLOPS) | {med['matmul numpy'] / med['matmul llvm']:.2f}x | 1 thread {med['matmul llvm 1t']:.2f} "
           f"({gfl(med['matmul llvm 1t']):.0f} GFLOPS) |", ""]
  if tg:
    lines += [f"{tg_note}, same rounds (ratio: tinygrad / llvm, higher means llvm is faster):", "",
              "| kernel | llvm | tinygrad CPU | ratio |", "|---|---|---|---|"]
    lines += [f"| {name} | {med[k + ' llvm']:.2f} | {med[k + ' tinygrad']:.2f} | {med[k + ' tinygrad'] / med[k + ' llvm']:.2f}x |"
              for k, name in (("ew", "elementwise (a+b)*a-1, 16M f32"), ("rowsum", "row sum 4096x4096"), ("matmul", "matmul 512^3"))]
    lines.append("")
  else: lines += [tg_note, ""]
  lines += ["| compile (cold, kernel alone) | ms | kernels |", "|---|---|---|"]
  lines += [f"| {k} | {v[0]:.1f} | {v[1]} |" for k, v in cold.items()]
  lines += [f"| cache hit (elementwise: schedule + lookup) | {hit:.2f} | compiles: {hit_compiles} |", ""]
  text = "\n".join(lines)
  print(text)
  if args.out:
    with open(args.out, "a") as f: f.write("\n" + text + "\n")

if __name__ == "__main__": main()
