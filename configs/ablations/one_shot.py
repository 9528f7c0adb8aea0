"""Table l: one-shot RLVR (Wang et al. 2025, arXiv 2504.20571): RL on a single training problem.

  python -m grpo_jax.ablate --config=configs/ablations/one_shot.py:small --workdir=/tmp/abl_l_small
  python -m grpo_jax.ablate --config=configs/ablations/one_shot.py --workdir=/tmp/abl_l

1-digit arithmetic from the tables' shared SFT start (studies/ablations/task_table.py), GRPO's preset for 100 steps,
5 seeds. The one-shot rows train on one train-split example (task.train_indices: every prompt of every batch is it,
8 prompts × G = 8 samples of it per step, as the paper repeats its one example to fill the batch); the first row on the
whole train split with the same budget. Held-out greedy accuracy every 10 steps; the step at which the sampled
training accuracy reaches 1 (all 64 samples right), the held-out accuracy there and its change to the end.
Saturation under GRPO: a step whose samples are all right gives zero advantages (only the KL term moves the policy),
so "post-saturation" learning here comes from the later steps that still miss. Not yet run: no time or result is
recorded (docs/ablations.md, table l).
"""
from grpo_jax.config import presets
from grpo_jax.studies.ablations import task_table

GRPO = presets.overrides("grpo")
# The first two train-split examples. NOT chosen by measurement: the paper picks its example by the variance of its
# training accuracy under a previous run; no such run exists here yet, so each row is one arbitrary example (a
# one-shot row whose example the start already always or never solves gets no signal: read frac_zero_std_groups).
EXAMPLES = (0, 1)


def get_config(arg=None):
  c = task_table.table_config(arg, (("full train split", GRPO),) + tuple(
      (f"1-shot: train example {i}", {**GRPO, "task.train_indices": (i,)}) for i in EXAMPLES), eval_every=10)
  c.saturation = 1.0  # "training accuracy reaches 1": every sample of the step right
  c.title = "l. One-shot RLVR"
  c.claim = ("Wang et al. 2025 (arXiv 2504.20571): RLVR on ONE training example raises held-out accuracy about as "
             "much as on the full set, and the held-out accuracy keeps improving after the training accuracy on that "
             "example has reached 100% (post-saturation generalisation).")
  c.columns = ("heldout_acc_final", "heldout_gain", "saturation_step", "heldout_at_saturation",
               "heldout_after_saturation", "train_accuracy_last20%")
  return c
