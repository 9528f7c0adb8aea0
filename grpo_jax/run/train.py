"""The Python loop around the jitted steps: it only feeds data, logs, evaluates and checkpoints."""
import contextlib
import dataclasses
import functools
import json
import os
import re
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import jax
import numpy as np
from absl import logging

from grpo_jax.config import config_lib
from grpo_jax.envs import batch as env_batch
from grpo_jax.envs import transcript as transcript_lib
from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.infra import params_ckpt
from grpo_jax.infra import errors
from grpo_jax.run import evaluation
from grpo_jax.rl import auto
from grpo_jax.rl import families
from grpo_jax.run import loop_guard
from grpo_jax.run import metrics as metrics_lib
from grpo_jax.model import lora as lora_lib
from grpo_jax.model import model as model_lib
from grpo_jax.hf import model_source
from grpo_jax.run import plots
from grpo_jax.run import run_config
from grpo_jax.rl import rewards as rewards_lib
from grpo_jax.rl import reward_spec
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rl import sft_step
from grpo_jax.infra import sharding
from grpo_jax.infra import workdir_lock
from grpo_jax.rl import state as state_lib
from grpo_jax.run import validate
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import registry as task_registry
from grpo_jax.tasks import tokenizer_factory as tok_lib
from grpo_jax.hf import hf_io
from grpo_jax.rollout import carry as carry_lib
from grpo_jax.rollout import sampling
from grpo_jax.studies import vmapped_runs


# A step's status outputs, read by the host loop (not metrics): the reward terms' and the environment's
HOST_STATUS = ("reward_status", "env_status")
# checkpoint metadata of an RL run: its non-finite steps in a row when it was saved (rl.max_nonfinite_in_row)
NONFINITE_IN_ROW = "nonfinite_in_row"
STOPPED = "stopped"  # ... and, saved where it stopped itself, why (a resume with the same config stays stopped)


class NonFiniteError(errors.RunStopped):
  """Too many non-finite steps in a row; the last good state is saved."""


def device_batch(mesh, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """Places host arrays with rows split over the data axes; a prompt batch smaller than the data axes is
  replicated (the step tiles it G times and splits the rows then). Every process builds the same global batch."""
  n_data = mesh.shape["data"] * mesh.shape["fsdp"]
  if "prompt_mask_NxP" in batch:
    sampling.check_left_padded(batch["prompt_mask_NxP"], "an RL step's prompt batch")
  out = {}
  for k, v in batch.items():
    try:
      out[k] = jax.device_put(v, sharding.batch_sharding(mesh, v.ndim) if v.shape[0] % n_data == 0
                              else sharding.replicated(mesh))
    except AssertionError as e:  # JAX compares a value put over several processes (was its traceback and arrays)
      if "not the same on each process" not in str(e):
        raise
      raise errors.InputError(f"the {jax.process_count()} processes drew different batches ({k} differs): each "
                              "must read the same data: the same task.data_dir copy on every host, the same config "
                              "and code.") from None
  return out


def _host_scalars(m: dict) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(m).items()
          if not k.startswith("samples/") and k not in HOST_STATUS}


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
  """(step, host batch, device batch, start time) for steps start..steps-1, until a stop signal (checked before each
  step)."""
  for step in range(start, steps):
    if guard.should_stop():
      return
    batch = next(batches)
    yield step, batch, device_batch(mesh, batch), time.perf_counter()


def init_or_restore(config, mesh, mcfg, family, ckpt: ckpt_lib.Checkpointer, init_from: str):
  """Resumes from the newest good checkpoint; else the family's initial state (from `init_from` params if set:
  the reference and PPO's value network start from them too, as in RLHF practice)."""
  abstract, shard = family.state_spec(config, mesh, mcfg)
  start = ckpt.latest_step()
  fresh = None
  if mcfg.lora is not None:
    # LoRA: the checkpoints hold the adapters and their optimizer state; the base comes from its source again,
    # and a resume onto a base with another checksum is refused (checkpoint.Checkpointer.set_frozen).
    fresh = family.init(config, mesh, mcfg, params=_init_params(init_from, mesh, mcfg))
    ckpt.set_frozen(state_lib.base_source(init_from, config_lib.run_seed(config)), fresh["base"])
  if start is not None:
    state, meta = ckpt.restore(None, state_lib.with_shardings(abstract, shard))
    logging.info("Resumed from %s at step %d.", ckpt.directory, meta["step"])
    return state, int(meta["step"])
  if fresh is not None:
    return fresh, 0
  return family.init(config, mesh, mcfg, params=_init_params(init_from, mesh, mcfg)), 0


