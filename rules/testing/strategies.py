"""Hypothesis strategies for random IR graphs over realized buffers (moved here from tests/graphgen.py so the package's
rule checker can use them), plus per-rule strategies whose graphs contain each rule's left side.

hypothesis is a test extra: it is imported when a strategy is built, and a missing install raises a CallsatError that
says `pip install callsat[test]`. Every strategy is a function returning a strategy (build it, then draw from it)."""
from __future__ import annotations
import math
import numpy as np
from egraph.ir.ops import Node, Ops, new_buffer, const, toposort, substitute, render
from egraph.ir.storage import Storage
from egraph.engine.encode import assigns_into_computed
from lower.reference import evaluate
from lower.runtime import run_call
from egraph.ir.dtype import dtypes
from egraph.ir.errors import CallsatError
from egraph.ir.view import contiguous_range

SHAPES = [(16,), (4, 4), (2, 8), (2, 2, 4), (1, 4, 4), (8,), (2, 4)]
VALUE_DTYPES = ("float32", "float16", "int32", "uint8", "int8", "int16", "uint16", "uint32", "int64", "uint64", "float64",
                "bfloat16")

def hypothesis_strategies():
  """`hypothesis.strategies`, or a CallsatError that says how to install it."""
  try:
    from hypothesis import strategies as st
  except ImportError as e:
    raise CallsatError("rule checking and graph strategies need hypothesis: pip install callsat[test]") from e
  return st

def factorizations(n: int) -> list[tuple[int, ...]]:
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
  def render(self) -> str:
    return render(list(self.roots), enter_calls=False)

def random_data(rng, n: int, dtype) -> np.ndarray:
  """n random elements of `dtype` (small ints for int dtypes so arithmetic stays readable)."""
  if dtype.is_float(): return rng.standard_normal(n).astype(dtype.np)
  if dtype == dtypes.bool: return rng.integers(0, 2, n).astype(bool)
  return rng.integers(0, 100 if dtype.itemsize == 1 else 1000, n).astype(dtype.np)

def movement(draw, x: Node) -> Node:
  """One random movement op on x (any kind, including PAD and real transposes)."""
  st = hypothesis_strategies()
  kind = draw(st.sampled_from(["reshape", "shrink", "permute", "flip", "pad", "expand", "shrink_rows"]))
  s = x.shape
  if kind == "reshape": return x.reshape(draw(st.sampled_from(factorizations(x.numel)))) if x.numel else x
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

def contiguous_movement(draw, x: Node, steps: int) -> Node:
  """A movement chain over x that stays one contiguous row-major range of x's base (a view candidate): reshapes,
  leading-axis shrinks, and permutes/flips that only move size-1 axes; DETACH markers in between."""
  st = hypothesis_strategies()
  base = x.base
  for _ in range(steps):
    kind = draw(st.sampled_from(["reshape", "shrink_rows", "unit_permute", "unit_flip", "detach"]))
    s = x.shape
    if kind == "reshape" and x.numel: y = x.reshape(draw(st.sampled_from(factorizations(x.numel))))
    elif kind == "shrink_rows" and s and s[0] > 0:
      a = draw(st.integers(0, s[0] - 1)); b = draw(st.integers(a + 1, s[0]))
      y = x.shrink(((a, b),) + tuple((0, d) for d in s[1:]))
    elif kind == "unit_permute" and len(s) > 1:
      units = [i for i, d in enumerate(s) if d == 1]
      if len(units) < 1: continue
      order = list(range(len(s)))
      i = draw(st.sampled_from(units)); j = draw(st.integers(0, len(s) - 1))
      order.remove(i); order.insert(j, i)   # moving a size-1 axis keeps the element order
      y = x.permute(tuple(order))
    elif kind == "unit_flip": y = x.flip([d == 1 and draw(st.booleans()) for d in s])
    elif kind == "detach": y = Node(Ops.DETACH, x.dtype, (x,))
    else: continue
    if contiguous_range(y, base) is not None: x = y
  return x

