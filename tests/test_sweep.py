"""Sweeps: 2 β × 2 lr × 2 seeds in ONE vmapped program, killed and resumed, equal 8 separate runs of `main`'s step;
shape axes run serially; a point's directory resumes with `main`; --mode=print writes launch commands that the
launcher accepts.

Runs are real (sweep.run, jobs.run = python -m grpo_jax.main's path) on a tiny arith config. The reward is a test
term (the fraction of even token ids in a completion) so that a random policy's rewards vary and every run's
updates are non-zero. The module's runs share the suite's XLA compilation cache (tests/conftest.py: the resumed sweep
and `main`'s continuation reuse compiled programs); per-run plots are off (log.plots=False: not under test).
"""
import csv
import json
import os
import shutil
import signal
import shlex
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest


from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.run import evaluation
from grpo_jax.rl import families
from grpo_jax.config import sweep_points
from grpo_jax.run import jobs
from grpo_jax.run import metrics as metrics_lib
from grpo_jax.model import model as model_lib
from grpo_jax.rl import rewards
from grpo_jax.rl import reward_spec
from grpo_jax.infra import sharding
from grpo_jax.studies import sweep
from grpo_jax.studies import sweep_vmap
from grpo_jax.run import train
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# β = 0.04 is _config()'s own: the grid's reference step for it is the program test_one_run_and_a_group_of_one's
# `main` run builds (lr lives in the optimizer state), which then loads it from the session's compilation cache
SWEEP = "rl.beta=0.04,0.5 optim.lr=1e-2,3e-2"
TINY = {"model.hidden": 32, "model.layers": 1, "model.heads": 2, "model.kv_heads": 1, "model.inter": 64,
        "model.max_len": 64, "sft.steps": 0, "rl.G": 4, "rl.prompts_per_step": 2, "sampling.max_new_tokens": 8,
        "train.steps": 3, "train.eval_every": 3, "train.ckpt_every": 10, "train.plot_every": 0,
        "train.sample_every": 0, "eval.size": 4, "eval.batch": 4, "eval.n_samples": 2, "eval.pass_k": (1, 2),
        "log.tensorboard": False, "log.plots": False, "rewards": (("even", 1.0),)}
# vmapped vs separate programs: XLA fuses and orders reductions differently, fp32 (seeds.py's own test: 1e-5).
RTOL, ATOL = 1e-4, 1e-5
P_ATOL = 1e-4  # params: 1% of one Adam step at the smallest lr (Adam turns a rounding-level gradient into ±lr)


def _even_fraction(tokens_NxL, mask_NxL, batch, ctx):
  m = mask_NxL.astype(jnp.float32)
  return reward_spec.outcome(jnp.sum((tokens_NxL % 2 == 0) * m, -1) / jnp.maximum(m.sum(-1), 1.0))


def _config():
  from configs import grpo_arith  # pylint: disable=g-import-not-at-top
  return config_lib.override(grpo_arith.get_config("small"), TINY)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(rewards.REGISTRY, "even", lambda ctx: _even_fraction)
    yield tmp_path_factory.mktemp("sweep")


def _params(workdir):
  ck = os.path.join(workdir, "checkpoints")
  step = max(int(d) for d in os.listdir(ck) if d.isdigit())
  restored = ocp.StandardCheckpointer().restore(os.path.join(ck, str(step), ckpt_lib.STATE))
  return step, jax.tree.leaves(restored["params"])


def _rows(workdir):
  return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in metrics_lib.read_metrics(workdir)]


def _exact_rows(workdir):
  """_rows for ==: a NaN (an empty length split) as the string 'nan', which compares equal to itself."""
  return [{k: "nan" if isinstance(v, float) and v != v else v for k, v in r.items()} for r in _rows(workdir)]


def _reference_runs(runs):
  """The same runs one by one as `main` trains them: train.run_rl's step (families.make_step), init
  (family.init: params and rollout rng from run_seed), batches (config.seed) and evaluator, without the loop's
  bookkeeping. One jitted step per β (lr lives in the optimizer state), reused across lr and seeds."""
  c0 = runs[0].config
  tokenizer = tok_lib.for_config(c0)
  mesh = sharding.make_mesh(c0.mesh)
  mcfg = model_lib.ModelConfig.from_config(c0.model)
  family = families.for_config(c0)
  spec = rewards.build(c0.rewards, reward_spec.Context(c0.task.name, tokenizer), {}, None, c0.rl.reward_timeout_s)
  evaluator = evaluation.Evaluator(c0, mcfg, tokenizer, mesh,
                                   data_lib.eval_set(c0.task, tokenizer, c0.eval.size, c0.task.prompt_len))
  steps, out = {}, {}
  for r in runs:
    c = r.config
    if c.rl.beta not in steps:
      steps[c.rl.beta] = families.make_step(c, mesh, mcfg, spec, tokenizer, family=family)
    state = family.init(c, mesh, mcfg)
    batches = data_lib.rl_batches(c.task, tokenizer, "train", c.rl.prompts_per_step, c.seed, 0, c.task.prompt_len)
    rows = []
    for _ in range(c.train.steps):
      state, m = steps[c.rl.beta](state, train.device_batch(mesh, next(batches)))
      rows.append(train._host_scalars(m))  # pylint: disable=protected-access
    ev, _ = evaluator(state["params"], jax.random.PRNGKey(c.seed + 1))
    out[r.name] = (jax.tree.leaves(jax.device_get(state["params"])), rows, ev)
  assert len(steps) == 2
  return out


@pytest.fixture(scope="module")
def grid(env):
  """The 8-run sweep, vmapped, SIGTERMed after its first step and rerun (it resumes all 8 from their checkpoints),
  and the same 8 runs one by one (_reference_runs); per sweep invocation, how often a run's state was sliced out of
  the stacked one (vmapped_runs.run_state) and how often the slicing program was traced."""
  from jax import monitoring  # pylint: disable=g-import-not-at-top
  from grpo_jax.studies import vmapped_runs  # pylint: disable=g-import-not-at-top
  c = _config()
  wd = str(env / "grid")
  real_write, killed = metrics_lib.MetricWriter.write, []
  real_run_state, slices = vmapped_runs.run_state, {"sliced": [], "traced": []}

  def write(self, step, scalars):
    real_write(self, step, scalars)
    if step == 1 and "train/loss" in scalars and not killed:
      killed.append(self.workdir)
      os.kill(os.getpid(), signal.SIGTERM)

  def run_state(states, i):
    slices["sliced"][-1] += 1
    return real_run_state(states, i)

  def traced(event, secs, **kw):  # a program JAX traces again is compiled again
    del secs
    if event.endswith("jaxpr_trace_duration") and kw.get("fun_name") == "_take":
      slices["traced"][-1] += 1

  def counted_sweep():
    slices["sliced"].append(0)
    slices["traced"].append(0)
    return sweep.run(c, wd, sweep_text=SWEEP, seeds=2, mode="vmap", log=lambda _: None)

  monitoring.register_event_duration_secs_listener(traced)
  try:
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(vmapped_runs, "run_state", run_state)
      with pytest.MonkeyPatch.context() as mp_write:
        mp_write.setattr(metrics_lib.MetricWriter, "write", write)
        with pytest.raises(errors.Preempted):
          counted_sweep()
      assert len(killed) == 1
      saved = {r: _params(os.path.join(wd, r))[0] for r in os.listdir(wd) if r.startswith("beta=")}
      out = counted_sweep()
  finally:
    monitoring.unregister_event_duration_listener(traced)
  return c, out, saved, _reference_runs(out["runs"]), slices


