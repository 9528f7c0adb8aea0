"""Table i: entropy dynamics under GRPO, clip-higher, Clip-Cov, KL-Cov and top-20% entropy tokens.

  python -m grpo_jax.ablate --config=configs/ablations/entropy.py:small --workdir=/tmp/abl_i_small
  python -m grpo_jax.ablate --config=configs/ablations/entropy.py --workdir=/tmp/abl_i

μ = 2 updates per batch over 2 minibatches, as table j: at μ = 1 with one minibatch ρ ≡ 1, nothing is ever clipped,
and clip-higher is GRPO token for token (the first run, 2026-12-05, measured exactly that: identical rows). Each
variant is GRPO's preset with one switch (rl.eps_high, rl.token_select: rl/token_select.py); the token
selections keep their sources' parameters (Clip-Cov 2e-4 of the tokens with covariance in (1, 5), KL-Cov 2e-4 of
the largest, coefficient 1; top 20% entropy): on the toy's ~300 completion tokens per step the 2e-4 ratios select
max(⌊2e-4·n⌋, 1) = 1 token, about 0.3%, more than the 0.02% they select at the papers' scale. The appendix fits
R = −a·e^H + b per seed and correlates each step's entropy change with −Cov(log π, A).
"""
from grpo_jax.config import presets
from grpo_jax.studies.ablations import train_table

GRPO = presets.overrides("grpo")


def get_config(arg=None):
  g = {**GRPO, "rl.mu": 2, "rl.minibatches": 2}  # the ratio leaves 1, so the clip (and clip-higher) can act
  c = train_table.table_config(arg, (
      ("grpo", g),
      ("clip-higher (eps_high 0.28)", {**g, "rl.eps_high": 0.28}),
      ("clip_cov", {**g, "rl.token_select": "clip_cov"}),
      ("kl_cov", {**g, "rl.token_select": "kl_cov"}),
      ("top 20% entropy", {**g, "rl.token_select": "top_entropy", "rl.select_frac": 0.2})))
  c.title = "i. Entropy dynamics"
  c.claim = ("Cui et al. 2025 (arXiv 2505.22617): entropy collapses under GRPO, driven by Cov(log π, A) > 0, and "
             "reward follows R = −a·e^H + b; Clip-Cov / KL-Cov keep the entropy higher (clip-higher less so). Wang "
             "et al. 2025 (arXiv 2506.01939): the gradient of the top 20% entropy tokens alone matches or beats "
             "the full gradient.")
  c.columns = ("entropy_last20%", "cov_logp_adv_mean", "heldout_acc_final", "train_acc_last20%")
  c.fits = ("entropy",)
  return c
