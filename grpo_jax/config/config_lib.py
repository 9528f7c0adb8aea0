"""The one base config every experiment overrides, and the helpers config files share.

Every key a step or loop reads is declared in `base_config()`, so `--config.x.y=v` on an unknown key fails at parse
time and `validate.py` can check every value before anything compiles. `override` is the one way code sets keys by
name (dotted keys, declared ones only, type-checked): algorithm presets (presets.py) and ablation variants use it,
and sweeps are to.
`parse_arg` reads a config file's `:arg`. They live in the package, not in configs/: config_flags loads config
files by path, so code shared between them must be importable from any working directory.
"""
import ast
import contextlib
import contextvars
import copy
import dataclasses
import difflib
import functools
import importlib.util
import numbers
import os
from typing import Any, Iterable, Iterator, Mapping

import ml_collections
import numpy as np

SMALL_ALIASES = ("runlocal",)  # big_vision's name for the small variant; `small` is ours


from grpo_jax.infra.errors import ConfigError  # noqa: E402  (a bad config value: one line, exit 2; errors.py)

# The R1 pipeline's stages in pipeline order: r1.stages' default and choices (r1/layout.py: where each writes).
R1_STAGES = ("base", "r1_zero", "r1_1_cold_start", "r1_2_grpo", "r1_3_rejection", "r1_4_sft", "r1_5_final")


# sampling.compaction where compaction pays (rl/auto.py's choice for long completions) and what a step built from an
# unresolved config runs. 8 halves 128 slots down to one (a row that runs on alone after its batch has ended decodes
# at one slot, not 8): bench-tail's rollout took 0.84x the time of 4 sizes (64/32/16/8) over batches 1-3, 0.70x on
# the batch with one such row (docs/performance.md).
COMPACTION = 8


class _Declared(ml_collections.ConfigDict):
  """base_config's nodes: a bool set on a key declared a number is refused as it is set. ConfigDict turns it into
  the number (its int -> float cast: a config file's `optim.lr = True` ran at lr 1.0), so no later check sees it."""
  _where = ""  # the node's dotted path ('optim.'), for the error line

  def __setstate__(self, state):  # deepcopy / pickle: ConfigDict's rebuilds the fields only
    super().__setstate__(state)
    object.__setattr__(self, "_where", state.get("_where", ""))

  def __setitem__(self, key, value):
    old = self._fields.get(key) if isinstance(key, str) else None
    if (isinstance(value, (bool, np.bool_)) and isinstance(old, numbers.Real)
        and not isinstance(old, (bool, np.bool_))):
      kind = "an integer" if isinstance(old, numbers.Integral) else "a number"
      raise ConfigError(f"config.{self._where}{key}: is {value!r}, a bool where {kind} is expected (Python's True "
                        f"is 1, False is 0: it would run as {type(old)(value)!r}); set {kind} (it holds {old!r}).")
    if isinstance(old, _Declared) and isinstance(value, (dict, ml_collections.ConfigDict)):
      value = _declared(ml_collections.ConfigDict(value), f"{self._where}{key}.")  # a config file's own group dict
    super().__setitem__(key, value)


def _declared(node: ml_collections.ConfigDict, where: str = "") -> ml_collections.ConfigDict:
  """`node` (its fields shared, not copied) and every group under it as _Declared nodes that know their path."""
  out = _Declared(node)
  object.__setattr__(out, "_where", where)
  for k, v in list(out._fields.items()):  # pylint: disable=protected-access
    if isinstance(v, ml_collections.ConfigDict):
      out._fields[k] = _declared(v, f"{where}{k}.")  # pylint: disable=protected-access
  return out


def base_config() -> ml_collections.ConfigDict:
  """A fresh copy of the declared defaults, to build a config on. Built once: through ConfigDict's __init__ every
  node took 2.8 ms a call; a deep copy (_Declared.__setstate__ keeps each node's path) takes 1.3 ms."""
  return copy.deepcopy(_declared_base())


def defaults() -> ml_collections.ConfigDict:
  """The declared defaults themselves, shared and never copied: for code that only reads them (the validators ask
  for each config they check, ~8 times: ~750 base_config() calls in test_auto's ablation-table check, 516 in one
  test_sweep grid). Never edit it; base_config() gives a copy to edit."""
  return _declared_base()


@functools.lru_cache(maxsize=1)
def _declared_base() -> ml_collections.ConfigDict:
  return _declared(_base_config())


