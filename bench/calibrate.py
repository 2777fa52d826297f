"""Calibrate egraph/fusion/timemodel.py on this machine through callsat's own lowering: small CALLs (callify + run_call on
device CPU), each kernel timed alone on warm buffers (lower/schedule/work.step_seconds: back-to-back runs per sample, medians),
its KernelWork read off the Program (lower/schedule/work.py). Writes the constants to egraph/fusion/timemodel.json.

  launch        a 64-element add                                   -> launch_s
  bandwidth     a + b at 12 MB (in L3) and 6x the L3 (DRAM)         -> bw_cache, bw_mem (cache_bytes: the L3)
  transpose     a 2048^2 transpose copy (strided reads)             -> bw_strided
  elementwise   64 multiply-adds per element, 256K floats           -> throughput[elementwise] (and copy: no ops)
  exp           8 independent exps per element, 256K floats         -> transcendental_ops (in elementwise ops)
  reduce        max-plus product 192^3 (a reduce lower/ cannot tile) -> throughput[reduce]
  matmul        512^3 float32 (the register-tiled form)             -> throughput[matmul]
  threads       the elementwise kernel forced onto one thread       -> par_speedup
  readback      a 16 MB value stored (streamed out), then row-summed: -> bw_readback
                the row sum timed as the program runs it (lower/schedule/work.sequence_seconds), not alone (alone it finds the
                value in the cache: 0.13 ms against 0.45-0.5 ms in its program)
Then "max" vs "sum" is chosen by the log error over every calibration kernel (mixed ones included).

  python bench/calibrate.py [--rounds 5] [--out egraph/fusion/timemodel.json]"""
from __future__ import annotations
import argparse, json, math, os, platform, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from egraph import Tensor, callify
from egraph.fusion.timemodel import DATA, TimeModel
from lower.device import cache
from lower.device import native
from lower.schedule.work import program_work, sequence_seconds, step_seconds

def chain(x, n: int):
  for _ in range(n): x = x * 1.0001 + 0.5
  return x

def exps(x, n: int):
  """n independent exps of x per element, summed."""
  out = (x * 0.5).exp()
  for i in range(1, n): out = out + (x * (0.5 + 0.01 * i)).exp()
  return out

def kernels(rng, T=Tensor) -> dict:
  """name -> a Tensor whose CALL is one kernel (the calibration set; the 'mixed' ones only check the fit). `T`: the
  Tensor class (tinygrad's, for bench/calibrate_tinygrad.py: the same programs)."""
  f = lambda *s: T(rng.standard_normal(s).astype(np.float32)).realize()
  s64, s256k, s1m, s4m = f(64), f(1 << 18), f(1 << 20), f(1 << 22)
  b64, b1m = f(64), f(1 << 20)
  # DRAM: a + b moving 6x the L3 (192 MB with 32 MB). At 48 MB (1.5x the L3, the first calibrations) back-to-back runs
  # found part of it in cache: 78 GB/s, where reduces reading a just-stored 16 MB value in a program got 30-45 GB/s
  n_mem = max(1 << 22, 2 * l3_bytes() // 4)
  m1, m2 = f(n_mem), f(n_mem)
  A, B, M, N = f(512, 512), f(512, 512), f(192, 192), f(192, 192)
  X = f(2048, 2048)
  return {
    "launch": s64 + b64, "bw_cache": s1m + b1m, "bw_mem": m1 + m2, "ew": chain(s256k, 64), "exp": exps(s256k, 8),
    "transpose": X.transpose(1, 0).contiguous(),
    "reduce": (M.reshape(192, 192, 1) + N.reshape(1, 192, 192)).max(axis=1), "matmul": A @ B,
    "mixed: chain 8 at 4M": chain(s4m, 8), "mixed: chain 24 at 4M": chain(s4m, 24), "mixed: row sum 2048^2": X.sum(axis=1),
    "mixed: column sum 2048^2": X.sum(axis=0), "mixed: exp 4 at 256K": exps(s256k, 4),
    "div": (lambda x: x / (x * x + 1).sqrt())(f(1 << 20)), "mixed: exp at 4M": s4m.exp(), "mixed: chain 64 at 4K": chain(f(4096), 64),
    "mixed: matmul 128^3": f(128, 128) @ f(128, 128),
    "mixed: max-plus 64^3": (f(64, 64).reshape(64, 64, 1) + f(64, 64).reshape(1, 64, 64)).max(axis=1),
  }

def readback(rng) -> Tensor:
  """Two kernels: a 2048^2 float32 value (16 MB >= timemodel.STREAM_BYTES: written with streaming stores), then its
  row sum, which reads it back from DRAM."""
  t = (Tensor(rng.standard_normal((2048, 2048)).astype(np.float32)).realize() * 1.0001).contiguous()
  return t.sum(axis=1)

def l3_bytes() -> int:
  try:
    for i in range(8):
      p = f"/sys/devices/system/cpu/cpu0/cache/index{i}/"
      if open(p + "level").read().strip() == "3":
        s = open(p + "size").read().strip()
        return int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}[s[-1]] if s[-1] in "KM" else int(s)
  except OSError: pass
  return 16 << 20

