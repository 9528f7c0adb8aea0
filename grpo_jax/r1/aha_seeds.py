"""R1-Zero's "aha" statistics over seeds (issue #29): length, verification and held-out accuracy, start -> end, as
mean ± 95% CI over the runs of a sweep, and the length growth against a control's runs.

  python -m grpo_jax.sweep --config=configs/r1_zero_aha.py --workdir=DIR --seeds=3 ...   # writes DIR/aha_seeds.md
  python -m grpo_jax.r1.aha_seeds --runs=DIR --control=DIR_CONTROL                      # + the control comparison

Per run: the mean of R1-Zero's first and last tenth of steps (report.first_last) of the training samples' length
and verification / correction rates and of the greedy held-out accuracy along the way; the length at step 1 (the
base's own samples: end over it is the growth from the base when the length moves within the first tenth); the
report's held-out accuracy of R1-Zero minus its base (the same seed's two models: a paired interval). Against the
control: the difference of the two groups' mean length ratios, Welch's interval (independent runs).
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Callable, Sequence

from matplotlib.figure import Figure

from grpo_jax.run import metrics as metrics_lib
from grpo_jax.r1 import layout
from grpo_jax.r1 import report
from grpo_jax.studies import stats

LEN = "train/completion_len_mean"
# The per-step series whose first -> last tenth is tabulated, in table order.
SERIES = (LEN, "train/completion_len_p90", "train/reward/verified", "train/reward/recheck", "train/reward/corrected",
          "train/reward/accuracy", "train/reward/format", "train/len_acc_corr", "eval/accuracy")
# Held-out (report.json) metrics: R1-Zero minus base, paired per seed.
HELDOUT = ("accuracy_last_number", "accuracy_tagged", "completion_len_mean", "completion_len_mean_sampled",
           "stepwise_rate_sampled", "verified_rate_sampled", "recheck_per_completion")
PLOTTED = (LEN, "eval/accuracy", "train/reward/verified", "train/reward/recheck")


def run_dirs(sweep_dir: str) -> list[str]:
  """The finished R1-Zero runs of a sweep directory (each subdirectory with a report.json and r1_zero metrics)."""
  out = []
  for name in sorted(os.listdir(sweep_dir)):
    d = os.path.join(sweep_dir, name)
    if os.path.exists(os.path.join(d, "report.json")) and os.path.exists(os.path.join(d, "r1_zero", "metrics.jsonl")):
      out.append(d)
  return out


def per_run(workdir: str) -> dict[str, float]:
  """One run's start, end (and length ratio) of every SERIES, and R1-Zero − base of every HELDOUT metric."""
  out: dict[str, float] = {}
  for name in SERIES:
    fl = report.first_last(workdir, "r1_zero", name)
    if fl:
      out[name + "@start"], out[name + "@end"] = fl
      out[name + "@rise"] = fl[1] - fl[0]  # paired: this seed's own start and end
  if LEN + "@start" in out:
    out["length_ratio"] = out[LEN + "@end"] / out[LEN + "@start"]
    # Step 1's samples are the base's own (drawn before the first update): where the length starts when it moves
    # within the first tenth, whose mean (the start above) already holds part of the growth.
    first = next(r[LEN] for r in metrics_lib.read_metrics(layout.stage_dir(workdir, "r1_zero")) if LEN in r)
    out[LEN + "@step1"] = float(first)
    out["length_ratio_step1"] = out[LEN + "@end"] / first
  with open(os.path.join(workdir, "report.json"), encoding="utf-8") as f:
    rep = json.load(f)
  for k in HELDOUT:
    if k in rep.get("base", {}) and k in rep.get("r1_zero", {}):
      out[k + "@base"], out[k + "@r1_zero"] = rep["base"][k], rep["r1_zero"][k]
      out[k + "@change"] = rep["r1_zero"][k] - rep["base"][k]
  return out


def summarize(runs: Sequence[dict[str, float]]) -> dict[str, stats.Summary]:
  keys = sorted({k for r in runs for k in r})
  return {k: stats.summarize([r.get(k, float("nan")) for r in runs]) for k in keys}


def against_control(table: dict[str, stats.Summary], control: dict[str, stats.Summary],
                    key: str = "length_ratio") -> tuple[float, float]:
  """(difference of the means, its Welch 95% CI half-width) of `key`: runs minus control."""
  return stats.welch(table[key], control[key])


