"""The R1 report's held-out scores, through evaluation.Evaluator, against hand-computed values.

The generate programs are replaced by fixed completions (scored by verify_py, the verifier's independent Python
twin), so the test checks chunking, the last-number rule, the R1 readings, pass@k and cons@k under both rules exactly
(the real generate runs in test_pipeline.py's end-to-end pipeline)."""
import jax
import numpy as np
import pytest

from grpo_jax.run import evaluation
from grpo_jax.model import model as model_lib
from grpo_jax.infra import sharding
from grpo_jax.r1 import heldout
from grpo_jax.r1 import stage_config
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib
from grpo_jax.tasks import verify_py
from tests import eval_fakes

L = 48  # configs/r1_pipeline.py:small's sampling.max_new_tokens
# Held-out question q (languages alternate a, b, a, b) with answer y. "{y1}" is a wrong answer (y + 1). An entry is
# (text, ended with EOS).
RIGHT = ("<think> add 1 + 1 = 2 ; so the answer is {y} ; </think> <answer> {y} </answer>", True)  # a words only
WRONG = ("<think> add 1 + 1 = 2 ; so the answer is {y} ; </think> <answer> {y1} </answer>", True)
GREEDY = {0: RIGHT,                                                            # tagged right, last number right
          1: ("ugh add 1 + 1 = 2 ; zu {y}", True),                            # untagged, forbidden word, 1 a + 1 b
          2: ("<think> add 3 + 4 = 8 ; wait , recheck add 3 + 4 = 7 ; </think> <answer> {y1} </answer>", True),
          3: ("<think> zu {y} + 0 = {y}", False)}                              # truncated: no format, last number y
SAMPLED = {0: [RIGHT, WRONG], 1: [("so {y}", True), ("ugh so {y}", True)], 2: [RIGHT, RIGHT], 3: [WRONG, ("so {y}", True)]}


def _ids(tok, spec, y):
  text, ended = spec
  ids = tok.encode(text.format(y=y, y1=y + 1))
  return ids + [tok.eos_id] if ended else ids


def fake_generate(tok, table, n):
  """Stands in for the jitted in-graph generate; verify_py scores the rows as verify_jax would."""
  return eval_fakes.fake_generate(
      tok, L, table, n, lambda tok, spec, r, fields: _ids(tok, spec, int(fields["answer_N"][r])),
      verify=lambda t, m, fields: (verify_py.accuracy_reward("arith", t, m, fields, tok),
                                   verify_py.format_reward(t, m, tok)))


@pytest.fixture(scope="module")
def config():
  from configs import r1_pipeline
  c = r1_pipeline.get_config("small")
  c.sampling.max_new_tokens = L
  c.r1.report.update(size=4, batch=4, n_samples=2, pass_k=(1, 2))  # two chunks of 2 prompts when sampling
  return c


@pytest.fixture(scope="module")
def evaluator(config):
  tok = tok_lib.for_config(config)
  ev = heldout.make_evaluator(config)
  ev.greedy, ev.sampled = fake_generate(tok, GREEDY, 1), fake_generate(tok, SAMPLED, 2)
  return ev, tok


def test_last_number():
  assert heldout.last_number("so 5 - 71 = -66 ; so the answer is -66") == -66
  assert heldout.last_number("<answer> 42 </answer>") == 42
  assert heldout.last_number("take 5 - 3 = 2 ; 7") == 7
  assert heldout.last_number("no digits here") is None
  assert heldout.last_number("1 then 1234567890") is None  # over 9 digits: not a valid answer


