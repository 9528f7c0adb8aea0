"""Config validation before anything compiles: each failure is ONE line naming the key and the fix."""
import math
from typing import Any

from grpo_jax.rl import advantages
from grpo_jax.config import presets
from grpo_jax.config import config_lib
from grpo_jax.infra.errors import ConfigError  # noqa: F401  (validate.ConfigError is what callers catch; exit 2)
from grpo_jax.tasks import data
from grpo_jax.tasks import registry
from grpo_jax.hf import model_source
from grpo_jax.infra import sharding
from grpo_jax.rollout import decode_layout
from grpo_jax.model import model_config
from grpo_jax.model import paged_attention
from grpo_jax.tasks import prompts

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
LOSS_AGG = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
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
  if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
    _fail(key, f"must be a positive integer, got {v!r}.")


def _nonneg(c, key):
  v = _get(c, key)
  if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
    _fail(key, f"must be a finite number >= 0, got {v!r}.")


def prob(c, key, low_open=False):
  v = _get(c, key)
  if not isinstance(v, (int, float)) or isinstance(v, bool) or not (0.0 <= v <= 1.0) or (low_open and v == 0):
    rng = "(0, 1]" if low_open else "[0, 1]"
    _fail(key, f"must be a probability in {rng}, got {v!r}.")


def _choice(c, key, choices):
  v = _get(c, key)
  if v not in choices:
    _fail(key, f"unknown value {v!r}; choose one of {list(choices)}.")


# fail, positive_int and prob are public (the R1 pipeline checks its own keys with them); the checks here use the
# short private names.
_fail, _positive_int, _prob = fail, positive_int, prob


def _task(c, offers: str, lacks: str):
  """task.name must be a task of tasks/registry.py that offers `offers` (a TaskSpec field)."""
  name, ok = c.task.name, registry.names(offers)
  if name not in ok:
    _fail("task.name", f"{'unknown task' if name not in registry.TASKS else lacks} {name!r}; choose one of {ok}.")


def validate_packing(c, total: int) -> None:
  """rl.packing's keys: a packed row must hold the longest sample (P + L tokens)."""
  if config_lib.switch(c.rl.packing) is None:
    _fail("rl.packing", f"must be 'on', 'off' (True / False) or 'auto', got {c.rl.packing!r}.")
  for k in ("rl.pack_len", "rl.pack_rows"):
    v = _get(c, k)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
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
  if not (isinstance(mc.rope_theta, (int, float)) and mc.rope_theta > 0):
    _fail("model.rope_theta", f"must be > 0, got {mc.rope_theta!r}.")
  _choice(c, "model.dtype", DTYPES)
  _choice(c, "model.remat", REMAT)
  _choice(c, "model.attention", ATTENTION)
  if mc.attention == "cudnn" and mc.dtype != "bfloat16":
    _fail("model.attention", f"'cudnn' needs model.dtype='bfloat16' (cuDNN flash attention has no {mc.dtype} "
          "kernel); set model.dtype=bfloat16 or model.attention=auto.")
  if mc.get("rope_scaling_factor", 0) and not mc.rope_high_freq_factor > mc.rope_low_freq_factor:
    _fail("model.rope_high_freq_factor", f"must exceed model.rope_low_freq_factor ({mc.rope_high_freq_factor} <= "
          f"{mc.rope_low_freq_factor}) when llama3 RoPE scaling is on (model.rope_scaling_factor > 0).")
  validate_lora(c)


def validate_lora(c) -> None:
  """model.lora: rank 0 (off) or a positive rank, alpha > 0, targets among PEFT's Qwen2/Llama projection names."""
  lc = c.model.get("lora")
  if lc is None:
    return
  if not isinstance(lc.rank, int) or isinstance(lc.rank, bool) or lc.rank < 0:
    _fail("model.lora.rank", f"must be an integer >= 0 (0 = no LoRA), got {lc.rank!r}.")
  if lc.rank == 0:
    return
  if c.get("job") == "r1_pipeline":
    # its stages hand full params to each other (r1/pipeline.py reads the params of a stage checkpoint as the model)
    _fail("model.lora.rank", f"{lc.rank}: LoRA runs the grpo, sft and pretrain jobs; job=r1_pipeline hands full "
          "params between its stages: set model.lora.rank=0 there.")
  if not (isinstance(lc.alpha, (int, float)) and math.isfinite(lc.alpha) and lc.alpha > 0):
    _fail("model.lora.alpha", f"must be > 0 (scale = alpha / rank), got {lc.alpha!r}.")
  bad = [t for t in lc.targets if t not in LORA_TARGETS]
  if bad or not lc.targets or len(set(lc.targets)) != len(lc.targets):
    _fail("model.lora.targets", f"{tuple(lc.targets)}: name each at most once, among {LORA_TARGETS}.")
  _choice(c, "model.lora.base_dtype", DTYPES)
  if lc.rank > min(c.model.hidden, c.model.inter):
    _fail("model.lora.rank", f"{lc.rank} exceeds the projections' smallest dimension "
          f"(hidden={c.model.hidden}, inter={c.model.inter}); lower it.")


