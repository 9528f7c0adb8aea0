"""Table g (configs/ablations/gdpo.py): its `:small` variant through the harness, and its verdict's arithmetic.

The harness runs the GDPO cell only: the summed variant is the default rl_step path that test_rl_step and
test_seeds cover, and a second compile of the step would double the test's time (both run in the real table).
"""
import math
import os

import numpy as np
import pytest

from grpo_jax.studies import ablate
from grpo_jax.config import config_lib
from grpo_jax.studies.ablations import r1_table
from grpo_jax.studies import stats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg(arg=None):
  return config_lib.load_config(os.path.join(REPO, "configs", "ablations", "gdpo.py"), arg)


def test_variants_differ_only_in_the_reward_normalisation():
  cfg = _cfg()
  a, b = (r1_table.build_config(cfg, over) for _, over in cfg.variants)
  diff = {k for k in a.rl.keys() if a.rl[k] != b.rl[k]}
  assert diff == {"algo", "preset", "reward_norm"}, diff
  assert (a.rl.reward_norm, b.rl.reward_norm) == ("sum", "per_term")
  # The R1 multi-reward stage: accuracy + 0.5·format + 0.5·language; weight-0 statistics are left out.
  assert a.rewards == (("accuracy", 1.0), ("format", 0.5), ("language", 0.5))
  assert cfg.seeds == 5 and cfg.start_from == "cold_start" and a.train.steps == 60


def test_the_tables_reward_terms_are_the_pipelines():
  """r1_table built its reward spec with a private copy of train.reward_terms that passed no rl.reward_fallback (and no
  tools.env environment): a variant setting it ran other Python terms than the pipeline's stage. The shipped table's
  spec is unchanged: accuracy + 0.5 format + 0.5 language, in-graph terms, no fallback, no environment."""
  from grpo_jax.r1 import rewards as r1_rewards  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import train  # pylint: disable=g-import-not-at-top
  from grpo_jax.tasks import tokenizer_factory as tok_lib  # pylint: disable=g-import-not-at-top
  cfg = _cfg()
  c = r1_table.build_config(cfg, dict(cfg.variants)["gdpo (per term)"])
  tok = tok_lib.for_config(c)
  ours, theirs = r1_table.reward_terms(c, tok), train.reward_terms(c, tok, r1_rewards.config_fns(c))
  try:
    assert ours.names == theirs.names == ("accuracy", "format", "language")
    assert ours.weights == theirs.weights == (1.0, 0.5, 0.5)
    assert sorted(ours.python_terms) == sorted(theirs.python_terms) == ["language"]
    assert ours.python_terms["language"].fallback is None and ours.env is None and theirs.env is None
    assert (ours.ctx.task, ours.ctx.random_rate) == (theirs.ctx.task, theirs.ctx.random_rate)
  finally:
    ours.close()
    theirs.close()
  c = config_lib.override(c, {"rl.reward_fallback": "0.25"})  # as the pipeline's stage would run it
  ours = r1_table.reward_terms(c, tok)
  try:
    assert ours.python_terms["language"].fallback == 0.25
  finally:
    ours.close()


def test_small_table_runs_through_the_harness(tmp_path):
  cfg = _cfg("small")
  cfg.variants = cfg.variants[1:]
  md = ablate.run(cfg, str(tmp_path), command="test", log=lambda s: None)
  cell = ablate.run_cells(cfg, str(tmp_path), r1_table, log=lambda s: None)["gdpo (per term)"]  # loaded, not rerun
  S, steps = cfg.seeds, cfg.run.r1.grpo.steps
  for m in cfg.columns:
    assert len(cell["scalars"][m]) == S, m
  for term in ("accuracy", "format", "language"):
    c = cell["curves"][f"train reward: {term}"]
    assert c["x"] == list(range(1, steps + 1)) and np.asarray(c["y"]).shape == (S, steps)
    assert np.all((np.asarray(c["y"]) >= 0) & (np.asarray(c["y"]) <= 1))
  acc = cell["curves"]["held-out greedy accuracy"]
  assert acc["x"] == [0, steps]
  assert acc["y"][0][0] == acc["y"][1][0]  # one shared init: the seeds agree before training
  assert "Stage `r1_2_grpo` from one shared random init" in md
  assert "**Measured vs claim.**" not in md  # the verdict compares two variants; this run has one
  for f in ("table.md", "table.csv", "train_reward_language.png", "held-out_greedy_accuracy.png"):
    assert os.path.exists(os.path.join(tmp_path, f)), f


def test_verdict_states_difference_and_resolution():
  cfg = _cfg()
  s = {"grpo (summed)": {"heldout_accuracy_final": stats.summarize([0.40, 0.42, 0.41, 0.43, 0.39])},
       "gdpo (per term)": {"heldout_accuracy_final": stats.summarize([0.50, 0.52, 0.51, 0.53, 0.49])}}
  d = stats.resolvable_difference(list(x["heldout_accuracy_final"] for x in s.values()))
  assert math.isfinite(d) and d < 0.1
  v = r1_table.verdict(cfg, s)
  assert f"heldout_accuracy_final: gdpo (per term) − grpo (summed) = +0.1 (resolution ±{d:.2g}: resolved)" in v
  s["gdpo (per term)"]["heldout_accuracy_final"] = stats.summarize([0.41, 0.43, 0.40, 0.42, 0.40])
  assert "not resolved" in r1_table.verdict(cfg, s)


def test_bad_start_is_named():
  cfg = _cfg("small")
  cfg.start_from = "warm"
  with pytest.raises(ValueError, match="start_from='warm'"):
    r1_table.start_params(cfg, None)
