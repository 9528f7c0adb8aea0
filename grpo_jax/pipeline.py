"""R1-Zero and R1's five stages as one resumable command (`config.job = "r1_pipeline"`).

    DIR/base                 pre-training on raw task text (tag-free, except a stated web-like fraction)
    DIR/r1_zero              GRPO from the base: format + accuracy
    DIR/r1_1_cold_start      SFT from the base on a small formatted, single-language set
    DIR/r1_2_grpo            GRPO: accuracy + format + language consistency
    DIR/r1_3_rejection       best-of-N verified samples of stage 2 + general text -> data.jsonl
    DIR/r1_4_sft             SFT from the BASE on data.jsonl
    DIR/r1_5_final           GRPO: accuracy + helpfulness (brevity) + harmlessness (forbidden words)
    DIR/report.md            held-out comparison (grpo_jax/report.py)

A stage is finished when its `DONE` marker exists (written after its final `params` or `data.jsonl`, and only when its
loop reached its last step); a restarted pipeline skips finished stages and the training loops resume an unfinished
one from its checkpoints. `DIR/stages.log` records every start and finish.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import evaluation
from grpo_jax import model as model_lib
from grpo_jax import r1_rewards
from grpo_jax import sampling
from grpo_jax import sharding
from grpo_jax import state as state_lib
from grpo_jax import train
from grpo_jax.tasks import base, cot
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import registry as task_registry
from grpo_jax.tasks import tokenizer as tok_lib

STAGES = ("base", "r1_zero", "r1_1_cold_start", "r1_2_grpo", "r1_3_rejection", "r1_4_sft", "r1_5_final")
# Logged as weight-0 terms in every RL stage (train/reward/<name> each step) when the stage does not weight them.
TRACKED = ("format", "accuracy", "language", "recheck", "recheck_fixed", "brevity", "harmless")


# ------------------------------------------------------------------------------------------------ config helpers
def derive(config, updates: dict[str, Any]) -> ml_collections.ConfigDict:
  """An unlocked copy of `config` with `group -> {key: value}` updates (`rewards` is replaced whole)."""
  c = ml_collections.ConfigDict(config.to_dict())
  for group, vals in updates.items():
    if group == "rewards":
      c.rewards = tuple((str(n), float(w)) for n, w in vals)
    else:
      c[group].update(vals)
  return c


def stage_rewards(weighted: Sequence[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
  """The stage's weighted terms, then every other TRACKED term at weight 0 (computed and logged, not rewarded)."""
  names = [n for n, _ in weighted]
  return tuple((n, float(w)) for n, w in weighted) + tuple((n, 0.0) for n in TRACKED if n not in names)


def validate(config) -> None:
  """Pipeline keys, checked before anything compiles (train.py validates the shared keys per stage)."""
  from grpo_jax import validate as v
  r1 = config.r1
  for k in ("pretrain.steps", "pretrain.batch", "zero.steps", "cold_start.examples", "cold_start.steps",
            "cold_start.batch", "grpo.steps", "rejection.prompts", "rejection.n", "rejection.keep_per_prompt",
            "sft2.steps", "sft2.batch", "final.steps", "report.size", "report.batch", "report.n_samples"):
    v._positive_int(config, "r1." + k)
  for k in ("pretrain.template_frac", "pretrain.tag_frac", "pretrain.mix_frac", "pretrain.mistake_frac",
            "pretrain.noise_frac", "cold_start.mistake_frac", "rejection.general_frac"):
    v._prob(config, "r1." + k)
  if r1.rejection.general_frac >= 1:
    v._fail("r1.rejection.general_frac", "must be < 1: the SFT set needs some rejection-sampled reasoning.")
  if config.task.name not in task_registry.names("worked_solutions"):
    v._fail("task.name", f"the R1 pipeline needs reference worked solutions; use one of "
            f"{task_registry.names('worked_solutions')}.")
  known = set(TRACKED)
  for stage in ("zero", "grpo", "final"):
    for name, _ in r1[stage].rewards:
      if name not in known:
        v._fail(f"r1.{stage}.rewards", f"unknown term {name!r}; choose from {sorted(known)}.")
  r1_rewards.make_harmless(tuple(r1.forbidden))  # raises on a bad word list
  stages = tuple(r1.stages)
  if not stages or any(s not in STAGES for s in stages) or list(stages) != sorted(stages, key=STAGES.index):
    v._fail("r1.stages", f"{stages!r} must be stage names in pipeline order, from {STAGES}.")
  if r1.report.batch % r1.report.n_samples or r1.report.size % r1.report.batch:
    v._fail("r1.report.batch", "must divide r1.report.size and be a multiple of r1.report.n_samples.")
  if r1.rejection.n > r1.report.batch:
    v._fail("r1.rejection.n", f"must be <= r1.report.batch={r1.report.batch} (one generate batch).")


