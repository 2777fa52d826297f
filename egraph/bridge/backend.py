"""The bridge's callsat backend (issue 29): tinygrad builds the program with its whole API, callsat decides the CALL
(saturation, extraction) and runs it with its own LLVM kernels over tinygrad's own buffers.

With CALLSAT_BRIDGE_BACKEND=callsat (or `install(backend="callsat")`) a graph on tinygrad's CPU device whose arithmetic
callsat can say exactly is handed back to tinygrad as CALL(LINEAR(CALL(CUSTOM_FUNCTION(Program), PARAM...)), buffers):
tinygrad's scheduler resolves the LINEAR like any precompiled one, its memory planner and TinyJit capture it as one
item, and `pm_exec` (which the install extends by one pattern) runs it by calling `Program.run` on the Buffers the
PARAMs resolve to. The Program is the rules CALL callify chose, its OPAQUE tinygrad arithmetic rebuilt as callsat ops
(the shadow's conversion, egraph/bridge/shadow.py, here required to be complete), compiled once by lower/device/native.py.
Graphs over bound variables run at the variables' maxima with their values read at run time (`static`: one compile for
every value); outside that form they are made concrete per value tuple (Symbolic: strict mode, or
CALLSAT_BRIDGE_SYMBOLIC=specialize).
Multi-device tensors over CPU devices run too: tinygrad's per-device select of a copied value (`shard`) is callsat's
MULTI of it (the shadow's `unshard`), and a Program copies each device's buffer in and out of callsat's device-major
storage around a run.
Anything the conversion cannot say (other devices, an op without an exact form, fp8) is a BridgeRefusal named
`backend:...`: fallback mode gives that graph tinygrad's kernels and counts why, strict raises."""
from __future__ import annotations
import dataclasses, itertools, threading, weakref
import numpy as np
from tinygrad.uop.ops import UOp, Ops as TOps, UPat, PatternMatcher
from tinygrad.dtype import dtypes as tdt
from tinygrad.device import Device, MultiBuffer
from tinygrad.helpers import GlobalCounters
import tinygrad.engine.realize as _tg_realize
from tinygrad.schedule.rangeify import resolve_function
from egraph.ir.ops import Node, Ops, GroupOp, toposort, new_buffer, dims_arg
from egraph.ir.symbolic import HostDim, dims_in
from egraph.ir.dtype import dtypes
from egraph.ir.storage import Storage
from egraph.ir.errors import CallsatError
from lower.device.native import prepare, written_args
from lower.schedule.work import program_work
from lower.runtime import run_call
from egraph.bridge.convert import BridgeRefusal, Conversion, param_like
from egraph.bridge.shadow import Shadow
from egraph.ir.env import env_value
from egraph.bridge.symbolic import (SYMBOLIC_ENV, NotStatic, Static, Symbolic, dims_of, fold_shrinks, static, values_for,
                                    variable_expr)

ENV = "CALLSAT_BRIDGE_BACKEND"
BACKENDS = ("tinygrad", "callsat")
DEVICE = "CPU"   # tinygrad's CPU device: host memory, so callsat's kernels read and write its buffers in place
# ... and read the host devices a Tensor is made from (numpy arrays: NPY; Python lists: PYTHON): a user's data, plain host
# memory, no queue of its own
UPLOADS = ("NPY", "PYTHON")
# callsat's own PYTHON device means "run on the numpy reference executor": a tinygrad PYTHON buffer (a list's bytes) is
# read by the native kernels as callsat's NPY data, so a graph that uploads a list (tinygrad's RNG seed) stays compiled
HOST_AS = {"PYTHON": "NPY"}

def on_host(d) -> bool:
  """A device whose memory callsat's kernels use in place: tinygrad's CPU (CPU:n too: host memory each), NPY, PYTHON;
  or a tuple of CPU devices (tinygrad's multi-device tensors: one host buffer per device)."""
  if isinstance(d, tuple): return bool(d) and all(isinstance(x, str) and x.partition(":")[0] == DEVICE for x in d)
  return isinstance(d, str) and (d in UPLOADS or d.partition(":")[0] == DEVICE)

def _devices(d) -> tuple: return d if isinstance(d, tuple) else (d,)

