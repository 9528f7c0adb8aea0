"""Advantage estimators against hand-computed values and independent NumPy loops."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.rl import advantages as adv
from tests.jit_call import jit_call
from tests.jit_call import jit_grad

RNG = np.random.default_rng(0)


def ragged_mask(lengths, L):
  return (np.arange(L)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


# ---------------------------------------------------------------- group baselines


def np_grpo(r, eps, ddof):
  out = np.zeros_like(r, dtype=np.float64)
  for b in range(r.shape[0]):
    g = r[b].astype(np.float64)
    if g.max() == g.min():
      continue
    out[b] = (g - g.mean()) / (g.std(ddof=ddof) + eps)
  return out


def test_grpo_hand_values():
  r = jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
  a = np.asarray(jax.jit(lambda r: adv.grpo(r, std_eps=0.0, ddof=0))(r))
  # Group 0: mean 0.5, population std 0.5 -> ±1.
  np.testing.assert_allclose(a[0], [1, -1, -1, 1], rtol=1e-6)
  # Zero-variance groups are exactly 0, not NaN, even with eps = 0.
  assert np.all(a[1:] == 0.0)
  a1 = np.asarray(jit_call(adv.grpo, jnp.array([[1.0, 0.0, 0.0]]), std_eps=0.0, ddof=1))
  # mean 1/3, sample std sqrt(1/3) -> (2/3)/sqrt(1/3) = 2/sqrt(3).
  np.testing.assert_allclose(a1[0], [2 / np.sqrt(3), -1 / np.sqrt(3), -1 / np.sqrt(3)], rtol=1e-6)


def test_grpo_default_std_is_torch_std_plus_eps():
  """The default is what TRL, verl and OpenRLHF compute: torch.std (ddof=1), eps added to the std. Rewards [1, 0]:
  TRL's ±0.5/(0.7071 + 1e-4) = ±0.70700; the population std (ddof=0) gave ±0.9998, 41% larger; at G=8, √(8/7)."""
  a = np.asarray(jit_call(adv.grpo, jnp.array([[1.0, 0.0]])))
  np.testing.assert_allclose(a[0], [0.5 / (np.sqrt(0.5) + 1e-4), -0.5 / (np.sqrt(0.5) + 1e-4)], rtol=1e-6)
  assert a[0, 0] == pytest.approx(0.70700, abs=1e-5)
  assert float(np.asarray(jit_call(adv.grpo, jnp.array([[1.0, 0.0]]), ddof=0))[0, 0]) == pytest.approx(0.9998, abs=1e-4)
  r8 = jnp.array([[1.0, 0, 0, 1, 1, 0, 0, 0]])
  ratio = np.asarray(jit_call(adv.grpo, r8, std_eps=0.0, ddof=0)) / np.asarray(jit_call(adv.grpo, r8, std_eps=0.0))
  np.testing.assert_allclose(ratio, np.sqrt(8 / 7), rtol=1e-6)


def test_grpo_exact_zero_for_inexact_mean():
  # 0.1 * 3 / 3 != 0.1 in floating point; the result must still be exactly 0.
  a = np.asarray(jit_call(adv.grpo, np.full((1, 3), 0.1, np.float32), std_eps=1e-8, ddof=0))
  assert np.all(a == 0.0)


@pytest.mark.parametrize("ddof", [0, 1])
def test_grpo_matches_numpy(ddof):
  r = RNG.normal(size=(6, 5)).astype(np.float32)
  r[2] = 0.3
  np.testing.assert_allclose(np.asarray(jit_call(adv.grpo, jnp.asarray(r), std_eps=1e-4, ddof=ddof)),
                             np_grpo(r, 1e-4, ddof), rtol=1e-5, atol=1e-6)


def test_grpo_rejects_bad_ddof():
  with pytest.raises(ValueError, match="ddof"):
    adv.grpo(jnp.zeros((2, 1)), ddof=1)


def test_dr_grpo():
  r = np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)
  np.testing.assert_allclose(np.asarray(jit_call(adv.dr_grpo, jnp.asarray(r))), [[0.75, -0.25, -0.25, -0.25]])


