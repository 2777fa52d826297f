"""Test-session setup: the run leaves nothing in the checkout or in shared paths. Hypothesis keeps its example database
under a per-session temp dir (not ./.hypothesis) and the CUDA emulator cache goes there too (not the user's cache);
subprocesses the tests start inherit both through the environment."""
import os, shutil, tempfile
from hypothesis.configuration import set_hypothesis_home_dir

SESSION_DIR = tempfile.mkdtemp(prefix="callsat-tests-")   # 0700, this user's
set_hypothesis_home_dir(os.path.join(SESSION_DIR, "hypothesis"))
os.environ.setdefault("CALLSAT_CUDA_CACHE", os.path.join(SESSION_DIR, "cuda"))

def pytest_unconfigure(config): shutil.rmtree(SESSION_DIR, ignore_errors=True)
