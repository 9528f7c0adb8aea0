"""Multi-turn rows in the continuous engine (rollout/turns.py, docs/tools.md): a row pauses on a stop id, the paused
rows go to the environment once per chunk boundary, the observation is fed into the row teacher-forced, and the row
samples on. Checked against hand-written outcomes (forced rows: a call, `done`, the turn limit, a stop at the last
position, an observation cut to the room), against a teacher-forced single pass over each sampled transcript (the
sampled tokens are the policy's draws from the same uniforms, the log-probs its log-probs, the observations what the
environment answers for that turn), in the paged store, under vmap, and on 8 simulated devices (each device calls
the environment with its own rows, copies over `tensor` do not call it again)."""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.envs import base as env_base
from grpo_jax.envs import batch as env_batch
from grpo_jax.envs import transcript
from grpo_jax.infra import sharding
from grpo_jax.model import model as M
from grpo_jax.rollout import engine as E
from grpo_jax.rollout import sampling as S
from grpo_jax.rollout import turns
from tests.test_sampling import MCFG, random_params
from tests import script_parts
from tests.test_engine import on_8_devices

B, P, G, L = 3, 6, 2, 16
EOS, STOPS, DONE_ID, O = 63, (60, 61), 50, 4


class CharTok:
  """id i <-> chr(i + 32): the environment's texts are the row's ids, one character each."""
  pad_id, eos_id = 0, EOS

  @staticmethod
  def encode(text):
    return [ord(c) - 32 for c in text]

  @staticmethod
  def decode(ids):
    return "".join(chr(int(i) + 32) for i in ids)


def answer(turn_ids) -> tuple[list[int] | None, float, bool]:
  """The toy environment as a function of a turn's ids: a turn that starts with DONE_ID ends the row (reward 2);
  any other gets [40, 41 × (len % 3 + 1), 42] (reward 0.5)."""
  if turn_ids[0] == DONE_ID:
    return None, 2.0, True
  return [40] + [41] * (len(turn_ids) % 3 + 1) + [42], 0.5, False


class Toy(env_base.Env):
  stateful = False

  def __init__(self):
    self.seen = []  # (rows in the call, active rows): what each host call got

  def reset(self, example):
    return ""

  def step(self, state, action_text):
    ids, reward, done = answer(CharTok.encode(action_text))
    return (None if ids is None else CharTok.decode(ids)), reward, done, {}


def make_tools(env, chunk=3, max_turns=2, stops=STOPS):
  eb = env_batch.EnvBatch(env, CharTok(), stop_ids=stops, max_obs_tokens=O, max_turns=max_turns, timeout_s=10.0)
  host = eb.host

  def recording_host(tokens, obs, n, active, fields):
    env.seen.append((len(active), int(np.sum(active)), np.asarray(fields["answer_N"])[np.asarray(active)].tolist()))
    return host(tokens, obs, n, active, fields)
  eb.host = recording_host
  return turns.Tools(call=eb.callback, stop_ids=stops, max_obs=O, chunk=chunk)


@pytest.fixture(scope="module")
def params():
  return random_params(MCFG, 0)


def prompts(b=B, seed=0):
  rng = np.random.default_rng(seed)
  pm = (np.arange(P)[None] >= np.array([0, 2, 5, 1, 3, 0])[:b, None]).astype(np.int32)
  return rng.integers(1, 60, (b, P)).astype(np.int32) * pm, pm


# jitted: one compile per shape instead of one per op (the forward and sampling.draw ran op by op)
_forward = jax.jit(M.forward, static_argnums=0)
_draw = jax.jit(S.draw, static_argnums=2)


def teacher_forced(params, prompt_NxP, pm_NxP, tokens_NxL, mask_NxL, temperature):
  """(logp_NxL, logits_NxLxV) of one forward over prompt + transcript: logits[:, t] predicts completion token t."""
  tok = np.concatenate([prompt_NxP, tokens_NxL], 1)
  mask = np.concatenate([pm_NxP, mask_NxL], 1)
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  logits = np.asarray(_forward(MCFG, params, jnp.asarray(tok), jnp.asarray(pos), jnp.asarray(mask)))[:, P - 1:-1]
  logp = np.asarray(jax.nn.log_softmax(logits / temperature, axis=-1))
  return np.take_along_axis(logp, tokens_NxL[..., None], -1)[..., 0], logits