def test_rloo_hand_and_identity():
  r = np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)
  # b_0 = 0 -> 1; b_j = 1/3 -> -1/3.
  np.testing.assert_allclose(np.asarray(jit_call(adv.rloo, jnp.asarray(r))), [[1, -1 / 3, -1 / 3, -1 / 3]], rtol=1e-6)
  for G in (2, 3, 8):
    r = RNG.normal(size=(4, G)).astype(np.float32)
    loo = np.array([[r[b, i] - np.delete(r[b], i).mean() for i in range(G)] for b in range(4)])
    a = np.asarray(jit_call(adv.rloo, jnp.asarray(r)))
    np.testing.assert_allclose(a, loo, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a, G / (G - 1) * np.asarray(jit_call(adv.dr_grpo, jnp.asarray(r))), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "group_mean_batch_std"])
def test_constant_group_gets_exactly_zero_under_every_group_baseline(name):
  """A group of equal rewards carries no signal (frac_zero_std_groups and dynamic sampling count it so) and gets
  exactly 0, as under grpo: 0.1 × 3 / 3 ≠ 0.1 in float32 left dr_grpo and rloo −7.45e-9 on each of its rows. That
  residue is not harmless: Adam divides by its own scale, so one update on a batch with no signal moved every weight
  by ~0.4·lr (here: a weight whose gradient is the residue). The other group ([1, 0, 0]) keeps its values."""
  r = jnp.asarray([[0.1, 0.1, 0.1], [1.0, 0.0, 0.0]], jnp.float32)
  fn = {"dr_grpo": adv.dr_grpo, "rloo": adv.rloo, "group_mean_batch_std": adv.group_mean_batch_std}[name]
  a = np.asarray(jit_call(fn, r))
  assert np.all(a[0] == 0.0), a[0]
  scale = {"dr_grpo": 1.0, "rloo": 1.5, "group_mean_batch_std": 1 / (np.std([0.1] * 3 + [1, 0, 0], ddof=1) + 1e-4)}
  np.testing.assert_allclose(a[1], np.array([2 / 3, -1 / 3, -1 / 3]) * scale[name], rtol=1e-5)
  # what the residue did: one AdamW step on loss = −A·θ with the first group's advantage as A
  opt = optax.adamw(1e-3, weight_decay=0.0)

  def adam_step(theta):  # one program, not optax's eager ops one by one
    g = jax.grad(lambda t: -jnp.mean(jnp.asarray(a[0])) * t)(theta)
    return opt.update(g, opt.init(theta), theta)[0]
  upd = jax.jit(adam_step)(np.zeros((), np.float32))
  assert float(upd) == 0.0


def test_rewards_past_the_float32_square_keep_their_advantages():
  """Rewards of 1e20 are finite float32 (the Python-term check accepts them), but their centred squares are not:
  the std became inf and every advantage divided by it a silent 0 — grpo's group, Lite PPO's and GDPO's whole batch,
  REINFORCE++'s and PPO's whitened tokens, process steps — with nothing counted. Each now equals the float64
  formula (eps negligible at this scale); an inf reward still gives NaN, which the update's guard skips and counts."""
  r = np.array([[1e20, 0, 0, 0], [3e19, 0, 1e19, 0]])
  r32 = r.astype(np.float32)  # NumPy: its slices below are not eager (compiled) jnp ops
  np.testing.assert_allclose(np.asarray(jit_call(adv.grpo, r32)), np_grpo(r, 0.0, 1), rtol=1e-5)
  c = r - r.mean(1, keepdims=True)
  np.testing.assert_allclose(np.asarray(jit_call(adv.group_mean_batch_std, r32)), c / r.std(ddof=1), rtol=1e-5,
                             atol=1e-6)
  s = np_grpo(r, 0.0, 1)
  np.testing.assert_allclose(np.asarray(jit_call(adv.decoupled, r32[..., None], [1.0], adv.grpo, std_eps=1e-4)),
                             s / (s.std(ddof=1) + 1e-4), rtol=1e-5)
  mask = ragged_mask([3, 1, 2, 3, 2, 1, 3, 3], 3)
  got = np.asarray(jit_call(adv.reinforce_pp, r32.reshape(-1), np.zeros((8, 3)), jnp.asarray(mask), beta=0.0))
  ret = r.reshape(-1)[:, None] * mask  # γ = 1, outcome at the last token: every valid token's return is r
  v = ret[mask > 0]
  np.testing.assert_allclose(got, (ret - v.mean()) / v.std() * mask, rtol=1e-5, atol=1e-6)
  steps = jnp.asarray(r.reshape(4, 2), jnp.float32)  # G = 2: each group's 4 valid steps normalised together
  p = np.asarray(jit_call(adv.process_advantages, steps, jnp.asarray([[2, 2]] * 4), np.ones((4, 2)), np.ones((4, 3)),
                          G=2))
  want = np.concatenate([(g - g.mean()) / g.std(ddof=1) for g in r.reshape(2, 4)]).reshape(4, 2).sum(1)
  np.testing.assert_allclose(p, np.repeat(want[:, None], 3, 1), rtol=1e-5, atol=1e-6)
  assert np.all(np.isnan(np.asarray(jit_call(adv.grpo, jnp.asarray([[np.inf, 0.0, 0.0]])))))


