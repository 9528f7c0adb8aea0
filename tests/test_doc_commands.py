"""The command lines README.md and docs/*.md quote stay valid: every `python -m grpo_jax.<x>`, `python
benchmarks/<x>.py`, `python launch/<x>.py` and `[bash] benchmarks/<x>.sh` / `launch/<x>.sh` names a module or file
of the tree, every `--flag` is one that entry point defines, every `configs/<x>.py[:arg]` loads with that arg, and
every `--config.<key>` is a key of the config it names (of config_lib.base_config where the doc writes a placeholder
such as `configs/<exp>.py`). Nothing runs: argparse parsers are captured at parse_args, absl flags read from the
source, shell scripts' flags from their `--flag)` case labels. docs/ablations/*/table.md are generated outputs and
not read."""
import argparse
import ast
import importlib
import importlib.util
import inspect
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENTRY = re.compile(r"python[\d.]*\s+-m\s+(grpo_jax(?:\.\w+)+)|python[\d.]*\s+((?:benchmarks|launch)/[\w/]+\.py)"
                   r"|(?<![\w/])((?:benchmarks|launch)/[\w/]+\.sh)")
# A command ends at a closing backtick, a shell comment, a separator, or where the next command starts.
END = re.compile(r"`|\s#(?:\s|$)|;|&&|\s\|\s|\)(?:\s|$)")
FLAG = re.compile(r"(?<![\w/.-])--([\w.-]+)(?:[= ](?!-)('[^']*'|\"[^\"]*\"|[^\s\]\[]+))?")
PLACEHOLDER_KEYS = {"", "key"}  # `--config.key=value`, `--config.<point's overrides>`: the docs' placeholders

# absl entry points: the files whose flags.DEFINE_* / config_flags.DEFINE_config_file calls define their flags.
ABSL = {"grpo_jax.main": ("grpo_jax/main.py", "grpo_jax/cli.py"),
        "grpo_jax.studies.sweep": ("grpo_jax/studies/sweep.py", "grpo_jax/cli.py"),
        "grpo_jax.studies.ablate": ("grpo_jax/studies/ablate.py", "grpo_jax/cli.py")}
ABSL_BUILTIN = {"help", "helpfull", "helpshort", "flagfile", "logtostderr", "alsologtostderr", "verbosity", "v"}


def doc_paths() -> list[str]:
  d = os.path.join(ROOT, "docs")
  return [os.path.join(ROOT, "README.md")] + [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".md")]


def commands(text: str) -> list[tuple[int, str, str]]:
  """(line, entry, arguments) of every command in a markdown text; `\\`-continued lines are joined."""
  lines, out, i = text.split("\n"), [], 0
  while i < len(lines):
    start, line = i, lines[i]
    while line.rstrip().endswith("\\") and i + 1 < len(lines):
      i += 1
      line = line.rstrip()[:-1] + " " + lines[i].strip()
    for m in ENTRY.finditer(line):
      rest = line[m.end():]
      nxt = ENTRY.search(rest)
      rest = END.split(rest[:nxt.start()] if nxt else rest)[0]
      out.append((start + 1, m.group(1) or m.group(2) or m.group(3), rest))
    i += 1
  return out


def module_file(name: str) -> str | None:
  for rel in (name.replace(".", "/") + ".py", name.replace(".", "/") + "/__init__.py"):
    if os.path.exists(os.path.join(ROOT, rel)):
      return rel
  return None


def shim_target(name: str) -> str:
  """The module a `python -m grpo_jax.<x>` shim runs (runpy.run_module), else the module itself."""
  path = module_file(name)
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    m = re.search(r"run_module\(\"([\w.]+)\"", f.read())
  return m.group(1) if m else name


def absl_flags(files) -> set[str]:
  out = set(ABSL_BUILTIN)
  for rel in files:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for n in ast.walk(tree):
      if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr.startswith("DEFINE")
          and n.args and isinstance(n.args[0], ast.Constant)):
        out.add(n.args[0].value)
        if n.func.attr in ("DEFINE_bool", "DEFINE_boolean"):
          out.add("no" + n.args[0].value)
  return out


class _Captured(Exception):
  pass


def argparse_flags(main, monkeypatch) -> set[str] | None:
  """The option strings (without dashes) of the parser `main` builds, captured when it calls parse_args."""
  got = []

  def capture(self, *args, **kwargs):
    got.append(self)
    raise _Captured

  with monkeypatch.context() as m:
    m.setattr(argparse.ArgumentParser, "parse_args", capture)
    m.setattr(sys, "argv", ["prog"])
    m.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))  # chaos.main's setdefault stays in here
    try:
      main(*([[]] if inspect.signature(main).parameters else []))
    except _Captured:
      pass
  if not got:
    return None
  return {s.lstrip("-") for a in got[0]._actions for s in a.option_strings}


