"""Graphs over tinygrad's bound variables (GPT-2's `start_pos`, a slice `a[:v]`) for callsat's kernels in the bridge
(egraph/bridge/backend.py), whose sizes are constants: the static form (`static`: every host dimension at its maximum,
what lies past a variable's extent kept out of every result, the values read at run time from the Program's own
buffers: one compile for every value) and, outside it, the CALL made concrete per value tuple (`Symbolic`). What a
graph gets is `symbolic_mode`'s setting."""
from __future__ import annotations
import math
from collections import OrderedDict
from tinygrad.uop.ops import UOp, Ops as TOps, GroupOp as TGroupOp
from egraph.ir.ops import Node, Ops, toposort, new_buffer, const, dims_arg, map_args, substitute
from egraph.ir.symbolic import HostDim, dims_in
from egraph.ir.dtype import dtypes
from egraph.ir.errors import CallsatError
from lower.device.native import prepare
from egraph.bridge.convert import Conversion
from egraph.ir.env import env_value

SYMBOLIC_ENV = "CALLSAT_BRIDGE_SYMBOLIC"   # what graphs over bound variables get (symbolic_mode)
SYMBOLIC = ("tinygrad", "static", "specialize")

def symbolic_mode(strict: bool) -> str:
  """What a graph over bound variables gets from callsat's kernels: "static" (at the variables' maxima, the values read
  at run time: one compile for every value; a form it does not cover is left to tinygrad's kernels), "specialize"
  (that, else made concrete and compiled per value tuple: Symbolic) or "tinygrad" (never). Env CALLSAT_BRIDGE_SYMBOLIC
  (read when the bridge decides), else "specialize" in strict mode (its contract: callsat's kernels or an error) and
  "static" in fallback mode (a decode loop made concrete per value would compile every token)."""
  v = env_value(SYMBOLIC_ENV) or ("specialize" if strict else "static")
  if v not in SYMBOLIC: raise CallsatError(f"{SYMBOLIC_ENV} must be one of {SYMBOLIC}, got {v!r}")
  return v

_EXPR_OPS = frozenset({TOps.AFTER, TOps.STORE, TOps.CONST, TOps.STACK, TOps.CAST, *TGroupOp.ALU})

def _is_var(x: UOp) -> bool:
  """tinygrad 0.14's variable: BUFFER(ParamArg slot -1, named); bound, it is AFTER(it, STORE(it, CONST value))."""
  return x.op is TOps.BUFFER and getattr(x.arg, "slot", None) == -1 and getattr(x.arg, "name", None) is not None

def variable_expr(u: UOp | None) -> bool:
  """Is `u` an expression over tinygrad's variables alone (its value known once they are bound)?"""
  if u is None: return False
  var = False
  for x in u.toposort():
    if _is_var(x): var = True
    elif x.op not in _EXPR_OPS: return False
  return var

def var_names(uops) -> tuple[str, ...]: return tuple(sorted({v.expr for u in uops for v in u.variables()}))

def values_for(names: tuple, var_vals: dict | None, who: str) -> dict[str, int]:
  """{name: value} of tinygrad's run values for `names`; a name it lacks is the caller's error, named."""
  if (missing := [n for n in names if n not in (var_vals or {})]):
    raise CallsatError(f"{who} over variables {names}: no value bound for {missing}")
  return {n: int(var_vals[n]) for n in names}

def bound_values(tg_call: UOp) -> dict[str, int]:
  """The values tinygrad's CALL binds its variables to (its bound args: where tinygrad's schedule reads them too)."""
  return {v.expr: int(val) for v, val in (a.unbind() for a in tg_call.src[1:] if a.is_bound_var)}

