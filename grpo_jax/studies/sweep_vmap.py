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
import numpy as np
from absl import logging

from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.infra import params_ckpt
from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.run import evaluation
from grpo_jax.rl import families
from grpo_jax.run import jobs
from grpo_jax.run import loop_guard
from grpo_jax.run import metrics as metrics_lib
from grpo_jax.model import model as model_lib
from grpo_jax.hf import model_source
from grpo_jax.run import plots
from grpo_jax.run import preflight
from grpo_jax.rl import rewards as rewards_lib
from grpo_jax.rl import reward_spec
from grpo_jax.run import run_config
from grpo_jax.studies import vmapped_runs as seeds_lib
from grpo_jax.infra import sharding
from grpo_jax.infra import signals
from grpo_jax.run import stages as stages_lib
from grpo_jax.rl import state as state_lib
from grpo_jax.run import train
from grpo_jax.run import validate
from grpo_jax.infra import workdir_lock
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib


@dataclasses.dataclass
class Lane:
  """One run of the group: its config, directory and the `main` machinery around its state."""
  config: Any
  workdir: str
  stage: stages_lib.Stage
  init_from: str
  guard: loop_guard.LoopGuard | None = None
  ckpt: ckpt_lib.Checkpointer | None = None
  writer: metrics_lib.MetricWriter | None = None
  start: int = 0
  failed: str = ""  # why the run stopped itself (non-finite steps), "" while it trains


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
          _check_stop(f"before stage sft of {wd}")
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


def _check_stop(where: str) -> None:
  stop = signals.active()
  if stop is not None and stop.should_stop():
    raise errors.Preempted(where)


def _run_lanes(lanes: list[Lane], info: dict, compiler_options, log) -> None:
  c0 = lanes[0].config
  tokenizer = tok_lib.for_config(c0)
  for lane in lanes:
    validate.validate_rl(lane.config, jax.device_count(), tokenizer)
    lane.guard = loop_guard.LoopGuard(lane.config, lane.workdir, "rl", lane.stage.view)
    lane.ckpt = lane.guard.checkpointer(lane.config)
  mesh = sharding.make_mesh(c0.mesh)
  mcfg = model_lib.ModelConfig.from_config(c0.model)
  family = families.for_config(c0)
  abstract, shard = family.state_spec(c0, mesh, mcfg)
  restored: dict[int, list[tuple[Lane, Any]]] = {}
  for lane in lanes:
    state = None
    if lane.ckpt.latest_step() is not None:
      state, meta = lane.ckpt.restore(None, state_lib.with_shardings(abstract, shard))
      lane.start = int(meta["step"])
      logging.info("Resumed %s at step %d.", lane.workdir, lane.start)
    restored.setdefault(lane.start, []).append((lane, state))
  for start in sorted(restored):  # runs saved at different steps continue in sub-groups, one after another
    sub = restored[start]
    if len(restored) > 1:
      log(f"[sweep] {len(sub)} run(s) resume at step {start}")
    _train(sub, start, mesh, mcfg, family, abstract, shard, tokenizer, info, compiler_options, log)


def _start_states(sub, start, mesh, mcfg, shard, hp) -> dict:
  c0 = sub[0][0].config
  if start > 0:
    return seeds_lib.with_hparams(seeds_lib.stack([st for _, st in sub]),
                                  {k: v for k, v in hp.items() if k not in seeds_lib.OPT_KEYS})
  seeds = [config_lib.run_seed(lane.config) for lane, _ in sub]
  inits = {lane.init_from for lane, _ in sub}
  params = run_params = None
  if len(inits) == 1 and next(iter(inits)):
    params = _load_params(next(iter(inits)), mcfg, shard, mesh)
  elif any(inits):
    run_params = [_load_params(lane.init_from, mcfg, shard, mesh) for lane, _ in sub]
  return seeds_lib.init_states(c0, mcfg, seeds, params=params, run_params=run_params, hparams=hp)


def _load_params(path: str, mcfg, shard, mesh):
  if path.startswith("hf:"):
    return train.load_hf_params(path[3:], mcfg, shard["params"])
  abstract_p = state_lib.abstract_params(mesh, mcfg)
  return params_ckpt.load_params(path, abstract_p)


