"""The fusion benchmark corpus (issue 14): programs where what to store decides the kernels, built with callsat's own
Tensor. Committed before any tuning of the cost mode. Each program: a name, a group, and `build(rng)` returning
(roots: list of Tensors, ref: a function returning the numpy values of the roots). Sizes: ~1-50 ms each on 2 cores.

Groups: patterns (bench/patterns.py rows, smaller), block (bench/block.py), attention, norm, softmax, mlp (forward and a
hand-built backward), lerp (tinygrad issue #5527's two forms), threshold (both sides of tinygrad's remove_bufferize: a
value reading more than 3 buffers, a reduce inside reading a buffer, the PCONTIG size ratio of 10), conv (expand
reductions), random (DAGs with shared expensive subexpressions, fixed seed), models (issue 28: 18 programs written from
tinygrad's model code, committed before the cost mode was tuned on them)."""
from __future__ import annotations
import os, sys
from dataclasses import dataclass
from typing import Callable
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import numpy as np
from egraph import Tensor

@dataclass(frozen=True)
class FusionProgram:
  name: str
  group: str
  build: Callable     # rng -> (roots: list[Tensor], ref: () -> list[np.ndarray])
  rtol: float = 2e-3

def _data(rng, *shape, scale=1.0):
  a = (rng.standard_normal(shape) * scale).astype(np.float32)
  return Tensor(a).realize(), a

def _np_softmax(v, axis=-1):
  e = np.exp(v - v.max(axis, keepdims=True)); return e / e.sum(axis, keepdims=True)

def _np_ln(v, g=None, b=None):
  c = v - v.mean(-1, keepdims=True)
  y = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)
  return y if g is None else y * g + b

def _ln(t, g=None, b=None):
  c = t - t.mean(axis=-1, keepdim=True)
  y = c / (c * c).mean(axis=-1, keepdim=True).add(1e-5).sqrt()
  return y if g is None else y * g + b

def _sig(v): return 1 / (1 + np.exp(-v))

PROGRAMS: list[FusionProgram] = []
def program(name, group, rtol=2e-3):
  def deco(f): PROGRAMS.append(FusionProgram(name, group, f, rtol)); return f
  return deco

# ---- patterns and block -------------------------------------------------------------------------------------------

@program("sum 4M", "patterns")
def _(rng):
  x, xn = _data(rng, 2048, 2048); return [x.sum()], lambda: [xn.sum()]
@program("row sums 2048^2", "patterns")
def _(rng):
  x, xn = _data(rng, 2048, 2048); return [x.sum(axis=1)], lambda: [xn.sum(1)]
@program("column sums 2048^2", "patterns")
def _(rng):
  x, xn = _data(rng, 2048, 2048); return [x.sum(axis=0)], lambda: [xn.sum(0)]
@program("row softmax 1024^2", "softmax")
def _(rng):
  x, xn = _data(rng, 1024, 1024); return [x.softmax()], lambda: [_np_softmax(xn)]
@program("transpose copy 2048^2", "patterns")
def _(rng):
  x, xn = _data(rng, 2048, 2048); return [x.transpose(1, 0).contiguous()], lambda: [np.ascontiguousarray(xn.T)]
@program("batch norm 1024^2", "norm")
def _(rng):
  x, xn = _data(rng, 1024, 1024)
  return [(x - x.mean(axis=0)) / (x.var(axis=0, correction=0) + 1e-5).sqrt()], lambda: [(xn - xn.mean(0)) / np.sqrt(xn.var(0) + 1e-5)]
@program("relu(a @ b + 1) 512^3", "patterns")
def _(rng):
  (a, an), (b, bn) = _data(rng, 512, 512), _data(rng, 512, 512)
  return [(a @ b + 1.0).relu()], lambda: [np.maximum(an @ bn + 1, 0)]
@program("a.T @ a 512^3", "patterns")
def _(rng):
  a, an = _data(rng, 512, 512); return [a.transpose(1, 0) @ a], lambda: [an.T @ an]
@program("softmax(a @ a.T) 512^3", "softmax")
def _(rng):
  a, an = _data(rng, 512, 512, scale=0.1); return [(a @ a.transpose(1, 0)).softmax()], lambda: [_np_softmax(an @ an.T)]
@program("logsumexp rows 1024^2", "softmax")
def _(rng):
  a, an = _data(rng, 1024, 1024)
  return [(a - a.max(axis=1, keepdim=True)).exp().sum(axis=1).log()], lambda: [np.log(np.exp(an - an.max(1, keepdims=True)).sum(1))]

