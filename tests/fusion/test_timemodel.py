"""The kernel time model (egraph/fusion/timemodel.py) and the KernelWork read off lowered kernels (lower/schedule/work.py); a few fusion
corpus programs against numpy. No timing thresholds: times only have to be positive and finite."""
import dataclasses, json, math, os, sys
import numpy as np
import pytest
from egraph import Tensor, callify
from egraph.ir.ops import substitute
from egraph.fusion.timemodel import DATA, KernelWork, NoTimeModel, TimeModel
from lower.runtime import read, run_call
from lower.schedule.work import kernel_work, peak_bytes, program_of, program_work, sequence_seconds, step_seconds

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fusion_programs

@pytest.fixture(scope="module")
def model(): return TimeModel.load("CPU")

def works_of(*ts): return program_work(callify(*[t.node for t in ts]).call)

def test_loads_and_names_a_missing_device(model, tmp_path):
  assert model.device == "CPU" and model.launch_s > 0 and all(v > 0 for v in model.throughput.values())
  assert TimeModel.load("CPU:1") == model
  with pytest.raises(NoTimeModel, match="CUDA"): TimeModel.load("CUDA")
  with pytest.raises(NoTimeModel, match="no time model file"): TimeModel.load("CPU", str(tmp_path / "none.json"))

def test_data_file_round_trips(model, tmp_path):
  data = json.load(open(DATA))
  assert TimeModel.from_dict("CPU", model.to_dict()) == model
  p = tmp_path / "tm.json"
  p.write_text(json.dumps({"devices": {"CPU": model.to_dict()}}))
  assert TimeModel.load("CPU", str(p)) == model and data["devices"]["CPU"] == model.to_dict()

@pytest.mark.parametrize("kind", ["elementwise", "reduce", "matmul", "copy"])
def test_monotone_in_bytes_and_flops(model, kind):
  base = KernelWork(1 << 20, 1 << 20, 1 << 22, kind)
  t = model.kernel_seconds(base)
  assert 0 < t < math.inf
  for more in (KernelWork(1 << 24, 1 << 20, 1 << 22, kind), KernelWork(1 << 20, 1 << 24, 1 << 22, kind),
               KernelWork(1 << 20, 1 << 20, 1 << 28, kind), KernelWork(1 << 20, 1 << 20, 1 << 22, kind, transcendentals=1 << 22),
               KernelWork(1 << 20, 1 << 20, 1 << 22, kind, strided_bytes=1 << 20), KernelWork(1 << 20, 1 << 20, 1 << 22, kind, divisions=1 << 22),
               KernelWork(1 << 20, 1 << 20, 1 << 22, kind, reread=0.9)):
    assert model.kernel_seconds(more) >= t
  assert model.program_seconds([base, base]) == pytest.approx(2 * t)
  with pytest.raises(Exception, match="kind"): model.kernel_seconds(KernelWork(1, 1, 1, "nope"))

def test_elementwise_add_reads_8n_writes_4n():
  N = 4096
  a, b = (Tensor(np.ones(N, np.float32)).realize() for _ in range(2))
  assert works_of(a + b) == [KernelWork(8 * N, 4 * N, N, "elementwise")]

def test_row_sum_reads_4rc_writes_4r():
  R, C = 64, 96
  x = Tensor(np.ones((R, C), np.float32)).realize()
  [w] = works_of(x.sum(axis=1))
  assert (w.bytes_read, w.bytes_written, w.flops, w.kind, w.strided_bytes) == (4 * R * C, 4 * R, R * C, "reduce", 0)

def test_matmul_and_transpose_and_hoisted_work():
  A = Tensor(np.ones((64, 32), np.float32)).realize(); B = Tensor(np.ones((32, 48), np.float32)).realize()
  [w] = works_of(A @ B)
  assert (w.kind, w.flops, w.bytes_read, w.bytes_written) == ("matmul", 2 * 64 * 48 * 32, 4 * (64 * 32 + 32 * 48), 4 * 64 * 48)
  X = Tensor(np.ones((256, 128), np.float32)).realize()
  [t] = works_of(X.transpose(1, 0).contiguous())
  assert (t.kind, t.bytes_read, t.strided_bytes, t.flops) == ("copy", 4 * 256 * 128, 4 * 256 * 128, 0)
  r = Tensor(np.ones((256, 1), np.float32)).realize()
  [e] = works_of(X * r.sqrt())   # the row's sqrt is loop-invariant in the column loop: 256 sqrts, not 256*128
  assert (e.divisions, e.transcendentals, e.flops) == (256, 0, 256 + 256 * 128)

