"""The ablation harness: t-quantiles and CI math against hard-coded values, table files, resume without recomputing."""
import csv
import json
import math
import os
import re

import ml_collections
import numpy as np
import pytest

from grpo_jax.studies import ablate
from grpo_jax.studies import report
from grpo_jax.studies import stats

# Student t quantiles t_{0.975, df} (two-sided 95%) from published tables, to 9 significant digits.
T975 = {1: 12.7062047, 2: 4.30265273, 3: 3.18244631, 4: 2.77644511, 5: 2.57058184, 9: 2.26215716,
        10: 2.22813885, 30: 2.04227246}


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_table(df):
  assert stats.t_quantile(0.975, df) == pytest.approx(T975[df], abs=2e-7)


def test_t_quantile_other_levels_and_symmetry():
  assert stats.t_quantile(0.95, 4) == pytest.approx(2.13184679, abs=2e-7)
  assert stats.t_quantile(0.995, 2) == pytest.approx(9.92484320, abs=2e-6)
  assert stats.t_quantile(0.025, 3) == pytest.approx(-T975[3], abs=2e-7)
  assert stats.t_cdf(0.0, 7) == pytest.approx(0.5, abs=1e-12)
  with pytest.raises(ValueError, match="df"):
    stats.t_quantile(0.975, 0)
  # Quantiles beyond the old fixed bisection bracket (±1e3, where it returned 1e3): one df is the Cauchy
  # distribution, t_q = tan(π(q − 1/2)) exactly; two df have t_q = (2q − 1)·√(2 / (4q(1 − q))).
  for q in (0.99999, 0.999999, 1e-6):
    assert stats.t_quantile(q, 1) == pytest.approx(math.tan(math.pi * (q - 0.5)), rel=1e-9)
  q = 1 - 1e-8
  assert stats.t_quantile(q, 2) == pytest.approx((2 * q - 1) * math.sqrt(2 / (4 * q * (1 - q))), rel=1e-6)


def test_summarize_by_hand():
  s = stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
  sd = math.sqrt(2.5)
  assert (s.n, s.mean) == (5, 3.0)
  assert s.std == pytest.approx(sd)
  assert s.half_width == pytest.approx(T975[4] * sd / math.sqrt(5), rel=1e-7)
  one = stats.summarize([7.0])
  assert one.n == 1 and math.isnan(one.half_width) and one.fmt() == "7"
  # A NaN seed is dropped, not averaged in.
  assert stats.summarize([1.0, float("nan"), 3.0]).n == 2


def test_band_and_resolvable_difference():
  y = np.array([[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]])
  mean, hw = stats.band(y)
  np.testing.assert_allclose(mean, [2.0, 1.0])
  np.testing.assert_allclose(hw, [T975[2] * 2.0 / math.sqrt(3), 0.0], rtol=1e-7)
  # a seed with nothing measured at a step (NaN: no right answer to take a length of) is left out of that column,
  # not averaged in as 0 (train_table's length curves were nan_to_num'd: seeds 10 and none plotted 5)
  mean, hw = stats.band(np.array([[10.0, np.nan, np.nan], [np.nan, 4.0, np.nan], [14.0, 6.0, np.nan]]))
  np.testing.assert_allclose(mean[:2], [12.0, 5.0])
  assert np.isnan(mean[2]) and hw[2] == 0.0
  np.testing.assert_allclose(hw[:2], [T975[1] * np.std([10, 14], ddof=1) / math.sqrt(2),
                                      T975[1] * np.std([4, 6], ddof=1) / math.sqrt(2)], rtol=1e-7)
  a, b = stats.summarize([1.0, 2.0, 3.0]), stats.summarize([5.0, 6.0, 7.0])
  # Equal variances s² = 1, n = 3: t_{0.975, 4}·√(2/3).
  assert stats.resolvable_difference([a, b]) == pytest.approx(T975[4] * math.sqrt(2 / 3), rel=1e-7)


# --------------------------------------------------------------------------------------------- harness


