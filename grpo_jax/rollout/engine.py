"""The continuous-batching rollout engine (`sampling.engine = "continuous"`): same samples as `sampling.sample`, work
that follows the live rows.

Inside the jitted step, static shapes:
  * one prefill per prompt: the B distinct prompts are prefilled once, their KV held once ([B, P]) and read by the
    G rows of the group (live_attention.py says why this layout rather than a paged pool);
  * S slots (`sampling.slots`) decode the N = B·G rows, queued in row order; a finished row's slot takes the next
    row at the next step, which starts from its prompt's prefill logits and shared KV;
  * compaction: the decode runs in phases of power-of-two slot counts S, S/2, S/4, … (`compaction_sizes`), one
    `while_loop` each with its own decode step; once the queue is empty and the live rows fit the next size, they
    are gathered into it (KV included) and the decode goes on with that many rows;
  * the completion KV is read in blocks only up to the live rows' longest completion (live_attention.attend).
Row n's token at completion position t is drawn with the uniform u[t, n] (sampling.uniforms) from the same
untruncated softmax(logits / temperature), so no schedule changes what is sampled beyond reduction-order rounding.

Rows are gathered across the whole batch (a global argsort under GSPMD), not per device: on a sharded mesh the
compaction moves rows between devices. A vmapped run (studies/vmapped_runs.py) works as is: each phase's batched
predicate runs until every run has left it, and a run that has left keeps its state.
"""
import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.model import decode as decode_lib
from grpo_jax.model import live_attention
from grpo_jax.model import model as model_lib
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import sampling

KV_BLOCK = 64  # completion keys per block read (the unit in which the KV read follows the live rows)


class Stats(NamedTuple):
  """What the schedule cost (metrics: decode_slot_util, decode_row_steps, decode_admit_wait)."""
  row_steps: jax.Array  # int32: slot-steps computed by the decode loop (the slot count of each step, summed)
  admit_wait: jax.Array  # float32: mean decode steps a row waited in the queue before it got a slot


class _Slots(NamedTuple):
  row_S: jax.Array  # int32 row in the slot; N = empty
  t_S: jax.Array  # int32 completion position of the slot's last emitted token
  tok_S: jax.Array  # int32 that token (the next decode step's input)
  live_S: jax.Array  # bool: the slot's row has not ended
  ck: tuple  # per layer [S, K, Dh, Lc]
  cv: tuple  # per layer [S, K, Lc, Dh]


class _Loop(NamedTuple):
  slots: _Slots
  tokens_NxL: jax.Array
  logp_NxL: jax.Array
  mask_NxL: jax.Array
  trunc_N: jax.Array
  next_row: jax.Array  # queue head
  steps: jax.Array  # decode steps run
  row_steps: jax.Array
  waited: jax.Array  # sum over admitted rows of the steps they waited


