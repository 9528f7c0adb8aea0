"""GSM8K: read from a local TFDS data dir or from JSONL copies, fed to the prompt pipeline, graded in Python.

Data: `task.data_dir` holding `train.jsonl` / `test.jsonl` (the openai/grade-school-math files: one
{"question", "answer"} object a line), or parquet files with those two columns as the Hugging Face hub serves
GSM8K (`<split>.parquet`, `<split>-*.parquet`, or the hub's `main/<split>-*.parquet`), is read directly; otherwise
it must be a TFDS data dir with `gsm8k` prepared (`python -m grpo_jax.tasks.gsm8k --data_dir=DIR` prepares it
where the internet is reachable). A directory with none of these is one error naming what it looked for. The final answer is
the text after '####' in the reference solution (commas removed); one that is not a number is refused at load.

Grading (`grade_text`, one function for the training rewards and held-out evaluation) is what a careful human
grader does, with format and accuracy as two separate reward terms:
- `math_accuracy`: the completion's final answer has the reference value (math_answer.equal: '$1,000.00',
  '1000 dollars', '\\boxed{1000}', '2000/2' all match 1000). The final answer is the last `<answer>…</answer>`
  body, else the last `\\boxed{…}`, else, for a completion that ended (EOS), the expression after its last final-answer
  phrase, else its last number (or the LaTeX expression holding it): math_answer.extract_answer.
- `math_format`: the completion is in the form its prompt asked for: with `task.prompt_format='r1_zero'`
  `<think>…</think> <answer>…</answer>` (each tag once; whitespace and newlines around the tags allowed, nothing
  else); with 'chat' (the instruction asks for a boxed answer) a non-empty `\\boxed{…}`. Where the tokenizer has the
  four tags as single tokens (the shipped one), a tag spelled from other pieces is not a tag.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from typing import Callable, Iterator, Sequence

import numpy as np

from grpo_jax.infra import errors
from grpo_jax.tasks import math_answer, tokenizer as tokenizer_lib

# DeepSeek-R1's R1-Zero template (the paper's Table 1), for every tokenizer: GSM8K questions are English text.
R1_ZERO = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
           "assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
           "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
           "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>. User: "
           "{question} Assistant:")
# Qwen2.5-Math's chain-of-thought instruction: the system turn of the 'chat' prompt format.
CHAT_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPT_FORMATS = ("r1_zero", "chat")  # the ids batch_fields stores in prompt_format_N


def final_answer(solution: str) -> str:
  if "####" not in solution:
    raise ValueError("GSM8K answer has no '####' final-answer marker; is task.data_dir a real gsm8k dir?")
  final = solution.split("####")[-1].strip().replace(",", "")
  if not final:  # every completion would be graded against ''
    raise ValueError("GSM8K answer has nothing after its '####' final-answer marker")
  if len(final) > ANSWER_CHARS or not final.isascii():  # the batch holds it as ANSWER_CHARS ASCII codes
    raise ValueError(f"GSM8K final answer {final[:40]!r} is not at most {ANSWER_CHARS} ASCII characters")
  if math_answer.parse_value(final) is None:  # math_accuracy compares values: no completion could match it
    raise ValueError(f"GSM8K final answer {final!r} is not a number or arithmetic expression, so every completion "
                     "would be graded wrong; the text after '####' must be the numeric answer")
  return final


@dataclasses.dataclass(frozen=True)
class GSM8K:
  """Task-like adapter (question / answer_text / batch_fields) over records, for data.py; `prompt_format` is the
  config's task.prompt_format (it decides which format the `math_format` term checks)."""

  name: str = "gsm8k"
  prompt_format: str = "r1_zero"
  templates = {"a": R1_ZERO, "b": R1_ZERO}  # base.prompt's R1-Zero template (one language: English)
  chat_system = CHAT_SYSTEM

  def __post_init__(self):
    if self.prompt_format not in PROMPT_FORMATS:
      raise ValueError(f"task.prompt_format={self.prompt_format!r} is unknown; use one of {list(PROMPT_FORMATS)}.")

  def question(self, ex: dict, language: str) -> str:
    del language
    return ex["question"]

  def answer_text(self, ex: dict) -> str:
    return ex["final"]

  def batch_fields(self, examples: list[dict]) -> dict[str, np.ndarray]:
    # Numeric so the batch can go to devices and through jax.pure_callback: ASCII codes, 0-padded.
    return {"answer_chars_NxA": encode_answers([ex["final"] for ex in examples]),
            "prompt_format_N": np.full(len(examples), PROMPT_FORMATS.index(self.prompt_format), np.int32)}


