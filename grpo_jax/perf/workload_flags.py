"""The workload flags `python -m grpo_jax.aot` and `python -m grpo_jax.memory_plan` share, defined once: the
arguments of memory_plan.workload_config (the peers' GRPO workload on a named model shape), --mesh and --json."""
import argparse
from typing import Any, Sequence

from grpo_jax.infra import errors
from grpo_jax.run import validate


POSITIVE, NONNEG = errors.int_at_least(1), errors.int_at_least(0)


def parser(doc: str, models: Sequence[str], dtypes: Sequence[str], mesh_default: str,
           mesh_help: str) -> argparse.ArgumentParser:
  ap = errors.ArgParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="qwen2.5-0.5b", choices=list(models))
  ap.add_argument("--mesh", default=mesh_default, help=mesh_help)
  ap.add_argument("--prompts", type=POSITIVE, default=16)
  ap.add_argument("--G", type=POSITIVE, default=8)
  ap.add_argument("--prompt-len", type=POSITIVE, default=256)
  ap.add_argument("--L", type=POSITIVE, default=512)
  ap.add_argument("--dtype", default="bfloat16", choices=list(dtypes))
  ap.add_argument("--remat", default="full", choices=["none", "full", "dots"])
  ap.add_argument("--minibatches", type=count_or_auto, default=1, help="rl.minibatches, or auto: the fewest that fit "
                  "--hbm-gib (the chip's HBM for aot)")
  ap.add_argument("--rollout-chunks", type=count_or_auto, default=1, help="rl.rollout_chunks: sample and score the "
                  "rollout's rows in this many chunks; auto: the fewest that fit")
  ap.add_argument("--engine", default="static", choices=["static", "continuous"], help="sampling.engine")
  ap.add_argument("--slots", type=NONNEG, default=0, help="sampling.slots (continuous; 0 = rows / rollout chunks)")
  ap.add_argument("--packing", action="store_true", help="rl.packing: padding-free packed training passes")
  ap.add_argument("--pack-rows", type=NONNEG, default=0, help="rl.pack_rows (0 = the planner's: on the CPU the fewest rows "
                  "of 512 tokens, else an eighth of a device's rows)")
  ap.add_argument("--partial-rollouts", action="store_true", help="rl.partial_rollouts: the rollout carry "
                  "(needs --engine continuous)")
  ap.add_argument("--max-staleness", type=NONNEG, default=1, help="rl.max_staleness (with --partial-rollouts)")
  ap.add_argument("--carry-kv", default="keep", choices=["keep", "recompute"], help="rl.carry_kv (with "
                  "--partial-rollouts): recompute re-prefills the slots' KV every step (the roofline's 'carry KV "
                  "recompute')")
  ap.add_argument("--rollout-budget", type=NONNEG, default=0, help="rl.rollout_budget (with --partial-rollouts; 0 = "
                  "auto)")
  ap.add_argument("--algo", default="grpo", help="a preset (grpo_jax/config/presets.py); β = 0 ones keep no reference")
  ap.add_argument("--lora-rank", type=NONNEG, default=0, help="LoRA on all projections, alpha = 2·rank (0 = full FT)")
  ap.add_argument("--lora-base-dtype", default="float32", choices=["float32", "bfloat16"],
                  help="model.lora.base_dtype: the frozen base as the state holds it")
  ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
  return ap


def count_or_auto(text: str) -> int:
  """A positive count, or 'auto' (0: the config's auto value, chosen by rl/auto.py)."""
  if text == "auto":
    return 0
  if not text.isdigit() or int(text) < 1:
    raise argparse.ArgumentTypeError(f"{text!r}: a positive integer or auto")
  return int(text)


def workload_kwargs(a: argparse.Namespace) -> dict[str, Any]:
  """memory_plan.workload_config's keyword arguments from the parsed flags (mesh apart: each tool reads its own)."""
  return dict(model=a.model, prompts=a.prompts, G=a.G, prompt_len=a.prompt_len, L=a.L, dtype=a.dtype, remat=a.remat,
              minibatches=a.minibatches, algo=a.algo, rollout_chunks=a.rollout_chunks, engine=a.engine, slots=a.slots,
              lora_rank=a.lora_rank, lora_base_dtype=a.lora_base_dtype, packing=a.packing, pack_rows=a.pack_rows,
              partial_rollouts=a.partial_rollouts, max_staleness=a.max_staleness, rollout_budget=a.rollout_budget,
              carry_kv=a.carry_kv)


def check_runs(cfg, mesh_shape: dict[str, int]) -> None:
  """What a run of this workload on these devices is refused for (validate.validate_rl: the carry on the static
  engine or beside PPO's critic, ...), as a ConfigError: the tools plan and time only steps that can run. Evaluation
  is not planned: one eval batch of n_samples-divisible size keeps its checks quiet (`cfg` is edited)."""
  dp = mesh_shape["data"] * mesh_shape["fsdp"]
  cfg.eval.batch = dp * cfg.eval.n_samples
  cfg.eval.size = cfg.eval.batch
  cfg.task.test_size = max(cfg.task.test_size, cfg.eval.size)
  validate.validate_rl(cfg, dp * mesh_shape["tensor"])
