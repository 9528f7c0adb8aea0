"""Reference chains of thought made of rule-checkable steps, in two disjoint "languages".

A STEP is the text before each ';'. It scores 1 iff it ends with an equation `A op B = C` (A, B: digit runs, A not
preceded by a digit; op in + - * /; C: optional '-' then digits; only spaces between the parts and before ';') that
is arithmetically right ('/' exact), with every number at most 9 digits. Words before the equation are free; this
is the rule `verify_jax.step_rewards` evaluates in-graph and `score_step` evaluates here.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from grpo_jax.tasks import base

# Word lists of the two languages; index i of WORDS_B translates index i of WORDS_A. Disjoint by construction.
WORDS_A = ("add", "carry", "take", "borrow", "less", "swap", "times", "sum", "so", "combine", "wait", "recheck",
           "the", "answer", "is")
WORDS_B = ("plim", "vek", "drom", "snib", "mup", "trel", "gox", "fand", "zu", "kresh", "hup", "revok", "ta",
           "ansor", "ez")
WORDS = {"a": WORDS_A, "b": WORDS_B}
_TRANSLATE = dict(zip(WORDS_A, WORDS_B))
RECHECK = {"a": "wait , recheck", "b": "hup , revok"}
MAX_DIGITS = 9

STEP_RE = re.compile(r"(?:.*[^0-9])?([0-9]+) *([-+*/]) *([0-9]+) *= *(?:(-) *)?([0-9]+) *", re.S)
STEP_WORD_RE = re.compile(r"[a-z]+")  # a step's words (its last one names its kind: add, carry, combine, ...)
_RECHECK_RE = re.compile("|".join(re.escape(p) for p in RECHECK.values()))
_TAG_RE = re.compile(r"</?(?:think|answer)>")


@dataclasses.dataclass(frozen=True)
class Step:
  word: str  # language-a word; translated when rendered
  a: int
  op: str
  b: int
  c: int
  note: str = ""  # written before the word (sum_steps: the operands still to add), part of the step's free words


def _w(word: str, language: str) -> str:
  return word if language == "a" else _TRANSLATE[word]


def arith_steps(a: int, op: str, b: int) -> list[Step]:
  """Column steps for + and -, partial products for *, then the full equation."""
  steps: list[Step] = []
  if op == "+":
    carry, i = 0, 0
    while i < max(len(str(a)), len(str(b))):
      da, db = a // 10**i % 10, b // 10**i % 10
      s = da + db
      steps.append(Step("add", da, "+", db, s))
      if carry:
        steps.append(Step("carry", s, "+", 1, s + 1))
        s += 1
      carry, i = s // 10, i + 1
    result = a + b
  elif op == "-":
    x, y = max(a, b), min(a, b)
    borrow = 0
    for i in range(len(str(x))):
      dx, dy = x // 10**i % 10, y // 10**i % 10
      cur = dx
      if borrow:
        steps.append(Step("less", dx, "-", 1, dx - 1))
        cur = dx - 1
      if cur >= dy:
        steps.append(Step("take", cur, "-", dy, cur - dy))
        borrow = 0
      else:
        steps.append(Step("borrow", cur + 10, "-", dy, cur + 10 - dy))
        borrow = 1
    if a < b:  # the columns computed max - min; state it, the final step then flips the sign
      steps.append(Step("swap", x, "-", y, x - y))
    result = a - b
  elif op == "*":
    acc = None
    for i, ch in enumerate(reversed(str(b))):
      m = int(ch) * 10**i
      steps.append(Step("times", a, "*", m, a * m))
      if acc is not None:
        steps.append(Step("sum", acc, "+", a * m, acc + a * m))
        acc += a * m
      else:
        acc = a * m
    result = a * b
  else:
    raise ValueError(f"op={op!r} must be one of '+-*'")
  steps.append(Step("so", a, op, b, result))
  return steps


def column_steps(a: int, b: int) -> list[Step]:
  """`a + b` (a, b >= 0) in columns, ones first (arith_steps' `add` / `carry` steps without its closing equation),
  then the column results put together, most significant first, one `combine` step a column
  (`combine value * 10 + digit`), so the last step's result is the whole sum. Every step is a one-digit addition or
  a concatenation (37 + 48: add 7 + 8 = 15 ; add 3 + 4 = 7 ; carry 7 + 1 = 8 ; combine 80 + 5 = 85); a re-check
  ends on a copy of that result, not on a composition of digits scattered over the columns."""
  steps = arith_steps(a, "+", b)[:-1]
  finals, carry = [], 0  # each column's result, carry included
  for i in range(max(len(str(a)), len(str(b)))):
    finals.append(a // 10**i % 10 + b // 10**i % 10 + carry)
    carry = finals[-1] // 10
  value = finals[-1]
  for f in reversed(finals[:-1]):
    steps.append(Step("combine", value * 10, "+", f % 10, value * 10 + f % 10))
    value = value * 10 + f % 10
  return steps


def countdown_steps(ex: dict) -> list[Step]:
  return [Step("combine", a, op, b, c) for a, op, b, c in ex["steps"]]


def sum_steps(terms) -> list[Step]:
  """A running total, one operand a step: each step is one two-operand addition (tasks/sums.py), written after the
  operands still to add (`5 3 1 : add 14 + 6 = 20`). The list makes each step's operand a local copy (the first
  number of the previous step's list) instead of a look-up of the k-th operand in the question, which a 2-layer
  base got wrong 91% of the time at the last step (docs/r1.md, "The aha task")."""
  steps, acc = [], int(terms[0])
  for k, t in enumerate(terms[1:], start=2):
    rest = "".join(f"{int(x)} " for x in terms[k:])
    steps.append(Step("add", acc, "+", int(t), acc + int(t), f"{rest}: " if rest else ""))
    acc += int(t)
  return steps


def steps_of(ex: dict) -> list[Step]:
  """The steps of `ex`'s worked solution, in order (countdown's, sums' running total, or arith's columns)."""
  if "steps" in ex:
    return countdown_steps(ex)
  if "terms" in ex:
    return sum_steps(ex["terms"])
  return arith_steps(ex["a"], ex["op"], ex["b"])


def _answer(ex: dict) -> str:
  return ex["solution"] if "solution" in ex else str(ex["answer"])


def _render(step: Step, language: str, c: int | None = None, prefix: str = "", call: str = "") -> str:
  """`call`: text written after the step's note and before its word (a calculator call and its observation)."""
  c = step.c if c is None else c
  return f"{prefix}{step.note}{call + ' ' if call else ''}{_w(step.word, language)} {step.a} {step.op} {step.b} = {c} ;"


