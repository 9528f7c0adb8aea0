"""PPO with a critic: one step runs for both critic layouts, the critic has its own optimizer state and moves."""
import jax
import numpy as np
import pytest

from grpo_jax import families
from grpo_jax import model as model_lib
from grpo_jax import ppo_step
from grpo_jax import presets
from grpo_jax import sharding
from grpo_jax.tasks import digits


def _setup(mode, chunks=1):
  c = presets.apply(digits.bench_config(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=2, G=4, L=8),
                    "ppo")
  c.ppo.critic = mode
  c.optim.lr = 1e-3
  c.ppo.critic_lr = 1e-2
  c.rl.rollout_chunks = chunks
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(64)
  return c, mesh, mcfg, families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)


@pytest.fixture(scope="module")
def separate_step():
  """The separate-critic step in one rollout chunk: both tests below run it (compiled once)."""
  return _setup("separate")


def _batch():
  batch = next(digits.make_batches(2, 1, seed=3))
  batch["answer_ids_NxA"][:, 1:] = -1
  return batch


@pytest.mark.parametrize("mode", ["separate", "head"])
def test_ppo_step_updates_policy_and_critic(mode, request):
  c, mesh, mcfg, step = request.getfixturevalue("separate_step") if mode == "separate" else _setup(mode)
  state = ppo_step.init(c, mesh, mcfg)
  if mode == "separate":
    # The value network starts from the policy's weights: twice the trainable parameters.
    np.testing.assert_array_equal(state["critic_params"]["body"]["embed"]["embedding"],
                                  state["params"]["embed"]["embedding"])
  # The critic has its own optimizer state, at its own learning rate.
  assert float(state["opt_state"].hyperparams["learning_rate"]) == pytest.approx(1e-3)
  assert float(state["critic_opt_state"].hyperparams["learning_rate"]) == pytest.approx(1e-2)
  v0 = np.asarray(state["critic_params"]["v_head"]["kernel"]).copy()
  batch = _batch()
  state, m = step(state, batch)
  state, m = step(state, batch)
  assert np.isfinite(float(m["train/value_loss"])) and float(m["train/value_loss"]) > 0
  assert not np.array_equal(v0, np.asarray(state["critic_params"]["v_head"]["kernel"]))
  assert abs(float(m["train/ratio_mean"]) - 1.0) < 1e-5  # μ = 1, one minibatch: on-policy
  assert step.traces() == 1


def test_ppo_step_in_rollout_chunks_equals_one_chunk(separate_step):
  """The critic's value forward runs in the rollout's row chunks too: 2 chunks give the same samples, values and
  update as one (fp32 rounding)."""
  out = []
  for c, mesh, mcfg, step in (separate_step, _setup("separate", chunks=2)):
    state, m = step(ppo_step.init(c, mesh, mcfg), _batch())
    out.append((jax.device_get(m), jax.device_get(state)))
  (m1, s1), (m2, s2) = out
  np.testing.assert_array_equal(m1["samples/tokens_NxL"], m2["samples/tokens_NxL"])
  for k in ("train/value_loss", "train/loss", "train/grad_norm"):
    np.testing.assert_allclose(m1[k], m2[k], rtol=1e-5, atol=1e-7)
  assert float(m1["train/value_loss"]) > 0
  for a, b in zip(jax.tree.leaves(s1["critic_params"]), jax.tree.leaves(s2["critic_params"])):
    np.testing.assert_allclose(a, b, atol=1e-6)
