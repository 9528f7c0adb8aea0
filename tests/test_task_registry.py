"""The one task table: its entries, the lookups that replaced task-name branches, and the digits task's workloads."""
import ast
import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.run import train
from grpo_jax.run import validate
from grpo_jax.tasks import data, digits, registry

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "grpo_jax")


def test_entries_are_consistent():
  assert registry.names() == sorted(registry.TASKS) == ["arith", "countdown", "digits", "gsm8k", "math",
                                                               "sums"]
  for name, spec in registry.TASKS.items():
    assert (spec.task_class is None) == (spec.load is None), name
    if spec.task_class is not None:
      # A text task is verified either in-graph or on the host, not both and not neither.
      assert (spec.in_graph_accuracy is None) != (spec.host_verifier is None), name
      assert getattr(spec.task_class, "name", None) == name, name
    assert not spec.worked_solutions or spec.task_class is not None, name
  assert registry.names("host_verifier") == ["gsm8k", "math"]
  assert registry.names("in_graph_accuracy") == registry.names("worked_solutions") == ["arith", "countdown", "sums"]
  with pytest.raises(ValueError, match="task.name='sudoku' is unknown"):
    registry.get("sudoku")
  with pytest.raises(ValueError, match="no field"):
    registry.names("verifier")


def _task_name_lookups(tree: ast.AST) -> list[int]:
  """Lines that compare with, index by, or key a dict by a task-name string literal."""
  names = set(registry.TASKS)

  def lits(node):
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e for e in elts if isinstance(e, ast.Constant) and e.value in names]

  lines = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      lines += [n.lineno for x in [node.left, *node.comparators] for n in lits(x)]
    elif isinstance(node, ast.Dict):
      lines += [n.lineno for k in node.keys if k is not None for n in lits(k)]
    elif isinstance(node, ast.Subscript):
      lines += [n.lineno for n in lits(node.slice)]
  return lines


def test_no_task_name_branches_outside_tasks():
  """Code outside grpo_jax/tasks/ asks registry.TASKS instead of branching on a task's name."""
  assert _task_name_lookups(ast.parse('if t == "gsm8k" or t in ("arith", "x"): d = {"countdown": 1}["digits"]')) \
      == [1, 1, 1, 1]  # the scan finds each form
  found = {}
  for d, _, files in os.walk(PACKAGE):
    if os.path.join(PACKAGE, "tasks") in d:
      continue
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(d, f)
        with open(path) as fh:
          lines = _task_name_lookups(ast.parse(fh.read()))
        if lines:
          found[os.path.relpath(path, PACKAGE)] = lines
  assert not found, found


def _cfg(**task):
  c = config_lib.base_config()
  c.mesh.update(data=1, fsdp=1, tensor=1)
  c.task.update(**task)
  return c


def test_lookups_give_each_task_its_specifics():
  assert set(train.python_reward_fns(_cfg(name="gsm8k"))) == {"math_accuracy", "math_format"}
  assert train.python_reward_fns(_cfg(name="arith")) == {}
  assert type(data.make_task(_cfg(name="countdown", num_numbers=3).task)).__name__ == "Countdown"
  assert data.make_task(_cfg(name="countdown", num_numbers=3).task).num_numbers == 3
  assert data.make_task({"name": "gsm8k"}).name == "gsm8k"
  assert registry.get_task("arith", max_digits=1).max_digits == 1


@pytest.mark.parametrize("call,needle", [
    (lambda: validate.validate_rl(_cfg(name="digits"), 1), "config.task.name: no text examples for 'digits'"),
    (lambda: validate.validate_rl(_cfg(name="sudoku"), 1), "config.task.name: unknown task 'sudoku'"),
    (lambda: validate.validate_sft(_cfg(name="gsm8k"), 1), "no reference solutions to train on for 'gsm8k'"),
])
def test_validation_names_the_tasks_that_fit(call, needle):
  with pytest.raises(validate.ConfigError) as e:
    call()
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_asking_a_task_for_what_it_lacks_names_the_ones_that_have_it():
  with pytest.raises(ValueError, match=r"task.name='digits' has no text examples .* use one of \['arith', "):
    data.make_task({"name": "digits"})
  with pytest.raises(ValueError, match="has no example generator"):
    registry.get_task("digits")
  with pytest.raises(ValueError, match=r"task='gsm8k' has no in-graph verifier; use one of \['arith', 'countdown', 'sums'\]"):
    registry.accuracy_reward("gsm8k", np.zeros((1, 4), np.int32), np.ones((1, 4), np.int32), {})
  with pytest.raises(ValueError, match="task.bogus is not a knob of arith"):
    registry.get_task("arith", bogus=1)


# ------------------------------------------------------------------------------------------------- digits


def _decode_number(ids) -> int:
  assert all(digits.DIGIT0 <= i < digits.DIGIT0 + 10 for i in ids), ids
  return int("".join(str(i - digits.DIGIT0) for i in ids))


def test_benchmark_batches_are_what_is_a_plus_b():
  batches = list(digits.make_batches(64, 2, seed=0))
  assert len(batches) == 2
  for b in batches:
    assert b["prompt_NxP"].shape == (64, digits.BENCH_PROMPT_LEN) and b["answer_ids_NxA"].shape == (64, 4)
    for prompt, pmask, ans in zip(b["prompt_NxP"], b["prompt_mask_NxP"], b["answer_ids_NxA"]):
      n = int(pmask.sum())
      assert (pmask[:-n] == 0).all() and (pmask[-n:] == 1).all() and (prompt[:-n] == digits.PAD).all()  # left pad
      ids = list(prompt[-n:])
      assert ids[:2] == [digits.WHAT, digits.IS] and ids[-1] == digits.EQ
      plus = ids.index(digits.PLUS)
      a, b_ = _decode_number(ids[2:plus]), _decode_number(ids[plus + 1:-1])
      assert 0 <= a < 1000 and 0 <= b_ < 1000
      assert _decode_number([int(x) for x in ans if x >= 0]) == a + b_
  again = next(digits.make_batches(64, 1, seed=0))
  assert all((again[k] == batches[0][k]).all() for k in again)  # a pure function of the seed


