"""LoRA RL (model.lora): step 0 is the base exactly, only adapters train, the base is the reference, decode merges,
every preset and PPO run, sharded equals unsharded, vmapped runs hold the base once, config errors are one line."""
import dataclasses
import functools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.config import presets
from grpo_jax.infra import sharding
from grpo_jax.model import decode
from grpo_jax.model import lora
from grpo_jax.model import model as model_lib
from grpo_jax.model.model_config import LoraConfig
from grpo_jax.rl import families
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rl import state as state_lib
from grpo_jax.rollout import sampling
from grpo_jax.run import validate
from grpo_jax.studies import vmapped_runs
from grpo_jax.tasks import digits
from tests import noise

# One layer: no claim of the steps here depends on depth, and the training pass unrolls its layer scan
# (model.layer_unroll auto), so each layer of every step program (LoRA, full, PPO, vmapped, sharded, each preset's
# trace) was traced, lowered and compiled again. The tests that index a layer of a stack use 2 (TWO_LAYERS).
TINY = dict(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=12)
TWO_LAYERS = dict(layers=2)
RANK = 4


def _config(rank=RANK, **over):
  c = digits.bench_config(**{**TINY, **over})
  c.optim.lr = 1e-3
  c.model.lora.update(rank=rank, alpha=8.0)
  return c


def _setup(c):
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  return mesh, mcfg, spec


def _batch(c, seed=1):
  b = next(digits.make_batches(c.rl.prompts_per_step, 1, seed=seed))
  b["answer_ids_NxA"][:, 1:] = -1  # single-digit answers: a random model hits some
  return b


def _nonzero_adapters(mcfg, key=3):
  """Adapters with B != 0 (a trained-looking policy: the adapter term is not zero). One compiled program: op by op
  the init and the per-leaf noise compiled ~40 tiny ones."""
  return _nonzero_adapters_jit(mcfg, key)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _nonzero_adapters_jit(mcfg, key):
  # one normal draw over all leaves (tests/noise.py: a draw per leaf took 3x the compile). Its key: from_adapters'
  # first batch needs reward variance (grad norm 0.042 at key + 2; the draw of key + 1 earned no reward there, and
  # its only gradient, the KL's, was 2.7e-4)
  return noise.add_noise(lora.init_adapters(mcfg, jax.random.PRNGKey(key)), jax.random.PRNGKey(key + 2), 0.05)


@pytest.fixture(scope="module")
def runs():
  """One LoRA step and one full-fine-tuning step of the same config, seed and batch (GRPO preset, β = 0.04)."""
  out = {}
  for name, rank in (("lora", RANK), ("full", 0)):
    c = _config(rank)
    mesh, mcfg, spec = _setup(c)
    step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
    st = rl_step.init(c, mesh, mcfg, seed=0)
    s0 = jax.device_get(st)
    st, m = step(st, _batch(c))
    out[name] = dict(c=c, mcfg=mcfg, s0=s0, s1=jax.device_get(st), m=jax.device_get(m), step=step)
  return out


@pytest.fixture(scope="module")
def from_adapters(runs):
  """Two steps of the `runs` fixture's LoRA step (the same config: traced once) from nonzero adapters (B != 0: from
  LoRA's B = 0 the step gives A a gradient of exactly 0), seed 0, the same batch twice: the single run that
  test_vmapped_runs_... and test_sharded_lora_step_... compare with (host copies: the step donates its state)."""
  c = _config()
  mesh, mcfg, _ = _setup(c)
  ad = jax.device_get(_nonzero_adapters(mcfg))
  step = runs["lora"]["step"]
  st, m1 = step(dict(rl_step.init(c, mesh, mcfg, seed=0), params=ad), _batch(c))
  st1, m1 = jax.device_get(st), jax.device_get(m1)
  st, m2 = step(st, _batch(c))  # the second step samples from the first update's policy
  return dict(ad=ad, st1=st1, m1=m1, st2=jax.device_get(st), m2=jax.device_get(m2))


