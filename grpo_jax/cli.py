"""What the commands on the package's top floor share (`python -m grpo_jax.main`, `.sweep`, `.ablate`).

The persistent compilation cache: a command compiles each program once per machine, not once per run. A rerun, a
resume, every seed of a serial sweep and every stage that builds the same program load the compiled executable from
disk (JAX's persistent cache: the key covers the program, the jax / XLA version, the XLA flags and the devices, so a
hit is the same compiled code and runs stay bitwise equal). It lives in `$GRPO_JAX_XLA_CACHE` if set, else
`$XDG_CACHE_HOME/grpo_jax/xla` (`~/.cache/grpo_jax/xla`); `GRPO_JAX_XLA_CACHE=off` turns it off. JAX's own
`JAX_COMPILATION_CACHE_DIR` (the test suite sets one per session) takes precedence, as does a cache directory a
caller configured before. Programs whose compile took under a second are not stored (JAX's default threshold),
programs with host callbacks (Python reward terms) never are (JAX skips them), and the directory is trimmed to
CACHE_MAX_BYTES, least recently used first.
"""
import os

CACHE_ENV = "GRPO_JAX_XLA_CACHE"
CACHE_OFF = ("off", "0", "false", "none", "")
CACHE_MAX_BYTES = 4 << 30  # JAX evicts the least recently used entries past this


def cache_dir() -> str | None:
  """Where this command's compiled programs are kept (None: off, or JAX's own setting applies)."""
  value = os.environ.get(CACHE_ENV)
  if value is not None:
    return None if value.strip().lower() in CACHE_OFF else os.path.expanduser(value)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "grpo_jax", "xla")


def compilation_cache() -> str | None:
  """Turns on JAX's persistent compilation cache for this process (before its first compile); returns the
  directory in use, or None when off. Leaves an already configured cache (JAX_COMPILATION_CACHE_DIR, or
  jax.config set by the caller) as it is."""
  import jax  # pylint: disable=g-import-not-at-top  (the commands import jax after their flags parse)
  configured = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
  if configured:
    return configured
  d = cache_dir()
  if d is None:
    return None
  try:
    os.makedirs(d, exist_ok=True)
  except OSError:
    return None  # a read-only home: compile as before
  jax.config.update("jax_compilation_cache_dir", d)
  jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
  return d
