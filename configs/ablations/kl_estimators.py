"""Table a: KL estimators k1/k2/k3 vs the exact KL on real policy/reference pairs during training (β = 0 GRPO).

  python -m grpo_jax.ablate --config=configs/ablations/kl_estimators.py:small --workdir=/tmp/abl_a_small
  python -m grpo_jax.ablate --config=configs/ablations/kl_estimators.py --workdir=/tmp/abl_a
"""
from grpo_jax.config import config_lib
from grpo_jax.studies.ablations import train_table


def get_config(arg=None):
  small = config_lib.parse_arg(arg, small=False).small
  # Rows: how far the policy drifts from the reference in `steps`.
  lrs = (1e-3, 1e-2) if small else (3e-4, 1e-3, 3e-3, 1e-2)
  c = train_table.table_config(arg, tuple((f"lr={lr:g}", {"optim.lr": lr}) for lr in lrs))
  c.table = "kl_estimators"
  c.run.rl.beta = 0.0  # no KL penalty: the policy drifts freely
  c.steps, c.eval_every = (20, 10) if small else (60, 10)
  c.measure_prompts, c.measure_samples = 8, 8
  c.columns = ("kl_exact", "rel_bias_k1", "rel_bias_k2", "rel_bias_k3", "rel_std_k1", "rel_std_k2", "rel_std_k3",
               "var_ratio_k1/k3", "mc_rel_err_k3", "g1_bias_vs_fwd", "g2_bias_vs_fwd", "g3_bias_vs_fwd",
               "g3_bias_vs_rev", "gvar_ratio_g1/g3", "min_k3_vocab")
  return c