ANSWER_CHARS = 24
# Per row, which grader compares its answer (batch field grader_N; absent = numeric): math_answer's exact values, or
# math-verify's symbolic equivalence (tasks/symbolic.py: task.name=math with task.grader=symbolic).
GRADERS = ("numeric", "symbolic")


def encode_answers(finals: list[str], width: int = ANSWER_CHARS) -> np.ndarray:
  """Final answers as UTF-8 bytes, 0-padded to `width` (numeric, so the batch can go to devices and through
  jax.pure_callback)."""
  out = np.zeros((len(finals), width), np.int32)
  for i, f in enumerate(finals):
    raw = f.encode("utf-8")
    if len(raw) > width or 0 in raw:
      raise ValueError(f"final answer {f[:40]!r} does not fit {width} UTF-8 bytes")
    out[i, :len(raw)] = list(raw)
  return out


def decode_answer(chars_A) -> str:
  return bytes(int(c) for c in chars_A if c).decode("utf-8")


def _text(x, name: str) -> str:
  """A record's field as text: a str, or UTF-8 bytes (TFDS, parquet); anything else (null, a number, an object)
  is refused rather than turned into its repr."""
  if isinstance(x, bytes):
    try:
      x = x.decode()
    except UnicodeDecodeError as e:
      raise ValueError(f"'{name}' is not UTF-8 ({e.reason} at byte {e.start})") from None
  if not isinstance(x, str):
    raise ValueError(f"'{name}' is {type(x).__name__} ({str(x)[:40]}), expected a string")
  if not x.strip():
    raise ValueError(f"'{name}' is empty")
  return x


def _example(i: int, question, solution) -> dict:
  sol = _text(solution, "answer")
  return {"index": i, "question": _text(question, "question"), "solution": sol, "final": final_answer(sol)}


def jsonl_path(split: str, data_dir: str | None) -> str | None:
  """`data_dir/<split>.jsonl` if it exists (a local copy of the GSM8K files), else None."""
  path = os.path.join(data_dir, f"{split}.jsonl") if data_dir else None
  return path if path and os.path.isfile(path) else None


def jsonl_lines(path: str, where: str = "") -> Iterator[tuple[int, str]]:
  """(line number, text) of a JSONL file's non-blank lines, UTF-8 (a first-line byte-order mark is not data); a
  line that is not UTF-8 is one error naming `where` + path and the line."""
  with open(path, "rb") as f:
    for n, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # a byte-order mark (Windows editors) is not data
      except UnicodeDecodeError as e:
        raise ValueError(f"{where}{path} line {n}: not UTF-8 ({e.reason} at byte {e.start} of the line); "
                         "save the file as UTF-8.") from None
      if line.strip():
        yield n, line


