"""Tokenizer, task generators, splits and the CoT writer (no JAX)."""
import os

import numpy as np
import pytest

from grpo_jax.tasks import base, build_tokenizer, cot, registry, tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load()


def step_check(text: str) -> list[tuple[str, int]]:
  """(step text, score) for each step of the think body (or the whole text when it has no think tags)."""
  return [(s, cot.score_step(s)) for s in cot.split_steps(cot.think_body(text))]


def _examples(name, n, **knobs):
  task = registry.get_task(name, **knobs)
  return task, [dict(task.generate(base.rng_for("test_tasks", name, i)), index=i) for i in range(n)]


def test_rebuild_is_byte_identical(tmp_path):
  with open(tokenizer_lib.ASSET, "rb") as f:
    shipped = f.read()
  assert build_tokenizer.build() == shipped, "shipped tokenizer is stale: run python -m grpo_jax.tasks.build_tokenizer"


def test_special_ids_and_tags(tok):
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  assert 400 <= tok.vocab_size <= 600
  assert sorted(tok.tag_ids) == sorted(tokenizer_lib.TAGS)
  for tag, i in tok.tag_ids.items():
    assert tok.encode(tag) == [i]
    assert tok.decode([i]) == tag
  assert len(set(tok.tag_ids.values()) | {0, 1, 2, 3}) == 8
  # digits are split: every digit its own piece
  assert tok.encode("12345") == [tok.encode(d)[0] for d in "12345"]


def test_a_model_with_other_control_ids_is_one_line_naming_them(tmp_path):
  """sentencepiece's default ids (unk=0 bos=1 eos=2, no pad): the code's pad 0 would be <unk>. One line naming the
  file, its ids and the training options (was 'tokenizer model must have ...; rebuild with build_tokenizer')."""
  import io
  import sentencepiece as spm
  out = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(["1 + 2 = 3", "think answer"] * 20), model_writer=out,
                                 vocab_size=30, hard_vocab_limit=False, num_threads=1, minloglevel=2)
  path = tmp_path / "default_ids.model"
  path.write_bytes(out.getvalue())
  with pytest.raises(ValueError) as e:
    tokenizer_lib.load(str(path))
  assert str(e.value) == (f"{path} has pad=-1 bos=1 eos=2 unk=0, and the code needs pad=0 bos=1 eos=2 unk=3; train "
                          "it with pad_id=0, bos_id=1, eos_id=2, unk_id=3 (as python -m grpo_jax.tasks.build_tokenizer "
                          "does)")


def test_a_model_without_the_tag_pieces_has_no_tag_ids(tmp_path):
  """task.tokenizer=<file>.model built without the tags as user-defined symbols: piece_to_id gave unk (3) for each,
  so gsm8k's token check counted <unk> as every tag (a tagged answer scored format 0) and arith trained silently
  with <unk> as its tags. Now tag_ids holds real pieces only, and an in-graph task refuses it in one line."""
  from sentencepiece import sentencepiece_model_pb2
  from configs import grpo_arith
  from grpo_jax.run import validate
  from grpo_jax.tasks import gsm8k
  m = sentencepiece_model_pb2.ModelProto()
  with open(tokenizer_lib.ASSET, "rb") as f:
    m.ParseFromString(f.read())
  for p in m.pieces:  # the same model with [think] ... for the tags: no piece is a tag
    if p.piece in tokenizer_lib.TAGS:
      p.piece = p.piece.replace("<", "[").replace(">", "]")
  path = tmp_path / "notags.model"
  path.write_bytes(m.SerializeToString())
  tok = tokenizer_lib.load(str(path))
  assert tok.vocab_size == 512 and tok.tag_ids == {} and not tok.has_tag_tokens
  ids = tok.encode("<think>5 + 3 = 8</think> <answer>8</answer>")
  assert tok.unk_id not in ids and tok.decode(ids) == "<think>5 + 3 = 8</think> <answer>8</answer>"
  assert gsm8k.grade(ids, "8", tok) == (1.0, 1.0, "8")  # the tags are text here: format from the text
  c = grpo_arith.get_config("small")
  c.task.tokenizer = str(path)
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_rl(c, 1, tok)
  assert str(e.value).startswith("config.task.tokenizer: task 'arith' is verified in-graph on token ids") and \
      "lacks <think>, </think>, <answer>, </answer>" in str(e.value) and "\n" not in str(e.value), str(e.value)
  validate.validate_rl(c, 1, tokenizer_lib.load())  # the shipped one has them


@pytest.mark.parametrize("name", ["arith", "countdown"])
def test_roundtrip_task_text_both_languages(tok, name):
  task, exs = _examples(name, 30)
  for i, ex in enumerate(exs):
    for lang in base.LANGUAGES:
      for text in (base.prompt(task, ex, lang), cot.solution(ex, lang, mistake=i % 2 == 0),
                   cot.solution(ex, lang, tagged=False)):
        ids = tok.encode(text)
        assert tok.unk_id not in ids
        assert tok.decode(ids) == text
  rows = np.zeros((2, 8), np.int32)  # pad id 0 decodes to nothing
  for r, text in enumerate(["ab c", "1 + 2"]):
    rows[r, :len(tok.encode(text))] = tok.encode(text)
  assert [tok.decode(r) for r in rows] == ["ab c", "1 + 2"]


