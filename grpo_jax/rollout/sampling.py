"""Rollouts: prefill + `lax.scan` decode over a KV cache, with temperature / top-k / top-p / greedy.

Early exit: the decode runs as a `while_loop` over chunks of `exit_chunk` scan steps and stops once every row has
emitted EOS; outputs keep their static [N, L] shape (pad / 0 / mask 0 where nothing was decoded, exactly what the
full-length decode writes after a row's EOS), so the tokens and log-probs equal the full-length decode's.

Each step draws one uniform per row and inverts a CDF (no N×V random tensor per step: docs/performance.md, "XLA:CPU facts"). The recorded
log-prob is always under the untruncated softmax(logits / temperature): that is the π the losses use (DESIGN.md).
All shapes are static, so `sample` jits with `mcfg` and `scfg` static, vmaps over rngs and shards over the batch.
"""
import dataclasses
import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rollout import decode_layout
from grpo_jax.model import model as model_lib
from grpo_jax.model import decode as decode_lib


# Below this, softmax(logits / temperature) is argmax for any logit gap above 0.2 (e^-20) and float32 breaks down
# further on: logits / 1e-37 overflow to inf and every recorded log-prob is NaN (1e-40 is flushed to 0 first). vLLM
# warns and clamps at the same 0.01. For argmax use greedy (evaluation), not a tiny temperature.
MIN_TEMPERATURE = 0.01


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  temperature: float = 1.0
  top_k: int = 0  # 0 = off
  top_p: float = 1.0  # 1.0 = off; applied after top-k, on the renormalised top-k distribution (as HF does)
  max_new_tokens: int = 48
  greedy: bool = False  # argmax of the logits; logp is still recorded under softmax(logits / temperature)
  eos_id: int | tuple[int, ...] = 2  # the id, or the ids, that end a row (an HF model may have several)
  pad_id: int = 0
  # decode steps between checks that every row is done (one all-reduce of a bool per check); 0 = always decode
  # max_new_tokens steps. A finished batch wastes at most exit_chunk steps.
  exit_chunk: int = 16

  def __post_init__(self):
    # A traced temperature (a vmapped sweep's, studies/vmapped_runs.py) is checked where the config is validated, not here.
    if not isinstance(self.temperature, jax.core.Tracer) and not self.temperature >= MIN_TEMPERATURE:
      raise ValueError(f"sampling.temperature={self.temperature}: must be >= {MIN_TEMPERATURE} (use greedy=True for "
                       "argmax).")
    for name in ("top_k", "max_new_tokens", "exit_chunk", "pad_id"):  # True is the int 1: top_k=True ran as 1
      if isinstance(getattr(self, name), bool):
        raise ValueError(f"sampling.{name}={getattr(self, name)!r}: must be an integer, not a bool.")
    if not isinstance(self.greedy, bool):  # a string 'False' is true: it ran argmax
      raise ValueError(f"SamplingConfig.greedy={self.greedy!r}: must be True or False.")
    if self.top_k < 0:
      raise ValueError(f"sampling.top_k={self.top_k}: must be >= 0 (0 = off).")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"sampling.top_p={self.top_p}: must be in (0, 1] (1.0 = off).")
    if self.max_new_tokens < 1:
      raise ValueError(f"sampling.max_new_tokens={self.max_new_tokens}: must be >= 1.")
    if self.exit_chunk < 0:
      raise ValueError(f"sampling.exit_chunk={self.exit_chunk}: must be >= 0 (0 = no early exit).")
    ids = (self.eos_id,) if isinstance(self.eos_id, int) else tuple(self.eos_id)
    if any(isinstance(i, bool) for i in ids):
      raise ValueError(f"SamplingConfig.eos_id={self.eos_id!r}: give token ids (integers, not bools).")
    ids = tuple(int(i) for i in ids)
    if not ids:
      raise ValueError("SamplingConfig.eos_id: give at least one EOS id.")
    object.__setattr__(self, "eos_id", ids[0] if len(ids) == 1 else ids)  # hashable: the config is a static arg

  @property
  def eos_ids(self) -> tuple[int, ...]:
    return self.eos_id if isinstance(self.eos_id, tuple) else (self.eos_id,)

  @classmethod
  def from_config(cls, cfg: Any, *, eos_id: int | tuple[int, ...], pad_id: int, greedy: bool = False,
                  **overrides: Any) -> "SamplingConfig":
    """From the `sampling` ConfigDict (temperature, top_k, top_p, max_new_tokens, exit_chunk); ids come from the
    tokenizer; `overrides` replace fields (e.g. evaluation's untruncated top_k=0, top_p=1.0)."""
    t = cfg["temperature"]
    L, chunk = int(cfg["max_new_tokens"]), int(cfg.get("exit_chunk", -1))
    scfg = cls(temperature=t if isinstance(t, jax.core.Tracer) else float(t), top_k=int(cfg["top_k"]),
               top_p=float(cfg["top_p"]), max_new_tokens=L, greedy=greedy,
               exit_chunk=default_exit_chunk(L) if chunk == -1 else chunk,
               eos_id=int(eos_id) if isinstance(eos_id, int) else tuple(eos_id), pad_id=int(pad_id))
    return dataclasses.replace(scfg, **overrides) if overrides else scfg


