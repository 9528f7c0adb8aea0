"""HF Qwen2/Llama checkpoints: logits of our model on loaded weights equal transformers' own, export round-trips."""
import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grpo_jax.hf import hf_io  # noqa: E402
from grpo_jax.hf import hf_save
from grpo_jax.model import model as M  # noqa: E402

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, rms_norm_eps=1e-6)
CASES = {
    "qwen2_gqa_tied": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10_000.0)),
    "qwen2_mha_untied": ("qwen2", dict(num_key_value_heads=4, tie_word_embeddings=False, rope_theta=1e6)),
    "llama3_scaled_untied": ("llama", dict(
        num_key_value_heads=1, tie_word_embeddings=False, rope_theta=10_000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16))),
    "llama_bias_tied": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=True, attention_bias=True)),
    # MQA with a head_dim other than hidden // heads (16, not 8) and a small θ: Qwen2 reads head_dim too
    "qwen2_mqa_head_dim16": ("qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500.0,
                                           head_dim=16)),
}
TOKENS = np.array([[0, 0, 0, 5, 9, 11, 3, 7, 1, 2], [4, 8, 2, 6, 1, 17, 5, 60, 33, 12]], np.int64)
MASK = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10], np.int64)
POS = np.clip(np.cumsum(MASK, 1) - 1, 0, None)


def make_hf(kind, kw, seed):
  cls_cfg = transformers.Qwen2Config if kind == "qwen2" else transformers.LlamaConfig
  cfg = cls_cfg(**SMALL, **kw)
  torch.manual_seed(seed)
  model = (transformers.Qwen2ForCausalLM if kind == "qwen2" else transformers.LlamaForCausalLM)(cfg).float()
  with torch.no_grad():  # O(1) random weights everywhere (HF init leaves biases 0 and norms 1)
    for name, p in model.named_parameters():
      p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
      if name.endswith("o_proj.bias"):
        p.zero_()  # o_proj biases are not in our model: loading a non-zero one must fail (tested below)
  return model.eval()


def hf_logits(model):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(TOKENS), attention_mask=torch.tensor(MASK),
                position_ids=torch.tensor(POS))
  return out.logits.numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_load_matches_transformers_and_export_round_trips(case, tmp_path):
  kind, kw = CASES[case]
  model = make_hf(kind, kw, seed=len(case))
  shard = "20KB" if case.startswith("llama3") else "1GB"  # one case goes through the sharded index
  model.save_pretrained(tmp_path / "hf", max_shard_size=shard)
  assert os.path.exists(tmp_path / "hf" / "model.safetensors.index.json") == (shard == "20KB")
  mcfg, params = hf_io.load_hf(str(tmp_path / "hf"))
  assert mcfg.kv_heads == kw["num_key_value_heads"] and mcfg.tie_embeddings == kw["tie_word_embeddings"]
  assert (mcfg.rope_scaling_factor > 0) == ("rope_scaling" in kw)
  want = hf_logits(model)
  got = np.asarray(M.forward(mcfg, params, TOKENS.astype(np.int32), POS.astype(np.int32), MASK.astype(np.int32)))
  real = MASK > 0
  np.testing.assert_allclose(got[real], want[real], atol=2e-4, rtol=1e-4)
  assert np.abs(want[real]).max() > 1.0

  hf_save.save_hf(str(tmp_path / "ours"), mcfg, params, model_type=kind)
  mcfg2, params2 = hf_io.load_hf(str(tmp_path / "ours"))
  assert mcfg2 == mcfg
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ours")).float().eval()
  np.testing.assert_allclose(hf_logits(back)[real], want[real], atol=2e-4, rtol=1e-4)