class FakeTable:
  """A table whose cells are known numbers; counts how often each cell really runs."""
  TITLE = "fake"
  CLAIM = "b beats a"

  def __init__(self, fail_on: str = ""):
    self.calls: list[str] = []
    self.fail_on = fail_on

  def variants(self, cfg):
    return ["a", "b", "c=1"]

  def run_cell(self, cfg, variant, seeds):
    if variant == self.fail_on:
      raise KeyboardInterrupt  # an interrupted run
    self.calls.append(variant)
    off = {"a": 0.0, "b": 10.0, "c=1": 20.0}[variant]
    return {"scalars": {"acc": [off + s for s in seeds], "const": [1.0] * len(seeds)},
            "curves": {"train/reward": {"x": [0, 1, 2], "y": [[off, off + s, off + 2 * s] for s in seeds]}}}

  def verdict(self, cfg, summ):
    return "b > a" if summ["b"]["acc"].mean > summ["a"]["acc"].mean else "no"


def _cfg(seeds=5):
  return ml_collections.ConfigDict(dict(table="fake", seeds=seeds, columns=("acc",)))


def test_writes_md_csv_png_with_correct_ci(tmp_path):
  t = FakeTable()
  md = ablate.run(_cfg(), str(tmp_path), command="cmd", table=t, log=lambda s: None)
  assert t.calls == ["a", "b", "c=1"]
  rows = list(csv.DictReader(open(tmp_path / "table.csv")))
  got = {(r["variant"], r["metric"]): r for r in rows}
  hw = T975[4] * math.sqrt(2.5) / math.sqrt(5)   # seeds 0..4: sd √2.5
  r = got[("b", "acc")]
  assert int(r["n"]) == 5 and float(r["mean"]) == pytest.approx(12.0)
  assert float(r["ci95_half_width"]) == pytest.approx(hw, rel=1e-7)
  assert float(r["ci95_low"]) == pytest.approx(12.0 - hw, rel=1e-7)
  assert float(got[("a", "const")]["ci95_half_width"]) == 0.0
  assert f"| b | 12 ± {hw:.2g} |" in md and "b > a" in md and "cmd" in md
  assert "Smallest difference" in md
  png = tmp_path / "train_reward.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert (tmp_path / "table.md").read_text() == md


def test_a_table_started_as_a_process_of_a_multi_process_job_is_refused_before_any_cell(tmp_path, monkeypatch):
  """Under GRPO_JAX_DISTRIBUTED=1 every process ran every cell and wrote cells/, table.md, table.csv: one line now,
  before a cell runs or a file is written (multihost.refuse_multi_process, as the sweep)."""
  from grpo_jax.infra import errors
  monkeypatch.setenv("GRPO_JAX_DISTRIBUTED", "1")
  t = FakeTable()
  with pytest.raises(errors.InputError, match=r"^GRPO_JAX_DISTRIBUTED=1: python -m grpo_jax.ablate runs its cells' "
                     r"runs in one process, .*; unset GRPO_JAX_DISTRIBUTED and run the table once, from one process.$"):
    ablate.run(_cfg(), str(tmp_path / "t"), table=t, log=lambda s: None)
  assert t.calls == [] and not os.path.exists(tmp_path / "t")


def test_each_cells_auto_resolution_is_kept_with_its_outputs(tmp_path):
  """A cell's `auto` record (what its runs resolved: auto.resolve's {key: 'value (why)'}) stays in its cell file and
  is gathered per variant in DIR/auto.json, as a main run records its own; a loaded cell keeps its record; a record
  that is no such mapping is refused."""

  class Resolving(FakeTable):
    def run_cell(self, cfg, variant, seeds):
      return dict(super().run_cell(cfg, variant, seeds), **({} if variant == "c=1" else {"auto": {
          "sampling.engine": f"static (why {variant})", "rl.minibatches": "1 (fits)"}}))

  ablate.run(_cfg(2), str(tmp_path), table=Resolving(), log=lambda s: None)
  want = {v: {"rl.minibatches": "1 (fits)", "sampling.engine": f"static (why {v})"} for v in ("a", "b")}
  assert json.load(open(tmp_path / "cells" / "a.json"))["cell"]["auto"] == want["a"]
  assert json.load(open(tmp_path / "auto.json")) == want  # c=1 resolved nothing: no entry
  os.remove(tmp_path / "auto.json")
  t = Resolving()
  ablate.run(_cfg(2), str(tmp_path), table=t, log=lambda s: None)
  assert t.calls == [] and json.load(open(tmp_path / "auto.json")) == want  # from the loaded cells

  class Bad(FakeTable):
    def run_cell(self, cfg, variant, seeds):
      return dict(super().run_cell(cfg, variant, seeds), auto={"rl.minibatches": 1})
  with pytest.raises(ValueError, match=r"table cell 'a': 'auto' must map each resolved key to 'value \(why\)'"):
    ablate.run(_cfg(2), str(tmp_path / "bad"), table=Bad(), log=lambda s: None)


