"""The decoder's decode mode: the KV cache, the prompt prefill, the weights prepared once per rollout, one step.

KV cache: one buffer per layer, K as [N, K, Dh, S] and V as [N, K, S, Dh] (docs/performance.md, "XLA:CPU facts":
this layout avoids a whole-cache transpose per decode step). Decode runs the layers as a Python loop over per-layer
weights and caches prepared once per rollout (`decode_weights`; decode_layout.py puts them into the decode layout):
a layer `while` inside the decode loop would slice (copy) every layer's weights and K/V cache at every token.
"""
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from grpo_jax.model import live_attention
from grpo_jax.model import lora
from grpo_jax.model import paged_attention
from grpo_jax.model.model import Block, ModelConfig, Params, RMSNorm, apply_stack, head_logits

Cache = dict[str, jax.Array]


def cache_axes() -> dict[str, PartitionSpec]:
  """Logical axes of one layer's KV cache buffers (every entry of `init_cache`'s tuples)."""
  return {"k": PartitionSpec("batch", "kv_heads", "head_dim", "cache_len"),
          "v": PartitionSpec("batch", "kv_heads", "cache_len", "head_dim")}


def init_cache(mcfg: ModelConfig, n: int, length: int) -> Cache:
  """Zeroed KV cache in the compute dtype, one buffer per layer: k L × [N, K, Dh, S], v L × [N, K, S, Dh]."""
  shape = (n, mcfg.kv_heads)
  dt = mcfg.compute_dtype
  return {"k": tuple(jnp.zeros(shape + (mcfg.head_dim, length), dt) for _ in range(mcfg.layers)),
          "v": tuple(jnp.zeros(shape + (length, mcfg.head_dim), dt) for _ in range(mcfg.layers))}


