"""Sampler tests: inverse-CDF exactness, supports of top-k/top-p, EOS masking, log-probs against NumPy, greedy,
determinism, vmap, and 8 simulated devices with the batch sharded (in a subprocess)."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.model import model as M
from grpo_jax.rollout import sampling as S
from tests.jit_call import jit_call

MCFG = M.ModelConfig(vocab_size=64, hidden=32, layers=2, heads=4, kv_heads=2, inter=64, max_len=32)
PROMPT = np.array([[5, 9, 11, 3, 7], [0, 0, 4, 8, 2], [0, 0, 0, 0, 13], [0, 6, 1, 17, 5]], np.int32)
PMASK = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 1, 1]], np.int32)
L = 10

sample = jax.jit(S.sample, static_argnums=(0, 5))
forward = jax.jit(M.forward, static_argnums=0)


def random_params(mcfg, seed, emb_std=0.5, std=0.15):
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(lambda: M.init_params(mcfg, jax.random.PRNGKey(0)))

  def fill(path, x):  # cast to float32 by NumPy: jnp's float64 -> float32 cast compiles a program per leaf shape
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      return jnp.asarray((1.0 + 0.1 * rng.standard_normal(x.shape)).astype(np.float32))
    return jnp.asarray(((emb_std if "embedding" in name else std) * rng.standard_normal(x.shape)).astype(np.float32))

  return jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.fixture(scope="module")
def params():
  return random_params(MCFG, 0)


def np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def rerun_logits(params, prompt, pmask, tokens):
  """Full-forward logits that predict each generated token: [rows, L, V]."""
  full = np.concatenate([prompt, tokens], 1)
  mask = np.concatenate([pmask, np.ones_like(tokens)], 1)
  pos = np.clip(np.cumsum(mask, 1) - 1, 0, None)
  p = prompt.shape[1]
  return np.asarray(forward(MCFG, params, full, pos, mask), np.float64)[:, p - 1:-1]


def check_eos_semantics(r, scfg):
  tokens, mask = np.asarray(r.tokens_NxL), np.asarray(r.mask_NxL)
  for i in range(tokens.shape[0]):
    hits = np.flatnonzero(np.isin(tokens[i], scfg.eos_ids))
    end = hits[0] + 1 if len(hits) and mask[i, hits[0]] else tokens.shape[1]
    assert np.all(mask[i, :end] == 1) and np.all(mask[i, end:] == 0), (i, tokens[i], mask[i])
    assert np.all(tokens[i, end:] == scfg.pad_id)
    assert int(r.lengths_N[i]) == end
    assert bool(r.truncated_N[i]) == (end == tokens.shape[1] and tokens[i, -1] not in scfg.eos_ids)
    assert np.all(np.asarray(r.logp_NxL)[i, end:] == 0.0)


@pytest.mark.parametrize("scfg", [
    S.SamplingConfig(temperature=0.8),
    S.SamplingConfig(temperature=1.3, top_k=3),
    S.SamplingConfig(top_p=0.7),
    S.SamplingConfig(temperature=2.0, top_k=5, top_p=0.8),
    S.SamplingConfig(temperature=0.5, greedy=True),
])
def test_draw_frequencies_match_target_distribution(scfg):
  """Stratified uniforms make inverse-CDF frequencies equal the target probabilities to ~1/n."""
  logits = np.array([1.0, -0.5, 2.0, 0.3, 0.0, 1.7, -2.0, 0.9])
  n = 20_000
  u = (np.arange(n) + 0.5) / n
  tok, logp = jax.jit(S.draw, static_argnums=2)(jnp.tile(jnp.asarray(logits, jnp.float32), (n, 1)),
                                                jnp.asarray(u, jnp.float32), scfg)
  tok, logp = np.asarray(tok), np.asarray(logp)
  lsm = np_log_softmax(logits / scfg.temperature)
  np.testing.assert_allclose(logp, lsm[tok], atol=1e-6)  # untruncated, whatever the filter
  order = np.argsort(-logits)
  p = np.exp(lsm)
  keep = np.zeros(8, bool)
  if scfg.greedy:
    keep[order[0]] = True
  else:
    keep[order[:scfg.top_k or 8]] = True
  target = np.where(keep, p, 0) / np.where(keep, p, 0).sum()
  if scfg.top_p < 1 and not scfg.greedy:
    sorted_p = target[order]
    before = np.cumsum(sorted_p) - sorted_p
    keep2 = np.zeros(8, bool)
    keep2[order[before < scfg.top_p]] = True
    target = np.where(keep2, target, 0) / np.where(keep2, target, 0).sum()
  freq = np.bincount(tok, minlength=8) / n
  np.testing.assert_allclose(freq, target, atol=3e-4)
  assert (target > 0).sum() == {0.8: 8, 1.3: 3, 1.0: 3, 2.0: 4, 0.5: 1}[scfg.temperature]  # filters did bite


def test_draw_filter_edges_against_numpy():
  """The filters at their edges, each target computed in NumPy (float64): top_p tiny (the argmax alone), top_k = 1
  (greedy's token), top_k >= V (no filter: the untruncated distribution), top-p whose mass reaches p exactly at a
  token (that token kept, the next not; HF and vLLM keep the same prefix), tied probabilities at the top-k / top-p
  cut (the lower id kept: one of the ties, never both), a temperature of 1e3 (all but uniform), and uniforms 0 and
  1 - 2^-24 (the first and last token of the support, never one outside it)."""
  n = 2000
  logits = np.array([1.0, -0.5, 2.0, 0.3, 0.0, 1.7, -2.0, 0.9])
  # probabilities 1/8, 1/2, 1/8, 1/4 (exact in float32): the mass before each in sorted order is 0, .5, .75, .875
  q = np.log(np.array([0.125, 0.5, 0.125, 0.25]))
  even = np.zeros(4)  # four ties: top_k = 2 and top_p = 0.5 both keep ids 0 and 1
  cases = [(logits, S.SamplingConfig(top_p=1e-9)), (logits, S.SamplingConfig(top_k=1)),
           (logits, S.SamplingConfig(top_k=8)), (logits, S.SamplingConfig(temperature=1e3)),
           (q, S.SamplingConfig(top_p=0.75)), (q, S.SamplingConfig(top_p=0.76)), (q, S.SamplingConfig(top_k=3)),
           (even, S.SamplingConfig(top_k=2)), (even, S.SamplingConfig(top_p=0.5))]
  ends = jnp.asarray([0.0, 1 - 2 ** -24], jnp.float32)
  row = jnp.tile(jnp.asarray(logits, jnp.float32), (2, 1))

  @jax.jit
  def draws(u):
    """Every case's draws in one program: run eagerly, each setting's ops compiled one by one (~5 s of the test's
    wall time, 2026-12-07); jitted one by one, one compile per setting."""
    many = [S.draw(jnp.tile(jnp.asarray(z, jnp.float32), (n, 1)), u, scfg) for z, scfg in cases]
    return many, S.draw(row, ends, S.SamplingConfig(top_k=3))[0], S.draw(row, ends, S.SamplingConfig())[0]

  many, ends_top3, ends_all = draws(jnp.asarray((np.arange(n) + 0.5) / n, jnp.float32))
  freqs = []
  for (z, scfg), (tok, logp) in zip(cases, many):
    tok = np.asarray(tok)
    np.testing.assert_allclose(np.asarray(logp), np_log_softmax(np.asarray(z, np.float64) / scfg.temperature)[tok],
                               atol=1e-5)
    freqs.append(np.bincount(tok, minlength=len(z)) / n)

  p = np.exp(np_log_softmax(logits))
  onehot = np.eye(8)[2]
  np.testing.assert_array_equal(freqs[0], onehot)  # top_p 1e-9
  np.testing.assert_array_equal(freqs[1], onehot)  # top_k 1
  np.testing.assert_allclose(freqs[2], p, atol=1e-3)  # top_k 8 = V
  np.testing.assert_allclose(freqs[3], np.exp(np_log_softmax(logits / 1e3)), atol=1e-3)  # within 0.25% of uniform
  np.testing.assert_allclose(freqs[4], [0, 2 / 3, 0, 1 / 3], atol=1e-3)  # top_p 0.75
  np.testing.assert_allclose(freqs[5], [1 / 7, 4 / 7, 0, 2 / 7], atol=1e-3)  # top_p 0.76
  np.testing.assert_allclose(freqs[6], [1 / 7, 4 / 7, 0, 2 / 7], atol=1e-3)  # top_k 3
  np.testing.assert_allclose(freqs[7], [0.5, 0.5, 0, 0], atol=1e-3)  # ties, top_k 2
  np.testing.assert_allclose(freqs[8], [0.5, 0.5, 0, 0], atol=1e-3)  # ties, top_p 0.5
  np.testing.assert_array_equal(np.asarray(ends_top3), [2, 0])  # order 2, 5, 0
  np.testing.assert_array_equal(np.asarray(ends_all), [0, 7])


@pytest.fixture(scope="module")
def plain(params):
  scfg = S.SamplingConfig(temperature=1.0, max_new_tokens=L, eos_id=63, pad_id=0)
  return scfg, sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(0), scfg)


def test_rollout_logp_matches_numpy_and_eos_semantics(params, plain):
  scfg, r = plain
  assert r.tokens_NxL.shape == (4, L) and r.tokens_NxL.dtype == jnp.int32
  assert r.mask_NxL.dtype == jnp.int32 and r.logp_NxL.dtype == jnp.float32 and r.truncated_N.dtype == bool
  check_eos_semantics(r, scfg)
  tokens = np.asarray(r.tokens_NxL)
  lsm = np_log_softmax(rerun_logits(params, PROMPT, PMASK, tokens))
  want = np.take_along_axis(lsm, tokens[..., None], -1)[..., 0] * np.asarray(r.mask_NxL)
  np.testing.assert_allclose(np.asarray(r.logp_NxL), want, atol=1e-5)


def test_eos_stops_rows_and_prefix_is_unchanged(params, plain):
  """Same rng with a different eos_id: each row equals the first run up to and including its first EOS."""
  _, r0 = plain
  t0 = np.asarray(r0.tokens_NxL)
  assert np.all(np.asarray(r0.mask_NxL) == 1)  # eos 63 never drawn here: the reference run is complete
  counts = np.bincount(t0[:, 1:-1].ravel(), minlength=64)
  eos = int(np.argmax(counts))  # a token drawn mid-sequence somewhere
  scfg = S.SamplingConfig(temperature=1.0, max_new_tokens=L, eos_id=eos, pad_id=0)
  r = sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(0), scfg)
  check_eos_semantics(r, scfg)
  t, m = np.asarray(r.tokens_NxL), np.asarray(r.mask_NxL)
  for i in range(4):
    np.testing.assert_array_equal(t[i][m[i] == 1], t0[i][m[i] == 1])
  stopped = ~np.asarray(r.truncated_N)
  assert stopped.any() and (np.asarray(r.lengths_N)[stopped] < L).any()  # EOS really cut a row short
  np.testing.assert_allclose(np.asarray(r.logp_NxL), np.asarray(r0.logp_NxL) * m, atol=1e-6)


def test_a_set_of_eos_ids_ends_each_row_at_its_first_one(params, plain):
  """Several EOS ids (an HF generation_config's list): each row stops at whichever comes first, and equals the
  reference run up to there; a tuple of one id is that id."""
  _, r0 = plain
  t0 = np.asarray(r0.tokens_NxL)
  counts = np.bincount(t0[:, 1:-1].ravel(), minlength=64)
  a, b = (int(x) for x in np.argsort(-counts)[:2])  # the two tokens drawn most often mid-sequence
  scfg = S.SamplingConfig(temperature=1.0, max_new_tokens=L, eos_id=(a, b), pad_id=0)
  assert scfg.eos_ids == (a, b) and hash(scfg)
  r = sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(0), scfg)
  check_eos_semantics(r, scfg)
  t, m = np.asarray(r.tokens_NxL), np.asarray(r.mask_NxL)
  for i in range(4):
    np.testing.assert_array_equal(t[i][m[i] == 1], t0[i][m[i] == 1])
    first = next((k for k, x in enumerate(t0[i]) if x in (a, b)), None)
    assert int(r.lengths_N[i]) == (L if first is None else first + 1)
  ends = {int(t[i, int(r.lengths_N[i]) - 1]) for i in range(4) if not r.truncated_N[i]}
  assert ends, "no row ended"
  one = S.SamplingConfig(max_new_tokens=L, eos_id=(a,), pad_id=0)
  assert one == S.SamplingConfig(max_new_tokens=L, eos_id=a, pad_id=0) and one.eos_ids == (a,)
  with pytest.raises(ValueError, match="at least one EOS id"):
    S.SamplingConfig(eos_id=())


@pytest.mark.parametrize("field,value", [("top_k", True), ("top_k", False), ("max_new_tokens", True),
                                         ("exit_chunk", False), ("pad_id", False), ("eos_id", (3, True)),
                                         ("greedy", "False"), ("greedy", 1)])
def test_a_bool_for_a_count_or_a_string_for_greedy_is_refused(field, value):
  """True is the int 1 (top_k=True sampled from the top 1 token) and 'False' is true (greedy='False' took argmax):
  the library's SamplingConfig refuses both, as validate.py refuses them in a config."""
  with pytest.raises(ValueError, match=rf"{field}={value!r}".replace("(", r"\(").replace(")", r"\)")):
    S.SamplingConfig(**{field: value})
  S.SamplingConfig(top_k=1, max_new_tokens=1, exit_chunk=0, pad_id=0, eos_id=(3, 4), greedy=True)


GOOD_MASK = np.array([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]], np.int32)


@pytest.mark.parametrize("row,what", [([1, 1, 0, 0], "right-padded"), ([0, 0, 0, 0], "all pad"),
                                      ([0, 1, 0, 1], "holed")])
def test_a_prompt_batch_not_left_padded_is_refused_at_the_boundary(row, what):
  """The prefill scores prompt column P-1: a right-padded row drew its first token after a pad, an all-pad row from
  nothing, silently. The host boundaries (the RL step's device_batch, every generate call) refuse them first."""
  from grpo_jax.infra import sharding
  from grpo_jax.run import evaluation
  from grpo_jax.run import train
  S.check_left_padded(GOOD_MASK, "x")
  S.check_left_padded(jnp.asarray([row], jnp.int32), "x")  # a device array: unchecked (every producer hands numpy)
  bad = np.concatenate([GOOD_MASK, [row]]).astype(np.int32)
  with pytest.raises(ValueError, match=rf"^x: prompt row 3 of 4 is {what} .*the samplers take LEFT-padded prompts"):
    S.check_left_padded(bad, "x")
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  batch = {"prompt_NxP": np.ones_like(bad), "prompt_mask_NxP": bad}
  with pytest.raises(ValueError, match=rf"^an RL step's prompt batch: prompt row 3 of 4 is {what}"):
    train.device_batch(mesh, batch)
  assert train.device_batch(mesh, {**batch, "prompt_mask_NxP": GOOD_MASK[[0, 1, 2, 0]]}).keys() == batch.keys()
  gen = evaluation.make_generate_uncached(MCFG, S.SamplingConfig(max_new_tokens=2), mesh, "arith", {})
  with pytest.raises(ValueError, match=rf"^generate: prompt row 3 of 4 is {what}"):  # before anything is traced
    gen(None, batch["prompt_NxP"], bad, {}, jax.random.PRNGKey(0))


def test_same_rng_same_tokens_different_rng_different(params, plain):
  scfg, r0 = plain
  again = sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(0), scfg)
  np.testing.assert_array_equal(np.asarray(again.tokens_NxL), np.asarray(r0.tokens_NxL))
  other = sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(1), scfg)
  assert not np.array_equal(np.asarray(other.tokens_NxL), np.asarray(r0.tokens_NxL))