def test_resume_skips_finished_cells(tmp_path):
  t1 = FakeTable(fail_on="c=1")
  with pytest.raises(KeyboardInterrupt):
    ablate.run(_cfg(), str(tmp_path), table=t1, log=lambda s: None)
  assert t1.calls == ["a", "b"]
  assert not (tmp_path / "table.md").exists()
  t2 = FakeTable()
  md = ablate.run(_cfg(), str(tmp_path), table=t2, log=lambda s: None)
  assert t2.calls == ["c=1"]  # only the unfinished cell ran
  t3 = FakeTable()
  md3 = ablate.run(_cfg(), str(tmp_path), table=t3, log=lambda s: None)
  assert t3.calls == [] and md3.split("\n", 6)[6] == md.split("\n", 6)[6]  # same table, only the timing differs


def test_a_directory_another_command_holds_is_refused_before_any_cell(tmp_path):
  """Two tables (or a table and a run) on one directory would write the same cells and table files: the second is
  refused naming the holder, nothing of it is written, and the directory is free again once the holder is done."""
  from grpo_jax.infra import errors
  from grpo_jax.infra import workdir_lock
  held = workdir_lock.WorkdirLock(str(tmp_path))
  held.acquire_local()
  t = FakeTable()
  try:
    with pytest.raises(errors.InputError, match=f"workdir {tmp_path} is in use by another run \\(pid {os.getpid()}"):
      ablate.run(_cfg(), str(tmp_path), table=t, log=lambda s: None)
  finally:
    held.release()
  assert t.calls == [] and not (tmp_path / "cells").exists() and not (tmp_path / "table.md").exists()
  ablate.run(_cfg(), str(tmp_path), table=t, log=lambda s: None)
  assert t.calls == ["a", "b", "c=1"] and (tmp_path / "table.md").exists()


def test_cells_from_another_config_are_refused(tmp_path):
  ablate.run(_cfg(), str(tmp_path), table=FakeTable(), log=lambda s: None)
  with pytest.raises(ValueError, match="different config"):
    ablate.run(_cfg(seeds=3), str(tmp_path), table=FakeTable(), log=lambda s: None)


def test_rows_sharing_a_cell_file_are_refused(tmp_path):
  """'x y' and 'x_y' were both written to cells/x_y.json: the second row loaded the first's cell and showed its
  numbers without running (and both did on every rerun)."""
  class Clash(FakeTable):
    def variants(self, cfg):
      return ["x y", "x_y"]
  for names in (["x y", "x_y"], ["a", "a"], ["Ab", "aB"]):
    Clash.variants = lambda self, cfg, names=names: names
    t = Clash()
    with pytest.raises(ValueError, match="share the cell file"):
      ablate.run(_cfg(), str(tmp_path / names[1]), table=t, log=lambda s: None)
    assert t.calls == []
  # a cell file whose recorded variant is another row's (a case-insensitive file system) is not loaded as this row
  ablate.run(_cfg(), str(tmp_path / "ok"), table=FakeTable(), log=lambda s: None)
  os.replace(tmp_path / "ok" / "cells" / "a.json", tmp_path / "ok" / "cells" / "b.json")
  with pytest.raises(ValueError, match="holds the cell of variant 'a', not 'b'"):
    ablate.run(_cfg(), str(tmp_path / "ok"), table=FakeTable(), log=lambda s: None)


def test_bad_cell_shape_is_named(tmp_path):
  class Bad(FakeTable):
    def run_cell(self, cfg, variant, seeds):
      return {"scalars": {"acc": [1.0]}, "curves": {}}
  with pytest.raises(ValueError, match="'acc' has 1 values for 5 seeds"):
    ablate.run(_cfg(), str(tmp_path), table=Bad(), log=lambda s: None)


def test_a_pipe_in_a_row_or_metric_name_keeps_the_table_shape():
  """A row named 'a|b' (a sweep point h.named('a|b')) gave its markdown row one column too many."""
  cells = {"a|b": {"scalars": {"x|y": [1.0, 3.0]}, "curves": {}}, "c": {"scalars": {"x|y": [2.0, 2.0]}, "curves": {}}}
  md = report.markdown(cells, title="t", claim="")
  table = [l for l in md.splitlines() if l.startswith("|")]
  assert table[0] == "| variant | x\\|y |" and table[2].startswith("| a\\|b | 2 ± ")
  assert {len(l.replace("\\|", "").split("|")) for l in table} == {4}


