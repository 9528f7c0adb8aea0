"""Sweeps: a grid of config overrides × seeds as one command, one vmapped program wherever the runs allow it.

  python -m grpo_jax.sweep --config=configs/<exp>.py[:arg] --workdir=DIR [--sweep="rl.beta=0.02,0.04 optim.lr=1e-6,3e-6"]
      [--seeds=N] [--mode=auto|vmap|serial|print|report] [--metrics=eval/accuracy,train/reward_mean@tail]
      [--launch="launch/tpu_vm.sh --name sweep-{i} --zone Z --accelerator v5litepod-16"] [--config.<key>=<value> ...]

Points come from `--sweep` or the config file's `get_sweep(h)` (grpo_jax/config/sweep_points.py), else the config alone; each is
applied with config_lib.override. `--seeds N` runs every point N times with `run_seed` = its `seed` + 0..N-1: the runs
of a point differ in params init and rollout rng and share the data order (`seed`). Every run is `DIR/<point>[,seed=K]`,
a complete `main` run directory (config.json, metrics.jsonl, checkpoints, stage records), so `python -m
grpo_jax.main` with that config and directory resumes it, and a rerun of the sweep skips finished runs, resumes
unfinished ones, and refuses a directory that a different config wrote (run_config's diff, one line).

Modes: `auto` trains each group of job-grpo runs whose compiled programs agree (sweep_vmap.signature: they differ
only in seeds and the traceable knobs of vmapped_runs.TRACEABLE) as ONE vmapped program when one device is visible, and
runs everything else one after another through `main`'s own path (jobs.run); `vmap` forces vmapping of every grpo
group, `serial` never vmaps; `print` checks every point as its run would, then writes one launch command per run
(DIR/launch.sh) and runs nothing; `report` only writes the report. The report, after every mode that runs:
DIR/sweep.md, DIR/sweep.csv and DIR/plots/ (mean, std and 95% CI over each point's seeds, sweep_report.py).
docs/sweeps.md has the details.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.util
import inspect
import math
import os
import re
import shlex
import sys
import time
from typing import Any, Callable, Sequence

import ml_collections

from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.infra import multihost
from grpo_jax.config import sweep_points
from grpo_jax.run import run_config
from grpo_jax.studies import sweep_report
from grpo_jax.studies import sweep_vmap
from grpo_jax.run import jobs
from grpo_jax.run import stages
from grpo_jax.hf import model_source
from grpo_jax.rl import auto
from grpo_jax.run import preflight
from grpo_jax.run import validate
from grpo_jax.infra import signals
from grpo_jax.infra import workdir_lock
from grpo_jax import cli
from grpo_jax.r1 import aha_seeds
from grpo_jax.r1 import seeds_report

MODES = ("auto", "vmap", "serial", "print", "report")


@dataclasses.dataclass
class Run:
  name: str                  # its directory under the sweep's workdir
  point: str                 # the report row: the point's name (without the seed)
  seed: int | None           # run_seed set by --seeds (None: the config's own)
  overrides: dict[str, Any]  # dotted overrides of the base config, `algo` expanded, run_seed included
  keys: dict[str, Any]       # the point's declared overrides (report columns)
  config: ml_collections.ConfigDict
  workdir: str
  # the keys the user set for this run (config_lib.user_keys_set): the command's --config flags and the point's
  # overrides (not the run_seed --seeds sets); `run` fills it in
  user_keys: frozenset[str] = frozenset()


def _config_module(config_file: str):
  path = config_file.split(":", 1)[0]
  if not os.path.isfile(path):
    raise errors.ConfigError(f"--config={config_file}: {path} does not exist.")
  spec = importlib.util.spec_from_file_location("_sweep_config_" + os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_points(config_file: str, config, sweep_text: str = "") -> list[sweep_points.Point]:
  """`--sweep` text, else the config file's `get_sweep(h)` (or `get_sweep(h, arg)`), else the config alone."""
  if sweep_text:
    return sweep_points.parse(sweep_text, config)
  module = _config_module(config_file) if config_file else None
  if module is None or not hasattr(module, "get_sweep"):
    return [sweep_points.Point((), ())]
  arg = config_file.split(":", 1)[1] if ":" in config_file else None
  fn = module.get_sweep
  points = fn(sweep_points, arg) if len(inspect.signature(fn).parameters) > 1 else fn(sweep_points)
  if (not isinstance(points, (list, tuple)) or not points
      or not all(isinstance(p, sweep_points.Point) for p in points)):
    raise errors.ConfigError(f"{config_file}: get_sweep(h) must return a non-empty list of points built with h.sweep, "
                             "h.product, h.zip or h.named.")
  return list(points)


