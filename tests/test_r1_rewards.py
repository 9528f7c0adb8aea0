"""R1's Python reward terms on hand-built completions (values worked out by hand in the comments)."""
import numpy as np
import pytest

from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.tasks import cot

A, B = 0, 1  # language_N codes: 'a', 'b'


def _lang(*codes):
  return {"language_N": np.asarray(codes, np.int32)}


def test_language_consistency_hand_cases():
  texts = [
      "<think> add 3 + 4 = 7 ; so 3 + 4 = 7 ; </think> <answer> 7 </answer>",  # a words: add, so -> 2/2
      "<think> add 3 + 4 = 7 ; zu 3 + 4 = 7 ; </think> <answer> 7 </answer>",   # add (a), zu (b) -> 1/2
      "<think> plim 3 + 4 = 7 ; vek 7 + 1 = 8 ; so 3 + 4 = 8 ; </think> <answer> 8 </answer>",  # 2 b, 1 a
      "<think> 3 + 4 = 7 ; </think> <answer> 7 </answer>",  # no language word at all -> 0, not 1
      "<think> ugh add 1 + 1 = 2 ; </think> <answer> 2 </answer>",  # 'ugh' is in neither list: 1/1
      "add 1 + 1 = 2 ; so the answer is 2",  # untagged: the whole text is the CoT; 5 a-words, prompt in b -> 0/5
  ]
  got = cot.language_consistency_term(texts, None, _lang(A, A, B, A, A, B))
  np.testing.assert_allclose(got, [1.0, 0.5, 2 / 3, 0.0, 1.0, 0.0])


def test_language_consistency_only_counts_think_body():
  # Words after </think> (here 'zu' inside the answer) do not count: the CoT is the think body.
  text = "<think> add 1 + 1 = 2 ; </think> <answer> zu </answer>"
  assert cot.language_consistency_term([text], None, _lang(A)) == [1.0]


def test_language_consistency_needs_languages():
  with pytest.raises(ValueError, match="language_N"):
    cot.language_consistency_term(["x"], None, {})
  with pytest.raises(ValueError, match="rows"):
    cot.language_consistency_term(["x", "y"], None, _lang(A))


def test_think_body_and_the_terms_reading_it_are_linear_in_the_text():
  """A completion of 2,800 unclosed `<think>` tags (20,000 characters) made the lazy `<think>(.*?)</think>` rescan
  the rest of the text per tag: ~2 s per call, in every R1 term that reads the think body, each step."""
  import time
  assert cot.think_body("a <think> b <think> c </think> d </think>") == " b <think> c "
  assert cot.think_body("<think> b") == "<think> b" and cot.think_body("x </think> <think> y") == "x </think> <think> y"
  spam = "<think>" * 2800 + " add 1 + 1 = 2 ;"
  t0 = time.perf_counter()
  assert cot.language_consistency_term([spam], None, _lang(A)) == [1.0]  # no closing tag: the whole text
  r1_rewards.recheck_fixed([spam], None, {})
  assert time.perf_counter() - t0 < 0.5


def test_recheck_statistics():
  fixed = "<think> add 3 + 4 = 8 ; wait , recheck add 3 + 4 = 7 ; so 3 + 4 = 7 ; </think> <answer> 7 </answer>"
  # Re-check phrase after a RIGHT step: counted as a re-check, not as a correction.
  idle = "<think> add 3 + 4 = 7 ; wait , recheck add 3 + 4 = 7 ; </think> <answer> 7 </answer>"
  # Re-check that redoes a different equation: no correction.
  other = "<think> add 3 + 4 = 8 ; hup , revok add 3 + 5 = 8 ; </think> <answer> 8 </answer>"
  plain = "<think> add 3 + 4 = 7 ; </think> <answer> 7 </answer>"
  texts = [fixed, idle, other, plain]
  assert r1_rewards.recheck_count(texts, None, {}) == [1.0, 1.0, 1.0, 0.0]
  assert r1_rewards.recheck_fixed(texts, None, {}) == [1.0, 0.0, 0.0, 0.0]


def test_brevity():
  fn = r1_rewards.make_brevity(10)
  assert fn(["", "", ""], [[1] * 0, [1] * 4, [1] * 12], {}) == [1.0, pytest.approx(0.6), 0.0]
  with pytest.raises(ValueError, match="max_tokens"):
    r1_rewards.make_brevity(0)


def test_harmless():
  fn = r1_rewards.make_harmless(("ugh", "darn"))
  texts = ["add 1 + 1 = 2 ;", "ugh add 1 + 1 = 2 ;", "laughs 1 + 1 = 2", "x;darn"]
  # Whole words only: 'laughs' contains 'ugh' but is not the word.
  assert fn(texts, None, {}) == [1.0, 0.0, 1.0, 0.0]
  for bad in ((), ("Ugh",), ("two words",)):
    with pytest.raises(ValueError, match="forbidden"):
      r1_rewards.make_harmless(bad)


def test_python_fns_names():
  fns = r1_rewards.python_fns(8, ("ugh",))
  assert set(fns) == {"language", "recheck", "recheck_fixed", "verified", "corrected", "brevity", "brevity_correct",
                      "harmless"}
  assert fns["brevity"]([""], [[1, 2]], {}) == [0.75]


def test_brevity_correct_rewards_length_only_on_verified_answers():
  from grpo_jax.tasks import tokenizer_factory as tok_lib
  tok = tok_lib.load()
  fn = r1_rewards.make_brevity_correct(40, "arith", tok)
  right = tok.encode("<think> add 3 + 4 = 7 ; </think> <answer> 7 </answer>")
  wrong = tok.encode("<think> add 3 + 4 = 8 ; </think> <answer> 8 </answer>")
  batch = {"answer_N": np.asarray([7, 7, 7, 7]), "ended_N": np.asarray([True, True, False, True])}
  # right; wrong; right but cut off before EOS (no format); right then trailing text (no format).
  ids = [right, wrong, right, right + tok.encode(" so") * 40]
  got = fn([tok.decode(i) for i in ids], ids, batch)
  assert got == [pytest.approx(1 - len(right) / 40), 0.0, 0.0, 0.0]
  assert r1_rewards.python_fns(40, ("ugh",), "arith", tok)["brevity_correct"](["", ""], [right, wrong],
                                                                              {**batch, "answer_N": [8, 8]}) == [
      0.0, pytest.approx(1 - len(wrong) / 40)]