def _init_params(init_from: str, mesh, mcfg):
  """The model params `init_from` names (hf:<dir> or a params checkpoint), sharded; None: the seed's init."""
  params = None
  if init_from:
    model_abstract = state_lib.abstract_params(mesh, mcfg)  # the model's (with LoRA: the base's), sharded
    params = (load_hf_params(init_from[3:], mcfg, jax.tree.map(lambda a: a.sharding, model_abstract))
              if init_from.startswith("hf:") else params_ckpt.load_params(init_from, model_abstract))
    logging.info("Initialising params from %s.", init_from)
  return params


class Program(NamedTuple):
  """The step the RL loop runs: one run's (families.make_step) or S vmapped runs' (vmapped_runs.make_steps), whose
  states and metrics carry a leading axis of S runs (purejaxrl's vmap over whole training runs)."""
  step: Callable  # (state, device batch) -> (state, metrics)
  runs: int = 1
  run_state: Callable | None = None  # (stacked state, i) -> run i's state as a `main` run's; None: one run

  def of(self, tree, i: int):
    """Run i's part of a state, metrics or host tree."""
    return tree if self.run_state is None else jax.tree.map(lambda x: x[i], tree)

  def state_of(self, state, i: int):
    """Run i's state as its checkpoint holds it."""
    return state if self.run_state is None else self.run_state(state, i)

  def saved_state(self, state, i: int):
    """What the loop hands Checkpointer.maybe_save: run i's state, or for vmapped runs a function slicing it out,
    called only when a save happens (each run's slice is a copy of its state: it was made every step and at the end
    for every run, saved or not, and for a scratch run that saves nothing)."""
    return state if self.run_state is None else functools.partial(self.run_state, state, i)


@dataclasses.dataclass
class Run:
  """One run the RL loop trains: its config and directory, and the `main` machinery around its state."""
  config: Any
  workdir: str
  guard: loop_guard.LoopGuard
  ckpt: ckpt_lib.Checkpointer | ckpt_lib.NoCheckpoints  # NoCheckpoints: a scratch run (an ablation table's)
  writer: metrics_lib.MetricWriter | None = None
  failed: str = ""  # why the run stopped itself (non-finite steps); "" while it trains
  last_eval: dict[str, float] = dataclasses.field(default_factory=dict)
  # the config the held-out evaluation decodes with (auto.resolve_eval: eval.batch rows beside the resident RL state,
  # not the rollout's plan); None: the loop's caller evaluates through its own `evaluate` hook
  eval_config: Any = None


def reward_terms(config, tokenizer, python_fns: dict | None = None) -> reward_spec.RewardSpec:
  """The config's reward terms; Python terms from the task (python_reward_fns) and `python_fns`."""
  rl = config.rl
  fallback = float(rl.reward_fallback) if rl.reward_fallback != "" else None
  spec = rewards_lib.build(config.rewards, reward_spec.Context(config.task.name, tokenizer,
                                                             random_rate=float(rl.get("random_reward_rate", 0.5))),
                           {**python_reward_fns(config, tokenizer), **(python_fns or {})}, fallback,
                           rl.reward_timeout_s)
  if config.get("tools") is not None and config.tools.env:  # the rollout's environment (docs/tools.md)
    env = env_batch.build(config, tokenizer)
    # else its rewards are said to go unused: an R1 stage logs 'env' at weight 0 where it does not weight it
    env.rewards_read = any(name == "env" and float(w) != 0 for name, w in config.rewards)
    spec = spec._replace(env=env)
  return spec


def step_error(spec: reward_spec.RewardSpec, reward_status: np.ndarray, env_status) -> str:
  """Why a step kept its old state: the first failing Python reward term's message, else the environment's
  (EnvBatch.error_message); '' when both are OK."""
  s = np.asarray(reward_status)
  if (s != reward_spec.OK).any():
    return spec.python_terms[spec.names[int(np.argmax(s != reward_spec.OK))]].error_message(int(s.max()))
  if env_status is not None and int(np.max(env_status)) != reward_spec.OK:
    return spec.env.error_message(int(np.max(env_status)))
  return ""


MAX_FALLBACK_REASONS = 8  # distinct fallback reasons logged per run (the metrics count every fallback)


def log_fallbacks(spec: reward_spec.RewardSpec, scalars: dict, seen: set) -> None:
  """A step's counted fallbacks (train/reward_fallbacks, train/tool_fallbacks) say why in the log: each distinct
  reason once (the row / score index left out), at most MAX_FALLBACK_REASONS; the metrics count every one."""
  reasons = []
  if np.any(np.asarray(scalars.get("train/reward_fallbacks", 0)) > 0):
    reasons += [("reward_fallbacks", f"reward term '{n}': {t.last_error}") for n, t in spec.python_terms.items()
                if t.last_error]
  env = getattr(spec, "env", None)
  if np.any(np.asarray(scalars.get("train/tool_fallbacks", 0)) > 0) and env is not None and env.last_error:
    reasons.append(("tool_fallbacks", f"environment '{env.name}': {env.last_error}"))
  for metric, why in reasons:
    key = re.sub(r"\b(row|score) \d+", r"\1 N", why)
    if key in seen or len(seen) >= MAX_FALLBACK_REASONS:
      continue
    seen.add(key)
    more = " (further reasons are not logged)" if len(seen) == MAX_FALLBACK_REASONS else ""
    logging.warning("fallback counted in train/%s: %s%s", metric, why, more)


