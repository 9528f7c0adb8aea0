"""Symbolic answer equivalence (`\\frac{\\sqrt2}{2}` = `\\frac{1}{\\sqrt2}`, intervals, tuples, `\\pi`) through
math-verify, in a worker process that can be killed.

Why a process: math-verify (sympy) bounds its parsing and comparison with `signal.alarm`, which works only in a
process's main thread, and a reward term runs in a worker thread of the trainer (rl/rewards.py); without its alarms a
hard expression runs for ever, and a thread cannot be stopped. Here the comparisons run in the main thread of a
spawned process (no JAX, no fork of the trainer's threads) with math-verify's own per-item timeouts; the parent
waits at most `BACKSTOP` times that for each item and kills and restarts the worker past it (a comparison stuck in
C code that ignores the alarm). An item that timed out or raised is not equal, and is counted (`stats`).

Equality: both answers are read as LaTeX (math-verify's `parse` of `$answer$`, its units and basic-LaTeX
normalisations), then `verify(gold, pred)` (sympy: numbers to 6 decimals, expressions, sets, intervals, tuples,
matrices, equations `k=3` against `3`). Numbers that math_answer reads exactly are compared there first (the
numeric grader's exact rationals, no worker call): against a numeric reference a rounded decimal is wrong (`0.333333`
is not `\\frac{1}{3}`, as verl's MATH grader has it, though math-verify's 6 decimals would call it equal), so a row
scores the same under either grader; against a reference that is not a number math-verify's rounding decides
(`0.707107` equals `\\frac{\\sqrt{2}}{2}`). An answer over MAX_ANSWER_CHARS is sent as its last box, or without
one is not equal unread (counted: `stats['too_long']`).
"""
from __future__ import annotations

import atexit
import multiprocessing
import threading
from typing import Sequence

from absl import logging

from grpo_jax.tasks import math_answer

ITEM_TIMEOUT_S = 5       # math-verify's own timeout for each parse and each comparison, in the worker
BACKSTOP = 3             # the parent waits BACKSTOP × (3 × ITEM_TIMEOUT_S) + start-up for one item, then kills
START_S = 60.0           # a worker's start (python + sympy + math-verify imports: ~2 s here)
# A longer answer (a tagged body holding the whole explanation) is prose, not an answer: math-verify spent ~6 s on one
# of 800 characters here, one at a time in the worker (a batch of them stalled the step); its last box is sent instead.
MAX_ANSWER_CHARS = 512


def numeric(answer: str) -> bool:
  return math_answer.parse_value(answer) is not None and math_answer.no_variables(answer)


def _compare(gold: str, pred: str, timeout_s: int) -> bool:
  from math_verify import parse, verify  # pylint: disable=g-import-not-at-top
  # raise_on_error: a timeout or an error reaches the counts (math-verify's default returns False and logs at most)
  g = parse(f"${gold}$", parsing_timeout=timeout_s, raise_on_error=True)
  p = parse(f"${pred}$", parsing_timeout=timeout_s, raise_on_error=True)
  return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=timeout_s, raise_on_error=True))


def _parses(answer: str, timeout_s: int) -> bool:
  """Whether math-verify reads `answer` as a sympy object (its fallback is the unparsed string: `\\frac{`, `???`)."""
  from math_verify import parse  # pylint: disable=g-import-not-at-top
  parsed = parse(f"${answer}$", parsing_timeout=timeout_s, raise_on_error=True)
  return bool(parsed) and not isinstance(parsed[0], str)


def _serve(conn, timeout_s: int) -> None:
  """The worker: a request is (op, items); each item's verdict (True / False / an error string) is sent back as it
  is computed, so the parent knows which item a hang is in."""
  from math_verify.errors import TimeoutException  # pylint: disable=g-import-not-at-top  (the import cost, once)
  conn.send("ready")
  while True:
    try:
      request = conn.recv()
    except EOFError:
      return
    if request is None:
      return
    op, items = request
    for item in items:
      try:
        verdict = _compare(*item, timeout_s) if op == "equal" else _parses(item, timeout_s)
      except (Exception, TimeoutException) as e:  # pylint: disable=broad-except  (sympy's errors; math-verify's
        # timeout is a BaseException)
        verdict = f"{type(e).__name__}: {str(e)[:120]}"
      conn.send(verdict)


