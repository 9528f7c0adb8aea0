"""Held-out comparison of the base, R1-Zero and every R1 stage: DIR/report.md, DIR/report.json, DIR/plots/r1_*.png.

Every model is scored twice on the same held-out prompts: by the verifier (tagged accuracy: the format must hold
and the <answer> body must be right) and by the LAST-NUMBER rule (the last integer the completion writes equals the
answer; the only fair rule for a tag-less base model, applied to every model alike).
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import evaluation
from grpo_jax import metrics as metrics_lib
from grpo_jax import model as model_lib
from grpo_jax import pipeline
from grpo_jax import r1_rewards
from grpo_jax import sampling
from grpo_jax import sharding
from grpo_jax.tasks import base
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer as tok_lib

MODELS = ("base", "r1_zero", "r1_1_cold_start", "r1_2_grpo", "r1_4_sft", "r1_5_final")
LABELS = {"base": "base", "r1_zero": "R1-Zero", "r1_1_cold_start": "R1 s1 cold-start", "r1_2_grpo": "R1 s2 GRPO",
          "r1_4_sft": "R1 s4 SFT", "r1_5_final": "R1 s5 final"}


class HeldOut:
  """One greedy and one sampled generate function, compiled once and shared by every model."""

  def __init__(self, config):
    self.cfg, self.tok = config, tok_lib.load()
    rep = config.r1.report
    self.n, self.batch, self.pass_k = rep.n_samples, rep.batch, tuple(rep.pass_k)
    for k in self.pass_k:
      if k > self.n:
        raise ValueError(f"r1.report.pass_k: k={k} exceeds r1.report.n_samples={self.n}; lower k")
    self.mesh = sharding.make_mesh(config.mesh)
    self.mcfg = model_lib.ModelConfig.from_config(config.model)
    self.arrays = data_lib.eval_set(config.task, self.tok, rep.size, config.task.prompt_len)
    common = dict(top_k=0, top_p=1.0, max_new_tokens=config.sampling.max_new_tokens, eos_id=self.tok.eos_id,
                  pad_id=self.tok.pad_id)
    mk = lambda greedy: evaluation.make_generate(
        self.mcfg, sampling.SamplingConfig(temperature=config.sampling.temperature, greedy=greedy, **common),
        self.mesh, config.task.name, self.tok.tag_ids)
    self.greedy, self.sampled = mk(True), mk(False)
    self.fns = r1_rewards.python_fns(config.sampling.max_new_tokens, tuple(config.r1.forbidden))

  def _generate(self, fn, params, rng, repeat: int):
    q = self.arrays["prompt_NxP"].shape[0]
    per = self.batch // repeat
    outs = []
    for i, s in enumerate(range(0, q, per)):
      chunk = {k: np.repeat(v[s:s + per], repeat, axis=0) for k, v in self.arrays.items()}
      fields = {k: v for k, v in chunk.items() if k not in ("prompt_NxP", "prompt_mask_NxP")}
      outs.append(jax.device_get(fn(params, chunk["prompt_NxP"], chunk["prompt_mask_NxP"], fields,
                                    jax.random.fold_in(rng, i))))
    tokens, mask, lengths, acc, fmt = [np.concatenate(x) for x in zip(*outs)]
    comps = pipeline.completions_of(tokens, mask, self.tok.eos_id)
    texts = [self.tok.decode(c) for c in comps]
    answers_N = np.repeat(self.arrays["answer_N"], repeat)
    last = [r1_rewards.last_number(t) for t in texts]
    last_ok = np.asarray([a is not None and a == int(y) for a, y in zip(last, answers_N)], np.float32)
    batch = {"language_N": np.repeat(self.arrays["language_N"], repeat)}
    scores = pipeline.term_scores(texts, comps, batch, self.fns, acc, fmt)
    return dict(scores, last_ok=last_ok, last=last, lengths=lengths.astype(np.float32), texts=texts,
                spans=[evaluation.answer_span(list(c) + [self.tok.eos_id], self.tok.tag_ids) for c in comps])

  def __call__(self, params, seed: int = 0) -> tuple[dict[str, float], list[str]]:
    rng = jax.random.PRNGKey(seed)
    g = self._generate(self.greedy, params, rng, 1)
    m = {"accuracy_tagged": float(g["accuracy"].mean()), "accuracy_last_number": float(g["last_ok"].mean()),
         "format_rate": float(g["format"].mean()), "language_consistency": float(g["language"].mean()),
         "completion_len_mean": float(g["lengths"].mean()), "forbidden_rate": float(1 - g["harmless"].mean()),
         "recheck_per_completion": float(g["recheck"].mean())}
    s = self._generate(self.sampled, params, jax.random.fold_in(rng, 1), self.n)
    n = self.n
    for rule, ok, answers in (("tagged", s["accuracy"], s["spans"]), ("last_number", s["last_ok"], s["last"])):
      ok_QxN = ok.reshape(-1, n)
      for k in self.pass_k:
        m[f"pass@{k}_{rule}"] = float(np.mean([evaluation.pass_at_k(n, int(c), k) for c in ok_QxN.sum(-1)]))
      m[f"cons@{n}_{rule}"] = float(np.mean([
          evaluation.cons_at_k(answers[i * n:(i + 1) * n], list(ok_QxN[i] > 0.5), n) for i in range(len(ok_QxN))]))
    m["language_consistency_sampled"] = float(s["language"].mean())
    return m, g["texts"][:4]


def evaluate_stages(config, workdir: str) -> dict[str, dict[str, Any]]:
  """Each finished model's held-out metrics, cached in DIR/<stage>/heldout.json (a restart re-uses them)."""
  results, held = {}, None
  for stage in MODELS:
    path = os.path.join(workdir, stage, "heldout.json")
    if os.path.exists(path):
      with open(path) as f:
        results[stage] = json.load(f)
      continue
    if not pipeline.stage_done(workdir, stage):
      continue
    held = held or HeldOut(config)
    params = ckpt_lib.load_params(os.path.join(workdir, stage, "params"),
                                  pipeline.abstract_params(held.mesh, held.mcfg))
    m, texts = held(params, config.seed + 7)
    results[stage] = dict(m, samples=texts)
    with open(path + ".tmp", "w") as f:
      json.dump(results[stage], f, indent=2)
    os.replace(path + ".tmp", path)
  return results