def test_peft_init_and_scaling():
  """A ~ U(±1/√fan_in) as PEFT's kaiming_uniform_(a=√5), B = 0; scale alpha/r, rsLoRA alpha/√r."""
  assert LoraConfig(16, 32.0).scale == 2.0 and LoraConfig(16, 32.0, rslora=True).scale == 8.0
  mcfg = model_lib.ModelConfig(vocab_size=64, hidden=32, layers=2, heads=4, kv_heads=2, inter=256,
                               lora=LoraConfig(8, 16.0))
  ad = lora.init_adapters(mcfg, jax.random.PRNGKey(0))["layers"]
  for m, fan_in in (("q", 32), ("o", 32), ("down", 256), ("gate", 32)):
    a = np.asarray(ad[m]["lora_a"])
    assert np.abs(a).max() <= 1 / np.sqrt(fan_in) and np.abs(a).max() > 0.9 / np.sqrt(fan_in)
    assert np.abs(a).mean() == pytest.approx(0.5 / np.sqrt(fan_in), rel=0.15)  # uniform: E|a| = bound / 2
    assert not np.asarray(ad[m]["lora_b"]).any()
  assert ad["q"]["lora_b"].shape == (2, 8, 4, 8) and ad["o"]["lora_a"].shape == (2, 4, 8, 8)


def test_step0_logits_equal_the_base_exactly(runs):
  r = runs["lora"]
  mcfg, s0 = r["mcfg"], r["s0"]
  tok = jax.random.randint(jax.random.PRNGKey(2), (2, 9), 0, 64)
  pos, mask = jnp.broadcast_to(jnp.arange(9), (2, 9)), jnp.ones((2, 9), jnp.int32)
  forward = jax.jit(model_lib.forward, static_argnums=0)  # compiled, as the step runs it
  base = forward(mcfg, s0["base"], tok, pos, mask)
  policy = forward(mcfg, state_lib.model_params(s0), tok, pos, mask)
  np.testing.assert_array_equal(np.asarray(policy), np.asarray(base))
  # ... and the base is the full-fine-tuning run's initial params (same seed), so the whole first rollout agrees.
  for a, b in zip(jax.tree.leaves(s0["base"]), jax.tree.leaves(runs["full"]["s0"]["params"])):
    np.testing.assert_array_equal(a, b)


def test_only_adapters_train_and_the_base_stays(runs):
  s0, s1 = runs["lora"]["s0"], runs["lora"]["s1"]
  names = {jax.tree_util.keystr(p[-1:]) for p, _ in jax.tree_util.tree_flatten_with_path(s1["params"])[0]}
  assert names == {"['lora_a']", "['lora_b']"}
  # the optimizer state holds moments of the adapters only: no leaf is base-sized
  n_adapter = sum(x.size for x in jax.tree.leaves(s1["params"]))
  n_opt = sum(x.size for x in jax.tree.leaves(s1["opt_state"]))
  assert n_opt <= 2 * n_adapter + 8
  for a, b in zip(jax.tree.leaves(s0["base"]), jax.tree.leaves(s1["base"])):
    np.testing.assert_array_equal(a, b)
  moved = max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(s0["params"]), jax.tree.leaves(s1["params"])))
  assert moved > 0 and np.abs(np.asarray(s1["params"]["layers"]["q"]["lora_b"])).max() > 0


def test_gradient_reaches_adapters_only(runs):
  """d loss / d base through the policy forward is what the step never computes: the loss is a function of the
  adapters with the base a constant; the adapters' gradient is nonzero (B's, at B = 0, through A)."""
  mcfg, st = runs["lora"]["mcfg"], runs["lora"]["s0"]  # the initial LoRA state (rl_step.init, seed 0)
  tok = jax.random.randint(jax.random.PRNGKey(2), (2, 9), 0, 64)
  pos, mask = jnp.broadcast_to(jnp.arange(9), (2, 9)), jnp.ones((2, 9), jnp.int32)
  loss = lambda p: model_lib.token_logprobs(mcfg, state_lib.model_params(st, p), tok, pos, mask)[0].sum()
  g = jax.jit(jax.grad(loss))(st["params"])  # compiled: op by op the backward took ~3x the CPU
  assert jax.tree.structure(g) == jax.tree.structure(st["params"])
  assert float(jnp.abs(g["layers"]["q"]["lora_b"]).max()) > 0
  assert float(jnp.abs(g["layers"]["q"]["lora_a"]).max()) == 0.0  # B = 0: no gradient reaches A yet


