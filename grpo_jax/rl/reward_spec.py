"""What a reward term is: its output (scores, a status, optional step scores), the context it reads, and a built
spec of weighted terms. Tasks define terms against this (tasks/digits.py); rewards.py builds and sums them. The
`random` term lives here, shared by every task: a reproducible coin per sample (sample_uniform)."""
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
  """What terms may read besides the rollout: tokenizer facts and task name (static, host side), and the rate of the
  `random` term (rl.random_reward_rate)."""
  task: str
  tokenizer: Any
  max_steps: int = 16
  random_rate: float = 0.5


InGraphFn = Callable[[jax.Array, jax.Array, dict, Context], TermOutput]
# fn(texts, token_ids, batch_rows) -> scores: each completion decoded and as ids, both without the EOS that ended it
# (with tools.env, the model's own tokens: the observations removed, obs_mask.own_tokens);
# batch_rows holds the batch's host fields plus `ended_N` (bool: the row stopped at an EOS id, i.e. not truncated).
PyRewardFn = Callable[[Sequence[str], Sequence[Sequence[int]], dict[str, np.ndarray]], Sequence[float]]


# ----------------------------------------------------------------------- a reproducible coin per sample (`random`)

# The batch field the rollout adds for the terms (rollout.make_rollout_fn): one uint32 key per row, from the step's
# rollout rng (so per run and per step) and the row's index.
SAMPLE_KEY = "sample_key_N"
_GOLDEN = 0x9E3779B9  # 2^32 / φ: spreads consecutive integers over the 32 bits before they are mixed


def fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser (Appleby): a bijection of uint32 in which every input bit flips each output
  bit with probability ≈ 1/2."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def sample_keys(rng: jax.Array, n: int) -> jax.Array:
  """SAMPLE_KEY's values: fmix32(salt + (row + 1)·φ) with a 32-bit salt drawn from `rng` (folded, so no other
  draw of the step moves)."""
  salt = jax.random.bits(jax.random.fold_in(rng, 0x5A17), (), jnp.uint32)
  return fmix32(salt + (jnp.arange(n, dtype=jnp.uint32) + 1) * jnp.uint32(_GOLDEN))


def sample_uniform(tokens_NxL: jax.Array, mask_NxL: jax.Array, key_N: jax.Array) -> jax.Array:
  """A uniform in [0, 1) per sample, a hash of its key and its completion: h = fmix32(key ^ Σ_t fmix32((tok_t + 1)·φ
  ^ fmix32(t + φ))) over the completion's tokens (sum mod 2^32), u = (h >> 8) / 2^24 (exact in float32). The same
  sample in the same row of the same step always gets the same u (a resumed run replays it); a new step's salt
  makes it independent of what the policy can learn."""
  L = tokens_NxL.shape[1]
  pos_L = fmix32(jnp.arange(L, dtype=jnp.uint32) + jnp.uint32(_GOLDEN))
  tok_NxL = jnp.where(mask_NxL > 0, tokens_NxL.astype(jnp.uint32) + 1, jnp.uint32(0))
  mixed_NxL = jnp.where(mask_NxL > 0, fmix32(tok_NxL * jnp.uint32(_GOLDEN) ^ pos_L[None, :]), jnp.uint32(0))
  h_N = fmix32(key_N.astype(jnp.uint32) ^ jnp.sum(mixed_NxL, axis=1, dtype=jnp.uint32))
  return (h_N >> 8).astype(jnp.float32) * jnp.float32(2.0 ** -24)


def random_reward(tokens_NxL, mask_NxL, batch, ctx: "Context") -> "TermOutput":
  """The `random` term: Bernoulli(ctx.random_rate) per sample, independent of the completion's content (Shao et
  al. 2025, arXiv 2506.10947, "random reward": 1 with probability γ, here from sample_uniform so it replays)."""
  if SAMPLE_KEY not in batch:
    raise ValueError(f"the random reward term needs the batch field {SAMPLE_KEY} that the RL rollout adds.")
  return outcome(sample_uniform(tokens_NxL, mask_NxL, batch[SAMPLE_KEY]) < ctx.random_rate)


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
