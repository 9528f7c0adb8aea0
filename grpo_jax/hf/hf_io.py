"""Hugging Face Qwen2/Qwen2.5/Llama-3 checkpoints <-> our params, through safetensors only (no torch needed).

A checkpoint directory is `config.json` plus `model.safetensors` or `model.safetensors.index.json` and its shards.
The name mapping (HF `[out, in]` linear weights are transposed into our `[in, ...out]` kernels):

  model.embed_tokens.weight                        embed/embedding
  model.layers.{i}.input_layernorm.weight          layers/attn_norm/scale[i]
  model.layers.{i}.self_attn.{q,k,v}_proj.weight   layers/{q,k,v}/kernel[i]   [D, heads, head_dim]
  model.layers.{i}.self_attn.{q,k,v}_proj.bias     layers/{q,k,v}/bias[i]     [heads, head_dim]
  model.layers.{i}.self_attn.o_proj.weight         layers/o/kernel[i]         [heads, head_dim, D]
  model.layers.{i}.post_attention_layernorm.weight layers/mlp_norm/scale[i]
  model.layers.{i}.mlp.{gate,up,down}_proj.weight  layers/{gate,up,down}/kernel[i]
  model.norm.weight                                final_norm/scale
  lm_head.weight                                   lm_head/kernel (untied only)

Loading checks every file header against config.json first (all problems in one line naming the file, the tensor
and the expected shape), then streams: each of our leaves is filled on the host from one HF tensor at a time and
placed into its sharded device array before the next leaf is read, so host memory peaks at the params' float32
bytes plus about two of the largest leaf (docs/hf.md), not the whole model twice. Every process reads the same files,
so host-local pieces of the global arrays agree (multi-process safe).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.model import model as model_lib
from grpo_jax.hf import safetensors_io as st

SUPPORTED = ("qwen2", "llama")
LINEAR = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
_IGNORED = ("rotary_emb.inv_freq",)  # buffers old exports saved; recomputed from the config
_MAX_LISTED = 3  # problems spelled out in the one-line error; the rest are counted


class CheckpointError(config_lib.ConfigError):
  """A checkpoint directory we cannot load as asked: one line naming the file, the tensor and the fix. A
  ConfigError, so the CLI prints it alone and exits 2."""


# ------------------------------------------------------------------------------------------------- config.json


def read_json(path: str, what: str = "config.json") -> dict:
  if not os.path.isfile(path):
    raise CheckpointError(f"{path} is missing; a Hugging Face checkpoint directory holds {what} and *.safetensors.")
  try:
    with open(path, encoding="utf-8") as f:
      out = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path}: not valid JSON ({e}).") from None
  if not isinstance(out, dict):
    raise CheckpointError(f"{path}: expected a JSON object.")
  return out


def _rope(hf: dict) -> tuple[list[tuple[str, Any]], Any]:
  """(every RoPE θ the file states, as (key, value), and the scaling dict) from the v4 (`rope_theta`,
  `rope_scaling`) or v5 (`rope_parameters`) layout. transformers 5 takes the dict from rope_scaling, else
  rope_parameters, and θ from that dict before the top-level rope_theta; transformers 4 reads only the top level:
  where they disagree the file means two models, so the caller refuses it."""
  params = hf.get("rope_parameters") or {}
  scaling = hf.get("rope_scaling") or params
  thetas = [("rope_theta", hf.get("rope_theta"))]
  for key, d in (("rope_scaling", hf.get("rope_scaling")), ("rope_parameters", params)):
    if isinstance(d, dict):
      thetas.append((f"{key}.rope_theta", d.get("rope_theta")))
  return [(k, v) for k, v in thetas if v is not None], scaling


def config_from_hf(hf: dict, *, dtype: str = "float32", remat: str = "none",
                   source: str = "config.json") -> model_lib.ModelConfig:
  """ModelConfig from a HF config.json dict; anything we do not implement is refused in one line, never dropped."""
  def bad(msg: str):
    raise CheckpointError(f"{source}: {msg}")

  def flag(key: str, default: bool = False) -> bool:
    """A true/false field; a string such as "false" is refused (bool("false") is True: it would tie, or drop a
    tensor, silently)."""
    v = hf.get(key, default)
    if v is None:
      return default
    if not isinstance(v, (bool, np.bool_)):
      bad(f"{key}={v!r}: expected true or false.")
    return bool(v)

  def num(key: str, cast, default=None, d: dict | None = None):
    """A numeric field (null or absent: `default`), named when it is not a number."""
    v = (hf if d is None else d).get(key)
    if v is None:
      if default is None:
        bad(f"{key} is null; expected a number.")
      return default
    try:
      if isinstance(v, bool):
        raise TypeError
      return cast(v)
    except (TypeError, ValueError, OverflowError):
      bad(f"{key}={v!r}: expected {'an integer' if cast is int else 'a number'}.")

  mt = hf.get("model_type")
  if mt not in SUPPORTED:
    bad(f"model_type={mt!r} is not supported; use a Qwen2/Qwen2.5 ('qwen2') or Llama-3 ('llama') checkpoint.")
  if hf.get("hidden_act", "silu") != "silu":
    bad(f"hidden_act={hf['hidden_act']!r}: only 'silu' (SwiGLU) is implemented.")
  if flag("use_sliding_window"):
    bad("use_sliding_window=true: sliding-window attention is not implemented; use a checkpoint without it.")
  layer_types = hf.get("layer_types")
  if layer_types is not None and (not isinstance(layer_types, list) or
                                  any(t != "full_attention" for t in layer_types)):
    other = sorted({str(t) for t in layer_types} - {"full_attention"}) if isinstance(layer_types, list) else []
    bad(f"layer_types={other or layer_types!r}: only 'full_attention' layers are implemented (sliding-window "
        "attention is not); use a checkpoint whose layers all attend fully.")
  if flag("mlp_bias"):
    bad("mlp_bias=true: MLP biases are not implemented.")
  quant = hf.get("quantization_config")
  if quant:  # its tensors (int weights, fp8, scales) were reported as damage to re-download
    method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
    bad(f"quantization_config (quant_method {method!r}): quantized checkpoints are not supported; use the "
        "unquantized (bfloat16/float16/float32) checkpoint of the model.")
  if hf.get("pretraining_tp", 1) not in (1, None):
    bad(f"pretraining_tp={hf['pretraining_tp']}: only 1 is implemented.")
  missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                         "intermediate_size") if k not in hf]
  if missing:
    bad(f"lacks {', '.join(missing)}; is this a causal LM's config.json?")
  stated, scaling = _rope(hf)
  if not isinstance(scaling, dict):
    bad(f"rope_scaling={scaling!r}: expected an object or null.")
  values = []
  for key, v in stated:
    try:
      if isinstance(v, bool):
        raise TypeError
      values.append(float(v))
    except (TypeError, ValueError, OverflowError):
      bad(f"{key}={v!r}: expected a number.")
  if len(set(values)) > 1:
    bad(f"{' and '.join(f'{k}={v!r}' for k, v in stated)} disagree (transformers 4 reads the top-level rope_theta, "
        "5 the one in the RoPE dict); keep one value.")
  theta = values[0] if values else 10_000.0
  for d in (hf, scaling, hf.get("rope_parameters") or {}):
    prf = d.get("partial_rotary_factor") if isinstance(d, dict) else None
    if prf is not None and prf != 1:
      bad(f"partial_rotary_factor={prf!r}: partial RoPE is not implemented (Qwen2/Llama rotate the whole head); "
          "use a checkpoint without it.")
  rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
  kw = {}
  if rope_type == "llama3":
    need = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    lacking = [k for k in need if k not in scaling]
    if lacking:
      bad(f"rope_scaling (rope_type 'llama3') lacks {', '.join(lacking)}; llama3 scaling needs {', '.join(need)}.")
    kw = dict(rope_scaling_factor=num("factor", float, d=scaling),
              rope_low_freq_factor=num("low_freq_factor", float, d=scaling),
              rope_high_freq_factor=num("high_freq_factor", float, d=scaling),
              rope_original_max_len=num("original_max_position_embeddings", int, d=scaling))
  elif rope_type not in (None, "default"):
    bad(f"rope scaling type {rope_type!r} is not implemented; only 'default' and 'llama3' are.")
  heads = num("num_attention_heads", int)
  fields = dict(
      vocab_size=num("vocab_size", int), hidden=num("hidden_size", int), layers=num("num_hidden_layers", int),
      heads=heads, kv_heads=num("num_key_value_heads", int, heads), head_dim=num("head_dim", int, 0),
      inter=num("intermediate_size", int), rope_theta=theta,
      qkv_bias=True if mt == "qwen2" else flag("attention_bias"), tie_embeddings=flag("tie_word_embeddings"),
      max_len=num("max_position_embeddings", int, 0) or (32768 if mt == "qwen2" else 2048),
      rms_eps=num("rms_norm_eps", float, 1e-6))
  try:
    return model_lib.ModelConfig(dtype=dtype, remat=remat, **fields, **kw)
  except (TypeError, ValueError) as e:
    bad(f"{str(e).splitlines()[0]}")


def read_config(path: str, **kw) -> model_lib.ModelConfig:
  """The ModelConfig of the checkpoint directory `path` (its config.json)."""
  if not os.path.isdir(path):
    raise CheckpointError(f"{path} is not a directory; point train.init_from=hf:<dir> at a Hugging Face checkpoint "
                          "directory (config.json + *.safetensors).")
  cfg = os.path.join(path, "config.json")
  return config_from_hf(read_json(cfg), source=cfg, **kw)


def hf_config(mcfg: model_lib.ModelConfig, model_type: str = "qwen2", base: dict | None = None) -> dict:
  """config.json content that transformers (v4 and v5) reads back into the same architecture. `base`: the source
  checkpoint's config.json, whose other keys (token ids, max_position_embeddings, ...) are kept."""
  if model_type not in SUPPORTED:
    raise ValueError(f"model_type={model_type!r}: use one of {SUPPORTED}.")
  if model_type == "qwen2" and not mcfg.qkv_bias:
    raise ValueError("model_type='qwen2' always has q/k/v biases; export with model_type='llama' "
                     "(or set model.qkv_bias=True).")
  cfg = {k: v for k, v in (base or {}).items() if k not in ("rope_parameters", "rope_scaling", "torch_dtype", "dtype")}
  cfg.update(
      architectures=["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"], model_type=model_type,
      vocab_size=mcfg.vocab_size, hidden_size=mcfg.hidden, intermediate_size=mcfg.inter,
      num_hidden_layers=mcfg.layers, num_attention_heads=mcfg.heads, num_key_value_heads=mcfg.kv_heads,
      head_dim=mcfg.head_dim, rms_norm_eps=mcfg.rms_eps, rope_theta=mcfg.rope_theta,
      tie_word_embeddings=mcfg.tie_embeddings, hidden_act="silu", attention_dropout=0.0, torch_dtype="float32")
  cfg.setdefault("max_position_embeddings", mcfg.max_len)
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


