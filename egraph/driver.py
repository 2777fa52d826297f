"""The callify driver: encode -> saturate -> extract -> decode -> number PARAMs -> buffer_map -> CallifyResult.

`saturate` (encode -> Runner -> load, materialize, optimize) and `extract_call` (freeze -> EGraphView -> costs ->
extract -> decode) are the pipeline's two halves; explain, export and the soundness checker call them too, so every
tool sees the e-graph and the extraction callify sees.
E-class identity replaces tinygrad's tags: each realize point (an original node) names the e-class of its realized
form, so after extraction its storage is read straight off the chosen term."""
from __future__ import annotations
import dataclasses, gc, time
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from egraph.ir import Node, Ops, GroupOp, ParamArg, CallInfo, toposort, substitute, new_buffer, map_args, const_key
from egraph.dtype import dtypes
from egraph.errors import CallsatError, EngineError, ShapeError
from egraph.symbolic import BoundVar, Variable, dims_in, map_dims
from egraph.encode import encode, Encoding
from egraph.runner import Runner, Limits, Schedule, StepHook, StopReason, LIMIT_PRESETS, SCHEDULE_PRESETS, resolve
from egraph.cost import CostModel, COST_PRESETS
from egraph.extract import EGraphView, extract, decode, baseline_cost
from egraph.report import CallifyReport

@dataclass
class CallifyResult:
  call: Node                      # CALL(SINK(roots...), *args)
  buffer_map: dict[Node, Node]    # original node -> storage view
  report: CallifyReport

def storage_view(n: Node) -> Node:
  """The storage a realized term lives in: AFTERs stripped from the view chain, reshapes collapsed."""
  chain = []
  while n.op is not Ops.BUFFER and n.op is not Ops.PARAM:
    if n.op is Ops.AFTER: n = n.src[0]; continue
    if n.op not in GroupOp.Movement and n.op not in (Ops.SLICE, Ops.MULTI):
      raise EngineError(f"extraction chose a non-storage form {n.op.name} for a realized value")
    chain.append(n); n = n.src[0]
  for m in reversed(chain):
    if m.op is Ops.RESHAPE: n = n.src[0].reshape(m.arg) if n.op is Ops.RESHAPE else n.reshape(m.arg)
    else: n = Node(m.op, m.dtype, (n,), m.arg)
  return n

def parameterize(body: Node) -> tuple[Node, list[Node]]:
  """Replace global BUFFERs and whole SLICE(BUFFER)s by PARAM(slot) in first-visit pre-order (spec §4.4), then bound
  symbolic dimensions by their variables, passing each value as a trailing BIND arg: the body is the cache key."""
  args, slots, seen, stack = [], {}, set(), [body]
  while stack:
    n = stack.pop()
    if n.id in seen: continue
    seen.add(n.id)
    if n.op is Ops.BUFFER or (n.op is Ops.SLICE and n.src[0].op is Ops.BUFFER):
      slots[n] = Node(Ops.PARAM, n.dtype, (), ParamArg(len(args), n.shape, n.device, shard=isinstance(n.device, tuple)))
      args.append(n); continue
    stack.extend(reversed(n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src))
  body = substitute([body], slots)[0]
  bound: dict = {}
  for n in toposort([body], enter_calls=False):
    for d in dims_in(_dims_arg(n)):
      if isinstance(d, BoundVar):
        if bound.setdefault(d.var.key, d) != d:
          raise ShapeError(f"callify: variable {d.var.name} is bound to {int(bound[d.var.key])} and {int(d)} in one graph")
  if bound: body = map_args([body], lambda d: d.var if isinstance(d, BoundVar) else d)[0]
  return body, args + [Node(Ops.BIND, dtypes.int32, (), (d.var, int(d))) for d in bound.values()]

def _dims_arg(n: Node):
  """The part of a node's arg that can hold symbolic dimensions."""
  return n.arg.shape if n.op is Ops.PARAM else () if n.op in (Ops.CALL, Ops.FUNCTION, Ops.BIND) else n.arg

def bindings(call: Node) -> tuple[Node, dict]:
  """(the CALL without its BIND args and with plain sizes for its variables, {variable key: value}): what runs."""
  for a in call.src[1:]:
    if a.op is Ops.BIND and not (a.src == () and isinstance(a.arg, tuple) and isinstance(a.arg[0], Variable)):
      raise CallsatError(f"CALL: a BIND argument must bind a Variable to a value, got {a.arg!r}")
  binds = {a.arg[0].key: int(a.arg[0].bind(a.arg[1])) for a in call.src[1:] if a.op is Ops.BIND}
  if not binds: return call, {}
  body = map_args([call.src[0]], lambda d: binds.get(d.key, d) if isinstance(d, Variable) else d)[0]
  return Node(Ops.CALL, dtypes.void, (body, *(a for a in call.src[1:] if a.op is not Ops.BIND)), call.arg), binds

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
  topo: list[Node]           # the graph it was computed for, in canonical order
  result: CallifyResult
  fresh: set[int]            # uids of the buffers callify minted for it

