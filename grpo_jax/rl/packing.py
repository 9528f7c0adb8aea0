"""Padding-free training passes (rl.packing): each sample's prompt + completion, without its pads, laid end to end in
rows of `pack_len` tokens, with one segment id per sample and positions that restart per sample (RoPE sees the
padded path's positions). The reference, old-log-prob, critic and policy passes run over packed micro-batches of
`rows` rows per device in a `while_loop` whose trip count is the number of micro-batches this step needs, so their
cost follows the real tokens, not the longest row.

Layout: the pass's N rows are seen as [D, N/D] (D = the batch's device shards: a row-sharded array's own rows),
each device packs its own rows (first-fit decreasing), and the trip count is the maximum over devices (and over
vmapped runs). A pass's outputs come back as the padded path's [N, L] arrays (0 past each completion), so every loss,
estimator and metric downstream is the padded path's code. The policy gradient is summed over micro-batches in the
loop carry: each micro-batch's loss is the whole minibatch's loss restricted to its samples (rows outside it masked),
with every normaliser over the whole minibatch (`microbatch_weights`), so the sum is the minibatch's loss.
"""
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.infra import sharding
from grpo_jax.model import attention
from grpo_jax.rl import update as update_lib

# How a micro-batch's aux metric combines into the minibatch's (every key the policy/PPO objectives return):
# token means (over the micro-batch's tokens) are weighted by its share of the minibatch's tokens; aggregated
# losses scale as the loss does; the ratio's extremes take the max / min over the micro-batches that have tokens.
TOKEN_MEANS = update_lib.TOKEN_MEANS  # NaN in a micro-batch without tokens (update.no_tokens_nan): weight 0 here
LIKE_LOSS = ("surrogate", "value_loss")
EXTREMES = {"ratio_max": jnp.maximum, "ratio_min": jnp.minimum}


