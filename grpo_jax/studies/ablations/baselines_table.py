"""Table b: group baselines on the exactly solvable bandit of grpo_jax/studies/ablations/baselines.py (another module).

Each seed is an independent Monte-Carlo draw (n_draws gradient estimates); the exact bias needs no seed.
"""
from grpo_jax.studies.ablations import baselines

TITLE = "b. Baselines on an exactly solvable bandit"
CLAIM = ("The group mean is a valid (unbiased) baseline and E[R] the optimal one (article, proposition 1). Precisely: "
         "leave-one-out is unbiased, the plain mean scales the gradient by (G−1)/G, dividing by the std re-weights "
         "prompts by their success rate.")


def variants(cfg) -> list[str]:
  return [f"G={G} {e}" for G in cfg.Gs for e in baselines.ESTIMATORS]


def run_cell(cfg, variant: str, seeds: list[int]) -> dict:
  G = int(variant.split()[0][2:])
  est = variant.split()[1]
  bandit = baselines.make_bandit()
  per_seed = []
  for s in seeds:
    rows = baselines.run(Gs=(G,), n_draws=cfg.n_draws, bandit=bandit, seed=s)
    per_seed.append(next(r for r in rows if r["estimator"] == est))
  keys = ("rel_bias_exact", "rel_bias_mc", "rel_var", "cos_exact")
  return {"scalars": {k: [r[k] for r in per_seed] for k in keys}, "curves": {}}
