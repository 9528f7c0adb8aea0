"""One host round trip for every row paused at a chunk boundary: the fixed-shape array contract the engine consumes.

The engine pauses a row when it emits a stop marker (tools.stop_markers); at the next chunk boundary it calls
`EnvBatch.callback` once with the rows of that call (R rows, static; the paused ones marked active), and appends each
row's observation to its context (prefilled into its KV, not sampled) or ends the row. Every shape is static: R and
L are the caller's, O = tools.max_obs_tokens, K = len(COUNTS).

Inputs:
  tokens_RxL  int32    each row's completion so far (its own tokens and the observations appended), left-aligned
  obs_RxL     int32    1 where a token is an observation's, 0 where the model wrote it
  len_R       int32    tokens so far; the last is the stop marker the row paused on
  active_R    bool     the row paused at this boundary (the other rows are not read; their outputs are zeros)
  fields      {name: [R, ...]}  the batch's host fields of each row's prompt (answer_N, ...): EnvState.fields
Outputs (EnvOut):
  obs_RxO     int32    the observation's token ids, left-aligned, pad_id after obs_len_R
  obs_len_R   int32    how many of them to append: at most min(O, L - len_R); 0 when nothing is appended
  reward_R    float32  the environment's reward for this step (the fallback reward for a fallback row)
  done_R      bool     the row ends: after its marker (the turn limit, a fallback), or after its observation (no
                       room left after it; the environment's done, whose observation is the EOS id alone: the
                       transcript ends as a finished row's does, so the verifiers score it)
  status_R    int32    OK, or why the row got the fallback (RAISED / TIMEOUT / WRONG_TYPE / NONFINITE: host_calls)
  event_R     int32    what happened (EVENTS): the readings of envs/transcript.py count these per row
  status      int32    OK, or the call as a whole did not run (TIMEOUT: MAX_HUNG abandoned calls still running;
                       RAISED: the runner itself failed). Like a failing Python reward term's status: the step keeps
                       its old state, and the host raises `error_message(status)` after it.
  counts_K    int32    over the call's rows: COUNTS (calls: the tool's steps, not a row the environment ended;
                       tool errors, tool timeouts, fallbacks, truncated)

A row's turn is everything the model wrote since its last observation or stop marker. Its turn index is the number
of stop markers among its own tokens; past `max_turns` the environment is not called and the row ends
(TURN_LIMIT). An observation longer than the room is cut, keeping the format's closing text when it fits
(truncated, counted). A step that raises, outlives `timeout_s`, or returns anything but (str | None, a finite
number, bool, dict | None) is a counted fallback: the row ends with `fallback_reward`; never an exception in the
callback. State: a stateful environment's state after each step is kept under a digest of (fields, tokens so far);
a call that finds none (a resumed run, a carried row, an evicted entry, another vmapped run's row) rebuilds it by
replaying the row's earlier turns. So a repeated call with the same inputs gives the same outputs, as
`jax.pure_callback` allows, provided the environment is deterministic.
"""
from __future__ import annotations

import collections
import copy
import hashlib
import numbers
import threading
from typing import Any, NamedTuple, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.envs import base
from grpo_jax.envs import formats
from grpo_jax.envs import registry
from grpo_jax.infra import host_calls

# event_R codes
NONE, CALL, TOOL_ERROR, TOOL_TIMEOUT, ENDED, TURN_LIMIT, FALLBACK = range(7)
EVENTS = {NONE: "not paused", CALL: "the tool answered", TOOL_ERROR: "the tool reported an error (info['error'])",
          TOOL_TIMEOUT: "the tool hit its own time limit (info['timeout'])",
          ENDED: "the environment ended the row (done: its EOS appended)", TURN_LIMIT: "past tools.max_turns: ended",
          FALLBACK: "the step raised / timed out / returned the wrong type: ended with the fallback reward"}
COUNTS = ("calls", "tool_errors", "tool_timeouts", "fallbacks", "truncated")


class EnvOut(NamedTuple):
  obs_RxO: Any
  obs_len_R: Any
  reward_R: Any
  done_R: Any
  status_R: Any
  event_R: Any
  status: Any
  counts_K: Any


