"""Tests run on the CPU; multi-device tests start their own subprocess with simulated devices."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
