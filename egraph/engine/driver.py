"""The callify driver: encode -> saturate -> extract -> build the CALL (PARAMs numbered) and buffer_map -> CallifyResult.

`saturate` (encode -> Runner -> load, materialize, optimize) and `extract_call` (freeze -> EGraphView -> costs ->
extract; `.terms` decodes) are the pipeline's two halves; explain, export and the soundness checker call them too, so
every tool sees the e-graph and the extraction callify sees. `build_call` turns the chosen e-classes into the CALL in
one rebuild (what `parameterize` of the decoded terms gives). Under Limits callify plans its time (`Budget`): when the
e-graph will not fit, or runs out of time, it builds the all-materialized CALL straight from the encoding
(`materialized_call`), the form the e-graph would give with no optimize rule; when the toposort's time already rules
the e-graph out, it builds that CALL from the graph without encoding (`direct.plan`, `build_plan`).
E-class identity replaces tinygrad's tags: each realize point (an original node) names the e-class of its realized
form, so after extraction its storage is read straight off the chosen term."""
from __future__ import annotations
import gc, threading, time, weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Callable
from egraph.ir.ops import Node, Ops, GroupOp, CallInfo, toposort, substitute, new_buffer, map_args, const_key, dims_arg, binds_dims
from egraph.ir.dtype import dtypes
from egraph.ir.errors import CallsatError, EngineError
from egraph.ir.storage import STORAGE
from egraph.ir.lru import ByteLRU, mb_setting
from egraph.ir.symbolic import BoundVar, dims_in, map_dims
from egraph.engine.encode import encode, Encoding
from rules.vocabulary import TERM_ROWS
from egraph.engine.direct import plan, no_decision, settled_on_graph, DROPPED
from egraph.engine.build import view_over, bind_dims, build_call, has_bound_dims, materialized_call, build_plan
from egraph.engine.runner import (Runner, Limits, Schedule, StepHook, StopReason, OutOfBudget, LIMIT_PRESETS, SCHEDULE_PRESETS,
                           resolve)
from egraph.engine.cost import CostModel, COST_PRESETS
from egraph.engine.extract import EGraphView, ChosenIds, Unextractable, Terms, extract, decode, baseline_cost, reached_classes, INF
from egraph.engine.exact import Certificate, EXACT_SECONDS, exact_extract, certify
from egraph.engine.report import CallifyReport
from egraph.fusion.solve import fusion_mode, cost_plan, partition_ids, solver_deadline
from egraph.fusion.candidates import add_candidates, mark, temporaries

@dataclass
class CallifyResult:
  call: Node                      # CALL(SINK(roots...), *args)
  buffer_map: dict[Node, Node]    # original node -> storage view
  report: CallifyReport
  inputs: tuple = ()              # the graph's own BUFFERs (what holding its roots keeps alive); set by callify

def storage_view(n: Node) -> Node:
  """The storage a realized term lives in: AFTERs and value markers (DETACH, CONTIGUOUS_BACKWARD: unoptimized forms
  keep them) stripped from the view chain, reshapes collapsed."""
  chain = []
  while n.op is not Ops.BUFFER and n.op is not Ops.PARAM:
    if n.op is Ops.AFTER or n.op is Ops.DETACH or n.op is Ops.CONTIGUOUS_BACKWARD: n = n.src[0]; continue
    if n.op not in GroupOp.Movement and n.op not in (Ops.SLICE, Ops.MULTI, Ops.BITCAST):   # BITCAST: a retyped assign target
      raise EngineError(f"extraction chose a non-storage form {n.op.name} for a realized value")
    chain.append((n.op, n.dtype, n.arg)); n = n.src[0]
  return view_over(n, chain)

def parameterize(body: Node) -> tuple[Node, list[Node]]:
  """Replace global BUFFERs and whole SLICE(BUFFER)s by PARAM(slot) in first-visit pre-order (spec §4.4), then bound
  symbolic dimensions by their variables, passing each value as a trailing BIND arg: the body is the cache key."""
  args, slots, seen, stack = [], {}, set(), [body]
  while stack:
    n = stack.pop()
    if n.id in seen: continue
    seen.add(n.id)
    if n.op is Ops.BUFFER or (n.op is Ops.SLICE and n.src[0].op is Ops.BUFFER):
      slots[n] = n.param(len(args))
      args.append(n); continue
    stack.extend(reversed(n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src))
  return bind_dims(substitute([body], slots)[0], args)

