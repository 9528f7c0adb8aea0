"""Losses against hand-computed values, independent NumPy versions, and exact KL gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import losses
from tests.jit_call import jit_call
from tests.jit_call import jit_grad

RNG = np.random.default_rng(0)


def ragged_mask(lengths, L):
  return (np.arange(L)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


# ---------------------------------------------------------------- KL estimators


def test_kl_hand_values():
  lp, ref = jnp.array([-1.0, -3.0]), jnp.array([-2.0, -1.0])
  np.testing.assert_allclose(np.asarray(jit_call(losses.kl_k1, lp, ref)), [1.0, -2.0])
  np.testing.assert_allclose(np.asarray(jit_call(losses.kl_k2, lp, ref)), [0.5, 2.0])
  # Δ = ref − lp = [-1, 2]: e^Δ − Δ − 1.
  np.testing.assert_allclose(np.asarray(jit_call(losses.kl_k3, lp, ref)), [np.exp(-1.0), np.exp(2.0) - 3.0], rtol=1e-6)
  assert float(jit_call(losses.kl_k3, jnp.array(-0.7), jnp.array(-0.7))) == 0.0


def test_k3_nonnegative_and_finite_on_extremes():
  d = np.concatenate([RNG.normal(size=2000) * 1e3, RNG.uniform(-1e4, 1e4, 2000), RNG.normal(size=2000) * 1e-7,
                      np.linspace(-30, 30, 601)]).astype(np.float32)
  lp = RNG.uniform(-50, 0, size=d.shape).astype(np.float32)
  k3 = np.asarray(jit_call(losses.kl_k3, jnp.asarray(lp), jnp.asarray(lp + d)))
  assert np.all(k3 >= 0) and np.all(np.isfinite(k3))
  # For |Δ| <= 30 the value and the gradient are finite; below the clip the value is exact.
  d30 = np.linspace(-30.0, 30.0, 61, dtype=np.float32)
  g = jit_grad(lambda lp: jnp.sum(losses.kl_k3(lp, 1.0 + d30)), np.ones(61, np.float32))
  assert np.all(np.isfinite(np.asarray(g)))
  small = np.linspace(-30, 19, 50)
  np.testing.assert_allclose(np.asarray(jit_call(losses.kl_k3, np.zeros(50), jnp.asarray(small, jnp.float32))),
                             np.expm1(small) - small, rtol=2e-5)
  # Above the clip the value saturates at f(K3_MAX_LOG_RATIO).
  c = losses.K3_MAX_LOG_RATIO
  np.testing.assert_allclose(float(jit_call(losses.kl_k3, jnp.array(0.0), jnp.array(30.0))), np.expm1(c) - c, rtol=1e-5)


def np_softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def np_kl(p, q):
  return float(np.sum(p * (np.log(p) - np.log(q))))


def np_fd_grad(f, theta, h=1e-6):
  g = np.zeros_like(theta)
  for j in range(theta.size):
    e = np.zeros_like(theta)
    e[j] = h
    g[j] = (f(theta + e) - f(theta - e)) / (2 * h)
  return g


@pytest.mark.parametrize("seed", [0, 1])
def test_kl_estimator_expected_gradients(seed):
  """Σ_x π(x) ∇θ k(x) with π = softmax(θ) held fixed as sampling weights, against exact KL gradients."""
  rng = np.random.default_rng(seed)
  V = 6
  theta = rng.normal(size=V) * 1.5
  theta_ref = rng.normal(size=V) * 1.5
  p_ref = np_softmax(theta_ref)
  logp_ref = jnp.asarray(np.log(p_ref), jnp.float32)

  def expected_grad(k):
    def surrogate(th):
      logp = jax.nn.log_softmax(th)
      return jnp.sum(jax.lax.stop_gradient(jnp.exp(logp)) * k(logp, logp_ref))
    return np.asarray(jit_grad(surrogate, jnp.asarray(theta, jnp.float32)), np.float64)

  grad_fwd = np_fd_grad(lambda th: np_kl(np_softmax(th), p_ref), theta)     # ∇ KL(π‖π_ref)
  grad_rev = np_fd_grad(lambda th: np_kl(p_ref, np_softmax(th)), theta)     # ∇ KL(π_ref‖π)
  assert np.linalg.norm(grad_fwd - grad_rev) > 0.05  # the two claims are distinguishable here
  np.testing.assert_allclose(expected_grad(losses.kl_k3), grad_rev, atol=2e-5)
  np.testing.assert_allclose(expected_grad(losses.kl_k2), grad_fwd, atol=2e-5)
  np.testing.assert_allclose(expected_grad(losses.kl_k1), np.zeros(V), atol=2e-6)
  # And the value claims: E_π[k1] = E_π[k3] = KL(π‖π_ref).
  p = np_softmax(theta)
  d = np.log(p_ref) - np.log(p)
  np.testing.assert_allclose(np.sum(p * (-d)), np_kl(p, p_ref), rtol=1e-10)
  np.testing.assert_allclose(np.sum(p * (np.exp(d) - d - 1)), np_kl(p, p_ref), rtol=1e-10)


def test_kl_estimate_rejects_unknown():
  with pytest.raises(ValueError, match="kl_estimator"):
    losses.kl_estimate("k4", jnp.zeros(2), jnp.zeros(2))


# ---------------------------------------------------------------- aggregation


def np_aggregate(x, m, mode, norm_len=None):
  x = np.where(m > 0, x, 0.0).astype(np.float64)
  if mode == "token_mean":
    return x.sum() / max(m.sum(), 1)
  if mode == "seq_mean_token_mean":
    return np.mean([x[i].sum() / max(m[i].sum(), 1) for i in range(len(x))])
  if mode == "seq_mean_token_sum":
    return np.mean([x[i].sum() for i in range(len(x))])
  return np.mean([x[i].sum() / norm_len for i in range(len(x))])


def np_agg_weights(m, mode, norm_len):
  """Each valid token's weight in the aggregate (every mode is linear in the per-token values)."""
  n_rows, lengths = m.shape[0], m.sum(1, keepdims=True)
  w = {"token_mean": np.full(m.shape, 1.0 / max(m.sum(), 1)),
       "seq_mean_token_mean": np.broadcast_to(1.0 / (np.maximum(lengths, 1) * n_rows), m.shape),
       "seq_mean_token_sum": np.full(m.shape, 1.0 / n_rows),
       "seq_mean_token_sum_norm": np.full(m.shape, 1.0 / (norm_len * n_rows))}[mode]
  return np.where(m > 0, w, 0.0)


