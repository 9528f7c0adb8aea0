"""Qwen2/Llama-shaped decoder (Flax Linen, layers under `nn.scan`), applied functionally to plain param dicts.

Policy and reference params go through the same module; everything here is a pure function of
`(ModelConfig, params, arrays)`, so callers jit, vmap and shard it as they like.

Param tree (plain nested dict, always float32; L layers, D hidden, H heads, K kv heads, Dh head_dim, F inter):

  embed/embedding          [V, D]          (vocab, embed)
  layers/attn_norm/scale   [L, D]          (layers, embed)
  layers/q/kernel          [L, D, H, Dh]   (layers, embed, heads, head_dim)
  layers/q/bias            [L, H, Dh]      (layers, heads, head_dim)        only if qkv_bias
  layers/k/kernel          [L, D, K, Dh]   (layers, embed, kv_heads, head_dim)
  layers/k/bias            [L, K, Dh]      (layers, kv_heads, head_dim)     only if qkv_bias
  layers/v/kernel, bias    as k
  layers/o/kernel          [L, H, Dh, D]   (layers, heads, head_dim, embed)
  layers/mlp_norm/scale    [L, D]          (layers, embed)
  layers/gate/kernel       [L, D, F]       (layers, embed, mlp)
  layers/up/kernel         [L, D, F]       (layers, embed, mlp)
  layers/down/kernel       [L, F, D]       (layers, mlp, embed)
  final_norm/scale         [D]             (embed,)
  lm_head/kernel           [D, V]          (embed, vocab)                   only if not tie_embeddings

Conventions match Hugging Face Qwen2/Llama: RoPE rotates halves (`rotate_half`), query head h uses kv head
h // (H // K), RMSNorm normalises in float32. Attention and RoPE live in attention.py (`model.attention` picks the
training/prefill path), the config in model_config.py. KV cache: one buffer per layer, K as [N, K, Dh, S] and V as
[N, K, S, Dh]; the decode mode's entry points (cache, prefill, per-rollout weights, one step) live in decode.py.
"""
import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.model import attention
from grpo_jax.model import live_attention
from grpo_jax.model import paged_attention
from grpo_jax.model.model_config import UNROLL_MAX_LAYERS, ModelConfig  # noqa: F401  (UNROLL_MAX_LAYERS: re-exported)

Params = Any

_REMAT_POLICIES = {
    "full": None,  # save nothing inside a layer; recompute it all in the backward pass
    # keep weight matmul outputs (no batch dims), recompute attention scores and elementwise ops
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
_UNROLLED = {"none": (), "all": ("train", "prefill")}  # modes whose layer scan is unrolled
_INIT = nn.initializers.normal(stddev=0.02)


# ----------------------------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
  eps: float
  dtype: Any

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                       (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)  # statistics in fp32 even under bf16 compute, as HF does
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * scale).astype(self.dtype)


class Dense(nn.Module):
  """Contracts the last `n_in` dims of x with the first of `kernel[in..., features...]`. When the params carry a
  LoRA adapter (lora_a [in..., r], lora_b [r, features...]: model/lora.py), adds lora_scale·(x·A)·B; without one
  (the base, the reference, a no-LoRA model) the computation is exactly the plain projection."""
  features: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_axes: tuple[str, ...] | None
  dtype: Any
  n_in: int = 1
  lora_scale: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    in_shape = x.shape[x.ndim - self.n_in:]
    kernel = self.param("kernel", nn.with_logical_partitioning(_INIT, self.kernel_axes),
                        tuple(in_shape) + tuple(self.features), jnp.float32)
    y = jnp.tensordot(x.astype(self.dtype), kernel.astype(self.dtype), axes=self.n_in)
    if self.bias_axes is not None:
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.bias_axes),
                        tuple(self.features), jnp.float32)
      y = y + bias.astype(self.dtype)
    if self.has_variable("params", "lora_a"):  # trace-time: a model without adapters compiles as before
      a = self.get_variable("params", "lora_a").astype(self.dtype)
      b = self.get_variable("params", "lora_b").astype(self.dtype)
      # (x·A)·B: the rank-r bottleneck first, never the [in, out] product (that is the merge in decode, once per rollout)
      y = y + self.lora_scale * jnp.tensordot(jnp.tensordot(x.astype(self.dtype), a, axes=self.n_in), b, axes=1)
    return y


class Table(nn.Module):
  """A bare parameter (the embedding table or untied head), returned as is."""
  pname: str
  shape: tuple[int, ...]
  axes: tuple[str, ...]

  @nn.compact
  def __call__(self) -> jax.Array:
    return self.param(self.pname, nn.with_logical_partitioning(_INIT, self.axes), self.shape, jnp.float32)


