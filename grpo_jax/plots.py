"""`python -m grpo_jax.plots`: the entry point of grpo_jax/run/plots.py."""
import runpy

if __name__ == "__main__":
  runpy.run_module("grpo_jax.run.plots", run_name="__main__", alter_sys=True)
