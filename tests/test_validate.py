"""Config validation: each bad value fails before compiling with one line naming the key and the fix."""
import subprocess
import sys

import ml_collections
import pytest

from grpo_jax.config import config_lib
from grpo_jax.config import presets
from grpo_jax.run import validate


class _Tok:
  vocab_size = 512


def _cfg():
  c = config_lib.base_config()
  c.mesh.update(data=1, fsdp=1, tensor=1)
  return c


# (override key, value, substring the error must contain)
BAD = [
    ("rl.G", 1, "config.rl.G"),
    ("rl.G", 0, "config.rl.G"),
    ("rl.prompts_per_step", -2, "config.rl.prompts_per_step"),
    ("rl.algo", "grpoo", "config.rl.algo"),
    ("rl.kl_estimator", "k4", "config.rl.kl_estimator"),
    ("rl.kl_in", "both", "config.rl.kl_in"),
    ("rl.loss_agg", "sum", "config.rl.loss_agg"),
    ("rl.eps_low", -0.1, "config.rl.eps_low"),
    ("rl.eps_low", 1.5, "config.rl.eps_low"),
    ("rl.beta", float("nan"), "config.rl.beta"),
    ("rl.std_ddof", 2, "config.rl.std_ddof"),
    ("rl.algo", "dapo", "config.rl.algo: is 'dapo' but the config holds the 'grpo' preset's settings"),
    ("rl.preset", "dapo", "config.rl.algo: is 'grpo' but the config holds the 'dapo' preset's settings"),
    ("rl.advantage", "gae", "config.rl.advantage: is 'gae' with algo='grpo'"),
    ("rl.advantage", "vtrace", "config.rl.advantage"),
    ("rl.reward_norm", "mean", "config.rl.reward_norm"),
    ("rl.ratio_level", "seq", "config.rl.ratio_level"),
    ("rl.dual_clip", 0.5, "config.rl.dual_clip: must be 0 (off) or > 1"),
    ("rl.dual_clip", -3.0, "config.rl.dual_clip"),
    ("rl.kl_clamp", -1.0, "config.rl.kl_clamp"),
    ("rl.entropy_coef", -0.01, "config.rl.entropy_coef: must be a finite number >= 0"),
    ("rl.entropy_coef", float("nan"), "config.rl.entropy_coef: must be a finite number >= 0"),
    ("rl.entropy_coef", 1e39, "config.rl.entropy_coef: must be a finite number >= 0"),
    ("rl.loss_agg", "seq-mean-token-sum", "config.rl.loss_agg"),  # verl's spelling: ours has underscores
    ("rl.overlong_frac", 1.5, "config.rl.overlong_frac"),
    ("rl.overlong_frac", 0.001, "config.rl.overlong_frac: 0.001 of sampling.max_new_tokens=48 is less than one"),
    ("rl.mu", 0, "config.rl.mu"),
    ("rl.train_buckets", -1, "config.rl.train_buckets: must be an integer >= 1 (static training lengths"),
    ("rl.packing", "yes", "config.rl.packing: must be 'on', 'off' (True / False) or 'auto'"),
    ("sampling.engine", "fast", "config.sampling.engine"),
    ("sampling.exit_chunk", -2, "config.sampling.exit_chunk: must be an integer >= 0 (decode steps between"),
    ("rl.minibatches", 3, "config.rl.minibatches"),
    ("rl.rollout_chunks", 3, "config.rl.rollout_chunks: 3 must split prompts_per_step*G"),
    ("rl.rollout_chunks", -1, "config.rl.rollout_chunks: must be a positive integer, or 0 (auto"),
    ("rl.minibatches", -2, "config.rl.minibatches: must be a positive integer, or 0 (auto"),
    ("rl.reward_fallback", "zero", "config.rl.reward_fallback"),
    ("rl.process_weight", 0.5, "config.rl.process_weight"),
    ("sampling.top_p", 1.5, "config.sampling.top_p"),
    ("sampling.top_p", 0.0, "config.sampling.top_p"),
    ("sampling.top_k", -1, "config.sampling.top_k"),
    ("sampling.top_k", 100_000, "config.sampling.top_k"),
    ("sampling.temperature", 0.0, "config.sampling.temperature"),
    ("sampling.max_new_tokens", 1000, "model.max_len"),
    ("sampling.decode_layout", "tensor", "config.sampling.decode_layout"),
    ("sampling.decode_tp", -1, "config.sampling.decode_tp"),
    ("sampling.decode_tp", 2, "config.sampling.decode_tp=2: must be >= 2 and divide mesh.fsdp=1"),
    ("optim.lr", 0.0, "config.optim.lr"),
    ("optim.b2", 1.2, "config.optim.b2"),
    # b = 1 zeroes Adam's bias correction 1 - b^t: every update NaN, each skipped as non-finite
    ("optim.b1", 1.0, "config.optim.b1: must be in [0, 1)"),
    ("optim.b2", 1, "config.optim.b2: must be in [0, 1)"),
    ("model.kv_heads", 3, "config.model.kv_heads"),
    ("model.hidden", 0, "config.model.hidden"),
    ("model.dtype", "float16", "config.model.dtype"),
    ("model.remat", "some", "config.model.remat"),
    ("model.vocab_size", 500, "config.model.vocab_size"),
    ("task.name", "sudoku", "config.task.name"),
    ("task.language", "c", "config.task.language"),
    ("mesh.data", 16, "config.mesh"),
    ("mesh.data", 0, "config.mesh.data"),
    ("ppo.lam", 1.5, "config.ppo.lam"),
    ("train.steps", 0, "config.train.steps"),
    ("eval.batch", 0, "config.eval.batch"),
    ("eval.batch", 250, "config.eval.batch"),
    ("eval.size", 1000, "config.eval.size"),
    ("eval.pass_k", (1, 8), "config.eval.pass_k"),
    ("eval.pass_k", (True,), "config.eval.pass_k: entry True must be an integer"),
    ("sampling.decode_layout", "tp", "config.sampling.decode_layout: 'tp' splits the weights over mesh.fsdp=1"),
    ("rl.rollout_correction", "vtrace", "config.rl.rollout_correction: unknown value 'vtrace'"),
    ("rl.is_cap", 0.0, "config.rl.is_cap: must be a finite number > 0"),
    ("rl.is_cap", float("inf"), "config.rl.is_cap: must be a finite number > 0"),
    ("rl.is_cap", 0.5, "config.rl.is_cap: 0.5 is below 1: tis would weigh every on-policy token"),
    ("rl.mis_lo", 2.5, "config.rl.mis_lo: 2.5 and rl.mis_hi=2.0 must satisfy rl.mis_lo < 1 < rl.mis_hi"),
    ("rl.mis_lo", -0.5, "config.rl.mis_lo: must be a finite number >= 0"),
    ("rl.icepop_hi", 0.8, "config.rl.icepop_lo: 0.5 and rl.icepop_hi=0.8 must satisfy"),
    ("rl.seq_mask_lo", 1.0, "config.rl.seq_mask_lo: 1.0 and rl.seq_mask_hi=1.001 must satisfy"),
    ("rl.is_veto", 1.5, "config.rl.is_veto: must be in [0, 1)"),
    ("sampling.dtype", "float16", "config.sampling.dtype: unknown value 'float16'"),
    ("rl.objective", "trpo", "config.rl.objective: unknown value 'trpo'"),
    ("rl.sapo_tau_pos", 0.0, "config.rl.sapo_tau_pos: must be a finite number > 0"),
    ("rl.sapo_tau_neg", -1.0, "config.rl.sapo_tau_neg: must be a finite number > 0"),
    # finite in Python, not in the step's float32: 4/tau = inf, a learning rate of inf, a window end of inf
    ("rl.sapo_tau_pos", 1e-39, "config.rl.sapo_tau_pos: must be a finite number > 0 in float32"),
    # in float32, but 4/tau·gate·A overflows near it, and below 1e-6 the gate is flat: nothing to gain
    ("rl.sapo_tau_neg", 1e-37, "config.rl.sapo_tau_neg: 1e-37 is below 1e-06, where the SAPO gate is already flat"),
    ("optim.lr", 1e39, "config.optim.lr"),
    ("rl.mis_hi", 1e39, "config.rl.mis_hi: must be a finite number > 0 in float32"),
    ("rl.kl_cov_coef", 1e39, "config.rl.kl_cov_coef"),
    ("rl.token_select", "top_k", "config.rl.token_select: unknown value 'top_k'"),
    ("rl.select_frac", 0.0, "config.rl.select_frac: must be a fraction in (0, 1]"),
    ("rl.select_frac", 1.2, "config.rl.select_frac: must be a fraction in (0, 1]"),
    ("rl.clip_cov_ratio", 0.0, "config.rl.clip_cov_ratio: must be a fraction in (0, 1]"),
    ("rl.kl_cov_ratio", 2.0, "config.rl.kl_cov_ratio: must be a fraction in (0, 1]"),
    ("rl.clip_cov_lb", 5.0, "config.rl.clip_cov_lb: 5.0 and rl.clip_cov_ub=5.0 must be finite with"),
    ("rl.kl_cov_coef", -1.0, "config.rl.kl_cov_coef"),
    ("rl.eps_low", 1.01, "config.rl.eps_low: must be <= 1"),
    ("rl.ref_reset_every", -1, "config.rl.ref_reset_every: must be an integer >= 0"),
    ("rl.random_reward_rate", 1.5, "config.rl.random_reward_rate: must be a probability in [0, 1]"),
]


