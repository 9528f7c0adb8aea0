"""Non-finite losses: the update is skipped and counted; after `rl.max_nonfinite_in_row` the run stops, saved."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.rl import rewards
from grpo_jax.rl import reward_spec
from grpo_jax.run import train


def _always_nan():
  """An in-graph term whose scores are NaN: advantages, loss and gradient become non-finite."""
  def make(ctx):
    return lambda tokens, mask, batch, ctx: reward_spec.outcome(jnp.full((tokens.shape[0],), jnp.nan))
  return make


@pytest.fixture
def nan_term():
  rewards.REGISTRY["test_nan"] = _always_nan()
  yield "test_nan"
  del rewards.REGISTRY["test_nan"]


def _tiny(workdir_steps=5):
  c = config_lib.base_config()
  c.model.update(hidden=32, layers=1, heads=2, kv_heads=1, inter=64, max_len=72)
  c.task.update(prompt_len=48, test_size=16)
  c.sampling.max_new_tokens = 8
  c.rl.update(G=2, prompts_per_step=2, max_nonfinite_in_row=2)
  c.train.update(steps=workdir_steps, eval_every=100, ckpt_every=100, plot_every=0, sample_every=0)
  c.eval.update(size=4, batch=4, n_samples=2, pass_k=(1,))
  c.log.tensorboard = False
  c.log.plots = False
  c.mesh.update(data=1, fsdp=1, tensor=1)
  return c


def test_nonfinite_updates_are_skipped_then_the_run_stops_saved(tmp_path, nan_term):
  c = _tiny()
  c.rewards = ((nan_term, 1.0),)
  with pytest.raises(train.NonFiniteError, match="max_nonfinite_in_row") as e:
    train.run_rl(c, str(tmp_path))
  # the advice names what was non-finite (the reward), not the learning rate
  assert "rewards were non-finite (train/reward" in str(e.value) and "optim.lr" not in str(e.value), e.value
  from grpo_jax.run import metrics as metrics_lib
  rows = [r for r in metrics_lib.read_metrics(str(tmp_path)) if "train/nonfinite_updates" in r]
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r["train/nonfinite_updates"] == 1 and r["train/skipped_updates"] == 1 for r in rows)
  # The last good state (= the initial params: every update was skipped) is saved at the stopping step.
  assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [2]


def test_a_resume_keeps_the_count_of_nonfinite_steps_in_a_row(tmp_path, nan_term):
  """The count of non-finite steps in a row is host state carried between steps: stopped by a signal after 2 of the
  3 allowed, the resumed run stops after its first step, at step 3 as the uninterrupted run does (the count restarted
  at 0 on resume, so the run went on to step 5); rerun once more, it stays stopped."""
  from grpo_jax.infra import errors, signals
  c = _tiny()
  c.rewards = ((nan_term, 1.0),)
  c.rl.max_nonfinite_in_row = 3
  c.train.ckpt_every = 1
  real = train._steps  # pylint: disable=protected-access

  def stop_after_two(guard, mesh, batches, start, steps):
    for item in real(guard, mesh, batches, start, steps):
      if item[0] == 1:  # step 2's batch is out: the check before step 3 stops the loop
        signals.active().request()
      yield item

  train._steps = stop_after_two  # pylint: disable=protected-access
  try:
    with signals.GracefulStop(), pytest.raises(errors.Preempted, match="after step 2"):
      train.run_rl(c, str(tmp_path))
  finally:
    train._steps = real  # pylint: disable=protected-access
  with pytest.raises(train.NonFiniteError, match="3 steps in a row .* saved at step 3"):
    train.run_rl(c, str(tmp_path))
  # the same command again: the run stopped itself at step 3 and stays stopped, as it would have without the signal
  # (it trained one more non-finite step and stopped again at step 4); no step is taken, logged or saved
  with pytest.raises(train.NonFiniteError, match="3 steps in a row .* saved at step 3"):
    train.run_rl(c, str(tmp_path))
  from grpo_jax.run import metrics as metrics_lib
  assert [r["step"] for r in metrics_lib.read_metrics(str(tmp_path)) if "train/loss" in r] == [1, 2, 3]
  assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())[-1] == 3
