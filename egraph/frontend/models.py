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

MODELS = {"mlp": mlp, "views": views}
