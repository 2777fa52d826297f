"""callsat's callify inside tinygrad 0.14.0: `transform_to_call` with tinygrad's contract, decided by callsat's rules and
extraction; `install()` swaps it in for tinygrad's own pass (strict: never fall back; otherwise a graph callsat cannot
take runs tinygrad's pass and is counted with its reason). Also a pytest plugin: `python -m pytest -p egraph.tinygrad`
installs it for the session (mode from CALLSAT_BRIDGE=strict|fallback) and prints a closing count."""
from __future__ import annotations
import contextlib, dataclasses, os, threading
from collections import Counter
from importlib.metadata import version, PackageNotFoundError
from egraph.ir.errors import CallsatError

REQUIRED_TINYGRAD = "0.14.0"

class BridgeVersionError(CallsatError, ImportError):
  """The installed tinygrad is not the release the bridge keeps the contract of."""

def tinygrad_version() -> str | None:
  try: return version("tinygrad")
  except PackageNotFoundError: return None

def check_version() -> None:
  if (v := tinygrad_version()) != REQUIRED_TINYGRAD:
    raise BridgeVersionError(f"callsat's tinygrad bridge needs tinygrad=={REQUIRED_TINYGRAD} "
                             f"({'not installed' if v is None else f'found {v}'}); pip install 'callsat[tinygrad]'")

check_version()
import tinygrad.tensor as _tg_tensor   # noqa: E402  (only once the version is known to be the right one)
from tinygrad.uop.ops import UOp   # noqa: E402
from tinygrad.engine.realize import capturing   # noqa: E402  (TinyJit's capture in progress: non-empty)
from egraph.bridge.convert import BridgeRefusal, DiskViewError, to_callsat, to_tinygrad   # noqa: E402
from egraph.engine.driver import callify   # noqa: E402
from egraph.bridge.shadow import bridge_fusion, cost_hints, explore_setting, realize_hints, hint_uops, Hints   # noqa: E402
from egraph.ir.env import env_switch   # noqa: E402
from egraph.bridge.measure import ENV as MEASURE_ENV, Measured, decide_at, margin, measure   # noqa: E402
from egraph.bridge.verdicts import Verdict, digest, enabled as verdicts_enabled, store as verdict_store   # noqa: E402
from egraph.bridge.cache import Sighted, StructureCache, structure, make_entry, rebind, from_env   # noqa: E402
from egraph.bridge.backend import (EMPTY, Program, bridge_backend, inline_functions, program, tinygrad_call, hook,   # noqa: E402
                                   stats as backend_stats)
from egraph.bridge.symbolic import bound_values, symbolic_mode   # noqa: E402

STOCK_TRANSFORM = _tg_tensor.transform_to_call   # tinygrad's own pass, as imported