def replay(tokens_L, n, stops, max_turns=2):
  """The observation mask and answered stop positions the contract gives a row whose model tokens are tokens_L[:n]
  (the observations in it re-derived from the toy environment): (obs_L, stops answered, whether it checks out)."""
  obs, answered, start, t, turn = np.zeros(len(tokens_L), np.int32), [], 0, 0, 0
  while t < n:
    if tokens_L[t] in stops and t < len(tokens_L) - 1:
      turn += 1
      answered.append(t)
      if turn > max_turns:
        return obs, answered, t == n - 1
      ids, _, done = answer(list(tokens_L[start:t + 1]))
      if done:  # the environment's EOS, fed, ends the row
        obs[t + 1] = 1
        return obs, answered, t + 1 == n - 1 and tokens_L[t + 1] == EOS
      ids = ids[:min(O, len(tokens_L) - t - 1)]
      if list(tokens_L[t + 1:t + 1 + len(ids)]) != ids:
        return obs, answered, False
      obs[t + 1:t + 1 + len(ids)] = 1
      t = start = t + 1 + len(ids)
      continue
    t += 1
  return obs, answered, True


# --------------------------------------------------------------------------------------------- forced rows

def test_forced_rows_pause_call_feed_end_and_truncate(params):
  """Six rows with planted stop ids (teacher forcing; observations are fed over the forced ids), 4 slots for the 6
  rows (a queue, then compaction), max_turns 2: row 0 calls once, then ends at EOS; row 1's turn starts with
  DONE_ID: the environment ends it with its EOS (fed, obs 1: it ended without one, which the verifiers score as cut
  off), not truncated; row 2 calls twice and its third stop id is past the turn limit: ended, unfinished, the
  environment's step not run; row 3 stops at the last position: it ends there, truncated, no call; row 4 never
  stops; row 5 stops 3 before the end: its 5-token observation is cut to the 2 positions left and the row ends at
  L, truncated. Each expected row is written out by hand from the toy environment's rule (`answer`)."""
  x = 7  # forced filler (fed over where an observation goes)
  f = np.full((B * G, L), x, np.int32)
  f[0, :8] = [1, 2, 60, x, x, x, 3, EOS]
  f[1, :2] = [DONE_ID, 61]
  f[2, :13] = [60, x, x, x, x, 5, 6, 61, x, x, x, 8, 60]
  f[3, L - 1] = 60
  f[5, L - 3] = 61
  want = [  # (tokens, observation mask) of each row, as long as the row
      ([1, 2, 60, 40, 41, 42, 3, EOS], [0, 0, 0, 1, 1, 1, 0, 0]),  # turn of 3 ids: one 41
      ([DONE_ID, 61, EOS], [0, 0, 1]),  # the environment's done: its EOS fed, the row finished
      ([60, 40, 41, 41, 42, 5, 6, 61, 40, 41, 42, 8, 60],  # turn of 1: two 41s; then a turn of 3: one 41
       [0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0]),
      ([x] * (L - 1) + [60], [0] * L),
      ([x] * L, [0] * L),
      ([x] * (L - 3) + [61, 40, 41], [0] * (L - 2) + [1, 1]),  # turn of 14 -> [40, 41, 41, 41, 42], cut to 2
  ]
  prompt, pm = prompts()
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=(EOS,))
  env = Toy()
  tools = make_tools(env)
  u = S.uniforms(jax.random.PRNGKey(0), L, B * G)
  fields = {"answer_N": jnp.arange(B, dtype=jnp.int32) + 100}
  ro, st = jax.jit(lambda pr, m, u, fo, fl: E.sample_groups(MCFG, params, pr, m, G, scfg, u_LxN=u, slots=4, levels=2,
                                                            force_NxL=fo, tools=tools, env_fields=fl))(
      prompt, pm, u, f, fields)
  tok, mask, obs = (np.asarray(x) for x in (ro.tokens_NxL, ro.mask_NxL, st.env.obs_NxL))
  for n, (t, o) in enumerate(want):
    assert mask[n].sum() == len(t), n
    np.testing.assert_array_equal(tok[n, :len(t)], t, err_msg=str(n))
    np.testing.assert_array_equal(obs[n, :len(t)], o, err_msg=str(n))
  assert np.asarray(ro.truncated_N).tolist() == [False, False, False, True, True, True]
  assert obs[mask == 0].sum() == 0
  # the observations' log-probs are 0; the model's tokens are scored as a teacher-forced pass scores them
  lp = np.asarray(ro.logp_NxL)
  assert np.all(lp[obs > 0] == 0)
  tf, _ = teacher_forced(params, np.repeat(prompt, G, 0), np.repeat(pm, G, 0), tok, mask, 1.0)
  model = (mask > 0) & (obs == 0)
  np.testing.assert_allclose(lp[model], tf[model], atol=2e-5, rtol=0)
  # rewards and steps at the answered stop ids; events per row; the truncated observation counted
  rew, step, ev = (np.asarray(x) for x in (st.env.reward_NxL, st.env.step_NxL, st.env.events_NxE))
  want_rew = {(0, 2): 0.5, (1, 1): 2.0, (2, 0): 0.5, (2, 7): 0.5, (2, 12): 0.0, (5, L - 3): 0.5}
  assert {(int(n), int(t)) for n, t in zip(*np.nonzero(step))} == set(want_rew)
  for (n, t), r in want_rew.items():
    assert rew[n, t] == r, (n, t)
  assert rew.sum() == sum(want_rew.values())
  want_ev = np.zeros_like(ev)
  want_ev[0, env_batch.CALL] = want_ev[1, env_batch.ENDED] = want_ev[5, env_batch.CALL] = 1
  want_ev[2, env_batch.CALL], want_ev[2, env_batch.TURN_LIMIT] = 2, 1
  np.testing.assert_array_equal(ev, want_ev)
  # calls (row 1's ended turn made none: the CALL events' sum), errors, timeouts, fallbacks, truncated
  assert np.asarray(st.env.counts_K).tolist() == [4, 0, 0, 0, 1]
  assert int(st.env.status) == 0
  # every host call got the slots of the phase (one device: 4, then 2 after compaction), the paused rows with
  # their prompt's field
  assert {r for r, _, _ in env.seen} <= {4, 2}
  assert sorted(a for _, _, ans in env.seen for a in ans) == [100, 100, 101, 101, 101, 102]