def test_rloo_rejects_group_of_one():
  with pytest.raises(ValueError, match="G=1"):
    adv.rloo(jnp.zeros((3, 1)))


# ---------------------------------------------------------------- REINFORCE++


def np_reinforce_pp(r, kl, lengths, beta, eps):
  N, L = kl.shape
  ret = np.zeros((N, L))
  for i in range(N):
    n = lengths[i]
    rew = -beta * kl[i, :n].astype(np.float64)
    if n:
      rew[n - 1] += r[i]
    ret[i, :n] = np.cumsum(rew[::-1])[::-1]
  valid = np.concatenate([ret[i, :lengths[i]] for i in range(N)])
  mean, var = valid.mean(), valid.var()
  out = np.zeros((N, L))
  for i in range(N):
    out[i, :lengths[i]] = (ret[i, :lengths[i]] - mean) / np.sqrt(var + eps)
  return out


@pytest.fixture(scope="module")
def rpp():
  return jax.jit(lambda r, kl, m: adv.reinforce_pp(r, kl, m, beta=0.1, whiten_eps=1e-8))


def test_reinforce_pp_hand(rpp):
  # One row of length 2, beta 0.1, kl [1, 2], r 1: rewards [-0.1, 0.8], returns [0.7, 0.8]; mean 0.75, std 0.05.
  # A second row of length 0 must contribute nothing and stay 0.
  r = jnp.array([1.0, 5.0])
  kl = jnp.array([[1.0, 2.0, 9.0], [3.0, 3.0, 3.0]])
  m = jnp.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
  out = np.asarray(rpp(r, kl, m))
  np.testing.assert_allclose(out[0], [-1.0, 1.0, 0.0], rtol=1e-4)
  assert np.all(out[1] == 0) and np.all(np.isfinite(out))


def test_reinforce_pp_matches_numpy(rpp):
  N, L = 6, 9
  lengths = np.array([9, 3, 1, 0, 5, 7])
  r = RNG.normal(size=N).astype(np.float32)
  kl = RNG.normal(size=(N, L)).astype(np.float32)
  out = np.asarray(rpp(jnp.asarray(r), jnp.asarray(kl), jnp.asarray(ragged_mask(lengths, L))))
  np.testing.assert_allclose(out, np_reinforce_pp(r, kl, lengths, 0.1, 1e-8), rtol=1e-4, atol=1e-5)


def test_reinforce_pp_ignores_padding(rpp):
  N, L = 4, 6
  lengths = np.array([6, 2, 4, 1])
  m = ragged_mask(lengths, L)
  r = RNG.normal(size=N).astype(np.float32)
  kl = RNG.normal(size=(N, L)).astype(np.float32)
  base = np.asarray(rpp(r, kl, m))
  kl_junk = np.where(m > 0, kl, 1e6).astype(np.float32)
  np.testing.assert_allclose(np.asarray(rpp(r, kl_junk, m)), base, rtol=1e-6)
  pad = 5
  kl_long = np.concatenate([kl, RNG.normal(size=(N, pad)).astype(np.float32)], 1)
  m_long = np.concatenate([m, np.zeros((N, pad), np.float32)], 1)
  long = np.asarray(rpp(r, kl_long, m_long))
  np.testing.assert_allclose(long[:, :L], base, rtol=1e-5, atol=1e-6)
  assert np.all(long[:, L:] == 0)
  assert np.all(base[m == 0] == 0)


