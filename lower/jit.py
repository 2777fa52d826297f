"""Compile kernels with llvmlite (new pass manager at O3 for the host CPU name + features, MCJIT, ctypes; or load the
module's object from the optional on-disk cache, lower.cache) and run a CALL on them: the LLVM setup, compile_kernels,
the pinned kernel threads, launch and the native runner."""
from __future__ import annotations
import ctypes, hashlib, os, re, sys, time, weakref
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from egraph.errors import CallsatError
from lower.kernel import Kernel, mm_batched, render as render_kernel
from lower.llvm import render_llvm
from lower.pool import pool

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

OBJ_FORMAT = 1   # part of the disk-cache key: bump when the pass pipeline, an LLVM option (_llvm) or the entry layout changes

class Compiled:
  """A compiled kernel: the ctypes function and the engine that owns its code (kept alive with it); loaded: its module's
  object came from the disk cache."""
  __slots__ = ("kernel", "fn", "engine", "name", "compile_s", "loaded", "thunk")
  def __init__(self, kernel, fn, engine, name, compile_s, loaded=False, thunk=0):
    self.kernel, self.fn, self.engine, self.name, self.compile_s, self.loaded = kernel, fn, engine, name, compile_s, loaded
    self.thunk = thunk   # address of `<name>_argv(ptr argv, i64 start, i64 end)` (lower/pool.py's workers call that)

def _thunk(k: Kernel, name: str) -> str:
  """`<name>_argv`: the kernel called with its pointer params (and the err pointer of a checked kernel) from an array, so
  one native worker loop serves every signature."""
  n = len(k.params) + bool(k.checked)
  ld = [f"  %a{i} = getelementptr ptr, ptr %argv, i64 {i}\n  %p{i} = load ptr, ptr %a{i}, align 8" for i in range(n)]
  ps = [f"ptr %p{i}" for i in range(len(k.params))] + ["i64 %s", "i64 %e"] + ([f"ptr %p{n - 1}"] if k.checked else [])
  return "\n".join([f"define void @{name}_argv(ptr %argv, i64 %s, i64 %e) nounwind {{", *ld,
                    f"  call void @{name}({', '.join(ps)}) #0", "  ret void", "}"])

_MD_REF = re.compile(r"!(\d+)")

def module_text(kernels: list[tuple[Kernel, str]]) -> str:
  """One module's IR. Metadata is renumbered from !0 in order of first use: the renderer draws loop ids from a process-wide
  counter, so the same kernels rendered after different others would otherwise give different text (and disk-cache keys)."""
  fns, decls = [], set()
  for k, name in kernels:
    text, d = render_llvm(k, name)
    fns += [text, _thunk(k, name)]; decls |= d
  ids, order = {}, []
  def num(m):
    if (o := m.group(1)) not in ids: ids[o] = len(order); order.append(o)
    return f"!{ids[o]}"
  # thunk calls are noinline (#0): inlined, O3 would optimize every kernel twice (~7 ms more per elementwise kernel)
  body = _MD_REF.sub(num, "\n\n".join(sorted(d for d in decls if not d.startswith("!")) + fns + ["attributes #0 = { noinline }"]))
  defs, md, i = {d[1:d.index(" ")]: d for d in decls if d.startswith("!")}, [], 0
  while i < len(order):     # definitions in order of first use; the ids they refer to are numbered on the way
    if (d := defs.pop(order[i], None)) is not None: md.append(_MD_REF.sub(num, d))
    i += 1
  md += sorted(_MD_REF.sub(num, d) for d in defs.values())      # unreferenced (none today)
  return "\n\n".join([body] + md) + "\n"

def object_key(text: str, level: int = 3) -> str:
  """The disk-cache key of a module: a hash of its IR text, the pipeline level, the host CPU name + features, the triple,
  the llvmlite and LLVM versions and OBJ_FORMAT (an object is only valid for the code generator and CPU that made it)."""
  import llvmlite
  llvm = _llvm()[0]
  cpu, feats = host_cpu()
  head = [f"callsat-obj{OBJ_FORMAT}", f"O{level}", llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)),
          llvm.get_process_triple(), cpu, feats]
  return hashlib.sha256("\0".join(head + [text]).encode()).hexdigest()

