"""Multi-turn RL with tools through the real RL step (docs/tools.md): observation tokens get no gradient from the
step's loss, the environment's rewards reach the reward terms and the process path, the step compiles once whatever
the number of turns, a failed environment call keeps the state and names the environment, vmapped seeds, LoRA, a
run killed inside an environment call resumes exactly, and bad `tools` settings are one-line refusals.

The model is a random tiny one on the `tools` tokenizer; the environment is tests/tool_envs.py's Echo, and the stop
markers are `</tool_call>` plus 15 ordinary pieces, so a random model's rows call it often."""
import functools
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.envs import batch as env_batch
from grpo_jax.infra import host_calls
from grpo_jax.infra import sharding
from grpo_jax.model import model as model_lib
from grpo_jax.rl import families
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rollout import carry as carry_lib
from grpo_jax.run import train
from grpo_jax.run import validate
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer as tokenizer_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib
from tests import metrics_contract
from tests import tool_envs
from tests.jit_call import jit_call

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = tokenizer_lib.load_tools()
L = 24


def markers(n=15):
  """`</tool_call>` and n ordinary single pieces (the random model emits each about 1/516 of the time)."""
  out = ["</tool_call>"]
  for i in range(100, 500):
    text = TOK.decode([i])
    if text.strip() and TOK.encode(text) == [i] and len(out) <= n:
      out.append(text)
  return tuple(out)


MARKERS = markers()


def tools_config(**over):
  c = config_lib.load_config(os.path.join(ROOT, "configs", "tools_calc.py"), "small")
  # 4 heads / 2 kv heads: the 8-device test's tensor axis of 2 splits them, so its one-device reference is the
  # `stepped` fixture's first step (AdamW's ε 1e-6: see test_rl_step_on_8_devices_equals_one_device)
  c.model.update(hidden=32, inter=64, layers=1, heads=4, kv_heads=2, max_len=c.task.prompt_len + L)
  c.sampling.update(max_new_tokens=L, compaction=2)
  c.rl.update(G=4, prompts_per_step=2, minibatches=1, rollout_chunks=1, process_weight=0.5, beta=0.04)
  c.optim.update(lr=1e-2, eps=1e-6)
  c.rewards = (("accuracy", 1.0), ("env", 0.5))
  c.tools.update(env="tests.tool_envs:Echo", stop_markers=MARKERS, max_turns=3, max_obs_tokens=8, timeout_s=5.0,
                 chunk=4)
  c.train.num_samples_logged = 8
  return config_lib.override(c, over) if over else c


def batches(c, start=0):
  return data_lib.rl_batches(c.task, TOK, "train", c.rl.prompts_per_step, c.seed, start, c.task.prompt_len)


@pytest.fixture(scope="module")
def setup():
  c = tools_config()
  validate.validate_rl(c, 1, TOK)
  validate.validate_tools(c, TOK)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = train.reward_terms(c, TOK)
  yield c, mesh, mcfg, spec
  spec.close()


@pytest.fixture(scope="module")
def rollout(setup):
  c, mesh, mcfg, spec = setup
  state = rl_step.init(c, mesh, mcfg, seed=0)
  fn = jax.jit(rollout_lib.make_rollout_fn(c, mcfg, spec, TOK))
  batch = next(batches(c))
  with sharding.mesh_context(mesh):
    ro = fn(state["params"], state["ref_params"], batch, jax.random.PRNGKey(1))
  return state, batch, ro


def test_rollout_masks_rewards_and_steps(setup, rollout):
  """The Rollout's loss mask leaves the observations out and its attention mask (seq) keeps them; lengths count the
  model's tokens; the 'env' term is the number of answered calls (reward 1 each); its steps end at those stop
  markers, after the process term's."""
  c, _, _, _ = setup
  _, batch, ro = rollout
  obs = np.asarray(ro.obs_NxL)
  P = batch["prompt_NxP"].shape[1]
  full = np.asarray(ro.seq[2])[:, P:]
  train_mask = np.asarray(ro.mask_NxL)
  assert obs.sum() > 0 and (obs * full).sum() == obs.sum()
  np.testing.assert_array_equal(train_mask, full * (1 - obs))
  np.testing.assert_array_equal(np.asarray(ro.lengths_N), train_mask.sum(1))
  assert np.all(np.asarray(ro.behav_logp_NxL)[obs > 0] == 0) and np.all(np.asarray(ro.ref_logp_NxL)[obs > 0] == 0)
  stop_ids = set(env_batch_ids(c))
  tok = np.asarray(ro.tokens_NxL)
  stops = [[t for t in range(L) if full[n, t] and not obs[n, t] and tok[n, t] in stop_ids and t < L - 1]
           for n in range(tok.shape[0])]
  calls = np.asarray([len(s[:c.tools.max_turns]) for s in stops], np.float32)  # answered calls, reward 1 each
  np.testing.assert_array_equal(np.asarray(ro.per_term["env"]), calls)
  s_r, s_end, s_valid = (np.asarray(x) for x in ro.steps)
  env_cols = slice(s_r.shape[1] - (c.tools.max_turns + 1), None)  # the env term's steps come after the process term's
  for n, st in enumerate(stops):
    want = st[:c.tools.max_turns + 1]
    assert s_end[n, env_cols][s_valid[n, env_cols]].tolist() == want, n
    # each answered call's step reward, weighted by the term's weight: 1 × 0.5 (the one past the limit: 0)
    assert s_r[n, env_cols][s_valid[n, env_cols]].tolist() == [0.5] * min(len(st), c.tools.max_turns) + [0.0] * (
        len(want) - min(len(st), c.tools.max_turns)), n


def env_batch_ids(c):
  from grpo_jax.envs import formats
  return formats.stop_ids(TOK, c.tools.stop_markers)


def test_observation_tokens_get_no_gradient_through_the_step_loss(setup, rollout):
  """The step's own pieces (compute_advantages, training_data, make_forward, make_objective): the loss's gradient
  with respect to each position's log-prob and entropy (the only functions of the logits that predict that token)
  is exactly 0 wherever the token is an observation's, and not 0 at the model's tokens."""
  c, _, mcfg, _ = setup
  state, batch, ro = rollout
  # jitted as the step jits them: one compile each instead of an eager compile per op
  adv = jit_call(rl_step.compute_advantages, c, ro)
  data, _ = jit_call(rl_step.training_data, c, ro, adv)
  obs = np.asarray(ro.obs_NxL)
  assert np.all(np.asarray(data["mask_NxL"])[obs > 0] == 0)
  P = batch["prompt_NxP"].shape[1]
  out = jax.jit(rl_step.make_forward(c, mcfg, P), static_argnums=2)((state["params"],), data["seq"], False)
  objective = jax.jit(rl_step.make_objective(c))
  g_logp, g_ent = jax.jit(jax.grad(lambda o, d: objective(o, d)[0]))(out, data)
  g_logp, g_ent = np.asarray(g_logp), np.asarray(g_ent)
  assert np.all(g_logp[obs > 0] == 0) and np.all(g_ent[obs > 0] == 0)
  model = (np.asarray(data["mask_NxL"]) > 0)
  assert np.count_nonzero(g_logp[model]) > model.sum() // 2
  # and the loss itself does not see them: moving the observations' log-probs moves nothing
  moved = (np.asarray(out[0]) + 3.0 * obs.astype(np.float32), np.asarray(out[1]) - obs.astype(np.float32))
  assert float(objective(moved, data)[0]) == float(objective(out, data)[0])