class Block(nn.Module):
  """One pre-norm layer. mode: 'train' (no cache), 'prefill' (also returns this layer's K/V in cache layout),
  'decode' (T=1; writes K/V into this layer's cache at slot `index` and attends to the cache), 'decode_live' (T=1;
  the continuous engine's shared-prompt / per-slot KV, live_attention.py), 'decode_paged' (T=1; the same engine's
  paged store, paged_attention.py)."""
  cfg: ModelConfig
  mode: str
  packed: bool = False  # mask_NxT holds several segments per row (attention.choose)

  @nn.compact
  def __call__(self, x_MxD, positions_NxT, mask_NxT, cache_kv=None, index=None, kv_mask_NxS=None):
    # M = N*T: 2-D activations avoid transposes in the MLP backward
    c, dt = self.cfg, self.cfg.compute_dtype
    n, t = positions_NxT.shape
    h_, kv, hd = c.heads, c.kv_heads, c.head_dim
    inv_freq = attention.rope_inv_freq(c)
    ls = c.lora.scale if c.lora else 0.0

    def proj(heads, axes_name, name):
      bias = (axes_name, "head_dim") if c.qkv_bias else None
      return Dense((heads, hd), ("embed", axes_name, "head_dim"), bias, dt, lora_scale=ls, name=name)

    y_MxD = RMSNorm(c.rms_eps, dt, name="attn_norm")(x_MxD)
    q = attention.rope(proj(h_, "heads", "q")(y_MxD).reshape(n, t, h_, hd), positions_NxT, inv_freq)
    k = attention.rope(proj(kv, "kv_heads", "k")(y_MxD).reshape(n, t, kv, hd), positions_NxT, inv_freq)
    v = proj(kv, "kv_heads", "v")(y_MxD).reshape(n, t, kv, hd)
    q = nn.with_logical_constraint(q, ("batch", "length", "heads", "head_dim"))
    k = nn.with_logical_constraint(k, ("batch", "length", "kv_heads", "head_dim"))
    v = nn.with_logical_constraint(v, ("batch", "length", "kv_heads", "head_dim"))

    kv_out = None
    if self.mode == "decode":
      ck_NxKxDxS, cv_NxKxSxD = cache_kv
      ck_NxKxDxS = jax.lax.dynamic_update_slice(ck_NxKxDxS, k.transpose(0, 2, 3, 1).astype(ck_NxKxDxS.dtype),
                                                (0, 0, 0, index))
      cv_NxKxSxD = jax.lax.dynamic_update_slice(cv_NxKxSxD, v.transpose(0, 2, 1, 3).astype(cv_NxKxSxD.dtype),
                                                (0, 0, index, 0))
      s = ck_NxKxDxS.shape[-1]
      ok_NxS = (kv_mask_NxS > 0) & (jnp.arange(s) <= index)[None]  # slots past index are stale or empty
      o = attention.cache(q[:, 0], ck_NxKxDxS, cv_NxKxSxD, ok_NxS)[:, None]
      kv_out = (ck_NxKxDxS, cv_NxKxSxD)
    elif self.mode == "decode_live":  # continuous engine: cache_kv is a live_attention.LiveKV, index the rows' t_N
      kv_out = live_attention.write(cache_kv, k[:, 0], v[:, 0], index)
      o = live_attention.attend(q[:, 0], kv_out)[:, None]
    elif self.mode == "decode_paged":  # continuous engine over pages: cache_kv is a paged_attention.PagedKV
      o, kv_out = paged_attention.write_attend(q[:, 0], k[:, 0], v[:, 0], cache_kv)
      o = o[:, None]
    else:
      o = attention.attend(c.attention, q, k, v, mask_NxT, packed=self.packed)
      if self.mode == "prefill":
        kv_out = (k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3))  # cache layouts; prefill casts
    o = nn.with_logical_constraint(o, ("batch", "length", "heads", "head_dim"))
    x_MxD = x_MxD + Dense((c.hidden,), ("heads", "head_dim", "embed"), None, dt, n_in=2, lora_scale=ls, name="o")(
        o.reshape(n * t, h_, hd))
    x_MxD = nn.with_logical_constraint(x_MxD, ("batch", "embed"))

    y_MxD = RMSNorm(c.rms_eps, dt, name="mlp_norm")(x_MxD)
    g_MxF = Dense((c.inter,), ("embed", "mlp"), None, dt, lora_scale=ls, name="gate")(y_MxD)
    u_MxF = Dense((c.inter,), ("embed", "mlp"), None, dt, lora_scale=ls, name="up")(y_MxD)
    a_MxF = nn.with_logical_constraint(nn.silu(g_MxF) * u_MxF, ("batch", "mlp"))
    x_MxD = x_MxD + Dense((c.hidden,), ("mlp", "embed"), None, dt, lora_scale=ls, name="down")(a_MxF)
    x_MxD = nn.with_logical_constraint(x_MxD, ("batch", "embed"))
    return x_MxD, kv_out


