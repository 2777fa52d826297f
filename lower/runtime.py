"""Runtime: numpy-backed storage for BUFFERs, host buffers, and execution of CALLs.

Every device is backed by host numpy arrays. A CALL on "CPU" (and host-only CALLs) runs as native code through the LLVM
backend (lower/device/native.py); a CALL that touches device "PYTHON" runs through the numpy reference executor (lower/reference.py).
A CALL on "CUDA" runs on the GPU through lower/device/cuda.py (DeviceError without a driver/GPU). Each backend is a
lower/device/backend.py Backend registered once below; a CALL goes to the highest-ranked backend of the devices it
touches. A sharded CALL on CPU devices
(("CPU", "CPU:1"), ...) runs natively too, as per-device kernels (lower/schedule/kernelize.py).

Threads: run_call may be called from several Python threads at once. Concurrent: callify's Python, kernelize, storage
allocation and frees (single dict operations, atomic under the GIL; the buffer pool has its own lock) and the kernels
themselves (ctypes releases the GIL). Serialized: every llvmlite call (compiling, loading and symbol lookups take
lower.device.llvmjit.JIT_LOCK: LLVM's JIT is not thread-safe) and the native worker pool (one split launch at a time; another
thread's launch then runs its kernel on its own thread instead of waiting).
"""
from __future__ import annotations
import weakref
import numpy as np
from egraph.ir.errors import CallsatError, DeviceError, UnsupportedOpError
from egraph.ir.ops import GroupOp, Node, Ops, toposort, is_shard, bindings
from egraph.ir.storage import Storage, STORAGE
from lower.device.backend import Backend, register, backend_for, runnable
from lower.device.cuda import CudaBackend
from lower.device.native import NativeBackend
from lower.reference import evaluate

class ReferenceBackend(Backend):
  """The PYTHON device kind: the numpy reference executor (lower/reference.py), which reads every host device's data."""
  name, devices, rank = "python", ("PYTHON",), 2
  def run(self, call, storage, wait: bool = True) -> None: evaluate([call], storage)

for _b in (NativeBackend(), ReferenceBackend(), CudaBackend()): register(_b)   # the one place backends are registered
RUNNABLE = runnable()

def check_device(d) -> None:
  """Raise DeviceError unless `d` (a canonical device, a tuple of them, or None) runs here."""
  if d is None: return
  if isinstance(d, tuple):
    for x in d: check_device(x)
    return
  if d.partition(":")[0] not in RUNNABLE:
    raise DeviceError(f"device {d!r} cannot execute yet: only {', '.join(RUNNABLE)} (CPU:n, CUDA:n, DISK:/path) run")

_ROUTES: "weakref.WeakKeyDictionary[Node, str]" = weakref.WeakKeyDictionary()   # CALL -> backend, checked once
_BODIES: "weakref.WeakKeyDictionary[Node, tuple]" = weakref.WeakKeyDictionary()   # CALL body -> _kinds of its nodes
# CALL body -> {its plain BUFFER args' devices -> (backend, whether one is a DISK)}: a CALL over whole BUFFERs routes by these
_PLAIN: "weakref.WeakKeyDictionary[Node, dict]" = weakref.WeakKeyDictionary()

def run_call(call: Node, storage: Storage = STORAGE, wait: bool = True) -> None:
  """Execute a CALL from callify: its SINK body runs with PARAM(slot=i) bound to `call.src[1+i]` (BUFFER or SLICE(BUFFER)).
  Output buffers are allocated on demand. A CALL is validated once; running it again only dispatches. With `wait` False
  the CALL's last kernel may still be running when this returns (a CALL of no DISK buffer): `storage` finishes it before
  it hands out any array (Storage.settle), as does the next run_call on it, so the caller's Python overlaps the kernel."""
  if call.op is not Ops.CALL: raise CallsatError(f"run_call: expected a CALL, got {call.op.name}")
  if storage.pending is not None: storage.settle()   # CALLs run in order: this one may read what the last one writes
  body, args = call.src[0], call.src[1:]
  if all(a.op is Ops.BUFFER for a in args):   # the front end's CALLs: a new one per realize, routed by body and devices
    devs = tuple(a.arg.device for a in args)
    if (per := _PLAIN.get(body)) is None: per = _PLAIN[body] = {}
    if (got := per.get(devs)) is None:
      if body.op is not Ops.SINK: raise CallsatError(f"run_call: the body must be a SINK, got {body.op.name}")
      got = per[devs] = (_route(call), any(_on(d, "DISK") for d in devs))
    route, disk = got
    if disk: _map_disks(_disk_args(call), storage); wait = True   # a file is read outside storage: written when this returns
    if (p := route.run(call, storage, wait)) is not None: storage.pending = p
    return
  if (route := _ROUTES.get(call)) is None:
    if call.src[0].op is not Ops.SINK: raise CallsatError(f"run_call: the body must be a SINK, got {call.src[0].op.name}")
    route = _ROUTES[call] = _route(call)
  if route == "bind":
    call, _ = bindings(call)   # symbolic dimensions take their bound values; BIND args leave the call
    if (route := _ROUTES.get(call)) is None: route = _ROUTES[call] = _route(call)
  if disks := _disk_args(call): _map_disks(disks, storage)
  route.run(call, storage)