def test_reinforce_pp_kl_is_stop_gradient():
  m = np.ones((2, 3), np.float32)
  g = jit_grad(lambda kl: jnp.sum(adv.reinforce_pp(jnp.array([1.0, 0.0]), kl, m, beta=0.5) ** 3),
               np.ones((2, 3), np.float32))
  assert np.all(np.asarray(g) == 0)


def test_reinforce_pp_baseline_matches_numpy():
  B, G, L = 3, 4, 5
  lengths = RNG.integers(0, L + 1, size=B * G)
  r = RNG.integers(0, 2, size=(B, G)).astype(np.float32)
  kl = RNG.normal(size=(B * G, L)).astype(np.float32)
  out = jit_call(adv.reinforce_pp_baseline, jnp.asarray(r), jnp.asarray(kl), jnp.asarray(ragged_mask(lengths, L)),
                 beta=0.05, whiten_eps=1e-8)
  r_centred = (r - r.mean(1, keepdims=True)).reshape(-1)
  np.testing.assert_allclose(np.asarray(out), np_reinforce_pp(r_centred, kl, lengths, 0.05, 1e-8),
                             rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- GAE


def np_gae(rew, val, lengths, gamma, lam):
  N, L = rew.shape
  a = np.zeros((N, L))
  for i in range(N):
    last = 0.0
    for t in reversed(range(lengths[i])):
      nv = val[i, t + 1] if t + 1 < lengths[i] else 0.0
      delta = rew[i, t] + gamma * nv - val[i, t]
      last = delta + gamma * lam * last
      a[i, t] = last
  ret = np.where(ragged_mask(lengths, L) > 0, a + val, 0.0)
  return a, ret


def test_gae_hand():
  # gamma = lam = 1: advantage = sum of future rewards - V_t (telescoping), bootstrap 0 after the last token.
  a, ret = jit_call(adv.gae, jnp.array([[0.0, 0.0, 1.0, 7.0]]), jnp.array([[0.5, 0.25, 0.125, 9.0]]),
                    jnp.array([[1.0, 1.0, 1.0, 0.0]]), gamma=1.0, lam=1.0)
  np.testing.assert_allclose(np.asarray(a), [[0.5, 0.75, 0.875, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(ret), [[1.0, 1.0, 1.0, 0.0]], rtol=1e-6)


def test_gae_matches_numpy_ragged():
  N, L = 5, 8
  lengths = np.array([8, 3, 0, 1, 6])
  rew = RNG.normal(size=(N, L)).astype(np.float32)
  val = RNG.normal(size=(N, L)).astype(np.float32)
  f = jax.jit(lambda r, v, m: adv.gae(r, v, m, gamma=0.9, lam=0.8))
  a, ret = f(rew, val, ragged_mask(lengths, L))
  a_np, ret_np = np_gae(rew, val, lengths, 0.9, 0.8)
  np.testing.assert_allclose(np.asarray(a), a_np, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ret), ret_np, rtol=1e-5, atol=1e-5)


def test_gae_skips_interior_masked_tokens():
  """A multi-turn row's observation tokens (mask 0 inside the row, tools.env) are skipped: each valid token
  bootstraps from the NEXT VALID token's value, as verl's GAE with a response mask. Hand-computed, γ = 0.5, λ = 1:
  row [1, 0, 0, 1] with rewards (0, ·, ·, 1), values (0.25, 9, 9, 0.5): A_3 = 1 − 0.5 = 0.5,
  A_0 = 0 + 0.5·0.5 − 0.25 + 0.5·0.5 = 0.25 (the 9s of the masked tokens never enter)."""
  a, ret = jit_call(adv.gae, jnp.array([[0.0, 5.0, 5.0, 1.0]]), jnp.array([[0.25, 9.0, 9.0, 0.5]]),
                    jnp.array([[1.0, 0.0, 0.0, 1.0]]), gamma=0.5, lam=1.0)
  np.testing.assert_allclose(np.asarray(a), [[0.25, 0.0, 0.0, 0.5]], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(ret), [[0.5, 0.0, 0.0, 1.0]], rtol=1e-6)


# ---------------------------------------------------------------- process supervision


def np_process(step_r, step_end, step_valid, mask, G, eps, ddof=1):
  N, S = step_r.shape
  L = mask.shape[1]
  out = np.zeros((N, L))
  for b in range(N // G):
    rows = range(b * G, (b + 1) * G)
    vals = np.array([step_r[i, s] for i in rows for s in range(S) if step_valid[i, s]], np.float64)
    const = len(vals) == 0 or vals.max() == vals.min()
    for i in rows:
      for t in range(L):
        if not mask[i, t] or const:
          continue
        out[i, t] = sum((step_r[i, s] - vals.mean()) / (vals.std(ddof=ddof) + eps)
                        for s in range(S) if step_valid[i, s] and step_end[i, s] >= t)
  return out


@pytest.mark.parametrize("ddof", [0, 1])
def test_process_advantages_hand(ddof):
  # One group of G=2; row 0 has steps ending at 0 and 2 with rewards 1, 0; row 1 one step ending at 1, reward 1.
  # Mean 2/3; ddof=0: std sqrt(2)/3, normalised 1 -> 1/sqrt(2), 0 -> -sqrt(2); ddof=1 (the default, as the outcome
  # advantages): std 1/sqrt(3), 1 -> 1/sqrt(3), 0 -> -2/sqrt(3).
  step_r = jnp.array([[1.0, 0.0], [1.0, 5.0]])
  step_end = jnp.array([[0, 2], [1, 0]])
  step_valid = jnp.array([[1, 1], [1, 0]])
  mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
  out = np.asarray(jit_call(adv.process_advantages, step_r, step_end, step_valid, mask, G=2, std_eps=0.0, ddof=ddof))
  h, l = (1 / np.sqrt(2), -np.sqrt(2)) if ddof == 0 else (1 / np.sqrt(3), -2 / np.sqrt(3))
  np.testing.assert_allclose(out, [[h + l, l, l, 0], [h, h, 0, 0]], rtol=1e-5)


def test_process_advantages_matches_numpy():
  B, G, S, L = 3, 3, 4, 10
  N = B * G
  lengths = RNG.integers(1, L + 1, size=N)
  step_r = RNG.normal(size=(N, S)).astype(np.float32)
  step_end = np.sort(RNG.integers(0, L, size=(N, S)), axis=1)
  step_valid = (RNG.random((N, S)) < 0.7).astype(np.int32)
  step_valid[3:6] = 0  # a group with no valid step -> zeros
  mask = ragged_mask(lengths, L)
  out = jit_call(adv.process_advantages, jnp.asarray(step_r), jnp.asarray(step_end), jnp.asarray(step_valid),
                 jnp.asarray(mask), G=G, std_eps=1e-4)
  np.testing.assert_allclose(np.asarray(out), np_process(step_r, step_end, step_valid, mask, G, 1e-4),
                             rtol=1e-4, atol=1e-5)
  assert np.all(np.asarray(out)[3:6] == 0)


def test_combine():
  o, p = jnp.array([[1.0, 2.0]]), jnp.array([[10.0, 20.0]])
  np.testing.assert_allclose(np.asarray(jit_call(adv.combine, o, p, w_outcome=0.5, w_process=0.1)), [[1.5, 3.0]])


# ---------------------------------------------------------------- DAPO helpers


def test_dynamic_sampling_prefers_valid_groups():
  f = jax.jit(adv.dynamic_sampling_select, static_argnums=1)
  r = np.zeros((8, 4), np.float32)
  r[[1, 4, 6], 0] = 1.0  # three groups with 0 < #correct < G
  r[7] = 1.0  # all correct: zero variance
  for seed in range(5):
    idx, n_valid = f(jnp.asarray(r), 2, jax.random.key(seed))
    assert idx.shape == (2,) and int(n_valid) == 2
    assert set(np.asarray(idx).tolist()) <= {1, 4, 6}
    idx, n_valid = f(jnp.asarray(r), 5, jax.random.key(seed))
    idx = np.asarray(idx)
    assert idx.shape == (5,) and int(n_valid) == 3 and len(set(idx.tolist())) == 5
    assert set(idx[:3].tolist()) == {1, 4, 6}  # valid groups come first
  # The choice among valid groups is random, not always the same pair.
  picks = {tuple(sorted(np.asarray(f(jnp.asarray(r), 2, jax.random.key(s))[0]).tolist())) for s in range(20)}
  assert len(picks) > 1


def test_dynamic_sampling_per_term_keeps_groups_where_any_term_varies():
  """Under reward_norm='per_term' a group whose weighted SUM is constant can still carry signal (accuracy up where
  format is down): each term is normalised on its own. The B×G×K rule keeps it; the summed B×G rule drops it."""
  acc = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]], np.float32)
  fmt = np.array([[0.0, 1.0], [0.0, 0.0], [1.0, 1.0]], np.float32)
  terms = jnp.asarray(np.stack([acc, fmt], axis=2))            # group 0: sum [1, 1] constant, terms vary
  for seed in range(4):
    idx, n = jit_call(adv.dynamic_sampling_select, terms, 1, jax.random.key(seed))
    assert (int(n), int(np.asarray(idx)[0])) == (1, 0)
    _, n = jit_call(adv.dynamic_sampling_select, jnp.asarray(acc + fmt), 1, jax.random.key(seed))
    assert int(n) == 0
  with pytest.raises(ValueError, match="B×G×K"):
    adv.dynamic_sampling_select(jnp.zeros((2,)), 1, jax.random.key(0))