def roots_of(xs) -> list[Node]:
  """The graph roots under Tensors or Nodes (a SINK gives its sources)."""
  out = []
  for x in xs:
    n = getattr(x, "node", x)
    if not isinstance(n, Node): raise CallsatError(f"callify takes Tensors or Nodes, got {type(x).__name__}")
    if n.op is Ops.SINK: out.extend(n.src)
    else: out.append(n)
  return out

# ---- the result cache: the same graph over other buffers reuses the saturated result ---------------------------------

@dataclass
class _Entry:
  """A cached result, with what rebinding it to another graph of the same key needs, found once (a hit is on every
  realize of a program in a loop). It holds none of the graph's buffers: every BUFFER the graph read and every one
  callify minted is a ghost in the stored result (a fresh node with no storage), so an entry keeps no input, output
  or scalar argument alive (a live entry pinned them: ~2 arrays per cached graph)."""
  size: int                  # len(topo) of the graph it was computed for
  call: Node                 # the result's CALL, with ghosts for the graph's buffers and the minted ones
  values: list[Node]         # its buffer_map's values (ghosted), keyed by `keys` (the graph's own nodes are not kept)
  report: CallifyReport
  buffers: list[tuple[int, Node]]   # (position in topo, its ghost) for each of the graph's BUFFERs
  keys: list[int]            # position of each buffer_map key in topo
  minted: list[Node]         # ghosts of the BUFFERs callify minted for values (CALL args, storage views): a hit mints new ones
  symbolic: bool             # does the graph bind symbolic dimensions (then BIND args and views take new values)

  @staticmethod
  def of(topo: list[Node], res: CallifyResult) -> _Entry:
    pos = {n.id: i for i, n in enumerate(topo)}
    # a temporary (CallInfo.temps) keeps its BUFFER: no executor gives it storage
    temps = {res.call.src[1 + i] for i in getattr(res.call.arg, "temps", ())}
    minted = {b: None for v in [*res.call.src[1:], *res.buffer_map.values()] for b in toposort([v])
              if b.op is Ops.BUFFER and b.arg.uid in res.report.fresh_uids and b not in temps}
    ghost = {b: new_buffer(b.arg.size, b.dtype, b.arg.device) for b in [*(n for n in topo if n.op is Ops.BUFFER), *minted]}
    call, *values = substitute([res.call, *res.buffer_map.values()], ghost)
    return _Entry(len(topo), call, values, res.report, [(i, ghost[n]) for i, n in enumerate(topo) if n.op is Ops.BUFFER],
                  [pos[k.id] for k in res.buffer_map], [ghost[b] for b in minted], binds_dims(topo))

ENTRY_NODE_BYTES = 600   # an entry's resident bytes per node of its graph (its key, ghosted CALL and views), measured

def _drop(key, e: _Entry) -> None:
  if (n := _SIZES[e.size] - 1): _SIZES[e.size] = n
  else: del _SIZES[e.size]

# the result cache: CALLSAT_CALLIFY_CACHE_MB (default 64) over the entries' estimated bytes, least recently used out
_CACHE = ByteLRU(mb_setting("CALLSAT_CALLIFY_CACHE_MB", 64), on_evict=_drop)
_SIZES: Counter = Counter()   # graph size -> entries of that size: a graph of no cached size cannot hit (no key made)

class _Key:
  """A result cache key that hashes once: the roots' memo looks its entry up again without hashing the graph's key."""
  __slots__ = ("t", "h")
  def __init__(self, t: tuple): self.t, self.h = t, hash(t)
  def __hash__(self) -> int: return self.h
  def __eq__(self, o) -> bool: return self is o or (type(o) is _Key and self.h == o.h and self.t == o.t)

