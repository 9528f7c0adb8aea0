"""Table j: CISPO vs PPO's clip (GRPO) vs SAPO vs GSPO at one budget, with ScaleRL's sigmoid per loss.

  python -m grpo_jax.ablate --config=configs/ablations/objectives.py:small --workdir=/tmp/abl_j_small
  python -m grpo_jax.ablate --config=configs/ablations/objectives.py --workdir=/tmp/abl_j

Each objective whole, as its preset sets it (docs/algorithms.md). μ = 2 updates per batch (2 minibatches), so the
ratio leaves 1 and the objectives differ (at μ = 1 with one minibatch ρ ≡ 1 and CISPO, SAPO and PPO's clip give the
same gradient up to their aggregation). The appendix fits R(C) = R0 + (A − R0)/(1 + (C_mid/C)^B) to each seed's
train-accuracy curve (C = steps; studies/scaling_fit.py) and reports A, B, C_mid ± 95% CI per loss.

400 steps (the training tables' default is 100): at 100 steps every GRPO and GSPO seed's curve was still rising and
its sigmoid fit sat on the search box's edge (2026-12-05, A at its ceiling of 1), so no asymptote could be compared.
The row `grpo, β 0` is GRPO's preset without its KL term: CISPO, SAPO and GSPO have none, so it separates the loss
from the KL (the first run's largest effect was the entropy collapse of every row without a KL).
"""
from grpo_jax.config import config_lib
from grpo_jax.config import presets
from grpo_jax.studies.ablations import train_table

LOSSES = ("grpo", "cispo", "sapo", "gspo")


def get_config(arg=None):
  budget = {"rl.mu": 2, "rl.minibatches": 2}
  rows = [(a, {**presets.overrides(a), **budget}) for a in LOSSES]
  rows.insert(1, ("grpo, β 0", {**presets.overrides("grpo"), **budget, "rl.beta": 0.0}))
  c = train_table.table_config(arg, tuple(rows))
  if not config_lib.parse_arg(arg, small=False).small:
    c.steps, c.eval_every = 400, 50
  c.title = "j. CISPO vs PPO-clip vs SAPO vs GSPO"
  c.claim = ("ScaleRL (arXiv 2510.13786): CISPO has the highest asymptote A of the losses tried; MiniMax-M1: CISPO "
             "learns faster than DAPO/GRPO's clip; SAPO (arXiv 2511.20347): the soft gate is more stable than hard "
             "clipping and GSPO.")
  c.columns = ("heldout_acc_final", "train_acc_last20%", "entropy_last20%")
  c.fits = ("sigmoid",)
  return c
