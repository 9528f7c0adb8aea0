"""Metric names (the one table) and `MetricWriter`: metrics.jsonl, TensorBoard, optional W&B, progress line.

metrics.jsonl format: one JSON object per logged step, `step` first, then metric names sorted; integers and the
counts (COUNTS) are JSON integers, everything else is a Python float; non-finite floats are written as the strings
"nan", "inf", "-inf" so that the file is strict JSON (jq, pandas, browsers reject bare NaN); `read_metrics` turns
them back into floats. Several `write` calls for the same step (train metrics, then eval metrics) merge into one
row. The merge rewrites the file's last line; the merged row is first put in metrics.jsonl.pending (written whole,
then renamed), so a kill between cutting the old line and writing the new one loses nothing: every reader takes the
pending row in place of its step's line (`_read_rows`), and the next start writes it into the file and removes the
pending file.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from absl import logging

# name -> what it means. `<term>` stands for a reward term name, `<k>` for a positive integer.
METRICS: dict[str, str] = {
    # --- train/: one RL (or SFT) step; token means are over completion tokens (mask == 1) ---
    'train/reward_mean': 'mean total (weighted) reward over the N = B·G rollouts',
    'train/reward_std': 'std of the total reward over the N rollouts (whole batch, not per group)',
    'train/reward/<term>': 'mean unweighted score of one reward term (rewards.REGISTRY name)',
    'train/frac_zero_std_groups': 'fraction of prompts whose G rewards are all equal: zero advantage, no signal',
    'train/adv_mean': 'token-mean advantage',
    'train/adv_std': 'token-level std of the advantage',
    'train/adv_abs_max': 'largest |advantage| in the batch',
    'train/adv_share/<term>': ("the term's share of the outcome advantage, <A_term, A> / <A, A> (A = sum of the "
                               "terms' parts; shares sum to 1, negative = pulls against the rest; all 0 in a step "
                               "with no advantage, e.g. every group's rewards equal; rl_step.term_shares)"),
    'train/clip_frac_low': 'fraction of tokens with ratio < 1-eps_low and A < 0 (clipped from below)',
    'train/clip_frac_high': 'fraction of tokens with ratio > 1+eps_high and A > 0 (clipped from above)',
    'train/clip_frac_dual': 'fraction of tokens with ratio > rl.dual_clip and A < 0 (loss bounded, no gradient)',
    'train/kl_clamp_frac': 'fraction of tokens whose k3 exceeds rl.kl_clamp (value clamped, no KL gradient)',
    'train/ratio_mean': 'token-mean importance ratio pi/pi_old (1 for the first of mu updates)',
    'train/ratio_max': 'largest importance ratio pi/pi_old over the step',
    'train/ratio_min': 'smallest importance ratio pi/pi_old over the step',
    'train/ref_reset': ('rl.ref_reset_every > 0: 1 on a step after which the reference became the current policy '
                        'and the optimizer state started afresh (ProRL), else 0'),
    'train/kl': ('k3 estimate of KL(pi || pi_ref), token mean, at the rollout policy; absent at beta = 0 '
                 '(no reference model)'),
    'train/entropy': ('token-mean entropy of pi (softmax(logits / temperature)) on the sampled completions (the '
                      'token mean of each minibatch, averaged over the updates of the step: a long answer weighs by '
                      'its length, not as one answer; an update whose minibatch has no loss token, e.g. every one '
                      'rejected by the rollout correction, is left out, and a step with none reads nan)'),
    'train/completion_len_mean': 'mean completion length in tokens (up to and including EOS)',
    'train/completion_len_max': 'longest completion in tokens',
    'train/completion_len_p90': '90th percentile of the completion lengths in tokens (linear interpolation)',
    'train/len_acc_corr': ('within-group Pearson correlation of completion length and the accuracy term, mean over '
                           'the groups where both vary (NaN if none; rl/length_stats.py)'),
    'train/len_acc_corr_frac': 'fraction of groups where length and accuracy both vary (those train/len_acc_corr '
                               'averages)',
    'train/completion_len_correct': ('mean length of the completions the accuracy term scores right (> 0.5); NaN '
                                     'if none (runs whose rewards have an accuracy term, `accuracy` or '
                                     '`math_accuracy`: rl_step.ACCURACY_TERMS; so are the other accuracy splits)'),
    'train/completion_len_incorrect': 'mean length of the completions scored wrong; NaN if none',
    'train/process_on_correct': ('mean `process` term score (fraction of arithmetically right steps) of the '
                                 'completions the accuracy term scores right; NaN if none (both terms run)'),
    'train/process_on_incorrect': ('the same of the completions scored wrong: near 1 means right steps that do not '
                                   'reach the answer, e.g. padding with "1 + 1 = 2 ;" (docs/algorithms.md)'),
    'train/cov_logp_adv': ('Cov(log pi_old, A) over the tokens the update trains (population covariance; the '
                           'completion tokens less those the staleness mask or rl.rollout_correction removed): by the '
                           'entropy mechanism (arXiv 2505.22617) the entropy falls by about the step size times this '
                           'per update (natural policy gradient)'),
    'train/gate_mean': ('rl.objective=sapo: token-mean gate weight 4s(1-s), s = sigmoid(tau(ratio - 1)): 1 on-policy, '
                        'smaller as the ratio leaves 1'),
    'train/gated_frac': 'rl.objective=sapo: fraction of tokens whose gate weight is below 1/2',
    'train/select_frac': ('rl.token_select: fraction of the trained tokens the rule picked (kept by top_entropy, '
                          'cut by clip_cov, KL-penalised by kl_cov), over the updates that had tokens (NaN if none '
                          'had)'),
    'train/select_entropy': ('rl.token_select: mean entropy of the picked tokens, over the updates that picked any '
                             '(NaN if none did)'),
    'train/select_cov': ('rl.token_select: mean covariance term (log pi - mean)(A - mean) of the picked tokens, '
                         'over the updates that picked any (NaN if none did)'),
    'train/truncation_rate': 'fraction of completions with no EOS within max_new_tokens',
    'train/decode_steps': 'decode steps the rollout ran: max_new_tokens - 1 unless every row ended early '
                          '(sampling.exit_chunk early exit; with rollout chunks the slowest chunk\'s)',
    'train/decode_row_steps': ('row-steps the rollout decode computed: rows x decode steps of each row chunk '
                               '(static engine), the slot count of every decode step summed (continuous)'),
    'train/decode_slot_util': ('generated tokens / (row-steps computed + rows): the share of the decode\'s row-steps '
                               'that produced a token (each row\'s first token counted as its prefill\'s row-step)'),
    'train/decode_admit_wait': ('continuous engine: mean decode steps a row waited in the queue for a slot '
                                '(0 when sampling.slots = rows)'),
    # --- partial rollouts (rl.partial_rollouts: rollout/carry.py, rl/partial.py) ---
    'train/version_lag_mean': ('partial rollouts: updates between the weights that drew a trained token and the '
                               'update training it, mean over the trained rows\' tokens (0 = on-policy)'),
    'train/version_lag_max': 'partial rollouts: the largest such lag of the step',
    'train/stale_masked_frac': ('partial rollouts: share of the trained rows\' tokens older than rl.max_staleness '
                                'updates, masked out of the loss'),
    'train/carried_rows': ('partial rollouts: rows left in the carry after the step (in a slot, queued, or ended '
                           'and waiting for their group)'),
    'train/ready_groups': 'partial rollouts: complete groups left waiting for a later step (the ready buffer)',
    'train/rollout_budget': 'partial rollouts: the decode steps the step ran at least (rl.rollout_budget or auto)',
    'train/decode_tokens': 'partial rollouts: tokens the step drew (not the ones it trained)',
    'train/train_len': 'completion tokens the update trained on: the shortest of rl.train_buckets static lengths '
                       'covering the longest completion (rl.packing: computed, not used by the packed passes)',
    'train/pack_rows': 'rl.packing: packed rows of rl.pack_len tokens one update ran over, all devices (micro-batches '
                       'run x rows each; mean over minibatch updates)',
    'train/grad_norm': 'global L2 norm of the gradient before clipping (mean over minibatch updates)',
    'train/update_norm': 'global L2 norm of the optimizer update (mean over minibatch updates)',
    'train/param_norm': 'global L2 norm of the trained params after the step (the adapters under LoRA)',
    'train/loss': 'the minimised loss (-J for RL, token cross-entropy for SFT), mean over minibatch updates',
    'train/tokens': 'loss-bearing tokens in the SFT batch',
    'train/skipped_updates': 'minibatch updates skipped this step (non-finite ones, or all of them after a failed reward)',
    'train/nonfinite_updates': 'minibatch updates whose loss, gradient or optimizer update was non-finite (skipped)',
    'train/lr': 'learning rate of the updates of this step (mean; warm-up included)',
    'train/value_loss': 'critic (value) loss, PPO only',
    'train/dynamic_sampling_kept': 'prompts kept by dynamic sampling (groups with non-zero reward variance)',
    'train/is_weight_mean': ('rollout correction (rl/correction.py; logged when the old log-probs are a forward, '
                             'correction.needs_proximal): mean weight w = f(pi_prox/mu) over the kept tokens (1 '
                             'under rl.rollout_correction=none)'),
    'train/is_weight_max': 'rollout correction: largest weight w over the kept tokens',
    'train/is_masked_frac': ('rollout correction: fraction of completion tokens it removed from the loss (mis, '
                             'icepop: by token; seq_mask: whole rows)'),
    'train/mismatch_kl': ('k3 estimate of KL(mu || pi_prox), token mean: the behaviour policy (the sampler\'s '
                          'recorded log-probs) against this step\'s pre-update weights in training numerics'),
    'train/reward_fallbacks': 'Python reward calls that timed out or failed and got the fallback score',
    # multi-turn rows (tools.env, docs/tools.md; envs/transcript.py summary): over the trained rows
    'train/tool_calls_mean': ("tools: tool calls per completion (steps the environment answered with the tool's output, "
                              'error or timeout; not every stop marker)'),
    'train/tool_call_rate': 'tools: fraction of completions with at least one tool call',
    'train/turns_mean': "tools: the model's stretches of writing per completion (between the observations it got)",
    'train/obs_tokens_mean': "tools: observation tokens per completion (in the transcript, not trained on)",
    'train/gen_tokens_mean': "tools: the model's own tokens per completion (what completion_len_mean counts too)",
    'train/obs_token_frac': 'tools: observation tokens / all completion tokens',
    'train/accuracy_with_tool': "tools: accuracy term > 0.5 among completions with a tool call (NaN if none called)",
    'train/accuracy_without_tool': 'tools: accuracy term > 0.5 among completions without one (NaN if all called)',
    'train/tool_errors': "tools: calls whose tool reported an error (info['error']: a malformed call, code that "
                         'raised); the row goes on',
    'train/tool_timeouts': "tools: calls whose tool hit its own limit (info['timeout']); the row goes on",
    'train/tool_fallbacks': ('tools: environment steps that raised, outlived tools.timeout_s or returned the wrong '
                             'type: the row ended with tools.fallback_reward'),
    'train/tool_turn_limits': 'tools: rows ended at a stop marker past tools.max_turns (the environment not called)',
    'train/tool_obs_truncated': 'tools: observations cut to the room left in the row (over every sampled row)',
    # --- eval/: held-out prompts ---
    'eval/accuracy': 'greedy-decoding accuracy',
    'eval/accuracy_sampled': 'accuracy of sampled completions (mean over n_samples per prompt)',
    'eval/format_rate': 'fraction of greedy completions in the <think>…</think><answer>…</answer> format',
    'eval/pass@<k>': 'unbiased pass@k from n_samples sampled completions per prompt',
    'eval/cons@<k>': 'majority-vote (self-consistency) accuracy over k sampled completions',
    'eval/language_consistency': 'fraction of reasoning written in the prompt\'s language (language mixing)',
    'eval/completion_len_mean': 'mean greedy completion length in tokens',
    'eval/completion_len_correct': 'mean greedy completion length of the right answers (NaN if none)',
    'eval/completion_len_incorrect': 'mean greedy completion length of the wrong answers (NaN if none)',
    'eval/tool_calls_mean': 'tools: tool calls per greedy completion (the environment answers them as in training)',
    'eval/tool_call_rate': 'tools: fraction of greedy completions with at least one tool call',
    'eval/turns_mean': "tools: the model's stretches of writing per greedy completion",
    'eval/obs_tokens_mean': 'tools: observation tokens per greedy completion',
    'eval/gen_tokens_mean': "tools: the model's own tokens per greedy completion",
    'eval/obs_token_frac': 'tools: observation tokens / all greedy completion tokens',
    'eval/accuracy_with_tool': 'tools: greedy accuracy among completions with a tool call (NaN if none called)',
    'eval/accuracy_without_tool': 'tools: greedy accuracy among completions without one (NaN if all called)',
    'eval/tool_errors': "tools: greedy completions' calls whose tool reported an error (as train/tool_errors)",
    'eval/tool_timeouts': "tools: greedy completions' calls whose tool hit its own limit (as train/tool_timeouts)",
    'eval/tool_fallbacks': ("tools: greedy completions' environment steps that raised, timed out or returned the wrong "
                            'type (as train/tool_fallbacks; the reason is logged)'),
    'eval/tool_call_failed': ('tools: 1 when an environment call of the evaluation failed as a whole (EnvBatch.MAX_HUNG '
                              'steps stuck): the rows waiting for it ended there (logged)'),
    # --- perf/: wall-clock, the only non-deterministic metrics ---
    'perf/step_time_s': 'wall time of the jitted step, seconds (includes compilation on the first step)',
    'perf/tokens_per_s': ('completion tokens of the trained rows per second of step time (under partial rollouts '
                          'some were drawn in earlier steps: perf/decode_tokens_per_s counts what the step drew)'),
    'perf/decode_tokens_per_s': 'partial rollouts: tokens the step drew per second of step time',
    'perf/compile_time_s': 'wall time of the first (compiling) step after start or resume, seconds',
    'perf/eval_time_s': 'wall time of one evaluation, seconds',
    # --- ckpt/: checkpoint steps the start or resume skipped (the fallbacks of infra/checkpoint.py) ---
    'ckpt/unusable_skipped': ('checkpoint steps that failed to load or verify (the reason is logged), moved to '
                              'checkpoints/corrupt; the run went on from an older step: this row'),
    'ckpt/partial_skipped': ('checkpoint steps without a commit marker (a save that crashed) moved to '
                             'checkpoints/corrupt at start or resume (logged)'),
    # --- config_change/: a resume that took changed config values (train.allow_config_change) ---
    'config_change/<key>': '1 at the step where a resumed run took a changed value of config key <key>; the new '
                           'config is in config.<step>.json next to the checkpoints',
}

# Names whose values are counts (sums or extremes of whole numbers): written as JSON integers whatever dtype the
# step computed them in (a float32 sum in the jitted step), so a reader can tell a count from a mean.
COUNTS = frozenset({
    'train/completion_len_max', 'train/ref_reset', 'train/decode_steps', 'train/decode_row_steps',
    'train/version_lag_max', 'train/carried_rows', 'train/ready_groups', 'train/rollout_budget',
    'train/decode_tokens', 'train/train_len', 'train/tokens', 'train/skipped_updates', 'train/nonfinite_updates',
    'train/dynamic_sampling_kept', 'train/reward_fallbacks', 'train/tool_errors', 'train/tool_timeouts',
    'train/tool_fallbacks', 'train/tool_turn_limits', 'train/tool_obs_truncated', 'eval/tool_errors',
    'eval/tool_timeouts', 'eval/tool_fallbacks', 'eval/tool_call_failed', 'ckpt/unusable_skipped',
    'ckpt/partial_skipped', 'config_change/<key>'})

_PLACEHOLDERS = {'<term>': r'[A-Za-z0-9_.\-]+', '<k>': r'[1-9][0-9]*', '<key>': r'[A-Za-z0-9_.]+'}


def _compile(name: str) -> re.Pattern:
  pattern = re.escape(name)
  for placeholder, regex in _PLACEHOLDERS.items():
    pattern = pattern.replace(re.escape(placeholder), regex)
  return re.compile(pattern + r'\Z')


_EXACT = frozenset(n for n in METRICS if '<' not in n)
_TEMPLATES = tuple((n, _compile(n)) for n in METRICS if '<' in n)
_PATTERNS = tuple(p for _, p in _TEMPLATES)

# Shown in the progress line when present in a row.
PROGRESS_KEYS = ('train/reward_mean', 'train/kl', 'train/entropy', 'train/completion_len_mean', 'train/loss',
                 'eval/accuracy')


def is_known(name: str) -> bool:
  return name in _EXACT or any(p.match(name) for p in _PATTERNS)


def _entry(name: str) -> str | None:
  """The METRICS key that defines `name` (itself, or the template it matches)."""
  return name if name in _EXACT else next((t for t, p in _TEMPLATES if p.match(name)), None)


def is_count(name: str) -> bool:
  return _entry(name) in COUNTS


def check_names(names) -> None:
  """Raises on a name missing from METRICS, so the docs table can never be incomplete."""
  for name in names:
    if not is_known(name):
      raise ValueError(f'metric {name!r} is not defined in grpo_jax/run/metrics.py METRICS; add it there with a '
                       'one-line description (the docs table is generated from it)')


def markdown_table() -> str:
  """The docs table of every metric name, in METRICS order."""
  lines = ['| Metric | Meaning |', '|---|---|']
  lines += [f'| `{name}` | {desc.replace("|", "/")}{" (count: an integer)" if name in COUNTS else ""} |'
            for name, desc in METRICS.items()]
  return '\n'.join(lines) + '\n'


def _to_json_scalar(name: str, value: Any) -> int | float | str:
  arr = np.asarray(value)
  if arr.size != 1:
    raise ValueError(f'metric {name!r} has shape {arr.shape}; log scalars only (reduce it with mean/max first)')
  arr = arr.reshape(())
  if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer):
    return int(arr)
  try:
    item = float(arr)  # also bfloat16 and other ml_dtypes floats
  except (TypeError, ValueError):
    raise ValueError(f'metric {name!r} has non-numeric value {value!r}; log numbers only') from None
  if not math.isfinite(item):
    return 'nan' if math.isnan(item) else ('inf' if item > 0 else '-inf')
  if is_count(name):
    if not item.is_integer():
      raise ValueError(f'metric {name!r} is a count (metrics.COUNTS) but got {item!r}; log the whole number, or '
                       'move the name out of COUNTS if it is a mean')
    return int(item)
  return item


def _from_json_scalar(value: Any) -> Any:
  return float(value) if value in ('nan', 'inf', '-inf') else value


def _read_rows(path: str) -> list[dict[str, Any]]:
  """Rows of a .jsonl file, read tolerantly: a line that is not UTF-8, not JSON (a torn write), not an object or
  without an integer `step` is skipped, and the skipped lines are counted in one warning. Nothing a file holds
  raises here: callers read before they change any record. A pending merged row stands for its step (_with_pending)."""
  rows, bad = [], []
  if not os.path.exists(path):
    return _with_pending(path, rows)
  with open(path, 'rb') as f:
    for lineno, raw in enumerate(f, 1):
      if not raw.strip():
        continue
      try:
        row = json.loads(raw.decode('utf-8'))
      except (UnicodeDecodeError, ValueError):
        bad.append(lineno)
        continue
      if not isinstance(row, dict) or not isinstance(row.get('step'), int) or isinstance(row.get('step'), bool):
        bad.append(lineno)
        continue
      rows.append(row)
  if bad:
    logging.warning('%s: skipped %d unreadable line(s) (not UTF-8, not a JSON object with an integer step: a torn '
                    'write or an edit), line(s) %s', path, len(bad), _ranges(bad, 1))
  return _with_pending(path, rows)


def _pending_path(path: str) -> str:
  return path + '.pending'


def _with_pending(path: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """`rows` with the pending merged row (MetricWriter.write) in place of its step's rows: after a kill during a
  merge the file holds the old row, none, or a torn one, and the pending row is the step's whole row."""
  try:
    with open(_pending_path(path), 'rb') as f:
      row = json.loads(f.read().decode('utf-8'))
  except FileNotFoundError:
    return rows
  except (OSError, UnicodeDecodeError, ValueError):
    row = None
  if not isinstance(row, dict) or not isinstance(row.get('step'), int) or isinstance(row.get('step'), bool):
    logging.warning('%s is unreadable (an edit?); ignored', _pending_path(path))
    return rows
  kept = [r for r in rows if r['step'] != row['step']]
  at = next((i for i, r in enumerate(kept) if r['step'] > row['step']), len(kept))
  return kept[:at] + [row] + kept[at:]


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """metrics.jsonl rows with "nan"/"inf" strings turned back into floats."""
  return [{k: _from_json_scalar(v) for k, v in row.items()}
          for row in _read_rows(os.path.join(workdir, 'metrics.jsonl'))]


