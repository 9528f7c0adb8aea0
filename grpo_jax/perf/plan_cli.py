"""`python -m grpo_jax.memory_plan`: the planner's bytes per device (rl/memory_plan.py) for the peers' workload on a
named model shape and mesh, the `auto` knobs resolved first (rl/auto.py) against `--hbm-gib` (none: no limit).
Apart from memory_plan.py because rl/auto.py, which it calls, plans with memory_plan.

  python -m grpo_jax.memory_plan --model=qwen2.5-1.5b --mesh data=1,fsdp=64,tensor=1 --prompts 16 --G 8 \
      --prompt-len 256 --L 512 --hbm-gib 16 [--minibatches auto --rollout-chunks auto]
"""
import argparse
import json
import math
import sys

from grpo_jax.perf import workload_flags
from grpo_jax.rl import auto
from grpo_jax.rl import memory_plan
from grpo_jax.rl import plan_terms
from grpo_jax.rl import row_chunks


def gib(text: str) -> float:
  """--hbm-gib: a finite size >= 0 (inf was an OverflowError traceback, a negative one a plan against nothing)."""
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not (math.isfinite(value) and value >= 0):
    raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number of GiB >= 0 (0 = no limit)")
  return value


def main(argv=None) -> int:
  ap = workload_flags.parser(__doc__, sorted(memory_plan.PRESETS), sorted(plan_terms.BYTES),
                            "data=1,fsdp=16,tensor=1", "data=..,fsdp=..,tensor=.. (explicit sizes)")
  ap.add_argument("--platform", default="tpu", choices=["tpu", "gpu", "cpu"],
                  help="the backend whose attention path model.attention='auto' picks (attention.choose)")
  ap.add_argument("--hbm-gib", type=gib, default=0.0, help="chip memory to compare against (0 = none)")
  a = ap.parse_args(argv)
  try:
    mesh = memory_plan.parse_mesh(a.mesh)
    if any(v < 1 for v in mesh.values()):
      raise ValueError(f"--mesh={a.mesh}: the planner needs explicit sizes (no -1).")
    c = memory_plan.workload_config(mesh=mesh, **workload_flags.workload_kwargs(a))
    workload_flags.check_runs(c, mesh)  # a step no run would build (the carry beside PPO's critic) is not planned
    hbm = int(a.hbm_gib * memory_plan.GiB) if a.hbm_gib else None
    # the `auto` knobs (--minibatches/--rollout-chunks auto, --slots 0, ...) resolve against the chip's memory
    c, chosen = auto.resolve(c, auto.Context(mesh, hbm, a.platform))
    row_chunks.check_chunks(c.rl.rollout_chunks, a.prompts * a.G)
    # sampling.decode_layout=auto resolves against the chip's memory
    p = memory_plan.plan(c, mesh, plat=a.platform, hbm_bytes=hbm)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if a.json:
    print(json.dumps(dict(p.as_dict(), mesh=mesh, model=a.model, hbm_bytes=hbm, auto=chosen)))
  else:
    print(f"{a.model}  mesh {mesh}  {a.prompts} prompts x G {a.G}, {a.prompt_len}+{a.L} tokens, {a.dtype}, "
          f"remat={a.remat}, params {p.params / 1e9:.3f}B")
    print(memory_plan.format_plan(p, hbm))
    for key, why in chosen.items():
      print(f"auto {key} = {why}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
