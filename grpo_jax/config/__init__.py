"""Configs: the config helpers, algorithm presets, sweep points."""
