"""What each kernel of a lowered CALL does (egraph.timemodel.KernelWork, read off lower/'s Program), and what each one
takes to run (per-step times of a CALL's prepared plan): the two sides of the time model's calibration plot."""
from __future__ import annotations
import ctypes, math, statistics, time
from egraph.errors import CallsatError
from egraph.ir import Node, Ops
from egraph.storage import Storage, STORAGE
from egraph.timemodel import KernelWork
from lower import cache
from lower.kernel import Expr, Kernel
from lower.kernelize import kernelize
from lower.mem import Program, Step, arg_binding
from lower.native import check_bounds, memory_plan
from lower.runtime import run_call

TRANSCENDENTAL = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.FDIV, Ops.IDIV, Ops.MOD})
FREE = frozenset({Ops.BITCAST})   # reinterpretations: no instruction

def _uses(e: Expr, top: int) -> dict:
  """id(Expr) -> (Expr, times it is evaluated): `top` per domain point, times the sizes of the reduces around it. A node
  reached at several multiplicities is counted at the largest (the renderer evaluates it once per scope)."""
  out: dict = {}
  stack = [(e, top)]
  while stack:
    x, m = stack.pop()
    if out.get(id(x), (None, 0))[1] >= m: continue
    out[id(x)] = (x, m)
    inner = m * math.prod(v.size for v in x.arg[1]) if x.op == 'reduce' else m
    stack.extend((s, inner) for s in x.src)
  return out

def kernel_work(k: Kernel, mems: tuple = (), device: str = "CPU") -> KernelWork:
  """A kernel's bytes, ops and kind. Each input param's distinct elements read: per load, the product of the sizes of
  the loop vars its index uses (capped at the param's size), summed over the loads of that param and capped again."""
  dom = math.prod(v.size for v in k.domain)
  uses = _uses(k.store.value, dom)
  flops = trans = 0
  read: dict = {}
  strided = set()   # params a reduce reads across rows: its innermost reduce var is not the unit stride
  for x, _ in uses.values():
    if x.op == 'reduce':
      inner = x.arg[1][-1]
      strided.update(e.arg[0] for e in x.src[0].walk() if e.op == 'load' and (c := e.arg[1].coef(inner)) not in (0, 1))
  reduce = False
  for x, m in uses.values():
    if x.op == 'load':
      p, idx, _ = x.arg
      rvars = idx.vars()
      read[p] = read.get(p, 0) + min(k.params[p].size, math.prod(v.size for v in rvars) if rvars else 1)
    elif x.op == 'reduce':
      reduce, flops = True, flops + m * math.prod(v.size for v in x.arg[1])   # the accumulation
    elif x.op in ('const', 'valid') or x.op in FREE: continue
    else:
      flops += m
      if x.op in TRANSCENDENTAL: trans += m
  nb = {p: min(n, k.params[p].size) * k.params[p].dtype.itemsize for p, n in read.items()}
  st = k.params[k.store.param]
  bwritten = min(dom, st.size) * st.dtype.itemsize
  kind = "matmul" if k.tile else "reduce" if reduce else "copy" if flops == 0 else "elementwise"
  return KernelWork(sum(nb.values()), bwritten, flops, kind, device, trans, sum(nb[p] for p in strided if p in nb))

def step_work(s: Step, device: str = "CPU") -> KernelWork:
  """A Program step's work; a snapshot (memcpy) is a copy of its bytes."""
  if s.kernel is not None: return kernel_work(s.kernel, s.mems, device)
  src, _ = s.mems
  return KernelWork(src.nbytes, src.nbytes, 0, "copy", device)

def program_of(call: Node) -> Program:
  """The Program run_native runs for `call` (its schedule cache entry when it ran, else kernelized the same way)."""
  bind, _ = arg_binding(call)
  entry = cache.CACHE.schedules.get((call.src[0], tuple(bind[i] for i in range(len(bind))), check_bounds()))
  return entry[0] if entry is not None else kernelize(call.src[0], bind)

def program_work(call: Node, device: str = "CPU") -> list[KernelWork]:
  """One KernelWork per step of the CALL's Program, in run order."""
  return [step_work(s, device) for s in program_of(call).steps]

def peak_bytes(call: Node) -> int:
  """Memory a CALL needs besides its inputs: the temporaries' arena peak (lower/native.memory_plan) plus every buffer it
  writes (outputs and stored intermediates alike)."""
  prog = program_of(call)
  _, arena, _ = memory_plan(prog)
  written = {m.root: m for s in prog.steps if s.kernel is not None for m in s.mems[s.kernel.store.param:s.kernel.store.param + 1]}
  bind, bufs = arg_binding(call)
  size = {("arg", i): b.arg.size * b.dtype.itemsize for i, b in enumerate(bufs)}
  return arena + sum(size.get(r, m.nbytes) for r, m in written.items() if r[0] != "tmp")

def step_seconds(call: Node, storage: Storage = STORAGE, min_s: float = 0.002, samples: int = 5) -> list[float]:
  """Per step of the CALL's prepared plan (run it once first), the median over `samples` of its steady-state time, each
  sample the mean of enough back-to-back runs to last `min_s`. Kernels are run alone, on warm buffers."""
  run_call(call, storage)
  plan = cache.CACHE.plans.get(call)
  if plan is None: raise CallsatError("step_seconds: the CALL left no prepared plan (a DEBUG run, or not a native CALL)")
  def once(s):
    if type(s) is tuple: ctypes.memmove(*s)
    else: s()
  out = []
  for s in plan.steps:
    once(s)
    t0 = time.perf_counter(); once(s); t1 = time.perf_counter() - t0
    reps = max(1, int(min_s / max(t1, 1e-7)))
    ts = []
    for _ in range(samples):
      t0 = time.perf_counter()
      for _ in range(reps): once(s)
      ts.append((time.perf_counter() - t0) / reps)
    out.append(statistics.median(ts))
  return out
