#!/usr/bin/env bash
# bench/gpu_check.sh [--dry-run]: compile and run the pre-rendered CUDA corpus (bench/gpu_corpus/, made by
# bench/make_gpu_corpus.py on a machine with egglog) on GPU 0 with numpy + ctypes only, compare every written buffer with
# the numpy reference, then measure elementwise bandwidth against the card's peak and a tiled matmul's GFLOPS.
#   --dry-run  no GPU needed: nvcc --ptx and -cubin (ptxas) for sm_90, check every case's files against its plan, and run
#              the corpus on the CPU emulator (lower/device/cuda_emu.h, needs g++) through the same plan executor.
# Needs: python3 with numpy, nvcc (PATH or /usr/local/cuda/bin), and for the real run the NVIDIA driver (libcuda.so.1).
# Stops after 290 s. Exit status 0 only when every case matches.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
exec timeout 290 python3 - "$@" <<'PY'
import json, os, sys, time
import numpy as np
sys.path.insert(0, os.getcwd())
from lower.device import cuda_driver as drv      # numpy + ctypes only: no egglog, no callsat front end
from egraph.ir.dtype import dtypes            # numpy + ml_dtypes: the fp8 buffers' host types

dry = "--dry-run" in sys.argv[1:]
D = os.path.join("bench", "gpu_corpus")
man = json.load(open(os.path.join(D, "manifest.json")))
src = open(os.path.join(D, "corpus.cu")).read()
print(f"corpus: {len(man['cases'])} cases, {len(man['bench'])} benchmarks, {len(man['kernels'])} kernels, {len(src)} bytes of CUDA")
nvcc = drv.nvcc_path()
print("nvcc:", nvcc or "NOT FOUND")

def plan_of(entry):
  return {**entry["plan"], "source": src, "kernels": man["kernels"]}

def check_files(c):
  """The case's .npz holds in_<buf> for every non-temporary buffer (right byte size) and out_<buf> for written ones."""
  z = np.load(os.path.join(D, "cases", c["name"] + ".npz"))
  for name, b in c["plan"]["buffers"].items():
    if b["kind"] == "tmp": continue
    a = z[f"in_{name}"]
    # bfloat16 and fp8 travel as their bits (numpy has no such dtypes)
    want = "uint16" if b["dtype"] == "bfloat16" else "uint8" if b["dtype"].startswith("fp8") else b["dtype"]
    assert a.nbytes == b["nbytes"] and a.dtype.name == want, (c["name"], name, a.dtype, a.nbytes, b)
    if b["written"]: assert z[f"out_{name}"].shape == a.shape, (c["name"], name)
  return z

def bf16(bits):
  return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)

def run_cases(backend, label):
  t0, bad = time.perf_counter(), []
  mod = backend.load(plan_of(man["cases"][0]))
  print(f"{label}: module loaded in {time.perf_counter() - t0:.2f} s")
  for c in man["cases"]:
    z = check_files(c)
    arrays = {n: z[f"in_{n}"].copy() for n, b in c["plan"]["buffers"].items() if b["kind"] != "tmp"}
    try: drv.execute(plan_of(c), arrays, backend, mod)
    except Exception as e: bad.append((c["name"], f"{type(e).__name__}: {e}")); continue
    for n, b in c["plan"]["buffers"].items():
      if b["kind"] == "tmp" or not b["written"]: continue
      got, want = arrays[n], z[f"out_{n}"]
      if b["dtype"] == "bfloat16": got, want = (bf16(x) for x in (got, want))
      if b["dtype"].startswith("fp8"): got, want = (x.view(dtypes.from_any(b["dtype"]).np).astype(np.float32) for x in (got, want))
      rt, at = c["tolerance"][n]
      ok = np.allclose(got, want, rtol=rt, atol=at, equal_nan=True) if want.dtype.kind == "f" else np.array_equal(got, want)
      if not ok:
        err = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))
        bad.append((c["name"], f"buffer {n} ({b['dtype']}): max abs error {err:.3g}"))
  n = len(man["cases"])
  print(f"{label}: {n - len({b[0] for b in bad})}/{n} cases match the numpy reference ({time.perf_counter() - t0:.1f} s)")
  for name, msg in bad: print(f"  MISMATCH {name}: {msg}")
  return not bad

ok = True
if nvcc:
  t0 = time.perf_counter()
  ptx = drv.nvcc_ptx(src, "sm_90")
  print(f"nvcc --ptx -arch=sm_90: {ptx.count('.entry ')}/{len(man['kernels'])} kernels in {time.perf_counter() - t0:.1f} s")
  ok &= ptx.count(".entry ") == len(man["kernels"])
if dry:
  if nvcc:
    t0 = time.perf_counter(); drv.nvcc_cubin(src, "sm_90")
    print(f"nvcc -cubin -arch=sm_90 (ptxas): ok in {time.perf_counter() - t0:.1f} s")
  for c in man["cases"]: check_files(c)
  print(f"case files: {len(man['cases'])} consistent with their plans")
  try: ok &= run_cases(drv.Emulator(), "CPU emulator")
  except drv.CudaUnavailable as e: print("CPU emulator skipped:", e)
  print("DRY RUN", "OK" if ok else "FAILED"); sys.exit(0 if ok else 1)

dev = drv.CudaDevice()
print(f"GPU: {dev.name} ({dev.arch}), peak DRAM bandwidth from the driver's clock x bus width: {dev.peak_bandwidth() / 1e12:.2f} TB/s")
ok &= run_cases(dev, "GPU")

for bcase in man["bench"]:
  plan = plan_of(bcase)
  mod = dev.load(plan)
  mem = {n: dev.alloc(b["nbytes"]) for n, b in plan["buffers"].items()}
  rng = np.random.default_rng(0)
  for n, b in plan["buffers"].items():
    if b["kind"] != "tmp" and not b["written"]: dev.upload(mem[n], rng.standard_normal(b["nbytes"] // 4).astype(np.float32))
  launches = [s for s in plan["steps"] if s["op"] == "launch"]
  t = 0.0
  for s in launches: t += dev.time_launch(mod, s["kernel"], s["grid"], s["block"], [mem[b] + o for b, o in s["args"]])
  if "bytes" in bcase:
    bw = bcase["bytes"] / t
    print(f"{bcase['name']}: {t * 1e3:.3f} ms, {bw / 1e12:.2f} TB/s = {100 * bw / dev.peak_bandwidth():.0f}% of peak "
          f"(grid {launches[0]['grid']}, block {launches[0]['block']})")
  if "flops" in bcase: print(f"{bcase['name']}: {t * 1e3:.3f} ms, {bcase['flops'] / t / 1e12:.2f} TFLOPS fp32 (no tensor cores)")
  for m in mem.values(): dev.free(m)
print("GPU CHECK", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
