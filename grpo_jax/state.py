"""The train state: a plain dict pytree, created already sharded (eval_shape → shardings → jit(out_shardings))."""
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from grpo_jax import model as model_lib
from grpo_jax import sharding

State = dict[str, Any]  # params, ref_params, opt_state, step, rng (+ critic_params, critic_opt_state for PPO)


def make_optimizer(optim_cfg, total_steps: int, lr: float | None = None) -> optax.GradientTransformation:
  lr = optim_cfg.lr if lr is None else lr
  warm = int(optim_cfg.warmup_steps)
  sched = optax.linear_schedule(0.0, lr, warm) if warm > 0 else optax.constant_schedule(lr)
  if warm > 0:
    sched = optax.join_schedules([sched, optax.constant_schedule(lr)], [warm])
  return optax.chain(
      optax.clip_by_global_norm(optim_cfg.grad_clip) if optim_cfg.grad_clip > 0 else optax.identity(),
      optax.adamw(sched, b1=optim_cfg.b1, b2=optim_cfg.b2, weight_decay=optim_cfg.weight_decay))


def _opt_state_shardings(tx, abstract_opt_state, param_shardings, mesh):
  return optax.tree_map_params(tx, lambda _, s: s, abstract_opt_state, param_shardings,
                               transform_non_params=lambda _: sharding.replicated(mesh))


def _params_spec(mesh: Mesh, mcfg: model_lib.ModelConfig) -> tuple[Any, Any]:
  param_sh = sharding.tree_shardings(mesh, model_lib.param_axes(mcfg))
  return jax.eval_shape(lambda: model_lib.init_params(mcfg, jax.random.PRNGKey(0))), param_sh


def abstract_params(mesh: Mesh, mcfg: model_lib.ModelConfig) -> Any:
  """The params' abstract twin in their shardings (nothing allocated): what `checkpoint.load_params` restores into."""
  return with_shardings(*_params_spec(mesh, mcfg))


def state_shardings(mesh: Mesh, mcfg: model_lib.ModelConfig, tx, with_ref: bool = True,
                    critic: tuple | None = None) -> tuple[State, State]:
  """(abstract state, shardings) without allocating anything."""
  abstract_params, param_sh = _params_spec(mesh, mcfg)
  sharding.check_divisible(mesh, abstract_params, param_sh, "params")
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  abstract = dict(params=abstract_params, opt_state=abstract_opt,
                  step=jax.ShapeDtypeStruct((), jnp.int32), rng=jax.ShapeDtypeStruct((2,), jnp.uint32))
  shard = dict(params=param_sh, opt_state=_opt_state_shardings(tx, abstract_opt, param_sh, mesh),
               step=sharding.replicated(mesh), rng=sharding.replicated(mesh))
  if with_ref:
    abstract["ref_params"] = abstract_params
    shard["ref_params"] = param_sh
  if critic is not None:
    c_abstract_params, c_axes, c_tx = critic
    c_sh = sharding.tree_shardings(mesh, c_axes)
    c_opt = jax.eval_shape(c_tx.init, c_abstract_params)
    abstract.update(critic_params=c_abstract_params, critic_opt_state=c_opt)
    shard.update(critic_params=c_sh, critic_opt_state=_opt_state_shardings(c_tx, c_opt, c_sh, mesh))
  return abstract, shard


def with_shardings(abstract: State, shardings: State) -> State:
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def create_state(mesh: Mesh, mcfg: model_lib.ModelConfig, tx, seed: int,
                 init_params: Callable[[jax.Array], Any] | None = None, with_ref: bool = True,
                 critic: tuple | None = None,
                 critic_init: Callable[[jax.Array, Any], Any] | None = None) -> State:
  """Creates the state directly in its shardings: no host copy of the full params ever exists."""
  _, shard = state_shardings(mesh, mcfg, tx, with_ref, critic)
  init_params = init_params or (lambda k: model_lib.init_params(mcfg, k))

  def init(seed):
    key = jax.random.PRNGKey(seed)
    k_params, k_critic, k_run = jax.random.split(key, 3)
    params = init_params(k_params)
    st = dict(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32), rng=k_run)
    if with_ref:
      st["ref_params"] = params
    if critic is not None:
      cp = critic_init(k_critic, params)
      st.update(critic_params=cp, critic_opt_state=critic[2].init(cp))
    return st

  with sharding.mesh_context(mesh):
    return jax.jit(init, out_shardings=shard)(seed)
