"""Index arithmetic (lower/schedule/kernel.py Idx): floor division and remainder by a constant fold their terms'
coefficients (k*a = (k//d)*d*a + (k%d)*a), and `within` reads an index where a load's PAD bounds hold — each form
checked point by point against plain integer arithmetic over every value of its vars."""
import itertools
from hypothesis import given, settings, strategies as st
from lower.schedule.kernel import Idx, Var, Bound, within, Div

def _eval(ix: Idx, env: dict) -> int:
  out = ix.c
  for a, k in ix.terms:
    if isinstance(a, Var): v = env[a]
    elif isinstance(a, Div): v = _eval(a.x, env) // a.d
    else: v = _eval(a.x, env) % a.d
    out += k * v
  return out

def _points(vs):
  for vals in itertools.product(*(range(v.size) for v in vs)): yield dict(zip(vs, vals))

def _idx(vs, coefs, c) -> Idx:
  out = Idx.const(c)
  for v, k in zip(vs, coefs): out = out + Idx.var(v) * k
  return out

@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.lists(st.integers(-25, 25), min_size=3, max_size=3),
       st.integers(-30, 30), st.integers(2, 12))
def test_div_mod_exact(sizes, coefs, c, d):
  vs = [Var(f"v{i}", s) for i, s in enumerate(sizes)]
  ix = _idx(vs, coefs, c)
  q, r = ix // d, ix % d
  for env in _points(vs):
    x = _eval(ix, env)
    assert _eval(q, env) == x // d and _eval(r, env) == x % d, (ix, d, env)

def test_div_mod_fold_coefficients():
  # tinygrad's pooling chain reads (y + 11*r) % 10 for y < 8, r < 3: that is y + r (never reaching 10)
  y, r = Var("y", 8), Var("r", 3)
  x = Idx.var(y) + Idx.var(r) * 11
  assert repr(x % 10) == "r+y" and repr(x // 10) == "r"

@settings(max_examples=150, deadline=None)
@given(st.integers(2, 6), st.integers(2, 4), st.integers(0, 2), st.integers(1, 3), st.integers(0, 3))
def test_within_is_exact_where_the_bounds_hold(n, k, pad, stride, extra):
  # a padded 1-D window read as a conv builds it: flat (stride*y + r - pad + size) % size under pad <= stride*y + r < n + pad
  y, r, ch = Var("y", n), Var("r", k), Var("c", 2)
  size = 2 * n
  inner = Idx.var(y) * stride + Idx.var(r) - pad
  flat = (inner + Idx.var(ch) * n + size + extra * size) % size
  bounds = (Bound(inner, 0, n),)
  got = within(flat, bounds)
  for env in _points([y, r, ch]):
    if 0 <= _eval(inner, env) < n: assert _eval(got, env) == _eval(flat, env), (flat, got, env)
  if stride * (n - 1) + k - 1 - pad >= 0: assert all(isinstance(a, Var) for a, _ in got.terms), got   # affine under the mask

def test_within_keeps_what_the_bounds_do_not_decide():
  y, r = Var("y", 8), Var("r", 3)
  x = (Idx.var(y) + Idx.var(r) * 3) % 5
  assert within(x, (Bound(Idx.var(y) - 1, 0, 8),)) == x   # the bound leaves x spanning two blocks of 5
  assert within(x, ()) == x

@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(2, 7), min_size=2, max_size=3), st.lists(st.integers(-30, 30), min_size=9, max_size=9),
       st.lists(st.integers(2, 13), min_size=4, max_size=4), st.lists(st.integers(-10, 40), min_size=4, max_size=4))
def test_within_is_exact_under_random_masks(sizes, coefs, ds, los):
  # nested floor divisions and remainders of affine forms, masked by bounds on other such forms (tinygrad's pooling
  # chains and their gradients are made of these): wherever every bound holds, `within` gives the same value
  vs = [Var(f"v{i}", s) for i, s in enumerate(sizes)]
  a = _idx(vs, coefs[0:3], coefs[3])
  b = _idx(vs, coefs[4:7], coefs[7])
  inner = (a % ds[0]) + (b // ds[1]) * coefs[8]
  ix = (inner + b * 3) % ds[2] + (a + inner) // ds[3] + b
  valid = (Bound(a, los[0], los[0] + ds[2] * 3), Bound(b % ds[1], 0, max(1, ds[1] - 1)), Bound(inner, los[2], los[2] + los[3] + 12))
  got = within(ix, valid)
  for env in _points(vs):
    if all(b.lo <= _eval(b.idx, env) < b.hi for b in valid): assert _eval(got, env) == _eval(ix, env), (ix, got, env)

def test_within_reads_a_conv_gradient_affine():
  # the col2im read of a conv's input gradient through tinygrad's pooling chain (one spatial axis: x < 24 read as
  # (x + 24*r) for r < 6 repeats, windows of 5 over 20 outputs): under its mask the read is window-major affine
  x, r = Var("x", 24), Var("r", 6)
  t = Idx.var(x) + Idx.var(r) * 24
  valid = (Bound(t, 0, 125), Bound(t % 25, 0, 20))
  read = (t // 125) * 1000 + (t % 25) * 5 + (t // 25) % 5   # output position (x - r), then the tap r
  assert within(read, valid) == Idx.var(x) * 5 + Idx.var(r) * -4
