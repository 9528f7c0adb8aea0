"""Table f: reward design vs algorithm: outcome only, outcome + format, outcome + process, under GRPO and RLOO.

  python -m grpo_jax.ablate --config=configs/ablations/reward_design.py:small --workdir=/tmp/abl_f_small
"""
from grpo_jax.config import presets
from grpo_jax.studies.ablations import train_table

# The toy's reward terms (grpo_jax/tasks/digits.py): acc, fmt, proc (per-step scores for process advantages).
REWARDS = {"outcome": {"rewards": (("acc", 1.0),)},
           "outcome+format": {"rewards": (("acc", 1.0), ("fmt", 0.5))},
           "outcome+process": {"rewards": (("acc", 1.0), ("proc", 0.5)), "rl.process_weight": 0.5}}


def get_config(arg=None):
  c = train_table.table_config(arg, tuple((f"{algo} / {name}", {**presets.overrides(algo), **r})
                                          for algo in ("grpo", "rloo") for name, r in REWARDS.items()))
  c.title = "f. Reward design vs algorithm"
  c.claim = "Reward design, not the choice among critic-free algorithms, drives capability (the article's conclusion)."
  c.columns = ("heldout_acc_final", "train_acc_last20%")
  return c