@pytest.mark.parametrize("over,needle", [
    ({"rl.beta": 0.0}, "rl.beta = 0 keeps no reference to reset"),
    ({"model.lora.rank": 4}, "the reference is the frozen base itself"),
])
def test_reference_reset_needs_a_reference_copy(over, needle):
  c = config_lib.override(_cfg(), {"rl.ref_reset_every": 10, **over})
  with pytest.raises(validate.ConfigError, match="config.rl.ref_reset_every: is 10 but") as e:
    validate.validate_rl(c, num_devices=1, tokenizer=_Tok())
  assert needle in str(e.value)
  validate.validate_rl(config_lib.override(_cfg(), {"rl.ref_reset_every": 10}), num_devices=1, tokenizer=_Tok())


def test_positive_finite_is_one_rule_with_an_optional_reason():
  """validate.positive_finite is the one check of a scale that must be > 0 (it had a private twin,
  _finite_positive, with its own message): finite and >= float32's smallest normal, the reason said when given;
  it returns the value."""
  c = config_lib.override(_cfg(), {"rl.is_cap": 1e-39})
  with pytest.raises(validate.ConfigError) as e:
    validate.positive_finite(c, "rl.is_cap", "tis truncates the weight at it")
  assert str(e.value) == ("config.rl.is_cap: must be a finite number > 0 in float32 (the step's precision; tis "
                          "truncates the weight at it), got 1e-39.")
  c.model.rope_theta = float("nan")
  with pytest.raises(validate.ConfigError) as e:
    validate.positive_finite(c, "model.rope_theta")
  assert str(e.value) == "config.model.rope_theta: must be a finite number > 0 in float32 (the step's precision), got nan."
  assert validate.positive_finite(config_lib.override(c, {"rl.is_cap": 2.0}), "rl.is_cap") == 2.0
  assert not hasattr(validate, "_finite_positive")