def markdown(table: dict[str, stats.Summary], n: int, control: dict[str, stats.Summary] | None = None,
             n_control: int = 0) -> str:
  cols = ["runs"] + (["control"] if control else [])
  lines = [f"R1-Zero over {n} seeds" + (f" (control: {n_control})" if control else "")
           + ": mean ± 95% CI half-width (Student t); start / end = mean of the first / last tenth of steps.", "",
           "| statistic | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]

  def row(label: str, key: str) -> None:
    cells = [t[key].fmt(3) if key in t else "" for t in ([table] + ([control] if control else []))]
    if any(cells):
      lines.append(f"| {label} | " + " | ".join(cells) + " |")
  for name in SERIES:
    row(f"`{name}` start", name + "@start")
    row(f"`{name}` end", name + "@end")
    row(f"`{name}` end − start (paired)", name + "@rise")
  row("length ratio end / start", "length_ratio")
  row(f"`{LEN}` at step 1 (the base's own samples)", LEN + "@step1")
  row("length ratio end / step 1", "length_ratio_step1")
  for k in HELDOUT:
    row(f"held-out `{k}`: base", k + "@base")
    row(f"held-out `{k}`: R1-Zero", k + "@r1_zero")
    row(f"held-out `{k}`: R1-Zero − base (paired)", k + "@change")
  for key, label in (("length_ratio", "Length ratio end / start"), ("length_ratio_step1", "Length ratio end / step 1")):
    if control and key in table and key in control:
      d, hw = against_control(table, control, key)
      lines += ["", f"{label}, runs − control: {d:+.3f} ± {hw:.3f} (Welch 95%) -> "
                + ("**resolved**" if math.isfinite(hw) and abs(d) > hw else "**not resolved**")
                + (" (the runs' length grows more than the control's)" if d > 0 else
                   " (the runs' length does not grow more than the control's)") + "."]
  return "\n".join(lines) + "\n"


def plot(dirs: Sequence[str], control_dirs: Sequence[str], path: str) -> None:
  """Every seed's curve of each PLOTTED series (one colour per seed; runs solid, control dashed)."""
  fig = Figure(figsize=(3.4 * len(PLOTTED), 3.0))
  for i, name in enumerate(PLOTTED):
    ax = fig.add_subplot(1, len(PLOTTED), i + 1)
    for group, style, tag in ((dirs, "-", ""), (control_dirs, "--", " control")):
      for j, d in enumerate(group):
        rows = metrics_lib.read_metrics(layout.stage_dir(d, "r1_zero"))
        pts = [(r["step"], r[name]) for r in rows if name in r]
        if pts:
          ax.plot(*zip(*pts), style, color=f"C{j}", lw=1.0, alpha=0.8, label=os.path.basename(d) + tag)
    ax.set_title(name, fontsize=8)
    ax.set_xlabel("R1-Zero step", fontsize=8)
    if i == 0 and (dirs or control_dirs):
      ax.legend(fontsize=6)
  fig.tight_layout()
  report.save_figure(fig, path)


def write(workdir: str, dirs: Sequence[str], control_dirs: Sequence[str] = (), header: str = "") -> str:
  """DIR/aha_seeds.md, .json and DIR/plots/aha_seeds.png; returns the markdown ('' when no run has R1-Zero)."""
  dirs = [d for d in dirs if os.path.exists(os.path.join(d, "r1_zero", "metrics.jsonl"))]
  if not dirs:
    return ""
  runs = [per_run(d) for d in dirs]
  table = summarize(runs)
  ctl_runs = [per_run(d) for d in control_dirs]
  control = summarize(ctl_runs) if ctl_runs else None
  md = "# R1-Zero's aha statistics over seeds\n\n" + (header + "\n\n" if header else "") + markdown(
      table, len(runs), control, len(ctl_runs))
  with open(os.path.join(workdir, "aha_seeds.md"), "w", encoding="utf-8") as f:
    f.write(md)
  js = {"runs": dict(zip(dirs, runs)), "control": dict(zip(control_dirs, ctl_runs)),
        "summary": {k: vars(v) for k, v in table.items()},
        "control_summary": {k: vars(v) for k, v in (control or {}).items()}}
  if control and "length_ratio" in table and "length_ratio" in control:
    js["length_ratio_vs_control"] = dict(zip(("diff", "half_width"), against_control(table, control)))
  with open(os.path.join(workdir, "aha_seeds.json"), "w", encoding="utf-8") as f:
    json.dump(js, f, indent=2)
  plot(dirs, control_dirs, os.path.join(workdir, "plots", "aha_seeds.png"))
  return md


def report_main(argv: Sequence[str], *, prog: str, description: str, runs_help: str, control_help: str,
                write_fn: Callable[..., str]) -> int:
  """The seeds reports' command (this module's, r1/tools_seeds.py's): --runs [--control] -> write_fn's markdown."""
  import argparse  # pylint: disable=g-import-not-at-top
  ap = argparse.ArgumentParser(prog=prog, description=description)
  ap.add_argument("--runs", required=True, help=runs_help)
  ap.add_argument("--control", default="", help=control_help)
  a = ap.parse_args(argv)
  for flag, d in (("--runs", a.runs), ("--control", a.control)):
    if d and not os.path.isdir(d):
      print(f"Error: {flag}={d} is not a directory; give a sweep's workdir.", file=sys.stderr)
      return 2
  dirs = run_dirs(a.runs)
  if not dirs:
    print(f"Error: --runs={a.runs} holds no finished R1-Zero run (a subdirectory with report.json).", file=sys.stderr)
    return 2
  ctl = run_dirs(a.control) if a.control else []
  if a.control and not ctl:
    print(f"Error: --control={a.control} holds no finished R1-Zero run.", file=sys.stderr)
    return 2
  print(write_fn(a.runs, dirs, ctl, header=f"Runs: `{a.runs}`" + (f"; control: `{a.control}`" if ctl else "")))
  return 0


def main(argv: Sequence[str]) -> int:
  return report_main(argv, prog="python -m grpo_jax.r1.aha_seeds", description=__doc__.split("\n\n")[0],
                     runs_help="the sweep directory of the R1-Zero runs (writes its aha_seeds.*)",
                     control_help="the sweep directory of the control's runs", write_fn=write)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
