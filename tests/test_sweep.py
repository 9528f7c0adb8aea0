"""Sweeps: 2 β × 2 lr × 2 seeds in ONE vmapped program equal 8 separate `main` runs; shape axes run serially; a
killed sweep resumes; --mode=print writes launch commands that the launcher accepts.

Runs are real (jobs.run, python -m grpo_jax.main's path, and sweep.run) on a tiny arith config. The reward is a test
term (the fraction of even token ids in a completion) so that a random policy's rewards vary and every run's
updates are non-zero. The module's runs share a private XLA compilation cache: the 8 separate runs compile their
two programs (one per β) once.
"""
import json
import os
import signal
import subprocess
import shlex

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import config_lib
from grpo_jax import errors
from grpo_jax import hyper
from grpo_jax import jobs
from grpo_jax import metrics as metrics_lib
from grpo_jax import rewards
from grpo_jax import sweep
from grpo_jax import sweep_vmap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = "rl.beta=0.02,0.5 optim.lr=1e-2,3e-2"
TINY = {"model.hidden": 32, "model.layers": 1, "model.heads": 2, "model.kv_heads": 1, "model.inter": 64,
        "model.max_len": 64, "sft.steps": 0, "rl.G": 4, "rl.prompts_per_step": 2, "sampling.max_new_tokens": 8,
        "train.steps": 3, "train.eval_every": 3, "train.ckpt_every": 10, "train.plot_every": 0,
        "train.sample_every": 0, "eval.size": 4, "eval.batch": 4, "eval.n_samples": 2, "eval.pass_k": (1, 2),
        "log.tensorboard": False, "rewards": (("even", 1.0),)}
# vmapped vs separate programs: XLA fuses and orders reductions differently, fp32 (seeds.py's own test: 1e-5).
RTOL, ATOL = 1e-4, 1e-5


def _even_fraction(tokens_NxL, mask_NxL, batch, ctx):
  m = mask_NxL.astype(jnp.float32)
  return rewards.outcome(jnp.sum((tokens_NxL % 2 == 0) * m, -1) / jnp.maximum(m.sum(-1), 1.0))


def _config():
  from configs import grpo_arith  # pylint: disable=g-import-not-at-top
  return config_lib.override(grpo_arith.get_config("small"), TINY)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  saved = {k: getattr(jax.config, k) for k in keys}
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(rewards.REGISTRY, "even", lambda ctx: _even_fraction)
    yield tmp_path_factory.mktemp("sweep")
  for k, v in saved.items():
    jax.config.update(k, v)


def _params(workdir):
  ck = os.path.join(workdir, "checkpoints")
  step = max(int(d) for d in os.listdir(ck) if d.isdigit())
  restored = ocp.StandardCheckpointer().restore(os.path.join(ck, str(step), ckpt_lib._STATE))  # pylint: disable=protected-access
  return step, jax.tree.leaves(restored["params"])


def _rows(workdir):
  return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in metrics_lib.read_metrics(workdir)]


@pytest.fixture(scope="module")
def grid(env):
  """The 8-run sweep (vmapped) and the same 8 runs one by one through jobs.run (`main`'s path)."""
  c = _config()
  out = sweep.run(c, str(env / "grid"), sweep_text=SWEEP, seeds=2, mode="vmap", log=lambda _: None)
  separate = {}
  for r in out["runs"]:
    d = str(env / "separate" / r.name)
    jobs.run(r.config, d)
    separate[r.name] = d
  return c, out, separate


def test_grid_is_one_program_and_equals_separate_runs(grid):
  _, out, separate = grid
  runs = out["runs"]
  assert [r.name for r in runs] == [f"beta={b},lr={lr},seed={s}" for b in ("0.02", "0.5")
                                    for lr in ("0.01", "0.03") for s in (0, 1)]
  assert len(out["groups"]) == 1 and out["groups"][0]["mode"] == "vmap"
  assert out["groups"][0]["runs"] == [r.name for r in runs] and out["groups"][0]["traces"] == [1]
  finals = {}
  for r in runs:
    step, vp = _params(r.workdir)
    sstep, sp = _params(separate[r.name])
    assert step == sstep == 3
    for a, b in zip(vp, sp):
      np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=r.name)
    vm, sm = _rows(r.workdir), _rows(separate[r.name])
    assert [x["step"] for x in vm] == [x["step"] for x in sm] and len(vm) >= 4
    for a, b in zip(vm, sm):
      assert set(a) == set(b), r.name
      for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=RTOL, atol=ATOL, err_msg=f"{r.name} {k} step {a['step']}")
    finals[r.name] = vp[0]
    assert any(x.get("train/adv_std", 0) > 0 for x in vm) and any(x.get("train/kl", 0) > 0 for x in vm)
  # The axes really change the runs: seeds (init), lr and β give 8 different final params.
  flat = [v.ravel() for v in finals.values()]
  assert all(not np.allclose(flat[i], flat[j]) for i in range(8) for j in range(i))


