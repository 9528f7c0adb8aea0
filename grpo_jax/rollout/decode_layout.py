"""Where the weights live while a rollout decodes: a decode layout, put in place once per rollout.

Training keeps every weight split over `fsdp` (ZeRO-3). A decode step multiplies a few rows by every weight, so under
that layout each decoded token all-gathers every weight over the interconnect (Qwen2.5-1.5B on 8 chips: 7/8 of its
3.1 GB of bf16 weights into every chip, per token). Decode instead runs on weights put into a decode layout once,
before the loop (`sampling.decode_layout`):

  gathered  every weight whole on every chip, split only over `tensor`, in the compute dtype: no weight collective
            per token. Costs the model's compute-dtype bytes (÷ tensor) per chip for the rollout.
  tp        tensor-parallel decode over groups of `decode_tp` chips of the `fsdp` axis, for models whose gathered
            weights do not fit one chip. A decode-time view of the mesh splits fsdp into fsdp_rows × fsdp_tp: rows
            go over data × fsdp_rows, heads / MLP / vocabulary over fsdp_tp × tensor (Megatron). Per token and chip:
            one all-reduce of the [rows, D] activations after attention and one after the MLP of every layer, one
            all-reduce for the embedding lookup (the table is split by vocabulary) and one all-gather of the
            [rows, V] fp32 logits (the sampler needs whole rows). When the TP degree exceeds the KV heads, each KV
            head is repeated TP / kv_heads times (its kernels and its cache: cache bytes per chip grow by that
            factor over an even split), so every chip attends with its own query heads' KV head.
  fsdp      the training layout: weights stay split and are all-gathered at every token (one per weight).

`auto` (the default) takes `gathered` when the planner says the step fits the device's memory with it, else the
smallest `tp` degree that fits, else `fsdp` (memory_plan.choose_decode: the choice needs the planner, which costs
each layout with this module), chosen and logged with the other `auto` knobs before the step is traced (rl/auto.py);
the traced rollout reads the resolved value (`from_config`). The layout changes no result: the same tokens and
log-probs as one device, within the usual reduction-order rounding.
"""
import contextlib
import dataclasses
import functools
import itertools
import math
import os
from typing import Any, Iterator, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from grpo_jax.model import model as model_lib

from grpo_jax.model import decode as decode_lib
from grpo_jax.infra import sharding

KINDS = ("auto", "gathered", "tp", "fsdp")
VIEW_AXES = ("data", "fsdp_rows", "fsdp_tp", "tensor")  # the tp layout's view of the mesh ('fsdp' = rows × tp)
_UNSPLIT = ("layers", "length", "head_dim", "cache_len")


@dataclasses.dataclass(frozen=True)
class Layout:
  kind: str  # gathered | tp | fsdp
  tp: int = 1  # fsdp devices per tensor-parallel group (kind 'tp')

  def __str__(self) -> str:
    return f"tp={self.tp}" if self.kind == "tp" else self.kind


def rules(layout: Layout, base: tuple | None = None) -> tuple:
  """The logical-axis rules decode runs under, from training's (`base`: the rules in force, default
  sharding.LOGICAL_RULES): gathered drops the FSDP split of 'embed'."""
  base = tuple(base or sharding.LOGICAL_RULES)
  if layout.kind == "fsdp":
    return base
  if layout.kind == "gathered":
    return tuple((k, None if k == "embed" else v) for k, v in base)
  tp_axes = ("fsdp_tp", "tensor")
  return ((("batch", ("data", "fsdp_rows")), ("embed", None))
          + tuple((k, tp_axes) for k in ("heads", "kv_heads", "mlp", "vocab")) + tuple((k, None) for k in _UNSPLIT))


def tp_degree(mesh: dict[str, int], layout: Layout) -> int:
  """Devices that split a layer's heads in decode: fsdp_tp × tensor."""
  return layout.tp * mesh.get("tensor", 1) if layout.kind == "tp" else mesh.get("tensor", 1)


def kv_repeat(mcfg: model_lib.ModelConfig, mesh: dict[str, int], layout: Layout) -> int:
  """How often each KV head is repeated so the TP degree splits them evenly (1: not at all)."""
  t = tp_degree(mesh, layout)
  if layout.kind != "tp" or mcfg.kv_heads % t == 0:
    return 1
  return t // mcfg.kv_heads