def test_sharded_bf16_export_and_rejections(tmp_path):
  model = make_hf("qwen2", CASES["qwen2_gqa_tied"][1], seed=1)
  model.save_pretrained(tmp_path / "hf")
  mcfg, params = hf_io.load_hf(str(tmp_path / "hf"))
  hf_save.save_hf(str(tmp_path / "bf"), mcfg, params, dtype="bfloat16", max_shard_bytes=8_000)
  index = json.loads((tmp_path / "bf" / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 1
  _, p16 = hf_io.load_hf(str(tmp_path / "bf"))
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(p16)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2 ** -8, atol=1e-30)  # bf16 rounding only

  hf = json.loads((tmp_path / "hf" / "config.json").read_text())
  with pytest.raises(ValueError, match="rope scaling type 'linear'"):
    hf_io.config_from_hf({**hf, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}})
  with pytest.raises(ValueError, match="model_type"):
    hf_io.config_from_hf({**hf, "model_type": "gpt2"})
  with pytest.raises(ValueError, match="sliding"):
    hf_io.config_from_hf({**hf, "use_sliding_window": True})
  with pytest.raises(ValueError, match="qwen2"):
    hf_save.save_hf(str(tmp_path / "x"), M.ModelConfig(qkv_bias=False), None, model_type="qwen2")

  llama = make_hf("llama", CASES["llama_bias_tied"][1], seed=2)
  with torch.no_grad():
    llama.model.layers[0].self_attn.o_proj.bias.fill_(0.5)
  llama.save_pretrained(tmp_path / "ob")
  with pytest.raises(ValueError, match="o_proj.bias"):
    hf_io.load_hf(str(tmp_path / "ob"))


# ------------------------------------------------------------------------------------ safetensors_io, streaming

from grpo_jax.config import config_lib  # noqa: E402

from grpo_jax.hf import model_source

from grpo_jax.hf import safetensors_io as st
from grpo_jax.hf.hf_io import CheckpointError  # noqa: E402


def test_safetensors_io_reads_and_writes_what_the_reference_package_does(tmp_path):
  from safetensors.torch import load_file, save_file
  src = {"a": torch.randn(3, 5), "b": torch.randn(7).bfloat16(), "c": torch.randn(2, 2).half()}
  save_file(src, str(tmp_path / "ref.safetensors"), metadata={"format": "pt"})
  infos = st.read_header(str(tmp_path / "ref.safetensors"))
  for k, v in src.items():
    np.testing.assert_array_equal(st.read(infos[k]).astype(np.float32), v.float().numpy())
  arrays = {k: st.read(i) for k, i in infos.items()}
  st.write(str(tmp_path / "ours.safetensors"), [(k, v.shape, v.dtype) for k, v in arrays.items()],
           arrays.__getitem__, {"format": "pt"})
  back = load_file(str(tmp_path / "ours.safetensors"))
  for k, v in src.items():
    assert back[k].dtype == v.dtype
    np.testing.assert_array_equal(back[k].float().numpy(), v.float().numpy())


def tiny_checkpoint(path, kind="qwen2", seed=0, **over):
  """A random checkpoint written by save_hf (no torch): Qwen2-like with biases, or Llama-like without."""
  kw = dict(vocab_size=48, hidden=32, layers=3, heads=4, kv_heads=2, inter=64, max_len=128, qkv_bias=kind == "qwen2",
            tie_embeddings=False)
  kw.update(over)
  mcfg = M.ModelConfig(**kw)
  params = M.init_params(mcfg, jax.random.PRNGKey(seed))
  hf_save.save_hf(str(path), mcfg, params, model_type=kind)
  return mcfg, params


def rewrite(path, change):
  """Rewrites model.safetensors with `change(dict of arrays)` applied."""
  file = os.path.join(path, "model.safetensors")
  arrays = {k: st.read(i) for k, i in st.read_header(file).items()}
  change(arrays)
  st.write(file, [(k, v.shape, v.dtype) for k, v in arrays.items()], arrays.__getitem__, {"format": "pt"})


def edit_config(path, change):
  p = os.path.join(path, "config.json")
  cfg = json.loads(open(p).read())
  change(cfg)
  with open(p, "w") as f:
    json.dump(cfg, f)


def _k_proj(a):
  for i in range(3):
    a[f"model.layers.{i}.self_attn.k_proj.weight"] = a[f"model.layers.{i}.self_attn.k_proj.weight"][:8]


def _q_bias(a):
  a["model.layers.0.self_attn.q_proj.bias"] = np.zeros((31,), np.float32)


def _one_layer(a):
  a["model.layers.1.mlp.gate_proj.weight"] = np.zeros((60, 32), np.float32)


def _o_bias(a):
  a["model.layers.2.self_attn.o_proj.bias"] = np.full((32,), 0.5, np.float32)


