"""The train state: a plain dict pytree, created already sharded (eval_shape → shardings → jit(out_shardings)).

Keys: params, opt_state, step, rng; + ref_params (RL), + critic_params, critic_opt_state (PPO). A family says which
through its `Layout`; every family's state_spec / init, and the vmapped init of studies/vmapped_runs.py, are built here.

With LoRA (model.lora.rank > 0, ModelConfig.lora) `params` are the adapters only (what the optimizer sees) and
`base` holds the frozen base once (model/lora.py); there are no ref_params: the reference is the base itself.
`model_params(state)` is the policy either way.
"""
import functools
import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from grpo_jax.config import config_lib
from grpo_jax.model import lora as lora_lib
from grpo_jax.model import model as model_lib
from grpo_jax.infra import sharding
from grpo_jax.rl import update as update_lib
from grpo_jax.rollout import carry as carry_lib

State = dict[str, Any]


def uses_reference(config) -> bool:
  """β > 0 needs the frozen reference model; β = 0 keeps none: no reference params in the state, no reference
  forward, no train/kl (as TRL loads no reference at β = 0). A traced β (studies/vmapped_runs.py, one per run) counts as > 0."""
  beta = config.rl.beta
  return not isinstance(beta, numbers.Real) or beta != 0


class Critic(NamedTuple):
  """PPO's critic as the state holds it: `init(rng, policy_params) -> critic params`, their logical axes, and
  the critic's own optimizer."""
  init: Callable[[jax.Array, Any], Any]
  axes: Any
  opt: update_lib.Optimizer


class Layout(NamedTuple):
  """What a family keeps in its state besides params, opt_state, step and rng."""
  opt: update_lib.Optimizer
  ref: bool = True                # a frozen reference copy of the initial params (ref_params)
  critic: Critic | None = None
  carry: carry_lib.Spec | None = None  # rl.partial_rollouts: the rollout carry's shapes (state["carry"])


def on_mesh(layout: Layout, mesh: Mesh) -> Layout:
  """The layout with the carry's row split set to the mesh's (data × fsdp): each device keeps its own rows."""
  if layout.carry is None:
    return layout
  split = dict(mesh.shape).get("data", 1) * dict(mesh.shape).get("fsdp", 1)
  return layout._replace(carry=layout.carry._replace(D=split))


def abstract_params(mesh: Mesh, mcfg: model_lib.ModelConfig) -> Any:
  """The (base) model params as sharded ShapeDtypeStructs (nothing allocated): what a checkpoint is read into."""
  abstract, shard = _params_spec(mesh, mcfg)
  return with_shardings(abstract, shard)


def _params_spec(mesh, mcfg):
  shard = sharding.tree_shardings(mesh, model_lib.param_axes(mcfg))
  abstract = model_lib.param_shapes(mcfg)
  sharding.check_divisible(mesh, abstract, shard, "params")
  return abstract, shard


def _trainable_spec(mesh, mcfg):
  """(abstract, shardings) of what the optimizer trains: the model params, or with LoRA the adapters."""
  if mcfg.lora is None:
    return _params_spec(mesh, mcfg)
  shard = sharding.tree_shardings(mesh, lora_lib.adapter_axes(mcfg))
  abstract = lora_lib.adapter_shapes(mcfg)
  sharding.check_divisible(mesh, abstract, shard, "params (LoRA adapters)")
  return abstract, shard


def model_params(state: State, params: Any = None) -> Any:
  """The policy's params of `params` (default: the state's): themselves, or with LoRA the state's frozen base with
  these adapters beside its kernels (the gradient then reaches the adapters only)."""
  params = state["params"] if params is None else params
  return lora_lib.combine(state["base"], params) if "base" in state else params


def _opt_state_shardings(tx, abstract_opt_state, param_shardings, mesh):
  return optax.tree_map_params(tx, lambda _, s: s, abstract_opt_state, param_shardings,
                               transform_non_params=lambda _: sharding.replicated(mesh))


def spec(mesh: Mesh, mcfg: model_lib.ModelConfig, layout: Layout) -> tuple[State, State]:
  """(abstract state, shardings) without allocating anything."""
  layout = on_mesh(layout, mesh)
  abstract_params, param_sh = _params_spec(mesh, mcfg)
  abstract_train, train_sh = _trainable_spec(mesh, mcfg)
  tx = layout.opt.tx
  abstract_opt = jax.eval_shape(tx.init, abstract_train)
  abstract = dict(params=abstract_train, opt_state=abstract_opt,
                  step=jax.ShapeDtypeStruct((), jnp.int32), rng=jax.ShapeDtypeStruct((2,), jnp.uint32))
  shard = dict(params=train_sh, opt_state=_opt_state_shardings(tx, abstract_opt, train_sh, mesh),
               step=sharding.replicated(mesh), rng=sharding.replicated(mesh))
  if mcfg.lora is not None:
    abstract_params = lora_lib.base_shapes(mcfg)
    abstract["base"], shard["base"] = abstract_params, param_sh
  if layout.ref and mcfg.lora is None:  # with LoRA the base is the reference
    abstract["ref_params"] = abstract_params
    shard["ref_params"] = param_sh
  if layout.critic is not None:
    c_tx = layout.critic.opt.tx
    c_params = jax.eval_shape(layout.critic.init, jax.random.PRNGKey(0), abstract_params)
    c_sh = sharding.tree_shardings(mesh, layout.critic.axes)
    c_opt = jax.eval_shape(c_tx.init, c_params)
    abstract.update(critic_params=c_params, critic_opt_state=c_opt)
    shard.update(critic_params=c_sh, critic_opt_state=_opt_state_shardings(c_tx, c_opt, c_sh, mesh))
  if layout.carry is not None:
    bad = carry_lib.check(layout.carry)
    if bad:
      raise config_lib.ConfigError(bad)
    abstract["carry"] = jax.eval_shape(lambda: carry_lib.init(layout.carry, mcfg))
    shard["carry"] = sharding.tree_shardings(mesh, carry_lib.axes(layout.carry, mcfg.layers))
    sharding.check_divisible(mesh, abstract["carry"], shard["carry"], "the rollout carry")
  return abstract, shard


