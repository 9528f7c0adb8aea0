"""Training ablations (tables d, e, f): S seeds of each variant trained in ONE vmapped program on the toy task.

A table's config holds the harness knobs (seeds, steps, eval_every, the base model: BASES) and `run`, the toy-task
run config (config_lib.base_config's keys); a variant is `(name, overrides)`, dotted keys set on `run` through
config_lib.override: an algorithm is its whole preset, `presets.overrides("dr_grpo")`, to which single keys can be
added (`{**presets.overrides("grpo"), "rl.loss_agg": "token_mean"}`); the toy's reward terms are `rewards`.
Recorded per seed: train reward, greedy held-out accuracy, mean length of right and of wrong completions.

Every table trains its S seeds through train.rl_loop, the one RL loop (`train_seeds`): its hooks feed the table's
batches, run its measurement on the loop's evaluation cadence and hand it each step's metrics.
"""
import functools
import os
import tempfile
from typing import Any, Callable, Iterator, NamedTuple

import jax
import ml_collections
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.rl import auto
from grpo_jax.model import model as model_lib
from grpo_jax.run import loop_guard
from grpo_jax.run import train
from grpo_jax.studies import vmapped_runs as seeds_lib
from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.infra import sharding
from grpo_jax.run import validate
from grpo_jax.studies.ablations import toy
from grpo_jax.tasks import digits
from grpo_jax.studies import scaling_fit
from grpo_jax.studies import stats

TITLE = "Training ablation"
CLAIM = ""
# config.base: where each seed's RL starts (and its reference model) -> the seeds' CIs are conditional on one base
# ('shared', every published table) or cover the base's pre-training too ('per_seed': seed s from the base
# pre-trained with seed s; seed 0's is the shared one)
BASES = ("shared", "per_seed")


def table_config(arg: str | None, variants: tuple) -> ml_collections.ConfigDict:
  """The training tables' shared config (configs/ablations/*.py start from it); `arg`: nothing or `small`."""
  small = config_lib.parse_arg(arg, small=False).small
  c = ml_collections.ConfigDict()
  c.table = "train_table"
  c.seeds = 5
  # RL starts from a shared pre-trained base (toy.base_params: answers right ~35% of the time, lengths 1..L), as
  # in practice; lr 1e-3 measured stable for GRPO from it (3e-3 collapsed within 80 steps on 2 of 3 seeds).
  c.base_steps, c.p_correct = 300, 0.35
  c.base = "shared"  # BASES; 'per_seed' pre-trains one base per seed (docs/ablations.md: ~1.5 s each, 300 steps)
  c.steps, c.eval_every = 100, 20
  c.fast_compile = True
  c.run = digits.bench_config(hidden=32, layers=2, heads=2, kv=1, inter=64, vocab=32, prompts=8, G=8, L=8)
  c.run.task.prompt_len = digits.TOY_PROMPT_LEN
  c.run.optim.lr = 1e-3
  c.run.ppo.critic_lr = 1e-3
  c.run.rewards = (("acc", 1.0),)  # toy terms: digits.TOY_TERMS
  # the padded passes the tables were measured with (8-token completions: nothing for packing to take away)
  c.run.rl.packing = "off"
  c.variants = variants
  if small:
    c.seeds = 3
    c.run.model.layers = 1
    c.steps, c.eval_every = 40, 10
  return c


def variants(cfg) -> list[str]:
  return [name for name, _ in cfg.variants]


def build_config(cfg, overrides) -> ml_collections.ConfigDict:
  """The run config of one variant: `cfg.run` with the variant's overrides (and what follows from them), run for the
  table's steps with its measurement every `eval_every` (train_seeds). A variant that sets rl.algo without its
  preset, or algorithm settings that cannot work together, stops here."""
  check_base(cfg)
  c = config_lib.override(cfg.run, overrides)
  # every key checked as a run of `main` checks it (one line naming it): only the preset and the algorithm's fit
  # were, so a bad value given to a table (--config.run.rl.select_frac=2, a NaN rl.beta) trained every row with it
  validate.validate_rl(c, 1, step_terms=digits.TOY_STEP_TERMS)
  validate.validate_groups(c)
  if cfg.get("base", "shared") == "per_seed" and int(c.model.lora.rank) > 0:  # init_states: LoRA runs share a base
    raise config_lib.ConfigError("config.base='per_seed' with model.lora.rank > 0: LoRA's seeds share one frozen base; "
                                 "use config.base='shared'.")
  c.train.num_samples_logged = c.rl.prompts_per_step * c.rl.G  # every row: lengths of right vs wrong answers
  return table_run(c, cfg.get("steps", c.train.steps), cfg.get("eval_every", c.train.eval_every))


