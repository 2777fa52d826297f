"""Ordered vs saturated: run a corpus of graphs under equality saturation and under rule orders (the reference pass's
order, materialize-first, and K random orders, each in the ordered destructive mode of egraph/engine/runner.py), and report
per graph the extracted cost, e-graph size, time, and whether the result depends on the order.

`callsat order` is the command line for this module. Sweeps scale out over processes with `workers`, or over a Ray
cluster with `ray` (an address; needs `pip install -e '.[ray]'`). The corpus is built in (demo models, generated
graphs) or a corpus file (egraph/ir/corpus.py, e.g. graphs captured from tinygrad). Only costs are compared: no graph is
executed, so graphs with OPAQUE host ops (which no executor runs) sweep like any other."""
from __future__ import annotations
import csv, io, json, logging, math, multiprocessing, os, statistics, time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, asdict
import numpy as np
from egraph.ir.errors import CallsatError
from egraph.ir.ops import Node, Ops, const, new_buffer, toposort
from egraph.ir.dtype import dtypes
from egraph.ir.storage import Storage
from egraph.engine.runner import SCHEDULE_PRESETS, ordered_schedule
from egraph.engine.driver import callify
from egraph.fusion.solve import fusion_mode
from egraph.fusion.milp import MIP_GAP
from egraph.fusion import candidates as solver_settings
from egraph.frontend.models import MODELS
from egraph.ir import corpus as corpus_file
from rules.registry import RULES

ORDERABLE_PHASES = ("materialize", "optimize")

def orderable_rules() -> list[str]:
  return [r.name for r in RULES.values() if r.phase in ORDERABLE_PHASES]

def random_orders(k: int, seed: int = 0) -> list[tuple[str, ...]]:
  """K random permutations of every materialize and optimize rule (deterministic in `seed`)."""
  rng = np.random.default_rng(seed)
  names = orderable_rules()
  return [tuple(names[i] for i in rng.permutation(len(names))) for _ in range(k)]

# ---- the corpus ------------------------------------------------------------------------------------------------------

def _buf(storage, rng, shape, device="CPU"):
  b = new_buffer(math.prod(shape), dtypes.float32, device)
  storage.set_data(b, rng.standard_normal(math.prod(shape)).astype(np.float32))
  return b.reshape(shape)

def generated_graph(seed: int, steps: int = 12):
  """A deterministic random graph (numpy rng, no hypothesis) rich in what orders disagree on: contiguous views of
  buffers and of realized values, CONTIGUOUS of CONTIGUOUS, assigns into buffers then CONTIGUOUS, assigns into computed
  values, DETACH markers. Returns (roots, storage)."""
  rng = np.random.default_rng(seed)
  storage = Storage()
  pool = [_buf(storage, rng, (4, 8)) for _ in range(1 + seed % 2)]
  c2 = lambda x: const(2.0, dtypes.float32, "CPU").reshape((1,) * len(x.shape)).expand(x.shape)
  for _ in range(steps):
    x = pool[rng.integers(len(pool))]
    k = rng.choice(["alu", "alu", "view", "view", "contig", "contig2", "assign", "assign_computed", "detach", "reduce"])
    if k == "alu": y = Node(Ops.ADD if rng.random() < .5 else Ops.MUL, None, (x, c2(x)))
    elif k == "view":
      if x.shape[0] < 2: continue
      a = int(rng.integers(0, x.shape[0] - 1))
      y = x.shrink(((a, x.shape[0]),) + tuple((0, d) for d in x.shape[1:]))
      y = (y if y.has_buffer_identity() else y).contiguous() if not y.has_buffer_identity() else Node(Ops.DETACH, y.dtype, (y,)).contiguous()
    elif k == "contig": y = x.contiguous() if not x.has_buffer_identity() and x.op is not Ops.CONTIGUOUS else Node(Ops.NEG, None, (x,)).contiguous()
    elif k == "contig2": y = Node(Ops.NEG, None, (x,)).contiguous().contiguous()
    elif k == "assign":
      t = _buf(storage, rng, x.shape)
      y = t.after(t.store(Node(Ops.ADD, None, (t, x)))).contiguous()
    elif k == "assign_computed":
      t = Node(Ops.MUL, None, (x, c2(x)))
      y = t.after(t.store(Node(Ops.ADD, None, (x, c2(x)))))
    elif k == "detach": y = Node(Ops.DETACH, x.dtype, (Node(Ops.ADD, None, (x, x)),))
    else:
      if len(x.shape) < 2: continue
      y = Node(Ops.REDUCE, None, (x,), (Ops.ADD, (len(x.shape) - 1,)))
    pool.append(y)
  roots = list(dict.fromkeys(pool[-3:]))
  return roots, storage

