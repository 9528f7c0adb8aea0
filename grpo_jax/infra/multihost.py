"""Multi-process start-up: one env var switches on `jax.distributed.initialize()` (big_vision style).

On Cloud TPU pods `GRPO_JAX_DISTRIBUTED=1` alone is enough (JAX discovers the pod). On other clusters, or for the
local multi-process launcher, also set `GRPO_JAX_COORDINATOR=host:port`, `GRPO_JAX_NUM_PROCESSES`,
`GRPO_JAX_PROCESS_ID`.

A process of such a job that fails alone must not leave through interpreter shutdown: JAX's exit handler waits in a
shutdown barrier (300 s) for processes that are themselves stuck in a collective with the failed one, and then
aborts both (SIGABRT, the failed process's exit status lost). `cli.finish` leaves with `os._exit` instead; the
others are then stopped by JAX's heartbeat check (100 s: "Terminating process because the JAX distributed service
detected fatal errors ... another task died"), or at once by launch/local_multiprocess.py.
"""
import os

import jax

_initialized = False


def maybe_initialize() -> bool:
  global _initialized
  if _initialized or os.environ.get("GRPO_JAX_DISTRIBUTED", "0") != "1":
    return _initialized
  kwargs = {}
  if "GRPO_JAX_COORDINATOR" in os.environ:
    kwargs = dict(coordinator_address=os.environ["GRPO_JAX_COORDINATOR"],
                  num_processes=int(os.environ["GRPO_JAX_NUM_PROCESSES"]),
                  process_id=int(os.environ["GRPO_JAX_PROCESS_ID"]))
  jax.distributed.initialize(**kwargs)
  _initialized = True
  return True


def initialized() -> bool:
  """Whether this process joined a multi-process job (maybe_initialize)."""
  return _initialized
