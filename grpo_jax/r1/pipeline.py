"""R1-Zero and R1's five stages as one resumable command (`config.job = "r1_pipeline"`); layout in r1/layout.py.

Each stage records the config it ran with (grpo_jax/run/stages.py: `DIR/<stage>/stage.json`, written after its final
outputs). Before any stage runs, the plan compares every stage with its record: finished with the same config →
skipped; finished with a changed config → refused (or continued / redone when the user asks); unfinished → its loop
resumes from its checkpoints. A stage stopped by SIGTERM/SIGINT raises errors.Preempted from its loop: it is logged
`stopped`, gets no record, and no later stage starts. A stage's view names the stages whose outputs it reads, so a
changed upstream stage shows as a change downstream.
"""
from __future__ import annotations

import os
import time
from typing import Sequence

from absl import logging

from grpo_jax.infra import params_ckpt
from grpo_jax.infra import errors
from grpo_jax.model import model as model_lib
from grpo_jax.run import run_config
from grpo_jax.run import validate as validate_lib
from grpo_jax.infra import sharding
from grpo_jax.infra import signals
from grpo_jax.run import stages as stages_lib
from grpo_jax.rl import state as state_lib
from grpo_jax.run import train
from grpo_jax.r1 import corpus
from grpo_jax.r1 import layout
from grpo_jax.r1 import rejection
from grpo_jax.r1 import report
from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.r1 import shared_base
from grpo_jax.r1 import stage_config
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib

# What each stage starts from ("" = a random init); SFT stages also say which tokens carry the loss.
_SFT = {"base": ("", "all"), "r1_1_cold_start": ("base", "completion"), "r1_4_sft": ("base", "completion")}
_RL_INIT = {"r1_zero": "base", "r1_2_grpo": "r1_1_cold_start", "r1_5_final": "r1_4_sft"}
# The stages whose outputs a stage reads, and the `r1.*` keys it reads beyond its derived config (stage_config).
_UPSTREAM = {"base": (), "r1_zero": ("base",), "r1_1_cold_start": ("base",), "r1_2_grpo": ("r1_1_cold_start",),
             "r1_3_rejection": ("r1_2_grpo",), "r1_4_sft": ("base", "r1_3_rejection"), "r1_5_final": ("r1_4_sft",)}
_KEEP = {"base": ("r1.pretrain", "r1.forbidden"), "r1_zero": ("r1.forbidden",),
         "r1_1_cold_start": ("r1.cold_start",), "r1_2_grpo": ("r1.forbidden",),
         "r1_3_rejection": ("r1.rejection", "r1.report.batch", "r1.grpo.rewards", "r1.forbidden"),
         "r1_4_sft": ("r1.sft2",), "r1_5_final": ("r1.forbidden",)}


def stage_list(config, workdir: str, names: Sequence[str] | None = None) -> list[stages_lib.Stage]:
  """The stages (all of layout.STAGES, or `names`) with the config view each records. With r1.base_from the base
  is a copy of that run's (r1/shared_base.py): it records the source's view and has no loop of its own."""
  built: dict[str, stages_lib.Stage] = {}
  src = shared_base.source_dir(config)
  if src and os.path.realpath(src) == os.path.realpath(layout.stage_dir(workdir, "base")):
    # copying a base onto itself: a rerun moved it aside first, then found no finished base to copy
    validate_lib.fail(shared_base.KEY, f"names this run's own base ({src}); give another run's --workdir, or drop it.")
  for name in layout.STAGES:
    kind = "sft" if name in _SFT else "rl" if name in _RL_INIT else "sample"
    ups = _UPSTREAM[name]
    extra = {"stage.upstream": ",".join(stages_lib.upstream(built[u]) for u in ups)} if ups else {}
    view = run_config.view(stage_config.for_stage(config, name), kind, keep=_KEEP[name], extra=extra)
    steps = stage_config.expected_steps(config, name)
    if name == "base" and src:
      view, steps = shared_base.view(config, src, view), None
    built[name] = stages_lib.Stage(name, layout.stage_dir(workdir, name), view, steps=steps)
  return [built[n] for n in (layout.STAGES if names is None else names)]


def check_upstream(config, workdir: str, stages: Sequence[str]) -> None:
  """r1.stages may leave out stages: the ones it runs must find every stage they read (`_UPSTREAM`) that it does
  not run before them finished in `workdir`, with this config. Missing, that was a traceback in the stage (a
  FileNotFoundError for r1_4_sft's data.jsonl); finished with another config, the stage trained on its outputs and
  recorded this config's fingerprint for them. Reads only."""
  names = tuple(stages)
  for i, name in enumerate(names):
    for up in _UPSTREAM[name]:
      if up in names[:i]:
        continue
      st = stage_list(config, workdir, [up])[0]
      why = f"{names!r} runs {name}, which reads the outputs of {up}"
      if not stages_lib.is_done(st):
        validate_lib.fail("r1.stages", f"{why}, but {st.directory} holds no finished {up}; add {up!r} to "
                          "r1.stages (before it), or give the --workdir of a run where it finished.")
      stored = (stages_lib.read_record(st.directory) or {}).get("config")
      changed = run_config.diff(stored, st.view) if isinstance(stored, dict) else []  # None: a pre-record stage
      if changed:
        validate_lib.fail("r1.stages", f"{why}, and the {up} in {st.directory} finished with another config: "
                          f"{run_config.describe(changed[:6], stored, st.view)}; add {up!r} to r1.stages (a changed "
                          "finished stage is then refused, continued or redone as the train.* flags say), or set "
                          "those keys back.")