def _nonfinite(bad_in_row: int, done: int, row: dict[str, float]) -> str:
  """The stop line; its advice follows what was non-finite: the rewards (then the learning rate is not the cause),
  or the loss/gradient with finite rewards."""
  bad_rewards = sorted(k for k, v in row.items() if k.partition("/")[2].startswith("reward") and not np.isfinite(v))
  if bad_rewards:
    fix = (f"the rewards were non-finite ({', '.join(bad_rewards[:3])}): fix the reward terms' output (a Python term's "
           "rl.reward_fallback must be a finite number)")
  else:
    fix = "the rewards were finite, the loss or gradient was not: lower optim.lr"
  return (f"{bad_in_row} steps in a row had a non-finite loss or gradient (updates skipped); the last good state is "
          f"saved at step {done}. Likely cause: {fix} (config.rl.max_nonfinite_in_row sets the limit).")


def prompt_sources(config, tokenizer, spec, n_prompts: int) -> tuple[Callable[[int], Iterator[dict]],
                                                                       Callable[[], dict]]:
  """(stream(k): the RL batches from step k, held_out(): the held-out set), rendered alike: under
  tools.format='qwen' both list the environment's tools in the chat template (train/eval prompt parity)."""
  env = getattr(spec, "env", None)
  tools = env_batch.prompt_tools(config, tokenizer, None if env is None else env.env)
  t = config.task
  stream = lambda k: data_lib.rl_batches(t, tokenizer, "train", n_prompts, config.seed, k, t.prompt_len, tools)
  return stream, lambda: data_lib.eval_set(t, tokenizer, config.eval.size, t.prompt_len, tools)