def test_reference_is_the_base_kl_zero_at_step0(runs):
  lo, full = runs["lora"], runs["full"]
  assert "ref_params" not in lo["s0"] and "ref_params" in full["s0"]
  assert abs(float(lo["m"]["train/kl"])) < 1e-9  # sampler vs training-forward rounding only, as full FT's
  # policy == base at step 0, so the step-0 rollout, rewards, KL and loss equal full fine-tuning's exactly
  np.testing.assert_array_equal(lo["m"]["samples/tokens_NxL"], full["m"]["samples/tokens_NxL"])
  for k in ("train/reward_mean", "train/kl", "train/loss", "train/entropy", "train/completion_len_mean"):
    assert lo["m"][k] == full["m"][k], k


def test_merged_decode_logprobs_equal_the_unmerged_forward():
  c = _config(**TWO_LAYERS)  # decode's layer 1 is the merge's layer 1
  _, mcfg, _ = _setup(c)
  base = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  policy = lora.combine(base, _nonzero_adapters(mcfg))
  scfg = sampling.SamplingConfig.from_config(c.sampling, eos_id=1, pad_id=0)
  b = _batch(c)
  # sample and the forward compiled (the step runs them so); op by op they took ~3x the CPU
  sample = jax.jit(sampling.sample, static_argnums=(0, 5))
  logprobs = jax.jit(rollout_lib.completion_logprobs, static_argnums=(0, 3, 4))
  s = sample(mcfg, policy, jnp.asarray(b["prompt_NxP"]), jnp.asarray(b["prompt_mask_NxP"]), jax.random.PRNGKey(5),
             scfg)
  seq = rollout_lib.full_sequence(jnp.asarray(b["prompt_NxP"]), jnp.asarray(b["prompt_mask_NxP"]), s.tokens_NxL,
                                  s.mask_NxL)
  P = b["prompt_NxP"].shape[1]
  fwd_NxL, _ = logprobs(mcfg, policy, seq, P, 1.0)  # unmerged: x·W + scale·(x·A)·B
  mask = np.asarray(s.mask_NxL) > 0
  np.testing.assert_allclose(np.asarray(s.logp_NxL)[mask], np.asarray(fwd_NxL)[mask], atol=2e-5)
  # the adapters matter: the base's log-probs of the same tokens differ by far more than that
  base_NxL, _ = logprobs(mcfg, base, seq, P, 1.0)
  assert np.abs(np.asarray(base_NxL)[mask] - np.asarray(fwd_NxL)[mask]).max() > 1e-2
  # decode's weights are the merged kernels: no adapter left in them
  w = decode.decode_weights(mcfg, policy)
  assert "lora_a" not in w.layers[0]["q"]
  np.testing.assert_allclose(np.asarray(w.layers[1]["q"]["kernel"]),
                             np.asarray(lora.merged(mcfg, policy)["layers"]["q"]["kernel"][1]), atol=1e-7)


