"""The kernel cache: a kernel compiles once per process, keyed by its body (lower.kernel.Kernel.key: the kernel IR without
its name: params with dtype/size/alignment/aliasing, domain, index expressions, values). Schedules are cached per CALL body
and argument aliasing, so running the same model on new data neither schedules nor compiles anything.

Misses of one run are compiled together, in modules of at most MODULE_OPS expression nodes, so the fixed cost of a
module (pass pipeline setup, codegen, engine) is paid once per batch rather than once per kernel."""
from __future__ import annotations
import hashlib
from lower.kernel import Kernel

MODULE_OPS = 3000

class KernelCache:
  def __init__(self):
    self._fns: dict = {}
    self.compiled = 0        # kernels compiled
    self.modules = 0         # LLVM modules compiled
    self.hits = 0
    self.schedules: dict = {}

  def __len__(self): return len(self._fns)
  def clear(self): self._fns.clear(); self.schedules.clear()

  def get(self, kernels: list[Kernel]) -> list:
    from lower.jit import compile_kernels
    keys = [k.key() for k in kernels]
    missing: dict = {}
    for k, key in zip(kernels, keys):
      if key in self._fns: self.hits += 1
      elif key not in missing: missing[key] = k
    batch, ops = [], 0
    def flush():
      nonlocal batch, ops
      if not batch: return
      for key, c in zip([b[0] for b in batch], compile_kernels([(k, name) for _, k, name in batch])): self._fns[key] = c
      self.compiled += len(batch); self.modules += 1
      batch, ops = [], 0
    for key, k in missing.items():
      n = k.ops()
      if batch and ops + n > MODULE_OPS: flush()
      batch.append((key, k, f"{k.name}_{hashlib.sha1(key.encode()).hexdigest()[:10]}")); ops += n
    flush()
    return [self._fns[key] for key in keys]

CACHE = KernelCache()
