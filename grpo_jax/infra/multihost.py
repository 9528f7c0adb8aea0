"""Multi-process start-up: one env var switches on `jax.distributed.initialize()` (big_vision style).

On Cloud TPU pods `GRPO_JAX_DISTRIBUTED=1` alone is enough (JAX discovers the pod). On other clusters, or for the
local multi-process launcher, also set `GRPO_JAX_COORDINATOR=host:port`, `GRPO_JAX_NUM_PROCESSES`,
`GRPO_JAX_PROCESS_ID`; a missing or malformed one is an InputError naming it (it was a KeyError or ValueError
traceback), and so is a GRPO_JAX_DISTRIBUTED other than 1, 0 or unset, and one of the three set without
GRPO_JAX_DISTRIBUTED.

A process of such a job that fails alone must not leave through interpreter shutdown: JAX's exit handler waits in a
shutdown barrier (300 s) for processes that are themselves stuck in a collective with the failed one, and then
aborts both (SIGABRT, the failed process's exit status lost). `cli.finish` leaves with `os._exit` instead; the
others' collective then fails (gloo: connection closed by peer: one line each, `peer_lost`), or JAX's heartbeat
check stops them (100 s: "Terminating process because the JAX distributed service detected fatal errors ...
another task died"), or launch/local_multiprocess.py does.

`check_same_job` refuses a job whose processes were started with different configs, workdirs or code (each would
compile its own program from its own config, and the collectives would join them unchecked).
`refuse_multi_process` refuses the commands that run as one process (sweep, ablate) started as a process of a job.
"""
import hashlib
import json
import os
from typing import Any

import jax

from grpo_jax.infra import console
from grpo_jax.infra import errors

_initialized = False
_FIX = "set GRPO_JAX_COORDINATOR=host:port (process 0's), GRPO_JAX_NUM_PROCESSES and GRPO_JAX_PROCESS_ID"


def _integer(name: str) -> int:
  text = os.environ.get(name)
  try:
    return int(text)
  except (TypeError, ValueError):
    raise errors.InputError(f"{name}={text!r}: GRPO_JAX_COORDINATOR is set, so {name} must be set to an integer too "
                            f"({_FIX}; launch/local_multiprocess.py sets all three)") from None


def launch_args() -> dict:
  """jax.distributed.initialize's arguments from GRPO_JAX_* ({}: JAX discovers them, as on a Cloud TPU pod)."""
  if "GRPO_JAX_COORDINATOR" not in os.environ:
    return {}
  coordinator = os.environ["GRPO_JAX_COORDINATOR"]
  host, _, port = coordinator.rpartition(":")
  if not host or not port.isdigit():
    raise errors.InputError(f"GRPO_JAX_COORDINATOR={coordinator!r}: must be host:port, process 0's address and a "
                            "free port (e.g. 10.0.0.2:12345)")
  n, i = _integer("GRPO_JAX_NUM_PROCESSES"), _integer("GRPO_JAX_PROCESS_ID")
  if n < 1 or not 0 <= i < n:
    raise errors.InputError(f"GRPO_JAX_PROCESS_ID={i} with GRPO_JAX_NUM_PROCESSES={n}: each process needs its own id "
                            "in 0 .. GRPO_JAX_NUM_PROCESSES-1, and GRPO_JAX_NUM_PROCESSES >= 1")
  return dict(coordinator_address=coordinator, num_processes=n, process_id=i)


def maybe_initialize() -> bool:
  global _initialized
  switch = os.environ.get("GRPO_JAX_DISTRIBUTED", "0")
  if switch not in ("", "0", "1"):  # 'true' / 'yes' ran each pod host as its own job, all on one workdir
    raise errors.InputError(f"GRPO_JAX_DISTRIBUTED={switch!r}: must be 1 (join the multi-process job) or 0 / unset "
                            "(one process)")
  given = [k for k in ("GRPO_JAX_COORDINATOR", "GRPO_JAX_NUM_PROCESSES", "GRPO_JAX_PROCESS_ID") if os.environ.get(k)]
  if given and not os.environ.get("GRPO_JAX_DISTRIBUTED"):  # a hand-written launcher that forgot the switch
    raise errors.InputError(f"{given[0]} is set but GRPO_JAX_DISTRIBUTED is not: each process would run the whole job "
                            "alone; set GRPO_JAX_DISTRIBUTED=1 to join the multi-process job (or =0 to run one "
                            "process on purpose)")
  if _initialized or switch != "1":
    return _initialized
  kwargs = launch_args()
  try:
    jax.distributed.initialize(**kwargs)
  except ValueError as e:  # JAX's cluster detection found nothing to join (not a TPU pod or a known scheduler)
    if kwargs:
      raise
    raise errors.InputError(f"GRPO_JAX_DISTRIBUTED=1: JAX found no cluster to join here ({errors.one_line(str(e))}); "
                            f"{_FIX}, or unset GRPO_JAX_DISTRIBUTED for one process") from None
  _initialized = True
  if jax.process_index() != 0:  # the progress lines are process 0's; its INFO records would repeat on every host
    console.quiet_info()
  return True