def with_shardings(abstract: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def seed_keys(seed) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(params key, critic key, run key) of a seed: the one derivation every init uses."""
  k_params, k_critic, k_run = jax.random.split(jax.random.PRNGKey(seed), 3)
  return k_params, k_critic, k_run


SEED_SOURCE = "seed:"  # a LoRA base that is the random init of the run seed, as its identity names it


def base_source(init_from: str, run_seed: int) -> str:
  """How a LoRA run's base is named in its checkpoints: `init_from`, or "seed:<run seed>" (the seed's init)."""
  return init_from or f"{SEED_SOURCE}{run_seed}"


ADAPTER_FOLD = 0x10A  # the adapters' init key: fold_in(run key, ADAPTER_FOLD); the rollout keys split the run key


def initial(layout: Layout, params: Any, k_critic: jax.Array, k_run: jax.Array,
            mcfg: model_lib.ModelConfig | None = None) -> State:
  """A fresh state around `params` (pure: jit it with out_shardings, or vmap it over runs). With LoRA (`mcfg.lora`)
  `params` are the base: held frozen, fresh adapters trained."""
  if mcfg is not None and mcfg.lora is not None:
    base = lora_lib.hold_base(mcfg, params)
    adapters = lora_lib.init_adapters(mcfg, jax.random.fold_in(k_run, ADAPTER_FOLD))
    st = dict(params=adapters, base=base, opt_state=layout.opt.tx.init(adapters), step=jnp.zeros((), jnp.int32),
              rng=k_run)
    if layout.critic is not None:
      cp = layout.critic.init(k_critic, base)
      st.update(critic_params=cp, critic_opt_state=layout.critic.opt.tx.init(cp))
  else:
    st = dict(params=params, opt_state=layout.opt.tx.init(params), step=jnp.zeros((), jnp.int32), rng=k_run)
    if layout.ref:
      st["ref_params"] = params
    if layout.critic is not None:
      cp = layout.critic.init(k_critic, params)
      st.update(critic_params=cp, critic_opt_state=layout.critic.opt.tx.init(cp))
  if layout.carry is not None:  # the rollout carry: empty (the first step fills it)
    st["carry"] = carry_lib.init(layout.carry, mcfg)
  return st


def create(mesh: Mesh, mcfg: model_lib.ModelConfig, layout: Layout, seed: int, params: Any = None) -> State:
  """The state of `seed`, directly in its shardings: no host copy of the full params ever exists.

  `params` (already in the params' shardings, e.g. a loaded checkpoint) replace the seed's random init; the
  reference and, for PPO's separate value network, the critic's trunk start from them too.
  """
  layout = on_mesh(layout, mesh)
  _, shard = spec(mesh, mcfg, layout)

  def init(seed, params):
    k_params, k_critic, k_run = seed_keys(seed)
    if params is None:
      params = model_lib.init_params(mcfg, k_params)
    return initial(layout, params, k_critic, k_run, mcfg)

  with sharding.mesh_context(mesh):
    donate = ()
    if params is None and (mcfg.lora is None or mcfg.lora.base_dtype == "float32"):
      # The seed's params from their own program, donated to the state's: the random init is nearly all of a state
      # init's compile (0.81 of 0.82 CPU-s for a 2-layer toy), and one model's states differ in everything else
      # (β, a critic, the rollout carry, the optimizer). (A LoRA base held in another dtype is cast: a donated
      # float32 base would not be reusable and both would be live at once, so it stays in one program.)
      params, donate = _seed_params(mesh, mcfg)(seed), (1,)
    return jax.jit(init, out_shardings=shard, donate_argnums=donate)(seed, params)


@functools.lru_cache(maxsize=16)
def _seed_params(mesh: Mesh, mcfg: model_lib.ModelConfig) -> Callable:
  """seed -> that seed's random params (create's key derivation), directly in their shardings: one jitted program
  per model and mesh, which every state layout and every seed of the model reuse."""
  _, shard = _params_spec(mesh, mcfg)
  return jax.jit(lambda seed: model_lib.init_params(mcfg, seed_keys(seed)[0]), out_shardings=shard)


def spec_and_init(layout_fn: Callable[[Any, model_lib.ModelConfig], Layout]) -> tuple[Callable, Callable]:
  """A family's `state_spec` and `init` from its `layout(config, mcfg)`:
    state_spec(config, mesh, mcfg) -> (abstract state, shardings)
    init(config, mesh, mcfg, *, seed=None (config_lib.run_seed: run_seed, else seed), params=None (random init))
      -> state, already sharded
  """
  def state_spec(config, mesh: Mesh, mcfg: model_lib.ModelConfig) -> tuple[State, State]:
    return spec(mesh, mcfg, layout_fn(config, mcfg))

  def init(config, mesh: Mesh, mcfg: model_lib.ModelConfig, *, seed: int | None = None, params: Any = None) -> State:
    return create(mesh, mcfg, layout_fn(config, mcfg), config_lib.run_seed(config) if seed is None else seed, params)

  return state_spec, init