def test_grid_is_one_program_and_equals_separate_runs(grid):
  """A killed and resumed 2 β × 2 lr × 2 seed sweep: ONE compiled program for the 8 runs, every run stopped and
  saved at the same step, and final params and every metric equal to the runs trained one by one. Each run's state
  is sliced out of the group's only to evaluate or save it (it was sliced at every step and at the end, saved or
  not: 24 and 32 slices), and the initial state is placed as the steps leave theirs, so its step-0 evaluation and
  the stop's save slice with one program (it was traced for each layout, and each evaluation program with it)."""
  _, out, saved, ref, slices = grid
  runs = out["runs"]
  assert [r.name for r in runs] == [f"beta={b},lr={lr},seed={s}" for b in ("0.04", "0.5")
                                    for lr in ("0.01", "0.03") for s in (0, 1)]
  assert saved == {r.name: 1 for r in runs}  # the SIGTERM: every run saved after step 1
  assert len(out["groups"]) == 1 and out["groups"][0]["mode"] == "vmap"
  assert out["groups"][0]["runs"] == [r.name for r in runs] and out["groups"][0]["traces"] == [1]
  # killed: evaluated at step 0 and saved by the stop after step 1; resumed at 1: evaluated and saved at step 3
  assert slices["sliced"] == [8 + 8, 8 + 8] and slices["traced"][0] <= 1, slices
  finals = {}
  for r in runs:
    step, vp = _params(r.workdir)
    sp, srows, sev = ref[r.name]
    assert step == 3
    for a, b in zip(vp, sp):
      np.testing.assert_allclose(a, b, rtol=RTOL, atol=P_ATOL, err_msg=r.name)
    rows = _rows(r.workdir)
    train_rows = [x for x in rows if "train/loss" in x]
    assert [x["step"] for x in train_rows] == [1, 2, 3]
    for x, y in zip(train_rows, srows):
      keys = [k for k in x if k.startswith("train/")]  # a row of read_metrics also holds that step's eval
      assert len(keys) > 10 and set(keys) <= set(y), set(keys) - set(y)
      for k in keys:
        np.testing.assert_allclose(x[k], y[k], rtol=RTOL, atol=ATOL, err_msg=f"{r.name} {k} step {x['step']}")
    last_eval = [x for x in rows if "eval/accuracy" in x][-1]
    assert last_eval["step"] == 3
    for k, v in sev.items():
      np.testing.assert_allclose(last_eval[k], v, rtol=RTOL, atol=ATOL, err_msg=f"{r.name} {k}")
    finals[r.name] = vp[0]
    assert any(x["train/adv_std"] > 0 for x in train_rows) and any(x["train/kl"] > 0 for x in train_rows)
  # The axes really change the runs: seeds (init), lr and β give 8 different final params.
  flat = [v.ravel() for v in finals.values()]
  assert all(not np.allclose(flat[i], flat[j]) for i in range(8) for j in range(i))


def test_point_resumes_with_main_and_refuses_a_different_config(grid, tmp_path):
  """A point's directory is a `main` run directory: `main` restores its checkpoint (the sweep wrote it) and trains
  on; a different config is refused with run_config's diff, one line, before anything runs."""
  _, out, _, _, _ = grid
  r = out["runs"][5]
  d = str(tmp_path / r.name)
  shutil.copytree(r.workdir, d)
  more = config_lib.override(r.config, {"train.steps": 4, "train.allow_config_change": "train.steps"})
  jobs.run(more, d)
  assert _params(d)[0] == 4 and [x["step"] for x in _rows(d) if "train/loss" in x] == [1, 2, 3, 4]
  with pytest.raises(errors.InputError, match="rl.beta") as e:
    jobs.run(config_lib.override(r.config, {"rl.beta": 0.3}), r.workdir)
  assert "\n" not in str(e.value)


def test_rerun_skips_finished_runs_and_writes_the_report(grid):
  c, out, _, _, _ = grid
  wd = os.path.dirname(out["runs"][0].workdir)
  stamps = {r.name: os.path.getmtime(os.path.join(r.workdir, "metrics.jsonl")) for r in out["runs"]}
  logs = []
  again = sweep.run(c, wd, sweep_text=SWEEP, seeds=2, mode="vmap", log=logs.append)
  assert again["groups"] == [] and sum("skipped" in l for l in logs) == 8
  assert stamps == {r.name: os.path.getmtime(os.path.join(r.workdir, "metrics.jsonl")) for r in out["runs"]}
  with open(os.path.join(wd, "sweep.csv"), newline="") as f:
    rows = list(csv.reader(f))
  assert rows[0][:4] == ["point", "rl.beta", "optim.lr", "metric"]
  acc = {(r[0], r[3]): r for r in rows[1:]}
  point = "beta=0.5,lr=0.03"
  vals = [[x for x in _rows(os.path.join(wd, f"{point},seed={s}")) if "train/reward_mean" in x][-1]["train/reward_mean"]
          for s in (0, 1)]
  got = acc[(point, "train/reward_mean@tail")]  # @tail over 3 rows = the last row
  assert int(got[4]) == 2 and float(got[5]) == pytest.approx(np.mean(vals))
  assert float(got[6]) == pytest.approx(np.std(vals, ddof=1))
  md = open(os.path.join(wd, "sweep.md")).read()
  assert "| point | eval/accuracy | train/reward_mean@tail |" in md and "n = 2 seeds" in md
  assert os.path.exists(os.path.join(wd, "plots", "train_reward_mean.png"))
  # A different config on the same sweep directory: refused before anything runs, naming the run and the key.
  with pytest.raises(errors.InputError, match=r"beta=0.04,lr=0.01,seed=0.*rl.G"):
    sweep.run(config_lib.override(c, {"rl.G": 2}), wd, sweep_text=SWEEP, seeds=2, mode="vmap", log=lambda _: None)


