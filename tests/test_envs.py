"""Multi-turn rollouts with tools, everything outside the engine (docs/tools.md): the environments (calculator,
Python sandbox), the batch call's array contract and its counted fallbacks, the tool formats (Qwen2.5's against
transformers' apply_chat_template), the `tools` tokenizer, the pre-training corpus with calculator calls, the
readings, and the loss mask (observation logits get exactly zero gradient; a teacher-forced single pass over a
transcript equals scoring it turn by turn)."""
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.envs import base as env_base
from grpo_jax.envs import batch as env_batch
from grpo_jax.envs import calculator
from grpo_jax.envs import formats
from grpo_jax.envs import registry
from grpo_jax.envs import sandbox
from grpo_jax.envs import transcript
from grpo_jax.infra import host_calls
from grpo_jax.model import decode as decode_lib
from grpo_jax.model import model as model_lib
from grpo_jax.r1 import corpus
from grpo_jax.rl import losses
from grpo_jax.rl import obs_mask
from grpo_jax.tasks import base, cot, prompts, registry as task_registry, tokenizer as tokenizer_lib, verify_jax
from grpo_jax.tasks import verify_py
from tests.jit_call import jit_call
from tests.jit_call import jit_grad

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = tokenizer_lib.load_tools()
PLAIN = formats.get("plain")
SUMS = task_registry.get_task("sums", num_numbers=4, min_number=10, max_number=99)
EX = {"terms": (21, 41, 95, 32), "answer": 189}


# ------------------------------------------------------------------------------------------- the tokenizer

def test_tools_tokenizer_adds_single_marker_pieces_and_keeps_every_other_id():
  shipped = tokenizer_lib.load()
  assert TOOLS.vocab_size == shipped.vocab_size + 4 == 516
  assert [TOOLS.encode(m) for m in tokenizer_lib.TOOL_MARKERS] == [[512], [513], [514], [515]]
  assert len(shipped.encode("</tool_call>")) == 9  # why the markers are appended: the shipped model spells them
  assert TOOLS.piece_texts()[:512] == shipped.piece_texts()
  assert (TOOLS.pad_id, TOOLS.bos_id, TOOLS.eos_id, TOOLS.tag_ids) == (0, 1, 2, shipped.tag_ids)
  for i in range(40):  # task text without markers encodes exactly as before
    ex = SUMS.generate(base.rng_for("tok", i))
    for text in (base.prompt(SUMS, ex, "a"), cot.solution(ex, "b", mistake=True), cot.brief(ex, "a")):
      assert TOOLS.encode(text) == shipped.encode(text)


def test_tool_blocks_tokenize_at_their_markers():
  """An observation tokenised alone joins the transcript exactly as the whole document tokenises: the engine appends
  encode(observation) between the model's tokens, the base was pre-trained on encode(document)."""
  calls = corpus.calculator_calls(EX, np.random.default_rng(0), 1.0)
  doc = cot.solution(EX, "a", calls=calls)
  assert doc.count("<tool_call>") == 3 and "<tool_call> 21 + 41 </tool_call> <tool_response> 62 </tool_response>" in doc
  pieces, rest = [], doc
  while "</tool_call>" in rest:  # model text up to the stop marker, then the observation, then on
    head, rest = rest.split("</tool_call>", 1)
    obs_end = rest.index("</tool_response>") + len("</tool_response>")
    pieces += [head + "</tool_call>", rest[:obs_end]]
    rest = rest[obs_end:]
  pieces.append(rest)
  assert "".join(pieces) == doc
  assert sum((TOOLS.encode(p) for p in pieces), []) == TOOLS.encode(doc)
  assert TOOLS.decode(TOOLS.encode(doc)) == doc


# ------------------------------------------------------------------------------------------- the calculator

@pytest.mark.parametrize("expr,want", [("37 + 48", "85"), ("170 / 2", "85"), ("10 / 4", "2.5"), ("2 ** 10", "1024"),
                                        ("(1 + 2) * -3", "-9"), ("7 // 2", "3"), ("-5 % 3", "1"), ("10 / 3", "3.333333"),
                                        ("0.1 + 0.2", "0.3")])
def test_calculator_values(expr, want):
  assert calculator.result_text(expr) == (want, {})


@pytest.mark.parametrize("expr,why", [("__import__('os')", "unexpected character"), ("x + 1", "unexpected character"),
                                      ("1 / 0", "division by zero"), ("2 ** 100", "exponents"), ("9 ** 9 ** 9", "exponents"),
                                      ("10 ** 18 * 10", "exceeds"), ("", "empty"), ("1 +", "not an arithmetic"),
                                      ("1" * 201, "longer than"), ("True + 1", "unexpected character"),
                                      ("-" * 70 + "1", "more than"), ("+".join(["1"] * 40), "more than")])
def test_calculator_refuses_anything_else_with_an_error_observation(expr, why):
  text, info = calculator.result_text(expr)
  assert text.startswith("error: ") and why in text and info == {"error": text[len("error: "):]}


def test_calculator_walks_the_tree_itself():
  """No eval: a node type outside arithmetic is refused even when the characters would pass."""
  with pytest.raises(calculator.CalcError, match="not arithmetic"):
    calculator._eval(__import__("ast").parse("1 < 2", mode="eval").body)  # pylint: disable=protected-access


# ------------------------------------------------------------------------------------------- the sandbox

LIMITS = sandbox.Limits(time_s=1.0, memory_mb=256, file_mb=1, output_chars=200)


def test_sandbox_runs_code_and_shows_the_last_value():
  assert sandbox.run("print(48 / 2)", LIMITS) == ("24.0", "", False)
  assert sandbox.run("x = 3\nx * 24", LIMITS) == ("72", "", False)
  assert sandbox.run("import math\nmath.comb(10, 3)", LIMITS) == ("120", "", False)
  assert sandbox.run("1 / 0", LIMITS) == ("", "ZeroDivisionError: division by zero", False)
  # the error is stderr's last line, also after 240 kB of warnings (the first 64 kB were read: 'warning:')
  out = sandbox.run("import sys\nsys.stderr.write('warning: x\\n' * 20000)\n1 / 0", LIMITS)
  assert out == ("", "ZeroDivisionError: division by zero", False)
  out = sandbox.run("open('here.txt', 'w').write('hi')\nprint(open('here.txt').read())", LIMITS)
  assert out == ("hi", "", False)  # its own directory is writable
  # shutil, tempfile, zipfile and tarfile import (they read os.open when imported: with it deleted, each failed)
  out = sandbox.run("import shutil, tempfile, zipfile, tarfile\nopen('a', 'w').write('hi')\nshutil.copyfile('a', 'b')\n"
                    "zipfile.ZipFile('z.zip', 'w').write('b')\nzipfile.ZipFile('z.zip').read('b')", LIMITS)
  assert out == ("b'hi'", "", False)