# ------------------------------------------------------------------------------------------------------ tensors


def no_weights_message(path: str) -> str:
  """Why a directory without *.safetensors cannot be loaded: PyTorch-only weights need converting, else none."""
  if any(f.endswith((".bin", ".pt", ".pth")) for f in os.listdir(path)):
    return (f"{path}: holds PyTorch .bin/.pt weights only, no *.safetensors; write them as safetensors "
            "(transformers: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)) "
            "and point init_from at hf:OUT.")
  return f"{path}: no *.safetensors files; download the weights too (config.json alone is not a checkpoint)."


def tensor_index(path: str) -> dict[str, st.TensorInfo]:
  """{tensor name: where it is} over the checkpoint's safetensors files, every header checked."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    weight_map = read_json(index, "model.safetensors.index.json").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise CheckpointError(f"{index}: no weight_map; the index does not list the checkpoint's tensors.")
    files = sorted(set(weight_map.values()))
  elif os.path.exists(os.path.join(path, "model.safetensors")):
    weight_map, files = None, ["model.safetensors"]
  else:
    weight_map, files = None, sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not files:
    raise CheckpointError(no_weights_message(path))
  out: dict[str, st.TensorInfo] = {}
  for name in files:
    file = os.path.join(path, name)
    if not os.path.isfile(file):
      why = ("listed in model.safetensors.index.json" if weight_map is not None else
             "a link whose target is gone, e.g. a partly downloaded Hugging Face cache")
      raise CheckpointError(f"{file} is missing ({why}); download every shard.")
    try:
      header = st.read_header(file)
    except st.FormatError as e:
      raise CheckpointError(f"{e} Re-download the file.") from None
    twice = sorted(set(header) & set(out))
    if twice:  # read last-file-wins, a stale copy beside the shards replaced the real tensor without a word
      raise CheckpointError(f"{path}: tensor {twice[0]} is in both {os.path.basename(out[twice[0]].file)} and {name}"
                            f"{f' (and {len(twice) - 1} more)' if len(twice) > 1 else ''}; the directory mixes two "
                            "checkpoints: remove the stale files.")
    out.update(header)
  if weight_map is not None:
    absent = [k for k, f in weight_map.items() if k not in out or os.path.basename(out[k].file) != f]
    if absent:
      raise CheckpointError(f"{index}: lists {absent[0]!r} in {weight_map[absent[0]]}, which does not hold it"
                            f"{f' (and {len(absent) - 1} more)' if len(absent) > 1 else ''}; the index and the shards "
                            "do not belong together.")
  return out


def expected_tensors(mcfg: model_lib.ModelConfig) -> dict[str, tuple[int, ...]]:
  """Every tensor a checkpoint of this config holds, with its HF shape."""
  d, f, hd = mcfg.hidden, mcfg.inter, mcfg.head_dim
  out = {"model.embed_tokens.weight": (mcfg.vocab_size, d), "model.norm.weight": (d,)}
  if not mcfg.tie_embeddings:
    out["lm_head.weight"] = (mcfg.vocab_size, d)
  n = {"q": mcfg.heads, "k": mcfg.kv_heads, "v": mcfg.kv_heads}
  for i in range(mcfg.layers):
    pre = f"model.layers.{i}."
    for hf_name in NORMS.values():
      out[pre + hf_name + ".weight"] = (d,)
    for name, heads in n.items():
      out[pre + LINEAR[name] + ".weight"] = (heads * hd, d)
      if mcfg.qkv_bias:
        out[pre + LINEAR[name] + ".bias"] = (heads * hd,)
    out[pre + LINEAR["o"] + ".weight"] = (d, mcfg.heads * hd)
    out[pre + LINEAR["gate"] + ".weight"] = (f, d)
    out[pre + LINEAR["up"] + ".weight"] = (f, d)
    out[pre + LINEAR["down"] + ".weight"] = (d, f)
  return out


def _optional(name: str, mcfg: model_lib.ModelConfig) -> tuple[int, ...] | None:
  """Tensors a checkpoint may hold beyond `expected_tensors`: an o_proj bias (Llama attention_bias; must be
  zeros, checked when read), a tied model's duplicate lm_head."""
  if name.endswith(_IGNORED):
    return ()
  if mcfg.qkv_bias and name.endswith("self_attn.o_proj.bias"):
    return (mcfg.hidden,)
  if mcfg.tie_embeddings and name == "lm_head.weight":
    return (mcfg.vocab_size, mcfg.hidden)
  return None


