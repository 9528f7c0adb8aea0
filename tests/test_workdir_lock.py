"""One run per workdir: a live holder refuses a second run with one line naming it; a dead holder's lock is stale."""
import json
import os
import subprocess
import sys
import time

import pytest

from grpo_jax.infra import errors
from grpo_jax.infra import workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_second_holder_is_refused_then_lock_is_free_again(tmp_path):
  first = workdir_lock.WorkdirLock(str(tmp_path / "run"))
  first.acquire_local()
  info = json.loads((tmp_path / "run" / workdir_lock.LOCK_NAME).read_text())
  assert info["pid"] == os.getpid() and info["host"] and info["start"]
  second = workdir_lock.WorkdirLock(str(tmp_path / "run"))  # another open file description: flock conflicts
  with pytest.raises(errors.InputError) as e:
    second.acquire_local()
  msg = str(e.value)
  assert f"pid {os.getpid()}" in msg and "use another --workdir" in msg and "\n" not in msg
  first.release()
  assert not (tmp_path / "run" / workdir_lock.LOCK_NAME).exists()
  second.acquire_local()  # free again
  assert second.stale_previous is None
  second.release()


def test_lock_of_a_killed_process_is_stale_and_taken_over(tmp_path):
  """kill -9 leaves the lock file; the kernel dropped its flock, so the next run takes it and says whose it was."""
  d = str(tmp_path / "run")
  script = ("import sys, time; sys.path.insert(0, %r); from grpo_jax.infra import workdir_lock; "
            "workdir_lock.WorkdirLock(%r).acquire_local(); print('held', flush=True); time.sleep(60)") % (ROOT, d)
  p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
  try:
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(errors.InputError, match=f"pid {p.pid}"):
      workdir_lock.WorkdirLock(d).acquire_local()
  finally:
    p.kill()
    p.wait()
  lock = workdir_lock.WorkdirLock(d)
  lock.acquire_local()
  assert lock.stale_previous["pid"] == p.pid
  assert json.loads((tmp_path / "run" / workdir_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
  lock.release()


def test_object_store_mode_heartbeat_and_staleness(tmp_path):
  """The gs:// mode, exercised on a local path: a fresh lock object refuses, one past its staleness is taken."""
  d = str(tmp_path / "obj")
  a = workdir_lock.WorkdirLock(d, object_store=True, stale_after_s=30, heartbeat_s=0.2, settle_s=0.05)
  a.acquire_local()
  path = tmp_path / "obj" / workdir_lock.LOCK_NAME
  beat0 = json.loads(path.read_text())["heartbeat_unix"]
  time.sleep(0.6)
  assert json.loads(path.read_text())["heartbeat_unix"] > beat0  # the holder refreshes it
  with pytest.raises(errors.InputError, match="refreshed"):
    workdir_lock.WorkdirLock(d, object_store=True, stale_after_s=30, settle_s=0.05).acquire_local()
  a._stop.set()  # the holder "dies": no more heartbeats
  a._thread.join()
  old = json.loads(path.read_text())
  path.write_text(json.dumps(dict(old, heartbeat_unix=time.time() - 100)))
  b = workdir_lock.WorkdirLock(d, object_store=True, stale_after_s=30, heartbeat_s=10, settle_s=0.05)
  b.acquire_local()
  assert b.stale_previous["token"] == old["token"]
  b.release()
  assert not path.exists()


def test_unwritable_workdir_is_an_input_error(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(errors.InputError, match="cannot create the lock|Not a directory|not a directory"):
    workdir_lock.WorkdirLock(str(tmp_path / "file" / "run")).acquire_local()
  assert errors.classify(errors.InputError("x"))[0] == errors.EXIT_INPUT


def test_multi_process_job_gets_process_0s_verdict(tmp_path):
  """2 jax.distributed processes on a workdir held by another run: process 0 is refused the lock and BOTH exit 2
  with its message (process 1 never waits in a collective)."""
  import io
  sys.path.insert(0, os.path.join(ROOT, "launch"))
  import local_multiprocess  # pylint: disable=import-outside-toplevel
  held = workdir_lock.WorkdirLock(str(tmp_path / "run"))
  held.acquire_local()
  log = io.StringIO()
  try:
    rc = local_multiprocess.launch(2, module="grpo_jax.main", args=["--config=configs/grpo_arith.py:runlocal",
                                                                    f"--workdir={tmp_path / 'run'}"],
                                   devices_per_process=1, timeout_s=120, python=sys.executable, out=log)
  finally:
    held.release()
  out = log.getvalue()
  assert rc == 2, out[-3000:]
  for pid in (0, 1):
    assert f"[p{pid}] Error: workdir {tmp_path / 'run'} is in use by another run (pid {os.getpid()}" in out, out
    assert f"[launch] p{pid} exited with 2" in out
