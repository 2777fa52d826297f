"""The on-disk kernel cache: cold compile vs a disk hit for one module, medians in ms.

  elementwise   (a+b)*a-1 on 16M float32 (one streaming kernel)
  matmul        512^3 float32, the tiled kernel (the helpers it calls are compiled once per process, measured apart)

In process, per round and contender interleaved: compile_kernels without the disk cache (parse, verify, O3, codegen,
engine), with it on a hit (render, key, read + check, parse, engine from the cached object), and for reference the other
way to load an object (an empty module plus add_object_file). Then fresh processes: the first CACHE.get of both modules
in a new process on an empty cache directory vs on a filled one (the matmul helpers are compiled before the timer in
both: they are not in the disk cache).

Run: python bench/disk_cache.py --rounds 15 [--procs 5]
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

def graphs():
  import numpy as np
  from egraph import callify
  from egraph.ir.dtype import dtypes
  from egraph.ir.ops import Node, Ops, new_buffer, const
  from egraph.ir.storage import Storage
  from lower.schedule.kernelize import kernelize
  from lower.schedule.mem import arg_binding
  S, rng = Storage(), np.random.default_rng(0)
  def buf(a):
    b = new_buffer(a.size, dtypes.float32, "CPU"); S.set_data(b, a.reshape(-1)); return b
  N, M = 16 * 1024 * 1024, 512
  a, b = buf(rng.standard_normal(N, dtype=np.float32)), buf(rng.standard_normal(N, dtype=np.float32))
  ew = callify(Node(Ops.SUB, None, (Node(Ops.MUL, None, (Node(Ops.ADD, None, (a, b)), a)),
                                    const(1.0, dtypes.float32, "CPU").reshape((1,)).expand((N,)))))
  A, B = buf(rng.standard_normal(M * M, dtype=np.float32)).reshape((M, M)), buf(rng.standard_normal(M * M, dtype=np.float32)).reshape((M, M))
  prod = Node(Ops.MUL, None, (A.reshape((M, 1, M)).expand((M, M, M)), B.permute((1, 0)).reshape((1, M, M)).expand((M, M, M))))
  mm = callify(Node(Ops.REDUCE, None, (prod,), (Ops.ADD, (2,))).reshape((M, M)))
  out = {}
  for name, res in (("elementwise", ew), ("matmul (tiled)", mm)):
    out[name] = [s.kernel for s in kernelize(res.call.src[0], arg_binding(res.call)[0]).steps if s.kernel]
  assert any(k.tile and k.tile[0] == "matmul" for k in out["matmul (tiled)"]), "expected a tiled matmul kernel"
  return out

def ms(f) -> float:
  t0 = time.perf_counter(); f(); return (time.perf_counter() - t0) * 1e3

def child(d: str) -> None:
  """One fresh process: the first CACHE.get of each module, with the disk cache at d."""
  from lower.device import llvmjit
  from lower.render.llvm import matmul
  from lower.device.cache import CACHE
  gs = graphs()
  llvmjit.llvm_setup(); matmul.mm_helpers()
  CACHE.disk = d
  print(json.dumps({name: ms(lambda: CACHE.get(ks)) for name, ks in gs.items()} | {"disk_hits": CACHE.disk_hits, "modules": CACHE.modules}))

def add_object(text: str, data: bytes, names: list[str]):
  """The other loader: an empty module's engine plus the object (add_object_file)."""
  from lower.device import llvmjit
  llvm, make_tm, _, _, _ = llvmjit.llvm_setup()
  m = llvm.parse_assembly(""); m.triple = llvm.get_process_triple()
  e = llvm.create_mcjit_compiler(m, make_tm())
  e.add_object_file(llvm.ObjectFileRef.from_data(data)); e.finalize_object()
  assert all(e.get_function_address(n) for n in names)
  return e

def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=15)
  ap.add_argument("--procs", type=int, default=5)
  ap.add_argument("--child", default=None)
  args = ap.parse_args()
  if args.child: return child(args.child)
  from lower.device import compiler
  from lower.device import llvmjit
  from lower.render.llvm import matmul
  from lower.device.cache import DiskCache
  load0 = os.getloadavg()
  gs = graphs()
  llvmjit.llvm_setup(); matmul.mm_helpers()
  rows = {}
  with tempfile.TemporaryDirectory() as d:
    disk = DiskCache(d)
    named = {name: [(k, f"{k.name}_{i}") for i, k in enumerate(ks)] for name, ks in gs.items()}
    objs = {}
    for name, ks in named.items():
      compiler.compile_kernels(ks, disk=disk)                                  # store
      text = compiler.module_text(ks)
      objs[name] = (text, disk.get(llvmjit.object_key(text)))
      assert compiler.compile_kernels(ks, disk=disk)[0].loaded
    t = {(name, how): [] for name in named for how in ("cold", "hit", "add")}
    for _ in range(args.rounds):
      for name, ks in named.items():
        t[name, "cold"].append(ms(lambda: compiler.compile_kernels(ks)))
        t[name, "hit"].append(ms(lambda: compiler.compile_kernels(ks, disk=disk)))
        text, data = objs[name]
        t[name, "add"].append(ms(lambda: add_object(text, data, [n for _, n in ks])))
    for name in named:
      med = {how: statistics.median(t[name, how]) for how in ("cold", "hit", "add")}
      rows[name] = (med, len(objs[name][1]))
  print(f"in process, medians of {args.rounds} rounds (ms); load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}")
  print(f"{'module':<16} {'object B':>8} {'cold compile':>12} {'disk hit':>9} {'ratio':>7} {'add_object_file':>16}")
  for name, (m, size) in rows.items():
    print(f"{name:<16} {size:>8} {m['cold']:>12.2f} {m['hit']:>9.2f} {m['cold'] / m['hit']:>6.1f}x {m['add']:>16.2f}")
  if args.procs:
    with tempfile.TemporaryDirectory() as d:
      def run(dd):
        p = subprocess.run([sys.executable, __file__, "--child", dd], capture_output=True, text=True, check=True)
        return json.loads(p.stdout.strip().splitlines()[-1])
      cold = []
      for _ in range(args.procs):
        with tempfile.TemporaryDirectory() as empty: cold.append(run(empty))
      run(d)                                                             # fill
      warm = [run(d) for _ in range(args.procs)]
      assert all(w["modules"] == 0 and w["disk_hits"] == 2 for w in warm) and all(c["disk_hits"] == 0 for c in cold)
    print(f"fresh process, first CACHE.get of the module, medians of {args.procs} processes (ms); the matmul helpers "
          f"(once per process, not in the disk cache, outside the timer) took {matmul.mm_helpers()[1]:.1f} ms in this one")
    for name in gs:
      c, w = statistics.median(r[name] for r in cold), statistics.median(r[name] for r in warm)
      print(f"{name:<16} empty cache {c:8.2f}   filled cache {w:6.2f}   {c / w:5.1f}x")

if __name__ == "__main__": main()
