"""Floor 3: what tinygrad 0.14's rangeify stores without hints (issue 28's anchor): the bridge's cost mode compares a
partition with this schedule, not with callsat's own rules (which store more: callsat's rules-like partition ran ResNet-18's
forward graph 1.4x faster than tinygrad's own schedule, so taking it for stock hid that gain and priced stock wrong).

A stand-in over the IR, read off tinygrad/schedule/indexing.py run_rangeify (PCONTIG=0) and rangeify.py remove_bufferize:
1. Ranges, consumers first: a kernel root starts new ranges; an ALU op passes its consumer's ranges to its sources, a
   movement op moves them, a REDUCE adds ranges for its reduced axes. A value whose consumers index it with different
   ranges (two reduces, two views, two kernels) is realized; so is an ALU/CAST/REDUCE value below an EXPAND (its
   ranges end there: why tinygrad realizes a softmax's max and a conv's input).
2. Removal, producers first: a realized value that is not a kernel root is recomputed in its consumers again unless its
   computation reads more than three buffers or holds a REDUCE that reads one (tinygrad's cost of recomputing).
Signatures of ranges are structural (the consumer's ranges and the movement ops between), so two views that tinygrad's
symbolic rewrite would prove equal count as different here: a conservative stand-in, checked against tinygrad's kernel
counts in tests/bridge/test_stock.py."""
from __future__ import annotations
from egraph.ir.ops import Node, Ops, GroupOp, toposort
from egraph.fusion.greedy import LOADS

MAX_BUFFERS = 3   # remove_bufferize keeps a buffer whose value reads more than this many buffers
_RECOMPUTED = GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.REDUCE}   # what tinygrad realizes where its ranges end
_THROUGH = frozenset({Ops.DETACH, Ops.CONTIGUOUS_BACKWARD})   # markers tinygrad drops before rangeify

def tinygrad_realized(values: list[Node]) -> set[Node]:
  """The computed nodes below the kernel roots `values` that tinygrad 0.14 would store (module docstring); loads end
  every walk."""
  order = toposort(values, enter_calls=False, leaves=LOADS)
  consumers: dict[int, list[Node]] = {n.id: [] for n in order}
  for n in order:
    if n.op not in LOADS:
      for s in n.src:
        if s.id in consumers: consumers[s.id].append(n)
  roots = {v.id for v in values}
  sig: dict[int, tuple] = {}
  ends: dict[int, bool] = {}   # the ranges of a consumer below an EXPAND end at this node's first computed source
  realized: set[int] = set()
  for x in reversed(order):
    if x.op in LOADS: continue
    if x.id in roots: sig[x.id], ends[x.id] = (x.id,), False; continue
    seen = {_read_as(c, x, sig) for c in consumers[x.id] if c.id in sig}
    if not seen: continue
    end = any(ends.get(c.id, False) for c in consumers[x.id])
    if len(seen) > 1 or (end and x.op in _RECOMPUTED):
      realized.add(x.id); sig[x.id], ends[x.id] = (x.id,), False
    else: sig[x.id], ends[x.id] = seen.pop(), end
    if x.op is Ops.EXPAND: ends[x.id] = True
  kept: set[int] = set()
  for x in order:   # producers first: a removed source's reads count in its consumer
    if x.id in realized and not _recomputed(x, kept): kept.add(x.id)
  return {x for x in order if x.id in kept}

def kernel_values(roots: list[Node]) -> tuple[list[Node], int]:
  """The values the kernels of a graph's realize points `roots` compute (a STORE's value under an assign's AFTERs, a
  computed root below its views), and how many assigns read their own target (tinygrad computes such a value into a
  buffer of its own first: one more kernel). With tinygrad_realized's stores, the stand-in's kernel count."""
  vals, self_reads = {}, 0
  for r in roots:
    while r.op in GroupOp.Movement or r.op in _THROUGH or r.op is Ops.CONTIGUOUS: r = r.src[0]
    if r.op is not Ops.AFTER:
      if r.op not in LOADS and r.op not in (Ops.CONST, Ops.COPY): vals[r.id] = r
      continue
    stack = list(r.src[1:])
    while stack:
      d = stack.pop()
      if d.op is Ops.AFTER: stack += d.src[1:]
      if d.op is not Ops.STORE: continue
      vals[d.src[1].id], target = d.src[1], d.src[0]
      while target.op in GroupOp.Movement or target.op is Ops.AFTER: target = target.src[0]
      self_reads += any(n is target for n in toposort([d.src[1]], enter_calls=False))
  return list(vals.values()), self_reads

def _read_as(c: Node, x: Node, sig: dict) -> tuple:
  """The ranges consumer c indexes its source x with, as a structural signature."""
  if c.op in GroupOp.Movement: return sig[c.id] + ((c.op, c.arg),)
  if c.op is Ops.REDUCE: return sig[c.id] + ((Ops.REDUCE, c.id),)
  return sig[c.id]

def _recomputed(x: Node, kept: set[int]) -> bool:
  """Would remove_bufferize take x's buffer away: x's computation (down to loads and kept buffers) reads at most
  MAX_BUFFERS buffers, and no REDUCE in it reads one."""
  bufs, reduces, stack, seen = set(), [], [x], {x.id}
  while stack:
    n = stack.pop()
    if n is not x and (n.op in LOADS or n.id in kept): bufs.add(_storage(n)); continue
    if n.op is Ops.REDUCE: reduces.append(n)
    for s in n.src:
      if s.id not in seen: seen.add(s.id); stack.append(s)
  if len(bufs) > MAX_BUFFERS: return False
  return not any(_reads_buffer(r, kept) for r in reduces)

def _reads_buffer(r: Node, kept: set[int]) -> bool:
  stack, seen = list(r.src), set()
  while stack:
    n = stack.pop()
    if n.op in LOADS or n.id in kept: return True
    for s in n.src:
      if s.id not in seen: seen.add(s.id); stack.append(s)
  return False

def _storage(n: Node) -> int:
  """A load's buffer identity (its views read one buffer), or a kept value's."""
  while n.op in GroupOp.Movement or n.op in _THROUGH: n = n.src[0]
  return n.id