class Grader:
  """One worker process, started at the first call, restarted after a kill; thread-safe (one call at a time)."""

  def __init__(self, timeout_s: int = ITEM_TIMEOUT_S, *, backstop_s: float | None = None, serve=None):
    self.timeout_s = timeout_s
    # how long one item may take before its worker is killed; `serve`: the worker's loop (tests use a stand-in)
    self.backstop_s = BACKSTOP * 3 * timeout_s if backstop_s is None else backstop_s
    self._serve = serve or _serve
    self._lock = threading.Lock()
    self._proc = self._conn = None
    self.stats = {"calls": 0, "timeouts": 0, "errors": 0, "restarts": 0, "too_long": 0}
    self._started = False

  def _start(self) -> None:
    if self._started:
      self.stats["restarts"] += 1  # every replacement: after a kill (a hang, a crash) or a worker found dead
    self._started = True
    ctx = multiprocessing.get_context("spawn")  # never fork a process that holds JAX's threads
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=self._serve, args=(child, self.timeout_s), daemon=True, name="symbolic-grader")
    try:
      proc.start()  # may raise (no memory or processes left): then there is no worker to kill later
    except BaseException:
      parent.close()
      child.close()
      raise
    self._proc, self._conn = proc, parent
    child.close()
    try:
      ready = parent.poll(START_S) and parent.recv() == "ready"
    except (EOFError, OSError):  # it exited while starting (an import error: its traceback is on stderr)
      ready = False
    if not ready:
      self._proc.join(1)
      code = self._proc.exitcode
      self._kill()
      raise RuntimeError("the symbolic grader's worker " + (f"exited with code {code} while starting (its error is "
                         "above)" if code is not None else f"did not start in {START_S:.0f} s") + "; check that "
                         "python -c 'import math_verify' works in this environment (pip install -e '.[math]').")

  def _kill(self) -> None:
    if self._proc is not None:
      self._proc.kill()
      self._proc.join(5)
    if self._conn is not None:
      self._conn.close()
    self._proc = self._conn = None

  def close(self) -> None:
    with self._lock:
      if self._conn is not None:
        try:
          self._conn.send(None)
          self._proc.join(5)
        except (OSError, BrokenPipeError):
          pass
      self._kill()

  def _run(self, op: str, items: Sequence) -> list[bool | None]:
    """Verdicts in order; None = timed out or raised (counted)."""
    out: list[bool | None] = []
    with self._lock:
      while len(out) < len(items):
        if self._proc is None or not self._proc.is_alive():
          self._kill()
          self._start()
        pending = items[len(out):]
        try:
          self._conn.send((op, list(pending)))
        except OSError:  # it died since the check (BrokenPipeError): start another
          self._kill()
          continue
        for _ in pending:
          self.stats["calls"] += 1
          if not self._conn.poll(self.backstop_s):
            self.stats["timeouts"] += 1
            logging.warning("symbolic grader: an item took over %.0f s; its worker is killed and restarted (the item "
                            "counts as not equal)", self.backstop_s)
            out.append(None)
            self._kill()
            break
          try:
            verdict = self._conn.recv()
          except EOFError:  # the worker died (out of memory, a crash in C)
            self.stats["errors"] += 1
            out.append(None)
            self._kill()
            break
          if isinstance(verdict, str):
            self.stats["timeouts" if "Timeout" in verdict else "errors"] += 1
            logging.log_every_n_seconds(logging.WARNING, "symbolic grader: math-verify gave up on an item (%s); it "
                                        "counts as not equal (so far: %s)", 60, verdict, self.stats)
            out.append(None)
          else:
            out.append(bool(verdict))
    return out

  def equal_many(self, pairs: Sequence[tuple[str | None, str]]) -> list[bool]:
    """For each (prediction, gold): whether they are equal. A numeric gold (a number or an arithmetic expression
    without variables) against a prediction math_answer reads is decided there, as the numeric grader does; the
    rest by math-verify."""
    verdicts: list[bool | None] = [None] * len(pairs)
    ask = []
    for i, (pred, gold) in enumerate(pairs):
      if pred is None or not pred.strip():
        verdicts[i] = False
      elif numeric(gold) and math_answer.parse_value(pred) is not None:
        verdicts[i] = math_answer.equal(pred, gold)  # the numeric grader's exact values (and its units rule)
      elif len(pred) > MAX_ANSWER_CHARS and len(math_answer.last_boxed(pred) or pred) > MAX_ANSWER_CHARS:
        verdicts[i] = False
        with self._lock:
          self.stats["too_long"] += 1
        logging.log_every_n_seconds(logging.WARNING, "symbolic grader: an answer of %d characters (over %d, without a "
                                    "shorter \\boxed{}) counts as not equal unread (so far: %s)", 60, len(pred),
                                    MAX_ANSWER_CHARS, self.stats)
      else:
        ask.append(i)
    for i, v in zip(ask, self._run("equal", [(pairs[i][1], _shortest(pairs[i][0])) for i in ask])):
      verdicts[i] = bool(v)
    return [bool(v) for v in verdicts]

  def parses_many(self, answers: Sequence[str]) -> list[bool]:
    """Whether math-verify reads each answer as an expression (a reference that it cannot read grades nothing)."""
    return [bool(v) for v in self._run("parses", list(answers))]


def _shortest(pred: str) -> str:
  """A long answer's last box (math-verify reads that one first anyway), else the answer."""
  return (math_answer.last_boxed(pred) or pred) if len(pred) > MAX_ANSWER_CHARS else pred


_GRADER: Grader | None = None
_GRADER_LOCK = threading.Lock()


def grader() -> Grader:
  """The process's one grader (its worker starts at the first comparison), closed at exit."""
  global _GRADER
  with _GRADER_LOCK:
    if _GRADER is None:
      _GRADER = Grader()
      atexit.register(_GRADER.close)
    return _GRADER
