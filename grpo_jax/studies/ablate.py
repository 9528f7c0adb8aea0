"""Ablation harness: seeds × variants → DIR/table.md, DIR/table.csv, DIR/*.png (mean ± 95% CI over seeds).

  python -m grpo_jax.ablate --config=configs/ablations/<table>.py[:small] --workdir=DIR

A config names a table module `grpo_jax.studies.ablations.<config.table>` that provides
  TITLE, CLAIM                         strings for the report
  variants(cfg) -> list[str]           the rows
  run_cell(cfg, variant, seeds) -> {"scalars": {metric: [one float per seed]},
                                    "curves": {metric: {"x": [steps], "y": [[per step] per seed]}},
                                    "auto": {key: "value (why)"}}   (the `auto` knobs its runs resolved, if any)
  header(cfg) -> str, verdict(cfg, summaries) -> str,
  appendix(cfg, cells) -> str                      (optional: more markdown from the raw cells)
Each finished cell is written to DIR/cells/<variant>.json with the config's fingerprint, so an interrupted run
resumes without redoing finished cells; a cell from a different config stops the run instead of being mixed in.
SIGTERM / SIGINT / SIGHUP or a closed console stop the table gracefully, as they stop `python -m grpo_jax.main`
(the same signals.GracefulStop and console guard, cli.py): a row whose runs are training stops at their next step
boundary (its seeds' scratch runs are dropped, no cell file: the rerun runs the row from its start), a row that
is not in a loop finishes and is saved, no later row starts, and the command says which row stopped and how many
rows are kept, then exits 0; rerunning the same command resumes from the kept rows.
What each cell's runs resolved their `auto` knobs to (logged once where they resolve, as a main run logs them) is
kept in its cell file and gathered in DIR/auto.json, {variant: {key: "value (why)"}}, as a main run's DIR/auto.json.
"""
import contextlib
import datetime
import hashlib
import importlib
import json
import os
import re
import sys
import time
from types import ModuleType
from typing import Callable, Iterable

from absl import logging

from grpo_jax import cli
from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.infra import multihost
from grpo_jax.infra import signals
from grpo_jax.infra import workdir_lock
from grpo_jax.run import preflight
from grpo_jax.run import run_config
from grpo_jax.studies import report
from grpo_jax.rl import auto
from grpo_jax.run import validate


# Keys added to table configs after tables were run, at the value that reproduces those runs: left out of the
# fingerprint at that value, so a workdir of cells from before the key existed still resumes (its cells are the
# same numbers); any other value is in it.
ADDED_AT_DEFAULT = {"base": "shared"}  # train_table.BASES (2026-12-07)


def fingerprint(cfg) -> str:
  """Hash of everything that changes a cell's numbers (the whole config)."""
  tree = json.loads(cfg.to_json_best_effort())
  tree = {k: v for k, v in tree.items() if k not in ADDED_AT_DEFAULT or v != ADDED_AT_DEFAULT[k]}
  text = json.dumps(tree, sort_keys=True)
  return hashlib.sha1(text.encode()).hexdigest()[:16]


def load_table(cfg) -> ModuleType:
  if "table" not in cfg:
    raise ValueError("config.table is missing: name a module in grpo_jax/ablations (e.g. table='kl_estimators').")
  try:
    return importlib.import_module(f"grpo_jax.studies.ablations.{cfg.table}")
  except ModuleNotFoundError as e:
    raise ValueError(f"config.table={cfg.table!r}: no module grpo_jax.studies.ablations.{cfg.table} ({e}).") from e


def _cell_path(workdir: str, variant: str) -> str:
  return os.path.join(workdir, "cells", re.sub(r"[^A-Za-z0-9_.=-]+", "_", variant) + ".json")


def _check_cell(variant: str, cell: dict, n_seeds: int) -> None:
  if not all(isinstance(k, str) and isinstance(v, str) for k, v in dict(cell.get("auto", {})).items()):
    raise ValueError(f"table cell {variant!r}: 'auto' must map each resolved key to 'value (why)' "
                     "(auto.resolve's second result).")
  for m, vals in cell.get("scalars", {}).items():
    if len(vals) != n_seeds:
      raise ValueError(f"table cell {variant!r}: scalar {m!r} has {len(vals)} values for {n_seeds} seeds.")
  for m, c in cell.get("curves", {}).items():
    if len(c["y"]) != n_seeds or any(len(y) != len(c["x"]) for y in c["y"]):
      raise ValueError(f"table cell {variant!r}: curve {m!r} must be seeds × len(x).")


