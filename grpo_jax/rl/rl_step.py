"""The critic-free RL iteration (GRPO family) as ONE jitted, sharded function `(state, batch) -> (state, metrics)`.

rollout (scan decoder) → rewards (in-graph or pure_callback) → advantages (by name, advantages.ESTIMATORS) →
reference log-probs → μ epochs × minibatches of clipped updates (update.minibatch_scan) → metrics. PPO with a critic
lives in `ppo_step.py` and reuses the rollout and the step's tail from here.
"""
import numbers
from typing import Callable

import jax
import jax.numpy as jnp

from grpo_jax.envs import batch as env_batch
from grpo_jax.envs import transcript as transcript_lib
from grpo_jax.infra import host_calls
from grpo_jax.rl import advantages
from grpo_jax.rl import auto
from grpo_jax.config import config_lib
from grpo_jax.rl import correction
from grpo_jax.rl import length_stats
from grpo_jax.rl import losses
from grpo_jax.rl import packing
from grpo_jax.rl import partial
from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.rl import reward_spec
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rl import state as state_lib
from grpo_jax.rl import token_select
from grpo_jax.rl import update as update_lib


def masked_mean(x, mask):
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _kl_and_rewards(config, ro: rollout_lib.Rollout):
  """The per-token KL and the group rewards the outcome advantage normalises (with the KL penalty folded in when
  rl.kl_in='reward' and the estimator does not fold it itself), and that penalty per sample (0 otherwise)."""
  rl, G = config.rl, config.rl.G
  if ro.ref_logp_NxL is None:  # β = 0: every KL term is multiplied by 0
    kl_NxL = jnp.zeros_like(ro.mask_NxL)
  else:
    kl_NxL = losses.kl_estimate(rl.kl_estimator, ro.old_logp_NxL, ro.ref_logp_NxL, k3_clamp=rl.kl_clamp) * ro.mask_NxL
  penalty_N = jnp.zeros_like(ro.r_N)
  if rl.kl_in == "reward" and not advantages.ESTIMATORS[rl.advantage].kl_in_advantage:
    # Sequence-level KL penalty folded into the outcome reward before normalisation.
    penalty_N = -rl.beta * kl_NxL.sum(-1)
  return kl_NxL, (ro.r_N + penalty_N).reshape(-1, G), penalty_N


def _outcome_advantages(config, ro: rollout_lib.Rollout, r_BxG, ctx) -> jax.Array:
  """adv_BxG of a sequence-level estimator: of the summed reward, or (reward_norm='per_term') GDPO's."""
  rl, est = config.rl, advantages.ESTIMATORS[config.rl.advantage]
  if rl.reward_norm == "per_term":
    # GDPO: each term normalised in its group, weighted sum, batch std (validation keeps the KL out of r here).
    terms_BxGxK = ro.terms_NxK.reshape(-1, rl.G, ro.terms_NxK.shape[1])
    return advantages.decoupled(terms_BxGxK, ro.term_w_K, lambda r: est.fn(r, ctx), std_eps=rl.std_eps,
                                ddof=rl.std_ddof)
  return est.fn(r_BxG, ctx)


def compute_advantages(config, ro: rollout_lib.Rollout) -> jax.Array:
  rl, G = config.rl, config.rl.G
  est = advantages.ESTIMATORS[rl.advantage]
  kl_NxL, r_BxG, _ = _kl_and_rewards(config, ro)
  ctx = advantages.Context(ro.mask_NxL, jax.lax.stop_gradient(kl_NxL), rl)
  if est.per_token:
    adv_NxL = est.fn(r_BxG, ctx)
  else:
    adv_NxL = advantages.broadcast_to_tokens(_outcome_advantages(config, ro, r_BxG, ctx).reshape(-1), ro.mask_NxL)
  if rl.process_weight > 0:
    s_r, s_end, s_valid = ro.steps
    p_adv = advantages.process_advantages(s_r, s_end, s_valid, ro.mask_NxL, G=G, std_eps=rl.std_eps,
                                          ddof=rl.std_ddof)
    adv_NxL = advantages.combine(adv_NxL, p_adv, w_outcome=1.0, w_process=rl.process_weight)
  return adv_NxL * ro.mask_NxL


