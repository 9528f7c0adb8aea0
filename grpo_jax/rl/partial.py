"""Partial rollouts in the step (rollout/carry.py holds the rows): which carried tokens the update trains — the
staleness bound — and the metrics of the carry's schedule."""
import jax
import jax.numpy as jnp

from grpo_jax.model import model_config
from grpo_jax.rl import auto
from grpo_jax.rl import plan_terms
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rollout import carry as carry_lib


def _slots_per_device(config, ctx: auto.Context) -> int:
  rl = config.rl
  slots = int(config.sampling.get("slots", 0)) or rl.prompts_per_step * rl.G
  return max(slots // max(ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1), 1), 1)


def _check_carry(c, ctx: auto.Context) -> None:
  """What the resolved config must give the carry: a set rl.carry_kv_groups dividing each device's slots
  (carry.check), and a table that fits the device's memory by itself (the state holds it: plan_terms.carry_bytes)."""
  g, per = int(c.rl.carry_kv_groups), _slots_per_device(c, ctx)
  if g and per % g:
    raise auto.ConfigError(f"config.rl.carry_kv_groups: {g} must divide each device's {per} slots (sampling.slots "
                           f"over mesh data*fsdp); set a divisor of {per}, or 0 (auto: the most up to 8 that do).")
  if ctx.hbm_bytes is None:
    return
  need = sum(plan_terms.carry_bytes(c, model_config.ModelConfig.from_config(c.model), ctx.mesh).values())
  if need > ctx.hbm_bytes:
    raise auto.ConfigError(
        f"config.rl.max_staleness: the rollout carry's table of (1 + {c.rl.max_staleness}) x {c.rl.prompts_per_step} "
        f"groups alone needs {auto.size(need)} per device, more than its {auto.size(ctx.hbm_bytes)}; lower "
        "rl.max_staleness (or rl.prompts_per_step, rl.G, sampling.max_new_tokens), or add devices (mesh.fsdp).")


# rl.carry_kv_groups: how many groups of a device's slots read the completion KV, each to its own longest row
auto.register(auto.Knob(
    "rl.carry_kv_groups", applies=lambda c: bool(c.rl.get("partial_rollouts", False)),
    candidates=lambda c, ctx: [g for g in (1, 2, 4, 8) if _slots_per_device(c, ctx) % g == 0],
    choose=lambda c, ctx, cands: (carry_lib.kv_groups(0, _slots_per_device(c, ctx), 1),
                                  "the most up to 8 dividing a device's slots: a long row costs its group's KV read"),
    check=_check_carry))


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