def turns(tokens_L: np.ndarray, obs_L: np.ndarray, n: int, stop_ids: Sequence[int]) -> tuple[list[np.ndarray], int]:
  """(the row's turns that ended with a stop marker, in order, the last being the current one; the index where the
  current turn starts). A turn starts after an observation token or a previous stop marker."""
  stops = set(int(s) for s in stop_ids)
  out, start = [], 0
  for p in range(n):
    if obs_L[p]:
      start = p + 1
    elif int(tokens_L[p]) in stops:
      out.append(tokens_L[start:p + 1])
      start = p + 1
  if start < n:  # a row paused without a marker (not the engine's contract): its trailing text is its turn
    out.append(tokens_L[start:n])
  return out, (n - len(out[-1]) if out else n)


def _digest(fields_row: dict, tokens: np.ndarray, obs: np.ndarray) -> bytes:
  h = hashlib.sha256()
  for k in sorted(fields_row):
    v = np.asarray(fields_row[k])
    h.update(k.encode() + str(v.dtype).encode() + str(v.shape).encode() + v.tobytes())
  h.update(np.asarray(tokens, np.int32).tobytes() + b"|" + np.asarray(obs, np.int8).tobytes())
  return h.digest()


def check_result(res) -> tuple[tuple | None, int, str]:
  """((observation, reward, done, info), OK, '') for a well-typed StepResult, else (None, status, why)."""
  if not isinstance(res, tuple) or len(res) != 4:
    return None, host_calls.WRONG_TYPE, f"returned {type(res).__name__}, expected (observation, reward, done, info)"
  obs, reward, done, info = res
  if obs is not None and not isinstance(obs, str):
    return None, host_calls.WRONG_TYPE, f"observation is {type(obs).__name__}, expected str or None"
  if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real):
    return None, host_calls.WRONG_TYPE, (f"reward is {type(reward).__name__} ({host_calls.short(reward)}), expected "
                                         "a float")
  value = host_calls.finite_f32(reward)  # NaN, inf, or beyond float32 (1e39 would be inf in the step)
  if value is None:
    return None, host_calls.NONFINITE, f"reward is {host_calls.short(reward)} (not a finite float32)"
  if not isinstance(done, (bool, np.bool_)):
    return None, host_calls.WRONG_TYPE, f"done is {type(done).__name__} ({done!r}), expected a bool"
  if info is not None and not isinstance(info, dict):
    return None, host_calls.WRONG_TYPE, f"info is {type(info).__name__}, expected a dict"
  for k in ("timeout", "error"):  # read as flags; an array's truth raises, which failed every row of the call
    try:
      bool((info or {}).get(k))
    except Exception as e:  # pylint: disable=broad-except
      return None, host_calls.WRONG_TYPE, (f"info['{k}'] is {type(info[k]).__name__} ({host_calls.short(info[k])}), "
                                           f"whose truth cannot be read ({type(e).__name__}); give a bool or a str")
  return (obs, value, bool(done), info or {}), host_calls.OK, ""


