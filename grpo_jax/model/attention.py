"""Causal attention with left (or any) padding for training and prefill, one path per backend, and decode's cache
attention.

Every training/prefill path takes q [N, T, H, Dh], k and v [N, T, K, Dh] (GQA: query head h uses kv head
h // (H // K); K/V are never repeated) and mask [N, T] (0 = pad, else a segment id), and returns [N, T, H, Dh]. A
query attends to the keys of its own segment at or before it: a left-padded row is one segment (mask 0/1), a packed
row (rl.packing, rl/packing.py) holds several samples end to end, one segment id each. `model.attention` picks the
path:

  xla          one einsum over the whole [T, T] score matrix: fastest on XLA:CPU at short T, O(T²) memory
  blockwise    online softmax over key blocks in plain JAX; a custom_vjp recomputes the score blocks in the backward
               and skips blocks above the diagonal: O(T·block) memory on any backend
  splash       JAX's Pallas splash-attention kernel (TPU) under shard_map; on other backends it runs in Pallas
               interpret mode (slow: for tests)
  cudnn        cuDNN flash attention (GPU, bf16) through jax.nn.dot_product_attention with sequence lengths: one
               contiguous segment per row only (packed rows take pallas_gpu)
  pallas_gpu   JAX's Pallas GPU (Triton) flash kernel `mha` with segment ids, K/V repeated to the query heads;
               Pallas interpret mode off the GPU (tests)
  dot_product  jax.nn.dot_product_attention with a boolean [N, 1, T, T] mask (XLA's choice of kernel; O(T²))
  auto         `choose`: by backend, and on the CPU by a measured speed crossover and a bytes budget

Pad query positions: xla and dot_product give a finite mix there (uniform over all keys, later ones included);
blockwise, splash, cudnn and pallas_gpu give 0 and pass no gradient through them. No caller reads them.
"""
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from grpo_jax.infra import sharding

IMPLEMENTATIONS = ("auto", "xla", "blockwise", "splash", "cudnn", "dot_product", "pallas_gpu")
_NEG = float(np.finfo(np.float32).min)  # xla/cache paths: fully masked rows give a uniform mix, not NaN
_MASKED = -0.7 * float(np.finfo(np.float32).max)  # blockwise: stays finite after subtracting a row max

