"""task.name='math': local math datasets (jsonl, a json list, verl's parquet) read into GSM8K's prompts and grading,
numeric or symbolic (math-verify in a killable worker: tasks/symbolic.py); the refusals; one short RL run on such
files."""
import json
import logging
import os

import pytest

from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import gsm8k
from grpo_jax.tasks import math_data
from grpo_jax.tasks import registry
from tests import metrics_contract

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _task(**knobs):
  return registry.get_task("math", **knobs)


def _write_jsonl(path, records):
  with open(path, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  return str(path)


def _verl_parquet(path, rows):
  """verl's preprocessed layout: `prompt` a list of chat messages, `reward_model` a struct with `ground_truth`."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  table = pa.Table.from_pylist([{
      "data_source": "math_dapo",
      "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}],
      "ability": "MATH", "reward_model": {"style": "rule", "ground_truth": a}, "extra_info": {"index": i}}
      for i, (q, a) in enumerate(rows)])
  pq.write_table(table, path)
  return str(path)


def test_every_file_layout_gives_the_questions_and_final_answers(tmp_path):
  train = _write_jsonl(tmp_path / "train.jsonl", [
      {"question": "2+2?", "answer": "2 + 2 = 4\n#### 4"},          # GSM8K's '####'
      {"question": "Half of 1?", "answer": "So $\\boxed{\\frac{1}{2}}$."},  # the last \boxed of a solution
      {"question": "Big?", "answer": 1000000},                         # a number
      {"question": "Float?", "answer": 2.5},
      {"question": "Whole float?", "answer": 3.0},
      {"question": "Grouped?", "answer": "1,234"}])
  got = math_data.load_examples(_task(train_path=train), "train")
  assert [(e["index"], e["question"], e["final"]) for e in got] == [
      (0, "2+2?", "4"), (1, "Half of 1?", "\\frac{1}{2}"), (2, "Big?", "1000000"), (3, "Float?", "2.5"),
      (4, "Whole float?", "3"), (5, "Grouped?", "1,234")]
  aime = tmp_path / "aime.json"  # a json list with `problem` (AIME files): the second candidate name
  aime.write_text(json.dumps([{"id": 1, "problem": "Find n.", "answer": "073"}, {"problem": "Find m.", "answer": 204}]))
  got = math_data.load_examples(_task(test_path=str(aime), train_path=train), "test")
  assert [(e["question"], e["final"]) for e in got] == [("Find n.", "073"), ("Find m.", "204")]
  pq_dir = tmp_path / "verl"
  pq_dir.mkdir()
  _verl_parquet(pq_dir / "train.parquet", [("What is 6*7?", "42"), ("And 10/4?", "\\frac{5}{2}")])
  got = math_data.load_examples(_task(), "train", data_dir=str(pq_dir))
  assert [(e["question"], e["final"]) for e in got] == [("What is 6*7?", "42"), ("And 10/4?", "\\frac{5}{2}")]
  # a directory as the path: its files in name order, indices running on
  (pq_dir / "b.jsonl").write_text(json.dumps({"query": "q3", "target": "-7"}) + "\n")
  got = math_data.load_examples(_task(train_path=str(pq_dir)), "train")
  assert [(e["index"], e["question"], e["final"]) for e in got] == [
      (0, "q3", "-7"), (1, "What is 6*7?", "42"), (2, "And 10/4?", "\\frac{5}{2}")]
  # named fields, nested by a dotted path
  nested = _write_jsonl(tmp_path / "n.jsonl", [{"meta": {"q": "Nested?"}, "sol": "x", "gt": {"v": "12"}}])
  got = math_data.load_examples(_task(train_path=nested, question_field="meta.q", answer_field="gt.v"), "train")
  assert [(e["question"], e["final"]) for e in got] == [("Nested?", "12")]


def test_a_split_is_read_once_while_its_files_are_unchanged(tmp_path, monkeypatch):
  """A run asks for each split 3-4 times (preflight's data and held-out checks, the batches, eval): each read the
  whole file again. A changed file, or other fields, read it again."""
  path = _write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "1"}])
  reads = []
  real = math_data.read_records
  monkeypatch.setattr(math_data, "read_records", lambda p, t=None: reads.append(p) or real(p, t))
  first = math_data.load_examples(_task(train_path=path), "train")
  again = math_data.load_examples(_task(train_path=path), "train")
  assert len(reads) == 1 and again == first and again is not first
  math_data.load_examples(_task(train_path=path, question_field="question"), "train")
  assert len(reads) == 2
  _write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "1"}, {"question": "q2", "answer": "22"}])
  assert [e["final"] for e in math_data.load_examples(_task(train_path=path), "train")] == ["1", "22"]
  assert len(reads) == 3


def test_symbolic_references_are_parsed_once_each(monkeypatch):
  """symbolic_finals asked the worker to parse every reference, a repeated one as often as it appears."""
  from grpo_jax.tasks import symbolic
  asked = []

  class Fake:
    def parses_many(self, answers):
      asked.extend(answers)
      return [a != "\\frac{" for a in answers]
  monkeypatch.setattr(symbolic, "grader", Fake)
  got = math_data.symbolic_finals(["\\sqrt{2}", "3", "\\sqrt{2}", ["\\frac{", "x+1"], "\\boxed{\\sqrt{2}}", "\\frac{"])
  assert got == ["\\sqrt{2}", "3", "\\sqrt{2}", "x+1", "\\sqrt{2}", None]
  assert sorted(asked) == sorted(["\\sqrt{2}", "\\frac{", "x+1"])


def test_parquet_reads_only_the_columns_the_fields_come_from(tmp_path, monkeypatch):
  """Every column was read and turned into Python objects, a dataset's big unused ones (OpenR1-Math's `generations`)
  included; a field no column holds still lists every key in its error."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  path = str(tmp_path / "t.parquet")
  pq.write_table(pa.Table.from_pylist([{"problem": "q", "answer": "3", "generations": ["x" * 1000] * 4,
                                        "meta": {"src": "a"}}]), path)
  read = []
  real = pq.read_table
  monkeypatch.setattr(pq, "read_table", lambda p, columns=None, **k: read.append(columns) or real(p, columns=columns, **k))
  got = math_data.load_examples(_task(train_path=path), "train")
  assert [(e["question"], e["final"]) for e in got] == [("q", "3")] and read == [["problem", "answer"]]
  got = math_data.load_examples(_task(train_path=path, question_field="meta.src"), "train")
  assert [(e["question"], e["final"]) for e in got] == [("a", "3")] and read[-1] == ["answer", "meta"]
  with pytest.raises(ValueError, match=r"has no 'sol' \(task.solution_field\); its keys: \['answer', 'generations', "
                                       r"'meta', 'problem'\]"):
    math_data.load_examples(_task(train_path=path, solution_field="sol"), "train")
  assert read[-1] is None


def test_a_long_numeric_answer_is_stored_as_its_exact_value():
  assert math_data.final_answer("\\frac{123456789012}{246913578024}") == "1/2"
  assert math_data.final_answer("\\frac{1}{3}") == "\\frac{1}{3}"
  assert math_data.final_answer(["\\sqrt{2}", "7"]) == "7"  # a list: its first numeric element
  for bad in ("\\sqrt{2}", "[0, 1)", "x+1", "2x", "k=3", "5 apples", "\\pi", True, None, float("nan"), "",
              {"a": 1}):  # math_answer reads 'x+1' as 1 (bare words are units in a completion): not in a reference
    assert math_data.final_answer(bad) is None, bad
  for good in ("5\\text{ cm}", "1.5e3", "10\\%", "\\$18.90", "2^{10}", "\\dfrac{3}{4}", "-0.25"):
    assert math_data.final_answer(good) == good, good


def test_the_grader_reads_the_loaded_answers(tmp_path):
  path = _write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "\\boxed{\\frac{1}{3}}"},
                                             {"question": "q2", "answer": "1,234"}])
  third, grouped = (e["final"] for e in math_data.load_examples(_task(train_path=path), "train"))
  assert gsm8k.grade_text("<think> 1 over 3 </think> <answer>1/3</answer>", third)[:2] == (1.0, 1.0)
  assert gsm8k.grade_text("<think>x</think> <answer>0.333</answer>", third)[0] == 0.0
  assert gsm8k.grade_text("it is \\boxed{1234}", grouped, prompt_format="chat")[:2] == (1.0, 1.0)
  fields = registry.get_task("math").batch_fields([{"final": third}])  # fits the batch's answer chars
  assert gsm8k.decode_answer(fields["answer_chars_NxA"][0]) == third


