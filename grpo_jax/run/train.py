"""The Python loop around the jitted steps: it only feeds data, logs, evaluates and checkpoints."""
import dataclasses
import os
import time
from typing import Callable

import jax
import numpy as np
from absl import logging

from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.infra import params_ckpt
from grpo_jax.infra import errors
from grpo_jax.run import evaluation
from grpo_jax.rl import auto
from grpo_jax.rl import families
from grpo_jax.run import loop_guard
from grpo_jax.run import metrics as metrics_lib
from grpo_jax.model import model as model_lib
from grpo_jax.hf import model_source
from grpo_jax.run import plots
from grpo_jax.rl import rewards as rewards_lib
from grpo_jax.rl import reward_spec
from grpo_jax.rl import sft_step
from grpo_jax.infra import sharding
from grpo_jax.rollout import decode_layout
from grpo_jax.rl import state as state_lib
from grpo_jax.run import validate
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import registry as task_registry
from grpo_jax.tasks import tokenizer_factory as tok_lib
from grpo_jax.hf import hf_io


class NonFiniteError(errors.RunStopped):
  """Too many non-finite steps in a row; the last good state is saved."""


def device_batch(mesh, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """Places host arrays with rows split over the data axes; a prompt batch smaller than the data axes is
  replicated (the step tiles it G times and splits the rows then). Every process builds the same global batch."""
  n_data = mesh.shape["data"] * mesh.shape["fsdp"]
  return {k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim) if v.shape[0] % n_data == 0
                            else sharding.replicated(mesh)) for k, v in batch.items()}


def _host_scalars(m: dict) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(m).items()
          if not k.startswith("samples/") and k != "reward_status"}


def python_reward_fns(config, tokenizer=None) -> dict[str, reward_spec.PyRewardFn]:
  """Python reward terms a config may name (the task's decoded-text verifiers that cannot run in-graph)."""
  return task_registry.get(config.task.name).python_rewards(tokenizer or tok_lib.for_config(config))


def setup_common(config, workdir: str, validate_fn: Callable):
  """(tokenizer, mesh, ModelConfig) of a config whose model fields are resolved (model_source.resolve)."""
  tokenizer = tok_lib.for_config(config)
  validate_fn(config, jax.device_count(), tokenizer)
  mesh = sharding.make_mesh(config.mesh)
  mcfg = model_lib.ModelConfig.from_config(config.model)
  os.makedirs(workdir, exist_ok=True)
  return tokenizer, mesh, mcfg


def load_hf_params(path: str, mcfg, shardings):
  """`train.init_from=hf:<dir>`: a HF Qwen2/Llama checkpoint (hf_io), whose config.json must match `mcfg` (every
  disagreement listed in one config error), streamed leaf by leaf into `shardings`."""
  model_source.check("train.init_from", path, dataclasses.asdict(mcfg))
  return hf_io.load_params(path, mcfg, shardings)


def _steps(guard: loop_guard.LoopGuard, mesh, batches, start: int, steps: int):
  """(step, device batch, start time) for steps start..steps-1, until a stop signal (checked before each step)."""
  for step in range(start, steps):
    if guard.should_stop():
      return
    yield step, device_batch(mesh, next(batches)), time.perf_counter()


def init_or_restore(config, mesh, mcfg, family, ckpt: ckpt_lib.Checkpointer, init_from: str):
  """Resumes from the newest good checkpoint; else the family's initial state (from `init_from` params if set:
  the reference and PPO's value network start from them too, as in RLHF practice)."""
  abstract, shard = family.state_spec(config, mesh, mcfg)
  start = ckpt.latest_step()
  if start is not None:
    state, meta = ckpt.restore(None, state_lib.with_shardings(abstract, shard))
    logging.info("Resumed from %s at step %d.", ckpt.directory, meta["step"])
    return state, int(meta["step"])
  params = None
  if init_from:
    params = (load_hf_params(init_from[3:], mcfg, shard["params"]) if init_from.startswith("hf:")
              else params_ckpt.load_params(init_from, state_lib.with_shardings(abstract["params"], shard["params"])))
    logging.info("Initialising params from %s.", init_from)
  return family.init(config, mesh, mcfg, params=params), 0