def rl_loop(program: Program, runs: list[Run], state, start: int, *, mesh, mcfg, tokenizer, spec,
            log: Callable[[str], None] | None = None, batches: Iterator[dict] | None = None,
            evaluate: Callable[[int, Any], None] | None = None,
            observe: Callable[[int, dict, dict], None] | None = None) -> int | None:
  """THE RL loop, for one run or `program.runs` vmapped runs trained on the same batches (their configs agree but
  in vmapped_runs.TRACEABLE knobs and the run seed): each run logs, samples, evaluates, plots and checkpoints into
  its own directory on the cadences of `train.*`. A run with `rl.max_nonfinite_in_row` non-finite steps in a row
  is saved and stopped (`run.failed`) while the others go on (the loop ends when none is left). A failing Python
  reward term stops every run, saved; raises PythonTermError. A stop signal saves every run; raises
  errors.Preempted. `log`: a line per step (S > 1). What a study measures comes in through three hooks (the
  ablation tables): `batches` (host batches from step `start`; default: the task's training batches),
  `evaluate(step, state)` in place of the held-out evaluation, on its cadence (step 0 of a fresh run, every
  `train.eval_every`, the last step), and `observe(step, host batch, metrics)` after every step.
  Returns the step's trace count after its first call (vmapped_runs' steps count them) or None."""
  c0, S = runs[0].config, program.runs
  rl, tr, steps = c0.rl, c0.train, c0.train.steps
  if hasattr(program.step, "place"):  # vmapped runs: placed as the step leaves them, from the first evaluation on
    state = program.step.place(state)
  for run in runs:  # one progress line per command: a group of runs prints `log`'s instead
    run.writer = metrics_lib.MetricWriter(run.workdir, resume_step=start if start else None,
                                          use_tensorboard=run.config.log.tensorboard,
                                          wandb_project=run.config.log.wandb_project or None, total_steps=steps,
                                          progress=S == 1)
    changed = run.guard.resumed(run.ckpt, start, run.writer)
    if start and evaluate is None and not changed:  # the held-out keys of its earlier rows are this run's
      check_best_metric(run.config, logged_eval_keys(run.workdir, start))
    stopped = run.ckpt.restored_meta.get(STOPPED, "") if start else ""
    if stopped and not changed:  # it stopped itself at this step: as the uninterrupted run, it trains no further
      run.failed = stopped  # (a vmapped group's other runs, restored back to its step, go on without it)
  n_prompts = rl.prompts_per_step * (rl.oversample if rl.dynamic_sampling else 1)
  stream, held_out_set = prompt_sources(c0, tokenizer, spec, n_prompts)
  if batches is None:
    cspec = rollout_lib.carry_spec(c0)
    if cspec is None:
      batches = stream(start)
    else:  # partial rollouts: the first step fills the carry's table, later ones bring B prompts (carry.host_stream)
      cspec = state_lib.on_mesh(state_lib.Layout(None, carry=cspec), mesh).carry
      batches = carry_lib.host_stream(stream, cspec, start)
  evaluators: dict[str, evaluation.Evaluator] = {}  # by sampling settings (a swept temperature changes them)
  eval_set = []

  def held_out(step):
    if evaluate is not None:
      evaluate(step, state)
      return
    if not eval_set:  # held-out eval verifies in-graph or on the host (the task's host_verifier, tasks/registry.py)
      eval_set.append(held_out_set())
    for i, run in enumerate(runs):
      if run.failed:
        continue
      if run.eval_config is None:
        raise RuntimeError("rl_loop: a Run without eval_config (train_group resolves it) and no `evaluate` hook.")
      key = json.dumps(run.eval_config.sampling.to_dict(), sort_keys=True)
      if key not in evaluators:
        evaluators[key] = evaluation.Evaluator(run.eval_config, mcfg, tokenizer, mesh, eval_set[0])
      t0 = time.perf_counter()
      policy = state_lib.model_params(program.state_of(state, i))  # with LoRA: the run's adapters on the base
      run.last_eval, texts = evaluators[key](policy, jax.random.PRNGKey(run.config.seed + 1))
      check_best_metric(run.config, run.last_eval)
      run.writer.write(step, {**run.last_eval, "perf/eval_time_s": time.perf_counter() - t0})
      logging.info("step %d eval %s (%s) | %r", step, run.last_eval, run.workdir, texts[:1])

  if start == 0:
    held_out(0)
  # non-finite steps in a row, per run: host state carried between steps, so it goes with every checkpoint (a resume
  # that restarted the count at 0 ran past the step where the uninterrupted run stopped)
  # a run resumed with an allowed config change (a lower optim.lr) after it stopped itself gets a fresh count
  bad_in_row = np.array([int(run.ckpt.restored_meta.get(NONFINITE_IN_ROW, 0)) if start and not
                         (run.ckpt.restored_meta.get(STOPPED) and not run.failed) else 0 for run in runs], np.int64)
  meta = lambda i, at: {"step": at, NONFINITE_IN_ROW: int(bad_in_row[i]), **({STOPPED: runs[i].failed}
                                                                            if runs[i].failed else {})}
  done, traces, reward_error = start, None, ""
  fallback_reasons: set[str] = set()
  with contextlib.ExitStack() as running:
    for run in runs:  # one GracefulStop (the command's or the first guard's) shared by every run's guard
      running.enter_context(run.guard.running())
    running.callback(spec.close)  # Python reward workers stop however the loop ends
    for step, host_batch, batch, t0 in _steps(runs[0].guard, mesh, batches, start,
                                              start if all(run.failed for run in runs) else steps):
      state, m = program.step(state, batch)
      if observe is not None:
        observe(step, host_batch, m)
      status = np.asarray(jax.device_get(m["reward_status"]))  # [S ×] terms
      env_status = np.asarray(jax.device_get(m["env_status"])) if "env_status" in m else None  # [S]
      bad = [i for i in range(S) if step_error(spec, program.of(status, i),
                                                None if env_status is None else program.of(env_status, i))]
      if bad:
        reward_error = step_error(spec, program.of(status, bad[0]),
                                  None if env_status is None else program.of(env_status, bad[0]))
        reward_error = reward_error if S == 1 else f"{runs[bad[0]].workdir}: {reward_error}"
        for i, run in enumerate(runs):
          if not run.failed:
            run.ckpt.maybe_save(step, program.saved_state(state, i), meta(i, step), force=True)
        break
      scalars = {k: np.asarray(v) for k, v in jax.device_get(m).items()
                 if not k.startswith("samples/") and k not in HOST_STATUS}
      log_fallbacks(spec, scalars, fallback_reasons)
      dt = time.perf_counter() - t0
      done = step + 1
      if step == start and hasattr(program.step, "traces"):
        traces = program.step.traces()
      samples = None
      if tr.sample_every and done % tr.sample_every == 0:
        samples = jax.device_get({k: v for k, v in m.items() if k.startswith("samples/")})
      for i, run in enumerate(runs):
        if run.failed:
          continue
        row = {k: float(program.of(v, i)) for k, v in scalars.items()}
        n_tok = row["train/completion_len_mean"] * rl.prompts_per_step * rl.G
        row.update({"perf/step_time_s": dt, "perf/tokens_per_s": n_tok / dt})
        if "train/decode_tokens" in row:  # partial rollouts: what the step drew, not what it trained
          row["perf/decode_tokens_per_s"] = row["train/decode_tokens"] / dt
        if step == start:
          row["perf/compile_time_s"] = dt
        if done % tr.log_every == 0 or done == steps:
          run.writer.write(done, row)
        if samples is not None:
          sm = program.of(samples, i)
          texts = [tokenizer.decode(t[mk > 0].tolist()) for t, mk in zip(sm["samples/tokens_NxL"],
                                                                           sm["samples/mask_NxL"])]
          turns = None  # multi-turn rows: the interleaved model / tool parts
          if "samples/obs_NxL" in sm:
            turns = [transcript_lib.transcript(t, mk, o, tokenizer) for t, mk, o in zip(
                sm["samples/tokens_NxL"], sm["samples/mask_NxL"], sm["samples/obs_NxL"])]
          run.writer.log_samples(done, texts, [float(r) for r in sm["samples/r_N"]], n_print=2 if S == 1 else 0,
                                 transcripts=turns, **data_lib.sample_context(c0.task, tokenizer, "train", sm))
        bad_in_row[i] = bad_in_row[i] + 1 if row["train/nonfinite_updates"] > 0 else 0
        if bad_in_row[i] >= rl.max_nonfinite_in_row:
          run.failed = _nonfinite(int(bad_in_row[i]), done, row)
          run.ckpt.maybe_save(done, program.saved_state(state, i), meta(i, done), force=True)
          run.ckpt.wait()
          if log:
            log(f"{os.path.basename(run.workdir)} stopped: {run.failed}")
      if all(run.failed for run in runs):
        break
      evaluated = done % tr.eval_every == 0 or done == steps
      if evaluated:
        held_out(done)
      for i, run in enumerate(runs):
        if run.failed:
          continue
        if run.config.log.plots and tr.plot_every and done % tr.plot_every == 0:
          plots.write_plots(run.workdir)
        save_meta = meta(i, done)
        if evaluated and run.ckpt.best is not None and evaluate is None:  # the evaluated params, with their score
          save_meta[ckpt_lib.BEST] = ckpt_lib.best_record(*run.ckpt.best, run.last_eval[run.ckpt.best[0]])
        scored = ckpt_lib.BEST in save_meta
        saved = run.ckpt.maybe_save(done, program.saved_state(state, i), save_meta, force=done == steps or scored)
        if saved and scored:  # the save may still be writing: the best of the committed steps and this one
          best = ckpt_lib.best_of([*ckpt_lib.committed_best_records(run.ckpt.directory), (done, save_meta[ckpt_lib.BEST])],
                                  *run.ckpt.best)
          logging.info("step %d %s %s; best kept: %s", done, run.ckpt.best[0], save_meta[ckpt_lib.BEST]["value"],
                       f"step {best[0]} ({best[1]['value']})" if best else "none (no finite value yet)")
      if log:
        means = {k: float(np.mean(scalars[k])) for k in ("train/reward_mean", "train/kl") if k in scalars}
        log(f"{S} runs, step {done}/{steps}, {dt:.2f}s/step, mean over runs: "
            + ", ".join(f"{k} {v:.4g}" for k, v in means.items()))
    for i, run in enumerate(runs):  # inside running(): a second signal cannot interrupt the saves
      if not run.failed:
        run.guard.finish(run.ckpt, program.saved_state(state, i), done, meta(i, done))
  for run in runs:
    run.ckpt.close()
    run.writer.close()
    if run.config.log.plots:
      plots.write_plots(run.workdir)
  if reward_error:
    raise rewards_lib.PythonTermError(reward_error)
  if done < steps and not all(run.failed for run in runs):
    where = runs[0].workdir if S == 1 else f"{S} vmapped runs ({', '.join(os.path.basename(r.workdir) for r in runs)})"
    raise errors.Preempted(where, done)
  return traces


