"""train.keep_best: every held-out evaluation saves a checkpoint recording its score, rotation keeps the best one
beside the newest `keep_checkpoints`, and export --best writes it."""
import json
import logging
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.hf import export as export_lib
from grpo_jax.infra import checkpoint
from grpo_jax.infra import errors
from grpo_jax.infra import params_ckpt
from grpo_jax.model import model as model_lib
from grpo_jax.run import evaluation
from grpo_jax.run import preflight
from grpo_jax.run import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(seed):
  return {"params": {"w": jnp.full((4,), float(seed))}, "step": jnp.int32(seed)}


def _saved(directory):
  return sorted(int(p) for p in os.listdir(directory) if p.isdigit())


def test_rotation_keeps_the_best_step_per_recorded_metric(tmp_path):
  """keep=1; scores by step (max): 0.2, 0.7, NaN, 0.5, 0.7 (a tie: the earlier step stays best), then a step saved
  without a score. A reopened checkpointer with another metric (min) keeps its own best AND the earlier metric's."""
  scores = {1: 0.2, 2: 0.7, 3: math.nan, 4: 0.5, 5: 0.7}
  with checkpoint.Checkpointer(tmp_path, save_every=100, keep=1, async_save=False,
                               best=("eval/accuracy", "max")) as ckpt:
    for step, v in scores.items():
      meta = {checkpoint.BEST: checkpoint.best_record("eval/accuracy", "max", v)}
      assert ckpt.maybe_save(step, _state(step), meta, force=True)
      ckpt.wait()
      best = {1: 1, 2: 2, 3: 2, 4: 2, 5: 2}[step]
      assert _saved(tmp_path) == sorted({best, step}), (step, _saved(tmp_path))
      if step == 3:
        assert checkpoint.read_meta(tmp_path, 3)[checkpoint.BEST]["value"] is None  # NaN: recorded, no candidate
    assert ckpt.maybe_save(6, _state(6), force=True)  # a periodic save: no score
    ckpt.wait()
    assert _saved(tmp_path) == [2, 6]
  assert checkpoint.best_step(tmp_path) == (2, {"metric": "eval/accuracy", "mode": "max", "value": 0.7})
  with checkpoint.Checkpointer(tmp_path, save_every=100, keep=1, async_save=False,
                               best=("eval/completion_len_mean", "min")) as ckpt:
    for step, v in ((7, 30.0), (8, 12.0), (9, 20.0)):
      ckpt.maybe_save(step, _state(step), {checkpoint.BEST: checkpoint.best_record(
          "eval/completion_len_mean", "min", v)}, force=True)
      ckpt.wait()
    assert _saved(tmp_path) == [2, 8, 9]  # 2: the accuracy best is not deleted by the change of metric
  assert checkpoint.best_step(tmp_path)[0] == 8  # the newest record's metric and mode
  assert checkpoint.best_step(tmp_path, "eval/accuracy", "max")[0] == 2
  assert checkpoint.best_step(tmp_path, "eval/accuracy", "min") is None  # no step records accuracy under min
  with pytest.raises(errors.ConfigError, match="keep_best_mode"):
    checkpoint.Checkpointer(tmp_path / "x", save_every=1, keep=1, best=("eval/accuracy", "largest"))


def test_a_best_step_whose_metadata_does_not_read_is_never_replaced_by_another(tmp_path, caplog):
  """Scores 0.3, 0.9, 0.5, 0.4 (max, keep=1) keep step 2; its metadata then truncated (a torn write, a bad disk):
  which step is best can no longer be told. Before, best_step named step 4 (0.4) and export --best wrote it as
  the run's best, and the next save's rotation deleted step 2. Now export --best refuses, naming step 2, and
  rotation keeps it (with one warning) beside the best of the steps that read."""
  ckpt_dir = tmp_path / "run" / "checkpoints"
  with checkpoint.Checkpointer(ckpt_dir, save_every=100, keep=1, async_save=False,
                               best=("eval/accuracy", "max")) as ckpt:
    for step, v in ((1, 0.3), (2, 0.9), (3, 0.5), (4, 0.4)):
      ckpt.maybe_save(step, _state(step), {checkpoint.BEST: checkpoint.best_record("eval/accuracy", "max", v)},
                      force=True)
      ckpt.wait()
    assert _saved(ckpt_dir) == [2, 4]
    meta = ckpt_dir / "2" / "meta" / "metadata"
    meta.write_text(meta.read_text()[:10])
    with caplog.at_level(logging.WARNING, logger="absl"):
      for step in (5, 6):
        assert ckpt.maybe_save(step, _state(step), force=True)
        ckpt.wait()
    assert _saved(ckpt_dir) == [2, 4, 6]  # 4: the best of the steps that read, in case 2 was not
    assert sum("step 2" in r.getMessage() and "metadata does not read" in r.getMessage()
               for r in caplog.records) == 1
  with pytest.raises(errors.InputError, match=r"step\(s\) \[2\] .* metadata that does not read"):
    checkpoint.best_step(ckpt_dir)
  with pytest.raises(errors.InputError, match=r"step\(s\) \[2\].*--step"):
    export_lib.export(str(tmp_path / "run"), str(tmp_path / "out"), best=True)
  assert not os.path.exists(tmp_path / "out")


