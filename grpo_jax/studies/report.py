"""Writes a study's table (an ablation table, a sweep report) as DIR/table.md, DIR/table.csv and DIR/<curve>.png
(mean with a 95% CI band)."""
import collections
import csv
import hashlib
import math
import os
import re
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from grpo_jax.studies import stats

# cells: variant -> {"scalars": {metric: [per seed]}, "curves": {metric: {"x": [...], "y": [[per step] per seed]}}}
Cells = dict[str, dict]


def summaries(cells: Cells) -> dict[str, dict[str, stats.Summary]]:
  return {v: {m: stats.summarize(vals) for m, vals in c["scalars"].items()} for v, c in cells.items()}


def metric_order(cells: Cells, columns: Sequence[str] = ()) -> list[str]:
  seen = list(columns)
  for c in cells.values():
    seen += [m for m in c["scalars"] if m not in seen]
  return seen


def write_csv(path: str, cells: Cells, columns: Sequence[str] = (), *, keys: dict[str, dict] | None = None,
              row_label: str = "variant") -> None:
  """One row per (row, metric): n, mean, std, 95% CI. `keys`: row -> {column: value} written after the row's name
  (a sweep point's swept values)."""
  summ = summaries(cells)
  key_cols = list(dict.fromkeys(k for d in (keys or {}).values() for k in d))
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow([row_label, *key_cols, "metric", "n", "mean", "std", "ci95_half_width", "ci95_low", "ci95_high"])
    for v in cells:
      extra = [(keys or {}).get(v, {}).get(k, "") for k in key_cols]
      for m in metric_order(cells, columns):
        if m in summ[v]:
          s = summ[v][m]
          w.writerow([v, *extra, m, s.n, repr(s.mean), repr(s.std), repr(s.half_width), repr(s.low), repr(s.high)])
  os.replace(tmp, path)


def markdown(cells: Cells, *, title: str, claim: str, header: str = "", columns: Sequence[str] = (),
             verdict: str = "", plots: Sequence[str] = (), row_label: str = "variant",
             single_note: str = "Single deterministic run per cell: no interval (the values are exact, not "
                                "estimates).") -> str:
  """Variants as rows, metrics as columns (mean ± 95% CI half-width over seeds), then the resolvable difference."""
  summ = summaries(cells)
  metrics = metric_order(cells, columns)
  lines = [f"## {title}", ""] + ([f"**Claim.** {claim}", ""] if claim else [])
  if header:
    lines += [header, ""]
  lines.append(f"| {row_label} | " + " | ".join(map(_cell, metrics)) + " |")
  lines.append("|---|" + "---|" * len(metrics))
  for v in cells:
    row = [_fmt(summ[v][m], len(cells[v]["scalars"][m])) if m in summ[v] else "" for m in metrics]
    lines.append(f"| {_cell(v)} | " + " | ".join(row) + " |")
  ns = sorted({s.n for d in summ.values() for s in d.values()})
  lines += ["", f"Cells: mean ± 95% CI half-width (Student t, n−1 df) over n = {', '.join(map(str, ns))} seeds"
            + ("; (k of n seeds): the other seeds measured nothing there (nan), e.g. no wrong answer to take a length "
               "of." if any(s.n < len(cells[v]["scalars"][m]) for v, d in summ.items() for m, s in d.items())
               else ".")]
  res = []
  for m in metrics:
    d = stats.resolvable_difference([summ[v][m] for v in cells if m in summ[v]])
    if math.isfinite(d):
      res.append(f"{m} ≈ {d:.3g}")
  if res:
    lines.append("Smallest difference between two rows these seeds resolve (95%, median variance): "
                 + "; ".join(res) + ".")
  else:
    lines.append(single_note)
  if verdict:
    lines += ["", f"**Measured vs claim.** {verdict}"]
  if plots:
    lines += [""] + [f"![{p}]({p})" for p in plots]
  return "\n".join(lines) + "\n"


def _fmt(s: stats.Summary, runs: int) -> str:
  """A cell's mean ± CI; with the count of the seeds it is over when stats.summarize left non-finite ones out (a row
  read 0.55 ± 0.64 for 2 of 3 seeds with nothing to tell it from the rows over 3)."""
  return s.fmt() if s.n == runs else f"{s.fmt()} ({s.n} of {runs} seeds)"


def _cell(text: str) -> str:
  """A row or column name in a markdown table: a '|' in it (a point h.named('a|b')) split its row into columns."""
  return text.replace("|", "\\|")


def _slug(name: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "curve"


def _file_names(names: Sequence[str]) -> dict[str, str]:
  """name -> its PNG's file name: the slug, plus a hash of the name where two names share a slug (case ignored, as
  on macOS): `train/reward:format` and `train/reward_format` drew over each other's file."""
  slugs = {m: _slug(m) for m in names}
  shared = collections.Counter(s.lower() for s in slugs.values())
  return {m: (s if shared[s.lower()] == 1 else f"{s}-{hashlib.sha1(m.encode()).hexdigest()[:8]}") + ".png"
          for m, s in slugs.items()}


def write_plots(workdir: str, cells: Cells) -> list[str]:
  """One PNG per curve metric: every variant's mean over seeds with its 95% CI band."""
  names: list[str] = []
  for c in cells.values():
    names += [m for m in c.get("curves", {}) if m not in names]
  out = []
  fnames = _file_names(names)
  for m in names:
    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    xlabel, xscale = "step", "linear"  # a curve may name its x axis (`xlabel`) and scale (`xscale`: pass@k's k)
    for v, c in cells.items():
      if m not in c.get("curves", {}):
        continue
      x = np.asarray(c["curves"][m]["x"], np.float64)
      mean, hw = stats.band(np.asarray(c["curves"][m]["y"], np.float64))
      (line,) = ax.plot(x, mean, label=v)
      ax.fill_between(x, mean - hw, mean + hw, color=line.get_color(), alpha=0.2, linewidth=0)
      xlabel, xscale = c["curves"][m].get("xlabel", xlabel), c["curves"][m].get("xscale", xscale)
    ax.set_title(m)
    ax.set_xlabel(xlabel)
    ax.set_xscale(xscale)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fname = fnames[m]
    tmp = os.path.join(workdir, fname + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, os.path.join(workdir, fname))
    out.append(fname)
  return out