def check_best_metric(config, row: dict[str, float]) -> None:
  """train.keep_best names a key of the held-out rows; which keys exist depends on the task and eval settings
  (pass@k, tools, process readings), so it is checked against the first row (step 0 of a fresh run; on resume, the
  newest row the run logged: logged_eval_keys). An empty `row` (no evaluation logged yet) checks nothing."""
  metric = config.train.get("keep_best", "")
  if metric and row and metric not in row:
    raise errors.ConfigError(f"config.train.keep_best={metric!r} is not a held-out metric of this run; it logs "
                             f"{', '.join(sorted(row))}.")


def logged_eval_keys(workdir: str, upto: int) -> dict[str, None]:
  """The held-out keys of a run's newest evaluation row at or before `upto` ({}: none): what a resume under the same
  config evaluates, so train.keep_best (free to change on resume) is checked before the run trains again, not at its
  next evaluation (the steps trained since its last checkpoint were lost). Read on process 0, agreed by all."""
  keys: list[str] = []
  if jax.process_index() == 0:
    rows = [r for r in metrics_lib.read_metrics(workdir) if r.get("step", upto + 1) <= upto]
    keys = next(([k for k in r if k.startswith("eval/")] for r in reversed(rows)
                 if any(k.startswith("eval/") for k in r)), [])
  if jax.process_count() > 1:
    keys = json.loads(workdir_lock.broadcast_text(json.dumps(keys), size=None))
  return dict.fromkeys(keys)


