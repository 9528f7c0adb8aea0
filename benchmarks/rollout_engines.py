"""The static and continuous rollout engines on one long-tailed length mix, same model, prompts and uniforms.

A random-init model of the given shape; the EOS set is the `--eos-ids` ids most likely after the prompts, so that
rows end at about geometric lengths (most early, a few near L): a long tail without a trained checkpoint. Both
engines are jitted once; each timed repeat draws new uniforms (a new length mix, no recompile: the trace counts
are printed), interleaved static / continuous. Prints per engine: median rollout seconds, decode steps, slot
utilisation (generated tokens / row-steps computed), compile seconds, traces.

  python benchmarks/rollout_engines.py --hidden 256 --layers 4 --heads 8 --kv 4 --inter 1024 --vocab 2048 \
      --prompts 8 --G 8 --L 384 --eos-ids 24
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.model import model as model_lib
from grpo_jax.rollout import engine
from grpo_jax.rollout import sampling


def main():
  ap = argparse.ArgumentParser()
  for k, v in dict(hidden=256, layers=4, heads=8, kv=4, inter=1024, vocab=2048, prompts=8, G=8, L=384,
                   prompt_len=10, eos_ids=24, reps=5, slots=0, compaction=4, exit_chunk=16).items():
    ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
  a = ap.parse_args()
  mcfg = model_lib.ModelConfig(vocab_size=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads,
                               kv_heads=a.kv, inter=a.inter, max_len=a.prompt_len + a.L, tie_embeddings=True,
                               qkv_bias=True)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  prompt_BxP = rng.integers(1, a.vocab, (a.prompts, a.prompt_len)).astype(np.int32)
  pmask_BxP = np.ones_like(prompt_BxP)
  n = a.prompts * a.G
  # the ids the model puts the most mass on after the prompts: a steady per-step chance of ending a row
  logits = model_lib.forward(mcfg, params, prompt_BxP, np.broadcast_to(np.arange(a.prompt_len), prompt_BxP.shape),
                             pmask_BxP)
  mass_V = np.asarray(jax.nn.softmax(logits[:, -1], -1)).mean(0)
  eos = tuple(int(i) for i in np.argsort(-mass_V)[:a.eos_ids])
  scfg = sampling.SamplingConfig(max_new_tokens=a.L, eos_id=eos, pad_id=0, exit_chunk=a.exit_chunk)
  traces = {"static": 0, "continuous": 0}

  def static_fn(params, p, m, u):
    traces["static"] += 1
    ro = sampling.sample(mcfg, params, jnp.repeat(p, a.G, 0), jnp.repeat(m, a.G, 0), None, scfg, u_LxN=u)
    return ro, n * ro.decode_steps

  def continuous_fn(params, p, m, u):
    traces["continuous"] += 1
    ro, st = engine.sample_groups(mcfg, params, p, m, a.G, scfg, u_LxN=u, slots=a.slots, levels=a.compaction)
    return ro, st.row_steps

  fns = {"static": jax.jit(static_fn), "continuous": jax.jit(continuous_fn)}
  compile_s, times, steps, util, lengths = {}, {k: [] for k in fns}, {k: [] for k in fns}, {k: [] for k in fns}, []
  for name, f in fns.items():
    t0 = time.perf_counter()
    fns[name] = f.lower(params, prompt_BxP, pmask_BxP, sampling.uniforms(jax.random.PRNGKey(0), a.L, n)).compile()
    compile_s[name] = time.perf_counter() - t0
  for r in range(a.reps + 1):
    u = sampling.uniforms(jax.random.PRNGKey(r + 1), a.L, n)
    outs = {}
    for name, f in fns.items():
      t0 = time.perf_counter()
      ro, row_steps = jax.block_until_ready(f(params, prompt_BxP, pmask_BxP, u))
      dt = time.perf_counter() - t0
      outs[name] = ro
      if r:  # the first repeat warms up
        times[name].append(dt)
        steps[name].append(int(ro.decode_steps))
        util[name].append(float(engine.slot_util(ro.lengths_N, row_steps)))
    same = bool(np.array_equal(np.asarray(outs["static"].tokens_NxL), np.asarray(outs["continuous"].tokens_NxL)))
    lens = np.asarray(outs["static"].lengths_N)
    if r:
      lengths.append(lens)
    print(f"repeat {r}: tokens equal {same}; lengths median {np.median(lens):.0f} mean {lens.mean():.1f} max "
          f"{lens.max()} (sum {lens.sum()}); static {times['static'][-1] if r else 0:.3f} s, continuous "
          f"{times['continuous'][-1] if r else 0:.3f} s", flush=True)
  for name in fns:
    print(f"{name}: median {np.median(times[name]):.3f} s, decode steps {steps[name]}, slot util "
          f"{np.mean(util[name]):.3f}, compile {compile_s[name]:.1f} s, traces {traces[name]}")
  ratio = np.median(times["continuous"]) / np.median(times["static"])
  print(f"RESULT continuous_over_static={ratio:.3f} static_s={np.median(times['static']):.3f} "
        f"continuous_s={np.median(times['continuous']):.3f} util_static={np.mean(util['static']):.3f} "
        f"util_continuous={np.mean(util['continuous']):.3f}")


if __name__ == "__main__":
  main()
