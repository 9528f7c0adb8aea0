"""Rollout correction (rl/correction.py): each kind against hand-computed and independent NumPy values, the weight's
stop-gradient in the loss, the statistics, needs_proximal, the exact on-policy mode (the sampler's log-probs against
the training forward's, both engines, padded and packed passes) and sampling.dtype's injected mismatch."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.rl import correction
from grpo_jax.rl import losses
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.tasks import digits
from tests.jit_call import jit_call
from tests.jit_call import jit_grad

RL = ml_collections.ConfigDict(dict(is_cap=2.0, mis_lo=0.0, mis_hi=2.0, icepop_lo=0.5, icepop_hi=5.0,
                                    seq_mask_lo=1 / 1.001, seq_mask_hi=1.001, is_veto=1e-4))


def _config(kind="none", model_dtype="float32", sampling_dtype=""):
  c = config_lib.base_config()
  c.model.dtype = model_dtype
  c.sampling.dtype = sampling_dtype
  c.rl.rollout_correction = kind
  return c


def _build(kind, prox, behav, mask):
  # one program, as training_data runs it (eagerly each jnp op inside compiled on its own)
  return jit_call(correction.build, _config(kind), np.asarray(prox, np.float32), np.asarray(behav, np.float32),
                  np.asarray(mask, np.float32))


# --------------------------------------------------------------------------------- the kinds, by hand


@pytest.mark.parametrize("lo,hi", [(1 / 1.001, 1.001), (0.99, 1.01)])
def test_the_windows_are_closed_at_each_bound_on_the_float32_grid(lo, hi):
  """seq_mask's (and mis / icepop's) [lo, hi] compared in log space: a row whose float32 mean log ρ is log(bound)
  as a float32 (nearest, from float64) is kept, one float32 step outside is masked. jnp.log(float32(lo)) put the
  bound 27 steps inside at lo = 1/1.001 (a row at ρ_geo = lo masked) and 16 outside at hi = 1.001 (a row above hi
  kept)."""
  f32, up, down = np.float32, np.float32(np.inf), np.float32(-np.inf)
  at_lo, at_hi = f32(np.log(np.float64(lo))), f32(np.log(np.float64(hi)))
  rows = [at_lo, np.nextafter(at_lo, down), at_hi, np.nextafter(at_hi, up)]
  want = [True, False, True, False]
  # two valid tokens per row (x + x and its halving are exact: the mean is x itself), the rest padding
  log_rho = np.asarray([[x, x, 0.0, 0.0] for x in rows], np.float32)
  valid = np.asarray([[1, 1, 0, 0]] * 4, bool)
  # jitted as the step runs them; the bounds are the Python floats the step closes over
  _, keep = jit_call(correction.sequence_masked, log_rho, valid, lo, hi, 1e-4)
  assert np.asarray(keep[:, 0]).tolist() == want
  _, keep_tok = jit_call(correction.masked, log_rho, lo, hi)
  assert np.asarray(keep_tok[:, 0]).tolist() == want
  # the veto is strict (ρ_t < veto): a token at log(veto) is not vetoed, one float32 step below is
  at_v = f32(np.log(1e-4))
  _, keep_v = jit_call(correction.sequence_masked,
                       np.asarray([[at_v, -at_v], [np.nextafter(at_v, down), -at_v]], np.float32),
                       np.ones((2, 2), bool), 1e-30, 1e30, 1e-4)
  assert np.asarray(keep_v[:, 0]).tolist() == [True, False]


# ρ per token; row 2 is padding past its first token (its ρ there is garbage that must not be read).
RHO = np.array([[0.4, 1.0, 3.0, 6.0],
                [1.0005, 0.9995, 1.0, 1.0],
                [5e-5, 1.0, 1.0, 1.0],
                [2.0, 7.0, 1e9, 1e-9]])
MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32)
BEHAV = np.log(np.full(RHO.shape, 0.3))
PROX = BEHAV + np.log(RHO)

# (kind, w per token, kept per token): written out from the sources' definitions (module docstring).
HAND = {
    # min(ρ, 2)
    "tis": ([[0.4, 1.0, 2.0, 2.0], [1.0005, 0.9995, 0, 0], [5e-5, 1, 1, 1], [2.0, 0, 0, 0]],
            [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]),
    # ρ on [0, 2], masked above (ρ = 2 exactly is kept)
    "mis": ([[0.4, 1.0, 0, 0], [1.0005, 0.9995, 0, 0], [5e-5, 1, 1, 1], [2.0, 0, 0, 0]],
            [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]),
    # ρ on [0.5, 5]
    "icepop": ([[0, 1.0, 3.0, 0], [1.0005, 0.9995, 0, 0], [0, 1, 1, 1], [2.0, 0, 0, 0]],
               [[0, 1, 1, 0], [1, 1, 0, 0], [0, 1, 1, 1], [1, 0, 0, 0]]),
    # geometric mean per row: (0.4·1·3·6)^(1/4) = 1.638 (out), √(1.0005·0.9995) (in), row 2 vetoed (5e-5 < 1e-4),
    # row 3: ρ_geo = 2 (out)
    "seq_mask": ([[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
                 [[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),
}


@pytest.mark.parametrize("kind", sorted(HAND))
def test_kinds_hand_values(kind):
  w_want, kept_want = (np.asarray(x, np.float64) for x in HAND[kind])
  corr = _build(kind, PROX, BEHAV, MASK)
  np.testing.assert_allclose(np.asarray(corr.is_w_NxL), w_want, rtol=2e-6)
  np.testing.assert_array_equal(np.asarray(corr.mask_NxL), kept_want)
  valid = MASK > 0
  m = jax.device_get(corr.metrics)
  assert m["train/is_masked_frac"] == pytest.approx(np.sum(valid & (kept_want == 0)) / valid.sum())
  if kept_want.sum():
    assert m["train/is_weight_mean"] == pytest.approx(w_want.sum() / kept_want.sum(), rel=2e-6)
    assert m["train/is_weight_max"] == pytest.approx(w_want.max(), rel=2e-6)


def np_correction(kind, prox, behav, mask, rl):
  """The sources' formulas in NumPy (float64), independently of correction.py."""
  valid = mask > 0
  rho = np.exp(np.where(valid, prox - behav, 0.0))
  if kind == "tis":
    w, keep = np.minimum(rho, rl.is_cap), np.ones_like(valid)
  elif kind in ("mis", "icepop"):
    lo, hi = (rl.mis_lo, rl.mis_hi) if kind == "mis" else (rl.icepop_lo, rl.icepop_hi)
    keep = (rho >= lo) & (rho <= hi)
    w = np.where(keep, rho, 0.0)
  else:
    geo = np.array([np.exp(np.mean(np.log(r[v]))) if v.any() else 1.0 for r, v in zip(rho, valid)])
    veto = np.array([np.any(r[v] < rl.is_veto) for r, v in zip(rho, valid)])
    keep = np.broadcast_to(((geo >= rl.seq_mask_lo) & (geo <= rl.seq_mask_hi) & ~veto)[:, None], rho.shape)
    w = np.ones_like(rho)
  kept = valid & keep
  w = np.where(kept, w, 0.0)
  k3 = rho - np.log(rho) - 1
  return w, kept, {"train/is_weight_mean": w.sum() / max(kept.sum(), 1), "train/is_weight_max": w.max(),
                   "train/is_masked_frac": np.sum(valid & ~keep) / valid.sum(),
                   "train/mismatch_kl": k3[valid].mean()}


