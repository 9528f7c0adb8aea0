"""Countdown: reach `target` from a multiset of `numbers`.

Expression language (the answer body):
  expr   := term (('+' | '-') term)*
  term   := factor (('*' | '/') factor)*
  factor := NUMBER | '(' expr ')'
NUMBER is 1..9 ASCII digits (value-based: '07' is 7); spaces may separate tokens but not split a number; no unary
minus; parentheses nest at most MAX_PAREN_DEPTH deep. Each number literal must come from `numbers`, each element
used at most once (not necessarily all). '/' must divide exactly (non-zero divisor, zero remainder) or the answer is
invalid; every intermediate result must satisfy |v| < 10**9 (else invalid). Correct iff valid and value == target.
Examples are generated from a solution tree, so every example is solvable.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from grpo_jax.tasks import base

MAX_PAREN_DEPTH = 8
MAX_ABS = 10**9
_GEN_MAX_INTERMEDIATE = 10**6  # keep reference solutions small and readable

_QUESTION = {
    "a": "use the numbers {nums} to make {target} with + - * / and ( ) , each number at most once .",
    "b": "yuz ka numbos {nums} tu mak {target} wiz + - * / ur ( ) , eka numbo maks onsi .",
}


@dataclasses.dataclass(frozen=True)
class Countdown(base.Task):
  name: str = "countdown"
  num_numbers: int = 4
  max_number: int = 25
  max_target: int = 100

  def __post_init__(self):
    if not 2 <= self.num_numbers <= MAX_PAREN_DEPTH:
      raise ValueError(f"task.num_numbers={self.num_numbers} must be in [2, {MAX_PAREN_DEPTH}]")
    if not 2 <= self.max_number < 10**6:
      raise ValueError(f"task.max_number={self.max_number} must be in [2, 10**6)")
    if not 1 <= self.max_target < 10**6:
      raise ValueError(f"task.max_target={self.max_target} must be in [1, 10**6)")

  def generate(self, rng: np.random.Generator) -> dict:
    for _ in range(10_000):
      numbers = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.num_numbers)]
      k = int(rng.integers(2, self.num_numbers + 1))
      chosen = [numbers[i] for i in rng.permutation(self.num_numbers)[:k]]
      tree = _random_tree(chosen, rng)
      if tree is not None and 1 <= tree[0] <= self.max_target:
        steps: list[tuple[int, str, int, int]] = []
        _post_order(tree, steps)
        return {"numbers": tuple(numbers), "target": tree[0], "solution": render(tree), "steps": tuple(steps)}
    raise ValueError("task knobs (num_numbers, max_number, max_target) make solvable examples too rare; "
                     "raise task.max_target")

  def key(self, ex: dict) -> str:
    return f"{sorted(ex['numbers'])}->{ex['target']}"

  def question(self, ex: dict, language: str) -> str:
    return _QUESTION[language].format(nums=" ".join(map(str, ex["numbers"])), target=ex["target"])

  def answer_text(self, ex: dict) -> str:
    return ex["solution"]

  def batch_fields(self, examples: list[dict]) -> dict[str, np.ndarray]:
    n, m = len(examples), self.num_numbers
    numbers = np.zeros((n, m), np.int32)
    for i, ex in enumerate(examples):
      numbers[i] = ex["numbers"]
    return {"numbers_NxM": numbers, "numbers_mask_NxM": np.ones((n, m), bool),
            "target_N": np.asarray([ex["target"] for ex in examples], np.int32)}


# A tree is (value, op, left, right) for an inner node and (value,) for a leaf.
def _random_tree(values: list[int], rng: np.random.Generator):
  pool = [(v,) for v in values]
  while len(pool) > 1:
    i, j = (int(x) for x in rng.permutation(len(pool))[:2])
    x, y = pool[i], pool[j]
    if x[0] < y[0]:
      x, y = y, x  # keep every intermediate non-negative: the larger operand goes first
    a, b = x[0], y[0]
    options = ["+", "*"] + (["-"] if a > b else []) + (["/"] if b > 1 and a % b == 0 else [])
    op = options[int(rng.integers(len(options)))]
    v = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
    if v > _GEN_MAX_INTERMEDIATE:
      return None
    pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(v, op, x, y)]
  return pool[0]


def _post_order(tree, steps: list) -> None:
  if len(tree) == 1:
    return
  v, op, x, y = tree
  _post_order(x, steps)
  _post_order(y, steps)
  steps.append((x[0], op, y[0], v))


def render(tree, top: bool = True) -> str:
  if len(tree) == 1:
    return str(tree[0])
  _, op, x, y = tree
  s = f"{render(x, False)} {op} {render(y, False)}"
  return s if top else f"({s})"
