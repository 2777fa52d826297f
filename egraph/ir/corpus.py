"""A graph corpus on disk: named callsat IR graphs as JSON lines, one graph per line (notes/corpus.md has the format).

A record is `{"version": 1, "name": ..., "meta": {...}, "roots": [i, ...], "nodes": [[op, dtype, [src i...], arg?], ...]}`
with the nodes children first (every CALL/FUNCTION body included) and each arg in a small tagged encoding that keeps
what JSON would lose: floats exactly (non-finite ones by their bits), tuples vs bools vs ints, Ops, the arg dataclasses
(by their fields), symbolic dims. BUFFERs and host dims are numbered per record in first-visit order, so the same graph
always writes the same bytes and loading mints one fresh identity per number: distinct buffers stay distinct, a buffer
read twice stays one. The IR floor only: reading a corpus loads no engine."""
from __future__ import annotations
import dataclasses, gzip, io, itertools, json, math, numbers, os, struct
from dataclasses import dataclass, field
from egraph.ir.dtype import DType, dtypes
from egraph.ir.errors import CallsatError
from egraph.ir.ops import Node, Ops, BufferArg, ParamArg, OpaqueArg, CallInfo, new_buffer, toposort
from egraph.ir.symbolic import Variable, BoundVar, HostDim

VERSION = 1
DTYPES = {v.name: v for v in vars(dtypes).values() if isinstance(v, DType)}
ARGS = {"buf": BufferArg, "param": ParamArg, "opaque": OpaqueArg, "call": CallInfo}   # tag -> arg dataclass
_TAG = {cls: tag for tag, cls in ARGS.items()}
_loads = itertools.count()   # HostDim keys minted at load: ("corpus", load, k) never meets a live host's key

class CorpusError(CallsatError):
  """A corpus file or record that cannot be read or written (bad version, bad record, unknown graph name)."""

@dataclass
class Graph:
  """One named graph: its roots (what callify takes) and free-form JSON metadata (where it came from)."""
  name: str
  roots: list[Node]
  meta: dict = field(default_factory=dict)

# ---- args ------------------------------------------------------------------------------------------------------------

def _float(v: float):
  if math.isfinite(v): return v       # json writes repr (exact, keeps -0.0) and reads it back as a float
  return {"bits": struct.pack(">d", v).hex()}

class _Args:
  """Encodes the args of one record. BUFFER uids and HostDim keys (process-wide identities) become record-local
  numbers in first-visit order."""
  def __init__(self): self.bufs, self.dims = {}, {}

  def __call__(self, v):
    if isinstance(v, BoundVar): return {"bound": [v.var.name, v.var.vmin, v.var.vmax, int(v)]}
    if isinstance(v, Variable): return {"var": [v.name, v.vmin, v.vmax]}
    if isinstance(v, HostDim): return {"host": [self.dims.setdefault(v.key, len(self.dims)), int(v), v.label]}
    if v is None or isinstance(v, (bool, str)) or type(v) is int: return v
    if isinstance(v, float): return _float(v)
    if isinstance(v, tuple): return [self(x) for x in v]
    if isinstance(v, Ops): return {"op": v.name}
    if (tag := _TAG.get(type(v))) is not None:
      vals = [getattr(v, f.name) for f in dataclasses.fields(v)]
      if tag == "buf": vals[0] = self.bufs.setdefault(v.uid, len(self.bufs))
      defaults = [f.default for f in dataclasses.fields(v)]
      while vals and defaults[len(vals) - 1] is not dataclasses.MISSING and vals[-1] == defaults[len(vals) - 1]: vals.pop()
      return {tag: [self(x) for x in vals]}   # trailing defaults left out: a field added later does not change old records
    if isinstance(v, numbers.Integral) and type(v).__module__ == "numpy": return int(v)
    raise CorpusError(f"cannot write an arg of type {type(v).__name__}: {v!r}")

class _Decode:
  """Encoded args back to Python values; one record's buffer numbers and host dims map to fresh identities."""
  def __init__(self): self.bufs, self.dims, self.load = {}, {}, next(_loads)

  def __call__(self, v):
    if v is None or isinstance(v, (bool, int, float, str)): return v
    if isinstance(v, list): return tuple(self(x) for x in v)
    if not isinstance(v, dict) or len(v) != 1: raise CorpusError(f"bad arg {v!r}")
    (tag, x), = v.items()
    if tag == "bits": return struct.unpack(">d", bytes.fromhex(x))[0]
    if tag == "op": return Ops[x]
    if tag == "var": return Variable(*x)
    if tag == "bound": return Variable(*x[:3]).bind(x[3])
    if tag == "host": return HostDim(x[1], ("corpus", self.load, x[0]), x[2])
    if tag not in ARGS: raise CorpusError(f"unknown arg tag {tag!r}")
    vals = [self(y) for y in x]
    if tag == "buf":   # a fresh uid per buffer number of the record
      if x[0] not in self.bufs: self.bufs[x[0]] = new_buffer(0, dtypes.uint8, "CPU").arg.uid
      vals[0] = self.bufs[x[0]]
    return ARGS[tag](*vals)

# ---- records ---------------------------------------------------------------------------------------------------------

