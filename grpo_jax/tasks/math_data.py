"""Your own math dataset, from local files: DAPO-Math-17k, AIME, AMC, MATH-500, GSM8K-style sets, or the parquet files
verl's preprocessing writes; graded like GSM8K (tasks/gsm8k.py: the same prompts, reward terms and host verifier),
numerically or symbolically.

Files: `task.train_path` / `task.test_path` (a `.jsonl`, `.json` or `.parquet` file, or a directory whose files with
those endings are read in name order), else `task.data_dir` holding `<split>.jsonl`, `<split>.json` or parquet
(`<split>.parquet`, `<split>-*.parquet`). A `.json` file is a list of records. Each record gives:
- the question: `task.question_field` (a key, or a dotted path into nested records: `extra_info.question`), else the
  first of QUESTION_KEYS it has; a list of chat messages (verl's `prompt` column) gives its last user turn's content
  (its system turn is replaced by this project's prompt format, task.prompt_format);
- the answer: `task.answer_field`, else the first of ANSWER_KEYS (verl's `reward_model.ground_truth` included): a
  number, or text whose final answer is the part after `####`, else the last `\\boxed{…}`, else the whole text; a list
  gives its first element the grader can read.
`task.grader`: 'numeric' (default) compares exact values (math_answer: `\\frac{1}{3}`, `2^{10}`, `1,000`, `25\\%`;
a reference must be a number or an arithmetic expression without variables, stored as its exact value `p/q` when
longer than ANSWER_CHARS); 'symbolic' compares with math-verify (tasks/symbolic.py: `\\sqrt{2}/2` = `1/\\sqrt{2}`,
intervals, tuples, `\\pi`, equations), a numeric reference still exactly, and takes any reference math-verify reads
(up to ANSWER_BYTES UTF-8 bytes). A record whose reference the grader cannot read is refused in one line naming the
file and row, unless `task.ungradable='skip'`: then it is left out, and the count and the first few are logged. A
question that appears in both the train and the test files, or twice in one, is counted in a warning before the run
(preflight.check_held_out, as for every dataset task).
`task.solution_field` names the records' worked solutions (MATH's `solution`, a distilled trace): the SFT stage and
job=sft / pretrain train on them (`MathData.sft_completion`: in the form the prompt format asks for).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
from typing import Any

import numpy as np
from absl import logging

from grpo_jax.tasks import gsm8k
from grpo_jax.tasks import math_answer

QUESTION_KEYS = ("question", "problem", "prompt", "query", "input")
ANSWER_KEYS = ("answer", "final_answer", "ground_truth", "reward_model.ground_truth", "target", "solution",
               "output")
UNGRADABLE = ("error", "skip")
ANSWER_BYTES = 128  # a symbolic reference's bytes in the batch (answer_chars_NxA)
EXTENSIONS = (".jsonl", ".json", ".parquet")


@dataclasses.dataclass(frozen=True)
class MathData(gsm8k.GSM8K):
  """GSM8K's prompts and grading over records read from local files (load_examples)."""

  name: str = "math"
  question_field: str = ""
  answer_field: str = ""
  train_path: str = ""
  test_path: str = ""
  grader: str = "numeric"
  ungradable: str = "error"
  solution_field: str = ""

  def __post_init__(self):
    super().__post_init__()
    if self.grader not in gsm8k.GRADERS:
      raise ValueError(f"task.grader={self.grader!r} is unknown; use one of {list(gsm8k.GRADERS)}.")
    if self.ungradable not in UNGRADABLE:
      raise ValueError(f"task.ungradable={self.ungradable!r} is unknown; use one of {list(UNGRADABLE)}.")

  def sft_completion(self, ex: dict, tagged: bool = True) -> str:
    """The SFT target of an example: its record's worked solution (task.solution_field). Tagged (SFT): in the form
    the prompt asks for — r1_zero: `<think> solution </think> <answer> final </answer>`, the solution's own format tags
    (a distilled R1 trace's `<think>…</think>`) dropped, as the target has each tag once; chat: the solution, with
    `\\boxed{final}` appended where it has no \\boxed. Untagged (pre-training): the solution as it is."""
    if "worked" not in ex:
      raise ValueError("task.solution_field is empty: SFT on task.name=math trains on its records' worked solutions; "
                       "name their field (e.g. task.solution_field=solution), or set sft.steps=0.")
    worked = ex["worked"].strip()
    if not tagged:
      return worked
    if self.prompt_format == "r1_zero":  # a trace's own tags made '<think> <think> …' (math_format 0: SFT taught it)
      thought = re.sub(r"[ \t]*(?:" + "|".join(map(re.escape, gsm8k.tokenizer_lib.TAGS)) + r")[ \t]*", " ", worked).strip()
      return f"<think> {thought} </think> <answer> {ex['final']} </answer>"
    return worked if math_answer.last_boxed(worked) is not None else f"{worked}\n\n$\\boxed{{{ex['final']}}}$"

  def batch_fields(self, examples: list[dict]) -> dict:
    n = len(examples)
    width = ANSWER_BYTES if self.grader == "symbolic" else gsm8k.ANSWER_CHARS
    return {"answer_chars_NxA": gsm8k.encode_answers([ex["final"] for ex in examples], width),
            "prompt_format_N": np.full(n, gsm8k.PROMPT_FORMATS.index(self.prompt_format), np.int32),
            "grader_N": np.full(n, gsm8k.GRADERS.index(self.grader), np.int32)}


