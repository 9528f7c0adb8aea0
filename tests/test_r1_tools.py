"""R1 rejection sampling with an environment (docs/tools.md, follow-up 4): the pipeline's stage 3 runs with
tools.env (it was refused), rows run in the continuous engine with the calculator answering, the verifiers read the
transcript, kept rows' records hold the observations and an `obs_mask` that stage 4's SFT loss leaves out; the
records are the same run after run; a bad combination is one line; records made without the environment are not
reused with it.

The model is a random tiny one on the `tools` tokenizer (tests/test_pipeline.py's tiny R1 config). Rows 0 and 2 of
each prompt are teacher-forced (engine.sample_groups' force_NxL, wrapped in): the reference worked solution calling
the calculator at every step (row 0) or at its first (row 2), so that they are verified right and kept; rows 1 and 3
are the random model's draws, pausing on ordinary pieces added as stop markers (the calculator ends such a turn: no
call in it)."""
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.envs import calculator
from grpo_jax.envs import formats
from grpo_jax.infra import errors
from grpo_jax.infra import params_ckpt
from grpo_jax.model import model as model_lib
from grpo_jax.r1 import corpus
from grpo_jax.r1 import pipeline
from grpo_jax.r1 import rejection
from grpo_jax.r1 import stage_config
from grpo_jax.rl import obs_mask
from grpo_jax.rl import sft_step
from grpo_jax.rollout import engine
from grpo_jax.run import validate
from grpo_jax.tasks import cot
from grpo_jax.tasks import tokenizer as tokenizer_lib
from tests.test_pipeline import _tiny_config

TOK = tokenizer_lib.load_tools()
L = 64
HOST_OWN = []  # the obs masks rejection sampling's host scoring removed (the `sampled` fixture's spy)
OBS_RE = re.compile(r" <tool_response> [^<]* </tool_response>")


def _ordinary_stops(avoid: set[int], n: int = 12) -> tuple[str, ...]:
  """n single-piece texts the forced rows never write: the random rows pause on them often."""
  out = []
  for i in range(100, 500):
    text = TOK.decode([i])
    if text.strip() and TOK.encode(text) == [i] and i not in avoid and len(out) < n:
      out.append(text)
  return tuple(out)


def r1_tools_config(stops=("</tool_call>",)):
  c = _tiny_config()
  c.task.tokenizer = "tools"
  c.model.update(vocab_size=516, max_len=c.task.prompt_len + L)
  c.sampling.update(max_new_tokens=L, compaction=1)  # one slot count: a third of the compile
  c.tools.update(env="calculator", stop_markers=tuple(stops), max_obs_tokens=16, chunk=4)
  c.r1.rejection.update(prompts=2, n=4, keep_per_prompt=2)
  c.r1.report.update(size=8, batch=8)  # one generate batch: 2 prompts x 4 rows
  return c


def _segments(ex, lang, calls_on) -> list[tuple[list[int], int]]:
  """The reference tagged solution of `ex` calling the calculator before the steps in `calls_on`, as (ids, is an
  observation) pieces, each tokenised alone (the format's markers split the text there: docs/tools.md)."""
  f, steps = formats.get("plain"), cot.steps_of(ex)
  calls = [f.call_text(calculator.Calculator.tool, f"{s.a} {s.op} {s.b}")
           + f.observation(calculator.result_text(f"{s.a} {s.op} {s.b}")[0]) if k in calls_on else ""
           for k, s in enumerate(steps)]
  text, out, at = cot.solution(ex, lang, calls=calls), [], 0
  for m in OBS_RE.finditer(text):
    out += [(TOK.encode(text[at:m.start()]), 0), (TOK.encode(m.group()), 1)]
    at = m.end()
  return out + [(TOK.encode(text[at:]), 0)]


