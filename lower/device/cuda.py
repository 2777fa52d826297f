"""Floor 4 (lowering): the CUDA device. `CudaBackend` runs a CALL on GPU n (device "CUDA:n") through libcuda
(lower/device/cuda_driver.py), with the kernels and launch plan lower/render/cuda/render.py makes; `emulator()` runs the
same plans on the CPU (the renderer's check without a GPU)."""
from __future__ import annotations
from egraph.ir.errors import CallsatError, DeviceError, UnsupportedOpError
from egraph.ir.ops import Ops, toposort
from lower.device import cuda_driver as drv
from lower.device.backend import Backend, buffer_array
from lower.render.cuda.render import Lowered, plans

def run_lowered(lw: Lowered, storage, backend, module=None) -> None:
  """Run a lowered CALL on `backend` over numpy `storage` (egraph.ir.storage.Storage): outputs are allocated on demand."""
  arrays = {}
  for name, b in lw.plan["buffers"].items():
    if b["kind"] == "tmp": continue
    arrays[name] = buffer_array(storage, lw.nodes[name], b["written"])
  drv.execute(lw.plan, arrays, backend, module)

_EMU: drv.Emulator | None = None
_DEV: dict = {}

def emulator() -> drv.Emulator:
  global _EMU
  if _EMU is None: _EMU = drv.Emulator()
  return _EMU

def device(ordinal: int = 0) -> drv.CudaDevice:
  """GPU `ordinal` (cached); DeviceError naming what is missing (driver, GPU) otherwise."""
  if ordinal not in _DEV:
    try: _DEV[ordinal] = drv.CudaDevice(ordinal)
    except drv.CudaUnavailable as e: raise DeviceError(f"device 'CUDA' cannot execute here: {e}") from e
  return _DEV[ordinal]

def _ordinal(call) -> int:
  devs = set()
  for n in toposort([call]):
    for d in (n.device, n.arg.device if n.op is Ops.PARAM else None):
      for x in (d if isinstance(d, tuple) else (d,)):
        if isinstance(x, str) and x.partition(":")[0] == "CUDA": devs.add(int(x.partition(":")[2] or 0))
  if len(devs) > 1: raise UnsupportedOpError(f"CUDA backend: one CALL on several GPUs ({sorted(devs)}) is not supported")
  return devs.pop() if devs else 0

def run_emulated(call, storage, **kw) -> None:
  """Execute a CALL with the emitted CUDA compiled as C++ against lower/device/cuda_emu.h (the CPU check of the renderer)."""
  lw = plans([call], **kw)[0]
  run_lowered(lw, storage, emulator())

def run_cuda(call, storage) -> None:
  """Execute a CALL on the GPU (CUDA:n is GPU n). Raises DeviceError when no driver/GPU/compiler is here, before
  touching storage."""
  dev = device(_ordinal(call))
  lw = plans([call])[0]
  try: run_lowered(lw, storage, dev)
  except drv.CudaUnavailable as e: raise DeviceError(f"device 'CUDA' cannot execute here: {e}") from e
  except drv.CudaFailure as e: raise CallsatError(f"CUDA backend: {e}") from e

class CudaBackend(Backend):
  """The "CUDA" device kind: one GPU per CALL."""
  name, devices, rank, multi_device = "cuda", ("CUDA",), 1, False
  def run(self, call, storage, wait: bool = True) -> None: run_cuda(call, storage)
