"""Compile kernels with llvmlite (new pass manager at O3 for the host CPU name + features, MCJIT, ctypes) and run a
CALL on them: the LLVM setup, compile_kernels, the pinned kernel threads, launch and the native runner."""
from __future__ import annotations
import ctypes, os, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from egraph.errors import CallsatError
from lower.kernel import Kernel, render as render_kernel
from lower.llvm import render_llvm

class BoundsError(CallsatError, IndexError):
  """CHECK_BOUNDS=1: a kernel indexed outside a buffer."""

def debug_level() -> int:
  try: return int(os.environ.get("DEBUG", "0") or 0)
  except ValueError: return 0

def check_bounds() -> bool: return os.environ.get("CHECK_BOUNDS", "0") not in ("", "0")

# ---------------------------------------------------------------------------------------------------------------------
# LLVM setup

_LLVM = None

def _llvm():
  global _LLVM
  if _LLVM is None:
    import llvmlite.binding as llvm
    llvm.initialize_native_target(); llvm.initialize_native_asmprinter(); llvm.initialize_native_asmparser()
    # no vectorized epilogue loops (remainders run scalar): ~2 ms less compile per vectorized loop, for kernels that
    # are memory-bound or dominated by their main vector loop (process-global LLVM option)
    llvm.set_option("", "--enable-epilogue-vectorization=false")
    target = llvm.Target.from_default_triple()
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    make = lambda: target.create_target_machine(cpu=cpu, features=features, opt=3, jit=True)
    _LLVM = (llvm, make, make(), cpu, features)
  return _LLVM

def host_cpu() -> tuple[str, str]:
  _, _, _, cpu, feats = _llvm()
  return cpu, feats

# ---------------------------------------------------------------------------------------------------------------------
# compiling

class Compiled:
  """A compiled kernel: the ctypes function and the engine that owns its code (kept alive with it)."""
  __slots__ = ("kernel", "fn", "engine", "name", "compile_s")
  def __init__(self, kernel, fn, engine, name, compile_s): self.kernel, self.fn, self.engine, self.name, self.compile_s = kernel, fn, engine, name, compile_s

def module_text(kernels: list[tuple[Kernel, str]]) -> str:
  fns, decls = [], set()
  for k, name in kernels:
    text, d = render_llvm(k, name)
    fns.append(text); decls |= d
  md = sorted(d for d in decls if d.startswith("!"))
  return "\n\n".join(sorted(d for d in decls if not d.startswith("!")) + fns + md) + "\n"

def compile_kernels(kernels: list[tuple[Kernel, str]]) -> list[Compiled]:
  """Compile several kernels as one module (one O3 run, one codegen): fixed costs are paid once."""
  llvm, make_tm, tm_opt, _, _ = _llvm()
  t0 = time.perf_counter()
  text = module_text(kernels)
  if debug_level() >= 2:
    for k, name in kernels: print(render_kernel(k).replace(f"kernel {k.name}", f"kernel {name}", 1), file=sys.stderr)
    print(text, file=sys.stderr)
  mod = llvm.parse_assembly(text)
  mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm_opt.target_data)
  mod.verify()
  pto = llvm.create_pipeline_tuning_options(speed_level=3)
  pto.loop_vectorization = True; pto.slp_vectorization = True; pto.loop_interleaving = True; pto.loop_unrolling = True
  pb = llvm.create_pass_builder(tm_opt, pto)
  pb.getModulePassManager().run(mod, pb)
  engine = llvm.create_mcjit_compiler(mod, make_tm())
  engine.finalize_object()
  dt = (time.perf_counter() - t0)
  out = []
  for k, name in kernels:
    n = len(k.params)
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n), ctypes.c_int64, ctypes.c_int64, *([ctypes.c_void_p] if k.checked else []))
    fn = proto(engine.get_function_address(name))
    out.append(Compiled(k, fn, engine, name, dt / len(kernels)))
  if debug_level() >= 1:
    print(f"compiled {len(kernels)} kernel(s) in {dt * 1e3:.1f} ms: {', '.join(n for _, n in kernels)}", file=sys.stderr)
  return out

# ---------------------------------------------------------------------------------------------------------------------
# running

THREADS = max(1, min(2, os.cpu_count() or 1))
PARALLEL_WORK = 1 << 21          # estimated element-ops above which a kernel is split across THREADS
PIN = os.environ.get("CALLSAT_PIN", "1") not in ("", "0")
_WORKERS: list = []

