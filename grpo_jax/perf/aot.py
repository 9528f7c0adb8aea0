"""Compiles the real RL step for a TPU slice on this CPU machine: does it fit, and how fast could it be?

With the `libtpu` package, `get_topology_desc("v5e:4x4")` describes a slice's devices without owning any; the
step is lowered on abstract, sharded state and batch and compiled by the TPU compiler. XLA's `memory_analysis()`
gives per-device bytes (arguments, outputs, temporaries, code) to hold against the chip's HBM. Step time is a
roofline per phase (roofline.py): compute from ANALYTIC FLOPs (the compiler's `cost_analysis()` counts a `lax.scan`
body once, so its FLOPs undercount the decode loop and the layer stack by orders of magnitude), HBM reads, and the
interconnect: every collective of the compiled program (hlo_collectives.py), priced at the slice's ICI bandwidth.

  python -m grpo_jax.aot --model=qwen2.5-0.5b --topology=v5e:4x4 --prompts 16 --G 8 --prompt-len 256 --L 512
  python -m grpo_jax.aot --model=qwen2.5-7b --topology=v5p:4x4x4 --mesh data=1,fsdp=64,tensor=1 --json
  python -m grpo_jax.aot --model=qwen2.5-7b --topology=v5e:8x8 --decode-layout=tp --decode-tp=4

Only one process at a time may load libtpu (it holds a lock file): run one compile at a time. A compile too slow
to finish here still leaves its buffer assignment (the per-device bytes) behind when XLA dumps:

  XLA_FLAGS=--xla_dump_to=/tmp/d timeout 900 python -m grpo_jax.aot --model=qwen2.5-1.5b --topology=v5p:2x2x2
  python -m grpo_jax.aot --buffers /tmp/d
"""
import dataclasses
import json
import math
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from grpo_jax.infra import errors
from grpo_jax.config import config_lib
from grpo_jax.rl import auto
from grpo_jax.rollout import carry as carry_lib
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import sampling
from grpo_jax.perf import hlo_collectives
from grpo_jax.rl import memory_plan
from grpo_jax.model import model as model_lib
from grpo_jax.perf import roofline as roofline_lib
from grpo_jax.perf import workload_flags
from grpo_jax.infra import sharding
from grpo_jax.rl import families
from grpo_jax.rl import state as state_lib
from grpo_jax.tasks import digits

GiB = memory_plan.GiB


# The chip table, FLOPs and the roofline live in roofline.py (re-exported here: aot.CHIPS, aot.roofline, ...).
Chip, CHIPS, chip_of = roofline_lib.Chip, roofline_lib.CHIPS, roofline_lib.chip_of
matmul_params, analytic_flops, roofline = roofline_lib.matmul_params, roofline_lib.analytic_flops, roofline_lib.roofline


def tpu_devices(topology: str) -> list:
  """TPU device descriptions of a slice, from libtpu on this (CPU) machine."""
  chip_of(topology)
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
  except Exception as e:  # libtpu's own errors are long C++ traces; say what to do
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "lockfile" in first:  # another process on this machine loaded libtpu (any JAX process without JAX_PLATFORMS=cpu)
      raise RuntimeError(f"--topology={topology!r}: another process holds libtpu ({first}). Compiling for a topology "
                         "uses no TPU chip, so rerun with ALLOW_MULTIPLE_LIBTPU_LOAD=1, or stop the other process "
                         "(start CPU jobs with JAX_PLATFORMS=cpu so that they never load libtpu).") from e
    raise RuntimeError(f"--topology={topology!r}: libtpu could not describe it ({first}). Is libtpu installed "
                       "(pip install libtpu==0.0.42.1)?") from e


def default_mesh(n_devices: int) -> dict[str, int]:
  """Pure FSDP (ZeRO-3): params, gradients and Adam state split n ways; batch split n ways."""
  return dict(data=1, fsdp=n_devices, tensor=1)


# ------------------------------------------------------------------------------------------------ compile