def check_tensors(path: str, mcfg: model_lib.ModelConfig, infos: dict[str, st.TensorInfo]) -> None:
  """Every expected tensor present with its shape and a float dtype, nothing unexpected; else one CheckpointError
  line listing the problems (the first few spelled out, with file, tensor and expected shape)."""
  problems = []
  for name, shape in expected_tensors(mcfg).items():
    info = infos.get(name)
    if info is None:
      problems.append(f"tensor {name} is missing (expected shape {list(shape)})")
    elif info.shape != shape:
      problems.append(f"{os.path.basename(info.file)}: tensor {name} has shape {list(info.shape)}, expected "
                      f"{list(shape)}")
    elif info.dtype.kind != "f" and info.dtype != st.DTYPES["BF16"]:
      problems.append(f"{os.path.basename(info.file)}: tensor {name} has dtype {info.dtype}, expected a float type")
  expected = expected_tensors(mcfg)
  for name, info in sorted(infos.items()):
    if name in expected:
      continue
    shape = _optional(name, mcfg)
    if shape is None:
      problems.append(f"{os.path.basename(info.file)}: unexpected tensor {name} (this architecture variant is not "
                      "supported: e.g. o_proj or MLP biases, extra layers)")
    elif shape and info.shape != shape:
      problems.append(f"{os.path.basename(info.file)}: tensor {name} has shape {list(info.shape)}, expected "
                      f"{list(shape)}")
  if problems:
    more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    raise CheckpointError(f"{path}: {len(problems)} tensor problem(s) against its config.json ({_describe(mcfg)}): "
                          f"{'; '.join(problems[:_MAX_LISTED])}{more}. The weights and config.json do not belong "
                          "together: re-download the checkpoint, or fix config.json.")