@program("transformer block T=128 D=256", "block")
def _(rng):
  T, D = 128, 256
  x, xn = _data(rng, T, D)
  W = {k: _data(rng, D, D, scale=1 / np.sqrt(D)) for k in ("q", "k", "v", "o", "f1", "f2")}
  w, Wn = {k: v[0] for k, v in W.items()}, {k: v[1] for k, v in W.items()}
  h = _ln(x)
  att = ((h @ w["q"]) @ (h @ w["k"]).transpose(1, 0) * (1 / np.sqrt(D))).softmax() @ (h @ w["v"])
  y = x + att @ w["o"]
  out = y + (_ln(y) @ w["f1"]).relu() @ w["f2"]
  def ref():
    h = _np_ln(xn)
    y = xn + (_np_softmax((h @ Wn["q"]) @ (h @ Wn["k"]).T / np.sqrt(D)) @ (h @ Wn["v"])) @ Wn["o"]
    return [y + np.maximum(_np_ln(y) @ Wn["f1"], 0) @ Wn["f2"]]
  return [out], ref

# ---- attention, norms, softmax variants ---------------------------------------------------------------------------

@program("attention 8 heads x 64, T=256", "attention")
def _(rng):
  T, H, Dh = 256, 8, 64
  (q, qn), (k, kn), (v, vn) = (_data(rng, T, H * Dh) for _ in range(3))
  heads = lambda t: t.reshape(T, H, Dh).permute(1, 0, 2)
  nh = lambda t: t.reshape(T, H, Dh).transpose(1, 0, 2)
  out = ((heads(q) @ heads(k).transpose(1, 2)) * (1 / 8.0)).softmax() @ heads(v)
  return [out], lambda: [_np_softmax(nh(qn) @ nh(kn).transpose(0, 2, 1) / 8.0) @ nh(vn)]
@program("causal attention 1 head, T=512 D=64", "attention")
def _(rng):
  T, D = 512, 64
  (q, qn), (k, kn), (v, vn) = (_data(rng, T, D) for _ in range(3))
  maskn = np.triu(np.full((T, T), -1e9, np.float32), 1); mask = Tensor(maskn).realize()
  out = ((q @ k.transpose(1, 0)) * (1 / 8.0) + mask).softmax() @ v
  return [out], lambda: [_np_softmax(qn @ kn.T / 8.0 + maskn) @ vn]
@program("layernorm 2048^2 (gain, bias)", "norm")
def _(rng):
  (x, xn), (g, gn), (b, bn) = _data(rng, 2048, 2048), _data(rng, 2048), _data(rng, 2048)
  return [_ln(x, g, b)], lambda: [_np_ln(xn, gn, bn)]
@program("rmsnorm 2048^2", "norm")
def _(rng):
  (x, xn), (g, gn) = _data(rng, 2048, 2048), _data(rng, 2048)
  return [x * ((x * x).mean(axis=-1, keepdim=True) + 1e-6).sqrt().reciprocal() * g], \
    lambda: [xn / np.sqrt((xn * xn).mean(-1, keepdims=True) + 1e-6) * gn]
@program("column softmax 1024^2", "softmax")
def _(rng):
  x, xn = _data(rng, 1024, 1024); return [x.softmax(axis=0)], lambda: [_np_softmax(xn, 0)]
@program("log softmax rows 1024^2", "softmax")
def _(rng):
  x, xn = _data(rng, 1024, 1024)
  m = x - x.max(axis=1, keepdim=True)
  return [m - m.exp().sum(axis=1, keepdim=True).log()], lambda: [np.log(_np_softmax(xn))]
@program("scaled masked softmax 1024^2", "softmax")
def _(rng):
  (x, xn), (mk, mn) = _data(rng, 1024, 1024), _data(rng, 1024)
  return [(x * 0.125 + mk).softmax()], lambda: [_np_softmax(xn * 0.125 + mn)]
@program("softmax and its row max 1024^2", "softmax")
def _(rng):
  x, xn = _data(rng, 1024, 1024)
  return [x.softmax(), x.max(axis=1)], lambda: [_np_softmax(xn), xn.max(1)]

# ---- MLP forward, backward ----------------------------------------------------------------------------------------

@program("MLP forward 256x512x1024x256", "mlp")
def _(rng):
  (x, xn), (w1, w1n), (b1, b1n) = _data(rng, 256, 512), _data(rng, 512, 1024, scale=0.05), _data(rng, 1024)
  (w2, w2n), (b2, b2n) = _data(rng, 1024, 256, scale=0.05), _data(rng, 256)
  return [(x @ w1 + b1).relu() @ w2 + b2], lambda: [np.maximum(xn @ w1n + b1n, 0) @ w2n + b2n]
