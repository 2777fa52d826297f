"""The bridge's cost-mode option (issue 14): callsat's time model chooses extra realize points in a tinygrad graph and
the bridge hands them to tinygrad. Opt-in: CALLSAT_BRIDGE_FUSION=cost puts a CONTIGUOUS on each in the CALL it returns
(tinygrad's rangeify never removes one), cost-store has the CALL store each (`realize_hints`: as a program's own
.contiguous()); the default, rules, gives no hints.

The bridge's own conversion carries tinygrad's arithmetic as OPAQUE, which the time model cannot cost. So the hints
come from a shadow of the converted graph used only for costing (`Shadow`): OPAQUE ALU ops (MULACC included), REDUCE and CONSTs
rebuilt as callsat ops (tinygrad's implicit broadcasting made explicit, weak constants typed like their consumer,
REDUCE's leading-axes form as a keepdim REDUCE and a RESHAPE), priced by the time model of tinygrad's own kernels on
that device (bench/calibrate_tinygrad.py, per tinygrad version; none: no hints). Its cost-mode partition
(egraph/fusion/solve.py) stores some candidates; those that are tinygrad ALU or REDUCE values are the hints, given only
when the partition is predicted faster than tinygrad's own schedule (egraph/fusion/stock.py's stand-in for it) by
more than the calibration's held-out error (ANCHOR). Where no win is predicted past that error, a measured decision
explores: the partition's own stores where it predicts a gain all the same, then (or else) callsat's rules-like stores,
go to the measured check and are kept only if measured faster (the model cannot see what wins on the models: tinygrad's
simplifier dropping a convolution's padded taps over a stored buffer, its eager lowering of BERT's long kernels);
CALLSAT_BRIDGE_EXPLORE=0 leaves such graphs unhinted. Decided once per graph structure
(egraph/bridge/cache.py). The shadow is never run: its values do not matter, only shapes, dtypes and op kinds; any op it
cannot rebuild stays OPAQUE."""
from __future__ import annotations
import dataclasses, math, time
from importlib.metadata import version, PackageNotFoundError
from dataclasses import dataclass, field
from tinygrad.uop.ops import UOp, Ops as TOps, AxisType
from tinygrad.dtype import dtypes as tdt
from egraph.ir.ops import Node, Ops, ALU_OPS, BufferArg, toposort, const, is_shard
from egraph.ir.dtype import dtypes
from egraph.ir.errors import CallsatError
from egraph.ir.env import env_value
from egraph.engine.encode import encode
from egraph.engine.cost import COST_PRESETS
from egraph.engine.report import PartitionReport
from egraph.fusion.solve import partition_ids, MARGIN
from egraph.fusion.partition import rules_like_ids
from egraph.fusion.timemodel import TimeModel, NoTimeModel, tinygrad_device_key
from egraph.fusion.candidates import add_candidates, stored_members
from egraph.fusion.greedy import LOADS
from egraph.engine.driver import saturate, extract_call
from egraph.bridge.convert import Conversion, movement

MODES = ("rules", "cost", "cost-store")
ENV = "CALLSAT_BRIDGE_FUSION"
COST_DEVICE = "CPU"   # the only calibrated device: a tinygrad graph on one device is priced as callsat's CPU
SOLVER_S_PER_NODE, SOLVER_S = 2e-4, 0.25   # the partition's time: per shadow node, at most SOLVER_S (decided once per structure)
# the greedy search (exhaustive up to a few candidates): the measured check has the last word on every hint, and the MILP
# cost a first call scipy's import (~0.6 s) and its model's build (~60 ms a graph on GPT-2) for candidates it then drops
SOLVER = "greedy"
# hints only where the partition is predicted faster than stock's schedule by more than the calibration's held-out error;
# False gives every hint the partition chooses (what the time model alone would do: for studying it, and the tests of
# how hints reach tinygrad)
ANCHOR = True
_ALU = {i.tinygrad or o.name: o for o, i in ALU_OPS.items()}   # tinygrad's ALU op name -> callsat's (the op table)
_REDUCE = {TOps.ADD: Ops.ADD, TOps.MUL: Ops.MUL, TOps.MAX: Ops.MAX}
_WEAKS = (tdt.weakint, tdt.weakfloat)
_READS = LOADS | {Ops.COPY}   # converted nodes that read memory
_MOVES = frozenset({TOps.RESHAPE, TOps.EXPAND, TOps.PAD, TOps.SHRINK, TOps.PERMUTE, TOps.FLIP})

