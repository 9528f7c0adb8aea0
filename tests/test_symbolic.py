"""tasks/symbolic.py: math-verify's answer equivalence in a worker process that a hang cannot stall (killed and
restarted, the item counted), the numeric shortcut, and task.name=math with task.grader=symbolic."""
import json
import time

import numpy as np
import pytest

from grpo_jax.tasks import gsm8k
from grpo_jax.tasks import math_data
from grpo_jax.tasks import registry
from grpo_jax.tasks import symbolic

import symbolic_stand_in  # tests/: a worker loop that imports nothing heavy (each spawn imports it)

pytest.importorskip("math_verify")


@pytest.fixture(scope="module")
def grader():
  g = symbolic.Grader()
  yield g
  g.close()


# (prediction, gold, equal): written by hand, the standard MATH-style cases.
CASES = [
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\sqrt{2}", "\\sqrt{2}", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("[0, 1)", "[0,1)", True),
    ("(0,1]", "[0,1)", False),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})", True),
    ("(3, \\frac{\\pi}{3})", "(3, \\frac{\\pi}{2})", False),
    ("1+x", "x+1", True),
    ("x-1", "x+1", False),
    ("3.14", "\\pi", False),
    ("\\frac{\\pi}{2}", "\\frac{\\pi}{2}", True),
    ("0.5", "\\frac{1}{2}", True),       # numeric gold: decided by math_answer's exact values
    ("5 apples", "5", True),             # numeric gold: the numeric grader's units rule
    ("2x", "2", False),                  # numeric gold, a variable in the prediction: math-verify's 2*x (was 2)
    ("6\\text{ cm}^2", "6", True),        # a unit's power is the unit's (was 36)
    ("1,000", "1000", True),
    ("999", "1000", False),
    # a numeric gold is compared exactly (the numeric grader's rule, as verl's MATH grader's string comparison has
    # it): a rounded decimal is not 1/3, though math-verify alone (6 decimals) would call it equal; a gold that is
    # not a number goes to math-verify, whose rounding to 6 decimals then decides
    ("0.333333", "\\frac{1}{3}", False), ("0.707107", "\\frac{\\sqrt{2}}{2}", True),
    ("0.7071", "\\frac{\\sqrt{2}}{2}", False),
    (None, "\\sqrt{2}", False),
    ("", "1", False),
]


def test_equal_many_matches_the_hand_table(grader):
  got = grader.equal_many([(p, g) for p, g, _ in CASES])
  assert got == [e for _, _, e in CASES], [(p, g) for (p, g, e), v in zip(CASES, got) if v != e]


def test_extracted_expressions_reach_the_grader_whole(grader):
  """An answer line with a LaTeX command or a space inside its expression was read as its first / last number (2 of
  'Answer: \\sqrt{2}', of 'so x = \\sqrt{2}', of 'Answer: 2 x'): right against a reference 2, wrong against
  \\sqrt{2}. The expression goes to math-verify whole."""
  from grpo_jax.tasks import math_answer  # pylint: disable=g-import-not-at-top
  texts = [("Answer: \\sqrt{2}", "\\sqrt{2}", True), ("Answer: \\sqrt{2}", "2", False),
           ("so x = \\sqrt{2}", "\\sqrt{2}", True), ("Answer: 2 x", "2x", True), ("Answer: 2 x", "2", False),
           ("The final answer is $\\frac{\\pi}{2}$.", "\\frac{\\pi}{2}", True)]
  got = grader.equal_many([(math_answer.extract_answer(t), g) for t, g, _ in texts])
  assert got == [want for _, _, want in texts], list(zip(texts, got))


