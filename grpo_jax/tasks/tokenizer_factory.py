"""Which tokenizer a run uses: the shipped sentencepiece one (tokenizer.py), another sentencepiece model, or a
Hugging Face tokenizer.json (hf_tokenizer.py), by what `task.tokenizer` names. Its own module: both kinds import
tokenizer.py's constants, and the choice imports both."""
from __future__ import annotations

from grpo_jax.tasks import hf_tokenizer
from grpo_jax.tasks import tokenizer


def is_hf(path: str | None) -> bool:
  return bool(path) and (path.startswith("hf:") or path.endswith(".json"))


def load(path: str | None = None):
  """The shipped tokenizer, 'tools' (the shipped one with the tool-call markers as pieces 512-515: tokenizer.py),
  a sentencepiece model file at `path`, or a HF tokenizer.json ('hf:<dir>' or a path ending in .json;
  hf_tokenizer.py, same interface)."""
  if path == tokenizer.TOOLS_SPEC:
    return tokenizer.load_tools()
  if is_hf(path):
    return hf_tokenizer.load(path[3:] if path.startswith("hf:") else path)
  return tokenizer.load(path)


def spec_for_config(config) -> str:
  """What `task.tokenizer` names ('' = the shipped one); 'init_from' = the HF dir the model comes from
  (model_source.source: `train.init_from=hf:<dir>`; `sft.init_from=hf:<dir>` for job=sft/pretrain, or for an SFT
  stage run first when train.init_from is empty)."""
  spec = config.task.get("tokenizer", "") or ""
  if spec == "init_from":
    from grpo_jax.hf import model_source  # pylint: disable=g-import-not-at-top  (hf/ only when asked for)
    src = model_source.source(config)
    if src is None:  # (it read train.init_from only: an SFT job's hf: checkpoint could not name its own tokenizer)
      key = "sft.init_from" if config.get("job") in ("sft", "pretrain") else "train.init_from"
      init = config[key.split(".")[0]].get("init_from", "") or ""
      raise ValueError(f"task.tokenizer='init_from' needs train.init_from=hf:<dir> (sft.init_from=hf:<dir> for "
                       f"job=sft/pretrain or an SFT stage run first), got {key}={init!r}; set task.tokenizer=hf:<dir> "
                       "or '' (the shipped tokenizer).")
    spec = "hf:" + src[1]
  return spec


def for_config(config):
  """The tokenizer a run uses: config.task.tokenizer if the config has it, else the shipped one."""
  return load(spec_for_config(config) or None)