def bridge_backend(value: str | None = None) -> str:
  """`value`, else env CALLSAT_BRIDGE_BACKEND (read when the bridge runs), else "tinygrad"."""
  b = value if value is not None else (env_value(ENV) or "tinygrad")
  if b not in BACKENDS: raise CallsatError(f"{ENV} must be one of {BACKENDS}, got {b!r}")
  return b

_SERIAL = itertools.count()
EMPTY = "empty"   # the decision for a CALL over no buffer: tinygrad's CALL as it is (it schedules no kernel either)

class Program:
  """One callsat CALL ready to run over tinygrad Buffers: its body over placeholder BUFFERs, one per distinct base
  buffer of the tinygrad CALL's args (views stay SLICEs of them). The arg of the CUSTOM_FUNCTION the bridge hands
  tinygrad: compared by identity, printed by serial (tinygrad's UOp key reads str(arg))."""
  __slots__ = ("call", "bases", "name", "kernels", "zero", "snaps", "lock", "storage", "views", "devices", "multi", "back", "sym",
               "vars", "variables", "__weakref__")
  def __init__(self, call: Node, bases: list[Node], kernels: int, zero: tuple[int, ...], snaps: tuple = (), sym: Symbolic | None = None,
               fixed: Static | None = None, written: frozenset | None = None):
    self.call, self.bases, self.kernels, self.name = call, bases, kernels, f"callsat{next(_SERIAL)}"
    self.zero = zero   # base positions of fresh outputs written in part: zero-filled before each run, as callsat's own are
    # tinygrad's CPU devices the arguments live on (each synchronized before a run; NPY/PYTHON are plain host memory)
    self.devices = tuple(sorted({d for b in bases for d in _devices(b.arg.device) if d not in UPLOADS}))
    # bases on a tuple of devices: tinygrad keeps one buffer per device, callsat's storage is device-major (one array),
    # so the Program holds that array and copies the device buffers in before a run and out after it
    self.multi = tuple(i for i, b in enumerate(bases) if isinstance(b.arg.device, tuple))
    # ... and back after it, those the CALL writes (None: every one): a sharded weight it only reads is copied in only
    self.back = tuple(i for i in self.multi if written is None or bases[i].arg.uid in written)
    self.snaps = snaps   # (base position, placeholder): old values of assigned buffers, copied before each run (position
                         # None: a copy the body makes itself)
    self.lock, self.storage, self.views = threading.Lock(), Storage(), {}
    self.sym = sym   # over bound variables: `call` is this value tuple's; sym makes the others
    for sb in [sb for _, sb in snaps] + [bases[i] for i in self.multi]: self.storage.allocate(sb, zero=False)   # the Program's own memory
    # over bound variables at their maxima: the masks' 0..n-1, and the buffers each run writes the variables' values into
    self.vars = fixed.vars if fixed is not None else []
    for b, n in (fixed.iotas if fixed is not None else ()): self.storage.set_data(b, np.arange(n, dtype=np.int32))
    for b, _ in self.vars: self.storage.allocate(b)
    self.variables = (sym or fixed).names if (sym or fixed) is not None else ()   # named to tinygrad
  def __repr__(self): return self.name
  __str__ = __repr__

  def run(self, bufs: list, var_vals: dict | None = None) -> Node:
    """Run on tinygrad Buffers (allocated, in base order; a list of per-device Buffers for a base on a tuple of devices):
    their memory bound to the placeholders without a copy (copied for per-device bases); `var_vals` (tinygrad's
    {name: value}) binds the variables of a Program over them. Returns the CALL that ran."""
    if len(bufs) != len(self.bases): raise CallsatError(f"{self.name}: {len(bufs)} buffers for {len(self.bases)} arguments")
    with self.lock:   # the storage binds this run's arrays: one run at a time per program
      call, zero = (self.call, self.zero) if self.sym is None else self.sym.get(var_vals or {})
      if self.vars:
        vals = values_for(self.variables, var_vals, self.name)
        for b, u in self.vars: self.storage[b][0] = u.sym_infer(vals)
      for i, (ph, b) in enumerate(zip(self.bases, bufs)):
        if i not in self.multi: self.storage.borrow(ph, self.view(b, ph))
        else:
          for a, d in zip(self._shards(i), b): np.copyto(a, self.view(d, ph))
      for i, sb in self.snaps:
        if i is not None: np.copyto(self.storage[sb], self.storage[self.bases[i]])
      for i in zero: self.storage[self.bases[i]].fill(0)   # tinygrad's buffers come from its pool, not zeroed
      run_call(call, self.storage)
      for i in self.back:
        for a, d in zip(self._shards(i), bufs[i]): np.copyto(self.view(d, self.bases[i]), a)
    return call

  def _shards(self, i: int) -> list[np.ndarray]:
    """Per-device base i's storage, one array per device (in the tuple's order)."""
    ph = self.bases[i]
    return list(self.storage[ph].reshape(len(ph.arg.device), ph.arg.size))

  def view(self, b, ph: Node) -> np.ndarray:
    """Buffer b's memory as the 1-D array placeholder ph reads, the same array object for the same memory (so the
    native runner's prepared plan, which checks its arrays by identity, is taken again)."""
    if not b.nbytes: return np.empty(0, ph.dtype.np)   # tinygrad allocates no memory for an empty buffer
    if ph.arg.device in UPLOADS: return np.frombuffer(b.allocator._as_buffer(b._buf), ph.dtype.np, count=ph.arg.size)   # a user's array: never kept
    # the memory's address: an HCQ buffer's (tinygrad's CPU device) without making the memoryview a hit does not need
    if (addr := getattr(b._buf, "va_addr", None)) is None:
      addr = np.frombuffer(b.allocator._as_buffer(b._buf), np.uint8, count=0).__array_interface__["data"][0]
    if (a := self.views.get(key := (b.nbytes, int(addr), ph.dtype))) is None:
      a = np.frombuffer(b.allocator._as_buffer(b._buf), ph.dtype.np, count=ph.arg.size)
      # bounded, oldest out: a run's own arrays must all stay (a miss makes new arrays, and the native runner's plan then
      # takes its full path: a 104-base ResNet18 Program under a bound of 64 rebuilt its 57 launches on every replay)
      if len(self.views) >= 2 * len(self.bases) + 64: self.views.pop(next(iter(self.views)))
      self.views[key] = a
    return a

