"""Held-out evaluation of a Python-verified task (GSM8K): greedy accuracy, format rate, pass@k and cons@k from the
host verifier, against hand-computed values. The generate programs are replaced by fixed completions, so the test
checks the gather → decode → math_answer → metrics path exactly (the real generate runs in test_gsm8k_run.py)."""
import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from grpo_jax.config import config_lib
from grpo_jax.run import evaluation
from grpo_jax.model import model as model_lib
from grpo_jax.infra import sharding
from grpo_jax.tasks import data, gsm8k
from grpo_jax.tasks import tokenizer_factory as tok_lib
from tests import eval_fakes

L = 32
RIGHT, WRONG_FMT, TRUNC = "<think>a</think> <answer>{}</answer>", "<answer>{}</answer>", "TRUNC"
# Question i's gold answer is i + 3. Greedy: i1 wrong; i3 right but malformed (no <think>: format 0); i5 truncated
# right after </answer> (a tagged answer needs no EOS, and nothing follows the tags: format 1).
GREEDY = {0: "3", 1: "5", 2: "$5.00", 3: ("bad", "6"), 4: "7", 5: ("trunc", "8")}
# Three samples per question; c = right samples; the vote merges equal values ('5.0' and '5').
SAMPLED = {0: ["3", "3", "2"],                  # c=2, vote '3' right
           1: ["5", "4", "5"],                  # c=1, vote '5' wrong
           2: ["2", "5.0", "5"],                # c=2, vote 5 (two votes as one value) right; unmerged: '2' first
           3: [("bad", "6"), "1", "1"],          # c=1 (the malformed one is right), vote '1' wrong
           4: ["7", "7", "7"],                  # c=3, right
           5: [("bad", "8"), ("trunc", "8"), "8"]}  # c=3, vote '8' right


def completion(tok, spec) -> list[int]:
  kind, ans = spec if isinstance(spec, tuple) else ("ok", spec)
  if kind == "bad":
    return tok.encode(WRONG_FMT.format(ans)) + [tok.eos_id]
  ids = tok.encode(RIGHT.format(ans))
  return ids if kind == "trunc" else ids + [tok.eos_id]


def fake_generate(tok, table, n):
  """Stands in for the jitted generate (host form): row r of a chunk is sample r % n of question index_N[r]."""
  return eval_fakes.fake_generate(tok, L, table, n, lambda tok, spec, r, fields: completion(tok, spec))


@pytest.fixture(scope="module")
def evaluator():
  c = config_lib.load_config("configs/gsm8k.py", "small")
  c.eval.update(size=6, batch=6, n_samples=3, pass_k=(1, 3))
  c.task.test_size = 6
  c.sampling.max_new_tokens = L
  tok = tok_lib.for_config(c)
  records = [{"question": f"Tom has {i} apples and buys 3 more. How many?".encode(),
              "answer": f"#### {i + 3}".encode()} for i in range(6)]
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kw: records):
    arrays = data.eval_set(c.task, tok, 6, c.task.prompt_len)
  ev = evaluation.Evaluator(c, model_lib.ModelConfig.from_config(c.model), tok, sharding.make_mesh(c.mesh), arrays)
  return ev, tok


def test_metrics_match_hand_computed(evaluator):
  """Also shows that GSM8K is scored on the host: the fakes return the host form (no accuracy/format outputs), and the
  answers vote as math_answer values ('5.0' and '5' as one)."""
  ev, tok = evaluator
  ev.greedy, ev.sampled = fake_generate(tok, GREEDY, 1), fake_generate(tok, SAMPLED, 3)
  m, texts = ev(None, jax.random.PRNGKey(0))
  c_Q = np.array([2, 1, 2, 1, 3, 3])
  lengths = [len(completion(tok, GREEDY[i])) for i in range(6)]
  want = {"eval/accuracy": 5 / 6, "eval/format_rate": 5 / 6, "eval/completion_len_mean": np.mean(lengths),
          "eval/accuracy_sampled": c_Q.sum() / 18, "eval/pass@1": np.mean(c_Q / 3),
          "eval/pass@3": 6 / 6, "eval/cons@3": 4 / 6,
          # greedy i1 is the one wrong answer
          "eval/completion_len_correct": np.mean([lengths[i] for i in (0, 2, 3, 4, 5)]),
          "eval/completion_len_incorrect": lengths[1]}
  assert set(m) == set(want)
  for k, v in want.items():
    np.testing.assert_allclose(m[k], v, rtol=1e-6, err_msg=k)
  assert texts[0] == "<think>a</think> <answer>3</answer>"  # the first greedy completions, decoded


