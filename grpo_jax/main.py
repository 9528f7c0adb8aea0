"""CLI: python -m grpo_jax.main --config=configs/<exp>.py[:arg] --workdir=DIR [--config.key=value ...] [--verbose]

Exit status (errors.py): 0 finished, or stopped by SIGTERM/SIGINT with its state saved (rerun to resume); 1 a bug
(traceback); 2 an input error (one line: config value, path, file, workdir in use, changed config on resume, disk
full or read-only); 3 the run stopped itself (one line: non-finite steps, a failing Python reward); 130 Ctrl-C
before the run started. `--verbose` adds tracebacks and the libraries' INFO logs.
"""
import logging as std_logging
import os
import sys
import threading
import traceback

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags
from grpo_jax.config import config_lib
from grpo_jax.infra import errors

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/<exp>.py[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for config.json, metrics.jsonl, checkpoints, plots.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show tracebacks with error lines, and the libraries' INFO logs.")


class _QuietLibraries(std_logging.Filter):
  """Library records (orbax, tfds, jax, asyncio, …) below WARNING are dropped, and the rest lose their tracebacks
  and extra lines and are shown once: an async write error that orbax logs from each of its threads (or asyncio's
  "Event loop is closed" from each of its tasks) becomes one line. grpo_jax's own records pass untouched."""

  def __init__(self):
    super().__init__()
    self.seen: set[tuple[str, str]] = set()

  def filter(self, record) -> bool:
    verdict = getattr(record, "_grpo_jax_shown", None)  # the same record through the logger and its handlers
    if verdict is None:
      verdict = record._grpo_jax_shown = self._judge(record)  # pylint: disable=protected-access
    return verdict

  def _judge(self, record) -> bool:
    if f"{os.sep}grpo_jax{os.sep}" in record.pathname:
      return True
    if record.levelno < std_logging.WARNING:
      return False
    if "Using custom data configuration" in str(record.msg):  # tfds says this on every load of a generated task
      return False
    if record.exc_info or record.exc_text:
      record.exc_info, record.exc_text = None, None
    msg = record.getMessage()
    if "\n" in msg:
      record.msg, record.args = msg.splitlines()[0][:500] + " [...; --verbose for the rest]", None
    key = (record.name, record.getMessage()[:200])
    if key in self.seen:
      return False
    self.seen.add(key)
    return True


def _one_line_hook(what: str, shown: set):
  """A thread's (or an unraisable) exception as one line, once per kind: library threads (orbax's async writers)
  that fail after a handled failure would otherwise print a traceback each."""
  def hook(args) -> None:
    exc = getattr(args, "exc_value", None)
    line = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    if line not in shown:
      shown.add(line)
      print(f"warning: {what}: {line} [--verbose for the traceback]", file=sys.stderr)
  return hook


def setup_logging(verbose: bool) -> None:
  if verbose:
    return
  quiet = _QuietLibraries()
  std_logging.getLogger("absl").addFilter(quiet)
  for handler in std_logging.getLogger().handlers:  # records of other loggers (asyncio, orbax's own) reach these
    handler.addFilter(quiet)
  shown: set[str] = set()
  threading.excepthook = _one_line_hook("a library thread failed", shown)
  sys.unraisablehook = _one_line_hook("an exception was ignored during cleanup", shown)


def execute(config, workdir: str, verbose: bool = False) -> int:
  """Runs the job; returns the exit status, printing one line for every known failure (errors.classify)."""
  # Here, not at the top: a flag or config-file error exits before jax and orbax load (importing jobs: 7 s at load 18
  # on 2 cores; main alone 0.6 s).
  from grpo_jax import cli  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import evaluation, jobs  # pylint: disable=g-import-not-at-top
  cli.compilation_cache()  # a rerun, a resume or the next seed loads its programs from disk (cli.py)
  try:
    with evaluation.shared_programs():  # the stages' evaluation programs, traced once per job
      jobs.run(config, workdir)
    return errors.EXIT_OK
  except KeyboardInterrupt:
    logging.flush()
    print("Interrupted before the run installed its handlers; nothing was saved.", file=sys.stderr)
    return 130
  except Exception as e:  # pylint: disable=broad-except
    verdict = errors.classify(e)
    if verdict is None:
      raise  # a bug: the traceback is the report (exit 1)
    code, line = verdict
    logging.flush()
    if verbose:
      traceback.print_exc()
    print(line, file=sys.stderr, flush=True)
    return code


def _exit(code: int) -> None:
  """Error exits skip interpreter shutdown: orbax's and hung reward threads would print or wait there. Everything
  of ours is on disk by now (saves are waited for before RunStopped is raised; the lock is released)."""
  if code in (errors.EXIT_INPUT, errors.EXIT_STOPPED):
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def main(argv) -> None:
  if len(argv) > 1:
    print(f"Error: unexpected argument {argv[1]!r}; flags are --config, --workdir, --config.<key>=<value>, --verbose.",
          file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  try:
    config = _CONFIG.value
    if config is not None:
      config.get("job")  # a config file that failed to load raises on first use, here
  except Exception as e:  # pylint: disable=broad-except
    if _VERBOSE.value:
      traceback.print_exc()
    print(f"Error: --config: {errors.one_line(str(e))[:600]}; pass --config=configs/<exp>.py[:arg] naming an "
          "existing config file whose get_config(arg) runs.", file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  if config is None:
    print("Error: --config is required, e.g. --config=configs/grpo_arith.py:runlocal.", file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  setup_logging(_VERBOSE.value)
  _exit(execute(config, _WORKDIR.value or "", _VERBOSE.value))


def _unknown_key(argv, error: Exception) -> str:
  """The --config.<key> override that names a missing key (ml_collections says only the last part)."""
  missing = str(error).strip("\"'")
  if isinstance(error, KeyError) and error.args:
    missing = str(error.args[0]).strip("\"'")
  for arg in argv:
    if arg.startswith("--config."):
      key = arg[len("--"):].split("=", 1)[0]
      if missing and (key.split(".")[-1] == missing or f".{missing}." in f".{key}."):
        return key
  return f"config.<...>.{missing}"


def _config_file_error(text: str) -> str:
  """The line a config file's get_config raised, without the traceback config_flags pastes into its message."""
  last = text.strip().splitlines()[-1].strip()
  kind, _, why = last.partition(": ")
  if kind.endswith("ConfigError"):  # e.g. an unknown `:arg` variant (config_lib.parse_arg)
    return f"Config error: --config: {why}"
  return (f"Error: --config: {why or last}; pass --config=configs/<exp>.py[:arg] naming an existing config file "
          "whose get_config(arg) runs.")


def _auto_flag(arg: str) -> str:
  key, eq, value = arg.partition("=")
  if not (eq and key.startswith("--config.")):
    return arg
  return f"{key}={config_lib.auto_text(key[len('--config.'):], value)}"


def _parse_flags(argv):
  """absl's flag parsing with every failure (missing or broken config file, unknown key, bad value) as one line.
  `--config.<key>=auto` for an integer knob passes as its auto number (config_lib.AUTO_INT: 0, or -1)."""
  argv = [_auto_flag(arg) for arg in argv]
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    if "--verbose" in argv:
      traceback.print_exc()
    if isinstance(e, (AttributeError, KeyError)):  # ml_collections: a missing field, or a missing group
      msg = (f"Config error: {_unknown_key(argv, e)}: no such key; check the spelling against "
             "grpo_jax/config/config_lib.py (or the experiment's configs/*.py).")
    elif isinstance(e, flags.Error) and "Traceback (most recent call last)" in str(e):
      msg = _config_file_error(str(e))
    elif isinstance(e, flags.Error):
      msg = f"Error: {errors.one_line(str(e))}; see --helpfull for the flags."
    else:
      msg = (f"Error: --config: {errors.one_line(str(e))}; pass --config=configs/<exp>.py[:arg] naming an existing "
             "config file whose get_config(arg) runs.")
    print(msg, file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)


def _entry():
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  _entry()
