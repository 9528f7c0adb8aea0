"""GRPO on 2-digit arithmetic from a small SFT checkpoint: the README's main job.

  python -m grpo_jax.main --config=configs/grpo_arith.py --workdir=/tmp/grpo_arith
  python -m grpo_jax.main --config=configs/grpo_arith.py:small --workdir=/tmp/grpo_arith_small   # ~1 minute

Stage 1 (skipped when `train.init_from` names a params checkpoint, or when DIR/sft/params exists): SFT on reference
chains of thought (3-layer, 128-wide Qwen2-shaped model, 600 steps × 64 sequences). Stage 2: GRPO with
reward = accuracy + 0.2·format, 16 prompts × G=8, μ=1, lr 1e-4 (tiny model; 1e-6 is the real-model value), 60 steps,
held-out accuracy on 500 fixed test problems every 20 steps; the algorithm's own settings (for GRPO: β=0.04, k3 in
the loss, ε=0.2, 1/|o| per answer) come from its preset (grpo_jax/config/presets.py, docs/algorithms.md).

Measured over 3 seeds (2026-12-01, commit 90fdc62, group std ddof=1; the 2-core CPU shared with other jobs, load
2–8, 64 minutes for the three seeds), `python -m grpo_jax.sweep --config=configs/grpo_arith.py --workdir=DIR --seeds=3
--mode=serial`; greedy accuracy on 500 held-out problems, seeds 0/1/2:
  after SFT (600 steps; GRPO's step 0): 54.8% / 55.4% / 56.6%
  after 60 GRPO steps:                  72.2% / 78.0% / 66.8%  -> 72.3% ± 13.9 (mean ± 95% CI, t with 2 df);
  the GRPO gain +17.4 / +22.6 / +10.2 points (paired: +16.7 ± 15.5); pass@4 68.2% -> 81.1%, cons@4 48.8% -> 66.0%
  (means). (The earlier single seed-0 run, 2026-11-29, ddof=0: 61.4% -> 79.0%.)
Seed 0 alone, re-run 2026-12-07 (commit 7532d3a, an AMD EPYC with AVX-512; docs/performance.md): 63.6% after SFT,
70.0 / 75.4 / 77.0% at GRPO steps 20 / 40 / 60 (the three seeds above were not re-measured at that commit).
Args: `small` (tiny, a minute; `runlocal` is an alias), `algo=<name>`: a preset of grpo_jax/config/presets.py (grpo |
dr_grpo | dapo | rloo | reinforce_pp | reinforce_pp_baseline | gspo | ppo | gdpo | gdpo_dapo | cispo |
sapo | lite_ppo), applied whole;
`grid=True`: get_sweep's β × lr grid (only `python -m grpo_jax.sweep` reads it; the config is the same);
`lora=True`: LoRA RL (docs/lora.md) on the same full-weight SFT stage: rank 16, alpha 32 (scale 2) on all seven
projections, lr 1e-3; the frozen base is the reference.

Sweeps (docs/sweeps.md):
  python -m grpo_jax.sweep --config=configs/grpo_arith.py --workdir=/tmp/grpo_arith_3seeds --seeds=3 --mode=serial
  python -m grpo_jax.sweep --config=configs/grpo_arith.py:small,grid=True --workdir=/tmp/arith_grid --seeds=3
"""
from grpo_jax.config import config_lib
from grpo_jax.config import presets


LORA_LR = 1e-3


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, small=False, algo="grpo", grid=False, lora=False)
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
  if args.lora:
    # LoRA GRPO on the same SFT stage (full weights: sft.lora stays False): rank 16, alpha 32 on all seven
    # projections; adapters take a larger lr than full fine-tuning, as LoRA practice does.
    c.model.lora.update(rank=16, alpha=32.0)
    c.optim.lr = LORA_LR
  return c


def get_sweep(h, arg: str | None = None):
  """The config alone (with --seeds N: the main job over N seeds); with `grid=True`, β × lr around the defaults
  (β > 0 and lr only: with --mode=auto the grid's runs train as one vmapped program)."""
  if not config_lib.parse_arg(arg, small=False, algo="grpo", grid=False, lora=False).grid:
    return h.base()
  return h.product([h.sweep("rl.beta", [0.02, 0.04, 0.08]), h.sweep("optim.lr", [5e-5, 1e-4, 2e-4])])
