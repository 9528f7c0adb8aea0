"""Table c: state bytes of PPO-with-critic vs GRPO at equal model size, from the abstract state pytrees and from
XLA's memory analysis of the compiled steps.

Trainable = policy params + AdamW state (+ critic params + critic AdamW state); frozen = reference params. The reward
model is the in-graph verifier here (0 bytes). Exact byte counts (jax.eval_shape, nothing allocated). For the sizes
in `cfg.compile_sizes`, the whole one-graph step (GRPO's rl_step, PPO's ppo_step) is also lowered and compiled for
one CPU device on abstract inputs, and `compiled.memory_analysis()` gives the argument (state + batch) and temporary
(activations, rollout KV cache, gradients) bytes XLA plans for.
"""
import jax
import numpy as np

from grpo_jax.perf import aot
from grpo_jax.config import config_lib
from grpo_jax.rl import auto
from grpo_jax.rl import families
from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.infra import sharding

TITLE = "c. Memory: PPO with a critic vs GRPO"
CLAIM = "The critic doubles trainable memory (70B: policy ~560 GB + critic ~560 GB trainable, FP16 + Adam)."


def variants(cfg) -> list[str]:
  return [f"{size} {algo}" for size in cfg.sizes for algo in ("grpo", "ppo_separate", "ppo_head")]


def _bytes(tree) -> float:
  return float(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def run_cell(cfg, variant: str, seeds: list[int]) -> dict:
  size, algo = variant.split()
  hidden, layers = (int(v) for v in size.split("x"))
  c = config_lib.base_config()
  c.model.update(hidden=hidden, layers=layers, heads=max(hidden // 64, 1), kv_heads=max(hidden // 128, 1),
                 inter=4 * hidden, vocab_size=cfg.vocab)
  c = presets.apply(c, "ppo" if algo.startswith("ppo") else "grpo")
  if algo.startswith("ppo"):
    c.ppo.critic = algo.split("_")[1]
  mcfg = model_lib.ModelConfig.from_config(c.model)
  # The family's own state pytree (families.for_config: PPO's has the critic and its AdamW state), never allocated.
  st, _ = families.for_config(c).state_spec(c, sharding.make_mesh(c.mesh, jax.devices()[:1]), mcfg)
  policy = _bytes(st["params"]) + _bytes(st["opt_state"])
  trainable = policy + _bytes(st.get("critic_params", {})) + _bytes(st.get("critic_opt_state", {}))
  n = len(seeds)  # deterministic: the same value for every seed
  scalars = {"params_MB": [_bytes(st["params"]) / 1e6] * n, "trainable_MB": [trainable / 1e6] * n,
             "frozen_ref_MB": [_bytes(st["ref_params"]) / 1e6] * n, "trainable_vs_policy_x": [trainable / policy] * n}
  chosen = {}
  if size in tuple(cfg.get("compile_sizes", ())):
    compiled, chosen = compile_step(cfg, c)
    m = aot.memory_report(compiled, None)
    scalars.update({"xla_args_MB": [m["argument_bytes"] / 1e6] * n, "xla_temp_MB": [m["temp_bytes"] / 1e6] * n,
                    "xla_total_MB": [m["total_bytes"] / 1e6] * n})
  return {"scalars": scalars, "curves": {}, **({"auto": chosen} if chosen else {})}


def compile_step(cfg, c):
  """(the one-graph step of c's family compiled for one CPU device on abstract (never allocated) inputs, {key: 'value
  (why)'} of the `auto` knobs resolved for it: logged, and recorded with the cell)."""
  c.rl.update(prompts_per_step=cfg.workload.prompts, G=cfg.workload.G)
  c.task.prompt_len = cfg.workload.prompt_len
  c.sampling.max_new_tokens = cfg.workload.L
  c.model.max_len = cfg.workload.prompt_len + cfg.workload.L
  devices = jax.devices()[:1]
  # the `auto` knobs as a run of this workload resolves them (rl/auto.py): the step a run compiles, not the
  # reference path an unresolved config builds
  c, chosen = auto.resolve_here(c, sharding.make_mesh(c.mesh, devices))
  return aot.compile_step(c, devices, dict(c.mesh))[0], chosen
