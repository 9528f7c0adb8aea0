"""Per-token policy objectives, KL estimators, loss aggregation and the PPO value loss, as pure jittable functions.

Per-token arrays are `NxL` with `mask_NxL` 1 on completion tokens (EOS included), 0 on padding. Values at padding
positions are never read (they are replaced before any exp or log), so padding garbage cannot produce NaN or inf,
and a row whose mask is all zero contributes exactly 0.
"""
from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax

from grpo_jax.rl import token_select as token_select_lib

AGG_MODES = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
OBJECTIVES = ("clip", "cispo", "sapo")
KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "sequence")

# k3 evaluates exp(logp_ref − logp). The log-ratio is clipped from ABOVE at this value (e^20 ≈ 4.9e8), only there:
# that is where exp overflows and where k3's gradient (1 − e^Δ) explodes, for tokens the policy has made far less
# likely than the reference. Below, k3 ≈ −Δ − 1 grows linearly and keeps its gradient ≈ 1, so it is left exact.
# Clipped tokens keep a finite value but get no KL gradient. The k3 VALUE clamp (rl.kl_clamp, default 10 as verl)
# acts much earlier, at Δ ≈ 2.6 (and, for tokens far MORE likely than under the reference, at Δ ≈ −11); this cap
# only keeps exp finite when the clamp is off.
K3_MAX_LOG_RATIO = 20.0

# The policy ratio's log is clamped to ±20 before exp, as verl's core_algos clamps its log-ratio: a token whose
# log-ratio passes ~88 makes ρ = inf in float32, and then ρ·A with A = 0 (a group of equal rewards) or SAPO's gate
# gradient σ'·ρ a NaN, for which the non-finite guard skips the whole update. No clip range, gate or correction bound
# comes near e^20 ≈ 4.9e8; past it a token's ratio (GSPO: an answer's s_i) is held there and gets no gradient (with
# A < 0 and no dual clip, PPO's term would be ρ·A, far outside any trust region).
MAX_LOG_RATIO = 20.0


# ---------------------------------------------------------------- KL estimators
# All three take the per-token log-probs of the sampled token under π (logp) and π_ref (logp_ref). For tokens
# sampled from π, E[k1] = E[k3] = KL(π‖π_ref) and E[k2] ≈ KL(π‖π_ref) to second order. Used as LOSS terms (the
# gradient flows through logp only, the sampling distribution is not differentiated), their expected gradients are:
#   k1 → 0                          (E_π[∇ log π] = 0: k1 in the loss does nothing in expectation)
#   k2 → ∇ KL(π‖π_ref)              (the forward-in-π KL that the objective names)
#   k3 → ∇ KL(π_ref‖π)              (the reverse KL, as in DeepSeekMath/GRPO; Σ π ∇k3 = π − π_ref for logits)
# tests/test_losses.py checks these three statements exactly on a categorical distribution.


