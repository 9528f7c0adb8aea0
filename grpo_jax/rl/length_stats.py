"""Length statistics of a rollout: the R1-Zero "aha" picture (does reasoning grow, and does it pay within a group?).

Pure functions on arrays; rl_step.rollout_metrics logs them every step (train/completion_len_p90,
train/len_acc_corr, train/len_acc_corr_frac, train/completion_len_correct / _incorrect).
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
  fraction says how many groups the mean is over (0 when none: the mean is then NaN, not a measured 0 that the R1
  report's first/last-tenth means would average in; they skip NaN).
  """
  x = x_BxG.astype(jnp.float32) - x_BxG.astype(jnp.float32).mean(axis=1, keepdims=True)
  y = y_BxG.astype(jnp.float32) - y_BxG.astype(jnp.float32).mean(axis=1, keepdims=True)
  den_B = jnp.sqrt(jnp.sum(x * x, axis=1) * jnp.sum(y * y, axis=1))
  ok_B = den_B > 0
  corr_B = jnp.where(ok_B, jnp.sum(x * y, axis=1) / jnp.where(ok_B, den_B, 1.0), 0.0)
  n_ok = ok_B.sum()
  return jnp.where(n_ok > 0, corr_B.sum() / jnp.maximum(n_ok, 1), jnp.nan), n_ok / ok_B.shape[0]


def split_by(lengths_N: jax.Array, right_N: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(mean length of the right completions, of the wrong ones); NaN for a side with none (an all-right or all-wrong
  batch): no length was measured there, and a 0 would be averaged in as one by a mean over steps or seeds
  (studies/stats.summarize drops NaN). Whether RL lengthens the answers it rewards, or only the failures grow
  (truncated rambling), is not visible in the overall mean."""
  len_N = lengths_N.astype(jnp.float32)
  right_N = right_N.astype(bool)
  mean = lambda sel: jnp.where(jnp.any(sel), jnp.sum(jnp.where(sel, len_N, 0.0)) / jnp.maximum(jnp.sum(sel), 1),
                               jnp.nan)
  return mean(right_N), mean(~right_N)