@program("MLP backward (hand-built) 256x512x1024x256", "mlp")
def _(rng):
  (x, xn), (w1, w1n), (w2, w2n) = _data(rng, 256, 512), _data(rng, 512, 1024, scale=0.05), _data(rng, 1024, 256, scale=0.05)
  dy, dyn = _data(rng, 256, 256)
  z = x @ w1; h = z.relu()
  dh = (dy @ w2.transpose(1, 0)) * (z > 0).where(1.0, 0.0)
  def ref():
    zn = xn @ w1n; hn = np.maximum(zn, 0); dhn = (dyn @ w2n.T) * (zn > 0)
    return [xn.T @ dhn, hn.T @ dyn, dhn @ w1n.T]
  return [x.transpose(1, 0) @ dh, h.transpose(1, 0) @ dy, dh @ w1.transpose(1, 0)], ref
@program("GELU(tanh) MLP 256x512x1024", "mlp")
def _(rng):
  (x, xn), (w1, w1n) = _data(rng, 256, 512), _data(rng, 512, 1024, scale=0.05)
  z = x @ w1
  g = 0.5 * z * (1 + (0.7978845608 * (z + 0.044715 * z * z * z)).tanh())
  return [g], lambda: [(lambda zn: 0.5 * zn * (1 + np.tanh(0.7978845608 * (zn + 0.044715 * zn ** 3))))(xn @ w1n)]

# ---- tinygrad issue #5527: lerp in two forms -----------------------------------------------------------------------

@program("lerp a+(b-a)*w 4M", "lerp")
def _(rng):
  (a, an), (b, bn), (w, wn) = (_data(rng, 4 << 20) for _ in range(3))
  return [a + (b - a) * w], lambda: [an + (bn - an) * wn]
@program("lerp a*(1-w)+b*w 4M", "lerp")
def _(rng):
  (a, an), (b, bn), (w, wn) = (_data(rng, 4 << 20) for _ in range(3))
  return [a * (1 - w) + b * w], lambda: [an * (1 - wn) + bn * wn]
@program("lerp a+(b-a)*w, w broadcast row 2048^2", "lerp")
def _(rng):
  (a, an), (b, bn), (w, wn) = _data(rng, 2048, 2048), _data(rng, 2048, 2048), _data(rng, 2048)
  return [a + (b - a) * w.sigmoid()], lambda: [an + (bn - an) * _sig(wn)]
@program("lerp a*(1-w)+b*w, w broadcast row 2048^2", "lerp")
def _(rng):
  (a, an), (b, bn), (w, wn) = _data(rng, 2048, 2048), _data(rng, 2048, 2048), _data(rng, 2048)
  s = w.sigmoid()
  return [a * (1 - s) + b * s], lambda: [an * (1 - _sig(wn)) + bn * _sig(wn)]

# ---- both sides of tinygrad's remove_bufferize thresholds ----------------------------------------------------------

def _outer(rng, k: int):
  """t reads k buffers (N values), broadcast into an N x M outer product and also reduced."""
  N, M = 2048, 2048
  ins = [_data(rng, N) for _ in range(k)]
  u, un = _data(rng, M)
  t, tn = ins[0][0], ins[0][1]
  for x, xn in ins[1:]: t, tn = t * 0.5 + x, tn * 0.5 + xn
  t, tn = t.tanh(), np.tanh(tn)
  return [t.reshape(N, 1) * u.reshape(1, M), t.sum()], lambda: [tn.reshape(N, 1) * un.reshape(1, M), tn.sum()]
@program("shared value reads 3 buffers, broadcast", "threshold")
def _(rng): return _outer(rng, 3)
@program("shared value reads 4 buffers, broadcast", "threshold")
def _(rng): return _outer(rng, 4)
@program("shared value with a reduce of a buffer inside", "threshold")
def _(rng):
  (x, xn), (y, yn) = _data(rng, 2048, 2048), _data(rng, 2048, 2048)
  t = x - x.mean(axis=1, keepdim=True)
  tn = xn - xn.mean(1, keepdims=True)
  return [t * y, (t * t).sum(axis=1)], lambda: [tn * yn, (tn * tn).sum(1)]
@program("shared value without a reduce inside", "threshold")
def _(rng):
  (x, xn), (y, yn) = _data(rng, 2048, 2048), _data(rng, 2048, 2048)
  t = (x - y).exp()
  tn = np.exp(xn - yn)
  return [t * y, (t * t).sum(axis=1)], lambda: [tn * yn, (tn * tn).sum(1)]
