"""Soundness of the rules, checked on the saturated e-graph itself: every e-node of an e-class must evaluate (numpy
reference) to the same value as the class's extracted representative. A rule that unions unequal terms shows up
as a class whose members disagree, named with the rules that ran.

Values are compared on the given storage and on re-randomized copies of it (`storages=2` by default): a view that
aliases the wrong buffer or the wrong range can agree by value on one storage, never on independent contents. The
bad-merge canary runs after every step (a class with two shapes, dtypes or constants raises EngineError).

Values alone cannot see a rule that breaks the CALL's structure (a false `storage` fact, a STORE into a computed
value): `structural_violations` checks the spec's §7 invariants on the callify result and the facts the rules derived.

Candidate intermediates (egraph/fusion/solve.py) get their stored forms in every check, as fusion="cost" does. Their order
against assigns (no read of a buffer moves past a write of it) is checked by running the CALL that stores every
candidate on the reference executor: its realized values must equal the graph's (`stored_violations`)."""
from __future__ import annotations
from dataclasses import dataclass, replace
import numpy as np
from egraph.ir.ops import Node, Ops, GroupOp, CallInfo, toposort, render
from egraph.ir.errors import CallsatError
from egraph.ir.dtype import dtypes
from egraph.engine.encode import encode
from egraph.engine.runner import Schedule, Limits
from egraph.engine.extract import knuth, decode
from egraph.engine.cost import COST_PRESETS
from egraph.engine.driver import saturate, Saturation, extract_call, storage_view, parameterize
from egraph.engine.build import build_call, has_bound_dims
from egraph.fusion.candidates import add_candidates, stored_members, StoredIds
from lower.reference import evaluate
from rules.testing.strategies import random_data, oracle_values
from rules.registry import RULES

@dataclass
class Violation:
  rules: tuple[str, ...]    # the rules that fired in this run
  enode: str                # the disagreeing member, rendered
  expected: np.ndarray
  got: np.ndarray
  def __str__(self): return f"unsound union by one of {self.rules}: {self.enode}\n expected {self.expected}\n got {self.got}"

@dataclass
class StructureViolation:
  rules: tuple[str, ...]    # the rules that fired in this run
  problem: str              # the first broken invariant
  graph: str                # the graph, rendered
  def __str__(self): return f"structural invariant broken by one of {self.rules}: {self.problem}"

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
                 storages: int = 2, canary: bool = True, structure: bool | str = False) -> tuple[list, dict[str, int]]:
  """Saturate `roots` with the given optimize rules and compare every e-node with its class, on `storage` and on
  `storages - 1` re-randomized copies of it; with `structure`, first the facts and the CALL's invariants
  (structural_violations). Returns (violations, matches). The canary raises EngineError."""
  enc = _encode(roots)
  if not enc.keys: return [], {}
  sat = saturate(enc, Schedule("check", rules=rules, canary=canary), Limits(iterations=50))
  violations: list = []
  if structure and (broken := structural_violations(roots, sat, structure if isinstance(structure, str) else None)):
    return [StructureViolation(tuple(sorted(sat.runner.stats.matches)), broken[0], render(list(roots)))], dict(sat.runner.stats.matches)
  for i in range(max(1, storages)):
    st = storage if i == 0 else rerandomized(storage, 1000 + i)
    violations += _compare(roots, st, sat, atol)
    if not violations and sat.runner.stats.matches.get("store_candidate"): violations += stored_violations(roots, st, sat, atol)
    if violations: break
  return violations, dict(sat.runner.stats.matches)

def _encode(roots: list[Node]):
  """The encoding every check saturates: callify's, with the candidate facts of fusion="cost"."""
  enc = encode(roots)
  add_candidates(enc)
  return enc

def stored_violations(roots: list[Node], storage, sat: Saturation, atol: float = 1e-5) -> list[Violation]:
  """The CALL that stores every candidate with a stored form, run on the reference executor: each realized value must
  equal the graph's own (a stored intermediate read before or after the wrong write of a buffer it reads differs)."""
  ex = extract_call(sat, COST_PRESETS["bytes"])
  ids = StoredIds(ex.graph, ex.choice, stored_members(ex.graph, sat.enc, [int(r[0]) for r in sat.enc.rows.get("candidate_row", ())]))
  b = build_call(ids, ex.root_classes, sat.enc.keys, sat.enc.fresh_buffers, has_bound_dims(sat.enc))
  want = oracle_values(list(roots), storage, list(sat.enc.keys))   # an assign into a computed value: its value (rule 8)
  st = storage.copy()
  evaluate([b.call], st)
  out = []
  for k, w in zip(sat.enc.keys, want):
    got, w = np.asarray(evaluate([b.buffer_map[k]], st)[0]), np.asarray(w)
    if got.shape != w.shape or not np.allclose(got, w, atol=atol, rtol=1e-5, equal_nan=True):
      out.append(Violation(tuple(sorted(sat.runner.stats.matches)), f"the all-stored CALL's {k.op.name} {k.shape} of\n{render(list(roots))}", w, got))
  return out

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

