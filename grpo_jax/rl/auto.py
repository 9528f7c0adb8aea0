"""The one planner for `auto` config values: each knob registers its candidates and a chooser; `resolve` returns
the config with every `auto` replaced by its choice (and why), before the step is built.

A chooser sees the config, the mesh's axis sizes and the device memory, and may ask the memory planner
(memory_plan.plan, bytes per device) and a time model of its own. Registered here, in the order they resolve:
`sampling.decode_attention` (the continuous engine's KV store and kernel: the others' memory plans depend on it),
`rl.rollout_chunks` with `rl.minibatches` (chosen jointly; integer knobs, so their auto value is 0), `sampling.slots`
(the continuous engine's slot count; 0), `sampling.compaction` (its slot counts S, S/2, ...; 0), `rl.pack_len` (rl.packing's row length; 0) and `rl.pack_rows` (its
packed rows per micro-batch; 0). Other knobs register with
`register(Knob(...))` from their own module. A step built from an unresolved config (tests) runs each knob's
documented default; a `required` knob has none, and the step builders refuse it (`check_resolved`).
"""
import dataclasses
import math
from typing import Any, Callable

import jax
import ml_collections
from absl import logging

from grpo_jax.config import config_lib
from grpo_jax.infra.errors import ConfigError
from grpo_jax.model import model_config
from grpo_jax.model import paged_attention
from grpo_jax.rl import memory_plan
from grpo_jax.rl import packing
from grpo_jax.rollout import decode_layout

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Context:
  mesh: dict[str, int]  # axis sizes
  hbm_bytes: int | None  # per device; None = no limit
  platform: str | None = None  # the backend the step is for (None: JAX's default)


@dataclasses.dataclass(frozen=True)
class Knob:
  key: str  # dotted config key, e.g. "sampling.slots"
  candidates: Callable[[Any, Context], list]  # the values it may take, for this config and mesh
  choose: Callable[[Any, Context, list], tuple[Any, str]]  # (value, why) among them
  auto: Any = AUTO  # the value that asks for a choice ("auto", or 0 for an integer knob such as sampling.slots)
  applies: Callable[[Any], bool] = lambda config: True  # False: the knob means nothing for this config, left as is
  joint: tuple[str, ...] = ()  # more keys chosen with `key`: candidates and choices are then tuples, one per key
  required: bool = False  # no default for a step built unresolved: the step builders refuse its auto value


REGISTRY: dict[str, Knob] = {}


def register(knob: Knob) -> Knob:
  REGISTRY[knob.key] = knob
  return knob


def _get(config, key: str):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def resolve(config: ml_collections.ConfigDict, ctx: Context,
            log: bool = True) -> tuple[ml_collections.ConfigDict, dict[str, str]]:
  """A copy of `config` with every registered knob at its auto value chosen; -> (config, {key: 'value (why)'})."""
  out = ml_collections.ConfigDict(config.to_dict())
  chosen = {}
  for key, knob in REGISTRY.items():
    keys = (key,) + knob.joint
    try:
      values = [_get(out, k) for k in keys]
    except (KeyError, AttributeError):
      continue
    if knob.auto not in values or not knob.applies(out):
      continue
    pick, why = knob.choose(out, ctx, knob.candidates(out, ctx))
    picked = []
    for k, value, p in zip(keys, values, pick if knob.joint else (pick,)):
      if value == knob.auto:
        section, name = k.rsplit(".", 1)
        _get(out, section)[name] = p
        chosen[k] = f"{p} ({why})"
        picked.append(f"{k} = {p}")
    if log:
      logging.info("auto %s (%s)", ", ".join(picked), why)
  return out, chosen


