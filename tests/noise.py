"""A tree plus scale·N(0, 1) on every leaf, the tests' "trained-looking" params and adapters, from ONE normal draw.

A draw per leaf (a key split per leaf, `jax.random.normal` on each shape) puts a threefry hash per leaf into the
program, and XLA:CPU's compile time grows with them: test_lora's nonzero adapters (14 leaves) took 1.33 CPU-s to
compile that way and 0.43 s with one draw sliced over the leaves. The values are other normal draws; no test reads a
particular one (each compares two paths given the same perturbed tree, or needs the leaves away from their init).
"""
import jax
import numpy as np


def add_noise(tree, key, scale):
  """`tree` + scale·N(0, 1), one draw of the total size cut into the leaves in flatten order; traceable."""
  leaves, treedef = jax.tree.flatten(tree)
  sizes = [int(np.prod(x.shape)) for x in leaves]
  z = jax.random.normal(key, (sum(sizes),))
  offsets = np.cumsum([0] + sizes)
  return jax.tree.unflatten(treedef, [x + scale * z[o:o + n].reshape(x.shape)
                                      for x, o, n in zip(leaves, offsets, sizes)])


# one compiled program per tree structure and shapes (key and scale are arguments)
perturbed = jax.jit(add_noise)
