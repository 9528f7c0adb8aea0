"""The R1 report over seeds (r1/seeds_report.py): per-stage mean ± 95% CI against NumPy and the t table, the
resolution, and each verdict on hand-built report.json files whose outcome is known."""
import json
import math
import os

import numpy as np
import pytest

from grpo_jax.r1 import seeds_report

T4 = 2.7764451051977987  # t_{0.975, 4}
T8 = 2.3060041352041662  # t_{0.975, 8}


def _runs(tmp_path, acc: dict, harm: dict):
  dirs = []
  for i in range(5):
    d = tmp_path / f"seed={i}"
    d.mkdir()
    rep = {s: {"accuracy_last_number": acc[s][i], "forbidden_rate_sampled": harm.get(s, [0.0] * 5)[i]} for s in acc}
    (d / "report.json").write_text(json.dumps(rep))
    dirs.append(str(d))
  return dirs


OFFSET = [0.0, 0.02, -0.02, 0.01, -0.01]  # every stage's seed spread: std = sqrt(0.001 / 4)


def _acc(means):
  return {s: [m + o for o in OFFSET] for s, m in means.items()}


def test_table_and_verdicts_hold(tmp_path):
  acc = _acc({"base": 0.2, "r1_zero": 0.3, "r1_4_sft": 0.5, "r1_5_final": 0.49})
  harm = {"r1_4_sft": [0.10, 0.12, 0.08, 0.11, 0.09], "r1_5_final": [0.01, 0.0, 0.02, 0.0, 0.02]}
  md = seeds_report.write(str(tmp_path), _runs(tmp_path, acc, harm))
  js = json.loads((tmp_path / "r1_seeds.json").read_text())
  assert js["n"] == 5
  sd = math.sqrt(0.001 / 4)
  cell = js["stages"]["r1_zero"]["accuracy_last_number"]
  np.testing.assert_allclose([cell["mean"], cell["std"], cell["half_width"]], [0.3, sd, T4 * sd / math.sqrt(5)])
  res = T8 * math.sqrt(2 * sd ** 2 / 5)  # equal spreads: the median variance is sd²
  np.testing.assert_allclose(js["resolution"]["accuracy_last_number"], res)
  v = {(x["a"], x["b"], x["metric"]): x for x in js["verdicts"]}
  zero = v[("base", "r1_zero", "accuracy_last_number")]
  assert zero["holds"] and zero["state"] == "above"
  np.testing.assert_allclose([zero["paired_diff"], zero["paired_half_width"]], [0.1, 0.0], atol=1e-12)
  final = v[("r1_4_sft", "r1_5_final", "accuracy_last_number")]
  assert 0.01 < res and final["state"] == "within" and final["holds"]  # 0.01 below stage 4: within the resolution
  h = v[("r1_4_sft", "r1_5_final", "forbidden_rate_sampled")]
  assert h["holds"] and h["start_nonzero"] and h["state"] == "below"
  assert "R1-Zero is above base" in md and "keeps R1 s4 SFT's accuracy within the resolution" in md
  assert "stage 5 lowers it, from a non-zero start" in md
  assert "| accuracy_last_number | 0.2 ± 0.02 | 0.3 ± 0.02 |" in md  # stats.Summary.fmt(3)


def test_verdicts_fail_when_they_should(tmp_path):
  # R1-Zero 0.005 above base (inside the resolution), final 0.1 below stage 4, forbidden rate 0 at stage 4.
  acc = _acc({"base": 0.2, "r1_zero": 0.205, "r1_4_sft": 0.5, "r1_5_final": 0.4})
  md = seeds_report.write(str(tmp_path), _runs(tmp_path, acc, {}))
  v = {(x["a"], x["b"], x["metric"]): x for x in json.loads((tmp_path / "r1_seeds.json").read_text())["verdicts"]}
  assert not v[("base", "r1_zero", "accuracy_last_number")]["holds"]
  assert not v[("r1_4_sft", "r1_5_final", "accuracy_last_number")]["holds"]
  h = v[("r1_4_sft", "r1_5_final", "forbidden_rate_sampled")]
  assert not h["holds"] and not h["start_nonzero"]
  assert "NOT resolved above" in md and "falls BELOW" in md and "does NOT resolve a decrease" in md


def test_runs_without_a_report_are_left_out(tmp_path):
  acc = _acc({"base": 0.2, "r1_zero": 0.3})
  dirs = _runs(tmp_path, acc, {})
  os.remove(os.path.join(dirs[4], "report.json"))
  seeds_report.write(str(tmp_path), dirs)
  js = json.loads((tmp_path / "r1_seeds.json").read_text())
  assert js["n"] == 4 and js["stages"]["base"]["accuracy_last_number"]["n"] == 4
  assert seeds_report.write(str(tmp_path / "seed=0"), []) == ""


def test_the_sweep_writes_the_seed_report_for_the_pipeline(tmp_path, monkeypatch):
  """sweep.write_report (every mode that runs, and --mode=report) adds r1_seeds.md/.json for job=r1_pipeline."""
  from configs import r1_pipeline
  from grpo_jax.studies import sweep
  acc = _acc({"base": 0.2, "r1_zero": 0.3, "r1_4_sft": 0.5, "r1_5_final": 0.5})
  dirs = _runs(tmp_path, acc, {})
  c = r1_pipeline.get_config("small")
  runs = [sweep.Run(os.path.basename(d), "run", i, {"run_seed": i}, {}, c, d) for i, d in enumerate(dirs)]
  monkeypatch.setattr(sweep, "finished", lambda r: True)
  sweep.write_report(str(tmp_path), runs, ("report/*/accuracy_last_number",), title="t", header="Command: `x`")
  md = (tmp_path / "r1_seeds.md").read_text()
  assert "Command: `x`" in md and "over 5 seeds" in md and "| accuracy_last_number | 0.2 ± 0.02 |" in md
  assert json.loads((tmp_path / "r1_seeds.json").read_text())["n"] == 5


def test_one_seed_decides_nothing(tmp_path):
  acc = _acc({"base": 0.2, "r1_zero": 0.3, "r1_4_sft": 0.5, "r1_5_final": 0.1})
  md = seeds_report.write(str(tmp_path), _runs(tmp_path, acc, {})[:1])
  vs = json.loads((tmp_path / "r1_seeds.json").read_text())["verdicts"]
  assert [v["holds"] for v in vs] == [None, None, None] and {v["state"] for v in vs} == {"undecided"}
  assert md.count("undecided: one seed gives no resolution") == 3