def _truncate(path):
  f = os.path.join(path, "model.safetensors")
  size = os.path.getsize(f)
  with open(f, "r+b") as fh:
    fh.truncate(size - 100)


def _drop_a_shard(path):
  mcfg, params = hf_io.load_hf(path)
  os.remove(os.path.join(path, "model.safetensors"))
  hf_save.save_hf(path, mcfg, params, max_shard_bytes=20_000)
  os.remove(os.path.join(path, "model-00002-of-00008.safetensors"))


def _stale_copy_beside(path):
  """Shards without an index (every *.safetensors is read) and a stale file holding one of their tensors: the
  later file's copy was loaded without a word."""
  os.rename(os.path.join(path, "model.safetensors"), os.path.join(path, "model-00001-of-00001.safetensors"))
  st.write(os.path.join(path, "old.safetensors"), [("model.norm.weight", (32,), np.float32)],
           lambda name: np.full((32,), 7.0, np.float32), {"format": "pt"})


# case -> (make the damage, substrings the one line must contain)
BAD = {
    "k_proj_shape": (lambda p: rewrite(p, _k_proj), ["3 tensor problem(s)", "model.safetensors",
                                                     "model.layers.0.self_attn.k_proj.weight has shape [8, 32], expected [16, 32]"]),
    "q_bias_shape": (lambda p: rewrite(p, _q_bias), ["model.layers.0.self_attn.q_proj.bias has shape [31], expected [32]"]),
    "one_bad_layer": (lambda p: rewrite(p, _one_layer), ["1 tensor problem(s)",
                                                         "model.layers.1.mlp.gate_proj.weight has shape [60, 32], expected [64, 32]"]),
    "missing_tensor": (lambda p: rewrite(p, lambda a: a.pop("model.layers.2.mlp.up_proj.weight")),
                       ["tensor model.layers.2.mlp.up_proj.weight is missing (expected shape [64, 32])"]),
    "extra_layer": (lambda p: rewrite(p, lambda a: a.update({"model.layers.3.mlp.up_proj.weight": np.zeros((64, 32), np.float32)})),
                    ["unexpected tensor model.layers.3.mlp.up_proj.weight"]),
    "truncated": (_truncate, ["model.safetensors: truncated: tensor", "Re-download"]),
    "o_proj_bias": (lambda p: rewrite(p, _o_bias), ["model.layers.2.self_attn.o_proj.bias is non-zero", "not implemented"]),
    "llama3_without_low_freq": (lambda p: edit_config(p, lambda c: c.update(rope_scaling=dict(
        rope_type="llama3", factor=8.0, high_freq_factor=4.0, original_max_position_embeddings=32))),
        ["config.json: rope_scaling (rope_type 'llama3') lacks low_freq_factor"]),
    # a 0 low_freq_factor divided by zero silently (wavelengths of inf) where transformers raises
    "llama3_low_freq_zero": (lambda p: edit_config(p, lambda c: c.update(rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=0.0, high_freq_factor=4.0,
        original_max_position_embeddings=32))), ["0 < low_freq_factor < high_freq_factor"]),
    "rope_type_yarn": (lambda p: edit_config(p, lambda c: c.update(rope_scaling=dict(rope_type="yarn", factor=4.0))),
                       ["rope scaling type 'yarn' is not implemented"]),
    "sliding_window": (lambda p: edit_config(p, lambda c: c.update(use_sliding_window=True)),
                       ["use_sliding_window=true: sliding-window attention is not implemented"]),
    "model_type": (lambda p: edit_config(p, lambda c: c.update(model_type="mistral")),
                   ["model_type='mistral' is not supported"]),
    "missing_shard": (_drop_a_shard, ["model-00002-of-00008.safetensors is missing (listed in "
                                      "model.safetensors.index.json)"]),
    "no_config": (lambda p: os.remove(os.path.join(p, "config.json")), ["config.json is missing"]),
    "stale_copy": (_stale_copy_beside, ["tensor model.norm.weight is in both model-00001-of-00001.safetensors and "
                                        "old.safetensors", "remove the stale files"]),
    # a cache snapshot's link to a blob that never arrived: was said to be "listed in model.safetensors.index.json"
    "broken_link": (lambda p: (os.remove(os.path.join(p, "model.safetensors")),
                               os.symlink(os.path.join(p, "gone"), os.path.join(p, "model.safetensors"))),
                    ["model.safetensors is missing (a link whose target is gone"]),
    # bool("false") is True: the model was tied and lm_head.weight dropped without a word
    "tie_as_string": (lambda p: edit_config(p, lambda c: c.update(tie_word_embeddings="false")),
                      ["tie_word_embeddings='false': expected true or false"]),
    "hidden_null": (lambda p: edit_config(p, lambda c: c.update(hidden_size=None)), ["hidden_size is null"]),
    # θ 1e4 was loaded where transformers 5 reads the dict's 50 (and 4 the top level's): two models in one file
    "rope_theta_twice": (lambda p: edit_config(p, lambda c: c.update(rope_theta=10000.0, rope_parameters=dict(
        rope_type="default", rope_theta=50.0))),
        ["rope_theta=10000.0 and rope_parameters.rope_theta=50.0 disagree", "keep one value"]),
    # ignored without a word: only part of each head is rotated in a partial-RoPE model
    "partial_rotary": (lambda p: edit_config(p, lambda c: c.update(partial_rotary_factor=0.5)),
                       ["partial_rotary_factor=0.5: partial RoPE is not implemented"]),
    "partial_rotary_in_dict": (lambda p: edit_config(p, lambda c: c.update(rope_scaling=dict(
        rope_type="default", partial_rotary_factor=0.25))), ["partial_rotary_factor=0.25"]),
    # sliding layers named per layer (transformers 5's layout) were loaded as full attention
    "sliding_layer_types": (lambda p: edit_config(p, lambda c: c.update(
        sliding_window=4, layer_types=["full_attention", "sliding_attention", "sliding_attention"])),
        ["layer_types=['sliding_attention']: only 'full_attention' layers are implemented"]),
    # a GPTQ/AWQ/FP8 checkpoint's int weights and scales were reported as tensor problems to fix by re-downloading
    "quantized": (lambda p: (edit_config(p, lambda c: c.update(quantization_config=dict(quant_method="gptq", bits=4))),
                             rewrite(p, lambda a: a.update({"model.layers.0.mlp.up_proj.qweight": np.zeros(
                                 (4, 64), np.int32)}))),
                  ["quantization_config (quant_method 'gptq'): quantized checkpoints are not supported"]),
    # 0 was read as "as many as the query heads" (MHA) without a word
    "kv_heads_zero": (lambda p: edit_config(p, lambda c: c.update(num_key_value_heads=0)),
                      ["model.kv_heads=0: must be a positive integer"]),
    "no_weights": (lambda p: os.remove(os.path.join(p, "model.safetensors")), ["no *.safetensors files"]),
    "not_a_dir": (lambda p: None, ["is not a directory"]),
}