def compile_module(text: str, disk=None, level: int = 3):
  """An MCJIT engine, finalized, for the module `text`: parsed, verified, optimized (level 3: O3 with every loop
  transform on, as the kernels want; else llvmlite's defaults for that speed level) and compiled, or with `disk` (a
  lower.cache.DiskCache) its object loaded from there when present, else stored there. Returns (engine, loaded)."""
  llvm, make_tm, tm_opt, _, _ = _llvm()
  key = object_key(text, level) if disk is not None else None
  obj = disk.get(key) if disk is not None else None
  got = []
  if obj is not None:
    # MCJIT asks the object cache for a module's object before codegen and only loads and relocates what it gets: no
    # parse, verify, O3 or codegen. The object goes in as an empty module's (its symbols are found all the same): parsing
    # the text was half the hit time; add_object_file instead still runs codegen for the engine's (empty) module. The
    # relocation resolves the matmul helpers' symbols, so they must be registered first (rendering a matmul kernel did
    # that; said again here so that it does not hang on a side effect).
    if "@callsat_mm_" in text and "define void @callsat_mm_" not in text:
      from lower.matmul import mm_helpers
      mm_helpers()
    mod = llvm.parse_assembly("")
    mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm_opt.target_data)
    engine = llvm.create_mcjit_compiler(mod, make_tm())
    engine.set_object_cache(None, lambda m: obj)
  else:
    mod = llvm.parse_assembly(text)
    mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm_opt.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    if level == 3: pto.loop_vectorization = True; pto.slp_vectorization = True; pto.loop_interleaving = True; pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm_opt, pto)
    pb.getModulePassManager().run(mod, pb)
    engine = llvm.create_mcjit_compiler(mod, make_tm())
    # the object MCJIT emits anyway, handed over by the notify hook: storing it costs no second codegen
    if disk is not None: engine.set_object_cache(lambda m, buf: got.append(buf))
  engine.finalize_object()
  if got: disk.put(key, got[0])
  return engine, obj is not None

def compile_kernels(kernels: list[tuple[Kernel, str]], disk=None) -> list[Compiled]:
  """Compile several kernels as one module (one O3 run, one codegen): fixed costs are paid once. With `disk` (a
  lower.cache.DiskCache) the module's object is loaded from it when there, else compiled and stored."""
  t0 = time.perf_counter()
  text = module_text(kernels)
  if debug_level() >= 2:
    for k, name in kernels: print(render_kernel(k).replace(f"kernel {k.name}", f"kernel {name}", 1), file=sys.stderr)
    print(text, file=sys.stderr)
  engine, loaded = compile_module(text, disk)
  dt = (time.perf_counter() - t0)
  out = []
  for k, name in kernels:
    n = len(k.params)
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n), ctypes.c_int64, ctypes.c_int64, *([ctypes.c_void_p] if k.checked else []))
    fn = proto(engine.get_function_address(name))
    out.append(Compiled(k, fn, engine, name, dt / len(kernels), loaded, engine.get_function_address(name + "_argv")))
  if debug_level() >= 1:
    how = f"loaded {len(kernels)} kernel(s) from the disk cache" if loaded else f"compiled {len(kernels)} kernel(s)"
    print(f"{how} in {dt * 1e3:.1f} ms: {', '.join(n for _, n in kernels)}", file=sys.stderr)
  return out

# ---------------------------------------------------------------------------------------------------------------------
# running