_CACHE: OrderedDict = OrderedDict()
CACHE_SIZE = 32

def graph_key(roots: list[Node]) -> tuple[tuple, list[Node]]:
  """A key equal for graphs that differ only in which input buffers they read (buffers are named by position)."""
  topo = toposort(roots, enter_calls=False)
  pos = {n.id: i for i, n in enumerate(topo)}
  parts = tuple((n.op, n.dtype, (n.arg.size, n.arg.device) if n.op is Ops.BUFFER else
                 (n.arg, n.src[0].id) if n.op in (Ops.CALL, Ops.FUNCTION) else const_key(n.arg) if n.op is Ops.CONST else
                 map_dims(n.arg, _unbind),
                 tuple(pos[s.id] for s in (n.src[1:] if n.op in (Ops.CALL, Ops.FUNCTION) else n.src))) for n in topo)
  return (parts, tuple(pos[r.id] for r in roots)), topo

def _unbind(d): return d.var if isinstance(d, BoundVar) else d

def _reuse(e: _Entry, topo: list[Node], t0: float) -> CallifyResult:
  """The cached result rebound to this graph's buffers and variable values, with freshly minted output buffers."""
  m = {o: n for o, n in zip(e.topo, topo) if o.op is Ops.BUFFER and o is not n}
  binds: dict = {}
  for n in topo: dims_in(_dims_arg(n), binds)
  new_value = {d.var.key: d for d in binds if isinstance(d, BoundVar)}
  rebind = lambda d: new_value.get(d.var.key, d) if isinstance(d, BoundVar) else d
  old = e.result
  for v in [*old.call.src[1:], *old.buffer_map.values()]:
    for b in toposort([v]):
      if b.op is Ops.BUFFER and b.arg.uid in e.fresh and b not in m: m[b] = new_buffer(b.arg.size, b.dtype, b.arg.device)
  pos = {o.id: i for i, o in enumerate(e.topo)}
  args = [Node(Ops.BIND, a.dtype, (), (a.arg[0], int(new_value[a.arg[0].key]))) if a.op is Ops.BIND else a
          for a in substitute(list(old.call.src[1:]), m)]
  values = map_args(substitute(list(old.buffer_map.values()), m), rebind)
  report = dataclasses.replace(old.report, cache_hit=True, seconds={"cache": time.perf_counter() - t0})
  return CallifyResult(Node(Ops.CALL, dtypes.void, (old.call.src[0], *args), old.call.arg),
                       {topo[pos[k.id]]: v for k, v in zip(old.buffer_map, values)}, report)

def callify(*tensors, cost: str | CostModel = "bytes", schedule: str | Schedule = "saturate",
            limits: str | Limits | None = None, cache: bool = True) -> CallifyResult:
  """Turn the graph under `tensors` into one CALL by equality saturation. Pure: no tensor is changed.
  With `cache`, a graph equal to an earlier one up to its input buffers reuses that result without saturating."""
  t0 = time.perf_counter()
  model: CostModel = resolve(cost, COST_PRESETS, "cost model")
  sched: Schedule = resolve(schedule, SCHEDULE_PRESETS, "schedule")
  lim: Limits = resolve(limits if limits is not None else "default", LIMIT_PRESETS, "limits")
  roots = roots_of(tensors)
  if cache:
    gkey, topo = graph_key(roots)
    key = (gkey, model, sched, lim)
    if (hit := _CACHE.get(key)) is not None:
      _CACHE.move_to_end(key)
      return _reuse(hit, topo, t0)
  was = gc.isenabled()
  gc.disable()   # callify allocates ~10 objects per node and makes no reference cycles: the cyclic GC only costs time (~25%)
  try: res = _callify(roots, model, sched, lim, t0)
  finally:
    if was: gc.enable()
  if cache:
    _CACHE[key] = _Entry(topo, res, res.report.fresh_uids)
    while len(_CACHE) > CACHE_SIZE: _CACHE.popitem(last=False)
  return res

# ---- the pipeline, built once ----------------------------------------------------------------------------------------

