"""R1-Zero alone: pre-train the base, then GRPO from it with reward = format + accuracy (no SFT at all).

  python -m grpo_jax.main --config=configs/r1_zero.py --workdir=/tmp/r1_zero
  python -m grpo_jax.main --config=configs/r1_zero.py:small --workdir=/tmp/r1_zero_small

Same stages, knobs and directory layout as configs/r1_pipeline.py (DIR/base, DIR/r1_zero, DIR/report.md), so a
workdir started here can be finished into the full R1 pipeline by running configs/r1_pipeline.py on it: finished
stages are skipped. The "aha" statistics (length, re-checks, corrections, format, accuracy, language) are logged
every RL step as train/reward/<term> and drawn in DIR/plots/r1_zero_aha.png.
"""
import os

from grpo_jax import config_lib


def get_config(arg: str | None = None):
  c = config_lib.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "r1_pipeline.py"), arg)
  c.r1.stages = ("base", "r1_zero")
  return c