def graphs(max_steps: int = 10, dtype=dtypes.float32, device: str = "CPU"):
  """Random graphs: elementwise, reduce, movement chains, CONTIGUOUS/DETACH markers, assigns, host copies, shared nodes.
  `dtype` is a dtype, or None to draw one of VALUE_DTYPES per graph."""
  st = hypothesis_strategies()

  @st.composite
  def _graphs(draw) -> Graph:
    dt = dtype if dtype is not None else dtypes.from_any(draw(st.sampled_from(VALUE_DTYPES)))
    storage = Storage()
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
      shp = draw(st.sampled_from(SHAPES))
      b = new_buffer(math.prod(shp), dt, device)
      storage.set_data(b, random_data(rng, math.prod(shp), dt))
      inputs.append(b)
    pool: list[Node] = [b.reshape(draw(st.sampled_from(factorizations(b.numel)))) for b in inputs]
    unary = [Ops.NEG, Ops.EXP2, Ops.SQRT] if dt.is_float() else [Ops.NEG]
    for _ in range(draw(st.integers(1, max_steps))):
      x = draw(st.sampled_from(pool))
      kind = draw(st.sampled_from(["unary", "binary", "binary", "move", "move", "reduce", "contiguous", "contiguous",
                                   "detach", "assign", "hostcopy", "where", "view"]))
      if kind == "unary": y = Node(draw(st.sampled_from(unary)), None, (x,))
      elif kind == "binary":
        same = [p for p in pool if p.shape == x.shape]
        cval = draw(st.floats(-2, 2, width=32)) if dt.is_float() else draw(st.integers(0, 5))
        other = draw(st.sampled_from(same)) if same and draw(st.booleans()) else const(cval, dt, device).reshape((1,) * len(x.shape)).expand(x.shape)
        y = Node(draw(st.sampled_from([Ops.ADD, Ops.MUL, Ops.MAX, Ops.SUB])), None, (x, other))
      elif kind == "where":
        c = Node(Ops.CMPLT, None, (x, const(0, dt, device).reshape((1,) * len(x.shape)).expand(x.shape)))
        y = Node(Ops.WHERE, None, (c, x, Node(Ops.NEG, None, (x,))))
      elif kind == "move": y = movement(draw, x)
      elif kind == "view":       # a contiguous-range chain then CONTIGUOUS: a zero-copy view candidate
        y = contiguous_movement(draw, x, draw(st.integers(1, 3)))
        if y.has_buffer_identity(): continue
        y = y.contiguous()
      elif kind == "reduce":
        if not x.shape: continue
        axes = tuple(sorted(draw(st.sets(st.integers(0, len(x.shape) - 1), min_size=1))))
        y = Node(Ops.REDUCE, None, (x,), (draw(st.sampled_from([Ops.ADD, Ops.MAX])), axes))
      elif kind == "contiguous":
        if x.has_buffer_identity(): continue
        y = x.contiguous()
      elif kind == "detach": y = Node(draw(st.sampled_from([Ops.DETACH, Ops.CONTIGUOUS_BACKWARD])), x.dtype, (x,))
      elif kind == "assign":
        # into a buffer nothing else reads (in place, maybe reading itself), or into a computed value (a fresh buffer)
        if draw(st.booleans()) or x.has_buffer_identity():
          t = new_buffer(max(x.numel, 1) if x.numel else 0, dt, device)
          storage.set_data(t, random_data(rng, t.arg.size, dt))
          tv = t.reshape(x.shape)
          v = Node(Ops.ADD, None, (tv, x)) if draw(st.booleans()) else x
        else:
          tv, v = x, draw(st.sampled_from([p for p in pool if p.shape == x.shape]))
        y = tv.after(tv.store(v))
      else:
        shp = draw(st.sampled_from(SHAPES))
        hb = new_buffer(math.prod(shp), dt, "NPY")
        storage.set_data(hb, random_data(rng, math.prod(shp), dt))
        y = Node(Ops.COPY, dt, (hb.reshape(shp),), device)
      pool.append(y)
    cands = pool[len(inputs):] or pool
    roots = draw(st.lists(st.sampled_from(cands), min_size=1, max_size=3, unique_by=lambda n: n.id))
    return Graph(roots, storage, inputs)
  return _graphs()

# ---- graphs that contain a rule's left side ------------------------------------------------------------------------