def validate_mesh(c, num_devices: int) -> dict[str, int]:
  try:
    return sharding.mesh_shape(c.mesh, num_devices)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def validate_rl(c, num_devices: int, tokenizer: Any | None = None) -> None:
  """Everything the one-graph RL step needs, checked on plain Python values."""
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
  tb, chunk = c.rl.train_buckets, c.sampling.exit_chunk
  if not isinstance(tb, int) or isinstance(tb, bool) or tb < 0:
    _fail("rl.train_buckets", f"must be an integer >= 1 (static training lengths L, L/2, ...) or 0 (auto), got {tb!r}.")
  if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < -1:
    _fail("sampling.exit_chunk", f"must be an integer >= 0 (decode steps between early-exit checks; 0 = none) or -1 "
          f"(auto), got {chunk!r}.")
  for k in ("rl.eps_low", "rl.eps_high", "rl.beta", "rl.std_eps", "rl.dual_clip", "rl.kl_clamp",
            "optim.lr", "optim.weight_decay", "optim.grad_clip", "sampling.temperature", "rl.process_weight",
            "rl.reward_timeout_s", "optim.warmup_steps"):
    _nonneg(c, k)
  if c.rl.reward_timeout_s == 0:
    _fail("rl.reward_timeout_s", "must be > 0: the seconds a Python reward call may take before the step fails "
          "(or uses rl.reward_fallback).")
  if c.sampling.temperature == 0:
    _fail("sampling.temperature", "must be > 0 for RL (π = softmax(logits / temperature)); use greedy only in eval.")
  if c.optim.lr == 0:
    _fail("optim.lr", "is 0: nothing would train; set a positive learning rate.")
  _prob(c, "sampling.top_p", low_open=True)
  _prob(c, "rl.overlong_frac")
  _prob(c, "optim.b1")
  _prob(c, "optim.b2")
  _prob(c, "ppo.lam")
  _prob(c, "ppo.gamma")
  if not isinstance(c.sampling.top_k, int) or c.sampling.top_k < 0 or c.sampling.top_k > c.model.vocab_size:
    _fail("sampling.top_k", f"must be an integer in [0, vocab_size={c.model.vocab_size}] (0 = off), "
          f"got {c.sampling.top_k!r}.")
  if c.rl.std_ddof not in (0, 1):
    _fail("rl.std_ddof", f"must be 0 (population std) or 1 (sample std), got {c.rl.std_ddof!r}.")
  validate_algorithm(c)
  if c.rl.dynamic_sampling and c.rl.oversample < 2:
    _fail("rl.oversample", "dynamic sampling needs rl.oversample >= 2 (sample more groups than it keeps).")
  if c.rl.eps_low >= 1:
    _fail("rl.eps_low", f"must be < 1 (the ratio is clipped at 1 - eps_low), got {c.rl.eps_low}.")
  if c.rl.reward_fallback not in ("",):
    try:
      float(c.rl.reward_fallback)
    except (TypeError, ValueError):
      _fail("rl.reward_fallback", f"must be '' (raise on bad reward output) or a number, got {c.rl.reward_fallback!r}.")
  mesh = validate_mesh(c, num_devices)
  validate_decode_layout(c, mesh)
  rows = c.rl.prompts_per_step * c.rl.G * (c.rl.oversample if c.rl.dynamic_sampling else 1)
  data_par = mesh["data"] * mesh["fsdp"]
  if (c.rl.prompts_per_step * c.rl.G) % data_par or rows % data_par:
    _fail("rl.prompts_per_step", f"prompts_per_step*G={c.rl.prompts_per_step * c.rl.G} rows must be divisible by "
          f"mesh data*fsdp={data_par}; change prompts_per_step or the mesh.")
  validate_row_splits(c, c.rl.prompts_per_step * c.rl.G, data_par)
  validate_engine(c, rows, data_par)
  validate_eval(c, data_par)
  total = c.task.prompt_len + c.sampling.max_new_tokens
  if total > c.model.max_len:
    _fail("sampling.max_new_tokens", f"task.prompt_len + sampling.max_new_tokens = {total} exceeds "
          f"model.max_len={c.model.max_len}; shorten them or raise model.max_len.")
  validate_packing(c, total)
  if c.rl.process_weight > 0 and "process" not in [n for n, _ in c.rewards]:
    _fail("rl.process_weight", "is > 0 but config.rewards has no 'process' term; add ('process', w) or set 0.")
  for i, entry in enumerate(c.rewards):
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str)
            and isinstance(entry[1], (int, float))):
      _fail(f"rewards[{i}]", f"must be a (name, weight) pair, got {entry!r}.")
  if tokenizer is not None:
    validate_tokenizer(c, tokenizer)


