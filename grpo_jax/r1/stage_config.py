"""The config each R1 stage runs with, derived from the run config's `r1` group, and its validation.

A stage's SFT or RL loop (train.run_sft / run_rl) reads the shared keys (`sft.*`, `train.steps`, `rewards`, ...);
`stage_config` writes the stage's `r1.<stage>` values into them, so every stage sees one plain config.
"""
from __future__ import annotations

from typing import Any

import ml_collections

from grpo_jax.config import config_lib
from grpo_jax.rl import auto
from grpo_jax.rl import memory_plan
from grpo_jax.run import run_config
from grpo_jax.run import validate as validate_lib
from grpo_jax.r1 import corpus
from grpo_jax.r1 import layout
from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.tasks import cot
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import registry as task_registry
from grpo_jax.tasks import tokenizer_factory as tok_lib

SFT_STAGES = {"base": "pretrain", "r1_1_cold_start": "cold_start", "r1_4_sft": "sft2"}  # stage -> r1 group
RL_STAGES = {"r1_zero": "zero", "r1_2_grpo": "grpo", "r1_5_final": "final"}
# The keys the validation below checks, by kind.
_POSITIVE = ("pretrain.steps", "pretrain.batch", "zero.steps", "cold_start.examples", "cold_start.steps",
             "cold_start.batch", "grpo.steps", "rejection.prompts", "rejection.n", "rejection.keep_per_prompt",
             "sft2.steps", "sft2.batch", "final.steps")
_PROBS = ("pretrain.template_frac", "pretrain.tag_frac", "pretrain.mix_frac", "pretrain.mistake_frac",
          "pretrain.noise_frac", "pretrain.cot_frac", "pretrain.verify_frac", "pretrain.tool_frac",
          "cold_start.mistake_frac",
          "rejection.general_frac", "rejection.general_noise_frac")


def derive(config, updates: dict[str, Any]) -> ml_collections.ConfigDict:
  """An unlocked copy of `config` with `group -> {key: value}` updates (`rewards` is replaced whole)."""
  c = ml_collections.ConfigDict(config.to_dict())
  for group, vals in updates.items():
    if group == "rewards":
      c.rewards = tuple((str(n), float(w)) for n, w in vals)
    else:
      c[group].update(vals)
  return c


def expected_steps(config, stage: str) -> int | None:
  """The last step of an SFT/RL stage's loop (None for rejection sampling, which has no loop)."""
  group = SFT_STAGES.get(stage) or RL_STAGES.get(stage)
  return None if group is None else config.r1[group].steps


def for_stage(config, stage: str) -> ml_collections.ConfigDict:
  """The config `stage` runs with. SFT stages: `sft.*` from their group, with no in-loop eval (the report evaluates
  every stage's final params the same way). RL stages: their steps, and their reward mix with every other tracked
  term at weight 0 (with tools.env, 'env' too). Rejection sampling reads `r1.rejection` from the run config itself."""
  if stage in SFT_STAGES:
    p = config.r1[SFT_STAGES[stage]]
    return derive(config, {"sft": dict(steps=p.steps, batch=p.batch, lr=p.lr, warmup_steps=p.warmup_steps,
                                       init_from="")})
  if stage in RL_STAGES:
    p = config.r1[RL_STAGES[stage]]
    env = config.get("tools") is not None and bool(config.tools.env)  # every RL stage runs the environment
    updates = {"train": dict(steps=p.steps, init_from=""), "rewards": r1_rewards.stage_rewards(p.rewards, env)}
    updates.update(_rl_knobs(p))
    return derive(config, updates)
  if stage in layout.STAGES:
    return config
  raise ValueError(f"stage={stage!r} is unknown; use one of {layout.STAGES}")


def _rl_knobs(p) -> dict[str, dict]:
  """An RL stage group's own lr / beta / reward_norm (r1.final has them), where set: 0 / -1 / '' inherit the run's
  optim.lr / rl.beta / rl.reward_norm, so a stage without them runs with the run config's values."""
  out: dict[str, dict] = {}
  if p.get("lr", 0.0) > 0:
    out["optim"] = {"lr": float(p.lr)}
  rl = {}
  if p.get("beta", -1.0) >= 0:
    rl["beta"] = float(p.beta)
  if p.get("reward_norm", ""):
    rl["reward_norm"] = str(p.reward_norm)
  if rl:
    out["rl"] = rl
  return out


def for_heldout(config) -> ml_collections.ConfigDict:
  """The report's evaluation: `eval.*` set from `r1.report` (evaluation.Evaluator reads `eval`)."""
  rep = config.r1.report
  return derive(config, {"eval": dict(size=rep.size, batch=rep.batch, n_samples=rep.n_samples,
                                      pass_k=tuple(rep.pass_k))})