def test_benchmark_reward_in_graph_equals_python():
  """`contains` in-graph (the benchmark's) and through the Python callback form score the same rows."""
  b = next(digits.make_batches(4, 1, seed=1))
  ans = [[int(x) for x in row if x >= 0] for row in b["answer_ids_NxA"]]
  rows = [[20, 21] + ans[0] + [digits.EOS],               # answer inside: 1
          ans[1][:-1] + [30] + ans[1][-1:],               # broken up: 0
          ans[2] + [digits.EOS],                          # at the start: 1
          [digits.DIGIT0] * 3 + [digits.EOS]]             # 0 0 0: 0 (unless the answer is 0)
  L = 8
  tokens = np.full((4, L), digits.PAD, np.int32)
  mask = np.zeros((4, L), np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)], mask[i, :len(r)] = r, 1
  spec, py = digits.reward_spec(64), digits.python_rewards(None)["contains"]
  got = np.asarray(jax.jit(lambda t, m: spec.fns[0](t, m, {"answer_ids_NxA": jnp.asarray(b["answer_ids_NxA"])},
                                                      spec.ctx).r_N)(tokens, mask))
  want = [1.0, 0.0, 1.0, float(ans[3] == [digits.DIGIT0])]
  np.testing.assert_array_equal(got, want)
  ids = [list(t[m > 0]) for t, m in zip(tokens, mask)]
  assert py(None, ids, b) == want


def test_toy_prompts_split_by_parity_and_answer_in_one_token():
  batch = next(digits.toy_batches(500, seed=0))
  p = batch["prompt_NxP"]
  assert p.shape == (500, digits.TOY_PROMPT_LEN) and (batch["prompt_mask_NxP"] == 1).all()
  a, b = p[:, 2] - digits.DIGIT0, p[:, 4] - digits.DIGIT0
  assert set(a) == {0, 2, 4} and set(b) == {0, 1, 2, 3, 4}  # training pairs only: even a
  np.testing.assert_array_equal(batch["answer_N"], digits.DIGIT0 + a + b)
  for fixed, want_a in ((digits.train_set(), {0, 2, 4}), (digits.held_out_set(), {1, 3})):
    fa, fb = fixed["prompt_NxP"][:, 2] - digits.DIGIT0, fixed["prompt_NxP"][:, 4] - digits.DIGIT0
    assert set(fa) == want_a and len(set(zip(fa, fb))) == len(fa) == 5 * len(want_a)
    np.testing.assert_array_equal(fixed["answer_N"], digits.DIGIT0 + fa + fb)


def test_toy_reward_terms_by_hand():
  spec = digits.toy_reward_spec((("acc", 1.0), ("fmt", 0.5), ("proc", 0.25)), 32)
  D = digits.DIGIT0
  tokens = np.array([[D + 3, digits.EOS, 0], [D + 3, D + 1, digits.EOS], [D + 2, digits.EOS, 0],
                     [digits.EOS, 0, 0]], np.int32)
  mask = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]], np.int32)
  batch = {"answer_N": np.full(4, D + 3, np.int32)}
  outs = [fn(jnp.asarray(tokens), jnp.asarray(mask), batch, spec.ctx) for fn in spec.fns]
  np.testing.assert_array_equal(outs[0].r_N, [1, 1, 0, 0])           # acc: first token is the answer
  np.testing.assert_array_equal(outs[1].r_N, [1, 0, 1, 0])           # fmt: exactly digit, EOS
  np.testing.assert_array_equal(outs[2].r_N, [1, 0.5, 1, 0])         # proc: mean of (digit first, EOS second)
  with pytest.raises(ValueError, match="toy terms \\['accuracy'\\] are unknown"):
    digits.toy_reward_spec((("accuracy", 1.0),), 32)


def _digest(batch: dict) -> str:
  m = hashlib.sha256()
  for k in sorted(batch):
    a = np.asarray(batch[k])
    m.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
  return m.hexdigest()[:16]


def test_workload_streams_are_pinned():
  """The benchmark batches, the ablations' prompt streams (seeds 12345 and 777 as train_table/kl_estimators use
  them) and the base model's documents, recorded from the code these workloads had before they moved into
  tasks/digits.py. A change here changes every benchmark and ablation number: re-record only deliberately."""
  toy = digits.toy_batches(8, seed=12345)
  got = {"bench": [_digest(b) for b in digits.make_batches(8, 3, seed=0)],
         "toy": [_digest(next(toy)) for _ in range(3)],
         "toy777": [_digest(next(digits.toy_batches(8, seed=777)))],
         "sets": [_digest(digits.held_out_set()), _digest(digits.train_set())],
         "docs": _digest(digits.base_documents(64, 8, 32, 0.35, np.random.default_rng(0)))}
  assert got == {"bench": ["933cadc5c40be985", "50d1081f2c6f51d3", "898f2791e10e28e6"],
                 "toy": ["bf298e6dd4d4ab35", "2651a55d3594e751", "1bf4d3e319116ea4"], "toy777": ["4acef553e3de0cd5"],
                 "sets": ["dba4e2394c066af3", "7ac93a94dbcef9fa"], "docs": "80dce4618f89cf29"}