def test_cons_at_k_votes_by_the_graders_equivalence(grader, monkeypatch):
  """Answers the grader calls equal vote together: they voted by their text, so right answers written two ways
  ('1+x', 'x+1') lost a tie to one wrong answer, and three ways of one wrong answer ('2x', 'x \\cdot 2', '2 \\cdot x')
  lost to two right ones. Right and wrong per row by hand; classes in row order."""
  from grpo_jax.run import evaluation  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(symbolic, "_GRADER", grader)  # the module's worker, not a second one
  gold = "x+1"
  rows = [("2x", 0), ("1+x", 1), ("x+1", 1),                                         # 2 right against 1 wrong
          ("1+x", 1), ("2x", 0), ("x \\cdot 2", 0), ("x+1", 1), ("2 \\cdot x", 0)]   # 3 wrong (one class) against 2
  answers, right = [a for a, _ in rows], [r for _, r in rows]
  # two prompts (3 and 5 samples): each votes within its own rows
  keys = (gsm8k.vote_keys(answers[:3], [gold] * 3, right[:3], range(3), group=3)
          + gsm8k.vote_keys(answers[3:], [gold] * 5, right[3:], range(5), group=5))
  assert keys[1] == keys[2] == keys[3] == keys[6] and keys[0] == keys[4] == keys[5] == keys[7] != keys[1]
  assert evaluation.cons_at_k(keys[:3], [r > 0 for r in right[:3]], 3) == 1.0
  assert evaluation.cons_at_k(keys[3:], [r > 0 for r in right[3:]], 5) == 0.0
  # a row of the numeric grader (not in symbolic_rows) is never sent to the worker: its wrong answers vote by text
  calls = grader.stats["calls"]
  numeric_keys = gsm8k.vote_keys(["2x", "x \\cdot 2"], [gold] * 2, [0, 0], group=2)
  assert numeric_keys[0] != numeric_keys[1] and grader.stats["calls"] == calls


def test_wrong_answers_group_within_their_prompt_and_stop_at_the_first_equal_class(grader, monkeypatch):
  """A wrong answer is graded against the first answer of each earlier wrong class of ITS PROMPT, until one is equal.
  The classes were per reference over every row of a chunk: prompts sharing a reference compared their wrong
  answers with each other's (all of it wasted on the greedy pass, one row per prompt), and math-verify's equality is
  not transitive (the set `\\{1,2\\}` = the pair `(1,2)` and = the set `\\{2,1\\}`, but `\\{2,1\\}` != `(1,2)`), so
  prompt A's `(1,2)` took B's `\\{1,2\\}` and left B's `\\{2,1\\}` alone: B voted right 1 : 1 : 1 (the tie to the
  first, right) where its own rows vote the set twice to the right answer's once, wrong.
  Comparisons after the first equal class were made and not used."""
  from grpo_jax.run import evaluation  # pylint: disable=g-import-not-at-top
  asked = []  # every (answer, class's first answer) pair vote_keys grades

  class Recording:
    def equal_many(self, pairs):
      asked.extend(pairs)
      return grader.equal_many(pairs)
  monkeypatch.setattr(symbolic, "_GRADER", Recording())
  a, b, c = "(1,2)", "\\{1,2\\}", "\\{2,1\\}"
  assert grader.equal_many([(b, a), (c, b), (c, a)]) == [True, True, False]  # the premise: (prediction, first)
  gold = "\\{3,4\\}"
  answers = [gold, a, "5x",     # prompt A: 1 right, first (the tie is its)
             gold, b, c]        # prompt B: 1 right, then the set {1,2} written twice, one class
  right = [1, 0, 0, 1, 0, 0]
  keys = gsm8k.vote_keys(answers, [gold] * 6, right, range(6), group=3)
  assert [evaluation.cons_at_k(keys[q:q + 3], [r > 0 for r in right[q:q + 3]], 3) for q in (0, 3)] == [1.0, 0.0]
  assert keys[4] == keys[5] == ("text", b) and keys[1] != keys[2]
  assert asked == [("5x", a), (c, b)], asked  # nothing across prompts
  # the greedy pass: one row per prompt, nothing to vote with: no comparison at all
  asked.clear()
  greedy = gsm8k.vote_keys(answers, [gold] * 6, right, range(6), group=1)
  assert asked == [] and greedy[4] == ("text", b) and greedy[5] == ("text", c)
  # one prompt, wrong `2x`, `3x`, `x \\cdot 2`: `x \\cdot 2` joins `2x` and is not compared with `3x`
  keys = gsm8k.vote_keys(["2x", "3x", "x \\cdot 2"], ["x+1"] * 3, [0, 0, 0], range(3), group=3)
  assert keys[0] == keys[2] != keys[1] and asked == [("3x", "2x"), ("x \\cdot 2", "2x")], asked
  with pytest.raises(ValueError, match="group=0"):
    gsm8k.vote_keys(answers, [gold] * 6, right, range(6), group=0)


