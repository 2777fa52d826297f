"""Kernel IR (lower/schedule/kernel.py) -> CUDA C, the launch plan, and the "CUDA" device.

The scheduler (lower/schedule/kernelize.py) is shared with the LLVM backend; this module only renders its kernels. Each kernel is
one `extern "C" __global__` function (unmangled, so the driver finds it by name) taking the kernel's params as typed
pointers; every shape is a compile-time constant, every index is 64-bit (`long long`). Three forms:

* **serial** (elementwise, and reductions too small to split): the kernel's domain is flattened into one output index,
  walked by a grid-stride loop (`o = blockIdx.x*blockDim.x + threadIdx.x; o < N; o += blockDim.x*gridDim.x`), so any
  launch shape is correct; a `reduce` is an accumulator loop nest in the thread, as in the LLVM renderer.
* **block** (kernels whose value contains a reduction of >= BLOCK_REDUCE elements): one block per output element
  (grid-stride over blocks). Every top-level reduce is split across the block's threads (strided over the flattened
  reduce range), combined by warp shuffles (`__shfl_down_sync`), then across warps through shared memory with
  `__syncthreads`; thread 0 stores. Reductions nested inside a reduce body stay serial in each thread.
* **matmul** (`Kernel.tile == ("matmul", MR, NR)`: the IR marks the kernel as C[i, j] = sum_k A[i, k] * B[k, j] and
  carries the strides): a 64x64 output tile per block, 16x16 threads with a 4x4 register micro-tile each, A and B
  staged through shared memory 16 deep along k with two `__syncthreads` per k-step; grid-stride over tiles in x and y.
  The IR's (MR, NR) are CPU register sizes; the GPU tile sizes are the renderer's (TILE_* below).

Numerics follow lower/numeric.py (the reference's oracle) for all 13 dtypes; lower/render/cuda/ops.py spells every value, op,
cast and bitcast and holds the prelude of helpers (wrapping ints, tinygrad's float -> int casts, float16/bfloat16 rounding,
THREEFRY). MAX propagates NaN; bool is a byte in memory; float16/bfloat16 reduces accumulate in float. A float32 sum
that runs more than SUM_BLOCK steps in one thread adds them in blocks of SUM_BLOCK and each block's partial into a double
(as the LLVM renderer: lower/render/base.py's sum_blocks). nvcc contracts a*b+c into FMAs (the default), so float results
match numpy to rounding, not bit for bit.

`render(call_or_kernels) -> str` is a complete .cu translation unit; `plan(call) -> dict` adds the launch plan (grid,
block, argument order, buffer sizes; see lower/device/cuda_driver.py for the format), which `execute` runs on the CPU emulator
(lower/device/cuda_emu.h) or on a GPU (libcuda through ctypes). `run_cuda(call, storage)` is the "CUDA" device of
lower/runtime.py: host numpy storage is copied to the GPU, the plan runs, written buffers are copied back.
Not supported yet: CHECK_BOUNDS (checked kernels render unchecked), multi-device CALLs.
"""
from __future__ import annotations
import hashlib, math
from dataclasses import dataclass
from egraph.ir.dtype import DType, dtypes
from egraph.ir.errors import CallsatError, UnsupportedOpError
from egraph.ir.ops import Ops, toposort, bindings
from lower.schedule.kernel import Kernel, Expr, Var, mm_batched
from lower.schedule.kernelize import kernelize
from lower.schedule.mem import arg_binding
from lower.render.base import Renderer
from lower.render.cuda import ops
from lower.render.cuda.ops import VT, MT, PRELUDE, cconst, red_init, red_combine, red_result, shfl_type, LOAD, STORE

BLOCK = 256                # threads per block (serial and block forms)
MAX_GRID = 1 << 16         # blocks per launch (grid-stride beyond)
BLOCK_REDUCE = 32          # a top-level reduce of at least this many elements is split across a block
TILE_M, TILE_N, TILE_K, MICRO = 64, 64, 16, 4

# ---------------------------------------------------------------------------------------------------------------------
# one kernel

