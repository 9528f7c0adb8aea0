"""Every user input a job reads, checked before the CLI writes anything or compiles anything.

Config values (validate.py), the model config, the task's knobs, the tokenizer path, reward term names, init
checkpoints (`train.init_from`, `sft.init_from`, `hf:` directories), data and work directories. A failure is one
errors.InputError line naming the key or path and the fix. Functions called here only READ their inputs, so their
ValueErrors are input errors by construction (errors.input_errors).
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from grpo_jax.envs import batch as env_batch
from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.infra import errors
from grpo_jax.rl import auto
from grpo_jax.rl import memory_plan
from grpo_jax.run import run_config
from grpo_jax.run import validate
from grpo_jax.rl import rewards as rewards_lib
from grpo_jax.rl import reward_spec
from grpo_jax.run import train
from grpo_jax.model import model as model_lib
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import hf_tokenizer
from grpo_jax.tasks import registry as task_registry
from grpo_jax.tasks import tokenizer_factory as tok_lib
from grpo_jax.hf import hf_io
from grpo_jax.hf import model_source

JOB_HELP = "grpo (every rl.algo, PPO included: job=grpo rl.algo=ppo), sft, pretrain, r1_pipeline or export"


def check_job(config) -> None:
  if config.job not in validate.JOBS:
    raise errors.ConfigError(f"config.job: unknown job {config.job!r}; choose {JOB_HELP}.")


def check_workdir(workdir: str) -> None:
  """The work directory is a local or mounted path that can be created and written. An object-store URI is refused:
  only the checkpoints go through etils epath; config.json, metrics.jsonl, samples, plots and the stage records use
  local file calls, which put `gs://b/run` in a local directory `gs:/b/run`, apart from the run's checkpoints."""
  if not workdir:
    raise errors.InputError("--workdir is required: the directory for config.json, metrics.jsonl, checkpoints and "
                            "plots.")
  if "://" in workdir:
    raise errors.InputError(f"--workdir={workdir}: an object-store workdir is not supported (the run's records are "
                            "written with local file calls); pass a local or mounted path, e.g. the bucket mounted "
                            "with gcsfuse (docs/reliability.md).")
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


def check_init_from(key: str, value: str, mcfg=None) -> None:
  """`hf:<dir>` must hold config.json and safetensors; anything else must be a params checkpoint directory (not a
  run or a training-state checkpoint) whose shapes are `mcfg`'s, when given."""
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
      raise errors.InputError(f"config.{key}={value}: {hf_io.no_weights_message(d)}")
    with errors.input_errors(f"config.{key}={value}: {cfg}"):
      with open(cfg, encoding="utf-8") as f:
        hf = json.load(f)
      hf_io.config_from_hf(hf)
    return
  # through the checkpoint code's filesystem (epath): a gs:// checkpoint is checked as a local one, where readable
  path = ckpt_lib.as_path(value)
  kind = _read_remote(lambda: "dir" if path.is_dir() else "file" if path.exists() else "none", value,
                      f"the checks of config.{key}", "the run reads it when it starts")
  if kind is None:
    return
  if kind == "none":
    raise errors.InputError(f"config.{key}={value} does not exist; point it at a params checkpoint (e.g. "
                            "DIR/sft/params of an earlier run) or hf:<dir> for a Hugging Face checkpoint.")
  if kind == "file":
    raise errors.InputError(f"config.{key}={value} is a file; a params checkpoint is a directory (e.g. "
                            "DIR/sft/params), and a Hugging Face checkpoint is given as hf:<dir>.")
  hint = ("init_from takes a params checkpoint (DIR/sft/params, DIR/<stage>/params), or hf:<dir> of an export "
          "(python -m grpo_jax.export RUN_DIR OUT_DIR)")
  if (path / "checkpoints").is_dir():
    raise errors.InputError(f"config.{key}={value} is a run directory, not a params checkpoint; {hint}.")
  if (path / "state").is_dir():
    raise errors.InputError(f"config.{key}={value} is one step of a run's training checkpoints (params, optimizer "
                            f"state, rng), not a params checkpoint; {hint}.")
  if any(c.name.isdigit() and (c / "state").is_dir() for c in path.iterdir()):
    raise errors.InputError(f"config.{key}={value} is a run's checkpoints directory (one training state per step), "
                            f"not a params checkpoint; {hint}.")
  if mcfg is not None:
    check_params_shapes(key, value, mcfg)