def refuse_multi_process(command: str, runs_as: str, fix: str) -> None:
  """A command that runs as one process (a sweep's or an ablation's runs, one after another or vmapped on one
  device) started as a process of a multi-process job (GRPO_JAX_DISTRIBUTED=1, or its variables set without =0):
  every process wrote the command's shared files and its vmapped runs never joined the job. One line, before
  anything is read or written."""
  switch = os.environ.get("GRPO_JAX_DISTRIBUTED", "")
  given = [k for k in ("GRPO_JAX_COORDINATOR", "GRPO_JAX_NUM_PROCESSES", "GRPO_JAX_PROCESS_ID") if os.environ.get(k)]
  if switch in ("", "0") and (switch == "0" or not given):
    return
  started = f"GRPO_JAX_DISTRIBUTED={switch}" if switch else f"{given[0]} set"
  raise errors.InputError(f"{started}: {command} runs {runs_as} in one process, not as a process of a multi-process "
                          f"job (every process would write its files; a vmapped group never joins the job); {fix}")


# What a collective says when another process of the job is gone: gloo over TCP at once (the peer's sockets closed),
# JAX's coordination service (a barrier, as orbax's saves wait at) after its 100 s heartbeat timeout, or at once when
# the process that ran the service (process 0) is the one gone.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "heartbeat timeout",
              "Failed to send RPC to coordination service")


def peer_lost(e: BaseException) -> str | None:
  """The one line for a collective that failed because another process ended (None for anything else): that
  process's own output says why, and this traceback (a bug's exit 1 on every surviving process) hid it."""
  for x in errors.chain(e):
    text = errors.one_line(str(x))
    if any(p in text for p in _PEER_GONE):
      return (f"another process of this {jax.process_count()}-process job ended mid-run ({text[:300]}); its own "
              "output says why: fix that and rerun the command on every process (it resumes from the newest "
              "checkpoint).")
  return None


def initialized() -> bool:
  """Whether this process joined a multi-process job (maybe_initialize)."""
  return _initialized


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict) and tree:
    return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
  return {prefix[:-1]: tree}


def code_manifest(root: str | None = None) -> dict[str, str]:
  """{path: sha256} of the package's Python sources under `root` (this package), plus the jax and jaxlib versions."""
  import jaxlib  # pylint: disable=g-import-not-at-top
  root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = {"jax version": jax.__version__, "jaxlib version": jaxlib.__version__}
  for d, subdirs, files in os.walk(root):
    subdirs[:] = sorted(x for x in subdirs if x != "__pycache__")
    for f in sorted(files):
      if f.endswith(".py"):
        path = os.path.join(d, f)
        with open(path, "rb") as fh:
          out[os.path.relpath(path, os.path.dirname(root))] = hashlib.sha256(fh.read()).hexdigest()[:16]
  return out


def _differing(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
  keys = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k, "<unset>") != theirs.get(k, "<unset>"))
  shown = [f"{k}: {json.dumps(theirs.get(k, '<unset>'))} on process 0, {json.dumps(mine.get(k, '<unset>'))} here"
           for k in keys[:3]]
  return "; ".join(shown) + (f"; and {len(keys) - 3} more" if len(keys) > 3 else "")


def check_same_job(config, workdir: str) -> None:
  """Every process of the job was started with process 0's config, --workdir and code, or every process raises an
  InputError (each names what differs on it; the agreeing ones name the processes that differ)."""
  if jax.process_count() == 1:
    return
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from grpo_jax.infra import workdir_lock  # pylint: disable=g-import-not-at-top
  tree = json.loads(config.to_json_best_effort()) if hasattr(config, "to_json_best_effort") else config
  parts = {"another config or --workdir": {**_flat(tree), "--workdir": workdir},
           "other code (grpo_jax's sources or jax / jaxlib)": code_manifest()}
  fixes = ["start every process with the same --config, --config.* overrides and --workdir",
           "give every host the same copy of the repository and the same jax / jaxlib (launch/tpu_vm.sh and "
           "gpu_multinode.sh copy it)"]
  texts = [json.dumps(part, sort_keys=True) for part in parts.values()]
  mine = np.frombuffer(b"".join(hashlib.sha256(t.encode()).digest() for t in texts), np.uint8)
  everyone = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), len(parts), 32)
  pid, n, lines = jax.process_index(), jax.process_count(), []
  for k, (what, part) in enumerate(parts.items()):
    others = [p for p in range(n) if not np.array_equal(everyone[p, k], everyone[0, k])]
    if not others:
      continue
    # process 0's part on every process (every process saw the same digests, so all run this collective)
    theirs = json.loads(workdir_lock.broadcast_text(texts[k], size=None))
    if pid in others:
      lines.append(f"process {pid} of {n} runs {what} than process 0 ({_differing(part, theirs)}): {fixes[k]}")
    else:
      lines.append(f"process(es) {', '.join(map(str, others))} of {n} run {what} than process 0 (their error lines "
                   f"name what differs): {fixes[k]}")
  if lines:
    raise errors.InputError("; ".join(lines) + ".")
