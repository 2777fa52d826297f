"""tinygrad 0.14's counter-based RNG, bit for bit: Threefry-2x32 of counters under a per-device key.

`manual_seed(s)` resets the state. The first draw on a device makes its key from sha256 of how many devices drew
before it and the seed; every draw of `num` 32-bit words advances the device's 64-bit counter by `num`. A draw's own
key is Threefry of the counter (computed here on the host, as its inputs are known), and its words are the THREEFRY
of the counters 0..n/2 and n/2..n under that key, in the graph: `rand` is uint32/uint64 arithmetic, THREEFRY, shifts
and bitcasts, as in tinygrad."""
from __future__ import annotations
import hashlib, math, threading, time
import numpy as np
from egraph.ir.dtype import DType, dtypes
from egraph.ir.errors import DTypeError, ShapeError
from egraph.ir.ops import Node, Ops, const
from egraph.ir.storage import host_buffer
from lower.numeric import threefry2x32

M32 = 0xFFFFFFFF

class _State:
  def __init__(self, seed: int):
    self.seed, self.keys, self.counters, self.lock = seed, {}, {}, threading.Lock()

_STATE = _State(int(time.time()))

def manual_seed(seed: int = 0) -> None:
  """Reset the seed, every device's key and every counter (tinygrad's Tensor.manual_seed)."""
  global _STATE
  _STATE = _State(int(seed))

def next_counter(device: str, num: int) -> tuple[tuple[int, int], tuple[int, int]]:
  """(key words, counter words before the draw) for a draw of `num` 32-bit words on `device`; advances the counter."""
  st = _STATE
  with st.lock:
    if device not in st.keys:
      h = int.from_bytes(hashlib.sha256(len(st.keys).to_bytes(4, "big")).digest(), "big")
      st.keys[device], st.counters[device] = (h & M32, st.seed & M32), 0
    c = st.counters[device]
    st.counters[device] = (c + num) & ((1 << 64) - 1)
  return st.keys[device], (c & M32, c >> 32)

def _threefry_host(key: tuple[int, int], lo: int, hi: int) -> tuple[int, int]:
  x = threefry2x32(np.uint64((hi << 32) | lo), np.uint64((key[1] << 32) | key[0]))
  return int(x) & M32, int(x) >> 32

def _full(v, dt: DType, device, n: int) -> Node: return const(v, dt, device).reshape((1,)).expand((n,))

def _cat(a: Node, b: Node) -> Node:
  """a ++ b along the only axis (tinygrad's cat: pad both to the full length and add)."""
  n, m = a.shape[0], b.shape[0]
  return Node(Ops.ADD, None, (a.pad(((0, m),)), b.pad(((n, 0),))))

def random_bits(key: tuple[int, int], counter: tuple[int, int], num: int, device) -> Node:
  """`num` random uint32 words (a (num,) node), tinygrad's RandMixin.random_bits."""
  parts = []
  for i in range(0, num, M32):
    chunk = min(num - i, M32)
    lo = (counter[0] + (i & M32)) & M32
    hi = (counter[1] + (i >> 32) + (lo < counter[0])) & M32
    k = _threefry_host(key, lo, hi)
    half = -(-chunk // 2)
    c0 = host_buffer(np.arange(half, dtype=np.uint32))
    c0 = c0 if device == "NPY" else Node(Ops.COPY, dtypes.uint32, (c0,), device)
    c1 = Node(Ops.ADD, None, (c0, _full(half, dtypes.uint32, device, half)))
    x = Node(Ops.OR, None, (Node(Ops.SHL, None, (c1.cast(dtypes.uint64), _full(32, dtypes.uint64, device, half))),
                            c0.cast(dtypes.uint64)))
    t = Node(Ops.THREEFRY, None, (x, _full((k[1] << 32) | k[0], dtypes.uint64, device, half)))
    hi_words = Node(Ops.SHR, None, (t, _full(32, dtypes.uint64, device, half))).cast(dtypes.uint32)
    parts.append(_cat(t.cast(dtypes.uint32), hi_words).shrink(((0, chunk),)))
  out = parts[0]
  for p in parts[1:]: out = _cat(out, p)
  return out

def rand(shape: tuple[int, ...], dtype: DType, device) -> Node:
  """Uniform [0, 1) of `dtype` (a float): random words, the top mantissa bits under the exponent of 1.0, minus 1."""
  if not dtype.is_float(): raise DTypeError(f"rand only supports float dtypes, got {dtype.name}")
  if any(not isinstance(s, int) or s < 0 for s in shape): raise ShapeError(f"rand: invalid shape {shape}")
  n = math.prod(shape)
  num = -(-n * dtype.itemsize // 4)
  key, counter = next_counter(device, num)
  if num == 0: return _full(0.0, dtype, device, 0).reshape(shape)
  bits = random_bits(key, counter, num, device)
  udt = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[dtype.itemsize]
  u = Node(Ops.BITCAST, udt, (bits,))
  m = u.shape[0]
  one_bits = int(np.array(1.0, dtype=dtype.np).view(udt.np))
  u = Node(Ops.SHR, None, (u, _full(dtype.bits - dtype.finfo()[1], udt, device, m)))
  u = Node(Ops.OR, None, (u, _full(one_bits, udt, device, m)))
  f = Node(Ops.BITCAST, dtype, (u,)).shrink(((0, n),))
  return Node(Ops.SUB, None, (f, _full(1.0, dtype, device, n))).reshape(shape)
