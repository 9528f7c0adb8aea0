"""grpo_jax/cli.py: what the commands share. The persistent compilation cache: where it lives, how it is turned off,
that a caller's (the suite's) setting wins, and that a command's second compile of a program loads it from disk."""
import logging
import os
import subprocess
import sys

from grpo_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cache_dir_default_env_and_off(monkeypatch, tmp_path):
  monkeypatch.delenv(cli.CACHE_ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert cli.cache_dir() == os.path.join(str(tmp_path), "grpo_jax", "xla")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert cli.cache_dir() == os.path.join(str(tmp_path / "home"), ".cache", "grpo_jax", "xla")
  monkeypatch.setenv(cli.CACHE_ENV, str(tmp_path / "mine"))
  assert cli.cache_dir() == str(tmp_path / "mine")
  for off in ("off", "OFF", "0", "false", ""):
    monkeypatch.setenv(cli.CACHE_ENV, off)
    assert cli.cache_dir() is None


# A fresh process (JAX reads the cache settings once): cli.compilation_cache() with the suite's own cache variable
# removed, one program compiled twice through two jit objects; the second is a cache hit (JAX's cache-hit counter).
_SCRIPT = r"""
import jax, jax.numpy as jnp
from jax._src import monitoring
from grpo_jax import cli
hits = []
monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None)
d = cli.compilation_cache()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # a toy program: store it anyway
f = lambda x: jnp.sin(x) @ x.T
jax.jit(f).lower(jnp.ones((8, 8))).compile()
jax.jit(lambda x: f(x)).lower(jnp.ones((8, 8))).compile()
print("DIR", d, "HITS", len(hits))
"""


def _run(env_extra: dict, stderr: list | None = None) -> str:
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE") and k != cli.CACHE_ENV}
  env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **env_extra)
  out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  if stderr is not None:
    stderr.append(out.stderr)
  return out.stdout.strip().splitlines()[-1]


def test_a_command_compiles_a_program_once(tmp_path):
  cache = tmp_path / "xla"
  assert _run({cli.CACHE_ENV: str(cache)}) == f"DIR {cache} HITS 1"
  assert os.listdir(cache)  # the entry is on disk for the next command
  assert _run({cli.CACHE_ENV: "off"}) == "DIR None HITS 0"
  theirs = tmp_path / "theirs"  # JAX's own variable (the suite sets one per session) is left as it is
  assert _run({"JAX_COMPILATION_CACHE_DIR": str(theirs), cli.CACHE_ENV: str(cache)}) == f"DIR {theirs} HITS 1"


def test_a_cache_dir_that_cannot_be_written_compiles_without_it_and_says_so(tmp_path, monkeypatch, caplog):
  """A cache path under a file (or a read-only home) was turned off without a word (`os.makedirs` failed: None); one
  that exists but takes no files was handed to JAX, which warns at every program it fails to store. Now both compile
  without the cache after one warning that names the directory and the variable to set."""
  (tmp_path / "afile").write_text("")
  bad, err = str(tmp_path / "afile" / "xla"), []
  assert _run({cli.CACHE_ENV: bad}, err) == "DIR None HITS 0"
  said = [l for l in err[0].splitlines() if "persistent compilation cache off" in l]
  assert len(said) == 1 and f"{bad} is not a writable directory" in said[0] and cli.CACHE_ENV in said[0], err[0]
  # a directory that exists but refuses files (the suite runs as root, which writes through permissions: the write
  # itself is refused here)
  (tmp_path / "ro").mkdir()

  def refuse(*args, **kwargs):
    raise PermissionError(13, "Permission denied")
  with monkeypatch.context() as m:
    m.setattr(cli.tempfile, "TemporaryFile", refuse)
    with caplog.at_level(logging.WARNING):
      assert not cli.writable_dir(str(tmp_path / "ro"))
  assert [r.getMessage() for r in caplog.records if "Permission denied" in r.getMessage()], caplog.records
  assert cli.writable_dir(str(tmp_path / "ro")) and cli.writable_dir(str(tmp_path / "new" / "xla"))
  assert os.listdir(tmp_path / "ro") == []  # the probe leaves nothing behind


def test_an_unknown_key_is_named_whole_with_the_nearest_declared_key():
  """ml_collections' errors for a misspelt override (a last part quoted, its own 'Did you mean' on a second line; a
  missing group; a part below a value) become one line naming the whole --config key, and the nearest key if any."""
  from grpo_jax.config import config_lib
  c = config_lib.base_config()
  errors_of = {}
  for key in ("rl.betta", "rll.beta", "rl.beta.x", "foo.bar"):
    node = c
    try:
      for part in key.split("."):
        node = getattr(node, part) if hasattr(node, "keys") else node[part]
    except Exception as e:  # pylint: disable=broad-except
      errors_of[key] = e
  argv = ["main", "--config=configs/grpo_arith.py", "--config.rl.G=4"]
  want = {"rl.betta": "config.rl.betta: no such key; did you mean config.rl.beta?",
          "rll.beta": "config.rll.beta: no such key; did you mean config.rl.beta?",
          "rl.beta.x": "config.rl.beta.x: no such key; did you mean config.rl.beta?",
          "foo.bar": "config.foo.bar: no such key; check the spelling against grpo_jax/config/config_lib.py"}
  for key, line in want.items():
    got = cli._unknown_key(argv + [f"--config.{key}=1"], errors_of[key])  # pylint: disable=protected-access
    assert got.startswith(line) and "\n" not in got, (key, got)


