"""Moved to rules/testing/strategies.py (the package's rule checker uses them); re-exported here for the property tests, with
the chain the limit tests time."""
from rules.testing.strategies import (SHAPES, Graph, graphs, movement, contiguous_movement, rule_graphs, factorizations,  # noqa: F401
                              reference_values, executed_values, random_data)
from egraph.ir.ops import Node, Ops, new_buffer
from egraph.ir.dtype import dtypes

def chain(n: int) -> Node:
  """An elementwise chain over one buffer with a CONTIGUOUS every 10 steps and a contiguous slice every 25."""
  a = new_buffer(16, dtypes.float32, "CPU")
  x = a
  for i in range(n):
    x = Node(Ops.ADD if i % 2 else Ops.MUL, None, (x, a))
    if i % 10 == 9: x = x.contiguous()
    if i % 25 == 24: x = x.reshape((4, 4)).shrink(((1, 3), (0, 4))).contiguous().reshape((8,)).pad(((4, 4),))
  return x