class Symbolic:
  """A Program over tinygrad's bound variables outside the static form (a stored value of symbolic shape, ...).
  callsat's kernels take sizes as constants, so the CALL as built (each host dimension worth its maximum, each
  variable's value an OPAQUE) is made concrete per tuple of values: dimensions and values computed by tinygrad's own
  expressions (sym_infer), then compiled. A new value tuple is a new compile (this is why fallback mode leaves such
  graphs to tinygrad's kernels unless CALLSAT_BRIDGE_SYMBOLIC=specialize); at most MAX tuples per Program are kept,
  least recently used evicted."""
  MAX = 16
  def __init__(self, call: Node, dims: dict, syms: dict, zero_of):
    self.call, self.dims, self.syms, self.zero_of = call, dims, syms, zero_of
    self.names = var_names([*dims.values(), *syms.values()])
    self.made: OrderedDict = OrderedDict()

  def get(self, var_vals: dict) -> tuple[Node, tuple[int, ...]]:
    """(the concrete CALL, the base positions to zero-fill) for tinygrad's variable values, compiled on first use."""
    vals = values_for(self.names, var_vals, "callsat program")
    key = tuple(vals.values())
    if (got := self.made.get(key)) is not None:
      self.made.move_to_end(key)
      return got
    c = _concrete(self.call, {k: u.sym_infer(vals) for k, u in self.dims.items()}, {i: u.sym_infer(vals) for i, u in self.syms.items()})
    _, partial = prepare(c)
    got = self.made[key] = (c, self.zero_of(partial))
    if len(self.made) > self.MAX: self.made.popitem(last=False)
    return got

def dims_of(cv: Conversion, call: Node) -> dict:
  """{HostDim key: tinygrad expression} of the dimensions in `call` (its top body and args)."""
  return {d.key: cv.dim_uops[d.key] for n in toposort(list(call.src), enter_calls=False) for d in dims_in((n.shape, dims_arg(n)))}

def fold_shrinks(call: Node) -> Node:
  """`call` with each SHRINK of a SHRINK one SHRINK (offsets added), the top body only. tinygrad reads a view of a
  symbolic output with concrete bounds (`jf(a[:, :v])[:3, :i]`, the JIT's output still bound to the value it was
  captured with); the inner extent, which may be below the outer bounds at some value, is then never a shape."""
  new: dict[int, Node] = {}
  for n in toposort(list(call.src), enter_calls=False):
    srcs = tuple(s if n.op in (Ops.CALL, Ops.FUNCTION) and i == 0 else new[s.id] for i, s in enumerate(n.src))
    if n.op is Ops.SHRINK and srcs[0].op is Ops.SHRINK:
      x, inner = srcs[0].src[0], srcs[0].arg
      new[n.id] = Node(Ops.SHRINK, n.dtype, (x,), tuple((a + lo, a + hi) for (a, _), (lo, hi) in zip(inner, n.arg)))
    else: new[n.id] = n if srcs == n.src else n.over(srcs)
  return call.over(tuple(new[s.id] for s in call.src))

def _concrete(call: Node, dims: dict, syms: dict) -> Node:
  """`call` with each host dimension its value (`dims`: HostDim key -> int) and each variable's OPAQUE value a constant
  (`syms`: ident -> int); the top body only (exact refuses variables in a function's body)."""
  values = {n: _scalar(const(syms[n.arg.ident], n.dtype, n.arg.device), n.shape)
            for n in toposort(list(call.src), enter_calls=False) if n.op is Ops.OPAQUE and n.arg.ident in syms}
  return call.over(tuple(map_args(substitute(list(call.src), values), lambda d: dims[d.key] if isinstance(d, HostDim) else d)))

def _scalar(v: Node, shape: tuple) -> Node: return v.reshape((1,) * len(shape)).expand(shape) if shape else v

# ---- a graph over bound variables at the variables' maxima ------------------------------------------------------------

class NotStatic(Exception):
  """A form the static rewrite does not cover: the graph is made concrete per value instead."""

def _identity(rop: Ops, dt) -> float | int | bool:
  if rop is Ops.ADD: return 0
  if rop is Ops.MUL: return 1
  return False if dt == dtypes.bool else -math.inf if dt.kind == "f" else -(1 << (8 * dt.itemsize - 1)) if dt.kind == "i" else 0