_DISKS: "weakref.WeakKeyDictionary[Node, tuple]" = weakref.WeakKeyDictionary()   # CALL -> ((DISK BUFFER, written?), ...)
_THROUGH = (Ops.SLICE, Ops.AFTER, Ops.DETACH, Ops.MULTI, Ops.CONTIGUOUS_BACKWARD)

def _disk_args(call: Node) -> tuple:
  """The DISK BUFFERs among a CALL's args, each with whether the CALL stores into it (nested CALLs followed)."""
  if (got := _DISKS.get(call)) is not None: return got
  def base(n: Node) -> Node:
    while n.src and (n.op in GroupOp.Movement or n.op in _THROUGH): n = n.src[0]
    return n
  written: set[int] = set()
  def walk(body: Node, args: list[Node]) -> None:
    def resolve(x: Node) -> Node:
      b = base(x)
      return args[b.arg.slot] if b.op is Ops.PARAM and 0 <= b.arg.slot < len(args) else b
    for n in toposort([body], enter_calls=False):
      if n.op is Ops.STORE and (b := resolve(n.src[0])).op is Ops.BUFFER: written.add(b.arg.uid)
      elif n.op is Ops.CALL: walk(n.src[0], [resolve(a) for a in n.src[1:]])
  args = [base(a) for a in call.src[1:]]
  disks = {b.arg.uid: b for b in args if b.op is Ops.BUFFER and _on(b.arg.device, "DISK")}
  if disks: walk(call.src[0], args)
  got = _DISKS[call] = tuple((b, u in written) for u, b in disks.items())
  return got

def _map_disks(disks: tuple, storage: Storage) -> None:
  """Map DISK files by intent before any executor touches them: a file the CALL writes read-write (created, grown or
  remapped from a read map), a file it only reads read-only (missing or too small: DeviceError), never written."""
  for b, written in disks:
    if written: storage.allocate(b)
    elif b not in storage: storage.allocate(b, write=False)

def _route(call: Node) -> Backend | str:
  """Validate a CALL's args and devices; the backend that runs it ("bind" when BIND args must be applied first)."""
  if any(a.op is Ops.BIND for a in call.src[1:]):
    bindings(call)   # validates the BIND args
    return "bind"
  for i, a in enumerate(call.src[1:]):
    if not (a.op is Ops.BUFFER or (a.op is Ops.SLICE and a.src[0].op is Ops.BUFFER)):
      raise CallsatError(f"run_call: argument {i} is {a.op.name}; expected BUFFER or SLICE(BUFFER)")
  body = call.src[0]   # every realize of a program makes a new CALL over the same body: its walk is done once
  if (kinds := _BODIES.get(body)) is None: kinds = _BODIES[body] = _kinds(toposort([body]))
  args = _kinds(call.src[1:] if all(not a.src for a in call.src[1:]) else toposort(call.src[1:]))   # plain BUFFERs: no walk
  return backend_for(kinds[0] | args[0] or {"CPU"}, kinds[1] or args[1])   # no device at all: host data, the CPU's

def _kinds(nodes) -> tuple[frozenset, bool]:
  """(the device kinds `nodes` touch, whether any is multi-device), each device checked (bodies can be 100k nodes)."""
  kinds, multi = set(), False
  for n in nodes:
    if n.op is Ops.OPAQUE:
      raise UnsupportedOpError(f"run_call: {n.arg.name} is a host framework's op that callify carried without its arithmetic "
                               "(OPAQUE, from the tinygrad bridge); callsat's executors cannot compute it")
    check_device(n.device)
    if n.op is Ops.PARAM: check_device(n.arg.device)
    for d in (n.device, n.arg.device if n.op is Ops.PARAM else None):
      if d is not None: kinds.update(x.partition(":")[0] for x in (d if isinstance(d, tuple) else (d,)) if isinstance(x, str))
    multi = multi or isinstance(n.device, tuple)
  return frozenset(kinds), multi

def _on(d, kind: str) -> bool:
  if isinstance(d, tuple): return any(_on(x, kind) for x in d)
  return isinstance(d, str) and d.partition(":")[0] == kind

def read(node: Node, storage: Storage = STORAGE) -> np.ndarray:
  """A standalone copy of the values of a pure graph over realized storage (e.g. RESHAPE(BUFFER)). Graphs with effects
  (STORE/CALL) are refused: reading must not write; run the CALL first."""
  for n in toposort([node], enter_calls=False):
    if n.op in (Ops.STORE, Ops.CALL): raise CallsatError(f"read: the graph contains {n.op.name}; run it (run_call) and read the buffer instead")
  if node.shape is None: raise CallsatError(f"read: {node.op.name} has no value")
  v = evaluate([node], storage)[0]
  return np.array(v[0] if is_shard(node) else v, copy=True, order="C")   # a replicated value: device 0's copy
