"""Floor 3: the rules-mode realize policy, written once for the fusion solver (which prices what lowering would do) and
for lowering (lower/schedule/, which does it). Plain data over the IR: importing it loads no egglog."""
from egraph.ir.ops import Ops, GroupOp

# a REDUCE with this many inputs below another REDUCE or an ALU op, or a computed value broadcast to this many elements
# inside a reduce's body, gets a kernel of its own (lower/schedule/kernelize.py _nested_reduces says why)
NESTED_REDUCE_WORK = 1 << 15
# ops a kernel reads through as its source's value: markers with no arithmetic, and a COPY between host devices
IDENTITY = frozenset({Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CONTIGUOUS, Ops.COPY})
PASS_THROUGH = GroupOp.Movement | IDENTITY   # what the walks to a value's computing node step over
COST_SINK = "cost"   # the SINK arg marking a fusion="cost" CALL: lowering then realizes only what the CALL stores
