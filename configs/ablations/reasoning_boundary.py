"""Table h: RL and the reasoning boundary (Yue et al. 2025, arXiv 2504.13837), and ProRL's reference reset.

  python -m grpo_jax.ablate --config=configs/ablations/reasoning_boundary.py:small --workdir=/tmp/abl_h_small
  python -m grpo_jax.ablate --config=configs/ablations/reasoning_boundary.py --workdir=/tmp/abl_h

1-digit arithmetic from the tables' shared SFT start (studies/ablations/task_table.py), GRPO's preset for 100
steps, 5 seeds; pass@k of the start (the base) and of each seed's final policy for k = 1..256 from 256 samples of each
of the first 50 test prompts (the unbiased estimator), and where the curves cross. The second row resets the reference and the
optimizer state to the current policy every 25 steps (ProRL, arXiv 2505.24864: rl.ref_reset_every). Not yet run:
no time or result is recorded (docs/ablations.md, table h).
"""
from grpo_jax.config import presets
from grpo_jax.studies.ablations import task_table

GRPO = presets.overrides("grpo")
RESET_EVERY = 25


def get_config(arg=None):
  c = task_table.table_config(arg, (
      ("grpo", GRPO),
      (f"grpo + ProRL reset every {RESET_EVERY}", {**GRPO, "rl.ref_reset_every": RESET_EVERY})), passk_n=256)
  c.title = "h. RL and the reasoning boundary (pass@k of base vs RL, k = 1..256)"
  c.claim = ("Yue et al. 2025 (arXiv 2504.13837): RL-trained models beat their base at small k but the base wins at "
             "large k (pass@256): RLVR narrows sampling onto paths the base already has instead of adding new ones; "
             "the curves cross. ProRL (Liu et al. 2025, arXiv 2505.24864): prolonged RL with periodic reference "
             "resets expands the boundary (the crossover moves to larger k or goes away).")
  c.columns = ("pass@1", "pass@1_gain", f"pass@{min(16, c.passk_n)}_gain", f"pass@{c.passk_n}_base", f"pass@{c.passk_n}",
               f"pass@{c.passk_n}_gain", "crossover_k", "crossed", "heldout_acc_final", "kl_last20%")
  return c
