"""Chaos harness: runs kill at seeded random moments, resume, and must end bit-identical to an uninterrupted run.

  python benchmarks/chaos.py --faults=36 --seed=0 --out=/tmp/chaos      # the long schedule (docs/reliability.md)
  python benchmarks/chaos.py --faults=3 --scenarios=grpo --seed=1       # a short one
  python benchmarks/chaos.py --print --faults=36                         # the schedule only
  python benchmarks/chaos.py --plant=skip_batch --faults=2 --scenarios=grpo   # must report differences

A schedule is a seeded list of faults. Each fault names a scenario (a `python -m` command on a `:small` config, one
entry of SCENARIOS), an action (SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGTERM then SIGINT 0.1 s later, or `disk_full`:
the disk fills under the live run), a moment of the scenario (a random time after the start, inside a step, an
evaluation, a checkpoint save, at a stage boundary: the n-th time this process reaches it, plus a random delay), and
optionally damage done to the newest checkpoint after the process ended (its data files truncated, bytes flipped
in each, the files deleted, a broken state/_METADATA; it waits for a later fault where a stage that will resume has two
undamaged steps). The harness starts the scenario's command in its chaos directory, acts at the moment, waits for
the exit and checks it is one the project promises (0 after a signal, with `Preempted:`, its `received` warning and
no torn save; SIGKILL's -9; 130 or death by the signal before the handlers exist; for a full disk one `Error:` line
with exit 2), damages, and goes on with the next fault: each fault's process resumes what the previous one left (a
run that finishes before its fault's moment closes the round; the fault is tried on a fresh directory). A last
run finishes the scenario; then every artifact is compared with the scenario's uninterrupted run (`artifacts`):
every leaf of the newest checkpoint of every `checkpoints/` directory (whatever keys the state has) and its
metadata, every params checkpoint, every metrics row (perf/* and the restore's ckpt/* counts excluded), every sample row and the other JSON outputs
(stage records without their timestamps, rejection data, reports). Every damaged step must have been detected:
moved to `checkpoints/corrupt/`.

A new scenario is one SCENARIOS entry: its command and the moments it has. The disk fills on a small tmpfs mounted
for the chaos directory when mounting works (root), else through a file-size limit set on the live process
(prlimit RLIMIT_FSIZE = 0: every write that grows a file fails with EFBIG, the quota-like error); the report says
which. `--plant` starts every process through this file with a bug planted (a resume that skips a data batch, an
rng that is not restored): the comparison must then fail (tests/test_chaos.py keeps that check).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import itertools
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/conftest.py's XLA:CPU flags: tiny programs compile 2-5x faster; every run of a comparison uses the same.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                      " --xla_cpu_use_fusion_emitters=false")

# ------------------------------------------------------------------------------------------------------ scenarios
# A 1-layer, 32-wide model, 16 new tokens, 64 examples a split: what is resumed (params, Adam, data position, rng)
# is the same at any size, and every kill costs a process start.
TINY = ("--config.model.hidden=32", "--config.model.layers=1", "--config.model.heads=2", "--config.model.kv_heads=1",
        "--config.model.inter=64", "--config.sampling.max_new_tokens=16", "--config.task.train_size=64",
        "--config.task.test_size=64", "--config.eval.size=32", "--config.eval.n_samples=2",
        "--config.log.tensorboard=False", "--config.log.plots=False")
# The `random` reward term beside accuracy and format (Bernoulli per sample, replayed from the sample's hash, so a
# resumed run draws the same): the tiny untrained model scores every row 0 on accuracy and format, which gives zero
# advantages and a gradient of rounding residue, and a resume compared on untrained params would test little.
# With it every step trains on a real gradient (grad norm 0.25-0.42, 2026-12-06).
GRPO = ("grpo_jax.main", "--config=configs/grpo_arith.py:small", *TINY, "--config.sft.steps=0",
        "--config.train.steps=8", "--config.train.ckpt_every=2", "--config.train.eval_every=4",
        "--config.train.sample_every=2", '--config.rewards=(("accuracy",1.0),("format",0.2),("random",1.0))')
SFT_RL = ("grpo_jax.main", "--config=configs/grpo_arith.py:small", *TINY, "--config.sft.steps=6",
          "--config.sft.batch=8", "--config.train.steps=4", "--config.train.ckpt_every=2",
          "--config.train.eval_every=2")
# Partial rollouts with the calculator (docs/tools.md): the `tools` tokenizer, where `</tool_call>` and the 15 ordinary
# single-token pieces below each stop a row (the random model emits each ~1/516 of the time: rows pause every few
# tokens, and some are paused or half-fed when a step ends)
TOOL_MARKERS = ("</tool_call>", "rim", "sor", " el", " ez", " it", "inks", "inku", "irst", " dan", " ansu", " aski",
                " asks", " prim", " then", " ansor")
TOOLS_PARTIAL = GRPO + ("--config.sampling.engine=continuous", "--config.rl.partial_rollouts=True",
                        "--config.rl.max_staleness=1", "--config.rl.rollout_budget=6",
                        "--config.rl.rollout_correction=tis", "--config.task.tokenizer=tools",
                        "--config.model.vocab_size=516", "--config.tools.env=calculator",
                        f"--config.tools.stop_markers={TOOL_MARKERS!r}", "--config.tools.max_obs_tokens=8")
# R1's stages up to its second GRPO (rejection sampling needs a model that solves some problems: minutes of training).
R1 = ("grpo_jax.main", "--config=configs/r1_pipeline.py:small", *TINY[:5], "--config.model.max_len=96",
      "--config.r1.stages=('base','r1_zero','r1_1_cold_start','r1_2_grpo')",
      "--config.sampling.max_new_tokens=24", "--config.task.train_size=256", "--config.log.plots=False",
      "--config.train.ckpt_every=2", "--config.rl.G=2", "--config.rl.prompts_per_step=2",
      "--config.eval.size=4", "--config.eval.batch=4", "--config.eval.n_samples=2", "--config.eval.pass_k=(1,2)",
      *(f"--config.r1.{s}.{k}={v}" for s in ("pretrain", "cold_start", "sft2")
        for k, v in (("steps", 2), ("batch", 4), ("lr", 1e-3), ("warmup_steps", 1))),
      "--config.r1.cold_start.examples=8", "--config.r1.zero.steps=3", "--config.r1.grpo.steps=3",
      "--config.r1.final.steps=3", "--config.r1.rejection.prompts=6", "--config.r1.rejection.n=4",
      "--config.r1.rejection.keep_per_prompt=1", "--config.r1.report.size=4", "--config.r1.report.batch=4",
      "--config.r1.report.n_samples=2", "--config.r1.report.pass_k=(1,2)")


@dataclasses.dataclass(frozen=True)
class Moment:
  """Where in a run a fault lands: after the n-th output line matching `line` (or the n-th new path matching one of
  `paths` under the workdir; or, with neither, the process start), plus U(0, spread) seconds."""
  kind: str
  line: str = ""
  paths: tuple[str, ...] = ()
  spread: float = 0.0
  max_nth: int = 2  # n is drawn from 1..max_nth


ANYTIME = Moment("time", spread=8.0, max_nth=1)  # U(0, 8 s) after the start: imports, compiling, restoring, steps
STEP = Moment("step", line=r"^step \d+/\d+ .*(reward_mean|loss)=", spread=1.0)
# GRPO's train row of an eval step (eval_every=4): the evaluation runs next
EVAL = Moment("eval", line=r"^step (4|8)/8 .*reward_mean=", spread=0.4, max_nth=1)
SAVE = Moment("save", paths=tuple(os.path.join(*["*"] * d, "*.orbax-checkpoint-tmp*") for d in range(4)))
SFT_EVAL = Moment("eval", line=r"^step 6/6 .*loss=", spread=1.0, max_nth=1)  # the SFT stage's final evaluation follows
# SFT's params appear: then its evaluation, its record, and the RL stage
SFT_BOUNDARY = Moment("boundary", paths=("sft/params",), spread=1.5, max_nth=1)
R1_BOUNDARY = Moment("boundary", paths=("*/stage.json",), spread=1.0, max_nth=3)  # a stage starts (its running record)
SWEEP_STEP = Moment("step", line=r"runs, step \d+/\d+", spread=1.0)  # the vmapped group's line per step
SWEEP_BOUNDARY = Moment("boundary", line=r"^\[sweep\] .*(running|vmapped program)", spread=2.0, max_nth=1)


@dataclasses.dataclass(frozen=True)
class Scenario:
  name: str
  argv: tuple[str, ...]             # `python -m` module and flags; --workdir=DIR is added
  moments: tuple[Moment, ...]
  what: str = ""


# A new scenario is one entry (its state keys are compared like any other: the partial-rollout carry's below).
SCENARIOS = {s.name: s for s in (
    Scenario("grpo", GRPO, (ANYTIME, STEP, EVAL, SAVE), "GRPO, 8 steps: steps, evaluations, saves"),
    Scenario("sft_rl", SFT_RL, (STEP, SFT_EVAL, SFT_BOUNDARY, SAVE),
             "the main job's SFT stage, then RL: the stage boundary"),
    Scenario("lora", GRPO + ("--config.model.lora.rank=4", "--config.model.lora.alpha=8.0", "--config.optim.lr=1e-3"),
             (STEP, EVAL, SAVE), "LoRA GRPO: adapters checkpointed, the base rebuilt"),
    Scenario("engine_packing", GRPO + ("--config.sampling.engine=continuous", "--config.sampling.slots=8",
                                       "--config.rl.packing=True"),
             (STEP, EVAL, SAVE), "the continuous engine (8 slots for 32 rows) with packed training passes"),
    Scenario("partial", GRPO + ("--config.sampling.engine=continuous", "--config.rl.partial_rollouts=True",
                                "--config.rl.max_staleness=1", "--config.rl.rollout_budget=6",
                                "--config.rl.rollout_correction=tis"),
             (ANYTIME, STEP, EVAL, SAVE), "partial rollouts: in-flight rows, their KV and versions in the state"),
    Scenario("tools_partial", TOOLS_PARTIAL, (ANYTIME, STEP, EVAL, SAVE),
             "multi-turn rows in the carry: rows paused for the calculator, or half-fed, carried across steps"),
    Scenario("r1", R1, (STEP, SAVE, R1_BOUNDARY, ANYTIME), "the R1 pipeline's first four stages, 2-3 steps each"),
    Scenario("sweep", ("grpo_jax.sweep", *GRPO[1:], "--sweep=rl.beta=0.02,0.04"), (SWEEP_STEP, SAVE, SWEEP_BOUNDARY),
             "a 2-point sweep trained as one vmapped program"),
)}

ACTIONS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGTERM+SIGINT", "disk_full")
DAMAGES = ("truncate", "flip", "delete_shard", "metadata")


@dataclasses.dataclass(frozen=True)
class Fault:
  scenario: str
  action: str
  moment: str     # a Moment.kind of the scenario
  nth: int        # its n-th occurrence in this process
  frac: float     # where in the moment's spread
  damage: str = ""  # done to the newest checkpoint after the process ended ('' = none)

  def describe(self) -> str:
    return (f"{self.scenario:<15} {self.action:<15} {self.moment:>8} #{self.nth} +{self.frac:.2f}"
            + (f"  then damage: {self.damage}" if self.damage else ""))


def schedule(seed: int, n: int, scenarios: Sequence[str] = tuple(SCENARIOS), actions: Sequence[str] = ACTIONS,
             damage_every: int = 3) -> list[Fault]:
  """n faults over the scenarios (round robin; a scenario's faults run in a row); the actions, each scenario's
  moment kinds and the damage kinds (on every `damage_every`-th fault) each cycled, then shuffled with the seed."""
  rng = random.Random(seed)
  acts = [actions[i % len(actions)] for i in range(n)]
  rng.shuffle(acts)
  dmg = [DAMAGES[i % len(DAMAGES)] for i in range(n // damage_every)] if damage_every else []
  dmg += [""] * (n - len(dmg))
  rng.shuffle(dmg)
  moments = {s: itertools.cycle(rng.sample(SCENARIOS[s].moments, len(SCENARIOS[s].moments))) for s in scenarios}
  out = []
  for i in range(n):
    s = scenarios[i % len(scenarios)]
    m = next(moments[s])
    out.append(Fault(s, acts[i], m.kind, rng.randint(1, m.max_nth), round(rng.random(), 3), dmg[i]))
  return sorted(out, key=lambda f: list(scenarios).index(f.scenario))


# ------------------------------------------------------------------------------------------------------ processes
def child_env(cache_dir: str | None = None) -> dict[str, str]:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
  if FAST_COMPILE_FLAGS not in env.get("XLA_FLAGS", ""):
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + FAST_COMPILE_FLAGS).strip()
  if cache_dir and not env.get("JAX_COMPILATION_CACHE_DIR"):  # compiled once for all runs: the same executables
    env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return env


def command(argv: Sequence[str], workdir: str, plant: str = "") -> list[str]:
  if plant:
    return [sys.executable, os.path.abspath(__file__), "exec", f"--plant={plant}", "--", *argv, f"--workdir={workdir}"]
  return [sys.executable, "-m", *argv, f"--workdir={workdir}"]


@dataclasses.dataclass
class Outcome:
  rc: int | None
  fired: bool                   # the action happened (False: the process ended before the moment)
  at: float = 0.0               # seconds after the start
  last_line: str = ""           # the last output line before the action: where the run was
  in_save: bool = False         # a save's temporary directory existed at the action
  torn: list[str] = dataclasses.field(default_factory=list)  # save temporaries left when the process ended
  sent: list[tuple[str, float]] = dataclasses.field(default_factory=list)  # signals that reached it, and when
  preempted_at: float | None = None  # when its `Preempted:` line came (monotonic)
  output: str = ""
  problem: str = ""             # why the exit is not one the project promises ('' = fine)


def _new_paths(workdir: str, patterns: Sequence[str]) -> set[str]:
  return {p for pat in patterns for p in glob.glob(os.path.join(workdir, pat))}


class _Trigger:
  """When a moment has come in a running process: its time is fixed once the line or path is seen."""

  def __init__(self, moment: Moment, nth: int, frac: float, workdir: str, t0: float):
    self.moment, self.nth, self.frac, self.workdir = moment, nth, frac, workdir
    self.pattern = re.compile(moment.line) if moment.line else None
    self.before = _new_paths(workdir, moment.paths) if moment.paths else set()  # a killed run's leftovers
    self.seen: list[str] = []
    self.at = None if (moment.line or moment.paths) else t0 + frac * moment.spread

  def due(self, lines: list[tuple[float, str]]) -> bool:
    if self.at is None and self.pattern is not None:
      hits = [t for t, line in list(lines) if self.pattern.search(line)]
      if len(hits) >= self.nth:
        self.at = hits[self.nth - 1] + self.frac * self.moment.spread
    elif self.at is None:
      self.seen += [p for p in sorted(_new_paths(self.workdir, self.moment.paths) - self.before) if p not in self.seen]
      if len(self.seen) >= self.nth:
        self.at = time.monotonic() + self.frac * self.moment.spread
    return self.at is not None and time.monotonic() >= self.at


def run_process(cmd: list[str], workdir: str, env: dict, moment: Moment | None = None, nth: int = 1,
                frac: float = 0.0, act: Callable[[subprocess.Popen], None] | None = None,
                timeout: float = 900.0) -> Outcome:
  """Starts `cmd`, calls `act(proc)` at the moment (None: runs to the end), waits for the exit."""
  lines: list[tuple[float, str]] = []
  t0 = time.monotonic()
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")

  def read():
    for line in proc.stdout:
      lines.append((time.monotonic(), line.rstrip("\n")))

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  out = Outcome(None, False)
  trigger = _Trigger(moment, nth, frac, workdir, t0) if moment is not None else None
  leftovers = _new_paths(workdir, SAVE.paths)  # a killed save's temporary directory, until the run cleans it
  try:
    while proc.poll() is None and time.monotonic() - t0 < timeout:
      if trigger is not None and not out.fired and trigger.due(lines):
        out.fired, out.at = True, time.monotonic() - t0
        out.last_line = lines[-1][1] if lines else "(no output yet)"
        out.in_save = bool(_new_paths(workdir, SAVE.paths) - leftovers)
        act(proc)
      time.sleep(0.005)
  finally:
    if proc.poll() is None:  # hung, or the harness failed: never left behind
      proc.kill()
      out.problem = f"did not exit within {timeout:.0f} s"
    proc.wait()
    reader.join(timeout=10)
  out.rc, out.output = proc.returncode, "\n".join(line for _, line in lines)
  out.torn = sorted(_new_paths(workdir, SAVE.paths))
  out.sent = list(getattr(proc, "chaos_sent", []))
  out.preempted_at = next((t for t, line in lines if line.startswith("Preempted:")), None)
  return out


def _signal(names: str) -> Callable[[subprocess.Popen], None]:
  def act(proc):
    proc.chaos_sent = []  # (signal, when) that reached a live process (a second may come after it exited)
    for i, name in enumerate(names.split("+")):
      if i:
        time.sleep(0.1)
      if proc.poll() is None:
        proc.send_signal(getattr(signal, name))
        proc.chaos_sent.append((name, time.monotonic()))
  return act


def expected(action: str, out: Outcome) -> str:
  """'' when the exit is one the project promises for this action, else what is wrong."""
  if out.problem:
    return out.problem
  text, rc = out.output, out.rc
  if rc == 1 or "Traceback (most recent call last)" in text:
    return f"exit {rc} with a traceback"
  if not out.fired:
    return "" if rc == 0 else f"exit {rc} without a fault"
  if action == "SIGKILL":
    return "" if rc in (-9, 0) else f"exit {rc} after SIGKILL"
  if action == "disk_full":
    last = text.strip().splitlines()[-1] if text.strip() else ""
    if rc == 0:
      return ""
    return "" if rc == 2 and last.startswith("Error:") else f"exit {rc} on a full disk (last line {last!r})"
  first = getattr(signal, action.split("+")[0])
  if rc in (130, -first):  # before the handlers exist: nothing written yet
    return ""
  # 0: stopped after saving ("Preempted:"), or the signal came while the last step's save finished the run (the
  # final comparison catches a run that claims to be done early).
  if rc != 0:
    return f"exit {rc} after {action}"
  if "Preempted:" in text:
    if f"{action.split('+')[0]} received" not in text:
      return f"{action}: 'Preempted:' without the 'received' warning"
    # the second signal must be absorbed ("received again") when it came while the run was stopping, not after
    # the run had said it stopped (then the exit ignores it: signals.ignore_from_now)
    late = out.preempted_at is not None and len(out.sent) > 1 and out.sent[1][1] >= out.preempted_at - 0.05
    if len(out.sent) > 1 and not late and "received again" not in text:
      return f"{action}: the second signal was not absorbed ('received again' missing)"
    if out.torn:
      return f"{action}: stopped with a torn save left behind ({out.torn[0]})"
  return ""


# ------------------------------------------------------------------------------------------------------ the disk
class Disk:
  """The chaos directory's storage: a tmpfs mounted on it (root), else a file-size limit on the live process."""

  def __init__(self, directory: str, size_mb: int = 256, tmpfs: bool = True):
    self.directory, self.mounted = directory, False
    os.makedirs(directory, exist_ok=True)
    if tmpfs and os.geteuid() == 0 and shutil.which("mount"):
      r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", directory],
                         capture_output=True, text=True)
      self.mounted = r.returncode == 0
    self.how = (f"a {size_mb} MiB tmpfs filled by a file" if self.mounted else
                "a file-size limit of 0 set on the live process (prlimit RLIMIT_FSIZE: writes fail with EFBIG)")
    self.filler = os.path.join(directory, "disk_filler")

  def fill(self, proc: subprocess.Popen) -> None:
    if not self.mounted:
      resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (0, 0))
      return
    fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
      for chunk in (1 << 20, 1 << 12):  # MiBs, then the last pages: nothing is left
        try:
          while True:
            os.write(fd, b"\0" * chunk)
        except OSError:
          pass
    finally:
      os.close(fd)

  def free(self) -> None:
    if os.path.exists(self.filler):
      os.remove(self.filler)

  def close(self) -> None:
    if self.mounted:
      subprocess.run(["umount", self.directory], check=False)
      self.mounted = False


