"""rl.packing: the padding-free packed passes give the padded path's losses, metrics and gradients (every
aggregation mode, every algorithm family, KL estimators, PPO's critic), the full step's params, on 1 device and on 8
simulated FSDP devices, with no recompile while the length mix changes; attention over segments on every path."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conftest  # tests/conftest.py: requires
from grpo_jax.config import config_lib, presets
from grpo_jax.infra import sharding
from grpo_jax.infra.errors import ConfigError
from grpo_jax.model import attention as A
from grpo_jax.model import model as model_lib
from grpo_jax.rl import correction, families, packing, ppo_step, rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.run import validate
from grpo_jax.tasks import digits
from tests import noise
from tests import script_parts
from tests.jit_call import jit_call

TINY = dict(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=2, G=4, L=7)
P = 5
# Completion lengths: one ending at its first token, two never ending (L), the rest in between; prompt lengths 1..5.
LENS = np.array([1, 7, 3, 5, 2, 7, 4, 6])
PLENS = np.array([5, 1, 3, 2, 4, 5, 1, 3])


def _config(algo: str, **over):
  """μ 2: the minibatches below stand for a later update of the step, whose ratio reads the recorded π_old (the
  only update of a μ = 1 step takes it against its own policy pass: rl_step.old_logp)."""
  c = presets.apply(digits.bench_config(**TINY), algo)
  return config_lib.override(c, {"task.prompt_len": P, "rl.mu": 2, **over})


def _minibatch(c, mcfg, params, critic=False):
  """A hand-built minibatch: prompts of different lengths (left padded), completions ending at the first token or
  never, old log-probs off the policy (ratios clip on both sides), per-token advantages (REINFORCE++-style)."""
  rng = np.random.default_rng(0)
  n, L = len(LENS), c.sampling.max_new_tokens
  pmask = (np.arange(P)[None] >= P - PLENS[:, None]).astype(np.int32)
  mask = (np.arange(L)[None] < LENS[:, None]).astype(np.float32)
  prompt = rng.integers(1, 64, (n, P)) * pmask
  tokens = rng.integers(1, 64, (n, L)) * mask.astype(np.int64)
  # The sequence and the policy's log-probs each as one program, as the step runs them (eagerly, every op of the
  # model's forward was its own program); the noise arithmetic in NumPy float32 (elementwise, the same values).
  seq = jit_call(rollout_lib.full_sequence, prompt.astype(np.int32), pmask, tokens.astype(np.int32), mask)
  logp = np.asarray(jit_call(rollout_lib.completion_logprobs, mcfg, params, seq, P, c.sampling.temperature)[0])
  noise = lambda s: rng.normal(0, s, (n, L)).astype(np.float32) * mask
  mb = dict(seq=seq, mask_NxL=jnp.asarray(mask), old_logp_NxL=jnp.asarray((logp + noise(0.3)) * mask),
            adv_NxL=jnp.asarray((noise(1.0) + 0.5) * mask), ref_logp_NxL=jnp.asarray((logp + noise(0.5)) * mask))
  if critic:
    mb.update(old_v_NxL=jnp.asarray(noise(1.0)), returns_NxL=jnp.asarray(noise(1.0)))
  return mb


def _rel(a, b):
  return float(np.abs(np.float64(a) - b) / max(abs(float(b)), 1e-6))


def _passes(c, forward, objective, rows):
  """(the padded pass, the packed pass): jitted value_and_grad of (params, minibatch). The minibatch is an argument,
  not a constant of the program, so a test that builds the same config's passes again (another mask, the same
  shapes) gets the programs from the session's compilation cache."""
  cp = config_lib.override(c, {"rl.packing": True, "rl.pack_rows": rows})
  padded = jax.jit(jax.value_and_grad(lambda ps, mb: objective(forward(ps, mb["seq"], False), mb), has_aux=True))
  packed = jax.jit(lambda ps, mb: packing.value_and_grad(cp, lambda ps, s: forward(ps, s, True), objective, P)(ps, mb))
  return padded, packed


def _compare(c, forward, objective, params, mb, rows):
  padded, packed = _passes(c, forward, objective, rows)
  (l1, a1), g1 = padded(params, mb)
  (l2, a2), g2 = packed(params, mb)
  assert _rel(l2, l1) <= 1e-5, (l2, l1)
  for k in a1:
    assert abs(float(a2[k]) - float(a1[k])) <= 1e-5 * max(abs(float(a1[k])), 1e-2), (k, a2[k], a1[k])
  # np.asarray(y): NumPy minus a jax.Array defers to JAX (a float32 op compiled per leaf shape), not float64 NumPy
  diff = np.sqrt(sum(np.sum((np.float64(x) - np.asarray(y)) ** 2)
                     for x, y in zip(jax.tree.leaves(g2), jax.tree.leaves(g1))))
  norm = np.sqrt(sum(np.sum(np.float64(x) ** 2) for x in jax.tree.leaves(g1)))
  assert norm > 0 and diff / norm <= 1e-5, (diff, norm)
  return a1, a2


