"""What each kernel of a lowered CALL does (egraph.fusion.timemodel.KernelWork, read off lower/'s Program), and what each one
takes to run (per-step times of a CALL's prepared plan): the two sides of the time model's calibration plot."""
from __future__ import annotations
import ctypes, math, statistics, time
from egraph.ir.errors import CallsatError
from egraph.ir.ops import Node, Ops
from egraph.ir.storage import Storage, STORAGE
from egraph.fusion.timemodel import KernelWork, TRANSCENDENTAL, DIVISION
from lower.device import cache
from lower.schedule.kernel import Expr, Kernel
from lower.schedule.kernelize import kernelize
from lower.schedule.mem import Program, Step, arg_binding
from lower.device.native import binding_key, check_bounds, memory_plan
from lower.runtime import run_call

FREE = frozenset({Ops.BITCAST})   # reinterpretations: no instruction

def _loop_vars(x: Expr) -> set:
  """The loop vars an Expr node's own index reads (loads and PAD masks)."""
  if x.op == 'load': return x.arg[1].vars() | {v for bd in x.arg[2] for v in bd.idx.vars()}
  if x.op == 'valid': return {v for bd in x.arg for v in bd.idx.vars()}
  return set()

def _postorder(e: Expr) -> list:
  """Every node of an Expr DAG once, children first (iteratively: chains can be long)."""
  out, seen, stack = [], set(), [(e, False)]
  while stack:
    x, done = stack.pop()
    if done: out.append(x); continue
    if id(x) in seen: continue
    seen.add(id(x))
    stack.append((x, True)); stack.extend((c, False) for c in x.src if id(c) not in seen)
  return out

def _uses(k: Kernel) -> list:
  """(Expr, times it runs) for every node of the kernel's value: the product of the sizes of the loops around it, from
  the outermost down to the innermost one it depends on (LLVM hoists loop-invariant code, e.g. a row's 1/sqrt out of the
  column loop). The loops around a node are the kernel's domain and the loops of the reduces it sits in, not those of
  sibling reduces (a kernel of 40 sibling reduces runs each one's loop once per element, not their product)."""
  deps, post = {}, _postorder(k.store.value)
  for x in post:
    if x.op == 'reduce': deps[id(x)] = set().union(*(deps[id(c)] for c in x.src)) - set(x.arg[1])
    else: deps[id(x)] = _loop_vars(x).union(*(deps[id(c)] for c in x.src))
  # the reduce loops around each node, outermost first (a node shared by two nestings: the deeper one)
  around: dict = {id(k.store.value): ()}
  stack = [k.store.value]
  while stack:
    x = stack.pop()
    inner = around[id(x)] + tuple(v for v in x.arg[1] if v not in around[id(x)]) if x.op == 'reduce' else around[id(x)]
    for c in x.src:
      if id(c) not in around or len(around[id(c)]) < len(inner): around[id(c)] = inner; stack.append(c)
  dom, out = list(k.domain), []
  for x in post:
    own = tuple(x.arg[1]) if x.op == 'reduce' else ()   # a reduce's accumulation runs over its own vars
    order = dom + [v for v in around[id(x)] + own if v not in dom]
    d = deps[id(x)] | set(own)
    last = max((i for i, v in enumerate(order) if v in d), default=-1)
    out.append((x, math.prod(v.size for v in order[:last + 1])))
  return out

def kernel_work(k: Kernel, mems: tuple = (), device: str = "CPU", streamed: frozenset = frozenset()) -> KernelWork:
  """A kernel's bytes, ops and kind. Each input param's distinct elements read: per load, the product of the sizes of
  the loop vars its index uses (capped at the param's size), summed over the loads of that param and capped again;
  reread: the share of executed loads beyond those distinct elements; dram_bytes: those read from storage roots in
  `streamed` (written by an earlier kernel with streaming stores)."""
  dom = math.prod(v.size for v in k.domain)
  uses = _uses(k)
  flops = trans = divs = 0
  read: dict = {}
  live = [v for v in k.domain if v.size > 1]
  inner = live[-1] if live else None   # the vectorized loop of an elementwise kernel
  in_reduce = {id(e) for x, _ in uses if x.op == 'reduce' for e in x.src[0].walk()}   # rows either way (COL_W columns)
  strided = set() if k.tile or inner is None else {x.arg[0] for x, _ in uses if x.op == 'load' and id(x) not in in_reduce
                                                   and x.arg[1].coef(inner) not in (0, 1, -1)}   # transposes, permuted reads
  reduce, execs, distinct = False, 0, 0
  for x, m in uses:
    if x.op == 'load':
      p, idx, _ = x.arg
      rvars = idx.vars()
      d = min(k.params[p].size, math.prod(v.size for v in rvars) if rvars else 1)
      read[p], execs, distinct = read.get(p, 0) + d, execs + m, distinct + min(d, m)
    elif x.op == 'reduce':
      reduce, flops = True, flops + m   # the accumulation
    elif x.op in ('const', 'valid') or x.op in FREE: continue
    else:
      flops += m
      if x.op in TRANSCENDENTAL: trans += m
      elif x.op in DIVISION: divs += m
  nb = {p: min(n, k.params[p].size) * k.params[p].dtype.itemsize for p, n in read.items()}
  st = k.params[k.store.param]
  bwritten = min(dom, st.size) * st.dtype.itemsize
  kind = "matmul" if k.tile else "reduce" if reduce else "copy" if flops == 0 else "elementwise"
  dram = sum(n for p, n in nb.items() if p < len(mems) and p != k.store.param and mems[p].root in streamed)
  return KernelWork(sum(nb.values()), bwritten, flops, kind, device, trans, sum(nb[p] for p in strided if p in nb),
                    1 - distinct / execs if execs else 0.0, divs, dram)