# ------------------------------------------------------------------------------------------------------ damage
def committed_steps(ckpt_dir: str) -> list[int]:
  """A checkpoints directory's committed step numbers, oldest first (orbax's commit marker: what a resume reads)."""
  return sorted(int(n) for n in os.listdir(ckpt_dir)
                if n.isdigit() and os.path.exists(os.path.join(ckpt_dir, n, "commit_success.txt")))


def _live_checkpoint_dirs(workdir: str) -> list[str]:
  """checkpoints/ directories of stages not recorded done: the ones a rerun restores from (a finished stage's are
  never read again, so damage there would go unnoticed by design)."""
  out = []
  for d in sorted(glob.glob(os.path.join(workdir, "**", "checkpoints"), recursive=True)):
    parent = os.path.dirname(d)
    try:
      with open(os.path.join(parent, "stage.json"), encoding="utf-8") as f:
        if json.load(f).get("done"):
          continue
    except (OSError, ValueError):
      pass
    out.append(d)
  return out


def damage(workdir: str, kind: str, rng: random.Random, damaged: set[tuple[str, int]], live_only: bool = True) -> str:
  """Damages the newest committed step of a checkpoints dir with >= 2 undamaged steps (live_only: of a stage a
  rerun resumes); returns what it did."""
  dirs = (_live_checkpoint_dirs(workdir) if live_only else
          sorted(glob.glob(os.path.join(workdir, "**", "checkpoints"), recursive=True)))
  candidates = [d for d in dirs if committed_steps(d) and (d, committed_steps(d)[-1]) not in damaged
                and len([s for s in committed_steps(d) if (d, s) not in damaged]) >= 2]
  if not candidates:
    return "none: no live checkpoint directory whose newest step and one more are undamaged"
  d = rng.choice(candidates)
  step = committed_steps(d)[-1]
  state = os.path.join(d, str(step), "state")
  # the process's data files and the merged ones (a small tree's arrays are read from state/d, a copy)
  data = sorted(glob.glob(os.path.join(state, "ocdbt.process_0", "d", "*")) + glob.glob(os.path.join(state, "d", "*")),
                key=os.path.getsize)
  if kind == "metadata":
    with open(os.path.join(state, "_METADATA"), "wb") as f:
      f.write(b'{"tree_metadata": {"broken')
    what = "state/_METADATA overwritten"
  # every data file of the step: which ones hold the arrays depends on the tree (a LoRA step's are read from the
  # merged state/d, so damaging the process's largest file alone left a readable step and nothing to detect)
  elif kind == "truncate":
    for f in data:
      os.truncate(f, os.path.getsize(f) // 2)
    what = f"{len(data)} data files truncated to half"
  elif kind == "flip":
    for f in data:
      size = os.path.getsize(f)
      with open(f, "r+b") as fh:
        for off in sorted(rng.sample(range(size), min(64, size))):
          fh.seek(off)
          b = fh.read(1)
          fh.seek(off)
          fh.write(bytes([b[0] ^ 0xFF]))
    what = f"64 bytes flipped in each of {len(data)} data files"
  elif kind == "delete_shard":  # every shard: one of them holds the params (an export, reading params only, needs it)
    for f in data:
      os.remove(f)
    what = f"{len(data)} data shards deleted"
  else:
    raise ValueError(f"damage kind {kind!r}: use one of {DAMAGES}")
  damaged.add((d, step))
  return f"{os.path.relpath(d, workdir)}/{step}: {what}"


def undetected(damaged: set[tuple[str, int]]) -> list[str]:
  """Damaged steps that no run moved to checkpoints/corrupt/."""
  return [f"{d}/{s}" for d, s in sorted(damaged) if not glob.glob(os.path.join(d, "corrupt", f"{s}-*"))]


# ------------------------------------------------------------------------------------------------------ comparison
# Keys that are wall-clock by nature, never compared.
VOLATILE_KEYS = {"started", "finished", "seconds"}
SKIP_FILES = {"run.lock", "stages.log", "disk_filler"}
SKIP_DIRS = {"corrupt", "replaced", "tensorboard", "plots"}


def _leaves(path: str) -> dict[str, np.ndarray]:
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings(), ocp.PyTreeCheckpointer() as c:
    warnings.simplefilter("ignore")  # "Sharding info not provided when restoring": one CPU device, as saved
    tree = c.restore(os.path.abspath(path))
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


DROPPED_METRICS = ("perf/", "ckpt/")


def _jsonl(path: str, drop_perf: bool) -> list[Any]:
  rows = []
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        # perf/* is wall time; ckpt/*_skipped counts the checkpoints a restore set aside, which only the faulted
        # run has (its damage is the point; tests/test_faults.py checks the counts)
        rows.append({k: v for k, v in row.items() if not (drop_perf and k.startswith(DROPPED_METRICS))}
                    if isinstance(row, dict) else row)
  return rows


def _strip(x: Any) -> Any:
  if isinstance(x, dict):
    return {k: _strip(v) for k, v in x.items() if k not in VOLATILE_KEYS}
  return x


def artifacts(workdir: str) -> dict[str, tuple[str, str]]:
  """relative name -> (kind, path) of everything a run's result is: 'state' (the newest committed step of each
  checkpoints/ dir, whatever leaves it holds), 'meta' (its metadata), 'params' (standalone params checkpoints),
  'metrics' / 'rows' (.jsonl), 'json' and 'text' files."""
  out: dict[str, tuple[str, str]] = {}
  for dirpath, dirnames, filenames in os.walk(workdir):
    rel = os.path.relpath(dirpath, workdir)
    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and "tmp" not in d)
    if os.path.basename(dirpath) == "checkpoints":
      steps = committed_steps(dirpath)
      if steps:
        newest = os.path.join(dirpath, str(steps[-1]))
        out[os.path.join(rel, "newest")] = ("step", str(steps[-1]))
        out[os.path.join(rel, "newest", "state")] = ("state", os.path.join(newest, "state"))
        out[os.path.join(rel, "newest", "meta")] = ("json", os.path.join(newest, "meta", "metadata"))
      for name in filenames:
        if name.endswith(".json"):  # config.<step>.json: an accepted config change
          out[os.path.join(rel, name)] = ("json", os.path.join(dirpath, name))
      dirnames[:] = []
      continue
    if "_METADATA" in filenames and "_CHECKPOINT_METADATA" in filenames:  # a params checkpoint (save_params)
      out[rel] = ("state", dirpath)
      dirnames[:] = []
      continue
    for name in filenames:
      path, key = os.path.join(dirpath, name), os.path.normpath(os.path.join(rel, name))
      if name in SKIP_FILES or name.endswith((".md", ".png", ".tmp")):
        continue
      kind = ("metrics" if name == "metrics.jsonl" else "rows" if name.endswith(".jsonl") else
              "json" if name.endswith(".json") else "text")
      out[key] = (kind, path)
  return out


