"""Two of the planner's byte terms (memory_plan.py sums them): one layer's attention working set per path, and the
continuous engine's rollout (shared prompt KV, slot KV, one prefill over the B prompts)."""
import math

from grpo_jax.model import attention
from grpo_jax.rl import row_chunks
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import engine as engine_lib
from grpo_jax.rollout import turns

BYTES = {"float32": 4, "bfloat16": 2}

def attention_bytes(path: str, rows: int, t: int, h: int, k: int, dh: int, cb: int, backward: bool) -> int:
  """Working set of one layer's training/prefill attention over `rows` rows of t positions on `path` (an
  `attention.choose` result), per device. The einsum paths hold fp32 [rows, heads, t, t] scores (and, backward,
  their gradient): quadratic. The O(T) paths hold per-token arrays whose count was read off compiled buffer
  assignments (docs/scale.md): blockwise on XLA:CPU keeps ~16 fp32 [rows, t, (h+k)·dh] arrays live in the backward
  (q/k/v/o/dO in [blocks, ...] layout, the dq/dk/dv accumulators, transposed copies) and ~6 in the forward, plus a
  few fp32 block×block score tiles; splash on TPU keeps its fp32 softmax residuals (max, logsumexp) lane-replicated
  as [rows, h, t, 128] and q/k/v/o/dO copies in the head-major layout it needs; cuDNN keeps a logsumexp and the
  same copies; pallas_gpu (packed rows on GPU) is modelled as cuDNN with K/V repeated to the query heads."""
  if path in ("xla", "dot_product"):
    return rows * h * t * t * (2 * 4 if backward else 4 + cb)
  if path == "blockwise":
    b = min(attention.BLOCK, -(-t // 8) * 8)
    tp = -(-t // b) * b
    return rows * tp * (16 if backward else 6) * (h + k) * dh * 4 + 4 * rows * h * b * b * 4
  if path == "splash":
    tp = -(-t // 128) * 128
    return rows * tp * ((3 if backward else 2) * h * 128 * 4 + (4 if backward else 2) * (h + k) * dh * cb)
  if path == "cudnn":
    return rows * t * (h * 4 + (4 if backward else 2) * (h + k) * dh * cb)
  if path == "pallas_gpu":  # as cuDNN, with K and V repeated to the h query heads (not read off a compile)
    return rows * -(-t // 128) * 128 * (h * 4 + (4 if backward else 2) * 3 * h * dh * cb)
  raise ValueError(f"attention path {path!r}: use one of {list(attention.IMPLEMENTATIONS[1:])}.")


def continuous_rollout_bytes(config, mcfg, mesh: dict[str, int], decode, n_prompts: int, P: int, L: int,
                             path) -> dict[str, int]:
  """rollout/engine.py's decode: the prompts' KV once ([B, P], not B·G), the S slots' completion KV ([S, Lc]), one
  prefill over the B prompts; replaces the static engine's per-chunk [rows, P + L] cache and prefill. With the
  paged store (sampling.decode_attention paged / tpu_ragged) its pages instead."""
  n = n_prompts * config.rl.G
  s = row_chunks.slots_for(config, n)
  lc = -(-L // min(engine_lib.KV_BLOCK, L)) * min(engine_lib.KV_BLOCK, L)
  dp, tp = mesh["data"] * mesh["fsdp"], mesh["tensor"]
  cb = BYTES[mcfg.dtype]
  k_dev = mcfg.kv_heads // tp if mcfg.kv_heads % tp == 0 else mcfg.kv_heads
  b_dev = math.ceil(n_prompts / dp)
  # each device's block of the prompt table (engine.prompt_table: more than B/D when a group spans devices)
  t_dev = engine_lib.prompt_table(n_prompts, config.rl.G, dp)[0].shape[1] if n % dp == 0 else b_dev
  f_dev = mcfg.inter // tp if mcfg.inter % tp == 0 else mcfg.inter
  h_dev = mcfg.heads // tp if mcfg.heads % tp == 0 else mcfg.heads
  prompt_kv = lambda prompts, tokens: 2 * mcfg.layers * prompts * k_dev * mcfg.head_dim * tokens * cb
  if config.sampling.get("decode_attention", "auto") in ("paged", "tpu_ragged"):
    # model/paged_attention.py: each slot's own pages (ceil((Z - 1 + L) / Z) of Z tokens), and every prompt's full
    # pages on every device (the pool holds them all, though a device's rows read only its prompt-table block)
    z = int(config.sampling.page_size)
    out = decode_layout.rollout_bytes(mcfg, mesh, decode, s, -(-(z - 1 + L) // z) * z)
    kv = {"slot kv pages (S x own pages)": out.pop("kv cache"),
          "prompt kv pages (all B prompts per device)": prompt_kv(n_prompts, P // z * z)}
  else:
    out = decode_layout.rollout_bytes(mcfg, mesh, decode, s, lc)  # the slots' KV and logits, the decode weights
    kv = {"slot kv cache (S x L)": out.pop("kv cache"), "prompt kv cache (B x P)": prompt_kv(t_dev, P)}
  return dict(out, **kv, **{
      "prefill layer": (b_dev * P * (3 * mcfg.hidden + 2 * f_dev) * cb
                        + attention_bytes(path(n_prompts, P), b_dev, P, h_dev, k_dev, mcfg.head_dim, cb,
                                          backward=False))})


def carry_bytes(config, mcfg, mesh: dict[str, int]) -> dict[str, int]:
  """rl.partial_rollouts: the rollout carry the state holds across steps, per device (rollout/carry.py): the table's
  (1 + max_staleness)·B groups' prompts and prompt KV, their rows' tokens / behaviour log-probs / versions / masks /
  uniforms (int32 or float32 each, [R, L]) and the S slots' completion KV — the continuous engine's slot and prompt
  buffers, now resident. The KV is in the sampler's dtype (sampling.dtype, '' = the model's): what carry.init
  allocates."""
  rl = config.rl
  L, P = config.sampling.max_new_tokens, config.task.prompt_len
  Q = (1 + int(rl.max_staleness)) * rl.prompts_per_step
  R, S = Q * rl.G, int(config.sampling.get("slots", 0)) or rl.prompts_per_step * rl.G
  dp, tp = mesh["data"] * mesh["fsdp"], mesh["tensor"]
  cb = BYTES[config.sampling.get("dtype", "") or mcfg.dtype]
  k_dev = mcfg.kv_heads // tp if mcfg.kv_heads % tp == 0 else mcfg.kv_heads
  lc = -(-L // min(engine_lib.KV_BLOCK, L)) * min(engine_lib.KV_BLOCK, L)
  kv = lambda rows, tokens: 2 * mcfg.layers * math.ceil(rows / dp) * k_dev * mcfg.head_dim * tokens * cb
  out = {"carry rows (tokens, log-probs, versions, masks, uniforms: R x L)": math.ceil(R / dp) * L * 20,
         "carry prompts and their KV (Q x P)": math.ceil(Q / dp) * P * 8 + kv(Q, P),
         "carry slot kv (S x L)": kv(S, lc)}
  tools = config.get("tools")
  if tools is not None and tools.get("env"):  # multi-turn rows: what the environment did per row, each slot's turn
    out["carry environment rows (observation mask, rewards, steps: R x L)"] = (
        math.ceil(R / dp) * (L * 12 + 4 * turns.EVENTS))
    out["carry turn state (S x observation)"] = math.ceil(S / dp) * (10 + 4 * int(tools.max_obs_tokens))
  return out