def table_run(c, steps: int, eval_every: int) -> ml_collections.ConfigDict:
  """`c` as a table trains it in rl_loop: `steps` steps, its measurement every `eval_every`, nothing drawn or
  sampled (the checkpoint keys as a single end checkpoint would set them; train_seeds' scratch runs save none)."""
  c = ml_collections.ConfigDict(c.to_dict())
  c.train.update(steps=steps, eval_every=eval_every, ckpt_every=steps, keep_checkpoints=1, plot_every=0,
                 sample_every=0)
  c.log.update(tensorboard=False, plots=False)
  return c


class Runs(NamedTuple):
  config: ml_collections.ConfigDict  # resolved (rl/auto.py)
  mesh: Any
  mcfg: model_lib.ModelConfig
  states: Any  # stacked, one per seed
  program: train.Program
  auto: dict[str, str]  # {key: 'value (why)'} of the `auto` knobs resolved: the cell records it (ablate.py)


def make_runs(cfg, c, spec, seeds: list[int], tokenizer=None, params: Any = "base", init_seeds=None) -> Runs:
  """The S seeds of config `c` resolved, initialised and compiled as one vmapped program, from the shared start
  `params` ('base': start_params, the toy's pre-trained base, one per seed under cfg.base='per_seed') in the
  family's state (PPO's has the critic).
  The `auto` knobs are resolved once for the seeds sharing the device and logged as a main run logs them."""
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  c, chosen = auto.resolve_here(c, mesh, lanes=len(seeds))
  validate.kl_cov_inert(c)  # as a run's LoopGuard.resolve: rl.minibatches auto -> 1 with rl.mu 1 leaves KL-Cov inert
  mcfg = model_lib.ModelConfig.from_config(c.model)
  opts = seeds_lib.FAST_COMPILE if cfg.fast_compile else None
  start = start_params(cfg, mcfg, seeds) if isinstance(params, str) and params == "base" else {"params": params}
  states = seeds_lib.init_states(c, mcfg, seeds, init_seeds=init_seeds, **start)
  step = seeds_lib.make_steps(c, mesh, mcfg, spec, tokenizer or spec.ctx.tokenizer, opts)
  return Runs(c, mesh, mcfg, states, train.Program(step, len(seeds), seeds_lib.run_state), chosen)


def train_seeds(c, mesh, mcfg, states, program: train.Program, spec, tokenizer, *, batches: Iterator[dict],
                evaluate: Callable[[int, Any], None] | None = None,
                observe: Callable[[int, dict, dict], None] | None = None) -> None:
  """The S seeds trained through train.rl_loop with the table's hooks, each run in a scratch directory removed
  afterwards (the table keeps what its hooks record); `evaluate(step, states)`, `observe(step, batch, metrics)`.
  The runs save no checkpoint (checkpoint.NoCheckpoints): nothing reads one, as a table stopped in a cell reruns
  that cell from its start (studies/ablate.py resumes by finished cell)."""
  with tempfile.TemporaryDirectory(prefix="grpo_jax_table_") as d:
    runs = []
    for i in range(program.runs):
      wd = os.path.join(d, f"run{i}")
      guard = loop_guard.LoopGuard(c, wd, "rl")
      runs.append(train.Run(c, wd, guard, ckpt_lib.NoCheckpoints(guard.ckpt_dir)))
    train.rl_loop(program, runs, states, 0, mesh=mesh, mcfg=mcfg, tokenizer=tokenizer, spec=spec, batches=batches,
                  evaluate=evaluate, observe=observe)