def _ratio(rng, r: int):
  """An expensive N-value intermediate read by an r*N-element consumer (the PCONTIG ratio is 10)."""
  N = 1 << 16
  (a, an), (B, Bn) = _data(rng, N), _data(rng, r, N)
  t = ((a * a + 1).log() * 0.5).exp().sin()
  tn = np.sin(np.exp(np.log(an * an + 1) * 0.5))
  return [B * t.reshape(1, N)], lambda: [Bn * tn.reshape(1, N)]
@program("broadcast ratio 4 (< PCONTIG 10)", "threshold")
def _(rng): return _ratio(rng, 4)
@program("broadcast ratio 64 (> PCONTIG 10)", "threshold")
def _(rng): return _ratio(rng, 64)

# ---- conv-like expand reductions ----------------------------------------------------------------------------------

@program("1x1 conv 16x64->64 ch, 32x32", "conv")
def _(rng):
  B, C, O, HW = 16, 64, 64, 1024
  (x, xn), (w, wn) = _data(rng, B, C, HW), _data(rng, O, C, scale=0.1)
  out = (x.reshape(B, 1, C, HW) * w.reshape(1, O, C, 1)).sum(axis=2)
  return [out], lambda: [np.einsum("bch,oc->boh", xn, wn)]
@program("1x1 conv of relu(x*s+b)", "conv")
def _(rng):
  B, C, O, HW = 16, 64, 64, 1024
  (x, xn), (w, wn), (s, sn), (b, bn) = _data(rng, B, C, HW), _data(rng, O, C, scale=0.1), _data(rng, C, 1), _data(rng, C, 1)
  a = (x * s + b).relu()
  out = (a.reshape(B, 1, C, HW) * w.reshape(1, O, C, 1)).sum(axis=2)
  return [out], lambda: [np.einsum("bch,oc->boh", np.maximum(xn * sn + bn, 0), wn)]
@program("conv1d k=5 via shifted expand-reduce", "conv")
def _(rng):
  B, L, K = 64, 8192, 5
  (x, xn), (w, wn) = _data(rng, B, L + K - 1), _data(rng, K)
  cols = [x.shrink(((0, B), (k, k + L))).reshape(B, L, 1) for k in range(K)]
  win = cols[0]
  for c in cols[1:]: win = win.pad(((0, 0), (0, 0), (0, 1))) + c.pad(((0, 0), (0, 0), (win.shape[2], 0)))
  out = (win.tanh() * w.reshape(1, 1, K)).sum(axis=2)
  return [out], lambda: [sum(np.tanh(xn[:, k:k + L]) * wn[k] for k in range(K))]
@program("avg pool 2x2 then upsample residual 2048^2", "conv")
def _(rng):
  x, xn = _data(rng, 2048, 2048)
  p = x.reshape(1024, 2, 1024, 2).mean(axis=(1, 3))
  up = p.reshape(1024, 1, 1024, 1).expand(1024, 2, 1024, 2).reshape(2048, 2048)
  pn = xn.reshape(1024, 2, 1024, 2).mean((1, 3))
  return [x - up], lambda: [xn - np.repeat(np.repeat(pn, 2, 0), 2, 1)]
@program("batched small matmuls of exp(x) 64x(64x64)", "conv")
def _(rng):
  (x, xn), (y, yn) = _data(rng, 64, 64, 64, scale=0.3), _data(rng, 64, 64, 64, scale=0.3)
  return [x.exp() @ y], lambda: [np.exp(xn) @ yn]

# ---- random DAGs with shared expensive subexpressions ----------------------------------------------------------------

UNARY = [("tanh", lambda t: t.tanh(), np.tanh), ("sigmoid", lambda t: t.sigmoid(), _sig),
         ("expneg", lambda t: (t * t * -0.5).exp(), lambda v: np.exp(v * v * -0.5)), ("sin", lambda t: t.sin(), np.sin),
         ("softplus", lambda t: (t.exp() + 1).log(), lambda v: np.log(np.exp(v) + 1))]
BINARY = [("add", lambda a, b: a + b, np.add), ("mul", lambda a, b: a * b, np.multiply),
          ("max", lambda a, b: a.maximum(b), np.maximum), ("lerp", lambda a, b: a * 0.3 + b * 0.7, lambda a, b: a * 0.3 + b * 0.7)]

