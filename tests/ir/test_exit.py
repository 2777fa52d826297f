"""Nodes alive at interpreter exit die quietly: the hash-cons table's weak-reference callback keeps what it needs
(its module's globals are cleared first: thousands of "NoneType is not callable" tracebacks after a hypothesis run)."""
import subprocess, sys, os

CODE = """
import sys; sys.path[:0] = [".", "bench", "tests"]
from hypothesis import given, settings, HealthCheck
from graphgen import graphs
from egraph.ir.ops import Node, Ops, new_buffer
from egraph.ir.dtype import dtypes
from egraph.engine.encode import encode
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(graphs(dtype=None))
def t(g): encode(g.roots)
t()
from callify_phases import dag
x = dag(20000)
"""

def test_nodes_alive_at_exit_die_quietly(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  (script := tmp_path / "exit.py").write_text(CODE)
  r = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