@pytest.mark.parametrize("algo,over", [
    ("grpo", {}),                                       # seq_mean_token_mean, k3 in the loss
    ("grpo", {"rl.kl_estimator": "k2"}),
    ("dr_grpo", {"rl.beta": 0.04, "rl.kl_estimator": "k1"}),  # seq_mean_token_sum_norm (Dr.GRPO's constant)
    ("dapo", {}),                                       # token_mean, clip-higher
    ("gspo", {}),                                       # sequence-level ratio
    ("rloo", {}),
    ("reinforce_pp", {}),                               # per-token advantages, token_mean
    ("grpo", {"rl.loss_agg": "seq_mean_token_sum", "rl.entropy_coef": 0.05}),  # verl's sum mode, entropy bonus
    ("dapo", {"rl.entropy_coef": 0.05}),                # the bonus under token_mean (micro-batches scaled)
])
def test_packed_policy_pass_equals_padded(algo, over):
  """Loss, every metric (entropy, clip fractions by side, ratio extremes, KL, k3 clamp) and the gradient of the
  packed pass in 1-row micro-batches (DAPO: 3-row ones) equal the padded pass (fp32, rel 1e-5, gradient norm-relative
  1e-5)."""
  c = _config(algo, **over)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  mb = _minibatch(c, mcfg, params)
  forward, objective = rl_step.make_forward(c, mcfg, P), rl_step.make_objective(c)
  a1, _ = _compare(c, forward, objective, (params,), mb, rows=1 if algo != "dapo" else 3)
  assert a1["clip_frac_low"] > 0 and a1["clip_frac_high"] > 0 or algo == "gspo"  # the clip metrics are exercised


@pytest.mark.parametrize("packed", [False, True])
def test_entropy_bonus_raises_the_policy_entropy(packed):
  """rl.entropy_coef through the step's loss (rl_step.make_objective on the tiny model's policy pass, padded or
  packed in 1-row micro-batches), A = 0 and β = 0 so the bonus is the only gradient: three SGD steps (lr 10) raise
  the token-mean entropy of the completions (4.149 nats at init, ln 64 = 4.159 at most) by more than 2e-3 nats with
  coef 0.1; with coef 0 the gradient is exactly 0 and the entropy does not move."""
  c = _config("grpo", **{"rl.beta": 0.0})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  mb = _minibatch(c, mcfg, params)
  mb = dict(mb, adv_NxL=jnp.zeros_like(mb["adv_NxL"]), ref_logp_NxL=None)
  forward = rl_step.make_forward(c, mcfg, P)

  @jax.jit  # one program (eagerly, each op of the forward was its own)
  def entropy_of(ps, mb):
    return rl_step.masked_mean(forward((ps,), mb["seq"], False)[1], mb["mask_NxL"])

  def entropy(ps):
    return float(entropy_of(ps, mb))

  def run(coef):
    cc = config_lib.override(c, {"rl.entropy_coef": coef, "rl.packing": packed, "rl.pack_rows": 1})
    objective = rl_step.make_objective(cc)
    if packed:
      vg = packing.value_and_grad(cc, lambda ps, s: forward(ps, s, True), objective, P)
    else:
      vg = jax.value_and_grad(lambda ps, mb: objective(forward(ps, mb["seq"], False), mb), has_aux=True)

    @jax.jit
    def step(ps):
      g = vg(ps, mb)[1]
      g_max = jnp.max(jnp.stack([jnp.abs(x).max() for x in jax.tree.leaves(g)]))
      return jax.tree.map(lambda p, g: p - 10.0 * g, ps, g), g_max
    ps, g_max = step((params,))
    for _ in range(2):
      ps, _ = step(ps)
    return entropy(ps[0]), float(g_max)

  h0 = entropy(params)
  h_off, g_off = run(0.0)
  h_on, g_on = run(0.1)
  assert g_off == 0.0 and h_off == h0
  assert g_on > 0 and h_on > h0 + 2e-3, (h0, h_on)