def compare(reference: str, got: str) -> tuple[dict[str, int], list[str]]:
  """({what: how many compared}, [differences]) between two run directories, every artifact of both."""
  ref, new = artifacts(reference), artifacts(got)
  diffs = [f"{k}: only in the uninterrupted run" for k in sorted(set(ref) - set(new))]
  diffs += [f"{k}: only in the chaos run" for k in sorted(set(new) - set(ref))]
  counts: dict[str, int] = {}
  for key in sorted(set(ref) & set(new)):
    kind, a = ref[key]
    b = new[key][1]
    if kind == "step":
      counts["newest checkpoint steps"] = counts.get("newest checkpoint steps", 0) + 1
      if a != b:
        diffs.append(f"{key}: step {b}, the uninterrupted run's newest is {a}")
    elif kind == "state":
      la, lb = _leaves(a), _leaves(b)
      counts["state/params leaves"] = counts.get("state/params leaves", 0) + len(la)
      if set(la) != set(lb):
        diffs.append(f"{key}: leaves differ: {sorted(set(la) ^ set(lb))[:4]}")
      bad = [leaf for leaf in sorted(set(la) & set(lb)) if la[leaf].shape != lb[leaf].shape
             or la[leaf].dtype != lb[leaf].dtype or la[leaf].tobytes() != lb[leaf].tobytes()]
      if bad:
        x, y = la[bad[0]], lb[bad[0]]
        gap = np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))) if x.shape == y.shape else "?"
        diffs.append(f"{key}: {len(bad)} of {len(la)} leaves differ, e.g. {bad[0]} (max |diff| {gap})")
    elif kind in ("metrics", "rows"):
      ra, rb = _jsonl(a, kind == "metrics"), _jsonl(b, kind == "metrics")
      what = "metrics rows" if kind == "metrics" else "sample/data rows"
      counts[what] = counts.get(what, 0) + len(ra)
      if ra != rb:
        first = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), min(len(ra), len(rb)))
        diffs.append(f"{key}: {len(rb)} rows vs {len(ra)}; first difference at row {first}: "
                     f"{_row_diff(ra[first] if first < len(ra) else None, rb[first] if first < len(rb) else None)}")
    else:
      with open(a, "rb") as fa, open(b, "rb") as fb:  # a run's own directory named in a file is no difference
        ta = fa.read().replace(os.path.abspath(reference).encode(), b"<DIR>")
        tb = fb.read().replace(os.path.abspath(got).encode(), b"<DIR>")
      if kind == "json":
        ta, tb = _strip(json.loads(ta)), _strip(json.loads(tb))
      counts["other files"] = counts.get("other files", 0) + 1
      if ta != tb:
        diffs.append(f"{key}: differs")
  return counts, diffs


