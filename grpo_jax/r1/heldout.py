"""Held-out scores of every finished R1 model, through `evaluation.Evaluator` on `r1.report`'s prompts and sizes.

Every model is scored twice on the same prompts: by the verifier (tagged accuracy: the format must hold and the
<answer> body must be right) and by the LAST-NUMBER rule (the last integer the completion writes equals the answer;
the only fair rule for a tag-less base model, applied to every model alike).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

from absl import logging
import jax
import numpy as np

from grpo_jax.infra import params_ckpt
from grpo_jax.run import evaluation
from grpo_jax.run import run_config
from grpo_jax.run import stages
from grpo_jax.model import model as model_lib
from grpo_jax.infra import sharding
from grpo_jax.rl import state as state_lib
from grpo_jax.r1 import layout
from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.r1 import stage_config
from grpo_jax.tasks import cot
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib

_NUMBER_RE = re.compile(r"-?[0-9]+")
READINGS = ("language", "harmless", "recheck")  # the R1 reward terms read off every completion


def last_number(text: str) -> int | None:
  """The rule that scores every model alike, tagged or not: the last integer the completion writes."""
  found = _NUMBER_RE.findall(text)
  if not found or len(found[-1].lstrip("-")) > cot.MAX_DIGITS:
    return None
  return int(found[-1])


def last_number_rule(ro: evaluation.Rollouts) -> tuple[np.ndarray, list[int | None]]:
  """(right_N, the numbers voted on in cons@n) under the last-number rule."""
  last = [last_number(t) for t in ro.texts]
  ok = np.asarray([a is not None and a == int(y) for a, y in zip(last, ro.fields["answer_N"])], np.float32)
  return ok, last


def premise(texts: list[str], right_N: np.ndarray, tagged_N: np.ndarray | None = None,
            format_N: np.ndarray | None = None) -> dict[str, float]:
  """The aha premise on sampled completions: how often the model works step by step (writes at least one step,
  cot.steps_written), the accuracy of its direct vs its step-by-step answers, and the fraction of the written steps
  that are right equations (cot.score_step; NaN for a kind never written). R1-Zero can only select longer reasoning
  that the base already writes and that is more often right. With `tagged_N` / `format_N` (the verifier's accuracy
  and format per completion) the same split of what R1-Zero's reward (format + accuracy) sees: the last-number rule
  can favour step-by-step answers while the reward does not (an untagged worked answer scores 0). Among the
  step-by-step ones, those that re-check a step (`verified`) against those that do not: a re-check can only be
  selected if it pays."""
  steps = [cot.split_steps(cot.think_body(t)) for t in texts]
  stepwise_N = np.asarray([len(x) > 0 for x in steps], bool)
  verified_N = stepwise_N & np.asarray([cot.recheck_stats(t)[0] > 0 for t in texts], bool)
  right_N = np.asarray(right_N, np.float32)
  step_ok = [cot.score_step(x) for row in steps for x in row]

  def acc(v_N, sel):
    return float(v_N[sel].mean()) if sel.any() else float("nan")
  out = {"stepwise_rate_sampled": float(stepwise_N.mean()), "accuracy_brief_sampled": acc(right_N, ~stepwise_N),
         "accuracy_stepwise_sampled": acc(right_N, stepwise_N),
         "step_right_rate_sampled": float(np.mean(step_ok)) if step_ok else float("nan"),
         "verified_rate_sampled": acc(verified_N.astype(np.float32), stepwise_N),
         "accuracy_verified_sampled": acc(right_N, verified_N),
         "accuracy_unverified_sampled": acc(right_N, stepwise_N & ~verified_N)}
  for name, v_N in (("accuracy_tagged", tagged_N), ("format", format_N)):
    if v_N is not None:
      v_N = np.asarray(v_N, np.float32)
      out.update({f"{name}_brief_sampled": acc(v_N, ~stepwise_N), f"{name}_stepwise_sampled": acc(v_N, stepwise_N),
                  f"{name}_verified_sampled": acc(v_N, verified_N),
                  f"{name}_unverified_sampled": acc(v_N, stepwise_N & ~verified_N)})
  return out


def make_evaluator(config) -> evaluation.Evaluator:
  """One Evaluator (greedy and sampled generate, compiled once) shared by every model."""
  c = stage_config.for_heldout(config)
  tok = tok_lib.for_config(c)
  fns = r1_rewards.config_fns(c)
  return evaluation.Evaluator(c, model_lib.ModelConfig.from_config(c.model), tok, sharding.make_mesh(c.mesh),
                              data_lib.eval_set(c.task, tok, c.eval.size, c.task.prompt_len),
                              readings={name: fns[name] for name in READINGS})


def heldout_metrics(ev: evaluation.Evaluator, params, seed: int) -> tuple[dict[str, float], list[str]]:
  """The report's metrics of one model, and its first greedy completions."""
  rng = jax.random.PRNGKey(seed)
  g = ev.rollouts(params, rng)
  m = {"accuracy_tagged": float(g.accuracy_N.mean()), "accuracy_last_number": float(last_number_rule(g)[0].mean()),
       "format_rate": float(g.format_N.mean()), "language_consistency": float(g.readings["language"].mean()),
       "completion_len_mean": float(g.lengths_N.astype(np.float32).mean()),
       "forbidden_rate": float(1 - g.readings["harmless"].mean()),
       "recheck_per_completion": float(g.readings["recheck"].mean())}
  s = ev.rollouts(params, jax.random.fold_in(rng, 1), sampled=True)
  n, pass_k = ev.cfg.eval.n_samples, ev.cfg.eval.pass_k
  for rule, (ok, answers) in (("tagged", (s.accuracy_N, s.answers_N)), ("last_number", last_number_rule(s))):
    m.update({f"{k}_{rule}": v for k, v in evaluation.group_metrics(ok, answers, n, pass_k).items()})
  m["language_consistency_sampled"] = float(s.readings["language"].mean())
  # Stage 5's targets on samples too: a rare behaviour (a forbidden word) shows in samples long before it does in
  # greedy completions, and sampled rollouts are what the RL stages' rewards see.
  m["forbidden_rate_sampled"] = float(1 - s.readings["harmless"].mean())
  m["completion_len_mean_sampled"] = float(s.lengths_N.astype(np.float32).mean())
  m.update(premise(s.texts, last_number_rule(s)[0], s.accuracy_N, s.format_N))
  return m, g.texts[:4]