def test_packed_pass_with_rows_or_all_tokens_out_of_the_loss():
  """The rollout correction (or the staleness mask) takes rows out of the loss mask: packed in 1-row micro-batches,
  those rows' micro-batches have no token, their token-mean metrics are NaN (update.no_tokens_nan) and weigh 0, so
  the packed metrics still equal the padded pass's. With every token out, both passes give NaN token means (not
  0: an entropy of 0 reads as a collapsed policy) and a finite loss and gradient."""
  c = _config("grpo")
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  mb = _minibatch(c, mcfg, params)
  forward, objective = rl_step.make_forward(c, mcfg, P), rl_step.make_objective(c)
  keep = jnp.asarray([0, 1, 0, 1, 1, 0, 0, 1], jnp.float32)[:, None]
  _compare(c, forward, objective, (params,), dict(mb, mask_NxL=mb["mask_NxL"] * keep), rows=1)
  none = dict(mb, mask_NxL=jnp.zeros_like(mb["mask_NxL"]))
  for vg in _passes(c, forward, objective, rows=1):
    (loss, aux), g = vg((params,), none)
    assert np.isnan(float(aux["entropy"])) and np.isnan(float(aux["ratio_mean"])), aux
    assert np.isfinite(float(loss)) and all(np.isfinite(x).all() for x in jax.tree.leaves(g))


@pytest.mark.parametrize("mode", ["head", "separate"])
def test_packed_ppo_pass_equals_padded(mode):
  """PPO with a critic (value head on the policy trunk, or a separate value network): surrogate + value loss and
  both parameter sets' gradients."""
  c = _config("ppo", **{"ppo.critic": mode})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  critic = ppo_step.init_critic(mcfg, mode, jax.random.PRNGKey(1), params)
  critic = dict(critic, v_head={"kernel": jnp.full((mcfg.hidden,), 0.3), "bias": jnp.asarray(0.1)})
  mb = _minibatch(c, mcfg, params, critic=True)
  a1, _ = _compare(c, ppo_step.make_forward(c, mcfg, P), ppo_step.make_objective(c), (params, critic), mb, rows=2)
  assert a1["value_clip_frac"] > 0


def test_packed_forwards_and_plan():
  """The reference forward packed equals the padded one on every completion token (0 elsewhere); the plan packs
  the 8 samples (59 real tokens) into 6 rows of 12, each segment's positions restarting at 0."""
  c = config_lib.override(_config("grpo"), {"rl.packing": True, "rl.pack_rows": 2})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  mb = _minibatch(c, mcfg, params)
  want = np.asarray(jit_call(rollout_lib.completion_logprobs, mcfg, params, mb["seq"], P, 1.0)[0]) * np.asarray(
      mb["mask_NxL"])  # one program (_minibatch's), not the forward's ops one by one
  got = jax.jit(lambda: packing.forwards(
      c, lambda s: rollout_lib.completion_logprobs(mcfg, params, s, P, 1.0, True)[0], mb["seq"], P))()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The plan and micro-batch 0's rows as one program, as the step builds them (eagerly, ~55 one-op programs); its
  # Python ints (rows, C) come back as arrays, compared by value below.
  p, row0 = jax.jit(lambda seq: (lambda p: (p, packing.packed_seq(p, seq, 0)))(packing.plan(c, seq, P)))(mb["seq"])
  # first-fit decreasing of 12, 9, 8, 7, 6, 6, 6, 5 tokens into rows of 12: 6 rows (≥ 59/12), 2 a micro-batch
  assert int(np.sum(PLENS + LENS)) == 59 and p.C == 12 and int(p.trips) == 3
  assert sorted(np.asarray(p.row_DxN[0]).tolist()) == [0, 1, 2, 3, 3, 4, 4, 5]  # the 5 joins the 7
  tok, pos, seg = (np.asarray(x) for x in row0)
  for r in range(tok.shape[0]):
    for s in set(seg[r]) - {0}:
      np.testing.assert_array_equal(pos[r][seg[r] == s], np.arange(np.sum(seg[r] == s)))


def _attn_inputs(t=24, n=2, h=4, kv=2, d=8):
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.standard_normal((n, t, x, d)), jnp.float32) for x in (h, kv, kv))
  seg = np.zeros((n, t), np.int32)
  seg[0, :9], seg[0, 9:20] = 1, 2       # two samples, then pad
  seg[1, :5], seg[1, 5:6], seg[1, 6:] = 3, 4, 5  # a one-token segment
  return q, k, v, jnp.asarray(seg)


_EINSUM_ALONE = jax.jit(A.einsum)