def exact(cv: Conversion, call: Node, symbolic: bool = False) -> tuple[Node, dict]:
  """callify's rules CALL's body with every OPAQUE tinygrad op rebuilt as callsat arithmetic (the shadow's conversion),
  and its bound variables' values ({OPAQUE ident: tinygrad expression}); what it cannot rebuild is refused by name.
  Dimensions and values over tinygrad's bound variables are refused unless `symbolic` (Symbolic makes them concrete)."""
  for n in toposort(call.src[1:]):
    if n.op is Ops.BUFFER and not on_host(n.arg.device):
      raise BridgeRefusal(f"backend:device:{n.arg.device}", "callsat's kernels run tinygrad's CPU device (and read NPY and PYTHON data)")
    if n.op not in (Ops.BUFFER, Ops.SLICE):
      raise BridgeRefusal(f"backend:arg:{n.op.name}", "a CALL argument callsat's runner cannot bind")
  sh = Shadow(cv, DEVICE, bodies=True)   # a precompiled function's body (a nested CALL) runs callsat's kernels too
  body = sh.build([call.src[0]])[0]
  syms, nested = {}, {m.id for c in toposort([body], enter_calls=False) if c.op is Ops.CALL for m in toposort([c.src[0]])}
  for n in toposort([body]):
    if (n.shape is not None and dims_in(n.shape)) or (n.op in GroupOp.Movement and dims_in(n.arg)):
      # a host dimension (a bound Variable's expression) is worth its maximum in callsat's IR: tinygrad binds it
      if not symbolic: raise BridgeRefusal("backend:form:symbolic", f"{n.op.name} {n.shape}: a dimension tinygrad binds at run time")
      if n.id in nested: raise BridgeRefusal("backend:form:symbolic-function", f"{n.op.name} {n.shape}: a bound variable in a function's body")
      if not all(isinstance(d, HostDim) and variable_expr(cv.dim_uops.get(d.key)) for d in dims_in((n.shape, dims_arg(n)))):
        raise BridgeRefusal("backend:form:symbolic", f"{n.op.name} {n.shape}: a dimension not over bound variables alone (a device's range)")
    if n.dtype in dtypes.fp8s:   # tinygrad's CPU computes fp8 through half (subnormals flushed, inf saturated)
      raise BridgeRefusal("backend:dtype:fp8", f"{n.op.name} {n.dtype.name}: tinygrad's CPU fp8 is emulated through half; callsat's is exact")
    if n.op is Ops.OPAQUE:
      u = cv.opaque[n.arg.ident][0]
      if symbolic and u is not None and n.id not in nested and variable_expr(u):
        syms[n.arg.ident] = u   # a bound variable's value (a mean's count, a mask's start): a constant per value tuple
        continue
      what = "RETYPE" if u is None else u.op.name
      raise BridgeRefusal(f"backend:op:{what}", f"{what} {n.arg.shape} {n.dtype.name}: no exact callsat form")
    if n.op in (Ops.FUNCTION, Ops.BIND) or n.op is Ops.COPY and not (on_host(n.arg) and n.arg not in UPLOADS):
      raise BridgeRefusal(f"backend:op:{n.op.name}", "callsat's backend runs single-device graphs without plain functions or binds")
    if n.op is Ops.PARAM and not on_host(n.arg.device):
      raise BridgeRefusal(f"backend:device:{n.arg.device}", "callsat's kernels run tinygrad's CPU device")
  return body, syms

