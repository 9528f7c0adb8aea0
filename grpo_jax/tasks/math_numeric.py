"""Your own math dataset with numeric answers, from local files: DAPO-Math-17k, AIME, AMC, GSM8K-style sets, or the
parquet files verl's preprocessing writes; graded like GSM8K (tasks/gsm8k.py: the same prompts, reward terms and
host verifier).

Files: `task.train_path` / `task.test_path` (a `.jsonl`, `.json` or `.parquet` file, or a directory whose files with
those endings are read in name order), else `task.data_dir` holding `<split>.jsonl`, `<split>.json` or parquet
(`<split>.parquet`, `<split>-*.parquet`). A `.json` file is a list of records. Each record gives:
- the question: `task.question_field` (a key, or a dotted path into nested records: `extra_info.question`), else the
  first of QUESTION_KEYS it has; a list of chat messages (verl's `prompt` column) gives its last user turn's content
  (its system turn is replaced by this project's prompt format, task.prompt_format);
- the answer: `task.answer_field`, else the first of ANSWER_KEYS (verl's `reward_model.ground_truth` included): a
  number, or text whose final answer is the part after `####`, else the last `\\boxed{…}`, else the whole text; a list
  gives its first numeric element. The final answer must be a number or an arithmetic expression
  (math_answer.parse_value: `\\frac{1}{3}`, `2^{10}`, `1,000`, `25\\%`); one longer than the batch's ANSWER_CHARS is
  stored as its exact value `p/q`.
A record whose answer is not numeric (`\\sqrt{2}`, an interval, a matrix) is refused in one line naming the file and
row, unless `task.non_numeric='skip'`: then it is left out, and the count and the first few are logged (a
numeric-only grader cannot grade it: symbolic answers need a symbolic checker). A question that appears in both
the train and the test files is counted and logged (train/test leakage).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
from typing import Any

from absl import logging

from grpo_jax.tasks import gsm8k
from grpo_jax.tasks import math_answer

QUESTION_KEYS = ("question", "problem", "prompt", "query", "input")
ANSWER_KEYS = ("answer", "final_answer", "ground_truth", "reward_model.ground_truth", "target", "solution",
               "output")
NON_NUMERIC = ("error", "skip")
EXTENSIONS = (".jsonl", ".json", ".parquet")


@dataclasses.dataclass(frozen=True)
class MathNumeric(gsm8k.GSM8K):
  """GSM8K's prompts and grading over records read from local files (load_examples)."""

  name: str = "math_numeric"
  question_field: str = ""
  answer_field: str = ""
  train_path: str = ""
  test_path: str = ""
  non_numeric: str = "error"

  def __post_init__(self):
    super().__post_init__()
    if self.non_numeric not in NON_NUMERIC:
      raise ValueError(f"task.non_numeric={self.non_numeric!r} is unknown; use one of {list(NON_NUMERIC)}.")


def split_files(task: MathNumeric, split: str, data_dir: str | None) -> list[str]:
  """The files of `split`: task.<split>_path (a file or a directory of them), else data_dir/<split>.*."""
  key = f"task.{split}_path"
  given = getattr(task, f"{split}_path", "")
  if given:
    if os.path.isdir(given):
      found = sorted(p for p in glob.glob(os.path.join(given, "*")) if p.endswith(EXTENSIONS) and os.path.isfile(p))
      if not found:
        raise ValueError(f"{key}={given} is a directory with no {', '.join(EXTENSIONS)} files.")
      return found
    if not os.path.isfile(given):
      raise ValueError(f"{key}={given} does not exist; point it at a .jsonl, .json or .parquet file (or a directory "
                       "of them).")
    if not given.endswith(EXTENSIONS):
      raise ValueError(f"{key}={given}: read as {', '.join(EXTENSIONS)} only (by its ending); convert it or rename "
                       "it if it is one of those.")
    return [given]
  if not data_dir:
    raise ValueError(f"task.name=math_numeric reads local files: set {key} (a .jsonl, .json or .parquet file) or "
                     f"task.data_dir (a directory with {split}.jsonl, {split}.json or {split}.parquet).")
  for path in (os.path.join(data_dir, f"{split}.jsonl"), os.path.join(data_dir, f"{split}.json")):
    if os.path.isfile(path):
      return [path]
  parquet = gsm8k.parquet_paths(split, data_dir)
  if parquet:
    return parquet
  raise ValueError(f"task.data_dir={data_dir} has no {split}.jsonl, {split}.json or {split} parquet "
                   f"({split}.parquet, {split}-*.parquet); put the {split} split there, or set {key}.")


def read_records(path: str) -> list[tuple[str, Any]]:
  """(where, record) of every record of a file, `where` naming its line or row for error messages."""
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top  (a tensorflow-datasets dependency)
    try:
      rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pylint: disable=broad-except  (pyarrow's ArrowInvalid and OSError)
      raise ValueError(f"{path}: not a readable parquet file ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                       ) from None
    return [(f"{path} row {n}", r) for n, r in enumerate(rows, 1)]
  if path.endswith(".json"):
    try:
      with open(path, encoding="utf-8-sig") as f:
        data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ValueError(f"{path}: not a UTF-8 JSON file ({str(e).splitlines()[0]}).") from None
    if not isinstance(data, list):
      raise ValueError(f"{path}: a .json file must hold a list of records, got a {type(data).__name__}; write one "
                       "record per line as .jsonl, or the list itself.")
    return [(f"{path} record {n}", r) for n, r in enumerate(data, 1)]
  out = []
  with open(path, "rb") as f:
    for n, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{path} line {n}: not UTF-8 ({e.reason} at byte {e.start} of the line); save the file as "
                         "UTF-8.") from None
      if not line.strip():
        continue
      try:
        out.append((f"{path} line {n}", json.loads(line)))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path} line {n}: not JSON ({e.msg}); each line must be one JSON object.") from None
  return out


