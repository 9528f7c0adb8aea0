#!/usr/bin/env python3
"""Runs N processes of one program on this machine as one `jax.distributed` job (CPU collectives: gloo).

Each child gets `GRPO_JAX_DISTRIBUTED=1 GRPO_JAX_COORDINATOR=127.0.0.1:PORT GRPO_JAX_NUM_PROCESSES=N
GRPO_JAX_PROCESS_ID=i` (read by `grpo_jax/infra/multihost.py`); its output is streamed line by line, prefixed `[pI]`.
The exit code is 0 only if every process exits 0; when one fails the others are stopped after `--grace-s` (they
would otherwise wait forever in a collective). SIGINT (Ctrl-C), SIGTERM and SIGHUP sent to the launcher are sent on
to every process (grpo_jax.main finishes the step, saves and exits 0); one the caller ignores (nohup) stays ignored.
The children run in the repository root, so relative paths in their arguments (`--config=configs/...`, a relative
`--workdir`) resolve there; `--script` is the caller's path. `--config FILE --workdir DIR [-- flags]` is the calling
convention of every launcher in launch/ (tpu_vm.sh, gpu_multinode.sh: a sweep's `--mode=print --launch=...` writes
it): `python -m grpo_jax.main --config=FILE --workdir=DIR flags` in each process, FILE a repository path as the
other launchers take it, DIR made absolute against the caller's directory (where the caller, and the sweep's
`--mode=report`, look for it). Where GPUs are visible (`nvidia-smi -L`, or the
caller's CUDA_VISIBLE_DEVICES), each child sees only its own: consecutive slices, `--gpus-per-process` each (default:
shared out evenly), set as its CUDA_VISIBLE_DEVICES and JAX_LOCAL_DEVICE_IDS; a JAX_PLATFORMS without cuda leaves
GPUs out. `--dry-run` prints a bash script of the same job (every process in the background, then `wait`).

  python launch/local_multiprocess.py -n 2 -m grpo_jax.main -- --config=configs/grpo_arith.py:small --workdir=/tmp/r
  launch/local_multiprocess.py -n 2 --config configs/grpo_arith.py:small --workdir /tmp/r -- --config.train.steps=2
  python launch/local_multiprocess.py -n 2 --devices-per-process 4 --script my_check.py
  python launch/local_multiprocess.py -n 2 -m grpo_jax.main --dry-run -- --config=...
"""
import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  """A port the OS just handed out; the coordinator binds it a moment later (race is harmless on localhost)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def visible_gpus(base: dict) -> list[str]:
  """The GPUs the children share out: the caller's CUDA_VISIBLE_DEVICES where set, else `nvidia-smi -L`'s (none
  without nvidia-smi, and none where the caller's JAX_PLATFORMS leaves out cuda: a CPU job on a GPU machine)."""
  platforms = base.get("JAX_PLATFORMS", "")
  if platforms and not any(p in platforms for p in ("cuda", "gpu")):
    return []
  if "CUDA_VISIBLE_DEVICES" in base:  # CUDA ends the list at its first negative id ("-1": none)
    ids = [d.strip() for d in base["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    neg = [i for i, d in enumerate(ids) if d.startswith("-")]
    return ids[:neg[0]] if neg else ids
  try:
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, env=base)
  except (OSError, subprocess.TimeoutExpired):
    return []
  if listing.returncode != 0:
    return []
  return [str(i) for i, line in enumerate(l for l in listing.stdout.splitlines() if l.startswith("GPU "))]


def gpu_slices(gpus: Sequence[str], n: int, gpus_per_process: int) -> list[list[str]]:
  """Each process's own GPUs: consecutive slices of `gpus`, `gpus_per_process` each (0: all of them, shared out
  evenly); [] per process where there are none. A count that does not fit is an error naming the fix."""
  if not gpus:
    if gpus_per_process > 0:
      raise ValueError(f"--gpus-per-process={gpus_per_process}: no GPU is visible here (nvidia-smi -L lists none, or "
                       "CUDA_VISIBLE_DEVICES / JAX_PLATFORMS rule them out); leave it out to run on the CPU.")
    return [[] for _ in range(n)]
  k = gpus_per_process or len(gpus) // n
  if gpus_per_process == 0 and (k == 0 or len(gpus) % n):
    raise ValueError(f"-n {n} on {len(gpus)} GPUs ({','.join(gpus)}): they do not share out evenly; give "
                     f"--gpus-per-process K with K x {n} <= {len(gpus)}, or -n dividing {len(gpus)}, or "
                     "JAX_PLATFORMS=cpu for CPU processes.")
  if k * n > len(gpus):
    raise ValueError(f"-n {n} --gpus-per-process={k} needs {k * n} GPUs, {len(gpus)} are visible "
                     f"({','.join(gpus)}): lower -n or --gpus-per-process.")
  return [list(gpus[i * k:(i + 1) * k]) for i in range(n)]


def child_env(base: dict, port: int, n: int, i: int, devices_per_process: int,
              gpus: Sequence[str] = ()) -> dict:
  """Process i's environment: the job's GRPO_JAX_* variables and, with `gpus` (its own slice), only those GPUs
  visible (CUDA_VISIBLE_DEVICES) and all of them its local devices (JAX_LOCAL_DEVICE_IDS, which CUDA numbers from 0
  within the visible ones): every child seeing every GPU made each claim them all."""
  env = dict(base, GRPO_JAX_DISTRIBUTED="1", GRPO_JAX_COORDINATOR=f"127.0.0.1:{port}",
             GRPO_JAX_NUM_PROCESSES=str(n), GRPO_JAX_PROCESS_ID=str(i), PYTHONUNBUFFERED="1")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, base.get("PYTHONPATH", "")) if p)
  if devices_per_process > 0:
    # Simulated CPU devices per process; other XLA flags the caller set are kept.
    flags = [f for f in base.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices_per_process}"])
  if gpus:
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    env["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(j) for j in range(len(gpus)))
  return env


def dry_run_script(argv: Sequence[str], envs: Sequence[dict], keys: Sequence[str]) -> str:
  """A bash script that runs the job without the launcher: every process in the background from the repository
  root with the variables `keys` the launcher sets (each quoted for the shell), then `wait`. Paste it into bash."""
  lines = [f"# {len(envs)} processes of one jax.distributed job, started together; `wait` returns when all end"]
  for env in envs:
    lines.append(f"cd {shlex.quote(REPO)} && " + " ".join(f"{k}={shlex.quote(env[k])}" for k in keys if k in env)
                 + " " + " ".join(shlex.quote(a) for a in argv) + " &")
  return "\n".join(lines + ["wait"]) + "\n"


def main_flags(config: str | None, workdir: str | None) -> list[str]:
  """`--config FILE --workdir DIR` (the launchers' shared convention) as grpo_jax.main's flags: FILE as written (a
  path in the repository, where the children run, as tpu_vm.sh and gpu_multinode.sh take it), DIR made absolute
  against the caller's directory (a relative one landed in the repository root, where the caller, and a sweep's
  --mode=report, did not look for it)."""
  return ([] if config is None else [f"--config={config}"]) + (
      [] if workdir is None else [f"--workdir={os.path.abspath(workdir)}"])


def child_argv(python: str, module: str | None, script: str | None, args: Sequence[str]) -> list[str]:
  return [python, "-m", module, *args] if module else [python, script, *args]


def _pump(stream, prefix: str, out) -> None:
  for line in iter(stream.readline, ""):
    out.write(f"{prefix}{line}" if line.endswith("\n") else f"{prefix}{line}\n")
    out.flush()
  stream.close()


def launch(n: int, module: str | None = None, script: str | None = None, args: Sequence[str] = (),
           port: int = 0, devices_per_process: int = 0, timeout_s: float = 0.0, grace_s: float = 10.0,
           python: str = sys.executable, dry_run: bool = False, out=None, gpus_per_process: int = 0) -> int:
  """Starts the processes, streams their output, returns the first non-zero exit code (0 if all succeeded)."""
  out = out or sys.stdout
  if n < 1:
    raise ValueError(f"--num-processes={n}: must be >= 1.")
  if gpus_per_process < 0:
    raise ValueError(f"--gpus-per-process={gpus_per_process}: must be >= 0 (0 = the visible GPUs shared out evenly).")
  if (module is None) == (script is None):
    raise ValueError("launch: give exactly one of --module or --script.")
  port = port or free_port()
  if script is not None:  # the children run in the repository root (cwd=REPO): the script is the caller's file
    script = os.path.abspath(script)
  argv = child_argv(python, module, script, args)
  base = dict(os.environ)
  slices = gpu_slices(visible_gpus(base), n, gpus_per_process)
  envs = [child_env(base, port, n, i, devices_per_process, slices[i]) for i in range(n)]
  if dry_run:
    keys = ["GRPO_JAX_DISTRIBUTED", "GRPO_JAX_COORDINATOR", "GRPO_JAX_NUM_PROCESSES", "GRPO_JAX_PROCESS_ID"]
    keys += ["XLA_FLAGS"] if devices_per_process > 0 else []
    keys += ["CUDA_VISIBLE_DEVICES", "JAX_LOCAL_DEVICE_IDS"] if slices[0] else []
    out.write(dry_run_script(argv, envs, keys + ["PYTHONPATH"]))
    return 0

  procs, pumps, received = [], [], []

  def forward(signum, frame):  # pylint: disable=unused-argument
    # The children run in sessions of their own (so that a failure stops each one's whole group): a Ctrl-C or a
    # SIGTERM here reached none of them, and they ran on, orphaned, holding the workdir lock. Each is sent the
    # signal instead; grpo_jax.main finishes the step, saves and exits 0 (infra/signals.py).
    received.append((signum, len(procs)))
    out.write(f"[launch] {signal.Signals(signum).name} received: sent to every process\n")
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signum)

  handled = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # one ignored here stays ignored (nohup)
             if threading.current_thread() is threading.main_thread() and signal.getsignal(s) is not signal.SIG_IGN]
  previous = {s: signal.signal(s, forward) for s in handled}
  try:
    return _run(argv, envs, procs, pumps, received, timeout_s, grace_s, out)
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def _run(argv, envs, procs, pumps, received: list, timeout_s: float, grace_s: float, out) -> int:
  for i, env in enumerate(envs):
    p = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    t = threading.Thread(target=_pump, args=(p.stdout, f"[p{i}] ", out), daemon=True)
    t.start()
    procs.append(p)
    pumps.append(t)
  if received:  # signalled while they started: the ones started after it get it now
    signum, started = received[0]
    for p in procs[started:]:
      os.killpg(p.pid, signum)

  start, failed_at, rc = time.monotonic(), None, 0
  order: list[int] = []  # the processes in the order they were seen to fail
  while any(p.poll() is None for p in procs):
    codes = [p.poll() for p in procs]
    order += [i for i, c in enumerate(codes) if c not in (None, 0) and i not in order]
    if failed_at is None and any(c not in (None, 0) for c in codes):
      failed_at = time.monotonic()
    late = failed_at is not None and time.monotonic() - failed_at > grace_s
    expired = timeout_s > 0 and time.monotonic() - start > timeout_s
    if late or expired:
      out.write(f"[launch] stopping the remaining processes ({'timeout' if expired else 'a process failed'})\n")
      for p in procs:
        if p.poll() is None:
          os.killpg(p.pid, signal.SIGTERM)
      deadline = time.monotonic() + 5
      for p in procs:
        try:
          p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
          os.killpg(p.pid, signal.SIGKILL)
          p.wait()
      rc = 124 if expired else 0
      break
    time.sleep(0.05)
  for t in pumps:
    t.join(timeout=5)
  codes = [p.wait() for p in procs]
  for i, c in enumerate(codes):
    out.write(f"[launch] p{i} exited with {c}\n")
  order += [i for i in range(len(codes)) if i not in order]
  failed = [codes[i] for i in order if codes[i] > 0]  # the first to fail; a real failure code beats our signals
  return rc or (failed[0] if failed else (1 if any(codes) else 0))


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("-n", "--num-processes", type=int, default=2)
  ap.add_argument("-m", "--module", default=None,
                  help="run `python -m MODULE` (default with --config / --workdir: grpo_jax.main)")
  ap.add_argument("--script", default=None, help="run `python SCRIPT` instead of a module")
  ap.add_argument("--port", type=int, default=0, help="coordinator port (0 = a free one)")
  ap.add_argument("--devices-per-process", type=int, default=0, help="simulated CPU devices per process (0 = off)")
  ap.add_argument("--gpus-per-process", type=int, default=0,
                  help="GPUs each process sees, consecutive slices of nvidia-smi's (or CUDA_VISIBLE_DEVICES) list "
                       "(0 = all of them shared out evenly)")
  ap.add_argument("--timeout-s", type=float, default=0.0, help="stop everything after this long (0 = never)")
  ap.add_argument("--grace-s", type=float, default=10.0, help="after one process fails, wait this long for others")
  ap.add_argument("--config", default=None,
                  help="grpo_jax.main's --config (a path in the repository), given before the arguments after `--`")
  ap.add_argument("--workdir", default=None, help="grpo_jax.main's --workdir (relative: to this directory)")
  ap.add_argument("--python", default=sys.executable)
  ap.add_argument("--dry-run", action="store_true",
                  help="print a bash script of the commands and their environment (paste it to run), run nothing")
  ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program, after `--`")
  a = ap.parse_args(argv)
  args = a.args[1:] if a.args[:1] == ["--"] else a.args
  module = a.module
  if a.config is not None or a.workdir is not None:  # the other launchers' convention: grpo_jax.main's job
    module = module or (None if a.script else "grpo_jax.main")
    args = main_flags(a.config, a.workdir) + list(args)
  try:
    return launch(a.num_processes, module, a.script, args, a.port, a.devices_per_process, a.timeout_s,
                  a.grace_s, a.python, a.dry_run, gpus_per_process=a.gpus_per_process)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
