"""Storage ranges of a kernelized CALL: Mem (a typed byte range of one storage root), the kernel specs and steps a
program is made of, and how storage nodes and a CALL's arguments bind to Mems."""
from __future__ import annotations
import itertools
from dataclasses import dataclass, field
from egraph.ir.dtype import DType
from egraph.ir.errors import CallsatError, UnsupportedOpError
from egraph.ir.ops import Node, Ops, GroupOp
from egraph.ir.view import contiguous_range
from lower.schedule.kernel import Idx, Expr, Kernel

@dataclass(frozen=True)
class Mem:
  """A typed, contiguous byte range of one storage root: ('arg', uid) for a BUFFER, ('tmp', n) for a temporary."""
  root: tuple
  off: int          # bytes
  dtype: DType
  count: int        # elements
  dstride: int = 0  # per-device storage (a BUFFER on a tuple of devices): bytes from one device's copy to the next
  @property
  def nbytes(self) -> int: return self.count * self.dtype.itemsize
  def on(self, d: int) -> "Mem":
    """Device d's copy of per-device storage (device 0's for a plain Mem)."""
    return Mem(self.root, self.off + d * self.dstride, self.dtype, self.count)
  def overlaps(self, o: "Mem") -> bool:
    return self.root == o.root and self.nbytes > 0 and o.nbytes > 0 and self.off < o.off + o.nbytes and o.off < self.off + self.nbytes

@dataclass
class Spec:
  """A kernel before its memory is resolved: loads carry (Mem, direct) keys instead of param numbers."""
  domain: tuple
  mem: Mem
  idx: Idx
  value: Expr
  kind: str = "e"

@dataclass
class Step:
  kernel: Kernel | None         # None: a snapshot (memcpy src -> dst)
  mems: tuple                   # one Mem per kernel param; (src, dst) for a snapshot
  work: int = 0                 # estimated element-ops, for the thread split

@dataclass
class Program:
  steps: list
  temps: dict                   # tmp root -> nbytes
  written: set                  # ('arg', uid) roots written
  peers: set = field(default_factory=set)   # (kernel device, device read): reads of another device's storage


class Ctx:
  """Shared state of one program: temp numbering, shard axes of multi-device values, cross-device reads, and the values
  realized into temporaries so far (`realized`: builder.Group.temp_of's key -> _Temp; `realized_ids`: their node ids):
  a later group reads them instead of computing them again."""
  def __init__(self): self.tmp, self.axes, self.peers, self.realized, self.realized_ids = itertools.count(), {}, set(), {}, set()
  def temp(self, dtype: DType, count: int) -> Mem: return Mem(("tmp", next(self.tmp)), 0, dtype, count)

# ---------------------------------------------------------------------------------------------------------------------
# storage views

def storage_mem(n: Node, bind: dict) -> tuple[Mem | None, bool]:
  """The contiguous storage `n` is (RESHAPE/AFTER/DETACH/SLICE chain down to a PARAM or BUFFER), and whether an AFTER
  was passed; (None, _) if `n` is computed or a non-contiguous view."""
  after, chain = False, []
  while True:
    if n.op is Ops.AFTER: after = True; n = n.src[0]
    elif n.op in (Ops.RESHAPE, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD): n = n.src[0]
    elif n.op is Ops.SLICE: chain.append(n); n = n.src[0]
    else: break
  if n.op is Ops.PARAM:
    if n.arg.slot < 0: raise UnsupportedOpError("lowering: symbolic PARAM (slot -1) is not supported yet")
    if n.arg.slot not in bind: raise CallsatError(f"PARAM slot={n.arg.slot}: no such argument ({len(bind)} given)")
    m = bind[n.arg.slot]
    if m.count != n.numel or m.dtype != n.dtype:
      raise CallsatError(f"PARAM slot={n.arg.slot}: argument is {m.dtype.name}({m.count},), the PARAM says {n.dtype.name}{n.shape}")
  elif n.op is Ops.BUFFER: m = Mem(("buf", n.arg.uid), 0, n.dtype, n.arg.size, _dstride(n))
  else: return None, after
  for s in reversed(chain):   # on a tuple of devices a SLICE is the same range of every device's copy
    off, count = s.arg
    m = Mem(m.root, m.off + off * m.dtype.itemsize, s.dtype, count, m.dstride)
  return m, after

def _dstride(b: Node) -> int: return b.arg.size * b.dtype.itemsize if isinstance(b.arg.device, tuple) else 0

def view_mem(n: Node, bind: dict) -> Mem | None:
  """The storage `n` is when it is one contiguous element range of it, through movement ops and AFTERs (an AFTER is
  its storage after its effects), else None."""
  m, _ = storage_mem(n, bind)
  if m is not None: return m
  chain, b = [], n
  while b.op in (Ops.AFTER, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD) or (b.op in GroupOp.Movement and b.op is not Ops.PAD):
    if b.op in GroupOp.Movement: chain.append(b)
    b = b.src[0]
  m, _ = storage_mem(b, bind)
  if m is None: return None
  x = b   # callify's own test for views (contiguous_range), on the chain without its AFTERs
  for c in reversed(chain): x = Node(c.op, c.dtype, (x,), c.arg)
  if (r := contiguous_range(x, b)) is None: return None
  return Mem(m.root, m.off + r[0] * m.dtype.itemsize, n.dtype, r[1], m.dstride)

def arg_binding(call: Node) -> tuple[dict, list[Node]]:
  """PARAM slot -> Mem with canonical roots ('arg', j) (j: first argument on the same BUFFER), and the BUFFER nodes:
  how every backend binds a CALL's arguments. A temporary arg (CallInfo.temps) binds to ('tmp', ~slot): scratch
  memory the executor places with its own temporaries, never storage."""
  bufs, canon, bind, temps = [], {}, {}, getattr(call.arg, "temps", ())
  for i, a in enumerate(call.src[1:]):
    if i in temps: bind[i] = Mem(("tmp", ~i), 0, a.dtype, a.numel); continue   # scratch: never storage (CallInfo.temps)
    b = a if a.op is Ops.BUFFER else a.src[0]
    if b.arg.uid not in canon: canon[b.arg.uid] = len(bufs); bufs.append(b)
    off = 0 if a.op is Ops.BUFFER else a.arg[0] * b.dtype.itemsize
    bind[i] = Mem(("arg", canon[b.arg.uid]), off, a.dtype, a.numel, _dstride(b))
  return bind, bufs
