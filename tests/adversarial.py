"""Completions in named categories (right, wrong, malformed tags, spelled tags, overflow, random tokens, ...) used to
check that the JAX and Python verifiers agree. Reusable: `make(task, tok, per_category, seed, length)`.
"""
from __future__ import annotations

import numpy as np

from grpo_jax.tasks import base, cot, tokenizer as tokenizer_lib

CATEGORIES = ("right", "wrong", "missing_tag", "nested_tag", "unclosed_tag", "repeated_tag", "spelled_tag",
              "text_around", "space_between", "empty_answer", "overflow", "truncated", "control_token",
              "junk_answer", "random_expr", "random_steps", "random_tokens")


def _spell(tok, text: str) -> list[int]:
  """`text` as one piece per character, so that '<think>' comes out as plain pieces, not the tag token."""
  return [i for ch in text for i in tok.encode(ch)]


def _random_expr(task, ex, rng) -> str:
  """Random strings over the countdown/arith alphabet, mostly from the example's numbers."""
  nums = list(ex.get("numbers", (ex.get("answer", 0), ex.get("a", 1), ex.get("b", 2))))
  parts = []
  for _ in range(int(rng.integers(1, 12))):
    r = rng.random()
    if r < 0.4:
      parts.append(str(abs(int(nums[int(rng.integers(len(nums)))]))))
    elif r < 0.5:
      parts.append(str(int(rng.integers(0, 10**int(rng.integers(1, 12))))))
    elif r < 0.8:
      parts.append("+-*/"[int(rng.integers(4))])
    else:
      parts.append("()"[int(rng.integers(2))])
  return "".join(p + (" " if rng.random() < 0.5 else "") for p in parts)


def _tree_expr(ex, rng) -> str:
  """A random well-formed expression over (a subset of) the numbers: valid or not, right or not."""
  items = [str(x) for x in ex["numbers"]]
  rng.shuffle(items)
  items = items[: int(rng.integers(1, len(items) + 1))]
  while len(items) > 1:
    i, j = (int(x) for x in rng.permutation(len(items))[:2])
    op = "+-*/"[int(rng.integers(4))]
    s = f"({items[i]} {op} {items[j]})" if rng.random() < 0.7 else f"{items[i]} {op} {items[j]}"
    items = [x for k, x in enumerate(items) if k not in (i, j)] + [s]
  return items[0]


def _random_steps(rng) -> str:
  words = list(cot.WORDS_A + cot.WORDS_B)
  out = []
  for _ in range(int(rng.integers(1, 10))):
    r = rng.random()
    if r < 0.3:
      a, b = (int(rng.integers(0, 10**int(rng.integers(1, 4)))) for _ in range(2))
      op = "+-*/"[int(rng.integers(4))]
      c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op] + int(rng.choice([0, 0, 1]))
      out.append(f"{a} {op} {b} = {c}")
    elif r < 0.5:
      out.append(str(int(rng.integers(0, 10**int(rng.integers(1, 12))))))
    elif r < 0.7:
      out.append("+-*/=;"[int(rng.integers(6))])
    elif r < 0.85:
      out.append(";")
    else:
      out.append(words[int(rng.integers(len(words)))])
  return " ".join(out) + (" ;" if rng.random() < 0.7 else "")


