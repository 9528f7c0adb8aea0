"""SIGTERM, SIGINT and SIGHUP request a graceful stop; repeated signals are absorbed; processes agree on the stop step."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from grpo_jax.infra import signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_sets_the_flag_and_handlers_are_restored(sig):
  before = signal.getsignal(sig)
  with signals.GracefulStop() as stop:
    assert signals.active() is stop and not stop.should_stop()
    os.kill(os.getpid(), sig)  # no KeyboardInterrupt for SIGINT: the handler only sets the flag
    os.kill(os.getpid(), sig)  # a second one is absorbed too
    assert stop.requested and stop.signal_name == signal.Signals(sig).name and stop.should_stop()
    with signals.GracefulStop.ensure() as inner:
      assert inner is stop  # loops join the command's handler instead of installing their own
  assert signal.getsignal(sig) == before and signals.active() is None


_TWO_PROCESS_SCRIPT = r'''
import os, signal, sys
import jax, numpy as np
pid, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(coordinator_address=f'127.0.0.1:{port}', num_processes=2, process_id=pid)
from jax.sharding import NamedSharding, PartitionSpec as P
from grpo_jax.infra import checkpoint
from grpo_jax.infra import signals
mesh = jax.make_mesh((2,), ('d',), devices=jax.devices())
sh = NamedSharding(mesh, P('d'))
def state(s):
  w = np.arange(4, dtype=np.float32) * s
  return {'w': jax.make_array_from_callback(w.shape, sh, lambda i: w[i])}
with signals.GracefulStop() as stop, checkpoint.Checkpointer(directory, save_every=100, keep=2) as ckpt:
  done = 0
  for step in range(20):
    if stop.should_stop():
      break
    if pid == 1 and step == 3:  # only process 1 is preempted, twice
      os.kill(os.getpid(), signal.SIGTERM)
      os.kill(os.getpid(), signal.SIGINT)
    done = step + 1
  ckpt.maybe_save(done, state(done), force=True)  # a collective save: it hangs if the processes disagree
  ckpt.wait()
print(f'STOPPED {pid} {done} signalled={stop.requested}', flush=True)
'''


def test_processes_agree_on_the_stop_step(tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=1")
  procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESS_SCRIPT, str(i), str(port), str(tmp_path / "ck")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=120)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  assert [p.returncode for p in procs] == [0, 0], outs
  assert "STOPPED 0 4 signalled=False" in outs[0], outs[0][-2000:]
  assert "STOPPED 1 4 signalled=True" in outs[1], outs[1][-2000:]
  assert "received again" in outs[1]
  assert "were signalled: stopping here too" in outs[0]
  assert sorted(os.listdir(tmp_path / "ck")) == ["4"]


def test_preempted_line_says_what_was_saved():
  """A loop stopped before its first step saved nothing: its line must not say 'its state is saved' (the chaos
  harness met it in an R1 stage signalled as it started)."""
  from grpo_jax.infra import errors
  assert "before the first step in D; nothing was trained there yet" in str(errors.Preempted("D", 0))
  assert "after step 4 in D; its state is saved" in str(errors.Preempted("D", 4))
  assert "before stage x; finished stages are kept" in str(errors.Preempted("before stage x"))


def test_signals_after_the_command_are_ignored():
  """main and the sweep CLI, once the command is over: a late signal (a second Ctrl-C while the interpreter exits)
  is ignored instead of raising KeyboardInterrupt into the exit."""
  import signal as signal_lib
  from grpo_jax.infra import signals
  names = [s for s in (signal_lib.SIGTERM, signal_lib.SIGINT, getattr(signal_lib, "SIGHUP", None)) if s is not None]
  prev = {s: signal_lib.getsignal(s) for s in names}
  try:
    signals.ignore_from_now()
    assert all(signal_lib.getsignal(s) == signal_lib.SIG_IGN for s in names)
  finally:
    for s, h in prev.items():
      signal_lib.signal(s, h)


_CONSOLE_SCRIPT = r'''
import errno, json, os, sys
from grpo_jax.infra import console, signals
out = {}
if sys.argv[2] == "pipe":
  r, w = os.pipe()
  os.dup2(w, 1)
  os.close(r)  # the reader is gone (`| head` exited): every write to fd 1 fails with EPIPE
else:
  master, tty = os.openpty()
  os.dup2(tty, 1)
  os.close(master)  # the terminal is gone: every write to fd 1 fails with EIO
console.guard_streams()
with signals.GracefulStop() as stop:
  print("a line to a closed console", flush=True)  # raised BrokenPipeError before the guard
  print("and another", flush=True)
  out["inside"] = [stop.requested, stop.signal_name, console.gone()]
  out["fd_write"] = os.write(1, b"a library's own write to fd 1\n")  # XLA's, absl's: fd 1 itself is /dev/null now
with signals.GracefulStop() as later:  # a stop installed after the console closed asks for itself
  out["later"] = later.requested
class Full:  # another OSError (a full disk) is not a closed console: it still raises
  def write(self, text):
    raise OSError(errno.ENOSPC, "No space left on device")
try:
  console._Guarded(Full()).write("x")
  out["enospc"] = "swallowed"
except OSError as e:
  out["enospc"] = e.errno == errno.ENOSPC
print("stderr, not closed, still writes", file=sys.stderr, flush=True)
with open(sys.argv[1], "w") as f:
  json.dump(out, f)
'''


@pytest.mark.parametrize("console,errno_name", [("pipe", "EPIPE"), ("terminal", "EIO")])
def test_a_closed_console_asks_for_a_stop_instead_of_raising(tmp_path, console, errno_name):
  """console._Guarded: a write to a console whose reader is gone points that fd at /dev/null and asks the command's
  GracefulStop for a stop (as SIGHUP), once; the other stream keeps writing; a stop installed later asks for
  itself; another OSError still raises. In a subprocess: the guard rewires fd 1. (tests/test_faults.py runs it
  through the CLI.)"""
  env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  r = subprocess.run([sys.executable, "-c", _CONSOLE_SCRIPT, str(tmp_path / "out.json"), console], env=env,
                     timeout=60, stderr=subprocess.PIPE, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  lines = r.stderr.splitlines()
  assert lines[-1] == "stderr, not closed, still writes", lines
  assert sum(f"the console closed ({errno_name}): finishing the current step" in l for l in lines) == 1, lines
  out = json.load(open(tmp_path / "out.json"))
  assert out == {"inside": [True, f"the console closed ({errno_name})", True], "fd_write": 30, "later": True,
                 "enospc": True}, out
