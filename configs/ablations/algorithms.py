"""Table d: GRPO, Dr.GRPO, RLOO, REINFORCE++(-baseline) and PPO on the same toy task, budget and seeds.

  python -m grpo_jax.ablate --config=configs/ablations/algorithms.py:small --workdir=/tmp/abl_d_small
  python -m grpo_jax.ablate --config=configs/ablations/algorithms.py --workdir=/tmp/abl_d
"""
from grpo_jax.ablations import train_table


def get_config(arg=None):
  c = train_table.table_config(arg, (
      ("grpo", {"rl.algo": "grpo"}),
      ("dr_grpo", {"rl.algo": "dr_grpo", "rl.loss_agg": "seq_mean_token_sum_norm"}),
      ("rloo", {"rl.algo": "rloo"}),
      ("reinforce_pp", {"rl.algo": "reinforce_pp", "rl.kl_in": "reward"}),
      ("reinforce_pp_baseline", {"rl.algo": "reinforce_pp_baseline", "rl.kl_in": "reward"}),
      ("ppo", {"rl.algo": "ppo"})))
  c.title = "d. Algorithms on one task and budget"
  c.claim = ("GRPO, RLOO and REINFORCE++ reach accuracy within ~1% of each other (Hu 2024); GRPO beats PPO "
             "(DeepSeekMath: +3% GSM8K, +5% MATH).")
  c.columns = ("heldout_acc_final", "train_acc_last20%")
  return c