def _base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0       # data order (and evaluation's sampling rng): what every run of a sweep point shares
  # Params init and rollout rng (state.seed_keys); -1 = `seed`. A sweep's `--seeds N` sets it per run, so the runs
  # of a point differ in init and rollouts but see the same batches (grpo_jax/studies/sweep.py, docs/sweeps.md).
  c.run_seed = -1
  c.job = "grpo"  # grpo | sft | pretrain | r1_pipeline | export

  c.model = ml_collections.ConfigDict(dict(
      vocab_size=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=0, inter=192,
      rope_theta=10_000.0, qkv_bias=True, tie_embeddings=True, max_len=160, dtype="float32",
      rms_eps=1e-6, remat="none",
      # Llama-3.1 'llama3' RoPE frequency scaling (factor 0 = off). A config that takes its model from a checkpoint
      # (model_presets.apply(..., 'checkpoint')) leaves these and the shape fields unset: model_source fills them in.
      rope_scaling_factor=0.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192,
      attention="auto",       # TPU splash / GPU cuDNN (bf16) / CPU einsum or blockwise; or name one (attention.py)
      layer_unroll="auto",    # "all" / "none": unroll the training/prefill layer scan; auto = all up to 8 layers
      # LoRA (grpo_jax/model/lora.py, PEFT's conventions): rank 0 = off (full fine-tuning). scale = alpha / rank
      # (rslora: alpha / sqrt(rank)); targets by PEFT's names; the frozen base held in base_dtype. With β > 0 the
      # reference is the base itself (no reference copy); the SFT stage trains adapters only under sft.lora.
      lora=dict(rank=0, alpha=16.0, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"), rslora=False, base_dtype="float32"),
      # True: the shape set here is a default for runs without a checkpoint; with train.init_from=hf:<dir> every
      # checkpoint field comes from it instead (model_source.resolve; configs/gsm8k.py:small)
      yield_to_checkpoint=False))

  c.task = ml_collections.ConfigDict(dict(
      name="arith", max_digits=2, ops="+-", num_numbers=4, max_number=20, max_target=100,
      min_number=1,  # sums: the smallest operand (10 with max_number 99: every operand two-digit)
      language="a", prompt_len=24, data_dir="", train_size=20_000, test_size=500,
      # the RL batches draw from these train-split examples only, uniformly (data.rl_batches; the toy's pairs:
      # digits.toy_batches); one index = one-shot RLVR (arXiv 2504.20571: the batch is that problem repeated);
      # () = the whole split
      train_indices=(),
      tokenizer="",  # "" = the shipped sentencepiece model; "hf:<dir>", a .model path, or "init_from"
      # A Hugging Face tokenizer is checked against the HF model it runs with (size, eos/bos ids, the chat template's
      # tokens: preflight.check_tokenizer_model); True runs a pairing that fails the check (a warning instead), for
      # the rare tokenizer that is meant to differ from the model's own.
      allow_tokenizer_mismatch=False,
      prompt_format="r1_zero",  # or "chat": the tokenizer's chat template (tasks/prompts.py)
      # prompts longer than prompt_len (checked over every split before the run): "error" (one line naming the
      # count and the length that fits) | "drop" (skipped, counted in the log) | "truncate" (bos + the last tokens)
      overlong_prompts="error",
      # task.name='math' (tasks/math_data.py): the splits' files (a .jsonl / .json / .parquet file or a directory of
      # them; "" = task.data_dir/<split>.*), the records' question and answer fields ("" = the first of the usual
      # names; a dotted path for nested ones), the grader ("numeric": exact values | "symbolic": math-verify, the
      # [math] extra), what a reference it cannot read does ("error" | "skip": left out, counted), and the field of
      # the records' worked solutions that SFT / pre-training train on ("" = none)
      train_path="", test_path="", question_field="", answer_field="", grader="numeric", ungradable="error",
      solution_field=""))

  c.sampling = ml_collections.ConfigDict(dict(
      temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=48,
      # Where the weights live while the rollout decodes (decode_layout.py): auto | gathered | tp | fsdp. auto =
      # gathered (whole on every chip, no weight collective per token) when the planner says it fits, else
      # tensor-parallel over decode_tp fsdp devices, else the training layout (weights all-gathered every token).
      decode_layout="auto",
      decode_tp=0,  # fsdp devices per tensor-parallel decode group (layout tp / auto); 0 = smallest that fits
      # early exit: decode steps between checks that every row is done; 0 = always max_new_tokens; -1 = auto
      # (sampling.default_exit_chunk: the divisor of max_new_tokens nearest 16, so the L steps fill whole chunks)
      exit_chunk=-1,
      # Rollout engine: static = the reference batch decode (sampling.sample: every row of a row chunk decodes until
      # its longest ends); continuous = rollout/engine.py (one prefill per prompt, S slots refilled from a row
      # queue, compaction to power-of-two slot counts, KV read up to the live rows' length). Same samples (up to a
      # draw at a CDF boundary flipped by reduction-order rounding: docs/performance.md). auto (rl/auto.py):
      # continuous for completions of 256 tokens or more (bench-tail, L = 512: 0.35x the static rollout), static
      # below (bench-small, every row to 128: the same step time; a 64-wide model at L = 72: 1.29x slower rollout),
      # continuous wherever a continuous-only key is set (slots, compaction, paged decode attention)
      engine="auto",
      # continuous: decode slots S (rows queue for them); 0 = auto: the most, up to rows / rl.rollout_chunks, that
      # fit the device (rl/auto.py; a step built without it: rows / rl.rollout_chunks)
      slots=0,
      # continuous: slot counts S, S/2, ... (at most this many; 1 = no compaction). 0 = auto (rl/auto.py): each
      # size compiles one more decode step, so compaction only where completions are long enough for a tail
      compaction=0,
      # continuous: the decode attention's KV layout and kernel (model/paged_attention.py). plain = a [B, P] prompt
      # buffer + [S, L] slot buffers (live_attention.py); paged = a page pool (shared prompt pages, each slot's own
      # pages) attended in plain JAX, the reference of tpu_ragged = the same pool read by JAX's TPU ragged paged
      # attention kernel; auto = tpu_ragged on a TPU when the kernel supports the shape (head_dim 128), else plain
      # (rl/auto.py logs the choice)
      decode_attention="auto",
      page_size=16,  # paged / tpu_ragged: tokens per KV page (the TPU kernel: 8, 16 or 32)
      # The sampler's compute dtype: '' = model.dtype; 'bfloat16' beside a float32 trainer injects the mismatch an
      # inference engine brings (the behaviour policy μ differs from the trainer's π by rounding): the old log-probs
      # are then a forward in training numerics and rl.rollout_correction can measure and correct it
      # (rl/correction.py). Held-out evaluation keeps model.dtype.
      dtype=""))

  # rl.algo names the algorithm; presets.PRESETS[algo] holds every setting that defines it (the keys marked
  # "preset"). The defaults below are the grpo preset's (tests/test_presets.py checks they agree). Switch algorithm
  # with a config file's `:algo=<name>` arg (presets.apply), never by setting rl.algo alone: rl.preset records which
  # preset's settings the config holds, and validation stops a run whose rl.algo differs from it.
  c.rl = ml_collections.ConfigDict(dict(
      algo="grpo",               # a presets.PRESETS name: grpo | dr_grpo | dapo | rloo | reinforce_pp | ... | ppo
      preset="grpo",             # written by presets.apply; must equal algo
      G=8, prompts_per_step=8,
      # --- preset: the advantage ---
      advantage="grpo",          # estimator: grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline |
                                 # group_mean_batch_std (Lite PPO) | gae
      reward_norm="sum",         # sum: normalise the weighted sum of reward terms; per_term: GDPO (each term, then
                                 # the weighted sum, then the batch std)
      # Group std with ddof=1 (torch.std, as TRL, verl and OpenRLHF compute it) and eps added to the std (TRL 1e-4,
      # verl 1e-6): A = (r - mean) / (std + std_eps).
      std_ddof=1, std_eps=1e-4,
      # --- preset: the policy loss ---
      # per-token terms to the loss (losses.aggregate): seq_mean_token_mean (GRPO) | token_mean (DAPO) |
      # seq_mean_token_sum (verl: each answer's token sum, mean over answers) | seq_mean_token_sum_norm (Dr.GRPO:
      # the sums / max_new_tokens)
      loss_agg="seq_mean_token_mean",
      ratio_level="token",       # token: PPO/GRPO ratio per token; sequence: GSPO's length-normalised sequence ratio
      eps_low=0.2, eps_high=0.2,  # clip range [1 - eps_low, 1 + eps_high] of the ratio
      dual_clip=3.0,             # c > 1: for A < 0 the objective is at least c·A (bounded loss); 0 = off
      # per-token objective (losses.policy_loss): clip = PPO's clipped surrogate (GSPO's under ratio_level
      # 'sequence'); cispo = REINFORCE with the IS weight clipped to [1 - eps_low, 1 + eps_high] under a
      # stop-gradient (MiniMax-M1); sapo = a smooth gate (4/tau)·sigmoid(tau·(ratio - 1)) in place of the clip,
      # tau = sapo_tau_pos for A > 0, sapo_tau_neg otherwise (Gao et al. 2025)
      objective="clip", sapo_tau_pos=1.0, sapo_tau_neg=1.05,
      # --- preset: the KL to the reference ---
      beta=0.04, kl_estimator="k3", kl_in="loss",
      kl_clamp=10.0,             # k3 values above this are clamped (no KL gradient there); 0 = off
      # --- preset: DAPO's sampling and shaping ---
      dynamic_sampling=False,
      overlong_frac=0.0,         # DAPO soft overlong punishment over the last frac·max_new_tokens tokens; 0 = off
      # --- rollout correction (rl/correction.py; not set by presets): the importance weight ρ = π_prox/μ between
      # this step's pre-update weights in training numerics and the sampler's recorded log-probs, built once per
      # step: none | tis (w = min(ρ, is_cap)) | mis (w = ρ on [mis_lo, mis_hi], tokens outside masked) | icepop (the
      # same on [icepop_lo, icepop_hi]) | seq_mask (rows whose geometric-mean ρ is outside [seq_mask_lo,
      # seq_mask_hi], or with a token of ρ < is_veto, masked whole). Defaults are each source's (docs/algorithms.md).
      rollout_correction="none",
      is_cap=2.0,                # tis: Yao et al. 2025's C
      mis_lo=0.0, mis_hi=2.0,    # mis: Liu, Li et al. 2025 mask ρ > 2 (lo 0: one-sided)
      icepop_lo=0.5, icepop_hi=5.0,  # icepop: Ring-1T's [α, β]
      seq_mask_lo=1 / 1.001, seq_mask_hi=1.001, is_veto=1e-4,  # seq_mask: verl's geo_rs (veto 0 = off)
      # --- which tokens carry the policy gradient (rl/token_select.py; not set by presets, any objective): all |
      # top_entropy (the select_frac of highest entropy, arXiv 2506.01939) | clip_cov (clip_cov_ratio of the tokens
      # with clip_cov_lb < cov < clip_cov_ub, at random, get none) | kl_cov (the kl_cov_ratio of largest cov get
      # kl_cov_coef·|log ratio|): cov = (log pi - mean)(A - mean), arXiv 2505.22617 as verl defines them ---
      token_select="all", select_frac=0.2, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0,
      kl_cov_ratio=2e-4, kl_cov_coef=1.0,
      # entropy bonus (not set by presets; any objective, every family): loss -= entropy_coef · agg(H), H the
      # entropy of pi's whole next-token distribution (softmax(logits / temperature)) at each loss token, reduced
      # with loss_agg as the policy loss (verl's actor.entropy_coeff); 0 = off, and nothing is added to the step
      entropy_coef=0.0,
      # ProRL's reference reset (arXiv 2505.24864; rl_step.reference_reset; not set by presets): every this many
      # updates the reference becomes the current policy and the policy's optimizer state starts afresh (its lr
      # kept), so the KL anchors at the policy reached; 0 = off (the reference stays the starting policy). Needs a
      # reference (rl.beta > 0) that is a copy (not LoRA's frozen base).
      ref_reset_every=0,
      # --- budget and robustness (not set by presets) ---
      mu=1,
      minibatches=1,             # optimizer updates per epoch, each over rows / minibatches rows
      rollout_chunks=1,          # sample, and run the reference/old-log-prob forwards, over this many chunks of rows
                                 # in turn (one graph): the KV cache and those activations are one chunk's
      # minibatches / rollout_chunks = 0: auto (rl/auto.py), the fewest that the planner fits in the device's
      # memory, fewest chunks first (each decodes its rows in its own L steps), then fewest minibatches; 1 without a
      # known limit; one config line when none fits. More minibatches change the training (more, smaller updates).
      # The update trains on the shortest of train_buckets static completion lengths (L, L/2, ...; update.py's
      # train_lengths) covering the batch's longest completion, chosen in-graph: each compiles a forward+backward.
      # 0 = auto (rl/auto.py): 1 under packing (the packed passes follow the real tokens), else 2 for long runs
      # with completions of 256 tokens or more, else 1.
      train_buckets=0,
      # Padding-free training passes (rl/packing.py): samples laid end to end in rows of pack_len tokens (0 = the
      # planner's: P + L rounded up to 128), pack_rows packed rows per device per micro-batch (0 = the planner's: on
      # the CPU the fewest rows of 512 tokens, else 1/8 of the pass's rows), the reference/old-log-prob/critic/policy
      # passes over as many micro-batches as the real tokens need. packing: 'on' | 'off' (True / False accepted) |
      # 'auto' (rl/auto.py): on for runs of 20 RL steps or more on completions of 256 tokens or more (bench-tail's
      # reference + update 3x faster), off for short completions (bench-tiny 0.88x, the main job 0.94x the padded
      # step's speed) and short runs (its extra compile, +20% of the step's, is not won back).
      packing="auto", pack_len=0, pack_rows=0,
      process_weight=0.0,        # weight of process (step) advantages; 0 = outcome only
      oversample=2,              # dynamic sampling draws oversample × prompts_per_step prompts, keeps prompts_per_step
      max_nonfinite_in_row=3,
      reward_fallback="",        # "" = raise on bad Python reward output; else a float used per bad sample
      # the `random` reward term's rate: 1 with this probability per sample, from a hash of the sample and the
      # step's salt (reward_spec.random_reward; spurious rewards, arXiv 2506.10947 use 0.5)
      random_reward_rate=0.5,
      reward_timeout_s=60.0,
      # --- partial rollouts (rollout/carry.py, docs/algorithms.md): rows that outlive a step, in the train state ---
      # True: a table of (1 + max_staleness) · prompts_per_step groups decodes across steps in the continuous
      # engine's slots; a step decodes rollout_budget steps (and on until prompts_per_step groups are complete),
      # trains on the oldest complete groups and carries the rest. False: today's synchronous step, exactly.
      partial_rollouts=False,
      # The table's depth in batches beyond the one trained (the first step takes (1 + k) batches of prompts), and
      # the staleness bound: tokens drawn more than k updates before the update that trains them are masked out of
      # the loss and counted (train/stale_masked_frac). 0 = synchronous samples through the carry.
      max_staleness=1,
      rollout_budget=0,          # decode steps per step; 0 = auto: the trained rows' average length x rows / slots
      carry_kv="keep",           # KV across an update: keep (written by older weights) | recompute (re-prefilled)
      # tokens older than max_staleness: wait (decode on until the groups admitted max_staleness updates ago are
      # complete: none is ever trained) | mask (never wait: mask them out of the loss, counted)
      staleness_policy="wait",
      # each device's slots read the completion KV in this many groups, each up to its own longest row (slots sorted
      # longest first each step): a carried long row costs its group, not every slot; 0 = auto, the most up to 8
      carry_kv_groups=0))

  c.ppo = ml_collections.ConfigDict(dict(
      critic="separate", gamma=1.0, lam=0.95, value_clip=0.2, vf_coef=0.5, critic_lr=1e-4))

  # (name, weight) pairs; names from grpo_jax.rl.rewards.REGISTRY.
  c.rewards = (("accuracy", 1.0), ("format", 0.2))

  # Multi-turn rollouts with tools (grpo_jax/envs, docs/tools.md): a row that emits a stop marker pauses, the
  # environment answers, its observation is appended (not trained on) and the row resumes. env '' = single-turn.
  c.tools = ml_collections.ConfigDict(dict(
      # '' | a built-in (calculator | python: envs/registry.py) | 'module:attr' of an environment class or factory
      env="",
      # how calls and observations are written (envs/formats.py): plain (the synthetic tasks; task.tokenizer='tools'
      # has its markers as pieces) | qwen (Qwen2.5-Instruct's <tool_call> JSON and <tool_response> turn)
      format="plain",
      stop_markers=("</tool_call>",),  # a row pauses when it emits one; each one token of the run's tokenizer
      max_turns=4,            # environment calls a row may make; its next stop marker ends it
      max_obs_tokens=32,      # observation tokens appended per call (the callback's static width); longer: cut, counted
      timeout_s=10.0,         # seconds one environment step may take; slower: abandoned, the row's fallback (counted)
      fallback_reward=0.0,    # the reward of a row whose step raised, timed out or returned the wrong type (it ends);
                              # an environment reward: read by the ('env', w) term of config.rewards only
      workers=8,              # environment steps run at once (threads) in one host call
      # decode steps between environment calls (rollout/turns.py): a paused row waits at most this long for its
      # observation (less when every live row is paused); each boundary with a paused row is one host round trip
      chunk=8,
      # tools.env='python': each call's limits (envs/sandbox.py): wall seconds, address space, file size, output
      sandbox=dict(time_s=2.0, memory_mb=512, file_mb=1, output_chars=512)))

  c.optim = ml_collections.ConfigDict(dict(
      # eps: AdamW's ε in g/(√v + ε), optax's default (TRL adam_epsilon, verl optim eps)
      lr=1e-5, warmup_steps=0, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0, grad_clip=1.0))

  c.sft = ml_collections.ConfigDict(dict(
      steps=0, batch=32, lr=3e-3, warmup_steps=20, loss_on="completion", mistake_frac=0.0, init_from="",
      lora=False))  # under model.lora: False = the SFT stage trains all weights, True = adapters only

  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))

  c.train = ml_collections.ConfigDict(dict(
      steps=20, log_every=1, eval_every=10, ckpt_every=10, keep_checkpoints=3, plot_every=10,
      sample_every=10, num_samples_logged=3, init_from="",
      # A held-out metric (a key of the eval rows in metrics.jsonl, e.g. "eval/accuracy"; "" = off): every
      # evaluation of an RL run after a step (not step 0's) also saves a checkpoint recording it, and rotation keeps
      # the best one (ties: the earlier) besides the newest keep_checkpoints (`python -m grpo_jax.export RUN_DIR OUT
      # --best` exports it). keep_best_mode: max | min.
      keep_best="", keep_best_mode="max",
      # Resuming with a changed config is refused unless every changed key is listed here ("optim.lr,rl.G");
      # keys that change the saved state's structure (model.*, the critic, beta 0 <-> > 0) never can be.
      allow_config_change="",
      rerun_stages=""))  # stages to redo from scratch ("sft"; pipeline stage names); their dirs move to DIR/replaced/

  c.eval = ml_collections.ConfigDict(dict(
      size=500, batch=100, n_samples=4, pass_k=(1, 4)))

  # plots: DIR/plots/*.png every train.plot_every steps and at the end of a run; False draws none (matplotlib is
  # never imported; `python -m grpo_jax.plots DIR` draws them from metrics.jsonl afterwards).
  c.log = ml_collections.ConfigDict(dict(tensorboard=True, wandb_project="", plots=True))

  # job=export: the run in --workdir -> a Hugging Face directory (grpo_jax/hf/export.py).
  c.export = ml_collections.ConfigDict(dict(
      out_dir="",        # required for job=export
      step=0,            # the checkpoint step to export; 0 = the newest
      best=False,        # True: the step the run kept for its best held-out score (train.keep_best)
      dtype="float32",   # of the written safetensors: float32 (lossless) | bfloat16 (half the size)
      model_type="",     # qwen2 | llama; "" = the source checkpoint's, else qwen2 with q/k/v biases, llama without
      # a LoRA run: merged (HF checkpoint, W + scale·A·B) | peft (a PEFT adapter directory) | base (its frozen
      # base as an HF checkpoint: what a PEFT directory of a non-hf: base needs beside it)
      format="merged"))

  # R1-Zero and R1's five stages (job r1_pipeline; grpo_jax/r1, docs/r1.md): each stage's knobs and reward mix.
  c.r1 = ml_collections.ConfigDict(dict(
      stages=R1_STAGES,  # those to run, in this order (configs/r1_zero.py: base, r1_zero)
      # Forbidden words: the harmlessness proxy of stage 5; pre-training noise writes them (noise_frac).
      forbidden=("ugh",),
      pretrain=dict(steps=500, batch=32, lr=3e-3, warmup_steps=20,
                    template_frac=0.3,  # documents that are chat transcripts with the R1-Zero prompt
                    tag_frac=0.35,      # ... of which use the <think>/<answer> tags (web-like): 10.5% of documents
                    mix_frac=0.25,      # documents whose solution switches language mid-way
                    mistake_frac=0.2,   # worked documents with one wrong step, a re-check phrase and the fix
                    noise_frac=0.1,     # documents carrying a forbidden word
                    cot_frac=1.0,       # documents that work step by step; the rest answer directly (cot.brief)
                    verify_frac=0.0,    # worked documents that re-check a right step and find nothing to fix
                    recheck_per="document",  # mistake_frac / verify_frac per document (one each at most) | "step"
                    recheck_style="repeat",  # a re-check writes the step again | "columns": recomputes it in column
                                             # steps first (cot._recheck; configs/r1_zero_aha.py)
                    # worked steps that call the calculator first (a tools.format call + its observation:
                    # r1/corpus.py), each on its own; 0 = none (configs/tools_calc.py)
                    tool_frac=0.0,
                    seq_len=0),         # pre-training row length; 0 = model.max_len (long-context RL configs
                                        # pre-train on rows no longer than their documents)
      # A finished run's --workdir (or its base/ directory) whose base this run copies instead of pre-training one:
      # RL seeds over one fixed base (r1/shared_base.py; its pre-training config must equal this run's).
      base_from="",
      # 200 steps: at 100 the format took most of them and R1-Zero did not resolve above the base (docs/r1.md).
      zero=dict(steps=200, rewards=(("format", 1.0), ("accuracy", 1.0))),
      cold_start=dict(examples=256, steps=40, batch=32, lr=1e-3, warmup_steps=10, mistake_frac=0.1),
      grpo=dict(steps=30, rewards=(("accuracy", 1.0), ("format", 0.5), ("language", 0.5))),
      rejection=dict(prompts=256, n=8, temperature=1.0, keep_per_prompt=1, general_frac=0.25,
                     general_noise_frac=0.5),  # general documents carrying a forbidden word (raw web text)
      sft2=dict(steps=100, batch=32, lr=1e-3, warmup_steps=10),
      # brevity_correct, not brevity: a length reward on wrong answers cut stage 4's reasoning (docs/r1.md, stage 5).
      final=dict(steps=20, rewards=(("accuracy", 1.0), ("format", 0.5), ("language", 0.5), ("brevity_correct", 0.2),
                                    ("harmless", 0.5)),
                 # The final stage's own optimiser/regulariser (0 / -1 / '' = optim.lr / rl.beta / rl.reward_norm).
                 # Half optim.lr and 5x rl.beta: stage 5 is a short, KL-anchored polish of stage 4 (docs/r1.md).
                 lr=1e-4, beta=0.2, reward_norm=""),
      # Held-out comparison of every model (r1/heldout.py): like `eval`, on its own sizes.
      report=dict(size=256, batch=128, n_samples=4, pass_k=(1, 4)),
  ))
  return c


