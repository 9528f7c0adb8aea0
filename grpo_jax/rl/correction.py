"""Rollout correction: the importance weight between the proximal policy and the behaviour policy, built once per step.

Three policies (AReaL's decoupled PPO: Hilton et al. 2021, arXiv 2110.00641; Fu et al. 2025, arXiv 2505.24298):
  μ        the behaviour policy: the per-token log-probs the sampler recorded at sampling time (`behav_logp_NxL`,
           never recomputed), in the sampler's numerics (`sampling.dtype`) and, with carried rows, older weights;
  π_prox   the proximal policy: this step's pre-update weights in the trainer's numerics (`old_logp_NxL`): the
           PPO clip's anchor. It is a forward at the current params when `needs_proximal(config)`, else μ itself
           (exact on-policy mode: every token sampled by these weights with the trainer's numerics);
  π_θ      the policy being updated.
The loss is  −agg[ w_t · f(π_θ/π_prox, A) ]  with ρ_t = π_prox(o_t)/μ(o_t) and w_t a stop-gradient function of ρ
(`Correction.is_w_NxL`; the kinds below), and the tokens a kind rejects removed from the loss's mask (so they leave
its normalisers too, as verl's rejection sampling does and slime's #657 fix makes MIS do). π_prox and μ are fixed
during the update, so the weights are computed once, before it, and ride in the minibatch data.

Kinds (rl.rollout_correction), each as its source defines it:
  none      w = 1, nothing masked.
  tis       token-level truncated IS, w = min(ρ, C), C = rl.is_cap. Yao et al. 2025, "Your efficient RL framework
            secretly brings you off-policy RL training" (C = 2); verl rollout_is='token'.
  mis       token-level masked IS, w = ρ where lo ≤ ρ ≤ hi, the token masked elsewhere; lo, hi = rl.mis_lo,
            rl.mis_hi. Liu, Li et al. 2025, "When speed kills stability: demystifying RL collapse from the
            training-inference mismatch" (ρ·1{ρ ≤ C}, C = 2: lo = 0); verl's token rejection keeps [lo, hi].
  icepop    the same on [α, β] = [rl.icepop_lo, rl.icepop_hi] = [0.5, 5]: IcePop's masking function M(k) = k for
            α ≤ k ≤ β, 0 otherwise, k = π_train(θ_old)/π_infer(θ_old) (Ling team, Ring-1T, arXiv 2510.18855).
  seq_mask  sequence-level geometric-mean rejection with a per-token veto (verl's geo_rs): a row is masked whole
            when ρ_geo = exp(mean_t log ρ_t) ∉ [rl.seq_mask_lo, rl.seq_mask_hi] (1/1.001, 1.001) or when any of its
            tokens has ρ_t < rl.is_veto (1e-4; 0 = off); no weight (w = 1). verl docs/algo/rollout_corr_math.md
            §3.3.3, §3.5.
Statistics (`metrics`, logged whenever π_prox is a forward): train/is_weight_mean, train/is_weight_max (of the weight
applied, over the tokens kept), train/is_masked_frac (completion tokens the correction removed), train/mismatch_kl
(k3 = ρ − log ρ − 1, token mean: an unbiased estimate of KL(μ‖π_prox), the tokens being μ's samples; verl's
rollout_corr k3_kl). μ is recorded untruncated (sampling.py), as π_prox and π_θ are scored: with sampling.top_k /
top_p the tokens come from the truncated distribution instead, which no weight here corrects and which biases that
estimate too (DESIGN.md: π is always the untruncated softmax(logits / temperature)).
"""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rl import losses

KINDS = ("none", "tis", "mis", "icepop", "seq_mask")
# log ρ is capped here before exp: ρ above e^30 is as rejected (mis, icepop) or as truncated (tis) as ρ = e^30, and
# exp stays finite. Comparisons with the thresholds are made on log ρ itself.
_MAX_LOG_RHO = 30.0