class Transformer(nn.Module):
  """Training / prefill pass: (final-normed hidden [N, T, D], head weight [D, V] fp32, per-layer K/V or None).

  The layers run under `nn.scan` (params stacked on a leading 'layers' axis); prefill returns the K/V of every
  layer stacked the same way, in cache layout. Decode does not come through here (see `decode_step`)."""
  cfg: ModelConfig
  mode: str = "train"
  packed: bool = False  # rows of samples laid end to end: mask_NxT is their segment ids, positions restart per sample

  @nn.compact
  def __call__(self, tokens_NxT, positions_NxT, mask_NxT):
    c, dt = self.cfg, self.cfg.compute_dtype
    n, t = tokens_NxT.shape
    table_VxD = Table("embedding", (c.vocab_size, c.hidden), ("vocab", "embed"), name="embed")()
    x_MxD = jnp.take(table_VxD, tokens_NxT.reshape(-1), axis=0).astype(dt)
    x_MxD = nn.with_logical_constraint(x_MxD, ("batch", "embed"))

    block = Block
    if self.mode == "train" and c.remat != "none":
      block = nn.remat(Block, policy=_REMAT_POLICIES[c.remat], prevent_cse=False)
    stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                    in_axes=(nn.broadcast,) * 2, length=c.layers,
                    unroll=c.layers if self.mode in _UNROLLED[c.layer_unroll] else 1,
                    metadata_params={nn.PARTITION_NAME: "layers"})
    x_MxD, kv_stacked = stack(c, self.mode, self.packed, name="layers")(x_MxD, positions_NxT, mask_NxT)
    h_NxTxD = RMSNorm(c.rms_eps, dt, name="final_norm")(x_MxD).reshape(n, t, c.hidden)
    if c.tie_embeddings:
      head_DxV = table_VxD.T
    else:
      head_DxV = Table("kernel", (c.hidden, c.vocab_size), ("embed", "vocab"), name="lm_head")()
    return h_NxTxD, head_DxV, kv_stacked


# ------------------------------------------------------------------------------------------ functional API


def head_logits(mcfg: ModelConfig, h_XxD: jax.Array, head_DxV: jax.Array) -> jax.Array:
  """Logits in float32 (accumulated in fp32 even under bf16 compute: log-prob ratios are sensitive)."""
  dt = mcfg.compute_dtype
  logits = jnp.einsum("...d,dv->...v", h_XxD.astype(dt), head_DxV.astype(dt), preferred_element_type=jnp.float32)
  return nn.with_logical_constraint(logits, ("batch",) + (None,) * (logits.ndim - 2) + ("vocab",))


def _dummy_inputs():
  one = jnp.ones((1, 1), jnp.int32)
  return one, one * 0, one


def init_params(mcfg: ModelConfig, rng: jax.Array) -> Params:
  """Plain nested dict of float32 arrays (no 'params' wrapper, no partitioning boxes)."""
  return flax.core.unfreeze(_jitted_init(mcfg)(rng))


@functools.lru_cache(maxsize=16)
def _jitted_init(mcfg: ModelConfig):
  """One jitted init per model config: a new jit object per call traced and compiled it every time (1.6-1.8 s for
  a 3-layer toy on the 2-core CPU; tests and checkpoint writers call it again and again with one config)."""
  return jax.jit(lambda r: nn.meta.unbox(Transformer(mcfg).init(r, *_dummy_inputs())["params"]))


def param_shapes(mcfg: ModelConfig) -> Params:
  """The params' ShapeDtypeStructs (nothing allocated), traced once per model config: the state spec, checkpoint
  restores, the HF loader, the planner and the decode layouts all ask, and tracing a 7B init takes seconds."""
  return jax.tree.map(lambda x: x, _param_shapes(mcfg))  # a fresh tree: callers may edit theirs


@functools.lru_cache(maxsize=16)
def _param_shapes(mcfg: ModelConfig) -> Params:
  return jax.eval_shape(lambda: init_params(mcfg, jax.random.PRNGKey(0)))


