"""Property checking of rules: `check(rule_or_ruleset, examples=N)` draws random graphs that contain each rule's left
side (rules/testing/strategies.py), saturates them with that rule alone and compares every e-node of every e-class with its
class's value on the numpy reference, on two independent storages (values, and aliasing for views) with the bad-merge
canary on. A failure is shrunk by hypothesis and returned (not raised) with the counterexample graph rendered.

hypothesis is a test extra (`pip install callsat[test]`); it is imported when a check runs."""
from __future__ import annotations
import contextlib, os, re, time
from dataclasses import dataclass, field
from rules.registry import Rule, RULES, PHASES, validate
from egraph.ir.errors import CallsatError, EngineError
from rules.testing.strategies import PLANTED, hypothesis_strategies, rule_graphs
from rules.testing.soundness import check_egraph

DEFAULT_EXAMPLES = 200

def examples_from_env(default: int = DEFAULT_EXAMPLES) -> int:
  """`CALLSAT_CHECK_EXAMPLES` if set, else `default`."""
  v = os.environ.get("CALLSAT_CHECK_EXAMPLES", "")
  try: return int(v) if v else default
  except ValueError as e: raise CallsatError(f"CALLSAT_CHECK_EXAMPLES must be an integer, got {v!r}") from e

@dataclass
class CheckResult:
  """The outcome of checking one rule."""
  rule: str
  examples: int = 0            # graphs checked before the first failure (or in all)
  fired: int = 0               # of those, graphs on which the rule matched
  matches: int = 0             # total matches of the rule
  sound: bool = True           # no graph broke a value, the canary, a derived fact or a structural invariant
  counterexample: str = ""     # the shrunk failing graph, rendered
  problem: str = ""            # what was wrong on it: the disagreeing e-node and values, or the canary's message
  seconds: float = 0.0
  @property
  def fire_rate(self) -> float: return self.fired / self.examples if self.examples else 0.0
  @property
  def untested(self) -> bool: return self.sound and self.fired == 0
  @property
  def ok(self) -> bool: return self.sound and self.fired > 0   # a rule that never fired was not checked at all
  @property
  def status(self) -> str: return "ok" if self.ok else "UNTESTED" if self.untested else "UNSOUND"
  def __str__(self) -> str:
    head = f"{self.rule}: {self.status} on {self.examples} graphs (fired on {self.fired}, {self.matches} matches) in {self.seconds:.1f}s"
    if self.sound: return head + ("  (the rule never matched: nothing was checked)" if self.untested else "")
    return f"{head}\n  problem: {self.problem}\n  counterexample (shrunk):\n" + "\n".join("    " + l for l in self.counterexample.splitlines())

@dataclass
class CheckReport:
  """Results of checking several rules, by rule name."""
  results: dict[str, CheckResult] = field(default_factory=dict)
  @property
  def ok(self) -> bool: return all(r.ok for r in self.results.values())
  def __getitem__(self, name: str) -> CheckResult: return self.results[name]
  def __iter__(self): return iter(self.results.values())
  def __str__(self) -> str: return "\n".join(map(str, self.results.values()))

@contextlib.contextmanager
def _registered(rules: list[Rule]):
  """Rules that are not in the registry (a candidate under test) are registered for the duration of the check."""
  added = [r for r in rules if RULES.get(r.name) is not r]
  for r in added: validate(r)
  saved = {r.name: RULES.get(r.name) for r in added}
  for r in added: RULES[r.name] = r
  try: yield
  finally:
    for n, old in saved.items():
      if old is None: RULES.pop(n, None)
      else: RULES[n] = old

def _resolve(rule_or_ruleset) -> list[Rule]:
  if rule_or_ruleset is None: return list(RULES.values())
  if isinstance(rule_or_ruleset, Rule): return [rule_or_ruleset]
  if isinstance(rule_or_ruleset, str):
    if rule_or_ruleset in PHASES: return [r for r in RULES.values() if r.phase == rule_or_ruleset]
    if rule_or_ruleset not in RULES: raise CallsatError(f"check: unknown rule {rule_or_ruleset!r}; known: {sorted(RULES)}")
    return [RULES[rule_or_ruleset]]
  out = []
  for x in rule_or_ruleset: out += _resolve(x)
  return list({r.name: r for r in out}.values())

_OP_PLANTER = {"CONTIGUOUS": "materialize_contiguous", "DETACH": "drop_detach", "CONTIGUOUS_BACKWARD": "drop_contiguous_backward",
               "AFTER": "materialize_assign", "RESHAPE": "storage_through_reshape"}

def planter_for(rule: Rule) -> str:
  """Which left-side generator to use: the rule's own, or one keyed by the first op its query matches."""
  if rule.name in PLANTED: return rule.name
  m = re.search(r'"([A-Z_]+)"', rule.query)
  return _OP_PLANTER.get(m.group(1), "") if m else ""

def check(rule_or_ruleset=None, examples: int | None = None, seed: int | None = 0, max_steps: int = 6,
          storages: int = 2) -> CheckResult | CheckReport:
  """Check one rule (a Rule or a name: returns a CheckResult) or several (a list, a phase name, None = all: returns a
  CheckReport). `examples` graphs per rule (default: CALLSAT_CHECK_EXAMPLES or 200); `seed` fixes hypothesis' draws
  (None: random)."""
  hypothesis_strategies()   # raise the install hint before anything else
  single = isinstance(rule_or_ruleset, (Rule, str)) and rule_or_ruleset not in PHASES
  rules = _resolve(rule_or_ruleset)
  n = examples_from_env() if examples is None else examples
  with _registered(rules):
    report = CheckReport({r.name: _check_one(r, n, seed, max_steps, storages) for r in rules})
  return report[rules[0].name] if single else report

def _check_one(rule: Rule, examples: int, seed, max_steps: int, storages: int) -> CheckResult:
  from hypothesis import given, settings, HealthCheck, seed as hseed
  res = CheckResult(rule.name)
  rules = (rule.name,) if rule.phase == "optimize" else ()
  failing: list = []
  strategy = rule_graphs(planter_for(rule), max_steps=max_steps)

  def prop(g):
    try: violations, matches = check_egraph(g.roots, g.storage, rules, storages=storages, structure=rule.name)
    except EngineError as e:   # the bad-merge canary
      failing[:] = [g, str(e)]; raise AssertionError(str(e)) from None
    if not failing:
      res.examples += 1
      res.fired += matches.get(rule.name, 0) > 0
      res.matches += matches.get(rule.name, 0)
    if violations:
      failing[:] = [g, str(violations[0]).split("\n", 1)[0] + "\n  " + "\n  ".join(str(violations[0]).splitlines()[2:])]
      raise AssertionError(failing[1])

  test = settings(max_examples=examples, deadline=None, database=None, print_blob=False,
                  suppress_health_check=list(HealthCheck))(given(strategy)(prop))
  if seed is not None: test = hseed(seed)(test)
  t0 = time.perf_counter()
  try: test()
  except AssertionError:
    g, problem = failing       # hypothesis replays the shrunk example last, so this is the minimal one
    res.sound, res.problem, res.counterexample = False, problem, g.render()
  res.seconds = time.perf_counter() - t0
  return res