def test_point_resumes_with_main_and_refuses_a_different_config(grid):
  """A point's directory is a `main` run directory: rerunning its config is a no-op (finished); a different
  config is refused with run_config's diff, one line."""
  _, out, _ = grid
  r = out["runs"][0]
  before = os.path.getmtime(os.path.join(r.workdir, "metrics.jsonl"))
  jobs.run(r.config, r.workdir)
  assert os.path.getmtime(os.path.join(r.workdir, "metrics.jsonl")) == before
  other = config_lib.override(r.config, {"rl.beta": 0.3})
  with pytest.raises(errors.InputError, match="rl.beta"):
    jobs.run(other, r.workdir)


def test_rerun_skips_finished_runs_and_writes_the_report(grid):
  c, out, _ = grid
  wd = os.path.dirname(out["runs"][0].workdir)
  logs = []
  again = sweep.run(c, wd, sweep_text=SWEEP, seeds=2, mode="vmap", log=logs.append)
  assert again["groups"] == [] and sum("skipped" in l for l in logs) == 8
  with open(os.path.join(wd, "sweep.csv")) as f:
    rows = [l.rstrip("\n").split(",") for l in f]
  assert rows[0][:4] == ["point", "beta", "lr", "metric"]
  acc = {(r[0], r[3]): r for r in rows[1:]}
  point = "beta=0.5,lr=0.03"
  vals = [_rows(os.path.join(wd, f"{point},seed={s}"))[-1]["eval/accuracy"] for s in (0, 1)]
  got = acc[(point, "eval/accuracy")]
  assert int(got[4]) == 2 and float(got[5]) == pytest.approx(np.mean(vals))
  assert float(got[6]) == pytest.approx(np.std(vals, ddof=1))
  md = open(os.path.join(wd, "sweep.md")).read()
  assert "| point | eval/accuracy | train/reward_mean@tail |" in md and "n = 2 seeds" in md
  assert os.path.exists(os.path.join(wd, "plots", "train_reward_mean.png"))
  # A different config on the same sweep directory: refused before anything runs, naming the run and the key.
  with pytest.raises(errors.InputError, match=r"beta=0.02,lr=0.01,seed=0.*rl.G"):
    sweep.run(config_lib.override(c, {"rl.G": 2}), wd, sweep_text=SWEEP, seeds=2, mode="vmap", log=lambda _: None)


def test_killed_serial_sweep_resumes_and_equals_uninterrupted(grid, env, monkeypatch):
  """SIGTERM during the second point's training: the sweep stops (Preempted, that run saved); the rerun skips the
  finished point, resumes the killed one from its checkpoint and ends equal to the uninterrupted separate run."""
  c, out, separate = grid
  c = config_lib.override(c, {"train.ckpt_every": 1})
  wd = str(env / "killed")
  text = "rl.beta=0.5 optim.lr=1e-2,3e-2"
  real_write, calls = metrics_lib.MetricWriter.write, []

  def write(self, step, scalars):
    real_write(self, step, scalars)
    if "lr=0.03" in self.workdir and step == 1 and "train/loss" in scalars and not calls:
      calls.append(step)
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(metrics_lib.MetricWriter, "write", write)
  with pytest.raises(errors.Preempted):
    sweep.run(c, wd, sweep_text=text, seeds=1, mode="serial", log=lambda _: None)
  assert calls == [1]
  first = os.path.join(wd, "beta=0.5,lr=0.01")
  stamp = os.path.getmtime(os.path.join(first, "metrics.jsonl"))
  assert _params(os.path.join(wd, "beta=0.5,lr=0.03"))[0] in (1, 2)
  logs = []
  res = sweep.run(c, wd, sweep_text=text, seeds=1, mode="serial", log=logs.append)
  assert [g["runs"] for g in res["groups"]] == [["beta=0.5,lr=0.03"]]
  assert os.path.getmtime(os.path.join(first, "metrics.jsonl")) == stamp
  # run_seed 0 (the config's seed) is what the grid's seed-0 runs used: the same run, uninterrupted.
  step, p = _params(os.path.join(wd, "beta=0.5,lr=0.03"))
  _, q = _params(separate["beta=0.5,lr=0.03,seed=0"])
  assert step == 3
  for a, b in zip(p, q):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_shape_axes_and_beta_zero_run_serially():
  """G changes shapes and β = 0 drops the reference from the update (a different program): separate groups;
  lr, β > 0, temperature, clip ε and reward weights share one program."""
  c = _config()
  same = sweep.make_runs(c, hyper.product([hyper.sweep("optim.lr", [1e-3, 2e-3]), hyper.sweep("rl.beta", [0.1, 0.2]),
                                           hyper.sweep("sampling.temperature", [0.7, 1.0]),
                                           hyper.sweep("rl.eps_high", [0.2, 0.28])]), 2, "/tmp/x")
  assert len(sweep.groups(same)) == 1 and sweep.decide(same, "auto", 1) == "vmap"
  runs = sweep.make_runs(c, hyper.parse("rl.G=2,4 rl.beta=0,0.04", c), 2, "/tmp/x")
  gs = sweep.groups(runs)
  assert [[r.name for r in g] for g in gs] == [[f"G={g},beta={b},seed={s}" for s in (0, 1)]
                                               for g in (2, 4) for b in (0, 0.04)]
  assert all(sweep.decide(g, "serial", 1) == "serial" for g in gs)
  assert sweep.decide(gs[0], "auto", 8) == "serial"  # several devices: each run uses them all, one after another
  one = sweep.make_runs(c, hyper.parse("rl.G=2,4", c), 1, "/tmp/x")
  assert [sweep.decide(g, "auto", 1) for g in sweep.groups(one)] == ["serial", "serial"]


