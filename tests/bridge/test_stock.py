"""The stand-in for tinygrad's own schedule (egraph/fusion/stock.py), the anchor of the bridge's cost mode: over the
shadow of a tinygrad graph it stores what tinygrad 0.14's rangeify stores, checked here by kernel count against the
schedule tinygrad itself makes for the same graph; and its rules, each on a small callsat graph."""
import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad")
from tinygrad import Tensor, Context, nn   # noqa: E402
from tinygrad.uop.ops import UOp, Ops as TOps   # noqa: E402
from tinygrad_cpu import require_cpu   # noqa: E402
from egraph.ir.ops import Ops   # noqa: E402
from egraph.fusion.stock import kernel_values, tinygrad_realized   # noqa: E402
from egraph.frontend.tensor import Tensor as CT   # noqa: E402
from egraph.bridge.convert import to_callsat   # noqa: E402
from egraph.bridge.shadow import Shadow   # noqa: E402

require_cpu()
RNG = np.random.default_rng(3)
def _t(*shape): return Tensor(RNG.standard_normal(shape).astype(np.float32)).realize()

def _programs() -> dict:
  x, w, w2 = _t(32, 48), _t(48, 64), _t(64, 10)
  img, k = _t(4, 3, 12, 12), _t(8, 3, 3, 3)
  bn = nn.BatchNorm(8)
  for name in ("running_mean", "running_var", "weight", "bias"): getattr(bn, name).realize()
  p, emb = _t(48, 64), nn.Embedding(50, 16)
  emb.weight = _t(50, 16)
  def assign():
    p.assign(p * 0.9 + (x.T @ (x @ p).relu()) * 0.01)
    return [p]
  return {
    "matmul": lambda: [x @ w], "matmul relu": lambda: [(x @ w).relu()], "two layers": lambda: [(x @ w).relu() @ w2],
    "softmax": lambda: [(x @ w).softmax(-1)], "layernorm": lambda: [x.layernorm() * 2 + 1],
    "mlp gradient": lambda: list(((x @ w).relu() @ w2).sum().gradient(w, w2)),
    "cross-entropy gradient":
      lambda: list(((x @ w).relu() @ w2).sparse_categorical_crossentropy(Tensor(list(range(10)) * 3 + [1, 2])).gradient(w, w2)),
    "conv": lambda: [img.conv2d(k, padding=1)], "conv bn relu": lambda: [bn(img.conv2d(k, padding=1)).relu()],
    "conv block": lambda: [bn(img.conv2d(k, padding=1)).relu().conv2d(_t(8, 8, 3, 3), padding=1).relu().mean((2, 3))],
    "embedding": lambda: [emb(Tensor([[1, 4, 9], [2, 2, 49]]))],
    "assign reading its target": assign,
  }

@pytest.mark.parametrize("name", list(_programs()))
def test_kernel_count_is_tinygrads(name):
  """The stand-in's kernels (one per computed value, one per stored intermediate, one more per assign that reads its
  target) are tinygrad's own schedule's, kernel for kernel in number."""
  with Context(DEV="CPU"):
    outs = _programs()[name]()
    cv, roots = to_callsat(UOp.sink(*[o.uop for o in outs]), consts=True)
    vals, self_reads = kernel_values(Shadow(cv, "CPU", folds=True).build(roots))
    ours = len(vals) + self_reads + len(tinygrad_realized(vals))
    linear = Tensor.schedule_linear(*_programs()[name]())
  theirs = sum(1 for c in linear.src if c.op is TOps.CALL and c.src[0].op is TOps.SINK)
  assert ours == theirs, (len(vals), self_reads, ours, theirs)

def _nodes(*ts): return [t.node for t in ts]

def test_softmax_stores_its_reduces_and_recomputes_the_exp():
  """A reduce read through a broadcast ends tinygrad's ranges: max and sum are stored; exp(x - max), read by the sum and
  the division with other ranges, is realized and then recomputed (it reads two buffers and holds no reduce)."""
  x = CT(RNG.standard_normal((8, 16)).astype(np.float32))
  e = (x - x.max(axis=1, keepdim=True)).exp()
  got = tinygrad_realized(_nodes(e / e.sum(axis=1, keepdim=True)))
  assert sorted(n.op.name for n in got) == ["REDUCE", "REDUCE"]

def test_a_shared_value_reading_many_buffers_is_stored():
  """Read by two reduces over different axes, a value of four buffers stays stored; of two it is recomputed."""
  a, b, c, d = (CT(RNG.standard_normal((8, 16)).astype(np.float32)) for _ in range(4))
  def shared(v): return tinygrad_realized(_nodes(v.sum(0).reshape(1, 16) + v.max(1).reshape(8, 1)))
  assert (a * b + c * d).node in shared(a * b + c * d)
  assert (a * b).node not in shared(a * b)

def test_a_value_under_a_broadcast_is_stored_only_while_it_holds_a_reduce():
  """Below a broadcast: a value holding a reduce (a row norm plus one) is stored, the reduce inside it; a row-normalized
  matrix (its sum stored: it is broadcast too) reads two buffers and no reduce, so the matmul recomputes it; a plain
  elementwise operand likewise."""
  x, y, s = (CT(RNG.standard_normal(sh).astype(np.float32)) for sh in ((8, 16), (16, 4), (8, 16)))
  v = (x * x).sum(axis=1) + 1
  assert {n.op for n in tinygrad_realized(_nodes(s * v.reshape(8, 1)))} == {Ops.ADD}
  norm = x / x.sum(axis=1, keepdim=True)
  assert [n.op for n in tinygrad_realized(_nodes(norm @ y))] == [Ops.REDUCE]
  assert not tinygrad_realized(_nodes((x * s + 1) @ y))
