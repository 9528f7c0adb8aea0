"""Table f: reward design vs algorithm: outcome only, outcome + format, outcome + process, under GRPO and RLOO.

  python -m grpo_jax.ablate --config=configs/ablations/reward_design.py:small --workdir=/tmp/abl_f_small
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _train_base import base  # noqa: E402

REWARDS = {"outcome": "rewards=acc:1", "outcome+format": "rewards=acc:1+fmt:0.5",
           "outcome+process": "rewards=acc:1+proc:0.5;process_weight=0.5"}


def get_config(arg=None):
  v = tuple((f"{algo} / {name}", f"algo={algo};{r}") for algo in ("grpo", "rloo") for name, r in REWARDS.items())
  c = base(arg, v)
  c.title = "f. Reward design vs algorithm"
  c.claim = "Reward design, not the choice among critic-free algorithms, drives capability (the article's conclusion)."
  c.columns = ("heldout_acc_final", "train_acc_last20%")
  return c
