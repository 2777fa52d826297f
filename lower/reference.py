"""The numpy reference executor: evaluates any IR graph (and any CALL) with numpy. It is the oracle the rest is tested against.

Evaluation is iterative (graphs can be 100k deep) with one memo per graph, children first. Storage nodes evaluate to numpy *views*
of the storage arrays. Effects are ordered only by AFTER: a read through AFTER(x, deps) sees the writes of deps; a read of
storage that does not go through an AFTER sees the state before the graph's effects (tinygrad's write-after-read order), so
the order of roots never matters.
The elementwise semantics of every op, cast and dtype live in lower/numeric.py: ints wrap in the node dtype, IDIV/MOD truncate,
floor division floors, division by zero is defined (`x // 0 == 0`, `x % 0 == x`), float -> int casts follow tinygrad's CPU
device. Bool arithmetic is C's `(bool)(a op b)`: ADD=OR, SUB=XOR, MUL=AND, NEG=identity.
"""
from __future__ import annotations
from typing import Any, TYPE_CHECKING
import numpy as np
from egraph.ir.dtype import dtypes, as_np
from egraph.ir.errors import CallsatError, UnsupportedOpError
from egraph.ir.ops import Node, Ops, GroupOp, is_shard, effect_order, multi_arg, shard_params
from egraph.ir.view import view_index
from egraph.ir.storage import STORAGE, UnallocatedBufferError
from lower.numeric import wrap_const, alu, cast
if TYPE_CHECKING: from egraph.ir.storage import Storage

LATER = frozenset({Ops.BIND})
# ops a STORE target may go through and still be a view of storage (EXPAND/PAD/compute are not)
WRITABLE = frozenset({Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP, Ops.AFTER, Ops.DETACH, Ops.SLICE})

# ---------------------------------------------------------------------------------------------------------------------
# elementwise

def _const(n: Node) -> np.ndarray: return wrap_const(n.arg[0], n.dtype)

def _alu(n: Node, *xs: np.ndarray) -> np.ndarray: return alu(n.op, n.src[-1].dtype, *xs)

def _reduce(n: Node, x: np.ndarray) -> np.ndarray:
  rop, axes = n.arg
  axes, dt = tuple(sorted(set(axes))), n.dtype   # ir.py accepts repeated axes; numpy does not
  if dt == dtypes.bool: return (np.all if rop is Ops.MUL else np.any)(x, axis=axes, keepdims=True)
  if dt in dtypes.fp8s: x = x.astype(np.float32)   # exact; an fp8 has no -inf to start max from
  acc = np.float32 if dt in (dtypes.float16, dtypes.bfloat16, *dtypes.fp8s) else dt.np   # half sums accumulate in float32
  if rop is Ops.ADD: r = np.sum(x, axis=axes, keepdims=True, dtype=acc)
  elif rop is Ops.MUL: r = np.prod(x, axis=axes, keepdims=True, dtype=acc)
  else: r = np.max(x, axis=axes, keepdims=True, initial=-np.inf if dt.is_float() else np.iinfo(dt.np).min)
  return as_np(np.asarray(r), dt)

def _bitcast(n: Node, x: np.ndarray) -> np.ndarray:
  c = np.array(x, copy=True, order="C")
  return c.view(np.uint8) != 0 if n.dtype == dtypes.bool else c.view(n.dtype.np)

def _slice(n: Node, src: np.ndarray) -> np.ndarray:
  off, count = n.arg
  isz, osz = src.dtype.itemsize, n.dtype.itemsize
  if not src.flags.c_contiguous: src = np.ascontiguousarray(src)  # a read of computed data; a STORE through it is refused
  return src.view(np.uint8)[off*isz:off*isz + count*osz].view(n.dtype.np)

# the trailing Ellipsis keeps 0-d results arrays (x[()] would be a numpy scalar)
def _shrink(n: Node, x: np.ndarray) -> np.ndarray: return x[tuple(slice(s, e) for s, e in n.arg) + (...,)]
def _flip(n: Node, x: np.ndarray) -> np.ndarray: return x[tuple(slice(None, None, -1) if f else slice(None) for f in n.arg) + (...,)]