# `auto` on the CPU: fwd+bwd time of one attention layer, blockwise (BLOCK=128) / einsum, fp32, XLA:CPU on this
# 2-core machine while it was shared (load 6-10), interleaved runs, median of 9, 2026-11-30:
#   nice -n 10 python benchmarks/attention_crossover.py --T 128 256 384 512 768 --blocks 128 --reps 9
#   (and the same with --rows 8 --heads 4 --kv 2 --T 192 256 320 384 512)
#   rows 2, heads 8/2, Dh 16: T=128 1.15, 256 0.79, 384 0.60, 512 0.36, 768 0.41;  Dh 64: 1.55, 1.93, 0.75, 0.31, 0.72
#   rows 8, heads 4/2, Dh 16: T=192 1.52, 256 1.01, 320 0.83, 384 0.50, 512 0.40;  Dh 64: 2.06, 1.23, 1.09, 0.82, 0.72
# and at T=1024/2048/4096 (rows 2, heads 8/2, median of 5): 0.26/0.22/0.21 (Dh 16), 0.24/0.18 (Dh 64; 4096 not run).
# Blockwise wins from T=384 on in every run: below CPU_BLOCKWISE_MIN_T the einsum path is used.
CPU_BLOCKWISE_MIN_T = 384
# Whatever the speed, the einsum path is never chosen where its fp32 scores [N, H, T, T] (global shape, one layer)
# would exceed this: its backward holds several tensors of that size at once (probabilities, their gradient).
EINSUM_MAX_SCORE_BYTES = 256 << 20
# Blockwise tile. Same measurement with --blocks 64 128 256 at T=1024-4096: 64 and 128 within noise of each other,
# 256 1.1-1.9x slower, 512/1024 slower still (the [G·b, b] score tiles stop fitting in cache).
BLOCK = 128
SPLASH_BLOCKS = (512, 256, 128)  # the kernel's tiles must divide the padded length; its lane width is 128


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def platform() -> str:
  """The backend the traced program is for: the mesh's devices when one is set (a TPU topology compiled on this
  CPU says 'tpu'), else JAX's default backend."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    return mesh.abstract_device.platform
  return jax.default_backend()


def choose(impl: str, n: int, t: int, heads: int, dtype, plat: str | None = None, packed: bool = False) -> str:
  """The path `impl` runs for a [n, t] batch: itself, or for 'auto' the backend's O(T)-memory kernel (TPU: splash;
  GPU: cuDNN under bf16, which it requires, else blockwise) and on the CPU the einsum path only while it is both
  faster (t < CPU_BLOCKWISE_MIN_T) and small (scores ≤ EINSUM_MAX_SCORE_BYTES). `plat` defaults to `platform()`
  (a planner can ask about a backend it is not tracing for). `packed` rows (several segments per row) cannot take
  cuDNN's per-row lengths: 'cudnn' and GPU 'auto' run pallas_gpu there."""
  if packed and impl == "cudnn":
    return "pallas_gpu"
  if impl != "auto":
    return impl
  plat = plat or platform()
  if plat == "tpu":
    return "splash"
  if plat in ("gpu", "cuda"):
    if packed:
      return "pallas_gpu"
    return "cudnn" if jnp.dtype(dtype) == jnp.bfloat16 else "blockwise"
  small = n * heads * t * t * 4 <= EINSUM_MAX_SCORE_BYTES
  return "xla" if t < CPU_BLOCKWISE_MIN_T and small else "blockwise"


