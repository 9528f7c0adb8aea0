"""Where a GRPO step's time goes: rollout, reference log-probs and update, each jitted alone, under XLA:CPU's
default matmul path (YNNPACK) and with it off (Eigen), interleaved in one invocation.

  python benchmarks/profile_parts.py --hidden 64 --layers 2 --heads 4 --kv 2 --inter 128 --vocab 512 --prompts 8 \
      --G 8 --L 64 [--dump DIR]

`--variants ynn,eigen,ynn+layer_unroll=none` compares matmul paths and model options (first = baseline).
`--dump DIR` also writes XLA's optimised HLO of each part (with op counts of the decode loop body printed).
"""
import argparse
import dataclasses
import os
import re
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from grpo_jax.model import model as model_lib
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rollout import sampling
from grpo_jax.infra import sharding
from grpo_jax.tasks import digits

FLAGS = dict(hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=512, prompts=8, G=8, L=64, reps=5)
YNN_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}


def bench_prompts(a) -> tuple[jax.Array, jax.Array]:
  """The parts' prompts and their mask, each prompt repeated G times: what rollout, reference and update run on."""
  batch = next(digits.make_batches(a.prompts, 1))
  return (jnp.repeat(jnp.asarray(batch["prompt_NxP"]), a.G, 0),
          jnp.repeat(jnp.asarray(batch["prompt_mask_NxP"]), a.G, 0))


def parts(a, **model_over):
  """(name -> (fn, args)) for rollout, reference log-probs and one update, on the benchmark workload."""
  c = digits.bench_config(hidden=a.hidden, layers=a.layers, heads=a.heads, kv=a.kv, inter=a.inter,
                                 vocab=a.vocab, prompts=a.prompts, G=a.G, L=a.L, dtype=a.dtype)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = dataclasses.replace(model_lib.ModelConfig.from_config(c.model), **model_over)
  tx = rl_step.optimizer(c).tx
  tok = digits.Tokenizer(a.vocab)
  scfg = sampling.SamplingConfig.from_config(c.sampling, eos_id=tok.eos_id, pad_id=tok.pad_id)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  opt_state = tx.init(params)
  prompt_NxP, pmask_NxP = bench_prompts(a)
  P = prompt_NxP.shape[1]
  rng = jax.random.PRNGKey(1)

  def rollout(params, rng):
    return sampling.sample(mcfg, params, prompt_NxP, pmask_NxP, rng, scfg)

  ro = jax.jit(rollout)(params, rng)
  mask_NxL = ro.mask_NxL.astype(jnp.float32)
  seq = rollout_lib.full_sequence(prompt_NxP, pmask_NxP, ro.tokens_NxL, mask_NxL)
  loss_fn = rl_step.make_loss_fn(c, mcfg, P)
  mb = dict(seq=seq, old_logp_NxL=ro.logp_NxL, ref_logp_NxL=ro.logp_NxL,
            adv_NxL=jnp.ones_like(mask_NxL) * mask_NxL, mask_NxL=mask_NxL)

  def reference(params):
    return rollout_lib.completion_logprobs(mcfg, params, seq, P, 1.0)[0]

  def update(params, opt_state):
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return mesh, {"rollout": (rollout, (params, rng)), "reference": (reference, (params,)),
                "update": (update, (params, opt_state))}


def time_fn(fn, args, reps, clock=time.perf_counter):
  """Median seconds of `fn(*args)` after one warm-up call. clock=time.process_time gives this process's CPU
  seconds (all threads): less sensitive than wall time to other jobs on a shared machine."""
  out = fn(*args)
  jax.block_until_ready(out)
  ts = []
  for _ in range(reps):
    t0 = clock()
    jax.block_until_ready(fn(*args))
    ts.append(clock() - t0)
  return statistics.median(ts)


def loop_body_ops(hlo_text: str) -> dict[str, int]:
  """Instruction count of each while-loop body computation in optimised HLO text (a proxy for dispatches)."""
  bodies = set(re.findall(r"body=([%\w.\-]+)", hlo_text))
  counts = {}
  for comp in re.split(r"\n(?=\S)", hlo_text):
    m = re.match(r"(?:ENTRY )?([%\w.\-]+)", comp)
    if m and m.group(1) in bodies:
      counts[m.group(1)] = sum(1 for ln in comp.splitlines()[1:] if " = " in ln)
  return counts


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  for k, v in FLAGS.items():
    ap.add_argument(f"--{k}", type=int, default=v)
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--dump", default="")
  ap.add_argument("--parts", default="rollout,reference,update")
  ap.add_argument("--variants", default="ynn,eigen",
                  help="comma list of ynn|eigen[+model_field=value...], e.g. ynn,eigen,ynn+layer_unroll=none")
  a = ap.parse_args()
  variants = {}  # label -> (fns, compiler options)
  for v in a.variants.split(","):
    over = dict(kv.split("=") for kv in v.split("+")[1:])
    mesh, fns = parts(a, **over)
    fns = {k: v for k, v in fns.items() if k in a.parts.split(",")}
    variants[v] = (fns, YNN_OFF if v.split("+")[0] == "eigen" else None)
  with sharding.mesh_context(mesh):
    compiled = {}
    for label, (fns, opts) in variants.items():
      for name, (fn, args) in fns.items():
        compiled[name, label] = jax.jit(fn, compiler_options=opts).lower(*args).compile()
        if a.dump:
          os.makedirs(a.dump, exist_ok=True)
          text = compiled[name, label].as_text()
          with open(os.path.join(a.dump, f"{name}_{label}.hlo.txt"), "w") as f:
            f.write(text)
          print(f"{name}/{label}: while bodies -> ops {loop_body_ops(text)}")
    # interleave: each round times every (part, variant) once
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    times = {(k, c): [] for k in compiled for c in clocks}
    for _ in range(a.reps):
      for (name, label), exe in compiled.items():
        for c, clock in clocks.items():
          times[(name, label), c].append(time_fn(exe, variants[label][0][name][1], 1, clock))
  base = a.variants.split(",")[0]
  med = lambda name, label, c: statistics.median(times[(name, label), c])
  print(f"load average {os.getloadavg()[0]:.2f}")
  for c in clocks:
    for name in fns:
      row = "  ".join(f"{label}={med(name, label, c) * 1e3:7.1f}ms" for label in variants)
      print(f"PART[{c}] {name:10s} {row}  (ratios to {base}: " + " ".join(
          f"{med(name, label, c) / med(name, base, c):.2f}" for label in variants) + ")")


if __name__ == "__main__":
  main()
