"""Algorithm presets: every setting that defines an algorithm, as its paper sets it, in one table.

A preset is a set of dotted config overrides applied through `config_lib.override` (the one override mechanism).
Config files apply it first and then set their own keys, and command-line flags come last:

    preset < config file < --config.<key> flags        (configs/*.py: `presets.apply(base_config(), args.algo)`)

Presets set only the keys in SETTINGS (advantage, std convention, reward normalisation, loss aggregation, ratio
level and clip ranges, KL placement, estimator and β, dynamic sampling, overlong shaping, PPO's GAE and value loss);
never the group size, learning rate, lengths, μ or batch sizes, which are an experiment's budget. Every preset sets
every rl.* key of SETTINGS, so applying one preset after another leaves nothing of the first.

`rl.preset` records which preset's settings a config holds and validation requires it to equal `rl.algo`: a flag
`--config.rl.algo=dapo` on a config built with the grpo preset would run DAPO's name with GRPO's clip range, loss
and KL, so it stops with an error that says to use the config arg `:algo=dapo` instead. docs/algorithms.md sets
every preset against its paper, TRL and verl; its settings table is `markdown_table()` (a test checks they agree;
`python -m grpo_jax.config.presets` prints it).
"""
from typing import Any

import ml_collections

from grpo_jax.config import config_lib

# The keys a preset sets. rl.* keys: every preset sets all of them; ppo.* keys: the ppo preset (others do not read
# them) sets them to the base config's defaults, so they too are the same whichever preset came before.
RL_SETTINGS = ("rl.advantage", "rl.reward_norm", "rl.std_ddof", "rl.std_eps", "rl.loss_agg", "rl.objective",
               "rl.ratio_level", "rl.eps_low", "rl.eps_high", "rl.dual_clip", "rl.sapo_tau_pos", "rl.sapo_tau_neg",
               "rl.beta", "rl.kl_estimator", "rl.kl_in", "rl.kl_clamp", "rl.dynamic_sampling", "rl.overlong_frac")
PPO_SETTINGS = ("ppo.gamma", "ppo.lam", "ppo.value_clip", "ppo.vf_coef")
SETTINGS = RL_SETTINGS + PPO_SETTINGS

# Guards every preset keeps (docs/algorithms.md, "Guards"): they only act where the papers' analyses do not reach
# (a ratio above 3 on a negative advantage needs stale samples, μ > 1 or several minibatches; a k3 above 10 needs a
# token whose probability fell e^2.6 ≈ 13× below the reference's), and there they bound the loss and the gradient.
_GUARDS = {"rl.dual_clip": 3.0, "rl.kl_clamp": 10.0}

GRPO = {
    "rl.advantage": "grpo", "rl.reward_norm": "sum", "rl.std_ddof": 1, "rl.std_eps": 1e-4,
    "rl.loss_agg": "seq_mean_token_mean", "rl.objective": "clip", "rl.ratio_level": "token", "rl.eps_low": 0.2,
    "rl.eps_high": 0.2, "rl.sapo_tau_pos": 1.0, "rl.sapo_tau_neg": 1.05, "rl.beta": 0.04, "rl.kl_estimator": "k3",
    "rl.kl_in": "loss", "rl.dynamic_sampling": False, "rl.overlong_frac": 0.0, **_GUARDS,
}
DAPO = {**GRPO, "rl.loss_agg": "token_mean", "rl.eps_high": 0.28, "rl.beta": 0.0, "rl.dynamic_sampling": True,
        "rl.overlong_frac": 0.2}

PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath (Shao et al. 2024, arXiv 2402.03300): group mean/std, 1/|o| per answer, k3 in the loss, β 0.04.
    "grpo": GRPO,
    # Dr.GRPO (Liu et al. 2025, arXiv 2503.20783): no std division, a constant normaliser instead of 1/|o|, no KL.
    "dr_grpo": {**GRPO, "rl.advantage": "dr_grpo", "rl.loss_agg": "seq_mean_token_sum_norm", "rl.beta": 0.0},
    # DAPO (Yu et al. 2025, arXiv 2503.14476): clip-higher 0.28, token-level loss, no KL, dynamic sampling, soft
    # overlong punishment over the last 4096 of 20480 tokens (0.2).
    "dapo": DAPO,
    # RLOO (Ahmadian et al. 2024, arXiv 2402.14740): REINFORCE (token sum) with a leave-one-out baseline, the
    # sequence KL (k1) subtracted from the reward, β 0.05 (TRL's RLOOTrainer).
    "rloo": {**GRPO, "rl.advantage": "rloo", "rl.loss_agg": "seq_mean_token_sum_norm", "rl.beta": 0.05,
             "rl.kl_estimator": "k1", "rl.kl_in": "reward"},
    # REINFORCE++ (Hu 2025, arXiv 2501.03262): per-token k1 KL in the reward, returns-to-go, batch whitening, PPO's
    # clip, token-level loss, β 0.01 (OpenRLHF's init_kl_coef).
    "reinforce_pp": {**GRPO, "rl.advantage": "reinforce_pp", "rl.loss_agg": "token_mean", "rl.beta": 0.01,
                     "rl.kl_estimator": "k1", "rl.kl_in": "reward"},
    "reinforce_pp_baseline": {**GRPO, "rl.advantage": "reinforce_pp_baseline", "rl.loss_agg": "token_mean",
                              "rl.beta": 0.01, "rl.kl_estimator": "k1", "rl.kl_in": "reward"},
    # GSPO (Zheng et al. 2025, arXiv 2507.18071): sequence-level ratio, clip range 3e-4 / 4e-4, no KL.
    "gspo": {**GRPO, "rl.ratio_level": "sequence", "rl.eps_low": 3e-4, "rl.eps_high": 4e-4, "rl.beta": 0.0},
    # PPO (Schulman et al. 2017) as RLHF runs it (Ouyang et al. 2022; OpenRLHF): critic, GAE(γ 1, λ 0.95), per-token
    # k1 KL in the reward (β 0.01), token-level loss, clipped value loss.
    "ppo": {**GRPO, "rl.advantage": "gae", "rl.loss_agg": "token_mean", "rl.beta": 0.01, "rl.kl_estimator": "k1",
            "rl.kl_in": "reward", "ppo.gamma": 1.0, "ppo.lam": 0.95, "ppo.value_clip": 0.2, "ppo.vf_coef": 0.5},
    # GDPO (Liu et al. 2026, arXiv 2601.05242): each reward term normalised in its group, weighted sum, batch std.
    # `gdpo` changes only that in GRPO; `gdpo_dapo` does it in DAPO.
    "gdpo": {**GRPO, "rl.reward_norm": "per_term"},
    "gdpo_dapo": {**DAPO, "rl.reward_norm": "per_term"},
    # CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE on every token with the IS weight clipped under a
    # stop-gradient; no lower bound (the paper sets ε_low^IS large: 1 here, a weight ≥ 0), upper weight 4 (ScaleRL,
    # arXiv 2510.13786; the paper does not state its ε_high^IS), token-level aggregation (1/Σ|o_i|), no KL.
    "cispo": {**GRPO, "rl.objective": "cispo", "rl.loss_agg": "token_mean", "rl.eps_low": 1.0, "rl.eps_high": 3.0,
              "rl.beta": 0.0},
    # SAPO (Gao et al. 2025, arXiv 2511.20347): the smooth gate (4/τ)σ(τ(ρ−1)) in place of the clip, τ_pos 1.0,
    # τ_neg 1.05, (1/G)Σ_i 1/|y_i| aggregation, group-normalised advantages, no KL term in its objective.
    "sapo": {**GRPO, "rl.objective": "sapo", "rl.beta": 0.0},
    # Lite PPO (Liu et al. 2025, arXiv 2508.08221, "Tricks or Traps?"): group-mean, batch-std advantages and
    # token-level aggregation over the vanilla PPO clip (0.2, no clip-higher), no KL.
    "lite_ppo": {**GRPO, "rl.advantage": "group_mean_batch_std", "rl.loss_agg": "token_mean", "rl.beta": 0.0},
}
# The presets whose family trains a critic (ppo_step); every other runs in the GRPO family (rl_step). families.for_config
# maps rl.algo to its family by this; the planner, validation and the resume check read it too. Here, not in
# families.py: memory_plan.py cannot import families (the rollout's decode-layout choice imports the planner).
CRITIC_ALGOS = ("ppo",)


def carry_refusal(algo: str) -> str | None:
  """Why rl.partial_rollouts cannot run with `algo` (None: it can): said by validation and by PPO's step builder
  (a step built without validation: studies, benchmarks) in the same words."""
  if algo in CRITIC_ALGOS:
    return (f"not supported with algo={algo!r} (PPO's critic: its values would need the carry's versions too); set "
            "rl.partial_rollouts=False or use a critic-free preset (grpo, dr_grpo, rloo, ...).")
  return None


def names() -> tuple[str, ...]:
  return tuple(PRESETS)


def overrides(name: str) -> dict[str, Any]:
  """The dotted overrides of preset `name`, with rl.algo and rl.preset: what ablation variants and sweeps pass to
  config_lib.override (add keys after it to change single settings)."""
  if name not in PRESETS:
    raise config_lib.ConfigError(f"algo={name!r} is not a preset; choose one of {list(PRESETS)} (grpo_jax/config/presets.py).")
  return {"rl.algo": name, "rl.preset": name, **PRESETS[name]}


def apply(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """A copy of `config` with preset `name`'s settings (see the module docstring for precedence)."""
  return config_lib.override(config, overrides(name))


def check(config) -> str | None:
  """Why config's rl.algo and rl.preset disagree (one line), or None when they agree."""
  algo, preset = config.rl.algo, config.rl.preset
  if algo not in PRESETS:
    return f"config.rl.algo: unknown algorithm {algo!r}; choose one of {list(PRESETS)}."
  if preset == algo:
    return None
  return (f"config.rl.algo: is {algo!r} but the config holds the {preset!r} preset's settings (rl.preset); a flag "
          f"that sets rl.algo alone would run {algo} with {preset}'s loss, clip range and KL. Choose the algorithm "
          f"with the config arg (--config=<file>.py:algo={algo}, or presets.apply(config, {algo!r}) in code), which "
          "applies the whole preset; then change single settings with --config.rl.<key> flags.")


def _fmt(v: Any) -> str:
  if isinstance(v, bool):
    return "yes" if v else "no"
  if isinstance(v, float):
    return f"{v:g}"
  return str(v)


# Settings read only under one value of another (shown as "·" in the table elsewhere): SAPO's temperatures.
_READ_ONLY_WITH = {"rl.sapo_tau_pos": ("rl.objective", "sapo"), "rl.sapo_tau_neg": ("rl.objective", "sapo")}


def _read(preset: dict, key: str) -> bool:
  if key not in preset:
    return False
  on, value = _READ_ONLY_WITH.get(key, (None, None))
  return on is None or preset.get(on) == value


def markdown_table() -> str:
  """Every preset's settings, one column per preset (docs/algorithms.md embeds this table verbatim)."""
  cols = list(PRESETS)
  lines = ["| setting | " + " | ".join(f"`{c}`" for c in cols) + " |", "|---|" + "---|" * len(cols)]
  for key in SETTINGS:
    cells = [_fmt(PRESETS[c][key]) if _read(PRESETS[c], key) else "·" for c in cols]
    lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(markdown_table(), end="")
