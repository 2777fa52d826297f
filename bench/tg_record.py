"""A pytest plugin for bench/tinygrad_conformance.py: per test, its outcome, the cause of a failure and tinygrad's kernel
count; at the end, the bridge's stats when it is installed. Written as JSON to $CALLSAT_RECORD."""
import json, os

_TESTS: dict = {}
_BEFORE_RESETS = [0]   # kernels counted before a test's GlobalCounters.reset() calls

def _kernels() -> int:
  from tinygrad.helpers import GlobalCounters
  return _BEFORE_RESETS[0] + GlobalCounters.kernel_count

def pytest_configure(config):
  from tinygrad.helpers import GlobalCounters
  reset = GlobalCounters.reset
  def counting_reset():
    _BEFORE_RESETS[0] += GlobalCounters.kernel_count
    reset()
  GlobalCounters.reset = staticmethod(counting_reset)

def pytest_runtest_setup(item): item._k0 = _kernels()

def pytest_runtest_teardown(item): _TESTS.setdefault(item.nodeid, {})["kernels"] = _kernels() - getattr(item, "_k0", 0)

def pytest_runtest_logreport(report):
  t = _TESTS.setdefault(report.nodeid, {})
  if report.when == "call" or report.outcome != "passed" or "outcome" not in t:
    if report.when != "call" and report.outcome == "passed": t.setdefault("outcome", "passed"); return
    out = "xfailed" if hasattr(report, "wasxfail") and report.skipped else "xpassed" if hasattr(report, "wasxfail") else report.outcome
    if t.get("outcome") in ("failed", "error") and report.when == "teardown": return
    t["outcome"] = "error" if report.when != "call" and report.failed else out
    if report.failed:
      crash = getattr(report.longrepr, "reprcrash", None)
      t["cause"] = (crash.message if crash is not None else str(report.longrepr))[:300]

def pytest_sessionfinish(session):
  out = {"tests": _TESTS, "bridge": None}
  try:
    import sys
    if "egraph.tinygrad" in sys.modules: out["bridge"] = sys.modules["egraph.tinygrad"].stats()
  except Exception as e: out["bridge"] = {"error": repr(e)}
  with open(os.environ["CALLSAT_RECORD"], "w") as f: json.dump(out, f)
