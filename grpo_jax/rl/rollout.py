"""The rollout half of the RL step: sample G completions per prompt, score them, and the reference and old-log-prob
forwards on the training length (`Rollout`). The GRPO step (rl_step.py) and PPO (ppo_step.py) both start here."""
import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.config import config_lib
from grpo_jax.envs import batch as env_batch
from grpo_jax.envs import transcript as transcript_lib
from grpo_jax.infra import sharding
from grpo_jax.model import model as model_lib
from grpo_jax.rl import advantages
from grpo_jax.rl import correction
from grpo_jax.rl import obs_mask
from grpo_jax.rl import packing
from grpo_jax.rl import rewards as rewards_lib
from grpo_jax.rl import reward_spec
from grpo_jax.rl import row_chunks
from grpo_jax.rl import update as update_lib
from grpo_jax.rollout import carry as carry_lib
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import engine as engine_lib
from grpo_jax.rollout import sampling
from grpo_jax.rollout import turns
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib

PROMPT_KEYS = ("prompt_NxP", "prompt_mask_NxP")


def tile_batch(batch: dict, G: int) -> dict:
  """Repeats every per-prompt field G times so row i belongs to group i // G."""
  return {k: sharding.constrain_batch(jnp.repeat(v, G, axis=0)) for k, v in batch.items()}


def full_sequence(prompt_NxP, pmask_NxP, tokens_NxL, mask_NxL):
  tokens_NxT = jnp.concatenate([prompt_NxP, tokens_NxL], axis=1)
  mask_NxT = jnp.concatenate([pmask_NxP, mask_NxL], axis=1).astype(jnp.int32)
  positions_NxT = jnp.maximum(jnp.cumsum(mask_NxT, axis=1) - 1, 0)
  return tokens_NxT, positions_NxT, mask_NxT


def completion_logprobs(mcfg, params, seq, P: int, temperature: float, packed: bool = False):
  """log π(o_t | q, o_<t) and entropies for the completion columns only (the LM head skips prompt positions); a
  `packed` seq (packing.packed_seq) gets them at every position, aligned to the token they score (packing.unpack)."""
  tokens_NxT, positions_NxT, mask_NxT = seq
  if packed:
    return model_lib.token_logprobs(mcfg, params, tokens_NxT, positions_NxT, mask_NxT, temperature, packed=True)
  return model_lib.completion_logprobs(mcfg, params, tokens_NxT, positions_NxT, mask_NxT, P, temperature)


class Rollout(NamedTuple):
  """One iteration's samples, scores and log-probs. Rows N = B·G (row i in group i // G); L completion tokens."""
  seq: tuple                # (tokens_NxT, positions_NxT, mask_NxT): prompt + completion, the training forward's input
  tokens_NxL: jax.Array
  mask_NxL: jax.Array       # float32: 1 up to and including EOS; with an environment, the loss mask: 0 on the
                            # observation tokens too (obs_mask.train_mask: seq's mask, for attention, keeps them)
  lengths_N: jax.Array      # the tokens mask_NxL counts (with an environment: the model's own)
  truncated_N: jax.Array
  r_N: jax.Array            # the weighted reward
  per_term: dict            # name -> unweighted r_N of each reward term
  terms_NxK: jax.Array      # the K reward terms (unweighted; DAPO's overlong penalty last when on), per sample
  term_w_K: jax.Array       # their weights (the overlong penalty's is 1)
  steps: tuple | None       # process scores (step_r_NxS, step_end_NxS, step_valid_NxS), or None
  old_logp_NxL: jax.Array   # π_prox: the pre-update weights' log-probs in training numerics (stop-gradient, 0 on
                            # padding): a forward when correction.needs_proximal, else behav_logp_NxL itself
  ref_logp_NxL: jax.Array | None  # the reference's; None when β = 0 (no reference model: uses_reference)
  status: jax.Array         # one per reward term: reward_spec.OK unless its Python call failed
  fallbacks: jax.Array      # samples a Python term replaced by its fallback score
  ds_kept: jax.Array | None  # dynamic sampling: kept groups with reward variance (None when off)
  bucket: jax.Array | None = None  # index into train_lengths(config): the shortest covering the longest completion
  decode_steps: jax.Array | None = None  # decode steps run: the slowest row chunk's (early exit: sampling.py)
  decode_row_steps: jax.Array | None = None  # row-steps the decode computed (every row chunk's or slot's, summed)
  decode_slot_util: jax.Array | None = None  # generated tokens / row-steps (engine.slot_util), over all sampled rows
  decode_admit_wait: jax.Array | None = None  # continuous engine: mean decode steps a row queued for a slot
  index_N: jax.Array | None = None  # each row's example index (the batch's index_N): samples.jsonl's reference
  behav_logp_NxL: jax.Array | None = None  # μ: the sampler's log-probs as recorded at sampling time (never
                                           # recomputed; stop-gradient, 0 on padding)
  version_NxL: jax.Array | None = None  # partial rollouts: the policy version (state step) that drew each token
  carry_stats: Any = None  # partial rollouts: what the carry's schedule did this step (carry.Out, arrays only)
  # multi-turn rows (tools.env): 1 where a token was fed from an observation; the readings of envs/transcript.py
  # (calls_N, turns_N, obs_tokens_N, gen_tokens_N) and each row's event counts (envs/batch.py EVENTS); whether an
  # environment call failed as a whole (host_calls status: the step keeps its state) and the calls' COUNTS
  obs_NxL: jax.Array | None = None
  tool_rows: dict | None = None
  env_status: jax.Array | None = None
  env_counts_K: jax.Array | None = None


