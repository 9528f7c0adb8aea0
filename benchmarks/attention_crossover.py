"""Where `model.attention='auto'` switches from the einsum path to blockwise on the CPU (attention.CPU_BLOCKWISE_MIN_T).

Times forward+backward of one attention layer (the sum of its output against a fixed cotangent) for the einsum path
and for blockwise at several block sizes, fp32, left-padded rows, same inputs. Runs are interleaved (xla, block
a, block b, ..., repeated) so that a shared machine's load hits every variant alike; prints the median per variant
and blockwise/xla ratios.

  nice -n 10 python benchmarks/attention_crossover.py
  nice -n 10 python benchmarks/attention_crossover.py --T 512 1024 --head-dim 64 --blocks 512
"""
import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.model import attention


def time_variants(n, h, kv, d, t, blocks, reps):
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((n, t, h, d)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((n, t, kv, d)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((n, t, kv, d)), jnp.float32)
  mask = np.ones((n, t), np.int32)
  mask[:, : t // 8] = 0  # some left padding, as rollouts have
  w = jnp.asarray(rng.standard_normal((n, t, h, d)), jnp.float32)

  mask = jnp.asarray(mask)

  def step(f):  # every input an argument: nothing for XLA to constant-fold
    return jax.jit(jax.grad(lambda q, k, v, m, w: jnp.vdot(f(q, k, v, m), w), argnums=(0, 1, 2)))

  fns = {"xla": step(attention.einsum)}
  for b in blocks:
    fns[f"block{b}"] = step(lambda q, k, v, m, b=b: attention.blockwise(q, k, v, m, b))
  for f in fns.values():
    jax.block_until_ready(f(q, k, v, mask, w))  # compile
  times = {name: [] for name in fns}
  for _ in range(reps):
    for name, f in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(f(q, k, v, mask, w))
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(ts) for name, ts in times.items()}


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--T", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
  ap.add_argument("--rows", type=int, default=2)
  ap.add_argument("--heads", type=int, default=8)
  ap.add_argument("--kv", type=int, default=2)
  ap.add_argument("--head-dim", type=int, nargs="+", default=[16, 64])
  ap.add_argument("--blocks", type=int, nargs="+", default=[64, 128, 256])
  ap.add_argument("--reps", type=int, default=5)
  a = ap.parse_args()
  print(f"{jax.devices()[0].device_kind}, rows {a.rows}, heads {a.heads}/{a.kv}, fwd+bwd seconds (median of "
        f"{a.reps}, interleaved)")
  for d in a.head_dim:
    for t in a.T:
      med = time_variants(a.rows, a.heads, a.kv, d, t, a.blocks, a.reps)
      ratios = "  ".join(f"{k}/xla {v / med['xla']:.2f}" for k, v in med.items() if k != "xla")
      print(f"Dh={d:<3} T={t:<5} xla {med['xla']:.4f} s  " + "  ".join(
          f"{k} {v:.4f} s" for k, v in med.items() if k != "xla") + "   " + ratios, flush=True)


if __name__ == "__main__":
  main()
