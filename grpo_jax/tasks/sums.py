"""Multi-operand sums: `t1 + t2 + ... + tn` with n = num_numbers operands in [min_number, max_number].

The task where longer reasoning pays for a small model (docs/r1.md, "The aha task"): writing the answer directly asks
one forward pass to add n numbers, while the worked solution (cot.sum_steps: a running total, one operand a step)
asks each step for one two-operand addition. The answer rule is arith's (arith.py): the body is one integer equal to
`answer`, so both verifiers reuse arith's.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from grpo_jax.tasks import base

MAX_TERMS = 16
MAX_TERM = 999

_QUESTION = {"a": "what is {terms} ?", "b": "kwo iz {terms} ?"}


@dataclasses.dataclass(frozen=True)
class Sums(base.Task):
  name: str = "sums"
  num_numbers: int = 6
  max_number: int = 9
  min_number: int = 1  # 10 with max_number 99: every operand two-digit (configs/r1_zero_aha.py)

  def __post_init__(self):
    if not 2 <= self.num_numbers <= MAX_TERMS:
      raise ValueError(f"task.num_numbers={self.num_numbers} must be in [2, {MAX_TERMS}] for task sums")
    if not 1 <= self.max_number <= MAX_TERM:
      raise ValueError(f"task.max_number={self.max_number} must be in [1, {MAX_TERM}] for task sums")
    if not 1 <= self.min_number <= self.max_number:
      raise ValueError(f"task.min_number={self.min_number} must be in [1, task.max_number={self.max_number}] for task "
                       "sums")

  def generate(self, rng: np.random.Generator) -> dict:
    terms = tuple(int(x) for x in rng.integers(self.min_number, self.max_number + 1, size=self.num_numbers))
    return {"terms": terms, "answer": sum(terms)}

  def key(self, ex: dict) -> str:
    return "+".join(map(str, ex["terms"]))

  def question(self, ex: dict, language: str) -> str:
    return _QUESTION[language].format(terms=" + ".join(map(str, ex["terms"])))

  def answer_text(self, ex: dict) -> str:
    return str(ex["answer"])

  def batch_fields(self, examples: list[dict]) -> dict[str, np.ndarray]:
    return {"answer_N": np.asarray([ex["answer"] for ex in examples], np.int32)}
