"""Stage 3, rejection sampling: N samples per train prompt from the stage-2 policy; the best verified ones, plus
general (tag-free) task text, become stage 4's SFT set.

With `tools.env` the rows run as the RL stages' do (docs/tools.md): the continuous engine pauses a row on a stop
marker, the environment answers, the observation is fed in; the verifiers and stage 2's reward terms read the model's
own tokens (obs_mask.own_tokens: the RL step's rule), never a tool's output. A kept row's
record holds the transcript and `obs_mask` (1 per observation token, the environment's EOS included), which stage 4's
loss leaves out (corpus.pack)."""
from __future__ import annotations

import json
import os
from typing import Sequence

from absl import logging
import jax
import ml_collections
import numpy as np

from grpo_jax.envs import batch as env_batch
from grpo_jax.infra import errors
from grpo_jax.infra import host_calls
from grpo_jax.infra import params_ckpt
from grpo_jax.config import config_lib
from grpo_jax.run import evaluation
from grpo_jax.model import model as model_lib
from grpo_jax.rollout import sampling
from grpo_jax.infra import sharding
from grpo_jax.rl import obs_mask
from grpo_jax.rl import state as state_lib
from grpo_jax.rl import auto
from grpo_jax.r1 import corpus
from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.tasks import base, cot
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib
from grpo_jax.tasks import verify_jax


def select_samples(reward_N: np.ndarray, correct_N: np.ndarray, formatted_N: np.ndarray,
                   completions: Sequence[tuple[int, ...]], keep: int) -> list[int]:
  """Indices of at most `keep` samples of ONE prompt: verified correct and well-formed, distinct completions,
  highest reward first (ties: earliest sample)."""
  order = sorted(range(len(completions)), key=lambda i: (-float(reward_N[i]), i))
  out, seen = [], set()
  for i in order:
    if not (correct_N[i] > 0.5 and formatted_N[i] > 0.5) or tuple(completions[i]) in seen:
      continue
    seen.add(tuple(completions[i]))
    out.append(i)
    if len(out) == keep:
      break
  return out


def _prompt_languages(config, n: int) -> np.ndarray:
  if config.task.language == "mixed":
    return base.rng_for("rejection_lang", config.seed).integers(0, 2, n).astype(np.int32)
  return np.full(n, base.LANGUAGES.index(config.task.language), np.int32)