def _row_diff(a: Any, b: Any) -> str:
  if not (isinstance(a, dict) and isinstance(b, dict)):
    return f"{a!r:.120} vs {b!r:.120}"
  keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
  return ", ".join(f"{k}: {b.get(k)!r} (uninterrupted {a.get(k)!r})" for k in keys[:3])


# ------------------------------------------------------------------------------------------------------ running
@dataclasses.dataclass
class Report:
  faults: list[tuple[Fault, Outcome, str]] = dataclasses.field(default_factory=list)  # (fault, outcome, damage)
  problems: list[str] = dataclasses.field(default_factory=list)
  compared: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
  differences: dict[str, list[str]] = dataclasses.field(default_factory=dict)
  damages: list[str] = dataclasses.field(default_factory=list)  # what was damaged (then detected and set aside)
  disk: str = ""

  @property
  def landed(self) -> int:
    return sum(o.fired for _, o, _ in self.faults)

  @property
  def ok(self) -> bool:
    return not self.problems and not any(self.differences.values())


def reference(scenario: Scenario, directory: str, env: dict) -> str:
  """The scenario's uninterrupted run in `directory` (reused when a finished one is there)."""
  marker = directory.rstrip(os.sep) + ".done"
  if not os.path.exists(marker):
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    out = run_process(command(scenario.argv, directory), directory, env)
    if out.rc != 0:
      raise RuntimeError(f"the uninterrupted {scenario.name} run failed (exit {out.rc}):\n{out.output[-3000:]}")
    open(marker, "w").close()
  return directory


