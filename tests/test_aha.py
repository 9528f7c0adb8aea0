"""Issue #29's pieces: the `sums` task and its verifiers, the worked / verified / direct solutions, the aha
pre-training mix, the length statistics (against NumPy), the verification terms, the premise reading, the config."""
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.r1 import corpus, heldout, shared_base, stage_config, step_errors
from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.rl import length_stats
from grpo_jax.tasks import base, cot, registry, verify_jax, verify_py
from grpo_jax.tasks import tokenizer as tokenizer_lib

EX = {"terms": (3, 8, 5, 9), "answer": 25, "index": 0}
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "r1_zero_aha.py")


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load()


# ------------------------------------------------------------------------------------------------ task, verifiers
def test_sums_examples_question_and_knobs():
  task = registry.get_task("sums", num_numbers=5, max_number=9)
  exs = [task.generate(base.rng_for("sums", i)) for i in range(200)]
  assert all(len(ex["terms"]) == 5 and all(1 <= t <= 9 for t in ex["terms"]) for ex in exs)
  assert all(ex["answer"] == sum(ex["terms"]) for ex in exs)
  assert {t for ex in exs for t in ex["terms"]} == set(range(1, 10))
  assert task.question(EX, "a") == "what is 3 + 8 + 5 + 9 ?" and task.question(EX, "b") == "kwo iz 3 + 8 + 5 + 9 ?"
  test = task.examples(0, "test", 50, 50)
  train = task.examples(0, "train", 200, 50)
  assert not {task.key(e) for e in test} & {task.key(e) for e in train}
  for bad in ({"num_numbers": 1}, {"num_numbers": 17}, {"max_number": 0}):
    with pytest.raises(ValueError, match="task."):
      registry.get_task("sums", **bad)


def test_sums_two_digit_operands():
  """task.min_number: every operand in [min_number, max_number]; the default 1 draws exactly what the task drew before
  the knob existed (rng.integers(1, max_number + 1)), so earlier configs' examples are unchanged."""
  task = registry.get_task("sums", num_numbers=4, max_number=99, min_number=10)
  exs = [task.generate(base.rng_for("sums2", i)) for i in range(2000)]
  terms = {t for ex in exs for t in ex["terms"]}
  assert min(terms) == 10 and max(terms) == 99 and len(terms) == 90
  assert all(ex["answer"] == sum(ex["terms"]) for ex in exs)
  old = registry.get_task("sums", num_numbers=6, max_number=9)
  for i in range(20):
    want = tuple(int(x) for x in base.rng_for("sums1", i).integers(1, 10, size=6))
    assert old.generate(base.rng_for("sums1", i))["terms"] == want
  for bad in ({"min_number": 0}, {"min_number": 100}):
    with pytest.raises(ValueError, match="task.min_number"):
      registry.get_task("sums", num_numbers=4, max_number=99, **bad)
  # the worked solution of 37 + 48 + 21 + 95, by hand: running totals 85, 106, 201
  ex = {"terms": (37, 48, 21, 95), "answer": 201}
  assert cot.solution(ex, "a") == ("<think> 21 95 : add 37 + 48 = 85 ; 95 : add 85 + 21 = 106 ; add 106 + 95 = 201 ; "
                                   "</think> <answer> 201 </answer>")
  wrong_carry = "<think> 21 95 : add 37 + 48 = 75 ; 95 : add 75 + 21 = 96 ; add 96 + 95 = 191 ; </think>"
  got = step_errors.step_errors([cot.solution(ex, "a"), wrong_carry], [ex["terms"]] * 2)
  assert got["chains_right"] == 1 and got["sum_wrong"] == pytest.approx(1 / 6)  # the dropped carry, then right


def test_sum_steps_hand_example():
  # Each step after the operands still to add: the next step's operand is the first of them (a local copy).
  assert cot.solution(EX, "a") == ("<think> 5 9 : add 3 + 8 = 11 ; 9 : add 11 + 5 = 16 ; add 16 + 9 = 25 ; </think> "
                                   "<answer> 25 </answer>")
  assert cot.solution(EX, "b", tagged=False) == ("5 9 : plim 3 + 8 = 11 ; 9 : plim 11 + 5 = 16 ; plim 16 + 9 = 25 ; "
                                                 "zu ta ansor ez 25")
  assert cot.brief(EX, "a") == "<think> </think> <answer> 25 </answer>"
  assert cot.brief(EX, "a", tagged=False) == "so the answer is 25"
  assert all(cot.score_step(s) for s in cot.split_steps(cot.think_body(cot.solution(EX, "a"))))


def test_verify_and_mistake_steps():
  v = cot.solution(EX, "a", verify=True)
  steps = cot.split_steps(cot.think_body(v))
  assert len(steps) == 4 and all(cot.score_step(s) for s in steps)  # a re-check that finds nothing to fix
  assert cot.recheck_stats(v) == (1, 0)
  i = next(k for k, s in enumerate(steps) if "recheck" in s)
  assert steps[i].replace(" wait , recheck", "") == steps[i - 1]  # the same step, written again
  m = cot.solution(EX, "a", mistake=True)
  assert cot.recheck_stats(m) == (1, 1)  # caught and corrected
  assert cot.recheck_stats(cot.solution(EX, "a", mistake=True, verify=True))[0] == 2
  assert cot.steps_written(cot.brief(EX, "a")) == 0 and cot.steps_written(cot.solution(EX, "a")) == 3