def shell_flags(rel: str) -> set[str]:
  with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
    return set(re.findall(r"^\s*--([\w-]+)\)", f.read(), re.M))


_configs: dict[str, object] = {}


def load_config(spec: str):
  """get_config(arg) of `configs/x.py[:arg]`, or the exception it raised."""
  if spec not in _configs:
    path, _, arg = spec.partition(":")
    s = importlib.util.spec_from_file_location("doc_cfg_" + re.sub(r"\W", "_", path), os.path.join(ROOT, path))
    mod = importlib.util.module_from_spec(s)
    try:
      s.loader.exec_module(mod)
      _configs[spec] = mod.get_config(arg or None)
    except Exception as e:  # pylint: disable=broad-except
      _configs[spec] = e
  return _configs[spec]


def has_key(config, key: str) -> bool:
  node = config
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node:
      return False
    node = node[part]
  return True


def test_reader_on_a_hand_case():
  text = ("Run `python -m grpo_jax.main --config=configs/a.py:small --workdir=D` then\n"
          "    python benchmarks/b.py --x 1 \\\n      --y=2  # comment --z\n"
          "    (cd T && python -m grpo_jax.sweep --seeds=3) | tee; python launch/c.py --n 2 -- \\\n"
          "      python -m grpo_jax.main\n"
          "`--launch=\"launch/tpu_vm.sh --name s-{i} ...\"`, then `bash benchmarks/d.sh --cpu`\n")
  got = [(line, entry, [f for f, _ in FLAG.findall(rest)]) for line, entry, rest in commands(text)]
  assert got == [(1, "grpo_jax.main", ["config", "workdir"]), (2, "benchmarks/b.py", ["x", "y"]),
                 (4, "grpo_jax.sweep", ["seeds"]), (4, "launch/c.py", ["n"]), (4, "grpo_jax.main", []),
                 (6, "launch/tpu_vm.sh", ["name"]), (6, "benchmarks/d.sh", ["cpu"])]
  assert FLAG.findall(" --x 1 [--y-z=2] '--config.a.b=(\"c\",)' --no-perf --n") == [
      ("x", "1"), ("y-z", "2"), ("config.a.b", '("c",)\''), ("no-perf", ""), ("n", "")]


def test_doc_commands_name_real_entry_points_flags_and_config_keys(monkeypatch):
  from grpo_jax.config import config_lib  # pylint: disable=g-import-not-at-top
  base = config_lib.base_config()
  for d in ("benchmarks", "launch"):
    monkeypatch.syspath_prepend(os.path.join(ROOT, d))
  known: dict[str, set[str] | None] = {}
  bad = []
  for doc in doc_paths():
    with open(doc, encoding="utf-8") as f:
      text = f.read()
    rel_doc = os.path.relpath(doc, ROOT)
    for line, entry, rest in commands(text):
      where = f"{rel_doc}:{line} {entry}"
      if entry not in known:
        if entry.endswith(".sh"):
          known[entry] = shell_flags(entry) if os.path.exists(os.path.join(ROOT, entry)) else set()
          if not os.path.exists(os.path.join(ROOT, entry)):
            bad.append(f"{where}: no such file")
        elif entry.endswith(".py"):
          if not os.path.exists(os.path.join(ROOT, entry)):
            bad.append(f"{where}: no such file")
            known[entry] = None
          else:
            mod = importlib.import_module(os.path.basename(entry)[:-3])
            known[entry] = argparse_flags(mod.main, monkeypatch)
        elif module_file(entry) is None:
          bad.append(f"{where}: no such module")
          known[entry] = None
        else:
          target = shim_target(entry)
          if target in ABSL:
            known[entry] = absl_flags(ABSL[target])
          else:
            mod = importlib.import_module(target)
            known[entry] = argparse_flags(mod.main, monkeypatch) if hasattr(mod, "main") else None
      flags = FLAG.findall(rest)
      config = None
      for name, value in flags:
        value = value.strip("'\"")
        if name == "config" and value.startswith("configs/") and not re.search(r"[<\[]", value):
          config = load_config(value)
          if isinstance(config, Exception):
            bad.append(f"{where}: {value} does not load: {config!r}")
            config = None
      for name, _ in flags:
        if name.startswith("config."):
          key = name[len("config."):]
          if key in PLACEHOLDER_KEYS:
            continue
          if not has_key(config if config is not None else base, key):
            bad.append(f"{where}: --{name}: no such config key")
        elif known[entry] is not None and name not in known[entry]:
          bad.append(f"{where}: --{name}: not a flag of {entry}")
  assert not bad, "doc command lines that do not match the code:\n" + "\n".join(bad)


if __name__ == "__main__":
  pytest.main([__file__, "-q"])