class Injecting(Toy):
  """Every observation holds an EOS id and a stop id: [EOS, 60, 42]."""

  def step(self, state, action_text):
    return CharTok.decode([EOS, 60, 42]), 0.5, False, {}


def test_an_observation_holding_eos_and_stop_ids_neither_ends_nor_pauses_the_row(params):
  """A fed token is never an end or a pause (docs/tools.md: Qwen's observations hold its EOS, <|im_end|>): the row
  takes [EOS, 60, 42] as its observation, samples on, calls once, and ends at its own EOS; the readings count one
  call and two turns. Untested before (the toy's observations held neither)."""
  x = 7
  f = np.full((B * G, L), x, np.int32)
  f[0, :8] = [1, 60, x, x, x, x, 3, EOS]
  prompt, pm = prompts()
  env = Injecting()
  ro, st = jax.jit(lambda pr, m, u, fo, fl: E.sample_groups(
      MCFG, params, pr, m, G, S.SamplingConfig(max_new_tokens=L, eos_id=(EOS,)), u_LxN=u, slots=4, levels=2,
      force_NxL=fo, tools=make_tools(env), env_fields=fl))(
          prompt, pm, S.uniforms(jax.random.PRNGKey(0), L, B * G), f, {"answer_N": jnp.arange(B, dtype=jnp.int32)})
  tok, mask, obs = (np.asarray(a) for a in (ro.tokens_NxL, ro.mask_NxL, st.env.obs_NxL))
  assert tok[0, :8].tolist() == [1, 60, EOS, 60, 42, x, 3, EOS] and mask[0].sum() == 8
  assert obs[0].tolist() == [0, 0, 1, 1, 1] + [0] * (L - 5) and not bool(ro.truncated_N[0])
  assert np.asarray(st.env.step_NxL)[0].nonzero()[0].tolist() == [1] and [a for _, n, a in env.seen if n] == [[0]]
  r = transcript.readings(mask[:1], obs[:1], np.asarray(st.env.events_NxE)[:1])
  assert (r["calls_N"][0], r["turns_N"][0], r["obs_tokens_N"][0]) == (1, 2, 3)


# ------------------------------------------------------------------------------------------- sampled rows

SAMPLED = S.SamplingConfig(max_new_tokens=L, eos_id=(EOS,), temperature=2.0)  # varied rows from the random model
SAMPLED_STOPS = (7, 14, 23, 41, 58, 60)  # ids the random model samples often: rows pause again and again
SAMPLED_STOPS_SEEN = 8  # observation tokens the sampled batch gets at least (it does at this seed: not vacuous)


