"""Every user input a job reads, checked before the CLI writes anything or compiles anything.

Config values (validate.py), the model config, the task's knobs, the tokenizer path, reward term names, init
checkpoints (`train.init_from`, `sft.init_from`, `hf:` directories), data and work directories. A failure is one
errors.InputError line naming the key or path and the fix. Functions called here only READ their inputs, so their
ValueErrors are input errors by construction (errors.input_errors).
"""
from __future__ import annotations

import glob
import json
import os

from grpo_jax.infra import errors
from grpo_jax.run import validate
from grpo_jax.rl import rewards as rewards_lib
from grpo_jax.run import train
from grpo_jax.model import model as model_lib
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib
from grpo_jax.hf import hf_io

JOB_HELP = "grpo (every rl.algo, PPO included: job=grpo rl.algo=ppo), sft, pretrain, r1_pipeline or export"


def check_job(config) -> None:
  if config.job not in validate.JOBS:
    raise errors.ConfigError(f"config.job: unknown job {config.job!r}; choose {JOB_HELP}.")


def check_workdir(workdir: str) -> None:
  """The work directory can be created and written (object-store URIs are checked by their first write)."""
  if not workdir:
    raise errors.InputError("--workdir is required: the directory for config.json, metrics.jsonl, checkpoints and "
                            "plots.")
  if "://" in workdir:
    return
  path = os.path.abspath(workdir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise errors.InputError(f"--workdir={workdir} is a file, not a directory; pass a directory path.")
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise errors.InputError(f"--workdir={workdir}: {parent} is a file, so the directory cannot be created; pass "
                            "another path.")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise errors.InputError(f"--workdir={workdir}: {parent} is not writable; pass a directory you can write to.")


def check_init_from(key: str, value: str) -> None:
  """`hf:<dir>` must hold config.json and safetensors; anything else must be a params checkpoint directory."""
  if not value:
    return
  if value.startswith("hf:"):
    d = value[3:]
    if not os.path.isdir(d):
      raise errors.InputError(f"config.{key}={value}: {d} is not a directory; point it at a Hugging Face checkpoint "
                              "directory (config.json + *.safetensors).")
    cfg = os.path.join(d, "config.json")
    if not os.path.isfile(cfg):
      raise errors.InputError(f"config.{key}={value}: {cfg} is missing; a Hugging Face checkpoint directory holds "
                              "config.json and *.safetensors.")
    if not glob.glob(os.path.join(d, "*.safetensors")):
      raise errors.InputError(f"config.{key}={value}: no *.safetensors files in {d}; download the weights too.")
    with errors.input_errors(f"config.{key}={value}: {cfg}"):
      with open(cfg, encoding="utf-8") as f:
        hf = json.load(f)
      hf_io.config_from_hf(hf)
    return
  if "://" in value:
    return
  if not os.path.exists(value):
    raise errors.InputError(f"config.{key}={value} does not exist; point it at a params checkpoint (e.g. "
                            "DIR/sft/params of an earlier run) or hf:<dir> for a Hugging Face checkpoint.")
  if not os.path.isdir(value):
    raise errors.InputError(f"config.{key}={value} is a file; a params checkpoint is a directory (e.g. "
                            "DIR/sft/params), and a Hugging Face checkpoint is given as hf:<dir>.")


def check_rewards(config, tokenizer) -> None:
  known = set(rewards_lib.REGISTRY) | set(train.python_reward_fns(config, tokenizer))
  for i, entry in enumerate(config.rewards):
    if isinstance(entry, (tuple, list)) and len(entry) == 2 and entry[0] not in known:
      raise errors.ConfigError(f"config.rewards[{i}]: unknown reward term {entry[0]!r}; choose from {sorted(known)} "
                               "(Python terms: train.python_reward_fns).")


def check(config, workdir: str) -> None:
  """All of it, in the order a user fixes things; raises the first problem as one line."""
  import jax  # pylint: disable=g-import-not-at-top
  check_workdir(workdir)
  check_job(config)
  validate.validate_model(config)
  with errors.input_errors("config.model"):
    model_lib.ModelConfig.from_config(config.model)
  with errors.input_errors("config.task"):
    data_lib.make_task(config.task)
  data_dir = config.task.get("data_dir", "")
  if data_dir and "://" not in data_dir and os.path.exists(data_dir) and not os.path.isdir(data_dir):
    raise errors.ConfigError(f"config.task.data_dir: {data_dir} is a file; pass a directory (datasets are built "
                             "there on first use).")
  with errors.input_errors("config.task.tokenizer"):
    tokenizer = tok_lib.for_config(config)
  n = jax.device_count()
  if config.job == "grpo":
    validate.validate_rl(config, n, tokenizer)
    check_rewards(config, tokenizer)
  elif config.job in ("sft", "pretrain"):
    validate.validate_sft(config, n, tokenizer)
  # job=r1_pipeline: the r1 keys and every stage's derived config are jobs.check's (r1/ is reached from jobs.py only).
  check_init_from("train.init_from", config.train.init_from)
  check_init_from("sft.init_from", config.sft.init_from)