def split_files(task: MathData, split: str, data_dir: str | None) -> list[str]:
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
    raise ValueError(f"task.name=math reads local files: set {key} (a .jsonl, .json or .parquet file) or "
                     f"task.data_dir (a directory with {split}.jsonl, {split}.json or {split}.parquet).")
  for path in (os.path.join(data_dir, f"{split}.jsonl"), os.path.join(data_dir, f"{split}.json")):
    if os.path.isfile(path):
      return [path]
  parquet = gsm8k.parquet_paths(split, data_dir)
  if parquet:
    return parquet
  raise ValueError(f"task.data_dir={data_dir} has no {split}.jsonl, {split}.json or {split} parquet "
                   f"({split}.parquet, {split}-*.parquet); put the {split} split there, or set {key}.")


def parquet_columns(task: MathData, names: list[str]) -> list[str] | None:
  """The columns of `names` the task's fields can come from (None: all, where a field is in none of them, so that
  its error lists every key). Datasets carry big columns no grader reads (OpenR1-Math's `generations`)."""
  need = set()
  for given, candidates in ((task.question_field, QUESTION_KEYS), (task.answer_field, ANSWER_KEYS),
                            (task.solution_field, ())):
    tops = [k.split(".")[0] for k in ([given] if given else candidates)]
    present = [t for t in tops if t in names]
    if tops and not present:
      return None
    need.update(present)
  return [n for n in names if n in need]


def read_records(path: str, task: MathData | None = None) -> list[tuple[str, Any]]:
  """(where, record) of every record of a file, `where` naming its line or row for error messages; of a parquet file
  only the columns `task`'s fields can come from."""
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top  (a tensorflow-datasets dependency)
    try:
      columns = None if task is None else parquet_columns(task, pq.read_schema(path).names)
      rows = pq.read_table(path, columns=columns).to_pylist()
    except Exception as e:  # pylint: disable=broad-except  (pyarrow's ArrowInvalid and OSError)
      raise ValueError(f"{path}: not a readable parquet file ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                       ) from None
    return [(f"{path} row {n}", r) for n, r in enumerate(rows, 1)]
  if path.endswith(".json"):
    try:
      with open(path, encoding="utf-8-sig") as f:
        data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      lines = isinstance(e, json.JSONDecodeError) and e.msg == "Extra data"  # a JSONL file named .json
      raise ValueError(f"{path}: not a UTF-8 JSON file ({str(e).splitlines()[0]})"
                       + ("; one JSON record per line is a .jsonl file: rename it." if lines else ".")) from None
    if not isinstance(data, list):
      raise ValueError(f"{path}: a .json file must hold a list of records, got a {type(data).__name__}; write one "
                       "record per line as .jsonl, or the list itself.")
    return [(f"{path} record {n}", r) for n, r in enumerate(data, 1)]
  out = []
  for n, line in gsm8k.jsonl_lines(path):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} line {n}: not JSON ({e.msg}); each line must be one JSON object.") from None
    if isinstance(record, list):  # a .json list of records named .jsonl
      raise ValueError(f"{path} line {n}: a JSON list, not one record; a file holding a list of records is a .json "
                       "file: rename it (or write one record per line).")
    out.append((f"{path} line {n}", record))
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


def reference_text(value: Any) -> str | None:
  """A reference's final-answer text: a number as written, the part after `####`, else the last \\boxed{}, else the
  text (None: not a string or a finite number)."""
  if isinstance(value, bool) or value is None:
    return None
  if isinstance(value, (int, float)):
    if isinstance(value, float) and not math.isfinite(value):
      return None
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**63 else repr(value)
  if isinstance(value, bytes):
    value = value.decode("utf-8", errors="replace")
  if not isinstance(value, str):
    return None
  text = value.split("####")[-1] if "####" in value else (math_answer.last_boxed(value) or value)
  return text.strip() or None


def numeric_final(text: str | None) -> str | None:
  """The numeric grader's final answer: a number or arithmetic expression without variables, as written, or as its
  exact value p/q where the text is longer than the batch holds (None: not numeric)."""
  if text is None:
    return None
  parsed = math_answer.parse_value(text)
  if parsed is None or not math_answer.no_variables(text):
    return None
  if len(text) <= gsm8k.ANSWER_CHARS and text.isascii():
    return text
  number, percent = parsed
  exact = str(number) + ("%" if percent else "")
  return exact if len(exact) <= gsm8k.ANSWER_CHARS else None


def _too_long(value: Any) -> bool:
  """A numeric reference that numeric_final turned down only for its length (a 30-digit integer)."""
  values = value if isinstance(value, list) else [value]
  texts = [t for t in map(reference_text, values) if t is not None]
  return any(math_answer.parse_value(t) is not None and math_answer.no_variables(t) for t in texts)


