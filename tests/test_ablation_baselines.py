"""The baselines ablation: exact gradient, the (G−1)/G identity, LOO unbiasedness, GRPO's prompt re-weighting."""
import numpy as np
import pytest

from grpo_jax.studies.ablations import baselines

N_DRAWS = 6000


@pytest.fixture(scope="module")
def bandit():
  return baselines.make_bandit(success_rates=(0.1, 0.5, 0.8), K=4, n_correct=1, seed=3)


def test_bandit_and_exact_gradient(bandit):
  np.testing.assert_allclose(bandit.success_P, [0.1, 0.5, 0.8], rtol=1e-12)

  def J(flat):
    logits = flat.reshape(bandit.logits_PxK.shape)
    return baselines.Bandit(logits, bandit.rewards_PxK).success_P.mean()

  theta = bandit.logits_PxK.reshape(-1)
  fd = np.array([(J(theta + h) - J(theta - h)) / 2e-6 for h in np.eye(theta.size) * 1e-6])
  np.testing.assert_allclose(baselines.exact_gradient(bandit).reshape(-1), fd, atol=1e-9)


@pytest.mark.parametrize("G", [2, 4, 8, 16])
def test_exact_prompt_weights(bandit, G):
  np.testing.assert_allclose(baselines.prompt_weights(bandit, "none", G), 1.0, rtol=1e-6)
  np.testing.assert_allclose(baselines.prompt_weights(bandit, "loo", G), 1.0, rtol=1e-6)
  np.testing.assert_allclose(baselines.prompt_weights(bandit, "mean", G), (G - 1) / G, rtol=1e-6)


@pytest.fixture(scope="module")
def draws(bandit):
  return {name: baselines.mc_gradients(bandit, name, 4, N_DRAWS, seed=7) for name in ("loo", "mean", "mean_std")}


def _within_mc_error(g, want, z=4.5):
  se = g.std(axis=0) / np.sqrt(len(g)) + 1e-12
  return np.all(np.abs(g.mean(axis=0) - want) <= z * se)


def test_group_mean_is_scaled_loo_sample_by_sample(draws):
  # Same seed -> same samples: ĝ_mean = (G−1)/G · ĝ_loo draw by draw, hence E[ĝ_mean] = (G−1)/G ∇J.
  np.testing.assert_allclose(draws["mean"], 0.75 * draws["loo"], rtol=1e-5, atol=1e-8)


def test_loo_unbiased_and_group_mean_biased(bandit, draws):
  g_true = baselines.exact_gradient(bandit)
  assert _within_mc_error(draws["loo"], g_true)
  assert _within_mc_error(draws["mean"], 0.75 * g_true)
  assert not _within_mc_error(draws["mean"], g_true)  # the (G−1)/G bias is far above MC noise here


def test_mean_std_reweights_prompts(bandit, draws):
  # The exact weights (binomial conditioning) agree with Monte Carlo ...
  w_P = baselines.prompt_weights(bandit, "mean_std", 4)
  assert _within_mc_error(draws["mean_std"], w_P[:, None] * baselines.exact_gradient(bandit))
  # ... and for larger G they favour prompts far from 50% success (easy or hard) over p = 0.5.
  b = baselines.make_bandit(success_rates=(0.1, 0.3, 0.5, 0.7, 0.9))
  w = baselines.prompt_weights(b, "mean_std", 16)
  assert w[0] > w[1] > w[2] and w[4] > w[3] > w[2]
  np.testing.assert_allclose(w[:2], w[::-1][:2], rtol=1e-4)  # symmetric in p <-> 1 − p


def test_run_table(bandit):
  # Same G, n_draws and estimators as the `draws` fixture: reuses its compiled samplers.
  rows = baselines.run(Gs=(4,), n_draws=N_DRAWS, bandit=bandit, estimators=("loo", "mean", "mean_std"))
  by = {r["estimator"]: r for r in rows}
  assert by["mean"]["rel_bias_exact"] == pytest.approx(0.25, rel=1e-6)
  assert by["mean"]["rel_bias_mc"] == pytest.approx(0.25, abs=4 * by["mean"]["mc_noise"])
  assert by["loo"]["rel_bias_exact"] == pytest.approx(0.0, abs=1e-6)
  assert by["loo"]["rel_bias_mc"] < 4 * by["loo"]["mc_noise"]
  # Group mean's variance is exactly (3/4)² of LOO's on the same draws; here the draws differ, so ~10% slack.
  assert by["mean"]["rel_var"] == pytest.approx(0.5625 * by["loo"]["rel_var"], rel=0.1)
  assert by["mean"]["cos_exact"] == pytest.approx(1.0) and by["mean_std"]["cos_exact"] < 1.0
  assert "bias(exact)" in baselines.format_table(rows)
