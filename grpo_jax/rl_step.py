"""The critic-free RL iteration (GRPO family) as ONE jitted, sharded function `(state, batch) -> (state, metrics)`.

rollout (scan decoder) → rewards (in-graph or pure_callback) → advantages (by name) → reference log-probs →
μ epochs × minibatches of clipped updates (lax.scan) → metrics. PPO with a critic lives in `ppo_step.py`.
"""
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from grpo_jax import advantages
from grpo_jax import config_lib
from grpo_jax import losses
from grpo_jax import model as model_lib
from grpo_jax import presets
from grpo_jax import rewards as rewards_lib
from grpo_jax import sampling
from grpo_jax import sharding
from grpo_jax import state as state_lib

PROMPT_KEYS = ("prompt_NxP", "prompt_mask_NxP")


def tile_batch(batch: dict, G: int) -> dict:
  """Repeats every per-prompt field G times so row i belongs to group i // G."""
  return {k: sharding.constrain_batch(jnp.repeat(v, G, axis=0)) for k, v in batch.items()}


def masked_mean(x, mask):
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def full_sequence(prompt_NxP, pmask_NxP, tokens_NxL, mask_NxL):
  tokens_NxT = jnp.concatenate([prompt_NxP, tokens_NxL], axis=1)
  mask_NxT = jnp.concatenate([pmask_NxP, mask_NxL], axis=1).astype(jnp.int32)
  positions_NxT = jnp.maximum(jnp.cumsum(mask_NxT, axis=1) - 1, 0)
  return tokens_NxT, positions_NxT, mask_NxT


def completion_logprobs(mcfg, params, seq, P: int, temperature: float):
  """log π(o_t | q, o_<t) and entropies for the completion columns only (the LM head skips prompt positions)."""
  tokens_NxT, positions_NxT, mask_NxT = seq
  return model_lib.completion_logprobs(mcfg, params, tokens_NxT, positions_NxT, mask_NxT, P, temperature)


# ------------------------------------------------------------------------------------------ advantages by name
# rl.advantage names the estimator. Outcome estimators map (r_BxG, rl config) -> adv_BxG, one value per sample (and
# per reward term under reward_norm='per_term'); per-token ones map (r_BxG, ctx) -> adv_NxL. ctx: mask_NxL, kl_NxL
# (stop-grad per-token KL of the rollout policy to the reference), rl config.

OUTCOME_ADVANTAGES: dict[str, Callable[[jax.Array, Any], jax.Array]] = {
    "grpo": lambda r, rl: advantages.grpo(r, std_eps=rl.std_eps, ddof=rl.std_ddof),
    "dr_grpo": lambda r, rl: advantages.dr_grpo(r),
    "rloo": lambda r, rl: advantages.rloo(r),
}
TOKEN_ADVANTAGES: dict[str, Callable[[jax.Array, dict], jax.Array]] = {
    "reinforce_pp": lambda r, c: advantages.reinforce_pp(
        r.reshape(-1), c["kl_NxL"], c["mask_NxL"], beta=c["rl"].beta, whiten_eps=1e-8),
    "reinforce_pp_baseline": lambda r, c: advantages.reinforce_pp_baseline(
        r, c["kl_NxL"], c["mask_NxL"], beta=c["rl"].beta, whiten_eps=1e-8),
}
# Estimators whose advantage already carries the KL penalty (per token, in the reward).
KL_IN_ADVANTAGE = tuple(TOKEN_ADVANTAGES)