class EnvBatch:
  """The host side of one environment for the engine: `host` (numpy in, numpy out, never raises) and `callback`
  (the same through one jax.pure_callback)."""

  MAX_HUNG = 4       # abandoned (timed-out) steps still running; beyond this the whole call fails (status TIMEOUT)
  MAX_STATES = 4096  # states kept for stateful environments (least recently used dropped: they replay)

  def __init__(self, env, tok, *, stop_ids: Sequence[int], max_obs_tokens: int, max_turns: int,
               timeout_s: float, fallback_reward: float = 0.0, workers: int = 8, name: str = "env",
               tail: str = "", format: formats.Format | None = None):  # pylint: disable=redefined-builtin
    if max_turns < 1 or max_obs_tokens < 1 or not timeout_s > 0:
      raise ValueError(f"EnvBatch: max_turns={max_turns}, max_obs_tokens={max_obs_tokens} must be >= 1 and "
                       f"timeout_s={timeout_s} > 0")
    self.env, self.tok, self.name = env, tok, name
    self.stop_ids = tuple(int(i) for i in stop_ids)
    self.max_obs_tokens, self.max_turns = int(max_obs_tokens), int(max_turns)
    self.timeout_s, self.fallback_reward = float(timeout_s), float(fallback_reward)
    self.stateful = bool(getattr(env, "stateful", True))
    tail = format.tail if format is not None and not tail else tail
    self.tail, self.tail_ids = tail, tuple(tok.encode(tail)) if tail else ()
    # an observation's text -> ids: the format's rule (qwen: a tool's output that holds a token's string is text)
    self._obs_ids = (lambda text: format.observation_ids(text, tok)) if format is not None else tok.encode
    self.eos_id = int(tok.eos_id)  # a row the environment ends gets it as its observation (a finished transcript)
    self.last_error = ""
    self._workers = host_calls.Workers(f"env-{name}", workers)
    self._states: collections.OrderedDict[bytes, base.EnvState] = collections.OrderedDict()
    self._uncopyable = False  # a state deepcopy refused once (warned; states are replayed instead)
    self._dropped_final = False  # an observation returned with done=True (warned once: it is not appended)
    # False where no reward term weights the environment's rewards (config.rewards without 'env' at w != 0:
    # train.reward_terms); a non-zero reward is then said to go unused, once
    self.rewards_read = True
    self._lock = threading.Lock()
    # Under a mesh every device calls `host` with its own rows (rollout/turns.py), from the runtime's threads, at
    # once: one call at a time (the worker pool and last_error are shared)
    self._call_lock = threading.Lock()

  # ------------------------------------------------------------------------------------------ state cache
  def _get_state(self, key: bytes):
    with self._lock:
      st = self._states.get(key)
      if st is not None:
        self._states.move_to_end(key)
    return copy.deepcopy(st)

  def _put_state(self, key: bytes, state) -> None:
    try:
      st = copy.deepcopy(state)
    except Exception as e:  # pylint: disable=broad-except  (a lock, a file, a process in the state)
      # not kept: the row's next call rebuilds it by replaying its turns (correct, slower); said once
      if not self._uncopyable:
        self._uncopyable = True
        logging.warning("environment '%s': its state cannot be copied (%s: %s), so it is not kept between calls; "
                        "each call replays the row's earlier turns instead. Keep plain data in EnvState, or set "
                        "stateful = False if the state carries nothing.", self.name, type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")
      return
    with self._lock:
      self._states[key] = st
      self._states.move_to_end(key)
      while len(self._states) > self.MAX_STATES:
        self._states.popitem(last=False)

  def _initial(self, fields_row: dict):
    make = getattr(self.env, "initial_state", None)
    return make(fields_row) if make is not None else base.EnvState(fields=dict(fields_row))

  def _step(self, key: bytes, fields_row: dict, actions: list[str]):
    """On a worker thread: the row's state (kept, or rebuilt by replaying its earlier turns), then its step."""
    state = self._get_state(key) if self.stateful else None
    if state is None:
      state = self._initial(fields_row)
      if self.stateful:
        for a in actions[:-1]:
          self.env.step(state, a)
      elif hasattr(state, "turn"):
        state.turn = len(actions) - 1
    return self.env.step(state, actions[-1]), state

  # ----------------------------------------------------------------------------------------- the contract
  def zeros(self, r: int) -> EnvOut:
    return EnvOut(np.full((r, self.max_obs_tokens), self.tok.pad_id, np.int32), np.zeros(r, np.int32),
                  np.zeros(r, np.float32), np.zeros(r, bool), np.zeros(r, np.int32), np.zeros(r, np.int32),
                  np.int32(host_calls.OK), np.zeros(len(COUNTS), np.int32))

  def _cut(self, ids: list[int], room: int, text: str = "") -> tuple[list[int], bool]:
    """At most `room` ids; a cut keeps the format's closing tokens when they end the observation (its `text`, or
    its ids) and fit. By the text: a tool output ending in whitespace can tokenise into the tail's first token (a
    BPE with '\n\n', as Qwen2.5's), so the ids end differently and the cut turn was left open."""
    if len(ids) <= room:
      return ids, False
    t = self.tail_ids
    if t and len(t) < room and ((self.tail and text.endswith(self.tail)) or tuple(ids[-len(t):]) == t):
      return ids[:room - len(t)] + list(t), True
    return ids[:room], True

  def host(self, tokens_RxL, obs_RxL, len_R, active_R, fields) -> EnvOut:
    """The engine's call (module docstring). Never raises. One at a time (devices call at once)."""
    with self._call_lock:
      return self._host(tokens_RxL, obs_RxL, len_R, active_R, fields)

  def _host(self, tokens_RxL, obs_RxL, len_R, active_R, fields) -> EnvOut:
    tokens_RxL, obs_RxL = np.asarray(tokens_RxL), np.asarray(obs_RxL)
    len_R, active_R = np.asarray(len_R), np.asarray(active_R).astype(bool)
    r_count, length = tokens_RxL.shape
    out = self.zeros(r_count)
    if not active_R.any():
      return out
    try:
      if self._workers.hung() >= self.MAX_HUNG:
        self.last_error = (f"{self.MAX_HUNG} earlier steps timed out (tools.timeout_s={self.timeout_s}s) and are "
                           "still running")
        return out._replace(status=np.int32(host_calls.TIMEOUT))
      fields = {k: np.asarray(v) for k, v in fields.items()}
      rows, jobs = [], []
      for r in np.flatnonzero(active_R):
        n = int(len_R[r])
        row_turns, start = turns(tokens_RxL[r], obs_RxL[r], n, self.stop_ids)
        fields_row = {k: v[r] for k, v in fields.items()}
        if len(row_turns) > self.max_turns:
          out.done_R[r], out.event_R[r] = True, TURN_LIMIT
          continue
        key = _digest(fields_row, tokens_RxL[r, :start], obs_RxL[r, :start])
        rows.append((r, n, fields_row))
        jobs.append((key, fields_row, [self.tok.decode(t) for t in row_turns]))
      counts = dict.fromkeys(COUNTS, 0)
      for (r, n, fields_row), (status, value) in zip(rows, self._workers.run(self._step, jobs, self.timeout_s)):
        if status == host_calls.OK:
          res, state = value
          checked, status, why = check_result(res)
          if status == host_calls.OK and checked[0] and not checked[2]:
            try:  # the observation's ids (a str the tokenizer refuses, e.g. a lone surrogate, is this row's fault)
              obs_ids = self._obs_ids(checked[0])
            except Exception as e:  # pylint: disable=broad-except
              status, why = host_calls.WRONG_TYPE, ("observation cannot be tokenized "
                                                   f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
          else:
            obs_ids = []
        else:
          why = (f"did not return within tools.timeout_s={self.timeout_s}s" if status == host_calls.TIMEOUT
                 else f"raised {type(value).__name__}: {value}")
        if status != host_calls.OK:
          self.last_error = f"row {r}: {why}"
          out.done_R[r], out.reward_R[r], out.status_R[r], out.event_R[r] = True, self.fallback_reward, status, FALLBACK
          counts["fallbacks"] += 1
          continue
        obs_text, reward, done, info = checked
        if done:  # ended as if the model had written EOS: the verifiers score a transcript that ends with one
          obs_ids = [self.eos_id]
        if done and obs_text and not self._dropped_final:  # the row ends at its marker: nothing can follow it
          self._dropped_final = True
          logging.warning("environment '%s' returned an observation with done=True (%r); the row ends after its "
                          "stop marker (with the EOS id), so such observations are not appended (return it with "
                          "done=False, then end the row at the next call). Said once.", self.name, obs_text[:80])
        if reward and not self.rewards_read:
          self.rewards_read = True  # said once
          logging.warning("environment '%s' returned a reward (%s) but config.rewards weights no ('env', w) term, so "
                          "its rewards are not used; add ('env', 1.0) to config.rewards to train on them.", self.name,
                          reward)
        ids, cut = self._cut(obs_ids, min(self.max_obs_tokens, length - n), "" if done else obs_text)
        counts["truncated"] += int(cut)
        out.obs_RxO[r, :len(ids)] = ids
        out.obs_len_R[r], out.reward_R[r] = len(ids), reward
        out.done_R[r] = done or length - n - len(ids) <= 0
        event = (TOOL_TIMEOUT if info.get("timeout") else TOOL_ERROR if info.get("error") else
                 ENDED if done else CALL)  # done: only the EOS id is appended, whatever the observation
        out.event_R[r] = event
        counts["calls"] += int(event != ENDED)  # the tool's steps (envs/transcript.py CALL_EVENTS), as the readings
        counts["tool_errors"] += int(event == TOOL_ERROR)
        counts["tool_timeouts"] += int(event == TOOL_TIMEOUT)
        if self.stateful and not out.done_R[r]:
          nxt = np.concatenate([tokens_RxL[r, :n], np.asarray(ids, np.int32)])
          self._put_state(_digest(fields_row, nxt, np.concatenate([obs_RxL[r, :n], np.ones(len(ids), np.int32)])),
                          state)
      out = out._replace(counts_K=np.asarray([counts[k] for k in COUNTS], np.int32))
      return out
    except Exception as e:  # pylint: disable=broad-except  # reported as the call's status, never raised
      self.last_error = f"the runner failed: {type(e).__name__}: {e}"
      return self.zeros(r_count)._replace(status=np.int32(host_calls.RAISED))

  def callback(self, tokens_RxL, obs_RxL, len_R, active_R, fields) -> EnvOut:
    """`host` as one jax.pure_callback (in-graph; under vmap each run calls the host once with its own rows)."""
    r_count = tokens_RxL.shape[0]
    i32 = jnp.int32
    shapes = EnvOut(jax.ShapeDtypeStruct((r_count, self.max_obs_tokens), i32), jax.ShapeDtypeStruct((r_count,), i32),
                    jax.ShapeDtypeStruct((r_count,), jnp.float32), jax.ShapeDtypeStruct((r_count,), jnp.bool_),
                    jax.ShapeDtypeStruct((r_count,), i32), jax.ShapeDtypeStruct((r_count,), i32),
                    jax.ShapeDtypeStruct((), i32), jax.ShapeDtypeStruct((len(COUNTS),), i32))
    return EnvOut(*jax.pure_callback(self.host, shapes, tokens_RxL, obs_RxL, len_R, active_R, fields,
                                     vmap_method="sequential"))

  def error_message(self, status: int) -> str:
    if status == host_calls.TIMEOUT:
      fix = (f"Make its step return within tools.timeout_s (stuck steps are abandoned, at most {self.MAX_HUNG} at "
             "once), or raise tools.timeout_s.")
    else:  # the runner itself failed (not one row's step: those are counted fallbacks)
      fix = "This is a bug in the environment runner (envs/batch.py); rerun with --verbose and report it."
    return (f"environment '{self.name}' ({type(self.env).__name__}) {host_calls.STATUS_TEXT.get(status, status)}: "
            f"{self.last_error}. {fix}")

  def close(self) -> None:
    self._workers.close()


def context(config, tok) -> base.EnvContext:
  """The EnvContext of a run: its task object, tokenizer, `tools.format` and the `tools` options."""
  from grpo_jax.tasks import data as data_lib  # pylint: disable=g-import-not-at-top  (the task only when building)
  try:
    task = data_lib.make_task(config.task)
  except ValueError:  # a task without text examples (digits): the environment gets none
    task = None
  tools = config.tools
  return base.EnvContext(task=task, tokenizer=tok, format=formats.get(tools.format),
                         options=tools.to_dict() if hasattr(tools, "to_dict") else dict(tools))


def build(config, tok) -> EnvBatch:
  """The run's EnvBatch from its `tools` group (validated first: run/validate.py validate_tools)."""
  t = config.tools
  ctx = context(config, tok)
  return EnvBatch(registry.make(t.env, ctx), tok, stop_ids=formats.stop_ids(tok, t.stop_markers),
                  max_obs_tokens=t.max_obs_tokens, max_turns=t.max_turns, timeout_s=t.timeout_s,
                  fallback_reward=t.fallback_reward, workers=t.workers, name=t.env, format=ctx.format)


def prompt_tools(config, tok, env=None) -> tuple[dict, ...]:
  """The tool schemas a run's prompts list — its RL batches' and its held-out evaluation's alike: under
  tools.format='qwen' those of its environment (`env`: the run's Env, else built here), rendered into the chat
  template as transformers' apply_chat_template(tools=...) does; () otherwise (the task's own prompts)."""
  t = config.get("tools")
  if t is None or not t.env or t.format != "qwen":
    return ()
  if env is None:
    env = registry.make(t.env, context(config, tok))
  return tuple(tool.schema() for tool in formats.env_tools(env))
