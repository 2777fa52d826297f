"""Hypothesis strategies for random IR graphs over realized buffers, and the checks shared by the property tests."""
from __future__ import annotations
import math
import numpy as np
from hypothesis import strategies as st
from egraph.ir import Node, Ops, GroupOp, new_buffer, const, toposort, substitute, CallInfo, ParamArg
from egraph.dtypes import dtypes
from lower.runtime import Storage, run_call
from lower.numpy import evaluate

SHAPES = [(16,), (4, 4), (2, 8), (2, 2, 4), (1, 4, 4), (8,), (2, 4)]

def _factorizations(n: int) -> list[tuple[int, ...]]:
  out = [(n,), (1, n), (n, 1)]
  for a in range(2, n):
    if n % a == 0:
      out.append((a, n // a))
      for b in range(2, n // a):
        if (n // a) % b == 0: out.append((a, b, n // a // b))
  return out

class Graph:
  """A generated graph: its roots, the storage holding the input buffers, and the inputs."""
  def __init__(self, roots, storage, inputs): self.roots, self.storage, self.inputs = roots, storage, inputs
  def __repr__(self): return f"Graph({len(toposort(self.roots, enter_calls=False))} nodes, roots={self.roots})"

def movement(draw, x: Node) -> Node:
  kind = draw(st.sampled_from(["reshape", "shrink", "permute", "flip", "pad", "expand", "shrink_rows"]))
  s = x.shape
  if kind == "reshape": return x.reshape(draw(st.sampled_from(_factorizations(x.numel))))
  if kind in ("shrink", "shrink_rows"):
    arg = []
    for i, d in enumerate(s):
      if kind == "shrink_rows" and i > 0: arg.append((0, d)); continue
      a = draw(st.integers(0, d)); b = draw(st.integers(a, d)); arg.append((a, b))
    return x.shrink(arg)
  if kind == "permute": return x.permute(draw(st.permutations(range(len(s)))))
  if kind == "flip": return x.flip([draw(st.booleans()) for _ in s])
  if kind == "pad": return x.pad([(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in s])
  if 1 in s: return x.expand(tuple(draw(st.sampled_from([1, 3])) if d == 1 else d for d in s))
  return x.reshape((1,) + s).expand((2,) + s)

@st.composite
def graphs(draw, max_steps: int = 10, dtype=dtypes.float32, device: str = "CPU") -> Graph:
  """Random graphs: elementwise, reduce, movement chains, CONTIGUOUS/DETACH markers, assigns, host copies, shared nodes."""
  storage = Storage()
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  inputs = []
  for _ in range(draw(st.integers(1, 3))):
    shp = draw(st.sampled_from(SHAPES))
    b = new_buffer(math.prod(shp), dtype, device)
    storage.set_data(b, rng.standard_normal(math.prod(shp)).astype(np.float32))
    inputs.append(b)
  pool: list[Node] = [b.reshape(draw(st.sampled_from(_factorizations(b.numel)))) for b in inputs]
  for _ in range(draw(st.integers(1, max_steps))):
    x = draw(st.sampled_from(pool))
    kind = draw(st.sampled_from(["unary", "binary", "binary", "move", "move", "reduce", "contiguous", "contiguous",
                                 "detach", "assign", "hostcopy", "where"]))
    if kind == "unary": y = Node(draw(st.sampled_from([Ops.NEG, Ops.EXP2, Ops.SQRT])), None, (x,))
    elif kind == "binary":
      same = [p for p in pool if p.shape == x.shape]
      other = draw(st.sampled_from(same)) if same and draw(st.booleans()) else const(draw(st.floats(-2, 2, width=32)), dtype, device).reshape((1,) * len(x.shape)).expand(x.shape)
      y = Node(draw(st.sampled_from([Ops.ADD, Ops.MUL, Ops.MAX, Ops.SUB])), None, (x, other))
    elif kind == "where":
      c = Node(Ops.CMPLT, None, (x, const(0.0, dtype, device).reshape((1,) * len(x.shape)).expand(x.shape)))
      y = Node(Ops.WHERE, None, (c, x, Node(Ops.NEG, None, (x,))))
    elif kind == "move": y = movement(draw, x)
    elif kind == "reduce":
      if not x.shape: continue
      axes = tuple(sorted(draw(st.sets(st.integers(0, len(x.shape) - 1), min_size=1))))
      y = Node(Ops.REDUCE, None, (x,), (draw(st.sampled_from([Ops.ADD, Ops.MAX])), axes))
    elif kind == "contiguous":
      if x.has_buffer_identity(): continue
      y = x.contiguous()
    elif kind == "detach": y = Node(draw(st.sampled_from([Ops.DETACH, Ops.CONTIGUOUS_BACKWARD])), x.dtype, (x,))
    elif kind == "assign":
      # into a buffer nothing else reads (in place, maybe reading itself), or into a computed value (gets a fresh buffer)
      if draw(st.booleans()) or x.has_buffer_identity():
        t = new_buffer(max(x.numel, 1) if x.numel else 0, dtype, device)
        storage.set_data(t, rng.standard_normal(t.arg.size).astype(np.float32))
        tv = t.reshape(x.shape)
        v = Node(Ops.ADD, None, (tv, x)) if draw(st.booleans()) else x
      else:
        tv, v = x, draw(st.sampled_from([p for p in pool if p.shape == x.shape]))
      y = tv.after(tv.store(v))
    else:
      shp = draw(st.sampled_from(SHAPES))
      hb = new_buffer(math.prod(shp), dtype, "NPY")
      storage.set_data(hb, rng.standard_normal(math.prod(shp)).astype(np.float32))
      y = Node(Ops.COPY, dtype, (hb.reshape(shp),), device)
    pool.append(y)
  cands = pool[len(inputs):] or pool
  roots = draw(st.lists(st.sampled_from(cands), min_size=1, max_size=3, unique_by=lambda n: n.id))
  return Graph(roots, storage, inputs)

def reference_values(g: Graph, keys: list[Node]) -> list[np.ndarray]:
  """The oracle: evaluate every key in the original graph with the numpy executor on a private copy of storage."""
  from egraph.encode import assigns_into_computed
  st_ = g.storage.copy()
  # assigning into a computed value means "a fresh buffer holding the value" (spec rule 8)
  sem = {n: n.src[1].src[1] for n in toposort(list(g.roots), enter_calls=False) if n.op is Ops.AFTER and assigns_into_computed(n)}
  vals = evaluate(substitute(list(keys) + list(g.roots), sem), st_)
  return [np.array(v, copy=True) for v in vals[:len(keys)]]

def executed_values(g: Graph, call: Node, buffer_map: dict[Node, Node], keys: list[Node]) -> list[np.ndarray]:
  """Run the CALL on a private copy of storage and read each key through the buffer_map."""
  st_ = g.storage.copy()
  run_call(call, st_)
  return [np.array(evaluate([buffer_map[k]], st_)[0], copy=True) for k in keys]
