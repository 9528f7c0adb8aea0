"""Table c: trainable/frozen state bytes of GRPO vs PPO (separate critic network or value head), equal model size.

  python -m grpo_jax.ablate --config=configs/ablations/memory.py:small --workdir=/tmp/abl_c_small
"""
import ml_collections

from grpo_jax.config import config_lib


def get_config(arg=None):
  small = config_lib.parse_arg(arg, small=False).small
  c = ml_collections.ConfigDict()
  c.table = "memory_table"
  c.seeds = 1  # exact byte counts: one run per cell
  c.vocab = 32_000
  c.sizes = ("512x8", "1024x16", "2048x24")  # hidden x layers
  # Also compile the whole step (XLA memory analysis) at these sizes, for this rollout workload.
  c.compile_sizes = ("512x8",)
  c.workload = ml_collections.ConfigDict(dict(prompts=4, G=8, prompt_len=32, L=64))
  c.columns = ("params_MB", "trainable_MB", "frozen_ref_MB", "trainable_vs_policy_x", "xla_args_MB",
               "xla_temp_MB", "xla_total_MB")
  if small:
    c.sizes = ("256x4", "512x8")
    c.compile_sizes = ("256x4",)
  return c
