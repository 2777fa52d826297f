"""The house on floors: every project import (function-local ones included, TYPE_CHECKING ones not) goes to the same
floor or one below, no module cycle anywhere, no private name crosses a module, and the package faces load lazily.
The floors are written down once, here; notes/design.md draws them."""
import ast, os, subprocess, sys
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("egraph", "rules", "lower")

# floor -> (name, folder or module prefixes). A module may import only from its own floor or below; its floor is that of
# the longest prefix naming it (rules/ is rule data, rules/testing/ the research kit).
FLOORS = {
  1: ("IR", ["egraph.ir"]),
  2: ("rule data", ["rules"]),
  3: ("engine", ["egraph.engine", "egraph.fusion"]),
  4: ("lowering", ["lower"]),
  5: ("research kit", ["rules.testing"]),
  6: ("front ends and tools", ["egraph.frontend", "egraph.bridge", "egraph.tools", "egraph.tinygrad", "egraph.__main__"]),
}
FACES = PACKAGES   # the package __init__s: lazy re-exports through egraph.ir.face only

def modules() -> dict[str, str]:
  """Every module of the packages, subfolders included (a folder's __init__ is the folder's dotted name)."""
  out = {}
  for p in PACKAGES:
    for d, dirs, files in os.walk(os.path.join(ROOT, p)):
      dirs[:] = sorted(x for x in dirs if x != "__pycache__")
      pkg = os.path.relpath(d, ROOT).replace(os.sep, ".")
      for f in sorted(files):
        if f.endswith(".py"): out[pkg if f == "__init__.py" else f"{pkg}.{f[:-3]}"] = os.path.join(d, f)
  return out

def floor_of(mod: str) -> int | None:
  best = max(((len(pre), fl) for fl, (_, pres) in FLOORS.items() for pre in pres if mod == pre or mod.startswith(pre + ".")),
             default=None)
  return None if best is None else best[1]

def _type_checking_nodes(tree) -> set[int]:
  ids = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
      for stmt in node.body: ids.update(id(n) for n in ast.walk(stmt))
  return ids

def _resolve(name: str, mods: dict) -> str | None:
  parts = name.split(".")
  while parts:
    if ".".join(parts) in mods: return ".".join(parts)
    parts.pop()
  return None

class Imports:
  """Per module: project edges (target, line, function-local?, names imported) read from the AST."""
  def __init__(self):
    self.mods = modules()
    self.edges: dict[str, list[tuple[str, int, bool, list[str]]]] = {m: [] for m in self.mods}
    self.trees = {}
    for m, path in self.mods.items():
      tree = self.trees[m] = ast.parse(open(path).read(), path)
      skip = _type_checking_nodes(tree)
      local = set()
      for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
          local.update(id(n) for n in ast.walk(fn) if n is not fn)
      for node in ast.walk(tree):
        if id(node) in skip: continue
        if isinstance(node, ast.Import):
          for a in node.names:
            if (t := _resolve(a.name, self.mods)) and t != m: self.edges[m].append((t, node.lineno, id(node) in local, []))
        elif isinstance(node, ast.ImportFrom):
          base = node.module or ""
          if node.level:
            pkg = m if self.mods[m].endswith("__init__.py") else m.rsplit(".", 1)[0]
            base = pkg + ("." + base if base else "")
          for a in node.names:
            sub = _resolve(f"{base}.{a.name}", self.mods)
            if sub and sub != base and sub.startswith(base + "."):   # `from pkg import submodule`
              if sub != m: self.edges[m].append((sub, node.lineno, id(node) in local, []))
            elif (t := _resolve(base, self.mods)) and t != m:
              self.edges[m].append((t, node.lineno, id(node) in local, [a.name]))

  def graph(self) -> dict[str, set[str]]: return {m: {e[0] for e in es} for m, es in self.edges.items()}

