"""Rules as data: every rule has a name, a one-line doc, a phase and its egglog text (query, then actions)."""
from __future__ import annotations
from dataclasses import dataclass

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

def register(*rules: Rule) -> None:
  for r in rules:
    if r.phase not in PHASES: raise ValueError(f"rule {r.name}: unknown phase {r.phase!r}")
    if r.name in RULES: raise ValueError(f"rule {r.name} registered twice")
    RULES[r.name] = r

def rules_in(phase: str) -> list[Rule]: return [r for r in RULES.values() if r.phase == phase]
