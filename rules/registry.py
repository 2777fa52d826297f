"""Rules as data: every rule has a name, a one-line doc, a phase and its egglog text (query, then actions)."""
from __future__ import annotations
import re
from dataclasses import dataclass
from egraph.ir.ops import Ops
from rules.vocabulary import ARITY, OP_TERMS

PHASES = ("load", "materialize", "optimize")

@dataclass(frozen=True)
class Rule:
  name: str
  doc: str
  phase: str          # 'load' lifts inserted rows; 'materialize' builds the all-stored baseline; 'optimize' finds cheaper forms
  query: str          # egglog facts
  actions: str        # egglog actions
  lhs: str = ""       # the matched term a destructive (pattern-matcher style) application subsumes; "" = none
  def egglog(self, ruleset: str | None = None, destructive: bool = False, name: str | None = None) -> str:
    acts = self.actions + (f" (subsume {self.lhs})" if destructive and self.lhs else "")
    return f'(rule ({self.query}) ({acts}) :ruleset {ruleset or self.phase} :name "{name or self.name}")'

RULES: dict[str, Rule] = {}

# beside rules/vocabulary.py's constructors and relations, egglog's own commands: a rule naming anything else would be an
# egglog error at best, a rule that silently never fires at worst
BUILTINS = {"=", "!=", "union", "subsume", "delete", "set", "let", "panic"}
_OP_NAMES = {t.name for t in OP_TERMS}
_ATOM = re.compile(r'"[^"]*"|[()]|[^\s()"]+')

def _calls(text: str):
  """(head, argument count, first argument) of every parenthesized form in an egglog text."""
  stack: list[list] = []
  for tok in _ATOM.findall(text):
    if tok == "(": stack.append([])
    elif tok == ")":
      if not stack: raise ValueError("unbalanced ')'")
      form = stack.pop()
      if form: yield form[0], len(form) - 1, form[1] if len(form) > 1 else None
      if stack: stack[-1].append(form)
    elif stack: stack[-1].append(tok)
  if stack: raise ValueError("unbalanced '('")

def validate(r: Rule) -> None:
  """Refuse a rule that names an unknown op, constructor or relation, or uses one with the wrong arity."""
  if r.phase not in PHASES: raise ValueError(f"rule {r.name}: unknown phase {r.phase!r}")
  for part in (r.query, r.actions, r.lhs):
    try: forms = list(_calls(part))
    except ValueError as e: raise ValueError(f"rule {r.name}: {e} in {part!r}") from None
    for head, n, first in forms:
      if isinstance(head, list): raise ValueError(f"rule {r.name}: a form with no head in {part!r}")
      want = ARITY.get(head)
      if want is None and head not in BUILTINS: raise ValueError(f"rule {r.name}: unknown constructor or relation {head!r}")
      if want is not None and n != want: raise ValueError(f"rule {r.name}: ({head} ...) takes {want} arguments, got {n}")
      if head in _OP_NAMES and isinstance(first, str) and first.startswith('"') and first.strip('"') not in Ops.__members__:
        raise ValueError(f"rule {r.name}: unknown op {first}")

def register(*rules: Rule) -> None:
  for r in rules:
    validate(r)
    if r.phase not in PHASES: raise ValueError(f"rule {r.name}: unknown phase {r.phase!r}")
    if r.name in RULES: raise ValueError(f"rule {r.name} registered twice")
    RULES[r.name] = r

def rules_in(phase: str) -> list[Rule]: return [r for r in RULES.values() if r.phase == phase]