def test_non_numeric_answers_are_refused_or_skipped_and_counted(tmp_path, caplog):
  path = _write_jsonl(tmp_path / "m.jsonl", [{"problem": "a", "answer": "5"},
                                             {"problem": "b", "answer": "\\sqrt{2}"},
                                             {"problem": "c", "answer": "(0, 1]"},
                                             {"problem": "d", "answer": "-3"}])
  with pytest.raises(ValueError, match=r"m.jsonl line 2: the answer '\\\\sqrt\{2\}' cannot be graded: it is not a "
                                       r"number.*task.grader=symbolic.*task.ungradable=skip"):
    math_data.load_examples(_task(train_path=path), "train")
  with caplog.at_level(logging.WARNING):
    got = math_data.load_examples(_task(train_path=path, ungradable="skip"), "train")
  assert [(e["index"], e["question"], e["final"]) for e in got] == [(0, "a", "5"), (1, "d", "-3")]
  assert "2 record(s) whose answer the numeric grader cannot read left out" in caplog.text and "m.jsonl line 3" in caplog.text
  huge = _write_jsonl(tmp_path / "huge.jsonl", [{"problem": "a", "answer": "1" * 30}])  # a number: not 'not a number'
  with pytest.raises(ValueError, match=r"huge.jsonl line 1: .* cannot be graded: its exact value is longer than the 24 "
                                       r"characters the batch holds"):
    math_data.load_examples(_task(train_path=huge), "train")
  only_bad = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "b", "answer": "\\pi"}])
  with pytest.raises(ValueError, match=r"has no examples the numeric grader can read \(1 skipped\)"):
    math_data.load_examples(_task(train_path=only_bad, ungradable="skip"), "train")
  with pytest.raises(ValueError, match="task.ungradable='drop' is unknown"):
    _task(ungradable="drop")


