"""DIR/report.md, DIR/report.json and DIR/plots/r1_*.png: every R1 model's held-out scores (r1/heldout.py) side by
side, the verdicts, R1-Zero's training curves, the rejection-sampling statistics and the stage log."""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import numpy as np

from grpo_jax.run import metrics as metrics_lib
from grpo_jax.r1 import heldout
from grpo_jax.r1 import layout

if TYPE_CHECKING:  # matplotlib is imported on the first plot: every R1 CLI run imports this module (r1/pipeline.py)
  from matplotlib.figure import Figure  # and its import was ~0.5 s of a tiny run's start, plots or not


# --------------------------------------------------------------------------------------------------------- plots
def save_figure(fig: Figure, path: str) -> None:
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  os.makedirs(os.path.dirname(path), exist_ok=True)
  FigureCanvasAgg(fig)
  fig.savefig(path + ".tmp.png", dpi=90)
  os.replace(path + ".tmp.png", path)


def plot_comparison(results: dict, keys: tuple[str, ...], path: str) -> None:
  stages = [s for s in layout.MODELS if s in results]
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top,redefined-outer-name
  fig = Figure(figsize=(max(8, 1.6 * len(keys)), 4.2))
  ax = fig.add_subplot(1, 1, 1)
  w = 0.8 / max(len(stages), 1)
  for j, s in enumerate(stages):
    ax.bar(np.arange(len(keys)) + j * w, [results[s].get(k, np.nan) for k in keys], w, label=layout.LABELS[s])
  ax.set_xticks(np.arange(len(keys)) + 0.4 - w / 2)
  ax.set_xticklabels(keys, rotation=20, fontsize=8)
  ax.set_ylim(0, 1.05)
  ax.set_title("Held-out: base vs R1-Zero vs R1 stages")
  ax.legend(fontsize=7, ncol=3)
  fig.tight_layout()
  save_figure(fig, path)


def plot_curves(workdir: str, stage: str, names: tuple[str, ...], path: str) -> bool:
  """One panel per metric of an RL stage's metrics.jsonl (the aha curve for R1-Zero)."""
  mpath = layout.stage_dir(workdir, stage)
  if not os.path.exists(os.path.join(mpath, "metrics.jsonl")):
    return False
  rows = metrics_lib.read_metrics(mpath)
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top,redefined-outer-name
  fig = Figure(figsize=(3.2 * len(names), 3.0))
  for i, name in enumerate(names):
    ax = fig.add_subplot(1, len(names), i + 1)
    pts = [(r["step"], r[name]) for r in rows if name in r]
    if pts:
      ax.plot(*zip(*pts), lw=1.2)
    ax.set_title(name.split("/", 1)[-1], fontsize=8)
    ax.set_xlabel("step", fontsize=8)
  fig.suptitle(f"{stage}: every RL step", fontsize=9)
  fig.tight_layout()
  save_figure(fig, path)
  return True


# -------------------------------------------------------------------------------------------------------- report
ROWS = ("accuracy_last_number", "accuracy_tagged", "format_rate", "language_consistency", "completion_len_mean",
        "forbidden_rate", "recheck_per_completion")
AHA = ("train/completion_len_mean", "train/completion_len_p90", "eval/accuracy", "train/reward/verified",
       "train/reward/corrected", "train/len_acc_corr", "train/reward/recheck", "train/reward/recheck_fixed",
       "train/reward/format", "train/reward/accuracy", "train/reward/language")