def _threads() -> int:
  """CALLSAT_THREADS, else every CPU this process may use."""
  try: n = int(os.environ.get("CALLSAT_THREADS") or 0)
  except ValueError: raise CallsatError(f"CALLSAT_THREADS={os.environ['CALLSAT_THREADS']!r} is not an integer") from None
  return max(1, n or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

THREADS = _threads()
PARALLEL_WORK = 1 << 21          # estimated element-ops above which a kernel is split across THREADS
PIN = os.environ.get("CALLSAT_PIN", "1") not in ("", "0")
_WORKERS: list = []
_CPUS = sorted(os.sched_getaffinity(0)) if PIN and hasattr(os, "sched_setaffinity") else []
try: _sched_getcpu = ctypes.CDLL(None).sched_getcpu   # glibc; None elsewhere: the caller then only waits
except (OSError, AttributeError): _sched_getcpu = None

def _worker(t: int) -> ThreadPoolExecutor:
  """The t-th kernel thread: a single-thread executor pinned (Linux, CALLSAT_PIN=1, the default) to the t-th CPU this
  process may use. Unpinned, the scheduler often woke a helper on the caller's CPU (queued behind it, or time-sliced
  with it), so a 2-thread matmul took as long as 1 thread in about half of the launches."""
  while len(_WORKERS) <= t:
    w = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"callsat-kernel{len(_WORKERS)}")
    if len(_WORKERS) < len(_CPUS) and len(_CPUS) > 1:
      try: w.submit(os.sched_setaffinity, 0, {_CPUS[len(_WORKERS)]}).result()
      except OSError: pass
    _WORKERS.append(w)
  return _WORKERS[t]

def _run_split(fn, ptrs: list[int], cuts: list[int], extra: tuple) -> None:
  """Run chunk t = [cuts[t], cuts[t+1]) of a kernel on each of len(cuts) - 1 threads. The caller runs the first chunk
  itself and workers pinned to the other CPUs run the rest (waking a worker costs ~0.05 ms, 4% of a 512^3 matmul);
  where the caller's CPU is unknown, or too few CPUs are free of it, every chunk goes to a worker and the caller waits."""
  nt = len(cuts) - 1
  me = _sched_getcpu() if _sched_getcpu is not None and len(_CPUS) >= nt else None
  others = [t for t in range(len(_CPUS)) if _CPUS[t] != me][:nt - 1] if me is not None else []
  if me is not None and len(others) == nt - 1:
    futs = [_worker(t).submit(fn, *ptrs, cuts[i + 1], cuts[i + 2], *extra) for i, t in enumerate(others)]
    try: fn(*ptrs, cuts[0], cuts[1], *extra)
    finally:
      for f in futs: f.result()
  else:
    for f in [_worker(t).submit(fn, *ptrs, cuts[t], cuts[t + 1], *extra) for t in range(nt)]: f.result()

