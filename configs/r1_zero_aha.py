"""R1-Zero's "aha" reproduced small: a task and base where longer reasoning pays, then GRPO with format + accuracy.
Args: `small`, `control`, `noverify`, `algo=<preset>` (those of configs/r1_pipeline.py).

  python -m grpo_jax.main --config=configs/r1_zero_aha.py --workdir=/tmp/aha
  python -m grpo_jax.main --config=configs/r1_zero_aha.py:control --workdir=/tmp/aha_control
  python -m grpo_jax.main --config=configs/r1_zero_aha.py:small --workdir=/tmp/aha_small   # 35 s (2026-12-05)
  # RL seeds over ONE fixed base (r1.base_from: every run copies BASE_DIR's finished base; base variance not sampled):
  python -m grpo_jax.main --config=configs/r1_zero_aha.py --workdir=BASE_DIR '--config.r1.stages=("base",)'
  python -m grpo_jax.sweep --config=configs/r1_zero_aha.py --workdir=DIR --seeds=3 --mode=serial \
      --config.r1.base_from=BASE_DIR                                 # -> DIR/aha_seeds.md, DIR/plots/aha_seeds.png
  (the same two with :control and CONTROL_BASE_DIR), then
  python -m grpo_jax.r1.aha_seeds --runs=DIR --control=DIR_CONTROL   # the table with the control

Task `sums` (tasks/sums.py): four operands, every one two-digit (task.min_number 10, max_number 99). Answering
directly asks the model to add four two-digit numbers, carries included, in one pass; the worked solution is a
running total, one two-operand addition a step, each written after the operands still to add
(`21 95 : add 37 + 48 = 85 ; 95 : add 85 + 21 = 106 ; add 106 + 95 = 201 ;`, ~65 tokens against ~11).

The base's pre-training mix, fixed before any RL run (r1.pretrain; the length that pure selection can reach follows
from it): every document is a chat transcript with the R1-Zero prompt (template_frac 1), every one tagged
(tag_frac 1, so the format does not separate the two kinds). 50% of documents work step by step (cot_frac; 3 steps),
the other 50% answer directly. In a step-by-step one every step is drawn on its own (recheck_per "step"): 15% are
written with a wrong running total, then `wait , recheck` and the correction (mistake_frac), 15% are re-checked and
found right (verify_frac), the rest stand. A re-check (recheck_style "columns", cot.column_steps) recomputes the step
in columns (one-digit additions and carries), puts the columns together (`combine` steps, whose last result is the
sum) and writes the step again with that result:
`add 37 + 48 = 84 ; wait , recheck add 7 + 8 = 15 ; add 3 + 4 = 7 ; carry 7 + 1 = 8 ; combine 80 + 5 = 85 ;
add 37 + 48 = 85 ;`, so it can catch the model's own errors. 1,600 steps x 32 at lr 1e-3, rows of 400 tokens (the
longest document). No language mixing or forbidden words. The R1-Zero reward is format + accuracy only
(r1.zero.rewards): nothing about length or verification; verification / correction rates, re-checks per completion,
p90 length and the within-group length-accuracy correlation are logged at weight 0 (docs/metrics.md) and drawn in
DIR/plots/r1_zero_aha.png.

`control`: the same run from a base pre-trained on the same documents with every step-by-step one replaced by its
direct answer (cot_frac 0): what RL selects rather than invents. `noverify`: step-by-step documents without any
re-check (mistake_frac = verify_frac = 0). Room: 1,024 new tokens per completion; the rollout exits early
(sampling.exit_chunk) and the update trains on the shortest of 5 length buckets covering the batch
(rl.train_buckets), so the cost follows what the model writes.

Measured 2026-12-05 on the 2-core CPU (docs/r1.md, "The aha task"). The base alone
(`'--config.r1.stages=("base",)'`): 690 s for its 1,600 steps, 12 min with its held-out report. Its premise: direct
samples right 2.9%, step-by-step ones 23.5% (+0.206 +- 0.039; 256 prompts x 4; format ~1 on both); its re-checks
pay (`python -m grpo_jax.r1.step_errors --workdir=DIR`): a re-checked step ends right 0.745 of the time against
0.508 for a first-written one (fixes 158 of 223 wrong steps, breaks 47 of 217 right ones). R1-Zero over 3 RL seeds
from that base (150 steps, 631-754 s a seed), mean +- 95% CI, start / end = first / last tenth: training length
114 -> 239 tokens (ratio **2.12 +- 0.53**; 3.33 +- 0.34 x step 1, the base's own samples); completions that
re-check 0.56 -> 0.99 (paired +0.435 +- 0.22), re-checks per completion 0.80 -> 2.35 of 3 steps (+1.55 +- 0.29),
corrections 0.20 -> 0.45; held-out greedy accuracy 0.250 -> 0.910 (**+0.660 +- 0.10**), re-checking every step
(2.98 a completion, 289 tokens). Against the control (3 seeds, 12 tokens throughout, ~5%): length ratio
+1.18 +- 0.50 (first tenth) and +2.33 +- 0.34 (step 1), both resolved (Welch).
Earlier mixes (docs/r1.md): re-checks that write the step again (2026-12-04: length grew with the chain only,
verification fell 0.228 -> 0.091) and columns without `combine` (one seed: verification rose, then fell back);
before those, six one-digit operands (no aha: the direct answer was learnable).
`small` is a plumbing check (tests/test_aha.py runs a shrunk copy of it).
"""
import os