def first_last(workdir: str, stage: str, name: str) -> tuple[float, float] | None:
  d = layout.stage_dir(workdir, stage)
  if not os.path.exists(os.path.join(d, "metrics.jsonl")):
    return None
  vals = [r[name] for r in metrics_lib.read_metrics(d) if name in r]
  if not vals:
    return None
  k = max(1, len(vals) // 10)  # mean of the first and last tenth: single RL steps are noisy
  # NaN is a step where the metric measured nothing (train/len_acc_corr with no group varying): skipped, not 0
  def mean(v):
    v = [x for x in v if not np.isnan(x)]
    return float(np.mean(v)) if v else float("nan")
  return mean(vals[:k]), mean(vals[-k:])


def verdict(results: dict) -> list[str]:
  """Plain statements of the targets: R1-Zero above the base, R1's final at or above R1-Zero (last-number rule)."""
  key = "accuracy_last_number"
  out = []
  if "base" in results and "r1_zero" in results:
    b, z = results["base"][key], results["r1_zero"][key]
    out.append(f"R1-Zero vs base (greedy, last-number rule): {z:.3f} vs {b:.3f} -> "
               f"{'R1-Zero is above the base' if z > b else 'R1-Zero is NOT above the base'}.")
  if "r1_zero" in results and "r1_5_final" in results:
    z, f = results["r1_zero"][key], results["r1_5_final"][key]
    zt, ft = results["r1_zero"]["accuracy_tagged"], results["r1_5_final"]["accuracy_tagged"]
    out.append(f"R1 final vs R1-Zero (greedy, last-number rule): {f:.3f} vs {z:.3f}; tagged: {ft:.3f} vs {zt:.3f} "
               f"-> {'R1 final >= R1-Zero' if f >= z else 'R1 final falls SHORT of R1-Zero by %.3f' % (z - f)}.")
  return out


def _fmt(v) -> str:
  return f"{v:.3f}" if isinstance(v, float) else str(v)


def write_report(config, workdir: str) -> dict:
  """Evaluates every finished model not yet cached, writes the report; returns stage -> held-out metrics."""
  results = heldout.evaluate_stages(config, workdir)
  rep = config.r1.report
  n = rep.n_samples
  keys = ROWS + tuple(f"pass@{k}_{r}" for r in ("last_number", "tagged") for k in rep.pass_k) + \
      (f"cons@{n}_last_number", f"cons@{n}_tagged", "language_consistency_sampled", "completion_len_mean_sampled",
       "stepwise_rate_sampled", "accuracy_brief_sampled", "accuracy_stepwise_sampled", "step_right_rate_sampled",
       "accuracy_tagged_brief_sampled", "accuracy_tagged_stepwise_sampled", "format_brief_sampled",
       "format_stepwise_sampled", "verified_rate_sampled", "accuracy_verified_sampled", "accuracy_unverified_sampled",
       "accuracy_tagged_verified_sampled", "accuracy_tagged_unverified_sampled")
  stages = [s for s in layout.MODELS if s in results]
  plots_dir = os.path.join(workdir, "plots")
  plot_comparison(results, ("accuracy_last_number", "accuracy_tagged", f"pass@{max(rep.pass_k)}_last_number",
                            f"cons@{n}_last_number", "format_rate", "language_consistency"),
                  os.path.join(plots_dir, "r1_compare.png"))
  have_aha = plot_curves(workdir, "r1_zero", AHA, os.path.join(plots_dir, "r1_zero_aha.png"))
  for s in ("r1_2_grpo", "r1_5_final"):
    extra = ("train/reward/brevity_correct", "train/adv_share/accuracy") if s == "r1_5_final" else ()
    plot_curves(workdir, s, AHA + ("train/reward/brevity", "train/reward/harmless") + extra,
                os.path.join(plots_dir, f"{s}_curves.png"))
  lines = ["# R1-Zero vs R1 (held-out)", "",
           f"Held-out: {rep.size} test prompts of task `{config.task.name}` (language `{config.task.language}`), "
           f"greedy decoding for the single-sample rows; pass@k (unbiased, Chen et al.) and cons@{n} (majority vote) "
           f"from {n} samples at temperature {config.sampling.temperature}. `last_number`: the last integer the "
           "completion writes equals the answer (the same rule for every model, the only fair one for the tag-less "
           "base); `tagged`: the verifier's accuracy (format must hold, <answer> body right).", "",
           "| metric | " + " | ".join(layout.LABELS[s] for s in stages) + " |",
           "|---|" + "---|" * len(stages)]
  for k in keys:
    lines.append(f"| {k} | " + " | ".join(_fmt(results[s].get(k, float("nan"))) for s in stages) + " |")
  lines += ["", "## Verdict", ""] + [f"- {v}" for v in verdict(results)]
  lines += ["", "## R1-Zero during training (mean of the first vs last tenth of steps)", ""]
  for name in AHA:
    fl = first_last(workdir, "r1_zero", name)
    if fl:
      lines.append(f"- `{name}`: {fl[0]:.3f} -> {fl[1]:.3f}")
  rj = layout.rejection_stats(workdir)
  if os.path.exists(rj):
    with open(rj) as f:
      lines += ["", "## Rejection sampling (stage 3)", "", "```", json.dumps(json.load(f), indent=2), "```"]
  log = os.path.join(workdir, "stages.log")
  if os.path.exists(log):
    with open(log) as f:
      lines += ["", "## Stage log", "", "```", f.read().rstrip(), "```"]
  lines += ["", "## Plots", "", "![compare](plots/r1_compare.png)"]
  if have_aha:
    lines.append("![R1-Zero aha](plots/r1_zero_aha.png)")
  for s in ("r1_2_grpo", "r1_5_final"):
    if os.path.exists(os.path.join(plots_dir, f"{s}_curves.png")):
      lines.append(f"![{s}](plots/{s}_curves.png)")
  lines += ["", "## Greedy samples", ""]
  for s in stages:
    lines.append(f"- {layout.LABELS[s]}: `{(results[s].get('samples') or [''])[0]}`")
  with open(os.path.join(workdir, "report.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(workdir, "report.json"), "w") as f:
    json.dump({s: {k: v for k, v in r.items() if k != "samples"} for s, r in results.items()}, f, indent=2)
  return results