def _host_params(body: Node) -> Node:
  """`body` with every PARAM on a HOST_AS device (nested bodies too) on the device callsat's kernels read it as."""
  new: dict[int, Node] = {}
  for n in toposort([body]):
    srcs = tuple(new[s.id] for s in n.src)
    d = n.arg.device if n.op is Ops.PARAM else None
    arg = dataclasses.replace(n.arg, device=HOST_AS[d]) if d in HOST_AS else n.arg
    new[n.id] = n if srcs == n.src and arg is n.arg else Node(n.op, n.dtype, srcs, arg)
  return new[body.id]

def program(cv: Conversion, call: Node, symbolic: str = "tinygrad", vals: dict | None = None) -> tuple[Program | None, list[int]]:
  """The Program for callsat's rules CALL and, per base placeholder, the index of the CALL argument it stands for;
  (None, []) for a CALL over no buffer (a realize of what is realized already, a graph that only binds Variables):
  no kernel of either backend has anything to do. Compiled here (lower/device/native.py's prepare), so a kernel
  callsat cannot build is a refusal now, not an error inside tinygrad's run. `symbolic` (symbolic_mode): what a graph
  over bound variables gets, compiled now for the values `vals` ({name: value}, tinygrad's CALL's: bound_values)."""
  if len(call.src) == 1 and not any(n.op is Ops.STORE for n in toposort([call.src[0]])): return None, []
  body, syms = exact(cv, call, symbolic != "tinygrad")
  if any(HOST_AS.get(p.arg.device) for p in toposort([body]) if p.op is Ops.PARAM): body = _host_params(body)
  bases, order, ph, fresh = [], [], {}, set()
  args = []
  for i, a in enumerate(call.src[1:]):
    b = a if a.op is Ops.BUFFER else a.src[0]
    if b.arg.uid not in ph:
      ph[b.arg.uid] = new_buffer(b.arg.size, b.dtype, HOST_AS.get(b.arg.device, b.arg.device))
      if b.arg.uid not in cv.buffers: fresh.add(ph[b.arg.uid].arg.uid)   # minted by callify: tinygrad allocates it anew
      bases.append(ph[b.arg.uid]); order.append(i)
    p = ph[b.arg.uid]
    args.append(p if a.op is Ops.BUFFER else Node(Ops.SLICE, a.dtype, (p,), a.arg))
  if not bases: raise BridgeRefusal("backend:form:no-storage", "a CALL that stores but holds no buffer")
  fixed, dims, c = None, {}, Node(Ops.CALL, dtypes.void, (body, *args), call.arg)
  if syms or dims_of(cv, c):
    c = fold_shrinks(c)
    body, args = c.src[0], list(c.src[1:])
    try: body, args, fixed = static(cv, body, args, syms, DEVICE); syms = {}   # one structure for every value
    except NotStatic as e:
      if symbolic != "specialize":
        raise BridgeRefusal("backend:form:symbolic", f"{e}: compiled per value only with {SYMBOLIC_ENV}=specialize") from None
      dims = dims_of(cv, c)   # made concrete per value (the snapshots below keep their shapes)
  body, args, snaps = _snapshots(body, args)
  c = Node(Ops.CALL, dtypes.void, (body, *args), call.arg)
  def zero_of(partial) -> tuple[int, ...]: return tuple(i for i, p in enumerate(bases) if p.arg.uid in partial and p.arg.uid in fresh)
  sym = Symbolic(c, dims, syms, zero_of) if syms or dims else None
  if (over := sym or fixed) is not None and (missing := set(over.names) - set(vals := vals or {})):
    raise BridgeRefusal("backend:form:unbound", f"variables {sorted(missing)} have no value in the graph")
  try:
    if sym is not None: c = sym.get(vals)[0]   # this graph's values: compiled now
    kernels, partial = prepare(c)
    written = written_args(c)
  except CallsatError as e: raise BridgeRefusal(f"backend:lower:{type(e).__name__}", str(e)) from None
  at = {b.arg.uid: i for i, b in enumerate(bases)}
  return Program(c, bases, kernels, zero_of(partial), tuple((None if b is None else at[b.arg.uid], s) for b, s in snaps), sym, fixed,
                 written), order

