"""Stages are atomic: a stage is done only when it finished, and a done stage remembers the config it ran with.

A stage (the SFT stage of the main job, an R1 pipeline stage, or the whole run of `job=grpo/sft/pretrain`) writes
`<dir>/stage.json` = {done, steps, config view} after its final outputs, never before, and never when it was
preempted (train.py raises `errors.Preempted` instead of returning). Before a command writes anything, `plan`
compares every stage of the job with what is on disk:

  done, same config            → skip
  done, changed config         → refuse (one line listing the keys), or continue it when every changed key is in
                                 `train.allow_config_change` (e.g. more `sft.steps`), or redo it from scratch when
                                 the stage is in `train.rerun_stages` (its directory moves to DIR/replaced/)
  not done, checkpoints        → resume, after the same diff against the newest checkpoint's stored config
  nothing                      → start

A stage's view includes `stage.upstream` = the name and fingerprint of the stage it starts from, so a stage built
on an upstream that changed is flagged as changed too.

The record is written twice: `{done: false}` by `prepare`, before the stage writes anything, and `{done: true}` once
its outputs (params, final evaluation rows, data) are on disk. A kill anywhere in between leaves a running record,
so the stage resumes (from its last checkpoint: a loop that had reached its last step only rewrites its outputs).
Only a directory with NO record at all can be a stage finished before records existed (a `DONE` marker, or
`sft/params` with its last checkpoint): those count as done, with a warning that their config is unknown.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Sequence

from absl import logging

from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.infra import errors
from grpo_jax.run import run_config

RECORD = "stage.json"
LEGACY_DONE = "DONE"
REPLACED = "replaced"


@dataclasses.dataclass
class Stage:
  name: str
  directory: str               # its checkpoints live in <directory>/checkpoints
  view: dict[str, Any]         # run_config.view(...) of the config it runs with
  steps: int | None = None     # final step of a training stage (None: not a loop, e.g. rejection sampling)
  own_dir: bool = True         # False for the main run of a job (its directory is the workdir itself)
  legacy_outputs: tuple[str, ...] = ()  # files that meant "done" before records existed


def upstream(stage: Stage) -> str:
  return f"{stage.name}:{run_config.fingerprint(stage.view)}"


def read_record(directory: str) -> dict | None:
  path = os.path.join(directory, RECORD)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      rec = json.load(f)
    return rec if isinstance(rec, dict) else None
  except (OSError, ValueError):
    logging.warning("%s is unreadable; treating the stage as not finished", path)
    return None


def is_done(stage: Stage) -> bool:
  rec = read_record(stage.directory)
  return bool(rec and rec.get("done")) or _legacy_done(stage)


def _legacy_done(stage: Stage) -> bool:
  """Done by the rules before records: only where no record exists (every stage since writes one first)."""
  if os.path.exists(os.path.join(stage.directory, RECORD)):
    return False
  if os.path.exists(os.path.join(stage.directory, LEGACY_DONE)):
    return True
  if stage.legacy_outputs and all(os.path.exists(os.path.join(stage.directory, p)) for p in stage.legacy_outputs):
    # Older versions wrote sft/params even when SIGTERM cut the stage short: done only if its last step is saved.
    return stage.steps is None or newest_step(stage.directory) >= stage.steps
  return False


def newest_step(directory: str) -> int:
  steps = ckpt_lib.all_committed_steps(os.path.join(directory, "checkpoints"))
  return steps[-1] if steps else 0


def _write_record(stage: Stage, done: bool, **extra: Any) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() != 0:
    return
  os.makedirs(stage.directory, exist_ok=True)
  when = "finished" if done else "started"
  view = dict(stage.view, **_resolved(stage)) if done else stage.view
  run_config.write_json_atomic(os.path.join(stage.directory, RECORD), {
      "stage": stage.name, "done": done, "steps": stage.steps, when: time.strftime("%Y-%m-%dT%H:%M:%S%z"),
      "config": view, **extra})


def _resolved(stage: Stage) -> dict[str, Any]:
  """`resolved.<key>`: what the stage's `auto` knobs ran with (its newest checkpoint's view, run/loop_guard.py). The
  finished record holds them, so a rerun that sets a key to the value auto chose is no change, as on resume (the
  plan's diff compared it with `auto` and refused it)."""
  newest = ckpt_lib.newest_meta(os.path.join(stage.directory, "checkpoints"))
  view = (newest[1].get("config") or {}) if newest else {}
  return {k: v for k, v in view.items() if k.startswith(run_config.RESOLVED)}


def mark_running(stage: Stage) -> None:
  """Written by process 0 before the stage writes anything: a kill from here on leaves a resumable stage."""
  _write_record(stage, False)


def mark_done(stage: Stage, **extra: Any) -> None:
  """Written by process 0 after the stage's final outputs exist (the one step that finishes a stage)."""
  _write_record(stage, True, **extra)


def reopen(stage: Stage) -> None:
  """A done stage continues (allowed changes): a pre-record `DONE` marker goes; `prepare` then replaces the done
  record by a running one (never deleted: a stage without a record would look older than records)."""
  import jax  # pylint: disable=g-import-not-at-top
  path = os.path.join(stage.directory, LEGACY_DONE)
  if jax.process_index() == 0 and os.path.exists(path):
    os.remove(path)


def move_aside(stage: Stage, workdir: str) -> str:
  """`train.rerun_stages`: the stage's directory goes to DIR/replaced/<name>-<time> (nothing is deleted)."""
  import jax  # pylint: disable=g-import-not-at-top
  dest = os.path.join(workdir, REPLACED, f"{stage.name}-{time.strftime('%Y%m%d-%H%M%S')}")
  if jax.process_index() == 0 and os.path.exists(stage.directory):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.replace(stage.directory, dest)
    logging.warning("stage %s: moved %s to %s to run it again (train.rerun_stages)", stage.name, stage.directory,
                    dest)
  return dest


def allow_set(config) -> set[str]:
  keys = set(run_config.flatten(config)) | {"stage.upstream"}
  return run_config.parse_allow(config.train.get("allow_config_change", ""), keys)


def rerun_set(config, todo: Sequence[Stage]) -> set[str]:
  """`train.rerun_stages` → names; each must be a stage of this job with a directory of its own."""
  out = {s.strip() for s in str(config.train.get("rerun_stages", "") or "").split(",") if s.strip()}
  by_name = {st.name: st for st in todo}
  for name in sorted(out):
    if name not in by_name:
      raise errors.ConfigError(f"config.train.rerun_stages: {name!r} is not a stage of this job; choose from "
                               f"{[st.name for st in todo if st.own_dir]}.")
    if not by_name[name].own_dir:
      raise errors.ConfigError(f"config.train.rerun_stages: {name!r} is the run in --workdir itself; to run it "
                               "again from scratch use a new --workdir.")
  return out


def check_resume(ckpt_dir: str, view: dict, allow: set[str], *, workdir_hint: str, hint: str = "",
                 note: str = "", incidental: Sequence[str] = ()) -> list[str]:
  """Diffs `view` against the newest checkpoint's stored config in `ckpt_dir` (nothing there: [])."""
  newest = ckpt_lib.newest_meta(ckpt_dir)
  if newest is None:
    return []
  step, meta = newest
  return run_config.check(meta.get("config"), view, allow, where=f"checkpoint {os.path.join(ckpt_dir, str(step))}",
                          workdir_hint=workdir_hint, hint=hint, note=note, incidental=incidental)


def plan(stages: Sequence[Stage], config, workdir: str) -> dict[str, str]:
  """stage name → 'skip' | 'continue' | 'rerun' | 'resume' | 'start'. Reads only; raises one InputError line."""
  allow = allow_set(config)
  rerun = rerun_set(config, stages)
  actions: dict[str, str] = {}
  finished: list[Stage] = []  # the stages before `st` that are finished and unchanged: a new run can start from them
  for st in stages:
    redo_hint = (f", redo the stage with --config.train.rerun_stages={st.name} (its directory moves to "
                 f"{os.path.join(workdir, REPLACED)}/)" if st.own_dir else "")
    note = (f"; to keep the finished {finished[-1].name} stage, start the new run from it with "
            f"--config.train.init_from={os.path.join(finished[-1].directory, 'params')}"
            if finished and finished[-1].name == "sft" else "")  # the grpo job's SFT stage (DIR/sft/params)
    # stage.upstream fingerprints the upstream views whole: where every upstream is finished and unchanged in the keys
    # it reads (run_config.unread), a structural refusal does not blame it (it differs in keys named for this stage)
    ups = [u.split(":")[0] for u in str(st.view.get("stage.upstream", "")).split(",") if u]
    incidental = ("stage.upstream",) if ups and set(ups) <= {f.name for f in finished} else ()
    if st.name in rerun:
      actions[st.name] = "rerun"
      continue
    rec = read_record(st.directory)
    if incidental:
      _keep_recorded_upstream(st, rec, ups)
    if rec and rec.get("done"):
      stored = rec.get("config")
      kind = stored.get("stage.kind") if isinstance(stored, dict) else None  # another job's stage here: say so
      label = (f"stage {st.name}" if kind in (None, st.view.get("stage.kind")) else
               f"{kind} stage of another job")
      changed = run_config.check(rec.get("config"), st.view, allow,
                                 where=f"the finished {label} ({os.path.join(st.directory, RECORD)})",
                                 workdir_hint=workdir, hint=redo_hint, note=note, incidental=incidental)
      actions[st.name] = "continue" if changed else "skip"
      if changed:
        _check_not_shortened(st, redo_hint, workdir)
      else:
        finished.append(st)
      continue
    if _legacy_done(st):
      logging.warning("stage %s in %s finished before stage configs were recorded; skipping it without checking "
                      "its config (use --config.train.rerun_stages=%s to redo it).", st.name, st.directory, st.name)
      actions[st.name] = "skip"
      continue
    ckpt_dir = os.path.join(st.directory, "checkpoints")
    check_resume(ckpt_dir, st.view, allow, workdir_hint=workdir, hint=redo_hint, note=note, incidental=incidental)
    actions[st.name] = "resume" if ckpt_lib.all_committed_steps(ckpt_dir) else "start"
    if actions[st.name] == "resume":
      _check_not_shortened(st, redo_hint, workdir)
  return actions


def _keep_recorded_upstream(st: Stage, rec: dict | None, ups: list[str]) -> None:
  """Every stage `st` starts from is finished and unchanged by its own diff, which takes a key set to the value its
  `auto` resolved as no change: `st` starts from the outputs it started from before, so the upstream fingerprint it
  recorded stands. The new one fingerprints the upstream's view as spelled now (sampling.engine='static' where the
  record says 'auto', resolved to static), and refused the main job's RL stage as 'stage sft it starts from
  changed' when the SFT stage itself was no change."""
  if rec and rec.get("done"):
    stored = rec.get("config")
  else:
    newest = ckpt_lib.newest_meta(os.path.join(st.directory, "checkpoints"))
    stored = newest[1].get("config") if newest else None
  was = stored.get("stage.upstream") if isinstance(stored, dict) else None
  if isinstance(was, str) and [u.split(":")[0] for u in was.split(",") if u] == ups:
    st.view["stage.upstream"] = was


def _check_not_shortened(stage: Stage, redo_hint: str, workdir: str) -> None:
  """An allowed change of a loop's step count to below its newest checkpoint: the loop had nothing to run, and the
  stage was marked done at the smaller count with the later step's params (an R1 RL stage took an older
  checkpoint's, or failed where it was gone)."""
  newest = newest_step(stage.directory)
  if stage.steps is not None and newest > stage.steps:
    raise errors.InputError(
        f"stage {stage.name} has trained to step {newest}, past the {stage.steps} steps this config gives it, and a "
        f"stage cannot be shortened; restore its step count{redo_hint} or use a new --workdir (not {workdir}).")


def prepare(stage: Stage, action: str, workdir: str) -> None:
  """Applies a plan entry before the stage runs (process 0 moves or removes, then writes the running record;
  everyone waits)."""
  if action == "rerun":
    move_aside(stage, workdir)
  elif action == "continue":
    reopen(stage)
  mark_running(stage)
  _sync(f"grpo_jax.run.stages.prepare.{stage.name}")


def _sync(name: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def describe_plan(actions: dict[str, str]) -> str:
  return ", ".join(f"{k}: {v}" for k, v in actions.items())


def log_event(workdir: str, stage: str, event: str) -> None:
  """One line per stage event in DIR/stages.log (process 0)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "stages.log"), "a", encoding="utf-8") as f:
      f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {stage} {event}\n")
