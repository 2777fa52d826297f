"""LLVM through llvmlite for the host CPU: the process's target machine (O3, the host CPU name + features, MCJIT), the
disk-cache key of a module's object and compile_module, which turns a module's text into a finalized engine (or loads
its object from a lower.device.cache.DiskCache). Kernels become modules in lower/device/compiler.py.

Threads: LLVM's MCJIT and llvmlite's module/engine objects are not thread-safe (two threads in compile_module or
get_function_address at once segfaulted), so every use of them takes JIT_LOCK: compiling is serialized. Running the
compiled kernels is not: they are plain functions called through ctypes, which releases the GIL."""
from __future__ import annotations
import hashlib, os, threading

_LLVM = None
JIT_LOCK = threading.RLock()   # held around every llvmlite call that parses, optimizes, compiles or looks up code
if hasattr(os, "register_at_fork"):   # a fork while another thread compiled would leave the child's copy held for good
  os.register_at_fork(after_in_child=lambda: globals().update(JIT_LOCK=threading.RLock()))

def llvm_setup():
  """(llvm binding, target machine factory, the optimizing target machine, host CPU name, its features), made once."""
  global _LLVM
  if _LLVM is not None: return _LLVM
  with JIT_LOCK:
    if _LLVM is None: _LLVM = _setup()
  return _LLVM

def _setup():
  import llvmlite.binding as llvm
  llvm.initialize_native_target(); llvm.initialize_native_asmprinter(); llvm.initialize_native_asmparser()
  # no vectorized epilogue loops (remainders run scalar): ~2 ms less compile per vectorized loop, for kernels that
  # are memory-bound or dominated by their main vector loop (process-global LLVM option)
  llvm.set_option("", "--enable-epilogue-vectorization=false")
  target = llvm.Target.from_default_triple()
  cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
  make = lambda: target.create_target_machine(cpu=cpu, features=features, opt=3, jit=True)
  return (llvm, make, make(), cpu, features)

def host_cpu() -> tuple[str, str]:
  _, _, _, cpu, feats = llvm_setup()
  return cpu, feats

OBJ_FORMAT = 1   # part of the disk-cache key: bump when the pass pipeline, an LLVM option (llvm_setup) or the entry layout changes

def object_key(text: str, level: int = 3) -> str:
  """The disk-cache key of a module: a hash of its IR text, the pipeline level, the host CPU name + features, the triple,
  the llvmlite and LLVM versions and OBJ_FORMAT (an object is only valid for the code generator and CPU that made it)."""
  import llvmlite
  llvm = llvm_setup()[0]
  cpu, feats = host_cpu()
  head = [f"callsat-obj{OBJ_FORMAT}", f"O{level}", llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)),
          llvm.get_process_triple(), cpu, feats]
  return hashlib.sha256("\0".join(head + [text]).encode()).hexdigest()

def compile_module(text: str, disk=None, level: int = 3):
  """An MCJIT engine, finalized, for the module `text`: parsed, verified, optimized (level 3: O3 with every loop
  transform on, as the kernels want; else llvmlite's defaults for that speed level) and compiled, or with `disk` (a
  lower.device.cache.DiskCache) its object loaded from there when present, else stored there. Symbols the module calls but
  does not define (the matmul helpers) must be registered first. Returns (engine, loaded)."""
  with JIT_LOCK: return _compile_module(text, disk, level)

def _compile_module(text: str, disk, level: int):
  llvm, make_tm, tm_opt, _, _ = llvm_setup()
  key = object_key(text, level) if disk is not None else None
  obj = disk.get(key) if disk is not None else None
  got = []
  if obj is not None:
    # MCJIT asks the object cache for a module's object before codegen and only loads and relocates what it gets: no
    # parse, verify, O3 or codegen. The object goes in as an empty module's (its symbols are found all the same): parsing
    # the text was half the hit time; add_object_file instead still runs codegen for the engine's (empty) module.
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
  # the code lives in the engine's memory now and its symbols stay resolvable: the module's IR (most of a kernel's
  # resident cost) is dropped
  engine.remove_module(mod)
  mod.close()
  if got: disk.put(key, got[0])
  return engine, obj is not None