@pytest.mark.parametrize("path", ["xla", "blockwise", "splash", "dot_product", "pallas_gpu"])
def test_attention_over_segments_equals_each_sample_alone(path):
  """Each segment of a packed row attends only to itself: every path equals the einsum over that sample alone."""
  q, k, v, seg = _attn_inputs()
  f = {"xla": A.einsum, "blockwise": lambda *a: A.blockwise(*a, block=8), "dot_product": A.dot_product,
       "splash": lambda *a: A.splash(*a, interpret=True), "pallas_gpu": lambda *a: A.pallas_gpu(*a, interpret=True)}
  got = np.asarray(jax.jit(f[path])(q, k, v, seg))
  s = np.asarray(seg)
  qn, kn, vn = (np.asarray(x) for x in (q, k, v))
  for r in range(2):
    for sid in set(s[r]) - {0}:
      cols = np.where(s[r] == sid)[0]
      sl = lambda x: x[r:r + 1, cols]
      # the reference: the einsum path over this sample alone, one jitted program per sample length (run eagerly,
      # with the slicing as JAX ops, it compiled ~200 single-op programs)
      want = np.asarray(_EINSUM_ALONE(sl(qn), sl(kn), sl(vn), np.ones((1, len(cols)), np.int32)))[0]
      np.testing.assert_allclose(got[r, cols], want, rtol=2e-5, atol=2e-5, err_msg=f"{path} row {r} seg {sid}")
  assert A.choose("cudnn", 2, 24, 4, jnp.bfloat16, packed=True) == "pallas_gpu"
  assert A.choose("auto", 2, 24, 4, jnp.bfloat16, plat="gpu", packed=True) == "pallas_gpu"


@pytest.mark.skipif(jax.default_backend() != "gpu",
                    reason="the Pallas GPU kernel (Triton) needs an NVIDIA GPU and this machine has none (run with "
                    "JAX_PLATFORMS=cuda on one: benchmarks/device_check.sh); its logic runs in interpret mode above")
def test_pallas_gpu_kernel_on_gpu_equals_each_sample_alone():
  """The compiled kernel (not interpret mode) on packed bf16 rows of head_dim 64, values and gradients, against the
  einsum over each sample alone on the same bf16-rounded inputs in fp32."""
  q, k, v, seg = (x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x for x in _attn_inputs(t=200, d=64))
  f = jax.jit(lambda q, k, v: A.pallas_gpu(q, k, v, seg))
  got = np.asarray(f(q, k, v), np.float32)
  up = lambda x: x.astype(jnp.float32)
  s = np.asarray(seg)
  for r in range(2):
    for sid in set(s[r]) - {0}:
      cols = np.where(s[r] == sid)[0]
      sl = lambda x: up(x[r:r + 1, cols])
      want = np.asarray(A.einsum(sl(q), sl(k), sl(v), jnp.ones((1, len(cols)), jnp.int32)))[0]
      np.testing.assert_allclose(got[r, cols], want, rtol=0, atol=3e-2, err_msg=f"row {r} seg {sid}")
  w = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape), jnp.float32) * (seg > 0)[:, :, None, None]
  loss = lambda fn: lambda q, k, v: jnp.vdot(fn(q, k, v).astype(jnp.float32), w)
  got_g = jax.jit(jax.grad(loss(lambda q, k, v: A.pallas_gpu(q, k, v, seg)), argnums=(0, 1, 2)))(q, k, v)
  want_g = jax.grad(loss(lambda q, k, v: A.einsum(q, k, v, seg)), argnums=(0, 1, 2))(up(q), up(k), up(v))
  for a, b in zip(got_g, want_g):
    scale = np.abs(np.asarray(b)).max()
    assert np.abs(np.asarray(a, np.float32) - np.asarray(b)).max() <= 3e-2 * scale


def test_pack_len_below_prompt_plus_completion_is_a_config_error():
  c = config_lib.override(digits.bench_config(**TINY), {"rl.packing": True, "rl.pack_len": 10})
  with pytest.raises(ConfigError, match=r"config.rl.pack_len: 10 < task.prompt_len \+ sampling.max_new_tokens"):
    validate.validate_rl(c, num_devices=1)
  validate.validate_rl(config_lib.override(c, {"rl.pack_len": c.task.prompt_len + c.sampling.max_new_tokens}), 1)


# ------------------------------------------------------------------------------------------- the full step


class _ManyEos:
  """digits' tokenizer with most ids as EOS: a random model's completions end early, at lengths that vary."""
  def __init__(self, vocab):
    self.eos_ids, self.eos_id, self.pad_id = tuple(range(2, vocab, 3)), 2, 0