def random_dag(seed: int, R: int = 512, C: int = 1024):
  """A random elementwise/reduce DAG over 3 (R, C) inputs: ~12 ops, each expensive unary value reused 2-3 times, some
  row/column reductions broadcast back, 1-3 roots."""
  def build(rng):
    g = np.random.default_rng(seed)
    vals = [_data(rng, R, C) for _ in range(3)]
    for _ in range(g.integers(10, 15)):
      kind = g.choice(["unary", "binary", "binary", "reduce"])
      if kind == "unary":
        _, ft, fn = UNARY[g.integers(len(UNARY))]
        t, n = vals[g.integers(len(vals))]
        vals.append((ft(t), fn(n)))
        vals.append(vals[-1])   # reused: two chances to be picked again
      elif kind == "binary":
        _, ft, fn = BINARY[g.integers(len(BINARY))]
        (a, an), (b, bn) = vals[g.integers(len(vals))], vals[g.integers(len(vals))]
        vals.append((ft(a, b), fn(an, bn)))
      else:
        t, n = vals[g.integers(len(vals))]
        ax = int(g.integers(2))
        m, mn = t.max(axis=ax, keepdim=True), n.max(ax, keepdims=True)
        vals.append((t - m, n - mn))
    roots = [vals[-1]] + [vals[int(i)] for i in g.choice(np.arange(3, len(vals) - 1), size=int(g.integers(0, 3)), replace=False)]
    return [r[0] for r in roots], lambda: [r[1] for r in roots]
  return build

for _s in range(12): program(f"random DAG seed {_s}", "random", rtol=5e-3)(random_dag(_s))

# ---- written from tinygrad's model code (issue 28), before any tuning on them -----------------------------------------
# tinygrad's nn layers and examples as callsat Tensor code: scaled_dot_product_attention's masks, nn.LayerNorm /
# GroupNorm / BatchNorm forward and backward, conv blocks (3x3 as shifted matmuls, depthwise), nn.Embedding's one-hot
# form, GPT-2's input, residual MLP and llama FFN blocks, sparse_categorical_crossentropy's backward, optim's SGD/Adam.

def _np_gelu(z): return 0.5 * z * (1 + np.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))
def _gelu(z): return 0.5 * z * (1 + (0.7978845608 * (z + 0.044715 * z * z * z)).tanh())

@program("causal sdpa 4 heads T=128 d=32 (where mask)", "models")
def _(rng):
  H, T, d = 4, 128, 32
  (q, qn), (k, kn), (v, vn) = (_data(rng, H, T, d) for _ in range(3))
  keep = Tensor.arange(T).reshape(T, 1) >= Tensor.arange(T).reshape(1, T)   # tinygrad: ones(T, T).tril() as a bool mask
  s = (q @ k.transpose(1, 2)) * (1 / np.sqrt(d))
  out = keep.where(s, -1e9).softmax() @ v
  mn = np.tril(np.ones((T, T), bool))
  return [out], lambda: [_np_softmax(np.where(mn, qn @ kn.transpose(0, 2, 1) / np.sqrt(d), -1e9)) @ vn]

@program("BERT attention, padding mask 2x4 heads T=64", "models")
def _(rng):
  B, H, T, d = 2, 4, 64, 16
  (q, qn), (k, kn), (v, vn) = (_data(rng, B, H, T, d) for _ in range(3))
  valid = np.array([64, 40]); pad = np.where(np.arange(T)[None, :] < valid[:, None], 0.0, -10000.0).astype(np.float32)
  m = Tensor(pad).realize().reshape(B, 1, 1, T)   # extended attention mask: (1 - mask) * -10000
  out = ((q @ k.transpose(2, 3)) * 0.25 + m).softmax() @ v
  return [out], lambda: [_np_softmax(qn @ kn.transpose(0, 1, 3, 2) * 0.25 + pad[:, None, None, :]) @ vn]

@program("layernorm forward+backward 1024x512", "models")
def _(rng):
  (x, xn), (g, gn), (dy, dyn) = _data(rng, 1024, 512), _data(rng, 512), _data(rng, 1024, 512)
  mu = x.mean(axis=-1, keepdim=True); c = x - mu
  rstd = ((c * c).mean(axis=-1, keepdim=True) + 1e-5).rsqrt()
  xh = c * rstd; y = xh * g
  dxh = dy * g
  dx = rstd * (dxh - dxh.mean(axis=-1, keepdim=True) - xh * (dxh * xh).mean(axis=-1, keepdim=True))
  dg = (dy * xh).sum(axis=0)
  def ref():
    cn = xn - xn.mean(-1, keepdims=True); rn = 1 / np.sqrt((cn * cn).mean(-1, keepdims=True) + 1e-5); xhn = cn * rn
    dxhn = dyn * gn
    return [xhn * gn, rn * (dxhn - dxhn.mean(-1, keepdims=True) - xhn * (dxhn * xhn).mean(-1, keepdims=True)), (dyn * xhn).sum(0)]
  return [y, dx, dg], ref