# The run-config keys for_stage overwrites in every stage it derives, and where each stage's value comes from: set in
# the run config they changed nothing (train.init_from=hf:<dir> still pre-trained a base from a random init).
_OVERWRITTEN = {"train.steps": "each RL stage runs r1.zero / grpo / final.steps",
                "rewards": "each RL stage weights r1.zero / grpo / final.rewards",
                **{f"sft.{k}": f"each SFT stage takes r1.pretrain / cold_start / sft2.{k}"
                   for k in ("steps", "batch", "lr", "warmup_steps")},
                "train.init_from": "the base is pre-trained here or copied with r1.base_from, and every later stage "
                                   "starts from an earlier stage's params",
                "sft.init_from": "the base is pre-trained here or copied with r1.base_from",
                "sft.loss_on": "the base's loss is on every token, the other SFT stages' on the completion",
                "sft.mistake_frac": "each SFT stage writes its own data: r1.pretrain / cold_start.mistake_frac"}


def _unread_keys_at_default(config) -> None:
  default = run_config.flatten(config_lib.defaults())
  flat = run_config.flatten(config)
  for key, instead in _OVERWRITTEN.items():
    if flat.get(key) != default.get(key):
      validate_lib.fail(key, f"is {flat.get(key)!r}, but job r1_pipeline does not read it ({instead}); drop it.")


def _cold_start_fits(config, tok) -> None:
  """The cold-start set is fixed (its first r1.cold_start.examples train problems), so it is checked whole: more
  examples than the split holds, or a sequence longer than model.max_len (a traceback at stage 1, after the base and
  R1-Zero had trained; model.max_len cannot change under finished stages)."""
  examples = data_lib.load_examples(config.task, "train")
  if config.r1.cold_start.examples > len(examples):  # the set took the train split whole, silently smaller
    validate_lib.fail("r1.cold_start.examples", f"{config.r1.cold_start.examples} exceeds the {len(examples)} train "
                      "examples; lower it or raise task.train_size.")
  seqs = corpus.cold_start_set(config, tok, examples)
  longest = max((corpus.packed_len(h, t) for h, t, _ in seqs), default=0)
  if longest > config.model.max_len:
    validate_lib.fail("model.max_len", f"{config.model.max_len} tokens are too few for the cold-start set (stage "
                      f"r1_1_cold_start): its longest sequence is {longest} (bos + prompt + tagged worked solution + "
                      f"eos); set model.max_len={longest} or more, or lower r1.cold_start.examples.")


def _rejection_env(config) -> None:
  """Rejection sampling with tools.env runs the environment as the RL stages do (r1/rejection.py): the continuous
  engine (auto picks it), on the task's R1-Zero prompts (the plain format)."""
  engine = config.sampling.get("engine", "auto")
  if engine not in ("continuous", "auto"):
    validate_lib.fail("sampling.engine", f"{engine!r}: rejection sampling (r1_3_rejection) with tools.env="
                      f"{config.tools.env!r} pauses rows for the environment in the continuous engine's slots; set "
                      "sampling.engine='continuous' (or auto), or tools.env=''.")
  if config.tools.format != "plain":
    validate_lib.fail("tools.format", f"{config.tools.format!r}: rejection sampling (r1_3_rejection) samples the "
                      "task's R1-Zero prompts, not the chat template rendered with the tools; use "
                      "tools.format='plain'.")


