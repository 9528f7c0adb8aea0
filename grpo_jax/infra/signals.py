"""SIGTERM, SIGINT and SIGHUP: finish the current step, save, exit 0 — agreed across processes.

SIGHUP is what a closed terminal or a dropped ssh session sends: without a handler it killed the run like SIGKILL
(steps since the last checkpoint lost, the workdir lock left behind).

`GracefulStop` is installed once for a whole command (main.py) or, when a loop runs without one (a test, a
notebook), by the loop itself (`GracefulStop.ensure()`). The first signal only sets a flag; loops ask
`should_stop()` at the top of every step. Further signals while the run saves and exits are logged and ignored (the
handler stays installed until the last save is on disk), so a second Ctrl-C cannot tear a checkpoint; SIGKILL
still can, and the next start removes the torn save's temporary directory.

Multi-process jobs: a scheduler may signal hosts at different moments, and a host that stops alone hangs the
others in the next collective. `should_stop()` therefore all-gathers the flag (one int per process) each step:
every process stops after the same step when ANY process was signalled.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from absl import logging

from grpo_jax.infra import console
from grpo_jax.infra import errors

_SIGNALS = (signal.SIGTERM, signal.SIGINT) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())
_active: GracefulStop | None = None


class GracefulStop:
  """Context manager: installs the handlers (main thread only), uninstalls them on exit."""

  def __init__(self):
    self.requested = False
    self.signal_name = ""
    self._agreed = False
    self._prev: dict = {}

  def _handler(self, signum, frame):  # pylint: disable=unused-argument
    self._ask(f"{signal.Signals(signum).name} received")

  def _ask(self, what: str) -> None:
    """The first request sets the flag; later ones (a second Ctrl-C during the save) are only said."""
    if self.requested:
      logging.warning("%s again: still finishing the step and saving; the run exits when the save is on disk "
                      "(SIGKILL aborts the save, which the next start cleans up).", what)
      return
    self.requested, self.signal_name = True, what.removesuffix(" received")
    logging.warning("%s: finishing the current step, then saving and exiting (exit status 0; rerun the same command "
                    "to resume).", what)

  def request(self, reason: str = "") -> None:
    """Asks for a stop as SIGTERM would (tests, code that is told about a preemption another way); `reason` is said
    in the log (and kept as signal_name) in place of the signal's name, e.g. 'the console closed (EPIPE)'."""
    self._ask(reason or "SIGTERM received")

  def should_stop(self) -> bool:
    """True on every process once any process has been signalled; call at the same point of every step."""
    import jax  # pylint: disable=g-import-not-at-top
    if self._agreed:
      return True
    if jax.process_count() == 1:
      self._agreed = self.requested
      return self._agreed
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    flags = np.asarray(multihost_utils.process_allgather(np.int32(self.requested)))
    if flags.any() and not self.requested:
      logging.warning("process(es) %s were signalled: stopping here too.", np.nonzero(flags)[0].tolist())
    self._agreed = bool(flags.any())
    return self._agreed

  def __enter__(self) -> GracefulStop:
    global _active
    if threading.current_thread() is threading.main_thread():
      for sig in _SIGNALS:
        self._prev[sig] = signal.signal(sig, self._handler)
    # Off the main thread no handler can be installed: the flag can still be set with request().
    self._outer, _active = _active, self
    if console.gone():  # it closed before this stop existed (console._Guarded): the run still stops and saves
      self.request("the console closed")
    return self

  def __exit__(self, *exc) -> None:
    global _active
    for sig, prev in self._prev.items():
      signal.signal(sig, prev)
    self._prev = {}
    _active = self._outer

  @staticmethod
  @contextlib.contextmanager
  def ensure() -> Iterator[GracefulStop]:
    """The command's active GracefulStop, or a new one installed for the duration of the block."""
    if _active is not None:
      yield _active
    else:
      with GracefulStop() as stop:
        yield stop


def ignore_from_now() -> None:
  """The command is over (its saves on disk, its lock released): a signal could now only turn a clean exit into a
  traceback (a second Ctrl-C while the interpreter shuts down), so the rest of the exit ignores them."""
  if threading.current_thread() is threading.main_thread():
    for sig in _SIGNALS:
      signal.signal(sig, signal.SIG_IGN)


def active() -> GracefulStop | None:
  return _active


def _stop_for(reason: str) -> None:
  if _active is not None:
    _active.request(reason)


console.on_closed(_stop_for)  # a closed console (console._Guarded) stops the command as SIGHUP does


def check_stop(where: str, **kept) -> None:
  """Raises errors.Preempted(where) once a stop is agreed (should_stop): between stages (or an ablation table's
  rows), where no state needs saving; `kept=`: what the stopped command keeps (errors.Preempted)."""
  stop = _active
  if stop is not None and stop.should_stop():
    raise errors.Preempted(where, **kept)
