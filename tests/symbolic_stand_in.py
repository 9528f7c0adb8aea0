"""A stand-in for tasks/symbolic.py's worker loop (tests/test_symbolic.py): a spawned worker imports this module, so
it imports nothing but the standard library."""
import os
import time


def serve(conn, timeout_s):
  """A worker whose item 'hang' never returns, 'die' kills it, 'timeout' / 'error' are math-verify giving up;
  anything else is equal."""
  del timeout_s
  conn.send("ready")
  while True:
    request = conn.recv()
    if request is None:
      return
    for item in request[1]:
      if item[0] == "hang":
        time.sleep(600)
      if item[0] == "die":
        os._exit(3)  # pylint: disable=protected-access
      conn.send({"timeout": "TimeoutException: Timeout during comparison", "error": "ValueError: bad"}.get(item[0], True))


def broken(conn, timeout_s):
  """A worker that fails while starting (as one whose math-verify import fails)."""
  raise ImportError("No module named 'math_verify' (stand-in)")