def term_names(ro: rollout_lib.Rollout) -> list[str]:
  """The names of terms_NxK's columns: the reward terms, then DAPO's overlong penalty when it is on."""
  names = list(ro.per_term)
  return names + ["overlong"] * (ro.terms_NxK.shape[1] - len(names))


def term_shares(config, ro: rollout_lib.Rollout) -> dict[str, jax.Array]:
  """Each reward term's share of the outcome advantage: A = Σ_k a_k exactly, and share_k = <a_k, A> / <A, A> (the
  shares sum to 1; a term pulling against the others has a negative share). For the group estimators (grpo,
  dr_grpo, rloo) A_i is the group's centred reward times one scale per group (1/(std+eps), 1, G/(G-1)), so
  a_k = scale · w_k · (r_k − group mean of r_k); under reward_norm='per_term' a_k = w_k · (term k normalised in its
  group) / the batch std. A KL penalty folded into the reward (rl.kl_in='reward') is its own term, `kl_penalty`.
  Per-token estimators (REINFORCE++) mix the KL into every token, and PPO's GAE is not a group estimator: they get
  no shares ({})."""
  rl, G = config.rl, config.rl.G
  est = advantages.ESTIMATORS.get(rl.advantage)
  if est is None or est.per_token:
    return {}
  kl_NxL, r_BxG, penalty_N = _kl_and_rewards(config, ro)
  ctx = advantages.Context(ro.mask_NxL, jax.lax.stop_gradient(kl_NxL), rl)
  adv_BxG = jax.lax.stop_gradient(_outcome_advantages(config, ro, r_BxG, ctx))
  names = term_names(ro)
  terms_BxGxK = ro.terms_NxK.reshape(-1, G, len(names)).astype(jnp.float32)
  w_K = ro.term_w_K
  if rl.kl_in == "reward" and rl.reward_norm != "per_term":
    names, w_K = names + ["kl_penalty"], jnp.concatenate([w_K, jnp.ones((1,), jnp.float32)])
    terms_BxGxK = jnp.concatenate([terms_BxGxK, penalty_N.reshape(-1, G, 1)], axis=2)
  if rl.reward_norm == "per_term":
    parts_BxGxK = jax.vmap(lambda r: est.fn(r, ctx), in_axes=2, out_axes=2)(terms_BxGxK) * w_K
    axes = None  # one scale for the batch: the batch std
  else:
    parts_BxGxK = (terms_BxGxK - terms_BxGxK.mean(axis=1, keepdims=True)) * w_K
    axes = 1  # one scale per group
  total_BxG = parts_BxGxK.sum(-1)
  # The scale, fitted exactly: A = s · total (s = 0 where total is 0: a group without signal).
  den = jnp.sum(total_BxG * total_BxG, axis=axes, keepdims=True)
  s = jnp.where(den > 0, jnp.sum(adv_BxG * total_BxG, axis=axes, keepdims=True) / jnp.where(den > 0, den, 1.0), 0.0)
  a_BxGxK = parts_BxGxK * s[..., None]
  norm = jnp.sum(adv_BxG * adv_BxG)
  share_K = jnp.where(norm > 0, jnp.einsum("bgk,bg->k", a_BxGxK, adv_BxG) / jnp.where(norm > 0, norm, 1.0), 0.0)
  return {name: share_K[k] for k, name in enumerate(names)}


def policy_loss_kwargs(config) -> dict:
  """losses.policy_loss's settings for this config. ratio_level 'sequence' is GSPO-token (sequence-level ratio
  exp(mean_t log ρ), clipped with its own small ε); a KL folded into the reward leaves none in the loss."""
  rl = config.rl
  est = advantages.ESTIMATORS.get(rl.advantage)  # (PPO's GAE is not one: its KL is in the reward)
  no_kl_in_loss = (est is not None and est.kl_in_advantage) or rl.kl_in == "reward"
  return dict(eps_low=rl.eps_low, eps_high=rl.eps_high, beta=0.0 if no_kl_in_loss else rl.beta,
              kl_estimator=rl.kl_estimator, agg=rl.loss_agg, norm_len=config.sampling.max_new_tokens,
              ratio_level=rl.ratio_level, dual_clip=rl.dual_clip, kl_clamp=rl.kl_clamp,
              objective=rl.get("objective", "clip"), tau_pos=rl.get("sapo_tau_pos", 1.0),
              tau_neg=rl.get("sapo_tau_neg", 1.05), token_select=rl.get("token_select", "all"), select_cfg=rl,
              entropy_coef=rl.get("entropy_coef", 0.0))


