"""PPO with a critic — the source article's four-network baseline — as one jitted step.

Policy, reference, reward (the task's verifiers) and a critic: either a separate value network (its own transformer,
initialised from the policy, doubling trainable memory as the article says) or a scalar value head on the policy's
own trunk. Per-token reward = −β·KL(π_old, π_ref) (rl.kl_estimator, k1 in the ppo preset) plus the outcome at the
last token; GAE(γ, λ); advantages whitened over valid tokens; clipped surrogate (dual-clipped); clipped value loss;
the critic has its own optimizer state.
"""
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from grpo_jax import advantages
from grpo_jax import losses
from grpo_jax import model as model_lib
from grpo_jax import rl_step
from grpo_jax import sharding
from grpo_jax import state as state_lib


def init_critic(mcfg: model_lib.ModelConfig, mode: str, rng: jax.Array, policy_params=None) -> dict:
  """'separate': a value network initialised from the policy (as in RLHF practice); 'head': only the head."""
  head = {"kernel": jnp.zeros((mcfg.hidden,), jnp.float32), "bias": jnp.zeros((), jnp.float32)}
  if mode == "head":
    return {"v_head": head}
  body = policy_params if policy_params is not None else model_lib.init_params(mcfg, rng)
  return {"body": body, "v_head": head}


def critic_axes(mcfg: model_lib.ModelConfig, mode: str) -> dict:
  head = {"kernel": P("embed"), "bias": P()}
  return {"v_head": head} if mode == "head" else {"body": model_lib.param_axes(mcfg), "v_head": head}


def values_and_logprobs(mcfg, mode, policy_params, critic_params, seq, P_len: int, temperature: float,
                        want_logp: bool = True):
  """V(s_t) for the state that predicts completion token t, plus the policy's log-probs and entropies.

  With a value head the trunk is run once for both; a separate critic runs its own trunk.
  """
  tokens_NxT, positions_NxT, mask_NxT = seq
  h_pol, head_DxV = model_lib.hidden_states(mcfg, policy_params, tokens_NxT, positions_NxT, mask_NxT)
  h_val = h_pol if mode == "head" else model_lib.hidden_states(
      mcfg, critic_params["body"], tokens_NxT, positions_NxT, mask_NxT)[0]
  vh = critic_params["v_head"]
  v_NxT = jnp.einsum("ntd,d->nt", h_val.astype(jnp.float32), vh["kernel"]) + vh["bias"]
  # Column t-1's hidden state predicts token t: shift exactly like the log-probs.
  v_NxL = v_NxT[:, P_len - 1:-1]
  if not want_logp:
    return v_NxL, None, None
  # The LM head only on the L positions that predict completion tokens.
  logp_NxL, ent_NxL = model_lib.target_logprobs(mcfg, h_pol[:, P_len - 1:-1], head_DxV, tokens_NxT[:, P_len:],
                                                temperature)
  return v_NxL, logp_NxL, ent_NxL