def _config(init_from):
  c = config_lib.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                          "gsm8k.py"), "small,model=checkpoint")
  return config_lib.override(c, {"train.init_from": init_from})


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_are_one_line_config_errors_naming_file_and_tensor(case, tmp_path):
  """The error path the CLI turns into `Config error: <line>` and exit 2 (main.py); raised while resolving the
  model, before any state exists."""
  path = tmp_path / "hf"
  tiny_checkpoint(path, "llama" if case == "o_proj_bias" else "qwen2", qkv_bias=True)
  damage, needles = BAD[case]
  damage(str(path))
  target = str(tmp_path / "nope") if case == "not_a_dir" else str(path)
  with pytest.raises(config_lib.ConfigError) as e:
    model_source.resolve(_config(f"hf:{target}"))
  msg = str(e.value)
  assert "\n" not in msg and all(n in msg for n in needles), msg
  if case not in ("not_a_dir",):
    assert target in msg or "model.safetensors" in msg, msg  # names the file


def test_nonfinite_weights_are_refused_at_load_naming_the_tensor(tmp_path):
  """A NaN in a checkpoint used to load and train: non-finite steps, then a stop advising a lower learning rate."""
  tiny_checkpoint(tmp_path / "hf")

  def nan(a):
    a["model.layers.1.mlp.up_proj.weight"][3, 4] = np.nan
  rewrite(str(tmp_path / "hf"), nan)
  with pytest.raises(config_lib.ConfigError) as e:
    hf_io.load_hf(str(tmp_path / "hf"))
  msg = str(e.value)
  assert "model.layers.1.mlp.up_proj.weight holds 1 NaN/inf" in msg and "\n" not in msg, msg