def test_shape_axes_and_beta_zero_run_serially():
  """G changes shapes and β = 0 drops the reference from the update (a different program): separate groups;
  lr, β > 0, temperature, clip ε and reward weights share one program."""
  c = _config()
  same = sweep.make_runs(c, sweep_points.product([sweep_points.sweep("optim.lr", [1e-3, 2e-3]), sweep_points.sweep("rl.beta", [0.1, 0.2]),
                                           sweep_points.sweep("sampling.temperature", [0.7, 1.0]),
                                           sweep_points.sweep("rl.eps_high", [0.2, 0.28])]), 2, "/tmp/x")
  assert len(sweep.groups(same)) == 1 and sweep.decide(same, "auto", 1) == "vmap"
  runs = sweep.make_runs(c, sweep_points.parse("rl.G=2,4 rl.beta=0,0.04", c), 2, "/tmp/x")
  gs = sweep.groups(runs)
  assert [[r.name for r in g] for g in gs] == [[f"G={g},beta={b},seed={s}" for s in (0, 1)]
                                               for g in (2, 4) for b in (0, 0.04)]
  assert all(sweep.decide(g, "serial", 1) == "serial" for g in gs)
  assert sweep.decide(gs[0], "auto", 8) == "serial"  # several devices: each run uses them all, one after another
  one = sweep.make_runs(c, sweep_points.parse("rl.G=2,4", c), 1, "/tmp/x")
  assert [sweep.decide(g, "auto", 1) for g in sweep.groups(one)] == ["serial", "serial"]
  # LoRA with an SFT stage: every run freezes its own SFT'd base, a vmapped group shares one: serial in auto,
  # refused (one line) in vmap; with one train.init_from they share it
  lora = sweep.make_runs(config_lib.override(c, {"model.lora.rank": 4, "sft.steps": 2}), sweep_points.base(), 2, "/tmp/x")
  assert len(sweep.groups(lora)) == 1 and sweep.decide(lora, "auto", 1) == "serial"
  with pytest.raises(errors.ConfigError, match="own frozen base") as e:
    sweep.decide(lora, "vmap", 1)
  assert "\n" not in str(e.value)
  # ... and without an SFT stage, a random init per run_seed (--seeds): serial too; one run_seed (an lr axis) shares
  seeds = sweep.make_runs(config_lib.override(c, {"model.lora.rank": 4, "sft.steps": 0}), sweep_points.base(), 2, "/tmp/x")
  assert sweep.decide(seeds, "auto", 1) == "serial"
  lrs = sweep.make_runs(config_lib.override(c, {"model.lora.rank": 4, "sft.steps": 0}),
                        sweep_points.parse("optim.lr=1e-3,2e-3", c), 1, "/tmp/x")
  assert sweep.decide(lrs, "auto", 1) == "vmap"
  shared = sweep.make_runs(config_lib.override(c, {"model.lora.rank": 4, "sft.steps": 2, "train.init_from": "/p"}),
                           sweep_points.base(), 2, "/tmp/x")
  assert sweep.decide(shared, "auto", 1) == "vmap"


def test_sweep_text_is_typed_and_bad_input_is_one_line():
  c = _config()
  pts = sweep_points.parse("rl.beta=0,1e-2 train.steps=5 rl.dynamic_sampling=true", c)
  assert [p.dict for p in pts] == [{"rl.beta": 0.0, "train.steps": 5, "rl.dynamic_sampling": True},
                                   {"rl.beta": 0.01, "train.steps": 5, "rl.dynamic_sampling": True}]
  assert all(type(p.dict["rl.beta"]) is float for p in pts)
  for text, msg in [("rl.beta=abc", "not a float"), ("rl.betta=0.1", "betta"), ("rl.beta", "key=v1,v2"),
                    ("rl.beta=0.1,", "empty value"), ("rewards=a", "get_sweep"), ("algo=nope", "nope")]:
    with pytest.raises(errors.ConfigError, match=msg) as e:
      sweep_points.parse(text, c)
    assert "\n" not in str(e.value)
  with pytest.raises(errors.ConfigError, match="share the directory"):
    sweep.make_runs(c, sweep_points.named("a b", {}) + sweep_points.named("a_b", {}), 1, "/tmp/x")
  # Distinct values that %g writes alike were refused as sharing a directory ("give them distinct values": they
  # were); that key's values are then written exactly, the others stay short. Equal values stay refused.
  runs = sweep.make_runs(c, sweep_points.parse("optim.lr=1e-6,1.0000001e-6 rl.beta=0.1", c), 1, "/tmp/x")
  assert [r.name for r in runs] == ["lr=1e-06,beta=0.1", "lr=1.0000001e-06,beta=0.1"]
  assert [r.config.optim.lr for r in runs] == [1e-6, 1.0000001e-6]
  assert sweep_points.names(sweep_points.sweep("rewards", [(("a", 0.5),), (("a", 0.50000001),)])) == [
      "rewards=a:0.5", "rewards=a:0.50000001"]
  with pytest.raises(errors.ConfigError, match="share the directory"):
    sweep.make_runs(c, sweep_points.parse("rl.beta=0.1,0.10", c), 1, "/tmp/x")
  with pytest.raises(errors.ConfigError, match="share the directory"):  # one directory on macOS's file system
    sweep.make_runs(c, sweep_points.named("Big", {}) + sweep_points.named("big", {}), 1, "/tmp/x")
  # a run directory named as one of the sweep's own files (its report's plots/, sweep.md, the lock) was written over
  # by the report or stopped the sweep midway
  for name in ("plots", "Sweep.md", "run.lock", "r1_seeds_a.json"):
    with pytest.raises(errors.ConfigError, match="the sweep's own"):
      sweep.make_runs(c, sweep_points.named(name, {}), 1, "/tmp/x")
  # --metrics: a bad aggregate or no metric is a one-line config error (exit 2), not a traceback
  for m, msg in [("train/loss@median", "@median"), ("@tail", "names no metric")]:
    with pytest.raises(errors.ConfigError, match=msg) as e:
      sweep.run(c, "/tmp/x_never_written", sweep_text="rl.beta=0.1", metrics=[m], log=lambda _: None)
    assert "\n" not in str(e.value) and not os.path.exists("/tmp/x_never_written")


