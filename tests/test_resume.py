"""A run killed mid-way and restarted equals an uninterrupted one: metrics.jsonl rows and final params, bit for bit.

Each run is a real `python -m grpo_jax.main` subprocess on the tiny `runlocal` GRPO config (no SFT stage).
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

# 16 new tokens (not the config's 72) and 2 eval samples a prompt: decoding is most of a run's time, and nothing
# here needs long completions. 64 train examples (6 steps x 8 prompts use 48) and 64 test examples (eval reads 32):
# each of the module's 7 runs would read the 20,000-example train split (~0.8 s a run).
ARGS = ["--config=configs/grpo_arith.py:runlocal", "--config.sft.steps=0", "--config.train.steps=6",
        "--config.train.ckpt_every=2", "--config.train.eval_every=3", "--config.train.plot_every=0",
        "--config.eval.size=32", "--config.eval.n_samples=2", "--config.sampling.max_new_tokens=16",
        "--config.task.train_size=64", "--config.task.test_size=64", "--config.log.tensorboard=False",
        "--config.log.plots=False",
        # A one-layer 32-wide model: what is resumed (params, Adam, the data and RNG position) is the same at any
        # width, and a run costs ~20% less than at the config's 2 x 64.
        "--config.model.hidden=32", "--config.model.layers=1", "--config.model.heads=2", "--config.model.kv_heads=1",
        "--config.model.inter=64"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start(workdir, extra=()):
  # Identical programs in every run, compiled once into the suite's persistent cache (tests/conftest.py): the cached
  # executables are the same compiled code, so results stay bitwise equal, and the killed and resumed runs skip
  # ~20 s of compiling each.
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  return subprocess.Popen([sys.executable, "-m", "grpo_jax.main", f"--workdir={workdir}", *ARGS, *extra],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _rows(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _deterministic(rows):
  return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def _final_params(workdir):
  import jax
  import orbax.checkpoint as ocp
  from grpo_jax.infra import checkpoint
  ck = os.path.join(workdir, "checkpoints")
  step = max(int(d) for d in os.listdir(ck) if d.isdigit())
  restored = ocp.StandardCheckpointer().restore(os.path.join(ck, str(step), checkpoint.STATE))
  return jax.tree.leaves(restored["params"])


def _wait_for_step(proc, workdir, step, timeout=120):
  t0 = time.time()
  while time.time() - t0 < timeout:
    if any(r["step"] >= step and "train/loss" in r for r in _rows(workdir)):
      return
    if proc.poll() is not None:
      raise AssertionError(f"run ended early:\n{proc.stdout.read()[-3000:]}")
    time.sleep(0.05)
  raise AssertionError("timed out waiting for the run to reach step %d" % step)


def _wait_for_committed_checkpoint(proc, workdir, step, timeout=120):
  # Orbax writes into a temporary directory and renames it to the bare step number when the save commits.
  ck = os.path.join(workdir, "checkpoints")
  t0 = time.time()
  while time.time() - t0 < timeout:
    if os.path.isdir(ck) and any(n.isdigit() and int(n) >= step for n in os.listdir(ck)):
      return
    if proc.poll() is not None:
      raise AssertionError(f"run ended early:\n{proc.stdout.read()[-3000:]}")
    time.sleep(0.05)
  raise AssertionError("timed out waiting for a committed checkpoint at step >= %d" % step)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp("full"))
  p = _start(wd)
  out, _ = p.communicate(timeout=300)
  assert p.returncode == 0, out[-3000:]
  return wd


# SIGTERM alone is the first half of the SIGTERM-then-SIGINT case (same preemption path, same assertions), so it has
# no case of its own: every signal still starts the preemption path once, and the second-signal case covers both.
# SIGINT first is test_faults' Ctrl-C during SFT; SIGHUP (a closed terminal) takes the same path.
@pytest.mark.parametrize("sig,second", [(signal.SIGKILL, None), (signal.SIGHUP, None),
                                        (signal.SIGTERM, signal.SIGINT)])
def test_killed_run_resumes_exactly(uninterrupted, tmp_path, sig, second):
  wd = str(tmp_path)
  p = _start(wd)
  _wait_for_step(p, wd, 3)
  # The step-2 save is asynchronous: on a loaded machine it can still be in flight when step 3's row lands, and a
  # SIGKILL then leaves no committed checkpoint (a fresh start, correctly, but not the resume this test is about).
  _wait_for_committed_checkpoint(p, wd, 2)
  p.send_signal(sig)
  if second is not None:  # a second signal while the run finishes its step and saves: absorbed, no torn save
    time.sleep(0.1)
    p.send_signal(second)
  out, _ = p.communicate(timeout=120)
  if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    # Preemption (Ctrl-C too): finish the step, save, exit 0, one line saying how to resume.
    assert p.returncode == 0, out[-3000:]
    assert f"{sig.name} received" in out and "Preempted:" in out and "Traceback" not in out
    if second is not None:
      assert "received again" in out
    ck = os.path.join(wd, "checkpoints")
    assert not [n for n in os.listdir(ck) if "tmp" in n], os.listdir(ck)
  else:
    assert p.returncode != 0
  assert len(_rows(wd)) < len(_rows(uninterrupted)) or sig != signal.SIGKILL
  p = _start(wd)
  out, _ = p.communicate(timeout=300)
  assert p.returncode == 0, out[-3000:]
  assert "Resumed from" in out
  assert _deterministic(_rows(wd)) == _deterministic(_rows(uninterrupted))
  for a, b in zip(_final_params(wd), _final_params(uninterrupted)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
