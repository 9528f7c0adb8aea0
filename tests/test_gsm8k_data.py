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