class CUDARenderer(Renderer):
  """One CUDA function body: named consts, nested C blocks (open/close), grid- and block-strided loops."""
  VT, tmp = VT, "v"
  SUM_BLOCK = 64   # a thread adds float32 values one by one: 64 per block, then the block into a double
  code_for_op = ops.CODE_FOR_OP
  code_for_idx = {"div": lambda a, b: f"({a} / {b})", "mod": lambda a, b: f"({a} % {b})",
                  "udiv": lambda a, b: f"(long long)((unsigned long long)({a}) / (unsigned long long)({b}))",
                  "umod": lambda a, b: f"(long long)((unsigned long long)({a}) % (unsigned long long)({b}))", "mul": lambda a, b: f"{a} * {b}",
                  "add": lambda a, b: f"{a} + {b}", "ge": lambda a, b: f"{a} >= {b}", "lt": lambda a, b: f"{a} < {b}",
                  "and": lambda a, b: f"{a} && {b}"}
  def __init__(self, k: Kernel):
    super().__init__(k)
    self.barriers = 0
    self.smem: list = []

  def open(self, head: str):
    self.emit(head + " {"); self.depth += 1; self.scopes.append({})
  def close(self):
    self.scopes.pop(); self.depth -= 1; self.emit("}")
  def sync(self, tag: str):
    self.barriers += 1
    self.emit(f"__syncthreads();  // sync:{tag}")

  def decompose(self, flat: str, vs: tuple):
    """Define each Var of `vs` (C order) from the flat index `flat`."""
    stride = math.prod(v.size for v in vs)
    for d, v in enumerate(vs):
      stride //= v.size
      if v.size == 1: self.vars[v] = "0LL"; continue
      name = self.t(v.name + "_")
      e = flat if stride == 1 else f"{flat} / {stride}LL"
      if d > 0: e = f"({e}) % {v.size}LL"
      self.emit(f"const long long {name} = {e};")
      self.vars[v] = name

  # the renderer's hooks
  def lit(self, c: int) -> str: return f"{c}LL"
  def cst(self, v, dt: DType) -> str: return cconst(v, dt)
  def let(self, x: str, dt: DType, prefix: str | None = None) -> str:
    name = self.t(prefix)
    self.emit(f"const {VT[dt.name]} {name} = {x};")
    return name
  def range(self, v: Var, body): self.loop(v, "0LL", f"{v.size}LL", body)
  def loop(self, v: Var, lo: str, hi: str, body):
    name = self.t(v.name + "_")
    self.open(f"for (long long {name} = {lo}; {name} < {hi}; ++{name})")
    self.vars[v] = name
    body()
    self.close()
  def blocks(self, name: str, lo: str, hi: str, step: int, body):
    b, e = self.t(name), self.t(name + "e")
    self.open(f"for (long long {b} = {lo}; {b} < {hi}; {b} += {step}LL)")
    self.emit(f"const long long {e} = {b} + {step}LL < {hi} ? {b} + {step}LL : {hi};")
    body(b, e)
    self.close()
  def read(self, pi: int, ix: str, ok: str | None) -> str:
    """Param pi at ix (the caller's ternary keeps a masked-off read from happening)."""
    p = self.k.params[pi]
    r = f"{p.name}[{ix}]"
    if p.dtype.name in LOAD: return f"{LOAD[p.dtype.name]}({r})"
    if p.dtype == dtypes.bool: return f"({r} != 0)"
    return r
  def acc_new(self, rop, dt: DType) -> str:
    acc = self.t("acc")
    self.emit(f"{VT[dt.name]} {acc} = {red_init(rop, dt)};")
    return acc
  def acc_add(self, acc: str, rop, dt: DType, v: str): self.emit(f"{acc} = {red_combine(rop, dt, acc, v)};")
  def acc_get(self, acc: str, dt: DType) -> str: return red_result(dt, acc)

  def block_reduce(self, e: Expr) -> str:
    """Split across the block: strided partial sums, warp shuffles, then shared memory across warps."""
    rop, rvars = e.arg
    dt = e.dtype
    st = shfl_type(dt)
    size = math.prod(v.size for v in rvars)
    acc, sm, r = self.t("acc"), self.t("red"), self.t("r")
    self.smem.append(f"__shared__ {st} {sm}[32];")
    self.emit(f"{VT[dt.name]} {acc} = {red_init(rop, dt)};")
    if rop is Ops.ADD and dt == dtypes.float32 and size > 32 * self.SUM_BLOCK:   # blocks of SUM_BLOCK steps per thread
      tot, rb, re = self.t("tot"), self.t("rb"), self.t("re")
      self.emit(f"double {tot} = 0.0;")
      self.open(f"for (long long {rb} = 0; {rb} < {size}LL; {rb} += (long long)blockDim.x * {self.SUM_BLOCK}LL)")
      self.emit(f"const long long {re} = {rb} + (long long)blockDim.x * {self.SUM_BLOCK}LL < {size}LL ? "
                f"{rb} + (long long)blockDim.x * {self.SUM_BLOCK}LL : {size}LL;")
      self.emit(f"{acc} = 0.0f;")
      lo, hi = f"{rb} + threadIdx.x", re
    else: lo, hi = "threadIdx.x", f"{size}LL"
    self.open(f"for (long long {r} = {lo}; {r} < {hi}; {r} += blockDim.x)")
    self.decompose(r, rvars)
    v = self.value(e.src[0])
    self.emit(f"{acc} = {red_combine(rop, dt, acc, v)};")
    self.close()
    if lo != "threadIdx.x":
      self.emit(f"{tot} += (double){acc};")
      self.close()
      self.emit(f"{acc} = (float){tot};")
    def warp():
      self.open("for (int off = 16; off > 0; off >>= 1)")
      self.emit(f"const {VT[dt.name]} other = ({VT[dt.name]})__shfl_down_sync(0xffffffffu, ({st}){acc}, off);")
      self.emit(f"{acc} = {red_combine(rop, dt, acc, 'other')};")
      self.close()
    warp()
    self.emit(f"if ((threadIdx.x & 31) == 0) {sm}[threadIdx.x >> 5] = ({st}){acc};")
    self.sync("partials-written")
    self.open("if (threadIdx.x < 32)")
    self.emit(f"{acc} = threadIdx.x < (blockDim.x >> 5) ? ({VT[dt.name]}){sm}[threadIdx.x] : {red_init(rop, dt)};")
    warp()
    self.emit(f"if (threadIdx.x == 0) {sm}[0] = ({st}){acc};")
    self.close()
    self.sync("total-written")
    out = self.t("red")
    self.emit(f"const {VT[dt.name]} {out} = {red_result(dt, f'({VT[dt.name]}){sm}[0]')};")
    self.sync("total-read")
    return out

  def alu(self, op, dt: DType, sdts: tuple, a: list) -> str:
    if op is Ops.CAST: return ops.cast(sdts[0], dt, a[0])
    if op is Ops.BITCAST: return ops.bitcast(sdts[0], dt, a[0])
    return ops.alu(op, dt, sdts, a)
  def cast(self, src: DType, dst: DType, x: str) -> str: return ops.cast(src, dst, x)

  def store(self, v: str):
    k = self.k
    p = k.params[k.store.param]
    ix = self.idx(k.store.idx)
    if p.dtype.name in STORE: v = f"{STORE[p.dtype.name]}({v})"
    elif p.dtype == dtypes.bool: v = f"(unsigned char){v}"
    return f"{p.name}[{ix}] = {v};"

