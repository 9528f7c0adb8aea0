"""The training tables' toy base model and cells, and table c's compiled-memory column, at tiny sizes."""
import os
import re

import jax
import ml_collections
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.studies.ablations import memory_table
from grpo_jax.studies.ablations import toy
from grpo_jax.studies.ablations import train_table
from grpo_jax.tasks import digits


def test_base_documents_follow_their_spec():
  d = digits.base_documents(4000, L=8, vocab=32, p_correct=0.3, rng=np.random.default_rng(0))
  P = digits.TOY_PROMPT_LEN
  comp, mask = d["tokens_NxT"][:, P:], d["loss_mask_NxT"][:, P:]
  assert (d["loss_mask_NxT"][:, :P] == 0).all()
  n = mask.sum(1)
  assert n.min() == 2 and n.max() == 8                                     # answer + 0..6 fillers + EOS
  assert (comp[np.arange(len(n)), n - 1] == digits.EOS).all()
  assert ((comp >= digits.DIGIT0) & (comp < digits.DIGIT0 + 10))[:, 0].all()
  fill = comp[:, 1:][mask[:, 1:] > 0]
  assert ((fill >= digits.FILLER0) | (fill == digits.EOS)).all()
  assert (comp[mask == 0] == digits.PAD).all()
  a, b = comp.shape[0], P
  answer = d["tokens_NxT"][:, 2] + d["tokens_NxT"][:, 4] - digits.DIGIT0       # DIGIT0 + a + b
  right = comp[:, 0] == answer
  # P(right) = 0.3 + 0.7/10 (a random digit can be right too).
  assert abs(right.mean() - 0.37) < 0.03, (a, b)
  # Lengths are independent of correctness: equal mean length for right and wrong (within sampling error).
  assert abs(n[right].mean() - n[~right].mean()) < 0.2


@pytest.fixture(scope="module")
def tiny_cfg():
  c = train_table.table_config("small", (("grpo", presets.overrides("grpo")), ("ppo", presets.overrides("ppo"))))
  c.seeds, c.steps, c.eval_every, c.base_steps = 2, 2, 1, 40
  c.run = config_lib.override(c.run, {"rl.prompts_per_step": 2, "rl.G": 4, "sampling.max_new_tokens": 4,
                                      "model.hidden": 16, "model.inter": 32})
  return c


def test_base_model_learns_the_documents(tiny_cfg):
  """The pre-trained base answers right more often than a random init does (greedy, training prompts)."""
  mcfg = model_lib.ModelConfig.from_config(train_table.build_config(tiny_cfg, {}).model)
  p0 = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  L = tiny_cfg.run.sampling.max_new_tokens
  base_params = toy.base_params(mcfg, L, 300, 1.0)
  ev = toy.make_eval(mcfg, L, digits.train_set())
  stacked = jax.tree.map(lambda a, b: np.stack([a, b]), p0, base_params)
  acc0, acc1 = np.asarray(ev(stacked))
  assert acc1 > acc0 and acc1 >= 0.4, (acc0, acc1)


def test_ppo_train_cell_runs_from_the_base(tiny_cfg):
  """Table d's PPO cell (critic, own optimizer state) through train_table; the GRPO-family path is the vmapped
  rl_step that tests/test_seeds.py checks against separate runs."""
  cell = train_table.run_cell(tiny_cfg, "ppo", [0, 1])
  for m, v in cell["scalars"].items():
    assert len(v) == 2, m
  # what its runs resolved `auto` to, recorded with the cell (ablate keeps it in the cell file and DIR/auto.json):
  # 4-token completions take the static decoder; rl.packing, set off by the table, is not auto's
  assert cell["auto"]["sampling.engine"].startswith("static (max_new_tokens 4 < 256") and "rl.packing" not in cell["auto"]
  assert cell["auto"]["sampling.exit_chunk"] == "16 (max_new_tokens 4 <= 16: one scan)"
  acc = cell["curves"]["greedy accuracy on the training prompts"]
  assert acc["x"] == [0, 1, 2] and np.asarray(acc["y"]).shape == (2, 3)
  # Both seeds start from the same base: identical greedy accuracy at step 0.
  assert acc["y"][0][0] == acc["y"][1][0]


