"""GSM8K read from a local TFDS data dir (no download here), fed to the same prompt pipeline; Python-verified.

The final answer is the text after '####' in the reference solution (commas removed). A completion is right iff its
format is OK (verify_py grammar) and its answer body has the same value (math_answer.equal: '$1,000.00', '1000
dollars', '\\boxed{1000}', '2000/2' all match 1000). `text_reward` drops the format requirement and reads the answer
from text alone (math_answer.extract_answer).

`make_math_reward(tok)` / `grade` pick the format check the tokenizer allows: on token ids when the four tags are
single tokens (the shipped tokenizer; verify_py grammar), else on the decoded text (a HF tokenizer such as
Qwen2.5's, where `<answer>` is several pieces): `<think>…</think> <answer>…</answer>` with each tag once, only
whitespace between `</think>` and `<answer>`, and EOS right after `</answer>`. The same `grade` scores training rewards and held-out evaluation.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

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
  import tensorflow_datasets as tfds
  import tensorflow_datasets.text.gsm8k  # noqa: F401  (the old-style builder registers only when imported)
  source = tfds.data_source("gsm8k", split=split, data_dir=data_dir, download=False)
  out = []
  for i in range(len(source)):
    r = source[i]
    sol = _text(r["answer"])
    out.append({"index": i, "question": _text(r["question"]), "solution": sol, "final": final_answer(sol)})
  return out


def load_examples(task, split: str, *, data_dir: str | None = None, **sizes) -> list[dict]:
  """registry.TASKS loader: the dataset's own splits (split_seed and sizes do not apply)."""
  del task, sizes
  return load_split(split, data_dir)


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


_TEXT_FORMAT = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.S)  # verify_py's grammar, on text


def text_answer_body(text: str) -> str | None:
  """The answer body if `text` is exactly `<think>…</think> <answer>…</answer>` (each tag once), else None."""
  m = _TEXT_FORMAT.fullmatch(text)
  if m is None or any(text.count(t) != 1 for t in tokenizer_lib.TAGS):
    return None
  return m.group(2)


def token_tags(tok) -> bool:
  """Whether the tokenizer has every format tag as a single token (token-id format checks apply)."""
  return all(t in tok.tag_ids for t in tokenizer_lib.TAGS)


def grade(ids: Sequence[int], final: str, tok) -> tuple[float, float, str | None]:
  """(accuracy, format, answer body) of one completion given as its ids up to and including EOS (no EOS =
  truncated: format fails). Accuracy needs the format; the body is what cons@k votes on."""
  ids = [int(i) for i in ids]
  if token_tags(tok):
    spans = verify_py.parse(ids, tok=tok)
    body = verify_py.span_text(ids, spans[1], tok) if spans else None
  elif tok.eos_id in ids:
    body = text_answer_body(tok.decode(ids[:ids.index(tok.eos_id)]))
  else:
    body = None
  if body is None:
    return 0.0, 0.0, None
  return accuracy(body, final), 1.0, body.strip()


def make_math_reward(tok) -> Callable:
  """The `math_accuracy` rewards.PyRewardFn for this tokenizer (format on token ids or on text, see `grade`)."""

  def math_accuracy(texts, token_ids, batch: dict) -> list[float]:
    del texts  # ids decide tags where tags are tokens; the text path decodes the same ids itself
    finals = [decode_answer(a) for a in batch["answer_chars_NxA"]]
    # The callback strips the trailing EOS; put it back (a row truncated right after </answer> counts as ended).
    return [grade(list(ids) + [tok.eos_id], f, tok)[0] for ids, f in zip(token_ids, finals)]
  return math_accuracy


def python_rewards(tok) -> dict[str, Callable]:
  """The Python reward terms a GSM8K config may name in config.rewards (registry.TASKS)."""
  return {"math_accuracy": make_math_reward(tok)}


def host_verifier(tok) -> Callable:
  """Held-out evaluation on the host: (tokens_NxL, mask_NxL, fields) -> (accuracy_N, format_N, answers_N)."""

  def verify(tokens_NxL, mask_NxL, fields: dict) -> tuple[np.ndarray, np.ndarray, list]:
    acc, fmt, answers = [], [], []
    for t, m, a in zip(np.asarray(tokens_NxL), np.asarray(mask_NxL), np.asarray(fields["answer_chars_NxA"])):
      r = grade(verify_py.completion(t, m), decode_answer(a), tok)
      acc.append(r[0])
      fmt.append(r[1])
      answers.append(_vote_key(r[2]))
    return np.asarray(acc, np.float32), np.asarray(fmt, np.float32), answers
  return verify


def _vote_key(body: str | None):
  """Answers that are equal values vote together ('1,000' and '1000.0'); unparsable ones by their text."""
  if body is None:
    return None
  v = math_answer.parse_value(body)
  return ("value", v[0], v[1]) if v is not None else ("text", body)