def test_dynamic_sampling_rejects_bad_keep():
  with pytest.raises(ValueError, match="keep"):
    adv.dynamic_sampling_select(jnp.zeros((3, 2)), 4, jax.random.key(0))


def test_overlong_penalty():
  lengths = jnp.array([0, 12, 16, 17, 18, 20, 25])
  p = np.asarray(jit_call(adv.overlong_penalty, lengths, max_len=20, cache_len=4))
  np.testing.assert_allclose(p, [0, 0, 0, -0.25, -0.5, -1, -1])
  with pytest.raises(ValueError, match="cache_len"):
    adv.overlong_penalty(lengths, max_len=20, cache_len=0)


def test_broadcast_to_tokens():
  out = jit_call(adv.broadcast_to_tokens, jnp.array([2.0, -1.0]), jnp.array([[1, 1, 0], [0, 0, 0]]))
  np.testing.assert_array_equal(np.asarray(out), [[2, 2, 0], [0, 0, 0]])


# ---------------------------------------------------------------- GDPO: per-term normalisation


def grpo_fn(eps, ddof=1):
  return lambda r: adv.grpo(r, std_eps=eps, ddof=ddof)


def np_gdpo_trl(r_BxGxK, w_K, eps, ddof=1):
  """TRL's multi_objective_aggregation='normalize_then_sum', in NumPy: per term (r − group mean)/(group std + eps),
  weighted sum, then (A − batch mean)/(batch std + eps) over samples."""
  r = r_BxGxK.astype(np.float64)
  B, G, K = r.shape
  a = np.zeros((B, G))
  for k in range(K):
    for b in range(B):
      g = r[b, :, k]
      if g.max() > g.min():
        a[b] += w_K[k] * (g - g.mean()) / (g.std(ddof=ddof) + eps)
  return (a - a.mean()) / (a.std(ddof=ddof) + eps)


