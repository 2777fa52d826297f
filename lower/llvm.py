"""Kernel IR -> LLVM IR text -> O3 (new pass manager, host CPU name + features) -> MCJIT -> ctypes; and the native runner.

Every kernel is `void @name(ptr p0, ..., i64 start, i64 end[, ptr err])`: it runs the outermost domain axis over
[start, end), so one function serves one thread or a split across threads (ctypes releases the GIL). Loop counters and
accumulators are allocas in the entry block (SROA turns them into phis). Float reductions carry `reassoc nsz` (they do
not vectorize without it); elementwise float math has no fast-math flags, so it is bit-exact with numpy except where
LLVM's libm calls differ. NaNs are kept (no `nnan`): MAX is llvm.maximum (NaN-propagating, as np.maximum).
`noalias` is claimed only for params the scheduler proved disjoint from every other param; alignment only as the
element size (numpy arrays are only 16-byte aligned). Kernels marked ("matmul", MR, NR) get an explicit register tile:
MR rows x NR columns of <16 x float> accumulators, k innermost, so the B panel stays in cache.

CHECK_BOUNDS=1: every load and store index is checked against its param's size; a violation stores (param + 1) into
the extra `err` out-param and returns; the runner raises BoundsError naming the kernel and the buffer.
"""
from __future__ import annotations
import ctypes, math, os, struct, sys, time
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

def render_llvm(k: Kernel, fname: str) -> tuple[str, set]:
  """One kernel as an LLVM function (text) and the intrinsic declarations it needs."""
  if k.tile and k.tile[0] == "matmul" and not k.checked: return _render_matmul(k, fname), set()
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

