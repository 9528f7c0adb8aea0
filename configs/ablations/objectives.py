"""Table j: CISPO vs PPO's clip (GRPO) vs SAPO vs GSPO at one budget, with ScaleRL's sigmoid per loss.

  python -m grpo_jax.ablate --config=configs/ablations/objectives.py:small --workdir=/tmp/abl_j_small
  python -m grpo_jax.ablate --config=configs/ablations/objectives.py --workdir=/tmp/abl_j

Each objective whole, as its preset sets it (docs/algorithms.md). μ = 2 updates per batch (2 minibatches), so the
ratio leaves 1 and the objectives differ (at μ = 1 with one minibatch ρ ≡ 1 and CISPO, SAPO and PPO's clip give the
same gradient up to their aggregation). The appendix fits R(C) = R0 + (A − R0)/(1 + (C_mid/C)^B) to each seed's
train-accuracy curve (C = steps; studies/scaling_fit.py) and reports A, B, C_mid ± 95% CI per loss.
"""
from grpo_jax.config import presets
from grpo_jax.studies.ablations import train_table

LOSSES = ("grpo", "cispo", "sapo", "gspo")


def get_config(arg=None):
  budget = {"rl.mu": 2, "rl.minibatches": 2}
  c = train_table.table_config(arg, tuple((a, {**presets.overrides(a), **budget}) for a in LOSSES))
  c.title = "j. CISPO vs PPO-clip vs SAPO vs GSPO"
  c.claim = ("ScaleRL (arXiv 2510.13786): CISPO has the highest asymptote A of the losses tried; MiniMax-M1: CISPO "
             "learns faster than DAPO/GRPO's clip; SAPO (arXiv 2511.20347): the soft gate is more stable than hard "
             "clipping and GSPO.")
  c.columns = ("heldout_acc_final", "train_acc_last20%", "entropy_last20%")
  c.fits = ("sigmoid",)
  return c
