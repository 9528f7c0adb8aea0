"""Two-operand integer arithmetic: `a op b` with op in {+, -, *} (ASCII), operands in [0, 10**max_digits).

Answer range: every reference answer is an integer with |x| < 10**9 (knobs that could exceed it are rejected).
The answer body must be one integer: optional spaces, optional '-', 1..9 digits (leading zeros count), optional
spaces. A number written with more than 9 digits OVERFLOWS and scores 0 in both verifiers.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from grpo_jax.tasks import base

MAX_ANSWER_DIGITS = 9  # |x| < 10**9 fits int32 in the JAX verifier
OPS = "+-*"
# The tasks whose answer body is one integer compared with `answer_N` (this module's rule): both verifiers use it.
INTEGER_ANSWER = ("arith", "sums")

_QUESTION = {"a": "what is {a} {op} {b} ?", "b": "kwo iz {a} {op} {b} ?"}


@dataclasses.dataclass(frozen=True)
class Arith(base.Task):
  name: str = "arith"
  max_digits: int = 3
  ops: str = "+-*"

  def __post_init__(self):
    if not self.ops or any(o not in OPS for o in self.ops) or len(set(self.ops)) != len(self.ops):
      raise ValueError(f"task.ops={self.ops!r} must be distinct characters from {OPS!r}")
    if not 1 <= self.max_digits <= 8:
      raise ValueError(f"task.max_digits={self.max_digits} must be in [1, 8]")
    top = 10**self.max_digits - 1
    worst = max({"+": 2 * top, "-": top, "*": top * top}[o] for o in self.ops)
    if worst >= 10**MAX_ANSWER_DIGITS:
      raise ValueError(f"task.max_digits={self.max_digits} lets answers reach 10**9 with ops {self.ops!r}; "
                       "lower it (4 for '*')")

  def generate(self, rng: np.random.Generator) -> dict:
    def operand():
      d = int(rng.integers(1, self.max_digits + 1))
      return int(rng.integers(0, 10**d))
    a, b = operand(), operand()
    op = self.ops[int(rng.integers(len(self.ops)))]
    return {"a": a, "b": b, "op": op, "answer": evaluate(a, op, b)}

  def key(self, ex: dict) -> str:
    return f"{ex['a']}{ex['op']}{ex['b']}"

  def question(self, ex: dict, language: str) -> str:
    return _QUESTION[language].format(**ex)

  def answer_text(self, ex: dict) -> str:
    return str(ex["answer"])

  def batch_fields(self, examples: list[dict]) -> dict[str, np.ndarray]:
    return {"answer_N": np.asarray([ex["answer"] for ex in examples], np.int32)}


def evaluate(a: int, op: str, b: int) -> int:
  return {"+": a + b, "-": a - b, "*": a * b}[op]