class RootsMemo:
  """The last ROOTS cached results by their root nodes (node ids are never reused) and settings -> the entry's key and weak
  references to the graph's nodes a hit rebinds: a loop that builds the same expression over the same tensors gets the
  same root nodes back from the hash-cons table (while they live), and its hit skips the toposort and the graph's key
  (~11 of a 64^3 matmul realize's ~90 us). It holds no node alive; an entry whose key the result cache evicted, or whose
  nodes died, is a miss. Only graphs of at most NODES nodes: a key is ~100 bytes a node and the memo may outlive its entry."""
  ROOTS, NODES = 64, 512
  def __init__(self):
    self.d: OrderedDict = OrderedDict()
    self.lock = threading.Lock()

  def remember(self, mkey: tuple, topo: list[Node], key: _Key, e: _Entry) -> None:
    if e.symbolic or len(topo) > self.NODES: return   # a symbolic hit reads every node's bound values: it needs the toposort
    refs = {i: weakref.ref(topo[i]) for i in {*(i for i, _ in e.buffers), *e.keys}}
    with self.lock:
      self.d[mkey] = (key, refs)
      self.d.move_to_end(mkey)
      if len(self.d) > self.ROOTS: self.d.popitem(last=False)

  def recall(self, mkey: tuple) -> tuple[_Entry, dict] | None:
    """(the entry, position -> node) of the graph under these roots and settings, or None."""
    with self.lock:
      if (got := self.d.get(mkey)) is None: return None
      self.d.move_to_end(mkey)
    key, refs = got
    at = {i: r() for i, r in refs.items()}
    if (e := _CACHE.get(key)) is None or None in at.values():
      with self.lock: self.d.pop(mkey, None)
      return None
    return e, at

_ROOTS = RootsMemo()

def graph_key(roots: list[Node], topo: list[Node] | None = None) -> tuple[tuple, list[Node]]:
  """A key equal for graphs that differ only in which input buffers they read (buffers are named by position);
  `topo`: toposort(roots, enter_calls=False), if made already. Per node: op, dtype, the arg as a key (a BUFFER's size
  and device, a CONST's bits, a bound dimension's variable) and its sources' positions (a CALL's body by identity)."""
  if topo is None: topo = toposort(roots, enter_calls=False)
  pos = {n: i for i, n in enumerate(topo)}   # nodes hash by identity (a C call; n.id is an attribute load more)
  parts = []
  for n in topo:
    op, a = n.op, n.arg
    if op is _BUFFER: a = (a.size, a.device)
    elif op is _CONST: a = const_key(a)
    elif op is _CALL or op is _FUNCTION:
      parts.append((op, n.dtype, (a, n.src[0].id), tuple([pos[s] for s in n.src[1:]]))); continue
    elif (t := type(a)) is tuple:   # a shape or axes of plain ints (the common movement arg: one C-level pass), else walked
      if not (_INTS >= set(map(type, a)) or _plain(a)): a = _arg_key(a)
    elif not (a is None or t is int or t is Ops): a = _arg_key(a)
    parts.append((op, n.dtype, a, tuple([pos[s] for s in n.src])))
  return (tuple(parts), tuple([pos[r] for r in roots])), topo

_BUFFER, _CONST, _CALL, _FUNCTION = Ops.BUFFER, Ops.CONST, Ops.CALL, Ops.FUNCTION
_INTS = frozenset({int})

def _plain(a) -> bool:
  """An arg that is its own key: None, a plain int (a bound dimension is an int subclass), an op, tuples of these."""
  t = type(a)
  if a is None or t is int or t is Ops: return True
  return t is tuple and all(map(_plain, a))

def _unbind(d): return d.var if isinstance(d, BoundVar) else d

def _arg_key(a):
  """map_dims(a, _unbind), the common args first: none, a plain int, a shape of plain ints (a bound dimension is an int
  subclass: it takes map_dims)."""
  if a is None or type(a) is int: return a
  if type(a) is tuple and all(type(x) is int for x in a): return a
  return map_dims(a, _unbind)