@dataclasses.dataclass
class Member:
  """One run of a group to train (train_group): its config, directory, where its policy starts (`train.init_from`
  or a stage's params; '' = the seed's init) and the run-config view its checkpoints record (None: its own)."""
  config: Any
  workdir: str
  init_from: str = ""
  record: dict | None = None


def run_rl(config, workdir: str, init_from: str | None = None, python_fns: dict | None = None,
           record: dict | None = None) -> dict[str, float]:
  """GRPO-family (or PPO) training of one run: a group of one (train_group); returns the last eval metrics. Resumes
  automatically from `workdir`. `record`: the run-config view stored with each checkpoint (default:
  run_config.view(config, 'rl')). Raises errors.Preempted when SIGTERM/SIGINT stopped it before `train.steps` (its
  state saved), NonFiniteError when it stopped itself."""
  config = model_source.resolve(config)  # model fields a config leaves to the hf: checkpoint (a no-op if resolved)
  member = Member(config, workdir, config.train.init_from if init_from is None else init_from, record)
  (run,), _ = train_group([member], python_fns=python_fns)
  if run.failed:
    raise NonFiniteError(run.failed)
  return run.last_eval


def check_recorded(config, recorded: dict, tokenizer=None, today: dict | None = None) -> None:
  """A resumed run's resolved config validated again: a value it recorded (rl/auto.py, reused on resume) may not fit
  a change train.allow_config_change let through (slots above fewer rows), or another device count: one line naming
  the key, not a traceback inside the step. `today`: what auto picks for the config here ({key: value}); the line
  then gives the flags that resume with it."""
  if not recorded:
    return
  try:
    validate.validate_rl(config, validate.device_count(), tokenizer)
  except errors.ConfigError as e:
    key = str(e).split(":", 1)[0].removeprefix("config.")
    # the recorded key the error names (its own key, or the one it conflicts with: rl.packing beside token_select)
    keys = [k for k in sorted(recorded) if k == key] or [k for k in sorted(recorded) if k in str(e)]
    was = "".join(f": {k}={recorded[k]}" for k in keys[:1]) + (", the value this run started with and a resume "
                                                                "reuses" if keys else "")
    k = keys[0] if keys else None
    # the keys auto chooses with k whose pick here differs, each set to a value that is not its `auto` (decode_tp=0
    # is decode_tp's auto: with the layout still auto, the resume took the recorded tp layout and degree again)
    change = [j for j in (auto.chosen_with(k) if keys else ()) if j in (today or {}) and
              today[j] != recorded.get(j, today[j]) and not auto.is_auto(j, today[j])]
    if k is None:  # no recorded key named (it printed a literal `<key>` placeholder): the key it names, and the record
      what = f"config.{key}" if str(e).startswith("config.") else "the config"
      fix = (f"change {what} to fit the values this run recorded and a resume reuses "
             f"({', '.join(f'{j}={recorded[j]}' for j in sorted(recorded))})")
    elif change:
      allow = ",".join(dict.fromkeys([a.strip() for a in str(config.train.get("allow_config_change", "")).split(",")
                                      if a.strip()] + change))
      fix = (f"resume with {' '.join(f'--config.{j}={today[j]}' for j in change)} "
             f"--config.train.allow_config_change={allow} (what auto picks here; a change of the run's program)")
    else:
      fix = f"set it explicitly with train.allow_config_change={k}"
    raise errors.ConfigError(f"{e} (on resume{was}; {fix}, or use a new --workdir)") from None


