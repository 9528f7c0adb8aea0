"""Config files and the helpers they share: parse_arg, override, load_config.

RESOLVED pins the resolved config of every config variant, every ablation variant and the benchmark workload (as
the difference from config_lib.base_config, plus the base itself). It was recorded from the code that parsed
ablation variants from "key=value;…" strings at run time, before they became overrides, so the test shows that both
resolve to the same configs (the one recorded difference: a training table's `rewards` now names the toy terms its
cells use, which the old run config left at the unused base default; the pin stores what the cells used). Re-record
ONLY for an intended change of a config or of a base default, and say which in the commit:
  python tests/test_configs.py --record
"""
import json
import os
import subprocess
import sys

import ml_collections
import pytest

from grpo_jax.config import config_lib
from grpo_jax.config import presets
from grpo_jax.studies.ablations import task_table
from grpo_jax.studies.ablations import train_table
from grpo_jax.tasks import digits

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESOLVED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resolved_configs.json")
MAIN_ARGS = {"grpo_arith.py": (["", "small"] + [f"algo={a}" for a in presets.names()]
                               + ["algo=rloo,small", "lora=True", "small,lora=True"]),
             "gsm8k.py": ["", "small", "model=qwen2.5-math-1.5b", "small,model=checkpoint,prompt=chat", "algo=dapo"],
             "r1_pipeline.py": ["", "small", "algo=gdpo"], "r1_zero.py": ["", "small", "long"],
             "r1_zero_aha.py": ["", "small", "control", "noverify", "small,control"],
             "tools_calc.py": ["", "small", "control", "small,control"]}
ABLATIONS = ("algorithms.py", "length_bias.py", "reward_design.py", "kl_estimators.py", "baselines.py", "memory.py",
             "gdpo.py", "entropy.py", "objectives.py", "lite_ppo_grid.py", "reasoning_boundary.py",
             "spurious_rewards.py", "one_shot.py")


def _load(rel: str, arg: str = ""):
  return config_lib.load_config(os.path.join(REPO, "configs", rel), arg or None)


def _jsonable(v):
  return [_jsonable(x) for x in v] if isinstance(v, (tuple, list)) else v


def _flat(c, prefix=""):
  out = {}
  for k in sorted(c.keys()):
    v = c[k]
    if isinstance(v, ml_collections.ConfigDict):
      out.update(_flat(v, prefix + k + "."))
    else:
      out[prefix + k] = _jsonable(v)
  return out


BASE = _flat(config_lib.base_config())


def _diff(c) -> dict:
  f = _flat(c)
  assert not set(BASE) - set(f), sorted(set(BASE) - set(f))
  return {k: v for k, v in f.items() if k not in BASE or BASE[k] != v}


def resolve_all() -> dict:
  out = {"base": BASE, "digits.bench_config()": _diff(digits.bench_config())}  # the benchmark workload's config
  for f, args in MAIN_ARGS.items():
    for arg in args:
      out[f"{f}:{arg}" if arg else f] = _diff(_load(f, arg))
  for f in ABLATIONS:
    for arg in ("", "small"):
      cfg = _load("ablations/" + f, arg)
      entry = {}
      if "run" in cfg:
        entry["harness"] = {k: v for k, v in _flat(cfg).items() if k.split(".")[0] not in ("run", "variants")}
        # the generated-task tables' runs as their module builds them (the others' pins predate this: train_table's)
        build = task_table.build_config if cfg.table == "task_table" else train_table.build_config
        entry["variants"] = {name: _diff(build(cfg, over)) for name, over in cfg.variants}
        entry["variant_order"] = [name for name, _ in cfg.variants]
      else:
        entry["harness"] = _flat(cfg)
      out[f"ablations/{f}:{arg}" if arg else f"ablations/{f}"] = entry
  return out


def _mismatch(want, got, path=""):
  """The first few differing paths, for a readable failure."""
  if isinstance(want, dict) and isinstance(got, dict):
    out = []
    for k in sorted(set(want) | set(got)):
      out += _mismatch(want.get(k, "<missing>"), got.get(k, "<missing>"), f"{path}/{k}")
    return out
  return [] if want == got else [f"{path}: pinned {want!r}, now {got!r}"]


def test_every_config_and_ablation_variant_resolves_as_pinned():
  with open(RESOLVED) as f:
    pinned = json.load(f)
  got = json.loads(json.dumps(resolve_all()))
  diffs = _mismatch(pinned, got)
  assert not diffs, (f"{len(diffs)} resolved config values changed (re-record only if intended, see this file's "
                     "docstring):\n" + "\n".join(diffs[:30]))