def _per_seed(cfg, **keys):
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.base = "per_seed"
  c.update(keys)
  return c


def test_per_seed_bases_start_and_anchor_their_seeds_pretrained_once_per_table(tiny_cfg, monkeypatch):
  """cfg.base='per_seed': seed s's params and reference are toy.pretrain(seed=s) bit for bit (seeds 1, 2: not the
  lane index, not the shared base), pre-trained once for two cells (toy.base_params' cache); the default 'shared'
  starts and anchors every seed at seed 0's base."""
  cfg = _per_seed(tiny_cfg, base_steps=23)  # a cache key no other test fills: every pre-training here is counted
  c = train_table.build_config(cfg, presets.overrides("grpo"))
  spec = digits.toy_reward_spec(c.rewards, c.model.vocab_size)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  trained, real = [], toy.pretrain
  monkeypatch.setattr(toy, "pretrain", lambda *a: trained.append(a[-1]) or real(*a))
  states = [train_table.make_runs(cfg, c, spec, [1, 2]).states for _cell in range(2)]
  assert trained == [1, 2]  # each seed's base once, though both cells asked
  fresh = [real(mcfg, c.sampling.max_new_tokens, 23, float(cfg.p_correct), s) for s in (0, 1, 2)]
  assert not np.array_equal(jax.tree.leaves(fresh[1])[0], jax.tree.leaves(fresh[2])[0])

  def assert_lanes(st, want):
    for key in ("params", "ref_params"):
      for lane, base in enumerate(want):
        for a, b in zip(jax.tree.leaves(st[key]), jax.tree.leaves(base), strict=True):
          np.testing.assert_array_equal(np.asarray(a)[lane], np.asarray(b), err_msg=f"{key}, lane {lane}")
  for st in states:
    assert_lanes(st, fresh[1:])
  cfg.base = "shared"
  assert_lanes(train_table.make_runs(cfg, c, spec, [1, 2]).states, [fresh[0], fresh[0]])
  assert trained == [1, 2, 0]


def test_a_per_seed_cell_equals_its_seeds_run_alone_from_their_own_bases(tiny_cfg, monkeypatch):
  """A per_seed cell (2 seeds in one vmapped program, each from its base) = each seed's cell run alone with that
  base given as the shared start (init_states' `params` path, its reference a copy), within float32 tolerance."""
  cfg = _per_seed(tiny_cfg)
  both = train_table.run_cell(cfg, "grpo", [1, 2])
  base = lambda s: toy.base_params(model_lib.ModelConfig.from_config(train_table.build_config(cfg, {}).model),
                                   cfg.run.sampling.max_new_tokens, int(cfg.base_steps), float(cfg.p_correct), seed=s)
  for lane, s in enumerate((1, 2)):
    monkeypatch.setattr(train_table, "start_params", lambda cfg, mcfg, seeds: {"params": base(s)})
    alone = train_table.run_cell(cfg, "grpo", [s])
    for m, v in alone["scalars"].items():
      np.testing.assert_allclose(both["scalars"][m][lane], v[0], rtol=1e-5, atol=1e-5, err_msg=m)
    for m, curve in alone["curves"].items():
      np.testing.assert_allclose(both["curves"][m]["y"][lane], curve["y"][0], rtol=1e-5, atol=1e-5, err_msg=m)
  # the two seeds' bases differ, and so do their runs from the first step
  assert both["curves"]["policy entropy"]["y"][0][0] != both["curves"]["policy entropy"]["y"][1][0]


