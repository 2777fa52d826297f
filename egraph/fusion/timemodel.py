"""A calibrated model of kernel run time, for choosing what to store (issue 14).

Per kernel: `launch + combine(bytes / bandwidth + strided_bytes / bw_strided, ops / throughput[kind])`, where
  * bandwidth is `bw_cache` while the kernel's bytes (read + written) fit in `cache_bytes` (the last-level cache), else
    `bw_mem` (DRAM); reads of an intermediate of STREAM_BYTES or more are at `bw_readback` either way (lower/ writes it
    with non-temporal stores: a kernel reading it back measured 764 us in its program against 393 us timed alone, and a
    row sum reading back a 16 MB value in its program 33-37 GB/s where a + b past the cache moves 72; calibrated in
    sequence, as a program runs it); bytes read with a stride along the kernel's innermost (vectorized) loop, a transpose's, move at
    `bw_strided` (a column reduce is not strided: lower/ reduces COL_W columns at a time, reading rows);
  * ops = flops + (transcendental_ops - 1) * transcendentals + (division_ops - 1) * divisions: exp2/log2/sin are
    polynomials in lower/ (TRANSCENDENTAL), sqrt/reciprocal/division single slow instructions (DIVISION);
  * throughput depends on the kernel's form in lower/: "matmul" is the register-tiled matmul (operands in memory),
    "reduce" a plain accumulator nest (a fused matmul-shaped reduce runs here, untiled), "elementwise" vectorized loops,
    "copy" moves bytes only; a reduce's ops stream at the elementwise rate (a row sum, or a row sum of exps, is a
    vectorized loop) except for the share `reread` of its loads that re-read elements the kernel already read (the
    broadcast operands of a fused matmul or a conv-like reduce): that share runs at throughput["reduce"];
  * a kernel whose work (ops + elements read, lower/schedule/finalize's estimate) is under `parallel_work` runs on one thread
    (lower/device/native.py splits only bigger ones): its time is multiplied by `par_speedup`, what splitting gains; with
    CALLSAT_THREADS=1 no kernel is split (`load` sets parallel_work out of reach);
  * combine is "max" (bytes and arithmetic overlap) or "sum", whichever fitted the calibration kernels better.
The constants live in egraph/fusion/timemodel.json, written by `python bench/calibrate.py` on the machine; a device without
constants raises NoTimeModel (CUDA has none: callify stays on the rules there)."""
from __future__ import annotations
import dataclasses, json, os
from dataclasses import dataclass
from egraph.ir.errors import CallsatError
from egraph.ir.ops import ALU_OPS

# the op table's cost classes (egraph/ir/ops.py ALU_OPS)
TRANSCENDENTAL = frozenset(o for o, i in ALU_OPS.items() if i.cost == "transcendental")
DIVISION = frozenset(o for o, i in ALU_OPS.items() if i.cost == "division")

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timemodel.json")
KINDS = ("elementwise", "reduce", "matmul", "copy")
STREAM_BYTES = 8 << 20   # lower/schedule/finalize.STREAM_MIN_BYTES: a stored value this large is written with streaming stores, read back from DRAM

def _cpu_threads() -> int:
  """The threads lower/ splits CPU kernels across (lower/device/native's rule: CALLSAT_THREADS, else the CPUs this process may
  use); with one, no kernel is split and every kernel runs at the single-thread speed (time x par_speedup)."""
  try: return int(os.environ.get("CALLSAT_THREADS") or 0) or len(os.sched_getaffinity(0))
  except (ValueError, AttributeError): return os.cpu_count() or 1

def tinygrad_device_key(version: str, device: str) -> str:
  """The calibration file's name for tinygrad's kernels on `device` ("CPU:1" -> its kind) under tinygrad `version`
  (bench/calibrate_tinygrad.py writes it, the bridge's cost mode reads it): another version's kernels are other kernels."""
  return f"tinygrad-{version}/{device.partition(':')[0]}"

class NoTimeModel(CallsatError, LookupError):
  """No calibrated constants for a device (run bench/calibrate.py there, or keep fusion='rules')."""

@dataclass(frozen=True)
class KernelWork:
  """What one kernel does. bytes_read counts each element of each input once per kernel: re-reads of a broadcast or a
  matmul operand are assumed to hit in cache (lower/ tiles and blocks for that); their cost is in the kind's throughput."""
  bytes_read: int
  bytes_written: int
  flops: int                  # scalar ops executed, recompute multiplicity included (reduce accumulations too)
  kind: str = "elementwise"   # "elementwise" | "reduce" | "matmul" | "copy"
  device: str = "CPU"
  transcendentals: int = 0    # of which exp2/log2/sin, each costing transcendental_ops ops
  strided_bytes: int = 0      # of bytes_read, those gathered across the innermost loop (a transpose's reads)
  reread: float = 0.0         # of the loads executed, the share that re-reads an element (broadcast operands in a reduce)
  divisions: int = 0          # of flops, sqrt/reciprocal/division, each costing division_ops ops
  dram_bytes: int = 0         # of bytes_read, those of intermediates written with streaming stores (>= STREAM_BYTES): not in cache
  nodes: int = 0              # IR nodes the kernel computes (its AST's size: tinygrad lowers each on every eager call)

  @property
  def nbytes(self) -> int: return self.bytes_read + self.bytes_written