def test_sibling_reduces_count_their_own_loops():
  """Three reduces side by side in one kernel each run their own loop once per row: R*C accumulations each (their loops
  were multiplied together: R*C^3, and beautiful_mnist's gradient kernels counted 1e66 ops)."""
  R, C = 16, 40
  x = Tensor(np.ones((R, C), np.float32)).realize()
  [w] = works_of(x.sum(axis=1) + x.max(axis=1) + (x * x).sum(axis=1))
  assert (w.kind, w.flops) == ("reduce", 3 * R * C + R * C + 2 * R)   # 3 accumulations and x*x per element, 2 adds per row

def test_softmax_kernels_and_peak():
  x = Tensor(np.ones((32, 64), np.float32)).realize()
  res = callify(x.softmax().node)
  ws = program_work(res.call)
  assert len(ws) == len(program_of(res.call).steps) == 3 and ws[0].kind == "reduce" and ws[-1].kind == "elementwise"
  assert ws[-1].bytes_written == 4 * 32 * 64 and all(w.transcendentals > 0 for w in ws[1:])
  assert peak_bytes(res.call) >= 4 * 32 * 64   # the output buffer at least
  ts = step_seconds(res.call, min_s=1e-4, samples=1)
  assert len(ts) == 3 and all(0 < t < 1 for t in ts)
  seq = sequence_seconds(res.call, rounds=4)
  assert [len(s) for s in seq] == [4, 4, 4] and all(0 < t < 1 for s in seq for t in s)
  np.testing.assert_allclose(read(substitute([x.softmax().node], res.buffer_map)[0]), np.full((32, 64), 1 / 64, np.float32), rtol=1e-6)

def test_read_back_bytes_move_at_bw_readback(model):
  w = KernelWork(16 << 20, 8192, 4 << 20, "reduce", dram_bytes=16 << 20)
  slow = dataclasses.replace(model, bw_readback=model.bw_mem / 4, combine="sum")
  fast = dataclasses.replace(slow, bw_readback=model.bw_mem)
  gap = (16 << 20) / (model.bw_mem / 4) - (16 << 20) / model.bw_mem
  assert math.isclose(slow.kernel_seconds(w) - fast.kernel_seconds(w), gap, rel_tol=1e-9)
  d = model.to_dict(); del d["bw_readback"]   # a file from before bw_readback: read-backs at bw_mem, as then
  assert TimeModel.from_dict("CPU", d).readback == model.bw_mem and model.readback == model.bw_readback > 0

def test_kernel_work_of_a_snapshot_free_program_is_per_step():
  x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
  res = callify((x + 1).node, (x * 2).sum().node)
  assert [kernel_work(s.kernel, s.mems).kind for s in program_of(res.call).steps] == [w.kind for w in program_work(res.call)]

@pytest.mark.parametrize("name", ["lerp a+(b-a)*w 4M", "shared value reads 4 buffers, broadcast", "random DAG seed 3",
                                  "batchnorm backward NCHW 32x32x16x16", "embedding one-hot gather (nn.Embedding) V=512 D=64, 128 tokens",
                                  "softmax cross-entropy forward+backward 512x1000"])
def test_corpus_values_match_numpy(name):
  p = fusion_programs.by_name(name)
  roots, ref = p.build(np.random.default_rng(0))
  nodes = [r.node for r in roots]
  res = callify(*nodes)
  run_call(res.call)
  for v, want in zip(substitute(nodes, res.buffer_map), ref()):
    np.testing.assert_allclose(read(v).reshape(np.shape(want)), want, rtol=p.rtol, atol=p.rtol)

def test_corpus_is_complete():
  ps = fusion_programs.PROGRAMS
  groups = {p.group for p in ps}
  assert len(ps) >= 30 and len({p.name for p in ps}) == len(ps)
  assert {"patterns", "block", "attention", "norm", "softmax", "mlp", "lerp", "threshold", "conv", "random"} <= groups
  assert sum(p.group == "random" for p in ps) >= 10
  assert sum(p.group == "models" for p in ps) >= 15   # written from tinygrad's model code (issue 28)

def test_eager_launch_and_hoisting_round_trip(model):
  """A calibration of tinygrad's kernels carries its eager launch, its eager cost per node and that its kernels do not
  hoist; eager() prices with them (a kernel's nodes cost only there), a model without them is its own eager model."""
  tg = dataclasses.replace(model, eager_launch_s=3e-4, eager_node_s=2e-5, hoists=False)
  assert TimeModel.from_dict("CPU", tg.to_dict()) == tg and "hoists" not in model.to_dict()
  assert tg.eager().launch_s == 3e-4 and tg.eager().node_s == 2e-5 and tg.eager().hoists is False and model.eager() is model
  w = KernelWork(4096, 4096, 1024, "elementwise", "CPU", nodes=10)
  assert tg.kernel_seconds(w) == tg.kernel_seconds(dataclasses.replace(w, nodes=0))   # replays lower nothing
  assert tg.eager().kernel_seconds(w) - tg.kernel_seconds(w) == pytest.approx(3e-4 - model.launch_s + 10 * 2e-5)
