"""The GSM8K grader (gsm8k.grade_text / make_rewards / host_verifier) on the held-out hand-labelled cases of
tests/grader_cases.py (written before the grader was changed), with math-verify as the reference.

Measured when the cases were written, on the previous grader (accuracy required the exact tag format, EOS right
after </answer>): its reward agreed with the `correct` label on 78/107 cases (74/107 with tags as single tokens)
and rewarded 40/69 right answers. Then: 107/107 for both the accuracy and the format term. math-verify end to end
(its own extraction from the whole completion) agrees with the label on 75/107 (it reads numbers out of <think>
and ignores <answer>); math-verify comparing the answer our grader extracts agrees with ours on 106/107 (below).
Eight cases added with the numeric normalisation (thousands grouped by spaces, thin spaces or {,}; an explicit
final-answer phrase before other numbers): the grader before it got 109/115 right against the labels (the 6 new
right answers graded 0), after it 115/115 (format 115/115 both); math-verify end to end 79/115, on our extracted
answer 112/115 (the thin-space cases, KNOWN_DIFFERENCES). `PYTHONPATH=. python tests/test_grader.py` prints them.
"""
import json
import os
import sys

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")

from grpo_jax.tasks import gsm8k, hf_tokenizer  # noqa: E402
from tests import grader_cases  # noqa: E402

CASES = grader_cases.CASES
# Where math-verify, judging the answer string our grader extracted, decides otherwise, and why ours stands.
KNOWN_DIFFERENCES = {"\\$72": "an escaped dollar sign is a currency mark to us; math-verify's LaTeX parser fails on it",
                     # thin spaces as thousands separators (SI): math-verify reads the number before the space
                     "\\boxed{37\\,230}": "LaTeX's \\, groups thousands for us; math-verify reads 37",
                     "37\u2009230 boxes": "a thin space groups thousands for us; math-verify reads 37"}


def build_tokenizer(path, tags: bool) -> hf_tokenizer.HFTokenizer:
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tk = tokenizers.Tokenizer(models.BPE())
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = decoders.ByteLevel()
  tk.train_from_iterator([c[0] for c in CASES] * 3, trainers.BpeTrainer(
      vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  if tags:  # as Qwen3 / R1-distill tokenizers have them: single (non-special) tokens
    tk.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                   for t in ("<think>", "</think>", "<answer>", "</answer>")])
  os.makedirs(path, exist_ok=True)
  tk.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|endoftext|>"}, f)
  return hf_tokenizer.HFTokenizer(str(path))


def math_verify_equal(answer, gold) -> bool:
  from math_verify import parse, verify
  if answer is None:
    return False
  latexish = any(c in answer for c in "\\{}") and "$" not in answer
  p = parse(f"${answer}$" if latexish else answer, parsing_timeout=None)  # signal timeouts: main thread only
  return bool(verify(parse(gold, parsing_timeout=None), p, timeout_seconds=None))


@pytest.fixture(scope="module", params=[False, True], ids=["tags_as_text", "tags_as_tokens"])
def tok(request, tmp_path_factory):
  return build_tokenizer(tmp_path_factory.mktemp("tok"), request.param)


def test_cases_are_many_and_balanced():
  assert len(CASES) >= 100
  assert sum(c for _, _, c, _ in CASES) >= 40 and sum(not c for _, _, c, _ in CASES) >= 30
  assert sum(f for *_, f in CASES) >= 40 and sum(not f for *_, f in CASES) >= 20


def test_reward_terms_agree_with_every_label(tok):
  ids = [tok.encode(t) for t, *_ in CASES]
  assert all(tok.decode(i) == t for i, (t, *_) in zip(ids, CASES))
  batch = {"answer_chars_NxA": gsm8k.encode_answers([g for _, g, *_ in CASES])}
  terms = gsm8k.make_rewards(tok)
  acc = terms["math_accuracy"]([t for t, *_ in CASES], ids, batch)
  fmt = terms["math_format"]([t for t, *_ in CASES], ids, batch)
  wrong_acc = [(t, g) for (t, g, c, _), a in zip(CASES, acc) if a != float(c)]
  wrong_fmt = [t for (t, _, _, f), a in zip(CASES, fmt) if a != float(f)]
  assert not wrong_acc and not wrong_fmt, (wrong_acc, wrong_fmt)


