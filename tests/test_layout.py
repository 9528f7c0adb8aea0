"""The package's shape, read from the source (nothing is imported): no import cycle; the two project packages (r1/,
studies/ablations/) reached from outside only through their entry points; no `module.name` reference to a name the
module does not define; docs/architecture.md's module map equal to the tree; only real paths in the docs; and
optional-package skips that fail under CI=true."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "grpo_jax")

# Who outside them may import r1/ and studies/ablations/ (every other module is generic and must not):
ENTRY_POINTS = {
    "grpo_jax.r1": {
        "grpo_jax.run.jobs",                     # job=r1_pipeline: its checks, stage list and run
        "grpo_jax.studies.sweep",                # a sweep of job=r1_pipeline runs writes r1/seeds_report.py
        "grpo_jax.studies.ablations.r1_table",   # the ablation table over an R1 RL stage's variants
    },
    "grpo_jax.studies.ablations": set(),         # studies/ablate.py loads a table by name (importlib), not by import
}


def modules(pkg_dir: str = PKG) -> dict[str, str]:
  """{dotted module name: path} of every .py file under grpo_jax/ (a package is its __init__)."""
  out = {}
  for d, _, files in os.walk(pkg_dir):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(d, f), os.path.dirname(pkg_dir))[:-3].split(os.sep)
        out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(d, f)
  return out


def imports(path: str, name: str, known: dict[str, str]) -> dict[str, int]:
  """{imported grpo_jax module: first line} for every import in the file, module-level and function-local alike
  (a cycle through a lazy import is still a cycle). `from pkg import mod` counts as importing `pkg.mod`."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
  out: dict[str, int] = {}

  def add(target: str, line: int) -> None:
    while target and target not in known:  # `import grpo_jax.a.b.func`-style names resolve to their module
      target = target.rpartition(".")[0]
    if target and target != name and target.startswith("grpo_jax"):
      out.setdefault(target, line)

  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        add(a.name, node.lineno)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      for a in node.names:
        sub = f"{base}.{a.name}"
        add(sub if sub in known else base, node.lineno)
  return out


def graph(pkg_dir: str = PKG) -> dict[str, dict[str, int]]:
  known = modules(pkg_dir)
  return {m: imports(p, m, known) for m, p in known.items()}


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan), each sorted."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in g.get(v, {}):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(g):
    if v not in index:
      visit(v)
  return out


def _within(module: str, pkg: str) -> bool:
  return module == pkg or module.startswith(pkg + ".")


def entry_violations(g: dict[str, dict[str, int]]) -> list[str]:
  out = []
  for m, deps in sorted(g.items()):
    for target, line in sorted(deps.items()):
      for pkg, allowed in ENTRY_POINTS.items():
        if _within(target, pkg) and not _within(m, pkg) and m not in allowed:
          out.append(f"{m} (line {line}) imports {target}")
  return out


