"""Executing a CUDA launch plan (lower/render/cuda/render.py) with numpy + ctypes only: importable without egglog or the rest of
callsat, so bench/gpu_check.sh can run it on a GPU machine that has only Python, numpy, nvcc and the driver.

A plan is plain data (JSON-able):

  {"source": "<the .cu translation unit>",
   "kernels": {name: {"params": ["float*", "const float*", ...], "barriers": bool}},
   "buffers": {name: {"nbytes": int, "kind": "arg" | "buf" | "tmp", "written": bool}},
   "steps": [{"op": "launch", "kernel": name, "grid": [x, y, z], "block": [x, y, z], "args": [[buffer, byte offset], ...]},
             {"op": "copy", "src": [buffer, off], "dst": [buffer, off], "nbytes": int}]}

Backends:
  * `Emulator`: g++ compiles the unmodified .cu as C++ with lower/device/cuda_emu.h (fibers for barriers); memory is host memory.
  * `CudaDevice`: libcuda through ctypes (primary context); the .cu is compiled by nvcc (-cubin for the card's sm) or,
    without nvcc, by NVRTC (libnvrtc) to PTX that the driver JITs. `CudaUnavailable` says what is missing.
`execute(plan, arrays, backend)` runs the steps; `arrays` maps every non-temporary buffer name to a 1-D numpy array
(updated in place with what the plan writes)."""
from __future__ import annotations
import ctypes, ctypes.util, hashlib, os, shutil, subprocess, tempfile, time
import numpy as np
from lower.device.securefs import SignedDir, say_once, user_cache_root

HERE = os.path.dirname(os.path.abspath(__file__))
EMU_HEADER = os.path.join(HERE, "cuda_emu.h")

class CudaUnavailable(RuntimeError):
  """No usable CUDA driver, GPU or compiler here; the message names what is missing."""

class CudaFailure(RuntimeError):
  """A CUDA driver call or a compile failed."""

def cache_dir(env=os.environ) -> SignedDir | None:
  """The CUDA cache ($CALLSAT_CUDA_CACHE, else <user cache>/cuda), or None: refused (one line on stderr), run uncached."""
  path = env.get("CALLSAT_CUDA_CACHE") or os.path.join(user_cache_root(env), "cuda")
  try: return SignedDir(path)
  except OSError as e:
    say_once(f"{e.strerror or e}: the CUDA kernels run uncached"); return None

def nvcc_path() -> str | None:
  p = shutil.which("nvcc")
  if p: return p
  for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
    if root and os.path.exists(c := os.path.join(root, "bin", "nvcc")): return c
  return None

def nvcc_ptx(source: str, arch: str = "sm_90", extra: tuple = ()) -> str:
  """Compile a translation unit to PTX with nvcc (raises CudaUnavailable without nvcc, CudaFailure on errors)."""
  return _nvcc(source, ["--ptx", f"-arch={arch}", *extra], ".ptx").decode()

def nvcc_cubin(source: str, arch: str) -> bytes: return _nvcc(source, ["-cubin", f"-arch={arch}"], ".cubin")