# --------------------------------------------------------------------------------------------- config helpers


def run_seed(config) -> int:
  """The seed of a run's params init and rollout rng: `run_seed`, or `seed` when it is -1 (the default)."""
  rs = int(config.get("run_seed", -1))
  return int(config.seed) if rs < 0 else rs


# The integer knobs whose `auto` (rl/auto.py) is a number (0, or -1 where 0 means something): on the command line
# (`--config.<key>=auto`, `--sweep="<key>=auto,4"`) the word means that number (tests/test_auto.py checks this table
# against auto.REGISTRY). Every other knob's auto value is the string 'auto'.
AUTO_INT = {"rl.rollout_chunks": 0, "rl.minibatches": 0, "sampling.slots": 0, "rl.pack_len": 0, "rl.pack_rows": 0,
            "sampling.compaction": 0, "rl.train_buckets": 0, "sampling.exit_chunk": -1, "sampling.decode_tp": 0,
            "rl.carry_kv_groups": 0}
AUTO_STR = ("sampling.engine", "rl.packing", "sampling.decode_attention", "sampling.decode_layout")
AUTO_KEYS = tuple(AUTO_INT) + AUTO_STR  # every key rl/auto.py resolves (run/run_config.py records them)

# What an `auto` knob means in a step built from a config rl/auto.py has not resolved (tests that build steps
# directly): the reference path. Every command resolves them first (auto.resolve), so a run never reads these.
# (sampling.exit_chunk's is sampling.default_exit_chunk's rule itself: it needs no device to decide.)
UNRESOLVED = {"sampling.engine": "static", "rl.packing": "off", "rl.train_buckets": 1,
              "sampling.compaction": COMPACTION}

