"""Nested CALL arguments on the native backend (precompiled functions): an argument that is storage after a write,
AFTER(view, STORE), binds to that storage and the call reads it after the write; a strided view, a MULTI's logical
value or computed data is copied into a temporary first. Values are checked against the numpy reference (PYTHON)."""
import numpy as np
import pytest
from egraph import Tensor, function, dtypes, Variable, UnsupportedOpError
from egraph.ir.ops import Node, Ops, ParamArg, CallInfo, new_buffer, const
from egraph.ir.storage import STORAGE
from lower.runtime import run_call
from lower.schedule.mem import Mem, view_mem

@function(precompile=True)
def twice(x): return x * 2

@function(precompile=True)
def colsum(x): return x.sum(axis=0)

def same(f):
  want, got = f("PYTHON"), f("CPU")
  np.testing.assert_allclose(got, want, rtol=1e-6)
  return got

def test_precompiled_on_a_symbolic_slice():
  """The program that raised 'a nested CALL argument computed by AFTER': the input is AFTER(SHRINK(fresh buffer), STORE)."""
  v = Variable("n", 1, 8)
  def f(dev):
    a = Tensor(np.arange(8, dtype=np.float32), device=dev).realize()
    return np.concatenate([twice(a[:v.bind(5)]).numpy(), (twice(a[:v.bind(3)]) + 1).numpy()])
  np.testing.assert_equal(same(f), [0, 2, 4, 6, 8, 1, 3, 5])

def test_view_mem_of_storage_after_a_write():
  p = Node(Ops.PARAM, dtypes.float32, (), ParamArg(0, (12,), "CPU"))
  bind = {0: Mem(("arg", 0), 0, dtypes.float32, 12)}
  v = p.reshape((3, 4)).shrink(((1, 3), (0, 4)))
  w = v.after(v.store(const(1.0, dtypes.float32, "CPU").reshape((1, 1)).expand((2, 4))))
  assert view_mem(w, bind) == Mem(("arg", 0), 16, dtypes.float32, 8)           # rows 1-2: elements 4..11
  assert view_mem(w.reshape((8,)), bind) == Mem(("arg", 0), 16, dtypes.float32, 8)
  assert view_mem(p.reshape((3, 4)).shrink(((0, 3), (1, 2))), bind) is None     # a column: strided
  assert view_mem(p.reshape((3, 4)).permute((1, 0)), bind) is None
  assert view_mem(p.pad(((1, 0),)), bind) is None

def test_assigned_and_strided_arguments():
  def column(dev):   # AFTER(RESHAPE(SHRINK(...))): a strided view after a write, copied in after the write
    c = Tensor.zeros(4, 3, device=dev).contiguous().realize()
    c[:, 1].assign(Tensor([1., 2, 3, 4], device=dev))
    return twice(c[:, 1]).numpy()
  np.testing.assert_equal(same(column), [2, 4, 6, 8])
  def transposed(dev):
    c = Tensor.zeros(2, 4, device=dev).contiguous().realize()
    t = c.permute(1, 0)
    t.assign(Tensor(np.arange(8, dtype=np.float32).reshape(4, 2), device=dev))
    return colsum(t).numpy()
  np.testing.assert_equal(same(transposed), [12, 16])
  def row(dev):      # a contiguous row after a write: bound in place
    c = Tensor.zeros(2, 4, device=dev).contiguous().realize()
    c[1].assign(Tensor([1., 2, 3, 4], device=dev))
    return twice(c).numpy()
  same(row)
  def computed(dev):
    a = Tensor([1., 2, 3], device=dev).realize()
    t = a * 2
    t.assign(a + 5)
    return twice(t).numpy()
  np.testing.assert_equal(same(computed), [12, 14, 16])
  same(lambda dev: twice(twice(Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=dev).realize())[1:, ::2]).numpy())

def test_reads_are_ordered_with_the_outer_writes():
  def write_then_call(dev):
    c = Tensor([1., 2, 3, 4], device=dev).contiguous().realize()
    c.assign(c + 10)
    return twice(c).numpy()
  np.testing.assert_equal(same(write_then_call), [22, 24, 26, 28])
  def call_then_write(dev):   # the strided argument is copied in after its own write and before c is zeroed
    c = Tensor(np.arange(8, dtype=np.float32).reshape(4, 2), device=dev).contiguous().realize()
    s = c[:, 1]
    s.assign(s + 100)
    y = twice(s)
    c.assign(c * 0)
    Tensor.realize(y, c)
    return np.concatenate([y.numpy(), c.numpy().ravel()])
  np.testing.assert_equal(same(call_then_write)[:4], [202, 206, 210, 214])

def test_sharded_argument_is_gathered():
  X = np.arange(8, dtype=np.float32).reshape(4, 2)
  for axis in (0, 1):
    d = ("CPU", "CPU:1")
    np.testing.assert_equal((twice(Tensor(X, device="PYTHON").shard(d, axis=axis) + 1) * 3).numpy(), (X + 1) * 6)

def test_a_call_writing_a_copied_argument_is_refused():
  """An opaque call writes only its fresh outputs; a hand-built one writing a strided argument cannot be bound."""
  p = Node(Ops.PARAM, dtypes.float32, (), ParamArg(0, (4,), "CPU"))
  arg = p.reshape((2, 2)).permute((1, 0))
  q = Node(Ops.PARAM, dtypes.float32, (), ParamArg(0, (2, 2), "CPU"))
  inner = Node.sink(q.after(q.store(const(5.0, dtypes.float32, "CPU").reshape((1, 1)).expand((2, 2)))))
  call = Node(Ops.CALL, dtypes.void, (inner, arg), CallInfo("w", True))
  buf = new_buffer(4, dtypes.float32, "CPU")
  STORAGE.set_data(buf, np.zeros(4, np.float32))
  with pytest.raises(UnsupportedOpError, match="writes its argument 0"):
    run_call(Node(Ops.CALL, dtypes.void, (Node.sink(p.after(call)), buf)))
