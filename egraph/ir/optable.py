"""Floor 1 (IR): the ops, written once. `Ops` names every node op; `ALU_OPS` is the one table of ALU ops (arity, dtype
rule, result, cost class, tinygrad's name) that `GroupOp`, the IR's checks (egraph/ir/ops.py), the time model, the
bridge and the backends read; THREEFRY's constants live beside it (notes/design.md has the recipe for adding an op)."""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from egraph.ir.dtype import DType

class Ops(Enum):
  # storage and calls
  BUFFER = auto(); SLICE = auto(); PARAM = auto(); CONST = auto(); BIND = auto()
  CALL = auto(); FUNCTION = auto(); TUPLE = auto(); GETTUPLE = auto(); SINK = auto()
  AFTER = auto(); STORE = auto(); COPY = auto(); MULTI = auto()
  # markers
  CONTIGUOUS = auto(); CONTIGUOUS_BACKWARD = auto(); DETACH = auto()
  # elementwise
  BITCAST = auto(); CAST = auto()
  NEG = auto(); EXP2 = auto(); LOG2 = auto(); SQRT = auto(); RECIPROCAL = auto(); SIN = auto(); TRUNC = auto()
  ADD = auto(); SUB = auto(); MUL = auto(); FDIV = auto(); IDIV = auto(); MOD = auto(); MAX = auto()
  CMPLT = auto(); CMPNE = auto(); CMPEQ = auto(); AND = auto(); OR = auto(); XOR = auto()
  WHERE = auto()
  SHL = auto(); SHR = auto(); FLOORDIV = auto(); FLOORMOD = auto(); POW = auto(); THREEFRY = auto(); MULACC = auto()
  # reduce and movement
  REDUCE = auto(); RESHAPE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto(); PERMUTE = auto(); FLIP = auto()
  # a host framework's op that callify carries without its arithmetic (executors refuse it by name)
  OPAQUE = auto()
  # only inside e-graph list encodings
  def __repr__(self): return f"Ops.{self.name}"
  __hash__ = object.__hash__   # members are singletons equal only to themselves; Enum's hash of the name is a Python call

@dataclass(frozen=True)
class OpInfo:
  """One ALU op, written once: how many sources, which dtypes it takes (`takes`: any | float | int | intbool | number |
  uint64; WHERE's condition is bool and its values any), what it gives (`result`: same | bool), what the time model
  charges (`cost`: alu | division | transcendental), and tinygrad's name where it differs (the bridge's shadow)."""
  arity: int
  takes: str = "any"
  result: str = "same"
  cost: str = "alu"
  tinygrad: str | None = None
  def accepts(self, dt: DType) -> bool:
    """Whether the op takes operands (values, for WHERE) of dtype `dt`."""
    return self.takes == "any" or TAKES[self.takes][0](dt)

ALU_OPS: dict[Ops, OpInfo] = {
  Ops.NEG: OpInfo(1), Ops.TRUNC: OpInfo(1),
  Ops.EXP2: OpInfo(1, "float", cost="transcendental"), Ops.LOG2: OpInfo(1, "float", cost="transcendental"),
  Ops.SIN: OpInfo(1, "float", cost="transcendental"),
  Ops.SQRT: OpInfo(1, "float", cost="division"), Ops.RECIPROCAL: OpInfo(1, "float", cost="division"),
  Ops.ADD: OpInfo(2), Ops.SUB: OpInfo(2), Ops.MUL: OpInfo(2), Ops.MAX: OpInfo(2),
  Ops.FDIV: OpInfo(2, "float", cost="division"),
  Ops.IDIV: OpInfo(2, "intbool", cost="division", tinygrad="CDIV"), Ops.MOD: OpInfo(2, "intbool", cost="division", tinygrad="CMOD"),
  Ops.FLOORDIV: OpInfo(2, "int", cost="division"), Ops.FLOORMOD: OpInfo(2, "int", cost="division"),
  Ops.CMPLT: OpInfo(2, result="bool"), Ops.CMPNE: OpInfo(2, result="bool"), Ops.CMPEQ: OpInfo(2, result="bool"),
  Ops.AND: OpInfo(2, "intbool"), Ops.OR: OpInfo(2, "intbool"), Ops.XOR: OpInfo(2, "intbool"),
  Ops.SHL: OpInfo(2, "int"), Ops.SHR: OpInfo(2, "int"),
  Ops.POW: OpInfo(2, "number", cost="transcendental"), Ops.THREEFRY: OpInfo(2, "uint64"),
  Ops.WHERE: OpInfo(3),
  Ops.MULACC: OpInfo(3, "number"),   # a * b + c, rounded after the multiply as after the add (tinygrad's MULACC)
}

# THREEFRY (tinygrad's threefry2x32) written once for the oracle and every renderer: the key schedule's parity constant,
# and the rotations of its 5 groups of 4 rounds (20), alternating
THREEFRY_PARITY = 0x1BD11BDA
THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
THREEFRY_GROUPS = 5

class GroupOp:
  Unary = frozenset(o for o, i in ALU_OPS.items() if i.arity == 1)
  Binary = frozenset(o for o, i in ALU_OPS.items() if i.arity == 2)
  Ternary = frozenset(o for o, i in ALU_OPS.items() if i.arity == 3)
  ALU = frozenset(ALU_OPS)
  Comparison = frozenset(o for o, i in ALU_OPS.items() if i.result == "bool")
  FloatOnly = frozenset(o for o, i in ALU_OPS.items() if i.takes == "float")
  Movement = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP})
  Storage = frozenset({Ops.BUFFER, Ops.SLICE, Ops.PARAM})
  Marker = frozenset({Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH})
  ValueMarker = frozenset({Ops.CONTIGUOUS_BACKWARD, Ops.DETACH})   # no effect on values: an optimize rule drops each
  ReduceOps = frozenset({Ops.ADD, Ops.MUL, Ops.MAX})

# what each `takes` rule accepts (WHERE's values: any; its condition is checked apart), and how a refusal says it
TAKES = {"float": (lambda d: d.is_float(), "a float dtype"), "int": (lambda d: d.is_int(), "an int dtype"),
          "intbool": (lambda d: not d.is_float(), "an int or bool dtype"), "number": (lambda d: d.kind in "iuf", "an int or float dtype"),
          "uint64": (lambda d: d.name == "uint64", "uint64")}
