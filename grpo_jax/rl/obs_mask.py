"""Multi-turn rows: which completion tokens the model wrote, and so which ones the loss may train.

An observation's tokens are in the row (every later token attends to them: the attention mask, `mask_NxL`, keeps
them) but the model did not choose them: they carry a loss mask of 0. The policy loss, the KL, the entropy and the
length statistics each read the mask they are given, so passing them `train_mask` excludes observations from all
of them (the engine wiring does: docs/tools.md). Log-prob column t scores token t (model.token_logprobs), so
masking column t removes exactly the logits that predict an observation token from the gradient
(tests/test_envs.py checks that it is exactly 0 with losses.policy_loss).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def spans_to_mask(start_NxK: jax.Array, len_NxK: jax.Array, L: int) -> jax.Array:
  """obs_NxL (int32): 1 at positions [start, start + len) of each of a row's K observation spans (len 0 = none)."""
  pos_L = jnp.arange(L)
  inside_NxKxL = (pos_L >= start_NxK[..., None]) & (pos_L < (start_NxK + len_NxK)[..., None])
  return inside_NxKxL.any(axis=1).astype(jnp.int32)


def train_mask(mask_NxL: jax.Array, obs_NxL: jax.Array) -> jax.Array:
  """The loss mask: the completion mask without the observation tokens (same dtype as `mask_NxL`)."""
  return (mask_NxL * (1 - obs_NxL)).astype(mask_NxL.dtype)