def transform_to_call(big_sink: UOp) -> tuple[UOp, dict[UOp, UOp]]:
  """tinygrad 0.14's `transform_to_call` by equality saturation: (CALL, buffer_map) over tinygrad UOps. Raises
  BridgeRefusal (a CallsatError naming the op, dtype or form) for a graph callsat cannot take. With
  CALLSAT_BRIDGE_FUSION=cost the values callsat's cost mode stores come back as CONTIGUOUS in the CALL body, with
  cost-store as STOREs of the CALL (egraph/bridge/shadow.py). A graph whose structure was decided before (other
  buffers, other bound values) is rebound from the structural cache (egraph/bridge/cache.py; CALLSAT_BRIDGE_CACHE)."""
  backend = bridge_backend(_STATE["backend"])
  mode = bridge_fusion()   # with callsat's kernels, cost mode's stores are priced on callsat's own time model
  # measured: cost mode's hints, and (fallback mode) callsat's kernels against tinygrad's
  measuring = (mode != "rules" if backend == "tinygrad" else _STATE["mode"] == "fallback") and env_switch(MEASURE_ENV)
  symbolic = symbolic_mode(_STATE["mode"] == "strict") if backend != "tinygrad" else "tinygrad"   # graphs over bound variables
  cache = _cache()
  if cache is None:
    call, bmap, hints = _decide(big_sink, mode, measuring, backend=backend, symbolic=symbolic)
    _count_backend(backend, hints)
    return call, bmap
  st = structure(big_sink)
  # the options change the CALL: part of the key (with callsat's kernels, strict raises where fallback runs tinygrad's);
  # so does a TinyJit capture where a decision is priced and measured (a replay's launches, not an eager call's)
  key = (mode, measuring, backend, _STATE["mode"] if backend != "tinygrad" else None, symbolic, st.key,
         measuring and bool(capturing), measuring and mode != "rules" and explore_setting())
  if (hit := cache.get(key)) is not None and not isinstance(hit, Sighted):
    if isinstance(hit, BridgeRefusal): raise BridgeRefusal(hit.reason, hit.detail)
    if mode != "rules": _count_hints(hit.extra, seconds=False)   # handed to tinygrad again, chosen once
    _count_backend(backend, hit.extra)
    return rebind(hit, st)
  # TinyJit replays what it captured for good: a graph it is capturing is decided now
  if measuring and not capturing and (n := hit.count if hit is not None else 0) + 1 < decide_at():
    return _undecided(big_sink, st, key, n + 1, hit, cache, backend)
  # the key's walk is the whole toposort unless it stopped at a binding (stripped): the conversion walks it once
  try: call, bmap, hints = _decide(big_sink, mode, measuring, st, backend, symbolic)
  except BridgeRefusal as e:
    cache.put(key, BridgeRefusal(e.reason, e.detail), len(st.topo))   # refused by structure alone: refused again without converting
    raise
  _count_backend(backend, hints)
  # a CALL without the hints that failed is fallback mode's answer for this call: strict must meet the error again
  if not hints.failed: cache.put(key, make_entry(st, call, bmap, hints if mode != "rules" or backend != "tinygrad" else None), len(st.topo))
  return call, bmap

DEFERRED = "backend:deciding-at-a-later-run"   # a structure's measured decision waits for its decide_at()-th sighting

def _undecided(big_sink: UOp, st, key, count: int, seen, cache: StructureCache, backend: str):
  """A sighting before a structure's measured decision (measure.decide_at): the plain rules CALL, tinygrad's kernels,
  rebound from the last sighting's entry where it could be kept."""
  if seen is not None and seen.plain is not None: call, bmap = rebind(seen.plain, st)
  else:
    try: call, bmap, _ = _decide(big_sink, "rules", False, st)
    except BridgeRefusal as e:   # the rules CALL is every decision's base: refused by structure alone
      cache.put(key, BridgeRefusal(e.reason, e.detail), len(st.topo))
      raise
  cache.put(key, Sighted(count, seen.plain if seen is not None else make_entry(st, call, bmap)), len(st.topo))
  with _LOCK: _COUNTS["undecided"] += 1
  _count_backend(backend, Hints(backend=DEFERRED))
  return call, bmap

