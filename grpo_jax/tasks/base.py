"""Task interface and the fixed train/test split rule shared by every synthetic task.

Splits: the test split is examples 0..n-1 drawn from `(seed, "test", i)`; the train split example i is drawn from
`(seed, "train", i, attempt)` and redrawn while its key collides with a test key, so the two are disjoint and each
example is a pure function of (seed, split, index) -- no pass over earlier examples is needed to resume.
"""
from __future__ import annotations

import abc
import dataclasses
import hashlib
from typing import Any

import numpy as np

LANGUAGES = ("a", "b")
SPLITS = ("train", "test")


def rng_for(*parts: Any) -> np.random.Generator:
  """A numpy Generator seeded by a stable hash of `parts` (Python's hash() is salted per process). A numpy scalar
  hashes as its Python value: numpy 2 writes np.int64(3) as 'np.int64(3)', which drew another data order."""
  parts = tuple(p.item() if isinstance(p, np.generic) else p for p in parts)
  digest = hashlib.sha256(repr(parts).encode()).digest()
  return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def key_hash(key: str) -> str:
  return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Task(abc.ABC):
  """A task family with fixed knobs. Examples are plain dicts with an `index` plus task fields."""

  name: str = ""

  @abc.abstractmethod
  def generate(self, rng: np.random.Generator) -> dict:
    ...

  @abc.abstractmethod
  def key(self, ex: dict) -> str:
    """Canonical identity of an example, used to keep test examples out of train."""

  @abc.abstractmethod
  def question(self, ex: dict, language: str) -> str:
    ...

  @abc.abstractmethod
  def answer_text(self, ex: dict) -> str:
    """The reference answer body (what goes between <answer> and </answer>)."""

  def knobs(self) -> dict:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}

  def config_name(self) -> str:
    """Filesystem-safe name that changes whenever a knob changes (TFDS config name)."""
    return self.name + "_" + key_hash(repr(sorted(self.knobs().items())))[:10]

  # --- splits -------------------------------------------------------------------------------------------------
  def test_examples(self, seed: int, n: int) -> list[dict]:
    out, seen, i = [], set(), 0
    while len(out) < n:
      ex = self.generate(rng_for(self.name, self.knobs(), seed, "test", i))
      i += 1
      if i > 50 * n + 1000:
        raise ValueError(f"task.test_size={n} exceeds the distinct examples these knobs allow; lower it")
      k = self.key(ex)
      if k in seen:
        continue
      seen.add(k)
      out.append(dict(ex, index=len(out)))
    return out

  def train_example(self, seed: int, index: int, test_keys: set[str]) -> dict:
    for attempt in range(1000):
      ex = self.generate(rng_for(self.name, self.knobs(), seed, "train", index, attempt))
      if self.key(ex) not in test_keys:
        return dict(ex, index=index)
    raise ValueError("task.test_size covers almost every example these knobs allow; lower it or raise difficulty")

  def examples(self, seed: int, split: str, n: int, test_size: int) -> list[dict]:
    if split not in SPLITS:
      raise ValueError(f"split={split!r} is unknown; use one of {SPLITS}")
    test = self.test_examples(seed, test_size)
    if split == "test":
      return test[:n]
    keys = {self.key(ex) for ex in test}
    return [self.train_example(seed, i, keys) for i in range(n)]


# R1-Zero template, one line (the tokenizer is trained without newlines). Language 'b' is the same template in
# made-up words so that a model can be anchored to either "language".
_TEMPLATES = {
    "a": ("a user asks and the assistant solves it . the assistant first thinks inside <think> </think> and then "
          "answers inside <answer> </answer> . user : {question} assistant :"),
    "b": ("ko yuzer aski ur ka asistor solvi el . ka asistor prim tinku intra <think> </think> ur dan "
          "ansu intra <answer> </answer> . yuzer : {question} asistor :"),
}


def prompt(task: Task, ex: dict, language: str) -> str:
  """The R1-Zero prompt; the completion is expected to start with the <think> tag. A task may bring its own
  `templates` (GSM8K: DeepSeek-R1's English text); the synthetic tasks use the one-line ones above."""
  if language not in LANGUAGES:
    raise ValueError(f"task.language={language!r} is unknown; use one of {LANGUAGES}")
  return getattr(task, "templates", _TEMPLATES)[language].format(question=task.question(ex, language))