def validate_row_splits(c, n_rows: int, data_par: int) -> None:
  """rl.minibatches / rl.rollout_chunks: 0 (auto: rl/auto.py picks the fewest that fit the device), or a count
  that cuts the rows into equal parts, each divisible by the mesh's row split."""
  for k in ("rl.minibatches", "rl.rollout_chunks"):
    v = _get(c, k)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
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
  if not isinstance(tp, int) or tp < 0:
    _fail("sampling.decode_tp", f"must be an integer >= 0 (0 = the smallest that fits), got {tp!r}.")
  if tp and c.sampling.decode_layout in ("auto", "tp"):
    bad = decode_layout.check(model_config.ModelConfig.from_config(c.model), mesh, decode_layout.Layout("tp", tp))
    if bad:
      raise ConfigError(f"config.{bad}; or set sampling.decode_tp=0 (the smallest that fits).")


def validate_engine(c, rows: int, data_par: int) -> None:
  """sampling.engine / slots / compaction (rollout/engine.py): a known engine, slots that fit the rows and the
  mesh's row split (every compaction size is a multiple of it: engine.compaction_sizes)."""
  _choice(c, "sampling.engine", ENGINES)
  slots, levels = c.sampling.get("slots", 0), c.sampling.get("compaction", 0)
  if not isinstance(slots, int) or slots < 0:
    _fail("sampling.slots", f"must be an integer >= 0 (0 = auto: rl/auto.py's choice), got {slots!r}.")
  if slots > rows:
    _fail("sampling.slots", f"{slots} exceeds the {rows} rollout rows (prompts_per_step*G, times rl.oversample "
          "under dynamic sampling); use at most that, or 0.")
  if slots % data_par:
    _fail("sampling.slots", f"{slots} must be divisible by mesh data*fsdp={data_par} (each device decodes its "
          "share of the slots); use a multiple of it, or 0.")
  if not isinstance(levels, int) or isinstance(levels, bool) or levels < 0:
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
    if not (isinstance(k, int) and 1 <= k <= e.n_samples):
      _fail(f"{group}.pass_k", f"entry {k!r} must be an integer in [1, {group}.n_samples={e.n_samples}].")
  if e.size > c.task.test_size:
    _fail(f"{group}.size", f"{e.size} exceeds task.test_size={c.task.test_size}; lower it or raise test_size.")


def validate_tokenizer(c, tokenizer) -> None:
  if tokenizer.vocab_size != c.model.vocab_size:
    init = c.train.get("init_from", "") or c.sft.get("init_from", "")
    if init.startswith("hf:") and c.task.get("tokenizer", "") != "init_from":
      fix = (f"the model comes from {init}: use its own tokenizer, task.tokenizer=init_from (task.tokenizer is "
             f"{c.task.get('tokenizer', '')!r})")
    else:
      fix = f"set model.vocab_size={tokenizer.vocab_size} (or use the matching tokenizer)"
    _fail("model.vocab_size", f"is {c.model.vocab_size} but the tokenizer has {tokenizer.vocab_size} pieces; {fix}.")
  try:
    prompts.check(c.task.get("prompt_format", "r1_zero"), tokenizer)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None


def validate_groups(c) -> None:
  """Keys every job reads, whatever it runs: the counts of sft/train/log and the task's data policy (a negative
  sft.steps must not silently mean "no SFT stage")."""
  v = c.sft.steps
  if not isinstance(v, int) or isinstance(v, bool) or v < 0:
    _fail("sft.steps", f"must be an integer >= 0 (0 = no SFT stage), got {v!r}.")
  for k in ("train.plot_every", "train.sample_every", "train.num_samples_logged"):
    v = _get(c, k)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
      _fail(k, f"must be an integer >= 0 (0 = off), got {v!r}.")
  for k in ("log.tensorboard", "log.plots"):
    if not isinstance(_get(c, k), bool):
      _fail(k, f"must be True or False, got {_get(c, k)!r}.")
  if not isinstance(c.log.wandb_project, str):
    _fail("log.wandb_project", f"must be a project name or '' (off), got {c.log.wandb_project!r}.")
  _choice(c, "task.overlong_prompts", data.OVERLONG)
  for k in ("task.prompt_len", "task.train_size", "task.test_size"):
    _positive_int(c, k)


def validate_sft(c, num_devices: int, tokenizer: Any | None = None) -> None:
  validate_model(c)
  _task(c, "worked_solutions", "no reference solutions to train on for")
  for k in ("sft.steps", "sft.batch", "task.prompt_len"):
    _positive_int(c, k)
  _nonneg(c, "sft.lr")
  _choice(c, "sft.loss_on", ("completion", "all"))
  _prob(c, "sft.mistake_frac")
  mesh = validate_mesh(c, num_devices)
  validate_eval(c, mesh["data"] * mesh["fsdp"])
  if c.sft.batch % (mesh["data"] * mesh["fsdp"]):
    _fail("sft.batch", f"{c.sft.batch} must be divisible by mesh data*fsdp={mesh['data'] * mesh['fsdp']}.")
  if tokenizer is not None:
    validate_tokenizer(c, tokenizer)
