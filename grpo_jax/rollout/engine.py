"""The continuous-batching rollout engine (`sampling.engine = "continuous"`): same samples as `sampling.sample`, work
that follows the live rows.

Inside the jitted step, static shapes:
  * one prefill per prompt: the B distinct prompts are prefilled once, their KV held once ([B, P]) and read by the
    G rows of the group (live_attention.py says why this layout rather than a paged pool);
  * rows stay on their device: with the mesh's row split D (data × fsdp, `batch_split`), device d owns rows
    [d·N/D, (d+1)·N/D) (the batch sharding's blocks) and S/D of the S slots (`sampling.slots`); each device queues
    its own rows in row order and a finished row's slot takes the device's next row at the next step, starting from
    its prompt's prefill logits and shared KV. When G divides N/D a device's rows are exactly its own B/D prompts'
    groups; otherwise each device gets a copy of the prompts its rows touch, once (`prompt_table`);
  * compaction: the decode runs in phases of slot counts S, S/2, S/4, … (`compaction_sizes`, each a multiple of D),
    one `while_loop` each with its own decode step; once every device's queue is empty and its live rows fit its
    share of the next size, each device gathers them into that share (an argsort along its own slots only). Each
    size is its own compiled decode step (its kernels' shapes are the slot count's): 1.5-3 CPU-s of XLA:CPU compile
    each at configs/grpo_arith.py:small's shape with the default XLA flags (2026-12-05 and -07, docs/performance.md),
    whatever the layer count (identical layers share their kernels, slot counts cannot), so `sampling.compaction=0`
    (auto, rl/auto.py) compacts only where completions are long. The decode body keeps its index arithmetic to
    one op per index (in-range gathers, unsigned divisions: `nonneg`) and its outputs to one scatter: on the test
    suite's fast-compile flags each scatter is a while loop;
  * the phase predicates reduce over the devices (a phase lasts until the slowest device is done with it), and the
    completion KV is read in blocks up to the live rows' longest completion over all devices (live_attention.attend);
  * or, with `attention` = 'paged' | 'tpu_ragged' (`sampling.decode_attention`), the KV lives in
    paged_attention.py's page pool instead (prompt pages shared by the group, each slot's own pages), the layout
    the TPU ragged paged attention kernel reads; the per-device schedule and the samples are the same. Every shard's
    pool still holds every prompt's full pages (paged_attention.py), though a device's rows now read only its own
    block of the prompt table.
Every per-device operation is written batched over a leading [D, ...] axis (admission cumsums, compaction argsorts,
the output scatters, the gathers of prompt KV / logits / uniforms by group: live_attention.take_local), which XLA's
SPMD partitioner keeps on each device: in the default decode layout the compiled decode's only collectives are
scalar all-reduces (tests/test_engine.py), except with top-k / top-p sampling, whose `lax.top_k` XLA:CPU partitions
by all-gathering the slots' logits (sampling.draw, as in the static engine). With D = 1 it is one queue over all rows. Row n's token at completion
position t is drawn with the uniform u[t, n] (sampling.uniforms) by the same sampling.draw (temperature, top-k /
top-p; its log-prob under the untruncated softmax(logits / temperature)), so no schedule changes what is sampled
beyond reduction-order rounding. A vmapped run
(studies/vmapped_runs.py) works as is: each phase's batched predicate runs until every run has left it, and a run
that has left keeps its state.
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
from grpo_jax.model import paged_attention
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import sampling
from grpo_jax.rollout import turns

KV_BLOCK = 64  # completion keys per block read (the unit in which the KV read follows the live rows)


class Stats(NamedTuple):
  """What the schedule cost (metrics: decode_slot_util, decode_row_steps, decode_admit_wait), and with an
  environment what it did (turns.Result: the observation mask, its rewards and events)."""
  row_steps: jax.Array  # int32: slot-steps computed by the decode loop (the slot count of each step, summed)
  admit_wait: jax.Array  # float32: mean decode steps a row waited in the queue before it got a slot
  env: Any = None  # turns.Result with `tools`; None without


class _Slots(NamedTuple):
  """Slot state, flat [S] in device-block order: slots [d·S/D, (d+1)·S/D) are device d's (D = the row split)."""
  row_S: jax.Array  # int32 row in the slot, local to its device (0 .. N/D - 1); N/D = empty
  t_S: jax.Array  # int32 completion position of the slot's last emitted token
  tok_S: jax.Array  # int32 that token (the next decode step's input)
  live_S: jax.Array  # bool: the slot's row has not ended
  ck: tuple  # per layer [S, K, Dh, Lc] (empty with the paged store)
  cv: tuple  # per layer [S, K, Lc, Dh]
  turn: Any = ()  # multi-turn rows (tools): turns.Slots; () without an environment


