"""Bytes per device of one RL step for a config × mesh, from shapes alone (no compile, no devices).

Why: a 7B policy + reference + Adam state on a TPU slice either fits or it does not, and the answer should come
in a second, before any compile. The planner mirrors how `rl_step` holds memory: the state (policy, the reference
only when β > 0, Adam's two moments, a critic for PPO) is resident; the step's temporaries peak in the sampling
(KV cache and decode logits of one `rl.rollout_chunks` chunk of rows), in the reference / old-log-prob forwards
(one chunk of rows, no gradient) or in the update (gradients, activations saved under the remat policy for one
minibatch, one layer's recomputed working set with its attention, one chunk of logits). Attention is costed for
the path `model.attention` takes on the target backend (`attention.choose`): O(T) for splash, blockwise and cuDNN,
T×T scores only for the einsum path. `aot.py` checks it against XLA's own figures (docs/scale.md). The command
line (perf/plan_cli.py):

  python -m grpo_jax.memory_plan --model=qwen2.5-1.5b --mesh data=1,fsdp=64,tensor=1 --prompts 16 --G 8 \
      --prompt-len 256 --L 512 --hbm-gib 16
"""
import dataclasses
import functools
import math
from typing import Any

import jax
import ml_collections

from grpo_jax.model import attention
from grpo_jax.rl import correction
from grpo_jax.config import config_lib
from grpo_jax.infra.errors import ConfigError
from grpo_jax.rollout import decode_layout
from grpo_jax.model import lora
from grpo_jax.model import model as model_lib
from grpo_jax.model import model_presets
from grpo_jax.config import presets
from grpo_jax.rl import packing
from grpo_jax.rl import plan_terms
from grpo_jax.rl import state as state_lib
from grpo_jax.infra import sharding

GiB = 1024 ** 3

# The real models' shapes come from grpo_jax/model/model_presets.py (the one table configs use too: Qwen2.5 with q/k/v
# biases and θ 1e6, Qwen2.5-Math with θ 1e4, Llama-3.x without biases, θ 5e5 and llama3 RoPE scaling).
PRESETS: dict[str, dict[str, Any]] = {k: dict(v) for k, v in model_presets.PRESETS.items()}
# Toys of the same family for tests and quick compiles; "small" has TPU-tile-friendly (128-multiple) dims so that
# XLA's TPU padding does not dominate its byte counts.
PRESETS["tiny"] = dict(hidden=64, layers=2, heads=4, kv_heads=2, inter=128, vocab_size=512, tie_embeddings=True,
                       rope_theta=1e4, qkv_bias=True, head_dim=0)
PRESETS["small"] = dict(hidden=256, layers=2, heads=2, kv_heads=1, inter=512, vocab_size=1024,
                        tie_embeddings=True, rope_theta=1e4, qkv_bias=True, head_dim=0)

_BYTES = plan_terms.BYTES
# The rollout / score phases' copy of the update's saved activations on TPU (plan(): XLA allocates them early).
HELD_EARLY = "update's saved inputs, early"
PREFILL_HEAD = "lm head, gathered (prefill)"


def parse_mesh(text: str) -> dict[str, int]:
  """'data=1,fsdp=16,tensor=1' → dict; missing axes are 1, one axis may be -1."""
  shape = {a: 1 for a in sharding.MESH_AXES}
  for part in filter(None, text.split(",")):
    key, _, val = part.partition("=")
    if key not in shape or not val.lstrip("-").isdigit():
      raise ValueError(f"--mesh: bad entry {part!r}; write e.g. data=1,fsdp=16,tensor=1 "
                       f"(axes {', '.join(sharding.MESH_AXES)}).")
    shape[key] = int(val)
  return shape


