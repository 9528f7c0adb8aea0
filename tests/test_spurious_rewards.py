"""Table k's reward terms (`random`, `incorrect`) and table l's one-shot toy batches: hand-computed values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.rl import rewards
from grpo_jax.rl import reward_spec
from grpo_jax.tasks import digits
from grpo_jax.tasks import tokenizer as tokenizer_lib

M32 = 0xFFFFFFFF
PHI = 0x9E3779B9


def py_fmix32(h: int) -> int:
  """MurmurHash3's finaliser on Python ints, written from its definition (independent of the JAX code)."""
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & M32
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & M32
  return h ^ (h >> 16)


def py_uniform(tokens, mask, key) -> float:
  acc = 0
  for t, (tok, m) in enumerate(zip(tokens, mask)):
    if m:
      acc = (acc + py_fmix32((((tok + 1) * PHI) & M32) ^ py_fmix32((t + PHI) & M32))) & M32
  return (py_fmix32(key ^ acc) >> 8) / 2.0 ** 24


def test_fmix32_known_values():
  got = np.asarray(reward_spec.fmix32(jnp.asarray([0, 1, 0xDEADBEEF], jnp.uint32)))
  assert got.tolist() == [0, 0x514E28B7, py_fmix32(0xDEADBEEF)]  # fmix32(1): MurmurHash3's published value


def test_sample_uniform_matches_the_python_hash():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 500, (6, 5)).astype(np.int32)
  mask = (np.arange(5)[None, :] < np.asarray([5, 3, 1, 0, 5, 4])[:, None]).astype(np.int32)
  keys = rng.integers(0, 2**32, 6, dtype=np.uint64).astype(np.uint32)
  got = np.asarray(reward_spec.sample_uniform(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(keys)))
  want = [py_uniform(t.tolist(), m.tolist(), int(k)) for t, m, k in zip(tokens, mask, keys)]
  np.testing.assert_array_equal(got, np.asarray(want, np.float32))
  # padding does not count: the same completion with other tokens past its end hashes the same
  tokens2 = np.where(mask > 0, tokens, 7)
  np.testing.assert_array_equal(
      got, np.asarray(reward_spec.sample_uniform(jnp.asarray(tokens2), jnp.asarray(mask), jnp.asarray(keys))))


def test_sample_keys_are_per_row_and_per_rng():
  k = jax.random.PRNGKey(3)
  a, b = np.asarray(reward_spec.sample_keys(k, 64)), np.asarray(reward_spec.sample_keys(k, 64))
  np.testing.assert_array_equal(a, b)  # reproducible
  assert len(set(a.tolist())) == 64  # one key per row (fmix32 is a bijection of distinct inputs)
  c = np.asarray(reward_spec.sample_keys(jax.random.PRNGKey(4), 64))
  assert (a != c).mean() > 0.9  # another step's (or run's) rng: other keys
  salt = int(jax.random.bits(jax.random.fold_in(k, 0x5A17), (), jnp.uint32))
  assert a[0] == py_fmix32((salt + PHI) & M32) and a[5] == py_fmix32((salt + 6 * PHI) & M32)


def test_random_reward_is_a_fixed_rate_coin_independent_of_the_answer():
  n = 20_000
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(2, 12, (n, 3)), jnp.int32)
  mask = jnp.ones((n, 3), jnp.int32)
  batch = {reward_spec.SAMPLE_KEY: reward_spec.sample_keys(jax.random.PRNGKey(0), n)}
  for rate in (0.0, 0.3, 0.5, 1.0):
    r = np.asarray(reward_spec.random_reward(tokens, mask, batch, reward_spec.Context("digits", None,
                                                                                        random_rate=rate)).r_N)
    assert set(np.unique(r).tolist()) <= {0.0, 1.0}
    assert abs(r.mean() - rate) <= 4 * np.sqrt(rate * (1 - rate) / n) + 1e-9, (rate, r.mean())
  # independent of whether the first token is some "answer": the rate is the same on both sides
  r = np.asarray(reward_spec.random_reward(tokens, mask, batch, reward_spec.Context("digits", None)).r_N)
  hit = np.asarray(tokens[:, 0]) == 5
  assert abs(r[hit].mean() - r[~hit].mean()) < 0.05
  with pytest.raises(ValueError, match=reward_spec.SAMPLE_KEY):
    reward_spec.random_reward(tokens, mask, {}, reward_spec.Context("digits", None))


