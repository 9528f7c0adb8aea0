"""Partial rollouts (rl.partial_rollouts, rollout/carry.py): the carry's schedule worked by hand, the JAX carry against
its NumPy replay, today's samples and updates with max_staleness 0, the staleness mask, KV recompute, and the step
with the carry (no retrace, LoRA, bad input)."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.infra import sharding
from grpo_jax.model import model as model_lib
from grpo_jax.rl import families
from grpo_jax.rl import partial
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rollout import carry as carry_lib
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import sampling
from grpo_jax.run import validate
from grpo_jax.tasks import digits
from tests import metrics_contract
from tests import script_parts

# one layer: the step's claims hold at any depth, and layer_unroll (auto) unrolls training and prefill per layer, so
# a second layer cost ~25% more trace and compile per step program; the carry's own KV tests (the `carried`
# fixture) keep two layers, where recompute rebuilds each layer's cache
TINY = dict(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=12)
# the 8-device runs' size (8 groups: one per device over data=8), which the GRPO case of sync_and_carry0 uses too:
# its carry run is their one-device reference (the carry0_eight fixture)
EIGHT = dict(TINY, prompts=8, G=2, L=10)
# the digits workload's batch fields, plus each prompt's position in the stream (which groups a step trained)
FIELDS = {"answer_ids_NxA": ((4,), "int32"), "gid_N": ((), "int32")}


def _config(size: dict = TINY, **rl):
  c = digits.bench_config(**size)
  c.optim.lr = 1e-3  # one update visibly moves the random model
  c.sampling.update(engine="continuous", compaction=1)
  c.rl.update(**rl)
  return c


def _stream(c, n: int, seed: int = 1) -> list[dict]:
  """n batches of prompts with single-digit answers (a random 64-token model hits them sometimes: groups have
  reward variance), each prompt numbered in stream order."""
  out = []
  for i, b in enumerate(digits.make_batches(c.rl.prompts_per_step, n, seed=seed)):
    b["answer_ids_NxA"][:, 1:] = -1
    b["gid_N"] = (i * c.rl.prompts_per_step + np.arange(c.rl.prompts_per_step)).astype(np.int32)
    out.append(b)
  return out


def _run(c, n: int, mesh_shape=(1, 1, 1), step=None, stream_seed: int = 1):
  """n steps of the config's GRPO step from seed 0 on a data × fsdp × tensor mesh; (metrics per step, final state,
  step). `step`: that config's step, already built on the same mesh (a module fixture's), else built here.
  `stream_seed`: _stream's seed."""
  c.mesh.update(data=mesh_shape[0], fsdp=mesh_shape[1], tensor=mesh_shape[2])
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:int(np.prod(mesh_shape))])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  with carry_lib.batch_fields(FIELDS):
    step = step or families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
    state = rl_step.init(c, mesh, mcfg, seed=0)
    cspec = rollout_lib.carry_spec(c)
  batches = _stream(c, n + (cspec.Q // cspec.B if cspec else 0), seed=stream_seed)
  it = iter(batches) if cspec is None else carry_lib.host_stream(lambda k: iter(batches[k:]), cspec, 0)
  from grpo_jax.run.train import device_batch
  ms = []
  for _ in range(n):
    state, m = step(state, device_batch(mesh, next(it)))
    ms.append(jax.device_get(m))
  return ms, state, step


# ------------------------------------------------------------------------------------------ the schedule


def test_schedule_worked_by_hand():
  """B=1, G=2, max_staleness 1 (a table of 2 groups), 2 slots, budget 1, stream lengths g0 [3, 1], g1 [2, 2],
  g2 [1, 1], g3 [2, 1]. Step 0 admits g0, g1; slots take g0's rows (g0r1 ends at its first token); after one decode
  step g0r0 has 2 of 3 tokens and g1r0 took the free slot; the budget is spent but no group is complete, so the step
  decodes on: g0r0 and g1r0 end, g1r1 takes a slot; g0 is complete -> trained (2 decode steps, lags 0). Step 1 admits
  g2 (both rows end at their first token); g1r1 ends in one step; g1 and g2 are complete, g1 (older) is trained,
  g2 waits (lags: g1's tokens drawn at version 0, except g1r1's second token: [1, 1, 1, 0]). Step 2 admits g3 and
  trains g2 from the ready buffer (lags [1, 1]); the stream then cannot feed step 3."""
  r = carry_lib.simulate(np.array([3, 1, 2, 2, 1, 1, 2, 1]), B=1, G=2, max_staleness=1, slots=2, budget=1,
                         max_new=4, block=64)
  assert r["trained"] == [[0], [1], [2]]
  assert r["steps_per_step"] == [2, 1, 1]
  assert r["updates"] == 3
  assert r["trained_tokens"] == 4 + 4 + 2
  assert r["drawn_tokens"] == (4 + 3) + (2 + 1) + (2 + 1)  # first tokens at admission + the decode steps'
  assert r["row_steps"] == 2 * 4
  assert r["lag_max"] == 1 and r["lag_mean"] == pytest.approx(5 / 10)  # [0, 0, 0, 0], [1, 1, 1, 0], [1, 1]


def test_wait_never_trains_past_the_bound():
  """'wait' bounds the staleness by construction: B=1, G=1, max_staleness 2, 3 slots, budget 1, lengths g0..g5
  [4, 1, 4, 2, 4, 1]. Step 0 trains g1; at step 1 the young g3 (admitted at version 1) is complete before g0 and g2
  (version 0): trained ahead of them, both would be due at step 2 with one trained, g2 at lag 3 (what 'mask' does:
  its stale tokens masked). 'wait' trains the oldest versions first: g0 at step 1 (one more decode step), g2 at 2.
  Then random long-tailed streams on 1-2 devices: no trained token past the bound under 'wait'."""
  run = lambda wait: carry_lib.simulate(np.array([4, 1, 4, 2, 4, 1]), B=1, G=1, max_staleness=2, slots=3,
                                        budget=1, max_new=4, block=64, wait=wait)
  r = run(True)
  assert r["trained"] == [[1], [0], [2], [3]] and r["steps_per_step"] == [1, 2, 1, 1]
  assert r["lag_max"] == 2 and r["stale_tokens"] == 0
  r = run(False)
  assert r["trained"] == [[1], [3], [0], [2]] and r["lag_max"] == 3 and r["stale_tokens"] == 2
  rng = np.random.default_rng(0)
  for _ in range(60):
    D, k, G, L = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.choice([4, 16]))
    B = D * int(rng.integers(1, 3))
    S = D * int(rng.integers(1, (1 + k) * B * G // D + 1))
    lengths = np.where(rng.random(((1 + k) * B + 8 * B) * G) < 0.2, L, rng.geometric(0.4, ((1 + k) * B + 8 * B) * G))
    r = carry_lib.simulate(lengths, B=B, G=G, max_staleness=k, slots=S, budget=int(rng.integers(1, 3)), max_new=L,
                           block=16, split=D)
    assert r["lag_max"] <= k and r["updates"] == 9


def test_staleness_zero_simulates_the_synchronous_schedule():
  """max_staleness 0: the table holds B groups, each step decodes them to the end (no budget cut, no carry)."""
  lengths = np.random.default_rng(0).integers(1, 9, size=4 * 2 * 5)
  r = carry_lib.simulate(lengths, B=4, G=2, max_staleness=0, slots=8, budget=1, max_new=8, block=64)
  assert r["trained"] == [[4 * i + j for j in range(4)] for i in range(5)]
  assert r["lag_max"] == 0
  assert r["steps_per_step"] == [int(l.max()) - 1 for l in lengths.reshape(5, 8)]


def test_train_mask_by_hand():
  """Tokens lagging more than max_staleness updates leave the loss mask (not the completion mask); lags count only
  drawn tokens; the step's staleness metrics over the 5 drawn tokens: lags [2, 1, 0] and [0, 0]."""
  import types

  class Ro:  # the fields train_mask and metrics read
    mask_NxL = jnp.array([[1., 1., 1., 0.], [1., 1., 0., 0.]])
    version_NxL = jnp.array([[3, 4, 5, 0], [5, 5, 0, 0]], jnp.int32)
    carry_stats = types.SimpleNamespace(carried_rows=3, ready_groups=1, budget=4, new_tokens=9)
  loss_mask, lag = partial.train_mask(Ro, jnp.int32(5), 1)
  np.testing.assert_array_equal(np.asarray(lag), [[2, 1, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(np.asarray(loss_mask), [[0., 1., 1., 0.], [1., 1., 0., 0.]])
  m = jax.device_get(partial.metrics(Ro, lag, loss_mask))
  assert m["train/version_lag_mean"] == pytest.approx(3 / 5) and m["train/version_lag_max"] == 2
  assert m["train/stale_masked_frac"] == pytest.approx(1 / 5)


# --------------------------------------------------------------------------------- the JAX carry itself


# EOS = 13 of the 64 ids: the random model's rows end after 1 to 12 tokens (the one EOS id nearly always runs them
# to L, which makes every schedule first in, first out: no younger group ever completes ahead of an older one)
MANY_EOS = (digits.EOS,) + tuple(range(52, 64))


def _advance_steps(c, n: int, mesh=None, budget: int = 3, eos=digits.EOS):
  """n carry steps (advance alone, fixed weights, budget 3) on `mesh` (None: one device), rows ending at `eos` (an
  id or ids): the outputs, the final carry, and what built them."""
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  split = 1 if mesh is None else dict(mesh.shape)["data"] * dict(mesh.shape)["fsdp"]
  spec = carry_lib.spec_for(c, FIELDS, split)
  scfg = sampling.SamplingConfig.from_config(c.sampling, eos_id=eos, pad_id=0)
  batches = _stream(c, n + spec.Q // spec.B)
  outs = []
  with sharding.mesh_context(mesh) if mesh is not None else _nothing():
    adv = jax.jit(lambda carry, batch, v, rng: carry_lib.advance(mcfg, params, carry, batch, v, rng, scfg, spec,
                                                                 budget=budget))
    init = jax.jit(lambda: carry_lib.init(spec, mcfg),
                   out_shardings=None if mesh is None else sharding.tree_shardings(mesh, carry_lib.axes(spec, mcfg.layers)))
    carry = init()
    for v, b in enumerate(carry_lib.host_stream(lambda k: iter(batches[k:]), spec, 0)):
      if v == n:
        break
      if mesh is not None:
        from grpo_jax.run.train import device_batch
        b = device_batch(mesh, b)
      carry, out = adv(carry, b, v, jax.random.PRNGKey(100 + v))
      outs.append(jax.device_get(out))
  return dict(c=c, spec=spec, carry=jax.device_get(carry), outs=outs, params=params, mcfg=mcfg, budget=budget,
              eos=scfg.eos_ids)


class _nothing:
  def __enter__(self):
    return None

  def __exit__(self, *a):
    return False


def _replay(run: dict, wait: bool | None = None) -> tuple[dict, dict]:
  """(the JAX carry's schedule, carry.simulate's on the lengths the model sampled): groups trained per step, decode
  steps per step, the histogram of the trained tokens' version lags. `wait`: the replay's staleness policy (None:
  the run's)."""
  spec, outs, carry = run["spec"], run["outs"], run["carry"]
  L, G, D = spec.L, spec.G, spec.D
  lengths = {}
  for o in outs:
    for gi, gid in enumerate(o.fields["gid_N"]):
      lengths[int(gid)] = o.rollout.lengths_N[gi * G:(gi + 1) * G]
  for p in np.flatnonzero(carry.age_Q >= 0):  # groups still in the table: ended rows' lengths, else L (live on)
    rows = p * G + np.arange(G)
    lengths[int(carry.fields["gid_N"][p])] = np.where(carry.done_R[rows], carry.mask_RxL[rows].sum(1), L)
  # the groups admitted in n steps (Q, then B a step): the replay runs exactly those n steps
  stream = np.concatenate([lengths[g] for g in range(len(lengths))])
  r = carry_lib.simulate(stream, B=spec.B, G=G, max_staleness=spec.Q // spec.B - 1, slots=spec.S,
                         budget=run["budget"], max_new=L, block=spec.blk, split=D,
                         wait=spec.wait if wait is None else wait)
  lags = np.concatenate([(v - o.ver_NxL)[o.rollout.mask_NxL > 0] for v, o in enumerate(outs)])
  jx = dict(trained=[list(map(int, o.fields["gid_N"])) for o in outs], steps=[int(o.steps) for o in outs],
            lag_hist=np.bincount(lags).tolist(), updates=len(outs))
  return jx, dict(trained=r["trained"], steps=r["steps_per_step"], lag_hist=r["lag_hist"].tolist(),
                  updates=r["updates"])


@pytest.fixture(scope="module", params=["wait", "mask"])
def carried(request):
  """5 carry steps (max_staleness 1, 8 slots for 16 rows a step, budget 3) with fixed weights, rows of varied
  lengths (MANY_EOS): what advance did, under either staleness policy."""
  c = _config(partial_rollouts=True, max_staleness=1, staleness_policy=request.param)
  c.sampling.slots = 8
  c.model.layers = 2  # the recompute tests compare every layer's KV: more than one
  return _advance_steps(c, 5, eos=MANY_EOS)


def test_advance_matches_its_numpy_replay(carried):
  """The JAX carry's schedule (which groups each step trains, its decode steps, every trained token's version)
  equals carry.simulate fed the lengths the model sampled; under 'wait' no trained token is past the bound."""
  jx, r = _replay(carried)
  assert jx == r
  assert len(jx["lag_hist"]) > 1  # rows really were carried across steps
  # the staleness rule decided the schedule: the other policy's replay of these lengths trains other groups (with
  # rows that all end at L, first in first out, the JAX carry could drop 'wait' and this test still pass)
  assert _replay(carried, wait=not carried["spec"].wait)[1]["trained"] != jx["trained"]
  if carried["spec"].wait:
    assert len(jx["lag_hist"]) <= 2  # lags 0 and 1 only (max_staleness 1)


def test_trained_rows_are_complete_and_recorded(carried):
  """Every trained row ended (EOS or L tokens), its tokens are drawn left to right with nothing after the end, and
  the recorded behaviour log-prob is a log-prob (<= 0) of each drawn token; 8 slots stay full while rows queue."""
  for o in carried["outs"]:
    ro = o.rollout
    m = ro.mask_NxL
    assert np.all(np.diff(m, axis=1) <= 0) and np.all(m[:, 0] == 1)
    last_eos = np.isin(ro.tokens_NxL[np.arange(len(m)), ro.lengths_N - 1], carried["eos"])
    np.testing.assert_array_equal(ro.truncated_N, ~last_eos)
    assert np.all((ro.lengths_N == carried["spec"].L) | last_eos)
    assert np.all(ro.logp_NxL[m > 0] <= 0) and np.all(ro.logp_NxL[m == 0] == 0)
    assert o.new_tokens <= o.row_steps + o.admitted_rows


def test_every_group_drawn_trains_once_with_its_prompt(carried):
  """Conservation: each group admitted is trained once, whole (B a step) or is still in the table, none lost or
  trained twice; a trained group brings its own prompt and verifier fields; the rows left in the table are the
  carried rows plus the ready groups'."""
  spec, outs, carry = carried["spec"], carried["outs"], carried["carry"]
  stream = _stream(carried["c"], len(outs) + spec.Q // spec.B)
  prompt = np.concatenate([b["prompt_NxP"] for b in stream])
  answer = np.concatenate([b["answer_ids_NxA"] for b in stream])
  trained = [int(g) for o in outs for g in o.fields["gid_N"]]
  left = sorted(int(g) for g in carry.fields["gid_N"][carry.age_Q >= 0])
  assert len(trained) == len(outs) * spec.B == len(set(trained))
  assert sorted(trained + left) == list(range(spec.Q + spec.B * (len(outs) - 1)))
  for o in outs:
    np.testing.assert_array_equal(o.fields["prompt_NxP"], prompt[o.fields["gid_N"]])
    np.testing.assert_array_equal(o.fields["answer_ids_NxA"], answer[o.fields["gid_N"]])
  assert int(outs[-1].carried_rows) + int(outs[-1].ready_groups) * spec.G == len(left) * spec.G


def test_recompute_rebuilds_the_kept_kv(carried):
  """'recompute' re-prefills the live slots' completions; with the weights that wrote them it gives the KV 'keep'
  holds (below each live slot's position), up to the prefill/decode paths' rounding."""
  c, spec, mcfg, carry = carried["c"], carried["spec"], carried["mcfg"], carried["carry"]
  carry = jax.tree.map(jnp.asarray, carry)

  @jax.jit  # one program, as advance runs it (op-by-op dispatch compiled each op of the forward on its own)
  def recompute(params, carry):
    decode = decode_layout.prepare(mcfg, params, decode_layout.Layout("fsdp"))
    return carry_lib._recompute_slots(mcfg, params, carry.prompt_QxP, carry.pmask_QxP, carry.tokens_RxL, carry,
                                      spec, decode)
  ck, cv = recompute(carried["params"], carry)
  live = np.asarray(carry.live_S)
  assert live.any()
  for s in np.flatnonzero(live):
    t = int(carry.t_S[s])
    for l in range(mcfg.layers):
      np.testing.assert_allclose(np.asarray(ck[l][s, ..., :t]), np.asarray(carry.ck[l][s, ..., :t]), atol=2e-5)
      np.testing.assert_allclose(np.asarray(cv[l][s, :, :t]), np.asarray(carry.cv[l][s, :, :t]), atol=2e-5)


@pytest.mark.parametrize("carried", ["wait"], indirect=True)  # the policy does not matter here: one compile
def test_recompute_decodes_on_the_new_weights(carried):
  """After the weights moved, 'recompute' draws every new token from the current policy, also in the rows carried
  over the update: their tokens of this step score, under the training forward at the new weights, the log-prob
  the sampler recorded (fp32 rounding). (The test above keeps the weights; a recompute that re-prefilled with the
  old weights, or kept the old prompt KV, passes it. Under 'keep' these tokens differ by ~5e-3 here.)"""
  c, spec, mcfg = carried["c"], carried["spec"], carried["mcfg"]
  v = len(carried["outs"])  # the next step's version
  # the perturbation as one program (op by op it compiled ~40 programs, one per op and leaf shape)
  moved = jax.jit(lambda p: jax.tree.map(lambda x, k: x + 0.05 * jnp.std(x) * jax.random.normal(k, x.shape), p,
                                         jax.tree.unflatten(jax.tree.structure(p), list(
                                             jax.random.split(jax.random.PRNGKey(7), len(jax.tree.leaves(p)))))))
  params = moved(carried["params"])
  scfg = sampling.SamplingConfig.from_config(c.sampling, eos_id=carried["eos"], pad_id=0)
  batch = carry_lib.host_batch([_stream(c, v + spec.Q // spec.B)[-1]], spec)

  @jax.jit
  def step_and_score(params, carry, batch):
    _, out = carry_lib.advance(mcfg, params, carry, batch, v, jax.random.PRNGKey(100 + v), scfg, spec, budget=3,
                               kv="recompute")
    ro = out.rollout
    seq = rollout_lib.full_sequence(jnp.repeat(out.fields["prompt_NxP"], spec.G, 0),
                                    jnp.repeat(out.fields["prompt_mask_NxP"], spec.G, 0), ro.tokens_NxL, ro.mask_NxL)
    return out, rollout_lib.completion_logprobs(mcfg, params, seq, spec.P, c.sampling.temperature)[0]
  out, logp_NxL = jax.device_get(step_and_score(params, jax.tree.map(jnp.asarray, carried["carry"]), batch))
  m, ver = out.rollout.mask_NxL > 0, out.ver_NxL
  now_NxL = m & (ver == v) & np.any(m & (ver < v), axis=1, keepdims=True)  # this step's tokens of carried rows
  assert now_NxL.sum() >= 8, now_NxL.sum()
  gap = np.abs(logp_NxL - out.rollout.logp_NxL)
  assert gap[now_NxL].max() < 5e-6 and gap[m & (ver == v)].max() < 5e-6, gap[now_NxL].max()
  assert gap[m & (ver < v)].max() > 1e-3  # the older tokens were drawn by the old weights: the weights did move


# ------------------------------------------------------------------------------------------- the step


# Beside GRPO: REINFORCE++ (a per-token KL in the reward, batch whitening: the advantages read the whole batch's
# rows and the reference's log-probs), packed training passes, 3 prompts x G 3 (no power of two), and mu 2 over 3
# minibatches (the ratio leaves 1: pi_old matters)
_REINFORCE_PP = dict(algo="reinforce_pp", prompts=3, G=3, packing="on", mu=2, minibatches=3)


@pytest.fixture(scope="module", params=["grpo", "reinforce_pp"])
def sync_and_carry0(request):
  """Three steps of today's synchronous step and of the carry with max_staleness 0 (GRPO: the auto budget, as the
  8-device runs; REINFORCE++: an unlimited one)."""
  def config(**rl):
    c = _config(EIGHT if request.param == "grpo" else TINY, **rl)
    if request.param == "reinforce_pp":
      from grpo_jax.config import presets
      v = _REINFORCE_PP
      c = config_lib.override(c, presets.overrides(v["algo"]))
      c.rl.update(prompts_per_step=v["prompts"], G=v["G"], packing=v["packing"], mu=v["mu"],
                  minibatches=v["minibatches"])
    return c
  seed = 1 if request.param == "grpo" else 2  # seed 2: every step's 3 groups have reward variance
  a = _run(config(), 3, stream_seed=seed)
  if request.param == "grpo":  # the carry run the 8-device test compares with too
    return a, request.getfixturevalue("carry0_eight")
  return a, _run(config(partial_rollouts=True, max_staleness=0, rollout_budget=10_000), 3, stream_seed=seed)


def _carry0_eight_config():
  """max_staleness 0 (the auto budget) at the 8-device runs' size."""
  return _config(EIGHT, partial_rollouts=True, max_staleness=0)


@pytest.fixture(scope="module")
def carry0_eight():
  """3 steps of _carry0_eight_config on one device (stream seed 1): sync_and_carry0's GRPO carry run, and the
  one-device reference of test_carry_on_8_devices (its first 2 steps), which the 8-device subprocess compiled and
  ran again on a one-device mesh (a program for 1 device is a cache miss in a process of 8: the persistent cache's
  key holds the device count)."""
  return _run(_carry0_eight_config(), 3)


def test_staleness_zero_gives_todays_samples_and_updates(sync_and_carry0):
  (ma, sa, _), (mb, sb, _) = sync_and_carry0
  for x, y in zip(ma, mb):
    np.testing.assert_array_equal(x["samples/tokens_NxL"], y["samples/tokens_NxL"])
    for k in ("train/reward_mean", "train/reward_std", "train/completion_len_mean", "train/completion_len_max",
              "train/frac_zero_std_groups"):
      assert x[k] == y[k], k
    assert y["train/version_lag_max"] == 0 and y["train/carried_rows"] == 0 and y["train/ready_groups"] == 0
    assert x["train/reward_std"] > 0  # the update had a signal to follow
  # π_old: the sampler's log-probs (sync) vs the pre-update forward (carry): equal up to fp32 rounding, so the
  # updates are too (the existing tolerance of the engines' equivalence)
  for p, q in zip(jax.tree.leaves(sa["params"]), jax.tree.leaves(sb["params"])):
    np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=1e-4, atol=1e-6)


def _carry1_config():
  """max_staleness 1 with a budget of 4 decode steps a step (rows of up to 12 tokens: some are carried every step)."""
  c = _config(partial_rollouts=True, max_staleness=1, rollout_budget=4)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  # β = 0: step 0's groups have no reward variance, so its gradient is exactly 0 on any CPU. With β > 0 the KL term's
  # gradient is the rounding difference of the training and the reference forward (two programs): 0 on AVX2 EPYCs and
  # Xeons, 8.2e-10 on an AVX-512 EPYC (2026-12-07), which AdamW's ε turned into a step-0 update (step 1's mismatch_kl
  # 1.1e-10). The carry's reference forward runs in every other test of this module (β 0.04).
  c.rl.beta = 0.0
  return c


@pytest.fixture(scope="module")
def carry1_step():
  """ONE jitted step of _carry1_config on one device, which test_carry_step_compiles_once_and_carries and the
  separate runs of test_vmapped_seeds_each_carry_their_own_rows both run (it was traced and compiled twice)."""
  c = _carry1_config()
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  with carry_lib.batch_fields(FIELDS):
    return families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)


def test_carry_step_compiles_once_and_carries(carry1_step):
  # the shared step: whichever test ran it first, its 4 steps here (and the other test's 2 runs of 3 steps, same
  # shapes) trace it once
  ms, state, step = _run(_carry1_config(), 4, step=carry1_step)
  assert step.traces() == 1
  assert int(state["step"]) == 4
  assert max(m["train/version_lag_max"] for m in ms) >= 1  # carried tokens were trained a step later
  assert all(m["train/carried_rows"] > 0 for m in ms)
  assert all(abs(m["train/ratio_mean"] - 1.0) < 1e-5 for m in ms)  # π_old is the pre-update weights' forward
  assert all(np.isfinite(m["train/loss"]) for m in ms)
  # train/mismatch_kl (μ recorded by the sampler against π_prox, the pre-update forward): fp32 rounding (~1e-14)
  # while every trained token was drawn by the weights training it — step 0, and step 1, after step 0's update of a
  # zero gradient (no group had reward variance) —, and the lag's own mismatch (~5e-5) once carried tokens were
  # drawn before an update that moved the weights (steps 2, 3)
  kl = [float(m["train/mismatch_kl"]) for m in ms]
  assert float(ms[0]["train/grad_norm"]) == 0 and max(kl[:2]) < 1e-10 and min(kl[2:]) > 1e-6, kl


def test_carry_with_lora():
  c = _config(partial_rollouts=True, max_staleness=1)
  c.model.lora.rank = 4
  # stream seed 2: both steps' groups have reward variance (grad norms 0.095, 0.048; seed 1's first step had a
  # gradient of rounding residue, 7e-10, which passed a `> 0` check)
  ms, state, step = _run(c, 2, stream_seed=2)
  assert "base" in state and "carry" in state
  assert all(np.isfinite(m["train/loss"]) and m["train/grad_norm"] > 1e-3 for m in ms), [m["train/grad_norm"] for m in ms]


@pytest.mark.parametrize("key,value,needle", [
    ("rl.rollout_budget", -1, "rl.rollout_budget"),
    ("rl.max_staleness", -2, "rl.max_staleness"),
    ("rl.carry_kv", "reuse", "rl.carry_kv"),
    ("sampling.engine", "static", "sampling.engine='continuous'"),
    ("rl.dynamic_sampling", True, "rl.dynamic_sampling"),
    ("sampling.decode_attention", "paged", "sampling.decode_attention"),
    ("rl.carry_kv_groups", 3, "config.rl.carry_kv_groups: 3 must divide each device's 32 slots"),  # auto slots: 32
    # the bound is the table's rows, 2 x 32 (it said "the 64 rollout rows (prompts_per_step*G, ...)": 32)
    ("sampling.slots", 65, "65 exceeds the 64 rollout rows (the partial-rollout carry's table: (1 + rl.max_staleness)"),
    ("rl.rollout_budget", 2 ** 31, "config.rl.rollout_budget: 2147483648 is past 2**31 - 1"),  # was an OverflowError
    ("rl.max_staleness", 10 ** 7, "config.rl.max_staleness: the rollout carry's table"),  # was an OOM at the state
])
def test_bad_carry_settings_are_one_line(key, value, needle):
  """Refused by the input checks (preflight: validate_rl, then auto.check_choosable on the resolved config)."""
  from grpo_jax.rl import auto
  c = config_lib.load_config("configs/grpo_arith.py", "small")
  c = config_lib.override(c, {"sampling.engine": "continuous", "rl.partial_rollouts": True, key: value})
  with pytest.raises(config_lib.ConfigError) as e:
    validate.validate_rl(c, 1)
    auto.check_choosable(c, validate.validate_mesh(c, 1))
  assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("saved_split,refused", [(1, False), (8, True)])
def test_resume_on_another_row_split_is_one_line(tmp_path, saved_split, refused):
  """The carry's rows are device blocks over mesh data*fsdp with block-local indices: a checkpoint written over 1
  device resumed over 8 (or the reverse) was refused through the recorded rl.carry_kv_groups, or as a changed
  "model, critic, optimizer or reference", never naming the devices; now one line naming config.mesh."""
  from grpo_jax.infra import checkpoint, errors
  from grpo_jax.run import loop_guard
  c = config_lib.load_config("configs/grpo_arith.py", "small")
  c = config_lib.override(c, {"sampling.engine": "continuous", "rl.partial_rollouts": True})
  with checkpoint.Checkpointer(tmp_path / "checkpoints", save_every=1, keep=2, async_save=False) as ck:
    ck.maybe_save(1, {"carry": {"next_D": jnp.zeros((saved_split,), jnp.int32)}}, {"step": 1})
  guard = loop_guard.LoopGuard(c, str(tmp_path), "rl")
  mesh = sharding.make_mesh(c.mesh)  # this process: 1 CPU device
  if not refused:
    guard._check_carry_split(c, mesh)
    return
  with pytest.raises(errors.InputError) as e:
    guard._check_carry_split(c, mesh)
  msg = str(e.value)
  assert "split over 8 device block(s)" in msg and "over 1:" in msg and "config.mesh" in msg and "\n" not in msg


def test_carry_knobs_without_the_carry_are_logged(caplog):
  """A carry knob set while rl.partial_rollouts is off changes nothing, nor does sampling.compaction with it on:
  validation says so (a warning naming it), rather than dropping it silently."""
  import logging
  c = config_lib.load_config("configs/grpo_arith.py", "small")
  c = config_lib.override(c, {"rl.max_staleness": 3, "rl.carry_kv": "recompute"})
  with caplog.at_level(logging.WARNING):
    validate.validate_rl(c, 1)
  assert any(r.getMessage().startswith("rl.max_staleness=3, rl.carry_kv='recompute': no effect with "
                                       "rl.partial_rollouts=False") for r in caplog.records)
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    validate.validate_rl(config_lib.load_config("configs/grpo_arith.py", "small"), 1)
  assert not any("partial_rollouts" in r.getMessage() for r in caplog.records)
  # the other way round: the continuous engine's compaction means nothing to the carry's fixed slots — but the
  # held-out evaluation (run/evaluation.py) still runs the continuous engine with it, which the line says (it said
  # "no effect with rl.partial_rollouts" alone)
  c = config_lib.override(config_lib.load_config("configs/grpo_arith.py", "small"),
                          {"rl.partial_rollouts": True, "sampling.compaction": 4})
  with caplog.at_level(logging.WARNING):
    validate.validate_rl(c, 1)
  assert any(r.getMessage().startswith("sampling.compaction=4: no effect with rl.partial_rollouts on the training")
             and "evaluation" in r.getMessage() for r in caplog.records)


def test_ppo_with_the_carry_is_refused():
  c = config_lib.load_config("configs/grpo_arith.py", "small,algo=ppo")
  c = config_lib.override(c, {"sampling.engine": "continuous", "rl.partial_rollouts": True})
  with pytest.raises(config_lib.ConfigError, match="rl.partial_rollouts.*PPO"):
    validate.validate_rl(c, 1)
  # and by PPO's step itself, built without validation (studies, benchmarks, tests): its rollout was given no carry,
  # and the step failed at its first call in carry.advance ("ValueError: None is not a valid value for jnp.array")
  from grpo_jax.config import presets
  c = config_lib.override(_carry1_config(), presets.overrides("ppo"))
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  spec = digits.reward_spec(c.model.vocab_size)
  with carry_lib.batch_fields(FIELDS), pytest.raises(config_lib.ConfigError) as e:
    families.make_step(c, mesh, model_lib.ModelConfig.from_config(c.model), spec, spec.ctx.tokenizer)
  assert str(e.value).startswith("config.rl.partial_rollouts: not supported with algo='ppo'") and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------- 8 simulated devices

_SHARDED = r"""
import json, sys, traceback
import jax, numpy as np
sys.path.insert(0, sys.argv[1])
from tests import test_carry as T

def run(shape):
  # the step with max_staleness 0 (the synchronous samples, through the carry), and where the carry's buffers live
  # after its 2 steps (its table: B = 8 groups, R = 16 rows; S = 16 slots). (A third step program, max_staleness 1
  # for one step, read only for these shapes, was compiled per mesh: the buffers are placed by the same axes.)
  ms, state, _ = T._run(T._carry0_eight_config(), 2, shape)
  return dict(T._placement(ms, state), **T._eight_schedule(shape))

# every shape of argv in this one process (one JAX start-up, not one per shape), each result or its traceback under
# its own key: a failing shape fails only its own tests
results = {}
for arg in sys.argv[2:]:
  try:
    results[arg] = run(tuple(int(x) for x in arg.split(",")))
  except Exception:
    results[arg] = dict(error=traceback.format_exc())
print("JSON" + json.dumps(results))
"""


_SHAPES = [("8,1,1", 8, 2), ("2,2,2", 4, 1)]


def _placement(ms: list, state) -> dict:
  """A max_staleness-0 run's samples and metrics per step, and the shapes of its carry's first device shards."""
  return dict(tokens=[np.asarray(m["samples/tokens_NxL"]).tolist() for m in ms],
              metrics=[{k: float(m[k]) for k in ("train/reward_mean", "train/completion_len_mean")} for m in ms],
              ck_local=list(state["carry"].ck[0].addressable_shards[0].data.shape),
              rows_local=list(state["carry"].tokens_RxL.addressable_shards[0].data.shape))


def _eight_schedule(shape: tuple) -> dict:
  """advance alone (max_staleness 1, 4 steps) at the 8-device runs' size on a `shape` mesh: its schedule and the
  NumPy replay's on as many devices."""
  c = _config(EIGHT, partial_rollouts=True, max_staleness=1)
  c.mesh.update(data=shape[0], fsdp=shape[1], tensor=shape[2])
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:int(np.prod(shape))])
  jx, r = _replay(_advance_steps(c, 4, mesh))
  return dict(jx=jx, replay=r)


@pytest.fixture(scope="module")
def one_device(carry0_eight) -> dict:
  """test_carry_on_8_devices' one-device reference, in this process: carry0_eight's first 2 steps (what the 8-device
  runs take) and advance's schedule on a one-device mesh."""
  ms, state, _ = carry0_eight
  return dict(_placement(ms[:2], state), **_eight_schedule((1, 1, 1)))


@pytest.fixture(scope="module")
def sharded() -> dict:
  """_SHARDED's results for each of _SHAPES, keyed by shape: one subprocess of 8 simulated devices runs them one
  after another (it was one subprocess per shape: three JAX and grpo_jax start-ups; the one-device reference is now
  the one_device fixture's, in this process)."""
  import json, subprocess, sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, "-c", _SHARDED, root, *(s for s, _, _ in _SHAPES)],
                       capture_output=True, text=True, env=env, timeout=600, cwd=root)
  assert out.returncode == 0, out.stderr[-4000:]
  return json.loads(out.stdout.split("JSON", 1)[1])


@pytest.mark.parametrize("shape,split,heads", _SHAPES)
def test_carry_on_8_devices(one_device, sharded, shape, split, heads):
  """Each device keeps its own groups: its share of the table's rows, slots and KV (KV heads over tensor) stay on
  it across steps, its queue admits and its selection trains its own groups — the schedule equals the NumPy
  replay on as many devices —, and with max_staleness 0 the run equals one device's."""
  ref, r = one_device, script_parts.part(sharded, shape)
  assert r["tokens"] == ref["tokens"] and r["metrics"] == ref["metrics"]
  assert ref["rows_local"][0] == 16 and ref["ck_local"][:2] == [16, 2], ref  # one device holds them whole
  assert r["rows_local"][0] == 16 // split, r  # R = Q·G = 8·2 rows (max_staleness 0) over data × fsdp
  assert r["ck_local"][:2] == [16 // split, heads], r  # S = B·G = 16 slots; KV heads over tensor
  assert r["jx"] == r["replay"], (r["jx"], r["replay"])
  assert ref["jx"] == ref["replay"]
  assert r["jx"]["trained"] != ref["jx"]["trained"]  # per-device queues: another schedule than one device's


# ------------------------------------------------------------------------------------------- kill -9, resume


@pytest.fixture(scope="module")
def chaos_partial(tmp_path_factory):
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
  import chaos
  env = chaos.child_env(str(tmp_path_factory.mktemp("xla_cache")))
  ref = chaos.reference(chaos.SCENARIOS["partial"], str(tmp_path_factory.mktemp("carry") / "reference"), env)
  return chaos, env, ref


def test_killed_carry_run_resumes_exactly(chaos_partial, tmp_path):
  """SIGKILL inside a step, then SIGTERM at a save, each resumed (benchmarks/chaos.py's partial-rollouts scenario):
  the carry's in-flight rows come back with the state, so every state leaf (the carry's among them), metrics row and
  sample row equals the uninterrupted run's, which carried rows (version lags of 1)."""
  chaos, env, ref = chaos_partial
  metrics_contract.check_run(ref)  # the partial-rollout counts as integers, as docs/metrics.md says
  rows = [r for r in chaos._jsonl(os.path.join(ref, "metrics.jsonl"), True) if "train/version_lag_max" in r]
  assert max(r["train/version_lag_max"] for r in rows) >= 1
  # and trained on real gradients every step (chaos.GRPO's `random` reward term), so the resumed state is compared
  # with trained params, not untouched ones
  assert len(rows) == 8 and min(r["train/grad_norm"] for r in rows) > 1e-3, [r["train/grad_norm"] for r in rows]
  faults = [chaos.Fault("partial", "SIGKILL", chaos.STEP.kind, 2, 0.5),
            chaos.Fault("partial", "SIGTERM", chaos.SAVE.kind, 1, 0.2)]
  report = chaos.run_schedule(faults, str(tmp_path), references={"partial": ref}, log=lambda line: None,
                              use_tmpfs=False)
  assert report.landed >= 1 and report.compared and all(report.compared.values())  # {"partial/roundN": counts}
  assert report.ok, (report.problems, report.differences)


# --------------------------------------------------------------------------------------------- vmapped seeds


def test_vmapped_seeds_each_carry_their_own_rows(carry1_step):
  """Two seeds in one vmapped program (studies/vmapped_runs.py), each with its own carry and, as a sweep of
  optim.lr trains them, its own learning rate: every run equals its own separate run — samples, schedule metrics,
  and params up to the vmapped program's rounding."""
  from grpo_jax.rl import update as update_lib
  from grpo_jax.run.train import device_batch
  from grpo_jax.studies import vmapped_runs
  c = _carry1_config()
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  lrs = [c.optim.lr, 3 * c.optim.lr]  # in the optimizer state (vmapped_runs.OPT_KEYS): the same programs
  with carry_lib.batch_fields(FIELDS):
    states = vmapped_runs.init_states(c, mcfg, [0, 1], hparams={"optim.lr": lrs})
    vstep = vmapped_runs.make_steps(c, mesh, mcfg, spec, spec.ctx.tokenizer)
    one = carry1_step  # families.make_step of this config on this mesh: the separate runs' step
    cspec = rollout_lib.carry_spec(c)
  # stream seed 2: every step of both runs trains on groups with reward variance (seed 1's first step had a
  # gradient of rounding residue), so the params compared below are trained ones
  batches = _stream(c, 5, seed=2)
  stream = lambda: carry_lib.host_stream(lambda k: iter(batches[k:]), cspec, 0)
  keys = ("train/reward_mean", "train/completion_len_mean", "train/version_lag_mean", "train/carried_rows",
          "train/decode_steps")
  vm = []
  with carry_lib.batch_fields(FIELDS):  # the vmapped step builds each run's step when it traces
    for b in list(stream())[:3]:
      states, m = vstep(states, b)
      vm.append(jax.device_get(m))
  for i in range(2):
    with carry_lib.batch_fields(FIELDS):
      st = rl_step.init(c, mesh, mcfg, seed=i)
    hp = st["opt_state"].hyperparams  # run i's learning rate, placed as init placed the config's
    hp[update_lib.LR] = jax.device_put(jnp.asarray(lrs[i], hp[update_lib.LR].dtype), hp[update_lib.LR].sharding)
    for s, b in enumerate(list(stream())[:3]):
      st, m = one(st, device_batch(mesh, b))  # as _run feeds the shared step: the same input shardings, no retrace
      m = jax.device_get(m)
      assert float(m["train/grad_norm"]) > 1e-3, (i, s, float(m["train/grad_norm"]))
      for k in keys:
        assert float(m[k]) == pytest.approx(float(vm[s][k][i]), abs=1e-6), (i, s, k)
      np.testing.assert_array_equal(m["samples/tokens_NxL"], vm[s]["samples/tokens_NxL"][i])
    for a, v in zip(jax.tree.leaves(jax.device_get(st["params"])), jax.tree.leaves(jax.device_get(states["params"]))):
      np.testing.assert_allclose(a, v[i], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------- planner and roofline


def test_planner_holds_the_carry_resident_by_hand():
  """The carry's bytes per device (rollout/carry.py's buffers) are resident in the plan, and the slots' and prompts'
  KV leave the rollout's temporaries."""
  from grpo_jax.rl import memory_plan
  c = memory_plan.workload_config("tiny", prompts=4, G=4, prompt_len=16, L=64, dtype="float32", engine="continuous",
                                  partial_rollouts=True, max_staleness=1)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  mesh = dict(data=2, fsdp=1, tensor=1)
  p = memory_plan.plan(c, mesh, plat="cpu")
  Q, R, S = 8, 32, 16  # (1 + 1)·4 groups, their 4 rows each, B·G slots; over 2 devices
  kv = lambda rows, tokens: 2 * mcfg.layers * (rows // 2) * mcfg.kv_heads * mcfg.head_dim * tokens * 4
  assert p.resident["carry rows (tokens, log-probs, versions, masks, uniforms: R x L)"] == R // 2 * 64 * 20
  assert p.resident["carry prompts and their KV (Q x P)"] == Q // 2 * 16 * 8 + kv(Q, 16)
  assert p.resident["carry slot kv (S x L)"] == kv(S, 64)
  assert "slot kv cache (S x L)" not in p.rollout and "prompt kv cache (B x P)" not in p.rollout


def _nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _state_carry_and_plan(c):
  """(the carry the state of `c` allocates on one device, abstract; the planner's carry terms for it)."""
  from grpo_jax.rl import plan_terms
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  with carry_lib.batch_fields(FIELDS):
    carry = rl_step.state_spec(c, mesh, mcfg)[0]["carry"]
  return carry, plan_terms.carry_bytes(c, mcfg, dict(data=1, fsdp=1, tensor=1))


@pytest.mark.parametrize("model_dtype,sampler_dtype", [("float32", ""), ("float32", "bfloat16"),
                                                       ("bfloat16", "float32")])
def test_planned_carry_bytes_are_the_state_carrys(model_dtype, sampler_dtype):
  """The planner's carry terms against the carry the state allocates (abstract, nothing compiled): the KV exactly —
  it is in the sampler's dtype, sampling.dtype (the plan used the model's: 1.79x the state's carry with a bf16
  sampler over an fp32 model, 0.55x with an fp32 sampler over a bf16 model) —, the whole carry up to the small
  per-group / per-slot leaves the plan leaves out (verifier fields, ages, slot indices: < 2% here)."""
  c = _carry1_config()
  c.model.dtype, c.sampling.dtype = model_dtype, sampler_dtype
  carry, plan = _state_carry_and_plan(c)
  assert plan["carry slot kv (S x L)"] == _nbytes((carry.ck, carry.cv))
  assert plan["carry prompts and their KV (Q x P)"] == _nbytes((carry.pk, carry.pv, carry.prompt_QxP, carry.pmask_QxP))
  assert sum(plan.values()) <= _nbytes(carry) <= 1.02 * sum(plan.values())


def test_planned_carry_bytes_hold_the_environments_rows():
  """With an environment (tools.env) the carry also holds each row's observation mask, rewards, answered stops and
  event counts, and each slot's turn state: the plan's two terms are exactly those leaves of the state's carry."""
  c = _carry1_config()
  c.tools.update(env="calculator", max_obs_tokens=5)
  carry, plan = _state_carry_and_plan(c)
  assert plan["carry environment rows (observation mask, rewards, steps: R x L)"] == _nbytes(carry.env) > 0
  assert plan["carry turn state (S x observation)"] == _nbytes(carry.turn) > 0
  assert sum(plan.values()) <= _nbytes(carry) <= 1.02 * sum(plan.values())


def test_auto_decode_layout_never_picks_tp_for_the_carry():
  """sampling.decode_layout=auto on an fsdp mesh where the gathered weights do not fit picks a tensor-parallel
  decode group, whose KV heads repeat per group where its degree exceeds them; the carry keeps its KV with the
  model's heads (a set 'tp' is refused), so it crashed at trace time (a TypeError from live_attention's KV update,
  after the preflight passed). With the carry the planner picks among the other layouts."""
  from grpo_jax.rl import memory_plan
  c = config_lib.override(config_lib.load_config("configs/grpo_arith.py", "small"), {
      "sampling.engine": "continuous", "rl.prompts_per_step": 8, "rl.G": 2, "model.hidden": 2048,
      "model.inter": 8192, "model.layers": 8, "model.heads": 16, "model.kv_heads": 8, "model.vocab_size": 512})
  mesh = dict(data=1, fsdp=8, tensor=1)
  need = lambda c, layout: memory_plan.plan(c, mesh, plat="cpu", decode=layout).total_bytes
  hbm = (need(c, decode_layout.Layout("gathered")) + need(c, decode_layout.Layout("tp", 2))) // 2  # tp=2 fits only
  assert memory_plan.choose_decode(c, mesh, hbm, "cpu")[0].kind == "tp"
  carried = config_lib.override(c, {"rl.partial_rollouts": True})
  assert memory_plan.choose_decode(carried, mesh, hbm, "cpu")[0].kind == "fsdp"


def test_roofline_decode_work_replays_the_carry():
  """roofline.decode_work with partial rollouts: the carry's schedule over a stream of lengths, per update; with
  max_staleness 0 every step trains its own batch (lag 0, the stream's tokens), like the synchronous engine."""
  from grpo_jax.perf import roofline
  from grpo_jax.rl import memory_plan
  lengths = np.random.default_rng(0).integers(1, 65, size=4 * 4 * 6)
  for k in (0, 1):
    c = memory_plan.workload_config("tiny", prompts=4, G=4, prompt_len=16, L=64, engine="continuous",
                                    partial_rollouts=True, max_staleness=k, mesh=dict(data=1, fsdp=1, tensor=1))
    w = roofline.decode_work(c, lengths)
    sim = carry_lib.simulate(lengths, 4, 4, k, 16, 0, 64, 64, 1, carry_lib.kv_groups(0, 16, 1))
    assert w["steps"] == sim["steps"] / sim["updates"] and w["lag_max"] == sim["lag_max"] <= k
    if k == 0:
      assert w["tokens"] == lengths.sum() / 6 and sim["updates"] == 6


def test_grouped_kv_read_equals_one_group():
  """live_attention.attend with the rows in M groups of any order (each reading the blocks below its own longest
  row) gives one group's outputs: the groups change what is read, not the result. Two device blocks, rows at
  lengths from 1 to 37 in a block of 8-key blocks."""
  from grpo_jax.model import live_attention as la
  rng = np.random.default_rng(0)
  n, h, k, dh, b, p, lc, d = 16, 4, 2, 8, 3, 5, 40, 2
  f = lambda *s: jnp.asarray(rng.standard_normal(s).astype(np.float32))
  clen = jnp.asarray(rng.integers(1, 38, n).astype(np.int32))
  kv = la.LiveKV(f(b, k, dh, p), f(b, k, p, dh), jnp.ones((b, p), jnp.int32),
                 jnp.asarray(rng.integers(0, b, n).astype(np.int32)) % (b // 1), f(n, k, dh, lc), f(n, k, lc, dh), clen,
                 jnp.max(clen), 8, 1)
  q = f(n, h, dh)
  # attend under jit, as the engine runs it: one program per distinct call (instead of op-by-op dispatch, each op
  # compiled on its own); block and split stay static as they are in the engine
  jit_attend = jax.jit(lambda q, kv, block, split: la.attend(q, kv._replace(block=block, split=split)),
                       static_argnums=(2, 3))
  attend = lambda q, kv: jit_attend(q, kv._replace(block=0, split=0), kv.block, kv.split)
  one = attend(q, kv)
  for m in (2, 4):
    order = jnp.asarray(np.concatenate([rng.permutation(n // d) for _ in range(d)]).astype(np.int32))
    lens = jnp.max(jnp.take_along_axis(clen.reshape(d, -1), order.reshape(d, -1), 1).reshape(d, m, -1), axis=(0, 2))
    kv_d = kv._replace(split=d, pk_BxKxDxP=jnp.concatenate([kv.pk_BxKxDxP] * d), pv_BxKxPxD=jnp.concatenate(
        [kv.pv_BxKxPxD] * d), pok_BxP=jnp.concatenate([kv.pok_BxP] * d))
    got = attend(q, kv_d._replace(live_len=lens, order_N=order))
    np.testing.assert_allclose(np.asarray(got), np.asarray(attend(q, kv_d)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(attend(q, kv._replace(split=1))), np.asarray(one), rtol=0, atol=0)
