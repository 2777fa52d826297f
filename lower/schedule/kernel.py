"""The kernel IR: one small, renderer-independent description of a loop kernel (LLVM now, CUDA later).

A `Kernel` is a loop nest over its `domain` (one `Var` per axis, outermost first; the outermost axis is the parallel one,
run as `[start, end)` chunks) around ONE `Store(param, index, value)`. Values are `Expr` DAGs:

  const(value)                          a scalar of the Expr's dtype
  load(param, index, valid)             `valid` is a tuple of bounds `lo <= idx < hi` (from PAD); outside them the load
                                        is 0 and must not touch memory
  <Ops.ALU>(srcs) / CAST / BITCAST      elementwise, with lower/reference.py's semantics (C integer wrap, x//0 == 0, ...)
  valid(bounds)                         bool: every `lo <= idx < hi` holds (a PAD mask over computed values)
  reduce(op, vars)(body)                an accumulator loop nest over `vars` (Ops.ADD / MUL / MAX), evaluated where it is used

Index expressions (`Idx`) are affine sums of atoms (loop `Var`s, floor `Div`s and `Mod`s of Idx by constants) with a
constant; they simplify on construction using the vars' ranges, so movement ops (reshape/permute/expand/shrink/pad/flip)
lower to plain strides whenever they are strides. Tiling is IR too: `Kernel.tile` names a register-tiled form
(`("matmul", MR, NR)`: C[i, j] = sum_k A[i, k] * B[k, j] over the domain (i, j) and the reduce var k), which a renderer
may emit instead of the plain nest; `Kernel.matmul` carries the strides it needs. `Kernel.stream` marks a large
contiguous output written once and never read in the kernel: a renderer may use non-temporal (streaming) stores.

`Param` is the signature: dtype, size (elements), the natural alignment that can be claimed, and whether the buffer is
provably disjoint from every other param (`noalias`) and only read / only written.
"""
from __future__ import annotations
import math
import numpy as np
from dataclasses import dataclass
from typing import Any
from egraph.ir.dtype import DType, dtypes

# ---------------------------------------------------------------------------------------------------------------------
# index expressions

@dataclass(frozen=True)
class Var:
  name: str
  size: int
  def __repr__(self): return self.name

@dataclass(frozen=True)
class Div:
  x: "Idx"
  d: int
  def __repr__(self): return f"({self.x!r})//{self.d}"

@dataclass(frozen=True)
class Mod:
  x: "Idx"
  d: int
  def __repr__(self): return f"({self.x!r})%{self.d}"

def _amin(a) -> int:
  if isinstance(a, Var): return 0
  if isinstance(a, Div): return a.x.vmin // a.d
  return 0 if a.x.vmin < 0 or a.x.vmax >= a.d else a.x.vmin   # Mod

def _amax(a) -> int:
  if isinstance(a, Var): return a.size - 1
  if isinstance(a, Div): return a.x.vmax // a.d
  return a.d - 1 if a.x.vmin < 0 or a.x.vmax >= a.d else a.x.vmax

