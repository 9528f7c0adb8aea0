"""PPO with a critic — the source article's four-network baseline — as one jitted step.

Policy, reference, reward (the task's verifiers) and a critic: either a separate value network (its own transformer,
initialised from the policy, doubling trainable memory as the article says) or a scalar value head on the policy's
own trunk. Per-token reward = −β·k1(π_old, π_ref) plus the outcome at the last valid token; GAE(γ, λ);
advantages whitened over valid tokens; clipped surrogate; clipped value loss; the critic has its own optimizer state.
"""
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from grpo_jax.config import presets
from grpo_jax.rl import advantages
from grpo_jax.rl import auto
from grpo_jax.rl import losses
from grpo_jax.model import lora
from grpo_jax.model import model as model_lib
from grpo_jax.rl import reward_spec
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rl import state as state_lib
from grpo_jax.rl import update as update_lib


def init_critic(mcfg: model_lib.ModelConfig, mode: str, rng: jax.Array, policy_params=None) -> dict:
  """'separate': a value network initialised from the policy (as in RLHF practice); 'head': only the head.
  With LoRA the separate critic is its own adapters (fresh, B = 0) on the policy's frozen base: its trunk starts
  as the base's, and no second copy of the model exists."""
  head = {"kernel": jnp.zeros((mcfg.hidden,), jnp.float32), "bias": jnp.zeros((), jnp.float32)}
  if mode == "head":
    return {"v_head": head}
  if mcfg.lora is not None:
    return {"body": lora.init_adapters(mcfg, rng), "v_head": head}
  body = policy_params if policy_params is not None else model_lib.init_params(mcfg, rng)
  return {"body": body, "v_head": head}


def critic_axes(mcfg: model_lib.ModelConfig, mode: str) -> dict:
  head = {"kernel": P("embed"), "bias": P()}
  if mode == "head":
    return {"v_head": head}
  return {"body": lora.adapter_axes(mcfg) if mcfg.lora is not None else model_lib.param_axes(mcfg), "v_head": head}


def critic_model(state: dict, critic_params: dict) -> dict:
  """The critic as values_and_logprobs reads it: a LoRA critic's body is its adapters on the state's base."""
  if "base" not in state or "body" not in critic_params:
    return critic_params
  return dict(critic_params, body=lora.combine(state["base"], critic_params["body"]))


def values_and_logprobs(mcfg, mode, policy_params, critic_params, seq, P_len: int, temperature: float,
                        want_logp: bool = True, packed: bool = False):
  """V(s_t) for the state that predicts completion token t, plus the policy's log-probs and entropies.

  With a value head the trunk is run once for both; a separate critic runs its own trunk. A `packed` seq
  (rl/packing.py) gives all three at every position, aligned to the token they score (column 0: 0).
  """
  tokens_NxT, positions_NxT, mask_NxT = seq
  h_pol, head_DxV = model_lib.hidden_states(mcfg, policy_params, tokens_NxT, positions_NxT, mask_NxT, packed)
  h_val = h_pol if mode == "head" else model_lib.hidden_states(
      mcfg, critic_params["body"], tokens_NxT, positions_NxT, mask_NxT, packed)[0]
  vh = critic_params["v_head"]
  v_NxT = jnp.einsum("ntd,d->nt", h_val.astype(jnp.float32), vh["kernel"]) + vh["bias"]
  if packed:
    v_NxT = jnp.pad(v_NxT[:, :-1], ((0, 0), (1, 0)))  # column t-1's state scores token t, as below
    if not want_logp:
      return v_NxT, None, None
    return (v_NxT,) + model_lib.logprobs_from_hidden(mcfg, h_pol, head_DxV, tokens_NxT, temperature)
  # Column t-1's hidden state predicts token t: shift exactly like the log-probs.
  v_NxL = v_NxT[:, P_len - 1:-1]
  if not want_logp:
    return v_NxL, None, None
  # The LM head only on the L positions that predict completion tokens.
  logp_NxL, ent_NxL = model_lib.target_logprobs(mcfg, h_pol[:, P_len - 1:-1], head_DxV, tokens_NxT[:, P_len:],
                                                temperature)
  return v_NxL, logp_NxL, ent_NxL


def critic(config, mcfg: model_lib.ModelConfig) -> state_lib.Critic:
  """THE critic set-up: its layout (config.ppo.critic), init from the policy, axes and optimizer (ppo.critic_lr)."""
  mode = config.ppo.critic
  return state_lib.Critic(init=functools.partial(init_critic, mcfg, mode), axes=critic_axes(mcfg, mode),
                          opt=update_lib.make_optimizer(config.optim, lr=config.ppo.critic_lr))


def make_objective(config) -> Callable:
  """((v_NxL, logp_NxL, ent_NxL), minibatch) -> (clipped surrogate + vf_coef · clipped value loss, aux)."""
  rl, ppo, L = config.rl, config.ppo, config.sampling.max_new_tokens
  # the GRPO family's policy-loss settings (objective, token selection, clip range); the KL is in PPO's reward
  policy_kw = dict(rl_step.policy_loss_kwargs(config), beta=0.0)

  def objective(out, mb):
    v_NxL, logp_NxL, ent_NxL = out
    pl, m = losses.policy_loss(logp_NxL, rl_step.old_logp(config, logp_NxL, mb), None, mb["adv_NxL"],
                               mb["mask_NxL"], is_w_NxL=mb.get("is_w_NxL"), ent_NxL=ent_NxL,
                               select_u_NxL=rl_step.select_uniforms(mb), **policy_kw)
    vl, vm = losses.value_loss(v_NxL, mb["old_v_NxL"], mb["returns_NxL"], mb["mask_NxL"], clip=ppo.value_clip,
                               agg=rl.loss_agg, norm_len=L)
    m = update_lib.no_tokens_nan(dict(m, **vm, value_loss=vl, entropy=rl_step.masked_mean(ent_NxL, mb["mask_NxL"])),
                                 mb["mask_NxL"])
    return pl + ppo.vf_coef * vl, m
  return objective


