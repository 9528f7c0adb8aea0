"""Sharding, multi-host, checkpoints, integrity, errors, signals, the workdir lock."""
