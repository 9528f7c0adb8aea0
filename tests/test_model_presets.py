"""model_presets: the one table of real model shapes, used by configs/gsm8k.py, aot.py and memory_plan.py."""
import json
import os

import pytest

from grpo_jax.config import config_lib


from grpo_jax.hf import hf_io

from grpo_jax.rl import memory_plan

from grpo_jax.model import model as model_lib

from grpo_jax.model import model_presets

from grpo_jax.hf import model_source
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# config.json as published on the Hugging Face hub (token ids and bookkeeping keys included).
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}
# Published parameter counts (safetensors metadata of each release).
COUNTS = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-7b": 7_615_616_512,
          "qwen2.5-math-1.5b": 1_543_714_304, "qwen2.5-math-7b": 7_615_616_512, "llama-3.2-1b": 1_235_814_400,
          "llama-3.2-3b": 3_212_749_824, "llama-3.1-8b": 8_030_261_248}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_presets_have_the_published_parameter_counts(name):
  mcfg = model_lib.ModelConfig(**model_presets.PRESETS[name])
  assert memory_plan.param_bytes_per_device(mcfg, dict(data=1, fsdp=1, tensor=1))[1] == COUNTS[name]
  instruct = model_presets.PRESETS.get(name + "-instruct")
  if instruct is not None:  # an -Instruct release has its base's shape (only max_len may differ)
    assert {k: v for k, v in instruct.items() if k != "max_len"} == {
        k: v for k, v in model_presets.PRESETS[name].items() if k != "max_len"}


@pytest.mark.parametrize("name,hf", [("llama-3.2-1b", LLAMA_32_1B), ("qwen2.5-0.5b", QWEN25_05B)])
def test_presets_agree_with_the_published_config_json(name, hf):
  assert model_source.mismatches(model_presets.PRESETS[name], hf_io.config_from_hf(hf)) == []
  # and the Llama preset is not a Qwen one in disguise (what memory_plan's PRESETS used to force)
  assert model_source.mismatches(model_presets.PRESETS["qwen2.5-0.5b"], hf_io.config_from_hf(LLAMA_32_1B))


def test_every_preset_round_trips_through_config_json():
  """hf_config writes every checkpoint field config_from_hf reads back: the field list is complete."""
  for name, fields in model_presets.PRESETS.items():
    mcfg = model_lib.ModelConfig(**fields)
    back = hf_io.config_from_hf(hf_io.hf_config(mcfg, "qwen2" if mcfg.qkv_bias else "llama"))
    assert model_source.mismatches(fields, back) == [], name


def test_one_source_for_configs_aot_and_memory_plan():
  c = config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "model=llama-3.1-8b")
  plan = memory_plan.workload_config("llama-3.1-8b").model
  for k, v in model_presets.PRESETS["llama-3.1-8b"].items():
    assert c.model[k] == v and (k == "max_len" or plan[k] == v), k
  assert (c.model.qkv_bias, c.model.rope_theta, c.model.rope_scaling_factor) == (False, 5e5, 8.0)
  math = memory_plan.workload_config("qwen2.5-math-1.5b").model
  assert (math.rope_theta, math.qkv_bias) == (1e4, True)
  ck = config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"))
  assert model_source.unset_fields(ck) == list(model_presets.CHECKPOINT_FIELDS)
  with pytest.raises(config_lib.ConfigError, match="model preset 'qwen3' is unknown"):
    config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "model=qwen3")


def test_checkpoint_fields_resolve_from_a_config_json(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(LLAMA_32_1B))
  mcfg = hf_io.read_config(str(tmp_path))
  assert (mcfg.head_dim, mcfg.rope_scaling_factor, mcfg.rms_eps, mcfg.tie_embeddings) == (64, 32.0, 1e-5, True)


def test_which_checkpoint_the_model_comes_from():
  o = lambda **kw: config_lib.override(config_lib.base_config(), {k.replace("__", "."): v for k, v in kw.items()})
  assert model_source.source(o()) is None
  assert model_source.source(o(train__init_from="hf:/a")) == ("train.init_from", "/a")
  assert model_source.source(o(train__init_from="/run/sft/params", sft__init_from="hf:/b", sft__steps=5)) is None
  assert model_source.source(o(sft__init_from="hf:/b", sft__steps=5)) == ("sft.init_from", "/b")  # SFT, then RL
  assert model_source.source(o(sft__init_from="hf:/b")) is None  # no SFT stage: RL starts from scratch
  assert model_source.source(o(job="sft", sft__init_from="hf:/b", train__init_from="hf:/a")) == ("sft.init_from", "/b")
  assert model_source.resolve(o()).to_dict() == config_lib.base_config().to_dict()  # nothing to resolve