def forced_rows(c):
  """force_NxL for the one generate batch, and per kept row (prompt q, row i) its expected completion ids and
  obs_mask, written out from the reference solution and the calculator's own observation text."""
  _, chosen, langs = rejection.prompt_set(c, TOK)
  n = c.r1.rejection.n
  force = np.full((len(chosen) * n, L), -1, np.int32)
  want = {}
  for q, ex in enumerate(chosen):
    lang = ("a", "b")[int(langs[q])]
    for i, calls_on in ((0, range(99)), (2, (0,))):
      segs = _segments(ex, lang, calls_on)
      ids = [t for s, _ in segs for t in s]
      obs = [o for s, o in segs for _ in s]
      assert len(ids) < L and sum(obs) > 0
      force[q * n + i, :len(ids) + 1] = ids + [TOK.eos_id]
      want[(q, i)] = (ids, obs)
  return force, want


def _patch_force(monkeypatch, force):
  real = engine.sample_groups

  def forced(*args, **kw):
    return real(*args, force_NxL=jnp.asarray(force), **kw)
  monkeypatch.setattr(engine, "sample_groups", forced)


def _params(c, path):
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params_ckpt.save_params(str(path), model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  return mcfg


def _records(path):
  return [json.loads(l) for l in open(path)]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
  """Rejection sampling with the calculator, run twice from the same seed: as the pipeline's stage 3 (stage 2
  finished before it, as a stand-in: its params and its record) and again alone, as a rerun of the stage."""
  from grpo_jax.r1 import layout
  from grpo_jax.run import stages as stages_lib
  mp = pytest.MonkeyPatch()
  real_own = obs_mask.own_tokens  # stage 2's reward terms score the rows' own tokens (HOST_OWN: their obs masks)
  mp.setattr(obs_mask, "own_tokens", lambda *a, **k: (HOST_OWN.append(np.asarray(a[2])) if k.get("xp") is np else None)
             or real_own(*a, **k))
  c = r1_tools_config()
  force, want = forced_rows(c)
  stops = ("</tool_call>",) + _ordinary_stops({int(t) for t in force.ravel() if t >= 0})
  c = r1_tools_config(stops)
  _patch_force(mp, force)
  wd = str(tmp_path_factory.mktemp("run"))
  grpo = pipeline.stage_list(c, wd, ["r1_2_grpo"])[0]
  stages_lib.prepare(grpo, "start", wd)
  _params(c, layout.params_path(wd, "r1_2_grpo"))
  stages_lib.mark_done(grpo)
  pipeline.run_pipeline(c, wd, ("r1_3_rejection",), report_md=False)  # refused with tools.env before
  out = [(layout.stage_dir(wd, "r1_3_rejection"), json.load(open(layout.rejection_stats(wd))))]
  d1 = tmp_path_factory.mktemp("rerun")
  stats = rejection.rejection_sample(c, layout.params_path(wd, "r1_2_grpo"), str(d1 / "data.jsonl"))
  out.append((d1, stats))
  mp.undo()
  return c, want, [(pathlib.Path(d), s) for d, s in out]


def test_records_hold_the_transcript_and_the_engines_observation_mask(sampled):
  """Each kept row's record is its whole transcript (the model's turns and the calculator's observations) with
  `obs_mask` = the engine's observation mask over it (and 0 for the eos the row wrote), written out by hand from the
  reference solution and the calculator's text; the drawn rows are counted: rejected, ended by the environment."""
  c, want, ((d, stats), _) = sampled
  recs = [r for r in _records(d / "data.jsonl") if r["kind"] == "reasoning"]
  _, chosen, _ = rejection.prompt_set(c, TOK)
  # rows 0 and 2 of each prompt, verified right (their ranks tie: the earlier first); the drawn rows never are
  expect = [(q, i) for q in range(len(chosen)) for i in (0, 2)]
  assert [(r["index"]) for r in recs] == [chosen[q]["index"] for q, _ in expect]
  for r, key in zip(recs, expect):
    ids, obs = want[key]
    assert r["completion_ids"] == ids, key
    assert r["obs_mask"] == obs + [0], key  # the eos the row wrote after </answer> is the model's
    assert r["text"] == TOK.decode(ids) and "<tool_response>" in r["text"]
  assert stats["samples"] == 8 and stats["kept_reasoning"] == 4 and stats["rejected"] == 4
  assert stats["kept_with_observations"] == 4 and stats["correct_frac"] == 0.5
  # the forced rows' calls (row 0: every step, row 2: the first) are answered; at this seed every drawn row pauses on
  # an ordinary marker, a turn without a call, which the calculator ends (its EOS appended): not vacuous
  forced_calls = sum(sum(1 for s in _segments(chosen[q], "a", calls) if s[1]) for q in range(2)
                     for calls in (range(99), (0,)))
  assert stats["tool_calls"] >= forced_calls == 6 and stats["env_ended"] == 4
  assert stats["obs_tokens"] >= sum(sum(want[k][1]) for k in expect) + stats["env_ended"]
  for k in ("tool_errors", "tool_timeouts", "tool_fallbacks", "tool_turn_limits"):
    assert k in stats


def test_stage2_rewards_score_the_models_own_tokens(sampled):
  """Rejection sampling's host scoring (stage 2's reward terms) reads obs_mask.own_tokens of each generate batch with
  the engine's observation mask, once per batch and run; the verifiers' in-graph path is
  test_tools_rl.py's test_the_rollout_and_held_out_generate_score_the_own_tokens."""
  c, _, _ = sampled
  n = c.r1.report.batch
  assert len(HOST_OWN) == 2 and all(o.shape == (n, L) and o.sum() > 0 for o in HOST_OWN)


def test_records_are_the_same_run_after_run(sampled):
  """A rerun of the stage (a resumed pipeline redoes an unfinished stage 3 whole) writes the same bytes: the
  environment is deterministic in the turn's text and the sampler's rng is the run's."""
  _, _, ((d0, s0), (d1, s1)) = sampled
  assert open(d0 / "data.jsonl", "rb").read() == open(d1 / "data.jsonl", "rb").read()
  assert s0 == s1 and json.load(open(d0 / "stats.json")) == json.load(open(d1 / "stats.json")) == s0


def test_stage4_trains_on_the_models_tokens_only(sampled):
  """Stage 4's batches from these records: the loss mask is 0 at every observation token (1 at the model's), the SFT
  loss equals a NumPy next-token NLL over the loss tokens, and its gradient with respect to the logits that predict
  an observation token is exactly 0 (through the hidden state that gives them: logits[t-1] = f(h[t-1]))."""
  c, _, ((d, _), _) = sampled
  recs = corpus.read_records(str(d / "data.jsonl"))
  c.r1.sft2.batch = len(recs)
  batch = next(corpus.records_batches(c, TOK, recs)(0))
  tokens, loss = batch["tokens_NxT"], batch["loss_mask_NxT"]
  by_tokens = {tuple([TOK.bos_id] + r["prompt_ids"] + r["completion_ids"] + [TOK.eos_id]): r for r in recs}
  obs_pos = []
  for n in range(tokens.shape[0]):
    r = by_tokens[tuple(int(t) for t in tokens[n][batch["mask_NxT"][n] > 0])]
    start = 1 + len(r["prompt_ids"])
    end = start + len(r["completion_ids"]) + 1
    obs = r.get("obs_mask") or [0] * (end - start)
    np.testing.assert_array_equal(loss[n, start:end], 1 - np.asarray(obs))
    assert loss[n, :start].sum() == (start - 1 if r["kind"] == "general" else 0)
    obs_pos += [(n, start + j) for j, o in enumerate(obs) if o]
  assert len(obs_pos) > 20  # the kept rows' observations are in the batch
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(3))
  b = {k: jnp.asarray(v) for k, v in batch.items()}

  @jax.jit  # one program (op by op, the forwards and the gradient were ~150 eager ops, each its own tiny compile)
  def loss_logits_and_head_grad(params, b):
    sft_loss, _ = sft_step.sft_loss(mcfg, params, b)
    logits = model_lib.forward(mcfg, params, b["tokens_NxT"], b["positions_NxT"], b["mask_NxT"])
    h, head = model_lib.hidden_states(mcfg, params, b["tokens_NxT"], b["positions_NxT"], b["mask_NxT"])
    return sft_loss, logits, jax.grad(lambda hh: sft_step.head_loss(mcfg, hh, head, b)[0])(h)
  got, logits, g = loss_logits_and_head_grad(params, b)
  logits, g = np.asarray(logits, np.float64), np.asarray(g)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]  # column t-1 predicts token t
  want = (nll * loss[:, 1:]).sum() / loss[:, 1:].sum()
  np.testing.assert_allclose(float(got), want, rtol=2e-5)
  for n, t in obs_pos:
    assert not np.any(g[n, t - 1]), (n, t)
  for n, t in zip(*np.nonzero(loss[:, 1:])):
    assert np.any(g[n, t]), (n, t + 1)  # every token the model wrote is trained


