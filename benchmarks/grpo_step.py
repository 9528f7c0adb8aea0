"""Seconds per GRPO step on the peers' workload (../shared/peers/trl_grpo_bench.py), same flags.

Random-init Qwen2-shaped model with tied embeddings, prompts "what is A + B =", reward 1 if the answer's digits
appear in the completion, β=0.04 (k3 in the loss), μ=1, lr 1e-5, temperature 1, L new tokens always decoded.
The first (compiling) step is excluded; the update is never skipped, and the script checks that params changed.

  python benchmarks/grpo_step.py --hidden 64 --layers 2 --heads 4 --kv 2 --inter 128 --vocab 512 --prompts 8 --G 8 --L 64
  python benchmarks/grpo_step.py ... --vs-trl /tmp/trlenv/bin/python --vs-tunix /tmp/tunixenv/bin/python
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

from grpo_jax import peer_workload
from grpo_jax.peer_workload import BenchTokenizer, make_batches

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers")
FLAGS = dict(hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=512, prompts=8, G=8, L=64, steps=6)
def bench_config(a):
  return peer_workload.bench_config(hidden=a.hidden, layers=a.layers, heads=a.heads, kv=a.kv, inter=a.inter,
                                    vocab=a.vocab, prompts=a.prompts, G=a.G, L=a.L, dtype=a.dtype, remat=a.remat)


def run_ours(a) -> dict:
  import jax
  from grpo_jax import model as model_lib
  from grpo_jax import rl_step, sharding, state as state_lib, validate
  c = bench_config(a)
  tok = BenchTokenizer(a.vocab)
  validate.validate_rl(c, jax.device_count())
  mesh = sharding.make_mesh(c.mesh)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  tx = state_lib.make_optimizer(c.optim, a.steps)
  spec = peer_workload.reward_spec(a.vocab)
  step = rl_step.make_rl_step(c, mesh, mcfg, tx, spec, tok)
  state = state_lib.create_state(mesh, mcfg, tx, seed=0)
  p0 = jax.device_get(state["params"])
  times, rewards_seen = [], []
  for i, batch in enumerate(make_batches(a.prompts, a.steps)):
    t0 = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(state["params"])
    times.append(time.perf_counter() - t0)
    rewards_seen.append(float(m["train/reward_mean"]))
  p1 = jax.device_get(state["params"])
  changed = any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)))
  if not changed:
    raise SystemExit("benchmark error: params did not change; the update must never be skipped.")
  nparams = sum(x.size for x in jax.tree.leaves(p1))
  return dict(compile_s=times[0], times=times[1:], median=statistics.median(times[1:]), nparams=nparams,
              reward=float(np.mean(rewards_seen)), len_mean=float(m["train/completion_len_mean"]))


def run_peer(python: str, script: str, a, key: str) -> float | None:
  cmd = [python, os.path.join(PEERS, script)] + [f"--{k}={getattr(a, k)}" for k in FLAGS]
  print("+", " ".join(cmd), flush=True)
  out = subprocess.run(cmd, capture_output=True, text=True)
  m = re.search(rf"RESULT {key}=([0-9.]+)", out.stdout)
  if not m:
    print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
    return None
  return float(m.group(1))


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  for k, v in FLAGS.items():
    ap.add_argument(f"--{k}", type=int, default=v)
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--remat", default="none", choices=["none", "full", "dots"])
  ap.add_argument("--vs-trl", default="", help="python of a venv with TRL (see ../shared/peers/README.md)")
  ap.add_argument("--vs-tunix", default="", help="python of a venv with tunix")
  a = ap.parse_args()
  ours = run_ours(a)
  print(f"grpo_jax params {ours['nparams']} compile+first step {ours['compile_s']:.2f}s "
        f"steps {[round(t, 4) for t in ours['times']]} reward_mean {ours['reward']:.3f}")
  line = f"RESULT s_per_step={ours['median']:.4f} compile_s={ours['compile_s']:.2f} completions={a.prompts * a.G} L={a.L}"
  for flag, script, key, name in ((a.vs_trl, "trl_grpo_bench.py", "trl_s_per_step", "trl"),
                                  (a.vs_tunix, "tunix_grpo_bench.py", "tunix_s_per_step", "tunix")):
    if flag:
      peer = run_peer(flag, script, a, key)
      if peer is not None:
        line += f" {name}_s_per_step={peer:.4f} speedup_vs_{name}={peer / ours['median']:.2f}"
  print(line)


if __name__ == "__main__":
  main()
