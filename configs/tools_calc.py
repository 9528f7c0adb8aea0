"""Tool use on sums (#43): a base pre-trained so that it sometimes calls the calculator, and its no-tool control.
Args: `small`, `control`, `algo=<preset>` (those of configs/r1_zero_aha.py).

  python -m grpo_jax.main --config=configs/tools_calc.py --workdir=/tmp/tools_calc                  # the base
  python -m grpo_jax.main --config=configs/tools_calc.py:control --workdir=/tmp/tools_calc_control  # no tool calls
  python -m grpo_jax.main --config=configs/tools_calc.py:small --workdir=/tmp/tools_calc_small      # plumbing

Task `sums` as configs/r1_zero_aha.py sets it up: four operands, every one two-digit, so the direct answer is
usually wrong and a running total usually right. The tokenizer is `tools`: the shipped one with `<tool_call>`,
`</tool_call>`, `<tool_response>`, `</tool_response>` appended as pieces 512-515 (model.vocab_size 516; every other
id unchanged). Pre-training documents (r1.pretrain): chat transcripts with the R1-Zero prompt, all tagged; half work
step by step (cot_frac), half answer directly; in a worked one each step calls the calculator first with probability
tool_frac (0.3: a worked document has no call 34% of the time, all three 3%), in the plain format, followed by the
calculator's own observation, and then the step copies its value:
`21 95 : <tool_call> 37 + 48 </tool_call> <tool_response> 85 </tool_response> add 37 + 48 = 85 ;`.
No mistakes or re-checks (a step written with a call is written right once). `control`: the same documents with
every call left out (tool_frac 0; each document draws from its own generator, so nothing else moves).

The RL stage (R1-Zero, format + accuracy, 150 steps of 8 prompts x G8): tools.env='calculator' in the continuous
engine: a row pauses on `</tool_call>`, the calculator's observation is fed into it (attended to, not trained on),
and the row resumes (docs/tools.md). `control` also sets tools.env='': single-turn rollouts. The acceptance
experiment (issue #43; docs/tools.md, "The experiment"): RL seeds over one base per arm, paired by seed:

  python -m grpo_jax.main --config=configs/tools_calc.py --workdir=BASE '--config.r1.stages=("base",)'
  python -m grpo_jax.sweep --config=configs/tools_calc.py --workdir=DIR --seeds=3 --mode=serial \
      --config.r1.base_from=BASE
  python -m grpo_jax.main --config=configs/tools_calc.py:control --workdir=BASE_C '--config.r1.stages=("base",)'
  python -m grpo_jax.sweep --config=configs/tools_calc.py:control --workdir=DIR_C --seeds=3 --mode=serial \
      --config.r1.base_from=BASE_C
  python -m grpo_jax.r1.tools_seeds --runs=DIR --control=DIR_C     # DIR/tools_seeds.md, DIR/plots/tools_seeds.png
"""
import os

from grpo_jax.config import config_lib

NEW_TOKENS = 256  # a worked solution calling at every step is at most 126 tokens, observations and EOS included
# Pre-training rows: the longest possible document (a worked one calling the calculator at every step, over every
# train and test example) is 176 tokens, bos and eos included; not model.max_len.
SEQ_LEN = 192


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, small=False, control=False, algo="grpo")
  c = config_lib.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "r1_zero_aha.py"),
                             f"algo={args.algo}")
  c.r1.stages = ("base", "r1_zero")
  c.task.tokenizer = "tools"
  c.model.vocab_size = 516
  c.sampling.max_new_tokens = NEW_TOKENS
  c.model.max_len = c.task.prompt_len + NEW_TOKENS
  c.rl.train_buckets = 2
  c.sampling.engine = "continuous"  # rows pause for the calculator in the continuous engine's slots
  c.r1.pretrain.update(cot_frac=0.5, mistake_frac=0.0, verify_frac=0.0, recheck_per="document",
                       recheck_style="repeat", tool_frac=0.3, seq_len=SEQ_LEN)
  c.tools.update(env="calculator", format="plain", stop_markers=("</tool_call>",), max_turns=4, max_obs_tokens=32)
  if args.small:
    c.task.update(test_size=64)
    c.sampling.max_new_tokens = 128
    c.model.update(hidden=32, inter=64, max_len=SEQ_LEN)
    c.rl.update(G=4, prompts_per_step=4, train_buckets=1)
    c.r1.pretrain.update(steps=40, batch=16)
    c.r1.zero.steps = 4
    c.train.update(eval_every=2, ckpt_every=10)
    c.eval.update(size=8, batch=8)
    c.r1.report.update(size=8, batch=8, n_samples=2, pass_k=(1, 2))
  if args.control:
    c.r1.pretrain.tool_frac = 0.0
    c.tools.env = ""  # the no-tool control: single-turn rollouts
  return c
