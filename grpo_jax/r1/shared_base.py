"""`r1.base_from`: the base stage taken from another run's finished base instead of pre-trained again.

RL seeds over one base: `python -m grpo_jax.sweep --seeds N --config.r1.base_from=SRC` gives every run the same
pre-trained model (SRC/base), so the runs differ in their RL rollouts only (run_seed) and the base's own variance is
not sampled. The copy is checked, not trusted: SRC's base record must be finished and its config view (what the
base was trained with) must equal this run's, apart from `run_seed` (the RL seed), the sampling / evaluation keys
that only the base's report reads (`_FREE_PREFIXES`) and keys SRC's code did not have yet. The copied stage records
SRC's view, so every downstream stage's `stage.upstream` names the base it really starts from, and `copied_from` in
DIR/base/stage.json says where it came from.
"""
from __future__ import annotations

import json
import os
import shutil

from grpo_jax.r1 import heldout
from grpo_jax.run import run_config
from grpo_jax.run import stages as stages_lib
from grpo_jax.run import validate as validate_lib

KEY = "r1.base_from"
# Keys that may differ between SRC's base and this run's: the RL seed (a base stage never reads it), and what only
# the base's sampling and held-out report read (pre-training is teacher-forced: its params do not depend on them).
# Where those differ, heldout.json is not copied (_same_heldout) and this run's report samples the base itself; the
# copied metrics.jsonl keeps SRC's pre-training evaluations. So one base serves runs that differ in the RL engine
# (e.g. `sampling.engine=static` against `auto`: docs/performance.md's before/after of the aha config).
_FREE = ("run_seed",)
_FREE_PREFIXES = ("sampling.", "eval.", "r1.report.", "resolved.sampling.")
# Copied besides the params: the params' checksums and the pre-training loss curve; heldout.json too when the held-out
# report would be the same (_same_heldout), so the report does not sample the same model again per seed.
_FILES = ("params.integrity.json", "metrics.jsonl")


def source_dir(config) -> str:
  """SRC's base stage directory ('' when r1.base_from is unset). SRC may be a run's workdir or its base directory."""
  src = str(config.r1.get("base_from", "") or "")
  if not src:
    return ""
  for d in (os.path.join(src, "base"), src):
    rec = stages_lib.read_record(d)
    if rec and rec.get("stage") == "base":
      if not rec.get("done"):
        validate_lib.fail(KEY, f"the base stage in {d} is not finished; finish it first or drop {KEY}.")
      if not os.path.isdir(os.path.join(d, "params")):  # was a FileNotFoundError traceback from the copy
        validate_lib.fail(KEY, f"the finished base stage in {d} has no params/ (deleted or moved); redo it there "
                          f"(--config.train.rerun_stages=base in that run) or drop {KEY}.")
      return os.path.abspath(d)
  validate_lib.fail(KEY, f"{src!r} holds no base stage record (base/stage.json); give the --workdir of a run whose "
                    "base stage finished, or drop the key to pre-train the base here.")
  return ""


def view(config, src: str, own: dict) -> dict:
  """SRC's recorded base view, after checking it against `own` (this run's base view)."""
  rec = stages_lib.read_record(src) or {}
  theirs = rec.get("config") or {}
  differ = [k for k in run_config.diff(theirs, own)
            if k not in _FREE and not k.startswith(_FREE_PREFIXES) and k in theirs]
  if differ:
    show = ", ".join(f"{k} ({theirs.get(k)!r} there, {own.get(k, '<absent>')!r} here)" for k in differ[:6])
    validate_lib.fail(KEY, f"the base in {src} was trained with a different config: {show}; point it at a base "
                      f"made with this config (e.g. the same config with '--config.r1.stages=(\"base\",)') or drop it.")
  return theirs


def _same_heldout(config, src: str) -> bool:
  path = os.path.join(os.path.dirname(src), "config.json")
  if not os.path.exists(path):
    return False
  with open(path, encoding="utf-8") as f:
    theirs = run_config.flatten(json.load(f))
  mine = run_config.flatten(config)
  keys = [k for k in theirs if any(k == p or (p.endswith(".") and k.startswith(p)) for p in heldout.HELDOUT_KEYS)]
  return all(theirs[k] == mine.get(k) for k in keys)


def copy(config, src: str, dst: str) -> None:
  """SRC's params (and the files above) into this run's base directory (the record is the pipeline's to write)."""
  os.makedirs(dst, exist_ok=True)
  params = os.path.join(dst, "params")
  if os.path.exists(params):
    shutil.rmtree(params)
  shutil.copytree(os.path.join(src, "params"), params)
  names = _FILES + (("heldout.json",) if _same_heldout(config, src) else ())
  for name in names:
    if os.path.exists(os.path.join(src, name)):
      shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