@pytest.mark.parametrize("base_dtype,dtype", [("float32", None), ("bfloat16", jnp.float32)])
def test_merged_equals_the_eager_merge_bit_for_bit(base_dtype, dtype):
  """lora.merged runs each module's W + scale·A·B as one jitted program (an export's merge was a compile per op
  and shape): its kernels equal the op-by-op merge's bit for bit, stacked or one layer, in the kernel's dtype or
  export's float32; the leaves it does not merge (embedding, norms) are passed through, not copied."""
  plain = model_lib.ModelConfig(vocab_size=64, hidden=32, layers=2, heads=4, kv_heads=2, inter=48, max_len=32,
                                qkv_bias=True, tie_embeddings=False)
  mcfg = dataclasses.replace(plain, lora=LoraConfig(3, 5.0, base_dtype=base_dtype))
  base = lora.hold_base(mcfg, model_lib.init_params(plain, jax.random.PRNGKey(0)))
  adapters = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(2), x.shape),
                          lora.init_adapters(mcfg, jax.random.PRNGKey(1)))
  policy = lora.combine(base, adapters)
  got = lora.merged(mcfg, policy, dtype)
  with jax.disable_jit():
    want = lora.merged(mcfg, policy, dtype)
  for m in ("q", "k", "v", "o", "gate", "up", "down"):
    g, w = got["layers"][m]["kernel"], want["layers"][m]["kernel"]
    assert g.dtype == w.dtype == (dtype or base["layers"][m]["kernel"].dtype) and "lora_a" not in got["layers"][m]
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32), err_msg=m)
    one = {k: v[1] for k, v in policy["layers"][m].items()}  # decode's per-layer merge: one unstacked module
    np.testing.assert_array_equal(np.asarray(lora.merge_module(mcfg, m, one, dtype)["kernel"], np.float32),
                                  np.asarray(w[1], np.float32), err_msg=m)
  assert np.abs(np.asarray(got["layers"]["q"]["kernel"], np.float32) -
                np.asarray(base["layers"]["q"]["kernel"], np.float32)).max() > 1e-2  # the adapters were merged
  assert got["embed"] is base["embed"] and got["layers"]["attn_norm"] is base["layers"]["attn_norm"]


def test_decode_of_a_bfloat16_base_keeps_the_adapter_delta():
  """model.lora.base_dtype=bfloat16 under float32 compute: the decode copy is W + scale·A·B rounded once to the
  compute dtype, so a decode step's logits equal the unmerged training forward's. Merged into the bfloat16 kernel
  (the base's dtype), the rounding lost up to half an ulp of W per weight: 0.07 of logits here, about half of what
  a small adapter changes (the sampler's policy was not the trained one)."""
  from tests.test_model import random_params  # O(1) weights: a bfloat16 ulp of W is not lost below the logits' noise
  mcfg = model_lib.ModelConfig(vocab_size=64, hidden=32, layers=1, heads=4, kv_heads=2, inter=64, max_len=8,
                               lora=LoraConfig(4, 8.0, base_dtype="bfloat16"))
  base = lora.hold_base(mcfg, random_params(dataclasses.replace(mcfg, lora=None), 0))
  assert base["layers"]["q"]["kernel"].dtype == jnp.bfloat16
  policy = lora.combine(base, _nonzero_adapters(mcfg))
  tokens = np.array([[5, 9, 11, 3, 7], [0, 0, 4, 8, 2]], np.int32)
  mask = (tokens > 0).astype(np.int32)
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)

  @jax.jit
  def both(policy):
    full = model_lib.forward(mcfg, policy, tokens, pos, mask)[:, -1]
    cache = decode.init_cache(mcfg, 2, 5)
    _, cache = decode.prefill(mcfg, policy, tokens[:, :4], pos[:, :4], mask[:, :4], cache)
    return full, decode.decode_step(mcfg, policy, tokens[:, 4], pos[:, 4], cache, 4, mask)[0], \
        model_lib.forward(mcfg, base, tokens, pos, mask)[:, -1]

  full, step, base_logits = (np.asarray(x) for x in both(policy))
  assert np.abs(full - base_logits).max() > 0.05  # the adapters move the logits
  np.testing.assert_allclose(step, full, atol=1e-4)


