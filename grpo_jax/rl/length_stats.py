"""Length statistics of a rollout: the R1-Zero "aha" picture (does reasoning grow, and does it pay within a group?).

Pure functions on arrays; rl_step.rollout_metrics logs them every step (train/completion_len_p90,
train/len_acc_corr, train/len_acc_corr_frac).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def p90(lengths_N: jax.Array) -> jax.Array:
  """The 90th percentile of the completion lengths (linear interpolation, NumPy's default)."""
  return jnp.percentile(lengths_N.astype(jnp.float32), 90.0)


def within_group_corr(x_BxG: jax.Array, y_BxG: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(mean Pearson correlation of x and y over the groups where both vary, fraction of such groups).

  Within groups, not over the batch: GRPO's advantage compares a prompt's G samples with each other, so what RL
  selects is the length that wins inside a group; a batch-wide correlation would mix in how hard each prompt is.
  A group with constant x or y has no correlation (and no advantage when y is the reward): it is left out, and the
  fraction says how many groups the mean is over (0 when none: the mean is then 0).
  """
  x = x_BxG.astype(jnp.float32) - x_BxG.astype(jnp.float32).mean(axis=1, keepdims=True)
  y = y_BxG.astype(jnp.float32) - y_BxG.astype(jnp.float32).mean(axis=1, keepdims=True)
  den_B = jnp.sqrt(jnp.sum(x * x, axis=1) * jnp.sum(y * y, axis=1))
  ok_B = den_B > 0
  corr_B = jnp.where(ok_B, jnp.sum(x * y, axis=1) / jnp.where(ok_B, den_B, 1.0), 0.0)
  n_ok = ok_B.sum()
  return corr_B.sum() / jnp.maximum(n_ok, 1), n_ok / ok_B.shape[0]