class Static:
  """The rewrite `static` performs: every host dimension at its maximum; where the graph reads past a variable's extent
  the garbage is kept out of every result (reduces masked by `iota < extent`, a read at a variable offset a masked sum,
  a store at a variable offset a `where` over the whole target); each variable's value (a dimension's, or one the
  arithmetic reads) is read from a one-element buffer of the Program's that it writes before each run (as callsat's own
  scalar arguments), so the rewritten graph is one structure and compiles once for every value."""
  def __init__(self, cv: Conversion, nargs: int, device: str):
    self.cv, self.nargs, self.device = cv, nargs, device
    self.extra: list[Node] = []   # placeholder BUFFERs appended to the CALL's args (the Program's own memory)
    self.slot: dict = {}          # what each holds ("iota", n) / ("var", key) -> its index in extra
    self.iotas: list = []         # (placeholder, n): int32 0..n-1
    self.vars: list = []          # (placeholder, tinygrad expression): its value, written per run
    self.new: dict[int, Node] = {}   # the rewrite so far: node id -> its image

  @property
  def names(self) -> tuple[str, ...]: return var_names([u for _, u in self.vars])

  def _param(self, what, make) -> Node:
    if (i := self.slot.get(what)) is None:
      i = self.slot[what] = len(self.extra)
      self.extra.append(make())
    return self.extra[i].param(self.nargs + i)

  def read(self, key, u: UOp, dtype) -> Node:
    """A tinygrad expression over variables as a scalar node of `dtype`, read from its buffer."""
    if not variable_expr(u): raise NotStatic("a value not over variables")
    def make():
      b = new_buffer(1, dtype, self.device)
      self.vars.append((b, u))
      return b
    return self._param(("var", key, dtype), make).reshape(())

  def value(self, d) -> Node:
    """A dimension's value as an int32 scalar node."""
    if not isinstance(d, HostDim): return const(int(d), dtypes.int32)
    if (u := self.cv.dim_uops.get(d.key)) is None: raise NotStatic("a dimension not tinygrad's")
    return self.read(d.key, u, dtypes.int32)

  def iota(self, length: int, axis: int, shape: tuple) -> Node:
    """0..length-1 along `axis`, broadcast to `shape`."""
    def make():
      b = new_buffer(length, dtypes.int32, self.device)
      self.iotas.append((b, length))
      return b
    p = self._param(("iota", length), make)
    return p.reshape(tuple(length if i == axis else 1 for i in range(len(shape)))).expand(shape)

  def pick(self, x: Node, axis: int, at: Node) -> Node:
    """x's entries at index `at` (a scalar node) along axis, that axis kept with extent 1: a masked reduce."""
    sel = self.iota(x.shape[axis], axis, x.shape).alu(Ops.CMPEQ, _scalar(at, x.shape))
    rop = Ops.MAX if x.dtype == dtypes.bool else Ops.ADD
    zero = _scalar(const(_identity(rop, x.dtype), x.dtype), x.shape)
    return Node(Ops.REDUCE, x.dtype, (sel.alu(Ops.WHERE, x, zero),), (rop, (axis,)))

def _ints(t) -> tuple: return tuple(int(d) for d in t)

def _nonunit(shape) -> list:
  """A shape's entries other than 1, a host dimension by its key (two variables of one range print alike)."""
  return [d.key if isinstance(d, HostDim) else int(d) for d in shape if isinstance(d, HostDim) or d != 1]

def static(cv: Conversion, body: Node, args: list[Node], syms: dict, device: str) -> tuple[Node, list[Node], Static]:
  """(body, args with the Program's own buffers appended, the rewrite: its iotas and variable buffers) of a graph over
  bound variables at the variables' maxima (Static); NotStatic names a form it does not cover (a store of a symbolic
  shape: tinygrad lays its buffer out by the value; a PAD or FLIP of a symbolic axis; a reshape that is more than 1s in
  and out; an offset read or store of more than one element)."""
  st = Static(cv, len(args), device)
  new = st.new
  for n in toposort([body, *args], enter_calls=False):
    if isinstance(n.device, tuple): raise NotStatic(f"{n.op.name} on {n.device}: a multi-device graph (its masks would be per device)")
    if n.op is Ops.OPAQUE and n.arg.ident in syms and not dims_in(n.arg.shape):   # a value the arithmetic reads
      new[n.id] = _scalar(st.read(("value", n.arg.ident), syms[n.arg.ident], n.dtype), n.shape)
      continue
    srcs = tuple(s if n.op in (Ops.CALL, Ops.FUNCTION) and i == 0 else new[s.id] for i, s in enumerate(n.src))
    new[n.id] = _static_one(st, n, srcs)
  return new[body.id], [new[a.id] for a in args] + st.extra, st