def pairs(path: str, t: int) -> int:
  """(query, key) score pairs one head of one row computes over t positions on `path` (a `choose` result): the
  whole t×t for the einsum paths, the blocks on or below the diagonal for blockwise and splash (over their padded
  length: blocks above it are skipped, padding inside a block is computed), the causal half for cuDNN."""
  if path in ("xla", "dot_product"):
    return t * t
  if path == "pallas_gpu":  # its causal mask skips key blocks past the query block (block 128)
    nb = -(-t // 128)
    return nb * (nb + 1) // 2 * 128 * 128
  if path == "blockwise":
    b = min(BLOCK, _round_up(t, 8))
    nb = -(-t // b)
    return nb * (nb + 1) // 2 * b * b
  if path == "splash":
    tp = _round_up(t, 128)
    blk = next(b for b in SPLASH_BLOCKS if tp % b == 0)
    nb = tp // blk
    return nb * (nb + 1) // 2 * blk * blk
  if path == "cudnn":
    return t * (t + 1) // 2
  raise ValueError(f"attention path {path!r}: use one of {list(IMPLEMENTATIONS[1:])}.")


def attend(impl: str, q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT, packed: bool = False) -> jax.Array:
  """Training/prefill attention through the path `choose(impl, ...)` names (mask_NxT: segment ids, 0 = pad)."""
  n, t, h, _ = q_NxTxHxD.shape
  path = choose(impl, n, t, h, q_NxTxHxD.dtype, packed=packed)
  if path == "xla":
    return einsum(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT)
  if path == "blockwise":
    return blockwise(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT)
  if path == "splash":
    return splash(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT, interpret=platform() != "tpu")
  if path == "cudnn":
    return seq_lengths(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT, "cudnn")
  if path == "dot_product":
    return dot_product(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT)
  if path == "pallas_gpu":
    return pallas_gpu(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT, interpret=platform() not in ("gpu", "cuda"))
  raise ValueError(f"model.attention={impl!r}: use one of {list(IMPLEMENTATIONS)}.")


# ------------------------------------------------------------------------------------------------- RoPE


def rope_inv_freq(mcfg) -> np.ndarray:
  """RoPE inverse frequencies of a ModelConfig (static), with HF's 'llama3' scaling when rope_scaling_factor > 0."""
  hd = mcfg.head_dim
  inv = 1.0 / (mcfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
  if mcfg.rope_scaling_factor > 0:
    factor, lo, hi = mcfg.rope_scaling_factor, mcfg.rope_low_freq_factor, mcfg.rope_high_freq_factor
    old = mcfg.rope_original_max_len
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    inv = np.where(medium, smoothed, scaled)
  return np.asarray(inv, np.float32)


def rope(x_NxTxHxD: jax.Array, positions_NxT: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotates halves (HF's `rotate_half`) in fp32; positions count real tokens, so pads do not shift them."""
  ang_NxTxF = positions_NxT[..., None].astype(jnp.float32) * inv_freq
  cos, sin = jnp.cos(ang_NxTxF)[:, :, None, :], jnp.sin(ang_NxTxF)[:, :, None, :]
  x1, x2 = jnp.split(x_NxTxHxD.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_NxTxHxD.dtype)


# --------------------------------------------------------------------------------------------- O(T²) paths


def visible(seg_NxT: jax.Array) -> jax.Array:
  """[N, T, S] bool: key s is visible to query t when s ≤ t, the key is not pad and both are in one segment."""
  t = seg_NxT.shape[1]
  same_NxTxS = seg_NxT[:, :, None] == seg_NxT[:, None, :]
  return jnp.tril(jnp.ones((t, t), bool))[None] & same_NxTxS & (seg_NxT[:, None, :] > 0)


def einsum(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT) -> jax.Array:
  """The whole score matrix at once. The G query heads that share a kv head are folded into the query-row dim
  ([N, K, G·T, D]), so each (row, kv head) is one [G·T, D]×[D, S] matmul: XLA:CPU runs this layout ~4× faster than
  the 5-D einsum over [N, T, K, G, D]."""
  n, t, h, d = q_NxTxHxD.shape
  kv = k_NxTxKxD.shape[2]
  g = h // kv
  q_NxKxQxD = q_NxTxHxD.reshape(n, t, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(n, kv, g * t, d)
  k_NxKxSxD = k_NxTxKxD.transpose(0, 2, 1, 3)
  v_NxKxSxD = v_NxTxKxD.transpose(0, 2, 1, 3)
  s_NxKxQxS = jnp.einsum("nkqd,nksd->nkqs", q_NxKxQxD, k_NxKxSxD, preferred_element_type=jnp.float32)
  s_NxKxGxTxS = s_NxKxQxS.reshape(n, kv, g, t, t) * (1.0 / math.sqrt(d))
  ok_NxTxS = visible(mask_NxT)
  s_NxKxGxTxS = jnp.where(ok_NxTxS[:, None, None], s_NxKxGxTxS, _NEG)
  p_NxKxQxS = jax.nn.softmax(s_NxKxGxTxS, axis=-1).astype(v_NxTxKxD.dtype).reshape(n, kv, g * t, t)
  o_NxKxQxD = jnp.einsum("nkqs,nksd->nkqd", p_NxKxQxS, v_NxKxSxD)
  return o_NxKxQxD.reshape(n, kv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(n, t, h, d)


def dot_product(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT) -> jax.Array:
  """`jax.nn.dot_product_attention` with the boolean mask whole (jax turns it into a dense [N, 1, T, S] bias)."""
  ok_Nx1xTxS = visible(mask_NxT)[:, None]
  return jax.nn.dot_product_attention(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask=ok_Nx1xTxS).astype(q_NxTxHxD.dtype)


def cache(q_NxHxD, ck_NxKxDxS, cv_NxKxSxD, ok_NxS) -> jax.Array:
  """Decode: one query per row against the KV cache (layouts chosen so this step needs no transpose)."""
  n, h, d = q_NxHxD.shape
  kv = ck_NxKxDxS.shape[1]
  q4 = q_NxHxD.reshape(n, kv, h // kv, d)
  s_NxKxGxS = jnp.einsum("nkgd,nkds->nkgs", q4, ck_NxKxDxS, preferred_element_type=jnp.float32)
  s_NxKxGxS = jnp.where(ok_NxS[:, None, None], s_NxKxGxS * (1.0 / math.sqrt(d)), _NEG)
  p = jax.nn.softmax(s_NxKxGxS, axis=-1).astype(cv_NxKxSxD.dtype)
  return jnp.einsum("nkgs,nksd->nkgd", p, cv_NxKxSxD).reshape(n, h, d)


# ---------------------------------------------------------------------------------------------- blockwise


def blockwise(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT, block: int = BLOCK) -> jax.Array:
  """Flash-style attention in plain JAX: T is padded to a multiple of the block (pad keys and queries masked),
  queries are folded with their GQA group as in `einsum`, and no [T, T] tensor exists in either pass."""
  n, t, h, d = q_NxTxHxD.shape
  kv = k_NxTxKxD.shape[2]
  g = h // kv
  b = min(block, _round_up(t, 8))
  tp = _round_up(t, b)
  nb = tp // b
  pad = lambda x: jnp.pad(x, ((0, 0), (0, tp - t)) + ((0, 0),) * (x.ndim - 2))
  q_BxNxKxQxD = pad(q_NxTxHxD).reshape(n, nb, b, kv, g, d).transpose(1, 0, 3, 4, 2, 5).reshape(nb, n, kv, g * b, d)
  k_BxNxKxSxD = pad(k_NxTxKxD).reshape(n, nb, b, kv, d).transpose(1, 0, 3, 2, 4)
  v_BxNxKxSxD = pad(v_NxTxKxD).reshape(n, nb, b, kv, d).transpose(1, 0, 3, 2, 4)
  seg_NxT = pad(mask_NxT.astype(jnp.int32))
  seg_BxNxS = seg_NxT.reshape(n, nb, b).transpose(1, 0, 2)
  lo_B = first_key_block(seg_NxT, b)
  o_BxNxKxQxD = _flash(q_BxNxKxQxD, k_BxNxKxSxD, v_BxNxKxSxD, seg_BxNxS, lo_B, 1.0 / math.sqrt(d))
  o = o_BxNxKxQxD.reshape(nb, n, kv, g, b, d).transpose(1, 0, 4, 2, 3, 5).reshape(n, tp, h, d)
  return o[:, :t]


def first_key_block(seg_NxT: jax.Array, b: int) -> jax.Array:
  """[T / b] int32: for each query block, the first key block any of its real (non-pad) queries can see, over all
  rows: the block of the first position of the query's segment. Key blocks before it are all masked for the block,
  so both passes skip them as they skip the blocks above the diagonal; a block without real queries gets its own
  index + 1 (no key block). Packed rows (rl.packing) hold many short segments: most blocks then start near the
  diagonal instead of at 0. A segment's first position is the least position holding its id (found by a stable
  sort, so an id need not be contiguous)."""
  n, t = seg_NxT.shape
  order_NxT = jnp.argsort(seg_NxT, axis=1, stable=True)
  sorted_NxT = jnp.take_along_axis(seg_NxT, order_NxT, axis=1)
  j_T = jnp.arange(t, dtype=jnp.int32)
  new_NxT = jnp.concatenate([jnp.ones((n, 1), bool), sorted_NxT[:, 1:] != sorted_NxT[:, :-1]], axis=1)
  head_NxT = jax.lax.cummax(jnp.where(new_NxT, j_T, 0), axis=1)  # index (in sorted order) of the id's first entry
  first_sorted_NxT = jnp.take_along_axis(order_NxT, head_NxT, axis=1)  # its position: the least (stable sort)
  first_NxT = jnp.zeros_like(seg_NxT).at[jnp.arange(n)[:, None], order_NxT].set(first_sorted_NxT)
  nb = t // b
  own_T = jnp.repeat(jnp.arange(1, nb + 1, dtype=jnp.int32), b)  # no real query: past the block's own index
  blk_NxT = jnp.where(seg_NxT > 0, first_NxT // b, own_T[None])
  return jnp.min(blk_NxT.reshape(n, nb, b), axis=(0, 2)).astype(jnp.int32)


def _allowed(i, j, seg_BxNxS, g: int):
  """[N, 1, G·b, b]: key j·b+c is visible to query row (·, r) of block i (r = row % b) when c ≤ r causally, the key
  is in the query's segment and the query is not pad (pad queries see nothing: their output is 0, their gradient
  0)."""
  b = seg_BxNxS.shape[-1]
  r_Q = jnp.tile(jnp.arange(b), g)
  causal_QxS = j * b + jnp.arange(b)[None, :] <= i * b + r_Q[:, None]
  qseg_NxQ = jnp.tile(seg_BxNxS[i], (1, g))
  same_NxQxS = (qseg_NxQ[:, :, None] == seg_BxNxS[j][:, None, :]) & (qseg_NxQ[:, :, None] > 0)
  return causal_QxS[None, None] & same_NxQxS[:, None]


def _scores(q_NxKxQxD, k_NxKxSxD, scale):
  return jnp.einsum("nkqd,nksd->nkqs", q_NxKxQxD, k_NxKxSxD, preferred_element_type=jnp.float32) * scale


def _flash_fwd_blocks(q_b, k_b, v_b, ok_b, lo_b, scale):
  nb, n, kv, gq, d = q_b.shape
  g = gq // ok_b.shape[-1]

  def q_block(args):
    i, q_NxKxQxD = args

    def kv_block(j, carry):
      m_NxKxQ, l_NxKxQ, acc_NxKxQxD = carry
      ok = _allowed(i, j, ok_b, g)
      s = jnp.where(ok, _scores(q_NxKxQxD, k_b[j], scale), _MASKED)
      m_new = jnp.maximum(m_NxKxQ, s.max(-1))
      p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
      c = jnp.exp(m_NxKxQ - m_new)
      pv = jnp.einsum("nkqs,nksd->nkqd", p.astype(v_b.dtype), v_b[j], preferred_element_type=jnp.float32)
      return m_new, l_NxKxQ * c + p.sum(-1), acc_NxKxQxD * c[..., None] + pv

    init = (jnp.full((n, kv, gq), _MASKED, jnp.float32), jnp.zeros((n, kv, gq), jnp.float32),
            jnp.zeros((n, kv, gq, d), jnp.float32))
    # key blocks above the diagonal, and those before every segment of the block's queries, are never touched
    m, l, acc = jax.lax.fori_loop(lo_b[i], i + 1, kv_block, init)
    safe = jnp.where(l > 0, l, 1.0)
    return (acc / safe[..., None]).astype(q_b.dtype), jnp.where(l > 0, m + jnp.log(safe), 0.0)

  return jax.lax.map(q_block, (jnp.arange(nb, dtype=jnp.int32), q_b))  # int32 as lo_b (fori_loop bounds), also under x64


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q_b, k_b, v_b, ok_b, lo_b, scale):
  return _flash_fwd_blocks(q_b, k_b, v_b, ok_b, lo_b, scale)[0]


def _flash_fwd(q_b, k_b, v_b, ok_b, lo_b, scale):
  o_b, lse_b = _flash_fwd_blocks(q_b, k_b, v_b, ok_b, lo_b, scale)
  return o_b, (q_b, k_b, v_b, ok_b, lo_b, o_b, lse_b)


def _flash_bwd(scale, res, do_b):
  """FlashAttention-2's backward: per query block, recompute p = exp(s − lse) block by block; dq is summed in the
  loop, dk/dv are added into [nb, ...] fp32 accumulators at their key block (in place)."""
  q_b, k_b, v_b, ok_b, lo_b, o_b, lse_b = res
  g = q_b.shape[3] // ok_b.shape[-1]
  delta_b = jnp.sum(do_b.astype(jnp.float32) * o_b.astype(jnp.float32), -1)  # rowsum(dO ∘ O)

  def q_block(carry, xs):
    i, q, do, lse, delta = xs

    def kv_block(j, c):
      dq, dk, dv = c
      ok = _allowed(i, j, ok_b, g)
      p = jnp.exp(jnp.where(ok, _scores(q, k_b[j], scale), _MASKED) - lse[..., None])
      dv_j = jnp.einsum("nkqs,nkqd->nksd", p.astype(do.dtype), do, preferred_element_type=jnp.float32)
      dp = jnp.einsum("nkqd,nksd->nkqs", do, v_b[j], preferred_element_type=jnp.float32)
      ds = p * (dp - delta[..., None]) * scale
      dq = dq + jnp.einsum("nkqs,nksd->nkqd", ds.astype(k_b.dtype), k_b[j], preferred_element_type=jnp.float32)
      dk_j = jnp.einsum("nkqs,nkqd->nksd", ds.astype(q.dtype), q, preferred_element_type=jnp.float32)
      return dq, dk.at[j].add(dk_j), dv.at[j].add(dv_j)

    dq, dk, dv = jax.lax.fori_loop(lo_b[i], i + 1, kv_block, (jnp.zeros(q.shape, jnp.float32),) + carry)
    return (dk, dv), dq.astype(q_b.dtype)

  init = (jnp.zeros(k_b.shape, jnp.float32), jnp.zeros(v_b.shape, jnp.float32))
  (dk, dv), dq = jax.lax.scan(q_block, init, (jnp.arange(q_b.shape[0], dtype=jnp.int32), q_b, do_b, lse_b, delta_b))
  return dq, dk.astype(k_b.dtype), dv.astype(v_b.dtype), None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------------------------------- fused kernels


def splash(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT, interpret: bool = False) -> jax.Array:
  """JAX's splash-attention kernel: per sequence (vmapped over rows), no softmax scale of its own (q is pre-scaled),
  native GQA, the mask as segment ids (left padding: pad = segment 0, tokens = 1; packed rows: one id per
  sample), T padded to the kernel's 128-lane tiles.
  Mosaic kernels cannot be auto-partitioned, so under a mesh it runs in `shard_map` over the batch axes (and the
  head axes when they divide both H and K)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  n, t, h, d = q_NxTxHxD.shape
  kv = k_NxTxKxD.shape[2]
  tp = _round_up(t, 128)
  blk = next(b for b in SPLASH_BLOCKS if tp % b == 0)
  sizes = sa.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk, block_kv_dkv=blk,
                        block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
  pad = lambda x: jnp.pad(x, ((0, 0), (0, tp - t)) + ((0, 0),) * (x.ndim - 2))
  q_NxHxTxD = pad(q_NxTxHxD * jnp.asarray(1.0 / math.sqrt(d), q_NxTxHxD.dtype)).transpose(0, 2, 1, 3)
  k_NxKxTxD = pad(k_NxTxKxD).transpose(0, 2, 1, 3)
  v_NxKxTxD = pad(v_NxTxKxD).transpose(0, 2, 1, 3)
  seg_NxT = pad(mask_NxT.astype(jnp.int32))

  def local(q, k, v, seg):
    mask = sa.MultiHeadMask([sa.CausalMask((tp, tp))] * q.shape[1])
    kernel = sa.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
    return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=sa.SegmentIds(s, s)))(q, k, v, seg)

  batch_axes, head_axes = manual_axes(n, h, kv)
  if batch_axes or head_axes:
    qkv_spec, seg_spec = P(batch_axes or None, head_axes or None), P(batch_axes or None)
    local = jax.shard_map(local, in_specs=(qkv_spec,) * 3 + (seg_spec,), out_specs=qkv_spec, check_vma=False)
  o_NxTxHxD = local(q_NxHxTxD, k_NxKxTxD, v_NxKxTxD, seg_NxT).transpose(0, 2, 1, 3)[:, :t]
  return jnp.where(mask_NxT[:, :, None, None] > 0, o_NxTxHxD, 0).astype(q_NxTxHxD.dtype)


def manual_axes(n: int, h: int, kv: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """Mesh axes (size > 1) that the logical 'batch' and 'heads' map to under the current rules, each kept only when
  it divides what it splits (else that dimension stays whole on every device: correct, just redundant)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return (), ()
  rules = nn.get_logical_axis_rules()
  if not rules:
    rules = sharding.LOGICAL_RULES
  spec = nn.logical_to_mesh_axes(("batch", "heads"), rules)
  flat = lambda a: tuple(x for x in ((a,) if isinstance(a, str) else (a or ()))
                         if x in mesh.shape and mesh.shape[x] > 1)
  batch, heads = flat(spec[0]), flat(spec[1])
  size = lambda axes: math.prod(mesh.shape[a] for a in axes)
  return (batch if n % size(batch) == 0 else ()), (heads if h % size(heads) == kv % size(heads) == 0 else ())


def pallas_gpu(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT, interpret: bool = False) -> jax.Array:
  """Pallas GPU flash attention (`jax.experimental.pallas.ops.gpu.attention.mha`, Triton): causal with segment ids,
  so packed rows run on the GPU in O(T). The kernel is multi-head only: K/V are repeated to the H query heads
  (K/V memory ×H/K). Pad (segment 0) queries attend among pads; their outputs are zeroed. T is padded to 128."""
  from jax.experimental.pallas.ops.gpu import attention as pgpu
  n, t, h, d = q_NxTxHxD.shape
  rep = h // k_NxTxKxD.shape[2]
  tp = _round_up(t, 128)
  pad = lambda x: jnp.pad(x, ((0, 0), (0, tp - t)) + ((0, 0),) * (x.ndim - 2))
  k, v = (pad(jnp.repeat(x, rep, axis=2)) for x in (k_NxTxKxD, v_NxTxKxD))
  o = pgpu.mha(pad(q_NxTxHxD), k, v, pad(mask_NxT.astype(jnp.int32)), sm_scale=1.0 / math.sqrt(d), causal=True,
               interpret=interpret)[:, :t]
  return jnp.where(mask_NxT[:, :, None, None] > 0, o, 0).astype(q_NxTxHxD.dtype)


def seq_lengths(q_NxTxHxD, k_NxTxKxD, v_NxTxKxD, mask_NxT, implementation: str | None = "cudnn") -> jax.Array:
  """cuDNN flash attention in O(T): `is_causal` plus per-row sequence lengths (a `mask=` would become a dense
  [N, 1, T, S] bias). Lengths mean right padding, so each row is rolled to start at its first token and rolled back;
  positions were computed from the mask, so RoPE is unaffected. Needs each row's tokens to be contiguous (left
  pads, tokens, right pads), as every caller builds them. implementation=None runs XLA's version (tests on CPU)."""
  n, t = mask_NxT.shape
  ok_NxT = mask_NxT > 0
  start_N = jnp.argmax(ok_NxT, axis=1)
  len_N = jnp.maximum(ok_NxT.sum(1), 1).astype(jnp.int32)  # an all-pad row attends to one slot: finite, unused
  fwd_NxT = (jnp.arange(t)[None] + start_N[:, None]) % t
  roll = lambda x, idx: jnp.take_along_axis(x, idx[:, :, None, None], axis=1)
  o = jax.nn.dot_product_attention(roll(q_NxTxHxD, fwd_NxT), roll(k_NxTxKxD, fwd_NxT), roll(v_NxTxKxD, fwd_NxT),
                                   is_causal=True, query_seq_lengths=len_N, key_value_seq_lengths=len_N,
                                   implementation=implementation)
  o = roll(o, (jnp.arange(t)[None] - start_N[:, None]) % t)
  return jnp.where(ok_NxT[:, :, None, None], o, 0).astype(q_NxTxHxD.dtype)