def test_final_params_of_a_bfloat16_base_keep_the_adapter_delta():
  """train.final_params (a LoRA SFT stage's DIR/sft/params, what the next stage starts from) merged W + scale·A·B
  in float32 but returned it in the held kernel's dtype: with model.lora.base_dtype=bfloat16 a small trained delta
  was rounded away (the export keeps float32). Against a NumPy float64 merge of the same bf16 base."""
  from grpo_jax.run import train  # pylint: disable=import-outside-toplevel
  c = _config(**TWO_LAYERS)  # each layer of the stack merged with its own adapters
  c.model.lora.base_dtype = "bfloat16"
  _, mcfg, _ = _setup(c)
  base = lora.hold_base(mcfg, model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  adapters = jax.tree.map(lambda x: x * 0.05, _nonzero_adapters(mcfg))  # a delta below bf16's spacing of W
  out = train.final_params(mcfg, {"params": adapters, "base": base})
  scale = mcfg.lora.scale
  assert len(adapters["layers"]) == 7
  for m in adapters["layers"]:
    w = np.asarray(base["layers"][m]["kernel"], np.float64)
    a, b = (np.asarray(adapters["layers"][m][k], np.float64) for k in ("lora_a", "lora_b"))
    want = w + scale * np.stack([np.tensordot(a[l], b[l], axes=1) for l in range(w.shape[0])])
    got = out["layers"][m]["kernel"]
    assert got.dtype == jnp.float32 and "lora_a" not in out["layers"][m], m
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=1e-6, err_msg=m)
    assert np.abs(want - w).max() > 1e-4  # the delta is there to lose
  assert {x.dtype for x in jax.tree.leaves(out)} == {jnp.dtype(jnp.float32)}  # the plain model's, as it loads them


@pytest.mark.parametrize("algo", presets.names())
def test_every_preset_traces_with_lora(algo):
  """Each preset's step (PPO: its critic too) builds and traces on a LoRA state without reference params."""
  c = presets.apply(_config(), algo)
  mesh, mcfg, spec = _setup(c)
  family = families.for_config(c)
  abstract, shard = family.state_spec(c, mesh, mcfg)
  assert "ref_params" not in abstract and "base" in abstract
  step = family.build_step(c, mcfg, spec, spec.ctx.tokenizer)
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _batch(c))
  with sharding.mesh_context(mesh):
    new, m = jax.eval_shape(step, abstract, batch)
  assert jax.tree.structure(new) == jax.tree.structure(abstract)
  assert ("train/kl" in m) == state_lib.uses_reference(c)


def test_continuous_engine_step_traces_with_lora():
  """sampling.engine=continuous (rollout/engine.py) prepares its decode weights through decode_layout.prepare, which
  merges the adapters as for the static engine: the LoRA step traces with it and keeps the state's structure."""
  c = _config()
  # compaction 1: one decode phase to trace (the unresolved default traced one per slot count); the claim is the
  # decode weights' merge, which every phase shares
  c.sampling.update(engine="continuous", compaction=1)
  mesh, mcfg, spec = _setup(c)
  abstract, _ = rl_step.state_spec(c, mesh, mcfg)
  step = rl_step.build_step(c, mcfg, spec, spec.ctx.tokenizer)
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _batch(c))
  with sharding.mesh_context(mesh):
    new, _ = jax.eval_shape(step, abstract, batch)
  assert jax.tree.structure(new) == jax.tree.structure(abstract)


def test_ppo_separate_critic_is_its_own_adapters_on_the_base():
  c = presets.apply(_config(), "ppo")
  mesh, mcfg, spec = _setup(c)
  family = families.for_config(c)
  st = family.init(c, mesh, mcfg, seed=0)
  body = jax.device_get(st["critic_params"]["body"])  # (the step donates the state)
  assert jax.tree.structure(body) == jax.tree.structure(st["params"])  # adapters, not a model copy
  step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  st2, m = step(st, _batch(c))
  # (the value head starts at 0, so the critic's trunk gets its first gradient in the second step)
  st2, m = step(st2, _batch(c, seed=2))
  assert np.isfinite(float(m["train/value_loss"])) and int(st2["step"]) == 2
  moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(body),
                                                          jax.tree.leaves(jax.device_get(st2["critic_params"]["body"]))))
  assert moved > 0


