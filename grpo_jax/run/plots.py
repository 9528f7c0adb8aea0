"""Training curves from metrics.jsonl into workdir/plots/*.png; safe to call while the run is writing.

Uses matplotlib's object API with the Agg canvas (no pyplot global state, no display needed). Each PNG is written
to a temporary file and renamed, so a reader never sees half a PNG. matplotlib is imported on the first plot: a run
that never plots (log.plots=False, as the test suite's runs) does not pay its import. train.plot_every=0 still
draws the plots once, at the end of the run.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from grpo_jax.run import metrics as metrics_lib

if TYPE_CHECKING:
  from matplotlib.figure import Figure

# panel -> (title, y label, regexes of the metric names it draws). Patterns let reward terms and pass@k show up.
PANELS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    'reward': ('Reward', 'reward', (r'train/reward_mean', r'train/reward/.+')),
    'accuracy': ('Held-out accuracy', 'rate',
                 (r'eval/accuracy', r'eval/accuracy_sampled', r'eval/format_rate', r'eval/pass@\d+',
                  r'eval/cons@\d+')),
    'length': ('Completion length', 'tokens',
               (r'train/completion_len_mean', r'train/completion_len_max', r'eval/completion_len_mean')),
    'kl': ('KL to reference (k3)', 'KL', (r'train/kl',)),
    'clip_fraction': ('Clipped token fraction', 'fraction', (r'train/clip_frac_low', r'train/clip_frac_high')),
    'entropy': ('Policy entropy', 'nats / token', (r'train/entropy',)),
}


def _series(rows: list[dict[str, Any]], patterns: tuple[str, ...]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """name -> (steps, values) for every logged metric matching one of `patterns`, in pattern order."""
  names: list[str] = []
  for pattern in patterns:
    regex = re.compile(pattern + r'\Z')
    names += sorted({k for row in rows for k in row if regex.match(k) and k not in names})
  out = {}
  for name in names:
    pts = [(row['step'], row[name]) for row in rows if name in row and isinstance(row[name], (int, float))]
    if pts:
      steps, values = zip(*pts)
      out[name] = (np.asarray(steps, float), np.asarray(values, float))
  return out


def _draw(ax, title: str, ylabel: str, series: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  ax.set_title(title)
  ax.set_xlabel('step')
  ax.set_ylabel(ylabel)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  if not series:
    ax.text(0.5, 0.5, 'no data yet', ha='center', va='center', transform=ax.transAxes, color='gray')
    return
  for name, (steps, values) in series.items():
    ax.plot(steps, values, marker='.' if len(steps) < 30 else None, label=name)
  ax.grid(alpha=0.3)
  ax.legend(fontsize='small')


def _save(fig: Figure, path: str) -> None:
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  FigureCanvasAgg(fig)
  tmp = path + '.tmp'
  fig.savefig(tmp, format='png', dpi=100)
  os.replace(tmp, path)


def write_plots(workdir: str) -> dict[str, str]:
  """Writes one PNG per panel that has data, plus overview.png with all panels; returns {panel: path}."""
  if jax.process_index() != 0:
    return {}
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top,redefined-outer-name
  rows = metrics_lib.read_metrics(workdir)
  out_dir = os.path.join(workdir, 'plots')
  os.makedirs(out_dir, exist_ok=True)
  written = {}
  data = {name: _series(rows, patterns) for name, (_, _, patterns) in PANELS.items()}
  for name, (title, ylabel, _) in PANELS.items():
    if not data[name]:
      continue  # tolerate runs that never log this metric (SFT has no reward; eval may not have run yet)
    fig = Figure(figsize=(6, 4))
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.12, top=0.92)  # fixed margins: constrained layout costs 2x
    _draw(fig.add_subplot(), title, ylabel, data[name])
    written[name] = os.path.join(out_dir, f'{name}.png')
    _save(fig, written[name])
  fig = Figure(figsize=(15, 8))
  fig.subplots_adjust(left=0.05, right=0.98, bottom=0.07, top=0.91, wspace=0.25, hspace=0.35)
  axes = fig.subplots(2, 3).ravel()
  for ax, (name, (title, ylabel, _)) in zip(axes, PANELS.items()):
    _draw(ax, title, ylabel, data[name])
  fig.suptitle(os.path.basename(os.path.normpath(workdir)))
  written['overview'] = os.path.join(out_dir, 'overview.png')
  _save(fig, written['overview'])
  return written


def main(argv: list[str]) -> int:
  """python -m grpo_jax.plots WORKDIR: re-plot a finished or running run. Anything but one run directory with a
  metrics.jsonl is refused (exit 2) before a directory is made: a flag or a typo must not become a workdir."""
  usage = 'usage: python -m grpo_jax.plots WORKDIR  (a run directory holding metrics.jsonl)'
  if len(argv) != 1 or argv[0].startswith('-'):
    print(usage if argv[:1] in ([], ['-h'], ['--help']) else f'{usage}; got {" ".join(argv)!r}', file=sys.stderr)
    return 0 if argv[:1] in (['-h'], ['--help']) else 2
  if not os.path.isfile(os.path.join(argv[0], 'metrics.jsonl')):
    print(f'{argv[0]!r} holds no metrics.jsonl: pass the --workdir of a run (grpo_jax.main writes it there).',
          file=sys.stderr)
    return 2
  for panel, png in write_plots(argv[0]).items():
    print(panel, png)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
