"""Table g: GDPO's per-term reward normalisation vs GRPO's summed one on the R1 multi-reward stage.

  python -m grpo_jax.ablate --config=configs/ablations/gdpo.py:small --workdir=/tmp/abl_g_small
  python -m grpo_jax.ablate --config=configs/ablations/gdpo.py --workdir=/tmp/abl_g

The R1 pipeline's stage 2 (configs/r1_pipeline.py: accuracy + 0.5·format + 0.5·language consistency) from its
cold-start params, the `grpo` and `gdpo` presets (identical but for rl.reward_norm), 5 seeds each.
`:small` is a plumbing check (a tiny model from a random init, 2 steps, 2 seeds), not a measurement.
"""
import os

import ml_collections

from grpo_jax.config import config_lib
from grpo_jax.config import presets


def get_config(arg=None):
  small = config_lib.parse_arg(arg, small=False).small
  c = ml_collections.ConfigDict()
  c.table = "r1_table"
  c.seeds = 5
  c.stage = "r1_2_grpo"
  c.start_from = "cold_start"
  c.eval_every = 20
  c.fast_compile = False
  here = os.path.dirname(os.path.abspath(__file__))
  c.run = config_lib.load_config(os.path.join(here, "..", "r1_pipeline.py"))
  c.run.r1.grpo.steps = 60  # twice the pipeline's 30: more room for the normalisations to part
  c.run.rl.packing = "off"  # the padded passes the table was measured with (packing changes only rounding)
  c.variants = (("grpo (summed)", presets.overrides("grpo")), ("gdpo (per term)", presets.overrides("gdpo")))
  c.title = "g. GDPO vs summed reward normalisation (R1 multi-reward stage)"
  c.claim = ("GDPO (Liu et al. 2026): normalising each reward term in its group before the weighted sum keeps a "
             "rarely-varying term from being drowned by a frequently-varying one, and converges better than GRPO's "
             "normalisation of the summed reward.")
  c.columns = ("heldout_accuracy_final", "heldout_format_final", "heldout_language_final", "train_accuracy_last20%",
               "train_format_last20%", "train_language_last20%", "frac_zero_std_groups_mean")
  if small:
    c.seeds, c.start_from, c.eval_every, c.fast_compile = 2, "random", 2, True
    c.run = config_lib.override(c.run, {
        "model.hidden": 32, "model.layers": 1, "model.heads": 2, "model.kv_heads": 1, "model.inter": 64,
        "task.max_digits": 1, "task.test_size": 8, "sampling.max_new_tokens": 16, "model.max_len": 64,
        "rl.G": 2, "rl.prompts_per_step": 2, "r1.grpo.steps": 2, "r1.report.size": 8, "r1.report.batch": 8,
        "eval.size": 8, "eval.batch": 8})
  return c