def _describe(mcfg) -> str:
  return (f"hidden {mcfg.hidden}, {mcfg.layers} layers, {mcfg.heads} heads / {mcfg.kv_heads} kv, head_dim "
          f"{mcfg.head_dim}, inter {mcfg.inter}, vocab {mcfg.vocab_size}")


# ------------------------------------------------------------------------------------------------------ loading


def _leaf_sources(key: tuple[str, ...], mcfg) -> tuple[Callable[[int], str], bool, bool]:
  """(HF name of layer i's tensor, stacked over layers?, transposed?) for one of our leaves."""
  if key[0] == "layers":
    name, kind = key[1], key[2]
    hf = (NORMS[name] + ".weight") if name in NORMS else (LINEAR[name] + "." + ("bias" if kind == "bias"
                                                                                   else "weight"))
    return (lambda i: f"model.layers.{i}.{hf}"), True, kind == "kernel"
  fixed = {("embed", "embedding"): ("model.embed_tokens.weight", False),
           ("final_norm", "scale"): ("model.norm.weight", False),
           ("lm_head", "kernel"): ("lm_head.weight", True)}[key]
  return (lambda i: fixed[0]), False, fixed[1]


def _fill(slot: np.ndarray, w: np.ndarray, transposed: bool) -> None:
  """Writes the HF tensor `w` into our `slot` (a view), casting to float32 without a full-size temporary."""
  src = w.T if transposed else w
  slot.reshape(src.shape)[...] = src


