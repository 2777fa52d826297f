"""Test-session setup: the run leaves nothing in the checkout or in shared paths. Hypothesis keeps its example database
under a per-session temp dir (not ./.hypothesis) and the CUDA emulator cache and the bridge's measured verdicts go there too (not the user's cache);
subprocesses the tests start inherit both through the environment."""
import os, shutil, tempfile
import pytest
from hypothesis.configuration import set_hypothesis_home_dir

SESSION_DIR = tempfile.mkdtemp(prefix="callsat-tests-")   # 0700, this user's
set_hypothesis_home_dir(os.path.join(SESSION_DIR, "hypothesis"))
os.environ.setdefault("CALLSAT_CUDA_CACHE", os.path.join(SESSION_DIR, "cuda"))
os.environ.setdefault("CALLSAT_BRIDGE_VERDICTS_DIR", os.path.join(SESSION_DIR, "bridge-verdicts"))

def pytest_unconfigure(config): shutil.rmtree(SESSION_DIR, ignore_errors=True)

NO_CLANG = "tinygrad 0.14's CPU device compiles its helper programs with clang (its CC), which is not on this machine"

def _no_clang(exc: BaseException | None) -> bool:
  """Did tinygrad fail for want of clang: running it, or finding no usable default device once its CPU device failed?"""
  cc = os.environ.get("CC", "clang")
  if exc is None or shutil.which(cc) is not None: return False
  return (isinstance(exc, FileNotFoundError) and exc.filename == cc) or \
         (isinstance(exc, RuntimeError) and str(exc) == "no usable devices")

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  """A test that uses tinygrad as its oracle needs tinygrad's CPU device (`Tensor.numpy` reads through it), and that
  device runs clang when it starts: where clang is missing, such a test is skipped with that reason, not failed."""
  outcome = yield
  if outcome.excinfo and _no_clang(outcome.excinfo[1]):
    outcome.force_exception(pytest.skip.Exception(NO_CLANG, _use_item_location=True))