class Correction(NamedTuple):
  """One step's correction: the weight (None: w = 1 everywhere, nothing to multiply), the loss's mask with the
  rejected tokens removed, and the step's statistics ({} in exact on-policy mode)."""
  is_w_NxL: jax.Array | None
  mask_NxL: jax.Array
  metrics: dict


def sampler_dtype(config) -> str:
  """The sampler's compute dtype: sampling.dtype, or ('') the model's."""
  return config.sampling.get("dtype", "") or config.model.dtype


def needs_proximal(config) -> bool:
  """Whether π_prox must be a forward at the current params rather than the sampler's own log-probs: a correction
  is on (it measures ρ), the sampler's numerics differ from the trainer's (sampling.dtype), the model is bf16
  (the bf16 decode and training forward differ by rounding, so ρ would not start at 1 for μ = 1), or partial
  rollouts carry tokens drawn by older weights over older KV (rollout/carry.py)."""
  return (config.rl.get("rollout_correction", "none") != "none" or sampler_dtype(config) != config.model.dtype
          or config.model.dtype == "bfloat16" or bool(config.rl.get("partial_rollouts", False)))


# ------------------------------------------------------------------------------------------ the kinds


def truncated(log_rho_NxL: jax.Array, cap) -> tuple[jax.Array, jax.Array]:
  """TIS: (w = min(ρ, cap), every token kept)."""
  w_NxL = jnp.minimum(jnp.exp(jnp.minimum(log_rho_NxL, _MAX_LOG_RHO)), cap)
  return w_NxL, jnp.ones_like(log_rho_NxL, bool)


# The windows are closed, [lo, hi], and compared in log space on float32 log ρ. A bound is at log_bound(b): log(b)
# taken on the host in float64 and rounded once to the nearest float32, the value a log ρ equal to log(b) has once
# it is a float32 itself. So a row (or token) exactly at a bound is kept, one float32 step outside is masked, and the
# veto (ρ_t < veto, strict) spares a token at it. jnp.log(b) rounded b to float32 first and took its log in float32:
# near 1 that moves the bound by many steps (lo = 1/1.001: 27 float32 steps inside, masking rows at ρ_geo = lo;
# hi = 1.001: 16 steps outside, keeping rows above hi). What is compared is the float32 log ρ (for seq_mask its
# float32 row mean): its own rounding is the input's. A traced bound (none today: vmapped_runs.TRACEABLE) falls
# back to jnp.log.


def log_bound(b):
  """float32 nearest log(b), from float64 (-inf for b <= 0, so lo = 0 / veto = 0 bound nothing); jnp.log if traced."""
  if not isinstance(b, (int, float, np.floating)):
    return jnp.log(b)
  return np.float32(math.log(b)) if b > 0 else np.float32(-np.inf)


def masked(log_rho_NxL: jax.Array, lo, hi) -> tuple[jax.Array, jax.Array]:
  """MIS / IcePop: (w = ρ where lo ≤ ρ ≤ hi else 0, that window as the kept tokens). lo = 0 keeps every ρ below
  hi (log 0 = −inf)."""
  keep_NxL = (log_rho_NxL >= log_bound(lo)) & (log_rho_NxL <= log_bound(hi))
  return jnp.where(keep_NxL, jnp.exp(jnp.minimum(log_rho_NxL, _MAX_LOG_RHO)), 0.0), keep_NxL


