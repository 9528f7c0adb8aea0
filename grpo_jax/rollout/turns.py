"""Multi-turn rows in the continuous engine (tools.env, docs/tools.md): what a slot holds between its turns, and the
one host call per chunk boundary for every paused row, made on each device with that device's rows.

A row that emits a stop id (tools.stop_markers) pauses: it keeps its slot and its KV, and stops advancing. At the next
chunk boundary (every `chunk` decode steps, or at once when no live row is left that is not paused) the paused rows go
to the environment in ONE call (envs/batch.py's `EnvBatch.callback` contract: fixed shapes, never raises). A row that
gets an observation is fed its O ≤ tools.max_obs_tokens tokens teacher-forced, one per decode step, as if it had
sampled them: each goes through a decode step into the row's KV (the same kernel, the same positions, no second
program), is written to the row's buffer with obs = 1 and a sampling log-prob of 0, and the row resumes sampling
after the last one. So an observation costs decode steps like generated tokens do; a prefill of the observation
(several positions at once) would save those steps at the price of a second compiled kernel per slot count: not
done. A row the environment ends with `done` is fed the EOS id as a one-token observation and ends after it
(`fend_S`), so its transcript ends as a finished row's does (the verifiers need the EOS after `</answer>`); the turn
limit and a fallback end the row at its marker, unfinished. The total length stays ≤ L (the environment never
returns more than the room, and a row ends at position L - 1 as always).

Under a mesh the call runs inside `shard_map` over every mesh axis (a callback in SPMD code runs per device only
when all axes are manual: jax's callback lowering), rows split over the batch axes: each device calls the host
with its own slots. Devices that hold a copy of the same rows (the other axes, e.g. `tensor`) do not call the
environment again: only the first of them passes its paused rows; its outputs are summed over those axes (the
others' are zeros), so every copy gets the same observations.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from grpo_jax.envs import batch as env_batch
from grpo_jax.infra import host_calls

EVENTS = len(env_batch.EVENTS)  # per-row counts of each event code (envs/batch.py)
COUNTS = len(env_batch.COUNTS)


class Tools(NamedTuple):
  """What the engine needs to run an environment (static: part of the traced program's closure)."""
  call: Callable[..., env_batch.EnvOut]  # EnvBatch.callback's contract (tokens_RxL, obs_RxL, len_R, active_R, fields)
  stop_ids: tuple[int, ...]  # a row that emits one pauses for the environment
  max_obs: int               # O: the observation's static width (tools.max_obs_tokens)
  chunk: int = 8             # decode steps between boundaries (tools.chunk)


class Slots(NamedTuple):
  """A slot's turn state (moves with the slot under compaction)."""
  paused_S: jax.Array  # bool: emitted a stop id, waiting for the next boundary
  fpos_S: jax.Array    # int32: the next observation token to feed
  flen_S: jax.Array    # int32: observation tokens to feed (fpos_S < flen_S: the row is being fed)
  fbuf_SxO: jax.Array  # int32: the observation's tokens
  fend_S: jax.Array    # bool: the row ends after its last observation token (the environment's done: its EOS)


class Rows(NamedTuple):
  """Per row (the engine's [D, N/D, ...] device blocks) and over the rollout: what the environment did."""
  obs_DxNdxL: jax.Array     # int32: 1 where a token was fed from an observation
  reward_DxNdxL: jax.Array  # float32: each environment step's reward at the position of the stop id it answered
  step_DxNdxL: jax.Array    # int32: 1 at the position of each stop id the environment answered
  events_DxNdxE: jax.Array  # int32: per row, how many of its calls ended in each envs/batch.py event code
  status: jax.Array         # int32: host_calls.OK unless a call as a whole failed (the step must keep its state)
  counts_K: jax.Array       # int32 [len(COUNTS)]: envs/batch.py's COUNTS summed over every call
  calls: jax.Array          # int32: boundaries that called the host


class Result(NamedTuple):
  """The rollout's environment outputs, [N, ...] in row order."""
  obs_NxL: jax.Array
  reward_NxL: jax.Array
  step_NxL: jax.Array
  events_NxE: jax.Array
  status: jax.Array
  counts_K: jax.Array
  calls: jax.Array


def init_slots(s: int, o: int) -> Slots:
  return Slots(paused_S=jnp.zeros((s,), bool), fpos_S=jnp.zeros((s,), jnp.int32), flen_S=jnp.zeros((s,), jnp.int32),
               fbuf_SxO=jnp.zeros((s, o), jnp.int32), fend_S=jnp.zeros((s,), bool))


def init_rows(d: int, nd: int, L: int) -> Rows:
  return Rows(obs_DxNdxL=jnp.zeros((d, nd, L), jnp.int32), reward_DxNdxL=jnp.zeros((d, nd, L), jnp.float32),
              step_DxNdxL=jnp.zeros((d, nd, L), jnp.int32),
              events_DxNdxE=jnp.zeros((d, nd, EVENTS), jnp.int32), status=jnp.int32(host_calls.OK),
              counts_K=jnp.zeros((COUNTS,), jnp.int32), calls=jnp.int32(0))


def emit(turn: Slots, go_S: jax.Array, tok_S: jax.Array, logp_S: jax.Array, last_S: jax.Array, is_eos: Callable,
         stop_ids) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, Slots]:
  """The turn rules of one emitted token, for the engine's and the carry's decode loops alike: a fed slot emits its
  observation's next token (log-prob 0, never an end or a pause, except the last token of a row the environment
  ended: its EOS); a drawn EOS, that fed EOS or the row's last position (`last_S`) ends a slot that goes (`go_S`:
  live and not paused); a drawn stop id pauses it unless it ends. -> (tok_S, logp_S, fed_S, end_S, cut_S: an ending
  row ends truncated, turn)."""
  fed_S = turn.fpos_S < turn.flen_S
  fed_tok_S = jnp.take_along_axis(turn.fbuf_SxO, jnp.minimum(turn.fpos_S, turn.fbuf_SxO.shape[1] - 1)[:, None],
                                  axis=1)[:, 0]
  tok_S, logp_S = jnp.where(fed_S, fed_tok_S, tok_S), jnp.where(fed_S, 0.0, logp_S)
  eos_S = is_eos(tok_S) & ~fed_S
  fin_S = fed_S & turn.fend_S & (turn.fpos_S + 1 == turn.flen_S)  # the environment ended the row: its EOS, fed
  end_S = go_S & (eos_S | fin_S | last_S)
  pause_S = go_S & ~fed_S & ~end_S & is_any(tok_S, stop_ids)
  turn = turn._replace(paused_S=turn.paused_S | pause_S, fpos_S=turn.fpos_S + (go_S & fed_S).astype(jnp.int32))
  return tok_S, logp_S, fed_S, end_S, ~eos_S & ~(fin_S & is_eos(tok_S)), turn