def run_rl(config, workdir: str, init_from: str | None = None, python_fns: dict | None = None,
           record: dict | None = None) -> dict[str, float]:
  """GRPO-family (or PPO) training; returns the last eval metrics. Resumes automatically from `workdir`.

  `record`: the run-config view stored with each checkpoint (default: run_config.view(config, 'rl')). Raises
  errors.Preempted when SIGTERM/SIGINT stopped it before `train.steps` (its state saved).
  """
  config = model_source.resolve(config)  # model fields a config leaves to the hf: checkpoint (a no-op if resolved)
  guard = loop_guard.LoopGuard(config, workdir, "rl", record)  # a changed config is refused before any write
  tokenizer, mesh, mcfg = setup_common(config, workdir, validate.validate_rl)
  # every `auto` knob (rl/auto.py) chosen for this mesh and device memory, before the step is built
  config, _ = auto.resolve(config, auto.Context(dict(mesh.shape), decode_layout.device_memory_bytes()))
  rl, steps = config.rl, config.train.steps
  fallback = float(rl.reward_fallback) if rl.reward_fallback != "" else None
  spec = rewards_lib.build(config.rewards, reward_spec.Context(config.task.name, tokenizer),
                           {**python_reward_fns(config, tokenizer), **(python_fns or {})}, fallback, rl.reward_timeout_s)
  family = families.for_config(config)
  step_fn = families.make_step(config, mesh, mcfg, spec, tokenizer, family=family)
  init_from = config.train.init_from if init_from is None else init_from
  ckpt = guard.checkpointer(config)
  state, start = init_or_restore(config, mesh, mcfg, family, ckpt, init_from)
  writer = metrics_lib.MetricWriter(workdir, resume_step=start if start else None,
                                    use_tensorboard=config.log.tensorboard,
                                    wandb_project=config.log.wandb_project or None, total_steps=steps)
  guard.resumed(ckpt, start, writer)
  n_prompts = rl.prompts_per_step * (rl.oversample if rl.dynamic_sampling else 1)
  batches = data_lib.rl_batches(config.task, tokenizer, "train", n_prompts, config.seed, start,
                                config.task.prompt_len)
  # Held-out eval verifies in-graph or on the host (the task's host_verifier in tasks/registry.py).
  evaluator = evaluation.Evaluator(config, mcfg, tokenizer, mesh,
                                   data_lib.eval_set(config.task, tokenizer, config.eval.size,
                                                     config.task.prompt_len))
  eval_rng = jax.random.PRNGKey(config.seed + 1)
  last_eval: dict[str, float] = {}

  def evaluate(step):
    nonlocal last_eval
    t0 = time.perf_counter()
    last_eval, texts = evaluator(state["params"], eval_rng)
    writer.write(step, {**last_eval, "perf/eval_time_s": time.perf_counter() - t0})
    logging.info("step %d eval %s | %r", step, last_eval, texts[:1])

  if start == 0:
    evaluate(0)
  bad_in_row, done = 0, start
  with guard.running(on_exit=spec.close):  # Python reward workers stop however the loop ends
    for step, batch, t0 in _steps(guard, mesh, batches, start, steps):
      state, m = step_fn(state, batch)
      status = np.asarray(jax.device_get(m["reward_status"]))
      if (status != reward_spec.OK).any():
        name = spec.names[int(np.argmax(status != reward_spec.OK))]
        ckpt.maybe_save(step, state, {"step": step}, force=True)
        ckpt.wait()
        raise rewards_lib.PythonTermError(spec.python_terms[name].error_message(int(status.max())))
      scalars = _host_scalars(m)
      dt = time.perf_counter() - t0
      n_tok = scalars["train/completion_len_mean"] * rl.prompts_per_step * rl.G
      scalars.update({"perf/step_time_s": dt, "perf/tokens_per_s": n_tok / dt})
      if step == start:
        scalars["perf/compile_time_s"] = dt
      done = step + 1
      if done % config.train.log_every == 0 or done == steps:
        writer.write(done, scalars)
      if config.train.sample_every and done % config.train.sample_every == 0:
        sm = jax.device_get(m)
        texts = [tokenizer.decode(t[mk > 0].tolist()) for t, mk in zip(sm["samples/tokens_NxL"],
                                                                         sm["samples/mask_NxL"])]
        writer.log_samples(done, texts, [float(r) for r in sm["samples/r_N"]])
      bad_in_row = bad_in_row + 1 if scalars["train/nonfinite_updates"] > 0 else 0
      if bad_in_row >= rl.max_nonfinite_in_row:
        ckpt.maybe_save(done, state, {"step": done}, force=True)
        ckpt.wait()
        raise NonFiniteError(f"{bad_in_row} steps in a row had a non-finite loss or gradient (updates skipped); "
                             f"the last good state is saved at step {done}. Lower optim.lr or check rewards "
                             "(config.rl.max_nonfinite_in_row sets the limit).")
      if done % config.train.eval_every == 0 or done == steps:
        evaluate(done)
      if config.train.plot_every and done % config.train.plot_every == 0:
        plots.write_plots(workdir)
      ckpt.maybe_save(done, state, {"step": done}, force=done == steps)
    guard.finish(ckpt, state, done)  # inside running(): a second signal cannot interrupt the save
  ckpt.close()
  writer.close()
  plots.write_plots(workdir)
  guard.raise_if_stopped()
  return last_eval