def test_empty_answers_cast_no_vote(evaluator):
  """An empty <answer> body or box is no answer: it voted as the text '' (two of them out-voted a right '72')."""
  _, tok = evaluator
  rows = [completion(tok, " "), tok.encode("so \\boxed{ }") + [tok.eos_id], completion(tok, "72")]
  tokens, mask = np.zeros((3, L), np.int32), np.zeros((3, L), np.int32)
  for r, ids in enumerate(rows):
    tokens[r, :len(ids)], mask[r, :len(ids)] = ids, 1
  acc, _, answers = gsm8k.host_verifier(tok)(tokens, mask, {"answer_chars_NxA": gsm8k.encode_answers(["72"] * 3)})
  assert answers[:2] == [None, None] and list(acc) == [0, 0, 1]
  assert evaluation.group_metrics(acc, answers, 3, (1,))["cons@3"] == 1.0


def test_right_answers_vote_together(evaluator):
  """Every answer the grader calls right is one vote: '50%', '0.5' and '1/2' against 0.5 (the percentage voted apart:
  two '7's out-voted the right answer, 2 votes to 2 + 1, on the tie's earliest)."""
  _, tok = evaluator
  rows = [completion(tok, a) for a in ("7", "50%", "0.5", "7.0", "1/2")]
  tokens, mask = np.zeros((5, L), np.int32), np.zeros((5, L), np.int32)
  for r, ids in enumerate(rows):
    tokens[r, :len(ids)], mask[r, :len(ids)] = ids, 1
  acc, _, answers = gsm8k.host_verifier(tok)(tokens, mask, {"answer_chars_NxA": gsm8k.encode_answers(["0.5"] * 5)})
  assert list(acc) == [0, 1, 1, 0, 1] and answers[1] == answers[2] == answers[4] != answers[0] == answers[3]
  assert evaluation.group_metrics(acc, answers, 5, (1,))["cons@5"] == 1.0


def test_the_verifier_votes_within_each_prompts_rows(evaluator, monkeypatch):
  """The host verifier is told how many consecutive rows are one prompt's (`group`): eval.n_samples on the sampled
  pass, 1 on the greedy one, and a chunk holds whole prompts. gsm8k.vote_keys groups a symbolic row's wrong answers
  within its prompt only: they were grouped per reference over the whole chunk, which compared the greedy pass's
  answers for nothing and let another prompt's answer split a prompt's class (tests/test_symbolic.py)."""
  ev, tok = evaluator
  ev.greedy, ev.sampled = fake_generate(tok, GREEDY, 1), fake_generate(tok, SAMPLED, 3)
  seen, verify = [], ev.host_verifier

  def recording(tokens_NxL, mask_NxL, fields, **kw):
    seen.append((len(tokens_NxL), kw))
    return verify(tokens_NxL, mask_NxL, fields, **kw)
  monkeypatch.setattr(ev, "host_verifier", recording)
  ev(None, jax.random.PRNGKey(0))
  assert seen == [(6, {"group": 1})] + [(6, {"group": 3})] * 3, seen  # greedy: 6 prompts; sampled: 2 per chunk


def test_pass_at_k_agrees_with_numpy_enumeration(evaluator):
  # Independent check of the estimator the metrics use: the fraction of all k-subsets holding a right sample.
  import itertools
  for n, c, k in [(3, 1, 2), (4, 2, 2), (5, 1, 3), (3, 0, 1)]:
    subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
    np.testing.assert_allclose(evaluation.pass_at_k(n, c, k), np.mean([any(s) for s in subsets]))


