"""`callsat order --ray ADDRESS`: the sweep as Ray tasks (one per graph and its order set) gives the local sweep's
results, in the same order. Runs against a local Ray instance that this module starts (2 CPUs) and shuts down."""
import builtins, csv, logging
import pytest
from egraph.ir.errors import CallsatError
from egraph.tools.ordering import sweep, RAY_INSTALL

GRAPHS, K = ["model:views", "gen:1"], 2
TIMING = {"saturated_ms", "reference_ms", "orders_mean_ms"}

@pytest.fixture(scope="module")
def ray():
  ray = pytest.importorskip("ray", reason="the --ray sweep needs ray: pip install -e '.[ray]' (or pip install ray)")
  ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
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
  with pytest.raises(CallsatError, match="expected model:NAME or gen:SEED"): sweep(["nope:1"], k=1, ray="auto")

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