def variant_keys(cfg, variant: str, cli_keys: Iterable[str] = ()) -> contextlib.AbstractContextManager:
  """The keys the user set for a variant's runs (config_lib.user_keys_set): the table's `--config.run.<key>` flags
  and the variant's overrides, which reach its run config as a --config flag reaches a main run's."""
  own = dict(cfg.variants).get(variant, {}) if "variants" in cfg else {}
  return config_lib.user_keys_set(set(cli_keys) | set(own.keys()))


def run_cells(cfg, workdir: str, table: ModuleType, log: Callable[[str], None] = print,
              cli_keys: Iterable[str] | None = ()) -> dict[str, dict]:
  """Runs (or loads) every variant's cell; each finished cell is saved before the next starts. `cli_keys` None: the
  variants' keys were said by check_variants (their warnings are not repeated)."""
  os.makedirs(os.path.join(workdir, "cells"), exist_ok=True)
  fp = fingerprint(cfg)
  seeds = list(range(cfg.seed0, cfg.seed0 + cfg.seeds)) if "seed0" in cfg else list(range(cfg.seeds))
  cells: dict[str, dict] = {}
  variants = list(table.variants(cfg))
  seen: dict[str, str] = {}  # cell file name (case ignored) -> its row
  for variant in variants:  # one cell file per row: a shared one gave a row another's numbers, unrun
    name = os.path.basename(_cell_path(workdir, variant))
    if name.lower() in seen:
      raise ValueError(f"variants {seen[name.lower()]!r} and {variant!r} share the cell file {name} (names are "
                       "compared with other characters than letters, digits, '_', '.', '=' and '-' as '_', and case "
                       "ignored); rename one.")
    seen[name.lower()] = variant
  for n_done, variant in enumerate(variants):
    path = _cell_path(workdir, variant)
    if os.path.exists(path):
      with open(path) as f:
        saved = json.load(f)
      if saved.get("variant", variant) != variant:
        raise ValueError(f"--workdir={workdir}: {path} holds the cell of variant {saved['variant']!r}, not "
                         f"{variant!r}; use a new --workdir or delete it.")
      if saved.get("fingerprint") != fp:
        raise ValueError(f"--workdir={workdir} holds cell {variant!r} from a different config; use a new "
                         f"--workdir or delete {path}.")
      cells[variant] = saved["cell"]
      log(f"[ablate] {variant}: loaded from {path}")
      continue
    kept = f"{n_done} of {len(variants)} rows finished and kept in {os.path.join(workdir, 'cells')}"
    signals.check_stop(f"before row {variant!r} of table {workdir}", kept=kept)  # between rows: nothing to save
    t0 = time.perf_counter()
    try:
      with config_lib.user_keys_set(()) if cli_keys is None else variant_keys(cfg, variant, cli_keys):
        cell = table.run_cell(cfg, variant, seeds)
    except errors.Preempted as e:  # a loop of the row stopped at a step boundary; no cell file is written for it
      # (a table's seeds train in scratch directories: train_table.train_seeds; what a row's set-up caches, e.g. the
      # R1 table's cold-start pipeline, resumes from its own checkpoints)
      when = "before their first step" if e.step == 0 else f"after step {e.step}" if e.step else "between stages"
      raise errors.Preempted(f"in row {variant!r} of table {workdir} (its runs stopped {when}; the row reruns from "
                             "its start)", kept=kept) from e
    _check_cell(variant, cell, len(seeds))
    cell = json.loads(json.dumps(cell, default=float))  # plain floats only, as it will be re-read
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      json.dump({"fingerprint": fp, "variant": variant, "seconds": time.perf_counter() - t0, "cell": cell}, f)
    os.replace(tmp, path)
    cells[variant] = cell
    log(f"[ablate] {variant}: {time.perf_counter() - t0:.1f}s")
  return cells


# Settings that act only through the importance ratio ρ = π/π_old: the clip range (and CISPO's weight range), the
# dual clip, SAPO's gate temperatures, and the objective itself (clip, CISPO and SAPO, token- or sequence-level ratio,
# all have the gradient A·∇log π at ρ = 1: PPO's ρA, CISPO's r̂A, SAPO's 4σ(0)(1 − σ(0))·ρA).
RATIO_ONLY = ("rl.eps_low", "rl.eps_high", "rl.dual_clip", "rl.sapo_tau_pos", "rl.sapo_tau_neg", "rl.objective",
              "rl.ratio_level")
