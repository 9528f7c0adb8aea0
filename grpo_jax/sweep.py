"""`python -m grpo_jax.sweep`: the entry point of grpo_jax/studies/sweep.py."""
import runpy

if __name__ == "__main__":
  runpy.run_module("grpo_jax.studies.sweep", run_name="__main__", alter_sys=True)