def test_aggregate_hand_values():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0], [7.0, 7.0, 7.0]])
  m = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
  # rows: mean 2, mean 4, empty 0 -> 6/3; tokens: (1+2+3+4)/4; sums 6, 4, 0 over norm_len 4 -> (1.5+1)/3.
  assert float(jit_call(losses.aggregate, x, m, "seq_mean_token_mean")) == pytest.approx(2.0)
  assert float(jit_call(losses.aggregate, x, m, "token_mean")) == pytest.approx(2.5)
  assert float(jit_call(losses.aggregate, x, m, "seq_mean_token_sum_norm", norm_len=4)) == pytest.approx(2.5 / 3)
  # verl's seq-mean-token-sum: sums 6, 4, 0 (the empty row counts, as in torch.mean) -> 10/3
  assert float(jit_call(losses.aggregate, x, m, "seq_mean_token_sum")) == pytest.approx(10 / 3)
  assert float(jit_call(losses.aggregate, x, np.zeros((3, 3), np.int32), "token_mean")) == 0.0


def test_aggregation_modes_are_the_ones_validation_accepts():
  from grpo_jax.run import validate
  assert validate.LOSS_AGG == losses.AGG_MODES


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_aggregate_matches_numpy(mode):
  x = RNG.normal(size=(5, 7)).astype(np.float32)
  m = ragged_mask([7, 0, 3, 1, 5], 7)
  got = float(jit_call(losses.aggregate, jnp.asarray(x), jnp.asarray(m), mode, norm_len=7))
  assert got == pytest.approx(np_aggregate(x, m, mode, 7), rel=1e-5)


def test_aggregate_bad_args():
  with pytest.raises(ValueError, match="loss_agg"):
    losses.aggregate(jnp.zeros((1, 1)), jnp.ones((1, 1)), "sum")
  with pytest.raises(ValueError, match="norm_len"):
    losses.aggregate(jnp.zeros((1, 1)), jnp.ones((1, 1)), "seq_mean_token_sum_norm")


# ---------------------------------------------------------------- clipped surrogate


def test_clipped_surrogate_hand():
  ratio = np.array([[0.5, 0.5, 1.5, 1.5, 1.1, 0.0]], np.float32)
  a = np.array([[-1.0, 1.0, 1.0, -1.0, 2.0, 9.0]], np.float32)
  m = np.array([[1, 1, 1, 1, 1, 0]], np.float32)
  obj, aux = jit_call(losses.clipped_surrogate, jnp.asarray(np.log(np.maximum(ratio, 1e-30))), np.zeros((1, 6)),
                      jnp.asarray(a), jnp.asarray(m), eps_low=0.2, eps_high=0.28)
  # min(ρA, clip(ρ, 0.8, 1.28)A): -0.8 (clipped low), 0.5, 1.28 (clipped high), -1.5, 2.2, padding 0.
  np.testing.assert_allclose(np.asarray(obj), [[-0.8, 0.5, 1.28, -1.5, 2.2, 0.0]], rtol=1e-6)
  assert float(aux["clip_frac_low"]) == pytest.approx(0.2)
  assert float(aux["clip_frac_high"]) == pytest.approx(0.2)
  assert float(aux["ratio_mean"]) == pytest.approx(5.1 / 5, rel=1e-6)
  assert float(aux["ratio_max"]) == pytest.approx(1.5) and float(aux["ratio_min"]) == pytest.approx(0.5)


def test_ratio_one_gives_advantage():
  lp = jnp.asarray(RNG.normal(size=(3, 4)), jnp.float32)
  a = jnp.asarray(RNG.normal(size=(3, 4)), jnp.float32)
  obj, aux = jit_call(losses.clipped_surrogate, lp, lp, a, np.ones((3, 4)), eps_low=0.2, eps_high=0.2)
  assert np.array_equal(np.asarray(obj), np.asarray(a))
  assert float(aux["clip_frac_low"]) == 0.0 and float(aux["clip_frac_high"]) == 0.0


