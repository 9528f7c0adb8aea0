"""GSM8K data: TFDS `gsm8k` prepared without TensorFlow or internet (the download patched to local files: the
openai/grade-school-math JSONL files it would fetch), read back through tfds.data_source; the JSONL reader for local
copies; one-line errors for bad files."""
import json
import os
import subprocess
import sys

import pytest

from grpo_jax.tasks import gsm8k
from tests import hf_dirs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tfds_prepare_and_read_back_in_a_fresh_interpreter(tmp_path):
  """Needs importlib_resources (pinned in setup.py: tensorflow-datasets imports it to prepare but does not
  declare it) and the explicit builder import in gsm8k.prepare/load_split."""
  src = hf_dirs.gsm8k_jsonl(str(tmp_path / "src"), n_train=6, n_test=3)
  code = f"""
import os
from unittest import mock
import tensorflow_datasets as tfds
from grpo_jax.tasks import gsm8k
files = {{k: os.path.join({src!r}, k.split("_")[0] + ".jsonl") for k in ("train", "test", "train_socratic", "test_socratic")}}
with mock.patch.object(tfds.download.DownloadManager, "download_and_extract", lambda self, urls: files):
  gsm8k.prepare({str(tmp_path / 'tfds')!r})
for split in ("train", "test"):
  print(split, sorted(ex["final"] for ex in gsm8k.load_split(split, {str(tmp_path / 'tfds')!r})))
# a damaged prepared copy: was an array_record RuntimeError traceback
(rec,) = [os.path.join(r, f) for r, _, fs in os.walk({str(tmp_path / 'tfds')!r}) for f in fs if "test.array_record" in f]
os.truncate(rec, 2000)
try:
  gsm8k.load_split("test", {str(tmp_path / 'tfds')!r})
except ValueError as e:
  assert "cannot be read" in str(e) and "\\n" not in str(e), str(e)
else:
  raise AssertionError("a damaged split was read")
"""
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                     env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr[-3000:]
  lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines()[-2:])
  assert lines["train"] == str(sorted(str(2 * i + 3) for i in range(6)))  # TFDS shuffles records on write
  assert lines["test"] == str(sorted(str(2 * i + 3) for i in range(3)))


def test_jsonl_copies_are_read_in_order(tmp_path):
  d = hf_dirs.gsm8k_jsonl(str(tmp_path), n_train=5, n_test=2)
  train = gsm8k.load_split("train", d)
  assert [ex["index"] for ex in train] == list(range(5))
  assert [ex["final"] for ex in train] == ["3", "5", "7", "9", "11"]
  assert train[1]["question"] == hf_dirs.QUESTIONS[1] and train[1]["solution"].endswith("#### 5")
  with open(os.path.join(d, "train.jsonl"), "a") as f:
    f.write(json.dumps({"question": "x", "answer": "12,000 + 1\n#### 12,001"}) + "\n\n")
  assert gsm8k.load_split("train", d)[-1]["final"] == "12001"
  with open(os.path.join(d, "train.jsonl"), "rb") as f:  # saved with a UTF-8 byte-order mark: the same examples
    data = f.read()
  with open(os.path.join(d, "train.jsonl"), "wb") as f:
    f.write(b"\xef\xbb\xbf" + data)
  assert gsm8k.load_split("train", d)[0]["question"] == hf_dirs.QUESTIONS[0]


@pytest.mark.parametrize("line,needle", [("{not json", "line 2: Expecting property name"),
                                         (json.dumps({"question": "q"}), "line 2: missing key 'answer'"),
                                         (json.dumps({"question": "q", "answer": "no marker"}), "'####'"),
                                         # were read as the question 'None', the final answer '1'}' or '', or
                                         # crashed a batch mid-run (a traceback during a checkpoint's commit)
                                         (json.dumps({"question": None, "answer": "#### 1"}), "'question' is NoneType"),
                                         (json.dumps({"question": "q", "answer": {"a": "#### 1"}}), "'answer' is dict"),
                                         (json.dumps({"question": "q", "answer": "x ####"}), "nothing after"),
                                         (json.dumps({"question": "q", "answer": "#### " + "1" * 30}), "24 ASCII"),
                                         # a reference no value is read from: every completion graded 0, silently
                                         (json.dumps({"question": "q", "answer": "#### five"}),
                                          "'five' is not a number"),
                                         (json.dumps({"question": "q", "answer": "#### \\sqrt{2}"}), "is not a number"),
                                         (b'\xff{"question": "q", "answer": "#### 2"}', "line 2: not UTF-8")])
