"""Tests run on the CPU; multi-device tests start their own subprocess with simulated devices.

XLA's backend optimisations are switched off for tests: tiny programs compile about twice as fast, and every
assertion compares runs made under the same flags (golden values are recorded under these flags too).
"""
import os

FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if FAST_COMPILE_FLAGS not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE_FLAGS).strip()
