"""lower.reference: values of every op, aliasing of views, STORE/AFTER/CALL effects, deep graphs, and clear errors."""
import math
import numpy as np
import pytest
from egraph.ir.errors import ShapeError
from hypothesis import given, settings, strategies as st
from egraph.ir.dtype import dtypes
from egraph.ir.errors import CallsatError, DTypeError, UnsupportedOpError
from egraph.ir.ops import Node, Ops, ParamArg, CallInfo, const, new_buffer
from lower.reference import evaluate, eval_node
from egraph.ir.storage import Storage, UnallocatedBufferError, host_buffer

@pytest.fixture
def S(): return Storage()

def view(S, data, dt=None):
  a = np.asarray(data)
  return host_buffer(a, dt, storage=S).reshape(a.shape)

def ev(node, S, params=None): return evaluate([node], S, params)[0]

def full(value, shape, dt, device="NPY"): return const(value, dt, device).reshape((1,)*len(shape)).expand(shape)

def P(slot, shape, dt=dtypes.float32, device="CPU"): return Node(Ops.PARAM, dt, (), ParamArg(slot, shape, device))

def call(body, *args): return Node(Ops.CALL, dtypes.void, (body, *args), CallInfo())

def check(got, want, dt):
  assert got.dtype == dt.np, (got.dtype, dt)
  np.testing.assert_array_equal(got, np.asarray(want, dtype=dt.np))

# ---------------------------------------------------------------------------------------------------------------------
# ALU, hand-computed

I32_MIN, I32_MAX = -2**31, 2**31 - 1
BIN = [
  # int32: C truncating division, remainder with the dividend's sign, x//0 == 0, x%0 == x, wrapping arithmetic
  (Ops.IDIV, dtypes.int32, [7, -7, 7, -7, 5, 0, I32_MIN], [2, 2, -2, -2, 0, 3, -1], [3, -3, -3, 3, 0, 0, I32_MIN]),
  (Ops.MOD, dtypes.int32, [7, -7, 7, -7, 5, 0, I32_MIN], [2, 2, -2, -2, 0, 3, -1], [1, -1, 1, -1, 5, 0, 0]),
  (Ops.ADD, dtypes.int32, [I32_MAX, -5, 3], [1, 2, -3], [I32_MIN, -3, 0]),
  (Ops.SUB, dtypes.int32, [I32_MIN, 5], [1, 7], [I32_MAX, -2]),
  (Ops.MUL, dtypes.int32, [65536, -3, 46341], [65536, 4, 46341], [0, -12, -2147479015]),
  (Ops.MAX, dtypes.int32, [7, -7, -1], [2, -2, -1], [7, -2, -1]),
  (Ops.CMPLT, dtypes.int32, [1, -1, 2], [2, -2, 2], [True, False, False]),
  (Ops.CMPNE, dtypes.int32, [1, 2], [1, 3], [False, True]),
  (Ops.CMPEQ, dtypes.int32, [1, 2], [1, 3], [True, False]),
  (Ops.AND, dtypes.int32, [12, -1], [10, 5], [8, 5]),
  (Ops.OR, dtypes.int32, [12, -8], [10, 1], [14, -7]),
  (Ops.XOR, dtypes.int32, [12, -1], [10, 0], [6, -1]),
  # int64
  (Ops.IDIV, dtypes.int64, [2**40 + 1, -2**40 - 1, 9], [2, 2, 0], [2**39, -2**39, 0]),
  (Ops.MOD, dtypes.int64, [2**40 + 1, -2**40 - 1, 9], [2, 2, 0], [1, -1, 9]),
  (Ops.MUL, dtypes.int64, [2**62, 3], [4, -2**40], [0, -3 * 2**40]),
  # uint8: wraps mod 256, compares unsigned
  (Ops.ADD, dtypes.uint8, [250, 1], [10, 2], [4, 3]),
  (Ops.SUB, dtypes.uint8, [3, 9], [5, 4], [254, 5]),
  (Ops.MUL, dtypes.uint8, [16, 3], [16, 5], [0, 15]),
  (Ops.IDIV, dtypes.uint8, [200, 7, 255], [7, 0, 16], [28, 0, 15]),
  (Ops.MOD, dtypes.uint8, [200, 7, 255], [7, 0, 16], [4, 7, 15]),
  (Ops.MAX, dtypes.uint8, [200, 0], [100, 1], [200, 1]),
  (Ops.CMPLT, dtypes.uint8, [200, 1], [100, 255], [False, True]),
  (Ops.XOR, dtypes.uint8, [255, 15], [1, 240], [254, 255]),
  # bool: C's (bool)(a op b)
  (Ops.ADD, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 1, 1]),
  (Ops.SUB, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 1, 0]),
  (Ops.MUL, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1]),
  (Ops.MAX, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 1, 1]),
  (Ops.IDIV, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1]),
  (Ops.MOD, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 1, 0]),
  (Ops.AND, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1]),
  (Ops.OR, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 1, 1]),
  (Ops.XOR, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 1, 0]),
  (Ops.CMPLT, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 0, 0]),
  (Ops.CMPEQ, dtypes.bool, [0, 0, 1, 1], [0, 1, 0, 1], [1, 0, 0, 1]),
  # float32: IEEE
  (Ops.FDIV, dtypes.float32, [1, -1, 0, 1, 7], [0, 0, 0, 4, 2], [math.inf, -math.inf, math.nan, 0.25, 3.5]),
  (Ops.ADD, dtypes.float32, [1.5, -2], [0.25, 2], [1.75, 0]),
  (Ops.SUB, dtypes.float32, [1.5, math.inf], [0.25, math.inf], [1.25, math.nan]),
  (Ops.MUL, dtypes.float32, [1.5, 0], [-2, math.inf], [-3, math.nan]),
  (Ops.MAX, dtypes.float32, [1.5, -0.5], [0.25, -0.25], [1.5, -0.25]),
  (Ops.CMPNE, dtypes.float32, [math.nan, 1], [math.nan, 1], [True, False]),
  (Ops.CMPLT, dtypes.float32, [math.nan, 1, -1], [1, 2, -2], [False, True, False]),
  # float16: computed and stored in half
  (Ops.ADD, dtypes.float16, [65504, 1], [65504, 0.5], [math.inf, 1.5]),
  (Ops.FDIV, dtypes.float16, [1, 1], [3, 0], [np.float16(1) / np.float16(3), math.inf]),
  (Ops.MUL, dtypes.float16, [300, 0.5], [300, 3], [math.inf, 1.5]),
  (Ops.MAX, dtypes.float16, [1, -3], [2, -4], [2, -3]),
]

