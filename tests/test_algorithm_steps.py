"""Presets through the one-graph step: DAPO's dynamic sampling and overlong term, GDPO's per-term advantages (with
process rewards), GSPO's sequence ratio; the advantage wiring of rl_step against NumPy on hand-built rollouts."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import advantages
from grpo_jax.config import config_lib
from grpo_jax.rl import families
from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.infra import sharding
from grpo_jax.tasks import digits
from tests.jit_call import jit_call

TINY = dict(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=12)


def _np_grpo(r, eps, ddof=1):
  out = np.zeros_like(r, dtype=np.float64)
  for b in range(r.shape[0]):
    if r[b].max() > r[b].min():
      out[b] = (r[b] - r[b].mean()) / (r[b].std(ddof=ddof) + eps)
  return out


def _rollout(r_NxK, w_K, lengths, L, steps=None):
  N = r_NxK.shape[0]
  mask = (np.arange(L)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)
  lp = jnp.asarray(np.where(mask > 0, -1.0, 0.0), jnp.float32)
  fields = dict(r_N=jnp.asarray(r_NxK @ w_K, jnp.float32), terms_NxK=jnp.asarray(r_NxK), term_w_K=jnp.asarray(w_K),
                mask_NxL=jnp.asarray(mask), old_logp_NxL=lp, ref_logp_NxL=lp, steps=steps)
  return rollout_lib.Rollout(**{**dict.fromkeys(rollout_lib.Rollout._fields), **fields}), mask


def test_process_scores_of_wrong_answers_are_logged_apart():
  """The `process` term scores the fraction of right steps whatever the answer ('1 + 1 = 2 ;' padding scores 1):
  train/process_on_incorrect shows it beside train/reward/process. Two groups of G=2: process (1, 0.5 | 1, 0.25),
  accuracy (0, 1 | 0, 0): right rows' mean 0.5, wrong rows' (1 + 1 + 0.25) / 3 = 0.75."""
  acc, proc = np.array([0.0, 1.0, 0.0, 0.0]), np.array([1.0, 0.5, 1.0, 0.25])
  ro, _ = _rollout(np.stack([acc, proc], 1), np.array([1.0, 0.5]), [2, 3, 1, 2], 4)
  ro = ro._replace(per_term={"accuracy": jnp.asarray(acc), "process": jnp.asarray(proc)},
                   lengths_N=jnp.asarray([2, 3, 1, 2]), truncated_N=np.zeros(4, np.float32), fallbacks=jnp.int32(0))
  c = config_lib.override(presets.apply(config_lib.base_config(), "grpo"), {"rl.G": 2})
  m = jit_call(rl_step.rollout_metrics, c, ro, np.zeros((4, 4)))
  assert float(m["train/process_on_correct"]) == pytest.approx(0.5)
  assert float(m["train/process_on_incorrect"]) == pytest.approx(0.75)
  ro = ro._replace(per_term={"accuracy": jnp.asarray(acc), "format": jnp.asarray(proc)})
  assert "train/process_on_incorrect" not in jit_call(rl_step.rollout_metrics, c, ro, np.zeros((4, 4)))


def test_process_without_accuracy_is_warned(monkeypatch):
  from grpo_jax.rl import reward_spec, rewards
  from grpo_jax.tasks import tokenizer as tokenizer_lib
  said = []
  monkeypatch.setattr(rewards.logging, "warning", lambda msg, *a: said.append(msg % a))
  ctx = reward_spec.Context("arith", tokenizer_lib.load())
  rewards.build((("process", 1.0), ("accuracy", 0.0), ("format", 0.2)), ctx)
  assert len(said) == 1 and "padding with '1 + 1 = 2 ;' scores 1" in said[0]
  rewards.build((("process", 0.5), ("accuracy", 1.0)), ctx)
  rewards.build((("process", 0.0), ("format", 1.0)), ctx)  # logged, not trained on
  assert len(said) == 1


def test_compute_advantages_per_term_with_process_rewards_matches_numpy():
  """rl_step.compute_advantages under reward_norm='per_term': per-term group normalisation, weighted sum, batch
  std, broadcast over each row's tokens (length-1 and empty rows included), plus the process advantages."""
  B, G, L, S = 3, 2, 5, 2
  rng = np.random.default_rng(0)
  r = rng.integers(0, 2, size=(B * G, 3)).astype(np.float32)
  r[4:6] = [1.0, 0.0, 1.0]                        # a group where every term is constant
  r[0:2, 0], r[0:2, 1] = [1, 0], [0, 1]           # a group whose weighted sum can be constant
  w = np.array([1.0, 1.0, 0.5], np.float32)
  step_r = rng.normal(size=(B * G, S)).astype(np.float32)
  step_end = np.array([[0, 3]] * (B * G), np.int32)
  step_valid = np.ones((B * G, S), np.int32)
  lengths = [5, 1, 3, 0, 4, 2]
  ro, mask = _rollout(r, w, lengths, L, (jnp.asarray(step_r), jnp.asarray(step_end), jnp.asarray(step_valid)))
  c = config_lib.override(presets.apply(config_lib.base_config(), "gdpo"),
                          {"rl.G": G, "rl.process_weight": 0.5, "sampling.max_new_tokens": L})
  got = np.asarray(jax.jit(lambda ro: rl_step.compute_advantages(c, ro))(ro))
  a = sum(w[k] * _np_grpo(r[:, k].reshape(B, G), 1e-4) for k in range(3)).reshape(-1)
  a = a / (a.std(ddof=1) + 1e-4)
  p = np.asarray(jit_call(advantages.process_advantages, step_r, step_end, step_valid, mask, G=G, std_eps=1e-4, ddof=1))
  want = (a[:, None] + 0.5 * p) * mask
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(got[4:6] == 0.5 * p[4:6] * mask[4:6])  # no outcome signal: only the process part
  # Under 'sum' the group 0 sum (1 + 0·…, 0 + 1·…) differs from GDPO's: the wiring really switches.
  c_sum = config_lib.override(c, {"rl.reward_norm": "sum", "rl.algo": "grpo", "rl.preset": "grpo"})
  got_sum = np.asarray(jit_call(rl_step.compute_advantages, c_sum, ro))
  want_sum = (_np_grpo((r @ w).reshape(B, G), 1e-4).reshape(-1)[:, None] + 0.5 * p) * mask
  np.testing.assert_allclose(got_sum, want_sum, rtol=1e-5, atol=1e-6)


