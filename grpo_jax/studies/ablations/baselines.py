"""Baselines ablation on an exactly solvable bandit: how far each group baseline's gradient is from ∇E[R].

Setting: P prompts, each a softmax policy over K enumerable outputs (logits θ_p), 0/1 rewards, with different
success rates p_p = Σ_k π_p(k) R_p(k). J(θ) = 1/P Σ_p p_p, and the exact policy gradient is
∇_{θ_p} J = 1/P · π_p ⊙ (R_p − p_p). One estimate draws G outputs per prompt and forms
ĝ_p = 1/(P·G) Σ_i A_i (e_{k_i} − π_p) with A from the project's own advantage functions:

  none      A_i = r_i                              unbiased, high variance
  loo       A_i = r_i − mean_{j≠i} r_j  (RLOO)     unbiased
  mean      A_i = r_i − mean_j r_j  (Dr.GRPO)      = (G−1)/G · loo sample by sample, so E = (G−1)/G · ∇J
  mean_std  A_i = (r_i − mean)/(std + ε)  (GRPO)   re-weights prompts by their success rate (Dr.GRPO's point)

Exact expectations (no Monte Carlo) follow from symmetry and 0/1 rewards: conditioning on the first sample's
output k and on the number m ~ Binomial(G−1, p) of successes among the others,
E[ĝ_p] = (a_1 − a_0) ∇J_p with a_r = E_m[A_1 | r_1 = r, m]: every estimator scales each prompt's exact gradient by a
weight w_p = a_1 − a_0 (1 for none/loo, (G−1)/G for mean, a function of p for mean_std). Variances are Monte Carlo.

Run: `python -m grpo_jax.studies.ablations.baselines` prints the table (2026-11-29, shared 2-core CPU under load: ~3 min,
mostly compiling one sampler per (estimator, G)).
"""
import dataclasses
import functools
import math
from typing import Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rl import advantages

STD_EPS = 1e-4  # config_lib's rl.std_eps default

ESTIMATORS: Dict[str, Callable[[jax.Array], jax.Array]] = {
    "none": lambda r_BxG: r_BxG.astype(jnp.float32),
    "loo": advantages.rloo,
    "mean": advantages.dr_grpo,
    "mean_std": lambda r_BxG: advantages.grpo(r_BxG, std_eps=STD_EPS, ddof=0),
}


@dataclasses.dataclass(frozen=True)
class Bandit:
  logits_PxK: np.ndarray  # float64
  rewards_PxK: np.ndarray  # 0/1

  @property
  def probs_PxK(self) -> np.ndarray:
    z = self.logits_PxK - self.logits_PxK.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)

  @property
  def success_P(self) -> np.ndarray:
    return np.sum(self.probs_PxK * self.rewards_PxK, axis=1)


def make_bandit(success_rates: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9), K: int = 6, n_correct: int = 2,
                seed: int = 0) -> Bandit:
  """Prompts whose success probabilities are exactly `success_rates`; the first n_correct outputs are correct."""
  if not all(0 < p < 1 for p in success_rates) or not 0 < n_correct < K:
    raise ValueError("make_bandit: success_rates must lie in (0, 1) and 0 < n_correct < K.")
  rng = np.random.default_rng(seed)
  logits = []
  for p in success_rates:
    z = rng.normal(size=K)
    w_c = np.exp(z[:n_correct]) / np.exp(z[:n_correct]).sum()
    w_w = np.exp(z[n_correct:]) / np.exp(z[n_correct:]).sum()
    logits.append(np.log(np.concatenate([p * w_c, (1 - p) * w_w])))
  rewards = np.zeros((len(success_rates), K))
  rewards[:, :n_correct] = 1.0
  return Bandit(np.array(logits), rewards)


def exact_gradient(bandit: Bandit) -> np.ndarray:
  """∇_θ J for J = 1/P Σ_p E_{π_p}[R_p]."""
  pi = bandit.probs_PxK
  P = pi.shape[0]
  return pi * (bandit.rewards_PxK - bandit.success_P[:, None]) / P


def prompt_weights(bandit: Bandit, estimator: str, G: int) -> np.ndarray:
  """w_p with E[ĝ_p] = w_p ∇J_p exactly (0/1 rewards): a_1 − a_0, a_r = E_{m~Bin(G−1,p)} A_1(r, m)."""
  fn = ESTIMATORS[estimator]
  # All groups [r, 1 × m, 0 × (G−1−m)] for r ∈ {0, 1}, m = 0..G−1; the advantage of the first member.
  groups = np.array([[r] + [1.0] * m + [0.0] * (G - 1 - m) for r in (0.0, 1.0) for m in range(G)], np.float32)
  a_rm = np.asarray(fn(jnp.asarray(groups))[:, 0], np.float64).reshape(2, G)
  weights = []
  for p in bandit.success_P:
    binom_m = np.array([math.comb(G - 1, m) * p**m * (1 - p) ** (G - 1 - m) for m in range(G)])
    weights.append(binom_m @ a_rm[1] - binom_m @ a_rm[0])
  return np.array(weights)


