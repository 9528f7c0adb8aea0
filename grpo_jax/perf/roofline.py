"""Lower bounds on an RL step's time on a TPU slice, per phase: compute, HBM and interconnect (ICI).

Compute: analytic FLOPs at the chip's bf16 peak (XLA's cost_analysis counts a loop body once: docs/performance.md,
"XLA:CPU facts"). HBM: the bytes each chip must read per phase (weights in the compute dtype, the KV cache, the optimizer's fp32 state).
ICI: every collective of the compiled program (hlo_collectives.py: loop bodies × trip counts), priced with the
collective cost model of "How to Scale Your Model" (Austin et al., jax-ml.github.io/scaling-book, "Sharded
Matrices" and "TPUs"): a ring all-gather or reduce-scatter moves (n-1)/n of the gathered bytes through each chip at
the bandwidth of the torus axes its group spans (both directions of a link when the axis has a wraparound, one
otherwise); all-reduce costs twice that, all-to-all a quarter, a collective-permute one hop; each collective takes at
least 1 µs per hop it spans. A phase's bound is the largest of its three terms (perfect overlap); the step's is
their sum over phases.
"""
import dataclasses
import math
from typing import Any, Iterable, Sequence

import jax
import ml_collections
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.model import attention
from grpo_jax.rl import correction
from grpo_jax.rollout import decode_layout
from grpo_jax.model import lora
from grpo_jax.model import model as model_lib
from grpo_jax.rl import packing
from grpo_jax.rl import state as state_lib
from grpo_jax.rl import row_chunks
from grpo_jax.rollout import carry as carry_lib
from grpo_jax.rollout import engine
from grpo_jax.rollout import sampling

HOP_SECONDS = 1e-6  # ICI latency per hop ("How to Scale Your Model", TPUs chapter: "typically around 1us")


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip figures. HBM and bf16 peak: Cloud TPU's published specs (cloud.google.com/tpu/docs/v5e, v5p, v6e, v4).
  ICI: one-way bytes/s of one link and links per chip. v5e 400 GB/s, v5p 1200 GB/s and v6e 800 GB/s are the
  docs' bidirectional ICI bandwidth per chip over 4 / 6 / 4 ports (2D / 3D torus); v4 (not in its Cloud page):
  4.5e10 B/s one-way per link, the scaling book's figure, 6 ports."""
  hbm_gib: float
  bf16_tflops: float
  hbm_gbs: float
  ici_link_gbs: float = 50.0  # one direction of one link
  torus_dims: int = 2         # 2D torus (4 ports) or 3D (6 ports)


CHIPS = {"v5e": Chip(16, 197, 819, 50, 2), "v5p": Chip(95, 459, 2765, 100, 3), "v4": Chip(32, 275, 1200, 45, 3),
         "v6e": Chip(32, 918, 1640, 100, 2)}


def chip_of(topology: str) -> Chip:
  gen = topology.split(":")[0].lower()
  if gen not in CHIPS:
    raise ValueError(f"--topology={topology!r}: the generation before ':' must be one of {sorted(CHIPS)} "
                     "(e.g. v5e:4x4, v5p:2x2x2).")
  return CHIPS[gen]


def torus_of(topology: str) -> tuple[tuple[int, ...], tuple[bool, ...]]:
  """(axis extents, wraparound per axis) of a slice. v4/v5p: wraparound links on every axis of slices built from
  whole 4x4x4 cubes (all axes multiples of 4; Cloud TPU v5p docs: "All 4x4x4 and larger slices have full 3D
  torus"); v5e/v6e: on an axis of 16 chips (scaling book, TPUs chapter)."""
  chip = chip_of(topology)
  dims = tuple(int(d) for d in topology.split(":", 1)[1].split("x"))
  if chip.torus_dims == 3:
    cube = len(dims) == 3 and all(d % 4 == 0 for d in dims)
    return dims, tuple(cube for _ in dims)
  return dims, tuple(d == 16 for d in dims)


# ------------------------------------------------------------------------------------------------ FLOPs


