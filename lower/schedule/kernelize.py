"""CALL body -> an ordered list of kernels (lower/schedule/kernel.py) plus a buffer plan.

* One store group per STORE (in lower/reference.py's effect order); a nested CALL is scheduled recursively as one group.
  Its arguments bind to their storage when they are one contiguous range of it, also through AFTERs (the storage after
  those writes, which the group order keeps first); any other argument (a strided view, a MULTI's logical value,
  computed data) is copied into a temporary right before the call.
* Multi-device (sharded) CALLs: storage on a tuple of devices holds every device's copy, device-major (Mem.dstride
  apart). A STORE into a MULTI becomes one kernel per device over its shard, into per-device storage one kernel per
  device over the whole value; values are logical, and MULTI is index arithmetic: element i along the shard axis is on
  device i // shard size. When that device is the kernel's own (elementwise, reduces along other axes, a permute of the
  shard axis, ...) a kernel reads only its device's memory and all devices share one compiled kernel; otherwise (a
  reduce over the shard axis, a shrink across shards, a COPY off the devices) it reads the other devices' copies
  directly (CPU:n are all host memory) and Program.peers records it. Multi-device temporaries are split along their
  shard axis (ir.shard_axes), each device computing its part. Kernels of one STORE that read each other's targets all
  compute into temporaries before any copy back. A STORE into a SHRINK window of a MULTI is one kernel per device whose
  shard the window reaches; into any other view of a MULTI it raises UnsupportedOpError.
* The value of a STORE is fused into one kernel over the target's shape. Movement ops (reshape, permute, expand, shrink,
  pad, flip) and SLICE views become index arithmetic (kernel.Idx); nothing is copied for them.
* A REDUCE is computed in place, as an accumulator loop nest, unless a broadcasting EXPAND lies between it and the
  store (then every output element would recompute it): such a REDUCE is split into its own kernel writing a
  contiguous temporary, which the consumer reads through the same index arithmetic. softmax is therefore 3 kernels
  (max, sum of exp, the division), a row sum or a matmul is one. A big REDUCE below another REDUCE (_nested_reduces)
  is realized too, so softmax(a @ b) runs the matmul once, tiled, and the softmax's kernels read it.
* fusion="cost" (the SINK's arg is "cost"): callify chose what to store by its time model, so the two splits above (a
  REDUCE under a broadcast, _nested_reduces) are off and a reduce is computed wherever it is read; FUSE_CAP, the
  self-read temporaries and a SLICE of computed data still split, as correctness and compile time need.
* Bounded fusion: a pass over the value graph estimates the per-element expression size; when a node exceeds FUSE_CAP,
  its largest inputs are realized into temporaries (their own kernels). Compile time is ~quadratic in function size,
  so a 100k-op chain becomes ~100k/FUSE_CAP kernels of bounded size.
* Effects follow lower/reference.py exactly: a read through AFTER sees the state at the time its kernel runs (its deps
  and everything ordered before it), a direct read of storage sees the state before the CALL's writes. Groups keep
  numpy's order where they conflict (write/write, write/after-read); a direct reader is moved before every writer of
  the storage it reads, and when that is impossible (the writer must precede it) the storage is snapshotted at the start.
  Inside one kernel, a store whose value reads its own target at another index (flip of itself, a reduce over itself)
  goes to a temporary and is copied back by a second kernel.
* Adjacent domain axes that every index uses only as one flat index (coef(outer) == size(inner) * coef(inner), also
  inside floor Div/Mod atoms) are collapsed into one axis: a contiguous elementwise kernel over [R, C] is one loop of
  R*C, which vectorizes and splits across threads as one range.
* A kernel whose only live axis is domain[0], storing contiguously (unit stride) into a write-only, disjoint output of
  at least STREAM_MIN_BYTES, is marked `stream`: the renderer writes it with non-temporal stores (no write-allocate).
"""
from __future__ import annotations
import heapq, math, sys
from dataclasses import dataclass
from egraph.ir.dtype import dtypes
from egraph.ir.errors import UnsupportedOpError
from egraph.ir.ops import Node, Ops, GroupOp, toposort, effect_order, shard_axes, multi_arg, shard_params
from lower.schedule.builder import UNSUPPORTED, Group, targets
from egraph.fusion.policy import COST_SINK, IDENTITY, NESTED_REDUCE_WORK
from lower.schedule.finalize import finalize, via_temp
from lower.schedule.inline import inline_functions
from lower.schedule.mem import Ctx, Mem, Program, Step, view_mem

FUSE_CAP = 400           # max estimated expression nodes per kernel

# ---------------------------------------------------------------------------------------------------------------------
# fusion cap

def _unview(n: Node) -> Node:
  """n below its movement and identity ops."""
  while n.op in GroupOp.Movement or n.op in IDENTITY: n = n.src[0]
  return n