def one_update(config) -> bool:
  """μ = 1 with one minibatch: the step's only update runs at the params π_prox was taken at."""
  return config.rl.mu * config.rl.minibatches == 1


# The reward terms that score correctness (0 or 1), first found wins: the generated tasks' `accuracy`, gsm8k's and
# task.name=math's `math_accuracy`. The length and tool metrics split the rows by it.
ACCURACY_TERMS = ("accuracy", "math_accuracy")


def accuracy_term(ro: rollout_lib.Rollout) -> jax.Array | None:
  """Per-row correctness score of the run's accuracy term (ACCURACY_TERMS), None when its rewards have none."""
  return next((ro.per_term[n] for n in ACCURACY_TERMS if n in ro.per_term), None)


FIRST_UPDATE = "first_update"  # minibatch_scan's flag of the step's first update (train_by_length sets it)
SELECT_KEY = "select_key"  # minibatch_scan's per-update PRNG key for Clip-Cov's choice (train_by_length sets it)


def select_uniforms(mb: dict) -> jax.Array | None:
  """Clip-Cov's one uniform per token of this update (rl/token_select.py): drawn afresh from the update's own key, so
  each update cuts an independent random subset, as verl's randperm per policy-loss call. Drawn once per step and
  shared by its updates (as they were), a token cut in one epoch was cut again in the next (95% of the cuts at μ 2 ×
  2 minibatches, ratio 0.05, against 5% for fresh draws). A minibatch built by hand may carry `select_u_NxL`."""
  if SELECT_KEY in mb:
    return jax.random.uniform(mb[SELECT_KEY], mb["mask_NxL"].shape)
  return mb.get("select_u_NxL")


def old_logp(config, logp_NxL: jax.Array, mb: dict) -> jax.Array:
  """π_old of the ratio. The step's first update runs at the params π_prox was taken at, so there the ratio is
  taken against stop_gradient(log π) itself, exactly 1, as verl's dp_actor does on-policy (old_log_prob =
  log_prob.detach()), not against the recorded π_prox (a second forward, or the sampler's log-probs in exact mode)
  that equals it only to rounding (the sampler's: ±4.8e-7 in log ρ on the test model): a |log ρ| term (KL-Cov's
  penalty) then has gradient 0 there, not ±coef at random. With one update per step that is every update; with
  μ or minibatches > 1 the first (mb[FIRST_UPDATE]), and the later ones read the recorded π_prox. It still sets
  the rollout correction's weights (rl/correction.py)."""
  if one_update(config):
    return jax.lax.stop_gradient(logp_NxL)
  if FIRST_UPDATE not in mb:  # a minibatch built by hand (tests): the recorded π_prox
    return mb["old_logp_NxL"]
  return jnp.where(mb[FIRST_UPDATE], jax.lax.stop_gradient(logp_NxL), mb["old_logp_NxL"])


def make_objective(config) -> Callable:
  """((logp_NxL, ent_NxL), minibatch) -> (loss, aux): the clipped objective on the policy's log-probs."""
  kwargs = policy_loss_kwargs(config)

  def objective(out, mb):
    logp_NxL, ent_NxL = out
    # No reference (β = 0, or all of a vmapped sweep's β are 0: vmapped_runs.init_states): no KL term at all.
    kw = kwargs if mb.get("ref_logp_NxL") is not None else dict(kwargs, beta=0.0)
    loss, m = losses.policy_loss(logp_NxL, old_logp(config, logp_NxL, mb), mb.get("ref_logp_NxL"), mb["adv_NxL"],
                                 mb["mask_NxL"], is_w_NxL=mb.get("is_w_NxL"), ent_NxL=ent_NxL,
                                 select_u_NxL=select_uniforms(mb), **kw)
    return loss, update_lib.no_tokens_nan(dict(m, entropy=masked_mean(ent_NxL, mb["mask_NxL"])), mb["mask_NxL"])
  return objective


