"""The bridge's structural cache: a tinygrad graph whose structure was seen before gets the CALL decided for it, rebound
to its own buffers, without a conversion or an e-graph.

A graph's key is its toposort written as (op, dtype, arg, tag, source positions) with what tinygrad itself abstracts
from its schedule cache left out: which buffers (a GLOBAL BUFFER's slot becomes its ordinal of first appearance, plus
the slots' relative order) and the values bound to Variables (a bound Variable is a leaf: the walk never enters its
binding STORE, so the value's CONST is in the key only where something else reads it). Everything else, constants,
shapes, dtypes, devices, tags, options, is compared exactly, so two graphs with equal keys are the same graph up to
that renaming, node for node in toposort order.

An entry keeps no UOp of the graph it was made from (those would keep its buffers alive): the CALL body (PARAMs only),
and recipes for the args and buffer_map, which name the new graph's nodes by toposort position and mint fresh buffers
anew on every rebind. A result that would need more (a body reading a buffer or a bound value) is not cached."""
from __future__ import annotations
import dataclasses, os, threading
from collections import OrderedDict
from tinygrad.uop.ops import UOp, Ops as TOps, ParamArg
from tinygrad.dtype import AddrSpace, dtypes as tdt
from egraph.ir.errors import CallsatError

DEFAULT_ENTRIES = 512            # graphs kept (least recently used first out)
DEFAULT_NODES = 500_000          # key entries kept in all (a 50k-UOp graph costs 50k): ~100 MB at most

class _Uncacheable(Exception):
  """This result depends on more than the key abstracts: compute it every time."""

def _is_storage(u: UOp) -> bool:
  return u.op is TOps.BUFFER and u.arg.addrspace is AddrSpace.GLOBAL

_BUF_FIELDS = tuple(f.name for f in dataclasses.fields(ParamArg) if f.name != "slot")

@dataclasses.dataclass
class Structure:
  """One graph's key and what a rebind needs of it: its toposort, positions, identity leaves and what the key leaves out."""
  key: tuple
  topo: list
  index: dict            # UOp -> toposort position
  leaves: frozenset      # positions of buffers and bound Variables: what a recipe names by position
  stripped: frozenset    # the binding STOREs and the CONSTs only they read: values the key leaves out

def _binds(u: UOp) -> bool:
  """STORE(var, CONST): the store that binds a Variable to its value."""
  return u.op is TOps.STORE and len(u.src) == 2 and u.src[1].op is TOps.CONST and u.src[0].is_variable

def _walks(u: UOp) -> bool: return u.op is not TOps.STORE or not _binds(u)

def _bound_value(u: UOp, st: Structure) -> bool:
  """Does u carry a value the key leaves out (a binding, its CONST, a bound Variable)? A result holding one is not cached."""
  return u in st.stripped or u.op is TOps.AFTER and u.is_bound_var or _binds(u)

def structure(big_sink: UOp, strip: bool = True) -> Structure:
  """The key of big_sink's graph (module docstring). A bound Variable is a leaf: the walk does not enter its binding
  STORE, so its value's CONST is in the graph only where something else reads it (a shape that happens to equal it)."""
  topo = list(big_sink.toposort(gate=_walks if strip else None))
  index = {u: i for i, u in enumerate(topo)}
  entries, slots, leaves, stripped = [], [], [], set()
  try:
    for i, u in enumerate(topo):
      op, arg, src = u.op, u.arg, u.src
      if op is TOps.BUFFER and arg.addrspace is AddrSpace.GLOBAL:
        arg = ("storage", len(slots), *(getattr(arg, f) for f in _BUF_FIELDS))
        slots.append(u.arg.slot); leaves.append(i)
      elif op is TOps.AFTER and u.is_bound_var:
        leaves.append(i)
        if strip:
          st = src[1]
          stripped.add(st)
          if st.src[1] not in index: stripped.add(st.src[1])
          entries.append((op, u.dtype, ("bound", st.src[1].dtype), u.tag, (index[src[0]],)))
          continue
      entries.append((op, u.dtype, arg, u.tag, tuple([index[s] for s in src])))
  except KeyError:   # a binding STORE read by something else than its Variable's AFTER: keyed with every value
    return structure(big_sink, strip=False)
  order = tuple(sorted(range(len(slots)), key=slots.__getitem__))   # results may depend on the slots' order
  return Structure((tuple(entries), order), topo, index, frozenset(leaves), frozenset(stripped))

# ---- recipes: the result in terms of positions, fresh buffers and values ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Entry:
  body: UOp              # the CALL's body: PARAMs, no storage, no bound value
  call_arg: object
  args: tuple            # recipes
  mapping: tuple         # (key position, recipe)
  extra: object = None   # what the bridge keeps beside (its cost-mode hints)

@dataclasses.dataclass
class Sighted:
  """A structure seen `count` times whose measured decision waits (egraph/bridge/measure.py decide_at): the plain CALL's
  entry meanwhile (None: not cacheable)."""
  count: int
  plain: Entry | None