def _sft_batches(config, tok, workdir: str, stage: str) -> corpus.Batches:
  if stage == "r1_4_sft":
    return corpus.records_batches(config, tok, corpus.read_records(layout.rejection_data(workdir), tok.vocab_size))
  examples = data_lib.load_examples(config.task, "train")
  if stage == "base":
    return corpus.pretrain_batches(config, tok, examples)
  return corpus.cold_start_batches(config, tok, examples)


def _run_rl(config, workdir: str, stage: str, record: dict) -> None:
  c, wd = stage_config.for_stage(config, stage), layout.stage_dir(workdir, stage)
  train.run_rl(c, wd, init_from=layout.params_path(workdir, _RL_INIT[stage]), python_fns=r1_rewards.config_fns(c),
               record=record)
  if layout.checkpointed_steps(wd) < c.train.steps:
    return  # defence in depth (a stop by a signal raises errors.Preempted): run_pipeline sees the missing step
  # run_rl force-saves its last step; the stage's final params are that step's policy.
  abstract = state_lib.abstract_params(sharding.make_mesh(c.mesh), model_lib.ModelConfig.from_config(c.model))
  params = params_ckpt.restore_params_only(os.path.join(wd, "checkpoints"), abstract, step=c.train.steps).params
  params_ckpt.save_params(layout.params_path(workdir, stage), params)


def _run_stage(config, workdir: str, stage: str) -> None:
  record = stage_list(config, workdir, [stage])[0].view
  src = shared_base.source_dir(config) if stage == "base" else ""
  if src:
    shared_base.copy(config, src, layout.stage_dir(workdir, stage))
    # checked now, naming the source: a damaged copy was reported later as this run's own base, with advice to
    # rerun it (which copies the same damage again)
    c = stage_config.for_stage(config, stage)
    abstract = state_lib.abstract_params(sharding.make_mesh(c.mesh), model_lib.ModelConfig.from_config(c.model))
    try:
      params_ckpt.load_params(layout.params_path(workdir, stage), abstract)
    except errors.InputError as e:
      why = str(e).split("; ")[0]  # the reason without load_params' advice (rerunning here copies it again)
      raise errors.InputError(f"{shared_base.KEY}: the base copied from {src} is unusable ({why}); redo that run's "
                              f"base (--config.train.rerun_stages=base there) or drop {shared_base.KEY}.") from None
  elif stage in _SFT:
    init, loss_on = _SFT[stage]
    c = stage_config.for_stage(config, stage)
    train.run_sft(c, layout.stage_dir(workdir, stage), loss_on=loss_on,
                  init_from=layout.params_path(workdir, init) if init else "",
                  batches=_sft_batches(c, tok_lib.for_config(c), workdir, stage), evaluate_at_end=False,
                  record=record)
  elif stage in _RL_INIT:
    _run_rl(config, workdir, stage, record)
  elif stage == "r1_3_rejection":
    os.makedirs(layout.stage_dir(workdir, stage), exist_ok=True)
    stats = rejection.rejection_sample(config, layout.params_path(workdir, "r1_2_grpo"), layout.rejection_data(workdir))
    logging.info("rejection sampling: %s", stats)
  else:
    raise ValueError(f"stage={stage!r} is unknown; use one of {layout.STAGES}")


def run_pipeline(config, workdir: str, stages: Sequence[str] | None = None,
                 actions: dict[str, str] | None = None, report_md: bool = True) -> dict:
  """Runs every unfinished stage of `stages` (default `config.r1.stages`) in order, then evaluates every finished
  model -> DIR/report.md (unless report_md=False, e.g. when only a stage's params are wanted). Returns the report's
  results, or {} when a stage returned before its last step or no report was asked for.

  `actions`: stages.plan's verdicts when the caller (jobs.py) planned already; else planned here, before any
  write. A stage stopped by SIGTERM/SIGINT raises errors.Preempted (not marked done; no later stage starts).
  """
  stages = tuple(config.r1.stages) if stages is None else tuple(stages)
  stage_config.validate(config, stages)
  check_upstream(config, workdir, stages)
  todo = stage_list(config, workdir, stages)
  actions = stages_lib.plan(todo, config, workdir) if actions is None else actions
  os.makedirs(workdir, exist_ok=True)
  for st in todo:
    if actions[st.name] == "skip":
      logging.info("stage %s: finished earlier with this config, skipped", st.name)
      continue
    stop = signals.active()
    if stop is not None and stop.should_stop():
      raise errors.Preempted(f"before stage {st.name} of {workdir}")
    stages_lib.prepare(st, actions[st.name], workdir)
    layout.log_event(workdir, st.name, "start")
    t0 = time.perf_counter()
    try:
      _run_stage(config, workdir, st.name)
    except errors.Preempted:
      layout.log_event(workdir, st.name, "stopped")
      raise
    if st.steps is not None and layout.checkpointed_steps(st.directory) < st.steps:
      layout.log_event(workdir, st.name, "stopped")
      logging.warning("stage %s stopped before step %d; rerun the same command to resume it.", st.name, st.steps)
      return {}
    seconds = time.perf_counter() - t0
    src = shared_base.source_dir(config) if st.name == "base" else ""
    stages_lib.mark_done(st, seconds=round(seconds, 1), **({"copied_from": src} if src else {}))
    layout.log_event(workdir, st.name, f"done {seconds:.1f}s")
  return report.write_report(config, workdir) if report_md else {}