def test_signal_rewards_rule_for_dynamic_sampling_and_zero_std_fraction():
  rl_sum = presets.apply(config_lib.base_config(), "grpo").rl
  rl_term = presets.apply(config_lib.base_config(), "gdpo").rl
  terms = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]], np.float32)  # group 0: sum constant, terms vary
  w = np.array([1.0, 1.0], np.float32)
  r = terms @ w
  const = lambda rl, r, terms, w: advantages.group_is_constant(rollout_lib.signal_rewards(rl, r, terms, w, 2))
  const_sum, const_term = jit_call(const, rl_sum, r, terms, w), jit_call(const, rl_term, r, terms, w)
  assert const_sum.tolist() == [True, True] and const_term.tolist() == [False, True]
  # A weight-0 term never makes a group count: it is multiplied out.
  assert jit_call(const, rl_term, r, terms, np.array([1.0, 0.0], np.float32)).tolist() == [False, True]
  # ... also where it is the group's only varying term (group 0 above varies in the weight-1 term as well, so it could
  # not tell weighted terms from unweighted ones): terms (1, 0) and (1, 1), weights (1, 0): constant
  only = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
  assert jit_call(const, rl_term, only.sum(1), only, np.array([1.0, 0.0], np.float32)).tolist() == [True]


def _step(name, spec=None, **over):
  c = presets.apply(digits.bench_config(**TINY), name)
  c = config_lib.override(c, {"optim.lr": 1e-3, **over})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = spec or digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  return c, step, rl_step.init(c, mesh, mcfg, seed=0)


def _batch(c, n_prompts):
  b = next(digits.make_batches(n_prompts, 1, seed=1))
  b["answer_ids_NxA"][:, 1:] = -1  # single digits: a random model hits them, so groups vary
  return b


def test_dapo_step_keeps_groups_updates_and_adds_the_overlong_term():
  """DAPO: 2× prompts drawn, groups with reward variance kept first; the step is NOT skipped (the reward status,
  one per term, must not be gathered like a row); the overlong penalty enters the reward."""
  c, step, state = _step("dapo")
  assert c.rl.dynamic_sampling and round(c.rl.overlong_frac * c.sampling.max_new_tokens) == 2
  state, m = step(state, _batch(c, c.rl.prompts_per_step * c.rl.oversample))
  assert int(m["train/skipped_updates"]) == 0 and int(state["step"]) == 1
  assert 0 < int(m["train/dynamic_sampling_kept"]) <= c.rl.prompts_per_step
  assert m["samples/tokens_NxL"].shape[0] == min(c.train.num_samples_logged, c.rl.prompts_per_step * c.rl.G)
  # Completions run to L = 12 tokens here (truncated): the last 2 tokens of the window give −1 each.
  assert float(m["train/reward_mean"]) < float(m["train/reward/contains"])


def test_gdpo_and_gspo_steps_run_and_move_the_policy():
  for name in ("gdpo", "gspo"):
    c, step, state = _step(name)
    p0 = jax.device_get(state["params"])
    state, m = step(state, _batch(c, c.rl.prompts_per_step))
    assert int(m["train/skipped_updates"]) == 0, name
    assert np.isfinite(float(m["train/loss"])) and float(m["train/grad_norm"]) > 0, name
    moved = max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(jax.device_get(
        state["params"]))))
    assert moved > 0, name
    assert "train/clip_frac_dual" in m


def test_a_step_built_from_half_a_preset_is_refused():
  """Code that builds a step without validate.py (ablations, tests) gets the same one-line refusal."""
  c = digits.bench_config(**TINY)
  c.rl.algo = "dapo"
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  with pytest.raises(config_lib.ConfigError, match="holds the 'grpo' preset's settings"):
    rl_step.build_step(c, mcfg, spec, spec.ctx.tokenizer)