def run_scenario(scenario: Scenario, faults: Sequence[Fault], ref_dir: str, chaos_dir: str, env: dict, rng,
                 report: Report, disk: Disk | None, plant: str = "", log: Callable[[str], None] = print) -> None:
  """The faults in a row on one chaos directory, each process resuming the last one's work; a run that finishes
  before its fault's moment closes the round (finish, compare) and the fault is tried again on a fresh directory."""
  moments = {m.kind: m for m in scenario.moments}
  rounds = itertools.count(1)
  pending: list[str] = []
  state = {"dir": "", "damaged": set()}

  def new_round():
    state["dir"], state["damaged"] = os.path.join(chaos_dir, f"round{next(rounds)}"), set()
    os.makedirs(state["dir"])

  def close_round(finish: bool):
    d, name = state["dir"], f"{scenario.name}/{os.path.basename(state['dir'])}"
    if finish:
      out = run_process(command(scenario.argv, d, plant), d, env)
      if out.rc != 0 or "Traceback" in out.output:
        report.problems.append(f"{name}: the final run exited {out.rc}")
        log(f"  !! the final run exited {out.rc}\n{_tail(out.output)}")
    for x in undetected(state["damaged"]):
      report.problems.append(f"{name}: damaged checkpoint {x} was never detected (not in corrupt/)")
    counts, diffs = compare(ref_dir, d)
    report.compared[name], report.differences[name] = counts, diffs
    log(f"  {name} compared with the uninterrupted run: " + ", ".join(f"{v} {k}" for k, v in counts.items())
        + (f"\n  DIFFERENCES ({len(diffs)}):\n    " + "\n    ".join(diffs[:12]) if diffs else "; 0 differences"))

  new_round()
  for f in faults:
    act = (lambda p: disk.fill(p)) if f.action == "disk_full" and disk is not None else _signal(f.action)
    for attempt in range(2):
      out = run_process(command(scenario.argv, state["dir"], plant), state["dir"], env, moments[f.moment], f.nth,
                        f.frac, act)
      if disk is not None:
        disk.free()
      if out.fired or out.rc != 0 or attempt:
        break
      log(f"  {f.describe()}\n      -> the run finished before the moment: a new round")
      close_round(finish=False)
      new_round()
    out.problem = expected(f.action, out)
    # damage waits for a live checkpoint directory with 2 undamaged steps (a run killed early has one): it is done
    # after the first later fault where there is one
    pending.extend([f.damage] if f.damage else [])
    applied = [d for d in (damage(state["dir"], kind, rng, state["damaged"]) for kind in pending)]
    pending[:] = [kind for kind, d in zip(pending, applied) if d.startswith("none")]
    report.damages += [d for d in applied if not d.startswith("none")]
    done = " | ".join(d for d in applied if not d.startswith("none")) or (
        f"none yet ({', '.join(pending)} waits for 2 undamaged steps)" if pending else "")
    report.faults.append((f, out, done))
    where = (f"at {out.at:5.1f} s{' (a save in flight)' if out.in_save else ''} after {out.last_line[:70]!r}"
             if out.fired else "the run ended before the moment (missed)")
    log(f"  {f.describe()}\n      -> exit {out.rc}, {where}" + (f"; damaged {done}" if done else "")
        + (f"\n      !! {out.problem}\n{_tail(out.output)}" if out.problem else ""))
    if out.problem:
      report.problems.append(f"{scenario.name}: {f.action} at {f.moment}: {out.problem}")
  close_round(finish=True)
  if pending:
    log(f"  damage never applied (no live checkpoint directory with 2 undamaged steps after it): {pending}")


