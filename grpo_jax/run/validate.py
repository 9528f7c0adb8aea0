"""Config validation before anything compiles: each failure is ONE line naming the key and the fix."""
import contextlib
import dataclasses
import json
import os
from typing import Any, Iterator

from absl import logging
import numpy as np

from grpo_jax.infra import host_calls
from grpo_jax.rl import advantages
from grpo_jax.rl import correction
from grpo_jax.rl import losses
from grpo_jax.rl import token_select
from grpo_jax.config import presets
from grpo_jax.config import config_lib
from grpo_jax.run import run_config
from grpo_jax.infra.errors import integer  # an int, not a bool (True is 1 in Python)
from grpo_jax.infra.errors import ConfigError  # noqa: F401  (validate.ConfigError is what callers catch; exit 2)
from grpo_jax.tasks import data
from grpo_jax.tasks import hf_tokenizer
from grpo_jax.tasks import registry
from grpo_jax.tasks import tokenizer as tokenizer_lib
from grpo_jax.hf import model_source
from grpo_jax.infra import sharding
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import sampling
from grpo_jax.model import model_config
from grpo_jax.model import paged_attention
from grpo_jax.tasks import prompts
from grpo_jax.envs import base as env_base
from grpo_jax.envs import batch as env_batch
from grpo_jax.envs import formats as env_formats
from grpo_jax.envs import registry as env_registry

# Advantage estimators (advantages.ESTIMATORS, plus PPO's GAE) by what they need.
ADVANTAGES = tuple(advantages.ESTIMATORS) + ("gae",)
GROUP_ADVANTAGES = tuple(n for n, e in advantages.ESTIMATORS.items() if e.group)  # the baseline comes from the group
# one advantage per sample from the group: what reward_norm=per_term needs
OUTCOME_GROUP_ADVANTAGES = tuple(n for n, e in advantages.ESTIMATORS.items() if e.group and not e.per_token)
# the KL is a per-token reward
KL_IN_REWARD_ADVANTAGES = tuple(n for n, e in advantages.ESTIMATORS.items() if e.kl_in_advantage) + ("gae",)
REWARD_NORMS = ("sum", "per_term")
RATIO_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_IN = ("loss", "reward")
LOSS_AGG = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
DTYPES = ("float32", "bfloat16")
REMAT = ("none", "full", "dots")
ATTENTION = ("auto", "xla", "blockwise", "splash", "cudnn", "dot_product", "pallas_gpu")  # = attention.IMPLEMENTATIONS
LANGUAGES = ("a", "b", "mixed")
ENGINES = ("auto", "static", "continuous")  # sampling.engine: rl/auto.py's choice / sampling.sample / rollout/engine.py
JOBS = ("grpo", "sft", "pretrain", "r1_pipeline", "export")  # grpo runs every rl.algo, ppo included
CRITICS = ("separate", "head")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # = model_config.LORA_TARGETS


def fail(key: str, msg: str):
  raise ConfigError(f"config.{key}: {msg}")


def positive_int(c, key):
  v = _get(c, key)
  if not integer(v) or v <= 0:
    _fail(key, f"must be a positive integer, got {v!r}.")


def _nonneg(c, key):
  v = _get(c, key)
  if not finite(v) or v < 0:
    _fail(key, f"must be a finite number >= 0 (in float32, the step's precision), got {v!r}.")


def prob(c, key, low_open=False):
  v = _get(c, key)
  if not finite(v) or not (0.0 <= v <= 1.0) or (low_open and v == 0):
    rng = "(0, 1]" if low_open else "[0, 1]"
    _fail(key, f"must be a probability in {rng}, got {v!r}.")


def _choice(c, key, choices):
  v = _get(c, key)
  if v not in choices:
    _fail(key, f"unknown value {v!r}; choose one of {list(choices)}.")


# The step computes in float32 (bfloat16 shares its exponent range): a number finite in Python but past float32's
# largest is inf there (host_calls.finite_f32), and a positive one below its smallest normal is 0 there (XLA flushes
# subnormals), so a key that must be finite, or > 0, is checked in float32's range.
F32_TINY = 1.1754943508222875e-38


def finite(v) -> bool:
  """A real number (not a bool), finite in float32 (10**400, which math.isfinite cannot take, is not)."""
  return isinstance(v, (int, float)) and not isinstance(v, bool) and host_calls.finite_f32(v) is not None


# Past these a value is a typo, not a setting (docs/reliability.md, "Bad input"): AdamW moves each weight by about
# lr per update (lr·m/(√v + eps), |m/√v| ≲ 1) and a model's weights are O(0.01–1), so lr > 1 overwrites the model at
# its first update (a learning rate above WARN_LR is allowed, with a warning); softmax(logits / T) past T = 100
# divides logits of a few tens to fractions of one: every draw is all but uniform over the vocabulary.
MAX_LR, WARN_LR = 1.0, 0.1
MAX_TEMPERATURE = 100.0


# One rule per kind of key: a key is checked for what it means, wherever a job reads it.
def learning_rate(c, key, inherit: str = "") -> None:
  """A learning rate: finite and > 0 (0 trains nothing, and would be accepted only to waste the run), at most
  MAX_LR; with `inherit`, 0 means "that key's value" and is allowed."""
  v = _get(c, key)
  if finite(v) and v > MAX_LR:
    _fail(key, f"is {v!r}: AdamW moves every weight by about the learning rate per update, so past {MAX_LR:g} the "
          "first update overwrites the model; set a learning rate <= 1 (fine-tuning: 1e-6 to 1e-4; a typo of 1e-5?).")
  if finite(v) and v > WARN_LR:
    _warn("config.%s=%r: far above language-model learning rates (1e-6 to 1e-3): AdamW moves every weight "
          "by about this much per update; check it is meant.", key, v)
  if finite(v) and (v > 0 or (inherit and v == 0)):
    return
  if finite(v) and v == 0:
    _fail(key, "is 0: nothing would train; set a positive learning rate.")
  _fail(key, f"must be a finite learning rate > 0{f' (or 0 = {inherit})' if inherit else ''}, got {v!r}.")


def temperature(c, key) -> None:
  """A sampling temperature past MAX_TEMPERATURE, or above 0 but below sampling.MIN_TEMPERATURE (0 is the caller's
  to refuse, with its own message: RL needs > 0)."""
  v = _get(c, key)
  if finite(v) and 0 < v < sampling.MIN_TEMPERATURE:
    _fail(key, f"is {v!r}: below {sampling.MIN_TEMPERATURE:g} softmax(logits / temperature) is argmax in all but "
          "name, and at ~1e-37 float32 overflows (NaN log-probs); set at least "
          f"{sampling.MIN_TEMPERATURE:g} (typical: 0.6 to 1.2).")
  if finite(v) and v > MAX_TEMPERATURE:
    _fail(key, f"is {v!r}: sampling draws from softmax(logits / temperature), which past {MAX_TEMPERATURE:g} is all "
          f"but uniform over the vocabulary; set at most {MAX_TEMPERATURE:g} (typical: 0.6 to 1.2).")


def fallback(c, key) -> None:
  """A value used in place of a failed computation: '' (off: the failure stops the run) or a finite number (a
  non-finite one would be the failure it replaces, passed on to the update)."""
  v = _get(c, key)
  if v == "":
    return
  x = host_calls.finite_f32(v)  # finite in float32, as the step holds it (1e39 would be inf there)
  if x is None or isinstance(v, bool):
    _fail(key, f"must be '' (stop on a failure) or a finite number used in its place (float32: |x| < 3.4e38), got "
          f"{v!r}.")


def reward_terms(key: str, terms) -> None:
  """A reward list: (name, weight) pairs, each name once (a second entry doubled the score and its metric showed
  one), each weight finite in float32 (a NaN weight made every reward NaN: the run stopped at step 1), and some
  weight not 0 (else every reward is 0 and nothing trains)."""
  seen = set()
  for i, entry in enumerate(terms):
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str) and finite(entry[1])):
      _fail(f"{key}[{i}]", f"must be a (name, weight) pair with a finite weight (float32), got {entry!r} (on the "
            f"command line: --config.{key}=\"(('accuracy', 1.0), ('format', 0.2))\").")
    if entry[0] in seen:
      _fail(f"{key}[{i}]", f"names {entry[0]!r} a second time; give each term once, with the weights summed.")
    seen.add(entry[0])
  if not any(w != 0 for _, w in terms):
    _fail(key, f"is {tuple(terms)!r}: every reward would be 0 and nothing would train; give at least one "
          "(name, weight) term with a weight other than 0.")


def positive_finite(c, key, what: str = "") -> float:
  """A scale or threshold that must be > 0 (an eps, a temperature, a base frequency), finite as well, in float32's
  range (F32_TINY); `what` says what the key does, in the message. -> the value."""
  v = _get(c, key)
  if not (finite(v) and v >= F32_TINY):
    _fail(key, f"must be a finite number > 0 in float32 (the step's precision{f'; {what}' if what else ''}), got "
          f"{v!r}.")
  return v


# fail, positive_int, prob and the rules above are public (the R1 pipeline checks its own keys with them); the
# checks here use the short private names.
_fail, _positive_int, _prob = fail, positive_int, prob


def _task(c, offers: str, lacks: str):
  """task.name must be a task of tasks/registry.py that offers `offers` (a TaskSpec field)."""
  name, ok = c.task.name, registry.names(offers)
  if name not in ok:
    _fail("task.name", f"{'unknown task' if name not in registry.TASKS else lacks} {name!r}; choose one of {ok}.")