def _render_a(step):
  return f"{step.word} {step.a} {step.op} {step.b} = {step.c} "


def test_column_recheck_hand_example():
  """recheck 'columns': the phrase, the step recomputed digit by digit (cot.arith_steps' column steps), then the step
  written again with its right result; marks re-check any number of steps; final_steps / recheck_stats / step_errors
  read the re-written step in place of the one it checks."""
  ex = {"terms": (37, 48, 21, 95), "answer": 201}
  m = cot.solution(ex, "a", recheck="columns", marks=["mistake", "verify", ""])
  delta = int(base.rng_for("mistake", sorted((k, str(v)) for k, v in ex.items())).choice([-2, -1, 1, 2, 10]))
  assert m == (f"<think> 21 95 : add 37 + 48 = {85 + delta} ; wait , recheck add 7 + 8 = 15 ; add 3 + 4 = 7 ; "
               "carry 7 + 1 = 8 ; combine 80 + 5 = 85 ; 21 95 : add 37 + 48 = 85 ; 95 : add 85 + 21 = 106 ; "
               "wait , recheck add 5 + 1 = 6 ; add 8 + 2 = 10 ; combine 100 + 6 = 106 ; 95 : add 85 + 21 = 106 ; "
               "add 106 + 95 = 201 ; </think> <answer> 201 </answer>")
  assert cot.recheck_stats(m) == (2, 1)  # two re-checks, one of them fixes a wrong step
  assert [s.strip() for s in cot.final_steps(m)] == ["21 95 : add 37 + 48 = 85", "95 : add 85 + 21 = 106",
                                                     "add 106 + 95 = 201"]
  # every step written is an equation the step rule scores, the mistaken one excepted
  assert [cot.score_step(s) for s in cot.split_steps(cot.think_body(m))] == [0] + [1] * 11
  # the 3-digit running total's columns, in language b
  b = cot.solution(ex, "b", recheck="columns", marks=["", "", "verify"])
  assert ("hup , revok plim 6 + 5 = 11 ; plim 0 + 9 = 9 ; vek 9 + 1 = 10 ; plim 1 + 0 = 1 ; vek 1 + 1 = 2 ; "
          "kresh 20 + 0 = 20 ; kresh 200 + 1 = 201 ; plim 106 + 95 = 201 ;") in b
  assert cot.recheck_stats(b) == (1, 0)
  for x in range(0, 400, 3):
    for y in range(0, 100):
      got = cot.column_steps(x, y)
      assert got[-1].c == x + y and all(cot.score_step(_render_a(st)) for st in got)
      assert all(st.a < 10 and st.b < 10 for st in got if st.word == "add")  # one-digit additions
      assert all(st.a % 10 == 0 and st.b < 10 for st in got if st.word == "combine")  # concatenations
  # the old "repeat" style with marks: the step written again right after the phrase
  r = cot.solution(ex, "a", marks=["", "mistake", ""])
  assert cot.recheck_stats(r) == (1, 1) and len(cot.split_steps(cot.think_body(r))) == 4
  got = step_errors.step_errors([m, b, r], [ex["terms"]] * 3)
  assert got["chains_right"] == 3 and got["steps"] == 9 and got["sum_wrong"] == 0
  # a column re-check that "fixes" a right step into a wrong one counts against the chain, not as a fix
  broken = ("<think> 21 95 : add 37 + 48 = 85 ; wait , recheck add 7 + 8 = 14 ; add 3 + 4 = 7 ; carry 7 + 1 = 8 ; "
            "21 95 : add 37 + 48 = 84 ; 95 : add 84 + 21 = 105 ; add 105 + 95 = 200 ; </think>")
  assert cot.recheck_stats(broken) == (1, 0)
  got = step_errors.step_errors([broken], [ex["terms"]])
  assert got["chains_right"] == 0 and got["steps"] == 3 and got["sum_wrong"] == pytest.approx(1 / 3)
  # re-check reliability: m fixes 1 of 2 re-checks, b finds nothing, r fixes, broken breaks a right step
  rel = step_errors.recheck_reliability([m, b, r, broken])
  checks = rel.pop("check_steps")
  assert rel == {"first_steps": 12, "first_right_rate": 10 / 12, "rechecks": 5, "rechecks_rewriting": 5,
                 "rewritten_right_rate": 4 / 5, "checked_wrong": 2, "fixed": 2, "broken": 1}
  # m: add x4, carry, combine x2; b (language b's plim / vek / kresh count as add / carry / combine): 3, 2, 2;
  # broken: add x2 (7 + 8 = 14 wrong), carry; r ("repeat") has none
  assert checks == {"add": {"n": 9, "right_rate": 8 / 9}, "carry": {"n": 4, "right_rate": 1.0},
                    "combine": {"n": 4, "right_rate": 1.0}}
  for bad in (dict(marks=["", ""]), dict(marks=["oops", "", ""]), dict(marks=["", "", ""], mistake=True)):
    with pytest.raises(ValueError, match="marks"):
      cot.solution(ex, "a", **bad)
  with pytest.raises(ValueError, match="recheck style"):
    cot.solution(ex, "a", recheck="twice", verify=True)
  cd = {"steps": ((8, "/", 2, 4),), "solution": "4", "answer": 4}
  with pytest.raises(ValueError, match="repeat"):
    cot.solution(cd, "a", recheck="columns", verify=True)


