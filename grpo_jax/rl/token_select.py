"""Which tokens carry the policy gradient (rl.token_select), usable with any objective (losses.policy_loss).

Each rule reads batch statistics of the minibatch the objective sees (its valid tokens): the entropies of the
current policy, or the covariance term of the entropy mechanism,
    cov_t = (log π_t − mean log π) · (A_t − mean A)        (means over the valid tokens; stop-gradient)
whose batch mean is Cov(log π, A): for a softmax policy the entropy changes by about −η·Cov(log π, A) per step of
natural policy gradient, −η·Cov(log π, π·A) of the plain gradient (Cui et al. 2025, arXiv 2505.22617), so tokens
of large positive cov_t are those that collapse the entropy.

  all          every token (the objective as it is).
  top_entropy  policy gradient on the tokens whose entropy is among the top `rl.select_frac` of the minibatch's
               (ceil(frac · n) highest; ties at the threshold kept), the rest none; normalisers unchanged (Wang et
               al. 2025, arXiv 2506.01939, "Beyond the 80/20 rule": frac 0.2).
  clip_cov     Clip-Cov: of the tokens with clip_cov_lb < cov_t < clip_cov_ub not already clipped by the objective,
               max(floor(clip_cov_ratio · n), 1) chosen uniformly at random (exactly that many, or all eligible
               when fewer) get no policy gradient (value and gradient 0). verl compute_policy_loss_clip_cov:
               ratio 2e-4, bounds (1, 5).
  kl_cov       KL-Cov: the max(floor(kl_cov_ratio · n), 1) tokens of largest cov_t (exactly that many: ties broken
               by position, as verl's topk) get a penalty
               kl_cov_coef · |log π − log π_old| (value and gradient). verl compute_policy_loss_kl_cov: ratio 2e-4,
               coefficient 1. verl's KL-Cov uses the unclipped surrogate ρA on every token; here the penalty is
               added to the chosen objective (rl.objective; PPO's clip by default), so it composes with any.
Clip-Cov's random choice reads one uniform per token (`u_NxL`), drawn afresh for each update from its own key
(rl_step.select_uniforms), so each update cuts an independent random subset, as verl's randperm per call. The
rules need the whole minibatch, so rl.packing (whose objective sees one micro-batch at a time) refuses them
(run/validate.py).
"""
import fractions
from typing import NamedTuple

import jax
import jax.numpy as jnp

KINDS = ("all", "top_entropy", "clip_cov", "kl_cov")


class Selection(NamedTuple):
  """pg_NxL: 1 where a token keeps its policy gradient; kl_NxL: 1 where KL-Cov's penalty applies; metrics."""
  pg_NxL: jax.Array
  kl_NxL: jax.Array
  metrics: dict


def _masked_mean(x_NxL: jax.Array, valid_NxL: jax.Array) -> jax.Array:
  return jnp.sum(jnp.where(valid_NxL, x_NxL, 0.0)) / jnp.maximum(jnp.sum(valid_NxL), 1)


def covariance(logp_NxL: jax.Array, adv_NxL: jax.Array, valid_NxL: jax.Array) -> jax.Array:
  """cov_t = (log π_t − mean log π)(A_t − mean A) over the valid tokens, 0 elsewhere, stop-gradient. Its mean over
  the valid tokens is the (population) covariance Cov(log π, A)."""
  lp_NxL = jax.lax.stop_gradient(jnp.where(valid_NxL, logp_NxL, 0.0))
  a_NxL = jax.lax.stop_gradient(jnp.where(valid_NxL, adv_NxL, 0.0))
  cov_NxL = (lp_NxL - _masked_mean(lp_NxL, valid_NxL)) * (a_NxL - _masked_mean(a_NxL, valid_NxL))
  return jnp.where(valid_NxL, cov_NxL, 0.0)


def kth_largest(x_NxL: jax.Array, where_NxL: jax.Array, k: jax.Array) -> jax.Array:
  """The k-th largest of x over `where` (k traced, ≥ 1); −inf when fewer than k entries qualify."""
  flat = jnp.sort(jnp.where(where_NxL, x_NxL, -jnp.inf).reshape(-1))[::-1]
  return jnp.take(flat, jnp.clip(k - 1, 0, flat.shape[0] - 1))


def rank_desc(x_NxL: jax.Array, where_NxL: jax.Array) -> jax.Array:
  """Each entry's place (0 = largest) in a stable descending sort of x over `where` (the rest after): equal values
  rank by position, so `rank < k` is exactly k entries when at least k qualify."""
  flat = jnp.where(where_NxL, x_NxL, -jnp.inf).reshape(-1)
  order = jnp.argsort(-flat, stable=True)
  return jnp.zeros_like(order).at[order].set(jnp.arange(flat.shape[0], dtype=order.dtype)).reshape(x_NxL.shape)


_EXACT_Q = 46340  # q·(p + 1) stays below 2^31 for p ≤ q ≤ this: _count's integer path cannot overflow int32