# per-device values (egraph.ir.ops.is_shard) carry a leading device axis: movement ops skip it, MULTI concatenates the shards
def _lead(idx: tuple) -> tuple: return (slice(None),) + idx
_SHARD: dict[Ops, Any] = {
  Ops.RESHAPE: lambda n, x: np.reshape(x, (x.shape[0],) + tuple(n.arg)),
  Ops.EXPAND: lambda n, x: np.broadcast_to(x, (x.shape[0],) + tuple(n.arg)),
  Ops.PAD: lambda n, x: np.pad(x, ((0, 0),) + tuple(n.arg)),
  Ops.SHRINK: lambda n, x: x[_lead(tuple(slice(s, e) for s, e in n.arg))],
  Ops.PERMUTE: lambda n, x: np.transpose(x, (0,) + tuple(p + 1 for p in n.arg)),
  Ops.FLIP: lambda n, x: x[_lead(tuple(slice(None, None, -1) if f else slice(None) for f in n.arg))],
  Ops.DETACH: lambda n, x: x,
  Ops.SLICE: lambda n, x: x.view(np.uint8)[:, n.arg[0]*x.dtype.itemsize:n.arg[0]*x.dtype.itemsize + n.arg[1]*n.dtype.itemsize].view(n.dtype.np),
}

_PURE: dict[Ops, Any] = {
  Ops.CONST: _const, Ops.SLICE: _slice, Ops.REDUCE: _reduce, Ops.BITCAST: _bitcast,
  Ops.CAST: lambda n, x: cast(x, n.src[0].dtype, n.dtype),
  Ops.RESHAPE: lambda n, x: np.reshape(x, n.arg),
  Ops.EXPAND: lambda n, x: np.broadcast_to(x, n.arg),
  Ops.PAD: lambda n, x: np.pad(x, n.arg) if x.ndim else x.copy(),
  Ops.SHRINK: _shrink,
  Ops.PERMUTE: lambda n, x: np.transpose(x, n.arg),
  Ops.FLIP: _flip,
  Ops.CONTIGUOUS: lambda n, x: np.array(x, copy=True, order="C"),
  Ops.COPY: lambda n, x: np.array(x, copy=True, order="C"),
  Ops.CONTIGUOUS_BACKWARD: lambda n, x: x, Ops.DETACH: lambda n, x: x,
  Ops.MULTI: lambda n, x: np.concatenate(list(x), axis=n.arg),
  **{op: _alu for op in GroupOp.ALU},
}

# ---------------------------------------------------------------------------------------------------------------------
# storage and effects

def _target_base(n: Node) -> Node:
  while n.op in GroupOp.Movement or n.op in WRITABLE or n.op is Ops.MULTI: n = n.src[0]
  return n

def _keeps_view(n: Node, i: int) -> bool:
  """Source positions that must see storage itself, not its state before the graph's effects: targets, AFTER's x, CALL args."""
  return n.op is Ops.CALL or (i == 0 and n.op in (Ops.STORE, Ops.AFTER))

class _Plan:
  """How to run one graph: pure nodes first, then effectful ones (STORE/CALL and everything above them), both in effect_order.
  Running pure nodes first gives storage reads without AFTER the state before the graph's effects (tinygrad's WAR order), so
  the order of roots does not matter. Pure views that effectful nodes consume as values are snapshotted (`snap`)."""
  def __init__(self, roots: list[Node], cache: dict):
    order, self.written, eff = effect_order(roots), set(), set()
    for n in order:
      if n.op in LATER or (n.op is Ops.PARAM and n.arg.slot < 0):
        what = "symbolic PARAM (slot -1)" if n.op is Ops.PARAM else n.op.name
        raise UnsupportedOpError(f"numpy executor: {what} is not supported yet (a later issue adds it)")
      if n.op is Ops.STORE: self.written.add(_target_base(n.src[0]))
      elif n.op is Ops.CALL:
        for b in _plan([n.src[0]], cache).written:
          if b.op is Ops.PARAM and b.arg.slot + 1 < len(n.src): self.written.add(_target_base(n.src[1 + b.arg.slot]))
          elif b.op is Ops.BUFFER: self.written.add(b)
      if n.op in (Ops.STORE, Ops.CALL) or any(s.id in eff for s in n.src): eff.add(n.id)
    self.order = [n for n in order if n.id not in eff] + [n for n in order if n.id in eff]
    self.eff, self.snap = eff, set()
    # a CALL's temporary args (CallInfo.temps) are scratch for its run, never storage, as on every executor
    self.scratch = {n.src[1 + i].id for n in order if n.op is Ops.CALL for i in getattr(n.arg, "temps", ())}
    if eff:
      self.snap = {s.id for n in order if n.id in eff for i, s in enumerate(n.src) if s.id not in eff and not _keeps_view(n, i)}
      self.snap |= {r.id for r in roots if r.id not in eff}