RECHECK_STYLES = ("repeat", "columns")
MARKS = ("", "mistake", "verify")


def _recheck(step: Step, language: str, style: str) -> str:
  """The re-check of `step`: the phrase, then (style "columns") the step recomputed in columns and put together
  (`column_steps`), then the step written again with its right result. "repeat" writes the step again only, so the
  re-check copies what it checks; "columns" recomputes it from the digits (one-digit additions and concatenations,
  easier for a small model than a two-digit addition in one pass), so its result can catch the model's own errors
  (docs/r1.md, "The aha task")."""
  if style not in RECHECK_STYLES:
    raise ValueError(f"recheck style {style!r} is unknown; use one of {RECHECK_STYLES}")
  parts = []
  if style == "columns":
    if step.op != "+":
      raise ValueError(f"a '{step.op}' step has no column recomputation; use recheck style 'repeat' for this task")
    parts = [_render(s, language) for s in column_steps(step.a, step.b)]
  parts.append(_render(step, language))
  parts[0] = f"{RECHECK[language]} {parts[0]}"
  return " ".join(parts)


def solution(ex: dict, language: str, mistake: bool = False, tagged: bool = True, verify: bool = False,
             recheck: str = "repeat", marks: Sequence[str] | None = None, calls: Sequence[str] | None = None) -> str:
  """Worked solution. `mistake` writes one step wrong, then the re-check and the corrected step; `verify` re-checks
  one right step and finds nothing to fix (the step drawn from `ex`, one each). `marks` instead marks every step:
  "" (as is), "mistake" or "verify" (one per step; then `mistake`/`verify` must be False). `recheck` is the
  re-check's style (`_recheck`). `calls`: per step, text written before its word ("" = none): a tool call and its
  observation (r1/corpus.py), in steps written as they are (no mistake or re-check on them)."""
  if language not in base.LANGUAGES:
    raise ValueError(f"language={language!r} is unknown; use one of {base.LANGUAGES}")
  steps = steps_of(ex)
  calls = [""] * len(steps) if calls is None else list(calls)
  if len(calls) != len(steps):
    raise ValueError(f"calls has {len(calls)} entries for the {len(steps)} steps")
  if marks is None:
    marks = [""] * len(steps)
    if mistake:
      rng = base.rng_for("mistake", sorted((k, str(v)) for k, v in ex.items()))
      k = int(rng.integers(len(steps)))
      marks[k] = "mistake"
      delta = int(rng.choice([-2, -1, 1, 2, 10]))
    if verify:
      # Its own draw, so a document with both re-checks a step other than the mistaken one as often as not.
      k = int(base.rng_for("verify", sorted((key, str(v)) for key, v in ex.items())).integers(len(steps)))
      marks[k] = "both" if marks[k] == "mistake" else "verify"
  else:
    if mistake or verify or len(marks) != len(steps) or any(m not in MARKS for m in marks):
      raise ValueError(f"marks={tuple(marks)!r} must give one of {MARKS} for each of the {len(steps)} steps, "
                       "with mistake=verify=False")
    rng = base.rng_for("mistake", sorted((k, str(v)) for k, v in ex.items()))
    delta = int(rng.choice([-2, -1, 1, 2, 10]))
  parts = []
  for step, mark, call in zip(steps, marks, calls):
    if call and mark:
      raise ValueError(f"step {step} has both a call and a {mark!r} mark; a step written with a tool call is written "
                       "right once")
    if mark in ("mistake", "both"):
      part = " ".join([_render(step, language, c=step.c + delta), _recheck(step, language, recheck)])
    else:
      part = _render(step, language, call=call)
    if mark in ("verify", "both"):
      part = " ".join([part, _recheck(step, language, recheck)])
    parts.append(part)
  return _finish(ex, language, " ".join(parts), tagged)