def defined_names(path: str) -> set[str]:
  """The names a module defines at its top level (functions, classes, assignments, imports; also inside top-level
  if/try/with blocks)."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  out = set()
  for top in tree.body:
    nodes = ast.walk(top) if isinstance(top, (ast.If, ast.Try, ast.With)) else [top]
    for n in nodes:
      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.add(n.name)
      elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        for target in (n.targets if isinstance(n, ast.Assign) else [n.target]):
          out.update(x.id for x in ast.walk(target) if isinstance(x, ast.Name))
      elif isinstance(n, (ast.Import, ast.ImportFrom)):
        out.update((a.asname or a.name).split(".")[0] for a in n.names)
  return out


def dangling_attributes(paths, known: dict[str, str]) -> list[str]:
  """`alias.name` uses, where `alias` is an imported grpo_jax module, of names that module does not define: what a
  move leaves behind (a caller of a function that moved to another module)."""
  defined: dict[str, set[str]] = {}
  out = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    alias = {}
    for n in ast.walk(tree):
      if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("grpo_jax") and not n.level:
        alias.update({a.asname or a.name: f"{n.module}.{a.name}" for a in n.names if f"{n.module}.{a.name}" in known})
      elif isinstance(n, ast.Import):
        alias.update({a.asname: a.name for a in n.names if a.asname and a.name in known})
    for n in ast.walk(tree):
      if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in alias
          and not n.attr.startswith("__")):
        target = known[alias[n.value.id]]
        if target.endswith("__init__.py"):
          continue
        if target not in defined:
          defined[target] = defined_names(target)
        if n.attr not in defined[target]:
          out.append(f"{os.path.relpath(path, ROOT)}:{n.lineno} {n.value.id}.{n.attr} ({alias[n.value.id]})")
  return out


def test_no_import_cycle():
  found = cycles(graph())
  assert not found, "import cycles (module-level or function-local imports): " + "; ".join(
      " <-> ".join(c) for c in found)


def test_r1_and_ablations_only_through_entry_points():
  bad = entry_violations(graph())
  assert not bad, "generic code imports a project package (allowed: test_layout.ENTRY_POINTS): " + "; ".join(bad)


def test_entry_points_exist():
  """An allow-list entry for a module that is gone would silently allow nothing."""
  known = modules()
  for allowed in ENTRY_POINTS.values():
    assert allowed <= set(known), sorted(allowed - set(known))


@pytest.fixture
def toy_pkg(tmp_path):
  """A throwaway grpo_jax/ tree for checking that the graph reader sees what it must."""
  def make(files: dict[str, str]):
    root = tmp_path / "grpo_jax"
    for rel, text in {"__init__.py": "", **files}.items():
      p = root / rel
      p.parent.mkdir(parents=True, exist_ok=True)
      p.write_text(text)
    return str(root)
  return make


def test_graph_sees_function_local_and_relative_imports(toy_pkg):
  d = toy_pkg({"a/__init__.py": "", "a/x.py": "from grpo_jax.b import y\n",
               "b/__init__.py": "", "b/y.py": "def f():\n  from ..a import x  # lazy\n  return x\n",
               "c.py": "import grpo_jax.a.x\nimport numpy\n"})
  g = graph(d)
  assert g["grpo_jax.a.x"] == {"grpo_jax.b.y": 1}
  assert g["grpo_jax.b.y"] == {"grpo_jax.a.x": 2}
  assert g["grpo_jax.c"] == {"grpo_jax.a.x": 1}
  assert cycles(g) == [["grpo_jax.a.x", "grpo_jax.b.y"]]


def test_entry_rule_flags_generic_importers(toy_pkg):
  d = toy_pkg({"r1/__init__.py": "", "r1/pipeline.py": "from grpo_jax.run import train\n",
               "run/__init__.py": "", "run/train.py": "", "run/jobs.py": "from grpo_jax.r1 import pipeline\n",
               "run/evaluation.py": "def f():\n  from grpo_jax.r1 import pipeline\n"})
  assert entry_violations(graph(d)) == ["grpo_jax.run.evaluation (line 2) imports grpo_jax.r1.pipeline"]


def test_optional_package_skips_fail_under_ci(monkeypatch):
  """conftest.requires skips a test whose optional package is missing, and fails it under CI=true; no test file
  skips on a package's presence any other way (a bare skipif would go silent on a CI without the package)."""
  import conftest

  def fn():
    pass
  monkeypatch.delenv("CI", raising=False)
  assert conftest.requires("no_such_package_r2", "why")(fn).pytestmark[0].name == "skip"
  monkeypatch.setenv("CI", "true")
  with pytest.raises(pytest.fail.Exception, match="no_such_package_r2 is missing under CI=true"):
    conftest.requires("no_such_package_r2", "why")(fn)()
  assert conftest.requires("os", "why")(fn) is fn
  tests_dir = os.path.dirname(os.path.abspath(__file__))
  for name in sorted(os.listdir(tests_dir)):
    if name.endswith(".py") and name != "conftest.py":
      with open(os.path.join(tests_dir, name), encoding="utf-8") as f:
        text = f.read()
      assert not re.search(r"skipif\([^)]*find_spec", text), f"{name}: skipif on a package; use conftest.requires"


def test_module_attributes_exist():
  """Every `module.name` reference from the package, its tests, benchmarks and configs to a grpo_jax module names
  something that module defines (cheap, static: catches a caller left behind by a move, in code no test runs)."""
  paths = []
  for top in ("grpo_jax", "tests", "benchmarks", "configs", "launch"):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
      paths += [os.path.join(d, f) for f in files if f.endswith(".py")]
  bad = dangling_attributes(sorted(paths), modules())
  assert not bad, "references to names their module does not define: " + "; ".join(bad)


def test_dangling_attribute_reader_sees_a_moved_function(toy_pkg, tmp_path):
  d = toy_pkg({"a.py": "def f():\n  pass\nX = 1\n", "b.py": "from grpo_jax import a as a_lib\na_lib.f()\na_lib.g()\n"})
  known = modules(d)
  assert [x.split(" ", 1)[1] for x in dangling_attributes([known["grpo_jax.b"]], known)] == ["a_lib.g (grpo_jax.a)"]


# ------------------------------------------------------------------------------------------- docs against the tree


