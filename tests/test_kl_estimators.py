"""Table a's exact KL-estimator statistics against NumPy enumeration and jax.grad of the exact KLs."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.studies.ablations import kl_estimators as kle

# jitted, as the table runs it (make_measure): eagerly its ~100 ops compiled one by one, ~12 ms each
position_stats = jax.jit(kle.position_stats)


@pytest.fixture(scope="module")
def dists():
  rng = np.random.default_rng(0)
  X, V = 5, 7
  zp = rng.normal(size=(X, V)).astype(np.float32)
  zq = (zp + rng.normal(scale=0.7, size=(X, V))).astype(np.float32)
  x = rng.integers(0, V, X)
  valid = np.array([1, 1, 1, 0, 1], bool)
  return zp, zq, x, valid


def _np_logsoftmax(z):
  z = z.astype(np.float64)
  return z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)


@pytest.fixture(scope="module")
def stats(dists):
  """float64 NumPy log-probs of the fixture's distributions and position_stats of them (float32)."""
  zp, zq, x, valid = dists
  lp, lq = _np_logsoftmax(zp), _np_logsoftmax(zq)
  st = jax.device_get(position_stats(jnp.asarray(lp, jnp.float32), jnp.asarray(lq, jnp.float32),
                                         jnp.asarray(x), jnp.asarray(valid)))
  return lp, lq, st


def test_moments_match_numpy_enumeration(dists, stats):
  _, _, x, valid = dists
  lp, lq, st = stats
  p, d = np.exp(lp), lp - lq
  ks = [d, d**2 / 2, np.exp(-d) - 1 + d]
  kl = (p * d).sum(-1)
  assert st["n"] == valid.sum()
  np.testing.assert_allclose(st["kl"], kl[valid].sum(), rtol=1e-5)
  for i, k in enumerate(ks):
    m = (p * k).sum(-1)
    np.testing.assert_allclose(st["mean"][i], m[valid].sum(), rtol=1e-4)
    np.testing.assert_allclose(st["var"][i], ((p * k**2).sum(-1) - m**2)[valid].sum(), rtol=1e-4)
    np.testing.assert_allclose(st["sampled"][i], k[np.arange(len(x)), x][valid].sum(), rtol=1e-4)
  # k1 and k3 are unbiased estimators of KL(π‖π_ref); k2 is not.
  np.testing.assert_allclose(st["mean"][0], st["kl"], rtol=1e-5)
  np.testing.assert_allclose(st["mean"][2], st["kl"], rtol=1e-4)
  assert abs(st["mean"][1] - st["kl"]) > 1e-3
  assert st["min_k3_vocab"] >= 0.0


def test_expected_gradients_are_the_exact_kl_gradients(dists):
  """E g2 = ∇_z KL(π‖π_ref), E g3 = ∇_z KL(π_ref‖π), E g1 = 0 — checked against jax.grad and Monte-Carlo-free sums."""
  zp, zq, x, valid = dists
  lq = jax.nn.log_softmax(jnp.asarray(zq))

  def fwd_kl(z):
    lp = jax.nn.log_softmax(z)
    return jnp.sum(jnp.exp(lp) * (lp - lq))

  def rev_kl(z):
    return jnp.sum(jnp.exp(lq) * (lq - jax.nn.log_softmax(z)))

  zp = jnp.asarray(zp)
  g_fwd, g_rev = jax.jit(lambda z: (jax.grad(fwd_kl)(z), jax.grad(rev_kl)(z)))(zp)
  st = jax.device_get(position_stats(jax.nn.log_softmax(zp), lq, jnp.asarray(x), jnp.asarray(valid)))
  v = valid
  np.testing.assert_allclose(st["fwd_sq"], np.sum(np.asarray(g_fwd)[v] ** 2), rtol=1e-4)
  np.testing.assert_allclose(st["rev_sq"], np.sum(np.asarray(g_rev)[v] ** 2), rtol=1e-4)
  assert st["gerr_fwd"][1] < 1e-9 * max(1.0, st["fwd_sq"]) + 1e-10     # g2 hits ∇KL(π‖ref)
  assert st["gerr_rev"][2] < 1e-9 * max(1.0, st["rev_sq"]) + 1e-10     # g3 hits ∇KL(ref‖π)
  np.testing.assert_allclose(st["gerr_fwd"][0], st["fwd_sq"], rtol=1e-4)  # E g1 = 0: error = the whole gradient
  assert st["gerr_fwd"][2] > 1e-3 * st["fwd_sq"]                          # g3 is NOT the forward-KL gradient


def test_gradient_variance_matches_enumeration(dists, stats):
  valid = dists[3]
  lp, lq, st = stats
  p, d = np.exp(lp), lp - lq
  V = p.shape[-1]
  cs = [np.ones_like(d), d, 1 - np.exp(-d)]
  for i, c in enumerate(cs):
    total = 0.0
    for r in np.flatnonzero(valid):
      g_VxV = c[r][:, None] * (np.eye(V) - p[r][None, :])      # row x: the gradient when x is sampled
      mean = (p[r][:, None] * g_VxV).sum(0)
      total += (p[r] * ((g_VxV - mean) ** 2).sum(-1)).sum()
    np.testing.assert_allclose(st["gvar"][i], total, rtol=1e-3)


def test_identical_policies_give_zero_everywhere():
  """π = π_ref: KL 0 and every estimator 0 with zero variance."""
  lp = jax.nn.log_softmax(jnp.asarray(np.random.default_rng(1).normal(size=(3, 5)), jnp.float32))
  st = jax.device_get(position_stats(lp, lp, jnp.zeros(3, jnp.int32), jnp.ones(3, bool)))
  assert st["kl"] == pytest.approx(0.0, abs=1e-6)
  np.testing.assert_allclose(st["var"], 0.0, atol=1e-10)
  assert st["min_k3_vocab"] == pytest.approx(0.0, abs=1e-6)


def test_run_cell_on_a_tiny_training_run():
  """Table a's cell end to end: 2 seeds × 2 β=0 GRPO steps from the toy base; the policy has moved (KL > 0) and
  the exact moments still say k1 and k3 are unbiased."""
  c = config_lib.load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "ablations", "kl_estimators.py"),
                             "small")
  c.seeds, c.steps, c.eval_every, c.base_steps = 2, 2, 1, 20
  c.run = config_lib.override(c.run, {"model.hidden": 16, "model.inter": 32})
  cell = kle.run_cell(c, "lr=0.01", [0, 1])
  assert all(len(v) == 2 for v in cell["scalars"].values())
  assert min(cell["scalars"]["kl_exact"]) > 0
  assert max(abs(x) for x in cell["scalars"]["rel_bias_k1"] + cell["scalars"]["rel_bias_k3"]) < 1e-4
  assert cell["curves"]["kl_exact vs step"]["x"] == [1, 2]