def test_learning_rate_and_temperature_bounds(caplog):
  """validate.MAX_LR = 1 and MAX_TEMPERATURE = 100 are inclusive: 1e30 ran (the model overwritten at the first
  update, every sample uniform); a learning rate above WARN_LR = 0.1 runs with a warning naming the key."""
  import logging
  ok = lambda **o: validate.validate_rl(config_lib.override(_cfg(), o), num_devices=1, tokenizer=_Tok())
  caplog.set_level(logging.WARNING)
  ok(**{"optim.lr": 1.0, "sampling.temperature": 100.0})
  assert any("config.optim.lr=1.0: far above" in r.getMessage() for r in caplog.records)
  caplog.clear()
  ok(**{"optim.lr": 0.1})
  assert not any("far above" in r.getMessage() for r in caplog.records)
  for over, needle in (({"optim.lr": 1.0000001}, "config.optim.lr: is 1.0000001: AdamW"),
                       ({"sampling.temperature": 100.5}, "config.sampling.temperature: is 100.5:")):
    with pytest.raises(validate.ConfigError, match=needle):
      ok(**over)


def test_a_temperature_below_the_floor_is_refused():
  """sampling.MIN_TEMPERATURE = 0.01 is inclusive. Below it the run was accepted and sampled from logits / T: at
  1e-37 (logits of 40) those overflow float32 and every recorded log-prob was NaN, at 1e-40 (flushed to 0) too; the
  r1 rejection sampler's temperature has the same rule."""
  ok = lambda **o: validate.validate_rl(config_lib.override(_cfg(), o), num_devices=1, tokenizer=_Tok())
  ok(**{"sampling.temperature": 0.01})
  for t in (0.0099, 1e-37, 1e-40):
    with pytest.raises(validate.ConfigError, match=rf"^config.sampling.temperature: is {t!r}: below 0.01 "):
      ok(**{"sampling.temperature": t})
  c = config_lib.override(_cfg(), {"r1.rejection.temperature": 1e-6})
  with pytest.raises(validate.ConfigError, match=r"^config.r1.rejection.temperature: is 1e-06: below 0.01"):
    validate.temperature(c, "r1.rejection.temperature")


@pytest.mark.parametrize("idx", [(3, 3), (-1,), (20_000,), (1.0,)])
def test_train_indices_must_be_distinct_train_examples(idx):
  c = _cfg()
  c.task.train_indices = idx
  with pytest.raises(validate.ConfigError, match=r"config.task.train_indices: .*distinct integers in \[0, "
                                                 r"task.train_size=20000\)"):
    validate.validate_groups(c)
  c.task.train_indices = (0, 19_999)
  validate.validate_groups(c)


# Python's True is the int 1 and a non-empty string is true: a count given a bool, or a switch given a string or an
# int, ran as something else without a word (sampling.top_k=True drew from the top 1: greedy RL; False was off).
# ConfigDict keeps a bool set on an int key; a config file that builds its own dicts keeps anything.
INT_KEYS = ("sampling.top_k", "rl.std_ddof", "sampling.decode_tp", "sampling.slots",  # checked without excluding bools
            "rl.G", "rl.minibatches", "sampling.exit_chunk", "rl.train_buckets", "model.lora.rank",
            "rl.max_staleness", "eval.n_samples")
BOOL_KEYS = ("rl.partial_rollouts", "rl.dynamic_sampling", "log.plots", "model.tie_embeddings", "sft.lora")


def _set_raw(c, key, value):
  """`key` set as a config file that builds its own group dict would (no ConfigDict type check)."""
  *parents, leaf = key.split(".")
  node = c
  for p in parents[:-1]:
    node = node[p]
  group = _get_node(c, parents)
  node[parents[-1]] = ml_collections.ConfigDict({**group.to_dict(), leaf: value})


def _get_node(c, parts):
  for p in parts:
    c = c[p]
  return c


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("key", INT_KEYS)
def test_a_bool_for_an_integer_key_is_refused(key, value):
  c = _cfg()
  _set_raw(c, key, value)
  with pytest.raises(validate.ConfigError, match=rf"^config\.{key}: is {value}, a bool where an integer is expected"):
    validate.validate_groups(c)
  with pytest.raises(validate.ConfigError, match=rf"^config\.{key}: .*got {value}"):  # the key's own rule, too
    validate.validate_rl(c, num_devices=1, tokenizer=_Tok())


