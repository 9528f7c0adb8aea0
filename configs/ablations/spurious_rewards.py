"""Table k: spurious rewards (random / format-only / incorrect) against the true reward on a contamination-free task.

  python -m grpo_jax.ablate --config=configs/ablations/spurious_rewards.py:small --workdir=/tmp/abl_k_small
  python -m grpo_jax.ablate --config=configs/ablations/spurious_rewards.py --workdir=/tmp/abl_k

1-digit arithmetic (generated: train and test disjoint by construction, and the start SFT'd on the train split only;
studies/ablations/task_table.py) from the tables' shared SFT start, GRPO's preset for 100 steps, 5 seeds; each row
trains on one reward and measures the others at weight 0. Two minibatches per step, so the second update is
off-policy and the clip acts: the mechanism Shao et al. give for a random reward's gain (the clipping bias). Not yet
run: no time or result is recorded (docs/ablations.md, table k).
"""
from grpo_jax.config import presets
from grpo_jax.studies.ablations import task_table

BUDGET = {**presets.overrides("grpo"), "rl.minibatches": 2}


def get_config(arg=None):
  c = task_table.table_config(arg, (
      ("true reward (accuracy)", {**BUDGET, "rewards": (("accuracy", 1.0), ("format", 0.0))}),
      ("format only", {**BUDGET, "rewards": (("format", 1.0), ("accuracy", 0.0))}),
      ("random (p = 0.5)", {**BUDGET, "rewards": (("random", 1.0), ("accuracy", 0.0), ("format", 0.0))}),
      ("incorrect", {**BUDGET, "rewards": (("incorrect", 1.0), ("accuracy", 0.0), ("format", 0.0))})))
  c.title = "k. Spurious rewards on a contamination-free task"
  c.claim = ("Shao et al. 2025 (arXiv 2506.10947): on Qwen2.5-Math, RLVR with random, format-only or incorrect "
             "rewards gains nearly as much as with the true reward (random: through the clipping bias). Wu et al. "
             "2025 (arXiv 2507.10532): that gain comes from contamination; on a clean generated task only the true "
             "reward helps, random rewards give no gain and incorrect ones hurt.")
  c.columns = ("heldout_acc_final", "heldout_gain", "train_accuracy_last20%", "train_accuracy_first10",
               "train_format_last20%", "frac_zero_std_groups_mean", "kl_last20%")
  return c