def _decide(big_sink: UOp, mode: str, measuring: bool, st=None, backend: str = "tinygrad", symbolic: str = "tinygrad"):
  """callsat's decision for one graph: (CALL, buffer_map, cost-mode hints); `measuring`: hints are checked by running
  the hinted and unhinted CALLs (egraph/bridge/measure.py; explored hints that lose give way to their `alternative`,
  measured the same way), verdicts kept per user (egraph/bridge/verdicts.py); `st`:
  the graph's structure, if made already; `backend` "callsat": the CALL runs callsat's kernels where it can
  (egraph/bridge/backend.py; the hints' `backend` says why not), graphs over bound variables as `symbolic` says (symbolic.symbolic_mode)."""
  if backend != "tinygrad": return _decide_backend(big_sink, measuring, st, symbolic, mode)
  cv, roots = to_callsat(big_sink, None if st is None or st.stripped else st.topo, consts=mode != "rules")
  eager = not capturing   # outside a TinyJit capture every call schedules and lowers each kernel again
  explore = measuring and explore_setting()   # hints the model does not predict, for the measured check alone
  store = verdict_store() if measuring else None
  name = digest(mode, tinygrad_version(), margin(), (st or structure(big_sink)).key, eager, explore) if store is not None else None
  known = store.get(name) if store is not None else None
  if known is not None:
    with _LOCK: _COUNTS["verdicts_reused"] += 1
  if known is not None and not known.keep:   # lost when measured before: not chosen again
    hints = Hints(measured=_as_measured(known), note=f"{len(known.idents)} hints dropped: {_as_measured(known)} before, kept per user")
  else: hints = _hints(cv, roots, eager=eager, explore=explore) if mode != "rules" else Hints()
  if known is not None and known.keep and hints.alternative and known.idents == tuple(sorted(hints.alternative)):
    hints = _alternative(hints, cv)   # the explored alternative won when measured before
  res = _callify(roots)   # cost mode's stores are CONTIGUOUS in the returned CALL (to_tinygrad); cost-store's, in the graph
  def hinted(h: Hints) -> tuple:
    if mode == "cost-store" and h.idents: r = _callify(realize_hints(cv, roots, h.idents)); return to_tinygrad(cv, r.call, r.buffer_map)
    return to_tinygrad(cv, res.call, res.buffer_map, h.idents if mode == "cost" else frozenset())
  call, bmap = hinted(hints)
  tried = tuple(sorted(hints.idents))
  if tried and measuring and known is not None and known.idents == tried:   # won when measured before
    hints = dataclasses.replace(hints, measured=_as_measured(known))
  elif tried and measuring:   # the prediction checked once per structure, by running both
    stock = to_tinygrad(cv, res.call, res.buffer_map)
    dev = next(iter({r.device for r in roots if r.device is not None}))
    hints = _measured(hints, stock[0], call, dev, eager)
    if not hints.idents and hints.alternative and not hints.failed:   # the explored partition lost: the second candidate
      hints = _alternative(hints, cv)
      call, bmap = hinted(hints)
      tried = tuple(sorted(hints.idents))
      hints = _measured(hints, stock[0], call, dev, eager)
    if not hints.idents: call, bmap = stock
    if store is not None and (m := hints.measured) is not None:
      store.put(name, Verdict(bool(hints.idents), tried, m.stock_s, m.hinted_s, m.rounds, m.ratio))
  if mode != "rules": _count_hints(hints)
  return call, bmap, hints

