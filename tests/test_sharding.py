"""One RL step on 8 simulated CPU devices with meshes (8,1,1), (2,2,2), (1,4,2) against the 1-device run; the (2,2,2)
run samples in 2 rollout row chunks (rl.rollout_chunks), the 1-device run in one.

Runs in a subprocess: the device count is fixed when JAX starts.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(r"""
  import json, sys
  import jax, numpy as np
  from jax.sharding import PartitionSpec as P
  import flax.linen as nn
  from grpo_jax import families, model as model_lib, rl_step, sharding
  from grpo_jax.tasks import digits

  def run(mesh_shape, chunks):
    c = digits.bench_config(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=6)
    c.optim.lr = 1e-3
    c.rl.rollout_chunks = chunks
    devs = jax.devices()[:int(np.prod(mesh_shape))]
    c.mesh.update(data=mesh_shape[0], fsdp=mesh_shape[1], tensor=mesh_shape[2])
    mesh = sharding.make_mesh(c.mesh, devs)
    mcfg = model_lib.ModelConfig.from_config(c.model)
    spec = digits.reward_spec(c.model.vocab_size)
    step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
    state = rl_step.init(c, mesh, mcfg, seed=0)
    shard = {
      "q_kernel": repr(tuple(state["params"]["layers"]["q"]["kernel"].sharding.spec)),
      "gate_kernel": repr(tuple(state["params"]["layers"]["gate"]["kernel"].sharding.spec)),
      "ref_q_kernel": repr(tuple(state["ref_params"]["layers"]["q"]["kernel"].sharding.spec)),
      "embed": repr(tuple(state["params"]["embed"]["embedding"].sharding.spec)),
    "q_replicated": state["params"]["layers"]["q"]["kernel"].sharding.is_fully_replicated,
    "q_shard_shape": list(state["params"]["layers"]["q"]["kernel"].addressable_shards[0].data.shape),
    }
    batch = next(digits.make_batches(c.rl.prompts_per_step, 1, seed=1))
    from grpo_jax.train import device_batch
    batch = device_batch(mesh, batch)
    # The per-device KV-cache buffers XLA actually allocates inside the compiled step.
    hlo = step.lower(state, batch).compile().as_text()
    dp, tp = mesh_shape[0] * mesh_shape[1], mesh_shape[2]
    # (the decode loop carries them: look in the signatures of the while ops)
    loops = [ln for ln in hlo.splitlines() if " while(" in ln]
    shard["cache_local"] = any(f"f32[{16 // chunks // dp},{2 // tp},8,16]" in ln for ln in loops)
    shard["cache_whole"] = any(f"f32[{16 // chunks},2,8,16]" in ln for ln in loops)
    state, m = step(state, batch)
    m = jax.device_get(m)
    shard["samples"] = str(m["samples/tokens_NxL"].shape)
    return dict(shard=shard, tokens=np.asarray(m["samples/tokens_NxL"]).tolist(),
                entropy=float(m["train/entropy"]), grad_norm=float(m["train/grad_norm"]),
                reward=float(m["train/reward_mean"]),
                params=[np.asarray(x).ravel()[:64].tolist() for x in jax.tree.leaves(jax.device_get(state["params"]))])

  shape = tuple(int(x) for x in sys.argv[1].split(","))
  print("JSON" + json.dumps(run(shape, int(sys.argv[2]))))
""")


def _run(shape: str, chunks: int = 1) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, "-c", SCRIPT, shape, str(chunks)], capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  return json.loads(out.stdout.split("JSON", 1)[1])


@pytest.fixture(scope="module")
def single_device():
  return _run("1,1,1")


@pytest.mark.parametrize("shape,chunks", [("8,1,1", 1), ("2,2,2", 2), ("1,4,2", 1)])
def test_sharded_step_matches_single_device(single_device, shape, chunks):
  ref, r = single_device, _run(shape, chunks)
  sh = r["shard"]
  # The reference shares the policy's layout; pure data parallelism replicates params; FSDP/tensor split them.
  assert sh["ref_q_kernel"] == sh["q_kernel"] == "(None, 'fsdp', 'tensor', None)"
  assert sh["gate_kernel"] == "(None, 'fsdp', 'tensor')"
  assert sh["q_replicated"] == (shape == "8,1,1")
  if shape == "1,4,2":
    # q kernel [layers=1, D=32, H=4, Dh=8]: D split 4 ways over fsdp, H split 2 ways over tensor.
    assert sh["q_shard_shape"] == [1, 8, 2, 8]
  # K cache (one buffer per layer) [N=16 (8 per chunk), K=2, Dh=8, S=16]: rows split over data*fsdp, kv heads over
  # 'tensor', never whole.
  assert sh["cache_local"] and not sh["cache_whole"], sh
  assert r["tokens"] == ref["tokens"]
  # (the first step's loss is exactly 0 on every mesh — ρ = 1 and advantages sum to 0 per group — so it cannot tell
  # meshes apart; the entropy of the training forward can)
  assert ref["entropy"] > 0.1 and abs(r["entropy"] - ref["entropy"]) < 1e-5
  assert abs(r["grad_norm"] - ref["grad_norm"]) < 1e-4 * max(1.0, ref["grad_norm"])
  for a, b in zip(r["params"], ref["params"]):
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
