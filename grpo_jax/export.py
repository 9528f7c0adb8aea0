"""`python -m grpo_jax.export`: the entry point of grpo_jax/hf/export.py."""
import runpy

if __name__ == "__main__":
  runpy.run_module("grpo_jax.hf.export", run_name="__main__", alter_sys=True)