def test_bad_files_and_fields_are_one_line(tmp_path):
  cases = []
  no_q = _write_jsonl(tmp_path / "noq.jsonl", [{"text": "x", "answer": "1"}])
  cases.append((dict(train_path=no_q), r"noq.jsonl line 1: none of \['question', 'problem'.*its keys: \['answer', "
                                       r"'text'\]. Name the field with task.question_field"))
  cases.append((dict(train_path=no_q, question_field="text", answer_field="gt"),
                r"noq.jsonl line 1: has no 'gt' \(task.answer_field\)"))
  obj = tmp_path / "obj.json"
  obj.write_text(json.dumps({"data": []}))
  cases.append((dict(train_path=str(obj)), "a .json file must hold a list of records, got a dict"))
  broken = tmp_path / "broken.jsonl"
  broken.write_text('{"question": "a", "answer": "1"}\n{"question": \n')
  cases.append((dict(train_path=str(broken)), "broken.jsonl line 2: not JSON"))
  csv = tmp_path / "d.csv"
  csv.write_text("question,answer\n")
  cases.append((dict(train_path=str(csv)), r"read as .jsonl, .json, .parquet only"))
  cases.append((dict(train_path=str(tmp_path / "missing.jsonl")), "does not exist"))
  empty = tmp_path / "empty"
  empty.mkdir()
  cases.append((dict(train_path=str(empty)), "is a directory with no .jsonl, .json, .parquet files"))
  cases.append((dict(), "reads local files: set task.train_path"))
  msgs = _write_jsonl(tmp_path / "msgs.jsonl", [{"prompt": [{"role": "system", "content": "s"}], "answer": "1"}])
  cases.append((dict(train_path=msgs), "msgs.jsonl line 1: the question is a list without a"))
  lines_as_json = tmp_path / "lines.json"  # a JSONL file named .json, and a JSON list named .jsonl: the fix named
  lines_as_json.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n')
  cases.append((dict(train_path=str(lines_as_json)), r"lines.json: not a UTF-8 JSON file \(Extra data.*one JSON record "
                                                      r"per line is a .jsonl file: rename it"))
  list_as_jsonl = _write_jsonl(tmp_path / "list.jsonl", [[{"question": "a", "answer": "1"}]])
  cases.append((dict(train_path=list_as_jsonl), r"list.jsonl line 1: a JSON list, not one record; .* is a .json file: "
                                                r"rename it"))
  notpq = tmp_path / "x.parquet"
  notpq.write_text("not parquet")
  cases.append((dict(train_path=str(notpq)), "x.parquet: not a readable parquet file"))
  for knobs, match in cases:
    with pytest.raises(ValueError, match=match):
      math_data.load_examples(_task(**knobs), "train")
  with pytest.raises(ValueError, match=r"task.data_dir=.* has no test.jsonl, test.json or test parquet"):
    math_data.load_examples(_task(), "test", data_dir=str(empty))


