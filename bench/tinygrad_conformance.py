"""tinygrad's own tests, stock vs callsat's bridge (strict and fallback): which pass, kernel counts, share bridged.

    python bench/tinygrad_conformance.py --tests ../shared/tinygrad-tests [--group core|wide|all]
        [--files test/unit/test_callify.py ...] [--modes stock strict fallback] [--out notes/benchmarks.md]
        [--detail notes/tinygrad-conformance.md]

Each (file, mode) runs in its own pytest process from the tests folder (DEV as in that folder's README; CPU needs
clang). The groups: core (the default) is the 20 files of that README's table; wide is 12 files of tinygrad's frontend
and backend tests (ops, nn, optim, dtype, tensor, arange, randomness, gradient, conv, attention, getitem, linalg), run
with RUN_SLOW=1 as tinygrad's CI does (it un-skips test_nn's TestNN and test_optim's TestOptim; set for the wide files
only, so core's counts stay as before); most of them import torch as their oracle, so a CPU build of torch must be
installed for the run (`pip install 'torch==2.13.0+cpu'`; it is no dependency of the project). At 0.14.0 here
test_tensor (extra.gradcheck) and test_attention (tinygrad.llm.kernels) fail to import stock: 0 tests. all is both.
A test counts for a mode when stock passed it (or xfailed it) and the mode gives the same outcome. Every test
that passes stock and not bridged is listed with its cause; so is every kernel-count difference (more kernels bridged
is a bug; fewer is a difference of form). The bridge's cost-mode option (CALLSAT_BRIDGE_FUSION) is forced off in every
run: it adds realize points, so tinygrad's exact kernel counts change by design. Modes callsat-strict and callsat-fallback
run the same with CALLSAT_BRIDGE_BACKEND=callsat (callsat's own kernels run each CALL they can: one item per CALL in
tinygrad's kernel count)."""
from __future__ import annotations
import argparse, json, os, subprocess, sys, tempfile, time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = [  # (file, DEV): the table of ../shared/tinygrad-tests/README.md
  ("test/unit/test_callify.py", "CPU"), ("test/unit/test_realize_is_realize.py", "CPU"), ("test/unit/test_assign.py", "CPU"),
  ("test/unit/test_call.py", "CPU"), ("test/unit/test_function.py", "CPU"), ("test/unit/test_setitem_schedule.py", "CPU"),
  ("test/unit/test_schedule_cache.py", "CPU"), ("test/unit/test_multitensor.py", "CPU"), ("test/unit/test_jit.py", "CPU"),
  ("test/unit/test_disk_tensor.py", "CPU"), ("test/unit/test_symbolic_tensor.py", "CPU"), ("test/unit/test_indexing.py", "CPU"),
  ("test/backend/test_schedule.py", "CPU"), ("test/backend/test_setitem.py", "CPU"), ("test/backend/test_symbolic_jit.py", "CPU"),
  ("test/null/test_schedule.py", "NULL"), ("test/null/test_tensor.py", "NULL"), ("test/null/test_multitensor.py", "NULL"),
  ("test/null/test_symbolic_tensor.py", "NULL"), ("test/null/test_schedule_cache.py", "NULL")]
WIDE = [  # (file, DEV): tinygrad's frontend and backend tests, with torch as the oracle of most
  ("test/backend/test_ops.py", "CPU"), ("test/backend/test_nn.py", "CPU"), ("test/backend/test_optim.py", "CPU"),
  ("test/backend/test_dtype.py", "CPU"), ("test/backend/test_tensor.py", "CPU"), ("test/backend/test_arange.py", "CPU"),
  ("test/backend/test_randomness.py", "CPU"), ("test/unit/test_gradient.py", "CPU"), ("test/unit/test_conv.py", "CPU"),
  ("test/unit/test_attention.py", "CPU"), ("test/unit/test_getitem_ops.py", "CPU"), ("test/unit/test_linalg.py", "CPU")]
GROUPS = {"core": FILES, "wide": WIDE, "all": FILES + WIDE}
ENV = {f: {"RUN_SLOW": "1"} for f, _ in WIDE}   # extra environment of a file's runs (tinygrad's CI runs these with it)
TIMEOUT = {"test/backend/test_ops.py": 7200, "test/backend/test_dtype.py": 3600}   # s, floors over --timeout
PASSING = ("passed", "xfailed")