@pytest.mark.parametrize("kind", sorted(HAND))
def test_kinds_match_numpy(kind):
  rng = np.random.default_rng(1)
  N, L = 12, 9
  mask = (np.arange(L)[None] < rng.integers(0, L + 1, N)[:, None]).astype(np.float32)
  behav = rng.uniform(-4, 0, (N, L))
  # a spread of mismatches: most tokens near ρ = 1 (seq_mask's rows both in and out of its tight window), some far
  scale = np.where(rng.random((N, L)) < 0.8, 5e-4, 1.0)
  prox = behav + rng.normal(size=(N, L)) * scale
  mask[0, :3] = 1
  prox[0, 0] = behav[0, 0] + np.log(5e-5)  # a row seq_mask's veto drops
  rl = RL
  if kind == "seq_mask":
    rl = ml_collections.ConfigDict(dict(RL, seq_mask_lo=0.99, seq_mask_hi=1.01))
  c = _config(kind)
  c.rl.update(rl)
  corr = jit_call(correction.build, c, prox.astype(np.float32), behav.astype(np.float32), mask)
  w, kept, metrics = np_correction(kind, prox.astype(np.float32).astype(np.float64),
                                   behav.astype(np.float32).astype(np.float64), mask, rl)
  np.testing.assert_allclose(np.asarray(corr.is_w_NxL), w, rtol=2e-5, atol=1e-7)
  np.testing.assert_array_equal(np.asarray(corr.mask_NxL) > 0, kept)
  assert 0 < kept.sum() < (mask > 0).sum() or kind == "tis"  # both kept and rejected tokens exercised
  for k, v in metrics.items():
    assert float(corr.metrics[k]) == pytest.approx(v, rel=1e-4, abs=1e-7), k