def _root(n: Node) -> Node:
  while n.op in GroupOp.Movement or n.op in (Ops.SLICE, Ops.BITCAST): n = n.src[0]
  return n

def _under(n: Node) -> tuple[Node, list[Node]]:
  """The storage under a state (through earlier states' AFTERs and view ops) and the view ops on the way, outermost
  first."""
  views = []
  while n.op in GroupOp.Movement or n.op in (Ops.SLICE, Ops.BITCAST, Ops.AFTER):
    if n.op is not Ops.AFTER: views.append(n)
    n = n.src[0]
  return n, views

def _reads(v: Node) -> set[int]:
  """The ids of the buffer states (PARAMs, AFTERs) value graph v reads: an AFTER is read as a whole (its stores are
  their own value graphs)."""
  out, stack, seen = set(), [v], set()
  while stack:
    if (n := stack.pop()).id in seen: continue
    seen.add(n.id)
    if n.op in (Ops.PARAM, Ops.AFTER): out.add(n.id)
    else: stack.extend(n.src[1:] if n.op is Ops.CALL else n.src)   # a nested body reads its own PARAMs
  return out

def _snapshots(body: Node, args: list[Node]) -> tuple[Node, list[Node], list[tuple[Node | None, Node]]]:
  """tinygrad's CALL reads an assigned buffer's old value where its graph reads the buffer itself (the new one through
  AFTER), and its scheduler orders every such read before the store. callsat's kernelize orders a CALL's stores by their
  values' own dependencies (effect_order; its front end stores assigns into fresh buffers), so an SGD step could update
  x before the kernel computing W's gradient read x. Two mends, both in callsat's IR:
  - every value read of a buffer the body stores into, as it was before the CALL (its PARAM), reads a snapshot taken
    before the run (a copy per run of each such buffer: weights in an optimizer step); targets keep the buffer;
  - a state one store leaves (AFTER) that another store overwrites in place, while a third reads it (parameters uploaded
    and updated in one graph, each update reading the other's upload): the body copies the state into a buffer of the
    Program's own (a STORE after the state's own) and every value read of the state reads the copy; the overwriting
    store's target waits on the copy (an AFTER over it), so effect_order runs it first.
  Returns the body, the args with the new args appended, and (base, placeholder) pairs: base None for a copy the body
  makes itself, else the buffer copied before each run."""
  def base(slot: int) -> Node: return _root(args[slot])
  # a nested CALL's body is its own scope (its PARAMs are its arguments): left as it is
  written, stores, reads, olds, waits = set(), [n for n in toposort([body], enter_calls=False) if n.op is Ops.STORE], {}, {}, {}
  def read_by(m: Node) -> set[int]:   # each store's value graph walked once, when an AFTER target asks
    if (got := reads.get(m.id)) is None: got = reads[m.id] = _reads(m.src[1])
    return got
  for n in stores:
    if (r := _root(n.src[0])).op is Ops.PARAM: written.add(base(r.arg.slot).arg.uid)
    elif r.op is Ops.AFTER and any(r.id in read_by(m) for m in stores if m is not n):
      p, views = _under(r.src[0])
      if p.op is not Ops.PARAM or p.arg.slot < 0 or any(x.op is Ops.BITCAST for x in views):
        raise BridgeRefusal("backend:form:read-before-overwrite", f"{r.op.name} {r.shape}: read by one store, overwritten by another")
      olds[r.id] = r; waits.setdefault(n.id, []).append(r)
  if not written and not olds: return body, args, []
  snaps, slots, extra, copies = {}, {}, [], []
  def new_param(p: Node, sb: Node) -> Node:   # a PARAM over placeholder sb, viewed as p's argument is
    a = args[p.arg.slot]
    extra.append(sb if a.op is Ops.BUFFER else Node(Ops.SLICE, a.dtype, (sb,), a.arg))
    return Node(Ops.PARAM, p.dtype, (), dataclasses.replace(p.arg, slot=len(args) + len(extra) - 1))
  def snap_param(p: Node) -> Node:
    if (q := slots.get(p.arg.slot)) is not None: return q
    b = base(p.arg.slot)
    if (sb := snaps.get(b.arg.uid)) is None: sb = snaps[b.arg.uid] = new_buffer(b.arg.size, b.dtype, b.arg.device)
    q = slots[p.arg.slot] = new_param(p, sb)
    return q
  def kids(n: Node, target: bool) -> list:   # (source, read as a target?) in rebuild order
    if n.op is Ops.PARAM: return []
    if n.id in olds and not target: return [(n, True)]   # a read of the copy: the state itself, once, to copy from
    if n.op in (Ops.STORE, Ops.AFTER): k = [(n.src[0], True)] + [(x, False) for x in n.src[1:]]
    elif n.op is Ops.CALL: return [(x, False) for x in n.src[1:]]
    else: k = [(x, target) for x in n.src]
    return k + [(o, False) for o in waits.get(n.id, ())]   # an overwriting store: the copies it waits on, last
  memo, opened = {}, set()
  stack = [(body, False, False)]   # iterative: a backward graph is deeper than Python's recursion limit
  while stack:
    n, target, ready = stack.pop()
    if (n.id, target) in memo: continue
    if not ready:
      if (n.id, target) in opened: continue   # its sources are on the stack already
      opened.add((n.id, target))
      stack.append((n, target, True))
      stack.extend((x, t, False) for x, t in kids(n, target) if (x.id, t) not in memo)
      continue
    got = [memo[(x.id, t)] for x, t in kids(n, target)]
    if n.op is Ops.PARAM: r = snap_param(n) if not target and n.arg.slot >= 0 and base(n.arg.slot).arg.uid in written else n
    elif n.id in olds and not target:   # the state copied (after its own store) into the Program's memory, read there
      p, views = _under(n.src[0])
      copies.append(cb := new_buffer(base(p.arg.slot).arg.size, p.dtype, base(p.arg.slot).arg.device))
      q = new_param(p, cb)
      for v in reversed(views): q = v.over((q, *v.src[1:]))   # the state's view of its buffer, over the copy
      r = Node(Ops.AFTER, q.dtype, (q, Node(Ops.STORE, dtypes.void, (q, got[0]))))
    else:
      if (w := len(waits.get(n.id, ()))):   # an overwriting store: its target waits on the copies
        got = [Node(Ops.AFTER, got[0].dtype, (got[0], *(c.src[1] for c in got[len(got) - w:]))), *got[1:len(got) - w]]
      r = n.over((n.src[0], *got) if n.op is Ops.CALL else tuple(got))
    memo[(n.id, target)] = r
  by_uid = {b.arg.uid: b for b in map(base, range(len(args)))}
  return memo[(body.id, False)], args + extra, [(by_uid[u], s) for u, s in snaps.items()] + [(None, c) for c in copies]

