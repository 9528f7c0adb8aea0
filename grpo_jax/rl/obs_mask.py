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
import numpy as np


def spans_to_mask(start_NxK: jax.Array, len_NxK: jax.Array, L: int) -> jax.Array:
  """obs_NxL (int32): 1 at positions [start, start + len) of each of a row's K observation spans (len 0 = none)."""
  pos_L = jnp.arange(L)
  inside_NxKxL = (pos_L >= start_NxK[..., None]) & (pos_L < (start_NxK + len_NxK)[..., None])
  return inside_NxKxL.any(axis=1).astype(jnp.int32)


def train_mask(mask_NxL: jax.Array, obs_NxL: jax.Array) -> jax.Array:
  """The loss mask: the completion mask without the observation tokens (same dtype as `mask_NxL`)."""
  return (mask_NxL * (1 - obs_NxL)).astype(mask_NxL.dtype)


def own_tokens(tokens_NxL, mask_NxL, obs_NxL, env_ended_N, tok, xp=jnp, with_index: bool = False):
  """What the verifiers and reward terms read: each row's own tokens (mask on, observation off) moved left in their
  order, pad after them, and a mask over them. Removed, not replaced: every model fragment before an observation
  ends with the model's own stop marker, so nothing joins two fragments into an answer the model did not write,
  and a row reads exactly as a row without observations would (a placeholder token would be text a verifier
  parses, and a mask hole ends the completion early for verifiers that read the mask as a prefix). Where the
  environment's done ended the row (`env_ended_N`: its events' ENDED, envs/batch.py), the EOS it appended is kept
  (ended as if the model had written it; it carries no text); an observation cut by the row's length that ends on
  an EOS id (Qwen's opens with <|im_end|>) is not the row's end and goes. `tok`: the tokenizer, or the sampler's
  SamplingConfig (its `eos_ids` or `eos_id`, and `pad_id`). `xp`: jnp in-graph, np on the host; returns
  (tokens_NxL, mask_NxL), and with `with_index` each own token's position in the transcript (index_NxL: what maps
  a step's end back)."""
  tokens_NxL, mask_NxL, obs_NxL = xp.asarray(tokens_NxL), xp.asarray(mask_NxL), xp.asarray(obs_NxL)
  eos_ids = tuple(int(i) for i in getattr(tok, "eos_ids", (tok.eos_id,)))
  L = tokens_NxL.shape[1]
  on_NxL = mask_NxL > 0
  last_N = xp.sum(on_NxL, axis=1) - 1  # the transcript's last token (its mask is a prefix)
  at_last_NxL = xp.arange(L)[None, :] == last_N[:, None]
  final_eos_NxL = at_last_NxL & xp.isin(tokens_NxL, xp.asarray(eos_ids)) & xp.asarray(env_ended_N)[:, None]
  keep_NxL = on_NxL & ((obs_NxL == 0) | final_eos_NxL)
  drop_NxL = (~keep_NxL).astype(xp.int32)
  order_NxL = (xp.argsort(drop_NxL, axis=1, stable=True) if xp is jnp
               else np.argsort(drop_NxL, axis=1, kind="stable"))
  n_N = xp.sum(keep_NxL, axis=1)
  own_NxL = xp.arange(L)[None, :] < n_N[:, None]
  moved_NxL = xp.take_along_axis(tokens_NxL, order_NxL, axis=1)
  out = xp.where(own_NxL, moved_NxL, int(tok.pad_id)).astype(tokens_NxL.dtype), own_NxL.astype(mask_NxL.dtype)
  return out + (order_NxL,) if with_index else out
