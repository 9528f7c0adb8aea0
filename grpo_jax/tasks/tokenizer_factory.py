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
  """What `task.tokenizer` names ('' = the shipped one); 'init_from' = the HF dir of `train.init_from=hf:<dir>`."""
  spec = config.task.get("tokenizer", "") or ""
  if spec == "init_from":
    init = config.train.get("init_from", "") or ""
    if not init.startswith("hf:"):
      raise ValueError(f"task.tokenizer='init_from' needs train.init_from=hf:<dir>, got {init!r}; set "
                       "task.tokenizer=hf:<dir> or '' (the shipped tokenizer).")
    spec = init
  return spec


def for_config(config):
  """The tokenizer a run uses: config.task.tokenizer if the config has it, else the shipped one."""
  return load(spec_for_config(config) or None)