def test_every_key_is_declared_in_the_base_config():
  """No config or ablation variant sets a key that config_lib.base_config does not declare."""
  # The R1 section is set by configs/r1_pipeline.py until base_config declares it; then it is checked like the rest.
  exempt = () if "r1" in config_lib.base_config() else ("r1.",)
  undeclared = {}
  for name, entry in resolve_all().items():
    runs = entry.get("variants", {}) if "harness" in entry else {name: entry}
    for run, diff in runs.items():
      keys = [k for k in diff if k not in BASE and not k.startswith(exempt)]
      if keys:
        undeclared[f"{name} {run}"] = keys
  assert not undeclared, undeclared


# ------------------------------------------------------------------------------------------------ parse_arg


def test_parse_arg_types_and_the_small_alias():
  a = config_lib.parse_arg("small,algo=rloo,G=4,lr=3e-4", small=False, algo="grpo", G=8, lr=1e-3)
  assert (a.small, a.algo, a.G, a.lr) == (True, "rloo", 4, 3e-4)
  assert isinstance(a.G, int) and isinstance(a.lr, float)
  b = config_lib.parse_arg(None, small=False, algo="grpo")
  assert (b.small, b.algo) == (False, "grpo")
  assert config_lib.parse_arg("runlocal", small=False).small is True
  assert config_lib.parse_arg("small=false", small=False).small is False


@pytest.mark.parametrize("arg,needle", [("smal", "'smal' is unknown; accepted: small, algo=<str>"),
                                        ("runlocal,G=3", "'G=3' is unknown"),
                                        ("algo", "needs a value: algo=<str>"),
                                        ("small=maybe", "small is a flag"),
                                        # given twice: the first was dropped without a word (the last won)
                                        ("algo=dapo,small,algo=rloo", "'algo=rloo': algo is already given ('algo=dapo')"),
                                        ("runlocal,small=false", "small is already given ('runlocal')")])
def test_parse_arg_rejects_bad_args_in_one_line(arg, needle):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.parse_arg(arg, small=False, algo="grpo")
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
  with pytest.raises(config_lib.ConfigError, match="G takes a int"):
    config_lib.parse_arg("G=four", G=8)


@pytest.mark.parametrize("rel", list(MAIN_ARGS) + [f"ablations/{f}" for f in ABLATIONS])
def test_every_config_rejects_an_unknown_arg_and_takes_runlocal_for_small(rel):
  """`:smal` used to run the full job silently in one config; now every config raises, naming the arg."""
  with pytest.raises(config_lib.ConfigError, match="'smal' is unknown"):
    _load(rel, "smal")
  assert _load(rel, "runlocal").to_dict() == _load(rel, "small").to_dict()
  assert _load(rel, "small").to_dict() != _load(rel).to_dict()


def test_configs_have_no_sys_path_hacks_and_load_from_any_directory(tmp_path, monkeypatch):
  for d, _, files in os.walk(os.path.join(REPO, "configs")):
    for f in (f for f in files if f.endswith(".py")):
      with open(os.path.join(d, f)) as fh:
        assert "sys.path" not in fh.read(), os.path.join(d, f)
  monkeypatch.chdir(tmp_path)
  c = config_lib.load_config(os.path.join(REPO, "configs", "r1_zero.py"), "small")  # loads r1_pipeline.py itself
  assert c.r1.stages == ("base", "r1_zero") and c.task.max_digits == 1
  with pytest.raises(config_lib.ConfigError, match="does not exist"):
    config_lib.load_config(os.path.join(REPO, "configs", "nope.py"))


def test_cli_names_an_unknown_config_arg():
  out = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_arith.py:smal",
                        "--workdir=/tmp/unused"], capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode != 0 and "'smal' is unknown" in out.stderr, out.stderr[-2000:]


# ------------------------------------------------------------------------------------------------- override


def test_override_sets_dotted_keys_on_a_copy_with_declared_types():
  c = config_lib.base_config()
  c.lock()
  o = config_lib.override(c, {"rl.beta": 0, "rl.algo": "rloo", "eval.pass_k": [1, 2], "rewards": [["acc", 1]],
                              "rl.G": 4, "rl.dynamic_sampling": True})
  assert (o.rl.beta, o.rl.algo, o.eval.pass_k, o.rl.G, o.rl.dynamic_sampling) == (0.0, "rloo", (1, 2), 4, True)
  assert isinstance(o.rl.beta, float) and o.rewards == (("acc", 1),)
  assert (c.rl.beta, c.rl.algo, c.rl.G) == (0.04, "grpo", 8)  # the input is untouched
  assert config_lib.override(c, {}).to_dict() == c.to_dict()