def resolve_here(config: ml_collections.ConfigDict, mesh, lanes: int = 1) -> ml_collections.ConfigDict:
  """`resolve` for a step that runs on this process's devices over `mesh`; `lanes` vmapped runs share each
  device's memory (vmap stacks every array of the step once per run)."""
  return resolve(config, Context(dict(mesh.shape), decode_layout.device_memory_bytes() // lanes))[0]


def check_choosable(config, mesh: dict[str, int]) -> None:
  """The input checks' part (preflight, the R1 stages' configs): a knob that cannot choose (nothing fits this
  process's devices) raises its ConfigError before anything is written; the choice itself is made again, and
  logged, where the step is built."""
  resolve(config, Context(mesh, decode_layout.device_memory_bytes()), log=False)


def check_resolved(config) -> None:
  """What the step builders call: a `required` knob still at its auto value means a path skipped `resolve`."""
  for key, knob in REGISTRY.items():
    for k in ((key,) + knob.joint) if knob.required else ():
      if _get(config, k) == knob.auto:
        raise RuntimeError(f"config.{k}={knob.auto!r} (auto) reached the step builder unresolved: resolve the config "
                           "first (auto.resolve / auto.resolve_here), as every entry path does.")


def size(nbytes: int) -> str:
  return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def _planned(config, ctx: Context) -> tuple[memory_plan.Plan, bool, str]:
  """(the planner's bytes per device for `config`, whether they fit ctx's memory, 'X of Y' or 'no memory limit'):
  every chooser's fit test (no margin on top of the planner's figure)."""
  p = memory_plan.plan(config, ctx.mesh, ctx.platform, hbm_bytes=ctx.hbm_bytes)
  if ctx.hbm_bytes is None:
    return p, True, "no memory limit"
  return p, p.total_bytes <= ctx.hbm_bytes, f"{size(p.total_bytes)} of {size(ctx.hbm_bytes)}"


def _with(config, updates: dict) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(config.to_dict())
  for k, v in updates.items():
    section, name = k.rsplit(".", 1)
    _get(c, section)[name] = v
  return c


# ------------------------------------------------------------------------------------------ sampling.decode_attention


def choose_attention(config, ctx: Context, candidates: list[str]) -> tuple[str, str]:
  """The TPU ragged paged attention kernel on a TPU when it supports the model's shape, else the plain-JAX live
  attention (paged_attention.choose; the fallback and its reason are logged by `resolve`). Registered first: the
  memory plans of the knobs after it depend on the KV store it picks."""
  del candidates
  m = model_config.ModelConfig.from_config(config.model)
  return paged_attention.choose(m.head_dim, m.kv_heads, config.sampling.page_size, m.dtype,
                                ctx.platform or jax.default_backend())


register(Knob("sampling.decode_attention", lambda c, ctx: ["tpu_ragged", "plain"], choose_attention,
              applies=lambda c: c.sampling.get("engine", "static") == "continuous"))


# ------------------------------------------------------------------------------ rl.rollout_chunks × rl.minibatches
# First in the registry: the slot candidates below divide the rows by rl.rollout_chunks.

SPLIT_KEYS = ("rl.rollout_chunks", "rl.minibatches")


def split_counts(config, ctx: Context) -> list[int]:
  """The counts that cut prompts_per_step*G rows into equal parts of a multiple of the mesh's row split
  (data × fsdp; validate.py's rule for both knobs): the divisors of rows / split, smallest first."""
  per = config.rl.prompts_per_step * config.rl.G // (ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1))
  return [d for d in range(1, per + 1) if per % d == 0]


def split_candidates(config, ctx: Context) -> list[tuple[int, int]]:
  """(rollout_chunks, minibatches) pairs, the auto ones over split_counts, in order of cost: fewest rollout chunks
  first (each chunk decodes its rows in its own sequence of L steps: c chunks ≈ c× the decode's steps and weight
  reads), then fewest minibatches (each one more forward+backward pass over the weights). The two shrink different
  phases (chunks the rollout and scoring forwards, minibatches the update), so the first pair that fits is also the
  fewest of each."""
  counts = split_counts(config, ctx)
  chunks, mbs = (counts if int(_get(config, k)) == 0 else [int(_get(config, k))] for k in SPLIT_KEYS)
  return [(c, m) for c in chunks for m in mbs]


def choose_split(config, ctx: Context, candidates: list[tuple[int, int]]) -> tuple[tuple[int, int], str]:
  """The first candidate whose planned bytes per device fit ctx's memory; without a limit the first (1 where auto).
  Nothing fits: a ConfigError (exit 2) naming the keys and what to change, not a pick that would not run."""
  if ctx.hbm_bytes is None:
    return candidates[0], "no device memory limit known: the fewest"
  over = ""
  for c, m in candidates:
    p, fits, text = _planned(_with(config, dict(zip(SPLIT_KEYS, (c, m)))), ctx)
    if fits:
      return (c, m), f"planned {text} per device{over}"
    over = over or f"; {c} chunk(s) x {m} minibatch(es) would plan {size(p.total_bytes)}"
  auto_keys = [k for k in SPLIT_KEYS if int(_get(config, k)) == 0]
  fix = "lower rl.prompts_per_step, rl.G or sampling.max_new_tokens, set model.remat=full, or add devices (mesh.fsdp)"
  if "rl.rollout_chunks" not in auto_keys and p.peak_phase != "update":
    fix = f"set rl.rollout_chunks=0 (auto) too (the {p.peak_phase} phase peaks), or " + fix
  raise ConfigError(f"config.{', '.join(auto_keys)}: auto (0) finds no split that fits {size(ctx.hbm_bytes)} per "
                    f"device (the most, rl.rollout_chunks={c} x rl.minibatches={m}, still plans {size(p.total_bytes)}, "
                    f"peak in {p.peak_phase}); {fix}.")


register(Knob(SPLIT_KEYS[0], split_candidates, choose_split, auto=0, joint=SPLIT_KEYS[1:], required=True))


# ------------------------------------------------------------------------------------------ sampling.slots


def _rows(config) -> int:
  rl = config.rl
  return rl.prompts_per_step * rl.G * (rl.oversample if rl.dynamic_sampling else 1)


def slot_candidates(config, ctx: Context) -> list[int]:
  """N / rl.rollout_chunks (the rollout chunks bound the slots), then halves, while a multiple of the mesh's row
  split (data × fsdp), largest first."""
  split = ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1)
  out, s = [], _rows(config) // int(config.rl.rollout_chunks)
  while s >= split and s % split == 0:
    out.append(s)
    if s % 2:
      break
    s //= 2
  return out


def worst_case_steps(n: int, slots: int, L: int) -> int:
  """Sequential decode steps when every row runs to L: ceil(N / S) waves of L (refill: a slot takes a row a step
  after its last one ends). Fewer slots cost time, not only memory saved (the issue's simulation: 8 of 64 slots
  need about twice the longest row's steps)."""
  return math.ceil(n / slots) * L


def choose_slots(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """The most slots whose step fits the device memory (the fewest sequential steps); the first candidate without a
  limit."""
  n, L = _rows(config), config.sampling.max_new_tokens
  if not candidates:
    raise ValueError(f"sampling.slots=auto: no slot count divides the {n} rows over mesh data*fsdp; set it.")
  for s in candidates:
    _, fits, limit = _planned(_with(config, {"sampling.slots": s, "sampling.engine": "continuous"}), ctx)
    if fits:
      return s, f"{limit}; at most {worst_case_steps(n, s, L)} decode steps"
  s = candidates[-1]
  return s, f"no slot count fits the device memory; the fewest, {s}"


register(Knob("sampling.slots", slot_candidates, choose_slots, auto=0,
              applies=lambda c: c.sampling.get("engine", "static") == "continuous"))


# ------------------------------------------------------------------------------------------ sampling.compaction

# Completions at least this long can end in a tail that compaction pays for; below it, every compaction size is a
# decode step compiled for nothing. bench-tail (L = 512, lognormal lengths) ran its rollout in 0.84x the time with 8
# sizes instead of 4, and engine.simulate (bench-tail's per-step costs) puts no compaction at about 3x the decode time
# of 8 sizes; each size costs one more decode step to compile: 1.5-2 CPU-s at configs/grpo_arith.py:small's shape
# (benchmarks/compile_cost.py, docs/performance.md), so a rollout of 72 tokens and 6 steps never wins it back.
LONG_COMPLETIONS = 256


def choose_compaction(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """config_lib.COMPACTION sizes for completions of LONG_COMPLETIONS tokens or more, else one (no compaction)."""
  del ctx
  L = config.sampling.max_new_tokens
  if L >= LONG_COMPLETIONS:
    return candidates[0], (f"max_new_tokens {L} >= {LONG_COMPLETIONS}: a long tail decodes on ever fewer slots "
                           "(bench-tail: 0.84x the rollout of 4 sizes)")
  return candidates[-1], (f"max_new_tokens {L} < {LONG_COMPLETIONS}: too short a tail to pay for the decode step "
                          "each compaction size compiles")


register(Knob("sampling.compaction", lambda c, ctx: [config_lib.COMPACTION, 1], choose_compaction, auto=0,
              applies=lambda c: c.sampling.get("engine", "static") == "continuous"))



# ------------------------------------------------------------------------------------------ rl.pack_len


def pack_len_candidates(config, ctx: Context) -> list[int]:
  """packing.default_pack_len(P + L) for the context's backend (P + L rounded up to the 128-token tiles the
  attention kernels pad to; P + L itself on the CPU's einsum path), then P + L itself: attention per packed row
  grows with pack_len², so nothing longer is offered."""
  T = config.task.prompt_len + config.sampling.max_new_tokens
  return sorted({packing.default_pack_len(T, ctx.platform), T}, reverse=True)


def choose_pack_len(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """The longest candidate whose step fits the device memory (more room per row for the next sample)."""
  for n in candidates:
    _, fits, limit = _planned(_with(config, {"rl.pack_len": n}), ctx)
    if fits:
      T = config.task.prompt_len + config.sampling.max_new_tokens
      return n, (f"P + L = {T} to the 128 tile" if n > T else f"P + L = {T}") + f"; {limit}"
  return candidates[-1], "no pack_len fits the device memory; the shortest, P + L"


register(Knob("rl.pack_len", pack_len_candidates, choose_pack_len, auto=0, applies=lambda c: bool(c.rl.packing)))


# ------------------------------------------------------------------------------------------ rl.pack_rows


def _pass_rows(config, ctx: Context) -> tuple[int, int]:
  """(a device's rows of the packed scoring passes, pack_len): the rows the micro-batches are cut from."""
  split = ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1)
  T = config.task.prompt_len + config.sampling.max_new_tokens
  return -(-config.rl.prompts_per_step * config.rl.G // split), packing.pack_len(config, T, ctx.platform)


def pack_rows_candidates(config, ctx: Context) -> list[int]:
  """packing.default_pack_rows for this backend (the CPU: the fewest rows of CPU_MICROBATCH_TOKENS tokens; else an
  eighth of a device's rows), then halves down to 1: fewer rows per micro-batch hold fewer activations."""
  n_local, C = _pass_rows(config, ctx)
  r, out = packing.default_pack_rows(n_local, C, ctx.platform), []
  while r >= 1:
    out.append(r)
    r //= 2
  return out


def choose_pack_rows(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """The first candidate (the backend's default) whose step fits the device memory, else fewer rows."""
  n_local, C = _pass_rows(config, ctx)
  for r in candidates:
    _, fits, limit = _planned(_with(config, {"rl.pack_rows": r}), ctx)
    if fits:
      return r, f"{r * C} tokens per micro-batch of {n_local} rows' passes; {limit}"
  return candidates[-1], "no micro-batch fits the device memory; the fewest rows, 1"


register(Knob("rl.pack_rows", pack_rows_candidates, choose_pack_rows, auto=0, applies=lambda c: bool(c.rl.packing)))
