"""Sweep points, declared next to the experiment (big_vision style) or on the command line.

    # configs/<exp>.py
    def get_sweep(h):   # h is this module
      return h.product([h.sweep("rl.beta", [0.02, 0.04]), h.sweep("optim.lr", [1e-6, 3e-6])])

    python -m grpo_jax.sweep ... --sweep="rl.beta=0.02,0.04 optim.lr=1e-6,3e-6"     # the same points

A point is a set of config overrides, applied to the experiment's config with `config_lib.override` (the one
override mechanism: declared keys, declared types, one-line errors), and a name (its directory under the sweep's
workdir and its row in the report). `h.sweep(key, values)` is one axis; `h.product` crosses axes (the last varies
fastest), `h.zip` pairs them; `h.named(name, overrides)` is a hand-made point (e.g. an ablation row); `h.base()` is the
config alone. The pseudo-key
`algo` names an algorithm preset and stands for all of its settings (`presets.overrides`), applied before the
point's other keys, as `:algo=<name>` would be.
"""
from __future__ import annotations

import builtins
import dataclasses
import itertools
import math
import re
from typing import Any, Iterable, Sequence

import ml_collections

from grpo_jax.config import config_lib
from grpo_jax.config import presets

ALGO = "algo"  # the pseudo-key of a whole preset


@dataclasses.dataclass(frozen=True)
class Point:
  """Overrides (dotted key -> value, in order) and the parts its name is made of: a given name, or a key whose
  `key=value` is written (names are rendered once all points are known: `names`)."""
  overrides: tuple[tuple[str, Any], ...]
  parts: tuple[tuple[str, str], ...]  # ("name", text) | ("key", dotted key)

  @property
  def dict(self) -> dict[str, Any]:
    return dict(self.overrides)


def sweep(key: str, values: Iterable[Any]) -> list[Point]:
  """One axis: a point per value of `key` (a dotted config key, or `algo`)."""
  values = list(values)
  if not isinstance(key, str) or not key:
    raise config_lib.ConfigError(f"h.sweep: key {key!r} must be a dotted config key such as 'rl.beta'.")
  if not values:
    raise config_lib.ConfigError(f"h.sweep({key!r}, []): give at least one value.")
  return [Point(((key, v),), (("key", key),)) for v in values]


def base() -> list[Point]:
  """The config alone, as one point (a get_sweep that sweeps nothing for some args)."""
  return [Point((), ())]


def named(name: str, overrides: dict[str, Any] | None = None) -> list[Point]:
  """One hand-made point: `name` (its directory and report row) and its overrides."""
  if not isinstance(name, str) or not name.strip():
    raise config_lib.ConfigError(f"h.named: the name {name!r} must be a non-empty string.")
  return [Point(tuple((overrides or {}).items()), (("name", name),))]


def _merge(points: Sequence[Point]) -> Point:
  seen: dict[str, Any] = {}
  for p in points:
    for k, v in p.overrides:
      if k in seen:
        raise config_lib.ConfigError(f"sweep: key {k!r} is set by two axes of one product/zip; set it in one.")
      seen[k] = v
  return Point(tuple(o for p in points for o in p.overrides), tuple(x for p in points for x in p.parts))


def product(axes: Sequence[Sequence[Point]]) -> list[Point]:
  """Every combination of one point per axis (the last axis varies fastest)."""
  return [_merge(combo) for combo in itertools.product(*axes)]


def zip(axes: Sequence[Sequence[Point]]) -> list[Point]:  # pylint: disable=redefined-builtin
  """The i-th points of every axis together; the axes must have the same length."""
  lengths = {len(a) for a in axes}
  if len(lengths) > 1:
    raise config_lib.ConfigError(f"h.zip: the axes have {sorted(lengths)} points; zip needs equal lengths.")
  return [_merge(combo) for combo in builtins.zip(*axes)]


# ------------------------------------------------------------------------------------------ expansion and names


def expand(overrides: dict[str, Any]) -> dict[str, Any]:
  """Dotted overrides for config_lib.override: `algo` becomes its preset's settings, applied first."""
  out = {}
  if ALGO in overrides:
    out.update(presets.overrides(overrides[ALGO]))
  out.update({k: v for k, v in overrides.items() if k != ALGO})
  return out


def apply(config: ml_collections.ConfigDict, point: Point) -> ml_collections.ConfigDict:
  """The point's config: `config` with its overrides (one-line ConfigError on an unknown key or a wrong type)."""
  return config_lib.override(config, expand(point.dict))