def step_work(s: Step, device: str = "CPU", streamed: frozenset = frozenset()) -> KernelWork:
  """A Program step's work; a snapshot (memcpy) is a copy of its bytes."""
  if s.kernel is not None: return kernel_work(s.kernel, s.mems, device, streamed)
  src, _ = s.mems
  return KernelWork(src.nbytes, src.nbytes, 0, "copy", device)

def program_of(call: Node) -> Program:
  """The Program run_native runs for `call` (its schedule cache entry when it ran, else kernelized the same way)."""
  bind, _, key = binding_key(call, check_bounds())
  if (entry := cache.CACHE.schedules.get(key)) is not None: return entry.prog
  return kernelize(call.src[0], bind if bind is not None else arg_binding(call)[0])

def program_work(call: Node, device: str = "CPU") -> list[KernelWork]:
  """One KernelWork per step of the CALL's Program, in run order (a read of what an earlier step streamed out: DRAM)."""
  out, streamed = [], set()
  for s in program_of(call).steps:
    out.append(step_work(s, device, frozenset(streamed)))
    if s.kernel is not None and s.kernel.stream: streamed.add(s.mems[s.kernel.store.param].root)
  return out

def peak_bytes(call: Node) -> int:
  """Memory a CALL needs besides its inputs: the temporaries' arena peak (lower/device/native.memory_plan) plus every buffer it
  writes (outputs and stored intermediates alike)."""
  prog = program_of(call)
  _, arena, _ = memory_plan(prog)
  written = {m.root: m for s in prog.steps if s.kernel is not None for m in s.mems[s.kernel.store.param:s.kernel.store.param + 1]}
  bind, bufs = arg_binding(call)
  size = {("arg", i): b.arg.size * b.dtype.itemsize for i, b in enumerate(bufs)}
  return arena + sum(size.get(r, m.nbytes) for r, m in written.items() if r[0] != "tmp")

def _once(s) -> None:
  if type(s) is tuple: ctypes.memmove(*s)
  else: s()

def _plan_steps(call: Node, storage: Storage, who: str) -> list:
  run_call(call, storage)
  plan = cache.CACHE.plans.get(call)
  if plan is None: raise CallsatError(f"{who}: the CALL left no prepared plan (a DEBUG run, or not a native CALL)")
  return plan.steps

def step_seconds(call: Node, storage: Storage = STORAGE, min_s: float = 0.002, samples: int = 5) -> list[float]:
  """Per step of the CALL's prepared plan (run it once first), the median over `samples` of its steady-state time, each
  sample the mean of enough back-to-back runs to last `min_s`. Kernels are run alone, on warm buffers."""
  steps, once, out = _plan_steps(call, storage, "step_seconds"), _once, []
  for s in steps:
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

def sequence_seconds(call: Node, rounds: int = 20, storage: Storage = STORAGE) -> list[list[float]]:
  """Per step of the CALL's prepared plan, its time in each of `rounds` runs of the whole plan in order: each step
  finds the caches its predecessors left (a value streamed out to DRAM by one kernel is read back by the next), which
  step_seconds' back-to-back runs of one step hide."""
  steps = _plan_steps(call, storage, "sequence_seconds")
  out: list[list[float]] = [[] for _ in steps]
  clock = time.perf_counter
  for _ in range(rounds):
    for s, ts in zip(steps, out):
      t0 = clock(); _once(s); ts.append(clock() - t0)
  return out