def workload_config(model: str = "tiny", prompts: int = 16, G: int = 8, prompt_len: int = 256, L: int = 512,
                    mesh: dict[str, int] | None = None, dtype: str = "bfloat16", remat: str = "full",
                    minibatches: int = 1, mu: int = 1, algo: str = "grpo",
                    rollout_chunks: int = 1, engine: str = "static", slots: int = 0, lora_rank: int = 0,
                    lora_base_dtype: str = "float32", packing: bool | str = False,
                    pack_rows: int = 0, partial_rollouts: bool = False, max_staleness: int = 1,
                    rollout_budget: int = 0, carry_kv: str = "keep") -> ml_collections.ConfigDict:
  """The peers' GRPO workload (β=0.04 unless the preset `algo` says otherwise, μ=1, lr 1e-5, T=1) on a named model
  shape: what `aot` compiles. lora_rank > 0: LoRA on all seven projections, alpha = 2·rank."""
  if model not in PRESETS:
    raise ValueError(f"--model={model!r}: choose one of {sorted(PRESETS)}.")
  c = presets.apply(config_lib.base_config(), algo)
  c.model.update(PRESETS[model], max_len=prompt_len + L, dtype=dtype, remat=remat)
  c.sampling.update(temperature=1.0, max_new_tokens=L, engine=engine, slots=slots)
  c.task.prompt_len = prompt_len
  c.rl.update(G=G, prompts_per_step=prompts, mu=mu, minibatches=minibatches, rollout_chunks=rollout_chunks,
               packing=config_lib.switch(packing), pack_rows=pack_rows, partial_rollouts=partial_rollouts,
               max_staleness=max_staleness, rollout_budget=rollout_budget, carry_kv=carry_kv)
  if presets.PRESETS[algo]["rl.beta"] > 0:
    c.rl.beta = 0.04
  c.optim.update(lr=1e-5, grad_clip=1.0)
  c.mesh.update(mesh or dict(data=1, fsdp=-1, tensor=1))
  c.train.num_samples_logged = 1
  c.eval.batch = prompts
  if lora_rank:
    c.model.lora.update(rank=lora_rank, alpha=2.0 * lora_rank, base_dtype=lora_base_dtype)
  return c


def _shard_divisor(spec, mesh: dict[str, int]) -> int:
  div = 1
  for axes in sharding.logical_to_mesh_spec(spec):
    if axes is None:
      continue
    for a in (axes if isinstance(axes, tuple) else (axes,)):
      div *= mesh[a]
  return div


def param_bytes_per_device(mcfg: model_lib.ModelConfig, mesh: dict[str, int]) -> tuple[int, int]:
  """(bytes on one device, parameter count) of one fp32 param tree sharded by the logical rules."""
  return _param_bytes(mcfg, tuple(sorted(mesh.items())))


@functools.lru_cache(maxsize=64)  # tracing a 7B init takes seconds; plans for one model reuse it
def _param_bytes(mcfg: model_lib.ModelConfig, mesh_items: tuple, subtree: str = "") -> tuple[int, int]:
  """(bytes on one device, count) of the params (subtree "lora": the fp32 LoRA adapters, lora.adapter_axes)."""
  if subtree == "lora":
    abstract, specs = lora.adapter_shapes(mcfg), lora.adapter_axes(mcfg)
  else:
    abstract, specs = model_lib.param_shapes(mcfg), model_lib.param_axes(mcfg)
    if subtree:
      abstract, specs = abstract[subtree], specs[subtree]
  leaves = jax.tree.leaves(abstract)
  spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  per_dev = sum(math.ceil(x.size / _shard_divisor(s, dict(mesh_items))) * x.dtype.itemsize
                for x, s in zip(leaves, spec_leaves))
  return per_dev, sum(x.size for x in leaves)


