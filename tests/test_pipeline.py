"""R1 pipeline: pre-training documents, SFT packing, rejection sampling (only verified samples), and a tiny end-to-end
pipeline that is killed between stages and resumes at the next stage without redoing finished ones."""
import json
import os

import ml_collections
import numpy as np
import pytest


from grpo_jax.infra import errors
from grpo_jax.run import evaluation
from grpo_jax.r1 import corpus
from grpo_jax.r1 import layout
from grpo_jax.r1 import pipeline
from grpo_jax.r1 import rejection
from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.tasks import base, cot, registry, verify_py
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib
from tests import metrics_contract

EX = {"a": 23, "op": "+", "b": 45, "answer": 68, "index": 0}


@pytest.fixture(scope="module")
def tok():
  return tok_lib.load()


def _doc_knobs(**kw):
  p = dict(template_frac=0.0, tag_frac=0.0, mix_frac=0.0, mistake_frac=0.0, noise_frac=0.0, cot_frac=1.0,
           verify_frac=0.0, forbidden=("ugh",))
  p.update(kw)
  return ml_collections.ConfigDict(p)


def test_pretrain_document_kinds(tok):
  task = registry.get_task("arith", max_digits=2, ops="+-")
  rng = np.random.default_rng(0)
  head, tail = corpus.pretrain_document(task, EX, "a", rng, _doc_knobs())
  assert head == "" and tail == "what is 23 + 45 ? " + cot.solution(EX, "a", tagged=False)
  head, tail = corpus.pretrain_document(task, EX, "b", rng, _doc_knobs(template_frac=1.0, tag_frac=1.0))
  assert head == base.prompt(task, EX, "b") and tail == cot.solution(EX, "b")
  assert verify_py.format_ok(tail, tok=tok)  # a web-like tagged transcript is a well-formed R1 completion
  head, tail = corpus.pretrain_document(task, EX, "a", rng, _doc_knobs(template_frac=1.0, tag_frac=0.0))
  assert head and "<think>" not in tail
  _, tail = corpus.pretrain_document(task, EX, "a", rng, _doc_knobs(noise_frac=1.0))
  assert " ugh " in tail and "ugh" not in cot.solution(EX, "a", tagged=False)


def test_mixed_solution_switches_language():
  # 23 + 45: steps add 3+5, add 2+4, so 23+45 -> parts: 3 steps + ending. Switch at 2: 2 a-steps, then b.
  text = corpus.mixed_solution(EX, "a", False, True, 2)
  assert text == "<think> add 3 + 5 = 8 ; add 2 + 4 = 6 ; zu 23 + 45 = 68 ; </think> <answer> 68 </answer>"
  assert cot.language_consistency(text, "a") == pytest.approx(2 / 3)
  assert corpus.mixed_solution(EX, "b", False, True, 4) == cot.solution(EX, "b")


def test_pretraining_mixture_fractions(tok):
  c = _tiny_config()
  c.r1.pretrain.update(batch=400, template_frac=0.5, tag_frac=0.5, mix_frac=0.0, noise_frac=0.0)
  examples = data_lib.load_examples(c.task, "train")
  b = next(corpus.pretrain_batches(c, tok, examples)(0))
  think = tok.tag_ids["<think>"]
  tagged = np.mean([(row[:m.sum()] == think).sum() >= 2 for row, m in zip(b["tokens_NxT"], b["mask_NxT"])])
  # The template holds one <think>; a tagged solution adds a second. Expected 0.5 * 0.5 = 0.25 of 400 documents.
  assert 0.18 < tagged < 0.32
  assert (b["loss_mask_NxT"][:, 0] == 0).all() and (b["loss_mask_NxT"] == b["mask_NxT"])[:, 1:].all()