def _reuse(e: _Entry, at, t0: float, topo: list[Node] | None = None) -> CallifyResult:
  """The cached result rebound to this graph's buffers and variable values, with freshly minted output buffers. `at`:
  topo position -> the graph's node, for the positions of the entry's buffers and keys (the toposort itself, or the
  memo's); `topo` (the toposort) is needed where the entry binds symbolic dimensions."""
  m = {g: at[i] for i, g in e.buffers}
  for b in e.minted: m[b] = new_buffer(b.arg.size, b.dtype, b.arg.device)
  n = len(e.call.src) - 1
  out = _rebind([*e.call.src[1:], *e.values], m)
  args, values = out[:n], out[n:]
  if e.symbolic:
    binds: dict = {}
    for n in topo: dims_in(dims_arg(n), binds)
    new_value = {d.var.key: d for d in binds if isinstance(d, BoundVar)}
    args = [Node(Ops.BIND, a.dtype, (), (a.arg[0], int(new_value[a.arg[0].key]))) if a.op is Ops.BIND else a for a in args]
    values = map_args(values, lambda d: new_value.get(d.var.key, d) if isinstance(d, BoundVar) else d)
  report = object.__new__(CallifyReport)   # copy.copy's result at a fifth of its time (a plain dataclass: its __dict__)
  report.__dict__.update(e.report.__dict__)
  report.cache_hit, report.seconds = True, {"cache": time.perf_counter() - t0}
  return CallifyResult(Node(Ops.CALL, dtypes.void, (e.call.src[0], *args), e.call.arg),
                       {at[i]: v for i, v in zip(e.keys, values)}, report)

def _rebind(nodes: list[Node], m: dict[Node, Node]) -> list[Node]:
  """substitute(nodes, m) for what a hit rebinds (ghost BUFFERs, views over them: chains of one-source nodes), walked
  down each chain instead of toposorting the lot; anything else takes substitute."""
  out = []
  for v in nodes:
    chain = []
    while v not in m and len(v.src) == 1 and v.op is not _CALL and v.op is not _FUNCTION: chain.append(v); v = v.src[0]
    if v not in m:
      if v.src: return substitute(nodes, m)
      out.append(nodes[len(out)]); continue   # a leaf not rebound (a CONST, an input's own BUFFER): unchanged
    v = m[v]
    for c in reversed(chain): v = c.over((v,))
    out.append(v)
  return out

def callify(*tensors, cost: str | CostModel = "bytes", schedule: str | Schedule = "saturate",
            limits: str | Limits | None = None, cache: bool = True, assigns: str = "fresh",
            fusion: str | None = None, extraction: str = "default") -> CallifyResult:
  """Turn the graph under `tensors` into one CALL by equality saturation. Pure: no tensor is changed.
  With `cache`, a graph equal to an earlier one up to its input buffers reuses that result without saturating.
  `assigns="realized"` reads an assign into a view of a realize point as tinygrad 0.14 does (see encode).
  `fusion` ("rules" | "cost", default env CALLSAT_FUSION, else "cost"): who decides which intermediates get a buffer,
  lower/'s heuristics or the time model's partition (egraph/fusion/solve.py). `extraction` ("default" | "certify" |
  "exact"): "certify" checks the extracted DAG against an exact ILP (the report's `certificate`: "optimal (proven)",
  "gap <= x %", "not optimal: ..." or "not proven (why)"); "exact" also takes the ILP's DAG where it is cheaper."""
  t0 = time.perf_counter()
  if extraction not in EXTRACTIONS: raise CallsatError(f"callify: extraction must be one of {EXTRACTIONS}, got {extraction!r}")
  model: CostModel = resolve(cost, COST_PRESETS, "cost model")
  sched: Schedule = resolve(schedule, SCHEDULE_PRESETS, "schedule")
  lim: Limits = resolve(limits if limits is not None else "default", LIMIT_PRESETS, "limits")
  roots = roots_of(tensors)
  fus = fusion_mode(fusion)
  mkey = (*[r.id for r in roots], assigns, fus, extraction, model, sched, lim) if cache else None   # the roots memo's key
  if mkey is not None and (got := _ROOTS.recall(mkey)) is not None: return _hit(*got, t0)
  t1 = time.perf_counter()
  topo = toposort(roots, enter_calls=False)
  topo_s = time.perf_counter() - t1
  def cache_key() -> _Key: return _Key((graph_key(roots, topo)[0], model, sched, lim, assigns, fus, extraction))
  key = None
  # the key costs a third of encoding: only a graph of a cached one's size can hit (a fallback needs no key at all)
  if cache and len(topo) in _SIZES:
    if (hit := _CACHE.get(key := cache_key())) is not None:
      _ROOTS.remember(mkey, topo, key, hit)
      return _hit(hit, topo, t0, topo)
  was = gc.isenabled()
  gc.disable()   # callify allocates ~10 objects per node and makes no reference cycles: the cyclic GC only costs time (~25%)
  try: res = _callify(roots, topo, topo_s, model, sched, lim, t0, assigns, fus, extraction)
  finally:
    if was: gc.enable()
  if extraction != "default" and not (r := res.report).certificate:   # no e-graph was extracted: say why nothing is certified
    r.certificate = ("optimal (proven): no decision, one form" if r.settled else
                     f"not proven (no e-graph: {r.fallback})" if r.fallback else "optimal (proven): nothing to realize")
  if cache and res.report.fallback is None:   # a fallback answers this call's time, not the graph: the next call may saturate
    key = key if key is not None else cache_key()
    with _CACHE.lock:
      if (old := _CACHE.pop(key)) is not None: _drop(key, old)
      _SIZES[len(topo)] += 1
      _CACHE.put(key, entry := _Entry.of(topo, res), ENTRY_NODE_BYTES * len(topo))
    _ROOTS.remember(mkey, topo, key, entry)
  res.report.scalars, res.inputs = scalar_args(res.call), tuple([n for n in topo if n.op is _BUFFER])
  return res