from grpo_jax.config import config_lib

NEW_TOKENS = 1024
# Pre-training rows: the longest document of the 1,600 x 32 drawn is 389 tokens (bos/eos included; every step
# re-checked in columns, some written wrong first), the mean 123; not model.max_len (1,080).
SEQ_LEN = 400


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, small=False, control=False, noverify=False, algo="grpo")
  c = config_lib.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "r1_zero.py"),
                             f"algo={args.algo}")
  c.task.update(name="sums", num_numbers=4, min_number=10, max_number=99, language="a", prompt_len=56, test_size=500)
  c.sampling.update(max_new_tokens=NEW_TOKENS, exit_chunk=16)
  c.model.max_len = c.task.prompt_len + NEW_TOKENS
  c.rl.update(G=8, prompts_per_step=8, train_buckets=5)
  # lr 1e-3, not the pipeline's 3e-3: at 3e-3 this base's loss stalls at ~0.62 from step ~150 (the additions are
  # not learnt); at 1e-3 it keeps falling (docs/r1.md, "The aha task").
  c.r1.pretrain.update(steps=1600, batch=32, lr=1e-3, template_frac=1.0, tag_frac=1.0, mix_frac=0.0, noise_frac=0.0,
                       cot_frac=0.5, mistake_frac=0.15, verify_frac=0.15, recheck_per="step",
                       recheck_style="columns", seq_len=SEQ_LEN)
  c.r1.zero.steps = 150
  # Held-out accuracy along the way (greedy, small): the aha picture needs it per step, not only at the ends.
  c.train.update(eval_every=10)
  c.eval.update(size=64, batch=64, n_samples=1, pass_k=(1,))
  c.r1.report.update(size=256, batch=128, n_samples=4, pass_k=(1, 4))
  if args.small:
    c.task.update(num_numbers=4, test_size=64)
    c.sampling.max_new_tokens = 128
    c.model.update(hidden=32, inter=64, max_len=SEQ_LEN)  # the pre-training rows still hold the longest document
    c.rl.update(G=4, prompts_per_step=4, train_buckets=2)
    c.r1.pretrain.update(steps=40, batch=16)
    c.r1.zero.steps = 4
    c.train.update(eval_every=2, ckpt_every=10)
    c.eval.update(size=8, batch=8)
    c.r1.report.update(size=8, batch=8, n_samples=2, pass_k=(1, 2))
  if args.control:
    c.r1.pretrain.cot_frac = 0.0
  if args.noverify:
    c.r1.pretrain.update(mistake_frac=0.0, verify_frac=0.0)
  return c