@pytest.mark.parametrize("value", ["False", "True", 1, 0, ""])
@pytest.mark.parametrize("key", BOOL_KEYS)
def test_a_switch_given_a_string_or_an_int_is_refused(key, value):
  c = _cfg()
  _set_raw(c, key, value)
  with pytest.raises(validate.ConfigError, match=rf"^config\.{key}: must be True or False, got {value!r}"):
    validate.validate_groups(c)


def test_float_keys_refuse_bools_and_good_types_pass():
  c = _cfg()
  _set_raw(c, "rl.beta", True)
  with pytest.raises(validate.ConfigError, match=r"^config\.rl\.beta: is True, a bool where a number is expected"):
    validate.validate_groups(c)
  validate.validate_groups(_cfg())
  c = _cfg()
  _set_raw(c, "sampling.top_k", 5)  # an int, and numpy's bool for a switch (a sweep's value)
  _set_raw(c, "rl.dynamic_sampling", __import__("numpy").bool_(False))
  validate.validate_groups(c)


@pytest.mark.parametrize("key,value,needle", BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_bad_config_one_line(key, value, needle):
  c = _cfg()
  node = c
  *parents, leaf = key.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_rl(c, num_devices=1, tokenizer=_Tok())
  msg = str(e.value)
  assert needle in msg, msg
  assert "\n" not in msg


def test_batch_not_divisible_by_mesh():
  c = _cfg()
  c.mesh.update(data=-1)
  c.rl.update(prompts_per_step=3, G=2)
  with pytest.raises(validate.ConfigError, match="divisible by mesh"):
    validate.validate_rl(c, num_devices=4, tokenizer=_Tok())


def test_decode_tp_must_split_the_heads():
  c = _cfg()
  c.mesh.update(fsdp=8)
  c.eval.update(batch=8 * c.eval.n_samples, size=8 * c.eval.n_samples)
  c.model.update(heads=4, kv_heads=2)
  c.sampling.update(decode_layout="tp", decode_tp=8)
  with pytest.raises(validate.ConfigError, match="decode_tp × mesh.tensor = 8 must divide model.heads=4"):
    validate.validate_rl(c, num_devices=8)
  c.sampling.decode_tp = 4  # 4 query heads over 4 chips; the 2 KV heads repeated twice
  validate.validate_rl(c, num_devices=8)


def test_two_free_mesh_axes():
  c = _cfg()
  c.mesh.update(data=-1, fsdp=-1)
  with pytest.raises(validate.ConfigError, match="only one axis may be -1"):
    validate.validate_rl(c, num_devices=2)


def test_reinforce_pp_needs_kl_in_reward():
  c = presets.apply(_cfg(), "reinforce_pp")
  validate.validate_rl(c, num_devices=1)
  c.rl.kl_in = "loss"
  with pytest.raises(validate.ConfigError, match="config.rl.kl_in: the reinforce_pp advantage folds the KL"):
    validate.validate_rl(c, num_devices=1)


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_validates(name):
  validate.validate_rl(presets.apply(_cfg(), name), num_devices=1, tokenizer=_Tok())


@pytest.mark.parametrize("over,needle", [
    ({"rl.advantage": "reinforce_pp", "rl.kl_in": "reward"}, "'per_term' normalises each reward term"),
    ({"rl.kl_in": "reward", "rl.beta": 0.04}, "would normalise the KL penalty away"),
])
def test_per_term_needs_an_outcome_group_advantage_and_no_kl_in_reward(over, needle):
  c = config_lib.override(presets.apply(_cfg(), "gdpo"), over)
  with pytest.raises(validate.ConfigError, match=needle):
    validate.validate_rl(c, num_devices=1)
  validate.validate_rl(config_lib.override(c, {"rl.beta": 0.0, "rl.advantage": "grpo"}), num_devices=1)


def test_objective_other_than_clip_needs_the_token_ratio():
  c = config_lib.override(presets.apply(_cfg(), "cispo"), {"rl.ratio_level": "sequence"})
  with pytest.raises(validate.ConfigError, match="config.rl.ratio_level: 'sequence'"):
    validate.validate_rl(c, num_devices=1)


def test_good_config_passes():
  validate.validate_rl(_cfg(), num_devices=1, tokenizer=_Tok())


def test_cli_bad_config_is_one_line(tmp_path):
  """The CLI prints one line (no traceback) and exits non-zero, before compiling anything."""
  for override, needle in (("--config.rl.G=1", "config.rl.G"), ("--config.rl.nosuchkey=3", "nosuchkey"),
                           ("--config.rl.algo=dapo", "--config=<file>.py:algo=dapo")):
    out = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_arith.py",
                          f"--workdir={tmp_path}", override], capture_output=True, text=True, timeout=120,
                         env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert needle in out.stderr
    assert "Traceback" not in out.stderr, out.stderr[-2000:]


def test_tool_keys_without_a_tool_run_are_logged(caplog):
  """tools.* set where no environment runs (tools.env '' and no tool data) change nothing: a warning names them,
  rather than dropping them silently; the base config's tools group says nothing."""
  import logging
  c = config_lib.override(_cfg(), {"tools.workers": 3, "tools.sandbox.time_s": 5.0})
  with caplog.at_level(logging.WARNING):
    validate.validate_tools(c)
  lines = [r.getMessage() for r in caplog.records if "no effect with tools.env=''" in r.getMessage()]
  assert len(lines) == 1 and sorted(lines[0].split(": no effect")[0].split(", ")) == [
      "tools.sandbox.time_s=5.0", "tools.workers=3"], lines
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    validate.validate_tools(_cfg())
  assert not any("tools." in r.getMessage() for r in caplog.records)


