"""Analytic model FLOPs and decode memory traffic of a GRPO step, for FLOP/s, MFU and HBM-bandwidth figures.

XLA's cost analysis counts a `lax.scan` body once (docs/performance.md, "XLA:CPU facts"), so the benchmark counts by hand instead: matmul FLOPs
only (2 per multiply-add), real tokens only, causal attention over the keys a token actually sees, the LM head only
where a log-prob is used, no recomputation (remat) counted. A backward pass costs twice its forward.
"""
from typing import Sequence

import numpy as np

from grpo_jax.model import model as model_lib

# Dense peak FLOP/s and HBM bytes/s, by `jax.devices()[0].device_kind` prefix (longest match). Vendor datasheet
# figures; only used to print MFU and the decode bandwidth fraction on an accelerator. 'fp32' is the rate of a float32
# matmul at JAX's default precision, which is what the model's float32 matmuls run at (no precision is set in this
# package): one bfloat16 pass on a TPU (its bf16 peak), TF32 tensor cores on an A100/H100/H200 (half the bf16
# peak), not the CUDA-core FP32 rate (19.5 / 67 TFLOP/s), against which an fp32 step's MFU could pass 100%.
# A v5p TPU VM reports device_kind "TPU v5" (Pathways: "TPU v5p"); v5e and v6e report "TPU v5 lite", "TPU v6 lite".
_V5P = dict(bf16=459e12, fp32=459e12, hbm=2.765e12)
PEAKS: dict[str, dict[str, float]] = {
    "TPU v4": dict(bf16=275e12, fp32=275e12, hbm=1.2e12),
    "TPU v5 lite": dict(bf16=197e12, fp32=197e12, hbm=0.819e12),
    "TPU v5": _V5P,
    "TPU v5p": _V5P,
    "TPU v6 lite": dict(bf16=918e12, fp32=918e12, hbm=1.64e12),
    "NVIDIA A100": dict(bf16=312e12, fp32=156e12, hbm=2.039e12),  # the 80 GB SXM4 card
    "NVIDIA A100-SXM4-40GB": dict(bf16=312e12, fp32=156e12, hbm=1.555e12),
    "NVIDIA A100-PCIE-40GB": dict(bf16=312e12, fp32=156e12, hbm=1.555e12),
    "NVIDIA H100": dict(bf16=989e12, fp32=494.5e12, hbm=3.35e12),  # SXM5 ("NVIDIA H100 80GB HBM3")
    "NVIDIA H100 PCIe": dict(bf16=756e12, fp32=378e12, hbm=2.0e12),
    "NVIDIA H200": dict(bf16=989e12, fp32=494.5e12, hbm=4.8e12),
}


def device_peak(device_kind: str) -> dict[str, float] | None:
  """The PEAKS row whose key prefixes `device_kind` (longest match), or None (e.g. on a CPU)."""
  hits = [k for k in PEAKS if device_kind.startswith(k)]
  return PEAKS[max(hits, key=len)] if hits else None


def _per_token_matmul(mcfg: model_lib.ModelConfig) -> int:
  """Weight-matmul FLOPs of one token through all layers (projections and SwiGLU MLP, no LM head)."""
  d, hd = mcfg.hidden, mcfg.head_dim
  attn = d * mcfg.heads * hd * 2 + d * mcfg.kv_heads * hd * 2  # q and o; k and v
  mlp = 3 * d * mcfg.inter
  return 2 * mcfg.layers * (attn + mlp)


def forward_flops(mcfg: model_lib.ModelConfig, seq_len: int, scored: int) -> int:
  """One causal forward over `seq_len` real tokens with the LM head at `scored` positions."""
  if seq_len < 0 or not 0 <= scored <= seq_len:
    raise ValueError(f"seq_len={seq_len}, scored={scored}: need 0 <= scored <= seq_len.")
  keys_seen = seq_len * (seq_len + 1) // 2  # token t attends to t keys (itself and those before it)
  attn_scores = 2 * 2 * mcfg.layers * mcfg.heads * mcfg.head_dim * keys_seen  # QK^T and PV
  return _per_token_matmul(mcfg) * seq_len + attn_scores + 2 * mcfg.hidden * mcfg.vocab_size * scored


def step_flops(mcfg: model_lib.ModelConfig, prompt_lens_N: Sequence[int],
               completion_lens_N: Sequence[int], old_logprobs: bool = False) -> dict[str, float]:
  """FLOPs of one GRPO step (μ=1, one minibatch) from each row's real prompt and completion lengths.

  rollout = prefill + decode = one forward with the head at the completion positions; reference = the same
  forward; policy = forward + backward (3×). update = policy + reference, step = rollout + update, plus with
  `old_logprobs` (correction.needs_proximal: bf16, a correction, partial rollouts) the old-log-prob forward the step
  runs at the current params.
  """
  p = np.asarray(prompt_lens_N, np.int64)
  c = np.asarray(completion_lens_N, np.int64)
  if p.shape != c.shape or p.ndim != 1:
    raise ValueError(f"prompt_lens_N {p.shape} and completion_lens_N {c.shape}: need equal 1-D shapes.")
  fwd = float(sum(forward_flops(mcfg, int(a + b), int(b)) for a, b in zip(p, c)))
  out = dict(rollout=fwd, reference=fwd, policy_fwd_bwd=3 * fwd)
  out["update"] = out["policy_fwd_bwd"] + out["reference"]
  out["step"] = out["rollout"] + out["update"]
  if old_logprobs:
    out["old_logprobs"] = fwd
    out["step"] += fwd
  return out


def decode_bytes(mcfg: model_lib.ModelConfig, n: int, prompt_len: int, new_tokens: int,
                 param_bytes: int = 4, cache_bytes: int = 4) -> float:
  """Least HBM traffic of a rollout's decode steps: every step reads all weights once and, per row, the K/V of
  the slots it attends to, and writes one slot. The floor that decode's bandwidth fraction is measured against."""
  weights = (_per_token_matmul(mcfg) // 2 + mcfg.vocab_size * mcfg.hidden) * param_bytes  # params read per step
  per_slot = 2 * mcfg.layers * mcfg.kv_heads * mcfg.head_dim * cache_bytes  # K and V of one token
  steps = np.arange(new_tokens)  # step i attends to prompt_len + i + 1 slots (writing the last)
  kv = n * per_slot * float(np.sum(prompt_len + steps + 1)) + n * per_slot * new_tokens
  return float(weights * new_tokens + kv)