def _planted(name: str, draw, g: Graph, dt, device: str) -> Node | None:
  """A node matching rule `name`'s left side, built over g's nodes and inputs (None: the rule has no planter)."""
  st = hypothesis_strategies()
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  x = draw(st.sampled_from(list(g.roots) + [b.reshape(draw(st.sampled_from(factorizations(b.numel)))) for b in g.inputs]))
  def computed(n: Node) -> Node:   # a value without buffer identity
    return n if not n.has_buffer_identity() and n.op not in (Ops.AFTER,) else Node(Ops.NEG, None, (n,))
  def fresh_target(shape) -> Node:
    t = new_buffer(math.prod(shape), dt, device)
    g.storage.set_data(t, random_data(rng, t.arg.size, dt))
    return t.reshape(shape)
  if name == "materialize_contiguous": return computed(x).contiguous()
  if name == "materialize_assign":
    c = computed(x)
    return c.after(c.store(draw(st.sampled_from([x, Node(Ops.ADD, None, (c, c))]))))
  if name == "zero_size":
    c = computed(x)
    if not c.shape: c = c.reshape((1,))
    return c.shrink(((0, 0),) + tuple((0, d) for d in c.shape[1:])).contiguous()
  if name == "contiguous_to_view":
    src = draw(st.sampled_from([b.reshape(draw(st.sampled_from(factorizations(b.numel)))) for b in g.inputs] + [computed(x).contiguous()]))
    v = contiguous_movement(draw, src, draw(st.integers(1, 4)))
    if v.has_buffer_identity() or contiguous_range(v, v.base) is None or v is src:   # make sure it is a proper view
      if src.shape and src.shape[0] >= 2: v = src.shrink(((0, src.shape[0] - 1),) + tuple((0, d) for d in src.shape[1:]))
      else: v = src.reshape((src.numel,)) if src.shape != (src.numel,) else Node(Ops.DETACH, src.dtype, (src,))
      if v.has_buffer_identity(): v = Node(Ops.DETACH, v.dtype, (v,))
    return v.contiguous()
  if name == "bitcast_to_view":   # a BITCAST of a contiguous range of a buffer, to a dtype of the same size
    b = draw(st.sampled_from(g.inputs))
    v = contiguous_movement(draw, b.reshape(draw(st.sampled_from(factorizations(b.numel)))), draw(st.integers(1, 3)))
    same = [d for d in dtypes.all if d.itemsize == dt.itemsize and d != dtypes.bool]
    return Node(Ops.BITCAST, draw(st.sampled_from(same)), (v,))
  if name == "assign_copy_in_place":   # a host copy assigned into a buffer
    t = fresh_target(x.shape)
    hb = new_buffer(max(x.numel, 1) if x.numel else 0, dt, "NPY")
    g.storage.set_data(hb, random_data(rng, hb.arg.size, dt))
    return t.after(t.store(Node(Ops.COPY, dt, (hb.reshape(x.shape),), device)))
  if name == "contiguous_of_storage":
    b = draw(st.sampled_from(g.inputs))
    return Node(Ops.CONTIGUOUS, dt, (b.reshape(draw(st.sampled_from(factorizations(b.numel)))),))
  if name in ("contiguous_of_assign", "contiguous_of_assign_n"):
    t = fresh_target(x.shape)
    stores = [t.store(draw(st.sampled_from([x, Node(Ops.ADD, None, (t, x))])))]
    if name == "contiguous_of_assign_n": stores.append(t.store(Node(Ops.MUL, None, (x, x))))
    return t.after(*stores).contiguous()
  if name == "contiguous_idempotent": return computed(x).contiguous().contiguous()
  if name == "drop_detach": return Node(Ops.DETACH, x.dtype, (computed(x),))
  if name == "drop_contiguous_backward": return Node(Ops.CONTIGUOUS_BACKWARD, x.dtype, (computed(x),))
  if name == "storage_through_reshape":
    b = draw(st.sampled_from(g.inputs))
    r = Node(Ops.CONTIGUOUS, dt, (b,)).reshape(draw(st.sampled_from(factorizations(b.numel))))
    return r.contiguous()
  return None

def rule_graphs(name: str, max_steps: int = 6, device: str = "CPU", dtype=None):
  """Random graphs (random dtypes by default) with rule `name`'s left side planted among the roots, over random
  background graphs. Rules without a planter (added later) get plain random graphs."""
  st = hypothesis_strategies()
  base = graphs(max_steps=max_steps, dtype=dtype, device=device)

  @st.composite
  def _rule_graphs(draw) -> Graph:
    g = draw(base)
    dt = g.inputs[0].dtype
    n = _planted(name, draw, g, dt, device)
    if n is None: return g
    roots = [n] + list(g.roots)[:draw(st.integers(0, len(g.roots)))]
    return Graph(list(dict.fromkeys(roots)), g.storage, g.inputs)
  return _rule_graphs()

PLANTED = ("bitcast_to_view", "assign_copy_in_place", "materialize_contiguous", "materialize_assign", "zero_size", "contiguous_to_view",
           "contiguous_of_storage",
           "contiguous_of_assign", "contiguous_of_assign_n", "contiguous_idempotent", "drop_detach",
           "drop_contiguous_backward", "storage_through_reshape")

# ---- oracles shared by the property tests --------------------------------------------------------------------------

def reference_values(g: Graph, keys: list[Node]) -> list[np.ndarray]:
  """The oracle: evaluate every key in the original graph with the numpy executor on a private copy of storage."""
  return oracle_values(list(g.roots), g.storage, keys)

def oracle_values(roots: list[Node], storage: Storage, keys: list[Node]) -> list[np.ndarray]:
  """`keys` of the graph under `roots`, evaluated by the numpy executor on a private copy of `storage`."""
  st_ = storage.copy()
  # assigning into a computed value means "a fresh buffer holding the value" (spec rule 8); children first, so a value
  # that holds another such assign is rewritten too (substitute does not enter the values it maps to)
  sem: dict[Node, Node] = {}
  for n in toposort(roots, enter_calls=False):
    if n.op is Ops.AFTER and assigns_into_computed(n): sem[n] = substitute([n.src[1].src[1]], sem)[0]
  vals = evaluate(substitute(list(keys) + roots, sem), st_)
  return [np.array(v, copy=True) for v in vals[:len(keys)]]

def executed_values(g: Graph, call: Node, buffer_map: dict[Node, Node], keys: list[Node]) -> list[np.ndarray]:
  """Run the CALL on a private copy of storage and read each key through the buffer_map."""
  st_ = g.storage.copy()
  run_call(call, st_)
  return [np.array(evaluate([buffer_map[k]], st_)[0], copy=True) for k in keys]