def test_sandbox_removes_call_directories_of_ended_processes(tmp_path, monkeypatch):
  """A trainer killed with -9 during a call left its grpo_sandbox_* directory for ever. The next process to use the
  sandbox removes those of this host's ended processes; a live process's (ours too: another thread's call), another
  host's and an old unnamed one are left alone."""
  import socket
  import tempfile
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a temp dir this process has not swept yet
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  host = socket.gethostname()
  dead = [f"grpo_sandbox_{host}-{gone.stdout.strip()}-{r}" for r in ("k2x_9abc", "q0")]
  keep = [f"grpo_sandbox_{host}-1-abcd1234",  # pid 1 runs
          f"grpo_sandbox_{host}-{os.getpid()}-abcd1234",  # ours: a call in flight on another thread
          f"grpo_sandbox_otherhost-{gone.stdout.strip()}-abcd1234",  # its pids are not ours
          "grpo_sandbox_abcd1234", "unrelated"]
  for name in dead + keep:
    (tmp_path / name / "work").mkdir(parents=True)
    (tmp_path / name / "code.py").write_text("1")
  assert sandbox.run("6 * 7", LIMITS) == ("42", "", False)
  assert sorted(os.listdir(tmp_path)) == sorted(keep)  # and the call's own directory went with it
  (tmp_path / dead[0]).mkdir()
  sandbox.run("1", LIMITS)
  assert (tmp_path / dead[0]).exists()  # swept once per process and temp dir, not at every call


def test_sandbox_cannot_run_past_its_limit():
  for code in ("while True: pass", "import time\ntime.sleep(30)"):
    t0 = time.monotonic()
    res = sandbox.run(code, LIMITS)
    assert res.timed_out and res.error == "timed out after 1s"
    assert time.monotonic() - t0 < 3.0


def test_sandbox_child_does_not_outlive_a_killed_trainer():
  """The trainer killed (-9) mid-call cannot kill the child at time_s: the child's own alarm (int(time_s) + 2 s)
  ends a sleeping one (RLIMIT_CPU only a busy one), so no call outlives its run by more than that. (The call's
  directory stays behind: nothing is left to delete it; docs/tools.md says so. The test deletes it.)"""
  code = "from grpo_jax.envs import sandbox\nsandbox.run('import time\\ntime.sleep(60)', sandbox.Limits(time_s=0.5))"
  parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
  children = f"/proc/{parent.pid}/task/{parent.pid}/children"

  def sandbox_child():  # (pid, its argv) once it runs the boot (not the fork before its exec)
    for pid in open(children).read().split():
      try:
        argv = open(f"/proc/{pid}/cmdline").read().split("\0")
      except OSError:
        continue
      if argv[1:5] == ["-s", "-S", "-P", "-c"] and len(argv) > 7:
        return pid, argv
    return None

  try:
    t0, found = time.monotonic(), None
    while not found and time.monotonic() - t0 < 20:
      time.sleep(0.05)
      found = sandbox_child()
    assert found, "the sandbox's child never started"
    child, root = found[0], os.path.dirname(found[1][6])  # argv: python -s -S -P -c BOOT work code ...
  finally:
    parent.kill()
    parent.wait()
  try:
    alive = lambda: os.path.exists(f"/proc/{child}") and open(f"/proc/{child}/stat").read().split(") ")[1][0] != "Z"
    t0 = time.monotonic()
    while alive() and time.monotonic() - t0 < 6:
      time.sleep(0.1)
    assert not alive(), f"the child {child} outlived its killed parent by {time.monotonic() - t0:.1f} s"
  finally:
    if alive():  # failed: not left sleeping
      os.kill(int(child), 9)
    assert os.path.basename(root).startswith("grpo_sandbox_"), root
    shutil.rmtree(root, ignore_errors=True)


def test_sandbox_memory_limit():
  res = sandbox.run("x = bytearray(1 << 30)", LIMITS)
  assert res.error == "MemoryError" and not res.timed_out


def test_sandbox_cannot_write_outside_its_directory(tmp_path):
  """The last four got through: chmod and utime through a descriptor opened for reading (the hook let every
  descriptor pass), and a fresh copy of posix from _imp.create_builtin, whose open (with a dir_fd) and mkfifo had
  been deleted from the running one only."""
  target = tmp_path / "outside.txt"
  existing = tmp_path / "keep.txt"
  existing.write_text("keep")
  os.chmod(existing, 0o644)
  before = os.stat(existing)
  posix_copy = "import _imp, sys, os\nposix = _imp.create_builtin(sys.modules['posix'].__spec__)\n"
  attempts = [f"open({str(target)!r}, 'w').write('x')", "open('../escape.txt', 'w').write('x')",
              f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
              f"import os\nos.remove({str(existing)!r})", f"import os\nos.rename({str(existing)!r}, 'mine.txt')",
              f"import os\nos.makedirs({str(tmp_path / 'd')!r})",
              f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
              f"import shutil\nshutil.copyfile({str(existing)!r}, {str(target)!r})",
              f"import os\nos.system('touch {target}')",
              f"import os\nf = open({str(existing)!r}, 'rb')\nos.chmod(f.fileno(), 0o600)",
              f"import os\nf = open({str(existing)!r}, 'rb')\nos.utime(f.fileno(), (0, 0))",
              posix_copy + f"d = posix.open({str(tmp_path)!r}, os.O_RDONLY)\n"
              "posix.write(posix.open('outside.txt', os.O_WRONLY | os.O_CREAT, dir_fd=d), b'x')",
              posix_copy + f"posix.mkfifo({str(target)!r})"]
  for code in attempts:
    res = sandbox.run(code, LIMITS)
    assert res.error and not res.timed_out, code
    if "shutil" in code:  # refused by the hook, not by a failed import
      assert res.error.startswith("PermissionError: shutil.copyfile of"), res
  assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"] and existing.read_text() == "keep"
  after = os.stat(existing)
  assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)
  # the checks leave the code's own directory alone: chmod / utime through a descriptor of its own file
  own = "open('a.txt', 'w').write('x')\nimport os\nf = open('a.txt')\nos.chmod(f.fileno(), 0o600)\n" \
        "os.utime(f.fileno(), (0, 0))\noct(os.stat('a.txt').st_mode & 0o777), os.stat('a.txt').st_mtime"
  assert sandbox.run(own, LIMITS) == ("('0o600', 0.0)", "", False)


def test_sandbox_cannot_open_a_socket_or_start_a_process():
  """...or signal one: _signal.pidfd_send_signal (no audit event) killed any process of the trainer's user;
  _posixshmem made a file in /dev/shm, syslog wrote to the system log (neither raises an audit event)."""
  victim = subprocess.Popen(["sleep", "30"])
  try:
    for code in (f"import _signal, os\n_signal.pidfd_send_signal(os.pidfd_open({victim.pid}), 9)",
                 f"import os\nos.setpriority(os.PRIO_PROCESS, {victim.pid}, 19)",  # worked too
                 f"import os\nos.sched_setaffinity({victim.pid}, {{0}})"):
      res = sandbox.run(code, LIMITS)
      assert res.error.startswith("AttributeError: ") and victim.poll() is None, res
    assert os.getpriority(os.PRIO_PROCESS, victim.pid) == os.getpriority(os.PRIO_PROCESS, os.getpid())
  finally:
    victim.kill()
    victim.wait()
  for code in ("import socket\nsocket.socket()", "import _socket\n_socket.socket()",
               "import socket\nsocket.create_connection(('127.0.0.1', 9))", "import subprocess",
               "import os\nos.fork()", "import ctypes", "import gc\ngc.get_objects()",  # gc: a stand-in (below)
               "import _imp, importlib.machinery as m\n_imp.create_builtin(m.ModuleSpec('gc', None))",
               # these made a file in /dev/shm, wrote to the system log, and lowered the trainer's priority
               "import _posixshmem", "import syslog", "import termios"):
    res = sandbox.run(code, LIMITS)
    assert re.match(r"(ImportError|PermissionError|AttributeError): ", res.error), (code, res)


