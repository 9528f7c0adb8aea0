"""The algorithm families, and the one place that picks one: `rl.algo` → the module that owns its state and step.

`rl.algo` names a preset (presets.py: every knob its paper sets, the advantage estimator `rl.advantage` among them);
the presets of presets.CRITIC_ALGOS (PPO) need a critic, every other runs in the GRPO family.

A family module (rl_step, ppo_step, sft_step) exposes the same interface:
  optimizer(config) -> update.Optimizer
  layout(config, mcfg) -> state.Layout                       # what its state holds besides the policy
  state_spec(config, mesh, mcfg) -> (abstract state, shardings)
  init(config, mesh, mcfg, *, seed=None, params=None) -> state, created already sharded
  build_step(config, mcfg, *args) -> un-jitted (state, batch) -> (state, metrics)
    (rl_step / ppo_step: args = reward spec, tokenizer; sft_step: none)
train.py, aot.py, studies/vmapped_runs.py and the ablations reach the RL families through `for_config` only.
"""
from types import ModuleType

from grpo_jax.rl import ppo_step
from grpo_jax.config import presets
from grpo_jax.rl import rl_step
from grpo_jax.infra import sharding

def algos() -> tuple[str, ...]:
  """Every valid rl.algo: the presets."""
  return presets.names()


def for_config(config) -> ModuleType:
  """The family that runs `config.rl.algo`."""
  algo = config.rl.algo
  if algo in presets.CRITIC_ALGOS:
    return ppo_step
  if algo in presets.PRESETS:
    return rl_step
  raise ValueError(f"config.rl.algo={algo!r} is not one of {algos()}; pick one, or add a preset (presets.py).")


def make_step(config, mesh, mcfg, *args, family: ModuleType | None = None, compiler_options: dict | None = None):
  """The family's step (`for_config`'s unless `family` is given, e.g. sft_step), jitted with the state donated and
  pinned to the family's state shardings (sharding.jit_step); `compiler_options` go to XLA for this program."""
  family = family or for_config(config)
  return sharding.jit_step(family.build_step(config, mcfg, *args), mesh, family.state_spec(config, mesh, mcfg)[1],
                           compiler_options)