@pytest.mark.parametrize("objective,ratio_level", [("clip", "token"), ("clip", "sequence"), ("cispo", "token"),
                                                   ("sapo", "token")])
def test_a_log_ratio_past_float32_gives_a_finite_loss_and_gradient(objective, ratio_level):
  """A token with log ρ = ±100 (ρ = inf / 0 in float32) in a group of equal rewards (A = 0) and beside A ≠ 0:
  the loss and its gradient stay finite (ρ·A with ρ = inf and A = 0 was a NaN, and SAPO's gate gradient σ'·ρ one
  for any A), and equal the loss with that token's log-ratio held at ±MAX_LOG_RATIO, where it gets no gradient
  (but CISPO's, whose weight is clipped, not its gradient)."""
  old = np.zeros((2, 4), np.float32)
  lp = jnp.asarray([[100.0, -0.1, 0.2, 0.0], [-100.0, 0.05, 100.0, 0.3]], jnp.float32)
  held = np.clip(np.asarray(lp), -losses.MAX_LOG_RATIO, losses.MAX_LOG_RATIO)
  a = jnp.asarray([[0.0, 0.0, 0.0, 0.0], [-1.0, 1.0, 0.5, -0.5]], jnp.float32)
  m = np.ones((2, 4), np.float32)
  f = lambda x: losses.policy_loss(x, old, None, a, m, eps_low=0.2, eps_high=0.28, beta=0.0, objective=objective,
                                   ratio_level=ratio_level)[0]
  loss, g = jax.jit(jax.value_and_grad(f))(lp)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
  assert float(loss) == pytest.approx(float(jax.jit(f)(held)), rel=1e-6)
  if ratio_level == "token":
    out = np.abs(np.asarray(lp)) > losses.MAX_LOG_RATIO
    if objective == "cispo":  # its clipped weight is a constant: every token keeps sg(r̂)·A·∇log π
      np.testing.assert_allclose(np.asarray(g), np.asarray(jit_grad(f, held)), rtol=1e-6)
    else:
      assert np.all(np.asarray(g)[out] == 0.0)
      np.testing.assert_allclose(np.asarray(g)[~out], np.asarray(jit_grad(f, held))[~out], rtol=1e-6)


def test_gspo_answer_past_the_held_log_ratio_gets_no_gradient():
  """GSPO's sequence log-ratio is clamped at ±MAX_LOG_RATIO like a token's, and an answer held there gets no gradient,
  as a token does (test above). GSPO-token's per-token path sg(s_i)·π/sg(π) carried the held s_i = e^20 into every
  token's gradient instead: with A < 0 and the dual clip off, −s_i·A/(|y|·N) = 8.1e7 on each token here. The
  other answer, inside the clip range, keeps its gradient −s·A/(|y|·N)."""
  old = jnp.asarray([[-30.0] * 3, [-1.0] * 3], jnp.float32)
  lp = jnp.asarray([[-5.0] * 3, [-1.0 + 1e-4] * 3], jnp.float32)  # log s = 25 (held at 20) and 1e-4
  a = np.full((2, 3), -1.0, np.float32)
  f = lambda x: losses.policy_loss(x, old, None, a, jnp.ones((2, 3)), eps_low=3e-4, eps_high=4e-4, beta=0.0,
                                   ratio_level="sequence", dual_clip=0.0)[0]
  loss, g = jax.jit(jax.value_and_grad(f))(lp)
  assert float(loss) == pytest.approx((np.exp(20.0) + np.exp(1e-4)) / 2, rel=1e-5)  # −mean(s·A): held, not dropped
  assert np.all(np.asarray(g)[0] == 0.0)
  np.testing.assert_allclose(np.asarray(g)[1], np.exp(1e-4) / 6, rtol=1e-5)


def test_surrogate_ignores_padding_garbage():
  m = jnp.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
  junk = jnp.array([[-0.1, -0.2, jnp.nan], [jnp.inf, -jnp.inf, 1e30]])
  f = lambda lp: losses.policy_loss(lp, junk, junk, junk, m, eps_low=0.2, eps_high=0.2, beta=0.1)[0]
  loss, g = jax.jit(jax.value_and_grad(f))(jnp.array([[-0.1, -0.3, 500.0], [jnp.nan, 0.0, 1e30]]))
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(g)))
  assert np.all(np.asarray(g)[m == 0] == 0)


# ---------------------------------------------------------------- policy loss


def np_policy_loss(lp, old, ref, a, m, eps_low, eps_high, beta, est, agg, norm_len, dual_clip=0.0, kl_clamp=0.0):
  """verl's formulas (compute_policy_loss_vanilla with clip_ratio_c, kl_penalty low_var_kl clamped at ±kl_clamp)
  written out in NumPy, independently of losses.py."""
  lp, old, ref, a = (x.astype(np.float64) for x in (lp, old, ref, a))
  rho = np.exp(lp - old)
  pg1, pg2 = -a * rho, -a * np.clip(rho, 1 - eps_low, 1 + eps_high)
  clip1 = np.maximum(pg1, pg2)  # the PPO loss
  pg_loss = np.where(a < 0, np.minimum(-a * dual_clip, clip1), clip1) if dual_clip > 1 else clip1
  d = ref - lp
  kl = {"k1": -d, "k2": 0.5 * d**2, "k3": np.exp(d) - d - 1}[est]
  if est == "k3" and kl_clamp > 0:
    kl = np.clip(kl, -kl_clamp, kl_clamp)
  valid = m > 0
  metrics = {"kl": kl[valid].mean(),
             "clip_frac_low": np.mean(((rho < 1 - eps_low) & (a < 0))[valid]),
             "clip_frac_high": np.mean(((rho > 1 + eps_high) & (a > 0))[valid]),
             "clip_frac_dual": np.mean(((rho > dual_clip) & (a < 0) & (dual_clip > 1))[valid]),
             "ratio_mean": rho[valid].mean(), "ratio_max": rho[valid].max(), "ratio_min": rho[valid].min()}
  return np_aggregate(pg_loss + beta * kl, m, agg, norm_len), metrics


