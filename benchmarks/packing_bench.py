"""Reference forward + policy update, packed (rl.packing) vs the padded bucketed path, on a long-tailed length mix.

A random Qwen2-shaped model; N rows with prompts of 8..P tokens and completion lengths drawn lognormal (median L/8,
mean ≈ L/5, capped at L, one row at L so the padded path's bucket is L, as one long row makes it in a real step).
Both paths run in one process, interleaved, after a compile each; prints the median of --reps each and their ratio.

  flock /tmp/bench.lock nice -n 10 python benchmarks/packing_bench.py
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.infra import sharding
from grpo_jax.model import model as model_lib
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.tasks import digits


def lengths(n: int, L: int, seed: int = 0) -> np.ndarray:
  """Lognormal completion lengths with median L/8 and mean ≈ L/5 (σ ≈ 0.97), in [1, L]; the first row at L."""
  rng = np.random.default_rng(seed)
  out = np.clip(np.round(rng.lognormal(np.log(L / 8), 0.97, n)), 1, L).astype(np.int64)
  out[0] = L
  return out


def build(a, packing: bool):
  c = digits.bench_config(hidden=a.hidden, layers=a.layers, heads=a.heads, kv=a.kv, inter=a.inter, vocab=a.vocab,
                          prompts=a.prompts, G=a.G, L=a.L)
  c = config_lib.override(c, {"task.prompt_len": a.P, "rl.train_buckets": a.buckets, "rl.packing": packing,
                              "rl.pack_rows": a.pack_rows})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  opt = rl_step.optimizer(c)

  def passes(params, ref_params, opt_state, data, rng):
    P = a.P
    seq = data["seq"]
    bucket = rollout_lib.update_lib.bucket_index(data["lengths_N"], rollout_lib.train_lengths(c))
    ref = rollout_lib.forwards_by_length(
        c, lambda s, packed: rollout_lib.completion_logprobs(mcfg, ref_params, s, P, 1.0, packed)[0], bucket, seq, P)
    d = dict(seq=seq, old_logp_NxL=data["old_logp_NxL"], adv_NxL=data["adv_NxL"], mask_NxL=data["mask_NxL"],
             ref_logp_NxL=ref * data["mask_NxL"])
    update = rl_step.make_train_update(c, rl_step.make_forward(c, mcfg, P), rl_step.make_objective(c), (opt,), P)
    ((params,), (opt_state,)), um = rl_step.train_by_length(c, update, ((params,), (opt_state,)), d, rng, bucket, P)
    return params, opt_state, um["loss"]

  with sharding.mesh_context(mesh):
    fn = jax.jit(passes)
  return c, mcfg, mesh, fn, opt


def main():
  ap = argparse.ArgumentParser()
  for k, v in dict(hidden=128, layers=2, heads=4, kv=2, inter=256, vocab=512, prompts=8, G=8, L=512, P=32,
                   buckets=4, pack_rows=0, reps=5).items():
    ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
  a = ap.parse_args()
  N = a.prompts * a.G
  lens = lengths(N, a.L)
  rng = np.random.default_rng(1)
  plen = rng.integers(8, a.P + 1, N)
  pmask = (np.arange(a.P)[None] >= a.P - plen[:, None]).astype(np.int32)
  mask = (np.arange(a.L)[None] < lens[:, None]).astype(np.float32)
  prompt = rng.integers(3, a.vocab, (N, a.P)) * pmask
  tokens = rng.integers(3, a.vocab, (N, a.L)) * mask.astype(np.int64)
  seq = rollout_lib.full_sequence(jnp.asarray(prompt, jnp.int32), jnp.asarray(pmask), jnp.asarray(tokens, jnp.int32),
                                  jnp.asarray(mask))
  data = dict(seq=seq, lengths_N=jnp.asarray(lens, jnp.int32), mask_NxL=jnp.asarray(mask),
              old_logp_NxL=jnp.asarray(-np.log(a.vocab) * mask, jnp.float32),
              adv_NxL=jnp.asarray(rng.normal(0, 1, (N, a.L)) * mask, jnp.float32))
  runs = {}
  for name, pk in (("padded", False), ("packed", True)):
    c, mcfg, mesh, fn, opt = build(a, pk)
    params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
    args = (params, params, opt.tx.init(params), data, jax.random.PRNGKey(2))
    with sharding.mesh_context(mesh):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      runs[name] = dict(fn=fn, args=args, mesh=mesh, times=[], compile_s=time.perf_counter() - t0)
  for _ in range(a.reps):
    for name, r in runs.items():
      with sharding.mesh_context(r["mesh"]):
        t0 = time.perf_counter()
        jax.block_until_ready(r["fn"](*r["args"]))
        r["times"].append(time.perf_counter() - t0)
  med = {k: float(np.median(r["times"])) for k, r in runs.items()}
  real = int(np.sum(plen + lens))
  print(f"rows {N}, P {a.P}, L {a.L}: completion lengths median {np.median(lens):.0f} mean {lens.mean():.1f} "
        f"max {lens.max()}; real tokens {real} of {N * (a.P + a.L)} padded ({real / (N * (a.P + a.L)):.3f})")
  for k, r in runs.items():
    print(f"{k}: median {med[k]:.3f} s over {a.reps} (times {[round(t, 3) for t in r['times']]}; first call "
          f"{r['compile_s']:.1f} s)")
  print(f"RESULT packed_over_padded={med['packed'] / med['padded']:.3f} padded_s={med['padded']:.3f} "
        f"packed_s={med['packed']:.3f}")


if __name__ == "__main__":
  main()