def sampled_rows(params, u, **kw):
  prompt, pm = prompts(4, seed=1)
  env = Toy()
  tools = make_tools(env, chunk=3, stops=SAMPLED_STOPS)
  fields = {"answer_N": jnp.arange(4, dtype=jnp.int32)}
  ro, st = jax.jit(lambda pr, m, u, fl: E.sample_groups(MCFG, params, pr, m, G, SAMPLED, u_LxN=u, kv_block=4,
                                                        tools=tools, env_fields=fl, **kw))(prompt, pm, u, fields)
  return prompt, pm, ro, st, env


@pytest.mark.parametrize("attention,slots,levels", [("plain", 0, 1), ("plain", 4, 3), ("paged", 4, 2)])
def test_sampled_rows_are_the_policys_draws_over_the_transcript(params, attention, slots, levels):
  """Sampled rows (one slot per row; 4 slots for 8 rows with 3 compaction sizes; the paged store): every model
  token is what sampling.draw gives from a single teacher-forced forward over the row's whole transcript (prompt,
  its own tokens, the observations) with the same uniform u[t, n], its log-prob is that forward's; every
  observation is what the environment answers for the turn before it; observations have log-prob 0."""
  u = S.uniforms(jax.random.PRNGKey(3), L, 4 * G)
  prompt, pm, ro, st, env = sampled_rows(params, u, slots=slots, levels=levels, attention=attention, page_size=4)
  tok, mask, obs, lp = (np.asarray(x) for x in (ro.tokens_NxL, ro.mask_NxL, st.env.obs_NxL, ro.logp_NxL))
  assert obs.sum() >= SAMPLED_STOPS_SEEN and len(env.seen) > 1  # rows paused, over several boundaries
  tf_logp, logits = teacher_forced(params, np.repeat(prompt, G, 0), np.repeat(pm, G, 0), tok, mask, 2.0)
  model = (mask > 0) & (obs == 0)
  np.testing.assert_allclose(lp[model], tf_logp[model], atol=2e-5, rtol=0)
  assert np.all(lp[obs > 0] == 0)
  uu = np.asarray(u)
  for n in range(tok.shape[0]):
    k = int(mask[n].sum())
    want_obs, answered, ok = replay(tok[n], k, SAMPLED_STOPS)
    assert ok, n
    np.testing.assert_array_equal(obs[n], want_obs, err_msg=str(n))
    assert np.asarray(st.env.step_NxL)[n].nonzero()[0].tolist() == answered, n
    for t in np.nonzero(model[n])[0]:
      drawn, _ = _draw(jnp.asarray(logits[n, t][None]), jnp.asarray(uu[t, n][None]), SAMPLED)
      assert int(drawn[0]) == tok[n, t], (n, t)


def _sampled_run(params, env):
  """The sampled batch of 4 prompts on one device (4 slots, 2 compaction sizes) as a function of its uniforms,
  calling `env`."""
  prompt, pm = prompts(4, seed=1)
  tools = make_tools(env, chunk=3, stops=SAMPLED_STOPS)
  fields = {"answer_N": jnp.arange(4, dtype=jnp.int32)}
  return lambda u: E.sample_groups(MCFG, params, prompt, pm, G, SAMPLED, u_LxN=u, kv_block=4, slots=4, levels=2,
                                   tools=tools, env_fields=fields)


@pytest.fixture(scope="module")
def alone(params):
  """_sampled_run alone (one compiled program) on the uniforms of keys 3 and 4: per key (rollout, stats, the host
  calls it made). The vmapped test's runs alone; key 3's is also the 8-device test's one-device run."""
  env = Toy()
  fn = jax.jit(_sampled_run(params, env))
  out = []
  for k in (3, 4):
    ro, st = jax.block_until_ready(fn(S.uniforms(jax.random.PRNGKey(k), L, 4 * G)))  # its host calls all made
    out.append((ro, st, list(env.seen)))
    env.seen[:] = []
  return out


