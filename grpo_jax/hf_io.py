"""Hugging Face Qwen2/Qwen2.5/Llama-3 checkpoints <-> our params, through safetensors only (no torch needed).

A checkpoint directory is `config.json` plus `model.safetensors` or `model.safetensors.index.json` and its shards.
The name mapping (HF `[out, in]` linear weights are transposed into our `[in, ...out]` kernels):

  model.embed_tokens.weight                       embed/embedding
  model.layers.{i}.input_layernorm.weight         layers/attn_norm/scale[i]
  model.layers.{i}.self_attn.{q,k,v}_proj.weight  layers/{q,k,v}/kernel[i]   [D, heads, head_dim]
  model.layers.{i}.self_attn.{q,k,v}_proj.bias    layers/{q,k,v}/bias[i]     [heads, head_dim]
  model.layers.{i}.self_attn.o_proj.weight        layers/o/kernel[i]         [heads, head_dim, D]
  model.layers.{i}.post_attention_layernorm.weight layers/mlp_norm/scale[i]
  model.layers.{i}.mlp.{gate,up,down}_proj.weight layers/{gate,up,down}/kernel[i]
  model.norm.weight                               final_norm/scale
  lm_head.weight                                  lm_head/kernel (untied only)
"""
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.flax import save_file

from grpo_jax import model as model_lib

_SUPPORTED = ("qwen2", "llama")
_LINEAR = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
_NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def _rope(hf: dict) -> tuple[float, dict]:
  """(theta, scaling dict) from either the v4 (`rope_theta`, `rope_scaling`) or v5 (`rope_parameters`) layout."""
  params = hf.get("rope_parameters") or {}
  scaling = hf.get("rope_scaling") or params
  theta = hf.get("rope_theta", params.get("rope_theta", 10_000.0))
  return float(theta), scaling


def config_from_hf(hf: dict, *, dtype: str = "float32", remat: str = "none") -> model_lib.ModelConfig:
  """ModelConfig from a HF config.json dict; anything we do not implement is rejected, never silently dropped."""
  mt = hf.get("model_type")
  if mt not in _SUPPORTED:
    raise ValueError(f"config.json model_type={mt!r}: only {_SUPPORTED} (Qwen2/Qwen2.5, Llama-3) are supported.")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"config.json hidden_act={hf['hidden_act']!r}: only 'silu' (SwiGLU) is supported.")
  if hf.get("use_sliding_window", False):
    raise ValueError("config.json use_sliding_window=true: sliding-window attention is not implemented; "
                     "use a checkpoint with use_sliding_window=false.")
  if mt == "llama" and hf.get("mlp_bias", False):
    raise ValueError("config.json mlp_bias=true: MLP biases are not implemented.")
  theta, scaling = _rope(hf)
  rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
  kw = {}
  if rope_type == "llama3":
    kw = dict(rope_scaling_factor=float(scaling["factor"]), rope_low_freq_factor=float(scaling["low_freq_factor"]),
              rope_high_freq_factor=float(scaling["high_freq_factor"]),
              rope_original_max_len=int(scaling["original_max_position_embeddings"]))
  elif rope_type not in (None, "default"):
    raise ValueError(f"config.json rope scaling type {rope_type!r}: only 'default' and 'llama3' are implemented.")
  heads = int(hf["num_attention_heads"])
  return model_lib.ModelConfig(
      vocab_size=int(hf["vocab_size"]), hidden=int(hf["hidden_size"]), layers=int(hf["num_hidden_layers"]),
      heads=heads, kv_heads=int(hf.get("num_key_value_heads") or heads), head_dim=int(hf.get("head_dim") or 0),
      inter=int(hf["intermediate_size"]), rope_theta=theta,
      qkv_bias=True if mt == "qwen2" else bool(hf.get("attention_bias", False)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)), max_len=int(hf["max_position_embeddings"]),
      dtype=dtype, rms_eps=float(hf["rms_norm_eps"]), remat=remat, **kw)


