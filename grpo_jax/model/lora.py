"""LoRA adapters (PEFT's conventions) for the decoder's projections: their params, init, axes, and the merge.

Adapters tree, beside the base params' own layout ([layers, ...] stacked under nn.scan):

  layers/<m>/lora_a   [L, in..., r]    A, kaiming-uniform(a=√5) as PEFT initialises lora_A: U(±1/√fan_in)
  layers/<m>/lora_b   [L, r, out...]   B, zeros: the policy at step 0 is the base exactly

for each targeted module m among q, k, v, o, gate, up, down (PEFT: q_proj ... down_proj; in/out as in the kernel:
q is [D] -> [H, Dh], o is [H, Dh] -> [D]). The forward (model.Dense) adds scale·(x·A)·B; the base params alone run
the plain model, which is how the reference log-probs come for free. Decode and export merge W + scale·A·B.
"""
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from grpo_jax.model import model as model_lib
from grpo_jax.model.model_config import DTYPES, LoraConfig, ModelConfig

Params = Any
ADAPTER_KEYS = ("lora_a", "lora_b")


def _n_in(module: str) -> int:
  return 2 if module == "o" else 1  # o contracts [heads, head_dim]


def adapter_shapes(mcfg: ModelConfig) -> Params:
  """The adapters' ShapeDtypeStructs (float32), from the base kernels' shapes."""
  lc = _lora(mcfg)
  kernels = model_lib.param_shapes(mcfg)["layers"]
  out = {}
  for m in lc.modules:
    shape = kernels[m]["kernel"].shape  # [L, in..., out...]
    n_in = _n_in(m)
    ins, outs = shape[1:1 + n_in], shape[1 + n_in:]
    out[m] = {"lora_a": jax.ShapeDtypeStruct((shape[0],) + ins + (lc.rank,), jnp.float32),
              "lora_b": jax.ShapeDtypeStruct((shape[0], lc.rank) + outs, jnp.float32)}
  return {"layers": out}


def adapter_axes(mcfg: ModelConfig) -> Params:
  """Logical axes of the adapters: A keeps the kernel's input axes, B its output axes, the rank unsharded."""
  lc = _lora(mcfg)
  axes = model_lib.param_axes(mcfg)["layers"]
  out = {}
  for m in lc.modules:
    spec = tuple(axes[m]["kernel"])  # (layers, in..., out...)
    n_in = _n_in(m)
    out[m] = {"lora_a": PartitionSpec(*spec[:1 + n_in], None),
              "lora_b": PartitionSpec(spec[0], None, *spec[1 + n_in:])}
  return {"layers": out}


def init_adapters(mcfg: ModelConfig, rng: jax.Array) -> Params:
  """A ~ U(±1/√fan_in) (PEFT: kaiming_uniform_(lora_A.weight, a=√5), fan_in = the input features), B = 0."""
  shapes = adapter_shapes(mcfg)["layers"]
  keys = jax.random.split(rng, len(shapes))
  out = {}
  for key, (m, s) in zip(keys, sorted(shapes.items())):
    a = s["lora_a"]
    bound = 1.0 / math.prod(a.shape[1:-1]) ** 0.5
    out[m] = {"lora_a": jax.random.uniform(key, a.shape, jnp.float32, -bound, bound),
              "lora_b": jnp.zeros(s["lora_b"].shape, jnp.float32)}
  return {"layers": out}


def _held(path, x, dt):
  """The base as the LoRA state holds it: matmul weights (kernels, the embedding table, the head) in base_dtype,
  norms and biases float32."""
  return x if path[-1].key in ("scale", "bias") else jax.ShapeDtypeStruct(x.shape, dt) if isinstance(
      x, jax.ShapeDtypeStruct) else x.astype(dt)


def base_shapes(mcfg: ModelConfig) -> Params:
  """The frozen base's ShapeDtypeStructs as the state holds it (hold_base)."""
  dt = DTYPES[_lora(mcfg).base_dtype]
  return jax.tree_util.tree_map_with_path(lambda p, x: _held(p, x, dt), model_lib.param_shapes(mcfg))


def hold_base(mcfg: ModelConfig, params: Params) -> Params:
  """Base params in the dtypes the LoRA state holds them (base_shapes)."""
  dt = DTYPES[_lora(mcfg).base_dtype]
  return jax.tree_util.tree_map_with_path(lambda p, x: _held(p, x, dt), params)


def combine(base: Params, adapters: Params) -> Params:
  """The policy's params: the base tree with each targeted module's lora_a/lora_b beside its kernel (no copy)."""
  layers = dict(base["layers"])
  for m, ab in adapters["layers"].items():
    layers[m] = {**base["layers"][m], **ab}
  return {**base, "layers": layers}


def is_adapted(params: Params) -> bool:
  return any(set(ADAPTER_KEYS) <= set(p) for p in params.get("layers", {}).values() if isinstance(p, dict))


def merge_kernel(kernel: jax.Array, a: jax.Array, b: jax.Array, scale: float, dtype=None) -> jax.Array:
  """W + scale·A·B of one (unstacked) kernel [in..., out...], summed in float32, returned in `dtype` (default: the
  kernel's)."""
  delta = jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
  return (kernel.astype(jnp.float32) + scale * delta).astype(dtype or kernel.dtype)


def merge_module(mcfg: ModelConfig, name: str, p: dict, dtype=None) -> dict:
  """One module's params (one layer, or stacked) with its adapter merged into the kernel (in `dtype`, default the
  kernel's) and dropped."""
  if "lora_a" not in p:
    return p
  kernel = _merge_jit(p["kernel"], p["lora_a"], p["lora_b"], scale=_lora(mcfg).scale, dtype=dtype,
                      stacked=_is_stacked(p, _n_in(name)))
  return {k: v for k, v in p.items() if k not in ADAPTER_KEYS} | {"kernel": kernel}


# One program per module shape. Called eagerly (the export's merge), each of merge_kernel's ops was its own XLA
# program compiled per shape (a casts, a dot, a scale, an add: ~60 ms of compiles per module on the CPU, in every
# export); jitted, one. Each module stays its own call, so the peak is today's: one module's float32 temporaries
# beside the params, and leaves without adapters (the embedding) never enter a program. Under a caller's jit
# (decode) it is traced inline as before. The values equal the eager ops' bit for bit (tests/test_lora.py).
@functools.partial(jax.jit, static_argnames=("scale", "dtype", "stacked"))
def _merge_jit(kernel, a, b, *, scale: float, dtype, stacked: bool):
  merge = lambda w, a, b: merge_kernel(w, a, b, scale, dtype)
  return jax.vmap(merge)(kernel, a, b) if stacked else merge(kernel, a, b)


def _is_stacked(p: dict, n_in: int) -> bool:
  """A stacked (layers-leading) module: A has one axis more than its n_in input axes and the rank."""
  return p["lora_a"].ndim == n_in + 2


def merged(mcfg: ModelConfig, params: Params, dtype=None) -> Params:
  """The base-shaped params of a policy (combine's output): every adapter folded into its kernel. `dtype`: the
  merged kernels' (export passes float32: a bfloat16 base's W + scale·A·B rounded to bfloat16 lost a small delta)."""
  if not is_adapted(params):
    return params
  layers = {m: merge_module(mcfg, m, p, dtype) for m, p in params["layers"].items()}
  return {**params, "layers": layers}


def _lora(mcfg: ModelConfig) -> LoraConfig:
  if mcfg.lora is None:
    raise ValueError("model.lora.rank=0: this model has no adapters; set model.lora.rank > 0.")
  return mcfg.lora
