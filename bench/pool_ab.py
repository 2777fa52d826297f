"""Two settings of the native kernel pool (lower/device/pool.py) in one process, quiet and beside other load: two pools
made side by side, the process's pool switched between them on wall-clock slots, prepared kernels (bench/busy.py's) and
a user matmul timed in each slot; medians per setting. In-process because fresh processes on this 2-vCPU VM differ by
more than the effects (notes/benchmarks.md).

  python bench/pool_ab.py [--compare move|pin] [--phases quiet busy busy-free peer] [--seconds 40] [--out FILE]

  --compare move   the preempted-worker move (MOVE_AFTER) on and off, both pools pinned
            pin    pinned workers against unpinned ones (CALLSAT_PIN=0), both moving
  phases   quiet; busy: a spinning process pinned to the last CPU (bench/busy.py's); busy-free: the same unpinned;
           peer: a second copy of this bench beside it (two callsat processes on the same CPUs), on the same slots so
           both run the same setting at the same time; its medians are reported too"""
from __future__ import annotations
import argparse, ast, datetime, os, statistics, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
from busy import prepared, timeit, workloads as busy_workloads
from lower.device import pool as P

SLOT_S = 2.0
COMPARE = {"move": (("move", {"pin": True}, None), ("never", {"pin": True}, 1e4)),   # 1e4 x a chunk's time: never
           "pin": (("pinned", {"pin": True}, None), ("unpinned", {"pin": False}, None))}

REPS = {"row sum 4096^2": 20, "elementwise 16M": 4, "matmul 512^3": 30}   # per sample

def workloads(rng) -> dict:
  """name -> (run once, reps per sample): bench/busy.py's row sum, elementwise and 512^3 matmul as prepared kernels,
  and its 256^3 matmul as a user writes it."""
  ws, T = busy_workloads(rng)
  out = {n: (prepared(T, ws[n][2], ws[n][0], ws[n][1]), reps) for n, reps in REPS.items()}
  a, b = (T(v).realize() for v in ws["matmul 256^3"][:2])
  out["user matmul 256^3"] = (lambda: (a @ b).realize(), 200)
  return out

def pools(compare: str, cpus: list[int]) -> dict:
  """setting name -> its pool (the process's own pool closed)."""
  if (p := P.pool()) is not None: p.close()
  out, move = {}, P.MOVE_AFTER
  try:
    for name, kw, after in COMPARE[compare]:
      P.MOVE_AFTER = move if after is None else after
      out[name] = P.Pool(cpus, **kw)
  finally: P.MOVE_AFTER = move
  return out

def run_slots(ws: dict, ps: dict, t0: float, seconds: float) -> dict:
  """(workload, setting) -> sample ms: slot i (SLOT_S from t0) runs setting i % 2, its last 0.3 s left idle."""
  names, res = list(ps), {}
  while time.time() < t0: time.sleep(0.005)
  for i in range(int(seconds / SLOT_S)):
    P._POOL = ps[names[i % 2]]
    end = t0 + (i + 1) * SLOT_S
    time.sleep(0.05)
    while time.time() < end - 0.3:
      for w, (f, reps) in ws.items(): res.setdefault((w, names[i % 2]), []).append(timeit(f, reps) * 1e3)
    while time.time() < end: time.sleep(0.005)
  return res

def medians(res: dict) -> dict: return {k: statistics.median(v) for k, v in res.items()}

def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--compare", choices=list(COMPARE), default="move")
  ap.add_argument("--phases", nargs="+", default=["quiet", "busy"], choices=["quiet", "busy", "busy-free", "peer"])
  ap.add_argument("--seconds", type=float, default=40, help="per phase, split in slots of 2 s")
  ap.add_argument("--out")
  ap.add_argument("--peer-of", type=float, help=argparse.SUPPRESS)   # the peer copy: its t0
  a = ap.parse_args()
  if P.pool() is None: sys.exit("pool_ab.py: the native kernel pool is unavailable here (Linux x86-64 only)")
  cpus = sorted(os.sched_getaffinity(0))
  ws = workloads(np.random.default_rng(0))   # made (and run once) on the process's own pool
  ps = pools(a.compare, cpus)
  if a.peer_of is not None:
    print(repr(medians(run_slots(ws, ps, a.peer_of, a.seconds))), flush=True)
    return
  a_name, b_name = list(ps)
  rows = []
  for phase in a.phases:
    t0, side, peer = time.time() + 1.0, None, None
    if phase in ("busy", "busy-free"):
      side = subprocess.Popen((["taskset", "-c", str(cpus[-1])] if phase == "busy" else []) + [sys.executable, "-c", "while True: pass"])
    if phase == "peer":   # it builds its workloads first: the slots start once both are ready
      t0 = time.time() + 25.0
      peer = subprocess.Popen([sys.executable, __file__, "--compare", a.compare, "--seconds", str(a.seconds), "--peer-of", str(t0)],
                              stdout=subprocess.PIPE, text=True)
    try: res = medians(run_slots(ws, ps, t0, a.seconds))
    finally:
      if side is not None: side.kill(); side.wait()
    theirs = ast.literal_eval(peer.communicate()[0].strip().splitlines()[-1]) if peer is not None else {}
    for w in ws:
      ma, mb = res[(w, a_name)], res[(w, b_name)]
      other = f" (peer: {theirs[(w, a_name)]:.3f} / {theirs[(w, b_name)]:.3f}, {theirs[(w, b_name)] / theirs[(w, a_name)]:.2f}x)" if theirs else ""
      rows.append(f"| {w} | {phase} | {ma:.3f} | {mb:.3f} | {mb / ma:.2f}x{other} |")
  text = "\n".join([f"`python bench/pool_ab.py --compare {a.compare} --phases {' '.join(a.phases)} --seconds {a.seconds:g}` "
                    f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {len(cpus)} CPUs): ms medians of the "
                    f"samples; {b_name} / {a_name} > 1: {a_name} is faster.", "",
                    f"| workload | phase | {a_name} ms | {b_name} ms | {b_name} / {a_name} |", "|---|---|---|---|---|", *rows])
  print(text)
  if a.out:
    with open(a.out, "a") as fh: fh.write("\n" + text + "\n")

if __name__ == "__main__": main()