def test_arith_examples_and_range():
  task, exs = _examples("arith", 200, max_digits=4, ops="+-*")
  assert {ex["op"] for ex in exs} == {"+", "-", "*"}
  for ex in exs:
    assert ex["answer"] == {"+": ex["a"] + ex["b"], "-": ex["a"] - ex["b"], "*": ex["a"] * ex["b"]}[ex["op"]]
    assert abs(ex["answer"]) < 10**9 and 0 <= ex["a"] < 10**4
  with pytest.raises(ValueError, match="task.max_digits"):
    registry.get_task("arith", max_digits=5, ops="*")
  with pytest.raises(ValueError, match="task.ops"):
    registry.get_task("arith", ops="+/")
  with pytest.raises(ValueError, match="task.bogus"):
    registry.get_task("arith", bogus=1)
  with pytest.raises(ValueError, match="task.name"):
    registry.get_task("sudoku")


def test_countdown_reference_solutions_evaluate_to_target():
  # Independent of the verifiers: Python's own eval on the rendered solution.
  for knobs in ({}, {"num_numbers": 6, "max_number": 100, "max_target": 1000}):
    task, exs = _examples("countdown", 150, **knobs)
    for ex in exs:
      assert 1 <= ex["target"] <= task.max_target
      used = [int(x) for x in ex["solution"].replace("(", " ").replace(")", " ").split() if x.isdigit()]
      pool = list(ex["numbers"])
      for u in used:
        pool.remove(u)  # raises if a number is used more often than given
      assert eval(ex["solution"]) == ex["target"]  # exact: every '/' in a reference solution divides exactly


def test_splits_disjoint_and_deterministic():
  for name in ("arith", "countdown"):
    task = registry.get_task(name, **({"max_digits": 1} if name == "arith" else {}))
    test = task.examples(7, "test", 40, 40)
    train = task.examples(7, "train", 200, 40)
    test_keys = {task.key(ex) for ex in test}
    assert len(test_keys) == 40
    assert not test_keys & {task.key(ex) for ex in train}
    assert train[123] == task.train_example(7, 123, test_keys)  # index-addressable
    assert task.examples(7, "train", 200, 40) == train
    assert task.examples(8, "test", 40, 40) != test


def test_cot_steps_all_right_on_reference():
  for name in ("arith", "countdown"):
    _, exs = _examples(name, 80)
    for ex in exs:
      for lang in base.LANGUAGES:
        steps = step_check(cot.solution(ex, lang))
        assert steps and all(score == 1 for _, score in steps)
        assert cot.recheck_stats(cot.solution(ex, lang)) == (0, 0)


def test_arith_cot_hand_example():
  text = cot.solution({"a": 48, "op": "+", "b": 25, "answer": 73}, "a")
  assert text == ("<think> add 8 + 5 = 13 ; add 4 + 2 = 6 ; carry 6 + 1 = 7 ; so 48 + 25 = 73 ; </think> "
                  "<answer> 73 </answer>")
  text = cot.solution({"a": 6, "op": "-", "b": 31, "answer": -25}, "a", tagged=False)
  assert text == ("borrow 11 - 6 = 5 ; less 3 - 1 = 2 ; take 2 - 0 = 2 ; swap 31 - 6 = 25 ; so 6 - 31 = -25 ; "
                  "so the answer is -25")


def test_mistake_has_one_failing_step_then_correction():
  for name in ("arith", "countdown"):
    _, exs = _examples(name, 60)
    for ex in exs:
      for lang in base.LANGUAGES:
        text = cot.solution(ex, lang, mistake=True)
        scores = [s for _, s in step_check(text)]
        assert scores.count(0) == 1
        k = scores.index(0)
        assert k + 1 < len(scores) and scores[k + 1] == 1
        assert cot.RECHECK[lang] in step_check(text)[k + 1][0]
        assert cot.recheck_stats(text) == (1, 1)
        assert len(scores) == len(step_check(cot.solution(ex, lang))) + 1


def test_step_rule_hand_cases():
  assert cot.score_step(" so 12 * 34 = 408 ") == 1
  assert cot.score_step(" so 12 * 34 = 407 ") == 0
  assert cot.score_step(" 3 - 5 = -2") == 1 and cot.score_step(" 3 - 5 = - 2") == 1
  assert cot.score_step("x 10 / 4 = 2") == 0 and cot.score_step("x 12 / 4 = 3") == 1
  assert cot.score_step(" 1 2 + 3 = 5") == 1  # A is the last digit run: 2 + 3
  assert cot.score_step(" 7 + 1 = 8 x") == 0 and cot.score_step(" words only") == 0
  assert cot.score_step(" 1234567890 + 0 = 1234567890") == 0  # over 9 digits
  # a re-check that does not fix anything is counted as a phrase only
  assert cot.recheck_stats("<think> add 1 + 1 = 2 ; wait , recheck add 1 + 1 = 2 ; </think>") == (1, 0)


def test_word_lists_disjoint_and_language_consistency():
  assert not set(cot.WORDS_A) & set(cot.WORDS_B)
  assert len(cot.WORDS_A) == len(cot.WORDS_B)
  ex = {"a": 48, "op": "+", "b": 25, "answer": 73}
  assert cot.language_consistency(cot.solution(ex, "a"), "a") == 1.0
  assert cot.language_consistency(cot.solution(ex, "b"), "a") == 0.0
  # 'add','so' in a; 'plim','zu','vek' in b; 'hello' in neither
  assert cot.language_consistency("<think> add plim so zu vek hello </think>", "b") == pytest.approx(3 / 5)
  assert cot.language_consistency("no cot words", "a") == 0.0
  with pytest.raises(ValueError, match="language"):
    cot.language_consistency("x", "c")


def test_asset_is_package_data():
  assert os.path.dirname(tokenizer_lib.ASSET).endswith(os.path.join("grpo_jax", "tasks", "assets"))
