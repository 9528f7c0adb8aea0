"""The 2025-26 objectives (CISPO, SAPO), Lite PPO's advantage and the token selections (top-entropy, Clip-Cov,
KL-Cov) against hand-computed and independent NumPy values, gradients included (the tricks are in them)."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.config import presets
from grpo_jax.rl import advantages
from grpo_jax.rl import losses
from grpo_jax.rl import token_select
from tests.jit_call import jit_call
from tests.jit_call import jit_grad

SEL = ml_collections.ConfigDict(dict(select_frac=0.2, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0,
                                     kl_cov_ratio=2e-4, kl_cov_coef=1.0))


def _grad(f, x):
  return np.asarray(jit_grad(f, jnp.asarray(x, jnp.float32)), np.float64)


# ------------------------------------------------------------------------------------------------ CISPO


def test_cispo_values_and_stop_gradient_weight():
  """ρ = [0.5, 1.1, 3, 6] with A = [1, −1, 2, −1], range [1 − 1, 1 + 3] = [0, 4] (the cispo preset's): the weights
  are [0.5, 1.1, 3, 4] (only ρ = 6 clipped); the loss −(1/n)Σ r̂·A; its gradient −r̂·A/n on EVERY token: the clipped
  one keeps a gradient (PPO's clip would give it none)."""
  rho = np.array([[0.5, 1.1, 3.0, 6.0]])
  a = np.array([[1.0, -1.0, 2.0, -1.0]])
  old = np.full((1, 4), -2.0)
  lp = old + np.log(rho)
  f = lambda x: losses.policy_loss(x, jnp.asarray(old, jnp.float32), None, jnp.asarray(a, jnp.float32),
                                   jnp.ones((1, 4)), eps_low=1.0, eps_high=3.0, beta=0.0, agg="token_mean",
                                   objective="cispo")[0]
  r_hat = np.array([0.5, 1.1, 3.0, 4.0])
  assert float(jax.jit(f)(jnp.asarray(lp, jnp.float32))) == pytest.approx(-np.sum(r_hat * a) / 4, rel=1e-5)
  np.testing.assert_allclose(_grad(f, lp), -(r_hat * a) / 4, rtol=1e-5)
  _, aux = jit_call(losses.cispo_objective, jnp.asarray(lp, jnp.float32), jnp.asarray(old, jnp.float32),
                    jnp.asarray(a, jnp.float32), np.ones((1, 4)), eps_low=1.0, eps_high=3.0)
  assert float(aux["clip_frac_high"]) == 0.25 and float(aux["clip_frac_low"]) == 0.0
  # against PPO's clip at the same range: the ρ = 6, A < 0 token... and with ε 0.2 PPO zeroes ρ = 3 (A > 0) too
  ppo = lambda x: losses.policy_loss(x, jnp.asarray(old, jnp.float32), None, jnp.asarray(a, jnp.float32),
                                     jnp.ones((1, 4)), eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean")[0]
  assert _grad(ppo, lp)[0, 2] == 0.0 and _grad(f, lp)[0, 2] != 0.0


def test_cispo_matches_numpy_gradient_by_finite_differences():
  """The gradient sg(r̂)·A·∇log π, checked against finite differences of the REINFORCE surrogate with r̂ frozen."""
  rng = np.random.default_rng(3)
  N, L = 3, 5
  mask = (np.arange(L)[None] < np.array([5, 2, 4])[:, None]).astype(np.float32)
  old = rng.uniform(-3, 0, (N, L))
  lp = old + rng.normal(size=(N, L)) * 0.8
  a = rng.normal(size=(N, L))
  r_hat = np.clip(np.exp(lp - old), 1 - 0.2, 1 + 0.28)
  f = lambda x: losses.policy_loss(x, jnp.asarray(old, jnp.float32), None, jnp.asarray(a, jnp.float32),
                                   jnp.asarray(mask), eps_low=0.2, eps_high=0.28, beta=0.0,
                                   agg="seq_mean_token_mean", objective="cispo")[0]
  n_i = mask.sum(1, keepdims=True)
  want = -(r_hat * a * mask) / (n_i * N)  # d/dlogp of −(1/N)Σ_i (1/|o_i|)Σ_t r̂·A·logp
  np.testing.assert_allclose(_grad(f, lp), want, rtol=2e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------------ SAPO


def np_sapo(rho, a, tau_pos, tau_neg):
  tau = np.where(a > 0, tau_pos, tau_neg)
  s = 1 / (1 + np.exp(-tau * (rho - 1)))
  return (4 / tau) * s * a, 4 * s * (1 - s) * rho * a, 4 * s * (1 - s)


def test_sapo_gate_values_and_gradient():
  """f(ρ) = (4/τ)σ(τ(ρ−1)), τ = 1 (A > 0) / 1.05 (A ≤ 0); d(f·A)/dlog π = 4σ(1−σ)·ρ·A: A itself at ρ = 1 (the
  gate is 1 on-policy), smaller but never 0 away from it (PPO's clip: exactly 0 past 1 ± ε)."""
  rho = np.array([[1.0, 1.0, 1.5, 0.4, 4.0, 2.0]])
  a = np.array([[1.0, -2.0, 1.0, -1.0, 1.0, 0.0]])
  old = np.full((1, 6), -1.5)
  lp = old + np.log(rho)
  f = lambda x: losses.policy_loss(x, jnp.asarray(old, jnp.float32), None, jnp.asarray(a, jnp.float32),
                                   jnp.ones((1, 6)), eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean",
                                   objective="sapo", tau_pos=1.0, tau_neg=1.05)[0]
  val, grad, w = np_sapo(rho, a, 1.0, 1.05)
  assert float(jax.jit(f)(jnp.asarray(lp, jnp.float32))) == pytest.approx(-val.sum() / 6, rel=1e-5)
  np.testing.assert_allclose(_grad(f, lp), -grad / 6, rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(_grad(f, lp)[0, :2], -a[0, :2] / 6, rtol=1e-6)  # on-policy: plain A
  assert np.all(_grad(f, lp)[0, 2:5] != 0)
  # hand values of the gate at ρ = 1.5, τ = 1: σ(0.5) = 0.62246, f = 4·0.62246 = 2.4898, w = 4·0.62246·0.37754 = 0.9400
  assert val[0, 2] == pytest.approx(2.4898, abs=1e-4) and w[0, 2] == pytest.approx(0.9400, abs=1e-4)
  _, aux = jit_call(losses.sapo_objective, jnp.asarray(lp, jnp.float32), jnp.asarray(old, jnp.float32),
                    jnp.asarray(a, jnp.float32), np.ones((1, 6)), tau_pos=1.0, tau_neg=1.05)
  assert float(aux["gate_mean"]) == pytest.approx(w.mean(), rel=1e-5)
  assert float(aux["gated_frac"]) == pytest.approx(np.mean(w < 0.5))


def test_sapo_negative_temperature_closes_faster():
  """For the same |ρ − 1| the gate weight under τ_neg > τ_pos is smaller: negative advantages are damped more."""
  for rho in (1.5, 3.0):
    _, _, w_pos = np_sapo(np.array([rho]), np.array([1.0]), 1.0, 1.05)
    _, _, w_neg = np_sapo(np.array([rho]), np.array([-1.0]), 1.0, 1.05)
    assert w_neg[0] < w_pos[0]


# ------------------------------------------------------------------------------------------------ Lite PPO


def test_group_mean_batch_std_matches_numpy():
  r = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
  got = np.asarray(jit_call(advantages.group_mean_batch_std, r, std_eps=1e-4, ddof=1))
  want = (r - r.mean(1, keepdims=True)) / (np.std(r, ddof=1) + 1e-4)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert np.all(got[1] == 0)  # a constant group carries no signal
  # unlike GRPO, one scale for the batch: the two varied groups' advantages share the denominator
  grpo = np.asarray(jit_call(advantages.grpo, r, std_eps=1e-4, ddof=1))
  assert not np.allclose(grpo[0] / got[0], grpo[2][[2, 0, 1, 3]] / got[2][[2, 0, 1, 3]])
  assert np.all(np.asarray(jit_call(advantages.group_mean_batch_std, np.ones((2, 3)))) == 0)
  # exactly 0 also where the group mean rounds (0.1 × 3 in float32 centred to −2e-8 before the fix), as under grpo
  assert np.all(np.asarray(jit_call(advantages.group_mean_batch_std,
                                    np.asarray([[0.1] * 3, [0.0, 1.0, 0.3]], np.float32)))[0] == 0)


# ------------------------------------------------------------------------------------------------ token selection


def test_covariance_is_the_population_covariance():
  rng = np.random.default_rng(4)
  lp, a = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
  mask = (np.arange(6)[None] < np.array([6, 3, 0, 5])[:, None])
  cov = np.asarray(jit_call(token_select.covariance, lp, a, mask))
  assert cov[~mask].sum() == 0
  assert cov.sum() / mask.sum() == pytest.approx(np.cov(lp[mask], a[mask], bias=True)[0, 1], rel=1e-5)


def test_top_entropy_keeps_the_top_fraction_and_only_their_gradient():
  """10 valid tokens, frac 0.2: the 2 of highest entropy keep their gradient; the normaliser is still 10 tokens."""
  ent = np.array([[0.1, 2.0, 0.3, 0.4, 0.5], [1.5, 0.2, 0.05, 0.9, 0.0], [9.0, 9.0, 9.0, 9.0, 9.0]])
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], np.float32)
  a = np.ones((3, 5))
  lp = np.full((3, 5), -1.0)
  f = lambda x: losses.policy_loss(x, jnp.asarray(lp, jnp.float32), None, jnp.asarray(a, jnp.float32),
                                   jnp.asarray(mask), eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean",
                                   token_select="top_entropy", select_cfg=SEL,
                                   ent_NxL=jnp.asarray(ent, jnp.float32))[0]
  g = _grad(f, lp)
  want = np.zeros((3, 5))
  want[0, 1] = want[1, 0] = -1.0 / 10  # entropies 2.0 and 1.5: the top 2 of 10
  np.testing.assert_allclose(g, want, rtol=1e-6)
  loss, m = jax.jit(f)(jnp.asarray(lp, jnp.float32)), jit_call(
      losses.policy_loss,
      jnp.asarray(lp, jnp.float32), jnp.asarray(lp, jnp.float32), None, jnp.asarray(a, jnp.float32),
      jnp.asarray(mask), eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean", token_select="top_entropy",
      select_cfg=SEL, ent_NxL=jnp.asarray(ent, jnp.float32))[1]
  assert float(loss) == pytest.approx(-2 / 10)
  assert float(m["select_frac"]) == pytest.approx(0.2) and float(m["select_entropy"]) == pytest.approx(1.75)


def test_top_entropy_frac_one_keeps_everything():
  rng = np.random.default_rng(5)
  ent, valid = rng.random((3, 4)), np.ones((3, 4))
  sel = jit_call(token_select.choose, "top_entropy", ml_collections.ConfigDict(dict(SEL, select_frac=1.0)),
                 logp_NxL=np.zeros((3, 4)), adv_NxL=np.zeros((3, 4)), mask_NxL=valid, ent_NxL=ent)
  assert np.all(np.asarray(sel.pg_NxL) == 1)


def _cov_case():
  """Advantages and log-probs whose covariance terms are known: mean A = 0, mean log π = −2 over the 8 tokens."""
  a = np.array([[3.0, -3.0, 1.0, -1.0], [2.0, -2.0, 0.5, -0.5]])
  lp = np.array([[-1.0, -3.0, -1.5, -2.5], [-0.5, -3.5, -2.0, -2.0]])
  # cov = (lp + 2)·a: [3, 3, 0.5, 0.5; 3, 3, 0, 0]
  return a, lp, np.ones((2, 4), np.float32)


def test_clip_cov_cuts_a_random_eligible_token():
  """cov = [3, 3, .5, .5; 3, 3, 0, 0]: eligible (1 < cov < 5) are the four 3's; ratio 0.2 of 8 tokens → 1 cut, the
  eligible token of the smallest uniform. Its gradient is 0, the others' are PPO's (ρ = 1: −A/n)."""
  a, lp, mask = _cov_case()
  cov = np.asarray(jit_call(token_select.covariance, lp, a, mask > 0))
  np.testing.assert_allclose(cov, [[3, 3, 0.5, 0.5], [3, 3, 0, 0]], atol=1e-6)
  u = np.array([[0.9, 0.5, 0.01, 0.02], [0.3, 0.7, 0.03, 0.04]])  # among the 3's the smallest u is (1, 0)
  cfg = ml_collections.ConfigDict(dict(SEL, clip_cov_ratio=0.2))
  f = lambda x: losses.policy_loss(x, jnp.asarray(lp, jnp.float32), None, jnp.asarray(a, jnp.float32),
                                   jnp.asarray(mask), eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean",
                                   token_select="clip_cov", select_cfg=cfg, ent_NxL=jnp.zeros((2, 4)),
                                   select_u_NxL=jnp.asarray(u, jnp.float32))[0]
  want = -a / 8
  want[1, 0] = 0.0
  np.testing.assert_allclose(_grad(f, lp), want, rtol=1e-6)
  # a token the clip already cuts is not eligible: make (1, 0) clipped (ρ = 1.5 > 1.2 with A > 0); then (1, 1)
  sel = jit_call(token_select.choose, "clip_cov", cfg, logp_NxL=jnp.asarray(lp), adv_NxL=jnp.asarray(a),
                 mask_NxL=jnp.asarray(mask), u_NxL=jnp.asarray(u),
                 clipped_NxL=jnp.asarray(np.eye(2, 4, k=0)[::-1] > 0))
  assert np.asarray(sel.pg_NxL)[1, 1] == 0 and np.asarray(sel.pg_NxL).sum() == 7


def test_clip_cov_skips_what_gspo_clips_by_its_sequence_ratio():
  """Under GSPO (ratio_level='sequence') the tokens the objective already cuts are decided by the answer's ratio s_i:
  log-ratios [+0.01, −0.01] give s = 1, inside GSPO's range, so no token is clipped and Clip-Cov (every eligible token
  at ratio 1) cuts both; the token ratio 1.01 > 1 + 4e-4 marked the first clipped and it kept its gradient."""
  old = np.array([[-1.0, -2.0], [-1.5, -0.5]])
  lp = old + np.array([[0.01, -0.01], [0.0, 0.0]])
  a = np.array([[1.0, 1.0], [-1.0, -1.0]])
  cfg = ml_collections.ConfigDict(dict(SEL, clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9))
  f = lambda x: losses.policy_loss(x, jnp.asarray(old, jnp.float32), None, jnp.asarray(a, jnp.float32),
                                   jnp.ones((2, 2)), eps_low=3e-4, eps_high=4e-4, beta=0.0, ratio_level="sequence",
                                   token_select="clip_cov", select_cfg=cfg, ent_NxL=jnp.zeros((2, 2)),
                                   select_u_NxL=jnp.asarray([[0.1, 0.2], [0.3, 0.4]], jnp.float32))[0]
  np.testing.assert_array_equal(_grad(f, lp), np.zeros((2, 2)))


def test_kl_cov_penalises_the_largest_covariance():
  """kl_cov_ratio 0.25 of 8 tokens → the 2 largest cov get
  coef·|log π − log π_old|; gradient of that penalty: coef·sign(log ρ)/n, added to PPO's."""
  a, lp, mask = _cov_case()
  a = a.copy()
  a[0, 1] = -2.9  # break a tie among the largest covariance terms
  old = lp - np.array([[0.1, -0.1, 0.1, 0.1], [0.05, -0.05, 0.0, 0.0]])
  cfg = ml_collections.ConfigDict(dict(SEL, kl_cov_ratio=0.25, kl_cov_coef=0.5))
  f = lambda x, sel="kl_cov": losses.policy_loss(
      x, jnp.asarray(old, jnp.float32), None, jnp.asarray(a, jnp.float32), jnp.asarray(mask), eps_low=10.0,
      eps_high=10.0, beta=0.0, agg="token_mean", token_select=sel, select_cfg=cfg, ent_NxL=jnp.zeros((2, 4)))[0]
  lpj = jnp.asarray(lp, jnp.float32)
  cov = np.asarray(jit_call(token_select.covariance, lpj, jnp.asarray(a), jnp.asarray(mask) > 0))
  picked = cov >= np.sort(cov.ravel())[::-1][1]
  assert 2 <= picked.sum() < 8
  diff = _grad(f, lp) - _grad(lambda x: f(x, "all"), lp)
  np.testing.assert_allclose(diff, np.where(picked, 0.5 * np.sign(lp - old) / 8, 0.0), rtol=1e-5, atol=1e-8)
  penalty = float(jax.jit(f)(lpj)) - float(jax.jit(lambda x: f(x, "all"))(lpj))
  assert penalty == pytest.approx(0.5 * np.sum(np.abs(lp - old)[picked]) / 8, rel=1e-5)


def test_kl_cov_penalises_exactly_k_tokens_under_ties():
  """Every advantage equal (a minibatch of constant groups): cov_t ≡ 0 ties everywhere, and KL-Cov still penalises
  max(floor(ratio·n), 1) tokens, as verl's topk (a threshold test picked all 10 here)."""
  mask = np.ones((2, 5), np.float32)
  for a in (np.zeros((2, 5)), np.full((2, 5), 0.7)):
    sel = jit_call(token_select.choose, "kl_cov", ml_collections.ConfigDict(dict(SEL, kl_cov_ratio=0.2)),
                   logp_NxL=jnp.asarray(-np.arange(10.0).reshape(2, 5)), adv_NxL=jnp.asarray(a),
                   mask_NxL=jnp.asarray(mask))
    assert np.asarray(sel.kl_NxL).sum() == 2 and np.all(np.asarray(sel.pg_NxL) == 1)


def test_clip_cov_cuts_exactly_k_tokens_when_uniforms_tie():
  """float32 uniforms take 2^23 values, so on a large minibatch the k-th smallest eligible uniform is shared now and
  then; a threshold test then cut k + 1 tokens. 0.25 of 8 tokens is 2: the uniforms 0.1 and the first 0.3 (ties by
  position), not the second 0.3 too; with fewer eligible tokens than k, all of them."""
  cfg = ml_collections.ConfigDict(dict(SEL, clip_cov_ratio=0.25, clip_cov_lb=-1e9, clip_cov_ub=1e9))
  a, lp, mask = _cov_case()
  u = jnp.asarray([[0.9, 0.3, 0.7, 0.1], [0.8, 0.3, 0.6, 0.5]])
  sel = jit_call(token_select.choose, "clip_cov", cfg, logp_NxL=jnp.asarray(lp), adv_NxL=jnp.asarray(a),
                 mask_NxL=jnp.asarray(mask), u_NxL=u)
  np.testing.assert_array_equal(np.asarray(sel.pg_NxL), [[1, 0, 1, 0], [1, 1, 1, 1]])
  one = jit_call(token_select.choose, "clip_cov", cfg, logp_NxL=jnp.asarray(lp), adv_NxL=jnp.asarray(a),
                 mask_NxL=jnp.asarray(mask), u_NxL=u, clipped_NxL=u != 0.1)
  assert float(one.metrics["select_frac"]) == 0.125 and np.asarray(one.pg_NxL)[0, 3] == 0


def test_selection_counts_match_numpy_on_random_batches():
  rng = np.random.default_rng(6)
  N, L = 6, 7
  mask = (np.arange(L)[None] < rng.integers(1, L + 1, N)[:, None])
  ent, lp, a = rng.random((N, L)), rng.uniform(-4, 0, (N, L)), rng.normal(size=(N, L)) * 3
  n = mask.sum()
  for frac in (0.1, 0.2, 0.5):
    sel = jit_call(token_select.choose, "top_entropy", ml_collections.ConfigDict(dict(SEL, select_frac=frac)),
                   logp_NxL=jnp.asarray(lp), adv_NxL=jnp.asarray(a), mask_NxL=jnp.asarray(mask),
                   ent_NxL=jnp.asarray(ent))
    k = max(int(np.ceil(frac * n)), 1)
    thr = np.sort(ent[mask])[::-1][k - 1]
    np.testing.assert_array_equal(np.asarray(sel.pg_NxL) > 0, mask & (ent >= thr))


def test_selection_counts_are_exact_where_ratio_times_n_is_an_integer():
  """float32(0.3)·50 = 15.000001 kept 16 tokens (ceil) where 0.3 of 50 is 15, and float32(0.65)·180 = 116.99999
  penalised 116 where it is 117. The counts against exact decimal arithmetic (fractions.Fraction) for every n up to
  3000 and the ratios a config is likely to name, ceil (top_entropy) and floor (Clip-Cov, KL-Cov)."""
  import fractions
  cases = [(r, c) for r in (0.3, 0.15, 0.6, 0.65, 0.33, 1e-3, 2e-4, 1e-5, 0.2, 0.7, 1.0) for c in (True, False)]
  got_CxN = np.asarray(jax.jit(lambda n: jnp.stack([token_select._count(r, n, c) for r, c in cases]))(
      jnp.arange(1, 3001)))
  n = np.arange(1, 3001, dtype=np.int64)
  for (ratio, ceil), got in zip(cases, got_CxN):
    p, q = fractions.Fraction(str(ratio)).as_integer_ratio()  # exact: NumPy int64 n·p never overflows here
    want = np.maximum(-(-n * p // q) if ceil else n * p // q, 1)
    np.testing.assert_array_equal(got, want, err_msg=f"ratio={ratio} ceil={ceil}")
  # the whole rule: 50 valid tokens of distinct entropies, select_frac 0.3 → exactly the 15 highest
  ent = jnp.arange(50, dtype=jnp.float32).reshape(5, 10)
  sel = jit_call(token_select.choose, "top_entropy", ml_collections.ConfigDict(dict(SEL, select_frac=0.3)),
                 logp_NxL=jnp.zeros((5, 10)), adv_NxL=jnp.zeros((5, 10)), mask_NxL=jnp.ones((5, 10)),
                 ent_NxL=ent)
  np.testing.assert_array_equal(np.asarray(sel.pg_NxL).reshape(-1), np.arange(50) >= 35)
  assert float(sel.metrics["select_frac"]) == pytest.approx(0.3)
  assert float(sel.metrics["select_entropy"]) == pytest.approx(np.arange(35, 50).mean())
  # KL-Cov: 0.65 of 180 tokens is 117
  cov_a = jnp.asarray(np.random.default_rng(9).normal(size=(12, 15)), jnp.float32)
  sel = jit_call(token_select.choose, "kl_cov", ml_collections.ConfigDict(dict(SEL, kl_cov_ratio=0.65)),
                 logp_NxL=cov_a, adv_NxL=cov_a, mask_NxL=jnp.ones((12, 15)))
  assert int(np.asarray(sel.kl_NxL).sum()) == 117


# ------------------------------------------------------------------------------------------------ presets


@pytest.mark.parametrize("name,key,want", [("cispo", "rl.objective", "cispo"), ("sapo", "rl.sapo_tau_neg", 1.05),
                                           ("lite_ppo", "rl.advantage", "group_mean_batch_std")])
def test_new_presets(name, key, want):
  c = presets.apply(config_lib.base_config(), name)
  assert c.rl[key.split(".")[1]] == want and c.rl.algo == name


@pytest.mark.parametrize("kind", ["top_entropy", "clip_cov", "kl_cov"])
def test_token_selection_in_the_step(kind):
  """One GRPO step of TINY with each rule: the current policy's entropies reach the objective, Clip-Cov's uniforms
  ride in the data, the statistics are logged, and a bad combination (packing) is refused before compiling."""
  import jax as jax_
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import families
  from grpo_jax.rl import rl_step
  from grpo_jax.run import validate
  from grpo_jax.tasks import digits
  from tests.test_rl_step import TINY1, _batches  # one layer: the claims do not depend on depth
  c = config_lib.override(digits.bench_config(**TINY1), {
      "rl.token_select": kind, "optim.lr": 1e-3, "rl.clip_cov_lb": -5.0, "rl.clip_cov_ub": 5.0,
      "rl.clip_cov_ratio": 0.1, "rl.kl_cov_ratio": 0.1})
  with pytest.raises(validate.ConfigError, match="rl.token_select"):
    validate.validate_rl(config_lib.override(c, {"rl.packing": True}), num_devices=1)
  with pytest.raises(validate.ConfigError, match="rl.token_select.*a resume keeps it"):  # packing a resume recorded
    rl_step.make_train_update(config_lib.override(c, {"rl.packing": "on"}), None, None, None, 0)
  mesh = sharding.make_mesh(c.mesh, jax_.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  _, m = step(rl_step.init(c, mesh, mcfg, seed=0), _batches(c, 1)[0])
  m = jax_.device_get(m)
  n = int(round(m["train/completion_len_mean"] * 16))  # 4 prompts × G 4 rows
  want = {"top_entropy": np.ceil(0.2 * n) / n, "clip_cov": np.floor(0.1 * n) / n, "kl_cov": np.floor(0.1 * n) / n}
  assert m["train/select_frac"] == pytest.approx(want[kind], abs=1.5 / n), (m["train/select_frac"], n)
  assert m["train/select_entropy"] > 0 and np.isfinite(m["train/loss"]) and "train/cov_logp_adv" in m


def test_step_entropy_is_the_token_mean_of_the_softmax_entropy_from_logits():
  """train/entropy against NumPy from the same logits: each token's −Σ p log p of softmax(logits / T) through the
  model's own head code (target_logprobs with the logits as hidden states and an identity head), then the mean over
  the valid tokens of the minibatch — the token mean (verl's actor/entropy), which weighs a long answer by its
  length; the per-answer mean (each row's token mean, averaged over rows) differs on uneven rows and is not what is
  logged. Padding, and a row with no valid token, add nothing."""
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import rl_step
  rng = np.random.default_rng(11)
  N, L, V, T = 4, 6, 10, 0.7
  logits = rng.normal(size=(N, L, V)) * 3
  logits[0, 0, 0] = 60.0  # one near-deterministic token: entropy ≈ 0, no NaN from exp underflow
  lengths = np.array([6, 2, 0, 4])
  mask = (np.arange(L)[None] < lengths[:, None]).astype(np.float32)
  z = logits / T
  logp = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
  ent_np = -(np.exp(logp) * logp).sum(-1)
  mcfg = model_lib.ModelConfig(vocab_size=V, hidden=V, layers=1, heads=1, kv_heads=1, inter=4, max_len=8)
  targets = rng.integers(0, V, (N, L))
  lp, ent = jit_call(model_lib.target_logprobs, mcfg, jnp.asarray(logits, jnp.float32), jnp.eye(V, dtype=jnp.float32),
                     jnp.asarray(targets), T)
  np.testing.assert_allclose(np.asarray(ent), ent_np, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(lp), np.take_along_axis(logp, targets[..., None], -1)[..., 0], rtol=2e-5,
                             atol=2e-5)
  c = config_lib.override(presets.apply(config_lib.base_config(), "grpo"), {"rl.beta": 0.0})
  objective = rl_step.make_objective(c)
  mb = {"old_logp_NxL": lp, "adv_NxL": jnp.asarray(rng.normal(size=(N, L)), jnp.float32), "mask_NxL": mask}
  _, m = jit_call(objective, (lp, ent), mb)
  token_mean = ent_np[mask > 0].mean()
  seq_mean = np.mean([ent_np[i, :n].mean() for i, n in enumerate(lengths) if n])
  assert float(m["entropy"]) == pytest.approx(token_mean, rel=1e-5)
  assert abs(token_mean - seq_mean) > 1e-3  # the two conventions differ here, so the test tells them apart


def test_an_update_without_loss_tokens_is_left_out_of_the_token_mean_metrics():
  """Two minibatches of a step, the second with every token removed from the loss mask (the rollout correction's
  sequence rejection or the staleness mask can do that): its entropy, ratio_mean and clip fractions were masked
  means of nothing, 0, and train/entropy came out half the first update's (0.5 × 1.2 + 0.5 × 0: a policy collapsing
  to determinism, on the plot). Now that update's token means are NaN and the step's are over the updates that had
  tokens; a step with none reads NaN. The packed pass's micro-batch sum gives the same (packing.combine)."""
  from grpo_jax.rl import packing
  from grpo_jax.rl import rl_step
  from grpo_jax.rl import update
  c = config_lib.override(presets.apply(config_lib.base_config(), "grpo"), {"rl.beta": 0.0})
  objective = rl_step.make_objective(c)
  lp = jnp.full((2, 3), -1.0)
  ent = jnp.asarray([[1.0, 1.4, 9.0], [1.2, 1.2, 9.0]])  # 9.0: padding, never read
  full = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
  mb = lambda mask: {"old_logp_NxL": lp, "adv_NxL": jnp.ones((2, 3)), "mask_NxL": mask}
  updates = [jit_call(objective, (lp, ent), mb(m))[1] for m in (full, jnp.zeros((2, 3)))]
  assert float(updates[0]["entropy"]) == pytest.approx(1.2) and np.isnan(float(updates[1]["entropy"]))
  um = {k: jnp.stack([u[k] for u in updates]) for k in updates[0]}
  m = jit_call(update.step_metrics, dict(um, nonfinite=jnp.zeros(2, jnp.int32)), {"w": jnp.ones(2)})
  assert float(m["train/entropy"]) == pytest.approx(1.2)  # was 0.6
  assert float(m["train/ratio_mean"]) == pytest.approx(1.0) and float(m["train/clip_frac_low"]) == 0.0
  none = jit_call(update.step_metrics, dict(jax.tree.map(lambda x: x[1:], um), nonfinite=jnp.zeros(1, jnp.int32)), {})
  assert np.isnan(float(none["train/entropy"])) and np.isnan(float(none["train/ratio_mean"]))
  # packed: a micro-batch without tokens (weight 0, NaN metrics) adds nothing to the minibatch's sum
  acc = {"entropy": jnp.float32(0.0), "surrogate": jnp.float32(0.0)}
  acc = jit_call(packing.combine, acc, {"entropy": jnp.float32(1.2), "surrogate": jnp.float32(0.5)},
                 jnp.float32(1.0), 1.0)
  acc = jit_call(packing.combine, acc, {"entropy": jnp.float32(jnp.nan), "surrogate": jnp.float32(0.0)},
                 jnp.float32(0.0), 1.0)
  assert float(acc["entropy"]) == pytest.approx(1.2)


def test_statistics_of_every_objective_and_selection_with_correction_weights_against_numpy():
  """Every objective × token selection, with and without a correction's weights, on a batch with an empty row and
  ragged rows (the mask a correction leaves): clip fractions (PPO: the strictly active clipped side; CISPO: the
  weight clipped, either sign of A), SAPO's gate_mean and gated_frac, and the selection's select_frac /
  select_entropy / select_cov, each against an independent NumPy version. The weights scale the surrogate only, so
  no statistic may move with them; Clip-Cov must skip the tokens PPO's clip already cut."""
  rng = np.random.default_rng(1)
  N, L = 6, 9
  mask = (np.arange(L)[None] < rng.integers(1, L + 1, N)[:, None]).astype(np.float32)
  mask[2] = 0
  lp = rng.uniform(-5, -0.01, (N, L)).astype(np.float32)
  old = (lp + rng.normal(size=(N, L)) * 0.4).astype(np.float32)
  adv = np.repeat(rng.normal(size=(N, 1)), L, 1).astype(np.float32)
  ent = rng.uniform(0, 3, (N, L)).astype(np.float32)
  u = rng.random((N, L)).astype(np.float32)
  is_w = rng.uniform(0.5, 2, (N, L)).astype(np.float32)
  v = mask > 0
  n = v.sum()
  cfg = ml_collections.ConfigDict(dict(SEL, select_frac=0.3, clip_cov_ratio=0.2, clip_cov_lb=-10.0,
                                       clip_cov_ub=10.0, kl_cov_ratio=0.2))
  rho = np.exp(np.clip(lp.astype(np.float64) - old, -20, 20))
  cov = (lp - lp[v].mean()) * (adv - adv[v].mean())
  checked = 0
  for obj in ("clip", "cispo", "sapo"):
    ref = {}
    if obj == "clip":
      low, high = (rho < 0.8) & (adv < 0), (rho > 1.28) & (adv > 0)
      clipped = low | high
      ref.update(clip_frac_low=low[v].mean(), clip_frac_high=high[v].mean())
    elif obj == "cispo":
      clipped = np.zeros_like(v)
      ref.update(clip_frac_low=(rho < 0.8)[v].mean(), clip_frac_high=(rho > 1.28)[v].mean())
    else:
      clipped = np.zeros_like(v)
      g = 1 / (1 + np.exp(-np.where(adv > 0, 1.0, 1.05) * (rho - 1)))
      ref.update(gate_mean=(4 * g * (1 - g))[v].mean(), gated_frac=(4 * g * (1 - g) < 0.5)[v].mean())
    for ts in token_select.KINDS:
      picked = None
      if ts == "top_entropy":  # ceil(0.3·n) highest entropies
        picked = v & (ent >= np.sort(ent[v])[::-1][-(-3 * n // 10) - 1])
      elif ts == "clip_cov":  # floor(0.2·n) eligible tokens of smallest uniform, PPO-clipped ones not eligible
        elig = v & ~clipped
        idx = np.argsort(np.where(elig, u, np.inf).ravel())[:2 * n // 10]
        picked = np.isin(np.arange(v.size), idx).reshape(v.shape) & elig
      elif ts == "kl_cov":  # floor(0.2·n) largest cov, ties by position
        idx = np.argsort(-np.where(v, cov, -np.inf).ravel(), kind="stable")[:2 * n // 10]
        picked = np.isin(np.arange(v.size), idx).reshape(v.shape)
      want = dict(ref)
      if picked is not None:
        want.update(select_frac=picked.sum() / n, select_entropy=ent[picked].mean(), select_cov=cov[picked].mean())
      for w in (None, is_w):
        _, m = losses.policy_loss(jnp.asarray(lp), jnp.asarray(old), None, jnp.asarray(adv), jnp.asarray(mask),
                                  eps_low=0.2, eps_high=0.28, beta=0.0, agg="token_mean", objective=obj,
                                  token_select=ts, select_cfg=cfg, ent_NxL=jnp.asarray(ent),
                                  select_u_NxL=jnp.asarray(u), is_w_NxL=None if w is None else jnp.asarray(w))
        for k, x in want.items():
          assert float(m[k]) == pytest.approx(x, rel=1e-5, abs=1e-6), (obj, ts, w is None, k)
          checked += 1
  assert checked > 100


def test_selection_means_are_nan_when_nothing_was_picked_and_the_step_skips_them():
  """Clip-Cov with no eligible token (every cov_t outside (lb, ub)) picks none: select_entropy and select_cov were 0,
  and the step's mean over its updates counted that 0 as a measured entropy (updates picking entropies 2.0 and none
  read 1.0). Now NaN for the update, and update.step_metrics averages over the updates that picked any (2.0); NaN
  only if none did. select_frac stays a fraction (0)."""
  from grpo_jax.rl import update as update_lib
  a, lp, mask = _cov_case()  # cov ∈ {3, 0.5, 0}: none inside (10, 20)
  cfg = ml_collections.ConfigDict(dict(SEL, clip_cov_lb=10.0, clip_cov_ub=20.0, clip_cov_ratio=0.2))
  sel = jit_call(token_select.choose, "clip_cov", cfg, logp_NxL=jnp.asarray(lp), adv_NxL=jnp.asarray(a),
                 mask_NxL=jnp.asarray(mask), ent_NxL=jnp.ones((2, 4)), u_NxL=jnp.full((2, 4), 0.5))
  assert float(sel.metrics["select_frac"]) == 0.0
  assert np.isnan(float(sel.metrics["select_entropy"])) and np.isnan(float(sel.metrics["select_cov"]))
  assert np.all(np.asarray(sel.pg_NxL) == 1)  # nothing cut
  um = {"select_entropy": jnp.asarray([2.0, jnp.nan]), "select_cov": jnp.asarray([0.5, jnp.nan]),
        "select_frac": jnp.asarray([0.25, 0.0]), "nonfinite": jnp.zeros(2, jnp.int32)}
  m = jit_call(update_lib.step_metrics, um, {"w": jnp.ones(2)})
  assert float(m["train/select_entropy"]) == 2.0 and float(m["train/select_cov"]) == 0.5
  assert float(m["train/select_frac"]) == 0.125
  none = jit_call(update_lib.step_metrics, dict(um, select_entropy=jnp.full(2, jnp.nan)), {"w": jnp.ones(2)})
  assert np.isnan(float(none["train/select_entropy"]))


def _np_objective(obj, lp, old, a, v, el, eh, dual):
  """(J, dJ/dlog π, tokens the objective's clip cuts) per token, float64, from the papers' formulas."""
  rho = np.exp(lp - old)
  if obj == "gspo":  # s_i = exp(mean_t log ρ) on every token of the answer; ∂s_{i,t}/∂log π_t = s_i
    rho = np.repeat(np.exp(np.sum(np.where(v, lp - old, 0), 1) / np.maximum(v.sum(1), 1))[:, None], v.shape[1], 1)
  if obj == "cispo":
    r_hat = np.clip(rho, 1 - el, 1 + eh)
    return r_hat * a, r_hat * a, np.zeros_like(v)
  if obj == "sapo":
    tau = np.where(a > 0, 1.0, 1.05)
    s = 1 / (1 + np.exp(-tau * (rho - 1)))
    return 4 / tau * s * a, 4 * s * (1 - s) * rho * a, np.zeros_like(v)
  un, cl = rho * a, np.clip(rho, 1 - el, 1 + eh) * a
  J, dJ = np.minimum(un, cl), np.where(un <= cl, rho * a, 0.0)
  cut = ((rho > 1 + eh) & (a > 0)) | ((rho < 1 - el) & (a < 0))
  if dual > 1:
    d = (a < 0) & (dual * a > J)
    J, dJ, cut = np.where(d, dual * a, J), np.where(d, 0.0, dJ), cut | ((a < 0) & (rho > dual))
  return J, dJ, cut


@pytest.mark.parametrize("obj,ts,agg,beta", [
    ("clip", "kl_cov", "seq_mean_token_mean", 0.04), ("gspo", "top_entropy", "seq_mean_token_mean", 0.0),
    ("cispo", "clip_cov", "token_mean", 0.0), ("sapo", "kl_cov", "token_mean", 0.0),
    ("cispo", "top_entropy", "seq_mean_token_sum_norm", 0.0), ("sapo", "clip_cov", "seq_mean_token_sum_norm", 0.0),
    ("gspo", "clip_cov", "token_mean", 0.0)])
def test_objective_selection_and_correction_weights_compose_against_numpy(obj, ts, agg, beta):
  """Loss and gradient w.r.t. log π of objective × token selection × a correction's weights w × aggregation, against
  a NumPy version written from the papers: −agg(w·sel·J − kl_cov_coef·[KL-Cov]·|log ρ| − β·k3), with w and
  the selection constants of the update (only J, the penalty and k3 carry the gradient). The batch has ragged rows, an
  empty row, a row of one token, NaN on padding, zero and negative advantages, and entropies tied at the cut."""
  rng = np.random.default_rng(12)
  N, L = 5, 6
  lengths = np.array([6, 1, 0, 4, 3])
  v = np.arange(L)[None] < lengths[:, None]
  old = rng.uniform(-3, -0.1, (N, L))
  lp = old + rng.normal(size=(N, L)) * 0.3
  ref = lp + rng.normal(size=(N, L)) * 0.4
  a = np.repeat(np.array([[1.2], [-0.7], [0.5], [0.0], [-1.5]]), L, 1)
  ent = np.round(rng.uniform(0, 1, (N, L)), 1)  # 0.0 … 1.0: ties
  u, w = rng.random((N, L)), rng.uniform(0.3, 2.5, (N, L))
  el, eh, dual = (3e-4, 4e-4, 0.0) if obj == "gspo" else (0.2, 0.28, 3.0)
  cfg = ml_collections.ConfigDict(dict(SEL, select_frac=0.3, clip_cov_ratio=0.3, clip_cov_lb=-1.0, clip_cov_ub=5.0,
                                       kl_cov_ratio=0.3, kl_cov_coef=0.7))
  J, dJ, cut = _np_objective(obj, lp, old, a, v, el, eh, dual)
  J, dJ = J * w, dJ * w
  n = v.sum()
  cov = np.where(v, (lp - lp[v].mean()) * (a - a[v].mean()), 0.0)
  if ts == "top_entropy":  # ceil(0.3·14) = 5 highest entropies, ties at the 5th kept
    keep = v & (ent >= np.sort(ent[v])[::-1][4])
    J, dJ = J * keep, dJ * keep
  elif ts == "clip_cov":  # floor(0.3·14) = 4 eligible tokens of smallest uniform get nothing
    elig = v & (cov > -1.0) & (cov < 5.0) & ~cut
    cut_t = np.isin(np.arange(N * L), np.argsort(np.where(elig, u, np.inf).ravel(), kind="stable")[:4])
    cut_t = cut_t.reshape(N, L) & elig
    J, dJ = J * ~cut_t, dJ * ~cut_t
  else:  # the 4 largest cov (ties by position) get 0.7·|log ρ|
    pen = np.isin(np.arange(N * L), np.argsort(-np.where(v, cov, -np.inf).ravel(), kind="stable")[:4]).reshape(N, L)
    J, dJ = J - 0.7 * pen * np.abs(lp - old), dJ - 0.7 * pen * np.sign(lp - old)
  d = ref - lp
  J, dJ = J - beta * (np.exp(d) - d - 1), dJ - beta * (1 - np.exp(d))
  wt = {"token_mean": np.full((N, L), 1 / n),
        "seq_mean_token_mean": np.ones((N, L)) / np.maximum(lengths, 1)[:, None] / N,
        "seq_mean_token_sum_norm": np.full((N, L), 1 / (7.0 * N))}[agg] * v
  nan_pad = lambda x: jnp.asarray(np.where(v, x, np.nan), jnp.float32)
  f = lambda x: losses.policy_loss(
      x, nan_pad(old), nan_pad(ref), nan_pad(a), jnp.asarray(v, jnp.float32), eps_low=el, eps_high=eh, beta=beta,
      agg=agg, norm_len=7.0, ratio_level="sequence" if obj == "gspo" else "token", dual_clip=dual, kl_clamp=10.0,
      is_w_NxL=nan_pad(w), objective="clip" if obj == "gspo" else obj, token_select=ts, select_cfg=cfg,
      ent_NxL=nan_pad(ent), select_u_NxL=nan_pad(u))[0]
  loss, g = jax.jit(jax.value_and_grad(f))(nan_pad(lp))
  assert float(loss) == pytest.approx(-np.sum(J * wt), rel=1e-5, abs=1e-7)
  np.testing.assert_allclose(np.asarray(g), -dJ * wt, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("mu,minibatches,first", [(1, 1, None), (2, 1, None), (1, 2, None), (2, 1, True),
                                                  (1, 2, True), (2, 2, False)])
def test_one_update_takes_the_ratio_against_the_current_params_exactly(mu, minibatches, first):
  """With one update per step (μ = 1, one minibatch) π_old is the current params, so the objective's ratio is
  exactly 1 (verl's dp_actor on-policy: old_log_prob = log_prob.detach()), not the recorded π_prox that equals it
  only to rounding. Here the recorded log-probs are off by ±1e-6 (a sampler's or a second forward's rounding):
  KL-Cov's coef·|log ρ| penalty then gave its chosen token a gradient of ±coef, as large as the policy
  gradient's |A|. With μ or minibatches > 1 the step's first update (minibatch_scan's flag, rl_step.FIRST_UPDATE
  True) runs at those params too and is exact the same way (it read the recorded π_prox: ±4.8e-7 in log ρ with the
  sampler's log-probs on the tiny model); the later ones (False), and a minibatch without the flag, read it."""
  from grpo_jax.rl import rl_step
  c = config_lib.base_config()
  c.rl.update(mu=mu, minibatches=minibatches, token_select="kl_cov", kl_cov_ratio=0.1, kl_cov_coef=1.0, beta=0.0)
  rng = np.random.default_rng(0)
  logp_NxL = jnp.asarray(rng.uniform(-3.0, -0.1, (4, 6)), jnp.float32)
  mask_NxL = jnp.asarray(np.arange(6)[None, :] < np.array([6, 4, 5, 2])[:, None], jnp.float32)
  sign_NxL = rng.choice([-1.0, 1.0], logp_NxL.shape).astype(np.float32)
  mb = dict(old_logp_NxL=logp_NxL + 1e-6 * sign_NxL, adv_NxL=jnp.asarray(rng.normal(size=(4, 6)), jnp.float32),
            mask_NxL=mask_NxL, ref_logp_NxL=None)
  ent_NxL = jnp.asarray(rng.uniform(0.1, 2.0, (4, 6)), jnp.float32)

  if first is not None:
    mb[rl_step.FIRST_UPDATE] = jnp.asarray(first)

  def grad(coef):
    cfg = config_lib.override(c, {"rl.kl_cov_coef": coef})
    objective = rl_step.make_objective(cfg)
    g, aux = jax.grad(lambda lp: objective((lp, ent_NxL), mb), has_aux=True)(logp_NxL)
    return np.asarray(g), aux

  g1, aux = grad(1.0)
  g0, _ = grad(0.0)
  assert float(aux["select_frac"]) > 0  # the penalty chose tokens
  if mu * minibatches == 1 or first:
    np.testing.assert_array_equal(g1, g0)  # |log ρ| = 0 exactly: the penalty adds no gradient
    assert float(aux["ratio_max"]) == 1.0 and float(aux["ratio_min"]) == 1.0
  else:
    # the recorded π_prox is read: the chosen tokens get ±coef / n_valid from the penalty
    assert np.abs(g1 - g0).max() > 0.5 / float(mask_NxL.sum())


@pytest.mark.parametrize("mu,minibatches,packing", [(3, 2, "off"), (2, 1, "on"), (1, 1, "off")])
def test_the_step_flags_its_first_update_only(mu, minibatches, packing):
  """train_by_length (padded and packed) hands minibatch_scan the flag: True on the first of the μ·minibatches
  updates, False on the others; with one update the flag is not needed (old_logp is exact on every update)."""
  from grpo_jax.rl import rl_step
  c = config_lib.override(config_lib.base_config(), {"rl.mu": mu, "rl.minibatches": minibatches, "rl.packing": packing,
                                                     "rl.train_buckets": 1, "sampling.max_new_tokens": 3})
  data = dict(seq=(jnp.zeros((4, 5), jnp.int32),) * 3, mask_NxL=jnp.ones((4, 3)))

  def update(carry, mb):
    return carry, {"first": mb.get(rl_step.FIRST_UPDATE, jnp.asarray(-1))}
  _, um = rl_step.train_by_length(c, update, jnp.float32(0), data, jax.random.PRNGKey(0), None, 2)
  want = [-1] if mu * minibatches == 1 else [1] + [0] * (mu * minibatches - 1)
  assert np.asarray(um["first"]).astype(int).tolist() == want


def test_covariance_metric_is_over_the_tokens_the_update_trains():
  """train/cov_logp_adv read every completion token, the ones a rollout correction (or the staleness mask) took out
  of the loss too: they get no gradient, so they move no entropy, and train/entropy and the token selections read
  the trained tokens only. Here MIS drops the tokens of ρ = π_prox/μ > 2 (a third of them, with the log-probs and
  advantages that carry the covariance): the metric is NumPy's population covariance over the kept tokens."""
  from grpo_jax.rl import rl_step
  from grpo_jax.rl import rollout as rollout_lib
  rng = np.random.default_rng(7)
  N, L = 4, 6
  mask = (np.arange(L)[None] < np.array([6, 3, 5, 0])[:, None]).astype(np.float32)
  old = rng.uniform(-3, -0.1, (N, L)).astype(np.float32)
  drop = (rng.random((N, L)) < 0.35) & (mask > 0)
  behav = np.where(drop, old - 1.5, old - 0.01).astype(np.float32)  # ρ = e^1.5 > mis_hi = 2 where dropped
  adv = np.where(drop, 3.0, rng.normal(size=(N, L))).astype(np.float32)  # the dropped tokens skew the covariance
  c = config_lib.override(config_lib.base_config(), {"rl.rollout_correction": "mis", "rl.mis_hi": 2.0})
  ro = rollout_lib.Rollout(**{**dict.fromkeys(rollout_lib.Rollout._fields), **dict(
      seq=None, mask_NxL=jnp.asarray(mask), old_logp_NxL=jnp.asarray(old), behav_logp_NxL=jnp.asarray(behav))})
  data, m = rl_step.training_data(c, ro, jnp.asarray(adv))
  kept = (mask > 0) & ~drop
  np.testing.assert_array_equal(np.asarray(data["mask_NxL"]) > 0, kept)
  want = np.cov(old[kept].astype(np.float64), adv[kept].astype(np.float64), bias=True)[0, 1]
  every = np.cov(old[mask > 0].astype(np.float64), adv[mask > 0].astype(np.float64), bias=True)[0, 1]
  assert abs(want - every) > 0.05  # the dropped tokens would move it
  assert float(m["train/cov_logp_adv"]) == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_select_frac_of_an_update_without_tokens_is_left_out_of_the_step_mean():
  """An update whose minibatch has no loss token (a correction or the staleness mask removed them all) picked nothing
  of nothing: its select_frac read 0 and the step's mean over its updates halved top_entropy's 0.2 to 0.1. Now NaN
  for that update (as the other token means) and left out of the mean: the step reports 0.2."""
  from grpo_jax.rl import rl_step
  from grpo_jax.rl import update as update_lib
  c = config_lib.override(config_lib.base_config(), {"rl.token_select": "top_entropy", "rl.select_frac": 0.2,
                                                      "rl.beta": 0.0})
  objective = rl_step.make_objective(c)
  rng = np.random.default_rng(3)
  lp, ent = jnp.asarray(rng.uniform(-3, -0.1, (2, 5)), jnp.float32), jnp.asarray(rng.random((2, 5)), jnp.float32)
  ms = []
  for mask in (np.ones((2, 5), np.float32), np.zeros((2, 5), np.float32)):
    mb = dict(old_logp_NxL=lp, adv_NxL=jnp.ones((2, 5)), mask_NxL=jnp.asarray(mask), ref_logp_NxL=None)
    ms.append(jit_call(objective, (lp, ent), mb)[1])
  assert float(ms[0]["select_frac"]) == pytest.approx(0.2)
  assert np.isnan(float(ms[1]["select_frac"]))
  um = {k: jnp.stack([ms[0][k], ms[1][k]]) for k in ("select_frac", "select_entropy", "entropy")}
  m = jit_call(update_lib.step_metrics, dict(um, nonfinite=jnp.zeros(2, jnp.int32)), {"w": jnp.ones(2)})
  assert float(m["train/select_frac"]) == pytest.approx(0.2)
  assert float(m["train/select_entropy"]) == pytest.approx(float(ms[0]["select_entropy"]))


def test_clip_cov_draws_each_updates_choice_afresh():
  """Clip-Cov's uniforms were drawn once per step and shared by its updates, so with μ = 2 epochs a token cut in the
  first epoch was cut again in the second (95% of the cuts in a NumPy replay, against 5% for independent draws): a
  token was detached for the whole step or not at all, where verl draws a fresh permutation per update. Through the
  step's own pieces (training_data, train_by_length → minibatch_scan, make_objective): the cut tokens of each update
  are those of zero gradient; each update cuts exactly k of its tokens, and the two epochs' cuts overlap about as
  independent draws do (expected k/n = 10%), not as the shared draws (≈ 90% here)."""
  from grpo_jax.rl import rl_step
  from grpo_jax.rl import rollout as rollout_lib
  from grpo_jax.rl import update as update_lib
  N, L, P = 16, 25, 2
  c = config_lib.override(config_lib.base_config(), {
      "rl.token_select": "clip_cov", "rl.clip_cov_ratio": 0.1, "rl.clip_cov_lb": -1e9, "rl.clip_cov_ub": 1e9,
      "rl.mu": 2, "rl.minibatches": 2, "rl.beta": 0.0, "rl.train_buckets": 1, "sampling.max_new_tokens": L})
  rng = np.random.default_rng(11)
  lp = jnp.asarray(rng.uniform(-3, -0.1, (N, L)), jnp.float32)
  adv = jnp.asarray(rng.choice([-1.0, 1.0], (N, L)) * rng.uniform(0.5, 1.5, (N, L)), jnp.float32)
  ro = rollout_lib.Rollout(**{**dict.fromkeys(rollout_lib.Rollout._fields), **dict(
      seq=(jnp.zeros((N, P + L), jnp.int32),) * 3, mask_NxL=jnp.ones((N, L)), old_logp_NxL=lp, behav_logp_NxL=lp)})
  data, _ = rl_step.training_data(c, ro, adv)
  data = dict(data, logp_NxL=lp, row_N=jnp.arange(N))
  objective = rl_step.make_objective(c)

  def update(carry, mb):  # ratio 1 on every update (π_old = the logp given): PPO's −A/n except where Clip-Cov cut
    g = jax.grad(lambda x: objective((x, jnp.ones_like(x)), mb)[0])(mb["logp_NxL"])
    return carry, {"cut": g == 0, "row": mb["row_N"]}
  _, um = rl_step.train_by_length(c, update, jnp.float32(0), data, jax.random.PRNGKey(4), None, P)
  cut_UxMxL = np.asarray(um["cut"]).reshape(4, N // 2, L)  # (minibatch_scan flattens each metric over the updates)
  row_UxM = np.asarray(um["row"]).reshape(4, N // 2)
  k = int(0.1 * (N // 2) * L)  # per minibatch of 8 rows × 25 tokens: 20
  assert all(int(u.sum()) == k for u in cut_UxMxL)
  per_epoch = []
  for e in range(2):  # back to the step's rows: the tokens each epoch cut
    cut_NxL = np.zeros((N, L), bool)
    for u in (2 * e, 2 * e + 1):
      cut_NxL[row_UxM[u]] |= cut_UxMxL[u]
    per_epoch.append(cut_NxL)
  overlap = (per_epoch[0] & per_epoch[1]).sum() / per_epoch[0].sum()
  assert overlap < 0.4, overlap  # shared draws: ~0.9; fresh draws: ~0.1 (40 cuts of 400 tokens each epoch)