# What the sweep itself writes in its --workdir (the report, the plan, launch.sh, the lock, R1 seed tables): a
# run directory so named was written over by the report, or stopped the sweep midway (a directory where a file goes).
OWN_FILES = ("plots", "sweep.md", "sweep.csv", "sweep.json", "launch.sh", workdir_lock.LOCK_NAME)
OWN_SUFFIXES = (".md", ".csv", ".json", ".sh", ".tmp", ".lock")


def make_runs(config, points: Sequence[sweep_points.Point], seeds: int, workdir: str) -> list[Run]:
  """Every point × seed as a Run with its resolved config (one-line ConfigError on a bad override)."""
  if seeds < 1:
    raise errors.ConfigError(f"--seeds={seeds}: need at least 1 (2 or more give a confidence interval).")
  if seeds > 1 and int(config.get("run_seed", -1)) >= 0:
    raise errors.ConfigError(f"config.run_seed={config.run_seed} and --seeds={seeds}: --seeds sets run_seed per run; "
                             "drop one of them.")
  names = sweep_points.names(points)
  runs, seen = [], {}
  for point, name in zip(points, names):
    declared = point.dict
    if seeds > 1 and "run_seed" in declared:
      raise errors.ConfigError(f"sweep point {name!r} sets run_seed and --seeds={seeds} sets it too; drop one.")
    overrides = sweep_points.expand(declared)
    c = config_lib.override(config, overrides)
    for i in range(seeds):
      seed = None if seeds == 1 else int(c.seed) + i
      over = overrides if seed is None else {**overrides, "run_seed": seed}
      run_name = ",".join(x for x in (name, "" if seed is None else f"seed={seed}") if x) or "run"
      d = sweep_points.dirname(run_name)
      if d.lower() in seen:  # case ignored: one directory on a case-insensitive file system (macOS)
        raise errors.ConfigError(f"sweep points {seen[d.lower()]!r} and {run_name!r} share the directory name {d!r}"
                                 " (case ignored); give them distinct names (h.named) or values.")
      if d.lower() in OWN_FILES or d.lower().endswith(OWN_SUFFIXES):
        raise errors.ConfigError(f"sweep point {run_name!r}: its directory {d!r} would be one of the sweep's own "
                                 f"files under --workdir ({', '.join(OWN_FILES)}, or a name ending in "
                                 f"{', '.join(OWN_SUFFIXES)}); rename the point (h.named).")
      seen[d.lower()] = run_name
      rc = c if seed is None else config_lib.override(c, {"run_seed": seed})
      runs.append(Run(d, name or "run", seed, over, declared, rc, os.path.join(workdir, d)))
  return runs


def groups(runs: Sequence[Run]) -> list[list[Run]]:
  """Runs whose compiled programs agree (sweep_vmap.signature), in the order of their first run."""
  out: dict[str, list[Run]] = {}
  for r in runs:
    out.setdefault(sweep_vmap.signature(r.config), []).append(r)
  return list(out.values())


def _own_lora_base(group: Sequence[Run]) -> bool:
  """LoRA runs without train.init_from whose frozen bases differ: each run's own SFT stage's params (sft.steps > 0),
  or a random init from its own run_seed (--seeds). A vmapped group shares one frozen base (train.train_group and
  vmapped_runs.init_states refuse them)."""
  c = group[0].config
  lora = c.model.get("lora")
  if lora is None or not lora.rank > 0 or c.train.init_from:
    return False
  return c.sft.steps > 0 or len({config_lib.run_seed(r.config) for r in group}) > 1


