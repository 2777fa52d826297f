"""The egglog program: one sort T for tensor terms, generic constructors by arity, input relations for bulk loading,
fact relations (all generated from rules/vocabulary.py's tables), and the rules from the `rules`
registry. Args are i64 ids into a Python-side intern table."""
import rules.callify  # noqa: F401  (registers the callify rules into RULES)
from rules.registry import RULES, PHASES
from rules.vocabulary import TERMS, RELATIONS

def _sorts(args) -> str: return " ".join(args)

def _row_decl(name: str, args, keyed: bool) -> str:
  """The i64 input row that inserts a term (`keyed`: its node id first) or a fact: T children arrive as node ids."""
  return f"(relation {name} ({_sorts(['i64'] * keyed + ['i64' if a == 'T' else a for a in args])}))"

def _lift(row: str, head: str, args, lhs: str | None, name: str) -> str:
  """The load rule that turns one input row into a term (`lhs` its id) or a fact."""
  vs = [f"x{k}" for k in range(len(args))]
  body = " ".join(f"(N {v})" if a == "T" else v for v, a in zip(vs, args))
  term = f"({head}{' ' + body if body else ''})"
  action = f"(union (N {lhs}) {term})" if lhs else term
  return f'(rule (({row} {" ".join(([lhs] if lhs else []) + vs)})) ({action}) :ruleset load :name "{name}")'

DECLARATIONS = "\n".join([
  "(sort T)",
  *(f"(constructor {t.name} ({_sorts(t.args)}) T{'' if t.extractable else ' :unextractable'})" for t in TERMS),
  *(_row_decl(t.row, t.args, True) for t in TERMS if t.row),
  *(_row_decl(r.row, r.args, False) for r in RELATIONS if r.lifted),
  *(f"(relation {r.name} ({_sorts(r.args)}))" for r in RELATIONS)])

LIFT_RULES = "\n".join([*(_lift(t.row, t.name, t.args, "i", t.lift) for t in TERMS if t.row),
                        *(_lift(r.row, r.name, r.args, None, f"lift_{r.name}") for r in RELATIONS if r.lifted)])
def program(rules=None) -> str:
  """The whole egglog prelude: declarations, rulesets, lift rules and the selected callify rules."""
  rules = list(RULES.values()) if rules is None else rules
  return "\n".join([DECLARATIONS, *(f"(ruleset {p})" for p in PHASES), LIFT_RULES, *(r.egglog() for r in rules)])