def test_per_step_recheck_mix():
  """recheck_per 'step': every step is a mistake (then re-checked) with mistake_frac, else re-checked right with
  verify_frac, independently; the direct answers (cot_frac) are drawn before and do not change, so a control base
  (cot_frac 0) has the same documents whatever the re-check knobs say."""
  task = registry.get_task("sums", num_numbers=4, min_number=10, max_number=99)
  exs = [dict(task.generate(base.rng_for("mixs", i)), index=i) for i in range(1500)]
  p = _knobs(cot_frac=0.5, mistake_frac=0.15, verify_frac=0.25, recheck_per="step", recheck_style="columns")
  docs = [corpus.pretrain_document(task, ex, "a", np.random.default_rng(i), p)[1] for i, ex in enumerate(exs)]
  worked = np.asarray([cot.steps_written(d) > 0 for d in docs])
  stats = np.asarray([cot.recheck_stats(d) for d in docs])
  n_steps = 3 * worked.sum()
  assert abs(worked.mean() - 0.5) < 0.04
  assert abs(stats[worked, 0].sum() / n_steps - 0.4) < 0.03   # re-checked steps
  assert abs(stats[worked, 1].sum() / n_steps - 0.15) < 0.02  # of which caught mistakes
  assert (stats[worked, 0] >= 2).mean() > 0.2                 # chains that re-check several steps
  assert all([s.strip() for s in cot.final_steps(d)] == [s.strip() for s in cot.final_steps(cot.solution(ex, "a"))]
             for d, ex, w in zip(docs, exs, worked) if w)      # every re-check ends on the right step
  for style in ("repeat", "columns"):
    for per in ("document", "step"):
      q = _knobs(cot_frac=0.0, mistake_frac=0.15, verify_frac=0.25, recheck_per=per, recheck_style=style)
      assert [corpus.pretrain_document(task, ex, "a", np.random.default_rng(i), q) for i, ex in
              enumerate(exs[:200])] == [corpus.pretrain_document(task, ex, "a", np.random.default_rng(i),
                                                                 _knobs(cot_frac=0.0)) for i, ex in enumerate(exs[:200])]


def test_sums_verifiers_jax_equals_python(tok):
  task = registry.get_task("sums", num_numbers=6)
  exs = [dict(task.generate(base.rng_for("v", i)), index=i) for i in range(48)]
  texts = []
  for i, ex in enumerate(exs):
    kind = i % 6
    texts.append([cot.solution(ex, "a"), cot.solution(ex, "b", mistake=True, verify=True), cot.brief(ex, "a"),
                  cot.brief(dict(ex, answer=ex["answer"] + 1), "a"),            # wrong answer
                  cot.solution(ex, "a", tagged=False),                          # no format
                  f"<think> </think> <answer> {ex['answer']}0 </answer>"][kind])
  want = np.asarray([[1, 1, 1, 0, 0, 0][i % 6] for i in range(len(exs))], np.float32)
  rows = [tok.encode(t) + [tok.eos_id] for t in texts]
  L = max(map(len, rows))
  tokens = np.zeros((len(rows), L), np.int32)
  mask = np.zeros_like(tokens)
  for r, ids in enumerate(rows):
    tokens[r, :len(ids)], mask[r, :len(ids)] = ids, 1
  batch = task.batch_fields(exs)
  tables = verify_jax.token_tables(tok)
  # the reward and the parsed answers in one jitted program (run eagerly, answer_value was ~100 tiny compiles)
  got, (ok_j, val_j) = jax.jit(lambda t, m, b: (registry.accuracy_reward("sums", t, m, b, tables),
                                                verify_jax.answer_value("sums", t, m, b, tables)))(tokens, mask, batch)
  np.testing.assert_array_equal(np.asarray(got), want)
  np.testing.assert_array_equal(verify_py.accuracy_reward("sums", tokens, mask, batch, tok), want)
  ok, val = verify_py.answer_value("sums", tokens, mask, batch, tok)
  np.testing.assert_array_equal(ok, np.asarray(ok_j))
  np.testing.assert_array_equal(val, np.asarray(val_j))


# ------------------------------------------------------------------------------------------------ pre-training mix
def _knobs(**kw):
  p = dict(template_frac=1.0, tag_frac=1.0, mix_frac=0.0, mistake_frac=0.0, noise_frac=0.0, cot_frac=1.0,
           verify_frac=0.0, forbidden=("ugh",))
  p.update(kw)
  return ml_collections.ConfigDict(p)


