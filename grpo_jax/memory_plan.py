"""`python -m grpo_jax.memory_plan`: the entry point of grpo_jax/perf/plan_cli.py (the planner: rl/memory_plan.py)."""
import runpy

if __name__ == "__main__":
  runpy.run_module("grpo_jax.perf.plan_cli", run_name="__main__", alter_sys=True)