def final_answer(value: Any) -> str | None:
  """The numeric grader's final answer of a reference (a list: its first numeric element; None: none)."""
  if isinstance(value, list):
    return next((f for f in map(final_answer, value) if f is not None), None)
  return numeric_final(reference_text(value))


def symbolic_finals(values: list[Any]) -> list[str | None]:
  """The symbolic grader's final answers of references, in one call to its worker: the numeric grader's where it
  reads one, else the text math-verify parses (within ANSWER_BYTES); a list: its first such element."""
  from grpo_jax.tasks import symbolic  # pylint: disable=g-import-not-at-top
  flat = [(i, v) for i, value in enumerate(values) for v in (value if isinstance(value, list) else [value])]
  texts = [reference_text(v) for _, v in flat]
  # each distinct text once (a dataset repeats its problems: DAPO-Math-17k's parquet holds each many times)
  ask = list(dict.fromkeys(t for t in texts if t is not None and numeric_final(t) is None
                           and len(t.encode("utf-8")) <= ANSWER_BYTES))
  parsed = dict(zip(ask, symbolic.grader().parses_many(ask))) if ask else {}
  out: list[str | None] = [None] * len(values)
  for (i, _), t in zip(flat, texts):
    if out[i] is None and t is not None:
      out[i] = numeric_final(t) or (t if parsed.get(t) else None)
  return out


_LOADED: dict[tuple, list[dict]] = {}  # a split's examples by its files (path, mtime, size) and the task's fields


def load_examples(task: MathData, split: str, *, data_dir: str | None = None, **sizes) -> list[dict]:
  """registry.TASKS loader: examples {index, question, solution, final[, worked]} in file order (sizes do not apply:
  the files are the splits). Questions shared between the splits or repeated are counted by preflight.check_held_out.
  A run asks for each split 3-4 times (preflight, held-out check, batches, eval): the files are read once while
  unchanged (a large parquet took each read's time and memory again); the examples are shared, read-only."""
  del sizes
  files = split_files(task, split, data_dir)
  key = (split, tuple((p, os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in files), task.question_field,
         task.answer_field, task.solution_field, task.grader, task.ungradable)
  if key not in _LOADED:
    if len(_LOADED) >= 4:  # a train and a test split, and room for a changed file
      _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = _read_examples(task, split, files)
  return list(_LOADED[key])


def _read_examples(task: MathData, split: str, files: list[str]) -> list[dict]:
  rows = []
  for path in files:
    for where, record in read_records(path, task):
      if not isinstance(record, dict):
        raise ValueError(f"{where}: a record must be an object (a dict), got {type(record).__name__}.")
      try:
        question = question_text(_pick(record, task.question_field, QUESTION_KEYS, "question", where))
      except ValueError as e:
        raise ValueError(f"{where}: {e}" if not str(e).startswith(where) else str(e)) from None
      worked = None
      if task.solution_field:
        worked = _pick(record, task.solution_field, (), "solution", where)
        if not isinstance(worked, str) or not worked.strip():
          raise ValueError(f"{where}: its worked solution (task.solution_field={task.solution_field!r}) is "
                           f"{'empty' if isinstance(worked, str) else type(worked).__name__}, expected text.")
      rows.append((where, question, _pick(record, task.answer_field, ANSWER_KEYS, "answer", where), worked))
  answers = [a for _, _, a, _ in rows]
  finals = symbolic_finals(answers) if task.grader == "symbolic" else [final_answer(a) for a in answers]
  examples, skipped = [], []
  for (where, question, answer, worked), final in zip(rows, finals):
    if final is None:
      if task.ungradable == "skip":
        skipped.append((where, answer))
        continue
      if task.grader == "symbolic":
        long = [t for t in map(reference_text, answer if isinstance(answer, list) else [answer])
                if t is not None and len(t.encode("utf-8")) > ANSWER_BYTES]
        kind = (f"it is over the {ANSWER_BYTES} UTF-8 bytes the batch holds for it" if long
                else "math-verify cannot read it")
      elif _too_long(answer):
        kind = (f"its exact value is longer than the {gsm8k.ANSWER_CHARS} characters the batch holds for it "
                "(task.grader=symbolic holds 128 bytes)")
      else:
        kind = ("it is not a number or an arithmetic expression without variables (task.grader=symbolic compares "
                "expressions, sets and intervals)")
      raise ValueError(f"{where}: the answer {str(answer)[:60]!r} cannot be graded: {kind}; set "
                       "task.ungradable=skip to leave such records out (counted in the log).")
    examples.append({"index": len(examples), "question": question, "solution": str(answer), "final": final,
                     **({"worked": worked} if worked is not None else {})})
  if skipped:
    logging.warning("task math, %s split: %d record(s) whose answer the %s grader cannot read left out "
                    "(task.ungradable=skip), e.g. %s", split, len(skipped), task.grader,
                    "; ".join(f"{w}: {str(a)[:40]!r}" for w, a in skipped[:3]))
  if not examples:
    raise ValueError(f"task.name=math: the {split} split has no examples the {task.grader} grader can read"
                     + (f" ({len(skipped)} skipped)." if skipped else "."))
  return examples