def test_pretrain_mix_fractions():
  task = registry.get_task("sums", num_numbers=6)
  exs = [dict(task.generate(base.rng_for("mix", i)), index=i) for i in range(2000)]
  p = _knobs(cot_frac=0.25, mistake_frac=0.2, verify_frac=0.3)
  docs = [corpus.pretrain_document(task, ex, "a", np.random.default_rng(i), p)[1] for i, ex in enumerate(exs)]
  worked = np.asarray([cot.steps_written(d) > 0 for d in docs])
  stats = np.asarray([cot.recheck_stats(d) for d in docs])
  assert abs(worked.mean() - 0.25) < 0.03
  assert all(d == cot.brief(ex, "a") for d, ex, w in zip(docs, exs, worked) if not w)
  fixed, checked = stats[worked, 1] > 0, stats[worked, 0] > 0
  assert abs(fixed.mean() - 0.2) < 0.05  # caught mistakes among the worked documents
  # A re-check without a fix: verify_frac, less those that land on the mistaken step (theirs shows as a fix).
  assert abs((checked & ~fixed).mean() - 0.3 * 0.8) < 0.06
  assert not stats[~worked].any()


def test_pretrain_defaults_keep_earlier_documents():
  """cot_frac = 1, verify_frac = 0 (the defaults) draw no extra random number: every earlier document is as it was."""
  task = registry.get_task("arith", max_digits=2, ops="+-")
  ex = {"a": 23, "op": "+", "b": 45, "answer": 68, "index": 0}
  p = _knobs(template_frac=0.5, tag_frac=0.5, mix_frac=0.25, mistake_frac=0.2, noise_frac=0.1)
  for seed in range(50):
    rng, ref = np.random.default_rng(seed), np.random.default_rng(seed)
    template = ref.random() < 0.5
    tagged = template and ref.random() < 0.5
    mistake = bool(ref.random() < 0.2)
    n_parts = len(cot.solution(ex, "a", mistake, tagged).split(";"))
    switch = int(ref.integers(1, n_parts)) if ref.random() < 0.25 else n_parts
    body = corpus.mixed_solution(ex, "a", mistake, tagged, switch)
    if ref.random() < 0.1:
      body = corpus.insert_word(body, str(ref.choice(["ugh"])), int(ref.integers(1, n_parts - 1)))
    want = (base.prompt(task, ex, "a"), body) if template else ("", task.question(ex, "a") + " " + body)
    assert corpus.pretrain_document(task, ex, "a", rng, p) == want


# ------------------------------------------------------------------------------------------------ statistics
def test_p90_against_numpy():
  x = np.asarray([5, 17, 3, 90, 12, 12, 40, 8, 1024, 33, 7], np.int32)
  np.testing.assert_allclose(float(length_stats.p90(x)), np.percentile(x.astype(np.float64), 90), rtol=1e-6)
  # hand: sorted 1..10 -> rank 0.9 * 9 = 8.1 -> 9 + 0.1 * (10 - 9)
  np.testing.assert_allclose(float(length_stats.p90(np.arange(1, 11))), 9.1, rtol=1e-6)


def test_within_group_corr_against_numpy():
  rng = np.random.default_rng(0)
  len_BxG = rng.integers(5, 200, size=(7, 8)).astype(np.float32)
  acc_BxG = (rng.random((7, 8)) < 0.5).astype(np.float32)
  acc_BxG[1] = 1.0   # constant correctness: no correlation, left out
  len_BxG[2] = 42.0  # constant length: left out
  acc_BxG[3] = (len_BxG[3] > np.median(len_BxG[3])).astype(np.float32)  # longer is right
  corr, frac = length_stats.within_group_corr(len_BxG, acc_BxG)
  keep = [b for b in range(7) if b not in (1, 2)]
  want = np.mean([np.corrcoef(len_BxG[b], acc_BxG[b])[0, 1] for b in keep])
  np.testing.assert_allclose(float(corr), want, rtol=1e-5)
  assert float(frac) == pytest.approx(5 / 7)
  # hand: lengths (1, 2, 3, 4), right (0, 0, 1, 1): cov 1 / (sqrt(5) * 1) = 2 / sqrt(5) ... over centred sums:
  # x = (-1.5, -.5, .5, 1.5), y = (-.5, -.5, .5, .5): sum xy = 2, sum x^2 = 5, sum y^2 = 1 -> 2 / sqrt(5)
  corr, frac = length_stats.within_group_corr(np.asarray([[1, 2, 3, 4]]), np.asarray([[0, 0, 1, 1]]))
  assert float(corr) == pytest.approx(2 / np.sqrt(5)) and float(frac) == 1.0
  corr, frac = length_stats.within_group_corr(np.ones((2, 4)), np.zeros((2, 4)))
  assert np.isnan(float(corr)) and float(frac) == 0.0  # no group varies: nothing measured (was 0.0)