EXPLORE_ENV = "CALLSAT_BRIDGE_EXPLORE"

def explore_setting() -> bool:
  """Env CALLSAT_BRIDGE_EXPLORE, read when the bridge runs: "1" (the default, "") has cost mode's measured decisions
  measure stores the model predicts no win for beyond its error (cost_hints; such a structure's decision costs a compile
  and a measurement more, once: the verdict is kept per user); "0" gives only predicted hints; anything else is the
  user's error."""
  v = env_value(EXPLORE_ENV)
  if v not in ("", "0", "1"): raise CallsatError(f"{EXPLORE_ENV} must be 0 or 1, got {v!r}")
  return v != "0"

def bridge_fusion(value: str | None = None) -> str:
  """`value`, else env CALLSAT_BRIDGE_FUSION (read when the bridge runs), else "rules"."""
  m = value if value is not None else (env_value(ENV) or "rules")
  if m not in MODES: raise CallsatError(f"{ENV} must be one of {MODES}, got {m!r}")
  return m

@dataclass
class Hints:
  """What cost mode chose for one tinygrad graph: the OPAQUE idents to realize (CONTIGUOUS in the CALL), their tinygrad
  UOps, the partition's report, and why there are none when there are none."""
  idents: frozenset = frozenset()
  uops: list = field(default_factory=list)
  candidates: int = 0
  partition: PartitionReport | None = None
  note: str = ""
  seconds: float = 0.0
  failed: bool = False   # choosing them raised (fallback mode goes on without): this call's answer, never cached
  stock_s: float | None = None    # the shadow's predicted time of the schedule without hints (the partition's anchor)
  hinted_s: float | None = None   # ... and of the partition it chose; hints only when it beats stock by more than the error
  measured: object = None   # the measured check's verdict (egraph/bridge/measure.Measured), where it ran
  explored: bool = False    # no predicted win past the error: stores for the measured check alone (explore_setting)
  alternative: frozenset = frozenset()   # exploring: the stores measured next where these lose (callsat's rules-like ones)
  backend: object = None    # CALLSAT_BRIDGE_BACKEND=callsat: the Program that runs it, or why tinygrad's kernels do

def hint_uops(cv: Conversion, idents) -> list:
  """The tinygrad UOps of OPAQUE idents, in ident order (Hints.uops)."""
  return [cv.opaque[i][0] for i in sorted(idents)]

def _ints(shape) -> bool: return shape is not None and all(isinstance(d, int) for d in shape)