def check_left_padded(pmask_NxP: Any, where: str) -> None:
  """Host-side, before a prompt batch enters a rollout: every row's mask is 0s then 1s ending in column P-1. The
  samplers' prefill scores the last prompt column, so a right-padded row drew its first token after a pad, an all-pad
  row from nothing, both without an error. Device arrays and tracers pass unchecked (every producer hands numpy)."""
  if not isinstance(pmask_NxP, np.ndarray) or pmask_NxP.ndim != 2 or pmask_NxP.shape[1] == 0:
    return
  m = pmask_NxP != 0
  bad = ~m[:, -1] | (m[:, :-1] & ~m[:, 1:]).any(axis=1)  # the last column a pad, or a token before a pad
  if bad.any():
    i = int(np.argmax(bad))
    what = "all pad" if not m[i].any() else "right-padded" if not m[i, -1] else "holed (a pad between tokens)"
    raise ValueError(f"{where}: prompt row {i} of {len(m)} is {what} (mask {m[i].astype(int).tolist()}); the samplers "
                     "take LEFT-padded prompts (pads first, the prompt's last token in column P-1, which prefill "
                     "scores): build prompt batches as tasks/data.encode_prompts does.")


def default_exit_chunk(max_new_tokens: int) -> int:
  """`sampling.exit_chunk=-1` (auto; rl/auto.py logs it): the divisor of max_new_tokens in [8, 32] nearest 16 (the
  smaller of two), else 16. The decode's L (emit, decode) steps then fill whole chunks of the one scan body (a
  chunk that does not divide L skips the last chunk's steps past L under a cond: `_decode`); 16 is the measured
  default (a finished batch wastes at most 16 steps, one all-reduce per check). L <= 16: one scan of L steps, as 16
  gives."""
  if max_new_tokens <= 16:
    return 16
  divisors = [d for d in range(8, 33) if max_new_tokens % d == 0]
  return min(divisors, key=lambda d: (abs(d - 16), d)) if divisors else 16