def test_run_rl_takes_unset_model_fields_from_an_hf_checkpoint(tmp_path):
  """train.run_rl itself (no CLI before it) on a config whose checkpoint fields are unset and
  train.init_from=hf:<dir>: the model is the checkpoint's (the run's record says so) and training starts from its
  weights (the frozen reference the run saves is exactly the checkpoint's tensors)."""
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  from grpo_jax.hf import hf_save
  from grpo_jax.infra import checkpoint as ckpt_lib
  from grpo_jax.run import train
  mcfg = model_lib.ModelConfig(vocab_size=512, hidden=32, layers=1, heads=2, kv_heads=1, inter=64, max_len=96,
                               qkv_bias=True, tie_embeddings=False)  # 512: the shipped tokenizer's vocab
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(3))
  hf_save.save_hf(str(tmp_path / "hf"), mcfg, params)
  c = config_lib.base_config()
  model_presets.apply(c.model, model_presets.CHECKPOINT)
  assert model_source.unset_fields(c)  # what run_rl must fill in
  c = config_lib.override(c, {
      "train.init_from": f"hf:{tmp_path / 'hf'}", "task.prompt_len": 48, "task.train_size": 64, "task.test_size": 16, "rl.G": 2, "rl.prompts_per_step": 2, "sampling.max_new_tokens": 4,
      "train.steps": 1, "train.eval_every": 1, "train.plot_every": 0, "train.sample_every": 0, "eval.size": 2,
      "eval.batch": 2, "eval.n_samples": 1, "eval.pass_k": (1,), "log.tensorboard": False, "log.plots": False})
  result = train.run_rl(c, str(tmp_path / "run"))
  assert "eval/accuracy" in result
  assert ckpt_lib.all_committed_steps(tmp_path / "run" / "checkpoints") == [1]
  record = ckpt_lib.read_meta(tmp_path / "run" / "checkpoints", 1)["config"]  # the run config the step was made by
  assert (record["model.hidden"], record["model.layers"], record["model.max_len"], record["model.qkv_bias"]) == (
      32, 1, 96, True)
  saved = ocp.StandardCheckpointer().restore(str(tmp_path / "run" / "checkpoints" / "1" / ckpt_lib.STATE))
  for a, b in zip(jax.tree.leaves(saved["ref_params"]), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_small_gsm8k_takes_the_checkpoints_shape(tmp_path):
  """configs/gsm8k.py:small with train.init_from=hf:DIR: the model is the checkpoint's (its tiny default yields),
  max_len stays the config's lower bound, the checkpoint's tokenizer is used when it ships one; with an explicit
  model=<preset> a checkpoint of another shape is still one error naming the fields; without init_from the tiny
  model stays."""
  import jax
  from grpo_jax.hf import hf_save
  small = config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "small")
  assert model_source.resolve(small).model.hidden == 32  # no checkpoint: the tiny default
  shape = dict(hidden=64, layers=2, heads=4, kv_heads=2, inter=96, head_dim=0, vocab_size=512, max_len=2048,
               rope_theta=5e5, qkv_bias=False, tie_embeddings=False, rms_eps=1e-5, **model_presets.NO_SCALING)
  mcfg = model_lib.ModelConfig(**shape)
  hf_save.save_hf(str(tmp_path), mcfg, model_lib.init_params(mcfg, jax.random.PRNGKey(0)), model_type="llama")
  c = config_lib.override(small, {"train.init_from": f"hf:{tmp_path}"})
  got = model_source.resolve(c)
  for k, v in shape.items():
    assert got.model[k] == {"max_len": 384, "head_dim": 16}.get(k, v), k  # 16 = hidden // heads
  assert got.task.tokenizer == ""  # no tokenizer.json in DIR: the shipped one
  (tmp_path / "tokenizer.json").write_text("{}")
  assert model_source.resolve(c).task.tokenizer == "init_from"
  pinned = config_lib.override(config_lib.load_config(os.path.join(REPO, "configs", "gsm8k.py"), "small,model=tiny"),
                               {"train.init_from": f"hf:{tmp_path}"})
  with pytest.raises(config_lib.ConfigError, match=r"disagrees with its config.json in \d+ field\(s\): model.hidden=32"):
    model_source.resolve(pinned)
