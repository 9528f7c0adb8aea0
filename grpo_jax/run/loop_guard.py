"""The reliability side of train.py's loops, in one object so that the loops stay about training.

    guard = LoopGuard(config, workdir, "rl")          # refuses a changed config BEFORE anything is written
    config = guard.resolve(config, mesh)              # `auto` knobs: the recorded values on resume, else chosen
    ckpt = guard.checkpointer(config)                 # stores the run-config view (and the resolution) with every
                                                      # checkpoint
    ... restore / create the state, make the MetricWriter ...
    guard.resumed(ckpt, start, writer)                # records accepted config changes (metrics + config.<step>.json)
                                                      # and the checkpoints the restore skipped (ckpt/*_skipped);
                                                      # warns once when metrics rows before `start` are gone
    with guard.running():
      for step in range(start, steps):
        if guard.should_stop(): break                 # SIGTERM/SIGINT on any process → every process stops here
        ...; done = step + 1
    guard.finish(ckpt, state, done)                   # saves the stop step, waits for the disk
    ... close writers ...
    guard.raise_if_stopped()                          # errors.Preempted: the caller never marks the stage done
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Callable, Iterator, Mapping

from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.rl import auto
from grpo_jax.infra import errors
from grpo_jax.run import metrics
from grpo_jax.run import run_config
from grpo_jax.infra import signals
from grpo_jax.run import stages
from grpo_jax.run import validate


# checkpoint metadata: the least common multiple of the train.log_every cadences the run logged on up to that step
LOGGED_EVERY = "log_every"


class LoopGuard:

  def __init__(self, config, workdir: str, kind: str, record: Mapping[str, Any] | None = None):
    self.view = dict(record) if record is not None else run_config.view(config, kind)
    self.allow = stages.allow_set(config)
    self.workdir = workdir
    self.kind = kind
    self.ckpt_dir = os.path.join(workdir, "checkpoints")
    self.steps = config.train.steps if kind == "rl" else config.sft.steps
    self.log_every = config.train.log_every
    self.stop: signals.GracefulStop | None = None
    self.last_step = self._start = 0
    stages.check_resume(self.ckpt_dir, self.view, self.allow, workdir_hint=workdir)
    newest = ckpt_lib.newest_meta(self.ckpt_dir)
    # what a run resolved its `auto` knobs to (or set them to): a resume runs the same program (run_config.py)
    self.recorded = run_config.recorded_settings(newest[1].get("config") if newest else None)

  def resolve(self, config, mesh, lanes: int = 1):
    """`config` with its `auto` knobs resolved for this process's devices (rl/auto.py; the recorded values on
    resume), recorded in the view every checkpoint stores and in DIR/auto.json."""
    self._check_carry_split(config, mesh)
    config, chosen = auto.resolve_here(config, mesh, lanes=lanes, recorded=self.recorded)
    # rl.minibatches=0 resolved to 1 with rl.mu 1 leaves KL-Cov inert: unsaid by the checks of the config as given
    validate.kl_cov_inert(config)
    self.view = run_config.with_resolved(self.view, auto.resolved_values(config))
    auto.write_record(self.workdir, chosen, resumed=bool(self.recorded))
    return config

  def _check_carry_split(self, config, mesh) -> None:
    """A partial-rollout carry's rows and slots are split in device blocks over mesh data*fsdp, and the indices it
    stores are local to a block: a resume over another split would reshuffle (drop or duplicate) in-flight rows, and
    was refused through a recorded auto knob or a shape, neither naming the devices. Refused here in one line."""
    if self.kind != "rl" or not config.rl.get("partial_rollouts", False):
      return
    newest = ckpt_lib.newest_meta(self.ckpt_dir)
    saved = ckpt_lib.saved_shape(self.ckpt_dir, newest[0], "carry.next_D") if newest else None
    split = int(mesh.shape.get("data", 1)) * int(mesh.shape.get("fsdp", 1))
    if saved and saved[0] != split:
      raise errors.InputError(
          f"checkpoint step {newest[0]} in {self.ckpt_dir} holds a partial-rollout carry whose in-flight rows are "
          f"split over {saved[0]} device block(s) (mesh data*fsdp), this run splits them over {split}: resume it "
          f"with a mesh whose data*fsdp is {saved[0]} (config.mesh; other devices in mesh.tensor), or use a new "
          "--workdir.")

  def checkpointer(self, config) -> ckpt_lib.Checkpointer:
    metric = config.train.get("keep_best", "") if self.kind == "rl" else ""  # RL runs evaluate as they train
    return ckpt_lib.Checkpointer(self.ckpt_dir, save_every=config.train.ckpt_every,
                                 keep=config.train.keep_checkpoints, run_config=self.view,
                                 meta={LOGGED_EVERY: self.log_every},
                                 best=(metric, config.train.get("keep_best_mode", "max")) if metric else None)

  def resumed(self, ckpt: ckpt_lib.Checkpointer, start: int, writer) -> list[str]:
    """After a restore: the restored step's config (a fallback may have picked an older step) against ours."""
    self.last_step = self._start = start
    skipped = {k: n for k, n in ckpt.skipped.items() if n}
    if skipped:  # the restore's fallbacks (logged where they happened), counted at the step the run goes on from
      writer.write(start, skipped)
    if not start:
      return []
    # train.log_every is bookkeeping, free to change on resume: the steps before `start` that every cadence the run
    # logged on has a row for (a step between two rows of the old cadence is no lost row)
    every = math.lcm(self.log_every, int(ckpt.restored_meta.get(LOGGED_EVERY) or self.log_every))
    ckpt.meta[LOGGED_EVERY] = every
    metrics.warn_missing(self.workdir, start, every)
    old = ckpt.restored_config
    changed = run_config.check(old, self.view, self.allow, where=f"checkpoint {os.path.join(self.ckpt_dir, str(start))}",
                               workdir_hint=self.workdir)
    if changed:
      run_config.record_change(self.workdir, start, old, self.view, changed)
      writer.write(start, run_config.change_metrics(changed))
    return changed

  @contextlib.contextmanager
  def running(self, on_exit: Callable[[], None] | None = None) -> Iterator[LoopGuard]:
    """The loop's signal handling (the command's, or its own); `on_exit` runs however the block ends."""
    with signals.GracefulStop.ensure() as stop:
      self.stop = stop
      try:
        yield self
      finally:
        if on_exit is not None:
          on_exit()

  def should_stop(self) -> bool:
    return self.stop is not None and self.stop.should_stop()

  @property
  def stopped(self) -> bool:
    return self.last_step < self.steps

  def finish(self, ckpt: ckpt_lib.Checkpointer, state: Any, last_step: int,
             meta: Mapping[str, Any] | None = None) -> None:
    """Saves `last_step` if the loop stopped early (a no-op when that step is saved already), waits for the disk.
    `state`: the state, or a function returning it (called only to save); `meta`: what the loop stores with its
    checkpoints besides the step."""
    self.last_step = last_step
    if self.stopped and last_step > self._start:
      ckpt.maybe_save(last_step, state, {**(meta or {}), "step": last_step}, force=True)
    ckpt.wait()

  def raise_if_stopped(self) -> None:
    if self.stopped:
      raise errors.Preempted(self.workdir, self.last_step)