def _nvcc(source: str, flags: list, ext: str) -> bytes:
  nvcc = nvcc_path()
  if nvcc is None: raise CudaUnavailable("nvcc was not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
  name = hashlib.sha256((source + repr(flags)).encode()).hexdigest()[:32] + ext
  cache = cache_dir()
  if cache is not None and (got := cache.get(name)) is not None: return got
  with tempfile.TemporaryDirectory(prefix="callsat-nvcc-") as d:   # private (0700) and fresh: nothing to be planted
    src, out = os.path.join(d, "kernels.cu"), os.path.join(d, "out" + ext)
    with open(src, "w") as f: f.write(source)
    r = subprocess.run([nvcc, *flags, "-o", out, src], capture_output=True, text=True)
    if r.returncode: raise CudaFailure(f"nvcc {' '.join(flags)} failed:\n{r.stderr[-4000:]}")
    with open(out, "rb") as f: data = f.read()
  if cache is not None:
    try: cache.put(name, data)
    except OSError as e: say_once(f"cannot write the CUDA cache {cache.path!r}: {e.strerror}")
  return data

# ---------------------------------------------------------------------------------------------------------------------
# plan execution

def execute(plan: dict, arrays: dict, backend, module=None, timing: dict | None = None) -> None:
  """Run `plan` on `backend`: every non-temporary buffer is uploaded from `arrays[name]`, the steps run in order, and
  the written buffers are downloaded back into `arrays` (in place)."""
  module = module if module is not None else backend.load(plan)
  mem = {}
  try:
    for name, b in plan["buffers"].items():
      mem[name] = backend.alloc(max(1, b["nbytes"]))
      if b["kind"] != "tmp":
        a = arrays[name]
        if a.nbytes != b["nbytes"]: raise ValueError(f"buffer {name}: {a.nbytes} bytes given, the plan needs {b['nbytes']}")
        backend.upload(mem[name], a)
    t0 = time.perf_counter()
    for s in plan["steps"]:
      if s["op"] == "copy":
        (sb, so), (db, do) = s["src"], s["dst"]
        backend.copy(mem[db], do, mem[sb], so, s["nbytes"])
      else:
        ptrs = [backend.ptr(mem[b]) + off for b, off in s["args"]]
        backend.launch(module, s["kernel"], s["grid"], s["block"], ptrs)
    backend.sync()
    if timing is not None: timing["steps_s"] = time.perf_counter() - t0
    for name, b in plan["buffers"].items():
      if b["kind"] != "tmp" and b["written"]: backend.download(arrays[name], mem[name])
  finally:
    for m in mem.values(): backend.free(m)

# ---------------------------------------------------------------------------------------------------------------------
# the CPU emulator

def launcher_source(plan: dict) -> str:
  """`#include` the .cu and wrap each kernel for ctypes: cs_launch(kernel index, args, grid, block)."""
  names = sorted(plan["kernels"])
  lines = ['#include "kernels.cu"', ""]
  for i, n in enumerate(names):
    ps = plan["kernels"][n]["params"]
    lines.append(f"static void cs_w{i}(void** a) {{ {n}({', '.join(f'({t})a[{j}]' for j, t in enumerate(ps))}); }}")
  lines.append("typedef void (*cs_fn)(void**);")
  lines.append(f"static cs_fn cs_table[] = {{{', '.join(f'cs_w{i}' for i in range(len(names))) or '0'}}};")
  lines.append(f"static const bool cs_barriers[] = {{{', '.join('true' if plan['kernels'][n]['barriers'] else 'false' for n in names) or 'false'}}};")
  lines.append('extern "C" void cs_launch(int k, void** a, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {')
  lines.append("  cs_emu::launch(dim3(gx, gy, gz), dim3(bx, by, bz), cs_table[k], a, cs_barriers[k]);")
  lines.append("}")
  lines.append('extern "C" unsigned long long cs_barrier_count() { return cs_emu::barriers; }')
  return "\n".join(lines) + "\n"

def load_library(data: bytes):
  """dlopen the authenticated bytes themselves: a copy at a fresh private path (a unique name too: dlopen hands back an
  already loaded library of the same path), removed once mapped."""
  with tempfile.TemporaryDirectory(prefix="callsat-emu-") as d:
    p = os.path.join(d, "kernels.so")
    with open(p, "wb") as f: f.write(data)
    return ctypes.CDLL(p)

class EmuModule:
  def __init__(self, lib, names): self.lib, self.index = lib, {n: i for i, n in enumerate(names)}

class Emulator:
  """The CPU backend: g++ builds the .cu with cuda_emu.h into a shared library (cached by source hash)."""
  def __init__(self, cxx: str | None = None, opt: str = "-O1"):
    self.cxx = cxx or shutil.which("g++") or shutil.which("c++")
    if self.cxx is None: raise CudaUnavailable("the CUDA emulator needs g++ (or c++) on PATH")
    self.opt = opt
    self._mods: dict = {}

  def build(self, source: str, plan_kernels: dict) -> bytes:
    """The shared library of `source` (bytes): from the cache when an entry authenticates, else built by g++."""
    plan = {"kernels": plan_kernels}
    with open(EMU_HEADER) as f: header = f.read()
    name = "emu-" + hashlib.sha256((header + source + launcher_source(plan) + self.opt).encode()).hexdigest()[:32] + ".so"
    cache = cache_dir()
    if cache is not None and (got := cache.get(name)) is not None: return got
    with tempfile.TemporaryDirectory(prefix="callsat-emu-") as d:   # private (0700) and fresh: no planted file or link
      with open(os.path.join(d, "kernels.cu"), "w") as f: f.write(source)
      with open(os.path.join(d, "launcher.cpp"), "w") as f: f.write(launcher_source(plan))
      so = os.path.join(d, "kernels.so")
      cmd = [self.cxx, "-std=c++17", self.opt, "-fPIC", "-shared", "-w", "-include", EMU_HEADER, "-I", d,
             os.path.join(d, "launcher.cpp"), "-o", so]
      r = subprocess.run(cmd, capture_output=True, text=True)
      if r.returncode: raise CudaFailure(f"emulator build failed ({' '.join(cmd)}):\n{r.stderr[-6000:]}")
      with open(so, "rb") as f: data = f.read()
    if cache is not None:
      try: cache.put(name, data)
      except OSError as e: say_once(f"cannot write the CUDA cache {cache.path!r}: {e.strerror}")
    return data

  def load(self, plan: dict) -> EmuModule:
    key = hashlib.sha1(plan["source"].encode()).hexdigest()
    if key not in self._mods:
      lib = load_library(self.build(plan["source"], plan["kernels"]))
      lib.cs_launch.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)] + [ctypes.c_uint] * 6
      lib.cs_launch.restype = None
      lib.cs_barrier_count.restype = ctypes.c_ulonglong
      self._mods[key] = EmuModule(lib, sorted(plan["kernels"]))
    return self._mods[key]

  def alloc(self, n: int): return np.zeros(n + 64, np.uint8)
  def ptr(self, m) -> int: return m.ctypes.data + (-m.ctypes.data) % 64
  def free(self, m) -> None: pass
  def upload(self, m, a: np.ndarray) -> None:
    if a.nbytes: ctypes.memmove(self.ptr(m), np.ascontiguousarray(a).ctypes.data, a.nbytes)
  def download(self, a: np.ndarray, m) -> None:
    if a.nbytes: ctypes.memmove(a.ctypes.data, self.ptr(m), a.nbytes)
  def copy(self, dst, doff: int, src, soff: int, n: int) -> None:
    if n: ctypes.memmove(self.ptr(dst) + doff, self.ptr(src) + soff, n)
  def launch(self, mod: EmuModule, name: str, grid, block, ptrs: list) -> None:
    args = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
    mod.lib.cs_launch(mod.index[name], args, *grid, *block)
  def sync(self) -> None: pass

