"""A paged KV store for the continuous engine, and decode attention over it: a plain-JAX reference (any backend) and
JAX's TPU ragged paged attention kernel (`sampling.decode_attention`: plain | paged | tpu_ragged | auto).

Why pages here, when live_attention.py's [B, P] + [S, Lc] layout stays the CPU/GPU default: the TPU kernel
(`jax.experimental.pallas.ops.tpu.ragged_paged_attention`) reads only paged KV, `kv_pages[pages, Z, 2K, D]` with K
and V interleaved on the head axis, one page table row per sequence, causal by offset (no mask or segment ids), and
it does not write KV. So the layout is vLLM's:
  * per layer and per row shard (the devices the slots are split over), one page pool `pool_RxQxZxCxD`
    (R shards, Q pages per shard, Z tokens per page, C = 2K interleaved K/V heads, D head_dim);
  * each prompt stored unpadded from position 0 (the prefill's left padding removed when its KV is paged): its full
    pages once per shard, shared by the page tables of its G rows (every shard holds every prompt's pages: the
    engine keeps rows on their device, so a shard's rows read only their prompt-table block, engine.prompt_table,
    but the pool is not yet cut to it); its last partial page copied into a slot's first own page when the slot
    admits one of its rows (copy-on-write of the partial block, as vLLM's prefix sharing does);
  * each slot owns O = ceil((Z - 1 + L) / Z) pages, enough for a partial prompt page plus L completion tokens, so
    the pool cannot run out and admission never waits for pages;
  * the new token's K/V is written into its page before attention, and `kv_len` counts it.
The page table is a function of (slot, its row's prompt), so it is rebuilt per step from the slots' groups; only
compaction moves KV (a slot's own pages follow it, as the plain layout's per-slot buffers do).
Under a mesh the pool ops run per shard in `shard_map` over the batch axes (Mosaic kernels cannot be
auto-partitioned; page indices are shard-local). Heads are not split inside it (a tensor axis is gathered).
"""
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from grpo_jax.model import attention

BACKENDS = ("plain", "paged", "tpu_ragged")  # plain: live_attention.py; paged / tpu_ragged: this module
CHOICES = ("auto",) + BACKENDS  # sampling.decode_attention
TPU_HEAD_DIM = 128  # head_dim the TPU kernel compiles for (libtpu 0.0.42.1: 128 compiles, 64 does not)
# page sizes the kernel compiled with here (libtpu 0.0.42.1, v5e:2x2, head_dim 128: 8, 16 and 32 in fp32, 16 in bf16)
TPU_PAGE_SIZES = (8, 16, 32)
_MASKED = -0.7 * float(np.finfo(np.float32).max)  # the kernel's own mask value (finite: no NaN at kv_len 0)


def tpu_unsupported(head_dim: int, kv_heads: int, page_size: int, dtype: str) -> str | None:
  """Why the TPU kernel cannot run this shape (None: it can): head_dim 128, the page sizes it compiled with, and 2K
  interleaved heads that its tiling accepts (kernel.get_min_heads_per_blk)."""
  if head_dim != TPU_HEAD_DIM:
    return f"model.head_dim={head_dim}: the TPU ragged paged attention kernel needs head_dim {TPU_HEAD_DIM}"
  if page_size not in TPU_PAGE_SIZES:
    return f"sampling.page_size={page_size}: the TPU kernel is compiled here with page sizes {TPU_PAGE_SIZES}"
  c = 2 * kv_heads // (2 if dtype == "bfloat16" else 1)  # 32-bit words of packed heads
  if (2 * kv_heads) % (2 if dtype == "bfloat16" else 1) or not (c in (1, 2, 4, 8) or c % 8 == 0):
    return f"model.kv_heads={kv_heads}: 2*kv_heads={2 * kv_heads} {dtype} heads do not tile for the TPU kernel"
  return None


def platform_unsupported(backend: str, platform: str) -> str | None:
  """Why `backend` cannot run on `platform` (None: it can): the TPU kernel lowers only for a TPU (on the CPU, Pallas
  raised 'Only interpret mode is supported' at the first trace)."""
  if backend == "tpu_ragged" and platform != "tpu":
    return f"'tpu_ragged' is JAX's TPU kernel, which cannot run on platform {platform}"
  return None


def choose(head_dim: int, kv_heads: int, page_size: int, dtype: str, platform: str) -> tuple[str, str]:
  """`auto`: the TPU kernel on a TPU when it supports the shape, else the plain live attention; -> (value, why)."""
  if platform != "tpu":
    return "plain", f"platform {platform}: the TPU kernel needs a TPU"
  bad = tpu_unsupported(head_dim, kv_heads, page_size, dtype)
  if bad:
    return "plain", bad + "; falling back to the plain-JAX live attention"
  return "tpu_ragged", f"TPU, head_dim {head_dim}, page size {page_size}"


