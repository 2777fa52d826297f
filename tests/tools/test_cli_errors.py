"""`callsat` usage errors are one line on stderr and exit 2, before any work: output paths in a missing directory, bad
corpus entries and counts; `--plot noext` names the file it wrote; `callsat order` reports each graph as it finishes;
a Ray that fails to start is one line; the test run keeps its Hypothesis database and CUDA cache out of the checkout."""
import os, sys, types
from pathlib import Path
from unittest import mock
import pytest
from hypothesis.configuration import storage_directory
from egraph.tools import cli
from egraph.tools import ordering
from egraph.ir.errors import CallsatError

REPO = Path(__file__).resolve().parents[2]

@pytest.mark.parametrize("argv, msg", [
  (["order", "--csv", "/no/such/dir/x.csv"], "directory '/no/such/dir' does not exist"),
  (["order", "--json", "/no/such/dir/x.json"], "does not exist"),
  (["order", "--plot", "/no/such/dir/noext"], "/no/such/dir/noext.png"),
  (["order", "--graph", "gen:abc"], "corpus entry 'gen:abc'"),
  (["order", "--graph", "model:nope"], "corpus entry 'model:nope'"),
  (["order", "-k", "-1"], "--orders/-k must be >= 0, got -1"),
  (["order", "--workers", "-3"], "--workers must be >= 1, got -3"),
  (["order", "--generated", "-5"], "--generated must be >= 0, got -5"),
  (["cuda", "--out", "/no/such/dir/a.cu"], "does not exist"),
  (["export", "--egg", "/no/such/dir/a.egg"], "does not exist"),
  (["explain", "--json", "/no/such/dir/a.json"], "does not exist"),
])
def test_usage_errors_are_one_line(argv, msg, capsys, monkeypatch):
  monkeypatch.setattr(ordering, "sweep", mock.Mock(side_effect=AssertionError("work started")))
  assert cli.main(argv) == 2
  out, err = capsys.readouterr()
  assert err.count("\n") == 1 and err.startswith("callsat: error: ") and msg in err and "Traceback" not in err

def _fake_plt():
  """matplotlib's savefig behaviour without matplotlib: a name without an extension gets .png."""
  fig, ax = mock.MagicMock(), mock.MagicMock()
  def savefig(path, **kw): Path(path if os.path.splitext(path)[1] else path + ".png").write_bytes(b"png")
  fig.savefig.side_effect = savefig
  return mock.MagicMock(subplots=mock.Mock(return_value=(fig, ax)))

def test_plot_noext_names_the_file_and_progress_per_graph(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(ordering, "require_matplotlib", _fake_plt)
  assert cli.main(["order", "--graph", "model:views", "--graph", "gen:1", "-k", "1", "--plot", str(tmp_path / "noext")]) == 0
  out, err = capsys.readouterr()
  assert f"plot written to {tmp_path / 'noext.png'}\n" in out and (tmp_path / "noext.png").exists()
  assert not (tmp_path / "noext").exists()
  lines = [l for l in err.splitlines() if l.startswith("[")]
  assert [l.split(":")[0] for l in lines] == ["[1/2] model", "[2/2] gen"] and "saturated" in lines[0]
  assert ordering.plot_path("a.svg") == "a.svg" and ordering.plot_path("d/noext") == "d/noext.png"

def test_ray_failures_are_one_line(capsys, monkeypatch):
  boom = types.ModuleType("ray")
  boom.is_initialized = lambda: False
  def init(**kw): raise TypeError("cannot pickle 'module' object\n  ...pages of ray internals...")
  boom.init, boom.__version__ = init, "2.60.0"
  monkeypatch.setitem(sys.modules, "ray", boom)
  with pytest.raises(CallsatError, match="ray 2.60.0 failed to start: TypeError: cannot pickle 'module' object") as e:
    ordering.sweep(["gen:0"], k=1, ray="ray://h:10001")
  assert "\n" not in str(e.value)
  monkeypatch.setitem(sys.modules, "ray", None)      # not installed
  assert cli.main(["order", "--graph", "gen:0", "--ray", "local"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "pip install -e '.[ray]'" in err

def test_test_run_keeps_the_checkout_and_tmp_clean():
  hyp = storage_directory("examples", intent_to_write=False).path.resolve()
  assert REPO not in hyp.parents
  cuda = os.environ["CALLSAT_CUDA_CACHE"]
  assert not cuda.startswith(str(REPO)) and "callsat-cuda-" not in cuda