def model_graph(name: str):
  """The roots of a named demo model (egraph/frontend/models.py): its output tensor's graph."""
  if name not in MODELS: raise CallsatError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
  out, _ = MODELS[name]()
  return [out.node], None

def corpus_names(generated: int = 8) -> list[str]:
  return [f"model:{m}" for m in sorted(MODELS)] + [f"gen:{i}" for i in range(generated)]

def check_name(name: str) -> str:
  """`name` if it is a corpus entry (model:NAME of a demo model, gen:SEED with SEED >= 0), else CallsatError."""
  kind, _, arg = name.partition(":")
  if kind == "model" and arg in MODELS: return name
  if kind == "gen" and arg.isdigit(): return name
  raise CallsatError(f"corpus entry {name!r}: expected model:NAME ({', '.join(sorted(MODELS))}) or gen:SEED (an integer >= 0)")

def build(name: str):
  kind, _, arg = check_name(name).partition(":")
  return model_graph(arg) if kind == "model" else generated_graph(int(arg))

# ---- one graph under every schedule ---------------------------------------------------------------------------------

@dataclass
class Run:
  schedule: str
  cost: int
  e_nodes: int
  seconds: float
  stores: int
  views: int
  iterations: int
  predicted_s: float | None = None   # fusion="cost": the chosen partition's predicted run time (egraph/fusion/solve.py)
  extract_ms: float = 0.0            # the default extraction's time
  certificate: str = ""              # certify: the default extraction against the exact ILP (egraph/engine/exact.py)
  exact_cost: int | None = None      # certify: the ILP's DAG cost (None: not solved)
  exact_ms: float = 0.0              # certify: the ILP's build and solve time

@dataclass
class GraphResult:
  graph: str
  graph_nodes: int
  baseline_cost: int
  saturated: Run
  reference: Run
  materialize_first: Run
  orders: list[Run] = field(default_factory=list)

  @property
  def order_costs(self) -> list[int]: return [r.cost for r in self.orders]
  @property
  def order_dependent(self) -> bool:
    return len({r.cost for r in self.orders + [self.reference, self.materialize_first]}) > 1
  @property
  def saturated_best(self) -> bool:
    return all(self.saturated.cost <= r.cost for r in self.orders + [self.reference, self.materialize_first])

  def predicted(self) -> dict:
    """fusion="cost": each schedule's predicted run time (us) and how saturation stands against the orders' best and
    median (order / saturated: above 1, saturation's partition is predicted faster)."""
    us = lambda r: None if r.predicted_s is None else round(r.predicted_s * 1e6, 3)
    ps = sorted(p for p in (r.predicted_s for r in self.orders + [self.reference]) if p is not None)
    sat, med = self.saturated.predicted_s, statistics.median(ps) if ps else None
    ratio = lambda p: round(p / sat, 4) if sat else None
    return {"saturated_us": us(self.saturated), "reference_us": us(self.reference),
            "materialize_first_us": us(self.materialize_first),
            "orders_best_us": round(ps[0] * 1e6, 3) if ps else None,
            "orders_median_us": round(med * 1e6, 3) if ps else None,
            "orders_worst_us": round(ps[-1] * 1e6, 3) if ps else None,
            "best_order_vs_saturated": ratio(ps[0]) if ps else None,
            "median_order_vs_saturated": ratio(med) if ps else None,
            "time_order_dependent": len({round(p, 12) for p in ps + [sat]}) > 1}

  def row(self) -> dict:
    oc = self.order_costs or [self.reference.cost]
    return {"graph": self.graph, "graph_nodes": self.graph_nodes, "baseline_cost": self.baseline_cost,
            "saturated_cost": self.saturated.cost, "reference_cost": self.reference.cost,
            "materialize_first_cost": self.materialize_first.cost, "orders": len(self.orders),
            "order_cost_min": min(oc), "order_cost_max": max(oc), "distinct_order_costs": len(set(oc)),
            "orders_matching_saturated": sum(c == self.saturated.cost for c in oc),
            "order_dependent": self.order_dependent, "saturated_best": self.saturated_best,
            "saturated_e_nodes": self.saturated.e_nodes, "reference_e_nodes": self.reference.e_nodes,
            "saturated_ms": round(1e3 * self.saturated.seconds, 2), "reference_ms": round(1e3 * self.reference.seconds, 2),
            "orders_mean_ms": round(1e3 * sum(r.seconds for r in self.orders) / max(1, len(self.orders)), 2),
            **(self.predicted() if self.saturated.predicted_s is not None else {}),
            **({"certificate": self.saturated.certificate, "exact_cost": self.saturated.exact_cost,
                "extract_ms": self.saturated.extract_ms, "exact_ms": self.saturated.exact_ms}
               if self.saturated.certificate else {})}