class Launch:
  """One kernel launch with its pointers fixed: the argument array the native workers read, the chunk cuts per thread
  count and the error slot are built once, so a prepared launch run again costs one ctypes call (run_native keeps them
  per CALL)."""
  __slots__ = ("c", "ptrs", "work", "threads", "err", "extra", "argv", "n0", "step", "_cuts")
  def __init__(self, c: Compiled, ptrs: list[int], work: int = 0, threads: int | None = None):
    k = c.kernel
    self.c, self.ptrs, self.work, self.threads = c, list(ptrs), work, threads
    self.err = ctypes.c_int32(0) if k.checked else None
    self.extra = (ctypes.byref(self.err),) if k.checked else ()
    self.argv = (ctypes.c_void_p * (len(ptrs) + bool(k.checked)))(*ptrs, *([ctypes.addressof(self.err)] if k.checked else []))
    self.n0, self.step, self._cuts = k.domain[0].size if k.domain else 1, k.tile[1] if k.tile and not mm_batched(k) else 1, {}

  def cuts(self, nt: int) -> list[int] | None:
    """Chunk bounds for nt threads (multiples of the tile's row step), or None when the kernel runs on one thread."""
    if nt <= 1 or self.work < PARALLEL_WORK or self.n0 < 2 * self.step: return None
    if (cs := self._cuts.get(nt)) is None:
      n0, step = self.n0, self.step
      cs = self._cuts[nt] = [0] + [((n0 * t // nt) // step) * step for t in range(1, nt)] + [n0]
    return cs

  def __call__(self) -> None:
    c, err = self.c, self.err
    if err is not None: err.value = 0
    cuts = self.cuts(THREADS if self.threads is None else self.threads)
    if cuts is None: c.fn(*self.ptrs, 0, self.n0, *self.extra)
    elif (p := pool()) is not None and c.thunk and len(cuts) - 1 <= len(p.cpus):
      if not p.run(c.thunk, ctypes.addressof(self.argv), cuts): c.fn(*self.ptrs, 0, self.n0, *self.extra)   # pool busy
    else: _run_split(c.fn, self.ptrs, cuts, self.extra)
    if err is not None and err.value:
      p = c.kernel.params[err.value - 1]
      raise BoundsError(f"kernel {c.name}: index out of bounds on buffer {p.name} ({p.dtype.name}[{p.size}])")

def launch(c: Compiled, ptrs: list[int], work: int = 0, threads: int | None = None) -> None:
  """Run a compiled kernel on `ptrs` (one per param), split across threads when `work` is large enough."""
  Launch(c, ptrs, work, threads)()

# ---------------------------------------------------------------------------------------------------------------------
# the native runner

def _buffers_in(body):
  from egraph.ir import Ops as O, toposort
  return {n.arg.uid: n for n in toposort([body]) if n.op is O.BUFFER}

class _Plan:
  """A CALL's steps ready to run again: prepared launches and copies over the arrays it ran on (`arrays`: (uid, weak
  reference) pairs, checked by identity on each run: a freed or replaced buffer sends the CALL down the full path) and
  its temporaries (kept: the pointers point into them)."""
  __slots__ = ("checked", "arrays", "steps", "temps")
  def __init__(self, checked, arrays, steps, temps): self.checked, self.arrays, self.steps, self.temps = checked, arrays, steps, temps

def run_native(call, storage) -> None:
  """Execute a CALL with compiled kernels: schedule (cached per body + argument aliasing), compile misses, run. A CALL
  run again on the same storage arrays takes the prepared plan: after a kernel has swept the caches, the full path's
  Python (bindings, lookups, pointer math) took ~0.1 ms, 10% of a 512^3 matmul."""
  from lower.cache import CACHE
  checked = check_bounds()
  plan = CACHE.plans.get(call)
  if plan is not None and plan.checked == checked and all((x := a()) is not None and storage.get(u) is x for u, a in plan.arrays):
    for s in plan.steps:
      if type(s) is tuple: ctypes.memmove(*s)
      else: s()
    return
  from lower.kernelize import schedule, arg_binding
  from egraph.storage import UnallocatedBufferError, elements
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
    if a.shape != (elements(b),) or a.dtype != b.dtype.np:   # per-device storage: every device's copy, device-major
      raise CallsatError(f"BUFFER uid={b.arg.uid}: storage holds {a.dtype}{a.shape}, the node says {b.dtype.name}({elements(b)},)")
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
  steps = []
  for s in prog.steps:
    if s.kernel is None:
      src, dst = s.mems
      steps.append((base[dst.root] + dst.off, base[src.root] + src.off, src.nbytes))
      ctypes.memmove(*steps[-1])
      continue
    steps.append(run := Launch(next(ci), [base[m.root] + m.off for m in s.mems], s.work))
    if dbg:
      t0 = time.perf_counter()
      run()
      print(f"  {run.c.name:<40} {(time.perf_counter() - t0) * 1e3:9.3f} ms", file=sys.stderr)
    else: run()
  if not dbg:   # DEBUG runs take the full path each time (it prints per kernel)
    CACHE.plans[call] = _Plan(checked, [(node_of(r).arg.uid, weakref.ref(a)) for r, a in arrays.items()], steps, keep)
