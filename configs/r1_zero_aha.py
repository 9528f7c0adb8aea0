"""R1-Zero's "aha" reproduced small: a task and base where longer reasoning pays, then GRPO with format + accuracy.
Args: `small`, `control`, `noverify`, `algo=<preset>` (those of configs/r1_pipeline.py).

  python -m grpo_jax.main --config=configs/r1_zero_aha.py --workdir=/tmp/aha
  python -m grpo_jax.main --config=configs/r1_zero_aha.py:control --workdir=/tmp/aha_control
  python -m grpo_jax.main --config=configs/r1_zero_aha.py:small --workdir=/tmp/aha_small   # 70 s of CPU (5 min wall at load 17)
  # RL seeds over ONE fixed base (r1.base_from: every run copies BASE_DIR's finished base; base variance not sampled):
  python -m grpo_jax.main --config=configs/r1_zero_aha.py --workdir=BASE_DIR '--config.r1.stages=("base",)'
  python -m grpo_jax.sweep --config=configs/r1_zero_aha.py --workdir=DIR --seeds=3 --mode=serial \
      --config.r1.base_from=BASE_DIR                                 # -> DIR/aha_seeds.md, DIR/plots/aha_seeds.png
  (the same two with :control and CONTROL_BASE_DIR), then
  python -m grpo_jax.r1.aha_seeds --runs=DIR --control=DIR_CONTROL   # the table with the control

Task `sums` (tasks/sums.py): six operands in 1..9. Answering directly asks the model to add six numbers in one
pass; the worked solution is a running total, one two-operand addition a step, each written after the operands
still to add (`5 3 3 1 : add 8 + 6 = 14 ; 3 3 1 : add 14 + 5 = 19 ; ...`, ~93 tokens against ~10).

The base's pre-training mix, fixed before any RL run (r1.pretrain; the length that pure selection can reach follows
from it): every document is a chat transcript with the R1-Zero prompt (template_frac 1), every one tagged
(tag_frac 1, so the format does not separate the two kinds). 50% of documents work step by step (cot_frac; 5 steps),
the other 50% answer directly (~10 tokens). Of the step-by-step ones, 20% write one wrong intermediate total,
`wait , recheck` and the corrected step (mistake_frac), and 20% re-check a right step and find nothing to fix
(verify_frac; ~18 tokens each); 1,600 steps x 32. No language mixing or forbidden words. The R1-Zero reward is
format + accuracy only (r1.zero.rewards): nothing about length or verification; verification / correction rates,
p90 length and the within-group length-accuracy correlation are logged at weight 0 (docs/metrics.md) and drawn in
DIR/plots/r1_zero_aha.png.

`control`: the same run from a base pre-trained on the same documents with every step-by-step one replaced by its
direct answer (cot_frac 0): what RL selects rather than invents. `noverify`: step-by-step documents without any
re-check (mistake_frac = verify_frac = 0). Room: 1,024 new tokens per completion; the rollout exits early
(sampling.exit_chunk) and the update trains on the shortest of 5 length buckets covering the batch
(rl.train_buckets), so the cost follows what the model writes.

Measured 2026-12-03 (docs/r1.md, "The aha task"; 2-core CPU shared with test-suite runs, load 4-9): the base alone
(`'--config.r1.stages=("base",)'`), 1,600 steps, 1,424 s with its held-out report. The premise FAILS: with the format
~1 on both kinds (1.000 direct, 0.994 step by step), the base's direct samples are right 36.6%, its step-by-step ones
28.2% (256 prompts x 4), and 53% of its written sums are wrong (`python -m grpo_jax.r1.step_errors --workdir=DIR`).
R1-Zero over 3 RL seeds from that base (150 steps, 362-1,452 s a seed by load), mean +- 95% CI: NO aha. Training
completion length 39.7 -> 14.8 tokens (ratio 0.373 +- 0.027), verification rate 0.098 -> 0.014, samples that write
a step 50% -> 4%; held-out greedy accuracy R1-Zero - base +0.275 +- 0.114 (resolved, by the direct answer). The
control (3 seeds; its base right 83.2% greedy): length 11.0 -> 11.1 (ratio 1.01 +- 0.015); runs - control length
ratio -0.632 +- 0.022. On this task the direct answer is learnable, so longer reasoning has nothing to win.
Earlier attempt (tag_frac 0.5, 1,200 steps): the same outcome (ratio 0.331 +- 0.028) because step-by-step samples
held the format less often (0.395 vs 0.500). docs/r1.md has the tables and what would be needed.
`small` is a plumbing check (tests/test_aha.py runs a shrunk copy of it).
"""
import os

from grpo_jax.config import config_lib

NEW_TOKENS = 1024


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, small=False, control=False, noverify=False, algo="grpo")
  c = config_lib.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "r1_zero.py"),
                             f"algo={args.algo}")
  c.task.update(name="sums", num_numbers=4, min_number=10, max_number=99, language="a", prompt_len=56, test_size=500)
  c.sampling.update(max_new_tokens=NEW_TOKENS, exit_chunk=16)
  c.model.max_len = c.task.prompt_len + NEW_TOKENS
  c.rl.update(G=8, prompts_per_step=8, train_buckets=5)
  # seq_len: the longest document (191 tokens: tagged, with both re-checks), not model.max_len.
  # lr 1e-3, not the pipeline's 3e-3: at 3e-3 this base's loss stalls at ~0.62 from step ~150 (the additions are
  # not learnt); at 1e-3 it keeps falling (docs/r1.md, "The aha task").
  c.r1.pretrain.update(steps=1600, batch=32, lr=1e-3, template_frac=1.0, tag_frac=1.0, mix_frac=0.0, noise_frac=0.0,
                       cot_frac=0.5, mistake_frac=0.2, verify_frac=0.2, seq_len=192)
  c.r1.zero.steps = 150
  # Held-out accuracy along the way (greedy, small): the aha picture needs it per step, not only at the ends.
  c.train.update(eval_every=10)
  c.eval.update(size=64, batch=64, n_samples=1, pass_k=(1,))
  c.r1.report.update(size=256, batch=128, n_samples=4, pass_k=(1, 4))
  if args.small:
    c.task.update(num_numbers=4, test_size=64)
    c.sampling.max_new_tokens = 128
    c.model.update(hidden=32, inter=64, max_len=c.task.prompt_len + 128)
    c.rl.update(G=4, prompts_per_step=4, train_buckets=2)
    c.r1.pretrain.update(steps=40, batch=16, seq_len=176)
    c.r1.zero.steps = 4
    c.train.update(eval_every=2, ckpt_every=10)
    c.eval.update(size=8, batch=8)
    c.r1.report.update(size=8, batch=8, n_samples=2, pass_k=(1, 2))
  if args.control:
    c.r1.pretrain.cot_frac = 0.0
  if args.noverify:
    c.r1.pretrain.update(mistake_frac=0.0, verify_frac=0.0)
  return c