def answer(turn: Slots, out: env_batch.EnvOut, act_S: jax.Array, room_S: jax.Array) -> tuple[Slots, jax.Array,
                                                                                              jax.Array]:
  """A boundary's call taken into the slots that passed rows (`act_S`): each resumes with its observation to feed
  (at most `room_S` tokens: the positions left before L - 1), or ends (done, the turn limit, a fallback, a call that
  failed as a whole) with nothing to feed; done with an observation (the environment's EOS, or one that fills the
  row: envs/batch.py) ends after feeding it. -> (turn, end_S, ok: the call as a whole ran)."""
  ok = out.status == host_calls.OK
  n_obs_S = jnp.where(act_S & ok, jnp.minimum(out.obs_len_R, room_S), 0)
  end_S = act_S & (out.done_R | ~ok) & (n_obs_S == 0)
  turn = turn._replace(paused_S=turn.paused_S & ~act_S, fpos_S=jnp.where(act_S, 0, turn.fpos_S),
                       flen_S=jnp.where(act_S, n_obs_S, turn.flen_S),
                       fbuf_SxO=jnp.where(act_S[:, None], out.obs_RxO, turn.fbuf_SxO),
                       fend_S=jnp.where(act_S, out.done_R & (n_obs_S > 0), turn.fend_S))
  return turn, end_S, ok