def test_old_records_load_and_a_bad_obs_mask_is_one_line(tmp_path):
  """Records written before obs_mask (no environment: every completion token trained) load and pack as before; a
  record whose obs_mask does not cover its completion and eos is one line naming the redo."""
  path = str(tmp_path / "data.jsonl")
  corpus.write_records(path, [{"prompt_ids": [7], "completion_ids": [9, 10], "kind": "reasoning"},
                              {"prompt_ids": [7], "completion_ids": [9, 10], "kind": "reasoning",
                               "obs_mask": [0, 1, 0]}])
  recs = corpus.read_records(path)
  b = corpus.pack([(r["prompt_ids"], r["completion_ids"], False, r.get("obs_mask")) for r in recs], TOK, 6)
  np.testing.assert_array_equal(b["tokens_NxT"], [[1, 7, 9, 10, 2, 0]] * 2)
  np.testing.assert_array_equal(b["loss_mask_NxT"], [[0, 0, 1, 1, 1, 0], [0, 0, 1, 0, 1, 0]])
  for bad in ([0, 1], [0, 1, 0, 0], [0, 2, 0], "011"):
    corpus.write_records(path, [{"prompt_ids": [7], "completion_ids": [9, 10], "kind": "reasoning",
                                 "obs_mask": bad}])
    with pytest.raises(errors.InputError) as e:
      corpus.read_records(path)
    msg = str(e.value)
    assert "line 1 is damaged (obs_mask must hold a 0 or 1 per completion id" in msg, msg
    assert "rerun_stages=r1_3_rejection" in msg and "\n" not in msg