def lanes_misfit(group: Sequence[Run]) -> str | None:
  """Why the runs of `group` do not fit one device as one vmapped program (None: they do, or no memory figure): vmap
  stacks every array once per run, so S runs get 1/S of each device's memory, as train_group plans their `auto`
  values; a set memory knob (or nothing fitting) is checked against that share (auto.check_choosable). Reads only."""
  hbm = validate.device_memory()
  if len(group) < 2 or hbm is None:
    return None
  c = model_source.resolve(group[0].config)
  try:
    auto.check_choosable(c, validate.validate_mesh(c, validate.device_count()), hbm // len(group))
  except errors.ConfigError as e:
    return errors.one_line(str(e)).rstrip(".")
  return None


def decide(group: Sequence[Run], mode: str, n_devices: int) -> str:
  """'vmap' or 'serial' for a group of runs."""
  grpo = group[0].config.job == "grpo"
  if mode == "serial":
    return "serial"
  if mode == "vmap":
    if not grpo:
      raise errors.ConfigError(f"--mode=vmap: config.job={group[0].config.job!r} runs are not vmapped (only job=grpo "
                               "runs share one program); use --mode=auto or serial.")
    if len(group) > 1 and _own_lora_base(group):
      raise errors.ConfigError("--mode=vmap: model.lora without train.init_from gives every run its own frozen base "
                               "(its SFT stage's params, or an init from its run_seed), and a vmapped group shares "
                               "one; set train.init_from to one params directory, or use --mode=auto or serial.")
    return "vmap"
  own_base = _own_lora_base(group)
  return "vmap" if grpo and len(group) > 1 and n_devices == 1 and not own_base else "serial"


def _stage_list(config, workdir: str):
  return jobs.stage_list(config, workdir)


def finished(run: Run) -> bool:
  """Every stage of the run's job is recorded done (stages.py), and an R1 run's report written (_report_written)."""
  return (all(stages.is_done(st) for st in _stage_list(run.config, run.workdir))
          and _report_written(run.config, run.workdir))


def check(runs: Sequence[Run]) -> dict[str, bool]:
  """Every run's inputs (preflight) and its directory against its config (the stage plan), before anything is
  written: a bad value or a directory from a different config is one InputError line naming the run; several bad
  runs are one line each on stderr, then one error (as --mode=print reports them). Returns {run name: finished}."""
  done, bad = {}, []
  for r in runs:
    try:
      done[r.name] = check_run(r)
    except errors.InputError as e:
      bad.append(e)
  if len(bad) == 1:
    raise bad[0]
  if bad:
    for e in bad:
      print(f"Config error: {errors.one_line(str(e))}", file=sys.stderr, flush=True)
    raise type(bad[0])(f"{len(bad)} of the {len(runs)} sweep runs have bad inputs (one line each above; nothing was "
                       f"written), the first: {errors.one_line(str(bad[0]))}")
  return done


def check_run(r: Run) -> bool:
  """One run's checks (check's); -> whether it finished earlier. An input error names the run."""
  try:
    with config_lib.user_keys_set(r.user_keys):  # its warnings name what this run's user set
      c = model_source.resolve(r.config)
      jobs.check(c, r.workdir)
    todo = _stage_list(c, r.workdir)
    stages.allow_set(c)
    stages.rerun_set(c, todo)
    actions = stages.plan(todo, c, r.workdir)
  except errors.InputError as e:
    raise type(e)(f"sweep run {r.name}: {e}") from e
  return all(a == "skip" for a in actions.values()) and _report_written(c, r.workdir)


def check_printed(runs: Sequence[Run], launch: str, log: Callable[[str], None], remote: bool = True) -> None:
  """--mode=print: every point checked as its run will check it (check_run: no compile), before launch.sh is
  written; each bad point is one `Config error: sweep run <name>: ...` line on stderr, then one ConfigError. A
  launcher's runs are other processes: they are checked for the devices their mesh names (an axis at -1 counted
  as 1: the fewest it runs on, never a false refusal of the mesh) and for unknown memory (the fit is each launched
  run's own preflight, logged), and, where they go to other machines (`remote`), a run whose config names local
  paths this host lacks (the pod's /data/...) is left to the launched run (logged), not refused for them."""

  def devices(c) -> int:  # the devices a launched run's mesh names; an axis at -1 (all the others) counted as 1
    return math.prod(max(int(c.mesh[a]), 1) for a in ("data", "fsdp", "tensor"))

  if launch != "local":
    log("[sweep] checking the runs for the devices their mesh names, of unknown memory: the memory fit is checked by "
        "each launched run")
  bad: dict[str, str] = {}
  for r in runs:
    if r.point in bad:
      continue  # one line per point: its other seeds fail alike
    absent = _absent_paths(r.config) if launch != "local" and remote else []
    if absent:
      log(f"[sweep] {r.name}: {', '.join(absent)} not on this host (the launched machines' paths): its inputs are "
          "checked by the launched run only")
      continue
    try:
      with contextlib.ExitStack() as stack:
        if launch != "local":
          stack.enter_context(validate.elsewhere(devices(r.config), None))
        check_run(r)
    except errors.InputError as e:
      bad[r.point] = errors.one_line(str(e))
      print(f"Config error: {bad[r.point]}", file=sys.stderr, flush=True)
  if bad:
    points = len({r.point for r in runs})
    raise errors.ConfigError(f"--mode=print: {len(bad)} of the {points} sweep point(s) have bad inputs (one line each "
                             "above); fix or drop them, then print again (nothing was written).")


PATH_KEYS = ("train.init_from", "sft.init_from", "task.tokenizer", "task.data_dir")


def _absent_paths(config) -> list[str]:
  """'key=value' of the local paths a run's config names (PATH_KEYS, hf: stripped) that this host does not have."""
  out = []
  for key in PATH_KEYS:
    section, name = key.split(".")
    value = str((config.get(section) or {}).get(name, "") or "")
    path = value[3:] if value.startswith("hf:") else value
    if path and path != "init_from" and "://" not in path and not os.path.exists(path):
      out.append(f"{key}={value}")
  return out


def _report_written(config, workdir: str) -> bool:
  """An R1 pipeline run is finished once its held-out report is written too: a run stopped after its last stage and
  before the report (or whose stages were copied in) reruns, skips every stage and writes it."""
  return config.job != "r1_pipeline" or os.path.exists(os.path.join(workdir, "report.json"))


# The launchers that take a sweep run: every one in launch/ that runs the main job, each by the one calling convention
# they share, `<launcher> [its own flags] --config FILE --workdir DIR -- <main's flags>` (launch/README.md), so a
# printed line is the prefix, then that. (The convention lives in the launchers, not here: a person types the same
# line, and a launcher added to launch/ needs only to take it and a row here.) The value: whether its runs go to
# other machines — their workdir must be an absolute path those machines mount (the launcher refuses a relative
# one), and the inputs this host lacks are theirs to check; local_multiprocess.py runs them here.
LAUNCHERS = {"tpu_vm.sh": True, "gpu_multinode.sh": True, "local_multiprocess.py": False}
_INTERPRETER = re.compile(r"(python[0-9.]*|bash|sh|env)")  # words before the launcher's path


def launcher(launch: str) -> str | None:
  """The launch/ script a --launch prefix runs (a LAUNCHERS key), None for 'local'. A prefix that runs another
  program (which would be handed `--config FILE --workdir DIR -- flags` it does not take: `srun ...`,
  `python -m grpo_jax.main`), or that sets what the sweep writes per run, is one ConfigError naming the ones that
  can."""
  if launch == "local":
    return None
  can = ", ".join(f"launch/{k}" for k in LAUNCHERS)
  try:
    words = shlex.split(launch)
  except ValueError as e:
    raise errors.ConfigError(f"--launch={launch!r}: {e}.") from None
  i = 0  # past VAR=value, python / bash / env: the program's path
  while i < len(words) and (re.match(r"[A-Za-z_]\w*=", words[i])
                            or _INTERPRETER.fullmatch(os.path.basename(words[i]))):
    i += 1
  name = os.path.basename(words[i]) if i < len(words) else ""
  if name not in LAUNCHERS:
    raise errors.ConfigError(f"--launch={launch!r}: {name or 'it'} cannot take a sweep run (--config FILE --workdir "
                             f"DIR -- <flags>); the launchers that can: {can}, or --launch=local.")
  own = [w for w in words[i + 1:] if w == "--" or w.split("=")[0] in ("--config", "--workdir")]
  if own:
    raise errors.ConfigError(f"--launch={launch!r}: {own[0]} is the sweep's to write, once per run (--config FILE "
                             "--workdir DIR -- <flags>); drop it from the prefix.")
  return name


def launch_commands(runs: Sequence[Run], config_file: str, base: dict[str, Any], launch: str = "local") -> list[str]:
  """One shell command per run: `main` with the run's overrides as --config flags (after the sweep command's own),
  locally or through a launcher (`launch/tpu_vm.sh ...`: `{i}` and `{name}` in it become the run's index and
  directory name, e.g. one TPU slice per run), in the launchers' convention (LAUNCHERS)."""
  out = []
  for i, r in enumerate(runs):
    flags = [f"--config.{k}={sweep_points.literal(v)}" for k, v in {**base, **r.overrides}.items()]
    if launch == "local":
      argv = ["python", "-m", "grpo_jax.main", f"--config={config_file}", f"--workdir={r.workdir}", *flags]
    else:
      prefix = shlex.split(launch.replace("{i}", str(i)).replace("{name}", r.name))
      argv = [*prefix, "--config", config_file, "--workdir", r.workdir, "--", *flags]
    out.append(shlex.join(argv))
  return out


def write_report(workdir: str, runs: Sequence[Run], metrics: Sequence[str], *, title: str, header: str) -> str:
  points: dict[str, list[str]] = {}
  keys: dict[str, dict] = {}
  exact = sweep_points.exact_keys([r.keys for r in runs])  # as the points' names write them
  for r in runs:
    points.setdefault(r.point, [])
    keys[r.point] = {k: sweep_points.fmt(v, k in exact) for k, v in r.keys.items()}
    if finished(r):
      points[r.point].append(r.workdir)
  points = {p: d for p, d in points.items() if d}
  cells = sweep_report.collect(points, metrics)
  md = sweep_report.write(workdir, cells, title=title, header=header, keys=keys)
  if runs and runs[0].config.job == "r1_pipeline":
    # The R1 pipeline's own table: every stage × metric over seeds, and its verdicts (r1/seeds_report.py).
    for p, dirs in points.items():
      # the point's directory name: its name may hold a '/' (train.init_from=/data/base), which named no file
      seeds_report.write(workdir, dirs, header=header,
                         name="r1_seeds" if len(points) == 1 else f"r1_seeds_{sweep_points.dirname(p)}")
    if len(points) == 1:  # R1-Zero's length / verification / accuracy start -> end over the seeds (r1/aha_seeds.py)
      aha_seeds.write(workdir, next(iter(points.values())), header=header)
  return md


def default_metrics(config) -> tuple[str, ...]:
  return sweep_report.DEFAULT_REPORT_METRICS if config.job == "r1_pipeline" else sweep_report.DEFAULT_METRICS


def run(config, workdir: str, *, config_file: str = "", sweep_text: str = "", seeds: int = 1, mode: str = "auto",
        metrics: Sequence[str] = (), launch: str = "local", base_overrides: dict[str, Any] | None = None,
        command: str = "", compiler_options: dict | None = None, log: Callable[[str], None] = print) -> dict:
  """The whole sweep command; returns {'runs', 'groups': [{mode, runs, traces, seconds}], 'failed': {run: why},
  'report': markdown or the launch commands}. Raises errors.* for the CLI (InputError, Preempted)."""
  multihost.refuse_multi_process(
      "python -m grpo_jax.sweep", "its runs", "unset GRPO_JAX_DISTRIBUTED and run the sweep once, from one process: "
      "on a pod or several GPU nodes, --mode=print --launch='launch/tpu_vm.sh --name sweep-{i} ...' (or "
      "launch/gpu_multinode.sh ..., launch/local_multiprocess.py -n N on this machine) writes DIR/launch.sh, one "
      "multi-process launch per run, and --mode=report gathers their results (docs/sweeps.md).")
  if mode not in MODES:
    raise errors.ConfigError(f"--mode={mode!r}: choose one of {', '.join(MODES)}.")
  if not workdir:
    raise errors.InputError("--workdir is required: the sweep's directory (one subdirectory per run).")
  points = load_points(config_file, config, sweep_text)
  runs = make_runs(config, points, seeds, workdir)
  for r in runs:  # the command's --config flags, then the point's own (a sweep axis reaches the run as a flag does)
    own = set(r.overrides) - ({"run_seed"} if r.seed is not None else set())
    r.user_keys = frozenset(base_overrides or ()) | own
  metrics = tuple(metrics) or default_metrics(config)
  for m in metrics:
    sweep_report.parse(m)
  summary: dict[str, Any] = {"runs": runs, "groups": [], "failed": {}}
  preflight.check_workdir(workdir)  # print and report write into it too (a file there was a traceback)
  if mode == "print":
    name = launcher(launch)
    if name and LAUNCHERS[name] and not os.path.isabs(workdir):
      raise errors.InputError(f"--workdir={workdir} is relative: with --launch=...{name} each run's directory is "
                              f"DIR/<run> on the launched machines, which launch/{name} refuses relative; pass an "
                              "absolute path every host mounts.")
    check_printed(runs, launch, log, remote=bool(name and LAUNCHERS[name]))
    cmds = launch_commands(runs, config_file, dict(base_overrides or {}), launch)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "launch.sh"), "w", encoding="utf-8") as f:
      f.write("#!/usr/bin/env bash\n# " + (command or "python -m grpo_jax.sweep --mode=print") + "\nset -e\n"
              + "\n".join(cmds) + "\n")
    summary["report"] = "\n".join(cmds)
    return summary
  title = f"Sweep: {config_file or 'config'} ({len({r.point for r in runs})} points × {seeds} seed(s))"
  if mode == "report":
    summary["report"] = write_report(workdir, runs, metrics, title=title, header=_header(command, runs, [], {}))
    return summary
  done = check(runs)
  import jax  # pylint: disable=g-import-not-at-top
  plan = [(group, decide(group, mode, jax.device_count())) for group in groups(runs)]  # refusals before any write
  for i, (group, how) in enumerate(plan):
    why = lanes_misfit(group) if how == "vmap" else None
    if why and mode == "vmap":
      raise errors.ConfigError(f"--mode=vmap: the {len(group)} runs {group[0].name}, ... in one program get 1/"
                               f"{len(group)} of each device's memory each: {why}; use --mode=auto or serial (one "
                               "run at a time).")
    if why:
      log(f"[sweep] {len(group)} runs ({group[0].name}, ...) do not fit one device as one vmapped program ({why}); "
          "running them one after another.")
      plan[i] = (group, "serial")
  # the runs' checks above said each run's warnings once; run, they check again without naming keys a second time
  with workdir_lock.WorkdirLock(workdir), signals.GracefulStop() as stop, config_lib.user_keys_set(()):
    _write_plan(workdir, runs, command, seeds, mode)
    for group, how in plan:
      todo = [r for r in group if not done[r.name]]
      for r in group:
        if done[r.name]:
          log(f"[sweep] {r.name}: finished earlier with this config; skipped.")
      if not todo:
        continue
      entry = {"mode": how, "runs": [r.name for r in todo], "traces": [], "seconds": 0.0}
      summary["groups"].append(entry)
      t0 = time.perf_counter()
      if stop.should_stop():
        raise errors.Preempted(f"sweep {workdir} before {todo[0].name}")
      if how == "vmap":
        log(f"[sweep] {len(todo)} run(s) in one vmapped program: {', '.join(r.name for r in todo)}")
        try:
          info = sweep_vmap.run_group([r.config for r in todo], [r.workdir for r in todo],
                                      compiler_options=compiler_options, log=log)
          entry["traces"] = info["traces"]
          summary["failed"].update({os.path.basename(k): v for k, v in info["failed"].items()})
        except errors.RunStopped as e:
          summary["failed"].update({r.name: errors.one_line(str(e)) for r in todo})
      else:
        for r in todo:
          if stop.should_stop():
            raise errors.Preempted(f"sweep {workdir} before {r.name}")
          log(f"[sweep] {r.name}: running (python -m grpo_jax.main's path)")
          try:
            jobs.run(r.config, r.workdir)
          except errors.RunStopped as e:
            summary["failed"][r.name] = errors.one_line(str(e))
            log(f"[sweep] {r.name} stopped itself: {summary['failed'][r.name]}")
      entry["seconds"] = round(time.perf_counter() - t0, 1)
    summary["report"] = write_report(workdir, runs, metrics, title=title,
                                     header=_header(command, runs, summary["groups"], summary["failed"]))
  return summary