def test_report_first_last_tenth_skips_steps_that_measured_no_correlation(tmp_path):
  """train/len_acc_corr of a step where no group varies in both length and accuracy (early R1-Zero: groups all
  wrong) was 0, and the R1 report's mean of the first tenth counted it: steps measuring 0.6 and nothing read 0.3.
  NaN now (written "nan" in metrics.jsonl), skipped by report.first_last: 0.6; a tenth with nothing measured is
  NaN, not 0."""
  import json
  from grpo_jax.r1 import report
  d = tmp_path / "r1_zero"
  d.mkdir()
  corr, _ = length_stats.within_group_corr(np.ones((2, 4)), np.asarray([[0, 0, 1, 1], [0, 0, 0, 0]]))
  none = float(corr)  # both groups constant in length: nothing measured
  assert np.isnan(none)
  vals = [0.6, none] + [0.2] * 16 + [none, none]  # 20 steps: tenths of 2
  with open(d / "metrics.jsonl", "w") as f:
    for i, v in enumerate(vals):
      f.write(json.dumps({"step": i + 1, "train/len_acc_corr": "nan" if np.isnan(v) else v}) + "\n")
  first, last = report.first_last(str(tmp_path), "r1_zero", "train/len_acc_corr")
  assert first == pytest.approx(0.6) and np.isnan(last)


def test_verification_terms_and_premise():
  texts = [cot.solution(EX, "a"), cot.solution(EX, "a", verify=True), cot.solution(EX, "a", mistake=True),
           cot.brief(EX, "a"), "wait , recheck"]
  assert r1_rewards.verified(texts, None, {}) == [0.0, 1.0, 1.0, 0.0, 1.0]
  assert r1_rewards.corrected(texts, None, {}) == [0.0, 0.0, 1.0, 0.0, 0.0]
  assert {"verified", "corrected"} <= set(r1_rewards.TRACKED)
  # premise: 3 worked (2 right), 2 direct (0 right); the last text writes no step
  # steps written: 3 + 4 (one re-check) + 4 (a wrong one, then its re-check) = 11, of which 10 are right
  m = heldout.premise(texts, np.asarray([1, 1, 0, 0, 0]))
  # re-checked among the worked: rows 1 and 2 (right 1 of 2); not: row 0 (right); "wait , recheck" alone is no step
  assert m == {"stepwise_rate_sampled": 0.6, "accuracy_brief_sampled": 0.0,
               "accuracy_stepwise_sampled": pytest.approx(2 / 3), "step_right_rate_sampled": pytest.approx(10 / 11),
               "verified_rate_sampled": pytest.approx(2 / 3), "accuracy_verified_sampled": 0.5,
               "accuracy_unverified_sampled": 1.0}
  assert np.isnan(heldout.premise(texts[:1], np.asarray([1]))["accuracy_brief_sampled"])
  # the reward's view of the same split: tagged accuracy and format per kind (worked rows 0-2, direct rows 3-4)
  m = heldout.premise(texts, np.asarray([1, 1, 0, 0, 0]), tagged_N=np.asarray([1, 0, 0, 1, 0]),
                      format_N=np.asarray([1, 0, 1, 1, 1]))
  assert m["accuracy_tagged_stepwise_sampled"] == pytest.approx(1 / 3) and m["accuracy_tagged_brief_sampled"] == 0.5
  assert m["format_stepwise_sampled"] == pytest.approx(2 / 3) and m["format_brief_sampled"] == 1.0
  assert m["accuracy_tagged_verified_sampled"] == 0.0 and m["accuracy_tagged_unverified_sampled"] == 1.0
  assert m["format_verified_sampled"] == 0.5


def test_step_errors_hand_example():
  """Which part of a running-total step is wrong: copy (first operand != previous total), operand (second != the
  question's next), sum; a re-check replaces the step before it; the total follows what was written."""
  texts = [cot.solution(EX, "a"),                                                 # right: 3 steps
           "<think> add 3 + 8 = 11 ; add 11 + 6 = 17 ; add 17 + 9 = 26 ; </think> <answer> 26 </answer>",  # operand
           "add 3 + 8 = 12 ; add 12 + 5 = 17 ; add 16 + 9 = 25 ; so the answer is 25",  # sum at 1, copy at 3
           cot.solution(EX, "a", mistake=True, verify=True),                       # caught mistake: right
           "add 3 + 8 = 11 ; wait , recheck add 3 + 8 = 12 ; add 12 + 5 = 17 ;",    # a re-check that breaks it
           cot.brief(EX, "a")]                                                    # no steps
  got = step_errors.step_errors(texts, [EX["terms"]] * len(texts))
  assert got["stepwise"] == 5 and got["steps"] == 3 + 3 + 3 + 3 + 2
  assert got["chains_right"] == 2
  assert got["operand_wrong"] == pytest.approx(1 / 14)
  assert got["copy_wrong"] == pytest.approx(1 / 14)
  assert got["sum_wrong"] == pytest.approx(2 / 14)  # texts 3 and 5, at step 1
  assert got["by_step"] == {1: {"n": 5, "copy": 0, "operand": 0, "sum": 2},
                            2: {"n": 5, "copy": 0, "operand": 1, "sum": 0},
                            3: {"n": 4, "copy": 1, "operand": 0, "sum": 0}}