def test_sweep_grammar_edge_cases():
  """A key in two axes, zip's lengths, product's order, one point, names of keys sharing a last component."""
  c = _config()
  h = sweep_points
  for text in ("rl.beta=0.1 rl.beta=0.2", "rl.beta=0.1 optim.lr=0.1 rl.beta=0.3"):
    with pytest.raises(errors.ConfigError, match="'rl.beta' is set by two axes"):
      h.parse(text, c)
  with pytest.raises(errors.ConfigError, match=r"\[1, 2\] points"):
    h.zip([h.sweep("rl.beta", [0.1, 0.2]), h.sweep("optim.lr", [1e-3])])
  with pytest.raises(errors.ConfigError, match="two axes"):
    h.zip([h.sweep("rl.beta", [0.1]), h.named("x", {"rl.beta": 0.2})])
  zipped = h.zip([h.sweep("rl.beta", [0.1, 0.2]), h.sweep("optim.lr", [1e-3, 2e-3])])
  assert [p.dict for p in zipped] == [{"rl.beta": 0.1, "optim.lr": 1e-3}, {"rl.beta": 0.2, "optim.lr": 2e-3}]
  grid = h.parse("rl.beta=0,0.1 optim.lr=1e-3,2e-3", c)  # the last axis varies fastest
  assert h.names(grid) == ["beta=0,lr=0.001", "beta=0,lr=0.002", "beta=0.1,lr=0.001", "beta=0.1,lr=0.002"]
  one = sweep.make_runs(c, h.parse("rl.beta=0.1", c), 1, "/tmp/x")
  assert [(r.name, r.point, r.seed, r.config.rl.beta) for r in one] == [("beta=0.1", "beta=0.1", None, 0.1)]
  assert h.names(h.product([h.sweep("rl.beta", [0.1]), h.sweep("optim.beta", [0.2])])) == [
      "rl.beta=0.1,optim.beta=0.2"]  # a shared last component is written in full
  assert [r.name for r in sweep.make_runs(c, h.base(), 2, "/tmp/x")] == ["seed=0", "seed=1"]


@pytest.mark.parametrize("mode", ["report", "print"])
def test_a_workdir_that_is_a_file_is_one_line_in_every_mode(mode, tmp_path):
  """report and print write into --workdir too: a file there was a NotADirectoryError traceback (exit 1)."""
  (tmp_path / "f").write_text("mine")
  with pytest.raises(errors.InputError, match="is a file, not a directory"):
    sweep.run(_config(), str(tmp_path / "f"), sweep_text="rl.beta=0.1", mode=mode, log=lambda _: None)
  assert (tmp_path / "f").read_text() == "mine"


def test_a_point_with_a_refused_value_fails_before_anything_is_written(tmp_path, capsys):
  """A point whose value validation refuses (its SFT stage's batch 0, valid as sweep text): one line naming the run
  and the key; not the sweep directory, sweep.json or any run directory is written (every point is preflighted
  before the sweep writes)."""
  c = config_lib.override(_config_small(), {"sft.steps": 2})
  with pytest.raises(errors.ConfigError) as e:
    sweep.run(c, str(tmp_path / "sw"), sweep_text="sft.batch=4,0", log=lambda s: None)
  assert "sweep run batch=0: config.sft.batch" in str(e.value), str(e.value)
  assert not os.path.exists(tmp_path / "sw")
  # two bad runs: each its own line, then one error (the first alone was reported)
  with pytest.raises(errors.ConfigError, match=r"^2 of the 3 sweep runs have bad inputs .* the first: sweep run "
                                               "batch=0: config.sft.batch"):
    sweep.run(c, str(tmp_path / "sw"), sweep_text="sft.batch=4,0,-1", log=lambda s: None)
  err = capsys.readouterr().err
  assert "sweep run batch=0: config.sft.batch" in err and "sweep run batch=-1: config.sft.batch" in err, err
  assert not os.path.exists(tmp_path / "sw")
  # --mode=vmap for runs that cannot share a program (job=sft): refused before the lock and sweep.json are written
  with pytest.raises(errors.ConfigError, match="--mode=vmap") as e:
    sweep.run(config_lib.override(c, {"job": "sft"}), str(tmp_path / "sw"), seeds=2, mode="vmap", log=lambda s: None)
  assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "sw")


def test_get_sweep_in_the_config_file(tmp_path):
  path = tmp_path / "exp.py"
  path.write_text("from configs import grpo_arith\n"
                  "def get_config(arg=None):\n  return grpo_arith.get_config('small')\n"
                  "def get_sweep(h):\n"
                  "  return h.product([h.sweep('algo', ['grpo', 'dr_grpo']), h.sweep('optim.lr', [1e-4, 3e-4])])"
                  " + h.named('baseline', {'rl.G': 8})\n")
  c = _config()
  pts = sweep.load_points(str(path), c)
  assert sweep_points.names(pts) == ["algo=grpo,lr=0.0001", "algo=grpo,lr=0.0003", "algo=dr_grpo,lr=0.0001",
                              "algo=dr_grpo,lr=0.0003", "baseline"]
  runs = sweep.make_runs(c, pts, 1, "/tmp/x")
  assert runs[2].config.rl.preset == "dr_grpo" and runs[2].config.rl.beta == 0.0 and runs[2].config.optim.lr == 1e-4
  assert runs[4].config.rl.G == 8 and runs[4].config.rl.preset == c.rl.preset
  # configs/grpo_arith.py: the config alone by default (the README's 3-seed command), its β × lr grid on request.
  assert [p.dict for p in sweep.load_points(os.path.join(REPO, "configs/grpo_arith.py"), c)] == [{}]
  grid = sweep.load_points(os.path.join(REPO, "configs/grpo_arith.py:small,grid=True"), c)
  assert len(grid) == 9 and grid[4].dict == {"rl.beta": 0.04, "optim.lr": 1e-4}
  assert len(sweep.groups(sweep.make_runs(c, grid, 3, "/tmp/x"))) == 1  # one vmapped program for 27 runs
  # get_sweep returning one point (not a list of them), or nothing: one config-error line, not a TypeError
  for body in ("h.sweep('rl.beta', [0.1])[0]", "[]", "None"):
    path.write_text(f"def get_sweep(h):\n  return {body}\n")
    with pytest.raises(errors.ConfigError, match="non-empty list of points"):
      sweep.load_points(str(path), c)