def mapped_modules(text: str) -> list[str]:
  """The module paths docs/architecture.md's map lists: the ``` block that starts with `grpo_jax/`. An entry line is
  indented two spaces per folder level and starts with `name/` or `a.py[, b.py ...]`; lines indented to the
  description column (22) continue the line above."""
  block = text.split("```\ngrpo_jax/\n", 1)[1].split("```", 1)[0]
  out, folders = [], []
  for line in block.splitlines():
    indent = len(line) - len(line.lstrip(" "))
    if not line.strip() or indent >= 22:
      continue
    depth = indent // 2
    folders = folders[:depth - 1]
    first = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
    if first.endswith("/"):
      folders.append(first[:-1])
      continue
    for name in (n.strip() for n in first.split(",")):
      assert re.fullmatch(r"\w+\.py", name), f"map entry {line.strip()!r}: not a module or folder"
      out.append("/".join(["grpo_jax", *folders, name]))
  return out


def test_architecture_map_is_the_tree():
  with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
    listed = mapped_modules(f.read())
  tree = sorted(os.path.relpath(p, ROOT) for p in modules().values() if not p.endswith("__init__.py"))
  assert len(listed) == len(set(listed)), "listed twice: " + str(sorted({m for m in listed if listed.count(m) > 1}))
  assert not set(tree) - set(listed), "modules docs/architecture.md's map does not list: " + str(
      sorted(set(tree) - set(listed)))
  assert not set(listed) - set(tree), "listed in docs/architecture.md's map, not in the tree: " + str(
      sorted(set(listed) - set(tree)))


def test_map_reader_on_a_hand_case():
  text = ("x\n```\ngrpo_jax/\n  main.py             cli\n  a.py, b.py\n                      both\n  pkg/\n"
          "    c.py            c (see d.py)\n    sub/            s\n      d.py          d\n  e.py              e\n```\n")
  assert mapped_modules(text) == ["grpo_jax/main.py", "grpo_jax/a.py", "grpo_jax/b.py", "grpo_jax/pkg/c.py",
                                  "grpo_jax/pkg/sub/d.py", "grpo_jax/e.py"]


def test_doc_paths_exist():
  """Every repository path README.md and docs/*.md name (grpo_jax/…py, tests/…, configs/…, benchmarks/…,
  launch/…) is a file of the tree: a move must take the docs with it."""
  docs = [os.path.join(ROOT, "README.md")] + [os.path.join(ROOT, "docs", f)
                                              for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                                              if f.endswith(".md")]
  missing = []
  for doc in docs:
    with open(doc, encoding="utf-8") as f:
      text = f.read()
    for path in sorted(set(re.findall(r"\b(?:grpo_jax|tests|configs|benchmarks|launch)/[\w/.-]*\w\.(?:py|md|sh)\b",
                                      text))):
      if not os.path.exists(os.path.join(ROOT, path)):
        missing.append(f"{os.path.relpath(doc, ROOT)}: {path}")
  assert not missing, "paths in the docs that are not in the tree: " + "; ".join(missing)


def private_reaches(paths, known: dict[str, str]) -> list[str]:
  """`alias._name` uses and `from grpo_jax.x import _name` imports of another grpo_jax module's private (one
  leading underscore) names: a module's `_names` are its own."""
  out = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    alias = {}
    where = lambda n: f"{os.path.relpath(path, ROOT)}:{n.lineno}"  # noqa: E731
    for n in ast.walk(tree):
      if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("grpo_jax") and not n.level:
        for a in n.names:
          if f"{n.module}.{a.name}" in known:
            alias[a.asname or a.name] = f"{n.module}.{a.name}"
          elif a.name.startswith("_") and not a.name.startswith("__"):
            out.append(f"{where(n)} from {n.module} import {a.name}")
      elif isinstance(n, ast.Import):
        alias.update({a.asname: a.name for a in n.names if a.asname and a.name in known})
    for n in ast.walk(tree):
      if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in alias
          and n.attr.startswith("_") and not n.attr.startswith("__") and known[alias[n.value.id]] != path):
        out.append(f"{where(n)} {n.value.id}.{n.attr} ({alias[n.value.id]})")
  return out


def test_no_module_reaches_into_another_modules_private_names():
  """The package's modules (and the benchmarks and configs built on it) use each other's public names only; tests
  may look inside."""
  paths = []
  for top in ("grpo_jax", "benchmarks", "configs", "launch"):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
      paths += [os.path.join(d, f) for f in files if f.endswith(".py")]
  bad = private_reaches(sorted(paths), modules())
  assert not bad, "private names used from another module: " + "; ".join(bad)


def test_private_reach_reader_sees_both_forms(toy_pkg):
  d = toy_pkg({"a.py": "_X = 1\ndef _f():\n  pass\n", "b.py": "from grpo_jax import a as a_lib\na_lib._f()\n",
               "c.py": "from grpo_jax.a import _X\n", "d.py": "from grpo_jax import a\na.__doc__\n"})
  known = modules(d)
  got = private_reaches([known[f"grpo_jax.{m}"] for m in "bcd"], known)
  assert [x.split(" ", 1)[1] for x in got] == ["a_lib._f (grpo_jax.a)", "from grpo_jax.a import _X"]