def test_test_questions_seen_in_training_are_counted(tmp_path):
  """preflight.check_held_out's count (every dataset task's) covers task 'math': whitespace is ignored."""
  train = _write_jsonl(tmp_path / "train.jsonl", [{"question": "What is  1+1?", "answer": "2"},
                                                  {"question": "q", "answer": "3"}])
  test = _write_jsonl(tmp_path / "test.jsonl", [{"question": "What is 1+1?", "answer": "2"},
                                                {"question": "new", "answer": "4"}])
  c = config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "small")
  c = config_lib.override(c, {"task.name": "math", "task.train_path": train, "task.test_path": test})
  assert data_lib.repeated_questions(c.task) == {"test_in_train": [0], "test_repeats": [], "train_repeats": []}


def test_a_knob_the_task_does_not_read_is_refused():
  from grpo_jax.run import validate
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  for key, value in (("train_path", "/data/x.jsonl"), ("ungradable", "skip"), ("grader", "symbolic"), ("max_target", 500)):
    bad = config_lib.override(c, {f"task.{key}": value})
    with pytest.raises(errors.ConfigError, match=rf"task.{key}: is a knob of .* which this run's task \('arith'\) "
                                                 "does not read"):
      validate.unread_task_knobs(bad)
  validate.unread_task_knobs(config_lib.override(c, {"task.max_digits": 3, "task.prompt_format": "chat"}))


def test_a_config_files_own_task_knob_is_said_not_refused_when_the_user_switches_task(caplog):
  """configs/r1_zero_aha.py sets task.max_number for its task (sums); `--config.task.name=arith` on it was refused
  (exit 2) for a key the user never set. Under a command's record the file's value is a warning naming it; a key the
  user set for another task is still refused; with no record (a library caller) every such value is refused."""
  from grpo_jax.run import validate
  c = config_lib.override(config_lib.load_config(os.path.join(REPO, "configs", "r1_zero_aha.py")),
                          {"task.name": "arith"})
  with config_lib.user_keys_set({"task.name"}), caplog.at_level(logging.WARNING):
    validate.unread_task_knobs(c)
  said = [r.getMessage() for r in caplog.records if "(the config's): no effect with task.name='arith'" in r.getMessage()]
  assert any(m.startswith("task.max_number=") for m in said), said
  with config_lib.user_keys_set({"task.name", "task.max_number"}), pytest.raises(
      errors.ConfigError, match=r"task.max_number: is a knob of"):
    validate.unread_task_knobs(c)
  with pytest.raises(errors.ConfigError, match=r"is a knob of"):
    validate.unread_task_knobs(c)