def test_a_cell_over_fewer_seeds_than_it_ran_says_so():
  """stats.summarize leaves non-finite seeds out (a seed with no wrong answer has no wrong-answer length): the cell
  read 0.55 ± 0.64 for 2 of 3 seeds, like a row over 3. Now the count follows; full cells stay as they were."""
  cells = {"a": {"scalars": {"acc": [0.5, 0.6, float("nan")], "len": [3.0, 4.0, 5.0]}},
           "b": {"scalars": {"acc": [float("nan")] * 3, "len": [3.0, 3.0, 3.0]}}}
  md = report.markdown(cells, title="t", claim="")
  # t(0.975, 1) = 12.7062: 12.7062 · std(0.5, 0.6) / √2 = 0.635 (hand-computed)
  assert "| a | 0.55 ± 0.64 (2 of 3 seeds) | 4 ± 2.5 |" in md, md
  assert "| b | nan (0 of 3 seeds) | 3 ± 0 |" in md and "(k of n seeds)" in md
  full = report.markdown({"a": {"scalars": {"len": [3.0, 4.0, 5.0]}}}, title="t", claim="")
  assert "seeds)" not in full and "over n = 3 seeds." in full


def test_curves_whose_names_reduce_alike_get_their_own_png(tmp_path):
  """A curve's file name was its name with every other character made '_': `sft:eval/accuracy` and
  `sft/eval/accuracy` (or two names differing in case, on macOS) wrote one PNG, the second over the first, and
  the report linked it twice. A name no other shares keeps its plain file name (the docs link to those)."""
  curve = lambda y: {"x": [0, 1], "y": [[y, y + 1.0], [y, y + 2.0]]}
  names = ["sft:eval/accuracy", "sft/eval/accuracy", "Eval/Acc", "eval/acc", "train/reward"]
  cells = {"a": {"scalars": {}, "curves": {m: curve(float(i)) for i, m in enumerate(names)}}}
  pngs = report.write_plots(str(tmp_path), cells)
  assert len(pngs) == len(set(p.lower() for p in pngs)) == 5
  assert sorted(os.listdir(tmp_path)) == sorted(pngs) and pngs[-1] == "train_reward.png"
  assert pngs[0].startswith("sft_eval_accuracy-") and pngs[1].startswith("sft_eval_accuracy-")
  assert report.write_plots(str(tmp_path), cells) == pngs  # the same names on every write (a hash, not an order)


def test_single_run_cells_say_exact():
  md = report.markdown({"x": {"scalars": {"bytes": [10.0]}}}, title="t", claim="c")
  assert "| x | 10 |" in md and "exact" in md


def test_a_set_split_over_the_seeds_share_is_refused_before_the_first_cell(tmp_path, monkeypatch):
  """A variant's S seeds share one device in one vmapped program: rl.minibatches set by hand was never checked
  against 1/S of it (auto values are planned so): on this pretend-small device the old code ran the whole table
  (on a real one: out of memory at that variant's compile, after the cells before it). Now one line naming the
  variant, before anything is written."""
  from grpo_jax.config import config_lib
  from grpo_jax.config import presets
  from grpo_jax.rl import auto, memory_plan
  from grpo_jax.rollout import decode_layout
  from grpo_jax.studies.ablations import train_table
  g = {**presets.overrides("grpo"), "rl.mu": 2}
  cfg = train_table.table_config("small", (("mb2", {**g, "rl.minibatches": 2}), ("mb1", {**g, "rl.minibatches": 1})))
  one = train_table.build_config(cfg, dict(cfg.variants)["mb1"])
  need = memory_plan.plan(config_lib.override(one, {"rl.rollout_chunks": 1}),
                         dict(data=1, fsdp=1, tensor=1)).total_bytes
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [need * int(cfg.seeds) - 1])  # mb1's seeds: one byte short
  with pytest.raises(config_lib.ConfigError, match=r"^variant 'mb1': config.rl.rollout_chunks=1, rl.minibatches=1 "
                                                   r"\(set\): .* set rl.minibatches=2 .*"
                                                   r"\(its \d+ seeds share one device: 1/\d+ of its memory each\)"):
    ablate.run(cfg, str(tmp_path / "t"), table=train_table, log=lambda s: None)
  assert not os.path.exists(tmp_path / "t")
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [need * int(cfg.seeds)])
  ablate.check_memory(cfg, train_table)  # fits exactly
  # table a (kl_estimators) trains its seeds as the training tables do, but had no build_config: never checked
  kl = config_lib.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                           "ablations", "kl_estimators.py"), "small")
  kl.run = config_lib.override(kl.run, {"rl.rollout_chunks": 1, "rl.minibatches": 1})
  first = train_table.build_config(kl, kl.variants[0][1])  # what its cells train
  monkeypatch.setattr(ablate, "run_cells", lambda *a, **k: pytest.fail("the cells ran: the memory was not checked"))
  need = memory_plan.plan(first, dict(data=1, fsdp=1, tensor=1)).total_bytes
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [need * int(kl.seeds) - 1])
  with pytest.raises(config_lib.ConfigError, match=rf"^variant '{kl.variants[0][0]}': config.rl.rollout_chunks=1, "
                                                   r"rl.minibatches=1 \(set\): "):
    ablate.run(kl, str(tmp_path / "kl"), log=lambda s: None)  # its table module, as the command loads it
  assert not os.path.exists(tmp_path / "kl")
  del auto