def train_group(members: Sequence[Member], *, python_fns: dict | None = None, compiler_options: dict | None = None,
                log: Callable[[str], None] | None = None) -> tuple[list[Run], list[int | None]]:
  """THE set-up of RL training, for one run (`python -m grpo_jax.main`, an R1 stage: the family's sharded step) or
  S runs whose programs agree (a vmapped sweep group: vmapped_runs.make_steps, their traceable knobs per run), each
  in its own directory, then rl_loop: every member's changed config refused before anything is written
  (LoopGuard), the config validated, the `auto` knobs resolved once for the S runs sharing each device (on resume:
  what the runs recorded; the runs must agree), the reward terms, each run's state restored from its newest
  checkpoint or initialised (from its `init_from`), runs saved at different steps continued in sub-groups by step.
  -> (the Runs: `failed`, `last_eval`; the step's trace counts per sub-group)."""
  S = len(members)
  guards = [loop_guard.LoopGuard(m.config, m.workdir, "rl", m.record) for m in members]  # before any write
  tokenizer, mesh, mcfg = setup_common(members[0].config, members[0].workdir, validate.validate_rl)
  for m in members[1:]:
    validate.validate_rl(m.config, jax.device_count(), tokenizer)
    os.makedirs(m.workdir, exist_ok=True)
  # every `auto` knob (rl/auto.py) chosen for this mesh and device memory before the step is built, recorded with
  # every checkpoint; on resume the values the run recorded
  configs = [g.resolve(m.config, mesh, lanes=S) for g, m in zip(guards, members)]
  for c, g in zip(configs, guards):
    check_recorded(c, g.recorded, tokenizer)
  _, differ = auto.disagree(configs, auto.Context(dict(mesh.shape), None))  # by what each runs (preflight's comparison)
  if differ:
    raise errors.InputError(f"the runs of one program resolved {', '.join(differ)} differently (runs recorded under "
                            "other `auto` choices): set the keys explicitly, or run them with --mode=serial.")
  spec = reward_terms(configs[0], tokenizer, python_fns)
  # the held-out evaluation's own decode plan, before anything is traced: from the unresolved config (what the
  # evaluation decodes, eval.batch rows beside the resident state), not the rollout's resolved values
  # (logged for the first run: a group's runs differ in traceable knobs only, which the plan does not read)
  evals = [auto.resolve_eval_here(m.config, mesh, rl_state=True, lanes=S, log=not i)[0] for i, m in enumerate(members)]
  runs = [Run(c, m.workdir, g, g.checkpointer(c), eval_config=e)
          for c, m, g, e in zip(configs, members, guards, evals)]
  family = families.for_config(configs[0])
  traces = []
  if S == 1:
    step = families.make_step(configs[0], mesh, mcfg, spec, tokenizer, family=family,
                              compiler_options=compiler_options)
    state, start = init_or_restore(configs[0], mesh, mcfg, family, runs[0].ckpt, members[0].init_from)
    traces.append(rl_loop(Program(step), runs, state, start, mesh=mesh, mcfg=mcfg, tokenizer=tokenizer, spec=spec,
                          log=log))
    return runs, traces
  abstract, shard = family.state_spec(configs[0], mesh, mcfg)
  base = None
  if mcfg.lora is not None:  # one frozen base for every run: its identity goes with the checkpoints of each run
    source = members[0].init_from
    if any(m.init_from != source for m in members):
      raise errors.InputError("model.lora: the runs of a vmapped sweep share one frozen base; give them one "
                              "train.init_from, or run them with --mode=serial.")
    c0 = configs[0]
    base = vmapped_runs.init_states(c0, mcfg, [config_lib.run_seed(c0)],
                                    params=_init_params(source, mesh, mcfg) if source else None)["base"]
    for run in runs:
      run.ckpt.set_frozen(state_lib.base_source(source, config_lib.run_seed(c0)), base)
  starts, states_at = [0] * S, [None] * S
  for i, run in enumerate(runs):
    if run.ckpt.latest_step() is not None:
      states_at[i], meta = run.ckpt.restore(None, state_lib.with_shardings(abstract, shard))
      starts[i] = int(meta["step"])
      logging.info("Resumed %s at step %d.", run.workdir, starts[i])
  restore_together(runs, starts, states_at, state_lib.with_shardings(abstract, shard), log)
  by_start: dict[int, list[tuple[int, Any]]] = {}
  for i, (start, state) in enumerate(zip(starts, states_at)):
    by_start.setdefault(start, []).append((i, state))
  for start in sorted(by_start):  # runs saved at different steps continue in sub-groups, one after another
    sub = by_start[start]
    if len(by_start) > 1 and log:
      log(f"{len(sub)} run(s) resume at step {start}")
    idx = [i for i, _ in sub]
    hp = vmapped_runs.varying([configs[i] for i in idx])
    states = _stacked_start([(members[i], st) for i, st in sub], configs[idx[0]], start, mesh, mcfg, hp)
    step = vmapped_runs.make_steps(configs[idx[0]], mesh, mcfg, spec, tokenizer, compiler_options)
    program = Program(step, len(idx), vmapped_runs.run_state)
    traces.append(rl_loop(program, [runs[i] for i in idx], states, start, mesh=mesh, mcfg=mcfg,
                          tokenizer=tokenizer, spec=spec, log=log))
  return runs, traces


def restore_together(runs: Sequence[Run], starts: list[int], states: list, abstract,
                     log: Callable[[str], None] | None) -> None:
  """Runs of one group restored at different steps (one stopped later, or one whose newest checkpoint was damaged)
  go back to the newest step all of them have, so the group stays ONE program of S runs: a vmapped program over
  fewer runs orders its reductions differently, so sub-groups would end a few ulps away from the uninterrupted sweep
  (benchmarks/chaos.py found it). A run ahead recomputes its steps since then (the same program on the same inputs:
  the same values). Where some run has no such step, or its copy does not restore, the runs continue in sub-groups
  by start step. Updates `starts` and `states` in place."""
  common = min(starts)
  ahead = [i for i, s in enumerate(starts) if s > common]
  if not common or not ahead or any(common not in runs[i].ckpt.all_steps() for i in ahead):
    return
  for i in ahead:
    try:
      state, _ = runs[i].ckpt.restore(common, abstract)
    except errors.InputError as e:  # that step is damaged: sub-groups, as before
      logging.warning("%s: step %d does not restore (%s); its run continues in a sub-group", runs[i].workdir, common,
                      e)
      continue
    if log:
      log(f"{os.path.basename(runs[i].workdir)}: back from step {starts[i]} to step {common}, the newest step every "
          "run of its group has (the group continues as one program)")
    starts[i], states[i] = common, state