def _perturb(params):
  """One program per params structure, one normal draw over all leaves (tests/noise.py)."""
  return noise.perturbed(params, jax.random.PRNGKey(7), 0.05)


def _run(algo: str, over: dict, n_steps: int = 3):
  c = config_lib.override(presets.apply(digits.bench_config(**dict(TINY, prompts=4, L=12)), algo),
                          {"optim.lr": 1e-3, **over})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, _ManyEos(c.model.vocab_size))
  state = families.for_config(c).init(c, mesh, mcfg, seed=0)
  state = dict(state, params=_perturb(state["params"]))
  ms, ps = [], []
  for b in list(digits.make_batches(c.rl.prompts_per_step, n_steps, seed=1)):
    b["answer_ids_NxA"][:, 1:] = -1
    state, m = step(state, b)
    ms.append(jax.device_get(m))
    ps.append(jax.device_get(state["params"]))
  return dict(metrics=ms, params=ps, step=step)


STEP_KEYS = ("train/loss", "train/grad_norm", "train/kl", "train/entropy", "train/clip_frac_low",
             "train/clip_frac_high", "train/ratio_mean", "train/reward_mean", "train/adv_std")
# The absolute tolerance of those metrics: train/loss is a mean of O(1) terms (advantages are zero-mean per group)
# that nearly cancel (~6e-6 at μ = 1), so its rounding is absolute, not relative: packed vs padded differ by 1.06e-7
# there on an AVX2 CPU (XLA:CPU's reduction order follows the vector width), by less on AVX-512.
STEP_ATOL = 1e-6


@pytest.mark.parametrize("algo,over", [("grpo", {"rl.mu": 2, "rl.minibatches": 2}), ("ppo", {})])
def test_full_step_packed_equals_padded_buckets_without_recompiles(algo, over):
  """Three steps whose length mixes differ: the packed step (μ = 2 × 2 minibatches: packed after each epoch's
  shuffle; PPO with its critic forward packed too) gives the padded step's samples, metrics (rel 1e-5) and
  params (within 2e-5, test_rl_step's bound for AdamW on rounding-level gradients), traced once."""
  pad = _run(algo, over)  # full length (test_rl_step: the length buckets equal it)
  pk = _run(algo, {"rl.packing": True, "rl.pack_rows": 2, **over})
  assert pk["step"].traces() == 1
  lens = [float(m["train/completion_len_mean"]) for m in pk["metrics"]]
  assert len(set(lens)) == 3, lens
  rows = [float(m["train/pack_rows"]) for m in pk["metrics"]]
  assert max(rows) < 16 and len(set(rows)) > 1, rows  # fewer rows than the padded 16, following the lengths
  for m1, m2 in zip(pad["metrics"], pk["metrics"]):
    np.testing.assert_array_equal(m1["samples/tokens_NxL"], m2["samples/tokens_NxL"])
    for k in STEP_KEYS + (("train/value_loss",) if algo == "ppo" else ()):
      if k in m1:
        np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=STEP_ATOL, err_msg=k)
  for p1, p2 in zip(pad["params"], pk["params"]):
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
      np.testing.assert_allclose(b, a, rtol=0, atol=2e-5)


SHARDED = textwrap.dedent(r"""
  import json, sys
  import jax, numpy as np
  from grpo_jax.config import config_lib
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import families, rl_step
  from grpo_jax.run.train import device_batch
  from grpo_jax.tasks import digits

  class ManyEos:
    def __init__(self, vocab):
      self.eos_ids, self.eos_id, self.pad_id = tuple(range(2, vocab, 3)), 2, 0

  def run(n_dev, packing):
    c = digits.bench_config(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=12)
    c = config_lib.override(c, {"optim.lr": 1e-3, "rl.packing": packing, "rl.pack_rows": 1,
                                "mesh.data": 1, "mesh.fsdp": n_dev, "mesh.tensor": 1})
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:n_dev])
    mcfg = model_lib.ModelConfig.from_config(c.model)
    spec = digits.reward_spec(c.model.vocab_size)
    step = families.make_step(c, mesh, mcfg, spec, ManyEos(c.model.vocab_size))
    state = rl_step.init(c, mesh, mcfg, seed=0)
    out = []
    # seed 2: both steps' groups have reward variance (grad norm 0.75, then 0.45); seed 1's first step had every
    # row at reward 0 and a gradient of exactly 0, so that step's update and metrics compared nothing trained
    for b in digits.make_batches(c.rl.prompts_per_step, 2, seed=2):
      b["answer_ids_NxA"][:, 1:] = -1
      state, m = step(state, device_batch(mesh, b))
      out.append({k: float(m[k]) for k in ("train/loss", "train/grad_norm", "train/kl", "train/entropy",
                                            "train/pack_rows") if k in m})
    p = [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(jax.device_get(state["params"]))]
    return dict(metrics=out, params=p, traces=step.traces())

  def sharded():
    return {"pad1": run(1, False), "pk8": run(8, True)}
""")


