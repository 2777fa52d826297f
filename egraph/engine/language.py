"""The egglog program: one sort T for tensor terms, generic constructors by arity, input relations for bulk loading,
fact relations, and the rules from the `rules` registry. Args are i64 ids into a Python-side intern table."""
import rules.callify  # noqa: F401  (registers the callify rules into RULES)
from rules.registry import RULES, PHASES

DECLARATIONS = """
(sort T)
(constructor N (i64) T :unextractable)
(constructor L (String i64) T)
(constructor U (String i64 T) T)
(constructor B (String i64 T T) T)
(constructor R (String i64 T T T) T)
(constructor V (String i64 T) T)
(constructor Cons (T T) T)
(constructor Nil () T)
(relation leaf_row (i64 String i64))
(relation un_row (i64 String i64 i64))
(relation bin_row (i64 String i64 i64 i64))
(relation ter_row (i64 String i64 i64 i64 i64))
(relation var_row (i64 String i64 i64))
(relation cons_row (i64 i64 i64))
(relation nil_row (i64))
(relation fresh_row (i64 i64))
(relation view_row (i64 i64))
(relation storage_row (i64))
(relation zero_row (i64))
(relation copy_into_row (i64 i64))
(relation precompiled_row (i64 i64))
(relation computed_arg (i64))
(relation candidate_row (i64 i64))
(relation fresh (T T))
(relation view (T T))
(relation storage (T))
(relation zero (T))
(relation copy_into (T T))
(relation precompiled (T T))
(relation candidate (T T))
"""

LIFT_RULES = """
(rule ((leaf_row i op a)) ((union (N i) (L op a))) :ruleset load :name "lift_leaf")
(rule ((un_row i op a x)) ((union (N i) (U op a (N x)))) :ruleset load :name "lift_unary")
(rule ((bin_row i op a x y)) ((union (N i) (B op a (N x) (N y)))) :ruleset load :name "lift_binary")
(rule ((ter_row i op a x y z)) ((union (N i) (R op a (N x) (N y) (N z)))) :ruleset load :name "lift_ternary")
(rule ((var_row i op a l)) ((union (N i) (V op a (N l)))) :ruleset load :name "lift_variadic")
(rule ((cons_row i h t)) ((union (N i) (Cons (N h) (N t)))) :ruleset load :name "lift_cons")
(rule ((nil_row i)) ((union (N i) (Nil))) :ruleset load :name "lift_nil")
(rule ((fresh_row c f)) ((fresh (N c) (N f))) :ruleset load :name "lift_fresh")
(rule ((view_row x s)) ((view (N x) (N s))) :ruleset load :name "lift_view")
(rule ((storage_row x)) ((storage (N x))) :ruleset load :name "lift_storage")
(rule ((zero_row x)) ((zero (N x))) :ruleset load :name "lift_zero")
(rule ((copy_into_row u k)) ((copy_into (N u) (N k))) :ruleset load :name "lift_copy_into")
(rule ((precompiled_row g r)) ((precompiled (N g) (N r))) :ruleset load :name "lift_precompiled")
(rule ((candidate_row x f)) ((candidate (N x) (N f))) :ruleset load :name "lift_candidate")
"""
CONSTRUCTORS = ("L", "U", "B", "R", "V", "Cons", "Nil")

def program(rules=None) -> str:
  """The whole egglog prelude: declarations, rulesets, lift rules and the selected callify rules."""
  rules = list(RULES.values()) if rules is None else rules
  return "\n".join([DECLARATIONS, *(f"(ruleset {p})" for p in PHASES), LIFT_RULES, *(r.egglog() for r in rules)])
