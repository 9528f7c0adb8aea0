"""S small runs in ONE compiled program: `jit(vmap(step, in_axes=(0, None)))` over stacked states, same batch.

Runs differ in their init and/or rollout rng, and in any of the scalar knobs of TRACEABLE, each reaching the step
one of three ways, so that a run's state keeps the structure of a `main` run's (a sweep point's checkpoint resumes
with `main`):
- OPT_KEYS (`optim.lr`, PPO's `ppo.critic_lr`) live in the optimizer state (update.make_optimizer injects them): the
  step is unchanged;
- CONFIG_KEYS (β, ε low/high — GSPO's too —, the std ε, dual clip, k3 clamp, the entropy bonus, the sampling
  temperature) live in `state["hparams"]` and are read while tracing into a copy of the config, so the family's
  un-jitted `build_step` sees a traced value where it would see a float (it uses them only in arithmetic; tests trace
  every preset so). A traced entropy bonus is in every run's program, so a run at 0 adds 0·H: its loss and update
  are a separate 0 run's (which traces no bonus at all) up to XLA's ordering;
- REWARD_WEIGHTS: the weights of `config.rewards` (the term names stay static), traced into the reward spec.
Anything else changes the program (shapes, branches, the state tree): runs that differ there cannot share one.
The family (GRPO's rl_step or PPO's ppo_step) is the one `families.for_config` picks.

With LoRA (model.lora) the stacked state is the runs' adapters, optimizer states and rngs; the frozen `base` is
held once, unstacked, and enters the vmapped step unbatched (in_axes None): S runs cost S adapters, not S models.
"""
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from grpo_jax.model import lora as lora_lib
from grpo_jax.rl import auto
from grpo_jax.rl import families
from grpo_jax.model import model as model_lib
from grpo_jax.infra import sharding
from grpo_jax.rl import state as state_lib
from grpo_jax.rl import update as update_lib

# rl.* keys that build_step only uses in arithmetic, so a traced per-run value is safe there.
TRACEABLE_RL_KEYS = ("rl.beta", "rl.eps_low", "rl.eps_high", "rl.std_eps", "rl.dual_clip", "rl.kl_clamp",
                     "rl.entropy_coef")
CONFIG_KEYS = TRACEABLE_RL_KEYS + ("sampling.temperature",)
LR_KEY = "optim.lr"
OPT_KEYS = {LR_KEY: "opt_state", "ppo.critic_lr": "critic_opt_state"}  # key -> the state entry holding it
REWARD_WEIGHTS = "rewards"
TRACEABLE = tuple(OPT_KEYS) + CONFIG_KEYS + (REWARD_WEIGHTS,)


def varying(configs: Sequence[Any]) -> dict[str, list]:
  """The traceable keys whose values differ between the runs: {key: one value per run} (TRACEABLE)."""
  out = {}
  for key in TRACEABLE:
    if key == REWARD_WEIGHTS:
      vals = [tuple(float(w) for _, w in c.rewards) for c in configs]
    else:
      group, name = key.split(".")
      vals = [float(c[group][name]) for c in configs]
    if len(set(vals)) > 1:
      out[key] = vals
  return out