def check_params_shapes(key: str, path: str, mcfg) -> None:
  """A params checkpoint's stored shapes (orbax metadata: nothing restored) against the configured model's."""
  try:
    meta = ocp.StandardCheckpointer().metadata(ckpt_lib.as_path(path))
  except Exception as e:  # pylint: disable=broad-except  (orbax: not a checkpoint, unreadable metadata)
    raise errors.InputError(f"config.{key}={path} is not a readable params checkpoint ({type(e).__name__}: "
                            f"{errors.one_line(str(e))[:200]}); point it at DIR/sft/params or DIR/<stage>/params "
                            "of a finished run.") from None
  stored = {jax.tree_util.keystr(p): tuple(m.shape) for p, m in
            jax.tree_util.tree_leaves_with_path(getattr(meta, "item_metadata", meta)) if hasattr(m, "shape")}
  if any(k.startswith(("['params']", "['opt_state']")) for k in stored):
    raise errors.InputError(f"config.{key}={path} is a training-state tree (params, optimizer state, step, rng: "
                            "DIR/checkpoints/<n>/state of a run), not a params checkpoint, and not another model; "
                            "pass DIR/sft/params or DIR/<stage>/params of a finished stage, or export that step "
                            "(python -m grpo_jax.export DIR OUT --step <n>) and pass hf:OUT.")
  want = {jax.tree_util.keystr(p): tuple(x.shape) for p, x in
          jax.tree_util.tree_leaves_with_path(model_lib.param_shapes(mcfg))}
  missing = sorted(set(want) - set(stored))
  bad = [f"{k} {stored[k]} (the config's model: {want[k]})" for k in sorted(want) if k in stored and stored[k] != want[k]]
  if missing or bad:
    what = (f"{len(bad)} params of another shape, e.g. {bad[0]}" if bad else
            f"no {missing[0]} ({len(missing)} params of the config's model missing)")
    raise errors.ConfigError(f"config.{key}={path}: the checkpoint holds a different model ({what}); set config.model "
                             "to the shape it was trained with, or point init_from at a checkpoint of this model.")


def _read_remote(read, path: str, what: str, later: str):
  """read() through the checkpoint code's filesystem (etils epath: gs://, s3://, ... as local paths); where this
  host cannot read an object store (no gcsfs, no credentials), `what` is skipped with a warning saying why and
  what checks it `later` (-> None). A local path's errors propagate."""
  try:
    return read()
  except Exception as e:  # pylint: disable=broad-except  (ImportError without gcsfs, auth or network errors)
    if "://" not in path:
      raise
    logging.warning("preflight: %s for %s skipped: this host cannot read it (%s: %s); %s.", what, path,
                    type(e).__name__, errors.one_line(str(e))[:200], later)
    return None


def _recorded(workdir: str) -> dict:
  """The `auto` values the newest checkpoint of `workdir` recorded ({} for a fresh run), read through the checkpoint
  code's filesystem (_read_remote: an object store this host cannot read is skipped with a warning)."""
  ckpt_dir = os.path.join(workdir, "checkpoints")
  newest = _read_remote(lambda: ckpt_lib.newest_meta(ckpt_dir), ckpt_dir, "the resume checks of its recorded "
                        "`auto` values", "the run checks them where it restores")
  return run_config.recorded_settings(newest[1].get("config")) if newest else {}


