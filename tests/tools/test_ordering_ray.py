"""`callsat order --ray ADDRESS`: the sweep as Ray tasks (one per graph and its order set) gives the local and the
process-pool sweeps' results, in the same order, for built-in entries and a corpus file; a task whose worker dies is
named by its graph. Runs against one local Ray instance that this module starts with a small footprint (2 CPUs, a
100 MB object store, no dashboard) and shuts down. ray is in the test extra; without it these tests skip."""
import builtins, csv, logging, os
import pytest
from egraph.ir.errors import CallsatError
from egraph.tools.ordering import sweep, sweep_ray, Failure, RAY_INSTALL, _job

GRAPHS, K = ["model:views", "gen:1"], 2
TIMING = {"saturated_ms", "reference_ms", "orders_mean_ms"}
CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "corpus", "tinygrad.jsonl.gz")
CORPUS_GRAPHS = ["symbolic/1", "test/null/test_schedule.py::TestSchedule::test_cast_after_shrink/1"]

@pytest.fixture(scope="module")
def ray():
  ray = pytest.importorskip("ray", reason="the --ray sweep needs ray: pip install -e '.[ray]' (or pip install ray)")
  ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, object_store_memory=100 << 20,
           configure_logging=False)
  yield ray
  ray.shutdown()

def _key(r):
  runs = [r.saturated, r.reference, r.materialize_first, *r.orders]
  return (r.graph, r.graph_nodes, r.baseline_cost, r.order_dependent, r.saturated_best,
          [(x.schedule, x.cost, x.stores, x.views, x.e_nodes, x.iterations) for x in runs])

def test_ray_sweep_equals_local_sweep(ray):
  local = sweep(GRAPHS, k=K)
  remote = sweep(GRAPHS, k=K, ray="auto")       # this process is connected already: that connection is used
  assert ray.is_initialized()                   # ... and left open
  assert [_key(r) for r in remote] == [_key(r) for r in local]
  assert [r.graph for r in remote] == GRAPHS and all(r.order_dependent for r in remote)

def test_ray_bad_graph_is_a_callsat_error(ray):
  # the same message as the local sweep's (which names the demo models and what a seed must be)
  with pytest.raises(CallsatError) as local: sweep(["nope:1"], k=1)
  with pytest.raises(CallsatError) as remote: sweep(["nope:1"], k=1, ray="auto")
  assert str(remote.value) == str(local.value) and "expected model:NAME (" in str(remote.value) and "or gen:SEED (" in str(remote.value)

def test_ray_corpus_sweep_equals_process_pool_sweep(ray):
  pool = sweep(CORPUS_GRAPHS, k=K, corpus=CORPUS, workers=2)
  remote = sweep(CORPUS_GRAPHS, k=K, corpus=CORPUS, ray="auto")
  assert [_key(r) for r in remote] == [_key(r) for r in pool] and [r.graph for r in remote] == CORPUS_GRAPHS

def test_ray_worker_that_dies_is_named_by_its_graph(ray):
  def _dies_on_gen1(args, job=_job):   # nested: pickled by value, so Ray's workers need not import this test module
    import os
    if args[1] == "gen:1": os._exit(3)   # the worker process dies mid-sweep, as a segfault or an OOM kill would
    return job(args)
  jobs = [(False, n, 1, 0, None, None) for n in GRAPHS]
  with pytest.raises(CallsatError, match=r"graph 'gen:1': its worker died"): sweep_ray(jobs, "auto", job=_dies_on_gen1)
  kept = sweep_ray([(True, *j[1:]) for j in jobs], "auto", job=_dies_on_gen1)   # a sweep told to go on
  assert [type(r).__name__ for r in kept] == ["GraphResult", "Failure"]
  assert isinstance(kept[1], Failure) and kept[1].graph == "gen:1" and "worker died" in kept[1].error
  assert kept[0].graph == "model:views" and kept[0].order_dependent

def test_cli_order_ray_same_output(ray, tmp_path, capsys):
  from egraph.tools.cli import main
  rows = {}
  for mode, extra in (("local", []), ("ray", ["--ray", "auto"])):
    c = tmp_path / f"{mode}.csv"
    assert main(["order", *[a for g in GRAPHS for a in ("--graph", g)], "-k", str(K), "--csv", str(c), *extra]) == 0
    assert "2/2 graphs depend on the rule order" in capsys.readouterr().out
    rows[mode] = [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(open(c))]
  assert rows["ray"] == rows["local"] and [r["graph"] for r in rows["ray"]] == GRAPHS
  assert main(["order", "--graph", "gen:0", "-k", "1", "--ray", "auto", "--workers", "2"]) == 2
  assert "exclude each other" in capsys.readouterr().err

def test_ray_missing_says_what_to_install(monkeypatch, capsys):
  real = builtins.__import__
  monkeypatch.setattr(builtins, "__import__",
                      lambda n, *a, **k: (_ for _ in ()).throw(ImportError(n)) if n == "ray" or n.startswith("ray.") else real(n, *a, **k))
  from egraph.tools.cli import main
  assert main(["order", "--graph", "gen:0", "-k", "1", "--ray", "local"]) == 2
  err = capsys.readouterr().err
  assert "pip install -e '.[ray]'" in err and err.strip().endswith(RAY_INSTALL)