@pytest.mark.parametrize("op,dt,a,b,want", BIN, ids=[f"{o.name}-{d.name}-{i}" for i, (o, d, *_) in enumerate(BIN)])
def test_binary(S, op, dt, a, b, want):
  out = ev(Node(op, None, (view(S, np.array(a, dtype=np.int64 if dt.is_int() else None).astype(dt.np)), view(S, np.array(b).astype(dt.np)))), S)
  check(out, want, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt)

UN = [
  (Ops.NEG, dtypes.int32, [5, -3, I32_MIN], [-5, 3, I32_MIN]),
  (Ops.NEG, dtypes.int64, [2**40], [-2**40]),
  (Ops.NEG, dtypes.uint8, [1, 0, 255], [255, 0, 1]),
  (Ops.NEG, dtypes.bool, [0, 1], [0, 1]),
  (Ops.NEG, dtypes.float32, [1.5, 0], [-1.5, -0.0]),
  (Ops.NEG, dtypes.float16, [1.5], [-1.5]),
  (Ops.EXP2, dtypes.float32, [3, -1, 0, -math.inf], [8, 0.5, 1, 0]),
  (Ops.EXP2, dtypes.float16, [4, 16], [16, math.inf]),
  (Ops.LOG2, dtypes.float32, [8, 1, 0, -1], [3, 0, -math.inf, math.nan]),
  (Ops.LOG2, dtypes.float16, [0.25], [-2]),
  (Ops.SQRT, dtypes.float32, [4, 2.25, -1], [2, 1.5, math.nan]),
  (Ops.SQRT, dtypes.float16, [9], [3]),
  (Ops.RECIPROCAL, dtypes.float32, [2, 0, -0.0, -4], [0.5, math.inf, -math.inf, -0.25]),
  (Ops.RECIPROCAL, dtypes.float16, [0.5], [2]),
  (Ops.SIN, dtypes.float32, [0, math.inf], [0, math.nan]),
  (Ops.TRUNC, dtypes.float32, [2.7, -2.7, 0.5, -0.0], [2, -2, 0, -0.0]),
  (Ops.TRUNC, dtypes.float16, [2.5, -1.5], [2, -1]),
  (Ops.TRUNC, dtypes.int32, [5, -5], [5, -5]),
]