# KL-Cov's penalty coef·|log π − log π_old| (rl.token_select='kl_cov') acts through the ratio too: on-policy it is 0 with
# a zero gradient (rl_step.old_logp), so 'all' and 'kl_cov' rows, or kl_cov rows of other kl_cov_* values, train alike
KL_COV_ONLY = ("rl.token_select", "rl.kl_cov_ratio", "rl.kl_cov_coef")


def _ratio_only(diff: list[str], a: dict, b: dict) -> bool:
  """Whether two flat run configs differ only in settings that act through the ratio π/π_old (RATIO_ONLY, and
  KL-Cov's where neither row selects tokens any other way)."""
  kl_cov = all(r.get("rl.token_select", "all") in ("all", "kl_cov") for r in (a, b))
  return set(diff) <= set(RATIO_ONLY) | (set(KL_COV_ONLY) if kl_cov else set())


def check_variants(cfg, table: ModuleType, cli_keys: Iterable[str] = ()) -> bool:
  """Two rows that can only come out identical are refused before anything runs: variants whose run configs differ
  only in RATIO_ONLY settings while every update is on-policy (rl.mu 1, one minibatch: ρ ≡ 1, so no clip or gate
  ever acts). Table i and m's first runs (2026-12-05) measured exactly that: clip-higher rows equal to clip 0.2.
  -> whether it built (and so checked, its warnings naming the keys variant_keys gives) every variant's config."""
  if not hasattr(table, "build_config") or "variants" not in cfg:
    return False
  flat = {}
  for name, overrides in cfg.variants:
    with variant_keys(cfg, name, cli_keys):
      flat[name] = run_config.flatten(table.build_config(cfg, overrides))
  names = list(flat)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      diff = sorted(k for k in flat[a].keys() | flat[b].keys() if flat[a].get(k) != flat[b].get(k))
      # partial rollouts (rl.partial_rollouts) do not make ρ leave 1: a carried token's lag is between μ and π_prox
      # (the rollout correction's weight), and π_old of a single update is the policy itself (rl_step.old_logp)
      on_policy = all(int(flat[n].get("rl.mu", 1)) == 1 and int(flat[n].get("rl.minibatches", 1)) in (0, 1)
                      for n in (a, b))
      if diff and _ratio_only(diff, flat[a], flat[b]) and on_policy:
        raise ValueError(f"variants {a!r} and {b!r} differ only in {', '.join(diff)}, which act through the ratio "
                         "π/π_old, but every update is on-policy (rl.mu 1, one minibatch: the ratio is 1), so the two "
                         "rows would be identical; set rl.mu=2 or rl.minibatches=2 in the table's run (as "
                         "configs/ablations/objectives.py does).")