_LEAVES = (Ops.PARAM, Ops.BUFFER, Ops.CONST, Ops.STORE, Ops.CALL, Ops.SINK)
# ops a kernel reads as their first source (movement, identity, AFTER, SLICE, MULTI: no node of their own)
_THROUGH = frozenset(GroupOp.Movement) | frozenset(IDENTITY) | {Ops.AFTER, Ops.SLICE, Ops.MULTI}

def _realize_set(order: list, cap: int, known: set = frozenset()) -> set:
  """Nodes of a value graph (`order`: its toposort) realized to keep every kernel's expression under `cap` nodes. A
  node's size is first estimated as a tree (1 + its children's); over `cap`, it is counted as the DAG the kernel
  builds (_dag_size: a shared subexpression is built once): a DAG whose tree is exponential is no reason to split.
  `known`: nodes an earlier group realized (a load here)."""
  size, realize = {}, set()
  for n in order:
    if n.op in _LEAVES or not n.src or n.id in known: size[n.id] = 1; continue
    if n.op in _THROUGH: size[n.id] = size[n.src[0].id]; continue
    kids = list({s.id: s for s in n.src}.values())
    if (s := 1 + sum(size[k.id] for k in kids)) > cap: s = _dag_size(kids, realize, cap, known)
    while s > cap:
      k = max(kids, key=lambda k: size[k.id])
      if size[k.id] <= 1: break
      realize.add((b := _unview(k)).id)
      size[k.id] = size[b.id] = 1
      if (s := 1 + sum(size[k.id] for k in kids)) > cap: s = _dag_size(kids, realize, cap, known)
    size[n.id] = s   # exact where counted: the estimates above it start from the DAG's size
  return realize

def _dag_size(kids: list, realize: set, cap: int, known: set = frozenset()) -> int:
  """1 + the distinct nodes the kernel builds under `kids` (a leaf, a realized node or one an earlier group realized
  (`known`) is one load), counted up to cap + 1 (one walk; a set per node instead made a long chain quadratic)."""
  seen, stack, s, through = set(), list(kids), 1, _THROUGH
  while stack and s <= cap:
    if (n := stack.pop()).id in seen: continue
    seen.add(n.id)
    if n.op in through: stack.append(n.src[0]); continue
    s += 1
    if n.op not in _LEAVES and n.src and n.id not in realize and n.id not in known: stack += n.src
  return s

def _nested_reduces(order: list) -> set:
  """What a reduce's body would recompute, realized so that it runs once on its own (parallel, maybe tiled) domain:
  a big REDUCE (NESTED_REDUCE_WORK inputs or more) below another REDUCE, and a computed value broadcast (EXPAND to
  NESTED_REDUCE_WORK elements or more) inside a reduce's body. Fused, softmax(a @ b) computed the matmul inside the
  max, the sum and the division (3 times, untiled, ~100x slower each), (a @ b).sum() ran the matmul on the sum's
  1-element domain, and layernorm(x) @ w recomputed the layernorm for every output column (and was not tiled). A big
  REDUCE under elementwise ops is realized as well: (a @ b + 1).relu() fused was an untiled matmul (2.2 s at 1024^3).
  `order`: the value graph's toposort."""
  under: set = set()
  for n in reversed(order):                 # consumers first
    if n.op in (Ops.STORE, Ops.CALL): continue
    if n.op is Ops.REDUCE or n.id in under: under.update(s.id for s in n.src)
  big = lambda r: r.op is Ops.REDUCE and math.prod(r.src[0].shape) >= NESTED_REDUCE_WORK
  out = set()
  for n in order:
    if n.op in GroupOp.ALU:   # a big reduce under elementwise ops ((a @ b + 1).relu()): realized, it stays tileable
      out.update(c.id for c in map(_unview, n.src) if big(c))
    if n.id not in under or n.shape is None: continue
    if big(n): out.add(n.id)
    elif n.op is Ops.EXPAND and math.prod(n.shape) >= NESTED_REDUCE_WORK:
      c = _unview(n.src[0])
      if (c.op in GroupOp.ALU or c.op is Ops.REDUCE) and math.prod(c.shape) > 1: out.add(c.id)
  return out
def _realize_order(order: list, realize: set) -> list:
  """(node, reached-through-AFTER) for every realized node of the value graph whose toposort is `order`, children first."""
  if not realize: return []
  flags: dict = {order[-1].id: {False}}
  for n in reversed(order):
    fs = flags.get(n.id, set())
    for i, s in enumerate(n.src):
      if n.op in (Ops.STORE, Ops.CALL): continue
      flags.setdefault(s.id, set()).update({True} if n.op is Ops.AFTER and i == 0 else fs if n.op is not Ops.AFTER else set())
  return [(n, f) for n in order if n.id in realize for f in sorted(flags.get(n.id, ()))]
