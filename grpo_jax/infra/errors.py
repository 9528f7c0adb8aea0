"""The one error path: user-facing failures are exceptions with a one-line message and an exit status.

Every module raises into it; only the CLI (`main.py`) turns them into output:

    exit 0  finished, or stopped by SIGTERM/SIGINT after saving (`Preempted`; rerun the command to resume)
    exit 1  an unexpected error: a bug, printed with its traceback
    exit 2  `InputError`: a bad config value, path, file, tensor or workdir (also a locked workdir, a config that
            differs from the checkpoint's, disk full or read-only). One line naming the key/path and the fix.
    exit 3  `RunStopped`: training stopped itself (non-finite steps in a row, a failing Python reward, a non-finite
            state); the last good state is saved. One line.

`--verbose` adds the traceback to lines of status 2 and 3.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
from typing import Iterator

EXIT_OK, EXIT_BUG, EXIT_INPUT, EXIT_STOPPED = 0, 1, 2, 3


class InputError(ValueError):
  """Bad user input. A ValueError, so code written against `ValueError` still catches it."""
  exit_code = EXIT_INPUT
  label = "Error"


class ConfigError(InputError):
  """A bad config value (`validate.py`): the message starts with `config.<key>:`."""
  label = "Config error"


def integer(v) -> bool:
  """An int that is not a bool: Python's True is the int 1, so a count given True (top_k=True) ran as 1, unsaid."""
  return isinstance(v, int) and not isinstance(v, bool)


class RunStopped(RuntimeError):
  """Training stopped itself with its last good state saved; rerunning without a fix would stop again."""
  exit_code = EXIT_STOPPED
  label = "Run stopped"


class Preempted(Exception):
  """SIGTERM/SIGINT: the current step finished and was saved; the stage is NOT finished. Exit 0, rerun resumes."""
  exit_code = EXIT_OK

  def __init__(self, where: str, step: int | None = None, kept: str = "finished stages are kept"):
    if step is None:  # `kept`: what of the command's work is on disk (an ablation table: its finished rows)
      what = f"{where}; {kept}"
    elif step == 0:  # a fresh loop stopped before its first step: it had nothing to save (and saved nothing)
      what = f"before the first step in {where}; nothing was trained there yet"
    else:
      what = f"after step {step} in {where}; its state is saved"
    super().__init__(f"stopped by a signal {what}. Rerun the same command to resume.")
    self.step, self.where = step, where


# errno values that mean "the storage refused the write", not a bug: reported as input errors naming the path.
_STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EFBIG: "the file size limit is exceeded",
}


def chain(e: BaseException) -> Iterator[BaseException]:
  """`e`, its causes and contexts, and exceptions grouped inside it (orbax wraps async write errors)."""
  seen, todo = set(), [e]
  while todo:
    x = todo.pop(0)
    if x is None or id(x) in seen:
      continue
    seen.add(id(x))
    yield x
    todo += [x.__cause__, x.__context__] + list(getattr(x, "exceptions", ()) or ())


# tensorstore (orbax's array writer) reports OS errors inside a ValueError's text.
_TS_ERRNO = re.compile(r"os_error_code='(\d+)'")
_TS_PATHS = (re.compile(r'Failed writing: "([^"]+)"'), re.compile(r'local file "([^"]+)"'))


def _errno_and_path(x: BaseException) -> tuple[int | None, str]:
  if isinstance(x, OSError):
    return x.errno, str(x.filename or "")
  m = _TS_ERRNO.search(str(x))
  if m:
    paths = [p.search(str(x)) for p in _TS_PATHS]
    return int(m.group(1)), next((p.group(1) for p in paths if p), "")
  return None, ""


def storage_error(e: BaseException) -> InputError | None:
  """A one-line InputError for a write refused by the storage (disk full, read-only, permissions), else None."""
  for x in chain(e):
    code, path = _errno_and_path(x)
    if code in _STORAGE_ERRNOS:
      where = f" writing {path}" if path else ""
      return InputError(f"{_STORAGE_ERRNOS[code]}{where} ({os.strerror(code)}); free space, fix the "
                        "permissions, or point --workdir at a writable directory.")
  return None


class ArgParser(argparse.ArgumentParser):
  """argparse for the tools with positional flags (export, aot, memory_plan): a usage error is one line naming the
  flag and exit 2, not the usage block (15 lines for aot) above it."""

  def error(self, message: str):
    self.exit(EXIT_INPUT, f"error: {one_line(message)}; see --help.\n")


def int_at_least(low: int):
  """An argparse type: an integer >= low (a count of 0 or below planned a step of nothing and exited 0)."""
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      value = None
    if value is None or value < low:
      raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= {low}")
    return value
  return parse


def classify(e: BaseException) -> tuple[int, str] | None:
  """(exit status, one line) for a known failure, None for a bug (the caller shows the traceback)."""
  if isinstance(e, Preempted):
    return EXIT_OK, f"Preempted: {e}"
  if isinstance(e, (InputError, RunStopped)):
    return e.exit_code, f"{e.label}: {one_line(str(e))}"
  se = storage_error(e)
  if se is not None:
    return se.exit_code, f"{se.label}: {se}"
  return None


def root_cause(e: BaseException, limit: int = 300) -> str:
  """`Type: first line` of the innermost cause of `e`: a library's wrapper ("Encountered error while reading array
  index ... See full TensorStore details") hides what went wrong ("OUT_OF_RANGE: ... not valid for value of size")."""
  while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
    e = e.__cause__ if e.__cause__ is not None else e.__context__
  text = str(e).strip().splitlines()[0] if str(e).strip() else ""
  return f"{type(e).__name__}: {text[:limit]}"


def one_line(text: str) -> str:
  """Messages are one line by contract; a stray newline from a library message is folded."""
  return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())


@contextlib.contextmanager
def input_errors(what: str) -> Iterator[None]:
  """Around a call that only READS user input (a tokenizer path, task knobs, a checkpoint's config.json): its
  ValueError / missing-file errors are bad input, reported as one InputError prefixed with `what`."""
  try:
    yield
  except InputError:
    raise
  except (ValueError, KeyError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
    msg = one_line(str(e)) if not isinstance(e, KeyError) else f"missing key {e}"
    if isinstance(e, OSError) and e.filename and str(e.filename) not in msg:
      msg = f"{msg}: {e.filename}"
    raise InputError(f"{what}: {msg}" if not msg.startswith(what) else msg) from e
