"""Next-token SFT / pre-training as one jitted step over the same state and model as RL."""
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from grpo_jax import model as model_lib
from grpo_jax import sharding
from grpo_jax import state as state_lib


def sft_loss(mcfg, params, batch) -> tuple[jax.Array, dict]:
  """Mean next-token NLL over `loss_mask_NxT` (completion tokens for SFT, all real tokens for pre-training)."""
  logp_NxT, _ = model_lib.token_logprobs(mcfg, params, batch["tokens_NxT"], batch["positions_NxT"],
                                         batch["mask_NxT"], 1.0)
  # logp_NxT[:, t] scores token t given < t, so column 0 (no context) never counts.
  w_NxT = batch["loss_mask_NxT"].astype(jnp.float32).at[:, 0].set(0.0)
  n = jnp.maximum(w_NxT.sum(), 1.0)
  loss = -jnp.sum(logp_NxT * w_NxT) / n
  return loss, {"train/loss": loss, "train/tokens": w_NxT.sum()}


def make_sft_step(mcfg: model_lib.ModelConfig, tx, mesh) -> Callable[[dict, dict], tuple[dict, dict]]:
  def step(state, batch):
    batch = {k: sharding.constrain_batch(v) for k, v in batch.items()}
    (loss, m), grads = jax.value_and_grad(functools.partial(sft_loss, mcfg), has_aux=True)(state["params"], batch)
    gnorm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
    params, opt_state = jax.tree.map(lambda a, b: jnp.where(finite, a, b),
                                     (params, opt_state), (state["params"], state["opt_state"]))
    m.update({"train/grad_norm": gnorm, "train/nonfinite_updates": 1 - finite.astype(jnp.int32)})
    return dict(state, params=params, opt_state=opt_state, step=state["step"] + 1), m

  _, shard = state_lib.state_shardings(mesh, mcfg, tx, with_ref=False)
  return sharding.jit_step(step, mesh, shard)