@pytest.mark.parametrize("key,value,needle", [
    ("rl.betta", 0.0, "config.rl.betta: unknown key (not declared in config_lib.base_config); did you mean 'rl.beta'?"),
    ("nosuch.key", 1, "config.nosuch.key: unknown key"),
    ("rl.beta.x", 1, "config.rl.beta.x: unknown key"),
    ("rl", {"beta": 0.0}, "config.rl is a section; override its keys one by one"),
    ("rl.G", 2.5, "config.rl.G: override value 2.5 (float) is not an int"),
    ("rl.G", True, "config.rl.G: override value True (bool) is not an int"),
    ("rl.beta", "0.1", "config.rl.beta: override value '0.1' (str) is not a float"),
    ("rl.algo", 3, "config.rl.algo: override value 3 (int) is not a str"),
    ("rl.dynamic_sampling", 1, "is not a bool"),
    ("log.plots", 1, "is not a bool"),
    ("eval.pass_k", 4, "is not a tuple"),
])
def test_override_rejects_unknown_keys_and_wrong_types_in_one_line(key, value, needle):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.override(config_lib.base_config(), {key: value})
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("key,value,kind,would", [
    ("optim.lr", True, "a number", "1.0"), ("rl.beta", False, "a number", "0.0"),
    ("r1.pretrain.lr", True, "a number", "1.0"), ("sampling.top_k", True, "an integer", "1"), ("seed", True, "an integer", "1")])
def test_a_config_file_setting_a_bool_on_a_number_is_refused_as_it_is_set(key, value, kind, would):
  """A config file's `c.optim.lr = True` ran at lr 1.0: ConfigDict casts a bool (an int) set on a float key to the
  float, so validate.base_types never saw the bool. Refused at the assignment, naming the key, also on copies."""
  import copy
  import pickle
  for c in (config_lib.base_config(), copy.deepcopy(config_lib.base_config()),
            pickle.loads(pickle.dumps(config_lib.base_config()))):
    group, _, leaf = key.rpartition(".")
    node = c
    for part in filter(None, group.split(".")):
      node = node[part]
    with pytest.raises(config_lib.ConfigError) as e:
      setattr(node, leaf, value)
    assert str(e.value).startswith(f"config.{key}: is {value}, a bool where {kind} is expected") and \
        f"it would run as {would}" in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(config_lib.ConfigError):
      node.update({leaf: value})
  c = config_lib.base_config()
  c.optim.lr, c.rl.G, c.log.plots = 1, 4, False  # an int on a float key, ints and bools where declared: as before
  assert (c.optim.lr, c.rl.G, c.log.plots) == (1.0, 4, False) and isinstance(c.optim.lr, float)


def test_ablation_variant_overrides_are_checked_like_any_other():
  cfg = train_table.table_config("small", (("typo", {"rl.los_agg": "token_mean"}),))
  with pytest.raises(config_lib.ConfigError, match="did you mean 'rl.loss_agg'"):
    train_table.build_config(cfg, dict(cfg.variants)["typo"])
  c = train_table.build_config(cfg, {"rl.G": 4})
  assert c.train.num_samples_logged == c.rl.prompts_per_step * 4  # derived after the override


if __name__ == "__main__":
  if sys.argv[1:] != ["--record"]:
    sys.exit("usage: python tests/test_configs.py --record   (rewrites tests/resolved_configs.json)")
  with open(RESOLVED, "w") as f:
    json.dump(resolve_all(), f, indent=1, sort_keys=True)
    f.write("\n")
  print(f"wrote {RESOLVED}")


def test_gsm8k_model_tiny_validates_without_a_checkpoint():
  """configs/gsm8k.py:model=tiny (its docstring: a random 1-layer model with the shipped tokenizer, no checkpoint)
  kept TINY's max_len=384, under its own 320 prompt + 512 new tokens: every run was refused at validation
  (config.sampling.max_new_tokens: ... = 832 exceeds model.max_len=384). `small` keeps 384 (256 + 16 fit)."""
  from grpo_jax.run import validate
  from grpo_jax.tasks import tokenizer_factory
  for arg in ("model=tiny", "model=tiny,algo=dapo"):
    c = _load("gsm8k.py", arg)
    validate.validate_rl(c, 1, tokenizer_factory.for_config(c))
    assert c.model.max_len == c.task.prompt_len + c.sampling.max_new_tokens == 320 + 512, arg
  assert _load("gsm8k.py", "small").model.max_len == 384
