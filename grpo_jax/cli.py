"""What the commands on the package's top floor share (`python -m grpo_jax.main`, `.sweep`, `.ablate`): the flags
`--config` / `--workdir` / `--verbose` and their one-line errors (`define_flags`, `parse_flags`, `config_value`),
quiet library logging and the closed-console guard (`start`), the exit path (`exit_on`, `finish`), the persistent
compilation cache and the garbage collector's settings (`collect_less`).

A graceful stop is one mechanism for all three: `start` turns a closed console into a stop request
(console.guard_streams), the command's work runs under one signals.GracefulStop (SIGTERM / SIGINT / SIGHUP: finish
the step or the unit, save, raise errors.Preempted; further signals are absorbed while it saves), and `exit_on`
prints the Preempted line (what stopped, what is kept, "Rerun the same command to resume.") and exits 0.

The persistent compilation cache: a command compiles each program once per machine, not once per run. A rerun, a
resume, every seed of a serial sweep and every stage that builds the same program load the compiled executable from
disk (JAX's persistent cache: the key covers the program, the jax / XLA version, the XLA flags and the devices, so a
hit is the same compiled code and runs stay bitwise equal). It lives in `$GRPO_JAX_XLA_CACHE` if set, else
`$XDG_CACHE_HOME/grpo_jax/xla` (`~/.cache/grpo_jax/xla`); `GRPO_JAX_XLA_CACHE=off` turns it off. A directory this process cannot
write (a read-only home, a path under a file) turns it off with one warning naming it (`writable_dir`). JAX's own
`JAX_COMPILATION_CACHE_DIR` (the test suite sets one per session) takes precedence, as does a cache directory a
caller configured before. Programs whose compile took under a second are not stored (JAX's default threshold),
programs with host callbacks (Python reward terms) never are (JAX skips them), and the directory is trimmed to
CACHE_MAX_BYTES, least recently used first.
"""
import os
import re
import sys
import tempfile
import traceback

from absl import flags
from absl import logging
from ml_collections import config_flags

from grpo_jax.config import config_lib
from grpo_jax.infra import console
from grpo_jax.infra import errors

CACHE_ENV = "GRPO_JAX_XLA_CACHE"
CACHE_OFF = ("off", "0", "false", "none", "")
CACHE_MAX_BYTES = 4 << 30  # JAX evicts the least recently used entries past this


def cache_dir() -> str | None:
  """Where this command's compiled programs are kept (None: off, or JAX's own setting applies)."""
  value = os.environ.get(CACHE_ENV)
  if value is not None:
    return None if value.strip().lower() in CACHE_OFF else os.path.expanduser(value)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "grpo_jax", "xla")


def writable_dir(d: str) -> bool:
  """Whether `d` is (or can be made) a directory this process writes files into; if not, one warning naming it and
  the fix: the command compiles without the persistent cache (a read-only home, a path under a file), as JAX would
  only warn at every program it failed to store."""
  try:
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryFile(dir=d):
      pass
  except OSError as e:
    logging.warning("persistent compilation cache off: %s is not a writable directory (%s); every program compiles "
                    "anew. Set %s to a writable directory, or to 'off'.", d, e, CACHE_ENV)
    return False
  return True


def compilation_cache() -> str | None:
  """Turns on JAX's persistent compilation cache for this process (before its first compile); returns the
  directory in use, or None when off. Leaves an already configured cache (JAX_COMPILATION_CACHE_DIR, or
  jax.config set by the caller) as it is."""
  import jax  # pylint: disable=g-import-not-at-top  (the commands import jax after their flags parse)
  configured = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
  if configured:
    return configured
  d = cache_dir()
  if d is None or not writable_dir(d):
    return None
  jax.config.update("jax_compilation_cache_dir", d)
  jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
  return d


def collect_less() -> None:
  """Runs the cyclic garbage collector less often and freezes what exists now out of its reach (called at a
  command's start, and again after its imports). Tracing and lowering allocate many short-lived objects, and each
  collection walked the long-lived ones JAX and the package left: a tiny run's CPU was 8% less (docs/performance.md),
  as in the suite's workers (tests/conftest.py, the same settings)."""
  import gc  # pylint: disable=g-import-not-at-top
  gc.freeze()
  gc.set_threshold(50_000, 50, 1_000)


# ---------------------------------------------------------------------------------------------- flags, exits