def test_rows_that_can_only_be_identical_are_refused_before_running(tmp_path):
  """Variants that differ only in a clip range (or SAPO's temperatures, or the objective) while every update is
  on-policy (μ 1, one minibatch: ρ ≡ 1) are refused, naming the rows and the fix; with μ 2 the same variants are
  accepted; and every shipped ablation table passes the check."""
  import glob
  from grpo_jax.config import config_lib
  from grpo_jax.config import presets
  from grpo_jax.studies.ablations import train_table
  g = presets.overrides("grpo")
  cfg = train_table.table_config("small", (("clip", g), ("clip-higher", {**g, "rl.eps_high": 0.28})))
  with pytest.raises(ValueError, match=r"'clip' and 'clip-higher' differ only in rl.eps_high.*rl.mu=2"):
    ablate.run(cfg, str(tmp_path / "t"), table=train_table)
  assert not os.path.exists(tmp_path / "t")  # refused before anything is written
  sapo = presets.overrides("sapo")
  cfg = train_table.table_config("small", (("a", sapo), ("b", {**sapo, "rl.sapo_tau_neg": 2.0})))
  with pytest.raises(ValueError, match="rl.sapo_tau_neg"):
    ablate.check_variants(cfg, train_table)
  # the objective alone: clip, CISPO and SAPO (and GSPO's sequence ratio) all give A·∇log π at ρ = 1
  for over in ({"rl.objective": "sapo"}, {"rl.objective": "cispo", "rl.eps_low": 1.0}, {"rl.ratio_level": "sequence"}):
    cfg = train_table.table_config("small", (("grpo", g), ("other", {**g, **over})))
    with pytest.raises(ValueError, match=f"differ only in {', '.join(sorted(over))}, which act through the ratio"):
      ablate.check_variants(cfg, train_table)
  # KL-Cov too: its penalty coef·|log π − log π_old| is 0 with a zero gradient on-policy, so a kl_cov row trained as
  # GRPO's (the check let it through); top_entropy and clip_cov act on-policy and pass
  for over in ({"rl.token_select": "kl_cov"}, {"rl.token_select": "kl_cov", "rl.kl_cov_coef": 2.0}):
    cfg = train_table.table_config("small", (("grpo", g), ("kl_cov", {**g, **over})))
    with pytest.raises(ValueError, match=f"differ only in {', '.join(sorted(over))}, which act through the ratio"):
      ablate.check_variants(cfg, train_table)
  for over in ({"rl.token_select": "top_entropy"}, {"rl.token_select": "clip_cov"}):
    ablate.check_variants(train_table.table_config("small", (("grpo", g), ("sel", {**g, **over}))), train_table)
  # the rollout carry too: carried tokens lag μ, not π_old, which one update takes at the policy itself (ρ ≡ 1,
  # train/ratio_mean exactly 1 in test_carry); the check let it through, the rows came out identical
  carry = {"sampling.engine": "continuous", "rl.partial_rollouts": True}
  cfg = train_table.table_config("small", (("clip", {**g, **carry}), ("clip-higher", {**g, **carry, "rl.eps_high": 0.28})))
  with pytest.raises(ValueError, match="'clip' and 'clip-higher' differ only in rl.eps_high"):
    ablate.check_variants(cfg, train_table)
  for mu in ({"rl.mu": 2}, {"rl.minibatches": 2}):
    cfg = train_table.table_config("small", (("clip", {**g, **mu}), ("clip-higher", {**g, **mu, "rl.eps_high": 0.28})))
    ablate.check_variants(cfg, train_table)
  shipped = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs", "ablations", "*.py")))
  assert len(shipped) >= 13
  for path in shipped:
    cfg = config_lib.load_config(path)
    ablate.check_variants(cfg, ablate.load_table(cfg))