def test_rejection_with_an_environment_validates_and_bad_combinations_are_one_line():
  """tools.env with r1_3_rejection was refused (the sampler ran no environment); now it runs, and what it cannot run
  is refused before any stage, naming the key: the static engine (no slots to pause in), the qwen format (the
  task's R1-Zero prompts are sampled). ConfigError exits 2."""
  c = r1_tools_config()
  stage_config.validate(c, ("r1_3_rejection",))
  c.sampling.engine = "continuous"
  stage_config.validate(c, ("r1_3_rejection",))
  assert rejection.sampler_config(r1_tools_config()).sampling.engine == "continuous"  # auto: the RL stages' choice
  c.sampling.engine = "static"
  stage_config.validate(c, ("base",))  # the stages run are the ones checked
  with pytest.raises(validate.ConfigError) as e:
    stage_config.validate(c, ("base", "r1_3_rejection"))
  assert str(e.value).startswith("config.sampling.engine: 'static': rejection sampling (r1_3_rejection) with "
                                 "tools.env='calculator' pauses rows") and "\n" not in str(e.value)
  assert e.value.exit_code == errors.EXIT_INPUT == 2
  c = r1_tools_config()
  c.tools.format = "qwen"
  with pytest.raises(validate.ConfigError, match=r"^config.tools.format: 'qwen': rejection sampling "):
    stage_config.validate(c, ("r1_3_rejection",))