# ---------------------------------------------------------------------------------------------------------------------
# the groups and their order

@dataclass
class _GroupPlan:
  specs: list | None            # kernels of a STORE group (None for a nested call)
  steps: list | None            # finalized steps of a nested call
  writes: list                  # Mems
  ra: list                      # Mems read through AFTER (state at run time)
  rd: list                      # Mems read directly (state before the CALL's writes)

def _effects(body: Node) -> list[Node]:
  return [n for n in effect_order([body]) if n.op in (Ops.STORE, Ops.CALL)]

def _call_group(call: Node, bind: dict, ctx: Ctx) -> _GroupPlan:
  """A nested CALL as one group: its program with PARAM(i) bound to argument i's storage. An argument that is a
  contiguous view of storage (through AFTERs: the storage after their writes) binds to it, a MULTI over storage binds
  its shards (ir.shard_params); any other (a strided view, computed data) is first copied into a temporary, read at
  the time the call runs."""
  g, inner, copied, sharded = Group(ctx, bind), {}, {}, {}
  for i, a in enumerate(call.src[1:]):
    if i in getattr(call.arg, "temps", ()): inner[i] = ctx.temp(a.dtype, a.numel); continue   # its scratch: one of ours
    if (s := multi_arg(a)) is not None and (m := view_mem(s.src[0], bind)) is not None:
      inner[i], sharded[i] = m, s   # its shards bind directly; the body reads and writes them through a MULTI
      continue
    if (m := view_mem(a, bind)) is None:
      order = toposort([a], enter_calls=False)
      g.realize |= _realize_set(order, FUSE_CAP)
      for n, _ in _realize_order(order, g.realize): g.temp_of(n, True)
      m = g.temp_of(a, True, whole=True).mem
      copied[i] = a
    inner[i] = m
  prog = kernelize(shard_params(call.src[0], sharded), inner, ctx)
  for i, a in copied.items():
    if inner[i].root in prog.written:
      raise UnsupportedOpError(f"lowering: a nested CALL writes its argument {i}, which is {a.op.name} {a.shape}, "
                               "not a contiguous view of storage")
  steps = [st for s in g.specs for st in finalize(s, {}, ctx)] + prog.steps
  reads = [m for s in steps for m in (s.mems[:1] if s.kernel is None else s.mems)]
  writes = [m for s in steps if s.kernel is not None for m in s.mems[s.kernel.store.param:s.kernel.store.param + 1]]
  return _GroupPlan(None, steps, writes, reads, [])

_WRITES = frozenset({Ops.STORE})

def _store_group(eff: Node, bind: dict, ctx: Ctx, cost: bool = False) -> _GroupPlan:
  """cost: the CALL's stores are the partition callify chose (fusion="cost"): only the splits correctness or the
  compiler needs (FUSE_CAP, self-read temporaries, a SLICE of computed data) are added, no fusion heuristic."""
  tgt, val = eff.src
  outs = targets(tgt, bind)
  g = Group(ctx, bind)
  # one walk of the value serves the three passes below; it stops at a STORE (an earlier group's write, read here
  # through its AFTER as that buffer): walking into every earlier value made lowering quadratic in the stores
  order = toposort([val], enter_calls=False, leaves=_WRITES, stop=ctx.realized_ids)   # nor below what earlier groups realized
  g.realize = _realize_set(order, FUSE_CAP, ctx.realized_ids) | (set() if cost else _nested_reduces(order))
  g.split_broadcast_reduces = not cost
  for n, after in _realize_order(order, g.realize): g.temp_of(n, after)   # children first: bounded recursion
  for m, index, shape, kdev, lidx in outs: g.kernel(shape, m, index, val, False, kdev=kdev, lidx=lidx, final=True)
  specs = g.specs + _apart(g.finals, ctx)
  keys = [x.arg[0] for s in specs for x in s.value.walk() if x.op == 'load']
  # a temporary of another group (ctx.realized) is read after it is written: it orders the two groups as a write does
  own = {s.mem.root for s in g.specs}
  return _GroupPlan(specs, None, [o[0] for o in outs if math.prod(o[2])] + [s.mem for s in g.specs if s.mem.root[0] == "tmp"],
                    [k[0] for k in keys if not k[1] and k[0].root[0] != "tmp" or k[0].root[0] == "tmp" and k[0].root not in own],
                    [k[0] for k in keys if k[1] and k[0].root[0] != "tmp"])

def _apart(specs: list, ctx: Ctx) -> list:
  """The per-device kernels of one STORE run one after another: when one reads what another writes, each computes
  into a temporary first and the copies back come after all of them."""
  hit = any(k[0].overlaps(o.mem) for i, s in enumerate(specs) for k in (x.arg[0] for x in s.value.walk() if x.op == 'load')
            for j, o in enumerate(specs) if i != j)
  if not hit: return specs
  pairs = [via_temp(s, ctx) for s in specs]
  return [p[0] for p in pairs] + [p[1] for p in pairs]

