"""What each `config.job` runs, as stages, and the order of the checks around it (main.py's `run`):

  1. preflight: every input checked, nothing written (preflight.py)
  2. the workdir lock (workdir_lock.py) and the signal handlers (signals.py)
  3. the plan: every stage compared with its record / newest checkpoint config, nothing written (stages.py)
  4. DIR/config.json, then the stages; a stage is marked done only when it finished

job=grpo runs through `run_group`, for one run or a group of S runs whose programs agree (a vmapped sweep group,
studies/sweep_vmap.py): the same checks, plan and stages for each run, the RL stages trained together by
train.train_group (one set-up for one run or S).
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Sequence

from absl import logging

from grpo_jax.infra import errors
from grpo_jax.run import run_config
from grpo_jax.infra import signals
from grpo_jax.run import stages as stages_lib
from grpo_jax.run import train
from grpo_jax.r1 import pipeline
from grpo_jax.run import preflight
from grpo_jax.run import validate
from grpo_jax.infra import multihost
from grpo_jax.infra import workdir_lock
from grpo_jax.hf import model_source
from grpo_jax.r1 import stage_config
from grpo_jax.hf import export


def _write_config(config, workdir: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    run_config.write_json_atomic(os.path.join(workdir, "config.json"),
                                 json.loads(config.to_json_best_effort()))


def grpo_stages(config, workdir: str) -> list[stages_lib.Stage]:
  """An SFT stage in DIR/sft (unless train.init_from is set or sft.steps is 0), then the RL run in DIR."""
  out = []
  extra = {}
  if not config.train.init_from and config.sft.steps > 0:
    sft = stages_lib.Stage("sft", os.path.join(workdir, "sft"), run_config.view(config, "sft"),
                           steps=config.sft.steps, legacy_outputs=("params",))
    out.append(sft)
    extra = {"stage.upstream": stages_lib.upstream(sft)}
  out.append(stages_lib.Stage("rl", workdir, run_config.view(config, "rl", extra=extra), steps=config.train.steps,
                              own_dir=False))
  return out


def run_group(configs: Sequence[Any], workdirs: Sequence[str], *, compiler_options: dict | None = None,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
  """job=grpo for one run or S runs (their programs agree: sweep_vmap.signature): every run checked (nothing
  written on a bad input), the runs' locks taken, every stage planned, then per run DIR/config.json and its SFT
  stage, and the unfinished RL stages trained together (train.train_group). -> {'traces': [...], 'failed':
  {workdir: why}}. Raises errors.Preempted on a stop signal (everything saved), RunStopped for a failing Python
  reward; a run that stopped itself (non-finite steps) is in 'failed', its stage not marked done."""
  configs = [model_source.resolve(c) for c in configs]
  todos = []
  for config, wd in zip(configs, workdirs):
    check(config, wd)
    todos.append(grpo_stages(config, wd))
    stages_lib.allow_set(config)  # both flags are checked here, before the locks create the workdirs
    stages_lib.rerun_set(config, todos[-1])
  info: dict[str, Any] = {"traces": [], "failed": {}}
  with contextlib.ExitStack() as stack:
    for wd in workdirs:
      stack.enter_context(workdir_lock.WorkdirLock(wd))
    stack.enter_context(signals.GracefulStop.ensure())
    plans = [stages_lib.plan(todo, config, wd) for config, todo, wd in zip(configs, todos, workdirs)]
    lanes = sum(actions.get("rl") != "skip" for actions in plans)  # the runs train_group trains as one program
    for config, actions, wd in zip(configs, plans, workdirs):
      if actions.get("rl") in ("resume", "continue"):
        preflight.check_recorded_values(config, wd, lanes)  # before config.json is rewritten
    training = [(c, wd) for c, actions, wd in zip(configs, plans, workdirs) if actions.get("rl") != "skip"]
    preflight.check_group_resolves([c for c, _ in training], [wd for _, wd in training], lanes)  # one program
    members, rl_stages = [], []
    for config, todo, actions, wd in zip(configs, todos, plans, workdirs):
      of = f" of {wd}" if len(workdirs) > 1 else ""
      logging.info("plan%s: %s", of, stages_lib.describe_plan(actions))
      _write_config(config, wd)
      init_from = config.train.init_from
      for st in todo:
        if st.name == "sft":
          init_from = os.path.join(st.directory, "params")
        if actions[st.name] == "skip":
          logging.info("stage %s%s: finished earlier with this config; skipped.", st.name, of)
          continue
        signals.check_stop(f"before stage {st.name} of {wd}")
        stages_lib.prepare(st, actions[st.name], wd)
        if st.name == "sft":
          train.run_sft(config, st.directory, record=st.view)
          stages_lib.mark_done(st)
        else:
          members.append(train.Member(config, wd, init_from, st.view))
          rl_stages.append(st)
    if members:
      runs, info["traces"] = train.train_group(members, compiler_options=compiler_options, log=log)
      for run, st in zip(runs, rl_stages):
        if run.failed:
          info["failed"][run.workdir] = run.failed
        else:
          stages_lib.mark_done(st)
  return info


def stage_list(config, workdir: str) -> list[stages_lib.Stage]:
  if config.job == "grpo":
    return grpo_stages(config, workdir)
  if config.job in ("sft", "pretrain"):
    return [stages_lib.Stage(config.job, workdir, run_config.view(config, "sft"), steps=config.sft.steps,
                             own_dir=False)]
  return pipeline.stage_list(config, workdir, tuple(config.r1.stages))


def check(config, workdir: str) -> None:
  """Every input of the job, nothing written: preflight.check, then for job=r1_pipeline the r1 keys, every
  stage's derived config (r1/stage_config.py) and the finished stages that r1.stages reads but does not run."""
  preflight.check(config, workdir)
  if config.job == "r1_pipeline":
    stage_config.validate(config, tuple(config.r1.stages))
    pipeline.check_upstream(config, workdir, tuple(config.r1.stages))  # stages r1.stages leaves out, finished here


