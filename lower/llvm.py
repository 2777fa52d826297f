"""Kernel IR -> LLVM IR text -> O3 (new pass manager, host CPU name + features) -> MCJIT -> ctypes; and the native runner.

Every kernel is `void @name(ptr p0, ..., i64 start, i64 end[, ptr err])`: it runs the outermost domain axis over
[start, end), so one function serves one thread or a split across threads (ctypes releases the GIL). Loop counters and
accumulators are allocas in the entry block (SROA turns them into phis). Float reductions carry `reassoc nsz` (they do
not vectorize without it); elementwise float math has no fast-math flags, so it is bit-exact with numpy except where
LLVM's libm calls differ. NaNs are kept (no `nnan`): MAX is llvm.maximum (NaN-propagating, as np.maximum).
`noalias` is claimed only for params the scheduler proved disjoint from every other param; alignment only as the
element size (numpy arrays are only 16-byte aligned). Kernels marked ("matmul", MR, NR) get an explicit register tile
(MR rows x NR columns of <16 x float> accumulators) over packed, K-blocked operands (_render_matmul); their packing
loops and scalar edge are precompiled helpers, compiled once per process and shared by every matmul kernel
(mm_helpers). Kernels marked
`stream` get aligned non-temporal vector stores: straight from explicit vector IR of the value when it vectorizes that
way (_vec_ok / _render_stream_vec: no auto-vectorizer, ~half the compile time), else through a stack block
(_render_stream). Loops that hold
hand-written vector code or scalar edges carry metadata that keeps the vectorizer and unroller off them (compile time).

CHECK_BOUNDS=1: every load and store index is checked against its param's size; a violation stores (param + 1) into
the extra `err` out-param and returns; the runner raises BoundsError naming the kernel and the buffer.
"""
from __future__ import annotations
import ctypes, itertools, math, os, struct, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from egraph.dtypes import DType, dtypes
from egraph.errors import CallsatError
from egraph.ir import Ops
from lower.kernel import Kernel, Expr, Idx, Var, Div, Mod, render as render_kernel

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
# rendering

VT = {"bool": "i1", "uint8": "i8", "int32": "i32", "int64": "i64", "float16": "half", "float32": "float"}
MT = {**VT, "bool": "i8"}
SUF = {"bool": "i1", "uint8": "i8", "int32": "i32", "int64": "i64", "float16": "f16", "float32": "f32"}

def lconst(v, dt: DType) -> str:
  if dt == dtypes.bool: return "true" if v else "false"
  if dt.is_int(): return str(int(v))
  if dt == dtypes.float16: return "0xH%04X" % int(np.array(v, np.float16).view(np.uint16))
  return "0x%016X" % struct.unpack("<Q", struct.pack("<d", float(np.float32(v))))[0]

def _zero(dt): return lconst(0, dt)