def init_states(config, mcfg: model_lib.ModelConfig, seeds: Sequence[int], *,
                init_seeds: Sequence[int] | None = None, params: Any = None, run_params: Sequence[Any] | None = None,
                hparams: dict[str, Sequence[Any]] | None = None) -> dict:
  """Stacked states (leading axis S) of the config's family, each built like its `init(seed=...)`, in one vmapped
  init.

  seeds: per-run seeds (rollout rng, and params unless init_seeds, params or run_params are given).
  init_seeds: per-run seeds for the params only (e.g. all equal: same init, different rollouts).
  params: shared starting params (e.g. an SFT checkpoint) for every run; the reference is a copy.
  run_params: one starting params tree per run (e.g. each run's own SFT stage).
  hparams: {key of TRACEABLE: S values}; `rewards`: S weight tuples, one weight per term of config.rewards.
  """
  S = len(seeds)
  if S < 1:
    raise ValueError("init_states: seeds is empty; pass at least one seed.")
  init_seeds = seeds if init_seeds is None else init_seeds
  if len(init_seeds) != S:
    raise ValueError(f"init_states: {len(init_seeds)} init_seeds for {S} seeds; pass one per run.")
  if params is not None and run_params is not None:
    raise ValueError("init_states: pass shared params or run_params (one per run), not both.")
  if run_params is not None and len(run_params) != S:
    raise ValueError(f"init_states: {len(run_params)} run_params for {S} seeds; pass one per run.")
  hparams = dict(hparams or {})
  for k, v in hparams.items():
    if k not in TRACEABLE:
      raise ValueError(f"hparams key {k!r} cannot vary per run; use one of {TRACEABLE}.")
    if len(v) != S:
      raise ValueError(f"hparams[{k!r}] has {len(v)} values for {S} seeds; pass one per run.")

  # The reference model is kept when any run's β is > 0 (per-run β replaces the config's): a sweep whose β are all
  # 0 keeps none, like a β = 0 run of `main`.
  layout_config = config
  if "rl.beta" in hparams:
    layout_config = with_values(config, {"rl.beta": float(max(abs(float(b)) for b in hparams["rl.beta"]))})
  layout = families.for_config(config).layout(layout_config, mcfg)
  lora = mcfg.lora is not None
  if lora and (run_params is not None or (params is None and len(set(init_seeds)) > 1)):
    raise ValueError("init_states: with model.lora the runs share one frozen base; pass shared params (or one "
                     "init seed for all runs), not one model per run.")

  def init(seed, init_seed, params):
    # The key derivation of state.create, so run i equals a separate init(seed=seed_i) run.
    _, k_critic, k_run = state_lib.seed_keys(seed)
    p = params if params is not None else model_lib.init_params(mcfg, state_lib.seed_keys(init_seed)[0])
    st = state_lib.initial(layout, p, k_critic, k_run, mcfg)
    return st if not lora else {k: v for k, v in st.items() if k != "base"}

  p_axis = None
  if run_params is not None:
    params, p_axis = stack(run_params), 0
  with nn.logical_axis_rules(sharding.LOGICAL_RULES):
    states = jax.jit(jax.vmap(init, in_axes=(0, 0, p_axis)))(jnp.asarray(seeds, jnp.int32),
                                                              jnp.asarray(init_seeds, jnp.int32), params)
    if lora:  # held once: the base of run 0's init (all runs share it)
      base = params if params is not None else model_lib.init_params(mcfg, state_lib.seed_keys(init_seeds[0])[0])
      states["base"] = jax.jit(lambda p: lora_lib.hold_base(mcfg, p))(base)
  return with_hparams(states, hparams)


def with_hparams(states: dict, hparams: dict[str, Sequence[Any]]) -> dict:
  """Stacked states with per-run traceable values set: OPT_KEYS into their optimizer states (a family without that
  state, e.g. ppo.critic_lr for GRPO, does not read the key), the rest into `states["hparams"]`."""
  hparams = dict(hparams)
  for key, entry in OPT_KEYS.items():
    if key in hparams:
      values = jnp.asarray(hparams.pop(key), jnp.float32)
      if entry in states:
        states[entry].hyperparams[update_lib.LR] = values
  if hparams:
    states["hparams"] = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
  return states


def run_state(states: dict, i: int) -> dict:
  """Run i of stacked states as a `main` run's state (no `hparams`; a LoRA base, held once, as is): what its
  checkpoint holds."""
  st = unstack({k: v for k, v in states.items() if k not in ("hparams", "base")}, i)
  return st if "base" not in states else dict(st, base=states["base"])


def run_model_params(states: dict, i: int) -> Any:
  """The policy params of run i (with LoRA: its adapters on the shared base)."""
  return state_lib.model_params(run_state(states, i))


def stack(states: Sequence[dict]) -> dict:
  """Per-run trees stacked on a leading run axis, in one compiled program per tree structure and run count: leaf
  by leaf, eagerly, each leaf shape's stack was its own XLA compile (13 for a resumed sweep group's states)."""
  return _stack(list(states))


@jax.jit
def _stack(states: list) -> dict:
  return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def with_values(config: ml_collections.ConfigDict, values: dict[str, Any]) -> ml_collections.ConfigDict:
  """A non-type-safe copy of config with dotted keys set (values may be tracers); `rewards` takes a weight vector
  (one per term of config.rewards, names kept)."""
  c = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
  for key, v in values.items():
    if key == REWARD_WEIGHTS:
      c.rewards = tuple((name, v[k]) for k, (name, _) in enumerate(config.rewards))
      continue
    *path, name = key.split(".")
    node = c
    for part in path:
      node = node[part]
    node[name] = v
  return c