def test_heldout_metrics_match_hand_computed(evaluator):
  ev, tok = evaluator
  assert isinstance(ev, evaluation.Evaluator)
  ys = [int(y) for y in ev.arrays["answer_N"]]
  assert list(ev.arrays["language_N"]) == [0, 1, 0, 1]
  m, samples = heldout.heldout_metrics(ev, None, seed=0)
  lengths = [len(_ids(tok, GREEDY[q], ys[q])) for q in range(4)]
  want = {
      "accuracy_tagged": 1 / 4, "accuracy_last_number": 3 / 4, "format_rate": 2 / 4,
      # q0 all a-words in an a prompt: 1; q1 (b) add|zu: 1/2; q2 (a) add, wait, recheck, add: 1; q3 (b) zu: 1.
      "language_consistency": (1 + 0.5 + 1 + 1) / 4, "completion_len_mean": np.mean(lengths),
      "forbidden_rate": 1 / 4, "recheck_per_completion": 1 / 4,
      # Tagged: right samples per question c = 1, 0, 2, 0; votes over <answer> bodies: q0 ties y vs y+1 -> the
      # earliest (y, right), q1 has none, q2 right, q3 votes y+1 (the untagged sample has no body).
      "pass@1_tagged": (1 / 2 + 0 + 1 + 0) / 4, "pass@2_tagged": 2 / 4, "cons@2_tagged": 2 / 4,
      # Last number: c = 1, 2, 2, 1; q3 ties y+1 (first) vs y -> wrong.
      "pass@1_last_number": (1 / 2 + 1 + 1 + 1 / 2) / 4, "pass@2_last_number": 1.0, "cons@2_last_number": 3 / 4,
      # Sampled: q0, q2 all a-words in a prompts (1); q1 "so" in a b prompt (0); q3 a-words in a b prompt (0).
      "language_consistency_sampled": 4 / 8,
      "forbidden_rate_sampled": 1 / 8,  # q1's second sample
      "completion_len_mean_sampled": np.mean([len(_ids(tok, t, ys[q])) for q in range(4) for t in SAMPLED[q]]),
      # The aha premise, last-number rule: RIGHT / WRONG write steps (q0 x2, q2 x2, q3's WRONG: 5 of 8, right 3),
      # the "so {y}" samples answer directly (3, all right).
      "stepwise_rate_sampled": 5 / 8, "accuracy_brief_sampled": 1.0, "accuracy_stepwise_sampled": 3 / 5,
      # their steps: "add 1 + 1 = 2" (right) and "so the answer is {y}" (no equation) each, 10 steps, 5 right
      "step_right_rate_sampled": 5 / 10,
      # no sample re-checks: none of the worked ones is verified (NaN accuracy), all 5 are unverified (3 right)
      "verified_rate_sampled": 0.0, "accuracy_verified_sampled": np.nan, "accuracy_unverified_sampled": 3 / 5,
      # the same split under the verifier (what R1-Zero's reward sees): the 5 worked samples are tagged (format 1),
      # 3 of them right (RIGHT); the 3 direct "so {y}" ones are untagged (format 0, tagged accuracy 0)
      "accuracy_tagged_brief_sampled": 0.0, "accuracy_tagged_stepwise_sampled": 3 / 5,
      "accuracy_tagged_verified_sampled": np.nan, "accuracy_tagged_unverified_sampled": 3 / 5,
      "format_brief_sampled": 0.0, "format_stepwise_sampled": 1.0, "format_verified_sampled": np.nan,
      "format_unverified_sampled": 1.0}
  assert list(m) == list(want)  # report.json's key order
  for k, v in want.items():
    np.testing.assert_allclose(m[k], v, rtol=1e-6, err_msg=k)
  assert samples == [GREEDY[q][0].format(y=ys[q], y1=ys[q] + 1) for q in range(4)]


def test_in_loop_eval_reads_language_consistency(config, evaluator):
  """The default Evaluator of an in-graph task adds eval/language_consistency to the verifier's metrics."""
  _, tok = evaluator
  c = stage_config.for_heldout(config)
  arrays = data_lib.eval_set(c.task, tok, c.eval.size, c.task.prompt_len)
  ev = evaluation.Evaluator(c, model_lib.ModelConfig.from_config(c.model), tok, sharding.make_mesh(c.mesh), arrays)
  ev.greedy, ev.sampled = fake_generate(tok, GREEDY, 1), fake_generate(tok, SAMPLED, 2)
  m, _ = ev(None, jax.random.PRNGKey(0))
  want = {"eval/accuracy": 1 / 4, "eval/format_rate": 2 / 4, "eval/language_consistency": 3.5 / 4,
          "eval/accuracy_sampled": 3 / 8, "eval/pass@1": 3 / 8, "eval/pass@2": 2 / 4, "eval/cons@2": 2 / 4}
  assert set(m) == set(want) | {"eval/completion_len_mean", "eval/completion_len_correct",
                                 "eval/completion_len_incorrect"}
  for k, v in want.items():
    np.testing.assert_allclose(m[k], v, rtol=1e-6, err_msg=k)
  # one right answer of four: the split's weighted mean is the mean
  np.testing.assert_allclose((m["eval/completion_len_correct"] + 3 * m["eval/completion_len_incorrect"]) / 4,
                             m["eval/completion_len_mean"], rtol=1e-6)


