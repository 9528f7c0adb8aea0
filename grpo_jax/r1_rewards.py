"""R1's Python reward terms: language consistency, re-check statistics, brevity, harmlessness.

Every function has the `rewards.PyRewardFn` signature `fn(texts, token_ids, batch_np) -> list[float]` (texts are the
completions decoded without EOS; `batch_np` rows are the G-tiled RL batch, so `language_N[i]` is row i's prompt
language). They run on the host through `jax.pure_callback`; a weight-0 term is still logged as
`train/reward/<name>` every step, which is how R1-Zero's "aha" statistics are tracked.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

from grpo_jax.tasks import base, cot

PyFn = Callable[[Sequence[str], Sequence[Sequence[int]], dict], list[float]]
_WORD_RE = re.compile(r"[a-z]+")
_NUMBER_RE = re.compile(r"-?[0-9]+")


def _languages(batch: dict, n: int) -> list[str]:
  if "language_N" not in batch:
    raise ValueError("batch has no 'language_N'; language consistency needs each prompt's language (0='a', 1='b')")
  langs = np.asarray(batch["language_N"]).reshape(-1)
  if langs.shape[0] != n:
    raise ValueError(f"batch['language_N'] has {langs.shape[0]} rows for {n} completions")
  return [base.LANGUAGES[int(l)] for l in langs]


def language_consistency(texts: Sequence[str], token_ids, batch: dict) -> list[float]:
  """Fraction of the CoT's language words that are in the prompt's language (R1's fix for language mixing).

  A CoT with no words of either language scores 0: an empty think body should not look perfectly consistent.
  """
  del token_ids
  return [cot.language_consistency(t, lang) for t, lang in zip(texts, _languages(batch, len(texts)))]


def recheck_count(texts: Sequence[str], token_ids, batch: dict) -> list[float]:
  """Re-check phrases written ('wait , recheck' / 'hup , revok'): the self-reflection count of the aha curve."""
  del token_ids, batch
  return [float(cot.recheck_stats(t)[0]) for t in texts]


def recheck_fixed(texts: Sequence[str], token_ids, batch: dict) -> list[float]:
  """Re-checks that redo the previous step's `A op B` and turn a wrong result into a right one."""
  del token_ids, batch
  return [float(cot.recheck_stats(t)[1]) for t in texts]


def make_brevity(max_tokens: int) -> PyFn:
  """Helpfulness proxy: 1 - length / max_tokens (shorter answers read faster); 0 at or beyond the limit."""
  if max_tokens <= 0:
    raise ValueError(f"max_tokens={max_tokens} must be > 0 (use sampling.max_new_tokens)")

  def brevity(texts, token_ids, batch):
    del texts, batch
    return [max(0.0, 1.0 - len(ids) / max_tokens) for ids in token_ids]
  return brevity


def make_harmless(forbidden: Sequence[str]) -> PyFn:
  """Harmlessness proxy: 1 if the completion writes none of the forbidden words, else 0."""
  bad = set(forbidden)
  if not bad or any(not _WORD_RE.fullmatch(w) for w in bad):
    raise ValueError(f"forbidden={tuple(forbidden)!r} must be a non-empty tuple of lower-case words [a-z]+")

  def harmless(texts, token_ids, batch):
    del token_ids, batch
    return [0.0 if bad.intersection(_WORD_RE.findall(t)) else 1.0 for t in texts]
  return harmless


def last_number(text: str) -> int | None:
  """The rule that scores every model alike, tagged or not: the last integer the completion writes."""
  found = _NUMBER_RE.findall(text)
  if not found or len(found[-1].lstrip("-")) > cot.MAX_DIGITS:
    return None
  return int(found[-1])


def python_fns(max_tokens: int, forbidden: Sequence[str]) -> dict[str, PyFn]:
  """Every Python term the R1 configs may name in `rewards`."""
  return {"language": language_consistency, "recheck": recheck_count, "recheck_fixed": recheck_fixed,
          "brevity": make_brevity(max_tokens), "harmless": make_harmless(forbidden)}