@pytest.mark.parametrize("op,dt,a,want", UN, ids=[f"{o.name}-{d.name}-{i}" for i, (o, d, *_) in enumerate(UN)])
def test_unary(S, op, dt, a, want):
  out = ev(Node(op, None, (view(S, np.array(a).astype(dt.np)),)), S)
  check(out, want, dt)
  if op is Ops.NEG and dt.is_float(): assert np.signbit(out[-1]) == np.signbit(np.float32(want[-1]))

def test_sin_close(S):
  x = np.array([0.5, 1.0, math.pi / 2], dtype=np.float32)
  out = ev(Node(Ops.SIN, None, (view(S, x),)), S)
  assert out.dtype == np.float32 and np.allclose(out, [math.sin(0.5), math.sin(1.0), 1.0], atol=1e-6)

@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.SIN, Ops.RECIPROCAL, Ops.FDIV])
def test_float_only_ops_refuse_ints(S, op):
  x = view(S, np.array([4], dtype=np.int32))
  with pytest.raises(DTypeError, match=op.name): ev(Node(op, None, (x,) * (2 if op is Ops.FDIV else 1)), S)

@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.float16, dtypes.uint8, dtypes.bool])
def test_where(S, dt):
  c = view(S, np.array([True, False, True]))
  a, b = view(S, np.array([1, 1, 0]).astype(dt.np)), view(S, np.array([0, 1, 1]).astype(dt.np))
  check(ev(Node(Ops.WHERE, None, (c, a, b)), S), np.array([1, 1, 0]).astype(dt.np), dt)

def test_scalar_consts(S):
  check(ev(const(2.5, dtypes.float16).alu(Ops.MUL, const(2, dtypes.float16)), S), 5.0, dtypes.float16)
  out = ev(const(I32_MAX, dtypes.int32).alu(Ops.ADD, const(1, dtypes.int32)), S)
  assert out.shape == () and isinstance(out, np.ndarray) and out == I32_MIN
  check(ev(const(-1, dtypes.uint8), S), 255, dtypes.uint8)
  check(ev(full(3, (2, 2), dtypes.int64), S), [[3, 3], [3, 3]], dtypes.int64)

# ---------------------------------------------------------------------------------------------------------------------
# CAST, BITCAST, REDUCE

@pytest.mark.parametrize("src,sdt,ddt,want", [
  ([2.7, -2.7, 0.0, 0.5], dtypes.float32, dtypes.int32, [2, -2, 0, 0]),
  ([2.7, -2.7, 0.0, math.nan], dtypes.float32, dtypes.bool, [1, 1, 0, 1]),
  ([300, -1, 255], dtypes.int32, dtypes.uint8, [44, 255, 255]),
  ([0, 1], dtypes.bool, dtypes.float32, [0.0, 1.0]),
  ([2049, -3], dtypes.int32, dtypes.float16, [2048, -3]),
  ([65536.0, 1.5], dtypes.float32, dtypes.float16, [math.inf, 1.5]),
  ([200, 7], dtypes.uint8, dtypes.int64, [200, 7]),
  ([-2**33, 5], dtypes.int64, dtypes.int32, [0, 5]),
])
def test_cast(S, src, sdt, ddt, want):
  check(ev(view(S, np.array(src).astype(sdt.np)).cast(ddt), S), want, ddt)

def test_bitcast(S):
  check(ev(Node(Ops.BITCAST, dtypes.int32, (view(S, np.array([1.0, -2.0], dtype=np.float32)),)), S), [0x3F800000, -0x40000000], dtypes.int32)
  u8 = view(S, np.array([[1, 0, 0, 0, 2, 1, 0, 0]], dtype=np.uint8))
  out = ev(Node(Ops.BITCAST, dtypes.int32, (u8,)), S)
  assert out.shape == (1, 2)
  check(out, [[1, 258]], dtypes.int32)
  out = ev(Node(Ops.BITCAST, dtypes.uint8, (view(S, np.array([1, 256], dtype=np.int32)),)), S)
  check(out, [1, 0, 0, 0, 0, 1, 0, 0], dtypes.uint8)
  check(ev(Node(Ops.BITCAST, dtypes.float32, (const(0x40400000, dtypes.int32),)), S), 3.0, dtypes.float32)
  check(ev(Node(Ops.BITCAST, dtypes.bool, (view(S, np.array([0, 2], dtype=np.uint8)),)), S), [False, True], dtypes.bool)