def abstract_batch(config: ml_collections.ConfigDict, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The RL batch as sharded ShapeDtypeStructs (rows over data×fsdp when they divide, else replicated)."""
  B, P = config.rl.prompts_per_step, config.task.prompt_len
  if config.rl.get("partial_rollouts", False):  # the carry's step input: [Q, P] (carry.host_batch)
    B *= 1 + int(config.rl.max_staleness)
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  shapes = {"prompt_NxP": (B, P), "prompt_mask_NxP": (B, P), "answer_ids_NxA": (B, 4)}
  sh = lambda nd: sharding.batch_sharding(mesh, nd) if B % dp == 0 else sharding.replicated(mesh)
  return {k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=sh(len(s))) for k, s in shapes.items()}


def compile_step(config: ml_collections.ConfigDict, devices: list, mesh_shape: dict[str, int],
                 compiler_options: dict[str, Any] | None = None, hbm_bytes: int | None = None):
  """Lowers and compiles the one-graph step of the config's family (families.for_config: rl_step, or ppo_step with
  its critic) for `devices` on abstract sharded inputs; returns (compiled, seconds). `compiler_options` go to XLA
  for this compile only (e.g. {'xla_dump_to': DIR} for buffer_assignment_summary). `hbm_bytes`: the memory per
  device the decode layout is planned against (the target chip's, not this machine's)."""

  config = ml_collections.ConfigDict(config.to_dict())
  config.mesh.update(mesh_shape)
  mesh = sharding.make_mesh(config.mesh, devices)
  mcfg = model_lib.ModelConfig.from_config(config.model)
  spec = digits.reward_spec(mcfg.vocab_size)
  family = families.for_config(config)
  with carry_lib.batch_fields(digits.BATCH_FIELDS):  # rl.partial_rollouts: the workload's fields in the carry
    step = families.make_step(config, mesh, mcfg, spec, spec.ctx.tokenizer, family=family)
    st = state_lib.with_shardings(*family.state_spec(config, mesh, mcfg))
    t0 = time.perf_counter()
    with decode_layout.device_memory(hbm_bytes or decode_layout.device_memory_bytes()):
      lowered = step.lower(st, abstract_batch(config, mesh))
  compiled = lowered.compile(compiler_options=compiler_options)
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


def stated_lengths(spec: str, n: int, L: int) -> np.ndarray:
  """--lengths lognormal:MEDIAN:SIGMA -> n completion lengths in [1, L] (numpy seed 0)."""
  parts = spec.split(":")
  if len(parts) != 3 or parts[0] != "lognormal":
    raise ValueError(f"--lengths={spec!r}: write lognormal:MEDIAN:SIGMA (e.g. lognormal:1500:0.654).")
  try:
    median, sigma = float(parts[1]), float(parts[2])
  except ValueError:
    median = sigma = math.nan
  if not (math.isfinite(median) and median > 0 and math.isfinite(sigma) and sigma >= 0):
    raise ValueError(f"--lengths={spec!r}: MEDIAN must be a number > 0 and SIGMA one >= 0 (e.g. lognormal:1500:0.654).")
  draw = np.random.default_rng(0).lognormal(math.log(median), sigma, n)
  return np.clip(np.rint(draw), 1, L).astype(np.int64)


def check(config: ml_collections.ConfigDict, topology: str, mesh_shape: dict[str, int] | None = None,
          devices: list | None = None, compile: bool = True, lengths_N=None) -> dict[str, Any]:
  """The whole report for one config on one TPU topology (compiles once; `compile=False`: plan + roofline).
  `lengths_N`: completion lengths the roofline's rollout terms assume (roofline.decode_work; None: all L)."""
  chip = chip_of(topology)
  if compile:
    devices = tpu_devices(topology) if devices is None else devices
  n_dev = len(devices) if devices is not None else topology_size(topology)
  mesh_shape = sharding.mesh_shape(mesh_shape or default_mesh(n_dev), n_dev)
  cfg = ml_collections.ConfigDict(config.to_dict())
  cfg.mesh.update(mesh_shape)
  dp = mesh_shape["data"] * mesh_shape["fsdp"]
  workload_flags.check_runs(cfg, mesh_shape)  # evaluation is not compiled here
  hbm = int(chip.hbm_gib * GiB)
  cfg, chosen = auto.resolve(cfg, auto.Context(mesh_shape, hbm, "tpu"))  # the `auto` knobs, for the target chip
  layout, why = memory_plan.choose_decode(cfg, mesh_shape, hbm, plat="tpu")
  p = memory_plan.plan(cfg, mesh_shape, plat="tpu", decode=layout)
  rl = cfg.rl
  r = dict(topology=topology, n_devices=n_dev, mesh=mesh_shape, params=p.params, prompts=rl.prompts_per_step,
           G=rl.G, prompt_len=cfg.task.prompt_len, L=cfg.sampling.max_new_tokens, dtype=cfg.model.dtype,
           remat=cfg.model.remat, decode_layout=str(layout), decode_layout_why=why, auto=chosen,
           minibatches=rl.minibatches, rollout_chunks=rl.rollout_chunks,
           lora=(dict(rank=cfg.model.lora.rank, targets=list(cfg.model.lora.targets),
                      base_dtype=cfg.model.lora.base_dtype) if cfg.model.lora.rank else None),
           resident=dict(p.resident),
           roofline=roofline(cfg, mesh_shape, chip, layout, lengths_N=lengths_N), chip=dataclasses.asdict(chip),
           plan=dict(total_bytes=p.total_bytes, resident_bytes=p.resident_bytes, temp_bytes=p.temp_bytes,
                     peak_phase=p.peak_phase, fits=p.total_bytes <= hbm, headroom_frac=1 - p.total_bytes / hbm))
  if lengths_N is not None:  # the decode work of those lengths under the resolved config's chunks and slots
    r["lengths"] = dict(mean=float(lengths_N.mean()), max=int(lengths_N.max()),
                        **roofline_lib.decode_work(cfg, lengths_N))
  if not compile:
    # No program to read: the decode phase's collectives by its layout (the other phases' are not modelled).
    ici = roofline_lib.analytic_decode_ici(cfg, mesh_shape, topology, layout)
    r.update(roofline=roofline(cfg, mesh_shape, chip, layout, ici, lengths_N), ici_source="analytic (decode only)")
    return r
  compiled, compile_s = compile_step(cfg, devices, mesh_shape, hbm_bytes=hbm)
  mem = memory_report(compiled, hbm)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  colls = hlo_collectives.collectives(compiled.as_text())
  coords = [tuple(d.coords) for d in devices] if all(hasattr(d, "coords") for d in devices) else None
  ici = roofline_lib.ici_seconds(colls, chip, topology, coords)
  # The decode loop's collectives per generated token: its body runs once per token (sampling.decode_trips), in each
  # rollout chunk (the once-per-chunk reshards into the decode view run `rollout_chunks` times: not per token).
  steps = sampling.decode_trips(cfg.sampling.max_new_tokens,
                                sampling.SamplingConfig.from_config(cfg.sampling, eos_id=0, pad_id=0).exit_chunk
                                ) * cfg.rl.rollout_chunks
  if config_lib.setting(cfg, "sampling.engine") == "continuous":
    # its decode loops (one per compaction phase) run a data-dependent number of steps: per token = per iteration
    # of a phase's loop (each is the same decode step at another slot count)
    decode_loop = hlo_collectives.per_iteration_of_busiest_loop(colls, "rollout decode")
    per = lambda cs: sum(c.per_iteration for c in cs)
  else:
    decode_loop = hlo_collectives.in_loop(colls, "rollout decode", min_count=max(steps, 2))
    per = lambda cs: sum(c.count for c in cs) / steps
  # Collectives XLA adds on its own (no JAX op in their metadata: bookkeeping values of a few bytes) are reported
  # apart from the layout's per-token budget.
  per_token: dict[str, float] = {}
  for c in decode_loop:
    if c.op_name:
      per_token[c.kind] = per_token.get(c.kind, 0) + per([c])
  xla_own = [c for c in decode_loop if not c.op_name]
  mcfg = model_lib.ModelConfig.from_config(cfg.model)
  weights = decode_layout.weight_collectives(decode_loop, mcfg, mesh_shape, layout)
  bytes_of = lambda cs, size: sum(per([c]) * size(c) for c in cs)
  r.update(device_kind=devices[0].device_kind, compile_seconds=compile_s, memory=mem, ici_source="compiled program",
           xla_cost_flops_per_device=float(cost.get("flops", -1)) if cost else -1.0,
           roofline=roofline(cfg, mesh_shape, chip, layout, ici, lengths_N), decode_collectives_per_token=per_token,
           decode_weight_collectives_per_token=per(weights),
           decode_xla_collectives_per_token=dict(count=per(xla_own),
                                                 bytes=bytes_of(xla_own, lambda c: c.result_bytes)),
           decode_collective_budget=decode_layout.per_token_budget(mcfg, mesh_shape, layout),
           decode_ici_bytes_per_token=bytes_of(decode_loop, lambda c: c.moved_bytes))
  r["plan"]["vs_xla"] = p.total_bytes / (mem["argument_bytes"] + mem["temp_bytes"])
  return r