class _Fn:
  def __init__(self, k: Kernel):
    self.k, self.lines, self.allocas, self.n, self.decls = k, [], [], 0, set()
    self.scopes: list[dict] = [{}]
    self.vars: dict = {}
    self.fails: list = []
  def t(self, prefix="t") -> str:
    self.n += 1
    return f"%{prefix}.{self.n}"
  def emit(self, s: str): self.lines.append("  " + s)
  def label(self, name: str): self.lines.append(f"{name[1:]}:")
  def get(self, key):
    for s in reversed(self.scopes):
      if key in s: return s[key]
    return None
  def put(self, key, v): self.scopes[-1][key] = v
  def intrinsic(self, name: str, ret: str, args: str) -> str:
    self.decls.add(f"declare {ret} @{name}({args})")
    return name

  # loops: body() emits into the loop; counters are allocas
  def loop(self, v: Var, lo: str, hi: str, body):
    addr = self.t(v.name + ".addr")
    self.allocas.append(f"{addr} = alloca i64")
    cond, bodyl, exitl = self.t(v.name + ".cond"), self.t(v.name + ".body"), self.t(v.name + ".exit")
    self.emit(f"store i64 {lo}, ptr {addr}")
    self.emit(f"br label {cond}")
    self.label(cond)
    cur = self.t(v.name)
    self.emit(f"{cur} = load i64, ptr {addr}")
    c = self.t()
    self.emit(f"{c} = icmp slt i64 {cur}, {hi}")
    self.emit(f"br i1 {c}, label {bodyl}, label {exitl}")
    self.label(bodyl)
    self.scopes.append({}); self.vars[v] = cur
    body()
    self.scopes.pop()
    nxt = self.t()
    self.emit(f"{nxt} = add nuw nsw i64 {cur}, 1")
    self.emit(f"store i64 {nxt}, ptr {addr}")
    self.emit(f"br label {cond}")
    self.label(exitl)

  # index expressions
  def idx(self, i: Idx) -> str:
    if i.is_const: return str(i.c)
    key = ("idx", i)
    if (v := self.get(key)) is not None: return v
    acc = None
    for a, k in i.terms:
      if isinstance(a, Var): x = self.vars[a]
      else:
        inner = self.idx(a.x)
        x = self.t()
        self.emit(f"{x} = {'sdiv' if isinstance(a, Div) else 'srem'} i64 {inner}, {a.d}")
      if k != 1:
        y = self.t(); self.emit(f"{y} = mul nsw i64 {x}, {k}"); x = y
      if acc is None: acc = x
      else:
        y = self.t(); self.emit(f"{y} = add nsw i64 {acc}, {x}"); acc = y
    if i.c:
      y = self.t(); self.emit(f"{y} = add nsw i64 {acc}, {i.c}"); acc = y
    self.put(key, acc)
    return acc

  def check(self, pi: int, ix: str):
    if not self.k.checked: return
    p = self.k.params[pi]
    bad, ok = self.t(), self.t("ok")
    self.emit(f"{bad} = icmp uge i64 {ix}, {p.size}")
    self.emit(f"br i1 {bad}, label %fail{pi}, label {ok}")
    self.fails.append(pi)
    self.label(ok)

  def ptr(self, pi: int, ix: str) -> str:
    p = self.k.params[pi]
    g = self.t("p")
    self.emit(f"{g} = getelementptr inbounds {MT[p.dtype.name]}, ptr %{p.name}, i64 {ix}")
    return g

  # values
  def value(self, e: Expr) -> str:
    # iterative over non-reduce structure (chains can be long); reduce bodies recurse one level per nesting
    stack = [(e, False)]
    while stack:
      x, done = stack.pop()
      if self.get(id(x)) is not None: continue
      if x.op in ('reduce', 'const', 'load', 'valid') or done:
        self.put(id(x), self._one(x))
        continue
      stack.append((x, True))
      stack.extend((s, False) for s in x.src if self.get(id(s)) is None)
    return self.get(id(e))

  def _one(self, e: Expr) -> str:
    if e.op == 'const': return lconst(e.arg, e.dtype)
    if e.op == 'load': return self.load(e)
    if e.op == 'valid': return self.valid(e.arg)
    if e.op == 'reduce': return self.reduce(e)
    args = [self.get(id(s)) for s in e.src]
    return self.alu(e, args)

  def valid(self, valid) -> str:
    key = ("valid", valid)
    if (v := self.get(key)) is not None: return v
    conds = []
    for b in valid:
      bi = self.idx(b.idx)
      if b.idx.vmin < b.lo:
        c = self.t(); self.emit(f"{c} = icmp sge i64 {bi}, {b.lo}"); conds.append(c)
      if b.idx.vmax >= b.hi:
        c = self.t(); self.emit(f"{c} = icmp slt i64 {bi}, {b.hi}"); conds.append(c)
    ok = conds[0] if conds else "true"
    for c in conds[1:]:
      y = self.t(); self.emit(f"{y} = and i1 {ok}, {c}"); ok = y
    self.put(key, ok)
    return ok

  def load(self, e: Expr) -> str:
    pi, i, valid = e.arg
    p = self.k.params[pi]
    ix = self.idx(i)
    ok = None
    if valid:
      ok = self.valid(valid)
      y = self.t(); self.emit(f"{y} = select i1 {ok}, i64 {ix}, i64 0"); ix = y
    self.check(pi, ix)
    g = self.ptr(pi, ix)
    v = self.t("v")
    self.emit(f"{v} = load {MT[p.dtype.name]}, ptr {g}, align {p.align}")
    if p.dtype == dtypes.bool:
      y = self.t(); self.emit(f"{y} = icmp ne i8 {v}, 0"); v = y
    if ok is not None:
      y = self.t(); self.emit(f"{y} = select i1 {ok}, {VT[p.dtype.name]} {v}, {VT[p.dtype.name]} {_zero(p.dtype)}"); v = y
    return v

  def reduce(self, e: Expr) -> str:
    rop, rvars = e.arg
    dt = e.dtype
    ty = VT[dt.name]
    acc = self.t("acc")
    self.allocas.append(f"{acc} = alloca {ty}")
    if rop is Ops.ADD: init = _zero(dt)
    elif rop is Ops.MUL: init = lconst(1, dt)
    elif dt.is_float(): init = "0xFFF0000000000000" if dt == dtypes.float32 else "0xHFC00"
    elif dt == dtypes.bool: init = "false"
    elif dt == dtypes.uint8: init = "0"
    else: init = str(-(1 << (8 * dt.itemsize - 1)))
    self.emit(f"store {ty} {init}, ptr {acc}")
    def nest(d):
      if d == len(rvars):
        v = self.value(e.src[0])
        a = self.t()
        self.emit(f"{a} = load {ty}, ptr {acc}")
        r = self.combine(rop, dt, a, v)
        self.emit(f"store {ty} {r}, ptr {acc}")
        return
      self.loop(rvars[d], "0", str(rvars[d].size), lambda: nest(d + 1))
    nest(0)
    r = self.t("red")
    self.emit(f"{r} = load {ty}, ptr {acc}")
    return r

  def combine(self, rop, dt: DType, a: str, b: str) -> str:
    ty, r = VT[dt.name], self.t()
    if dt == dtypes.bool: self.emit(f"{r} = {'and' if rop is Ops.MUL else 'or'} i1 {a}, {b}"); return r
    if dt.is_float():
      if rop is Ops.MAX:
        f = self.intrinsic(f"llvm.maximum.{SUF[dt.name]}", ty, f"{ty}, {ty}")
        self.emit(f"{r} = call {ty} @{f}({ty} {a}, {ty} {b})"); return r
      self.emit(f"{r} = {'fadd' if rop is Ops.ADD else 'fmul'} reassoc nsz {ty} {a}, {b}"); return r
    if rop is Ops.MAX:
      f = self.intrinsic(f"llvm.{'umax' if dt == dtypes.uint8 else 'smax'}.{ty}", ty, f"{ty}, {ty}")
      self.emit(f"{r} = call {ty} @{f}({ty} {a}, {ty} {b})"); return r
    self.emit(f"{r} = {'add' if rop is Ops.ADD else 'mul'} {ty} {a}, {b}"); return r

  def alu(self, e: Expr, a: list) -> str:
    op, dt = e.op, e.dtype
    sdt = e.src[-1].dtype if op is not Ops.WHERE else dt
    ty, sty = VT[dt.name], VT[sdt.name]
    r = self.t()
    E = self.emit
    if op is Ops.CAST: return self.cast(e.src[0].dtype, dt, a[0])
    if op is Ops.BITCAST: E(f"{r} = bitcast {VT[e.src[0].dtype.name]} {a[0]} to {ty}"); return r
    if op is Ops.WHERE: E(f"{r} = select i1 {a[0]}, {ty} {a[1]}, {ty} {a[2]}"); return r
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      if sdt.is_float(): pred = {Ops.CMPLT: "fcmp olt", Ops.CMPNE: "fcmp une", Ops.CMPEQ: "fcmp oeq"}[op]
      else: pred = {Ops.CMPLT: "icmp slt" if sdt.kind == 'i' else "icmp ult", Ops.CMPNE: "icmp ne", Ops.CMPEQ: "icmp eq"}[op]
      E(f"{r} = {pred} {sty} {a[0]}, {a[1]}"); return r
    if sdt == dtypes.bool:
      if op in (Ops.NEG, Ops.TRUNC): return a[0]
      if op is Ops.IDIV: op = Ops.AND
      if op is Ops.MOD:
        nb = self.t(); E(f"{nb} = xor i1 {a[1]}, true"); E(f"{r} = and i1 {a[0]}, {nb}"); return r
      ins = {Ops.ADD: "or", Ops.SUB: "xor", Ops.MUL: "and", Ops.MAX: "or", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}[op]
      E(f"{r} = {ins} i1 {a[0]}, {a[1]}"); return r
    if dt.is_float():
      if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV):
        E(f"{r} = {dict([(Ops.ADD, 'fadd'), (Ops.SUB, 'fsub'), (Ops.MUL, 'fmul'), (Ops.FDIV, 'fdiv')])[op]} {ty} {a[0]}, {a[1]}"); return r
      if op is Ops.NEG: E(f"{r} = fneg {ty} {a[0]}"); return r
      if op is Ops.RECIPROCAL: E(f"{r} = fdiv {ty} {lconst(1.0, dt)}, {a[0]}"); return r
      if op is Ops.MAX:
        f = self.intrinsic(f"llvm.maximum.{SUF[dt.name]}", ty, f"{ty}, {ty}")
        E(f"{r} = call {ty} @{f}({ty} {a[0]}, {ty} {a[1]})"); return r
      name = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}[op]
      f = self.intrinsic(f"llvm.{name}.{SUF[dt.name]}", ty, ty)
      E(f"{r} = call {ty} @{f}({ty} {a[0]})"); return r
    # integers: wrap like C
    signed = dt.kind == 'i'
    if op is Ops.NEG: E(f"{r} = sub {ty} 0, {a[0]}"); return r
    if op is Ops.TRUNC: return a[0]
    if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR):
      E(f"{r} = {op.name.lower()} {ty} {a[0]}, {a[1]}"); return r
    if op is Ops.MAX:
      f = self.intrinsic(f"llvm.{'smax' if signed else 'umax'}.{ty}", ty, f"{ty}, {ty}")
      E(f"{r} = call {ty} @{f}({ty} {a[0]}, {ty} {a[1]})"); return r
    if op in (Ops.IDIV, Ops.MOD):
      x, y = a
      z, bs = self.t(), self.t()
      E(f"{z} = icmp eq {ty} {y}, 0")
      if signed:
        m1, bad = self.t(), self.t()
        E(f"{m1} = icmp eq {ty} {y}, -1"); E(f"{bad} = or i1 {z}, {m1}")
        E(f"{bs} = select i1 {bad}, {ty} 1, {ty} {y}")
      else: E(f"{bs} = select i1 {z}, {ty} 1, {ty} {y}")
      q = self.t()
      if op is Ops.IDIV:
        E(f"{q} = {'sdiv' if signed else 'udiv'} {ty} {x}, {bs}")
        if signed:
          ng, q2 = self.t(), self.t()
          E(f"{ng} = sub {ty} 0, {x}"); E(f"{q2} = select i1 {m1}, {ty} {ng}, {ty} {q}"); q = q2
        E(f"{r} = select i1 {z}, {ty} 0, {ty} {q}"); return r
      E(f"{q} = {'srem' if signed else 'urem'} {ty} {x}, {bs}")
      E(f"{r} = select i1 {z}, {ty} {x}, {ty} {q}"); return r
    raise CallsatError(f"LLVM backend: cannot render {op} on {dt.name}")

  def cast(self, src: DType, dst: DType, x: str) -> str:
    if src == dst: return x
    st, dt = VT[src.name], VT[dst.name]
    r = self.t()
    E = self.emit
    if dst == dtypes.bool:
      if src.is_float(): E(f"{r} = fcmp une {st} {x}, {_zero(src)}")
      else: E(f"{r} = icmp ne {st} {x}, 0")
      return r
    if src == dtypes.bool:
      E(f"{r} = {'uitofp' if dst.is_float() else 'zext'} i1 {x} to {dt}"); return r
    if src.is_float() and dst.is_float():
      E(f"{r} = {'fpext' if dst.itemsize > src.itemsize else 'fptrunc'} {st} {x} to {dt}"); return r
    if src.is_float():   # float -> int: truncate toward zero (as numpy/C on x86: via a 32- or 64-bit convert)
      wide = "i64" if dst.itemsize == 8 else "i32"
      y = self.t(); E(f"{y} = fptosi {st} {x} to {wide}")
      z = self.t(); E(f"{z} = freeze {wide} {y}")
      if dst.itemsize < 4: E(f"{r} = trunc {wide} {z} to {dt}"); return r
      return z
    if dst.is_float():
      E(f"{r} = {'sitofp' if src.kind == 'i' else 'uitofp'} {st} {x} to {dt}"); return r
    if dst.itemsize == src.itemsize: return x
    if dst.itemsize > src.itemsize: E(f"{r} = {'sext' if src.kind == 'i' else 'zext'} {st} {x} to {dt}"); return r
    E(f"{r} = trunc {st} {x} to {dt}"); return r