def test_bitcast_is_a_copy(S):
  b = host_buffer(np.array([1.0, 2.0], dtype=np.float32), storage=S)
  out = ev(Node(Ops.BITCAST, dtypes.int32, (b,)), S)
  assert not np.shares_memory(out, S[b])

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7
@pytest.mark.parametrize("rop,axes", [(r, a) for r in (Ops.ADD, Ops.MUL, Ops.MAX) for a in [(0,), (1,), (2,), (0, 2), (0, 1, 2), ()]])
def test_reduce_float(S, rop, axes):
  f = {Ops.ADD: np.sum, Ops.MUL: np.prod, Ops.MAX: np.max}[rop]
  out = ev(Node(Ops.REDUCE, None, (view(S, X),), (rop, axes)), S)
  assert out.shape == tuple(1 if i in axes else s for i, s in enumerate(X.shape)) and out.dtype == np.float32
  np.testing.assert_allclose(out, f(X, axis=axes, keepdims=True), rtol=1e-6)

def test_reduce_dtypes(S):
  r = lambda x, rop, axes: ev(Node(Ops.REDUCE, None, (x,), (rop, axes)), S)
  check(r(view(S, np.array([200, 100], dtype=np.uint8)), Ops.ADD, (0,)), [44], dtypes.uint8)
  check(r(view(S, np.array([[2**30, 2**30], [1, 2]], dtype=np.int32)), Ops.ADD, (1,)), [[I32_MIN], [3]], dtypes.int32)
  check(r(view(S, np.array([[3, -2], [4, 5]], dtype=np.int64)), Ops.MUL, (0,)), [[12, -10]], dtypes.int64)
  check(r(view(S, np.array([[-3, -2], [-4, -5]], dtype=np.int32)), Ops.MAX, (0, 1)), [[-2]], dtypes.int32)
  with pytest.raises(ShapeError, match="sorted and unique"): r(view(S, np.array([[1, 2], [3, 4]], dtype=np.int32)), Ops.ADD, (1, 1))
  # half sums accumulate in float32: a float16 accumulator would stall at 2048
  check(r(view(S, np.ones(4096, dtype=np.float16)), Ops.ADD, (0,)), [4096], dtypes.float16)
  bools = view(S, np.array([[True, False], [True, True]]))
  check(r(bools, Ops.ADD, (1,)), [[True], [True]], dtypes.bool)
  check(r(bools, Ops.MUL, (1,)), [[False], [True]], dtypes.bool)
  check(r(bools, Ops.MAX, (0,)), [[True, True]], dtypes.bool)
  # empty reductions give the identity
  empty = view(S, np.zeros((0, 3), dtype=np.float32))
  check(r(empty, Ops.MAX, (0,)), [[-math.inf] * 3], dtypes.float32)
  check(r(empty, Ops.ADD, (0,)), [[0] * 3], dtypes.float32)
  check(r(view(S, np.zeros((0,), dtype=np.int32)), Ops.MAX, (0,)), [I32_MIN], dtypes.int32)

# ---------------------------------------------------------------------------------------------------------------------
# movement and views

A = np.arange(24, dtype=np.int32).reshape(2, 3, 4)

@pytest.mark.parametrize("mk,ref,is_view", [
  (lambda x: x.reshape((6, 4)), lambda a: a.reshape(6, 4), True),
  (lambda x: x.shrink(((1, 2), (0, 2), (1, 4))), lambda a: a[1:2, 0:2, 1:4], True),
  (lambda x: x.permute((2, 0, 1)), lambda a: a.transpose(2, 0, 1), True),
  (lambda x: x.flip((True, False, True)), lambda a: a[::-1, :, ::-1], True),
  (lambda x: x.shrink(((0, 2), (1, 2), (0, 4))).expand((2, 5, 4)), lambda a: np.broadcast_to(a[:, 1:2], (2, 5, 4)), True),
  (lambda x: x.pad(((1, 0), (0, 2), (1, 1))), lambda a: np.pad(a, ((1, 0), (0, 2), (1, 1))), False),
  (lambda x: x.permute((1, 0, 2)).reshape((3, 8)), lambda a: a.transpose(1, 0, 2).reshape(3, 8), False),
  (lambda x: x.reshape((24,)).shrink(((5, 5),)), lambda a: a.reshape(-1)[5:5], False),
])
def test_movement(S, mk, ref, is_view):
  b = host_buffer(A, storage=S)
  out = ev(mk(b.reshape(A.shape)), S)
  np.testing.assert_array_equal(out, ref(A))
  assert out.dtype == np.int32
  if out.size: assert np.shares_memory(out, S[b]) == is_view

