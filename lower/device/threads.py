"""Python kernel threads: pinned single-thread executors that run a split kernel's chunks where the native pool
(lower/device/pool.py) is unavailable or busy."""
from __future__ import annotations
import ctypes, os
from concurrent.futures import ThreadPoolExecutor

PIN = os.environ.get("CALLSAT_PIN", "1") not in ("", "0")
_WORKERS: list = []
_CPUS = sorted(os.sched_getaffinity(0)) if PIN and hasattr(os, "sched_setaffinity") else []
try: _sched_getcpu = ctypes.CDLL(None).sched_getcpu   # glibc; None elsewhere: the caller then only waits
except (OSError, AttributeError): _sched_getcpu = None

def _worker(t: int) -> ThreadPoolExecutor:
  """The t-th kernel thread: a single-thread executor pinned (Linux, CALLSAT_PIN=1, the default) to the t-th CPU this
  process may use. Unpinned, the scheduler often woke a helper on the caller's CPU (queued behind it, or time-sliced
  with it), so a 2-thread matmul took as long as 1 thread in about half of the launches."""
  while len(_WORKERS) <= t:
    w = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"callsat-kernel{len(_WORKERS)}")
    if len(_WORKERS) < len(_CPUS) and len(_CPUS) > 1:
      try: w.submit(os.sched_setaffinity, 0, {_CPUS[len(_WORKERS)]}).result()
      except OSError: pass
    _WORKERS.append(w)
  return _WORKERS[t]

def run_split(fn, ptrs: list[int], cuts: list[int], extra: tuple) -> None:
  """Run chunk t = [cuts[t], cuts[t+1]) of a kernel on each of len(cuts) - 1 threads. The caller runs the first chunk
  itself and workers pinned to the other CPUs run the rest (waking a worker costs ~0.05 ms, 4% of a 512^3 matmul);
  where the caller's CPU is unknown, or too few CPUs are free of it, every chunk goes to a worker and the caller waits."""
  nt = len(cuts) - 1
  me = _sched_getcpu() if _sched_getcpu is not None and len(_CPUS) >= nt else None
  others = [t for t in range(len(_CPUS)) if _CPUS[t] != me][:nt - 1] if me is not None else []
  if me is not None and len(others) == nt - 1:
    futs = [_worker(t).submit(fn, *ptrs, cuts[i + 1], cuts[i + 2], *extra) for i, t in enumerate(others)]
    try: fn(*ptrs, cuts[0], cuts[1], *extra)
    finally:
      for f in futs: f.result()
  else:
    for f in [_worker(t).submit(fn, *ptrs, cuts[t], cuts[t + 1], *extra) for t in range(nt)]: f.result()
