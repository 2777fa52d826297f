"""Streaming stores: a `stream` kernel (one live axis, a large write-only contiguous output) written with aligned
non-temporal vector stores, either straight from explicit vector IR of its value (VecRenderer, when it vectorizes that
way: no auto-vectorizer, ~half the compile time) or through a stack block the plain loop fills. An sfence ends it."""
from __future__ import annotations
import platform
from egraph.ir.dtype import DType, dtypes
from egraph.ir.ops import Ops
from lower.schedule.kernel import Kernel, Expr
from lower.render.llvm.function import LLVMRenderer, noloop, signature
from lower.render.llvm.isel import VT, MT, SUF, MSUF, Isel, lconst, reg_size
from lower.render.base import postorder

STREAM_STAGE = 8192      # bytes of the on-stack staging block of a streaming kernel (L1-resident)
NT_MD = "!9000 = !{i32 1}"

def _head_count(E, first: str, sh: int):
  """%h = min(%n, elements from output element `first` (byte offset `first` << sh from %obase) to the next 64-byte
  boundary): the scalar or masked head before the aligned non-temporal vector stores."""
  E(f"%d.b = shl i64 {first}, {sh}")
  E("%d.a = add i64 %obase, %d.b")
  E("%d.m = and i64 %d.a, 63")
  E("%d.r = sub i64 64, %d.m")
  E("%d.r2 = and i64 %d.r, 63")
  E(f"%h0 = lshr i64 %d.r2, {sh}")
  E("%h.lt = icmp slt i64 %h0, %n")
  E("%h = select i1 %h.lt, i64 %h0, i64 %n")

def streams(k: Kernel) -> bool:
  """Whether `k` is rendered with non-temporal stores (render_stream)."""
  return k.stream and not k.checked and len(k.domain) == 1 and platform.machine() in ("x86_64", "AMD64")

def _render_stream(k: Kernel, fname: str) -> tuple[str, set]:
  """A `stream` kernel: out[i + c] = value(i) for i in [start, end), written with non-temporal stores.

  The non-temporal store must be a 64-byte aligned vector store (scalar `!nontemporal` stores block the loop
  vectorizer; numpy buffers are only 16-byte aligned), while the value is any scalar expression. So the range is cut
  into segments that end on 64-byte boundaries of the output, at most STREAM_STAGE bytes each; each segment's values
  are computed by the plain (auto-vectorized) loop into a stack block, which is then copied out: a masked vector store
  up to the first aligned address (only the first segment of a range has one), aligned <64 bytes> `!nontemporal`
  stores, a masked store for the last partial vector (masked-off lanes never touch memory; _stage_out). An sfence ends
  the kernel, so the stores are visible to whichever thread joins this one."""
  f = LLVMRenderer(k)
  p = k.params[k.store.param]
  v0 = k.domain[0]
  ty, isz = MT[p.dtype.name], p.dtype.itemsize
  lanes, blk, c = 64 // isz, STREAM_STAGE // isz, k.store.idx.c
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
    val = f.to_mem(p.dtype, val)
    E(f"store {ty} {val}, ptr {g}, align {isz}")
  f.loop(v0, "%b", "%e", body)
  _stage_out(f, p, lanes, c, sh)
  E("store i64 %e, ptr %seg.addr")
  E("br label %seg.cond" + noloop(f.decls))
  f.label("%seg.exit")
  E("call void @llvm.x86.sse.sfence()")
  out = [signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void", "}"]
  return "\n".join(out), f.decls | {"declare void @llvm.x86.sse.sfence()", NT_MD}