@pytest.mark.parametrize("over,needle", [
    ({"steps": 0}, "config.steps=0: must be an integer >= 1"),  # trained every row, then an IndexError
    ({"eval_every": 0}, "config.eval_every=0: must be an integer >= 1"),  # a ZeroDivisionError in the first row
    ({"steps": -3}, "config.steps=-3"), ({"base_steps": -1}, "config.base_steps=-1: must be an integer >= 0"),
    ({"p_correct": 1.5}, "config.p_correct=1.5: must be a number in [0, 1]"),
    ({"p_correct": float("nan")}, "config.p_correct=nan"), ({"seeds": 0}, "config.seeds=0: need an integer"),
    ({"run.rl.select_frac": 2.0}, "config.rl.select_frac: must be a fraction in (0, 1]"),  # ran every row with it
    ({"run.optim.lr": float("nan")}, "config.optim.lr: must be a finite learning rate"),
    ({"run.sampling.top_p": 1.5}, "config.sampling.top_p"), ({"run.sampling.exit_chunk": -5},
                                                               "config.sampling.exit_chunk")])
def test_a_bad_table_or_run_value_is_one_line_before_any_row(tmp_path, monkeypatch, over, needle):
  """A training table's own keys (steps, eval_every, the base's) and its run config's are checked as `main` checks
  a run's, before any row: the run config was checked only for its preset and algorithm, so
  --config.run.rl.select_frac=2 trained every row with it, and --config.steps=0 / eval_every=0 ran the first row
  (or all of them) before a traceback."""
  from grpo_jax.config import config_lib
  from grpo_jax.config import presets
  from grpo_jax.studies.ablations import train_table
  g = {**presets.overrides("grpo"), "rl.mu": 2}
  cfg = train_table.table_config("small", (("a", g), ("b", {**g, "rl.eps_high": 0.28})))
  for key, value in over.items():
    *parents, leaf = key.split(".")
    node = cfg
    for part in parents:
      node = node[part]
    node[leaf] = value
  monkeypatch.setattr(ablate, "run_cells", lambda *a, **k: pytest.fail("a row ran with a bad value"))
  with pytest.raises(config_lib.ConfigError) as e:
    ablate.run(cfg, str(tmp_path / "t"), table=train_table, log=lambda s: None)
  assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert not os.path.exists(tmp_path / "t")


@pytest.mark.parametrize("table,over,needle", [
    ("baselines", {"Gs": (0,)}, "config.Gs=(0,): give group sizes, each an integer >= 2"),  # was an IndexError
    ("baselines", {"Gs": (1, 2)}, "config.Gs=(1, 2)"),  # was 'raise rl.G', a key the table has not
    ("memory", {"sizes": ("0x8",), "compile_sizes": ()}, "config.sizes: '0x8' is not '<hidden>x<layers>'"),
    ("memory", {"compile_sizes": ("64x2",)}, "config.compile_sizes: '64x2' is not among config.sizes"),
    # table h's pass@k prompts past its test split: refused only after the start policy trained, naming eval.size
    ("reasoning_boundary", {"passk_prompts": 17}, "config.passk_prompts=17 exceeds the test split's "
                                                  "run.task.test_size=16 prompts")])
def test_tables_b_c_h_refuse_bad_sizes_before_any_row(tmp_path, monkeypatch, table, over, needle):
  """Table b's group sizes, table c's model sizes and table h's pass@k prompts, checked before any row: Gs=0 was an
  IndexError traceback (exit 1), '0x8' a ValueError naming no key, a compile size outside `sizes` compiled nothing,
  passk_prompts past the test split a line naming eval.size after the start policy had trained (39 s here)."""
  from grpo_jax.config import config_lib
  cfg = config_lib.load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "ablations", f"{table}.py"),
                               "small")
  cfg.update(over)
  monkeypatch.setattr(ablate, "run_cells", lambda *a, **k: pytest.fail("a row ran with a bad value"))
  with pytest.raises(config_lib.ConfigError, match=re.escape(needle)):
    ablate.run(cfg, str(tmp_path / "t"), log=lambda s: None)
  assert not os.path.exists(tmp_path / "t")


