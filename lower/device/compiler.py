"""Kernels -> one LLVM module -> ctypes functions: the module text (each kernel and its `argv` thunk, metadata numbered
by first use) and compile_kernels (one O3 run and one codegen for several kernels, or the object from the disk cache)."""
from __future__ import annotations
import ctypes, re, sys, time
from lower.schedule.kernel import Kernel, render as render_kernel
from lower.render.llvm.module import render_llvm
from lower.device.llvmjit import JIT_LOCK
from lower.device.compile_proc import compile_module
from egraph.ir.env import env_value
from lower.render.llvm.matmul import mm_helpers

def debug_level() -> int:
  try: return int(env_value("DEBUG") or 0)
  except ValueError: return 0

class Compiled:
  """A compiled kernel: the ctypes function and the slab (lower.device.llvmjit.Slab) that owns its code, kept alive with
  it; loaded: its module's object came from the disk cache."""
  __slots__ = ("kernel", "fn", "slab", "name", "compile_s", "loaded", "thunk")
  def __init__(self, kernel, fn, slab, name, compile_s, loaded=False, thunk=0):
    self.kernel, self.fn, self.slab, self.name, self.compile_s, self.loaded = kernel, fn, slab, name, compile_s, loaded
    self.thunk = thunk   # address of `<name>_argv(ptr argv, i64 start, i64 end)` (lower/device/pool.py's workers call that)

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

def compile_kernels(kernels: list[tuple[Kernel, str]], disk=None, slab=None) -> list[Compiled]:
  """Compile several kernels as one module (one O3 run, one codegen) into `slab` (None: a slab of their own): fixed
  costs are paid once. With `disk` (a lower.device.cache.DiskCache) the module's object is loaded from it when there,
  else compiled and stored. Serialized by JIT_LOCK (llvmlite is not thread-safe; the helpers' registration and the
  address lookups too)."""
  with JIT_LOCK: return _compile_kernels(kernels, disk, slab)

def _compile_kernels(kernels: list[tuple[Kernel, str]], disk, slab) -> list[Compiled]:
  t0 = time.perf_counter()
  text = module_text(kernels)
  if debug_level() >= 2:
    for k, name in kernels: print(render_kernel(k).replace(f"kernel {k.name}", f"kernel {name}", 1), file=sys.stderr)
    print(text, file=sys.stderr)
  # tiled matmuls call the shared helpers: their symbols must be registered before the module is linked (compiled or
  # loaded from the disk cache)
  if "@callsat_mm_" in text: mm_helpers(disk)
  slab, loaded = compile_module(text, disk, slab=slab)
  dt = (time.perf_counter() - t0)
  out = []
  for k, name in kernels:
    n = len(k.params)
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n), ctypes.c_int64, ctypes.c_int64, *([ctypes.c_void_p] if k.checked else []))
    fn = proto(slab.get_function_address(name))
    out.append(Compiled(k, fn, slab, name, dt / len(kernels), loaded, slab.get_function_address(name + "_argv")))
  if debug_level() >= 1:
    how = f"loaded {len(kernels)} kernel(s) from the disk cache" if loaded else f"compiled {len(kernels)} kernel(s)"
    print(f"{how} in {dt * 1e3:.1f} ms: {', '.join(n for _, n in kernels)}", file=sys.stderr)
  return out
