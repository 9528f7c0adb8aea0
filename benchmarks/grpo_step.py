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

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers")
FLAGS = dict(hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=512, prompts=8, G=8, L=64, steps=6)
PAD, EOS, DIGIT0 = 0, 1, 2          # ids 2..11 are the digits 0..9
WHAT, IS, PLUS, EQ = 12, 13, 14, 15


class BenchTokenizer:
  """Digits as single tokens plus the four words of the prompt; the rest of the vocab is unused ids."""
  pad_id, eos_id, bos_id = PAD, EOS, PAD
  tag_ids: dict = {}

  def __init__(self, vocab):
    self.vocab_size = vocab

  @staticmethod
  def digits(n: int) -> list[int]:
    return [DIGIT0 + int(ch) for ch in str(n)]


def make_batches(prompts: int, steps: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  P, A = 4 + 3 + 3, 4
  for _ in range(steps):
    prompt = np.zeros((prompts, P), np.int32)
    pmask = np.zeros((prompts, P), np.int32)
    ans = np.full((prompts, A), -1, np.int32)
    for i in range(prompts):
      a, b = rng.integers(0, 1000, 2)
      ids = [WHAT, IS] + BenchTokenizer.digits(a) + [PLUS] + BenchTokenizer.digits(b) + [EQ]
      prompt[i, P - len(ids):] = ids  # left padding
      pmask[i, P - len(ids):] = 1
      d = BenchTokenizer.digits(a + b)
      ans[i, :len(d)] = d
    yield {"prompt_NxP": prompt, "prompt_mask_NxP": pmask, "answer_ids_NxA": ans}


def contains_answer(tokens_NxL, mask_NxL, batch, ctx):
  """1 if the answer's digit ids appear contiguously in the completion (the peers' `ans in completion`)."""
  import jax.numpy as jnp
  from grpo_jax import rewards
  ans_NxA = batch["answer_ids_NxA"]
  A, L = ans_NxA.shape[1], tokens_NxL.shape[1]
  toks = jnp.where(mask_NxL > 0, tokens_NxL, -2)
  toks = jnp.pad(toks, ((0, 0), (0, A)), constant_values=-2)
  valid_A = ans_NxA >= 0
  hit = jnp.zeros(tokens_NxL.shape, bool) | True
  for j in range(A):
    hit = hit & ((toks[:, j:j + L] == ans_NxA[:, j:j + 1]) | ~valid_A[:, j:j + 1])
  return rewards._ok(jnp.any(hit, axis=1).astype(jnp.float32))


def bench_config(a):
  from grpo_jax import config_lib
  c = config_lib.base_config()
  c.model.update(vocab_size=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv,
                 inter=a.inter, max_len=16 + a.L, tie_embeddings=True, qkv_bias=True, dtype=a.dtype,
                 remat=a.remat)
  c.sampling.update(temperature=1.0, max_new_tokens=a.L)
  c.task.prompt_len = 10
  c.rl.update(algo="grpo", G=a.G, prompts_per_step=a.prompts, beta=0.04, mu=1, minibatches=1)
  c.optim.update(lr=1e-5, grad_clip=1.0)
  c.mesh.update(data=-1, fsdp=1, tensor=1)
  c.train.num_samples_logged = 1
  c.eval.batch = a.prompts
  return c


def run_ours(a) -> dict:
  import jax
  from grpo_jax import model as model_lib
  from grpo_jax import rewards, rl_step, sharding, state as state_lib, validate
  c = bench_config(a)
  tok = BenchTokenizer(a.vocab)
  validate.validate_rl(c, jax.device_count())
  mesh = sharding.make_mesh(c.mesh)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  tx = state_lib.make_optimizer(c.optim, a.steps)
  spec = rewards.RewardSpec(("contains",), (1.0,), (contains_answer,), {}, rewards.Context("bench", tok))
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
