"""PPO with a critic: one step runs for both critic layouts, the critic has its own optimizer state and moves; its
advantages, returns, loss and gradients against NumPy."""
import jax
import numpy as np
import pytest

from grpo_jax.rl import families
from grpo_jax.model import model as model_lib
from grpo_jax.rl import ppo_step
from grpo_jax.config import presets
from grpo_jax.infra import sharding
from grpo_jax.tasks import digits
from tests import noise
from tests.jit_call import jit_call


def _config(mode: str, **rl):
  c = presets.apply(digits.bench_config(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=2, G=4, L=8),
                    "ppo")
  c.ppo.critic, c.optim.lr = mode, 1e-3
  c.rl.update(rl)
  return c


@pytest.fixture(scope="module")
def full_step():
  """The separate-critic PPO step at full length in one rollout chunk (no early exit, one training length), on the
  `_ManyEos` tokenizer: the chunked test's reference, and the step that test_ppo_step_updates_policy_and_critic's
  separate case runs (one program to trace and compile for both: the claims there hold for any tokenizer and any
  chunking)."""
  c = _config("separate", rollout_chunks=1, train_buckets=1)
  c.sampling.exit_chunk = 0
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  step = families.make_step(c, mesh, mcfg, digits.reward_spec(64), _ManyEos(64))
  return c, mesh, mcfg, step


@pytest.mark.parametrize("mode", ["separate", "head"])
def test_ppo_step_updates_policy_and_critic(mode, request):
  if mode == "separate":
    c, mesh, mcfg, step = request.getfixturevalue("full_step")
  else:
    c = _config(mode)
    c.ppo.critic_lr = 1e-2
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
    mcfg = model_lib.ModelConfig.from_config(c.model)
    spec = digits.reward_spec(64)
    step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  state = ppo_step.init(c, mesh, mcfg)
  if mode == "separate":
    # The value network starts from the policy's weights: twice the trainable parameters.
    np.testing.assert_array_equal(state["critic_params"]["body"]["embed"]["embedding"],
                                  state["params"]["embed"]["embedding"])
  # The critic has its own optimizer state, at its own learning rate (the separate case: the config's default 1e-4).
  assert float(state["opt_state"].hyperparams["learning_rate"]) == pytest.approx(1e-3)
  assert float(state["critic_opt_state"].hyperparams["learning_rate"]) == pytest.approx(
      1e-2 if mode == "head" else 1e-4)
  v0 = np.asarray(state["critic_params"]["v_head"]["kernel"]).copy()
  batch = next(digits.make_batches(2, 1, seed=3))
  batch["answer_ids_NxA"][:, 1:] = -1
  state, m = step(state, batch)
  state, m = step(state, batch)
  assert np.isfinite(float(m["train/value_loss"])) and float(m["train/value_loss"]) > 0
  assert not np.array_equal(v0, np.asarray(state["critic_params"]["v_head"]["kernel"]))
  assert abs(float(m["train/ratio_mean"]) - 1.0) < 1e-5  # μ = 1, one minibatch: on-policy
  assert step.traces() == 1


class _ManyEos(digits.Tokenizer):
  """EOS = every id but the pad and the digits: the random model ends its rows after one or two tokens."""
  eos_ids = (digits.EOS,) + tuple(range(12, 64))


def _perturbed(params):
  """params + 0.05·N(0, 1) on every leaf: one compiled program, one normal draw over all leaves (tests/noise.py)."""
  return noise.perturbed(params, jax.random.PRNGKey(7), 0.05)


