"""Table e: Dr.GRPO's length bias: mean length of wrong vs right completions, GRPO's 1/|o| vs a constant.

  python -m grpo_jax.ablate --config=configs/ablations/length_bias.py:small --workdir=/tmp/abl_e_small
"""
from grpo_jax.config import presets
from grpo_jax.studies.ablations import train_table


def get_config(arg=None):
  # The two presets differ in the normaliser and the std; Dr.GRPO's β = 0 is set back to GRPO's 0.04 here so that
  # the KL does not differ too.
  c = train_table.table_config(arg, (
      ("grpo (1/|o|, std)", presets.overrides("grpo")),
      ("dr_grpo (1/L_max, no std)", {**presets.overrides("dr_grpo"), "rl.beta": presets.PRESETS["grpo"]["rl.beta"]})))
  c.title = "e. Length bias of the 1/|o| normalisation"
  c.claim = ("Dr.GRPO (Liu 2025): dividing by |o| under-penalises long wrong answers, so under GRPO wrong "
             "answers grow longer than right ones; a constant normaliser removes the gap.")
  c.columns = ("len_wrong-right_last20%", "len_wrong_last20%", "len_right_last20%", "heldout_acc_final")
  return c