def fmt(v: Any, exact: bool = False) -> str:
  """A value as a point's name writes it: floats short (%g; exact: the shortest repr that reads back the same
  float), tuples of (name, weight) as name:weight."""
  if isinstance(v, bool):
    return str(v).lower()
  if isinstance(v, float):
    return (repr(v) if exact else f"{v:g}") if math.isfinite(v) else str(v)
  if isinstance(v, (tuple, list)):
    return "+".join(":".join(fmt(x, exact) for x in e) if isinstance(e, (tuple, list)) else fmt(e, exact) for e in v)
  return str(v)


def _hashable(v: Any) -> Any:
  if isinstance(v, (tuple, list)):
    return tuple(_hashable(x) for x in v)
  try:
    hash(v)
  except TypeError:  # a dict (refused later by config_lib.override, one line)
    return repr(v)
  return v


_UNSAFE = re.compile(r"[^A-Za-z0-9_.=,+:@-]+")


def dirname(name: str) -> str:
  """A point's name as a directory name (spaces, slashes, brackets and such become '_')."""
  out = _UNSAFE.sub("_", name).strip("_.")
  return out or "point"


def exact_keys(overrides: Sequence[dict[str, Any]]) -> set[str]:
  """The keys some of whose distinct values `fmt` writes alike (1e-6 and 1.0000001e-6): written with exact=True."""
  values: dict[str, set] = {}
  for d in overrides:
    for k, v in d.items():
      values.setdefault(k, set()).add(_hashable(v))
  return {k for k, vs in values.items() if len({fmt(v) for v in vs}) < len(vs)}


def names(points: Sequence[Point]) -> list[str]:
  """Each point's name: its given names and `key=value` parts joined by ','; a key is written by its last
  component unless two swept keys share it, and its values short (%g) unless that writes two of them alike
  (lr=1e-6 and 1.0000001e-6: then every value of that key exactly)."""
  keys = {k for p in points for kind, k in p.parts if kind == "key"}
  last = {}
  for k in keys:
    last.setdefault(k.split(".")[-1], []).append(k)
  label = {k: (k.split(".")[-1] if len(last[k.split(".")[-1]]) == 1 else k) for k in keys}
  exact = exact_keys([{k: v for k, v in p.overrides if ("key", k) in p.parts} for p in points])
  out = []
  for p in points:
    d = p.dict
    out.append(",".join(text if kind == "name" else f"{label[text]}={fmt(d[text], text in exact)}"
                        for kind, text in p.parts))
  return out


# ----------------------------------------------------------------------------------------------- command line


def _declared(config: ml_collections.ConfigDict, key: str) -> Any:
  node = config
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      config_lib.override(config, {key: None})  # raises the one-line unknown-key error, with a suggestion
    node = node[part]
  return node


def _typed(key: str, text: str, old: Any) -> Any:
  """`text` as the declared type of `old` (before config_lib.override, which refuses a str for a float key)."""
  text = config_lib.auto_text(key, text)
  if isinstance(old, (tuple, list)):
    raise config_lib.ConfigError(f"--sweep: {key} is a tuple; tuple values cannot be listed on the command line "
                                 "(commas separate values): declare the axis in the config file's get_sweep(h).")
  try:
    if isinstance(old, bool):
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      return text.lower() in ("true", "1")
    if isinstance(old, int):
      return int(text)
    if isinstance(old, float):
      return float(text)
    return text
  except ValueError:
    raise config_lib.ConfigError(f"--sweep: {key}={text!r} is not a {type(old).__name__}, the declared type of "
                                 f"config.{key}.") from None


def parse(text: str, config: ml_collections.ConfigDict) -> list[Point]:
  """`--sweep="rl.beta=0,0.02 optim.lr=1e-6,3e-6"`: one axis per `key=v1,v2,...`, crossed (h.product); each value
  converted to the key's declared type."""
  axes = []
  for item in text.split():
    key, eq, values = item.partition("=")
    if not eq or not key or not values:
      raise config_lib.ConfigError(f"--sweep: {item!r} must read key=v1,v2,... (e.g. rl.beta=0.02,0.04); axes are "
                                   "separated by spaces.")
    raw = [v.strip() for v in values.split(",")]
    if any(not v for v in raw):
      raise config_lib.ConfigError(f"--sweep: {item!r} has an empty value; write key=v1,v2,...")
    if key == ALGO:
      for v in raw:
        presets.overrides(v)  # an unknown preset: one line naming the known ones
      axes.append(sweep(key, raw))
      continue
    old = _declared(config, key)
    axes.append(sweep(key, [_typed(key, v, old) for v in raw]))
  if not axes:
    raise config_lib.ConfigError("--sweep is empty; write key=v1,v2,... (e.g. --sweep='rl.beta=0.02,0.04').")
  return product(axes)


def literal(value: Any) -> str:
  """A value as a `--config.<key>=` flag writes it (ml_collections parses it back to the same value)."""
  if isinstance(value, bool):
    return str(value)
  if isinstance(value, float):
    return repr(value)
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  return str(value)