@functools.partial(jax.jit, static_argnames=("estimator", "G", "n_draws"))
def _mc_gradients(logits_PxK: jax.Array, rewards_PxK: jax.Array, rng: jax.Array, *, estimator: str, G: int,
                  n_draws: int) -> jax.Array:
  """n_draws independent estimates ĝ (n×P×K), G samples per prompt each."""
  P, K = logits_PxK.shape
  k_nxPxG = jax.random.categorical(rng, logits_PxK[None, :, None, :], shape=(n_draws, P, G))
  onehot_nxPxGxK = jax.nn.one_hot(k_nxPxG, K)
  r_nxPxG = jnp.einsum("npgk,pk->npg", onehot_nxPxGxK, rewards_PxK)
  a_nxPxG = ESTIMATORS[estimator](r_nxPxG.reshape(n_draws * P, G)).reshape(n_draws, P, G)
  score_nxPxGxK = onehot_nxPxGxK - jax.nn.softmax(logits_PxK)[None, :, None, :]
  return jnp.einsum("npg,npgk->npk", a_nxPxG, score_nxPxGxK) / (P * G)


def mc_gradients(bandit: Bandit, estimator: str, G: int, n_draws: int, seed: int = 0) -> np.ndarray:
  if estimator not in ESTIMATORS:
    raise ValueError(f"estimator={estimator!r} is not one of {tuple(ESTIMATORS)}.")
  if estimator == "loo" and G < 2:
    raise ValueError("loo needs G >= 2.")
  g = _mc_gradients(jnp.asarray(bandit.logits_PxK, jnp.float32), jnp.asarray(bandit.rewards_PxK, jnp.float32),
                    jax.random.key(seed), estimator=estimator, G=G, n_draws=n_draws)
  return np.asarray(g, np.float64)


def run(Gs: Sequence[int] = (2, 4, 8, 16), n_draws: int = 20_000, bandit: Optional[Bandit] = None,
        seed: int = 0, estimators: Sequence[str] = tuple(ESTIMATORS)) -> List[dict]:
  """One row per (G, estimator): exact and Monte-Carlo relative bias, variance, direction, prompt weights.

  rel_bias_exact  ‖E ĝ − ∇J‖ / ‖∇J‖ from prompt_weights (exact)
  rel_bias_mc     ‖mean ĝ − ∇J‖ / ‖∇J‖ over n_draws (includes MC noise ≈ mc_noise)
  mc_noise        sqrt(total variance / n_draws) / ‖∇J‖: the size of MC error in rel_bias_mc
  rel_var         E‖ĝ − E ĝ‖² / ‖∇J‖² (trace of the covariance, MC)
  cos_exact       cosine between E ĝ and ∇J (1 = same direction; < 1 means prompts were re-weighted)
  weights         w_p per prompt (E ĝ_p = w_p ∇J_p), keyed by the prompt's success rate
  """
  bandit = bandit or make_bandit()
  g_true = exact_gradient(bandit)
  norm = np.linalg.norm(g_true)
  rows = []
  for G in Gs:
    for i, name in enumerate(estimators):
      w_P = prompt_weights(bandit, name, G)
      g_exp = w_P[:, None] * g_true
      g = mc_gradients(bandit, name, G, n_draws, seed=seed + 1000 * G + i)
      g_mean = g.mean(axis=0)
      total_var = float(np.mean(np.sum((g - g_mean) ** 2, axis=(1, 2))))
      rows.append(dict(
          G=G, estimator=name,
          rel_bias_exact=float(np.linalg.norm(g_exp - g_true) / norm),
          rel_bias_mc=float(np.linalg.norm(g_mean - g_true) / norm),
          mc_noise=math.sqrt(total_var / n_draws) / norm,
          rel_var=total_var / norm**2,
          cos_exact=float(np.sum(g_exp * g_true) / (np.linalg.norm(g_exp) * norm)),
          weights={round(float(p), 3): float(w) for p, w in zip(bandit.success_P, w_P)},
      ))
  return rows


def format_table(rows: List[dict]) -> str:
  head = f"{'G':>3} {'estimator':<9} {'bias(exact)':>11} {'bias(MC)':>9} {'±MC':>7} {'rel_var':>8} {'cos':>7}  weights"
  lines = [head]
  for r in rows:
    w = " ".join(f"{p:.2f}:{v:.3f}" for p, v in r["weights"].items())
    lines.append(f"{r['G']:>3} {r['estimator']:<9} {r['rel_bias_exact']:>11.4f} {r['rel_bias_mc']:>9.4f} "
                 f"{r['mc_noise']:>7.4f} {r['rel_var']:>8.3f} {r['cos_exact']:>7.4f}  {w}")
  return "\n".join(lines)


if __name__ == "__main__":
  print(format_table(run()))