def _plan(roots: list[Node], cache: dict) -> _Plan:
  """Plans are cached per evaluate() call (nested CALL bodies are planned once); unsupported ops raise here, so a graph that
  cannot run has no partial effects."""
  key = tuple(r.id for r in roots)
  if key not in cache: cache[key] = _Plan(roots, cache)
  return cache[key]

def _is_storage_view(n: Node, memo: dict[int, Any]) -> bool:
  b = n
  while b.op in GroupOp.Movement or b.op in WRITABLE or b.op is Ops.CONTIGUOUS_BACKWARD: b = b.src[0]
  v = memo[n.id]
  return b.op in (Ops.BUFFER, Ops.PARAM) and (v.size == 0 or np.may_share_memory(v, memo[b.id]))

def _buffer(n: Node, storage: Storage, allocate: bool) -> np.ndarray:
  a = storage.get(n.arg.uid)
  if a is None:
    if not allocate and n.arg.size:   # a zero-size buffer has nothing to be stale about
      raise UnallocatedBufferError(f"BUFFER uid={n.arg.uid} ({n.arg.size} x {n.dtype.name} on {n.arg.device}) is read but was never "
                                   "allocated or written")
    a = storage.allocate(n)
  want = (n.arg.size * len(n.device),) if isinstance(n.device, tuple) else (n.arg.size,)
  if a.shape != want or a.dtype != n.dtype.np:
    raise CallsatError(f"BUFFER uid={n.arg.uid}: storage holds {a.dtype}{a.shape}, the node says {n.dtype.name}{want}")
  return a.reshape(len(n.device), n.arg.size) if isinstance(n.device, tuple) else a

def _param(n: Node, params: list[np.ndarray] | None) -> np.ndarray:
  slot = n.arg.slot
  if params is None or slot >= len(params): raise CallsatError(f"PARAM slot={slot}: no such argument ({0 if params is None else len(params)} given)")
  a = params[slot]
  shape = ((len(n.device),) if n.arg.shard else ()) + tuple(n.shape)
  if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != n.dtype.np:
    got = f"{a.dtype}{a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
    raise CallsatError(f"PARAM slot={slot}: argument is {got}, the PARAM says {n.dtype.name}{n.shape}")
  return a

def _store(n: Node, tgt: np.ndarray, val: np.ndarray, memo: dict[int, Any]) -> None:
  b = n.src[0]
  w = b.src[0] if b.op is Ops.SHRINK else b
  while w.op in (Ops.AFTER, Ops.DETACH): w = w.src[0]
  if b.op is Ops.SHRINK and w.op is Ops.MULTI and not is_shard(n.src[1]):   # a window of a sharded value: the logical
    full = np.concatenate(list(memo[w.src[0].id]), axis=w.arg)               # value with the window replaced, stored whole
    full[tuple(slice(lo, hi) for lo, hi in b.arg)] = val
    b, val = w, full
  if b.op is Ops.MULTI:   # a logical value into per-device storage: each device gets its shard
    D = len(b.device)
    if is_shard(n.src[1]): val = np.stack([np.split(val[d], D, b.arg)[d] for d in range(D)])   # per-device copies: each its own shard
    else: val = np.stack(np.split(val, D, b.arg))
    b, tgt = b.src[0], memo[b.src[0].id]
  elif is_shard(b) and not is_shard(n.src[1]): val = np.broadcast_to(val, tgt.shape)   # replicated: every device a copy
  chain = []
  while b.op not in (Ops.BUFFER, Ops.PARAM):
    if b.op not in WRITABLE and b.op not in (Ops.PAD, Ops.EXPAND):
      raise CallsatError(f"STORE: the target goes through {b.op.name} {b.shape}, which is not a writable view of storage")
    chain.append(b); b = b.src[0]
  if tgt.size == 0: return
  base = memo[b.id]
  if any(c.op in (Ops.PAD, Ops.EXPAND) or not np.may_share_memory(memo[c.id], base) for c in chain): return _scatter(n.src[0], val, base, memo)
  tgt[...] = val.copy() if np.may_share_memory(tgt, val) else val

def _scatter(t: Node, val: np.ndarray, base: np.ndarray, memo: dict[int, Any]) -> None:
  """A strided target numpy cannot view (a[::2] pads then shrinks; a reshape of a non-contiguous view copies): write
  the elements it names, by flat index into the storage under its movement chain."""
  arr = memo[t.base.id]
  if is_shard(t) or not arr.flags.c_contiguous or not np.may_share_memory(arr, base):
    raise CallsatError(f"STORE: the target {t.shape} through {t.op.name} is not a view of storage")
  idx = view_index(t)
  if (idx < 0).any() or np.unique(idx).size != idx.size:
    m = t
    while m.op not in (Ops.PAD, Ops.EXPAND) and m.src and m.src[0].op in GroupOp.Movement: m = m.src[0]
    raise CallsatError(f"STORE: the target {t.shape} goes through {m.op.name}, which does not name each element of storage once")
  arr.reshape(-1)[idx] = val.copy() if np.may_share_memory(arr, val) else val