def format_report(r: dict[str, Any]) -> str:
  roof, pl = r["roofline"], r["plan"]
  g = lambda b: f"{b / GiB:.2f} GiB"
  head = (f"{r['topology']} ({r['n_devices']} × {r.get('device_kind', 'chips, not compiled')}), mesh {r['mesh']}, "
          f"{r['params'] / 1e9:.3f}B params, {r['prompts']} prompts × G {r['G']}, {r['prompt_len']}+{r['L']} tokens, {r['dtype']}, remat={r['remat']}")
  if r.get("lora"):
    head += (f"\nLoRA rank {r['lora']['rank']} on {', '.join(r['lora']['targets'])}: trains adapters only; frozen "
             f"base in {r['lora']['base_dtype']}; no reference copy (the base is the reference), no base moments")
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
  lines.append(f"decode layout: {r['decode_layout']} ({r['decode_layout_why']})")
  lines += [f"auto {key} = {why}" for key, why in r.get("auto", {}).items()]
  if "lengths" in r:
    w = r["lengths"]
    lines.append(f"rollout modelled for completion lengths {w.get('spec', 'as given')} (mean {w['mean']:.0f}, "
                 f"max {w['max']}): "
                 f"{w['steps']} decode steps, {w['row_steps']} row-steps, slot util "
                 f"{w.get('drawn', w['tokens']) / (w['row_steps'] + r['prompts'] * r['G']):.2f}, "
                 f"{w['kv_read']:.3g} KV positions read, {w['tokens']:.0f} tokens trained per step; decode "
                 f"{1e6 * r['roofline']['seconds']['rollout decode'] / w['tokens']:.2f} us per trained token"
                 + (f"; carry: {w['drawn']:.0f} tokens drawn per step, version lag mean {w['lag_mean']:.2f} max "
                    f"{w['lag_max']} ({100 * w['stale_frac']:.2f}% of tokens past rl.max_staleness, masked) over "
                    f"{w['updates']} steps" if "drawn" in w else ""))
  if "decode_collectives_per_token" in r:
    pt = r["decode_collectives_per_token"]
    counts = ", ".join(f"{n:g} {k}" for k, n in sorted(pt.items())) or "none"
    lines.append(f"decode loop collectives per token: {counts}"
                 f" ({r['decode_weight_collectives_per_token']:g} of weights), "
                 f"{r['decode_ici_bytes_per_token'] / 2**20:.2f} MiB over ICI per chip")
  ici = (" ICI from the compiled program's collectives;" if r.get("ici_source") == "compiled program" else
         " ICI of the decode layout's collectives only (no compile);")
  lines.append(f"roofline per phase ({roof['total_flops'] / 1e12:.1f} TFLOP analytic;{ici} bound = largest term):")
  lines.append(f"  {'phase':<24} {'TFLOP':>9} {'compute ms':>11} {'HBM ms':>9} {'ICI ms':>9} {'collectives':>12} "
               f"{'bound ms':>9}")
  for k, s in roof["seconds"].items():
    n_coll = roof["ici"].get(k, {}).get("collectives", 0)
    lines.append(f"  {k:<24} {roof['flops'].get(k, 0) / 1e12:9.1f} {roof['compute_seconds'][k] * 1e3:11.1f} "
                 f"{roof['hbm_seconds'][k] * 1e3:9.1f} {roof['ici_seconds'][k] * 1e3:9.1f} {n_coll:12.0f} "
                 f"{s * 1e3:9.1f}")
  lines.append(f"  estimated step time {roof['step_seconds'] * 1e3:67.1f} ms (lower bound)")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = workload_flags.parser(__doc__, sorted(memory_plan.PRESETS), ["bfloat16", "float32"], "",
                            "data=..,fsdp=..,tensor=.. (default: fsdp over all devices)")
  ap.add_argument("--topology", default="v5e:4x4", help="e.g. v5e:2x2, v5e:4x4, v5e:8x8, v5p:2x2x2, v4:2x2x2")
  ap.add_argument("--decode-layout", default="auto", choices=list(decode_layout.KINDS),
                  help="sampling.decode_layout: where the weights live while the rollout decodes")
  ap.add_argument("--decode-tp", type=errors.int_at_least(0), default=0,
                  help="sampling.decode_tp (0 = the smallest that fits)")
  ap.add_argument("--lengths", default="", metavar="lognormal:MEDIAN:SIGMA",
                  help="completion lengths the rollout's roofline terms assume (seed 0, capped at --L); "
                       "default: every row runs to L")
  ap.add_argument("--stream-batches", type=errors.int_at_least(1), default=1,
                  help="with --lengths: draw this many batches of them "
                  "(the rollout terms are averaged per step: the carry of --partial-rollouts over the stream, every "
                  "other engine batch by batch)")
  ap.add_argument("--no-compile", action="store_true", help="memory_plan + roofline only (no libtpu needed)")
  ap.add_argument("--buffers", default="", metavar="DUMP_DIR",
                  help="only summarise the buffer assignment XLA dumped to DUMP_DIR (no compile)")
  a = ap.parse_args(argv)
  if a.stream_batches != 1 and not a.lengths:  # it only scales the --lengths draw: alone it would change nothing
    ap.error(f"argument --stream-batches={a.stream_batches}: it is how many batches of --lengths to draw; pass "
             "--lengths lognormal:MEDIAN:SIGMA with it, or leave it out")
  try:
    if a.buffers:
      b = buffer_assignment_summary(a.buffers)
      print(json.dumps(b) if a.json else "\n".join(
          [f"arguments {b['argument_bytes'] / GiB:.3f} GiB, temp {b['temp_bytes'] / GiB:.3f} GiB per device "
           f"({b['file']})"] + [f"  {v['bytes'] / 2**20:9.1f} MiB  {v['shape']}" for v in b["largest_temp_values"]]))
      return 0
    mesh = memory_plan.parse_mesh(a.mesh) if a.mesh else None
    cfg = memory_plan.workload_config(mesh=None, **workload_flags.workload_kwargs(a))
    cfg.sampling.update(decode_layout=a.decode_layout, decode_tp=a.decode_tp)
    lengths = stated_lengths(a.lengths, a.prompts * a.G * a.stream_batches, a.L) if a.lengths else None
    r = check(cfg, a.topology, mesh, compile=not a.no_compile, lengths_N=lengths)
    if lengths is not None:
      r["lengths"]["spec"] = a.lengths
  except (ValueError, RuntimeError) as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  print(json.dumps(r) if a.json else format_report(r), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