@program("batchnorm train forward NCHW 32x32x16x16", "models")
def _(rng):
  (x, xn), (g, gn), (b, bn) = _data(rng, 32, 32, 16, 16), _data(rng, 32), _data(rng, 32)
  mu = x.mean(axis=(0, 2, 3), keepdim=True); c = x - mu
  var = (c * c).mean(axis=(0, 2, 3), keepdim=True)
  y = c * (var + 1e-5).rsqrt() * g.reshape(1, 32, 1, 1) + b.reshape(1, 32, 1, 1)
  def ref():
    cn = xn - xn.mean((0, 2, 3), keepdims=True)
    return [cn / np.sqrt((cn * cn).mean((0, 2, 3), keepdims=True) + 1e-5) * gn.reshape(1, 32, 1, 1) + bn.reshape(1, 32, 1, 1)]
  return [y.relu()], lambda: [np.maximum(ref()[0], 0)]

@program("batchnorm backward NCHW 32x32x16x16", "models")
def _(rng):
  (x, xn), (g, gn), (dy, dyn) = _data(rng, 32, 32, 16, 16), _data(rng, 32), _data(rng, 32, 32, 16, 16)
  ax = (0, 2, 3)
  c = x - x.mean(axis=ax, keepdim=True); rstd = ((c * c).mean(axis=ax, keepdim=True) + 1e-5).rsqrt(); xh = c * rstd
  dxh = dy * g.reshape(1, 32, 1, 1)
  dx = rstd * (dxh - dxh.mean(axis=ax, keepdim=True) - xh * (dxh * xh).mean(axis=ax, keepdim=True))
  def ref():
    cn = xn - xn.mean(ax, keepdims=True); rn = 1 / np.sqrt((cn * cn).mean(ax, keepdims=True) + 1e-5); xhn = cn * rn
    dxhn = dyn * gn.reshape(1, 32, 1, 1)
    return [rn * (dxhn - dxhn.mean(ax, keepdims=True) - xhn * (dxhn * xhn).mean(ax, keepdims=True)), (dyn * xhn).sum(ax)]
  return [dx, (dy * xh).sum(axis=ax)], ref

@program("groupnorm 8 groups 16x64x16x16 + SiLU", "models")
def _(rng):
  (x, xn), (g, gn), (b, bn) = _data(rng, 16, 64, 16, 16), _data(rng, 64), _data(rng, 64)
  xg = x.reshape(16, 8, 8 * 16 * 16)
  c = xg - xg.mean(axis=-1, keepdim=True)
  y = (c * ((c * c).mean(axis=-1, keepdim=True) + 1e-5).rsqrt()).reshape(16, 64, 16, 16) * g.reshape(1, 64, 1, 1) + b.reshape(1, 64, 1, 1)
  def ref():
    xgn = xn.reshape(16, 8, -1); cn = xgn - xgn.mean(-1, keepdims=True)
    yn = (cn / np.sqrt((cn * cn).mean(-1, keepdims=True) + 1e-5)).reshape(16, 64, 16, 16) * gn.reshape(1, 64, 1, 1) + bn.reshape(1, 64, 1, 1)
    return [yn * _sig(yn)]
  return [y * y.sigmoid()], ref

def _shifts(t, H: int, W: int):
  """The 9 (dy, dx) shifted windows of a zero-padded NHWC tensor (3x3, stride 1, padding 1)."""
  p = t.pad(((0, 0), (1, 1), (1, 1), (0, 0)))
  return [p.shrink(((0, t.shape[0]), (i, i + H), (j, j + W), (0, t.shape[3]))) for i in range(3) for j in range(3)]

def _np_shifts(a, H, W):
  p = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)))
  return [p[:, i:i + H, j:j + W, :] for i in range(3) for j in range(3)]

@program("conv block 3x3 (shifted matmuls) + bias + relu NHWC 8x16x16x32->32", "models")
def _(rng):
  N, H, W, C, O = 8, 16, 16, 32, 32
  (x, xn), (w, wn), (b, bn) = _data(rng, N, H, W, C), _data(rng, 9, C, O, scale=1 / np.sqrt(9 * C)), _data(rng, O)
  acc = None
  for t, wi in zip(_shifts(x, H, W), range(9)):
    term = t.reshape(N * H * W, C) @ w.shrink(((wi, wi + 1), (0, C), (0, O))).reshape(C, O)
    acc = term if acc is None else acc + term
  y = (acc + b).relu().reshape(N, H, W, O)
  def ref():
    accn = sum(t.reshape(-1, C) @ wn[i] for i, t in enumerate(_np_shifts(xn, H, W)))
    return [np.maximum(accn + bn, 0).reshape(N, H, W, O)]
  return [y], ref