def test_a_short_rl_run_on_local_files(tmp_path):
  """configs/gsm8k.py:small on task.name=math files (verl parquet for training, a json list held out) with the
  symbolic grader: one GRPO step, the Python math reward through the step (its worker process started from the
  callback's thread), held-out evaluation on the host at steps 0 and 1."""
  pytest.importorskip("math_verify")
  from grpo_jax.run import train
  ds = tmp_path / "ds"
  ds.mkdir()
  _verl_parquet(ds / "train.parquet", [(f"Tom has {i} apples and buys 3 more. How many?", str(i + 3))
                                       for i in range(7)] + [("Simplify 1/sqrt 2.", "\\frac{\\sqrt{2}}{2}")])
  (ds / "test.json").write_text(json.dumps([{"problem": f"What is {i} + 5?", "answer": i + 5} for i in range(4)]))
  c = config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "small")
  c = config_lib.override(c, {"task.name": "math", "task.grader": "symbolic", "task.data_dir": str(ds), "train.steps": 1,
                              "train.eval_every": 1, "eval.size": 4, "eval.batch": 4, "log.tensorboard": False,
                              "log.plots": False})
  examples = data_lib.load_examples(c.task, "train")
  assert [e["final"] for e in examples] == [str(i + 3) for i in range(7)] + ["\\frac{\\sqrt{2}}{2}"]
  workdir = str(tmp_path / "run")
  train.run_rl(c, workdir)
  rows = metrics_contract.check_run(workdir)  # names, units, NaNs and eval keys as docs/metrics.md says
  evals = {r["step"]: r for r in rows if "eval/accuracy" in r}
  assert sorted(evals) == [0, 1]
  trained = [r for r in rows if "train/reward_mean" in r]
  assert len(trained) == 1 and "train/reward/math_accuracy" in trained[0], sorted(trained[0])
  # the length-vs-correctness metrics split by math_accuracy as they do by the generated tasks' accuracy (absent)
  assert {"train/completion_len_correct", "train/completion_len_incorrect", "train/len_acc_corr",
          "train/len_acc_corr_frac"} <= set(trained[0]), sorted(trained[0])


def test_eval_size_is_checked_against_the_test_file_not_test_size(tmp_path):
  """task.test_size sizes a generated split; a dataset's test split is its file. configs/gsm8k.py:small sets
  test_size=4, and an eval.size of 8 on an 8-question file was refused as exceeding it."""
  from grpo_jax.run import preflight
  ds = tmp_path / "ds"
  ds.mkdir()
  _write_jsonl(ds / "train.jsonl", [{"question": f"What is {i} + 3?", "answer": str(i + 3)} for i in range(8)])
  _write_jsonl(ds / "test.jsonl", [{"question": f"What is {i} + 5?", "answer": str(i + 5)} for i in range(8)])
  c = config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "small")
  c = config_lib.override(c, {"task.name": "math", "task.data_dir": str(ds), "eval.size": 8,
                              "eval.batch": 8})
  assert c.task.test_size == 4
  preflight.check(c, str(tmp_path / "run"))
  with pytest.raises(errors.ConfigError, match="config.eval.size: 16 exceeds the 8 usable examples of the test split"):
    preflight.check(config_lib.override(c, {"eval.size": 16}), str(tmp_path / "run"))


def test_the_symbolic_grader_without_math_verify_is_one_line(monkeypatch):
  import importlib.util
  from grpo_jax.run import preflight
  c = config_lib.override(config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "small"),
                          {"task.name": "math", "task.grader": "symbolic", "log.tensorboard": False})
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
  with pytest.raises(errors.ConfigError, match=r"config.task.grader: needs the math_verify package, which is not "
                                               r"installed; pip install -e '.\[math\]' \(math-verify\)"):
    preflight.check_packages(c)
  preflight.check_packages(config_lib.override(c, {"task.grader": "numeric"}))


