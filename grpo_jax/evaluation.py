"""Held-out evaluation: greedy accuracy, sampled accuracy, unbiased pass@k, cons@k (majority vote), format rate.

Tasks with an in-graph verifier (arith, countdown) score inside the generate program; tasks verified in Python
(GSM8K: math_answer on decoded text) generate in-graph, gather the rows to the host and score them there with the
same function their training reward uses (the task's host_verifier in tasks/registry.py). Either way every process
computes the same metrics.
"""
import collections
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from grpo_jax import sampling
from grpo_jax import sharding
from grpo_jax.tasks import registry
from grpo_jax.tasks import verify_jax

# (tokens_NxL, mask_NxL, fields) -> (accuracy_N, format_N, answers_N); answers vote in cons@k. A task's
# `host_verifier(tokenizer)` in tasks/registry.py returns one.
HostVerifier = Callable[[np.ndarray, np.ndarray, dict], tuple[np.ndarray, np.ndarray, list]]


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased estimator of pass@k from n samples with c correct (Chen et al. 2021): 1 − C(n−c, k)/C(n, k)."""
  if k > n:
    raise ValueError(f"eval.pass_k: k={k} exceeds eval.n_samples={n}; raise n_samples or lower k.")
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def answer_span(ids, tag_ids: dict) -> tuple[int, ...] | None:
  """Token ids between the first <answer> and the next </answer> tag token (None if there is no such pair)."""
  ids = list(ids)
  a, b = tag_ids["<answer>"], tag_ids["</answer>"]
  if a not in ids:
    return None
  i = ids.index(a)
  if b not in ids[i + 1:]:
    return None
  j = ids.index(b, i + 1)
  return tuple(ids[i + 1:j])


def cons_at_k(answers: list, correct: list[bool], k: int) -> float:
  """Majority vote over the first k samples' answers (ties → the earliest); 1 if the voted answer is correct."""
  votes = [(a, c) for a, c in zip(answers[:k], correct[:k]) if a is not None]
  if not votes:
    return 0.0
  counts = collections.Counter(a for a, _ in votes)
  best = max(counts.values())
  winner = next(a for a, _ in votes if counts[a] == best)
  return float(any(c for a, c in votes if a == winner))


def make_generate(mcfg, scfg: sampling.SamplingConfig, mesh, task: str, tag_ids: dict,
                  in_graph: bool = True) -> Callable:
  """Jitted (params, prompts, fields, rng) -> (tokens_NxL, mask_NxL, lengths_N[, accuracy_N, format_N]); the
  last two only with `in_graph` (a task verified on the host gets its rows back unscored)."""

  def gen(params, prompt_NxP, pmask_NxP, fields, rng):
    ro = sampling.sample(mcfg, params, sharding.constrain_batch(prompt_NxP), pmask_NxP, rng, scfg)
    if not in_graph:
      return ro.tokens_NxL, ro.mask_NxL, ro.lengths_N
    acc = verify_jax.accuracy_reward(task, ro.tokens_NxL, ro.mask_NxL, fields)
    fmt = verify_jax.format_reward(ro.tokens_NxL, ro.mask_NxL, tag_ids)
    return ro.tokens_NxL, ro.mask_NxL, ro.lengths_N, acc, fmt

  jitted = jax.jit(gen)

  def run(*args):
    with sharding.mesh_context(mesh):
      return jitted(*args)
  return run