def matmul_params(mcfg: model_lib.ModelConfig) -> int:
  """Weights that take part in a matmul per token: the layers plus the LM head (the embedding lookup is free)."""
  D, F, H, K, Dh = mcfg.hidden, mcfg.inter, mcfg.heads, mcfg.kv_heads, mcfg.head_dim
  per_layer = D * (H + 2 * K) * Dh + H * Dh * D + 3 * D * F
  return mcfg.layers * per_layer + D * mcfg.vocab_size


def decode_work(config: ml_collections.ConfigDict, lengths_N: np.ndarray | None = None) -> dict[str, float]:
  """The rollout's work for given completion lengths (None: every row runs to L, the static bound): decode steps,
  row-steps computed, (row, KV position) pairs read and rows prefilled, for `sampling.engine`. Static: each row
  chunk runs to its longest row (rounded up to sampling.exit_chunk) and reads the whole P + L cache per step;
  continuous: engine.simulate's per-device schedule on config.mesh's data × fsdp, the prompt KV plus the completion
  blocks below the live maximum."""
  rl, sc = config.rl, config.sampling
  N, P, L = rl.prompts_per_step * rl.G, config.task.prompt_len, sc.max_new_tokens
  if lengths_N is None:
    # prefilled: every row (static), each prompt once (continuous engine), the carry's whole table of prompts
    pre = ((1 + int(rl.max_staleness)) * rl.prompts_per_step if rl.get("partial_rollouts", False) else
           rl.prompts_per_step if config_lib.setting(config, "sampling.engine") == "continuous" else N)
    return dict(steps=L, row_steps=N * L, kv_read=N * L * (P + L), prefill_rows=pre, tokens=N * L)
  lengths_N = np.minimum(np.asarray(lengths_N), L)
  split = config.mesh.data * config.mesh.fsdp if min(config.mesh.data, config.mesh.fsdp) > 0 else 1
  if rl.get("partial_rollouts", False):
    # the carry over the stream of lengths (several batches of N): per step (update), averaged
    Q = (1 + int(rl.max_staleness)) * rl.prompts_per_step
    slots = int(sc.get("slots", 0)) or N
    sim = carry_lib.simulate(lengths_N, rl.prompts_per_step, rl.G, int(rl.max_staleness), slots,
                             int(rl.rollout_budget), L, min(engine.KV_BLOCK, L), split,
                             carry_lib.kv_groups(int(rl.get("carry_kv_groups", 0)), slots, split),
                             rl.get("staleness_policy", "wait") == "wait")
    u = max(sim["updates"], 1)
    return dict(steps=sim["steps"] / u, row_steps=sim["row_steps"] / u, kv_read=(sim["kv_read"] + sim["row_steps"] * P) / u,
                prefill_rows=Q, tokens=(sim["trained_tokens"] - sim["stale_tokens"]) / u, drawn=sim["drawn_tokens"] / u,
                updates=sim["updates"], lag_mean=sim["lag_mean"], lag_max=sim["lag_max"],
                stale_frac=sim["stale_tokens"] / max(sim["trained_tokens"], 1))
  if len(lengths_N) > N:  # a stream of batches: each decoded to its end, per step averaged
    parts = [decode_work(config, lengths_N[i:i + N]) for i in range(0, len(lengths_N) - N + 1, N)]
    return {k: float(np.mean([p[k] for p in parts])) for k in parts[0]}
  if config_lib.setting(config, "sampling.engine") == "continuous":
    slots = row_chunks.slots_for(config, N)
    # each device schedules its own rows (engine.sample_groups); an unresolved mesh (fsdp=-1) counts as one device
    levels = int(config_lib.setting(config, "sampling.compaction"))
    sim = engine.simulate(lengths_N, slots, engine.compaction_sizes(slots, levels, split), min(engine.KV_BLOCK, L), L,
                          split)
    return dict(steps=sim["steps"], row_steps=sim["row_steps"], kv_read=sim["kv_read"] + sim["row_steps"] * P,
                prefill_rows=N // rl.G, tokens=sim["tokens"])
  c, chunks = sampling.SamplingConfig.from_config(sc, eos_id=0, pad_id=0).exit_chunk, int(rl.rollout_chunks)
  # sampling.sample emits token k at decode step k (then decodes it), so a chunk whose longest row has l tokens is
  # known done after step l - 1: it stops at the first exit-chunk boundary at or after l steps
  steps_c = [L - 1 if not c else min(L - 1, -(-int(lengths_N[i::chunks].max()) // c) * c)
             for i in range(chunks)]
  row_steps = sum(s * (N // chunks) for s in steps_c)
  return dict(steps=max(steps_c), row_steps=row_steps, kv_read=row_steps * (P + L), prefill_rows=N,
              tokens=int(lengths_N.sum()))


def packed_rows(config: ml_collections.ConfigDict, lengths_N: np.ndarray | None = None,
                plat: str | None = None) -> tuple[int, int]:
  """(packed rows, pack_len) rl.packing's passes run over for these completion lengths (None: every row at L) and
  prompts counted at their full P: first-fit decreasing of the N samples into rows of pack_len, in NumPy, as the step
  plans each device's rows (the model packs all rows together: per device, each pays at most a few rows more, and the
  micro-batch granularity `rl.pack_rows` rounds a device's rows up)."""
  rl = config.rl
  N, P, L = rl.prompts_per_step * rl.G, config.task.prompt_len, config.sampling.max_new_tokens
  C = packing.pack_len(config, P + L, plat)
  lens = np.full(N, L) if lengths_N is None else np.minimum(np.asarray(lengths_N), L)
  fill: list[int] = []
  for n in sorted((P + lens).tolist(), reverse=True):
    row = next((i for i, f in enumerate(fill) if f + n <= C), None)
    if row is None:
      fill.append(n)
    else:
      fill[row] += n
  return len(fill), C


def carry_recompute_slots(config: ml_collections.ConfigDict) -> int:
  """The slots whose KV the rollout carry re-prefills every step under rl.carry_kv=recompute (0: none). The step's
  shapes are static: all S slots' prompt + completion (P + L positions) go through the layers whatever is live
  (carry._recompute_slots), so the term does not depend on the completion lengths."""
  rl = config.rl
  if not rl.get("partial_rollouts", False) or rl.get("carry_kv", "keep") != "recompute":
    return 0
  return int(config.sampling.get("slots", 0)) or rl.prompts_per_step * rl.G


def analytic_flops(config: ml_collections.ConfigDict, plat: str = "tpu",
                   lengths_N: np.ndarray | None = None) -> dict[str, float]:
  """Global FLOPs of one step, by phase: 2·params per token forward, 6·params per token forward+backward.

  Attention adds 4·layers·heads·head_dim per (query, key) pair computed: in training and prefill the pairs of the
  path `model.attention` runs on `plat` (attention.choose / attention.pairs: the causal blocks of splash and
  blockwise, the full T×T of the einsum path); decode attends over the whole cache (P+L slots) at every step. The
  reference forward is absent at β = 0 (no reference model). `lengths_N`: the decode's work for these completion
  lengths (decode_work) instead of every row to L; with rl.packing the reference, old-log-prob, policy and remat
  passes run `packed_rows` rows of pack_len for them instead of N rows of T.
  """
  mcfg = model_lib.ModelConfig.from_config(config.model)
  rl = config.rl
  N = rl.prompts_per_step * rl.G
  P, L = config.task.prompt_len, config.sampling.max_new_tokens
  T = P + L
  pm = matmul_params(mcfg)
  attn_pair = 4 * mcfg.layers * mcfg.heads * mcfg.head_dim
  pairs = lambda n, t: attention.pairs(attention.choose(mcfg.attention, n, t, mcfg.heads, mcfg.dtype, plat), t)
  chunk_rows = N // rl.rollout_chunks
  # One forward over all N×T tokens, in the row groups it runs in (rollout chunks, or update minibatches).
  fwd_seq = lambda n: 2 * pm * N * T + attn_pair * N * pairs(n, T)
  seq_tokens = N * T
  if config_lib.packing_on(config):
    R, C = packed_rows(config, lengths_N, plat)
    path = lambda n: attention.choose(mcfg.attention, n, C, mcfg.heads, mcfg.dtype, plat, packed=True)
    fwd_seq = lambda n: 2 * pm * R * C + attn_pair * R * attention.pairs(path(n), C)
    seq_tokens = R * C
  w = decode_work(config, lengths_N)
  pre = w["prefill_rows"]
  out = {
      "rollout prefill": 2 * pm * pre * P + attn_pair * pre * pairs(min(chunk_rows, pre), P),
      "rollout decode": 2 * pm * w["row_steps"] + attn_pair * w["kv_read"],
  }
  S = carry_recompute_slots(config)
  if S:  # the carry's live slots' KV rebuilt every step: the layers (no LM head) over S rows of P + L
    out["carry KV recompute"] = 2 * (pm - mcfg.hidden * mcfg.vocab_size) * S * T + attn_pair * S * pairs(S, T)
  if state_lib.uses_reference(config):
    out["reference forward"] = fwd_seq(chunk_rows)
  # forward + backward = 3 forwards; under LoRA the frozen base's weight gradients are not computed (its matmuls
  # cost 2 forwards: forward and input gradient; the adapters' rank-r matmuls are left out of the bound)
  frozen = 2 * pm * seq_tokens if mcfg.lora else 0
  out["policy fwd+bwd"] = (3 * fwd_seq(N // rl.minibatches) - frozen) * rl.mu
  if correction.needs_proximal(config):
    out["old log-probs forward"] = fwd_seq(chunk_rows)  # π_prox recomputed in training numerics (rl/correction.py)
  if mcfg.remat == "full":
    out["remat recompute"] = fwd_seq(N // rl.minibatches) * rl.mu
  return out


# -------------------------------------------------------------------------------------------------- HBM


def hbm_bytes(config: ml_collections.ConfigDict, mesh: dict[str, int],
              layout: decode_layout.Layout | None = None, lengths_N: np.ndarray | None = None) -> dict[str, float]:
  """Bytes one chip reads from HBM per phase, at least: every pass reads the weights it multiplies (in the compute
  dtype, as that phase holds them); decode reads them and this chip's KV cache at every token; the optimizer reads
  and writes its fp32 shard (params, gradient, Adam m and v). Activations are not counted."""
  mcfg = model_lib.ModelConfig.from_config(config.model)
  rl = config.rl
  cb = 2 if mcfg.dtype == "bfloat16" else 4
  N, P, L = rl.prompts_per_step * rl.G, config.task.prompt_len, config.sampling.max_new_tokens
  layout = layout or decode_layout.Layout("fsdp")
  weights = matmul_params(mcfg) * cb / mesh["tensor"]  # gathered layer by layer, split only over tensor
  t = decode_layout.tp_degree(mesh, layout)
  dp = mesh["data"] * mesh["fsdp"]
  rows = N / (dp // layout.tp if layout.kind == "tp" else dp)
  kv_heads = decode_layout.decode_mcfg(mcfg, mesh, layout).kv_heads
  kv_slot = 2 * mcfg.layers * rows * max(kv_heads // t, 1) * mcfg.head_dim * cb  # one cache slot, K and V
  decode_weights = matmul_params(mcfg) * cb / t
  # one fp32 copy of the trained params, FSDP-split: under LoRA the adapters (the base takes no update)
  trained = (sum(x.size for x in jax.tree.leaves(lora.adapter_shapes(mcfg))) if mcfg.lora else matmul_params(mcfg))
  shard = 4 * trained / (dp * mesh["tensor"])
  w = decode_work(config, lengths_N)  # every row to L unless lengths are given
  kv_pos = kv_slot / rows  # one (row, position) of K and V on this chip
  out = {
      # one pass over the weights per chunk (or over the B prompts once), writing their KV
      "rollout prefill": weights * rl.rollout_chunks + kv_pos * w["prefill_rows"] / (N / rows) * P,
      # the decode weights every step; the KV the computed rows read (static: the whole cache, every step)
      "rollout decode": w["steps"] * decode_weights + kv_pos * w["kv_read"] / (N / rows),
  }
  S = carry_recompute_slots(config)
  if S:  # one pass over the decode layout's layer weights (no LM head), writing K and V of this chip's slots' P + L
    out["carry KV recompute"] = ((matmul_params(mcfg) - mcfg.hidden * mcfg.vocab_size) * cb / t
                                 + kv_pos * S / (N / rows) * (P + L))
  passes, upd = rl.rollout_chunks, rl.mu * rl.minibatches  # passes over the weights: forwards, updates
  if config_lib.packing_on(config):  # one pass per packed micro-batch: the rows a device needs over its rows per micro-batch
    R, C = packed_rows(config, lengths_N)
    rows_dev = math.ceil(R / dp)
    passes = math.ceil(rows_dev / packing.microbatch_rows(config, math.ceil(N / dp), C))
    upd = rl.mu * rl.minibatches * math.ceil(
        rows_dev / rl.minibatches / packing.microbatch_rows(config, math.ceil(N / dp / rl.minibatches), C))
  if state_lib.uses_reference(config):
    out["reference forward"] = weights * passes  # one pass over the weights per chunk of rows / micro-batch
  out["policy fwd+bwd"] = upd * (2 if mcfg.lora else 3) * weights + 7 * shard  # LoRA: no base weight gradient
  if correction.needs_proximal(config):
    out["old log-probs forward"] = weights * passes
  if mcfg.remat == "full":
    out["remat recompute"] = upd * weights
  return out


# -------------------------------------------------------------------------------------------------- ICI


def collective_seconds(c, chip: Chip, topology: str | None, coords: Sequence[Sequence[int]] | None) -> float:
  """Seconds of one execution of collective `c` (hlo_collectives.Collective) on the slice."""
  n = c.group_size
  if n <= 1 and c.kind != "collective-permute":
    return 0.0
  link = chip.ici_link_gbs * 1e9
  dims, wrap = torus_of(topology) if topology else ((n,), (False,))
  if coords and c.groups and max(c.groups[0]) < len(coords):
    members = [tuple(coords[i])[:len(dims)] for i in c.groups[0]]
    spans = [(a, len({m[a] for m in members})) for a in range(len(dims)) if len({m[a] for m in members}) > 1]
  else:
    spans = [(0, n)]  # no coordinates: one ring axis
  if not spans:
    return 0.0
  bandwidth = sum(link * (2 if wrap[a] and extent == dims[a] else 1) for a, extent in spans)
  hops = sum(extent // 2 if wrap[a] and extent == dims[a] else extent - 1 for a, extent in spans)
  if c.kind == "collective-permute":
    return max(HOP_SECONDS, c.result_bytes / link)
  t = c.moved_bytes / bandwidth
  if c.kind == "all-to-all":
    t /= 4
  return max(hops * HOP_SECONDS * (2 if c.kind == "all-reduce" else 1), t)


# Phase names of hlo_collectives.PHASES → rows of the roofline (the update runs the policy's forward and backward,
# its recomputed forward and the optimizer: its collectives go to one row).
_ROW = {"update": "policy fwd+bwd"}


def ici_seconds(colls: Iterable, chip: Chip, topology: str | None = None,
                coords: Sequence[Sequence[int]] | None = None) -> dict[str, dict[str, float]]:
  """{row: {seconds, collectives (executions), bytes (moved per chip)}} over a program's collectives."""
  out: dict[str, dict[str, float]] = {}
  for c in colls:
    row = out.setdefault(_ROW.get(c.phase, c.phase), dict(seconds=0.0, collectives=0, bytes=0.0))
    row["seconds"] += c.count * collective_seconds(c, chip, topology, coords)
    row["collectives"] += c.count
    row["bytes"] += c.count * c.moved_bytes
  return out


def _ring(topology: str, n: int) -> tuple[float, int]:
  """(one-way bytes/s, hops) of a collective over `n` chips of a slice that span whole torus axes, largest first
  (an FSDP group over the whole slice spans all of them)."""
  chip = chip_of(topology)
  dims, wrap = torus_of(topology)
  bw, hops, left = 0.0, 0, n
  for d, w in sorted(zip(dims, wrap), reverse=True):
    if left <= 1:
      break
    extent = min(d, left)
    full = w and extent == d
    bw += chip.ici_link_gbs * 1e9 * (2 if full else 1)
    hops += extent // 2 if full else extent - 1
    left //= extent
  return bw or chip.ici_link_gbs * 1e9, hops


def analytic_decode_ici(config: ml_collections.ConfigDict, mesh: dict[str, int], topology: str,
                        layout: decode_layout.Layout) -> dict[str, dict[str, float]]:
  """The decode phase's ICI without a compiled program (aot --no-compile), by the layout's stated collectives:
  fsdp all-gathers every weight (compute dtype, ÷ tensor) over the fsdp chips at every token; gathered and tp
  all-reduce the [rows, D] activations twice per layer plus once for the embedding, and all-gather the [rows, V]
  fp32 logits, over the TP degree's chips (none when it is 1). Same pricing as the compiled count."""
  mcfg = model_lib.ModelConfig.from_config(config.model)
  rl = config.rl
  N, L = rl.prompts_per_step * rl.G, config.sampling.max_new_tokens
  cb = 2 if mcfg.dtype == "bfloat16" else 4
  steps = max(L - 1, 1)
  if layout.kind == "fsdp":
    f = mesh["fsdp"]
    if f == 1:
      return {}
    bw, hops = _ring(topology, f)
    leaves = len(jax.tree.leaves(model_lib.param_shapes(mcfg)))
    n_coll = mcfg.layers * (leaves - 2) + 1  # every leaf but the table and final norm is a [layers, ...] stack; + head
    moved = matmul_params(mcfg) * cb / mesh["tensor"] * (f - 1) / f
    sec = moved / bw + n_coll * hops * HOP_SECONDS
    return {"rollout decode": dict(seconds=steps * sec, collectives=steps * n_coll, bytes=steps * moved)}
  t = decode_layout.tp_degree(mesh, layout)
  if t == 1:
    return {}
  rows = N / (mesh["data"] * mesh["fsdp"] // (layout.tp if layout.kind == "tp" else 1))
  bw, hops = _ring(topology, t)
  ar = 2 * rows * mcfg.hidden * cb * (t - 1) / t
  ag = rows * mcfg.vocab_size * 4 * (t - 1) / t
  n_ar = 2 * mcfg.layers + 1
  sec = n_ar * max(2 * hops * HOP_SECONDS, ar / bw) + max(hops * HOP_SECONDS, ag / bw)
  return {"rollout decode": dict(seconds=steps * sec, collectives=steps * (n_ar + 1), bytes=steps * (n_ar * ar + ag))}


def roofline(config: ml_collections.ConfigDict, mesh: dict[str, int], chip: Chip,
             layout: decode_layout.Layout | None = None, ici: dict[str, dict[str, float]] | None = None,
             lengths_N: np.ndarray | None = None) -> dict[str, Any]:
  """Lower-bound seconds per phase: max(compute at bf16 peak on every chip, HBM reads, ICI) — ICI when `ici`
  (ici_seconds of the compiled step) is given, else not modelled."""
  n_chips = math.prod(mesh.values())
  flops = analytic_flops(config, lengths_N=lengths_N)
  hbm = hbm_bytes(config, mesh, layout, lengths_N)
  ici = ici or {}
  rows = list(flops) + [r for r in ici if r not in flops]
  compute = {k: flops.get(k, 0.0) / (n_chips * chip.bf16_tflops * 1e12) for k in rows}
  hbm_s = {k: hbm.get(k, 0.0) / (chip.hbm_gbs * 1e9) for k in rows}
  ici_s = {k: ici.get(k, {}).get("seconds", 0.0) for k in rows}
  sec = {k: max(compute[k], hbm_s[k], ici_s[k]) for k in rows}
  return dict(flops=flops, compute_seconds=compute, hbm_seconds=hbm_s, ici_seconds=ici_s, seconds=sec,
              ici=ici, decode_hbm_seconds=hbm_s["rollout decode"], step_seconds=sum(sec.values()),
              total_flops=sum(flops.values()), layout=str(layout or decode_layout.Layout("fsdp")))
