"""Next-token SFT / pre-training as one jitted step over the same state and model as RL (no reference).

Under model.lora an SFT stage trains the full weights unless `sft.lora` (then it trains adapters on the frozen base,
like the RL stage; its final params are the merged model): `model_config` says which."""
import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections

from grpo_jax.model import model as model_lib
from grpo_jax.infra import sharding
from grpo_jax.rl import state as state_lib
from grpo_jax.rl import update as update_lib


def sft_loss(mcfg, params, batch) -> tuple[jax.Array, dict]:
  """Mean next-token NLL over `loss_mask_NxT` (completion tokens for SFT, all real tokens for pre-training; an
  environment's observation tokens carry 0: attended to, never trained on)."""
  h_NxTxD, head_DxV = model_lib.hidden_states(mcfg, params, batch["tokens_NxT"], batch["positions_NxT"],
                                              batch["mask_NxT"])
  return head_loss(mcfg, h_NxTxD, head_DxV, batch)


def head_loss(mcfg, h_NxTxD: jax.Array, head_DxV: jax.Array, batch) -> tuple[jax.Array, dict]:
  """`sft_loss` from the final hidden states (model.token_logprobs' two halves): the logits at t-1 are
  h[:, t-1] @ head, so a token with loss mask 0 gives its logits exactly 0 gradient (tests/test_r1_tools.py)."""
  logp_NxT, _ = model_lib.logprobs_from_hidden(mcfg, h_NxTxD, head_DxV, batch["tokens_NxT"], 1.0)
  # logp_NxT[:, t] scores token t given < t, so column 0 (no context) never counts.
  w_NxT = batch["loss_mask_NxT"].astype(jnp.float32).at[:, 0].set(0.0)
  n = jnp.maximum(w_NxT.sum(), 1.0)
  loss = -jnp.sum(logp_NxT * w_NxT) / n
  return loss, {"tokens": w_NxT.sum()}


# ------------------------------------------------------------------------------------- the family's interface


def optimizer(config) -> update_lib.Optimizer:
  """The `optim` group's AdamW with SFT's own learning rate and warm-up (sft.lr, sft.warmup_steps)."""
  optim = ml_collections.ConfigDict(config.optim.to_dict())
  optim.update(lr=config.sft.lr, warmup_steps=config.sft.warmup_steps)
  return update_lib.make_optimizer(optim)


def model_config(config, mcfg: model_lib.ModelConfig) -> model_lib.ModelConfig:
  """The model SFT trains: `mcfg` with its LoRA adapters only when sft.lora is set (default: full weights)."""
  return mcfg if config.sft.get("lora", False) else dataclasses.replace(mcfg, lora=None)


def layout(config, mcfg: model_lib.ModelConfig) -> state_lib.Layout:
  """Params and AdamW state only: SFT has no reference."""
  return state_lib.Layout(optimizer(config), ref=False)


state_spec, init = state_lib.spec_and_init(layout)


def build_step(config, mcfg: model_lib.ModelConfig) -> Callable[[dict, dict], tuple[dict, dict]]:
  """The pure, un-jitted `(state, batch) -> (state, metrics)`: one AdamW update on the batch's loss tokens."""
  opt = optimizer(config)

  def step(state, batch):
    batch = {k: sharding.constrain_batch(v) for k, v in batch.items()}
    loss = lambda ps, b: sft_loss(mcfg, state_lib.model_params(state, ps[0]), b)  # LoRA: adapters on the base
    (params,), (opt_state,), um = update_lib.gradient_step(loss, (opt,),
                                                           (state["params"],), (state["opt_state"],), batch)
    return (dict(state, params=params, opt_state=opt_state, step=state["step"] + 1),
            update_lib.step_metrics(um, params))

  return step