def check_memory(cfg, table: ModuleType) -> None:
  """A variant's seeds train as ONE vmapped program on one device (train_table.make_runs), 1/S of its memory each,
  as their `auto` values are planned there: a set memory knob (rl.minibatches, ...) over that share, or nothing
  fitting it, is refused before the first cell runs (auto.check_choosable), not at the compile of that variant's
  cell after the cells before it ran."""
  if not hasattr(table, "build_config") or "variants" not in cfg:
    return
  hbm, lanes = validate.device_memory(), max(int(cfg.seeds), 1)
  for name, overrides in cfg.variants:
    with config_lib.user_keys_set(()):  # check_variants said its warnings
      c = table.build_config(cfg, overrides)
    try:
      auto.check_choosable(c, validate.validate_mesh(c, 1), None if hbm is None else hbm // lanes)
    except validate.ConfigError as e:
      raise validate.ConfigError(f"variant {name!r}: {str(e).rstrip('.')} (its {lanes} seeds share one device: 1/"
                                 f"{lanes} of its memory each).") from None


# The harness keys a table config may hold (configs/ablations/*.py), each with the least value it takes: a count of
# steps, prompts or samples, a seed, a pre-training length. Unchecked, --config.steps=0 and --config.eval_every=0
# trained every row and then stopped on a traceback (an empty curve indexed, a modulo by 0), and a negative count
# ran as none.
TABLE_COUNTS = {"steps": 1, "eval_every": 1, "base_steps": 0, "seed0": 0, "passk_n": 0, "passk_prompts": 1,
                "passk_chunk": 1, "measure_prompts": 1, "measure_samples": 1, "n_draws": 1}
# ... and its fractions in [0, 1]: the toy base's share of right answers, table l's saturation accuracy (0 = off).
TABLE_FRACTIONS = {"p_correct": "the share of right answers the toy base is pre-trained on",
                   "saturation": "the training accuracy that counts as saturated (0 = off)"}


def check_table_keys(cfg) -> None:
  """The table config's own keys (TABLE_COUNTS, TABLE_FRACTIONS), before any row runs: one line naming the key."""
  if not (errors.integer(cfg.seeds) and cfg.seeds >= 1):
    raise errors.ConfigError(f"config.seeds={cfg.seeds!r}: need an integer of at least 1 (5 or more for a useful "
                             "interval).")
  for key, least in TABLE_COUNTS.items():
    if key in cfg and not (errors.integer(cfg[key]) and least <= cfg[key] < validate.MAX_SEED):
      raise errors.ConfigError(f"config.{key}={cfg[key]!r}: must be an integer >= {least} (and below 2**31).")
  for key, what in TABLE_FRACTIONS.items():
    if key in cfg and not (validate.finite(cfg[key]) and 0 <= cfg[key] <= 1):
      raise errors.ConfigError(f"config.{key}={cfg[key]!r}: must be a number in [0, 1] ({what}).")
  # table b's group sizes (--config.Gs=0 was an IndexError traceback; 1 a line naming rl.G, a key it has not) and
  # table c's model sizes ('0x8': "not enough values to unpack", naming no key; a compile size not among the sizes
  # compiled nothing, unsaid)
  if "Gs" in cfg and not (cfg.Gs and all(errors.integer(g) and g >= 2 for g in cfg.Gs)):
    raise errors.ConfigError(f"config.Gs={tuple(cfg.Gs)!r}: give group sizes, each an integer >= 2 (a baseline "
                             "compares a sample with the others of its group).")
  for key in ("sizes", "compile_sizes"):
    bad = [x for x in cfg.get(key, ()) if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", str(x))]
    if bad:
      raise errors.ConfigError(f"config.{key}: {bad[0]!r} is not '<hidden>x<layers>' of two positive integers "
                               "(e.g. '512x8').")
  extra = [x for x in cfg.get("compile_sizes", ()) if x not in tuple(cfg.get("sizes", ()))]
  if extra:
    raise errors.ConfigError(f"config.compile_sizes: {extra[0]!r} is not among config.sizes={tuple(cfg.sizes)!r}, so "
                             "nothing would compile it; add it to config.sizes or drop it.")


def overridden_cli_keys(cfg, cli_keys: Iterable[str]) -> None:
  """A `--config.run.<key>` that a variant's own overrides set to another value changes nothing in that row (the
  overrides are applied over cfg.run): one warning naming the key and the rows. Each preset variant sets every rl.*
  key its preset does, so --config.run.rl.beta=0.1 on table j changed no row, without a word."""
  if "variants" not in cfg or "run" not in cfg:
    return
  flat = config_lib.flat(cfg.run)
  for key in sorted(cli_keys):
    rows = [name for name, own in cfg.variants if key in own and own[key] != flat.get(key)]
    if rows:
      message = (f"config.run.{key}={flat.get(key)!r} (the command line's): no effect in row(s) "
                 f"{', '.join(map(repr, rows))}, whose own overrides set {key} (the table's variants are applied "
                 f"over config.run); change the rows in the table's config to vary it.")
      if config_lib.first_time(message):
        logging.warning("%s", message)


def run(cfg, workdir: str, command: str = "", table: ModuleType | None = None,
        log: Callable[[str], None] = print, cli_keys: Iterable[str] = ()) -> str:
  """Runs the table and writes table.md / table.csv / plots; returns the markdown. `cli_keys`: the run-config keys
  the command line set (`--config.run.<key>`), besides each variant's own overrides."""
  multihost.refuse_multi_process("python -m grpo_jax.ablate", "its cells' runs",
                                 "unset GRPO_JAX_DISTRIBUTED and run the table once, from one process.")
  table = table or load_table(cfg)
  check_table_keys(cfg)
  overridden_cli_keys(cfg, cli_keys)
  said = check_variants(cfg, table, cli_keys)
  check_memory(cfg, table)
  # One table per directory (DIR/run.lock, as main and sweep take theirs): two commands on one DIR would each run
  # and write the same cells and table files, the later overwriting the earlier. Held until the table is written.
  with workdir_lock.WorkdirLock(workdir):
    return _run_locked(cfg, workdir, command, table, log, cli_keys, said)


def _run_locked(cfg, workdir: str, command: str, table: ModuleType, log: Callable[[str], None], cli_keys,
                said: bool) -> str:
  t0 = time.perf_counter()
  with signals.GracefulStop.ensure():  # the command's (or a caller's): a signal between rows is a stop, not a kill
    cells = run_cells(cfg, workdir, table, log, None if said else cli_keys)
  columns = tuple(cfg.columns) if "columns" in cfg else ()
  plots = report.write_plots(workdir, cells)
  report.write_csv(os.path.join(workdir, "table.csv"), cells, columns)
  summ = report.summaries(cells)
  head = [f"Command: `{command}`" if command else "",
          f"Measured {datetime.date.today().isoformat()}, {time.perf_counter() - t0:.0f}s in this invocation "
          f"(cells loaded from a previous run count 0)."]
  if hasattr(table, "header"):
    head.append(table.header(cfg))
  title = cfg.title if "title" in cfg else table.TITLE
  claim = cfg.claim if "claim" in cfg else table.CLAIM
  md = report.markdown(cells, title=title, claim=claim, header="\n".join(h for h in head if h),
                       columns=columns, verdict=table.verdict(cfg, summ) if hasattr(table, "verdict") else "",
                       plots=plots)
  if hasattr(table, "appendix"):
    md += "\n" + table.appendix(cfg, cells)
  with open(os.path.join(workdir, "table.md"), "w") as f:
    f.write(md)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(cfg.to_json_best_effort(indent=2, sort_keys=True))
  resolved = {v: dict(sorted(c["auto"].items())) for v, c in cells.items() if c.get("auto")}
  if resolved:  # what the cells' runs resolved their `auto` knobs to (each cell file holds its own)
    with open(os.path.join(workdir, "auto.json"), "w") as f:
      json.dump(resolved, f, indent=2)
      f.write("\n")
  return md


def usage_error(argv, config, workdir) -> str:
  """What is wrong with the command line, or ''."""
  if len(argv) > 1:
    return f"unexpected argument {argv[1]!r}; see --helpfull."
  if config is None:
    return "--config is required, e.g. --config=configs/ablations/algorithms.py:small."
  if not workdir:
    return "--workdir is required: the directory for cells/, table.md, table.csv and plots."
  try:
    preflight.check_workdir(workdir)  # a gs:// one became a local directory gs:/...
  except errors.InputError as e:
    return str(e)
  return ""


def main(argv) -> None:
  from absl import flags
  config = cli.config_value("configs/ablations/algorithms.py:small")  # one line if its file failed to load
  problem = usage_error(argv, config, flags.FLAGS.workdir)
  if problem:  # exit 2 (errors.EXIT_INPUT), as grpo_jax.main and grpo_jax.sweep, before anything is written
    print(f"Error: {problem}", file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  cli.start(flags.FLAGS.verbose)  # logging; a closed console stops the table as SIGHUP does (cli.py)
  command = "python -m grpo_jax.ablate " + " ".join(a for a in sys.argv[1:])
  cli.compilation_cache()  # cells that share a program compile it once (cli.py)
  cli.collect_less()
  try:
    run_keys = {k[len("run."):] for k in cli.override_keys() if k.startswith("run.")}  # cfg.run: the run config
    md = run(config, flags.FLAGS.workdir, command, cli_keys=run_keys)
  except Exception as e:  # pylint: disable=broad-except
    if isinstance(e, ValueError) and not isinstance(e, errors.InputError):  # a table's own check (load_table, ...)
      print(f"Config error: {e}", file=sys.stderr)
      sys.exit(errors.EXIT_INPUT)
    cli.exit_on(e, flags.FLAGS.verbose)  # Preempted: exit 0, the rows kept and how to resume; a bug re-raised
    return
  signals.ignore_from_now()  # the table is written: a late signal must not turn its exit into a traceback
  print(md)


if __name__ == "__main__":
  from absl import app
  cli.define_flags()  # --config, --workdir, --verbose: main's
  app.run(main, flags_parser=cli.parse_flags)  # a config file that fails to load: one line (was a traceback)