def _general_records(config, task, tok, examples: list[dict], n: int) -> list[dict]:
  """`n` tag-free worked solutions of random train problems (an epoch over them, then the next): stage 4's general
  (non-reasoning) text. Like the web text it stands for, a `general_noise_frac` fraction carries a forbidden word
  before one of its steps: the undesired behaviour that stage 4 passes on and stage 5's harmlessness term is there
  to remove."""
  out, rng = [], base.rng_for("general", config.seed)
  noise_rng = base.rng_for("general_noise", config.seed)
  order = rng.permutation(len(examples))
  while examples and len(order) < n:  # n > the train set: one permutation fell short of n
    more = base.rng_for("general", config.seed, len(order) // len(examples)).permutation(len(examples))
    order = np.concatenate([order, more])
  for j in order[:n]:
    ex = examples[int(j)]
    lang = base.LANGUAGES[int(rng.integers(2))] if config.task.language == "mixed" else config.task.language
    text = task.question(ex, lang) + " " + cot.solution(ex, lang, tagged=False)
    n_parts = len(text.split(";"))
    if noise_rng.random() < config.r1.rejection.general_noise_frac and n_parts > 2:
      text = corpus.insert_word(text, str(noise_rng.choice(list(config.r1.forbidden))),
                                int(noise_rng.integers(1, n_parts - 1)))
    out.append({"kind": "general", "index": int(ex["index"]), "language": lang, "prompt_ids": [],
                "completion_ids": tok.encode(text), "text": text, "reward": 0.0})
  return out


def _sampled_prompt(b: dict[str, np.ndarray], q: int, bos: int) -> list[int]:
  """Row q's prompt as the sampler saw it, without its bos (corpus.pack adds one): under task.overlong_prompts=
  truncate the kept end of a long prompt; the prompt re-encoded whole was stage 4's, with a completion sampled
  from the truncated one (and a row that could outgrow model.max_len)."""
  ids = [int(t) for t, m in zip(b["prompt_NxP"][q], b["prompt_mask_NxP"][q]) if m]
  return ids[1:] if ids and ids[0] == bos else ids


def prompt_set(config, tok) -> tuple[list[dict], list[dict], np.ndarray]:
  """(the train examples whose prompts fit, the `r1.rejection.prompts` of them sampled, their languages)."""
  examples = data_lib.fit_prompts(config.task, tok, "train", data_lib.load_examples(config.task, "train"),
                                  config.task.prompt_len)
  pick = base.rng_for("rejection_prompts", config.seed).permutation(len(examples))[:config.r1.rejection.prompts]
  chosen = [examples[i] for i in pick]
  return examples, chosen, _prompt_languages(config, len(chosen))


def uses_env(config) -> bool:
  return config.get("tools") is not None and bool(config.tools.env)


def sampler_config(config) -> ml_collections.ConfigDict:
  """The config the sampler runs with: with tools.env, `sampling.engine` auto is the continuous engine (the RL
  stages' choice, rl/auto.py; stage_config.validate refuses 'static'); without, the run config unchanged."""
  if not uses_env(config) or config.sampling.get("engine", "auto") == "continuous":
    return config
  c = ml_collections.ConfigDict(config.to_dict())
  c.sampling.engine = "continuous"
  return c


def decode_config(config, mesh) -> ml_collections.ConfigDict:
  """sampler_config with the `auto` knobs its decode reads resolved for what it decodes (auto.resolve_eval): one
  generate batch of r1.report.batch rows (_sample's chunks), n per prompt; its decode ran unresolved (the training
  layout, decode_layout=fsdp, on an FSDP mesh; 8 compaction sizes under tools.env whatever the length)."""
  rj = config.r1.rejection
  c = ml_collections.ConfigDict(sampler_config(config).to_dict())
  c.eval.update(batch=(config.r1.report.batch // rj.n) * rj.n, n_samples=rj.n)
  return auto.resolve_eval_here(c, mesh)[0]


def _obs_mask(obs_L: np.ndarray, mask_L: np.ndarray, n_comp: int) -> list[int]:
  """A kept row's `obs_mask` over its completion ids and the eos after them: the engine's observation mask over the
  row's tokens, and 0 for an eos the row did not write (corpus.pack adds one; a verified row ends with one)."""
  obs = [int(v) for v in obs_L[mask_L > 0]][:n_comp + 1]
  return obs + [0] * (n_comp + 1 - len(obs))


def _env_stats(env: env_batch.EnvBatch, events_NxE: np.ndarray, obs_NxL: np.ndarray) -> dict[str, int]:
  """Per sampled row, what the environment did (summed): its answered calls, its failures, the rows it ended."""
  if events_NxE[:, env_batch.FALLBACK].sum() and env.last_error:
    logging.warning("rejection sampling: %d environment step(s) fell back (their rows ended unverified), e.g. %s",
                    int(events_NxE[:, env_batch.FALLBACK].sum()), env.last_error)
  return {"env_ended": int((events_NxE[:, env_batch.ENDED] > 0).sum()),
          "tool_calls": int(events_NxE[:, env_batch.CALL].sum() + events_NxE[:, env_batch.TOOL_ERROR].sum()
                            + events_NxE[:, env_batch.TOOL_TIMEOUT].sum()),
          "tool_errors": int(events_NxE[:, env_batch.TOOL_ERROR].sum()),
          "tool_timeouts": int(events_NxE[:, env_batch.TOOL_TIMEOUT].sum()),
          "tool_fallbacks": int(events_NxE[:, env_batch.FALLBACK].sum()),
          "tool_turn_limits": int(events_NxE[:, env_batch.TURN_LIMIT].sum()),
          "obs_tokens": int(obs_NxL.sum())}


def rejection_sample(config, params_path: str, out_path: str) -> dict[str, float]:
  """Writes `out_path` (data.jsonl: reasoning, then general records) and stats.json beside it; returns the stats."""
  rj, tok = config.r1.rejection, tok_lib.for_config(config)
  mesh, mcfg = sharding.make_mesh(config.mesh), model_lib.ModelConfig.from_config(config.model)
  params = params_ckpt.load_params(params_path, state_lib.abstract_params(mesh, mcfg))
  task = data_lib.make_task(config.task)
  examples, chosen, langs = prompt_set(config, tok)
  truncate = config.task.overlong_prompts == "truncate"
  scfg = sampling.SamplingConfig.from_config(config.sampling, eos_id=getattr(tok, "eos_ids", tok.eos_id), pad_id=tok.pad_id,
                                             temperature=rj.temperature, top_k=0, top_p=1.0)
  env = env_batch.build(config, tok) if uses_env(config) else None
  if env is not None:  # else a non-zero environment reward is said (once) to go unused, as in an RL run
    env.rewards_read = r1_rewards.ENV in [n for n, _ in config.r1.grpo.rewards]
  try:
    gen = evaluation.make_generate(mcfg, scfg, mesh, config.task.name, tok.tag_ids,
                                   config=decode_config(config, mesh), tables=verify_jax.tables_for(tok), env=env)
    records, counts = _sample(config, task, tok, gen, params, chosen, langs, truncate, env)
  finally:
    if env is not None:
      env.close()
  n_reason = len(records)
  if n_reason == 0:
    # a known outcome of the configured run, not a bug: one line, exit 3, stages 1-2 kept (a rerun resumes here)
    raise errors.RunStopped("rejection sampling kept no sample (no verified-correct, well-formed completion); train "
                            "stage 2 longer (r1.grpo.steps) or sample more (r1.rejection.n)")
  n_general = int(round(n_reason * rj.general_frac / (1 - rj.general_frac)))
  records += _general_records(config, task, tok, examples, n_general)
  corpus.write_records(out_path, records)  # the stage counts as done only once the whole file exists
  n_samples = counts.pop("samples")
  stats = {"prompts": len(chosen), "samples": n_samples, "correct_frac": counts.pop("correct") / max(n_samples, 1),
           "kept_reasoning": n_reason, "general": n_general, "rejected": n_samples - n_reason, **counts}
  with open(os.path.join(os.path.dirname(out_path), "stats.json"), "w") as f:
    json.dump(stats, f, indent=2)
  return stats


def _sample(config, task, tok, gen, params, chosen, langs, truncate, env) -> tuple[list[dict], dict[str, int]]:
  """The kept reasoning records, and counts over every sampled row (samples, correct; with an environment
  _env_stats' and how many kept rows hold an observation)."""
  rj = config.r1.rejection
  fns = r1_rewards.config_fns(config)
  eos = getattr(tok, "eos_ids", tok.eos_id)
  per_chunk = config.r1.report.batch // rj.n  # one generate batch holds r1.report.batch rows
  records, counts = [], {"samples": 0, "correct": 0}
  events, obs_all = [], []
  rng = jax.random.PRNGKey(config_lib.run_seed(config) + 3)  # sampling: the run's rng, not the data seed
  for c0 in range(0, len(chosen), per_chunk):
    exs, lg = chosen[c0:c0 + per_chunk], langs[c0:c0 + per_chunk]
    pad = per_chunk - len(exs)  # fixed shapes: the last chunk repeats its first prompt, extra rows are dropped
    exs_p, lg_p = exs + [exs[0]] * pad, np.concatenate([lg, np.repeat(lg[:1], pad)])
    b = data_lib.rl_batch(task, exs_p, lg_p, tok, config.task.prompt_len, truncate=truncate)
    rep = {k: np.repeat(v, rj.n, axis=0) for k, v in b.items()}
    fields = {k: v for k, v in rep.items() if k not in ("prompt_NxP", "prompt_mask_NxP")}
    out = evaluation.to_host(gen(params, rep["prompt_NxP"], rep["prompt_mask_NxP"], fields,
                                 jax.random.fold_in(rng, c0)))
    tokens, mask, _, acc, fmt = out[:5]
    obs = env_r = None
    if env is not None:
      ev, status, obs, env_r = out[5:]
      if int(status.max()) != host_calls.OK:  # rows that waited for the call ended there: not the policy's samples
        raise errors.RunStopped(f"rejection sampling: {env.error_message(int(status.max()))}")
      real = len(exs) * rj.n  # the padding rows are dropped
      events.append(ev[:real])
      obs_all.append(obs[:real])
    comps = evaluation.completions(tokens, mask, eos)  # the transcript: what a record holds
    texts = [tok.decode(c) for c in comps]
    # stage 2's reward mix, whichever KNOWN terms it weights (brevity_correct, untracked, was a KeyError here; env:
    # the generate's 'env' term, the RL step's code), on the model's own tokens as stage 2's step scores them
    own_t, own_m = (tokens, mask) if obs is None else obs_mask.own_tokens(
        tokens, mask, obs, ev[:, env_batch.ENDED] > 0, tok, xp=np)
    own = evaluation.completions(own_t, own_m, eos)
    ended = own_m.sum(1) > np.asarray([len(c) for c in own])  # the row's EOS was stripped: it ended there
    reward = r1_rewards.weighted_sum(r1_rewards.term_scores([tok.decode(c) for c in own], own,
                                                            dict(fields, ended_N=ended), fns, acc, fmt,
                                                            [n for n, _ in config.r1.grpo.rewards], env_r),
                                     config.r1.grpo.rewards)
    for q in range(len(exs)):
      rows = slice(q * rj.n, (q + 1) * rj.n)
      counts["samples"] += rj.n
      counts["correct"] += int((acc[rows] > 0.5).sum())
      lang = base.LANGUAGES[int(lg[q])]
      for i in select_samples(reward[rows], acc[rows], fmt[rows], comps[rows], rj.keep_per_prompt):
        k = q * rj.n + i
        rec = {"kind": "reasoning", "index": int(exs[q]["index"]), "language": lang,
               "prompt_ids": _sampled_prompt(b, q, tok.bos_id),
               "completion_ids": list(comps[k]), "text": texts[k], "reward": float(reward[k])}
        if obs is not None:  # the transcript's observation tokens: stage 4 attends to them, never trains on them
          rec["obs_mask"] = _obs_mask(obs[k], mask[k], len(comps[k]))
          counts["kept_with_observations"] = counts.get("kept_with_observations", 0) + int(sum(rec["obs_mask"]) > 0)
        records.append(rec)
  if env is not None:
    counts.update(_env_stats(env, np.concatenate(events), np.concatenate(obs_all)))
    counts.setdefault("kept_with_observations", 0)
  return records, counts