@dataclasses.dataclass
class Plan:
  """Per-device bytes by component; `resident` is held across steps, the peak adds the largest phase: sampling
  (`rollout`), the reference / old-log-prob forwards over the samples (`score`), or the `update`."""
  resident: dict[str, int]
  rollout: dict[str, int]
  update: dict[str, int]
  params: int  # parameter count of one model
  score: dict[str, int] = dataclasses.field(default_factory=dict)

  def _phases(self) -> dict[str, int]:
    return {"rollout": sum(self.rollout.values()), "score": sum(self.score.values()),
            "update": sum(self.update.values())}

  @property
  def resident_bytes(self) -> int:
    return sum(self.resident.values())

  @property
  def temp_bytes(self) -> int:
    return max(self._phases().values())

  @property
  def peak_phase(self) -> str:
    ph = self._phases()
    return max(ph, key=ph.get)

  @property
  def total_bytes(self) -> int:
    return self.resident_bytes + self.temp_bytes

  def as_dict(self) -> dict[str, Any]:
    return dict(resident=self.resident, rollout=self.rollout, score=self.score, update=self.update,
                params=self.params, resident_bytes=self.resident_bytes, temp_bytes=self.temp_bytes,
                total_bytes=self.total_bytes, peak_phase=self.peak_phase)


