"""Spec §7 invariants 11-14 and semantic preservation (15) over random Tensor programs that use the seed-coverage ops:
precompiled and plain functions, sharded and replicated tensors, symbolic shapes, disk copies, view assigns, bitcast
views. Values are checked on the PYTHON devices (the reference executor) against evaluating the original graph."""
import numpy as np
from hypothesis import given, settings, HealthCheck, strategies as st
from egraph import Tensor, dtypes, callify, function, Variable
from egraph.ir.ops import Node, Ops, GroupOp, toposort, substitute, is_shard
from egraph.engine.encode import realize_points, assigns_into_computed, live_topo
from egraph.ir.storage import STORAGE
from lower.runtime import run_call
from lower.reference import evaluate

DEVS = ("PYTHON", "PYTHON:1")
V = Variable("k", 1, 8)

@function(precompile=True)
def pre(x): return x * 2 + 1

@function
def plain(x, y): return x - y

def storage_of(v: Node) -> Node:
  while v.op in GroupOp.Movement or v.op in (Ops.SLICE, Ops.AFTER, Ops.MULTI): v = v.src[0]
  return v

@st.composite
def programs(draw, tmp):
  mode = draw(st.sampled_from(["plain", "sharded", "replicated", "function", "symbolic", "disk", "assign", "bitcast"]))
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  x = Tensor(rng.standard_normal((8, 4)).astype(np.float32), device="PYTHON").realize()
  if mode == "sharded": x = x.shard(DEVS, axis=draw(st.sampled_from([0, 1])))
  if mode == "replicated": x = x.shard(DEVS, axis=None)
  outs = []
  for _ in range(draw(st.integers(1, 4))):
    k = draw(st.sampled_from(["add", "mul", "sum", "perm", "slice", "contig", "fn", "plainfn"]))
    if k == "add": x = x + float(draw(st.integers(-3, 3)))
    elif k == "mul": x = x * x
    elif k == "sum": x = x.sum(axis=draw(st.sampled_from([0, 1])), keepdim=True).expand(*x.shape) if x.ndim == 2 else x
    elif k == "perm" and x.ndim == 2: x = x.permute(1, 0).contiguous().permute(1, 0)
    elif k == "slice" and x.ndim == 2: x = x[2:6].contiguous().reshape(4, 4).pad(((2, 2), (0, 0)))
    elif k == "contig": x = x.contiguous()
    elif k == "fn" and mode == "function": x = pre(x)
    elif k == "plainfn" and mode == "function": x = plain(x, x * 0.5)
    outs.append(x)
  if mode == "symbolic": outs.append(x.reshape(32)[:V.bind(draw(st.integers(1, 8)))] * 3)
  if mode == "disk":
    d = x.contiguous().reshape(32).to(f"DISK:{tmp}/d{draw(st.integers(0, 3))}.bin")
    outs += [d, d.to("PYTHON") + 1]
  if mode == "assign":
    b = Tensor.zeros(8, 4, device="PYTHON").contiguous().realize()
    b[2:4].assign(x[0:2])
    outs.append(b)
  if mode == "bitcast": outs.append(x.contiguous().realize()[1:3].bitcast(dtypes.int32))
  return [t.node for t in draw(st.lists(st.sampled_from(outs), min_size=1, max_size=2, unique_by=id))]

def _value(v, node):
  return np.array(v[0] if is_shard(node) else v, copy=True)

@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_invariants_and_values_on_seed_programs(data, tmp_path_factory):
  roots = data.draw(programs(tmp_path_factory.mktemp("disk")))
  res = callify(*roots, cache=False)
  C, M = res.call, res.buffer_map
  body, args = C.src[0], C.src[1:]
  topo = toposort(roots, enter_calls=False)
  assert set(realize_points(roots, live_topo(roots, topo)[0])) == set(M)   # 11 coverage (of the live graph: see encode)
  inputs = {n for n in topo if n.op is Ops.BUFFER}
  fresh = {a for a in args if a.op is Ops.BUFFER and a not in inputs}
  for k, v in M.items():                                                                       # 12 aliasing
    if k.op is Ops.AFTER and not assigns_into_computed(k): assert storage_of(v) is storage_of(k.src[0]), (k, v)
  written = set()
  for n in toposort([body], enter_calls=False):                                               # 14 write set
    if n.op is Ops.AFTER and any(d.op in (Ops.STORE, Ops.CALL) for d in n.src[1:]):
      p = storage_of(n.src[0])
      assert p.op is Ops.PARAM
      written.add(storage_of(args[p.arg.slot]))
  for k, v in M.items():                                                                       # 13 fresh buffers, 14
    b = storage_of(v)
    assert b in inputs or b in fresh or b.arg.size == 0, (k, v)
    assert b in written or b in inputs or b.arg.size == 0, (k, v)
  # 15: every mapped value equals the original graph's value
  keys = list(M)
  sem = {n: n.src[1].src[1] for n in topo if n.op is Ops.AFTER and assigns_into_computed(n)}
  want = evaluate(substitute(keys, sem), STORAGE.copy())
  st_ = STORAGE.copy()
  run_call(C, st_)
  for k, w in zip(keys, want):
    got = _value(evaluate([M[k]], st_)[0], M[k])
    np.testing.assert_allclose(got, _value(w, k), rtol=1e-5, atol=1e-5, err_msg=str(k))
