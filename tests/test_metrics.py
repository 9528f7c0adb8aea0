"""Metric-name table, MetricWriter (jsonl format, resume truncation, TensorBoard, progress, samples) and plots."""

import glob
import json
import math
import os
import re
import struct
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib import image as mpl_image
from tensorboardX.proto import event_pb2

import grpo_jax

from grpo_jax.run import metrics as metrics_lib
from grpo_jax.run import plots


def _rows(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def _writer(workdir, **kw):
  kw.setdefault('use_tensorboard', False)
  return metrics_lib.MetricWriter(str(workdir), **kw)


# ---------------------------------------------------------------- names

@pytest.mark.parametrize('name', ['train/reward_mean', 'train/reward/format', 'train/reward/math_accuracy',
                                  'eval/pass@1', 'eval/pass@16', 'eval/cons@8', 'perf/tokens_per_s'])
def test_known_names(name):
  assert metrics_lib.is_known(name)


@pytest.mark.parametrize('name', ['train/reward_meanx', 'train/reward/', 'eval/pass@0', 'eval/pass@k',
                                  'eval/pass@8x', 'train/foo', 'step', 'reward_mean', 'perf/step_time'])
def test_unknown_names_raise(tmp_path, name):
  assert not metrics_lib.is_known(name)
  with _writer(tmp_path) as w:
    with pytest.raises(ValueError, match=re.escape(repr(name)) + '.*add it there'):
      w.write(0, {name: 1.0})


def test_metric_literals_in_package_are_all_defined():
  """Every 'train/…', 'eval/…', 'perf/…' string the package writes is in the table (f-string holes -> '1')."""
  pkg = os.path.dirname(grpo_jax.__file__)
  found = set()
  for path in glob.glob(os.path.join(pkg, '**', '*.py'), recursive=True):
    if path.endswith(('metrics.py', 'plots.py')):
      continue
    with open(path, encoding='utf-8') as f:
      source = f.read()
    for literal in re.findall(r'''["']((?:train|eval|perf)/[^"'\s]*)["']''', source):
      if literal.endswith('/'):
        continue  # a bare prefix (k.startswith('eval/')) names a family of keys, not a metric
      if re.fullmatch(r'(train|eval|perf)/\{[^}]*\}', literal):
        continue  # f"train/{k}" over a list of names: those names are checked where they are listed
      # 'train/x@tail' is the sweep report's reference to metric train/x reduced over its rows: check the metric.
      found.add(re.sub(r'\{[^}]*\}', '1', literal.split('@')[0]))
  unknown = sorted(n for n in found if not metrics_lib.is_known(n))
  assert not unknown, f'add these to grpo_jax/run/metrics.py METRICS: {unknown}'


def test_every_defined_name_is_written_by_the_package():
  """The other direction: every METRICS name is something the package writes — its full literal, or (names built as
  f"train/{k}" over a list, e.g. update._REPORTED) its last part as a quoted literal; templates (<term>) by their
  fixed prefix. A name nothing writes must be removed from the table (or written)."""
  pkg = os.path.dirname(grpo_jax.__file__)
  source = ''
  for path in glob.glob(os.path.join(pkg, '**', '*.py'), recursive=True):
    if not path.endswith(('metrics.py', 'plots.py')):
      with open(path, encoding='utf-8') as f:
        source += f.read()
  literals = set(re.findall(r"""["']([^"'\s]+)["']""", source))
  fstring_heads = set(re.findall(r"""f["']([^"'{]*)\{""", source))
  missing = []
  for name in metrics_lib.METRICS:
    if '<' in name:
      prefix = name[:name.index('<')]
      short = prefix.split('/', 1)[1]  # written as f"pass@{k}" and prefixed with 'eval/' where it is logged
      ok = bool({prefix, short} & fstring_heads) or any(lit.startswith(prefix) for lit in literals)
    else:
      ok = name in literals or name.split('/', 1)[1] in literals or name.split('/')[-1] in literals
    if not ok:
      missing.append(name)
  assert not missing, f'METRICS lists names nothing in grpo_jax writes: {missing}'


def test_markdown_table_lists_every_name():
  table = metrics_lib.markdown_table()
  lines = table.strip().split('\n')
  assert lines[:2] == ['| Metric | Meaning |', '|---|---|']
  assert len(lines) == len(metrics_lib.METRICS) + 2
  for name in metrics_lib.METRICS:
    assert f'| `{name}` |' in table
  assert all(line.count('|') == 3 for line in lines)  # no stray pipes from descriptions


# ---------------------------------------------------------------- writer

def test_row_format(tmp_path):
  with _writer(tmp_path) as w:
    w.write(np.int64(3), {'train/reward_mean': jnp.float32(0.25), 'train/kl': np.array([float('nan')]),
                          'train/skipped_updates': jnp.int32(2), 'perf/step_time_s': 1.5,
                          'train/grad_norm': float('inf'), 'train/adv_abs_max': -np.inf,
                          'eval/pass@4': np.float64(1 / 3), 'train/loss': jnp.bfloat16(0.5)})
  line = open(tmp_path / 'metrics.jsonl', encoding='utf-8').read()
  assert line.endswith('\n') and line.count('\n') == 1
  row = json.loads(line)  # strict JSON: no bare NaN/Infinity
  assert 'NaN' not in line and 'Infinity' not in line
  assert list(row) == ['step', 'eval/pass@4', 'perf/step_time_s', 'train/adv_abs_max', 'train/grad_norm',
                       'train/kl', 'train/loss', 'train/reward_mean', 'train/skipped_updates']
  assert row['step'] == 3 and row['train/skipped_updates'] == 2 and isinstance(row['train/skipped_updates'], int)
  assert row['train/reward_mean'] == 0.25 and row['eval/pass@4'] == 1 / 3 and row['train/loss'] == 0.5
  assert (row['train/kl'], row['train/grad_norm'], row['train/adv_abs_max']) == ('nan', 'inf', '-inf')
  back = metrics_lib.read_metrics(str(tmp_path))[0]
  assert math.isnan(back['train/kl']) and back['train/grad_norm'] == math.inf and back['train/adv_abs_max'] == -math.inf


def test_counts_are_json_integers_whatever_dtype_the_step_used(tmp_path):
  """The train loops hand the writer float32 sums (and Python floats): a count must still read back as an int; a
  mean is still a float even when whole; a non-whole count is a bug and names itself; NaN stays "nan"."""
  with _writer(tmp_path) as w:
    w.write(1, {'train/tokens': jnp.float32(1531.0), 'train/skipped_updates': 0.0, 'config_change/optim.lr': 1.0,
                'eval/tool_call_failed': np.float64(1.0), 'train/version_lag_max': jnp.float32(float('nan')),
                'train/completion_len_mean': 72.0, 'train/pack_rows': 3.0})
    with pytest.raises(ValueError, match=r"'train/decode_tokens' is a count .* got 2\.5"):
      w.write(2, {'train/decode_tokens': 2.5})
  row = _rows(tmp_path)[0]
  ints = {k: v for k, v in row.items() if isinstance(v, int)}
  assert ints == {'step': 1, 'train/tokens': 1531, 'train/skipped_updates': 0, 'config_change/optim.lr': 1,
                  'eval/tool_call_failed': 1}
  assert row['train/version_lag_max'] == 'nan' and isinstance(row['train/completion_len_mean'], float)
  assert isinstance(row['train/pack_rows'], float)  # a mean over minibatch updates, not a count
  assert metrics_lib.COUNTS <= set(metrics_lib.METRICS)
  table = metrics_lib.markdown_table()
  assert '| `train/tokens` | loss-bearing tokens in the SFT batch (count: an integer) |' in table
  assert table.count('(count: an integer)') == len(metrics_lib.COUNTS)


def test_same_step_merges_and_order_is_enforced(tmp_path):
  with _writer(tmp_path) as w:
    w.write(0, {'eval/accuracy': 0.1})
    w.write(1, {'train/reward_mean': 0.5, 'train/kl': 0.0})
    w.write(1, {'eval/accuracy': 0.2, 'train/kl': 0.01})  # later value wins
    w.write(2, {'train/reward_mean': 0.6})
    with pytest.raises(ValueError, match='step=1 is before the last logged step 2'):
      w.write(1, {'train/reward_mean': 0.0})
    with pytest.raises(ValueError, match=r"'train/kl' has shape \(2,\)"):
      w.write(3, {'train/kl': np.zeros(2)})
  assert _rows(tmp_path) == [{'step': 0, 'eval/accuracy': 0.1},
                             {'step': 1, 'eval/accuracy': 0.2, 'train/kl': 0.01, 'train/reward_mean': 0.5},
                             {'step': 2, 'train/reward_mean': 0.6}]
  with pytest.raises(ValueError, match='after close'):
    w.write(4, {'train/kl': 0.0})


def test_resume_truncates_then_appends(tmp_path):
  with _writer(tmp_path) as w:
    for s in range(10):
      w.write(s, {'train/reward_mean': s / 10})
    w.log_samples(4, ['a', 'b'], [1.0, 0.0])
    w.log_samples(8, ['c'], [0.5])
  with open(tmp_path / 'metrics.jsonl', 'a', encoding='utf-8') as f:
    f.write('{"step": 10, "train/rew')  # torn line from a crash mid-write
  with _writer(tmp_path, resume_step=5) as w:
    assert [r['step'] for r in _rows(tmp_path)] == [0, 1, 2, 3, 4, 5]
    w.write(5, {'eval/accuracy': 0.9})  # the resumed step's eval merges into its row
    w.write(6, {'train/reward_mean': 0.66})
    w.write(7, {'train/reward_mean': 0.77})
  rows = _rows(tmp_path)
  assert [r['step'] for r in rows] == [0, 1, 2, 3, 4, 5, 6, 7]
  assert rows[5] == {'step': 5, 'eval/accuracy': 0.9, 'train/reward_mean': 0.5}
  assert rows[6]['train/reward_mean'] == 0.66
  samples = [json.loads(line) for line in open(tmp_path / 'samples.jsonl', encoding='utf-8')]
  assert [(s['step'], s['text']) for s in samples] == [(4, 'a'), (4, 'b')]
  assert not os.path.exists(tmp_path / 'metrics.jsonl.tmp')
  with _writer(tmp_path, resume_step=None):  # fresh start in the same workdir: the old rows go
    pass
  assert _rows(tmp_path) == []


def _tb_scalars(logdir):
  """(tag, step, value) from TFRecord event files, parsed by hand: length, crc, Event proto, crc."""
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    data = open(path, 'rb').read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack('<Q', data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      for value in event.summary.value:
        out.append((value.tag, event.step, value.simple_value))
  return out


def test_tensorboard_events(tmp_path):
  with _writer(tmp_path, use_tensorboard=True) as w:
    w.write(1, {'train/reward_mean': 0.25, 'train/kl': 0.5})
    w.write(2, {'train/reward_mean': 0.75})
  files = glob.glob(str(tmp_path / 'tensorboard' / 'events.out.tfevents.*'))
  assert files and os.path.getsize(files[0]) > 0
  assert sorted(_tb_scalars(tmp_path / 'tensorboard')) == [
      ('train/kl', 1, 0.5), ('train/reward_mean', 1, 0.25), ('train/reward_mean', 2, 0.75)]


def _tb_visible(logdir):
  """{(tag, step): value} as TensorBoard shows it: event files in name order, a SessionLog START at step s hides every
  earlier event at step >= s, and a tag's step going back hides that tag's events from it on (purge_orphaned_data)."""
  seen, last = {}, -1
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    data, pos = open(path, 'rb').read(), 0
    while pos < len(data):
      (length,) = struct.unpack('<Q', data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      if event.HasField('session_log') and event.session_log.status == event_pb2.SessionLog.START:
        seen = {k: v for k, v in seen.items() if k[1] < event.step}
      tags = [v.tag for v in event.summary.value]
      if tags and event.step < last:
        seen = {k: v for k, v in seen.items() if k[0] not in tags or k[1] < event.step}
      for value in event.summary.value:
        seen[(value.tag, event.step)] = value.simple_value
      last = max(last, event.step) if tags else last
  return seen


def test_tensorboard_mirrors_the_rows_after_a_fresh_restart_and_a_resume(tmp_path):
  """A fresh start in a workdir that holds an earlier run's rows (a run killed before its first checkpoint, rerun):
  metrics.jsonl lost the old rows, but the old events stayed visible in TensorBoard (no purge step), so a tag the new
  run had not written yet (eval/accuracy at step 2) showed the old run's value. A resume from step 1 hides the old
  events after it. TensorBoard shows what metrics.jsonl holds, in both cases."""
  import time
  tb = tmp_path / 'tensorboard'
  with _writer(tmp_path, use_tensorboard=True) as w:
    w.write(1, {'train/reward_mean': 0.1, 'train/kl': 0.5})
    w.write(2, {'train/reward_mean': 0.2, 'eval/accuracy': 0.9})
  time.sleep(1.1)  # tensorboardX names event files by the second: a new writer in the same second overwrites
  with _writer(tmp_path, use_tensorboard=True, resume_step=None) as w:
    w.write(1, {'train/reward_mean': 0.3})
  rows = {(k, r['step']): v for r in metrics_lib.read_metrics(str(tmp_path)) for k, v in r.items() if k != 'step'}
  assert rows == {('train/reward_mean', 1): 0.3}
  assert _tb_visible(tb) == pytest.approx(rows)
  time.sleep(1.1)
  with _writer(tmp_path, use_tensorboard=True, resume_step=1) as w:
    w.write(2, {'train/reward_mean': 0.4})
  time.sleep(1.1)
  with _writer(tmp_path, use_tensorboard=True, resume_step=1) as w:
    w.write(2, {'eval/accuracy': 0.7})
  rows = {(k, r['step']): v for r in metrics_lib.read_metrics(str(tmp_path)) for k, v in r.items() if k != 'step'}
  assert rows == {('train/reward_mean', 1): 0.3, ('eval/accuracy', 2): 0.7}
  assert _tb_visible(tb) == pytest.approx(rows)


def test_progress_line_and_samples(tmp_path, capsys):
  with _writer(tmp_path, total_steps=10) as w:
    w.write(1, {'train/reward_mean': 0.125, 'train/grad_norm': 3.0})
    w.write(3, {'train/reward_mean': 0.5, 'train/kl': 0.002})
    w.log_samples(3, ['<think>2+2</think><answer>4</answer>', 'x' * 1000, 'never printed'], [1.0, 0.0, 0.5])
    with pytest.raises(ValueError, match='2 texts and 1 rewards'):
      w.log_samples(3, ['a', 'b'], [1.0])
  err = capsys.readouterr().err.splitlines()
  assert err[0] == 'step 1/10 (10%) | reward_mean=0.125'
  assert re.fullmatch(r'step 3/10 \(30%\) \| [0-9.e-]+ s/step \| ETA \d+m\d\ds \| reward_mean=0.5 kl=0.002', err[1])
  assert err[2] == '[sample step=3 #0 reward=1] <think>2+2</think><answer>4</answer>'
  assert err[3].endswith('x' * 400 + ' …') and len(err) == 4
  samples = [json.loads(line) for line in open(tmp_path / 'samples.jsonl', encoding='utf-8')]
  assert samples[2] == {'step': 3, 'index': 2, 'reward': 0.5, 'text': 'never printed'}


def test_wandb_missing_names_the_fix(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # makes `import wandb` fail even where it is installed
  with pytest.raises(ImportError, match='pip install wandb.*wandb_project=""'):
    _writer(tmp_path, wandb_project='grpo')


def test_only_process_zero_writes(tmp_path, monkeypatch):
  monkeypatch.setattr(metrics_lib.jax, 'process_index', lambda: 1)
  w = _writer(tmp_path / 'p1', use_tensorboard=True)
  w.write(1, {'train/kl': 0.0})
  w.log_samples(1, ['a'], [1.0])
  with pytest.raises(ValueError, match='not defined'):
    w.write(2, {'train/nope': 0.0})
  w.close()
  assert not os.path.exists(tmp_path / 'p1')
  assert plots.write_plots(str(tmp_path / 'p1')) == {}


# ---------------------------------------------------------------- plots

def test_plots_are_nonempty_pngs_and_tolerate_missing_metrics(tmp_path):
  assert set(plots.write_plots(str(tmp_path))) == {'overview'}  # no metrics.jsonl yet
  with _writer(tmp_path) as w:
    for s in range(1, 6):
      w.write(s, {'train/reward_mean': s / 5, 'train/reward/format': 1.0, 'train/kl': 0.01 * s,
                  'train/entropy': float('nan') if s == 3 else 1.0 / s, 'train/completion_len_mean': 10.0 + s})
    w.write(5, {'eval/accuracy': 0.5, 'eval/pass@4': 0.75})
  written = plots.write_plots(str(tmp_path))
  # No clip fractions were logged: that panel is skipped, not an error.
  assert set(written) == {'reward', 'accuracy', 'length', 'kl', 'entropy', 'overview'}
  for name, path in written.items():
    assert path == str(tmp_path / 'plots' / f'{name}.png')
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    img = mpl_image.imread(path)
    assert img.shape[:2] == ((800, 1500) if name == 'overview' else (400, 600))
    assert img[..., :3].std() > 0.01  # something was drawn, not a blank canvas
  assert not glob.glob(str(tmp_path / 'plots' / '*.tmp'))
  # Called again mid-run: files are replaced in place.
  assert plots.write_plots(str(tmp_path)) == written



def test_plots_cli_refuses_anything_but_a_run_directory(tmp_path, monkeypatch, capsys):
  """`python -m grpo_jax.plots --helpfull` made ./--helpfull/plots/overview.png; bare, it was an IndexError."""
  monkeypatch.chdir(tmp_path)
  for argv in ([], ['--helpfull'], ['a', 'b'], [str(tmp_path / 'nope')], [str(tmp_path)]):
    assert plots.main(argv) == 2, argv
    assert 'usage' in capsys.readouterr().err or argv[0].startswith(str(tmp_path))
  assert os.listdir(tmp_path) == []  # nothing was created
  assert plots.main(['--help']) == 0
  with _writer(tmp_path) as w:
    w.write(1, {'train/reward_mean': 0.5})
  assert plots.main([str(tmp_path)]) == 0
  assert 'reward' in capsys.readouterr().out

def test_docs_metrics_table_matches_code():
  import os
  from grpo_jax.run import metrics as metrics_lib
  path = os.path.join(os.path.dirname(__file__), "..", "docs", "metrics.md")
  with open(path) as f:
    assert metrics_lib.markdown_table() in f.read(), "regenerate docs/metrics.md (command at its top)"


_KILL = """
import os, signal, sys, types
sys.modules['jax'] = types.SimpleNamespace(process_index=lambda: 0, device_get=lambda x: x)  # 0.1 s, not 2 s
from grpo_jax.run import metrics

wd, point = sys.argv[1:]
w = metrics.MetricWriter(wd, use_tensorboard=False, progress=False)
w.write(1, {'train/loss': 1.0})
w.write(2, {'train/loss': 2.0})
die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)


class File:  # the open metrics file, one of its calls replaced by a SIGKILL
  def __init__(self, f):
    self.f = f

  def __getattr__(self, name):
    return getattr(self.f, name)


if point == 'pending':      # before the pending row is in place
  os.replace = die
elif point == 'truncate':   # pending written, old line not yet cut
  w._file = File(w._file); w._file.truncate = die
elif point == 'cut':        # old line cut, nothing written
  w._file = File(w._file); w._file.write = die
elif point == 'torn':       # old line cut, half of the merged one written
  w._file = File(w._file)
  w._file.write = lambda b: (w._file.f.write(b[:len(b) // 2]), w._file.f.flush(), die())
elif point == 'unlink':     # merged line written, pending not yet removed
  os.remove = die
w.write(2, {'eval/accuracy': 0.5})
"""


def test_a_kill_at_any_point_of_a_merge_keeps_the_row(tmp_path):
  """A second write for a step (eval after train, a resume's counts) rewrote the file's last line: truncate, then
  write. A SIGKILL between the two lost the row, which only rerunning the step could rebuild. The merged row now
  goes to metrics.jsonl.pending first: killed at each point of the merge (a real SIGKILL in a subprocess), every
  reader sees step 2's row (the merged one once it is pending), and the next start writes it into the file."""
  import subprocess  # pylint: disable=import-outside-toplevel
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  points = ('cut', 'torn', 'truncate', 'unlink', 'pending')
  procs = {p: subprocess.Popen([sys.executable, '-c', _KILL, str(tmp_path / p), p], cwd=repo, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in points}
  train, merged = {'step': 2, 'train/loss': 2.0}, {'step': 2, 'eval/accuracy': 0.5, 'train/loss': 2.0}
  for point, proc in procs.items():
    _, err = proc.communicate(timeout=120)
    wd = str(tmp_path / point)
    rows = metrics_lib.read_metrics(wd)
    assert rows == [{'step': 1, 'train/loss': 1.0}, train if point == 'pending' else merged], (point, rows, err)
    assert proc.returncode == -9, (point, err)  # killed where it was meant to be
    with _writer(wd, resume_step=2, progress=False) as w:  # the next start: the row in the file, no pending file
      assert _rows(wd) == rows and not glob.glob(os.path.join(wd, 'metrics.jsonl.*')), point
      w.write(3, {'train/loss': 3.0})
    assert [r['step'] for r in _rows(wd)] == [1, 2, 3], point


def test_resume_states_lost_rows_in_one_warning(tmp_path, caplog):
  """Rows a resume cannot rebuild (metrics.jsonl deleted or cut before the resumed step, a torn row): one warning
  naming the missing logged steps; none when every logged step has its row."""
  with metrics_lib.MetricWriter(str(tmp_path), use_tensorboard=False, progress=False) as w:
    for step in range(2, 13, 2):
      w.write(step, {'train/loss': float(step)})
  assert metrics_lib.warn_missing(str(tmp_path), 12, 2) == []
  path = tmp_path / 'metrics.jsonl'
  lines = path.read_text().splitlines()
  path.write_text('\n'.join(lines[3:5]) + '\n' + lines[5][:10] + '\n')  # rows 2-6 gone, row 12 torn
  with caplog.at_level('WARNING'):
    gone = metrics_lib.warn_missing(str(tmp_path), 12, 2)
  assert gone == [2, 4, 6, 12]
  warned = [r.getMessage() for r in caplog.records if 'cannot be rebuilt' in r.getMessage()]
  assert len(warned) == 1 and 'steps 2-6, 12' in warned[0] and 'resumed step 12' in warned[0], warned
  os.remove(path)
  assert metrics_lib.warn_missing(str(tmp_path), 12, 4) == [4, 8, 12]


def test_unreadable_rows_are_skipped_and_counted_never_raised(tmp_path, caplog):
  """metrics.jsonl with a non-UTF-8 line, a torn line, a JSON line that is not a row and a row without an integer
  step: every reader (read_metrics, a resuming MetricWriter) skips them with one warning counting them."""
  with _writer(tmp_path, progress=False) as w:
    for step in (1, 2, 3):
      w.write(step, {'train/loss': float(step)})
  path = tmp_path / 'metrics.jsonl'
  good = path.read_bytes().splitlines(keepends=True)
  path.write_bytes(good[0] + b'{"step": 9, "train/loss": "\xff\xfe"}\n' + good[1] + b'{"step": 4, "tr\n'
                   + b'[1, 2]\n{"step": "5"}\n' + good[2])
  with caplog.at_level('WARNING'):
    rows = metrics_lib.read_metrics(str(tmp_path))
  assert [r['step'] for r in rows] == [1, 2, 3]
  warned = [r.getMessage() for r in caplog.records if 'unreadable line' in r.getMessage()]
  assert len(warned) == 1 and 'skipped 4 unreadable line(s)' in warned[0] and 'line(s) 2, 4-6' in warned[0], warned
  with _writer(tmp_path, resume_step=2, progress=False) as w:  # a resume reads, drops rows after 2, appends
    w.write(3, {'train/loss': 30.0})
  assert [(r['step'], r['train/loss']) for r in _rows(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_a_deleted_live_metrics_file_is_recreated_with_a_warning(tmp_path, caplog):
  """metrics.jsonl deleted while the run writes it: the next write recreates it (warning), later rows are there,
  and a second write of the same step (the eval after the train row) still merges into one whole row."""
  with _writer(tmp_path, progress=False) as w:
    w.write(1, {'train/loss': 1.0})
    w.write(2, {'train/loss': 2.0})
    os.remove(tmp_path / 'metrics.jsonl')
    with caplog.at_level('WARNING'):
      w.write(2, {'eval/accuracy': 0.5})
      w.write(3, {'train/loss': 3.0})
  assert _rows(tmp_path) == [{'step': 2, 'eval/accuracy': 0.5, 'train/loss': 2.0}, {'step': 3, 'train/loss': 3.0}]
  warned = [r.getMessage() for r in caplog.records if 'was deleted or replaced' in r.getMessage()]
  assert len(warned) == 1 and 'from step 2 on' in warned[0], warned


def test_a_resume_with_another_log_cadence_reports_no_lost_rows(tmp_path, caplog):
  """train.log_every is free to change on resume: a run logged every 2 steps and resumed at step 4 with log_every=1
  lost no row (steps 1 and 3 were never logged), so no warning; the file deleted, steps 2 and 4 are named (the
  cadences' least common multiple, recorded with each checkpoint). The warning named steps 1 and 3 as lost."""
  import jax
  import jax.numpy as jnp
  from grpo_jax.config import config_lib
  from grpo_jax.run import loop_guard
  wd = str(tmp_path)
  state = {'w': jnp.arange(4.0)}
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)

  def resume(log_every):
    c = config_lib.base_config()
    c.train.log_every = log_every
    guard = loop_guard.LoopGuard(c, wd, 'sft')
    ckpt = guard.checkpointer(c)
    start = 0
    if ckpt.latest_step() is not None:
      _, meta = ckpt.restore(None, abstract)
      start = meta['step']
    return guard, ckpt, start

  guard, ckpt, _ = resume(2)
  with metrics_lib.MetricWriter(wd, use_tensorboard=False, progress=False) as w:
    for step in (2, 4):
      w.write(step, {'train/loss': float(step)})
  ckpt.maybe_save(4, state, {'step': 4}, force=True)
  ckpt.close()
  for deleted, lost in ((False, []), (True, ['steps 2-4'])):
    if deleted:
      os.remove(os.path.join(wd, 'metrics.jsonl'))
    guard, ckpt, start = resume(1)
    assert start == 4
    caplog.clear()
    with caplog.at_level('WARNING'), metrics_lib.MetricWriter(wd, resume_step=4, use_tensorboard=False,
                                                              progress=False) as w:
      guard.resumed(ckpt, start, w)
    ckpt.close()
    warned = [r.getMessage() for r in caplog.records if 'cannot be rebuilt' in r.getMessage()]
    assert [m for m in lost if any(m in w_ for w_ in warned)] == lost and len(warned) == len(lost), warned