def _worker(t: int) -> ThreadPoolExecutor:
  """The t-th kernel thread: a single-thread executor pinned (Linux, CALLSAT_PIN=1, the default) to the t-th CPU this
  process may use. A split kernel runs every chunk on these workers while the caller waits: unpinned, the scheduler
  often woke the helper on the caller's CPU (queued behind it, or time-sliced with it), so a 2-thread matmul took as
  long as 1 thread in about half of the launches."""
  while len(_WORKERS) <= t:
    w = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"callsat-kernel{len(_WORKERS)}")
    cpus = sorted(os.sched_getaffinity(0)) if PIN and hasattr(os, "sched_setaffinity") else []
    if len(_WORKERS) < len(cpus) and len(cpus) > 1:
      try: w.submit(os.sched_setaffinity, 0, {cpus[len(_WORKERS)]}).result()
      except OSError: pass
    _WORKERS.append(w)
  return _WORKERS[t]

def launch(c: Compiled, ptrs: list[int], work: int = 0, threads: int | None = None) -> None:
  k = c.kernel
  n0 = k.domain[0].size if k.domain else 1
  err = ctypes.c_int32(0) if k.checked else None
  extra = (ctypes.byref(err),) if k.checked else ()
  nt = THREADS if threads is None else threads
  step = k.tile[1] if k.tile else 1
  if nt > 1 and work >= PARALLEL_WORK and n0 >= 2 * step:
    cuts = [0] + [((n0 * t // nt) // step) * step for t in range(1, nt)] + [n0]
    futs = [_worker(t).submit(c.fn, *ptrs, cuts[t], cuts[t + 1], *extra) for t in range(nt)]
    for f in futs: f.result()
  else: c.fn(*ptrs, 0, n0, *extra)
  if err is not None and err.value:
    p = k.params[err.value - 1]
    raise BoundsError(f"kernel {c.name}: index out of bounds on buffer {p.name} ({p.dtype.name}[{p.size}])")

# ---------------------------------------------------------------------------------------------------------------------
# the native runner

def _buffers_in(body):
  from egraph.ir import Ops as O, toposort
  return {n.arg.uid: n for n in toposort([body]) if n.op is O.BUFFER}

def run_native(call, storage) -> None:
  """Execute a CALL with compiled kernels: schedule (cached per body + argument aliasing), compile misses, run."""
  from lower.schedule import schedule, arg_binding
  from lower.cache import CACHE
  from lower.runtime import UnallocatedBufferError, _elements
  checked = check_bounds()
  bind, bufs = arg_binding(call)
  key = (call.src[0], tuple(bind[i] for i in range(len(bind))), checked)
  entry = CACHE.schedules.get(key)
  if entry is None:
    prog = schedule(call.src[0], bind)
    if checked:
      from dataclasses import replace
      for s in prog.steps:
        if s.kernel is not None: s.kernel = replace(s.kernel, checked=True)
    kernels = [s.kernel for s in prog.steps if s.kernel is not None]
    entry = CACHE.schedules[key] = (prog, CACHE.get(kernels))
  prog, compiled = entry
  # storage: written buffers are allocated on demand, read-only ones must exist
  inner = _buffers_in(call.src[0]) if any(r[0] == "buf" for s in prog.steps for m in s.mems for r in [m.root]) else {}
  def node_of(root): return bufs[root[1]] if root[0] == "arg" else inner[root[1]]
  arrays = {}
  roots = {m.root for s in prog.steps for m in s.mems if m.root[0] != "tmp"}
  for r in sorted(roots, key=str):
    b = node_of(r)
    a = storage.get(b.arg.uid)
    if a is None:
      if r in prog.written or b.arg.size == 0: a = storage.allocate(b)
      else: raise UnallocatedBufferError(f"BUFFER uid={b.arg.uid} ({b.arg.size} x {b.dtype.name} on {b.arg.device}) is read but "
                                         "was never allocated or written")
    if a.shape != (_elements(b),) or a.dtype != b.dtype.np:   # per-device storage: every device's copy, device-major
      raise CallsatError(f"BUFFER uid={b.arg.uid}: storage holds {a.dtype}{a.shape}, the node says {b.dtype.name}({_elements(b)},)")
    arrays[r] = a
  for r in prog.written:
    if r[0] != "tmp" and r not in arrays: arrays[r] = storage.allocate(node_of(r))
  base = {r: a.ctypes.data for r, a in arrays.items()}
  keep = []
  for r, n in prog.temps.items():
    t = np.empty(n + 64, np.uint8); keep.append(t)
    base[r] = t.ctypes.data + (-t.ctypes.data) % 64
  dbg = debug_level()
  ci = iter(compiled)
  for s in prog.steps:
    if s.kernel is None:
      src, dst = s.mems
      ctypes.memmove(base[dst.root] + dst.off, base[src.root] + src.off, src.nbytes)
      continue
    c = next(ci)
    ptrs = [base[m.root] + m.off for m in s.mems]
    if dbg:
      t0 = time.perf_counter()
      launch(c, ptrs, s.work)
      print(f"  {c.name:<40} {(time.perf_counter() - t0) * 1e3:9.3f} ms", file=sys.stderr)
    else: launch(c, ptrs, s.work)