def test_print_mode_writes_launch_commands_the_launcher_accepts(env):
  c = _config()
  # an object-store DIR: its runs would write their records into a local directory gs:/... (preflight.check_workdir)
  with pytest.raises(errors.InputError, match=r"^--workdir=gs://bucket/sweeps/s1: an object-store workdir is not"):
    sweep.run(c, "gs://bucket/sweeps/s1", config_file="configs/grpo_arith.py:small", sweep_text="rl.beta=0.02,0.04",
              mode="print")
  wd = str(env / "pod")  # a path every host mounts
  launch = "launch/tpu_vm.sh --name sweep-{i} --zone us-central2-b --accelerator v4-32 --dry-run"
  out = sweep.run(c, wd, config_file="configs/grpo_arith.py:small", sweep_text="rl.beta=0.02,0.04", seeds=2,
                  mode="print", launch=launch, base_overrides={"train.steps": 7})
  cmds = out["report"].splitlines()
  assert len(cmds) == 4
  for i, (cmd, r) in enumerate(zip(cmds, out["runs"])):
    res = subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    train = [l for l in res.stdout.splitlines() if "grpo_jax.main" in l]
    assert len(train) == 1 and f"create sweep-{i} " in res.stdout
    # the hosts' shell reads the --command (the launcher quotes each path and argument for it: launch/README.md)
    remote = next(a for a in shlex.split(train[0].removeprefix("+ ")) if a.startswith("--command="))
    argv = shlex.split(remote.removeprefix("--command="))
    for part in (f"--workdir={wd}/{r.name}", "--config.train.steps=7", f"--config.rl.beta={r.config.rl.beta!r}",
                 f"--config.run_seed={r.seed}", "--config=configs/grpo_arith.py:small"):
      assert part in argv, (part, argv)
  # Local commands (the default launcher) parse back to each run's config.
  local = sweep.run(c, str(env / "print"), config_file="configs/grpo_arith.py:small",
                    sweep_text="rl.beta=0.02,0.04", seeds=2, mode="print")
  with open(env / "print" / "launch.sh") as f:
    script = f.read()
  assert script.count("python -m grpo_jax.main") == 4
  for cmd, r in zip(local["report"].splitlines(), local["runs"]):
    argv = shlex.split(cmd)
    over = {a.split("=", 1)[0][len("--config."):]: a.split("=", 1)[1] for a in argv if a.startswith("--config.")}
    parsed = config_lib.override(_config_small(), {k: _literal(v) for k, v in over.items()})
    assert parsed.rl.beta == r.config.rl.beta and parsed.run_seed == r.config.run_seed
    assert f"--workdir={env / 'print' / r.name}" in argv


def _words_to_first_operator(shell: str) -> list[str]:
  """A shell command's words up to its first operator after the python call (`<`, `&&`, `;`, ...): on the hosts the
  job's command is followed by its redirections and the commands that follow its log (launch/detached_job.sh)."""
  lex = shlex.shlex(shell, posix=True, punctuation_chars=True)
  lex.whitespace_split = True
  words = list(lex)
  start = next(i for i, w in enumerate(words) if w.endswith("/bin/python"))
  end = next((i for i in range(start, len(words)) if set(words[i]) <= set("();<>|&")), len(words))
  return words[:end]


def _main_argv(words: list[str]) -> list[str]:
  """grpo_jax.main's arguments in a command's words: those after `-m grpo_jax.main`."""
  return words[words.index("grpo_jax.main") + 1:]


def test_print_mode_drives_every_launcher_and_refuses_the_others(tmp_path, monkeypatch):
  """Every launcher in launch/ that runs the main job takes one calling convention, `<launcher> ... --config FILE
  --workdir DIR -- <flags>`, so the sweep's printed line works through each: gpu_multinode.sh (--hosts and --slurm)
  and local_multiprocess.py (which took no --config / --workdir: its printed line was an argparse error) here by
  their --dry-run; tpu_vm.sh by test_print_mode_writes_launch_commands_the_launcher_accepts, local_multiprocess.py
  for real (2 processes) by tests/test_multihost_cli.py. Each run's main gets the run's config and directory. A
  prefix that runs anything else, or sets what the sweep writes per run, is one line naming the ones that can; so
  is a relative DIR for a launcher whose runs go to other hosts (it refuses a relative --workdir)."""
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # local_multiprocess: no GPU slices, whatever this machine has
  c = _config_small()
  wd = str(tmp_path / "pods")
  common = dict(config_file="configs/grpo_arith.py:small", sweep_text="rl.beta=0.02", seeds=2, mode="print",
                base_overrides={"train.steps": 7}, log=lambda s: None)

  def check(argv, r, workdir):
    assert argv[0] == "--config=configs/grpo_arith.py:small" and argv[1] == f"--workdir={workdir}", argv
    over = {a.split("=", 1)[0][len("--config."):]: a.split("=", 1)[1] for a in argv[2:]}
    parsed = config_lib.override(_config_small(), {k: _literal(v) for k, v in over.items()})
    assert parsed.rl.beta == r.config.rl.beta and parsed.run_seed == r.config.run_seed and parsed.train.steps == 7

  for launch, want in (("launch/gpu_multinode.sh --hosts g1,g2 --run-name s{i} --dry-run", 2),
                       ("bash launch/gpu_multinode.sh --slurm --nodes 2 --dry-run", 1),
                       (f"{sys.executable} launch/local_multiprocess.py -n 2 --devices-per-process 2 --dry-run", 2)):
    out = sweep.run(c, wd, launch=launch, **common)
    assert len(out["report"].splitlines()) == 2, out["report"]  # 2 seeds: each run its own run_seed and DIR
    for cmd, r in zip(out["report"].splitlines(), out["runs"]):
      res = subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=60)
      assert res.returncode == 0, (cmd, res.stderr)
      if "gpu_multinode" in launch:  # `+ ssh g1 '<shell command>'`, `+ srun ... bash -c '<shell command>'`
        shells = [shlex.split(l[2:])[-1] for l in res.stdout.splitlines() if l.startswith("+ ") and "grpo_jax.main" in l]
        argvs = [_main_argv(_words_to_first_operator(sh)) for sh in shells]
      else:  # the bash script of the job: one line per process, `cd REPO && VARS... python -m grpo_jax.main ... &`
        argvs = [_main_argv(shlex.split(l.split(" && ", 1)[1])[:-1]) for l in res.stdout.splitlines()
                 if "grpo_jax.main" in l]
      assert len(argvs) == want, res.stdout
      for argv in argvs:
        check(argv, r, r.workdir)
  # local_multiprocess.py's runs are on this machine: a relative DIR is made absolute against the caller's directory
  monkeypatch.chdir(tmp_path)
  out = sweep.run(c, "rel", launch=f"{sys.executable} {REPO}/launch/local_multiprocess.py -n 2 --dry-run", **common)
  cmd, r = out["report"].splitlines()[0], out["runs"][0]
  res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  line = next(l for l in res.stdout.splitlines() if "grpo_jax.main" in l)
  check(_main_argv(shlex.split(line.split(" && ", 1)[1])[:-1]), r, str(tmp_path / "rel" / r.name))
  # refused, each in one line before anything is written
  can = "the launchers that can: launch/tpu_vm.sh, launch/gpu_multinode.sh, launch/local_multiprocess.py"
  for launch, line in (("srun -N 2", "srun cannot take a sweep run"),
                       ("python -m grpo_jax.main", "-m cannot take a sweep run"),
                       ("launch/tpu_vm.sh --name n --zone z --workdir /w", "--workdir is the sweep's to write"),
                       ("launch/local_multiprocess.py -n 2 --", "-- is the sweep's to write")):
    with pytest.raises(errors.ConfigError) as e:
      sweep.run(c, str(tmp_path / "no"), launch=launch, **common)
    assert line in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert can in str(e.value) or "drop it from the prefix" in str(e.value), str(e.value)
  with pytest.raises(errors.InputError, match=r"^--workdir=no is relative: with --launch=\.\.\.tpu_vm\.sh"):
    sweep.run(c, "no", launch="launch/tpu_vm.sh --name n --zone z", **common)
  assert not os.path.exists(tmp_path / "no")


