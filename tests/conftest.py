"""Tests run on the CPU; multi-device tests start their own subprocess with simulated devices.

XLA's backend optimisations are switched off for tests: tiny programs compile about twice as fast, and every
assertion compares runs made under the same flags (golden values are recorded under these flags too).
"""
import contextlib
import os

FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if FAST_COMPILE_FLAGS not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE_FLAGS).strip()

# Under CI (CI=true, set by .ci/run) the optional test packages (torch, transformers, tokenizers, math-verify, libtpu)
# are installed by the `test` extra, so a missing one is a broken install: fail the test instead of skipping it.
if os.environ.get("CI") == "true":
  import importlib

  import pytest

  def _import_or_fail(modname: str, minversion: str | None = None, reason: str | None = None, **_):
    del minversion, reason
    return importlib.import_module(modname)

  pytest.importorskip = _import_or_fail


@contextlib.contextmanager
def private_compilation_cache(directory: str):
  """A persistent XLA compilation cache in `directory` for the enclosed code, every entry cached, JAX's settings
  restored after: fixtures that rebuild identical jit objects compile each program once (test time only)."""
  import jax
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  saved = {k: getattr(jax.config, k) for k in keys}
  jax.config.update("jax_compilation_cache_dir", str(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  try:
    yield
  finally:
    for k, v in saved.items():
      jax.config.update(k, v)
