"""Where each R1 stage writes in DIR, and when a stage counts as finished.

    DIR/base                 pre-training on raw task text (tag-free, except a stated web-like fraction)
    DIR/r1_zero              GRPO from the base: format + accuracy
    DIR/r1_1_cold_start      SFT from the base on a small formatted, single-language set
    DIR/r1_2_grpo            GRPO: accuracy + format + language consistency
    DIR/r1_3_rejection       best-of-N verified samples of stage 2 + general text -> data.jsonl, stats.json
    DIR/r1_4_sft             SFT from the BASE on data.jsonl
    DIR/r1_5_final           GRPO: accuracy + helpfulness (brevity of verified answers) + harmlessness (no forbidden word)
    DIR/stages.log           a `start`, then `done <seconds>` or `stopped` line per stage execution
    DIR/report.md, .json     held-out comparison of every model (r1/report.py)

A stage is finished once DIR/<stage>/stage.json says so (grpo_jax/run/stages.py): written after its final `params`
(stage 3: `data.jsonl`), never for a stage stopped by a signal, and holding the config the stage ran with. A `DONE`
marker from older versions also counts.
"""
from __future__ import annotations

import os

from grpo_jax.config import config_lib
from grpo_jax.run import stages

STAGES = config_lib.R1_STAGES  # declared with the config's r1.stages (generic code does not import r1/)
# The stages that end in a model (every one but rejection sampling), in report column order.
MODELS = tuple(s for s in STAGES if s != "r1_3_rejection")
LABELS = {"base": "base", "r1_zero": "R1-Zero", "r1_1_cold_start": "R1 s1 cold-start", "r1_2_grpo": "R1 s2 GRPO",
          "r1_4_sft": "R1 s4 SFT", "r1_5_final": "R1 s5 final"}


def stage_dir(workdir: str, stage: str) -> str:
  return os.path.join(workdir, stage)


def params_path(workdir: str, stage: str) -> str:
  """A model stage's final params (`params_ckpt.save_params`), the next stages' starting point."""
  return os.path.join(workdir, stage, "params")


def rejection_data(workdir: str) -> str:
  return os.path.join(workdir, "r1_3_rejection", "data.jsonl")


def rejection_stats(workdir: str) -> str:
  """Written beside data.jsonl by rejection sampling."""
  return os.path.join(workdir, "r1_3_rejection", "stats.json")


def stage_done(workdir: str, stage: str) -> bool:
  return stages.is_done(stages.Stage(stage, stage_dir(workdir, stage), {}))


def checkpointed_steps(stage_dir: str) -> int:
  """The newest committed checkpoint step of an SFT/RL stage (0 if none)."""
  return stages.newest_step(stage_dir)


def log_event(workdir: str, stage: str, event: str) -> None:
  stages.log_event(workdir, stage, event)