def run(tests: str, file: str, dev: str, mode: str, timeout: int) -> dict:
  """One pytest process; its record (outcomes, causes, kernel counts, bridge stats) and wall time."""
  timeout = max(timeout, TIMEOUT.get(file, 0))
  with tempfile.TemporaryDirectory() as tmp:
    rec = os.path.join(tmp, "record.json")
    env = {**os.environ, **ENV.get(file, {}), "DEV": dev, "CALLSAT_RECORD": rec,
           "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "bench"), tests])}
    env.pop("CALLSAT_BRIDGE", None)
    env["CALLSAT_BRIDGE_FUSION"] = "rules"   # the cost-mode option stays off here: it changes kernel counts by design
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tg_record", file]
    env.pop("CALLSAT_BRIDGE_BACKEND", None)
    if mode != "stock": cmd[4:4] = ["-p", "egraph.tinygrad"]; env["CALLSAT_BRIDGE"] = mode.removeprefix("callsat-")
    if mode.startswith("callsat-"): env["CALLSAT_BRIDGE_BACKEND"] = "callsat"   # callsat's own kernels run the CALLs
    t0 = time.perf_counter()
    try: p = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired: return {"tests": {}, "bridge": None, "wall": timeout, "note": f"timed out after {timeout} s"}
    wall = time.perf_counter() - t0
    if not os.path.exists(rec): return {"tests": {}, "bridge": None, "wall": wall, "note": (p.stdout + p.stderr)[-400:]}
    with open(rec) as f: out = json.load(f)
  out["wall"] = wall
  return out

def compare(stock: dict, mode: dict) -> tuple[int, list, list]:
  """(tests counted, [(id, cause)] passing stock and not in the mode, [(id, stock kernels, mode kernels)])."""
  ok, lost, kern = 0, [], []
  for tid, s in stock["tests"].items():
    if s.get("outcome") not in PASSING: continue
    m = mode["tests"].get(tid, {})
    if m.get("outcome") == s["outcome"]: ok += 1
    else: lost.append((tid, m.get("outcome", "missing"), m.get("cause", mode.get("note", ""))))
    if m.get("outcome") == "passed" and m.get("kernels") is not None and m["kernels"] != s.get("kernels"):
      kern.append((tid, s.get("kernels"), m["kernels"]))
  return ok, lost, kern

def pct(a: int, b: int) -> str: return f"{100 * a / b:.1f} %" if b else "-"

def cell(n: int | None, base: int) -> str: return "-" if n is None else f"{n} ({pct(n, base)})"   # "-": that mode not run

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tests", required=True, help="a tinygrad checkout (or ../shared/tinygrad-tests) at the 0.14.0 commit")
  ap.add_argument("--group", choices=list(GROUPS), default="core",
                  help="core: the 20 files of the README table; wide: the 12 frontend/backend files (need torch); all: both")
  ap.add_argument("--files", nargs="*", help="test files relative to --tests (default: those of --group)")
  ap.add_argument("--modes", nargs="*", default=["stock", "strict", "fallback"])
  ap.add_argument("--timeout", type=int, default=1800, help="s per (file, mode); test_ops and test_dtype get more")
  ap.add_argument("--out", help="markdown file to append the table to")
  ap.add_argument("--detail", help="markdown file to write every lost test and kernel difference to")
  a = ap.parse_args()
  if "stock" not in a.modes: ap.error("--modes must include stock: every mode is compared with its passing tests")
  tests = os.path.abspath(a.tests)
  devs = dict(FILES + WIDE)
  files = [(f, devs.get(f, "CPU")) for f in a.files] if a.files else GROUPS[a.group]
  rows, detail, totals = [], [], Counter()
  for f, dev in files:
    res = {m: run(tests, f, dev, m, a.timeout) for m in a.modes}
    stock = res["stock"]
    base = sum(1 for t in stock["tests"].values() if t.get("outcome") in PASSING)
    row = {"file": f, "dev": dev, "stock": base, "wall": {m: r["wall"] for m, r in res.items()}}
    totals["stock"] += base
    for m in a.modes[1:] if a.modes[0] == "stock" else []:
      ok, lost, kern = compare(stock, res[m])
      row[m] = ok; totals[m] += ok
      b = res[m].get("bridge") or {}
      if m == "fallback":
        row["bridged"], row["calls"] = b.get("bridged", 0), b.get("calls", 0)
        totals["bridged"] += row["bridged"]; totals["calls"] += row["calls"]
        row["reasons"] = b.get("reasons", {})
      detail += [f"| {m} | `{tid}` | {out} | {cause.splitlines()[0][:160] if cause else ''} |" for tid, out, cause in lost]
      detail += [f"| {m} kernels | `{tid}` | stock {ks} | bridged {kb} ({'MORE: bug' if kb > (ks or 0) else 'fewer'}) |" for tid, ks, kb in kern]
    rows.append(row)
    print(f"{f} ({dev}): stock {base}" + "".join(f", {m} {row.get(m, '-')}" for m in a.modes[1:]) +
          "; walls " + ", ".join(f"{m} {w:.1f}s" for m, w in row["wall"].items()), flush=True)
  lines = ["| file | DEV | stock passes | strict | fallback | calls bridged (fallback) | top fallback reasons | wall stock / strict / fallback |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    reasons = ", ".join(f"{k} {v}" for k, v in list(r.get("reasons", {}).items())[:3])
    lines.append(f"| {r['file']} | {r['dev']} | {r['stock']} | {cell(r.get('strict'), r['stock'])} | "
                 f"{cell(r.get('fallback'), r['stock'])} | " + (f"{pct(r['bridged'], r['calls'])} ({r['bridged']}/{r['calls']})"
                 if "calls" in r else "-") + f" | {reasons} | " + " / ".join(f"{w:.0f} s" for w in r["wall"].values()) + " |")
  ran = lambda m: totals[m] if m in a.modes else None
  lines.append(f"| **all** | | {totals['stock']} | {cell(ran('strict'), totals['stock'])} | "
               f"{cell(ran('fallback'), totals['stock'])} | {pct(totals['bridged'], totals['calls']) if 'fallback' in a.modes else '-'} | | |")
  table = "\n".join(lines)
  print(table)
  cmd = ("python bench/tinygrad_conformance.py --tests " + a.tests + (f" --group {a.group}" if a.group != "core" else "") +
         (" --files " + " ".join(a.files) if a.files else "") + (" --modes " + " ".join(a.modes) if a.modes != ap.get_default("modes") else ""))
  if a.out:
    with open(a.out, "a") as f: f.write(f"\n## tinygrad conformance ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n`{cmd}`\n\n{table}\n")
  if a.detail:
    with open(a.detail, "w") as f:
      f.write(f"# tinygrad conformance: what the bridge changes\n\n`{cmd}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
              "| mode | test | outcome | cause |\n|---|---|---|---|\n" + "\n".join(detail) + "\n")

if __name__ == "__main__": main()