def run_cell(cfg, variant: str, seeds: list[int]) -> dict:
  c = build_config(cfg, dict(cfg.variants)[variant])
  spec = digits.toy_reward_spec(c.rewards, c.model.vocab_size, c.rl.random_reward_rate)
  c, mesh, mcfg, states, program, chosen = make_runs(cfg, c, spec, seeds)
  evaluate_heldout = toy.make_eval(mcfg, c.sampling.max_new_tokens)
  evaluate_train = toy.make_eval(mcfg, c.sampling.max_new_tokens, digits.train_set())
  G, S = c.rl.G, len(seeds)
  reward, len_right, len_wrong, eval_x, acc, acc_train, entropy, cov = [], [], [], [], [], [], [], []

  def observe(t, batch, m):
    sm = seeds_lib.host_scalars(m)
    reward.append(sm["train/reward/acc"] if "train/reward/acc" in sm else sm["train/reward_mean"])
    lens_SxN = np.asarray(m["samples/mask_NxL"]).sum(-1)
    right_SxN = np.asarray(m["samples/tokens_NxL"])[:, :, 0] == np.repeat(batch["answer_N"], G)[None, :]
    len_right.append([lens_SxN[s][right_SxN[s]].mean() if right_SxN[s].any() else np.nan for s in range(S)])
    len_wrong.append([lens_SxN[s][~right_SxN[s]].mean() if (~right_SxN[s]).any() else np.nan for s in range(S)])
    entropy.append(sm["train/entropy"])
    cov.append(sm["train/cov_logp_adv"])

  def evaluate(t, states):  # step 0, every eval_every steps, the last step
    eval_x.append(t)
    acc.append(np.asarray(evaluate_heldout(states["params"])))
    acc_train.append(np.asarray(evaluate_train(states["params"])))

  # the same prompts for every seed and variant
  train_seeds(c, mesh, mcfg, states, program, spec, spec.ctx.tokenizer,
              batches=digits.toy_batches(c.rl.prompts_per_step, seed=12345, indices=c.task.train_indices),
              evaluate=evaluate, observe=observe)
  reward, len_right, len_wrong, acc, acc_train, entropy, cov = map(
      lambda a: np.asarray(a, np.float64).T, (reward, len_right, len_wrong, acc, acc_train, entropy, cov))
  tail = slice(int(cfg.steps * 0.8), None)
  x = list(range(1, cfg.steps + 1))
  return {
      "scalars": {
          "heldout_acc_final": acc[:, -1].tolist(),
          "train_prompts_acc_final": acc_train[:, -1].tolist(),
          "train_acc_last20%": reward[:, tail].mean(1).tolist(),
          "len_right_last20%": np.nanmean(len_right[:, tail], 1).tolist(),
          "len_wrong_last20%": np.nanmean(len_wrong[:, tail], 1).tolist(),
          "len_wrong-right_last20%": np.nanmean(len_wrong[:, tail] - len_right[:, tail], 1).tolist(),
          "entropy_last20%": entropy[:, tail].mean(1).tolist(),
          "cov_logp_adv_mean": cov.mean(1).tolist(),
      },
      "curves": {
          "train accuracy reward": {"x": x, "y": reward.tolist()},
          "held-out greedy accuracy": {"x": eval_x, "y": acc.tolist()},
          "greedy accuracy on the training prompts": {"x": eval_x, "y": acc_train.tolist()},
          # NaN where a seed had no right (wrong) answer that step: the plot's band is over the seeds that had
          "length of right answers": {"x": x, "y": len_right.tolist()},
          "length of wrong answers": {"x": x, "y": len_wrong.tolist()},
          "policy entropy": {"x": x, "y": entropy.tolist()},
          "Cov(log pi, A)": {"x": x, "y": cov.tolist()},
      },
      "auto": chosen,
  }


def check_base(cfg) -> None:
  if cfg.get("base", "shared") not in BASES:
    raise config_lib.ConfigError(f"config.base={cfg.base!r}: use one of {', '.join(map(repr, BASES))}.")


def start_params(cfg, mcfg, seeds: list[int]) -> dict:
  """The seeds' starting policies, as init_states' keyword: `params`, toy.base_params shared by every seed, or
  `run_params`, seed s's base pre-trained with seed s (cfg.base='per_seed'); each is its run's reference too. Without
  a base (cfg.base_steps 0) {'params': None}: each seed's own random init."""
  check_base(cfg)
  if int(cfg.get("base_steps", 0)) <= 0:
    return {"params": None}
  base = functools.partial(toy.base_params, mcfg, cfg.run.sampling.max_new_tokens, int(cfg.base_steps),
                           float(cfg.p_correct))
  if cfg.get("base", "shared") == "per_seed":
    return {"run_params": [base(seed=int(s)) for s in seeds]}
  return {"params": base()}


