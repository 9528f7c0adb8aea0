"""R1-Zero and R1's five stages as one resumable command (`config.job = "r1_pipeline"`); layout in r1/layout.py.

A restarted pipeline skips finished stages (their DONE marker exists) and the training loops resume an unfinished
one from its checkpoints. A stage whose loop stopped before its last step (SIGTERM: train.py's loops return
normally, and run_sft writes `params` even then) is logged `stopped`, gets no DONE marker, and the pipeline returns.
"""
from __future__ import annotations

import os
import time
from typing import Sequence

from absl import logging

from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import model as model_lib
from grpo_jax import sharding
from grpo_jax import state as state_lib
from grpo_jax import train
from grpo_jax.r1 import corpus
from grpo_jax.r1 import layout
from grpo_jax.r1 import rejection
from grpo_jax.r1 import report
from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.r1 import stage_config
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer as tok_lib

# What each stage starts from ("" = a random init); SFT stages also say which tokens carry the loss.
_SFT = {"base": ("", "all"), "r1_1_cold_start": ("base", "completion"), "r1_4_sft": ("base", "completion")}
_RL_INIT = {"r1_zero": "base", "r1_2_grpo": "r1_1_cold_start", "r1_5_final": "r1_4_sft"}


def _sft_batches(config, tok, workdir: str, stage: str) -> corpus.Batches:
  if stage == "r1_4_sft":
    return corpus.records_batches(config, tok, corpus.read_records(layout.rejection_data(workdir)))
  examples = data_lib.load_examples(config.task, "train")
  if stage == "base":
    return corpus.pretrain_batches(config, tok, examples)
  return corpus.cold_start_batches(config, tok, examples)


def _run_rl(config, workdir: str, stage: str) -> None:
  c, wd = stage_config.for_stage(config, stage), layout.stage_dir(workdir, stage)
  train.run_rl(c, wd, init_from=layout.params_path(workdir, _RL_INIT[stage]), python_fns=r1_rewards.config_fns(c))
  if layout.checkpointed_steps(wd) < c.train.steps:
    return  # preempted: no final params; run_pipeline stops and a rerun resumes this stage
  # run_rl force-saves its last step; the stage's final params are that step's policy.
  abstract = state_lib.abstract_params(sharding.make_mesh(c.mesh), model_lib.ModelConfig.from_config(c.model))
  params = ckpt_lib.restore_params_only(os.path.join(wd, "checkpoints"), abstract)
  ckpt_lib.save_params(layout.params_path(workdir, stage), params)


def _run_stage(config, workdir: str, stage: str) -> None:
  if stage in _SFT:
    init, loss_on = _SFT[stage]
    c = stage_config.for_stage(config, stage)
    train.run_sft(c, layout.stage_dir(workdir, stage), loss_on=loss_on,
                  init_from=layout.params_path(workdir, init) if init else "",
                  batches=_sft_batches(c, tok_lib.for_config(c), workdir, stage), evaluate_at_end=False)
  elif stage in _RL_INIT:
    _run_rl(config, workdir, stage)
  elif stage == "r1_3_rejection":
    os.makedirs(layout.stage_dir(workdir, stage), exist_ok=True)
    stats = rejection.rejection_sample(config, layout.params_path(workdir, "r1_2_grpo"), layout.rejection_data(workdir))
    logging.info("rejection sampling: %s", stats)
  else:
    raise ValueError(f"stage={stage!r} is unknown; use one of {layout.STAGES}")


def run_pipeline(config, workdir: str, stages: Sequence[str] | None = None, report_md: bool = True) -> dict:
  """Runs every unfinished stage of `stages` (default `config.r1.stages`) in order, then evaluates every finished
  model -> DIR/report.md (unless report_md=False, e.g. when only a stage's params are wanted). Returns the report's
  results, or {} when a stage was preempted or no report was asked for."""
  stages = tuple(config.r1.stages) if stages is None else tuple(stages)
  stage_config.validate(config, stages)
  os.makedirs(workdir, exist_ok=True)
  for stage in stages:
    if layout.stage_done(workdir, stage):
      logging.info("stage %s: finished earlier, skipped", stage)
      continue
    layout.log_event(workdir, stage, "start")
    t0 = time.perf_counter()
    _run_stage(config, workdir, stage)
    expected = stage_config.expected_steps(config, stage)
    if expected is not None and layout.checkpointed_steps(layout.stage_dir(workdir, stage)) < expected:
      layout.log_event(workdir, stage, "stopped")
      logging.warning("stage %s stopped before step %d (preempted); rerun the same command to resume it.", stage,
                      expected)
      return {}
    seconds = time.perf_counter() - t0
    layout.mark_done(workdir, stage, seconds)
    layout.log_event(workdir, stage, f"done {seconds:.1f}s")
  return report.write_report(config, workdir) if report_md else {}