SWITCH_KEYS = ("rl.packing",)  # on / off / auto knobs
SWITCH = {True: "on", False: "off", "true": "on", "false": "off", "on": "on", "off": "off", "1": "on", "0": "off",
          "auto": "auto"}  # a switch knob's values (rl.packing): True / False are accepted as on / off


def auto_text(key: str, text: str) -> str:
  """A command-line value for `key`: 'auto' is AUTO_INT's number for an integer knob; anything else unchanged."""
  return str(AUTO_INT[key]) if text == "auto" and key in AUTO_INT else text


@functools.lru_cache(maxsize=1)
def _flat_tuple_keys() -> frozenset[str]:
  """The keys whose base_config value is a tuple of plain values (names, numbers), not of pairs."""
  out = set()
  def walk(d, prefix):
    for k, v in d.items():
      if isinstance(v, ml_collections.ConfigDict):
        walk(v, f"{prefix}{k}.")
      elif isinstance(v, tuple) and not any(isinstance(x, (tuple, list)) for x in v):
        out.add(prefix + k)
  walk(base_config(), "")
  return frozenset(out)


def tuple_text(key: str, text: str) -> str:
  """A command-line value for a tuple-valued key: an unquoted comma list (`base,r1_zero`, `(base, r1_zero)`) is
  the tuple of its items, as `1,4` already was for numbers; ml_collections read a list of words as ONE string
  (`('base,r1_zero',)`). Anything Python reads as a literal (`"('base', 'r1_zero')"`), and any other key, is
  unchanged."""
  if key not in _flat_tuple_keys() or "," not in text:
    return text
  try:
    ast.literal_eval(text)
    return text
  except (ValueError, SyntaxError):
    pass
  body = text.strip()
  if body[:1] + body[-1:] in ("()", "[]"):
    body = body[1:-1]
  items = [x.strip() for x in body.split(",")]
  if items[-1] == "":  # a trailing comma, as Python allows
    items.pop()
  if not items or any(not x or set(x) & set("'\"()[]") for x in items):
    return text  # not a plain list: ml_collections' own parse and error
  return repr(tuple(_plain(x) for x in items))


