"""tinygrad's own tests, stock vs callsat's bridge (strict and fallback): which pass, kernel counts, share bridged.

    python bench/tinygrad_conformance.py --tests ../shared/tinygrad-tests [--files test/unit/test_callify.py ...]
        [--modes stock strict fallback] [--out notes/benchmarks.md] [--detail notes/tinygrad-conformance.md]

Each (file, mode) runs in its own pytest process from the tests folder (DEV as in that folder's README; CPU needs
clang). A test counts for a mode when stock passed it (or xfailed it) and the mode gives the same outcome. Every test
that passes stock and not bridged is listed with its cause; so is every kernel-count difference (more kernels bridged
is a bug; fewer is a difference of form). The bridge's cost-mode option (CALLSAT_BRIDGE_FUSION) is forced off in every
run: it adds realize points, so tinygrad's exact kernel counts change by design."""
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
PASSING = ("passed", "xfailed")

def run(tests: str, file: str, dev: str, mode: str, timeout: int) -> dict:
  """One pytest process; its record (outcomes, causes, kernel counts, bridge stats) and wall time."""
  with tempfile.TemporaryDirectory() as tmp:
    rec = os.path.join(tmp, "record.json")
    env = {**os.environ, "DEV": dev, "CALLSAT_RECORD": rec, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "bench"), tests])}
    env.pop("CALLSAT_BRIDGE", None)
    env["CALLSAT_BRIDGE_FUSION"] = "rules"   # the cost-mode option stays off here: it changes kernel counts by design
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tg_record", file]
    if mode != "stock": cmd[4:4] = ["-p", "egraph.tinygrad"]; env["CALLSAT_BRIDGE"] = mode
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

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tests", required=True, help="a tinygrad checkout (or ../shared/tinygrad-tests) at the 0.14.0 commit")
  ap.add_argument("--files", nargs="*", help="test files relative to --tests (default: the 20 of the README table)")
  ap.add_argument("--modes", nargs="*", default=["stock", "strict", "fallback"])
  ap.add_argument("--timeout", type=int, default=1800)
  ap.add_argument("--out", help="markdown file to append the table to")
  ap.add_argument("--detail", help="markdown file to write every lost test and kernel difference to")
  a = ap.parse_args()
  tests = os.path.abspath(a.tests)
  devs = dict(FILES)
  files = [(f, devs.get(f, "CPU")) for f in a.files] if a.files else FILES
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
          f"; walls " + ", ".join(f"{m} {w:.1f}s" for m, w in row["wall"].items()), flush=True)
  lines = ["| file | DEV | stock passes | strict | fallback | calls bridged (fallback) | top fallback reasons | wall stock / strict / fallback |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    reasons = ", ".join(f"{k} {v}" for k, v in list(r.get("reasons", {}).items())[:3])
    lines.append(f"| {r['file']} | {r['dev']} | {r['stock']} | {r.get('strict', '-')} ({pct(r.get('strict', 0), r['stock'])}) | "
                 f"{r.get('fallback', '-')} ({pct(r.get('fallback', 0), r['stock'])}) | {pct(r.get('bridged', 0), r.get('calls', 0))} "
                 f"({r.get('bridged', 0)}/{r.get('calls', 0)}) | {reasons} | " + " / ".join(f"{w:.0f} s" for w in r["wall"].values()) + " |")
  lines.append(f"| **all** | | {totals['stock']} | {totals['strict']} ({pct(totals['strict'], totals['stock'])}) | "
               f"{totals['fallback']} ({pct(totals['fallback'], totals['stock'])}) | {pct(totals['bridged'], totals['calls'])} | | |")
  table = "\n".join(lines)
  print(table)
  cmd = "python bench/tinygrad_conformance.py --tests " + a.tests + (" --files " + " ".join(a.files) if a.files else "")
  if a.out:
    with open(a.out, "a") as f: f.write(f"\n## tinygrad conformance ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n`{cmd}`\n\n{table}\n")
  if a.detail:
    with open(a.detail, "w") as f:
      f.write(f"# tinygrad conformance: what the bridge changes\n\n`{cmd}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
              "| mode | test | outcome | cause |\n|---|---|---|---|\n" + "\n".join(detail) + "\n")

if __name__ == "__main__": main()
