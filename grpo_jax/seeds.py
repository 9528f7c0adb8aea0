"""S small runs in ONE compiled program: `jit(vmap(step, in_axes=(0, None)))` over stacked states, same batch.

Seeds differ in their init and/or rollout rng. One scalar hyper-parameter may also differ per run:
- `optim.lr` lives in the optimizer state (update.make_optimizer injects it), so the step is unchanged and a run's
  state has the same structure as a `main` run's;
- `rl.*` scalars (β, ε, std ε, dual clip, k3 clamp) live in `state["hparams"]` and are read while tracing into a copy of the config,
  so the family's un-jitted `build_step` sees a traced value where it would see a float.
The family (GRPO's rl_step or PPO's ppo_step) is the one `families.for_config` picks.
"""
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from grpo_jax import families
from grpo_jax import model as model_lib
from grpo_jax import sharding
from grpo_jax import state as state_lib
from grpo_jax import update as update_lib

# rl.* keys that build_step only uses in arithmetic, so a traced per-run value is safe there.
TRACEABLE_RL_KEYS = ("rl.beta", "rl.eps_low", "rl.eps_high", "rl.std_eps", "rl.dual_clip", "rl.kl_clamp")
LR_KEY = "optim.lr"


def init_states(config, mcfg: model_lib.ModelConfig, seeds: Sequence[int], *,
                init_seeds: Sequence[int] | None = None, params: Any = None,
                hparams: dict[str, Sequence[float]] | None = None) -> dict:
  """Stacked states (leading axis S) of the config's family, each built like its `init(seed=...)`, in one vmapped
  init.

  seeds: per-run seeds (rollout rng, and params unless init_seeds or params are given).
  init_seeds: per-run seeds for the params only (e.g. all equal: same init, different rollouts).
  params: shared starting params (e.g. an SFT checkpoint) for every run; the reference is a copy.
  hparams: {"optim.lr" | "rl.beta" | …: S values}.
  """
  S = len(seeds)
  if S < 1:
    raise ValueError("init_states: seeds is empty; pass at least one seed.")
  init_seeds = seeds if init_seeds is None else init_seeds
  if len(init_seeds) != S:
    raise ValueError(f"init_states: {len(init_seeds)} init_seeds for {S} seeds; pass one per run.")
  hparams = dict(hparams or {})
  for k, v in hparams.items():
    if k != LR_KEY and k not in TRACEABLE_RL_KEYS:
      raise ValueError(f"hparams key {k!r} cannot vary per run; use one of {(LR_KEY,) + TRACEABLE_RL_KEYS}.")
    if len(v) != S:
      raise ValueError(f"hparams[{k!r}] has {len(v)} values for {S} seeds; pass one per run.")

  # The reference model is kept when any run's β is > 0 (per-run β replaces the config's): a sweep whose β are all
  # 0 keeps none, like a β = 0 run of `main`.
  layout_config = config
  if "rl.beta" in hparams:
    layout_config = with_values(config, {"rl.beta": float(max(abs(float(b)) for b in hparams["rl.beta"]))})
  layout = families.for_config(config).layout(layout_config, mcfg)

  def init(seed, init_seed, params):
    # The key derivation of state.create, so run i equals a separate init(seed=seed_i) run.
    _, k_critic, k_run = state_lib.seed_keys(seed)
    p = params if params is not None else model_lib.init_params(mcfg, state_lib.seed_keys(init_seed)[0])
    return state_lib.initial(layout, p, k_critic, k_run)

  with nn.logical_axis_rules(sharding.LOGICAL_RULES):
    states = jax.jit(jax.vmap(init, in_axes=(0, 0, None)))(jnp.asarray(seeds, jnp.int32),
                                                            jnp.asarray(init_seeds, jnp.int32), params)
  if LR_KEY in hparams:
    states["opt_state"].hyperparams[update_lib.LR] = jnp.asarray(hparams.pop(LR_KEY), jnp.float32)
  if hparams:
    states["hparams"] = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
  return states


def with_values(config: ml_collections.ConfigDict, values: dict[str, Any]) -> ml_collections.ConfigDict:
  """A non-type-safe copy of config with dotted keys set (values may be tracers)."""
  c = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
  for key, v in values.items():
    group, name = key.split(".")
    c[group][name] = v
  return c


def make_vmapped_step(config, mesh, build: Callable[[Any], Callable],
                      compiler_options: dict | None = None) -> Callable:
  """jit(vmap(step, in_axes=(0, None))): `build(config)` returns the un-jitted step for a config; it is called
  while tracing with the run's own `state["hparams"]` values substituted, so each run sees its own scalar."""

  def one_run(state, batch):
    hp = state.get("hparams", {})
    step = build(with_values(config, hp) if hp else config)
    return step(state, batch)

  rep = sharding.replicated(mesh)
  # Stacked runs are small (ablation sizes): keep them replicated on the mesh, in and out, so every call hits the
  # same compiled program.
  counted = sharding.count_traces(one_run)
  jitted = jax.jit(jax.vmap(counted, in_axes=(0, None)), donate_argnums=(0,), compiler_options=compiler_options,
                   out_shardings=(rep, rep))

  def run(states, batch):
    states = jax.device_put(states, rep)  # no copy once they live there
    with sharding.mesh_context(mesh):
      return jitted(states, batch)
  run.jitted, run.traces = jitted, counted.traces
  return run


def make_steps(config, mesh, mcfg, spec, tokenizer, compiler_options: dict | None = None) -> Callable:
  """The config's RL family (families.for_config) vmapped over runs."""
  family = families.for_config(config)
  return make_vmapped_step(config, mesh, lambda c: family.build_step(c, mcfg, spec, tokenizer), compiler_options)


# Fast-compiling XLA:CPU settings for tiny models (tests, :small tables): LLVM at -O0 roughly halves compile time.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def unstack(tree: Any, i: int) -> Any:
  return jax.tree.map(lambda x: x[i], tree)


def host_scalars(metrics: dict) -> dict[str, np.ndarray]:
  """Per-run scalar metrics as S-vectors on the host (samples and status arrays dropped)."""
  out = {}
  for k, v in jax.device_get(metrics).items():
    v = np.asarray(v)
    if v.ndim == 1 and not k.startswith("samples/") and k != "reward_status":
      out[k] = v
  return out
