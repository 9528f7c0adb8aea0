"""Advantage estimators of the GRPO family, as pure jittable functions on arrays.

Shapes: group rewards `r_BxG`; per-token arrays `NxL` with `N = B*G`, row `i` in group `i // G`; `mask_NxL` is 1 on
completion tokens (EOS included) and 0 on padding. Every function returns 0 on padding and never NaN, also for rows
whose mask is all zero. Hyper-parameters are keyword arguments so the step can close over them as constants.
At the end, ESTIMATORS maps each `rl.advantage` name to its estimator (`register` adds one; a preset in presets.py
names it).
"""
from typing import Any, Callable, NamedTuple, Tuple

import jax
import jax.numpy as jnp
from jax import lax


def _check_ndim(name: str, x: jax.Array, ndim: int) -> None:
  if x.ndim != ndim:
    raise ValueError(f"{name}: expected a {ndim}-D array, got shape {x.shape}; reshape it first.")


def group_is_constant(r_BxG: jax.Array) -> jax.Array:
  """Per group: all G rewards equal (for r_BxGxK: in every one of the K terms)."""
  # Equality of max and min is exact, unlike `std == 0` after a rounded mean.
  same = jnp.max(r_BxG, axis=1) == jnp.min(r_BxG, axis=1)
  return same if same.ndim == 1 else jnp.all(same, axis=1)


def _std(centered: jax.Array, denom, axis=None, keepdims: bool = False) -> jax.Array:
  """√(Σ centered² / denom), also where the squares overflow float32: a reward of 1e20 (finite, so accepted) has
  centred squares of inf, its std became inf and every advantage scaled by it a silent 0. There the sum is taken of
  (centered / max|centered|)² and scaled back; elsewhere the plain formula's value is kept bit for bit. A non-finite
  `centered` (a mean that overflowed) stays non-finite, and the update's guard skips and counts it."""
  plain = jnp.sqrt(jnp.sum(jnp.square(centered), axis=axis, keepdims=keepdims) / denom)
  top = jnp.max(jnp.abs(centered), axis=axis, keepdims=True)
  top = jnp.where(top > 0, top, 1.0)
  scaled = jnp.sqrt(jnp.sum(jnp.square(centered / top), axis=axis, keepdims=keepdims) / denom)
  return jnp.where(jnp.isfinite(plain), plain, scaled * (top if keepdims else jnp.squeeze(top, axis)))


def grpo(r_BxG: jax.Array, *, std_eps=1e-4, ddof: int = 1) -> jax.Array:
  """GRPO: (r − group mean) / (group std + eps); a zero-variance group gets exactly 0 (it carries no signal).

  ddof=1 with eps added to the std is what TRL, verl and OpenRLHF compute (torch.std); ddof=0 is the population
  std, larger advantages by √(G/(G−1)) (41% at G=2, 6.9% at G=8)."""
  _check_ndim("r_BxG", r_BxG, 2)
  G = r_BxG.shape[1]
  if G - ddof <= 0:
    raise ValueError(f"ddof={ddof} needs G > ddof, got G={G}; use ddof=0 or a larger group.")
  r_BxG = r_BxG.astype(jnp.float32)
  centered_BxG = r_BxG - jnp.mean(r_BxG, axis=1, keepdims=True)
  std_Bx1 = _std(centered_BxG, G - ddof, axis=1, keepdims=True)
  constant_Bx1 = group_is_constant(r_BxG)[:, None]
  safe_den_Bx1 = jnp.where(constant_Bx1, 1.0, std_Bx1 + std_eps)
  return jnp.where(constant_Bx1, 0.0, centered_BxG / safe_den_Bx1)


def _constant_groups_zero(r_BxG: jax.Array, adv_BxG: jax.Array) -> jax.Array:
  """adv_BxG with every constant group's advantages exactly 0. The rounded group mean leaves a residue otherwise
  (0.1 × 3 in float32: −7.5e-9 each), a gradient of rounding noise that Adam, being scale-free, turns into an
  update of a sizeable fraction of the learning rate on a batch without signal."""
  return jnp.where(group_is_constant(r_BxG)[:, None], 0.0, adv_BxG)


def dr_grpo(r_BxG: jax.Array) -> jax.Array:
  """Dr.GRPO: r − group mean, without the std division that re-weights prompts by difficulty (0 for a constant
  group)."""
  _check_ndim("r_BxG", r_BxG, 2)
  r_BxG = r_BxG.astype(jnp.float32)
  return _constant_groups_zero(r_BxG, r_BxG - jnp.mean(r_BxG, axis=1, keepdims=True))