def test_an_unknown_base_is_refused_in_one_line_before_any_cell(tiny_cfg, tmp_path):
  from grpo_jax.studies import ablate
  cfg = _per_seed(tiny_cfg, base="per_sed")
  with pytest.raises(config_lib.ConfigError, match=r"^config.base='per_sed': use one of 'shared', 'per_seed'.$"):
    ablate.run(cfg, str(tmp_path), log=lambda s: None)
  assert not os.path.exists(tmp_path / "cells")
  lora = _per_seed(tiny_cfg)
  lora.run.model.lora.rank = 4  # LoRA's seeds share one frozen base (init_states)
  with pytest.raises(config_lib.ConfigError, match=r"config.base='per_seed' with model.lora.rank > 0"):
    train_table.build_config(lora, presets.overrides("grpo"))
  # the default leaves the fingerprint of the configs run before the key existed, so their workdirs resume
  shared, before = ml_collections.ConfigDict(tiny_cfg.to_dict()), ml_collections.ConfigDict(tiny_cfg.to_dict())
  del before["base"]
  assert ablate.fingerprint(shared) == ablate.fingerprint(before) != ablate.fingerprint(_per_seed(tiny_cfg))


def test_a_table_stopped_in_a_cell_resumes_at_that_cell_and_its_scratch_runs_save_nothing(tiny_cfg, tmp_path,
                                                                                              monkeypatch):
  """`python -m grpo_jax.ablate` stopped (SIGTERM) in its second cell's training: errors.Preempted, the finished cell's
  file kept and none for the stopped one; the rerun loads the finished cell and reruns the stopped one from its start,
  to an uninterrupted run's numbers (the two rows are one config: equal cells). The seeds' scratch runs, stopped or
  finished, write no checkpoint (checkpoint.NoCheckpoints: a table resumes by cell, so nothing would read one).
  The rows are table l's data option and table k's random term through train_table on the toy: every batch is the
  one pair (its sampled accuracy is the reward curve), the coin's rate the configured one. The three cell runs share
  one program of each evaluation (held-out and training prompts: toy.shared_program), where each cell traced and
  compiled its own."""
  from jax import monitoring
  import json
  import tempfile
  from grpo_jax.infra import errors
  from grpo_jax.infra import signals
  from grpo_jax.studies import ablate
  cfg = ml_collections.ConfigDict(tiny_cfg.to_dict())
  one_shot = {**presets.overrides("grpo"), "task.train_indices": (7,), "rewards": (("random", 1.0), ("acc", 0.0)),
              "rl.random_reward_rate": 0.25}
  cfg.variants = (("a", one_shot), ("b", one_shot))
  scratch = []  # per scratch directory of train_seeds: every path under it when it was removed
  real_cleanup, real_train, real_cell = tempfile.TemporaryDirectory.cleanup, train_table.train_seeds, train_table.run_cell

  def cleanup(self):
    scratch.append(sorted(os.path.relpath(os.path.join(d, n), self.name)
                          for d, dirs, files in os.walk(self.name) for n in dirs + files))
    real_cleanup(self)

  def train_seeds(*args, observe, **kwargs):
    stop = len(scratch) == 1  # the second cell of the first invocation

    def observing(t, batch, m):
      observe(t, batch, m)
      if stop and t == 0:
        signals.active().request()  # as a SIGTERM during the cell's first step: the loop stops after it
    real_train(*args, observe=observing, **kwargs)

  ran = []
  monkeypatch.setattr(tempfile.TemporaryDirectory, "cleanup", cleanup)
  monkeypatch.setattr(train_table, "train_seeds", train_seeds)
  monkeypatch.setattr(train_table, "run_cell", lambda c, v, seeds: ran.append(v) or real_cell(c, v, seeds))
  wd, traced = str(tmp_path / "table"), []

  def listener(event, secs, **kw):  # what JAX traces (a program built again is traced and compiled again)
    del secs
    if event.endswith("jaxpr_trace_duration"):
      traced.append(kw.get("fun_name"))
  monitoring.register_event_duration_secs_listener(listener)
  try:
    # the line names the row stopped and the rows kept (its runs' scratch directory is not "saved")
    line = (f"stopped by a signal in row 'b' of table {wd} (its runs stopped after step 1; the row reruns from its "
            f"start); 1 of 2 rows finished and kept in {wd}/cells. Rerun the same command to resume.")
    with pytest.raises(errors.Preempted, match=f"^{re.escape(line)}$"):
      ablate.run(cfg, wd, log=lambda s: None)
    assert ran == ["a", "b"] and sorted(os.listdir(os.path.join(wd, "cells"))) == ["a.json"]
    ablate.run(cfg, wd, log=lambda s: None)
  finally:
    monitoring.unregister_event_duration_listener(listener)
  # at most once each (none where an earlier test of the module built them for these shapes); each cell's own: 6
  assert traced.count("acc") <= 2 and traced.count("stepped") == 3, traced
  assert ran == ["a", "b", "b"]  # the finished cell loaded, the stopped one rerun
  cells = ablate.run_cells(cfg, wd, train_table, log=lambda s: None)
  assert json.dumps(cells["b"], sort_keys=True) == json.dumps(cells["a"], sort_keys=True)
  assert np.asarray(cells["a"]["curves"]["train accuracy reward"]["y"]).shape == (2, 2)
  assert len(scratch) == 3 and all(f"run{i}/metrics.jsonl" in paths for paths in scratch for i in range(cfg.seeds))
  assert not [p for paths in scratch for p in paths if "checkpoints" in p.split(os.sep)], scratch