def hf_config(mcfg: model_lib.ModelConfig, model_type: str = "qwen2") -> dict:
  """config.json content that transformers (v4 and v5) reads back into the same architecture."""
  if model_type not in _SUPPORTED:
    raise ValueError(f"model_type={model_type!r}: use one of {_SUPPORTED}.")
  if model_type == "qwen2" and not mcfg.qkv_bias:
    raise ValueError("model_type='qwen2' always has q/k/v biases; export with model_type='llama' "
                     "(or set model.qkv_bias=True).")
  cfg = dict(
      architectures=["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"], model_type=model_type,
      vocab_size=mcfg.vocab_size, hidden_size=mcfg.hidden, intermediate_size=mcfg.inter,
      num_hidden_layers=mcfg.layers, num_attention_heads=mcfg.heads, num_key_value_heads=mcfg.kv_heads,
      head_dim=mcfg.head_dim, max_position_embeddings=mcfg.max_len, rms_norm_eps=mcfg.rms_eps,
      rope_theta=mcfg.rope_theta, tie_word_embeddings=mcfg.tie_embeddings, hidden_act="silu",
      attention_dropout=0.0, torch_dtype="float32")
  if model_type == "llama":
    cfg.update(attention_bias=mcfg.qkv_bias, mlp_bias=False)
  else:
    cfg.update(use_sliding_window=False)
  if mcfg.rope_scaling_factor > 0:
    cfg["rope_scaling"] = dict(rope_type="llama3", factor=mcfg.rope_scaling_factor,
                               low_freq_factor=mcfg.rope_low_freq_factor,
                               high_freq_factor=mcfg.rope_high_freq_factor,
                               original_max_position_embeddings=mcfg.rope_original_max_len)
  return cfg


def _read_tensors(path: str) -> dict[str, np.ndarray]:
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
  elif os.path.exists(os.path.join(path, "model.safetensors")):
    files = ["model.safetensors"]
  else:
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not files:
    raise ValueError(f"{path}: no *.safetensors files; pass a Hugging Face checkpoint directory.")
  out = {}
  for name in files:
    with safe_open(os.path.join(path, name), framework="flax") as f:  # flax: reads bf16 too
      for key in f.keys():
        out[key] = np.asarray(f.get_tensor(key).astype(jnp.float32))
  return out