def validate(config, stages) -> None:
  """The `r1` keys, and the config of every stage in `stages`, checked before anything compiles."""
  r1 = config.r1
  _unread_keys_at_default(config)
  for k in _POSITIVE:
    validate_lib.positive_int(config, "r1." + k)
  for k in _PROBS:
    validate_lib.prob(config, "r1." + k)
  validate_lib.learning_rate(config, "r1.final.lr", inherit="optim.lr")
  if not (validate_lib.finite(r1.final.beta) and (r1.final.beta >= 0 or r1.final.beta == -1)):
    validate_lib.fail("r1.final.beta", f"must be >= 0, or -1 for rl.beta; got {r1.final.beta!r}.")
  if not (validate_lib.integer(r1.pretrain.seq_len) and r1.pretrain.seq_len >= 0):
    validate_lib.fail("r1.pretrain.seq_len", f"must be an int >= 0 (0 = model.max_len), got {r1.pretrain.seq_len!r}.")
  if r1.pretrain.seq_len > config.model.max_len:
    validate_lib.fail("r1.pretrain.seq_len", f"={r1.pretrain.seq_len} exceeds model.max_len={config.model.max_len}; "
                      "lower it or raise model.max_len.")
  # .get: a run config written before the knobs existed (its documents were "document" / "repeat")
  per, style = r1.pretrain.get("recheck_per", "document"), r1.pretrain.get("recheck_style", "repeat")
  if per not in ("document", "step"):
    validate_lib.fail("r1.pretrain.recheck_per", f"must be 'document' or 'step', got {per!r}.")
  if style not in cot.RECHECK_STYLES:
    validate_lib.fail("r1.pretrain.recheck_style", f"must be one of {cot.RECHECK_STYLES}, got {style!r}.")
  if per == "step" and r1.pretrain.mistake_frac + r1.pretrain.verify_frac > 1:
    validate_lib.fail("r1.pretrain.verify_frac", "with recheck_per 'step', mistake_frac + verify_frac is a per-step "
                      f"probability and must be <= 1; got {r1.pretrain.mistake_frac} + {r1.pretrain.verify_frac}.")
  if r1.pretrain.tool_frac > 0 and (r1.pretrain.mistake_frac > 0 or r1.pretrain.verify_frac > 0):
    validate_lib.fail("r1.pretrain.tool_frac", "a step written with a calculator call is written right once: it "
                      "cannot also carry a mistake or a re-check; set r1.pretrain.mistake_frac = verify_frac = 0, or "
                      "tool_frac = 0.")
  if r1.pretrain.tool_frac > 0 and config.tools.format != "plain":
    validate_lib.fail("tools.format", f"{config.tools.format!r}: pre-training documents write calculator calls in "
                      "the plain format only (r1.pretrain.tool_frac > 0); set tools.format='plain'.")
  if config.get("tools") is not None and config.tools.env and "r1_3_rejection" in tuple(stages):
    _rejection_env(config)
  if r1.rejection.general_frac >= 1:
    validate_lib.fail("r1.rejection.general_frac", "must be < 1: the SFT set needs some rejection-sampled reasoning.")
  if config.task.get("prompt_format", "r1_zero") != "r1_zero":  # the RL stages asked in chat, the rest in R1-Zero
    validate_lib.fail("task.prompt_format", f"{config.task.prompt_format!r}: the R1 pipeline's pre-training, "
                      "cold-start and rejection-sampled text is written in the R1-Zero template; set it to "
                      "'r1_zero'.")
  if config.task.name not in task_registry.names("worked_solutions"):
    validate_lib.fail("task.name", "the R1 pipeline needs reference worked solutions; use one of "
                      f"{task_registry.names('worked_solutions')}.")
  for group in RL_STAGES.values():
    validate_lib.reward_terms(f"r1.{group}.rewards", r1[group].rewards)
    for name, _ in r1[group].rewards:
      if name not in r1_rewards.KNOWN:
        validate_lib.fail(f"r1.{group}.rewards", f"unknown term {name!r}; choose from {sorted(r1_rewards.KNOWN)}.")
      if name == r1_rewards.ENV and not (config.get("tools") is not None and config.tools.env):
        # every group, whichever stages run: r1.grpo.rewards also ranks stage 3's samples
        validate_lib.fail(f"r1.{group}.rewards", "names the 'env' term (the environment's rewards) but tools.env "
                          "is ''; set tools.env or drop ('env', w).")
  try:
    r1_rewards.make_harmless(tuple(r1.forbidden))
  except ValueError as e:
    validate_lib.fail("r1.forbidden", str(e))
  stages = tuple(stages)
  known = all(s in layout.STAGES for s in stages)
  if not stages or not known or list(stages) != sorted(stages, key=layout.STAGES.index):
    validate_lib.fail("r1.stages", f"{stages!r} must be stage names in pipeline order, from {layout.STAGES}.")
  n_dev, tok = validate_lib.device_count(), tok_lib.for_config(config)
  mesh = validate_lib.validate_mesh(config, n_dev)
  validate_lib.validate_eval(config, mesh["data"] * mesh["fsdp"], group="r1.report")
  if r1.rejection.n > r1.report.batch:
    validate_lib.fail("r1.rejection.n", f"must be <= r1.report.batch={r1.report.batch} (one generate batch).")
  rows, data_par = r1.report.batch // r1.rejection.n * r1.rejection.n, mesh["data"] * mesh["fsdp"]
  if rows % data_par:
    validate_lib.fail("r1.rejection.n", f"a rejection-sampling batch holds r1.report.batch // n * n = {rows} rows, "
                      f"which mesh data*fsdp={data_par} must divide; pick n dividing r1.report.batch.")
  validate_lib.positive_finite(config, "r1.rejection.temperature",
                             "the rejection sampler's temperature: softmax(logits / temperature)")
  validate_lib.temperature(config, "r1.rejection.temperature")
  if "r1_1_cold_start" in stages:
    _cold_start_fits(config, tok)
  for stage in stages:
    if stage not in SFT_STAGES and stage not in RL_STAGES:
      continue
    check = validate_lib.validate_sft if stage in SFT_STAGES else validate_lib.validate_rl
    try:
      check(for_stage(config, stage), n_dev, tok)
      if stage in RL_STAGES:  # rl.minibatches / rl.rollout_chunks = auto that nothing fits: now, not stages later
        auto.check_choosable(for_stage(config, stage), mesh, validate_lib.device_memory())
      else:  # an SFT stage's batch that no device holds, as well
        memory_plan.check_sft_fits(for_stage(config, stage), mesh, validate_lib.device_memory())
    except validate_lib.ConfigError as e:
      taken = (f"sft.steps/batch/lr/warmup_steps from r1.{SFT_STAGES[stage]}" if stage in SFT_STAGES
               else f"train.steps and rewards from r1.{RL_STAGES[stage]}"
               + (", optim.lr / rl.beta / rl.reward_norm from r1.final.lr / beta / reward_norm where set"
                  if stage == "r1_5_final" else ""))
      raise validate_lib.ConfigError(f"{str(e).rstrip('.')} (stage {stage} takes {taken}).") from None