class _Loop(NamedTuple):
  slots: _Slots
  # the outputs per device block (row n = d·N/D + r is [:, d, r]), int32 channels _OUT: token, log-prob (float32
  # bits), mask; one scatter writes all three (on XLA:CPU's fast-compile path each scatter is a while loop)
  out_CxDxNdxL: jax.Array
  trunc_DxNd: jax.Array  # with `tools` (without, it follows from the outputs: a row ends at its first EOS)
  next_D: jax.Array  # each device's queue head (a local row)
  steps: jax.Array  # decode steps run
  row_steps: jax.Array
  waited: jax.Array  # sum over admitted rows of the steps they waited
  pools: tuple = ()  # paged store: per layer paged_attention's pool_RxQxZxCxD (empty with the plain layout)
  env: Any = ()  # multi-turn rows (tools): turns.Rows; () without an environment


_OUT = ("tokens", "logp", "mask")  # _Loop.out_CxDxNdxL's channels


def nonneg(i: jax.Array) -> jax.Array:
  """An index array non-negative by construction, as unsigned: jnp's indexing then adds no negative-index
  wrap-around and `//` no sign correction. Those compare / add / select chains were copied by XLA:CPU into every
  fusion reading them: with take_rows, 2,585 -> 1,818 instructions per decode body at the test model's shape
  (issue #40 item 2; docs/performance.md)."""
  return i.astype(jnp.uint32)