def _plain(item: str):
  """One item of a comma list: a number or a bool as Python reads it, anything else the word itself."""
  try:
    value = ast.literal_eval(item)
  except (ValueError, SyntaxError):
    return item
  return value if isinstance(value, (int, float, bool)) else item


def auto_value(key: str):
  """The value that asks rl/auto.py to choose `key`."""
  return AUTO_INT.get(key, "auto")


def switch(value) -> str | None:
  """'on' | 'off' | 'auto' for a switch knob's value (True / False / 'True' / 'on' / ...); None: not a switch value."""
  return SWITCH.get(value.lower() if isinstance(value, str) else value) if isinstance(value, (str, bool)) else None


def setting(config, key: str):
  """`config.<key>` as a step runs it: the resolved (or explicitly set) value, or UNRESOLVED[key] while it is still
  at its auto value (or absent: a config from before the key)."""
  node = config
  for part in key.split("."):
    node = node.get(part, auto_value(key)) if hasattr(node, "get") else node[part]
  if key in SWITCH_KEYS:
    node = switch(node)
  return UNRESOLVED[key] if node == auto_value(key) else node


def packing_on(config) -> bool:
  """rl.packing as a step runs it (resolved, set, or the unresolved 'off')."""
  return setting(config, "rl.packing") == "on"


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """A config file's `:arg` ("small,algo=rloo") as typed values; every name must be one of `defaults`.

  A bare name sets a bool to True; `key=value` converts value to the type of the default. `runlocal` means
  `small`. Each arg at most once. Anything else raises ConfigError naming the arg and the accepted ones (a typo must
  not silently run the full job)."""
  for k, v in defaults.items():
    if not isinstance(v, (bool, int, float, str)):
      raise TypeError(f"parse_arg default {k}={v!r}: use a bool, int, float or str (the type the arg converts to).")
  out = ml_collections.ConfigDict(defaults)
  accepted = ", ".join(k if isinstance(v, bool) else f"{k}=<{type(v).__name__}>" for k, v in defaults.items())
  given: dict[str, str] = {}
  for item in filter(None, (a.strip() for a in (arg or "").split(","))):
    key, has_value, text = item.partition("=")
    if key in SMALL_ALIASES and "small" in defaults:
      key = "small"
    if key not in defaults:
      raise ConfigError(f"config arg {item!r} is unknown; accepted: {accepted or 'none'}.")
    if key in given:  # the first would be dropped without a word (algo=dapo,algo=rloo ran rloo)
      raise ConfigError(f"config arg {item!r}: {key} is already given ({given[key]!r}); give each arg once.")
    given[key] = item
    default = defaults[key]
    if isinstance(default, bool):
      if has_value and text.lower() not in ("true", "false", "1", "0"):
        raise ConfigError(f"config arg {item!r}: {key} is a flag; write {key} or {key}=false.")
      out[key] = not has_value or text.lower() in ("true", "1")
      continue
    if not has_value:
      raise ConfigError(f"config arg {item!r} needs a value: {key}=<{type(default).__name__}>.")
    try:
      out[key] = type(default)(text)
    except ValueError:
      raise ConfigError(f"config arg {item!r}: {key} takes a {type(default).__name__}.") from None
  return out


