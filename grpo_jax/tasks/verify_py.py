"""Reference verifiers in plain Python (never imports JAX); `verify_jax` must agree with them exactly.

Completion: the tokens while mask == 1 (a prefix mask; everything after its first 0 is ignored). FORMAT grammar, on
token ids (a tag is its tag token; `<think>` spelled from other pieces is just text):

    <think> body1 </think> space* <answer> body3 </answer> EOS

- the completion starts with the <think> token and its first EOS (any of the tokenizer's `eos_ids`) comes right
  after </answer> (nothing but EOS after </answer>; a completion without EOS, i.e. truncated, fails);
- each tag occurs exactly once before EOS, in that order, so bodies hold no tag tokens; bodies may be empty;
- between </think> and <answer> only whitespace-only pieces are allowed;
- no control or unknown token (pad, bos, unk, or an id outside the vocabulary) before EOS.
Format reward is 1.0 or 0.0. ACCURACY requires format OK and then checks the answer body text (the concatenated
piece texts of body3) with the task's rule (arith.py, countdown.py docstrings). STEP scores follow cot.py's rule on
the think body (format OK required; otherwise no valid steps).
"""
from __future__ import annotations

import re
import weakref
from typing import Sequence

import numpy as np

from grpo_jax.tasks import cot, tokenizer as tokenizer_lib
from grpo_jax.tasks.arith import INTEGER_ANSWER
from grpo_jax.tasks.countdown import MAX_ABS, MAX_PAREN_DEPTH

_MAX_DIGITS = 9


class _Vocab:
  """Piece texts and special ids, from the tokenizer."""

  def __init__(self, tok: tokenizer_lib.Tokenizer):
    self.texts = tok.piece_texts()
    self.size = tok.vocab_size
    self.tags = [tok.tag_ids[t] for t in tokenizer_lib.TAGS]
    self.eos = set(eos_ids(tok))
    self.bad = {tok.pad_id, tok.bos_id, tok.unk_id}

  def is_space(self, i: int) -> bool:
    t = self.texts[i]
    return bool(t) and set(t) == {" "}


def eos_ids(tok) -> tuple[int, ...]:
  """Every id that ends a completion: the sampler stops at any of them (an HF instruct tokenizer has several)."""
  return tuple(int(i) for i in getattr(tok, "eos_ids", (tok.eos_id,)))


# Per tokenizer object, weakly: an id(tok) key was reused by a tokenizer made after the first was collected, which
# then decoded with the other vocabulary's piece texts (as tasks/data.py's length caches).
_VOCABS: weakref.WeakKeyDictionary[tokenizer_lib.Tokenizer, _Vocab] = weakref.WeakKeyDictionary()


def _vocab(tok: tokenizer_lib.Tokenizer | None) -> _Vocab:
  tok = tok or tokenizer_lib.load()
  if tok not in _VOCABS:
    _VOCABS[tok] = _Vocab(tok)
  return _VOCABS[tok]


def completion(ids: Sequence[int], mask: Sequence[int] | None = None) -> list[int]:
  ids = [int(i) for i in ids]
  if mask is None:
    return ids
  out = []
  for i, m in zip(ids, mask):
    if not m:
      break
    out.append(i)
  return out


def parse(ids: Sequence[int], mask=None, tok=None) -> tuple[tuple[int, int], tuple[int, int]] | None:
  """((think body start, end), (answer body start, end)) token spans if the format is OK, else None."""
  v = _vocab(tok)
  seq = completion(ids, mask)
  e = next((k for k, i in enumerate(seq) if i in v.eos), None)
  if e is None:
    return None
  seq = seq[:e]
  if any(i in v.bad or not 0 <= i < v.size for i in seq):
    return None
  where = [k for k, i in enumerate(seq) if i in v.tags]
  if [seq[k] for k in where] != v.tags:
    return None
  p_think, p_ethink, p_ans, p_eans = where
  if p_think != 0 or p_eans != e - 1:
    return None
  if not all(v.is_space(seq[k]) for k in range(p_ethink + 1, p_ans)):
    return None
  return (p_think + 1, p_ethink), (p_ans + 1, p_eans)


def format_ok(text_or_ids, mask=None, tok=None) -> bool:
  """Format check of token ids, or of text (encoded with the tokenizer, EOS appended)."""
  if isinstance(text_or_ids, str):
    t = tok or tokenizer_lib.load()
    text_or_ids = t.encode(text_or_ids) + [t.eos_id]
  return parse(text_or_ids, mask, tok) is not None


def span_text(ids: Sequence[int], span: tuple[int, int], tok=None) -> str:
  v = _vocab(tok)
  return "".join(v.texts[int(i)] for i in ids[span[0]:span[1]])


# --- answer rules ------------------------------------------------------------------------------------------------
def accuracy_arith(answer: str, target: int) -> float:
  m = re.fullmatch(r" *(-?)([0-9]+) *", answer)
  if m is None or len(m.group(2)) > _MAX_DIGITS:
    return 0.0
  return float(int(m.group(2)) * (-1 if m.group(1) else 1) == int(target))


class _Invalid(Exception):
  pass


