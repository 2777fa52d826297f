"""Floor 4 (lowering): the one backend interface. A backend runs CALLs for the device kinds it names (`devices`, from
egraph/ir/ops.py's DEVICE_KINDS); lower/runtime.py registers each once and routes every CALL to the backend of the
devices it touches. What every backend does with storage is written here once: `buffer_array` binds a CALL's buffer to
its host array (a written one allocated on demand, a read one that must exist). Adding a backend is one module with a
Backend subclass (plus its renderer) and one `register` line."""
from __future__ import annotations
import numpy as np
from egraph.ir.errors import CallsatError, DeviceError, UnsupportedOpError
from egraph.ir.ops import Node, DEVICE_KINDS
from egraph.ir.storage import Storage, UnallocatedBufferError

class Backend:
  """Runs CALLs on its device kinds. `rank`: a CALL touching the devices of several backends goes to the highest
  (the PYTHON reference can run every host device's data, CUDA copies host data in, CPU runs host-only CALLs).
  `multi_device`: whether it runs sharded CALLs (storage on a tuple of devices). run(wait=False) lets a backend return
  while the CALL's last kernel still runs: it returns an object whose finish() waits for it (run_call keeps it as the
  storage's `pending`), else None; a backend that always finishes ignores it."""
  name: str = ""
  devices: tuple[str, ...] = ()
  rank: int = 0
  multi_device: bool = True
  def run(self, call: Node, storage: Storage, wait: bool = True): raise NotImplementedError

BACKENDS: dict[str, Backend] = {}   # device kind -> its backend (host kinds without one of their own: the CPU's)

def register(b: Backend) -> Backend:
  """Put `b` in the registry for its device kinds; a kind served twice is a programming error."""
  for d in b.devices:   # all checked before any is registered
    if d not in DEVICE_KINDS: raise CallsatError(f"backend {b.name}: unknown device kind {d!r}")
    if d in BACKENDS and BACKENDS[d] is not b: raise CallsatError(f"device kind {d!r} has two backends: {BACKENDS[d].name}, {b.name}")
  BACKENDS.update(dict.fromkeys(b.devices, b))
  return b

def runnable() -> tuple[str, ...]: return tuple(BACKENDS)

def backend_for(kinds, multi: bool) -> Backend:
  """The backend of a CALL touching device `kinds` (`multi`: sharded over a tuple of devices)."""
  got = {BACKENDS[k] for k in kinds if k in BACKENDS}
  if not got: raise DeviceError(f"no backend runs devices {sorted(kinds)}; registered: {', '.join(BACKENDS)}")
  b = max(got, key=lambda x: x.rank)
  if multi and not b.multi_device:
    raise UnsupportedOpError(f"run_call: multi-device (sharded) CALLs on {b.devices[0]} are not supported (the {b.name} backend runs one "
                       f"device per CALL); shard over {' or '.join(sorted({x.devices[0] for x in BACKENDS.values() if x.multi_device}))} devices")
  return b

def buffer_array(storage: Storage, b: Node, written: bool, zero: bool = True) -> np.ndarray:
  """The host array of BUFFER `b` for a CALL: allocated when the CALL writes it (`zero`: filled with zeros first, for a
  buffer the CALL does not cover whole) or it is empty, else it must have been allocated or written before."""
  a = storage.get(b.arg.uid)
  if a is not None: return a
  if written or b.arg.size == 0: return storage.allocate(b, zero=zero)
  raise UnallocatedBufferError(f"BUFFER uid={b.arg.uid} ({b.arg.size} x {b.dtype.name} on {b.arg.device}) is read but "
                               "was never allocated or written")
