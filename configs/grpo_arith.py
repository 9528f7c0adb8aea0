"""GRPO on 2-digit arithmetic from a small SFT checkpoint: the README's main job.

  python -m grpo_jax.main --config=configs/grpo_arith.py --workdir=/tmp/grpo_arith
  python -m grpo_jax.main --config=configs/grpo_arith.py:small --workdir=/tmp/grpo_arith_small   # ~1 minute

Stage 1 (skipped when `train.init_from` names a params checkpoint, or when DIR/sft/params exists): SFT on reference
chains of thought (3-layer, 128-wide Qwen2-shaped model, 600 steps × 64 sequences). Stage 2: GRPO with
reward = accuracy + 0.2·format, 16 prompts × G=8, μ=1, lr 1e-4 (tiny model; 1e-6 is the real-model value), 60 steps,
held-out accuracy on 500 fixed test problems every 20 steps; the algorithm's own settings (for GRPO: β=0.04, k3 in
the loss, ε=0.2, 1/|o| per answer) come from its preset (grpo_jax/presets.py, docs/algorithms.md).

Measured 2026-11-29 on the shared 2-core CPU (seed 0, one run; other jobs were running, so times are upper bounds),
with the group std's ddof=0 (the default then; now ddof=1 as TRL/verl, not re-measured):
  SFT 600 steps, ~1.2–2.1 s/step; greedy accuracy 62.5% on the first 200 held-out problems
    (--config.job=sft --config.eval.size=200; a little above the 20–60% band wanted for a start that GRPO can
    still improve — fewer SFT steps would land inside it, not re-measured).
  GRPO from that checkpoint (--config.train.init_from=DIR/sft/params), greedy accuracy on 500 held-out problems:
    step 0: 61.4%, 20: 71.4%, 40: 75.0%, 60: 79.0%  (+17.6 points; pass@4 72.8% → 86.4%, cons@4 52.6% → 72.2%,
    format 98.0% → 99.6%); 3–10 s/step while the machine was shared. Only seed 0 was run (not a 3-seed mean).
Args: `small` (tiny, a minute; `runlocal` is an alias), `algo=<name>`: a preset of grpo_jax/presets.py (grpo |
dr_grpo | dapo | rloo | reinforce_pp | reinforce_pp_baseline | gspo | ppo | gdpo | gdpo_dapo), applied whole;
`grid=True`: get_sweep's β × lr grid (only `python -m grpo_jax.sweep` reads it; the config is the same).

Sweeps (docs/sweeps.md):
  python -m grpo_jax.sweep --config=configs/grpo_arith.py --workdir=/tmp/grpo_arith_3seeds --seeds=3 --mode=serial
  python -m grpo_jax.sweep --config=configs/grpo_arith.py:small,grid=True --workdir=/tmp/arith_grid --seeds=3
"""
from grpo_jax import config_lib
from grpo_jax import presets


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, small=False, algo="grpo", grid=False)
  c = presets.apply(config_lib.base_config(), args.algo)  # the algorithm's settings first: this file's override them
  c.job = "grpo"
  c.model.update(hidden=128, layers=3, heads=4, kv_heads=2, inter=384, max_len=128)
  c.task.update(name="arith", max_digits=2, ops="+-", prompt_len=48, language="a")
  c.sampling.max_new_tokens = 72
  c.sft.update(steps=600, batch=64, lr=3e-3, warmup_steps=30, loss_on="completion")
  c.rl.update(G=8, prompts_per_step=16, mu=1, minibatches=1)
  c.optim.update(lr=1e-4, warmup_steps=0, grad_clip=1.0)
  c.train.update(steps=60, eval_every=20, ckpt_every=20, plot_every=20, sample_every=20)
  c.eval.update(size=500, batch=100, n_samples=4, pass_k=(1, 4))
  if args.small:
    c.model.update(hidden=64, layers=2, inter=128)
    c.sft.update(steps=60, batch=32)
    c.rl.update(G=4, prompts_per_step=8)
    c.train.update(steps=6, eval_every=3, ckpt_every=3, plot_every=3, sample_every=3)
    c.eval.update(size=64, batch=32, n_samples=4, pass_k=(1, 2))
  return c


def get_sweep(h, arg: str | None = None):
  """The config alone (with --seeds N: the main job over N seeds); with `grid=True`, β × lr around the defaults
  (β > 0 and lr only: with --mode=auto the grid's runs train as one vmapped program)."""
  if not config_lib.parse_arg(arg, small=False, algo="grpo", grid=False).grid:
    return h.base()
  return h.product([h.sweep("rl.beta", [0.02, 0.04, 0.08]), h.sweep("optim.lr", [5e-5, 1e-4, 2e-4])])
