"""Symbolic dimensions: `Variable("v", 1, 8).bind(3)` used in slicing (`a[:v]`).

A dimension is an int subclass, so shape arithmetic, numpy and the backends see a plain size: a `BoundVar` is worth
its bound value, an unbound `Variable` its maximum (callify sizes buffers for the maximum and shrinks them to the bound
size). Both hash with their variable, so a node over `v=3` is not the node over a plain 3, and `parameterize` can swap
each bound value for its variable: two values of `v` give one CALL body (one cache key), the values travel as BIND args."""
from __future__ import annotations
from egraph.ir.errors import ShapeError

class Variable(int):
  """An unbound symbolic dimension in [vmin, vmax]; as an int it is vmax."""
  def __new__(cls, name: str, vmin: int, vmax: int):
    if not (isinstance(name, str) and 0 <= vmin <= vmax): raise ShapeError(f"Variable({name!r}, {vmin}, {vmax}): need 0 <= vmin <= vmax")
    v = super().__new__(cls, vmax)
    v.name, v.vmin, v.vmax = name, vmin, vmax
    return v
  def bind(self, value: int) -> BoundVar: return BoundVar(self, value)
  def __hash__(self): return hash(("var", self.name, self.vmin, self.vmax))
  def __eq__(self, o): return int(self) == o if not isinstance(o, (Variable, BoundVar)) else (type(o) is Variable and self.key == o.key)
  def __ne__(self, o): return not self.__eq__(o)
  @property
  def key(self): return (self.name, self.vmin, self.vmax)
  def __repr__(self): return f"{self.name}[{self.vmin}..{self.vmax}]"
  def __reduce__(self): return (Variable, (self.name, self.vmin, self.vmax))

class BoundVar(int):
  """A Variable bound to a value; as an int it is that value."""
  def __new__(cls, var: Variable, value: int):
    if not var.vmin <= int(value) <= var.vmax: raise ShapeError(f"bind: {value} is outside {var!r}")
    b = super().__new__(cls, int(value))
    b.var = var
    return b
  def __hash__(self): return hash(("bound", self.var.key, int(self)))
  def __eq__(self, o):
    return int(self) == o if not isinstance(o, (Variable, BoundVar)) else (type(o) is BoundVar and self.var.key == o.var.key and int(self) == int(o))
  def __ne__(self, o): return not self.__eq__(o)
  def __repr__(self): return f"{self.var.name}={int(self)}"
  def __reduce__(self): return (BoundVar, (self.var, int(self)))

class HostDim(int):
  """A symbolic dimension a host framework owns (a tinygrad expression such as v*4+1), worth its maximum and told apart
  by `key`. callsat sizes storage for the maximum and shrinks it to the dimension; it never binds it (the host does).
  `algebra(op, a, b)` ("add"/"sub"), when the host gives one, says what a sum or difference is (a + b - a is b, where
  maxima alone would say more); None from it, or no algebra, falls back to the maxima."""
  def __new__(cls, vmax: int, key, label: str = "?", algebra=None):
    d = super().__new__(cls, vmax)
    d.key, d.label, d.algebra = key, label, algebra
    return d
  def __add__(self, o): return _host_arith("add", self, o)
  def __radd__(self, o): return _host_arith("add", o, self)
  def __sub__(self, o): return _host_arith("sub", self, o)
  def __rsub__(self, o): return _host_arith("sub", o, self)
  def __hash__(self): return hash(("host", self.key))
  def __eq__(self, o): return int(self) == o if not isinstance(o, (Variable, BoundVar, HostDim)) else (type(o) is HostDim and self.key == o.key)
  def __ne__(self, o): return not self.__eq__(o)
  def __repr__(self): return f"<{self.label}<={int(self)}>"
  def __reduce__(self): return (HostDim, (int(self), self.key, self.label))

def _host_arith(op: str, a, b):
  alg = a.algebra if isinstance(a, HostDim) and a.algebra is not None else getattr(b, "algebra", None)
  if alg is not None and type(a) in (int, HostDim) and type(b) in (int, HostDim) and (r := alg(op, a, b)) is not None: return r
  return int(a) + int(b) if op == "add" else int(a) - int(b)

def is_symbolic(x) -> bool: return isinstance(x, (Variable, BoundVar, HostDim))

def max_value(d) -> int: return d.var.vmax if isinstance(d, BoundVar) else int(d)

def map_dims(arg, fn):
  """`arg` (any nesting of tuples) with every symbolic dimension replaced by fn(dim)."""
  if is_symbolic(arg): return fn(arg)
  if isinstance(arg, tuple): return tuple(map_dims(a, fn) for a in arg)
  return arg

def dims_in(arg, out: dict | None = None) -> dict:
  """The symbolic dimensions in `arg`, in first-seen order."""
  out = {} if out is None else out
  if is_symbolic(arg): out.setdefault(arg, None)
  elif isinstance(arg, tuple):
    for a in arg: dims_in(a, out)
  return out
