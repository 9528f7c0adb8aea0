"""HF Qwen2/Llama checkpoints: logits of our model on loaded weights equal transformers' own, export round-trips."""
import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grpo_jax import hf_io  # noqa: E402
from grpo_jax import model as M  # noqa: E402

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

  hf_io.save_hf(str(tmp_path / "ours"), mcfg, params, model_type=kind)
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
  hf_io.save_hf(str(tmp_path / "bf"), mcfg, params, dtype="bfloat16", max_shard_bytes=8_000)
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
    hf_io.save_hf(str(tmp_path / "x"), M.ModelConfig(qkv_bias=False), None, model_type="qwen2")

  llama = make_hf("llama", CASES["llama_bias_tied"][1], seed=2)
  with torch.no_grad():
    llama.model.layers[0].self_attn.o_proj.bias.fill_(0.5)
  llama.save_pretrained(tmp_path / "ob")
  with pytest.raises(ValueError, match="o_proj.bias"):
    hf_io.load_hf(str(tmp_path / "ob"))
