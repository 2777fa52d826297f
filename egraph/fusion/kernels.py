"""Floor 3, fusion by cost: the kernels a partition makes, read off the IR (`Kernels`): each kernel's KernelWork
for the time model (bytes read once, flops with recompute multiplicity)."""
from __future__ import annotations
from egraph.ir.dtype import dtypes
from egraph.ir.ops import Node, Ops, GroupOp
from egraph.fusion.timemodel import KernelWork, TRANSCENDENTAL, DIVISION, STREAM_BYTES
from egraph.fusion.greedy import LOADS as _LOADS, hoisted

def unview(n: Node) -> Node:
  while n.op in GroupOp.Movement and n.op is not Ops.PAD: n = n.src[0]
  return n

def storage_root(n: Node) -> Node:
  while n.src and n.op not in (Ops.BUFFER, Ops.PARAM): n = n.src[0]
  return n

def reduce_below(order: list[Node], root: Node, stored) -> set[int]:
  """Ids of the nodes of a kernel (`order`: consumers first) with a fused REDUCE at or below them: a loop, which LLVM
  does not hoist (greedy.hoisted applies only to loop-free sources)."""
  red: set[int] = set()
  for n in reversed(order):
    if n.op in _LOADS or (n is not root and n.id in stored): continue
    if n.op is Ops.REDUCE or any(s.id in red for s in n.src): red.add(n.id)
  return red

class Kernels:
  """KernelWork of one kernel per root value (a STORE's value, or a stored candidate), read off the IR, for a given set
  of stored candidate node ids; `region(root)` is the candidates a kernel reaches when nothing is stored. `hoists`: a
  broadcast value is computed once per loop it varies in (greedy.hoisted), else once per element that reads it."""
  def __init__(self, cand_ids: set[int], device: str = "CPU", hoists: bool = True):
    self.cands, self.device, self.hoists = cand_ids, device, hoists

  def walk(self, root: Node, stored) -> tuple[dict[int, int], list[Node], set[int]]:
    """(evaluations per node id, the nodes consumers first, candidates reached) of the kernel computing `root`."""
    order, seen, stack, reached = [], set(), [(root, False)], set()
    while stack:   # iterative post-order, then reversed: consumers before their sources
      n, done = stack.pop()
      if done: order.append(n); continue
      if n.id in seen: continue
      seen.add(n.id)
      if n is not root and n.id in self.cands: reached.add(n.id)
      stack.append((n, True))
      if n.op in _LOADS or (n is not root and n.id in stored): continue
      stack.extend((s, False) for s in n.src if s.id not in seen)
    order.reverse()
    evals, red = {root.id: root.numel}, reduce_below(order, root, stored)
    for n in order:
      m = evals.get(n.id, 0)
      if n.op in _LOADS or (n is not root and n.id in stored): continue
      f = n.src[0].numel // max(n.numel, 1) if n.op is Ops.REDUCE else 1
      if self.hoists and n.op is Ops.EXPAND and n.src[0].id not in red:   # loop-free: hoisted out of the loops it does not vary in
        m = max(1, m // hoisted(n))
      for s in n.src: evals[s.id] = max(evals.get(s.id, 0), m * f)   # a shared value is memoized within one scope
    return evals, order, reached

  def work(self, root: Node, written: int, stored, walked=None) -> KernelWork:
    """walked: this kernel's walk (evaluations, order) when the caller already has it."""
    evals, order = walked or self.walk(root, stored)[:2]
    flops = trans = divs = execs = distinct = loaded = 0
    reads: dict[int, list] = {}
    red = False
    for n in order:
      m = evals.get(n.id, 0)
      if n.op in _LOADS or (n is not root and n.id in stored):
        loaded += 1
        s = n if n.id in stored else storage_root(n)
        r = reads.setdefault(s.id, [0, s.nbytes if s.shape is not None else 0])
        r[0] += min(m, n.numel) * n.dtype.itemsize
        execs, distinct = execs + m, distinct + min(m, n.numel)
      elif n.op is Ops.REDUCE: red, flops = True, flops + m * (n.src[0].numel // max(n.numel, 1))
      elif n.op in GroupOp.ALU or n.op is Ops.CAST:
        flops += m
        if n.op in TRANSCENDENTAL: trans += m
        elif n.op in DIVISION: divs += m
    bread = sum(min(a, cap) if cap else a for a, cap in reads.values())
    dram = sum(min(a, cap) for i, (a, cap) in reads.items() if i in stored and cap >= STREAM_BYTES)   # streamed out, read from DRAM
    return KernelWork(bread, written, flops, self.kind(root, stored, red, flops), self.device, trans, 0,
                      1 - distinct / execs if execs else 0.0, divs, dram, len(order) - loaded)

  def kind(self, root: Node, stored, red: bool, flops: int) -> str:
    """"matmul" where lower/ tiles: a matmul-shaped reduce whose two operands are read from memory."""
    if (xs := matmul_operands(root)) is not None and all(x.op in _LOADS or x.id in stored for x in xs): return "matmul"
    return "reduce" if red else "copy" if flops == 0 else "elementwise"

def matmul_operands(root: Node) -> tuple[Node, ...] | None:
  """The operands (below their views) of a matmul-shaped reduce: a float32 sum over one axis of a product, at least 256
  outputs each summing at least 4 products; lower/ tiles it when both are in memory."""
  if root.op is Ops.REDUCE and root.arg[0] is Ops.ADD and len(root.arg[1]) == 1 and root.dtype == dtypes.float32 and \
     (mul := unview(root.src[0])).op is Ops.MUL and root.numel >= 256 and root.src[0].numel // root.numel >= 4:
    return tuple(unview(s) for s in mul.src)
  return None