def run_sft(config, workdir: str, *, loss_on: str | None = None, init_from: str | None = None,
            batches=None, evaluate_at_end: bool = True, record: dict | None = None) -> dict[str, float]:
  """SFT (loss on completions) or pre-training (loss_on='all': untagged worked solutions, every token).

  `batches` overrides the task's reference data (e.g. R1's rejection-sampled set): a callable
  `start_step -> iterator of SFT batches`. Final params go to `workdir/params`, written only when the loop reached
  `sft.steps`: a stop by SIGTERM/SIGINT saves the state and raises errors.Preempted instead. `record`: the
  run-config view stored with each checkpoint (default: run_config.view(config, 'sft')).
  """
  config = model_source.resolve(config)
  guard = loop_guard.LoopGuard(config, workdir, "sft", record)  # a changed config is refused before any write
  tokenizer, mesh, mcfg = setup_common(config, workdir, validate.validate_sft)
  steps = config.sft.steps
  loss_on = loss_on or config.sft.loss_on
  step_fn = families.make_step(config, mesh, mcfg, family=sft_step)
  ckpt = guard.checkpointer(config)
  init_from = config.sft.init_from if init_from is None else init_from
  state, start = init_or_restore(config, mesh, mcfg, sft_step, ckpt, init_from)
  writer = metrics_lib.MetricWriter(workdir, resume_step=start if start else None,
                                    use_tensorboard=config.log.tensorboard, total_steps=steps)
  guard.resumed(ckpt, start, writer)
  if batches is None:
    batches = data_lib.sft_batches(config.task, tokenizer, "train", config.sft.batch, config.seed, start,
                                   config.model.max_len, mode=loss_on, mistake_rate=config.sft.mistake_frac)
  else:
    batches = batches(start)
  done = start
  with guard.running():
    for step, batch, t0 in _steps(guard, mesh, batches, start, steps):
      state, m = step_fn(state, batch)
      done = step + 1
      if done % config.train.log_every == 0 or done == steps:
        scalars = _host_scalars(m)
        scalars["perf/step_time_s"] = time.perf_counter() - t0
        writer.write(done, scalars)
      ckpt.maybe_save(done, state, {"step": done}, force=done == steps)
    guard.finish(ckpt, state, done)  # inside running(): a second signal cannot interrupt the save
  ckpt.close()
  if guard.stopped:
    writer.close()
    guard.raise_if_stopped()  # no params, no final eval: the stage is not finished
  params_ckpt.save_params(os.path.join(workdir, "params"), state["params"])
  result: dict[str, float] = {}
  if evaluate_at_end and loss_on == "completion":
    evaluator = evaluation.Evaluator(config, mcfg, tokenizer, mesh,
                                     data_lib.eval_set(config.task, tokenizer, config.eval.size,
                                                       config.task.prompt_len))
    result, _ = evaluator(state["params"], jax.random.PRNGKey(config.seed + 1))
    writer.write(steps, result)
  writer.close()
  plots.write_plots(workdir)
  return result