def test_auto_for_an_integer_knob_in_either_flag_form(monkeypatch):
  """absl takes `--config.<key> value` as well as `--config.<key>=value`; `auto` for an integer knob is its number in
  both (the space form reached absl as the word and failed: invalid literal for int()). Other words pass as they are."""
  from absl import flags
  seen = []
  monkeypatch.setattr(flags, "FLAGS", lambda argv: seen.append(list(argv)) or argv[:1])
  assert cli.parse_flags(["main", "--config.rl.minibatches", "auto", "--config.sampling.exit_chunk=auto",
                          "--config.sampling.engine", "auto", "--config.rl.G", "4", "auto"]) == ["main"]
  assert seen == [["main", "--config.rl.minibatches", "0", "--config.sampling.exit_chunk=-1",
                   "--config.sampling.engine", "auto", "--config.rl.G", "4", "auto"]]


_PARSE = """
import sys
from absl import flags
from grpo_jax import cli
cli.define_flags()
cli.parse_flags(["main", "--config=configs/r1_zero_aha.py", *sys.argv[1:]])
c = flags.FLAGS.config
print(repr((c.r1.stages, c.model.lora.targets, c.tools.stop_markers, c.eval.pass_k, c.task.train_indices,
            c.train.rerun_stages)))
"""


def test_a_comma_list_is_a_tuple_for_every_tuple_valued_key():
  """`--config.r1.stages=base,r1_zero` reached the config as ONE stage name ('base,r1_zero',) and validation refused
  it without saying why, while `--config.eval.pass_k=1,4` was (1, 4): ml_collections reads a comma list of numbers
  as a literal but a list of words as one string. Every key whose value is a flat tuple now takes the comma list (in
  either flag form, with or without parentheses); Python literals and string keys (train.rerun_stages) are as they
  were; a list of pairs (rewards) is refused with the literal syntax named."""
  import ast  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  from grpo_jax.config import config_lib
  from grpo_jax.infra import errors
  from grpo_jax.run import validate
  flat = config_lib._flat_tuple_keys()  # pylint: disable=protected-access
  assert {"r1.stages", "model.lora.targets", "tools.stop_markers", "eval.pass_k", "task.train_indices",
          "r1.forbidden", "r1.report.pass_k"} == flat
  for key in flat:
    assert ast.literal_eval(config_lib.tuple_text(key, "a,b")) == ("a", "b"), key
  assert config_lib.tuple_text("train.rerun_stages", "sft,r1_zero") == "sft,r1_zero"  # a string key
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  args = ["--config.r1.stages=base,r1_zero", "--config.model.lora.targets", "(q_proj, v_proj)",
          "--config.tools.stop_markers=('</tool_call>', '</answer>')", "--config.eval.pass_k=1,8",
          "--config.task.train_indices=3,", "--config.train.rerun_stages=sft,r1_zero"]
  r = subprocess.run([sys.executable, "-c", _PARSE, *args], cwd=repo, capture_output=True, text=True,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
  assert r.returncode == 0, r.stderr
  assert ast.literal_eval(r.stdout.strip().splitlines()[-1]) == (
      ("base", "r1_zero"), ("q_proj", "v_proj"), ("</tool_call>", "</answer>"), (1, 8), (3,), "sft,r1_zero")
  hint = re.escape("""--config.rewards="(('accuracy', 1.0), ('format', 0.2))").""") + "$"
  with pytest.raises(errors.ConfigError, match=hint):
    validate.reward_terms("rewards", ("accuracy,format",))


def test_help_exits_0_and_lists_the_flags():
  """absl's --help exits 1 (this CLI's status for a bug) and listed no flag ("Try --helpfull"); now 0 with --config,
  --workdir and --verbose listed. A real exit 1 from absl without a help flag stays 1."""
  out = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-2000:]
  assert all(f in out.stdout for f in ("--config:", "--workdir:", "--[no]verbose:")), out.stdout


def test_only_a_help_flag_turns_absls_exit_1_into_0(monkeypatch):
  from absl import flags
  import pytest  # pylint: disable=g-import-not-at-top

  def exits_1(argv):
    raise SystemExit(1)
  monkeypatch.setattr(flags, "FLAGS", exits_1)
  for argv, code in ((["main", "--helpfull"], 0), (["main", "-?"], 0), (["main", "--config.x=--help"], 1)):
    with pytest.raises(SystemExit) as e:
      cli.parse_flags(argv)
    assert e.value.code == code, argv


def test_ablate_refuses_an_experiment_config_and_takes_every_table(monkeypatch, capsys):
  """config_value tells a table config (config.table: ablate's) from an experiment's (config.job: main's, sweep's)
  and names the command that runs it; every shipped table passes ablate's check, with or without `variants`."""
  import glob  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  from absl import flags
  from grpo_jax.config import config_lib

  class Flag:
    def __init__(self, path):
      self.config_filename, self.value = path, config_lib.load_config(path)

  class Flags(dict):
    verbose = False
  tables = sorted(glob.glob(os.path.join(ROOT, "configs", "ablations", "*.py")))
  assert len(tables) >= 10
  for path in tables + [os.path.join(ROOT, "configs", "grpo_arith.py")]:
    monkeypatch.setattr(flags, "FLAGS", Flags(config=Flag(path)))
    if "ablations" in path:
      assert cli.config_value("configs/ablations/algorithms.py:small") is flags.FLAGS["config"].value
      with pytest.raises(SystemExit) as e:  # ... and refused by main
        cli.config_value()
    else:
      assert cli.config_value() is flags.FLAGS["config"].value
      with pytest.raises(SystemExit) as e:
        cli.config_value("configs/ablations/algorithms.py:small")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Error: --config={path} is ") and len(err.splitlines()) == 1, err
    assert ("ablate --config=<it>" in err) == ("ablations" in path), err
