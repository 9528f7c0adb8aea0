"""What each `config.job` runs, as stages, and the order of the checks around it (main.py's `run`):

  1. preflight: every input checked, nothing written (preflight.py)
  2. the workdir lock (workdir_lock.py) and the signal handlers (signals.py)
  3. the plan: every stage compared with its record / newest checkpoint config, nothing written (stages.py)
  4. DIR/config.json, then the stages; a stage is marked done only when it finished
"""
from __future__ import annotations

import json
import os

from absl import logging

from grpo_jax.run import run_config
from grpo_jax.infra import signals
from grpo_jax.run import stages as stages_lib
from grpo_jax.run import train
from grpo_jax.r1 import pipeline
from grpo_jax.run import preflight
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


def _run_grpo(config, workdir: str, todo: list[stages_lib.Stage], actions: dict[str, str]) -> None:
  init_from = config.train.init_from
  for st in todo:
    if st.name == "sft":
      init_from = os.path.join(st.directory, "params")
    if actions[st.name] == "skip":
      logging.info("stage %s: finished earlier with this config; skipped.", st.name)
      continue
    signals.check_stop(f"before stage {st.name} of {workdir}")
    stages_lib.prepare(st, actions[st.name], workdir)
    if st.name == "sft":
      train.run_sft(config, st.directory, record=st.view)
    else:
      train.run_rl(config, workdir, init_from=init_from, record=st.view)
    stages_lib.mark_done(st)


def stage_list(config, workdir: str) -> list[stages_lib.Stage]:
  if config.job == "grpo":
    return grpo_stages(config, workdir)
  if config.job in ("sft", "pretrain"):
    return [stages_lib.Stage(config.job, workdir, run_config.view(config, "sft"), steps=config.sft.steps,
                             own_dir=False)]
  return pipeline.stage_list(config, workdir, tuple(config.r1.stages))


def check(config, workdir: str) -> None:
  """Every input of the job, nothing written: preflight.check, then for job=r1_pipeline the r1 keys and every
  stage's derived config (r1/stage_config.py)."""
  preflight.check(config, workdir)
  if config.job == "r1_pipeline":
    stage_config.validate(config, tuple(config.r1.stages))


def run(config, workdir: str) -> None:
  """The whole command after flag parsing; raises errors.* for the CLI to report."""
  multihost.maybe_initialize()
  if config.job == "export":  # reads the run in workdir and writes elsewhere: no lock, no stages, no config.json
    export.run_job(config, workdir)
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
    logging.info("plan: %s", stages_lib.describe_plan(actions))
    _write_config(config, workdir)
    if config.job == "grpo":
      _run_grpo(config, workdir, todo, actions)
    elif config.job in ("sft", "pretrain"):
      st = todo[0]
      if actions[st.name] == "skip":
        logging.info("the run finished earlier with this config; nothing to do.")
        return
      stages_lib.prepare(st, actions[st.name], workdir)
      train.run_sft(config, workdir, loss_on="all" if config.job == "pretrain" else None, record=st.view)
      stages_lib.mark_done(st)
    else:
      pipeline.run_pipeline(config, workdir, actions=actions)