@dataclass(frozen=True)
class TimeModel:
  device: str
  launch_s: float             # per kernel: the prepared launch's ctypes call and loop setup
  bw_cache: float             # bytes/s when the kernel's bytes fit in cache_bytes
  bw_mem: float               # bytes/s beyond it
  bw_strided: float           # bytes/s of strided reads (transposes)
  cache_bytes: int
  throughput: dict            # kind -> ops/s (all threads)
  transcendental_ops: float
  combine: str = "max"        # "max" | "sum"
  parallel_work: int = 1 << 21
  par_speedup: float = 1.0    # how much faster a split kernel runs than one on a single thread
  division_ops: float = 1.0
  bw_readback: float = 0.0    # bytes/s of dram_bytes (a streamed intermediate read back by a later kernel); 0: bw_mem
  log_error: float = 0.0      # the calibration's mean |log(predicted / measured)| (written by bench/calibrate_tinygrad.py)
  hoists: bool = True         # the kernels compute a broadcast value once per loop it varies in (LLVM hoists it in callsat's
                              # kernels; tinygrad's recompute it in every iteration: its own op counts say so)
  eager_launch_s: float = 0.0  # per kernel of a realize outside a JIT, where it differs (tinygrad schedules and lowers each
                               # kernel on every eager call: bench/calibrate_tinygrad.py); 0: launch_s
  eager_node_s: float = 0.0    # ... and per node of each kernel's AST there (its lowering: ~0.35 ms an op on a CPU)
  node_s: float = 0.0          # per node, as this model prices it (eager(): eager_node_s; not stored)

  @classmethod
  def load(cls, device: str = "CPU", path: str = DATA) -> "TimeModel":
    """The constants for `device` ("CPU:1" reads "CPU") from the calibration file; NoTimeModel if it has none."""
    base = device.partition(":")[0]
    try:
      with open(path) as f: data = json.load(f)
    except FileNotFoundError: raise NoTimeModel(f"no time model file {path}: run python bench/calibrate.py") from None
    if base not in data.get("devices", {}):
      raise NoTimeModel(f"no calibrated time model for device {device!r} (have {sorted(data.get('devices', {}))}); "
                        "run bench/calibrate.py on it or use fusion='rules'")
    m = cls.from_dict(base, data["devices"][base])
    return dataclasses.replace(m, parallel_work=1 << 62) if base == "CPU" and _cpu_threads() == 1 else m   # never split


  @classmethod
  def from_dict(cls, device: str, d: dict) -> "TimeModel":
    tp = {k: float(d["throughput"][k]) for k in KINDS}
    return cls(device, float(d["launch_s"]), float(d["bw_cache"]), float(d["bw_mem"]), float(d["bw_strided"]), int(d["cache_bytes"]), tp,
               float(d["transcendental_ops"]), d.get("combine", "max"), int(d.get("parallel_work", 1 << 21)),
               float(d.get("par_speedup", 1.0)), float(d.get("division_ops", d["transcendental_ops"])),
               float(d.get("bw_readback", d["bw_mem"])), float(d.get("log_error", 0.0)), bool(d.get("hoists", True)),
               float(d.get("eager_launch_s", 0.0)), float(d.get("eager_node_s", 0.0)))

  def to_dict(self) -> dict:
    return {"launch_s": self.launch_s, "bw_cache": self.bw_cache, "bw_mem": self.bw_mem, "bw_strided": self.bw_strided,
            "cache_bytes": self.cache_bytes,
            "throughput": dict(self.throughput), "transcendental_ops": self.transcendental_ops, "combine": self.combine,
            "parallel_work": self.parallel_work, "par_speedup": self.par_speedup, "division_ops": self.division_ops,
            "bw_readback": self.readback, **({"log_error": self.log_error} if self.log_error else {}),
            **({"eager_launch_s": self.eager_launch_s} if self.eager_launch_s else {}), **({} if self.hoists else {"hoists": False}),
            **({"eager_node_s": self.eager_node_s} if self.eager_node_s else {})}

  def eager(self) -> "TimeModel":
    """This model for a realize outside a JIT: each kernel costs eager_launch_s to launch and eager_node_s per node to
    lower, where they were measured."""
    if not (self.eager_launch_s or self.eager_node_s): return self
    return dataclasses.replace(self, launch_s=self.eager_launch_s or self.launch_s, node_s=self.eager_node_s)

  @property
  def readback(self) -> float: return self.bw_readback or self.bw_mem

  def ops(self, w: KernelWork) -> float:
    return w.flops + (self.transcendental_ops - 1) * w.transcendentals + (self.division_ops - 1) * w.divisions

  def kernel_seconds(self, w: KernelWork) -> float:
    if w.kind not in self.throughput: raise CallsatError(f"KernelWork.kind {w.kind!r} is not one of {KINDS}")
    bw = self.bw_cache if w.nbytes <= self.cache_bytes else self.bw_mem
    ops = self.ops(w)
    slow = 1.0 if ops + w.bytes_read / 4 >= self.parallel_work else self.par_speedup   # lower/device/native splits only big kernels
    tb = slow * ((w.nbytes - w.strided_bytes - w.dram_bytes) / bw + w.dram_bytes / self.readback + w.strided_bytes / self.bw_strided)
    if w.kind == "reduce":   # the ops stream, but the share re-reading broadcast operands does not
      tc = slow * ops * ((1 - w.reread) / self.throughput["elementwise"] + w.reread / self.throughput["reduce"])
    else: tc = slow * ops / self.throughput[w.kind]
    return self.launch_s + self.node_s * w.nodes + (max(tb, tc) if self.combine == "max" else tb + tc)

  def program_seconds(self, works) -> float:
    """Kernels of one CALL run one after another."""
    return sum(self.kernel_seconds(w) for w in works)