def test_bad_jsonl_lines_are_one_line_errors(tmp_path, line, needle):
  with open(tmp_path / "test.jsonl", "wb") as f:
    f.write((json.dumps({"question": "q", "answer": "#### 1"}) + "\n").encode()
            + (line if isinstance(line, bytes) else line.encode()) + b"\n")
  with pytest.raises(ValueError) as e:
    gsm8k.load_split("test", str(tmp_path))
  assert needle in str(e.value) and "test.jsonl" in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("layout", ["{split}.parquet", "{split}-00000-of-00001.parquet",
                                    "main/{split}-00000-of-00001.parquet"])
def test_parquet_as_the_hub_serves_it(tmp_path, layout):
  """GSM8K as parquet (the Hugging Face hub's files, question/answer columns; shards in name order): the same
  examples as the JSONL copy. A file without the columns is one line naming it."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  src = hf_dirs.gsm8k_jsonl(str(tmp_path / "src"), n_train=5, n_test=2)
  d = tmp_path / "pq"
  for split in ("train", "test"):
    rows = [json.loads(l) for l in open(os.path.join(src, f"{split}.jsonl"))]
    path = d / layout.format(split=split)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows]}), path)
    assert gsm8k.load_split(split, str(d)) == gsm8k.load_split(split, src)
  bad = tmp_path / "bad"
  bad.mkdir()
  pq.write_table(pa.table({"q": ["x"]}), bad / "test.parquet")
  with pytest.raises(ValueError) as e:
    gsm8k.load_split("test", str(bad))
  assert "test.parquet" in str(e.value) and "'question' and 'answer'" in str(e.value) and "\n" not in str(e.value)


def test_bad_tfds_records_name_the_split_and_record():
  """A prepared TFDS copy's bad record (not UTF-8, empty, no '####') said only "'question' is empty", with no split
  or record (the JSONL and parquet readers name their file and line / row); tfds.testing.mock_data stands in for it,
  its default random records too (they have no '####')."""
  import tensorflow_datasets as tfds
  good = {"question": b"q", "answer": b"x #### 1"}
  for record, needle in (({"question": b"\xff\xfe", "answer": b"x #### 1"}, "'question' is not UTF-8"),
                         ({"question": b"  ", "answer": b"x #### 1"}, "'question' is empty"),
                         ({"question": b"q", "answer": b"no marker"}, "no '####'")):
    with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kw: [good, record]):
      with pytest.raises(ValueError) as e:
        gsm8k.load_split("test")
    assert str(e.value).startswith("task.data_dir: the TFDS gsm8k test split in the default TFDS data dir record 1: ")
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
  with tfds.testing.mock_data(num_examples=3):
    with pytest.raises(ValueError, match=r"^task.data_dir: the TFDS gsm8k train split .* record 0: .*'####'"):
      gsm8k.load_split("train")


def test_repeated_and_leaked_questions_are_one_counted_warning_each(tmp_path, caplog):
  """A copy whose test split holds train questions (held-out accuracy that is not held out), or that repeats
  questions within a split, was trained and evaluated without a word; preflight now says each, with the count and
  the first example (whitespace does not hide a repeat). The generated tasks' splits have none."""
  import logging
  from grpo_jax.config import config_lib
  from grpo_jax.run import preflight
  from grpo_jax.tasks import data, tokenizer_factory
  rec = lambda q, a: json.dumps({"question": q, "answer": a})
  (tmp_path / "train.jsonl").write_text("\n".join(
      [rec("How many? One.", "#### 1"), rec("Two?", "#### 2"), rec("How  many?  One. ", "#### 1"),
       rec("Three?", "#### 3"), rec("Four?", "#### 4")]) + "\n")
  (tmp_path / "test.jsonl").write_text("\n".join(
      [rec("Five?", "#### 5"), rec("Three?", "#### 3"), rec("Four?", "#### 4"), rec("Five?", "#### 5")]) + "\n")
  c = config_lib.override(config_lib.load_config("configs/gsm8k.py", "small"), {
      "task.data_dir": str(tmp_path), "eval.size": 2, "eval.batch": 2})
  assert data.repeated_questions(c.task) == {"test_in_train": [1, 2], "test_repeats": [3], "train_repeats": [2]}
  with caplog.at_level(logging.WARNING):
    preflight.check_data(c, tokenizer_factory.for_config(c))
  where = f"task data in {tmp_path}: "
  for line in ("2 test questions are also train questions (test example 1 first): held-out accuracy on them is not "
               "held out", "1 test questions repeat an earlier test question (test example 3 first)",
               "1 train questions repeat an earlier train question (train example 2 first)"):
    assert where + line in caplog.text, caplog.text
  for name in ("arith", "countdown", "sums"):  # disjoint by construction (base.Task.examples), by question text too
    found = data.repeated_questions(dict(name=name, data_dir=str(tmp_path / "tfds"), train_size=600, test_size=60))
    assert found == {"test_in_train": [], "test_repeats": [], "train_repeats": []}, (name, found)