def check(mcfg: model_lib.ModelConfig, mesh: dict[str, int], layout: Layout) -> str | None:
  """Why `layout` cannot decode `mcfg` on `mesh` (None: it can)."""
  if layout.kind != "tp":
    return None
  f, t = mesh.get("fsdp", 1), tp_degree(mesh, layout)
  if layout.tp < 2 or f % layout.tp:
    return f"sampling.decode_tp={layout.tp}: must be >= 2 and divide mesh.fsdp={f}"
  if mcfg.heads % t:
    return f"sampling.decode_tp={layout.tp}: decode_tp × mesh.tensor = {t} must divide model.heads={mcfg.heads}"
  if mcfg.kv_heads % t and t % mcfg.kv_heads:
    return (f"sampling.decode_tp={layout.tp}: decode_tp × mesh.tensor = {t} must divide model.kv_heads="
            f"{mcfg.kv_heads} or be a multiple of it (each KV head is then repeated)")
  return None


def tp_degrees(mcfg: model_lib.ModelConfig, mesh: dict[str, int]) -> list[int]:
  """Every valid decode_tp for this model and mesh, smallest first."""
  return [d for d in range(2, mesh.get("fsdp", 1) + 1) if check(mcfg, mesh, Layout("tp", d)) is None]


def from_config(mcfg: model_lib.ModelConfig, sampling_cfg, mesh: dict[str, int]) -> Layout:
  """The layout `sampling.decode_layout` / `decode_tp` name (resolved by rl/auto.py before the step is traced). A
  step built from an unresolved config gets no planner: `auto` is gathered where the mesh has no fsdp split (what the
  planner picks there too) and the training layout otherwise; `tp` with degree 0 the smallest valid degree."""
  kind, tp = sampling_cfg.get("decode_layout", "auto"), int(sampling_cfg.get("decode_tp", 0))
  if kind == "auto":
    return Layout("gathered") if mesh.get("fsdp", 1) == 1 else Layout("fsdp")
  if kind == "tp":
    return Layout("tp", tp or (tp_degrees(mcfg, mesh) or [1])[0])
  return Layout(kind)


def _axes(rule) -> tuple[str, ...]:
  """A logical-axis rule's mesh axes as a tuple (a rule maps to None, one axis name, or a tuple of them)."""
  return rule if isinstance(rule, tuple) else (rule,) if rule else ()


