"""The sampler's recorded log-probs (μ) against the training forward's (π_prox) on the same tokens: max and mean
|Δ log-prob| per completion token, for the static and continuous engines and the padded and packed passes.

Not a timing: a numeric check (rl/correction.py's exact on-policy mode relies on the two agreeing in fp32). The
default shape is the main job's model (configs/grpo_arith.py: hidden 128, 3 layers, 4 heads / 2 KV, inter 384,
vocab 512) and its batch (16 prompts × G 8, L 72), random-init weights, the benchmark's digit prompts; the rollout
is made to run the π_prox forward by a correction (rl.rollout_correction='tis'). `--sampling-dtype bfloat16` shows the
mismatch a bf16 sampler injects beside the fp32 trainer.

  python benchmarks/logprob_gap.py                              # fp32 sampler and trainer
  python benchmarks/logprob_gap.py --sampling-dtype bfloat16    # bf16 sampler, fp32 trainer
"""
import argparse

import jax
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.infra import sharding
from grpo_jax.model import model as model_lib
from grpo_jax.rl import losses
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.tasks import digits


def gaps(c, seeds: int) -> list[tuple[float, float, float, int]]:
  """(max |Δ|, mean |Δ|, k3 mismatch KL(μ‖π_prox), tokens) of one rollout of config `c` per seed (one compile)."""
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  fn = jax.jit(rollout_lib.make_rollout_fn(c, mcfg, spec, spec.ctx.tokenizer))
  out = []
  for seed in range(seeds):
    st = rl_step.init(c, mesh, mcfg, seed=seed)
    batch = next(digits.make_batches(c.rl.prompts_per_step, 1, seed=seed))
    with sharding.mesh_context(mesh):
      ro = jax.device_get(fn(st["params"], st.get("ref_params"), batch, jax.random.PRNGKey(seed)))
    m = ro.mask_NxL > 0
    d = np.abs(ro.old_logp_NxL - ro.behav_logp_NxL)[m]
    k3 = np.asarray(losses.kl_k3(ro.behav_logp_NxL, ro.old_logp_NxL))[m].mean()
    out.append((float(d.max()), float(d.mean()), float(k3), int(m.sum())))
  return out


def main():
  ap = argparse.ArgumentParser()
  for k, v in dict(hidden=128, layers=3, heads=4, kv=2, inter=384, vocab=512, prompts=16, G=8, L=72,
                   seeds=3).items():
    ap.add_argument("--" + k, type=int, default=v)
  ap.add_argument("--sampling-dtype", default="", choices=("", "float32", "bfloat16"))
  a = ap.parse_args()
  base = digits.bench_config(hidden=a.hidden, layers=a.layers, heads=a.heads, kv=a.kv, inter=a.inter,
                             vocab=a.vocab, prompts=a.prompts, G=a.G, L=a.L)
  for engine in ("static", "continuous"):
    for packing in (False, True):
      c = config_lib.override(base, {"sampling.engine": engine, "rl.packing": packing, "rl.beta": 0.0,
                                     "rl.rollout_correction": "tis", "sampling.dtype": a.sampling_dtype})
      rows = gaps(c, a.seeds)
      print(f"engine={engine} packing={packing} sampling.dtype={a.sampling_dtype or 'model'}: "
            f"max|dlogp|={max(r[0] for r in rows):.3g} mean|dlogp|={np.mean([r[1] for r in rows]):.3g} "
            f"mismatch_kl={np.mean([r[2] for r in rows]):.3g} over {sum(r[3] for r in rows)} tokens, "
            f"{a.seeds} seeds", flush=True)


if __name__ == "__main__":
  main()