def _signature(k: Kernel, fname: str) -> str:
  ps = []
  for p in k.params:
    attrs = ["noalias"] if p.noalias else []
    attrs.append("nocapture")
    if p.readonly: attrs.append("readonly")
    if p.writeonly: attrs.append("writeonly")
    ps.append(f"ptr {' '.join(attrs)} align {p.align} %{p.name}")
  ps += ["i64 %start", "i64 %end"] + (["ptr %err"] if k.checked else [])
  return f"define void @{fname}({', '.join(ps)}) nounwind"

_LOOP_IDS = itertools.count(9100, 2)

def _noloop(decls: set) -> str:
  """`, !llvm.loop !N` for a latch branch: a loop the vectorizer and unroller leave alone (hand-written vector code or
  a scalar edge; compile time), with its metadata added to `decls`."""
  n = next(_LOOP_IDS)
  decls.add(f"!{n} = distinct !{{!{n}, !9001, !9002}}")
  decls |= {'!9001 = !{!"llvm.loop.vectorize.enable", i1 false}', '!9002 = !{!"llvm.loop.unroll.disable"}'}
  return f", !llvm.loop !{n}"

STREAM_STAGE = 8192      # bytes of the on-stack staging block of a streaming kernel (L1-resident)
NT_MD = "!9000 = !{i32 1}"

def _streams(k: Kernel) -> bool:
  return k.stream and not k.checked and len(k.domain) == 1 and _llvm()[0].get_process_triple().startswith("x86_64")

def _render_stream(k: Kernel, fname: str) -> tuple[str, set]:
  """A `stream` kernel: out[i + c] = value(i) for i in [start, end), written with non-temporal stores.

  The non-temporal store must be a 64-byte aligned vector store (scalar `!nontemporal` stores block the loop
  vectorizer; numpy buffers are only 16-byte aligned), while the value is any scalar expression. So the range is cut
  into segments that end on 64-byte boundaries of the output, at most STREAM_STAGE bytes each; each segment's values
  are computed by the plain (auto-vectorized) loop into a stack block, which is then copied out: a masked vector store
  up to the first aligned address (only the first segment of a range has one), aligned <64 bytes> `!nontemporal`
  stores, a masked store for the last partial vector (masked-off lanes never touch memory). An sfence ends the kernel, so the stores are visible to whichever thread
  joins this one."""
  f = _Fn(k)
  p = k.params[k.store.param]
  v0 = k.domain[0]
  ty, isz = MT[p.dtype.name], p.dtype.itemsize
  lanes, blk, c = 64 // isz, STREAM_STAGE // isz, k.store.idx.c
  vt = f"<{lanes} x {ty}>"
  sh = isz.bit_length() - 1
  E = f.emit
  f.allocas += [f"%stage = alloca {ty}, i64 {blk + lanes}, align 64", "%seg.addr = alloca i64", "%cp.addr = alloca i64"]
  E(f"%obase = ptrtoint ptr %{p.name} to i64")
  E("store i64 %start, ptr %seg.addr")
  E("br label %seg.cond")
  f.label("%seg.cond")
  E("%b = load i64, ptr %seg.addr")
  E("%seg.more = icmp slt i64 %b, %end")
  E("br i1 %seg.more, label %seg.body, label %seg.exit")
  f.label("%seg.body")
  # segment end: the last 64-byte boundary of the output at or below b + blk, or end
  E(f"%nx = add i64 %b, {blk}")
  E(f"%nx.g = add i64 %nx, {c}")
  E(f"%nx.b = shl i64 %nx.g, {sh}")
  E("%nx.a = add i64 %obase, %nx.b")
  E("%nx.m = and i64 %nx.a, 63")
  E(f"%nx.me = lshr i64 %nx.m, {sh}")
  E("%nx2 = sub i64 %nx, %nx.me")
  E("%nx.lt = icmp slt i64 %nx2, %end")
  E("%e = select i1 %nx.lt, i64 %nx2, i64 %end")
  def body():
    val = f.value(k.store.value)
    li = f.t(); E(f"{li} = sub i64 {f.vars[v0]}, %b")
    g = f.t("p"); E(f"{g} = getelementptr inbounds {ty}, ptr %stage, i64 {li}")
    if p.dtype == dtypes.bool:
      y = f.t(); E(f"{y} = zext i1 {val} to i8"); val = y
    E(f"store {ty} {val}, ptr {g}, align {isz}")
  f.loop(v0, "%b", "%e", body)
  # copy the stage out: head (scalar, to the first aligned address), aligned NT vectors, tail (scalar)
  E("%n = sub i64 %e, %b")
  E(f"%dg = add i64 %b, {c}")
  E(f"%dst = getelementptr inbounds {ty}, ptr %{p.name}, i64 %dg")
  E(f"%d.b = shl i64 %dg, {sh}")
  E("%d.a = add i64 %obase, %d.b")
  E("%d.m = and i64 %d.a, 63")
  E("%d.r = sub i64 64, %d.m")
  E("%d.r2 = and i64 %d.r, 63")
  E(f"%h0 = lshr i64 %d.r2, {sh}")
  E("%h.lt = icmp slt i64 %h0, %n")
  E("%h = select i1 %h.lt, i64 %h0, i64 %n")
  E("%nv0 = sub i64 %n, %h")
  E(f"%nv1 = lshr i64 %nv0, {(lanes).bit_length() - 1}")
  E(f"%nv = shl i64 %nv1, {(lanes).bit_length() - 1}")
  E("%vend = add i64 %h, %nv")
  mt = f"<{lanes} x i1>"
  msk = f.intrinsic(f"llvm.masked.store.v{lanes}{SUF[p.dtype.name] if p.dtype != dtypes.bool else 'i8'}", "void", f"{vt}, ptr, i32, {mt}")
  iota = "<" + ", ".join(f"i64 {j}" for j in range(lanes)) + ">"
  def masked(tag, at, count):   # stage[at:at+count] -> dst[at:at+count], count < lanes: one masked vector store
    E(f"%{tag}.sp = getelementptr inbounds {ty}, ptr %stage, i64 {at}")
    E(f"%{tag}.v = load {vt}, ptr %{tag}.sp, align {isz}")
    E(f"%{tag}.dp = getelementptr inbounds {ty}, ptr %dst, i64 {at}")
    E(f"%{tag}.c0 = insertelement <{lanes} x i64> poison, i64 {count}, i64 0")
    E(f"%{tag}.c = shufflevector <{lanes} x i64> %{tag}.c0, <{lanes} x i64> poison, <{lanes} x i32> zeroinitializer")
    E(f"%{tag}.m = icmp ult <{lanes} x i64> {iota}, %{tag}.c")
    E(f"call void @{msk}({vt} %{tag}.v, ptr %{tag}.dp, i32 {isz}, {mt} %{tag}.m)")
  masked("hd", "0", "%h")
  E("store i64 %h, ptr %cp.addr")
  E("br label %nt.cond")
  f.label("%nt.cond")
  E("%nt.j = load i64, ptr %cp.addr")
  E("%nt.ok = icmp slt i64 %nt.j, %vend")
  E("br i1 %nt.ok, label %nt.body, label %nt.exit")
  f.label("%nt.body")
  E(f"%nt.sp = getelementptr inbounds {ty}, ptr %stage, i64 %nt.j")
  E(f"%nt.v = load {vt}, ptr %nt.sp, align {isz}")
  E(f"%nt.dp = getelementptr inbounds {ty}, ptr %dst, i64 %nt.j")
  E(f"store {vt} %nt.v, ptr %nt.dp, align 64, !nontemporal !9000")
  E(f"%nt.n = add nuw nsw i64 %nt.j, {lanes}")
  E("store i64 %nt.n, ptr %cp.addr")
  E("br label %nt.cond" + _noloop(f.decls))
  f.label("%nt.exit")
  E("%tl.r = sub i64 %n, %vend")
  masked("tl", "%vend", "%tl.r")
  E("store i64 %e, ptr %seg.addr")
  E("br label %seg.cond" + _noloop(f.decls))
  f.label("%seg.exit")
  E("call void @llvm.x86.sse.sfence()")
  out = [_signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void", "}"]
  return "\n".join(out), f.decls | {"declare void @llvm.x86.sse.sfence()", NT_MD}