def make_forward(config, mcfg, P: int) -> Callable:
  """((params,), seq, packed) -> (logp, entropy): the policy pass (packed: per position, rl/packing.py)."""
  temp = config.sampling.temperature
  return lambda ps, seq, packed: rollout_lib.completion_logprobs(mcfg, ps[0], seq, P, temp, packed)


def make_loss_fn(config, mcfg, P: int) -> Callable:
  """(params, minibatch) -> (loss, aux) for prompts of static length P (the padded pass)."""
  objective, forward = make_objective(config), make_forward(config, mcfg, P)
  return lambda params, mb: objective(forward((params,), mb["seq"], False), mb)


def make_train_update(config, forward: Callable, objective: Callable, opts, P: int) -> Callable:
  """minibatch_scan's update for a family: objective(forward(params, seq, packed), mb). Padded: one value_and_grad
  over the minibatch; rl.packing: gradients summed over its packed micro-batches (packing.value_and_grad)."""
  loss_fn = lambda ps, mb: objective(forward(ps, mb["seq"], False), mb)
  vg = None
  if config_lib.packing_on(config):
    # validation refuses the pair, on a resume too (train.check_recorded re-validates the recorded packing); here: a
    # step built from a config no command validated (studies, benchmarks, tests) fails in one line, not in packing
    if config.rl.get("token_select", "all") != "all":
      raise auto.ConfigError(
          f"config.rl.token_select: '{config.rl.token_select}' ranks the whole minibatch's tokens, but this run's "
          "rl.packing is on (set, or resolved when the run started: a resume keeps it), whose objective sees one "
          "micro-batch at a time; set rl.token_select='all', or rl.packing=off (on a resume with "
          "train.allow_config_change=rl.packing).")
    vg = packing.value_and_grad(config, lambda ps, s: forward(ps, s, True), objective, P)
  return update_lib.make_update(loss_fn, opts, vg)


def rollout_metrics(config, ro: rollout_lib.Rollout, adv_NxL) -> dict[str, jax.Array]:
  G = config.rl.G
  r_N, mask = ro.r_N, ro.mask_NxL
  m = {
      "train/reward_mean": r_N.mean(), "train/reward_std": r_N.std(),
      "train/frac_zero_std_groups": jnp.mean(advantages.group_is_constant(
          rollout_lib.signal_rewards(config.rl, r_N, ro.terms_NxK, ro.term_w_K, G))),
      "train/adv_mean": masked_mean(adv_NxL, mask),
      "train/adv_std": jnp.sqrt(masked_mean(jnp.square(adv_NxL - masked_mean(adv_NxL, mask)), mask)),
      "train/adv_abs_max": jnp.max(jnp.abs(adv_NxL)),
      "train/completion_len_mean": ro.lengths_N.mean(),
      "train/completion_len_max": ro.lengths_N.max(),
      "train/completion_len_p90": length_stats.p90(ro.lengths_N),
      "train/truncation_rate": ro.truncated_N.mean(),
      "train/reward_fallbacks": ro.fallbacks,
  }
  if ro.bucket is not None:  # (a Rollout built by hand may leave these out)
    m["train/train_len"] = jnp.asarray(rollout_lib.train_lengths(config), jnp.int32)[ro.bucket]
  if ro.decode_steps is not None:
    m["train/decode_steps"] = ro.decode_steps
  decode = {"train/decode_row_steps": ro.decode_row_steps, "train/decode_slot_util": ro.decode_slot_util,
            "train/decode_admit_wait": ro.decode_admit_wait}
  m.update({k: v for k, v in decode.items() if v is not None})
  if ro.ref_logp_NxL is not None:  # β = 0 has no reference model: no train/kl
    m["train/kl"] = masked_mean(losses.kl_k3(ro.old_logp_NxL, ro.ref_logp_NxL), mask)
  for name, r in ro.per_term.items():
    m[f"train/reward/{name}"] = r.mean()
  acc_N = accuracy_term(ro)
  if acc_N is not None:  # does a longer completion win inside its group? (the selection R1-Zero relies on)
    m["train/completion_len_correct"], m["train/completion_len_incorrect"] = length_stats.split_by(
        ro.lengths_N, acc_N > 0.5)
    m["train/len_acc_corr"], m["train/len_acc_corr_frac"] = length_stats.within_group_corr(
        ro.lengths_N.reshape(-1, G), acc_N.reshape(-1, G))
    if "process" in ro.per_term:  # right steps that do not reach the answer ('1 + 1 = 2 ;' padding scores 1)
      m["train/process_on_correct"], m["train/process_on_incorrect"] = length_stats.split_by(
          ro.per_term["process"], acc_N > 0.5)
  for name, share in term_shares(config, ro).items():
    m[f"train/adv_share/{name}"] = share
  if ro.ds_kept is not None:
    m["train/dynamic_sampling_kept"] = ro.ds_kept
  if ro.tool_rows is not None:
    m.update({f"train/{k}": v for k, v in tool_metrics(ro).items()})
  return m