class Evaluator:
  """Evaluates params on a fixed held-out set; all shapes static so each generate function compiles once."""

  def __init__(self, config, mcfg, tokenizer, mesh, eval_arrays: dict, task: str | None = None,
               host_verifier: HostVerifier | None = None):
    self.cfg, self.tok, self.mesh = config, tokenizer, mesh
    self.task = task or config.task.name
    if host_verifier is None and registry.get(self.task).host_verifier is not None:
      host_verifier = registry.get(self.task).host_verifier(tokenizer)
    self.host_verifier = host_verifier
    # In-graph tasks keep make_generate's 5-argument call (tests substitute make_generate with that signature).
    host = {} if host_verifier is None else {"in_graph": False}
    self.arrays = eval_arrays
    self.batch = config.eval.batch
    n = eval_arrays["prompt_NxP"].shape[0]
    if n % self.batch:
      raise ValueError(f"eval.size={n} must be a multiple of eval.batch={self.batch}.")
    common = dict(top_k=0, top_p=1.0, max_new_tokens=config.sampling.max_new_tokens,
                  eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    self.greedy = make_generate(mcfg, sampling.SamplingConfig(temperature=1.0, greedy=True, **common), mesh,
                                self.task, tokenizer.tag_ids, **host)
    self.sampled = make_generate(
        mcfg, sampling.SamplingConfig(temperature=config.sampling.temperature, greedy=False, **common), mesh,
        self.task, tokenizer.tag_ids, **host)

  def _chunks(self, repeat: int = 1):
    n = self.arrays["prompt_NxP"].shape[0]
    step = self.batch // repeat if repeat > 1 else self.batch
    for s in range(0, n, step):
      yield {k: np.repeat(v[s:s + step], repeat, axis=0) for k, v in self.arrays.items()}

  def _run(self, fn, params, rng, repeat=1):
    """(tokens_NxL, mask_NxL, lengths_N, accuracy_N, format_N, answers_N or None) over the whole eval set."""
    outs, answers = [], []
    for i, chunk in enumerate(self._chunks(repeat)):
      fields = {k: v for k, v in chunk.items() if k not in ("prompt_NxP", "prompt_mask_NxP")}
      out = fn(params, chunk["prompt_NxP"], chunk["prompt_mask_NxP"], fields, jax.random.fold_in(rng, i))
      # Rows are split over the data axes, across processes too: gather them (a no-op copy on one process).
      out = [np.asarray(x) for x in multihost_utils.process_allgather(out, tiled=True)]
      if self.host_verifier is not None:
        acc, fmt, ans = self.host_verifier(out[0], out[1], fields)  # fields: this chunk's host rows, same order
        out += [acc, fmt]
        answers += list(ans)
      outs.append(out)
    return [np.concatenate(x) for x in zip(*outs)] + [answers if self.host_verifier is not None else None]

  def __call__(self, params, rng, with_samples: bool = True) -> tuple[dict[str, float], list[str]]:
    tokens, mask, lengths, acc, fmt, _ = self._run(self.greedy, params, rng)
    m = {"eval/accuracy": float(acc.mean()), "eval/format_rate": float(fmt.mean()),
         "eval/completion_len_mean": float(lengths.mean())}
    texts = [self.tok.decode(t[mk > 0].tolist()) for t, mk in zip(tokens[:3], mask[:3])]
    if with_samples:
      n = self.cfg.eval.n_samples
      if self.batch % n:
        raise ValueError(f"eval.batch={self.batch} must be a multiple of eval.n_samples={n}.")
      tokens, mask, _, acc, _, answers = self._run(self.sampled, params, jax.random.fold_in(rng, 10_000), repeat=n)
      acc_QxN = acc.reshape(-1, n)
      m["eval/accuracy_sampled"] = float(acc_QxN.mean())
      for k in self.cfg.eval.pass_k:
        m[f"eval/pass@{k}"] = float(np.mean([pass_at_k(n, int(c), k) for c in acc_QxN.sum(-1)]))
      if answers is None:
        answers = [answer_span(t[mk > 0], self.tok.tag_ids) for t, mk in zip(tokens, mask)]
      ans_QxN = [answers[i * n:(i + 1) * n] for i in range(acc_QxN.shape[0])]
      m[f"eval/cons@{n}"] = float(np.mean([cons_at_k(a, list(c > 0.5), n) for a, c in zip(ans_QxN, acc_QxN)]))
    return m, texts