def _typed(key: str, old: Any, new: Any) -> Any:
  """`new` as the declared type of `old` (int → float and list → tuple convert; nothing else does)."""
  def bad(want: str):
    raise ConfigError(f"config.{key}: override value {new!r} ({type(new).__name__}) is not {want}, the declared "
                      "type in config_lib.base_config.")
  if isinstance(old, ml_collections.ConfigDict):
    example = f"{key}.{sorted(old.keys())[0]}" if old.keys() else f"{key}.<key>"
    raise ConfigError(f"config.{key} is a section; override its keys one by one (e.g. '{example}').")
  if old is None:
    return new
  if isinstance(old, bool):
    return bool(new) if isinstance(new, (bool, np.bool_)) else bad("a bool")
  if isinstance(old, numbers.Integral):
    return int(new) if isinstance(new, numbers.Integral) and not isinstance(new, (bool, np.bool_)) else bad("an int")
  if isinstance(old, numbers.Real):
    return float(new) if isinstance(new, numbers.Real) and not isinstance(new, (bool, np.bool_)) else bad("a float")
  if isinstance(old, str):
    if isinstance(new, (bool, np.bool_)) and key in SWITCH_KEYS:
      return switch(bool(new))  # a switch knob (rl.packing): True / False mean 'on' / 'off'
    return new if isinstance(new, str) else bad("a str")
  if isinstance(old, (tuple, list)):
    def as_tuple(x):
      return tuple(as_tuple(y) for y in x) if isinstance(x, (tuple, list)) else x
    return as_tuple(new) if isinstance(new, (tuple, list)) else bad("a tuple")
  return new if isinstance(new, type(old)) else bad(f"a {type(old).__name__}")