class Geometry(NamedTuple):
  """The store's static shape for B prompts of padded length P, L new tokens and S slots over R shards."""
  prompts: int  # B
  full: int  # F = P // Z: pool pages per prompt (a prompt uses plen // Z of them)
  own: int  # O: pages per slot
  slots: int  # S (all shards)
  shards: int  # R
  page: int  # Z

  @property
  def pages_per_seq(self) -> int:
    return self.full + self.own

  @property
  def pool_pages(self) -> int:  # Q: per shard
    return self.prompts * self.full + self.slots // self.shards * self.own


def geometry(prompts: int, prompt_len: int, new_tokens: int, slots: int, shards: int, page: int) -> Geometry:
  if slots % shards:
    raise ValueError(f"sampling.slots={slots}: must be a multiple of the {shards} row shards.")
  return Geometry(prompts, prompt_len // page, -(-(page - 1 + new_tokens) // page), slots, shards, page)


def prompt_pages(geo: Geometry, k_BxKxDxP: jax.Array, v_BxKxPxD: jax.Array,
                 plen_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The prefill's left-padded K/V, unpadded (position 0 = first real token) and cut into pages, K/V interleaved:
  -> (full pages [B, F, Z, C, D], each prompt's page F_b = plen_b // Z, the partial one, [B, Z, C, D])."""
  b, kh, d, p = k_BxKxDxP.shape
  z, f = geo.page, geo.full
  span = (f + 1) * z  # room for page F_b <= F
  src_BxT = jnp.minimum(jnp.arange(span)[None] + (p - plen_B)[:, None], p - 1)
  k_BxTxKxD = jnp.take_along_axis(k_BxKxDxP.transpose(0, 3, 1, 2), src_BxT[:, :, None, None], axis=1)
  v_BxTxKxD = jnp.take_along_axis(v_BxKxPxD.transpose(0, 2, 1, 3), src_BxT[:, :, None, None], axis=1)
  kv = jnp.stack([k_BxTxKxD, v_BxTxKxD], axis=3).reshape(b, f + 1, z, 2 * kh, d)
  partial_BxZxCxD = jnp.take_along_axis(kv, (plen_B // z)[:, None, None, None, None], axis=1)[:, 0]
  return kv[:, :f], partial_BxZxCxD


def init_pool(geo: Geometry, full_BxFxZxCxD: jax.Array) -> jax.Array:
  """Every shard's pool: all prompts' full pages (pages b*F .. b*F + F - 1), then the slots' own pages, zeroed."""
  b, f, z, c, d = full_BxFxZxCxD.shape
  prompt_QxZxCxD = full_BxFxZxCxD.reshape(b * f, z, c, d)
  own = jnp.zeros((geo.pool_pages - b * f, z, c, d), full_BxFxZxCxD.dtype)
  pool = jnp.concatenate([prompt_QxZxCxD, own])
  return constrain(jnp.broadcast_to(pool[None], (geo.shards,) + pool.shape))


def table(geo: Geometry, group_S: jax.Array, plen_B: jax.Array) -> jax.Array:
  """Shard-local page indices [S, F + O]: the row's prompt's full pages, then the slot's own pages (entries past
  what kv_len reaches are never read)."""
  s_loc = geo.slots // geo.shards
  i_S = jnp.arange(geo.slots) % s_loc
  f_S = plen_B[group_S] // geo.page
  j = jnp.arange(geo.pages_per_seq)[None]
  own = geo.prompts * geo.full + i_S[:, None] * geo.own + jnp.minimum(j - f_S[:, None], geo.own - 1)
  return jnp.where(j < f_S[:, None], group_S[:, None] * geo.full + j, own).astype(jnp.int32)


def admit(geo: Geometry, pool: jax.Array, take_S: jax.Array, group_S: jax.Array, partial_BxZxCxD: jax.Array):
  """Slots that take a row get its prompt's partial page copied into their first own page."""
  base = geo.prompts * geo.full

  def local(pool, take_S, group_S, partial):
    dst_S = jnp.where(take_S, base + jnp.arange(take_S.shape[0]) * geo.own, geo.pool_pages)  # past the end: dropped
    return pool.at[0, dst_S].set(partial[group_S].astype(pool.dtype), mode="drop")
  return _per_shard(local, pool, (take_S, group_S), (partial_BxZxCxD,), pool_out=True)


def compact(geo: Geometry, pool: jax.Array, keep_K: jax.Array) -> tuple[Geometry, jax.Array]:
  """The slots `keep_K` (global slot indices) into the first len(keep) slots: their own pages move with them."""
  r, q, z, c, d = pool.shape
  base = geo.prompts * geo.full
  own_SxOxZxCxD = pool[:, base:].reshape(geo.slots, geo.own, z, c, d)
  new = geo._replace(slots=keep_K.shape[0])
  own = jnp.take(own_SxOxZxCxD, keep_K, axis=0).reshape(r, new.slots // r * geo.own, z, c, d)
  return new, constrain(jnp.concatenate([pool[:, :base], own], axis=1))


class PagedKV(NamedTuple):
  """One layer's store as a decode step sees it."""
  pool_RxQxZxCxD: jax.Array
  table_SxM: jax.Array  # shard-local page indices
  pos_S: jax.Array  # the new token's sequence position (its prompt's length + completion index)
  backend: str  # 'paged' | 'tpu_ragged' (static)


def write_attend(q_SxHxD: jax.Array, k_SxKxD: jax.Array, v_SxKxD: jax.Array,
                 kv: PagedKV) -> tuple[jax.Array, PagedKV]:
  """Writes each slot's new K/V into its page, then attends over its pages up to kv_len = pos + 1."""
  z = kv.pool_RxQxZxCxD.shape[2]
  new_SxCxD = jnp.stack([k_SxKxD, v_SxKxD], axis=2).reshape(k_SxKxD.shape[0], -1, k_SxKxD.shape[-1])
  attend = tpu_ragged if kv.backend == "tpu_ragged" else reference

  def local(pool, q, new, tbl, pos):
    page_S = jnp.take_along_axis(tbl, (pos // z)[:, None], axis=1)[:, 0]
    pool = pool.at[0, page_S, pos % z].set(new.astype(pool.dtype))
    return attend(q, pool[0], tbl, pos + 1), pool

  o, pool = _per_shard(local, kv.pool_RxQxZxCxD, (q_SxHxD, new_SxCxD, kv.table_SxM, kv.pos_S), (),
                       pool_out=False)
  return o, kv._replace(pool_RxQxZxCxD=pool)


def reference(q_SxHxD: jax.Array, pages_QxZxCxD: jax.Array, table_SxM: jax.Array, kv_len_S: jax.Array) -> jax.Array:
  """Plain JAX over the same page tables: gather each sequence's pages, mask positions >= kv_len, one softmax."""
  s, h, d = q_SxHxD.shape
  _, z, c, _ = pages_QxZxCxD.shape
  kh = c // 2
  kv_SxTxKx2xD = pages_QxZxCxD[table_SxM].reshape(s, -1, kh, 2, d)
  q_SxKxGxD = q_SxHxD.reshape(s, kh, h // kh, d)
  sc = jnp.einsum("skgd,stkd->skgt", q_SxKxGxD, kv_SxTxKx2xD[..., 0, :],
                  preferred_element_type=jnp.float32) / math.sqrt(d)
  ok = (jnp.arange(kv_SxTxKx2xD.shape[1])[None] < kv_len_S[:, None])[:, None, None]
  sc = jnp.where(ok, sc, _MASKED)
  p = jnp.where(ok, jnp.exp(sc - sc.max(-1, keepdims=True)), 0.0)
  o = jnp.einsum("skgt,stkd->skgd", p.astype(kv_SxTxKx2xD.dtype), kv_SxTxKx2xD[..., 1, :],
                 preferred_element_type=jnp.float32) / p.sum(-1)[..., None]
  return o.astype(q_SxHxD.dtype).reshape(s, h, d)


def tpu_ragged(q_SxHxD: jax.Array, pages_QxZxCxD: jax.Array, table_SxM: jax.Array, kv_len_S: jax.Array) -> jax.Array:
  """JAX's TPU ragged paged attention, one query per sequence, with explicit block sizes (without them it looks the
  tuned sizes up on jax.devices()[0], which fails when compiling for a TPU from a CPU host)."""
  from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
  s, _, d = q_SxHxD.shape
  m = table_SxM.shape[1]
  return rpa.ragged_paged_attention(
      q_SxHxD, pages_QxZxCxD, kv_len_S.astype(jnp.int32), table_SxM, jnp.arange(s + 1, dtype=jnp.int32),
      jnp.array([s], jnp.int32), sm_scale=1.0 / math.sqrt(d), num_kv_pages_per_block=min(m, 16),
      num_queries_per_block=32, vmem_limit_bytes=32 * 2**20)


def constrain(pool: jax.Array) -> jax.Array:
  """The pool's shard axis on the batch axes (the slots' split), nothing else split."""
  return nn.with_logical_constraint(pool, ("batch",) + (None,) * (pool.ndim - 1))


def shards(slots: int, heads: int, kv_heads: int) -> int:
  """Row shards of the pool: the devices the context mesh's batch axes split the slots over (1 without a mesh)."""
  batch, _ = attention.manual_axes(slots, heads, kv_heads)
  mesh = jax.sharding.get_abstract_mesh()
  return math.prod(mesh.shape[a] for a in batch) if batch else 1


def _per_shard(fn, pool, per_slot: tuple, replicated: tuple, pool_out: bool):
  """fn(pool [1, Q, ...], *per_slot (this shard's slots), *replicated) on each shard: in shard_map over the batch
  axes when the pool is split, else directly. pool_out: fn returns only the pool; else (per-slot out, pool)."""
  r = pool.shape[0]
  if r == 1:
    return fn(pool, *per_slot, *replicated)
  batch, _ = attention.manual_axes(r, 1, 1)
  rows = PartitionSpec(batch)
  out_specs = rows if pool_out else (rows, rows)
  return jax.shard_map(fn, in_specs=(rows,) + (rows,) * len(per_slot) + (PartitionSpec(),) * len(replicated),
                       out_specs=out_specs, check_vma=False)(pool, *per_slot, *replicated)