# ------------------------------------------------------------------------------------------------ config
def _flat(d, prefix=""):
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
  return out


def test_aha_config_and_control():
  c = config_lib.load_config(CONFIG)
  assert c.task.name == "sums" and c.sampling.max_new_tokens >= 1024
  assert c.model.max_len == c.task.prompt_len + c.sampling.max_new_tokens
  assert c.sampling.exit_chunk > 0 and c.rl.train_buckets > 1
  assert c.r1.stages == ("base", "r1_zero")
  assert dict(c.r1.zero.rewards) == {"format": 1.0, "accuracy": 1.0}  # nothing about length or verification
  assert 0 < c.r1.pretrain.cot_frac <= 0.5 and c.r1.pretrain.verify_frac > 0 and c.r1.pretrain.mistake_frac > 0
  ctl = config_lib.load_config(CONFIG, "control")
  assert ctl.r1.pretrain.cot_frac == 0.0
  nv = config_lib.load_config(CONFIG, "noverify")
  assert nv.r1.pretrain.verify_frac == 0.0 and nv.r1.pretrain.mistake_frac == 0.0
  # the control differs from the run in its pre-training mix only
  flat, flat_ctl = _flat(c.to_dict()), _flat(ctl.to_dict())
  assert {k for k in flat if flat[k] != flat_ctl[k]} == {"r1.pretrain.cot_frac"}
  stage_config.validate(c, c.r1.stages)
  stage_config.validate(config_lib.load_config(CONFIG, "small"), c.r1.stages)
  assert c.r1.pretrain.recheck_per == "step" and c.r1.pretrain.recheck_style == "columns"
  for key, bad, match in (("recheck_per", "chain", "recheck_per"), ("recheck_style", "twice", "recheck_style"),
                          ("verify_frac", 0.9, "per-step probability")):
    b = config_lib.load_config(CONFIG)
    b.r1.pretrain[key] = bad
    with pytest.raises(errors.ConfigError, match=match):
      stage_config.validate(b, b.r1.stages)


def test_pretrain_seq_len_is_checked():
  c = config_lib.load_config(CONFIG, "small")
  c.r1.pretrain.seq_len = c.model.max_len + 1
  with pytest.raises(errors.ConfigError, match="r1.pretrain.seq_len"):
    stage_config.validate(c, c.r1.stages)


# ------------------------------------------------------------------------------------------------ end to end
def _tiny_config():
  c = config_lib.load_config(CONFIG, "small")
  c.model.update(hidden=16, layers=1, heads=2, kv_heads=1, inter=32)
  c.task.train_size = 256
  c.r1.pretrain.update(steps=2, batch=4)
  c.r1.zero.steps = 2
  c.train.update(eval_every=1, ckpt_every=2)
  c.r1.report.update(size=8, batch=8, n_samples=2, pass_k=(1, 2))  # rejection.n (unused here) must fit a batch
  c.eval.update(size=4, batch=4)
  # the stages' training plots (run/plots.py, drawn during and after each stage) are read by no test here; the
  # report's plots (r1/report.py: the aha plot asserted below) do not depend on this switch
  c.log.plots = False
  return c


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
  """configs/r1_zero_aha.py:small, shrunk further: base + R1-Zero + report (main's path), once for the tests below."""
  from grpo_jax.run import jobs
  d = str(tmp_path_factory.mktemp("aha_small"))
  jobs.run(_tiny_config(), d)
  return d


def test_small_aha_run_logs_the_aha_statistics(small_run):
  """Every aha statistic reaches metrics.jsonl, the base's held-out premise readings reach report.json, and the aha
  plot is drawn."""
  import json
  from grpo_jax.run import metrics as metrics_lib
  tmp_path = small_run
  rows = metrics_lib.read_metrics(os.path.join(tmp_path, "r1_zero"))
  train = [r for r in rows if "train/loss" in r]
  assert [r["step"] for r in train] == [1, 2]
  for name in ("train/completion_len_mean", "train/completion_len_p90", "train/len_acc_corr",
               "train/len_acc_corr_frac", "train/reward/verified", "train/reward/corrected"):
    assert all(name in r for r in train), name
  assert all(r["train/completion_len_p90"] <= r["train/completion_len_max"] for r in train)
  assert sorted(r["step"] for r in rows if "eval/accuracy" in r) == [0, 1, 2]  # held-out accuracy every step here
  report = json.load(open(os.path.join(tmp_path, "report.json")))
  for stage in ("base", "r1_zero"):
    assert 0.0 <= report[stage]["stepwise_rate_sampled"] <= 1.0
  assert os.path.getsize(os.path.join(tmp_path, "plots", "r1_zero_aha.png")) > 1000