def test_truncated_chat_prompts_are_refused():
  """task.overlong_prompts='truncate' keeps a prompt's first token and its end: on a chat prompt that cut the
  template's system turn (with tools.format='qwen', its tool list) out half-way and left a stray <|im_start|>; the
  r1_zero prompts it was written for keep their bos and the question's end."""
  c = config_lib.override(_cfg(), {"task.prompt_format": "chat", "task.overlong_prompts": "truncate"})
  with pytest.raises(validate.ConfigError, match=r"^config.task.overlong_prompts: 'truncate' with "
                     r"task.prompt_format='chat' would cut the chat template's system turn"):
    validate.validate_groups(c)
  for ok in ({"task.prompt_format": "chat", "task.overlong_prompts": "drop"}, {"task.overlong_prompts": "truncate"}):
    validate.validate_groups(config_lib.override(_cfg(), ok))


def _said(caplog, fn, *args):
  """The 'no effect' warning lines `fn(*args)` logs."""
  import logging
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    fn(*args)
  return [r.getMessage() for r in caplog.records if ": no effect with " in r.getMessage()]


def _named(lines):
  """{key: how many of the lines name it} ('k=v, k2=v2: no effect with ...')."""
  import re
  out = {}
  for line in lines:
    for key in re.findall(r"(?:^|, )([\w.]+)=", line.split(": no effect with ")[0]):
      out[key] = out.get(key, 0) + 1
  return out


def test_sft_keys_without_an_sft_stage_are_logged(caplog, tmp_path):
  """job=grpo runs no SFT stage at sft.steps=0, or with train.init_from set (the RL run starts from it): sft.lora=True
  and the other sft.* keys changed nothing and said nothing. preflight.check names the ones the user set in one
  warning, with the fix; the config file's own sft.* values (configs/grpo_arith.py's sft.warmup_steps=30, sft.steps
  =60) are its author's and were named as noise by the old rule (any value away from the base config): not now. A
  run whose SFT stage runs, and the base config's sft group, say nothing."""
  from grpo_jax.run import preflight
  c = config_lib.override(config_lib.load_config("configs/grpo_arith.py", "small"),
                          {"log.plots": False, "log.tensorboard": False, "model.lora.rank": 4})
  runs = {"no stage": {"sft.steps": 0, "sft.lora": True},
          "init_from": {"sft.lora": True, "train.init_from": str(tmp_path / "params")},
          "stage runs": {"sft.lora": True}}

  def check(over):
    try:
      with config_lib.user_keys_set(over):  # as main records the command line's --config.<key> flags
        preflight.check(config_lib.override(c, over), str(tmp_path / "run"))
    except ValueError:  # train.init_from names no checkpoint: refused (InputError) after the config checks
      pass

  lines = [l for l in _said(caplog, check, runs["no stage"]) if "sft." in l]
  assert lines == ["sft.lora=True: no effect with sft.steps=0 (no SFT stage); set sft.steps > 0 to run an SFT stage "
                   "before the RL run."], lines
  lines = [l for l in _said(caplog, check, runs["init_from"]) if "sft." in l]
  assert lines == ["sft.lora=True: no effect with train.init_from set (the RL run starts from it; no SFT stage runs); "
                   "set train.init_from='' and sft.steps > 0 to run the SFT stage first."], lines
  assert _said(caplog, check, runs["stage runs"]) == []
  # with no record (a library caller that built the config in code): every value away from the base config is its
  # own, the file's sft.warmup_steps too
  lines = _said(caplog, validate.unread_keys, config_lib.override(c, runs["no stage"]))
  assert _named(lines) == {"sft.lora": 1, "sft.warmup_steps": 1}, lines
  assert _said(caplog, validate.unread_keys, _cfg()) == []


# (job, overrides the user passes: each a key that job does not read, and the reason its line gives)
UNREAD = {
    "sft": {"rl.beta": "job=sft (it runs no RL step)", "ppo.vf_coef": "job=sft (it runs no RL step (no critic))",
            "rewards": "job=sft (it runs no RL step (nothing is scored", "r1.zero.steps": "only job=r1_pipeline reads",
            "train.steps": "its steps are sft.steps", "train.eval_every": "it evaluates once, at its end",
            "train.init_from": "it starts from sft.init_from", "sampling.top_k": "decodes untruncated",
            "sampling.top_p": "decodes untruncated", "export.dtype": "only job=export reads export.*"},
    "pretrain": {"rl.G": "job=pretrain (it runs no RL step)", "sampling.temperature": "decodes nothing",
                 "eval.size": "decodes nothing", "sft.loss_on": "trains on every token",
                 "tools.workers": "decodes nothing", "train.steps": "its steps are sft.steps"},
    "grpo": {"sft.lora": "sft.steps=0 (no SFT stage)", "r1.zero.steps": "job=grpo (only job=r1_pipeline reads r1.*)",
             "export.step": "job=grpo (only job=export reads export.*)"},
    "r1_pipeline": {"export.step": "job=r1_pipeline (only job=export reads export.*)"},
    "export": {"rl.beta": "job=export (it converts the run in --workdir", "seed": "job=export",
               "sampling.top_k": "job=export"},
}
# keys the same job reads, set by the user too: never named
READ = {"sft": ("sft.lr", "sampling.temperature", "eval.size", "train.log_every", "optim.weight_decay"),
        "pretrain": ("sft.lr", "sft.batch", "train.ckpt_every"),
        "grpo": ("sft.steps", "rl.beta", "sampling.top_k", "train.steps", "rewards"),
        "r1_pipeline": ("r1.zero.steps", "rl.beta", "sampling.top_k"),
        "export": ("export.dtype", "export.step", "job")}