def _decide_backend(big_sink: UOp, measuring: bool, st=None, symbolic: str = "tinygrad", mode: str = "rules"):
  """The decision with callsat's kernels (egraph/bridge/backend.py): a Program running the rules CALL, or (fallback)
  the rules CALL for tinygrad's kernels and why. Plain functions are inlined first (their arithmetic runs callsat's
  kernels); a graph left to tinygrad gets the CALL the plain bridge gives (decided as it came). `measuring` (fallback
  mode): the Program runs only where it measured faster than tinygrad's kernels, checked once per structure and kept
  per user like cost mode's verdicts (a structure measured slower before is not even compiled). Cost mode's stores
  (`mode` cost) are measured first against the same Program without them and kept only where they win."""
  topo = None if st is None or st.stripped else st.topo
  store = verdict_store() if measuring else None
  name = digest("backend", mode, tinygrad_version(), margin(), (st or structure(big_sink)).key) if store is not None else None
  if (known := store.get(name) if store is not None else None) is not None:
    with _LOCK: _COUNTS["verdicts_reused"] += 1
    if not known.keep: return (*_rules(big_sink, topo)[2:4], Hints(backend=SLOWER, measured=_as_measured(known)))
  sink, back = inline_functions(big_sink)
  cost = mode != "rules" and (known is None or bool(known.idents))   # stores that lost before are not chosen again
  def made(hinted: bool):   # (the Program, or the refusal, its tinygrad CALL and buffer_map, the hints)
    cv, ccall, call, bmap, hints = _rules(sink, topo if back is None else None, hinted)
    if back is not None: bmap = {o: bmap[n] for o, n in back.items() if n in bmap}   # the program's tensors are the originals'
    # with stores, a graph over bound variables must stay in the static form (one compile for every value): a store
    # of symbolic shape made concrete per value would compile every token
    sym = "static" if hinted and hints.idents and symbolic == "specialize" else symbolic
    try: prog, order = program(cv, ccall, sym, bound_values(call))
    except BridgeRefusal as e: return e, call, bmap, hints
    return (None if prog is None else (prog, tinygrad_call(prog, order, call))), call, bmap, hints
  got, call, bmap, hints = made(cost)
  if mode != "rules": _count_hints(hints)
  if isinstance(got, BridgeRefusal) and hints.idents:   # the stores put the graph out of callsat's reach (a stored value
    why = got                                            # of symbolic shape leaves the static form): dropped
    got, call, bmap, _ = made(False)
    hints = dataclasses.replace(hints, idents=frozenset(), uops=[], note=f"{len(hints.idents)} stores dropped: {why.reason}")
  came = {}
  def as_came() -> tuple:   # tinygrad's CALL and buffer_map of the graph as it came (no inlining, no stores), made once
    if "it" not in came: came["it"] = _rules(big_sink, topo)[2:4] if back is not None or hints.idents else (call, bmap)
    return came["it"]
  def tinygrads(why, m=None): return (*as_came(), Hints(backend=why, measured=m))   # tinygrad's kernels run it
  if isinstance(got, BridgeRefusal):
    if _STATE["mode"] == "strict": raise got
    return tinygrads(got.reason)
  if got is None: return call, bmap, Hints(backend=EMPTY)
  (prog, ours), hints = got, dataclasses.replace(hints, backend=got[0])
  if not measuring: return ours, bmap, hints   # strict: callsat's kernels, measured or not
  if known is not None: return ours, bmap, dataclasses.replace(hints, measured=_as_measured(known))
  if hints.idents:   # the stores against the same Program without them: kept only where they win
    plain, pcall, pbmap, _ = made(False)
    if isinstance(plain, tuple) and (m := _measured_backend(plain[1], ours, prog)) is not None and not m.keep:
      (prog, ours), call, bmap = plain, pcall, pbmap
      hints = dataclasses.replace(hints, idents=frozenset(), uops=[], backend=prog, measured=m,
                                  note=f"{len(hints.idents)} stores dropped: {m}, not faster than the Program without them")
  if (m := _measured_backend(as_came()[0], ours, prog)) is not None and store is not None:
    store.put(name, Verdict(m.keep, tuple(sorted(hints.idents)), m.stock_s, m.hinted_s, m.rounds, m.ratio))
  if m is not None and not m.keep: return tinygrads(SLOWER, m)
  return ours, bmap, dataclasses.replace(hints, measured=m)

def _rules(sink: UOp, topo=None, cost: bool = False) -> tuple:
  """(the conversion, callsat's rules CALL, it as tinygrad's CALL with its buffer_map, the cost-mode hints) of a graph
  (`topo`: its toposort, if made already); `cost`: with the values callsat's cost mode stores, priced on callsat's own
  kernels, stored too."""
  cv, roots = to_callsat(sink, topo, consts=True)
  hints = _hints(cv, roots, "callsat") if cost else Hints()
  res = _callify(realize_hints(cv, roots, hints.idents))
  return (cv, res.call, *to_tinygrad(cv, res.call, res.buffer_map), hints)

SLOWER = "backend:measured-slower"   # fallback mode's reason when tinygrad's kernels measured faster than callsat's

def _measured_backend(stock: UOp, ours: UOp, prog) -> Measured | None:
  """The measured check of a Program (fallback mode, once per structure): tinygrad's kernels and callsat's run on
  scratch copies, interleaved (egraph/bridge/measure.py); `keep` says callsat's won by more than the margin. None when
  it cannot be measured (counted as measure_errors; callsat's kernels stay: they are exact, only their speed is unknown)."""
  try: m = measure(stock, ours, next(iter(prog.devices), "CPU"))
  except Exception:
    with _LOCK: _COUNTS["measure_errors"] += 1
    return None
  _count_measured(m)
  return m

def _count_measured(m: Measured) -> None:
  with _LOCK:
    _COUNTS["measured"] += 1; _COUNTS["measure_seconds"] += m.seconds; _COUNTS["measure_dropped"] += not m.keep

def _as_measured(v: Verdict) -> Measured: return Measured(v.stock_s, v.hinted_s, v.rounds, 0.0, v.ratio)

