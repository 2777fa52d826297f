"""callsat's first package: tensor IR, Tensor front end, e-graph encoding, schedules, extraction, cost models, callify."""
from egraph.errors import CallsatError, ShapeError, DTypeError, DeviceError, UnsupportedOpError, LimitError, EngineError
from egraph.dtype import dtypes, DType
from egraph.ir import Node, Ops, GroupOp
from egraph.runner import Limits, Schedule
from egraph.cost import CostModel
from egraph.report import CallifyReport
from egraph.driver import callify, CallifyResult
from egraph.tensor import Tensor
from egraph.tracing import function
from egraph.symbolic import Variable

__all__ = ["CallsatError", "ShapeError", "DTypeError", "DeviceError", "UnsupportedOpError", "LimitError", "EngineError",
           "dtypes", "DType", "Node", "Ops", "GroupOp", "Limits", "Schedule", "CostModel", "CallifyReport", "callify",
           "CallifyResult", "Tensor", "function", "Variable"]