def test_table_f_process_rows_pass_the_run_checks_with_the_toys_step_term():
  """rl.process_weight needs a reward term that scores steps: the toy's is 'proc' (digits.TOY_STEP_TERMS), not main's
  'process', so table f's outcome+process rows are accepted and a process weight without it is still refused."""
  from grpo_jax.config import config_lib
  from grpo_jax.studies.ablations import train_table
  cfg = config_lib.load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "ablations",
                                            "reward_design.py"), "small")
  for _, over in cfg.variants:
    train_table.build_config(cfg, over)
  with pytest.raises(config_lib.ConfigError, match=r"config.rl.process_weight: .*\('proc'\); add \('proc', w\)"):
    train_table.build_config(cfg, {**dict(cfg.variants)["grpo / outcome+process"], "rewards": (("acc", 1.0),)})


def test_a_command_line_run_key_a_row_overrides_is_said(caplog):
  """Each preset row sets every rl.* key its preset does, over config.run: --config.run.rl.beta=0.1 on table j
  changed no row, without a word. Now one warning naming the key and the rows it does not reach; a key no row sets,
  or one a row sets to the same value, is not named."""
  import logging
  from grpo_jax.config import presets
  from grpo_jax.studies.ablations import train_table
  g = {**presets.overrides("grpo"), "rl.mu": 2}
  cfg = train_table.table_config("small", (("a", g), ("b", {**g, "rl.beta": 0.1}), ("c", {**g, "rl.beta": 0.0})))
  cfg.run.rl.beta, cfg.run.rl.G = 0.1, 4
  with caplog.at_level(logging.WARNING):
    ablate.overridden_cli_keys(cfg, {"rl.beta", "rl.G"})
  said = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
  assert said == ["config.run.rl.beta=0.1 (the command line's): no effect in row(s) 'a', 'c', whose own overrides "
                  "set rl.beta (the table's variants are applied over config.run); change the rows in the table's "
                  "config to vary it."], said


def test_command_line_errors_are_named():
  """A stray argument was ignored, a missing --config was a traceback, a missing --workdir exited 1, not 2."""
  cfg = ml_collections.ConfigDict({"table": "x"})
  assert ablate.usage_error(["ablate", "x"], cfg, "/tmp/w") == "unexpected argument 'x'; see --helpfull."
  assert ablate.usage_error(["ablate"], None, "/tmp/w").startswith("--config is required")
  assert ablate.usage_error(["ablate"], cfg, "").startswith("--workdir is required")
  assert ablate.usage_error(["ablate"], cfg, "/tmp/w") == ""
  # an object-store DIR wrote the table into a local directory gs:/b (the run's checks: preflight.check_workdir)
  assert ablate.usage_error(["ablate"], cfg, "gs://b/t").startswith("--workdir=gs://b/t: an object-store workdir is "
                                                                     "not supported")


def test_a_config_file_that_does_not_load_is_one_line(tmp_path):
  """The real CLI: a missing config file was absl's 45-line traceback (exit 1); now main's one line, exit 2."""
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-m", "grpo_jax.ablate", "--config=configs/ablations/nope.py",
                        f"--workdir={tmp_path / 'w'}"], cwd=root, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu"))
  assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
  assert out.stderr.startswith("Error: --config:") and "configs/ablations/nope.py" in out.stderr
  assert not os.path.exists(tmp_path / "w")


_SIGTERM_IN_ROW_1 = """
import os, runpy, signal, sys
from grpo_jax.studies.ablations import baselines_table
real = baselines_table.run_cell
def run_cell(cfg, variant, seeds):
  if variant == "G=4 none":
    os.kill(os.getpid(), signal.SIGTERM)  # handled before the row goes on: the row is under way when asked to stop
  return real(cfg, variant, seeds)
baselines_table.run_cell = run_cell
sys.argv[0] = "ablate"
runpy.run_module("grpo_jax.studies.ablate", run_name="__main__", alter_sys=True)
"""