def test_views_alias_storage(S):
  b = host_buffer(np.arange(8, dtype=np.float32), storage=S)
  sl = Node(Ops.SLICE, dtypes.float32, (b,), (2, 4))
  bc = Node(Ops.SLICE, dtypes.int32, (b,), (6, 2))
  perm = b.reshape((2, 4)).permute((1, 0))
  sv, bv, pv = evaluate([sl, bc, perm], S)
  np.testing.assert_array_equal(sv, [2, 3, 4, 5])
  np.testing.assert_array_equal(bv, np.array([6, 7], dtype=np.float32).view(np.int32))
  S.set_data(b, np.arange(8, dtype=np.float32) * 10)  # later writes are seen through every view
  np.testing.assert_array_equal(sv, [20, 30, 40, 50])
  np.testing.assert_array_equal(bv, np.array([60, 70], dtype=np.float32).view(np.int32))
  np.testing.assert_array_equal(pv[:, 1], [40, 50, 60, 70])

def test_slice_retypes_bytes(S):
  b = host_buffer(np.array([1, 0, 0, 0, 7, 0, 0, 0, 9], dtype=np.uint8), storage=S)
  check(ev(Node(Ops.SLICE, dtypes.int32, (b,), (4, 1)), S), [7], dtypes.int32)
  check(ev(Node(Ops.SLICE, dtypes.int32, (b,), (1, 2)), S), [7 << 24, 9 << 24], dtypes.int32)  # offset counts uint8 elements

def test_contiguous_copy_and_markers(S):
  b = host_buffer(np.arange(4, dtype=np.float32), storage=S)
  c, d, cb, cp = evaluate([b.contiguous(), Node(Ops.DETACH, None, (b,)), Node(Ops.CONTIGUOUS_BACKWARD, None, (b,)),
                           Node(Ops.COPY, None, (b,), "CPU")], S)
  assert not np.shares_memory(c, S[b]) and not np.shares_memory(cp, S[b]) and np.shares_memory(d, S[b]) and np.shares_memory(cb, S[b])
  S.set_data(b, np.zeros(4))
  np.testing.assert_array_equal(c, [0, 1, 2, 3]); np.testing.assert_array_equal(cp, [0, 1, 2, 3]); np.testing.assert_array_equal(d, 0)

# ---------------------------------------------------------------------------------------------------------------------
# STORE and AFTER

def test_store_into_shrink_of_reshape(S):
  b = host_buffer(np.zeros(12, dtype=np.float32), storage=S)
  tgt = b.reshape((3, 4)).shrink(((1, 3), (1, 3)))
  val = view(S, np.array([[1, 2], [3, 4]], dtype=np.float32))
  assert ev(tgt.store(val), S) is None
  want = np.zeros((3, 4), dtype=np.float32); want[1:3, 1:3] = [[1, 2], [3, 4]]
  np.testing.assert_array_equal(S[b], want.reshape(-1))

def test_store_through_permute_flip_slice(S):
  b = host_buffer(np.zeros(8, dtype=np.int32), storage=S)
  tgt = Node(Ops.SLICE, dtypes.int32, (b,), (2, 6)).reshape((2, 3)).permute((1, 0)).flip((True, False))
  ev(tgt.store(view(S, np.arange(6, dtype=np.int32).reshape(3, 2) + 1)), S)
  ref = np.zeros(8, dtype=np.int32); ref[2:8].reshape(2, 3).T[::-1] = np.arange(6).reshape(3, 2) + 1
  np.testing.assert_array_equal(S[b], ref)

@pytest.mark.parametrize("mk,name", [
  (lambda b: b.reshape((1, 4)).expand((3, 4)), "EXPAND"),
  (lambda b: b.shrink(((0, 2),)).pad(((1, 1),)), "PAD"),
  (lambda b: b.alu(Ops.ADD, b), "ADD"),
  (lambda b: b.contiguous(), "CONTIGUOUS"),
])
def test_store_needs_a_writable_view(S, mk, name):
  b = host_buffer(np.arange(4, dtype=np.float32), storage=S)
  tgt = mk(b)
  with pytest.raises(CallsatError, match=name): ev(tgt.store(full(1.0, tgt.shape, dtypes.float32)), S)
  np.testing.assert_array_equal(S[b], [0, 1, 2, 3])