def test_print_mode_checks_every_point_as_its_run_would(tmp_path, capsys):
  """--mode=print used to write launch.sh for points their runs refuse at start (rl.G=1, a negative lr): now every
  point is checked as its run checks it (no compile), each bad point is one line, then one error; nothing written.
  A launcher's runs are checked for the devices their mesh names, not this host's one CPU device."""
  c = _config_small()
  with pytest.raises(errors.ConfigError, match=r"^--mode=print: 3 of the 4 sweep point\(s\) have bad inputs"):
    sweep.run(c, str(tmp_path / "sw"), config_file="configs/grpo_arith.py:small",
              sweep_text="rl.G=1,4 optim.lr=-1,1e-3", mode="print", log=lambda s: None)
  lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("Config error: sweep run ")]
  assert [l.split(":")[1].strip() for l in lines] == ["sweep run G=1,lr=-1", "sweep run G=1,lr=0.001",
                                                      "sweep run G=4,lr=-1"], lines
  assert "config.rl.G" in lines[1] and "config.optim.lr" in lines[2]
  assert not os.path.exists(tmp_path / "sw")
  launch = "launch/tpu_vm.sh --name sweep-{i} --zone us-central2-b --accelerator v4-32 --dry-run"
  pod = config_lib.override(c, {"mesh.data": 8})  # 8 prompts x G 4 = 32 rows: split over 8 devices
  out = sweep.run(pod, str(tmp_path / "pod"), config_file="configs/grpo_arith.py:small", sweep_text="rl.beta=0,0.1",
                  mode="print", launch=launch, log=lambda s: None)
  assert len(out["report"].splitlines()) == 2
  pod16 = config_lib.override(c, {"mesh.data": -1, "mesh.fsdp": 8})  # -1: all the pod's others, not this host's 1
  sweep.run(pod16, str(tmp_path / "pod16"), config_file="configs/grpo_arith.py:small", sweep_text="rl.beta=0,0.1",
            mode="print", launch=launch, log=lambda s: None)
  # paths only the pod has: not refused here (logged), the launched run checks them
  lines = []
  sweep.run(config_lib.override(pod, {"train.init_from": "hf:/pod_only/Qwen"}), str(tmp_path / "pod3"),
            config_file="configs/grpo_arith.py:small", sweep_text="rl.beta=0,0.1", mode="print", launch=launch,
            log=lines.append)
  assert any("train.init_from=hf:/pod_only/Qwen not on this host" in l for l in lines), lines
  with pytest.raises(errors.ConfigError, match="1 of the 2 sweep point"):
    sweep.run(pod, str(tmp_path / "pod2"), config_file="configs/grpo_arith.py:small",
              sweep_text="rl.prompts_per_step=8,3", mode="print", launch=launch, log=lambda s: None)
  assert "sweep run prompts_per_step=3" in capsys.readouterr().err


def test_a_set_split_that_fits_one_run_but_not_the_vmapped_lanes(env, monkeypatch, tmp_path):
  """rl.rollout_chunks / minibatches set by hand pass each run's preflight against the whole device, but S vmapped
  runs share it (train_group plans auto values for 1/S of it; set ones were not checked): --mode=vmap now refuses
  the group before anything is written, --mode=auto runs it one run at a time (logged)."""
  from grpo_jax.rl import auto, memory_plan  # pylint: disable=g-import-not-at-top
  from grpo_jax.rollout import decode_layout  # pylint: disable=g-import-not-at-top
  c = config_lib.override(_config_small(), {**TINY, "rl.rollout_chunks": 1, "rl.minibatches": 1})
  one = memory_plan.plan(c, dict(data=1, fsdp=1, tensor=1)).total_bytes
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [one + one // 4])  # one run fits, two lanes do not
  with pytest.raises(errors.ConfigError, match=r"^--mode=vmap: the 2 runs .* 1/2 of each device's memory each: "
                                               r"config.rl.rollout_chunks=1, rl.minibatches=1 \(set\)"):
    sweep.run(c, str(tmp_path / "v"), seeds=2, mode="vmap", log=lambda s: None)
  assert not (tmp_path / "v").exists()
  ran, lines = [], []
  monkeypatch.setattr(sweep.jobs, "run", lambda config, wd: ran.append(wd))
  monkeypatch.setattr(sweep.sweep_vmap, "run_group", lambda *a, **k: pytest.fail("vmapped"))
  sweep.run(c, str(tmp_path / "a"), seeds=2, mode="auto", log=lines.append)
  assert len(ran) == 2 and any("do not fit one device as one vmapped program" in l for l in lines), lines
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [3 * one])  # both fit: one program, no check refuses
  assert sweep.lanes_misfit(sweep.make_runs(c, sweep.load_points("", c), 2, str(tmp_path / "b"))) is None
  del auto


def _config_small():
  from configs import grpo_arith  # pylint: disable=g-import-not-at-top
  return grpo_arith.get_config("small")


def _literal(text):
  import ast  # pylint: disable=g-import-not-at-top
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def test_run_seed_at_its_default_keeps_older_run_records():
  """run_seed = -1 (= seed) leaves the stored run-config view as it was before the key existed, so older run
  directories resume; a set run_seed is a real difference."""
  from grpo_jax.run import run_config  # pylint: disable=g-import-not-at-top
  c = _config()
  v = run_config.view(c, "rl")
  assert "run_seed" not in v
  v1 = run_config.view(config_lib.override(c, {"run_seed": 1}), "rl")
  assert v1["run_seed"] == 1 and run_config.diff(v, v1) == ["run_seed"]
  assert run_config.diff(v, {**v, "run_seed": -1}) == []
  assert config_lib.run_seed(c) == c.seed and config_lib.run_seed(config_lib.override(c, {"run_seed": 4})) == 4


