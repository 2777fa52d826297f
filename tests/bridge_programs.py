"""The tinygrad programs the bridge's tests realize with tinygrad's own pass and with callsat's (tests/bridge): tiny
shapes (tinygrad's PYTHON device interprets every kernel), each a function returning the tensors to realize."""
from tinygrad import Tensor, Device, TinyJit, Context, dtypes, Variable, nn
from tinygrad.function import function

def _mlp():
  l1, l2 = nn.Linear(6, 5), nn.Linear(5, 3)
  x = Tensor.rand(4, 6)
  return [l2(l1(x).relu()).softmax()]

def _attention():
  q, k, v = Tensor.rand(1, 2, 4, 3), Tensor.rand(1, 2, 4, 3), Tensor.rand(1, 2, 4, 3)
  return [q.scaled_dot_product_attention(k, v, is_causal=True)]

def _layernorm():
  ln = nn.LayerNorm(5)
  return [ln(Tensor.rand(3, 5) * 4 - 2)]

def _conv2d():
  c = nn.Conv2d(2, 3, 3, padding=1)
  return [c(Tensor.rand(1, 2, 5, 5)).relu()]

def _cat(): return [Tensor.rand(2, 3).cat(Tensor.rand(1, 3), Tensor.rand(2, 3) * 2, dim=0)]

def _gather():
  x = Tensor.rand(4, 5)
  idx = Tensor([[0, 1], [2, 3], [4, 0], [1, 1]])
  return [x.gather(1, idx), x[Tensor([3, 0, 2])], x[:, Tensor([1, 4])] + 1]

def _arange(): return [Tensor.arange(10).reshape(2, 5).float() * 0.5, Tensor.arange(3, 15, 4)]
def _cumsum(): return [Tensor.rand(3, 6).cumsum(1)]
def _rand(): return [Tensor.rand(3, 4), Tensor.randint(5, low=0, high=9), Tensor.randn(2, 3)]

def _pools():
  x = Tensor.rand(1, 1, 6, 6)
  return [x.max_pool2d(2), x.avg_pool2d(3, stride=1)]

def _sgd():
  l = nn.Linear(4, 2)
  opt = nn.optim.SGD(nn.state.get_parameters(l), lr=0.1)
  with Context(TRAINING=1):
    x = Tensor.rand(3, 4)
    loss = l(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
  return [l.weight, l.bias, loss]

def _assign_slices():
  a = Tensor.zeros(6, 4).contiguous().realize()
  a[1:3].assign(Tensor.ones(2, 4) * 3)
  a[:, ::2].assign(Tensor.full((6, 2), 7.0))
  b = Tensor.arange(8).float().contiguous().realize()
  b[::3].assign(Tensor([-1.0, -2.0, -3.0]))
  return [a, b]

def _bitcast():
  a = Tensor([1.0, 2.0, -3.5, 4.25]).realize()
  return [a.bitcast(dtypes.uint32) + 1, a[1:3].bitcast(dtypes.int32)]

def _fp8():
  """Every fp8 dtype: casts in (ties, subnormals, finite overflow saturating, inf, NaN, -0) and out, bitcasts from and
  to uint8, arithmetic and a sum (the kernels are tinygrad's; the bridge must carry the dtype exactly)."""
  x = Tensor([1.0, 2.5, 500.0, -0.0, 0.3, 1e6, 2.0 ** -9, 1.0625, float("inf"), float("nan")])
  outs = []
  for dt in dtypes.fp8s:
    f = x.cast(dt).realize()
    outs += [f.cast(dtypes.float), f.bitcast(dtypes.uint8), (f * 2 + 1).float(), f[:3].sum().float(), f[:3].cast(dtypes.half),
             Tensor([0x38, 0x7F, 0x80, 0x01, 0xFE], dtype=dtypes.uint8).bitcast(dt).float(),
             Tensor([1.0, 2.5, 500.0]).cast(dt).cast(dtypes.float)]
  return outs

def _symbolic():
  v = Variable("v", 1, 6).bind(4)
  x = Tensor.rand(6, 3).contiguous().realize()
  return [(x[:v] * 2).sum(0), (x[:v] + 1).max(), x.shrink(((0, v), None)).contiguous().sum(1).max()]

def _symbolic_offset():
  x = Tensor.rand(7, 11)   # realized with the view: the base is stored, the symbolic-offset view stays a view
  outs = []
  for i in (1, 3):
    v = Variable("i", 1, 10).bind(i)
    outs.append((x.shrink(((3, 5), (v, v + 2))).realize() + 1).realize())
  return outs

def _symbolic_cat():
  a, b = Tensor.rand(6, 3).realize(), Tensor.rand(2, 3).realize()   # a symbolic PAD over storage: (v + 2) - v is 2
  outs = []
  for i in (2, 4):
    v = Variable("i", 1, 6).bind(i)
    outs.append(a[:v].cat(b, dim=0).realize()[:i + 2, :3].contiguous().realize())
  return outs

def _function():
  @function
  def f(a: Tensor, b: Tensor) -> Tensor: return (a * b + 1).relu()
  return [f(Tensor.rand(3, 3), Tensor.rand(3, 3))]

def _precompile():
  @function(precompile=True)
  def f(a: Tensor, b: Tensor) -> Tensor: return (a @ b).contiguous()
  return [f(Tensor.rand(3, 3), Tensor.rand(3, 3)) + 1]

def _jit():
  @TinyJit
  def step(x: Tensor) -> Tensor: return (x * 2 + 1).sum(0).realize()
  return [step(Tensor.rand(3, 4).realize()) for _ in range(3)][-1:]

def _sharded():
  devs = (Device.DEFAULT, f"{Device.DEFAULT}:1")
  x = Tensor.rand(4, 3).realize()
  lazy = x.shard(devs, axis=0)
  real = Tensor.rand(4, 3).shard(devs, axis=0).realize()
  return [(lazy * 2 + real).sum(1), (lazy + 1).to(Device.DEFAULT)]

def _sharded_precompile():
  @function(precompile=True)
  def f(a: Tensor): return a + 1, a * 2
  devs = (Device.DEFAULT, f"{Device.DEFAULT}:1")
  t1, t2 = f(Tensor.rand(4, 2).contiguous().shard(devs, axis=0))
  return [t1 + 2, t2]

PROGRAMS = {f.__name__[1:]: f for f in [_mlp, _attention, _layernorm, _conv2d, _cat, _gather, _arange, _cumsum, _rand, _pools,
                                         _sgd, _assign_slices, _bitcast, _fp8, _symbolic, _symbolic_offset, _symbolic_cat,
                                         _function, _precompile, _jit, _sharded,
                                         _sharded_precompile]}