# ---------------------------------------------------------------------------------------------------------------------
# the GPU: libcuda through ctypes

def find_libcuda() -> str | None:
  for name in ("libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")):
    if not name: continue
    try: ctypes.CDLL(name); return name
    except OSError: continue
  return None

def find_nvrtc() -> str | None:
  cands = [ctypes.util.find_library("nvrtc")]
  for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
    if root:
      d = os.path.join(root, "lib64")
      if os.path.isdir(d): cands += [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.startswith("libnvrtc.so")]
  for c in cands:
    if not c: continue
    try: ctypes.CDLL(c); return c
    except OSError: continue
  return None

class CudaModule:
  def __init__(self, handle, funcs): self.handle, self.funcs = handle, funcs

class CudaDevice:
  """CUDA device 0 through the driver API (primary context). Raises CudaUnavailable naming what is missing."""
  def __init__(self, ordinal: int = 0):
    path = find_libcuda()
    if path is None: raise CudaUnavailable("no CUDA driver: libcuda.so.1 cannot be loaded (no NVIDIA driver installed here)")
    self.lib = lib = ctypes.CDLL(path)
    r = lib.cuInit(0)
    if r: raise CudaUnavailable(f"cuInit failed ({self._name(r)}): no usable GPU or driver")
    n = ctypes.c_int(0)
    self.check(lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    if n.value <= ordinal: raise CudaUnavailable(f"no CUDA GPU: the driver reports {n.value} device(s)")
    self.dev = ctypes.c_int(0)
    self.check(lib.cuDeviceGet(ctypes.byref(self.dev), ordinal), "cuDeviceGet")
    self.ctx = ctypes.c_void_p()
    self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "cuDevicePrimaryCtxRetain")
    self.check(lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
    major, minor = self.attribute(75), self.attribute(76)
    self.arch = f"sm_{major}{minor}"
    name = ctypes.create_string_buffer(256)
    self.check(lib.cuDeviceGetName(name, 256, self.dev), "cuDeviceGetName")
    self.name = name.value.decode()
    self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    self.lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    self.lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    self.lib.cuMemcpyDtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t]
    self.lib.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
    self.lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    self._mods: dict = {}

  def _name(self, r: int) -> str:
    s = ctypes.c_char_p()
    try:
      if self.lib.cuGetErrorName(r, ctypes.byref(s)) == 0 and s.value: return s.value.decode()
    except Exception: pass
    return f"CUresult {r}"
  def check(self, r: int, what: str) -> None:
    if r: raise CudaFailure(f"{what} failed: {self._name(r)}")
  def attribute(self, a: int) -> int:
    v = ctypes.c_int(0)
    self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(v), a, self.dev), f"cuDeviceGetAttribute({a})")
    return v.value
  def peak_bandwidth(self) -> float:
    """Bytes/s from the memory clock (kHz, attribute 36) and bus width (bits, 37): 2 transfers per clock."""
    return 2.0 * self.attribute(36) * 1e3 * self.attribute(37) / 8

  def compile(self, source: str) -> tuple[bytes, str]:
    if nvcc_path() is not None: return nvcc_cubin(source, self.arch), "cubin"
    nv = find_nvrtc()
    if nv is None: raise CudaUnavailable("no CUDA compiler: neither nvcc (PATH, $CUDA_HOME/bin) nor libnvrtc was found")
    lib = ctypes.CDLL(nv)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None):
      raise CudaFailure("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture=compute_{self.arch[3:]}".encode(), b"-DCS_SOFT_HALF", b"--std=c++17"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    if r:
      n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
      log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
      raise CudaFailure(f"NVRTC failed:\n{log.value.decode(errors='replace')[-4000:]}")
    n = ctypes.c_size_t(); lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value); lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.raw, "ptx"

  def load(self, plan: dict) -> CudaModule:
    key = hashlib.sha1(plan["source"].encode()).hexdigest()
    if key not in self._mods:
      image, _ = self.compile(plan["source"])
      h = ctypes.c_void_p()
      buf = ctypes.create_string_buffer(image, len(image) + 1)
      self.check(self.lib.cuModuleLoadData(ctypes.byref(h), buf), "cuModuleLoadData")
      funcs = {}
      for n in plan["kernels"]:
        f = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(f), h, n.encode()), f"cuModuleGetFunction({n})")
        funcs[n] = f
      self._mods[key] = CudaModule(h, funcs)
    return self._mods[key]

  def alloc(self, n: int):
    p = ctypes.c_uint64(0)
    self.check(self.lib.cuMemAlloc_v2(ctypes.byref(p), n), f"cuMemAlloc({n})")
    self.check(self.lib.cuMemsetD8_v2(p.value, 0, n), "cuMemsetD8")
    return p.value
  def ptr(self, m) -> int: return m
  def free(self, m) -> None: self.lib.cuMemFree_v2(m)
  def upload(self, m, a: np.ndarray) -> None:
    a = np.ascontiguousarray(a)
    if a.nbytes: self.check(self.lib.cuMemcpyHtoD_v2(m, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
  def download(self, a: np.ndarray, m) -> None:
    if a.nbytes: self.check(self.lib.cuMemcpyDtoH_v2(a.ctypes.data, m, a.nbytes), "cuMemcpyDtoH")
  def copy(self, dst, doff: int, src, soff: int, n: int) -> None:
    if n: self.check(self.lib.cuMemcpyDtoD_v2(dst + doff, src + soff, n), "cuMemcpyDtoD")
  def launch(self, mod: CudaModule, name: str, grid, block, ptrs: list) -> None:
    vals = [ctypes.c_uint64(p) for p in ptrs]
    params = (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.addressof(v) for v in vals])
    self.check(self.lib.cuLaunchKernel(mod.funcs[name], *grid, *block, 0, None, params, None), f"cuLaunchKernel({name})")
  def sync(self) -> None: self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

  def time_launch(self, mod: CudaModule, name: str, grid, block, ptrs: list, reps: int = 20) -> float:
    """Median seconds of one launch, timed with CUDA events."""
    self.lib.cuEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    self.lib.cuEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]
    a, b = ctypes.c_void_p(), ctypes.c_void_p()
    self.check(self.lib.cuEventCreate(ctypes.byref(a), 0), "cuEventCreate")
    self.check(self.lib.cuEventCreate(ctypes.byref(b), 0), "cuEventCreate")
    self.launch(mod, name, grid, block, ptrs); self.sync()
    out = []
    for _ in range(reps):
      self.check(self.lib.cuEventRecord(a, None), "cuEventRecord")
      self.launch(mod, name, grid, block, ptrs)
      self.check(self.lib.cuEventRecord(b, None), "cuEventRecord")
      self.check(self.lib.cuEventSynchronize(b), "cuEventSynchronize")
      ms = ctypes.c_float(0)
      self.check(self.lib.cuEventElapsedTime(ctypes.byref(ms), a, b), "cuEventElapsedTime")
      out.append(ms.value * 1e-3)
    self.lib.cuEventDestroy_v2(a); self.lib.cuEventDestroy_v2(b)
    return float(np.median(out))