def test_mismatch_kl_is_k3_of_behaviour_against_proximal():
  """k3 = ρ − log ρ − 1 per token, token mean: ρ = [2, 0.25] → ((2 − log 2 − 1) + (0.25 + log 4 − 1)) / 2
  = 0.4716 (ρ = [2, 0.5] could not tell k3(μ‖π_prox) from k3(π_prox‖μ): swapping maps ρ to 1/ρ, the same
  pair; here the swap gives 0.9034)."""
  c = _config("none", sampling_dtype="bfloat16")  # no correction, but π_prox is a forward: the mismatch is measured
  corr = jit_call(correction.build, c, np.log(np.array([[2.0, 0.25, 9.0]], np.float32)),
                  np.zeros((1, 3), np.float32), np.array([[1.0, 1.0, 0.0]], np.float32))
  want = ((2 - np.log(2) - 1) + (0.25 + np.log(4) - 1)) / 2
  assert float(corr.metrics["train/mismatch_kl"]) == pytest.approx(want, rel=1e-6)
  assert corr.is_w_NxL is None and float(corr.metrics["train/is_weight_mean"]) == 1.0


def test_exact_mode_builds_nothing():
  """fp32 sampler and trainer, no correction: π_prox IS μ; no weight, the mask itself, no statistics."""
  mask = jnp.ones((2, 3))
  corr = correction.build(_config("none"), jnp.zeros((2, 3)), jnp.zeros((2, 3)), mask)
  assert corr.is_w_NxL is None and corr.mask_NxL is mask and corr.metrics == {}


@pytest.mark.parametrize("kind,model,sampler,want", [
    ("none", "float32", "", False), ("none", "float32", "float32", False), ("tis", "float32", "", True),
    ("none", "float32", "bfloat16", True), ("none", "bfloat16", "", True), ("seq_mask", "bfloat16", "", True)])
def test_needs_proximal(kind, model, sampler, want):
  assert correction.needs_proximal(_config(kind, model, sampler)) is want


# --------------------------------------------------------------------------------- the weight in the loss