def _tail(text: str, n: int = 12) -> str:
  return "\n".join("        | " + l for l in text.strip().splitlines()[-n:])


def run_schedule(faults: Sequence[Fault], out_dir: str, *, plant: str = "", seed: int = 0,
                 cache_dir: str | None = None, log: Callable[[str], None] = print,
                 references: dict[str, str] | None = None, use_tmpfs: bool = True) -> Report:
  """Every scenario of `faults` in turn: its reference (or `references[name]`), its faults, the comparison."""
  env = child_env(cache_dir or os.path.join(out_dir, "xla_cache"))
  report, rng = Report(), random.Random(seed)
  for name in dict.fromkeys(f.scenario for f in faults):
    sc = SCENARIOS[name]
    mine = [f for f in faults if f.scenario == name]
    t0 = time.monotonic()
    ref = (references or {}).get(name) or reference(sc, os.path.join(out_dir, "reference", name), env)
    chaos = os.path.join(out_dir, "chaos", name)
    if os.path.ismount(chaos):
      subprocess.run(["umount", chaos], check=False)
    shutil.rmtree(chaos, ignore_errors=True)
    need_disk = any(f.action == "disk_full" for f in mine)
    disk = Disk(chaos, tmpfs=use_tmpfs) if need_disk else None
    os.makedirs(chaos, exist_ok=True)
    if disk is not None:
      report.disk = disk.how
    log(f"[{name}] {sc.what}; {len(mine)} faults" + (f"; disk: {disk.how}" if disk else ""))
    try:
      run_scenario(sc, mine, ref, chaos, env, rng, report, disk, plant, log)
    finally:
      if disk is not None:
        disk.close()
    log(f"[{name}] {time.monotonic() - t0:.0f} s")
  return report


