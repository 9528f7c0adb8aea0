"""DIR/sweep.md, DIR/sweep.csv and DIR/plots/*.png of a sweep: each point's metrics as mean ± 95% CI over its seeds,
with the ablation tables' report code (studies/report.py, stats.py).

A metric is named by where it is read:
  eval/accuracy             DIR/<run>/metrics.jsonl: the value of its last row that has it
  train/reward_mean@tail    ... reduced over its rows: @last (default), @first, @mean, @max, @min, @tail (mean of
                            the last 20% of the rows that have it)
  sft:eval/accuracy         DIR/<run>/sft/metrics.jsonl (any stage directory: r1_5_final:train/kl@tail)
  report/r1_5_final/accuracy_last_number
                            DIR/<run>/report.json (the R1 pipeline's), keys joined by '/'
Shell-style patterns select several: `eval/*`, `report/*/accuracy_last_number`. Every metrics.jsonl metric also
gets a plot over steps: each point's mean over seeds with its 95% CI band.
"""
from __future__ import annotations

import fnmatch
import json
import math
import os
from typing import Any, Sequence

import numpy as np
from absl import logging

from grpo_jax.infra import errors
from grpo_jax.run import metrics as metrics_lib
from grpo_jax.studies import report

AGGREGATES = ("last", "first", "mean", "max", "min", "tail")
DEFAULT_METRICS = ("eval/accuracy", "train/reward_mean@tail")
DEFAULT_REPORT_METRICS = ("report/*/accuracy_last_number",)


def parse(name: str) -> tuple[str, str, str]:
  """`[stage:]metric[@agg]` -> (stage subdir or '' or 'report', metric pattern, aggregate)."""
  if name.startswith("report/"):
    return "report", name[len("report/"):], "last"
  sub, _, rest = name.rpartition(":") if ":" in name else ("", "", name)
  metric, _, agg = rest.partition("@")
  agg = agg or "last"
  if agg not in AGGREGATES:
    raise errors.ConfigError(f"--metrics: {name!r}: aggregate @{agg} is unknown; use one of "
                             f"{', '.join('@' + a for a in AGGREGATES)}.")
  if not metric:
    raise errors.ConfigError(f"--metrics: {name!r} names no metric; e.g. eval/accuracy or train/reward_mean@tail.")
  return sub, metric, agg


def _flatten(tree: Any, prefix: str = "") -> dict[str, float]:
  out = {}
  if isinstance(tree, dict):
    for k, v in tree.items():
      out.update(_flatten(v, f"{prefix}{k}/"))
  elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
    out[prefix[:-1]] = float(tree)
  return out


def _rows(run_dir: str, sub: str, cache: dict) -> list[dict]:
  path = os.path.join(run_dir, sub) if sub else run_dir
  if path not in cache:
    cache[path] = metrics_lib.read_metrics(path) if os.path.exists(os.path.join(path, "metrics.jsonl")) else []
  return cache[path]


def _report_json(run_dir: str, cache: dict) -> dict[str, float]:
  path = os.path.join(run_dir, "report.json")
  if path not in cache:
    cache[path] = {}
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        cache[path] = _flatten(json.load(f))
  return cache[path]


def _reduce(values: Sequence[float], agg: str) -> float:
  v = np.asarray(values, np.float64)
  if agg == "tail":
    return float(v[-max(1, int(math.ceil(0.2 * len(v)))):].mean())
  return float({"last": lambda: v[-1], "first": lambda: v[0], "mean": v.mean, "max": v.max, "min": v.min}[agg]())


def collect(points: dict[str, list[str]], metrics: Sequence[str]) -> report.Cells:
  """points: {point name: its finished runs' directories} -> cells for studies/report.py (scalars and curves)."""
  specs = [parse(m) for m in metrics]
  cache: dict = {}
  cells: report.Cells = {}
  matched: set[int] = set()  # specs that found a metric somewhere: a typo'd name was a column left out silently
  for point, dirs in points.items():
    scalars: dict[str, list[float]] = {}
    curves: dict[str, dict] = {}
    for i, (sub, pattern, agg) in enumerate(specs):
      if sub == "report":
        keys = sorted({k for d in dirs for k in _report_json(d, cache) if fnmatch.fnmatchcase(k, pattern)})
        matched |= {i} if keys else set()
        for k in keys:
          vals = [_report_json(d, cache).get(k, float("nan")) for d in dirs]
          scalars[f"report/{k}"] = vals
        continue
      keys = sorted({k for d in dirs for r in _rows(d, sub, cache) for k in r
                     if k != "step" and fnmatch.fnmatchcase(k, pattern)})
      matched |= {i} if keys else set()
      for k in keys:
        label = (f"{sub}:" if sub else "") + k + ("" if agg == "last" else f"@{agg}")
        series = [[(r["step"], r[k]) for r in _rows(d, sub, cache) if k in r and r[k] is not None] for d in dirs]
        scalars[label] = [_reduce([v for _, v in s], agg) if s else float("nan") for s in series]
        steps = sorted(set.intersection(*[{x for x, _ in s} for s in series])) if all(series) else []
        curve = (f"{sub}:" if sub else "") + k
        if len(steps) >= 2 and curve not in curves:
          by_step = [dict(s) for s in series]
          curves[curve] = {"x": steps, "y": [[float(b[x]) for x in steps] for b in by_step]}
    cells[point] = {"scalars": scalars, "curves": curves}
  n_runs = sum(len(d) for d in points.values())
  for i, name in enumerate(metrics):
    if n_runs and i not in matched:
      logging.warning("--metrics: %r matches no metric of the %d finished run(s); the report has no column for it "
                      "(check the name against their metrics.jsonl / report.json).", name, n_runs)
  return cells


def write(workdir: str, cells: report.Cells, *, title: str, header: str, columns: Sequence[str] = (),
          keys: dict[str, dict[str, Any]] | None = None) -> str:
  """Writes sweep.csv, plots/*.png and sweep.md; returns the markdown."""
  plots_dir = os.path.join(workdir, "plots")
  os.makedirs(plots_dir, exist_ok=True)
  pngs = [os.path.join("plots", p) for p in report.write_plots(plots_dir, cells)]
  report.write_csv(os.path.join(workdir, "sweep.csv"), cells, columns, keys=keys, row_label="point")
  md = report.markdown(cells, title=title, claim="", header=header, columns=columns, plots=pngs, row_label="point",
                       single_note="One run per point: no interval (--seeds N with N >= 2 gives one).")
  tmp = os.path.join(workdir, "sweep.md.tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(md)
  os.replace(tmp, os.path.join(workdir, "sweep.md"))
  return md
