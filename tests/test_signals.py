"""SIGTERM, SIGINT and SIGHUP request a graceful stop; repeated signals are absorbed; processes agree on the stop step."""
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