@program("depthwise 3x3 + pointwise residual NHWC 4x32x32x64", "models")
def _(rng):
  N, H, W, C = 4, 32, 32, 64
  (x, xn), (k, kn), (pw, pwn) = _data(rng, N, H, W, C), _data(rng, 9, C, scale=0.3), _data(rng, C, C, scale=1 / 8)
  acc = None
  for i, t in enumerate(_shifts(x, H, W)):
    term = t * k.shrink(((i, i + 1), (0, C))).reshape(1, 1, 1, C)
    acc = term if acc is None else acc + term
  y = x + (acc.relu().reshape(N * H * W, C) @ pw).reshape(N, H, W, C)
  def ref():
    accn = sum(t * kn[i] for i, t in enumerate(_np_shifts(xn, H, W)))
    return [xn + (np.maximum(accn, 0).reshape(-1, C) @ pwn).reshape(N, H, W, C)]
  return [y], ref

@program("embedding one-hot gather (nn.Embedding) V=512 D=64, 128 tokens", "models")
def _(rng):
  V, D, T = 512, 64, 128
  w, wn = _data(rng, V, D)
  idn = rng.integers(0, V, T).astype(np.int32); ids = Tensor(idn).realize()
  hot = ids.reshape(T, 1, 1) == Tensor.arange(V).reshape(1, V, 1)   # tinygrad 0.14's Embedding: arange == idx, where, sum
  return [hot.where(w.reshape(1, V, D), 0.0).sum(axis=1)], lambda: [wn[idn]]

@program("GPT-2 input: token + position embeddings + layernorm", "models")
def _(rng):
  V, P, D, T = 256, 64, 64, 64
  (wte, wten), (wpe, wpen) = _data(rng, V, D), _data(rng, P, D)
  idn = rng.integers(0, V, T).astype(np.int32); ids = Tensor(idn).realize()
  tok = (ids.reshape(T, 1, 1) == Tensor.arange(V).reshape(1, V, 1)).where(wte.reshape(1, V, D), 0.0).sum(axis=1)
  pos = (Tensor.arange(T).reshape(T, 1, 1) == Tensor.arange(P).reshape(1, P, 1)).where(wpe.reshape(1, P, D), 0.0).sum(axis=1)
  return [_ln(tok + pos)], lambda: [_np_ln(wten[idn] + wpen[:T])]

@program("pre-LN residual GELU MLP 256x256x1024", "models")
def _(rng):
  (x, xn), (w1, w1n), (w2, w2n) = _data(rng, 256, 256), _data(rng, 256, 1024, scale=1 / 16), _data(rng, 1024, 256, scale=1 / 32)
  return [x + _gelu(_ln(x) @ w1) @ w2], lambda: [xn + _np_gelu(_np_ln(xn) @ w1n) @ w2n]

@program("llama FFN: RMSNorm + SwiGLU 128x256x512", "models")
def _(rng):
  (x, xn), (g, gn) = _data(rng, 128, 256), _data(rng, 256)
  (w1, w1n), (w3, w3n), (w2, w2n) = _data(rng, 256, 512, scale=1 / 16), _data(rng, 256, 512, scale=1 / 16), _data(rng, 512, 256, scale=1 / 22)
  h = x * ((x * x).mean(axis=-1, keepdim=True) + 1e-6).rsqrt() * g
  a = h @ w1
  def ref():
    hn = xn / np.sqrt((xn * xn).mean(-1, keepdims=True) + 1e-6) * gn; an = hn @ w1n
    return [xn + (an * _sig(an) * (hn @ w3n)) @ w2n]
  return [x + (a * a.sigmoid() * (h @ w3)) @ w2], ref

@program("softmax cross-entropy forward+backward 512x1000", "models")
def _(rng):
  N, K = 512, 1000
  z, zn = _data(rng, N, K)
  yn = rng.integers(0, K, N).astype(np.int32); y = Tensor(yn).realize()
  hot = (y.reshape(N, 1) == Tensor.arange(K).reshape(1, K)).where(1.0, 0.0)
  m = z - z.max(axis=1, keepdim=True)
  lse = m.exp().sum(axis=1, keepdim=True).log()
  loss = -((m - lse) * hot).sum() * (1 / N)
  dz = ((m - lse).exp() - hot) * (1 / N)
  def ref():
    pn = _np_softmax(zn); hn = np.eye(K, dtype=np.float32)[yn]
    return [np.array(-np.log(pn[np.arange(N), yn]).mean()), (pn - hn) / N]
  return [loss, dz], ref