def test_sandbox_reads_only_its_directory_and_the_standard_library(tmp_path):
  """The child runs as the trainer's user: it read the trainer's environment (/proc/<ppid>/environ: tokens, keys),
  listed and read the run's files (the trainer's cwd through /proc/<ppid>/cwd, a dataset's answers), and the user's
  home; only writes were checked."""
  secret = tmp_path / "answers.jsonl"
  secret.write_text("42")
  attempts = [f"open({str(secret)!r}).read()", f"import os\nos.listdir({str(tmp_path)!r})",
              "import os\nopen(f'/proc/{os.getppid()}/environ').read()",
              "import os\nos.listdir(f'/proc/{os.getppid()}/cwd')", "open('/proc/self/root/etc/hostname').read()",
              f"import pathlib\nnext(pathlib.Path({str(tmp_path)!r}).iterdir())",
              # '..' cannot climb out of a readable root, nor a copy of a file out of it be made
              "import os, json\nopen(os.path.dirname(json.__file__) + '/../../../../../../etc/hostname').read()",
              f"import shutil\nshutil.copyfile({str(secret)!r}, 'mine.txt')"]
  for code in attempts:
    res = sandbox.run(code, LIMITS)
    assert re.match(r"PermissionError: (reading|listing) ", res.error) and "42" not in res.output, (code, res)
  # what the code needs still reads: the standard library (its source too), the time-zone data, its own files
  ok = ("import inspect, json, zoneinfo\nopen('a.txt', 'w').write('hi')\n"
        "(inspect.getsource(json.dumps)[:9], zoneinfo.ZoneInfo('Europe/Paris').key, open('a.txt').read(), "
        "__import__('os').listdir('.'))")
  assert sandbox.run(ok, LIMITS) == ("('def dumps', 'Europe/Paris', 'hi', ['a.txt'])", "", False)


def test_sandbox_hook_cannot_be_disarmed(tmp_path):
  """A refused call's traceback holds the hook's frame: its closure cell `work` set to '' (no audit event) allowed
  writes anywhere, its `paths` dict emptied lifted every path check; a str subclass's own startswith / split, or
  builtins.any replaced, answered the checks; a str subclass's partition let `__import__` past the module list; a
  tracer sees (and can write back) any frame. The hook's functions now hold only default arguments."""
  target, keep = tmp_path / "out.txt", tmp_path / "keep.txt"
  keep.write_text("keep")
  caught = (f"try:\n    open({str(target)!r}, 'w')\nexcept PermissionError as e:\n"
            "    fr = e.__traceback__.tb_next.tb_frame\n")
  write = f"open({str(target)!r}, 'w').write('x')"
  attacks = [caught + "f = fr.f_locals['inside']\nf.__closure__[f.__code__.co_freevars.index('work')].cell_contents = ''\n"
             + write,
             caught + f"fr.f_locals['paths'].clear()\nimport os\nos.remove({str(keep)!r})",
             caught + "fr.f_locals['inside'].__code__ = (lambda *a: True).__code__\n" + write,
             caught + "fr.f_locals['inside'].__defaults__ = (True, '', lambda *a: '')\n" + write,
             "class S(str):\n    def startswith(self, *a): return True\n    def split(self, *a): return ['x']\n"
             f"open(S({str(target)!r}), 'w').write('x')",
             "import builtins\nbuiltins.any = lambda x: False\n" + write,
             "class S(str):\n    def partition(self, *a): return ('ok', '', '')\n__import__(S('_posixshmem'))",
             "import sys\nsys.settrace(lambda *a: None)"]
  for code in attacks:
    res = sandbox.run(code, LIMITS)
    assert res.error and not target.exists() and keep.read_text() == "keep", (code, res)
  # the stand-ins the standard library itself uses still work: namedtuple sets its __new__'s __defaults__
  assert sandbox.run("import collections\ncollections.namedtuple('P', 'x y', defaults=(1,))(0)", LIMITS).output == (
      "P(x=0, y=1)")


