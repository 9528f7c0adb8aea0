"""The one planner for `auto` config values: each knob registers its candidates and a chooser; `resolve` returns
the config with every `auto` replaced by its choice (and why), before the step is built.

A chooser sees the config, the mesh's axis sizes and the device memory, and may ask the memory planner
(memory_plan.plan, bytes per device) and a time model of its own. Registered here: `sampling.slots` (the continuous
engine's slot count; an integer knob, so its auto value is 0) and `rl.pack_len` (rl.packing's row length; 0). Other knobs register with `register(Knob(...))`
from their own module. A step built from an unresolved config (tests) runs each knob's documented default.
"""
import dataclasses
import math
from typing import Any, Callable

import ml_collections
from absl import logging

from grpo_jax.rl import memory_plan
from grpo_jax.rl import packing

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


REGISTRY: dict[str, Knob] = {}


def register(knob: Knob) -> Knob:
  REGISTRY[knob.key] = knob
  return knob


def _get(config, key: str):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def resolve(config: ml_collections.ConfigDict, ctx: Context) -> tuple[ml_collections.ConfigDict, dict[str, str]]:
  """A copy of `config` with every registered knob at its auto value chosen; -> (config, {key: 'value (why)'})."""
  out = ml_collections.ConfigDict(config.to_dict())
  chosen = {}
  for key, knob in REGISTRY.items():
    try:
      value = _get(out, key)
    except (KeyError, AttributeError):
      continue
    if value != knob.auto or not knob.applies(out):
      continue
    pick, why = knob.choose(out, ctx, knob.candidates(out, ctx))
    section, name = key.rsplit(".", 1)
    _get(out, section)[name] = pick
    chosen[key] = f"{pick} ({why})"
    logging.info("auto %s = %s", key, chosen[key])
  return out, chosen


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
    c = ml_collections.ConfigDict(config.to_dict())
    c.sampling.slots = s
    c.sampling.engine = "continuous"
    total = memory_plan.plan(c, ctx.mesh, ctx.platform, hbm_bytes=ctx.hbm_bytes).total_bytes
    if ctx.hbm_bytes is None or total <= ctx.hbm_bytes:
      limit = "no memory limit" if ctx.hbm_bytes is None else f"{total / 2**30:.2f} of {ctx.hbm_bytes / 2**30:.1f} GiB"
      return s, f"{limit}; at most {worst_case_steps(n, s, L)} decode steps"
  s = candidates[-1]
  return s, f"no slot count fits the device memory; the fewest, {s}"


register(Knob("sampling.slots", slot_candidates, choose_slots, auto=0,
              applies=lambda c: c.sampling.get("engine", "static") == "continuous"))



# ------------------------------------------------------------------------------------------ rl.pack_len


def pack_len_candidates(config, ctx: Context) -> list[int]:
  """packing.default_pack_len(P + L) (P + L rounded up to the 128-token tiles the attention kernels pad to), then
  P + L itself: attention per packed row grows with pack_len², so nothing longer is offered."""
  del ctx
  T = config.task.prompt_len + config.sampling.max_new_tokens
  return sorted({packing.default_pack_len(T), T}, reverse=True)


def choose_pack_len(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """The longest candidate whose step fits the device memory (more room per row for the next sample)."""
  for n in candidates:
    c = ml_collections.ConfigDict(config.to_dict())
    c.rl.pack_len = n
    total = memory_plan.plan(c, ctx.mesh, ctx.platform, hbm_bytes=ctx.hbm_bytes).total_bytes
    if ctx.hbm_bytes is None or total <= ctx.hbm_bytes:
      limit = "no memory limit" if ctx.hbm_bytes is None else f"{total / 2**30:.2f} of {ctx.hbm_bytes / 2**30:.1f} GiB"
      return n, f"P + L = {config.task.prompt_len + config.sampling.max_new_tokens} to the 128 tile; {limit}"
  return candidates[-1], "no pack_len fits the device memory; the shortest, P + L"


register(Knob("rl.pack_len", pack_len_candidates, choose_pack_len, auto=0, applies=lambda c: bool(c.rl.packing)))