def measure(calls: dict, rounds: int, stat=min) -> dict:
  """name -> `stat` over rounds (interleaved) of the single kernel's time: min by default, the machine is shared and a
  burst of another job only ever adds time (the quiet machine's speed is what ranks partitions)."""
  ts = {k: [] for k in calls}
  for _ in range(rounds):
    for k, c in calls.items(): ts[k].append(step_seconds(c, samples=3, min_s=0.005)[0])
  return {k: stat(v) for k, v in ts.items()}

def measure_readback(call, rounds: int, stat=min) -> float:
  """`stat` over rounds of the readback program's second kernel, timed in its program."""
  return stat(sequence_seconds(call, rounds=max(rounds, 10))[1])

def one_thread(call, reps: int = 5) -> float:
  """The kernel of `call` run on one thread (its prepared launch with threads=1)."""
  step_seconds(call, samples=1)
  launch = cache.CACHE.plans[call].steps[0]
  launch.threads = 1
  try: return step_seconds(call, samples=reps, min_s=0.005)[0]
  finally: launch.threads = None

def fit(works: dict, t: dict, threads_1: float, rb: tuple | None = None) -> TimeModel:
  w, L = works, t["launch"]
  ops = lambda k, d: max(t[k] - L, 1e-9)
  tp_ew = w["ew"].flops / ops("ew", t)
  tp = {"elementwise": tp_ew, "copy": tp_ew, "reduce": w["reduce"].flops / ops("reduce", t), "matmul": w["matmul"].flops / ops("matmul", t)}
  equiv = ops("exp", t) * tp_ew   # the exp kernel's time in elementwise ops
  trans = max(1.0, (equiv - w["exp"].flops) / max(1, w["exp"].transcendentals) + 1)
  divs = max(1.0, (ops("div", t) * tp_ew - w["div"].flops) / max(1, w["div"].divisions) + 1)   # compute-bound: its bytes overlap
  bw_cache = w["bw_cache"].nbytes / ops("bw_cache", t)
  base = dict(launch_s=L, bw_cache=bw_cache, bw_mem=w["bw_mem"].nbytes / ops("bw_mem", t),
              cache_bytes=l3_bytes(),
              bw_strided=w["transpose"].strided_bytes / max(1e-9, ops("transpose", t) - w["transpose"].bytes_written / bw_cache), throughput=tp,
              transcendental_ops=trans, division_ops=divs, parallel_work=native.PARALLEL_WORK,
              par_speedup=max(1.0, threads_1 / t["ew"]))
  if rb is not None: base["bw_readback"] = rb[0].dram_bytes / max(rb[1] - L, 1e-9)   # (its KernelWork, its time in sequence)
  best = None
  for comb in ("max", "sum"):
    m = TimeModel.from_dict("CPU", {**base, "combine": comb})
    err = statistics.mean(abs(math.log(m.kernel_seconds(w[k]) / t[k])) for k in t)
    if best is None or err < best[0]: best = (err, m)
  return best[1]

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--out", default=DATA)
  ap.add_argument("--stat", choices=("min", "median"), default="min", help="per kernel, over the rounds")
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  calls = {k: callify(v).call for k, v in kernels(rng).items()}
  works = {}
  for k, c in calls.items():
    ws = program_work(c)
    if len(ws) != 1: raise SystemExit(f"calibration kernel {k!r} lowered to {len(ws)} kernels, expected 1")
    works[k] = ws[0]
  load = os.getloadavg()[0]
  stat = min if args.stat == "min" else statistics.median
  t = measure(calls, args.rounds, stat)
  t1 = one_thread(calls["ew"])
  rb_call = callify(readback(rng)).call
  rb_work = program_work(rb_call)
  if len(rb_work) != 2 or not rb_work[1].dram_bytes: raise SystemExit(f"the readback program lowered to {rb_work}, expected a store then a read-back")
  rb = (rb_work[1], measure_readback(rb_call, args.rounds, stat))
  m = fit(works, t, t1, rb)
  print(f"{'kernel':<28} {'kind':<12} {'bytes':>10} {'ops':>11} {'measured us':>12} {'model us':>10}")
  for k in calls:
    print(f"{k:<28} {works[k].kind:<12} {works[k].nbytes:>10} {works[k].flops:>11} {t[k] * 1e6:>12.1f} {m.kernel_seconds(works[k]) * 1e6:>10.1f}")
  print(f"{'readback (in its program)':<28} {rb[0].kind:<12} {rb[0].nbytes:>10} {rb[0].flops:>11} "
        f"{rb[1] * 1e6:>12.1f} {m.kernel_seconds(rb[0]) * 1e6:>10.1f}")
  data = {"devices": {"CPU": m.to_dict()}, "calibration": {
    "command": f"python bench/calibrate.py --rounds {args.rounds} --stat {args.stat}", "date": time.strftime("%Y-%m-%d %H:%M"),
    "machine": f"{platform.machine()} {os.cpu_count()} CPUs, llvm threads={native.THREADS}", "load": round(load, 2),
    "kernels": {**{k: {"seconds": t[k], "kind": works[k].kind, "bytes": works[k].nbytes, "flops": works[k].flops} for k in calls},
                "readback (in its program)": {"seconds": rb[1], "kind": rb[0].kind, "bytes": rb[0].nbytes, "flops": rb[0].flops}}}}
  with open(args.out, "w") as f: json.dump(data, f, indent=1)
  print(json.dumps(data["devices"], indent=1))
  print(f"wrote {args.out}")

if __name__ == "__main__": main()
