"""What a reward term is: its output (scores, a status, optional step scores), the context it reads, and a built
spec of weighted terms. Tasks define terms against this (tasks/digits.py); rewards.py builds and sums them."""
import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import host_calls

# Status codes a Python term reports through the callback (0 = ok): infra/host_calls.py's, which the environments'
# per-row statuses (envs/batch.py) share.
OK, RAISED, NONFINITE, WRONG_LENGTH, WRONG_TYPE, TIMEOUT = (host_calls.OK, host_calls.RAISED, host_calls.NONFINITE,
                                                            host_calls.WRONG_LENGTH, host_calls.WRONG_TYPE,
                                                            host_calls.TIMEOUT)
STATUS_TEXT = host_calls.STATUS_TEXT


class TermOutput(NamedTuple):
  r_N: jax.Array
  status: jax.Array          # int32 scalar; OK for in-graph terms
  fallbacks: jax.Array       # int32 scalar: samples replaced by the fallback value
  steps: tuple | None = None  # (step_r_NxS, step_end_NxS, step_valid_NxS)


@dataclasses.dataclass
class Context:
  """What terms may read besides the rollout: tokenizer facts and task name (static, host side)."""
  task: str
  tokenizer: Any
  max_steps: int = 16


InGraphFn = Callable[[jax.Array, jax.Array, dict, Context], TermOutput]
# fn(texts, token_ids, batch_rows) -> scores: each completion decoded and as ids, both without the EOS that ended it;
# batch_rows holds the batch's host fields plus `ended_N` (bool: the row stopped at an EOS id, i.e. not truncated).
PyRewardFn = Callable[[Sequence[str], Sequence[Sequence[int]], dict[str, np.ndarray]], Sequence[float]]


def outcome(r_N, steps=None) -> TermOutput:
  """A successful in-graph term's output."""
  return TermOutput(r_N.astype(jnp.float32), jnp.int32(OK), jnp.int32(0), steps)


class RewardSpec(NamedTuple):
  names: tuple[str, ...]
  weights: tuple[float, ...]
  fns: tuple[InGraphFn, ...]
  python_terms: dict[str, Any]   # name -> rewards.PythonTerm (its host side: close, error_message)
  ctx: Context
  # the run's environment (envs/batch.py's EnvBatch, tools.env) or None: the other host calls the step makes (the
  # rollout's), kept here with the reward terms' so the host loop closes them and reports their failures alike
  env: Any = None

  def close(self) -> None:
    """Stops the Python terms' and the environment's worker threads (hung calls are daemon threads: they never
    block the exit)."""
    for term in self.python_terms.values():
      term.close()
    if self.env is not None:
      self.env.close()