def test_numeric_golds_never_reach_the_worker():
  g = symbolic.Grader()
  try:
    assert g.equal_many([("0.5", "\\frac{1}{2}"), ("7", "8"), ("12 cm", "12")]) == [True, False, True]
    assert g.stats["calls"] == 0 and g._proc is None  # pylint: disable=protected-access  (no worker started)
  finally:
    g.close()


def test_a_hung_or_dead_worker_is_replaced_and_the_item_counted():
  g = symbolic.Grader(backstop_s=1.0, serve=symbolic_stand_in.serve)
  try:
    t0 = time.monotonic()
    assert g._run("equal", [("a", "b"), ("hang", "b"), ("c", "d")]) == [True, None, True]  # pylint: disable=protected-access
    assert time.monotonic() - t0 < 30
    assert g.stats == {"calls": 3, "timeouts": 1, "errors": 0, "restarts": 1, "too_long": 0}  # the hung worker's replacement
    pid = g._proc.pid  # pylint: disable=protected-access
    assert g._run("equal", [("die", "b"), ("e", "f")]) == [None, True]  # pylint: disable=protected-access
    assert g.stats["errors"] == 1 and g.stats["restarts"] == 2 and g._proc.pid != pid  # pylint: disable=protected-access
    # math-verify's own timeout and error: not equal, counted, the same worker goes on
    pid = g._proc.pid  # pylint: disable=protected-access
    assert g._run("equal", [("timeout", "b"), ("error", "b"), ("g", "h")]) == [None, None, True]  # pylint: disable=protected-access
    assert g.stats == {"calls": 8, "timeouts": 2, "errors": 2, "restarts": 2, "too_long": 0} and g._proc.pid == pid  # pylint: disable=protected-access
  finally:
    g.close()
  assert g._proc is None  # pylint: disable=protected-access


def test_a_long_answer_is_not_sent_whole():
  """A tagged body holding a whole explanation went to math-verify as it was (~6 s for 800 characters, one item at a
  time): over MAX_ANSWER_CHARS its last box is sent, and without one it is not equal unread, counted."""
  g = symbolic.Grader(backstop_s=30.0, serve=symbolic_stand_in.serve)  # the stand-in answers 'equal' to anything
  prose = "We expand (a+b)^2 and collect terms. " * 20
  try:
    assert g.equal_many([(prose, "\\sqrt{2}")]) == [False]
    assert g.stats["too_long"] == 1 and g.stats["calls"] == 0 and g._proc is None  # pylint: disable=protected-access
    assert g.equal_many([(prose + "\\boxed{\\sqrt{2}}", "\\sqrt{2}"), (prose[:400], "\\sqrt{2}")]) == [True, True]
    assert g.stats["too_long"] == 1 and g.stats["calls"] == 2
  finally:
    g.close()


def test_a_worker_that_cannot_start_is_one_clear_error():
  """It died while starting: an EOFError with no message (then a BrokenPipeError on the next call) before."""
  g = symbolic.Grader(serve=symbolic_stand_in.broken)
  try:
    for _ in range(2):  # each call tries a fresh worker and says the same
      with pytest.raises(RuntimeError, match=r"symbolic grader's worker exited with code 1 while starting .*"
                                             r"python -c 'import math_verify'"):
        g.equal_many([("x", "y")])
      assert g._proc is None  # pylint: disable=protected-access
  finally:
    g.close()


def test_a_worker_that_fails_to_spawn_leaves_nothing_to_kill(monkeypatch):
  """Process.start raising (no processes or memory left) left an unstarted process as the worker: close() and the
  next call then failed with AttributeError ('NoneType' object has no attribute 'kill') instead of trying again."""
  import multiprocessing.context
  real = multiprocessing.context.SpawnProcess.start

  def no_fork(self):
    raise OSError(11, "Resource temporarily unavailable")
  g = symbolic.Grader(serve=symbolic_stand_in.serve)
  try:
    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", no_fork)
    with pytest.raises(OSError, match="Resource temporarily unavailable"):
      g._run("equal", [("a", "b")])  # pylint: disable=protected-access
    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", real)
    assert g._run("equal", [("a", "b")]) == [True]  # pylint: disable=protected-access
  finally:
    g.close()


