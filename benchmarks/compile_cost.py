"""CPU-seconds to trace, lower and compile a config's RL step: the cost a run pays before its first step.

Builds the step exactly as `python -m grpo_jax.main` does (model fields, `auto` knobs, reward terms, state and a
real first batch of the config's task), then times tracing + lowering and the XLA compile separately in process CPU
time (user + sys over every thread: `time.process_time`), which is far steadier on a shared machine than wall time.
`--set key=value` overrides config keys as `--config.key=value` would; `--fast` adds the test suite's XLA flags
(tests/conftest.py: what the suite's compiles cost). No persistent compilation cache is used (a hit would time
nothing).

  python benchmarks/compile_cost.py --config configs/grpo_arith.py:small --set sampling.engine=continuous
  python benchmarks/compile_cost.py --config configs/grpo_arith.py --set sampling.compaction=1 --fast
"""
import argparse
import ast
import os
import sys
import time

FAST_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
              " --xla_cpu_use_fusion_emitters=false")  # tests/conftest.py's FAST_COMPILE_FLAGS


def _value(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", required=True, help="configs/<exp>.py[:arg]")
  ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (repeatable)")
  ap.add_argument("--fast", action="store_true", help="the test suite's fast-compiling XLA flags")
  a = ap.parse_args(argv)
  if a.fast:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_FLAGS).strip()
  import jax  # pylint: disable=g-import-not-at-top  (after XLA_FLAGS)
  jax.config.update("jax_enable_compilation_cache", False)
  from grpo_jax.config import config_lib  # pylint: disable=g-import-not-at-top
  from grpo_jax.hf import model_source
  from grpo_jax.rl import auto
  from grpo_jax.rl import families
  from grpo_jax.run import train
  from grpo_jax.run import validate
  from grpo_jax.tasks import data as data_lib

  path, _, arg = a.config.partition(":")
  config = config_lib.load_config(path, arg or None)
  config = config_lib.override(config, {k: _value(config_lib.auto_text(k, v))
                                        for k, _, v in (s.partition("=") for s in a.set)})
  config = model_source.resolve(config)
  tokenizer, mesh, mcfg = train.setup_common(config, "/tmp/compile_cost_unused", validate.validate_rl)
  config, _ = auto.resolve_here(config, mesh)
  spec = train.reward_terms(config, tokenizer)
  family = families.for_config(config)
  step = families.make_step(config, mesh, mcfg, spec, tokenizer, family=family)
  state, _ = train.init_or_restore(config, mesh, mcfg, family, _NoCheckpoint(), "")
  rl = config.rl
  n_prompts = rl.prompts_per_step * (rl.oversample if rl.dynamic_sampling else 1)
  batch = train.device_batch(mesh, next(data_lib.rl_batches(config.task, tokenizer, "train", n_prompts, config.seed,
                                                             0, config.task.prompt_len)))
  c0, w0 = time.process_time(), time.perf_counter()
  lowered = step.lower(state, batch)
  c1, w1 = time.process_time(), time.perf_counter()
  compiled = lowered.compile()
  c2, w2 = time.process_time(), time.perf_counter()
  spec.close()
  # the optimised program's size (fusion bodies included): what the compile time follows, steadier than CPU-s
  instructions = sum(" = " in line for line in compiled.as_text().splitlines())
  print(f"RESULT trace_lower_cpu_s={c1 - c0:.2f} compile_cpu_s={c2 - c1:.2f} total_cpu_s={c2 - c0:.2f} "
        f"total_wall_s={w2 - w0:.2f} hlo_instructions={instructions} engine={config.sampling.engine} "
        f"compaction={config.sampling.compaction} packing={config.rl.packing} fast_flags={a.fast}")
  return 0


class _NoCheckpoint:
  """init_or_restore's checkpointer for a fresh state: nothing saved, nothing to resume."""

  def latest_step(self):
    return None


if __name__ == "__main__":
  sys.exit(main())