def is_storage_view(v: Node) -> bool:
  """Spec §7.4: movement ops and SLICEs over one BUFFER, with no AFTER/STORE/CALL/CONTIGUOUS anywhere in it."""
  n = v
  while n.op in GroupOp.Movement or n.op in (Ops.SLICE, Ops.MULTI): n = n.src[0]
  return n.op is Ops.BUFFER and not any(m.op in (Ops.AFTER, Ops.STORE, Ops.CALL, Ops.CONTIGUOUS) for m in toposort([v]))

def _storage_target(t: Node) -> bool:
  while t.op in GroupOp.Movement or t.op in (Ops.AFTER, Ops.DETACH, Ops.SLICE, Ops.MULTI, Ops.BITCAST): t = t.src[0]
  return t.op in (Ops.PARAM, Ops.BUFFER)

def _slice_inside(n: Node) -> bool:
  off, count = n.arg
  return off >= 0 and count >= 0 and off * n.src[0].dtype.itemsize + count * n.dtype.itemsize <= n.src[0].nbytes

def _temp_violations(top: list[Node], args, temps, bmap: dict[Node, Node]) -> list[str]:
  """A temporary arg (CallInfo.temps: scratch, garbage when the CALL starts) is a BUFFER no realized value lives in, and
  the body reads it only after storing into it: as a STORE's target or an AFTER over such a STORE (through views)."""
  out, held = [], set()
  for v in bmap.values():
    while v.src: v = v.src[0]
    held.add(v)
  for i in sorted(temps):
    if i >= len(args) or args[i].op is not Ops.BUFFER: out.append(f"temporary arg {i} is not a BUFFER arg")
    elif args[i] in held: out.append(f"temporary arg {i} holds a realized value")
  def temp(x: Node) -> bool:
    while x.op in GroupOp.Movement: x = x.src[0]
    return x.op is Ops.PARAM and x.arg.slot in temps
  for n in top:
    if n.op in GroupOp.Movement: continue
    for j, s in enumerate(n.src):
      if not temp(s) or (j == 0 and n.op is Ops.STORE): continue
      if not (j == 0 and n.op is Ops.AFTER and any(d.op is Ops.STORE and d.src[0] is s for d in n.src[1:])):
        out.append(f"{n.op.name} reads temporary PARAM {s.arg.slot if s.op is Ops.PARAM else '(view)'} before any store into it")
  return out

def call_violations(roots: list[Node], call: Node, bmap: dict[Node, Node]) -> list[str]:
  """The spec's §7 structural invariants (1, 3-8 and views inside their buffer) of one callify result, as messages."""
  out: list[str] = []
  body, args = call.src[0], call.src[1:]
  top = toposort([body], enter_calls=False)
  for k, v in bmap.items():
    if v in bmap: out.append(f"a value is a key: {k.op.name} -> {v.op.name}")                                    # 1
    if (v.shape, v.dtype, v.device) != (k.shape, k.dtype, k.device):                                             # 3
      out.append(f"type not preserved: {k.op.name} {k.shape} {k.dtype.name} -> {v.op.name} {v.shape} {v.dtype.name}")
    if not is_storage_view(v): out.append(f"the storage of a realized {k.op.name} is not a buffer view: {render([v])}")   # 4
  info = call.arg
  if call.op is not Ops.CALL or body.op is not Ops.SINK or not isinstance(info, CallInfo) or replace(info, temps=frozenset()) != CallInfo():
    out.append("not a CALL(SINK) form")                                                                         # 5
  out += _temp_violations(top, args, info.temps if isinstance(info, CallInfo) else (), bmap)
  if len({a.id for a in args}) != len(args): out.append("duplicate CALL args")
  for a in args:
    if not (a.op is Ops.BUFFER or (a.op is Ops.SLICE and a.src[0].op is Ops.BUFFER) or a.op is Ops.BIND):
      out.append(f"CALL arg {a.op.name} is not storage")
  if any(n.op is Ops.BUFFER or (n.op is Ops.SLICE and n.src[0].op is Ops.BUFFER) for n in top): out.append("a BUFFER in the body")   # 6
  params = {n.arg.slot: n for n in top if n.op is Ops.PARAM and n.arg.slot >= 0}                                    # 7
  if sorted(params) != list(range(len(args))): out.append(f"PARAM slots {sorted(params)} do not number {len(args)} args")
  for i, p in params.items():
    if i < len(args) and args[i].op is not Ops.BIND and (p.dtype, p.shape, p.device) != (args[i].dtype, args[i].shape, args[i].device):
      out.append(f"PARAM {i} {p.dtype.name}{p.shape} does not match its arg {args[i].dtype.name}{args[i].shape}")
  for r in body.src:                                                                                                # 8
    if r.op is not Ops.AFTER and not (r.op is Ops.COPY and str(r.device).startswith("DISK")): out.append(f"a root is {r.op.name}, not an AFTER")
  for n in top:
    if n.op is Ops.STORE and not _storage_target(n.src[0]): out.append(f"a STORE target is not storage: {render([n.src[0]])}")
  for n in toposort([body, *args, *bmap.values()], enter_calls=False):
    if n.op is Ops.SLICE and n.src[0].op in (Ops.BUFFER, Ops.PARAM) and not _slice_inside(n):
      out.append(f"SLICE {n.arg} outside its {n.src[0].nbytes}-byte buffer")
  return out