def test_compiled_memory_counts_the_state_and_batch():
  """XLA's argument bytes for the compiled step = state pytree bytes + batch bytes, exactly; a separate critic adds
  its params and AdamW moments."""
  cfg = ml_collections.ConfigDict(dict(vocab=64, compile_sizes=("32x1",), workload=dict(
      prompts=2, G=2, prompt_len=4, L=4)))
  cells = {a: memory_table.run_cell(cfg, f"32x1 {a}", [0]) for a in ("grpo", "ppo_separate")}
  out = {a: cell["scalars"] for a, cell in cells.items()}
  # the compiled step's `auto` resolution is recorded with the cell (4-token completions: the static decoder)
  assert all(c["auto"]["sampling.engine"].startswith("static (max_new_tokens 4 < 256") for c in cells.values())
  assert "auto" not in memory_table.run_cell(cfg, "16x1 grpo", [0])  # nothing compiled, nothing resolved
  batch_mb = 3 * 2 * 4 * 4 / 1e6   # prompt, prompt mask (2×4), answer ids (2×4): int32
  for a, s in out.items():
    state_mb = s["trainable_MB"][0] + s["frozen_ref_MB"][0] + 12 / 1e6  # + step (int32) + rng (2×uint32)
    np.testing.assert_allclose(s["xla_args_MB"][0], state_mb + batch_mb, rtol=1e-6, err_msg=a)
    assert s["xla_temp_MB"][0] > 0
  assert out["ppo_separate"]["xla_args_MB"][0] > out["grpo"]["xla_args_MB"][0]


# ----------------------------------------------------------------- tables h, k, l (task_table) and i, j, m configs

TABLE_CONFIGS = ("entropy", "objectives", "lite_ppo_grid", "reasoning_boundary", "spurious_rewards", "one_shot")


@pytest.mark.parametrize("name", TABLE_CONFIGS)
def test_table_configs_load_and_every_variant_validates(name):
  """Both sizes of each new table load, and every variant's run config passes the run's validation (a bad key or
  value would stop the table only at its cell)."""
  import os
  from grpo_jax.studies import ablate
  path = os.path.join(os.path.dirname(__file__), "..", "configs", "ablations", f"{name}.py")
  for arg in (None, "small"):
    cfg = config_lib.load_config(path, arg)
    table = ablate.load_table(cfg)
    assert cfg.seeds == (5 if arg is None else cfg.seeds) and len(table.variants(cfg)) >= 2
    for _, overrides in cfg.variants:
      table.build_config(cfg, overrides)