def summary(report: Report, seed: int) -> str:
  kinds: dict[str, int] = {}
  for f, o, _ in report.faults:
    if o.fired:
      kinds[f.action] = kinds.get(f.action, 0) + 1
  moments: dict[str, int] = {}
  for f, o, _ in report.faults:
    if o.fired:
      moments[f.moment] = moments.get(f.moment, 0) + 1
  n_damage = len(report.damages)
  n_diff = sum(len(d) for d in report.differences.values())
  return (f"RESULT seed={seed} faults={len(report.faults)} landed={report.landed} damaged={n_damage} "
          f"differences={n_diff} problems={len(report.problems)} ok={report.ok}\n"
          f"  actions: {kinds}\n  moments: {moments}")


# ------------------------------------------------------------------------------------------------------ planted bugs
def _plant(name: str) -> None:
  """Bugs the harness must catch, patched in before the command runs (this file's `exec`)."""
  from grpo_jax.run import train  # pylint: disable=g-import-not-at-top
  from grpo_jax.tasks import data  # pylint: disable=g-import-not-at-top
  if name == "skip_batch":  # a resume that skips one data batch
    real = data.rl_batches

    def rl_batches(task, tok, split, n, seed, start, *args, **kwargs):
      return real(task, tok, split, n, seed, start + 1 if start else start, *args, **kwargs)
    data.rl_batches = rl_batches
  elif name == "rng":  # a resume whose rng is not the saved one
    real_restore = train.init_or_restore

    def init_or_restore(*args, **kwargs):
      state, start = real_restore(*args, **kwargs)
      if start:
        state = {**state, "rng": state["rng"] ^ 1}
      return state, start
    train.init_or_restore = init_or_restore
  else:
    raise SystemExit(f"--plant={name!r}: use skip_batch or rng")