def test_sweep_text_is_typed_and_bad_input_is_one_line():
  c = _config()
  pts = hyper.parse("rl.beta=0,1e-2 train.steps=5 rl.dynamic_sampling=true", c)
  assert [p.dict for p in pts] == [{"rl.beta": 0.0, "train.steps": 5, "rl.dynamic_sampling": True},
                                   {"rl.beta": 0.01, "train.steps": 5, "rl.dynamic_sampling": True}]
  assert all(type(p.dict["rl.beta"]) is float for p in pts)
  for text, msg in [("rl.beta=abc", "not a float"), ("rl.betta=0.1", "betta"), ("rl.beta", "key=v1,v2"),
                    ("rl.beta=0.1,", "empty value"), ("rewards=a", "get_sweep"), ("algo=nope", "nope")]:
    with pytest.raises(errors.ConfigError, match=msg) as e:
      hyper.parse(text, c)
    assert "\n" not in str(e.value)
  with pytest.raises(errors.ConfigError, match="share the directory"):
    sweep.make_runs(c, hyper.named("a b", {}) + hyper.named("a_b", {}), 1, "/tmp/x")


def test_get_sweep_in_the_config_file(tmp_path):
  path = tmp_path / "exp.py"
  path.write_text("from configs import grpo_arith\n"
                  "def get_config(arg=None):\n  return grpo_arith.get_config('small')\n"
                  "def get_sweep(h):\n"
                  "  return h.product([h.sweep('algo', ['grpo', 'dr_grpo']), h.sweep('optim.lr', [1e-4, 3e-4])])"
                  " + h.named('baseline', {'rl.G': 8})\n")
  c = _config()
  pts = sweep.load_points(str(path), c)
  assert hyper.names(pts) == ["algo=grpo,lr=0.0001", "algo=grpo,lr=0.0003", "algo=dr_grpo,lr=0.0001",
                              "algo=dr_grpo,lr=0.0003", "baseline"]
  runs = sweep.make_runs(c, pts, 1, "/tmp/x")
  assert runs[2].config.rl.preset == "dr_grpo" and runs[2].config.rl.beta == 0.0 and runs[2].config.optim.lr == 1e-4
  assert runs[4].config.rl.G == 8 and runs[4].config.rl.preset == c.rl.preset


def test_print_mode_writes_launch_commands_the_launcher_accepts(env):
  c = _config()
  wd = "gs://bucket/sweeps/s1"
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
    for part in (f"--workdir={wd}/{r.name}", "--config.train.steps=7", f"--config.rl.beta={r.config.rl.beta!r}",
                 f"--config.run_seed={r.seed}", "--config=configs/grpo_arith.py:small"):
      assert part in train[0], (part, train[0])
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
  from grpo_jax import run_config  # pylint: disable=g-import-not-at-top
  c = _config()
  v = run_config.view(c, "rl")
  assert "run_seed" not in v
  v1 = run_config.view(config_lib.override(c, {"run_seed": 1}), "rl")
  assert v1["run_seed"] == 1 and run_config.diff(v, v1) == ["run_seed"]
  assert run_config.diff(v, {**v, "run_seed": -1}) == []
  assert config_lib.run_seed(c) == c.seed and config_lib.run_seed(config_lib.override(c, {"run_seed": 4})) == 4


def test_report_reads_metrics_stages_and_report_json(tmp_path):
  """sweep_report.collect on hand-written run directories: last / @tail / stage:metric from metrics.jsonl and an
  R1 pipeline's report.json (stage/metric), hand-computed."""
  from grpo_jax import sweep_report  # pylint: disable=g-import-not-at-top
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