# --------------------------------------------------------------------------------------------------- documents
def _other(lang: str) -> str:
  return "b" if lang == "a" else "a"


def mixed_solution(ex: dict, lang: str, mistake: bool, tagged: bool, switch_at: int) -> str:
  """Worked solution whose steps from index `switch_at` on (and the ending) are in the other language."""
  own = cot.solution(ex, lang, mistake, tagged).split(";")
  other = cot.solution(ex, _other(lang), mistake, tagged).split(";")
  return ";".join(own[:switch_at] + other[switch_at:])


def insert_word(text: str, word: str, at: int) -> str:
  """`word` placed before step `at` (>= 1, so a tagged text still starts with <think>)."""
  parts = text.split(";")
  parts[at] = f" {word}{parts[at]}"
  return ";".join(parts)


def pretrain_document(task, ex: dict, lang: str, rng: np.random.Generator, p) -> tuple[str, str]:
  """(head, tail) text of one pre-training document; head is the R1-Zero prompt for web-like chat transcripts.

  Plain documents (1 - template_frac): question + untagged worked solution. Chat transcripts (template_frac): the
  R1-Zero prompt + a worked solution that uses the tags with probability tag_frac. Any document may switch
  language mid-solution (mix_frac), carry an err-recheck-correct step (mistake_frac), or a forbidden word
  (noise_frac): the raw web text that R1's later stages clean up.
  """
  template = rng.random() < p.template_frac
  tagged = template and rng.random() < p.tag_frac
  mistake = bool(rng.random() < p.mistake_frac)
  n_parts = len(cot.solution(ex, lang, mistake, tagged).split(";"))
  switch = int(rng.integers(1, n_parts)) if rng.random() < p.mix_frac else n_parts
  body = mixed_solution(ex, lang, mistake, tagged, switch)
  if rng.random() < p.noise_frac and n_parts > 2:
    body = insert_word(body, str(rng.choice(list(p.forbidden))), int(rng.integers(1, n_parts - 1)))
  if template:
    return base.prompt(task, ex, lang), body
  return "", task.question(ex, lang) + " " + body


def pack(seqs: Sequence[tuple[list[int], list[int], bool]], tok, seq_len: int) -> dict[str, np.ndarray]:
  """Right-padded SFT batch from (head ids, tail ids, loss on head too); loss never on bos; eos ends each row."""
  n = len(seqs)
  tokens = np.full((n, seq_len), tok.pad_id, np.int32)
  mask = np.zeros((n, seq_len), np.int32)
  loss = np.zeros((n, seq_len), np.int32)
  for i, (head, tail, loss_on_head) in enumerate(seqs):
    ids = [tok.bos_id] + list(head) + list(tail) + [tok.eos_id]
    if len(ids) > seq_len:
      raise ValueError(f"model.max_len={seq_len} is too short for a {len(ids)}-token SFT sequence; raise it")
    tokens[i, :len(ids)] = ids
    mask[i, :len(ids)] = 1
    loss[i, (1 if loss_on_head else 1 + len(head)):len(ids)] = 1
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  return {"tokens_NxT": tokens, "positions_NxT": positions, "mask_NxT": mask, "loss_mask_NxT": loss}