def _callify(roots):
  # tinygrad's schedule cache keys on the body (a callsat result cache would only hold buffers); tinygrad 0.14 reads an
  # assign into a realize point as a write into that point's storage; what gets stored beyond the graph's own realize
  # points is the bridge option's choice (CALLSAT_BRIDGE_FUSION, above), never CALLSAT_FUSION's
  return callify(*roots, cache=False, assigns="realized", fusion="rules")

def _measured(hints: Hints, stock: UOp, hinted: UOp, device, eager: bool = False) -> Hints:
  """hints with the measured check's verdict (egraph/bridge/measure.py): kept when they win, else none and why. An error
  while measuring drops them in fallback mode (the unhinted CALL is strict's own; counted, not cached, so strict meets
  the error again); strict raises it."""
  try: m = measure(stock, hinted, device, eager)
  except Exception as e:
    if _STATE["mode"] != "fallback": raise
    with _LOCK: _COUNTS["measure_errors"] += 1
    return dataclasses.replace(hints, idents=frozenset(), uops=[], failed=True,   # this call's answer, never cached
                               note=f"hints dropped: measuring failed: {type(e).__name__}: {e}")
  _count_measured(m)
  if m.keep: return dataclasses.replace(hints, measured=m)
  return dataclasses.replace(hints, idents=frozenset(), uops=[], measured=m,
                             note=f"{len(hints.idents)} hints dropped: {m}, not faster by more than {margin():.0%}")

def _alternative(h: Hints, cv) -> Hints:
  """h's second explored candidate (callsat's rules-like stores, measured where the partition's lost) as its hints."""
  a = h.alternative
  return dataclasses.replace(h, idents=a, uops=hint_uops(cv, a), alternative=frozenset(), measured=None,
                             note=f"explored ({h.note}): then {len(a)} of callsat's rules-like stores, kept only if measured faster")

def _hints(cv, roots, kernels: str = "tinygrad", eager: bool = False, explore: bool = False) -> Hints:
  """cost_hints. In fallback mode an error while choosing them gives no hints (the CALL is sound without) and
  is counted; strict (and a direct call) raises it."""
  try: h = cost_hints(cv, roots, kernels, eager, explore)
  except Exception as e:
    if _STATE["mode"] != "fallback": raise
    h = Hints(note=f"{type(e).__name__}: {e}", failed=True)
    with _LOCK: _COUNTS["hint_errors"] += 1
  return h

def _count_backend(backend: str, h) -> None:
  """Count a call's backend: run by callsat's kernels, or by tinygrad's and why (the decision's Hints.backend)."""
  if backend == "tinygrad": return
  with _LOCK:
    if isinstance(h.backend, Program): _COUNTS["backend_callsat"] += 1
    elif h.backend == EMPTY: _COUNTS["backend_empty"] += 1
    else: _COUNTS["backend_tinygrad"] += 1; _BACKEND_REASONS[h.backend] += 1

def _count_hints(h: Hints, seconds: bool = True) -> None:
  with _LOCK:
    _COUNTS["hinted" if h.idents else "unhinted"] += 1; _COUNTS["hints"] += len(h.idents)
    if seconds: _COUNTS["hint_seconds"] += h.seconds; _COUNTS["explored"] += h.explored
    _LAST["hints"] = h

def last_hints() -> Hints | None:
  """The hints of the last bridged call in cost mode (CALLSAT_BRIDGE_FUSION=cost), for reports and tests."""
  return _LAST.get("hints")

# ---- install, stats ---------------------------------------------------------------------------------------------------

_LOCK = threading.Lock()
_STATE = {"mode": None, "backend": None}   # mode None: not installed; "strict" | "fallback"; backend None: from the env
_COUNTS: Counter = Counter()
_REASONS: Counter = Counter()
_BACKEND_REASONS: Counter = Counter()   # why a graph ran on tinygrad's kernels with CALLSAT_BRIDGE_BACKEND=callsat
_LAST: dict = {}
_CACHE: dict = {}   # "cache": the process's StructureCache (or None: off), made on first use from CALLSAT_BRIDGE_CACHE