def test_bad_keep_best_settings_are_one_line():
  from grpo_jax.run import validate
  base = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  for over, match in (({"train.keep_best": "accuracy"}, "is not a held-out metric; name a key of the eval rows"),
                      ({"train.keep_best": "eval/accuracy", "train.keep_best_mode": "best"},
                       r"train.keep_best_mode: unknown value 'best'"),
                      ({"train.keep_best": "eval/accuracy", "job": "sft"}, "job=sft evaluates once")):
    c = base.copy_and_resolve_references()
    with c.unlocked():
      for k, v in over.items():
        node = c
        *parts, last = k.split(".")
        for p in parts:
          node = node[p]
        node[last] = v
    with pytest.raises(errors.ConfigError, match=match):
      validate.validate_keep_best(c)
  validate.validate_keep_best(base)  # off by default


def _config(**over):
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  c.model.update(hidden=32, layers=1, heads=2, kv_heads=1, inter=64)
  return config_lib.override(c, {
      "sft.steps": 0, "train.steps": 4, "train.ckpt_every": 100, "train.keep_checkpoints": 1,
      "train.eval_every": 1, "train.plot_every": 0, "train.sample_every": 0, "eval.size": 8, "eval.batch": 8,
      "eval.n_samples": 1, "eval.pass_k": (1,), "sampling.max_new_tokens": 8, "task.train_size": 64,
      "task.test_size": 16, "log.tensorboard": False, "log.plots": False, **over})


@pytest.fixture(scope="module")
def best_run(tmp_path_factory):
  """4 RL steps evaluated at every step with a scripted held-out accuracy (0.1 before training, then 0.3, 0.8, 0.2,
  0.5): the run keeps step 2 (best) and step 4 (newest)."""
  run_dir = str(tmp_path_factory.mktemp("keep_best") / "run")
  c = _config(**{"train.keep_best": "eval/accuracy"})
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    f.write(c.to_json())
  scripted = iter([0.1, 0.3, 0.8, 0.2, 0.5])
  real = evaluation.Evaluator.__call__

  def scored(self, params, rng):
    m, texts = real(self, params, rng)
    return {**m, "eval/accuracy": next(scripted)}, texts

  mp = pytest.MonkeyPatch()
  mp.setattr(evaluation.Evaluator, "__call__", scored)
  lines = []
  handler = logging.Handler()
  handler.emit = lambda record: lines.append(record.getMessage())
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.addHandler(handler)
  absl_logger.setLevel(logging.INFO)
  try:
    train.run_rl(c, run_dir)
  finally:
    mp.undo()
    absl_logger.removeHandler(handler)
    absl_logger.setLevel(level)
  return dict(run_dir=run_dir, config=c, log=[l for l in lines if "best kept" in l])


def test_the_best_evaluated_step_is_kept_and_exported(best_run, tmp_path):
  run_dir, c = best_run["run_dir"], best_run["config"]
  ckpt_dir = os.path.join(run_dir, "checkpoints")
  assert _saved(ckpt_dir) == [2, 4]
  # each line counts the save it follows, which may still be writing (it read 'none' after the first async save)
  assert best_run["log"] == ["step 1 eval/accuracy 0.3; best kept: step 1 (0.3)",
                             "step 2 eval/accuracy 0.8; best kept: step 2 (0.8)",
                             "step 3 eval/accuracy 0.2; best kept: step 2 (0.8)",
                             "step 4 eval/accuracy 0.5; best kept: step 2 (0.8)"], best_run["log"]
  rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  logged = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
  assert logged == {0: 0.1, 1: 0.3, 2: 0.8, 3: 0.2, 4: 0.5}
  for step in (2, 4):  # each evaluated save records the score logged at its step
    assert checkpoint.read_meta(ckpt_dir, step)[checkpoint.BEST] == {
        "metric": "eval/accuracy", "mode": "max", "value": logged[step]}
  out = str(tmp_path / "best")
  summary = export_lib.export(run_dir, out, best=True)
  assert summary["step"] == 2 and summary["best"].startswith("eval/accuracy 0.8")
  assert "exported step 2 (best held-out: eval/accuracy 0.8" in export_lib.describe(summary, out)
  from grpo_jax.hf import hf_io
  mcfg = model_lib.ModelConfig.from_config(c.model)
  want = params_ckpt.restore_params_only(ckpt_dir, jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])),
      model_lib.param_shapes(mcfg)), 2).params
  got = hf_io.load_params(out, mcfg)
  newest = export_lib.restore_params(run_dir, mcfg).params
  diff = 0.0
  for a, b, n in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(newest)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    diff = max(diff, float(np.abs(np.asarray(a) - np.asarray(n)).max()))
  assert diff > 0  # step 2's weights, not the newest step's
  with pytest.raises(config_lib.ConfigError, match="name two checkpoints"):
    export_lib.export(run_dir, str(tmp_path / "x"), best=True, step=4)