def np_gdpo_verl(r_BxGxK, w_K, mask_NxL, eps=1e-6):
  """verl's compute_gdpo_outcome_advantage in NumPy: per-term GRPO (torch.std, + eps), weighted sum on every token,
  then masked_whiten: token mean and unbiased token variance over the mask, (A − mean)·rsqrt(var + 1e-8)·mask."""
  B, G, K = r_BxGxK.shape
  a_N = np.zeros(B * G)
  for k in range(K):
    for b in range(B):
      g = r_BxGxK[b, :, k].astype(np.float64)
      a_N[b * G:(b + 1) * G] += w_K[k] * (g - g.mean()) / (g.std(ddof=1) + eps)
  m = mask_NxL.astype(np.float64)
  a_NxL = a_N[:, None] * m
  mean = (a_NxL * m).sum() / m.sum()
  var = (((a_NxL - mean) ** 2) * m).sum() / m.sum() * m.sum() / (m.sum() - 1)
  return (a_NxL - mean) / np.sqrt(var + 1e-8) * m


def test_gdpo_hand_values_and_the_collapse_it_avoids():
  """G = 2, terms (accuracy, format) weighted (1, 0.5). Group 0: accuracy splits, format constant; group 1: only
  format splits; group 2: all-zero rewards. Per term (ddof=1): ±1/√2 for a split term, 0 for a constant one;
  weighted sums ±1/√2 and ±1/(2√2), 0; batch std over the 6 samples √((1 + 1/4)/5) = 1/2: ±√2, ±1/√2, 0.
  Summed-then-normalised (GRPO) gives both split groups the same ±1/√2: the format-only difference is worth as
  much as a right answer."""
  acc = np.array([[1, 0], [0, 0], [0, 0]], np.float32)
  fmt = np.array([[1, 1], [1, 0], [0, 0]], np.float32)
  r = jnp.asarray(np.stack([acc, fmt], 2))
  w = jnp.array([1.0, 0.5])
  got = np.asarray(jax.jit(lambda r, w: adv.decoupled(r, w, grpo_fn(0.0), std_eps=0.0))(r, w))
  s2 = np.sqrt(2)
  np.testing.assert_allclose(got, [[s2, -s2], [1 / s2, -1 / s2], [0, 0]], rtol=1e-6)
  summed = np.asarray(jit_call(adv.grpo, jnp.asarray(acc + 0.5 * fmt), std_eps=0.0))
  np.testing.assert_allclose(summed, [[1 / s2, -1 / s2], [1 / s2, -1 / s2], [0, 0]], rtol=1e-6)