def load_hf(path: str, *, dtype: str = "float32", remat: str = "none") -> tuple[model_lib.ModelConfig, Any]:
  """(ModelConfig, float32 params) from a local HF Qwen2/Llama directory."""
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  mcfg = config_from_hf(hf, dtype=dtype, remat=remat)
  t = _read_tensors(path)
  used = set()

  def take(key):
    if key not in t:
      raise ValueError(f"{path}: tensor {key!r} missing; the checkpoint does not match its config.json.")
    used.add(key)
    return t[key]

  h, kv, hd, d = mcfg.heads, mcfg.kv_heads, mcfg.head_dim, mcfg.hidden
  heads = {"q": h, "k": kv, "v": kv}
  layers = {name: [] for name in list(_LINEAR) + list(_NORMS)}
  biases = {name: [] for name in heads}
  for i in range(mcfg.layers):
    pre = f"model.layers.{i}."
    for name, hf_name in _NORMS.items():
      layers[name].append(take(pre + hf_name + ".weight"))
    for name, n in heads.items():
      layers[name].append(take(pre + _LINEAR[name] + ".weight").T.reshape(d, n, hd))
      if mcfg.qkv_bias:
        biases[name].append(take(pre + _LINEAR[name] + ".bias").reshape(n, hd))
    layers["o"].append(take(pre + "self_attn.o_proj.weight").T.reshape(h, hd, d))
    if pre + "self_attn.o_proj.bias" in t:  # Llama attention_bias=true also biases o_proj: only zeros map
      if np.any(take(pre + "self_attn.o_proj.bias") != 0):
        raise ValueError(f"{path}: {pre}self_attn.o_proj.bias is non-zero; o_proj biases are not implemented.")
    for name in ("gate", "up", "down"):
      layers[name].append(take(pre + _LINEAR[name] + ".weight").T)
  params = {
      "embed": {"embedding": take("model.embed_tokens.weight")},
      "final_norm": {"scale": take("model.norm.weight")},
      "layers": {name: ({"scale": np.stack(v)} if name in _NORMS else {"kernel": np.stack(v)})
                 for name, v in layers.items()},
  }
  if mcfg.qkv_bias:
    for name, v in biases.items():
      params["layers"][name]["bias"] = np.stack(v)
  if mcfg.tie_embeddings:
    used.add("lm_head.weight")  # some tied checkpoints store the shared matrix twice
  else:
    params["lm_head"] = {"kernel": take("lm_head.weight").T}
  extra = sorted(k for k in set(t) - used if not k.endswith("rotary_emb.inv_freq"))
  if extra:
    raise ValueError(f"{path}: unexpected tensors {extra[:4]}{'...' if len(extra) > 4 else ''}; "
                     "this architecture variant is not supported.")
  want = jax.eval_shape(lambda: model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
  if jax.tree.structure(want) != jax.tree.structure(params):
    raise ValueError(f"{path}: param tree does not match ModelConfig {mcfg}.")
  for (p, w), g in zip(jax.tree_util.tree_flatten_with_path(want)[0], jax.tree.leaves(params)):
    if w.shape != g.shape:
      raise ValueError(f"{path}: {jax.tree_util.keystr(p)} has shape {g.shape}, config.json implies {w.shape}.")
  return mcfg, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def save_hf(path: str, mcfg: model_lib.ModelConfig, params: Any, *, model_type: str = "qwen2",
            dtype: str = "float32", max_shard_bytes: int = 4 << 30) -> None:
  """Writes config.json + safetensors (sharded with an index when larger than max_shard_bytes)."""
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype={dtype!r}: use 'float32' or 'bfloat16'.")
  cfg = hf_config(mcfg, model_type)
  cfg["torch_dtype"] = dtype
  p = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  ly = p["layers"]
  t = {"model.embed_tokens.weight": p["embed"]["embedding"], "model.norm.weight": p["final_norm"]["scale"]}
  for i in range(mcfg.layers):
    pre = f"model.layers.{i}."
    for name, hf_name in _NORMS.items():
      t[pre + hf_name + ".weight"] = ly[name]["scale"][i]
    for name in ("q", "k", "v"):
      t[pre + _LINEAR[name] + ".weight"] = ly[name]["kernel"][i].reshape(mcfg.hidden, -1).T
      if mcfg.qkv_bias:
        t[pre + _LINEAR[name] + ".bias"] = ly[name]["bias"][i].reshape(-1)
    t[pre + "self_attn.o_proj.weight"] = ly["o"]["kernel"][i].reshape(-1, mcfg.hidden).T
    if model_type == "llama" and mcfg.qkv_bias:
      t[pre + "self_attn.o_proj.bias"] = np.zeros((mcfg.hidden,), np.float32)
    for name in ("gate", "up", "down"):
      t[pre + _LINEAR[name] + ".weight"] = ly[name]["kernel"][i].T
  if not mcfg.tie_embeddings:
    t["lm_head.weight"] = p["lm_head"]["kernel"].T
  jdt = jnp.float32 if dtype == "float32" else jnp.bfloat16
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  shards, cur, size = [], {}, 0
  for key in sorted(t):
    nbytes = t[key].size * jnp.dtype(jdt).itemsize
    if cur and size + nbytes > max_shard_bytes:
      shards.append(cur)
      cur, size = {}, 0
    cur[key] = jnp.asarray(np.ascontiguousarray(t[key]), jdt)
    size += nbytes
  shards.append(cur)
  meta = {"format": "pt"}  # transformers refuses safetensors files without this tag
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata=meta)
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(path, name), metadata=meta)
    weight_map.update({k: name for k in shard})
  total = sum(v.size * jnp.dtype(jdt).itemsize for v in t.values())
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": int(total)}, "weight_map": weight_map}, f, indent=2)
