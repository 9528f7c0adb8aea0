"""The R1 pipeline over seeds: every stage's held-out metrics as mean ± 95% CI over the runs' report.json files, and
the verdicts decided on the seed means against the smallest difference the seeds resolve (studies/stats.py).

`python -m grpo_jax.sweep --config=configs/r1_pipeline.py --workdir=DIR --seeds=5 --mode=serial` writes it, as
DIR/r1_seeds.md and DIR/r1_seeds.json, after its generic DIR/sweep.md (sweep.py calls `write` for job=r1_pipeline).
"""
from __future__ import annotations

import json
import math
import os
from typing import Sequence

from grpo_jax.studies import stats
from grpo_jax.r1 import layout

# The rows of the seed table (report.json keys), in order; a key missing from every run is left out.
METRICS = ("accuracy_last_number", "accuracy_tagged", "format_rate", "language_consistency",
           "language_consistency_sampled", "completion_len_mean", "completion_len_mean_sampled", "forbidden_rate",
           "forbidden_rate_sampled", "recheck_per_completion", "pass@1_last_number", "pass@4_last_number",
           "cons@4_last_number")
ACC = "accuracy_last_number"
HARM = "forbidden_rate_sampled"


def read_runs(run_dirs: Sequence[str]) -> list[dict]:
  """Each finished run's report.json ({stage: {metric: value}}); runs without one are skipped."""
  out = []
  for d in run_dirs:
    path = os.path.join(d, "report.json")
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        out.append(json.load(f))
  return out


def summarize(reports: Sequence[dict]) -> dict[str, dict[str, stats.Summary]]:
  """{stage: {metric: Summary over the runs}} for every stage and METRICS key any run has."""
  out: dict[str, dict[str, stats.Summary]] = {}
  for s in layout.MODELS:
    rows = [r[s] for r in reports if s in r]
    if rows:
      out[s] = {k: stats.summarize([r.get(k, float("nan")) for r in rows]) for k in METRICS
                if any(k in r for r in rows)}
  return out


def resolution(table: dict[str, dict[str, stats.Summary]], metric: str) -> float:
  """The smallest difference of two stages' means that the seeds resolve for `metric` (over every stage's spread)."""
  return stats.resolvable_difference([t[metric] for t in table.values() if metric in t])


def _paired(reports: Sequence[dict], a: str, b: str, metric: str) -> stats.Summary:
  """The per-seed difference b − a (same seed's two models): a paired interval, tighter than two independent ones."""
  return stats.summarize([r[b][metric] - r[a][metric] for r in reports if a in r and b in r and metric in r[a]
                          and metric in r[b]])


def _compare(reports, table, a: str, b: str, metric: str, *, want: str, res: float) -> dict:
  """b vs a on the seed means: 'above' (b − a > res), 'below' (a − b > res) or 'within' the resolution."""
  ma, mb = table[a][metric].mean, table[b][metric].mean
  d = mb - ma
  if not math.isfinite(res):
    state = "undecided"  # fewer than 2 seeds: no resolution
  else:
    state = "within" if abs(d) <= res else ("above" if d > 0 else "below")
  p = _paired(reports, a, b, metric)
  return {"a": a, "b": b, "metric": metric, "mean_a": ma, "mean_b": mb, "diff": d, "resolution": res,
          "state": state, "paired_diff": p.mean, "paired_half_width": p.half_width, "n": p.n, "want": want}


def verdicts(reports: Sequence[dict], table: dict[str, dict[str, stats.Summary]]) -> list[dict]:
  """The pipeline's targets on the seed means: R1-Zero > base; final ≥ stage 4 − resolution (accuracy); stage 5
  lowers the sampled forbidden-word rate from a non-zero start. Each holds (True/False) or, from one seed, is
  undecided (None), stated with its numbers."""
  out = []
  res = resolution(table, ACC)
  if "base" in table and "r1_zero" in table:
    v = _compare(reports, table, "base", "r1_zero", ACC, want="above", res=res)
    v["holds"] = None if v["state"] == "undecided" else v["state"] == "above"
    out.append(v)
  if "r1_4_sft" in table and "r1_5_final" in table:
    v = _compare(reports, table, "r1_4_sft", "r1_5_final", ACC, want="not below", res=res)
    v["holds"] = None if v["state"] == "undecided" else v["diff"] >= -res
    out.append(v)
    if HARM in table["r1_4_sft"] and HARM in table["r1_5_final"]:
      v = _compare(reports, table, "r1_4_sft", "r1_5_final", HARM, want="below", res=resolution(table, HARM))
      v["start_low"] = table["r1_4_sft"][HARM].low
      v["start_nonzero"] = v["start_low"] > 0
      v["holds"] = None if v["state"] == "undecided" else v["state"] == "below" and v["start_nonzero"]
      out.append(v)
  return out