def test_crossover_and_curve_by_hand():
  from grpo_jax.studies.ablations import task_table
  ks = [1, 2, 4, 8]
  # RL ahead at k = 1, 2; tied at 4; the base ahead from 8: the crossover is 8
  assert task_table.crossover_k(np.array([.5, .6, .7, .8]), np.array([.2, .4, .7, .9]), ks) == 8
  # RL ahead, dips below, ahead again, then the base ahead at the end: from the last k RL is not behind + 1
  assert task_table.crossover_k(np.array([.5, .3, .8, .8]), np.array([.2, .4, .7, .9]), ks) == 8
  assert task_table.crossover_k(np.array([.5, .4, .6, .8]), np.array([.2, .5, .7, .9]), ks) == 2
  assert np.isnan(task_table.crossover_k(np.array([.5, .6, .9, 1.]), np.array([.2, .4, .7, 1.]), ks))  # tie at n
  assert np.isnan(task_table.crossover_k(np.array([.1, .6, .9, .9]), np.array([.2, .4, .7, 1.]), ks))  # RL behind
  # two prompts, n = 4 samples: 1 and 0 right. pass@1 = (1/4 + 0)/2; pass@2 = (1 − C(3,2)/C(4,2))/2 = 1/4
  np.testing.assert_allclose(task_table.curve(np.array([1, 0]), 4, [1, 2, 4]), [0.125, 0.25, 0.5])


def test_saturation_readings_by_hand():
  """Table l's readings: the first step (1-based) whose training accuracy reaches cfg.saturation, the held-out
  accuracy at the first evaluation from that step on, its change to the end; nan without saturation."""
  from grpo_jax.studies.ablations import task_table
  cfg = ml_collections.ConfigDict({"saturation": 1.0})
  acc = np.array([[.5, .9, 1., .8, 1.], [.5, .5, .5, .5, .5]])
  held = np.array([[.1, .2, .4], [.1, .1, .1]])  # evaluations at steps 0, 3, 5
  out = task_table._saturation(cfg, acc, held, [0, 3, 5])
  assert out["saturation_step"][0] == 3 and out["heldout_at_saturation"][0] == .2
  np.testing.assert_allclose(out["heldout_after_saturation"][0], .4 - .2)
  assert all(np.isnan(out[k][1]) for k in out)


def test_task_table_cell_runs_end_to_end(tmp_path, monkeypatch):
  """One cell of the generated-task tables at a tiny size, through train.rl_loop: the SFT start (cached under the
  temp dir), a one-shot variant trained on the `random` reward with the true one measured at weight 0 and ProRL's
  reset every 2 updates, greedy held-out accuracy and pass@k curves of the base and the trained policy."""
  import tempfile
  from grpo_jax.studies.ablations import task_table
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  overrides = {**presets.overrides("grpo"), "task.train_indices": (3,), "rl.ref_reset_every": 2,
               "rewards": (("random", 1.0), ("accuracy", 0.0)), "rl.random_reward_rate": 0.5}
  cfg = task_table.table_config("small", (("one-shot random, reset", overrides),), passk_n=4)
  cfg.steps, cfg.eval_every, cfg.passk_prompts, cfg.passk_chunk, cfg.saturation = 3, 2, 2, 2, 1.0
  cell = task_table.run_cell(cfg, "one-shot random, reset", [0, 1])
  s, curves = cell["scalars"], cell["curves"]
  assert s["ref_resets"] == [1.0, 1.0]  # after update 2 of 3, in each seed
  assert curves["held-out greedy accuracy"]["x"] == [0, 2, 3]
  rand = np.asarray(curves["train reward: random"]["y"])
  assert rand.shape == (2, 3) and set(np.unique(rand * 8).tolist()) <= set(range(9))  # 2 prompts × G=4 coins
  assert 0 < rand.mean() < 1
  for name in ("pass@k of the base (step 0)", "pass@k after RL"):
    y = np.asarray(curves[name]["y"])
    assert curves[name]["x"] == [1, 2, 3, 4] and y.shape == (2, 4) and (np.diff(y, axis=1) >= -1e-12).all()
  assert {"pass@1_base", "pass@4", "pass@4_gain", "crossover_k", "saturation_step"} <= set(s)
  assert any(d.startswith("grpo_jax_task_start_") for d in os.listdir(tmp_path))