def _hit(e: _Entry, at, t0: float, topo: list[Node] | None = None) -> CallifyResult:
  """A cache hit's result (_reuse), with its scalars and the graph's own BUFFERs filled in."""
  res = _reuse(e, at, t0, topo)
  res.report.scalars, res.inputs = scalar_args(res.call), tuple([at[i] for i, _ in e.buffers])
  return res

def scalar_args(call: Node) -> dict[int, object]:
  """CALL arg slot -> the value of each 1-element argument that holds data: the front end's scalars (its CALL's fresh
  outputs hold none yet)."""
  out = {}
  for i, a in enumerate(call.src[1:]):
    if a.op is Ops.BUFFER and a.arg.size == 1 and (d := STORAGE.get(a)) is not None and d.size == 1:
      out[i] = d.reshape(-1)[0].item()
  return out

# ---- the pipeline, built once ----------------------------------------------------------------------------------------

@dataclass
class Saturation:
  """A saturated e-graph: the encoding, the Runner that holds the e-graph (its stats), and a frozen view of it."""
  enc: Encoding
  runner: Runner
  @cached_property
  def graph(self) -> EGraphView: return EGraphView(self.runner.freeze(), self.runner.egraph, self.enc, self.runner.abort_at)

def saturate(enc: Encoding, schedule: str | Schedule = "saturate", limits: str | Limits | None = None,
             hook: StepHook | None = None, abort_at: float = INF, reserve: Callable[[int], float] | None = None,
             clock: float | None = None) -> Saturation:
  """Load `enc` into a fresh e-graph and run the load, materialize and optimize phases of `schedule` under `limits`.
  With a `hook` the rules apply one at a time and the hook sees every step (the same fixpoint). Past `abort_at` a step
  boundary (and reading the e-graph) raises OutOfBudget; `reserve(e-nodes)` is the time kept for extraction; the time
  limit counts from `clock` (default: the Runner's creation)."""
  runner = Runner(resolve(schedule, SCHEDULE_PRESETS, "schedule"), hook, abort_at, reserve, clock)
  try:
    runner.load(enc.rows, encoding=enc)
    runner.materialize()
    runner.optimize(resolve(limits if limits is not None else "default", LIMIT_PRESETS, "limits"))
  except BaseException as e:   # the e-graph goes back to the pool; an OutOfBudget also carries what the run did
    if isinstance(e, OutOfBudget): e.stats = runner.stats
    runner.release(); raise
  return Saturation(enc, runner)

@dataclass
class Extraction:
  """What extraction chose: per e-node local costs, the realize classes, one e-node per class, the DAG cost; `terms`
  decodes every class reachable from the realize classes (on first use)."""
  graph: EGraphView
  costs: list[int | None]
  root_classes: list[int]
  choice: list[int]
  cost: int
  reached: list[int] | None = None   # the classes the chosen DAG reaches (extract.chosen_dag; None: one has no choice)
  certificate: Certificate | None = None   # extraction "certify" / "exact": the default choice against the ILP's
  @cached_property
  def terms(self) -> Terms: return decode(self.graph, self.choice, self.root_classes, self.reached)   # decoded on first use

EXTRACTIONS = ("default", "certify", "exact")