def _epoch_order(n: int, seed: int, step: int, batch: int, what: str) -> np.ndarray:
  """Row order of batch `step`: a fresh permutation per epoch, seeded by (what, seed, epoch)."""
  pos = step * batch + np.arange(batch)
  out = np.empty(batch, np.int64)
  for e in np.unique(pos // n):
    sel = pos // n == e
    out[sel] = base.rng_for(what, seed, int(e)).permutation(n)[pos[sel] % n]
  return out


def pretrain_batches(config, tok, examples: list[dict]) -> Callable[[int], Iterator[dict]]:
  """start_step -> endless pre-training batches; each a pure function of (seed, step) so resuming is exact."""
  task = data_lib.make_task(config.task)
  p = ml_collections.ConfigDict(dict(config.r1.pretrain.to_dict(), forbidden=tuple(config.r1.forbidden)))
  batch = p.batch

  def gen(start: int):
    step = start
    while True:
      seqs = []
      for j, idx in enumerate(_epoch_order(len(examples), config.seed, step, batch, "pretrain")):
        rng = base.rng_for("pretrain_doc", config.seed, step, j)
        lang = base.LANGUAGES[int(rng.integers(2))]
        head, tail = pretrain_document(task, examples[idx], lang, rng, p)
        seqs.append((tok.encode(head) if head else [], tok.encode(tail), True))
      yield pack(seqs, tok, config.model.max_len)
      step += 1
  return gen


def cold_start_batches(config, tok, examples: list[dict]) -> Callable[[int], Iterator[dict]]:
  """The small cold-start set: the first `examples` train problems, tagged, single-language, loss on completion."""
  task = data_lib.make_task(config.task)
  cs = config.r1.cold_start
  chosen = examples[:cs.examples]
  fixed = []
  for ex in chosen:
    rng = base.rng_for("cold_start", config.seed, ex["index"])
    lang = base.LANGUAGES[int(rng.integers(2))] if config.task.language == "mixed" else config.task.language
    sol = cot.solution(ex, lang, mistake=bool(rng.random() < cs.mistake_frac))
    fixed.append((tok.encode(base.prompt(task, ex, lang)), tok.encode(sol), False))
  return _cycle(config, tok, fixed, cs.batch, "cold_start_order")


def _cycle(config, tok, seqs, batch: int, what: str) -> Callable[[int], Iterator[dict]]:
  def gen(start: int):
    step = start
    while True:
      yield pack([seqs[i] for i in _epoch_order(len(seqs), config.seed, step, batch, what)], tok,
                 config.model.max_len)
      step += 1
  return gen


def records_batches(config, tok, records: list[dict]) -> Callable[[int], Iterator[dict]]:
  """Stage 4's data: reasoning records (loss on the completion) and general text (loss on every token)."""
  seqs = [(r["prompt_ids"], r["completion_ids"], r["kind"] == "general") for r in records]
  return _cycle(config, tok, seqs, config.r1.sft2.batch, "sft2_order")


# ------------------------------------------------------------------------------------------- rejection sampling
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


def term_scores(texts, ids, batch, fns: dict, acc_N, fmt_N) -> dict[str, np.ndarray]:
  """Every TRACKED term for host-side completions (accuracy/format from the in-graph verifiers)."""
  out = {"accuracy": np.asarray(acc_N, np.float32), "format": np.asarray(fmt_N, np.float32)}
  for name in TRACKED:
    if name not in out:
      out[name] = np.asarray(fns[name](texts, ids, batch), np.float32)
  return out


def weighted(scores: dict[str, np.ndarray], rewards: Sequence[tuple[str, float]]) -> np.ndarray:
  return sum(float(w) * scores[n] for n, w in rewards)


def abstract_params(mesh, mcfg):
  param_sh = sharding.tree_shardings(mesh, model_lib.param_axes(mcfg))
  abstract = jax.eval_shape(lambda: model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, param_sh)


def completions_of(tokens_NxL, mask_NxL, eos: int) -> list[tuple[int, ...]]:
  """Completion ids without the EOS (pack() appends it again)."""
  out = []
  for t, m in zip(tokens_NxL, mask_NxL):
    ids = [int(x) for x in t[m > 0]]
    out.append(tuple(ids[:-1] if ids and ids[-1] == eos else ids))
  return out


def rejection_sample(config, params_path: str, out_path: str) -> dict[str, float]:
  """Stage 3: N samples per train prompt from the stage-2 policy; best-of-N verified ones + general text."""
  rj, tok = config.r1.rejection, tok_lib.load()
  mesh, mcfg = sharding.make_mesh(config.mesh), model_lib.ModelConfig.from_config(config.model)
  params = ckpt_lib.load_params(params_path, abstract_params(mesh, mcfg))
  task = data_lib.make_task(config.task)
  examples = data_lib.load_examples(config.task, "train")
  pick = base.rng_for("rejection_prompts", config.seed).permutation(len(examples))[:rj.prompts]
  chosen = [examples[i] for i in pick]
  lang_rng = base.rng_for("rejection_lang", config.seed)
  langs = (lang_rng.integers(0, 2, len(chosen)) if config.task.language == "mixed"
           else np.full(len(chosen), base.LANGUAGES.index(config.task.language))).astype(np.int32)
  scfg = sampling.SamplingConfig(temperature=rj.temperature, top_k=0, top_p=1.0,
                                 max_new_tokens=config.sampling.max_new_tokens, greedy=False,
                                 eos_id=tok.eos_id, pad_id=tok.pad_id)
  gen = evaluation.make_generate(mcfg, scfg, mesh, config.task.name, tok.tag_ids)
  fns = r1_rewards.python_fns(config.sampling.max_new_tokens, tuple(config.r1.forbidden))
  per_chunk = config.r1.report.batch // rj.n
  records, n_samples, n_correct = [], 0, 0
  rng = jax.random.PRNGKey(config.seed + 3)
  for c0 in range(0, len(chosen), per_chunk):
    exs, lg = chosen[c0:c0 + per_chunk], langs[c0:c0 + per_chunk]
    pad = per_chunk - len(exs)  # fixed shapes: the last chunk repeats its first prompt, extra rows are dropped
    exs_p, lg_p = exs + [exs[0]] * pad, np.concatenate([lg, np.repeat(lg[:1], pad)])
    b = data_lib._rl_batch(task, exs_p, lg_p, tok, config.task.prompt_len)
    rep = {k: np.repeat(v, rj.n, axis=0) for k, v in b.items()}
    fields = {k: v for k, v in rep.items() if k not in ("prompt_NxP", "prompt_mask_NxP")}
    tokens, mask, _, acc, fmt = jax.device_get(gen(params, rep["prompt_NxP"], rep["prompt_mask_NxP"], fields,
                                                   jax.random.fold_in(rng, c0)))
    comps = completions_of(tokens, mask, tok.eos_id)
    texts = [tok.decode(c) for c in comps]
    scores = term_scores(texts, comps, fields, fns, acc, fmt)
    reward = weighted(scores, config.r1.grpo.rewards)
    for q in range(len(exs)):
      rows = slice(q * rj.n, (q + 1) * rj.n)
      n_samples += rj.n
      n_correct += int((acc[rows] > 0.5).sum())
      for i in select_samples(reward[rows], acc[rows], fmt[rows], comps[rows], rj.keep_per_prompt):
        k = q * rj.n + i
        records.append({"kind": "reasoning", "index": int(exs[q]["index"]), "language": base.LANGUAGES[int(lg[q])],
                        "prompt_ids": tok.encode(base.prompt(task, exs[q], base.LANGUAGES[int(lg[q])])),
                        "completion_ids": list(comps[k]), "text": texts[k], "reward": float(reward[k])})
  n_reason = len(records)
  if n_reason == 0:
    raise RuntimeError("rejection sampling kept no sample (no verified-correct, well-formed completion); train "
                       "stage 2 longer (r1.grpo.steps) or sample more (r1.rejection.n)")
  n_general = int(round(n_reason * rj.general_frac / (1 - rj.general_frac)))
  g_rng = base.rng_for("general", config.seed)
  for j in g_rng.permutation(len(examples))[:n_general]:
    ex = examples[int(j)]
    lang = base.LANGUAGES[int(g_rng.integers(2))] if config.task.language == "mixed" else config.task.language
    text = task.question(ex, lang) + " " + cot.solution(ex, lang, tagged=False)
    records.append({"kind": "general", "index": int(ex["index"]), "language": lang, "prompt_ids": [],
                    "completion_ids": tok.encode(text), "text": text, "reward": 0.0})
  tmp = out_path + ".tmp"
  with open(tmp, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, out_path)  # the stage counts as done only once the whole file exists
  stats = {"prompts": len(chosen), "samples": n_samples, "correct_frac": n_correct / max(n_samples, 1),
           "kept_reasoning": n_reason, "general": n_general}
  with open(os.path.join(os.path.dirname(out_path), "stats.json"), "w") as f:
    json.dump(stats, f, indent=2)
  return stats


def read_records(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------------------------------------------ stages
def _log(workdir: str, stage: str, event: str) -> None:
  with open(os.path.join(workdir, "stages.log"), "a") as f:
    f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {stage} {event}\n")


DONE = "DONE"


def stage_done(workdir: str, stage: str) -> bool:
  """A stage is finished once its DONE marker exists (written after its params / data.jsonl, never before)."""
  return os.path.exists(os.path.join(workdir, stage, DONE))


def checkpointed_steps(stage_dir: str) -> int:
  """The newest committed checkpoint step of an SFT/RL stage (0 if none): tells a finished loop from a preempted one
  (train.py's loops return normally after SIGTERM, and run_sft writes `params` even then)."""
  d = os.path.join(stage_dir, "checkpoints")
  if not os.path.isdir(d):
    return 0
  return max((int(n) for n in os.listdir(d) if n.isdigit() and os.path.exists(os.path.join(d, n, "commit_success.txt"))),
             default=0)


def _expected_steps(config, stage: str) -> int | None:
  r1 = config.r1
  return {"base": r1.pretrain.steps, "r1_zero": r1.zero.steps, "r1_1_cold_start": r1.cold_start.steps,
          "r1_2_grpo": r1.grpo.steps, "r1_4_sft": r1.sft2.steps, "r1_5_final": r1.final.steps}.get(stage)


def _sft_config(config, steps: int, batch: int, lr: float, warmup: int):
  # No in-loop eval for SFT stages: the report evaluates every stage's final params the same way.
  return derive(config, {"sft": dict(steps=steps, batch=batch, lr=lr, warmup_steps=warmup, init_from="")})


def _rl(config, wd: str, init_from: str, steps: int, rewards) -> None:
  c = derive(config, {"train": dict(steps=steps, init_from=""), "rewards": stage_rewards(rewards)})
  train.run_rl(c, wd, init_from=init_from,
               python_fns=r1_rewards.python_fns(config.sampling.max_new_tokens, tuple(config.r1.forbidden)))
  if checkpointed_steps(wd) < steps:
    return  # preempted (SIGTERM): no final params; run_pipeline stops and a rerun resumes this stage
  # run_rl force-saves its last step; the stage's final params are that step's policy.
  mcfg = model_lib.ModelConfig.from_config(config.model)
  params = ckpt_lib.restore_params_only(os.path.join(wd, "checkpoints"),
                                        abstract_params(sharding.make_mesh(config.mesh), mcfg))
  ckpt_lib.save_params(os.path.join(wd, "params"), params)


def _params(workdir: str, stage: str) -> str:
  return os.path.join(workdir, stage, "params")


def _run_stage(config, workdir: str, stage: str) -> None:
  r1, wd, tok = config.r1, os.path.join(workdir, stage), tok_lib.load()
  if stage == "base":
    p = r1.pretrain
    train.run_sft(_sft_config(config, p.steps, p.batch, p.lr, p.warmup_steps), wd, loss_on="all",
                  batches=pretrain_batches(config, tok, data_lib.load_examples(config.task, "train")),
                  evaluate_at_end=False)
  elif stage == "r1_zero":
    _rl(config, wd, _params(workdir, "base"), r1.zero.steps, r1.zero.rewards)
  elif stage == "r1_1_cold_start":
    cs = r1.cold_start
    train.run_sft(_sft_config(config, cs.steps, cs.batch, cs.lr, cs.warmup_steps), wd, loss_on="completion",
                  init_from=_params(workdir, "base"),
                  batches=cold_start_batches(config, tok, data_lib.load_examples(config.task, "train")),
                  evaluate_at_end=False)
  elif stage == "r1_2_grpo":
    _rl(config, wd, _params(workdir, "r1_1_cold_start"), r1.grpo.steps, r1.grpo.rewards)
  elif stage == "r1_3_rejection":
    os.makedirs(wd, exist_ok=True)
    stats = rejection_sample(config, _params(workdir, "r1_2_grpo"), os.path.join(wd, "data.jsonl"))
    logging.info("rejection sampling: %s", stats)
  elif stage == "r1_4_sft":
    s2 = r1.sft2
    records = read_records(os.path.join(workdir, "r1_3_rejection", "data.jsonl"))
    train.run_sft(_sft_config(config, s2.steps, s2.batch, s2.lr, s2.warmup_steps), wd, loss_on="completion",
                  init_from=_params(workdir, "base"), batches=records_batches(config, tok, records),
                  evaluate_at_end=False)
  elif stage == "r1_5_final":
    _rl(config, wd, _params(workdir, "r1_4_sft"), r1.final.steps, r1.final.rewards)
  else:
    raise ValueError(f"stage={stage!r} is unknown; use one of {STAGES}")


def run_pipeline(config, workdir: str, stages: Sequence[str] | None = None) -> dict:
  """Runs every unfinished stage of `config.r1.stages` in order, then evaluates all models -> DIR/report.md."""
  from grpo_jax import report
  validate(config)
  stages = tuple(config.r1.stages) if stages is None else tuple(stages)
  os.makedirs(workdir, exist_ok=True)
  for stage in stages:
    if stage_done(workdir, stage):
      logging.info("stage %s: finished earlier, skipped", stage)
      continue
    _log(workdir, stage, "start")
    t0 = time.perf_counter()
    _run_stage(config, workdir, stage)
    expected = _expected_steps(config, stage)
    if expected is not None and checkpointed_steps(os.path.join(workdir, stage)) < expected:
      _log(workdir, stage, "stopped")
      logging.warning("stage %s stopped before step %d (preempted); rerun the same command to resume it.", stage,
                      expected)
      return {}
    with open(os.path.join(workdir, stage, DONE), "w") as f:
      f.write(f"{time.perf_counter() - t0:.1f}\n")
    _log(workdir, stage, f"done {time.perf_counter() - t0:.1f}s")
  return report.write_report(config, workdir)