VALUES = {"rl.beta": 0.1, "ppo.vf_coef": 0.3, "rewards": (("accuracy", 1.0),), "r1.zero.steps": 3, "train.steps": 5,
          "train.eval_every": 2, "train.init_from": "/x/params", "sampling.top_k": 5, "sampling.top_p": 0.9,
          "export.dtype": "bfloat16", "rl.G": 4, "sampling.temperature": 0.7, "eval.size": 16, "sft.loss_on": "all",
          "tools.workers": 3, "tools.env": "calculator", "sft.lora": True, "export.step": 3, "seed": 3, "sft.lr": 1e-5,
          "train.log_every": 2, "optim.weight_decay": 0.01, "sft.batch": 8, "train.ckpt_every": 4, "sft.steps": 0,
          "export.out_dir": "/x/hf", "job": "export"}


@pytest.mark.parametrize("job", list(UNREAD))
def test_keys_the_user_set_that_the_job_does_not_read_are_named_once(job, caplog):
  """A key the user set (a --config flag, a sweep point's or an ablation variant's override: config_lib.user_keys_set)
  that config.job does not read changed nothing and said nothing (rl.* under job=sft, export.* outside job=export):
  each is named in one warning line with the reason, exactly once; keys the job reads, and the config file's own
  values (configs/grpo_arith.py sets rl.*, sft.* and train.* for its grpo job), are not named."""
  c = config_lib.load_config("configs/grpo_arith.py", "small")
  user = {k: VALUES[k] for k in (*UNREAD[job], *READ[job])}
  user["job"] = job
  if job == "pretrain":
    user["tools.env"] = "calculator"  # with tools.env='' validate_tools names the tools.* keys (its own line)
  if job == "grpo":
    user["sft.steps"] = 0
  with config_lib.user_keys_set(user):
    lines = _said(caplog, validate.unread_keys, config_lib.override(c, user))
  named = _named(lines)
  assert named == {k: 1 for k in UNREAD[job] if k != "tools.env"} | (
      {"tools.env": 1} if job == "pretrain" else {}), lines
  for key, why in UNREAD[job].items():
    line = next(l for l in lines if l.startswith(f"{key}=") or f", {key}=" in l)
    assert why in line.split(": no effect with ", 1)[1], (key, line)


def test_every_key_a_stage_drops_from_its_record_has_a_reason():
  """unread_keys takes the keys each job leaves unread from run_config.drops (the keys a stage's recorded view drops
  as unread, not a second hand-kept list): each such prefix has its reason in validate._DROP_WHY (sft.* under
  job=grpo has its own rule), so no line falls back to the generic one."""
  from grpo_jax.run import run_config
  for kind in ("sft", "rl"):
    for p in run_config.drops(kind):
      assert p == "sft." or p in validate._DROP_WHY, (kind, p)  # pylint: disable=protected-access


def test_a_command_lines_flags_are_the_keys_it_set(tmp_path):
  """End to end: `main` records its --config.<key> flags (absl's override values, cli.override_keys) as the keys the
  user set, so job=export on configs/grpo_arith.py names the flag it passed (rl.beta), not the dozens of keys the
  file sets for its grpo job, before it refuses the empty export.out_dir."""
  import os
  out = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_arith.py:small",
                        f"--workdir={tmp_path}", "--config.job=export", "--config.rl.beta=0.1"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 2, out.stderr[-2000:]
  lines = [l for l in out.stderr.splitlines() if ": no effect with " in l]
  assert len(lines) == 1 and lines[0].split("] ", 1)[-1].startswith(
      "rl.beta=0.1: no effect with job=export (it converts the run in --workdir"), out.stderr[-2000:]
  assert "config.export.out_dir: is empty" in out.stderr