def test_report_reads_metrics_stages_and_report_json(tmp_path, caplog):
  """sweep_report.collect on hand-written run directories: last / @tail / stage:metric from metrics.jsonl and an
  R1 pipeline's report.json (stage/metric), hand-computed."""
  from grpo_jax.studies import sweep_report  # pylint: disable=g-import-not-at-top
  dirs = []
  for s, (acc, rews, sft_acc, final) in enumerate([(0.5, [0, 1, 2, 3, 4], 0.1, 0.30), (0.7, [1, 1, 1, 1, 9], 0.3, 0.40)]):
    d = tmp_path / f"seed={s}"
    (d / "sft").mkdir(parents=True)
    rows = [{"step": i, "train/reward_mean": float(r)} for i, r in enumerate(rews)] + [{"step": 4, "eval/accuracy": acc}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "sft" / "metrics.jsonl").write_text(json.dumps({"step": 3, "eval/accuracy": sft_acc}) + "\n")
    (d / "report.json").write_text(json.dumps({"base": {"accuracy_last_number": 0.1},
                                               "r1_5_final": {"accuracy_last_number": final, "format_rate": 1.0}}))
    dirs.append(str(d))
  cells = sweep_report.collect({"p": dirs}, ["eval/accuracy", "train/reward_mean@tail", "train/reward_mean@mean",
                                             "sft:eval/accuracy", "report/*/accuracy_last_number"])
  sc = cells["p"]["scalars"]
  assert sc["eval/accuracy"] == [0.5, 0.7] and sc["sft:eval/accuracy"] == [0.1, 0.3]
  assert sc["train/reward_mean@tail"] == [4.0, 9.0] and sc["train/reward_mean@mean"] == [2.0, 2.6]
  assert sc["report/r1_5_final/accuracy_last_number"] == [0.3, 0.4] and "report/r1_5_final/format_rate" not in sc
  assert cells["p"]["curves"]["train/reward_mean"]["y"] == [[0, 1, 2, 3, 4], [1, 1, 1, 1, 9]]
  md = sweep_report.write(str(tmp_path), cells, title="t", header="")
  assert "| p | 0.6 ± 1.3 |" in md and "n = 2 seeds" in md
  with open(tmp_path / "sweep.csv") as f:
    row = [l.split(",") for l in f if l.startswith("p,report/r1_5_final/accuracy_last_number,")][0]
  # n, mean, std (ddof 1), t(0.975, 1 df) · std / √2 = 12.7062 · 0.0707107 / 1.41421
  assert int(row[2]) == 2 and float(row[3]) == pytest.approx(0.35) and float(row[4]) == pytest.approx(0.0707107)
  assert float(row[5]) == pytest.approx(0.635310, rel=1e-4)
  with pytest.raises(ValueError, match="@median"):
    sweep_report.parse("train/loss@median")
  # a name that matches nothing (a typo) was a column left out without a word; now a warning naming it
  caplog.set_level("WARNING")
  cells = sweep_report.collect({"p": dirs}, ["eval/accurracy", "eval/accuracy", "report/nope/*"])
  assert list(cells["p"]["scalars"]) == ["eval/accuracy"]
  said = [r.getMessage() for r in caplog.records if "matches no metric" in r.getMessage()]
  assert len(said) == 2 and "'eval/accurracy'" in said[0] and "'report/nope/*'" in said[1], said


def test_report_key_columns_write_values_as_the_names_do(tmp_path, monkeypatch):
  """sweep.csv's swept-key columns wrote lr=1e-6 and 1.0000001e-6 both as 1e-06 (the names now tell them apart)."""
  c = _config()
  runs = sweep.make_runs(c, sweep_points.parse("optim.lr=1e-6,1.0000001e-6 rl.beta=0.5", c), 1, str(tmp_path))
  for r, acc in zip(runs, (0.25, 0.75)):
    os.makedirs(r.workdir)
    with open(os.path.join(r.workdir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 1, "eval/accuracy": acc}) + "\n")
  monkeypatch.setattr(sweep, "finished", lambda r: True)
  sweep.write_report(str(tmp_path), runs, ["eval/accuracy"], title="t", header="")
  with open(tmp_path / "sweep.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [(r["point"], r["optim.lr"], r["rl.beta"], r["mean"]) for r in rows] == [
      ("lr=1e-06,beta=0.5", "1e-06", "0.5", "0.25"), ("lr=1.0000001e-06,beta=0.5", "1.0000001e-06", "0.5", "0.75")]
  with pytest.raises(errors.ConfigError, match="section"):  # a section as a swept value: one line, not a TypeError
    sweep.make_runs(c, sweep_points.sweep("rl", [{"beta": 0.1}, {"beta": 0.2}]), 1, "/tmp/x")


def test_r1_seed_tables_of_points_with_a_slash_in_their_name(tmp_path, monkeypatch):
  """An R1 sweep's per-point seed tables were DIR/r1_seeds_<point>.md: a point swept over a path
  (train.init_from=/data/a) named a file in a directory that does not exist, and the report failed after training."""
  from grpo_jax.r1 import seeds_report  # pylint: disable=g-import-not-at-top
  c = config_lib.override(_config(), {"job": "r1_pipeline"})
  runs = sweep.make_runs(c, sweep_points.sweep("train.init_from", ["/data/a", "/data/b"]), 1, str(tmp_path))
  assert [r.name for r in runs] == ["init_from=_data_a", "init_from=_data_b"]
  for r in runs:
    os.makedirs(r.workdir)
  written = []

  def write(workdir, dirs, header="", name="r1_seeds"):
    with open(os.path.join(workdir, name + ".md"), "w", encoding="utf-8") as f:  # as seeds_report.write does
      f.write(" ".join(dirs))
    written.append(name)
  monkeypatch.setattr(sweep, "finished", lambda r: True)
  monkeypatch.setattr(seeds_report, "write", write)
  sweep.write_report(str(tmp_path), runs, ["report/*/accuracy_last_number"], title="t", header="")
  assert written == ["r1_seeds_init_from=_data_a", "r1_seeds_init_from=_data_b"]
  assert (tmp_path / "r1_seeds_init_from=_data_b.md").read_text() == runs[1].workdir