# ---------------------------------------------------------------------------------------------------------------------
# kernels

@dataclass
class CudaKernel:
  name: str
  kernel: Kernel
  mode: str                  # "serial" | "block" | "matmul"
  grid: tuple
  block: tuple
  params: tuple              # C types, in argument order
  barriers: int
  source: str

def _top_reduces(e: Expr) -> list:
  """Reduces reachable from `e` without passing through another reduce, nested ones (used inside others) first."""
  top, seen, stack = set(), set(), [e]
  while stack:
    x = stack.pop()
    if id(x) in seen: continue
    seen.add(id(x))
    if x.op == 'reduce': top.add(id(x)); continue
    stack.extend(x.src)
  order, seen, stack = [], set(), [(e, False)]
  while stack:
    x, done = stack.pop()
    if done:
      if id(x) in top: order.append(x)
      continue
    if id(x) in seen: continue
    seen.add(id(x))
    stack.append((x, True)); stack.extend((s, False) for s in x.src)
  return order

def _signature(k: Kernel, name: str, threads: int) -> tuple[str, tuple]:
  ps, types = [], []
  for i, p in enumerate(k.params):
    t = ("const " if p.readonly and i != k.store.param else "") + MT[p.dtype.name] + "*"
    types.append(t)
    ps.append(f"{t}{' __restrict__' if p.noalias else ''} {p.name}")
  return f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(ps)})', tuple(types)