def _vec_ok(k: Kernel) -> bool:
  """A stream kernel whose value _VecFn can emit as explicit vector IR: loads unit-stride in the (only) loop var or
  invariant, no PAD masks, no reduces, no integer division, no bool arithmetic, at most 256 bytes per vector."""
  v0, lanes = k.domain[0], 64 // k.params[k.store.param].dtype.itemsize
  seen, stack = set(), [k.store.value]
  while stack:
    x = stack.pop()
    if id(x) in seen: continue
    seen.add(id(x)); stack.extend(x.src)
    if x.dtype.itemsize * lanes > 256: return False
    if x.op == 'const': continue
    if x.op == 'load':
      _, ix, valid = x.arg
      if valid or not (ix.is_const or ix.terms == ((v0, 1),)): return False
      continue
    if x.op in ('reduce', 'valid') or x.op in (Ops.IDIV, Ops.MOD): return False
    if x.op not in (Ops.CAST, Ops.BITCAST, Ops.WHERE) and any(s.dtype == dtypes.bool for s in x.src): return False
    if x.op is Ops.CAST and x.src[0].dtype == dtypes.bool and x.dtype == dtypes.bool: continue
  return True

class _VecFn:
  """Explicit <lanes x T> IR for a stream kernel's value at `lanes` consecutive indices starting at an i64 SSA value,
  optionally under a lane mask (masked loads: masked-off lanes never touch memory). Mirrors _Fn.alu/_Fn.cast."""
  def __init__(self, f: "_Fn", lanes: int):
    self.f, self.W = f, lanes
  def vt(self, dt: DType) -> str: return f"<{self.W} x {VT[dt.name]}>"
  def splat(self, dt: DType, s: str) -> str:
    f, W, ty = self.f, self.W, VT[dt.name]
    a, b = f.t(), f.t()
    f.emit(f"{a} = insertelement <{W} x {ty}> poison, {ty} {s}, i64 0")
    f.emit(f"{b} = shufflevector <{W} x {ty}> {a}, <{W} x {ty}> poison, <{W} x i32> zeroinitializer")
    return b
  def vsuf(self, dt: DType) -> str: return f"v{self.W}{SUF[dt.name]}"
  def value(self, e: Expr, base: str, mask: str | None) -> str:
    memo: dict = {}
    stack = [(e, False)]
    while stack:
      x, done = stack.pop()
      if id(x) in memo: continue
      if x.src and not done:
        stack.append((x, True)); stack.extend((s, False) for s in x.src if id(s) not in memo); continue
      memo[id(x)] = self.one(x, [memo[id(s)] for s in x.src], base, mask)
    return memo[id(e)]
  def one(self, e: Expr, a: list, base: str, mask: str | None) -> str:
    f, E, W = self.f, self.f.emit, self.W
    dt = e.dtype
    if e.op == 'const': return f"splat ({VT[dt.name]} {lconst(e.arg, dt)})"
    if e.op == 'load':
      pi, ix, _ = e.arg
      p = f.k.params[pi]
      mty = MT[p.dtype.name]
      if ix.is_const:
        g = f.ptr(pi, str(ix.c)); s = f.t("v")
        E(f"{s} = load {mty}, ptr {g}, align {p.align}")
        if p.dtype == dtypes.bool:
          y = f.t(); E(f"{y} = icmp ne i8 {s}, 0"); s = y
        return self.splat(dt, s)
      off = f.t(); E(f"{off} = add nsw i64 {base}, {ix.c}")
      g = f.ptr(pi, off); v = f.t("v")
      vm = f"<{W} x {mty}>"
      if mask is None: E(f"{v} = load {vm}, ptr {g}, align {p.align}")
      else:
        fn = f.intrinsic(f"llvm.masked.load.v{W}{SUF[p.dtype.name] if p.dtype != dtypes.bool else 'i8'}", vm, f"ptr, i32, <{W} x i1>, {vm}")
        E(f"{v} = call {vm} @{fn}(ptr {g}, i32 {p.align}, <{W} x i1> {mask}, {vm} zeroinitializer)")
      if p.dtype == dtypes.bool:
        y = f.t(); E(f"{y} = icmp ne {vm} {v}, zeroinitializer"); v = y
      return v
    op = e.op
    sdt = e.src[-1].dtype if op is not Ops.WHERE else dt
    ty, sty, r = self.vt(dt), self.vt(sdt), f.t()
    if op is Ops.CAST: return self.cast(e.src[0].dtype, dt, a[0])
    if op is Ops.BITCAST: E(f"{r} = bitcast {self.vt(e.src[0].dtype)} {a[0]} to {ty}"); return r
    if op is Ops.WHERE: E(f"{r} = select <{W} x i1> {a[0]}, {ty} {a[1]}, {ty} {a[2]}"); return r
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      if sdt.is_float(): pred = {Ops.CMPLT: "fcmp olt", Ops.CMPNE: "fcmp une", Ops.CMPEQ: "fcmp oeq"}[op]
      else: pred = {Ops.CMPLT: "icmp slt" if sdt.kind == 'i' else "icmp ult", Ops.CMPNE: "icmp ne", Ops.CMPEQ: "icmp eq"}[op]
      E(f"{r} = {pred} {sty} {a[0]}, {a[1]}"); return r
    if dt.is_float():
      if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV):
        E(f"{r} = {dict([(Ops.ADD, 'fadd'), (Ops.SUB, 'fsub'), (Ops.MUL, 'fmul'), (Ops.FDIV, 'fdiv')])[op]} {ty} {a[0]}, {a[1]}"); return r
      if op is Ops.NEG: E(f"{r} = fneg {ty} {a[0]}"); return r
      if op is Ops.RECIPROCAL: E(f"{r} = fdiv {ty} splat ({VT[dt.name]} {lconst(1.0, dt)}), {a[0]}"); return r
      if op is Ops.MAX:
        fn = f.intrinsic(f"llvm.maximum.{self.vsuf(dt)}", ty, f"{ty}, {ty}")
        E(f"{r} = call {ty} @{fn}({ty} {a[0]}, {ty} {a[1]})"); return r
      name = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}[op]
      fn = f.intrinsic(f"llvm.{name}.{self.vsuf(dt)}", ty, ty)
      E(f"{r} = call {ty} @{fn}({ty} {a[0]})"); return r
    if op is Ops.NEG: E(f"{r} = sub {ty} zeroinitializer, {a[0]}"); return r
    if op is Ops.TRUNC: return a[0]
    if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR):
      E(f"{r} = {op.name.lower()} {ty} {a[0]}, {a[1]}"); return r
    if op is Ops.MAX:
      fn = f.intrinsic(f"llvm.{'smax' if dt.kind == 'i' else 'umax'}.{self.vsuf(dt)}", ty, f"{ty}, {ty}")
      E(f"{r} = call {ty} @{fn}({ty} {a[0]}, {ty} {a[1]})"); return r
    raise CallsatError(f"LLVM backend: cannot vectorize {op} on {dt.name}")
  def cast(self, src: DType, dst: DType, x: str) -> str:
    if src == dst: return x
    f, E = self.f, self.f.emit
    st, dt, r = self.vt(src), self.vt(dst), f.t()
    if dst == dtypes.bool:
      E(f"{r} = {'fcmp une' if src.is_float() else 'icmp ne'} {st} {x}, zeroinitializer"); return r
    if src == dtypes.bool: E(f"{r} = {'uitofp' if dst.is_float() else 'zext'} {st} {x} to {dt}"); return r
    if src.is_float() and dst.is_float():
      E(f"{r} = {'fpext' if dst.itemsize > src.itemsize else 'fptrunc'} {st} {x} to {dt}"); return r
    if src.is_float():
      wide = f"<{self.W} x {'i64' if dst.itemsize == 8 else 'i32'}>"
      y, z = f.t(), f.t()
      E(f"{y} = fptosi {st} {x} to {wide}"); E(f"{z} = freeze {wide} {y}")
      if dst.itemsize < 4: E(f"{r} = trunc {wide} {z} to {dt}"); return r
      return z
    if dst.is_float(): E(f"{r} = {'sitofp' if src.kind == 'i' else 'uitofp'} {st} {x} to {dt}"); return r
    if dst.itemsize == src.itemsize: return x
    if dst.itemsize > src.itemsize: E(f"{r} = {'sext' if src.kind == 'i' else 'zext'} {st} {x} to {dt}"); return r
    E(f"{r} = trunc {st} {x} to {dt}"); return r