def test_store_through_a_reshape_of_a_transpose_writes_its_elements(S):
  """A reshape numpy could only copy still names storage elements: the store writes them (Tensor.assign, issue item 3)."""
  b = host_buffer(np.zeros(4, dtype=np.float32), storage=S)
  ev(b.reshape((2, 2)).permute((1, 0)).reshape((4,)).store(view(S, np.arange(4, dtype=np.float32) + 1)), S)
  np.testing.assert_array_equal(S[b], [1, 3, 2, 4])

def test_store_allocates_its_target(S):
  b = new_buffer(4, dtypes.int32, "CPU")
  assert b not in S
  ev(b.store(full(7, (4,), dtypes.int32, "CPU")), S)
  np.testing.assert_array_equal(S[b], [7] * 4)

def test_after_increments_in_place(S):
  b = host_buffer(np.array([1, 2, 3], dtype=np.float32), storage=S)
  a = b.after(b.store(b.alu(Ops.ADD, full(1.0, (3,), dtypes.float32))))
  np.testing.assert_array_equal(ev(a, S), [2, 3, 4])
  np.testing.assert_array_equal(ev(a, S), [3, 4, 5])  # each evaluate runs the effects again
  np.testing.assert_array_equal(S[b], [3, 4, 5])

def test_after_orders_reads(S):
  b = host_buffer(np.array([1, 2, 3], dtype=np.float32), storage=S)
  c = view(S, np.array([10, 20, 30], dtype=np.float32))
  one = full(1.0, (3,), dtypes.float32)
  st_ = b.store(c)
  snap, after_read, computed = b.contiguous(), b.after(st_).alu(Ops.ADD, one), b.alu(Ops.MUL, one).after(st_)
  s, r, x = evaluate([snap, after_read, computed], S)
  np.testing.assert_array_equal(s, [1, 2, 3])       # taken before the store: a copy does not change
  np.testing.assert_array_equal(r, [11, 21, 31])    # read through AFTER sees the write
  np.testing.assert_array_equal(x, [10, 20, 30])    # a computed AFTER source runs after the deps

@pytest.mark.parametrize("rev", [False, True])
def test_reads_without_after_see_the_state_before_effects(S, rev):
  b = host_buffer(np.array([1, 2, 3], dtype=np.float32), storage=S)
  d = host_buffer(np.zeros(3, dtype=np.float32), storage=S)
  c = view(S, np.array([10, 20, 30], dtype=np.float32))
  assign = b.after(b.store(c))
  roots = [assign, b.alu(Ops.ADD, b), b.reshape((3, 1)), d.after(d.store(b)), b.alu(Ops.ADD, assign), b]
  vals = evaluate(roots[::-1] if rev else roots, S)
  a, plus, old, copied, mixed, raw = vals[::-1] if rev else vals
  np.testing.assert_array_equal(a, [10, 20, 30])
  np.testing.assert_array_equal(plus, [2, 4, 6])
  np.testing.assert_array_equal(old, [[1], [2], [3]])   # a snapshot, not the written buffer
  np.testing.assert_array_equal(copied, [1, 2, 3])      # d.assign(b) alongside b.assign(c) copies the old b
  np.testing.assert_array_equal(mixed, [11, 22, 33])    # old b + new b
  np.testing.assert_array_equal(raw, [1, 2, 3])
  np.testing.assert_array_equal(S[b], [10, 20, 30])

def test_store_value_overlapping_target(S):
  b = host_buffer(np.arange(4, dtype=np.int32), storage=S)
  ev(b.store(b.flip((True,))), S)
  np.testing.assert_array_equal(S[b], [3, 2, 1, 0])

def test_deep_chain_no_recursion(S):
  b = host_buffer(np.array([1, 2, 3, 4], dtype=np.int32), storage=S)
  one, x = full(1, (4,), dtypes.int32), b
  for _ in range(100_000): x = x.alu(Ops.ADD, one)
  np.testing.assert_array_equal(eval_node(x, S), [100_001, 100_002, 100_003, 100_004])

