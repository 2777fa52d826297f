"""Floor 4 (lowering): the ALU ops no renderer spells, rewritten once for every backend into ops they all render
(tinygrad's codegen decompositions). The kernel builder expands an op found here; each renderer's `code_for_op` lists
the ops it spells, and together they cover the op table (tests/lower/schedule/test_decomp.py). Adding an op that the renderers
can express with existing ones is one line here."""
from __future__ import annotations
from egraph.ir.dtype import DType, dtypes
from egraph.ir.ops import Ops
from lower.schedule.kernel import Expr, const

def _e(op: Ops, dt: DType, *src: Expr) -> Expr: return Expr(op, dt, src)

def _floor_fix(dt: DType, a: Expr, b: Expr, r: Expr, fixed: Expr, plain: Expr) -> Expr:
  """`fixed` where C's truncation is not the floor (a nonzero remainder, operands of opposite signs: the sign bit of
  a ^ b), else `plain`; so x // 0 is -1 for a negative x, as on tinygrad's devices. Selects over ints, no bool
  arithmetic (the vector path renders it)."""
  z, bl = const(0, dt), dtypes.bool
  return _e(Ops.WHERE, dt, _e(Ops.CMPNE, bl, r, z), _e(Ops.WHERE, dt, _e(Ops.CMPLT, bl, _e(Ops.XOR, dt, a, b), z), fixed, plain), plain)

def _floordiv(dt: DType, a: Expr, b: Expr) -> Expr:
  q = _e(Ops.IDIV, dt, a, b)
  return q if dt.kind != 'i' else _floor_fix(dt, a, b, _e(Ops.MOD, dt, a, b), _e(Ops.SUB, dt, q, const(1, dt)), q)

def _floormod(dt: DType, a: Expr, b: Expr) -> Expr:
  r = _e(Ops.MOD, dt, a, b)
  return r if dt.kind != 'i' else _floor_fix(dt, a, b, r, _e(Ops.ADD, dt, r, b), r)

DECOMPOSITIONS = {
  Ops.MULACC: lambda dt, a, b, c: _e(Ops.ADD, dt, _e(Ops.MUL, dt, a, b), c),   # rounded after the multiply, as the oracle
  Ops.FLOORDIV: _floordiv,
  Ops.FLOORMOD: _floormod,
}

def alu(op: Ops, dt: DType, src: tuple[Expr, ...]) -> Expr:
  """The kernel Expr of an ALU op: its decomposition when it has one, else the op itself."""
  return DECOMPOSITIONS[op](dt, *src) if op in DECOMPOSITIONS else Expr(op, dt, src)