@dataclass(frozen=True)
class Idx:
  """sum(coef * atom) + c, terms sorted by repr for a canonical form."""
  terms: tuple = ()
  c: int = 0

  @staticmethod
  def var(v: Var) -> "Idx": return Idx(((v, 1),), 0) if v.size > 1 else Idx((), 0)
  @staticmethod
  def const(c: int) -> "Idx": return Idx((), int(c))
  @staticmethod
  def _make(d: dict, c: int) -> "Idx":
    return Idx(tuple(sorted(((a, k) for a, k in d.items() if k), key=lambda t: repr(t[0]))), c)

  @property
  def vmin(self) -> int: return self.c + sum(k * (_amin(a) if k > 0 else _amax(a)) for a, k in self.terms)
  @property
  def vmax(self) -> int: return self.c + sum(k * (_amax(a) if k > 0 else _amin(a)) for a, k in self.terms)
  @property
  def is_const(self) -> bool: return not self.terms

  def __add__(self, o) -> "Idx":
    if isinstance(o, int): return Idx(self.terms, self.c + o)
    d = dict(self.terms)
    for a, k in o.terms: d[a] = d.get(a, 0) + k
    return Idx._make(d, self.c + o.c)
  def __mul__(self, k: int) -> "Idx":
    return Idx((), 0) if k == 0 else Idx(tuple((a, c * k) for a, c in self.terms), self.c * k)
  def __neg__(self) -> "Idx": return self * -1
  def __sub__(self, o) -> "Idx": return self + (-o if isinstance(o, Idx) else -o)

  def __floordiv__(self, d: int) -> "Idx":
    if d == 1: return self
    if self.vmin >= 0 and self.vmax < d: return Idx((), 0)
    q, r = {}, {}
    for a, k in self.terms:   # k*a = (k//d)*d*a + (k%d)*a: the first part leaves the division whole (atoms are integers)
      if k % d == 0: q[a] = k // d
      elif k > d: q[a], r[a] = k // d, k % d
      else: r[a] = k
    rest = Idx._make(r, self.c % d)
    quo = Idx._make(q, self.c // d)
    if rest.vmin >= 0 and rest.vmax < d: return quo
    if not rest.terms: return quo + rest.c // d
    if rest.vmin < 0:   # keep Div atoms over non-negative values, so truncating division is floor division
      m = -(rest.vmin // d)
      r2 = rest + m * d
      return quo - m if r2.vmax < d else quo - m + Idx(((Div(r2, d), 1),), 0)
    # peel the largest common factor of the rest: (g*x + c) // d == (x + c//g) // (d//g) when g | d
    g = math.gcd(d, *(k for _, k in rest.terms))
    if g > 1 and rest.vmin >= 0:
      inner = Idx._make({a: k // g for a, k in rest.terms}, rest.c // g)
      return quo + inner // (d // g)
    return quo + Idx(((Div(rest, d), 1),), 0)

  def __mod__(self, d: int) -> "Idx":
    if d == 1: return Idx((), 0)
    x = Idx._make({a: k % d for a, k in self.terms if k % d}, self.c % d)   # (k*a) % d == ((k%d)*a) % d
    if x.vmin >= 0 and x.vmax < d: return x
    if x.vmin < 0: x = x + (-(x.vmin // d)) * d   # non-negative, so truncating remainder is floor remainder
    if x.vmin >= 0 and x.vmax < d: return x
    return Idx(((Mod(x, d), 1),), 0)

  def vars(self) -> set:
    out = set()
    for a, _ in self.terms:
      if isinstance(a, Var): out.add(a)
      else: out |= a.x.vars()
    return out
  def subst(self, m: dict) -> "Idx":
    """The Idx with each Var in `m` replaced by m[var] (an Idx), inside Div/Mod atoms too (re-simplified)."""
    out = Idx.const(self.c)
    for a, k in self.terms:
      if isinstance(a, Var): x = m.get(a, Idx(((a, 1),), 0))
      else:
        inner = a.x.subst(m)
        x = inner // a.d if isinstance(a, Div) else inner % a.d
      out = out + x * k
    return out
  def coef(self, v: Var) -> int | None:
    """The coefficient of `v` if the Idx is affine in it (0 if absent); None if v occurs under a Div/Mod."""
    k = 0
    for a, c in self.terms:
      if a == v: k = c
      elif not isinstance(a, Var) and v in a.x.vars(): return None
    return k

  def __repr__(self):
    parts = [(f"{k}*" if k != 1 else "") + repr(a) for a, k in self.terms]
    if self.c or not parts: parts.append(str(self.c))
    return "+".join(parts)

def within(ix: Idx, valid: tuple) -> Idx:
  """`ix` as it is wherever every bound of `valid` holds: a Div or Mod atom (at any depth) whose argument the bounds keep
  inside one block [m*d, (m+1)*d) becomes m or x - m*d, and an atom that is affine in its vars wherever the bounds hold
  becomes that form (_fitted). A padded view's flat index wraps (x % size) only where its load is masked off; under the
  mask it is affine again, so a conv's input reads are plain strides."""
  if not valid or all(isinstance(a, Var) for a, _ in ix.terms): return ix
  out = _by_range(ix, valid)
  return out if all(isinstance(a, Var) for a, _ in out.terms) else _fitted(out, valid)

def _map_atoms(ix: Idx, f) -> Idx:
  """`ix` rebuilt bottom-up: each Div/Mod atom `a`, its argument rebuilt first (`inner`), becomes f(a, inner)."""
  out = Idx.const(ix.c)
  for a, k in ix.terms: out = out + (Idx(((a, 1),), 0) if isinstance(a, Var) else f(a, _map_atoms(a.x, f))) * k
  return out

def _rebuilt(a, inner: Idx) -> Idx: return inner // a.d if isinstance(a, Div) else inner % a.d

def _by_range(ix: Idx, valid: tuple) -> Idx:
  def atom(a, inner: Idx) -> Idx:
    r = _range_under(inner, valid)
    if (r is None or r[0] // a.d != r[1] // a.d) and (q := _lp_range(inner, valid)) is not None: r = q
    if r is None or r[0] // a.d != r[1] // a.d: return _rebuilt(a, inner)
    m = r[0] // a.d
    return Idx.const(m) if isinstance(a, Div) else inner - m * a.d
  return _map_atoms(ix, atom)

_LP: dict = {}   # (x, clauses) -> range: the same masked load is built for every kernel that reads it

def _lp_range(x: Idx, valid: tuple) -> tuple[int, int] | None:
  """[min, max] of affine `x` over the integer points where the affine bounds of `valid` hold, bounded by the linear
  relaxation (HiGHS: its optimum is at least as wide as the integer one, so the range is sound); None when x or no bound
  sharing its vars is affine."""
  if not all(isinstance(a, Var) for a, _ in x.terms) or not x.terms: return None
  own = x.vars()
  cl = [b for b in valid if all(isinstance(a, Var) for a, _ in b.idx.terms) and b.idx.vars() & own]
  if not cl: return None
  key = (x, tuple(cl))
  if (got := _LP.get(key, False)) is not False: return got
  vs = sorted(own.union(*(b.idx.vars() for b in cl)), key=lambda v: v.name)
  col = {v: i for i, v in enumerate(vs)}
  rows, rhs = [], []
  for b in cl:   # lo <= idx < hi as two rows of A x <= b
    row = np.zeros(len(vs))
    for v, c in b.idx.terms: row[col[v]] = c
    rows += [row, -row]; rhs += [b.hi - 1 - b.idx.c, b.idx.c - b.lo]
  obj = np.zeros(len(vs))
  for v, c in x.terms: obj[col[v]] = c
  from scipy.optimize import linprog   # noqa: PLC0415 - scipy loads in ~0.3 s: only a masked load that needs it pays
  ends = []
  for sign in (1, -1):
    res = linprog(sign * obj, A_ub=np.array(rows), b_ub=np.array(rhs), bounds=[(0, v.size - 1) for v in vs], method="highs")
    if res.status != 0: got = None; break
    ends.append(sign * res.fun)
  else: got = (math.ceil(ends[0] - 1e-6) + x.c, math.floor(ends[1] + 1e-6) + x.c)
  if len(_LP) > 4096: _LP.clear()
  _LP[key] = got
  return got

FIT_POINTS = 1 << 15   # an atom over more value combinations of its vars than this is not fitted

def _fitted(ix: Idx, valid: tuple) -> Idx:
  """`ix` with each Div/Mod atom that is affine in its vars wherever the bounds hold replaced by that affine form:
  innermost atoms first, each checked on every combination of its vars' values that the bounds over those vars allow
  (numpy, at most FIT_POINTS), then the bounds' own copies rewritten with it to reason about the next level (they are
  only ever read here: the load keeps its mask). Sound because every fit holds wherever the whole mask holds, so every
  rewritten copy is true there too. tinygrad's pooling chain reads a conv's gradient through (x + 24*r) % 25 under
  (x + 24*r) % 25 < 20: that is x - r."""
  fits: dict = {}
  failed: set = set()
  clauses = list(valid)
  for _ in range(8):
    clauses = [Bound(_by_range(_with_fits(b.idx, fits), clauses), b.lo, b.hi) for b in clauses]
    cur = _by_range(_with_fits(ix, fits), clauses)
    new = False
    for a in _innermost([cur] + [b.idx for b in clauses]):
      if a in fits or a in failed: continue
      f, spans = _fit(a, clauses)
      if f is None: failed.add(a)
      else: fits[a], new = f, True
      for v, (lo, hi) in spans.items():   # a var the bounds keep inside its range: a bound of its own (true on the mask)
        if (lo > 0 or hi < v.size - 1) and (b := Bound(Idx.var(v), lo, hi + 1)) not in clauses: clauses.append(b); new = True
    if not new: return cur
  return _with_fits(ix, fits)

def _with_fits(ix: Idx, fits: dict) -> Idx:
  def atom(a, inner: Idx) -> Idx:
    if a in fits: return fits[a]
    x = _rebuilt(a, inner)
    return _with_fits(x, fits) if any(t in fits for t, _ in x.terms) else x   # the rebuilt atom is a fitted one
  return _map_atoms(ix, atom)

def _innermost(idxs: list) -> list:
  out, seen = [], set()
  def walk(ix: Idx):
    for a, _ in ix.terms:
      if isinstance(a, Var): continue
      if all(isinstance(t, Var) for t, _ in a.x.terms):
        if a not in seen: seen.add(a); out.append(a)
      else: walk(a.x)
  for ix in idxs: walk(ix)
  return out

def _np_eval(ix: Idx, env: dict):
  out = ix.c
  for a, k in ix.terms:
    if isinstance(a, Var): v = env[a]
    else: v = _np_eval(a.x, env) // a.d if isinstance(a, Div) else _np_eval(a.x, env) % a.d
    out = out + k * v
  return out

def _fit(a, clauses: list) -> tuple[Idx | None, dict]:
  """The affine form of atom `a` where the clauses hold, over its vars and those of clauses sharing one with it (as
  long as their value combinations stay within FIT_POINTS), or None."""
  own = a.x.vars()
  if not own or math.prod(v.size for v in own) > FIT_POINTS: return None, {}
  for b in clauses:   # the clauses over its vars, and over a few more where they say something about its own
    if (more := b.idx.vars()) & own and math.prod(v.size for v in own | more) <= FIT_POINTS: own = own | more
  vs = sorted(own, key=lambda v: v.name)
  grid = np.meshgrid(*(np.arange(v.size, dtype=np.int64) for v in vs), indexing="ij")
  env = {v: g.ravel() for v, g in zip(vs, grid)}
  ok = np.ones(env[vs[0]].shape, bool)
  for b in clauses:
    if b.idx.vars() <= set(vs) and b.idx.terms:
      x = _np_eval(b.idx, env)
      ok &= (x >= b.lo) & (x < b.hi)
  if not ok.any(): return None, {}
  spans = {v: (int(env[v][ok].min()), int(env[v][ok].max())) for v in vs}
  got = _np_eval(Idx(((a, 1),), 0), env)[ok]
  pts = np.stack([env[v][ok] for v in vs] + [np.ones(int(ok.sum()), np.int64)], 1)
  sol = np.rint(np.linalg.lstsq(pts.astype(np.float64), got.astype(np.float64), rcond=None)[0]).astype(np.int64)
  if not np.array_equal(pts @ sol, got): return None, spans
  return Idx._make({v: int(c) for v, c in zip(vs, sol[:-1])}, int(sol[-1])), spans

def _range_under(x: Idx, valid: tuple) -> tuple[int, int] | None:
  """[min, max] of affine `x` where the bounds hold: x = sum(alpha_j * bound_j) + rest, each bound taken whole when its
  atoms cancel out of x exactly (its range then counts, not its atoms'); None when no bound applies."""
  rest, lo, hi, used = x, 0, 0, False
  for b in valid:
    if not b.idx.terms: continue
    a0, c0 = b.idx.terms[0]
    k = dict(rest.terms).get(a0, 0)
    if k == 0 or k % c0: continue
    alpha = k // c0
    cand = rest - b.idx * alpha
    if any(dict(cand.terms).get(a, 0) for a, _ in b.idx.terms): continue
    ends = (alpha * b.lo, alpha * (b.hi - 1))
    rest, lo, hi, used = cand, lo + min(ends), hi + max(ends), True
  return (lo + rest.vmin, hi + rest.vmax) if used else None

def flat_index(idx: tuple, shape: tuple) -> Idx:
  """C-order flat index of `idx` (one Idx per axis) into `shape`."""
  out, stride = Idx.const(0), 1
  for i, s in zip(reversed(idx), reversed(shape)):
    if s != 1: out = out + i * stride
    stride *= s
  return out

def unflatten(flat: Idx, shape: tuple) -> tuple:
  """Per-axis indices of a C-order flat index into `shape`."""
  out, stride = [], math.prod(shape)
  if stride == 0: return tuple(Idx.const(0) for _ in shape)   # no element: the index is never evaluated (a reduce of 0 steps)
  for s in shape:
    stride //= s
    out.append(Idx.const(0) if s == 1 else (flat // stride) % s if stride else Idx.const(0))
  return tuple(out)

# ---------------------------------------------------------------------------------------------------------------------
# values

@dataclass(frozen=True)
class Param:
  name: str
  dtype: DType
  size: int                # elements
  align: int               # bytes the renderer may claim
  noalias: bool = False
  readonly: bool = False
  writeonly: bool = False

@dataclass(frozen=True)
class Bound:
  """lo <= idx < hi"""
  idx: Idx
  lo: int
  hi: int

@dataclass(frozen=True, eq=False)
class Expr:
  op: Any                  # an Ops member (ALU, CAST, BITCAST) or 'const' / 'load' / 'reduce'
  dtype: DType
  src: tuple = ()
  arg: Any = None          # const: value; load: (param index, Idx, tuple[Bound]); reduce: (Ops, tuple[Var])

  def walk(self):
    """Every node of this Expr DAG once, iteratively (chains can be long)."""
    seen, stack = set(), [self]
    while stack:
      e = stack.pop()
      if id(e) in seen: continue
      seen.add(id(e))
      yield e
      stack.extend(e.src)

  def count(self) -> int:
    """Number of distinct Expr nodes (the size a renderer emits)."""
    return sum(1 for _ in self.walk())

def const(v, dt: DType) -> Expr:
  if dt == dtypes.bool: v = bool(v)
  elif dt.is_int():
    bits = 8 * dt.itemsize
    v = int(v) % (1 << bits)
    if dt.kind == 'i' and v >= 1 << (bits - 1): v -= 1 << bits
  else: v = float(v)
  return Expr('const', dt, (), v)

@dataclass(frozen=True)
class Store:
  param: int
  idx: Idx
  value: Expr

@dataclass(frozen=True)
class Kernel:
  name: str
  params: tuple            # tuple[Param]
  domain: tuple            # tuple[Var], outermost first; domain[0] is split across threads
  store: Store
  tile: tuple | None = None     # ("matmul", MR, NR) when a renderer may register-tile it
  matmul: tuple | None = None   # (a param, a Idx, b param, b Idx, k Var) for the tiled form
  checked: bool = False         # CHECK_BOUNDS: every index is checked, a violation reports (param + 1)
  stream: bool = False          # the store is contiguous over domain[0] (the only live axis) to a write-only, disjoint
                                # output that nothing in the kernel reads: a renderer may use non-temporal stores

  def ops(self) -> int: return self.store.value.count()
  def key(self) -> str:
    """The cache key: the kernel without its name."""
    return render(self, with_name=False)

def mm_batched(k: "Kernel") -> bool:
  """A tiled matmul kernel whose outermost domain var is a batch (each batch index one C[i, j] plane), not its rows."""
  return k.tile is not None and k.tile[0] == "matmul" and k.domain[0] != k.matmul[4]

# ---------------------------------------------------------------------------------------------------------------------
# printing (DEBUG=2 and the cache key)

def render(k: Kernel, with_name: bool = True) -> str:
  names: dict[int, str] = {}
  lines = []
  def ex(e: Expr) -> str:
    if id(e) in names: return names[id(e)]
    for s in e.src: ex(s)
    if e.op == 'const': body = f"const {e.arg!r}"
    elif e.op == 'load':
      p, i, valid = e.arg
      body = f"load p{p}[{i!r}]" + (" if " + " & ".join(f"{b.lo}<={b.idx!r}<{b.hi}" for b in valid) if valid else "")
    elif e.op == 'valid': body = "valid " + " & ".join(f"{b.lo}<={b.idx!r}<{b.hi}" for b in e.arg)
    elif e.op == 'reduce': body = f"reduce {e.arg[0].name} over {','.join(f'{v.name}<{v.size}' for v in e.arg[1])} of {names[id(e.src[0])]}"
    else: body = f"{e.op.name} " + ", ".join(names[id(s)] for s in e.src)
    names[id(e)] = f"v{len(names)}"
    lines.append(f"  {names[id(e)]}: {e.dtype.name} = {body}")
    return names[id(e)]
  ex(k.store.value)
  head = (f"kernel {k.name}" if with_name else "kernel") + ("(" + ", ".join(
    f"p{i}: {p.dtype.name}[{p.size}] align {p.align}" + (" noalias" if p.noalias else "") + (" ro" if p.readonly else "") +
    (" wo" if p.writeonly else "") for i, p in enumerate(k.params)) + ")")
  loops = " ".join(f"for {v.name}<{v.size}" for v in k.domain)
  tail = f"  {loops}: p{k.store.param}[{k.store.idx!r}] = {names[id(k.store.value)]}"
  extra = ([f"  tile {k.tile} matmul {k.matmul!r}"] if k.tile else []) + (["  checked"] if k.checked else []) + (["  stream"] if k.stream else [])
  return "\n".join([head] + lines + [tail] + extra)