def test_a_run_without_keep_best_has_no_best_to_export(tmp_path):
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text(_config().to_json_best_effort())
  with pytest.raises(errors.InputError, match="records a finite held-out score.*keep_best=eval/accuracy"):
    export_lib.export(str(run), str(tmp_path / "out"), best=True)
  assert not os.path.exists(tmp_path / "out")


def test_a_metric_the_run_does_not_log_is_refused_before_training(tmp_path):
  run_dir = str(tmp_path / "run")
  c = _config(**{"train.keep_best": "eval/pass@64", "train.steps": 1})
  with pytest.raises(errors.ConfigError, match=r"keep_best='eval/pass@64' is not a held-out metric of this run; "
                                                r"it logs .*eval/accuracy"):
    train.run_rl(c, run_dir)
  assert _saved(os.path.join(run_dir, "checkpoints")) == []  # refused at step 0's evaluation: nothing trained



def test_a_metric_the_run_does_not_log_is_refused_on_resume_before_training(best_run, tmp_path):
  """train.keep_best may change on resume (bookkeeping); a name the run does not log was refused only at the next
  evaluation, after training up to eval_every steps that no checkpoint held (here: step 3 trained and logged, then
  the refusal at its evaluation). Now the resume checks it against the run's own logged held-out keys first."""
  import shutil
  run_dir = str(tmp_path / "run")
  shutil.copytree(best_run["run_dir"], run_dir)
  shutil.rmtree(os.path.join(run_dir, "checkpoints", "4"))  # resumes from step 2
  c = _config(**{"train.keep_best": "eval/pass@64"})
  with pytest.raises(errors.ConfigError, match=r"keep_best='eval/pass@64' is not a held-out metric of this run; "
                                                r"it logs .*eval/accuracy, eval/accuracy_sampled"):
    train.run_rl(c, run_dir)
  rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  assert max(r["step"] for r in rows) == 2, [r["step"] for r in rows]  # nothing trained after the resume
  assert _saved(os.path.join(run_dir, "checkpoints")) == [2]


def test_a_run_stopped_between_evaluations_keeps_its_best_on_resume(tmp_path):
  """eval_every=2, ckpt_every=1, keep_checkpoints=1, scripted held-out accuracy by step (0.1 before training, 0.8 at
  step 2, 0.5 at step 4): a SIGTERM after step 3 (between evaluations) saves step 3 beside the best step 2; the
  resumed process keeps step 2 (recorded by the first process) and ends as the uninterrupted run would: steps [2, 4],
  best step 2, each evaluation logged once, step 2's checkpoint untouched. (Probed bit-identical to an uninterrupted
  run, every leaf and row, on 2026-12-06.)"""
  from grpo_jax.infra import signals
  c = _config(**{"train.keep_best": "eval/accuracy", "train.eval_every": 2, "train.ckpt_every": 1})
  score = {0: 0.1, 2: 0.8, 4: 0.5}
  real_call, real_steps = evaluation.Evaluator.__call__, train._steps  # pylint: disable=protected-access
  run_dir = str(tmp_path / "run")
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    f.write(c.to_json())
  ckpt_dir = os.path.join(run_dir, "checkpoints")

  def run(stop_after=None):
    done = [0]

    def steps(guard, mesh, batches, start, n):
      done[0] = start
      for item in real_steps(guard, mesh, batches, start, n):
        if item[0] == stop_after:  # step stop_after + 1 runs, then the loop stops
          signals.active().request()
        done[0] = item[0] + 1  # the step this item trains: its evaluation follows it
        yield item

    def scored(self, params, rng):
      m, texts = real_call(self, params, rng)
      return {**m, "eval/accuracy": score[done[0]]}, texts

    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(evaluation.Evaluator, "__call__", scored)
      mp.setattr(train, "_steps", steps)
      train.run_rl(c, run_dir)

  def files(step):
    root = os.path.join(ckpt_dir, str(step))
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(root) for n in names}

  with signals.GracefulStop(), pytest.raises(errors.Preempted, match="after step 3"):
    run(stop_after=2)
  assert _saved(ckpt_dir) == [2, 3]
  kept = files(2)
  run()
  assert _saved(ckpt_dir) == [2, 4]
  assert checkpoint.best_step(ckpt_dir) == (2, {"metric": "eval/accuracy", "mode": "max", "value": 0.8})
  assert files(2) == kept
  rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  assert [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r] == [(0, 0.1), (2, 0.8), (4, 0.5)]
  steps = [r["step"] for r in rows if "train/loss" in r]
  assert steps == sorted(set(steps)) and steps[-1] == 4, steps