def _count(ratio, n: jax.Array, ceil: bool = False) -> jax.Array:
  """max(floor (or ceil) of ratio · n, 1), as an int32, for the decimal `ratio` the config names.

  In float32, 0.3 · 50 is 15.000001 (ceil: 16 tokens, not 15) and 0.65 · 180 is 116.99999 (floor: 116, not 117):
  the count was one off wherever ratio · n is an integer the float misses. A Python ratio is read as the fraction
  p/q its shortest decimal spells (0.3 → 3/10) and counted in integers, exactly, when q ≤ 46340 (every ratio of
  up to four decimals); finer ratios and a traced one use the float32 product, snapped to an integer within 2^-20
  of it (float32's own error is under 2^-22 relative)."""
  if isinstance(ratio, (int, float)) and not isinstance(ratio, bool):
    p, q = fractions.Fraction(repr(float(ratio))).as_integer_ratio()
    if q <= _EXACT_Q and p <= q:  # n·p/q = (n // q)·p + (n % q)·p/q, each part within int32
      n = n.astype(jnp.int32)
      whole, rest = (n // q) * p, (n % q) * p
      return jnp.maximum(whole + ((rest + q - 1) // q if ceil else rest // q), 1)
  x = ratio * n.astype(jnp.float32)
  r = jnp.round(x)
  x = jnp.where(jnp.abs(x - r) <= jnp.maximum(x, 1.0) * 2.0 ** -20, r, x)
  return jnp.maximum((jnp.ceil(x) if ceil else jnp.floor(x)).astype(jnp.int32), 1)


def choose(kind: str, rl, *, logp_NxL: jax.Array, adv_NxL: jax.Array, mask_NxL: jax.Array,
           ent_NxL: jax.Array | None = None, clipped_NxL: jax.Array | None = None,
           u_NxL: jax.Array | None = None) -> Selection:
  """The selection of rule `kind` with the parameters of the config group `rl` (select_frac, clip_cov_ratio,
  clip_cov_lb, clip_cov_ub, kl_cov_ratio). `clipped_NxL`: tokens whose gradient the objective already cuts
  (Clip-Cov skips them); `u_NxL`: Clip-Cov's uniforms. metrics: select_frac (tokens the rule picked: kept by
  top_entropy, cut by clip_cov, penalised by kl_cov), select_entropy (their mean entropy), select_cov (their mean
  cov_t; NaN when the rule picked no token, e.g. Clip-Cov with none eligible: no token was measured, and a 0 would
  pass for one in the step's mean over its updates, which skips NaN)."""
  if kind not in KINDS:
    raise ValueError(f"rl.token_select={kind!r} is not one of {KINDS}; set it to one of them.")
  valid_NxL = mask_NxL > 0
  ones = jnp.ones_like(mask_NxL, jnp.float32)
  if kind == "all":
    return Selection(ones, jnp.zeros_like(ones), {})
  n = jnp.sum(valid_NxL)
  cov_NxL = covariance(logp_NxL, adv_NxL, valid_NxL)
  if kind == "top_entropy":
    ent_NxL = jax.lax.stop_gradient(ent_NxL)
    picked_NxL = valid_NxL & (ent_NxL >= kth_largest(ent_NxL, valid_NxL, _count(rl.select_frac, n, ceil=True)))
    pg_NxL, kl_NxL = picked_NxL.astype(jnp.float32), jnp.zeros_like(ones)
  elif kind == "clip_cov":
    eligible_NxL = valid_NxL & (cov_NxL > rl.clip_cov_lb) & (cov_NxL < rl.clip_cov_ub)
    if clipped_NxL is not None:
      eligible_NxL = eligible_NxL & ~clipped_NxL
    # the k smallest uniforms among the eligible tokens: a uniformly random k-subset. By rank, not by a threshold:
    # float32 uniforms take 2^23 values, so among ~10^5 eligible tokens the k-th smallest is shared with another
    # token about once in 80 steps, and a threshold test then cut k + 1 tokens (as verl's randperm: exactly k)
    picked_NxL = eligible_NxL & (rank_desc(-u_NxL, eligible_NxL) < _count(rl.clip_cov_ratio, n))
    pg_NxL, kl_NxL = (~picked_NxL).astype(jnp.float32), jnp.zeros_like(ones)
  else:
    # exactly k tokens, as verl's torch.topk: ties at the threshold broken by position (a threshold test would
    # penalise every tied token, e.g. all of them where every advantage is equal and cov_t ≡ 0)
    picked_NxL = valid_NxL & (rank_desc(cov_NxL, valid_NxL) < _count(rl.kl_cov_ratio, n))
    pg_NxL, kl_NxL = ones, picked_NxL.astype(jnp.float32)
  picked_f = picked_NxL.astype(jnp.float32)
  n_picked = jnp.sum(picked_f)
  mean_picked = lambda x_NxL: jnp.where(n_picked > 0, jnp.sum(picked_f * x_NxL) / jnp.maximum(n_picked, 1.0),
                                       jnp.nan)
  metrics = {"select_frac": n_picked / jnp.maximum(n, 1), "select_cov": mean_picked(cov_NxL)}
  if ent_NxL is not None:
    metrics["select_entropy"] = mean_picked(jax.lax.stop_gradient(jnp.where(valid_NxL, ent_NxL, 0.0)))
  return Selection(pg_NxL, kl_NxL, metrics)
