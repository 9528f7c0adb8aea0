"""The realistic-lengths benchmark's prompts (`grpo_step.py --model-dir`), shared by all three sides.

Plain Python with its own `random.Random(seed)`, so grpo_jax, TRL and tunix build the same rows in the same order
from any interpreter; each side tokenizes the text with the checkpoint's tokenizer.json and feeds the rows unshuffled,
so step k of every side samples from prompts k·prompts … (k+1)·prompts − 1.
"""
import random


def rows(n: int, seed: int = 0) -> list[dict]:
  """n rows {"prompt": "what is A + B =", "answer": str(A + B)} with A, B uniform in [0, 1000)."""
  rng = random.Random(seed)
  out = []
  for _ in range(n):
    a, b = rng.randrange(1000), rng.randrange(1000)
    out.append({"prompt": f"what is {a} + {b} =", "answer": str(a + b)})
  return out


def hf_tokenizer(model_dir: str, prompts: list[str]):
  """The checkpoint's tokenizer for transformers-based peers, checked against tokenizer.json itself on `prompts`.

  PreTrainedTokenizerFast, not AutoTokenizer: transformers 5's AutoTokenizer picks Qwen2Tokenizer from config.json's
  model_type, whose own pre-tokenizer drops words of the prompt."""
  import os
  from tokenizers import Tokenizer
  from transformers import PreTrainedTokenizerFast
  tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
  raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
  got = tok(prompts, add_special_tokens=False).input_ids
  want = [e.ids for e in raw.encode_batch(prompts, add_special_tokens=False)]
  if got != want or tok.padding_side != "left" or tok.bos_token_id is not None:
    raise SystemExit(f"{model_dir}: transformers tokenizes the prompts differently from tokenizer.json "
                     f"({got[:1]} vs {want[:1]}, padding {tok.padding_side}, bos {tok.bos_token_id})")
  return tok


def checkpoint_config(model_dir: str, args) -> dict:
  """DIR/config.json, after checking that its shape is the one the harness's flags name (grpo_step.py passes the
  checkpoint's own shape, so a mismatch is a harness bug, not a user error)."""
  import json
  import os
  with open(os.path.join(model_dir, "config.json")) as f:
    hf = json.load(f)
  got = dict(hidden=hf["hidden_size"], layers=hf["num_hidden_layers"], heads=hf["num_attention_heads"],
             kv=hf["num_key_value_heads"], inter=hf["intermediate_size"], vocab=hf["vocab_size"])
  if any(getattr(args, k) != v for k, v in got.items()):
    raise SystemExit(f"{model_dir}: shape {got} differs from the flags {vars(args)}")
  return hf


# Every side prints fingerprint(its logits after CHECK_PROMPT) before training; grpo_step.py compares them, so a
# side that loaded different weights (or tokenized differently) shows up in the same invocation.
CHECK_PROMPT = "what is 12 + 345 ="


def fingerprint(logits) -> float:
  """A weighted mean of the next-token logits (weights -3..3 cycling over the ids): changes with any of them."""
  logits = [float(x) for x in logits]
  return sum(x * (i % 7 - 3) for i, x in enumerate(logits)) / len(logits)
