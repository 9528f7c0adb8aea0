"""The metrics.jsonl contract (docs/metrics.md, grpo_jax/run/metrics.py), checked on a finished run's file: the
run tests call `check_run(workdir)` on the runs their fixtures already made."""

import json
import math
import os
import re

from grpo_jax.run import metrics as metrics_lib

_FRACTIONS = re.compile(r'(frac|_rate|accuracy(_sampled|_with_tool|_without_tool)?|language_consistency|'
                        r'pass@\d+|cons@\d+|decode_slot_util)\Z|\A(clip_frac_|frac_)')


def _meaning(name):
  return metrics_lib.METRICS[metrics_lib._entry(name)]


def check_rows(rows, config=None):
  """Problems with the rows of one metrics.jsonl (strings, empty when it keeps the contract). `config`: the run's
  config.json, for the eval keys it asked for (eval.pass_k, eval.n_samples)."""
  problems, last = [], None
  for row in rows:
    step = row.get('step')
    if not isinstance(step, int) or isinstance(step, bool):
      problems.append(f'row without an integer step: {row}')
      continue
    if last is not None and step <= last:
      problems.append(f'step {step} after step {last}: steps must increase, one row per step')
    last = step
    for k, v in row.items():
      if k == 'step':
        continue
      if not metrics_lib.is_known(k):
        problems.append(f'step {step}: {k} is not in METRICS')
        continue
      x = float(v) if v in ('nan', 'inf', '-inf') else v
      if not isinstance(x, (int, float)) or isinstance(x, bool):
        problems.append(f'step {step}: {k}={v!r} is not a number')
      elif not math.isfinite(x):
        if not (math.isnan(x) and re.search(r'\bnan\b', _meaning(k), re.I)):
          problems.append(f'step {step}: {k}={v} but its meaning allows no NaN/inf')
      elif metrics_lib.is_count(k) and not isinstance(v, int):
        problems.append(f'step {step}: {k}={v!r} is a count, written as a float')
      elif k.endswith('_s') and x < 0:
        problems.append(f'step {step}: {k}={x} seconds < 0')
      elif _FRACTIONS.search(k.split('/', 1)[1]) and not 0 <= x <= 1:
        problems.append(f'step {step}: {k}={x} is a fraction outside [0, 1]')
    if any(k.startswith('eval/') for k in row):
      want = {'eval/accuracy', 'eval/format_rate', 'eval/completion_len_mean', 'perf/eval_time_s'}
      if config is not None and 'eval/accuracy_sampled' in row:
        want |= {f'eval/pass@{k}' for k in config['eval']['pass_k']} | {f"eval/cons@{config['eval']['n_samples']}"}
      if missing := sorted(want - set(row)):
        problems.append(f'step {step}: eval row without {missing}')
  return problems


def check_run(workdir):
  """Asserts the contract on workdir/metrics.jsonl (read raw: strings "nan" and JSON ints as written)."""
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f if line.strip()]
  config = None
  if os.path.exists(os.path.join(workdir, 'config.json')):
    with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
      config = json.load(f)
  problems = check_rows(rows, config)
  assert rows and not problems, f'{workdir}/metrics.jsonl: ' + '; '.join(problems[:12])
  return rows