def rloo(r_BxG: jax.Array) -> jax.Array:
  """RLOO: r_i − mean_{j≠i} r_j; the baseline excludes r_i, so the gradient estimate stays unbiased (0 for a
  constant group)."""
  _check_ndim("r_BxG", r_BxG, 2)
  G = r_BxG.shape[1]
  if G < 2:
    raise ValueError(f"rloo needs a group of at least 2 samples, got G={G}; raise rl.G.")
  r_BxG = r_BxG.astype(jnp.float32)
  loo_mean_BxG = (jnp.sum(r_BxG, axis=1, keepdims=True) - r_BxG) / (G - 1)
  return _constant_groups_zero(r_BxG, r_BxG - loo_mean_BxG)


def group_mean_batch_std(r_BxG: jax.Array, *, std_eps=1e-4, ddof: int = 1) -> jax.Array:
  """Lite PPO (Liu et al. 2025, arXiv 2508.08221): (r − group mean) / (std of the batch's B·G rewards + eps). The
  group mean keeps each prompt's baseline; the batch std, one scale for all prompts, does not re-weight prompts by
  their own spread (GRPO's group std divides a nearly-solved prompt's small differences by a small std). A constant
  group gets exactly 0 (as under `grpo`); a constant batch, 0 everywhere."""
  _check_ndim("r_BxG", r_BxG, 2)
  n = r_BxG.size
  if n - ddof <= 0:
    raise ValueError(f"ddof={ddof} needs more than {ddof} rewards in the batch, got {n}; use ddof=0.")
  r_BxG = r_BxG.astype(jnp.float32)
  centered_BxG = r_BxG - jnp.mean(r_BxG, axis=1, keepdims=True)
  std = _std(r_BxG - jnp.mean(r_BxG), n - ddof)
  return _constant_groups_zero(r_BxG, centered_BxG / (std + std_eps))


def last_valid_token(mask_NxL: jax.Array) -> jax.Array:
  """One-hot of each row's last valid token (all zero for an empty row); works for any mask pattern."""
  valid_NxL = mask_NxL > 0
  valid_at_or_after_NxL = lax.cumsum(valid_NxL.astype(jnp.int32), axis=1, reverse=True)
  return (valid_NxL & (valid_at_or_after_NxL == 1)).astype(jnp.float32)


def masked_whiten(x_NxL: jax.Array, mask_NxL: jax.Array, eps: float) -> jax.Array:
  """(x − mean) · rsqrt(var + eps) with mean and population variance over valid tokens only (as OpenRLHF)."""
  m_NxL = mask_NxL.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(m_NxL), 1.0)
  mean = jnp.sum(x_NxL * m_NxL) / count
  var = jnp.sum(((x_NxL - mean) * m_NxL) ** 2) / count
  # squares past float32 (returns of 1e20): 1/std from the overflow-safe _std (eps is below its rounding there)
  inv = jnp.where(jnp.isfinite(var), lax.rsqrt(var + eps), 1.0 / _std((x_NxL - mean) * m_NxL, count))
  return (x_NxL - mean) * inv * m_NxL


def reinforce_pp(r_N: jax.Array, kl_NxL: jax.Array, mask_NxL: jax.Array, *, beta: float,
                 whiten_eps: float = 1e-8) -> jax.Array:
  """REINFORCE++: per-token reward −β·kl (+ r at the last valid token), returns-to-go (γ=1), batch whitening.

  `kl_NxL` is the per-token KL estimate of the rollout policy (rl.kl_estimator: k1 = `logp_old − logp_ref` in the
  presets, as OpenRLHF); it enters the reward, so no gradient
  flows through it (stop_gradient). Whitening uses valid tokens of the whole batch only, so padding never shifts it.
  """
  _check_ndim("r_N", r_N, 1)
  _check_ndim("kl_NxL", kl_NxL, 2)
  if kl_NxL.shape != mask_NxL.shape or kl_NxL.shape[0] != r_N.shape[0]:
    raise ValueError(f"reinforce_pp: shapes r_N {r_N.shape}, kl_NxL {kl_NxL.shape}, mask_NxL {mask_NxL.shape} "
                     "must agree on N and L.")
  m_NxL = mask_NxL.astype(jnp.float32)
  kl_NxL = jnp.where(m_NxL > 0, lax.stop_gradient(kl_NxL).astype(jnp.float32), 0.0)
  reward_NxL = -beta * kl_NxL + r_N.astype(jnp.float32)[:, None] * last_valid_token(mask_NxL)
  returns_NxL = lax.cumsum(reward_NxL, axis=1, reverse=True)
  return masked_whiten(returns_NxL, m_NxL, whiten_eps)