@pytest.fixture(scope="module")
def subprocess_parts() -> dict:
  """SHARDED's 8-device runs and _TPU_PACKED's libtpu lowering, two parts of ONE subprocess of 8 simulated CPU devices
  (tests/script_parts.py: one Python + JAX + grpo_jax start-up instead of two; each part's result or traceback under
  its own key, so a failing part fails only its own test). The lowering reads a TPU topology: no TPU, and the CPU
  devices' runs come first."""
  parts = {"sharded": "sharded"}
  if importlib.util.find_spec("libtpu") is not None:  # else its test is skipped (or fails under CI=true) before
    parts["tpu"] = "tpu_packed"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, "-c", SHARDED + _TPU_PACKED + script_parts.tail(parts)], capture_output=True,
                       text=True, env=env, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_packed_step_on_8_fsdp_devices_equals_one_device_padded(subprocess_parts):
  """8 simulated FSDP devices, each packing its own 2 rows (1-row micro-batches, the trip count the max over
  devices), against the padded step on 1 device: losses and metrics rel 1e-5, params within 1e-5 after two steps
  of real gradients (asserted)."""
  res = script_parts.part(subprocess_parts, "sharded")
  pad, pk = res["pad1"], res["pk8"]
  assert pk["traces"] == 1
  # every compared step trains on a real gradient (not a zero-advantage batch's zero or rounding-residue one)
  assert all(m["train/grad_norm"] > 1e-3 for m in pad["metrics"]), pad["metrics"]
  for m1, m2 in zip(pad["metrics"], pk["metrics"]):
    for k in m1:
      np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=STEP_ATOL, err_msg=k)
    assert m2["train/pack_rows"] <= 16
  # params after two real updates within 1e-5 = 0.01·lr (measured 1.8e-6, 2026-12-06: 5.6x margin); the bound was
  # 2e-5 while the first step's gradient was exactly 0
  for a, b in zip(pad["params"], pk["params"]):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


# Lowers the packed policy pass (rl.packing's value_and_grad: plan, while_loop over micro-batches, forward+backward
# inside) of the GRPO objective for a v5e:2x2 slice (4 chips, FSDP), model.attention=auto; returns the splash kernels.
_TPU_PACKED = r"""
def tpu_packed():
  import re, jax, jax.numpy as jnp
  from jax.experimental import topologies
  from grpo_jax.config import config_lib
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as M
  from grpo_jax.rl import packing, rl_step
  from grpo_jax.tasks import digits
  devices = list(topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices)
  mesh = sharding.make_mesh(dict(data=1, fsdp=-1, tensor=1), devices)
  c = digits.bench_config(hidden=256, layers=1, heads=4, kv=2, inter=512, vocab=512, prompts=2, G=4, L=184)
  c = config_lib.override(c, {"task.prompt_len": 16, "rl.packing": True, "model.dtype": "bfloat16"})
  mcfg = M.ModelConfig.from_config(c.model)
  abstract = jax.eval_shape(lambda: M.init_params(mcfg, jax.random.PRNGKey(0)))
  shardings = sharding.tree_shardings(mesh, M.param_axes(mcfg))
  params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  row = lambda t, dt: jax.ShapeDtypeStruct((8, t), dt, sharding=sharding.batch_sharding(mesh, 2))
  mb = dict(seq=(row(200, jnp.int32),) * 3, mask_NxL=row(184, jnp.float32), old_logp_NxL=row(184, jnp.float32),
            adv_NxL=row(184, jnp.float32), ref_logp_NxL=row(184, jnp.float32))
  vg = packing.value_and_grad(c, lambda ps, s: rl_step.make_forward(c, mcfg, 16)(ps, s, True),
                              rl_step.make_objective(c), 16)
  with sharding.mesh_context(mesh):
    text = jax.jit(lambda p, mb: vg((p,), mb)).lower(params, mb).as_text()
  calls = [l for l in text.splitlines() if "tpu_custom_call" in l]
  return dict(kernels=sorted({n for l in calls for n in re.findall(r"splash_mha_[a-z_]+", l)}),
              whiles=text.count("stablehlo.while"))
"""