# ---------------------------------------------------------------------------------------------------------------------
# CALL

def test_call_with_params(S):
  a, b = host_buffer(np.array([1, 2, 3], dtype=np.float32), storage=S), host_buffer(np.array([4, 5, 6], dtype=np.float32), storage=S)
  out = new_buffer(3, dtypes.float32, "CPU")
  p0, p1, p2 = P(0, (3,)), P(1, (3,)), P(2, (3,))
  assert ev(call(p0.after(p0.store(p1.alu(Ops.ADD, p2))).sink(), out, a, b), S) is None
  np.testing.assert_array_equal(S[out], [5, 7, 9])

def test_params_of_a_plain_evaluate(S):
  p0, p1 = P(0, (2,)), P(1, (2,))
  x, y = np.zeros(2, dtype=np.float32), np.array([1, 2], dtype=np.float32)
  evaluate([p0.after(p0.store(p1.alu(Ops.MUL, p1))).sink()], S, [x, y])
  np.testing.assert_array_equal(x, [1, 4])
  with pytest.raises(CallsatError, match="slot=1"): evaluate([p1], S, [x])
  with pytest.raises(CallsatError, match="PARAM slot=0"): evaluate([p0], S, [np.zeros(3, dtype=np.float32)])

def test_call_writes_a_slice_arg(S):
  big = host_buffer(np.arange(8, dtype=np.float32), storage=S)
  p0, p1 = P(0, (4,)), P(1, (4,))
  body = p0.after(p0.store(p0.alu(Ops.MUL, p1))).sink()
  ev(call(body, Node(Ops.SLICE, dtypes.float32, (big,), (2, 4)), Node(Ops.SLICE, dtypes.float32, (big,), (4, 4))), S)
  np.testing.assert_array_equal(S[big], [0, 1, 2 * 4, 3 * 5, 4 * 6, 5 * 7, 6, 7])

def test_nested_call(S):
  # EX6 shape: the inner body's P0/P1 are the same nodes as the outer ones, meaning different arrays
  a = host_buffer(np.array([1, 2, 3], dtype=np.float32), storage=S)
  o1, o2 = new_buffer(3, dtypes.float32, "CPU"), new_buffer(3, dtypes.float32, "CPU")
  p0, p1, p2 = P(0, (3,)), P(1, (3,)), P(2, (3,))
  inner = call(p1.after(p1.store(p0.alu(Ops.MUL, p0))).sink(), p1, p0)    # inner: P1 := P0*P0 with P0=outer P1, P1=outer P0
  a0 = p0.after(inner)
  outer = call(Node.sink(a0, p2.after(p2.store(a0.alu(Ops.ADD, full(1.0, (3,), dtypes.float32, "CPU"))))), o1, a, o2)
  ev(outer, S)
  np.testing.assert_array_equal(S[o1], [1, 4, 9])
  np.testing.assert_array_equal(S[o2], [2, 5, 10])

def test_double_callify_shape(S):
  a, b = host_buffer(np.array([1, 2], dtype=np.int32), storage=S), host_buffer(np.array([3, 4], dtype=np.int32), storage=S)
  out = new_buffer(2, dtypes.int32, "CPU")
  p0, p1, p2 = P(0, (2,), dtypes.int32), P(1, (2,), dtypes.int32), P(2, (2,), dtypes.int32)
  c1 = call(p0.after(p0.store(p1.alu(Ops.ADD, p2))).sink(), p0, p1, p2)
  res = ev(out.after(call(p0.after(c1).sink(), out, a, b)), S)
  np.testing.assert_array_equal(res, [4, 6])

# ---------------------------------------------------------------------------------------------------------------------
# errors

def test_unallocated_read(S):
  b = new_buffer(4, dtypes.float32, "CPU")
  with pytest.raises(UnallocatedBufferError, match=f"uid={b.arg.uid}.*CPU"): ev(b.alu(Ops.ADD, b), S)
  assert isinstance(UnallocatedBufferError("x"), CallsatError)

def test_unsupported_ops_have_no_partial_effects(S):
  a = host_buffer(np.array([1, 2], dtype=np.float32), storage=S)
  g = Node(Ops.PARAM, dtypes.int32, (), ParamArg(-1, (), None, "v", (1, 8)))   # a symbolic PARAM: not evaluable
  effect = a.after(a.store(full(9.0, (2,), dtypes.float32)))
  with pytest.raises(UnsupportedOpError, match="later"): evaluate([Node.sink(effect, g)], S)
  np.testing.assert_array_equal(S[a], [1, 2])
  var = Node(Ops.PARAM, dtypes.int32, (), ParamArg(-1, (), None, "v", (1, 8)))
  with pytest.raises(UnsupportedOpError, match="later"): ev(Node(Ops.BIND, dtypes.int32, (var, const(3, dtypes.int32))), S)