def make_rollout_fn(config, mcfg, spec: rewards_lib.RewardSpec, tokenizer) -> Callable:
  """(params, ref_params, batch, rng) -> Rollout with rewards, advantages, old and reference log-probs."""
  rl, G, temp = config.rl, config.rl.G, config.sampling.temperature
  scfg = sampling.SamplingConfig(
      temperature=temp, top_k=config.sampling.top_k, top_p=config.sampling.top_p,
      max_new_tokens=config.sampling.max_new_tokens, greedy=False,
      eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
  bf16 = mcfg.dtype == "bfloat16"
  overlong_cache = round(rl.overlong_frac * scfg.max_new_tokens)  # a length: static
  # Each term's weight (the order of terms_NxK); the overlong penalty, when on, is the last term, weight 1.
  term_w_K = jnp.asarray(spec.weights + ((1.0,) if overlong_cache > 0 else ()), jnp.float32)

  def rollout_fn(params, ref_params, batch, rng):
    k_sample, k_ds = jax.random.split(rng)
    b = tile_batch(batch, G)
    prompt_NxP, pmask_NxP = b["prompt_NxP"], b["prompt_mask_NxP"]
    P = prompt_NxP.shape[1]
    ro = sampling.sample(mcfg, params, prompt_NxP, pmask_NxP, k_sample, scfg)
    tokens_NxL = sharding.constrain_batch(ro.tokens_NxL)
    mask_NxL = ro.mask_NxL.astype(jnp.float32)
    fields = {k: v for k, v in b.items() if k not in PROMPT_KEYS}
    r_N, per_term, status, fallbacks, steps = rewards_lib.compute(spec, tokens_NxL, ro.mask_NxL, fields)
    terms_NxK = [per_term[n] for n in spec.names]
    if overlong_cache > 0:
      # DAPO's soft overlong punishment, a reward term of weight 1 (its own term under reward_norm='per_term').
      penalty_N = advantages.overlong_penalty(ro.lengths_N, max_len=scfg.max_new_tokens, cache_len=overlong_cache)
      r_N = r_N + penalty_N
      terms_NxK.append(penalty_N)
    terms_NxK = jnp.stack(terms_NxK, axis=1)
    out = dict(prompt_NxP=prompt_NxP, pmask_NxP=pmask_NxP, tokens_NxL=tokens_NxL, mask_NxL=mask_NxL,
               lengths_N=ro.lengths_N, truncated_N=ro.truncated_N, r_N=r_N, terms_NxK=terms_NxK, status=status,
               fallbacks=fallbacks, per_term=per_term, old_logp_NxL=ro.logp_NxL, steps=steps)

    if rl.dynamic_sampling:
      # DAPO: the batch holds oversample×B prompts; keep B groups whose normalised reward varies, fixed shape.
      B_all = r_N.shape[0] // G
      keep = B_all // rl.oversample
      idx_B, n_valid = advantages.dynamic_sampling_select(signal_rewards(rl, r_N, terms_NxK, term_w_K, G), keep,
                                                          k_ds)
      rows = (idx_B[:, None] * G + jnp.arange(G)[None, :]).reshape(-1)
      take = lambda x: sharding.constrain_batch(jnp.take(x, rows, axis=0)) if x.ndim else x
      per_term = {k: take(v) for k, v in out.pop("per_term").items()}
      steps, status = out.pop("steps"), out.pop("status")  # status: one per reward term, not per row
      out = {k: take(v) for k, v in out.items()}
      out["per_term"], out["steps"] = per_term, (None if steps is None else tuple(take(s) for s in steps))
      out["status"] = status
      out["ds_kept"] = n_valid
      out["r_N_all"] = r_N

    seq = full_sequence(out["prompt_NxP"], out["pmask_NxP"], out["tokens_NxL"], out["mask_NxL"])
    ref_logp_NxL, _ = completion_logprobs(mcfg, ref_params, seq, P, temp)
    if bf16:
      # bf16 sampler and training forward differ by rounding; ρ must start at exactly 1 for μ=1 on-policy.
      out["old_logp_NxL"], _ = completion_logprobs(mcfg, params, seq, P, temp)
    out["old_logp_NxL"] = jax.lax.stop_gradient(out["old_logp_NxL"]) * out["mask_NxL"]
    out["ref_logp_NxL"] = jax.lax.stop_gradient(ref_logp_NxL) * out["mask_NxL"]
    out["seq"] = seq
    out["P"] = P
    out["term_w_K"] = term_w_K
    return out

  return rollout_fn


def signal_rewards(rl, r_N: jax.Array, terms_NxK: jax.Array, w_K: jax.Array, G: int) -> jax.Array:
  """What the advantage normalises, per group: the weighted sum r_BxG, or (reward_norm='per_term') the weighted
  terms r_BxGxK. A group carries no signal when it is constant in it (dynamic sampling, frac_zero_std_groups)."""
  if rl.reward_norm == "per_term":
    return (terms_NxK * w_K).reshape(-1, G, terms_NxK.shape[1])
  return r_N.reshape(-1, G)


def compute_advantages(config, ro: dict) -> jax.Array:
  rl, G = config.rl, config.rl.G
  r_BxG = ro["r_N"].reshape(-1, G)
  kl_NxL = losses.kl_estimate(rl.kl_estimator, ro["old_logp_NxL"], ro["ref_logp_NxL"],
                              k3_clamp=rl.kl_clamp) * ro["mask_NxL"]
  if rl.kl_in == "reward" and rl.advantage not in KL_IN_ADVANTAGE:
    # Sequence-level KL penalty folded into the outcome reward before normalisation.
    r_BxG = r_BxG - rl.beta * kl_NxL.sum(-1).reshape(-1, G)
  if rl.advantage in TOKEN_ADVANTAGES:
    ctx = dict(mask_NxL=ro["mask_NxL"], kl_NxL=jax.lax.stop_gradient(kl_NxL), rl=rl)
    adv_NxL = TOKEN_ADVANTAGES[rl.advantage](r_BxG, ctx)
  else:
    group_fn = functools.partial(OUTCOME_ADVANTAGES[rl.advantage], rl=rl)
    if rl.reward_norm == "per_term":
      # GDPO: each term normalised in its group, weighted sum, batch std (validation keeps the KL out of r here).
      terms_BxGxK = ro["terms_NxK"].reshape(-1, G, ro["terms_NxK"].shape[1])
      adv_BxG = advantages.decoupled(terms_BxGxK, ro["term_w_K"], group_fn, std_eps=rl.std_eps, ddof=rl.std_ddof)
    else:
      adv_BxG = group_fn(r_BxG)
    adv_NxL = advantages.broadcast_to_tokens(adv_BxG.reshape(-1), ro["mask_NxL"])
  if rl.process_weight > 0:
    s_r, s_end, s_valid = ro["steps"]
    p_adv = advantages.process_advantages(s_r, s_end, s_valid, ro["mask_NxL"], G=G, std_eps=rl.std_eps,
                                          ddof=rl.std_ddof)
    adv_NxL = advantages.combine(adv_NxL, p_adv, w_outcome=1.0, w_process=rl.process_weight)
  return adv_NxL * ro["mask_NxL"]


def policy_loss_kwargs(config) -> dict:
  """losses.policy_loss's settings for this config. ratio_level 'sequence' is GSPO-token (sequence-level ratio
  exp(mean_t log ρ), clipped with its own small ε); a KL folded into the reward leaves none in the loss."""
  rl = config.rl
  beta = 0.0 if (rl.advantage in KL_IN_ADVANTAGE or rl.kl_in == "reward") else rl.beta
  return dict(eps_low=rl.eps_low, eps_high=rl.eps_high, beta=beta, kl_estimator=rl.kl_estimator, agg=rl.loss_agg,
              norm_len=config.sampling.max_new_tokens, ratio_level=rl.ratio_level, dual_clip=rl.dual_clip,
              kl_clamp=rl.kl_clamp)


def make_loss_fn(config, mcfg) -> Callable:
  temp, kwargs = config.sampling.temperature, policy_loss_kwargs(config)

  def loss_fn(params, mb):
    logp_NxL, ent_NxL = completion_logprobs(mcfg, params, mb["seq"], mb["P"], temp)
    loss, m = losses.policy_loss(logp_NxL, mb["old_logp_NxL"], mb["ref_logp_NxL"], mb["adv_NxL"], mb["mask_NxL"],
                                 **kwargs)
    m = dict(m)
    m["entropy"] = masked_mean(ent_NxL, mb["mask_NxL"])
    return loss, m
  return loss_fn


def _select(pred, new, old):
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def make_update_fn(config, mcfg, tx, loss_fn) -> Callable:
  """μ epochs × minibatches as nested lax.scan; a non-finite loss or gradient skips that update (counted)."""
  rl = config.rl

  def update_fn(params, opt_state, data: dict, rng):
    N = data["mask_NxL"].shape[0]
    n_mb = rl.minibatches
    mb_size = N // n_mb

    def one_minibatch(carry, rows):
      params, opt_state = carry
      mb = jax.tree.map(lambda x: sharding.constrain_batch(jnp.take(x, rows, axis=0)), data)
      mb["P"] = P
      (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
      gnorm = optax.global_norm(grads)
      updates, new_opt = tx.update(grads, opt_state, params)
      new_params = optax.apply_updates(params, updates)
      finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
      params, opt_state = _select(finite, (new_params, new_opt), (params, opt_state))
      m.update(loss=loss, grad_norm=gnorm, update_norm=jnp.where(finite, optax.global_norm(updates), 0.0),
               nonfinite=1 - finite.astype(jnp.int32))
      return (params, opt_state), m

    def one_epoch(carry, key):
      if n_mb == 1 and rl.mu == 1:
        perm = jnp.arange(N)  # on-policy single update: row order is irrelevant, skip the gather cost
      else:
        perm = jax.random.permutation(key, N)
      return jax.lax.scan(one_minibatch, carry, perm.reshape(n_mb, mb_size))

    P = data.pop("P")
    (params, opt_state), m = jax.lax.scan(one_epoch, (params, opt_state), jax.random.split(rng, rl.mu))
    m = jax.tree.map(lambda x: x.reshape(-1), m)  # [mu * n_mb]
    return params, opt_state, m

  return update_fn


def rollout_metrics(config, ro: dict, adv_NxL) -> dict[str, jax.Array]:
  G = config.rl.G
  r_N, mask = ro["r_N"], ro["mask_NxL"]
  k3_NxL = losses.kl_k3(ro["old_logp_NxL"], ro["ref_logp_NxL"])
  m = {
      "train/reward_mean": r_N.mean(), "train/reward_std": r_N.std(),
      "train/frac_zero_std_groups": jnp.mean(advantages.group_is_constant(
          signal_rewards(config.rl, r_N, ro["terms_NxK"], ro["term_w_K"], G))),
      "train/adv_mean": masked_mean(adv_NxL, mask),
      "train/adv_std": jnp.sqrt(masked_mean(jnp.square(adv_NxL - masked_mean(adv_NxL, mask)), mask)),
      "train/adv_abs_max": jnp.max(jnp.abs(adv_NxL)),
      "train/kl": masked_mean(k3_NxL, mask),
      "train/completion_len_mean": ro["lengths_N"].mean(),
      "train/completion_len_max": ro["lengths_N"].max(),
      "train/truncation_rate": ro["truncated_N"].mean(),
      "train/reward_fallbacks": ro["fallbacks"],
  }
  for name, r in ro["per_term"].items():
    m[f"train/reward/{name}"] = r.mean()
  if "ds_kept" in ro:
    m["train/dynamic_sampling_kept"] = ro["ds_kept"]
  return m


def check_preset(config) -> None:
  """Code that builds a step without validate.py (ablations, tests) cannot run half a preset either."""
  bad = presets.check(config)
  if bad:
    raise config_lib.ConfigError(bad)


def build_step(config, mcfg: model_lib.ModelConfig, tx, spec: rewards_lib.RewardSpec,
               tokenizer) -> Callable[[dict, dict], tuple[dict, dict]]:
  """The pure, un-jitted `(state, batch) -> (state, metrics)`: jit it (make_rl_step) or vmap it over seeds."""
  check_preset(config)
  rollout_fn = make_rollout_fn(config, mcfg, spec, tokenizer)
  update_fn = make_update_fn(config, mcfg, tx, make_loss_fn(config, mcfg))
  n_show = config.train.num_samples_logged

  def step(state, batch):
    rng, k_roll, k_upd = jax.random.split(state["rng"], 3)
    ro = rollout_fn(state["params"], state["ref_params"], batch, k_roll)
    adv_NxL = compute_advantages(config, ro)
    data = dict(seq=ro["seq"], old_logp_NxL=ro["old_logp_NxL"], ref_logp_NxL=ro["ref_logp_NxL"],
                adv_NxL=adv_NxL, mask_NxL=ro["mask_NxL"], P=ro["P"])
    params, opt_state, um = update_fn(state["params"], state["opt_state"], data, k_upd)

    # A failed Python reward leaves the whole state untouched; the host raises after the step.
    reward_ok = jnp.all(ro["status"] == rewards_lib.OK)
    new_state = dict(state, params=params, opt_state=opt_state, step=state["step"] + 1, rng=rng)
    new_state = _select(reward_ok, new_state, state)

    m = rollout_metrics(config, ro, adv_NxL)
    for k in ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "kl_clamp_frac", "ratio_mean", "ratio_max",
              "entropy", "loss", "grad_norm", "update_norm"):
      if k in um:
        m[f"train/{k}"] = um[k].max() if k == "ratio_max" else um[k].mean()
    m["train/nonfinite_updates"] = um["nonfinite"].sum()
    m["train/skipped_updates"] = um["nonfinite"].sum() + (1 - reward_ok.astype(jnp.int32)) * um["nonfinite"].size
    m["train/param_norm"] = optax.global_norm(new_state["params"])
    m["reward_status"] = ro["status"]
    m["samples/tokens_NxL"] = ro["tokens_NxL"][:n_show]
    m["samples/mask_NxL"] = ro["mask_NxL"][:n_show]
    m["samples/r_N"] = ro["r_N"][:n_show]
    return new_state, m

  return step


def make_rl_step(config, mesh, mcfg: model_lib.ModelConfig, tx, spec: rewards_lib.RewardSpec,
                 tokenizer) -> Callable[[dict, dict], tuple[dict, dict]]:
  """ONE jitted `(state, batch) -> (state, metrics)`; the state is donated."""
  step = build_step(config, mcfg, tx, spec, tokenizer)
  _, shard = state_lib.state_shardings(mesh, mcfg, tx)
  return sharding.jit_step(step, mesh, shard)
