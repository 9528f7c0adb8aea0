"""R1-Zero alone: pre-train the base, then GRPO from it with reward = format + accuracy (no SFT at all).
Args: those of configs/r1_pipeline.py (`small`, `algo=<preset>`), and `long`.

  python -m grpo_jax.main --config=configs/r1_zero.py --workdir=/tmp/r1_zero
  python -m grpo_jax.main --config=configs/r1_zero.py:small --workdir=/tmp/r1_zero_small
  python -m grpo_jax.main --config=configs/r1_zero.py:long --workdir=/tmp/r1_zero_long

Same stages, knobs and directory layout as configs/r1_pipeline.py (DIR/base, DIR/r1_zero, DIR/report.md), so a
workdir started here can be finished into the full R1 pipeline by running configs/r1_pipeline.py on it: finished
stages are skipped. The "aha" statistics (length, re-checks, corrections, format, accuracy, language) are logged
every RL step as train/reward/<term> and drawn in DIR/plots/r1_zero_aha.png.

`long`: the `small` model with room for LONG_NEW_TOKENS new tokens per completion (reasoning length), so the
whole long-context path runs end to end on the CPU: O(T) attention in prefill and training (model.attention=auto:
blockwise on the CPU), the rollout in rl.rollout_chunks chunks of rows, the update in minibatches. Every rollout
decodes all LONG_NEW_TOKENS steps and every update trains on 48 + LONG_NEW_TOKENS positions, whatever the lengths
the model writes. A plumbing and memory check, not a result. Measured 2026-12-01 on the 2-core
machine under load 11–17 from other jobs, with `nice -n 15`: base 770 s (30 steps,
mostly compiling and 17–30 s steps), R1-Zero 828 s (step compile 226 s, 4 steps of 79–165 s, two 2048-token evals,
completions ~50 tokens long that still decode all 2048 steps), then the held-out report: 28 min 51 s wall in all,
of which the process used 277 s of CPU (user 264 + system 13; peak RSS 1.4 GB), so about 5 minutes on a quiet
machine (an estimate from the CPU time, not a quiet-machine run).
"""
import os

from grpo_jax.config import config_lib

LONG_NEW_TOKENS = 2048


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, small=False, long=False, algo="grpo")
  pipeline_arg = ",".join((["small"] if args.small or args.long else []) + [f"algo={args.algo}"])
  c = config_lib.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "r1_pipeline.py"),
                             pipeline_arg)
  c.r1.stages = ("base", "r1_zero")
  if args.long:
    c.sampling.max_new_tokens = LONG_NEW_TOKENS
    c.model.max_len = c.task.prompt_len + LONG_NEW_TOKENS
    c.rl.update(G=4, prompts_per_step=4, rollout_chunks=2, minibatches=2)
    # Pre-training packs documents into max_len rows (mostly padding at this length), so it is kept short: the
    # base only has to drive the long path, not solve the task.
    c.r1.pretrain.update(steps=30, batch=4)
    c.r1.zero.steps = 4
    c.train.update(ckpt_every=2)
    c.eval.update(size=8, batch=8, n_samples=1, pass_k=(1,))
    c.r1.report.update(size=8, batch=8, n_samples=1, pass_k=(1,))
  return c
