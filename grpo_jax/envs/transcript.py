"""Readings of multi-turn rows, from what the engine's output holds: tokens, the completion mask and the observation
mask (1 where a token was appended from an observation) and the per-row counts of the environment's events
(envs/batch.py's event_R, summed over a row's calls by the engine). `readings` and `summary` run on the host
(NumPy) or, given xp=jax.numpy, in the RL step's graph (its train/ metrics): one definition for both.

Per row: tool calls (the steps the environment answered as a call: the tool's output, its error or its timeout; a
stop marker it ended the row on, one past tools.max_turns, one at the row's last position or one whose step fell back
is no call), turns (the model's stretches between observations),
observation and generated tokens; over the batch: the metric values of docs/tools.md (`summary`). `transcript`
splits a row into its model and tool parts for samples.jsonl.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from grpo_jax.envs import batch as env_batch


def row_parts(tokens_L, mask_L, obs_L) -> list[tuple[str, np.ndarray]]:
  """The row's valid tokens as alternating ('model', ids) / ('tool', ids) parts, in order."""
  tokens_L, mask_L, obs_L = np.asarray(tokens_L), np.asarray(mask_L), np.asarray(obs_L)
  n = int(mask_L.sum())
  parts: list[tuple[str, list[int]]] = []
  for t, o in zip(tokens_L[:n], obs_L[:n]):
    kind = "tool" if o else "model"
    if not parts or parts[-1][0] != kind:
      parts.append((kind, []))
    parts[-1][1].append(int(t))
  return [(k, np.asarray(ids, np.int32)) for k, ids in parts]


CALL_EVENTS = (env_batch.CALL, env_batch.TOOL_ERROR, env_batch.TOOL_TIMEOUT)  # a step that called the tool


def readings(mask_NxL, obs_NxL, events_NxE, xp=np) -> dict[str, Any]:
  """Per-row counts: calls_N (from the engine's per-row event counts `events_NxE`, not the stop markers written:
  module docstring), turns_N, obs_tokens_N, gen_tokens_N (int64 with NumPy; int32 with xp=jax.numpy, in the RL
  step's graph)."""
  mask_NxL, obs_NxL, events_NxE = (xp.asarray(x) for x in (mask_NxL, obs_NxL, events_NxE))
  valid = mask_NxL > 0
  obs = valid & (obs_NxL > 0)
  gen = valid & ~obs
  calls = sum(events_NxE[:, e] for e in CALL_EVENTS)
  # a turn starts at a generated token that is the row's first or follows an observation token
  prev_obs = xp.concatenate([xp.ones_like(obs[:, :1]), obs[:, :-1]], axis=1)
  turns = (gen & prev_obs).sum(-1)
  ints = np.int64 if xp is np else xp.int32
  return {"calls_N": calls.astype(ints), "turns_N": turns.astype(ints),
          "obs_tokens_N": obs.sum(-1).astype(ints), "gen_tokens_N": gen.sum(-1).astype(ints)}


def _mean(x, xp, where=None):
  """Mean of x (over `where`); NaN when nothing is counted."""
  x = xp.asarray(x, xp.float32 if xp is not np else np.float64)
  w = xp.ones_like(x) if where is None else xp.asarray(where).astype(x.dtype)
  n = w.sum()
  return xp.where(n > 0, (x * w).sum() / xp.maximum(n, 1), xp.nan)


def summary(r: dict[str, Any], correct_N=None, tool_errors_N=None, tool_timeouts_N=None,
            fallbacks_N=None, xp=np) -> dict[str, Any]:
  """The batch's tool readings (names without their `train/` or `eval/` prefix; docs/tools.md lists them): floats
  with NumPy, scalars in the graph with xp=jax.numpy (the RL step's metrics). `correct_N`: 1 where the row's answer
  is right; accuracy with / without a tool call is NaN where no row is in that group. The event counts are the
  engine's per-row sums of envs/batch.py's event codes."""
  calls = xp.asarray(r["calls_N"])
  out = {"tool_calls_mean": _mean(calls, xp), "tool_call_rate": _mean(calls > 0, xp),
         "turns_mean": _mean(r["turns_N"], xp), "obs_tokens_mean": _mean(r["obs_tokens_N"], xp),
         "gen_tokens_mean": _mean(r["gen_tokens_N"], xp)}
  n_obs, n_gen = xp.asarray(r["obs_tokens_N"]).sum(), xp.asarray(r["gen_tokens_N"]).sum()
  out["obs_token_frac"] = xp.where(n_obs + n_gen > 0, n_obs / xp.maximum(n_obs + n_gen, 1), 0.0)
  if correct_N is not None:
    out["accuracy_with_tool"] = _mean(correct_N, xp, calls > 0)
    out["accuracy_without_tool"] = _mean(correct_N, xp, calls == 0)
  for name, x in (("tool_errors", tool_errors_N), ("tool_timeouts", tool_timeouts_N), ("tool_fallbacks", fallbacks_N)):
    if x is not None:
      out[name] = xp.asarray(x).sum().astype(xp.float32 if xp is not np else np.float64)
  return {k: float(v) for k, v in out.items()} if xp is np else out


def transcript(tokens_L, mask_L, obs_L, tok) -> list[dict[str, str]]:
  """The row as [{'role': 'model' | 'tool', 'text': ...}, ...] (samples.jsonl's interleaved transcript)."""
  return [{"role": kind, "text": tok.decode(ids)} for kind, ids in row_parts(tokens_L, mask_L, obs_L)]