def test_nonfinite_weights_are_refused_before_the_workdir_is_written(tmp_path, capsys, monkeypatch):
  """The CLI's path: a NaN (or inf) in a bf16 transformers-written checkpoint was found by load_params after the run
  had written config.json, auto.json, stage.json and checkpoints/; preflight now reads every weight first (in
  pieces) and stops with one line naming the file and the tensor, and no workdir."""
  from grpo_jax import main
  from grpo_jax.run import preflight
  from tests import hf_dirs
  src = hf_dirs.qwen_instruct_dir(str(tmp_path / "hf"))
  c = config_lib.override(config_lib.load_config(os.path.join(hf_dirs.REPO, "configs", "gsm8k.py"),
                                                 "small,model=checkpoint,prompt=chat"),
                          {"train.init_from": f"hf:{src}", "task.data_dir": hf_dirs.gsm8k_jsonl(str(tmp_path / "d"))})
  preflight.check_hf_weights(c)  # finite: passes
  with monkeypatch.context() as m:  # read once per process while the files are unchanged (a sweep's points)
    m.setattr(st, "read_chunks", lambda info: pytest.fail("read again"))
    preflight.check_hf_weights(c)
  for name, value in (("model.layers.1.mlp.up_proj.weight", np.nan), ("model.embed_tokens.weight", np.inf)):
    def damage(a, name=name, value=value):
      a[name] = a[name].copy()
      a[name][3, 4] = value
    rewrite(src, damage)
    code = main.execute(c, str(tmp_path / "run"))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("Config error: "), line
    assert f"model.safetensors: tensor {name} holds 1 NaN/inf" in line, line
    assert not (tmp_path / "run").exists()


def test_a_tied_checkpoint_with_a_different_lm_head_is_refused(tmp_path):
  """tie_word_embeddings=true and an lm_head.weight beside the embedding: an equal copy (some writers save both)
  loads; a different one was ignored here while transformers 5 loads it as a separate head (other logits)."""
  mcfg, params = tiny_checkpoint(tmp_path / "hf", tie_embeddings=True)
  path = str(tmp_path / "hf")
  rewrite(path, lambda a: a.update({"lm_head.weight": a["model.embed_tokens.weight"].copy()}))
  _, loaded = hf_io.load_hf(path)
  np.testing.assert_array_equal(np.asarray(loaded["embed"]["embedding"]), np.asarray(params["embed"]["embedding"]))
  hf_io.check_finite(path)

  def differ(a):
    a["lm_head.weight"] = a["lm_head.weight"].copy()
    a["lm_head.weight"][5, 3] += 1.0
  rewrite(path, differ)
  for check in (hf_io.load_hf, hf_io.check_finite):
    with pytest.raises(CheckpointError) as e:
      check(path)
    msg = str(e.value)
    assert "lm_head.weight differs from model.embed_tokens.weight" in msg and "tie_word_embeddings" in msg, msg
    assert "\n" not in msg


def test_rope_theta_is_read_where_transformers_reads_it(tmp_path):
  """θ stated only inside the RoPE dict (rope_scaling or rope_parameters, without a top-level rope_theta) is the one
  transformers reads (rope_scaling carrying θ was loaded with the default 1e4); stated twice, equal, it loads; a
  config.json saved by transformers 5 (rope_parameters, layer_types of full_attention) loads with its own θ."""
  path = tmp_path / "hf"
  tiny_checkpoint(path)
  base = json.loads((path / "config.json").read_text())
  base.pop("rope_theta")
  for extra in (dict(rope_scaling=dict(rope_type="default", rope_theta=50.0)),
                dict(rope_parameters=dict(rope_type="default", rope_theta=50.0)),
                dict(rope_theta=50.0, rope_parameters=dict(rope_type="default", rope_theta=50.0))):
    (path / "config.json").write_text(json.dumps({**base, **extra}))
    theirs = transformers.AutoConfig.from_pretrained(str(path)).rope_parameters["rope_theta"]
    assert theirs == 50.0 and hf_io.read_config(str(path)).rope_theta == theirs, extra
  make_hf("qwen2", dict(num_key_value_heads=2, rope_theta=1e6), seed=0).save_pretrained(tmp_path / "v5")
  saved = json.loads((tmp_path / "v5" / "config.json").read_text())
  assert "rope_theta" not in saved and saved["layer_types"] == ["full_attention"] * 2, saved
  assert hf_io.read_config(str(tmp_path / "v5")).rope_theta == 1e6


