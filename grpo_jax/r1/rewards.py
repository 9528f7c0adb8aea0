"""R1's Python reward terms (language consistency, re-check statistics, brevity, harmlessness) and each stage's mix.

Every term has the `reward_spec.PyRewardFn` signature `fn(texts, token_ids, batch_np) -> list[float]` (texts are the
completions decoded without EOS; `batch_np` rows are the G-tiled RL batch, so `language_N[i]` is row i's prompt
language). They run on the host through `jax.pure_callback`; a weight-0 term is still logged as
`train/reward/<name>` every step, which is how R1-Zero's "aha" statistics are tracked.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from grpo_jax.rl import reward_spec
from grpo_jax.tasks import cot, verify_py
from grpo_jax.tasks import tokenizer_factory as tok_lib

_WORD_RE = re.compile(r"[a-z]+")


def recheck_count(texts: Sequence[str], token_ids, batch: dict) -> list[float]:
  """Re-check phrases written ('wait , recheck' / 'hup , revok'): the self-reflection count of the aha curve."""
  del token_ids, batch
  return [float(cot.recheck_stats(t)[0]) for t in texts]


def recheck_fixed(texts: Sequence[str], token_ids, batch: dict) -> list[float]:
  """Re-checks that redo the previous step's `A op B` and turn a wrong result into a right one."""
  del token_ids, batch
  return [float(cot.recheck_stats(t)[1]) for t in texts]


def verified(texts: Sequence[str], token_ids, batch: dict) -> list[float]:
  """1 if the completion re-checks at least one step (a verification, with or without a fix), else 0."""
  del token_ids, batch
  return [float(cot.recheck_stats(t)[0] > 0) for t in texts]


def corrected(texts: Sequence[str], token_ids, batch: dict) -> list[float]:
  """1 if at least one re-check turns a wrong step into the right one (recheck_fixed > 0), else 0."""
  del token_ids, batch
  return [float(cot.recheck_stats(t)[1] > 0) for t in texts]


def make_brevity(max_tokens: int) -> reward_spec.PyRewardFn:
  """Helpfulness proxy: 1 - length / max_tokens (shorter answers read faster); 0 at or beyond the limit."""
  if max_tokens <= 0:
    raise ValueError(f"max_tokens={max_tokens} must be > 0 (use sampling.max_new_tokens)")

  def brevity(texts, token_ids, batch):
    del texts, batch
    return [max(0.0, 1.0 - len(ids) / max_tokens) for ids in token_ids]
  return brevity


def make_brevity_correct(max_tokens: int, task: str, tok) -> reward_spec.PyRewardFn:
  """Helpfulness proxy that cannot buy length with accuracy: `brevity` for a completion the task's verifier accepts
  (format and answer, tasks/verify_py.py), 0 otherwise (a length reward only on correct answers, as in Kimi k1.5).
  Plain brevity rewards a short wrong answer as much as a short right one, so in a group whose samples are all
  wrong the shortest wins, and reasoning is cut to win it."""
  brevity = make_brevity(max_tokens)

  def brevity_correct(texts, token_ids, batch):
    n = len(token_ids)
    width = max([len(ids) for ids in token_ids] + [0]) + 1
    tokens_NxL, mask_NxL = np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
    for i, ids in enumerate(token_ids):  # the verifier wants the EOS the host decode dropped
      full = list(ids) + ([tok.eos_id] if bool(np.asarray(batch["ended_N"])[i]) else [])
      tokens_NxL[i, :len(full)], mask_NxL[i, :len(full)] = full, 1
    ok_N = verify_py.accuracy_reward(task, tokens_NxL, mask_NxL, batch, tok)
    return [b if ok > 0 else 0.0 for b, ok in zip(brevity(texts, token_ids, batch), ok_N)]
  return brevity_correct


def make_harmless(forbidden: Sequence[str]) -> reward_spec.PyRewardFn:
  """Harmlessness proxy: 1 if the completion writes none of the forbidden words, else 0."""
  bad = set(forbidden)
  if not bad or any(not _WORD_RE.fullmatch(w) for w in bad):
    raise ValueError(f"forbidden={tuple(forbidden)!r} must be a non-empty tuple of lower-case words [a-z]+")

  def harmless(texts, token_ids, batch):
    del token_ids, batch
    return [0.0 if bad.intersection(_WORD_RE.findall(t)) else 1.0 for t in texts]
  return harmless


def python_fns(max_tokens: int, forbidden: Sequence[str], task: str = "arith", tok=None) -> dict[str, reward_spec.PyRewardFn]:
  """Every Python term the R1 configs may name in `rewards` (`brevity_correct` verifies with `task`'s rule)."""
  return {"language": cot.language_consistency_term, "recheck": recheck_count, "recheck_fixed": recheck_fixed,
          "verified": verified, "corrected": corrected,
          "brevity": make_brevity(max_tokens), "brevity_correct": make_brevity_correct(max_tokens, task, tok),
          "harmless": make_harmless(forbidden)}


def config_fns(config) -> dict[str, reward_spec.PyRewardFn]:
  """`python_fns` for a run: brevity relative to `sampling.max_new_tokens`, harmlessness over `r1.forbidden`."""
  return python_fns(config.sampling.max_new_tokens, tuple(config.r1.forbidden), config.task.name,
                    tok_lib.for_config(config))


# Logged as weight-0 terms in every RL stage (train/reward/<name> each step) when the stage does not weight them;
# with tools.env so is ENV (stage_rewards).
TRACKED = ("format", "accuracy", "language", "recheck", "recheck_fixed", "verified", "corrected", "brevity",
           "harmless")
# The environment's own reward (rl/rewards.py's 'env' term): weighted only with tools.env (stage_config.validate).
ENV = "env"
# Every term a stage may weight: the tracked ones, the verified-brevity variant and the environment's reward (both
# computed only where weighted).
KNOWN = TRACKED + ("brevity_correct", ENV)


def stage_rewards(weighted: Sequence[tuple[str, float]], env: bool = False) -> tuple[tuple[str, float], ...]:
  """The stage's weighted terms, then every other TRACKED term at weight 0 (computed and logged, not rewarded); with
  `env` (tools.env: every RL stage runs the environment) the ENV term too, so every stage logs train/reward/env."""
  names = [n for n, _ in weighted]
  tracked = TRACKED + ((ENV,) if env else ())
  return tuple((n, float(w)) for n, w in weighted) + tuple((n, 0.0) for n in tracked if n not in names)


def term_scores(texts, ids, batch, fns: dict[str, reward_spec.PyRewardFn], acc_N, fmt_N,
                names: Sequence[str] = TRACKED, env_N=None) -> dict[str, np.ndarray]:
  """The terms `names` (any of KNOWN) for host-side completions (accuracy/format from the in-graph verifiers; `env`
  from `env_N`, the generate's per-row 'env' term, evaluation.make_generate with an environment).
  `batch` holds `ended_N` (the row stopped at an EOS) as an RL step's does: `brevity_correct` verifies with it."""
  out = {"accuracy": np.asarray(acc_N, np.float32), "format": np.asarray(fmt_N, np.float32)}
  if ENV in names:
    if env_N is None:
      raise ValueError("reward term 'env' reads the environment's rewards: set tools.env (docs/tools.md).")
    out[ENV] = np.asarray(env_N, np.float32)
  for name in names:
    if name not in out:
      out[name] = np.asarray(fns[name](texts, ids, batch), np.float32)
  return out


def weighted_sum(scores: dict[str, np.ndarray], rewards: Sequence[tuple[str, float]]) -> np.ndarray:
  return sum(float(w) * scores[n] for n, w in rewards)