def missing_steps(workdir: str, upto: int, log_every: int) -> list[int]:
  """Logged steps (multiples of log_every, up to `upto`) with no row in metrics.jsonl: a deleted file, a torn row."""
  have = {r.get('step') for r in _read_rows(os.path.join(workdir, 'metrics.jsonl'))}
  return [k for k in range(log_every, upto + 1, log_every) if k not in have]


def warn_missing(workdir: str, upto: int, log_every: int) -> list[int]:
  """One warning when a resumed run's earlier rows are gone: they come from steps run before the checkpoint, so
  only rerunning those steps could rebuild them (the resume keeps training; its rows from `upto` on are complete)."""
  gone = missing_steps(workdir, upto, log_every) if jax.process_index() == 0 else []
  if gone:
    logging.warning('%s: the rows of %d logged steps up to the resumed step %d are missing (steps %s; the file was '
                    'deleted, cut or torn) and cannot be rebuilt without rerunning those steps; the run continues '
                    'and logs from step %d on (a new --workdir gives a complete record).',
                    os.path.join(workdir, 'metrics.jsonl'), len(gone), upto, _ranges(gone, log_every), upto + 1)
  return gone


def _ranges(steps: Sequence[int], gap: int) -> str:
  """[1, 2, 3, 7] (gap 1) -> '1-3, 7'."""
  out: list[list[int]] = []
  for k in steps:
    if out and k - out[-1][1] == gap:
      out[-1][1] = k
    else:
      out.append([k, k])
  return ', '.join(str(a) if a == b else f'{a}-{b}' for a, b in out)