# --------------------------------------------------------------------------------------------------------- plots
def _save(fig: Figure, path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  FigureCanvasAgg(fig)
  fig.savefig(path + ".tmp.png", dpi=90)
  os.replace(path + ".tmp.png", path)


def plot_comparison(results: dict, keys: tuple[str, ...], path: str) -> None:
  stages = [s for s in MODELS if s in results]
  fig = Figure(figsize=(max(8, 1.6 * len(keys)), 4.2))
  ax = fig.add_subplot(1, 1, 1)
  w = 0.8 / max(len(stages), 1)
  for j, s in enumerate(stages):
    ax.bar(np.arange(len(keys)) + j * w, [results[s].get(k, np.nan) for k in keys], w, label=LABELS[s])
  ax.set_xticks(np.arange(len(keys)) + 0.4 - w / 2)
  ax.set_xticklabels(keys, rotation=20, fontsize=8)
  ax.set_ylim(0, 1.05)
  ax.set_title("Held-out: base vs R1-Zero vs R1 stages")
  ax.legend(fontsize=7, ncol=3)
  fig.tight_layout()
  _save(fig, path)


def plot_curves(workdir: str, stage: str, names: tuple[str, ...], path: str) -> bool:
  """One panel per metric of an RL stage's metrics.jsonl (the aha curve for R1-Zero)."""
  mpath = os.path.join(workdir, stage)
  if not os.path.exists(os.path.join(mpath, "metrics.jsonl")):
    return False
  rows = metrics_lib.read_metrics(mpath)
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
  _save(fig, path)
  return True


# -------------------------------------------------------------------------------------------------------- report
ROWS = ("accuracy_last_number", "accuracy_tagged", "format_rate", "language_consistency", "completion_len_mean",
        "forbidden_rate", "recheck_per_completion")
AHA = ("train/completion_len_mean", "train/reward/recheck", "train/reward/recheck_fixed", "train/reward/format",
       "train/reward/accuracy", "train/reward/language")


def _first_last(workdir: str, stage: str, name: str) -> tuple[float, float] | None:
  d = os.path.join(workdir, stage)
  if not os.path.exists(os.path.join(d, "metrics.jsonl")):
    return None
  vals = [r[name] for r in metrics_lib.read_metrics(d) if name in r]
  if not vals:
    return None
  k = max(1, len(vals) // 10)  # mean of the first and last tenth: single RL steps are noisy
  return float(np.mean(vals[:k])), float(np.mean(vals[-k:]))


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
  results = evaluate_stages(config, workdir)
  rep = config.r1.report
  n = rep.n_samples
  keys = ROWS + tuple(f"pass@{k}_{r}" for r in ("last_number", "tagged") for k in rep.pass_k) + \
      (f"cons@{n}_last_number", f"cons@{n}_tagged", "language_consistency_sampled")
  stages = [s for s in MODELS if s in results]
  plots_dir = os.path.join(workdir, "plots")
  plot_comparison(results, ("accuracy_last_number", "accuracy_tagged", f"pass@{max(rep.pass_k)}_last_number",
                            f"cons@{n}_last_number", "format_rate", "language_consistency"),
                  os.path.join(plots_dir, "r1_compare.png"))
  have_aha = plot_curves(workdir, "r1_zero", AHA, os.path.join(plots_dir, "r1_zero_aha.png"))
  for s in ("r1_2_grpo", "r1_5_final"):
    plot_curves(workdir, s, AHA + ("train/reward/brevity", "train/reward/harmless"),
                os.path.join(plots_dir, f"{s}_curves.png"))
  lines = ["# R1-Zero vs R1 (held-out)", "",
           f"Held-out: {rep.size} test prompts of task `{config.task.name}` (language `{config.task.language}`), "
           f"greedy decoding for the single-sample rows; pass@k (unbiased, Chen et al.) and cons@{n} (majority vote) "
           f"from {n} samples at temperature {config.sampling.temperature}. `last_number`: the last integer the "
           "completion writes equals the answer (the same rule for every model, the only fair one for the tag-less "
           "base); `tagged`: the verifier's accuracy (format must hold, <answer> body right).", "",
           "| metric | " + " | ".join(LABELS[s] for s in stages) + " |",
           "|---|" + "---|" * len(stages)]
  for k in keys:
    lines.append(f"| {k} | " + " | ".join(_fmt(results[s].get(k, float("nan"))) for s in stages) + " |")
  lines += ["", "## Verdict", ""] + [f"- {v}" for v in verdict(results)]
  lines += ["", "## R1-Zero during training (mean of the first vs last tenth of steps)", ""]
  for name in AHA:
    fl = _first_last(workdir, "r1_zero", name)
    if fl:
      lines.append(f"- `{name}`: {fl[0]:.3f} -> {fl[1]:.3f}")
  rj = os.path.join(workdir, "r1_3_rejection", "stats.json")
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
    lines.append(f"- {LABELS[s]}: `{(results[s].get('samples') or [''])[0]}`")
  with open(os.path.join(workdir, "report.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(workdir, "report.json"), "w") as f:
    json.dump({s: {k: v for k, v in r.items() if k != "samples"} for s, r in results.items()}, f, indent=2)
  return results
