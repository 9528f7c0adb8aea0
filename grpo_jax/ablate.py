"""`python -m grpo_jax.ablate`: the entry point of grpo_jax/studies/ablate.py."""
import runpy

if __name__ == "__main__":
  runpy.run_module("grpo_jax.studies.ablate", run_name="__main__", alter_sys=True)