# The config keys the held-out numbers depend on (the seed, the report's sizes, the readings' forbidden words, the
# sampler, the task, the model), besides the params themselves; r1/shared_base.py reads them too.
HELDOUT_KEYS = ("seed", "r1.report.", "r1.forbidden", "sampling.", "task.", "model.", "eval.")
_CACHE_KEY = "cache_key"


def cache_key(config, stage_dir: str) -> str:
  """What a cached heldout.json was computed from: the params' checksums (params.integrity.json) and HELDOUT_KEYS."""
  flat = run_config.flatten(config)
  keys = {k: v for k, v in flat.items() if any(k == p or (p.endswith(".") and k.startswith(p)) for p in HELDOUT_KEYS)}
  try:
    with open(os.path.join(stage_dir, "params.integrity.json"), encoding="utf-8") as f:
      params_id = f.read()
  except OSError:  # params written before checksums: the finished record's time stands for them
    params_id = str((stages.read_record(stage_dir) or {}).get("finished", ""))
  return run_config.fingerprint(dict(keys, params=params_id))


def _cached(path: str, key: str) -> dict[str, Any] | None:
  """heldout.json's metrics when they were computed for `key`; None (re-evaluate) for a stage continued or redone
  since, a changed r1.report / sampling setting, or a file written before the key was stored."""
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      got = json.load(f)
  except (OSError, ValueError):
    got = None
  if not isinstance(got, dict) or got.pop(_CACHE_KEY, None) != key:
    logging.info("%s is not of this model and evaluation config; evaluating again", path)
    return None
  return got


def evaluate_stages(config, workdir: str) -> dict[str, dict[str, Any]]:
  """Each finished model's held-out metrics, cached in DIR/<stage>/heldout.json with the cache_key they were
  computed for (a restart re-uses them; a continued stage or a changed report config evaluates again)."""
  results, ev = {}, None
  for stage in layout.MODELS:
    path = os.path.join(layout.stage_dir(workdir, stage), "heldout.json")
    if not layout.stage_done(workdir, stage):
      continue
    key = cache_key(config, layout.stage_dir(workdir, stage))
    cached = _cached(path, key)
    if cached is not None:
      results[stage] = cached
      continue
    ev = ev or make_evaluator(config)
    params = params_ckpt.load_params(layout.params_path(workdir, stage),
                                  state_lib.abstract_params(ev.mesh, model_lib.ModelConfig.from_config(config.model)))
    m, texts = heldout_metrics(ev, params, config.seed + 7)
    results[stage] = dict(m, samples=texts)
    with open(path + ".tmp", "w") as f:
      json.dump(dict(results[stage], **{_CACHE_KEY: key}), f, indent=2)
    os.replace(path + ".tmp", path)
  return results