_MISSING = object()


def _field(record: dict, path: str):
  node = record
  for part in path.split("."):
    if not isinstance(node, dict) or part not in node:
      return _MISSING
    node = node[part]
  return node


def _pick(record: dict, given: str, candidates: tuple[str, ...], what: str, where: str) -> Any:
  if given:
    value = _field(record, given)
    if value is _MISSING:
      raise ValueError(f"{where}: has no {given!r} (task.{what}_field); its keys: {sorted(record)}.")
    return value
  for key in candidates:
    value = _field(record, key)
    if value is not _MISSING and value is not None:
      return value
  raise ValueError(f"{where}: none of {list(candidates)} holds its {what}; its keys: {sorted(record)}. Name the "
                   f"field with task.{what}_field (a dotted path for a nested one).")


def question_text(value: Any) -> str:
  """A question as text: a string, or a list of chat messages' last user turn."""
  if isinstance(value, list):
    turns = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
    if not turns:
      raise ValueError("the question is a list without a {'role': 'user', 'content': ...} message")
    value = turns[-1]
  if isinstance(value, bytes):
    value = value.decode("utf-8")
  if not isinstance(value, str) or not value.strip():
    raise ValueError(f"the question is {'empty' if isinstance(value, str) else type(value).__name__}, expected text")
  return value


# A reference's units in \\text{…} / \\mathrm{…}, its LaTeX commands (parse_value refuses those that change the
# value) and scientific notation's exponent: what may hold letters in a numeric reference.
_UNIT_GROUP = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{[^{}]*\}")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_EXPONENT = re.compile(r"(?<=\d)[eE](?=[-+]?\d)")


def _no_variables(text: str) -> bool:
  """No letter outside units, commands and exponents. math_answer drops bare words as units, which suits a
  completion ('5 apples') but would read a symbolic REFERENCE 'x+1' as 1 and 'k=3' as 3, and grade a completion '1'
  right on it."""
  return re.search(r"[A-Za-z]", _EXPONENT.sub("", _COMMAND.sub("", _UNIT_GROUP.sub("", text)))) is None


def final_answer(value: Any) -> str | None:
  """The final answer a reference gives, as the text the grader compares with (None: not numeric)."""
  if isinstance(value, list):
    for item in value:
      final = final_answer(item)
      if final is not None:
        return final
    return None
  if isinstance(value, bool) or value is None:
    return None
  if isinstance(value, (int, float)):
    if isinstance(value, float) and not math.isfinite(value):
      return None
    value = str(int(value)) if float(value).is_integer() and abs(value) < 2**63 else repr(value)
  if isinstance(value, bytes):
    value = value.decode("utf-8", errors="replace")
  if not isinstance(value, str):
    return None
  text = value.split("####")[-1] if "####" in value else (math_answer.last_boxed(value) or value)
  text = text.strip()
  parsed = math_answer.parse_value(text)
  if parsed is None or not _no_variables(text):
    return None
  if len(text) <= gsm8k.ANSWER_CHARS and text.isascii():
    return text
  number, percent = parsed
  exact = str(number) + ("%" if percent else "")
  return exact if len(exact) <= gsm8k.ANSWER_CHARS else None


def load_examples(task: MathNumeric, split: str, *, data_dir: str | None = None, **sizes) -> list[dict]:
  """registry.TASKS loader: examples {index, question, solution, final} in file order (sizes do not apply: the
  files are the splits). The test split's loading also counts questions it shares with the train split."""
  del sizes
  examples, skipped = [], []
  for path in split_files(task, split, data_dir):
    for where, record in read_records(path):
      if not isinstance(record, dict):
        raise ValueError(f"{where}: a record must be an object (a dict), got {type(record).__name__}.")
      try:
        question = question_text(_pick(record, task.question_field, QUESTION_KEYS, "question", where))
      except ValueError as e:
        raise ValueError(f"{where}: {e}" if not str(e).startswith(where) else str(e)) from None
      answer = _pick(record, task.answer_field, ANSWER_KEYS, "answer", where)
      final = final_answer(answer)
      if final is None:
        if task.non_numeric == "skip":
          skipped.append((where, answer))
          continue
        raise ValueError(f"{where}: the answer {str(answer)[:60]!r} is not a number or an arithmetic expression, so "
                         "no completion could be graded right on it (this task grades numeric answers); set "
                         "task.non_numeric=skip to leave such records out (counted in the log).")
      examples.append({"index": len(examples), "question": question, "solution": str(answer), "final": final})
  if skipped:
    logging.warning("task math_numeric, %s split: %d record(s) without a numeric answer left out "
                    "(task.non_numeric=skip), e.g. %s", split, len(skipped),
                    "; ".join(f"{w}: {str(a)[:40]!r}" for w, a in skipped[:3]))
  if not examples:
    raise ValueError(f"task.name=math_numeric: the {split} split has no examples with a numeric answer"
                     + (f" ({len(skipped)} skipped)." if skipped else "."))
  if split == "test":
    _log_leakage(task, examples, data_dir)
  return examples


def _log_leakage(task: MathNumeric, test: list[dict], data_dir: str | None) -> None:
  try:
    train = load_examples(task, "train", data_dir=data_dir)
  except ValueError:
    return  # the train split's own error comes when it is read
  seen = {" ".join(ex["question"].split()) for ex in train}
  shared = sum(" ".join(ex["question"].split()) in seen for ex in test)
  if shared:
    logging.warning("task math_numeric: %d of the %d test questions are also train questions (the held-out "
                    "accuracy is partly on trained questions)", shared, len(test))