def _stage_out(f: LLVMRenderer, p, lanes: int, c: int, sh: int):
  """Copy a stream segment's stage [%b, %e) to the output: a masked vector store up to the first 64-byte aligned
  address, aligned <64 bytes> `!nontemporal` stores, a masked store for the last partial vector."""
  E, ty, isz = f.emit, MT[p.dtype.name], p.dtype.itemsize
  vt = f"<{lanes} x {ty}>"
  E("%n = sub i64 %e, %b")
  E(f"%dg = add i64 %b, {c}")
  E(f"%dst = getelementptr inbounds {ty}, ptr %{p.name}, i64 %dg")
  _head_count(E, "%dg", sh)
  E("%nv0 = sub i64 %n, %h")
  E(f"%nv1 = lshr i64 %nv0, {(lanes).bit_length() - 1}")
  E(f"%nv = shl i64 %nv1, {(lanes).bit_length() - 1}")
  E("%vend = add i64 %h, %nv")
  mt = f"<{lanes} x i1>"
  msk = f.intrinsic(f"llvm.masked.store.v{lanes}{MSUF[p.dtype.name]}", "void", f"{vt}, ptr, i32, {mt}")
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
  E("br label %nt.cond" + noloop(f.decls))
  f.label("%nt.exit")
  E("%tl.r = sub i64 %n, %vend")
  masked("tl", "%vend", "%tl.r")

_DIVS = frozenset({Ops.IDIV, Ops.MOD})

def _vec_ok(k: Kernel) -> bool:
  """A stream kernel whose value VecRenderer can emit as explicit vector IR: loads unit-stride in the (only) loop var or
  invariant, no PAD masks, no reduces, no 64-bit integer division, no bool arithmetic, at most 256 bytes per vector."""
  v0, lanes = k.domain[0], 64 // k.params[k.store.param].dtype.itemsize
  seen, stack = set(), [k.store.value]
  while stack:
    x = stack.pop()
    if id(x) in seen: continue
    seen.add(id(x)); stack.extend(x.src)
    if reg_size(x.dtype) * lanes > 256: return False
    if x.op == 'const': continue
    if x.op == 'load':
      _, ix, valid = x.arg
      if valid or not (ix.is_const or ix.terms == ((v0, 1),)): return False
      continue
    if x.op in ('reduce', 'valid'): return False
    if x.op in _DIVS and x.dtype.itemsize > 4: return False   # 64-bit division has no vector form (<= 32 bits: in floats)
    if x.op not in (Ops.CAST, Ops.BITCAST, Ops.WHERE) and any(s.dtype == dtypes.bool for s in x.src): return False
    if x.op is Ops.CAST and x.src[0].dtype == dtypes.bool and x.dtype == dtypes.bool: continue
  return True

class VecRenderer(Isel):
  """Explicit <lanes x T> IR for a stream kernel's value at `lanes` consecutive indices starting at an i64 SSA value,
  optionally under a lane mask (masked loads: masked-off lanes never touch memory). Emits into the LLVMRenderer `f`; the ALU
  ops and casts are Isel's, spelled for vectors."""
  what = "vectorize"
  def __init__(self, f: LLVMRenderer, lanes: int):
    self.f, self.W = f, lanes
    self.t, self.emit, self.intrinsic = f.t, f.emit, f.intrinsic
  def ty(self, dt: DType) -> str: return f"<{self.W} x {VT[dt.name]}>"
  def mty(self, dt: DType) -> str: return f"<{self.W} x {MT[dt.name]}>"
  def sfx(self, dt: DType) -> str: return f"v{self.W}{SUF[dt.name]}"
  def cst(self, v, dt: DType) -> str: return f"splat ({VT[dt.name]} {lconst(v, dt)})"
  def zero(self, dt: DType) -> str: return "zeroinitializer"
  def splat(self, dt: DType, s: str) -> str:
    W, ty = self.W, VT[dt.name]
    a, b = self.t(), self.t()
    self.emit(f"{a} = insertelement <{W} x {ty}> poison, {ty} {s}, i64 0")
    self.emit(f"{b} = shufflevector <{W} x {ty}> {a}, <{W} x {ty}> poison, <{W} x i32> zeroinitializer")
    return b
  def value(self, e: Expr, base: str, mask: str | None) -> str:
    memo: dict = {}
    postorder(e, memo.get, memo.__setitem__, lambda x: self.one(x, [memo[id(s)] for s in x.src], base, mask))
    return memo[id(e)]
  def one(self, e: Expr, a: list, base: str, mask: str | None) -> str:
    f, E, W = self.f, self.emit, self.W
    dt = e.dtype
    if e.op == 'const': return self.cst(e.arg, dt)
    if e.op == 'load':
      pi, ix, _ = e.arg
      p = f.k.params[pi]
      mty = MT[p.dtype.name]
      if ix.is_const:
        g = f.ptr(pi, str(ix.c)); s = f.t("v")
        E(f"{s} = load {mty}, ptr {g}, align {p.align}")
        return self.splat(dt, f.from_mem(p.dtype, s))
      off = f.t(); E(f"{off} = add nsw i64 {base}, {ix.c}")
      g = f.ptr(pi, off); v = f.t("v")
      vm = f"<{W} x {mty}>"
      if mask is None: E(f"{v} = load {vm}, ptr {g}, align {p.align}")
      else:
        fn = f.intrinsic(f"llvm.masked.load.v{W}{MSUF[p.dtype.name]}", vm, f"ptr, i32, <{W} x i1>, {vm}")
        E(f"{v} = call {vm} @{fn}(ptr {g}, i32 {p.align}, <{W} x i1> {mask}, {vm} zeroinitializer)")
      return self.from_mem(p.dtype, v)
    return self.alu(e.op, dt, tuple(s.dtype for s in e.src), a)