def run(config, workdir: str) -> None:
  """The whole command after flag parsing; raises errors.* for the CLI to report."""
  preflight.check_precision()  # export and the run groups too, before anything starts
  multihost.maybe_initialize()
  multihost.check_same_job(config, workdir)  # before anything is read or written: one job, one program
  if config.job == "export":  # reads the run in workdir and writes elsewhere: no lock, no stages, no config.json
    validate.unread_keys(config)  # every key but export.* is the run's own (its config.json): said, not dropped
    export.run_job(config, workdir)
    return
  if config.job == "grpo":  # a group of one run (run_group: the same checks, plan and stages as below)
    failed = run_group([config], [workdir])["failed"]
    if failed:
      raise train.NonFiniteError(next(iter(failed.values())))
    return
  # Model fields left to the hf: checkpoint are filled in (and set ones checked) before anything else, so the checks,
  # the stage records and DIR/config.json see the real model.
  config = model_source.resolve(config)
  check(config, workdir)
  todo = stage_list(config, workdir)
  stages_lib.allow_set(config)  # both flags are checked here, before the lock creates the workdir
  stages_lib.rerun_set(config, todo)
  with workdir_lock.WorkdirLock(workdir), signals.GracefulStop():
    actions = stages_lib.plan(todo, config, workdir)
    for st in todo:  # an R1 RL stage that resumes: its recorded `auto` values checked now, not stages later
      if st.name in stage_config.RL_STAGES and actions[st.name] in ("resume", "continue"):
        try:
          preflight.check_recorded_values(stage_config.for_stage(config, st.name), st.directory)
        except errors.ConfigError as e:  # which stage's record (each RL stage resolved its own)
          raise errors.ConfigError(f"{str(e).rstrip('.')} (stage {st.name}, {st.directory}).") from None
    logging.info("plan: %s", stages_lib.describe_plan(actions))
    _write_config(config, workdir)
    if config.job in ("sft", "pretrain"):
      st = todo[0]
      if actions[st.name] == "skip":
        logging.info("the run finished earlier with this config; nothing to do.")
        return
      stages_lib.prepare(st, actions[st.name], workdir)
      train.run_sft(config, workdir, loss_on="all" if config.job == "pretrain" else None, record=st.view)
      stages_lib.mark_done(st)
    else:
      pipeline.run_pipeline(config, workdir, actions=actions)
