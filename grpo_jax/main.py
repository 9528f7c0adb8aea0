"""CLI: python -m grpo_jax.main --config=configs/<exp>.py[:arg] --workdir=DIR [--config.key=value ...] [--verbose]

Exit status (errors.py): 0 finished, or stopped by SIGTERM/SIGINT with its state saved (rerun to resume); 1 a bug
(traceback); 2 an input error (one line: config value, path, file, workdir in use, changed config on resume, disk
full or read-only); 3 the run stopped itself (one line: non-finite steps, a failing Python reward); 130 Ctrl-C
before the run started. `--verbose` adds tracebacks and the libraries' INFO logs. The flags, their errors, the
logging and the exit path are grpo_jax/cli.py's (shared with `python -m grpo_jax.sweep`).
"""
import sys

from absl import app
from absl import flags
from absl import logging
from grpo_jax import cli
from grpo_jax.config import config_lib
from grpo_jax.infra import console
from grpo_jax.infra import errors
from grpo_jax.infra import signals

cli.define_flags()
flags.adopt_module_key_flags(cli)  # --help lists --config, --workdir, --verbose (not only "Try --helpfull")


def execute(config, workdir: str, verbose: bool = False, user_keys=None) -> int:
  """Runs the job; returns the exit status, printing one line for every known failure (errors.classify).
  `user_keys`: the dotted keys the user set (the command line's --config.<key> flags); a key among them that the job
  does not read is named in a warning (validate.unread_keys). None: every value away from the base config counts."""
  if user_keys is not None:
    with config_lib.user_keys_set(user_keys):
      return execute(config, workdir, verbose)
  try:
    # Here, not at the top: a flag or config-file error exits before jax and orbax load (importing jobs: 7 s at load
    # 18 on 2 cores; main alone 0.6 s); inside the try: Ctrl-C during those seconds is the one line below.
    from grpo_jax.run import evaluation, jobs  # pylint: disable=g-import-not-at-top
    cli.compilation_cache()  # a rerun, a resume or the next seed loads its programs from disk (cli.py)
    cli.collect_less()  # again after the imports: what they made is frozen too (cli.py)
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
      if cli.distributed():  # this process alone failed: the traceback, then exit 1 at once (cli.finish)
        import traceback  # pylint: disable=g-import-not-at-top
        from grpo_jax.infra import multihost  # pylint: disable=g-import-not-at-top
        lost = multihost.peer_lost(e)  # another process ended: one line, its output holds the cause
        if lost is None or verbose:
          traceback.print_exc()
        if lost is not None:
          logging.flush()
          print(f"Error: {lost}", file=sys.stderr, flush=True)
        return errors.EXIT_BUG
      raise  # a bug: the traceback is the report (exit 1)
    code, line = verdict
    logging.flush()
    if verbose:
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
    elif code != errors.EXIT_OK:
      console.silence_libraries()  # the error line is the last one: library threads failing after it print nothing
    print(line, file=sys.stderr, flush=True)
    return code


def main(argv) -> None:
  if len(argv) > 1:
    print(f"Error: unexpected argument {argv[1]!r}; flags are --config, --workdir, --config.<key>=<value>, --verbose.",
          file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  config = cli.config_value()
  cli.start(flags.FLAGS.verbose)  # logging; a closed console stops the run as SIGHUP does, after saving
  code = execute(config, flags.FLAGS.workdir or "", flags.FLAGS.verbose, user_keys=cli.override_keys())
  signals.ignore_from_now()  # a signal after the command's end interrupts nothing
  cli.finish(code)


def _entry():
  cli.collect_less()  # from the start: importing jax and the package allocates as tracing does
  app.run(main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  _entry()