def tool_metrics(ro: rollout_lib.Rollout) -> dict[str, jax.Array]:
  """Multi-turn rows (tools.env): envs/transcript.py's summary in the graph (tool calls, turns, observation vs
  generated tokens, accuracy with and without a call), the environment's counted events, and observations cut to
  the room (over every sampled row)."""
  r, ev_NxE = ro.tool_rows, ro.tool_rows["events_NxE"]
  acc_N = accuracy_term(ro)
  correct_N = None if acc_N is None else acc_N > 0.5
  m = transcript_lib.summary(r, correct_N, ev_NxE[:, env_batch.TOOL_ERROR], ev_NxE[:, env_batch.TOOL_TIMEOUT],
                             ev_NxE[:, env_batch.FALLBACK], xp=jnp)
  m["tool_turn_limits"] = jnp.sum(ev_NxE[:, env_batch.TURN_LIMIT]).astype(jnp.float32)
  m["tool_obs_truncated"] = ro.env_counts_K[env_batch.COUNTS.index("truncated")].astype(jnp.float32)
  return m


def training_data(config, ro: rollout_lib.Rollout, adv_NxL,
                  version: jax.Array | None = None) -> tuple[dict, dict]:
  """The update's per-row data (minibatch_scan slices it) and its statistics. Partial rollouts: tokens older than
  rl.max_staleness updates (`version`: the state's step) leave the loss mask first (rl/partial.py). The rollout
  correction (rl/correction.py) is built here, once per step, from π_prox and μ, which the update never changes: its
  weight rides in the data as `is_w_NxL` and the tokens it rejects leave `mask_NxL`. (Clip-Cov's uniforms are drawn
  per update from minibatch_scan's keys: select_uniforms.)"""
  mask_NxL, metrics = ro.mask_NxL, {}
  if ro.version_NxL is not None:
    mask_NxL, lag_NxL = partial.train_mask(ro, version, int(config.rl.max_staleness))
    metrics = partial.metrics(ro, lag_NxL, mask_NxL)
  corr = correction.build(config, ro.old_logp_NxL, ro.behav_logp_NxL, mask_NxL)
  data = dict(seq=ro.seq, old_logp_NxL=ro.old_logp_NxL, adv_NxL=adv_NxL, mask_NxL=corr.mask_NxL)
  # Cov(log π_old, A), the entropy mechanism's driver (rl/token_select.py), over the tokens the update trains: those
  # the staleness mask or a correction removed have no gradient, so they move no entropy (over every completion
  # token, as it was, it counted them, and it was not over the tokens train/entropy and the selections read)
  trained_NxL = corr.mask_NxL > 0
  metrics = dict(metrics, **{"train/cov_logp_adv": jnp.sum(token_select.covariance(
      ro.old_logp_NxL, adv_NxL, trained_NxL)) / jnp.maximum(jnp.sum(trained_NxL), 1)})
  if corr.is_w_NxL is not None:
    data["is_w_NxL"] = corr.is_w_NxL
  if ro.ref_logp_NxL is not None:
    data["ref_logp_NxL"] = ro.ref_logp_NxL
  return data, {**metrics, **corr.metrics}


