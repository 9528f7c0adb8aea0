"""Verifiable tasks: registry.TASKS (what each task provides), generators, tokenizers, CoT writer, verifiers, data."""