def make_forward(config, mcfg, P_len: int) -> Callable:
  """((policy params, critic params), seq, packed) -> (values, log-probs, entropies)."""
  mode, temp = config.ppo.critic, config.sampling.temperature
  return lambda both, seq, packed: values_and_logprobs(mcfg, mode, both[0], both[1], seq, P_len, temp,
                                                       packed=packed)


def advantages_and_returns(config, ro: rollout_lib.Rollout, old_v_NxL) -> tuple[jax.Array, jax.Array]:
  """Per-token reward −β·KL(π_old, π_ref) (rl.kl_estimator: k1 in the ppo preset) plus the outcome at the last
  valid token; GAE; advantages whitened over the batch's valid tokens."""
  mask = ro.mask_NxL
  kl_NxL = jnp.zeros_like(mask) if ro.ref_logp_NxL is None else losses.kl_estimate(
      config.rl.kl_estimator, ro.old_logp_NxL, ro.ref_logp_NxL, k3_clamp=config.rl.kl_clamp) * mask
  # the row's last valid token, for any mask: a multi-turn row's observation tokens are 0 inside it (tools.env)
  last_NxL = advantages.last_valid_token(mask)
  rewards_NxL = -config.rl.beta * kl_NxL + ro.r_N[:, None] * last_NxL
  adv_NxL, returns_NxL = advantages.gae(rewards_NxL, old_v_NxL, mask, gamma=config.ppo.gamma, lam=config.ppo.lam)
  return advantages.masked_whiten(adv_NxL, mask, eps=1e-8), returns_NxL


# ------------------------------------------------------------------------------------- the family's interface


optimizer = rl_step.optimizer  # the policy's AdamW from the `optim` group, as in the GRPO family


def layout(config, mcfg: model_lib.ModelConfig) -> state_lib.Layout:
  """Policy, frozen reference (β > 0 only), AdamW state, and the critic with its own AdamW state."""
  return state_lib.Layout(optimizer(config), ref=state_lib.uses_reference(config), critic=critic(config, mcfg))


state_spec, init = state_lib.spec_and_init(layout)


def build_step(config, mcfg: model_lib.ModelConfig, spec: reward_spec.RewardSpec,
               tokenizer) -> Callable[[dict, dict], tuple[dict, dict]]:
  """The pure, un-jitted `(state, batch) -> (state, metrics)` of PPO with a critic."""
  rl_step.check_preset(config)
  auto.check_resolved(config)  # rl.minibatches / rl.rollout_chunks = 0 (auto) have no default
  if config.rl.get("partial_rollouts", False):  # validation's refusal, for a step built without validation
    raise auto.ConfigError(f"config.rl.partial_rollouts: {presets.carry_refusal(config.rl.algo)}")
  rollout_fn = rollout_lib.make_rollout_fn(config, mcfg, spec, tokenizer)
  opts = (optimizer(config), critic(config, mcfg).opt)
  temp = config.sampling.temperature

  def step(state, batch):
    P_len = batch["prompt_NxP"].shape[1]
    rng, k_roll, k_upd = jax.random.split(state["rng"], 3)
    ro = rollout_fn(state_lib.model_params(state), rl_step.reference_params(config, state), batch, k_roll)
    # The critic's forward over the rollout, on the update's training length, in the rollout's row chunks.
    old_v_NxL = rollout_lib.forwards_by_length(
        config, lambda seq, packed: values_and_logprobs(mcfg, config.ppo.critic, state_lib.model_params(state),
                                                        critic_model(state, state["critic_params"]), seq, P_len,
                                                        temp, want_logp=False, packed=packed)[0],
        ro.bucket, ro.seq, P_len)
    old_v_NxL = jax.lax.stop_gradient(old_v_NxL) * ro.mask_NxL
    adv_NxL, returns_NxL = advantages_and_returns(config, ro, old_v_NxL)
    # the rollout correction's weight and mask (rl_step.training_data); the reference log-probs are not read here
    data, corr_metrics = rl_step.training_data(config, ro, adv_NxL)
    data.pop("ref_logp_NxL", None)
    data.update(old_v_NxL=old_v_NxL, returns_NxL=returns_NxL)
    carry = ((state["params"], state["critic_params"]), (state["opt_state"], state["critic_opt_state"]))
    fwd = make_forward(config, mcfg, P_len)
    forward = lambda ps, seq, packed: fwd((state_lib.model_params(state, ps[0]), critic_model(state, ps[1])), seq,
                                          packed)
    update = rl_step.make_train_update(config, forward, make_objective(config), opts, P_len)
    ((params, critic_params), (opt_state, critic_opt)), um = rl_step.train_by_length(
        config, update, carry, data, k_upd, ro.bucket, P_len)
    updated = dict(params=params, opt_state=opt_state, critic_params=critic_params, critic_opt_state=critic_opt,
                   rng=rng)
    return rl_step.finish_step(config, state, updated, ro, adv_NxL, um, corr_metrics)

  return step