def _verdict_line(v: dict) -> str:
  la, lb = layout.LABELS[v["a"]], layout.LABELS[v["b"]]
  paired = (f"; per-seed difference {v['paired_diff']:+.3f} ± {v['paired_half_width']:.3f}"
            if math.isfinite(v["paired_half_width"]) else "")
  head = (f"{lb} vs {la}, `{v['metric']}` (seed means): {v['mean_b']:.3f} vs {v['mean_a']:.3f}, difference "
          f"{v['diff']:+.3f}, resolution {v['resolution']:.3f}{paired}")
  if v["state"] == "undecided":
    tail = "undecided: one seed gives no resolution"
  elif v["want"] == "above":
    tail = f"{lb} is above {la}" if v["holds"] else f"{lb} is NOT resolved above {la}"
  elif v["want"] == "not below":
    tail = (f"{lb} keeps {la}'s accuracy within the resolution" if v["holds"] and v["state"] != "above"
            else f"{lb} is above {la}" if v["holds"] else f"{lb} falls BELOW {la} by more than the resolution")
  else:
    start = "" if v["start_nonzero"] else f"; its stage-4 rate is not resolved above 0 (CI low {v['start_low']:.3f})"
    tail = ("stage 5 lowers it, from a non-zero start" if v["holds"]
            else f"stage 5 does NOT resolve a decrease{start}" if v["state"] != "below"
            else f"stage 5 lowers it{start}")
  return f"{head} -> **{tail}**."


def markdown(table: dict[str, dict[str, stats.Summary]], vs: list[dict], n_runs: int) -> str:
  stages = list(table)
  lines = [f"Held-out metrics of every R1 model, mean ± 95% CI half-width over {n_runs} seeds (Student t, n−1 "
           "degrees of freedom); `res` = the smallest difference of two stages' means the seeds resolve for that "
           "metric (Welch, studies/stats.py).", "",
           "| metric | " + " | ".join(layout.LABELS[s] for s in stages) + " | res |",
           "|---|" + "---|" * (len(stages) + 1)]
  for k in METRICS:
    if not any(k in table[s] for s in stages):
      continue
    cells = [table[s][k].fmt(3) if k in table[s] else "" for s in stages]
    lines.append(f"| {k} | " + " | ".join(cells) + f" | {resolution(table, k):.3f} |")
  lines += ["", "Verdicts (on the seed means):", ""] + [f"- {_verdict_line(v)}" for v in vs]
  return "\n".join(lines) + "\n"


def write(workdir: str, run_dirs: Sequence[str], header: str = "", name: str = "r1_seeds") -> str:
  """DIR/<name>.md and DIR/<name>.json from the runs' report.json files; returns the markdown ('' if none)."""
  reports = read_runs(run_dirs)
  if not reports:
    return ""
  table = summarize(reports)
  vs = verdicts(reports, table)
  md = "# R1 pipeline over seeds\n\n" + (header + "\n\n" if header else "") + markdown(table, vs, len(reports))
  with open(os.path.join(workdir, name + ".md"), "w", encoding="utf-8") as f:
    f.write(md)
  js = {"n": len(reports),
        "stages": {s: {k: {"mean": v.mean, "std": v.std, "half_width": v.half_width, "n": v.n}
                       for k, v in t.items()} for s, t in table.items()},
        "resolution": {k: resolution(table, k) for k in METRICS if any(k in t for t in table.values())},
        "verdicts": vs}
  with open(os.path.join(workdir, name + ".json"), "w", encoding="utf-8") as f:
    json.dump(js, f, indent=2)
  return md