def override(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A copy of `config` with each dotted key ('rl.beta') set to its value, in order.

  Only declared keys may be set, each with a value of its declared type; an unknown key, a section or a wrong
  type raises ConfigError naming the key (one line). It is the one way code sets keys by name (algorithm presets,
  ablation variants; sweep points are to use it too), so all of them are checked the same way."""
  out = copy.deepcopy(config)
  for key, value in overrides.items():
    if not isinstance(key, str) or not key:
      raise ConfigError(f"config override key {key!r} must be a dotted string such as 'rl.beta'.")
    node, path = out, []
    for part in key.split("."):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        where = "config" + "".join("." + p for p in path)
        known = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        close = difflib.get_close_matches(part, known, n=1)
        hint = f"did you mean '{'.'.join(path + close)}'?" if close else f"{where} has {', '.join(known) or 'no keys'}."
        raise ConfigError(f"config.{key}: unknown key (not declared in config_lib.base_config); {hint}")
      parent, node = node, node[part]
      path.append(part)
    parent[path[-1]] = _typed(key, node, value)
  return out


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of the config file at `path`, loaded by path as config_flags does (so one config can
  start from another without putting configs/ on sys.path)."""
  if not os.path.isfile(path):
    raise ConfigError(f"config file {path} does not exist.")
  spec = importlib.util.spec_from_file_location("_config_" + os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def under(key: str, prefix: str) -> bool:
  """Dotted `key` is `prefix` or a key under it ('rl.' and 'rl' both hold 'rl.beta'; 'tools.sandbox' holds
  'tools.sandbox.time_s')."""
  p = prefix.rstrip(".")
  return key == p or key.startswith(p + ".")


def flat(c: Any, prefix: str = "") -> dict[str, Any]:
  """`a.b.c -> value` of a ConfigDict (or nested dict), values as they are."""
  out = {}
  for k in c.keys():
    if hasattr(c[k], "keys"):
      out.update(flat(c[k], f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = c[k]
  return out


# ------------------------------------------------------------------------------------------ keys the user set

# The dotted keys the person running a command set for this run: its `--config.<key>=` overrides (absl's config flag
# records them: config_flags.get_override_values), and a sweep point's or an ablation variant's overrides, which
# reach the run through `override` as the flags do. None: no command recorded them (a library caller that built the
# config in code is its author and its user at once: every value away from the base config counts as set).
@dataclasses.dataclass
class _UserRecord:
  keys: frozenset[str]
  said: set[str]  # the warnings already logged under this record (first_time)


_USER_KEYS: contextvars.ContextVar[_UserRecord | None] = contextvars.ContextVar("user_keys", default=None)


@contextlib.contextmanager
def user_keys_set(keys: Iterable[str]) -> Iterator[None]:
  """Inside, `keys` (dotted) are the keys the user set for the config being checked or run (replacing any outer
  record: a sweep names each run's own), and each warning is said once (first_time)."""
  token = _USER_KEYS.set(_UserRecord(frozenset(keys), set()))
  try:
    yield
  finally:
    _USER_KEYS.reset(token)


def user_keys() -> frozenset[str] | None:
  """The keys recorded by the innermost user_keys_set, or None when no command recorded any."""
  record = _USER_KEYS.get()
  return None if record is None else record.keys


def nearest_key(key: str) -> str | None:
  """The declared dotted key (of base_config) closest to a misspelled `key`, or None where none is close: the hint
  of every 'no such key' line (a --config.<key> flag, a config file's key)."""
  close = difflib.get_close_matches(key, list(flat(defaults())), n=1, cutoff=0.75)
  return close[0] if close else None


def first_time(message: str) -> bool:
  """Whether `message` was not said yet under the innermost user_keys_set: a command checks its config more than
  once (preflight, then each stage's set-up), and a warning repeated at each check reads as several problems.
  Always True outside one (a library caller that checks twice hears it twice)."""
  record = _USER_KEYS.get()
  if record is None:
    return True
  if message in record.said:
    return False
  record.said.add(message)
  return True


def set_by_user(key: str, value: Any, default: Any) -> bool:
  """Whether the user set `key` (dotted; its current `value`, the base config's `default`): recorded by the command
  (a key under it counts: 'tools.sandbox' covers 'tools.sandbox.time_s'), or, with no record, away from the default.
  What the "no effect" warnings ask, so that a config file's own values (its author's business) are not reported
  as if the person running it had set them."""
  keys = user_keys()
  if keys is None:
    return value != default
  return any(under(k, key) for k in keys)
