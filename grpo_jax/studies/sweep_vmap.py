"""A group of sweep runs (job grpo) whose programs agree, trained as ONE vmapped program (vmapped_runs.make_steps).

Each run keeps everything a `main` run of its config has in its own directory: config.json, the SFT stage (run
before the group, one run after another, through train.run_sft), metrics.jsonl (the same rows `main` writes; perf/*
differ), samples, plots, checkpoints holding the run's own state in the structure `main` restores (its learning
rate in the optimizer state; the per-run traced knobs are not saved: they come from its config), the run-config
record and stage.json. So `python -m grpo_jax.main` with the run's config and directory resumes or continues it,
and a rerun of the sweep resumes the group from the runs' checkpoints (runs saved at different steps continue in
sub-groups by step). The lock of every run's directory is held while the group trains.

What a run cannot do alone inside one program is handled at the group's level: SIGTERM/SIGINT stops all runs after
the same step (each saved); a failing Python reward stops the group (every run saved at that step); a run with
`rl.max_nonfinite_in_row` non-finite steps in a row is saved and stopped (RunStopped reported for it) while the
others continue (its lane keeps computing, unsaved and unlogged).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Callable, Sequence

import jax
from absl import logging

from grpo_jax.infra import params_ckpt
from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.rl import families
from grpo_jax.run import jobs
from grpo_jax.run import loop_guard
from grpo_jax.model import model as model_lib
from grpo_jax.hf import model_source
from grpo_jax.run import preflight
from grpo_jax.run import run_config
from grpo_jax.studies import vmapped_runs as seeds_lib
from grpo_jax.infra import sharding
from grpo_jax.infra import signals
from grpo_jax.run import stages as stages_lib
from grpo_jax.rl import state as state_lib
from grpo_jax.run import train
from grpo_jax.run import validate
from grpo_jax.infra import workdir_lock
from grpo_jax.tasks import tokenizer_factory as tok_lib


@dataclasses.dataclass
class Lane:
  """One run of the group: its config, directory and the `main` machinery around its state."""
  config: Any
  workdir: str
  stage: stages_lib.Stage
  init_from: str
  start: int = 0
  run: train.Run | None = None  # what the loop trains: guard, checkpointer, writer, why it stopped


def varying(configs: Sequence[Any]) -> dict[str, list]:
  """The traceable keys whose values differ between the runs: {key: one value per run} (vmapped_runs.TRACEABLE)."""
  out = {}
  for key in seeds_lib.TRACEABLE:
    if key == seeds_lib.REWARD_WEIGHTS:
      vals = [tuple(float(w) for _, w in c.rewards) for c in configs]
    else:
      group, name = key.split(".")
      vals = [float(c[group][name]) for c in configs]
    if len(set(vals)) > 1:
      out[key] = vals
  return out


def signature(config) -> str:
  """What runs must share to train in one program: the whole config but the traceable knobs' values (reward term
  names and β = 0 vs > 0 stay: they change the program or the state tree) and the run seed (the initial state)."""
  flat = run_config.flatten(config)
  out = {k: v for k, v in flat.items() if k not in seeds_lib.TRACEABLE and k != "run_seed"}
  out["rewards"] = [e[0] for e in flat.get("rewards", [])]
  out["rl.beta==0"] = float(flat.get("rl.beta", 0.0)) == 0.0
  return json.dumps(out, sort_keys=True)


def _prepare(configs: Sequence[Any], workdirs: Sequence[str]) -> list[tuple[Any, list, dict]]:
  """resolve + preflight + plan for every run, before anything is written (one InputError line otherwise)."""
  out = []
  for config, wd in zip(configs, workdirs):
    config = model_source.resolve(config)
    preflight.check(config, wd)
    todo = jobs.grpo_stages(config, wd)
    stages_lib.allow_set(config)
    stages_lib.rerun_set(config, todo)
    out.append((config, todo, stages_lib.plan(todo, config, wd)))
  return out


def run_group(configs: Sequence[Any], workdirs: Sequence[str], *, compiler_options: dict | None = None,
              log: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs every unfinished run of the group; returns {'traces': [...], 'failed': {workdir: why}, 'seconds'}.
  Raises errors.Preempted when stopped by a signal (everything saved), RunStopped for a failing Python reward."""
  t0 = time.perf_counter()
  if len({signature(c) for c in configs}) > 1:
    raise ValueError("run_group: the runs differ in more than the traceable keys (vmapped_runs.TRACEABLE) and the run seed; "
                     "group them with sweep_vmap.signature.")
  if any(c.job != "grpo" for c in configs):
    raise errors.ConfigError(f"config.job={configs[0].job!r}: only job=grpo runs can share a vmapped program; run "
                             "the sweep with --mode=serial.")
  info: dict[str, Any] = {"traces": [], "failed": {}}
  with contextlib.ExitStack() as stack:
    for wd in workdirs:
      stack.enter_context(workdir_lock.WorkdirLock(wd))
    stack.enter_context(signals.GracefulStop.ensure())
    planned = _prepare(configs, workdirs)
    lanes = []
    for (config, todo, actions), wd in zip(planned, workdirs):
      jobs._write_config(config, wd)  # pylint: disable=protected-access
      init_from = config.train.init_from
      for st in todo:
        if st.name != "sft":
          continue
        init_from = os.path.join(st.directory, "params")
        if actions[st.name] != "skip":
          signals.check_stop(f"before stage sft of {wd}")
          stages_lib.prepare(st, actions[st.name], wd)
          log(f"[sweep] {os.path.basename(wd)}: SFT stage")
          train.run_sft(config, st.directory, record=st.view)
          stages_lib.mark_done(st)
      rl = todo[-1]
      if actions[rl.name] == "skip":
        continue
      stages_lib.prepare(rl, actions[rl.name], wd)
      lanes.append(Lane(config, wd, rl, init_from))
    if lanes:
      _run_lanes(lanes, info, compiler_options, log)
  info["seconds"] = time.perf_counter() - t0
  return info