def validate_keep_best(c) -> None:
  """train.keep_best: a held-out metric (its presence in the eval rows is checked at the first evaluation, or on
  resume against the rows the run logged: run/train.py's check_best_metric), kept by RL runs only: an SFT run
  evaluates once, at its end."""
  metric = _get(c, "train.keep_best")
  if not isinstance(metric, str):
    _fail("train.keep_best", f"must be a held-out metric name such as 'eval/accuracy' ('' = off), got {metric!r}.")
  _choice(c, "train.keep_best_mode", ("max", "min"))
  if not metric:
    return
  if metric.partition("/")[0] != "eval" or not metric.partition("/")[2]:
    _fail("train.keep_best", f"{metric!r} is not a held-out metric; name a key of the eval rows in metrics.jsonl, "
          "e.g. 'eval/accuracy' (mode max) or 'eval/completion_len_mean' (mode min).")
  if c.job in ("sft", "pretrain"):
    _fail("train.keep_best", f"job={c.job} evaluates once, at its end, so there is no best step to keep; leave it "
          "empty (it applies to RL runs and the RL stages of job=r1_pipeline).")


def validate_packing(c, total: int) -> None:
  """rl.packing's keys: a packed row must hold the longest sample (P + L tokens)."""
  if config_lib.switch(c.rl.packing) is None:
    _fail("rl.packing", f"must be 'on', 'off' (True / False) or 'auto', got {c.rl.packing!r}.")
  for k in ("rl.pack_len", "rl.pack_rows"):
    v = _get(c, k)
    if not integer(v) or v < 0:
      _fail(k, f"must be an integer >= 0 (0 = the planner's), got {v!r}.")
  if 0 < c.rl.pack_len < total:
    _fail("rl.pack_len", f"{c.rl.pack_len} < task.prompt_len + sampling.max_new_tokens = {total}: a packed row must "
          f"hold the longest sample; set rl.pack_len >= {total} or 0 (the planner's).")


def _get(c, key):
  for part in key.split("."):
    c = c[part]
  return c


