"""The renderer base: what the LLVM (lower/render/llvm/function.py) and CUDA (lower/render/cuda/render.py) renderers of one kernel share, after
tinygrad's Renderer: a table says how each index op is spelled (code_for_idx: op -> text), and one walk renders a value
DAG sources first with a scoped memo, index arithmetic, PAD validity masks, loads and reduce nests. A backend supplies
the spellings and the forms that differ: names (t), binding an expression to a name (let), a counted loop (range), a
memory read, ALU ops and casts (alu, cast) and the accumulator of a reduce. A float32 sum longer than SUM_BLOCK adds
blocks of at most SUM_BLOCK elements in their own accumulator and each block's partial into a float64 total."""
from __future__ import annotations
import functools
from egraph.ir.dtype import DType, dtypes
from egraph.ir.ops import Ops
from lower.schedule.kernel import Kernel, Expr, Idx, Var, Div

def sum_blocks(rop, dt: DType, rvars: tuple, block: int) -> tuple[int, int] | None:
  """(j, step): a float32 sum over `rvars` (outermost first) of more than `block` elements, cut into blocks of `step`
  iterations of rvars[j] times all of rvars[j+1:] (at most `block` elements each). None: one accumulator is enough.
  One float32 accumulator over 2e8 elements was off by 1.2e-4 relative (numpy's pairwise sum: 1.9e-7): every add
  rounds to the ulp of the running total."""
  if rop is not Ops.ADD or dt != dtypes.float32: return None
  inner = 1
  for j in range(len(rvars) - 1, -1, -1):
    if inner * rvars[j].size > block: return j, max(1, block // inner)
    inner *= rvars[j].size
  return None

def postorder(e: Expr, get, put, one) -> None:
  """put(id(x), one(x)) for each node x of the Expr DAG `e` that get(id(x)) does not have yet, sources first;
  iterative (chains can be long). A reduce's body is left to one(reduce): it is computed inside the reduce's loops."""
  stack = [(e, False)]
  while stack:
    x, done = stack.pop()
    if get(id(x)) is not None: continue
    if done or not x.src or x.op == 'reduce': put(id(x), one(x)); continue
    stack.append((x, True)); stack.extend((s, False) for s in x.src if get(id(s)) is None)

class Renderer:
  """One kernel's function body being rendered: `lines`, names numbered by `t`, values memoized per loop scope."""
  VT: dict                 # dtype name -> the type of a value
  tmp, fmt = "t", "{}{}"   # a name's default prefix; format(prefix, number)
  SUM_BLOCK = 4096         # elements a float32 sum accumulates before its partial goes into a float64 total (LLVM: in
                           # 16 x 4 vector lanes on AVX-512, 8 x 4 on AVX2: 64-128 adds each)
  code_for_idx: dict       # 'div' 'mod' 'udiv' 'umod' (of a value >= 0) 'mul' 'add' (i64), 'ge' 'lt' (compare), 'and' (bool) -> (a, b) -> text
  code_for_op: frozenset   # the ALU ops the backend spells (lower/schedule/decomp.py expands the others for all)

  def __init__(self, k: Kernel):
    self.k, self.lines, self.n, self.depth = k, [], 0, 1
    self.scopes: list[dict] = [{}]
    self.vars: dict = {}

  def t(self, prefix: str | None = None) -> str:
    self.n += 1
    return self.fmt.format(prefix or self.tmp, self.n)
  def emit(self, s: str): self.lines.append("  " * self.depth + s)
  def get(self, key):
    for s in reversed(self.scopes):
      if key in s: return s[key]
    return None
  def put(self, key, v): self.scopes[-1][key] = v

  # backend hooks
  def lit(self, c: int) -> str: raise NotImplementedError        # an i64 literal
  def cst(self, v, dt: DType) -> str: raise NotImplementedError  # a constant operand
  def op(self, o: str, a: str, b: str) -> str: return self.code_for_idx[o](a, b)   # inline; LLVM: a new SSA value
  def let(self, x: str, dt: DType, prefix: str | None = None) -> str: return x      # CUDA: a named const
  def range(self, v: Var, body) -> None: raise NotImplementedError                  # for v in [0, v.size): body()
  def loop(self, v: Var, lo: str, hi: str, body) -> None: raise NotImplementedError  # for v in [lo, hi): body()
  def blocks(self, name: str, lo: str, hi: str, step: int, body) -> None:          # body(b, min(b + step, hi)) per block
    raise NotImplementedError
  def read(self, pi: int, ix: str, ok: str | None) -> str: raise NotImplementedError
  def alu(self, op, dt: DType, sdts: tuple, a: list) -> str: raise NotImplementedError
  def acc_new(self, rop, dt: DType) -> str: raise NotImplementedError
  def acc_add(self, acc: str, rop, dt: DType, v: str) -> None: raise NotImplementedError
  def acc_get(self, acc: str, dt: DType) -> str: return acc

  # index expressions and PAD masks
  def idx(self, i: Idx) -> str:
    if i.is_const: return self.lit(i.c)
    key = ("idx", i)
    if (v := self.get(key)) is not None: return v
    acc = None
    for a, k in i.terms:
      if isinstance(a, Var): x = self.vars[a]
      else:   # over a non-negative value (Idx keeps its atoms so) the unsigned forms are exact, and cheaper
        o = ("div" if isinstance(a, Div) else "mod") if a.x.vmin < 0 else ("udiv" if isinstance(a, Div) else "umod")
        x = self.op(o, self.idx(a.x), self.lit(a.d))
      if k != 1: x = self.op("mul", x, self.lit(k))
      acc = x if acc is None else self.op("add", acc, x)
    if i.c: acc = self.op("add", acc, self.lit(i.c))
    acc = self.let(acc, dtypes.int64, "x")
    self.put(key, acc)
    return acc

  def valid(self, valid) -> str:
    key = ("valid", valid)
    if (v := self.get(key)) is not None: return v
    conds = []
    for b in valid:
      bi = self.idx(b.idx)
      if b.idx.vmin < b.lo: conds.append(self.op("ge", bi, self.lit(b.lo)))
      if b.idx.vmax >= b.hi: conds.append(self.op("lt", bi, self.lit(b.hi)))
    ok = functools.reduce(lambda x, y: self.op("and", x, y), conds) if conds else self.cst(True, dtypes.bool)
    ok = self.let(ok, dtypes.bool, "ok")
    self.put(key, ok)
    return ok

  # values
  def value(self, e: Expr) -> str:
    postorder(e, self.get, self.put, self.one)   # memo: the scopes (a value inside a loop is not reused outside)
    return self.get(id(e))

  def one(self, e: Expr) -> str:
    if e.op == 'const': return self.cst(e.arg, e.dtype)
    if e.op == 'load': return self.load(e)
    if e.op == 'valid': return self.valid(e.arg)
    if e.op == 'reduce': return self.reduce(e)
    return self.let(self.alu(e.op, e.dtype, tuple(s.dtype for s in e.src), [self.get(id(s)) for s in e.src]), e.dtype)

  def load(self, e: Expr) -> str:
    """A load masked by its PAD bounds: outside them it is 0 (and `read` must not touch memory)."""
    pi, i, valid = e.arg
    ix = self.idx(i)
    ok = self.valid(valid) if valid else None
    v = self.read(pi, ix, ok)
    if ok is not None: v = self.alu(Ops.WHERE, e.dtype, (dtypes.bool, e.dtype, e.dtype), [ok, v, self.cst(0, e.dtype)])
    return self.let(v, e.dtype)

  def reduce(self, e: Expr) -> str:
    """An accumulator loop nest over the reduce vars, evaluated where it is used; a long float32 sum in blocks."""
    rop, rvars = e.arg
    if (cut := sum_blocks(rop, e.dtype, rvars, self.SUM_BLOCK)) is not None: return self.blocked_sum(e, *cut)
    acc = self.acc_new(rop, e.dtype)
    def nest(d):
      if d == len(rvars): self.acc_add(acc, rop, e.dtype, self.value(e.src[0]))
      else: self.range(rvars[d], lambda: nest(d + 1))
    nest(0)
    return self.acc_get(acc, e.dtype)

  def blocked_sum(self, e: Expr, j: int, step: int) -> str:
    """A float32 sum in blocks of `step` iterations of rvars[j] (sum_blocks): each block in its own float32 accumulator
    (which the backend vectorizes), each block's partial added into a float64 total."""
    rop, rvars = e.arg
    f64 = dtypes.float64
    total = self.acc_new(rop, f64)
    def inner(d, acc):
      if d == len(rvars): self.acc_add(acc, rop, e.dtype, self.value(e.src[0]))
      else: self.range(rvars[d], lambda: inner(d + 1, acc))
    def block(lo, hi):
      self.scopes.append({})   # nothing computed in a block outlives it
      acc = self.acc_new(rop, e.dtype)
      self.loop(rvars[j], lo, hi, lambda: inner(j + 1, acc))
      self.acc_add(total, rop, f64, self.alu(Ops.CAST, f64, (e.dtype,), [self.acc_get(acc, e.dtype)]))
      self.scopes.pop()
    def nest(d):
      if d == j: self.blocks(rvars[j].name + "b", self.lit(0), self.lit(rvars[j].size), step, block)
      else: self.range(rvars[d], lambda: nest(d + 1))
    nest(0)
    return self.let(self.alu(Ops.CAST, e.dtype, (f64,), [self.acc_get(total, f64)]), e.dtype)