def test_r1_run_whose_stages_are_done_is_finished_only_with_its_report(tmp_path, monkeypatch):
  """A pipeline run stopped between its last stage and the held-out report must rerun (to write report.json, which
  the seed report reads), not be skipped as finished."""
  from configs import r1_pipeline
  from grpo_jax.run import stages
  c = r1_pipeline.get_config("small")
  monkeypatch.setattr(stages, "plan", lambda todo, config, workdir: {st.name: "skip" for st in todo})
  run = sweep.Run(name="seed=0", point="run", seed=0, overrides={}, keys={}, config=c, workdir=str(tmp_path))
  monkeypatch.setattr(stages, "is_done", lambda st: True)
  assert sweep.check([run]) == {"seed=0": False} and not sweep.finished(run)
  (tmp_path / "report.json").write_text("{}")
  assert sweep.check([run]) == {"seed=0": True} and sweep.finished(run)


def test_runs_restored_at_different_steps_go_back_to_a_common_step():
  """A group whose runs restored at different steps (one stopped later, or whose newest checkpoint was damaged)
  continues from the newest step all of them have, as ONE program: sub-groups of fewer runs round differently, so the
  sweep ended a few ulps away from an uninterrupted one (benchmarks/chaos.py found it). A run that lacks the step,
  or whose copy of it does not restore, stays in its sub-group."""
  import types

  class Ckpt:
    def __init__(self, steps, bad=()):
      self.steps, self.bad, self.asked = steps, bad, []

    def all_steps(self):
      return self.steps

    def restore(self, step, abstract):
      self.asked.append(step)
      if step in self.bad:
        raise errors.InputError(f"checkpoint step {step} is damaged")
      return {"step": step}, {"step": step}

  def group(*specs):
    runs = [types.SimpleNamespace(workdir=f"/w/run{i}", ckpt=Ckpt(steps, bad))
            for i, (_, steps, bad) in enumerate(specs)]
    return runs, [start for start, _, _ in specs]

  runs, starts = group((4, [2, 4], ()), (5, [2, 4, 5], ()), (5, [4, 5], ()))
  states, lines = [{"step": s} for s in starts], []
  train.restore_together(runs, starts, states, None, lines.append)
  assert starts == [4, 4, 4] and [st["step"] for st in states] == [4] * 3
  assert [r.ckpt.asked for r in runs] == [[], [4], [4]] and len(lines) == 2 and "back from step 5" in lines[0]
  for specs in (((4, [4], ()), (6, [2, 6], ())),           # the run ahead has no step 4: sub-groups
                ((0, [], ()), (2, [2], ())),                # a run with no checkpoint at all
                ((4, [4], ()), (6, [4, 6], (4,)))):          # its step 4 does not restore
    runs, starts = group(*specs)
    train.restore_together(runs, starts, [None] * len(runs), None, lines.append)
    assert starts == [s[0] for s in specs], specs


def test_one_run_and_a_group_of_one_write_the_same_rows_and_checkpoints(env, tmp_path):
  """`python -m grpo_jax.main`'s path (jobs.run) and the vmapped sweep's (sweep_vmap.run_group) share one set-up
  (jobs.run_group → train.train_group): the same config as one run and as a group of one writes the same metrics
  rows (perf/* aside) and the same checkpoints, bit for bit, and records the same `auto` resolution."""
  c = config_lib.override(_config(), {"train.ckpt_every": 2})
  one, group = str(tmp_path / "one"), str(tmp_path / "group")
  jobs.run(c, one)
  info = sweep_vmap.run_group([c], [group], log=lambda _: None)
  assert info["failed"] == {} and info["traces"] == [1]
  assert _exact_rows(one) == _exact_rows(group) and len(_rows(one)) == 4  # eval at 0, steps 1..3 (eval at 3 merged)
  for step in (2, 3):
    a = ocp.StandardCheckpointer().restore(os.path.join(one, "checkpoints", str(step), ckpt_lib.STATE))
    b = ocp.StandardCheckpointer().restore(os.path.join(group, "checkpoints", str(step), ckpt_lib.STATE))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with open(os.path.join(one, "auto.json")) as f1, open(os.path.join(group, "auto.json")) as f2:
    assert json.load(f1) == json.load(f2)


def test_a_sweep_started_as_a_process_of_a_multi_process_job_is_refused_before_anything_is_written(
    monkeypatch, tmp_path):
  """Under GRPO_JAX_DISTRIBUTED=1 (launch/tpu_vm.sh, gpu_multinode.sh, local_multiprocess.py) every process ran the
  whole sweep: each wrote sweep.json / sweep.md / launch.sh, and a vmapped group (sweep_vmap.run_group) never joined
  the job. Every mode now refuses in one line naming the pod path (--mode=print with a launcher), before the
  workdir exists; so do the launch variables set without the switch; =0 is one process on purpose."""
  c = _config()
  for k in ("GRPO_JAX_DISTRIBUTED", "GRPO_JAX_COORDINATOR", "GRPO_JAX_NUM_PROCESSES", "GRPO_JAX_PROCESS_ID"):
    monkeypatch.delenv(k, raising=False)
  wd = str(tmp_path / "s")
  monkeypatch.setenv("GRPO_JAX_DISTRIBUTED", "1")
  modes = ("report", "print", "serial", "vmap", "auto")  # the ones that write least first (a planted bug runs them)
  assert sorted(modes) == sorted(sweep.MODES)
  for mode in modes:
    with pytest.raises(errors.InputError) as e:
      sweep.run(c, wd, config_file="configs/grpo_arith.py:small", sweep_text="rl.beta=0.02,0.04", mode=mode,
                log=lambda s: None)
    assert str(e.value).startswith("GRPO_JAX_DISTRIBUTED=1: python -m grpo_jax.sweep runs its runs in one process, "
                                   "not as a process of a multi-process job"), str(e.value)
    assert "--mode=print --launch='launch/tpu_vm.sh" in str(e.value) and "\n" not in str(e.value)
    assert errors.classify(e.value)[0] == errors.EXIT_INPUT and not os.path.exists(wd)
  monkeypatch.delenv("GRPO_JAX_DISTRIBUTED")
  monkeypatch.setenv("GRPO_JAX_PROCESS_ID", "1")
  with pytest.raises(errors.InputError, match=r"^GRPO_JAX_PROCESS_ID set: python -m grpo_jax.sweep runs"):
    sweep.run(c, wd, sweep_text="rl.beta=0.02,0.04", mode="report", log=lambda s: None)
  assert not os.path.exists(wd)
  monkeypatch.setenv("GRPO_JAX_DISTRIBUTED", "0")
  sweep.run(c, wd, sweep_text="rl.beta=0.02,0.04", mode="report", log=lambda s: None)
  assert os.path.exists(os.path.join(wd, "sweep.md"))
