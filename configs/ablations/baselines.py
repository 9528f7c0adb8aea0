"""Table b: bias and variance of the group baselines (none, LOO, mean, mean/std) on an exact bandit.

  python -m grpo_jax.ablate --config=configs/ablations/baselines.py:small --workdir=/tmp/abl_b_small
"""
import ml_collections

from grpo_jax.config import config_lib


def get_config(arg=None):
  small = config_lib.parse_arg(arg, small=False).small
  c = ml_collections.ConfigDict()
  c.table = "baselines_table"
  c.seeds = 5
  c.Gs = (2, 4, 8, 16)
  c.n_draws = 20_000
  c.columns = ("rel_bias_exact", "rel_bias_mc", "rel_var", "cos_exact")
  if small:
    c.Gs = (4, 8)
    c.n_draws = 4_000
  return c