def test_records_made_without_the_environment_are_not_reused_with_it(tmp_path):
  """Stage 3's record holds tools.* (the 'sample' view keeps them): a data.jsonl sampled without the environment is
  refused, not skipped, when the run sets tools.env, and stage 4's view (its upstream fingerprint) changes too."""
  from grpo_jax.run import stages as stages_lib
  wd = str(tmp_path)
  with_env, plain = r1_tools_config(), r1_tools_config()
  plain.tools.env = ""  # the same run but for the environment
  st = pipeline.stage_list(plain, wd, ["r1_3_rejection"])[0]
  stages_lib.prepare(st, "run", wd)
  stages_lib.mark_done(st)
  assert stages_lib.plan(pipeline.stage_list(plain, wd, ["r1_3_rejection"]), plain, wd)["r1_3_rejection"] == "skip"
  with pytest.raises(errors.InputError, match=r"finished stage r1_3_rejection .*tools.env"):
    stages_lib.plan(pipeline.stage_list(with_env, wd, ["r1_3_rejection"]), with_env, wd)
  views = [pipeline.stage_list(x, wd, ["r1_4_sft"])[0].view for x in (plain, with_env)]
  assert views[0]["stage.upstream"] != views[1]["stage.upstream"]


def test_obs_mask_covers_the_completion_and_its_eos():
  """A record's obs_mask by hand: the engine's mask over the row (the environment's EOS, fed as an observation when
  its `done` ends the row, included: stage 4 does not train the model to end there), and 0 for an eos the row did
  not write (corpus.pack appends one); pack's loss mask is its complement over the completion."""
  eos = TOK.eos_id
  rows = [([5, 6, 7, 8, eos], [1, 1, 1, 1, 1], [0, 0, 1, 1, 0]),  # the model wrote its eos
          ([5, 6, 7, eos, 0], [1, 1, 1, 1, 0], [0, 0, 0, 1, 0]),  # the environment's done: its eos fed
          ([5, 6, 7, 8, 9], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0])]    # no eos (cut off at L)
  comps = [[5, 6, 7, 8], [5, 6, 7], [5, 6, 7, 8, 9]]
  want = [[0, 0, 1, 1, 0], [0, 0, 0, 1], [0, 1, 0, 0, 0, 0]]
  for (t, m, o), comp, w in zip(rows, comps, want):
    assert rejection._obs_mask(np.asarray(o), np.asarray(m), len(comp)) == w  # pylint: disable=protected-access
  b = corpus.pack([([4], comps[1], False, want[1])], TOK, 8)
  np.testing.assert_array_equal(b["tokens_NxT"], [[1, 4, 5, 6, 7, eos, 0, 0]])
  np.testing.assert_array_equal(b["loss_mask_NxT"], [[0, 0, 1, 1, 1, 0, 0, 0]])


# ------------------------------------------------------------- the environment's own reward ('env') in the R1 stages

CALL_COST = -0.25  # CostlyCalculator's reward per step


class CostlyCalculator(calculator.Calculator):
  """The calculator with a reward of its own: CALL_COST for every step (a cost per tool call)."""

  def step(self, state, action_text):
    return super().step(state, action_text)._replace(reward=CALL_COST)


COSTLY = f"{__name__}:CostlyCalculator"