def echo_obs_mask(c, tok_NxL, full_NxL):
  """Each row's observation mask re-derived by hand from tests/tool_envs.py's Echo (' <tool_response> k
  </tool_response>', k = the turn's length in characters mod 10, cut to the room keeping its closing piece): every
  stop marker the model wrote before L − 1, up to tools.max_turns, must be followed by exactly that observation."""
  from grpo_jax.envs import formats
  stops, fmt, tail = set(env_batch_ids(c)), formats.get("plain"), TOK.encode(formats.get("plain").tail)
  obs = np.zeros_like(tok_NxL)
  for n in range(tok_NxL.shape[0]):
    length, t, start, turn = int(full_NxL[n].sum()), 0, 0, 0
    while t < length:
      if tok_NxL[n, t] in stops and t < L - 1:
        turn += 1
        if turn > c.tools.max_turns:
          assert t == length - 1, n  # the row ends on the marker past the limit
          break
        ids = TOK.encode(fmt.observation(str(len(TOK.decode(tok_NxL[n, start:t + 1])) % 10)))
        room = min(c.tools.max_obs_tokens, L - t - 1)
        if len(ids) > room:
          ids = ids[:room - len(tail)] + tail if len(tail) < room else ids[:room]
        assert tok_NxL[n, t + 1:t + 1 + len(ids)].tolist() == ids, n
        obs[n, t + 1:t + 1 + len(ids)] = 1
        t = start = t + 1 + len(ids)
      else:
        t += 1
  return obs


def test_step_loss_equals_numpy_over_the_models_tokens_only(setup, rollout):
  """The step's objective with ratios away from 1 (μ = 2: π_old is the recorded π_prox; the policy's log-probs
  moved by noise, so tokens clip on both sides) equals an independent NumPy GRPO loss (clipped ratio with dual
  clip, k3 capped at kl_clamp, β, each row's mean over its own tokens) over the model's tokens of a mask rebuilt by
  hand from the environment's rule: the engine's observation mask is that mask, the step's loss mask its
  complement within the transcript, and each row's normaliser counts the model's tokens, not the transcript's."""
  c, _, mcfg, _ = setup
  state, batch, ro = rollout
  c2 = tools_config(**{"rl.mu": 2})
  P = batch["prompt_NxP"].shape[1]
  full = np.asarray(ro.seq[2])[:, P:]
  obs = echo_obs_mask(c2, np.asarray(ro.tokens_NxL), full)
  assert obs.sum() > 0 and ((full - obs) > 0).sum(1).min() > 0
  np.testing.assert_array_equal(np.asarray(ro.obs_NxL), obs)
  own = (full > 0) & (obs == 0)
  data, _ = jit_call(rl_step.training_data, c2, ro, jit_call(rl_step.compute_advantages, c2, ro))  # as the step
  np.testing.assert_array_equal(np.asarray(data["mask_NxL"]) > 0, own)
  logp, ent = jax.jit(rl_step.make_forward(c2, mcfg, P), static_argnums=2)((state["params"],), data["seq"], False)
  logp = np.asarray(logp) + np.random.default_rng(0).normal(0.0, 0.3, logp.shape).astype(np.float32)
  loss = float(jax.jit(rl_step.make_objective(c2))((logp, ent), data)[0])
  lp, old, ref, adv = (np.asarray(x, np.float64) for x in (logp, data["old_logp_NxL"], data["ref_logp_NxL"],
                                                           data["adv_NxL"]))
  rl = c2.rl
  ratio = np.exp(lp - old)
  surr = np.minimum(ratio * adv, np.clip(ratio, 1 - rl.eps_low, 1 + rl.eps_high) * adv)
  surr = np.where(adv < 0, np.maximum(surr, rl.dual_clip * adv), surr)
  assert ((ratio > 1 + rl.eps_high) & own).any() and ((ratio < 1 - rl.eps_low) & own).any()
  k3 = np.minimum(np.exp(ref - lp) - (ref - lp) - 1, rl.kl_clamp)
  per_token = np.where(own, surr - rl.beta * k3, 0.0)
  want = -np.mean(per_token.sum(1) / own.sum(1))
  assert rl.loss_agg == "seq_mean_token_mean" and rl.objective == "clip" and rl.ratio_level == "token"
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  # the same over the whole transcript's tokens (the observations' ratio is exp(lp - 0)) differs: not vacuous
  assert abs(-np.mean(np.where(full > 0, surr - rl.beta * k3, 0.0).sum(1) / full.sum(1)) - want) > 1e-3


@pytest.fixture(scope="module")
def stepped(setup):
  """Three steps of the jitted RL step on three batches."""
  c, mesh, mcfg, spec = setup
  step = families.make_step(c, mesh, mcfg, spec, TOK)
  state = rl_step.init(c, mesh, mcfg, seed=0)
  it = batches(c)
  ms, first = [], None
  for _ in range(3):
    state, m = step(state, train.device_batch(mesh, next(it)))
    ms.append(jax.device_get(m))
    first = jax.device_get(state["params"]) if first is None else first
  return step, state, ms, first


def test_one_compile_across_steps_with_different_numbers_of_turns(stepped):
  """0 recompiles: three steps whose rows make different numbers of calls and turns run the program traced once;
  each step's tool readings are logged (and its environment status is OK)."""
  step, _, ms, _ = stepped
  assert step.traces() == 1
  calls = [float(m["train/tool_calls_mean"]) for m in ms]
  turns = [float(m["train/turns_mean"]) for m in ms]
  assert len(set(calls)) > 1 and min(calls) > 0, calls
  assert len(set(turns)) > 1, turns
  for m in ms:
    assert int(m["env_status"]) == host_calls.OK and float(m["train/skipped_updates"]) == 0
    assert float(m["train/obs_tokens_mean"]) > 0 and 0 < float(m["train/obs_token_frac"]) < 1
    assert float(m["train/gen_tokens_mean"]) == float(m["train/completion_len_mean"])
    # reward 1 per answered call, and the calls are those (a stop marker at the row's last position, or past the
    # turn limit, gets no answer: it counted as a call, the readings counted every stop marker the model wrote)
    assert float(m["train/reward/env"]) == pytest.approx(float(m["train/tool_calls_mean"]), rel=1e-6)


