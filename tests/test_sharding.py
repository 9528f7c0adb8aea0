"""One RL step on 8 simulated CPU devices with meshes (8,1,1), (2,2,2), (1,4,2) against the 1-device run.

Runs in a subprocess: the device count is fixed when JAX starts.
"""
import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(r"""
  import json, sys
  import jax, numpy as np
  from jax.sharding import PartitionSpec as P
  import flax.linen as nn
  from grpo_jax import model as model_lib, peer_workload, rl_step, sampling, sharding, state as state_lib

  def run(mesh_shape):
    c = peer_workload.bench_config(hidden=32, layers=2, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=8)
    c.optim.lr = 1e-3
    devs = jax.devices()[:int(np.prod(mesh_shape))]
    c.mesh.update(data=mesh_shape[0], fsdp=mesh_shape[1], tensor=mesh_shape[2])
    mesh = sharding.make_mesh(c.mesh, devs)
    mcfg = model_lib.ModelConfig.from_config(c.model)
    tx = state_lib.make_optimizer(c.optim, 10)
    spec = peer_workload.reward_spec(c.model.vocab_size)
    step = rl_step.make_rl_step(c, mesh, mcfg, tx, spec, spec.ctx.tokenizer)
    state = state_lib.create_state(mesh, mcfg, tx, seed=0)
    shard = {
      "q_kernel": str(state["params"]["layers"]["q"]["kernel"].sharding.spec),
      "gate_kernel": str(state["params"]["layers"]["gate"]["kernel"].sharding.spec),
      "ref_q_kernel": str(state["ref_params"]["layers"]["q"]["kernel"].sharding.spec),
      "embed": str(state["params"]["embed"]["embedding"].sharding.spec),
    }
    batch = next(peer_workload.make_batches(c.rl.prompts_per_step, 1, seed=1))
    from grpo_jax.train import device_batch
    batch = device_batch(mesh, batch)
    # The rollout's KV cache and tokens as the sampler lays them out under this mesh.
    with mesh, nn.logical_axis_rules(sharding.LOGICAL_RULES):
      prompt = jax.numpy.repeat(batch["prompt_NxP"], 4, axis=0)
      pmask = jax.numpy.repeat(batch["prompt_mask_NxP"], 4, axis=0)
      def prefill(params, prompt, pmask):
        cache = model_lib.init_cache(mcfg, prompt.shape[0], 24)
        cache = jax.tree.map(lambda x, a: nn.with_logical_constraint(x, tuple(a)), cache, model_lib.cache_axes())
        pos = jax.numpy.maximum(jax.numpy.cumsum(pmask, 1) - 1, 0)
        return model_lib.prefill(mcfg, params, prompt, pos, pmask, cache)[1]
      cache = jax.jit(prefill)(state["params"], prompt, pmask)
      shard["cache_k"] = str(cache["k"].sharding.spec)
    state, m = step(state, batch)
    m = jax.device_get(m)
    shard["samples"] = str(m["samples/tokens_NxL"].shape)
    return dict(shard=shard, tokens=np.asarray(m["samples/tokens_NxL"]).tolist(),
                loss=float(m["train/loss"]), grad_norm=float(m["train/grad_norm"]),
                reward=float(m["train/reward_mean"]),
                params=[np.asarray(x).ravel()[:64].tolist() for x in jax.tree.leaves(jax.device_get(state["params"]))])

  out = {str(s): run(s) for s in [(1, 1, 1), (8, 1, 1), (2, 2, 2), (1, 4, 2)]}
  print("JSON" + json.dumps(out))
""")


def test_sharded_step_matches_single_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-4000:]
  res = json.loads(out.stdout.split("JSON", 1)[1])
  ref = res["(1, 1, 1)"]
  # Params: embed dim over fsdp, heads / mlp over tensor; the reference shares the policy's layout.
  assert res["(2, 2, 2)"]["shard"]["q_kernel"] == "PartitionSpec(None, 'fsdp', 'tensor', None)"
  assert res["(2, 2, 2)"]["shard"]["gate_kernel"] == "PartitionSpec(None, 'fsdp', 'tensor')"
  assert res["(1, 4, 2)"]["shard"]["ref_q_kernel"] == res["(1, 4, 2)"]["shard"]["q_kernel"]
  assert res["(8, 1, 1)"]["shard"]["q_kernel"] == "PartitionSpec(None, None, None, None)"
  for name in ("(8, 1, 1)", "(2, 2, 2)", "(1, 4, 2)"):
    r = res[name]
    # The KV cache rows are split over the data axes, kv heads over 'tensor'.
    assert r["shard"]["cache_k"].startswith("PartitionSpec(None, ('data', 'fsdp'), 'tensor'"), r["shard"]
    assert r["tokens"] == ref["tokens"], name
    assert abs(r["loss"] - ref["loss"]) < 1e-5, name
    assert abs(r["grad_norm"] - ref["grad_norm"]) < 1e-4 * max(1.0, ref["grad_norm"]), name
    for a, b in zip(r["params"], ref["params"]):
      assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, name