def test_weight_multiplies_the_surrogate_and_is_stop_gradient():
  """∂loss/∂logp with is_w = w · (∂loss/∂logp without it), token by token (β = 0: the KL term is unweighted, β > 0
  below); the weight is a constant of the update: no gradient reaches π_prox or μ through it."""
  rng = np.random.default_rng(2)
  N, L = 4, 6
  mask = (np.arange(L)[None] < np.array([6, 3, 1, 5])[:, None]).astype(np.float32)
  lp = rng.uniform(-3, 0, (N, L)).astype(np.float32)
  old = lp + (rng.normal(size=(N, L)) * 0.1).astype(np.float32)
  a = rng.normal(size=(N, L)).astype(np.float32)
  behav = old + (rng.normal(size=(N, L)) * 0.8).astype(np.float32)
  corr = jit_call(correction.build, _config("tis"), old, behav, mask)  # one program each, as the step runs them
  w = np.asarray(corr.is_w_NxL)
  assert np.any((w > 0) & (w < 1)) and np.any(w == 2.0)  # truncated and untruncated weights
  kw = dict(eps_low=0.2, eps_high=0.2, agg="token_mean")
  f = lambda x, is_w, beta=0.0, ref=None: losses.policy_loss(x, old, ref, a, corr.mask_NxL, beta=beta,
                                                             is_w_NxL=is_w, **kw)[0]
  g_w = np.asarray(jax.jit(jax.grad(f))(lp, corr.is_w_NxL))
  g_1 = np.asarray(jax.jit(jax.grad(lambda x: f(x, None)))(lp))
  np.testing.assert_allclose(g_w, w * g_1, rtol=1e-5, atol=1e-8)
  # the loss value: −Σ w·f / Σ kept, by hand
  rho = np.exp(np.asarray(lp - old, np.float64))
  an = np.asarray(a, np.float64)
  surr = np.minimum(rho * an, np.clip(rho, 0.8, 1.2) * an)
  assert float(jax.jit(f)(lp, corr.is_w_NxL)) == pytest.approx(-np.sum(w * surr * mask) / mask.sum(), rel=1e-5)
  # the KL term is not weighted: with β > 0 the gradient is w·(surrogate's) + β·(k3's), unweighted
  ref = lp + 0.3
  g_kl = np.asarray(jit_grad(lambda x: f(x, corr.is_w_NxL, 0.1, ref) - f(x, corr.is_w_NxL), lp))
  np.testing.assert_allclose(g_kl, np.asarray(jit_grad(lambda x: 0.1 * losses.aggregate(
      losses.kl_k3(x, ref) * mask, mask, "token_mean"), lp)), rtol=1e-4, atol=1e-8)
  # no gradient through the weight to the log-probs it is built from
  for argnum in (0, 1):
    g = jax.jit(jax.grad(lambda p, b: jnp.sum(correction.build(_config("icepop"), p, b, jnp.asarray(mask)).is_w_NxL),
                         argnums=argnum))(old, behav)
    assert not np.any(np.asarray(g))


# --------------------------------------------------------------------------------- the rollout: exact mode