def _train(sub, start, mesh, mcfg, family, abstract, shard, tokenizer, info, compiler_options, log) -> None:
  lanes = [lane for lane, _ in sub]
  c0 = lanes[0].config
  rl, steps, S = c0.rl, c0.train.steps, len(lanes)
  hp = varying([lane.config for lane in lanes])
  fallback = float(rl.reward_fallback) if rl.reward_fallback != "" else None
  spec = rewards_lib.build(c0.rewards, reward_spec.Context(c0.task.name, tokenizer),
                           train.python_reward_fns(c0, tokenizer), fallback, rl.reward_timeout_s)
  step_fn = seeds_lib.make_steps(c0, mesh, mcfg, spec, tokenizer, compiler_options)
  states = _start_states(sub, start, mesh, mcfg, shard, hp)
  for lane in lanes:
    lane.writer = metrics_lib.MetricWriter(lane.workdir, resume_step=start if start else None,
                                           use_tensorboard=lane.config.log.tensorboard,
                                           wandb_project=lane.config.log.wandb_project or None, total_steps=steps,
                                           progress=False)
    lane.guard.resumed(lane.ckpt, start, lane.writer)
  n_prompts = rl.prompts_per_step * (rl.oversample if rl.dynamic_sampling else 1)
  batches = data_lib.rl_batches(c0.task, tokenizer, "train", n_prompts, c0.seed, start, c0.task.prompt_len)
  eval_set = data_lib.eval_set(c0.task, tokenizer, c0.eval.size, c0.task.prompt_len)
  evaluators: dict[str, evaluation.Evaluator] = {}  # by sampling settings (a swept temperature changes them)

  def evaluate(step):
    for i, lane in enumerate(lanes):
      if lane.failed:
        continue
      key = json.dumps(lane.config.sampling.to_dict(), sort_keys=True)
      if key not in evaluators:
        evaluators[key] = evaluation.Evaluator(lane.config, mcfg, tokenizer, mesh, eval_set)
      t0 = time.perf_counter()
      result, _ = evaluators[key](seeds_lib.unstack(states["params"], i), jax.random.PRNGKey(lane.config.seed + 1))
      lane.writer.write(step, {**result, "perf/eval_time_s": time.perf_counter() - t0})

  if start == 0:
    evaluate(0)
  bad_in_row = np.zeros(S, np.int64)
  done = start
  stop_reward: str = ""
  with signals.GracefulStop.ensure() as stop, contextlib.ExitStack() as closing:
    closing.callback(spec.close)
    for step in range(start, steps):
      if stop.should_stop():
        break
      batch = train.device_batch(mesh, next(batches))
      t0 = time.perf_counter()
      states, m = step_fn(states, batch)
      status = np.asarray(jax.device_get(m["reward_status"]))  # S × terms
      if (status != reward_spec.OK).any():
        run, term = np.argwhere(status != reward_spec.OK)[0]
        stop_reward = (f"{lanes[run].workdir}: " + spec.python_terms[spec.names[term]].error_message(
            int(status[run].max())))
        for i, lane in enumerate(lanes):
          lane.ckpt.maybe_save(step, seeds_lib.run_state(states, i), {"step": step}, force=True)
        break
      dt = time.perf_counter() - t0
      scalars = seeds_lib.host_scalars(m)
      done = step + 1
      if step == start:
        info["traces"].append(step_fn.traces())
      samples = None
      if c0.train.sample_every and done % c0.train.sample_every == 0:
        samples = jax.device_get({k: m[k] for k in ("samples/tokens_NxL", "samples/mask_NxL", "samples/r_N")})
      for i, lane in enumerate(lanes):
        if lane.failed:
          continue
        row = {k: float(v[i]) for k, v in scalars.items()}
        n_tok = row["train/completion_len_mean"] * rl.prompts_per_step * rl.G
        row.update({"perf/step_time_s": dt, "perf/tokens_per_s": n_tok / dt})
        if step == start:
          row["perf/compile_time_s"] = dt
        if done % c0.train.log_every == 0 or done == steps:
          lane.writer.write(done, row)
        if samples is not None:
          texts = [tokenizer.decode(t[mk > 0].tolist()) for t, mk in zip(samples["samples/tokens_NxL"][i],
                                                                           samples["samples/mask_NxL"][i])]
          lane.writer.log_samples(done, texts, [float(r) for r in samples["samples/r_N"][i]], n_print=0)
        bad_in_row[i] = bad_in_row[i] + 1 if row["train/nonfinite_updates"] > 0 else 0
        if bad_in_row[i] >= rl.max_nonfinite_in_row:
          lane.ckpt.maybe_save(done, seeds_lib.run_state(states, i), {"step": done}, force=True)
          lane.ckpt.wait()
          lane.failed = (f"{bad_in_row[i]} steps in a row had a non-finite loss or gradient (updates skipped); the "
                         f"last good state is saved at step {done}. Lower optim.lr or check rewards.")
          info["failed"][lane.workdir] = lane.failed
          log(f"[sweep] {os.path.basename(lane.workdir)} stopped: {lane.failed}")
      if done % c0.train.eval_every == 0 or done == steps:
        evaluate(done)
      for i, lane in enumerate(lanes):
        if lane.failed:
          continue
        if c0.train.plot_every and done % c0.train.plot_every == 0:
          plots.write_plots(lane.workdir)
        lane.ckpt.maybe_save(done, seeds_lib.run_state(states, i), {"step": done}, force=done == steps)
      means = {k: float(np.mean(scalars[k])) for k in ("train/reward_mean", "train/kl") if k in scalars}
      log(f"[sweep] {S} runs, step {done}/{steps}, {dt:.2f}s/step, mean over runs: "
          + ", ".join(f"{k} {v:.4g}" for k, v in means.items()))
    for i, lane in enumerate(lanes):
      if not lane.failed:
        lane.guard.stop = stop
        lane.guard.finish(lane.ckpt, seeds_lib.run_state(states, i), done)
  for lane in lanes:
    lane.ckpt.close()
    lane.writer.close()
    plots.write_plots(lane.workdir)
  if stop_reward:
    raise rewards_lib.PythonTermError(stop_reward)
  if done < steps:
    raise errors.Preempted(f"{S} vmapped runs ({', '.join(os.path.basename(l.workdir) for l in lanes)})", done)
  for lane in lanes:
    if not lane.failed:
      stages_lib.mark_done(lane.stage)
