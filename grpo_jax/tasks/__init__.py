"""Synthetic verifiable tasks (arith, countdown), tokenizer, CoT writer, verifiers and data pipeline."""
from grpo_jax.tasks.base import get_task  # noqa: F401
