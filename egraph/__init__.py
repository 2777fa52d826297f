"""callsat's first package: tensor IR, Tensor front end, e-graph encoding, schedules, extraction, cost models, callify."""
from egraph.errors import CallsatError, ShapeError, DTypeError, DeviceError, UnsupportedOpError, LimitError, EngineError
from egraph.dtypes import dtypes, DType
from egraph.ir import Node, Ops, GroupOp
