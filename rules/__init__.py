"""Named callify rule sets (a registry of Rule records) and, later, the soundness checker."""
from rules.registry import Rule, RULES, PHASES, register, rules_in
import rules.callify  # noqa: F401  (registers the callify rules)