def reference_reset(config, state: state_lib.State, updated: dict) -> tuple[dict, dict]:
  """ProRL's reference reset (Liu et al. 2025, arXiv 2505.24864, "hard-reset the reference policy to a recent
  snapshot of the online policy, and reinitialise the optimizer states"): after every rl.ref_reset_every-th update
  the reference becomes the policy just updated and the policy's optimizer state starts afresh (moments and counts
  zero, so a warm-up restarts; its learning rate, a per-run hyper-parameter under vmapped runs, kept), so the KL
  anchors at the policy reached, not at the start. In-graph on the step counter: a resumed run resets where the
  uninterrupted one did. -> (`updated` with the reset applied, {'train/ref_reset': 1 on a reset step})."""
  every = int(config.rl.get("ref_reset_every", 0))
  if every <= 0:
    return updated, {}
  reset = (state["step"] + 1) % every == 0
  params, opt_state = updated["params"], updated["opt_state"]
  fresh = optimizer(config).tx.init(params)._replace(hyperparams=opt_state.hyperparams)
  out = dict(updated, ref_params=update_lib.select(reset, params, state["ref_params"]),
             opt_state=update_lib.select(reset, fresh, opt_state))
  return out, {"train/ref_reset": reset.astype(jnp.float32)}


def finish_step(config, state: state_lib.State, updated: dict, ro: rollout_lib.Rollout, adv_NxL, um: dict,
                extra: dict | None = None):
  """The RL families' tail: the reference reset when rl.ref_reset_every says so, then the new state, unless a Python
  reward failed (then the whole state stays as it was and the host raises after the step), and the step's metrics
  (`extra`: more of them, e.g. the correction's)."""
  reward_ok = jnp.all(ro.status == reward_spec.OK)
  if ro.env_status is not None:  # an environment call that failed as a whole: the same skip (host raises after)
    reward_ok = reward_ok & (ro.env_status == host_calls.OK)
  # vmapped runs (studies/vmapped_runs.py): one run's failure skips every run's step, as the host stops the whole
  # group and saves each run at this step — a run that had advanced was saved one step ahead of its label, and
  # resumed onto this step's batch again (its carry's prompts admitted twice)
  reward_ok = update_lib.max_over_runs((~reward_ok).astype(jnp.int32)) == 0
  updated, reset_m = reference_reset(config, state, updated)
  new_state = update_lib.select(reward_ok, dict(state, **updated, step=state["step"] + 1), state)
  reset_m = {k: v * reward_ok for k, v in reset_m.items()}  # a skipped step resets nothing
  m = {**rollout_metrics(config, ro, adv_NxL), **update_lib.step_metrics(um, new_state["params"], reward_ok),
       **reset_m, **(extra or {})}
  n_show = config.train.num_samples_logged
  m.update({"reward_status": ro.status, "samples/tokens_NxL": ro.tokens_NxL[:n_show],
            "samples/mask_NxL": ro.mask_NxL[:n_show], "samples/r_N": ro.r_N[:n_show]})
  if ro.obs_NxL is not None:  # the whole transcript (the loss mask leaves the observations out) and which are tools'
    m.update({"env_status": ro.env_status, "samples/obs_NxL": ro.obs_NxL[:n_show],
              "samples/mask_NxL": ro.seq[2][:n_show, -ro.tokens_NxL.shape[1]:]})
  if ro.seq is not None:  # samples.jsonl shows each sample's prompt and the example's reference answer
    P = ro.seq[0].shape[1] - ro.tokens_NxL.shape[1]
    m.update({"samples/prompt_NxP": ro.seq[0][:n_show, :P], "samples/prompt_mask_NxP": ro.seq[2][:n_show, :P]})
  if ro.index_N is not None:
    m["samples/index_N"] = ro.index_N[:n_show]
  return new_state, m


