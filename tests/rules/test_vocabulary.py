"""The rule vocabulary is one table (rules/vocabulary.py): the egglog declarations and lift rules are generated from it,
every relation is used by a rule, and every row the encoder writes is declared."""
import egglog.bindings as eb
import rules.callify  # noqa: F401  (registers the rules)
from rules.registry import RULES, Rule, validate
from rules.vocabulary import TERMS, RELATIONS, ARITY, FACTS
from egraph.engine.language import program
from egraph.engine.encode import encode
from egraph.frontend.tensor import Tensor
import pytest

def test_every_relation_is_queried_by_a_rule():
  text = " ".join(r.query for r in RULES.values())
  for rel in RELATIONS: assert f"({rel.name} " in text, rel.name

def test_the_encoder_writes_only_declared_rows():
  a = Tensor.ones(4, 4).contiguous().realize()
  enc = encode([((a + 1).reshape(16).contiguous()[2:6].contiguous()).node])
  declared = {t.row for t in TERMS if t.row} | {r.row for r in RELATIONS}
  assert set(enc.rows) <= declared and {"leaf_row", "un_row", "bin_row", "fresh_row", "storage_row"} <= set(enc.rows)

def test_lift_rules_turn_rows_into_terms_and_facts():
  g = eb.EGraph()
  g.run_program(*g.parse_program(program([])))
  g.run_program(*g.parse_program('(leaf_row 1 "BUFFER" 7) (un_row 2 "CONTIGUOUS" 0 1) (fresh_row 2 1) (storage_row 1) '
                                 '(run-schedule (saturate (run load))) (check (= (N 2) (U "CONTIGUOUS" 0 (L "BUFFER" 7)))) '
                                 '(check (fresh (U "CONTIGUOUS" 0 (L "BUFFER" 7)) (L "BUFFER" 7))) (check (storage (N 1)))'))

def test_arity_checks_read_the_table():
  assert ARITY["copy_into"] == 2 and ARITY["U"] == 3 and set(FACTS) == {r.name for r in RELATIONS if "T" in r.args}
  with pytest.raises(ValueError, match=r"\(copy_into \.\.\.\) takes 2 arguments, got 1"):
    validate(Rule("bad", "a wrong arity", "optimize", "(copy_into u)", "(union u u)"))
  with pytest.raises(ValueError, match="unknown constructor or relation 'copy_onto'"):
    validate(Rule("bad", "an unknown relation", "optimize", "(copy_onto u k)", "(union u k)"))