def param_axes(mcfg: ModelConfig) -> Params:
  """PartitionSpecs of logical axis names, same structure as `init_params` (allocates nothing), traced once per
  model config as `param_shapes` is: the state spec, each decode layout and the planner ask (18 traces of ~0.3 s in
  a tiny two-stage CLI run)."""
  return jax.tree.map(lambda x: x, _param_axes(mcfg))  # a fresh tree: callers may edit theirs


@functools.lru_cache(maxsize=16)
def _param_axes(mcfg: ModelConfig) -> Params:
  abstract = jax.eval_shape(lambda: Transformer(mcfg).init(jax.random.PRNGKey(0), *_dummy_inputs()))
  return flax.core.unfreeze(nn.get_partition_spec(abstract)["params"])


def apply_stack(mcfg, params, mode, tokens, positions, mask, packed=False):
  return Transformer(mcfg, mode, packed).apply({"params": params}, tokens, positions, mask)


def forward(mcfg: ModelConfig, params: Params, tokens_NxT: jax.Array, positions_NxT: jax.Array,
            mask_NxT: jax.Array) -> jax.Array:
  """Logits [N, T, V] in float32; attention is causal and ignores keys where mask == 0 (left padding)."""
  h_NxTxD, head_DxV, _ = apply_stack(mcfg, params, "train", tokens_NxT, positions_NxT, mask_NxT)
  return head_logits(mcfg, h_NxTxD, head_DxV)


REMAT_MIN_LOGITS = 1 << 25  # 128 MiB of fp32 logits: below this `target_logprobs` does not rematerialise the head


