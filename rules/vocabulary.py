"""Floor 2 (rule data): the rule vocabulary, written once. Every constructor of the tensor sort T and every fact relation,
with its egglog signature and the input row it is loaded from. The engine's declarations and lift rules are generated
from these tables (egraph/engine/language.py), the rule checker reads their arities (rules/registry.py), and the tools
read their names (explain, export): adding a relation is one line here plus the code that inserts its rows."""
from __future__ import annotations
from dataclasses import dataclass

@dataclass(frozen=True)
class Term:
  """A constructor of sort T. `row` is the i64 input relation that inserts it (T children come in as ids, lifted by
  `(N id)`); `lift` names the rule that lifts a row into the term."""
  name: str
  args: tuple[str, ...]   # egglog sorts: "String", "i64", or "T"
  row: str | None = None
  lift: str | None = None
  extractable: bool = True

@dataclass(frozen=True)
class Relation:
  """A fact relation rules query. A lifted one is inserted as the i64 row `<name>_row` and lifted to terms by
  `lift_<name>`; one whose args are all i64 is inserted directly."""
  name: str
  args: tuple[str, ...]
  doc: str
  @property
  def lifted(self) -> bool: return "T" in self.args
  @property
  def row(self) -> str: return f"{self.name}_row" if self.lifted else self.name

# (N id) is the handle of an inserted node; the others carry (op name, arg id, children...)
TERMS: tuple[Term, ...] = (
  Term("N", ("i64",), extractable=False),
  Term("L", ("String", "i64"), "leaf_row", "lift_leaf"),
  Term("U", ("String", "i64", "T"), "un_row", "lift_unary"),
  Term("B", ("String", "i64", "T", "T"), "bin_row", "lift_binary"),
  Term("R", ("String", "i64", "T", "T", "T"), "ter_row", "lift_ternary"),
  Term("V", ("String", "i64", "T"), "var_row", "lift_variadic"),   # a variadic node: its children as a Cons list
  Term("Cons", ("T", "T"), "cons_row", "lift_cons"),
  Term("Nil", (), "nil_row", "lift_nil"),
)

RELATIONS: tuple[Relation, ...] = (
  Relation("fresh", ("T", "T"), "a realize point and the fresh buffer the materialize rules store it in"),
  Relation("view", ("T", "T"), "a value and the zero-copy view of storage that equals it"),
  Relation("storage", ("T",), "a node with buffer identity (BUFFER, PARAM, a view of one)"),
  Relation("zero", ("T",), "a realize point with no elements: it needs no buffer"),
  Relation("copy_into", ("T", "T"), "an assign whose CONTIGUOUS value may be written in place"),
  Relation("precompiled", ("T", "T"), "a GETTUPLE of a precompiled CALL and its AFTER form"),
  Relation("computed_arg", ("i64",), "an AFTER's arg id marking an assign into a computed value"),
  Relation("candidate", ("T", "T"), "a fusion candidate and the fresh buffer cost fusion may store it in"),
)

EXTRACTABLE = tuple(t.name for t in TERMS if t.extractable)   # the constructors an extracted term is built of
TERM_ROWS = {t.row: t for t in TERMS if t.row}                  # input row -> the term it inserts
ARITY = {**{t.name: len(t.args) for t in TERMS}, **{r.name: len(r.args) for r in RELATIONS}}
FACTS = tuple(r.name for r in RELATIONS if r.lifted)            # the facts that hold of e-classes
OP_TERMS = tuple(t for t in TERMS if t.args[:1] == ("String",))  # the terms of one IR node: (op, arg id, children)
