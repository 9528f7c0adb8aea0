"""Partial rollouts in the step (rollout/carry.py holds the rows): which carried tokens the update trains — the
staleness bound — and the metrics of the carry's schedule."""
import jax
import jax.numpy as jnp

from grpo_jax.rl import rollout as rollout_lib


def train_mask(ro: rollout_lib.Rollout, version: jax.Array, max_staleness: int) -> tuple[jax.Array, jax.Array]:
  """(loss mask_NxL, lag_NxL): tokens drawn more than `max_staleness` updates before this one (lag = the state's step
  − the token's version) leave the loss — masked, not dropped: their row still counts in its group's rewards, so
  group normalisation stays exact — and are counted in train/stale_masked_frac."""
  lag_NxL = (jnp.asarray(version, jnp.int32) - ro.version_NxL) * (ro.mask_NxL > 0)
  return ro.mask_NxL * (lag_NxL <= max_staleness), lag_NxL


def metrics(ro: rollout_lib.Rollout, lag_NxL: jax.Array, loss_mask_NxL: jax.Array) -> dict[str, jax.Array]:
  """The staleness of the trained tokens and what the carry did (docs/metrics.md)."""
  n = jnp.maximum(jnp.sum(ro.mask_NxL), 1.0)
  cs = ro.carry_stats
  return {
      "train/version_lag_mean": jnp.sum(lag_NxL * ro.mask_NxL) / n,
      "train/version_lag_max": jnp.max(lag_NxL),
      "train/stale_masked_frac": jnp.sum(ro.mask_NxL - loss_mask_NxL) / n,
      "train/carried_rows": cs.carried_rows,
      "train/ready_groups": cs.ready_groups,
      "train/rollout_budget": cs.budget,
      "train/decode_tokens": cs.new_tokens,
  }
