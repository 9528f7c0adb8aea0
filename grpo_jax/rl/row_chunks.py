"""The rollout's rows in chunks: sampling and the scoring forwards run one chunk of rows at a time
(`rl.rollout_chunks`), so their temporaries (a KV cache, a forward's activations) are those of N/chunks rows."""
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.infra import sharding


def check_chunks(chunks: int, n: int) -> None:
  if not isinstance(chunks, int) or chunks < 1 or n % chunks:
    raise ValueError(f"config.rl.rollout_chunks={chunks!r}: must be a positive integer dividing the {n} rollout rows "
                     "it splits (prompts_per_step*G); pick a divisor.")


def chunk_rows(x: jax.Array, chunks: int) -> jax.Array:
  """[N, ...] → [C, N/C, ...] with chunk c = rows c, c+C, c+2C, …: a row-sharded array splits into chunks that are
  each spread over every row shard (a device's rows stay on it; each chunk keeps every device busy)."""
  return jnp.swapaxes(x.reshape((x.shape[0] // chunks, chunks) + x.shape[1:]), 0, 1)


def unchunk_rows(x_CxM: jax.Array) -> jax.Array:
  """The inverse of `chunk_rows`."""
  return jnp.swapaxes(x_CxM, 0, 1).reshape((x_CxM.shape[0] * x_CxM.shape[1],) + x_CxM.shape[2:])


def map_row_chunks(fn: Callable, chunks: int, *xs):
  """fn(*xs) for a row-wise fn, run as a lax.map over `chunks` slices of the rows (chunk_rows): its temporaries
  (a KV cache, a forward's activations) are those of N/chunks rows. chunks=1 calls fn on all rows."""
  if chunks == 1:
    return fn(*xs)
  check_chunks(chunks, xs[0].shape[0])
  pin = lambda x: nn.with_logical_constraint(x, (None, "batch") + (None,) * (x.ndim - 2))
  out = jax.lax.map(lambda a: fn(*a), jax.tree.map(lambda x: pin(chunk_rows(x, chunks)), xs))
  return jax.tree.map(lambda x: sharding.constrain_batch(unchunk_rows(x)), out)


def slots_for(config, n_rows: int) -> int:
  """The continuous engine's slot count: sampling.slots, or for 0 (auto, unresolved by rl/auto.py) the rows /
  rl.rollout_chunks: the KV of as many rows as one static row chunk."""
  return int(config.sampling.get("slots", 0)) or n_rows // int(config.rl.rollout_chunks)