def inline_functions(sink: UOp) -> tuple[UOp, dict[UOp, UOp] | None]:
  """`sink` with tinygrad's plain FUNCTIONs (`@function`, their gradients) inlined as tinygrad's own scheduler inlines
  them (rangeify's resolve_function, then GETTUPLE of the body's TUPLE), so their arithmetic reaches callsat's kernels;
  and the map from every UOp of the original graph to its counterpart (None when nothing was inlined). Precompiled
  functions stay (callsat's CALL nests them)."""
  cur, back = sink, None
  while True:   # a body may call functions too: innermost reached on a later round
    topo = cur.toposort()
    if not any(u.op is TOps.FUNCTION and not u.arg.precompile for u in topo): return cur, back
    new: dict[UOp, UOp] = {}
    for u in topo:
      if u.op is TOps.GETTUPLE and u.src[0].op is TOps.FUNCTION and (body := resolve_function(u.src[0])) is not None:
        new[u] = body.src[u.arg]
      elif any(new[x] is not x for x in u.src): new[u] = u.replace(src=tuple(new[x] for x in u.src))
      else: new[u] = u
    back = new if back is None else {o: new.get(n, n) for o, n in back.items()}
    cur = new[cur]

def tinygrad_call(prog: Program, order: list[int], tg_call: UOp) -> UOp:
  """The bridge's tinygrad CALL with its body replaced by one item that runs `prog` over the bases of its args."""
  args = tg_call.src[1:]
  bases = [_base(args[i]) for i in order]
  # a Program over variables names them (tinygrad's schedule passes the values of the variables its items name) and its
  # CALL keeps their bound args (where tinygrad reads the values from)
  binds = [a for a in args if a.is_bound_var and a.unbind()[0].expr in prog.variables]
  fn = UOp(TOps.CUSTOM_FUNCTION, tdt.void, tuple(a.unbind()[0] for a in binds), prog)
  inner = UOp(TOps.CALL, tdt.void, (fn, *[param_like(b, i) for i, b in enumerate(bases)]))
  return UOp(TOps.CALL, tdt.void, (UOp(TOps.LINEAR, tdt.void, (inner,)), *bases, *binds), tg_call.arg)