def compaction_sizes(slots: int, levels: int, split: int = 1) -> tuple[int, ...]:
  """slots, slots/2, … : at most `levels` sizes, each a multiple of the mesh's batch split `split`."""
  sizes = [slots]
  while len(sizes) < levels and sizes[-1] % 2 == 0 and (sizes[-1] // 2) % split == 0:
    sizes.append(sizes[-1] // 2)
  return tuple(sizes)


def prompt_table(b: int, G: int, split: int) -> tuple[np.ndarray, np.ndarray]:
  """(table_DxBd, first_D): the prompts each device's rows use. Device d holds rows [d·N/D, (d+1)·N/D) (the batch
  sharding's contiguous blocks); when G divides N/D they are exactly its own B/D prompts (the table is arange(B):
  nothing moves); otherwise (a group spans devices, or a device's rows are part of one group) each device gets a
  copy of the Bd prompts its rows touch, gathered once before the decode loop."""
  n = b * G
  nd = n // split
  first_D = np.arange(split) * nd // G
  bd = int(np.max(((np.arange(split) + 1) * nd - 1) // G - first_D + 1))
  return np.minimum(first_D[:, None] + np.arange(bd), b - 1).astype(np.int32), first_D.astype(np.int32)


def sample_groups(mcfg: model_lib.ModelConfig, params: Any, prompt_BxP: jax.Array, prompt_mask_BxP: jax.Array,
                  G: int, scfg: sampling.SamplingConfig, *, u_LxN: jax.Array, slots: int = 0, levels: int = 4,
                  split: int = 1, decode: decode_layout.Decode | None = None, kv_block: int = KV_BLOCK,
                  force_NxL: jax.Array | None = None, attention: str = "plain",
                  page_size: int = 16, tools: turns.Tools | None = None,
                  env_fields: dict[str, jax.Array] | None = None) -> tuple[sampling.Rollout, Stats]:
  """G completions of each of the B left-padded prompts (row n belongs to prompt n // G, as rollout.tile_batch
  orders them): the same Rollout `sampling.sample` gives for the tiled batch and the same uniforms.

  slots: 0 = N (every row has a slot from the start); levels: compaction sizes (1 = none); split: the mesh's batch
  split D: each device queues, admits and compacts its own N/D rows in its own S/D slots (every size is a multiple
  of D); kv_block: completion keys per block read. force_NxL: teacher forcing (tests): these tokens are emitted
  instead of drawn and scored under the engine's own logits (a negative entry: drawn). attention: 'plain'
  (live_attention.py's layout) | 'paged' | 'tpu_ragged' (paged_attention.py's store of page_size-token pages,
  attended in plain JAX or by the TPU kernel). tools: multi-turn rows (rollout/turns.py): a row pauses on a stop
  id, the paused rows go to `tools.call` once per chunk boundary with their prompt's `env_fields` ({name: [B,
  ...]}), and the observation is fed into the row; the Rollout's mask covers the observation tokens too
  (Stats.env.obs_NxL marks them, their log-probs are 0). Without `tools` the program is the single-turn one,
  unchanged."""
  b, p = prompt_BxP.shape
  n, L = b * G, scfg.max_new_tokens
  s0 = slots or n
  if not 1 <= s0 <= n:
    raise ValueError(f"sampling.slots={slots}: must be in [1, rows={n}] (0 = rows).")
  if n % split or s0 % split:
    raise ValueError(f"sampling.slots={s0} and rows={n} must both be multiples of the mesh's row split "
                     f"data*fsdp={split} (each device decodes its own rows in its own slots).")
  if p + L > mcfg.max_len:
    raise ValueError(f"prompt length {p} + sampling.max_new_tokens {L} > model.max_len {mcfg.max_len}; "
                     "raise model.max_len or shorten prompts/completions.")
  if attention not in paged_attention.BACKENDS:
    raise ValueError(f"sampling.decode_attention={attention!r}: the engine runs one of {paged_attention.BACKENDS}.")
  paged = attention != "plain"
  if u_LxN.shape != (L, n):
    raise ValueError(f"u_LxN {u_LxN.shape}: need [max_new_tokens, rows] = {(L, n)}.")
  D, nd = split, n // split
  sizes = compaction_sizes(s0, levels, D)
  blk = min(kv_block, L)
  lc = -(-L // blk) * blk
  rows = lambda x: nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 1))
  dev = lambda x: x.reshape((D, x.shape[0] // D) + x.shape[1:])  # [S, ...] -> [D, S/D, ...]: device blocks
  flat = lambda x: x.reshape((-1,) + x.shape[2:])
  per_dev = jax.vmap  # an op on each device's block alone (a batched op over D: no rows cross devices)
  table_DxBd, first_D = prompt_table(b, G, D)
  pmask_BxP = prompt_mask_BxP.astype(jnp.int32)
  pos_BxP = jnp.maximum(jnp.cumsum(pmask_BxP, axis=1) - 1, 0)
  # one prefill per prompt: a [B, P] cache, held once (not G times)
  logits0_BxV, pcache = decode_lib.prefill(mcfg, params, prompt_BxP.astype(jnp.int32), pos_BxP, pmask_BxP,
                                           decode_lib.init_cache(mcfg, b, p))
  if decode is None:
    decode = decode_layout.prepare(mcfg, params, decode_layout.Layout("fsdp"))
  dm = decode.mcfg
  is_eos = lambda tok: functools.reduce(jnp.logical_or, [tok == e for e in scfg.eos_ids])
  if tools is not None:
    env_fields = dict(env_fields or {})
    O = tools.max_obs

  def group_of(row_S: jax.Array, local: bool = True) -> jax.Array:
    """A slot's prompt, as an index into its device's block of the prompt table (local) or into the B prompts."""
    dev_S = np.arange(row_S.shape[0]) // (row_S.shape[0] // D)
    group_S = (nonneg(dev_S * nd + jnp.minimum(row_S, nd - 1)) // np.uint32(G)).astype(jnp.int32)
    return group_S - (first_D[dev_S] if local else 0)

  def admit(lp: _Loop, logits_SxV: jax.Array, geo) -> tuple[_Loop, jax.Array]:
    """Free slots take their device's next queued rows, in slot order; their logits are their prompt's prefill
    logits (and, paged, their first own page a copy of the prompt's partial page)."""
    sl = lp.slots
    free_DxSd = dev(~sl.live_S)
    new_DxSd = lp.next_D[:, None] + jnp.cumsum(free_DxSd.astype(jnp.int32), axis=1) - 1
    take_DxSd = free_DxSd & (new_DxSd < nd)
    take_S, new_S = flat(take_DxSd), flat(new_DxSd)
    row_S = jnp.where(take_S, new_S, jnp.where(flat(free_DxSd), nd, sl.row_S))
    logits_SxV = jnp.where(take_S[:, None], live_attention.take_local(logits0_BdxV, group_of(new_S), D), logits_SxV)
    took_D = jnp.sum(take_DxSd.astype(jnp.int32), axis=1)
    if paged:
      lp = lp._replace(pools=tuple(paged_attention.admit(geo, pool, take_S, group_of(new_S, local=False), part)
                                   for pool, part in zip(lp.pools, partial)))
    sl = sl._replace(row_S=row_S, t_S=jnp.where(take_S, 0, sl.t_S), live_S=sl.live_S | take_S)
    if tools is not None:  # a new row starts unpaused, with nothing to feed
      ts = sl.turn
      sl = sl._replace(turn=ts._replace(paused_S=ts.paused_S & ~take_S, flen_S=jnp.where(take_S, 0, ts.flen_S),
                                        fpos_S=jnp.where(take_S, 0, ts.fpos_S), fend_S=ts.fend_S & ~take_S))
    return lp._replace(slots=sl, next_D=lp.next_D + took_D, waited=lp.waited + jnp.sum(took_D) * lp.steps), logits_SxV

  def emit(lp: _Loop, logits_SxV: jax.Array) -> _Loop:
    """Each live slot draws its row's token at its position and writes it into its device's block of the outputs."""
    sl = lp.slots
    r_DxSd, t_DxSd = dev(jnp.minimum(sl.row_S, nd - 1)), dev(jnp.minimum(sl.t_S, L - 1))
    at = lambda x_DxNdxL: flat(per_dev(lambda x, r, t: x[nonneg(r), nonneg(t)])(x_DxNdxL, r_DxSd, t_DxSd))
    tok_S, logp_S = sampling.draw(logits_SxV, at(u_DxNdxL), scfg)
    if force_DxNdxL is not None:  # a negative id: that position is drawn
      f_S = at(force_DxNdxL)
      tok_S = jnp.where(f_S >= 0, f_S, tok_S)
      logp_S = jnp.where(f_S >= 0, sampling.token_logp(logits_SxV, tok_S, scfg.temperature), logp_S)
    if tools is not None:
      return emit_turns(lp, tok_S, logp_S)
    r_S = jnp.where(sl.live_S, sl.row_S, nd)  # nd: dropped by the scatter
    end_S = sl.live_S & (is_eos(tok_S) | (sl.t_S == L - 1))
    return lp._replace(slots=sl._replace(tok_S=tok_S, live_S=sl.live_S & ~end_S),
                       out_CxDxNdxL=put_out(lp.out_CxDxNdxL, r_S, sl.t_S, tok_S, logp_S))

  def put_out(out_CxDxNdxL, r_S, t_S, tok_S, logp_S):
    """Each slot's token, log-prob and mask 1 into its row r (nd: dropped) at position t: one scatter."""
    v_CxS = jnp.stack([tok_S, jax.lax.bitcast_convert_type(logp_S, jnp.int32), jnp.ones_like(tok_S)])
    put = per_dev(lambda x, r, t, v: x.at[:, nonneg(r), nonneg(t)].set(v, mode="drop"), in_axes=(1, 0, 0, 1),
                  out_axes=1)
    return put(out_CxDxNdxL, dev(r_S), dev(t_S), v_CxS.reshape(len(_OUT), D, -1))

  def emit_turns(lp: _Loop, tok_S: jax.Array, logp_S: jax.Array) -> _Loop:
    """emit with an environment: a paused slot emits nothing (and keeps its last token, the stop id, whose K/V the
    next decode steps rewrite unchanged); a fed slot emits its next observation token (log-prob 0, obs 1, never an
    end or a pause, except the last token of an ending row's observation: the environment's EOS); a sampled stop id
    pauses the row unless it is the row's last position."""
    sl = lp.slots
    go_S = sl.live_S & ~sl.turn.paused_S
    tok_S, logp_S, fed_S, end_S, cut_S, ts = turns.emit(sl.turn, go_S, tok_S, logp_S, sl.t_S == L - 1, is_eos,
                                                         tools.stop_ids)
    put = per_dev(lambda x, r, t, v: x.at[nonneg(r), nonneg(t)].set(v, mode="drop"))
    r_S = jnp.where(go_S, sl.row_S, nd)
    trunc_D = per_dev(lambda x, r: x.at[nonneg(r)].set(True, mode="drop"))(
        lp.trunc_DxNd, dev(jnp.where(end_S & cut_S, sl.row_S, nd)))
    env = lp.env._replace(obs_DxNdxL=put(lp.env.obs_DxNdxL, dev(r_S), dev(sl.t_S), dev(fed_S.astype(jnp.int32))))
    return lp._replace(
        slots=sl._replace(tok_S=jnp.where(go_S, tok_S, sl.tok_S), live_S=sl.live_S & ~end_S, turn=ts),
        out_CxDxNdxL=put_out(lp.out_CxDxNdxL, r_S, sl.t_S, tok_S, logp_S), trunc_DxNd=trunc_D, env=env)

  def boundary(lp: _Loop, running: jax.Array) -> _Loop:
    """Every tools.chunk decode steps, or when every live row is paused: if any row is paused, one host call for
    all of them (per device: turns.call), then each paused row ends (done, turn limit, fallback, or a call that
    failed as a whole), or resumes with its observation to feed (or with nothing, if there is none)."""
    sl, ts = lp.slots, lp.slots.turn
    waiting = jnp.any(ts.paused_S)
    due = (lp.steps % tools.chunk == 0) | ~jnp.any(sl.live_S & ~ts.paused_S)
    go = waiting & due & running
    return jax.lax.cond(go, lambda lp: call_env(lp, go), lambda lp: lp, lp)

  def call_env(lp: _Loop, go: jax.Array) -> _Loop:
    """(`go` is True here. Under vmap cond runs both branches, and the phase's while_loop runs its body for a run
    that has left the phase too (its state is kept, not the body's): `go` keeps such a run, and a run that is not at
    a boundary, from passing any row to the host; its call returns at once and its outputs are not taken.)"""
    sl, ts, env = lp.slots, lp.slots.turn, lp.env
    act_S = ts.paused_S & go
    r_DxSd = dev(jnp.minimum(sl.row_S, nd - 1))
    row_of = lambda x_DxNdxL: rows(flat(per_dev(lambda x, r: x[r])(x_DxNdxL, r_DxSd)))
    group_S = group_of(sl.row_S)
    fields_S = {k: rows(live_attention.take_local(v, group_S, D)) for k, v in fields_Bd.items()}
    out = turns.call(tools.call, row_of(lp.out_CxDxNdxL[0]), row_of(env.obs_DxNdxL), sl.t_S + 1, act_S, fields_S)
    ts, end_S, ok = turns.answer(ts, out, act_S, L - 1 - sl.t_S)
    add = per_dev(lambda x, r, t, v: x.at[r, t].add(v, mode="drop"))
    r_DxSd, t_DxSd = dev(jnp.where(act_S, sl.row_S, nd)), dev(sl.t_S)
    event_SxE = jax.nn.one_hot(out.event_R, turns.EVENTS, dtype=jnp.int32)
    env = env._replace(
        reward_DxNdxL=add(env.reward_DxNdxL, r_DxSd, t_DxSd, dev(jnp.where(act_S & ok, out.reward_R, 0.0))),
        step_DxNdxL=add(env.step_DxNdxL, r_DxSd, t_DxSd, dev(act_S.astype(jnp.int32))),
        events_DxNdxE=per_dev(lambda x, r, v: x.at[r].add(v, mode="drop"))(env.events_DxNdxE, r_DxSd,
                                                                           dev(event_SxE)),
        status=jnp.maximum(env.status, out.status), counts_K=env.counts_K + out.counts_K, calls=env.calls + 1)
    return lp._replace(slots=sl._replace(live_S=sl.live_S & ~end_S, turn=ts), env=env)

  def step(lp: _Loop, geo, more=None) -> _Loop:
    """Decode every slot's last token (its K/V into its own position t), advance, refill, emit (with `tools`, then
    the boundary; `more`: the phase's predicate, True in the body unless a vmapped run has left the phase)."""
    running = None if tools is None else more(lp)
    sl = lp.slots
    group_S = group_of(sl.row_S)
    if not paged:
      clen_S = sl.t_S + 1
      live_len = jnp.max(jnp.where(sl.live_S, clen_S, 0))  # over every device: the KV block loop is one program
      live = tuple(live_attention.LiveKV(pk[l], pv[l], pmask_BdxP, group_S, sl.ck[l], sl.cv[l], clen_S, live_len,
                                         blk, D) for l in range(dm.layers))
    pos_S = live_attention.take_local(plen_Bd, group_S, D) + sl.t_S
    if paged:  # the page table follows from each slot's prompt: rebuilt per step, nothing to allocate or free
      tbl_SxM = paged_attention.table(geo, group_of(sl.row_S, local=False), plen_B)
      live = tuple(paged_attention.PagedKV(pool, tbl_SxM, pos_S, attention) for pool in lp.pools)
    logits_SxV, kvs = decode_lib.decode_step_live(dm, decode.weights, sl.tok_S, pos_S, live, sl.t_S)
    going_S = sl.live_S if tools is None else sl.live_S & ~sl.turn.paused_S  # a paused row stays where it is
    sl = sl._replace(t_S=jnp.where(going_S, sl.t_S + 1, sl.t_S))
    if paged:
      lp = lp._replace(pools=tuple(kv.pool_RxQxZxCxD for kv in kvs))
    else:
      sl = sl._replace(ck=tuple(rows(kv.ck_NxKxDxL) for kv in kvs), cv=tuple(rows(kv.cv_NxKxLxD) for kv in kvs))
    lp = lp._replace(slots=sl, steps=lp.steps + 1, row_steps=lp.row_steps + sl.row_S.shape[0])
    lp = emit(*admit(lp, rows(logits_SxV), geo))
    return lp if tools is None else boundary(lp, running)

  def compact(lp: _Loop, size: int, geo):
    """Each device's live slots, in slot order, gathered into its first size/D (the queues are empty and they fit):
    an argsort along each device's own slots, a gather batched over the devices; paged, their own pages move with
    them. -> (loop state, the store's geometry at the new size)."""
    sd = lp.slots.live_S.shape[0] // D
    keep_DxK = jnp.argsort(dev(~lp.slots.live_S).astype(jnp.int32), axis=1, stable=True)[:, :size // D]
    lp = lp._replace(slots=jax.tree.map(lambda x: rows(live_attention.take_local(x, flat(keep_DxK), D)),
                                        lp.slots))
    if paged:  # the pool's compaction takes global slot indices
      moved = [paged_attention.compact(geo, pool, flat(keep_DxK + sd * jnp.arange(D)[:, None])) for pool in lp.pools]
      geo, lp = moved[0][0], lp._replace(pools=tuple(pool for _, pool in moved))
    return lp, geo

  # [D, N/D, ...] device blocks, block d on device d (D = 1: the rows split as [N, ...] is)
  on_dev_axes = lambda ndim: (("batch", None) if D > 1 else (None, "batch")) + (None,) * (ndim - 2)
  on_dev = lambda x: nn.with_logical_constraint(x, on_dev_axes(x.ndim))
  blocks = lambda x: on_dev(x.reshape((D, nd) + x.shape[1:]))
  u_DxNdxL = blocks(u_LxN.T)
  force_DxNdxL = None if force_NxL is None else blocks(force_NxL)
  # the prompts' state as each device's block of the prompt table (prompt_table: as it is when G divides N/D)
  aligned = np.array_equal(table_DxBd.reshape(-1), np.arange(b))

  def by_table(x, axes=None):
    x = x if aligned else jnp.take(x, table_DxBd.reshape(-1), axis=0)
    return nn.with_logical_constraint(x, axes or ("batch",) + (None,) * (x.ndim - 1))
  logits0_BdxV, pmask_BdxP = by_table(logits0_BxV), by_table(pmask_BxP)
  fields_Bd = {} if tools is None else {k: by_table(jnp.asarray(v)) for k, v in env_fields.items()}
  plen_Bd = jnp.sum(pmask_BdxP, axis=1)
  with decode.view():
    pcache = decode.expand_cache(pcache)
    axes = decode_lib.cache_axes()
    pk = tuple(by_table(x, axes["k"]) for x in pcache["k"])
    pv = tuple(by_table(x, axes["v"]) for x in pcache["v"])
    geo, partial, pools = None, (), ()
    if paged:  # the prompts' KV paged (unpadded), the slots' own pages zeroed; no [S, Lc] buffers
      plen_B = jnp.sum(pmask_BxP, axis=1)
      geo = paged_attention.geometry(b, p, L, s0, paged_attention.shards(s0, dm.heads, dm.kv_heads), page_size)
      pages = [paged_attention.prompt_pages(geo, pcache["k"][l], pcache["v"][l], plen_B) for l in range(dm.layers)]
      partial = tuple(pp for _, pp in pages)
      pools = tuple(paged_attention.init_pool(geo, full) for full, _ in pages)
      cache = {"k": (), "v": ()}
    else:
      cache = decode_lib.init_cache(dm, s0, lc)
    sl = _Slots(row_S=jnp.full((s0,), nd, jnp.int32), t_S=jnp.zeros((s0,), jnp.int32),
                tok_S=jnp.zeros((s0,), jnp.int32), live_S=jnp.zeros((s0,), bool),
                ck=tuple(map(rows, cache["k"])), cv=tuple(map(rows, cache["v"])),
                turn=() if tools is None else jax.tree.map(rows, turns.init_slots(s0, O)))
    out0 = jnp.stack([jnp.full((D, nd, L), scfg.pad_id, jnp.int32), jnp.zeros((D, nd, L), jnp.int32),
                      jnp.zeros((D, nd, L), jnp.int32)])  # log-prob 0.0's bits are 0
    lp = _Loop(slots=sl, out_CxDxNdxL=nn.with_logical_constraint(out0, (None,) + on_dev_axes(3)),
               trunc_DxNd=on_dev(jnp.zeros((D, nd), bool)),
               next_D=jnp.zeros((D,), jnp.int32), steps=jnp.int32(0), row_steps=jnp.int32(0), waited=jnp.int32(0),
               pools=pools, env=() if tools is None else jax.tree.map(
                   lambda x: on_dev(x) if x.ndim == 3 else x, turns.init_rows(D, nd, L)))
    lp = emit(*admit(lp, jnp.zeros((s0, logits0_BxV.shape[-1]), jnp.float32), geo))
    for k, size in enumerate(sizes):
      if k:
        lp, geo = compact(lp, size, geo)
      nxt = (sizes[k + 1] if k + 1 < len(sizes) else 0) // D

      def more(lp, nxt=nxt):  # any device with rows queued, or more live than its share of the next size holds
        live_D = jnp.sum(dev(lp.slots.live_S).astype(jnp.int32), axis=1)  # (the last size: any live)
        return jnp.any((lp.next_D < nd) | (live_D > nxt))

      lp = jax.lax.while_loop(more, functools.partial(step, geo=geo, more=more), lp)
  tokens_NxL, mask_NxL = rows(flat(lp.out_CxDxNdxL[0])), rows(flat(lp.out_CxDxNdxL[2]))
  # without tools a row ends at its first EOS or at L - 1 (emit): truncated = no EOS among its tokens
  trunc_N = (flat(lp.trunc_DxNd) if tools is not None
             else ~jnp.any(is_eos(tokens_NxL) & (mask_NxL > 0), axis=1))
  ro = sampling.Rollout(tokens_NxL=tokens_NxL, mask_NxL=mask_NxL, lengths_N=jnp.sum(mask_NxL, axis=1),
                        logp_NxL=rows(flat(jax.lax.bitcast_convert_type(lp.out_CxDxNdxL[1], jnp.float32))),
                        truncated_N=trunc_N, decode_steps=lp.steps)
  stats = Stats(row_steps=lp.row_steps, admit_wait=lp.waited.astype(jnp.float32) / n)
  if tools is not None:
    e = lp.env
    stats = stats._replace(env=turns.Result(
        obs_NxL=rows(flat(e.obs_DxNdxL)), reward_NxL=rows(flat(e.reward_DxNdxL)), step_NxL=rows(flat(e.step_DxNdxL)),
        events_NxE=rows(flat(e.events_DxNdxE)), status=e.status, counts_K=e.counts_K, calls=e.calls))
  return ro, stats


def attention_kwargs(config, mcfg: model_lib.ModelConfig) -> dict[str, Any]:
  """sample_groups' `attention` and `page_size` from sampling.decode_attention / page_size; `auto` left unresolved
  by rl/auto.py is chosen here for JAX's default backend (paged_attention.choose)."""
  attn, page = config.sampling.get("decode_attention", "auto"), int(config.sampling.get("page_size", 16))
  if attn == "auto":
    attn, _ = paged_attention.choose(mcfg.head_dim, mcfg.kv_heads, page, mcfg.dtype, jax.default_backend())
  return dict(attention=attn, page_size=page)


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


def simulate(lengths_N: np.ndarray, slots: int, sizes: tuple[int, ...], block: int, max_new: int,
             split: int = 1) -> dict[str, int]:
  """The engine's schedule replayed in NumPy for given completion lengths (the roofline's decode terms, `aot
  --no-compile --lengths ...`): decode steps, row-steps computed and completion KV positions read (every computed
  slot reads the blocks below the live maximum over all devices). Mirrors `sample_groups`: each of the `split`
  devices admits its own rows (row block d) into its own slots in slot order at the step after a row ends, and
  compacts once its queue is empty and its live rows fit its share of the next size; a phase lasts until the
  slowest device is done with it."""
  n = len(lengths_N)
  d, nd, sd = split, n // split, slots // split
  len_DxNd = np.minimum(np.asarray(lengths_N, np.int64), max_new).reshape(d, nd)
  row, t, live = np.full((d, sd), nd), np.zeros((d, sd), np.int64), np.zeros((d, sd), bool)
  nxt, steps, row_steps, kv_read = np.zeros(d, np.int64), 0, 0, 0

  def admit_emit(row, t, live, nxt):
    free = ~live
    new = nxt[:, None] + np.cumsum(free, axis=1) - 1
    take = free & (new < nd)
    row = np.where(take, new, np.where(free, nd, row))
    t, live = np.where(take, 0, t), live | take
    ends = live & (t == np.take_along_axis(len_DxNd, np.minimum(row, nd - 1), axis=1) - 1)
    return row, t, live & ~ends, nxt + take.sum(axis=1)

  row, t, live, nxt = admit_emit(row, t, live, nxt)
  for k, size in enumerate(sizes):
    if k:
      keep = np.argsort(~live, axis=1, kind="stable")[:, :size // d]
      row, t, live = (np.take_along_axis(x, keep, axis=1) for x in (row, t, live))
    nxt_size = (sizes[k + 1] if k + 1 < len(sizes) else 0) // d
    while (nxt < nd).any() or (live.sum(axis=1) > nxt_size).any():
      live_len = int(np.max(np.where(live, t + 1, 0)))
      steps, row_steps = steps + 1, row_steps + row.size
      kv_read += row.size * (-(-live_len // block) * block)
      t = np.where(live, t + 1, t)
      row, t, live, nxt = admit_emit(row, t, live, nxt)
  return dict(steps=steps, row_steps=row_steps, kv_read=kv_read, tokens=int(len_DxNd.sum()))
