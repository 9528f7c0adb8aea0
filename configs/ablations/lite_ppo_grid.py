"""Table m: Lite PPO's grid, normalisation (group std / batch std) × aggregation (token / sequence) × clip-higher.

  python -m grpo_jax.ablate --config=configs/ablations/lite_ppo_grid.py:small --workdir=/tmp/abl_m_small
  python -m grpo_jax.ablate --config=configs/ablations/lite_ppo_grid.py --workdir=/tmp/abl_m

Every cell is the lite_ppo preset (group-mean advantages, vanilla clip 0.2, no KL) with the three switches: the
advantage's scale (rl.advantage grpo = the group std, group_mean_batch_std = the batch std), rl.loss_agg (token_mean
= Σ/Σ|o|, seq_mean_token_mean = GRPO's 1/|o| per answer) and rl.eps_high (0.2 / 0.28). Lite PPO is
batch std × token × 0.2. μ = 2 updates per batch over 2 minibatches, as table j: at μ = 1 with one minibatch the ratio
is 1 and the clip never acts, so the clip-higher rows would equal the clip 0.2 rows (the first run, 2026-12-05,
measured exactly that; the harness now refuses such a table, studies/ablate.check_variants).
"""
import itertools

from grpo_jax.config import presets
from grpo_jax.studies.ablations import train_table

NORMS = (("batch std", "group_mean_batch_std"), ("group std", "grpo"))
AGGS = (("token", "token_mean"), ("seq", "seq_mean_token_mean"))
CLIPS = (("clip 0.2", 0.2), ("clip-higher 0.28", 0.28))


def get_config(arg=None):
  variants = tuple(
      (f"{n} · {a} · {h}", {**presets.overrides("lite_ppo"), "rl.advantage": adv, "rl.loss_agg": agg,
                            "rl.eps_high": eps, "rl.mu": 2, "rl.minibatches": 2})
      for (n, adv), (a, agg), (h, eps) in itertools.product(NORMS, AGGS, CLIPS))
  c = train_table.table_config(arg, variants)
  c.title = "m. Lite PPO's grid"
  c.claim = ("Liu et al. 2025 (arXiv 2508.08221): group-mean + batch-std normalisation and token-level aggregation "
             "(Lite PPO) beat the other combinations on base models; clip-higher helps aligned models more than "
             "base ones.")
  c.columns = ("heldout_acc_final", "train_acc_last20%", "len_right_last20%")
  return c
