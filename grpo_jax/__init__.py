"""grpo_jax: GRPO-family RL of language models in JAX."""