def read_jsonl(path: str) -> list[dict]:
  """Examples {index, question, solution, final} from a JSONL file of {"question", "answer"} objects."""
  out = []
  for n, line in jsonl_lines(path, "task.data_dir: "):
    try:
      rec = json.loads(line)
      out.append(_example(len(out), rec["question"], rec["answer"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
      msg = f"missing key {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
      raise ValueError(f"task.data_dir: {path} line {n}: {msg}; each line must be a JSON object with 'question' "
                       "and an 'answer' ending in '#### <final answer>'.") from None
  if not out:
    raise ValueError(f"task.data_dir: {path} has no examples.")
  return out


def parquet_paths(split: str, data_dir: str | None) -> list[str]:
  """The split's parquet files in `data_dir` (the hub's layouts), in name order: shards in order."""
  if not data_dir:
    return []
  for pattern in (f"{split}.parquet", f"{split}-*.parquet", os.path.join("main", f"{split}-*.parquet")):
    found = sorted(glob.glob(os.path.join(data_dir, pattern)))
    if found:
      return found
  return []


def read_parquet(paths: Sequence[str]) -> list[dict]:
  """Examples from parquet files with 'question' and 'answer' columns (pyarrow: a tensorflow-datasets dependency)."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  out = []
  for path in paths:
    try:
      table = pq.read_table(path, columns=["question", "answer"])
    except Exception as e:  # pylint: disable=broad-except  (pyarrow: ArrowInvalid, KeyError for a missing column)
      raise ValueError(f"task.data_dir: {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}; a GSM8K "
                       "parquet file has 'question' and 'answer' (ending in '#### <final answer>') columns.") from None
    for n, (q, a) in enumerate(zip(table.column("question").to_pylist(), table.column("answer").to_pylist()), 1):
      try:
        out.append(_example(len(out), q, a))
      except ValueError as e:
        raise ValueError(f"task.data_dir: {path} row {n}: {e}") from None
  if not out:
    raise ValueError(f"task.data_dir: {', '.join(paths)} hold no examples.")
  return out


def _tfds_prepared(data_dir: str) -> bool:
  return os.path.isdir(os.path.join(data_dir, "gsm8k"))


def load_split(split: str, data_dir: str | None = None) -> list[dict]:
  """Examples {index, question, solution, final} in record order: a local JSONL or parquet copy, else TFDS."""
  path = jsonl_path(split, data_dir)
  if path is not None:
    return read_jsonl(path)
  parquet = parquet_paths(split, data_dir)
  if parquet:
    return read_parquet(parquet)
  if data_dir and not _tfds_prepared(data_dir):
    raise ValueError(f"task.data_dir={data_dir} has no {split}.jsonl, no {split} parquet ({split}.parquet, "
                     f"{split}-*.parquet, main/{split}-*.parquet) and no prepared TFDS gsm8k/; put GSM8K's files "
                     "there, or prepare it with python -m grpo_jax.tasks.gsm8k --data_dir=DIR (needs the internet)")
  import tensorflow_datasets as tfds
  import tensorflow_datasets.text.gsm8k  # noqa: F401  (the old-style builder registers only when imported)
  try:
    source = tfds.data_source("gsm8k", split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # pylint: disable=broad-except  (tfds raises assertion and not-found errors of its own)
    where = data_dir or "the default TFDS data dir"
    raise ValueError(f"task.data_dir: TFDS gsm8k {split} split cannot be read from {where} "
                     f"({type(e).__name__}: {errors.one_line(str(e))[:200]}); set task.data_dir to a directory with GSM8K's "
                     "train.jsonl/test.jsonl or parquet files, or one where python -m grpo_jax.tasks.gsm8k "
                     "--data_dir=DIR prepared it") from None
  out = []
  try:
    for i in range(len(source)):
      record = source[i]
      try:
        out.append(_example(i, record["question"], record["answer"]))
      except ValueError as e:  # the record's own text (the JSONL and parquet readers name their line / row too)
        raise ValueError(f"task.data_dir: the TFDS gsm8k {split} split in {data_dir or 'the default TFDS data dir'} "
                         f"record {i}: {e}") from None
    return out
  except ValueError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (array_record errors of a damaged prepared copy)
    raise ValueError(f"task.data_dir: the prepared TFDS gsm8k {split} split in {data_dir or 'the default TFDS data dir'} "
                     f"cannot be read ({type(e).__name__}: {errors.one_line(str(e))[:160]}); delete its gsm8k/ and "
                     "prepare it again (python -m grpo_jax.tasks.gsm8k --data_dir=DIR), or use the JSONL files.") from None


def load_examples(task, split: str, *, data_dir: str | None = None, **sizes) -> list[dict]:
  """registry.TASKS loader: the dataset's own splits (split_seed and sizes do not apply)."""
  del task, sizes
  return load_split(split, data_dir)


def prepare(data_dir: str) -> None:
  """Downloads and prepares TFDS `gsm8k` (array_record: no TensorFlow needed) into `data_dir`."""
  import tensorflow_datasets as tfds
  import tensorflow_datasets.text.gsm8k  # noqa: F401
  tfds.builder("gsm8k", data_dir=data_dir, file_format="array_record").download_and_prepare()


# ------------------------------------------------------------------------------------------------------- grading

_TAGS_FORMAT = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.S)


def tags_ok(text: str) -> bool:
  """`<think>…</think> <answer>…</answer>`, each tag once, only whitespace around and between the blocks."""
  # the counts first: with each tag once the lazy groups cannot backtrack over many tags (quadratic before)
  return all(text.count(t) == 1 for t in tokenizer_lib.TAGS) and _TAGS_FORMAT.fullmatch(text) is not None


def boxed_ok(text: str) -> bool:
  """A box that holds something: not `\\boxed{}`, nor only boxes and braces (`\\boxed{\\boxed{}}`, `\\boxed{{ }}`)."""
  boxed = math_answer.last_boxed(text)
  return boxed is not None and bool(re.sub(r"\\(?:boxed|fbox)|[{}\s]", "", boxed))


def grade_text(text: str, final: str, *, ended: bool = True, prompt_format: str = "r1_zero",
               ) -> tuple[float, float, str | None]:
  """(accuracy, format, answer) of a completion's text (without EOS). `ended`: it stopped at EOS (else its last
  number is not taken as an answer). cons@k votes on the answer's class (vote_keys; None: no answer found)."""
  answer = math_answer.extract_answer(text, last_number_ok=ended)
  acc = float(math_answer.equal(answer, final))
  fmt = float(tags_ok(text) if prompt_format == "r1_zero" else boxed_ok(text))
  return acc, fmt, None if answer is None else answer.strip()


def _tags_are_tokens(ids: Sequence[int], text: str, tok) -> bool:
  """Where the tags are single tokens, every tag in the text must be one (not spelled from other pieces)."""
  return all(ids.count(tok.tag_ids[t]) == text.count(t) for t in tokenizer_lib.TAGS)


def eos_ids(tok) -> tuple[int, ...]:
  return tuple(getattr(tok, "eos_ids", (tok.eos_id,)))


def read(ids: Sequence[int], tok, prompt_format: str = "r1_zero") -> tuple[str | None, float]:
  """(answer, format) of a completion given as token ids, up to and including its EOS if it ended: what
  `grade_text` reads, and the tag-token rule."""
  ids = [int(i) for i in ids]
  ended = bool(ids) and ids[-1] in eos_ids(tok)
  body = ids[:-1] if ended else ids
  text = tok.decode(body)
  answer = math_answer.extract_answer(text, last_number_ok=ended)
  fmt = float(tags_ok(text) if prompt_format == "r1_zero" else boxed_ok(text))
  if fmt and token_tags(tok) and prompt_format == "r1_zero" and not _tags_are_tokens(body, text, tok):
    fmt = 0.0
  return (None if answer is None else answer.strip()), fmt


def grade(ids: Sequence[int], final: str, tok, prompt_format: str = "r1_zero") -> tuple[float, float, str | None]:
  """`grade_text` of a completion given as token ids, up to and including its EOS if it ended."""
  answer, fmt = read(ids, tok, prompt_format)
  return float(math_answer.equal(answer, final)), fmt, answer


def _symbolic_rows(batch: dict, n: int) -> list[int]:
  codes = batch.get("grader_N")
  return [i for i in range(n) if codes is not None and GRADERS[int(codes[i])] == "symbolic"]


def equal_rows(answers: Sequence[str | None], finals: Sequence[str], batch: dict) -> list[float]:
  """Accuracy of each row: its grader's (batch field grader_N; absent: numeric) comparison of answer and final.
  The symbolic rows go to the grader's worker in one call."""
  symbolic_rows = _symbolic_rows(batch, len(finals))
  out = [float(math_answer.equal(a, f)) for a, f in zip(answers, finals)]
  if symbolic_rows:
    from grpo_jax.tasks import symbolic  # pylint: disable=g-import-not-at-top  (math-verify only where asked for)
    verdicts = symbolic.grader().equal_many([(answers[i], finals[i]) for i in symbolic_rows])
    for i, v in zip(symbolic_rows, verdicts):
      out[i] = float(v)
  return out


def token_tags(tok) -> bool:
  """Whether the tokenizer has every format tag as a single token."""
  return all(t in tok.tag_ids for t in tokenizer_lib.TAGS)


def _formats(batch: dict, n: int) -> list[str]:
  codes = batch.get("prompt_format_N")
  return [PROMPT_FORMATS[int(c)] for c in codes] if codes is not None else ["r1_zero"] * n


def make_rewards(tok) -> dict[str, Callable]:
  """The `math_accuracy` and `math_format` reward_spec.PyRewardFn terms. The callback hands completion ids without
  their EOS and, in `ended_N`, whether each row stopped at one (absent: every row counts as ended)."""

  def read_rows(token_ids, batch) -> tuple[list[str | None], list[float], list[str]]:
    finals = [decode_answer(a) for a in batch["answer_chars_NxA"]]
    ended = batch.get("ended_N", np.ones(len(finals), bool))
    answers, formats = [], []
    for ids, e, fmt in zip(token_ids, ended, _formats(batch, len(finals))):
      answer, ok = read(list(ids) + ([tok.eos_id] if e else []), tok, fmt)
      answers.append(answer)
      formats.append(ok)
    return answers, formats, finals

  def math_accuracy(texts, token_ids, batch: dict) -> list[float]:
    del texts  # decoded here from the same ids (read needs the ids for the tag-token rule)
    answers, _, finals = read_rows(token_ids, batch)
    return equal_rows(answers, finals, batch)

  def math_format(texts, token_ids, batch: dict) -> list[float]:
    del texts
    return read_rows(token_ids, batch)[1]
  return {"math_accuracy": math_accuracy, "math_format": math_format}


def python_rewards(tok) -> dict[str, Callable]:
  """The Python reward terms a GSM8K config may name in config.rewards (registry.TASKS)."""
  return make_rewards(tok)


def host_verifier(tok) -> Callable:
  """Held-out evaluation on the host: (tokens_NxL, mask_NxL, fields, group=1) -> (accuracy_N, format_N, answers_N);
  `group`: the rows are runs of that many samples of one prompt, whose answers vote together (vote_keys)."""

  def verify(tokens_NxL, mask_NxL, fields: dict, group: int = 1) -> tuple[np.ndarray, np.ndarray, list]:
    tokens_NxL, mask_NxL = np.asarray(tokens_NxL), np.asarray(mask_NxL)
    read_N = [read(t[m > 0].tolist(), tok, f) for t, m, f in zip(tokens_NxL, mask_NxL,
                                                                  _formats(fields, len(tokens_NxL)))]
    finals = [decode_answer(a) for a in np.asarray(fields["answer_chars_NxA"])]
    answers = [r[0] for r in read_N]
    acc = equal_rows(answers, finals, fields)
    return (np.asarray(acc, np.float32), np.asarray([r[1] for r in read_N], np.float32),
            vote_keys(answers, finals, acc, _symbolic_rows(fields, len(finals)), group=group))
  return verify


def _vote_key(answer: str | None):
  """Answers that are equal values vote together ('1,000' and '1000.0'; a percentage by its number: '50%' with '50',
  which the grader calls equal); unparsable ones by their text without spaces; an empty one (`<answer> </answer>`,
  `\\boxed{}`) is no answer and casts no vote (it voted as the text '' and out-voted a right answer given once)."""
  if answer is None or not answer.strip():
    return None
  v = math_answer.parse_value(answer)
  return ("value", v[0]) if v is not None else ("text", "".join(answer.split()))


def vote_keys(answers: Sequence[str | None], finals: Sequence[str], right: Sequence[float],
              symbolic_rows: Sequence[int] = (), *, group: int) -> list:
  """What cons@k votes on: one key per class of answers the row's grader calls equal (self-consistency's vote
  over equivalent answers, Wang et al. 2022). Rows come in runs of `group` samples of one prompt (rows
  i*group .. i*group+group-1); the vote is within a run (evaluation.cons_at_k). Every right answer of a reference is
  one class ('50%' and '0.5' for 0.5; `x+1` and `1+x` for x+1): they equal the reference, so each other. A wrong
  answer votes by its value or its text (_vote_key); on the symbolic grader's rows a wrong answer is also graded
  against the first answer of each earlier class of ITS PROMPT (rows in order), one at a time, and joins the first
  one math-verify calls equal (`\\frac{1}{\\sqrt{2}}` with `\\frac{\\sqrt{2}}{2}`), so the classes, and
  evaluation.cons_at_k's tie-break (the class voted first), depend only on the prompt's rows and their order.
  Cost: at most D(D−1)/2 math-verify comparisons for D distinct wrong answers of one prompt, none after the first
  equal one; numbers against numbers never reach the worker, and `group=1` (greedy: one row per prompt, nothing to
  vote with) none at all. (The classes were per reference over the whole chunk of prompts: every greedy pass compared
  the wrong answers of prompts that share a reference for nothing, and math-verify's equality is not transitive —
  `2` equals `x=2` and `y=2`, which are not equal — so another prompt's first answer could split a prompt's class
  and change its cons@k.) The grouping is Qwen2.5-Math's `group_pred(use_symbol=True)` (evaluation/rm_maj_eval.py,
  per problem: each answer joins the first earlier group whose key math_equal calls equal; the earliest of the
  largest groups wins); its default maj@k and verl's (calc_maj_val) vote by the extracted string, which the exact
  values make the same here for numbers only."""
  if group < 1:
    raise ValueError(f"vote_keys: group={group} must be >= 1 (the samples per prompt).")
  keys = [_vote_key(a) for a in answers]
  for i, k in enumerate(keys):
    if k is not None and right[i] > 0.5:
      keys[i] = ("right", finals[i])
  classes: dict[int, list[tuple[object, str]]] = {}  # per prompt: its wrong classes' (key, first answer)
  joined: dict[tuple, object] = {}                  # (prompt, an answer's own key) -> its class's key
  pending = [i for i in symbolic_rows if keys[i] is not None and keys[i][0] != "right"] if group > 1 else []
  if pending:
    from grpo_jax.tasks import symbolic  # pylint: disable=g-import-not-at-top  (math-verify only where asked for)
  for i in pending:
    own = (i // group, keys[i])
    if own not in joined:
      reps = classes.setdefault(i // group, [])
      # one comparison at a time: the first equal class is the one joined, the ones after it are not compared
      joined[own] = next((key for key, first in reps if symbolic.grader().equal_many([(answers[i], first)])[0]),
                         keys[i])
      if joined[own] == keys[i]:
        reps.append((keys[i], answers[i]))
    keys[i] = joined[own]
  return keys


def main(argv=None) -> int:
  import argparse
  ap = argparse.ArgumentParser(description="Prepare TFDS gsm8k (array_record) in a data dir; needs the internet.")
  ap.add_argument("--data_dir", required=True)
  prepare(ap.parse_args(argv).data_dir)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