@pytest.fixture(scope="module")
def loss_and_grad():
  def f(lp, old, ref, a, m, est, agg, dual_clip=0.0, kl_clamp=0.0):
    return losses.policy_loss(lp, old, ref, a, m, eps_low=0.2, eps_high=0.28, beta=0.04, kl_estimator=est, agg=agg,
                              norm_len=8, dual_clip=dual_clip, kl_clamp=kl_clamp)
  return jax.jit(jax.value_and_grad(f, has_aux=True), static_argnums=(5, 6))


@pytest.mark.parametrize("est,agg", [("k3", "seq_mean_token_mean"), ("k1", "token_mean"),
                                     ("k2", "seq_mean_token_sum_norm")])
def test_policy_loss_matches_numpy(loss_and_grad, est, agg):
  N, L = 6, 8
  m = ragged_mask([8, 2, 5, 0, 1, 7], L)
  lp = RNG.uniform(-4, 0, size=(N, L)).astype(np.float32)
  old = (lp + RNG.normal(size=(N, L)) * 0.3).astype(np.float32)
  ref = (lp + RNG.normal(size=(N, L)) * 0.5).astype(np.float32)
  a = RNG.normal(size=(N, L)).astype(np.float32)
  (loss, metrics), _ = loss_and_grad(lp, old, ref, a, m, est, agg)
  want, want_metrics = np_policy_loss(lp, old, ref, a, m, 0.2, 0.28, 0.04, est, agg, 8)
  assert float(loss) == pytest.approx(want, rel=1e-5, abs=1e-6)
  for k, v in want_metrics.items():
    assert float(metrics[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k
  assert 0 < want_metrics["clip_frac_low"] + want_metrics["clip_frac_high"] < 1  # both branches exercised


def test_policy_loss_with_guards_matches_numpy(loss_and_grad):
  """Dual clip 3 and k3 clamp 10 (verl's defaults) on data where both bind on some tokens and not on others."""
  N, L = 6, 8
  rng = np.random.default_rng(1)
  m = ragged_mask([8, 2, 5, 0, 1, 7], L)
  lp = rng.uniform(-4, 0, size=(N, L)).astype(np.float32)
  old = (lp - rng.normal(size=(N, L)) * 2.0).astype(np.float32)   # ratios above 3 where log ρ > 1.1
  ref = (lp + rng.normal(size=(N, L)) * 2.0).astype(np.float32)   # k3 beyond 10 where Δ > 2.6
  a = rng.normal(size=(N, L)).astype(np.float32)
  for agg in ("token_mean", "seq_mean_token_mean"):
    (loss, metrics), _ = loss_and_grad(lp, old, ref, a, m, "k3", agg, 3.0, 10.0)
    want, want_metrics = np_policy_loss(lp, old, ref, a, m, 0.2, 0.28, 0.04, "k3", agg, 8, 3.0, 10.0)
    assert float(loss) == pytest.approx(want, rel=1e-5, abs=1e-6), agg
    for k, v in want_metrics.items():
      assert float(metrics[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k
  assert 0 < want_metrics["clip_frac_dual"] < 1
  hit = np.mean((np.exp(ref.astype(np.float64) - lp) - (ref - lp) - 1 > 10)[m > 0])
  assert 0 < hit < 1 and float(metrics["kl_clamp_frac"]) == pytest.approx(hit)


# ---------------------------------------------------------------- guards at their boundaries (value and gradient)

K3_AT_10 = 2.6108686  # the Δ = log π_ref − log π > 0 where e^Δ − Δ − 1 = 10 (bisection below checks it)


def test_k3_clamp_boundaries_value_and_gradient():
  lo, hi = 2.0, 3.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if np.expm1(mid) - mid < 10 else (lo, mid)
  assert abs(lo - K3_AT_10) < 1e-6
  k3 = lambda d: np.expm1(d) - d
  # Δ just inside the clamp keeps k3 and its gradient 1 − e^Δ; just beyond, k3 = 10 and no gradient. The far side
  # (π ≫ π_ref, Δ ≈ −11) is clamped too, as verl does.
  cases = [(K3_AT_10 - 1e-3, k3(K3_AT_10 - 1e-3), 1 - np.exp(K3_AT_10 - 1e-3)),
           (K3_AT_10 + 1e-3, 10.0, 0.0),
           (-10.5, k3(-10.5), 1 - np.exp(-10.5)),
           (-11.5, 10.0, 0.0),
           (0.0, 0.0, 0.0)]
  traces = []

  def k3(lp, ref, c):
    traces.append(1)
    return losses.kl_k3(lp, ref, c)
  f = jax.jit(jax.vmap(jax.value_and_grad(k3), in_axes=(0, 0, None)))
  lp = jnp.full((len(cases),), -1.0, jnp.float32)
  ref = lp + jnp.asarray([d for d, _, _ in cases], jnp.float32)
  v, g = f(lp, ref, 10.0)
  np.testing.assert_allclose(np.asarray(v), [c[1] for c in cases], rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(g), [c[2] for c in cases], rtol=2e-4, atol=1e-6)
  # Off (clamp 0): Δ = 5 keeps e^5 − 6 and its gradient 1 − e^5; the clamp value is traced (one compile).
  v, g = f(lp, lp + 5.0, 0.0)
  assert float(v[0]) == pytest.approx(np.expm1(5.0) - 5.0, rel=1e-5)
  assert float(g[0]) == pytest.approx(1 - np.exp(5.0), rel=1e-5)
  assert len(traces) == 1


def test_dual_clip_boundaries_value_and_gradient():
  """One token, A = −1: the loss −ρA grows with ρ until the dual clip c = 3 bounds it at c·|A| with no gradient;
  ρ = e^1.5 ≈ 4.48 gives 4.48 without it and 3.0 with it (verl's clip_ratio_c). A > 0 and ρ < 1 − ε unaffected."""
  traces = []

  def loss(log_rho, a, c):
    traces.append(1)
    return losses.policy_loss(jnp.reshape(log_rho, (1, 1)), jnp.zeros((1, 1)), None, jnp.reshape(a, (1, 1)),
                              jnp.ones((1, 1)), eps_low=0.2, eps_high=0.2, beta=0.0, dual_clip=c)[0]
  vg = jax.jit(jax.value_and_grad(loss))
  cases = [  # (log ρ, A, c, loss, d loss / d log ρ)
      (1.5, -1.0, 0.0, np.exp(1.5), np.exp(1.5)),        # off: unbounded, gradient ρ|A|
      (1.5, -1.0, 3.0, 3.0, 0.0),                        # on, beyond c: bounded, no gradient
      (np.log(2.9), -1.0, 3.0, 2.9, 2.9),                # on, just inside c: PPO's loss and gradient
      (np.log(3.1), -1.0, 3.0, 3.0, 0.0),                # on, just beyond c
      (np.log(3.1), -2.0, 3.0, 6.0, 0.0),                # bound scales with |A|
      (1.5, 1.0, 3.0, -1.2, 0.0),                        # A > 0: clipped at 1 + ε as PPO, dual clip irrelevant
      (np.log(0.5), -1.0, 3.0, 0.8, 0.0),                # A < 0, ρ < 1 − ε: PPO's low clip, unchanged
      (np.log(0.9), -1.0, 3.0, 0.9, 0.9),                # inside [1 − ε, 1 + ε]: plain −ρA
  ]
  for log_rho, a, c, want_v, want_g in cases:
    v, g = vg(jnp.float32(log_rho), jnp.float32(a), jnp.float32(c))
    assert float(v) == pytest.approx(want_v, rel=1e-5), (log_rho, a, c)
    assert float(g) == pytest.approx(want_g, rel=1e-5, abs=1e-7), (log_rho, a, c)
  assert len(traces) == 1  # c is traced: one program for every value, 0 (off) included
  _, aux = jit_call(losses.clipped_surrogate, np.log(np.array([[4.0, 4.0, 2.0, 4.0]], np.float32)), np.zeros((1, 4)),
                    jnp.array([[-1.0, 1.0, -1.0, -1.0]]), jnp.array([[1.0, 1.0, 1.0, 0.0]]),
                    eps_low=0.2, eps_high=0.2, dual_clip=3.0)
  assert float(aux["clip_frac_dual"]) == pytest.approx(1 / 3)  # only ρ=4 with A<0 among the 3 valid tokens


def test_guards_vmap_over_values_equals_separate_calls():
  """dual_clip, kl_clamp, eps_low/high and β enter only through arithmetic: a vmapped sweep over them equals
  separate calls (what a sweep over these knobs needs)."""
  N, L = 3, 4
  m = ragged_mask([4, 2, 3], L)
  lp = RNG.uniform(-3, 0, size=(N, L)).astype(np.float32)
  old = lp - (RNG.normal(size=(N, L)) * 1.5).astype(np.float32)  # NumPy: no eager (compiled) jnp ops
  ref = lp + (RNG.normal(size=(N, L)) * 2.5).astype(np.float32)
  a = jnp.asarray(RNG.normal(size=(N, L)), jnp.float32)
  hp = {"dual_clip": np.float32([0.0, 2.0, 3.0]), "kl_clamp": np.float32([0.0, 10.0, 1.0]),
        "eps_low": np.float32([0.2, 0.1, 3e-4]), "eps_high": np.float32([0.28, 0.2, 4e-4]),
        "beta": np.float32([0.04, 0.0, 0.1])}

  def f(h):
    return jax.value_and_grad(lambda x: losses.policy_loss(x, old, ref, a, m, **h)[0])(lp)
  v, g = jax.device_get(jax.jit(jax.vmap(f))(hp))
  for i in range(3):
    vi, gi = jit_call(f, {k: float(x[i]) for k, x in hp.items()})  # Python floats, closed over as in an eager call
    assert float(v[i]) == pytest.approx(float(vi), rel=1e-6)
    np.testing.assert_allclose(np.asarray(g[i]), np.asarray(gi), rtol=1e-5, atol=1e-7)
  assert len({round(float(x), 5) for x in v}) == 3


def gspo_objective(logp_NxL, old_logp_NxL, adv_N, mask_NxL, *, eps_low, eps_high, dual_clip=0.0):
  """GSPO at the sequence level as its paper writes it, the reference the production GSPO-token (losses.policy_loss
  with ratio_level='sequence') is checked against: s_i = exp(mean over valid tokens of log π − log π_old), per
  sequence min(s_i A_i, clip(s_i, 1−eps_low, 1+eps_high) A_i); 0 for empty rows. Reduce with a mean over rows."""
  nonempty_N = jnp.any(losses._valid(mask_NxL), axis=1)  # pylint: disable=protected-access
  s_N = jnp.exp(losses._sequence_log_ratio(logp_NxL, old_logp_NxL, mask_NxL))  # pylint: disable=protected-access
  a_N = jnp.where(nonempty_N, adv_N.astype(jnp.float32), 0.0)
  obj_N = losses._clipped(s_N, a_N, eps_low, eps_high, dual_clip)  # pylint: disable=protected-access
  seq_mask_N = nonempty_N.astype(jnp.float32)
  stats = losses._clip_stats(jax.lax.stop_gradient(s_N), a_N, seq_mask_N, eps_low, eps_high, dual_clip)  # pylint: disable=protected-access
  return jnp.where(nonempty_N, obj_N, 0.0), stats


def test_gspo_dual_clip_bounds_the_sequence_ratio():
  # One sequence of two tokens, log-ratios 1.2 and 1.8: s = e^1.5 ≈ 4.48, A = −1, GSPO's ε: loss 4.48 → 3.
  lp = jnp.array([[1.2, 1.8]])
  kw = dict(eps_low=3e-4, eps_high=4e-4)
  obj, aux = jit_call(gspo_objective, lp, np.zeros((1, 2)), np.array([-1.0]), np.ones((1, 2)), **kw)
  assert float(np.asarray(obj)[0]) == pytest.approx(-np.exp(1.5), rel=1e-6)
  obj, aux = jit_call(gspo_objective, lp, np.zeros((1, 2)), np.array([-1.0]), np.ones((1, 2)), dual_clip=3.0, **kw)
  assert float(np.asarray(obj)[0]) == pytest.approx(-3.0) and float(aux["clip_frac_dual"]) == 1.0
  g = jit_grad(lambda x: losses.policy_loss(x, jnp.zeros((1, 2)), None, -jnp.ones((1, 2)), jnp.ones((1, 2)),
                                            beta=0.0, ratio_level="sequence", dual_clip=3.0, **kw)[0], lp)
  assert np.all(np.asarray(g) == 0)


def test_policy_loss_hand_tiny():
  # One token, ρ = e^0.1 ≈ 1.105 (inside 1 ± 0.2), A = 2, Δ = ref − lp = -0.5 -> k3 = e^-0.5 + 0.5 - 1.
  f = jax.jit(losses.policy_loss, static_argnames=("eps_low", "eps_high", "beta"))
  loss, metrics = f(jnp.array([[-1.0]]), jnp.array([[-1.1]]), jnp.array([[-1.5]]), jnp.array([[2.0]]),
                    jnp.array([[1.0]]), eps_low=0.2, eps_high=0.2, beta=0.1)
  k3 = np.exp(-0.5) - 0.5
  assert float(loss) == pytest.approx(-(np.exp(0.1) * 2 - 0.1 * k3), rel=1e-6)
  assert float(metrics["kl"]) == pytest.approx(k3, rel=1e-6)


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean"])
def test_policy_loss_gradient_on_policy(loss_and_grad, agg):
  """At logp == old_logp: ∂loss/∂logp_{i,t} = −(A − β(1 − e^{ref−logp})) · weight, weight 1/(|o_i| N) for GRPO."""
  N, L = 4, 5
  lengths = np.array([5, 2, 0, 3])
  m = ragged_mask(lengths, L)
  lp = RNG.uniform(-3, 0, size=(N, L)).astype(np.float32)
  ref = (lp + RNG.normal(size=(N, L)) * 0.5).astype(np.float32)
  a = RNG.normal(size=(N, L)).astype(np.float32)
  (_, metrics), g = loss_and_grad(lp, lp, ref, a, m, "k3", agg)
  if agg == "seq_mean_token_mean":
    weight = 1.0 / (np.maximum(lengths, 1)[:, None] * N)
  else:
    weight = np.full((N, 1), 1.0 / lengths.sum())
  dk3 = 1.0 - np.exp(ref.astype(np.float64) - lp)
  want = np.where(m > 0, -(a - 0.04 * dk3) * weight, 0.0)
  np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-7)
  assert float(metrics["ratio_mean"]) == 1.0


def test_policy_loss_without_reference():
  lp = np.zeros((1, 2), np.float32)
  loss, metrics = jit_call(losses.policy_loss, lp, lp, None, np.ones((1, 2)), np.ones((1, 2)), eps_low=0.2,
                           eps_high=0.2, beta=0.0)
  assert float(loss) == -1.0 and "kl" not in metrics
  with pytest.raises(ValueError, match="ref_logp"):
    losses.policy_loss(lp, lp, None, jnp.ones((1, 2)), jnp.ones((1, 2)), eps_low=0.2, eps_high=0.2, beta=0.1)


# ---------------------------------------------------------------- entropy bonus (rl.entropy_coef)


def _log_softmax_np(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("agg", losses.AGG_MODES)
def test_entropy_bonus_hand(agg):
  """H of uniform logits over 4 tokens is ln 4; of p = (1/2, 1/4, 1/4) it is 1.5 ln 2. A = 0 (no policy term), rows
  [ln 4, 1.5 ln 2] and [ln 4, padding]: loss = −0.1·agg(H), i.e. token_mean −0.1·5.5 ln2/3, seq_mean_token_mean
  −0.1·(1.75 + 2) ln2/2, seq_mean_token_sum −0.1·(3.5 + 2) ln2/2, seq_mean_token_sum_norm (L_max 4) the last / 4."""
  z = np.log(np.array([[[1.0, 1, 1, 1], [2, 1, 1, 1e-30]], [[1, 1, 1, 1], [9, 0.1, 3, 1]]]))
  lp_V = _log_softmax_np(z)  # the inputs in NumPy: no eager (compiled) jnp ops
  ent = -np.sum(np.exp(lp_V) * lp_V, -1)
  ln2 = np.log(2.0)
  assert float(ent[0, 0]) == pytest.approx(2 * ln2, rel=1e-6) and float(ent[0, 1]) == pytest.approx(1.5 * ln2, 1e-6)
  m = np.array([[1.0, 1.0], [1.0, 0.0]])
  lp = lp_V[..., 0]
  loss, _ = jit_call(losses.policy_loss, lp, lp, None, np.zeros((2, 2)), m, eps_low=0.2, eps_high=0.2, beta=0.0,
                     agg=agg, norm_len=4, ent_NxL=np.where([[True, True], [True, False]], ent, np.nan),
                     entropy_coef=0.1)
  want = {"token_mean": 5.5 / 3, "seq_mean_token_mean": 3.75 / 2, "seq_mean_token_sum": 5.5 / 2,
          "seq_mean_token_sum_norm": 5.5 / 8}[agg]
  assert float(loss) == pytest.approx(-0.1 * want * ln2, rel=1e-6)


@pytest.mark.parametrize("agg", losses.AGG_MODES)
def test_entropy_bonus_loss_and_gradient_match_numpy(agg):
  """loss = −agg(A·ρ + c·H) on-policy (ρ = 1), differentiated w.r.t. the LOGITS z through both log π(y) and the
  entropy H = −Σ_v p_v log p_v, against NumPy's closed form ∂/∂z = −w_t·(A·(onehot(y) − p) − c·p·(log p + H)),
  w_t each token's weight in the aggregation. Ragged rows, an empty row, NaN advantages on padding."""
  rng = np.random.default_rng(3)
  N, L, V, c = 4, 5, 6, 0.3
  m = ragged_mask([5, 2, 0, 3], L)
  z = rng.normal(size=(N, L, V)) * 1.5
  y = rng.integers(0, V, (N, L))
  a = np.where(m > 0, rng.normal(size=(N, L)), np.nan)

  def f(z_NxLxV):
    lp_NxLxV = jax.nn.log_softmax(z_NxLxV, -1)
    lp_NxL = jnp.take_along_axis(lp_NxLxV, jnp.asarray(y)[..., None], -1)[..., 0]
    ent_NxL = -jnp.sum(jnp.exp(lp_NxLxV) * lp_NxLxV, -1)
    return losses.policy_loss(lp_NxL, jax.lax.stop_gradient(lp_NxL), None, jnp.asarray(a, jnp.float32),
                              jnp.asarray(m), eps_low=0.2, eps_high=0.28, beta=0.0, agg=agg, norm_len=8,
                              ent_NxL=ent_NxL, entropy_coef=c)[0]
  loss, g = jax.jit(jax.value_and_grad(f))(jnp.asarray(z, jnp.float32))
  lp = _log_softmax_np(z)
  p = np.exp(lp)
  H = -(p * lp).sum(-1)
  w = np_agg_weights(m, agg, 8)
  a0 = np.where(m > 0, a, 0.0)
  assert float(loss) == pytest.approx(-np.sum(w * (a0 + c * H)), rel=1e-5)
  onehot = np.eye(V)[y]
  want = -w[..., None] * (a0[..., None] * (onehot - p) - c * p * (lp + H[..., None]))
  np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=1e-7)


def test_entropy_coef_zero_adds_nothing_to_the_program():
  """entropy_coef = 0 (the default) traces the same program as a call with no entropies at all: the step without
  the bonus is today's step exactly (tests/test_goldens.py pins its numbers). A positive coef does change it."""
  N, L = 3, 4
  args = [jnp.asarray(RNG.normal(size=(N, L)), jnp.float32) for _ in range(4)]
  args.append(jnp.asarray(ragged_mask([4, 1, 2], L)))
  ent = jnp.asarray(RNG.uniform(0, 2, size=(N, L)), jnp.float32)
  kw = dict(eps_low=0.2, eps_high=0.28, beta=0.04, agg="seq_mean_token_mean")
  jaxpr = lambda **k: str(jax.make_jaxpr(lambda *a: losses.policy_loss(*a, **kw, **k))(*args))
  assert jaxpr(ent_NxL=ent, entropy_coef=0.0) == jaxpr()
  assert jaxpr(ent_NxL=ent, entropy_coef=0.01) != jaxpr()
  with pytest.raises(ValueError, match="needs the policy's entropies"):
    losses.policy_loss(*args, **kw, entropy_coef=0.01)


# ---------------------------------------------------------------- GSPO


def test_gspo_hand():
  # Row 0: log-ratios 0.2, 0.0 -> s = e^0.1; row 1 (A<0): log-ratios -0.4 -> s = e^-0.4 < 0.8, clipped low; row 2
  # empty. Clip range 1 ± 0.2.
  lp = jnp.array([[0.2, 0.0], [-0.4, 5.0], [3.0, 3.0]])
  m = jnp.array([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
  obj, aux = jax.jit(gspo_objective, static_argnames=("eps_low", "eps_high"))(lp, jnp.zeros((3, 2)), jnp.array([1.0, -1.0, 4.0]), m, eps_low=0.2,
                                   eps_high=0.2)
  np.testing.assert_allclose(np.asarray(obj), [np.exp(0.1), -0.8, 0.0], rtol=1e-6)
  assert float(aux["clip_frac_low"]) == pytest.approx(0.5)
  assert float(aux["clip_frac_high"]) == 0.0


def test_gspo_token_gradient_equals_sequence_gradient():
  N, L = 5, 6
  m = jnp.asarray(ragged_mask([6, 3, 1, 0, 4], L))
  lp = jnp.asarray(RNG.uniform(-3, 0, size=(N, L)), jnp.float32)
  # Sequence log-ratios ≈ shift: rows 0 (A>0) and 1 (A<0) land outside 1 ± 0.01, rows 2 and 4 inside.
  shift = np.array([0.05, -0.05, 0.002, 0.0, -0.003])[:, None]
  old = lp - jnp.asarray(shift + RNG.normal(size=(N, L)) * 1e-4, jnp.float32)
  a_N = jnp.array([1.0, -1.0, 0.5, 2.0, -0.7])
  kw = dict(eps_low=0.01, eps_high=0.01)
  seq = lambda x: jnp.mean(gspo_objective(x, old, a_N, m, **kw)[0])
  tok = lambda x: losses.aggregate(losses.gspo_token_objective(x, old, a_N[:, None] * m, m, **kw)[0], m,
                                   "seq_mean_token_mean")
  assert float(jax.jit(seq)(lp)) == pytest.approx(float(jax.jit(tok)(lp)), rel=1e-5)
  g_seq, g_tok = np.asarray(jax.jit(jax.grad(seq))(lp)), np.asarray(jax.jit(jax.grad(tok))(lp))
  np.testing.assert_allclose(g_tok, g_seq, rtol=1e-5, atol=1e-7)
  # Some sequences are clipped (zero gradient), others not: the test exercises both.
  np.testing.assert_array_equal(np.any(g_seq != 0, axis=1), [False, False, True, False, True])
  # And the sequence-level policy_loss path gives the same gradient (β = 0).
  pl = lambda x: -losses.policy_loss(x, old, None, a_N[:, None] * m, m, beta=0.0, ratio_level="sequence", **kw)[0]
  np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(pl))(lp)), g_seq, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- value loss


def test_value_loss_hand_and_numpy():
  v = jnp.array([[1.0, 0.0, 2.0]])
  old = jnp.array([[0.5, 0.0, 0.0]])
  ret = jnp.array([[0.0, 1.0, 0.0]])
  m = jnp.array([[1.0, 1.0, 0.0]])
  vl = jax.jit(losses.value_loss, static_argnames=("clip", "agg"))
  loss, aux = vl(v, old, ret, m, clip=0.2, agg="token_mean")
  # token 0: unclipped (1)^2 = 1, clipped 0.7^2 = 0.49 -> 1; token 1: 1 and 1 -> 1; mean of ½·[1, 1].
  assert float(loss) == pytest.approx(0.5)
  assert float(aux["value_clip_frac"]) == 0.0
  loss, aux = vl(jnp.array([[0.0]]), jnp.array([[-0.5]]), jnp.array([[1.0]]), jnp.ones((1, 1)), clip=0.2,
                 agg="token_mean")
  # V moved 0.5 towards... clipped V = -0.3: errors 1 and 1.69 -> ½·1.69.
  assert float(loss) == pytest.approx(0.845) and float(aux["value_clip_frac"]) == 1.0

  N, L = 4, 6
  mk = ragged_mask([6, 0, 2, 5], L)
  vv, oo, rr = (RNG.normal(size=(N, L)).astype(np.float32) for _ in range(3))
  vc = oo + np.clip(vv - oo, -0.3, 0.3)
  per = 0.5 * np.maximum((vv - rr) ** 2, (vc - rr) ** 2)
  got, _ = vl(vv, oo, rr, mk, clip=0.3, agg="seq_mean_token_mean")
  assert float(got) == pytest.approx(np_aggregate(per, mk, "seq_mean_token_mean"), rel=1e-5)