def test_sft_trains_on_the_records_worked_solutions(tmp_path):
  """task.solution_field: the SFT sequence is bos + prompt + the record's solution in the prompt format's form + eos,
  the loss on the completion only; chat gets a \\boxed final where the solution has none; the refusals."""
  from grpo_jax.run import validate
  path = _write_jsonl(tmp_path / "train.jsonl", [
      {"problem": "What is 6*7?", "solution": "Six sevens make 42.", "answer": "42"},
      {"problem": "Half of 3?", "solution": "It is $\\boxed{\\frac{3}{2}}$.", "answer": "\\frac{3}{2}"}])
  c = config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "small")
  c = config_lib.override(c, {"task.name": "math", "task.train_path": path, "task.test_path": path,
                              "task.solution_field": "solution", "sft.steps": 2, "sft.batch": 2})
  tok = gsm8k.tokenizer_lib.load()
  batch = next(data_lib.sft_batches(c.task, tok, "train", 2, seed=0, start_step=0, seq_len=320))
  got = {}
  for t, m, loss in zip(batch["tokens_NxT"], batch["mask_NxT"], batch["loss_mask_NxT"]):
    head, tail = t[(m > 0) & (loss == 0)].tolist(), t[loss > 0].tolist()
    assert head[0] == tok.bos_id and tail[-1] == tok.eos_id
    got[tok.decode(head[1:])] = tok.decode(tail[:-1])
  q = {gsm8k.R1_ZERO.format(question=x): x for x in ("What is 6*7?", "Half of 3?")}
  assert {q[k]: v for k, v in got.items()} == {
      "What is 6*7?": "<think> Six sevens make 42. </think> <answer> 42 </answer>",
      "Half of 3?": "<think> It is $\\boxed{\\frac{3}{2}}$. </think> <answer> \\frac{3}{2} </answer>"}
  chat = registry.get_task("math", train_path=path, solution_field="solution", prompt_format="chat")
  examples = math_data.load_examples(chat, "train")
  assert chat.sft_completion(examples[0]) == "Six sevens make 42.\n\n$\\boxed{42}$"
  assert chat.sft_completion(examples[1]) == "It is $\\boxed{\\frac{3}{2}}$."
  assert chat.sft_completion(examples[0], tagged=False) == "Six sevens make 42."
  validate.validate_sft(c, 1, tok)
  with pytest.raises(errors.ConfigError, match="sft.mistake_frac: 0.1: task 'math' trains on its records' own"):
    validate.validate_sft(config_lib.override(c, {"sft.mistake_frac": 0.1}), 1, tok)
  with pytest.raises(ValueError, match="task.solution_field is empty: SFT on task.name=math"):
    next(data_lib.sft_batches(config_lib.override(c, {"task.solution_field": ""}).task, tok, "train", 2, seed=0,
                              start_step=0, seq_len=320))
  # a distilled trace with its own <think> tags: the r1_zero target has each tag once (it had two <think>: format 0)
  trace = {"worked": "<think>\nSix sevens: 42.\n</think>\n\nSo $\\boxed{42}$.", "final": "42"}
  target = registry.get_task("math", solution_field="generation").sft_completion(trace)
  assert target == "<think> Six sevens: 42.\n \n\nSo $\\boxed{42}$. </think> <answer> 42 </answer>", target
  assert gsm8k.grade_text(target, "42")[:2] == (1.0, 1.0)
  empty = _write_jsonl(tmp_path / "e.jsonl", [{"problem": "q", "solution": " ", "answer": "1"}])
  with pytest.raises(ValueError, match=r"e.jsonl line 1: its worked solution \(task.solution_field='solution'\) is empty"):
    math_data.load_examples(registry.get_task("math", train_path=empty, solution_field="solution"), "train")