def kernelize(body: Node, bind: dict, ctx: Ctx | None = None) -> Program:
  """Kernels for the SINK `body` with PARAM(slot) bound to bind[slot] (a Mem)."""
  ctx = ctx or Ctx()
  if sys.getrecursionlimit() < 20000: sys.setrecursionlimit(20000)   # value building recurses up to ~FUSE_CAP deep
  body = inline_functions(body)   # plain FUNCTIONs are inlined; precompiled ones are nested CALLs
  multi = False
  for n in toposort([body], enter_calls=False):
    if n.op in UNSUPPORTED: raise UnsupportedOpError(f"lowering: {n.op.name} is not supported yet (a later issue adds it)")
    multi = multi or isinstance(n.device, tuple)
  if multi: ctx.axes.update(shard_axes([body]))   # how multi-device temporaries are split
  cost = body.op is Ops.SINK and body.arg == COST_SINK   # a cost-mode CALL (egraph/fusion/solve.py marks its SINK)
  groups = [_call_group(eff, bind, ctx) if eff.op is Ops.CALL else _store_group(eff, bind, ctx, cost) for eff in _effects(body)]
  order, snaps = _order(groups)
  steps, snap_mem = [], {}
  for gi, ms in snaps.items():
    for m in ms:
      if m not in snap_mem:
        t = ctx.temp(dtypes.uint8, m.nbytes)
        snap_mem[m] = Mem(t.root, 0, m.dtype, m.count)
        steps.append(Step(None, (m, snap_mem[m])))
  for gi in order:
    gp = groups[gi]
    if gp.steps is not None: steps.extend(gp.steps); continue
    redirect = {m: snap_mem[m] for m in snaps.get(gi, ())}
    for s in gp.specs: steps.extend(finalize(s, redirect, ctx))
  temps = {}
  for s in steps:
    for m in s.mems:
      if m.root[0] == "tmp": temps[m.root] = max(temps.get(m.root, 0), m.off + m.nbytes)
  written = {s.mems[s.kernel.store.param].root for s in steps if s.kernel is not None}
  return Program(steps, temps, written, set(ctx.peers))

def _order(groups: list) -> tuple[list, dict]:
  """A topological order of the groups and, per group, the Mems its direct reads must take from a snapshot."""
  n = len(groups)
  succ = [set() for _ in range(n)]
  def ov(xs, ys): return any(x.overlaps(y) for x in xs for y in ys)
  # Mems overlap only on one root: only groups that touch a root some group writes are compared, over that root's Mems
  # (comparing every pair of groups took minutes on a 99-block transformer's ~2000 stores)
  W: dict = {}; A: dict = {}   # root -> {group: its Mems there} written / read through AFTER
  for g, gp in enumerate(groups):
    for m in gp.writes: W.setdefault(m.root, {}).setdefault(g, []).append(m)
    for m in gp.ra: A.setdefault(m.root, {}).setdefault(g, []).append(m)
  for r, ws in W.items():   # a pair conflicts through a write of one of them: each writer against every other group
    ras = A.get(r, {})
    for i, wi in ws.items():
      for j in ws.keys() | ras.keys():
        a, b = (i, j) if i < j else (j, i)
        if i != j and b not in succ[a] and (ov(wi, ws.get(j, ())) or ov(wi, ras.get(j, ()))): succ[a].add(b)
  snaps: dict = {}
  for k in range(n):
    for m in groups[k].rd:
      writers = sorted(w for w, ms in W.get(m.root, {}).items() if w != k and ov(ms, [m]))
      if any(reaches(succ, w, k) for w in writers): snaps.setdefault(k, []).append(m); continue
      for w in writers: succ[k].add(w)
  return ordered(succ), snaps

def reaches(succ: list, s: int, t: int) -> bool:
  """Is group t reachable from group s along the edges `succ`?"""
  seen, stack = {s}, [s]
  while stack:
    x = stack.pop()
    if x == t: return True
    for y in succ[x]:
      if y not in seen: seen.add(y); stack.append(y)
  return False

def ordered(succ: list) -> list:
  """The topological order of groups 0..n-1 under the edges `succ` (i -> j: i runs first), least index first."""
  n = len(succ)
  indeg = [0] * n
  for i in range(n):
    for j in succ[i]: indeg[j] += 1
  ready = [i for i in range(n) if indeg[i] == 0]
  heapq.heapify(ready)
  out = []
  while ready:
    i = heapq.heappop(ready); out.append(i)
    for j in succ[i]:
      indeg[j] -= 1
      if indeg[j] == 0: heapq.heappush(ready, j)
  assert len(out) == n, "cycle in the kernel order"
  return out