def _run(roots, schedule, fusion: str | None = None, extraction: str = "default") -> tuple[Run, object]:
  t0 = time.perf_counter()
  res = callify(*roots, schedule=schedule, cache=False, fusion=fusion, extraction=extraction)
  rep = res.report
  return Run(rep.schedule, rep.cost, rep.e_nodes, time.perf_counter() - t0 - rep.exact_seconds, rep.stores, rep.views,
             rep.iterations, rep.partition.predicted_s if rep.partition is not None else None,
             round(1e3 * rep.seconds.get("extract", 0.0), 2), rep.certificate, rep.exact_cost,
             round(1e3 * rep.exact_seconds, 2)), rep

def run_graph(name: str, k: int = 8, seed: int = 0, record: str | None = None, fusion: str | None = None,
              certify: bool = False, solver_s: float | None = None) -> GraphResult:
  """`name` (a corpus entry, or the graph of a corpus-file `record`) under saturation, the reference order,
  materialize-first and `k` random orders. `fusion` (default: env CALLSAT_FUSION): with "cost" the candidates' stored
  forms (store_candidate) join the orders, last in the reference and materialize-first orders (tinygrad's pass has no
  such rule: without it they could store no intermediate, and their partition would recompute everything), and each
  run reports its partition's predicted time; `solver_s` gives each run's partition search at least that long (callify
  gives it a share of its own time, so under load the same graph would get another partition: a study compares
  schedules, not machine noise). `certify`: the saturated run's extraction is checked against the exact ILP (its
  verdict, cost and time in the result)."""
  roots = corpus_file.loads(record).roots if record is not None else build(name)[0]
  fusion = fusion_mode(fusion)
  fixed = {n: SCHEDULE_PRESETS[n] if fusion != "cost" else ordered_schedule(SCHEDULE_PRESETS[n].ordered + ("store_candidate",), name=n)
           for n in ("reference", "materialize_first")}
  schedule, floor = "saturate", solver_settings.SOLVER_FLOOR_S
  if solver_s is not None: solver_settings.SOLVER_FLOOR_S = solver_s
  try:   # an engine error names the graph and the schedule: in a sweep of hundreds it is otherwise anonymous
    sat, rep = _run(roots, schedule, fusion, "certify" if certify else "default")
    ref, _ = _run(roots, schedule := fixed["reference"], fusion)
    mf, _ = _run(roots, schedule := fixed["materialize_first"], fusion)
    orders = [_run(roots, schedule := ordered_schedule(o, name=f"random{i}"), fusion)[0] for i, o in enumerate(random_orders(k, seed))]
  except CallsatError as e:
    raise CallsatError(f"graph {name!r}, schedule {getattr(schedule, 'name', schedule)}: {type(e).__name__}: {_line(e)}") from e
  finally: solver_settings.SOLVER_FLOOR_S = floor
  return GraphResult(name, len(toposort(roots, enter_calls=False)), rep.baseline_cost, sat, ref, mf, orders)

