"""A LoRA run's adapters as a PEFT adapter directory (`peft.PeftModel.from_pretrained(base, DIR)` loads it), and the
pieces `export` needs for a LoRA run: the base it trained on (checked against the checkpoint's identity) and the
adapters of a checkpoint.

adapter_model.safetensors holds, per layer i and targeted module (PEFT's Qwen2/Llama names),
`base_model.model.model.layers.{i}.<self_attn|mlp>.<m>_proj.lora_A.weight` [r, in] and `lora_B.weight` [out, r]:
our A [in..., r] and B [r, out...] flattened (q/k/v's [heads, head_dim] outputs and o's inputs in HF's h·Dh + d
order) and transposed to torch's Linear layout.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.hf import hf_io
from grpo_jax.hf import hf_save
from grpo_jax.hf import safetensors_io as st
from grpo_jax.hf.hf_io import LINEAR
from grpo_jax.infra import integrity
from grpo_jax.infra import params_ckpt
from grpo_jax.model import lora as lora_lib
from grpo_jax.model import model as model_lib
from grpo_jax.rl import state as state_lib


def peft_key(layer: int, module: str, which: str) -> str:
  """PEFT's saved name of one adapter matrix ('A' or 'B') of our module `module` in layer `layer`."""
  return f"base_model.model.model.layers.{layer}.{LINEAR[module]}.lora_{which}.weight"


def peft_tensors(adapters: Any) -> dict[str, np.ndarray]:
  """PEFT's tensors of our adapters tree (stacked over layers), on the host, float32."""
  out = {}
  for m, ab in adapters["layers"].items():
    a_LxIxR, b_LxRxO = (np.asarray(jax.device_get(ab[k]), np.float32) for k in ("lora_a", "lora_b"))
    for i in range(a_LxIxR.shape[0]):
      r = a_LxIxR.shape[-1]
      out[peft_key(i, m, "A")] = a_LxIxR[i].reshape(-1, r).T   # [r, in]
      out[peft_key(i, m, "B")] = b_LxRxO[i].reshape(r, -1).T   # [out, r]
  return out


def adapter_config(mcfg: model_lib.ModelConfig, base_model: str = "") -> dict:
  lc = mcfg.lora
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model or None,
          "r": lc.rank, "lora_alpha": lc.alpha, "use_rslora": lc.rslora, "lora_dropout": 0.0, "bias": "none",
          "target_modules": sorted(lc.targets), "fan_in_fan_out": False, "inference_mode": True,
          "init_lora_weights": True, "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {},
          "alpha_pattern": {}, "use_dora": False}


def save_peft(out_dir: str, mcfg: model_lib.ModelConfig, adapters: Any, base_model: str = "") -> list[str]:
  """Writes adapter_config.json + adapter_model.safetensors (float32); returns the file names."""
  tensors = peft_tensors(adapters)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
    json.dump(adapter_config(mcfg, base_model), f, indent=2)
  names = sorted(tensors)
  st.write(os.path.join(out_dir, "adapter_model.safetensors"), [(n, tensors[n].shape, np.float32) for n in names],
           tensors.__getitem__, hf_save.EXPORT_METADATA)
  return ["adapter_config.json", "adapter_model.safetensors"]


def base_source(config, meta: dict | None) -> str:
  """Where the run's base came from: the checkpoint's recorded identity, else the config's train.init_from."""
  return ((meta or {}).get("base") or {}).get("source") or state_lib.base_source(config.train.init_from,
                                                                                 config_lib.run_seed(config))


def load_base(source: str, mcfg: model_lib.ModelConfig, sharding) -> Any:
  """The base params a LoRA run trained on, as its state held them (lora.hold_base), on `sharding`."""
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                          model_lib.param_shapes(mcfg))
  if source.startswith(state_lib.SEED_SOURCE):
    params = jax.device_put(model_lib.init_params(mcfg, state_lib.seed_keys(int(source[len(state_lib.SEED_SOURCE):]))[0]),
                            sharding)
  elif source.startswith("hf:"):
    params = hf_io.load_params(source[3:], mcfg, jax.tree.map(lambda a: a.sharding, abstract))
  elif os.path.isdir(source):
    params = params_ckpt.load_params(source, abstract)
  else:
    raise config_lib.ConfigError(f"the LoRA run's base {source!r} is gone; restore it (the run's train.init_from) to "
                                 "export its adapters merged or verify them.")
  return lora_lib.hold_base(mcfg, params)


def check_base(base: Any, meta: dict | None, where: str) -> None:
  """A one-line ConfigError when the checkpoint recorded another base checksum than `base` has."""
  want = ((meta or {}).get("base") or {}).get("checksum")
  got = integrity.digest(integrity.summarize(base))
  if want is not None and want != got:
    raise config_lib.ConfigError(f"{where}: the adapters were trained on a base with checksum {want}, but its source "
                                 f"now has checksum {got}; restore the original base to export.")
