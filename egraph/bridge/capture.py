"""Capture tinygrad programs as a callsat graph corpus (egraph/ir/corpus.py): a hook on tinygrad 0.14's module global
`tinygrad.tensor.transform_to_call` converts every graph tinygrad is about to callify (egraph.bridge.convert), keeps
its callsat roots as a named record, then calls the pass that was installed before it (tinygrad's own, or callsat's
bridge), so the program runs unchanged. A graph the converter refuses is counted by reason and not recorded. By default
tinygrad's arithmetic (ALU ops, REDUCE, CONST) is recorded as callsat ops wherever callsat can say them (the cost-mode
shadow's rebuild, egraph/bridge/shadow.py; the graph's device priced as callsat's CPU), so the study's cost mode has
something to price; what stays OPAQUE is counted per record (meta "opaque" of "nodes"). `opaque=True` records the
bridge's plain conversion (every compute op OPAQUE).

    python -m egraph.bridge.capture --script prog.py [--entry build] --out corpus.jsonl [--name PREFIX] [--device NULL]
    python -m pytest -p egraph.bridge.capture ...        (CALLSAT_CAPTURE=out.jsonl: one record per graph, named <test id>/<k>)

`callsat capture` runs the first form in a child process, so the CLI itself never imports tinygrad."""
from __future__ import annotations
import argparse, contextlib, os, runpy, sys, threading, traceback
from collections import Counter
import tinygrad.tensor as tg_tensor
from tinygrad import Tensor as TgTensor
from tinygrad.helpers import Context
from egraph.ir.errors import CallsatError
from egraph.ir.ops import Node, Ops, toposort
from egraph.bridge.convert import BridgeRefusal, Conversion, to_callsat
from egraph.bridge.shadow import Shadow
from egraph.ir.corpus import Graph, dumps, save
from egraph.tools.cli import capture_arguments

class Capture:
  """Records the callsat image of each graph tinygrad passes to transform_to_call, named `<prefix>/<k>` (k counts the
  records of that prefix). With `unique`, a graph equal to one already recorded (same nodes and roots) is skipped;
  `opaque`: tinygrad's arithmetic stays OPAQUE (the bridge's conversion as it is)."""
  def __init__(self, prefix: str = "graph", unique: bool = False, opaque: bool = False):
    self.prefix, self.unique, self.opaque = prefix, unique, opaque
    self.records: list[str] = []                    # corpus lines, in capture order
    self.calls, self.repeats = 0, 0
    self.refused: Counter = Counter()               # converter refusal reason -> graphs not recorded
    self._seen: set[str] = set()
    self._count: Counter = Counter()                # prefix -> records so far
    self._lock = threading.Lock()
    self._inner = None

  def record(self, big_sink) -> None:
    """Convert one tinygrad graph (a SINK UOp) and keep it as a record."""
    with self._lock:
      self.calls += 1
      try:
        cv, roots = to_callsat(big_sink)
        if not self.opaque: roots = arithmetic(cv, roots)
        if self.unique:
          if (key := dumps(Graph("", roots))) in self._seen: self.repeats += 1; return
          self._seen.add(key)
        k = self._count[self.prefix]
        nodes = toposort(roots, enter_calls=False)
        meta = {"uops": len(big_sink.toposort()), "call": self.calls - 1, "nodes": len(nodes),
                "opaque": sum(n.op is Ops.OPAQUE for n in nodes), "arithmetic": not self.opaque}
        self.records.append(dumps(Graph(f"{self.prefix}/{k}", roots, meta)))
        self._count[self.prefix] += 1
      except Exception as e:   # a capture never breaks the program: the graph is counted, not recorded
        self.refused[e.reason if isinstance(e, BridgeRefusal) else f"error:{type(e).__name__}"] += 1

  def _hook(self, big_sink):
    self.record(big_sink)
    return self._inner(big_sink)

  def install(self) -> None:
    """Put the hook in front of whatever transform_to_call tinygrad has now (idempotent)."""
    if self._inner is None: self._inner, tg_tensor.transform_to_call = tg_tensor.transform_to_call, self._hook

  def uninstall(self) -> None:
    if self._inner is not None: tg_tensor.transform_to_call, self._inner = self._inner, None

  def __enter__(self): self.install(); return self
  def __exit__(self, *exc): self.uninstall()

  def save(self, path: str) -> int: return save(path, self.records)

  def summary(self) -> str:
    line = f"{len(self.records)} graph(s) captured from {self.calls} transform_to_call call(s)"
    if self.repeats: line += f", {self.repeats} repeat(s) skipped"
    if self.refused: line += "; refused by the converter: " + ", ".join(f"{r} x{n}" for r, n in self.refused.most_common())
    return line