def dumps(g: Graph) -> str:
  """One record as one line of JSON (no newline); the same graph always gives the same text."""
  order = toposort(g.roots, enter_calls=True)
  index = {n.id: i for i, n in enumerate(order)}
  enc, nodes = _Args(), []
  for n in order:
    row = [n.op.name, n.dtype.name, [index[s.id] for s in n.src]]
    if n.arg is not None: row.append(enc(n.arg))
    nodes.append(row)
  rec = {"version": VERSION, "name": g.name, "meta": g.meta, "roots": [index[r.id] for r in g.roots], "nodes": nodes}
  try: return json.dumps(rec, separators=(",", ":"), allow_nan=False)
  except (TypeError, ValueError) as e: raise CorpusError(f"graph {g.name!r}: meta is not plain JSON: {e}") from None

def loads(line: str, where: str = "") -> Graph:
  """One record back to a Graph with equal Nodes (fresh BUFFER uids). `where` (a file) prefixes error messages."""
  at = lambda name=None: " ".join(filter(None, (where, None if name is None else f"graph {name!r}"))) or "record"
  try: rec = json.loads(line)
  except json.JSONDecodeError as e: raise CorpusError(f"{at()}: not JSON ({e})") from None
  if not isinstance(rec, dict) or "version" not in rec: raise CorpusError(f"{at()}: not a callsat corpus record (no version field)")
  if rec["version"] != VERSION:
    raise CorpusError(f"{at()}: corpus format version {rec['version']!r} is not supported (this callsat reads version {VERSION})")
  name = rec.get("name")
  try:
    dec, built = _Decode(), []
    for i, row in enumerate(rec["nodes"]):
      op, dt, src = Ops[row[0]], DTYPES[row[1]], tuple(built[j] for j in row[2])
      arg = dec(row[3]) if len(row) > 3 else None
      try: built.append(Node(op, dt, src, arg))
      except CallsatError as e: raise CorpusError(f"{at(name)}: node {i} ({row[0]}): {e}") from None
    return Graph(str(name), [built[r] for r in rec["roots"]], dict(rec.get("meta") or {}))
  except CorpusError: raise
  except (KeyError, IndexError, TypeError, ValueError) as e:
    raise CorpusError(f"{at(name)}: malformed record: {type(e).__name__}: {e}") from None

# ---- files -----------------------------------------------------------------------------------------------------------

def _open(path: str, mode: str):
  """Text file, gzip-compressed when the name ends in .gz (no name or time in the header: same graphs, same bytes)."""
  if not path.endswith(".gz"): return open(path, mode, encoding="utf-8", newline="\n")
  raw = open(path, mode + "b")
  return io.TextIOWrapper(gzip.GzipFile(filename="", mode=mode + "b", fileobj=raw, mtime=0), encoding="utf-8", newline="\n")

def save(path: str, graphs) -> int:
  """Write `graphs` (Graphs, or lines from dumps) to `path`, one per line; names must be unique. Returns the count."""
  lines, seen = [], set()
  for g in graphs:
    line = g if isinstance(g, str) else dumps(g)
    name = g.name if isinstance(g, Graph) else json.loads(line).get("name")
    if name in seen: raise CorpusError(f"{path}: two graphs named {name!r}")
    seen.add(name); lines.append(line)
  with _open(path, "w") as f:
    for line in lines: f.write(line + "\n")
  return len(lines)

def lines(path: str) -> list[tuple[str, str]]:
  """(name, record text) per record of a corpus file, without building any graph."""
  if not os.path.isfile(path): raise CorpusError(f"corpus {path!r} not found")
  out = []
  try:
    with _open(path, "r") as f:
      for i, line in enumerate(f, 1):
        if not line.strip(): continue
        try: head = json.loads(line)
        except json.JSONDecodeError as e: raise CorpusError(f"{path} line {i}: not JSON ({e})") from None
        if not isinstance(head, dict) or "version" not in head: raise CorpusError(f"{path} line {i}: not a callsat corpus record (no version field)")
        if head["version"] != VERSION:
          raise CorpusError(f"{path} line {i}: corpus format version {head['version']!r} is not supported (this callsat reads version {VERSION})")
        out.append((str(head.get("name")), line.rstrip("\n")))
  except (OSError, EOFError, UnicodeDecodeError) as e: raise CorpusError(f"corpus {path!r}: cannot read: {e}") from None
  return out

def names(path: str) -> list[str]: return [n for n, _ in lines(path)]

def pick(path: str, wanted) -> list[tuple[str, str]]:
  """(name, record text) of each graph named in `wanted`, in that order; a one-line CorpusError for a name not there."""
  recs = lines(path)
  by = dict(recs)
  for name in wanted:
    if name not in by:
      have = [n for n, _ in recs]
      more = f", ... ({len(have)} in all)" if len(have) > 8 else ""
      raise CorpusError(f"corpus {path!r} has no graph named {name!r}; it has {', '.join(have[:8]) or 'no graphs'}{more}")
  return [(name, by[name]) for name in wanted]

def get(path: str, name: str) -> Graph: return loads(pick(path, [name])[0][1], path)

def load(path: str) -> list[Graph]:
  return [loads(line, path) for _, line in lines(path)]