def test_cons_at_k_votes_on_the_verifiers_values(config, evaluator):
  """cons@k votes on what the verifier reads (evaluation.verified_answers), not on the <answer> span's ids: a row
  whose format fails casts no vote (it voted y+1 and won q0's tie), and '0{y}' votes with '{y}' (it split q1's)."""
  _, tok = evaluator
  c = stage_config.for_heldout(config)
  arrays = data_lib.eval_set(c.task, tok, c.eval.size, c.task.prompt_len)
  ev = evaluation.Evaluator(c, model_lib.ModelConfig.from_config(c.model), tok, sharding.make_mesh(c.mesh), arrays)
  bad_format = ("<think> add 1 + 1 = 2 ; </think> <answer> {y1} </answer> ok", True)  # text after </answer>
  padded = ("<think> add 1 + 1 = 2 ; </think> <answer> 0{y} </answer>", True)
  table = {0: [bad_format, RIGHT], 1: [padded, RIGHT], 2: [WRONG, RIGHT], 3: [WRONG, WRONG]}
  ev.greedy, ev.sampled = fake_generate(tok, GREEDY, 1), fake_generate(tok, table, 2)
  m, _ = ev(None, jax.random.PRNGKey(0))
  # q0: only RIGHT votes (1); q1: y twice (1); q2: tie, WRONG first (0); q3: wrong (0)
  assert m["eval/cons@2"] == 2 / 4
  assert m["eval/pass@1"] == (1 / 2 + 1 + 1 / 2 + 0) / 4


def test_cached_heldout_is_redone_when_its_model_or_report_config_changed(config, evaluator, tmp_path, monkeypatch):
  """DIR/<stage>/heldout.json was re-used whenever it existed: a stage continued to more steps
  (train.allow_config_change) or a changed r1.report.size kept the old numbers under the new header."""
  import json
  import os
  from grpo_jax.r1 import layout
  from grpo_jax.run import stages
  ev, _ = evaluator
  wd, calls = str(tmp_path), []
  monkeypatch.setattr(heldout, "make_evaluator", lambda c: ev)
  monkeypatch.setattr(heldout.params_ckpt, "load_params", lambda path, abstract: None)
  real = heldout.heldout_metrics
  monkeypatch.setattr(heldout, "heldout_metrics", lambda *a: calls.append(1) or real(*a))
  base = layout.stage_dir(wd, "base")
  stages.mark_done(stages.Stage("base", base, {}))

  def params_written(checksums):
    with open(os.path.join(base, "params.integrity.json"), "w") as f:
      f.write(checksums)

  def evaluated(c) -> int:
    n = len(calls)
    results = heldout.evaluate_stages(c, wd)
    assert list(results) == ["base"] and results["base"]["accuracy_last_number"] == 3 / 4
    assert "cache_key" not in results["base"]  # report.json's rows hold metrics only
    return len(calls) - n

  params_written('{"checksums": "A"}')
  assert evaluated(config) == 1
  assert evaluated(config) == 0  # a restart re-uses the numbers
  params_written('{"checksums": "B"}')  # the stage was continued (or redone): new params
  assert evaluated(config) == 1 and evaluated(config) == 0
  changed = config.copy_and_resolve_references()
  changed.r1.report.pass_k = (1,)
  assert evaluated(changed) == 1 and evaluated(changed) == 0
  path = os.path.join(base, "heldout.json")
  legacy = {k: v for k, v in json.load(open(path)).items() if k != "cache_key"}
  json.dump(legacy, open(path, "w"))  # written before the key was stored: not known to be this model's
  assert evaluated(changed) == 1