def test_pack_loss_masks(tok):
  b = corpus.pack([([7, 8], [9], False), ([7], [9, 10], True)], tok, 7)
  np.testing.assert_array_equal(b["tokens_NxT"], [[1, 7, 8, 9, 2, 0, 0], [1, 7, 9, 10, 2, 0, 0]])
  np.testing.assert_array_equal(b["loss_mask_NxT"], [[0, 0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(b["positions_NxT"], [[0, 1, 2, 3, 4, 4, 4], [0, 1, 2, 3, 4, 4, 4]])
  # one line naming the key that set the length (was a ValueError traceback mid-stage)
  with pytest.raises(errors.InputError, match=r"^config.model.max_len: 7 is too short for a 9-token SFT sequence"):
    corpus.pack([([7] * 6, [9], False)], tok, 7)
  with pytest.raises(errors.InputError, match=r"^config.r1.pretrain.seq_len: 7 is too short"):
    corpus.pack([([7] * 6, [9], False)], tok, 7, "r1.pretrain.seq_len")


def test_select_samples_hand_case():
  reward = np.asarray([2.0, 2.5, 2.5, 0.5, 3.0, 1.0])
  correct = np.asarray([1, 1, 1, 0, 1, 1])
  fmt = np.asarray([1, 1, 1, 1, 0, 1])
  comps = [(1,), (2,), (2,), (3,), (4,), (5,)]
  # 4 is unformatted, 3 wrong; 1 and 2 tie at 2.5 but are duplicates -> keep 1, then 0 (2.0), then 5 (1.0).
  assert rejection.select_samples(reward, correct, fmt, comps, keep=1) == [1]
  assert rejection.select_samples(reward, correct, fmt, comps, keep=3) == [1, 0, 5]
  assert rejection.select_samples(reward, correct * 0, fmt, comps, keep=3) == []


def test_stage_rewards_tracks_every_term():
  r = r1_rewards.stage_rewards((("accuracy", 1.0), ("language", 0.5)))
  assert r[:2] == (("accuracy", 1.0), ("language", 0.5))
  assert {n for n, w in r[2:]} == set(r1_rewards.TRACKED) - {"accuracy", "language"}
  assert all(w == 0.0 for _, w in r[2:])


@pytest.mark.parametrize("key,value,match", [
    ("r1.stages", ("r1_zero", "base"), "config.r1.stages"),
    ("r1.report.pass_k", (1, 4), r"config.r1.report.pass_k: entry 4 must be .* \[1, r1.report.n_samples=2\]"),
    ("r1.report.size", 200, "config.r1.report.size: 200 exceeds task.test_size=64"),
    ("r1.forbidden", ("Ugh",), "config.r1.forbidden"),
    ("r1.grpo.rewards", (("accuracy", 1.0), ("kindness", 1.0)), "config.r1.grpo.rewards: unknown term 'kindness'"),
    ("r1.rejection.temperature", 0.0, "config.r1.rejection.temperature"),
    ("r1.pretrain.lr", -1.0, r"config.sft.lr: .* \(stage base takes sft.* from r1.pretrain\)\.$"),
    ("r1.final.steps", 0, "config.r1.final.steps: must be a positive integer"),
    # an SFT stage no device holds (memory_plan.check_sft_fits; it ran out of memory in the stage's first step)
    ("r1.pretrain.batch", 2 ** 24, r"config.sft.batch: the SFT step of 16777216 rows .* more than the device's .* "
     r"\(stage base takes sft.* from r1.pretrain\)\.$"),
    # keys every stage's derived config overwrites: set, they were silently ignored (a base from a random init)
    ("train.init_from", "hf:/some/model", r"config.train.init_from: is 'hf:/some/model', but job r1_pipeline does "
     r"not read it \(the base is pre-trained here or copied with r1.base_from.*\); drop it.$"),
    ("train.steps", 50, r"config.train.steps: is 50, .* \(each RL stage runs r1.zero / grpo / final.steps\)"),
    ("sft.lr", 0.1, r"config.sft.lr: is 0.1, .* \(each SFT stage takes r1.pretrain / cold_start / sft2.lr\)"),
    # the pre-training, cold-start and rejection text is in the R1-Zero template; RL stages asked in chat
    ("task.prompt_format", "chat", "config.task.prompt_format: 'chat': the R1 pipeline's pre-training"),
    ("r1.cold_start.examples", 300, "config.r1.cold_start.examples: 300 exceeds the 256 train examples"),
    # a cold-start sequence longer than model.max_len: a traceback at stage 1, after the base and R1-Zero trained
    ("model.max_len", 72, r"config.model.max_len: 72 tokens are too few for the cold-start set \(stage "
     r"r1_1_cold_start\): its longest sequence is 80 \(bos .*\); set model.max_len=80 or more")])
def test_bad_r1_config_fails_before_any_stage(tmp_path, key, value, match):
  """Every stage's config is checked up front: a bad value that only a late stage (or the report) reads fails before
  the first stage runs, with the key the user set."""
  from grpo_jax.run import validate
  c = _tiny_config()
  group, name = key.rsplit(".", 1)
  node = c
  for part in group.split("."):
    node = node[part]
  node[name] = value
  with pytest.raises(validate.ConfigError, match=match):
    pipeline.run_pipeline(c, str(tmp_path))
  assert os.listdir(tmp_path) == []


def test_the_stages_run_are_the_ones_validated():
  """run_pipeline(stages=...) (the r1_table study's base + cold start) is validated for the stages it runs: the
  tools.env check of rejection sampling read config.r1.stages instead, refusing runs without rejection sampling."""
  from grpo_jax.r1 import stage_config
  from grpo_jax.run import validate
  c = _tiny_config()
  c.tools.env, c.sampling.engine = "calculator", "static"  # c.r1.stages: all of them
  stage_config.validate(c, ("base", "r1_1_cold_start"))
  with pytest.raises(validate.ConfigError, match="config.sampling.engine: 'static': rejection sampling"):
    stage_config.validate(c, ("base", "r1_3_rejection"))


# ------------------------------------------------------------------------------- oracle sampler for rejection
def _oracle_make_generate(tok, kinds=(0, 1, 2, 3)):
  """A stand-in sampler: per prompt, a mix of right/wrong/untagged/duplicate completions (row i: kinds[i % 4]),
  scored by verify_py."""

  def make_generate(mcfg, scfg, mesh, task, tag_ids, **_):
    def gen(params, prompt_NxP, pmask_NxP, fields, rng):
      n, L = prompt_NxP.shape[0], scfg.max_new_tokens
      tokens = np.zeros((n, L), np.int32)
      mask = np.zeros((n, L), np.int32)
      for i in range(n):
        ans = int(fields["answer_N"][i])
        lang = base.LANGUAGES[int(fields["language_N"][i])]
        kind = kinds[i % 4]
        body = {"a": "so", "b": "zu"}[lang]
        text = [f"<think> {body} 1 + 1 = 2 ; </think> <answer> {ans} </answer>",       # right, well-formed
                f"<think> {body} 1 + 1 = 2 ; </think> <answer> {ans + 1} </answer>",   # wrong
                f"{body} the answer is {ans}",                                         # untagged
                f"<think> {body} 1 + 1 = 2 ; </think> <answer> {ans} </answer>"][kind]  # duplicate of kind 0
        ids = tok.encode(text) + [tok.eos_id]
        tokens[i, :len(ids)], mask[i, :len(ids)] = ids, 1
      acc = verify_py.accuracy_reward("arith", tokens, mask, fields, tok)
      fmt = verify_py.format_reward(tokens, mask, tok)
      return tokens, mask, mask.sum(1), acc, fmt
    return gen
  return make_generate


def _tiny_config():
  """Every stage at a tiny size. Compiles dominate the tiny pipeline, so stages that can share a program do: the
  three SFT stages use one optimizer schedule and eval.batch == report.batch, and the fixtures' compilation cache
  compiles each of those once. Each RL stage still compiles its step (host callbacks keep it out of the cache)."""
  from configs import r1_pipeline
  c = r1_pipeline.get_config("small")
  c.model.update(hidden=16, layers=1, heads=2, kv_heads=1, inter=32, max_len=96)
  c.task.train_size = 256  # loading 20000 examples costs ~3 s per stage
  c.sampling.max_new_tokens = 24  # the oracle's longest completion is 20 tokens + EOS
  c.train.update(ckpt_every=2, log_every=1)
  c.rl.update(G=2, prompts_per_step=2)
  c.eval.update(size=4, batch=4, n_samples=2, pass_k=(1, 2))
  sft = dict(steps=2, batch=4, lr=1e-3, warmup_steps=1)
  c.r1.pretrain.update(sft)
  c.r1.zero.steps = 2
  c.r1.cold_start.update(sft, examples=8)
  c.r1.grpo.steps = 2
  c.r1.rejection.update(prompts=6, n=4, keep_per_prompt=1, general_frac=0.25)
  c.r1.sft2.update(sft)
  c.r1.final.steps = 2
  c.r1.report.update(size=4, batch=4, n_samples=2, pass_k=(1, 2))
  # no per-stage plots or TensorBoard events (no test reads them; matplotlib drew ~10 PNGs per pipeline run): the
  # report's own plots (DIR/plots/r1_*.png, which test_report_compares_every_model reads) are drawn regardless
  c.log.update(plots=False, tensorboard=False)
  return c


def _check_rejection_records(path, tok, config, n_prompts):
  records = [json.loads(l) for l in open(path)]
  reasoning = [r for r in records if r["kind"] == "reasoning"]
  general = [r for r in records if r["kind"] == "general"]
  examples = data_lib.load_examples(config.task, "train")
  answer = {ex["index"]: ex["answer"] for ex in examples}
  # Oracle: sample 0 of each prompt is right and well-formed, its duplicate (sample 3) must not be kept twice.
  assert len(reasoning) == n_prompts
  for r in reasoning:
    ids = r["completion_ids"] + [tok.eos_id]
    assert verify_py.format_ok(ids, tok=tok)
    spans = verify_py.parse(ids, tok=tok)
    assert verify_py.accuracy_arith(verify_py.span_text(ids, spans[1], tok), answer[r["index"]]) == 1.0
    assert tok.decode(r["prompt_ids"]).endswith(" :")
  assert len(general) == round(n_prompts * 0.25 / 0.75)
  assert all(r["prompt_ids"] == [] and "<think>" not in r["text"] for r in general)


def test_damaged_rejection_data_is_one_line_naming_the_redo(tmp_path):
  """data.jsonl torn or edited: was a JSONDecodeError traceback (exit 1) when stage 4 read it."""
  path = str(tmp_path / "data.jsonl")
  corpus.write_records(path, [{"prompt_ids": [1], "completion_ids": [2, 3], "kind": "reasoning"}] * 3)
  assert len(corpus.read_records(path)) == 3
  os.truncate(path, os.path.getsize(path) - 10)
  with pytest.raises(errors.InputError) as e:
    corpus.read_records(path)
  msg = str(e.value)
  assert "line 3 is damaged" in msg and "rerun_stages=r1_3_rejection" in msg and "\n" not in msg, msg
  for text in ("", "\n\n"):  # truncated to nothing: stage 4's epochs over no records were an IndexError traceback
    open(path, "w").write(text)
    with pytest.raises(errors.InputError, match="data.jsonl holds no records; write it again with --config.train."
                                                "rerun_stages=r1_3_rejection"):
      corpus.read_records(path)


@pytest.mark.parametrize("edit,needle", [
    ({"completion_ids": [2, 10**6]}, "completion_ids holds 1000000, not a token id of the 64-token vocabulary"),
    ({"prompt_ids": [-4]}, "prompt_ids holds -4, not a token id"),
    ({"prompt_ids": [1.5]}, "prompt_ids is not a list of token ids"),
    ({"prompt_ids": ["x"]}, "prompt_ids is not a list of token ids"),
    ({"completion_ids": 7}, "completion_ids is not a list of token ids"),
    ({"completion_ids": [True]}, "completion_ids is not a list of token ids"),
    ({"kind": "resoning"}, "kind 'resoning' is not one of ['reasoning', 'general']")])
def test_an_edited_record_with_ids_no_model_embeds_is_one_line(tmp_path, edit, needle):
  """An edited data.jsonl record with an id past the vocabulary trained silently on a clamped embedding row (a
  negative one on a wrapped row, a float on its truncation, an unknown kind as reasoning); a string or a number
  for the list was a ValueError / TypeError traceback in stage 4's first batch. Now the damaged-line error."""
  path = str(tmp_path / "data.jsonl")
  good = {"prompt_ids": [1], "completion_ids": [2, 3], "kind": "reasoning"}
  corpus.write_records(path, [good, dict(good, kind="general"), dict(good, **edit)])
  with pytest.raises(errors.InputError) as e:
    corpus.read_records(path, vocab_size=64)
  msg = str(e.value)
  assert "line 3 is damaged" in msg and needle in msg and "rerun_stages=r1_3_rejection" in msg, msg
  corpus.write_records(path, [good, dict(good, kind="general", prompt_ids=[], completion_ids=[63])])
  assert len(corpus.read_records(path, vocab_size=64)) == 2  # the ids a 64-token model embeds, an empty prompt


def test_rejection_sampling_keeps_only_verified(tmp_path, tok, monkeypatch):
  c = _tiny_config()
  from grpo_jax.infra import checkpoint as ckpt_lib
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  import jax
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params_ckpt.save_params(str(tmp_path / "params"), model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  monkeypatch.setattr(evaluation, "make_generate", _oracle_make_generate(tok))
  stats = rejection.rejection_sample(c, str(tmp_path / "params"), str(tmp_path / "data.jsonl"))
  assert stats["kept_reasoning"] == 6 and stats["samples"] == 24 and stats["correct_frac"] == 0.5
  _check_rejection_records(tmp_path / "data.jsonl", tok, c, 6)


def test_general_records_count_beyond_the_train_set(tok):
  """r1.rejection.general_frac asks for more general records than there are train problems (a high keep_per_prompt):
  one permutation gave only len(examples), stats.json still said the number asked for, and stage 4's mix was not
  the configured one. Now epochs follow (the first unchanged, so earlier runs' records stay as they were)."""
  c = _tiny_config()
  task, examples = data_lib.make_task(c.task), data_lib.load_examples(c.task, "train")[:5]
  five = rejection._general_records(c, task, tok, examples, 5)  # pylint: disable=protected-access
  twelve = rejection._general_records(c, task, tok, examples, 12)  # pylint: disable=protected-access
  assert len(twelve) == 12 and [r["index"] for r in twelve[:5]] == [r["index"] for r in five]
  assert sorted(r["index"] for r in twelve[:10]) == sorted(2 * [ex["index"] for ex in examples])  # two epochs


def test_rejection_records_the_prompt_the_sampler_saw(tmp_path, tok, monkeypatch):
  """task.overlong_prompts=truncate: a record's prompt was the whole prompt re-encoded, while its completion was
  sampled after the kept end (bos + the last prompt_len - 1 tokens); stage 4 trained on a pair never sampled, and
  a row that could outgrow model.max_len."""
  from grpo_jax.tasks import prompts
  c = _tiny_config()
  c.task.update(prompt_len=20, overlong_prompts="truncate")
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  import jax
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params_ckpt.save_params(str(tmp_path / "params"), model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  monkeypatch.setattr(evaluation, "make_generate", _oracle_make_generate(tok))
  rejection.rejection_sample(c, str(tmp_path / "params"), str(tmp_path / "data.jsonl"))
  task = data_lib.make_task(c.task)
  examples = {ex["index"]: ex for ex in data_lib.load_examples(c.task, "train")}
  reasoning = [json.loads(l) for l in open(tmp_path / "data.jsonl") if '"reasoning"' in l]
  assert len(reasoning) == 6
  for r in reasoning:
    whole = prompts.prompt_ids(task, examples[r["index"]], r["language"], tok)
    assert len(whole) > 20 and r["prompt_ids"] == whole[-19:]  # no bos: corpus.pack adds it


def test_rejection_that_keeps_nothing_stops_with_one_line_and_writes_nothing(tmp_path, tok, monkeypatch):
  """Every sample wrong or untagged: a RunStopped line (exit 3) naming what to change, no data.jsonl, no stats.json
  (stage 4 would have trained on an empty set)."""
  c = _tiny_config()
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  import jax
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params_ckpt.save_params(str(tmp_path / "params"), model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  monkeypatch.setattr(evaluation, "make_generate", _oracle_make_generate(tok, kinds=(1, 2, 1, 2)))
  with pytest.raises(errors.RunStopped, match=r"rejection sampling kept no sample .*r1.grpo.steps.*r1.rejection.n"):
    rejection.rejection_sample(c, str(tmp_path / "params"), str(tmp_path / "data.jsonl"))
  assert sorted(os.listdir(tmp_path)) == ["params", "params.integrity.json"]


def test_rejection_ranks_by_any_known_stage2_term(tmp_path, tok, monkeypatch):
  """r1.grpo.rewards may weight brevity_correct (a KNOWN term, not a TRACKED one): stage 3 ranked by it with a
  KeyError traceback after stages 0-2 had trained. Its score needs each row's `ended_N`, as in an RL step."""
  c = _tiny_config()
  c.r1.grpo.rewards = (("accuracy", 1.0), ("brevity_correct", 0.5))
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  import jax
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params_ckpt.save_params(str(tmp_path / "params"), model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  monkeypatch.setattr(evaluation, "make_generate", _oracle_make_generate(tok))
  rejection.rejection_sample(c, str(tmp_path / "params"), str(tmp_path / "data.jsonl"))
  reasoning = [json.loads(l) for l in open(tmp_path / "data.jsonl") if '"reasoning"' in l]
  assert len(reasoning) == 6
  for r in reasoning:  # the oracle's right, well-formed sample: accuracy 1 + 0.5 * (1 - its length / 24 tokens)
    assert r["reward"] == pytest.approx(1.0 + 0.5 * (1 - len(r["completion_ids"]) / c.sampling.max_new_tokens))


# ---------------------------------------------------------------------------------- end to end, kill + resume
class _Killed(RuntimeError):
  pass


def _run_counting(c, wd, tok, kill_at=None):
  """run_pipeline with every _run_stage call recorded; raises _Killed on entering `kill_at`."""
  real_stage = pipeline._run_stage
  calls = []

  def counting(config, workdir, stage):
    calls.append(stage)
    if stage == kill_at:
      raise _Killed(stage)
    if stage == "r1_3_rejection":  # a 2-step policy writes no correct answer: sample with the oracle instead
      with pytest.MonkeyPatch.context() as m:
        m.setattr(evaluation, "make_generate", _oracle_make_generate(tok))
        return real_stage(config, workdir, stage)
    return real_stage(config, workdir, stage)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(pipeline, "_run_stage", counting)
    if kill_at is None:
      return calls, pipeline.run_pipeline(c, wd)
    with pytest.raises(_Killed):
      pipeline.run_pipeline(c, wd)
  return calls, None


def _snapshot(wd: str) -> tuple[list[str], str]:
  return [s for s in layout.STAGES if layout.stage_done(wd, s)], open(os.path.join(wd, "stages.log")).read()


# One tiny pipeline, killed twice and resumed twice. Each run is its own fixture (about a third of the compiles
# each: every RL stage compiles its step) and records what it left before the next run adds to the directory.
@pytest.fixture(scope="module")
def killed_pipeline(tmp_path_factory, tok):
  """Run 1: base, R1-Zero and the cold start run; the run is killed on entering stage 2 (r1_2_grpo)."""
  wd = str(tmp_path_factory.mktemp("r1"))
  c = _tiny_config()
  calls, _ = _run_counting(c, wd, tok, kill_at="r1_2_grpo")
  return (wd, c, calls) + _snapshot(wd)


@pytest.fixture(scope="module")
def rekilled_pipeline(killed_pipeline, tok):
  """Run 2, the same command: resumes at stage 2, runs stages 2-4, is killed on entering stage 5 (r1_5_final)."""
  wd, c = killed_pipeline[:2]
  calls, _ = _run_counting(c, wd, tok, kill_at="r1_5_final")
  return (wd, c, calls) + _snapshot(wd)


@pytest.fixture(scope="module")
def resumed_pipeline(rekilled_pipeline, tok):
  """Run 3, the same command: resumes at stage 5, finishes, and writes the report."""
  wd, c = rekilled_pipeline[:2]
  calls, results = _run_counting(c, wd, tok)
  return wd, c, calls, results


def test_killed_pipeline_leaves_only_finished_stages_done(killed_pipeline):
  wd, _, calls, done, log = killed_pipeline
  assert calls == list(layout.STAGES[:4])  # base, r1_zero, r1_1 ran; r1_2 was entered and killed
  assert done == list(layout.STAGES[:3])  # no DONE marker for the killed stage or any later one
  assert "r1_2_grpo start" in log and "r1_2_grpo done" not in log
  assert not os.path.exists(os.path.join(wd, "r1_2_grpo", "params"))


def test_rerun_resumes_at_the_killed_stage(rekilled_pipeline):
  _, _, calls, done, log = rekilled_pipeline
  assert calls == list(layout.STAGES[3:])  # nothing finished was redone; r1_5 entered and killed
  assert done == list(layout.STAGES[:6])
  assert "r1_5_final done" not in log


def test_killed_pipeline_resumes_at_next_stage(resumed_pipeline):
  wd, _, calls, _ = resumed_pipeline
  assert calls == ["r1_5_final"]
  log = open(os.path.join(wd, "stages.log")).read().split("\n")
  for stage in layout.STAGES:
    starts = [l for l in log if l.split(" ")[1:3] == [stage, "start"]]
    dones = [l for l in log if l.split(" ")[1:3] == [stage, "done"]]
    # Every stage finished exactly once; only the killed stages were started twice (their first start had no done).
    assert len(dones) == 1, stage
    assert len(starts) == (2 if stage in ("r1_2_grpo", "r1_5_final") else 1), stage


def test_each_stage_wrote_its_outputs(resumed_pipeline, tok):
  wd, c, _, _ = resumed_pipeline
  for stage in layout.STAGES:
    assert layout.stage_done(wd, stage), stage
  for stage in ("base", "r1_1_cold_start", "r1_4_sft"):  # and every stage's rows as docs/metrics.md says
    metrics_contract.check_run(os.path.join(wd, stage))
  for stage in ("r1_zero", "r1_2_grpo", "r1_5_final"):
    rows = metrics_contract.check_run(os.path.join(wd, stage))
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    # Every tracked statistic is logged every step, weighted or not.
    for name in r1_rewards.TRACKED:
      assert all(f"train/reward/{name}" in r for r in train_rows), (stage, name)
  _check_rejection_records(os.path.join(wd, "r1_3_rejection", "data.jsonl"), tok, c, c.r1.rejection.prompts)


def test_report_compares_every_model(resumed_pipeline):
  wd, c, _, results = resumed_pipeline
  from grpo_jax.r1 import report
  assert set(results) == set(layout.MODELS)
  for m in results.values():
    for k in ("accuracy_last_number", "accuracy_tagged", "format_rate", "language_consistency", "pass@2_tagged",
              "pass@1_last_number", "cons@2_last_number"):
      assert 0.0 <= m[k] <= 1.0, k
    assert m["pass@1_tagged"] <= m["pass@2_tagged"]
  text = open(os.path.join(wd, "report.md")).read()
  assert "| accuracy_last_number |" in text and "R1-Zero" in text and "## Verdict" in text
  for png in ("r1_compare.png", "r1_zero_aha.png", "r1_2_grpo_curves.png", "r1_5_final_curves.png"):
    assert os.path.getsize(os.path.join(wd, "plots", png)) > 1000
  # A second call re-uses the cached held-out numbers (no model is re-evaluated).
  before = {s: os.path.getmtime(os.path.join(wd, s, "heldout.json")) for s in layout.MODELS}
  report.write_report(c, wd)
  assert before == {s: os.path.getmtime(os.path.join(wd, s, "heldout.json")) for s in layout.MODELS}


def test_preempted_stage_is_not_marked_done(tmp_path, monkeypatch):
  """Defence in depth (a loop stopped by a signal raises errors.Preempted): a stage that returns before its last
  step must get no record, run no later stage, and let a rerun resume it."""
  c = _tiny_config()
  ran = []

  def fake_stage(config, workdir, stage, last_step):
    ran.append(stage)
    d = os.path.join(workdir, stage, "checkpoints", str(last_step))
    os.makedirs(d)
    open(os.path.join(d, "commit_success.txt"), "w").close()
    os.makedirs(os.path.join(workdir, stage, "params"))

  monkeypatch.setattr(pipeline, "_run_stage", lambda cfg, w, s: fake_stage(cfg, w, s, 1))  # base needs 2 steps
  assert pipeline.run_pipeline(c, str(tmp_path)) == {}
  assert ran == ["base"] and not layout.stage_done(str(tmp_path), "base")
  assert layout.checkpointed_steps(str(tmp_path / "base")) == 1
  assert "base stopped" in open(tmp_path / "stages.log").read()
  assert layout.checkpointed_steps(str(tmp_path / "r1_zero")) == 0


def test_signalled_stage_is_not_done_and_a_changed_finished_stage_is_refused(tmp_path, monkeypatch):
  """A stage that raises errors.Preempted (SIGTERM/SIGINT) gets no record and stops the pipeline; a finished stage
  whose config changed is refused before anything runs, naming the key and the ways forward."""
  from grpo_jax.infra import errors
  c = _tiny_config()
  ran = []

  def fake_stage(config, workdir, stage):
    ran.append(stage)
    if stage == "r1_zero":
      raise errors.Preempted(os.path.join(workdir, stage), 1)
    d = os.path.join(workdir, stage, "checkpoints", "2")
    os.makedirs(d)
    open(os.path.join(d, "commit_success.txt"), "w").close()

  monkeypatch.setattr(pipeline, "_run_stage", fake_stage)
  with pytest.raises(errors.Preempted):
    pipeline.run_pipeline(c, str(tmp_path))
  assert ran == ["base", "r1_zero"]
  assert layout.stage_done(str(tmp_path), "base") and not layout.stage_done(str(tmp_path), "r1_zero")
  assert "r1_zero stopped" in open(tmp_path / "stages.log").read()
  recorded = json.load(open(tmp_path / "base" / "stage.json"))["config"]
  assert recorded["r1.pretrain.steps"] == 2 and recorded["sft.steps"] == 2 and "rl.G" not in recorded
  c.r1.pretrain.lr = 0.5
  ran.clear()
  with pytest.raises(errors.InputError, match=r"finished stage base .*sft.lr \(0.001 → 0.5\).*rerun_stages=base"):
    pipeline.run_pipeline(c, str(tmp_path))
  assert ran == []


def _fake_stage(ran: list, stop_after: str = ""):
  """pipeline._run_stage's stand-in: records the stage, leaves a committed checkpoint 2 as a finished stage does,
  and after `stop_after` requests a stop as a signal would."""
  from grpo_jax.infra import signals

  def fake_stage(config, workdir, stage):
    ran.append(stage)
    d = os.path.join(workdir, stage, "checkpoints", "2")
    os.makedirs(d)
    open(os.path.join(d, "commit_success.txt"), "w").close()
    if stage == stop_after:
      signals.active().request()
  return fake_stage


def test_stages_left_out_of_r1_stages_must_have_finished_with_this_config(tmp_path, monkeypatch):
  """r1.stages may be a subset (configs/r1_zero.py), but a stage it runs reads its upstream stages' outputs: one that
  never ran was a FileNotFoundError traceback (r1_4_sft, no data.jsonl) or load_params' advice to fix
  train.init_from (r1_zero, no base); one finished with another config was trained on silently, its fingerprint
  recorded as this config's. Both are refused before anything is written."""
  from grpo_jax.run import jobs, validate
  c = _tiny_config()
  ran = []
  monkeypatch.setattr(pipeline, "_run_stage", _fake_stage(ran))
  wd = str(tmp_path)
  for stages, up in ((("r1_4_sft",), "base"), (("r1_zero",), "base"), (("r1_3_rejection", "r1_4_sft"), "r1_2_grpo")):
    with pytest.raises(validate.ConfigError, match=rf"config.r1.stages: .* runs {stages[0]}, which reads the outputs "
                                                  rf"of {up}, but {wd}/{up} holds no finished {up}; add '{up}' to "
                                                  r"r1.stages \(before it\)"):
      pipeline.run_pipeline(c, wd, stages)
  c.r1.stages = ("r1_zero",)
  with pytest.raises(validate.ConfigError, match="config.r1.stages: .* holds no finished base"):
    jobs.check(c, wd)  # the CLI's and the sweep's checks, before the lock and config.json
  assert os.listdir(wd) == [] and ran == []
  pipeline.run_pipeline(c, wd, ("base",), report_md=False)
  c.r1.pretrain.lr = 0.5  # r1_zero has no record yet: nothing else compares the base it starts from
  with pytest.raises(validate.ConfigError, match=r"runs r1_zero, which reads the outputs of base, and the base in "
                                                 r".*finished with another config: .*sft.lr \(0.001 → 0.5\).*; add "
                                                 r"'base' to r1.stages"):
    pipeline.run_pipeline(c, wd, ("r1_zero",))
  assert ran == ["base"]
  c.r1.pretrain.lr = 1e-3
  pipeline.run_pipeline(c, wd, ("r1_zero",), report_md=False)  # the base finished here with this config
  assert ran == ["base", "r1_zero"]


def test_a_signal_during_a_stages_last_writes_marks_it_done_and_starts_no_next_stage(tmp_path, monkeypatch):
  """SIGTERM after a stage's loop ended (its params save, rejection sampling, which has no loop): the stage finishes
  and is marked done, and the next one does not start (Preempted 'before stage ...'); a rerun starts there."""
  from grpo_jax.infra import signals
  c = _tiny_config()
  ran = []
  monkeypatch.setattr(pipeline, "_run_stage", _fake_stage(ran, stop_after="base"))
  with signals.GracefulStop():
    with pytest.raises(errors.Preempted, match="before stage r1_zero of .*; finished stages are kept"):
      pipeline.run_pipeline(c, str(tmp_path), ("base", "r1_zero"))
  assert ran == ["base"] and layout.stage_done(str(tmp_path), "base")
  assert not os.path.exists(tmp_path / "r1_zero")
  pipeline.run_pipeline(c, str(tmp_path), ("base", "r1_zero"), report_md=False)
  assert ran == ["base", "r1_zero"]


def test_a_stage_stopped_mid_loop_resumes_to_the_same_params(killed_pipeline, tmp_path, monkeypatch):
  """SIGTERM inside the base's SFT loop (after step 1 of 2): the stage is saved, not done; the same command resumes
  it from its checkpoint (the stage's recorded view against the checkpoint's) on the batches of steps 2.., and its
  final params equal an uninterrupted run's bit for bit (the killed pipeline's base: the same config, never
  stopped)."""
  import jax
  from grpo_jax.infra import params_ckpt, sharding, signals
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import state as state_lib
  from grpo_jax.run import train
  straight, c = killed_pipeline[:2]
  real = train._steps  # pylint: disable=protected-access

  def stop_after_first(guard, mesh, batches, start, steps):
    for item in real(guard, mesh, batches, start, steps):
      if item[0] == 0:  # step 1's batch is out: the check before step 2 stops the loop
        signals.active().request()
      yield item

  stopped = str(tmp_path / "stopped")
  assert layout.stage_done(straight, "base")
  monkeypatch.setattr(train, "_steps", stop_after_first)
  with signals.GracefulStop(), pytest.raises(errors.Preempted, match="after step 1 in .*stopped/base"):
    pipeline.run_pipeline(c, stopped, ("base",), report_md=False)
  assert not layout.stage_done(stopped, "base") and layout.checkpointed_steps(os.path.join(stopped, "base")) == 1
  monkeypatch.setattr(train, "_steps", real)
  pipeline.run_pipeline(c, stopped, ("base",), report_md=False)
  assert layout.stage_done(stopped, "base")
  abstract = state_lib.abstract_params(sharding.make_mesh(c.mesh), model_lib.ModelConfig.from_config(c.model))
  a, b = (jax.tree.leaves(params_ckpt.load_params(layout.params_path(d, "base"), abstract)) for d in (straight, stopped))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  rows = [json.loads(l)["step"] for l in open(os.path.join(stopped, "base", "metrics.jsonl")) if "train/loss" in l]
  assert rows == [1, 2]  # no step logged twice or lost