def sequence_masked(log_rho_NxL: jax.Array, valid_NxL: jax.Array, lo, hi,
                    veto) -> tuple[jax.Array, jax.Array]:
  """Geometric-mean rejection with veto: (w = 1, rows with lo ≤ exp(mean_t log ρ_t) ≤ hi — closed, on the float32
  mean (log_bound above) — and no valid token with ρ_t < veto kept whole). A row without tokens
  has ρ_geo = 1."""
  n_N = jnp.maximum(jnp.sum(valid_NxL, axis=1), 1)
  geo_log_N = jnp.sum(jnp.where(valid_NxL, log_rho_NxL, 0.0), axis=1) / n_N
  vetoed_N = jnp.any(valid_NxL & (log_rho_NxL < log_bound(veto)), axis=1)  # veto 0: log 0 = −inf, never
  keep_N = (geo_log_N >= log_bound(lo)) & (geo_log_N <= log_bound(hi)) & ~vetoed_N
  return jnp.ones_like(log_rho_NxL), jnp.broadcast_to(keep_N[:, None], log_rho_NxL.shape)


def weights(kind: str, log_rho_NxL: jax.Array, valid_NxL: jax.Array, rl) -> tuple[jax.Array, jax.Array]:
  """(w_NxL, keep_NxL) of `kind` with the thresholds of the config group `rl` (traceable: they enter through
  arithmetic and comparisons only)."""
  if kind not in KINDS:
    raise ValueError(f"rl.rollout_correction={kind!r} is not one of {KINDS}; set it to one of them.")
  if kind == "tis":
    return truncated(log_rho_NxL, rl.is_cap)
  if kind == "mis":
    return masked(log_rho_NxL, rl.mis_lo, rl.mis_hi)
  if kind == "icepop":
    return masked(log_rho_NxL, rl.icepop_lo, rl.icepop_hi)
  if kind == "seq_mask":
    return sequence_masked(log_rho_NxL, valid_NxL, rl.seq_mask_lo, rl.seq_mask_hi, rl.is_veto)
  return jnp.ones_like(log_rho_NxL), jnp.ones_like(log_rho_NxL, bool)


# ------------------------------------------------------------------------------------------ the step's input


def build(config, prox_logp_NxL: jax.Array, behav_logp_NxL: jax.Array, mask_NxL: jax.Array) -> Correction:
  """The step's one importance-weight input to the loss (see the module docstring). In exact on-policy mode
  (not needs_proximal: π_prox IS μ) nothing is computed: no weight, the mask as it is, no statistics."""
  if not needs_proximal(config):
    return Correction(None, mask_NxL, {})
  kind = config.rl.get("rollout_correction", "none")
  valid_NxL = mask_NxL > 0
  prox_NxL = jnp.where(valid_NxL, jax.lax.stop_gradient(prox_logp_NxL).astype(jnp.float32), 0.0)
  behav_NxL = jnp.where(valid_NxL, jax.lax.stop_gradient(behav_logp_NxL).astype(jnp.float32), 0.0)
  log_rho_NxL = prox_NxL - behav_NxL
  w_NxL, keep_NxL = weights(kind, log_rho_NxL, valid_NxL, config.rl)
  kept_NxL = valid_NxL & keep_NxL
  w_NxL = jax.lax.stop_gradient(jnp.where(kept_NxL, w_NxL, 0.0))
  n_valid = jnp.maximum(jnp.sum(valid_NxL), 1)
  metrics = {
      "train/is_weight_mean": jnp.sum(w_NxL) / jnp.maximum(jnp.sum(kept_NxL), 1),
      "train/is_weight_max": jnp.max(jnp.where(kept_NxL, w_NxL, 0.0)),
      "train/is_masked_frac": jnp.sum(valid_NxL & ~keep_NxL) / n_valid,
      # KL(μ‖π_prox) by k3 on μ's samples: e^{log ρ} − log ρ − 1 (losses.kl_k3 with logp = μ, logp_ref = π_prox)
      "train/mismatch_kl": jnp.sum(jnp.where(valid_NxL, losses.kl_k3(behav_NxL, prox_NxL), 0.0)) / n_valid,
  }
  if kind == "none":
    return Correction(None, mask_NxL, metrics)
  return Correction(w_NxL, mask_NxL * kept_NxL.astype(mask_NxL.dtype), metrics)