def reinforce_pp_baseline(r_BxG: jax.Array, kl_NxL: jax.Array, mask_NxL: jax.Array, *, beta: float,
                          whiten_eps: float = 1e-8) -> jax.Array:
  """REINFORCE++-baseline: subtract the group mean from the outcome reward, then REINFORCE++ (global whitening)."""
  _check_ndim("r_BxG", r_BxG, 2)
  B, G = r_BxG.shape
  if kl_NxL.shape[0] != B * G:
    raise ValueError(f"reinforce_pp_baseline: kl_NxL has {kl_NxL.shape[0]} rows, expected B*G = {B * G}.")
  return reinforce_pp(dr_grpo(r_BxG).reshape(B * G), kl_NxL, mask_NxL, beta=beta, whiten_eps=whiten_eps)


def gae(rewards_NxL: jax.Array, values_NxL: jax.Array, mask_NxL: jax.Array, *, gamma: float,
        lam: float) -> Tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation for PPO's critic baseline; returns (advantages, returns = adv + V).

  The reverse scan carries the next VALID token's value and advantage through padding unchanged, so after a row's
  last valid token the bootstrap value is 0, whatever the mask pattern.
  """
  _check_ndim("rewards_NxL", rewards_NxL, 2)
  if not rewards_NxL.shape == values_NxL.shape == mask_NxL.shape:
    raise ValueError(f"gae: rewards {rewards_NxL.shape}, values {values_NxL.shape}, mask {mask_NxL.shape} "
                     "must have the same shape.")
  valid_NxL = mask_NxL > 0
  r_NxL = jnp.where(valid_NxL, rewards_NxL.astype(jnp.float32), 0.0)
  v_NxL = jnp.where(valid_NxL, values_NxL.astype(jnp.float32), 0.0)

  def step(carry, xs):
    next_value_N, next_adv_N = carry
    r_N, v_N, valid_N = xs
    delta_N = r_N + gamma * next_value_N - v_N
    adv_N = delta_N + gamma * lam * next_adv_N
    adv_N = jnp.where(valid_N, adv_N, 0.0)
    carry = (jnp.where(valid_N, v_N, next_value_N), jnp.where(valid_N, adv_N, next_adv_N))
    return carry, adv_N

  N = r_NxL.shape[0]
  init = (jnp.zeros((N,), jnp.float32), jnp.zeros((N,), jnp.float32))
  _, adv_LxN = lax.scan(step, init, (r_NxL.T, v_NxL.T, valid_NxL.T), reverse=True)
  adv_NxL = adv_LxN.T
  return adv_NxL, jnp.where(valid_NxL, adv_NxL + v_NxL, 0.0)


def process_advantages(step_r_NxS: jax.Array, step_end_NxS: jax.Array, step_valid_NxS: jax.Array,
                       mask_NxL: jax.Array, *, G: int, std_eps=1e-4, ddof: int = 1) -> jax.Array:
  """DeepSeekMath process supervision: normalise step rewards over all valid steps of the group (std with `ddof`,
  the outcome advantages' convention), then a token's advantage is the sum of normalised rewards of the steps that
  end at or after it.

  `step_end_NxS` is the completion token index (inclusive) where each step ends. A group whose valid step rewards
  are all equal (or that has fewer than two valid steps) contributes exactly 0.
  """
  _check_ndim("step_r_NxS", step_r_NxS, 2)
  N, S = step_r_NxS.shape
  if N % G:
    raise ValueError(f"process_advantages: N={N} rows is not a multiple of G={G}; pass the group size used.")
  if not step_r_NxS.shape == step_end_NxS.shape == step_valid_NxS.shape or mask_NxL.shape[0] != N:
    raise ValueError(f"process_advantages: step arrays {step_r_NxS.shape}, {step_end_NxS.shape}, "
                     f"{step_valid_NxS.shape} and mask {mask_NxL.shape} must agree.")
  B = N // G
  valid_BxGS = (step_valid_NxS > 0).reshape(B, G * S)
  r_BxGS = step_r_NxS.astype(jnp.float32).reshape(B, G * S)
  count_Bx1 = jnp.maximum(jnp.sum(valid_BxGS, axis=1, keepdims=True), 1)
  mean_Bx1 = jnp.sum(jnp.where(valid_BxGS, r_BxGS, 0.0), axis=1, keepdims=True) / count_Bx1
  centered_BxGS = jnp.where(valid_BxGS, r_BxGS - mean_Bx1, 0.0)
  std_Bx1 = _std(centered_BxGS, jnp.maximum(count_Bx1 - ddof, 1), axis=1, keepdims=True)
  hi_Bx1 = jnp.max(jnp.where(valid_BxGS, r_BxGS, -jnp.inf), axis=1, keepdims=True)
  lo_Bx1 = jnp.min(jnp.where(valid_BxGS, r_BxGS, jnp.inf), axis=1, keepdims=True)
  constant_Bx1 = hi_Bx1 <= lo_Bx1  # also true for 0 or 1 valid steps
  norm_BxGS = jnp.where(constant_Bx1, 0.0, centered_BxGS / jnp.where(constant_Bx1, 1.0, std_Bx1 + std_eps))
  norm_NxS = norm_BxGS.reshape(N, S)
  L = mask_NxL.shape[1]
  covers_NxLxS = step_end_NxS[:, None, :] >= jnp.arange(L)[None, :, None]
  adv_NxL = jnp.sum(jnp.where(covers_NxLxS, norm_NxS[:, None, :], 0.0), axis=2)
  return jnp.where(mask_NxL > 0, adv_NxL, 0.0)


def combine(outcome_adv_NxL: jax.Array, process_adv_NxL: jax.Array, *, w_outcome: float,
            w_process: float) -> jax.Array:
  """Weighted sum of outcome and process advantages (both already 0 on padding)."""
  if outcome_adv_NxL.shape != process_adv_NxL.shape:
    raise ValueError(f"combine: outcome {outcome_adv_NxL.shape} and process {process_adv_NxL.shape} must match.")
  return w_outcome * outcome_adv_NxL + w_process * process_adv_NxL


def dynamic_sampling_select(r_BxG: jax.Array, keep: int, rng: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """DAPO dynamic sampling with a fixed output shape: pick `keep` of B groups, groups with non-zero reward
  variance (0 < #correct < G for 0/1 rewards) first, in random order, then zero-variance ones only to fill up.

  r_BxG is the reward the advantage normalises: the weighted sum (reward_norm='sum'), or the weighted terms
  r_BxGxK (reward_norm='per_term'), where a group is kept when ANY term varies in it, since each term is then
  normalised on its own and gives the group a non-zero advantage (even when the weighted sum is constant).
  Returns (idx_keep int32[keep], n_valid): the first `n_valid` indices are the non-zero-variance groups.
  """
  if r_BxG.ndim not in (2, 3):
    raise ValueError(f"dynamic_sampling_select: r must be B×G or B×G×K, got shape {r_BxG.shape}.")
  B = r_BxG.shape[0]
  if not 0 < keep <= B:
    raise ValueError(f"dynamic_sampling_select: keep={keep} must be in [1, B={B}]; lower keep or oversample more.")
  valid_B = ~group_is_constant(r_BxG)
  # Valid groups score in [1, 1.5), the others in [0, 0.5): top_k keeps valid ones first, ties broken at random.
  priority_B = valid_B.astype(jnp.float32) + 0.5 * jax.random.uniform(rng, (B,))
  _, idx_keep = lax.top_k(priority_B, keep)
  n_valid = jnp.sum(valid_B[idx_keep].astype(jnp.int32))
  return idx_keep.astype(jnp.int32), n_valid


def overlong_penalty(lengths_N: jax.Array, *, max_len: int, cache_len: int) -> jax.Array:
  """DAPO soft overlong punishment: 0 up to max_len − cache_len, linear down to −1 at max_len, −1 beyond."""
  if not 0 < cache_len <= max_len:
    raise ValueError(f"overlong_penalty: cache_len={cache_len} must be in (0, max_len={max_len}]; "
                     "set rl.overlong_frac accordingly (0 turns the penalty off upstream).")
  excess_N = lengths_N.astype(jnp.float32) - (max_len - cache_len)
  return -jnp.clip(excess_N / cache_len, 0.0, 1.0)


def decoupled(r_BxGxK: jax.Array, w_K, group_fn: Callable[[jax.Array], jax.Array], *, std_eps,
              ddof: int = 1) -> jax.Array:
  """GDPO (reward_norm='per_term'): each of the K reward terms normalised within its group by `group_fn` (r_BxG ->
  adv_BxG, e.g. grpo), then their w-weighted sum, then divided by that sum's std over the whole batch (one value
  per sample, std with `ddof`, + std_eps), so the advantage's scale does not grow with the number of terms.

  A term that rarely varies keeps its full normalised weight in the groups where it does, instead of being drowned
  by a frequently-varying term in a summed reward. Every group's advantages sum to 0 (true of grpo, dr_grpo and
  rloo), so the batch mean is 0 and is not subtracted: a group in which no term varies keeps exactly 0, as under
  GRPO. (verl whitens per token, mask-weighted: its mean is length-weighted and not 0, which gives such groups a
  non-zero advantage −mean/std, a push on answers whose rewards carry no information; TRL subtracts the sample mean,
  0 up to rounding.) `w_K` may be traced.
  """
  _check_ndim("r_BxGxK", r_BxGxK, 3)
  B, G, K = r_BxGxK.shape
  w_K = jnp.asarray(w_K, jnp.float32)
  if w_K.shape != (K,):
    raise ValueError(f"decoupled: {w_K.shape[0] if w_K.ndim == 1 else w_K.shape} weights for {K} reward terms.")
  if B * G - ddof <= 0:
    raise ValueError(f"decoupled: a batch of {B * G} samples has no std with ddof={ddof}.")
  adv_BxGxK = jax.vmap(group_fn, in_axes=2, out_axes=2)(r_BxGxK.astype(jnp.float32))
  sum_BxG = jnp.sum(adv_BxGxK * w_K, axis=2)
  std = _std(sum_BxG - jnp.mean(sum_BxG), B * G - ddof)
  return jnp.where(std > 0, sum_BxG / jnp.where(std > 0, std + std_eps, 1.0), 0.0)


def broadcast_to_tokens(adv_N: jax.Array, mask_NxL: jax.Array) -> jax.Array:
  """A sequence-level advantage on every valid token of its row, 0 on padding."""
  _check_ndim("adv_N", adv_N, 1)
  return jnp.where(mask_NxL > 0, adv_N.astype(jnp.float32)[:, None], 0.0)


# ----------------------------------------------------------------------------------- estimators by name (rl.algo)


class Context(NamedTuple):
  """What an estimator may read besides the group rewards r_BxG."""
  mask_NxL: jax.Array  # 1 on completion tokens (EOS included), float32
  kl_NxL: jax.Array    # stop-gradient per-token KL of the rollout policy to the reference, 0 on padding: the
                       # rl.kl_estimator (k1 in the presets that fold it into the reward; k3 clamped at kl_clamp)
  rl: Any              # the `rl` config group: std_eps, std_ddof, beta, …


class Estimator(NamedTuple):
  fn: Callable[[jax.Array, Context], jax.Array]
  per_token: bool        # fn returns adv_NxL; else adv_BxG, which every valid token of the row gets
  kl_in_advantage: bool  # fn folds −β·KL into a per-token reward: the loss then carries no KL term
  group: bool            # the baseline comes from the group: needs rl.G >= 2


ESTIMATORS: dict[str, Estimator] = {}


def register(name: str, *, per_token: bool = False, kl_in_advantage: bool = False, group: bool = True):
  """Registers `fn(r_BxG, ctx) -> adv_BxG (or adv_NxL with per_token=True)` as `rl.advantage=name`, run by rl_step."""
  def deco(fn):
    if name in ESTIMATORS:
      raise ValueError(f"advantage estimator {name!r} is registered twice; pick another name.")
    ESTIMATORS[name] = Estimator(fn, per_token, kl_in_advantage, group)
    return fn
  return deco


@register("grpo")  # GSPO's preset uses it too: its sequence-level ratio is a loss choice (rl.ratio_level)
def _grpo(r_BxG, ctx):
  return grpo(r_BxG, std_eps=ctx.rl.std_eps, ddof=ctx.rl.std_ddof)


@register("group_mean_batch_std")  # Lite PPO's
def _group_mean_batch_std(r_BxG, ctx):
  return group_mean_batch_std(r_BxG, std_eps=ctx.rl.std_eps, ddof=ctx.rl.std_ddof)


@register("dr_grpo")
def _dr_grpo(r_BxG, ctx):
  return dr_grpo(r_BxG)


@register("rloo")
def _rloo(r_BxG, ctx):
  return rloo(r_BxG)


@register("reinforce_pp", per_token=True, kl_in_advantage=True, group=False)
def _reinforce_pp(r_BxG, ctx):
  return reinforce_pp(r_BxG.reshape(-1), ctx.kl_NxL, ctx.mask_NxL, beta=ctx.rl.beta, whiten_eps=1e-8)


@register("reinforce_pp_baseline", per_token=True, kl_in_advantage=True)
def _reinforce_pp_baseline(r_BxG, ctx):
  return reinforce_pp_baseline(r_BxG, ctx.kl_NxL, ctx.mask_NxL, beta=ctx.rl.beta, whiten_eps=1e-8)
