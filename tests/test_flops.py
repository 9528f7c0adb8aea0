"""Analytic FLOP and byte counts against hand counts on tiny shapes."""
import numpy as np
import pytest

from grpo_jax.perf import flops
from grpo_jax.model import model as model_lib

# D=4, H=2, K=1, Dh=2, F=8, V=10, one layer
TINY = model_lib.ModelConfig(vocab_size=10, hidden=4, layers=1, heads=2, kv_heads=1, head_dim=2, inter=8, max_len=8)


def test_forward_flops_hand_count():
  # per token: q 2·4·2·2=32, k 16, v 16, o 2·2·2·4=32, MLP 3·2·4·8=192 -> 288; 3 tokens -> 864
  # attention: tokens see 1, 2, 3 keys; QK^T and PV each 2·H·Dh=8 per key -> 16·6 = 96
  # LM head at 2 positions: 2·4·10·2 = 160
  assert flops.forward_flops(TINY, seq_len=3, scored=2) == 864 + 96 + 160 == 1120
  two_layers = model_lib.ModelConfig(**{**TINY.__dict__, "layers": 2})
  assert flops.forward_flops(two_layers, 3, 2) == 2 * (864 + 96) + 160
  with pytest.raises(ValueError, match="scored"):
    flops.forward_flops(TINY, 3, 4)


def test_step_flops_is_five_forwards():
  out = flops.step_flops(TINY, prompt_lens_N=[1, 2], completion_lens_N=[2, 1])
  # row 0: T=3, head at 2 -> 1120; row 1: T=3, head at 1 -> 1120 - 80 = 1040
  fwd = 1120 + 1040
  assert out == dict(rollout=fwd, reference=fwd, policy_fwd_bwd=3 * fwd, update=4 * fwd, step=5 * fwd)
  # bf16 (correction.needs_proximal): the step also runs the old-log-prob forward; the update's passes are as before
  out = flops.step_flops(TINY, prompt_lens_N=[1, 2], completion_lens_N=[2, 1], old_logprobs=True)
  assert out["old_logprobs"] == fwd and out["step"] == 6 * fwd and out["update"] == 4 * fwd
  with pytest.raises(ValueError, match="completion_lens_N"):
    flops.step_flops(TINY, [1, 2], [1])


def test_step_flops_matches_the_issue_estimate_for_bench_small():
  """bench-small (64 rows, 10-token prompts, 128 new tokens) by hand: layer matmuls 3.93 M params × 2 × 138 tokens
  × 64 rows = 69.4 GFLOP a forward, five forwards' worth (rollout, reference, policy fwd+bwd) = 347; LM head
  2 × 256 × 2048 × 128 × 64 = 8.6 a forward, ×5 = 43; causal attention 4·4·8·32 per (query, key) pair × ~9.5k pairs
  × 64 rows × 5 = 12.5: ≈0.40 TFLOP."""
  small = model_lib.ModelConfig(vocab_size=2048, hidden=256, layers=4, heads=8, kv_heads=4, inter=1024, max_len=160)
  total = flops.step_flops(small, [10] * 64, [128] * 64)["step"]
  assert 0.38e12 < total < 0.43e12, total


def test_decode_bytes_hand_count():
  # weights: matmul params 4·2·2 + 4·1·2·2 + 2·2·4 + 3·4·8 = 16+16+16+96 = 144, + embedding 40 = 184 -> 736 B/step
  # one slot of K+V: 2·1·1·2·4 B = 16 B; 2 rows, prompt 3, 2 steps: reads 4 + 5 slots, writes 2 slots
  want = 736 * 2 + 2 * 16 * (4 + 5) + 2 * 16 * 2
  assert flops.decode_bytes(TINY, n=2, prompt_len=3, new_tokens=2) == want


def test_device_peak_lookup():
  assert flops.device_peak("TPU v5p")["hbm"] == 2.765e12
  assert flops.device_peak("TPU v5") is flops.device_peak("TPU v5p")  # a v5p TPU VM's device_kind
  assert flops.device_peak("NVIDIA H100 PCIe")["bf16"] == 756e12  # not the SXM card's row
  assert flops.device_peak("TPU v5 lite")["bf16"] == 197e12
  assert flops.device_peak("NVIDIA H100 80GB HBM3")["bf16"] == 989e12
  assert flops.device_peak("cpu") is None
  assert np.isclose(flops.device_peak("NVIDIA H200")["hbm"], 4.8e12)