def _stacked_start(sub: list[tuple[Member, Any]], config, start: int, mesh, mcfg, hp: dict) -> dict:
  """The stacked state a sub-group of runs continues from: their restored states (a LoRA base, the same object in
  every restored run, unstacked), or at step 0 their initial states (each from its init_from, or its seed)."""
  if start > 0:
    stacked = vmapped_runs.stack([{k: v for k, v in st.items() if k != "base"} for _, st in sub])
    if "base" in sub[0][1]:
      stacked["base"] = sub[0][1]["base"]
    return vmapped_runs.with_hparams(stacked, {k: v for k, v in hp.items() if k not in vmapped_runs.OPT_KEYS})
  seeds = [config_lib.run_seed(m.config) for m, _ in sub]
  inits = {m.init_from for m, _ in sub}
  params = run_params = None
  if len(inits) == 1 and next(iter(inits)):
    params = _init_params(next(iter(inits)), mesh, mcfg)
  elif any(inits):
    run_params = [_init_params(m.init_from, mesh, mcfg) for m, _ in sub]
  return vmapped_runs.init_states(config, mcfg, seeds, params=params, run_params=run_params, hparams=hp)


def final_params(mcfg, state) -> dict:
  """A stage's final policy as a params checkpoint holds it: the model params (with LoRA: adapters merged into
  the base), so the next stage starts from a plain model. In the plain model's dtypes (float32): a bfloat16-held
  base's merge kept in bfloat16 rounded a small adapter delta away (as the export once did)."""
  params = lora_lib.merged(mcfg, state_lib.model_params(state), jax.numpy.float32)
  return jax.tree.map(lambda x, s: x.astype(s.dtype), params, model_lib.param_shapes(mcfg))


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
  mcfg = sft_step.model_config(config, mcfg)  # adapters only under sft.lora
  steps = config.sft.steps
  loss_on = loss_on or config.sft.loss_on
  if evaluate_at_end and loss_on == "completion":  # its final evaluation's keys, before it trains (as preflight)
    validate.validate_eval_decode(config, dict(mesh.shape))
    # what that evaluation's `auto` knobs resolve to (the Evaluator's plan), recorded as `resolved.<key>` with every
    # checkpoint and so in the finished stage.json: a rerun that sets a key to that value is no change, as for an RL
    # stage (the main job's SFT stage refused sampling.engine=static, what its run resolved, as 'auto' → 'static')
    planned, _ = auto.resolve_eval_here(config, mesh, log=False)
    guard.view = run_config.with_resolved(guard.view, {k: v for k, v in auto.resolved_values(planned).items()
                                                       if k in auto.EVAL_KEYS})
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
    for step, _, batch, t0 in _steps(guard, mesh, batches, start, steps):
      state, m = step_fn(state, batch)
      done = step + 1
      if done % config.train.log_every == 0 or done == steps:
        scalars = _host_scalars(m)
        scalars["perf/step_time_s"] = time.perf_counter() - t0
        if step == start:  # as the RL loop: the compiling step's time on its own key
          scalars["perf/compile_time_s"] = scalars["perf/step_time_s"]
        writer.write(done, scalars)
      ckpt.maybe_save(done, state, {"step": done}, force=done == steps)
    guard.finish(ckpt, state, done)  # inside running(): a second signal cannot interrupt the save
  ckpt.close()
  if guard.stopped:
    writer.close()
    guard.raise_if_stopped()  # no params, no final eval: the stage is not finished
  params_ckpt.save_params(os.path.join(workdir, "params"), final_params(mcfg, state))
  result: dict[str, float] = {}
  if evaluate_at_end and loss_on == "completion":
    evaluator = evaluation.Evaluator(config, mcfg, tokenizer, mesh,
                                     data_lib.eval_set(config.task, tokenizer, config.eval.size,
                                                       config.task.prompt_len,
                                                       env_batch.prompt_tools(config, tokenizer)))
    t0 = time.perf_counter()
    result, _ = evaluator(state_lib.model_params(state), jax.random.PRNGKey(config.seed + 1))
    writer.write(steps, {**result, "perf/eval_time_s": time.perf_counter() - t0})  # as the RL loop's eval rows
  writer.close()
  if config.log.plots:
    plots.write_plots(workdir)
  return result