@pytest.mark.parametrize("name", [n for n in presets.names() if n != "ppo"])
def test_scalar_knobs_trace_through_every_preset_step(name):
  """β, ε_low/ε_high (GSPO's too), the std ε, dual_clip and kl_clamp reach the step only through arithmetic: the
  step traces with each of them a tracer (what a vmapped sweep substitutes, seeds.with_values) for every preset."""
  from grpo_jax.studies import vmapped_runs as seeds_lib
  c = presets.apply(digits.bench_config(**TINY), name)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  state, _ = rl_step.state_spec(c, mesh, mcfg)  # abstract: nothing allocated
  batch = _batch(c, c.rl.prompts_per_step * (c.rl.oversample if c.rl.dynamic_sampling else 1))
  keys = seeds_lib.TRACEABLE_RL_KEYS
  assert {"rl.dual_clip", "rl.kl_clamp", "rl.eps_low", "rl.eps_high", "rl.beta", "rl.std_eps"} <= set(keys)

  def step(values, state, batch):
    return rl_step.build_step(seeds_lib.with_values(c, dict(zip(keys, values))), mcfg, spec,
                              spec.ctx.tokenizer)(state, batch)
  with sharding.mesh_context(mesh):
    out, m = jax.eval_shape(step, [jnp.float32(0.1)] * len(keys), state, batch)
  assert m["train/loss"].shape == ()


@pytest.mark.parametrize("name", ["rloo", "reinforce_pp", "reinforce_pp_baseline", "grpo_k3_in_reward"])
def test_kl_in_the_reward_is_wired_as_each_estimator_defines_it(name):
  """rl_step.compute_advantages with the KL in the reward, against NumPy on a hand-built rollout (ragged rows, a
  one-token row, an interior masked token, a constant-reward group): RLOO subtracts β·Σ_t k1 from each answer's
  reward before its leave-one-out baseline; REINFORCE++ puts −β·k1 on every token and r at the last valid one,
  returns-to-go, whitening over the batch's valid tokens (population variance, rsqrt(var + 1e-8)); -baseline first
  subtracts the group mean of r; GRPO with kl_in='reward' folds β·Σ_t k3 (clamped at kl_clamp = 10) into r before
  its group normalisation. The loss then carries no KL (β = 0 in policy_loss_kwargs)."""
  B, G, L = 2, 3, 5
  rng = np.random.default_rng(0)
  mask = (np.arange(L)[None] < np.array([5, 1, 3, 4, 2, 5])[:, None]).astype(np.float64)
  mask[0, 2] = 0.0
  # log-probs off the mask are garbage, not 0 (as padding can be): the KL must be masked where it is computed
  old = rng.uniform(-3, -0.1, (B * G, L))
  ref = old + rng.normal(size=(B * G, L)) * 1.5
  r = np.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
  preset, over = (("grpo", {"rl.kl_in": "reward", "rl.beta": 0.1}) if name == "grpo_k3_in_reward" else (name, {}))
  c = config_lib.override(presets.apply(config_lib.base_config(), preset),
                          {"rl.G": G, "sampling.max_new_tokens": L, **over})
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  fields = dict(r_N=f32(r), terms_NxK=f32(r[:, None]), term_w_K=f32([1.0]), mask_NxL=f32(mask),
                old_logp_NxL=f32(old), ref_logp_NxL=f32(ref), per_term={})
  ro = rollout_lib.Rollout(**{**dict.fromkeys(rollout_lib.Rollout._fields), **fields})
  got = np.asarray(jit_call(rl_step.compute_advantages, c, ro))
  beta, v = c.rl.beta, mask > 0
  k1 = (old - ref) * mask
  last = np.zeros_like(mask)
  for i in range(B * G):
    last[i, np.nonzero(mask[i])[0][-1]] = 1.0

  def whiten_returns(outcome):
    ret = np.cumsum((-beta * k1 + outcome[:, None] * last)[:, ::-1], axis=1)[:, ::-1]
    return (ret - ret[v].mean()) / np.sqrt(ret[v].var() + 1e-8) * mask

  if name == "rloo":
    rr = (r - beta * k1.sum(1)).reshape(B, G)
    want = (rr - (rr.sum(1, keepdims=True) - rr) / (G - 1)).reshape(-1)[:, None] * mask
  elif name == "reinforce_pp":
    want = whiten_returns(r)
  elif name == "reinforce_pp_baseline":
    want = whiten_returns((r.reshape(B, G) - r.reshape(B, G).mean(1, keepdims=True)).reshape(-1))
  else:
    d = ref - old
    rr = (r - beta * (np.minimum(np.exp(d) - d - 1, 10.0) * mask).sum(1)).reshape(B, G)
    want = _np_grpo(rr, 1e-4).reshape(-1)[:, None] * mask
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
  assert rl_step.policy_loss_kwargs(c)["beta"] == 0.0