def test_vmapped_runs_hold_the_base_once_and_match_single_runs(runs, from_adapters):
  c = _config()
  mesh, mcfg, spec = _setup(c)
  base = runs["lora"]["s0"]["base"]
  states = vmapped_runs.init_states(c, mcfg, [0, 1], init_seeds=[0, 0], params=base)
  assert states["base"]["layers"]["q"]["kernel"].ndim == 4  # [L, D, H, Dh]: not stacked
  assert states["params"]["layers"]["q"]["lora_a"].shape[0] == 2
  # Both runs and the single run start from the same nonzero adapters (B != 0): from LoRA's B = 0 the step gives A
  # a gradient of exactly 0, so half the leaves compared below were the init on both sides
  ad = from_adapters["ad"]
  states = dict(states, params=jax.tree.map(lambda x: jnp.stack([x, x]), ad))
  steps = vmapped_runs.make_steps(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  states, m = steps(states, _batch(c))
  assert steps.traces() == 1
  # run 0 is the single run of seed 0 (same base, same adapters, same rollout key): from_adapters' first step
  st, m1 = from_adapters["st1"], from_adapters["m1"]
  assert float(m1["train/grad_norm"]) > 1e-3, float(m1["train/grad_norm"])  # a real gradient
  np.testing.assert_array_equal(np.asarray(m["samples/tokens_NxL"])[0], m1["samples/tokens_NxL"])
  # every adapter leaf (A and B) moved by a visible fraction of lr: the params compared are trained ones
  moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(jax.tree.leaves(st["params"]),
                                                                               jax.tree.leaves(ad))]
  assert min(moved) > 0.5 * c.optim.lr, moved
  run0 = jax.tree.leaves(vmapped_runs.run_state(jax.device_get(states), 0)["params"])
  # within 2e-7 = 2e-4·lr (measured 1.5e-8, 2026-12-06: 13x margin); the bound was 1e-6 while half the leaves
  # compared were untrained
  for a, b in zip(run0, jax.tree.leaves(st["params"])):
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-7)
  with pytest.raises(ValueError, match="one frozen base"):
    vmapped_runs.init_states(c, mcfg, [0, 1], init_seeds=[0, 1])


def test_state_bytes_no_reference_no_base_moments(runs):
  nbytes = lambda t: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(t))
  lo, full = runs["lora"]["s0"], runs["full"]["s0"]
  model = nbytes(full["params"])
  assert nbytes(lo["base"]) == model
  adapters = nbytes(lo["params"])
  assert abs(nbytes(lo["opt_state"]) - 2 * adapters) <= 64  # Adam's moments of the adapters (+ counters)
  assert nbytes(full) > 3.9 * model  # params + ref + 2 moments
  assert nbytes(lo) < 0.5 * nbytes(full)


def test_sft_lora_is_a_choice():
  from grpo_jax.rl import sft_step
  c = _config()
  mcfg = model_lib.ModelConfig.from_config(c.model)
  assert sft_step.model_config(c, mcfg).lora is None  # default: the SFT stage trains all weights
  c.sft.lora = True
  assert sft_step.model_config(c, mcfg).lora == mcfg.lora


def test_lora_is_refused_for_the_r1_pipeline():
  c = config_lib.override(config_lib.load_config("configs/r1_pipeline.py", "small"), {"model.lora.rank": 8})
  with pytest.raises(validate.ConfigError, match="model.lora.rank.*r1_pipeline"):
    validate.validate_model(c)


@pytest.mark.parametrize("key,value,match", [
    ("model.lora.rank", -1, "model.lora.rank"), ("model.lora.alpha", 0.0, "model.lora.alpha"),
    ("model.lora.targets", ("q_proj", "qkv"), "model.lora.targets"),
    ("model.lora.base_dtype", "float16", "model.lora.base_dtype"), ("model.lora.rank", 999, "exceeds")])
def test_bad_lora_config_is_one_line(key, value, match):
  c = config_lib.override(_config(), {key: value})
  with pytest.raises(validate.ConfigError, match=match) as e:
    validate.validate_model(c)
  assert "\n" not in str(e.value)