def test_host_verifier_grades_like_the_training_reward(evaluator):
  _, tok = evaluator
  verify = gsm8k.host_verifier(tok)
  reward = gsm8k.make_rewards(tok)["math_accuracy"]
  specs = ["8", "$8.00", "9", ("bad", "8"), ("trunc", "8")]
  rows = [completion(tok, s) for s in specs]
  tokens = np.full((len(rows), L), tok.pad_id, np.int32)
  mask = np.zeros_like(tokens)
  for r, ids in enumerate(rows):
    tokens[r, :len(ids)], mask[r, :len(ids)] = ids, 1
  fields = {"answer_chars_NxA": gsm8k.encode_answers(["8"] * len(rows))}
  acc, fmt, answers = verify(tokens, mask, fields)
  np.testing.assert_array_equal(acc, [1, 1, 0, 1, 1])  # format and accuracy are separate terms
  np.testing.assert_array_equal(fmt, [1, 1, 1, 0, 1])
  assert answers[0] == answers[1] == answers[3] == answers[4] and answers[0] != answers[2]
  # The reward sees ids without EOS plus ended_N (the callback's form): the same verdicts.
  ended = np.array([r[-1] == tok.eos_id for r in rows])
  stripped = [r[:-1] if e else r for r, e in zip(rows, ended)]
  assert reward([""] * len(rows), stripped, {**fields, "ended_N": ended}) == [1.0, 1.0, 0.0, 1.0, 1.0]


def test_evaluation_decodes_with_the_training_early_exit(evaluator, monkeypatch):
  """The greedy and sampled generate programs get sampling.exit_chunk from the config, like the training rollout:
  their decodes stop once every row is done (the sampler's equality with the full decode: test_sampling.py)."""
  ev, tok = evaluator
  seen = []
  monkeypatch.setattr(evaluation, "make_generate", lambda mcfg, scfg, *a, **kw: seen.append(scfg))
  for chunk in (4, 0):
    c = config_lib.override(ev.cfg, {"sampling.exit_chunk": chunk})
    evaluation.Evaluator(c, model_lib.ModelConfig.from_config(c.model), tok, ev.mesh, ev.arrays)
  assert [(s.greedy, s.exit_chunk) for s in seen] == [(True, 4), (False, 4), (True, 0), (False, 0)]


def test_one_job_shares_its_generate_programs_across_stages(evaluator):
  """Inside `evaluation.shared_programs` (one CLI job) a second Evaluator on the same settings, as a later stage
  builds, reuses the first one's jitted programs (traced once), and so does a stage whose config differs only in what
  generate does not read (an R1 pipeline's RL stages: rewards, β; evaluation.generate_view); a changed eval or
  sampling setting gets its own, and outside a job every Evaluator builds its own."""
  ev, tok = evaluator
  mcfg = model_lib.ModelConfig.from_config(ev.cfg.model)
  make = lambda c: evaluation.Evaluator(c, mcfg, tok, ev.mesh, ev.arrays)
  other = config_lib.override(ev.cfg, {"sampling.temperature": 0.5})
  stage = config_lib.override(ev.cfg, {"rl.beta": 0.5, "optim.lr": 3e-3, "train.steps": 7})
  assert set(evaluation.generate_view(ev.cfg).keys()) <= {"sampling", "tools"}
  with evaluation.shared_programs():
    a, b, c, d = make(ev.cfg), make(ev.cfg), make(other), make(stage)
    assert a.greedy is b.greedy and a.sampled is b.sampled
    assert d.greedy is a.greedy and d.sampled is a.sampled  # the whole config's JSON gave it its own
    assert a.greedy is not a.sampled
    assert c.sampled is not a.sampled  # the temperature is part of the sampled program
    assert c.greedy is not a.greedy    # the sampling settings differ (the view's JSON is part of the key)
    assert len(evaluation._GENERATE_CACHE[-1]) == 4  # pylint: disable=protected-access
  assert not evaluation._GENERATE_CACHE  # pylint: disable=protected-access
  assert make(ev.cfg).greedy is not make(ev.cfg).greedy