def test_incorrect_rewards_a_wrong_well_formed_answer_only():
  tok = tokenizer_lib.load()
  texts = ["<think> 3 + 4 = 7 </think> <answer> 7 </answer>",   # right
           "<think> 3 + 4 = 8 </think> <answer> 8 </answer>",   # wrong, well formed -> 1
           "<think> 3 + 4 </think> <answer> seven </answer>",   # no number -> 0
           "the answer is 8"]                                   # no format -> 0
  L = 32
  tokens = np.zeros((4, L), np.int32)
  mask = np.zeros((4, L), np.int32)
  for i, t in enumerate(texts):
    ids = tok.encode(t) + [tok.eos_id]
    tokens[i, :len(ids)], mask[i, :len(ids)] = ids, 1
  ctx = reward_spec.Context("arith", tok)
  batch = {"answer_N": jnp.full((4,), 7, jnp.int32)}
  # both terms in one jitted program, as the rollout runs them (op by op, the in-graph parsers were ~200 eager ops,
  # each its own tiny compile)
  inc_fn, acc_fn = rewards.REGISTRY["incorrect"](ctx), rewards.REGISTRY["accuracy"](ctx)
  inc, acc = jax.jit(lambda t, m, b: (inc_fn(t, m, b, ctx).r_N, acc_fn(t, m, b, ctx).r_N))(tokens, mask, batch)
  assert np.asarray(inc).tolist() == [0.0, 1.0, 0.0, 0.0]
  assert np.asarray(acc).tolist() == [1.0, 0.0, 0.0, 0.0]
  with pytest.raises(config_lib.ConfigError, match="the 'incorrect' term parses answers in-graph"):
    rewards.REGISTRY["incorrect"](reward_spec.Context("gsm8k", tok))


def test_toy_incorrect_and_random_terms():
  spec = digits.toy_reward_spec((("incorrect", 1.0), ("random", 1.0)), 32, random_rate=1.0)
  d = digits.DIGIT0
  tokens = jnp.asarray([[d + 5, digits.EOS], [d + 4, digits.EOS], [digits.FILLER0, digits.EOS], [d + 4, 0]],
                       jnp.int32)
  mask = jnp.asarray([[1, 1], [1, 1], [1, 1], [0, 0]], jnp.int32)
  batch = {"answer_N": jnp.full((4,), d + 5, jnp.int32), reward_spec.SAMPLE_KEY: jnp.arange(4, dtype=jnp.uint32)}
  inc, rand = jax.jit(lambda t, m, b: tuple(f(t, m, b, spec.ctx).r_N for f in spec.fns))(tokens, mask, batch)
  assert np.asarray(inc).tolist() == [0.0, 1.0, 0.0, 0.0]  # right / wrong digit / no digit / empty
  assert np.asarray(rand).tolist() == [1.0] * 4  # rate 1


def test_toy_one_shot_batches():
  pairs = digits.train_set()
  b = next(digits.toy_batches(8, seed=0, indices=(4,)))
  np.testing.assert_array_equal(b["prompt_NxP"], np.repeat(pairs["prompt_NxP"][4:5], 8, axis=0))
  assert (b["answer_N"] == pairs["answer_N"][4]).all()
  seen = np.concatenate([next(digits.toy_batches(8, seed=s, indices=(1, 9)))["answer_N"] for s in range(4)])
  assert set(seen.tolist()) == {int(pairs["answer_N"][1]), int(pairs["answer_N"][9])}
  with pytest.raises(config_lib.ConfigError, match="config.task.train_indices"):
    next(digits.toy_batches(8, seed=0, indices=(15,)))


def test_random_term_through_the_rollout_is_the_hash_of_each_row_and_replays():
  """In the RL rollout each row's `random` score is sample_uniform(its completion, sample_keys(the rollout rng)) <
  rate, exactly; the same rng replays the same scores (a resumed step), another rng draws others."""
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import auto
  from grpo_jax.rl import rl_step
  from grpo_jax.rl import rollout as rollout_lib
  c = digits.bench_config(hidden=32, layers=1, heads=2, kv=1, inter=64, vocab=64, prompts=8, G=8, L=6)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  c, _ = auto.resolve_here(c, mesh, log=False)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.toy_reward_spec((("random", 1.0),), c.model.vocab_size, random_rate=0.25)
  rollout_fn = jax.jit(rollout_lib.make_rollout_fn(c, mcfg, spec, spec.ctx.tokenizer))
  state = rl_step.init(c, mesh, mcfg, seed=0)
  batch = next(iter(digits.make_batches(c.rl.prompts_per_step, 1, seed=1)))
  ref = rl_step.reference_params(c, state)
  r1, r2 = (rollout_fn(state["params"], ref, batch, jax.random.PRNGKey(k)) for k in (7, 8))
  for ro, k in ((r1, 7), (r2, 8)):
    u = reward_spec.sample_uniform(ro.tokens_NxL, ro.mask_NxL, reward_spec.sample_keys(jax.random.PRNGKey(k), 64))
    np.testing.assert_array_equal(np.asarray(ro.per_term["random"]), np.asarray(u < 0.25, np.float32))
  again = rollout_fn(state["params"], ref, batch, jax.random.PRNGKey(7))
  np.testing.assert_array_equal(np.asarray(again.r_N), np.asarray(r1.r_N))
  assert (np.asarray(r1.r_N) != np.asarray(r2.r_N)).any()
  assert 0 < float(np.asarray(r1.r_N).mean()) < 0.6  # 64 coins at 0.25: 0 or > 0.6 has probability < 1e-6
