"""Where each R1 stage writes in DIR, and when a stage counts as finished.

    DIR/base                 pre-training on raw task text (tag-free, except a stated web-like fraction)
    DIR/r1_zero              GRPO from the base: format + accuracy
    DIR/r1_1_cold_start      SFT from the base on a small formatted, single-language set
    DIR/r1_2_grpo            GRPO: accuracy + format + language consistency
    DIR/r1_3_rejection       best-of-N verified samples of stage 2 + general text -> data.jsonl, stats.json
    DIR/r1_4_sft             SFT from the BASE on data.jsonl
    DIR/r1_5_final           GRPO: accuracy + helpfulness (brevity) + harmlessness (forbidden words)
    DIR/stages.log           a `start`, then `done <seconds>` or `stopped` line per stage execution
    DIR/report.md, .json     held-out comparison of every model (r1/report.py)

A stage is finished once DIR/<stage>/DONE exists: written after its final `params` (stage 3: `data.jsonl`), and only
when its loop reached its last step.
"""
from __future__ import annotations

import os
import time

STAGES = ("base", "r1_zero", "r1_1_cold_start", "r1_2_grpo", "r1_3_rejection", "r1_4_sft", "r1_5_final")
# The stages that end in a model (every one but rejection sampling), in report column order.
MODELS = tuple(s for s in STAGES if s != "r1_3_rejection")
LABELS = {"base": "base", "r1_zero": "R1-Zero", "r1_1_cold_start": "R1 s1 cold-start", "r1_2_grpo": "R1 s2 GRPO",
          "r1_4_sft": "R1 s4 SFT", "r1_5_final": "R1 s5 final"}
DONE = "DONE"


def stage_dir(workdir: str, stage: str) -> str:
  return os.path.join(workdir, stage)


def params_path(workdir: str, stage: str) -> str:
  """A model stage's final params (`checkpoint.save_params`), the next stages' starting point."""
  return os.path.join(workdir, stage, "params")


def rejection_data(workdir: str) -> str:
  return os.path.join(workdir, "r1_3_rejection", "data.jsonl")


def rejection_stats(workdir: str) -> str:
  """Written beside data.jsonl by rejection sampling."""
  return os.path.join(workdir, "r1_3_rejection", "stats.json")


def stage_done(workdir: str, stage: str) -> bool:
  return os.path.exists(os.path.join(workdir, stage, DONE))


def mark_done(workdir: str, stage: str, seconds: float) -> None:
  with open(os.path.join(workdir, stage, DONE), "w") as f:
    f.write(f"{seconds:.1f}\n")


def checkpointed_steps(stage_dir: str) -> int:
  """The newest committed checkpoint step of an SFT/RL stage (0 if none): tells a finished loop from a preempted one
  (train.py's loops return normally after SIGTERM, and run_sft writes `params` even then)."""
  d = os.path.join(stage_dir, "checkpoints")
  if not os.path.isdir(d):
    return 0
  return max((int(n) for n in os.listdir(d)
              if n.isdigit() and os.path.exists(os.path.join(d, n, "commit_success.txt"))), default=0)


def log_event(workdir: str, stage: str, event: str) -> None:
  with open(os.path.join(workdir, "stages.log"), "a") as f:
    f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {stage} {event}\n")