def _run_lanes(lanes: list[Lane], info: dict, compiler_options, log) -> None:
  tokenizer = tok_lib.for_config(lanes[0].config)
  mesh = sharding.make_mesh(lanes[0].config.mesh)
  for lane in lanes:
    validate.validate_rl(lane.config, jax.device_count(), tokenizer)
    guard = loop_guard.LoopGuard(lane.config, lane.workdir, "rl", lane.stage.view)
    # the `auto` knobs as train.run_rl chooses them, for the lanes sharing each device's memory
    lane.config = guard.resolve(lane.config, mesh, lanes=len(lanes))
    lane.run = train.Run(lane.config, lane.workdir, guard, guard.checkpointer(lane.config))
  c0 = lanes[0].config
  mcfg = model_lib.ModelConfig.from_config(c0.model)
  abstract, shard = families.for_config(c0).state_spec(c0, mesh, mcfg)
  if mcfg.lora is not None:  # one frozen base for every lane: its identity goes with the checkpoints of each lane
    source = lanes[0].init_from
    if any(lane.init_from != source for lane in lanes):
      raise errors.InputError("model.lora: the runs of a vmapped sweep share one frozen base; give them one "
                              "train.init_from, or run them with --mode=serial.")
    base = seeds_lib.init_states(c0, mcfg, [config_lib.run_seed(c0)],
                                 params=_load_params(source, mcfg, shard, mesh) if source else None)["base"]
    for lane in lanes:
      lane.run.ckpt.set_frozen(state_lib.base_source(source, config_lib.run_seed(c0)), base)
  restored: dict[int, list[tuple[Lane, Any]]] = {}
  for lane in lanes:
    state = None
    if lane.run.ckpt.latest_step() is not None:
      state, meta = lane.run.ckpt.restore(None, state_lib.with_shardings(abstract, shard))
      lane.start = int(meta["step"])
      logging.info("Resumed %s at step %d.", lane.workdir, lane.start)
    restored.setdefault(lane.start, []).append((lane, state))
  for start in sorted(restored):  # runs saved at different steps continue in sub-groups, one after another
    sub = restored[start]
    if len(restored) > 1:
      log(f"[sweep] {len(sub)} run(s) resume at step {start}")
    _train(sub, start, mesh, mcfg, shard, tokenizer, info, compiler_options, log)


def _start_states(sub, start, mesh, mcfg, shard, hp) -> dict:
  c0 = sub[0][0].config
  if start > 0:
    # a LoRA base (the same object in every restored lane) stays unstacked
    stacked = seeds_lib.stack([{k: v for k, v in st.items() if k != "base"} for _, st in sub])
    if "base" in sub[0][1]:
      stacked["base"] = sub[0][1]["base"]
    return seeds_lib.with_hparams(stacked, {k: v for k, v in hp.items() if k not in seeds_lib.OPT_KEYS})
  seeds = [config_lib.run_seed(lane.config) for lane, _ in sub]
  inits = {lane.init_from for lane, _ in sub}
  params = run_params = None
  if len(inits) == 1 and next(iter(inits)):
    params = _load_params(next(iter(inits)), mcfg, shard, mesh)
  elif any(inits):
    run_params = [_load_params(lane.init_from, mcfg, shard, mesh) for lane, _ in sub]
  return seeds_lib.init_states(c0, mcfg, seeds, params=params, run_params=run_params, hparams=hp)


def _load_params(path: str, mcfg, shard, mesh):
  abstract_p = state_lib.abstract_params(mesh, mcfg)  # the model's (with LoRA: the base's), sharded
  if path.startswith("hf:"):
    return train.load_hf_params(path[3:], mcfg, jax.tree.map(lambda a: a.sharding, abstract_p))
  return params_ckpt.load_params(path, abstract_p)


def _train(sub, start, mesh, mcfg, shard, tokenizer, info, compiler_options, log) -> None:
  """The sub-group's runs from `start` in train.rl_loop (the one RL loop), its step vmapped over the runs."""
  lanes = [lane for lane, _ in sub]
  c0 = lanes[0].config
  hp = varying([lane.config for lane in lanes])
  spec = train.reward_terms(c0, tokenizer)
  program = train.Program(seeds_lib.make_steps(c0, mesh, mcfg, spec, tokenizer, compiler_options), len(lanes),
                          seeds_lib.run_state)
  states = _start_states(sub, start, mesh, mcfg, shard, hp)
  runs = [lane.run for lane in lanes]
  info["traces"].append(train.rl_loop(program, runs, states, start, mesh=mesh, mcfg=mcfg, tokenizer=tokenizer,
                                      spec=spec, log=lambda line: log(f"[sweep] {line}")))
  for lane in lanes:
    if lane.run.failed:
      info["failed"][lane.workdir] = lane.run.failed
    else:
      stages_lib.mark_done(lane.stage)