def _truncate_jsonl(path: str, keep_up_to: int | None) -> None:
  """Atomically drops rows with step > keep_up_to (all rows if None): a resumed run re-logs those steps. A pending
  merged row (MetricWriter.write) is written into the file first."""
  if not os.path.exists(path) and not os.path.exists(_pending_path(path)):
    return
  rows = _read_rows(path)
  kept = [r for r in rows if keep_up_to is not None and isinstance(r.get('step'), int) and r['step'] <= keep_up_to]
  if len(kept) != len(rows):
    logging.warning('%s: dropping %d rows %s', path, len(rows) - len(kept),
                    'of an earlier run (fresh start)' if keep_up_to is None else
                    f'after step {keep_up_to} (the run resumes from there)')
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    for row in kept:
      f.write(json.dumps(row) + '\n')
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  for done in (_pending_path(path), _pending_path(path) + '.tmp'):  # its row is in the file now (or dropped with
    if os.path.exists(done):                                          # its step); a .tmp: a kill before the rename
      os.remove(done)


def _fmt_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}h{m:02d}m{s:02d}s' if h else f'{m}m{s:02d}s'


class MetricWriter:
  """Writes logged steps to every sink; only process 0 writes, every process validates names.

  `resume_step`: the step the run restarts from; rows after it are removed first (None = fresh run: all rows of
  an earlier run in this workdir are removed).
  """

  def __init__(self, workdir: str, *, resume_step: int | None = None, use_tensorboard: bool = True,
               wandb_project: str | None = None, total_steps: int | None = None, progress: bool = True):
    self.workdir = workdir
    self.total_steps = total_steps
    self.progress = progress
    self._active = jax.process_index() == 0
    self._tb = None
    self._wandb = None
    self._last_step: int | None = None
    self._last_row: dict[str, Any] = {}
    self._last_offset = 0
    self._t_first: tuple[float, int] | None = None
    if not self._active:
      return
    if wandb_project:
      self._wandb = self._init_wandb(wandb_project, resume_step)
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.samples_path = os.path.join(workdir, 'samples.jsonl')
    _truncate_jsonl(self.path, resume_step)
    _truncate_jsonl(self.samples_path, resume_step)
    rows = _read_rows(self.path)
    self._file = open(self.path, 'ab')  # pylint: disable=consider-using-with
    if rows:  # lets a resumed run merge into its last row and keeps steps monotone
      self._last_row = rows[-1]
      self._last_step = self._last_row['step']
      self._last_offset = self._file.tell() - len((json.dumps(self._last_row) + '\n').encode())
    if use_tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      # purge_step makes TensorBoard hide the old run's events from the resumed step on, and all of them on a fresh
      # start (metrics.jsonl dropped those rows above; without it a tag not yet rewritten showed the old run's values)
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'),
                               purge_step=0 if resume_step is None else resume_step + 1)

  def _init_wandb(self, project: str, resume_step: int | None):
    try:
      import wandb  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise ImportError(f'wandb_project={project!r} needs the wandb package: `pip install wandb` (and '
                        '`wandb login`), or set config.log.wandb_project="" to log without W&B') from None
    id_path = os.path.join(self.workdir, 'wandb_run_id.txt')
    os.makedirs(self.workdir, exist_ok=True)
    if resume_step is not None and os.path.exists(id_path):
      with open(id_path, encoding='utf-8') as f:
        run_id = f.read().strip()
    else:
      run_id = wandb.util.generate_id()
      with open(id_path, 'w', encoding='utf-8') as f:
        f.write(run_id)
    return wandb.init(project=project, id=run_id, resume='allow', dir=self.workdir)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Logs one step's scalars (jax/numpy/Python); a second call for the same step merges into its row."""
    check_names(metrics)
    if not self._active:
      return
    if self._file.closed:
      raise ValueError('MetricWriter.write after close(); create a new MetricWriter(workdir, resume_step=...)')
    step = int(step)
    values = {k: _to_json_scalar(k, v) for k, v in jax.device_get(dict(metrics)).items()}
    if self._last_step is not None and step < self._last_step:
      raise ValueError(f'step={step} is before the last logged step {self._last_step}; log steps in order '
                       '(a resumed run passes resume_step= to MetricWriter)')
    self._reopen_if_gone()
    merge = step == self._last_step
    if merge:  # rewrite the last line in place: one row per step
      values = {**{k: v for k, v in self._last_row.items() if k != 'step'}, **values}
    row = {'step': step, **dict(sorted(values.items()))}
    line = (json.dumps(row) + '\n').encode()
    if merge:  # the merged row is safe in the pending file before the old line is cut
      pending = _pending_path(self.path)
      with open(pending + '.tmp', 'wb') as f:
        f.write(line)
      os.replace(pending + '.tmp', pending)
      self._file.truncate(self._last_offset)
    self._file.seek(0, os.SEEK_END)
    self._last_offset = self._file.tell()
    self._file.write(line)
    self._file.flush()
    if merge:
      os.remove(_pending_path(self.path))
    self._last_step, self._last_row = step, row
    new = {k: float(_from_json_scalar(v)) for k, v in values.items() if k in metrics}
    if self._tb is not None:
      for k, v in new.items():
        self._tb.add_scalar(k, v, step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(new, step=step)
    if self.progress:
      self._print_progress(step, new)

  def _reopen_if_gone(self) -> None:
    """metrics.jsonl deleted (or moved away) while the run writes it: rows written to the open file would go to a
    file nobody can see. It is recreated, with a warning, and holds the rows from here on (the step being written
    included, whole)."""
    try:
      same = os.path.samestat(os.stat(self.path), os.fstat(self._file.fileno()))
    except FileNotFoundError:
      same = False
    if same:
      return
    self._file.close()
    self._file = open(self.path, 'ab')  # pylint: disable=consider-using-with
    self._last_offset = self._file.tell()
    logging.warning('%s was deleted or replaced while the run was writing it; writing a new one from step %s on '
                    '(rows of earlier steps are in the old file or gone; rerunning those steps is the only way to '
                    'rebuild them).', self.path, self._last_step if self._last_step is not None else 'the next')

  def _print_progress(self, step: int, values: Mapping[str, float]) -> None:
    now = time.perf_counter()
    parts = [f'step {step}' + (f'/{self.total_steps} ({100 * step / self.total_steps:.0f}%)'
                               if self.total_steps else '')]
    # Rate from the first logged step on, so the compiling step does not skew the ETA.
    if self._t_first is None:
      self._t_first = (now, step)
    elif step > self._t_first[1]:
      s_per_step = (now - self._t_first[0]) / (step - self._t_first[1])
      parts.append(f'{s_per_step:.3g} s/step')
      if self.total_steps:
        parts.append(f'ETA {_fmt_duration(s_per_step * max(self.total_steps - step, 0))}')
    shown = [f'{k.split("/", 1)[1]}={values[k]:.4g}' for k in PROGRESS_KEYS if k in values]
    print(' | '.join(parts + ([' '.join(shown)] if shown else [])), file=sys.stderr, flush=True)

  def log_samples(self, step: int, texts: Sequence[str], rewards: Sequence[float], *, n_print: int = 2,
                  prompts: Sequence[str] | None = None, references: Sequence[str] | None = None,
                  transcripts: Sequence[list] | None = None) -> None:
    """Appends (step, index, reward, text[, prompt, reference, transcript]) rows to samples.jsonl and prints the
    first `n_print`. `prompts` / `references`: each sample's prompt text and its example's reference answer;
    `transcripts`: a multi-turn sample's [{'role': 'model' | 'tool', 'text': ...}, ...] (envs/transcript.py)."""
    extra = {'prompt': prompts, 'reference': references, 'transcript': transcripts}
    for name, values in (('rewards', rewards), *extra.items()):
      if values is not None and len(values) != len(texts):
        raise ValueError(f'log_samples got {len(texts)} texts and {len(values)} {name}; pass one per text')
    if not self._active:
      return
    with open(self.samples_path, 'a', encoding='utf-8') as f:
      for i, (text, reward) in enumerate(zip(texts, rewards)):
        row = {'step': int(step), 'index': i, 'reward': _to_json_scalar('reward', reward), 'text': text}
        row.update({k: v[i] for k, v in extra.items() if v is not None})
        f.write(json.dumps(row, ensure_ascii=False) + '\n')
    for i, (text, reward) in enumerate(zip(texts[:n_print], rewards[:n_print])):
      shown = text if len(text) <= 400 else text[:400] + ' …'
      print(f'[sample step={step} #{i} reward={float(reward):.3g}] {shown}', file=sys.stderr, flush=True)

  def flush(self) -> None:
    if self._active:
      self._file.flush()
      if self._tb is not None:
        self._tb.flush()

  def close(self) -> None:
    if not self._active or self._file.closed:
      return
    self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