def test_every_disagreeing_model_field_is_listed(tmp_path):
  tiny_checkpoint(tmp_path / "hf")
  c = config_lib.override(_config(f"hf:{tmp_path / 'hf'}"),
                          {"model.hidden": 64, "model.kv_heads": 4, "model.rms_eps": 1e-5, "model.qkv_bias": False,
                           "model.max_len": 100})  # max_len below the checkpoint's is fine: it only caps lengths
  with pytest.raises(config_lib.ConfigError) as e:
    model_source.resolve(c)
  msg = str(e.value)
  assert "in 4 field(s)" in msg and "\n" not in msg, msg
  for needle in ("model.hidden=64 (checkpoint: 32)", "model.kv_heads=4 (checkpoint: 2)",
                 "model.rms_eps=1e-05 (checkpoint: 1e-06)", "model.qkv_bias=False (checkpoint: True)"):
    assert needle in msg, msg
  ok = model_source.resolve(config_lib.override(c, {"model.hidden": 32, "model.kv_heads": 2, "model.rms_eps": 1e-6,
                                                    "model.qkv_bias": True}))
  assert (ok.model.hidden, ok.model.max_len, ok.model.layers, ok.model.tie_embeddings) == (32, 100, 3, False)


def test_cli_exits_2_with_one_line_for_bad_checkpoints(tmp_path):
  import subprocess
  import sys
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  procs = {}
  for case in ("one_bad_layer", "truncated", "not_a_dir"):
    path = tmp_path / case
    tiny_checkpoint(path)
    BAD[case][0](str(path))
    target = str(tmp_path / "missing") if case == "not_a_dir" else str(path)
    procs[case] = subprocess.Popen(
        [sys.executable, "-m", "grpo_jax.main", "--config=configs/gsm8k.py:small,model=checkpoint",
         f"--workdir={tmp_path / ('w_' + case)}", f"--config.train.init_from=hf:{target}"],
        cwd=repo, env=dict(os.environ, PYTHONPATH=repo, JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
  for case, p in procs.items():
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, (case, err[-2000:])
    line = err.strip().splitlines()[-1]
    assert line.startswith("Config error: ") and all(n in line for n in BAD[case][1]), (case, line)
    assert "Traceback" not in err, err[-2000:]


def test_streamed_load_lands_in_the_shardings(tmp_path):
  """4 simulated devices, params over fsdp=2 x tensor=2: every leaf equals the single-device load and carries the
  sharding it was given (subprocess: the device count is fixed at JAX start)."""
  import subprocess
  import sys
  tiny_checkpoint(tmp_path / "hf", heads=4, kv_heads=2)
  code = f"""
import jax, numpy as np
from grpo_jax.hf import hf_io
from grpo_jax.model import model as M
from grpo_jax.infra import sharding
from grpo_jax.rl import state
mcfg, ref = hf_io.load_hf({str(tmp_path / 'hf')!r})
mesh = sharding.make_mesh(dict(data=1, fsdp=2, tensor=2))
_, sh = state._params_spec(mesh, mcfg)
with sharding.mesh_context(mesh):
  got = hf_io.load_params({str(tmp_path / 'hf')!r}, mcfg, sh)
for a, b, s in zip(jax.tree.leaves(ref), jax.tree.leaves(got), jax.tree.leaves(sh)):
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert b.sharding == s, (b.sharding, s)
print("OK", sum(len(set(str(x.sharding.spec) for x in jax.tree.leaves(got))) for _ in [0]))
"""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=120,
                     env=dict(os.environ, PYTHONPATH=repo, JAX_PLATFORMS="cpu",
                              XLA_FLAGS=os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=4"))
  assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
