"""Decode attention over live KV only, for the continuous rollout engine (rollout/engine.py).

Layout (`sampling.decode_attention=plain`, the CPU/GPU default): each prompt's KV is stored once, [B, P] (its G
rows read it), and each slot's completion KV in its own [S, Lc] buffer written from position 0. Every shape is
static (no page tables, nothing to run out of: a slot always has room for a whole row), left-padded prompts keep the
prefill's layout (the prompt mask says which keys are real) and GQA stays a 5-D einsum with no repeated K/V. The
two attention partials, prompt and completion, are merged by their log-sum-exp; the completion partial reads only
the blocks below the live rows' longest completion, so the KV read follows what the live rows have written.
Why a paged pool is not the default here: without a kernel that reads pages in place, paged_attention's plain-JAX
reference gathers every page of each slot's table per step (all of P + L), where this reads completion blocks only
up to the live length; the paged store (paged_attention.py) is what JAX's TPU ragged paged
attention kernel reads, so it is the layout there (`tpu_ragged`, chosen by `auto` on a TPU).
"""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_MASKED = -0.7 * float(np.finfo(np.float32).max)  # stays finite after subtracting a row max (no NaN at l = 0)


class LiveKV(NamedTuple):
  """One layer's KV as the engine holds it; `group_N` maps a slot's row to its prompt (an index local to the
  slot's device block of prompts when split > 1)."""
  pk_BxKxDxP: jax.Array
  pv_BxKxPxD: jax.Array
  pok_BxP: jax.Array  # prompt mask (0 = left pad)
  group_N: jax.Array
  ck_NxKxDxL: jax.Array
  cv_NxKxLxD: jax.Array
  clen_N: jax.Array  # completion keys each row sees (its own new token included)
  live_len: jax.Array  # max of clen_N over the live rows (traced): blocks at or past it are not read
  block: int  # completion keys per block (static)
  split: int = 1  # the rows' device blocks: block d of group_N indexes only block d of the prompts (take_local)
  # with live_len of M > 1 entries: each device block's rows in the order its groups take them (indices local to
  # the block; group g = entries [g·c, (g+1)·c)), longest first; None = the rows' own order
  order_N: jax.Array | None = None


def take_rows(x_Bx: jax.Array, idx_N: jax.Array) -> jax.Array:
  """x_Bx[idx_N] for indices in [0, B) by construction (every caller's are; one outside would be clamped): XLA's
  bare gather. jnp.take's default mode wraps negative indices and fills out-of-range ones, a compare / add /
  select chain per index array that XLA:CPU copies into every fusion that reads the gather (issue #40 item 2)."""
  return jnp.take(x_Bx, idx_N, axis=0, mode="clip")


