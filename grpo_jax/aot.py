"""Compiles the real RL step for a TPU slice on this CPU machine: does it fit, and how fast could it be?

With the `libtpu` package, `get_topology_desc("v5e:4x4")` describes a slice's devices without owning any; the
step is lowered on abstract, sharded state and batch and compiled by the TPU compiler. XLA's `memory_analysis()`
gives per-device bytes (arguments, outputs, temporaries, code) to hold against the chip's HBM. Step time is a
roofline from ANALYTIC FLOPs and bytes (the compiler's `cost_analysis()` counts a `lax.scan` body once, so its
FLOPs undercount the decode loop and the layer stack by orders of magnitude).

  python -m grpo_jax.aot --model=qwen2.5-0.5b --topology=v5e:4x4 --prompts 16 --G 8 --prompt-len 256 --L 512
  python -m grpo_jax.aot --model=qwen2.5-7b --topology=v5p:4x4x4 --mesh data=1,fsdp=64,tensor=1 --json

Only one process at a time may load libtpu (it holds a lock file): run one compile at a time. A compile too slow
to finish here still leaves its buffer assignment (the per-device bytes) behind when XLA dumps:

  XLA_FLAGS=--xla_dump_to=/tmp/d timeout 900 python -m grpo_jax.aot --model=qwen2.5-1.5b --topology=v5p:2x2x2
  python -m grpo_jax.aot --buffers /tmp/d
"""
import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from grpo_jax import attention
from grpo_jax import memory_plan
from grpo_jax import model as model_lib
from grpo_jax import rl_step
from grpo_jax import sharding

GiB = memory_plan.GiB


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip numbers from Cloud TPU's published specs (bf16 dense peak, HBM capacity and bandwidth)."""
  hbm_gib: float
  bf16_tflops: float
  hbm_gbs: float


CHIPS = {"v5e": Chip(16, 197, 819), "v5p": Chip(95, 459, 2765), "v4": Chip(32, 275, 1200),
         "v6e": Chip(32, 918, 1640)}


def chip_of(topology: str) -> Chip:
  gen = topology.split(":")[0].lower()
  if gen not in CHIPS:
    raise ValueError(f"--topology={topology!r}: the generation before ':' must be one of {sorted(CHIPS)} "
                     "(e.g. v5e:4x4, v5p:2x2x2).")
  return CHIPS[gen]


def tpu_devices(topology: str) -> list:
  """TPU device descriptions of a slice, from libtpu on this (CPU) machine."""
  chip_of(topology)
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
  except Exception as e:  # libtpu's own errors are long C++ traces; say what to do
    raise RuntimeError(f"--topology={topology!r}: libtpu could not describe it ({str(e).splitlines()[0]}). "
                       "Is libtpu installed (pip install libtpu==0.0.42.1) and no other process using it?") from e


def default_mesh(n_devices: int) -> dict[str, int]:
  """Pure FSDP (ZeRO-3): params, gradients and Adam state split n ways; batch split n ways."""
  return dict(data=1, fsdp=n_devices, tensor=1)


# ------------------------------------------------------------------------------------------------ roofline


def matmul_params(mcfg: model_lib.ModelConfig) -> int:
  """Weights that take part in a matmul per token: the layers plus the LM head (the embedding lookup is free)."""
  D, F, H, K, Dh = mcfg.hidden, mcfg.inter, mcfg.heads, mcfg.kv_heads, mcfg.head_dim
  per_layer = D * (H + 2 * K) * Dh + H * Dh * D + 3 * D * F
  return mcfg.layers * per_layer + D * mcfg.vocab_size


