"""Call a product function the way the train step does: inside one `jax.jit`.

Called eagerly, each of a formula's jnp ops is its own XLA program, compiled on its first shape/dtype (~15-20 ms
apiece on the CPU, plus its lowering): the formula modules paid for hundreds of them (test_objectives 777 compiles).
One jit compiles the formula as one program — the form every caller in the package uses — and the values are
asserted exactly as before. Array arguments (jax or NumPy) are traced; everything else (floats, strings, configs,
functions, None) is closed over as the static Python value the eager call saw.
"""
import jax
import numpy as np

_JITTED = {}  # (fn, argument structure, static values) → its jit, so a loop over inputs compiles once per shape


def _is_array(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _static_key(x):
  if isinstance(x, (bool, int, float, str, type(None))):
    return type(x), repr(x)  # repr: 0.0 and -0.0 (equal, one hash) are different statics
  hash(x)  # functions and other hashables by their own equality; a config (unhashable) raises TypeError
  return type(x), x


def jit_call(fn, *args, **kwargs):
  """fn(*args, **kwargs) compiled as one program."""
  leaves, treedef = jax.tree.flatten((args, kwargs))
  is_arr = tuple(_is_array(x) for x in leaves)
  static = [x for x, arr in zip(leaves, is_arr) if not arr]

  def make(static):
    def traced(arrays):
      a_it, s_it = iter(arrays), iter(static)
      a, k = jax.tree.unflatten(treedef, [next(a_it) if arr else next(s_it) for arr in is_arr])
      return fn(*a, **k)
    return jax.jit(traced)

  try:
    key = (fn, treedef, is_arr, tuple(_static_key(x) for x in static))
    jitted = _JITTED.get(key) or _JITTED.setdefault(key, make(static))
  except TypeError:  # an unhashable static: a fresh jit for this call
    jitted = make(static)
  return jitted([x for x, arr in zip(leaves, is_arr) if arr])


def jit_grad(f, x, **grad_kwargs):
  """jax.grad(f)(x) as one program (jax.grad eagerly runs, and compiles, every op of the forward and backward)."""
  return jax.jit(jax.grad(f, **grad_kwargs))(x)
