"""S small runs in ONE compiled program: `jit(vmap(step, in_axes=(0, None)))` over stacked states, same batch.

Seeds differ in their init and/or rollout rng. One scalar hyper-parameter may also differ per run:
- `optim.lr` lives in the optimizer state (`optax.inject_hyperparams`), so the step is unchanged;
- `rl.*` scalars (β, ε, std ε, dual clip, k3 clamp) live in `state["hparams"]` and are read while tracing into a copy of the config,
  so the un-jitted `rl_step.build_step` sees a traced value where it would see a float. No change to rl_step.
"""
import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from grpo_jax import model as model_lib
from grpo_jax import rl_step
from grpo_jax import sharding

# rl.* keys that build_step only uses in arithmetic, so a traced per-run value is safe there.
TRACEABLE_RL_KEYS = ("rl.beta", "rl.eps_low", "rl.eps_high", "rl.std_eps", "rl.dual_clip", "rl.kl_clamp")
LR_KEY = "optim.lr"


def make_tx(optim_cfg, lr: float | None = None) -> optax.GradientTransformation:
  """state.make_optimizer's AdamW(+clip, +linear warm-up), with the learning rate as a hyper-parameter in the
  optimizer state (`opt_state.hyperparams['learning_rate']`), so each vmapped run can carry its own."""
  warm = int(optim_cfg.warmup_steps)

  def factory(learning_rate):
    sched = ((lambda count: learning_rate * jnp.minimum(count / warm, 1.0)) if warm > 0
             else (lambda count: learning_rate))
    return optax.chain(
        optax.clip_by_global_norm(optim_cfg.grad_clip) if optim_cfg.grad_clip > 0 else optax.identity(),
        optax.adamw(sched, b1=optim_cfg.b1, b2=optim_cfg.b2, weight_decay=optim_cfg.weight_decay))

  return optax.inject_hyperparams(factory)(learning_rate=optim_cfg.lr if lr is None else lr)


def init_states(mcfg: model_lib.ModelConfig, tx, seeds: Sequence[int], *, init_seeds: Sequence[int] | None = None,
                params: Any = None, hparams: dict[str, Sequence[float]] | None = None,
                critic_init: Callable | None = None, critic_tx=None) -> dict:
  """Stacked states (leading axis S), built like state.create_state(seed) for each seed, in one vmapped init.

  seeds: per-run seeds (rollout rng, and params unless init_seeds or params are given).
  init_seeds: per-run seeds for the params only (e.g. all equal: same init, different rollouts).
  params: shared starting params (e.g. an SFT checkpoint) for every run; the reference is a copy.
  hparams: {"optim.lr" | "rl.beta" | …: S values}. critic_init/critic_tx: PPO's critic, as in create_state.
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

  with nn.logical_axis_rules(sharding.LOGICAL_RULES):
    states = _vmapped_init(jnp.asarray(seeds, jnp.int32), jnp.asarray(init_seeds, jnp.int32), params,
                           mcfg=mcfg, tx=tx, critic_init=critic_init, critic_tx=critic_tx)
  if LR_KEY in hparams:
    hp = states["opt_state"].hyperparams
    if "learning_rate" not in hp:
      raise ValueError("hparams['optim.lr'] needs the optimizer from seeds.make_tx (lr in the optimizer state).")
    hp["learning_rate"] = jnp.asarray(hparams.pop(LR_KEY), jnp.float32)
  if hparams:
    states["hparams"] = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
  return states


@functools.partial(jax.jit, static_argnames=("mcfg", "tx", "critic_init", "critic_tx"))
def _vmapped_init(seeds_S, init_seeds_S, params, *, mcfg, tx, critic_init, critic_tx):
  """Module-level and jitted on static (mcfg, tx): repeated calls reuse one compiled init."""

  def init(seed, init_seed):
    # Same key derivation as state.create_state, so run i equals a separate create_state(seed_i) run.
    k_params, k_critic, k_run = jax.random.split(jax.random.PRNGKey(seed), 3)
    k_params_i = jax.random.split(jax.random.PRNGKey(init_seed), 3)[0]
    p = params if params is not None else model_lib.init_params(mcfg, k_params_i)
    st = dict(params=p, opt_state=tx.init(p), step=jnp.zeros((), jnp.int32), rng=k_run, ref_params=p)
    if critic_init is not None:
      cp = critic_init(k_critic, p)
      st.update(critic_params=cp, critic_opt_state=critic_tx.init(cp))
    return st

  return jax.vmap(init)(seeds_S, init_seeds_S)


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
  jitted = jax.jit(jax.vmap(one_run, in_axes=(0, None)), donate_argnums=(0,), compiler_options=compiler_options,
                   out_shardings=(rep, rep))

  def run(states, batch):
    states = jax.device_put(states, rep)  # no copy once they live there
    with sharding.mesh_context(mesh):
      return jitted(states, batch)
  run.jitted = jitted
  return run


def make_rl_steps(config, mesh, mcfg, tx, spec, tokenizer, compiler_options: dict | None = None) -> Callable:
  """The GRPO family (rl_step.build_step) vmapped over runs."""
  return make_vmapped_step(config, mesh, lambda c: rl_step.build_step(c, mcfg, tx, spec, tokenizer),
                           compiler_options)


def make_ppo_steps(config, mesh, mcfg, tx, critic_tx, spec, tokenizer,
                   compiler_options: dict | None = None) -> Callable:
  """PPO with a critic vmapped over runs (its jitted step traced inside the vmap; the inner jit is inlined)."""
  from grpo_jax import ppo_step
  return make_vmapped_step(
      config, mesh, lambda c: ppo_step.make_ppo_step(c, mesh, mcfg, tx, critic_tx, spec, tokenizer).jitted,
      compiler_options)


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