def _static_one(st: Static, n: Node, srcs: tuple) -> Node:
  sym = bool(dims_in((n.shape, dims_arg(n))))
  if n.op is Ops.OPAQUE: raise NotStatic("OPAQUE")
  if n.op is Ops.REDUCE:
    x = srcs[0]
    for a in n.arg[1]:
      if isinstance(n.src[0].shape[a], HostDim):   # entries past the extent: the reduce's identity
        keep = st.iota(x.shape[a], a, x.shape).alu(Ops.CMPLT, _scalar(st.value(n.src[0].shape[a]), x.shape))
        x = keep.alu(Ops.WHERE, x, _scalar(const(_identity(n.arg[0], x.dtype), x.dtype), x.shape))
    return Node(Ops.REDUCE, n.dtype, (x,), n.arg)
  if n.op is Ops.STORE:
    if dims_in(n.src[1].shape): raise NotStatic("a store of a symbolic shape")
    t = n.src[0]
    if t.op is Ops.SHRINK and any(isinstance(lo, HostDim) for lo, _ in t.arg):   # a store at a variable offset
      base, v = st.new[t.src[0].id], srcs[1]   # the target's source (its image: the shrink itself became a read)
      if dims_in(t.src[0].shape) or any(isinstance(lo, HostDim) and hi - lo != 1 for lo, hi in t.arg): raise NotStatic("offset store")
      if any(not isinstance(lo, HostDim) and (isinstance(hi, HostDim) or (lo, hi) != (0, s)) for (lo, hi), s in zip(t.arg, base.shape)):
        raise NotStatic("an offset store that is not over the whole of its other axes")
      sel = None
      for a, (lo, _) in enumerate(t.arg):
        if isinstance(lo, HostDim):
          m = st.iota(base.shape[a], a, base.shape).alu(Ops.CMPEQ, _scalar(st.value(lo), base.shape))
          sel = m if sel is None else sel.alu(Ops.AND, m)
      return Node(Ops.STORE, n.dtype, (base, sel.alu(Ops.WHERE, v.expand(base.shape), base)), n.arg)
  if n.op is Ops.SHRINK and sym:
    x, arg, picks = srcs[0], [], []
    for a, ((lo, hi), s) in enumerate(zip(n.arg, n.shape)):
      if isinstance(lo, HostDim):
        if s != 1 or isinstance(s, HostDim): raise NotStatic("offset read")
        arg.append((0, int(x.shape[a]))); picks.append((a, lo))
      else:
        arg.append((int(lo), int(lo) + int(s)))
        if arg[-1][1] > x.shape[a]: raise NotStatic("an extent's maximum past its source")
    y = x.shrink(tuple(arg))
    for a, lo in picks: y = st.pick(y, a, st.value(lo))
    return y
  if not sym: return n if srcs == n.src else n.over(srcs)
  if n.op is Ops.RESHAPE:
    if _nonunit(n.src[0].shape) != _nonunit(n.arg): raise NotStatic("reshape")
    return srcs[0].reshape(_ints(n.arg))
  if n.op is Ops.EXPAND: return srcs[0].expand(_ints(n.arg))
  if n.op is Ops.BITCAST and n.dtype.itemsize != n.src[0].dtype.itemsize: raise NotStatic("a bitcast resizing a symbolic axis")
  if n.op in (Ops.PAD, Ops.FLIP, Ops.PARAM, Ops.SLICE, Ops.BUFFER) or n.op in (Ops.CALL, Ops.FUNCTION): raise NotStatic(n.op.name)
  return n.over(srcs)