def test_vmapped_runs_each_get_their_own_environment_calls(params, alone):
  """Two runs under vmap (the callback's sequential vmap: each run calls the host with its own rows): each equals
  the run alone, and the host gets exactly the paused rows the two runs alone pass it (vmap turns the boundary's
  cond into a select that runs both branches: a run not at a boundary must pass no row)."""
  us = jnp.stack([S.uniforms(jax.random.PRNGKey(k), L, 4 * G) for k in (3, 4)])
  env = Toy()
  ro_v, st_v = jax.block_until_ready(jax.jit(jax.vmap(_sampled_run(params, env)))(us))
  sent = lambda seen: sum(n for _, n, _ in seen)
  for k, (ro, st, _) in enumerate(alone):
    np.testing.assert_array_equal(np.asarray(ro_v.tokens_NxL[k]), np.asarray(ro.tokens_NxL))
    np.testing.assert_array_equal(np.asarray(st_v.env.obs_NxL[k]), np.asarray(st.env.obs_NxL))
    np.testing.assert_allclose(np.asarray(ro_v.logp_NxL[k]), np.asarray(ro.logp_NxL), atol=1e-5, rtol=0)
    assert np.asarray(st.env.obs_NxL).sum() > 0
  assert not np.array_equal(np.asarray(ro_v.tokens_NxL[0]), np.asarray(ro_v.tokens_NxL[1]))
  assert sent(env.seen) == sum(sent(seen) for _, _, seen in alone) > 0


# The module's two 8-device runs (the turns' rollout and the carry's) are two parts of ONE subprocess (the
# `eight_devices` fixture; tests/script_parts.py): one Python + JAX + grpo_jax start-up instead of two, each part's
# result or traceback under its own key, so a failing part fails only its own test.
_EIGHT_DEVICES_HEAD = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import flax.linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sys.path.insert(0, sys.argv[1])
from tests.test_sampling import MCFG, random_params
from tests import test_turns as T
from grpo_jax.model import model as M
from grpo_jax.infra import sharding
from grpo_jax.rollout import engine as E, sampling as S
"""

_SHARDED = r"""
def rows():
  params = random_params(MCFG, 0)
  prompt, pm = T.prompts(4, seed=1)
  u = S.uniforms(jax.random.PRNGKey(3), T.L, 4 * T.G)
  fields = {"answer_N": jnp.arange(4, dtype=jnp.int32)}
  # only the sharded run: the one-device run is the test module's `alone` fixture, compiled in the test's process
  shape = (2, 2, 2)
  env = T.Toy()
  tools = T.make_tools(env, chunk=3, stops=T.SAMPLED_STOPS)
  run = lambda p, pr, m, u, fl: E.sample_groups(MCFG, p, pr, m, T.G, T.SAMPLED, u_LxN=u, kv_block=4, slots=4,
                                                levels=2, split=shape[0] * shape[1], tools=tools, env_fields=fl)
  mesh = Mesh(np.asarray(jax.devices()).reshape(shape), ("data", "fsdp", "tensor"))
  rules = sharding.LOGICAL_RULES
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    shard = lambda spec: NamedSharding(mesh, nn.logical_to_mesh_axes(tuple(spec), rules))
    p_sh = jax.device_put(params, jax.tree.map(shard, M.param_axes(MCFG), is_leaf=lambda x: isinstance(x, P)))
    ro, st = jax.jit(run)(p_sh, prompt, pm, jax.device_put(u, shard(P(None, "batch"))), fields)
  return dict(tokens=np.asarray(ro.tokens_NxL).tolist(), logp=np.asarray(ro.logp_NxL).tolist(),
              obs=np.asarray(st.env.obs_NxL).tolist(), reward=np.asarray(st.env.reward_NxL).tolist(), seen=env.seen)