def _render_stream_vec(k: Kernel, fname: str) -> tuple[str, set]:
  """A `stream` kernel whose value vectorizes explicitly (_vec_ok): no stack block, no auto-vectorizer. One masked
  vector step up to the first 64-byte boundary of the output, then aligned <64 bytes> `!nontemporal` vector stores
  straight from the vector loop, one masked step for the tail; an sfence at the end."""
  f = _Fn(k)
  p = k.params[k.store.param]
  ty, isz = MT[p.dtype.name], p.dtype.itemsize
  W, c, sh = 64 // isz, k.store.idx.c, isz.bit_length() - 1
  vf, E = _VecFn(f, W), f.emit
  vm, mt = f"<{W} x {ty}>", f"<{W} x i1>"
  msk = f.intrinsic(f"llvm.masked.store.v{W}{SUF[p.dtype.name] if p.dtype != dtypes.bool else 'i8'}", "void", f"{vm}, ptr, i32, {mt}")
  iota = "<" + ", ".join(f"i64 {j}" for j in range(W)) + ">"
  def step(tag: str, base: str, count: str | None, nt: bool):
    mask = None
    if count is not None:
      c0, cv, mask = f.t(), f.t(), f"%{tag}.m"
      E(f"{c0} = insertelement <{W} x i64> poison, i64 {count}, i64 0")
      E(f"{cv} = shufflevector <{W} x i64> {c0}, <{W} x i64> poison, <{W} x i32> zeroinitializer")
      E(f"{mask} = icmp ult <{W} x i64> {iota}, {cv}")
    val = vf.value(k.store.value, base, mask)
    if p.dtype == dtypes.bool:
      y = f.t(); E(f"{y} = zext {mt} {val} to {vm}"); val = y
    o = f.t(); E(f"{o} = add nsw i64 {base}, {c}")
    g = f.ptr(k.store.param, o)
    if mask is None: E(f"store {vm} {val}, ptr {g}, align 64" + (", !nontemporal !9000" if nt else ""))
    else: E(f"call void @{msk}({vm} {val}, ptr {g}, i32 {isz}, {mt} {mask})")
  E(f"%obase = ptrtoint ptr %{p.name} to i64")
  E("%n = sub i64 %end, %start")
  E(f"%d.g = add i64 %start, {c}")
  E(f"%d.b = shl i64 %d.g, {sh}")
  E("%d.a = add i64 %obase, %d.b")
  E("%d.m = and i64 %d.a, 63")
  E("%d.r = sub i64 64, %d.m")
  E("%d.r2 = and i64 %d.r, 63")
  E(f"%h0 = lshr i64 %d.r2, {sh}")
  E("%h.lt = icmp slt i64 %h0, %n")
  E("%h = select i1 %h.lt, i64 %h0, i64 %n")
  E("%h.any = icmp sgt i64 %h, 0")
  E("br i1 %h.any, label %head, label %v.pre")
  f.label("%head")
  step("hd", "%start", "%h", False)
  E("br label %v.pre")
  f.label("%v.pre")
  E("%vstart = add i64 %start, %h")
  E("%nv0 = sub i64 %n, %h")
  E(f"%nv1 = ashr i64 %nv0, {W.bit_length() - 1}")
  E(f"%nv = shl i64 %nv1, {W.bit_length() - 1}")
  E("%vend = add i64 %vstart, %nv")
  E("br label %v.cond")
  f.label("%v.cond")
  E("%vi = phi i64 [%vstart, %v.pre], [%vi.next, %v.body]")
  E("%v.ok = icmp slt i64 %vi, %vend")
  E("br i1 %v.ok, label %v.body, label %v.exit")
  f.label("%v.body")
  step("vb", "%vi", None, True)
  E(f"%vi.next = add nsw i64 %vi, {W}")
  E("br label %v.cond" + _noloop(f.decls))
  f.label("%v.exit")
  E("%tl.r = sub i64 %end, %vend")
  E("%tl.any = icmp sgt i64 %tl.r, 0")
  E("br i1 %tl.any, label %tail, label %done")
  f.label("%tail")
  step("tl", "%vend", "%tl.r", False)
  E("br label %done")
  f.label("%done")
  E("call void @llvm.x86.sse.sfence()")
  out = [_signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void", "}"]
  return "\n".join(out), f.decls | {"declare void @llvm.x86.sse.sfence()", NT_MD}