@conftest.requires("libtpu", "libtpu is not importable: pip install libtpu==0.0.42.1 (the version jax 0.10.2 pins)")
def test_tpu_lowering_of_the_packed_policy_pass_uses_splash_with_segment_ids(subprocess_parts):
  """On a TPU target the packed policy pass lowers to splash's segmented kernels (forward, dq, dkv: the packed
  rows' segment ids) inside the micro-batch while_loop."""
  r = script_parts.part(subprocess_parts, "tpu")
  assert {"splash_mha_fwd_segmented_residuals", "splash_mha_dq_segmented_no_residuals",
          "splash_mha_dkv_segmented_no_residuals"} <= set(r["kernels"]), r
  assert r["whiles"] >= 1, r


def test_roofline_and_memory_plan_model_the_packed_passes():
  """roofline: the packed passes cost their first-fit rows of pack_len (all rows at L: the padded cost);
  memory_plan: one packed micro-batch per pass plus the loop's gradient accumulator; rl/auto.py resolves
  pack_len = 0 to P + L rounded up to 128 (TPU; on the CPU below 384 tokens, P + L)."""
  from grpo_jax.perf import aot
  from grpo_jax.perf import roofline as roofline_lib
  from grpo_jax.rl import memory_plan
  c = memory_plan.workload_config("tiny", prompts=2, G=4, prompt_len=16, L=48, dtype="float32", remat="none")
  pk = config_lib.override(c, {"rl.packing": True, "rl.pack_rows": 1})
  twelve = np.full(8, 12)
  assert roofline_lib.packed_rows(pk, twelve) == (4, 64)  # 8 samples of 16 + 12 tokens: two a row of 64
  pm = aot.matmul_params(model_lib.ModelConfig.from_config(c.model))
  attn = 4 * 2 * 4 * 16
  f = aot.analytic_flops(pk, plat="cpu", lengths_N=twelve)
  assert f["reference forward"] == 2 * pm * 4 * 64 + attn * 4 * 64 * 64
  assert f["policy fwd+bwd"] == 3 * f["reference forward"]
  assert aot.analytic_flops(pk, plat="cpu")["reference forward"] == aot.analytic_flops(c, plat="cpu")[
      "reference forward"]
  mesh = dict(data=1, fsdp=1, tensor=1)
  p0, p1 = memory_plan.plan(c, mesh, plat="cpu"), memory_plan.plan(pk, mesh, plat="cpu")
  assert p1.update["gradient accumulator"] == p1.update["gradients"]
  assert p1.update["layer backward"] * 8 == p0.update["layer backward"]  # 1 packed row of 64 against 8 rows of 64
  from grpo_jax.rl import auto
  big = config_lib.override(pk, {"sampling.max_new_tokens": 184})  # T = 200
  resolved, why = auto.resolve(big, auto.Context(mesh, None, platform="tpu"))
  assert resolved.rl.pack_len == 256 and "rl.pack_len" in why, why
  # on the CPU's einsum path (T < 384) a round-up is only more columns to compute: P + L itself
  assert auto.resolve(big, auto.Context(mesh, None, platform="cpu"))[0].rl.pack_len == 200
  assert packing.default_pack_len(200, "cpu") == 200 and packing.default_pack_len(400, "cpu") == 512
  assert auto.resolve(c, auto.Context(mesh, None))[0].rl.pack_len == 0  # packing off: left alone