def test_samples_show_the_interleaved_transcript(setup, stepped, tmp_path):
  """samples.jsonl's rows of a multi-turn step carry the transcript: model and tool parts in order, whose texts
  join to the sample's text."""
  c, _, _, _ = setup
  _, _, ms, _ = stepped
  from grpo_jax.envs import transcript
  from grpo_jax.run import metrics as metrics_lib
  sm = {k: v for k, v in ms[0].items() if k.startswith("samples/")}
  w = metrics_lib.MetricWriter(str(tmp_path), use_tensorboard=False)
  texts = [TOK.decode(t[mk > 0].tolist()) for t, mk in zip(sm["samples/tokens_NxL"], sm["samples/mask_NxL"])]
  turns = [transcript.transcript(t, mk, o, TOK) for t, mk, o in zip(sm["samples/tokens_NxL"], sm["samples/mask_NxL"],
                                                                     sm["samples/obs_NxL"])]
  w.log_samples(1, texts, [float(r) for r in sm["samples/r_N"]], n_print=0, transcripts=turns)
  w.close()
  rows = [json.loads(l) for l in open(tmp_path / "samples.jsonl")]
  assert any(any(p["role"] == "tool" for p in r["transcript"]) for r in rows)
  for r in rows:
    assert "".join(p["text"] for p in r["transcript"]) == r["text"]


def test_packed_passes_equal_the_padded_ones(setup, stepped):
  """rl.packing: the packed training passes (packed by the attention mask, which keeps the observations; the loss
  on the loss mask, which leaves them out) give the padded step's first update: its loss, entropy, KL, gradient
  norm and params."""
  _, mesh, mcfg, spec = setup
  _, _, ms, first = stepped
  c = tools_config(**{"rl.packing": True})
  step = families.make_step(c, mesh, mcfg, spec, TOK)
  state, m = step(rl_step.init(c, mesh, mcfg, seed=0), train.device_batch(mesh, next(batches(c))))
  m = jax.device_get(m)
  for k in ("train/loss", "train/entropy", "train/kl", "train/grad_norm", "train/tool_calls_mean"):
    np.testing.assert_allclose(float(m[k]), float(ms[0][k]), rtol=1e-5, atol=1e-6, err_msg=k)
  for a, b in zip(jax.tree.leaves(jax.device_get(state["params"])), jax.tree.leaves(first)):
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)


def test_vmapped_seeds_equal_their_single_runs(setup, stepped):
  """studies/vmapped_runs.py: two seeds in one vmapped program (the callback runs once per run with its own rows):
  run 0 (seed 0) equals the single run of seed 0 after its first step (params and tool readings), and the two runs
  differ."""
  from grpo_jax.studies import vmapped_runs as seeds_lib
  c, mesh, mcfg, spec = setup
  _, _, ms, first = stepped  # the single run: seed 0, the first batch
  states = seeds_lib.init_states(c, mcfg, [0, 1])
  step = seeds_lib.make_steps(c, mesh, mcfg, spec, TOK)
  states, m = step(states, next(batches(c)))
  sm, m1 = seeds_lib.host_scalars(m), ms[0]
  for a, w in zip(jax.tree.leaves(seeds_lib.run_state(jax.device_get(states), 0)["params"]),
                  jax.tree.leaves(first)):
    np.testing.assert_allclose(a, w, atol=1e-5, rtol=1e-5)
  for k in ("train/tool_calls_mean", "train/obs_tokens_mean", "train/reward/env", "train/loss"):
    np.testing.assert_allclose(sm[k][0], float(m1[k]), atol=1e-5, rtol=1e-5, err_msg=k)
  assert sm["train/obs_tokens_mean"][0] > 0 and (sm["train/tool_calls_mean"][0] != sm["train/tool_calls_mean"][1]
                                                 or sm["train/loss"][0] != sm["train/loss"][1])
  assert np.asarray(m["env_status"]).tolist() == [host_calls.OK] * 2


def test_lora_step_trains_the_adapters_on_the_models_tokens_only(setup):
  """model.lora: the step runs with the environment (observations fed, the calls OK); only the adapters move, the
  frozen base (the reference) does not."""
  _, mesh, _, spec = setup
  c = tools_config(**{"model.lora.rank": 4, "model.lora.alpha": 8.0})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  step = families.make_step(c, mesh, mcfg, spec, TOK)
  state = rl_step.init(c, mesh, mcfg, seed=0)
  base = jax.device_get(state["base"])
  adapters = jax.device_get(state["params"])
  state, m = step(state, train.device_batch(mesh, next(batches(c))))
  assert float(m["train/obs_tokens_mean"]) > 0 and int(m["env_status"]) == host_calls.OK
  for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(jax.device_get(state["base"]))):
    np.testing.assert_array_equal(a, b)
  moved = sum(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(adapters),
                                                           jax.tree.leaves(jax.device_get(state["params"]))))
  assert moved > 0


def test_a_failed_environment_call_keeps_the_state_and_names_the_environment(setup, stepped):
  """A call that cannot run as a whole (tools.timeout_s passed by EnvBatch.MAX_HUNG abandoned steps still running):
  the step keeps its old state (params, step), reports env_status TIMEOUT, counts the rows' fallbacks, and the host
  error is EnvBatch.error_message (as a Python reward term's failure is)."""
  c, mesh, mcfg, spec = setup
  step, state, _, _ = stepped
  env = spec.env
  tool_envs.MODE["sleep_s"] = 1.0
  old_timeout, env.timeout_s = env.timeout_s, 0.05
  try:
    # four steps abandoned before the RL step starts: its first boundary with a paused row fails as a whole
    tok = np.zeros((4, L), np.int32)
    tok[:, 0] = env.stop_ids[0]
    out = env.host(tok, np.zeros_like(tok), np.ones(4, np.int32), np.ones(4, bool), {})
    assert int(out.counts_K[env_batch.COUNTS.index("fallbacks")]) == 4 and np.all(out.status_R == host_calls.TIMEOUT)
    before = jax.device_get(state["params"])
    step_before = int(state["step"])
    state2, m = step(state, train.device_batch(mesh, next(batches(c, start=5))))
    m = jax.device_get(m)
  finally:
    tool_envs.MODE["sleep_s"] = 0.0
    env.timeout_s = old_timeout
  assert int(m["env_status"]) == host_calls.TIMEOUT
  assert int(state2["step"]) == step_before
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(state2["params"]))):
    np.testing.assert_array_equal(a, b)
  msg = train.step_error(spec, m["reward_status"], m["env_status"])
  assert msg == env.error_message(host_calls.TIMEOUT) and "tests.tool_envs:Echo" in msg and "\n" not in msg
  time.sleep(1.2)  # the abandoned steps finish: the next tests' calls run again