def train_by_length(config, update, carry, data: dict, rng, bucket, P: int):
  """update.minibatch_scan on `data` cut to the bucket's completion length, one lax.switch branch per length (each
  compiles a forward+backward). The loss normalisers that are constants (Dr.GRPO's, DAPO's overlong penalty) read
  sampling.max_new_tokens, never the bucket: the cut drops only masked positions, so the loss is the same. Under
  rl.packing there are no length buckets: the update's packed micro-batches follow the real tokens."""
  rl = config.rl
  first = None if one_update(config) else FIRST_UPDATE  # (one update: old_logp needs no flag)
  sel = SELECT_KEY if rl.get("token_select", "all") == "clip_cov" else None  # (others draw nothing)
  if config_lib.packing_on(config):
    return update_lib.minibatch_scan(update, carry, data, rng, mu=rl.mu, minibatches=rl.minibatches,
                                     first_key=first, rng_key=sel)

  def at(Lb, carry, data, rng):
    return update_lib.minibatch_scan(update, carry, update_lib.cut(data, P, Lb), rng, mu=rl.mu,
                                     minibatches=rl.minibatches, first_key=first, rng_key=sel)
  return update_lib.by_length(bucket, rollout_lib.train_lengths(config), at, carry, data, rng)


# ------------------------------------------------------------------------------------- the family's interface


def optimizer(config) -> update_lib.Optimizer:
  return update_lib.make_optimizer(config.optim)


def layout(config, mcfg: model_lib.ModelConfig) -> state_lib.Layout:
  """Policy, frozen reference (only when β > 0: state.uses_reference; with LoRA none: the base is the reference),
  AdamW state; with rl.partial_rollouts the rollout carry."""
  return state_lib.Layout(optimizer(config), ref=state_lib.uses_reference(config),
                          carry=rollout_lib.carry_spec(config))


def reference_params(config, state: dict):
  """The state's reference params, or None when it keeps none (β = 0). With LoRA the reference is the frozen base
  (the policy with its adapters off): no copy. A state without them cannot run a config with a (static) β > 0:
  that is a state built for another config."""
  if "base" in state:
    return state["base"] if state_lib.uses_reference(config) else None
  ref = state.get("ref_params")
  if ref is None and isinstance(config.rl.beta, numbers.Real) and config.rl.beta != 0:
    raise ValueError(f"config.rl.beta={config.rl.beta}: the state has no reference params (it was built for β = 0); "
                     "build the state from this config (family.init / state_spec).")
  return ref


state_spec, init = state_lib.spec_and_init(layout)


def check_preset(config) -> None:
  """Code that builds a step without validate.py (ablations, tests) cannot run half a preset either."""
  bad = presets.check(config)
  if bad:
    raise config_lib.ConfigError(bad)


def build_step(config, mcfg: model_lib.ModelConfig, spec: reward_spec.RewardSpec,
               tokenizer) -> Callable[[dict, dict], tuple[dict, dict]]:
  """The pure, un-jitted `(state, batch) -> (state, metrics)`: jit it (families.make_step) or vmap it (seeds)."""
  check_preset(config)
  auto.check_resolved(config)  # rl.minibatches / rl.rollout_chunks = 0 (auto) have no default
  rollout_fn = rollout_lib.make_rollout_fn(config, mcfg, spec, tokenizer)
  opt = optimizer(config)

  carried = bool(config.rl.get("partial_rollouts", False))

  def step(state, batch):
    P = batch["prompt_NxP"].shape[1]
    rng, k_roll, k_upd = jax.random.split(state["rng"], 3)
    policy, ref = state_lib.model_params(state), reference_params(config, state)
    extra = {}
    if carried:  # partial rollouts: the rows come from (and the rest go back to) the carry in the state
      ro, extra["carry"] = rollout_fn(policy, ref, batch, k_roll, carry=state["carry"], version=state["step"])
    else:
      ro = rollout_fn(policy, ref, batch, k_roll)
    adv_NxL = compute_advantages(config, ro)
    data, data_metrics = training_data(config, ro, adv_NxL, version=state["step"])

    # the optimizer sees `params` only: with LoRA the adapters, the base entering as a constant
    fwd = make_forward(config, mcfg, P)
    forward = lambda ps, seq, packed: fwd((state_lib.model_params(state, ps[0]),), seq, packed)
    update = make_train_update(config, forward, make_objective(config), (opt,), P)
    with jax.named_scope("update"):
      ((params,), (opt_state,)), um = train_by_length(
          config, update, ((state["params"],), (state["opt_state"],)), data, k_upd, ro.bucket, P)
    return finish_step(config, state, dict(params=params, opt_state=opt_state, rng=rng, **extra), ro, adv_NxL, um,
                       data_metrics)

  return step