def _render_matmul(k: Kernel, fname: str) -> str:
  """C[i, j] = sum_k A[ai*i + ak*k + ac] * B[bk*k + j + bc], stored at C[ci*i + j + cc]: MR x (NR/16) <16 x float>
  accumulators per register tile, k innermost, the j tiles outside the i tiles; scalar loops for the ragged edges."""
  _, MR, NR = k.tile
  pa, A, pb, B, iv, jv, kv = k.matmul
  C = k.store.idx
  M, N, K = iv.size, jv.size, kv.size
  NV = NR // 16
  ai, ak, bk, ci = A.coef(iv), A.coef(kv), B.coef(kv), C.coef(iv)
  ac, bc, cc = A.c, B.c, C.c
  P = lambda i: "%" + k.params[i].name
  pc = k.store.param
  L = [_signature(k, fname) + " {", "entry:"]
  E = L.append
  vt = "<16 x float>"
  E(f"  %mfull = sub i64 %end, %start")
  E(f"  %mt = sdiv i64 %mfull, {MR}")
  E(f"  %mtail = mul i64 %mt, {MR}")
  E(f"  %iend = add i64 %start, %mtail")
  NT = N // NR
  # ---- full tiles: for jt in [0, NT): for it in [start, iend) step MR
  E(f"  br label %jt.cond")
  E("jt.cond:")
  E(f"  %jt = phi i64 [0, %entry], [%jt.next, %it.exit]")
  E(f"  %jt.ok = icmp slt i64 %jt, {NT}")
  E(f"  br i1 %jt.ok, label %it.pre, label %edge")
  E("it.pre:")
  E(f"  %j0 = mul i64 %jt, {NR}")
  E(f"  br label %it.cond")
  E("it.cond:")
  E(f"  %it = phi i64 [%start, %it.pre], [%it.next, %k.exit]")
  E(f"  %it.ok = icmp slt i64 %it, %iend")
  E(f"  br i1 %it.ok, label %k.pre, label %it.exit")
  E("k.pre:")
  E("  br label %k.body")
  E("k.body:")
  E(f"  %k = phi i64 [0, %k.pre], [%k.next, %k.body]")
  for r in range(MR):
    for v in range(NV):
      E(f"  %acc{r}_{v} = phi {vt} [zeroinitializer, %k.pre], [%nacc{r}_{v}, %k.body]")
  # B row: bk*k + j0 + 16v + bc
  E(f"  %bk = mul i64 %k, {bk}")
  E(f"  %bj = add i64 %bk, %j0")
  for v in range(NV):
    E(f"  %bo{v} = add i64 %bj, {bc + 16 * v}")
    E(f"  %bp{v} = getelementptr inbounds float, ptr {P(pb)}, i64 %bo{v}")
    E(f"  %b{v} = load {vt}, ptr %bp{v}, align 4")
  E(f"  %ak = mul i64 %k, {ak}")
  for r in range(MR):
    E(f"  %ir{r} = add i64 %it, {r}")
    E(f"  %ai{r} = mul i64 %ir{r}, {ai}")
    E(f"  %ao{r} = add i64 %ai{r}, %ak")
    E(f"  %ao{r}c = add i64 %ao{r}, {ac}")
    E(f"  %ap{r} = getelementptr inbounds float, ptr {P(pa)}, i64 %ao{r}c")
    E(f"  %a{r} = load float, ptr %ap{r}, align 4")
    E(f"  %ai{r}v = insertelement <16 x float> poison, float %a{r}, i64 0")
    E(f"  %as{r} = shufflevector <16 x float> %ai{r}v, <16 x float> poison, <16 x i32> zeroinitializer")
    for v in range(NV):
      E(f"  %nacc{r}_{v} = call {vt} @llvm.fma.v16f32({vt} %as{r}, {vt} %b{v}, {vt} %acc{r}_{v})")
  E(f"  %k.next = add nuw nsw i64 %k, 1")
  E(f"  %k.done = icmp eq i64 %k.next, {K}")
  E(f"  br i1 %k.done, label %k.exit, label %k.body")
  E("k.exit:")
  for r in range(MR):
    E(f"  %cr{r} = add i64 %it, {r}")
    E(f"  %ci{r} = mul i64 %cr{r}, {ci}")
    E(f"  %cj{r} = add i64 %ci{r}, %j0")
    for v in range(NV):
      E(f"  %co{r}_{v} = add i64 %cj{r}, {cc + 16 * v}")
      E(f"  %cp{r}_{v} = getelementptr inbounds float, ptr {P(pc)}, i64 %co{r}_{v}")
      E(f"  store {vt} %nacc{r}_{v}, ptr %cp{r}_{v}, align 4")
  E(f"  %it.next = add i64 %it, {MR}")
  E(f"  br label %it.cond")
  E("it.exit:")
  E(f"  %jt.next = add i64 %jt, 1")
  E(f"  br label %jt.cond")
  # ---- edges (scalar): rows [iend, end) x all j, and rows [start, iend) x j in [NT*NR, N)
  E("edge:")
  E(f"  br label %e.i.cond")
  E("e.i.cond:")
  E(f"  %ei = phi i64 [%start, %edge], [%ei.next, %e.j.exit]")
  E(f"  %ei.ok = icmp slt i64 %ei, %end")
  E(f"  br i1 %ei.ok, label %e.i.body, label %done")
  E("e.i.body:")
  E(f"  %ei.full = icmp slt i64 %ei, %iend")
  E(f"  %ej0 = select i1 %ei.full, i64 {NT * NR}, i64 0")
  E(f"  br label %e.j.cond")
  E("e.j.cond:")
  E(f"  %ej = phi i64 [%ej0, %e.i.body], [%ej.next, %e.k.exit]")
  E(f"  %ej.ok = icmp slt i64 %ej, {N}")
  E(f"  br i1 %ej.ok, label %e.k.pre, label %e.j.exit")
  E("e.k.pre:")
  E(f"  %eai = mul i64 %ei, {ai}")
  E(f"  %eai2 = add i64 %eai, {ac}")
  E(f"  %ebj = add i64 %ej, {bc}")
  E(f"  br label %e.k.body")
  E("e.k.body:")
  E(f"  %ek = phi i64 [0, %e.k.pre], [%ek.next, %e.k.body]")
  E(f"  %eacc = phi float [0.0, %e.k.pre], [%eacc.next, %e.k.body]")
  E(f"  %eak = mul i64 %ek, {ak}")
  E(f"  %eao = add i64 %eai2, %eak")
  E(f"  %eap = getelementptr inbounds float, ptr {P(pa)}, i64 %eao")
  E(f"  %eav = load float, ptr %eap, align 4")
  E(f"  %ebk = mul i64 %ek, {bk}")
  E(f"  %ebo = add i64 %ebj, %ebk")
  E(f"  %ebp = getelementptr inbounds float, ptr {P(pb)}, i64 %ebo")
  E(f"  %ebv = load float, ptr %ebp, align 4")
  E(f"  %eacc.next = call float @llvm.fma.f32(float %eav, float %ebv, float %eacc)")
  E(f"  %ek.next = add nuw nsw i64 %ek, 1")
  E(f"  %ek.done = icmp eq i64 %ek.next, {K}")
  E(f"  br i1 %ek.done, label %e.k.exit, label %e.k.body")
  E("e.k.exit:")
  E(f"  %eci = mul i64 %ei, {ci}")
  E(f"  %ecj = add i64 %eci, %ej")
  E(f"  %eco = add i64 %ecj, {cc}")
  E(f"  %ecp = getelementptr inbounds float, ptr {P(pc)}, i64 %eco")
  E(f"  store float %eacc.next, ptr %ecp, align 4")
  E(f"  %ej.next = add i64 %ej, 1")
  E(f"  br label %e.j.cond")
  E("e.j.exit:")
  E(f"  %ei.next = add i64 %ei, 1")
  E(f"  br label %e.i.cond")
  E("done:")
  E("  ret void")
  E("}")
  return "\n".join(L)

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
    if k.tile and not k.checked: decls |= MATMUL_DECLS
  return "\n\n".join(sorted(decls) + fns) + "\n"

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