def prefill(mcfg: ModelConfig, params: Params, tokens_NxP: jax.Array, positions_NxP: jax.Array,
            mask_NxP: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
  """Runs the (left-padded) prompt, writes its K/V into cache slots [0, P), returns logits at the last slot."""
  p = tokens_NxP.shape[1]
  if cache["k"][0].shape[-1] < p:
    raise ValueError(f"cache length {cache['k'][0].shape[-1]} < prompt length {p}; "
                     "make init_cache(length=...) at least P + new tokens.")
  with jax.named_scope("prefill"):  # the phase name the roofline attributes collectives by (hlo_collectives.py)
    h_NxPxD, head_DxV, (k_LxNxKxDxP, v_LxNxKxPxD) = apply_stack(mcfg, params, "prefill", tokens_NxP, positions_NxP,
                                                            mask_NxP)
    cache = {"k": tuple(jax.lax.dynamic_update_slice(c, k_LxNxKxDxP[l].astype(c.dtype), (0, 0, 0, 0))
                        for l, c in enumerate(cache["k"])),
             "v": tuple(jax.lax.dynamic_update_slice(c, v_LxNxKxPxD[l].astype(c.dtype), (0, 0, 0, 0))
                        for l, c in enumerate(cache["v"]))}
    return head_logits(mcfg, h_NxPxD[:, -1], head_DxV), cache


class DecodeWeights(NamedTuple):
  """What `decode_step` reads, prepared once per rollout: per-layer param dicts (kernels and biases in the compute
  dtype), the embedding table in the compute dtype, the untied LM head (None: tied, the table's transpose) and the
  final norm. decode_layout.prepare puts them into the decode layout."""
  layers: tuple
  embed_VxD: jax.Array
  head_DxV: jax.Array | None
  final_norm: Params


def decode_weights(mcfg: ModelConfig, params: Params) -> DecodeWeights:
  """Per-layer weights sliced out of the stacked [layers, ...] params and cast, once per rollout, outside the decode
  loop: they enter the loop as invariant buffers, where slicing the stacked params inside it copies every weight at
  every token. Casting the table before the lookup gives the same values as casting the looked-up rows. LoRA
  adapters are merged here (W + scale·A·B, one layer at a time, rounded once to the compute dtype, not to a
  bfloat16 base's: that rounding lost the adapter's delta, so the sampler decoded a policy nearer the base than the
  one trained): the decode loop pays no per-token adapter cost."""
  dt = mcfg.compute_dtype
  cast = lambda path, x: x.astype(dt) if path[-1].key in ("kernel", "bias") else x

  def layer(l):
    p = jax.tree.map(lambda x: x[l], params["layers"])
    p = {m: lora.merge_module(mcfg, m, v, dt) for m, v in p.items()}
    return jax.tree_util.tree_map_with_path(cast, p)
  layers = tuple(layer(l) for l in range(mcfg.layers))
  head = None if mcfg.tie_embeddings else params["lm_head"]["kernel"].astype(dt)
  return DecodeWeights(layers, params["embed"]["embedding"].astype(dt), head, params["final_norm"])


def decode_step(mcfg: ModelConfig, params: Params, token_N: jax.Array, position_N: jax.Array, cache: Cache,
                index: jax.Array | int, kv_mask_NxS: jax.Array,
                weights: DecodeWeights | None = None) -> tuple[jax.Array, Cache]:
  """Feeds one token per row into cache slot `index`; attends to slots s <= index where kv_mask_NxS[:, s].

  Runs the layers as a Python loop over their own weights (`weights`, from `decode_weights` or
  decode_layout.prepare; made from `params` here if None) and their own cache buffers, so nothing is sliced out of a
  stacked array per token."""
  w = decode_weights(mcfg, params) if weights is None else weights
  index = jnp.asarray(index, jnp.int32)
  layer = lambda l, blk, lp, x, pos: blk.apply({"params": lp}, x, pos, None, (cache["k"][l], cache["v"][l]), index,
                                               kv_mask_NxS)
  logits, kvs = _layers(mcfg, w, token_N, position_N, "decode", layer)
  return logits, {"k": tuple(k for k, _ in kvs), "v": tuple(v for _, v in kvs)}


def decode_step_live(mcfg: ModelConfig, weights: DecodeWeights, token_N: jax.Array, position_N: jax.Array,
                     live: tuple[live_attention.LiveKV | paged_attention.PagedKV, ...], t_N: jax.Array):
  """The continuous engine's step: row n's token goes into its own completion position t_N[n] of its slot; it
  attends to its prompt's shared KV and its own completion KV: live_attention.py's layout, or paged_attention.py's
  store (PagedKVs, which carry the write positions themselves). -> (logits, updated LiveKVs / PagedKVs)."""
  mode = "decode_paged" if isinstance(live[0], paged_attention.PagedKV) else "decode_live"
  layer = lambda l, blk, lp, x, pos: blk.apply({"params": lp}, x, pos, None, live[l], t_N)
  return _layers(mcfg, weights, token_N, position_N, mode, layer)


def _layers(mcfg: ModelConfig, w: DecodeWeights, token_N, position_N, mode: str, layer):
  """Embedding, the layers as a Python loop (`layer(l, block, layer_params, x, positions)` -> (x, kv)), final norm
  and head: the body both decode steps share."""
  dt = mcfg.compute_dtype
  x_NxD = nn.with_logical_constraint(jnp.take(w.embed_VxD, token_N, axis=0).astype(dt), ("batch", "embed"))
  kvs = []
  for l, layer_params in enumerate(w.layers):
    x_NxD, kv = layer(l, Block(mcfg, mode), layer_params, x_NxD, position_N[:, None])
    kvs.append(kv)
  h_NxD = RMSNorm(mcfg.rms_eps, dt).apply({"params": w.final_norm}, x_NxD)
  head_DxV = w.embed_VxD.T if w.head_DxV is None else w.head_DxV
  return head_logits(mcfg, h_NxD, head_DxV), tuple(kvs)