def test_rank_check_names_the_smallest_targeted_width():
  """The rank is checked against the smallest width of the projections it targets, read off the adapters' own
  shapes: a k/v projection's output (kv_heads × head_dim = 1 × 8 here) lies below hidden and inter. The check
  compared with min(hidden, inter) only, so rank 16 passed and its message, past hidden, named hidden."""
  c = _config(rank=16, hidden=32, heads=4, kv=1)
  c.model.head_dim = 8
  mc = model_lib.ModelConfig.from_config(c.model)
  shapes = lora.adapter_shapes(mc)["layers"]
  widths = {m: (int(np.prod(s["lora_a"].shape[1:-1])), int(np.prod(s["lora_b"].shape[2:]))) for m, s in shapes.items()}
  assert {f"{m}_proj": w for m, w in widths.items()} == validate.lora_dims(c.model)
  assert widths["k"] == (32, 8)
  with pytest.raises(validate.ConfigError, match=r"rank: 16 exceeds .*k_proj's output, kv_heads×head_dim = 8; set "
                     r"model.lora.rank <= 8, or drop k_proj, v_proj from model.lora.targets\.$"):
    validate.validate_model(c)
  c.model.lora.rank = 8
  validate.validate_model(c)  # at the smallest width
  c.model.lora.update(rank=16, targets=("q_proj", "o_proj", "up_proj"))
  validate.validate_model(c)  # k and v not targeted: 32 is the smallest
  c.model.lora.update(rank=33, targets=("q_proj", "up_proj"))
  with pytest.raises(validate.ConfigError, match=r"q_proj's input, hidden = 32; set model.lora.rank <= 32\.$"):
    validate.validate_model(c)


def test_lora_knobs_that_would_train_nothing_are_refused_or_said(caplog):
  """job=sft (or pretrain) with model.lora.rank > 0 and sft.lora off trained all weights without a word, and
  `export` then read its full-weight checkpoints as adapters ('every one damaged or unreadable'); sft.lora=True with
  rank 0 trained all weights too: both one line. LoRA knobs set at rank 0 are logged as having no effect."""
  import logging  # pylint: disable=import-outside-toplevel
  sft_job = config_lib.override(_config(), {"job": "sft"})
  with pytest.raises(validate.ConfigError, match=r"model.lora.rank: 4 under job=sft.*set sft.lora=True") as e:
    validate.validate_model(sft_job)
  assert "\n" not in str(e.value)
  validate.validate_model(config_lib.override(sft_job, {"sft.lora": True}))  # adapters: what was asked
  with pytest.raises(validate.ConfigError, match=r"sft.lora: is True .* but model.lora.rank=0") as e:
    validate.validate_model(config_lib.override(_config(0), {"sft.lora": True}))
  assert "\n" not in str(e.value)
  with caplog.at_level(logging.WARNING):
    validate.validate_model(config_lib.override(_config(0), {"model.lora.rslora": True}))
  lines = [r.getMessage() for r in caplog.records if "no effect with model.lora.rank=0" in r.getMessage()]
  assert len(lines) == 1 and lines[0].startswith("model.lora.alpha=8.0, model.lora.rslora=True: no effect"), lines
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    validate.validate_model(digits.bench_config(**TINY))  # rank 0, nothing else set: nothing said
  assert not any("model.lora" in r.getMessage() for r in caplog.records)


def test_grpo_arith_lora_arg_combines_with_small():
  c = config_lib.load_config("configs/grpo_arith.py", "small,lora=True")
  assert c.model.lora.rank == 16 and c.model.lora.alpha == 32.0 and c.model.hidden == 64
  assert config_lib.load_config("configs/grpo_arith.py", "small").model.lora.rank == 0