def test_eval_node_returns_copy(S):
  b = host_buffer(np.arange(3, dtype=np.float32), storage=S)
  out = eval_node(b.reshape((3, 1)), S)
  out[:] = 100
  np.testing.assert_array_equal(S[b], [0, 1, 2])
  assert eval_node(Node.sink(b), S) is None

# ---------------------------------------------------------------------------------------------------------------------
# properties

@st.composite
def chains(draw, writable: bool):
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  steps = []
  cur = shape
  for _ in range(draw(st.integers(0, 6))):
    kinds = ["reshape", "shrink", "permute", "flip"] + ([] if writable else ["expand", "pad"])
    k = draw(st.sampled_from(kinds))
    if k == "reshape":
      n, dims = math.prod(cur), []
      if n == 0: dims = list(draw(st.sampled_from([(0,), (0, 1), (2, 0)])))
      while n > 1 and len(dims) < 3:
        d = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0])); dims.append(d); n //= d
      arg = tuple(dims + ([n] if n > 1 else [])) or ((1,) if n == 1 else (0,))
      arg = tuple(draw(st.permutations(arg)))
      if draw(st.booleans()): arg = arg + (1,)
    elif k == "shrink":
      arg = []
      for s in cur:
        a = draw(st.integers(0, s)); arg.append((a, draw(st.integers(a, s))))
      arg = tuple(arg)
    elif k == "permute": arg = tuple(draw(st.permutations(range(len(cur)))))
    elif k == "flip": arg = tuple(draw(st.lists(st.booleans(), min_size=len(cur), max_size=len(cur))))
    elif k == "expand": arg = tuple(draw(st.integers(1, 3)) if s == 1 else s for s in cur)
    else: arg = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in cur)
    steps.append((k, arg))
    cur = {"reshape": lambda: arg, "shrink": lambda: tuple(e - s for s, e in arg), "permute": lambda: tuple(cur[i] for i in arg),
           "flip": lambda: cur, "expand": lambda: arg, "pad": lambda: tuple(b + s + a for (b, a), s in zip(arg, cur))}[k]()
  return shape, steps

def _apply_node(x, steps):
  for k, arg in steps: x = getattr(x, k)(arg)
  return x

def _apply_np(a, steps, strict=False):
  for k, arg in steps:
    if k == "reshape": a = np.reshape(a, arg, copy=False) if strict else a.reshape(arg)
    elif k == "shrink": a = a[tuple(slice(s, e) for s, e in arg)]
    elif k == "permute": a = a.transpose(arg)
    elif k == "flip": a = a[tuple(slice(None, None, -1) if f else slice(None) for f in arg)]
    elif k == "expand": a = np.broadcast_to(a, arg)
    else: a = np.pad(a, arg)
  return a

@settings(max_examples=150, deadline=None)
@given(chains(writable=False))
def test_prop_movement_chain_matches_numpy(case):
  shape, steps = case
  S = Storage()
  ref = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
  b = host_buffer(ref, storage=S)
  out = ev(_apply_node(b.reshape(shape), steps), S)
  want = _apply_np(ref, steps)
  assert out.shape == want.shape and out.dtype == np.int32
  np.testing.assert_array_equal(out, want)

@settings(max_examples=150, deadline=None)
@given(chains(writable=True))
def test_prop_store_through_view_chain(case):
  shape, steps = case
  S = Storage()
  n = math.prod(shape)
  b = host_buffer(np.zeros(n, dtype=np.int32), storage=S)
  tgt = _apply_node(b.reshape(shape), steps)
  vals = np.arange(tgt.numel, dtype=np.int32).reshape(tgt.shape) + 100
  ref = np.zeros(n, dtype=np.int32)
  # where numpy would have to copy (a reshape of a non-contiguous view), the executor writes the elements the view names
  ref[_apply_np(np.arange(n).reshape(shape), steps)] = vals
  ev(tgt.store(view(S, vals)), S)
  np.testing.assert_array_equal(S[b], ref)
