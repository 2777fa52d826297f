"""Assigns through views of storage: every writable view (strided, permuted, shrunk, reshaped, flipped; on DISK too)
writes exactly the elements it names, as tinygrad does on CPU; a view that is not writable (EXPAND, PAD, CAST) raises
UnwritableViewError (a callsat choice: tinygrad drops such assigns, notes/quirks.md)."""
import numpy as np
import pytest
from egraph import Tensor
from egraph.engine.encode import UnwritableViewError, writable_chain

def _perm(a, *o): return a.transpose(o) if isinstance(a, np.ndarray) else a.permute(*o)
def _want(view, n, vals):
  """The expected storage: the view applied to numpy's arange names the flat index of each element it writes."""
  want = np.zeros(n, np.float32); want[view(np.arange(n))] = vals
  return want

# (name, view of a 24-element tensor; the same view of a numpy arange gives the indices it must write)
VIEWS = [
  ("step2", lambda a: a[::2]), ("step3_from1", lambda a: a[1::3]), ("neg_step", lambda a: a[::-2]),
  ("step5_odd_tail", lambda a: a[:23][::5]),                       # 23 is no multiple of 5: the chain pads, then shrinks
  ("shrink", lambda a: a[3:9]), ("reshape_shrink", lambda a: a.reshape(4, 6)[1:3, 2:5]),
  ("transpose", lambda a: a.reshape(4, 6).T), ("permute3", lambda a: _perm(a.reshape(2, 3, 4), 2, 0, 1)),
  ("strided_2d", lambda a: a.reshape(4, 6)[1:3, 1::2]), ("transpose_strided", lambda a: a.reshape(4, 6).T[::3]),
  ("flip_strided", lambda a: a.reshape(24)[::-1][1:9:2]), ("reshape_of_strided", lambda a: a.reshape(4, 6)[::2, ::3].reshape(-1)),
  ("int_index", lambda a: a.reshape(4, 6)[2]), ("column", lambda a: a.reshape(4, 6)[:, 3]),
]
DEVICES = ["CPU", "PYTHON"]

def _vals(shape): return (1 + np.arange(int(np.prod(shape)), dtype=np.float32)).reshape(shape)

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
def test_assign_through_a_writable_view_writes_exactly_its_elements(dev, name, view):
  a = Tensor(np.zeros(24, np.float32), device=dev).realize()
  y = a * 1                                     # a lazy reader built before the assign sees the write (tinygrad)
  v = view(a)
  vals = _vals(v.shape)
  v.assign(Tensor(vals, device=dev)).realize()
  want = _want(view, 24, vals)
  np.testing.assert_equal(a.numpy(), want)
  np.testing.assert_equal(v.numpy(), vals)
  np.testing.assert_equal(y.numpy(), want)

@pytest.mark.parametrize("dev", DEVICES)
def test_strided_assign_reading_its_own_buffer(dev):
  a = Tensor(np.arange(8, dtype=np.float32), device=dev).realize()
  a[::2].assign(a[1::2] * 10).realize()
  np.testing.assert_equal(a.numpy(), [10, 1, 30, 3, 50, 5, 70, 7])
  b = Tensor(np.arange(6, dtype=np.float32), device=dev).realize()
  v = b[::2]
  v += 1                                        # __iadd__ on a strided view writes through
  v.realize()
  np.testing.assert_equal(b.numpy(), [1, 1, 3, 3, 5, 5])

@pytest.mark.parametrize("dev", DEVICES)
def test_issue_examples(dev):
  a = Tensor(np.zeros(6, np.float32), device=dev).realize()
  v = a[::2]; v.assign(Tensor([1., 1, 1], device=dev)); v.realize()
  assert a.tolist() == [1, 0, 1, 0, 1, 0]
  a = Tensor(np.zeros(6, np.float32), device=dev).realize()
  v = a[1::3]; v.assign(Tensor([1., 1], device=dev)); v.realize()
  assert a.tolist() == [0, 1, 0, 0, 1, 0]