def test_rl_seeds_over_one_base(small_run, tmp_path):
  """r1.base_from: a run copies another run's finished base instead of pre-training one (RL seeds over one base).
  The copy holds the same params, records the source's view (so R1-Zero's upstream names that base), is refused
  when the source was pre-trained on a different mix, and R1-Zero from it follows its own run_seed."""
  import json
  from grpo_jax.infra import params_ckpt, sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.r1 import pipeline
  from grpo_jax.rl import state as state_lib
  from grpo_jax.run import jobs
  from grpo_jax.run import stages as stages_lib
  src, a = small_run, str(tmp_path / "a")
  rc = _tiny_config()
  rc.update(run_seed=1)
  rc.r1.base_from = src
  jobs.run(rc, a)  # main's (and the sweep's) path
  abstract = state_lib.abstract_params(sharding.make_mesh(rc.mesh), model_lib.ModelConfig.from_config(rc.model))
  load = lambda d: jax.tree.leaves(params_ckpt.load_params(os.path.join(d, "base", "params"), abstract))
  for x, y in zip(load(src), load(a)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  src_rec, rec = stages_lib.read_record(os.path.join(src, "base")), stages_lib.read_record(os.path.join(a, "base"))
  assert rec["done"] and rec["config"] == src_rec["config"] and rec["copied_from"] == os.path.join(src, "base")
  assert not os.path.exists(os.path.join(a, "base", "checkpoints"))  # copied, not pre-trained again
  # the held-out report would sample the same model with the same seed: its cached result comes along
  assert json.load(open(os.path.join(a, "base", "heldout.json"))) == json.load(open(os.path.join(src, "base",
                                                                                                 "heldout.json")))
  up = stages_lib.read_record(os.path.join(a, "r1_zero"))["config"]["stage.upstream"]
  assert up == stages_lib.read_record(os.path.join(src, "r1_zero"))["config"]["stage.upstream"]
  # one base (the same step-0 greedy eval), two RL seeds (run_seed 1 here, the default 0 there) sample differently
  rows = {d: [json.loads(line) for line in open(os.path.join(d, "r1_zero", "metrics.jsonl"))] for d in (src, a)}
  at = lambda d, step, k: next(r[k] for r in rows[d] if r["step"] == step and k in r)
  for k in ("eval/accuracy", "eval/completion_len_mean"):
    assert at(src, 0, k) == at(a, 0, k)
  sampled = lambda d: (at(d, 1, "train/completion_len_mean"), at(d, 1, "train/entropy"))
  assert sampled(src) != sampled(a)
  # a rerun skips the copied base; a base from another mix, or no base at all, is a one-line config error
  assert stages_lib.plan(pipeline.stage_list(rc, a), rc, a)["base"] == "skip"
  bad = _tiny_config()
  bad.r1.base_from, bad.r1.pretrain.cot_frac = src, 0.0
  with pytest.raises(errors.ConfigError, match=r"r1.base_from.*r1.pretrain.cot_frac"):
    pipeline.stage_list(bad, str(tmp_path / "c"))
  # what only the base's sampling and report read may differ (pre-training is teacher-forced): the copy is taken,
  # but the held-out report is not (it would sample differently), so this run's report samples the base itself
  other = _tiny_config()
  other.r1.base_from, other.sampling.engine = src, "static" if rc.sampling.engine != "static" else "continuous"
  pipeline.stage_list(other, str(tmp_path / "d"))  # accepted
  shared_base.copy(other, os.path.join(src, "base"), str(tmp_path / "d" / "base"))
  assert os.path.exists(tmp_path / "d" / "base" / "params")
  assert not os.path.exists(tmp_path / "d" / "base" / "heldout.json")
  bad.r1.base_from = str(tmp_path / "nothing")
  with pytest.raises(errors.ConfigError, match="r1.base_from.*no base stage record"):
    pipeline.stage_list(bad, str(tmp_path / "c"))
  # a finished base record whose params were deleted: was a FileNotFoundError traceback from the copy
  os.makedirs(tmp_path / "noparams" / "base")
  shutil.copy(os.path.join(src, "base", stages_lib.RECORD), tmp_path / "noparams" / "base")
  bad.r1.base_from = str(tmp_path / "noparams")
  with pytest.raises(errors.ConfigError, match="r1.base_from.*has no params/"):
    pipeline.stage_list(bad, str(tmp_path / "c"))
  # its own base: a rerun of the base moved it aside, then found nothing finished to copy (after writing)
  bad.r1.base_from = src
  with pytest.raises(errors.ConfigError, match="r1.base_from: names this run's own base"):
    pipeline.stage_list(bad, src)
  # a damaged source: was reported later as this run's own damaged base, with advice to rerun it (copying it again)
  shutil.copytree(os.path.join(src, "base"), tmp_path / "dmg" / "base")
  data = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path / "dmg" / "base" / "params") for f in fs
          if os.sep + "d" + os.sep in os.path.join(r, f)]
  for f in data:
    raw = bytearray(open(f, "rb").read())
    for i in range(0, len(raw), max(1, len(raw) // 64)):
      raw[i] ^= 0xFF
    open(f, "wb").write(raw)
  dmg = _tiny_config()
  dmg.update(run_seed=1)
  dmg.r1.base_from = str(tmp_path / "dmg")
  with pytest.raises(errors.InputError, match="r1.base_from: the base copied from .*dmg/base is unusable"):
    pipeline._run_stage(dmg, str(tmp_path / "e"), "base")  # pylint: disable=protected-access


# ------------------------------------------------------------------------------------------------ aha over seeds
def test_welch_against_scipy():
  from scipy import stats as sps
  from grpo_jax.studies import stats
  a, b = [1.9, 2.4, 2.2], [1.0, 1.1, 0.7, 1.3]
  d, hw = stats.welch(stats.summarize(a), stats.summarize(b))
  va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 4
  df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3)
  assert d == pytest.approx(np.mean(a) - np.mean(b))
  assert hw == pytest.approx(sps.t.ppf(0.975, df) * np.sqrt(va + vb), rel=1e-6)
  assert np.isnan(stats.welch(stats.summarize([1.0]), stats.summarize(b))[1])


def _fake_run(d, lengths, verified, acc_base, acc_zero):
  import json
  os.makedirs(os.path.join(d, "r1_zero"))
  with open(os.path.join(d, "r1_zero", "metrics.jsonl"), "w") as f:
    for i, (n, v) in enumerate(zip(lengths, verified)):
      f.write(json.dumps({"step": i + 1, "train/completion_len_mean": n, "train/reward/verified": v}) + "\n")
  with open(os.path.join(d, "report.json"), "w") as f:
    json.dump({"base": {"accuracy_last_number": acc_base}, "r1_zero": {"accuracy_last_number": acc_zero}}, f)


def test_aha_seeds_table_hand_computed(tmp_path):
  """Start / end = mean of the first / last tenth (20 steps: 2 each), the length ratio, the paired held-out change,
  the control's Welch difference, and the per-seed plot."""
  from grpo_jax.r1 import aha_seeds
  from grpo_jax.studies import stats
  runs, ctl = tmp_path / "runs", tmp_path / "ctl"
  ramp = lambda a, b: list(np.linspace(a, b, 20))
  for i, (lo, hi) in enumerate(((40, 80), (50, 90), (30, 90))):
    _fake_run(str(runs / f"seed={i}"), ramp(lo, hi), ramp(0.1, 0.3), 0.2, 0.25 + 0.01 * i)
  for i, (lo, hi) in enumerate(((10, 11), (10, 12), (11, 11))):
    _fake_run(str(ctl / f"seed={i}"), ramp(lo, hi), [0.0] * 20, 0.1, 0.1)
  os.makedirs(runs / "not_a_run")
  dirs = aha_seeds.run_dirs(str(runs))
  assert [os.path.basename(d) for d in dirs] == ["seed=0", "seed=1", "seed=2"]
  r = aha_seeds.per_run(dirs[0])
  lens = ramp(40, 80)
  assert r["train/completion_len_mean@start"] == pytest.approx(np.mean(lens[:2]))
  assert r["train/completion_len_mean@end"] == pytest.approx(np.mean(lens[-2:]))
  assert r["length_ratio"] == pytest.approx(np.mean(lens[-2:]) / np.mean(lens[:2]))
  assert r["train/completion_len_mean@step1"] == 40.0  # the ramp's first value, step 1
  assert r["length_ratio_step1"] == pytest.approx(np.mean(lens[-2:]) / 40.0)
  assert r["accuracy_last_number@change"] == pytest.approx(0.05)
  assert r["train/completion_len_mean@rise"] == pytest.approx(np.mean(lens[-2:]) - np.mean(lens[:2]))
  md = aha_seeds.write(str(runs), dirs, aha_seeds.run_dirs(str(ctl)))
  rises = [np.mean(ramp(a, b)[-2:]) - np.mean(ramp(a, b)[:2]) for a, b in ((40, 80), (50, 90), (30, 90))]
  assert f"`train/completion_len_mean` end − start (paired) | {stats.summarize(rises).fmt(3)}" in md
  s1 = [np.mean(ramp(a, b)[-2:]) / a for a, b in ((40, 80), (50, 90), (30, 90))]
  c_s1 = [np.mean(ramp(a, b)[-2:]) / a for a, b in ((10, 11), (10, 12), (11, 11))]
  d1, hw1 = stats.welch(stats.summarize(s1), stats.summarize(c_s1))
  assert f"end / step 1, runs − control: {d1:+.3f} ± {hw1:.3f}" in md
  ratios = [np.mean(ramp(a, b)[-2:]) / np.mean(ramp(a, b)[:2]) for a, b in ((40, 80), (50, 90), (30, 90))]
  c_ratios = [np.mean(ramp(a, b)[-2:]) / np.mean(ramp(a, b)[:2]) for a, b in ((10, 11), (10, 12), (11, 11))]
  d, hw = stats.welch(stats.summarize(ratios), stats.summarize(c_ratios))
  assert f"runs − control: {d:+.3f} ± {hw:.3f}" in md and ("**resolved**" in md) == (abs(d) > hw)
  assert stats.summarize([0.05, 0.06, 0.07]).fmt(3) in md  # the paired held-out change row
  assert os.path.getsize(runs / "plots" / "aha_seeds.png") > 1000
  assert aha_seeds.main(["--runs", str(tmp_path / "ctl" / "seed=0")]) == 2  # a run, not a sweep directory
