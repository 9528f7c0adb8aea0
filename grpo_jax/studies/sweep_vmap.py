"""A group of sweep runs (job grpo) whose programs agree, trained as ONE vmapped program (vmapped_runs.make_steps)
through `main`'s own path for S runs (jobs.run_group → train.train_group: one set-up for one run or S).

Each run keeps everything a `main` run of its config has in its own directory: config.json, the SFT stage (run
before the group, one run after another, through train.run_sft), metrics.jsonl (the same rows `main` writes; perf/*
differ), samples, plots, checkpoints holding the run's own state in the structure `main` restores (its learning
rate in the optimizer state; the per-run traced knobs are not saved: they come from its config), the run-config
record and stage.json. So `python -m grpo_jax.main` with the run's config and directory resumes or continues it,
and a rerun of the sweep resumes the group from the runs' checkpoints (runs saved at different steps continue in
sub-groups by step). The lock of every run's directory is held while the group trains.

What a run cannot do alone inside one program is handled at the group's level: SIGTERM/SIGINT stops all runs after
the same step (each saved); a failing Python reward stops the group (every run saved at that step); a run with
`rl.max_nonfinite_in_row` non-finite steps in a row is saved and stopped (RunStopped reported for it) while the
others continue (its lane keeps computing, unsaved and unlogged).
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Sequence

from grpo_jax.infra import errors
from grpo_jax.run import jobs
from grpo_jax.run import run_config
from grpo_jax.studies import vmapped_runs as seeds_lib


def signature(config) -> str:
  """What runs must share to train in one program: the whole config but the traceable knobs' values (reward term
  names and β = 0 vs > 0 stay: they change the program or the state tree) and the run seed (the initial state)."""
  flat = run_config.flatten(config)
  out = {k: v for k, v in flat.items() if k not in seeds_lib.TRACEABLE and k != "run_seed"}
  out["rewards"] = [e[0] for e in flat.get("rewards", [])]
  out["rl.beta==0"] = float(flat.get("rl.beta", 0.0)) == 0.0
  return json.dumps(out, sort_keys=True)


def run_group(configs: Sequence[Any], workdirs: Sequence[str], *, compiler_options: dict | None = None,
              log: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs every unfinished run of the group (jobs.run_group: `main`'s path for S runs); returns {'traces': [...],
  'failed': {workdir: why}, 'seconds'}. Raises errors.Preempted when stopped by a signal (everything saved),
  RunStopped for a failing Python reward."""
  t0 = time.perf_counter()
  if len({signature(c) for c in configs}) > 1:
    raise ValueError("run_group: the runs differ in more than the traceable keys (vmapped_runs.TRACEABLE) and the "
                     "run seed; group them with sweep_vmap.signature.")
  if any(c.job != "grpo" for c in configs):
    raise errors.ConfigError(f"config.job={configs[0].job!r}: only job=grpo runs can share a vmapped program; run "
                             "the sweep with --mode=serial.")
  info = jobs.run_group(configs, workdirs, compiler_options=compiler_options, log=lambda line: log(f"[sweep] {line}"))
  info["seconds"] = time.perf_counter() - t0
  return info
