"""Writing our params as a Hugging Face Qwen2/Llama checkpoint: config.json + safetensors (sharded with an index
above max_shard_bytes), one tensor on the host at a time. The name and layout mapping is hf_io's."""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax
import numpy as np

from grpo_jax.hf import safetensors_io as st
from grpo_jax.hf.hf_io import LINEAR, NORMS, path_key, expected_tensors, hf_config
from grpo_jax.model import model as model_lib

# every safetensors file an export writes carries this in its metadata: what tells an earlier export, which a new one
# may replace whole, from another program's checkpoint of the same file names (transformers ignores the extra key)
EXPORT_METADATA = {"format": "pt", "written_by": "grpo_jax"}  # format: transformers refuses files without it


def _hf_tensor(name: str, mcfg, host: Callable[[tuple, int | None], np.ndarray]) -> np.ndarray:
  """One HF tensor computed from our params; `host(key, layer)` returns that leaf (or its layer slice) on the host."""
  if name == "model.embed_tokens.weight":
    return host(("embed", "embedding"), None)
  if name == "model.norm.weight":
    return host(("final_norm", "scale"), None)
  if name == "lm_head.weight":
    return host(("lm_head", "kernel"), None).T
  parts = name.split(".")
  i, module = int(parts[2]), ".".join(parts[3:-1])
  if name.endswith("o_proj.bias"):
    return np.zeros((mcfg.hidden,), np.float32)
  for ours, hf in NORMS.items():
    if module == hf:
      return host(("layers", ours, "scale"), i)
  ours = next(k for k, v in LINEAR.items() if v == module)
  if parts[-1] == "bias":
    return host(("layers", ours, "bias"), i).reshape(-1)
  w = host(("layers", ours, "kernel"), i)
  return (w.reshape(-1, mcfg.hidden) if ours == "o" else w.reshape(w.shape[0], -1) if ours in ("q", "k", "v")
          else w).T


def save_hf(path: str, mcfg: model_lib.ModelConfig, params: Any, *, model_type: str = "qwen2",
            dtype: str = "float32", max_shard_bytes: int = 4 << 30, base_config: dict | None = None) -> None:
  """Writes config.json + safetensors (sharded with an index above max_shard_bytes), one tensor on the host at a
  time. `base_config`: the source checkpoint's config.json, whose other keys are kept."""
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype={dtype!r}: use 'float32' or 'bfloat16'.")
  cfg = hf_config(mcfg, model_type, base_config)
  cfg["torch_dtype"] = dtype
  leaves = {path_key(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}

  def host(key, layer):  # one leaf, or one layer of it, on the host
    x = leaves[key]
    if isinstance(x, jax.Array) and {d.platform for d in x.devices()} == {"cpu"} and len(x.devices()) == 1:
      # a view of its host buffer (no copy): a layer sliced by NumPy. x[layer] on the jax.Array compiled two
      # one-op programs (a slice, a squeeze) per leaf shape in every export, whose params are on the host.
      x = np.asarray(x)
    x = x if layer is None else x[layer]
    return np.asarray(x if isinstance(x, np.ndarray) else jax.device_get(x), np.float32)

  shapes = expected_tensors(mcfg)
  if model_type == "llama" and mcfg.qkv_bias:  # transformers' Llama with attention_bias also biases o_proj
    shapes.update({f"model.layers.{i}.self_attn.o_proj.bias": (mcfg.hidden,) for i in range(mcfg.layers)})
  np_dtype = st.DTYPES["F32" if dtype == "float32" else "BF16"]
  shards, cur, size = [], [], 0
  for name in sorted(shapes):
    nbytes = int(np.prod(shapes[name])) * np_dtype.itemsize
    if cur and size + nbytes > max_shard_bytes:
      shards.append(cur)
      cur, size = [], 0
    cur.append(name)
    size += nbytes
  shards.append(cur)
  os.makedirs(path, exist_ok=True)
  for name in os.listdir(path):  # an earlier save's weights: a stale shard or index would be read with ours
    if name.endswith(".safetensors") or name == "model.safetensors.index.json":
      os.remove(os.path.join(path, name))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  meta = EXPORT_METADATA
  produce = lambda name: _hf_tensor(name, mcfg, host)
  if len(shards) == 1:
    st.write(os.path.join(path, "model.safetensors"), [(n, shapes[n], np_dtype) for n in shards[0]], produce, meta)
    return
  weight_map = {}
  for i, names in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    st.write(os.path.join(path, file), [(n, shapes[n], np_dtype) for n in names], produce, meta)
    weight_map.update({n: file for n in names})
  total = sum(int(np.prod(s)) * np_dtype.itemsize for s in shapes.values())
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