def is_any(tok_S: jax.Array, ids) -> jax.Array:
  out = jnp.zeros(tok_S.shape, bool)
  for i in ids:
    out = out | (tok_S == i)
  return out


def _row_axes() -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(the context mesh's axes the logical 'batch' axis maps to under the rules in force, the other axes)."""
  mesh = jax.sharding.get_abstract_mesh()
  spec = nn.logical_to_mesh_axes(("batch",), nn.get_logical_axis_rules())
  rule = spec[0] if spec else None
  rule = rule if isinstance(rule, tuple) else (rule,) if rule else ()
  rows = tuple(a for a in rule if a in mesh.axis_names)
  return rows, tuple(a for a in mesh.axis_names if a not in rows)


def call(fn: Callable[..., env_batch.EnvOut], tokens_SxL: jax.Array, obs_SxL: jax.Array, len_S: jax.Array,
         active_S: jax.Array, fields_S: dict[str, Any]) -> env_batch.EnvOut:
  """fn on the slots: once without a mesh; under one, on each device with its own slots (module docstring). The
  outputs' `status` is the worst over the devices' calls, `counts_K` their sum."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or math.prod(mesh.shape.values()) == 1:
    return fn(tokens_SxL, obs_SxL, len_S, active_S, fields_S)
  rows, others = _row_axes()
  spec = PartitionSpec(rows or None)

  def local(tok, obs, n, act, fields):
    lead = jnp.bool_(True)
    for a in others:
      lead = lead & (jax.lax.axis_index(a) == 0)
    out = fn(tok, obs, n, act & lead, fields)
    out = out._replace(status=out.status[None], counts_K=out.counts_K[None])
    if others:  # the first copy's outputs to every copy (the others passed no rows: theirs are zeros)
      share = lambda x: jax.lax.psum(jnp.where(lead, x, jnp.zeros_like(x)).astype(
          jnp.int32 if x.dtype == jnp.bool_ else x.dtype), others)
      out = env_batch.EnvOut(*(share(x) if x.dtype != jnp.bool_ else share(x) > 0 for x in out))
    return out

  out = jax.shard_map(local, in_specs=(spec, spec, spec, spec, spec), out_specs=spec, check_vma=False)(
      tokens_SxL, obs_SxL, len_S, active_S, fields_S)
  return out._replace(status=jnp.max(out.status), counts_K=jnp.sum(out.counts_K, axis=0))


def tools_for(config, env: env_batch.EnvBatch) -> Tools:
  """The engine's Tools for a run's EnvBatch (the `tools` config group: chunk)."""
  return Tools(call=env.callback, stop_ids=env.stop_ids, max_obs=env.max_obs_tokens,
               chunk=int(config.tools.get("chunk", Tools.chunk)))


def step_scores(reward_NxL: jax.Array, step_NxL: jax.Array, S: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The environment's per-turn rewards as process-reward steps (rl/reward_spec.py's (step_r_NxS, step_end_NxS,
  step_valid_NxS)): step k of a row is its k-th answered stop id, ending at that token; S ≥ the most calls a row
  can get (tools.max_turns + 1: the call past the limit is answered, reward 0)."""
  k_NxL = jnp.cumsum(step_NxL, axis=1) - 1
  at_NxSxL = (step_NxL[:, None, :] > 0) & (k_NxL[:, None, :] == jnp.arange(S)[None, :, None])
  pos_L = jnp.arange(step_NxL.shape[1])
  valid_NxS = jnp.any(at_NxSxL, axis=2)
  end_NxS = jnp.sum(jnp.where(at_NxSxL, pos_L, 0), axis=2).astype(jnp.int32)
  r_NxS = jnp.sum(jnp.where(at_NxSxL, reward_NxL[:, None, :], 0.0), axis=2)
  return r_NxS, end_NxS, valid_NxS