def _cache() -> StructureCache | None:
  if "cache" not in _CACHE:
    with _LOCK:
      if "cache" not in _CACHE: _CACHE["cache"] = from_env()
  return _CACHE["cache"]

def set_cache(cache: StructureCache | None) -> None:
  """Use this structural cache from now on (None: no cache; every graph is decided anew)."""
  with _LOCK: _CACHE["cache"] = cache

def cache_stats() -> dict:
  """The structural cache's counts (entries, nodes, hits, misses, stored, uncacheable, evicted); {} when it is off."""
  return c.stats() if (c := _cache()) is not None else {}

def _reason(e: BaseException) -> str:
  if isinstance(e, BridgeRefusal): return e.reason
  return f"error:{type(e).__name__}" if isinstance(e, CallsatError) else f"bug:{type(e).__name__}"

def _count(kind: str, reason: str | None = None) -> None:
  with _LOCK:
    _COUNTS["calls"] += 1; _COUNTS[kind] += 1
    if reason: _REASONS[reason] += 1

def _bridged_pass(big_sink: UOp) -> tuple[UOp, dict[UOp, UOp]]:
  """What tinygrad calls once installed."""
  strict = _STATE["mode"] == "strict"
  # a bad setting is the user's error, in fallback mode too
  bridge_fusion(); env_switch(MEASURE_ENV); decide_at(); verdicts_enabled(); bridge_backend(_STATE["backend"]); symbolic_mode(strict)
  try: out = transform_to_call(big_sink)
  except DiskViewError:   # tinygrad's own error on this graph: raised in both modes, as stock would
    _count("bridged")
    raise
  except Exception as e:
    _count("refused" if strict else "fallback", _reason(e))
    if strict: raise
    return STOCK_TRANSFORM(big_sink)
  _count("bridged")
  return out

def install(strict: bool = False, backend: str | None = None) -> None:
  """Make tinygrad's realize, schedule and callify use callsat's pass (idempotent; a second call sets the mode).
  `backend`: "tinygrad" (tinygrad's kernels run the CALL) or "callsat" (callsat's LLVM kernels run it where they can,
  egraph/bridge/backend.py); None: env CALLSAT_BRIDGE_BACKEND, read on every call, else "tinygrad". With "callsat",
  graphs over bound variables run callsat's kernels as egraph/bridge/symbolic.py's symbolic_mode says: at the
  variables' maxima with the values read at run time (one compile), else (strict mode, or env
  CALLSAT_BRIDGE_SYMBOLIC=specialize) made concrete per value."""
  check_version()
  if backend is not None: bridge_backend(backend)   # a bad name is the caller's error, now
  with _LOCK:
    _STATE["mode"], _STATE["backend"] = "strict" if strict else "fallback", backend
    _tg_tensor.transform_to_call = _bridged_pass
    hook()

def uninstall() -> None:
  """Give tinygrad its own pass back (idempotent). Programs handed to tinygrad before (a TinyJit's capture) still run."""
  with _LOCK:
    _STATE["mode"], _STATE["backend"] = None, None
    _tg_tensor.transform_to_call = STOCK_TRANSFORM

def is_installed() -> str | None:
  """The installed mode ("strict" or "fallback"), or None."""
  return _STATE["mode"]

@contextlib.contextmanager
def installed(strict: bool = False, backend: str | None = None):
  """install() for the `with` block, then the state before it."""
  before, backend_before = _STATE["mode"], _STATE["backend"]
  install(strict, backend)
  try: yield
  finally:
    if before is None: uninstall()
    else: install(before == "strict", backend_before)