def test_pack_rows_default_and_auto_knob():
  """rl.pack_rows = 0: on the CPU the fewest packed rows of CPU_MICROBATCH_TOKENS tokens, elsewhere an eighth of a
  device's rows; rl/auto.py resolves it to that when the memory plan fits and halves it when it does not."""
  from grpo_jax.rl import auto
  from grpo_jax.rl import memory_plan
  assert packing.default_pack_rows(64, 640, "cpu") == 1 and packing.default_pack_rows(64, 138, "cpu") == 4
  assert packing.default_pack_rows(64, 640, "tpu") == 8 and packing.default_pack_rows(2, 138, "cpu") == 2
  c = config_lib.override(digits.bench_config(**dict(TINY, L=500, prompts=8)), {"rl.packing": True})  # T = 510
  mesh = dict(data=1, fsdp=1, tensor=1)
  assert auto.resolve(c, auto.Context(mesh, None, platform="cpu"))[0].rl.pack_rows == 1
  n = c.rl.prompts_per_step * c.rl.G
  on_tpu = lambda hbm: auto.resolve(c, auto.Context(mesh, hbm, platform="tpu"))[0].rl.pack_rows
  assert on_tpu(None) == -(-n // 8) > 1
  c = config_lib.override(c, {"rl.pack_len": 512})
  fit = lambda r: memory_plan.plan(config_lib.override(c, {"rl.pack_rows": r}), mesh, "tpu").total_bytes
  assert fit(1) < fit(on_tpu(None))
  r = on_tpu(fit(1))  # the default's micro-batch does not fit: fewer rows, one that does
  assert r < on_tpu(None) and fit(r) <= fit(1)
  assert auto.resolve(config_lib.override(c, {"rl.packing": False}), auto.Context(mesh, None))[0].rl.pack_rows == 0


def _whiles(jaxpr):
  """(while equations, those whose predicate is batched: a vector, not a scalar)."""
  n, batched = 0, 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "while":
      n += 1
      batched += eqn.params["cond_jaxpr"].jaxpr.outvars[0].aval.shape != ()
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          a, b = _whiles(getattr(inner, "jaxpr", inner))
          n, batched = n + a, batched + b
  return n, batched


def test_trip_count_is_reduced_over_vmapped_runs():
  """Under seeds.py's runs vmap the micro-batch count is the max over runs, so the packed loops keep an unbatched
  trip count (a batched one runs every run's body until all are done, under selects)."""
  from grpo_jax.rl import update as update_lib
  from grpo_jax.studies import vmapped_runs as seeds_lib
  c = config_lib.override(digits.bench_config(**dict(TINY, L=12, prompts=4)), {"rl.packing": True})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = rl_step.build_step(c, mcfg, spec, _ManyEos(c.model.vocab_size))
  states = jax.eval_shape(lambda: seeds_lib.init_states(c, mcfg, [0, 1]))
  batch = next(digits.make_batches(c.rl.prompts_per_step, 1, seed=1))
  named = jax.make_jaxpr(jax.vmap(step, in_axes=(0, None), axis_name=update_lib.RUNS_AXIS))(states, batch)
  n, batched = _whiles(named.jaxpr)
  assert n >= 2 and batched == 0, (n, batched)  # reference forward and update loops (and the plan's none)
  toy = lambda n: jax.lax.while_loop(lambda c: c < n, lambda c: c + 1, 0)  # the check tells them apart
  assert _whiles(jax.make_jaxpr(jax.vmap(toy))(jnp.arange(3)).jaxpr) == (1, 1)
  assert _whiles(jax.make_jaxpr(jax.vmap(lambda n: toy(jax.lax.pmax(n, "r")), axis_name="r"))(jnp.arange(3)).jaxpr)[1] == 0


@pytest.mark.parametrize("algo", ["cispo", "sapo"])
def test_packed_new_objectives_with_correction_weights_equal_padded(algo):
  """CISPO and SAPO with a rollout correction's weights (rl/correction.py: stop-gradient w per token, the rejected
  tokens out of the mask) in packed 1-row micro-batches: loss, gradient and each statistic (CISPO's clip fractions,
  SAPO's gate_mean / gated_frac, entropy, ratio extremes) equal the padded pass, whose statistics are over the tokens
  the correction kept. CISPO with PPO's 0.2 / 0.28 range, so its weight clips on both sides (its preset's 1 / 3 does
  not on this batch). Lite PPO is the clip objective, covered by test_packed_policy_pass_equals_padded."""
  over = {"cispo": {"rl.eps_low": 0.2, "rl.eps_high": 0.28}, "sapo": {}}[algo]
  c = _config(algo, **{"rl.rollout_correction": "icepop", **over})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  mb = _minibatch(c, mcfg, params)
  rng = np.random.default_rng(5)
  log_rho = jnp.asarray(rng.normal(0, 0.8, mb["mask_NxL"].shape), jnp.float32)
  corr = jit_call(correction.build, c, mb["old_logp_NxL"], mb["old_logp_NxL"] - log_rho, mb["mask_NxL"])  # as the step
  assert 0 < float(jnp.sum(mb["mask_NxL"] - corr.mask_NxL)) < float(jnp.sum(mb["mask_NxL"]))  # some rejected
  mb = dict(mb, mask_NxL=corr.mask_NxL, is_w_NxL=corr.is_w_NxL)
  forward, objective = rl_step.make_forward(c, mcfg, P), rl_step.make_objective(c)
  a1, _ = _compare(c, forward, objective, (params,), mb, rows=1)
  if algo == "cispo":
    assert float(a1["clip_frac_low"]) > 0 and float(a1["clip_frac_high"]) > 0, a1
  else:
    assert 0 < float(a1["gate_mean"]) < 1 and "gated_frac" in a1, a1
