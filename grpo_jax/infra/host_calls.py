"""Python calls made from inside the jitted step (through `jax.pure_callback`) that must neither raise nor hang it.

A Python exception must not cross the callback (undefined behaviour, and the state is donated), and a call that
never returns would hang the step. So every call runs on a worker thread with a timeout; what it did comes back as
a status code. A call that times out is abandoned with its thread: a daemon thread never keeps the process alive
(ThreadPoolExecutor threads are joined at exit, so one hung call would hang the exit), and later calls go to a
fresh worker instead of queueing behind the hung one. Abandoned calls still running are counted, so that a caller
can refuse to pile up threads for ever.

Shared by rl/rewards.py (the Python reward terms: one call per step) and envs/batch.py (the environment steps of
all paused rows of a chunk boundary: one call per row, `Workers.size` at a time).
"""
from __future__ import annotations

import collections.abc
import queue
import reprlib
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

# Status codes a host call reports (0 = ok). The reward terms' codes (rl/reward_spec.py re-exports them) and the
# environments' per-row codes (envs/batch.py) are these.
OK, RAISED, NONFINITE, WRONG_LENGTH, WRONG_TYPE, TIMEOUT = range(6)
STATUS_TEXT = {RAISED: "raised an exception", NONFINITE: "returned NaN/inf", WRONG_LENGTH: "returned the wrong length",
               WRONG_TYPE: "returned the wrong type", TIMEOUT: "timed out"}

# Objects with a len() that are no sequence of values: a dict iterates its keys, a set in no order, a str its
# characters, and bytes, bytearray and memoryview their byte values (b"\x01\x00" read as the scores [1, 0]).
NOT_SEQUENCES = (str, bytes, bytearray, memoryview, collections.abc.Mapping, collections.abc.Set)


def finite_f32(v) -> float | None:
  """A real number as the float the step will hold (float32), or None when that is not finite: NaN, inf, or a value
  beyond float32's range (1e39 would become inf in the step; an int too large for a float cannot be converted)."""
  try:
    f = float(v)
  except (OverflowError, TypeError, ValueError):
    return None
  with np.errstate(over="ignore"):
    return f if np.isfinite(np.float32(f)) else None


def short(v) -> str:
  """repr(v), cut to a line's worth (a huge int or a long list in an error message)."""
  return reprlib.repr(v)


class Worker:
  """One daemon thread that runs calls, one at a time."""

  def __init__(self, name: str):
    self._jobs: queue.Queue = queue.Queue()
    self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
    self.thread.start()

  def _loop(self) -> None:
    while True:
      job = self._jobs.get()
      if job is None:
        return
      fn, args, box, done = job
      try:
        box.append((True, fn(*args)))
      except BaseException as e:  # pylint: disable=broad-except  # reported as a status, never raised
        box.append((False, e))
      done.set()

  def submit(self, fn: Callable, args: tuple) -> tuple[list, threading.Event]:
    box, done = [], threading.Event()
    self._jobs.put((fn, args, box, done))
    return box, done

  def stop(self) -> None:
    self._jobs.put(None)


class Outcome(NamedTuple):
  status: int        # OK (value is the return value), RAISED (value is the exception) or TIMEOUT (value None)
  value: Any


class Workers:
  """`size` workers that run a list of calls `size` at a time, each with its own timeout; a worker whose call timed
  out is replaced and its thread counted as hung while it still runs."""

  def __init__(self, name: str, size: int = 1):
    if size < 1:
      raise ValueError(f"Workers size={size} must be >= 1")
    self.name = name
    self._workers = [Worker(name) for _ in range(size)]
    self._hung: list[threading.Thread] = []

  @property
  def size(self) -> int:
    return len(self._workers)

  def hung(self) -> int:
    """Abandoned (timed-out) calls still running."""
    self._hung = [t for t in self._hung if t.is_alive()]
    return len(self._hung)

  def run(self, fn: Callable, args_list: Sequence[tuple], timeout_s: float) -> list[Outcome]:
    """fn(*args) for each args, in waves of `size` concurrent calls; each call may take `timeout_s` seconds from the
    start of its wave. Never raises for what fn does."""
    out: list[Outcome] = []
    # a longer wait is no wait at all to threading (OverflowError: a 1e10 s timeout failed every call)
    timeout_s = min(float(timeout_s), threading.TIMEOUT_MAX)
    for start in range(0, len(args_list), self.size):
      wave = args_list[start:start + self.size]
      jobs = [self._workers[i].submit(fn, args) for i, args in enumerate(wave)]
      deadline = time.monotonic() + timeout_s
      for i, (box, done) in enumerate(jobs):
        if not done.wait(max(0.0, deadline - time.monotonic())):
          # the abandoned worker exits once its call returns (it waited for more jobs for ever, so it was counted
          # hung for ever: after MAX_HUNG timeouts in a run's life, however long ago, every call failed as a whole)
          self._workers[i].stop()
          self._hung.append(self._workers[i].thread)
          self._workers[i] = Worker(self.name)
          out.append(Outcome(TIMEOUT, None))
          continue
        ok, value = box[0]
        out.append(Outcome(OK if ok else RAISED, value))
    return out

  def close(self) -> None:
    """Stops the idle workers; hung ones are daemon threads and die with the process."""
    for w in self._workers:
      w.stop()
