"""Training ablations (tables d, e, f): S seeds of each variant trained in ONE vmapped program on the toy task.

A table's config holds the harness knobs (seeds, steps, eval_every, the shared base model) and `run`, the toy-task
run config (config_lib.base_config's keys); a variant is `(name, overrides)`, dotted keys set on `run` through
config_lib.override: an algorithm is its whole preset, `presets.overrides("dr_grpo")`, to which single keys can be
added (`{**presets.overrides("grpo"), "rl.loss_agg": "token_mean"}`); the toy's reward terms are `rewards`.
Recorded per seed: train reward, greedy held-out accuracy, mean length of right and of wrong completions.
"""
import jax
import ml_collections
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.rl import auto
from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.studies import vmapped_runs as seeds_lib
from grpo_jax.infra import sharding
from grpo_jax.run import validate
from grpo_jax.studies.ablations import toy
from grpo_jax.tasks import digits

TITLE = "Training ablation"
CLAIM = ""


def table_config(arg: str | None, variants: tuple) -> ml_collections.ConfigDict:
  """The training tables' shared config (configs/ablations/*.py start from it); `arg`: nothing or `small`."""
  small = config_lib.parse_arg(arg, small=False).small
  c = ml_collections.ConfigDict()
  c.table = "train_table"
  c.seeds = 5
  # RL starts from a shared pre-trained base (toy.base_params: answers right ~35% of the time, lengths 1..L), as
  # in practice; lr 1e-3 measured stable for GRPO from it (3e-3 collapsed within 80 steps on 2 of 3 seeds).
  c.base_steps, c.p_correct = 300, 0.35
  c.steps, c.eval_every = 100, 20
  c.fast_compile = True
  c.run = digits.bench_config(hidden=32, layers=2, heads=2, kv=1, inter=64, vocab=32, prompts=8, G=8, L=8)
  c.run.task.prompt_len = digits.TOY_PROMPT_LEN
  c.run.optim.lr = 1e-3
  c.run.ppo.critic_lr = 1e-3
  c.run.rewards = (("acc", 1.0),)  # toy terms: digits.TOY_TERMS
  c.variants = variants
  if small:
    c.seeds = 3
    c.run.model.layers = 1
    c.steps, c.eval_every = 40, 10
  return c


def variants(cfg) -> list[str]:
  return [name for name, _ in cfg.variants]


def build_config(cfg, overrides) -> ml_collections.ConfigDict:
  """The run config of one variant: `cfg.run` with the variant's overrides (and what follows from them). A variant
  that sets rl.algo without its preset, or algorithm settings that cannot work together, stops here."""
  c = config_lib.override(cfg.run, overrides)
  bad_preset = presets.check(c)
  if bad_preset:
    raise config_lib.ConfigError(bad_preset)
  validate.validate_algorithm(c)
  c.train.num_samples_logged = c.rl.prompts_per_step * c.rl.G  # every row: lengths of right vs wrong answers
  return c


def make_runs(cfg, c, spec, seeds: list[int]):
  """(mcfg, stacked states, vmapped step) for S runs of config `c` from the shared start (its family's state: PPO's
  has the critic)."""
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  c, _ = auto.resolve_here(c, mesh, lanes=len(seeds))  # the `auto` knobs, for the seeds sharing the device
  mcfg = model_lib.ModelConfig.from_config(c.model)
  opts = seeds_lib.FAST_COMPILE if cfg.fast_compile else None
  states = seeds_lib.init_states(c, mcfg, seeds, params=start_params(cfg, mcfg))
  return mcfg, states, seeds_lib.make_steps(c, mesh, mcfg, spec, spec.ctx.tokenizer, opts)


def run_cell(cfg, variant: str, seeds: list[int]) -> dict:
  c = build_config(cfg, dict(cfg.variants)[variant])
  spec = digits.toy_reward_spec(c.rewards, c.model.vocab_size)
  mcfg, states, step = make_runs(cfg, c, spec, seeds)
  evaluate = toy.make_eval(mcfg, c.sampling.max_new_tokens)
  evaluate_train = toy.make_eval(mcfg, c.sampling.max_new_tokens, digits.train_set())
  prompts, G = c.rl.prompts_per_step, c.rl.G
  data = digits.toy_batches(prompts, seed=12345)  # the same prompts for every seed and variant
  S = len(seeds)
  reward, len_right, len_wrong, eval_x = [], [], [], [0]
  acc, acc_train = [np.asarray(evaluate(states["params"]))], [np.asarray(evaluate_train(states["params"]))]
  for t in range(cfg.steps):
    batch = next(data)
    states, m = step(states, batch)
    sm = seeds_lib.host_scalars(m)
    reward.append(sm["train/reward/acc"] if "train/reward/acc" in sm else sm["train/reward_mean"])
    lens_SxN = np.asarray(m["samples/mask_NxL"]).sum(-1)
    right_SxN = np.asarray(m["samples/tokens_NxL"])[:, :, 0] == np.repeat(batch["answer_N"], G)[None, :]
    len_right.append([lens_SxN[s][right_SxN[s]].mean() if right_SxN[s].any() else np.nan for s in range(S)])
    len_wrong.append([lens_SxN[s][~right_SxN[s]].mean() if (~right_SxN[s]).any() else np.nan for s in range(S)])
    if (t + 1) % cfg.eval_every == 0 or t + 1 == cfg.steps:
      eval_x.append(t + 1)
      acc.append(np.asarray(evaluate(states["params"])))
      acc_train.append(np.asarray(evaluate_train(states["params"])))
  reward, len_right, len_wrong, acc, acc_train = map(lambda a: np.asarray(a, np.float64).T,
                                                     (reward, len_right, len_wrong, acc, acc_train))
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
      },
      "curves": {
          "train accuracy reward": {"x": x, "y": reward.tolist()},
          "held-out greedy accuracy": {"x": eval_x, "y": acc.tolist()},
          "greedy accuracy on the training prompts": {"x": eval_x, "y": acc_train.tolist()},
          "length of right answers": {"x": x, "y": np.nan_to_num(len_right, nan=0.0).tolist()},
          "length of wrong answers": {"x": x, "y": np.nan_to_num(len_wrong, nan=0.0).tolist()},
      },
  }


def start_params(cfg, mcfg):
  """The shared starting policy: toy.base_params when cfg.base_steps > 0, else None (random init per seed)."""
  if int(cfg.get("base_steps", 0)) <= 0:
    return None
  return toy.base_params(mcfg, cfg.run.sampling.max_new_tokens, int(cfg.base_steps), float(cfg.p_correct))