def test_greedy_is_argmax_of_full_forward(params):
  scfg = S.SamplingConfig(temperature=0.7, greedy=True, max_new_tokens=L, eos_id=63, pad_id=0)
  r = sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(3), scfg)
  tokens, mask = np.asarray(r.tokens_NxL), np.asarray(r.mask_NxL)
  logits = rerun_logits(params, PROMPT, PMASK, tokens)
  live = mask == 1
  np.testing.assert_array_equal(tokens[live], logits.argmax(-1)[live])
  lsm = np_log_softmax(logits / 0.7)
  np.testing.assert_allclose(np.asarray(r.logp_NxL)[live],
                             np.take_along_axis(lsm, tokens[..., None], -1)[..., 0][live], atol=1e-5)
  other = sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(4), scfg)
  np.testing.assert_array_equal(np.asarray(other.tokens_NxL), tokens)  # rng is irrelevant when greedy


@pytest.mark.parametrize("scfg", [
    S.SamplingConfig(temperature=2.0, top_k=4, max_new_tokens=L, eos_id=63, pad_id=0),
    S.SamplingConfig(temperature=2.0, top_p=0.6, max_new_tokens=L, eos_id=63, pad_id=0),
    S.SamplingConfig(temperature=2.0, top_k=10, top_p=0.8, max_new_tokens=L, eos_id=63, pad_id=0),
])
def test_top_k_top_p_stay_in_support_under_vmap(params, scfg):
  """Many draws (vmap over 16 rngs): every token lies in the support computed in NumPy from the logits."""
  rngs = jax.random.split(jax.random.PRNGKey(7), 16)
  vsample = jax.jit(jax.vmap(S.sample, in_axes=(None, None, None, None, 0, None)), static_argnums=(0, 5))
  r = vsample(MCFG, params, PROMPT, PMASK, rngs, scfg)
  tokens = np.asarray(r.tokens_NxL).reshape(-1, L)
  mask = np.asarray(r.mask_NxL).reshape(-1, L)
  prompt, pmask = np.tile(PROMPT, (16, 1)), np.tile(PMASK, (16, 1))
  logits = rerun_logits(params, prompt, pmask, tokens) / scfg.temperature
  lsm = np_log_softmax(logits)
  order = np.argsort(-logits, -1)
  k = scfg.top_k or 64
  sizes = []
  for row in range(tokens.shape[0]):
    for t in range(L):
      if not mask[row, t]:
        continue
      cand = order[row, t, :k]
      p = np.exp(lsm[row, t, cand])
      p /= p.sum()
      before = np.cumsum(p) - p
      support = cand[before < scfg.top_p + 1e-6]  # the slack only matters at exact float ties
      sizes.append(len(support))
      assert tokens[row, t] in support, (row, t, tokens[row, t], support)
  assert np.mean(sizes) > 1.5 and len(set(tokens.ravel())) > 8  # the supports were not trivial
  want = np.take_along_axis(lsm, tokens[..., None], -1)[..., 0] * mask  # untruncated log-probs
  np.testing.assert_allclose(np.asarray(r.logp_NxL).reshape(-1, L), want, atol=1e-5)
  if scfg.top_p == 1.0:  # one plain call (one more compile) shows vmap row 5 == sampling with that rng alone
    one = sample(MCFG, params, PROMPT, PMASK, rngs[5], scfg)
    np.testing.assert_array_equal(np.asarray(one.tokens_NxL), np.asarray(r.tokens_NxL)[5])


