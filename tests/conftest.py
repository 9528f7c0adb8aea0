"""Tests run on the CPU; multi-device tests start their own subprocess with simulated devices.

XLA's backend optimisations are switched off for tests: tiny programs compile about twice as fast, and every
assertion compares runs made under the same flags (golden values are recorded under these flags too). XLA:CPU's
elemental emitters (no fusion emitters) compile them about 2.5 times faster again (an RL step of the 1-layer test
model: 8.5 s instead of 22-24 s on a loaded machine); the goldens hold under both. Subprocesses inherit these flags
through the environment (tests that add --xla_force_host_platform_device_count append to them).

Two more were tried and left out (2026-12-08): XLA:CPU's parallel codegen split count 1 and Eigen's thread pool off
cut the CPU-s of module runs on a loaded machine by ~10%, but on a clean clone the suite took 779.36 s of tests with
them and 728.44 s without (one run each, nothing else running): what they save is CPU a second core had to spare.
"""
import contextlib
import os

FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                      " --xla_cpu_use_fusion_emitters=false")

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


def requires(modname: str, reason: str):
  """The `skipif` of a test that needs an optional package (libtpu): skipped where it is missing, except under
  CI=true, where the test fails instead, as importorskip does above (read at decoration time)."""
  import functools
  import importlib.util

  import pytest

  def deco(fn):
    if importlib.util.find_spec(modname) is not None:
      return fn
    if os.environ.get("CI") != "true":
      return pytest.mark.skip(reason=reason)(fn)

    @functools.wraps(fn)
    def missing(*args, **kwargs):
      del args, kwargs
      pytest.fail(f"{modname} is missing under CI=true (the test extra installs it): {reason}")
    return missing
  return deco


@contextlib.contextmanager
def no_compilation_cache():
  """The enclosed compiles bypass the suite's persistent cache (a compile that must really run: its cache key leaves
  out xla_dump_to, so a hit would write no dump). JAX reads the cache settings once per process: reset around it."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  compilation_cache.reset_cache()
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", True)
    compilation_cache.reset_cache()  # the next compile opens the suite's cache again


# One persistent XLA compilation cache for the whole session: every subprocess the suite starts (`python -m
# grpo_jax.main` runs, the multi-device scripts) and the xdist workers' own in-process compiles share it, so a program
# that several runs or tests build (a module's reruns and resumed runs, fixtures that rebuild identical jit objects,
# the same tiny config in another module) compiles once per session. Subprocesses read it from the environment (JAX
# reads these variables when it is imported); the workers set it through jax.config, before their first compile. A
# cached executable is the same compiled code, so runs compared with each other stay bitwise equal; recompile checks
# count traces (sharding.count_traces), which a cache hit does not skip; a compile with its own options (test_memory_
# plan's XLA dump) has its own cache key, so it still compiles. Programs with host callbacks (Python reward terms) are
# never cached by JAX. JAX writes entries without a lock: a run reading one while another run writes it gets a
# warning and compiles it itself.
_CACHE_ENV = "GRPO_JAX_TEST_XLA_CACHE"  # set by the controlling pytest process; its xdist workers inherit it
_owned_cache_dir = []


def pytest_configure(config):
  import gc
  import tempfile

  # Python's cyclic collector took ~5% of a process that traces and compiles a step (perf, 2026-12-05): tracing
  # allocates many short-lived objects, and every full collection walks the long-lived ones pytest, JAX and the
  # earlier tests left. What exists at start-up frozen, and collected less often (freezing after collection
  # instead, with the test modules' imports, measured the same): test modules ran ~3.5% faster, peak RSS the
  # same (test_packing + test_lora, 88.9 / 92.0 s -> 85.6 / 88.8 s).
  gc.freeze()
  gc.set_threshold(50_000, 50, 1_000)

  import jax  # before the variables below: they are for the subprocesses; this process is set through jax.config
  # The libtpu tests compile for a topology description; no TPU chip is opened. libtpu still takes
  # /tmp/libtpu_lockfile per process, so without this a second libtpu test process, or ANY job on the machine that
  # loaded libtpu (a JAX process started without JAX_PLATFORMS=cpu), fails them with "Internal error when accessing
  # libtpu multi-process lockfile". Set before the xdist workers and subprocesses start: they inherit it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  if not os.environ.get(_CACHE_ENV):
    os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="grpo_jax_test_xla_cache_")
    _owned_cache_dir.append(os.environ[_CACHE_ENV])
  if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
    return  # the xdist controller: its workers inherit its environment before they import JAX, so leave JAX's out
  os.environ.update(JAX_COMPILATION_CACHE_DIR=os.environ[_CACHE_ENV], JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_ENV])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
  del config
  import shutil
  for d in _owned_cache_dir:
    shutil.rmtree(d, ignore_errors=True)


# The slowest modules, slowest first (each module's CPU-s in its worker plus its subprocesses, from a profiled full
# run, `-n 2` on the 2-core machine, 2026-12-08 at 654bb70, less the cuts merged after it: carry ~94, engine 85,
# faults 70, tools_rl 67, packing 52, aot 48, multihost_cli ~38, lora 36, chaos 35, ...; every module of 5 s or more).
# pytest.ini's --no-loadscope-reorder keeps xdist's queue in collection order, and this hook starts these modules
# first: by default xdist queues the modules with the MOST tests first, which puts the long subprocess modules (1 to
# 3 tests each) at the end, where the last of them runs while the other worker sits idle. Re-measure and re-sort when
# a module's time changes much.
SLOWEST_FIRST = ("test_carry", "test_engine", "test_faults", "test_tools_rl", "test_packing", "test_aot",
                 "test_multihost_cli", "test_lora", "test_chaos", "test_ablation_tables", "test_sweep", "test_turns",
                 "test_rl_step", "test_paged_attention", "test_pipeline", "test_aha", "test_attention", "test_seeds",
                 "test_sharding", "test_long_context", "test_model", "test_ppo", "test_sampling", "test_device_check",
                 "test_objectives", "test_lora_io", "test_benchmark", "test_input_errors", "test_hf_cli_qwen",
                 "test_goldens", "test_auto", "test_hf_load_memory", "test_tools_qwen", "test_algorithm_steps",
                 "test_hf_io", "test_hf_cli_llama", "test_correction", "test_keep_best", "test_checkpoint",
                 "test_launch", "test_ablate", "test_envs", "test_memory_plan", "test_numerics", "test_model_presets",
                 "test_r1_tools", "test_gdpo_table", "test_verifiers")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: the rest keep collection order
