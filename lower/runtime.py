"""Runtime: numpy-backed storage for BUFFERs, host buffers, and execution of CALLs.

Every device is backed by host numpy arrays. A CALL on "CPU" (and host-only CALLs) runs as native code through the LLVM
backend (lower/device/native.py); a CALL that touches device "PYTHON" runs through the numpy reference executor (lower/reference.py).
A CALL on "CUDA" runs on the GPU through lower/render/cuda/render.py (DeviceError without a driver/GPU). A sharded CALL on CPU devices
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
from egraph.engine.driver import bindings
from egraph.ir.errors import CallsatError, DeviceError, UnsupportedOpError
from egraph.ir.ops import GroupOp, Node, Ops, toposort, is_shard
from egraph.ir.storage import Storage, STORAGE
from lower.render.cuda.render import run_cuda
from lower.device.native import run_native
from lower.reference import evaluate

RUNNABLE = ("CPU", "PYTHON", "NPY", "DISK", "CUDA")

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

def run_call(call: Node, storage: Storage = STORAGE) -> None:
  """Execute a CALL from callify: its SINK body runs with PARAM(slot=i) bound to `call.src[1+i]` (BUFFER or SLICE(BUFFER)).
  Output buffers are allocated on demand. A CALL is validated once; running it again only dispatches."""
  if call.op is not Ops.CALL: raise CallsatError(f"run_call: expected a CALL, got {call.op.name}")
  if (route := _ROUTES.get(call)) is None:
    if call.src[0].op is not Ops.SINK: raise CallsatError(f"run_call: the body must be a SINK, got {call.src[0].op.name}")
    route = _ROUTES[call] = _route(call)
  if route == "bind":
    call, _ = bindings(call)   # symbolic dimensions take their bound values; BIND args leave the call
    if (route := _ROUTES.get(call)) is None: route = _ROUTES[call] = _route(call)
  if disks := _disk_args(call): _map_disks(disks, storage)
  if route == "python": evaluate([call], storage)
  elif route == "cuda": run_cuda(call, storage)   # the GPU through libcuda; DeviceError naming what is missing without one
  else: run_native(call, storage)

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

def _route(call: Node) -> str:
  """Validate a CALL's args and devices; the backend that runs it ("bind" when BIND args must be applied first)."""
  if any(a.op is Ops.BIND for a in call.src[1:]):
    bindings(call)   # validates the BIND args
    return "bind"
  for i, a in enumerate(call.src[1:]):
    if not (a.op is Ops.BUFFER or (a.op is Ops.SLICE and a.src[0].op is Ops.BUFFER)):
      raise CallsatError(f"run_call: argument {i} is {a.op.name}; expected BUFFER or SLICE(BUFFER)")
  body = call.src[0]   # every realize of a program makes a new CALL over the same body: its walk is done once
  if (kinds := _BODIES.get(body)) is None: kinds = _BODIES[body] = _kinds(toposort([body]))
  python, multi, cuda = (x or y for x, y in zip(kinds, _kinds(toposort(call.src[1:]))))
  if multi and cuda and not python:
    raise UnsupportedOpError("run_call: multi-device (sharded) CALLs on CUDA are not supported (the CUDA backend runs one GPU "
                             "per CALL); shard over CPU devices (('CPU', 'CPU:1'), ...) or PYTHON devices")
  return "python" if python else "cuda" if cuda else "native"

def _kinds(nodes) -> tuple[bool, bool, bool]:
  """(touches PYTHON, is multi-device, touches CUDA) over `nodes`, each device checked (bodies can be 100k nodes)."""
  python = multi = cuda = False
  for n in nodes:
    if n.op is Ops.OPAQUE:
      raise UnsupportedOpError(f"run_call: {n.arg.name} is a host framework's op that callify carried without its arithmetic "
                               "(OPAQUE, from the tinygrad bridge); callsat's executors cannot compute it")
    check_device(n.device)
    if n.op is Ops.PARAM: check_device(n.arg.device)
    python = python or _on(n.device, "PYTHON") or (n.op is Ops.PARAM and _on(n.arg.device, "PYTHON"))
    multi = multi or isinstance(n.device, tuple)
    cuda = cuda or _on(n.device, "CUDA")
  return python, multi, cuda

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
