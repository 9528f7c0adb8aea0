"""Model fields taken from the checkpoint: `config.model` fields a config leaves unset (model_presets.apply with
'checkpoint': typed placeholders) are read from the config.json of `train.init_from=hf:<dir>`; fields it sets must
agree with it, and every disagreement is listed in one config error before anything is built.

`resolve(config)` returns the config with the fields filled in (the original is untouched): the CLI resolves once,
before validating and before writing DIR/config.json, so the run's record names the real model; the train loops
resolve again (a no-op on a resolved config) for callers that hand them a config directly.
"""
from __future__ import annotations

import math
import os

import ml_collections

from grpo_jax.config import config_lib
from grpo_jax.model import model_presets
from grpo_jax.hf import hf_io


def source(config) -> tuple[str, str] | None:
  """(config key, directory) of the Hugging Face checkpoint the model comes from, or None: `sft.init_from` for
  job=sft/pretrain; for RL `train.init_from`, or, when that is empty and an SFT stage runs first, its
  `sft.init_from`."""
  get = lambda section, name: (config.get(section) or {}).get(name, "") or ""
  if config.get("job") in ("sft", "pretrain"):
    keys = ("sft.init_from",)
  else:
    keys = ("train.init_from",) + (("sft.init_from",) if int(get("sft", "steps") or 0) > 0 else ())
  for key in keys:
    value = get(*key.split("."))
    if value:
      return (key, value[3:]) if value.startswith("hf:") else None
  return None


def unset_fields(config) -> list[str]:
  return [k for k in model_presets.CHECKPOINT_FIELDS if k in config.model and config.model[k] is None]


def _equal(a, b) -> bool:
  if isinstance(a, float) or isinstance(b, float):
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
  return a == b


def mismatches(model_cfg, hf_mcfg) -> list[str]:
  """'model.<field>=<set> (checkpoint: <value>)' for every set field that disagrees with the checkpoint's
  ModelConfig; max_len only when it exceeds the checkpoint's max_position_embeddings."""
  get = lambda k: model_cfg.get(k) if hasattr(model_cfg, "get") else getattr(model_cfg, k, None)
  scaled = bool(hf_mcfg.rope_scaling_factor > 0 or (get("rope_scaling_factor") or 0) > 0)
  out = []
  for k in model_presets.CHECKPOINT_FIELDS:
    v, want = get(k), getattr(hf_mcfg, k)
    if v is None or (k.startswith("rope_") and k != "rope_theta" and k != "rope_scaling_factor" and not scaled):
      continue
    if k == "head_dim" and v == 0:  # 0 = hidden // heads
      v = (get("hidden") or hf_mcfg.hidden) // (get("heads") or hf_mcfg.heads)
    if k == "max_len":
      if v > want:
        out.append(f"model.max_len={v} exceeds the checkpoint's max_position_embeddings={want}")
    elif not _equal(v, want):
      out.append(f"model.{k}={v!r} (checkpoint: {want!r})")
  return out


def check(key: str, path: str, model_cfg) -> "model_lib.ModelConfig":  # noqa: F821
  """The checkpoint's ModelConfig; raises one ConfigError listing every field `model_cfg` sets differently, or
  hf_io.CheckpointError for a directory that cannot be loaded (every tensor header is checked here, before any
  state is built)."""
  hf_mcfg = hf_io.check_checkpoint(path)
  bad = mismatches(model_cfg, hf_mcfg)
  if bad:
    raise config_lib.ConfigError(
        f"config.{key}=hf:{path}: config.model disagrees with its config.json in {len(bad)} field(s): "
        f"{'; '.join(bad)}. Leave the model fields unset to take them from the checkpoint (add model=checkpoint to "
        "the config's other args, e.g. configs/gsm8k.py:small,model=checkpoint), or pick the preset of this "
        "checkpoint (grpo_jax/model/model_presets.py).")
  return hf_mcfg


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with every unset checkpoint field of config.model filled from the hf: checkpoint (checked)."""
  unset = unset_fields(config)
  src = source(config)
  if src is None:
    if unset:
      raise config_lib.ConfigError(
          f"config.model.{unset[0]} (and {len(unset) - 1} more model fields) are unset, to be taken from a Hugging "
          "Face checkpoint, but train.init_from is not hf:<dir>; set train.init_from=hf:<dir> or a model preset "
          f"(configs/gsm8k.py:model=<name>, one of {model_presets.names()[:-1]}).")
    return config
  key, path = src
  if config.model.get("yield_to_checkpoint", False):
    return _take_checkpoint(config, path)
  hf_mcfg = check(key, path, config.model)
  if not unset:
    return config
  return config_lib.override(config, {f"model.{k}": getattr(hf_mcfg, k) for k in unset})


def _take_checkpoint(config, path: str):
  """model.yield_to_checkpoint: every checkpoint field from the checkpoint (max_len kept where it is lower: it only
  bounds prompt + completion), and its own tokenizer when it ships one and the config names none."""
  hf_mcfg = hf_io.check_checkpoint(path)
  values = {f"model.{k}": getattr(hf_mcfg, k) for k in model_presets.CHECKPOINT_FIELDS}
  if config.model.get("max_len") and config.model.max_len < hf_mcfg.max_len:
    values["model.max_len"] = config.model.max_len
  if not config.task.get("tokenizer", "") and os.path.isfile(os.path.join(path, "tokenizer.json")):
    values["task.tokenizer"] = "init_from"
  return config_lib.override(config, values)