def fact_violations(sat: Saturation) -> list[str]:
  """The facts rules derive are claims the other rules trust: every (storage x) must name a class holding storage
  (a BUFFER/SLICE/PARAM, or a RESHAPE/MULTI of such a class), every (zero x) a class without elements."""
  g, fns = sat.graph, sat.runner.freeze().functions
  val = {r.output: g.class_of_id[sat.runner.egraph.value_to_i64(r.inputs[0])] for r in fns["N"].rows}
  store = set()
  changed = True
  while changed:   # least fixpoint: storage classes, through RESHAPE/MULTI of storage classes
    changed = False
    for e in range(g.n_enodes):
      k, op = g.cls[e], g.op[e]
      if k not in store and (op in ("BUFFER", "SLICE", "PARAM") or (op in ("RESHAPE", "MULTI") and g.kids[e][0] in store)):
        store.add(k); changed = True
  out = []
  for name, ok in (("storage", lambda k: k in store), ("zero", lambda k: g.info[k] is None or g.info[k].shape is None or 0 in g.info[k].shape)):
    for r in fns[name].rows if name in fns else ():
      if (k := val.get(r.inputs[0])) is not None and not ok(k):
        out.append(f"false fact ({name} x) on {g.info[k].op.name if g.info[k] is not None else '?'} e-class {k}")
  return out

def _extracted_call(sat: Saturation) -> tuple[Node, dict[Node, Node]]:
  """The CALL and buffer_map as callify extracts them (driver._callify: pinned extraction, storage views, PARAMs)."""
  ex = extract_call(sat, COST_PRESETS["bytes"])
  realized = [ex.terms[c] for c in ex.root_classes]
  bmap = {k: storage_view(t) for k, t in zip(sat.enc.keys, realized)}
  body, args = parameterize(Node(Ops.SINK, dtypes.void, tuple(n for n in toposort(realized, enter_calls=False) if n.op is Ops.AFTER)))
  return Node(Ops.CALL, dtypes.void, (body, *args), CallInfo()), bmap

def structural_violations(roots: list[Node], sat: Saturation, rule: str | None = None) -> list[str]:
  """Facts first (they hold whatever extraction chooses), then the invariants of the CALL that callify, with every
  registered rule on (the candidate `rule` among them), extracts."""
  if out := fact_violations(sat): return out
  others = tuple(n for n, r in RULES.items() if r.phase == "optimize" and n != rule)
  full = saturate(_encode(roots), Schedule("check-all", rules=others + ((rule,) if rule and RULES[rule].phase == "optimize" else ())),
                  Limits(iterations=50))
  if out := fact_violations(full): return out
  try: call, bmap = _extracted_call(full)
  except CallsatError as e:
    try: _extracted_call(saturate(_encode(roots), Schedule("check-without", rules=others), Limits(iterations=50)))
    except CallsatError: return []     # not the rule's doing: the graph does not extract without it either
    return [f"extraction failed: {type(e).__name__}: {e}"]
  return call_violations(roots, call, bmap)
