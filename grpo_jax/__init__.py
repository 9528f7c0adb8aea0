"""grpo_jax: GRPO-family RL of language models in JAX."""
from grpo_jax.infra import console as _console

# Before anything imports JAX: a machine with no accelerator runs on the CPU without libtpu's start-up errors
# (grpo_jax/infra/console.py says when and why).
_console.default_platform()