def spec_weights(spec, config):
  """The reward spec with config.rewards' weights when they are traced (a vmapped sweep of reward weights)."""
  weights = tuple(w for _, w in config.rewards)
  if not any(isinstance(w, jax.core.Tracer) for w in weights):
    return spec
  if tuple(n for n, _ in config.rewards) != tuple(spec.names):
    raise ValueError(f"traced reward weights: config.rewards names {[n for n, _ in config.rewards]} differ from the "
                     f"reward spec's {list(spec.names)}; build the spec from config.rewards.")
  return spec._replace(weights=weights)


def make_vmapped_step(config, mesh, build: Callable[[Any], Callable],
                      compiler_options: dict | None = None) -> Callable:
  """jit(vmap(step, in_axes=(0, None))): `build(config)` returns the un-jitted step for a config; it is called
  while tracing with the run's own `state["hparams"]` values substituted, so each run sees its own scalar."""

  def one_run(state, base, batch):
    hp = state.get("hparams", {})
    step = build(with_values(config, hp) if hp else config)
    run = {k: v for k, v in state.items() if k != "hparams"}
    new_state, m = step(run if base is None else dict(run, base=base), batch)
    new_state = {k: v for k, v in new_state.items() if k != "base"}  # the base stays outside the vmap
    if hp:
      new_state = dict(new_state, hparams=hp)
    return new_state, m

  rep = sharding.replicated(mesh)
  # Stacked runs are small (ablation sizes): keep them replicated on the mesh, in and out, so every call hits the
  # same compiled program.
  counted = sharding.count_traces(one_run)
  # axis_name: the step reduces its training-length bucket over the runs (update.bucket_index)
  vmapped = jax.vmap(counted, in_axes=(0, None, None), axis_name=update_lib.RUNS_AXIS)

  def stepped(states, batch):
    base = states.get("base")  # LoRA: one frozen base for every run, unstacked, unbatched
    new_states, m = vmapped({k: v for k, v in states.items() if k != "base"}, base, batch)
    return (new_states if base is None else dict(new_states, base=base)), m

  jitted = jax.jit(stepped, donate_argnums=(0,), compiler_options=compiler_options, out_shardings=(rep, rep))

  def run(states, batch):
    states = jax.device_put(states, rep)  # no copy once they live there
    with sharding.mesh_context(mesh):
      return jitted(states, batch)
  run.jitted, run.traces = jitted, counted.traces
  # the stacked states placed as the step places them (train.rl_loop, before its step-0 evaluation and saves): an
  # initial state as vmapped init_states leaves it (uncommitted, on one device) sliced and evaluated compiled the
  # slice and each evaluation program a second time, for the states the steps return
  run.place = lambda states: jax.device_put(states, rep)
  return run


def make_steps(config, mesh, mcfg, spec, tokenizer, compiler_options: dict | None = None) -> Callable:
  """The config's RL family (families.for_config) vmapped over runs."""
  auto.check_resolved(config)  # here too: build_step runs only when the vmapped step is first traced
  family = families.for_config(config)
  return make_vmapped_step(config, mesh, lambda c: family.build_step(c, mcfg, spec_weights(spec, c), tokenizer),
                           compiler_options)


# Fast-compiling XLA:CPU settings for tiny models (tests, :small tables): LLVM at -O0 roughly halves compile time.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@jax.jit
def _take(tree: Any, i: jax.Array) -> Any:
  return jax.tree.map(lambda x: x[i], tree)


def unstack(tree: Any, i: int) -> Any:
  """Run i of a stacked tree (every leaf's leading axis is the run). One compiled program per tree's shapes, the run
  an argument: leaf by leaf, eagerly, each leaf shape and each i was its own XLA compile (~90 for a run's state)."""
  n = {x.shape[0] for x in jax.tree.leaves(tree)}
  if not 0 <= i < min(n, default=1):  # a traced index would clamp to a run that exists
    raise IndexError(f"run {i} of a stack of {sorted(n)} runs")
  return _take(tree, jnp.int32(i))


def host_scalars(metrics: dict) -> dict[str, np.ndarray]:
  """Per-run scalar metrics as S-vectors on the host (samples and status arrays dropped)."""
  out = {}
  for k, v in jax.device_get(metrics).items():
    v = np.asarray(v)
    if v.ndim == 1 and not k.startswith("samples/") and k not in ("reward_status", "env_status"):
      out[k] = v
  return out