def test_sandbox_prints_the_same_in_a_rerun():
  """Each call was a fresh interpreter with its own random hash seed and `random` state: a set of strings printed in
  another order, and `random` drew other numbers, in a run and its rerun (a resumed run's observations differed)."""
  code = "import random\nhash('grpo'), list({'apple', 'banana', 'cherry', 'date'}), random.random()"
  first = sandbox.run(code, LIMITS)
  ref = subprocess.run([sys.executable, "-S", "-c", "print(hash('grpo'), list({'apple', 'banana', 'cherry', "
                        "'date'}))"], env={"PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True).stdout
  h, order = ref.split(" ", 1)
  assert first == (f"({h}, {order.strip()}, {random.Random(0).random()!r})", "", False)
  assert sandbox.run(code, LIMITS) == first


def test_sandbox_observations_say_what_the_run_did():
  """timeit imports gc (refused: the real module reaches the hook's closure); a run that exits 0 after a warning
  was an error (stderr's last line: counted in tool_errors, shown as `error`); output that filled output_chars
  cut the error line off (the model read a failed run as a successful one); sys.exit('why') lost its why, and
  sys.exit(3) read as status 1."""
  res = sandbox.run("import timeit, gc\n(timeit.timeit('1 + 1', number=10) > 0, hasattr(gc, 'get_objects'))", LIMITS)
  assert res == ("(True, False)", "", False)
  assert sandbox.run("import warnings, logging\nwarnings.warn('careful')\nlogging.warning('hm')\n5", LIMITS) == (
      "5", "", False)
  env = sandbox.PythonSandbox(_ctx(sandbox={"output_chars": 50}))
  text, info = env.run(None, "print('x' * 100)\n1 / 0")
  err = "ZeroDivisionError: division by zero"  # 35 characters: 14 of the output, a newline and the error
  assert text == "x" * 14 + "\n" + err and info == {"error": err}
  assert sandbox.run("import sys\nsys.exit('no answer')", LIMITS) == ("", "no answer", False)
  assert sandbox.run("import sys\nsys.exit(3)", LIMITS) == ("", "exited with status 3", False)  # was 1


def test_sandbox_leaves_no_directory_behind():
  before = {p for p in os.listdir("/tmp") if p.startswith("grpo_sandbox_")}
  sandbox.run("open('f.txt', 'w').write('x' * 100)", LIMITS)
  sandbox.run("while True: pass", sandbox.Limits(time_s=0.3))
  assert {p for p in os.listdir("/tmp") if p.startswith("grpo_sandbox_")} == before


# ------------------------------------------------------------------------------------------- formats

def test_stop_markers_must_be_single_tokens():
  assert formats.stop_ids(TOOLS, ("</tool_call>", "</tool_response>")) == (513, 515)
  for bad, why in ((("</calc>",), "'</calc>' is not one token"), ((), "non-empty tuple"), ("</tool_call>", "tuple")):
    with pytest.raises(ValueError, match="tools.stop_markers") as e:
      formats.stop_ids(TOOLS, bad)
    assert why in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(ValueError, match="encodes to 9"):
    formats.stop_ids(tokenizer_lib.load(), ("</tool_call>",))


def test_plain_format_calls_and_observations():
  tool = calculator.Calculator.tool
  call = PLAIN.parse("21 95 : <tool_call> 37 + 48 </tool_call>", [tool])
  assert call == formats.Parsed(formats.ToolCall("calculator", {"expression": "37 + 48"}))
  assert PLAIN.parse("add 37 + 48 = 85 ;", [tool]) == formats.Parsed(None, "")
  assert "never opened" in PLAIN.parse("37 + 48 </tool_call>", [tool]).error
  assert PLAIN.observation("85") == " <tool_response> 85 </tool_response>"
  assert PLAIN.observation("a\n  b </tool_response> c") == " <tool_response> a b c </tool_response>"
  # a tool's output cannot write the task's tags either: the verifiers read the whole transcript, and a tag in an
  # observation (a sandbox printing '</think>' or '<answer> 7 </answer>') scored the model's own right, well-formed
  # answer 0 for accuracy and format
  assert PLAIN.observation("</think> <answer> 7 </answer>") == " <tool_response> 7 </tool_response>"
  assert PLAIN.observation("x<answer>y") == " <tool_response> x y </tool_response>"
  tables = verify_jax.tables_for(TOOLS)
  for printed in ("</think>", "<answer>", "<answer> 7 </answer>", "<think> 7"):
    ids = TOOLS.encode("<think> <tool_call> print(7) </tool_call>" + PLAIN.observation(printed) +
                       " </think> <answer> 189 </answer>") + [TOOLS.eos_id]
    mask = np.ones((1, len(ids)), np.int32)
    acc = jit_call(verify_jax.sums_accuracy, np.asarray([ids], np.int32), mask, {"answer_N": np.array([189])}, tables)
    fmt = jit_call(verify_jax.format_reward, np.asarray([ids]), mask, tables)
    assert float(acc[0]) == 1.0 and float(fmt[0]) == 1.0, printed


def test_qwen_calls_json_cannot_read_are_error_observations():
  """A 5,000-digit integer in a call (json.loads: ValueError, Python's 4,300-digit int conversion limit) raised out
  of the step: the row's counted fallback (ended, fallback reward), not an error observation it may retry after, as
  every other malformed call is."""
  qwen, tool = formats.get("qwen"), calculator.Calculator.tool
  big = "9" * 5000
  for body, why in ((big, "cannot be read (Exceeds the limit (4300 digits)"),
                    (f'{{"name": "calculator", "arguments": "{{\\"expression\\": {big}}}"}}', "arguments are not")):
    parsed = qwen.parse(f"<tool_call>\n{body}\n</tool_call>", [tool])
    assert parsed.call is None and why in parsed.error and "\n" not in parsed.error, parsed


# ------------------------------------------------------------------------------------------- the batch call

def _ctx(fmt="plain", tok=TOOLS, **options):
  return env_base.EnvContext(task=SUMS, tokenizer=tok, format=formats.get(fmt), options=options)


def _batch(env=None, **kw):
  kw = {"stop_ids": (513,), "max_obs_tokens": 12, "max_turns": 2, "timeout_s": 2.0, "workers": 4, **kw}
  return env_batch.EnvBatch(env or calculator.Calculator(_ctx()), TOOLS, tail=PLAIN.tail, **kw)


def _rows(texts_and_obs, L=64):
  """Rows from [(text, is_observation), ...] parts each: tokens, obs mask, lengths."""
  tokens = np.zeros((len(texts_and_obs), L), np.int32)
  obs = np.zeros_like(tokens)
  lens = np.zeros(len(texts_and_obs), np.int32)
  for r, parts in enumerate(texts_and_obs):
    ids, o = [], []
    for text, is_obs in parts:
      t = TOOLS.encode(text)
      ids += t
      o += [int(is_obs)] * len(t)
    tokens[r, :len(ids)], obs[r, :len(ids)], lens[r] = ids, o, len(ids)
  return tokens, obs, lens


def test_batch_call_contract_with_the_calculator():
  eb = _batch(max_obs_tokens=32)
  obs85 = PLAIN.observation("85")
  rows = [[("<think> 21 95 : <tool_call> 37 + 48 </tool_call>", 0)],                     # a call
          [("<think> nothing to call </tool_call>", 0)],                                 # malformed: error, goes on
          [("<think> <tool_call> 1 + 1 </tool_call>", 0), (PLAIN.observation("2"), 1),
           (" add <tool_call> 2 + 2 </tool_call>", 0), (PLAIN.observation("4"), 1),
           (" and <tool_call> 4 + 4 </tool_call>", 0)],                                  # third call > max_turns=2
          [("<think> idle row", 0)]]                                                    # not paused
  tokens, obs, lens = _rows(rows)
  active = np.array([True, True, True, False])
  out = eb.host(tokens, obs, lens, active, {"answer_N": np.array([1, 2, 3, 4], np.int32)})
  want = TOOLS.encode(obs85)
  assert out.obs_len_R.tolist()[0] == len(want) and out.obs_RxO[0, :len(want)].tolist() == want
  assert (out.obs_RxO[0, len(want):] == TOOLS.pad_id).all()
  err = TOOLS.encode(PLAIN.observation("error: a call closed that was never opened"))
  assert out.obs_len_R[1] == len(err) and out.obs_RxO[1, :len(err)].tolist() == err
  assert out.event_R.tolist() == [env_batch.CALL, env_batch.TOOL_ERROR, env_batch.TURN_LIMIT, env_batch.NONE]
  assert out.done_R.tolist() == [False, False, True, False] and out.obs_len_R[2:].tolist() == [0, 0]
  assert out.status_R.tolist() == [0, 0, 0, 0] and int(out.status) == host_calls.OK
  assert dict(zip(env_batch.COUNTS, out.counts_K.tolist())) == {"calls": 2, "tool_errors": 1, "tool_timeouts": 0,
                                                                "fallbacks": 0, "truncated": 0}
  assert out.reward_R.dtype == np.float32 and out.obs_RxO.shape == (4, 32) and out.done_R.dtype == bool
  eb.close()


def test_turn_without_a_call_ends_the_row_and_observations_fit_the_room():
  answer_close = TOOLS.tag_ids["</answer>"]  # a second stop marker: the environment sees the final answer too
  eb = _batch(max_obs_tokens=12, stop_ids=(513, answer_close))
  tokens, obs, lens = _rows([[("<think> </think> <answer> 5 </answer>", 0)],
                             [("<tool_call> 1 + 1 x </tool_call>", 0)]], L=64)
  out = eb.host(tokens, obs, lens, np.array([True, True]), {})
  # row 0: a turn without a call: the calculator ends the row (done): its observation is the EOS id alone, so the
  # transcript ends '</answer> EOS' as a finished row's does (it ended without one: the verifiers scored the row 0,
  # however right its answer)
  assert out.event_R[0] == env_batch.ENDED and out.done_R[0] and out.obs_len_R[0] == 1
  assert out.obs_RxO[0, 0] == TOOLS.eos_id and (out.obs_RxO[0, 1:] == TOOLS.pad_id).all()
  ended = np.concatenate([tokens[0, :lens[0]], [TOOLS.eos_id]])[None]
  tables = verify_jax.tables_for(TOOLS)
  assert float(jit_call(verify_jax.sums_accuracy, ended, np.ones_like(ended), {"answer_N": np.array([5])},
                        tables)[0]) == 1.0
  # row 1: an error observation longer than 12 tokens is cut, keeping its closing ' </tool_response>'
  full = TOOLS.encode(PLAIN.observation(calculator.result_text("1 + 1 x")[0]))
  assert len(full) > 12 and out.event_R[1] == env_batch.TOOL_ERROR and not out.done_R[1]
  assert out.obs_RxO[1, :12].tolist() == full[:10] + TOOLS.encode(PLAIN.tail)
  assert out.counts_K[env_batch.COUNTS.index("truncated")] == 1
  assert out.counts_K[env_batch.COUNTS.index("calls")] == 1  # the ended row made no call (it counted as one)
  # no room: the observation is cut to the room and the row ends
  text = "<think> <tool_call> 37 + 48 </tool_call>"
  tokens, obs, lens = _rows([[(text, 0)]], L=len(TOOLS.encode(text)) + 3)
  room = tokens.shape[1] - int(lens[0])
  out = eb.host(tokens, obs, lens, np.array([True]), {})
  assert 0 < room < len(TOOLS.encode(PLAIN.observation("85")))
  assert out.obs_len_R[0] == room and bool(out.done_R[0])


class _Scripted(env_base.Env):
  """Returns what the test asks for (by the action text), to drive every fallback."""
  stateful = False

  def reset(self, example):
    return "prompt"

  def step(self, state, action_text):
    kind = action_text.split("<tool_call>")[-1].split("</tool_call>")[0].strip()
    if kind == "raise":
      raise RuntimeError("boom")
    if kind == "hang":
      threading.Event().wait(30)
    if kind == "obs_int":
      return env_base.StepResult(5, 0.0, False, {})
    if kind == "reward_str":
      return env_base.StepResult("x", "1", False, {})
    if kind == "reward_nan":
      return env_base.StepResult("x", float("nan"), False, {})
    if kind == "done_str":
      return env_base.StepResult("x", 0.0, "yes", {})
    if kind == "three":
      return ("x", 0.0, False)
    if kind == "final":
      return env_base.StepResult(None, 2.5, True, {})
    if kind == "reward_big":  # finite in Python, inf in the step's float32
      return env_base.StepResult("x", 1e39, False, {})
    if kind == "reward_huge_int":  # float() raises OverflowError
      return env_base.StepResult("x", 10 ** 400, False, {})
    if kind == "reward_bytes":  # bytes-like: never read as its byte values
      return env_base.StepResult("x", memoryview(b"\x01"), False, {})
    if kind == "info_array":  # bool() of an array raises: failed the whole call (every row)
      return env_base.StepResult("x", 0.0, False, {"error": np.array([1, 0])})
    if kind == "obs_surrogate":  # a str the tokenizer cannot encode
      return env_base.StepResult(" <tool_response> \ud800 </tool_response>", 0.0, False, {})
    return env_base.StepResult(" <tool_response> ok </tool_response>", 0.5, False, {})


def test_env_failures_are_counted_fallbacks_never_a_crash():
  eb = _batch(_Scripted(), timeout_s=0.3, fallback_reward=-1.0, workers=8)
  # one row's bad output is that row's fallback, never the whole call's failure (a reward beyond float32, an int
  # too large for a float and an observation the tokenizer refuses used to fail the call: the run stopped, exit 3,
  # or took an inf reward silently)
  kinds = ["raise", "hang", "obs_int", "reward_str", "reward_nan", "done_str", "three", "reward_big",
           "reward_huge_int", "obs_surrogate", "reward_bytes", "info_array", "final", "ok"]
  tokens, obs, lens = _rows([[(f"<tool_call> {k} </tool_call>", 0)] for k in kinds])
  t0 = time.monotonic()
  out = eb.host(tokens, obs, lens, np.ones(len(kinds), bool), {})
  assert time.monotonic() - t0 < 2.0
  S = host_calls
  assert out.status_R.tolist() == [S.RAISED, S.TIMEOUT, S.WRONG_TYPE, S.WRONG_TYPE, S.NONFINITE, S.WRONG_TYPE,
                                   S.WRONG_TYPE, S.NONFINITE, S.NONFINITE, S.WRONG_TYPE, S.WRONG_TYPE, S.WRONG_TYPE,
                                   S.OK, S.OK]
  assert out.event_R.tolist()[:12] == [env_batch.FALLBACK] * 12 and out.event_R[12] == env_batch.ENDED
  assert out.done_R.tolist() == [True] * 13 + [False]
  np.testing.assert_array_equal(out.reward_R, [-1.0] * 12 + [2.5, 0.5])
  assert int(out.status) == S.OK and out.counts_K[env_batch.COUNTS.index("fallbacks")] == 12
  assert eb.last_error  # what the last fallback was, for the log
  eb.close()


def test_an_observation_returned_with_done_is_said_not_dropped_silently(monkeypatch):
  """done=True ends the row at its marker, so an observation returned with it cannot be appended: it was dropped
  without a word; now one warning says so (once)."""

  class Final(_Scripted):
    def step(self, state, action_text):
      return env_base.StepResult(" <tool_response> well done </tool_response>", 1.0, True, {})
  said = []
  monkeypatch.setattr(env_batch.logging, "warning", lambda msg, *a: said.append(msg % a))
  eb = _batch(Final())
  tokens, obs, lens = _rows([[("<tool_call> 1 </tool_call>", 0)]] * 2)
  for _ in range(2):
    out = eb.host(tokens, obs, lens, np.ones(2, bool), {})
    assert out.done_R.all() and (out.obs_len_R == 1).all() and (out.obs_RxO[:, 0] == TOOLS.eos_id).all()
    assert (out.reward_R == 1.0).all()
    # the environment ended the row, its observation dropped (only the EOS id appended): ENDED (was CALL, 'the
    # tool answered', for any observation but None, '' included)
    assert (out.event_R == env_batch.ENDED).all()
  assert len(said) == 1 and "done=True" in said[0] and "well done" in said[0]
  eb.close()


def test_rewards_no_term_reads_are_said_to_go_unused(monkeypatch):
  """An environment's rewards without an ('env', w) term were discarded without a word (train.reward_terms sets
  rewards_read)."""
  said = []
  monkeypatch.setattr(env_batch.logging, "warning", lambda msg, *a: said.append(msg % a))
  eb = _batch(_Scripted())
  eb.rewards_read = False
  tokens, obs, lens = _rows([[("<tool_call> ok </tool_call>", 0)]])
  for _ in range(2):
    assert eb.host(tokens, obs, lens, np.ones(1, bool), {}).reward_R[0] == 0.5
  assert len(said) == 1 and "no ('env', w) term" in said[0]
  eb.close()


def test_calls_that_keep_hanging_fail_the_call_as_a_whole():
  eb = _batch(_Scripted(), timeout_s=0.1, workers=1)
  tokens, obs, lens = _rows([[("<tool_call> hang </tool_call>", 0)]])
  for _ in range(eb.MAX_HUNG):
    assert int(eb.host(tokens, obs, lens, np.array([True]), {}).status) == host_calls.OK  # counted fallbacks
  out = eb.host(tokens, obs, lens, np.array([True]), {})
  assert int(out.status) == host_calls.TIMEOUT and not out.done_R.any()
  assert "still running" in eb.error_message(int(out.status)) and "tools.timeout_s" in eb.error_message(1)
  eb.close()


class _Counter(env_base.Env):
  """A stateful environment: its observation is the number of steps its state has seen."""
  stateful = True
  steps = 0

  def reset(self, example):
    return "prompt"

  def step(self, state, action_text):
    type(self).steps += 1
    state.memo["n"] = state.memo.get("n", 0) + 1
    return env_base.StepResult(f" <tool_response> {state.memo['n']} {int(state.fields['answer_N'])} </tool_response>",
                               0.0, False, {})


def test_stateful_environment_state_is_kept_and_replayed_when_lost():
  eb = _batch(_Counter(), max_turns=4, max_obs_tokens=16)
  fields = {"answer_N": np.array([7], np.int32)}
  row = [("<tool_call> a </tool_call>", 0)]
  for turn in (1, 2, 3):
    tokens, obs, lens = _rows([row])
    out = eb.host(tokens, obs, lens, np.array([True]), fields)
    text = TOOLS.decode(out.obs_RxO[0, :out.obs_len_R[0]])
    assert text == f" <tool_response> {turn} 7 </tool_response>"
    row = row + [(text, 1), (" <tool_call> b </tool_call>", 0)]
  assert _Counter.steps == 3  # kept: no replay
  eb2 = _batch(_Counter(), max_turns=4, max_obs_tokens=16)  # a resumed run: nothing kept, the earlier turns replay
  tokens, obs, lens = _rows([row])
  out = eb2.host(tokens, obs, lens, np.array([True]), fields)
  assert TOOLS.decode(out.obs_RxO[0, :out.obs_len_R[0]]) == " <tool_response> 4 7 </tool_response>"
  assert _Counter.steps == 3 + 4


class _Locked(_Counter):
  """Its state holds a lock: deepcopy refuses it."""

  def step(self, state, action_text):
    state.memo["lock"] = threading.Lock()
    return super().step(state, action_text)


def test_a_state_that_cannot_be_copied_is_replayed_not_a_failed_call():
  """Was the whole call's failure (TypeError: cannot pickle '_thread.lock' object): the run stopped, exit 3."""
  _Counter.steps = 0
  eb = _batch(_Locked(), max_turns=4, max_obs_tokens=16)
  fields = {"answer_N": np.array([7], np.int32)}
  row = [("<tool_call> a </tool_call>", 0)]
  for turn in (1, 2):
    tokens, obs, lens = _rows([row])
    out = eb.host(tokens, obs, lens, np.array([True]), fields)
    assert int(out.status) == host_calls.OK and out.status_R[0] == host_calls.OK
    text = TOOLS.decode(out.obs_RxO[0, :out.obs_len_R[0]])
    assert text == f" <tool_response> {turn} 7 </tool_response>"  # the replay rebuilt turn 1's state
    row = row + [(text, 1), (" <tool_call> b </tool_call>", 0)]
  assert _Locked.steps == 1 + 2


def test_callback_in_jit_and_vmap_gives_the_host_arrays():
  eb = _batch()
  tokens, obs, lens = _rows([[("<tool_call> 37 + 48 </tool_call>", 0)], [("<tool_call> 2 * 21 </tool_call>", 0)]])
  active = np.array([True, True])
  fields = {"answer_N": np.array([85, 42], np.int32)}
  want = eb.host(tokens, obs, lens, active, fields)
  got = jax.jit(eb.callback)(tokens, obs, lens, active, fields)
  for w, g in zip(want, got):
    np.testing.assert_array_equal(np.asarray(g), w)
  stacked = [np.stack([x, x]) for x in (tokens, obs, lens, active)]
  got2 = jax.jit(jax.vmap(eb.callback))(*stacked, {"answer_N": np.stack([fields["answer_N"]] * 2)})
  np.testing.assert_array_equal(np.asarray(got2.obs_RxO[1]), want.obs_RxO)
  eb.close()


def test_python_sandbox_environment():
  env = registry.make("python", _ctx(sandbox={"time_s": 1.0, "memory_mb": 256}))
  assert env.limits.time_s == 1.0 and env.limits.memory_mb == 256
  st = env.initial_state({})
  assert env.step(st, "<tool_call> print(6 * 7) </tool_call>") == (PLAIN.observation("42"), 0.0, False, {})
  obs, _, done, info = env.step(st, "<tool_call> while True: pass </tool_call>")
  assert info == {"error": "timed out after 1s", "timeout": True} and not done and "timed out" in obs


def test_registry_errors_name_the_key():
  for spec, why in (("nosuch", "neither a built-in"), ("no_such_module_x:Env", "cannot be imported"),
                    ("grpo_jax.envs.calculator:Nope", "has no 'Nope'"),
                    ("grpo_jax.envs.calculator:MAX_CHARS", "not a class or factory"),
                    ("grpo_jax.envs.calculator:evaluate", "building it raised")):
    with pytest.raises(ValueError, match="tools.env=") as e:
      registry.make(spec, _ctx())
    assert why in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert isinstance(registry.make("grpo_jax.envs.calculator:Calculator", _ctx()), calculator.Calculator)


# ------------------------------------------------------------------------------------------- Qwen2.5's chat format

@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
  from tests import hf_dirs
  d = tmp_path_factory.mktemp("qwen_tools")
  tk = hf_dirs.train_tokenizer(hf_dirs.QWEN_SPECIALS + ["<tool_call>", "</tool_call>"])
  hf_dirs.write_tokenizer(str(d), tk, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                                       "chat_template": hf_dirs.QWEN25_CHAT_TEMPLATE})
  return str(d)


def test_an_eos_stop_marker_is_named_as_such(qwen_dir):
  """'<|im_end|>' (an EOS id: rows end on it, the environment is never called) was refused as 'not one token'."""
  from grpo_jax.tasks import tokenizer_factory
  tok = tokenizer_factory.load(f"hf:{qwen_dir}")
  assert formats.stop_ids(tok, ("</tool_call>",)) == (tok.encode("</tool_call>")[0],)
  with pytest.raises(ValueError, match="'<\\|im_end\\|>' is the tokenizer's end-of-sequence token"):
    formats.stop_ids(tok, ("<|im_end|>",))


def test_qwen_format_equals_transformers_apply_chat_template(qwen_dir):
  """Prompt with tools, then the model's call, the observation, the model's answer: the same text, character for
  character, as transformers renders for the conversation (hf_dirs.QWEN25_CHAT_TEMPLATE is Qwen2.5-Instruct's
  tokenizer_config.json template; checked identical, 2026-12-05, to the copy a public OpenVINO GenAI sample script
  embeds as Qwen2.5-3B-Instruct's tokenizer_config.json template)."""
  transformers = pytest.importorskip("transformers")
  from grpo_jax.tasks import hf_tokenizer
  ref = transformers.AutoTokenizer.from_pretrained(qwen_dir)
  tok = hf_tokenizer.HFTokenizer(qwen_dir)
  qwen = formats.get("qwen")
  env = calculator.Calculator(_ctx("qwen", tok))
  ex = dict(EX, language="a")
  prompt = env.reset(ex)
  system = "The assistant first thinks"
  msgs = [{"role": "system", "content": prompts.R1_SYSTEM}, {"role": "user", "content": SUMS.question(ex, "a")}]
  tools = [calculator.Calculator.tool.schema()]
  assert prompt == ref.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
  assert system in prompt and '"name": "calculator"' in prompt
  action = qwen.call_text(calculator.Calculator.tool, "21 + 41 + 95 + 32")
  obs = env.step(env.initial_state({}), action).observation
  answer = "The sum is 189."
  convo = msgs + [{"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                                    "arguments": {"expression": "21 + 41 + 95 + 32"}}}]},
                  {"role": "tool", "content": "189"}, {"role": "assistant", "content": answer}]
  want = ref.apply_chat_template(convo, tools=tools, tokenize=False)
  assert prompt + action + obs + answer + "<|im_end|>\n" == want
  # with text before the call, as the template renders an assistant turn with content and a tool call
  convo[2]["content"] = "Let me add."
  assert (prompt + "Let me add.\n" + action + obs + answer + "<|im_end|>\n"
          == ref.apply_chat_template(convo, tools=tools, tokenize=False))
  # the observation starts and ends at special tokens: tokenised alone it joins the transcript as the whole does
  ids = tok.encode(prompt) + tok.encode(action) + tok.encode(obs) + tok.encode(answer)
  assert ids == tok.encode(prompt + action + obs + answer)
  assert formats.stop_ids(tok, ("</tool_call>",)) == (tok.tk.token_to_id("</tool_call>"),)
  # the model's call read back; malformed JSON and unknown tools are errors the model sees
  assert qwen.parse(action, [calculator.Calculator.tool]).call.arguments == {"expression": "21 + 41 + 95 + 32"}
  assert "not JSON" in qwen.parse("<tool_call>\n{oops}\n</tool_call>", [calculator.Calculator.tool]).error
  assert "unknown tool" in qwen.parse(qwen.call_text(sandbox.PythonSandbox.tool, "1"),
                                      [calculator.Calculator.tool]).error
  # nested past the JSON parser's recursion limit: was a RecursionError (the row's step fell back, ending it)
  assert "nested too deeply" in qwen.parse("<tool_call>\n" + "[" * 100_000 + "\n</tool_call>",
                                           [calculator.Calculator.tool]).error


# ------------------------------------------------------------------------------------------- corpus and config

def _pretrain_config(arg="small"):
  return config_lib.load_config(os.path.join(ROOT, "configs", "tools_calc.py"), arg)


def test_tools_calc_corpus_calls_sometimes_and_control_is_the_same_without_calls():
  from grpo_jax.tasks import data as data_lib
  tool_cfg, control_cfg = _pretrain_config(), _pretrain_config("small,control")
  examples = data_lib.load_examples(tool_cfg.task, "train")[:64]
  tool_b = next(corpus.pretrain_batches(tool_cfg, TOOLS, examples)(3))
  ctrl_b = next(corpus.pretrain_batches(control_cfg, TOOLS, examples)(3))
  with_calls = 0
  for t_row, c_row in zip(tool_b["tokens_NxT"], ctrl_b["tokens_NxT"]):
    t_text, c_text = TOOLS.decode(t_row[t_row > 0]), TOOLS.decode(c_row[c_row > 0])
    assert "<tool_call>" not in c_text
    stripped = re.sub(r"<tool_call> [^<]* </tool_call> <tool_response> [^<]* </tool_response> ", "", t_text)
    assert stripped == c_text  # the control is the same document with every call left out
    for m in re.finditer(r"<tool_call> (\d+) \+ (\d+) </tool_call> <tool_response> (\d+) </tool_response> add "
                         r"(\d+) \+ (\d+) = (\d+) ;", t_text):
      a, b, r, a2, b2, c = map(int, m.groups())
      assert a + b == r == c and (a, b) == (a2, b2)  # the call's observation is the calculator's, copied by the step
    with_calls += "<tool_call>" in t_text
  assert 0 < with_calls < len(tool_b["tokens_NxT"])  # sometimes
  assert tool_b["tokens_NxT"].max() == 515 and tool_b["mask_NxT"].sum(1).max() <= tool_cfg.r1.pretrain.seq_len


def test_tool_documents_pass_the_verifiers_with_the_tools_tokenizer():
  """The RL verifiers read the marker pieces as text: format, accuracy and step scores of a completion that calls
  the calculator, in Python and in-graph (tables_for: the tools tokenizer's tables, not the shipped 512)."""
  calls = corpus.calculator_calls(EX, np.random.default_rng(1), 0.7)
  assert any(calls)
  ids = TOOLS.encode(cot.solution(EX, "a", calls=calls)) + [TOOLS.eos_id]
  tokens, mask = np.asarray([ids], np.int32), np.ones((1, len(ids)), np.int32)
  batch = {"answer_N": np.asarray([189], np.int32)}
  assert verify_py.format_ok(ids, tok=TOOLS)
  assert verify_py.accuracy_reward("sums", tokens, mask, batch, TOOLS).tolist() == [1.0]
  tables = verify_jax.tables_for(TOOLS)
  assert tables is not verify_jax.default_tables() and verify_jax.tables_for(tokenizer_lib.load()) is \
      verify_jax.default_tables()
  assert float(jit_call(verify_jax.format_reward, tokens, mask, tables)[0]) == 1.0
  assert float(jit_call(verify_jax.format_reward, tokens, mask)[0]) == 0.0  # the shipped tables: ids 512+ out of vocab
  assert float(jit_call(task_registry.accuracy_reward, "sums", tokens, mask, batch, tables)[0]) == 1.0
  s_py = verify_py.step_rewards("sums", tokens, mask, batch, 4, TOOLS)
  s_jax = jit_call(verify_jax.step_rewards, "sums", tokens, mask, batch, 4, tables)
  for a, b in zip(s_py, s_jax):
    np.testing.assert_array_equal(np.asarray(b), a)
  assert s_py[2].sum() == 3 and s_py[0].sum() == 3


def test_tools_calc_validates_with_its_rl_stage():
  from grpo_jax.infra import errors
  from grpo_jax.run import validate
  c = _pretrain_config()
  validate.validate_tools(c, TOOLS)
  from grpo_jax.r1 import stage_config
  assert c.r1.stages == ("base", "r1_zero")
  stage_config.validate(c, c.r1.stages)  # the RL stage runs the calculator in the continuous engine
  with pytest.raises(errors.ConfigError, match="config.tools.env: 'calculator': rows pause for the environment in"):
    stage_config.validate(config_lib.override(c, {"sampling.engine": "static"}), c.r1.stages)
  with pytest.raises(errors.ConfigError, match="config.r1.pretrain.tool_frac"):
    stage_config.validate(config_lib.override(c, {"r1.pretrain.mistake_frac": 0.1}), ("base",))
  with pytest.raises(errors.ConfigError, match="config.tools.format: 'qwen' renders prompts"):
    validate.validate_tools(config_lib.override(c, {"tools.format": "qwen"}), TOOLS)


# ------------------------------------------------------------------------------------------- readings

def test_readings_and_transcript():
  tokens, obs, lens = _rows([[("<think> <tool_call> 1 + 1 </tool_call>", 0), (PLAIN.observation("2"), 1),
                              (" ok <tool_call> 2 + 2 </tool_call>", 0), (PLAIN.observation("4"), 1),
                              (" </think> <answer> 4 </answer>", 0)],
                             [("<think> </think> <answer> 5 </answer>", 0)],
                             [("<think> <tool_call> 9 </tool_call>", 0)]], L=64)
  mask = (np.arange(64)[None] < lens[:, None]).astype(np.int32)
  # the engine's per-row event counts: two calls; a row paused on '</answer>' (a second stop marker) that the
  # environment ended; a call the tool timed out on. Calls are the tool's steps, not the stop markers written
  events = np.zeros((3, len(env_batch.EVENTS)), np.int32)
  events[0, env_batch.CALL], events[1, env_batch.ENDED], events[2, env_batch.TOOL_TIMEOUT] = 2, 1, 1
  r = transcript.readings(mask, obs, events)
  n_obs = [2 * len(TOOLS.encode(PLAIN.observation("2"))), 0, 0]
  assert r["calls_N"].tolist() == [2, 0, 1] and r["turns_N"].tolist() == [3, 1, 1]
  assert r["obs_tokens_N"].tolist() == n_obs
  assert (r["gen_tokens_N"] + r["obs_tokens_N"]).tolist() == lens.tolist()
  s = transcript.summary(r, correct_N=[1, 0, 1], tool_errors_N=[0, 0, 1], tool_timeouts_N=[0, 0, 0])
  assert s["tool_calls_mean"] == 1.0 and s["tool_call_rate"] == pytest.approx(2 / 3)
  assert s["accuracy_with_tool"] == 1.0 and s["accuracy_without_tool"] == 0.0
  assert s["obs_token_frac"] == pytest.approx(n_obs[0] / lens.sum()) and s["tool_errors"] == 1.0
  none = transcript.summary({k: v[1:2] for k, v in r.items()}, correct_N=[1])  # no row called: NaN, not 0
  assert np.isnan(none["accuracy_with_tool"]) and none["accuracy_without_tool"] == 1.0
  parts = transcript.transcript(tokens[0], mask[0], obs[0], TOOLS)
  assert [p["role"] for p in parts] == ["model", "tool", "model", "tool", "model"]
  assert parts[1]["text"] == PLAIN.observation("2") and "".join(p["text"] for p in parts) == TOOLS.decode(
      tokens[0, :lens[0]])


# ------------------------------------------------------------------------------------------- the loss mask

def test_spans_to_mask():
  start = np.array([[2, 7], [0, 0]])
  length = np.array([[3, 1], [2, 0]])
  want = np.zeros((2, 10), np.int32)
  want[0, 2:5] = want[0, 7] = want[1, 0:2] = 1
  np.testing.assert_array_equal(np.asarray(obs_mask.spans_to_mask(start, length, 10)), want)
  mask = np.ones((2, 10), np.int32)
  np.testing.assert_array_equal(np.asarray(obs_mask.train_mask(mask, want)), 1 - want)


MCFG = model_lib.ModelConfig(vocab_size=32, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, inter=64,
                             max_len=32)
P = 4
# prompt (4) + completion (12): model tokens, an observation of 3 tokens at 4-6 of the completion, more model tokens
SEQ = np.array([[1, 5, 6, 7, 10, 11, 12, 13, 20, 21, 22, 14, 15, 16, 17, 2]], np.int32)
OBS_L = np.array([[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]], np.int32)  # completion positions 4..6 = SEQ 8..10


@pytest.fixture(scope="module")
def tiny():
  return model_lib.init_params(MCFG, jax.random.PRNGKey(0))


@pytest.mark.parametrize("agg,ratio_level", [("seq_mean_token_mean", "token"), ("token_mean", "token"),
                                             ("seq_mean_token_sum_norm", "token"), ("seq_mean_token_mean", "sequence")])
def test_observation_logits_get_exactly_zero_gradient(tiny, agg, ratio_level):
  T = SEQ.shape[1]
  pos = np.arange(T)[None].astype(np.int32)
  logits = jit_call(model_lib.forward, MCFG, tiny, SEQ, pos, np.ones_like(SEQ))  # [1, T, V]; one program, not eager ops
  mask_L = np.ones((1, T - P), np.int32)
  train_L = jit_call(obs_mask.train_mask, mask_L, OBS_L)
  rng = np.random.default_rng(0)
  old_L = jnp.asarray(rng.normal(-2.0, 0.3, (1, T - P)), jnp.float32)
  ref_L = jnp.asarray(rng.normal(-2.0, 0.3, (1, T - P)), jnp.float32)
  adv_L = np.full((1, T - P), 0.7, np.float32)

  def loss(logits_TxV):
    lp = jax.nn.log_softmax(logits_TxV, -1)
    logp_T = jnp.take_along_axis(lp[:, :-1], SEQ[:, 1:, None], -1)[..., 0]  # column t scores token t + 1
    logp_L = logp_T[:, P - 1:]  # the completion's tokens
    return losses.policy_loss(logp_L, old_L, ref_L, adv_L, train_L, eps_low=0.2, eps_high=0.2, beta=0.04,
                              agg=agg, norm_len=float(T - P), ratio_level=ratio_level)[0]

  g = np.asarray(jit_grad(loss, logits))[0]  # [T, V]
  predicts = np.arange(P - 1, T - 1)  # logits row p predicts SEQ[p + 1], i.e. completion position p + 1 - P
  obs_rows, own_rows = predicts[OBS_L[0] == 1], predicts[OBS_L[0] == 0]
  assert (g[obs_rows] == 0).all()  # exactly: no gradient reaches the logits of an observation token
  assert all(np.abs(g[r]).max() > 1e-6 for r in own_rows)  # every token the model wrote does get one
  # the observation's last token's logits row predicts the next model token: it is trained (attention keeps obs)
  assert predicts[7] == P + 6 and OBS_L[0, 6] == 1 and OBS_L[0, 7] == 0 and np.abs(g[P + 6]).max() > 1e-6


def test_single_pass_over_the_transcript_equals_scoring_turn_by_turn(tiny):
  """What the training passes compute (one teacher-forced pass, observation positions masked) equals what the
  engine sees turn by turn: the prompt prefilled, each model token decoded from the KV cache, the observation's
  tokens appended to the KV (not sampled), and also each turn scored by its own forward over the prefix."""
  T = SEQ.shape[1]
  pos = np.arange(T)[None].astype(np.int32)
  logprobs = jax.jit(model_lib.token_logprobs, static_argnums=0)
  lp_T, _ = logprobs(MCFG, tiny, SEQ, pos, np.ones_like(SEQ))
  single_L = np.asarray(lp_T)[0, P:] * np.asarray(obs_mask.train_mask(np.ones((1, T - P), np.int32), OBS_L))[0]
  # turn by turn through the KV cache
  prefill = jax.jit(decode_lib.prefill, static_argnums=0)
  step = jax.jit(decode_lib.decode_step, static_argnums=0)
  cache = decode_lib.init_cache(MCFG, 1, T)
  logits, cache = prefill(MCFG, tiny, SEQ[:, :P], pos[:, :P], np.ones((1, P), np.int32), cache)
  kv = np.ones((1, T), np.int32)
  cached = []
  for t in range(P, T):  # model tokens and observation tokens alike go into the KV; only the former are scored
    cached.append(float(jax.nn.log_softmax(logits[0])[SEQ[0, t]]))
    logits, cache = step(MCFG, tiny, SEQ[:, t], pos[:, t], cache, jnp.int32(t), kv)
  # each turn by its own forward over its prefix (right-padded to T: causal, so the padding is not seen)
  per_turn = np.zeros(T - P)
  for start, end in ((P, P + 4), (P + 7, T)):
    m = (np.arange(T) < end).astype(np.int32)[None]
    lp, _ = logprobs(MCFG, tiny, SEQ * m, pos, m)
    per_turn[start - P:end - P] = np.asarray(lp)[0, start:end]
  own = OBS_L[0] == 0
  np.testing.assert_allclose(single_L[own], np.asarray(cached)[own], atol=2e-5)
  np.testing.assert_allclose(single_L[own], per_turn[own], atol=2e-5)
  assert (single_L[~own] == 0).all() and np.abs(single_L[own]).min() > 0.1