def test_rl_stage_weights_the_environments_reward_as_the_rl_step_does():
  """('env', w) in an R1 RL stage's mix resolves (it was 'unknown term') to the main RL path's 'env' term: the
  stage's reward spec, built as the pipeline builds it (train.reward_terms with r1's Python terms), gives a row
  brevity + 2 · (its environment step rewards summed), hand-computed; a reward at a position no step ends at is not
  one of the row's."""
  from grpo_jax.r1 import rewards as r1_rewards
  from grpo_jax.rl import rewards as rewards_lib
  from grpo_jax.rollout import turns
  from grpo_jax.run import train
  from grpo_jax.tasks import data as data_lib
  c = r1_tools_config()
  c.r1.zero.rewards = (("brevity", 1.0), ("env", 2.0))
  stage_config.validate(c, ("r1_zero",))
  sc = stage_config.for_stage(c, "r1_zero")
  assert sc.rewards[:2] == (("brevity", 1.0), ("env", 2.0))
  spec = train.reward_terms(sc, TOK, r1_rewards.config_fns(sc))
  try:
    assert spec.env is not None and spec.env.rewards_read  # the stage's environment is said to be read
    _, chosen, langs = rejection.prompt_set(c, TOK)
    b = data_lib.rl_batch(data_lib.make_task(c.task), chosen, langs, TOK, c.task.prompt_len)
    fields = {k: jnp.asarray(v) for k, v in b.items() if not k.startswith("prompt")}
    n = len(chosen)
    tokens = np.full((n, L), 7, np.int32)  # no EOS: a row's brevity is 1 - length / L
    mask = np.zeros((n, L), np.int32)
    mask[0, :8], mask[1, :20] = 1, 1
    reward, step = np.zeros((n, L), np.float32), np.zeros((n, L), np.int32)
    reward[0, [2, 5]], step[0, [2, 5]] = (0.5, -0.25), 1  # row 0: two answered calls
    reward[1, 9] = 3.0  # row 1: no step there (step_NxL 0): not an environment step, not counted
    env = turns.Result(obs_NxL=jnp.zeros((n, L), jnp.int32), reward_NxL=jnp.asarray(reward),
                       step_NxL=jnp.asarray(step), events_NxE=None, status=None, counts_K=None, calls=None)
    fields.update(rewards_lib.env_fields(env, c.tools.max_turns))
    # one program, as the rollout runs the terms (its Python terms through their host callbacks); op by op the
    # in-graph terms were ~100 eager ops, each its own tiny compile
    r_N, per_term, status, _, steps = jax.jit(lambda t, m, f: rewards_lib.compute(spec, t, m, f))(
        jnp.asarray(tokens), jnp.asarray(mask), fields)
  finally:
    spec.close()
  assert (np.asarray(status) == 0).all()
  np.testing.assert_allclose(np.asarray(per_term["env"]), [0.25, 0.0])
  np.testing.assert_allclose(np.asarray(r_N), [1 - 8 / L + 2 * 0.25, 1 - 20 / L + 0.0], rtol=1e-6)
  assert steps is not None and np.asarray(steps[0])[0, :2].tolist() == [1.0, -0.5]  # 2 · each step's reward


def test_every_rl_stage_logs_the_env_term_with_an_environment():
  """With tools.env every RL stage runs the environment; 'env' was logged (train/reward/env) only where a stage
  weighted it, so the stages' metrics rows had different keys. Now each stage that does not weight it logs it at 0,
  as the TRACKED terms (its environment's rewards then said to go unused); without tools.env no stage has it. A
  weight-0 'env' has all-zero steps: it does not satisfy rl.process_weight > 0."""
  from grpo_jax.r1 import rewards as r1_rewards
  from grpo_jax.run import train
  c = r1_tools_config()
  c.r1.zero.rewards = (("format", 1.0), ("env", 2.0))
  c.r1.grpo.rewards = (("accuracy", 1.0),)
  c.r1.final.rewards = (("accuracy", 1.0), ("brevity", 0.5))
  stage_config.validate(c, ("r1_zero", "r1_2_grpo", "r1_5_final"))
  mixes = {s: stage_config.for_stage(c, s).rewards for s in stage_config.RL_STAGES}
  assert mixes["r1_zero"][:2] == (("format", 1.0), ("env", 2.0))
  assert ("env", 0.0) in mixes["r1_2_grpo"] and ("env", 0.0) in mixes["r1_5_final"]
  for mix in mixes.values():  # the same terms logged (train/reward/<name>) in every stage
    assert sorted(n for n, _ in mix) == sorted(r1_rewards.TRACKED + ("env",)), mix
  sc = stage_config.for_stage(c, "r1_2_grpo")
  spec = train.reward_terms(sc, TOK, r1_rewards.config_fns(sc))
  try:
    assert spec.names[-1] == "env" and spec.weights[-1] == 0.0
    assert spec.env is not None and not spec.env.rewards_read  # at weight 0: its rewards go unused, said once
  finally:
    spec.close()
  sc.rl.process_weight = 0.5
  with pytest.raises(errors.ConfigError, match=r"^config.rl.process_weight: is > 0 but config.rewards weights no term "
                     r"with steps"):
    validate.validate_rl(sc, 1, TOK)
  c.tools.env = ""
  c.r1.zero.rewards = (("format", 1.0),)
  assert all("env" not in dict(stage_config.for_stage(c, s).rewards) for s in stage_config.RL_STAGES)