def stats() -> dict:
  """Cumulative for the process: calls, bridged, fallback, refused (strict raised), reasons (reason -> count); in cost
  mode hinted / unhinted calls, hints (realize points handed to tinygrad), hint_errors (fallback mode: none given),
  hint_seconds (choosing them) and explored (decisions that sent unpredicted stores to the measured check:
  CALLSAT_BRIDGE_EXPLORE); the measured check's measured (structures checked: cost mode's hints, and with
  callsat's kernels in fallback mode each Program against tinygrad's kernels), measure_dropped (hints, or Programs,
  measured no faster), measure_errors (fallback mode: measuring failed, hints dropped), measure_seconds,
  verdicts_reused (structures whose verdict a former process measured) and undecided (calls that ran the plain CALL
  while their structure's measured decision waited for a later sighting: measure.decide_at); with CALLSAT_BRIDGE_BACKEND=callsat,
  backend_callsat / backend_tinygrad (calls whose CALL runs callsat's kernels / tinygrad's), backend_empty (CALLs over
  no buffer: nothing for either to run), backend_reasons (why
  tinygrad's) and backend_runs (Programs run, TinyJit replays included); cache: the structural cache's counts."""
  cache = cache_stats()   # outside _LOCK: making the cache takes it
  with _LOCK:
    return {"calls": _COUNTS["calls"], "bridged": _COUNTS["bridged"], "fallback": _COUNTS["fallback"],
            "refused": _COUNTS["refused"], "reasons": dict(_REASONS.most_common()),
            "hinted": _COUNTS["hinted"], "unhinted": _COUNTS["unhinted"], "hints": _COUNTS["hints"],
            "hint_errors": _COUNTS["hint_errors"], "hint_seconds": _COUNTS["hint_seconds"], "explored": _COUNTS["explored"],
            "measured": _COUNTS["measured"],
            "measure_dropped": _COUNTS["measure_dropped"], "measure_errors": _COUNTS["measure_errors"],
            "measure_seconds": _COUNTS["measure_seconds"], "verdicts_reused": _COUNTS["verdicts_reused"],
            "undecided": _COUNTS["undecided"],
            "backend_callsat": _COUNTS["backend_callsat"], "backend_tinygrad": _COUNTS["backend_tinygrad"],
            "backend_empty": _COUNTS["backend_empty"],
            "backend_reasons": dict(_BACKEND_REASONS.most_common()), "backend_runs": backend_stats()["runs"], "cache": cache}

def reset_stats() -> None:
  with _LOCK: _COUNTS.clear(); _REASONS.clear(); _BACKEND_REASONS.clear(); _LAST.clear()

def summary(top: int = 5) -> str:
  s = stats()
  line = f"callsat bridge: {s['calls']} calls, {s['bridged']} bridged, {s['fallback']} fell back"
  if s["refused"]: line += f", {s['refused']} refused"
  if c := s["cache"]: line += f"; structural cache: {c['hits']} hits, {c['misses']} misses, {c['uncacheable']} uncacheable"
  if s["hinted"] + s["unhinted"]:   # CALLSAT_BRIDGE_FUSION=cost or cost-store ran
    line += f"; cost mode: {s['hinted']} calls hinted, {s['hints']} realize points, {s['hint_errors']} errors, {s['hint_seconds']:.1f}s"
    if s["measured"] + s["measure_errors"]:
      line += f"; measured {s['measured']} (dropped {s['measure_dropped']}, {s['measure_errors']} errors, {s['measure_seconds']:.1f}s)"
      if s["explored"]: line += f", {s['explored']} explored"
  if s["backend_callsat"] + s["backend_tinygrad"]:   # CALLSAT_BRIDGE_BACKEND=callsat
    line += f"; callsat's kernels: {s['backend_callsat']} calls, tinygrad's: {s['backend_tinygrad']}, nothing to run: {s['backend_empty']}"
  reasons = list(s["reasons"].items())[:top] + [(f"tinygrad's kernels: {r}", n) for r, n in list(s["backend_reasons"].items())[:top]]
  return line + "".join(f"\n  {n:6d}  {r}" for r, n in reasons)

# ---- the pytest plugin: python -m pytest -p egraph.tinygrad -------------------------------------------------------------

def pytest_configure(config) -> None:
  mode = os.environ.get("CALLSAT_BRIDGE", "fallback")
  if mode not in ("strict", "fallback"): raise CallsatError(f"CALLSAT_BRIDGE must be strict or fallback, got {mode!r}")
  install(strict=mode == "strict")

def pytest_terminal_summary(terminalreporter) -> None:
  terminalreporter.write_line(summary())

def pytest_unconfigure(config) -> None:
  uninstall()