def extract_call(sat: Saturation, model: CostModel, deadline: float = INF, extraction: str = "default") -> Extraction:
  """Extract the CALL form callify uses: pinned (storage-form) extraction with sharing-aware refinement (skipped past
  `deadline`); past the Runner's `abort_at` it raises OutOfBudget. `extraction` "certify" also solves the exact ILP
  (egraph/engine/exact.py, at most EXACT_SECONDS and never past `deadline`) and says how the choice stands; "exact"
  takes the ILP's choice where it is cheaper."""
  g, abort_at = sat.graph, sat.runner.abort_at
  costs = g.local_costs(model, abort_at)
  root_classes = [g.class_of_id[sat.enc.key_ids[k.id]] for k in sat.enc.keys]
  allowed = g.pinned_allowed()
  choice, cost, reached = extract(g, costs, root_classes, allowed, deadline=deadline, abort_at=abort_at)
  cert = None
  if extraction != "default":
    cert = certify(cost, exact_extract(g, costs, root_classes, allowed, min(EXACT_SECONDS, deadline - time.perf_counter())))
    if extraction == "exact" and cert.improves:
      choice, cost = cert.exact.choice, cert.exact.cost
      reached = reached_classes(choice, root_classes, g.kids, g.n_classes)
  return Extraction(g, costs, root_classes, choice, cost, reached, cert)

# ---- callify under its limits: the e-graph when it fits, else the all-materialized CALL built directly -----------------

@dataclass
class Budget:
  """Callify's plan under Limits: its time runs from the end of encoding, and the time each step will take is
  predicted from how long encoding took per row (the same machine, the same moment), in multiples measured on chain
  and DAG graphs of 10k-200k nodes (bench/callify_limits.py) with headroom. Saturation, extraction and the CALL must
  end by `start + seconds`; the promise kept is `start + 1.5 * seconds + 0.3`, so the e-graph path gives up at
  `abort_at`, when there is just time left to build the all-materialized CALL instead."""
  start: float
  seconds: float
  per_row: float     # seconds encoding took per row
  rows: int
  # multiples of the encode time per row (EXTRACT: per e-node) measured 0.6-0.75 to load, 1.7-2.9 to extract and
  # build the CALL, 0.7-1.2 to build the CALL directly (notes/benchmarks.md); FIXED: a Runner's declarations, temp files
  LOAD, EXTRACT, FALLBACK, FIXED = 1.0, 3.5, 1.5, 0.02
  TOPO = 6.0   # encoding (its toposort included) takes 8.9-19x the toposort on chain and DAG graphs of 10k-200k nodes

  @classmethod
  def plan(cls, enc: Encoding, seconds: float, encode_s: float) -> Budget:
    rows = sum(len(r) for r in enc.rows.values())
    return cls(time.perf_counter(), seconds, encode_s / max(rows, 1), rows)

  @classmethod
  def no_e_graph(cls, lim: Limits, nodes: int, topo_s: float) -> str | None:
    """Why the e-graph cannot fit, seen before encoding (`nodes` in the graph, its toposort took `topo_s`): encoding
    takes at least TOPO times the toposort, the e-graph path LOAD + EXTRACT / 2 times encoding at least. None: encode
    and let the plan decide."""
    if nodes > lim.nodes: return f"node limit: {nodes} graph nodes > {lim.nodes}"
    need = cls.FIXED + cls.TOPO * topo_s * (cls.LOAD + cls.EXTRACT / 2)
    return f"time limit: predicted {need:.2f}s at least to saturate and extract, {lim.seconds:g}s allowed" if need > lim.seconds else None

  def extract_s(self, e_nodes: int) -> float: return self.EXTRACT * self.per_row * e_nodes
  def fallback_s(self) -> float: return self.FALLBACK * self.per_row * self.rows
  @property
  def abort_at(self) -> float: return self.start + 1.5 * self.seconds + 0.3 - self.fallback_s()

  def too_slow(self, e_nodes: int) -> str | None:
    """Why the e-graph path should not start (predicted past the budget), or None."""
    need = self.FIXED + self.LOAD * self.per_row * self.rows + self.extract_s(e_nodes)
    left = self.start + self.seconds - time.perf_counter()
    return f"predicted {need:.2f}s to saturate and extract, {max(left, 0):.2f}s left" if need > left else None

def loaded_size(enc: Encoding) -> int:
  """E-nodes the e-graph holds after loading and materializing `enc`: one per term row, an AFTER and a STORE per
  realize point stored (a little more than egglog counts where rows coincide)."""
  terms = sum(len(enc.rows.get(r, ())) for r in TERM_ROWS)
  return terms + 2 * len(enc.fresh)