def arithmetic(cv: Conversion, roots: list[Node]) -> list[Node]:
  """cv's roots with tinygrad's ALU/REDUCE/CONST ops rebuilt as callsat ops where callsat can say them (the cost-mode
  shadow), the realize points' device as callsat's CPU; a graph on several devices keeps its conversion as it is."""
  devs = {r.device for r in roots if r.device is not None}
  if len(devs) != 1 or not isinstance(d := next(iter(devs)), str) or d.startswith("DISK"): return roots
  return Shadow(cv, d).build(roots)

def realize_all(res) -> int:
  """Realize what an entry function returned: a tinygrad Tensor, a list/tuple of them or a dict; returns the count."""
  ts = [res] if isinstance(res, TgTensor) else list(res.values()) if isinstance(res, dict) else list(res) if isinstance(res, (list, tuple)) else []
  ts = [t for t in ts if isinstance(t, TgTensor)]
  if ts: TgTensor.realize(*ts)
  return len(ts)

def run_script(path: str, cap: Capture, entry: str | None = None, device: str | None = None) -> None:
  """Run the tinygrad program `path` as __main__ under `cap`, then call `entry` (default: `build` if it defines one)
  and realize what it returns. `device` sets tinygrad's default device (DEV) for the run."""
  if not os.path.isfile(path): raise CallsatError(f"script {path!r} not found")
  argv = sys.argv
  with Context(DEV=device) if device else contextlib.nullcontext(), cap:
    try:
      sys.argv = [path]
      try: ns = runpy.run_path(path, run_name="__main__")
      except SystemExit as e:
        if e.code not in (None, 0): raise CallsatError(f"script {path!r} exited with status {e.code}") from None
        return
      name = entry or "build"
      fn = ns.get(name)
      if entry is not None and not callable(fn): raise CallsatError(f"script {path!r} defines no function {entry!r} (use --entry NAME)")
      if callable(fn): realize_all(fn())
    finally: sys.argv = argv

def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="callsat capture", description="Run a tinygrad program and save every graph it callifies as a corpus.")
  capture_arguments(p)
  args = p.parse_args(argv)
  cap = Capture(args.name or os.path.splitext(os.path.basename(args.script))[0], unique=args.unique, opaque=args.opaque)
  try:
    try: run_script(args.script, cap, args.entry, args.device)
    except CallsatError: raise
    except Exception as e:
      traceback.print_exc()
      raise CallsatError(f"script {args.script!r} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                         f"({len(cap.records)} graph(s) captured before it; nothing written)") from None
    n = cap.save(args.out)
  except CallsatError as e:
    print(f"callsat: error: {e}", file=sys.stderr); return 2
  print(f"{cap.summary()}; {n} written to {args.out}")
  return 0

# ---- pytest plugin: CALLSAT_CAPTURE=out.jsonl python -m pytest -p egraph.bridge.capture ... -------------------------------------

_PLUGIN: dict = {}

def pytest_configure(config) -> None:
  out = os.environ.get("CALLSAT_CAPTURE")
  if not out: raise CallsatError("the capture plugin needs CALLSAT_CAPTURE=<corpus file to write>")
  cap = _PLUGIN["cap"] = Capture(unique=os.environ.get("CALLSAT_CAPTURE_UNIQUE", "1") != "0",
                                 opaque=os.environ.get("CALLSAT_CAPTURE_OPAQUE", "0") == "1")
  _PLUGIN["out"] = out
  cap.install()

def pytest_runtest_setup(item) -> None:
  if (cap := _PLUGIN.get("cap")) is not None: cap.prefix = item.nodeid

def pytest_terminal_summary(terminalreporter) -> None:
  if (cap := _PLUGIN.get("cap")) is not None: terminalreporter.write_line(f"callsat capture: {cap.summary()}")

def pytest_unconfigure(config) -> None:
  if (cap := _PLUGIN.pop("cap", None)) is not None:
    cap.uninstall()
    cap.save(_PLUGIN.pop("out"))

if __name__ == "__main__": sys.exit(main())