def test_sweep_points_and_ablation_variants_are_keys_the_user_set(caplog, tmp_path, monkeypatch):
  """A sweep point's overrides reach its run as --config flags do: each run names the sweep command's flags and its
  point's keys that its job does not read, once (its check; the run itself, which checks again, does not repeat
  it), not the config file's; an ablation variant's overrides (and the table's --config.run.<key> flags) likewise,
  not what the table's run config sets itself."""
  import types
  from grpo_jax.run import jobs
  from grpo_jax.studies import ablate, sweep
  c = config_lib.override(config_lib.load_config("configs/grpo_arith.py", "small"),
                          {"job": "sft", "log.plots": False, "log.tensorboard": False, "train.steps": 7})
  ran = []
  monkeypatch.setattr(jobs, "run", lambda config, wd: ran.append(wd) or jobs.check(config, wd))  # its checks, no step
  lines = _said(caplog, lambda: sweep.run(c, str(tmp_path / "sw"), config_file="configs/grpo_arith.py:small",
                                          sweep_text="rl.beta=0.02,0.04", mode="serial",
                                          base_overrides={"train.steps": 7}, log=lambda s: None))
  assert len(ran) == 2
  assert sorted(l.split(":")[0] for l in lines) == ["rl.beta=0.02", "rl.beta=0.04", "train.steps=7",
                                                    "train.steps=7"], lines
  # an ablation table: the variants' configs are built (and checked) once by check_variants
  base = config_lib.override(_cfg(), {"rl.rollout_correction": "tis", "rl.mis_lo": 0.2})  # the table's own
  table = types.SimpleNamespace(build_config=lambda cfg, over: validate.validate_correction(
      config_lib.override(cfg.run, over)) or config_lib.override(cfg.run, over))
  cfg = ml_collections.ConfigDict({"run": base, "variants": (("a", {"rl.icepop_lo": 0.3}), ("b", {"rl.is_cap": 3.0}))})
  lines = _said(caplog, ablate.check_variants, cfg, table, ("rl.seq_mask_hi",))
  assert lines == ["rl.icepop_lo=0.3, rl.seq_mask_hi=1.001: no effect with rl.rollout_correction='tis' (it reads "
                   "rl.is_cap); set rl.rollout_correction to 'icepop' or 'seq_mask' to use them.",
                   "rl.seq_mask_hi=1.001: no effect with rl.rollout_correction='tis' (it reads rl.is_cap); set "
                   "rl.rollout_correction to 'seq_mask' to use it."], lines


def test_path_not_taken_warnings_name_what_the_user_set(caplog):
  """The warnings for the knobs of a path not taken (model.lora.* at rank 0, tools.* without tools.env, the carry's
  knobs with rl.partial_rollouts off, a correction kind's thresholds under another kind) ask config_lib.set_by_user
  too: under a record they name the keys the user set, at whatever value, and not those the config set itself (a
  file's, a table's run config's), which the old rule (any value away from the base config) named as well."""
  file = config_lib.override(_cfg(), {"model.lora.alpha": 8.0, "tools.workers": 3, "rl.max_staleness": 3,
                                      "rl.mis_lo": 0.1, "rl.rollout_correction": "tis"})  # the config's own
  user = {"model.lora.rslora": True, "tools.chunk": 8, "rl.carry_kv": "recompute", "rl.icepop_hi": 5.0}  # 2 defaults
  c = config_lib.override(file, user)
  with config_lib.user_keys_set(user):
    lines = (_said(caplog, validate.validate_model, c) + _said(caplog, validate.validate_tools, c)
             + _said(caplog, validate.validate_partial, c, 1) + _said(caplog, validate.validate_correction, c))
  assert [l.split(": no effect with ")[0] for l in lines] == [
      "model.lora.rslora=True", "tools.chunk=8", "rl.carry_kv='recompute'", "rl.icepop_hi=5.0"], lines
  # no record: the values away from the base config, the config's own too (tools.chunk and icepop_hi are defaults)
  lines = (_said(caplog, validate.validate_model, c) + _said(caplog, validate.validate_tools, c)
           + _said(caplog, validate.validate_partial, c, 1) + _said(caplog, validate.validate_correction, c))
  assert [l.split(": no effect with ")[0] for l in lines] == [
      "model.lora.alpha=8.0, model.lora.rslora=True", "tools.workers=3", "rl.max_staleness=3, rl.carry_kv='recompute'",
      "rl.mis_lo=0.1"], lines


def test_a_warning_is_said_once_per_command(caplog):
  """A command checks its config more than once (preflight, then each stage's set-up: a 2-step main run logged the
  rank-0 LoRA line three times and the carry and correction lines twice): under one record each warning is one line;
  a new record (the next run of a sweep) says it again; a library caller with no record hears every check."""
  user = {"model.lora.alpha": 3.0, "rl.max_staleness": 2, "rl.mis_lo": 0.1, "sft.lr": 1e-4, "optim.lr": 0.5}
  c = config_lib.override(config_lib.override(_cfg(), {"sft.steps": 0}), user)

  def check_twice():
    import logging
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      for _ in range(2):
        for fn, args in ((validate.validate_model, ()), (validate.validate_partial, (1,)),
                         (validate.validate_correction, ()), (validate.unread_keys, ()), (validate.learning_rate, ("optim.lr",))):
          fn(c, *args)
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

  with config_lib.user_keys_set(user):
    once = check_twice()
  heads = sorted(l.split(":")[0] for l in once)
  assert heads == sorted(["config.optim.lr=0.5", "model.lora.alpha=3.0", "rl.max_staleness=2", "rl.mis_lo=0.1",
                          "sft.lr=0.0001"]), once
  with config_lib.user_keys_set(user):  # the next run's record
    assert sorted(l.split(":")[0] for l in check_twice()) == heads
  assert len(check_twice()) == 2 * len(heads)  # no record: every check says its lines