def evaluate_countdown(expr: str, numbers: Sequence[int]) -> int | None:
  """Value of a valid countdown expression (countdown.py docstring), None if invalid."""
  toks = []
  pos = 0
  for m in re.finditer(r"([0-9]+)|([-+*/()])|( +)|(.)", expr, re.S):
    if m.group(4) is not None:
      return None
    if m.group(3) is None:
      toks.append(m.group(1) or m.group(2))
    pos = m.end()
  pool = list(int(x) for x in numbers)
  i = 0

  def peek():
    return toks[i] if i < len(toks) else None

  def take():
    nonlocal i
    i += 1
    return toks[i - 1]

  def apply(a, op, b):
    if op == "/":
      if b == 0 or a % b:
        raise _Invalid
      r = a // b
    else:
      r = {"+": a + b, "-": a - b, "*": a * b}[op]
    if abs(r) >= MAX_ABS:
      raise _Invalid
    return r

  def factor(depth):
    t = peek()
    if t is None:
      raise _Invalid
    if t == "(":
      take()
      if depth + 1 > MAX_PAREN_DEPTH:
        raise _Invalid
      v = expr_(depth + 1)
      if peek() != ")":
        raise _Invalid
      take()
      return v
    if not t.isdigit() or len(t) > _MAX_DIGITS:
      raise _Invalid
    take()
    if int(t) not in pool:
      raise _Invalid
    pool.remove(int(t))
    return int(t)

  def term(depth):
    v = factor(depth)
    while peek() in ("*", "/"):
      v = apply(v, take(), factor(depth))
    return v

  def expr_(depth):
    v = term(depth)
    while peek() in ("+", "-"):
      v = apply(v, take(), term(depth))
    return v

  try:
    v = expr_(0)
  except _Invalid:
    return None
  return v if i == len(toks) else None


def accuracy_countdown(answer: str, numbers: Sequence[int], target: int) -> float:
  v = evaluate_countdown(answer, numbers)
  return float(v is not None and v == int(target))


# --- batched twins of the JAX API ----------------------------------------------------------------------------------
def format_reward(tokens_NxL, mask_NxL, tok=None) -> np.ndarray:
  return np.asarray([float(parse(t, m, tok) is not None) for t, m in zip(tokens_NxL, mask_NxL)], np.float32)


def _answers(tokens_NxL, mask_NxL, tok=None):
  """(row, answer text) of every row whose completion has the think/answer format; malformed rows are skipped."""
  for r, (t, m) in enumerate(zip(tokens_NxL, mask_NxL)):
    spans = parse(t, m, tok)
    if spans is not None:
      yield r, span_text(completion(t, m), spans[1], tok)


def answer_value(task, tokens_NxL, mask_NxL, batch: dict, tok=None) -> tuple[np.ndarray, np.ndarray]:
  """(valid_N, value_N) twin of verify_jax.answer_value: format OK and the answer parses / evaluates."""
  task = getattr(task, "name", task)
  n = len(tokens_NxL)
  ok, val = np.zeros(n, bool), np.zeros(n, np.int64)
  for r, ans in _answers(tokens_NxL, mask_NxL, tok):
    if task in INTEGER_ANSWER:
      mt = re.fullmatch(r" *(-?)([0-9]+) *", ans)
      v = None if mt is None or len(mt.group(2)) > _MAX_DIGITS else int(mt.group(2)) * (-1 if mt.group(1) else 1)
    elif task == "countdown":
      v = evaluate_countdown(ans, [x for x, k in zip(batch["numbers_NxM"][r], batch["numbers_mask_NxM"][r]) if k])
    else:
      raise ValueError(f"task={task!r} has no token-level verifier; use one of {INTEGER_ANSWER + ('countdown',)}")
    ok[r], val[r] = v is not None, v or 0
  return ok, val


def accuracy_reward(task: str, tokens_NxL, mask_NxL, batch: dict, tok=None) -> np.ndarray:
  task = getattr(task, "name", task)
  out = np.zeros(len(tokens_NxL), np.float32)
  for n, ans in _answers(tokens_NxL, mask_NxL, tok):
    if task in INTEGER_ANSWER:
      out[n] = accuracy_arith(ans, batch["answer_N"][n])
    elif task == "countdown":
      nums = [x for x, k in zip(batch["numbers_NxM"][n], batch["numbers_mask_NxM"][n]) if k]
      out[n] = accuracy_countdown(ans, nums, batch["target_N"][n])
    else:
      raise ValueError(f"task={task!r} has no token-level verifier; use one of {INTEGER_ANSWER + ('countdown',)}")
  return out


def step_rewards(task, tokens_NxL, mask_NxL, batch, max_steps: int, tok=None):
  """(scores_NxS, end_pos_NxS, valid_NxS): cot.py's step rule on the think body; end_pos = token holding ';'."""
  del task, batch  # the step rule is task-independent (every step is an `A op B = C` equation)
  v = _vocab(tok)
  n = len(tokens_NxL)
  scores = np.zeros((n, max_steps), np.float32)
  ends = np.zeros((n, max_steps), np.int32)
  valid = np.zeros((n, max_steps), bool)
  for r, (t, m) in enumerate(zip(tokens_NxL, mask_NxL)):
    spans = parse(t, m, tok)
    if spans is None:
      continue
    start, stop = spans[0]
    text, owner = "", []
    for k in range(start, stop):
      piece = v.texts[int(t[k])]
      text += piece
      owner += [k] * len(piece)
    step_texts = cot.split_steps(text)
    offset = 0
    for s, st in enumerate(step_texts):
      semi = offset + len(st)
      offset = semi + 1
      if s >= max_steps:
        break
      scores[r, s] = cot.score_step(st)
      ends[r, s] = owner[semi]
      valid[r, s] = True
  return scores, ends, valid
