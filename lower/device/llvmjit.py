"""LLVM through llvmlite for the host CPU: the process's target machine (O3, the host CPU name + features, MCJIT), the
disk-cache key of a module's object, emit_object (IR text -> object) and Slab (an engine several modules' objects are
linked into). lower/device/compile_proc.py's compile_module gets a module's object (disk cache, compile helper process
or emit_object here) into a slab; kernels become modules in lower/device/compiler.py.

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

class Slab:
  """An MCJIT engine that the code of several modules is linked into: an engine of its own costs a module ~0.75 MB
  resident, a module linked into a live engine ~0.07 MB. Code is freed only with its engine, so a slab is evicted whole
  (lower/device/cache.py); its engine is disposed (its code unmapped) when the last reference to the slab goes, so all
  that can still run its code holds the slab: a Compiled, and the native pool until its workers have exited (pool.py).
  A slab only loads objects (made by emit_object, here or in the compile helper, or read from the disk cache): its
  object-cache hook hands MCJIT the object of the (empty) module being linked, so MCJIT never optimizes or generates
  code. `nbytes`: the objects linked in."""
  __slots__ = ("engine", "_io", "modules", "nbytes", "__weakref__")

  def __init__(self):
    llvm, make_tm, tm_opt, _, _ = llvm_setup()
    self.engine = llvm.create_mcjit_compiler(_empty(llvm, tm_opt), make_tm())
    self.engine.finalize_object()   # the engine's own (empty) module, before the hook could hand it another's object
    # the hook is the engine's, set once: `_io` holds the module being linked and its object, and answers for that module
    # only (a closure over the dict, not the slab: no reference cycle through the engine)
    io = self._io = {"mod": None, "obj": None}
    self.engine.set_object_cache(lambda m, buf: None, lambda m: io["obj"] if m is io["mod"] else None)
    self.modules = self.nbytes = 0

  def add(self, obj: bytes) -> None:
    """Link the object `obj` (its symbols become resolvable through get_function_address); the module it went in as is
    dropped at once."""
    llvm, _, tm_opt, _, _ = llvm_setup()
    mod = _empty(llvm, tm_opt)
    self._io.update(mod=mod, obj=obj)
    try:
      self.engine.add_module(mod)
      self.engine.finalize_object()
    finally: self._io.update(mod=None, obj=None)
    self.engine.remove_module(mod)
    mod.close()
    self.modules += 1
    self.nbytes += len(obj)

  def get_function_address(self, name: str) -> int: return self.engine.get_function_address(name)

def _empty(llvm, tm_opt):
  mod = llvm.parse_assembly("")
  mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm_opt.target_data)
  return mod

def emit_object(text: str, level: int = 3) -> bytes:
  """The object of the module `text`: parsed, verified, optimized (level 3: O3 with every loop transform on, as the
  kernels want; else llvmlite's defaults for that speed level) and compiled for this host (the bytes MCJIT itself would
  emit). Runs llvmlite's pass pipeline, which leaks ~70 KB per call (lower/device/compile_proc.py runs it elsewhere)."""
  llvm, _, tm_opt, _, _ = llvm_setup()
  with JIT_LOCK:
    mod = llvm.parse_assembly(text)
    mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm_opt.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    if level == 3: pto.loop_vectorization = True; pto.slp_vectorization = True; pto.loop_interleaving = True; pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm_opt, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm_opt.emit_object(mod)