def kl_k1(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
  """k1 = log π − log π_ref: unbiased for KL(π‖π_ref) as a value; zero expected gradient as a loss term."""
  return logp - logp_ref


def kl_k2(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
  """k2 = ½ (log π − log π_ref)²: as a loss term its expected gradient is ∇ KL(π‖π_ref)."""
  return 0.5 * jnp.square(logp - logp_ref)


def kl_k3(logp: jax.Array, logp_ref: jax.Array, clamp: float | jax.Array = 0.0) -> jax.Array:
  """k3 = π_ref/π − log(π_ref/π) − 1 ≥ 0 (GRPO's estimator); as a loss term its expected gradient is
  ∇ KL(π_ref‖π). `clamp` > 0 caps the value (verl's ±10 on low_var_kl), and with it the gradient, which is
  1 − π_ref/π below the cap and 0 above it: one token with π ≪ π_ref would otherwise contribute up to e^20 to the
  loss and a gradient as large. 0 turns it off (Δ is still capped at K3_MAX_LOG_RATIO). Traceable in `clamp`."""
  delta = jnp.minimum(logp_ref - logp, K3_MAX_LOG_RATIO)
  # expm1 avoids the cancellation of exp(Δ) − 1 near Δ = 0; the max guards the last ulp so k3 is never < 0.
  k3 = jnp.maximum(jnp.expm1(delta) - delta, 0.0)
  return jnp.where(clamp > 0, jnp.minimum(k3, clamp), k3)


def kl_estimate(name: str, logp: jax.Array, logp_ref: jax.Array, *,
                k3_clamp: float | jax.Array = 0.0) -> jax.Array:
  """The per-token estimator chosen by name ('k1' | 'k2' | 'k3'); `k3_clamp` is k3's value clamp (kl_k3)."""
  if name not in KL_ESTIMATORS:
    raise ValueError(f"kl_estimator={name!r} is not one of {KL_ESTIMATORS}; set rl.kl_estimator to one of them.")
  if name == "k3":
    return kl_k3(logp, logp_ref, k3_clamp)
  return kl_k1(logp, logp_ref) if name == "k1" else kl_k2(logp, logp_ref)


# ---------------------------------------------------------------- masking helpers


def _valid(mask_NxL: jax.Array) -> jax.Array:
  return mask_NxL > 0


def _clean(x_NxL: jax.Array, mask_NxL: jax.Array) -> jax.Array:
  """float32 copy with padding set to 0, so later exp/log on padding stay finite."""
  return jnp.where(_valid(mask_NxL), x_NxL.astype(jnp.float32), 0.0)


def _token_mean(x_NxL: jax.Array, mask_NxL: jax.Array) -> jax.Array:
  m_NxL = _valid(mask_NxL)
  return jnp.sum(jnp.where(m_NxL, x_NxL, 0.0)) / jnp.maximum(jnp.sum(m_NxL), 1)


def _masked_max(x_NxL: jax.Array, mask_NxL: jax.Array) -> jax.Array:
  m_NxL = _valid(mask_NxL)
  return jnp.where(jnp.any(m_NxL), jnp.max(jnp.where(m_NxL, x_NxL, -jnp.inf)), 0.0)


def _masked_min(x_NxL: jax.Array, mask_NxL: jax.Array) -> jax.Array:
  m_NxL = _valid(mask_NxL)
  return jnp.where(jnp.any(m_NxL), jnp.min(jnp.where(m_NxL, x_NxL, jnp.inf)), 0.0)


# ---------------------------------------------------------------- aggregation


def aggregate(loss_NxL: jax.Array, mask_NxL: jax.Array, mode: str, *,
              norm_len: Optional[float] = None) -> jax.Array:
  """Reduce a per-token quantity to a scalar; the modes differ in how they weight long vs short answers.

  'seq_mean_token_mean'     GRPO: mean over rows of each row's token mean (empty rows count as 0 in the mean)
  'token_mean'              DAPO: sum over all valid tokens / number of valid tokens
  'seq_mean_token_sum'      verl's seq-mean-token-sum: mean over rows of each row's token sum (a long answer weighs
                            by its length; the loss scale grows with it)
  'seq_mean_token_sum_norm' Dr.GRPO: each row's token sum / norm_len (a constant), mean over rows
  """
  if mode not in AGG_MODES:
    raise ValueError(f"aggregation mode {mode!r} is not one of {AGG_MODES}; set rl.loss_agg to one of them.")
  m_NxL = _valid(mask_NxL)
  x_NxL = jnp.where(m_NxL, loss_NxL, 0.0)
  if mode == "token_mean":
    return jnp.sum(x_NxL) / jnp.maximum(jnp.sum(m_NxL), 1)
  row_sum_N = jnp.sum(x_NxL, axis=1)
  if mode == "seq_mean_token_mean":
    return jnp.mean(row_sum_N / jnp.maximum(jnp.sum(m_NxL, axis=1), 1))
  if mode == "seq_mean_token_sum":
    return jnp.mean(row_sum_N)
  if norm_len is None or norm_len <= 0:
    raise ValueError(f"'seq_mean_token_sum_norm' needs norm_len > 0, got {norm_len}; pass the max completion length.")
  return jnp.mean(row_sum_N / norm_len)


# ---------------------------------------------------------------- policy objectives


def _clipped(ratio: jax.Array, adv: jax.Array, eps_low, eps_high, dual_clip) -> jax.Array:
  """min(ρA, clip(ρ, 1−eps_low, 1+eps_high)A), and for A < 0 at least dual_clip·A when dual_clip > 1 (Ye et al.
  2020's dual clip, verl's clip_ratio_c): without it a negative advantage's loss −ρA grows without bound in ρ.
  Every hyper-parameter enters through arithmetic, so each may be a traced (vmapped) value."""
  obj = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
  return jnp.where((dual_clip > 1) & (adv < 0), jnp.maximum(obj, dual_clip * adv), obj)


def _clip_stats(ratio: jax.Array, adv: jax.Array, mask: jax.Array, eps_low, eps_high,
                dual_clip) -> Dict[str, jax.Array]:
  """Where a clipped branch is strictly active, i.e. where the gradient is cut, by side: low = ρ < 1 − eps_low with
  A < 0; high = ρ > 1 + eps_high with A > 0; dual = ρ > dual_clip with A < 0 (dual clip on). Fractions of valid
  tokens/sequences."""
  low = (ratio < 1.0 - eps_low) & (adv < 0)
  high = (ratio > 1.0 + eps_high) & (adv > 0)
  dual = (dual_clip > 1) & (ratio > dual_clip) & (adv < 0)
  return {
      "clip_frac_low": _token_mean(low.astype(jnp.float32), mask),
      "clip_frac_high": _token_mean(high.astype(jnp.float32), mask),
      "clip_frac_dual": _token_mean(dual.astype(jnp.float32), mask),
      "ratio_mean": _token_mean(ratio, mask),
      "ratio_max": _masked_max(ratio, mask),
      "ratio_min": _masked_min(ratio, mask),
  }


def clipped_surrogate(logp_NxL: jax.Array, old_logp_NxL: jax.Array, adv_NxL: jax.Array, mask_NxL: jax.Array, *,
                      eps_low, eps_high, dual_clip=0.0) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """PPO/DAPO clip-higher objective per token, min(ρA, clip(ρ, 1−eps_low, 1+eps_high)A) (dual-clipped for A < 0
  when dual_clip > 1, see _clipped), 0 on padding.

  aux: clip_frac_low, clip_frac_high, clip_frac_dual (see _clip_stats), ratio_mean, ratio_max, ratio_min over valid
  tokens.
  """
  ratio_NxL = jnp.exp(_log_ratio(logp_NxL, old_logp_NxL, mask_NxL))
  a_NxL = _clean(adv_NxL, mask_NxL)
  obj_NxL = jnp.where(_valid(mask_NxL), _clipped(ratio_NxL, a_NxL, eps_low, eps_high, dual_clip), 0.0)
  return obj_NxL, _clip_stats(lax.stop_gradient(ratio_NxL), a_NxL, mask_NxL, eps_low, eps_high, dual_clip)


def _log_ratio(logp_NxL: jax.Array, old_logp_NxL: jax.Array, mask_NxL: jax.Array) -> jax.Array:
  """log ρ = log π − log π_old on valid tokens (0 on padding), clamped to ±MAX_LOG_RATIO."""
  diff_NxL = _clean(logp_NxL, mask_NxL) - _clean(old_logp_NxL, mask_NxL)
  return jnp.clip(diff_NxL, -MAX_LOG_RATIO, MAX_LOG_RATIO)


def _sequence_log_ratio(logp_NxL: jax.Array, old_logp_NxL: jax.Array, mask_NxL: jax.Array) -> jax.Array:
  diff_NxL = _clean(logp_NxL, mask_NxL) - _clean(old_logp_NxL, mask_NxL)
  log_s_N = jnp.sum(diff_NxL, axis=1) / jnp.maximum(jnp.sum(_valid(mask_NxL), axis=1), 1)
  return jnp.clip(log_s_N, -MAX_LOG_RATIO, MAX_LOG_RATIO)


def gspo_token_objective(logp_NxL: jax.Array, old_logp_NxL: jax.Array, adv_NxL: jax.Array, mask_NxL: jax.Array, *,
                         eps_low, eps_high, dual_clip=0.0) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """GSPO-token: per-token ratio s_{i,t} = sg(s_i) · π(y_t)/sg(π(y_t)), equal to s_i in value (so clipping is
  decided per sequence) but with per-token advantages in the gradient. Reduce with 'seq_mean_token_mean'."""
  valid_NxL = _valid(mask_NxL)
  log_s_N = _sequence_log_ratio(logp_NxL, old_logp_NxL, mask_NxL)
  s_N = jnp.exp(log_s_N)
  logp_NxL = _clean(logp_NxL, mask_NxL)
  # an answer whose log s_i was clamped (|·| = MAX_LOG_RATIO) is held there with no gradient, as a token's ratio
  # is: the per-token path below would otherwise carry s_i = e^20 times A into every token's gradient
  held_N = jnp.abs(log_s_N) >= MAX_LOG_RATIO
  s_NxL = lax.stop_gradient(s_N)[:, None] * jnp.where(held_N[:, None], 1.0,
                                                      jnp.exp(logp_NxL - lax.stop_gradient(logp_NxL)))
  a_NxL = _clean(adv_NxL, mask_NxL)
  obj_NxL = jnp.where(valid_NxL, _clipped(s_NxL, a_NxL, eps_low, eps_high, dual_clip), 0.0)
  return obj_NxL, _clip_stats(lax.stop_gradient(s_NxL), a_NxL, mask_NxL, eps_low, eps_high, dual_clip)


def cispo_objective(logp_NxL: jax.Array, old_logp_NxL: jax.Array, adv_NxL: jax.Array, mask_NxL: jax.Array, *,
                    eps_low, eps_high) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4-5; verl compute_policy_loss_cispo): J_t = sg(r̂_t)·A_t·log π_t with
  r̂ = clip(ρ, 1 − eps_low, 1 + eps_high). The stop-gradient weight is clipped, not the update: every token keeps
  its REINFORCE gradient sg(r̂)·A·∇log π, also where ρ left the range (PPO's clip zeroes those, the low-probability
  "reflective" tokens among them). Written as sg(r̂)·A·exp(log π − sg(log π)): the same gradient, and the value
  sg(r̂)·A a surrogate can be compared with. aux: clip_frac_low / clip_frac_high = tokens whose weight was clipped
  (ρ < 1 − eps_low, ρ > 1 + eps_high; either sign of A), clip_frac_dual 0, the ratio's mean/max/min."""
  valid_NxL = _valid(mask_NxL)
  lp_NxL = _clean(logp_NxL, mask_NxL)
  ratio_NxL = jnp.exp(_log_ratio(logp_NxL, old_logp_NxL, mask_NxL))
  r_hat_NxL = lax.stop_gradient(jnp.clip(ratio_NxL, 1.0 - eps_low, 1.0 + eps_high))
  a_NxL = _clean(adv_NxL, mask_NxL)
  obj_NxL = jnp.where(valid_NxL, r_hat_NxL * a_NxL * jnp.exp(lp_NxL - lax.stop_gradient(lp_NxL)), 0.0)
  ratio = lax.stop_gradient(ratio_NxL)
  aux = {"clip_frac_low": _token_mean((ratio < 1.0 - eps_low).astype(jnp.float32), mask_NxL),
         "clip_frac_high": _token_mean((ratio > 1.0 + eps_high).astype(jnp.float32), mask_NxL),
         "clip_frac_dual": jnp.zeros((), jnp.float32),
         "ratio_mean": _token_mean(ratio, mask_NxL), "ratio_max": _masked_max(ratio, mask_NxL),
         "ratio_min": _masked_min(ratio, mask_NxL)}
  return obj_NxL, aux


def sapo_objective(logp_NxL: jax.Array, old_logp_NxL: jax.Array, adv_NxL: jax.Array, mask_NxL: jax.Array, *,
                   tau_pos, tau_neg) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """SAPO (Gao et al. 2025, arXiv 2511.20347, Eq. 5-6 and 10-12): the hard clip replaced by a smooth gate,
  J_t = f(ρ_t)·A_t with f(ρ) = (4/τ)·σ(τ(ρ − 1)), τ = tau_pos where A > 0, tau_neg elsewhere (1.0 / 1.05: negative
  advantages' gate closes faster). Its gradient is w·ρ·A·∇log π with the gate weight w = 4σ(τ(ρ−1))(1 − σ(τ(ρ−1))):
  1 on-policy (ρ = 1), decaying smoothly as ρ leaves 1 instead of dropping to 0 at 1 ± ε. aux: gate_mean (mean w),
  gated_frac (tokens with w < 1/2: the gate has more than halved their gradient), the ratio's mean/max/min."""
  valid_NxL = _valid(mask_NxL)
  ratio_NxL = jnp.exp(_log_ratio(logp_NxL, old_logp_NxL, mask_NxL))
  a_NxL = _clean(adv_NxL, mask_NxL)
  tau_NxL = jnp.where(a_NxL > 0, tau_pos, tau_neg)
  gate_NxL = jax.nn.sigmoid(tau_NxL * (ratio_NxL - 1.0))
  obj_NxL = jnp.where(valid_NxL, (4.0 / tau_NxL) * gate_NxL * a_NxL, 0.0)
  g = lax.stop_gradient(gate_NxL)
  w_NxL = 4.0 * g * (1.0 - g)
  ratio = lax.stop_gradient(ratio_NxL)
  aux = {"gate_mean": _token_mean(w_NxL, mask_NxL),
         "gated_frac": _token_mean((w_NxL < 0.5).astype(jnp.float32), mask_NxL),
         "ratio_mean": _token_mean(ratio, mask_NxL), "ratio_max": _masked_max(ratio, mask_NxL),
         "ratio_min": _masked_min(ratio, mask_NxL)}
  return obj_NxL, aux


def _objective(name: str, logp_NxL, old_logp_NxL, adv_NxL, mask_NxL, *, ratio_level, eps_low, eps_high, dual_clip,
               tau_pos, tau_neg):
  """(per-token objective, aux, tokens whose gradient it already cuts (PPO's clip; None for the others))."""
  if name == "cispo":
    return (*cispo_objective(logp_NxL, old_logp_NxL, adv_NxL, mask_NxL, eps_low=eps_low, eps_high=eps_high), None)
  if name == "sapo":
    return (*sapo_objective(logp_NxL, old_logp_NxL, adv_NxL, mask_NxL, tau_pos=tau_pos, tau_neg=tau_neg), None)
  objective = clipped_surrogate if ratio_level == "token" else gspo_token_objective
  surr_NxL, aux = objective(logp_NxL, old_logp_NxL, adv_NxL, mask_NxL, eps_low=eps_low, eps_high=eps_high,
                            dual_clip=dual_clip)
  # the ratio the clip reads: GSPO's is the answer's s_i on each of its tokens, not the token's own
  log_ratio_NxL = (jnp.broadcast_to(_sequence_log_ratio(logp_NxL, old_logp_NxL, mask_NxL)[:, None], logp_NxL.shape)
                   if ratio_level == "sequence" else _log_ratio(logp_NxL, old_logp_NxL, mask_NxL))
  ratio_NxL = jnp.exp(lax.stop_gradient(log_ratio_NxL))
  a_NxL = _clean(adv_NxL, mask_NxL)
  clipped_NxL = (((ratio_NxL > 1.0 + eps_high) & (a_NxL > 0)) | ((ratio_NxL < 1.0 - eps_low) & (a_NxL < 0))
                 | ((dual_clip > 1) & (ratio_NxL > dual_clip) & (a_NxL < 0)))
  return surr_NxL, aux, clipped_NxL


def policy_loss(logp_NxL: jax.Array, old_logp_NxL: jax.Array, ref_logp_NxL: Optional[jax.Array],
                adv_NxL: jax.Array, mask_NxL: jax.Array, *, eps_low, eps_high, beta,
                kl_estimator: str = "k3", agg: str = "seq_mean_token_mean", norm_len: Optional[float] = None,
                ratio_level: str = "token", dual_clip=0.0, kl_clamp=0.0,
                is_w_NxL: Optional[jax.Array] = None, objective: str = "clip", tau_pos=1.0, tau_neg=1.05,
                token_select: str = "all", select_cfg=None, ent_NxL: Optional[jax.Array] = None,
                select_u_NxL: Optional[jax.Array] = None,
                entropy_coef: float = 0.0) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """loss = −aggregate(w·surrogate − β·kl_est + c·H): DeepSeekMath's GRPO objective with the KL inside the token
  sum, and an entropy bonus c = entropy_coef.

  entropy_coef c: loss −= c·aggregate(H), H = ent_NxL the entropy of the policy's whole next-token distribution at
  each loss token (the policy pass's, with its gradient), reduced with the same `agg` as the policy loss (verl's
  entropy_coeff: pg_loss − c·agg_loss(entropy)); agg is linear, so it is added to the per-token term. A Python 0
  (the default) adds nothing to the program. Like the KL it is not weighted by is_w_NxL or the token selection.

  is_w_NxL: the rollout correction's per-token importance weight w = f(π_prox/μ) (rl/correction.py; None = 1), a
  constant of the update (stop-gradient): it multiplies each token's surrogate only, as AReaL's decoupled objective
  and verl's rollout correction apply it. The KL term is not weighted: it regularises π towards π_ref on the tokens
  the update trains (tokens a correction rejects are already out of mask_NxL), and a weight would scale that
  regulariser token by token with the sampler's rounding noise.

  objective: 'clip' (PPO's clipped surrogate; GSPO-token under ratio_level='sequence'), 'cispo' (cispo_objective:
  the clip range is the IS weight's) or 'sapo' (sapo_objective, temperatures tau_pos / tau_neg; the clip range and
  dual clip are not read). token_select (token_select.py, parameters in `select_cfg`, the rl config group): which
  tokens keep their policy gradient, from the current policy's entropies `ent_NxL` and the covariance term;
  Clip-Cov's uniforms `select_u_NxL`.

  ratio_level 'token' is the PPO/GRPO per-token ratio; 'sequence' is GSPO-token (sequence-level ratio and clip).
  dual_clip (> 1, 0 = off) bounds a negative advantage's loss; kl_clamp (> 0, 0 = off) caps k3's value. The
  numeric hyper-parameters (eps_low, eps_high, beta, dual_clip, kl_clamp) may be traced values (vmapped sweeps).
  ref_logp_NxL may be None only when β == 0 (no KL in the loss, e.g. KL folded into the reward); then the 'kl'
  metric is omitted. metrics: surrogate, kl (chosen estimator as used in the loss, mean over valid tokens),
  kl_clamp_frac (tokens whose k3 hit the clamp), clip_frac_low, clip_frac_high, clip_frac_dual, ratio_mean,
  ratio_max, ratio_min.
  """
  if ratio_level not in RATIO_LEVELS:
    raise ValueError(f"ratio_level={ratio_level!r} is not one of {RATIO_LEVELS}; set rl.ratio_level.")
  if kl_estimator not in KL_ESTIMATORS:
    raise ValueError(f"kl_estimator={kl_estimator!r} is not one of {KL_ESTIMATORS}; set rl.kl_estimator.")
  bonus = not (isinstance(entropy_coef, (int, float)) and entropy_coef == 0)
  if bonus and ent_NxL is None:
    raise ValueError(f"policy_loss: entropy_coef={entropy_coef} needs the policy's entropies ent_NxL.")
  if ref_logp_NxL is None and not (isinstance(beta, (int, float)) and beta == 0):
    raise ValueError(f"policy_loss: ref_logp_NxL is None but beta={beta}; pass reference log-probs or beta=0.")
  if objective not in OBJECTIVES:
    raise ValueError(f"objective={objective!r} is not one of {OBJECTIVES}; set rl.objective.")
  surr_NxL, metrics, clipped_NxL = _objective(objective, logp_NxL, old_logp_NxL, adv_NxL, mask_NxL,
                                              ratio_level=ratio_level, eps_low=eps_low, eps_high=eps_high,
                                              dual_clip=dual_clip, tau_pos=tau_pos, tau_neg=tau_neg)
  if is_w_NxL is not None:
    surr_NxL = surr_NxL * _clean(lax.stop_gradient(is_w_NxL), mask_NxL)
  if token_select != "all":
    sel = token_select_lib.choose(token_select, select_cfg, logp_NxL=_clean(logp_NxL, mask_NxL),
                              adv_NxL=_clean(adv_NxL, mask_NxL), mask_NxL=mask_NxL, ent_NxL=ent_NxL,
                              clipped_NxL=clipped_NxL, u_NxL=select_u_NxL)
    # KL-Cov: −coef·|log π − log π_old| on its tokens (the gradient flows through log π). |d| as d·sign(d): the
    # subgradient 0 at d = 0 that torch's abs has (verl's on-policy ratio is exactly 1); jnp.abs's is 1 there,
    # which pushed every chosen token's log π down by coef on an on-policy update.
    d_NxL = _clean(logp_NxL, mask_NxL) - _clean(old_logp_NxL, mask_NxL)
    abs_kl_NxL = d_NxL * lax.stop_gradient(jnp.sign(d_NxL))
    surr_NxL = surr_NxL * sel.pg_NxL - select_cfg.kl_cov_coef * sel.kl_NxL * abs_kl_NxL
    metrics = dict(metrics, **sel.metrics)
  per_token_NxL = surr_NxL
  metrics = dict(metrics, surrogate=aggregate(surr_NxL, mask_NxL, agg, norm_len=norm_len))
  if ref_logp_NxL is not None:
    lp_NxL, ref_NxL = _clean(logp_NxL, mask_NxL), _clean(ref_logp_NxL, mask_NxL)
    kl_NxL = kl_estimate(kl_estimator, lp_NxL, ref_NxL, k3_clamp=kl_clamp)
    per_token_NxL = surr_NxL - beta * kl_NxL
    metrics["kl"] = _token_mean(lax.stop_gradient(kl_NxL), mask_NxL)
    if kl_estimator == "k3":
      hit_NxL = (kl_clamp > 0) & (kl_k3(lax.stop_gradient(lp_NxL), ref_NxL) > kl_clamp)
      metrics["kl_clamp_frac"] = _token_mean(hit_NxL.astype(jnp.float32), mask_NxL)
  if bonus:
    per_token_NxL = per_token_NxL + entropy_coef * _clean(ent_NxL, mask_NxL)
  loss = -aggregate(per_token_NxL, mask_NxL, agg, norm_len=norm_len)
  return loss, metrics


# ---------------------------------------------------------------- critic


def value_loss(values_NxL: jax.Array, old_values_NxL: jax.Array, returns_NxL: jax.Array, mask_NxL: jax.Array, *,
               clip: float, agg: str = "token_mean",
               norm_len: Optional[float] = None) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """PPO clipped value loss ½·max((V − R)², (V_old + clip(V − V_old, ±clip) − R)²), aggregated with `agg`.

  The clipped term stops the critic from moving far from the values the advantages were computed with.
  aux: value_clip_frac = fraction of valid tokens where V moved past the clip range and the clipped error is the
  larger (strictly).
  """
  v_NxL = _clean(values_NxL, mask_NxL)
  old_NxL = _clean(old_values_NxL, mask_NxL)
  ret_NxL = _clean(returns_NxL, mask_NxL)
  v_clipped_NxL = old_NxL + jnp.clip(v_NxL - old_NxL, -clip, clip)
  err_NxL = jnp.square(v_NxL - ret_NxL)
  err_clipped_NxL = jnp.square(v_clipped_NxL - ret_NxL)
  loss = aggregate(0.5 * jnp.maximum(err_NxL, err_clipped_NxL), mask_NxL, agg, norm_len=norm_len)
  # Where V moved past the clip range (elsewhere v_clipped equals v exactly and a rounding-level difference of the
  # two squared errors would decide the count).
  hit_NxL = (jnp.abs(v_NxL - old_NxL) > clip) & (err_clipped_NxL > err_NxL)
  clip_frac = _token_mean(hit_NxL.astype(jnp.float32), mask_NxL)
  return loss, {"value_clip_frac": lax.stop_gradient(clip_frac)}