def _render_stream_vec(k: Kernel, fname: str) -> tuple[str, set]:
  """A `stream` kernel whose value vectorizes explicitly (_vec_ok): no stack block, no auto-vectorizer. One masked
  vector step up to the first 64-byte boundary of the output, then aligned <64 bytes> `!nontemporal` vector stores
  straight from the vector loop, one masked step for the tail; an sfence at the end."""
  f = LLVMRenderer(k)
  p = k.params[k.store.param]
  ty, isz = MT[p.dtype.name], p.dtype.itemsize
  W, c, sh = 64 // isz, k.store.idx.c, isz.bit_length() - 1
  vf, E = VecRenderer(f, W), f.emit
  vm, mt = f"<{W} x {ty}>", f"<{W} x i1>"
  msk = f.intrinsic(f"llvm.masked.store.v{W}{MSUF[p.dtype.name]}", "void", f"{vm}, ptr, i32, {mt}")
  iota = "<" + ", ".join(f"i64 {j}" for j in range(W)) + ">"
  def step(tag: str, base: str, count: str | None, nt: bool):
    mask = None
    if count is not None:
      mask = f"%{tag}.m"; E(f"{mask} = icmp ult <{W} x i64> {iota}, {vf.splat(dtypes.int64, count)}")
    val = vf.to_mem(p.dtype, vf.value(k.store.value, base, mask))
    o = f.t(); E(f"{o} = add nsw i64 {base}, {c}")
    g = f.ptr(k.store.param, o)
    if mask is None: E(f"store {vm} {val}, ptr {g}, align 64" + (", !nontemporal !9000" if nt else ""))
    else: E(f"call void @{msk}({vm} {val}, ptr {g}, i32 {isz}, {mt} {mask})")
  E(f"%obase = ptrtoint ptr %{p.name} to i64")
  E("%n = sub i64 %end, %start")
  E(f"%d.g = add i64 %start, {c}")
  _head_count(E, "%d.g", sh)
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
  E("br label %v.cond" + noloop(f.decls))
  f.label("%v.exit")
  E("%tl.r = sub i64 %end, %vend")
  E("%tl.any = icmp sgt i64 %tl.r, 0")
  E("br i1 %tl.any, label %tail, label %done")
  f.label("%tail")
  step("tl", "%vend", "%tl.r", False)
  E("br label %done")
  f.label("%done")
  E("call void @llvm.x86.sse.sfence()")
  out = [signature(k, fname) + " {", "entry:"] + ["  " + a for a in f.allocas] + f.lines + ["  ret void", "}"]
  return "\n".join(out), f.decls | {"declare void @llvm.x86.sse.sfence()", NT_MD}

def render_stream(k: Kernel, fname: str) -> tuple[str, set]:
  """A `stream` kernel (streams(k)): explicit vector IR when its value allows (_vec_ok), else through a stack block."""
  return _render_stream_vec(k, fname) if _vec_ok(k) else _render_stream(k, fname)