"""


@pytest.fixture(scope="module")
def eight_devices() -> dict:
  """{"rows": the turns' rollout on data 2 x fsdp 2 x tensor 2, "carry": the carry's rows there}, from one
  subprocess of 8 simulated devices."""
  return on_8_devices(_EIGHT_DEVICES_HEAD + _SHARDED + _CARRY_SHARDED
                      + script_parts.tail({"rows": "rows", "carry": "carry"}), timeout=900)


def test_8_devices_each_call_with_their_own_rows(alone, eight_devices):
  """A data=2 x fsdp=2 x tensor=2 mesh (8 simulated devices): the 4 row shards each queue their own 2 rows in their
  own slot, and at a boundary each device calls the host with its own slot only (R = 1 of the 4 slots); the tensor
  copies of a shard pass no rows (only one copy runs the environment), and every copy gets the same observations:
  the tokens, log-probs, observations and rewards of the one-device run (the `alone` fixture's run on the same
  params, prompts and uniforms, compiled in this process: the subprocess compiles only the sharded run)."""
  ro, st, seen = alone[0]
  one = dict(tokens=np.asarray(ro.tokens_NxL).tolist(), logp=np.asarray(ro.logp_NxL).tolist(),
             obs=np.asarray(st.env.obs_NxL).tolist(), reward=np.asarray(st.env.reward_NxL).tolist(), seen=seen)
  sh = script_parts.part(eight_devices, "rows")
  assert one["tokens"] == sh["tokens"] and one["obs"] == sh["obs"] and one["reward"] == sh["reward"]
  np.testing.assert_allclose(sh["logp"], one["logp"], atol=1e-5, rtol=0)
  assert np.asarray(one["obs"]).sum() >= SAMPLED_STOPS_SEEN
  assert {rows for rows, _, _ in sh["seen"]} == {1}  # each device's own slot, never the whole batch
  calls_with_rows = [ans for _, active, ans in sh["seen"] if active]
  assert sorted(a for ans in calls_with_rows for a in ans) == sorted(
      a for _, active, ans in one["seen"] if active for a in ans)  # each paused row sent once, not once per copy


# ------------------------------------------------------------------------ the rollout carry (partial rollouts)

class FieldToy(Toy):
  """Toy whose rewards also read the row's field (answer_N / 100 more): a row called with another prompt's fields
  gets another reward; and which also ends every turn of a length divisible by 4 (done: the row is fed its EOS)."""

  def step(self, state, action_text):
    obs, reward, done, info = super().step(state, action_text)
    if len(action_text) % 4 == 0:
      obs, done = None, True
    return obs, reward + float(state.fields["answer_N"]) / 100, done, info


def _carry_spec(staleness: int, slots: int) -> "carry_lib.Spec":
  from grpo_jax.rollout import carry as carry_lib
  return carry_lib.Spec(B=2, G=G, Q=(1 + staleness) * 2, P=P, L=L, S=slots, D=1, blk=4,
                        fields=(("answer_N", (), "int32"),), kv_dtype=MCFG.dtype, obs=O)


@pytest.fixture(scope="module")
def carry_reference(params):
  """The synchronous engine the carry's rows are compared with: one jitted program for both `kv` cases (its host
  callback, a new one per make_tools, keeps the persistent cache from holding it: built twice, it compiled twice)."""
  return jax.jit(lambda pr, m, u, fl: E.sample_groups(MCFG, params, pr, m, G, SAMPLED, u_LxN=u, kv_block=4,
                                                      tools=make_tools(FieldToy(), chunk=5, stops=SAMPLED_STOPS),
                                                      env_fields=fl))


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_carried_rows_pause_across_steps_and_equal_the_engines_rows(params, carry_reference, kv):
  """The rollout carry with an environment (max_staleness 1, 'mask', 3 slots for 8 rows, budget 2, chunk 5): rows
  that pause, or are half-way through their observation, when a step ends are carried and go on in the next one;
  with the weights held fixed a row's transcript depends only on its prompt and uniforms, so every trained row —
  tokens, log-probs, observation mask, the environment's rewards (which read the row's prompt's field), answered
  stops and events — equals the synchronous engine's row for the same prompt and uniform column. 'recompute' rebuilds the carried slots' KV
  (observations included) from their tokens first."""
  from grpo_jax.rollout import carry as carry_lib
  spec = _carry_spec(1, 3)._replace(wait=False)
  env = FieldToy()
  tools = make_tools(env, chunk=5, stops=SAMPLED_STOPS)
  (p1, m1), (p2, m2) = prompts(6, seed=2), prompts(6, seed=3)
  prompt, pm = np.concatenate([p1, p2]), np.concatenate([m1, m2])
  stream = [dict(prompt_NxP=prompt[i:i + 2], prompt_mask_NxP=pm[i:i + 2], answer_N=np.arange(i, i + 2, dtype=np.int32))
            for i in range(0, 12, 2)]  # 6 batches of 2 prompts; answer_N: the prompt's stream index
  adv = jax.jit(lambda c, b, v, rng: carry_lib.advance(MCFG, params, c, b, v, rng, SAMPLED, spec, budget=2, kv=kv,
                                                       tools=tools))
  ref = carry_reference
  carry = carry_lib.init(spec, MCFG)
  want, trained, carried_paused = {}, {}, 0
  for v, b in enumerate(carry_lib.host_stream(lambda k: iter(stream[k:]), spec, 0)):
    if v == 5:
      break
    rng = jax.random.PRNGKey(50 + v)
    # the engine on the batch as laid out (Q prompts), on the step's uniforms: row src·G + g is the row that
    # admitting batch row src draws (one device: the j-th free position takes batch row j)
    ro, st = ref(b["prompt_NxP"], b["prompt_mask_NxP"], S.uniforms(rng, L, spec.Q * G), {"answer_N": b["answer_N"]})
    new = np.flatnonzero(np.asarray(carry.age_Q) < 0)
    for j, _ in enumerate(new):
      i = int(b["answer_N"][j])
      for g in range(G):
        n = j * G + g
        want[i, g] = dict(tok=np.asarray(ro.tokens_NxL[n]), lp=np.asarray(ro.logp_NxL[n]),
                          obs=np.asarray(st.env.obs_NxL[n]), rew=np.asarray(st.env.reward_NxL[n]),
                          step=np.asarray(st.env.step_NxL[n]), ev=np.asarray(st.env.events_NxE[n]))
    carry, out = adv(carry, b, v, rng)
    carried_paused += int(np.sum(np.asarray(carry.live_S) & (np.asarray(carry.turn.paused_S)
                                                             | (carry.turn.fpos_S < carry.turn.flen_S))))
    for r in range(spec.B * G):
      trained[int(out.fields["answer_N"][r // G]), r % G] = dict(
          tok=np.asarray(out.rollout.tokens_NxL[r]), lp=np.asarray(out.rollout.logp_NxL[r]),
          obs=np.asarray(out.env.obs_NxL[r]), rew=np.asarray(out.env.reward_NxL[r]),
          step=np.asarray(out.env.step_NxL[r]), ev=np.asarray(out.env.events_NxE[r]))
  assert carried_paused > 0  # a step ended with a row paused or being fed: the carried-turn path ran
  ended = sum(int(t["ev"][env_batch.ENDED]) for t in trained.values())
  assert ended > 0 and all(t["tok"][int(t["obs"].nonzero()[0].max())] == EOS for t in trained.values()
                           if t["ev"][env_batch.ENDED])  # the environment ended rows: each fed its EOS last
  assert len(trained) == 5 * spec.B * G and sum(int(t["obs"].sum()) for t in trained.values()) >= SAMPLED_STOPS_SEEN
  for key, got in trained.items():
    w = want[key]
    for k in ("tok", "obs", "rew", "step", "ev"):
      np.testing.assert_array_equal(got[k], w[k], err_msg=f"{key} {k}")
    np.testing.assert_allclose(got["lp"], w["lp"], atol=2e-5, rtol=0, err_msg=str(key))


def carry_rows(params, spec, steps: int, mesh=None, seeds: tuple[int, ...] = (50,), alone: bool = False):
  """`steps` steps of the rollout carry with the Toy environment (budget 2, chunk 5, fixed weights) over a stream of
  24 prompts in batches of spec.B, on `mesh` (None: one device, the spec's D device blocks all here), step v drawing
  with key seed + v: one run per seed, several under vmap. The trained rows of each run by (prompt, g) as lists,
  and the host calls' (slots passed, rows active). `alone`: each seed's run by itself, one after another with the
  same compiled program (a list of those results)."""
  if alone:
    env, adv = _carry_program(params, spec, vmapped=False)
    out = []
    for s in seeds:
      out.append(_carry_run(spec, steps, mesh, (s,), env, adv))
      env.seen[:] = []  # each run's own host calls
    return out
  return _carry_run(spec, steps, mesh, seeds, *_carry_program(params, spec, vmapped=len(seeds) > 1))


def _carry_program(params, spec, vmapped: bool):
  """(the environment, the jitted carry step that calls it)."""
  from grpo_jax.rollout import carry as carry_lib
  env = FieldToy()
  tools = make_tools(env, chunk=5, stops=SAMPLED_STOPS)
  adv = lambda c, b, v, rng: carry_lib.advance(MCFG, params, c, b, v, rng, SAMPLED, spec, budget=2, tools=tools)
  return env, jax.jit(jax.vmap(adv, in_axes=(0, None, None, 0)) if vmapped else adv)


def _carry_run(spec, steps, mesh, seeds, env, adv) -> dict:
  from grpo_jax.rollout import carry as carry_lib
  from grpo_jax.run.train import device_batch
  pp = [prompts(6, seed=s) for s in (2, 3, 4, 5)]
  prompt, pm = np.concatenate([p for p, _ in pp]), np.concatenate([m for _, m in pp])
  stream = [dict(prompt_NxP=prompt[i:i + spec.B], prompt_mask_NxP=pm[i:i + spec.B],
                 answer_N=np.arange(i, i + spec.B, dtype=np.int32)) for i in range(0, len(prompt), spec.B)]
  init = lambda: carry_lib.init(spec, MCFG)
  if len(seeds) > 1:
    init = lambda: jax.vmap(lambda _: carry_lib.init(spec, MCFG))(jnp.arange(len(seeds)))
  ctx = sharding.mesh_context(mesh) if mesh is not None else contextlib.nullcontext()
  rows = [{} for _ in seeds]
  with ctx:
    shard = None if mesh is None else sharding.tree_shardings(mesh, carry_lib.axes(spec, MCFG.layers))
    carry = jax.jit(init, out_shardings=shard)()
    for v, b in enumerate(carry_lib.host_stream(lambda k: iter(stream[k:]), spec, 0)):
      if v == steps:
        break
      keys = [jax.random.PRNGKey(s + v) for s in seeds]
      carry, out = adv(carry, b if mesh is None else device_batch(mesh, b), v,
                       keys[0] if len(seeds) == 1 else jnp.stack(keys))
      out = jax.device_get(out)
      for k in range(len(seeds)):
        o = out if len(seeds) == 1 else jax.tree.map(lambda x: x[k], out)
        for r in range(spec.B * G):
          rows[k][f"{int(o.fields['answer_N'][r // G])},{r % G}"] = dict(
              tok=o.rollout.tokens_NxL[r].tolist(), lp=o.rollout.logp_NxL[r].tolist(),
              obs=o.env.obs_NxL[r].tolist(), rew=o.env.reward_NxL[r].tolist(), step=o.env.step_NxL[r].tolist(),
              ev=o.env.events_NxE[r].tolist())
  return dict(rows=rows if len(seeds) > 1 else rows[0], seen=[(n, a) for n, a, _ in env.seen])


def _same_rows(got: dict, want: dict, atol: float) -> None:
  assert sorted(got) == sorted(want)
  for key, w in want.items():
    for k in ("tok", "obs", "rew", "step", "ev"):
      assert got[key][k] == w[k], (key, k)
    np.testing.assert_allclose(got[key]["lp"], w["lp"], atol=atol, rtol=0, err_msg=key)


# 4 row blocks of one slot each, max_staleness 1: the 8-device test's layout (run on one device, the 4 blocks side by
# side), which the vmapped test runs too, so that the runs alone are one compiled program for both tests
SPEC_D4 = _carry_spec(1, 4)._replace(B=4, Q=8, D=4, wait=False)


@pytest.fixture(scope="module")
def carries_alone(params):
  """SPEC_D4's carry on one device, seeds 50 and 80, each run alone (one compiled program): the vmapped test's
  runs alone, and (50) the 8-device test's one-device run."""
  return carry_rows(params, SPEC_D4, 3, seeds=(50, 80), alone=True)


def test_vmapped_carries_each_call_with_their_own_rows(params, carries_alone):
  """Two carries with an environment under vmap (a sweep's or vmapped seeds' rollout; other uniforms per run): each
  run trains exactly the rows it trains alone, and the host gets exactly the rows the runs alone pass it (vmap runs
  the boundary's cond as a select: a run not at a boundary passes no row)."""
  alone = carries_alone
  both = carry_rows(params, SPEC_D4, 3, seeds=(50, 80))
  for k in range(2):
    _same_rows(both["rows"][k], alone[k]["rows"], atol=1e-5)
  assert both["rows"][0] != both["rows"][1]
  assert sum(a for _, a in both["seen"]) == sum(a for run in alone for _, a in run["seen"]) > 0


_CARRY_SHARDED = r"""
def carry():
  params = random_params(MCFG, 0)
  mesh = Mesh(np.asarray(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  return T.carry_rows(params, T.SPEC_D4, 3, mesh=mesh)
"""


def test_carry_on_8_devices_calls_with_each_devices_slots(carries_alone, eight_devices):
  """The carry with an environment on data 2 × fsdp 2 × tensor 2 (8 simulated devices; 4 row blocks, one slot
  each, max_staleness 1): every trained row — tokens, observations, rewards, answered stops, events, log-probs —
  equals the same carry's on one device (its 4 device blocks side by side), and each host call passes one device's
  slot: never the whole batch, never a tensor copy's."""
  one = carries_alone[0]
  sh = script_parts.part(eight_devices, "carry")
  assert len(one["rows"]) == 3 * SPEC_D4.B * G and sum(sum(r["obs"]) for r in one["rows"].values()) >= SAMPLED_STOPS_SEEN
  _same_rows(sh["rows"], one["rows"], atol=1e-5)
  assert {n for n, _ in sh["seen"]} == {1} and {n for n, _ in one["seen"]} == {4}
  assert sum(a for _, a in sh["seen"]) == sum(a for _, a in one["seen"]) > 0  # each paused row sent once