def test_ppo_in_chunks_with_early_exit_and_buckets_equals_full_length(full_step):
  """2 rollout row chunks whose decodes exit early (sampling.exit_chunk=2), the critic's old values in those chunks,
  and both on the shorter of rl.train_buckets=2 lengths (4, 8 at L=8) covering the batch's longest completion (2
  lengths: the fewest that let the update run below L; each is a forward+backward of policy and critic to compile):
  the same samples and losses as one chunk at full length (fp32 reduction order), and the same params (policy and
  separate critic) within 2e-5, under 1e-3 of how far training moved them: AdamW moves a weight whose gradient is
  at rounding level by up to lr·g/ε ≈ 1e-5 (test_rl_step.py)."""
  runs = {}
  for name in ("full", "fast"):
    if name == "full":
      c, mesh, mcfg, step = full_step
    else:
      c = _config("separate", rollout_chunks=2, train_buckets=2)
      c.sampling.exit_chunk = 2
      mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
      mcfg = model_lib.ModelConfig.from_config(c.model)
      step = families.make_step(c, mesh, mcfg, digits.reward_spec(64), _ManyEos(64))
    state = ppo_step.init(c, mesh, mcfg)
    # a policy away from its reference: the per-token KL penalty (the only reward a random model earns here) is a
    # real signal, not fp noise that whitening would blow up to O(1) advantages
    state = dict(state, params=_perturbed(state["params"]))
    ms, p0 = [], jax.device_get({k: state[k] for k in ("params", "critic_params")})
    for batch in digits.make_batches(2, 2, seed=3):
      state, m = step(state, batch)
      ms.append(jax.device_get(m))
    runs[name] = (ms, jax.device_get(state), step, p0)
  (m1, s1, step1, p0), (m3, s3, step3, _) = runs["full"], runs["fast"]
  assert [int(m["train/train_len"]) for m in m1] == [8, 8]
  lens = [int(m["train/train_len"]) for m in m3]
  assert min(lens) < 8 and lens == [min(s for s in (4, 8) if s >= int(m["train/completion_len_max"])) for m in m3]
  assert [int(m["train/decode_steps"]) for m in m1] == [7, 7] and min(int(m["train/decode_steps"]) for m in m3) < 7
  assert step1.traces() == step3.traces() == 1  # the shared step too, whichever test ran it first
  assert min(float(m["train/kl"]) for m in m1) > 1e-3
  for a, b in zip(m1, m3):
    np.testing.assert_array_equal(a["samples/tokens_NxL"], b["samples/tokens_NxL"])
    # the on-policy surrogate is a sum of O(1) whitened advantages cancelling to ~0: compare it absolutely
    np.testing.assert_allclose(b["train/loss"], a["train/loss"], rtol=0, atol=1e-6)
    assert float(a["train/value_loss"]) > 0
    for k in ("train/value_loss", "train/grad_norm"):
      np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-7, err_msg=k)
  l2 = lambda a, b: np.sqrt(sum(np.sum((np.float64(x) - y) ** 2) for x, y in zip(jax.tree.leaves(a),
                                                                                jax.tree.leaves(b))))
  for k in ("params", "critic_params"):
    for a, b in zip(jax.tree.leaves(s1[k]), jax.tree.leaves(s3[k])):
      np.testing.assert_allclose(b, a, rtol=0, atol=2e-5)
    assert l2(s3[k], s1[k]) < 1e-3 * l2(s1[k], p0[k]), (k, l2(s3[k], s1[k]), l2(s1[k], p0[k]))


def test_ppo_outcome_reward_lands_on_last_valid_token_of_multi_turn_rows():
  """The outcome reward sits on each row's LAST valid token, also when the mask has interior zeros (a multi-turn
  row's observation tokens, tools.env). With γ = λ = 1, V = 0 and β = 0 every valid token's return is the outcome
  (hand-computed); the old placement (mask.sum − 1) put it on an observation token (row 1: lost) or mid-row (row 2)."""
  from types import SimpleNamespace as NS
  import jax.numpy as jnp
  cfg = NS(rl=NS(beta=0.0, kl_estimator="k1", kl_clamp=0.0), ppo=NS(gamma=1.0, lam=1.0))
  mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 1, 1]], np.float32)
  ro = NS(mask_NxL=jnp.asarray(mask), ref_logp_NxL=None, old_logp_NxL=None, r_N=jnp.asarray([2.0, 3.0, -1.0]))
  # one program, as the PPO step runs it (eagerly each op of the GAE scan compiled on its own)
  _, returns = jit_call(ppo_step.advantages_and_returns, cfg, ro, np.zeros(mask.shape, np.float32))
  np.testing.assert_allclose(np.asarray(returns), mask * np.array([[2.0], [3.0], [-1.0]]), atol=1e-6)