def _base(u: UOp) -> UOp:
  """The BUFFER under a view argument (SHRINK, BITCAST: what the bridge's way back makes of a SLICE)."""
  b = u
  while b.op in (TOps.SHRINK, TOps.BITCAST, TOps.RESHAPE): b = b.src[0]
  if b.op is not TOps.BUFFER: raise BridgeRefusal("backend:arg:tinygrad-view", f"an argument {u.op.name} over {b.op.name}")
  return b

# ---- running inside tinygrad -----------------------------------------------------------------------------------------

STATS, _STATS_LOCK = {"runs": 0}, threading.Lock()

def stats() -> dict:
  """runs: Programs run inside tinygrad (TinyJit replays included)."""
  with _STATS_LOCK: return dict(STATS)

_WORK: "weakref.WeakKeyDictionary[Node, tuple[int, int, int]]" = weakref.WeakKeyDictionary()

def work(call: Node) -> tuple[int, int, int]:
  """(steps, scalar ops, bytes read and written) of a concrete CALL's kernels (lower/schedule/work.py), worked out once."""
  if (got := _WORK.get(call)) is None:
    ws = program_work(call)
    got = _WORK[call] = (len(ws), sum(w.flops for w in ws), sum(w.nbytes for w in ws))
  return got

def _allocated(b): return b.ensure_allocated() if b.nbytes else b

def _exec(ctx, call: UOp, ast: UOp):
  if not isinstance(prog := ast.arg, Program): return None
  bufs = [[_allocated(d) for d in b.bufs] if isinstance(b, MultiBuffer) else _allocated(b)
          for b in (u.buffer for u in _tg_realize.resolve_params(call, ctx.input_uops))]
  for d in prog.devices: Device[d].synchronize()   # tinygrad's CPU queues run asynchronously: what they wrote is there
  ran = prog.run(bufs, ctx.var_vals)
  with _STATS_LOCK: STATS["runs"] += 1
  if ctx.update_stats:   # tinygrad counts the item as one kernel of no work: its GlobalCounters get callsat's kernels
    steps, ops, nbytes = work(ran)
    GlobalCounters.kernel_count += max(steps, 1) - 1
    GlobalCounters.global_ops += ops
    GlobalCounters.global_mem += nbytes
  return []

_PM = PatternMatcher([(UPat(TOps.CALL, src=(UPat(TOps.CUSTOM_FUNCTION, name="ast"),), name="call", allow_any_len=True), _exec)])
_STOCK_EXEC = _tg_realize.pm_exec

def hook() -> None:
  """Let tinygrad's runner execute Programs (idempotent): one pattern ahead of its own."""
  if _tg_realize.pm_exec is _STOCK_EXEC: _tg_realize.pm_exec = _PM + _STOCK_EXEC