UNWRITABLE = [
  ("expand", lambda a: a[:3].reshape(1, 3).expand(2, 3), "EXPAND"),
  ("pad", lambda a: a.pad(((1, 1),)), "PAD"),
  ("pad_in_view", lambda a: a.pad(((0, 2),))[2:], "PAD"),
  ("cast", lambda a: a.cast("int32"), "CAST"),
  ("cast_of_view", lambda a: a[::2].cast("float16"), "CAST"),
]

@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name,view,op", UNWRITABLE, ids=[u[0] for u in UNWRITABLE])
def test_assign_through_an_unwritable_view_raises(dev, name, view, op):
  a = Tensor(np.arange(6, dtype=np.float32), device=dev).realize()
  v = view(a)
  with pytest.raises(UnwritableViewError, match=op): v.assign(Tensor(np.ones(v.shape), dtype=v.dtype, device=dev))
  np.testing.assert_equal(a.numpy(), np.arange(6))       # nothing was written, nothing changed

def test_computed_target_still_gets_a_fresh_buffer():
  a = Tensor([1., 2, 3], device="PYTHON").realize()
  t = (a * 2).pad(((1, 0),))                    # a PAD of a computed value is not a view of storage: no error
  t.assign(Tensor([7., 8, 9, 10], device="PYTHON")).realize()
  assert t.tolist() == [7, 8, 9, 10] and a.tolist() == [1, 2, 3]

def test_writable_chain():
  a = Tensor(np.zeros(24, np.float32), device="PYTHON").realize()
  assert writable_chain(a[::2].node) and writable_chain(a[:23][::5].node) and writable_chain(a.reshape(4, 6).T[::3].node)
  assert not writable_chain(a.pad(((0, 1),)).node) and not writable_chain(a.reshape(1, 24).expand(2, 24).node)

# DISK: tinygrad 0.14 refuses a[::2].assign and writes a[2:5].assign([5,6,7]) at wrong offsets ([5,6,5,6,7,0]); callsat
# writes the elements the view names
DISK_VIEWS = [("step2", lambda a: a[::2]), ("shrink", lambda a: a[2:5]), ("step3_from1", lambda a: a[1::3]),
              ("transpose_rows", lambda a: _perm(a.reshape(2, 3), 1, 0)[1:]), ("neg_step", lambda a: a[::-1])]

@pytest.mark.parametrize("name,view", DISK_VIEWS, ids=[v[0] for v in DISK_VIEWS])
def test_assign_through_a_view_of_disk(tmp_path, name, view):
  path = tmp_path / "d.bin"
  np.zeros(6, np.float32).tofile(path)
  a = Tensor.empty(6, device=f"DISK:{path}")
  v = view(a)
  vals = _vals(v.shape)
  v.assign(Tensor(vals).to(a.device)).realize()
  want = _want(view, 6, vals)
  np.testing.assert_equal(np.fromfile(path, np.float32), want)
  np.testing.assert_equal(a.to("PYTHON").numpy(), want)

def test_disk_expand_raises(tmp_path):
  path = tmp_path / "d.bin"
  np.zeros(6, np.float32).tofile(path)
  a = Tensor.empty(6, device=f"DISK:{path}")
  with pytest.raises(UnwritableViewError): a[:3].reshape(1, 3).expand(2, 3).assign(Tensor(np.ones((2, 3), np.float32)).to(a.device))

def test_tinygrad_agrees_on_cpu():
  """The oracle: tinygrad 0.14 on CPU writes the same elements for strided and permuted views."""
  tg = pytest.importorskip("tinygrad")
  for name, view in VIEWS[:10]:
    a = tg.Tensor.zeros(24, device="CPU").contiguous().realize()
    v = view(a); vals = _vals(v.shape)
    v.assign(tg.Tensor(vals, device="CPU")); v.realize()
    b = Tensor(np.zeros(24, np.float32), device="CPU").realize()
    view(b).assign(Tensor(vals, device="CPU")).realize()
    np.testing.assert_equal(b.numpy(), a.numpy(), err_msg=name)
