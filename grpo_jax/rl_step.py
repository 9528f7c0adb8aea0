"""The critic-free RL iteration (GRPO family) as ONE jitted, sharded function `(state, batch) -> (state, metrics)`.

rollout (scan decoder) → rewards (in-graph or pure_callback) → advantages (by name, advantages.ESTIMATORS) →
reference log-probs → μ epochs × minibatches of clipped updates (update.minibatch_scan) → metrics. PPO with a critic
lives in `ppo_step.py` and reuses the rollout and the step's tail from here.
"""
import numbers
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax import advantages
from grpo_jax import config_lib
from grpo_jax import decode_layout
from grpo_jax import losses
from grpo_jax import model as model_lib
from grpo_jax import presets
from grpo_jax import rewards as rewards_lib
from grpo_jax import sampling
from grpo_jax import sharding
from grpo_jax import state as state_lib
from grpo_jax import update as update_lib

PROMPT_KEYS = ("prompt_NxP", "prompt_mask_NxP")


def tile_batch(batch: dict, G: int) -> dict:
  """Repeats every per-prompt field G times so row i belongs to group i // G."""
  return {k: sharding.constrain_batch(jnp.repeat(v, G, axis=0)) for k, v in batch.items()}


def masked_mean(x, mask):
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def full_sequence(prompt_NxP, pmask_NxP, tokens_NxL, mask_NxL):
  tokens_NxT = jnp.concatenate([prompt_NxP, tokens_NxL], axis=1)
  mask_NxT = jnp.concatenate([pmask_NxP, mask_NxL], axis=1).astype(jnp.int32)
  positions_NxT = jnp.maximum(jnp.cumsum(mask_NxT, axis=1) - 1, 0)
  return tokens_NxT, positions_NxT, mask_NxT


def completion_logprobs(mcfg, params, seq, P: int, temperature: float):
  """log π(o_t | q, o_<t) and entropies for the completion columns only (the LM head skips prompt positions)."""
  tokens_NxT, positions_NxT, mask_NxT = seq
  return model_lib.completion_logprobs(mcfg, params, tokens_NxT, positions_NxT, mask_NxT, P, temperature)


class Rollout(NamedTuple):
  """One iteration's samples, scores and log-probs. Rows N = B·G (row i in group i // G); L completion tokens."""
  seq: tuple                # (tokens_NxT, positions_NxT, mask_NxT): prompt + completion, the training forward's input
  tokens_NxL: jax.Array
  mask_NxL: jax.Array       # float32: 1 up to and including EOS
  lengths_N: jax.Array
  truncated_N: jax.Array
  r_N: jax.Array            # the weighted reward
  per_term: dict            # name -> unweighted r_N of each reward term
  terms_NxK: jax.Array      # the K reward terms (unweighted; DAPO's overlong penalty last when on), per sample
  term_w_K: jax.Array       # their weights (the overlong penalty's is 1)
  steps: tuple | None       # process scores (step_r_NxS, step_end_NxS, step_valid_NxS), or None
  old_logp_NxL: jax.Array   # the rollout policy's log-probs (stop-gradient, 0 on padding)
  ref_logp_NxL: jax.Array | None  # the reference's; None when β = 0 (no reference model: uses_reference)
  status: jax.Array         # one per reward term: rewards.OK unless its Python call failed
  fallbacks: jax.Array      # samples a Python term replaced by its fallback score
  ds_kept: jax.Array | None  # dynamic sampling: kept groups with reward variance (None when off)
  bucket: jax.Array | None = None  # index into train_lengths(config): the shortest covering the longest completion
  decode_steps: jax.Array | None = None  # decode steps run: the slowest row chunk's (early exit: sampling.py)


def uses_reference(config) -> bool:
  """β > 0 needs the frozen reference model; β = 0 keeps none: no reference params in the state, no reference
  forward, no train/kl (as TRL loads no reference at β = 0). A traced β (seeds.py, one per run) counts as > 0."""
  beta = config.rl.beta
  return not isinstance(beta, numbers.Real) or beta != 0