def _aligned_empty(shape: tuple[int, ...]) -> np.ndarray:
  """A float32 host array at a 64-byte boundary. XLA:CPU adopts such a buffer as the device buffer instead of
  copying it, so a load onto the CPU backend holds each leaf once (1.01x the fp32 bytes over imports, measured by
  benchmarks/hf_load_memory.py; a copied unaligned buffer measured 1.13-1.28x)."""
  n = int(np.prod(shape, dtype=np.int64))
  raw = np.empty(n * 4 + 64, np.uint8)
  off = -raw.ctypes.data % 64
  return raw[off:off + n * 4].view(np.float32).reshape(shape)


def path_key(path) -> tuple[str, ...]:
  return tuple(getattr(p, "key", getattr(p, "name", str(p))) for p in path)


def _check_o_bias(infos: dict[str, st.TensorInfo]) -> None:
  for name, info in infos.items():
    if name.endswith("self_attn.o_proj.bias") and np.any(st.read(info) != 0):
      raise CheckpointError(f"{info.file}: tensor {name} is non-zero; o_proj biases are not implemented (a "
                            "checkpoint with attention_bias=true must keep them at zero).")


def check_checkpoint(path: str) -> model_lib.ModelConfig:
  """Everything about the directory that can be checked without loading it (config.json, every safetensors header
  against it, o_proj biases); returns its ModelConfig. Cheap: headers and a few bias vectors."""
  mcfg = read_config(path)
  infos = tensor_index(path)
  check_tensors(path, mcfg, infos)
  _check_o_bias(infos)
  return mcfg


def _check_tied_head(mcfg: model_lib.ModelConfig, infos: dict[str, st.TensorInfo]) -> None:
  """A tied model's checkpoint that also holds lm_head.weight: it must equal the embedding. transformers 5 loads a
  differing one as a separate head, so the model the directory means is not the tied one we would load."""
  head, embed = infos.get("lm_head.weight"), infos.get("model.embed_tokens.weight")
  if not mcfg.tie_embeddings or head is None or embed is None or head.shape != embed.shape:
    return  # untied, no duplicate head, or check_tensors names the problem
  total, step = int(np.prod(head.shape)), 1 << 24
  for start in range(0, total, step):
    a, b = (np.fromfile(i.file, i.dtype, min(step, total - start), offset=i.offset + start * i.dtype.itemsize)
            for i in (head, embed))
    if a.shape != b.shape or not np.array_equal(a.astype(np.float32), b.astype(np.float32)):
      raise CheckpointError(f"{head.file}: tensor lm_head.weight differs from model.embed_tokens.weight, but "
                            "config.json says tie_word_embeddings=true (transformers loads it as a separate head); "
                            "set tie_word_embeddings=false if the head was trained apart, else drop lm_head.weight.")


