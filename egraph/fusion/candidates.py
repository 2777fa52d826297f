"""Floor 3, fusion by cost: the candidates (`add_candidates`, at insertion), the stored members extraction takes
(`stored_members`, `StoredIds`), and the cost-mode CALL's marks (`mark`, `temporaries`)."""
from __future__ import annotations
import dataclasses
from egraph.ir.ops import Node, Ops, GroupOp, empty_view, HOST_DEVICES
from egraph.engine.encode import Encoding
from egraph.engine.extract import EGraphView, ChosenIds
from egraph.fusion.policy import COST_SINK
from egraph.fusion.kernels import storage_root

MAX_CANDIDATES = 4096     # more are left fused: the local search's passes stay linear-ish on 10k-node graphs

SOLVER_SHARE, SOLVER_FLOOR_S = 0.1, 0.05   # the solver's time: this share of what callify spent before it (extraction must stay under

COST_S_PER_CLASS = 1e-5   # per class reached, a floor under decoding, toposort, rules_like and one costing: 10 us on the 10k transformer,

SHARED_MAX_NODES = int(SOLVER_FLOOR_S / COST_S_PER_CLASS)   # 5000: above, the solver's budget (10 % of ~40 us per node) never covers a costing

_COMPUTED = frozenset(o.name for o in GroupOp.ALU | {Ops.REDUCE, Ops.CAST})

_MOVES = frozenset(o.name for o in GroupOp.Movement)

_MARKERS = frozenset(o.name for o in GroupOp.ValueMarker)

def _widens(n: Node) -> bool: return n.op is Ops.EXPAND and any(s == 1 and t != 1 for s, t in zip(n.src[0].shape, n.arg))

def add_candidates(enc: Encoding, limit: int = MAX_CANDIDATES) -> dict[int, str]:
  """Mint a fresh buffer view for every candidate intermediate of `enc` and emit its (candidate x f) row. Returns
  {candidate id: why}. Above SHARED_MAX_NODES inserted nodes a shared value is no candidate: no partition can be
  costed in the solver's budget there (partition_ids), so the answer is the rules-like one, which stores only reduces
  and broadcast operands; stored forms of shared values would only grow the e-graph (callify runs the rules there,
  cost_plan; the bridge's hints take that answer). Left out: sources of a CONTIGUOUS (already realize points: a second
  stored form would merge the realized class with its own computation), assign targets and STORE targets, symbolic and
  sharded values."""
  orig, nodes = enc.original, enc.nodes
  base: dict[int, tuple[int, bool]] = {}   # movement id -> (id below the movement chain, an EXPAND widened on the way)
  uses: dict[int, int] = {}
  why: dict[int, str] = {}
  out_of: set[int] = set()
  for i, (op, _, kids) in orig.items():   # ids are in insertion order: children first
    if op in _MOVES and nodes[i] is not None:
      b, w = base.get(kids[0], (kids[0], False)); base[i] = (b, w or _widens(nodes[i])); continue
    if op == "CONTIGUOUS":
      k = kids[0]
      while k in orig and orig[k][0] in _MARKERS: k = orig[k][2][0]
      out_of.add(k)
    if op in ("AFTER", "STORE") and kids: out_of.add(base.get(kids[0], (kids[0], False))[0])
    for k in set(kids):
      b, w = base.get(k, (k, False))
      uses[b] = uses.get(b, 0) + 1
      if w: why.setdefault(b, "broadcast")
  shared = len(orig) <= SHARED_MAX_NODES
  for i, (op, _, _) in orig.items():
    if op == "REDUCE": why[i] = "reduce"
    elif shared and uses.get(i, 0) > 1: why.setdefault(i, "shared")
  out: dict[int, str] = {}
  for i in sorted(why):
    n = nodes[i]
    if len(out) >= limit or n is None or i in out_of or orig.get(i, ("",))[0] not in _COMPUTED: continue
    if not isinstance(n.device, str) or n.device.split(":")[0] in HOST_DEVICES or n.device.startswith("DISK"): continue
    if not all(isinstance(d, int) for d in n.shape) or n.numel == 0 or not n.dtype.itemsize: continue
    f = empty_view(n.shape, n.dtype, n.device)
    enc.fresh_buffers.add(f.base.arg.uid)
    enc.row("candidate_row", i, enc.emit_tree(f, original=False))
    out[i] = why[i]
  return out

def stored_members(g: EGraphView, enc: Encoding, cands) -> dict[int, tuple[int, int]]:
  """Candidate class -> (its AFTER e-node, the STORE e-node inside it): the stored forms store_candidate added."""
  fresh = {r[0]: r[1] for r in enc.rows.get("candidate_row", ())}
  out, op, kids, cls = {}, g.op, g.kids, g.cls
  for i in cands:   # both read the fresh buffer's class, whose parents are few (k's are all its users), in e-node order
    k, fc = g.class_of_id[i], g.class_of_id[fresh[i]]
    for s in (ps := g.parents_of(fc)):
      if op[s] != "STORE" or kids[s] != (fc, k): continue
      a = next((a for a in ps if op[a] == "AFTER" and cls[a] == k and kids[a] == (fc, cls[s])), None)
      if a is not None: out[k] = (a, s); break
  return out

class StoredIds(ChosenIds):
  """The extracted DAG (driver.build_call's IdDag) with the classes in `stored` read through their stored member; the
  STORE inside reads the computed form, the id ~k."""
  def __init__(self, g: EGraphView, choice: list[int], stored: dict[int, tuple[int, int]]):
    super().__init__(g, choice)
    self.stored = stored
    self.store_of = {g.cls[s]: k for k, (_, s) in stored.items()}   # store class -> its candidate class

  def enode(self, k: int) -> int:
    if k < 0: return super().enode(~k)
    return self.stored[k][0] if k in self.stored else super().enode(k)

  def kids(self, k: int) -> list[int]:
    ks = super().kids(k)
    if (c := self.store_of.get(k)) is not None and c in self.stored: ks = [~x if x == c else x for x in ks]
    return ks

def mark(call: Node, temps: frozenset = frozenset()) -> Node:
  """The CALL with its SINK marked as a cost-mode partition (lowering then adds no realize points of its own) and
  `temps` as its temporary args (CallInfo.temps)."""
  body = call.src[0]
  return Node(Ops.CALL, call.dtype, (Node(Ops.SINK, body.dtype, body.src, COST_SINK), *call.src[1:]),
              dataclasses.replace(call.arg, temps=temps))

def temporaries(call: Node, enc: Encoding, buffer_map: dict[Node, Node]) -> frozenset:
  """The arg slots of the stored candidates' buffers. No tensor lives in them (none is the storage under a
  `buffer_map` value), so executors keep them in scratch memory, as lowering's own temporaries, instead of storage
  allocated on every realize."""
  cand = {enc.nodes[f].base.arg.uid for _, f in enc.rows.get("candidate_row", ())}
  held = {r.arg.uid for v in buffer_map.values() if (r := storage_root(v)).op is Ops.BUFFER}
  return frozenset(i for i, a in enumerate(call.src[1:]) if a.op is Ops.BUFFER and a.arg.uid in cand and a.arg.uid not in held)
