"""The model shapes people start from, in ONE table used by configs (`configs/gsm8k.py:model=<name>`), by the TPU
compile check (`aot.py`) and by the memory planner (`memory_plan.py`); and the list of model fields a checkpoint
determines (`CHECKPOINT_FIELDS`, taken from it by `model_source.resolve` when a config leaves them unset).

Values are each release's config.json (Hugging Face hub, read 2026-11): Qwen2.5 has q/k/v biases, RoPE θ = 1e6
(Qwen2.5-Math: 1e4, 4096 positions), ties its embeddings up to 3B; Llama-3.1/3.2 have no biases, θ = 5e5, 'llama3'
RoPE scaling (factor 8 for 3.1, 32 for 3.2), rms_norm_eps 1e-5, tie embeddings at 1B/3B. An -Instruct release has
its base model's shape; Qwen2.5-1.5B/7B-Instruct declare 32768 positions where their bases declare 131072.
"""
from __future__ import annotations

from typing import Any

import ml_collections
from ml_collections import config_dict
from grpo_jax.config import config_lib

# Field -> type of every model field the checkpoint determines. max_len is a bound: a config may set it lower
# than the checkpoint's max_position_embeddings (it only caps prompt + completion length).
CHECKPOINT_FIELDS: dict[str, type] = {
    "vocab_size": int, "hidden": int, "layers": int, "heads": int, "kv_heads": int, "head_dim": int, "inter": int,
    "rope_theta": float, "qkv_bias": bool, "tie_embeddings": bool, "rms_eps": float, "max_len": int,
    "rope_scaling_factor": float, "rope_low_freq_factor": float, "rope_high_freq_factor": float,
    "rope_original_max_len": int}
NO_SCALING = dict(rope_scaling_factor=0.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                  rope_original_max_len=8192)


def _qwen(hidden, layers, heads, kv, inter, vocab=151_936, tie=True, theta=1e6, max_len=32_768):
  return dict(vocab_size=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv, head_dim=0, inter=inter,
              rope_theta=theta, qkv_bias=True, tie_embeddings=tie, rms_eps=1e-6, max_len=max_len, **NO_SCALING)


def _llama(hidden, layers, heads, inter, head_dim, tie, factor):
  return dict(vocab_size=128_256, hidden=hidden, layers=layers, heads=heads, kv_heads=8, head_dim=head_dim,
              inter=inter, rope_theta=500_000.0, qkv_bias=False, tie_embeddings=tie, rms_eps=1e-5, max_len=131_072,
              rope_scaling_factor=factor, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
              rope_original_max_len=8192)


PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": _qwen(896, 24, 14, 2, 4864),
    "qwen2.5-1.5b": _qwen(1536, 28, 12, 2, 8960, max_len=131_072),
    "qwen2.5-7b": _qwen(3584, 28, 28, 4, 18944, vocab=152_064, tie=False, max_len=131_072),
    "qwen2.5-math-1.5b": _qwen(1536, 28, 12, 2, 8960, theta=10_000.0, max_len=4096),
    "qwen2.5-math-7b": _qwen(3584, 28, 28, 4, 18944, vocab=152_064, tie=False, theta=10_000.0, max_len=4096),
    "llama-3.2-1b": _llama(2048, 16, 32, 8192, 64, tie=True, factor=32.0),
    "llama-3.2-3b": _llama(3072, 28, 24, 8192, 128, tie=True, factor=32.0),
    "llama-3.1-8b": _llama(4096, 32, 32, 14336, 128, tie=False, factor=8.0),
}
PRESETS["qwen2.5-0.5b-instruct"] = dict(PRESETS["qwen2.5-0.5b"])
PRESETS["qwen2.5-1.5b-instruct"] = dict(PRESETS["qwen2.5-1.5b"], max_len=32_768)
PRESETS["qwen2.5-7b-instruct"] = dict(PRESETS["qwen2.5-7b"], max_len=32_768)
PRESETS["llama-3.2-1b-instruct"] = dict(PRESETS["llama-3.2-1b"])
PRESETS["llama-3.2-3b-instruct"] = dict(PRESETS["llama-3.2-3b"])
# 'checkpoint': every field unset, taken from train.init_from=hf:<dir> (model_source.resolve).
CHECKPOINT = "checkpoint"


def names() -> list[str]:
  return sorted(PRESETS) + [CHECKPOINT]


def apply(model_cfg: ml_collections.ConfigDict, name: str) -> None:
  """Sets config.model's checkpoint fields to preset `name`, or unsets them all (name 'checkpoint': typed
  placeholders, so `--config.model.hidden=...` still parses as an int) to be taken from the checkpoint."""
  if name == CHECKPOINT:
    for k, t in CHECKPOINT_FIELDS.items():
      model_cfg[k] = config_dict.placeholder(t)
    return
  if name not in PRESETS:
    raise config_lib.ConfigError(f"model preset {name!r} is unknown; choose one of {names()}.")
  model_cfg.update(PRESETS[name])