def analytic_flops(config: ml_collections.ConfigDict, plat: str = "tpu") -> dict[str, float]:
  """Global FLOPs of one step, by phase: 2·params per token forward, 6·params per token forward+backward.

  Attention adds 4·layers·heads·head_dim per (query, key) pair computed: in training and prefill the pairs of the
  path `model.attention` runs on `plat` (attention.choose / attention.pairs: the causal blocks of splash and
  blockwise, the full T×T of the einsum path); decode attends over the whole cache (P+L slots) at every step. The
  reference forward is absent at β = 0 (no reference model).
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
  out = {
      "rollout prefill": 2 * pm * N * P + attn_pair * N * pairs(chunk_rows, P),
      "rollout decode": 2 * pm * N * L + attn_pair * N * L * T,
  }
  if rl_step.uses_reference(config):
    out["reference forward"] = fwd_seq(chunk_rows)
  out["policy fwd+bwd"] = 3 * fwd_seq(N // rl.minibatches) * rl.mu
  if mcfg.dtype == "bfloat16":
    out["old log-probs forward"] = fwd_seq(chunk_rows)  # rl_step recomputes them in training numerics under bf16
  if mcfg.remat == "full":
    out["remat recompute"] = fwd_seq(N // rl.minibatches) * rl.mu
  return out


def roofline(config: ml_collections.ConfigDict, mesh: dict[str, int], chip: Chip) -> dict[str, Any]:
  """Lower-bound seconds per phase: compute at bf16 peak on every chip; decode also bounded by HBM reads.

  Each decode step reads every weight once per chip (FSDP gathers the layers; `tensor` splits them) in the
  compute dtype, plus this chip's share of the KV cache. Collectives (ICI) are not modelled.
  """
  mcfg = model_lib.ModelConfig.from_config(config.model)
  n_chips = math.prod(mesh.values())
  peak = chip.bf16_tflops * 1e12
  flops = analytic_flops(config)
  sec = {k: v / (n_chips * peak) for k, v in flops.items()}
  rl = config.rl
  N, P, L = rl.prompts_per_step * rl.G, config.task.prompt_len, config.sampling.max_new_tokens
  cb = 2 if mcfg.dtype == "bfloat16" else 4
  weights = matmul_params(mcfg) * cb / mesh["tensor"]  # the embedding lookup reads only N rows
  rows = N / (mesh["data"] * mesh["fsdp"])
  kv = 2 * mcfg.layers * rows * mcfg.kv_heads * mcfg.head_dim * (P + L) * cb / mesh["tensor"]
  decode_mem_s = L * (weights + kv) / (chip.hbm_gbs * 1e9)
  sec["rollout decode"] = max(sec["rollout decode"], decode_mem_s)
  return dict(flops=flops, seconds=sec, decode_hbm_seconds=decode_mem_s, step_seconds=sum(sec.values()),
              total_flops=sum(flops.values()))


# ------------------------------------------------------------------------------------------------ compile


def abstract_batch(config: ml_collections.ConfigDict, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The RL batch as sharded ShapeDtypeStructs (rows over data×fsdp when they divide, else replicated)."""
  B, P = config.rl.prompts_per_step, config.task.prompt_len
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  shapes = {"prompt_NxP": (B, P), "prompt_mask_NxP": (B, P), "answer_ids_NxA": (B, 4)}
  sh = lambda nd: sharding.batch_sharding(mesh, nd) if B % dp == 0 else sharding.replicated(mesh)
  return {k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=sh(len(s))) for k, s in shapes.items()}


