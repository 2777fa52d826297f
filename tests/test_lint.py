"""The linter runs with the suite: `ruff check` over the whole tree under pyproject.toml's [tool.ruff] (line length 150,
as tinygrad; the rule set and why are written there). ruff is in the `test` extra."""
import os, shutil, subprocess, sys
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _ruff() -> list[str] | None:
  if shutil.which("ruff"): return ["ruff"]
  try:
    import ruff  # noqa: F401
    return [sys.executable, "-m", "ruff"]
  except ImportError: return None

def test_ruff_is_clean():
  cmd = _ruff()
  if cmd is None: pytest.fail("ruff is not installed: pip install -e '.[test]' brings it")
  r = subprocess.run([*cmd, "check", "--no-cache", "--output-format", "concise", ROOT], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]

def test_no_line_over_the_limit_in_python_sources():
  """ruff's E501 skips some lines (a long URL, a pragma); the limit is for every line of our Python files."""
  long = []
  for top in ("egraph", "rules", "lower", "tests", "bench"):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
      for f in files:
        if f.endswith(".py"):
          p = os.path.join(d, f)
          long += [f"{os.path.relpath(p, ROOT)}:{i}" for i, line in enumerate(open(p, encoding="utf-8"), 1) if len(line.rstrip("\n")) > 150]
  assert not long, long[:20]