def test_config_validation_and_from_config():
  with pytest.raises(ValueError, match="top_p"):
    S.SamplingConfig(top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    S.SamplingConfig(temperature=0.0)
  with pytest.raises(ValueError, match="top_k"):
    S.SamplingConfig(top_k=-1)
  with pytest.raises(ValueError, match="max_new_tokens"):
    S.SamplingConfig(max_new_tokens=0)
  with pytest.raises(ValueError, match="top_p"):
    S.SamplingConfig(top_p=1.01)
  # the temperature floor: below it logits / T overflow float32 (NaN log-probs at 1e-37; 1e-40 is flushed to 0)
  for t in (1e-37, 1e-40, 0.0099):
    with pytest.raises(ValueError, match=r"temperature=.*must be >= 0.01"):
      S.SamplingConfig(temperature=t)
  logits = jnp.asarray([[40.0, 0.0, -40.0], [1e4, 1e4 - 1, -1e4]])
  # draw and token_logp each as one program, as the sampler and the loss run them (eagerly: ~30 one-op programs)
  tok, logp = jit_call(S.draw, logits, np.asarray([0.5, 0.99], np.float32),
                       S.SamplingConfig(temperature=S.MIN_TEMPERATURE))
  np.testing.assert_array_equal(np.asarray(tok), [0, 0])  # at the floor: argmax (a gap of 1 is e^-100 away)
  np.testing.assert_array_equal(np.asarray(logp), [0.0, 0.0])
  np.testing.assert_allclose(np.asarray(jit_call(S.token_logp, logits, np.asarray([2, 1]), S.MIN_TEMPERATURE)),
                             [-8000.0, -100.0], rtol=1e-6)  # finite, as the loss recomputes them
  scfg = S.SamplingConfig.from_config(dict(temperature=1, top_k=0, top_p=1.0, max_new_tokens=8), eos_id=3, pad_id=0)
  assert scfg == S.SamplingConfig(max_new_tokens=8, eos_id=3, pad_id=0)
  many = S.SamplingConfig.from_config(dict(temperature=1, top_k=0, top_p=1.0, max_new_tokens=8), eos_id=[3, 7],
                                      pad_id=0)
  assert many.eos_id == (3, 7) and many.eos_ids == (3, 7)
  with pytest.raises(ValueError, match="max_len"):
    S.sample(MCFG, None, PROMPT, PMASK, jax.random.PRNGKey(0), S.SamplingConfig(max_new_tokens=30))


_SHARDED = r"""
import json, sys
import flax.linen as nn, jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sys.path.insert(0, sys.argv[1])
from tests.test_sampling import MCFG, random_params
from grpo_jax.model import model as M
from grpo_jax.rollout import sampling as S
assert jax.device_count() == 8
params = random_params(MCFG, 0)
rng = np.random.default_rng(1)
prompt = rng.integers(1, 60, (8, 5)).astype(np.int32)
pmask = (np.arange(5)[None] >= rng.integers(0, 5, (8, 1))).astype(np.int32)
prompt = prompt * pmask
scfg = S.SamplingConfig(temperature=1.5, top_k=20, max_new_tokens=8, eos_id=63, pad_id=0)
f = jax.jit(S.sample, static_argnums=(0, 5))
one = f(MCFG, params, prompt, pmask, jax.random.PRNGKey(5), scfg)
mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("data", "tensor"))
rules = (("batch", "data"), ("heads", "tensor"), ("kv_heads", "tensor"), ("mlp", "tensor"), ("vocab", "tensor"))
with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
  shard = lambda spec: NamedSharding(mesh, nn.logical_to_mesh_axes(tuple(spec), rules))
  p_sh = jax.device_put(params, jax.tree.map(shard, M.param_axes(MCFG), is_leaf=lambda x: isinstance(x, P)))
  b = shard(P("batch", None))
  many = f(MCFG, p_sh, jax.device_put(prompt, b), jax.device_put(pmask, b), jax.random.PRNGKey(5), scfg)
  # early exit with the rows split: the all-done check reduces over the row shards (EOS: the 12 ids the first
  # decode drew most, so every row ends early)
  eos = tuple(int(x) for x in np.argsort(-np.bincount(np.asarray(one.tokens_NxL).ravel(), minlength=64))[:12])
  ee_cfg = S.SamplingConfig(temperature=1.5, top_k=20, max_new_tokens=8, eos_id=eos, pad_id=0, exit_chunk=2)
  ee = f(MCFG, p_sh, jax.device_put(prompt, b), jax.device_put(pmask, b), jax.random.PRNGKey(5), ee_cfg)
one_ee = f(MCFG, params, prompt, pmask, jax.random.PRNGKey(5), S.SamplingConfig(
    temperature=1.5, top_k=20, max_new_tokens=8, eos_id=eos, pad_id=0, exit_chunk=0))
print(json.dumps(dict(
    ee_tokens=np.asarray(ee.tokens_NxL).tolist(), one_ee_tokens=np.asarray(one_ee.tokens_NxL).tolist(),
    ee_logp=np.asarray(ee.logp_NxL).tolist(), one_ee_logp=np.asarray(one_ee.logp_NxL).tolist(),
    ee_steps=int(ee.decode_steps), ee_lmax=int(np.asarray(one_ee.lengths_N).max()),
    one_tokens=np.asarray(one.tokens_NxL).tolist(), many_tokens=np.asarray(many.tokens_NxL).tolist(),
    one_logp=np.asarray(one.logp_NxL).tolist(), many_logp=np.asarray(many.logp_NxL).tolist(),
    shard_rows=many.tokens_NxL.addressable_shards[0].data.shape[0],
    param_shards=len({str(s.index) for s in p_sh["layers"]["q"]["kernel"].addressable_shards}))))
"""


def on_8_devices(script: str, timeout: int = 300) -> dict:
  """Runs `script` (argv[1] = the repo root) in a subprocess with 8 simulated CPU devices; the JSON its last line
  prints."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, XLA_FLAGS=os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", script, root], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=root)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_batch_sharded_over_8_devices_matches_one_device():
  res = on_8_devices(_SHARDED)
  assert res["shard_rows"] == 2  # 8 rows over data=4: really sharded
  assert res["param_shards"] == 2  # heads split over tensor=2
  np.testing.assert_array_equal(res["many_tokens"], res["one_tokens"])
  np.testing.assert_allclose(res["many_logp"], res["one_logp"], atol=1e-5)
  # the sharded early-exit decode stops at its chunk boundary and equals the one-device full-length decode
  assert res["ee_steps"] == -(-res["ee_lmax"] // 2) * 2 < 7, (res["ee_steps"], res["ee_lmax"])
  np.testing.assert_array_equal(res["ee_tokens"], res["one_ee_tokens"])
  np.testing.assert_allclose(res["ee_logp"], res["one_ee_logp"], atol=1e-5)


def test_two_level_inverse_cdf_matches_a_flat_search_and_skips_zero_mass():
  """Above 256 entries the CDF search is blocked (no V² cumsum); it must pick what a flat float64 search picks."""
  rng = np.random.default_rng(0)
  v, n = 1000, 20_000
  p = np.exp(rng.normal(size=v) * 2).astype(np.float32)
  p[rng.random(v) < 0.3] = 0.0  # zero-mass holes, as top-k/top-p leave them
  p[-40:] = 0.0  # and zero runs spanning the first and last blocks (u = 0 and u -> 1 must skip them)
  p[:40] = 0.0
  u = np.concatenate([(np.arange(n - 2) + 0.5) / (n - 2), [0.0, 1 - 1e-7]]).astype(np.float32)
  j = np.asarray(jax.jit(S._inverse_cdf)(jnp.tile(jnp.asarray(p), (n, 1)), jnp.asarray(u)))
  cdf = np.cumsum(p.astype(np.float64))
  want = np.searchsorted(cdf, u.astype(np.float64) * cdf[-1])
  assert np.mean(j == want) > 0.999  # differences only where float32 rounding moves a boundary
  assert np.all(p[j] > 0)
  np.testing.assert_allclose(np.bincount(j, minlength=v) / n, p / p.sum(), atol=2e-4)


@pytest.mark.parametrize("chunk", [0, 4])
def test_decode_loop_slices_no_weight_or_cache_per_token(params, chunk):
  """The compiled decode loop reads each layer's weights and K/V cache buffer as they are: no dynamic-slice of a
  weight matrix or of a cache buffer inside any while body (the old nested layer scan copied them every token), with
  and without the early-exit chunks around it."""
  import re
  # EOS 63 (the program's structure does not depend on the id): with exit_chunk 4 this is the program that
  # test_early_exit_equals_the_full_length_decode runs for its rows that never end, so it compiles once, here
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=63, pad_id=0, exit_chunk=chunk)
  hlo = sample.lower(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(0), scfg).compile().as_text()
  n, p = PROMPT.shape
  kv, hd, s, d, f = MCFG.kv_heads, MCFG.head_dim, p + L, MCFG.hidden, MCFG.inter
  # per-layer buffers: K cache, V cache, the MLP kernels, the q/o kernels
  shapes = [f"f32[{n},{kv},{hd},{s}]", f"f32[{n},{kv},{s},{hd}]", f"f32[{d},{f}]", f"f32[{f},{d}]",
            f"f32[{d},{MCFG.heads},{hd}]", f"f32[{MCFG.heads},{hd},{d}]"]
  bodies = set(re.findall(r"body=%?([\w.\-]+)", hlo))
  assert bodies, "no while loop in the compiled rollout"
  sliced = []
  for comp in re.split(r"\n(?=\S)", hlo):
    name = re.match(r"(?:ENTRY )?%?([\w.\-]+)", comp)
    if name and name.group(1) in bodies:
      for ln in comp.splitlines():  # "%<name> = <shape>{layout} <op>(...)": a slice-named op of a listed shape
        lhs, _, rhs = ln.partition(" = ")
        if "dynamic-slice" in lhs and any(rhs.startswith(sh + "{") for sh in shapes):
          sliced.append(ln.strip())
  assert not sliced, sliced[:3]


def test_a_chunk_that_divides_max_new_tokens_decodes_without_a_skip(params):
  """The decode runs L = 10 (emit, decode) steps, so chunks of 5 (and of 2, 10) are whole and the scan body has no
  cond; chunks of 4 skip the last chunk's 2 steps past L under one. A vmapped sweep batches that cond into a select
  of the whole carry, KV cache included, at every step (its sampling took up to 1.8x as long, 2026-12-07); the
  default chunk (default_exit_chunk) divides L, so it never pays that."""
  def conds(c):
    scfg = S.SamplingConfig(max_new_tokens=L, eos_id=63, pad_id=0, exit_chunk=c)
    return str(jax.make_jaxpr(lambda p: S.sample(MCFG, p, PROMPT, PMASK, jax.random.PRNGKey(0), scfg))(params)
               ).count(" cond[")
  none = conds(0)  # one scan, no chunks
  assert [conds(c) for c in (5, 2)] == [none, none]
  assert conds(4) > none


@pytest.mark.parametrize("chunk", [4, 3, 0])
def test_the_decode_step_compiles_once_whatever_the_chunk(params, chunk):
  """The decode's L = 10 steps in chunks of 4 (3 chunks, the last one's 2 steps past L skipped), of 3 (4 chunks, 2
  skipped) and as one scan (chunk 0) compile the same number of matmuls: the model's decode step once.
  A remainder chunk (a scan of another length) was a second copy of the whole step, and the compile's cost goes
  by its kernels (docs/performance.md, "What a default-flag compile spends"); a chunk that does not divide
  max_new_tokens (a set one, or a prime length) takes the skip. (chunk 4 / 0 with EOS 63 are the programs the tests above and below compile.)"""
  import re
  def dots(c):
    scfg = S.SamplingConfig(max_new_tokens=L, eos_id=63, pad_id=0, exit_chunk=c)
    hlo = sample.lower(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(0), scfg).compile().as_text()
    return len(re.findall(r" dot\(", hlo))
  full = dots(0)
  assert full >= 2 * MCFG.layers  # prefill's and one decode step's projections at least
  assert dots(chunk) == full


@pytest.fixture(scope="module")
def early_eos(plain):
  """EOS = the 12 tokens the reference run draws most: every row ends within a few steps."""
  t0 = np.asarray(plain[1].tokens_NxL)
  return tuple(int(x) for x in np.argsort(-np.bincount(t0.ravel(), minlength=64))[:12])


def test_early_exit_equals_the_full_length_decode(params, plain, early_eos):
  """The chunked while_loop (exit_chunk=4: 3 chunks over the 10 steps, the last one's 2 past L skipped) stops once every row
  is done (fewer decode steps) and returns exactly the full decode's tokens, mask and log-probs; with rows that
  never end it runs all steps. (`plain` is the full decode: its exit_chunk exceeds the steps.)"""
  chunk = 4
  full_early = sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(0),
                      S.SamplingConfig(max_new_tokens=L, eos_id=early_eos, pad_id=0, exit_chunk=0))
  for eos, full, ends_early in ((early_eos, full_early, True), (63, plain[1], False)):
    ee = sample(MCFG, params, PROMPT, PMASK, jax.random.PRNGKey(0),
                S.SamplingConfig(max_new_tokens=L, eos_id=eos, pad_id=0, exit_chunk=chunk))
    assert int(full.decode_steps) == L - 1
    lmax = int(np.asarray(full.lengths_N).max())
    if ends_early:
      assert lmax <= L // 2 and not np.asarray(full.truncated_N).any()
      # stops at the first chunk boundary at or after the step that emitted the last EOS
      assert int(ee.decode_steps) == -(-lmax // chunk) * chunk < L - 1
    else:
      assert lmax == L and int(ee.decode_steps) == L - 1
    for k in ("tokens_NxL", "mask_NxL", "lengths_N", "truncated_N"):
      np.testing.assert_array_equal(np.asarray(getattr(ee, k)), np.asarray(getattr(full, k)), err_msg=k)
    np.testing.assert_allclose(np.asarray(ee.logp_NxL), np.asarray(full.logp_NxL), rtol=0, atol=1e-6)


def test_early_exit_under_vmap_runs_until_every_run_is_done(params, early_eos):
  """vmap over rngs (one run's rows may end later than another's): equal to the full decode run by run."""
  keys = jax.random.split(jax.random.PRNGKey(3), 3)
  f = jax.jit(jax.vmap(S.sample, in_axes=(None, None, None, None, 0, None)), static_argnums=(0, 5))
  mk = lambda c: S.SamplingConfig(max_new_tokens=L, eos_id=early_eos, pad_id=0, exit_chunk=c)
  full, ee = f(MCFG, params, PROMPT, PMASK, keys, mk(0)), f(MCFG, params, PROMPT, PMASK, keys, mk(3))
  np.testing.assert_array_equal(np.asarray(ee.tokens_NxL), np.asarray(full.tokens_NxL))
  np.testing.assert_allclose(np.asarray(ee.logp_NxL), np.asarray(full.logp_NxL), rtol=0, atol=1e-6)
  lmax, trunc = np.asarray(full.lengths_N).max(1), np.asarray(full.truncated_N).any(1)
  want = np.where(trunc, L - 1, np.minimum(-(-lmax // 3) * 3, L - 1))  # each run stops at its own chunk boundary
  np.testing.assert_array_equal(np.asarray(ee.decode_steps), want)
  assert (want < L - 1).any()


def test_copies_of_one_prompt_draw_independent_samples(params):
  """pass@k's n samples per prompt are n copies of its row in one sampled call (evaluation.Evaluator, np.repeat):
  each copy must be its own draw. 2048 copies of one prompt: the first token's frequencies match the model's
  next-token distribution (chi-square over the tokens with ≥ 5 expected draws, well under its 0.999 quantile), two
  neighbouring copies agree as often as independent draws do (Σ p², within 4 binomial standard errors), and a
  second call from fold_in(rng, 1) (the next chunk's key) is not a replay of the first."""
  n = 2048
  scfg = S.SamplingConfig(temperature=4.0, max_new_tokens=1, eos_id=63, pad_id=0)  # a flat enough distribution
  prompt, pmask = np.repeat(PROMPT[:1], n, 0), np.repeat(PMASK[:1], n, 0)
  rng = jax.random.PRNGKey(3)
  first = np.asarray(sample(MCFG, params, prompt, pmask, rng, scfg).tokens_NxL)[:, 0]
  pos = np.maximum(np.cumsum(PMASK[:1], 1) - 1, 0)
  p = np.exp(np_log_softmax(np.asarray(forward(MCFG, params, PROMPT[:1], pos, PMASK[:1]), np.float64)[0, -1] / 4.0))
  expected = n * p
  big = expected >= 5
  obs = np.bincount(first, minlength=p.size)
  chi2 = np.sum((obs[big] - expected[big]) ** 2 / expected[big]) + (
      (obs[~big].sum() - expected[~big].sum()) ** 2 / max(expected[~big].sum(), 1e-9))
  df = int(big.sum())  # the pooled rest adds one cell, the total's constraint takes one away
  assert chi2 < df + 3.1 * np.sqrt(2 * df) + 10, (chi2, df)  # ~0.999 quantile, Wilson–Hilferty-free margin
  same = np.mean(first[0::2] == first[1::2])
  q = np.sum(p ** 2)
  assert q < 0.5, q  # else agreement would not tell shared draws from independent ones
  assert abs(same - q) < 4 * np.sqrt(q * (1 - q) / (n // 2)), (same, q)
  again = np.asarray(sample(MCFG, params, prompt, pmask, jax.random.fold_in(rng, 1), scfg).tokens_NxL)[:, 0]
  assert np.mean(again == first) < q + 4 * np.sqrt(q * (1 - q) / n)