def check_finite(path: str) -> None:
  """Every tensor the model loads is finite, read in 64 MiB pieces (one piece in memory at a time): a NaN / inf
  weight is a CheckpointError naming the file and the tensor before a run writes anything (load_params checks again
  as it loads; it runs after the run's directory is set up). Reads the whole checkpoint once per process while its
  files are unchanged (a sweep's points that share an init_from: once)."""
  mcfg = read_config(path)
  infos = tensor_index(path)
  key = (os.path.abspath(path), tuple(sorted((f, os.stat(f).st_size, os.stat(f).st_mtime_ns)
                                             for f in {i.file for i in infos.values()})))
  if key in _FINITE:
    return
  for name in expected_tensors(mcfg):
    info = infos.get(name)
    if info is None:
      continue  # check_tensors names it
    _require_finite(info, *st.read_chunks(info))
  _check_tied_head(mcfg, infos)
  _FINITE.add(key)


_FINITE: set[tuple] = set()  # checkpoints check_finite found finite: (directory, its files' sizes and mtimes)


def _require_finite(info: st.TensorInfo, *pieces: np.ndarray) -> None:
  """CheckpointError naming the tensor and its file if a piece of it holds NaN / inf. NaN / inf weights would train as
  non-finite steps whose stop advises a lower learning rate; a sum is one pass without a piece-sized temporary, and
  is non-finite exactly when a value is (float64: no overflow); the count only on the error path."""
  bad = sum(int(np.sum(~np.isfinite(a))) for a in pieces if not np.isfinite(np.sum(a, dtype=np.float64)))
  if bad:
    raise CheckpointError(f"{info.file}: tensor {info.name} holds {bad} NaN/inf value(s); the checkpoint is "
                          "damaged: re-download it or export it again.")


def load_params(path: str, mcfg: model_lib.ModelConfig, shardings: Any = None,
                infos: dict[str, st.TensorInfo] | None = None) -> Any:
  """Our float32 params from the checkpoint at `path`, leaf by leaf into `shardings` (a pytree of
  jax.sharding.Sharding like the params; None = the default device). `mcfg` must describe the checkpoint."""
  infos = tensor_index(path) if infos is None else infos
  check_tensors(path, mcfg, infos)
  _check_o_bias(infos)
  _check_tied_head(mcfg, infos)
  abstract = model_lib.param_shapes(mcfg)
  flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  shard_leaves = [None] * len(flat) if shardings is None else jax.tree.leaves(
      shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
  if len(shard_leaves) != len(flat):
    raise ValueError(f"shardings has {len(shard_leaves)} leaves, the params {len(flat)}; pass the params' tree.")
  out = []
  for (p, leaf), sharding in zip(flat, shard_leaves):
    name_of, stacked, transposed = _leaf_sources(path_key(p), mcfg)
    buf = _aligned_empty(leaf.shape)
    for i in range(mcfg.layers if stacked else 1):
      slot = buf[i] if stacked else buf
      _fill(slot, st.read(infos[name_of(i)]), transposed)
      _require_finite(infos[name_of(i)], slot)
    if sharding is None:
      arr = jax.device_put(buf)  # the CPU backend adopts an aligned host buffer as the device buffer: no copy
    else:
      arr = jax.make_array_from_callback(buf.shape, sharding, lambda idx, b=buf: b[idx])
    arr.block_until_ready()
    del buf  # nothing of ours refers to it: the device array's (or, after a copy, nobody's)
    out.append(arr)
  return jax.tree_util.tree_unflatten(treedef, out)


def load_hf(path: str, *, dtype: str = "float32", remat: str = "none",
            shardings: Any = None) -> tuple[model_lib.ModelConfig, Any]:
  """(ModelConfig, float32 params) from a local HF Qwen2/Llama directory."""
  mcfg = read_config(path, dtype=dtype, remat=remat)
  return mcfg, load_params(path, mcfg, shardings)
