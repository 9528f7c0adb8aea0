"""Training ablations (tables d, e, f): S seeds of each variant trained in ONE vmapped program on the toy task.

A variant is `(name, "key=value;…")` with keys algo, rewards (`acc:1+fmt:0.2`), process_weight, loss_agg, beta.
Recorded per seed: train reward, greedy held-out accuracy, mean length of right and of wrong completions.
"""
import jax
import numpy as np

from grpo_jax import model as model_lib
from grpo_jax import peer_workload
from grpo_jax import seeds as seeds_lib
from grpo_jax import sharding
from grpo_jax import state as state_lib
from grpo_jax.ablations import toy

TITLE = "Training ablation"
CLAIM = ""


def variants(cfg) -> list[str]:
  return [name for name, _ in cfg.variants]


def parse(spec: str) -> dict:
  out = {}
  for item in filter(None, spec.split(";")):
    if "=" not in item:
      raise ValueError(f"variant override {item!r}: write key=value (keys algo, rewards, process_weight, loss_agg, "
                       "beta).")
    k, v = item.split("=", 1)
    if k == "rewards":
      out[k] = tuple((t.split(":")[0], float(t.split(":")[1])) for t in v.split("+"))
    elif k in ("process_weight", "beta"):
      out[k] = float(v)
    elif k in ("algo", "loss_agg"):
      out[k] = v
    else:
      raise ValueError(f"variant override key {k!r} unknown; use algo, rewards, process_weight, loss_agg, beta.")
  return out


def build_config(cfg, over: dict):
  m = cfg.model
  c = peer_workload.bench_config(hidden=m.hidden, layers=m.layers, heads=m.heads, kv=m.kv, inter=m.inter,
                                 vocab=m.vocab, prompts=cfg.prompts, G=cfg.G, L=cfg.L)
  c.task.prompt_len = toy.P_LEN
  c.optim.lr = cfg.lr
  c.rl.update(algo=over.get("algo", "grpo"), beta=over.get("beta", cfg.beta),
              process_weight=over.get("process_weight", 0.0), loss_agg=over.get("loss_agg", "seq_mean_token_mean"))
  if c.rl.algo in ("reinforce_pp", "reinforce_pp_baseline"):
    c.rl.kl_in = "reward"
  c.ppo.critic_lr = cfg.critic_lr
  c.train.num_samples_logged = cfg.prompts * cfg.G  # every row: lengths of right vs wrong answers
  return c


def make_runs(cfg, c, spec, seeds: list[int]):
  """(mcfg, stacked states, vmapped step) for S runs of config `c` from the shared start (PPO gets its critic)."""
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  tx = state_lib.make_optimizer(c.optim, cfg.steps)
  opts = seeds_lib.FAST_COMPILE if cfg.fast_compile else None
  base = start_params(cfg, mcfg)
  if c.rl.algo == "ppo":
    from grpo_jax import ppo_step
    ctx = state_lib.make_optimizer(c.optim, cfg.steps, lr=c.ppo.critic_lr)
    states = seeds_lib.init_states(mcfg, tx, seeds, params=base, critic_init=lambda k, p: ppo_step.init_critic(
        mcfg, c.ppo.critic, k, p), critic_tx=ctx)
    return mcfg, states, seeds_lib.make_ppo_steps(c, mesh, mcfg, tx, ctx, spec, spec.ctx.tokenizer, opts)
  states = seeds_lib.init_states(mcfg, tx, seeds, params=base)
  return mcfg, states, seeds_lib.make_rl_steps(c, mesh, mcfg, tx, spec, spec.ctx.tokenizer, opts)


def run_cell(cfg, variant: str, seeds: list[int]) -> dict:
  over = parse(dict(cfg.variants)[variant])
  c = build_config(cfg, over)
  spec = toy.reward_spec(over.get("rewards", (("acc", 1.0),)), c.model.vocab_size)
  mcfg, states, step = make_runs(cfg, c, spec, seeds)
  evaluate = toy.make_eval(mcfg, c.sampling.max_new_tokens)
  evaluate_train = toy.make_eval(mcfg, c.sampling.max_new_tokens, toy.train_set())
  data = toy.batches(cfg.prompts, seed=12345)  # the same prompts for every seed and variant
  S = len(seeds)
  reward, len_right, len_wrong, eval_x = [], [], [], [0]
  acc, acc_train = [np.asarray(evaluate(states["params"]))], [np.asarray(evaluate_train(states["params"]))]
  for t in range(cfg.steps):
    states, m = step(states, next(data))
    sm = seeds_lib.host_scalars(m)
    reward.append(sm["train/reward/acc"] if "train/reward/acc" in sm else sm["train/reward_mean"])
    lens_SxN = np.asarray(m["samples/mask_NxL"]).sum(-1)
    right_SxN = _correct(np.asarray(m["samples/tokens_NxL"]), np.asarray(next_answers(cfg, t)))
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
  return toy.base_params(mcfg, cfg.L, int(cfg.base_steps), float(cfg.p_correct))


_ANSWERS: dict = {}


def next_answers(cfg, t: int) -> np.ndarray:
  """The answers of batch t of the fixed prompt stream (regenerated, so the step needs no extra output)."""
  key = (cfg.prompts, cfg.G)
  if key not in _ANSWERS or len(_ANSWERS[key]) <= t:
    gen = toy.batches(cfg.prompts, seed=12345)
    _ANSWERS[key] = [np.repeat(next(gen)["answer_N"], cfg.G) for _ in range(max(t + 1, cfg.steps))]
  return _ANSWERS[key][t]


def _correct(tokens_SxNxL: np.ndarray, answer_N: np.ndarray) -> np.ndarray:
  return tokens_SxNxL[:, :, 0] == answer_N[None, :]