def _completion(task, tok, cat: str, ex: dict, rng) -> list[int]:
  lang = "ab"[int(rng.integers(2))]
  think = cot.solution(ex, lang, mistake=bool(rng.random() < 0.3), tagged=False)
  ans = task.answer_text(ex)
  T, ET, A, EA = (tok.tag_ids[t] for t in tokenizer_lib.TAGS)
  enc = tok.encode
  eos = [tok.eos_id]

  def tagged(think_text, answer_text):
    return [T] + enc(" " + think_text + " ") + [ET] + enc(" ") + [A] + enc(answer_text) + [EA]

  good = tagged(think, f" {ans} ")
  if cat == "right":
    return good + eos
  if cat == "wrong":
    if "numbers" in ex:
      alt = _tree_expr(ex, rng)
      return tagged(think, f" {alt} ") + eos
    return tagged(think, f" {ex['answer'] + int(rng.choice([-10, -1, 1, 7]))} ") + eos
  if cat == "missing_tag":
    drop = [T, ET, A, EA][int(rng.integers(4))]
    return [i for i in good if i != drop] + eos
  if cat == "nested_tag":
    inner = [T, A][int(rng.integers(2))]
    ins = int(rng.integers(1, len(good) - 1))
    return good[:ins] + [inner] + good[ins:] + eos
  if cat == "unclosed_tag":
    drop = [ET, EA][int(rng.integers(2))]
    return [i for i in good if i != drop] + eos
  if cat == "repeated_tag":
    if rng.random() < 0.5:
      return good + [A] + enc(f" {ans} ") + [EA] + eos
    return [T] + enc(" x ") + [ET] + good + eos
  if cat == "spelled_tag":
    name = tokenizer_lib.TAGS[int(rng.integers(4))]
    tid = tok.tag_ids[name]
    out = []
    for i in good:
      out += _spell(tok, name) if i == tid else [i]
    return out + eos
  if cat == "text_around":
    where = int(rng.integers(3))
    if where == 0:
      return enc("so ") + good + eos
    if where == 1:
      k = good.index(A)
      return good[:k] + enc(" so ") + good[k:] + eos
    return good + enc(" ok") + eos
  if cat == "space_between":
    k = good.index(A)
    return good[:k] + enc(" " * int(rng.integers(0, 4))) + good[k:] + eos
  if cat == "empty_answer":
    return tagged(think, " " * int(rng.integers(0, 3))) + eos
  if cat == "overflow":
    if "numbers" in ex:
      big = "0" * int(rng.integers(5, 12)) + str(ex["numbers"][0])
      return tagged(think, f" {big} + {ans} ") + eos
    digits = str(abs(ex["answer"])).rjust(int(rng.integers(8, 13)), "0")
    sign = "-" if ex["answer"] < 0 else ""
    return tagged(think, f" {sign}{digits} ") + eos
  if cat == "truncated":
    return good[: int(rng.integers(1, len(good) + 1))]
  if cat == "control_token":
    ins = int(rng.integers(1, len(good)))
    return good[:ins] + [int(rng.choice([tok.pad_id, tok.bos_id, tok.unk_id]))] + good[ins:] + eos
  if cat == "junk_answer":
    junk = [f" {ans}.", f" = {ans}", f"- {ans}", f" {ans} {ans}", f"({ans})", f" {ans};", " --5", f" +{ans}"]
    return tagged(think, junk[int(rng.integers(len(junk)))]) + eos
  if cat == "random_expr":
    body = _tree_expr(ex, rng) if ("numbers" in ex and rng.random() < 0.5) else _random_expr(task, ex, rng)
    return tagged(think, body) + eos
  if cat == "random_steps":
    return tagged(_random_steps(rng), f" {ans} ") + eos
  if cat == "random_tokens":
    n = int(rng.integers(1, 200))
    ids = [int(x) for x in rng.integers(0, tok.vocab_size, size=n)]
    if rng.random() < 0.3:  # random bodies inside a well-formed frame
      cut = sorted(int(x) for x in rng.integers(0, n + 1, size=2))
      body = [i for i in ids if i not in (T, ET, A, EA, tok.eos_id)]
      return [T] + body[:cut[0]] + [ET, A] + body[cut[1]:] + [EA] + eos
    if rng.random() < 0.5:  # sprinkle tags so that some rows get past the first checks
      for t in (T, ET, A, EA):
        ids.insert(int(rng.integers(0, len(ids) + 1)), t)
    return ids
  raise ValueError(f"category={cat!r} is unknown; use one of {CATEGORIES}")


def make(task: base.Task, tok: tokenizer_lib.Tokenizer, per_category: int, seed: int, length: int):
  """(tokens_NxL int32, mask_NxL int32, batch fields, categories) with `per_category` rows per category.

  mask is 1 up to and including the first EOS (to the end of the row when there is none)."""
  rng = base.rng_for("adversarial", task.name, seed)
  examples = [dict(task.generate(rng), index=i) for i in range(per_category * len(CATEGORIES))]
  n = len(examples)
  tokens = np.zeros((n, length), np.int32)
  mask = np.zeros((n, length), np.int32)
  cats = []
  for r, ex in enumerate(examples):
    cat = CATEGORIES[r // per_category]
    ids = _completion(task, tok, cat, ex, rng)[:length]
    tokens[r, :len(ids)] = ids
    stop = ids.index(tok.eos_id) + 1 if tok.eos_id in ids else len(ids)
    mask[r, :stop] = 1
    cats.append(cat)
  return tokens, mask, task.batch_fields(examples), cats
