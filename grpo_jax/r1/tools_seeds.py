"""Tool use over seeds (issue #43): R1-Zero with the calculator (configs/tools_calc.py) against the no-tool control
(:control), paired by seed. Writes DIR/tools_seeds.md, .json and DIR/plots/tools_seeds.png.

  python -m grpo_jax.sweep --config=configs/tools_calc.py --workdir=DIR --seeds=3 --mode=serial \\
      --config.r1.base_from=BASE_DIR
  python -m grpo_jax.sweep --config=configs/tools_calc.py:control --workdir=DIR_C --seeds=3 --mode=serial \\
      --config.r1.base_from=BASE_DIR_C
  python -m grpo_jax.r1.tools_seeds --runs=DIR --control=DIR_C

Per run: the first and last tenth of R1-Zero's steps (report._first_last) of the tool readings and the accuracy
reward, the greedy held-out accuracy along the way (eval/*, with the environment answering as in training) at step
0 (the base) and at the end, and the report's held-out accuracy (report.json, 256 prompts) of R1-Zero. Paired
statistics: within a run (end − start: did GRPO raise the tool-call rate), and between the arms, each run of DIR minus
the run of DIR_C with the same name (the same RL seed: seed=k): mean ± Student-t 95% CI of the per-seed differences.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from grpo_jax.r1 import aha_seeds
from grpo_jax.r1 import layout
from grpo_jax.r1 import report
from grpo_jax.run import metrics as metrics_lib
from grpo_jax.studies import stats

# Per-step series whose first -> last tenth is tabulated (NaN steps, e.g. no row called, left out of the means).
SERIES = ("train/tool_call_rate", "train/tool_calls_mean", "train/reward/accuracy", "train/accuracy_with_tool",
          "train/accuracy_without_tool", "train/completion_len_mean", "train/obs_token_frac", "eval/accuracy",
          "eval/tool_call_rate")
# Held-out greedy series read at step 0 (the base) and at the last eval.
EVAL = ("eval/accuracy", "eval/tool_call_rate", "eval/accuracy_with_tool", "eval/accuracy_without_tool")
HELDOUT = ("accuracy_last_number", "accuracy_tagged")  # report.json: R1-Zero's, 256 held-out prompts
# Compared between the arms, run k minus control run k.
PAIRED = ("eval/accuracy@end", "accuracy_last_number@r1_zero", "accuracy_tagged@r1_zero",
          "train/reward/accuracy@end")
PLOTTED = ("train/tool_call_rate", "train/reward/accuracy", "eval/accuracy", "eval/tool_call_rate")


def _series(workdir: str, name: str) -> list[tuple[int, float]]:
  rows = metrics_lib.read_metrics(layout.stage_dir(workdir, "r1_zero"))
  return [(int(r["step"]), float(r[name])) for r in rows if name in r]


def _first_last(workdir: str, name: str) -> tuple[float, float] | None:
  """Means of the first and last tenth of the steps that log `name` (report._first_last, NaN values left out)."""
  vals = [v for _, v in _series(workdir, name)]
  if not vals:
    return None
  k = max(1, len(vals) // 10)
  mean = lambda xs: float(np.nanmean(xs)) if np.isfinite(xs).any() else float("nan")
  return mean(np.asarray(vals[:k])), mean(np.asarray(vals[-k:]))


def per_run(workdir: str) -> dict[str, float]:
  out: dict[str, float] = {}
  for name in SERIES:
    fl = _first_last(workdir, name)
    if fl:
      out[name + "@start"], out[name + "@end"] = fl
      out[name + "@rise"] = fl[1] - fl[0]
  for name in EVAL:
    pts = _series(workdir, name)
    if pts:
      out[name + "@base"], out[name + "@end"] = pts[0][1], pts[-1][1]
      out[name + "@rise"] = pts[-1][1] - pts[0][1]
  path = os.path.join(workdir, "report.json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      rep = json.load(f)
    for k in HELDOUT:
      for stage in ("base", "r1_zero"):
        if k in rep.get(stage, {}):
          out[f"{k}@{stage}"] = rep[stage][k]
  return out


def paired(runs: Sequence[dict[str, float]], control: Sequence[dict[str, float]]) -> dict[str, stats.Summary]:
  """Run k minus control run k of each PAIRED statistic (pairs: `matched`)."""
  if len(runs) != len(control):
    raise ValueError(f"{len(runs)} runs against {len(control)} control runs: pair them with `matched`")
  return {k: stats.summarize([r.get(k, math.nan) - c.get(k, math.nan) for r, c in zip(runs, control)])
          for k in PAIRED}


def matched(dirs: Sequence[str], control_dirs: Sequence[str]) -> tuple[list[tuple[int, int]], list[str]]:
  """(index in dirs, index in control_dirs) of the runs with the same directory name (a sweep names its runs by
  seed: seed=k), and the names only one arm finished. By position, a seed missing from one arm paired every later
  run with another seed's."""
  name = lambda d: os.path.basename(os.path.normpath(d))
  ctl = {name(d): j for j, d in enumerate(control_dirs)}
  pairs = [(i, ctl[name(d)]) for i, d in enumerate(dirs) if name(d) in ctl]
  alone = sorted({name(d) for d in dirs} ^ set(ctl))
  return pairs, alone