def decode_trips(max_new_tokens: int, exit_chunk: int) -> int:
  """Iterations of `sample`'s decode scan body when no row ends early: L (emit, decode) steps, padded to whole
  chunks where exit_chunk does not divide L (the skipped steps still trip the loop). What a count of the decode
  loop's ops per token divides by (perf/aot.py)."""
  c = exit_chunk
  return max_new_tokens if c <= 0 or c >= max_new_tokens else -(-max_new_tokens // c) * c


class Rollout(NamedTuple):
  tokens_NxL: jax.Array  # int32; pad_id after EOS
  mask_NxL: jax.Array  # int32; 1 up to and including EOS
  lengths_N: jax.Array  # int32; sum of mask
  logp_NxL: jax.Array  # float32; log softmax(logits / temperature) at the token, untruncated; 0 where mask == 0
  truncated_N: jax.Array  # bool; no EOS within L
  decode_steps: jax.Array  # int32 scalar: decode steps run (max_new_tokens - 1 unless the decode exited early)


_TINY = float(jnp.finfo(jnp.float32).tiny)


def _inverse_cdf(p_NxV: jax.Array, u_N: jax.Array) -> jax.Array:
  """Index j with cdf[j-1] < u * total <= cdf[j]: never an index of zero mass.

  A full-vocabulary cumsum is a reduce-window on XLA:CPU, ~V² work per row: it was most of a decode step's sampling
  cost. Above 256 entries the search is two-level: pick the block of C ≈ √V entries by a cumsum over block sums,
  then the entry by a cumsum inside that block (O(V) work). Same distribution; the token can differ from a flat
  cumsum only where rounding moves a boundary.
  """
  n, v = p_NxV.shape
  if v <= 256:
    cdf_NxV = jnp.cumsum(p_NxV, axis=-1)
    j_N = jnp.sum(cdf_NxV < jnp.maximum(u_N[:, None] * cdf_NxV[:, -1:], _TINY), axis=-1)
    return jnp.minimum(j_N, v - 1).astype(jnp.int32)
  c = int(math.ceil(math.sqrt(v)))
  nb = -(-v // c)
  p_NxBxC = jnp.pad(p_NxV, ((0, 0), (0, nb * c - v))).reshape(n, nb, c)  # zero mass is never picked
  bcdf_NxB = jnp.cumsum(jnp.sum(p_NxBxC, axis=-1), axis=-1)
  target_N = jnp.maximum(u_N * bcdf_NxB[:, -1], _TINY)  # u = 0 must not pick a leading zero-mass entry
  b_N = jnp.minimum(jnp.sum(bcdf_NxB < target_N[:, None], axis=-1), nb - 1)
  before_N = jnp.where(b_N > 0, jnp.take_along_axis(bcdf_NxB, jnp.maximum(b_N - 1, 0)[:, None], -1)[:, 0], 0.0)
  icdf_NxC = jnp.cumsum(jnp.take_along_axis(p_NxBxC, b_N[:, None, None], axis=1)[:, 0], axis=-1)
  # r > 0 since target > the mass before block b; capping r at the block's own total keeps j on a nonzero entry
  # when the two summation orders round differently
  r_N = jnp.minimum(target_N - before_N, icdf_NxC[:, -1])
  j_N = jnp.minimum(jnp.sum(icdf_NxC < r_N[:, None], axis=-1), c - 1)
  return (b_N * c + j_N).astype(jnp.int32)


def draw(logits_NxV: jax.Array, u_N: jax.Array, scfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
  """(token_N, logp_N) from one uniform per row; logp under the untruncated softmax(logits / temperature).

  No N×V log-softmax is built: the unnormalised exp(x - max) feeds the CDF search (it rescales by the total) and
  the log-prob is x[token] - logsumexp(x), a gather and a row sum.
  """
  v = logits_NxV.shape[-1]
  scaled_NxV = logits_NxV.astype(jnp.float32) / scfg.temperature
  max_N = jnp.max(scaled_NxV, axis=-1)
  e_NxV = jnp.exp(scaled_NxV - max_N[:, None])
  lse_N = max_N + jnp.log(jnp.sum(e_NxV, axis=-1))
  if scfg.greedy:
    tok_N = jnp.argmax(logits_NxV, axis=-1).astype(jnp.int32)
  elif scfg.top_k == 0 and scfg.top_p >= 1.0:
    tok_N = _inverse_cdf(e_NxV, u_N)
  else:
    k = v if scfg.top_k == 0 else min(scfg.top_k, v)
    top_NxK, idx_NxK = jax.lax.top_k(scaled_NxV, k)  # sorted, largest first
    p_NxK = jax.nn.softmax(top_NxK, axis=-1)
    if scfg.top_p < 1.0:
      # keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < top_p
      before_NxK = jnp.cumsum(p_NxK, axis=-1) - p_NxK
      p_NxK = jnp.where(before_NxK < scfg.top_p, p_NxK, 0.0)
    j_N = _inverse_cdf(p_NxK, u_N)
    tok_N = jnp.take_along_axis(idx_NxK, j_N[:, None], axis=-1)[:, 0].astype(jnp.int32)
  logp_N = jnp.take_along_axis(scaled_NxV, tok_N[:, None], axis=-1)[:, 0] - lse_N
  return tok_N, logp_N


def token_logp(logits_NxV: jax.Array, tok_N: jax.Array, temperature) -> jax.Array:
  """log softmax(logits / temperature) at tok_N, as `draw` records it (teacher forcing scores a given token)."""
  scaled_NxV = logits_NxV.astype(jnp.float32) / temperature
  return jnp.take_along_axis(scaled_NxV, tok_N[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(scaled_NxV, axis=-1)


def uniforms(rng: jax.Array, steps: int, n: int) -> jax.Array:
  """The one uniform per (step, row) that `sample` inverts: [steps, n], rows split like the batch. A caller that
  samples rows in chunks draws them once for all rows and passes each chunk its columns (same samples)."""
  return nn.with_logical_constraint(jax.random.uniform(rng, (steps, n)), (None, "batch"))


def sample(mcfg: model_lib.ModelConfig, params: Any, prompt_NxP: jax.Array, prompt_mask_NxP: jax.Array,
           rng: jax.Array | None, scfg: SamplingConfig, *, u_LxN: jax.Array | None = None,
           decode: decode_layout.Decode | None = None) -> Rollout:
  """`scfg.max_new_tokens` tokens per left-padded prompt; rows stop at their own EOS, the decode once all have.

  `u_LxN` (from `uniforms`) replaces the draws from `rng`. `decode`: the weights the decode loop reads, already in
  their decode layout (rl/rollout.py's for_rollout, made once per rollout by the caller, outside any loop over rollout
  chunks, so every chunk decodes with that one copy); None decodes in the params' own layout."""
  if prompt_NxP.ndim != 2 or prompt_NxP.shape != prompt_mask_NxP.shape:
    raise ValueError(f"prompt_NxP {prompt_NxP.shape} and prompt_mask_NxP {prompt_mask_NxP.shape}: need the same "
                     "2-D [rows, prompt_len] shape.")
  n, p = prompt_NxP.shape
  steps = scfg.max_new_tokens
  if p + steps > mcfg.max_len:
    raise ValueError(f"prompt length {p} + sampling.max_new_tokens {steps} > model.max_len {mcfg.max_len}; "
                     "raise model.max_len or shorten prompts/completions.")
  batch = lambda x: nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 1))
  prompt_NxP = batch(prompt_NxP.astype(jnp.int32))
  mask_NxP = batch(prompt_mask_NxP.astype(jnp.int32))
  pos_NxP = jnp.maximum(jnp.cumsum(mask_NxP, axis=1) - 1, 0)
  plen_N = jnp.sum(mask_NxP, axis=1)
  # Pin the KV cache to the batch split (rows over the data axes, kv heads over 'tensor') at every step: left to
  # propagation, XLA may keep the whole rollout's cache on every chip.
  axes = decode_lib.cache_axes()
  pin = lambda c: {k: tuple(nn.with_logical_constraint(x, tuple(axes[k])) for x in v) for k, v in c.items()}
  cache = pin(decode_lib.init_cache(mcfg, n, p + steps))
  logits_NxV, cache = decode_lib.prefill(mcfg, params, prompt_NxP, pos_NxP, mask_NxP, cache)
  cache = pin(cache)
  if decode is None:  # made once: the weights are loop-invariant inputs of the decode loop
    decode = decode_layout.prepare(mcfg, params, decode_layout.Layout("fsdp"))
  kv_mask_NxS = jnp.concatenate([mask_NxP, jnp.ones((n, steps), jnp.int32)], axis=1)
  if u_LxN is None:
    u_LxN = uniforms(rng, steps, n)
  elif u_LxN.shape != (steps, n):
    raise ValueError(f"u_LxN {u_LxN.shape}: need [max_new_tokens, rows] = {(steps, n)}.")

  def emit(logits_NxV, u_N, done_N):
    tok_N, logp_N = draw(logits_NxV, u_N, scfg)
    live_N = ~done_N
    tok_N = batch(jnp.where(live_N, tok_N, scfg.pad_id))
    is_eos_N = functools.reduce(jnp.logical_or, [tok_N == e for e in scfg.eos_ids])
    return tok_N, jnp.where(live_N, logp_N, 0.0), live_N, done_N | is_eos_N

  def step(carry, xs):
    logits_NxV, cache, done_N = carry
    i, u_N = xs
    tok_N, logp_N, live_N, done_N = emit(logits_NxV, u_N, done_N)
    # rows past EOS keep decoding pad tokens until the whole batch is done: static-shaped work
    logits_NxV, cache = decode_lib.decode_step(decode.mcfg, params, tok_N, plen_N + i, cache, p + i, kv_mask_NxS,
                                              decode.weights)
    return (batch(logits_NxV), pin(cache), done_N), (tok_N, logp_N, live_N)

  with decode.view():  # the loop's constraints (carry, cache, weights) resolve to the decode layout
    # The loop's row inputs, resharded once here (a tp layout splits rows over fewer chips): else every token
    # gathers them inside the loop.
    plen_N, kv_mask_NxS, done_N = batch(plen_N), batch(kv_mask_NxS), batch(jnp.zeros((n,), bool))
    u_LxN = nn.with_logical_constraint(u_LxN, (None, "batch"))
    carry = (batch(logits_NxV), pin(decode.expand_cache(cache)), done_N)
    # L (emit, decode) steps, the last token's decode step computed for nothing (its cache slot p + L - 1 and
    # position exist): then a chunk that divides L (default_exit_chunk's) needs no skip. L - 1 steps and one emit
    # after the loop left a remainder for every such chunk, handled by a second scan (a second copy of the decode
    # step to compile) or by a cond in the scan body, which a vmapped sweep (studies/vmapped_runs.py) batches into
    # a select of the whole carry, KV cache included, at every step: its sampling took up to 1.8x as long.
    carry, (tok_LxN, logp_LxN, live_LxN), ran = _decode(step, carry, u_LxN, steps, scfg)
  done_N = carry[2]
  mask_NxL = live_LxN.T.astype(jnp.int32)
  return Rollout(tokens_NxL=batch(tok_LxN.T), mask_NxL=batch(mask_NxL), lengths_N=jnp.sum(mask_NxL, axis=1),
                 logp_NxL=batch(logp_LxN.T), truncated_N=~done_N,
                 decode_steps=jnp.minimum(ran, steps - 1))  # the decode steps whose logits were used


def _decode(step, carry, u_SxN: jax.Array, steps: int, scfg: SamplingConfig):
  """`steps` decode steps of `step(carry, (i, u_N))` (carry[2] = done_N): (carry, outputs stacked [steps, N],
  the number of steps run).

  With early exit: a while_loop over ceil(steps / exit_chunk) chunks of exit_chunk scan steps that stops once every
  row is done. Steps never run keep the outputs a done row emits (pad, 0, False). Where exit_chunk does not divide
  `steps` the last chunk's steps past `steps` are skipped by a cond inside the one scan body: a remainder chunk of its
  own (a scan of another length) would be a second copy of the whole decode step for XLA to compile. (Under vmap
  with per-run exits the cond is a select of the whole carry at every step: sample's steps, max_new_tokens, are
  divided by default_exit_chunk's chunk, so only a set exit_chunk that does not divide them pays it.)
  """
  c = scfg.exit_chunk
  if steps == 0:
    n = carry[2].shape[0]
    return carry, (jnp.zeros((0, n), jnp.int32), jnp.zeros((0, n), jnp.float32), jnp.zeros((0, n), bool)), \
        jnp.int32(0)
  if c == 0 or c >= steps:
    return (*jax.lax.scan(step, carry, (jnp.arange(steps, dtype=jnp.int32), u_SxN)), jnp.int32(steps))
  n = carry[2].shape[0]
  rows = lambda x: nn.with_logical_constraint(x, (None, "batch"))
  padded = decode_trips(steps, c)  # the outputs and uniforms padded to whole chunks, cut back to `steps` at the end
  chunks = padded // c
  outs = (rows(jnp.full((padded, n), scfg.pad_id, jnp.int32)), rows(jnp.zeros((padded, n), jnp.float32)),
          rows(jnp.zeros((padded, n), bool)))
  if padded > steps:
    u_SxN = rows(jnp.concatenate([u_SxN, jnp.zeros((padded - steps, n), u_SxN.dtype)]))
    real_step = step

    def skip(carry, xs):
      del xs
      return carry, (jnp.full((n,), scfg.pad_id, jnp.int32), jnp.zeros((n,), jnp.float32), jnp.zeros((n,), bool))

    def step(carry, xs):
      return jax.lax.cond(xs[0] < steps, real_step, skip, carry, xs)

  def chunk(carry, outs, i0):
    carry, ys = jax.lax.scan(step, carry, (i0 + jnp.arange(c, dtype=jnp.int32),
                                           jax.lax.dynamic_slice_in_dim(u_SxN, i0, c)))
    return carry, tuple(rows(jax.lax.dynamic_update_slice_in_dim(o, y, i0, axis=0)) for o, y in zip(outs, ys))

  def more(loop):
    k, carry, _ = loop
    return (k < chunks) & ~jnp.all(carry[2])

  def body(loop):
    k, carry, outs = loop
    return (k + 1, *chunk(carry, outs, k * c))

  k, carry, outs = jax.lax.while_loop(more, body, (jnp.int32(0), carry, outs))
  return carry, tuple(rows(o[:steps]) for o in outs), jnp.minimum(k * c, steps)