def take_local(x_Bx: jax.Array, idx_N: jax.Array, split: int = 1) -> jax.Array:
  """x_Bx[idx_N] where block d of the `split` row blocks of idx_N indexes only block d of x_Bx (its indices are
  local to that block, and in range: take_rows): a gather batched over the blocks, which XLA's SPMD partitioner
  keeps on each device, where one take over the whole batch would all-gather x_Bx."""
  if split == 1:
    return take_rows(x_Bx, idx_N)
  x_DxBd = x_Bx.reshape((split, x_Bx.shape[0] // split) + x_Bx.shape[1:])
  out = jax.vmap(take_rows)(x_DxBd, idx_N.reshape(split, -1))
  return out.reshape((idx_N.shape[0],) + x_Bx.shape[1:])


def write(kv: LiveKV, k_NxKxD: jax.Array, v_NxKxD: jax.Array, t_N: jax.Array) -> LiveKV:
  """Each row's new K/V into its own completion position t_N (rows are at different positions): a scatter batched
  over the rows, which XLA's SPMD partitioner keeps on each row's device (indexed by an iota of rows instead, it
  all-gathers the indices and the new K/V)."""
  put = jax.vmap(lambda c, x, t, axis: jax.lax.dynamic_update_index_in_dim(c, x, t, axis), (0, 0, 0, None))
  ck = put(kv.ck_NxKxDxL, k_NxKxD.astype(kv.ck_NxKxDxL.dtype), t_N, 2)
  cv = put(kv.cv_NxKxLxD, v_NxKxD.astype(kv.cv_NxKxLxD.dtype), t_N, 1)
  return kv._replace(ck_NxKxDxL=ck, cv_NxKxLxD=cv)


def attend(q_NxHxD: jax.Array, kv: LiveKV) -> jax.Array:
  """One query per row: online softmax over the row's prompt KV, then its completion KV block by block (a while
  loop up to live_len when there is more than one block). A live_len of M > 1 entries splits each device's rows
  into M groups (kv.order_N: the rollout carry orders them by length every step, rollout/carry.py), each reading
  the completion blocks below its own longest row: the KV read follows the rows, not the longest one. A group's
  rows are gathered block by block from the whole buffer (nothing moves), its outputs scattered back."""
  lens = jnp.asarray(kv.live_len)
  if lens.ndim == 0 or lens.shape[0] == 1:
    return _attend(q_NxHxD, kv._replace(live_len=lens.reshape(()), order_N=None))
  m, d, n = lens.shape[0], kv.split, q_NxHxD.shape[0]
  if n % d or (n // d) % m:  # else the rows past m·(n/d/m) of a device would be in no group: output 0
    raise ValueError(f"LiveKV: {n} rows over split={d} device blocks into {m} live_len groups do not divide evenly; "
                     "use a group count that divides each device's rows (rl.carry_kv_groups is checked so).")
  nd = n // d
  c = nd // m
  order_DxNd = (jnp.broadcast_to(jnp.arange(nd, dtype=jnp.int32), (d, nd)) if kv.order_N is None
                else kv.order_N.reshape(d, nd))
  per_dev = lambda x: x.reshape((d, nd) + x.shape[1:])
  out_DxNdxHxD = jnp.zeros((d, nd) + q_NxHxD.shape[1:], q_NxHxD.dtype)
  for g in range(m):  # group g: entries [g·c, (g+1)·c) of every device's order, still on their device
    idx_DxC = order_DxNd[:, g * c:(g + 1) * c]
    sel = lambda x: jax.vmap(take_rows)(per_dev(x), idx_DxC).reshape(
        (d * c,) + x.shape[1:])
    sub = kv._replace(group_N=sel(kv.group_N), clen_N=sel(kv.clen_N), live_len=lens[g], order_N=None)
    o = _attend(sel(q_NxHxD), sub, idx_DxC).reshape((d, c) + q_NxHxD.shape[1:])
    out_DxNdxHxD = jax.vmap(lambda acc, i, v: acc.at[i].set(v))(out_DxNdxHxD, idx_DxC, o)
  return out_DxNdxHxD.reshape(q_NxHxD.shape)


def _attend(q_NxHxD: jax.Array, kv: LiveKV, rows_DxC: jax.Array | None = None) -> jax.Array:
  """attend for the rows q_NxHxD holds: rows_DxC[d] of device block d of the completion KV (kv.ck / kv.cv hold all
  rows; each block read gathers just those rows' window), else all of them."""
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
  take = lambda x: take_local(x, kv.group_N, kv.split)
  carry = partial(carry, take(kv.pk_BxKxDxP), take(kv.pv_BxKxPxD), take(kv.pok_BxP) > 0)
  b, lc = kv.block, kv.ck_NxKxDxL.shape[-1]
  if b < lc and lc % b:  # a last block past the buffer: dynamic_slice moves it back, misaligning keys and mask
    raise ValueError(f"LiveKV: block={b} does not divide the completion buffer's {lc} keys; size the buffer to a "
                     "multiple of the block (engine.sample_groups and the rollout carry round it up).")
  ds = kv.split

  def read(x, axis: int, start, size: int):
    """x[rows, ..., start:start + size along `axis`]: the rows' window of one block (the rows of every device)."""
    if rows_DxC is None:
      return jax.lax.dynamic_slice_in_dim(x, start, size, axis=axis)
    sizes = list(x.shape)
    sizes[0], sizes[axis] = 1, size

    def one(x_dev, r):  # one row's window: with the rows batched, a gather of exactly these windows
      at = [jnp.int32(0)] * x.ndim
      at[0], at[axis] = r, start
      return jax.lax.dynamic_slice(x_dev, at, sizes)[0]
    x_dev = x.reshape((ds, x.shape[0] // ds) + x.shape[1:])
    out = jax.vmap(lambda xd, rr: jax.vmap(lambda r: one(xd, r))(rr))(x_dev, rows_DxC)
    return out.reshape((-1,) + out.shape[2:])

  def block(j, carry):
    ck = read(kv.ck_NxKxDxL, 3, j * b, b)
    cv = read(kv.cv_NxKxLxD, 2, j * b, b)
    return partial(carry, ck, cv, (j * b + jnp.arange(b))[None] < kv.clen_N[:, None])

  if b >= lc:
    carry = partial(carry, read(kv.ck_NxKxDxL, 3, 0, lc), read(kv.cv_NxKxLxD, 2, 0, lc),
                    jnp.arange(lc)[None] < kv.clen_N[:, None])
  else:
    # live_len >= 0: lax.div (truncation) is floor division here, without jnp's sign correction
    carry = jax.lax.fori_loop(0, jax.lax.div(kv.live_len + b - 1, b), block, carry)
  _, l_NxKxG, acc_NxKxGxD = carry
  return (acc_NxKxGxD / l_NxKxG[..., None]).astype(q_NxHxD.dtype).reshape(n, h, d)