def validate_model(c) -> None:
  unset = model_source.unset_fields(c)
  if unset:
    _fail(f"model.{unset[0]}", f"is unset (to be taken from a checkpoint) with {len(unset) - 1} more model fields; "
          "resolve the config first (model_source.resolve: train.init_from=hf:<dir>) or set a model preset.")
  m = "model"
  for k in ("vocab_size", "hidden", "layers", "heads", "kv_heads", "inter", "max_len"):
    _positive_int(c, f"{m}.{k}")
  mc = c.model
  if mc.heads % mc.kv_heads:
    _fail("model.kv_heads", f"{mc.kv_heads} must divide model.heads={mc.heads} (grouped-query attention).")
  if mc.head_dim == 0 and mc.hidden % mc.heads:
    _fail("model.head_dim", f"is 0 (= hidden // heads) but hidden={mc.hidden} is not divisible by heads={mc.heads}; "
          "set head_dim explicitly.")
  if mc.head_dim < 0 or (mc.head_dim % 2 if mc.head_dim else (mc.hidden // mc.heads) % 2):
    _fail("model.head_dim", "must be even (RoPE rotates pairs of dimensions).")
  positive_finite(c, "model.rope_theta", "RoPE's base frequency")
  positive_finite(c, "model.rms_eps", "RMSNorm's epsilon in x / sqrt(mean(x²) + eps)")
  _choice(c, "model.dtype", DTYPES)
  _choice(c, "model.remat", REMAT)
  _choice(c, "model.attention", ATTENTION)
  if mc.attention == "cudnn" and mc.dtype != "bfloat16":
    _fail("model.attention", f"'cudnn' needs model.dtype='bfloat16' (cuDNN flash attention has no {mc.dtype} "
          "kernel); set model.dtype=bfloat16 or model.attention=auto.")
  if "rope_scaling_factor" in mc:
    _nonneg(c, "model.rope_scaling_factor")
  if mc.get("rope_scaling_factor", 0):
    for k in ("model.rope_low_freq_factor", "model.rope_high_freq_factor", "model.rope_original_max_len"):
      positive_finite(c, k)
  if mc.get("rope_scaling_factor", 0) and not mc.rope_high_freq_factor > mc.rope_low_freq_factor:
    _fail("model.rope_high_freq_factor", f"must exceed model.rope_low_freq_factor ({mc.rope_high_freq_factor} <= "
          f"{mc.rope_low_freq_factor}) when llama3 RoPE scaling is on (model.rope_scaling_factor > 0).")
  validate_lora(c)


def validate_lora(c) -> None:
  """model.lora: rank 0 (off) or a positive rank, alpha > 0, targets among PEFT's Qwen2/Llama projection names;
  sft.lora and the job agree with the rank (job=sft/pretrain train adapters only under sft.lora)."""
  lc = c.model.get("lora")
  if lc is None:
    return
  if not integer(lc.rank) or lc.rank < 0:
    _fail("model.lora.rank", f"must be an integer >= 0 (0 = no LoRA), got {lc.rank!r}.")
  sft_lora = bool(c.get("sft", {}).get("lora", False))
  if lc.rank == 0:
    if sft_lora:  # trained all weights without a word: there are no adapters to train
      _fail("sft.lora", "is True (the SFT stage trains adapters on a frozen base) but model.lora.rank=0 (no "
            "adapters); set model.lora.rank > 0, or sft.lora=False to train all weights.")
    unused = _changed(lc.to_dict(), config_lib.defaults().model.lora.to_dict(), "model.lora")
    if unused:  # set for a LoRA run, meaning nothing without adapters: said, not silently dropped
      _warn("%s: no effect with model.lora.rank=0 (full fine-tuning, no adapters); set model.lora.rank > 0 "
            "to use %s.", ", ".join(unused), "it" if len(unused) == 1 else "them")
    return
  if c.get("job") in ("sft", "pretrain") and not sft_lora:
    # trained all weights, and its checkpoints then read as damaged to `export` (config.json names adapters)
    _fail("model.lora.rank", f"{lc.rank} under job={c.job}, which trains all weights unless sft.lora=True; set "
          "sft.lora=True to train adapters on the frozen base, or model.lora.rank=0.")
  if c.get("job") == "r1_pipeline":
    # its stages hand full params to each other (r1/pipeline.py reads the params of a stage checkpoint as the model)
    _fail("model.lora.rank", f"{lc.rank}: LoRA runs the grpo, sft and pretrain jobs; job=r1_pipeline hands full "
          "params between its stages: set model.lora.rank=0 there.")
  if not (finite(lc.alpha) and lc.alpha >= F32_TINY):
    _fail("model.lora.alpha", f"must be > 0 (scale = alpha / rank), got {lc.alpha!r}.")
  bad = [t for t in lc.targets if t not in LORA_TARGETS]
  if bad or not lc.targets or len(set(lc.targets)) != len(lc.targets):
    _fail("model.lora.targets", f"{tuple(lc.targets)}: name each at most once, among {LORA_TARGETS}.")
  _choice(c, "model.lora.base_dtype", DTYPES)
  dims = lora_dims(c.model)
  width, target, side = min((w, t, side) for t in lc.targets for side, w in enumerate(dims[t]))
  if lc.rank > width:  # the smallest width among the targets (a k/v output under GQA, not only hidden / inter)
    short = [t for t in lc.targets if min(dims[t]) < lc.rank]
    drop = f", or drop {', '.join(short)} from model.lora.targets" if len(short) < len(lc.targets) else ""
    _fail("model.lora.rank", f"{lc.rank} exceeds the smallest dimension of the targeted projections: {target}'s "
          f"{('input', 'output')[side]}, {_LORA_DIM_NAMES[target][side]} = {width}; set model.lora.rank <= "
          f"{width}{drop}.")


# Each LoRA target's (input, output) width as words, for the rank check's message.
_LORA_DIM_NAMES = {"q_proj": ("hidden", "heads×head_dim"), "k_proj": ("hidden", "kv_heads×head_dim"),
                   "v_proj": ("hidden", "kv_heads×head_dim"), "o_proj": ("heads×head_dim", "hidden"),
                   "gate_proj": ("hidden", "inter"), "up_proj": ("hidden", "inter"), "down_proj": ("inter", "hidden")}


def lora_dims(mc) -> dict[str, tuple[int, int]]:
  """(input, output) width of each projection LoRA can target, as its adapter sees it (A is [in, r], B [r, out]):
  a k/v projection's output (kv_heads × head_dim under GQA) can be far below the hidden size."""
  head_dim = mc.head_dim or mc.hidden // mc.heads
  q, kv = mc.heads * head_dim, mc.kv_heads * head_dim
  return {"q_proj": (mc.hidden, q), "k_proj": (mc.hidden, kv), "v_proj": (mc.hidden, kv), "o_proj": (q, mc.hidden),
          "gate_proj": (mc.hidden, mc.inter), "up_proj": (mc.hidden, mc.inter), "down_proj": (mc.inter, mc.hidden)}


# The devices the input checks check a job for: this process's, unless a command is checked to run elsewhere
# (`sweep --mode=print` with a launcher): then (device count, bytes per device or None = unknown).
_ELSEWHERE: list[tuple[int, int | None]] = []


@contextlib.contextmanager
def elsewhere(devices: int, hbm_bytes: int | None = None) -> Iterator[None]:
  """The input checks inside are for a job that runs on `devices` devices of `hbm_bytes` each (None: unknown, so
  the fit checks are the launched run's own preflight), not on this process's."""
  _ELSEWHERE.append((int(devices), hbm_bytes))
  try:
    yield
  finally:
    _ELSEWHERE.pop()


def device_count() -> int:
  """The devices the input checks check a job for (elsewhere(), else this process's)."""
  import jax  # pylint: disable=g-import-not-at-top
  return _ELSEWHERE[-1][0] if _ELSEWHERE else jax.device_count()


def device_memory() -> int | None:
  """Bytes per device the input checks plan against (elsewhere(): as given, maybe None = unknown)."""
  return _ELSEWHERE[-1][1] if _ELSEWHERE else decode_layout.device_memory_bytes()


def validate_mesh(c, num_devices: int) -> dict[str, int]:
  try:
    return sharding.mesh_shape(c.mesh, num_devices)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def validate_rl(c, num_devices: int, tokenizer: Any | None = None,
                step_terms: tuple[str, ...] = ("process", "env")) -> None:
  """Everything the one-graph RL step needs, checked on plain Python values. `step_terms`: the reward terms that
  score steps, which rl.process_weight reads (the toy task of the training tables names its own: digits.TOY_STEP_TERMS)."""
  validate_model(c)
  _choice(c, "job", JOBS)
  _task(c, "task_class", "no text examples for")
  _choice(c, "task.language", LANGUAGES)
  if "prompt_format" in c.task:
    _choice(c, "task.prompt_format", ("r1_zero", "chat"))  # tasks/prompts.py FORMATS
  bad_preset = presets.check(c)
  if bad_preset:
    raise ConfigError(bad_preset)
  _choice(c, "rl.advantage", ADVANTAGES)
  _choice(c, "rl.reward_norm", REWARD_NORMS)
  _choice(c, "rl.ratio_level", RATIO_LEVELS)
  _choice(c, "rl.kl_estimator", KL_ESTIMATORS)
  _choice(c, "rl.kl_in", KL_IN)
  _choice(c, "rl.loss_agg", LOSS_AGG)
  _choice(c, "ppo.critic", CRITICS)
  for k in ("rl.G", "rl.prompts_per_step", "rl.mu", "sampling.max_new_tokens",
            "task.prompt_len", "train.steps", "train.log_every", "train.eval_every", "train.ckpt_every",
            "train.keep_checkpoints", "eval.size", "eval.batch", "eval.n_samples", "rl.oversample",
            "rl.max_nonfinite_in_row"):
    _positive_int(c, k)
  tb = c.rl.train_buckets
  if not integer(tb) or tb < 0:
    _fail("rl.train_buckets", f"must be an integer >= 1 (static training lengths L, L/2, ...) or 0 (auto), got {tb!r}.")
  _exit_chunk(c)
  for k in ("rl.eps_low", "rl.eps_high", "rl.beta", "rl.std_eps", "rl.dual_clip", "rl.kl_clamp", "rl.entropy_coef",
            "sampling.temperature", "rl.process_weight",
            "rl.reward_timeout_s", "optim.warmup_steps", "ppo.value_clip", "ppo.vf_coef"):
    _nonneg(c, k)
  learning_rate(c, "optim.lr")
  if c.rl.algo in presets.CRITIC_ALGOS:
    learning_rate(c, "ppo.critic_lr")
  fallback(c, "rl.reward_fallback")
  if c.rl.reward_timeout_s == 0:
    _fail("rl.reward_timeout_s", "must be > 0: the seconds a Python reward call may take before the step fails "
          "(or uses rl.reward_fallback).")
  if c.sampling.temperature == 0:
    _fail("sampling.temperature", "must be > 0 for RL (π = softmax(logits / temperature)); use greedy only in eval.")
  temperature(c, "sampling.temperature")
  _prob(c, "sampling.top_p", low_open=True)
  _prob(c, "rl.overlong_frac")
  _prob(c, "rl.random_reward_rate")
  validate_optim(c)
  _prob(c, "ppo.lam")
  _prob(c, "ppo.gamma")
  if not integer(c.sampling.top_k) or c.sampling.top_k < 0 or c.sampling.top_k > c.model.vocab_size:
    _fail("sampling.top_k", f"must be an integer in [0, vocab_size={c.model.vocab_size}] (0 = off), "
          f"got {c.sampling.top_k!r}.")
  if not integer(c.rl.std_ddof) or c.rl.std_ddof not in (0, 1):
    _fail("rl.std_ddof", f"must be 0 (population std) or 1 (sample std), got {c.rl.std_ddof!r}.")
  validate_algorithm(c)
  validate_correction(c)
  validate_objective(c)
  validate_ref_reset(c)
  if c.rl.dynamic_sampling and c.rl.oversample < 2:
    _fail("rl.oversample", "dynamic sampling needs rl.oversample >= 2 (sample more groups than it keeps).")
  if c.rl.eps_low > 1:
    _fail("rl.eps_low", f"must be <= 1 (the ratio is clipped at 1 - eps_low >= 0; 1 = no lower bound, as CISPO "
          f"sets it), got {c.rl.eps_low}.")
  mesh = validate_mesh(c, num_devices)
  validate_decode_layout(c, mesh)
  rows = c.rl.prompts_per_step * c.rl.G * (c.rl.oversample if c.rl.dynamic_sampling else 1)
  data_par = mesh["data"] * mesh["fsdp"]
  if (c.rl.prompts_per_step * c.rl.G) % data_par or rows % data_par:
    _fail("rl.prompts_per_step", f"prompts_per_step*G={c.rl.prompts_per_step * c.rl.G} rows must be divisible by "
          f"mesh data*fsdp={data_par}; change prompts_per_step or the mesh.")
  validate_row_splits(c, c.rl.prompts_per_step * c.rl.G, data_par)
  validate_partial(c, data_par)
  if c.rl.get("partial_rollouts", False):  # the carry's slots serve its whole table of (1 + max_staleness) batches
    validate_engine(c, rows * (1 + c.rl.max_staleness), data_par,
                    "the partial-rollout carry's table: (1 + rl.max_staleness)*prompts_per_step*G")
  else:
    validate_engine(c, rows, data_par)
  validate_eval(c, data_par)
  validate_packing(c, _decode_length(c))
  reward_terms("rewards", c.rewards)  # before the checks below unpack its entries
  # weighted: a weight-0 term's steps are all 0 (an R1 stage logs 'env' at weight 0 with tools.env)
  if c.rl.process_weight > 0 and not set(step_terms) & {n for n, w in c.rewards if float(w) != 0}:
    terms = " or ".join(repr(t) + (" with tools.env" if t == "env" else "") for t in step_terms)
    _fail("rl.process_weight", f"is > 0 but config.rewards weights no term with steps ({terms}); add "
          f"('{step_terms[0]}', w) or set 0.")
  if tokenizer is not None:
    validate_tokenizer(c, tokenizer)
  validate_tools_rl(c)


def validate_tools_rl(c) -> None:
  """An RL step with an environment (tools.env): the continuous engine (or the rollout carry, which runs it too);
  the 'env' reward term only with one."""
  env = c.get("tools") is not None and c.tools.env
  if not env:
    if "env" in [n for n, _ in c.rewards]:
      _fail("rewards", "names the 'env' term (the environment's rewards) but tools.env is ''; set tools.env or "
            "drop ('env', w).")
    return
  if c.sampling.engine not in ("continuous", "auto"):  # auto picks continuous for it (rl/auto.py)
    _fail("tools.env", f"{c.tools.env!r}: rows pause for the environment in the continuous engine's slots; set "
          f"sampling.engine='continuous' (it is {c.sampling.engine!r}).")
  if c.tools.fallback_reward != 0 and not any(n == "env" and w != 0 for n, w in c.rewards):
    # a fallback step's reward is an environment reward: without the term (or at weight 0, as the R1 stages log it)
    # it was dropped without a word
    _fail("tools.fallback_reward", f"{c.tools.fallback_reward!r} reaches training only through the 'env' reward "
          "term (the environment's rewards), which config.rewards does not weight; add ('env', 1.0) to "
          "config.rewards or set tools.fallback_reward=0.0.")


def _warn(fmt: str, *args) -> None:
  """logging.warning, once per message within a command (config_lib.first_time: preflight and each stage's set-up
  check the same config; one problem is one line)."""
  message = fmt % args
  if config_lib.first_time(message):
    logging.warning("%s", message)


def _changed(d: dict, base: dict, prefix: str) -> list[str]:
  """'key=value' for each leaf of `d` the user set (config_lib.set_by_user: a command's overrides, else away from
  `base`, a group of the base config), dotted from `prefix`."""
  out = []
  for k, v in d.items():
    b = base.get(k)
    if isinstance(v, dict) and isinstance(b, dict):
      out += _changed(v, b, f"{prefix}.{k}")
    elif config_lib.set_by_user(f"{prefix}.{k}", v, b):
      out.append(f"{prefix}.{k}={v!r}")
  return out


MAX_TOOL_WORKERS = 1024
MAX_SANDBOX_S = 86_400
SANDBOX_MARGIN_S = 1.0  # tools.timeout_s - tools.sandbox.time_s at least: a python call's start and clean-up


def validate_tools(c, tokenizer=None) -> None:
  """The `tools` group, checked whenever a config uses it (tools.env set, or r1.pretrain.tool_frac > 0): the
  environment imports and builds, each stop marker is one token of the tokenizer, the limits are positive."""
  t = c.get("tools")
  if t is None or not (t.env or c.r1.pretrain.get("tool_frac", 0.0) > 0):
    if t is not None:  # set for a tool run, meaning nothing without one: said, not silently dropped
      unused = _changed(t.to_dict(), config_lib.defaults().tools.to_dict(), "tools")
      if unused:
        _warn("%s: no effect with tools.env='' (single-turn rollouts, no tool data); set tools.env to use "
              "%s.", ", ".join(unused), "it" if len(unused) == 1 else "them")
    return
  _choice(c, "tools.format", tuple(env_formats.FORMATS))
  v = t.max_turns
  if not integer(v) or v < 1:
    _fail("tools.max_turns", f"must be an integer >= 1 (environment calls a row may make), got {v!r}; set 1 or "
          "more, or tools.env='' for single-turn rollouts.")
  for k in ("tools.max_obs_tokens", "tools.workers", "tools.chunk", "tools.sandbox.memory_mb",
            "tools.sandbox.file_mb", "tools.sandbox.output_chars"):
    _positive_int(c, k)
  if t.workers > MAX_TOOL_WORKERS:  # one thread each, started with the run: 100,000 hit the OS's thread limit
    _fail("tools.workers", f"{t.workers} threads is more than {MAX_TOOL_WORKERS}; steps beyond a call's paused rows "
          f"never run at once anyway: set at most {MAX_TOOL_WORKERS}.")
  for k in ("tools.timeout_s", "tools.sandbox.time_s"):
    _nonneg(c, k)
    if _get(c, k) == 0:
      _fail(k, "must be > 0 (seconds a call may take).")
  if t.sandbox.time_s > MAX_SANDBOX_S:  # the child's alarm and CPU limit take a C int: every call failed past it
    _fail("tools.sandbox.time_s", f"{t.sandbox.time_s:g} s is more than {MAX_SANDBOX_S} (a day per tool call); set "
          "at most that.")
  if t.env == "python" and t.sandbox.time_s + SANDBOX_MARGIN_S > t.timeout_s:
    # the sandbox kills a call at time_s and answers 'timed out' (the row goes on); a step still running at
    # tools.timeout_s is abandoned instead: the row's fallback, and MAX_HUNG of them at once stopped the run
    _fail("tools.sandbox.time_s", f"{t.sandbox.time_s:g} s leaves less than {SANDBOX_MARGIN_S:g} s (the child's start "
          f"and clean-up) below tools.timeout_s={t.timeout_s:g}: a call that runs to its limit would be abandoned as "
          "a failed step instead of answered 'timed out'; lower tools.sandbox.time_s or raise tools.timeout_s.")
  if t.max_obs_tokens > c.model.max_len:  # buffers [slots, O]: 10**9 was an allocation failure (traceback)
    _fail("tools.max_obs_tokens", f"{t.max_obs_tokens} is more than model.max_len={c.model.max_len} (an "
          "observation is cut to the room left in the completion anyway); set at most that.")
  for k, most in (("memory_mb", 1 << 20), ("file_mb", 1 << 20), ("output_chars", 1_000_000)):
    # past these the child's rlimits overflow a C long, or the read buffer fails: every call's observation an error
    if t.sandbox[k] > most:
      _fail(f"tools.sandbox.{k}", f"{t.sandbox[k]} is more than {most}; set at most that.")
  fb = t.fallback_reward
  if not finite(fb):
    _fail("tools.fallback_reward", f"must be a finite number (the reward of a row whose step failed; float32: "
          f"|x| < 3.4e38), got {fb!r}.")
  if tokenizer is None:
    return
  if t.format == "qwen" and not getattr(tokenizer, "chat_template", None):
    _fail("tools.format", "'qwen' renders prompts with the tokenizer's chat template, and this tokenizer has none; "
          "use an instruct checkpoint's tokenizer (task.tokenizer=init_from) or tools.format='plain'.")
  try:
    env_formats.stop_ids(tokenizer, t.stop_markers)
    env = env_registry.make(t.env, env_batch.context(c, tokenizer)) if t.env else None
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  if t.format == "qwen" and env is not None:
    validate_qwen_prompts(c, tokenizer, env)
  # the observation's own markers take room in every observation: a cut keeps the closing one when it fits, so with
  # tools.max_obs_tokens at or under them no tool output is ever appended (the model reads empty turns; under
  # 'plain' at 2 or 3 one marker alone: a response opened and never closed, or closed and never opened)
  fmt = env_formats.get(t.format)
  frame = fmt.frame(tokenizer)
  if env is not None and t.max_obs_tokens <= frame:
    wraps = "its tool-response turn" if t.format == "qwen" else f"'{fmt.observation('')}'"
    _fail("tools.max_obs_tokens", f"{t.max_obs_tokens} leaves no room for a tool's output: {t.format!r} wraps each "
          f"in {wraps}, whose markers take {frame} tokens of this tokenizer; raise it to at least {frame} + the "
          f"outputs' length (e.g. {frame + 32}).")
  if isinstance(env, env_base.ToolEnv) and env_formats.CALL_CLOSE not in t.stop_markers:
    # a row pauses only on a stop marker: without the call's closing one no call ever reached the tool
    _fail("tools.stop_markers", f"{tuple(t.stop_markers)!r} lacks {env_formats.CALL_CLOSE!r}: rows pause only on "
          f"a stop marker, so no tool call would reach {t.env!r}; add it, e.g. ('{env_formats.CALL_CLOSE}',).")


def validate_qwen_prompts(c, tokenizer, env) -> None:
  """tools.format='qwen' with an environment: prompts (RL batches and held-out alike) are the chat template listing
  the environment's tools, observations Qwen's tool-response turns: the prompt format is 'chat', the tokenizer has
  the turn markers as single tokens, the environment offers tools, and the template renders them."""
  fmt = c.task.get("prompt_format", "r1_zero")
  if fmt != "chat":
    _fail("task.prompt_format", f"{fmt!r}: tools.format='qwen' asks in the chat template, with the environment's "
          "tools listed in it; set task.prompt_format='chat' (or tools.format='plain').")
  for marker in env_formats.Qwen.control:
    ids = tokenizer.encode(marker)
    if len(ids) != 1:
      _fail("tools.format", f"'qwen' writes {marker} as one control token (each observation's turn markers), but "
            f"this tokenizer encodes it as {len(ids)} pieces; use a Qwen2/2.5 instruct tokenizer (task.tokenizer="
            "init_from) or tools.format='plain'.")
  tools = env_formats.env_tools(env)
  bad = [x for x in tools if not isinstance(x, env_formats.Tool)]
  if not tools or bad:
    _fail("tools.env", f"{c.tools.env!r} offers {'no tools' if not tools else f'{type(bad[0]).__name__} as a tool'}; "
          "tools.format='qwen' lists the environment's tools in the prompt: give it a `tool` (envs.base.ToolEnv) "
          "or a `tools` tuple of envs.formats.Tool, or use tools.format='plain'.")
  probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
  try:
    text = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tools=[x.schema() for x in tools])
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None
  if f'"name": {json.dumps(tools[0].name)}' not in text:
    _fail("tools.format", "'qwen' lists the environment's tools in the chat template, but this tokenizer's "
          "template does not render `tools` (Qwen2.5-Instruct's does); use an instruct tokenizer whose template "
          "has tools, or tools.format='plain'.")


def validate_row_splits(c, n_rows: int, data_par: int) -> None:
  """rl.minibatches / rl.rollout_chunks: 0 (auto: rl/auto.py picks the fewest that fit the device), or a count
  that cuts the rows into equal parts, each divisible by the mesh's row split."""
  for k in ("rl.minibatches", "rl.rollout_chunks"):
    v = _get(c, k)
    if not integer(v) or v < 0:
      _fail(k, f"must be a positive integer, or 0 (auto: the fewest that fit the device), got {v!r}.")
  m, chunks = c.rl.minibatches, c.rl.rollout_chunks
  if m and n_rows % m:
    _fail("rl.minibatches", f"{m} must divide prompts_per_step*G={n_rows}; use a divisor of {n_rows // data_par}, "
          "or 0 (auto).")
  if m and (n_rows // m) % data_par:
    _fail("rl.minibatches", f"minibatch size {n_rows // m} must be divisible by mesh data*fsdp={data_par}; use "
          "fewer minibatches, or 0 (auto).")
  if chunks and (n_rows % chunks or (n_rows // chunks) % data_par):
    _fail("rl.rollout_chunks", f"{chunks} must split prompts_per_step*G={n_rows} rollout rows into equal chunks "
          f"divisible by mesh data*fsdp={data_par}; use a divisor of {n_rows // data_par}, or 0 (auto).")


def validate_decode_layout(c, mesh: dict[str, int]) -> None:
  """sampling.decode_layout / decode_tp (decode_layout.py): a known layout, and a TP degree this model and mesh
  can decode with."""
  _choice(c, "sampling.decode_layout", decode_layout.KINDS)
  tp = c.sampling.decode_tp
  if not integer(tp) or tp < 0:
    _fail("sampling.decode_tp", f"must be an integer >= 0 (0 = the smallest that fits), got {tp!r}.")
  if tp and c.sampling.decode_layout in ("auto", "tp"):
    bad = decode_layout.check(model_config.ModelConfig.from_config(c.model), mesh, decode_layout.Layout("tp", tp))
    if bad:
      raise ConfigError(f"config.{bad}; or set sampling.decode_tp=0 (the smallest that fits).")
  if c.sampling.decode_layout == "tp" and not tp and not decode_layout.tp_degrees(
      model_config.ModelConfig.from_config(c.model), mesh):
    _fail("sampling.decode_layout", f"'tp' splits the weights over mesh.fsdp={mesh.get('fsdp', 1)} devices, but no "
          "degree >= 2 divides it and the model's heads; set 'gathered' (the weights whole on every device), "
          "'fsdp' or 'auto'.")


def _decode_length(c, why: str = "") -> int:
  """task.prompt_len + sampling.max_new_tokens, the positions a decode writes, within model.max_len (the RL rollout,
  an evaluation: `why` says which). -> the total."""
  total = c.task.prompt_len + c.sampling.max_new_tokens
  if total > c.model.max_len:
    _fail("sampling.max_new_tokens", f"task.prompt_len + sampling.max_new_tokens = {total} exceeds "
          f"model.max_len={c.model.max_len}{why}; shorten them or raise model.max_len.")
  return total


def _exit_chunk(c) -> None:
  chunk = c.sampling.exit_chunk
  if not integer(chunk) or chunk < -1:
    _fail("sampling.exit_chunk", f"must be an integer >= 0 (decode steps between early-exit checks; 0 = none) or -1 "
          f"(auto), got {chunk!r}.")


def validate_eval_decode(c, mesh: dict[str, int]) -> None:
  """The sampling keys a held-out evaluation decodes with (run/evaluation.py, planned by auto.resolve_eval), for a
  job whose only decode is its evaluation (job=sft, preflight.check and train.run_sft; validate_rl checks them for
  an RL run): unchecked there, a bad value (an unknown engine, a negative exit chunk, temperature 0, P + L past
  model.max_len) failed or decoded wrongly only after the whole SFT had trained."""
  _positive_int(c, "sampling.max_new_tokens")
  _decode_length(c, " (the held-out evaluation decodes that far)")
  t = c.sampling.temperature
  if not finite(t) or t <= 0:
    _fail("sampling.temperature", f"must be > 0: the evaluation's sampled pass (pass@k, cons@k) draws from "
          f"softmax(logits / temperature), got {t!r}.")
  temperature(c, "sampling.temperature")
  _exit_chunk(c)
  validate_decode_layout(c, mesh)
  _decode_keys(c)


def validate_engine(c, rows: int, data_par: int,
                    what: str = "prompts_per_step*G, times rl.oversample under dynamic sampling") -> None:
  """sampling.engine / slots / compaction (rollout/engine.py): a known engine, slots that fit the rows (`what`: how
  they are counted) and the mesh's row split (every compaction size is a multiple of it: engine.compaction_sizes)."""
  slots = c.sampling.get("slots", 0)
  if not integer(slots) or slots < 0:
    _fail("sampling.slots", f"must be an integer >= 0 (0 = auto: rl/auto.py's choice), got {slots!r}.")
  if slots > rows:
    _fail("sampling.slots", f"{slots} exceeds the {rows} rollout rows ({what}); use at most that, or 0.")
  if slots % data_par:
    _fail("sampling.slots", f"{slots} must be divisible by mesh data*fsdp={data_par} (each device decodes its "
          "share of the slots); use a multiple of it, or 0.")
  _decode_keys(c)


def _decode_keys(c) -> None:
  """sampling.engine, compaction, decode_attention, page_size: what any decode reads (the RL rollout, an
  evaluation)."""
  _choice(c, "sampling.engine", ENGINES)
  levels = c.sampling.get("compaction", 0)
  if not integer(levels) or levels < 0:
    _fail("sampling.compaction", f"must be an integer >= 1 (slot counts S, S/2, ...; 1 = none) or 0 (auto), got "
          f"{levels!r}.")
  attn = c.sampling.get("decode_attention", "auto")
  _choice(c, "sampling.decode_attention", paged_attention.CHOICES)
  _positive_int(c, "sampling.page_size")
  if attn in ("paged", "tpu_ragged") and c.sampling.engine == "static":
    _fail("sampling.decode_attention", f"{attn!r} is the continuous engine's paged KV store; set "
          "sampling.engine='continuous' (or 'auto', which then picks it), or decode_attention='auto'.")
  if attn == "tpu_ragged":  # the kernel's shape limits, before anything is compiled (auto falls back instead)
    m = model_config.ModelConfig.from_config(c.model)
    bad = paged_attention.tpu_unsupported(m.head_dim, m.kv_heads, c.sampling.page_size, m.dtype)
    if bad:
      raise ConfigError(f"config.{bad}; set sampling.decode_attention='auto' (the plain-JAX path where the kernel "
                        "does not fit) or 'plain'.")


CARRY_KNOBS = ("max_staleness", "rollout_budget", "carry_kv", "staleness_policy", "carry_kv_groups")  # rl.*


def validate_partial(c, data_par: int) -> None:
  """rl.partial_rollouts and its knobs (rollout/carry.py): what the carry needs, and what it cannot run with."""
  rl = c.rl
  for k, what in (("rl.max_staleness", "updates a trained token may lag; 0 = synchronous"),
                  ("rl.rollout_budget", "decode steps per step, >= 1, or 0 = auto"),
                  ("rl.carry_kv_groups", "groups of slots reading the KV, >= 1, or 0 = auto")):
    v = _get(c, k)
    if not integer(v) or v < 0:
      _fail(k, f"must be an integer >= 0 ({what}), got {v!r}.")
    if v >= 2 ** 31:  # the carry counts in int32
      _fail(k, f"{v} is past 2**31 - 1 ({what}); set a smaller value.")
  _choice(c, "rl.carry_kv", ("keep", "recompute"))
  _choice(c, "rl.staleness_policy", ("wait", "mask"))
  if not rl.partial_rollouts:  # the carry's knobs mean nothing to the synchronous step: said, not silently dropped
    base = config_lib.defaults().rl
    unused = [f"rl.{k}={rl[k]!r}" for k in CARRY_KNOBS
              if config_lib.set_by_user(f"rl.{k}", rl.get(k, base[k]), base[k])]
    if unused:
      _warn("%s: no effect with rl.partial_rollouts=False (the synchronous step carries no rows); set "
            "rl.partial_rollouts=True to use %s.", ", ".join(unused), "it" if len(unused) == 1 else "them")
    return
  if c.sampling.get("compaction", 0) not in (0, 1):
    _warn("sampling.compaction=%r: no effect with rl.partial_rollouts on the training rollout (the carry "
          "decodes on its fixed sampling.slots, never fewer); only the held-out evaluation's continuous "
          "engine compacts; set it to 0 or 1 unless that is meant.", c.sampling.compaction)
  if c.sampling.engine not in ("continuous", "auto"):  # auto resolves to continuous under partial rollouts
    _fail("rl.partial_rollouts", "carries rows in the continuous engine's slots; set sampling.engine='continuous' "
          f"or 'auto' (it is {c.sampling.engine!r}).")
  if presets.carry_refusal(rl.algo):
    _fail("rl.partial_rollouts", presets.carry_refusal(rl.algo))
  if rl.dynamic_sampling:
    _fail("rl.partial_rollouts", "with rl.dynamic_sampling: DAPO's oversampling keeps B of oversample·B groups per "
          "step, the carry trains the B oldest complete ones; set one of them off.")
  if c.sampling.get("decode_attention", "auto") in ("paged", "tpu_ragged"):
    _fail("sampling.decode_attention", "the rollout carry keeps its KV in the plain layout (a [groups, P] prompt "
          "buffer + one [slots, L] buffer per slot); set decode_attention='plain' or 'auto'.")
  if c.sampling.decode_layout == "tp":
    _fail("sampling.decode_layout", "'tp' repeats KV heads per decode group, which the carry's KV (kept in the "
          "state between steps) does not; use 'gathered', 'fsdp' or 'auto'.")
  if rl.prompts_per_step % data_par:
    _fail("rl.prompts_per_step", f"{rl.prompts_per_step} must be divisible by mesh data*fsdp={data_par} with "
          "rl.partial_rollouts (each device trains whole groups of its own).")


# The thresholds each rl.rollout_correction kind reads (rl/correction.py `weights`); rl.* keys.
CORRECTION_KNOBS = {"none": (), "tis": ("is_cap",), "mis": ("mis_lo", "mis_hi"),
                    "icepop": ("icepop_lo", "icepop_hi"), "seq_mask": ("seq_mask_lo", "seq_mask_hi", "is_veto")}


def validate_correction(c) -> None:
  """rl.rollout_correction and its thresholds (rl/correction.py), sampling.dtype: every threshold is checked,
  whichever kind is chosen, so a bad value cannot wait for the day its kind is switched on; one set away from its
  default while the chosen kind does not read it is said (it changed nothing)."""
  _choice(c, "rl.rollout_correction", correction.KINDS)
  kind, base = c.rl.rollout_correction, config_lib.defaults().rl
  unused = [(f"rl.{k}={c.rl[k]!r}", other) for other, knobs in CORRECTION_KNOBS.items() if other != kind
            for k in knobs if k in c.rl and config_lib.set_by_user(f"rl.{k}", c.rl[k], base[k])]
  if unused:
    _warn("%s: no effect with rl.rollout_correction=%r (it reads %s); set rl.rollout_correction to %s to "
          "use %s.", ", ".join(k for k, _ in unused), kind,
          ", ".join(f"rl.{k}" for k in CORRECTION_KNOBS[kind]) or "no threshold",
          " or ".join(dict.fromkeys(repr(o) for _, o in unused)), "it" if len(unused) == 1 else "them")
  _choice(c, "sampling.dtype", ("",) + DTYPES)
  if c.sampling.dtype == "float32" and c.model.attention == "cudnn":
    _fail("sampling.dtype", "'float32' with model.attention='cudnn' (cuDNN attention has no float32 kernel); set "
          "sampling.dtype='' or model.attention=auto.")
  cap = positive_finite(c, "rl.is_cap", "tis truncates the weight at it: w = min(rho, is_cap)")
  if cap < 1:  # as the windows below must hold rho = 1: a cap under it would scale every on-policy token down
    _fail("rl.is_cap", f"{cap} is below 1: tis would weigh every on-policy token (rho = 1) by min(1, is_cap) = {cap}; "
          "set it >= 1 (TIS's C is 2).")
  windows = (("mis", "the window of rho that mis keeps"), ("icepop", "IcePop's [alpha, beta]"),
             ("seq_mask", "the window of the geometric-mean rho that seq_mask keeps"))
  for name, what in windows:
    lo_key, hi_key = f"rl.{name}_lo", f"rl.{name}_hi"
    lo, hi = _get(c, lo_key), _get(c, hi_key)
    if not finite(lo) or lo < 0:
      _fail(lo_key, f"must be a finite number >= 0 (the lower end of {what}), got {lo!r}.")
    positive_finite(c, hi_key, f"the upper end of {what}")
    if not lo < 1 < hi:
      _fail(lo_key, f"{lo} and {hi_key}={hi} must satisfy {lo_key} < 1 < {hi_key} ({what}; a window without "
            "rho = 1 would drop every on-policy token); put them in that order around 1.")
  v = c.rl.is_veto
  if not finite(v) or not 0 <= v < 1:
    _fail("rl.is_veto", f"must be in [0, 1) (seq_mask drops a row with a token of rho below it; 0 = off), got {v!r}.")


# The rl.* knobs each rl.objective / rl.token_select reads (losses._objective, token_select.choose); a knob of
# another one that the user set changes nothing (e.g. rl.eps_high under sapo, whose gate replaces the clip).
OBJECTIVE_KNOBS = {"clip": ("eps_low", "eps_high", "dual_clip"), "cispo": ("eps_low", "eps_high"),
                   "sapo": ("sapo_tau_pos", "sapo_tau_neg")}
SELECT_KNOBS = {"all": (), "top_entropy": ("select_frac",),
                "clip_cov": ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"), "kl_cov": ("kl_cov_ratio", "kl_cov_coef")}


def _unread_knobs(c, key: str, knobs: dict) -> None:
  """One warning naming the knobs of `knobs` (per value of rl.<key>) that the user set and the chosen value does not
  read: as validate_correction says of the correction kinds' thresholds (they changed nothing, silently). A knob
  at its preset's value (rl.preset: every preset sets every rl.* key) or, unset by the preset, at the base config's
  is not named: a preset applied whole through its overrides (an ablation variant, a sweep point) set it, no user."""
  chosen, base = c.rl[key], config_lib.defaults().rl
  preset = presets.PRESETS.get(c.rl.get("preset", ""), {})
  reads = set(knobs[chosen])
  unused = [k for k in dict.fromkeys(k for ks in knobs.values() for k in ks)
            if k not in reads and k in c.rl and config_lib.set_by_user(f"rl.{k}", c.rl[k], base[k])
            and c.rl[k] != preset.get(f"rl.{k}", base[k])]
  if unused:
    readers = dict.fromkeys(repr(o) for k in unused for o, ks in knobs.items() if k in ks)
    _warn("%s: no effect with rl.%s=%r (it reads %s); set rl.%s to %s to use %s.",
          ", ".join(f"rl.{k}={c.rl[k]!r}" for k in unused), key, chosen,
          ", ".join(f"rl.{k}" for k in knobs[chosen]) or "no such knob", key, " or ".join(readers),
          "it" if len(unused) == 1 else "them")


SAPO_TAU_MIN = 1e-6


def validate_objective(c) -> None:
  """rl.objective and its temperatures, rl.token_select and its parameters (losses.py, rl/token_select.py); a knob
  the user set that the chosen objective or selection does not read is said (it changed nothing)."""
  _choice(c, "rl.objective", losses.OBJECTIVES)
  if c.rl.objective != "clip" and c.rl.ratio_level != "token":
    _fail("rl.ratio_level", f"'{c.rl.ratio_level}' (GSPO's sequence ratio) is an option of the 'clip' objective, not "
          f"of rl.objective='{c.rl.objective}'; set rl.ratio_level='token'.")
  for k in ("rl.sapo_tau_pos", "rl.sapo_tau_neg"):
    tau = positive_finite(c, k, "the SAPO gate's temperature: (4/tau)·sigmoid(tau·(ratio - 1))")
    # At tau = 1e-6 the gate is already flat: a token's gradient weight 4σ(1 − σ) of x = tau·(ratio − 1) is
    # 1 − x²/4, within 3e-11 of 1 for any ratio up to 10 (the unclipped ratio objective). A smaller tau changes no
    # gradient and only pushes (4/tau)·gate·A toward float32's overflow: 4/tau alone is inf below ~1.2e-38, a token
    # sum of ~2·A/tau sooner (NaN steps).
    if tau < SAPO_TAU_MIN:
      _fail(k, f"{tau!r} is below {SAPO_TAU_MIN:g}, where the SAPO gate is already flat (every ratio's gradient "
            f"weight within 3e-11 of 1); smaller values change no gradient and push (4/tau)·sigmoid(tau·(ratio - 1))"
            f"·A toward float32's overflow (NaN steps); set {k} >= {SAPO_TAU_MIN:g}.")
  _choice(c, "rl.token_select", token_select.KINDS)
  for k, what in (("rl.select_frac", "the share of tokens top_entropy keeps"),
                  ("rl.clip_cov_ratio", "the share of tokens Clip-Cov cuts"),
                  ("rl.kl_cov_ratio", "the share of tokens KL-Cov penalises")):
    v = _get(c, k)
    if not finite(v) or not 0 < v <= 1:
      _fail(k, f"must be a fraction in (0, 1] ({what}), got {v!r}.")
  lb, ub = c.rl.clip_cov_lb, c.rl.clip_cov_ub
  if not all(finite(v) for v in (lb, ub)) or not lb < ub:
    _fail("rl.clip_cov_lb", f"{lb!r} and rl.clip_cov_ub={ub!r} must be finite with rl.clip_cov_lb < rl.clip_cov_ub "
          "(Clip-Cov's covariance range); put them in order.")
  _nonneg(c, "rl.kl_cov_coef")
  _unread_knobs(c, "objective", OBJECTIVE_KNOBS)
  _unread_knobs(c, "token_select", SELECT_KNOBS)
  if c.rl.token_select == "kl_cov" and c.rl.kl_cov_coef == 0:
    _warn("rl.token_select='kl_cov' with rl.kl_cov_coef=0: the penalty on the tokens it picks is 0, so the loss is "
          "rl.objective's alone (only train/select_* are logged); set rl.kl_cov_coef > 0 (verl's 1) or "
          "rl.token_select='all'.")
  kl_cov_inert(c)  # (minibatches 0 is auto: said by the run's LoopGuard.resolve once it resolves to 1)
  if c.rl.token_select != "all" and config_lib.switch(c.rl.packing) == "on":
    _fail("rl.token_select", f"'{c.rl.token_select}' ranks the tokens of the whole minibatch, but rl.packing hands "
          "the objective one packed micro-batch at a time; set rl.packing='off' (or 'auto') or rl.token_select='all'.")


def kl_cov_inert(c) -> None:
  """rl.token_select='kl_cov' where every update is on-policy (rl.mu 1, one minibatch): its penalty acts through
  log pi - log pi_old, 0 there; said on the config as given and on the resolved one (rl.minibatches auto -> 1)."""
  if c.rl.token_select == "kl_cov" and c.rl.mu == 1 and c.rl.minibatches == 1:
    _warn("rl.token_select='kl_cov' penalises |log pi - log pi_old|, which is 0 with a zero gradient on every update "
          "of this run (rl.mu=1, rl.minibatches=1: each update is on-policy, the ratio exactly 1), so the run trains "
          "as rl.objective alone; set rl.mu >= 2 or rl.minibatches >= 2 for KL-Cov to act.")


def validate_ref_reset(c) -> None:
  """rl.ref_reset_every (rl_step.reference_reset): an integer >= 0; on, it needs a reference copy to reset."""
  v = c.rl.get("ref_reset_every", 0)
  if not integer(v) or v < 0:
    _fail("rl.ref_reset_every", f"must be an integer >= 0 (updates between reference resets; 0 = off), got {v!r}.")
  if v == 0:
    return
  if finite(c.rl.beta) and c.rl.beta == 0:
    _fail("rl.ref_reset_every", f"is {v} but rl.beta = 0 keeps no reference to reset; set rl.beta > 0 (ProRL's KL "
          "to a reset reference) or rl.ref_reset_every=0.")
  if c.model.lora.rank > 0:
    _fail("rl.ref_reset_every", f"is {v} but under LoRA (model.lora.rank={c.model.lora.rank}) the reference is the "
          "frozen base itself, which cannot move; set rl.ref_reset_every=0 or train all weights.")


def validate_algorithm(c) -> None:
  """The algorithm settings (presets.SETTINGS) fit together: each check names the setting that cannot work."""
  rl = c.rl
  if (rl.algo in presets.CRITIC_ALGOS) != (rl.advantage == "gae"):
    _fail("rl.advantage", f"is {rl.advantage!r} with algo={rl.algo!r}: GAE needs PPO's critic and PPO estimates "
          "with GAE; use the ppo preset (algo=ppo) for GAE, another estimator otherwise.")
  if rl.advantage in GROUP_ADVANTAGES and rl.G < 2:
    _fail("rl.G", f"is {rl.G} but the {rl.advantage} advantage needs a group of at least 2 samples per prompt; "
          "set rl.G >= 2.")
  if rl.advantage in KL_IN_REWARD_ADVANTAGES and rl.kl_in != "reward":
    _fail("rl.kl_in", f"the {rl.advantage} advantage folds the KL into the per-token reward by definition; set "
          "rl.kl_in='reward'.")
  if rl.dual_clip != 0 and rl.dual_clip <= 1:
    _fail("rl.dual_clip", f"must be 0 (off) or > 1 (the loss of a negative advantage is bounded at dual_clip·|A|), "
          f"got {rl.dual_clip}.")
  if rl.reward_norm == "per_term":
    if rl.advantage not in OUTCOME_GROUP_ADVANTAGES:
      _fail("rl.reward_norm", f"'per_term' normalises each reward term within its group, which the {rl.advantage} "
            f"advantage does not do; use it with {list(OUTCOME_GROUP_ADVANTAGES)} or set reward_norm='sum'.")
    if rl.kl_in == "reward" and rl.beta > 0:
      _fail("rl.kl_in", "'reward' with reward_norm='per_term' would normalise the KL penalty away (it has no group "
            "scale of its own); put the KL in the loss (kl_in='loss') or use reward_norm='sum'.")
  if rl.overlong_frac > 0 and round(rl.overlong_frac * c.sampling.max_new_tokens) < 1:
    _fail("rl.overlong_frac", f"{rl.overlong_frac} of sampling.max_new_tokens={c.sampling.max_new_tokens} is less "
          "than one token; raise it or set 0 (off).")


def validate_eval(c, data_par: int, group: str = "eval") -> None:
  """An evaluation's size/batch/n_samples/pass_k: `eval`, or another group with the same keys (`r1.report`)."""
  e = _get(c, group)
  for k in ("size", "batch", "n_samples"):
    _positive_int(c, f"{group}.{k}")
  if e.batch % data_par:
    _fail(f"{group}.batch", f"{e.batch} must be divisible by mesh data*fsdp={data_par}.")
  if e.size % e.batch:
    _fail(f"{group}.size", f"{e.size} must be a multiple of {group}.batch={e.batch}.")
  if e.batch % e.n_samples:
    _fail(f"{group}.batch", f"{e.batch} must be a multiple of {group}.n_samples={e.n_samples} (prompts are "
          "repeated n_samples times inside one eval batch).")
  for k in e.pass_k:
    if not (integer(k) and 1 <= k <= e.n_samples):
      _fail(f"{group}.pass_k", f"entry {k!r} must be an integer in [1, {group}.n_samples={e.n_samples}].")
  # A generated task's test split has task.test_size examples; a dataset task's (gsm8k, math) is its files,
  # whatever test_size says: preflight counts its usable examples (check_data). An eval.size over test_size was
  # refused for a dataset whose test file holds more.
  if registry.generated(c.task.name) and e.size > c.task.test_size:
    _fail(f"{group}.size", f"{e.size} exceeds task.test_size={c.task.test_size}; lower it or raise test_size.")


def validate_tokenizer(c, tokenizer) -> None:
  if tokenizer.vocab_size != c.model.vocab_size:
    init = c.train.get("init_from", "") or c.sft.get("init_from", "")
    if init.startswith("hf:") and c.task.get("tokenizer", "") != "init_from":
      if os.path.isfile(os.path.join(init[3:], "tokenizer.json")):
        fix = (f"the model comes from {init}: use its own tokenizer, task.tokenizer=init_from (task.tokenizer is "
               f"{c.task.get('tokenizer', '')!r})")
      else:
        fix = (f"the model comes from {init}, whose own tokenizer cannot be read: "
               f"{hf_tokenizer.missing_tokenizer_json(init[3:])}; add it, or set task.tokenizer=hf:<a directory "
               "holding this model's tokenizer.json>")
    else:
      fix = f"set model.vocab_size={tokenizer.vocab_size} (or use the matching tokenizer)"
    _fail("model.vocab_size", f"is {c.model.vocab_size} but the tokenizer has {tokenizer.vocab_size} pieces; {fix}.")
  spec = registry.TASKS.get(c.task.name)
  tags = getattr(tokenizer, "tag_ids", None)  # None: a stand-in with a vocabulary size only (tests)
  missing = [t for t in tokenizer_lib.TAGS if tags is not None and t not in tags]
  if spec is not None and spec.in_graph_accuracy is not None and missing:
    # were the verifiers' tables: a traceback at the first evaluation (HF), or <unk> counted as every tag (.model)
    _fail("task.tokenizer", f"task {c.task.name!r} is verified in-graph on token ids and needs "
          f"{', '.join(tokenizer_lib.TAGS)} as single tokens, but task.tokenizer={c.task.get('tokenizer', '')!r} "
          f"lacks {', '.join(missing)}; use the shipped tokenizer (task.tokenizer='') or one built with them "
          "(python -m grpo_jax.tasks.build_tokenizer).")
  try:
    prompts.check(c.task.get("prompt_format", "r1_zero"), tokenizer)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None


MAX_SEED = 2**31


def base_types(c, base=None, prefix: str = "") -> None:
  """A key the base config declares a bool holds a bool, one it declares a number holds no bool: Python's True is
  the int 1 (top_k=True ran as top_k=1) and any non-empty string is true (partial_rollouts='False' ran the carry).
  ConfigDict refuses most such values as they are set; a config file building its own dicts, or a record, does not."""
  base = config_lib.defaults() if base is None else base
  for k, b in base.items():
    if k not in c:
      continue
    v, key = c[k], f"{prefix}{k}"
    if hasattr(b, "items"):
      if hasattr(v, "items"):
        base_types(v, b, f"{key}.")
    elif isinstance(b, bool) and not isinstance(v, (bool, np.bool_)):
      _fail(key, f"must be True or False, got {v!r} (a string such as 'False' is true in Python); set True or False.")
    elif isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(v, bool):
      kind = "an integer" if isinstance(b, int) else "a number"
      _fail(key, f"is {v!r}, a bool where {kind} is expected (Python's True is 1, False is 0); set {kind} "
            f"(default {b!r}).")


def undeclared_keys(c) -> None:
  """A key the base config does not declare is read by nothing: a config file's typo (`c.rl.select_fraction = 0.3`
  for rl.select_frac) ran with the default, unsaid, where the same typo on the command line is refused (cli.py)."""
  declared = config_lib.flat(config_lib.defaults())
  for key in sorted(config_lib.flat(c)):
    if key not in declared:
      close = config_lib.nearest_key(key)
      _fail(key, "no such key: nothing reads it (the keys: grpo_jax/config/config_lib.py)"
            f"{f'; did you mean config.{close}?' if close else '; check its spelling.'}")


def validate_groups(c) -> None:
  """Keys every job reads, whatever it runs: the counts of sft/train/log and the task's data policy (a negative
  sft.steps must not silently mean "no SFT stage")."""
  base_types(c)
  undeclared_keys(c)
  v = c.sft.steps
  if not integer(v) or v < 0:
    _fail("sft.steps", f"must be an integer >= 0 (0 = no SFT stage), got {v!r}.")
  for k in ("train.plot_every", "train.sample_every", "train.num_samples_logged"):
    v = _get(c, k)
    if not integer(v) or v < 0:
      _fail(k, f"must be an integer >= 0 (0 = off), got {v!r}.")
  for k in ("log.tensorboard", "log.plots"):
    if not isinstance(_get(c, k), bool):
      _fail(k, f"must be True or False, got {_get(c, k)!r}.")
  if not isinstance(c.log.wandb_project, str):
    _fail("log.wandb_project", f"must be a project name or '' (off), got {c.log.wandb_project!r}.")
  # JAX's PRNGKey keeps a seed's low 32 bits: seed 2**32 was seed 0's run, -7 was 2**32 - 7's; past 2**63 it raised
  # OverflowError after config.json was written. The runs add small offsets (seed + 1, + 7), hence 2**31.
  for k, unset in (("seed", None), ("run_seed", -1)):
    v = c.get(k, unset)
    if v != unset and not (integer(v) and 0 <= v < MAX_SEED):
      _fail(k, f"must be an integer in [0, 2**31){' or -1 (= seed)' if unset == -1 else ''}, got {v!r}.")
  _choice(c, "task.overlong_prompts", data.OVERLONG)
  if c.task.get("overlong_prompts") == "truncate" and c.task.get("prompt_format", "r1_zero") == "chat":
    # truncate keeps the first token and the prompt's end: a chat prompt's end is its user turn and generation cue,
    # its start the system turn and (tools.format='qwen') the tool list, which the cut would remove half-way
    _fail("task.overlong_prompts", "'truncate' with task.prompt_format='chat' would cut the chat template's system "
          "turn (and its tool list) out of the prompt, keeping a stray first token; use 'drop' (skip them, counted) "
          "or raise task.prompt_len.")
  for k in ("task.prompt_len", "task.train_size", "task.test_size"):
    _positive_int(c, k)
  for k in ("task.train_size", "task.test_size"):
    if registry.generated(c.task.name) and _get(c, k) > registry.MAX_GENERATED:
      _fail(k, f"{_get(c, k):,} examples would be generated before the first step (a few thousand a second) and held "
            f"in memory; set at most {registry.MAX_GENERATED:,} (a run draws train.steps × rl.prompts_per_step "
            "prompts, the split repeating in epochs).")
  idx = tuple(c.task.get("train_indices", ()))
  if any(not integer(i) or not 0 <= i < c.task.train_size for i in idx) \
      or len(set(idx)) != len(idx):
    _fail("task.train_indices", f"{idx!r}: give distinct integers in [0, task.train_size={c.task.train_size}) "
          "(the train-split examples the RL batches draw from; () = all of them).")
  unread_task_knobs(c)


# Task keys the prompt pipeline reads for every task (tasks/prompts.py), besides the tasks that take them as knobs.
_PIPELINE_TASK_KEYS = ("prompt_format",)


def unread_task_knobs(c) -> None:
  """A task knob (a field of some task's class, tasks/registry.py) set away from its default while the run's task
  does not read it — `task.train_path` with task.name='gsm8k' — was silently ignored: one line instead."""
  cls = registry.get(c.task.name).task_class if c.task.name in registry.TASKS else None
  mine = {f.name for f in dataclasses.fields(cls)} if cls is not None and dataclasses.is_dataclass(cls) else set()
  defaults = config_lib.defaults().task
  for key in sorted(c.task.keys()):
    if key in mine or key in _PIPELINE_TASK_KEYS or key not in defaults or c.task[key] == defaults[key]:
      continue
    readers = registry.knob_readers(key)
    if not readers:
      continue
    if config_lib.set_by_user(f"task.{key}", c.task[key], defaults[key]):
      _fail(f"task.{key}", f"is a knob of {' and '.join(readers)}, which this run's task ({c.task.name!r}) does not "
            f"read; leave it at its default ({defaults[key]!r}) or set task.name to one of {readers}.")
    # the config file's own value for its own task, which the user switched (--config.task.name=arith on
    # configs/r1_zero_aha.py): not the user's mistake to refuse, but said
    _warn("task.%s=%r (the config's): no effect with task.name=%r (a knob of %s).", key, c.task[key], c.task.name,
          " and ".join(readers))


def validate_optim(c) -> None:
  """The AdamW keys every training job reads (rl/update.py make_optimizer; the SFT stage uses them with sft.lr):
  checked for an SFT job as for an RL one."""
  _nonneg(c, "optim.weight_decay")
  _nonneg(c, "optim.grad_clip")
  for k in ("optim.b1", "optim.b2"):
    _prob(c, k)
    if _get(c, k) == 1:  # Adam divides its moment by 1 - b^t = 0: every update NaN, so every one skipped
      _fail(k, "must be in [0, 1): AdamW's bias correction divides by 1 - b^t, 0 at b = 1 (NaN updates); "
            "use e.g. 0.9 (b1) or 0.99 (b2).")
  positive_finite(c, "optim.eps", "AdamW's epsilon in g / (sqrt(v) + eps)")


SFT_KNOBS = ("batch", "lr", "warmup_steps", "loss_on", "mistake_frac", "init_from", "lora")  # sft.*: the stage's

# Why a run of each kind leaves each prefix of run_config.drops(kind) (the keys dropped from the view it records, as
# it does not read them) unread, for unread_keys' warning; a prefix added there without a reason here is said with
# _NO_READER. rl.* under job=sft: nothing reads it; the final evaluation's `auto` sampling knobs are planned from
# what it decodes (auto.resolve_eval: eval.batch rows, the mesh, the lengths), with rl.* at the base config's.
_DROP_WHY = {
    "rl.": "it runs no RL step", "ppo.": "it runs no RL step (no critic)",
    "rewards": "it runs no RL step (nothing is scored to train on)", "r1.": "only job=r1_pipeline reads r1.*",
    "train.steps": "its steps are sft.steps", "train.eval_every": "it evaluates once, at its end",
    "train.init_from": "it starts from sft.init_from",
}
_NO_READER = "no stage of it reads this key"


def sft_evaluates(c) -> bool:
  """An SFT run of this config ends with a held-out evaluation (train.run_sft: loss on the completion; job=pretrain
  trains on every token and decodes nothing; the R1 pipeline's SFT stages run without one)."""
  return c.job in ("sft", "grpo") and c.sft.loss_on == "completion"


def sft_stage_runs(c) -> bool:
  """job=grpo runs an SFT stage before the RL run (jobs.grpo_stages): sft.steps > 0 and no train.init_from."""
  return c.sft.steps > 0 and not c.train.init_from


def _unread_rules(c) -> list[tuple[Any, str, str]]:
  """(match(dotted key) -> bool, why, fix) for each class of key config.job does not read; `fix` says {it}."""
  job = c.get("job")
  if job == "export":  # export.run_job reads the run in --workdir and export.*, nothing else of this config
    return [(lambda k: k != "job" and not config_lib.under(k, "export"),
             "job=export (it converts the run in --workdir, whose own config.json gives the rest, and reads only "
             "export.*)", "pass only export.* keys with job=export")]
  rules = [(lambda k: config_lib.under(k, "export"), f"job={job} (only job=export reads export.*)",
            "drop {it} (job=export converts a finished run: python -m grpo_jax.main --config.job=export)")]
  if job == "grpo":
    if not sft_stage_runs(c):  # sft.steps decides whether the stage runs; with train.init_from it is unread too
      keys = {f"sft.{k}" for k in SFT_KNOBS} | ({"sft.steps"} if c.train.init_from else set())
      if c.train.init_from:
        why, fix = ("train.init_from set (the RL run starts from it; no SFT stage runs)",
                    "set train.init_from='' and sft.steps > 0 to run the SFT stage first")
      else:
        why, fix = "sft.steps=0 (no SFT stage)", "set sft.steps > 0 to run an SFT stage before the RL run"
      rules.append((keys.__contains__, why, fix))
    kinds = ("sft", "rl") if sft_stage_runs(c) else ("rl",)
  elif job in ("sft", "pretrain"):
    kinds = ("sft",)
  else:  # r1_pipeline: r1/stage_config.py refuses the keys its stages overwrite (_OVERWRITTEN)
    return rules
  # the prefixes every stage of the job drops from its view (sft.* under job=grpo: the rule above)
  for p in run_config.drops(kinds[0]):
    if p != "sft." and all(run_config.dropped(k, p) for k in kinds):
      fix = "drop {it}, or set job=grpo" if job != "grpo" and p in ("rl.", "ppo.", "rewards") else "drop {it}"
      rules.append((lambda k, p=p: config_lib.under(k, p), f"job={job} ({_DROP_WHY.get(p, _NO_READER)})", fix))
  if job == "sft":  # evaluation.Evaluator decodes untruncated (top_k=0, top_p=1.0): the RL rollout's keys
    rules.append((("sampling.top_k", "sampling.top_p").__contains__, "job=sft (its held-out evaluation decodes "
                  "untruncated: top-k / top-p are the RL rollout's)", "drop {it}"))
  if job == "pretrain":  # train.run_sft(loss_on='all'): every token trained, no held-out evaluation, nothing decoded
    env = bool(c.get("tools") is not None and c.tools.env)  # tools.env='': validate_tools names the tools.* keys
    rules.append((lambda k: config_lib.under(k, "sampling") or config_lib.under(k, "eval") or k == "sft.loss_on" or (
        env and config_lib.under(k, "tools")), "job=pretrain (it trains on every token and decodes nothing: no held-out "
                  "evaluation)", "drop {it}, or set job=sft"))
  return rules


def unread_keys(c) -> None:
  """A key the user set (config_lib.set_by_user: a --config override, a sweep point's or an ablation variant's; with
  no record, away from the base config) that config.job does not read — rl.* under job=sft, sft.* under job=grpo
  without an SFT stage, export.* outside job=export — changed nothing and said nothing: one warning line per reason,
  naming each such key once, with the fix. A config file's own values are its author's business: not named."""
  base, flat = config_lib.flat(config_lib.defaults()), config_lib.flat(c)
  candidates = [k for k in sorted(flat) if config_lib.set_by_user(k, flat[k], base.get(k))]
  for match, why, fix in _unread_rules(c):  # disjoint classes: each key in one line at most
    keys = [k for k in candidates if match(k)]
    if keys:
      _warn("%s: no effect with %s; %s.", ", ".join(f"{k}={flat[k]!r}" for k in keys), why,
            fix.format(it="it" if len(keys) == 1 else "them"))


def validate_sft(c, num_devices: int, tokenizer: Any | None = None) -> None:
  validate_model(c)
  validate_optim(c)
  if c.task.name not in registry.names("data_solutions"):
    _task(c, "worked_solutions", "no reference solutions to train on for")
  elif c.sft.mistake_frac:  # the records' solutions are trained as they are: cot.py writes mistakes for its own
    _fail("sft.mistake_frac", f"{c.sft.mistake_frac!r}: task {c.task.name!r} trains on its records' own worked "
          "solutions, which have no step a mistake could be written into (tasks/cot.py writes those of the "
          "generated tasks); set 0.")
  for k in ("sft.steps", "sft.batch", "task.prompt_len"):
    _positive_int(c, k)
  learning_rate(c, "sft.lr")
  _nonneg(c, "sft.warmup_steps")
  _choice(c, "sft.loss_on", ("completion", "all"))
  _prob(c, "sft.mistake_frac")
  mesh = validate_mesh(c, num_devices)
  validate_eval(c, mesh["data"] * mesh["fsdp"])
  if c.sft.batch % (mesh["data"] * mesh["fsdp"]):
    _fail("sft.batch", f"{c.sft.batch} must be divisible by mesh data*fsdp={mesh['data'] * mesh['fsdp']}.")
  if tokenizer is not None:
    validate_tokenizer(c, tokenizer)