def test_objective_and_selection_knobs_the_chosen_ones_do_not_read_are_logged(caplog):
  """rl.eps_high / rl.dual_clip under rl.objective='sapo' (its gate replaces the clip), rl.dual_clip under 'cispo',
  rl.sapo_tau_* under 'clip', rl.select_frac / clip_cov_* / kl_cov_* under another rl.token_select: each changed
  nothing and said nothing (the correction kinds' thresholds were already named). One warning per switch naming the
  knobs and the value that reads them; the chosen ones' own knobs, and a preset's own values, say nothing. KL-Cov with
  a coefficient of 0 penalises nothing: said too."""
  import logging

  def said(over):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      validate.validate_objective(config_lib.override(_cfg(), over))
    return [r.getMessage() for r in caplog.records if "no effect with rl." in r.getMessage() or "kl_cov_coef=0" in
            r.getMessage()]
  assert said({"rl.objective": "sapo", "rl.eps_high": 0.3, "rl.dual_clip": 5.0, "rl.sapo_tau_neg": 2.0}) == [
      "rl.eps_high=0.3, rl.dual_clip=5.0: no effect with rl.objective='sapo' (it reads rl.sapo_tau_pos, "
      "rl.sapo_tau_neg); set rl.objective to 'clip' or 'cispo' to use them."]
  assert said({"rl.objective": "cispo", "rl.dual_clip": 5.0, "rl.eps_high": 3.0}) == [
      "rl.dual_clip=5.0: no effect with rl.objective='cispo' (it reads rl.eps_low, rl.eps_high); set rl.objective "
      "to 'clip' to use it."]
  assert said({"rl.sapo_tau_pos": 2.0, "rl.select_frac": 0.5, "rl.kl_cov_coef": 2.0}) == [
      "rl.sapo_tau_pos=2.0: no effect with rl.objective='clip' (it reads rl.eps_low, rl.eps_high, rl.dual_clip); set "
      "rl.objective to 'sapo' to use it.",
      "rl.select_frac=0.5, rl.kl_cov_coef=2.0: no effect with rl.token_select='all' (it reads no such knob); set "
      "rl.token_select to 'top_entropy' or 'kl_cov' to use them."]
  assert said({"rl.token_select": "kl_cov", "rl.kl_cov_coef": 0.0, "rl.clip_cov_ub": 9.0}) == [
      "rl.clip_cov_ub=9.0: no effect with rl.token_select='kl_cov' (it reads rl.kl_cov_ratio, rl.kl_cov_coef); set "
      "rl.token_select to 'clip_cov' to use it.",
      "rl.token_select='kl_cov' with rl.kl_cov_coef=0: the penalty on the tokens it picks is 0, so the loss is "
      "rl.objective's alone (only train/select_* are logged); set rl.kl_cov_coef > 0 (verl's 1) or "
      "rl.token_select='all'."]
  # KL-Cov with every update on-policy (μ 1, one minibatch): its |log ρ| is 0 with a zero gradient, the run is GRPO
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    for mu, mb in ((1, 1), (2, 1), (1, 2), (1, 0)):
      validate.validate_objective(config_lib.override(_cfg(), {"rl.token_select": "kl_cov", "rl.mu": mu,
                                                               "rl.minibatches": mb}))
  on_policy = [r.getMessage() for r in caplog.records if "on every update of this run" in r.getMessage()]
  assert len(on_policy) == 1 and on_policy[0].endswith("set rl.mu >= 2 or rl.minibatches >= 2 for KL-Cov to act.")
  assert said({"rl.token_select": "clip_cov", "rl.clip_cov_lb": 0.5, "rl.objective": "sapo",
               "rl.sapo_tau_pos": 2.0}) == []  # the chosen ones' own knobs
  # a preset's own settings, applied whole through its overrides (an ablation variant's or a sweep point's keys, so
  # the user's): cispo's dual_clip 3, grpo's sapo_tau_*, sapo's eps_*: not named; one changed on top of it is
  for name in ("cispo", "sapo", "gspo", "grpo"):
    with config_lib.user_keys_set(presets.overrides(name)):
      assert said(presets.overrides(name)) == [], name
  with config_lib.user_keys_set([*presets.overrides("sapo"), "rl.eps_high"]):
    assert said({**presets.overrides("sapo"), "rl.eps_high": 0.3}) == [
        "rl.eps_high=0.3: no effect with rl.objective='sapo' (it reads rl.sapo_tau_pos, rl.sapo_tau_neg); set "
        "rl.objective to 'clip' or 'cispo' to use it."]


def test_correction_thresholds_the_chosen_kind_does_not_read_are_logged(caplog):
  """rl.mis_lo under rl.rollout_correction='tis' (or any threshold of a kind not chosen) changed nothing: one warning
  names each with the kind that reads it; the chosen kind's own thresholds say nothing."""
  import logging
  c = config_lib.override(_cfg(), {"rl.rollout_correction": "tis", "rl.is_cap": 3.0, "rl.mis_lo": 0.1,
                                   "rl.is_veto": 0.0})
  with caplog.at_level(logging.WARNING):
    validate.validate_correction(c)
  lines = [r.getMessage() for r in caplog.records if "no effect with rl.rollout_correction" in r.getMessage()]
  assert lines == ["rl.mis_lo=0.1, rl.is_veto=0.0: no effect with rl.rollout_correction='tis' (it reads rl.is_cap); "
                   "set rl.rollout_correction to 'mis' or 'seq_mask' to use them."], lines
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    validate.validate_correction(config_lib.override(_cfg(), {"rl.rollout_correction": "seq_mask", "rl.is_veto": 0.0}))
    validate.validate_correction(_cfg())
  assert not [r for r in caplog.records if "no effect" in r.getMessage()]
