"""Long context: the long-completion R1-Zero config end to end through the CLI, shrunk (configs/r1_zero.py:long);
logits equal to transformers' at positions near max_position_embeddings; prompt + completion past model.max_len
refused by both samplers."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from grpo_jax.model import model as M
from grpo_jax.rollout import engine
from grpo_jax.rollout import sampling

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_r1_zero_long_runs_through_the_cli(tmp_path):
  """configs/r1_zero.py:long shrunk to 64 new tokens with the blockwise attention `auto` takes at its 2048 forced
  (at T = 112 `auto` would take the einsum path), 1 pre-training and 2 R1-Zero steps: both stages finish, and the
  RL steps decode in 2 row chunks and train on what they decoded."""
  wd = str(tmp_path / "r1")
  over = {"sampling.max_new_tokens": 64, "model.max_len": 112, "model.attention": "blockwise",
          "r1.pretrain.steps": 1, "r1.zero.steps": 2, "train.ckpt_every": 2,
          "log.plots": False}
  cmd = ([sys.executable, "-m", "grpo_jax.main", "--config=configs/r1_zero.py:long", f"--workdir={wd}"]
         + [f"--config.{k}={v}" for k, v in over.items()])
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  for stage in ("base", "r1_zero"):
    assert json.load(open(os.path.join(wd, stage, "stage.json")))["done"], stage
  rows = [json.loads(line) for line in open(os.path.join(wd, "r1_zero", "metrics.jsonl"))]
  steps = [r for r in rows if "train/loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert all(0 < r["train/completion_len_max"] <= 64 and math.isfinite(r["train/loss"]) for r in steps)
  cfg = json.load(open(os.path.join(wd, "config.json")))  # the resolved config of the command
  assert cfg["rl"]["rollout_chunks"] == 2 and cfg["sampling"]["max_new_tokens"] == 64
  assert cfg["model"]["attention"] == "blockwise"
  assert os.path.exists(os.path.join(wd, "report.md"))


# transformers configs of tiny random models whose RoPE is that of a long-context release
LONG = {
    # Qwen2.5's θ at its 32k context; sliding_window stated but off (use_sliding_window false), as Qwen2.5 ships
    "qwen2_theta1e6_32k": ("qwen2", dict(num_key_value_heads=2, rope_theta=1e6, max_position_embeddings=32768,
                                         use_sliding_window=False, sliding_window=16, max_window_layers=1,
                                         tie_word_embeddings=True)),
    # Llama-3.1's 'llama3' scaling (θ 5e5, original 8192, factor 8) at its 128k context
    "llama31_scaled_128k": ("llama", dict(num_key_value_heads=1, rope_theta=5e5, max_position_embeddings=131072,
                                          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                            high_freq_factor=4.0,
                                                            original_max_position_embeddings=8192),
                                          tie_word_embeddings=False)),
}


@pytest.mark.parametrize("case", sorted(LONG))
def test_logits_equal_transformers_near_max_position_embeddings(case, tmp_path):
  """RoPE at positions up to max_position_embeddings - 1: our forward on the loaded checkpoint equals transformers'
  own on random weights it saved, one row left-padded with its last position at the limit, one at positions from 0.
  Scores depend on position differences only, so what this holds is the rounding of angles ~1e5 rad (fp32, as
  transformers computes them: bf16 positions fail it) and θ / the llama3 frequencies at these distances."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from grpo_jax.hf import hf_io
  kind, kw = LONG[case]
  cfg = (transformers.Qwen2Config if kind == "qwen2" else transformers.LlamaConfig)(
      vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, **kw)
  torch.manual_seed(0)
  model = (transformers.Qwen2ForCausalLM if kind == "qwen2" else transformers.LlamaForCausalLM)(cfg).float().eval()
  with torch.no_grad():  # O(1) weights (HF's init leaves attention near uniform, which hides RoPE)
    for name, p in model.named_parameters():
      p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
      if name.endswith("o_proj.bias"):
        p.zero_()
  model.save_pretrained(tmp_path / "hf")
  mcfg, params = hf_io.load_hf(str(tmp_path / "hf"))
  top = kw["max_position_embeddings"]
  assert mcfg.max_len == top
  t = 12
  tokens = np.random.default_rng(0).integers(1, 64, (2, t))
  mask = np.ones((2, t), np.int64)
  mask[0, :3] = 0
  pos = np.stack([np.maximum(top - t + np.arange(t), top - t + 3), np.arange(t)])  # row 0 ends at top - 1
  with torch.no_grad():
    want = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                 position_ids=torch.tensor(pos)).logits.numpy()
  got = np.asarray(M.forward(mcfg, params, tokens.astype(np.int32), pos.astype(np.int32), mask.astype(np.int32)))
  real = mask > 0
  np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=1e-4)
  assert np.abs(want[real]).max() > 1.0


def test_prompt_plus_completion_past_max_len_is_refused_by_both_samplers():
  """P + L = model.max_len + 1: one line naming both and the fix, before anything is traced (the config check,
  tests/test_validate.py, covers runs; these are the functions' own)."""
  mcfg = M.ModelConfig(vocab_size=64, hidden=32, layers=1, heads=4, kv_heads=2, inter=64, max_len=16)
  prompt, pmask = np.ones((2, 6), np.int32), np.ones((2, 6), np.int32)
  scfg = sampling.SamplingConfig(max_new_tokens=11)
  msg = r"prompt length 6 \+ sampling.max_new_tokens 11 > model.max_len 16; raise model.max_len"
  with pytest.raises(ValueError, match=msg):
    sampling.sample(mcfg, None, prompt, pmask, None, scfg)
  with pytest.raises(ValueError, match=msg):
    engine.sample_groups(mcfg, None, prompt, pmask, 2, scfg, u_LxN=np.zeros((11, 4), np.float32))