@pytest.mark.parametrize("G", [2, 5])
def test_gdpo_matches_trl_formula(G):
  B, K = 6, 3
  rng = np.random.default_rng(G)
  r = rng.integers(0, 2, size=(B, G, K)).astype(np.float32)
  r[:, :, 2] = rng.random((B, G)) < 0.1   # a rarely-varying term
  r[0] = 1.0                                 # a group where every term is constant
  r[1] = 0.0                                 # an all-zero group
  w = np.array([1.0, 0.5, 0.25], np.float32)
  got = np.asarray(jit_call(adv.decoupled, jnp.asarray(r), jnp.asarray(w), grpo_fn(1e-4), std_eps=1e-4))
  np.testing.assert_allclose(got, np_gdpo_trl(r, w, 1e-4), rtol=1e-5, atol=1e-6)
  assert np.all(got[:2] == 0.0)              # zero-variance groups stay exactly 0 (TRL: ~1e-8 residue)
  np.testing.assert_allclose(got.reshape(-1).std(ddof=1), 1.0, rtol=1e-3)   # unit scale, whatever K is


def test_gdpo_all_zero_and_all_constant_batches_are_zero_not_nan():
  for r in (np.zeros((3, 2, 2), np.float32), np.ones((3, 4, 2), np.float32)):
    got = np.asarray(jit_call(adv.decoupled, r, np.ones(2), grpo_fn(0.0), std_eps=0.0))
    assert np.all(got == 0.0)


