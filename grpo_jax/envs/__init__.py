"""Environments for multi-turn rollouts with tools (docs/tools.md)."""
