"""Table d: GRPO, Dr.GRPO, RLOO, REINFORCE++(-baseline) and PPO on the same toy task, budget and seeds.

  python -m grpo_jax.ablate --config=configs/ablations/algorithms.py:small --workdir=/tmp/abl_d_small
  python -m grpo_jax.ablate --config=configs/ablations/algorithms.py --workdir=/tmp/abl_d
"""
from grpo_jax.config import presets
from grpo_jax.studies.ablations import train_table

ALGOS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "ppo")


def get_config(arg=None):
  # Each algorithm whole, as its preset defines it (docs/algorithms.md): its own β, KL placement, aggregation, ...
  c = train_table.table_config(arg, tuple((a, presets.overrides(a)) for a in ALGOS))
  c.title = "d. Algorithms on one task and budget"
  c.claim = ("GRPO, RLOO and REINFORCE++ reach accuracy within ~1% of each other (Hu 2024); GRPO beats PPO "
             "(DeepSeekMath: +3% GSM8K, +5% MATH).")
  c.columns = ("heldout_acc_final", "train_acc_last20%")
  return c