@program("SGD momentum+nesterov update, 3 tensors 1M", "models")
def _(rng):
  ps = [(_data(rng, 512, 1024), _data(rng, 512, 1024), _data(rng, 512, 1024, scale=0.1)) for _ in range(3)]
  outs, refs = [], []
  for (w, wn), (g, gn), (b, bn) in ps:
    gw = g + w * 1e-4                      # weight decay
    nb = b * 0.9 + gw                      # momentum buffer
    outs += [w - (gw + nb * 0.9) * 0.01, nb]   # nesterov step
    gwn = gn + wn * 1e-4; nbn = bn * 0.9 + gwn
    refs += [wn - (gwn + nbn * 0.9) * 0.01, nbn]
  return outs, lambda: refs

@program("Adam update 2 tensors 1M", "models")
def _(rng):
  outs, refs = [], []
  for _ in range(2):
    (w, wn), (g, gn), (m, mn) = _data(rng, 1024, 1024), _data(rng, 1024, 1024), _data(rng, 1024, 1024, scale=0.1)
    vn = np.abs(rng.standard_normal((1024, 1024))).astype(np.float32) * 0.01
    v = Tensor(vn).realize()
    m2, v2 = m * 0.9 + g * 0.1, v * 0.999 + g * g * 0.001
    outs += [w - (m2 * (1 / (1 - 0.9 ** 3))) / ((v2 * (1 / (1 - 0.999 ** 3))).sqrt() + 1e-8) * 1e-3, m2, v2]
    m2n, v2n = mn * 0.9 + gn * 0.1, vn * 0.999 + gn * gn * 0.001
    refs += [wn - (m2n / (1 - 0.9 ** 3)) / (np.sqrt(v2n / (1 - 0.999 ** 3)) + 1e-8) * 1e-3, m2n, v2n]
  return outs, lambda: refs

@program("clip grads by global norm then SGD, 3 tensors", "models")
def _(rng):
  gs = [_data(rng, 256, 1024) for _ in range(3)]; ws = [_data(rng, 256, 1024) for _ in range(3)]
  norm = sum((g * g).sum() for g, _ in gs).sqrt()
  scale = (norm + 1e-6).reciprocal().minimum(1.0)
  outs = [w - g * scale * 0.05 for (g, _), (w, _) in zip(gs, ws)]
  def ref():
    nn_ = np.sqrt(sum((gn * gn).sum() for _, gn in gs)); sc = min(1 / (nn_ + 1e-6), 1.0)
    return [wn - gn * sc * 0.05 for (_, gn), (_, wn) in zip(gs, ws)]
  return outs, ref

@program("GELU MLP backward (hand-built) 256x512x1024", "models")
def _(rng):
  (x, xn), (w1, w1n), (w2, w2n), (dy, dyn) = (_data(rng, 256, 512), _data(rng, 512, 1024, scale=0.05),
                                              _data(rng, 1024, 256, scale=0.05), _data(rng, 256, 256))
  z = x @ w1
  t = (0.7978845608 * (z + 0.044715 * z * z * z)).tanh()
  dgelu = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * 0.7978845608 * (1 + 3 * 0.044715 * z * z)
  dz = (dy @ w2.transpose(1, 0)) * dgelu
  h = 0.5 * z * (1 + t)
  def ref():
    zn = xn @ w1n; tn = np.tanh(0.7978845608 * (zn + 0.044715 * zn ** 3))
    dgn = 0.5 * (1 + tn) + 0.5 * zn * (1 - tn * tn) * 0.7978845608 * (1 + 3 * 0.044715 * zn * zn)
    dzn = (dyn @ w2n.T) * dgn
    return [xn.T @ dzn, (0.5 * zn * (1 + tn)).T @ dyn, dzn @ w1n.T]
  return [x.transpose(1, 0) @ dz, h.transpose(1, 0) @ dy, dz @ w1.transpose(1, 0)], ref

@program("max pool 2x2 + relu NCHW 16x32x32x32", "models")
def _(rng):
  x, xn = _data(rng, 16, 32, 32, 32)
  p = x.reshape(16, 32, 16, 2, 16, 2).max(axis=(3, 5))
  return [(p * 1.5 - 0.2).relu()], lambda: [np.maximum(xn.reshape(16, 32, 16, 2, 16, 2).max((3, 5)) * 1.5 - 0.2, 0)]

def by_name(name: str) -> FusionProgram:
  for p in PROGRAMS:
    if p.name == name: return p
  raise KeyError(f"no fusion program {name!r}")