def render_llvm(k: Kernel, fname: str) -> tuple[str, set]:
  """One kernel as an LLVM function (text) and the intrinsic declarations it needs."""
  if k.tile and k.tile[0] == "matmul" and not k.checked:
    mm_helpers()
    return _render_matmul(k, fname)
  if _streams(k): return _render_stream_vec(k, fname) if _vec_ok(k) else _render_stream(k, fname)
  f = _Fn(k)
  def body():
    v = f.value(k.store.value)
    p = k.params[k.store.param]
    ix = f.idx(k.store.idx)
    f.check(k.store.param, ix)
    g = f.ptr(k.store.param, ix)
    if p.dtype == dtypes.bool:
      y = f.t(); f.emit(f"{y} = zext i1 {v} to i8"); v = y
    f.emit(f"store {MT[p.dtype.name]} {v}, ptr {g}, align {p.align}")
  def nest(d):
    if d == len(k.domain): body(); return
    v = k.domain[d]
    if d == 0: f.loop(v, "%start", "%end", lambda: nest(1))
    elif v.size == 1: nest(d + 1)
    else: f.loop(v, "0", str(v.size), lambda: nest(d + 1))
  nest(0)
  out = [_signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void"]
  for pi in sorted(set(f.fails)):
    out += [f"fail{pi}:", f"  store i32 {pi + 1}, ptr %err", "  ret void"]
  return "\n".join(out + ["}"]), f.decls

MM_KC = 256       # K block: one packed B micro-panel (KC x 32 floats, 32 KiB) stays in L1 with the packed A tile (8 KiB)
MM_PB = 8         # 32-column panels per packed B block (KC x 256 floats, 256 KiB: L2)
MM_MR, MM_NR = 8, 32

# The kernel-independent parts of the tiled matmul (packing and the scalar edge), with runtime strides: compiled once
# per process into their own module and called by every matmul kernel through these symbols (llvm.add_symbol), so a
# matmul kernel compiles only its loop nest and micro-kernel.
MM_HELPERS_IR = r"""
declare float @llvm.fma.f32(float, float, float)

; pack np 32-column panels of B (src: row k at src + k*bk, panel p at + 32p) into dst: panel p at dst + p*pstride,
; row k of a panel at + 32k (dst 64-byte aligned)
define void @callsat_mm_pack_b(ptr noalias nocapture readonly %src, ptr noalias nocapture writeonly align 64 %dst, i64 %kc, i64 %np, i64 %bk, i64 %pstride) nounwind {
entry:
  br label %p.cond
p.cond:
  %p = phi i64 [0, %entry], [%p.next, %k.exit]
  %p.ok = icmp slt i64 %p, %np
  br i1 %p.ok, label %p.body, label %done
p.body:
  %s0 = mul i64 %p, 32
  %d0 = mul i64 %p, %pstride
  br label %k.cond
k.cond:
  %k = phi i64 [0, %p.body], [%k.next, %k.body]
  %k.ok = icmp slt i64 %k, %kc
  br i1 %k.ok, label %k.body, label %k.exit
k.body:
  %sr = mul i64 %k, %bk
  %s = add i64 %sr, %s0
  %sp = getelementptr inbounds float, ptr %src, i64 %s
  %v0 = load <16 x float>, ptr %sp, align 4
  %sp1 = getelementptr inbounds float, ptr %sp, i64 16
  %v1 = load <16 x float>, ptr %sp1, align 4
  %dr = mul i64 %k, 32
  %d = add i64 %dr, %d0
  %dp = getelementptr inbounds float, ptr %dst, i64 %d
  store <16 x float> %v0, ptr %dp, align 64
  %dp1 = getelementptr inbounds float, ptr %dp, i64 16
  store <16 x float> %v1, ptr %dp1, align 64
  %k.next = add nuw nsw i64 %k, 1
  br label %k.cond, !llvm.loop !1
k.exit:
  %p.next = add i64 %p, 1
  br label %p.cond, !llvm.loop !3
done:
  ret void
}

; pack 8 rows of A (row r at src + r*ai, column k at + k*ak) k-major into dst: dst[8k + r]
define void @callsat_mm_pack_a(ptr noalias nocapture readonly %src, ptr noalias nocapture writeonly align 64 %dst, i64 %kc, i64 %ai, i64 %ak) nounwind {
entry:
  br label %k.cond
k.cond:
  %k = phi i64 [0, %entry], [%k.next, %k.body]
  %k.ok = icmp slt i64 %k, %kc
  br i1 %k.ok, label %k.body, label %done
k.body:
  %kc0 = mul i64 %k, %ak
  %kd = mul i64 %k, 8
  %r1 = add i64 %kc0, %ai
  %r2 = add i64 %r1, %ai
  %r3 = add i64 %r2, %ai
  %r4 = add i64 %r3, %ai
  %r5 = add i64 %r4, %ai
  %r6 = add i64 %r5, %ai
  %r7 = add i64 %r6, %ai
  %sp0 = getelementptr inbounds float, ptr %src, i64 %kc0
  %sp1 = getelementptr inbounds float, ptr %src, i64 %r1
  %sp2 = getelementptr inbounds float, ptr %src, i64 %r2
  %sp3 = getelementptr inbounds float, ptr %src, i64 %r3
  %sp4 = getelementptr inbounds float, ptr %src, i64 %r4
  %sp5 = getelementptr inbounds float, ptr %src, i64 %r5
  %sp6 = getelementptr inbounds float, ptr %src, i64 %r6
  %sp7 = getelementptr inbounds float, ptr %src, i64 %r7
  %x0 = load float, ptr %sp0, align 4
  %x1 = load float, ptr %sp1, align 4
  %x2 = load float, ptr %sp2, align 4
  %x3 = load float, ptr %sp3, align 4
  %x4 = load float, ptr %sp4, align 4
  %x5 = load float, ptr %sp5, align 4
  %x6 = load float, ptr %sp6, align 4
  %x7 = load float, ptr %sp7, align 4
  %w0 = insertelement <8 x float> poison, float %x0, i64 0
  %w1 = insertelement <8 x float> %w0, float %x1, i64 1
  %w2 = insertelement <8 x float> %w1, float %x2, i64 2
  %w3 = insertelement <8 x float> %w2, float %x3, i64 3
  %w4 = insertelement <8 x float> %w3, float %x4, i64 4
  %w5 = insertelement <8 x float> %w4, float %x5, i64 5
  %w6 = insertelement <8 x float> %w5, float %x6, i64 6
  %w7 = insertelement <8 x float> %w6, float %x7, i64 7
  %dp = getelementptr inbounds float, ptr %dst, i64 %kd
  store <8 x float> %w7, ptr %dp, align 32
  %k.next = add nuw nsw i64 %k, 1
  br label %k.cond, !llvm.loop !5
done:
  ret void
}

; the ragged edges, scalar: C[i*ci + j] = sum_k A[i*ai + k*ak] * B[k*bk + j] for rows [start, end) x columns
; [j0(i), n), where j0 = jfull for rows below iend (the full tiles covered the columns before it) and 0 after
define void @callsat_mm_edge(ptr nocapture readonly %a, ptr nocapture readonly %b, ptr nocapture %c, i64 %ai, i64 %ak, i64 %bk, i64 %ci, i64 %kk, i64 %n, i64 %start, i64 %iend, i64 %end, i64 %jfull) nounwind {
entry:
  br label %i.cond
i.cond:
  %i = phi i64 [%start, %entry], [%i.next, %j.exit]
  %i.ok = icmp slt i64 %i, %end
  br i1 %i.ok, label %i.body, label %done
i.body:
  %full = icmp slt i64 %i, %iend
  %j0 = select i1 %full, i64 %jfull, i64 0
  %ia = mul i64 %i, %ai
  %ic = mul i64 %i, %ci
  br label %j.cond
j.cond:
  %j = phi i64 [%j0, %i.body], [%j.next, %k.exit]
  %j.ok = icmp slt i64 %j, %n
  br i1 %j.ok, label %k.pre, label %j.exit
k.pre:
  %kz = icmp sgt i64 %kk, 0
  br i1 %kz, label %k.body, label %k.exit
k.body:
  %k = phi i64 [0, %k.pre], [%k.next, %k.body]
  %acc = phi float [0.0, %k.pre], [%acc.next, %k.body]
  %ka = mul i64 %k, %ak
  %ao = add i64 %ia, %ka
  %ap = getelementptr inbounds float, ptr %a, i64 %ao
  %av = load float, ptr %ap, align 4
  %kb = mul i64 %k, %bk
  %bo = add i64 %kb, %j
  %bp = getelementptr inbounds float, ptr %b, i64 %bo
  %bv = load float, ptr %bp, align 4
  %acc.next = call float @llvm.fma.f32(float %av, float %bv, float %acc)
  %k.next = add nuw nsw i64 %k, 1
  %k.done = icmp eq i64 %k.next, %kk
  br i1 %k.done, label %k.exit, label %k.body, !llvm.loop !7
k.exit:
  %sum = phi float [0.0, %k.pre], [%acc.next, %k.body]
  %co = add i64 %ic, %j
  %cp = getelementptr inbounds float, ptr %c, i64 %co
  store float %sum, ptr %cp, align 4
  %j.next = add i64 %j, 1
  br label %j.cond, !llvm.loop !9
j.exit:
  %i.next = add i64 %i, 1
  br label %i.cond, !llvm.loop !11
done:
  ret void
}

!0 = !{!"llvm.loop.vectorize.enable", i1 false}
!10 = !{!"llvm.loop.unroll.disable"}
!1 = distinct !{!1, !0, !10}
!3 = distinct !{!3, !0, !10}
!5 = distinct !{!5, !0, !10}
!7 = distinct !{!7, !0, !10}
!9 = distinct !{!9, !0, !10}
!11 = distinct !{!11, !0, !10}
"""
MM_HELPER_DECLS = {
  "declare void @callsat_mm_pack_b(ptr, ptr, i64, i64, i64, i64)", "declare void @callsat_mm_pack_a(ptr, ptr, i64, i64, i64)",
  "declare void @callsat_mm_edge(ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64)"}
_MM_HELPERS = None

def mm_helpers():
  """Compile the matmul helpers once per process and register their symbols for later modules; (engine, ms)."""
  global _MM_HELPERS
  if _MM_HELPERS is None:
    llvm, make_tm, tm_opt, _, _ = _llvm()
    t0 = time.perf_counter()
    mod = llvm.parse_assembly(MM_HELPERS_IR)
    mod.triple, mod.data_layout = llvm.get_process_triple(), str(tm_opt.target_data)
    mod.verify()
    pb = llvm.create_pass_builder(tm_opt, llvm.create_pipeline_tuning_options(speed_level=2))
    pb.getModulePassManager().run(mod, pb)
    engine = llvm.create_mcjit_compiler(mod, make_tm())
    engine.finalize_object()
    for name in ("callsat_mm_pack_b", "callsat_mm_pack_a", "callsat_mm_edge"):
      llvm.add_symbol(name, engine.get_function_address(name))
    _MM_HELPERS = (engine, (time.perf_counter() - t0) * 1e3)
  return _MM_HELPERS

def _render_matmul(k: Kernel, fname: str) -> str:
  """C[i, j] = sum_k A[ai*i + ak*k + ac] * B[bk*k + j + bc], stored at C[ci*i + j + cc], GotoBLAS-style:

    for jb (MM_PB panels of 32 columns), for kb (MM_KC rows of k):
      pack B[kb:kb+kc, panels] into Bp (stack, 64-byte aligned, one contiguous kc x 32 micro-panel per panel)
      for it in [start, iend) step MR: pack A[it:it+MR, kb:kb+kc] into Ap (k-major: MR floats per k, any A strides)
        for each panel: MR x 2 <16 x float> accumulators (zero on the first k block, else loaded from C), k innermost
          over the packed panels (unit stride, aligned), stored to C
  Packing and the ragged edges (rows [iend, end), columns past the last full panel; scalar) are calls to the shared
  precompiled helpers (mm_helpers). Each thread (a [start, end) row range) packs its own copies; the stack holds
  MM_KC * (MM_PB * 32 + MR) floats (264 KiB)."""
  _, MR, NR = k.tile
  assert (MR, NR) == (MM_MR, MM_NR)
  pa, A, pb, B, iv, jv, kv = k.matmul
  C = k.store.idx
  M, N, K = iv.size, jv.size, kv.size
  NV = NR // 16
  ai, ak, bk, ci = A.coef(iv), A.coef(kv), B.coef(kv), C.coef(iv)
  ac, bc, cc = A.c, B.c, C.c
  P = lambda i: "%" + k.params[i].name
  pc = k.store.param
  KC, PB = min(MM_KC, K), MM_PB
  NT = N // NR
  L = [_signature(k, fname) + " {", "entry:"]
  E = L.append
  D = set(MATMUL_DECLS) | MM_HELPER_DECLS
  vt = "<16 x float>"
  E(f"  %Bp = alloca float, i64 {KC * PB * NR}, align 64")
  E(f"  %Ap = alloca float, i64 {KC * MR}, align 64")
  E(f"  %A0 = getelementptr inbounds float, ptr {P(pa)}, i64 {ac}")
  E(f"  %B0 = getelementptr inbounds float, ptr {P(pb)}, i64 {bc}")
  E(f"  %mfull = sub i64 %end, %start")
  E(f"  %mt = sdiv i64 %mfull, {MR}")
  E(f"  %mtail = mul i64 %mt, {MR}")
  E(f"  %iend = add i64 %start, %mtail")
  E(f"  %anyrows = icmp sgt i64 %mt, 0")
  E(f"  br i1 %anyrows, label %jb.cond, label %edge")
  E("jb.cond:")
  E(f"  %jb = phi i64 [0, %entry], [%jb.next, %kb.exit]")
  E(f"  %jb.ok = icmp slt i64 %jb, {NT}")
  E(f"  br i1 %jb.ok, label %jb.body, label %edge")
  E("jb.body:")
  E(f"  %jb.rest = sub i64 {NT}, %jb")
  E(f"  %jb.small = icmp slt i64 %jb.rest, {PB}")
  E(f"  %np = select i1 %jb.small, i64 %jb.rest, i64 {PB}")
  E(f"  %jb.col = mul i64 %jb, {NR}")
  E(f"  br label %kb.cond")
  E("kb.cond:")
  E(f"  %kb = phi i64 [0, %jb.body], [%kb.next, %it.exit]")
  E(f"  %kb.ok = icmp slt i64 %kb, {K}")
  E(f"  br i1 %kb.ok, label %kb.body, label %kb.exit")
  E("kb.body:")
  E(f"  %kb.rest = sub i64 {K}, %kb")
  E(f"  %kb.small = icmp slt i64 %kb.rest, {KC}")
  E(f"  %kc = select i1 %kb.small, i64 %kb.rest, i64 {KC}")
  E(f"  %first = icmp eq i64 %kb, 0")
  E(f"  %bs.r = mul i64 %kb, {bk}")
  E(f"  %bs.o = add i64 %bs.r, %jb.col")
  E(f"  %bs = getelementptr inbounds float, ptr %B0, i64 %bs.o")
  E(f"  call void @callsat_mm_pack_b(ptr %bs, ptr %Bp, i64 %kc, i64 %np, i64 {bk}, i64 {KC * NR})")
  E(f"  %as.k = mul i64 %kb, {ak}")
  E(f"  br label %it.cond")
  E("it.cond:")
  E(f"  %it = phi i64 [%start, %kb.body], [%it.next, %p.exit]")
  E(f"  %it.ok = icmp slt i64 %it, %iend")
  E(f"  br i1 %it.ok, label %pa, label %it.exit")
  E("pa:")
  E(f"  %as.i = mul i64 %it, {ai}")
  E(f"  %as.o = add i64 %as.i, %as.k")
  E(f"  %as = getelementptr inbounds float, ptr %A0, i64 %as.o")
  E(f"  call void @callsat_mm_pack_a(ptr %as, ptr %Ap, i64 %kc, i64 {ai}, i64 {ak})")
  E(f"  br label %p.cond")
  E("p.cond:")
  E(f"  %p = phi i64 [0, %pa], [%p.next, %k.exit]")
  E(f"  %p.ok = icmp slt i64 %p, %np")
  E(f"  br i1 %p.ok, label %p.body, label %p.exit")
  E("p.body:")
  E(f"  %pcol0 = add i64 %jb, %p")
  E(f"  %j0 = mul i64 %pcol0, {NR}")
  E(f"  %bpo = mul i64 %p, {KC * NR}")
  for r in range(MR):
    E(f"  %cr{r} = add i64 %it, {r}")
    E(f"  %ci{r} = mul i64 %cr{r}, {ci}")
    E(f"  %cj{r} = add i64 %ci{r}, %j0")
    for v in range(NV):
      E(f"  %co{r}_{v} = add i64 %cj{r}, {cc + 16 * v}")
      E(f"  %cp{r}_{v} = getelementptr inbounds float, ptr {P(pc)}, i64 %co{r}_{v}")
  E(f"  br i1 %first, label %k.pre, label %c.load")
  E("c.load:")
  for r in range(MR):
    for v in range(NV): E(f"  %cl{r}_{v} = load {vt}, ptr %cp{r}_{v}, align 4")
  E(f"  br label %k.pre")
  E("k.pre:")
  for r in range(MR):
    for v in range(NV): E(f"  %ci{r}_{v} = phi {vt} [zeroinitializer, %p.body], [%cl{r}_{v}, %c.load]")
  E("  br label %k.body")
  E("k.body:")
  E(f"  %k = phi i64 [0, %k.pre], [%k.next, %k.body]")
  for r in range(MR):
    for v in range(NV):
      E(f"  %acc{r}_{v} = phi {vt} [%ci{r}_{v}, %k.pre], [%nacc{r}_{v}, %k.body]")
  E(f"  %kr = mul i64 %k, {NR}")
  E(f"  %kb0 = add i64 %kr, %bpo")
  for v in range(NV):
    E(f"  %bo{v} = add i64 %kb0, {16 * v}")
    E(f"  %bp{v} = getelementptr inbounds float, ptr %Bp, i64 %bo{v}")
    E(f"  %b{v} = load {vt}, ptr %bp{v}, align 64")
  E(f"  %ka = mul i64 %k, {MR}")
  for r in range(MR):
    E(f"  %ao{r} = add i64 %ka, {r}")
    E(f"  %ap{r} = getelementptr inbounds float, ptr %Ap, i64 %ao{r}")
    E(f"  %a{r} = load float, ptr %ap{r}, align 4")
    E(f"  %ai{r}v = insertelement <16 x float> poison, float %a{r}, i64 0")
    E(f"  %as{r} = shufflevector <16 x float> %ai{r}v, <16 x float> poison, <16 x i32> zeroinitializer")
    for v in range(NV):
      E(f"  %nacc{r}_{v} = call {vt} @llvm.fma.v16f32({vt} %as{r}, {vt} %b{v}, {vt} %acc{r}_{v})")
  E(f"  %k.next = add nuw nsw i64 %k, 1")
  E(f"  %k.done = icmp eq i64 %k.next, %kc")
  E(f"  br i1 %k.done, label %k.exit, label %k.body" + _noloop(D))
  E("k.exit:")
  for r in range(MR):
    for v in range(NV): E(f"  store {vt} %nacc{r}_{v}, ptr %cp{r}_{v}, align 4")
  E(f"  %p.next = add i64 %p, 1")
  E(f"  br label %p.cond" + _noloop(D))
  E("p.exit:")
  E(f"  %it.next = add i64 %it, {MR}")
  E(f"  br label %it.cond" + _noloop(D))
  E("it.exit:")
  E(f"  %kb.next = add i64 %kb, {KC}")
  E(f"  br label %kb.cond" + _noloop(D))
  E("kb.exit:")
  E(f"  %jb.next = add i64 %jb, {PB}")
  E(f"  br label %jb.cond" + _noloop(D))
  E("edge:")
  E(f"  %C0 = getelementptr inbounds float, ptr {P(pc)}, i64 {cc}")
  E(f"  call void @callsat_mm_edge(ptr %A0, ptr %B0, ptr %C0, i64 {ai}, i64 {ak}, i64 {bk}, i64 {ci}, i64 {K}, i64 {N}, "
    f"i64 %start, i64 %iend, i64 %end, i64 {NT * NR})")
  E("  ret void")
  E("}")
  return "\n".join(L), D


MATMUL_DECLS = {"declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)",
                "declare float @llvm.fma.f32(float, float, float)"}

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
  from lower.runtime import UnallocatedBufferError
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
    if a.shape != (b.arg.size,) or a.dtype != b.dtype.np:
      raise CallsatError(f"BUFFER uid={b.arg.uid}: storage holds {a.dtype}{a.shape}, the node says {b.dtype.name}({b.arg.size},)")
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