def markdown(table: dict[str, stats.Summary], n: int, control: dict[str, stats.Summary] | None,
             diffs: dict[str, stats.Summary] | None, n_control: int) -> str:
  cols = ["tools"] + (["control"] if control else [])
  lines = [f"R1-Zero with the calculator over {n} seeds" + (f" (no-tool control: {n_control})" if control else "")
           + ": mean ± 95% CI half-width (Student t); start / end = mean of the first / last tenth of steps; "
           "base / end = the greedy held-out eval at step 0 / the last one.", "",
           "| statistic | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]

  def row(label: str, key: str) -> None:
    cells = [t[key].fmt(3) if key in t else "" for t in ([table] + ([control] if control else []))]
    if any(cells):
      lines.append(f"| {label} | " + " | ".join(cells) + " |")
  for name in SERIES:
    row(f"`{name}` start", name + "@start")
    row(f"`{name}` end", name + "@end")
    row(f"`{name}` end − start (paired)", name + "@rise")
  for name in EVAL:
    row(f"`{name}` base", name + "@base")
    row(f"`{name}` end", name + "@end")
    row(f"`{name}` end − base (paired)", name + "@rise")
  for k in HELDOUT:
    row(f"report `{k}`: base", k + "@base")
    row(f"report `{k}`: R1-Zero", k + "@r1_zero")
  if diffs:
    lines += ["", "Tools minus control, paired by seed (each run minus the control run of the same name):", "",
              "| statistic | tools − control | resolved |", "|---|---|---|"]
    for k, s in diffs.items():
      if s.n:
        res = "yes" if s.n > 1 and math.isfinite(s.half_width) and abs(s.mean) > s.half_width else "no"
        lines.append(f"| `{k}` | {s.fmt(3)} | {res} |")
  return "\n".join(lines) + "\n"


def plot(dirs: Sequence[str], control_dirs: Sequence[str], path: str) -> None:
  """Every seed's curve of each PLOTTED series (one colour per seed; tools solid, control dashed)."""
  fig = Figure(figsize=(3.4 * len(PLOTTED), 3.0))
  for i, name in enumerate(PLOTTED):
    ax = fig.add_subplot(1, len(PLOTTED), i + 1)
    for group, style, tag in ((dirs, "-", ""), (control_dirs, "--", " control")):
      for j, d in enumerate(group):
        pts = _series(d, name)
        if pts:
          ax.plot(*zip(*pts), style, color=f"C{j}", lw=1.0, alpha=0.8, label=os.path.basename(d) + tag)
    ax.set_title(name, fontsize=8)
    ax.set_xlabel("R1-Zero step", fontsize=8)
    if i == 0 and (dirs or control_dirs):
      ax.legend(fontsize=6)
  fig.tight_layout()
  report.save_figure(fig, path)


def write(workdir: str, dirs: Sequence[str], control_dirs: Sequence[str] = (), header: str = "") -> str:
  """DIR/tools_seeds.md, .json and DIR/plots/tools_seeds.png; returns the markdown."""
  runs = [per_run(d) for d in dirs]
  ctl = [per_run(d) for d in control_dirs]
  table = aha_seeds.summarize(runs)
  control = aha_seeds.summarize(ctl) if ctl else None
  pairs, alone = matched(dirs, control_dirs)
  diffs = paired([runs[i] for i, _ in pairs], [ctl[j] for _, j in pairs]) if ctl else None
  if ctl and alone:
    header += (" " if header else "") + (f"Paired: the {len(pairs)} seeds both arms finished; without a partner: "
                                         f"{', '.join(alone)}.")
  md = "# Tool use over seeds\n\n" + (header + "\n\n" if header else "") + markdown(table, len(runs), control, diffs,
                                                                                   len(ctl))
  with open(os.path.join(workdir, "tools_seeds.md"), "w", encoding="utf-8") as f:
    f.write(md)
  js = {"runs": dict(zip(dirs, runs)), "control": dict(zip(control_dirs, ctl)),
        "summary": {k: vars(v) for k, v in table.items()},
        "control_summary": {k: vars(v) for k, v in (control or {}).items()},
        "paired": {k: vars(v) for k, v in (diffs or {}).items()}}
  with open(os.path.join(workdir, "tools_seeds.json"), "w", encoding="utf-8") as f:
    json.dump(js, f, indent=2)
  plot(dirs, control_dirs, os.path.join(workdir, "plots", "tools_seeds.png"))
  return md


def main(argv: Sequence[str]) -> int:
  return aha_seeds.report_main(argv, prog="python -m grpo_jax.r1.tools_seeds", description=__doc__.split("\n\n")[0],
                               runs_help="the sweep directory of the tool runs (writes its tools_seeds.*)",
                               control_help="the sweep directory of the no-tool control's runs", write_fn=write)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
