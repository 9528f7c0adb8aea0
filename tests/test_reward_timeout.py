"""A Python reward that hangs cannot hang the run: the call times out, its thread is abandoned (a daemon), later
calls get a fresh worker, and the process exits however many calls are still stuck."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from grpo_jax.infra import errors
from grpo_jax.rl import rewards
from grpo_jax.rl import reward_spec
from grpo_jax.tasks import digits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(n=2):
  return np.ones((n, 3), np.int32) * 5, np.ones((n, 3), np.int32)


def test_timed_out_calls_are_abandoned_and_capped():
  gate = threading.Event()
  calls = []

  def sometimes_hangs(texts, ids, batch):
    calls.append(len(texts))
    if len(calls) % 2:  # every other call hangs until the test ends
      gate.wait()
    return [1.0] * len(texts)

  term = rewards.PythonTerm("flaky", sometimes_hangs, digits.Tokenizer(8), fallback=0.0, timeout_s=0.2)
  try:
    t0 = time.perf_counter()
    r, status, fb = term.host(*_rows(), {})  # hangs -> fallback
    assert int(status) == reward_spec.OK and int(fb) == 2 and list(r) == [0.0, 0.0]
    assert time.perf_counter() - t0 < 2.0
    r, status, fb = term.host(*_rows(), {})  # a fresh worker answers at once
    assert int(status) == reward_spec.OK and int(fb) == 0 and list(r) == [1.0, 1.0]
    assert term.hung_calls() == 1
    hung = [t for t in threading.enumerate() if t.name == "reward-flaky" and t.is_alive()]
    assert hung and all(t.daemon for t in hung)
    for _ in range(2 * rewards.PythonTerm.MAX_HUNG):
      _, status, _ = term.host(*_rows(), {})
    # Beyond MAX_HUNG stuck calls the term fails even with a fallback: threads must not pile up for ever.
    assert int(status) == reward_spec.TIMEOUT and term.hung_calls() == rewards.PythonTerm.MAX_HUNG
    msg = term.error_message(int(status))
    assert "still running" in msg
    # the fallback is set already: the advice is about the hanging calls, not "set config.rl.reward_fallback"
    assert "reward_fallback=0.0 is set but does not cover calls that keep hanging" in msg
    assert "set config.rl.reward_fallback to a float" not in msg
    # the stuck calls return: their threads end, and the term answers again (they were counted hung for ever: after
    # MAX_HUNG timeouts in a run's life every later call failed as a whole, "still running")
    gate.set()
    deadline = time.monotonic() + 10
    while term.hung_calls() and time.monotonic() < deadline:
      time.sleep(0.01)
    assert term.hung_calls() == 0
    r, status, fb = term.host(*_rows(), {})
    assert int(status) == reward_spec.OK and int(fb) == 0 and list(r) == [1.0, 1.0]
  finally:
    gate.set()
    term.close()


def test_timeout_must_be_positive():
  for bad in (0, -1.0, float("nan"), float("inf"), "2"):
    with pytest.raises(errors.ConfigError, match="config.rl.reward_timeout_s"):
      rewards.PythonTerm("x", lambda *a: [], digits.Tokenizer(8), timeout_s=bad)
  # finite but past threading.TIMEOUT_MAX: every call failed with OverflowError (the run stopped naming the term)
  term = rewards.PythonTerm("x", lambda t, i, b: [1.0] * len(t), digits.Tokenizer(8), timeout_s=1e39)
  r, status, _ = term.host(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32), {})
  assert int(status) == reward_spec.OK and r.tolist() == [1.0, 1.0], term.last_error
  term.close()


_HANG_SCRIPT = r'''
import sys, threading, time
import numpy as np
from grpo_jax.rl import rewards
from grpo_jax.tasks import digits
def hang(texts, ids, batch):
  threading.Event().wait()  # never returns
term = rewards.PythonTerm("hang", hang, digits.Tokenizer(8), fallback=0.0, timeout_s=0.5)
for _ in range(2):
  print(term.host(np.ones((2, 3), np.int32), np.ones((2, 3), np.int32), {})[2], flush=True)
print("END", time.time(), flush=True)
'''


def test_process_exits_with_hung_reward_threads():
  """Two calls stuck for ever (with a fallback the run goes on): the interpreter still exits at once (a
  ThreadPoolExecutor would join them at exit and hang)."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  p = subprocess.Popen([sys.executable, "-c", _HANG_SCRIPT], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
  try:
    out, _ = p.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    p.kill()
    raise AssertionError("the process hung on its abandoned reward threads")
  assert p.returncode == 0, out[-2000:]
  end = float(out.split("END ")[1].split()[0])
  assert time.time() - end < 10.0  # exits promptly after its last statement
  assert out.splitlines()[:2] == ["2", "2"]  # both calls fell back for both rows