def _callify(roots: list[Node], topo: list[Node], topo_s: float, model: CostModel, sched: Schedule, lim: Limits, t0: float,
             assigns: str, fusion: str, extraction: str) -> CallifyResult:
  why = Budget.no_e_graph(lim, len(topo), topo_s)
  if why is not None and (res := _from_graph(roots, topo, topo_s, model, sched, lim, assigns, fusion, why)): return res
  if fusion != "cost" and SHORTCUT["on"] and settled_on_graph(roots, topo) and \
     (res := _settled_plan(roots, topo, topo_s, model, sched, assigns)) is not None: return res
  enc = encode(roots, assigns, topo)
  tm, why = cost_plan(enc) if fusion == "cost" else (None, "")   # cost mode: candidates get stored forms (egraph/fusion/solve.py)
  cands = add_candidates(enc) if tm is not None else {}
  report = CallifyReport(cost_model=model.name, schedule=sched.name, graph_nodes=enc.graph_nodes, realize_points=len(enc.keys),
                         fusion="cost" if tm is not None else "rules", fusion_note=why)
  report.seconds["encode"] = time.perf_counter() - t0
  if not enc.keys:
    return CallifyResult(Node(Ops.CALL, dtypes.void, (Node(Ops.SINK, dtypes.void, ()),), CallInfo()), {}, report)
  budget = Budget.plan(enc, lim.seconds, report.seconds["encode"])
  report.baseline_cost = baseline_cost(enc, model)
  report.fresh_uids = set(enc.fresh_buffers)
  if tm is None and SHORTCUT["on"] and (why := no_decision(enc)) is not None: return _settled(enc, report, model, why)
  size = loaded_size(enc)
  if size > lim.nodes:
    return _direct(enc, report, StopReason.NODE_LIMIT, f"node limit: loading makes ~{size} e-nodes > {lim.nodes}")
  if (why := budget.too_slow(size)) is not None: return _direct(enc, report, StopReason.TIME_LIMIT, "time limit: " + why)
  sat = None
  try:
    sat = saturate(enc, sched, lim, abort_at=budget.abort_at, reserve=budget.extract_s, clock=budget.start)
    st = sat.runner.stats
    report.iterations, report.matches, report.stop_reason = st.iterations, dict(st.matches), st.stop_reason
    report.stop_nodes = st.size
    report.seconds.update(st.seconds)
    t1 = time.perf_counter()
    report.e_nodes, report.e_classes = sat.graph.n_enodes, sat.graph.n_classes
    ex = extract_call(sat, model, deadline=budget.start + lim.seconds, extraction=extraction)
    report.cost = ex.cost
    if (c := ex.certificate) is not None:
      report.certificate, report.exact_cost, report.exact_seconds = c.verdict, c.exact.cost, c.exact.seconds
      if extraction == "exact" and c.improves: report.certificate += "; the ILP's DAG taken"
    report.seconds["extract"] = time.perf_counter() - t1 - report.exact_seconds
    if report.exact_seconds: report.seconds["certify"] = report.exact_seconds
    ids = ChosenIds(sat.graph, ex.choice)
    if tm is not None:   # the partition gets what is left of the time budget
      t3 = time.perf_counter()
      ids, report.partition = partition_ids(sat.graph, ex.choice, ex.terms, ex.root_classes, enc, cands, tm,
                                            solver_deadline(t3 - t0, budget.start + lim.seconds))
      report.seconds["partition"] = time.perf_counter() - t3
    t2 = time.perf_counter()
    b = build_call(ids, ex.root_classes, enc.keys, enc.fresh_buffers, has_bound_dims(enc),
                   budget.abort_at)
    report.seconds["decode"] = time.perf_counter() - t2
  except OutOfBudget as e:
    if (st := e.stats) is not None:   # saturation stopped: what it did is reported
      report.iterations, report.matches, report.stop_nodes = st.iterations, dict(st.matches), st.size
      report.seconds.update(st.seconds)
    return _direct(enc, report, StopReason.TIME_LIMIT, f"time limit: out of time {e.where}")
  except Unextractable as e:
    if report.stop_reason is StopReason.SATURATED: raise
    return _direct(enc, report, report.stop_reason, f"{report.stop_reason}: stopped before every value had a form ({e})")
  finally:
    if sat is not None: sat.runner.release()   # nothing below reads the e-graph: it goes back to the pool
  report.stores, report.buffers, report.views = b.stores, b.buffers, b.views
  if time.perf_counter() - budget.start > lim.seconds and report.stop_reason is StopReason.SATURATED:
    report.stop_reason = StopReason.TIME_LIMIT   # saturated in time, but extraction and decoding ran past the budget
  if tm is None: return CallifyResult(b.call, b.buffer_map, report)
  call = mark(b.call, temporaries(b.call, enc, b.buffer_map))
  report.temps = len(call.arg.temps)
  return CallifyResult(call, b.buffer_map, report)