def compile_step(config: ml_collections.ConfigDict, devices: list, mesh_shape: dict[str, int],
                 compiler_options: dict[str, Any] | None = None):
  """Lowers and compiles the one-graph step of the config's family (families.for_config: rl_step, or ppo_step with
  its critic) for `devices` on abstract sharded inputs; returns (compiled, seconds). `compiler_options` go to XLA
  for this compile only (e.g. {'xla_dump_to': DIR} for buffer_assignment_summary)."""
  from grpo_jax import families
  from grpo_jax import state as state_lib
  from grpo_jax.tasks import digits

  config = ml_collections.ConfigDict(config.to_dict())
  config.mesh.update(mesh_shape)
  mesh = sharding.make_mesh(config.mesh, devices)
  mcfg = model_lib.ModelConfig.from_config(config.model)
  spec = digits.reward_spec(mcfg.vocab_size)
  family = families.for_config(config)
  step = families.make_step(config, mesh, mcfg, spec, spec.ctx.tokenizer, family=family)
  st = state_lib.with_shardings(*family.state_spec(config, mesh, mcfg))
  t0 = time.perf_counter()
  compiled = step.lower(st, abstract_batch(config, mesh)).compile(compiler_options=compiler_options)
  return compiled, time.perf_counter() - t0


def memory_report(compiled, hbm_bytes: int | None) -> dict[str, Any]:
  """Per-device bytes from XLA. Peak ≈ arguments + outputs − aliased (donated) + temporaries + code."""
  m = compiled.memory_analysis()
  r = dict(argument_bytes=m.argument_size_in_bytes, output_bytes=m.output_size_in_bytes,
           alias_bytes=m.alias_size_in_bytes, temp_bytes=m.temp_size_in_bytes,
           generated_code_bytes=m.generated_code_size_in_bytes)
  r["total_bytes"] = (r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
                      + r["generated_code_bytes"])
  if hbm_bytes:
    r["hbm_bytes"] = hbm_bytes
    r["fits"] = r["total_bytes"] <= hbm_bytes
    r["headroom_frac"] = 1 - r["total_bytes"] / hbm_bytes
  return r


def buffer_assignment_summary(dump_dir: str) -> dict[str, Any]:
  """Per-device bytes from the XLA buffer-assignment dump of the RL step (`XLA_FLAGS=--xla_dump_to=DIR`).

  XLA writes it right after buffer assignment, long before a large TPU compile finishes (Qwen2.5-1.5B: ~2 min in,
  then >13 min of later passes here), so a compile cut off by a timeout still says whether the step fits — as a
  lower bound on TPU, whose later passes add temporaries (0.5B: dump 1.785 GiB, memory_analysis 2.275). Sums the
  allocations by kind (parameter = argument bytes, preallocated-temp = temp bytes) and lists the largest values
  in the temp allocation by shape (to see which tensors dominate)."""
  import glob
  import re
  files = sorted(glob.glob(f"{dump_dir}/*jit_step*after_optimizations-buffer-assignment.txt"))
  if not files:
    raise ValueError(f"--buffers={dump_dir}: no *jit_step*after_optimizations-buffer-assignment.txt there; compile "
                     "with XLA_FLAGS=--xla_dump_to=DIR first.")
  kinds: dict[str, int] = {}
  values: list[tuple[int, str]] = []
  in_temp = False
  with open(files[-1]) as f:
    for line in f:
      m = re.match(r"allocation \d+: size (\d+), (.*)", line)
      if m:
        rest = m.group(2)
        in_temp = "preallocated-temp" in rest
        kind = ("parameter" if "parameter" in rest else "temp" if in_temp or "temp" in rest
                else "constant" if "constant" in rest else "thread-local" if "thread-local" in rest else "other")
        if re.search(r"color [1-9]", rest):
          kind = "other"  # not HBM (color 0): e.g. TPU on-chip memory
        kinds[kind] = kinds.get(kind, 0) + int(m.group(1))
        continue
      v = re.match(r"\s*value: <\d+ \S+ @\d+> \(size=(\d+),offset=\d+\): (\w+\[[\d,]*\])", line)
      if in_temp and v:
        values.append((int(v.group(1)), v.group(2)))
  by_shape: dict[str, int] = {}
  for size, shape in values:
    by_shape[shape] = max(by_shape.get(shape, 0), size)
  top = sorted(by_shape.items(), key=lambda kv: -kv[1])[:12]
  return dict(file=files[-1], argument_bytes=kinds.get("parameter", 0), temp_bytes=kinds.get("temp", 0),
              other_bytes=sum(v for k, v in kinds.items() if k not in ("parameter", "temp")),
              largest_temp_values=[dict(shape=s, bytes=b) for s, b in top])


