"""Checksums and non-finite counts of every leaf of a (sharded) state, computed on the devices.

One jitted pass per leaf returns two uint32 words and one count: nothing but those scalars reaches
the host, so a 7B state is never copied to check it. The checksum of a leaf is

    (Σ_i fmix32(w_i ^ fmix32(2·i + 1)),  Σ_i fmix32(w_i ^ fmix32(2·i + 2)))   mod 2^32

over its raw bit words `w_i` (bf16/int16 zero-extended, 8-byte types as two words) and their row-major linear
index `i` (mod 2^32, built from per-axis iotas, so no reshape moves a sharded leaf). Integer sums wrap exactly, so
the value does not depend on the sharding or the reduction order: a state saved on 8 devices verifies on 1. A
flipped bit changes one term of each sum by a murmur3-mixed amount; two leaves swapped, or elements permuted, change
the index mixing. It is a corruption check, not a cryptographic one.
"""
from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from grpo_jax.infra import sharding

ALGO = "fmix32-sum-v1"


def _fmix32(h):
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(x) -> jax.Array:
  """The leaf's raw bits as uint32 words (same leading shape; 8-byte types get a trailing axis of 2)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = np.dtype(x.dtype).itemsize
  if size == 4:
    return lax.bitcast_convert_type(x, jnp.uint32)
  if size == 2:
    return lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
  if size == 1:
    return lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
  if size == 8:
    return lax.bitcast_convert_type(x, jnp.uint32)
  raise ValueError(f"integrity: unsupported dtype {x.dtype}")


def _linear_index(shape) -> jax.Array:
  idx = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in range(len(shape) - 1, -1, -1):
    idx = idx + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % (1 << 32))
    stride *= shape[axis]
  return idx


def _leaf_summary(x):
  """One variadic reduction of the three per-element terms: XLA fuses it into a single pass over the leaf with no
  leaf-sized temporary (two separate sums kept the shared words alive: 3x the leaf in temporaries on XLA:CPU)."""
  w = _words(x)
  mix = _fmix32(_linear_index(w.shape) * jnp.uint32(2))
  term_a = _fmix32(w ^ _fmix32(mix + jnp.uint32(1)))
  term_b = _fmix32(w ^ _fmix32(mix + jnp.uint32(2)))
  is_float = jnp.issubdtype(x.dtype, jnp.floating) and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
  bad = (~jnp.isfinite(x)).astype(jnp.uint32) if is_float else jnp.zeros(x.shape, jnp.uint32)
  if bad.shape != w.shape:  # 8-byte leaves have a trailing word axis: count each value once
    bad = jnp.concatenate([bad[..., None], jnp.zeros_like(bad)[..., None]], axis=-1)
  zero = jnp.uint32(0)
  a, b, n = lax.reduce((term_a, term_b, bad), (zero, zero, zero),
                       lambda p, q: (p[0] + q[0], p[1] + q[1], p[2] + q[2]), tuple(range(w.ndim)))
  return jnp.stack([a, b]), n.astype(jnp.int32)


# One compiled program per leaf type (shape, dtype, sharding), each leaf dispatched on its own: a state holds the
# params' shapes four times (policy, reference, Adam's two moments), and a run checks several trees of the same leaf
# types (a stage's state when it saves, its final params, the next stage's state, a resume's restored state). One
# program per tree compiled every leaf's pass again for each leaf and each tree: a tiny SFT + RL run's three trees
# were 1.8 CPU-s of checksum compiles under the suite's XLA flags, 2.2 under the default ones (0.8 and 1.4 now),
# each under the persistent cache's 1 s threshold, so in every run; one tree alone compiles in about the same time
# either way. The values are the same (each leaf's pass is the same computation). A sharded leaf's pass ends in a
# collective, and a state has ~60 leaves whatever the depth (layers are scanned): dispatched all at once they
# deadlocked XLA:CPU (sharding.dispatch_bounded says how; a 4-device CI run aborted, a 2-process job hung until
# its launcher's timeout), so at most sharding.DISPATCH_WINDOW are in flight.
_leaf_summary_jit = jax.jit(_leaf_summary)


def summarize(tree: Any) -> dict[str, tuple[str, int]]:
  """`keystr(path) -> (checksum hex, number of non-finite values)` for every array leaf of `tree`."""
  flat = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(x, "dtype")]
  if not flat:
    return {}
  out = jax.device_get(sharding.dispatch_bounded(_leaf_summary_jit, [x for _, x in flat]))
  return {jax.tree_util.keystr(p): (f"{int(ab[0]):08x}{int(ab[1]):08x}", int(bad))
          for (p, _), (ab, bad) in zip(flat, out)}


def digest(summary: dict[str, tuple[str, int]]) -> str:
  """One checksum of a whole tree (of its per-leaf checksums, in path order): the identity of a model."""
  h = hashlib.sha256()
  for k in sorted(summary):
    h.update(f"{k}={summary[k][0]};".encode())
  return h.hexdigest()[:16]


def record(summary: dict[str, tuple[str, int]]) -> dict[str, Any]:
  """What a checkpoint's metadata stores."""
  return {"algo": ALGO, "checksums": {k: v[0] for k, v in summary.items()}}


def nonfinite(summary: dict[str, tuple[str, int]]) -> dict[str, int]:
  return {k: v[1] for k, v in summary.items() if v[1]}


def mismatches(stored: dict[str, Any], summary: dict[str, tuple[str, int]], prefix: str = "") -> list[str]:
  """Leaves whose checksum differs from `stored` (leaves of `summary` only, so a params subset can be checked)."""
  sums = stored.get("checksums", {})
  return [k for k, v in summary.items() if prefix + k in sums and sums[prefix + k] != v[0]]


def describe(counts: dict[str, int], limit: int = 3) -> str:
  items = sorted(counts.items(), key=lambda kv: -kv[1])
  text = ", ".join(f"{k} ({n})" for k, n in items[:limit])
  return text + (f" and {len(items) - limit} more" if len(items) > limit else "")
