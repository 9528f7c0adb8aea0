"""Shape and numerics of the decoder: one frozen dataclass, checked at construction, usable as a static jit arg."""
import dataclasses
from typing import Any

import jax.numpy as jnp

from grpo_jax.model import attention

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
REMAT_MODES = ("none", "full", "dots")
UNROLL_MODES = ("none", "all", "auto")
UNROLL_MAX_LAYERS = 8  # 'auto' unrolls models this shallow; unrolled, compile time grows with every layer
# LoRA targets by PEFT's Qwen2/Llama module names -> our Dense names in a Block (model.py).
LORA_TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
                "down_proj": "down"}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Low-rank adapters on the targeted projections (PEFT's conventions): y = x·W + scale·(x·A)·B, with
  scale = alpha / rank (rsLoRA: alpha / sqrt(rank)). model/lora.py holds the adapters; rank 0 = no LoRA (None)."""
  rank: int
  alpha: float
  targets: tuple[str, ...] = tuple(LORA_TARGETS)
  rslora: bool = False
  base_dtype: str = "float32"  # the frozen base's matmul weights as the state holds them (adapters stay float32)

  def __post_init__(self):
    if int(self.rank) < 1:
      raise ValueError(f"model.lora.rank={self.rank}: must be >= 1 here (0 turns LoRA off).")
    if not self.alpha > 0:
      raise ValueError(f"model.lora.alpha={self.alpha}: must be > 0 (scale = alpha / rank).")
    bad = [t for t in self.targets if t not in LORA_TARGETS]
    if bad or not self.targets or len(set(self.targets)) != len(self.targets):
      raise ValueError(f"model.lora.targets={tuple(self.targets)}: name each once, among {tuple(LORA_TARGETS)}.")
    object.__setattr__(self, "targets", tuple(self.targets))
    if self.base_dtype not in DTYPES:
      raise ValueError(f"model.lora.base_dtype={self.base_dtype!r}: use one of {sorted(DTYPES)}.")

  @property
  def scale(self) -> float:
    return float(self.alpha) / (float(self.rank) ** 0.5 if self.rslora else float(self.rank))

  @property
  def modules(self) -> tuple[str, ...]:
    """Our Dense names of the targets (Block in model.py)."""
    return tuple(LORA_TARGETS[t] for t in self.targets)

  @classmethod
  def from_dict(cls, d: Any) -> "LoraConfig | None":
    """From `model.lora` (a dict or ConfigDict); None when rank is 0."""
    d = d.to_dict() if hasattr(d, "to_dict") else dict(d)
    if int(d.get("rank", 0)) == 0:
      return None
    return cls(int(d["rank"]), float(d["alpha"]), tuple(d.get("targets", tuple(LORA_TARGETS))),
               bool(d.get("rslora", False)), str(d.get("base_dtype", "float32")))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of the decoder. `head_dim=0` resolves to `hidden // heads` at construction."""
  vocab_size: int = 512
  hidden: int = 64
  layers: int = 2
  heads: int = 4
  kv_heads: int = 2
  head_dim: int = 0
  inter: int = 192
  rope_theta: float = 10_000.0
  qkv_bias: bool = True
  tie_embeddings: bool = True
  max_len: int = 160
  dtype: str = "float32"  # compute dtype; params stay float32
  rms_eps: float = 1e-6
  remat: str = "none"  # none | full | dots
  # 'all' unrolls the layer scan of training and prefill: no stacked scan residuals to zero-fill and copy in the
  # backward pass, no per-layer weight slices (update 0.83x the time at bench-small on XLA:CPU), but compile time
  # grows with depth. 'none' scans. 'auto' = 'all' up to UNROLL_MAX_LAYERS layers, else 'none'. Decode always runs
  # layer by layer (`decode_step`).
  layer_unroll: str = "auto"
  # Training/prefill attention path (attention.py): 'auto' (TPU: splash kernel; GPU: cuDNN flash under bf16, else
  # blockwise; CPU: einsum below a measured T, blockwise above), or one of them by name: 'xla' (einsum, O(T²)),
  # 'blockwise' (O(T) memory, any backend), 'splash', 'cudnn' (bf16 only), 'dot_product', 'pallas_gpu' (what packed
  # rows take on a GPU). Decode attends to its KV cache (static sampler: an einsum over the transpose-free cache
  # layout; continuous engine: live_attention.py or paged_attention.py).
  attention: str = "auto"
  # Llama-3.1 ("llama3") RoPE frequency scaling; factor 0 = off.
  rope_scaling_factor: float = 0.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  # LoRA (model/lora.py): the forward adds each targeted Dense's adapter term when the params carry one; the base
  # params alone (the reference) run the plain model. None = no LoRA.
  lora: LoraConfig | None = None

  def __post_init__(self):
    for name in ("vocab_size", "hidden", "layers", "heads", "kv_heads", "inter", "max_len"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"model.{name}={getattr(self, name)}: must be a positive integer.")
    if self.kv_heads > self.heads or self.heads % self.kv_heads:
      raise ValueError(f"model.kv_heads={self.kv_heads}: must divide model.heads={self.heads} (GQA groups); "
                       "choose a divisor of heads.")
    if self.head_dim == 0:
      if self.hidden % self.heads:
        raise ValueError(f"model.head_dim=0 needs hidden % heads == 0 (got {self.hidden} % {self.heads}); "
                         "set model.head_dim explicitly.")
      object.__setattr__(self, "head_dim", self.hidden // self.heads)
    if self.head_dim < 0 or self.head_dim % 2:
      raise ValueError(f"model.head_dim={self.head_dim}: must be even (RoPE rotates pairs) or 0 for hidden//heads.")
    if self.dtype not in DTYPES:
      raise ValueError(f"model.dtype={self.dtype!r}: use one of {sorted(DTYPES)}.")
    if self.remat not in REMAT_MODES:
      raise ValueError(f"model.remat={self.remat!r}: use 'none', 'full' or 'dots'.")
    if self.layer_unroll not in UNROLL_MODES:
      raise ValueError(f"model.layer_unroll={self.layer_unroll!r}: use one of {sorted(UNROLL_MODES)}.")
    if self.layer_unroll == "auto":
      object.__setattr__(self, "layer_unroll", "all" if self.layers <= UNROLL_MAX_LAYERS else "none")
    if self.attention not in attention.IMPLEMENTATIONS:
      raise ValueError(f"model.attention={self.attention!r}: use one of {list(attention.IMPLEMENTATIONS)}.")
    if self.attention == "cudnn" and self.dtype != "bfloat16":
      raise ValueError(f"model.attention='cudnn' needs model.dtype='bfloat16' (cuDNN flash attention has no "
                       f"{self.dtype} kernel); set model.dtype=bfloat16 or model.attention=auto.")
    if self.rope_theta <= 0:
      raise ValueError(f"model.rope_theta={self.rope_theta}: must be > 0.")
    if self.rms_eps <= 0:
      raise ValueError(f"model.rms_eps={self.rms_eps}: must be > 0.")
    if self.rope_scaling_factor < 0 or (self.rope_scaling_factor > 0 and not (
        0 < self.rope_low_freq_factor < self.rope_high_freq_factor and self.rope_original_max_len > 0)):
      raise ValueError("model.rope_scaling_factor / rope_*_freq_factor / rope_original_max_len: need factor >= 0 and, "
                       "when it is > 0, 0 < low_freq_factor < high_freq_factor and original_max_len > 0.")

  @classmethod
  def from_config(cls, cfg: Any) -> "ModelConfig":
    """From an ml_collections ConfigDict (or dict) with these field names; other keys are ignored."""
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    kw = {}
    for f in dataclasses.fields(cls):
      if f.name == "lora":
        kw["lora"] = LoraConfig.from_dict(d["lora"]) if d.get("lora") else None
      elif f.name in d:
        kw[f.name] = type(f.default)(d[f.name]) if f.type in ("int", "float", int, float) else d[f.name]
    return cls(**kw)

  @property
  def compute_dtype(self) -> Any:
    return DTYPES[self.dtype]