def _write_plan(workdir: str, runs: Sequence[Run], command: str, seeds: int, mode: str) -> None:
  run_config.write_json_atomic(os.path.join(workdir, "sweep.json"), {
      "command": command, "seeds": seeds, "mode": mode,
      "runs": [{"name": r.name, "point": r.point, "seed": r.seed, "overrides": r.overrides} for r in runs]})


def _header(command: str, runs: Sequence[Run], groups_run: list[dict], failed: dict[str, str]) -> str:
  n_done = sum(finished(r) for r in runs)
  lines = [f"Command: `{command}`" if command else "",
           f"Written {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}: {n_done} of {len(runs)} runs finished "
           "(unfinished runs are left out of the table)."]
  for g in groups_run:
    compiled = f", {sum(g['traces'])} compiled program(s)" if g["mode"] == "vmap" else ""
    lines.append(f"- {g['mode']}: {len(g['runs'])} run(s){compiled}, {g['seconds']:.0f} s in this invocation")
  for name, why in failed.items():
    lines.append(f"- **{name} stopped itself**: {why}")
  return "\n".join(x for x in lines if x)


# ------------------------------------------------------------------------------------------------------------ CLI


def main(argv) -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    print(f"Error: unexpected argument {argv[1]!r}; see --helpfull.", file=sys.stderr)
    sys.exit(errors.EXIT_INPUT)
  config = cli.config_value("configs/grpo_arith.py:small")
  cli.start(flags.FLAGS.verbose)  # logging; a closed console stops the sweep as SIGHUP does, after saving
  cli.compilation_cache()  # the runs of a point and the points that share a program compile it once (cli.py)
  cli.collect_less()
  command = "python -m grpo_jax.sweep " + " ".join(shlex.quote(a) for a in sys.argv[1:])
  fs = flags.FLAGS
  try:
    out = run(config, fs.workdir or "", config_file=config_flags.get_config_filename(fs["config"]),
              sweep_text=fs.sweep, seeds=fs.seeds, mode=fs.mode, metrics=fs.metrics or (), launch=fs.launch,
              base_overrides=config_flags.get_override_values(fs["config"]), command=command)
  except Exception as e:  # pylint: disable=broad-except
    cli.exit_on(e, fs.verbose)  # Preempted: exit 0 with its line; a bug re-raised
    return
  signals.ignore_from_now()  # the sweep is over: a late signal must not turn its exit into a traceback
  print(out["report"])
  if out["failed"]:
    print(f"Stopped: {len(out['failed'])} run(s) stopped themselves: "
          + "; ".join(f"{k}: {v}" for k, v in out["failed"].items()), file=sys.stderr, flush=True)
    cli.finish(errors.EXIT_STOPPED)


def _define_flags() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  cli.define_flags()  # --config, --workdir, --verbose: main's
  flags.DEFINE_string("sweep", "", "Axes 'key=v1,v2 key2=...' (crossed); default: the config file's get_sweep(h).")
  flags.DEFINE_integer("seeds", 1, "Runs per point (run_seed = seed + 0..N-1).")
  flags.DEFINE_enum("mode", "auto", list(MODES), "auto | vmap | serial | print | report.")
  flags.DEFINE_list("metrics", [], "Report metrics, e.g. eval/accuracy,train/reward_mean@tail,"
                    "report/*/accuracy_last_number.")
  flags.DEFINE_string("launch", "local", "print mode: 'local' (python -m grpo_jax.main) or a launcher prefix "
                      "('launch/tpu_vm.sh --name sweep-{i} --zone Z --accelerator v5litepod-16', "
                      "'launch/gpu_multinode.sh --hosts h1,h2', 'launch/local_multiprocess.py -n 2'); each run "
                      "is the prefix, then --config FILE --workdir DIR/<run> -- <its flags>.")


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  _define_flags()
  app.run(main, flags_parser=cli.parse_flags)
