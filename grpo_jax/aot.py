"""`python -m grpo_jax.aot`: the entry point of grpo_jax/perf/aot.py."""
import runpy

if __name__ == "__main__":
  runpy.run_module("grpo_jax.perf.aot", run_name="__main__", alter_sys=True)