def test_partial_rollouts_carry_paused_rows_through_the_rl_step(setup, tmp_path):
  """The rollout carry with an environment (rl.partial_rollouts, max_staleness 1, a budget of 4 decode steps):
  three steps of ONE compiled RL step train rows that were carried across steps (version lag 1), with the
  environment's calls, the observation tokens left out of the loss (the trained length counts the model's tokens
  only) and the 'env' reward term; the state holds each slot's turn state, and a checkpoint of it restores to the
  same next step. A call that fails as a whole then
  keeps the whole state — the carry's rows, turn state and environment rows included — as the synchronous step
  keeps its params."""
  c, mesh, mcfg, spec = setup
  c = config_lib.override(c, {"rl.partial_rollouts": True, "rl.max_staleness": 1, "rl.rollout_budget": 4,
                              "rl.rollout_correction": "tis"})
  validate.validate_rl(c, 1, TOK)
  step = families.make_step(c, mesh, mcfg, spec, TOK)
  state = rl_step.init(c, mesh, mcfg, seed=0)
  assert state["carry"].turn.fbuf_SxO.shape == (c.rl.prompts_per_step * c.rl.G, c.tools.max_obs_tokens)
  cspec = rollout_lib.carry_spec(c)
  it = carry_lib.host_stream(lambda k: batches(c, start=k), cspec, 0)
  ms = []
  for _ in range(3):
    state, m = step(state, train.device_batch(mesh, next(it)))
    ms.append(jax.device_get(m))
  assert step.traces() == 1 and int(state["step"]) == 3
  assert max(float(m["train/version_lag_max"]) for m in ms) >= 1  # carried rows trained a step later
  for m in ms:
    assert int(m["env_status"]) == host_calls.OK and float(m["train/tool_calls_mean"]) > 0
    assert float(m["train/obs_tokens_mean"]) > 0
    assert float(m["train/gen_tokens_mean"]) == float(m["train/completion_len_mean"])
    assert 0 < float(m["train/reward/env"]) <= float(m["train/tool_calls_mean"])
    assert np.isfinite(float(m["train/loss"]))
  assert np.any(np.asarray(state["carry"].live_S))  # rows in flight at the checkpoint below
  # a checkpoint of the state holds the carried turns: the restored state's next step is the live state's, bit for bit
  from grpo_jax.infra import checkpoint
  with checkpoint.Checkpointer(tmp_path / "checkpoints", save_every=1, keep=1, async_save=False) as ck:
    ck.maybe_save(3, state, {"step": 3})
    restored, _ = ck.restore(3, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                             state))
  batch = train.device_batch(mesh, next(it))
  live, _ = step(state, batch)
  again, _ = step(restored, batch)
  for a, b in zip(jax.tree.leaves(jax.device_get(live)), jax.tree.leaves(jax.device_get(again))):
    np.testing.assert_array_equal(a, b)
  state = live
  env = spec.env
  tool_envs.MODE["sleep_s"] = 1.0
  old_timeout, env.timeout_s = env.timeout_s, 0.05
  try:  # four abandoned steps first: the step's first boundary with a paused row fails as a whole
    tok = np.zeros((4, L), np.int32)
    tok[:, 0] = env.stop_ids[0]
    env.host(tok, np.zeros_like(tok), np.ones(4, np.int32), np.ones(4, bool), {})
    before = jax.device_get(state)
    state2, m = step(state, train.device_batch(mesh, next(it)))
    m = jax.device_get(m)
  finally:
    tool_envs.MODE["sleep_s"] = 0.0
    env.timeout_s = old_timeout
  assert int(m["env_status"]) == host_calls.TIMEOUT
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(state2))):
    np.testing.assert_array_equal(a, b)
  time.sleep(1.2)  # the abandoned steps finish: the next tests' calls run again


def test_evaluation_counts_the_environments_failures(setup, monkeypatch):
  """Held-out rows call the environment as the RL step's do; its fallbacks and a call that failed as a whole were
  neither counted nor logged there (no eval/tool_fallbacks: a failing tool lowered eval accuracy silently). The
  rollouts are made by hand (the generate plumbing runs in the CLI tests' evaluations)."""
  from grpo_jax.run import evaluation
  c, mesh, mcfg, spec = setup
  ev = evaluation.Evaluator(c, mcfg, TOK, mesh, data_lib.eval_set(c.task, TOK, 8, c.task.prompt_len))
  n, e = 4, len(env_batch.EVENTS)
  tokens = np.zeros((n, L), np.int32)
  tokens[:, 0] = TOK.encode("</tool_call>")[0]
  events = np.zeros((n, e), np.int32)
  events[0, env_batch.FALLBACK] = events[1, env_batch.TOOL_ERROR] = 1
  logged = []
  monkeypatch.setattr(evaluation.logging, "warning", lambda msg, *a: logged.append(msg % a))
  for status in (host_calls.OK, host_calls.TIMEOUT):
    g = evaluation.Rollouts(tokens, np.ones_like(tokens), np.ones(n), np.zeros(n), np.zeros(n), [None] * n, {},
                            None, {}, np.zeros_like(tokens), events, status)
    monkeypatch.setattr(ev, "rollouts", lambda *a, **k: g)
    ev.env.last_error = "row 0: raised RuntimeError: tool down"
    m, _ = ev(None, jax.random.PRNGKey(0), with_samples=False)
    assert (m["eval/tool_fallbacks"], m["eval/tool_errors"], m["eval/tool_timeouts"]) == (1.0, 1.0, 0.0)
    assert m["eval/tool_call_failed"] == float(status != host_calls.OK)
  assert len(logged) == 2 and "tool down" in logged[0] and "timed out" in logged[1], logged
  ev.env.close()


def test_an_unresolved_auto_engine_evaluates_with_the_environment(setup):
  """sampling.engine='auto' (validation takes it beside tools.env: auto picks the continuous engine) in a config no
  command resolved — the R1 report's held-out evaluation (heldout.make_evaluator), an SFT stage's final one — is
  resolved by the Evaluator as the RL run's is: it decoded on the static reference path, without the environment,
  and scored a tool model's held-out rows with no tool calls."""
  from grpo_jax.run import evaluation
  c, mesh, mcfg, _ = setup
  ev = evaluation.Evaluator(config_lib.override(c, {"sampling.engine": "auto"}), mcfg, TOK, mesh,
                            data_lib.eval_set(c.task, TOK, 8, c.task.prompt_len))
  assert ev.env is not None and ev.cfg.sampling.engine == "continuous"
  ev.env.close()


# ------------------------------------------------------------------------ what the verifiers read: own tokens

def transcript_rows(parts_by_row, width=40):
  """(tokens_NxL, mask_NxL, obs_NxL) of rows written by hand: each a list of (text or ids, 1 if an observation)."""
  n = len(parts_by_row)
  tokens, mask, obs = (np.zeros((n, width), np.int32) for _ in range(3))
  for r, parts in enumerate(parts_by_row):
    k = 0
    for text, is_obs in parts:
      ids = TOK.encode(text) if isinstance(text, str) else list(text)
      assert k + len(ids) <= width, "the row does not fit: raise width"
      tokens[r, k:k + len(ids)], mask[r, k:k + len(ids)], obs[r, k:k + len(ids)] = ids, 1, is_obs
      k += len(ids)
  return tokens, mask, obs