def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan, iterative)."""
  index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
  for root in graph:
    if root in index: continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
    while work:
      v, it = work[-1]
      w = next(it, None)
      if w is not None:
        if w not in index:
          index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
          work.append((w, iter(sorted(graph.get(w, ())))))
        elif w in on: low[v] = min(low[v], index[w])
        continue
      work.pop()
      if work: low[work[-1][0]] = min(low[work[-1][0]], low[v])
      if low[v] == index[v]:
        comp = []
        while True:
          x = stack.pop(); on.discard(x); comp.append(x)
          if x == v: break
        if len(comp) > 1: out.append(sorted(comp))
  return out

@pytest.fixture(scope="module")
def imports(): return Imports()

def test_every_module_has_a_floor(imports):
  missing = [m for m in imports.mods if m not in FACES and floor_of(m) is None]
  assert missing == [], f"modules with no floor in tests/test_floors.py: {missing}"

def test_no_import_cycle(imports):
  assert cycles(imports.graph()) == []

def test_imports_flow_down(imports):
  bad = []
  for m, es in imports.edges.items():
    if m in FACES: continue
    for t, line, _, _ in es:
      if t in FACES: bad.append(f"{m}:{line} imports the package face {t!r}; import the submodule instead"); continue
      if floor_of(t) > floor_of(m): bad.append(f"{m} (floor {floor_of(m)}):{line} imports {t} (floor {floor_of(t)})")
  assert bad == []

def test_faces_are_lazy(imports):
  bad = [f"{m}:{line} imports {t}" for m in FACES for t, line, _, _ in imports.edges[m] if t != "egraph.ir.face"]
  assert bad == [], "package __init__s re-export through a module __getattr__, not import statements"

def test_no_function_local_project_import(imports):
  bad = [f"{m}:{line} imports {t}" for m, es in imports.edges.items() for t, line, local, _ in es if local]
  assert bad == []

def test_no_private_name_crosses_a_module(imports):
  bad = []
  for m, es in imports.edges.items():
    bad += [f"{m}:{line} imports {t}.{n}" for t, line, _, names in es for n in names if n.startswith("_")]
    bound = {a.asname or a.name.split(".")[-1] for node in ast.walk(imports.trees[m])
             if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names
             if _resolve((node.module + "." if isinstance(node, ast.ImportFrom) and node.module else "") + a.name, imports.mods)
             or (isinstance(node, ast.ImportFrom) and node.module and _resolve(node.module, imports.mods))}
    for node in ast.walk(imports.trees[m]):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
          and node.attr.startswith("_") and not node.attr.startswith("__")):
        bad.append(f"{m}:{node.lineno} reads {node.value.id}.{node.attr}")
  assert bad == []

def test_the_checker_finds_what_it_should():
  """The graph checks themselves: a planted cycle and upward edge are seen."""
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []
  assert floor_of("lower.anything") == 4 and floor_of("egraph.ir.ops") == 1 and floor_of("egraph.nope") is None

def _loaded_after(code: str) -> set[str]:
  out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                       cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  return set(out)

def test_the_ir_floor_loads_no_engine():
  mods = _loaded_after("import egraph.ir.ops, egraph.ir.storage")
  assert not {"egglog", "rules", "lower", "egraph.engine.driver", "egraph.frontend.tensor", "llvmlite"} & mods

def test_the_rule_data_loads_no_checker():
  mods = _loaded_after("import egraph.engine.runner")
  assert "rules.registry" in mods and not {"rules.testing.checker", "rules.testing.strategies", "hypothesis", "lower"} & mods

def test_the_kernel_ir_loads_no_engine():
  mods = _loaded_after("import lower.schedule.kernel")
  assert not {"egglog", "rules", "egraph.engine.driver", "egraph.frontend.tensor"} & mods

def test_public_face():
  import egraph, rules, lower
  import rules.testing.checker, egraph.engine.driver, egraph.frontend.tracing, egraph.ir.dtype
  assert rules.check is rules.testing.checker.check and callable(rules.check)
  assert egraph.callify is egraph.engine.driver.callify and egraph.function is egraph.frontend.tracing.function
  assert egraph.dtypes is egraph.ir.dtype.dtypes
  assert lower.run_call is not None and callable(lower.run_call)
  with pytest.raises(AttributeError, match="no_such_name"): egraph.no_such_name
