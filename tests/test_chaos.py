"""The chaos harness (benchmarks/chaos.py) in the suite: a short seeded schedule (SIGTERM then SIGINT 0.1 s later
inside a step; SIGHUP inside an evaluation, then the newest checkpoint truncated; SIGKILL at a random moment) runs
real `python -m grpo_jax.main` processes, each resuming the last one's work, and ends bit-identical to an
uninterrupted run: every state leaf, metrics row (perf/* aside) and sample row. The harness checks each exit against
docs/reliability.md's promises: exit 0 after a signal with `Preempted:`, its `received` warning (`received again`
for the second signal) and no torn save left; SIGKILL's -9; the damaged step moved to checkpoints/corrupt/. (A full
disk is in the long schedule; tests/test_input_errors.py fails a CLI write through a file-size limit.) The same
harness reports the differences of a planted resume bug. And an export of a run whose newest checkpoint is damaged
names (and writes) the step it really read.

The long schedule (36 faults over every scenario) is an on-demand command: docs/reliability.md.
"""
import dataclasses
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import chaos  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The grpo scenario at 6 steps (checkpoints 2, 4, 6; evaluations at 0, 3, 6): every process costs a start (~5 s).
SCENARIO = dataclasses.replace(
    chaos.SCENARIOS["grpo"], name="grpo6", what="GRPO, 6 steps: steps, evaluations, saves",
    argv=chaos.GRPO + ("--config.train.steps=6", "--config.train.eval_every=3", "--config.train.sample_every=3"),
    moments=(chaos.ANYTIME, chaos.STEP, dataclasses.replace(chaos.EVAL, line=r"^step 3/6 .*reward_mean="),
             chaos.SAVE))