def _from_graph(roots: list[Node], topo: list[Node], topo_s: float, model: CostModel, sched: Schedule, lim: Limits,
                assigns: str, fusion: str, why: str) -> CallifyResult | None:
  """The fallback without encoding (`direct.plan`), where the toposort's time says the e-graph will not fit: None where
  the graph needs encode's path, has no realize point, or loading would fit the node limit after all."""
  t = time.perf_counter()
  if (p := plan(roots, topo, model, assigns)) is None or not p.keys: return None
  if node_limit := why.startswith("node limit"):
    if p.size <= lim.nodes: return None
    why = f"node limit: loading makes at least {p.size} e-nodes > {lim.nodes}"
  reason = StopReason.NODE_LIMIT if node_limit else StopReason.TIME_LIMIT
  report = CallifyReport(cost_model=model.name, schedule=sched.name, graph_nodes=len(topo), realize_points=len(p.keys),
                         stop_reason=reason, fallback=why + "; not encoded", cost=p.cost, baseline_cost=p.cost,
                         fresh_uids=p.fresh_uids, fusion=fusion,
                         fusion_note="no e-graph: no partition" if fusion == "cost" else "")
  report.seconds.update(toposort=topo_s, plan=time.perf_counter() - t)
  t = time.perf_counter()
  return _result(build_plan(p), report, "direct", t)

SHORTCUT = {"on": True}   # tests turn it off to compare with the e-graph's CALL

def _settled(enc: Encoding, report: CallifyReport, model: CostModel, why: str) -> CallifyResult:
  """A graph with no decision to make (`no_decision`): the CALL the e-graph would give, built without it."""
  report.settled, report.cost = why, baseline_cost(enc, model, DROPPED)
  t = time.perf_counter()
  return _result(materialized_call(enc, drop=True), report, "settled", t)

def _settled_plan(roots: list[Node], topo: list[Node], topo_s: float, model: CostModel, sched: Schedule,
                  assigns: str) -> CallifyResult | None:
  """`_settled` without encoding, for a graph `settled_on_graph` passes: `plan(drop=True)` is `materialized_call(enc,
  drop=True)` over its own fresh buffers (None: a form only encode takes, or no realize point)."""
  t = time.perf_counter()
  if (p := plan(roots, topo, model, assigns, drop=True)) is None or not p.keys: return None
  report = CallifyReport(cost_model=model.name, schedule=sched.name, graph_nodes=len(topo), realize_points=len(p.keys),
                         cost=p.cost, baseline_cost=p.cost + p.dropped, fresh_uids=p.fresh_uids,
                         settled="no optimize rule matches (read off the graph): the all-stored form is the only one")
  report.seconds.update(toposort=topo_s, plan=time.perf_counter() - t)
  t = time.perf_counter()
  return _result(build_plan(p), report, "settled", t)

def _direct(enc: Encoding, report: CallifyReport, reason: StopReason, why: str) -> CallifyResult:
  """The fallback: the all-materialized CALL built from the Encoding, reported with why."""
  report.stop_reason, report.fallback, report.cost = reason, why, report.baseline_cost
  t = time.perf_counter()
  return _result(materialized_call(enc), report, "direct", t)

def _result(b, report: CallifyReport, phase: str, t: float) -> CallifyResult:
  """The CALL `b` built since `t`: its counts and the build's time (as `phase`) into `report`."""
  report.seconds[phase] = time.perf_counter() - t
  report.stores, report.buffers, report.views = b.stores, b.buffers, b.views
  return CallifyResult(b.call, b.buffer_map, report)
