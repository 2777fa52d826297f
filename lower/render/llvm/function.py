"""One LLVM function from kernel IR: the scalar renderer (LLVMRenderer: loops as allocas, indices, loads, reduces,
bounds checks; its ALU ops and casts are lower/render/llvm/isel.py's), the signature every kernel has and the loop metadata
that keeps the vectorizer and unroller off hand-written loops. lower/render/llvm/module.py puts kernels together from these."""
from __future__ import annotations
import itertools
from egraph.ir.dtype import DType, dtypes
from egraph.ir.ops import Ops
from lower.schedule.kernel import Kernel, Var
from lower.render.llvm.isel import VT, MT, SUF, Isel, lconst
from lower.render.base import Renderer

class LLVMRenderer(Isel, Renderer):
  """The scalar renderer: SSA values, loop counters and accumulators as entry-block allocas (SROA makes them phis)."""
  VT, tmp, fmt = VT, "t", "%{}.{}"
  code_for_idx = {"div": lambda a, b: f"sdiv i64 {a}, {b}", "mod": lambda a, b: f"srem i64 {a}, {b}",
                  "udiv": lambda a, b: f"udiv i64 {a}, {b}", "umod": lambda a, b: f"urem i64 {a}, {b}",
                  "mul": lambda a, b: f"mul nsw i64 {a}, {b}", "add": lambda a, b: f"add nsw i64 {a}, {b}",
                  "ge": lambda a, b: f"icmp sge i64 {a}, {b}", "lt": lambda a, b: f"icmp slt i64 {a}, {b}",
                  "and": lambda a, b: f"and i1 {a}, {b}"}
  def __init__(self, k: Kernel):
    super().__init__(k)
    self.allocas, self.decls, self.fails = [], set(), []
  def label(self, name: str): self.lines.append(f"{name[1:]}:")
  def intrinsic(self, name: str, ret: str, args: str) -> str:
    self.decls.add(f"declare {ret} @{name}({args})")
    return name
  def ty(self, dt: DType) -> str: return VT[dt.name]
  def mty(self, dt: DType) -> str: return MT[dt.name]
  def sfx(self, dt: DType) -> str: return SUF[dt.name]
  def cst(self, v, dt: DType) -> str: return lconst(v, dt)
  def zero(self, dt: DType) -> str: return lconst(0, dt)
  def lit(self, c: int) -> str: return str(c)
  def op(self, o: str, a: str, b: str) -> str:
    r = self.t(); self.emit(f"{r} = {self.code_for_idx[o](a, b)}"); return r

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

  def blocks(self, name: str, lo: str, hi: str, step: int, body):
    """for b in [lo, hi) step `step`: body(b, min(b + step, hi)) (SSA values)."""
    addr, cond, bl, ex = self.t(name + ".addr"), self.t(name + ".cond"), self.t(name + ".body"), self.t(name + ".exit")
    self.allocas.append(f"{addr} = alloca i64")
    self.emit(f"store i64 {lo}, ptr {addr}"); self.emit(f"br label {cond}")
    self.label(cond)
    cur, ok = self.t(name), self.t()
    self.emit(f"{cur} = load i64, ptr {addr}"); self.emit(f"{ok} = icmp slt i64 {cur}, {hi}"); self.emit(f"br i1 {ok}, label {bl}, label {ex}")
    self.label(bl)
    end, nx, lt = self.t(), self.t(), self.t()
    self.emit(f"{nx} = add nsw i64 {cur}, {step}"); self.emit(f"{lt} = icmp slt i64 {nx}, {hi}")
    self.emit(f"{end} = select i1 {lt}, i64 {nx}, i64 {hi}")
    body(cur, end)
    self.emit(f"store i64 {nx}, ptr {addr}"); self.emit(f"br label {cond}")
    self.label(ex)

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

  # the renderer's hooks
  def range(self, v: Var, body): self.loop(v, "0", str(v.size), body)
  def read(self, pi: int, ix: str, ok: str | None) -> str:
    """Param pi at ix; under a mask `ok` the index is 0 where it is off (no access outside the buffer)."""
    p = self.k.params[pi]
    if ok is not None:
      y = self.t(); self.emit(f"{y} = select i1 {ok}, i64 {ix}, i64 0"); ix = y
    self.check(pi, ix)
    g = self.ptr(pi, ix)
    v = self.t("v")
    self.emit(f"{v} = load {MT[p.dtype.name]}, ptr {g}, align {p.align}")
    return self.from_mem(p.dtype, v)
  def acc_new(self, rop, dt: DType) -> str:
    acc = self.t("acc")
    self.allocas.append(f"{acc} = alloca {VT[dt.name]}")
    self.emit(f"store {VT[dt.name]} {reduce_init(rop, dt)}, ptr {acc}")
    return acc
  def acc_add(self, acc: str, rop, dt: DType, v: str):
    a, ty = self.t(), VT[dt.name]
    self.emit(f"{a} = load {ty}, ptr {acc}")
    r = self.alu(rop, dt, (dt, dt), [a, v], " reassoc nsz")   # float reductions do not vectorize without it
    self.emit(f"store {ty} {r}, ptr {acc}")
  def acc_get(self, acc: str, dt: DType) -> str:
    r = self.t("red"); self.emit(f"{r} = load {VT[dt.name]}, ptr {acc}"); return r

def reduce_init(rop, dt: DType) -> str:
  if rop is Ops.ADD: return lconst(0, dt)
  if rop is Ops.MUL: return lconst(1, dt)
  if dt == dtypes.bool: return "false"
  return lconst(float("-inf") if dt.is_float() else dt.min, dt)

def signature(k: Kernel, fname: str) -> str:
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

def noloop(decls: set) -> str:
  """`, !llvm.loop !N` for a latch branch: a loop the vectorizer and unroller leave alone (hand-written vector code or
  a scalar edge; compile time), with its metadata added to `decls`."""
  n = next(_LOOP_IDS)
  decls.add(f"!{n} = distinct !{{!{n}, !9001, !9002}}")
  decls |= {'!9001 = !{!"llvm.loop.vectorize.enable", i1 false}', '!9002 = !{!"llvm.loop.unroll.disable"}'}
  return f", !llvm.loop !{n}"