def test_gdpo_against_verl_per_token_whitening():
  """verl whitens per token (mask-weighted, unbiased variance). With equal lengths its mean is ours (0) and the
  scales differ only by the Bessel factor of tokens vs samples; with ragged lengths its mean is length-weighted and
  not 0, so a zero-variance group gets −mean·rsqrt(var) ≠ 0 where ours keeps 0 (docs/algorithms.md)."""
  B, G, K, L = 4, 2, 2, 6
  rng = np.random.default_rng(3)
  r = rng.integers(0, 2, size=(B, G, K)).astype(np.float32)
  r[0, :, 0], r[1, :, 1] = [1, 0], [0, 1]
  r[3] = 1.0                                             # zero-variance group
  w = np.array([1.0, 0.5], np.float32)
  ours_N = np.asarray(jit_call(adv.decoupled, jnp.asarray(r), jnp.asarray(w), grpo_fn(1e-6), std_eps=1e-6)).reshape(-1)
  full = np.ones((B * G, L), np.float32)
  verl = np_gdpo_verl(r, w, full)
  N = B * G
  bessel = np.sqrt((N * L - 1) / (L * (N - 1)))          # verl's token std relative to our sample std
  np.testing.assert_allclose(verl[:, 0], ours_N * bessel, rtol=1e-4, atol=1e-6)
  ragged = (np.arange(L)[None, :] < rng.integers(1, L + 1, size=(N, 1))).astype(np.float32)
  ragged[1] = 0.0                                        # an empty row
  ragged[2, 1:] = 0.0                                    # a length-1 row
  verl = np_gdpo_verl(r, w, ragged)
  assert np.all(np.abs(verl[6:8][ragged[6:8] > 0]) > 1e-3)   # verl: the zero-variance group moves
  ours_NxL = np.asarray(jit_call(adv.broadcast_to_tokens, jnp.asarray(ours_N), jnp.asarray(ragged)))
  assert np.all(ours_NxL[6:8] == 0) and np.all(ours_NxL[1] == 0)
  np.testing.assert_allclose(ours_NxL[2], [ours_N[2], 0, 0, 0, 0, 0])


def test_gdpo_with_other_group_estimators_and_one_term():
  rng = np.random.default_rng(4)
  r = rng.normal(size=(5, 4, 2)).astype(np.float32)
  w = np.array([1.0, 0.3], np.float32)
  # One term: GRPO's advantages scaled to unit batch std.
  g = np.asarray(jit_call(adv.grpo, jnp.asarray(r[..., 0]), std_eps=0.0))
  one = np.asarray(jit_call(adv.decoupled, r[..., :1], np.ones(1), grpo_fn(0.0), std_eps=0.0))
  np.testing.assert_allclose(one, g / g.reshape(-1).std(ddof=1), rtol=1e-5)
  # Dr.GRPO / RLOO are linear: per-term = summed, then scaled to unit batch std.
  for fn in (adv.dr_grpo, adv.rloo):
    s = np.asarray(fn(jnp.asarray((r * w).sum(2))))
    got = np.asarray(jit_call(adv.decoupled, jnp.asarray(r), jnp.asarray(w), fn, std_eps=0.0))
    np.testing.assert_allclose(got, s / s.reshape(-1).std(ddof=1), rtol=1e-4, atol=1e-6)


def test_gdpo_weights_are_traceable():
  """Reward weights enter only through arithmetic: vmapping over them equals separate calls."""
  r = jnp.asarray(np.random.default_rng(5).integers(0, 2, size=(4, 3, 2)), jnp.float32)
  ws = np.array([[1.0, 0.5], [1.0, 0.0], [0.2, 2.0]], np.float32)
  f = lambda w: adv.decoupled(r, w, grpo_fn(1e-4), std_eps=1e-4)
  batched = np.asarray(jax.jit(jax.vmap(f))(ws))
  for i in range(3):
    np.testing.assert_allclose(batched[i], np.asarray(jit_call(f, ws[i])), rtol=1e-6, atol=1e-7)


def test_gdpo_rejects_bad_shapes():
  with pytest.raises(ValueError, match="3-D"):
    adv.decoupled(jnp.zeros((2, 2)), jnp.ones(1), grpo_fn(0.0), std_eps=0.0)
  with pytest.raises(ValueError, match="weights for 2 reward terms"):
    adv.decoupled(jnp.zeros((2, 2, 2)), jnp.ones(3), grpo_fn(0.0), std_eps=0.0)