def test_advantages_returns_and_loss_match_numpy():
  """PPO's per-token pieces against a NumPy version written from OpenRLHF's / verl's definitions, on a hand-built
  rollout with ragged rows, a one-token row and an interior masked (observation) token: reward −β·k1(π_old, π_ref)
  per token plus the outcome at the last valid token; GAE(γ = 0.9, λ = 0.8) skipping masked tokens; returns = GAE +
  V; advantages whitened over valid tokens (population variance, rsqrt(var + 1e-8)); then the objective (μ = 2:
  the ratio against the recorded π_old) = clipped surrogate with dual clip + vf_coef · ½·max((V − R)², (V_clip −
  R)²), token means, and its gradients in V and log π against central differences of the NumPy loss."""
  from grpo_jax.config import config_lib
  from grpo_jax.rl import rollout as rollout_lib
  rng = np.random.default_rng(0)
  N, L = 6, 5
  mask = (np.arange(L)[None] < np.array([5, 1, 3, 4, 2, 5])[:, None]).astype(np.float64)
  mask[0, 2] = 0.0
  old = rng.uniform(-3, -0.1, (N, L)) * mask
  ref = (old + rng.normal(size=(N, L)) * 0.5) * mask
  r = np.array([1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
  V = rng.normal(size=(N, L)) * mask
  c = config_lib.override(presets.apply(config_lib.base_config(), "ppo"),
                          {"rl.G": 3, "sampling.max_new_tokens": L, "ppo.gamma": 0.9, "ppo.lam": 0.8, "rl.mu": 2})
  f32 = lambda x: jax.numpy.asarray(x, jax.numpy.float32)
  fields = dict(r_N=f32(r), mask_NxL=f32(mask), old_logp_NxL=f32(old), ref_logp_NxL=f32(ref), per_term={})
  ro = rollout_lib.Rollout(**{**dict.fromkeys(rollout_lib.Rollout._fields), **fields})
  adv, ret = (np.asarray(x) for x in jit_call(ppo_step.advantages_and_returns, c, ro, f32(V)))  # as the step runs it

  beta, gamma, lam = c.rl.beta, 0.9, 0.8
  rew = -beta * (old - ref) * mask
  A, R = np.zeros((N, L)), np.zeros((N, L))
  for i in range(N):
    valid = np.nonzero(mask[i])[0]
    rew[i, valid[-1]] += r[i]
    next_v = next_a = 0.0
    for t in valid[::-1]:
      next_a = rew[i, t] + gamma * next_v - V[i, t] + gamma * lam * next_a
      next_v = V[i, t]
      A[i, t], R[i, t] = next_a, next_a + V[i, t]
  v = mask > 0
  An = (A - A[v].mean()) / np.sqrt(A[v].var() + 1e-8) * mask
  np.testing.assert_allclose(ret, R, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(adv, An, rtol=1e-5, atol=1e-5)

  lp = old + rng.normal(size=(N, L)) * 0.3 * mask
  v_new = V + rng.normal(size=(N, L)) * 0.4 * mask
  eps, vclip, vf, dual = c.rl.eps_low, c.ppo.value_clip, c.ppo.vf_coef, c.rl.dual_clip

  def np_loss(vv, ll):
    rho = np.exp(ll - old)
    s = np.minimum(rho * An, np.clip(rho, 1 - eps, 1 + c.rl.eps_high) * An)
    s = np.where(An < 0, np.maximum(s, dual * An), s)
    v_c = V + np.clip(vv - V, -vclip, vclip)
    return (-(s * mask).sum() + vf * 0.5 * (np.maximum((vv - R) ** 2, (v_c - R) ** 2) * mask).sum()) / mask.sum()

  mb = dict(old_logp_NxL=f32(old), adv_NxL=f32(An), mask_NxL=f32(mask), old_v_NxL=f32(V), returns_NxL=f32(R))
  obj = ppo_step.make_objective(c)
  f = lambda vv, ll: obj((vv, ll, jax.numpy.zeros_like(ll)), mb)[0]
  loss, (gv, gl) = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(f32(v_new), f32(lp))
  assert float(loss) == pytest.approx(np_loss(v_new, lp), rel=1e-5)
  h, want_v, want_l = 1e-6, np.zeros((N, L)), np.zeros((N, L))
  for i, t in zip(*np.nonzero(mask)):
    d = np.zeros((N, L))
    d[i, t] = h
    want_v[i, t] = (np_loss(v_new + d, lp) - np_loss(v_new - d, lp)) / (2 * h)
    want_l[i, t] = (np_loss(v_new, lp + d) - np_loss(v_new, lp - d)) / (2 * h)
  np.testing.assert_allclose(np.asarray(gv), want_v, atol=1e-6)
  np.testing.assert_allclose(np.asarray(gl), want_l, atol=1e-6)


def test_ppo_run_rows_keep_the_metrics_contract(tmp_path):
  """A PPO run (critic) through train.run_rl, tiny: its metrics.jsonl as docs/metrics.md says
  (tests/metrics_contract.py), train/value_loss in every train row, and no GRPO-only advantage shares (GAE is not
  a group estimator)."""
  from grpo_jax.config import config_lib
  from grpo_jax.run import train
  from tests import metrics_contract
  c = config_lib.load_config("configs/grpo_arith.py", "small,algo=ppo")
  c = config_lib.override(c, {
      "sft.steps": 0, "train.steps": 2, "train.ckpt_every": 2, "train.eval_every": 2, "train.plot_every": 0,
      "train.sample_every": 0, "eval.size": 8, "eval.batch": 8, "eval.n_samples": 2, "eval.pass_k": (1, 2),
      "sampling.max_new_tokens": 8, "task.train_size": 32, "task.test_size": 8, "log.tensorboard": False,
      "log.plots": False, "model.hidden": 32, "model.layers": 1, "model.inter": 64, "rl.prompts_per_step": 2})
  train.run_rl(c, str(tmp_path))
  rows = metrics_contract.check_run(str(tmp_path))
  trained = [r for r in rows if "train/loss" in r]
  assert [r["step"] for r in trained] == [1, 2] and all("train/value_loss" in r for r in trained)
  assert not any(k.startswith("train/adv_share/") for r in rows for k in r)
  assert [r["step"] for r in rows if "perf/eval_time_s" in r] == [0, 2]