def _count_forwards(monkeypatch, c) -> int:
  """Training-numerics forwards the rollout traces (reference + old log-probs), counted on an abstract trace."""
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import rl_step
  calls = []
  real = rollout_lib.completion_logprobs
  monkeypatch.setattr(rollout_lib, "completion_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  fn = rollout_lib.make_rollout_fn(c, mcfg, spec, spec.ctx.tokenizer)
  st, _ = rl_step.state_spec(c, mesh, mcfg)
  batch = next(digits.make_batches(c.rl.prompts_per_step, 1, seed=1))
  with sharding.mesh_context(mesh):
    ro = jax.eval_shape(fn, st["params"], st["ref_params"], batch, jax.random.PRNGKey(0))
  assert ro.behav_logp_NxL.shape == ro.old_logp_NxL.shape
  return len(calls)


def test_exact_mode_skips_the_old_logprob_forward(monkeypatch):
  from tests.test_rl_step import TINY1  # one layer: a count of forwards, not their numerics
  c = digits.bench_config(**TINY1)
  assert _count_forwards(monkeypatch, c) == 1  # the reference only: μ serves as π_prox
  assert _count_forwards(monkeypatch, config_lib.override(c, {"rl.rollout_correction": "tis"})) == 2
  assert _count_forwards(monkeypatch, config_lib.override(c, {"sampling.dtype": "bfloat16"})) == 2


# max |log π_sampler − log π_train| per token allowed in fp32 (docs/algorithms.md states the measured values)
EXACT_ATOL = 5e-6


@pytest.mark.parametrize("engine,packing", [("static", False), ("continuous", True)])
def test_sampler_and_training_logprobs_agree_in_fp32(engine, packing):
  """The sampler's recorded log-probs (μ) against the training forward's (π_prox, forced by a correction) on the same
  tokens: equal to fp32 rounding, for the static and continuous engines and the padded and packed passes; and
  the rollout without a correction returns the sampler's own as π_old, bit for bit. Temperature 0.7 with top-k and
  top-p: both score the untruncated softmax(logits / temperature) (DESIGN.md), whatever filter drew the token."""
  from tests.test_rl_step import TINY, _ManyEos, _rollout
  c = digits.bench_config(**TINY)
  # sampling.compaction 1: one decode phase of 16 slots (the unresolved default, config_lib.COMPACTION, compiled 5
  # for the 16 rows, in both rollouts; auto resolves 1 at this length). test_engine holds compaction's log-probs to
  # the static engine's.
  over = {"sampling.engine": engine, "rl.packing": packing, "sampling.temperature": 0.7, "sampling.top_k": 8,
          "sampling.top_p": 0.9, **({"sampling.compaction": 1} if engine == "continuous" else {})}
  tok = _ManyEos(c.model.vocab_size)
  ro = _rollout(c, 1, tokenizer=tok, **over, **{"rl.rollout_correction": "tis"})
  mask = ro.mask_NxL > 0
  assert 0 < mask.sum() < mask.size  # rows of different lengths
  gap = np.abs(ro.old_logp_NxL - ro.behav_logp_NxL)[mask]
  assert gap.max() < EXACT_ATOL, gap.max()
  assert np.all(ro.old_logp_NxL[~mask] == 0) and np.all(ro.behav_logp_NxL[~mask] == 0)
  exact = _rollout(c, 1, tokenizer=tok, **over)
  np.testing.assert_array_equal(exact.old_logp_NxL, exact.behav_logp_NxL)
  np.testing.assert_array_equal(exact.behav_logp_NxL, ro.behav_logp_NxL)  # the samples do not depend on it


def test_bf16_sampler_injects_a_mismatch_the_step_measures():
  """sampling.dtype='bfloat16' beside an fp32 trainer: μ differs from π_prox by bf16 rounding (far above fp32's),
  the step logs it (train/mismatch_kl > 0) and TIS's weights stay within its cap."""
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import families
  from grpo_jax.rl import rl_step
  from tests.test_rl_step import TINY1, _batches, _rollout  # one layer: bf16's gap is far above fp32's at any depth
  c = config_lib.override(digits.bench_config(**TINY1), {"sampling.dtype": "bfloat16", "optim.lr": 1e-3})
  ro = _rollout(c, 1)
  mask = ro.mask_NxL > 0
  gap = np.abs(ro.old_logp_NxL - ro.behav_logp_NxL)[mask]
  assert gap.max() > 10 * EXACT_ATOL, gap.max()
  c = config_lib.override(c, {"rl.rollout_correction": "tis"})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  _, m = step(rl_step.init(c, mesh, mcfg, seed=0), _batches(c, 1)[0])
  m = jax.device_get(m)
  assert 0 < m["train/mismatch_kl"] < 0.1
  assert 0 < m["train/is_weight_max"] <= 2.0 and m["train/is_masked_frac"] == 0.0
  assert abs(m["train/is_weight_mean"] - 1.0) < 0.1 and np.isfinite(m["train/loss"])