def brief(ex: dict, language: str, tagged: bool = True) -> str:
  """The direct answer: no steps (an empty think body when tagged)."""
  if language not in base.LANGUAGES:
    raise ValueError(f"language={language!r} is unknown; use one of {base.LANGUAGES}")
  return _finish(ex, language, "", tagged)


def _finish(ex: dict, language: str, body: str, tagged: bool) -> str:
  ending = {"a": "so the answer is", "b": "zu ta ansor ez"}[language]
  if tagged:
    return f"<think> {body + ' ' if body else ''}</think> <answer> {_answer(ex)} </answer>"
  return f"{body + ' ' if body else ''}{ending} {_answer(ex)}"


def score_step(step_text: str) -> int:
  """1 iff the step ends with a right `A op B = C` equation (module docstring), else 0."""
  m = STEP_RE.fullmatch(step_text)
  if m is None:
    return 0
  a_s, op, b_s, neg, c_s = m.groups()
  if max(len(a_s), len(b_s), len(c_s)) > MAX_DIGITS:
    return 0
  a, b, c = int(a_s), int(b_s), int(c_s) * (-1 if neg else 1)
  if op == "/":
    return int(b != 0 and a % b == 0 and a // b == c)
  return int({"+": a + b, "-": a - b, "*": a * b}[op] == c)


def split_steps(text: str) -> list[str]:
  """Texts before each ';' (the trailing text after the last ';' is not a step)."""
  return text.split(";")[:-1]


def think_body(text: str) -> str:
  """Between the first `<think>` and the first `</think>` after it (the whole text without such a pair), by str.find:
  the lazy regex rescanned the rest of the text from every unclosed `<think>` (quadratic: a completion of 1,400
  `<think>` tags took 0.5 s per reward term)."""
  i = text.find("<think>")
  j = -1 if i < 0 else text.find("</think>", i + len("<think>"))
  return text if j < 0 else text[i + len("<think>"):j]


def language_consistency(text: str, language: str) -> float:
  """Fraction of the CoT words (words from either list, in the think body) that are in `language`; 0 if none."""
  if language not in base.LANGUAGES:
    raise ValueError(f"language={language!r} is unknown; use one of {base.LANGUAGES}")
  words = re.findall(r"[a-z]+", _TAG_RE.sub(" ", think_body(text)))
  mine, other = set(WORDS[language]), set(WORDS["b" if language == "a" else "a"])
  hits = sum(w in mine for w in words)
  total = hits + sum(w in other for w in words)
  return hits / total if total else 0.0


def _languages(batch: dict, n: int) -> list[str]:
  if "language_N" not in batch:
    raise ValueError("batch has no 'language_N'; language consistency needs each prompt's language (0='a', 1='b')")
  langs = np.asarray(batch["language_N"]).reshape(-1)
  if langs.shape[0] != n:
    raise ValueError(f"batch['language_N'] has {langs.shape[0]} rows for {n} completions")
  return [base.LANGUAGES[int(l)] for l in langs]


def language_consistency_term(texts: Sequence[str], token_ids, batch: dict) -> list[float]:
  """`language_consistency` as a Python reward term (rewards.PyRewardFn): each row's CoT against its prompt's language
  (`language_N`), R1's fix for language mixing, and evaluation's eval/language_consistency reading.

  A CoT with no words of either language scores 0: an empty think body should not look perfectly consistent.
  """
  del token_ids
  return [language_consistency(t, lang) for t, lang in zip(texts, _languages(batch, len(texts)))]


def steps_written(text: str) -> int:
  """Steps (texts before ';') of the think body: 0 for a direct answer, the length of a worked solution."""
  return len(split_steps(think_body(text)))


MAX_RECHECK_STEPS = 12  # a re-check's column steps before the re-written step (`_recheck`: at most 7 for sums)


def _operands(step_text: str):
  m = STEP_RE.fullmatch(step_text)
  return m.groups()[:3] if m else None


def _rewritten(steps: list[str], i: int) -> int:
  """Index of the step that re-writes steps[i - 1] in the re-check opened at steps[i]: the first of steps[i:]
  (within MAX_RECHECK_STEPS) with the same `A op B`; i itself for style "repeat"; -1 if none does."""
  want = _operands(steps[i - 1])
  for j in range(i, min(len(steps), i + MAX_RECHECK_STEPS + 1)):
    if want is not None and _operands(steps[j]) == want:
      return j
  return -1


def spans(steps: list[str]) -> list[tuple[int, int | None]]:
  """The steps as written, in order: (i, None) for steps[i] written once; (i, j) for a re-check opened at steps[i]
  (i >= 1; it checks steps[i - 1]) whose re-written step is steps[j] (`_rewritten`; -1 if it re-writes none, and
  then steps[i] alone belongs to it); the column steps between i and j are the re-check's own."""
  out, i = [], 0
  while i < len(steps):
    if i > 0 and _RECHECK_RE.search(steps[i]):
      j = _rewritten(steps, i)
      out.append((i, j))
      i = max(i, j) + 1
    else:
      out.append((i, None))
      i += 1
  return out


def final_steps(text: str) -> list[str]:
  """The steps as finally written: a re-check's column steps are dropped and its re-written step replaces the step
  it checks (when the re-check re-writes none, its first step does, as a "repeat" re-check's would)."""
  steps, out = split_steps(think_body(text)), []
  for i, j in spans(steps):
    if j is None:
      out.append(steps[i])
    else:
      out[-1] = steps[j if j >= 0 else i]
  return out


def recheck_stats(text: str) -> tuple[int, int]:
  """(re-check phrases, those whose re-check re-writes the step before it (`_rewritten`) and turns its wrong result
  into the right one)."""
  steps = split_steps(think_body(text))
  phrases = len(_RECHECK_RE.findall(think_body(text)))
  fixed = sum(1 for i, j in spans(steps) if j is not None and j >= 0 and not score_step(steps[i - 1])
              and score_step(steps[j]))
  return phrases, fixed