def test_rejection_sampling_ranks_by_the_environments_reward(tmp_path, monkeypatch):
  """Stage 3 ranks by stage 2's mix with ('env', w) from the generate's per-row 'env' term: rows 0 and 2 of each
  prompt are equally right and well-formed, row 0 calls the calculator at both steps (reward 2 · CALL_COST), row 2
  at the first (CALL_COST); keeping one per prompt keeps row 2 (the earlier row 0 wins the tie without the term),
  and its record's reward is the hand-computed mix 1 + 4 · CALL_COST."""
  c = r1_tools_config()
  c.tools.env = COSTLY
  c.r1.grpo.rewards = (("accuracy", 1.0), ("env", 4.0))
  c.r1.rejection.keep_per_prompt = 1
  stage_config.validate(c, ("r1_3_rejection",))
  force, want = forced_rows(c)
  _patch_force(monkeypatch, force)
  path = tmp_path / "params"
  _params(c, path)
  stats = rejection.rejection_sample(c, str(path), str(tmp_path / "data.jsonl"))
  recs = [r for r in _records(tmp_path / "data.jsonl") if r["kind"] == "reasoning"]
  assert stats["kept_reasoning"] == len(recs) == 2
  for q, r in enumerate(recs):
    ids, obs = want[(q, 2)]
    assert r["completion_ids"] == ids and r["obs_mask"] == obs + [0]
    assert sum(1 for s in _segments(rejection.prompt_set(c, TOK)[1][q], "a", (0,)) if s[1]) == 1
    assert r["reward"] == pytest.approx(1.0 + 4.0 * CALL_COST)
  assert want[(0, 0)][0] != want[(0, 2)][0]  # the row left out differs: not one completion kept twice


def test_the_env_term_without_an_environment_is_one_line():
  """An R1 stage's ('env', w) without tools.env is refused before any stage (exit 2), naming the key and the fix:
  every RL group, whichever stages run (r1.grpo.rewards also ranks stage 3's samples)."""
  for group in ("zero", "grpo", "final"):
    c = r1_tools_config()
    c.tools.env = ""
    c.r1[group].rewards = tuple(c.r1[group].rewards) + (("env", 1.0),)
    with pytest.raises(validate.ConfigError) as e:
      stage_config.validate(c, ("base",))
    assert str(e.value) == (f"config.r1.{group}.rewards: names the 'env' term (the environment's rewards) but "
                            "tools.env is ''; set tools.env or drop ('env', w).")
    assert e.value.exit_code == errors.EXIT_INPUT == 2


def test_held_out_evaluation_reads_the_environments_outputs_past_the_env_reward():
  """The generate's outputs with an environment end with each row's 'env' term now: the held-out evaluation (the R1
  report's) still reads its observation mask, events and status from the ones before it (they were its last three)."""
  from grpo_jax.envs import batch as env_batch
  from grpo_jax.r1 import heldout
  c = r1_tools_config()
  ev = heldout.make_evaluator(c)
  try:
    params = model_lib.init_params(model_lib.ModelConfig.from_config(c.model), jax.random.PRNGKey(0))
    g = ev.rollouts(params, jax.random.PRNGKey(1))
  finally:
    ev.env.close()
  n = g.tokens_NxL.shape[0]
  assert g.obs_NxL.shape == g.tokens_NxL.shape and set(np.unique(g.obs_NxL)) <= {0, 1}
  assert g.events_NxE.shape == (n, len(env_batch.EVENTS)) and g.events_NxE.dtype == np.int32
  assert isinstance(g.env_status, int) and g.env_status == 0
  np.testing.assert_array_equal(g.lengths_N, g.mask_NxL.sum(1) - g.obs_NxL.sum(1))  # the model's own tokens