_POOL: ThreadPoolExecutor | None = None
THREADS = max(1, min(2, os.cpu_count() or 1))
PARALLEL_WORK = 1 << 21          # estimated element-ops above which a kernel is split across THREADS

def _pool() -> ThreadPoolExecutor:
  global _POOL
  if _POOL is None: _POOL = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="callsat-kernel")
  return _POOL

def launch(c: Compiled, ptrs: list[int], work: int = 0, threads: int | None = None) -> None:
  k = c.kernel
  n0 = k.domain[0].size if k.domain else 1
  err = ctypes.c_int32(0) if k.checked else None
  extra = (ctypes.byref(err),) if k.checked else ()
  nt = THREADS if threads is None else threads
  step = k.tile[1] if k.tile else 1
  if nt > 1 and work >= PARALLEL_WORK and n0 >= 2 * step:
    cuts = [0] + [((n0 * t // nt) // step) * step for t in range(1, nt)] + [n0]
    futs = [_pool().submit(c.fn, *ptrs, cuts[t], cuts[t + 1], *extra) for t in range(1, nt)]
    c.fn(*ptrs, cuts[0], cuts[1], *extra)
    for f in futs: f.result()
  else: c.fn(*ptrs, 0, n0, *extra)
  if err is not None and err.value:
    p = k.params[err.value - 1]
    raise BoundsError(f"kernel {c.name}: index out of bounds on buffer {p.name} ({p.dtype.name}[{p.size}])")

# ---------------------------------------------------------------------------------------------------------------------
# the native runner

def _arg_binding(call):
  """PARAM slot -> Mem with canonical roots ('arg', j) (j: first argument on the same BUFFER), and the BUFFER nodes."""
  from egraph.ir import Ops as O
  from lower.schedule import Mem
  bufs, canon, bind = [], {}, {}
  for i, a in enumerate(call.src[1:]):
    b = a if a.op is O.BUFFER else a.src[0]
    if b.arg.uid not in canon: canon[b.arg.uid] = len(bufs); bufs.append(b)
    off = 0 if a.op is O.BUFFER else a.arg[0] * b.dtype.itemsize
    bind[i] = Mem(("arg", canon[b.arg.uid]), off, a.dtype, a.numel)
  return bind, bufs

def _buffers_in(body):
  from egraph.ir import Ops as O, toposort
  return {n.arg.uid: n for n in toposort([body]) if n.op is O.BUFFER}

def run_native(call, storage) -> None:
  """Execute a CALL with compiled kernels: schedule (cached per body + argument aliasing), compile misses, run."""
  from lower.schedule import schedule
  from lower.cache import CACHE
  from lower.runtime import UnallocatedBufferError
  checked = check_bounds()
  bind, bufs = _arg_binding(call)
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
