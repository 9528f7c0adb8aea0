"""GSM8K read from a local TFDS data dir (no download here), fed to the same prompt pipeline; Python-verified.

The final answer is the text after '####' in the reference solution (commas removed). A completion is right iff its
format is OK (verify_py grammar) and its answer body has the same value (math_answer.equal: '$1,000.00', '1000
dollars', '\\boxed{1000}', '2000/2' all match 1000). `text_reward` drops the format requirement and reads the answer
from text alone (math_answer.extract_answer), for tokenizers whose tags are not single tokens.
"""
from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from grpo_jax.tasks import math_answer, tokenizer as tokenizer_lib, verify_py

_QUESTION = {"a": "{q}", "b": "{q}"}  # questions are English text; the template around them carries the language


def final_answer(solution: str) -> str:
  if "####" not in solution:
    raise ValueError("GSM8K answer has no '####' final-answer marker; is task.data_dir a real gsm8k dir?")
  return solution.split("####")[-1].strip().replace(",", "")


class GSM8K:
  """Task-like adapter (question / answer_text / batch_fields) over records, for data.py."""

  name = "gsm8k"

  def question(self, ex: dict, language: str) -> str:
    return _QUESTION[language].format(q=ex["question"])

  def answer_text(self, ex: dict) -> str:
    return ex["final"]

  def batch_fields(self, examples: list[dict]) -> dict[str, np.ndarray]:
    # Numeric so the batch can go to devices and through jax.pure_callback: ASCII codes, 0-padded.
    return {"answer_chars_NxA": encode_answers([ex["final"] for ex in examples])}


ANSWER_CHARS = 24


def encode_answers(finals: list[str]) -> np.ndarray:
  out = np.zeros((len(finals), ANSWER_CHARS), np.int32)
  for i, f in enumerate(finals):
    if len(f) > ANSWER_CHARS or not f.isascii():
      raise ValueError(f"GSM8K final answer {f!r} does not fit {ANSWER_CHARS} ASCII chars; raise ANSWER_CHARS")
    out[i, :len(f)] = [ord(c) for c in f]
  return out


def decode_answer(chars_A) -> str:
  return "".join(chr(int(c)) for c in chars_A if c)


def _text(x) -> str:
  return x.decode() if isinstance(x, bytes) else str(x)


def load_split(split: str, data_dir: str | None = None) -> list[dict]:
  """Examples {index, question, solution, final} in record order."""
  import tensorflow_datasets.text.gsm8k  # noqa: F401  (registers the builder; NOTES.md)
  source = tfds.data_source("gsm8k", split=split, data_dir=data_dir, download=False)
  out = []
  for i in range(len(source)):
    r = source[i]
    sol = _text(r["answer"])
    out.append({"index": i, "question": _text(r["question"]), "solution": sol, "final": final_answer(sol)})
  return out


def accuracy(answer_body: str, final: str) -> float:
  """1.0 iff the answer body (number, fraction, simple expression, with units/'$'/',' allowed) equals `final`."""
  return float(math_answer.equal(answer_body, final))


def accuracy_reward(tokens_NxL, mask_NxL, batch: dict, tok: tokenizer_lib.Tokenizer | None = None) -> np.ndarray:
  """Format OK (verify_py grammar) and the answer body equals the final answer; 1.0 / 0.0 per row."""
  out = np.zeros(len(tokens_NxL), np.float32)
  for n, (t, m) in enumerate(zip(tokens_NxL, mask_NxL)):
    spans = verify_py.parse(t, m, tok)
    if spans is not None:
      body = verify_py.span_text(verify_py.completion(t, m), spans[1], tok)
      out[n] = accuracy(body, decode_answer(batch["answer_chars_NxA"][n]))
  return out


def math_reward(texts, token_ids, batch: dict) -> list[float]:
  """rewards.PyRewardFn: `token_ids` are the completions without their trailing EOS (the callback wrapper strips
  it), so EOS is put back before the format check; a row truncated right after </answer> counts as ended."""
  tok = tokenizer_lib.load()
  del texts  # token ids decide tags (a spelled '<answer>' in text is not a tag)
  out = []
  for n, ids in enumerate(token_ids):
    row = list(ids) + [tok.eos_id]
    spans = verify_py.parse(row, tok=tok)
    body = verify_py.span_text(row, spans[1], tok) if spans else None
    out.append(accuracy(body, decode_answer(batch["answer_chars_NxA"][n])) if spans else 0.0)
  return out


def text_reward(texts, token_ids, batch: dict) -> list[float]:
  """rewards.PyRewardFn on decoded text only: `<answer>` body, else last \\boxed{}, else last number; no format
  requirement (e.g. a HF model prompted for \\boxed{} whose tokenizer has no tag tokens)."""
  del token_ids
  return [float(math_answer.is_correct(t, decode_answer(batch["answer_chars_NxA"][n]))) for n, t in enumerate(texts)]
