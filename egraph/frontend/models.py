"""The demo models of `callsat demo` and of the ordering corpus: each returns (output tensor, numpy reference)."""
from __future__ import annotations
import numpy as np
from egraph.frontend.tensor import Tensor

def mlp():
  """2-layer MLP with softmax on random data; returns (output tensor, numpy reference)."""
  Tensor.manual_seed(0)
  x, w1, b1, w2, b2 = (Tensor.randn(32, 64), Tensor.randn(64, 128) * 0.1, Tensor.randn(128) * 0.1,
                      Tensor.randn(128, 10) * 0.1, Tensor.randn(10) * 0.1)
  Tx = [t.realize() for t in (x, w1, b1, w2, b2)]
  h = (x @ w1 + b1).relu().contiguous()   # a realized hidden layer, as a model would keep it
  logits = h @ w2 + b2
  e = (logits - logits.max(axis=1, keepdim=True)).exp().contiguous()
  out = e / e.sum(axis=1, keepdim=True)
  nx, nw1, nb1, nw2, nb2 = (t.numpy().astype(np.float64) for t in Tx)
  nl = np.maximum(nx @ nw1 + nb1, 0) @ nw2 + nb2
  ne = np.exp(nl - nl.max(axis=1, keepdims=True))
  return out, ne / ne.sum(axis=1, keepdims=True)

def views():
  """Realized buffer, a contiguous slice (zero-copy view), an in-place assign and a multi-output realize."""
  Tensor.manual_seed(1)
  a = Tensor.randn(8, 16).realize()
  na = a.numpy().astype(np.float64)
  rows = a[2:6].contiguous()               # one contiguous range of a: becomes a SLICE view, no copy
  s = (rows * 2).sum(axis=1)
  return s, (na[2:6] * 2).sum(axis=1)

def ema():
  """An exponential moving average of weights, as EMA training keeps one: the average is assigned in place, and the
  step reads a gradient-stopping snapshot of it (`.contiguous_backward().contiguous()`) in a layer. Saturation serves
  the snapshot with the assign's own write; an order that removes the marker only after materializing (tinygrad's
  pass order) stores a second copy of the average."""
  Tensor.manual_seed(3)
  w, x = Tensor.randn(128, 128).realize(), Tensor.randn(16, 128).realize()
  avg = (Tensor.randn(128, 128) * 0.5).contiguous().realize()
  nw, nx, navg = (t.numpy().astype(np.float64) for t in (w, x, avg))
  new = avg.assign(avg * 0.99 + w * 0.01)
  snap = new.contiguous_backward().contiguous()
  out = (x @ snap).relu()
  return out, np.maximum(nx @ (navg * 0.99 + nw * 0.01), 0)

MODELS = {"ema": ema, "mlp": mlp, "views": views}