class Shadow:
  """The converted graph with tinygrad's arithmetic as callsat ops; `origin`: shadow Node.id -> the OPAQUE ident it
  stands for. `folds` (pricing tinygrad's kernels): a reduce that reads no memory stays OPAQUE, as tinygrad folds it."""
  def __init__(self, cv: Conversion, device: str, bodies: bool = False, folds: bool = False):
    self.cv, self.device, self.memo, self.origin, self.bodies, self.folds = cv, device, {}, {}, bodies, folds
    self.reads: set[int] = set()   # ids of the converted nodes whose value reads memory

  def dev(self, d): return COST_DEVICE if d == self.device else d

  def build(self, roots: list[Node]) -> list[Node]:
    """roots rebuilt; a CALL/FUNCTION body stays as it is unless `bodies` (then it is rebuilt in its own scope: its
    PARAMs are its call's arguments)."""
    for n in toposort(roots, enter_calls=False):
      body = n.op in (Ops.CALL, Ops.FUNCTION)
      src = tuple((self.scoped(s) if self.bodies else s) if body and i == 0 else self.memo[s.id] for i, s in enumerate(n.src))
      if n.op in _READS or any(s.id in self.reads for s in n.src): self.reads.add(n.id)
      self.memo[n.id] = self.one(n, src)
    return [self.memo[r.id] for r in roots]

  def scoped(self, body: Node) -> Node:
    outer, self.memo = self.memo, {}
    try: return self.build([body])[0]
    finally: self.memo = outer

  def one(self, n: Node, src: tuple) -> Node:
    if n.op is Ops.BUFFER: return Node(Ops.BUFFER, n.dtype, (), BufferArg(n.arg.uid, n.arg.size, self.dev(n.arg.device)))
    if n.op is Ops.COPY: return Node(Ops.COPY, n.dtype, src, self.dev(n.arg))
    if n.op is Ops.MULTI and (y := self.unshard(n)) is not None: return y
    if n.op is not Ops.OPAQUE: return n.over(src)
    try: x = self.arith(n, src)
    except CallsatError: x = None   # a form the shadow cannot say (symbolic, mixed dtypes): it stays opaque
    if x is not None: return x
    return Node(Ops.OPAQUE, n.dtype, src, dataclasses.replace(n.arg, device=self.dev(n.arg.device)))

  def arith(self, n: Node, src: tuple) -> Node | None:
    """The callsat form of an OPAQUE ALU/REDUCE/CONST/RETYPE (recorded in `origin`), or None."""
    u, _ = self.cv.opaque[n.arg.ident]
    if u is None: return src[0].cast(n.dtype)   # a RETYPE: tinygrad converts the stored value itself
    shape, name = n.arg.shape, u.op.name
    if not _ints(shape): return None
    if u.op is TOps.CONST:
      if not isinstance(u.arg, (int, float, bool)): return None   # Invalid, a shape argument
      return _to(const(u.arg, n.dtype, self.dev(n.arg.device)), shape)
    if u.op in _MOVES and self.cv.opaque[n.arg.ident][1][:1] == (0,):   # over a device-less value (a constant's)
      return self.made(movement(self.cv, u, src[0]), n)
    if u.op is TOps.CAST and self.cv.opaque[n.arg.ident][1][:1] == (0,):   # of a device-less value
      return self.made(src[0].cast(n.dtype), n)
    if u.op is TOps.STACK and shape and shape[0] == len(src) == len(u.src):   # sources along a new leading axis (cat)
      return self.made(_stack(_operands(u, src, shape[1:], range(len(src))), shape, self.dev(n.arg.device)), n)
    if u.op in (TOps.DETACH, TOps.CONTIGUOUS_BACKWARD):   # gradient markers: the value itself
      return self.made(Node(Ops.DETACH, None, (src[0],)), n)
    if u.op is TOps.ALLREDUCE: return self.allreduce(n, u, src[0])
    if u.op is TOps.REDUCE:
      # a reduce that reads no memory (an arange: a cumsum of ones) is folded by tinygrad into index arithmetic: as a
      # REDUCE it would be priced as recomputed in every element of every kernel that reads it
      if self.folds and not any(s.id in self.reads for s in n.src): return None
      if len(u.src) != 1 or u.arg[0] not in _REDUCE or not isinstance(k := u.arg[1], int) or k < 1: return None
      return self.made(Node(Ops.REDUCE, None, (src[0],), (_REDUCE[u.arg[0]], tuple(range(k)))), n).reshape(shape)
    if name in _ALU:
      vals = range(1, len(src)) if u.op is TOps.WHERE else range(len(src))
      if len(src) == 1 and n.dtype.is_float() and not src[0].dtype.is_float():   # tinygrad's 1/x, sqrt... of ints: floats
        src = (src[0].cast(n.dtype),)
      ops = _operands(u, src, shape, vals)
      r = Node(_ALU[name], None, tuple(ops))
    else: return None
    return self.made(r if r.dtype == n.dtype else r.cast(n.dtype), n)

  def unshard(self, n: Node) -> Node | None:
    """MULTI n (per-device values -> the logical value split along n's axis) of one of tinygrad's two per-device forms,
    as the logical value itself (built); else None:
    - a SHRINK of a logical value y at offset dnum*s, size s along the axis (tinygrad's `shard`; dnum the DEVICE range,
      s the shard size): y;
    - an MSTACK of single-device values, one per device of the tuple (the shards gathered back): their concatenation
      along the axis, each copied onto the tuple."""
    if (x := n.src[0]).op is not Ops.OPAQUE or (got := self.cv.opaque[x.arg.ident])[0] is None: return None
    u, axis, ndev = got[0], n.arg, len(n.device)
    if u.op is TOps.MSTACK and len(x.src) == ndev and all(s.device == d and s.shape == x.shape for s, d in zip(x.src, n.device)):
      if not _ints(n.shape) or got[1] != tuple(range(ndev)): return None
      return _concat([Node(Ops.COPY, s.dtype, (self.memo[s.id],), self.dev(n.device)) for s in x.src], axis, n.shape, self.dev(n.device))
    if u.op is not TOps.SHRINK or got[1][:1] != (0,): return None
    y = x.src[0]
    if is_shard(y) or y.shape != n.shape or not _ints(y.shape) or y.shape[axis] % ndev: return None
    size = y.shape[axis] // ndev
    for i, (off, sz) in enumerate(u.marg):
      if i != axis and (off, sz) != (0, y.shape[i]): return None
      if i == axis and (sz != size or not _device_offset(off, ndev, size)): return None
    return self.memo[y.id]

  def allreduce(self, n: Node, u: UOp, x: Node) -> Node | None:
    """tinygrad's ALLREDUCE of a value sharded along axis a over D devices (each device gets the op over every device's
    shard, shards stay where they were) as logical arithmetic: the value with a split into (D, shard), reduced over D,
    repeated D times along a. None for another form (a replicated source, another device tuple, another op)."""
    try: a = u.src[0].axis
    except Exception: return None   # tinygrad cannot say (several sharded axes)
    if not isinstance(a, int) or u.arg[1] != u.src[0].device or u.arg[0] not in _REDUCE or x.shape != n.shape: return None
    ndev, shape = len(u.arg[1]), n.shape
    split = shape[:a] + (ndev, shape[a] // ndev) + shape[a + 1:]
    r = Node(Ops.REDUCE, None, (x.reshape(split),), (_REDUCE[u.arg[0]], (a,)))
    return self.made(r.expand(split).reshape(shape), n)

  def made(self, r: Node, n: Node) -> Node:
    """r, recorded as the callsat form of OPAQUE n (what a hint on r names)."""
    self.origin[r.id] = n.arg.ident
    return r

def _device_offset(off, ndev: int, size: int) -> bool:
  """Is tinygrad's offset `off` dnum*size on device dnum of ndev (dnum: the one DEVICE range it reads)?"""
  if not isinstance(off, UOp): return False
  rngs = [r for r in off.toposort() if r.op is TOps.RANGE and r.arg[-1] is AxisType.DEVICE]
  if len(rngs) != 1: return False   # (a bound variable left in it fails the CONST check below)
  return all((v := off.substitute({rngs[0]: rngs[0].const_like(d)}).simplify()).op is TOps.CONST and v.arg == d * size for d in range(ndev))

def _to(x: Node, shape: tuple) -> Node:
  """x broadcast to `shape` as tinygrad's ALU ops do implicitly (numpy rules): leading size-1 axes, then EXPAND."""
  if x.shape == shape: return x
  return x.reshape((1,) * (len(shape) - len(x.shape)) + tuple(x.shape)).expand(shape)

def _stack(parts: list[Node], shape: tuple, device) -> Node:
  """tinygrad's STACK: part i at index i of a new leading axis."""
  return _concat([p.reshape((1,) + tuple(shape[1:])) for p in parts], 0, shape, device)

def _concat(parts: list[Node], axis: int, shape: tuple, device) -> Node:
  """parts (equal shapes) one after another along `axis`. Each part padded into place, picked by a padded mask (a
  WHERE, not a sum of the pads: x + 0.0 would turn -0.0 into 0.0)."""
  out, k = None, parts[0].shape[axis]
  for i, p in enumerate(parts):
    at = tuple((i * k, (len(parts) - 1 - i) * k) if a == axis else (0, 0) for a in range(len(shape)))
    x = p.pad(at)
    if out is None: out = x; continue
    mask = const(True, dtypes.bool, device).reshape((1,) * len(shape)).expand(p.shape).pad(at)
    out = Node(Ops.WHERE, None, (mask, x, out))
  return out

def _operands(u: UOp, src: tuple, shape: tuple, vals) -> list[Node]:
  """The sources of an ALU op, broadcast to its shape, the value operands of one dtype (a weak constant's consumer's,
  the first typed operand's), a WHERE condition bool."""
  typed = [src[i].dtype for i in vals if u.src[i].dtype not in _WEAKS]
  vd = typed[0] if typed else src[vals[0]].dtype
  out = []
  for i, s in enumerate(src):
    if s.dtype != (want := vd if i in vals else s.dtype):   # a weak constant takes its consumer's dtype, else a CAST
      c = u.src[i]
      s = const(c.arg, want, s.device) if c.op is TOps.CONST and isinstance(c.arg, (int, float, bool)) else s.cast(want)
    out.append(_to(s, shape))
  return out

def cost_hints(cv: Conversion, roots: list[Node], kernels: str = "tinygrad", eager: bool = False, explore: bool = False) -> Hints:
  """The values of cv's graph that callsat's cost-mode partition stores beyond the program's realize points, as OPAQUE
  idents of tinygrad ALU/REDUCE values (never weak-typed ones, never a realize point itself), priced on the `kernels`
  that will run them: tinygrad's (its calibration for the device) or callsat's own (CALLSAT_BRIDGE_BACKEND=callsat);
  `eager`: realized outside a JIT, where each kernel costs tinygrad's eager launch (TimeModel.eager). `explore`
  (measured decisions, unless CALLSAT_BRIDGE_EXPLORE=0): where the model predicts no win past its error, the partition's
  stores (where it predicts a gain within the error; the solver then keeps no margin of its own), with callsat's
  rules-like stores as the `alternative` measured if they lose, or else the rules-like stores alone, are returned
  (marked `explored`) for the measured check to keep or drop.
  No hints (and a note) for realize points on several devices, sharded or on a DISK, or a graph callsat has no time
  model for."""
  t0 = time.perf_counter()
  devs = {r.device for r in roots if r.device is not None}   # the realize points' (inputs may be copied in from a host)
  if len(devs) != 1 or not isinstance(d := next(iter(devs)), str) or d.startswith("DISK"):
    return Hints(note=f"devices {sorted(map(str, devs))}: cost mode prices one device", seconds=time.perf_counter() - t0)
  try: tm, err = tinygrad_model(d) if kernels == "tinygrad" else callsat_model(d)
  except NoTimeModel as e: return Hints(note=str(e), seconds=time.perf_counter() - t0)
  if eager: tm = tm.eager()
  sh = Shadow(cv, d, folds=kernels == "tinygrad")
  enc = encode(sh.build(roots), "realized")
  cands = add_candidates(enc)
  if not cands: return Hints(note="no candidates", seconds=time.perf_counter() - t0)
  sat = saturate(enc)
  ex = extract_call(sat, COST_PRESETS["bytes"])
  budget = min(SOLVER_S, SOLVER_S_PER_NODE * len(enc.nodes))   # scales with the graph: a 10-node graph decides in 2 ms
  # anchored on what runs without hints: tinygrad's own schedule (fusion/stock.py), or callsat's rules on its kernels.
  # Exploring, the solver's best partition stands whatever its predicted gain (no margin): the error test below decides
  # between hints and exploring (BERT's eager graph: predicted 7 % faster than stock, measured 0.56x)
  ids, rep = partition_ids(sat.graph, ex.choice, ex.terms, ex.root_classes, enc, cands, tm, time.perf_counter() + budget, SOLVER,
                           "tinygrad" if kernels == "tinygrad" else "rules", 0.0 if explore else MARGIN)
  keys, cls = {k.id for k in enc.keys}, sat.graph.class_of_id
  def idents_of(stored) -> set:   # the OPAQUE idents of the candidates whose classes are stored: the hints
    chosen = [enc.nodes[i] for i in sorted(cands) if cls[i] in stored and enc.nodes[i].id not in keys]
    out = {sh.origin[n.id] for n in chosen if n.id in sh.origin}
    return {i for i in out if (u := cv.opaque[i][0]) is not None and u.dtype not in _WEAKS and u.device is not None}
  idents = idents_of(ids.stored)
  # the schedule that runs without hints, as the shadow predicts it: the partition's anchor
  stock, hinted = rep.rules_s, rep.predicted_s
  note, within = "" if idents else "the partition stores nothing beyond the realize points", set()
  if ANCHOR and idents and (stock is None or hinted is None or hinted >= stock * math.exp(-err)):
    gain = "not costed" if stock is None or hinted is None else f"predicted {stock * 1e6:.1f} -> {hinted * 1e6:.1f} us ({1 - hinted / stock:+.1%})"
    faster = stock is not None and hinted is not None and hinted < stock
    why = f"within the model's error on {kernels}'s kernels ({1 - math.exp(-err):.0%})" if faster else "no faster than the schedule without them"
    note, idents, within = f"{len(idents)} hints dropped: {gain}, {why}", set(), idents if faster else set()
  if not idents and explore:
    # no win past the error: the measured check gets the partition's own stores where it predicts a gain all the same
    # (the model's best guess: BERT's eager graph predicted 7 % faster, measured 0.61x; GPT-2's decode graphs 20-23 %,
    # 0.94-0.99x), then callsat's rules-like stores if those lose (ResNet-18's partition, predicted 1 % faster, measured
    # 0.99x: its rules-like stores 0.72x, a gain the model cannot see); the rules-like stores alone where it predicts none
    rules = idents_of(rules_like_ids(sat.graph, ex.choice, ex.terms.reached, stored_members(sat.graph, enc, cands)))
    first, then = (within, rules if rules != within else set()) if within else (rules, set())
    if first:
      what = f"{len(first)} of the partition's stores" if within else f"{len(first)} of callsat's rules-like stores"
      return Hints(frozenset(first), hint_uops(cv, first), len(cands), rep, f"explored ({note}): "
                   f"{what}, kept only if measured faster", time.perf_counter() - t0, stock_s=stock, hinted_s=hinted,
                   explored=True, alternative=frozenset(then))
  return Hints(frozenset(idents), hint_uops(cv, idents), len(cands), rep, note, time.perf_counter() - t0,
               stock_s=stock, hinted_s=hinted)

def tinygrad_model(device: str) -> tuple[TimeModel, float]:
  """The time model of tinygrad's kernels on `device` for the installed tinygrad (bench/calibrate_tinygrad.py), and its
  measured error (mean |log(predicted / measured)|, held-out kernels included); NoTimeModel when there is none."""
  try: v = version("tinygrad")
  except PackageNotFoundError: raise NoTimeModel("tinygrad has no package version: no calibration can be matched to it") from None
  key = tinygrad_device_key(v, device)
  if (got := _MODELS.get(key)) is None:
    try: tm = TimeModel.load(key)
    except NoTimeModel: raise NoTimeModel(f"no calibration of tinygrad {v}'s kernels on {device}: cost mode gives no hints "
                                          "(run python bench/calibrate_tinygrad.py there)") from None
    got = _MODELS[key] = (tm, float(tm.log_error))
  return got

_MODELS: dict = {}   # calibration key -> (TimeModel, its error): the file is read once per process

def callsat_model(device: str) -> tuple[TimeModel, float]:
  """callsat's own time model of its CPU kernels (bench/calibrate.py) for a tinygrad CPU device, and its recorded error
  (none recorded: any predicted gain counts)."""
  if device.partition(":")[0] != COST_DEVICE: raise NoTimeModel(f"callsat's kernels run tinygrad's CPU device, not {device}")
  if (got := _MODELS.get(COST_DEVICE)) is None:
    tm = TimeModel.load(COST_DEVICE)
    got = _MODELS[COST_DEVICE] = (tm, float(tm.log_error))
  return got

def realize_hints(cv: Conversion, roots: list[Node], idents: frozenset) -> list[Node]:
  """cv's roots with every consumer of a hinted OPAQUE reading CONTIGUOUS(it), as if the program had asked for it:
  callify stores it like any CONTIGUOUS (one kernel with whatever it fuses, e.g. the reduce under it). Rebuilt nodes
  inherit their originals' tinygrad UOps (buffer_map keys)."""
  if not idents: return roots
  new, plain = {}, {}   # Node.id -> what consumers read, and the rebuilt node itself
  for n in toposort(roots, enter_calls=False):
    body = n.op in (Ops.CALL, Ops.FUNCTION)
    m = plain[n.id] = n.over(tuple(s if body and i == 0 else new[s.id] for i, s in enumerate(n.src)))
    if m is not n:
      had = cv.origins.setdefault(m.id, [])
      had += [u for u in cv.origins.get(n.id, ()) if u not in had]
      cv.keep.append(m)
    new[n.id] = m.contiguous() if n.op is Ops.OPAQUE and n.arg.ident in idents else m
  cv.keep += new.values()
  return [plain[r.id] for r in roots]