SHARDED = textwrap.dedent(r"""
  import json, sys
  import jax, numpy as np
  sys.path.insert(0, sys.argv[1])
  from tests import test_lora as T
  from grpo_jax.rl import families, rl_step
  from grpo_jax.model import model as model_lib
  from grpo_jax.infra import sharding
  from grpo_jax.run.train import device_batch
  from grpo_jax.tasks import digits

  def run(shape):
    c = T._config()
    c.mesh.update(data=shape[0], fsdp=shape[1], tensor=shape[2])
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:int(np.prod(shape))])
    mcfg = model_lib.ModelConfig.from_config(c.model)
    spec = digits.reward_spec(c.model.vocab_size)
    step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
    state = rl_step.init(c, mesh, mcfg, seed=0)
    specs = {"base_q": str(tuple(state["base"]["layers"]["q"]["kernel"].sharding.spec)),
             "lora_a_q": str(tuple(state["params"]["layers"]["q"]["lora_a"].sharding.spec)),
             "lora_b_q": str(tuple(state["params"]["layers"]["q"]["lora_b"].sharding.spec))}
    # the module's from_adapters start (B != 0: this batch's first loss is exactly 0 with a zero gradient in exact
    # arithmetic from LoRA's B = 0, so the only update would be AdamW amplifying rounding residue), in the state's
    # shardings
    ad = jax.device_get(T._nonzero_adapters(mcfg))
    state = dict(state, params=jax.tree.map(lambda a, s: jax.device_put(np.asarray(a), s.sharding), ad,
                                            state["params"]))
    state, m = step(state, device_batch(mesh, T._batch(c)))
    state, m = step(state, device_batch(mesh, T._batch(c)))  # the second step samples from the first update's policy
    m = jax.device_get(m)
    p2 = jax.device_get(state["params"])
    return dict(specs=specs, tokens=np.asarray(m["samples/tokens_NxL"]).tolist(), entropy=float(m["train/entropy"]),
                grad_norm=float(m["train/grad_norm"]),
                params=[np.asarray(x).ravel().tolist() for x in jax.tree.leaves(p2)])

  # every mesh shape of argv, each its own step on its own devices, in this one process (one JAX start-up)
  print("JSON" + json.dumps({a: run(tuple(int(x) for x in a.split(","))) for a in sys.argv[2:]}))
""")


def _sharded_runs(*shapes: str) -> dict:
  """SHARDED's results per mesh shape, all shapes in one subprocess of 8 simulated devices (the 1-device reference
  runs there on devices[:1]: a mesh of one device, as in a 1-device process)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", SHARDED, root, *shapes], capture_output=True, text=True, env=env,
                       timeout=600, cwd=root)
  assert out.returncode == 0, out.stderr[-4000:]
  return json.loads(out.stdout.split("JSON", 1)[1])


def test_sharded_lora_step_matches_single_device(from_adapters):
  """A LoRA step on a (2, 2, 2) mesh equals the 1-device run (the module's from_adapters, in this process) within
  test_sharding's tolerances (params after two AdamW steps from a nonzero B, which move both adapters; the second
  step's samples, entropy and gradient norm); the adapters follow the base kernel's logical axes (A its input axes,
  B its output axes)."""
  r = _sharded_runs("2,2,2")["2,2,2"]
  m2, ad = from_adapters["m2"], from_adapters["ad"]
  p2 = from_adapters["st2"]["params"]
  assert r["specs"]["base_q"] == "(None, 'fsdp', 'tensor', None)"
  assert r["specs"]["lora_a_q"] == "(None, 'fsdp', None)" and r["specs"]["lora_b_q"] == "(None, None, 'tensor', None)"
  assert r["tokens"] == np.asarray(m2["samples/tokens_NxL"]).tolist()
  assert abs(r["entropy"] - float(m2["train/entropy"])) < 1e-5
  assert abs(r["grad_norm"] - float(m2["train/grad_norm"])) < 1e-4 * max(1.0, float(m2["train/grad_norm"]))
  # every adapter leaf moved by a visible fraction of lr over the two updates (so the comparison is of trained
  # params): on one device here, and on the mesh as far as its params equal these
  moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(ad))]
  assert min(moved) > 0.5 * 1e-3, moved
  ref = [np.asarray(x).ravel() for x in jax.tree.leaves(p2)]
  assert len(r["params"]) == len(ref)
  for a, b in zip(r["params"], ref):
    assert np.abs(np.asarray(a) - b).max() < 2e-5