def make_entry(st: Structure, call: UOp, buffer_map: dict, extra=None) -> Entry | None:
  """The entry for this graph's result, or None when the result cannot be rebound from the key alone."""
  body = call.src[0]
  for u in body.toposort():
    if _is_storage(u) or _bound_value(u, st): return None
  memo: dict = {}
  fresh: list = []
  try:
    args = tuple(_recipe(a, st, memo, fresh) for a in call.src[1:])
    mapping = tuple((st.index[k], _recipe(v, st, memo, fresh)) for k, v in buffer_map.items())
  except (_Uncacheable, KeyError): return None   # KeyError: a key that is not a node of the graph
  return Entry(body, call.arg, args, mapping, extra)

def _recipe(u: UOp, st: Structure, memo: dict, fresh: list):
  """("at", position) for the graph's buffers and bound Variables, ("fresh", k, ...) for the k-th buffer the result
  made, ("op", ...) for a node rebuilt from its sources."""
  if (r := memo.get(u)) is not None: return r
  if (p := st.index.get(u)) is not None and p in st.leaves: r = ("at", p)
  elif _is_storage(u):
    r = ("fresh", len(fresh), u.dtype, u.arg, tuple(_recipe(s, st, memo, fresh) for s in u.src))
    fresh.append(u)
  elif _bound_value(u, st): raise _Uncacheable(u.op)
  else: r = ("op", u.op, u.dtype, u.arg, u.tag, tuple(_recipe(s, st, memo, fresh) for s in u.src))
  memo[u] = r
  return r

def rebind(entry: Entry, st: Structure) -> tuple[UOp, dict]:
  """The entry's CALL and buffer_map for the graph `st` (equal key): its own nodes, new fresh buffers."""
  memo: dict = {}
  fresh: dict = {}
  def build(r):
    if (u := memo.get(id(r))) is not None: return u
    if r[0] == "at": u = st.topo[r[1]]
    elif r[0] == "fresh":
      if (u := fresh.get(r[1])) is None:
        u = fresh[r[1]] = UOp(TOps.BUFFER, r[2], tuple(build(s) for s in r[4]),
                              dataclasses.replace(r[3], slot=next(UOp.unique_num)))
    else: u = UOp(r[1], r[2], tuple(build(s) for s in r[5]), r[3], r[4])
    memo[id(r)] = u
    return u
  args = [build(r) for r in entry.args]
  return UOp(TOps.CALL, tdt.void, (entry.body, *args), entry.call_arg), {st.topo[p]: build(r) for p, r in entry.mapping}

# ---- the cache ----------------------------------------------------------------------------------------------------------

class StructureCache:
  """Bounded (entries and key nodes, least recently used out), thread-safe; holds successes and refusals by key."""
  def __init__(self, entries: int = DEFAULT_ENTRIES, nodes: int = DEFAULT_NODES):
    if entries < 0 or nodes < 0: raise CallsatError(f"cache limits must be >= 0, got entries={entries}, nodes={nodes}")
    self.max_entries, self.max_nodes = entries, nodes
    self._d: OrderedDict = OrderedDict()
    self._nodes = 0
    self._lock = threading.Lock()
    self.hits = self.misses = self.stored = self.uncacheable = self.evicted = 0

  def get(self, key):
    with self._lock:
      if (e := self._d.get(key)) is None: self.misses += 1; return None
      self._d.move_to_end(key); self.hits += 1
      return e[0]

  def put(self, key, value, nodes: int) -> None:
    """Keep value under key; `nodes`: the size of the graph it is for (what the node bound counts)."""
    with self._lock:
      if value is None: self.uncacheable += 1; return
      if nodes > self.max_nodes or self.max_entries == 0: return
      if key in self._d: self._nodes -= self._d.pop(key)[1]
      self._d[key] = (value, nodes); self._nodes += nodes; self.stored += 1
      while len(self._d) > self.max_entries or self._nodes > self.max_nodes:
        _, (_, n) = self._d.popitem(last=False); self._nodes -= n; self.evicted += 1

  def clear(self) -> None:
    with self._lock: self._d.clear(); self._nodes = 0

  def stats(self) -> dict:
    with self._lock:
      return {"entries": len(self._d), "nodes": self._nodes, "hits": self.hits, "misses": self.misses,
              "stored": self.stored, "uncacheable": self.uncacheable, "evicted": self.evicted}

def from_env() -> StructureCache | None:
  """CALLSAT_BRIDGE_CACHE=0 turns the cache off; =N keeps N graphs (default DEFAULT_ENTRIES)."""
  v = os.environ.get("CALLSAT_BRIDGE_CACHE", "")
  if v == "": return StructureCache()
  if not v.isdigit(): raise CallsatError(f"CALLSAT_BRIDGE_CACHE must be a number of graphs (0: off), got {v!r}")
  return StructureCache(int(v)) if int(v) else None
