"""CLI: python -m grpo_jax.main --config=configs/<exp>.py[:arg] --workdir=DIR [--config.key=value ...]."""
import json
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/<exp>.py[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for config.json, metrics.jsonl, checkpoints, plots.")


def _save_config(config, workdir: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(json.dumps(json.loads(config.to_json_best_effort()), indent=2, sort_keys=True))


def run(config, workdir: str) -> None:
  from grpo_jax import multihost
  multihost.maybe_initialize()
  from grpo_jax import model_source
  from grpo_jax import train
  if config.job == "export":  # reads the run in workdir; writes nothing there
    from grpo_jax import export
    export.run_job(config, workdir)
    return
  # Model fields left to the hf: checkpoint are filled in (and set ones checked) before anything else, so
  # validation and DIR/config.json see the real model.
  config = model_source.resolve(config)
  _save_config(config, workdir)
  if config.job == "grpo":
    import jax
    from grpo_jax import validate
    from grpo_jax.tasks import tokenizer as tok_lib
    validate.validate_rl(config, jax.device_count(), tok_lib.for_config(config))  # every stage's keys, before compiling
    init_from = config.train.init_from
    if not init_from and config.sft.steps > 0:
      # Stage 1: an SFT checkpoint to start RL from (skipped once DIR/sft/params exists).
      sft_dir = os.path.join(workdir, "sft")
      if not os.path.exists(os.path.join(sft_dir, "params")):
        train.run_sft(config, sft_dir)
      init_from = os.path.join(sft_dir, "params")
    train.run_rl(config, workdir, init_from=init_from)
  elif config.job in ("sft", "pretrain"):
    train.run_sft(config, workdir, loss_on="all" if config.job == "pretrain" else None)
  elif config.job == "r1_pipeline":
    from grpo_jax.r1 import pipeline
    pipeline.run_pipeline(config, workdir)
  else:
    raise ValueError(f"config.job: unknown job {config.job!r}; choose grpo, sft, pretrain, r1_pipeline or export.")


class _QuietLibraries(logging.logging.Filter):
  """Keeps orbax's per-save INFO chatter out of the run log; its warnings and errors still show."""

  def filter(self, record) -> bool:
    return record.levelno >= logging.WARNING or "/orbax/" not in record.pathname


def main(argv) -> None:
  del argv
  logging.get_absl_handler().addFilter(_QuietLibraries())
  from grpo_jax import validate
  if _WORKDIR.value is None:
    sys.exit("--workdir is required: the directory for metrics.jsonl, checkpoints and plots.")
  try:
    run(_CONFIG.value, _WORKDIR.value)
  except validate.ConfigError as e:
    # One line naming the key and the fix; no traceback for a bad config.
    logging.flush()
    print(f"Config error: {e}", file=sys.stderr)
    sys.exit(2)


def _entry():
  # An unknown --config.key fails inside absl's flag parsing with a traceback; turn it into one line.
  try:
    app.run(main)
  except AttributeError as e:
    print(f"Config error: {e}. Check the key's spelling against grpo_jax/config_lib.py.", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  _entry()