def sampler_model(config, mcfg: model_lib.ModelConfig) -> model_lib.ModelConfig:
  """The model as the rollout's sampler runs it: in sampling.dtype ('' = the model's own). Params stay float32; only
  the compute dtype of the prefill and decode changes (a bf16 sampler beside an fp32 trainer: the mismatch an
  inference engine brings, correction.needs_proximal)."""
  dtype = correction.sampler_dtype(config)
  return mcfg if dtype == mcfg.dtype else dataclasses.replace(mcfg, dtype=dtype)


def for_rollout(config, mcfg: model_lib.ModelConfig, params: Any) -> decode_layout.Decode:
  """The rollout's decode weights, in the layout `config.sampling.decode_layout` names on the context mesh (chosen
  before tracing by rl/auto.py; nothing is planned here). Call it once per rollout, outside any loop over rollout
  chunks: the layout step moves every weight."""
  mesh = decode_layout.context_mesh()
  layout = decode_layout.from_config(mcfg, config.sampling, mesh) if mesh else decode_layout.Layout("gathered")
  return decode_layout.prepare(mcfg, params, layout)


def make_rollout_fn(config, mcfg, spec: reward_spec.RewardSpec, tokenizer) -> Callable[..., Rollout]:
  """(params, ref_params or None, batch, rng) -> Rollout: sample G completions per prompt, score them, log-probs.

  Sampling, and then the reference and (correction.needs_proximal) old-log-prob forwards, run over `rl.rollout_chunks` chunks of rows
  (map_row_chunks), so the KV cache and the forwards' activations are those of one chunk. Each row's uniforms are
  drawn for all rows at once, so chunking does not change the samples."""
  rl, G, temp = config.rl, config.rl.G, config.sampling.temperature
  chunks = int(rl.rollout_chunks)
  scfg = sampling.SamplingConfig.from_config(config.sampling, eos_id=getattr(tokenizer, "eos_ids", tokenizer.eos_id), pad_id=tokenizer.pad_id)
  proximal = correction.needs_proximal(config)  # else π_prox = μ: no old-log-prob forward (exact on-policy mode)
  smcfg = sampler_model(config, mcfg)
  overlong_cache = round(rl.overlong_frac * scfg.max_new_tokens)  # a length: static
  # Each term's weight (the order of terms_NxK); the overlong penalty, when on, is the last term, weight 1.
  term_w_K = jnp.asarray(spec.weights + ((1.0,) if overlong_cache > 0 else ()), jnp.float32)
  sizes = train_lengths(config)
  engine = config_lib.setting(config, "sampling.engine")
  levels = int(config_lib.setting(config, "sampling.compaction"))

  cspec = carry_spec(config)
  budget = int(rl.get("rollout_budget", 0)) or None
  tools = None if spec.env is None else turns.tools_for(config, spec.env)
  if tools is not None and engine != "continuous":
    raise config_lib.ConfigError("config.tools.env: multi-turn rows run in the continuous engine "
                                 "(sampling.engine='continuous'; the rollout carry, rl.partial_rollouts, runs them too).")

  def rollout_fn(params, ref_params, batch, rng, carry=None, version=None) -> Rollout | tuple[Rollout, Any]:
    """The Rollout; with partial rollouts (rl.partial_rollouts) also the new carry: (Rollout, carry)."""
    k_sample, k_ds = jax.random.split(rng)
    # The weights in their decode layout (decode_layout.py), once per rollout, outside the chunk loop: every chunk
    # decodes with this one copy.
    decode = for_rollout(config, smcfg, params)
    carried = None
    if cspec is not None:
      # the carry admits this step's prompts, decodes its budget and hands back B complete groups (carry.py)
      spec_here = cspec._replace(D=engine_lib.batch_split())
      carry, carried = carry_lib.advance(smcfg, params, carry, batch, version, k_sample, scfg, spec_here,
                                         budget=budget, kv=rl.carry_kv, decode=decode, tools=tools)
      batch = carried.fields
    b = tile_batch(batch, G)
    n_all, P = b["prompt_NxP"].shape
    row_chunks.check_chunks(chunks, n_all // (rl.oversample if rl.dynamic_sampling else 1))  # the kept rows are chunked too

    if carried is not None:
      ro = carried.rollout
      decode_steps, row_steps, admit_wait = ro.decode_steps, carried.row_steps, None
    elif engine == "continuous":
      u_NxL = sampling.uniforms(k_sample, scfg.max_new_tokens, n_all).T
      # one prefill per prompt (the untiled batch), S slots over the N rows; rl.rollout_chunks bounds the slots
      # (sampling.slots=0: N / rollout_chunks, the KV of as many rows as one static chunk holds)
      env_kw = {} if tools is None else dict(  # the environment reads each row's prompt's host fields
          tools=tools, env_fields={k: v for k, v in batch.items() if k not in PROMPT_KEYS})
      ro, stats = engine_lib.sample_groups(smcfg, params, batch["prompt_NxP"], batch["prompt_mask_NxP"], G, scfg,
                                           u_LxN=u_NxL.T, slots=row_chunks.slots_for(config, n_all), levels=levels,
                                           split=engine_lib.batch_split(), decode=decode,
                                           **engine_lib.attention_kwargs(config, smcfg), **env_kw)
      decode_steps, row_steps, admit_wait = ro.decode_steps, stats.row_steps, stats.admit_wait
    else:
      u_NxL = sampling.uniforms(k_sample, scfg.max_new_tokens, n_all).T

      def sample_rows(p, m, u):
        s = sampling.sample(smcfg, params, p, m, None, scfg, u_LxN=u.T, decode=decode)
        # one count per row, so map_row_chunks can stack the chunks' counts like any row-wise output
        return s._replace(decode_steps=jnp.broadcast_to(s.decode_steps, s.lengths_N.shape))

      ro = row_chunks.map_row_chunks(sample_rows, chunks, b["prompt_NxP"], b["prompt_mask_NxP"], u_NxL)
      # each chunk's decode exits early on its own once its rows are done: the rollout ran the slowest chunk's steps
      decode_steps = jnp.max(ro.decode_steps)
      row_steps, admit_wait = jnp.sum(ro.decode_steps), None  # each row computed its chunk's steps
    if carried is None:
      slot_util = engine_lib.slot_util(ro.lengths_N, row_steps)
    else:  # the tokens this step drew (not the ones it trains) over its row-steps, as engine.slot_util counts them
      slot_util = carried.new_tokens.astype(jnp.float32) / (row_steps + carried.admitted_rows).astype(jnp.float32)
    tokens_NxL = sharding.constrain_batch(ro.tokens_NxL)
    fields = {k: v for k, v in b.items() if k not in PROMPT_KEYS}
    env = None if tools is None else carried.env if carried is not None else stats.env
    if env is not None:  # the environment's per-turn rewards, for the 'env' reward term (rewards.py)
      fields.update(rewards_lib.env_fields(env, config.tools.max_turns))
    # each row's key for the terms that draw a reproducible coin per sample (reward_spec.random_reward)
    fields[reward_spec.SAMPLE_KEY] = sharding.constrain_batch(reward_spec.sample_keys(rng, n_all))
    # the terms read the model's own tokens: an observation's text is never scored as the model's (rewards.compute)
    own = {} if env is None else dict(obs_NxL=env.obs_NxL, env_ended_N=env.events_NxE[:, env_batch.ENDED] > 0)
    r_N, per_term, status, fallbacks, steps = rewards_lib.compute(spec, tokens_NxL, ro.mask_NxL, fields, **own)
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
                r_N=r_N, per_term=per_term, terms_NxK=terms_NxK, steps=steps, behav_logp_NxL=ro.logp_NxL,
                index_N=b.get("index_N"), version_NxL=None if carried is None else carried.ver_NxL)
    if env is not None:
      # the loss mask leaves the observation tokens out (the loss, KL, entropy, advantages and length statistics
      # read it); the attention mask (seq's) and the training length keep them
      rows.update(seq_mask_NxL=rows["mask_NxL"], span_N=ro.lengths_N, obs_NxL=env.obs_NxL,
                  mask_NxL=obs_mask.train_mask(rows["mask_NxL"], env.obs_NxL.astype(jnp.float32)),
                  tool_rows=dict(transcript_lib.readings(ro.mask_NxL, env.obs_NxL, env.events_NxE, xp=jnp),
                                 events_NxE=env.events_NxE))
      rows["lengths_N"] = rows["tool_rows"]["gen_tokens_N"]
    ds_kept = None
    if rl.dynamic_sampling:
      # DAPO: the batch holds oversample×B prompts; keep B groups whose normalised reward varies, fixed shape.
      B_all = r_N.shape[0] // G
      idx_B, ds_kept = advantages.dynamic_sampling_select(signal_rewards(rl, r_N, terms_NxK, term_w_K, G),
                                                          B_all // rl.oversample, k_ds)
      keep_N = (idx_B[:, None] * G + jnp.arange(G)[None, :]).reshape(-1)
      rows = jax.tree.map(lambda x: sharding.constrain_batch(jnp.take(x, keep_N, axis=0)), rows)

    mask_NxL = rows["mask_NxL"]
    seq = full_sequence(rows["prompt_NxP"], rows["pmask_NxP"], rows["tokens_NxL"], rows.get("seq_mask_NxL", mask_NxL))
    # The training length: the shortest bucket covering the longest completion of ALL rows (the same for every
    # row chunk; reduced over vmapped runs). The forwards below, and the update, run on that many completion tokens.
    bucket = update_lib.bucket_index(rows.get("span_N", rows["lengths_N"]), sizes)

    def forwards(seq_chunk, packed):
      # π_prox (correction.needs_proximal): a bf16 sampler and training forward differ by rounding, and ρ must
      # start at exactly 1 for μ=1 on-policy, so the old log-probs are recomputed in training numerics (packed as
      # the policy pass is, under packing); a correction measures ρ = π_prox/μ against this forward. Carried
      # tokens (partial rollouts) were drawn by older weights over older KV: π_prox is the pre-update weights'.
      out = {}
      if ref_params is not None:
        with jax.named_scope("reference"):  # phase names the roofline attributes collectives by (hlo_collectives)
          out["ref"] = completion_logprobs(mcfg, ref_params, seq_chunk, P, temp, packed)[0]
      if proximal:
        with jax.named_scope("old_logprobs"):
          out["old"] = completion_logprobs(mcfg, params, seq_chunk, P, temp, packed)[0]
      return out

    need = ref_params is not None or proximal
    lp = forwards_by_length(config, forwards, bucket, seq, P) if need else {}
    behav_logp_NxL = jax.lax.stop_gradient(rows["behav_logp_NxL"]) * mask_NxL
    # exact on-policy mode: every token was sampled by these weights in these numerics, so μ serves as π_prox
    old_logp_NxL = jax.lax.stop_gradient(lp["old"]) * mask_NxL if proximal else behav_logp_NxL
    ref_logp_NxL = None
    if ref_params is not None:
      ref_logp_NxL = jax.lax.stop_gradient(lp["ref"]) * mask_NxL
    ro_out = Rollout(seq=seq, tokens_NxL=rows["tokens_NxL"], mask_NxL=mask_NxL, lengths_N=rows["lengths_N"],
                     truncated_N=rows["truncated_N"], r_N=rows["r_N"], per_term=rows["per_term"], steps=rows["steps"],
                     terms_NxK=rows["terms_NxK"], term_w_K=term_w_K,
                     old_logp_NxL=old_logp_NxL, ref_logp_NxL=ref_logp_NxL,
                     status=status, fallbacks=fallbacks, ds_kept=ds_kept, bucket=bucket,
                     decode_steps=decode_steps, decode_row_steps=row_steps, decode_slot_util=slot_util,
                     decode_admit_wait=admit_wait, index_N=rows["index_N"], behav_logp_NxL=behav_logp_NxL,
                     version_NxL=rows["version_NxL"], obs_NxL=rows.get("obs_NxL"), tool_rows=rows.get("tool_rows"),
                     env_status=None if env is None else env.status,
                     env_counts_K=None if env is None else env.counts_K,
                     carry_stats=None if carried is None else carried._replace(rollout=None, ver_NxL=None,
                                                                               fields=None))
    return ro_out if carried is None else (ro_out, carry)

  return rollout_fn


def carry_spec(config) -> carry_lib.Spec | None:
  """The rollout carry's shapes for a config with rl.partial_rollouts (None without): the batch's fields as the
  task's data gives them (or carry.batch_fields' override), the row split of the config's mesh on this process's
  devices (state.on_mesh sets a given mesh's)."""
  if not config.rl.get("partial_rollouts", False):
    return None
  fields = carry_lib.fields_override()
  if fields is None:
    fields = data_lib.prompt_fields(config.task, tok_lib.for_config(config), int(config.task.prompt_len))
  shape = {a: int(config.mesh[a]) for a in sharding.MESH_AXES}
  if -1 in shape.values():  # an axis over the remaining devices: this process's
    shape = sharding.mesh_shape(config.mesh, jax.device_count())
  # the KV the sampler writes: in its own dtype (sampling.dtype)
  return carry_lib.spec_for(config, fields, shape["data"] * shape["fsdp"], correction.sampler_dtype(config))




def train_lengths(config) -> tuple[int, ...]:
  """The update's static completion lengths (update.train_lengths: rl.train_buckets of them, the longest L)."""
  return update_lib.train_lengths(config.sampling.max_new_tokens, config_lib.setting(config, "rl.train_buckets"))


def forwards_by_length(config, fn: Callable, bucket, seq, P: int):
  """fn(seq_chunk, packed=False) -> a pytree of [rows, Lb] per-completion-token arrays, run on `seq` cut to the
  update's training length (train_lengths(config)[bucket], one lax.switch branch per length) in rl.rollout_chunks
  row chunks (map_row_chunks), zero-padded back to [N, L]: the positions cut off are past every completion (mask 0).
  Under rl.packing, fn(packed_seq, packed=True) gives per-position outputs over packed micro-batches instead
  (packing.forwards; the micro-batch bounds the activations, so rollout_chunks does not apply), the same [N, L]."""
  L = seq[0].shape[1] - P
  if config_lib.packing_on(config):
    return packing.forwards(config, lambda s: fn(s, True), seq, P)

  def at(Lb, seq):
    out = row_chunks.map_row_chunks(lambda *s: fn(s, False), int(config.rl.rollout_chunks),
                         *update_lib.cut(dict(seq=seq), P, Lb)["seq"])
    return jax.tree.map(lambda v: jnp.pad(v, ((0, 0), (0, L - Lb))), out)
  return update_lib.by_length(bucket, train_lengths(config), at, seq)


def signal_rewards(rl, r_N: jax.Array, terms_NxK: jax.Array, w_K: jax.Array, G: int) -> jax.Array:
  """What the advantage normalises, per group: the weighted sum r_BxG, or (reward_norm='per_term') the weighted
  terms r_BxGxK. A group carries no signal when it is constant in it (dynamic sampling, frac_zero_std_groups)."""
  if rl.reward_norm == "per_term":
    return (terms_NxK * w_K).reshape(-1, G, terms_NxK.shape[1])
  return r_N.reshape(-1, G)