def test_host_verifier_grades_like_the_rewards(tok):
  """Evaluation sees ids up to and including EOS; the reward sees them without it plus ended_N: same verdicts."""
  rows = [tok.encode(t) + [tok.eos_id] for t, *_ in CASES]
  width = max(map(len, rows))
  tokens = np.full((len(rows), width), tok.pad_id, np.int32)
  mask = np.zeros_like(tokens)
  for r, ids in enumerate(rows):
    tokens[r, :len(ids)], mask[r, :len(ids)] = ids, 1
  fields = {"answer_chars_NxA": gsm8k.encode_answers([g for _, g, *_ in CASES])}
  acc, fmt, answers = gsm8k.host_verifier(tok)(tokens, mask, fields)
  np.testing.assert_array_equal(acc, [float(c) for _, _, c, _ in CASES])
  np.testing.assert_array_equal(fmt, [float(f) for *_, f in CASES])
  assert answers[CASES.index((grader_cases.tagged("$72.00"), "72", True, True))] == answers[0]  # one vote


def test_truncated_completions_give_no_last_number_answer(tok):
  """Without EOS the last number is where the sampler cut the text, so it is not an answer; explicit ones count."""
  batch = {"answer_chars_NxA": gsm8k.encode_answers(["72"] * 3), "ended_N": np.array([True, False, False])}
  texts = ["9 * 8 = 72", "9 * 8 = 72", grader_cases.tagged("72")]
  ids = [tok.encode(t) for t in texts]
  assert gsm8k.make_rewards(tok)["math_accuracy"](texts, ids, batch) == [1.0, 0.0, 1.0]
  assert gsm8k.grade(tok.encode("9 * 8 = 72"), "72", tok)[0] == 0.0  # the eval form: no EOS = truncated


def test_chat_format_asks_for_a_boxed_answer(tok):
  batch = {"answer_chars_NxA": gsm8k.encode_answers(["72"] * 4),
           "prompt_format_N": np.full(4, gsm8k.PROMPT_FORMATS.index("chat"), np.int32)}
  texts = ["So 9 * 8 = 72.\nThe answer is $\\boxed{72}$.", "\\boxed{71}", grader_cases.tagged("72"), "\\boxed{}"]
  ids = [tok.encode(t) for t in texts]
  terms = gsm8k.make_rewards(tok)
  assert terms["math_format"](texts, ids, batch) == [1.0, 1.0, 0.0, 0.0]
  assert terms["math_accuracy"](texts, ids, batch) == [1.0, 0.0, 1.0, 0.0]
  # boxes holding only boxes or braces are empty too (the outer box is the answer: \boxed{\boxed{}} holds no answer)
  for empty in ("\\boxed{\\boxed{}}", "\\boxed{\\fbox{ }}", "\\boxed{{ }}", "\\boxed{ \\boxed{\\boxed{} } }"):
    assert gsm8k.grade_text(empty, "72", prompt_format="chat")[:2] == (0.0, 0.0), empty
  assert gsm8k.grade_text("\\boxed{\\boxed{72}}", "72", prompt_format="chat")[:2] == (1.0, 1.0)


def test_spelled_tags_are_not_tags_where_tags_are_tokens(tok):
  if not gsm8k.token_tags(tok):
    pytest.skip("tags are text in this vocabulary")
  spelled = [tok.tk.token_to_id(c) for c in "<think>"]
  assert None not in spelled
  ids = spelled + tok.encode("x</think> <answer>72</answer>") + [tok.eos_id]
  assert gsm8k.grade(ids, "72", tok) == (1.0, 0.0, "72")  # right answer, format not followed


def test_math_verify_agrees_on_the_extracted_answers():
  disagree = {}
  for text, gold, _, _ in CASES:
    acc, _, answer = gsm8k.grade_text(text, gold)
    if math_verify_equal(answer, gold) != bool(acc):
      disagree[answer] = gold
  assert set(disagree) == set(KNOWN_DIFFERENCES), disagree


def report() -> str:
  n = len(CASES)
  ours = [gsm8k.grade_text(t, g) for t, g, *_ in CASES]
  label = [c for _, _, c, _ in CASES]

  def end_to_end(text, gold):
    from math_verify import parse, verify
    return bool(verify(parse(gold, parsing_timeout=None), parse(text, parsing_timeout=None), timeout_seconds=None))
  mv_full = [end_to_end(t, g) for t, g, *_ in CASES]
  mv_ans = [math_verify_equal(o[2], g) for o, (_, g, *_) in zip(ours, CASES)]
  return "\n".join([
      f"cases {n} (right answers {sum(label)}, R1-Zero format {sum(f for *_, f in CASES)})",
      f"ours, accuracy vs label:          {sum((o[0] > .5) == c for o, c in zip(ours, label))}/{n}",
      f"ours, format vs label:            {sum((o[1] > .5) == f for o, (*_, f) in zip(ours, CASES))}/{n}",
      f"math-verify end to end vs label:  {sum(m == c for m, c in zip(mv_full, label))}/{n}",
      f"math-verify on our answer vs ours: {sum(m == (o[0] > .5) for m, o in zip(mv_ans, ours))}/{n}"])


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  print(report())