PLANTS = ("skip_batch", "rng")


def _exec(argv: Sequence[str]) -> None:
  """`chaos.py exec --plant=NAME -- MODULE FLAGS...`: runs `python -m MODULE FLAGS...` with the bug planted."""
  import runpy  # pylint: disable=g-import-not-at-top
  plant = argv[0].split("=", 1)[1]
  rest = list(argv[argv.index("--") + 1:])
  sys.path.insert(0, ROOT)
  _plant(plant)
  sys.argv = [rest[0], *rest[1:]]
  runpy.run_module(rest[0], run_name="__main__", alter_sys=True)


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] == "exec":
    _exec(argv[1:])
    return 0
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the comparison restores checkpoints in this process
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--faults", type=int, default=36)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
  ap.add_argument("--actions", default=",".join(ACTIONS))
  ap.add_argument("--damage-every", type=int, default=3, help="every n-th fault damages a checkpoint (0: none)")
  ap.add_argument("--out", default="", help="directory for the runs (default: a new temporary one, removed)")
  ap.add_argument("--plant", default="", choices=("", *PLANTS), help="plant a bug: the result must be differences")
  ap.add_argument("--no-tmpfs", action="store_true", help="fill the disk through the file-size limit, not a tmpfs")
  ap.add_argument("--print", action="store_true", help="print the schedule and exit")
  a = ap.parse_args(argv)
  names = [s for s in a.scenarios.split(",") if s]
  bad = [s for s in names if s not in SCENARIOS]
  if bad:
    ap.error(f"unknown scenario(s) {bad}; choose from {list(SCENARIOS)}")
  faults = schedule(a.seed, a.faults, names, [x for x in a.actions.split(",") if x], a.damage_every)
  print(f"schedule (seed {a.seed}, {len(faults)} faults):")
  for i, f in enumerate(faults):
    print(f"  {i + 1:>2}. {f.describe()}")
  if a.print:
    return 0
  out = a.out or tempfile.mkdtemp(prefix="grpo_jax_chaos_")
  t0 = time.time()
  report = run_schedule(faults, out, plant=a.plant, seed=a.seed, use_tmpfs=not a.no_tmpfs,
                        log=lambda line: print(line, flush=True))
  print(summary(report, a.seed))
  print(f"  wall {time.time() - t0:.0f} s; runs in {out}")
  for p in report.problems:
    print(f"  PROBLEM: {p}")
  if not a.out:
    shutil.rmtree(out, ignore_errors=True)
  return 0 if report.ok else 1


if __name__ == "__main__":
  sys.exit(main())