def _grid(n: int, max_grid: int) -> int: return max(1, min(n, max_grid))

def render_kernel(k: Kernel, name: str, reduce: str = "auto", max_grid: int = MAX_GRID, block: int = BLOCK) -> CudaKernel:
  """One kernel as a CUDA function plus its launch shape. reduce: "auto" | "serial" | "block" (when it has reduces)."""
  if k.tile and k.tile[0] == "matmul" and not mm_batched(k): return _render_matmul(k, name, max_grid)   # bmm: plain form
  nout = math.prod(v.size for v in k.domain)
  tops = _top_reduces(k.store.value)
  rsize = max((math.prod(v.size for v in r.arg[1]) for r in tops), default=0)
  mode = "block" if tops and (reduce == "block" or (reduce == "auto" and rsize >= BLOCK_REDUCE)) else "serial"
  f = CUDARenderer(k)
  if mode == "serial":
    threads = max(32, min(block, -(-nout // 32) * 32))
    f.open(f"for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < {nout}LL; o += (long long)blockDim.x * gridDim.x)")
    f.decompose("o", k.domain)
    v = f.value(k.store.value)
    f.emit(f.store(v))
    f.close()
    grid = (_grid(-(-nout // threads), max_grid), 1, 1)
  else:
    threads = max(32, min(block, -(-rsize // 32) * 32))
    f.open(f"for (long long o = blockIdx.x; o < {nout}LL; o += gridDim.x)")
    f.decompose("o", k.domain)
    for r in tops: f.put(id(r), f.block_reduce(r))
    v = f.value(k.store.value)
    f.emit(f"if (threadIdx.x == 0) {f.store(v)}")
    f.close()
    grid = (_grid(nout, max_grid), 1, 1)
  sig, types = _signature(k, name, threads)
  body = ["  " + s for s in f.smem] + f.lines
  src = "\n".join([sig + " {"] + body + ["}"])
  return CudaKernel(name, k, mode, grid, (threads, 1, 1), types, f.barriers, src)

def _render_matmul(k: Kernel, name: str, max_grid: int) -> CudaKernel:
  """C[ci*i + j + cc] = sum_k A[ai*i + ak*k + ac] * B[bk*k + bj*j + bc] (the strides the IR carries in Kernel.matmul)."""
  pa, A, pb, B, iv, jv, kv = k.matmul
  C = k.store.idx
  M, N, K = iv.size, jv.size, kv.size
  ai, ak, bk, bj, ci = A.coef(iv), A.coef(kv), B.coef(kv), B.coef(jv), C.coef(iv)
  ac, bc, cc = A.c, B.c, C.c
  gjb = "gj" if bj == 1 else f"gj * {bj}LL"   # B's column stride (a transposed B: q @ k.T)
  P = lambda i: k.params[i].name
  TM, TN, TK, U = TILE_M, TILE_N, TILE_K, MICRO
  TX, TY = TN // U, TM // U
  threads = TX * TY
  MT_, NT_ = -(-M // TM), -(-N // TN)
  sig, types = _signature(k, name, threads)
  L = [sig + " {",
       f"  __shared__ float As[{TK}][{TM}];",
       f"  __shared__ float Bs[{TK}][{TN}];",
       f"  const int tx = threadIdx.x, ty = threadIdx.y, t = ty * {TX} + tx;",
       f"  for (long long mt = blockIdx.y; mt < {MT_}LL; mt += gridDim.y) {{",
       f"  for (long long nt = blockIdx.x; nt < {NT_}LL; nt += gridDim.x) {{",
       f"    const long long i0 = mt * {TM}LL, j0 = nt * {TN}LL;",
       f"    float acc[{U}][{U}];",
       f"    for (int m = 0; m < {U}; ++m) for (int n = 0; n < {U}; ++n) acc[m][n] = 0.0f;",
       f"    for (long long k0 = 0; k0 < {K}LL; k0 += {TK}) {{",
       f"      for (int l = t; l < {TM * TK}; l += {threads}) {{",
       f"        const int r = l / {TK}, c = l % {TK};",
       "        const long long gi = i0 + r, gk = k0 + c;",
       f"        As[c][r] = (gi < {M}LL && gk < {K}LL) ? {P(pa)}[gi * {ai}LL + gk * {ak}LL + {ac}LL] : 0.0f;",
       "      }",
       f"      for (int l = t; l < {TK * TN}; l += {threads}) {{",
       f"        const int r = l / {TN}, c = l % {TN};",
       "        const long long gk = k0 + r, gj = j0 + c;",
       f"        Bs[r][c] = (gk < {K}LL && gj < {N}LL) ? {P(pb)}[gk * {bk}LL + {gjb} + {bc}LL] : 0.0f;",
       "      }",
       "      __syncthreads();  // sync:tile-loaded",
       f"      for (int kk = 0; kk < {TK}; ++kk) {{",
       f"        float a[{U}], b[{U}];",
       f"        for (int m = 0; m < {U}; ++m) a[m] = As[kk][ty + {TY} * m];",
       f"        for (int n = 0; n < {U}; ++n) b[n] = Bs[kk][tx + {TX} * n];",
       f"        for (int m = 0; m < {U}; ++m) for (int n = 0; n < {U}; ++n) acc[m][n] += a[m] * b[n];",
       "      }",
       "      __syncthreads();  // sync:tile-consumed",
       "    }",
       f"    for (int m = 0; m < {U}; ++m) for (int n = 0; n < {U}; ++n) {{",
       f"      const long long gi = i0 + ty + {TY} * m, gj = j0 + tx + {TX} * n;",
       f"      if (gi < {M}LL && gj < {N}LL) {P(k.store.param)}[gi * {ci}LL + gj + {cc}LL] = acc[m][n];",
       "    }",
       "  }}",
       "}"]
  grid = (_grid(NT_, min(max_grid, 65535)), _grid(MT_, min(max_grid, 65535)), 1)
  return CudaKernel(name, k, "matmul", grid, (TX, TY, 1), types, 2, "\n".join(L))

def kernel_name(k: Kernel) -> str: return f"{k.name}_{hashlib.sha1(k.key().encode()).hexdigest()[:10]}"

def translation_unit(kernels: list) -> str:
  """A complete .cu file: the prelude and each CudaKernel once (by name)."""
  seen, out = set(), [PRELUDE]
  for ck in kernels:
    if ck.name in seen: continue
    seen.add(ck.name); out.append(ck.source)
  return "\n\n".join(out) + "\n"

# ---------------------------------------------------------------------------------------------------------------------
# CALL -> kernels -> plan

def _root_name(r: tuple) -> str: return f"{r[0]}{r[1]}" if r[1] >= 0 else f"{r[0]}_arg{~r[1]}"   # ('tmp', ~slot): a temporary arg

@dataclass
class Lowered:
  """One CALL lowered for CUDA: kernels, the launch plan (without source) and what each plan buffer is."""
  kernels: list              # CudaKernel per launch step, in order
  plan: dict                 # lower/device/cuda_driver.py format, "source" filled by plan()/plans()
  nodes: dict                # plan buffer name -> BUFFER node (for "arg" and "buf" buffers)

def lower_call(call, reduce: str = "auto", max_grid: int = MAX_GRID, block: int = BLOCK) -> Lowered:
  if call.op is not Ops.CALL: raise CallsatError(f"CUDA backend: expected a CALL, got {call.op.name}")
  call, _ = bindings(call)
  bind, bufs = arg_binding(call)
  if any(isinstance(b.arg.device, tuple) for b in bufs):   # the plan sizes one copy per buffer: no per-device storage here
    raise UnsupportedOpError("CUDA backend: multi-device (sharded) CALLs are not supported")
  prog = kernelize(call.src[0], bind)
  inner = {n.arg.uid: n for n in toposort([call.src[0]]) if n.op is Ops.BUFFER}
  nodes, buffers = {}, {}
  def use(root):
    name = _root_name(root)
    if name in buffers: return name
    if root[0] == "tmp": buffers[name] = {"nbytes": prog.temps[root], "kind": "tmp", "written": True}
    else:
      n = bufs[root[1]] if root[0] == "arg" else inner[root[1]]
      nodes[name] = n
      buffers[name] = {"nbytes": n.arg.size * n.dtype.itemsize, "kind": root[0], "written": root in prog.written,
                       "dtype": n.dtype.name}
    return name
  steps, cks, memo = [], [], {}
  for s in prog.steps:
    if s.kernel is None:
      src, dst = s.mems
      steps.append({"op": "copy", "src": [use(src.root), src.off], "dst": [use(dst.root), dst.off], "nbytes": src.nbytes})
      continue
    name = kernel_name(s.kernel)
    if name not in memo: memo[name] = render_kernel(s.kernel, name, reduce, max_grid, block)
    ck = memo[name]
    cks.append(ck)
    steps.append({"op": "launch", "kernel": name, "grid": list(ck.grid), "block": list(ck.block),
                  "args": [[use(m.root), m.off] for m in s.mems]})
  kinfo = {ck.name: {"params": list(ck.params), "barriers": ck.barriers > 0, "mode": ck.mode} for ck in cks}
  plan = {"source": None, "kernels": kinfo, "buffers": buffers, "steps": steps}
  return Lowered(cks, plan, nodes)

def _kernels_of(x, **kw) -> list:
  if isinstance(x, Kernel): x = [x]
  if isinstance(x, (list, tuple)) and all(isinstance(k, Kernel) for k in x):
    return [render_kernel(k, kernel_name(k), **kw) for k in x]
  return lower_call(x, **kw).kernels

def render(x, **kw) -> str:
  """A complete .cu translation unit for a CALL (scheduled with lower/schedule/kernelize.py) or a list of kernel-IR Kernels."""
  return translation_unit(_kernels_of(x, **kw))

def plans(calls: list, **kw) -> list[Lowered]:
  """Lower several CALLs into one translation unit (compile once); every plan carries the same source."""
  lows = [lower_call(c, **kw) for c in calls]
  src = translation_unit([ck for lw in lows for ck in lw.kernels])
  kinfo = {}
  for lw in lows: kinfo.update(lw.plan["kernels"])
  for lw in lows: lw.plan["source"], lw.plan["kernels"] = src, kinfo
  return lows

def plan(call, **kw) -> dict:
  """The launch plan of one CALL (lower/device/cuda_driver.py format), source included."""
  return plans([call], **kw)[0].plan

# ---------------------------------------------------------------------------------------------------------------------
# running

def plan_comment(plan: dict) -> str:
  """The launch plan as C comments (for `callsat cuda`): buffers, then one line per step."""
  out = ["// launch plan: buffers (name: bytes, kind, dtype)"]
  for n, b in plan["buffers"].items():
    out.append(f"//   {n}: {b['nbytes']} B {b['kind']}{' written' if b['written'] and b['kind'] != 'tmp' else ''} {b.get('dtype') or ''}".rstrip())
  out.append("// steps:")
  for s in plan["steps"]:
    if s["op"] == "copy": out.append(f"//   copy {s['nbytes']} B {s['src'][0]}+{s['src'][1]} -> {s['dst'][0]}+{s['dst'][1]}")
    else:
      args = ", ".join(f"{b}+{o}" if o else b for b, o in s["args"])
      out.append(f"//   launch {s['kernel']}<<<({', '.join(map(str, s['grid']))}), ({', '.join(map(str, s['block']))})>>>({args})")
  return "\n".join(out) + "\n"