def check_recorded_values(config, workdir: str, lanes: int = 1) -> None:
  """A resume reuses the `auto` values its newest checkpoint recorded (rl/auto.py): the config is validated with them
  (train.check_recorded) once the stage plan has accepted the resume, before DIR/config.json is rewritten: a value
  that no longer fits (sampling.slots above the rows of a changed prompts_per_step) was refused only after it had
  been rewritten with the refused config. Reads only. `workdir`: the RL stage's directory (the grpo job's: --workdir
  itself; an R1 RL stage's: its own). `lanes`: the runs trained as one vmapped program, sharing each device (a sweep
  group: train.train_group resolves them for 1/lanes of its memory)."""
  recorded = _recorded(workdir)
  if not recorded:
    return
  mesh = validate.validate_mesh(config, validate.device_count())
  hbm = validate.device_memory()
  ctx = auto.Context(mesh, None if hbm is None else hbm // lanes)
  resolved, _ = auto.resolve(config, ctx, log=False, recorded=recorded)
  try:  # what a fresh run picks here: the refusal names it as the way forward
    today = auto.resolved_values(auto.resolve(config, ctx, log=False)[0])
  except (errors.ConfigError, ValueError):
    today = None
  train.check_recorded(resolved, recorded, tok_lib.for_config(config), today)
  auto.check_recorded_fits(config, resolved, recorded, ctx)  # another device count or size than the first run's


def check_group_resolves(configs, workdirs, lanes: int) -> None:
  """The runs of one vmapped program (a sweep group) resolve their `auto` knobs as train.train_group will (each its
  recorded values on resume, 1/lanes of each device's memory) and must agree: runs recorded under other choices
  (a group extended with new seeds after a rule or the device changed) were refused by train_group only after
  config.json had been rewritten and the new runs' SFT stages had run. Reads only."""
  if len(configs) < 2:
    return
  hbm = validate.device_memory()
  ctx = auto.Context(validate.validate_mesh(configs[0], validate.device_count()), None if hbm is None else hbm // lanes)
  # compared by what each runs (auto.program_values): a recorded 8 compaction sizes of 64 slots runs today's 7
  picked, differ = auto.disagree([auto.resolve(config, ctx, log=False, recorded=_recorded(wd))[0]
                                  for config, wd in zip(configs, workdirs)], ctx)
  if differ:
    runs = ", ".join(f"{os.path.basename(wd.rstrip('/'))}: " + ", ".join(f"{k}={p.get(k)}" for k in differ)
                     for wd, p in zip(workdirs, picked))
    raise errors.InputError(f"the runs of one program resolved {', '.join(differ)} differently ({runs}; runs recorded "
                            "under other `auto` choices): set the keys explicitly, or run them with --mode=serial.")


def check_tokenizer_model(config, tokenizer) -> None:
  """A Hugging Face tokenizer against the Hugging Face model it runs with (train.init_from / sft.init_from=hf:<dir>,
  else the config.json beside tokenizer.json): hf_tokenizer.model_mismatches. One line naming both, unless
  task.allow_tokenizer_mismatch says the pairing is meant (then a warning)."""
  if not isinstance(tokenizer, hf_tokenizer.HFTokenizer):
    return
  src = model_source.source(config)
  model_dir = src[1] if src else tokenizer.directory
  if not os.path.isfile(os.path.join(model_dir, "config.json")):
    return
  problems = hf_tokenizer.model_mismatches(tokenizer, model_dir, chat=config.task.get("prompt_format") == "chat")
  if not problems:
    return
  msg = (f"config.task.tokenizer: the tokenizer {tokenizer.file} does not look like the model's ({model_dir}): "
         f"{'; '.join(problems)}. Use the model's own tokenizer (task.tokenizer=init_from), or set "
         "task.allow_tokenizer_mismatch=True if this pairing is meant.")
  if config.task.get("allow_tokenizer_mismatch", False):
    logging.warning("%s (allowed by task.allow_tokenizer_mismatch)", msg)
    return
  raise errors.ConfigError(msg)


def check_rewards(config, tokenizer) -> None:
  """Every term is known, and every in-graph term can be built for this task and tokenizer (its maker refuses a
  task it cannot score, e.g. `incorrect` without an in-graph answer parser)."""
  py = train.python_reward_fns(config, tokenizer)
  known = set(rewards_lib.REGISTRY) | set(py)
  for i, entry in enumerate(config.rewards):
    if isinstance(entry, (tuple, list)) and len(entry) == 2 and entry[0] not in known:
      raise errors.ConfigError(f"config.rewards[{i}]: unknown reward term {entry[0]!r}; choose from {sorted(known)} "
                               "(Python terms: train.python_reward_fns).")
    if isinstance(entry, (tuple, list)) and len(entry) == 2 and entry[0] not in py:
      rewards_lib.REGISTRY[entry[0]](reward_spec.Context(config.task.name, tokenizer))


def check_packages(config) -> None:
  """Optional packages the config asks for are importable (else the run would fail after its first stage)."""
  wanted = [("log.wandb_project", "wandb", bool(config.log.wandb_project), "set log.wandb_project=''"),
            ("log.tensorboard", "tensorboardX", bool(config.log.tensorboard), "set log.tensorboard=False"),
            ("task.grader", "math_verify", config.task.get("grader", "numeric") == "symbolic",
             "pip install -e '.[math]' (math-verify), or set task.grader=numeric")]
  for key, module, used, off in wanted:
    if used and importlib.util.find_spec(module) is None:
      fix = off if off.startswith("pip") else f"pip install {module}, or {off}"
      raise errors.ConfigError(f"config.{key}: needs the {module} package, which is not installed; {fix}.")


def check_data(config, tokenizer) -> None:
  """The task's splits as the run will read them: every prompt against task.prompt_len (task.overlong_prompts), and
  enough usable test examples for each evaluation. Reads (and on first use builds) the splits; writes no workdir."""
  if config.job not in ("grpo", "sft", "r1_pipeline"):
    return  # pretrain encodes no prompts
  splits = ("test",) if config.job == "sft" else ("train", "test")
  t, usable = config.task, {}
  with errors.input_errors("config.tools.env"):
    tools = env_batch.prompt_tools(config, tokenizer)  # tools.format='qwen': the prompts list the tools
  for split in splits:
    with errors.input_errors(f"config.task.data_dir={t.data_dir!r}" if t.data_dir else "config.task"):
      examples = data_lib.load_examples(t, split)
    try:
      usable[split] = len(data_lib.fit_prompts(t, tokenizer, split, examples, t.prompt_len, tools))
    except ValueError as e:
      raise errors.ConfigError(f"config.{errors.one_line(str(e))}") from None
    if usable[split] < len(examples):
      logging.warning("task.overlong_prompts=drop: %d of the %d %s prompts are longer than task.prompt_len=%d "
                      "tokens and are skipped.", len(examples) - usable[split], len(examples), split, t.prompt_len)
    elif t.overlong_prompts == "truncate":  # cut, not skipped: said as drop's skips are
      cut = int((data_lib.prompt_lengths(t, tokenizer, split, examples, tools) > t.prompt_len).sum())
      if cut:
        logging.warning("task.overlong_prompts=truncate: %d of the %d %s prompts are longer than task.prompt_len=%d "
                        "tokens and are cut to bos + their last %d tokens.", cut, len(examples), split, t.prompt_len,
                        t.prompt_len - 1)
  check_held_out(config)
  sizes = [("eval.size", config.eval.size)]
  if config.job == "r1_pipeline":
    sizes.append(("r1.report.size", config.r1.report.size))
  for key, n in sizes:
    if n > usable["test"]:
      where = f" in {t.data_dir}" if t.data_dir else ""
      raise errors.ConfigError(f"config.{key}: {n} exceeds the {usable['test']} usable examples of the test "
                               f"split{where}; set {key}={usable['test']} or lower (a multiple of its batch).")


def check_held_out(config) -> None:
  """A dataset copy whose test questions also appear in its train split (or that repeats questions) is trained and
  evaluated as given, and said: one warning per kind, with the count and the first example."""
  t = config.task
  if task_registry.generated(t.name):
    return  # disjoint and without test repeats by construction (base.Task.examples); train draws with replacement
  with errors.input_errors(f"config.task.data_dir={t.data_dir!r}" if t.data_dir else "config.task"):
    found = data_lib.repeated_questions(t)
  where = f" in {t.data_dir}" if t.data_dir else ""
  for kind, what, effect in (
      ("test_in_train", "test questions are also train questions", "held-out accuracy on them is not held out; "
       "remove them from one of the splits"),
      ("test_repeats", "test questions repeat an earlier test question", "evaluation counts them twice"),
      ("train_repeats", "train questions repeat an earlier train question", "training draws them more often")):
    if found[kind]:
      split = "train" if kind == "train_repeats" else "test"
      logging.warning("task data%s: %d %s (%s example %d first): %s.", where, len(found[kind]), what, split,
                      found[kind][0], effect)


def check_sft_lengths(config, tokenizer) -> None:
  """The SFT stage's sequences (data.sft_batches: job=sft / pretrain, or the grpo job's SFT stage) fit
  model.max_len: a longer one was a ValueError traceback at the stage's first batch, after the run's files were
  written. The R1 pipeline's stages build their own corpora (r1/corpus.py)."""
  if config.job in ("sft", "pretrain"):
    mode = "all" if config.job == "pretrain" else config.sft.loss_on
  elif config.job == "grpo" and config.sft.steps > 0 and not config.train.init_from:
    mode = config.sft.loss_on
  else:
    return
  if mode not in ("completion", "all"):
    return  # validate_sft names it
  examples = data_lib.load_examples(config.task, "train")
  drawn = data_lib.sft_drawn(len(examples), config.seed, config.sft.steps, config.sft.batch)
  lengths = data_lib.sft_lengths(config.task, tokenizer, "train", mode, config.sft.mistake_frac > 0, drawn)
  limit = config.model.max_len
  if len(lengths) and lengths.max() > limit:
    over = np.flatnonzero(lengths > limit)
    index = examples[int(drawn[over[0]])]["index"]
    raise errors.ConfigError(
        f"config.model.max_len: {limit} tokens are too few for the SFT stage: {len(over)} of the {len(lengths)} "
        f"train sequences its {config.sft.steps} steps draw are longer (longest {int(lengths.max())}, example "
        f"{index} first; bos + prompt + worked solution + eos); set model.max_len={int(lengths.max())} or more.")


def check_precision() -> None:
  """JAX's 64-bit mode (JAX_ENABLE_X64=1, or jax.config.update('jax_enable_x64', True) before the run) is refused:
  every program here is written for 32-bit (int32 positions, indices and loop bounds, fp32 / bf16 compute), and under
  x64 the RL step does not trace (int64 and int32 indices meet in dynamic_update_slice)."""
  if jax.config.jax_enable_x64:
    raise errors.InputError("jax_enable_x64 is on (JAX_ENABLE_X64=1, or jax.config.update('jax_enable_x64', True)): "
                            "grpo_jax's programs are 32-bit (int32 indices, fp32 / bf16 compute); unset "
                            "JAX_ENABLE_X64 and run again.")


def check(config, workdir: str) -> None:
  """All of it, in the order a user fixes things; raises the first problem as one line."""
  check_precision()
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
  check_tokenizer_model(config, tokenizer)
  n = validate.device_count()
  validate.validate_groups(config)
  validate.validate_keep_best(config)
  validate.validate_tools(config, tokenizer)
  check_packages(config)
  if config.job == "grpo":
    validate.validate_rl(config, n, tokenizer)
    auto.check_choosable(config, validate.validate_mesh(config, n), validate.device_memory())
    check_rewards(config, tokenizer)
    if config.sft.steps > 0 and not config.train.init_from:  # the SFT stage runs first: its keys are checked too
      validate.validate_sft(config, n, tokenizer)
      memory_plan.check_sft_fits(config, validate.validate_mesh(config, n), validate.device_memory())
  elif config.job in ("sft", "pretrain"):
    validate.validate_sft(config, n, tokenizer)
    memory_plan.check_sft_fits(config, validate.validate_mesh(config, n), validate.device_memory())
  # job=r1_pipeline: the r1 keys and every stage's derived config are jobs.check's (r1/ is reached from jobs.py only).
  validate.unread_keys(config)  # keys the user set that this job does not read: one warning line per reason
  mcfg = model_lib.ModelConfig.from_config(config.model)
  check_init_from("train.init_from", config.train.init_from, mcfg)
  check_init_from("sft.init_from", config.sft.init_from, mcfg)
  check_data(config, tokenizer)
  check_sft_lengths(config, tokenizer)
  sft_evaluates = config.job == "sft" and validate.sft_evaluates(config)
  if sft_evaluates:  # its one decode: after the SFT's own checks
    validate.validate_eval_decode(config, validate.validate_mesh(config, n))
  if config.job == "grpo" or sft_evaluates:
    # the held-out evaluation's own plan (auto.resolve_eval, as the run makes it): a set value it cannot take here
    # (the TPU kernel on a CPU) stopped the job at its evaluation, after an SFT had trained
    auto.resolve_eval(config, auto.Context(validate.validate_mesh(config, n), validate.device_memory()),
                      rl_state=config.job == "grpo", log=False)
  check_hf_weights(config)


def check_hf_weights(config) -> None:
  """The Hugging Face checkpoint the model loads from (model_source.source) holds finite weights: a NaN / inf tensor
  is one line naming it and its file before the run writes DIR/config.json (load_params found it only after).
  Last: it reads every weight once, the slowest check here."""
  src = model_source.source(config)
  if src is None or not os.path.isdir(src[1]):
    return
  t0 = time.monotonic()
  hf_io.check_finite(src[1])
  logging.info("%s=hf:%s: every weight finite (checked in %.1f s)", src[0], src[1], time.monotonic() - t0)