def _view_sizes(mesh: dict[str, int], layout: Layout) -> dict[str, int]:
  """The mesh's axis sizes with the tp view's fsdp_rows × fsdp_tp split of `fsdp` added."""
  return dict(mesh, fsdp_rows=mesh.get("fsdp", 1) // max(layout.tp, 1), fsdp_tp=layout.tp)


# ------------------------------------------------------------------------------------------- collectives


def per_token_budget(mcfg: model_lib.ModelConfig, mesh: dict[str, int], layout: Layout) -> dict[str, int] | None:
  """The collectives one decode step may run on a chip in `layout` (None: fsdp, one all-gather per weight).

  Weights split over t = tp_degree chips (Megatron): an all-reduce of the [rows, D] activations after attention and
  after the MLP of each layer, one for the embedding lookup (the table is split by vocabulary) and one all-gather of
  the [rows, V] logits (the sampler draws from whole rows). t = 1: none at all."""
  if layout.kind == "fsdp":
    return None
  if tp_degree(mesh, layout) == 1:
    return {}
  return {"all-reduce": 2 * mcfg.layers + 1, "all-gather": 1}


def weight_shapes(mcfg: model_lib.ModelConfig, mesh: dict[str, int], layout: Layout) -> set[tuple[int, ...]]:
  """Every shape a decode weight (one layer's, the table, the head, a norm) can have as the result of a collective
  in the decode loop: whole, or split by any of the axes its dims map to in `layout` or by `tensor` (a weight
  all-gathered over the FSDP axes is no longer split over them). How a collective of weights is told apart from one
  of activations (which carry the rows) in a compiled program."""
  dm = decode_mcfg(mcfg, mesh, layout)
  abstract = model_lib.param_shapes(dm)
  specs = jax.tree.leaves(model_lib.param_axes(dm), is_leaf=lambda x: isinstance(x, PartitionSpec))
  sizes = _view_sizes(mesh, layout)
  keep = lambda axes: tuple(a for a in _axes(axes) if a == "tensor")
  rule_sets = ({k: keep(v) for k, v in sharding.LOGICAL_RULES}, dict(rules(layout)))
  out = set()
  for (path, x), spec in zip(jax.tree_util.tree_flatten_with_path(abstract)[0], specs):
    names, dims = tuple(spec), x.shape
    if jax.tree_util.keystr(path).startswith("['layers']"):
      names, dims = names[1:], dims[1:]
    options = []
    for name, dim in zip(names, dims):
      divs = {1}
      for r in rule_sets:
        axes = _axes(r.get(name))
        for k in range(1, len(axes) + 1):
          for sub in itertools.combinations(axes, k):
            divs.add(math.prod(sizes.get(a, 1) for a in sub))
      options.append(sorted({dim // d for d in divs if dim % d == 0}))
    out.update(itertools.product(*options))
  return out


def weight_collectives(colls, mcfg: model_lib.ModelConfig, mesh: dict[str, int], layout: Layout) -> list:
  """The collectives (hlo_collectives.Collective) whose result is shaped like a weight (weight_shapes)."""
  shapes = weight_shapes(mcfg, mesh, layout)
  return [c for c in colls if any(d in ("f32", "bf16", "f16") and dims in shapes for d, dims in c.shapes)]


# ------------------------------------------------------------------------------------------------ memory


def decode_mcfg(mcfg: model_lib.ModelConfig, mesh: dict[str, int], layout: Layout) -> model_lib.ModelConfig:
  """The model as decode runs it: with its KV heads repeated (kv_repeat) under a tp layout."""
  r = kv_repeat(mcfg, mesh, layout)
  return mcfg if r == 1 else dataclasses.replace(mcfg, kv_heads=mcfg.kv_heads * r)


def _decode_param_bytes(mcfg: model_lib.ModelConfig, mesh: dict[str, int], layout: Layout) -> tuple[int, int]:
  """Bytes per device of `model.decode_weights` in `layout`: (layers and norms, embedding table and untied head),
  kernels, biases and tables in the compute dtype."""
  return _decode_param_bytes_cached(mcfg, tuple(sorted(mesh.items())), layout)


@functools.lru_cache(maxsize=64)  # tracing a 7B init takes seconds; `auto` plans every layout it tries
def _decode_param_bytes_cached(mcfg: model_lib.ModelConfig, mesh_items: tuple, layout: Layout) -> tuple[int, int]:
  mesh = dict(mesh_items)
  cb = 2 if mcfg.dtype == "bfloat16" else 4
  dm = decode_mcfg(mcfg, mesh, layout)
  abstract = model_lib.param_shapes(dm)
  specs = model_lib.param_axes(dm)
  lrules = dict(rules(layout))
  sizes = _view_sizes(mesh, layout)
  layers = tables = 0
  flat = jax.tree_util.tree_flatten_with_path(abstract)[0]
  spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
  for (path, x), spec in zip(flat, spec_leaves):
    div = 1
    for name in spec:
      for a in _axes(lrules.get(name)):
        div *= sizes.get(a, 1)
    key = jax.tree_util.keystr(path)
    nbytes = math.ceil(x.size / div) * (4 if key.endswith("['scale']") else cb)
    if key.startswith("['embed']") or key.startswith("['lm_head']"):
      tables += nbytes
    else:
      layers += nbytes
  return layers, tables


def rollout_bytes(mcfg: model_lib.ModelConfig, mesh: dict[str, int], layout: Layout, n_rows: int,
                  cache_len: int) -> dict[str, int]:
  """Per-device bytes of the decode phase in `layout`: its weights, the KV cache, one step's logits (memory_plan)."""
  cb = 2 if mcfg.dtype == "bfloat16" else 4
  dp = mesh["data"] * mesh["fsdp"]
  t = tp_degree(mesh, layout)
  dm = decode_mcfg(mcfg, mesh, layout)
  even = lambda n, d: n // d if n % d == 0 else n
  if layout.kind == "tp":
    rows = math.ceil(n_rows / (dp // layout.tp))
    v_dev = mcfg.vocab_size  # the sampler gathers whole rows of logits
  else:
    rows = math.ceil(n_rows / dp)
    v_dev = even(mcfg.vocab_size, t)
  out = {"kv cache": 2 * mcfg.layers * rows * even(dm.kv_heads, t) * mcfg.head_dim * cache_len * cb,
         "decode logits": 3 * rows * v_dev * 4}  # fp32 logits plus the sampler's exp and cumulative sums
  layers, tables = _decode_param_bytes(mcfg, mesh, layout)
  moved = mesh.get("fsdp", 1) > 1 or layout.kind == "tp"
  # The table is a new buffer only when it is cast or resharded (an fp32 table in place is the param itself).
  tables = tables if (cb != 4 or (moved and layout.kind != "fsdp")) else 0
  if layout.kind == "fsdp":
    out["decode weights (fsdp: as split)"] = layers + tables
    # the [D, V] head, gathered at every token (a cast copy even unsharded under bf16)
    out["lm head, gathered per token"] = mcfg.hidden * v_dev * cb if (moved or cb != 4) else 0
  else:
    out[f"decode weights ({layout})"] = layers + tables
  return out


def device_memory_bytes() -> int:
  """Memory of one device: what the runtime reports (TPU/GPU), else this host's RAM over its local devices."""
  if _HBM_OVERRIDE:
    return _HBM_OVERRIDE[-1]
  stats = jax.local_devices()[0].memory_stats() or {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // max(1, jax.local_device_count())


_HBM_OVERRIDE: list[int] = []


@contextlib.contextmanager
def device_memory(nbytes: int) -> Iterator[None]:
  """Plans against `nbytes` per device while tracing (aot.py compiles for a TPU it does not run on)."""
  _HBM_OVERRIDE.append(int(nbytes))
  try:
    yield
  finally:
    _HBM_OVERRIDE.pop()


# ------------------------------------------------------------------------------------------- in the step


def context_mesh() -> dict[str, int]:
  mesh = jax.sharding.get_abstract_mesh()
  return {} if mesh.empty else dict(mesh.shape)


@contextlib.contextmanager
def _layout_context(layout: Layout) -> Iterator[None]:
  """Trace under the layout's rules (and, for tp, its view of the context mesh)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or layout.kind == "fsdp":  # fsdp: the caller's rules and mesh as they are
    yield
    return
  with contextlib.ExitStack() as stack:
    if layout.kind == "tp":
      s = mesh.shape
      sizes = (s["data"], s["fsdp"] // layout.tp, layout.tp, s["tensor"])
      stack.enter_context(jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh(sizes, VIEW_AXES)))
    stack.enter_context(nn.logical_axis_rules(rules(layout, nn.get_logical_axis_rules())))
    yield


class Decode(NamedTuple):
  """A rollout's decode weights in their layout, and the model config decode runs them with."""
  layout: Layout
  mcfg: model_lib.ModelConfig
  weights: decode_lib.DecodeWeights

  @contextlib.contextmanager
  def view(self) -> Iterator[None]:
    """Trace the decode loop inside this: the sampler's and model's logical constraints resolve to the layout (and
    the collectives it causes are named 'decode' in the compiled program, where hlo_collectives.py finds them)."""
    with jax.named_scope("decode"), _layout_context(self.layout):
      yield

  def expand_cache(self, cache: decode_lib.Cache) -> decode_lib.Cache:
    """The prefilled cache with its KV heads repeated as the layout's weights are (no-op unless kv_repeat > 1)."""
    k = cache["k"][0].shape[1]
    r = self.mcfg.kv_heads // k
    if r == 1:
      return cache
    return {name: tuple(jnp.repeat(x, r, axis=1) for x in bufs) for name, bufs in cache.items()}


def _repeat_kv(layer: dict, r: int) -> dict:
  out = dict(layer)
  for name in ("k", "v"):
    p = dict(layer[name])
    p["kernel"] = jnp.repeat(p["kernel"], r, axis=1)  # [D, K, Dh]: head j of K·r is original head j // r
    if "bias" in p:
      p["bias"] = jnp.repeat(p["bias"], r, axis=0)
    out[name] = p
  return out


def prepare(mcfg: model_lib.ModelConfig, params: Any, layout: Layout) -> Decode:
  """The decode weights of `params` in `layout` (inside the jitted step, once per rollout, before the decode loop)."""
  mesh = context_mesh()
  with jax.named_scope("decode_layout"):
    w = decode_lib.decode_weights(mcfg, params)
    dm = decode_mcfg(mcfg, mesh, layout) if mesh else mcfg
    r = dm.kv_heads // mcfg.kv_heads
    if r > 1:
      w = w._replace(layers=tuple(_repeat_kv(l, r) for l in w.layers))
    if mesh and layout.kind != "fsdp":
      axes = model_lib.param_axes(dm)
      layer_axes = jax.tree.map(lambda s: PartitionSpec(*tuple(s)[1:]), axes["layers"],
                                is_leaf=lambda x: isinstance(x, PartitionSpec))
      with _layout_context(layout):
        pin = lambda tree, specs: jax.tree.map(lambda x, s: nn.with_logical_constraint(x, s), tree, specs,
                                               is_leaf=lambda x: isinstance(x, PartitionSpec))
        w = decode_lib.DecodeWeights(
            layers=tuple(pin(l, layer_axes) for l in w.layers),
            embed_VxD=nn.with_logical_constraint(w.embed_VxD, axes["embed"]["embedding"]),
            head_DxV=None if w.head_DxV is None else nn.with_logical_constraint(w.head_DxV, axes["lm_head"]["kernel"]),
            final_norm=pin(w.final_norm, axes["final_norm"]))
  return Decode(layout, dm, w)