def appendix(cfg, cells: dict) -> str:
  """Per variant, from the seeds' curves (what cfg.fits names): 'sigmoid': ScaleRL's R(C) = R0 + (A − R0)/(1 +
  (C_mid/C)^B) fitted to the train accuracy reward against updates (step t's rollout follows t - 1 of them), R0
  the first step's (studies/scaling_fit.py);
  'entropy': R = −a·e^H + b (Cui et al. 2025) by least squares of the reward on e^H over the steps, and the
  correlation of the entropy change H_{t+1} − H_t with −Cov(log π, A)_t (the covariance identity's sign). Each
  as mean ± 95% CI over seeds."""
  fits = tuple(cfg.get("fits", ()))
  if not fits:
    return ""
  lines = []
  if "sigmoid" in fits:
    lines += ["### ScaleRL sigmoid of the train accuracy reward against updates", "",
              "| variant | A (≤ 1) | B | C_mid (updates) | rmse | seeds on an edge |", "|---|---|---|---|---|---|"]
    for name, cell in cells.items():
      curve = cell["curves"]["train accuracy reward"]
      # an accuracy's asymptote is at most 1 (ScaleRL's A is a pass rate); unbounded, a curve still rising at the
      # last step fits an A far above 1
      # Step t's reward was sampled by the policy after t - 1 updates: that is its compute, and step 1's, at C = 0,
      # is R0's point (fitted exactly). C = t put R0 at C = 1, where the sigmoid is not R0 (A, B off by ~1e-3 on an
      # exact sigmoid) and shifted C_mid by one step.
      out = scaling_fit.fit_seeds(np.asarray(curve["x"], np.float64) - 1, curve["y"], A_max=1.0)
      rmse = stats.summarize([f.rmse for f in out.fits])
      edges = sum(f.edge for f in out.fits)
      lines.append(f"| {name} | {out.A.fmt()} | {out.B.fmt()} | {out.C_mid.fmt()} | {rmse.fmt()} | "
                   f"{edges} of {len(out.fits)} |")
    lines += ["", "A seed's fit on an edge (C_mid or B at the search box's bound, A at 1, A at R0: a flat or falling "
              "curve, a gain A − R0 within 3 rmse of the noise, or a fall after the peak: a collapse) has no resolved "
              "rise to an asymptote inside the "
              "steps measured: its A, B, C_mid describe the box, not the run, and are left out of A, B, C_mid "
              "(nan when every seed is on an edge); rmse is over every seed."]
    lines.append("")
  if "entropy" in fits:
    lines += ["### Reward against entropy, R = −a·e^H + b, and the covariance identity", "",
              "| variant | a | b | corr(ΔH, −Cov) | seeds whose entropy moved |", "|---|---|---|---|---|"]
    for name, cell in cells.items():
      R_S = np.asarray(cell["curves"]["train accuracy reward"]["y"], np.float64)
      H_S = np.asarray(cell["curves"]["policy entropy"]["y"], np.float64)
      C_S = np.asarray(cell["curves"]["Cov(log pi, A)"]["y"], np.float64)
      a_, b_, r_ = [], [], []
      for R, H, C in zip(R_S, H_S, C_S):
        a, b = scaling_fit.entropy_fit(H, R)  # nan where the entropy did not move: a is not measured
        a_.append(a)
        b_.append(b)
        dH = np.diff(H)
        # the steps correlated are C[:-1]: a Cov of 0 until the last step (no signal before it) has no correlation
        r_.append(float(np.corrcoef(dH, -C[:-1])[0, 1]) if dH.std() > 0 and C[:-1].std() > 0 else float("nan"))
      lines.append(f"| {name} | {stats.summarize(a_).fmt()} | {stats.summarize(b_).fmt()} | "
                   f"{stats.summarize(r_).fmt()} | {int(np.isfinite(a_).sum())} of {len(a_)} |")
    lines.append("")
  return "\n".join(lines)