def check_chunks(chunks: int, n: int) -> None:
  if not isinstance(chunks, int) or chunks < 1 or n % chunks:
    raise ValueError(f"config.rl.rollout_chunks={chunks!r}: must be a positive integer dividing the {n} rollout rows "
                     "it splits (prompts_per_step*G); pick a divisor.")


def chunk_rows(x: jax.Array, chunks: int) -> jax.Array:
  """[N, ...] → [C, N/C, ...] with chunk c = rows c, c+C, c+2C, …: a row-sharded array splits into chunks that are
  each spread over every row shard (a device's rows stay on it; each chunk keeps every device busy)."""
  return jnp.swapaxes(x.reshape((x.shape[0] // chunks, chunks) + x.shape[1:]), 0, 1)


def unchunk_rows(x_CxM: jax.Array) -> jax.Array:
  """The inverse of `chunk_rows`."""
  return jnp.swapaxes(x_CxM, 0, 1).reshape((x_CxM.shape[0] * x_CxM.shape[1],) + x_CxM.shape[2:])


def map_row_chunks(fn: Callable, chunks: int, *xs):
  """fn(*xs) for a row-wise fn, run as a lax.map over `chunks` slices of the rows (chunk_rows): its temporaries
  (a KV cache, a forward's activations) are those of N/chunks rows. chunks=1 calls fn on all rows."""
  if chunks == 1:
    return fn(*xs)
  check_chunks(chunks, xs[0].shape[0])
  pin = lambda x: nn.with_logical_constraint(x, (None, "batch") + (None,) * (x.ndim - 2))
  out = jax.lax.map(lambda a: fn(*a), jax.tree.map(lambda x: pin(chunk_rows(x, chunks)), xs))
  return jax.tree.map(lambda x: sharding.constrain_batch(unchunk_rows(x)), out)


def make_rollout_fn(config, mcfg, spec: rewards_lib.RewardSpec, tokenizer) -> Callable[..., Rollout]:
  """(params, ref_params or None, batch, rng) -> Rollout: sample G completions per prompt, score them, log-probs.

  Sampling, and then the reference and (bf16) old-log-prob forwards, run over `rl.rollout_chunks` chunks of rows
  (map_row_chunks), so the KV cache and the forwards' activations are those of one chunk. Each row's uniforms are
  drawn for all rows at once, so chunking does not change the samples."""
  rl, G, temp = config.rl, config.rl.G, config.sampling.temperature
  chunks = int(rl.rollout_chunks)
  scfg = sampling.SamplingConfig.from_config(config.sampling, eos_id=getattr(tokenizer, "eos_ids", tokenizer.eos_id), pad_id=tokenizer.pad_id)
  bf16 = mcfg.dtype == "bfloat16"
  overlong_cache = round(rl.overlong_frac * scfg.max_new_tokens)  # a length: static
  # Each term's weight (the order of terms_NxK); the overlong penalty, when on, is the last term, weight 1.
  term_w_K = jnp.asarray(spec.weights + ((1.0,) if overlong_cache > 0 else ()), jnp.float32)
  sizes = train_lengths(config)

  def rollout_fn(params, ref_params, batch, rng) -> Rollout:
    k_sample, k_ds = jax.random.split(rng)
    b = tile_batch(batch, G)
    n_all, P = b["prompt_NxP"].shape
    check_chunks(chunks, n_all // (rl.oversample if rl.dynamic_sampling else 1))  # the kept rows are chunked too
    u_NxL = sampling.uniforms(k_sample, scfg.max_new_tokens, n_all).T
    # The weights in their decode layout (decode_layout.py), once per rollout, outside the chunk loop: every chunk
    # decodes with this one copy.
    decode = decode_layout.for_rollout(config, mcfg, params)

    def sample_rows(p, m, u):
      s = sampling.sample(mcfg, params, p, m, None, scfg, u_LxN=u.T, decode=decode)
      # one count per row, so map_row_chunks can stack the chunks' counts like any row-wise output
      return s._replace(decode_steps=jnp.broadcast_to(s.decode_steps, s.lengths_N.shape))

    ro = map_row_chunks(sample_rows, chunks, b["prompt_NxP"], b["prompt_mask_NxP"], u_NxL)
    # each chunk's decode exits early on its own once its rows are done: the rollout ran the slowest chunk's steps
    decode_steps = jnp.max(ro.decode_steps)
    tokens_NxL = sharding.constrain_batch(ro.tokens_NxL)
    fields = {k: v for k, v in b.items() if k not in PROMPT_KEYS}
    r_N, per_term, status, fallbacks, steps = rewards_lib.compute(spec, tokens_NxL, ro.mask_NxL, fields)
    terms_NxK = [per_term[n] for n in spec.names]
    if overlong_cache > 0:
      # DAPO's soft overlong punishment, a reward term of weight 1 (its own term under reward_norm='per_term').
      penalty_N = advantages.overlong_penalty(ro.lengths_N, max_len=scfg.max_new_tokens, cache_len=overlong_cache)
      r_N = r_N + penalty_N
      terms_NxK.append(penalty_N)
    terms_NxK = jnp.stack(terms_NxK, axis=1)
    # Everything with one row per sample; dynamic sampling keeps some groups' rows.
    rows = dict(prompt_NxP=b["prompt_NxP"], pmask_NxP=b["prompt_mask_NxP"], tokens_NxL=tokens_NxL,
                mask_NxL=ro.mask_NxL.astype(jnp.float32), lengths_N=ro.lengths_N, truncated_N=ro.truncated_N,
                r_N=r_N, per_term=per_term, terms_NxK=terms_NxK, steps=steps, old_logp_NxL=ro.logp_NxL)
    ds_kept = None
    if rl.dynamic_sampling:
      # DAPO: the batch holds oversample×B prompts; keep B groups whose normalised reward varies, fixed shape.
      B_all = r_N.shape[0] // G
      idx_B, ds_kept = advantages.dynamic_sampling_select(signal_rewards(rl, r_N, terms_NxK, term_w_K, G),
                                                          B_all // rl.oversample, k_ds)
      keep_N = (idx_B[:, None] * G + jnp.arange(G)[None, :]).reshape(-1)
      rows = jax.tree.map(lambda x: sharding.constrain_batch(jnp.take(x, keep_N, axis=0)), rows)

    mask_NxL = rows["mask_NxL"]
    seq = full_sequence(rows["prompt_NxP"], rows["pmask_NxP"], rows["tokens_NxL"], mask_NxL)
    # The training length: the shortest bucket covering the longest completion of ALL rows (the same for every
    # row chunk; reduced over vmapped runs). The forwards below, and the update, run on that many completion tokens.
    bucket = update_lib.bucket_index(rows["lengths_N"], sizes)

    def forwards(*seq_chunk):
      # bf16 sampler and training forward differ by rounding; ρ must start at exactly 1 for μ=1 on-policy, so under
      # bf16 the old log-probs are recomputed in training numerics.
      out = {}
      if ref_params is not None:
        with jax.named_scope("reference"):  # phase names the roofline attributes collectives by (hlo_collectives)
          out["ref"] = completion_logprobs(mcfg, ref_params, seq_chunk, P, temp)[0]
      if bf16:
        with jax.named_scope("old_logprobs"):
          out["old"] = completion_logprobs(mcfg, params, seq_chunk, P, temp)[0]
      return out

    need = ref_params is not None or bf16
    lp = forwards_by_length(config, forwards, bucket, seq, P) if need else {}
    old_logp_NxL = lp.get("old", rows["old_logp_NxL"])
    ref_logp_NxL = None
    if ref_params is not None:
      ref_logp_NxL = jax.lax.stop_gradient(lp["ref"]) * mask_NxL
    return Rollout(seq=seq, tokens_NxL=rows["tokens_NxL"], mask_NxL=mask_NxL, lengths_N=rows["lengths_N"],
                   truncated_N=rows["truncated_N"], r_N=rows["r_N"], per_term=rows["per_term"], steps=rows["steps"],
                   terms_NxK=rows["terms_NxK"], term_w_K=term_w_K,
                   old_logp_NxL=jax.lax.stop_gradient(old_logp_NxL) * mask_NxL, ref_logp_NxL=ref_logp_NxL,
                   status=status, fallbacks=fallbacks, ds_kept=ds_kept, bucket=bucket,
                   decode_steps=decode_steps)

  return rollout_fn


def train_lengths(config) -> tuple[int, ...]:
  """The update's static completion lengths (update.train_lengths: rl.train_buckets of them, the longest L)."""
  return update_lib.train_lengths(config.sampling.max_new_tokens, config.rl.train_buckets)


def forwards_by_length(config, fn: Callable, bucket, seq, P: int):
  """fn(*seq_chunk) -> a pytree of [rows, Lb] per-completion-token arrays, run on `seq` cut to the update's training
  length (train_lengths(config)[bucket], one lax.switch branch per length) in rl.rollout_chunks row chunks
  (map_row_chunks), zero-padded back to [N, L]: the positions cut off are past every completion (mask 0)."""
  L = seq[0].shape[1] - P

  def at(Lb, seq):
    out = map_row_chunks(fn, int(config.rl.rollout_chunks), *update_lib.cut(dict(seq=seq), P, Lb)["seq"])
    return jax.tree.map(lambda v: jnp.pad(v, ((0, 0), (0, L - Lb))), out)
  return update_lib.by_length(bucket, train_lengths(config), at, seq)


def signal_rewards(rl, r_N: jax.Array, terms_NxK: jax.Array, w_K: jax.Array, G: int) -> jax.Array:
  """What the advantage normalises, per group: the weighted sum r_BxG, or (reward_norm='per_term') the weighted
  terms r_BxGxK. A group carries no signal when it is constant in it (dynamic sampling, frac_zero_std_groups)."""
  if rl.reward_norm == "per_term":
    return (terms_NxK * w_K).reshape(-1, G, terms_NxK.shape[1])
  return r_N.reshape(-1, G)


def _kl_and_rewards(config, ro: Rollout):
  """The per-token KL and the group rewards the outcome advantage normalises (with the KL penalty folded in when
  rl.kl_in='reward' and the estimator does not fold it itself), and that penalty per sample (0 otherwise)."""
  rl, G = config.rl, config.rl.G
  if ro.ref_logp_NxL is None:  # β = 0: every KL term is multiplied by 0
    kl_NxL = jnp.zeros_like(ro.mask_NxL)
  else:
    kl_NxL = losses.kl_estimate(rl.kl_estimator, ro.old_logp_NxL, ro.ref_logp_NxL, k3_clamp=rl.kl_clamp) * ro.mask_NxL
  penalty_N = jnp.zeros_like(ro.r_N)
  if rl.kl_in == "reward" and not advantages.ESTIMATORS[rl.advantage].kl_in_advantage:
    # Sequence-level KL penalty folded into the outcome reward before normalisation.
    penalty_N = -rl.beta * kl_NxL.sum(-1)
  return kl_NxL, (ro.r_N + penalty_N).reshape(-1, G), penalty_N


def _outcome_advantages(config, ro: Rollout, r_BxG, ctx) -> jax.Array:
  """adv_BxG of a sequence-level estimator: of the summed reward, or (reward_norm='per_term') GDPO's."""
  rl, est = config.rl, advantages.ESTIMATORS[config.rl.advantage]
  if rl.reward_norm == "per_term":
    # GDPO: each term normalised in its group, weighted sum, batch std (validation keeps the KL out of r here).
    terms_BxGxK = ro.terms_NxK.reshape(-1, rl.G, ro.terms_NxK.shape[1])
    return advantages.decoupled(terms_BxGxK, ro.term_w_K, lambda r: est.fn(r, ctx), std_eps=rl.std_eps,
                                ddof=rl.std_ddof)
  return est.fn(r_BxG, ctx)


def compute_advantages(config, ro: Rollout) -> jax.Array:
  rl, G = config.rl, config.rl.G
  est = advantages.ESTIMATORS[rl.advantage]
  kl_NxL, r_BxG, _ = _kl_and_rewards(config, ro)
  ctx = advantages.Context(ro.mask_NxL, jax.lax.stop_gradient(kl_NxL), rl)
  if est.per_token:
    adv_NxL = est.fn(r_BxG, ctx)
  else:
    adv_NxL = advantages.broadcast_to_tokens(_outcome_advantages(config, ro, r_BxG, ctx).reshape(-1), ro.mask_NxL)
  if rl.process_weight > 0:
    s_r, s_end, s_valid = ro.steps
    p_adv = advantages.process_advantages(s_r, s_end, s_valid, ro.mask_NxL, G=G, std_eps=rl.std_eps,
                                          ddof=rl.std_ddof)
    adv_NxL = advantages.combine(adv_NxL, p_adv, w_outcome=1.0, w_process=rl.process_weight)
  return adv_NxL * ro.mask_NxL


def term_names(ro: Rollout) -> list[str]:
  """The names of terms_NxK's columns: the reward terms, then DAPO's overlong penalty when it is on."""
  names = list(ro.per_term)
  return names + ["overlong"] * (ro.terms_NxK.shape[1] - len(names))


def term_shares(config, ro: Rollout) -> dict[str, jax.Array]:
  """Each reward term's share of the outcome advantage: A = Σ_k a_k exactly, and share_k = <a_k, A> / <A, A> (the
  shares sum to 1; a term pulling against the others has a negative share). For the group estimators (grpo,
  dr_grpo, rloo) A_i is the group's centred reward times one scale per group (1/(std+eps), 1, G/(G-1)), so
  a_k = scale · w_k · (r_k − group mean of r_k); under reward_norm='per_term' a_k = w_k · (term k normalised in its
  group) / the batch std. A KL penalty folded into the reward (rl.kl_in='reward') is its own term, `kl_penalty`.
  Per-token estimators (REINFORCE++) mix the KL into every token, and PPO's GAE is not a group estimator: they get
  no shares ({})."""
  rl, G = config.rl, config.rl.G
  est = advantages.ESTIMATORS.get(rl.advantage)
  if est is None or est.per_token:
    return {}
  kl_NxL, r_BxG, penalty_N = _kl_and_rewards(config, ro)
  ctx = advantages.Context(ro.mask_NxL, jax.lax.stop_gradient(kl_NxL), rl)
  adv_BxG = jax.lax.stop_gradient(_outcome_advantages(config, ro, r_BxG, ctx))
  names = term_names(ro)
  terms_BxGxK = ro.terms_NxK.reshape(-1, G, len(names)).astype(jnp.float32)
  w_K = ro.term_w_K
  if rl.kl_in == "reward" and rl.reward_norm != "per_term":
    names, w_K = names + ["kl_penalty"], jnp.concatenate([w_K, jnp.ones((1,), jnp.float32)])
    terms_BxGxK = jnp.concatenate([terms_BxGxK, penalty_N.reshape(-1, G, 1)], axis=2)
  if rl.reward_norm == "per_term":
    parts_BxGxK = jax.vmap(lambda r: est.fn(r, ctx), in_axes=2, out_axes=2)(terms_BxGxK) * w_K
    axes = None  # one scale for the batch: the batch std
  else:
    parts_BxGxK = (terms_BxGxK - terms_BxGxK.mean(axis=1, keepdims=True)) * w_K
    axes = 1  # one scale per group
  total_BxG = parts_BxGxK.sum(-1)
  # The scale, fitted exactly: A = s · total (s = 0 where total is 0: a group without signal).
  den = jnp.sum(total_BxG * total_BxG, axis=axes, keepdims=True)
  s = jnp.where(den > 0, jnp.sum(adv_BxG * total_BxG, axis=axes, keepdims=True) / jnp.where(den > 0, den, 1.0), 0.0)
  a_BxGxK = parts_BxGxK * s[..., None]
  norm = jnp.sum(adv_BxG * adv_BxG)
  share_K = jnp.where(norm > 0, jnp.einsum("bgk,bg->k", a_BxGxK, adv_BxG) / jnp.where(norm > 0, norm, 1.0), 0.0)
  return {name: share_K[k] for k, name in enumerate(names)}


def policy_loss_kwargs(config) -> dict:
  """losses.policy_loss's settings for this config. ratio_level 'sequence' is GSPO-token (sequence-level ratio
  exp(mean_t log ρ), clipped with its own small ε); a KL folded into the reward leaves none in the loss."""
  rl = config.rl
  no_kl_in_loss = advantages.ESTIMATORS[rl.advantage].kl_in_advantage or rl.kl_in == "reward"
  return dict(eps_low=rl.eps_low, eps_high=rl.eps_high, beta=0.0 if no_kl_in_loss else rl.beta,
              kl_estimator=rl.kl_estimator, agg=rl.loss_agg, norm_len=config.sampling.max_new_tokens,
              ratio_level=rl.ratio_level, dual_clip=rl.dual_clip, kl_clamp=rl.kl_clamp)


def make_loss_fn(config, mcfg, P: int) -> Callable:
  """(params, minibatch) -> (loss, aux) for prompts of static length P."""
  temp, kwargs = config.sampling.temperature, policy_loss_kwargs(config)

  def loss_fn(params, mb):
    logp_NxL, ent_NxL = completion_logprobs(mcfg, params, mb["seq"], P, temp)
    # No reference (β = 0, or all of a vmapped sweep's β are 0: seeds.init_states): no KL term at all.
    kw = kwargs if mb.get("ref_logp_NxL") is not None else dict(kwargs, beta=0.0)
    loss, m = losses.policy_loss(logp_NxL, mb["old_logp_NxL"], mb.get("ref_logp_NxL"), mb["adv_NxL"], mb["mask_NxL"],
                                 **kw)
    return loss, dict(m, entropy=masked_mean(ent_NxL, mb["mask_NxL"]))
  return loss_fn


def rollout_metrics(config, ro: Rollout, adv_NxL) -> dict[str, jax.Array]:
  G = config.rl.G
  r_N, mask = ro.r_N, ro.mask_NxL
  m = {
      "train/reward_mean": r_N.mean(), "train/reward_std": r_N.std(),
      "train/frac_zero_std_groups": jnp.mean(advantages.group_is_constant(
          signal_rewards(config.rl, r_N, ro.terms_NxK, ro.term_w_K, G))),
      "train/adv_mean": masked_mean(adv_NxL, mask),
      "train/adv_std": jnp.sqrt(masked_mean(jnp.square(adv_NxL - masked_mean(adv_NxL, mask)), mask)),
      "train/adv_abs_max": jnp.max(jnp.abs(adv_NxL)),
      "train/completion_len_mean": ro.lengths_N.mean(),
      "train/completion_len_max": ro.lengths_N.max(),
      "train/truncation_rate": ro.truncated_N.mean(),
      "train/reward_fallbacks": ro.fallbacks,
  }
  if ro.bucket is not None:  # (a Rollout built by hand may leave these out)
    m["train/train_len"] = jnp.asarray(train_lengths(config), jnp.int32)[ro.bucket]
  if ro.decode_steps is not None:
    m["train/decode_steps"] = ro.decode_steps
  if ro.ref_logp_NxL is not None:  # β = 0 has no reference model: no train/kl
    m["train/kl"] = masked_mean(losses.kl_k3(ro.old_logp_NxL, ro.ref_logp_NxL), mask)
  for name, r in ro.per_term.items():
    m[f"train/reward/{name}"] = r.mean()
  for name, share in term_shares(config, ro).items():
    m[f"train/adv_share/{name}"] = share
  if ro.ds_kept is not None:
    m["train/dynamic_sampling_kept"] = ro.ds_kept
  return m


def finish_step(config, state: state_lib.State, updated: dict, ro: Rollout, adv_NxL, um: dict):
  """The RL families' tail: the new state, unless a Python reward failed (then the whole state stays as it was and
  the host raises after the step), and the step's metrics."""
  reward_ok = jnp.all(ro.status == rewards_lib.OK)
  new_state = update_lib.select(reward_ok, dict(state, **updated, step=state["step"] + 1), state)
  m = {**rollout_metrics(config, ro, adv_NxL), **update_lib.step_metrics(um, new_state["params"], reward_ok)}
  n_show = config.train.num_samples_logged
  m.update({"reward_status": ro.status, "samples/tokens_NxL": ro.tokens_NxL[:n_show],
            "samples/mask_NxL": ro.mask_NxL[:n_show], "samples/r_N": ro.r_N[:n_show]})
  return new_state, m


def train_by_length(config, update, carry, data: dict, rng, bucket, P: int):
  """update.minibatch_scan on `data` cut to the bucket's completion length, one lax.switch branch per length (each
  compiles a forward+backward). The loss normalisers that are constants (Dr.GRPO's, DAPO's overlong penalty) read
  sampling.max_new_tokens, never the bucket: the cut drops only masked positions, so the loss is the same."""
  rl = config.rl

  def at(Lb, carry, data, rng):
    return update_lib.minibatch_scan(update, carry, update_lib.cut(data, P, Lb), rng, mu=rl.mu,
                                     minibatches=rl.minibatches)
  return update_lib.by_length(bucket, train_lengths(config), at, carry, data, rng)


# ------------------------------------------------------------------------------------- the family's interface


def optimizer(config) -> update_lib.Optimizer:
  return update_lib.make_optimizer(config.optim)


def layout(config, mcfg: model_lib.ModelConfig) -> state_lib.Layout:
  """Policy, frozen reference (only when β > 0: uses_reference), AdamW state."""
  return state_lib.Layout(optimizer(config), ref=uses_reference(config))


def reference_params(config, state: dict):
  """The state's reference params, or None when it keeps none (β = 0). A state without them cannot run a config
  with a (static) β > 0: that is a state built for another config."""
  ref = state.get("ref_params")
  if ref is None and isinstance(config.rl.beta, numbers.Real) and config.rl.beta != 0:
    raise ValueError(f"config.rl.beta={config.rl.beta}: the state has no reference params (it was built for β = 0); "
                     "build the state from this config (family.init / state_spec).")
  return ref


state_spec, init = state_lib.spec_and_init(layout)


def check_preset(config) -> None:
  """Code that builds a step without validate.py (ablations, tests) cannot run half a preset either."""
  bad = presets.check(config)
  if bad:
    raise config_lib.ConfigError(bad)


def build_step(config, mcfg: model_lib.ModelConfig, spec: rewards_lib.RewardSpec,
               tokenizer) -> Callable[[dict, dict], tuple[dict, dict]]:
  """The pure, un-jitted `(state, batch) -> (state, metrics)`: jit it (families.make_step) or vmap it (seeds)."""
  check_preset(config)
  rollout_fn = make_rollout_fn(config, mcfg, spec, tokenizer)
  opt = optimizer(config)

  def step(state, batch):
    P = batch["prompt_NxP"].shape[1]
    loss_fn = make_loss_fn(config, mcfg, P)
    rng, k_roll, k_upd = jax.random.split(state["rng"], 3)
    ro = rollout_fn(state["params"], reference_params(config, state), batch, k_roll)
    adv_NxL = compute_advantages(config, ro)
    data = dict(seq=ro.seq, old_logp_NxL=ro.old_logp_NxL, adv_NxL=adv_NxL, mask_NxL=ro.mask_NxL)
    if ro.ref_logp_NxL is not None:
      data["ref_logp_NxL"] = ro.ref_logp_NxL

    update = update_lib.make_update(lambda ps, mb: loss_fn(ps[0], mb), (opt,))
    with jax.named_scope("update"):
      ((params,), (opt_state,)), um = train_by_length(
          config, update, ((state["params"],), (state["opt_state"],)), data, k_upd, ro.bucket, P)
    return finish_step(config, state, dict(params=params, opt_state=opt_state, rng=rng), ro, adv_NxL, um)

  return step
