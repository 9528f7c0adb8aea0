"""Decode attention over live KV only, for the continuous rollout engine (rollout/engine.py).

Layout (why not a paged pool): each prompt's KV is stored once, [B, P] (its G rows read it), and each slot's
completion KV in its own [S, Lc] buffer written from position 0. Every shape is static (no page tables to build or
free inside the loop, nothing to run out of: a slot always has room for a whole row), left-padded prompts keep the
prefill's layout (the prompt mask says which keys are real) and GQA stays a 5-D einsum with no repeated K/V. The
two attention partials, prompt and completion, are merged by their log-sum-exp; the completion partial reads only
the blocks below the live rows' longest completion, so the KV read follows what the live rows have written.
"""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_MASKED = -0.7 * float(np.finfo(np.float32).max)  # stays finite after subtracting a row max (no NaN at l = 0)


class LiveKV(NamedTuple):
  """One layer's KV as the engine holds it; `group_N` maps a slot's row to its prompt."""
  pk_BxKxDxP: jax.Array
  pv_BxKxPxD: jax.Array
  pok_BxP: jax.Array  # prompt mask (0 = left pad)
  group_N: jax.Array
  ck_NxKxDxL: jax.Array
  cv_NxKxLxD: jax.Array
  clen_N: jax.Array  # completion keys each row sees (its own new token included)
  live_len: jax.Array  # max of clen_N over the live rows (traced): blocks at or past it are not read
  block: int  # completion keys per block (static)


def write(kv: LiveKV, k_NxKxD: jax.Array, v_NxKxD: jax.Array, t_N: jax.Array) -> LiveKV:
  """Each row's new K/V into its own completion position t_N (a scatter: rows are at different positions)."""
  rows = jnp.arange(k_NxKxD.shape[0])
  ck = kv.ck_NxKxDxL.at[rows, :, :, t_N].set(k_NxKxD.astype(kv.ck_NxKxDxL.dtype))
  cv = kv.cv_NxKxLxD.at[rows, :, t_N, :].set(v_NxKxD.astype(kv.cv_NxKxLxD.dtype))
  return kv._replace(ck_NxKxDxL=ck, cv_NxKxLxD=cv)


def attend(q_NxHxD: jax.Array, kv: LiveKV) -> jax.Array:
  """One query per row: online softmax over the row's prompt KV, then its completion KV block by block (a while
  loop up to live_len when there is more than one block)."""
  n, h, d = q_NxHxD.shape
  k = kv.pk_BxKxDxP.shape[1]
  scale = 1.0 / math.sqrt(d)
  q_NxKxGxD = q_NxHxD.reshape(n, k, h // k, d)

  def partial(carry, k_NxKxDxS, v_NxKxSxD, ok_NxS):
    m_NxKxG, l_NxKxG, acc_NxKxGxD = carry
    s = jnp.einsum("nkgd,nkds->nkgs", q_NxKxGxD, k_NxKxDxS, preferred_element_type=jnp.float32) * scale
    ok = ok_NxS[:, None, None]
    s = jnp.where(ok, s, _MASKED)
    m_new = jnp.maximum(m_NxKxG, s.max(-1))
    p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
    c = jnp.exp(m_NxKxG - m_new)
    pv = jnp.einsum("nkgs,nksd->nkgd", p.astype(v_NxKxSxD.dtype), v_NxKxSxD, preferred_element_type=jnp.float32)
    return m_new, l_NxKxG * c + p.sum(-1), acc_NxKxGxD * c[..., None] + pv

  g = h // k
  carry = (jnp.full((n, k, g), _MASKED, jnp.float32), jnp.zeros((n, k, g), jnp.float32),
           jnp.zeros((n, k, g, d), jnp.float32))
  # the group's prompt KV gathered per row: read per row and step as the static cache is, but stored once
  carry = partial(carry, jnp.take(kv.pk_BxKxDxP, kv.group_N, axis=0), jnp.take(kv.pv_BxKxPxD, kv.group_N, axis=0),
                  jnp.take(kv.pok_BxP, kv.group_N, axis=0) > 0)
  b, lc = kv.block, kv.ck_NxKxDxL.shape[-1]

  def block(j, carry):
    ck = jax.lax.dynamic_slice_in_dim(kv.ck_NxKxDxL, j * b, b, axis=3)
    cv = jax.lax.dynamic_slice_in_dim(kv.cv_NxKxLxD, j * b, b, axis=2)
    return partial(carry, ck, cv, (j * b + jnp.arange(b))[None] < kv.clen_N[:, None])

  if b >= lc:
    carry = partial(carry, kv.ck_NxKxDxL, kv.cv_NxKxLxD, jnp.arange(lc)[None] < kv.clen_N[:, None])
  else:
    carry = jax.lax.fori_loop(0, (kv.live_len + b - 1) // b, block, carry)
  _, l_NxKxG, acc_NxKxGxD = carry
  return (acc_NxKxGxD / l_NxKxG[..., None]).astype(q_NxHxD.dtype).reshape(n, h, d)