@dataclass
class Failure:
  """A graph whose run raised a CallsatError, in a sweep told to go on (`failures`)."""
  graph: str
  error: str

def _job(args):
  keep, *job = args
  try: return run_graph(*job)
  except CallsatError as e:
    if keep: return Failure(job[0], _line(e))
    raise

def sweep(names: list[str], k: int = 8, seed: int = 0, workers: int = 1, ray: str | None = None, progress=None,
          corpus: str | None = None, failures: list | None = None, fusion: str | None = None,
          certify: bool = False, solver_s: float | None = None) -> list[GraphResult]:
  """Every corpus entry (with `corpus`, a file: graph names in it); with workers > 1 the entries run in separate
  processes, with `ray` (an address) as tasks on a Ray cluster. Either way a job is a corpus name, or a corpus file's
  record text: each worker builds its own graph (egglog objects do not pickle) and sends back a GraphResult. Results
  come back in the order of `names`; `progress(done, total, result)` is called as each graph finishes (in finishing
  order for workers), so long sweeps show life. The first graph that raises stops the sweep, unless `failures` is a
  list: then each such graph is appended to it as a Failure (also passed to `progress`) and left out of the results."""
  keep = failures is not None
  if corpus is not None:
    # an unknown name: one line, before any work
    jobs = [(keep, n, k, seed, line, fusion, certify, solver_s) for n, line in corpus_file.pick(corpus, names)]
  else:
    for n in names: check_name(n)      # a bad entry fails before hours of work, not after
    jobs = [(keep, n, k, seed, None, fusion, certify, solver_s) for n in names]
  note = progress or (lambda i, n, r: None)
  if ray is not None: out = sweep_ray(jobs, ray, note)
  elif workers <= 1:
    out = []
    for j in jobs: out.append(_job(j)); note(len(out), len(jobs), out[-1])
  else:
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
      futs = [ex.submit(_job, j) for j in jobs]
      for i, f in enumerate(as_completed(futs)): note(i + 1, len(jobs), f.result())
      out = [f.result() for f in futs]
  if keep: failures.extend(r for r in out if isinstance(r, Failure))
  return [r for r in out if not isinstance(r, Failure)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout (egraph/tools/ -> ../..)
PACKAGE_DIRS = [os.path.join(ROOT, p) for p in ("egraph", "rules", "lower")]   # shipped to a Ray cluster's workers
RAY_INSTALL = "the --ray sweep needs ray: pip install -e '.[ray]' (or pip install ray)"

def require_ray():
  try:
    import ray
    return ray
  except ImportError as e:
    raise CallsatError(RAY_INSTALL) from e

def sweep_ray(jobs: list[tuple], address: str, progress=None, job=_job) -> list:
  """One Ray task per job (a graph and its order set), gathered in job order. `address` is what `ray.init` takes:
  `ray://host:10001` (Ray Client), `auto` (the cluster this machine belongs to) or `local` (start a local instance
  for this sweep). If this process is already connected to Ray, that connection is used and left open; otherwise the
  connection made here is shut down afterwards. Except for `local`, the driver's egraph, rules and lower packages are
  shipped to the cluster (runtime_env py_modules), so its workers run this code; they need egglog, numpy and llvmlite
  installed. A task that fails other than with a CallsatError (its worker died, ran out of memory, raised a bug) is
  named by its graph: a Failure when the jobs keep going (`failures` in sweep), else a CallsatError; tasks are not
  retried (a graph that kills its worker would kill the next). `job`: what each task runs (tests pass one that dies)."""
  ray = require_ray()
  started = False
  if not ray.is_initialized():
    kw = {"include_dashboard": False} if address == "local" else {"runtime_env": {"py_modules": PACKAGE_DIRS}}
    # ray.init fails in many ways (no ray[client] for ray://, a runtime-env hook that cannot pickle, no cluster): each
    # is one line, not a traceback from deep inside ray
    try: ray.init(address=address, logging_level=logging.WARNING, **kw)
    except ConnectionError as e: raise CallsatError(f"--ray {address}: cannot connect to a Ray cluster: {_line(e)}") from e
    except Exception as e: raise CallsatError(f"--ray {address}: ray {getattr(ray, '__version__', '?')} failed to start: "
                                              f"{type(e).__name__}: {_line(e)} ({RAY_INSTALL})") from e
    started = True
  try:
    try:
      task = ray.remote(max_retries=0)(job)
      refs = [task.remote(j) for j in jobs]
      which = {r: j for r, j in zip(refs, jobs)}
      got, left = {}, list(refs)
      while left:
        done, left = ray.wait(left, num_returns=1)
        got[done[0]] = r = _gathered(ray, done[0], which[done[0]], address)
        if progress is not None: progress(len(refs) - len(left), len(refs), r)
      return [got[r] for r in refs]
    except CallsatError: raise
    except Exception as e: raise CallsatError(f"--ray {address}: {type(e).__name__}: {_line(e)}") from e
  finally:
    if started: ray.shutdown()

def _gathered(ray, ref, job: tuple, address: str):
  """A finished task's result; its failure as the local sweep would say it (a CallsatError), or named by its graph."""
  try: return ray.get(ref)
  except ray.exceptions.RayTaskError as e:
    if isinstance(e.cause, CallsatError): raise e.cause from None   # a bad corpus entry: the same error as locally
    why = f"the task raised {type(e.cause).__name__}: {_line(e.cause)}"
  except ray.exceptions.RayError as e:   # the worker died (killed, crashed, out of memory), the node went away
    why = f"its worker died ({type(e).__name__}: {_line(e)})"
  keep, name = job[0], job[1]
  if keep: return Failure(name, why)
  raise CallsatError(f"--ray {address}: graph {name!r}: {why}")

def _line(e: BaseException) -> str:
  """The first line of an exception's message (ray's run to pages)."""
  return (str(e).strip().splitlines() or [""])[0][:300]

# ---- saturation against one order, in words (callsat demo) -----------------------------------------------------------

def _storage_kind(v: Node, fresh: set[int]) -> str:
  chain = [v]
  while v.src and v.op not in (Ops.BUFFER, Ops.PARAM): v = v.src[0]; chain.append(v)
  if v.op is Ops.BUFFER and v.arg.uid in fresh: return "a copy stored in a fresh buffer"
  if any(n.op is Ops.SLICE for n in chain): return "a zero-copy view of existing storage"
  return "existing storage itself (no copy)"

def versus_order(sat, other, order: str = "reference") -> str:
  """How saturation's CallifyResult `sat` stands against `other`, the same graph under a rule order: the costs and
  counts, and each realize point whose storage differs, in words."""
  a, b = sat.report, other.report
  if a.cost == b.cost:
    return f"  vs order  the {order} order reaches the same cost ({b.cost}): no decision differs on this graph"
  word = "less" if a.cost < b.cost else "more"
  counts = lambda r: (f"{r.stores} stores, {r.buffers} fresh buffers" + (f" ({r.temps} temporaries)" if r.temps else "")
                      + f", {r.views} views")
  lines = [f"  vs order  the {order} order (applied one rule at a time, destructively, as tinygrad's pass does): cost "
           f"{b.cost} ({counts(b)}); saturation {a.cost} ({counts(a)}): {abs(1 - a.cost / b.cost):.0%} {word}"]
  for key, v in sat.buffer_map.items():
    if (w := other.buffer_map.get(key)) is None: continue
    ka, kb = _storage_kind(v, a.fresh_uids), _storage_kind(w, b.fresh_uids)
    if ka != kb:
      lines.append(f"            {key.op.name} {key.dtype.name} {tuple(key.shape)}: {kb} under the {order} order; {ka} under saturation")
  return "\n".join(lines)

# ---- output ----------------------------------------------------------------------------------------------------------

COLUMNS = ("graph", "graph_nodes", "baseline_cost", "saturated_cost", "reference_cost", "materialize_first_cost",
           "order_cost_min", "order_cost_max", "distinct_order_costs", "orders_matching_saturated", "order_dependent",
           "saturated_e_nodes", "saturated_ms", "reference_ms", "orders_mean_ms")

def table(results: list[GraphResult]) -> str:
  rows = [r.row() for r in results]
  heads = ["graph", "nodes", "baseline", "saturated", "reference", "mat-first", "orders min..max", "distinct",
           "=sat", "depends", "e-nodes", "sat ms", "ref ms"]
  body = [[r["graph"], r["graph_nodes"], r["baseline_cost"], r["saturated_cost"], r["reference_cost"],
           r["materialize_first_cost"], f'{r["order_cost_min"]}..{r["order_cost_max"]}', r["distinct_order_costs"],
           f'{r["orders_matching_saturated"]}/{r["orders"]}', "yes" if r["order_dependent"] else "no",
           r["saturated_e_nodes"], r["saturated_ms"], r["reference_ms"]] for r in rows]
  if any("saturated_us" in r for r in rows):   # fusion cost: the partitions' predicted times
    heads += ["sat us", "ref us", "orders us best/median/worst"]
    for b, r in zip(body, rows):
      b += [r.get("saturated_us", "-"), r.get("reference_us", "-"),
            f'{r.get("orders_best_us", "-")}/{r.get("orders_median_us", "-")}/{r.get("orders_worst_us", "-")}']
  widths = [max(len(str(x)) for x in col) for col in zip(heads, *body)]
  fmt = lambda xs: "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(xs, widths)))
  return "\n".join([fmt(heads), fmt(["-" * w for w in widths])] + [fmt(b) for b in body])

def predicted_summary(results: list[GraphResult]) -> str:
  """fusion="cost": over the sweep, on how many graphs the predicted time depends on the order, and saturation's
  predicted time against the best, median and worst order (geomeans of order / saturated)."""
  rows = [r.predicted() for r in results if r.saturated.predicted_s]
  if not rows: return "fusion cost: no graph had a partition to price"
  geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
  best = [x["best_order_vs_saturated"] for x in rows if x["best_order_vs_saturated"]]
  med = [x["median_order_vs_saturated"] for x in rows if x["median_order_vs_saturated"]]
  worst = [x["orders_worst_us"] / x["saturated_us"] for x in rows if x["orders_worst_us"] and x["saturated_us"]]
  faster = [b for b in best if b < 1 - 1e-9]
  return (f"fusion cost: predicted time depends on the order on {sum(x['time_order_dependent'] for x in rows)}/{len(rows)} "
          f"graphs; order / saturated, geomean: best order {geo(best):.3f}x, median {geo(med):.3f}x, worst {geo(worst):.3f}x; "
          f"an order predicted faster than saturation on {len(faster)}"
          + (f" (at most {1 - min(faster):.1%} faster; the partition's MILP stops within {MIP_GAP:.0%} of its bound)" if faster else ""))

def certificate_summary(results: list[GraphResult]) -> str:
  """With certify: how the default extraction stood against the exact ILP over the sweep (proven optimal, not optimal,
  not proven), its worst gap and the two extractions' times, as extraction-gym compares extractors; then each graph
  not proven optimal."""
  runs = [(r.graph, r.saturated) for r in results if r.saturated.certificate]
  if not runs: return ""
  proven = [g for g, s in runs if s.certificate.startswith("optimal (proven)")]
  worse = [(g, s) for g, s in runs if s.certificate.startswith("not optimal")]
  gaps = [(s.cost - s.exact_cost) / s.cost for _, s in worse if s.exact_cost is not None and s.cost]
  solved = [s for _, s in runs if s.exact_ms]
  ilp = sum(s.certificate == "optimal (proven)" for _, s in runs)   # the others had no e-graph to choose in
  lines = [f"default extraction vs exact ILP: proven optimal on {len(proven)}/{len(runs)} graphs ({ilp} by the ILP, "
           f"{len(proven) - ilp} with one form or nothing to realize), not optimal on {len(worse)}"
           + (f" (worst gap {max(gaps):.1%})" if gaps else "") + f", not proven on {len(runs) - len(proven) - len(worse)}",
           f"  time per graph: default extraction mean {sum(s.extract_ms for _, s in runs) / len(runs):.2f} ms, "
           f"max {max(s.extract_ms for _, s in runs):.2f} ms; ILP mean "
           f"{sum(s.exact_ms for s in solved) / max(1, len(solved)):.2f} ms, max {max((s.exact_ms for s in solved), default=0):.2f} ms"]
  lines += [f"  {g}: cost {s.cost}, {s.certificate}" for g, s in runs if g not in proven]
  return "\n".join(lines)

def to_csv(results: list[GraphResult]) -> str:
  out = io.StringIO()
  rows = [r.row() for r in results]
  w = csv.DictWriter(out, fieldnames=list(dict.fromkeys(k for r in rows for k in r)) if rows else list(COLUMNS))
  w.writeheader()
  for r in rows: w.writerow(r)
  return out.getvalue()

def to_json(results: list[GraphResult]) -> str:
  return json.dumps([{**r.row(), "runs": {"saturated": asdict(r.saturated), "reference": asdict(r.reference),
                                           "materialize_first": asdict(r.materialize_first),
                                           "orders": [asdict(o) for o in r.orders]}} for r in results], indent=1)

def require_matplotlib():
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
  except ImportError as e:
    raise CallsatError("plotting needs matplotlib: pip install -e '.[plot]' (or pip install callsat[plot])") from e

def plot_path(path: str) -> str:
  """Where plot() writes `path`: matplotlib adds .png to a name without an extension, so the caller is told that name."""
  return path if os.path.splitext(path)[1] else path + ".png"

def plot(results: list[GraphResult], path: str) -> str:
  """A PNG: per graph, each schedule's cost relative to the all-materialized baseline (random orders as dots); with
  fusion cost, a second panel: each schedule's predicted time relative to saturation's, for the graphs with a
  partition (log scale past a 10x range). Returns the path written (plot_path)."""
  path = plot_path(path)
  plt = require_matplotlib()
  timed = [r for r in results if r.saturated.predicted_s]
  fig, axes = plt.subplots(2 if timed else 1, 1, figsize=(max(6, 0.22 * len(results) + 3), 9 if timed else 4.5), squeeze=False)
  rel = lambda r, c: c / r.baseline_cost if r.baseline_cost else 1.0
  _panel(axes[0][0], results, rel, "extracted cost / all-materialized baseline", "callify: saturation vs rule orders (bytes)")
  if timed:
    ax = axes[1][0]
    _panel(ax, timed, lambda r, p: (p or float("nan")) / r.saturated.predicted_s, "predicted time / saturated's",
           "cost mode: the partition's predicted time under each schedule", attr="predicted_s")
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo > 10: ax.set_yscale("log")   # a schedule far off (orders without stored forms) stays visible
  fig.tight_layout(); fig.savefig(path, dpi=110); plt.close(fig)
  return path

def _panel(ax, results: list[GraphResult], rel, ylabel: str, title: str, attr: str = "cost") -> None:
  xs = range(len(results))
  v = lambda r, run: rel(r, getattr(run, attr))
  for i, r in enumerate(results):
    ax.scatter([i] * len(r.orders), [v(r, o) for o in r.orders], color="tab:gray", alpha=.5, s=18,
               label="random orders" if i == 0 else None)
  ax.plot(xs, [v(r, r.saturated) for r in results], "o", color="tab:green", label="saturated", ms=9, mfc="none", mew=2)
  ax.plot(xs, [v(r, r.reference) for r in results], "x", color="tab:blue", label="reference order", ms=8, mew=2)
  ax.plot(xs, [v(r, r.materialize_first) for r in results], "s", color="tab:red", label="materialize first", ms=5)
  ax.set_xticks(list(xs)); ax.set_xticklabels([r.graph for r in results], rotation=60, ha="right", fontsize=7)
  ax.set_ylabel(ylabel); ax.set_title(title)
  ax.axhline(1.0, color="k", lw=.5); ax.legend(fontsize=8)