def topology_size(topology: str) -> int:
  """Chips in a topology name: 'v5e:4x4' → 16, 'v5p:2x2x2' → 8."""
  chip_of(topology)
  dims = topology.split(":", 1)[1].split("x") if ":" in topology else []
  if not dims or not all(d.isdigit() for d in dims):
    raise ValueError(f"--topology={topology!r}: write GEN:AxB or GEN:AxBxC (e.g. v5e:4x4).")
  return math.prod(int(d) for d in dims)


def check(config: ml_collections.ConfigDict, topology: str, mesh_shape: dict[str, int] | None = None,
          devices: list | None = None, compile: bool = True) -> dict[str, Any]:
  """The whole report for one config on one TPU topology (compiles once; `compile=False`: plan + roofline)."""
  chip = chip_of(topology)
  if compile:
    devices = tpu_devices(topology) if devices is None else devices
  n_dev = len(devices) if devices is not None else topology_size(topology)
  mesh_shape = sharding.mesh_shape(mesh_shape or default_mesh(n_dev), n_dev)
  from grpo_jax import validate
  cfg = ml_collections.ConfigDict(config.to_dict())
  cfg.mesh.update(mesh_shape)
  dp = mesh_shape["data"] * mesh_shape["fsdp"]
  # Evaluation is not compiled here; one eval batch of n_samples-divisible size keeps validate's checks quiet.
  cfg.eval.batch = dp * cfg.eval.n_samples
  cfg.eval.size = cfg.eval.batch
  cfg.task.test_size = max(cfg.task.test_size, cfg.eval.size)
  validate.validate_rl(cfg, n_dev)
  hbm = int(chip.hbm_gib * GiB)
  p = memory_plan.plan(cfg, mesh_shape, plat="tpu")
  rl = cfg.rl
  r = dict(topology=topology, n_devices=n_dev, mesh=mesh_shape, params=p.params, prompts=rl.prompts_per_step,
           G=rl.G, prompt_len=cfg.task.prompt_len, L=cfg.sampling.max_new_tokens, dtype=cfg.model.dtype,
           remat=cfg.model.remat, roofline=roofline(cfg, mesh_shape, chip), chip=dataclasses.asdict(chip),
           plan=dict(total_bytes=p.total_bytes, resident_bytes=p.resident_bytes, temp_bytes=p.temp_bytes,
                     peak_phase=p.peak_phase, fits=p.total_bytes <= hbm, headroom_frac=1 - p.total_bytes / hbm))
  if not compile:
    return r
  compiled, compile_s = compile_step(cfg, devices, mesh_shape)
  mem = memory_report(compiled, hbm)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  r.update(device_kind=devices[0].device_kind, compile_seconds=compile_s, memory=mem,
           xla_cost_flops_per_device=float(cost.get("flops", -1)) if cost else -1.0)
  r["plan"]["vs_xla"] = p.total_bytes / (mem["argument_bytes"] + mem["temp_bytes"])
  return r