def plan(config: ml_collections.ConfigDict, mesh: dict[str, int], plat: str | None = None, decode: Any = None,
         hbm_bytes: int | None = None) -> Plan:
  """Per-device memory of one `rl_step` (or PPO step) for `config` on a mesh of the given axis sizes; attention as
  `model.attention` runs on `plat` ('tpu', 'gpu', 'cpu'; default: the backend JAX would trace for).

  `decode`: the rollout's decode layout (decode_layout.Layout); None resolves `config.sampling.decode_layout` the
  way the step does, against `hbm_bytes` per device (None: no limit, so `auto` plans the gathered layout)."""
  mcfg = model_lib.ModelConfig.from_config(config.model)
  if decode is None:
    decode = choose_decode(config, mesh, hbm_bytes, plat)[0]
  bad = decode_layout.check(mcfg, mesh, decode)
  if bad:
    raise ValueError(bad + ".")
  rl = config.rl
  if min(rl.minibatches, rl.rollout_chunks) < 1:
    raise ValueError(f"rl.minibatches={rl.minibatches}, rl.rollout_chunks={rl.rollout_chunks}: 0 (auto) plans once "
                     "resolved (auto.resolve chooses it with this planner).")
  B, P, L = rl.prompts_per_step, config.task.prompt_len, config.sampling.max_new_tokens
  T, N = P + L, rl.prompts_per_step * rl.G * (rl.oversample if rl.dynamic_sampling else 1)
  dp, tp = mesh["data"] * mesh["fsdp"], mesh["tensor"]
  cb = _BYTES[mcfg.dtype]
  D, F, V, H, K, Dh, nl = mcfg.hidden, mcfg.inter, mcfg.vocab_size, mcfg.heads, mcfg.kv_heads, mcfg.head_dim, mcfg.layers
  h_dev, k_dev = H // tp if H % tp == 0 else H, K // tp if K % tp == 0 else K
  f_dev, v_dev = F // tp if F % tp == 0 else F, V // tp if V % tp == 0 else V
  plat = plat or attention.platform()
  chunks = rl.rollout_chunks
  rows = math.ceil(N / dp)                       # rollout rows on one device
  n_kept = rl.prompts_per_step * rl.G            # rows after dynamic sampling: scored and trained
  kept_rows = math.ceil(n_kept / dp)
  c_rows = math.ceil(N / chunks / dp)            # rows of one rollout chunk on one device (sampling)
  s_rows = math.ceil(n_kept / chunks / dp)       # ... and of one chunk of the scoring forwards
  mb_rows = math.ceil(n_kept / rl.minibatches / dp)   # training rows on one device, one minibatch
  Ts, Lh, packed = T, L, config_lib.packing_on(config)  # the scoring/training row length, and the positions the LM head scores
  if packed:
    # rl.packing: those passes run one packed micro-batch of pack_rows rows of pack_len at a time (whatever the
    # lengths), not the rollout chunk or the minibatch; the LM head scores every packed position.
    Ts = Lh = packing.pack_len(config, T, plat)
    s_rows, mb_rows = (packing.microbatch_rows(config, r, Ts, plat) for r in (kept_rows, mb_rows))
  path = lambda n, t: attention.choose(mcfg.attention, n, t, H, mcfg.dtype, plat, packed=packed and t == Ts)
  tok = mb_rows * Ts

  p_dev, n_params = param_bytes_per_device(mcfg, mesh)
  # The [D, V] LM head is the one weight XLA:TPU holds whole (measured, docs/scale.md): FSDP splits its D dim, so
  # every use all-gathers it (in the compute dtype: a cast copy even unsharded under bf16), and the backward
  # builds its full fp32 gradient before the reduce-scatter. Layer weights are gathered one layer at a time.
  head_gathered = D * v_dev * cb if (mesh["fsdp"] > 1 or cb != 4) else 0
  head_grad = D * v_dev * 4 if mesh["fsdp"] > 1 else 0
  lc, ref = mcfg.lora, state_lib.uses_reference(config)  # β = 0 keeps no reference model
  if lc is None:
    trained, resident = p_dev, {"policy": p_dev, **({"reference": p_dev} if ref else {})}
  else:  # LoRA: the frozen base once (matmuls in base_dtype), fp32 adapters and their moments; the reference is the
    # base with the adapters off (no copy); the frozen head gets no gradient
    trained, head_grad = _param_bytes(mcfg, tuple(sorted(mesh.items())), "lora")[0], 0
    norms = (2 * nl + 1) * D * 4 + (nl * (H + 2 * K) * Dh * 4 if mcfg.qkv_bias else 0)
    resident = {f"base (frozen, {lc.base_dtype})": (p_dev - norms) * _BYTES[lc.base_dtype] // 4 + norms,
                f"lora adapters (rank {lc.rank})": trained, **({"reference: the base, adapters off": 0} if ref else {})}
  resident.update({"optimizer (adam m, v)": 2 * trained, "batch": math.ceil(B / dp) * (2 * P + 4) * 4})
  if rl.algo in presets.CRITIC_ALGOS:
    critic = trained if config.ppo.critic == "separate" else 4 * D  # LoRA: the critic's own adapters
    resident["critic"] = critic
    resident["critic optimizer"] = 2 * critic

  # Rollout outputs live through the whole step: tokens, masks, sampling/old/reference log-probs, advantages, the
  # full sequence (tokens, positions, mask), all int32/float32.
  carried = kept_rows * L * 4 * 6 + kept_rows * T * 4 * 3
  # Sampling runs one chunk of rows at a time (rl.rollout_chunks). Prefill runs one layer at a time over P tokens:
  # activations plus that layer's attention.
  prefill = (c_rows * P * (3 * D + 2 * f_dev) * cb
             + plan_terms.attention_bytes(path(N // chunks, P), c_rows, P, h_dev, k_dev, Dh, cb, backward=False))
  # Decode (decode_layout.rollout_bytes): one chunk's KV cache and step logits, and the weights the loop reads in the
  # rollout's decode layout, made once for all chunks (gathered: the whole model in the compute dtype on every chip;
  # fsdp: as split, plus the LM head gathered at every token).
  rollout = {
      **decode_layout.rollout_bytes(mcfg, mesh, decode, N // chunks, T),
      "prefill layer": prefill,
      # The prefill scores its last position with the training-layout head, gathered whole: the tp layout's
      # vocab-split copy is another buffer (the fsdp layout's per-token gather and the gathered copy are the same
      # head; measured on the 7B v5e:2x4 compile, docs/scale.md).
      **({PREFILL_HEAD: head_gathered} if decode.kind == "tp" else {}),
      "rollout outputs": rows * L * 4 * 3 + carried,  # + the uniforms, tokens and log-probs of all sampled rows
  }
  if config_lib.setting(config, "sampling.engine") == "continuous":
    del rollout["kv cache"]
    rollout.update(plan_terms.continuous_rollout_bytes(config, mcfg, mesh, decode, N // rl.G, P, L, path))
  partial = bool(rl.get("partial_rollouts", False))
  if partial:  # the slots' and prompts' KV live in the state across steps (rollout/carry.py): resident, not temp
    resident.update(plan_terms.carry_bytes(config, mcfg, mesh))
    for k in ("slot kv cache (S x L)", "prompt kv cache (B x P)"):
      rollout.pop(k, None)
  # model.target_logprobs scores the L completion positions only, `logprob_chunk` positions at a time under
  # jax.checkpoint: one chunk of fp32 logits, its log-softmax (and in the update their gradient), plus the fp32
  # hidden states of the completion.
  chunk = min(model_lib.logprob_chunk(mcfg), Lh)  # packed: a row's positions are all scored, not L of them
  # The reference and (correction.needs_proximal) old-log-prob forwards: one rollout chunk of rows, one layer at a
  # time, no gradient.
  score = {}
  if state_lib.uses_reference(config) or correction.needs_proximal(config):
    s_tok = s_rows * Ts
    score = {
        "forward layer": s_tok * (3 * D + (h_dev + 2 * k_dev) * Dh + 2 * f_dev) * cb
                         + plan_terms.attention_bytes(path(n_kept // chunks, Ts), s_rows, Ts, h_dev, k_dev, Dh, cb, False),
        "layer input": s_tok * D * cb,
        "logits chunk": 2 * s_rows * chunk * v_dev * 4 + s_rows * Lh * D * 4,
        "lm head, gathered": head_gathered,
        "rollout outputs": carried,
    }

  train_path = path(n_kept // rl.minibatches, Ts)
  if mcfg.remat == "full":
    saved = nl * tok * D * cb  # only each layer's input survives the forward pass
  elif mcfg.remat == "dots":
    saved = nl * tok * (3 * D + (h_dev + 2 * k_dev) * Dh + 2 * f_dev) * cb
  else:  # everything, including the attention's own saved arrays (the einsum path's T×T scores)
    saved = nl * (tok * (5 * D + (h_dev + 2 * k_dev) * Dh + 4 * f_dev) * cb
                  + plan_terms.attention_bytes(train_path, mb_rows, Ts, h_dev, k_dev, Dh, cb, backward=False))
  if plat == "tpu" and rl.mu * rl.minibatches == 1 and not packed:
    # One update pass: XLA drops the trip-count-1 update loops, and XLA:TPU then schedules their saved-activation
    # stack (an AllocateBuffer without operands) before the rollout's decode loop, holding it through the scoring
    # forwards (Qwen2.5-7B LoRA on v5e:2x4: bf16[28,20480,3584], 3.8 GiB live at the decode peak; with 4
    # minibatches it is allocated inside the update loop; docs/scale.md).
    for phase in (rollout, score) if score else (rollout,):
      phase[HELD_EARLY] = saved
  # Backward of one layer: its recomputed activations, their gradients, and the attention's backward working set.
  layer = (tok * (4 * D + (h_dev + 2 * k_dev) * Dh + 4 * f_dev) * cb
           + plan_terms.attention_bytes(train_path, mb_rows, Ts, h_dev, k_dev, Dh, cb, backward=True))
  update = {
      "gradients": trained,
      "saved activations (remat=%s)" % mcfg.remat: saved,
      "layer backward": layer,
      "logits chunk": 3 * mb_rows * chunk * v_dev * 4 + mb_rows * Lh * D * 4,
      "lm head, gathered": head_gathered,
      "lm head gradient, unreduced": head_grad,
      "rollout outputs": carried,
  }
  if packed:  # the while_loop carries the summed gradient next to the micro-batch's; the plan's two index arrays
    separate = rl.algo in presets.CRITIC_ALGOS and config.ppo.critic == "separate"
    update["gradient accumulator"] = trained * (2 if separate else 1)  # of what is trained: LoRA, the adapters
    update["packing plan"] = 2 * math.ceil(n_kept / rl.minibatches / dp) * Ts * 4
  if rl.algo in presets.CRITIC_ALGOS and config.ppo.critic == "separate":
    update["critic gradients"] = trained
    # one gradient over (policy, critic) (ppo_step): the critic's own trunk, the policy's shape, saves its
    # activations beside the policy's (tiny PPO, fp32, remat none: XLA's temp 18.4 MB against 10.4 MB for GRPO; the
    # plan was 0.71x XLA's total without this term)
    update["critic saved activations"] = saved
  return Plan(resident, rollout, update, n_params, score)


def plan_sft(config: ml_collections.ConfigDict, mesh: dict[str, int], plat: str | None = None) -> Plan:
  """Per-device memory of one SFT step (rl/sft_step.py: job=sft / pretrain, the grpo job's SFT stage): the RL
  update's terms for sft.batch rows of model.max_len tokens (data.sft_batches pads to it), every position scored,
  one pass; resident the trained params and AdamW's moments (no reference, no rollout). The full weights are
  trained unless sft.lora (sft_step.model_config)."""
  T = config.model.max_len
  c = ml_collections.ConfigDict(config.to_dict())
  c.rl.update(prompts_per_step=config.sft.batch, G=1, mu=1, minibatches=1, rollout_chunks=1, beta=0.0,
              dynamic_sampling=False, packing="off", partial_rollouts=False, algo="grpo",
              rollout_correction="none")
  c.sampling.update(engine="static", decode_layout="gathered", max_new_tokens=T - 1)
  c.task.prompt_len = 1
  if not config.sft.get("lora", False):
    c.model.lora.rank = 0
  p = plan(c, mesh, plat, decode=decode_layout.Layout("gathered"))
  resident = {k: v for k, v in p.resident.items() if k != "batch"}
  resident["batch"] = math.ceil(config.sft.batch / (mesh["data"] * mesh["fsdp"])) * T * 4 * 4
  update = {k: v for k, v in p.update.items() if k != "rollout outputs"}
  return Plan(resident, {}, update, p.params)


def check_sft_fits(config, mesh: dict[str, int], hbm_bytes: int | None) -> None:
  """The input checks' hold on the SFT step (job=sft / pretrain, the grpo job's and R1's SFT stages), as
  auto.check_choosable's on the RL step: plan_sft's bytes per device within `hbm_bytes` (None: unknown, not
  checked). A batch too large was an out-of-memory error in the compile or the first step, after the run's files
  were written."""
  if hbm_bytes is None:
    return
  try:
    p = plan_sft(config, mesh)
  except MemoryError as e:  # a typo'd size traced (hidden=10**12): as auto.check_choosable
    raise ConfigError(f"config.model: tracing its shapes for the SFT memory plan ran out of host memory ({e}); check "
                      "its sizes for a typo.") from None
  if p.total_bytes > hbm_bytes:
    gib = lambda b: f"{b / 2 ** 30:.2f} GiB"
    raise ConfigError(
        f"config.sft.batch: the SFT step of {config.sft.batch} rows of model.max_len={config.model.max_len} tokens "
        f"plans {gib(p.total_bytes)} per device, more than the device's {gib(hbm_bytes)}; lower sft.batch or "
        "model.max_len, set model.remat=full, or add devices (mesh.fsdp).")


def choose_decode(config, mesh: dict[str, int], hbm_bytes: int | None,
                  plat: str | None = None, decode_only: bool = False) -> tuple[decode_layout.Layout, str]:
  """(layout, why) for `config.sampling.decode_layout` on a mesh of these axis sizes; `hbm_bytes` None: no limit;
  `plat`: the backend `plan` costs attention for (default: the one JAX traces for). Here, not in decode_layout.py:
  `auto` asks the planner, which costs each layout with decode_layout's shapes. `decode_only`: an evaluation's
  decode (no scoring forwards, no update after it): what must fit is the resident state and the rollout phase
  (decode_bytes), not the RL step's peak."""
  mcfg = model_lib.ModelConfig.from_config(config.model)
  knob, tp = config.sampling.decode_layout, int(config.sampling.decode_tp)
  gib = lambda b: f"{b / 2 ** 30:.2f} GiB"

  def fits(layout):
    p = plan(config, mesh, plat=plat, decode=layout)
    need = decode_bytes(p) if decode_only else p.total_bytes
    return hbm_bytes is None or need <= hbm_bytes, need

  if knob == "fsdp":
    return decode_layout.Layout("fsdp"), "sampling.decode_layout=fsdp"
  if knob == "gathered" or (knob == "auto" and mesh.get("fsdp", 1) == 1):
    why = "sampling.decode_layout=gathered" if knob == "gathered" else "mesh.fsdp=1: the weights are whole already"
    return decode_layout.Layout("gathered"), why
  # the rollout carry keeps its KV in the state with the model's KV heads; 'tp' repeats them per decode group where
  # its degree exceeds them (a set 'tp' is refused: validate_partial), so it has no tp candidates
  carry = config.rl.get("partial_rollouts", False)
  candidates = [] if carry else [tp] if tp else decode_layout.tp_degrees(mcfg, mesh)
  layouts = (([] if knob == "tp" else [decode_layout.Layout("gathered")])
             + [decode_layout.Layout("tp", d) for d in candidates])
  tried = []
  for layout in layouts:
    bad = decode_layout.check(mcfg, mesh, layout)
    if bad:
      raise ValueError(bad + "; pick another or set sampling.decode_tp=0 (the smallest that fits).")
    ok, need = fits(layout)
    if ok:
      limit = gib(hbm_bytes) if hbm_bytes else "no limit"
      return layout, f"the planner puts the step at {gib(need)} per device of {limit}"
    tried.append(f"{layout}: {gib(need)}")
  if knob == "tp" and layouts:  # set: kept, as a set gathered or fsdp is (validation refuses a tp with no degree)
    return layouts[-1], (f"sampling.decode_layout=tp (set): no degree fits {gib(hbm_bytes)} per device "
                         f"({', '.join(tried)}); the largest, the least per device")
  return decode_layout.Layout("fsdp"), (f"no decode layout fits {gib(hbm_bytes)} per device "
                                        f"({', '.join(tried) or 'no tp degree'}); decoding in the training layout, "
                                        "which all-gathers every weight at every token")


def decode_bytes(p: Plan) -> int:
  """The resident state and the rollout phase of `p`, without what the RL step's update holds there (HELD_EARLY):
  the bytes per device of a decode that is not followed by an update (evaluation, auto.resolve_eval)."""
  return p.resident_bytes + sum(v for k, v in p.rollout.items() if k != HELD_EARLY)


def format_plan(p: Plan, hbm_bytes: int | None = None) -> str:
  rows = [("resident", k, v) for k, v in p.resident.items()]
  rows += [("rollout", k, v) for k, v in p.rollout.items()]
  rows += [("score", k, v) for k, v in p.score.items()]
  rows += [("update", k, v) for k, v in p.update.items()]
  out = [f"{'phase':<9} {'component':<30} {'GiB/device':>11}"]
  out += [f"{ph:<9} {k:<30} {v / GiB:>11.3f}" for ph, k, v in rows]
  out.append(f"{'total':<9} {'resident + ' + p.peak_phase + ' peak':<30} {p.total_bytes / GiB:>11.3f}")
  if hbm_bytes:
    fits = "fits" if p.total_bytes <= hbm_bytes else "does NOT fit"
    out.append(f"{'':<9} {'HBM %.0f GiB: %s' % (hbm_bytes / GiB, fits):<30} "
               f"{100 * (1 - p.total_bytes / hbm_bytes):>10.1f}% free")
  return "\n".join(out)