def define_flags() -> None:
  """--config (an experiment config file, locked after parsing), --workdir, --verbose: the flags every run command
  takes (defined once per process)."""
  if "config" in flags.FLAGS:
    return
  config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/<exp>.py[:arg]).", lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for config.json, metrics.jsonl, checkpoints, plots.")
  flags.DEFINE_bool("verbose", False, "Show tracebacks with error lines, and the libraries' INFO logs.")


def config_value(example: str = "configs/grpo_arith.py:runlocal"):
  """The parsed --config; a config file that failed to load or a missing --config is one line and exit 2."""
  try:
    config = flags.FLAGS["config"].value
    if config is not None:
      config.get("job")  # a config file that failed to load raises on first use, here
  except Exception as e:  # pylint: disable=broad-except
    if flags.FLAGS.verbose:
      traceback.print_exc()
    print(f"Error: --config: {errors.one_line(str(e))[:600]}; pass --config=configs/<exp>.py[:arg] naming an "
          "existing config file whose get_config(arg) runs.", file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  if config is None:
    print(f"Error: --config is required, e.g. --config={example}.", file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  table = example.startswith("configs/ablations/")  # `ablate` takes a table config (config.table), the others a run's
  if table != ("table" in config and "job" not in config):
    given = flags.FLAGS["config"].config_filename
    fix = ("python -m grpo_jax.main (or .sweep) runs it; ablate takes a table, e.g. --config=" + example if table else
           "run it with python -m grpo_jax.ablate --config=<it> --workdir=DIR; main and sweep take an experiment's "
           f"config, e.g. --config={example}")
    print(f"Error: --config={given} is {'an experiment' if table else 'an ablation table'} config; {fix}.",
          file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  return config


def override_keys() -> frozenset[str]:
  """The dotted keys this command's `--config.<key>=` flags set (absl's config flag records them, after parsing):
  the keys the user set, for the warnings about keys the job does not read (config_lib.user_keys_set)."""
  return frozenset(config_flags.get_override_values(flags.FLAGS["config"]))


# The libraries' records cut to one line each, and silenced before a command's last line: infra/console.py.
setup_logging = console.setup_logging


def start(verbose: bool) -> None:
  """The set-up of a long-running command once its flags are parsed: the libraries' logging (setup_logging) and
  stdout / stderr guarded (console.guard_streams), so that a console that goes away (`| head`, a closed terminal)
  asks the command's GracefulStop for a stop instead of killing it at its next line."""
  setup_logging(verbose)
  console.guard_streams()


def exit_on(e: Exception, verbose: bool = False) -> None:
  """A command's known failure as its one line and exit status (errors.classify): errors.Preempted (a graceful
  stop, everything saved) exits 0 with what stopped and how to resume, an input error 2, RunStopped 3. Returns
  nothing; re-raises `e` when it is a bug (the traceback is the report, exit 1)."""
  from grpo_jax.infra import signals  # pylint: disable=g-import-not-at-top  (signals imports absl only)
  verdict = errors.classify(e)
  if verdict is None:
    raise e
  signals.ignore_from_now()  # the command is over: a late signal must not turn its exit into a traceback
  code, line = verdict
  logging.flush()
  if verbose:
    traceback.print_exception(e)
  print(line, file=sys.stderr, flush=True)
  finish(code)


def distributed() -> bool:
  """Whether this process is one of a jax.distributed job (infra/multihost.py); asked without importing jax."""
  multihost = sys.modules.get("grpo_jax.infra.multihost")
  return multihost is not None and multihost.initialized()


def finish(code: int) -> None:
  """Error exits skip interpreter shutdown: orbax's and hung reward threads would print or wait there, and in a
  multi-process job JAX's shutdown barrier would wait 300 s for the other processes, which wait in a collective for
  this one (infra/multihost.py), then abort both. Everything of ours is on disk by now (saves are waited for before
  RunStopped is raised; the lock is released)."""
  if code in (errors.EXIT_INPUT, errors.EXIT_STOPPED) or (code != errors.EXIT_OK and distributed()):
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def _declared(key: str) -> bool:
  """Whether the dotted `key` names a value declared in config_lib.base_config (a section is not a value)."""
  node = config_lib.defaults()
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node:
      return False
    node = node[part]
  return True


def _unknown_key(argv, error: Exception) -> str:
  """'config.<key>: no such key' for the --config.<key> override that names a missing key, with the nearest
  declared key when one is close. ml_collections says only the last part, quoted, and appends its own "Did you
  mean" on a second line; the offending override is the first whose path base_config does not declare."""
  inner = error.args[0] if error.args and isinstance(error.args[0], Exception) else error
  missing = str(inner.args[0] if inner.args else inner).strip().splitlines()[0].strip("\"'")
  keys = [arg[len("--config."):].split("=", 1)[0] for arg in argv if arg.startswith("--config.")]
  unknown = [k for k in keys if not _declared(k)]
  key = unknown[0] if unknown else f"<...>.{missing}"
  close = config_lib.nearest_key(key)
  if close and unknown:
    return f"config.{key}: no such key; did you mean config.{close}? (keys: grpo_jax/config/config_lib.py)."
  return (f"config.{key}: no such key; check the spelling against grpo_jax/config/config_lib.py (or the "
          "experiment's configs/*.py).")


def _config_file_error(text: str) -> str:
  """The line a config file's get_config raised, without the traceback config_flags pastes into its message."""
  last = text.strip().splitlines()[-1].strip()
  kind, _, why = last.partition(": ")
  if kind.endswith("ConfigError"):  # e.g. an unknown `:arg` variant (config_lib.parse_arg)
    return f"Config error: --config: {why}"
  field = re.search(r"Could not override field '(\w+)'.*\bauto is of original type", why or last)
  knobs = [k for k in config_lib.AUTO_INT if field and k.rsplit(".", 1)[1] == field.group(1)]
  if knobs:  # `c.rl.minibatches = "auto"`: the word is the command line's; a config file writes the number
    return (f"Config error: --config: config.{knobs[0]} = 'auto' in a config file: an integer knob's `auto` is its "
            f"number there, {config_lib.AUTO_INT[knobs[0]]} (the word 'auto' is read on the command line only); set "
            f"{knobs[0].rsplit('.', 1)[1]} = {config_lib.AUTO_INT[knobs[0]]}.")
  return (f"Error: --config: {why or last}; pass --config=configs/<exp>.py[:arg] naming an existing config file "
          "whose get_config(arg) runs.")


def _value_text(key: str, text: str) -> str:
  return config_lib.tuple_text(key, config_lib.auto_text(key, text))


def auto_flag(arg: str) -> str:
  key, eq, value = arg.partition("=")
  if not (eq and key.startswith("--config.")):
    return arg
  return f"{key}={_value_text(key[len('--config.'):], value)}"


HELP_FLAGS = ("--help", "-help", "-?", "--helpshort", "--helpfull", "--helpxml")


def auto_flags(argv) -> list[str]:
  """Every `--config.<key>=auto` (auto_flag), and the form absl also takes, `--config.<key> auto`, as its number;
  a comma list for a tuple-valued key as its tuple (config_lib.tuple_text: `--config.r1.stages=base,r1_zero`)."""
  out = []
  for i, arg in enumerate(argv):
    prev = argv[i - 1] if i else ""
    if prev.startswith("--config.") and "=" not in prev and not arg.startswith("-"):
      out.append(_value_text(prev[len("--config."):], arg))
    else:
      out.append(auto_flag(arg))
  return out


def parse_flags(argv):
  """absl's flag parsing with every failure (missing or broken config file, unknown key, bad value) as one line.
  `--config.<key>=auto` (or `--config.<key> auto`) for an integer knob passes as its auto number
  (config_lib.AUTO_INT: 0, or -1)."""
  argv = auto_flags(argv)
  try:
    return flags.FLAGS(argv)
  except SystemExit as e:  # absl's --help / --helpfull print the usage and exit 1, which is a bug's status here
    if e.code == 1 and any(a.split("=", 1)[0] in HELP_FLAGS for a in argv[1:]):
      sys.exit(errors.EXIT_OK)
    raise
  except Exception as e:  # pylint: disable=broad-except
    if "--verbose" in argv:
      traceback.print_exc()
    if isinstance(e, (AttributeError, KeyError)):  # ml_collections: a missing field, or a missing group
      msg = f"Config error: {_unknown_key(argv, e)}"
    elif isinstance(e, flags.Error) and "Traceback (most recent call last)" in str(e):
      msg = _config_file_error(str(e))
    elif isinstance(e, flags.Error):
      msg = f"Error: {errors.one_line(str(e))}; see --helpfull for the flags."
    else:
      msg = (f"Error: --config: {errors.one_line(str(e))}; pass --config=configs/<exp>.py[:arg] naming an existing "
             "config file whose get_config(arg) runs.")
    print(msg, file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)