# Seed 8 of these actions: SIGTERM+SIGINT in a step, SIGHUP in an eval (its stop saves step 3 beside step 2, so the
# truncated newest has an older step to fall back to), SIGKILL at a random time.
SEED, ACTIONS = 8, ("SIGKILL", "SIGHUP", "SIGTERM+SIGINT")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  return chaos.child_env(str(tmp_path_factory.mktemp("xla_cache")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
  ref = chaos.reference(SCENARIO, str(tmp_path_factory.mktemp("chaos") / "reference"), env)
  # every step of the run the resumes are compared with trains on a real gradient (chaos.GRPO's `random` reward
  # term: groups with reward variance), so equal state after a resume means equal training, not untouched params
  gn = [r["train/grad_norm"] for r in chaos._jsonl(os.path.join(ref, "metrics.jsonl"), True) if "train/grad_norm" in r]
  assert len(gn) == 6 and min(gn) > 1e-3, gn
  return ref


def _schedule():
  return [dataclasses.replace(f, scenario=SCENARIO.name)
          for f in chaos.schedule(SEED, 3, ("grpo",), ACTIONS, damage_every=3)]


def _run(faults, reference, env, tmp_path, plant=""):
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(chaos.SCENARIOS, SCENARIO.name, SCENARIO)
    lines = []
    report = chaos.run_schedule(faults, str(tmp_path), plant=plant, references={SCENARIO.name: reference},
                                log=lines.append, use_tmpfs=False)
  print("\n".join(lines))
  return report, "\n".join(lines)


def test_schedule_is_seeded_and_covers_what_it_is_given():
  a = chaos.schedule(0, 36)
  assert a == chaos.schedule(0, 36) and a != chaos.schedule(1, 36)
  assert {f.action for f in a} == set(chaos.ACTIONS) and {f.scenario for f in a} == set(chaos.SCENARIOS)
  assert {f.damage for f in a} - {""} == set(chaos.DAMAGES) and sum(bool(f.damage) for f in a) == 12
  for name, sc in chaos.SCENARIOS.items():  # every moment kind of every scenario is drawn
    assert {f.moment for f in a if f.scenario == name} == {m.kind for m in sc.moments}, name
  assert [(f.action, f.moment, f.damage) for f in _schedule()] == [
      ("SIGTERM+SIGINT", "step", ""), ("SIGHUP", "eval", "truncate"), ("SIGKILL", "time", "")]


def test_short_schedule_ends_bit_identical(reference, env, tmp_path):
  faults = _schedule()
  report, log = _run(faults, reference, env, tmp_path)
  assert report.ok, f"{report.problems}\n{report.differences}\n{log}"
  assert report.landed == len(faults), log
  counts = {k: sum(c.get(k, 0) for c in report.compared.values()) for k in ("state/params leaves", "metrics rows")}
  assert counts["state/params leaves"] >= 60 and counts["metrics rows"] >= 7, report.compared
  assert len(report.damages) == 1 and "truncated" in report.damages[0], report.damages  # then set aside: report.ok


def test_a_planted_resume_bug_is_reported(reference, env, tmp_path):
  """The harness must fail when a resume is wrong: a resume that skips one data batch (and one whose rng is not the
  saved one: benchmarks/chaos.py --plant=rng) differs in the states, the metrics rows and the samples."""
  fault = chaos.Fault(SCENARIO.name, "SIGTERM", "save", 1, 0.0)
  report, log = _run([fault], reference, env, tmp_path, plant="skip_batch")
  diffs = [d for ds in report.differences.values() for d in ds]
  assert not report.ok and report.landed == 1, log
  assert any(d.startswith("metrics.jsonl:") for d in diffs) and any("leaves differ" in d for d in diffs), diffs


# ----------------------------------------------------------------------------- labels after a fallback: export
def _damaged_copy(reference, tmp_path, kind):
  """A copy of the finished reference run whose newest checkpoint (step 6 of 2, 4, 6) is damaged `kind`-wise."""
  run = str(tmp_path / f"run_{kind}")
  shutil.copytree(reference, run)
  assert chaos.committed_steps(os.path.join(run, "checkpoints")) == [2, 4, 6]
  done = chaos.damage(run, kind, random.Random(0), set(), live_only=False)
  assert done.startswith("checkpoints/6:"), done
  return run


@pytest.mark.parametrize("kind", chaos.DAMAGES)
def test_export_after_a_fallback_names_and_writes_the_step_it_read(reference, tmp_path, kind):
  """The newest checkpoint damaged each way: the export falls back, its summary says the older step and why, and
  the written weights are that step's (not the damaged newest's, which the uninterrupted run shows differ)."""
  import jax
  from grpo_jax.hf import export, hf_io
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  run = _damaged_copy(reference, tmp_path, kind)
  out = str(tmp_path / "out")
  summary = export.export(run, out)
  assert summary["step"] == 4 and summary["source"].startswith(os.path.join(run, "checkpoints", "4")), summary
  assert "step 6 unusable" in summary["source"] and "exported step 4 from" in export.describe(summary, out)
  mcfg = model_lib.ModelConfig.from_config(export.run_config(run).model)
  host = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=host),
                          model_lib.param_shapes(mcfg))
  ref = os.path.join(reference, "checkpoints")
  step4, step6 = (params_ckpt.restore_params_only(ref, abstract, s).params for s in (4, 6))
  for a, b in zip(jax.tree.leaves(hf_io.load_params(out, mcfg)), jax.tree.leaves(step4)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(not np.array_equal(np.asarray(b), np.asarray(c)) for b, c in
             zip(jax.tree.leaves(step4), jax.tree.leaves(step6)))


def test_export_cli_on_a_truncated_checkpoint_is_quiet_and_says_the_step(reference, tmp_path):
  """The CLI: a truncated data file in the newest step used to print orbax's 67-line traceback and 'step 6'."""
  run = _damaged_copy(reference, tmp_path, "truncate")
  r = subprocess.run([sys.executable, "-m", "grpo_jax.export", run, str(tmp_path / "out")], capture_output=True,
                     text=True, cwd=REPO, timeout=300, env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr[-3000:]
  assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 4, r.stderr
  assert "exported step 4 from " in r.stdout and "step 6 unusable" in r.stdout, r.stdout