def format_report(r: dict[str, Any]) -> str:
  roof, pl = r["roofline"], r["plan"]
  g = lambda b: f"{b / GiB:.2f} GiB"
  head = (f"{r['topology']} ({r['n_devices']} × {r.get('device_kind', 'chips, not compiled')}), mesh {r['mesh']}, "
          f"{r['params'] / 1e9:.3f}B params, {r['prompts']} prompts × G {r['G']}, {r['prompt_len']}+{r['L']} tokens, {r['dtype']}, remat={r['remat']}")
  lines = [head, f"memory_plan estimate {g(pl['total_bytes'])} per device (peak in {pl['peak_phase']}): "
           f"{'fits' if pl['fits'] else 'does NOT fit'} in {r['chip']['hbm_gib']:.0f} GiB"]
  if "memory" in r:
    m = r["memory"]
    lines += [
        f"compiled in {r['compile_seconds']:.1f} s",
        f"per device: arguments {g(m['argument_bytes'])}, outputs {g(m['output_bytes'])} "
        f"(aliased {g(m['alias_bytes'])}), temp {g(m['temp_bytes'])}, code {g(m['generated_code_bytes'])}",
        f"total {g(m['total_bytes'])} of {g(m['hbm_bytes'])} HBM: "
        f"{'FITS' if m['fits'] else 'DOES NOT FIT'} ({100 * m['headroom_frac']:.1f}% headroom)",
        f"memory_plan / XLA (arguments+temp): {pl['vs_xla']:.2f}",
        f"XLA's cost_analysis FLOPs (scan bodies counted once): "
        f"{r['xla_cost_flops_per_device'] * r['n_devices'] / 1e12:.2f} TFLOP"]
  lines.append(f"roofline from analytic FLOPs ({roof['total_flops'] / 1e12:.1f} TFLOP):")
  for k, s in roof["seconds"].items():
    lines.append(f"  {k:<24} {roof['flops'][k] / 1e12:9.1f} TFLOP {s * 1e3:9.1f} ms")
  lines.append(f"  decode HBM-bound time   {roof['decode_hbm_seconds'] * 1e3:24.1f} ms")
  lines.append(f"  estimated step time     {roof['step_seconds'] * 1e3:24.1f} ms (lower bound)")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(memory_plan.PRESETS))
  ap.add_argument("--topology", default="v5e:4x4", help="e.g. v5e:2x2, v5e:4x4, v5e:8x8, v5p:2x2x2, v4:2x2x2")
  ap.add_argument("--prompts", type=int, default=16)
  ap.add_argument("--G", type=int, default=8)
  ap.add_argument("--prompt-len", type=int, default=256)
  ap.add_argument("--L", type=int, default=512)
  ap.add_argument("--mesh", default="", help="data=..,fsdp=..,tensor=.. (default: fsdp over all devices)")
  ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  ap.add_argument("--remat", default="full", choices=["none", "full", "dots"])
  ap.add_argument("--minibatches", type=int, default=1)
  ap.add_argument("--rollout-chunks", type=int, default=1, help="rl.rollout_chunks: sample and score the rollout's "
                  "rows in this many chunks")
  ap.add_argument("--algo", default="grpo", help="a preset (grpo_jax/presets.py); β = 0 ones keep no reference")
  ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
  ap.add_argument("--no-compile", action="store_true", help="memory_plan + roofline only (no libtpu needed)")
  ap.add_argument("--buffers", default="", metavar="DUMP_DIR",
                  help="only summarise the buffer assignment XLA dumped to DUMP_DIR (no compile)")
  a = ap.parse_args(argv)
  try:
    if a.buffers:
      b = buffer_assignment_summary(a.buffers)
      print(json.dumps(b) if a.json else "\n".join(
          [f"arguments {b['argument_bytes'] / GiB:.3f} GiB, temp {b['temp_bytes'] / GiB:.3f} GiB per device "
           f"({b['file']})"] + [f"  {v['bytes'] / 2**20:9.1f} MiB  {v['shape']}" for v in b["largest_temp_values"]]))
      return 0
    mesh = memory_plan.parse_mesh(a.mesh) if a.mesh else None
    cfg = memory_plan.workload_config(a.model, a.prompts, a.G, a.prompt_len, a.L, None, a.dtype, a.remat,
                                      a.minibatches, algo=a.algo, rollout_chunks=a.rollout_chunks)
    r = check(cfg, a.topology, mesh, compile=not a.no_compile)
  except (ValueError, RuntimeError) as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  print(json.dumps(r) if a.json else format_report(r), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