def compaction_sizes(slots: int, levels: int, split: int = 1) -> tuple[int, ...]:
  """slots, slots/2, … : at most `levels` sizes, each a multiple of the mesh's batch split `split`."""
  sizes = [slots]
  while len(sizes) < levels and sizes[-1] % 2 == 0 and (sizes[-1] // 2) % split == 0:
    sizes.append(sizes[-1] // 2)
  return tuple(sizes)


def sample_groups(mcfg: model_lib.ModelConfig, params: Any, prompt_BxP: jax.Array, prompt_mask_BxP: jax.Array,
                  G: int, scfg: sampling.SamplingConfig, *, u_LxN: jax.Array, slots: int = 0, levels: int = 4,
                  split: int = 1, decode: decode_layout.Decode | None = None, kv_block: int = KV_BLOCK,
                  force_NxL: jax.Array | None = None) -> tuple[sampling.Rollout, Stats]:
  """G completions of each of the B left-padded prompts (row n belongs to prompt n // G, as rollout.tile_batch
  orders them): the same Rollout `sampling.sample` gives for the tiled batch and the same uniforms.

  slots: 0 = N (every row has a slot from the start); levels: compaction sizes (1 = none); split: the mesh's batch
  split, which every size must be a multiple of; kv_block: completion keys per block read. force_NxL: teacher
  forcing (tests): these tokens are emitted instead of drawn and scored under the engine's own logits."""
  b, p = prompt_BxP.shape
  n, L = b * G, scfg.max_new_tokens
  s0 = slots or n
  if not 1 <= s0 <= n:
    raise ValueError(f"sampling.slots={slots}: must be in [1, rows={n}] (0 = rows).")
  if p + L > mcfg.max_len:
    raise ValueError(f"prompt length {p} + sampling.max_new_tokens {L} > model.max_len {mcfg.max_len}; "
                     "raise model.max_len or shorten prompts/completions.")
  if u_LxN.shape != (L, n):
    raise ValueError(f"u_LxN {u_LxN.shape}: need [max_new_tokens, rows] = {(L, n)}.")
  sizes = compaction_sizes(s0, levels, split)
  blk = min(kv_block, L)
  lc = -(-L // blk) * blk
  rows = lambda x: nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 1))
  pmask_BxP = prompt_mask_BxP.astype(jnp.int32)
  pos_BxP = jnp.maximum(jnp.cumsum(pmask_BxP, axis=1) - 1, 0)
  plen_B = jnp.sum(pmask_BxP, axis=1)
  # one prefill per prompt: a [B, P] cache, held once (not G times)
  logits0_BxV, pcache = decode_lib.prefill(mcfg, params, prompt_BxP.astype(jnp.int32), pos_BxP, pmask_BxP,
                                           decode_lib.init_cache(mcfg, b, p))
  if decode is None:
    decode = decode_layout.prepare(mcfg, params, decode_layout.Layout("fsdp"))
  dm = decode.mcfg
  is_eos = lambda tok: functools.reduce(jnp.logical_or, [tok == e for e in scfg.eos_ids])

  def admit(lp: _Loop, logits_SxV: jax.Array) -> tuple[_Loop, jax.Array]:
    """Free slots take the next queued rows, in slot order; their logits are their prompt's prefill logits."""
    sl = lp.slots
    free_S = ~sl.live_S
    new_S = lp.next_row + jnp.cumsum(free_S.astype(jnp.int32)) - 1
    take_S = free_S & (new_S < n)
    row_S = jnp.where(take_S, new_S, jnp.where(free_S, n, sl.row_S))
    logits_SxV = jnp.where(take_S[:, None], jnp.take(logits0_BxV, jnp.minimum(new_S, n - 1) // G, axis=0),
                           logits_SxV)
    took = jnp.sum(take_S.astype(jnp.int32))
    sl = sl._replace(row_S=row_S, t_S=jnp.where(take_S, 0, sl.t_S), live_S=sl.live_S | take_S)
    return lp._replace(slots=sl, next_row=lp.next_row + took, waited=lp.waited + took * lp.steps), logits_SxV

  def emit(lp: _Loop, logits_SxV: jax.Array) -> _Loop:
    """Each live slot draws its row's token at its position and writes it into the [N, L] outputs."""
    sl = lp.slots
    u_S = u_LxN[jnp.minimum(sl.t_S, L - 1), jnp.minimum(sl.row_S, n - 1)]
    tok_S, logp_S = sampling.draw(logits_SxV, u_S, scfg)
    if force_NxL is not None:
      tok_S = force_NxL[jnp.minimum(sl.row_S, n - 1), jnp.minimum(sl.t_S, L - 1)]
      logp_S = sampling.token_logp(logits_SxV, tok_S, scfg.temperature)
    r_S = jnp.where(sl.live_S, sl.row_S, n)  # n: dropped by the scatters
    end_S = sl.live_S & (is_eos(tok_S) | (sl.t_S == L - 1))
    return lp._replace(
        slots=sl._replace(tok_S=tok_S, live_S=sl.live_S & ~end_S),
        tokens_NxL=lp.tokens_NxL.at[r_S, sl.t_S].set(tok_S, mode="drop"),
        logp_NxL=lp.logp_NxL.at[r_S, sl.t_S].set(logp_S, mode="drop"),
        mask_NxL=lp.mask_NxL.at[r_S, sl.t_S].set(1, mode="drop"),
        trunc_N=lp.trunc_N.at[jnp.where(end_S & ~is_eos(tok_S), sl.row_S, n)].set(True, mode="drop"))

  def step(lp: _Loop) -> _Loop:
    """Decode every slot's last token (its K/V into its own position t), advance, refill, emit."""
    sl = lp.slots
    group_S = jnp.minimum(sl.row_S, n - 1) // G
    clen_S = sl.t_S + 1
    live_len = jnp.max(jnp.where(sl.live_S, clen_S, 0))
    live = tuple(live_attention.LiveKV(pcache["k"][l], pcache["v"][l], pmask_BxP, group_S, sl.ck[l], sl.cv[l],
                                       clen_S, live_len, blk) for l in range(dm.layers))
    logits_SxV, kvs = decode_lib.decode_step_live(dm, decode.weights, sl.tok_S, plen_B[group_S] + sl.t_S, live,
                                                  sl.t_S)
    sl = sl._replace(t_S=jnp.where(sl.live_S, sl.t_S + 1, sl.t_S), ck=tuple(rows(kv.ck_NxKxDxL) for kv in kvs),
                     cv=tuple(rows(kv.cv_NxKxLxD) for kv in kvs))
    lp = lp._replace(slots=sl, steps=lp.steps + 1, row_steps=lp.row_steps + sl.row_S.shape[0])
    return emit(*admit(lp, rows(logits_SxV)))

  def compact(lp: _Loop, size: int) -> _Loop:
    """The live slots, in slot order, gathered into the first `size` (the queue is empty and they fit)."""
    keep = jnp.argsort((~lp.slots.live_S).astype(jnp.int32), stable=True)[:size]
    return lp._replace(slots=jax.tree.map(lambda x: rows(jnp.take(x, keep, axis=0)), lp.slots))

  with decode.view():
    pcache = decode.expand_cache(pcache)
    cache = decode_lib.init_cache(dm, s0, lc)
    sl = _Slots(row_S=jnp.full((s0,), n, jnp.int32), t_S=jnp.zeros((s0,), jnp.int32),
                tok_S=jnp.zeros((s0,), jnp.int32), live_S=jnp.zeros((s0,), bool),
                ck=tuple(map(rows, cache["k"])), cv=tuple(map(rows, cache["v"])))
    lp = _Loop(slots=sl, tokens_NxL=rows(jnp.full((n, L), scfg.pad_id, jnp.int32)),
               logp_NxL=rows(jnp.zeros((n, L), jnp.float32)), mask_NxL=rows(jnp.zeros((n, L), jnp.int32)),
               trunc_N=jnp.zeros((n,), bool), next_row=jnp.int32(0), steps=jnp.int32(0), row_steps=jnp.int32(0),
               waited=jnp.int32(0))
    lp = emit(*admit(lp, jnp.zeros((s0, logits0_BxV.shape[-1]), jnp.float32)))
    for k, size in enumerate(sizes):
      if k:
        lp = compact(lp, size)
      nxt = sizes[k + 1] if k + 1 < len(sizes) else 0

      def more(lp, nxt=nxt):  # rows queued, or more live than the next size holds (the last size: any live)
        return (lp.next_row < n) | (jnp.sum(lp.slots.live_S.astype(jnp.int32)) > nxt)

      lp = jax.lax.while_loop(more, step, lp)
  mask_NxL = rows(lp.mask_NxL)
  ro = sampling.Rollout(tokens_NxL=rows(lp.tokens_NxL), mask_NxL=mask_NxL, lengths_N=jnp.sum(mask_NxL, axis=1),
                        logp_NxL=rows(lp.logp_NxL), truncated_N=lp.trunc_N, decode_steps=lp.steps)
  return ro, Stats(row_steps=lp.row_steps, admit_wait=lp.waited.astype(jnp.float32) / n)


def batch_split() -> int:
  """Devices the rows are split over on the context mesh (data × fsdp; 1 without a mesh): every slot count is a
  multiple of it."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty else dict(mesh.shape).get("data", 1) * dict(mesh.shape).get("fsdp", 1)


def slot_util(lengths_N: jax.Array, row_steps: jax.Array) -> jax.Array:
  """Generated tokens / row-steps computed, the first token of each row counted as its prefill's row-step (the
  static engine computes rows × (decode_steps + 1) of them)."""
  n = lengths_N.shape[0]
  return jnp.sum(lengths_N).astype(jnp.float32) / (row_steps + n).astype(jnp.float32)


def simulate(lengths_N: np.ndarray, slots: int, sizes: tuple[int, ...], block: int, max_new: int) -> dict[str, int]:
  """The engine's schedule replayed in NumPy for given completion lengths (the roofline's decode terms, `aot
  --no-compile --lengths ...`): decode steps, row-steps computed and completion KV positions read (every computed
  slot reads the blocks below the live maximum). Mirrors `sample_groups`: admission in slot order at the step after
  a row ends, compaction once the queue is empty and the live rows fit the next size."""
  n = len(lengths_N)
  lengths_N = np.minimum(np.asarray(lengths_N, np.int64), max_new)
  row, t, live = np.full(slots, n), np.zeros(slots, np.int64), np.zeros(slots, bool)
  nxt, steps, row_steps, kv_read = 0, 0, 0, 0

  def admit_emit(row, t, live, nxt):
    free = ~live
    new = nxt + np.cumsum(free) - 1
    take = free & (new < n)
    row = np.where(take, new, np.where(free, n, row))
    t, live = np.where(take, 0, t), live | take
    ends = live & (t == lengths_N[np.minimum(row, n - 1)] - 1)
    return row, t, live & ~ends, nxt + int(take.sum())

  row, t, live, nxt = admit_emit(row, t, live, nxt)
  for k, size in enumerate(sizes):
    if k:
      keep = np.argsort(~live, kind="stable")[:size]
      row, t, live = row[keep], t[keep], live[keep]
    nxt_size = sizes[k + 1] if k + 1 < len(sizes) else 0
    while nxt < n or live.sum() > nxt_size:
      live_len = int(np.max(np.where(live, t + 1, 0)))
      steps, row_steps = steps + 1, row_steps + len(row)
      kv_read += len(row) * (-(-live_len // block) * block)
      t = np.where(live, t + 1, t)
      row, t, live, nxt = admit_emit(row, t, live, nxt)
  return dict(steps=steps, row_steps=row_steps, kv_read=kv_read, tokens=int(lengths_N.sum()))