EOS = [TOK.eos_id]
# (row, its verified score): an observation that holds the whole right answer (a user environment's raw text: no
# format stripped it), with the model's EOS after it, or with the environment's done; the model's own answer after
# an observation; one with no observation; the model's answer ended by the environment's done (its EOS is kept)
OWN_ROWS = [
    ([("<think> 3 + 4 <tool_call> 3 + 4 </tool_call>", 0), (" </think> <answer> 7 </answer>", 1), (EOS, 0)], 0.0),
    ([("<think> 3 + 4 <tool_call> 3 + 4 </tool_call>", 0), (" </think> <answer> 7 </answer>", 1), (EOS, 1)], 0.0),
    ([("<think> <tool_call> 3 + 4 </tool_call>", 0), (" <tool_response> 7 </tool_response>", 1),
      (" </think> <answer> 7 </answer>", 0), (EOS, 0)], 1.0),
    ([("<think> 3 + 4 </think> <answer> 7 </answer>", 0), (EOS, 0)], 1.0),
    ([("<think> 3 + 4 </think> <answer> 7 </answer>", 0), (EOS, 1)], 1.0),
]


def test_own_tokens_removes_observations_keeps_a_final_eos_and_maps_back():
  """obs_mask.own_tokens by hand: the model's tokens moved left in order, pad and mask 0 after them; the index gives
  each one's transcript position; an EOS observation ending the row stays where the environment's done ended it,
  and goes where it did not (an observation cut on an EOS id: Qwen's opens with <|im_end|>); jnp and np agree."""
  from grpo_jax.rl import obs_mask
  tokens = np.array([[5, 6, 7, 8, 9, 2, 0], [5, 6, 7, 8, 2, 0, 0]])
  mask = np.array([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])
  obs = np.array([[0, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0]])  # row 1: the environment's done (its EOS)
  tok = type("T", (), {"eos_id": 2, "pad_id": 0})
  for xp in (np, jnp):
    own = obs_mask.own_tokens if xp is np else functools.partial(jit_call, obs_mask.own_tokens)  # jnp: as traced
    t, m, idx = (np.asarray(a) for a in own(tokens, mask, obs, np.array([False, True]), tok, xp=xp, with_index=True))
    np.testing.assert_array_equal(t, [[5, 8, 9, 2, 0, 0, 0], [5, 6, 2, 0, 0, 0, 0]])
    np.testing.assert_array_equal(m, [[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(idx[0, :4], [0, 3, 4, 5])
    np.testing.assert_array_equal(idx[1, :3], [0, 1, 4])
    t, m = (np.asarray(a) for a in own(tokens, mask, obs, np.array([False, False]), tok, xp=xp))
    np.testing.assert_array_equal(t[1], [5, 6, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(m[1], [1, 1, 0, 0, 0, 0, 0])


def test_own_tokens_jnp_and_np_equal_a_pure_python_reference_on_random_rows():
  """obs_mask.own_tokens on random rows (prefix masks of every length, observations anywhere — position 0, several
  spans, the whole row, past the mask —, two EOS ids, ended or not) against a loop written from its contract: the
  kept tokens in order (mask on and observation off, or the row's last token an EOS id where the environment ended
  it), pad after them, and each one's transcript position; jnp and np alike."""
  from grpo_jax.rl import obs_mask
  tok = type("T", (), {"eos_ids": (2, 3), "eos_id": 2, "pad_id": 0})
  rng = np.random.default_rng(0)
  N, L = 4, 9
  for _ in range(40):
    tokens = rng.integers(1, 6, (N, L))
    mask = (np.arange(L)[None] < rng.integers(0, L + 1, N)[:, None]).astype(np.int32)
    obs = (rng.random((N, L)) < 0.4).astype(np.int32)
    ended = rng.random(N) < 0.5
    want_t, want_m = np.zeros((N, L), np.int64), np.zeros((N, L), np.int64)
    keep = []
    for n in range(N):
      on = [i for i in range(L) if mask[n, i]]
      k = [i for i in on if not obs[n, i] or (i == on[-1] and tokens[n, i] in (2, 3) and ended[n])]
      want_t[n, :len(k)], want_m[n, :len(k)] = tokens[n, k], 1
      keep.append(k)
    for xp in (np, jnp):
      own = obs_mask.own_tokens if xp is np else functools.partial(jit_call, obs_mask.own_tokens)  # jnp: as traced
      t, m, idx = (np.asarray(a) for a in own(tokens, mask, obs, ended, tok, xp=xp, with_index=True))
      np.testing.assert_array_equal(t, want_t)
      np.testing.assert_array_equal(m, want_m)
      for n in range(N):
        assert idx[n, :len(keep[n])].tolist() == keep[n]


def test_verifiers_score_the_models_own_tokens_not_an_observation(setup):
  """The step's reward terms (rewards.compute with the rollout's obs mask), in-graph (accuracy, format) and Python
  (the host verifier verify_py on the ids the term gets), and the held-out host path (Evaluator.own): an answer that
  only an observation holds scores 0 (it scored 1: the verifiers read the whole transcript); the model's own answer
  after an observation, and a row without observations, score 1 as before."""
  from grpo_jax.rl import rewards as rewards_lib
  from grpo_jax.run import evaluation
  from grpo_jax.tasks import verify_py
  c, _, _, spec = setup
  tokens, mask, obs = transcript_rows([r for r, _ in OWN_ROWS])
  want = np.asarray([w for _, w in OWN_ROWS], np.float32)
  n = len(OWN_ROWS)
  ended = np.asarray([r[-1] == (EOS, 1) for r, _ in OWN_ROWS])  # the rows the environment's done ended
  events = np.zeros((n, len(env_batch.EVENTS)), np.int32)
  events[:, env_batch.ENDED] = ended
  batch = {"answer_N": np.full((n,), 7, np.int32)}

  def host_accuracy(texts, ids, b):  # a Python term: the host verifier on the ids it is given, its EOS put back
    del texts
    out = []
    for k, (i, e) in enumerate(zip(ids, b["ended_N"])):
      row = np.asarray([list(i) + EOS * bool(e)])
      out.append(float(verify_py.accuracy_reward("sums", row, np.ones_like(row), {"answer_N": b["answer_N"][k:k + 1]},
                                                 TOK)[0]))
    return out

  terms = rewards_lib.build((("accuracy", 1.0), ("format", 1.0), ("host", 1.0)), spec.ctx, {"host": host_accuracy})
  try:
    # compute jitted as the rollout runs it (the host term through its callback): one compile, not one per op
    _, per_term, status, _, _ = jit_call(rewards_lib.compute, terms, tokens, mask, batch, obs, ended)
    assert int(np.max(status)) == 0
    for name in ("accuracy", "format", "host"):
      np.testing.assert_array_equal(np.asarray(per_term[name]), want, err_msg=name)
    # without observations a row is scored as it always was: its obs mask all 0 changes nothing
    plain = jit_call(rewards_lib.compute, terms, tokens, mask, batch)[1]
    none = jit_call(rewards_lib.compute, terms, tokens, mask, batch, np.zeros_like(obs), np.zeros_like(ended))[1]
    for name in per_term:
      np.testing.assert_array_equal(np.asarray(none[name]), np.asarray(plain[name]), err_msg=name)
    assert np.asarray(plain["accuracy"])[0] == 1.0  # the transcript itself does hold the answer: not vacuous
  finally:
    terms.close()
  own_t, own_m = evaluation.Evaluator.own(type("E", (), {"tok": TOK})(), tokens, mask, obs, events)
  np.testing.assert_array_equal(verify_py.accuracy_reward("sums", own_t, own_m, batch, TOK), want)
  np.testing.assert_array_equal(verify_py.format_reward(own_t, own_m, TOK), want)


def test_process_steps_read_off_the_own_tokens_end_at_their_transcript_position(setup):
  """The `process` term scores the own tokens; its step ends are mapped back to the transcript (the loss's
  positions): the step's ';' after the observation, where the transcript has it (it was off by the observation's
  length)."""
  from grpo_jax.rl import rewards as rewards_lib
  c, _, _, spec = setup
  rows = [[("<think> 37 48 : <tool_call> 37 + 48 </tool_call>", 0), (" <tool_response> 85 </tool_response>", 1),
           (" add 37 + 48 = 85 ; </think> <answer> 85 </answer>", 0), (EOS, 0)]]
  tokens, mask, obs = transcript_rows(rows, width=56)
  semi = [TOK.decode([int(t)]) for t in tokens[0]].index(" ;")
  assert obs[0, :semi].sum() > 0  # the observation is before it: not vacuous
  terms = rewards_lib.build((("process", 1.0),), spec.ctx)
  _, per_term, _, _, steps = jit_call(rewards_lib.compute, terms, tokens, mask, {"answer_N": np.asarray([85])}, obs,
                                      np.zeros((1,), bool))  # one program, as the rollout runs it
  s_r, s_end, s_valid = (np.asarray(x) for x in steps)
  assert s_valid[0].tolist() == [True] + [False] * (s_valid.shape[1] - 1)
  assert (s_r[0, 0], s_end[0, 0], float(per_term["process"][0])) == (1.0, semi, 1.0)


def test_the_rollout_and_held_out_generate_score_the_own_tokens(setup, monkeypatch):
  """The wiring: the RL rollout hands rewards.compute the engine's observation mask, and the held-out generate
  (evaluation.make_generate, R1 rejection sampling's too) scores obs_mask.own_tokens of its rows (traced only)."""
  from grpo_jax.rl import obs_mask
  from grpo_jax.rl import rewards as rewards_lib
  from grpo_jax.rollout import sampling
  from grpo_jax.run import evaluation
  from grpo_jax.tasks import verify_jax
  c, mesh, mcfg, spec = setup
  seen, real_compute, real_own = [], rewards_lib.compute, obs_mask.own_tokens
  monkeypatch.setattr(rewards_lib, "compute", lambda *a, **k: seen.append(("compute", k)) or real_compute(*a, **k))
  monkeypatch.setattr(obs_mask, "own_tokens", lambda *a, **k: seen.append(("own", a[2].shape)) or real_own(*a, **k))
  params = jax.eval_shape(lambda: model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  batch = next(batches(c))
  with sharding.mesh_context(mesh):
    jax.eval_shape(rollout_lib.make_rollout_fn(c, mcfg, spec, TOK), params, params, batch, jax.random.PRNGKey(1))
  n = c.rl.G * batch["prompt_NxP"].shape[0]
  assert seen[0][0] == "compute" and {k: v.shape for k, v in seen[0][1].items()} == {  # the engine's
      "obs_NxL": (n, L), "env_ended_N": (n,)}, seen
  assert seen[1] == ("own", (n, L)), seen
  seen.clear()
  scfg = sampling.SamplingConfig.from_config(c.sampling, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
  gen = evaluation.make_generate(mcfg, scfg, mesh, c.task.name, TOK.tag_ids, config=c, env=spec.env,
                                 tables=verify_jax.tables_for(TOK))
  fields = {k: v for k, v in batch.items() if k not in rollout_lib.PROMPT_KEYS}
  with sharding.mesh_context(mesh):
    jax.eval_shape(gen.jitted, params, batch["prompt_NxP"], batch["prompt_mask_NxP"], fields,
                   jax.random.PRNGKey(0))
  assert [k for k, _ in seen] == ["own"], seen


# ------------------------------------------------------------------------------------ bad input, resume (CLI)

@pytest.mark.parametrize("over,key,why", [
    ({"sampling.engine": "static"}, "tools.env", "continuous engine"),
    # the qwen format renders prompts with the chat template: the shipped tokenizer has none (tests/test_tools_qwen.py)
    ({"tools.format": "qwen"}, "tools.format", "chat template, and this tokenizer has none"),
    ({"tools.env": ""}, "rewards", "'env' term"),
    ({"tools.chunk": 0}, "tools.chunk", ""),
    ({"tools.max_turns": 0}, "tools.max_turns", ">= 1"),
    ({"tools.workers": 100_000}, "tools.workers", "at most 1024"),  # one thread each: was the OS's thread limit
    ({"tools.fallback_reward": 1e39}, "tools.fallback_reward", "float32"),  # was an inf reward for a fallback row
    # a fallback step's reward goes to the 'env' term only: without it, -1 was dropped without a word
    ({"tools.fallback_reward": -1.0, "rewards": (("accuracy", 1.0),), "rl.process_weight": 0.0},
     "tools.fallback_reward", "('env', 1.0)"),
    # ... or names it at weight 0 (as every R1 stage with an environment logs it): the fallback still trained nothing
    ({"tools.fallback_reward": -1.0, "rewards": (("accuracy", 1.0), ("env", 0.0)), "rl.process_weight": 0.0},
     "tools.fallback_reward", "does not weight"),
    # the child's alarm takes a C int: every call's observation was "error: OverflowError ..."
    ({"tools.sandbox.time_s": 1e12}, "tools.sandbox.time_s", "a day per tool call"),
    ({"tools.sandbox.memory_mb": 10 ** 13}, "tools.sandbox.memory_mb", "at most"),  # RLIMIT_AS overflowed a C long
    # a looping call outlived tools.timeout_s: abandoned (the row's fallback, not 'timed out'); 4 at once stopped
    # the run (exit 3)
    ({"tools.env": "python", "tools.sandbox.time_s": 4.5}, "tools.sandbox.time_s", "below tools.timeout_s=5"),
    ({"tools.max_obs_tokens": 10 ** 9}, "tools.max_obs_tokens", "model.max_len"),  # [slots, O] buffers
    # ' <tool_response> … </tool_response>' takes 4 tokens: at 2 the cut appended ' <tool_response>' (never closed), at 3
    # '  </tool_response>' (never opened), at 4 an empty response: no tool output ever reached the model
    ({"tools.max_obs_tokens": 2}, "tools.max_obs_tokens", "markers take 4 tokens"),
    ({"tools.env": "calculator", "tools.max_obs_tokens": 4}, "tools.max_obs_tokens", "at least 4 + the outputs'"),
    ({"tools.stop_markers": ("</tool_call>", "</nope>")}, "tools.stop_markers", "not one token"),
    # a tool environment whose call never pauses the row: every call went unanswered, without a word
    ({"tools.env": "calculator", "tools.stop_markers": ("</answer>",)}, "tools.stop_markers", "lacks '</tool_call>'"),
    ({"tools.env": "no_such_module:Env"}, "tools.env", "cannot be imported"),
])
def test_bad_tools_settings_are_one_line_refusals(over, key, why):
  """Each refusal is one line naming the key and the fix, raised by validation (before anything is written)."""
  c = tools_config(**over)
  with pytest.raises(config_lib.ConfigError) as e:
    validate.validate_rl(c, 1, TOK)
    validate.validate_tools(c, TOK)
  msg = str(e.value)
  assert msg.startswith(f"config.{key}") and why in msg and "\n" not in msg, msg


def _cli_args(extra=()):
  return ["--config=configs/grpo_arith.py:runlocal", "--config.sft.steps=0", "--config.train.steps=4",
          "--config.train.ckpt_every=2", "--config.train.eval_every=4", "--config.train.plot_every=0",
          "--config.eval.size=8", "--config.eval.batch=8", "--config.eval.n_samples=1", "--config.eval.pass_k=(1,)",
          "--config.sampling.max_new_tokens=16", "--config.task.train_size=64", "--config.task.test_size=64",
          "--config.log.tensorboard=False", "--config.log.plots=False", "--config.model.hidden=32",
          "--config.model.layers=1", "--config.model.heads=2", "--config.model.kv_heads=1", "--config.model.inter=64",
          "--config.task.tokenizer=tools", "--config.model.vocab_size=516", "--config.sampling.engine=continuous",
          "--config.tools.env=tests.tool_envs:Echo", f"--config.tools.stop_markers={MARKERS!r}",
          "--config.tools.max_obs_tokens=8",
          # the env term (reward 1 per answered call) gives the groups reward variance: with accuracy alone every row
          # scored 0, the gradient was 0 (then 4e-9 of rounding), and "resumes exactly" compared untrained params
          '--config.rewards=(("accuracy",1.0),("env",0.5))', *extra]


def _cli(workdir, extra=(), env=None):
  args = _cli_args(extra)
  return subprocess.Popen([sys.executable, "-m", "grpo_jax.main", f"--workdir={workdir}", *args], cwd=ROOT,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", **(env or {})),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _rows(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


def _final_params(workdir):
  import orbax.checkpoint as ocp
  from grpo_jax.infra import checkpoint
  ck = os.path.join(workdir, "checkpoints")
  step = max(int(d) for d in os.listdir(ck) if d.isdigit())
  return jax.tree.leaves(ocp.StandardCheckpointer().restore(os.path.join(ck, str(step), checkpoint.STATE))["params"])


def test_cli_refuses_a_static_engine_with_an_environment_before_writing(tmp_path, capsys):
  """main.execute, the CLI after its flags (in-process: the subprocess's exit-2 path for a config error is
  tests/test_input_errors.py's): one line naming tools.env and the fix, exit 2, no workdir."""
  from grpo_jax import main
  from grpo_jax.infra import errors
  wd = str(tmp_path / "run")
  import ast
  args = _cli_args(["--config.sampling.engine=static"])
  path, arg = args[0].removeprefix("--config=").split(":")
  over = {}
  for a in args[1:]:
    key, text = a.removeprefix("--config.").split("=", 1)
    try:
      over[key] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      over[key] = text  # a bare string, as the flag reads it
  code = main.execute(config_lib.override(config_lib.load_config(os.path.join(ROOT, path), arg), over), wd)
  err = capsys.readouterr().err
  assert code == errors.EXIT_INPUT, err[-2000:]
  assert "config.tools.env" in err and "sampling.engine='continuous'" in err and not os.path.exists(wd)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  full = str(tmp_path_factory.mktemp("full"))
  p = _cli(full)
  out, _ = p.communicate(timeout=300)
  assert p.returncode == 0, out[-3000:]
  return full


def test_tool_run_rows_keep_the_metrics_contract(uninterrupted):
  """The tool run's rows as docs/metrics.md says (tests/metrics_contract.py): the train/ and eval/ tool counts are
  JSON integers (they were floats), the eval rows hold the tool readings, NaN only where a meaning allows it."""
  rows = metrics_contract.check_run(uninterrupted)
  evals = [r for r in rows if "eval/accuracy" in r]
  assert evals and all(isinstance(r["eval/tool_errors"], int) and "eval/tool_call_rate" in r for r in evals)
  assert all(isinstance(r["train/tool_errors"], int) for r in rows if "train/loss" in r)


def test_killed_inside_an_environment_call_resumes_exactly(uninterrupted, tmp_path):
  """A run SIGKILLed while a step waits in an environment call (after its step-2 checkpoint committed) resumes from
  its last checkpoint and ends with the uninterrupted run's metrics and params, bit for bit."""
  full = uninterrupted
  wd, gate = str(tmp_path / "killed"), str(tmp_path / "gate")
  ck = os.path.join(wd, "checkpoints")
  with open(gate, "w") as f:  # the first environment call once the step-2 checkpoint exists holds (tool_envs.GATE)
    f.write(os.path.join(ck, "2"))
  p = _cli(wd, env={tool_envs.GATE: gate})
  t0 = time.time()
  while not os.path.exists(gate + ".in_call"):
    assert p.poll() is None, f"no environment call after the step-2 checkpoint: {p.stdout.read()[-3000:]}"
    assert time.time() - t0 < 300, "slow"
    time.sleep(0.05)
  assert os.path.isdir(os.path.join(ck, "2"))
  p.send_signal(signal.SIGKILL)
  p.communicate(timeout=60)
  os.remove(gate)
  saved = max(int(n) for n in os.listdir(ck) if n.isdigit())
  assert 2 <= saved < 4
  p = _cli(wd)
  out, _ = p.communicate(timeout=300)
  assert p.returncode == 0, out[-3000:]
  assert f"at step {saved}" in out and "Resumed from" in out
  strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]
  assert strip(_rows(wd)) == strip(_rows(full))
  assert any(r.get("train/tool_calls_mean", 0) > 0 for r in _rows(full))
  # every step trains on a real gradient (0.28 to 0.40, 2026-12-06), the steps redone after the resume included:
  # bit-equal params are then a trained run's, not a zero-advantage run's unmoved ones
  assert all(r["train/grad_norm"] > 1e-3 for r in _rows(full) if "train/grad_norm" in r), _rows(full)
  for a, b in zip(_final_params(wd), _final_params(full)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tools_seeds_report_pairs_runs_with_the_control(tmp_path):
  """r1/tools_seeds.py on hand-made runs: first / last tenth of the tool-call rate (NaN steps left out), eval at
  step 0 and the end, and the tools − control difference of the held-out accuracy per seed, mean ± t-interval."""
  from grpo_jax.r1 import tools_seeds
  from grpo_jax.studies import stats

  def run(d, rate, acc_end, held):
    os.makedirs(os.path.join(d, "r1_zero"))
    with open(os.path.join(d, "r1_zero", "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 0, "eval/accuracy": 0.1, "eval/tool_call_rate": 0.2}) + "\n")
      for s in range(1, 21):
        f.write(json.dumps({"step": s, "train/tool_call_rate": rate(s),
                            "train/accuracy_with_tool": "nan" if s == 1 else 0.5}) + "\n")
      f.write(json.dumps({"step": 20, "eval/accuracy": acc_end, "eval/tool_call_rate": 0.9}) + "\n")
    with open(os.path.join(d, "report.json"), "w") as f:
      json.dump({"base": {"accuracy_last_number": 0.1}, "r1_zero": {"accuracy_last_number": held}}, f)
    return d
  tools = [run(str(tmp_path / "tools" / f"seed={k}"), lambda s: s / 20, 0.5 + 0.1 * k, 0.6 + 0.1 * k) for k in range(3)]
  ctl = [run(str(tmp_path / "ctl" / f"seed={k}"), lambda s: 0.0, 0.3, 0.4 + 0.05 * k) for k in range(3)]
  md = tools_seeds.write(str(tmp_path), tools, ctl)
  r = tools_seeds.per_run(tools[0])
  assert r["train/tool_call_rate@start"] == pytest.approx((1 / 20 + 2 / 20) / 2)  # the first tenth: 2 of 20 steps
  assert r["train/tool_call_rate@end"] == pytest.approx((19 / 20 + 1) / 2)
  assert r["train/accuracy_with_tool@start"] == 0.5  # step 1's NaN left out
  assert r["eval/accuracy@base"] == 0.1 and r["eval/accuracy@end"] == 0.5
  d = tools_seeds.paired([tools_seeds.per_run(x) for x in tools], [tools_seeds.per_run(x) for x in ctl])
  want = stats.summarize([0.6 - 0.4, 0.7 - 0.45, 0.8 - 0.5])
  assert d["accuracy_last_number@r1_zero"].mean == pytest.approx(want.mean)
  assert d["accuracy_last_number@r1_zero"].half_width == pytest.approx(want.half_width)
  assert "| `accuracy_last_number@r1_zero` |" in md and os.path.exists(tmp_path / "plots" / "tools_seeds.png")
  # seed 1 of the control did not finish: pairs are by name (seed=k), not position (t2 - c1 was "paired by seed")
  md = tools_seeds.write(str(tmp_path), tools, [ctl[0], ctl[2]])
  js = json.load(open(tmp_path / "tools_seeds.json"))["paired"]["accuracy_last_number@r1_zero"]
  want = stats.summarize([0.6 - 0.4, 0.8 - 0.5])
  assert js["n"] == 2 and js["mean"] == pytest.approx(want.mean) and js["half_width"] == pytest.approx(want.half_width)
  assert "Paired: the 2 seeds both arms finished; without a partner: seed=1." in md


_RL_8 = r"""
import json, sys
import jax, numpy as np
sys.path.insert(0, sys.argv[1])
from tests import test_tools_rl as T
from grpo_jax.infra import sharding
from grpo_jax.model import model as model_lib
from grpo_jax.rl import families, rl_step
from grpo_jax.run import train
c = T.tools_config(**{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2})
mesh = sharding.make_mesh(c.mesh, jax.devices()[:8])
mcfg = model_lib.ModelConfig.from_config(c.model)
spec = train.reward_terms(c, T.TOK)
step = families.make_step(c, mesh, mcfg, spec, T.TOK)
state, m = step(rl_step.init(c, mesh, mcfg, seed=0), train.device_batch(mesh, next(T.batches(c))))
m = jax.device_get(m)
spec.close()
print(json.dumps(dict(m={k: float(m[k]) for k in T.RL_8_METRICS}, tokens=np.asarray(m["samples/tokens_NxL"]).tolist(),
                      obs=np.asarray(m["samples/obs_NxL"]).tolist(),
                      params=[np.asarray(x).ravel().tolist()
                              for x in jax.tree.leaves(jax.device_get(state["params"]))])))
"""
RL_8_METRICS = ("train/loss", "train/tool_calls_mean", "train/obs_tokens_mean", "train/reward/env", "train/entropy",
                "train/grad_norm")


def test_rl_step_on_8_devices_equals_one_device(stepped):
  """The RL step with the environment on a data 2 × fsdp 2 × tensor 2 mesh (each device's rows call the host from
  that device): the one-device step's (the `stepped` fixture's first, in this process) samples, observations and
  tool readings, and its params after the update of a real gradient (norm 0.60) within 1e-5 = 0.001·lr.

  AdamW's ε is 1e-6 here (tools_config), not 1e-8: its first update is lr·g/(|g| + ε), so an element whose gradient
  cancels to ~1e-8 (rows of the tied embedding that few tokens touch) turns the two meshes' rounding of g into
  visible fractions of lr. At ε 1e-8 six of the embedding's 16,512 elements differed by up to 5.7e-5 (on an AMD
  EPYC, AVX2; under 2e-5 on an Intel Xeon) while every other leaf agreed within 6.5e-7; at 1e-6 all agree within
  2.2e-6."""
  from tests.test_engine import on_8_devices
  _, _, ms, first = stepped
  sh = on_8_devices(_RL_8, timeout=600)
  one = dict(m={k: float(ms[0][k]) for k in RL_8_METRICS}, tokens=np.asarray(ms[0]["samples/tokens_NxL"]).tolist(),
             obs=np.asarray(ms[0]["samples/obs_NxL"]).tolist(), params=[np.asarray(x).ravel() for x in jax.tree.leaves(first)])
  assert sh["tokens"] == one["tokens"] and sh["obs"] == one["obs"] and np.asarray(one["obs"]).sum() > 0
  assert one["m"]["train/grad_norm"] > 1e-3, one["m"]  # a real update, not AdamW's amplified rounding
  for k, v in one["m"].items():
    np.testing.assert_allclose(sh["m"][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
  assert len(sh["params"]) == len(one["params"])
  for a, b in zip(sh["params"], one["params"]):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