def make_ppo_step(config, mesh, mcfg, tx, critic_tx, spec, tokenizer) -> Callable:
  rl_step.check_preset(config)
  rl, ppo, temp = config.rl, config.ppo, config.sampling.temperature
  rollout_fn = rl_step.make_rollout_fn(config, mcfg, spec, tokenizer)
  mode = ppo.critic

  def loss_fn(both, mb):
    policy_params, critic_params = both
    v_NxL, logp_NxL, ent_NxL = values_and_logprobs(mcfg, mode, policy_params, critic_params, mb["seq"], mb["P"],
                                                   temp)
    pl, m = losses.policy_loss(logp_NxL, mb["old_logp_NxL"], None, mb["adv_NxL"], mb["mask_NxL"],
                               eps_low=rl.eps_low, eps_high=rl.eps_high, beta=0.0, agg=rl.loss_agg,
                               norm_len=config.sampling.max_new_tokens, ratio_level=rl.ratio_level,
                               dual_clip=rl.dual_clip)
    vl, vm = losses.value_loss(v_NxL, mb["old_v_NxL"], mb["returns_NxL"], mb["mask_NxL"], clip=ppo.value_clip,
                           agg=rl.loss_agg, norm_len=config.sampling.max_new_tokens)
    m = dict(m, **vm, value_loss=vl, entropy=rl_step.masked_mean(ent_NxL, mb["mask_NxL"]))
    return pl + ppo.vf_coef * vl, m

  def update(carry, rows, data, P_len):
    params, opt_state, critic_params, critic_opt = carry
    mb = jax.tree.map(lambda x: sharding.constrain_batch(jnp.take(x, rows, axis=0)), data)
    mb["P"] = P_len
    (loss, m), (g_pol, g_crit) = jax.value_and_grad(loss_fn, has_aux=True)((params, critic_params), mb)
    gnorm = optax.global_norm(g_pol)
    upd, new_opt = tx.update(g_pol, opt_state, params)
    c_upd, new_copt = critic_tx.update(g_crit, critic_opt, critic_params)
    new = (optax.apply_updates(params, upd), new_opt, optax.apply_updates(critic_params, c_upd), new_copt)
    finite = jnp.isfinite(loss) & jnp.isfinite(gnorm) & jnp.isfinite(optax.global_norm(g_crit))
    old = (params, opt_state, critic_params, critic_opt)
    new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    m.update(loss=loss, grad_norm=gnorm, nonfinite=1 - finite.astype(jnp.int32),
             update_norm=jnp.where(finite, optax.global_norm(upd), 0.0))
    return new, m

  def step(state, batch):
    rng, k_roll, k_upd = jax.random.split(state["rng"], 3)
    ro = rollout_fn(state["params"], state["ref_params"], batch, k_roll)
    mask = ro["mask_NxL"]
    P_len = ro["P"]
    old_v_NxL, _, _ = values_and_logprobs(mcfg, mode, state["params"], state["critic_params"], ro["seq"], P_len,
                                          temp, want_logp=False)
    old_v_NxL = jax.lax.stop_gradient(old_v_NxL) * mask
    kl_NxL = losses.kl_estimate(rl.kl_estimator, ro["old_logp_NxL"], ro["ref_logp_NxL"],
                                k3_clamp=rl.kl_clamp) * mask
    last_NxL = jax.nn.one_hot(jnp.maximum(mask.sum(-1).astype(jnp.int32) - 1, 0), mask.shape[1]) * mask
    rewards_NxL = -rl.beta * kl_NxL + ro["r_N"][:, None] * last_NxL
    adv_NxL, returns_NxL = advantages.gae(rewards_NxL, old_v_NxL, mask, gamma=ppo.gamma, lam=ppo.lam)
    mean = rl_step.masked_mean(adv_NxL, mask)
    std = jnp.sqrt(rl_step.masked_mean(jnp.square(adv_NxL - mean), mask))
    adv_NxL = (adv_NxL - mean) / (std + 1e-8) * mask
    data = dict(seq=ro["seq"], old_logp_NxL=ro["old_logp_NxL"], adv_NxL=adv_NxL, mask_NxL=mask,
                old_v_NxL=old_v_NxL, returns_NxL=returns_NxL)
    N = mask.shape[0]

    def epoch(carry, key):
      perm = jax.random.permutation(key, N).reshape(rl.minibatches, N // rl.minibatches)
      return jax.lax.scan(functools.partial(update, data=data, P_len=P_len), carry, perm)

    carry = (state["params"], state["opt_state"], state["critic_params"], state["critic_opt_state"])
    carry, um = jax.lax.scan(epoch, carry, jax.random.split(k_upd, rl.mu))
    params, opt_state, critic_params, critic_opt = carry
    um = jax.tree.map(lambda x: x.reshape(-1), um)
    reward_ok = jnp.all(ro["status"] == 0)
    new_state = dict(state, params=params, opt_state=opt_state, critic_params=critic_params,
                     critic_opt_state=critic_opt, step=state["step"] + 1, rng=rng)
    new_state = jax.tree.map(lambda a, b: jnp.where(reward_ok, a, b), new_state, state)
    m = rl_step.rollout_metrics(config, ro, adv_NxL)
    for k in ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean", "entropy", "loss", "grad_norm",
              "update_norm", "value_loss"):
      m[f"train/{k}"] = um[k].mean()
    m["train/ratio_max"] = um["ratio_max"].max()
    m["train/nonfinite_updates"] = um["nonfinite"].sum()
    m["train/skipped_updates"] = um["nonfinite"].sum() + (1 - reward_ok.astype(jnp.int32)) * um["nonfinite"].size
    m["train/param_norm"] = optax.global_norm(new_state["params"])
    m["reward_status"] = ro["status"]
    n_show = config.train.num_samples_logged
    m["samples/tokens_NxL"] = ro["tokens_NxL"][:n_show]
    m["samples/mask_NxL"] = ro["mask_NxL"][:n_show]
    m["samples/r_N"] = ro["r_N"][:n_show]
    return new_state, m

  abstract_critic = jax.eval_shape(lambda: init_critic(mcfg, mode, jax.random.PRNGKey(0)))
  _, shard = state_lib.state_shardings(mesh, mcfg, tx, True, (abstract_critic, critic_axes(mcfg, mode), critic_tx))

  return sharding.jit_step(step, mesh, shard)