def test_a_table_stopped_by_sigterm_or_a_closed_console_keeps_its_rows_and_resumes_to_the_uninterrupted_table(
    tmp_path):
  """The real CLI, as `python -m grpo_jax.main` stops (cli.start, signals.GracefulStop, cli.exit_on): a SIGTERM
  between rows killed the table (a signal in a row's training loop was a Preempted traceback, exit 1), and a closed
  console raised BrokenPipeError at the next progress line. Now both finish the row under way (table b's rows are
  no training loop: the row is saved), start no other, exit 0 with one line naming the row that did not start and
  the rows kept; the reruns resume from them and the finished table equals an uninterrupted one. (A stop inside a
  row's training loop: test_ablation_tables' test_a_table_stopped_in_a_cell_resumes_at_that_cell_...)
  Run 1: a real SIGTERM while row 1 runs (sent by the process to itself as row 1 starts: a signal from outside
  could land before the row, whose programs the suite's compilation cache may load in no time): row 1 kept. Run 2:
  its console is gone before its first line (the reader of its pipe exited, as `| head -0`; a reader that leaves
  after a line races the next one): the line that row 1 was loaded finds it closed, no row starts."""
  import subprocess
  import sys
  from grpo_jax.config import config_lib
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sizes = {"Gs": (4,), "seeds": 2, "n_draws": 200}  # four rows: G=4 × the four baselines
  wd = tmp_path / "table"
  argv = [sys.executable, "-m", "grpo_jax.ablate", "--config=configs/ablations/baselines.py:small", f"--workdir={wd}",
          "--config.Gs=4,", "--config.seeds=2", "--config.n_draws=200"]
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  rows = ["G=4 none", "G=4 loo", "G=4 mean", "G=4 mean_std"]
  cell_files = lambda: sorted(os.listdir(wd / "cells"))

  def start(i, script=None, stdout=subprocess.PIPE):
    err = open(tmp_path / f"err{i}.txt", "w+")  # stderr to a file: the test closes stdout only
    cmd = argv if script is None else [argv[0], "-c", script] + argv[3:]
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=stdout, stderr=err, text=True), err

  def last_line(p, err):
    assert p.wait(timeout=120) == 0, open(err.name).read()[-3000:]
    lines = open(err.name).read().strip().splitlines()
    assert "Traceback" not in "\n".join(lines), lines[-30:]
    return lines[-1]

  p, err = start(1, _SIGTERM_IN_ROW_1)
  out = p.stdout.read()
  assert last_line(p, err) == (f"Preempted: stopped by a signal before row 'G=4 loo' of table {wd}; 1 of 4 rows "
                               f"finished and kept in {wd / 'cells'}. Rerun the same command to resume.")
  assert "SIGTERM received" in open(err.name).read()
  assert len(out.splitlines()) == 1 and out.startswith("[ablate] G=4 none: "), out  # row 1 ran, no table printed
  assert cell_files() == ["G=4_none.json"] and not (wd / "table.md").exists()

  read_end, write_end = os.pipe()
  p, err = start(2, stdout=write_end)
  os.close(write_end)
  os.close(read_end)  # the console is gone: the table's first line (row 1 loaded) finds it closed
  assert last_line(p, err) == (f"Preempted: stopped by a signal before row 'G=4 loo' of table {wd}; 1 of 4 rows "
                               f"finished and kept in {wd / 'cells'}. Rerun the same command to resume.")
  assert "the console closed" in open(err.name).read()
  assert cell_files() == ["G=4_none.json"] and not (wd / "table.md").exists()

  cfg = config_lib.override(config_lib.load_config(os.path.join(root, "configs/ablations/baselines.py"), "small"),
                            sizes)
  ran = []
  log = lambda s: ran.append(s.split(":")[0].removeprefix("[ablate] ") + (" loaded" if "loaded" in s else ""))
  md = ablate.run(cfg, str(wd), log=log)  # the rerun: row 1 loaded, 2-4 run
  assert ran == ["G=4 none loaded", "G=4 loo", "G=4 mean", "G=4 mean_std"]
  ref = ablate.run(cfg, str(tmp_path / "ref"), log=lambda s: None)  # uninterrupted
  assert open(wd / "table.csv").read() == open(tmp_path / "ref" / "table.csv").read()
  timing = lambda m: [x for x in m.splitlines() if not x.startswith("Measured ")]  # this invocation's seconds
  assert timing(md) == timing(ref)
  assert [r for r in rows if r in md] == rows