def logprob_chunk(mcfg: ModelConfig) -> int:
  """Default `token_logprobs` chunk: ~2^21 logits per row (16 positions for a 150k vocab, all of T for 512)."""
  return max(16, (1 << 21) // mcfg.vocab_size)


def hidden_states(mcfg: ModelConfig, params: Params, tokens_NxT: jax.Array, positions_NxT: jax.Array,
                  mask_NxT: jax.Array, packed: bool = False) -> tuple[jax.Array, jax.Array]:
  """(final-normed hidden [N, T, D], LM-head weight [D, V]): for value heads and `logprobs_from_hidden`. `packed`:
  mask_NxT holds one segment id per sample of a packed row (0 = pad), positions restart per sample."""
  h_NxTxD, head_DxV, _ = apply_stack(mcfg, params, "train", tokens_NxT, positions_NxT, mask_NxT, packed)
  return h_NxTxD, head_DxV


def target_logprobs(mcfg: ModelConfig, h_NxLxD: jax.Array, head_DxV: jax.Array, targets_NxL: jax.Array,
                    temperature: float | jax.Array = 1.0,
                    chunk: int | None = None) -> tuple[jax.Array, jax.Array]:
  """(logp_NxL, entropy_NxL): hidden state l scores targets[:, l] (no shift). Callers slice `h` to the positions
  whose log-probs they use, so the LM head (the largest matmul of a small model) runs only there.

  The N×L×V log-softmax is computed `chunk` positions at a time under `jax.checkpoint`, so neither the forward nor
  the backward pass holds it whole; chunk=None picks ~2^21 logits per row per chunk. Results do not depend on it.
  Up to REMAT_MIN_LOGITS logits in one chunk are kept for the backward instead (recomputing the head costs more).
  """
  n, t = targets_NxL.shape
  if t == 0:
    return jnp.zeros((n, 0), jnp.float32), jnp.zeros((n, 0), jnp.float32)
  inv_temp = 1.0 / jnp.asarray(temperature, jnp.float32)
  # Each chip scores its own rows against the whole head: the head is gathered over the FSDP axes once per call (in
  # the compute dtype, split only over `tensor`), not once per chunk, and the chunk's rows stay split. Left to the
  # partitioner, a large mesh (7B on 64 chips) kept the head split on D and computed every row's logits on every chip.
  head_DxV = nn.with_logical_constraint(head_DxV.astype(mcfg.compute_dtype), (None, "vocab"))

  def one_chunk(h_NxCxD, next_NxC):
    h_NxCxD = nn.with_logical_constraint(h_NxCxD, ("batch", None, None))
    logits_NxCxV = head_logits(mcfg, h_NxCxD, head_DxV) * inv_temp
    logp_NxCxV = jax.nn.log_softmax(logits_NxCxV, axis=-1)
    # A one-hot contraction rather than take_along_axis: its backward is a multiply, not a scatter (slow on CPU).
    onehot_NxCxV = jax.nn.one_hot(next_NxC, logp_NxCxV.shape[-1], dtype=logp_NxCxV.dtype)
    logp_NxC = jnp.sum(logp_NxCxV * onehot_NxCxV, axis=-1)
    ent_NxC = -jnp.sum(jnp.exp(logp_NxCxV) * logp_NxCxV, axis=-1)
    return logp_NxC, ent_NxC

  if chunk is None:
    chunk = logprob_chunk(mcfg)
  c = max(1, min(int(chunk), t))
  n_chunks = -(-t // c)
  pad = n_chunks * c - t
  if n_chunks == 1 and n * t * mcfg.vocab_size <= REMAT_MIN_LOGITS:
    return one_chunk(h_NxLxD, targets_NxL)  # small: keep the log-softmax for the backward, skip a head recompute
  one_chunk = jax.checkpoint(one_chunk)
  if n_chunks == 1:
    return one_chunk(h_NxLxD, targets_NxL)
  h_p = jnp.pad(h_NxLxD, ((0, 0), (0, pad), (0, 0)))
  nx_p = jnp.pad(targets_NxL, ((0, 0), (0, pad)))
  h_CnxNxCxD = h_p.reshape(n, n_chunks, c, -1).transpose(1, 0, 2, 3)
  nx_CnxNxC = nx_p.reshape(n, n_chunks, c).transpose(1, 0, 2)
  logp, ent = jax.lax.map(lambda a: one_chunk(*a), (h_CnxNxCxD, nx_CnxNxC))
  return logp.transpose(1, 0, 2).reshape(n, -1)[:, :t], ent.transpose(1, 0, 2).reshape(n, -1)[:, :t]


def logprobs_from_hidden(mcfg: ModelConfig, h_NxTxD: jax.Array, head_DxV: jax.Array, tokens_NxT: jax.Array,
                         temperature: float | jax.Array = 1.0,
                         chunk: int | None = None) -> tuple[jax.Array, jax.Array]:
  """`token_logprobs` from hidden states already computed (one trunk pass can serve a value head too)."""
  n = tokens_NxT.shape[0]
  # the distribution at t-1 predicts token t; the last position predicts nothing, so it is never scored
  logp_NxT1, ent_NxT1 = target_logprobs(mcfg, h_NxTxD[:, :-1], head_DxV, tokens_NxT[:, 1:], temperature, chunk)
  zeros = jnp.zeros((n, 1), jnp.float32)
  return jnp.concatenate([zeros, logp_NxT1], axis=1), jnp.concatenate([zeros, ent_NxT1], axis=1)


def completion_logprobs(mcfg: ModelConfig, params: Params, tokens_NxT: jax.Array, positions_NxT: jax.Array,
                        mask_NxT: jax.Array, prompt_len: int, temperature: float | jax.Array = 1.0,
                        chunk: int | None = None) -> tuple[jax.Array, jax.Array]:
  """(logp_NxL, entropy_NxL) of tokens[:, P:] only: the LM head runs on the L positions that predict them."""
  if not 1 <= prompt_len <= tokens_NxT.shape[1]:
    raise ValueError(f"prompt_len={prompt_len}: must be in [1, T={tokens_NxT.shape[1]}] (position P-1 scores the "
                     "first completion token).")
  h_NxTxD, head_DxV = hidden_states(mcfg, params, tokens_NxT, positions_NxT, mask_NxT)
  return target_logprobs(mcfg, h_NxTxD[:, prompt_len - 1:-1], head_DxV, tokens_NxT[:, prompt_len:], temperature,
                         chunk)


def token_logprobs(mcfg: ModelConfig, params: Params, tokens_NxT: jax.Array, positions_NxT: jax.Array,
                   mask_NxT: jax.Array, temperature: float | jax.Array = 1.0,
                   chunk: int | None = None, packed: bool = False) -> tuple[jax.Array, jax.Array]:
  """(logp_NxT, entropy_NxT) of softmax(logits / temperature), aligned to the token they predict.

  logp[:, t] = log p(tokens[:, t] | tokens[:, <t]) and entropy[:, t] is the entropy of that same distribution;
  column 0 is 0 in both. Values at pad positions are not masked. The N×T×V log-softmax is computed `chunk`
  positions at a time under `jax.checkpoint`, so neither the forward nor the backward pass holds it whole.
  chunk=None picks ~2^21 logits per row per chunk (whole sequence for small vocabularies); results are identical.
  """
  h_NxTxD, head_DxV = hidden_states(mcfg, params, tokens_NxT, positions_NxT, mask_NxT, packed)
  return logprobs_from_hidden(mcfg, h_NxTxD, head_DxV, tokens_NxT, temperature, chunk)