@dataclass
class Saturation:
  """A saturated e-graph: the encoding, the Runner that holds the e-graph (its stats), and a frozen view of it."""
  enc: Encoding
  runner: Runner
  @cached_property
  def graph(self) -> EGraphView: return EGraphView(self.runner.freeze(), self.runner.egraph, self.enc)

def saturate(enc: Encoding, schedule: str | Schedule = "saturate", limits: str | Limits | None = None,
             hook: StepHook | None = None) -> Saturation:
  """Load `enc` into a fresh e-graph and run the load, materialize and optimize phases of `schedule` under `limits`.
  With a `hook` the rules apply one at a time and the hook sees every step (the same fixpoint)."""
  runner = Runner(resolve(schedule, SCHEDULE_PRESETS, "schedule"), hook)
  runner.load(enc.rows, encoding=enc)
  runner.materialize()
  runner.optimize(resolve(limits if limits is not None else "default", LIMIT_PRESETS, "limits"))
  return Saturation(enc, runner)

@dataclass
class Extraction:
  """What extraction chose: per e-node local costs, the realize classes, one e-node per class, the DAG cost, and the
  decoded term of every class reachable from the realize classes."""
  costs: list[int | None]
  root_classes: list[int]
  choice: list[int]
  cost: int
  terms: dict[int, Node]

def extract_call(sat: Saturation, model: CostModel, deadline: float = float("inf")) -> Extraction:
  """Extract the CALL form callify uses: pinned (storage-form) extraction with sharing-aware refinement (skipped past
  `deadline`)."""
  g = sat.graph
  costs = g.local_costs(model)
  root_classes = [g.class_of_id[sat.enc.key_ids[k.id]] for k in sat.enc.keys]
  choice, cost = extract(g, costs, root_classes, g.pinned_allowed(), deadline=deadline)
  return Extraction(costs, root_classes, choice, cost, decode(g, choice, root_classes))

def _callify(roots: list[Node], model: CostModel, sched: Schedule, lim: Limits, t0: float) -> CallifyResult:
  enc = encode(roots)
  report = CallifyReport(cost_model=model.name, schedule=sched.name, graph_nodes=len(toposort(roots, enter_calls=False)),
                         realize_points=len(enc.keys))
  report.seconds["encode"] = time.perf_counter() - t0
  if not enc.keys:
    return CallifyResult(Node(Ops.CALL, dtypes.void, (Node(Ops.SINK, dtypes.void, ()),), CallInfo()), {}, report)
  sat = saturate(enc, sched, lim)
  st = sat.runner.stats
  report.iterations, report.matches, report.stop_reason = st.iterations, dict(st.matches), st.stop_reason
  report.seconds.update(st.seconds)

  t1 = time.perf_counter()
  ex = extract_call(sat, model, deadline=sat.runner.clock + lim.seconds)
  report.cost, root_classes, terms = ex.cost, ex.root_classes, ex.terms
  report.e_nodes, report.e_classes = sat.graph.n_enodes, sat.graph.n_classes
  report.baseline_cost = baseline_cost(enc, model)
  report.seconds["extract"] = time.perf_counter() - t1

  t2 = time.perf_counter()
  realized = [terms[c] for c in root_classes]
  buffer_map = {k: storage_view(t) for k, t in zip(enc.keys, realized)}
  assigns = [n for n in toposort(realized, enter_calls=False) if n.op is Ops.AFTER]
  body, args = parameterize(Node(Ops.SINK, dtypes.void, tuple(assigns)))
  call = Node(Ops.CALL, dtypes.void, (body, *args), CallInfo())
  report.stores = sum(1 for n in toposort([body], enter_calls=False) if n.op is Ops.STORE)
  report.buffers = sum(1 for a in args if a.op is Ops.BUFFER and a.arg.uid in enc.fresh_buffers)
  report.views = sum(1 for t in realized if t.op is not Ops.AFTER and any(m.op is Ops.SLICE for m in _chain(t)))
  report.seconds["decode"] = time.perf_counter() - t2
  report.fresh_uids = set(enc.fresh_buffers)
  if time.perf_counter() - sat.runner.clock > lim.seconds and report.stop_reason is StopReason.SATURATED:
    report.stop_reason = StopReason.TIME_LIMIT   # saturated in time, but extraction and decoding ran past the budget
  return CallifyResult(call, buffer_map, report)

def _chain(n: Node):
  while True:
    yield n
    if not n.src or (n.op not in GroupOp.Movement and n.op not in (Ops.SLICE, Ops.MULTI)): return
    n = n.src[0]
