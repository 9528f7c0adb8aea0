"""Multi-process start-up: one env var switches on `jax.distributed.initialize()` (big_vision style).

On Cloud TPU pods `GRPO_JAX_DISTRIBUTED=1` alone is enough (JAX discovers the pod). On other clusters, or for the
local multi-process launcher, also set `GRPO_JAX_COORDINATOR=host:port`, `GRPO_JAX_NUM_PROCESSES`,
`GRPO_JAX_PROCESS_ID`; a missing or malformed one is an InputError naming it (it was a KeyError or ValueError
traceback), and so is a GRPO_JAX_DISTRIBUTED other than 1, 0 or unset.

A process of such a job that fails alone must not leave through interpreter shutdown: JAX's exit handler waits in a
shutdown barrier (300 s) for processes that are themselves stuck in a collective with the failed one, and then
aborts both (SIGABRT, the failed process's exit status lost). `cli.finish` leaves with `os._exit` instead; the
others' collective then fails (gloo: connection closed by peer), or JAX's heartbeat check stops them (100 s:
"Terminating process because the JAX distributed service detected fatal errors ... another task died"), or
launch/local_multiprocess.py does.
"""
import os

import jax

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
  return True


def initialized() -> bool:
  """Whether this process joined a multi-process job (maybe_initialize)."""
  return _initialized