def default_pack_len(T: int, plat: str | None = None) -> int:
  """The planner's pack_len for rows of T = P + L tokens on backend `plat` (default: the traced program's): T
  rounded up to the 128-token tiles the TPU/GPU attention kernels and the CPU blockwise path pad to anyway (the
  round-up is free room for more samples); T itself below 128, and on the CPU below attention.CPU_BLOCKWISE_MIN_T,
  where the einsum path computes every column of a row, so a round-up is work for nothing (bench-small, every row
  at L: rows of 256 for samples of 138 tokens made the step 1.74× the padded one's). Attention per packed row grows
  with pack_len², so it stays near T."""
  if T < 128 or ((plat or attention.platform()) == "cpu" and T < attention.CPU_BLOCKWISE_MIN_T):
    return T
  return -(-T // 128) * 128


def pack_len(config, T: int, plat: str | None = None) -> int:
  """rl.pack_len, or (0, a config the auto planner has not resolved: rl/auto.py) default_pack_len(T, plat). Must
  hold the longest sample: ≥ T = P + L (run/validate.py checks)."""
  n = int(config.rl.pack_len) or default_pack_len(T, plat)
  if n < T:
    raise ValueError(f"config.rl.pack_len={n} < task.prompt_len + sampling.max_new_tokens = {T}: a packed row must "
                     f"hold the longest sample; set rl.pack_len >= {T} or 0 (the planner's).")
  return n


def batch_shards(n: int) -> int:
  """Devices the batch axis of an [n, ...] pass is split over under the current mesh (1 when it does not divide)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1
  d = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES if a in mesh.shape)
  return d if n % d == 0 else 1


# rl.pack_rows = 0 on the CPU: the fewest packed rows per micro-batch that hold this many tokens. A step pays about
# half a micro-batch of pad rows (the last one is partly empty), and on the CPU a pass is compute-bound at any
# micro-batch size: per micro-batch it re-reads the weights (and, in the policy pass, adds their gradient into the
# loop carry), a few ms at the bench-small shape against ~240 ms of compute for 640 tokens. On bench-tail (64 samples,
# ~5.4k real tokens, rows of 640) the reference + update took 0.65x the time of 8-row micro-batches with 1 row
# (0.66x with 2, 0.72x with 4; docs/performance.md, "bench-tail").
CPU_MICROBATCH_TOKENS = 512


def default_pack_rows(n_local: int, C: int, plat: str | None = None) -> int:
  """The planner's rows per device per micro-batch for a pass over n_local rows packed into rows of C tokens: on the
  CPU the fewest rows of at least CPU_MICROBATCH_TOKENS tokens (the slack the step pays is that small); elsewhere an
  eighth of the device's rows, so that the weight reads (and FSDP gathers) of each micro-batch stay small against
  its compute (not measured on an accelerator)."""
  if (plat or attention.platform()) == "cpu":
    r = -(-CPU_MICROBATCH_TOKENS // C)
  else:
    r = -(-n_local // 8)
  return max(1, min(r, n_local))


def microbatch_rows(config, n_local: int, C: int, plat: str | None = None) -> int:
  """Packed rows per device per micro-batch: rl.pack_rows, or (0, a config the auto planner has not resolved)
  default_pack_rows(n_local, C, plat); never more than the device's rows of the pass."""
  r = int(config.rl.pack_rows) or default_pack_rows(n_local, C, plat)
  return max(1, min(r, n_local))


class Plan(NamedTuple):
  """Where each of a device's Nl samples sits in its Nl packed rows of C columns (per device: leading axis D)."""
  src_DxRxC: jax.Array    # flat index into the device's [Nl·T] tokens of the token at (row, column); -1 = pad
  seg_DxRxC: jax.Array    # segment id (local sample + 1), 0 = pad
  row_DxN: jax.Array      # each sample's packed row
  first_DxN: jax.Array    # the packed column of its completion token 0
  len_DxN: jax.Array      # its completion tokens
  trips: jax.Array        # micro-batches needed: max over devices (and vmapped runs) of ceil(rows used / rows)
  rows: int               # packed rows per device per micro-batch
  C: int                  # pack_len


def _first_fit(len_N: jax.Array, C: int) -> tuple[jax.Array, jax.Array]:
  """(row_N, offset_N): first-fit decreasing of samples of len_N ≤ C tokens into N rows of C (O(N²), tiny)."""
  n = len_N.shape[0]
  order = jnp.argsort(-len_N)

  def place(fill_R, i):
    row = jnp.argmax(fill_R + len_N[i] <= C)  # the first row it fits in (one always does: N rows, ≤ N samples)
    return fill_R.at[row].add(len_N[i]), (row, fill_R[row])

  _, (row_o, off_o) = jax.lax.scan(place, jnp.zeros((n,), jnp.int32), order)
  inv = jnp.argsort(order)
  return row_o[inv].astype(jnp.int32), off_o[inv].astype(jnp.int32)


def plan(config, seq, P: int) -> Plan:
  """Pack `seq` = (tokens_NxT, positions_NxT, mask_NxT) (left-padded prompt of P columns + completion, each
  sample's real tokens contiguous, as rollout.full_sequence builds them) device by device."""
  mask_NxT = seq[2]
  n, T = mask_NxT.shape
  C = pack_len(config, T)
  D = batch_shards(n)
  m_DxNxT = (mask_NxT > 0).reshape(D, n // D, T)
  rows = microbatch_rows(config, n // D, C)
  n_alloc = -(-(n // D) // rows) * rows  # whole micro-batches of rows (a slice past the end would be clamped)

  def one_device(m_NxT):
    nl = m_NxT.shape[0]
    real_N = m_NxT.sum(1).astype(jnp.int32)
    start_N = jnp.argmax(m_NxT, axis=1).astype(jnp.int32)  # the first real token (the prompt's, left-padded)
    row_N, off_N = _first_fit(real_N, C)
    j_T = jnp.arange(T, dtype=jnp.int32)
    dst_NxT = row_N[:, None] * C + off_N[:, None] + j_T[None] - start_N[:, None]
    dst_NxT = jnp.where(m_NxT, dst_NxT, n_alloc * C)  # pads go out of bounds: dropped
    src_NxT = jnp.arange(nl, dtype=jnp.int32)[:, None] * T + j_T[None]
    src = jnp.full((n_alloc * C,), -1, jnp.int32).at[dst_NxT].set(src_NxT, mode="drop")
    seg = jnp.zeros((n_alloc * C,), jnp.int32).at[dst_NxT].set(
        jnp.broadcast_to(jnp.arange(1, nl + 1, dtype=jnp.int32)[:, None], (nl, T)), mode="drop")
    used = jnp.max(jnp.where(real_N > 0, row_N, -1)) + 1
    return (src.reshape(n_alloc, C), seg.reshape(n_alloc, C), row_N, off_N + P - start_N,
            m_NxT[:, P:].sum(1).astype(jnp.int32), used)

  src, seg, row, first, lens, used_D = jax.vmap(one_device)(m_DxNxT)
  trips = update_lib.max_over_runs(-(-jnp.max(used_D) // rows))
  return Plan(src, seg, row, first, lens, trips, rows, C)


def packed_seq(p: Plan, seq, c) -> tuple:
  """Micro-batch c's (tokens, positions, segment ids), [D·rows, C], each device's rows from its own samples."""
  D, nl = p.row_DxN.shape
  src_DxRxC = jax.lax.dynamic_slice_in_dim(p.src_DxRxC, c * p.rows, p.rows, axis=1)
  seg_DxRxC = jax.lax.dynamic_slice_in_dim(p.seg_DxRxC, c * p.rows, p.rows, axis=1)
  flat = lambda x: x.reshape(D, -1)
  gather = jax.vmap(lambda x, s: jnp.where(s >= 0, jnp.take(x, jnp.maximum(s, 0)), 0))
  tok, pos = (gather(flat(x), src_DxRxC) for x in seq[:2])
  out = (tok, pos, seg_DxRxC)
  return tuple(sharding.constrain_batch(x.reshape(D * p.rows, p.C)) for x in out)


def in_microbatch(p: Plan, c) -> jax.Array:
  """[N] bool: the samples micro-batch c holds."""
  lo = c * p.rows
  return ((p.row_DxN >= lo) & (p.row_DxN < lo + p.rows)).reshape(-1)


def unpack(p: Plan, out_RxC: Any, c, L: int) -> Any:
  """Per-token outputs of micro-batch c aligned to the token they score (column q scores packed token q) → the
  padded layout [N, L] (completion token t of sample i), 0 for samples outside the micro-batch and past each
  completion."""
  D, nl = p.row_DxN.shape
  t_L = jnp.arange(L, dtype=jnp.int32)
  idx_DxNxL = (p.row_DxN - c * p.rows)[..., None] * p.C + p.first_DxN[..., None] + t_L
  ok_DxNxL = (t_L < p.len_DxN[..., None]) & in_microbatch(p, c).reshape(D, nl)[..., None]

  def one(x_RxC):
    x_DxM = x_RxC.reshape(D, -1)
    g = jax.vmap(lambda x, i: jnp.take(x, jnp.clip(i, 0, x.shape[0] - 1)))(x_DxM, idx_DxNxL)
    return sharding.constrain_batch(jnp.where(ok_DxNxL, g, 0).reshape(D * nl, L).astype(x_RxC.dtype))
  return jax.tree.map(one, out_RxC)


def forwards(config, fn: Callable, seq, P: int) -> Any:
  """fn(packed_seq) -> a pytree of [D·rows, C] per-position outputs (aligned to the token they score), run over
  packed micro-batches in a while_loop (trip count = those needed), returned as [N, L] arrays (rollout's reference,
  old-log-prob and critic forwards)."""
  n, T = seq[0].shape
  L = T - P
  p = plan(config, seq, P)
  shapes = jax.eval_shape(fn, packed_seq(p, seq, 0))
  init = jax.tree.map(lambda s: sharding.constrain_batch(jnp.zeros((n, L), s.dtype)), shapes)

  def body(carry):
    c, acc = carry
    out = unpack(p, fn(packed_seq(p, seq, c)), c, L)
    return c + 1, jax.tree.map(jnp.add, acc, out)  # each sample is in exactly one micro-batch: a sum places it
  return jax.lax.while_loop(lambda carry: carry[0] < p.trips, body, (jnp.int32(0), init))[1]


def microbatch_weights(agg: str, mask_NxL: jax.Array, in_mb_N: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(token share w, loss scale) of a micro-batch. Its loss is the minibatch's objective with the other samples
  masked out: a row-mean mode (seq_mean_token_mean, seq_mean_token_sum, Dr.GRPO's seq_mean_token_sum_norm) still
  divides by every row of the minibatch and by each row's own length, 1 or the constant, so the micro-batches'
  losses sum to the minibatch's as they are; token_mean divided by the micro-batch's tokens, so its loss scales by
  their share of the minibatch's. Token-mean metrics always weigh by that share."""
  n_all = jnp.sum(mask_NxL > 0)
  w = jnp.sum((mask_NxL > 0) & in_mb_N[:, None]) / jnp.maximum(n_all, 1)
  return w, (w if agg == "token_mean" else jnp.ones_like(w))


def combine(acc: dict, aux: dict, w: jax.Array, scale: jax.Array) -> dict:
  """Adds micro-batch metrics `aux` into the running minibatch metrics `acc` (TOKEN_MEANS, LIKE_LOSS, EXTREMES)."""
  out = {}
  for k, v in aux.items():
    if k in EXTREMES:
      out[k] = jnp.where(w > 0, EXTREMES[k](acc[k], v), acc[k])
    elif k in TOKEN_MEANS:
      out[k] = acc[k] + jnp.where(w > 0, v * w, 0.0)  # a micro-batch with no token adds nothing (its v is NaN)
    elif k in LIKE_LOSS:
      out[k] = acc[k] + v * scale
    else:
      raise ValueError(f"packing.combine: metric {k!r} has no rule for summing over packed micro-batches; add it to "
                       "packing.TOKEN_MEANS, LIKE_LOSS or EXTREMES.")
  return out


def _acc_init(aux_shapes: dict) -> dict:
  start = {"ratio_max": -jnp.inf, "ratio_min": jnp.inf}
  return {k: jnp.full(s.shape, start.get(k, 0.0), s.dtype) for k, s in aux_shapes.items()}


def value_and_grad(config, forward: Callable, objective: Callable, P: int) -> Callable:
  """update.gradient_step's `value_and_grad` for packed passes: (params, mb) -> ((loss, aux), grads), the gradient
  summed over the minibatch's packed micro-batches in a while_loop carry (value_and_grad inside the body).

  forward(params, packed_seq) -> per-position outputs; objective(outputs as [N, L], mb) -> (loss, aux): the padded
  path's objective, called with mb['mask_NxL'] restricted to the micro-batch's samples."""
  agg = config.rl.loss_agg

  def vg(params, mb):
    seq, mask_NxL = mb["seq"], mb["mask_NxL"]
    L = mask_NxL.shape[1]
    p = plan(config, seq, P)

    def loss_c(params, c):
      in_N = in_microbatch(p, c)
      w, scale = microbatch_weights(agg, mask_NxL, in_N)
      out = unpack(p, forward(params, packed_seq(p, seq, c)), c, L)
      loss, aux = objective(out, dict(mb, mask_NxL=mask_NxL * in_N[:, None]))
      return loss * scale, (aux, w, scale)

    grad_c = jax.value_and_grad(loss_c, has_aux=True)
    (_, (aux0, _, _)) = jax.eval_shape(loss_c, params, 0)

    def body(carry):
      c, loss, acc, g_sum = carry
      (l, (aux, w, scale)), g = grad_c(params, c)
      return c + 1, loss + l, combine(acc, aux, w, scale), jax.tree.map(jnp.add, g_sum, g)

    zeros = jax.tree.map(jnp.zeros_like, params)
    init = (jnp.int32(0), jnp.float32(0.0), _acc_init(aux0), zeros)
    _, loss, aux, grads = jax.lax.while_loop(lambda carry: carry[0] < p.trips, body, init)
    aux = {k: jnp.where(jnp.isfinite(v), v, 0.0) if k in EXTREMES else v for k, v in aux.items()}
    aux = update_lib.no_tokens_nan(aux, mask_NxL)  # no micro-batch had a token: NaN, as the padded pass's
    return (loss, dict(aux, pack_rows=(p.trips * p.rows * p.row_DxN.shape[0]).astype(jnp.float32))), grads
  return vg