def test_math_verify_giving_up_reaches_the_counts(monkeypatch):
  """math-verify's default (raise_on_error=False) turned its timeouts and errors into a silent False in the worker:
  they never reached Grader.stats. The worker loop runs here in a thread (timeout 0: no signal alarms)."""
  import multiprocessing
  import threading
  import math_verify.grader
  from math_verify.errors import TimeoutException

  def stuck(*args, **kwargs):
    raise TimeoutException("Operation timed out!")
  monkeypatch.setattr(math_verify.grader, "sympy_expr_eq", stuck)
  parent, child = multiprocessing.Pipe()
  worker = threading.Thread(target=symbolic._serve, args=(child, 0), daemon=True)  # pylint: disable=protected-access
  worker.start()
  assert parent.recv() == "ready"
  parent.send(("equal", [("x+1", "1+x")]))
  assert parent.poll(30)
  assert str(parent.recv()).startswith("TimeoutException")
  parent.send(None)
  worker.join(5)


def test_symbolic_references_load_and_grade_through_the_reward(tmp_path):
  path = tmp_path / "math500.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in [
      {"problem": "Simplify 1/sqrt 2.", "answer": "\\frac{\\sqrt{2}}{2}"},
      {"problem": "Solve.", "solution": "So the set is $\\boxed{[0,1)}$."},
      {"problem": "How many?", "answer": "12"},
      {"problem": "Broken.", "answer": "\\frac{"}]))
  task = registry.get_task("math", train_path=str(path), grader="symbolic")
  with pytest.raises(ValueError, match=r"math500.jsonl line 4: the answer '\\\\frac\{' cannot be graded: math-verify "
                                       r"cannot read it.*task.ungradable=skip"):
    math_data.load_examples(task, "train")
  long = tmp_path / "long.jsonl"
  long.write_text(json.dumps({"problem": "Expand.", "answer": "x^{2} + " * 20 + "1"}) + "\n")
  with pytest.raises(ValueError, match=r"long.jsonl line 1: .* cannot be graded: it is over the 128 UTF-8 bytes the "
                                       r"batch holds for it; set task.ungradable=skip"):
    math_data.load_examples(registry.get_task("math", train_path=str(long), grader="symbolic"), "train")
  with pytest.raises(ValueError, match=r"line 1: .*cannot be graded: it is not a number"):
    math_data.load_examples(registry.get_task("math", train_path=str(path)), "train")  # the numeric grader
  task = registry.get_task("math", train_path=str(path), grader="symbolic", ungradable="skip")
  examples = math_data.load_examples(task, "train")
  assert [e["final"] for e in examples] == ["\\frac{\\sqrt{2}}{2}", "[0,1)", "12"]
  fields = task.batch_fields(examples)
  assert fields["answer_chars_NxA"].shape == (3, math_data.ANSWER_BYTES)
  assert list(fields["grader_N"]) == [1, 1, 1]
  tok = gsm8k.tokenizer_lib.load()
  rewards = gsm8k.make_rewards(tok)
  completions = ["<think> rationalise </think> <answer>\\frac{1}{\\sqrt{2}}</answer>",
                 "<think> interval </think> <answer>(0,1]</answer>",
                 "<think> count </think> <answer>12 apples</answer>"]
  ids = [tok.encode(c) for c in completions]
  batch = {**fields, "ended_N": np.ones(3, bool)}
  assert rewards["math_accuracy"](completions, ids, batch) == [1.0, 0.0, 1.0]
  assert rewards["math_format"](completions, ids, batch) == [1.0, 1.0, 1.0]
  # the same answers under the numeric grader's fields: the symbolic rows are wrong there
  numeric = dict(batch, grader_N=np.zeros(3, np.int32))
  assert rewards["math_accuracy"](completions, ids, numeric) == [0.0, 0.0, 1.0]
  verify = gsm8k.host_verifier(tok)
  tokens = np.zeros((3, 40), np.int32)
  mask = np.zeros((3, 40), np.int32)
  for i, t in enumerate(ids):
    tokens[i, :len(t)], mask[i, :len(t)] = t, 1
  acc, fmt, answers = verify(tokens, mask, fields)
  assert list(acc) == [1.0, 0.0, 1.0] and list(fmt) == [1.0, 1.0, 1.0]  # the held-out grader: the same verdicts
  # what cons@k votes on: a right answer votes with every right one (gsm8k.vote_keys), a wrong one by its text
  assert answers == [("right", "\\frac{\\sqrt{2}}{2}"), ("text", "(0,1]"), ("right", "12")]
