"""Soundness of the rules, checked on the saturated e-graph itself: every e-node of an e-class must evaluate (numpy
reference) to the same value as the class's extracted representative. A rule that unions unequal terms shows up
as a class whose members disagree, named with the rules that ran.

Values are compared on the given storage and on re-randomized copies of it (`storages=2` by default): a view that
aliases the wrong buffer or the wrong range can agree by value on one storage, never on independent contents. The
bad-merge canary runs after every step (a class with two shapes, dtypes or constants raises EngineError)."""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np
from egraph.ir import Node, Ops, toposort, render
from egraph.dtype import dtypes
from egraph.encode import encode
from egraph.runner import Schedule, Limits
from egraph.extract import knuth, decode
from egraph.cost import COST_PRESETS
from egraph.driver import saturate, Saturation
from lower.reference import evaluate
from rules.strategies import random_data

@dataclass
class Violation:
  rules: tuple[str, ...]    # the rules that fired in this run
  enode: str                # the disagreeing member, rendered
  expected: np.ndarray
  got: np.ndarray
  def __str__(self): return f"unsound union by one of {self.rules}: {self.enode}\n expected {self.expected}\n got {self.got}"

def rerandomized(storage, seed: int):
  """A copy of `storage` with every buffer refilled with fresh random contents of its dtype."""
  rng = np.random.default_rng(seed)
  out = storage.copy()
  for uid in list(out):
    a = out[uid]
    dt = dtypes.from_numpy(a.dtype)
    a[...] = random_data(rng, a.size, dt).reshape(a.shape)
  return out

def check_egraph(roots: list[Node], storage, rules: tuple[str, ...] | None = None, atol: float = 1e-5,
                 storages: int = 2, canary: bool = True) -> tuple[list[Violation], dict[str, int]]:
  """Saturate `roots` with the given optimize rules and compare every e-node with its class, on `storage` and on
  `storages - 1` re-randomized copies of it. Returns (violations, matches). The canary raises EngineError."""
  enc = encode(roots)
  if not enc.keys: return [], {}
  sat = saturate(enc, Schedule("check", rules=rules, canary=canary), Limits(iterations=50))
  violations: list[Violation] = []
  for i in range(max(1, storages)):
    st = storage if i == 0 else rerandomized(storage, 1000 + i)
    violations += _compare(roots, st, sat, atol)
    if violations: break
  return violations, dict(sat.runner.stats.matches)

def _compare(roots, storage, sat: Saturation, atol) -> list[Violation]:
  g, enc = sat.graph, sat.enc
  costs = g.local_costs(COST_PRESETS["bytes"])
  _, choice = knuth(g, costs)   # unpinned: a representative for every class, not only the storage forms callify extracts
  value_classes = [k for k in range(g.n_classes) if choice[k] >= 0 and g.info[k] is not None and g.info[k].dtype.itemsize]
  terms = decode(g, choice, value_classes)
  # a bare fresh buffer (or a view of one) has no value until something stores into it
  def unwritten(t): 
    ns = toposort([t], enter_calls=False)
    return any(n.op is Ops.BUFFER and n.arg.uid in enc.fresh_buffers for n in ns) and not any(n.op is Ops.STORE for n in ns)
  value_classes = [k for k in value_classes if not unwritten(terms[k])]
  fired = tuple(sorted(sat.runner.stats.matches))
  violations = []
  # each representative runs as its own program on its own copy of storage: no effect of one can leak into another
  ref = {k: evaluate([terms[k]], storage.copy())[0] for k in value_classes}
  for e in range(g.n_enodes):
    k, op = g.cls[e], g.op[e]
    if k not in ref or op in ("Cons", "Nil") or g.kids[e] and any(c not in terms for c in g.kids[e]): continue
    if op == "AFTER" and g.arg[e] in g.forbidden_args: continue   # assign into a computed value: never a value itself
    if any(isinstance(terms[c], tuple) for c in g.kids[e]): continue
    dtype, arg = g.enc.args[g.arg[e]]
    o = Ops[op]
    if o in (Ops.CALL, Ops.FUNCTION): continue
    try: member = Node(o, dtype if g.arg[e] else None, tuple(terms[c] for c in g.kids[e]), arg)
    except Exception: continue   # a member whose children were extracted as other (equal) shapes cannot be rebuilt
    got = np.asarray(evaluate([member], storage.copy())[0]) if o is not Ops.CONTIGUOUS else ref[k]
    want = np.asarray(ref[k])
    if got.shape != want.shape or not np.allclose(got, want, atol=atol, rtol=1e-5, equal_nan=True):
      violations.append(Violation(fired, f"{op} in e-class {k} ({g.info[k]}) of\n{render(list(roots))}", want, got))
  return violations