def _run(roots: list[Node], storage: Storage, params: list[np.ndarray] | None, cache: dict) -> list[Any]:
  plan = _plan(roots, cache)
  memo: dict[int, Any] = {}   # current values; views of storage follow its writes
  old: dict[int, Any] = {}    # snapshots of pure views, taken before any effect
  def srcs(n: Node):
    if n.id not in plan.eff: return (memo[s.id] for s in n.src)
    return (memo[s.id] if _keeps_view(n, i) else old.get(s.id, memo[s.id]) for i, s in enumerate(n.src))
  for n in plan.order:
    op = n.op
    if op is Ops.BUFFER: v = np.zeros(n.arg.size, n.dtype.np) if n.id in plan.scratch else _buffer(n, storage, n in plan.written)
    elif op is Ops.PARAM: v = _param(n, params)
    elif op is Ops.AFTER:
      x = n.src[0]
      # a pure x that is not a view of storage was computed before the deps ran: compute it again, after them
      v = memo[x.id] if n.id not in plan.eff or x.id in plan.eff or _is_storage_view(x, memo) else _run([x], storage, params, cache)[0]
    elif op is Ops.STORE: v = _store(n, *srcs(n), memo)
    elif op is Ops.SINK: v = None
    elif op is Ops.TUPLE: v = tuple(memo[s.id] for s in n.src)
    elif op is Ops.GETTUPLE: v = memo[n.src[0].id][n.arg]
    elif op is Ops.FUNCTION:   # a plain (inlined) function: its TUPLE body evaluated with PARAM i = argument i
      args = [memo[s.id] for s in n.src[1:]]
      v = tuple(np.array(x, copy=True) for x in _run(list(n.src[0].src), storage, args, cache))
    elif op is Ops.CALL:   # a MULTI argument over storage passes its shards: the body writes them through shard_params
      sharded = {i: m for i, s in enumerate(n.src[1:]) if (m := multi_arg(s)) is not None}
      args = [memo[sharded[i].src[0].id] if i in sharded else memo[s.id] for i, s in enumerate(n.src[1:])]
      if any(a is None for a in args): raise CallsatError(f"CALL: argument {[a is None for a in args].index(True)} has no value")
      _run([shard_params(n.src[0], sharded)], storage, args, cache)
      v = None
    elif op in _SHARD and is_shard(n): v = np.asarray(_SHARD[op](n, *srcs(n)))
    elif (f := _PURE.get(op)) is not None:
      # a logical op reading a per-device value without MULTI reads a replicated value: any device's copy will do
      xs = srcs(n) if op is Ops.MULTI or not any(is_shard(s) for s in n.src) else (x[0] if is_shard(s) else x for s, x in zip(n.src, srcs(n)))
      v = np.asarray(f(n, *xs))
      if v.shape != n.shape or v.dtype != n.dtype.np:
        raise CallsatError(f"numpy executor: {op.name} gave {v.dtype}{v.shape}, the node says {n.dtype.name}{n.shape}")
    else: raise UnsupportedOpError(f"numpy executor: unknown op {op}")
    memo[n.id] = v
    if n.id in plan.snap and v is not None and (op in (Ops.BUFFER, Ops.PARAM) or v.base is not None): old[n.id] = v.copy()
  return [old.get(r.id, memo[r.id]) for r in roots]

# ---------------------------------------------------------------------------------------------------------------------
# entry points

def evaluate(roots: list[Node], storage: Storage, params: list[np.ndarray] | None = None) -> list[np.ndarray]:
  """Values of `roots` (None for SINK/STORE/CALL), running every STORE and CALL on the way. Values that view storage stay views
  (they change with later writes; copy them to keep them), except pure views in a graph with effects, which are snapshots of the
  state before the effects. STORE targets that storage lacks are allocated (zeros); other unallocated reads raise."""
  with np.errstate(all="ignore"): return _run(list(roots), storage, params, {})

def eval_node(node: Node, storage: Storage | None = None) -> np.ndarray | None:
  """The value of one node as a standalone copy (storage defaults to egraph.ir.storage.STORAGE)."""
  v = evaluate([node], STORAGE if storage is None else storage)[0]
  return None if v is None else np.array(v, copy=True)
