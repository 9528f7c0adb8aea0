"""One RL step on 8 simulated CPU devices with meshes (8,1,1), (2,2,2), (1,4,2) against the 1-device run; the
first two decode in the default (gathered) layout, (1,4,2) in tensor-parallel decode over 2 fsdp devices × tensor 2
(TP degree 4 over 2 KV heads: each repeated twice).

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

  def run(mesh_shape, decode_tp):
    c = digits.bench_config(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=6)
    c.optim.lr = 1e-3
    if decode_tp:
      c.sampling.update(decode_layout="tp", decode_tp=decode_tp)
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
    # (the decode loop carries them: look in the signatures of the while ops). Tensor-parallel decode splits the
    # rows over data × fsdp / decode_tp and the KV heads (repeated up to the TP degree) over decode_tp × tensor.
    rows, heads = 16 // (dp // max(decode_tp, 1)), max(2 // (tp * max(decode_tp, 1)), 1)
    loops = [ln for ln in hlo.splitlines() if " while(" in ln]
    shard["cache_local"] = any(f"f32[{rows},{heads},8,16]" in ln for ln in loops)
    shard["cache_whole"] = any("f32[16,2,8,16]" in ln for ln in loops)
    # The decode loop's collectives per token, weights told apart from activations by shape.
    from grpo_jax import decode_layout, hlo_collectives
    sizes = dict(mesh.shape)
    layout, _ = decode_layout.choose(c, sizes, decode_layout.device_memory_bytes())
    loop = hlo_collectives.in_loop(hlo_collectives.collectives(hlo), "rollout decode")
    per_token = {}
    for cl in loop:
      per_token[cl.kind] = per_token.get(cl.kind, 0) + cl.count / (c.sampling.max_new_tokens - 1)
    shard["decode"] = dict(layout=str(layout), per_token=per_token,
                           budget=decode_layout.per_token_budget(mcfg, sizes, layout),
                           row_vector_gathers=sum(cl.count for cl in loop if cl.kind == "all-gather"
                                                  and len(cl.shapes[0][1]) == 1) / (c.sampling.max_new_tokens - 1),
                           weights=[(cl.kind, cl.shapes) for cl in
                                    decode_layout.weight_collectives(loop, mcfg, sizes, layout)])
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


def _run(shape: str, decode_tp: int = 0) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, "-c", SCRIPT, shape, str(decode_tp)], capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  return json.loads(out.stdout.split("JSON", 1)[1])


@pytest.fixture(scope="module")
def single_device():
  return _run("1,1,1")


@pytest.mark.parametrize("shape", ["8,1,1", "2,2,2", "1,4,2"])
def test_sharded_step_matches_single_device(single_device, shape):
  decode_tp = 2 if shape == "1,4,2" else 0
  ref, r = single_device, _run(shape, decode_tp)
  sh = r["shard"]
  # The reference shares the policy's layout; pure data parallelism replicates params; FSDP/tensor split them.
  assert sh["ref_q_kernel"] == sh["q_kernel"] == "(None, 'fsdp', 'tensor', None)"
  assert sh["gate_kernel"] == "(None, 'fsdp', 'tensor')"
  assert sh["q_replicated"] == (shape == "8,1,1")
  if shape == "1,4,2":
    # q kernel [layers=1, D=32, H=4, Dh=8]: D split 4 ways over fsdp, H split 2 ways over tensor.
    assert sh["q_shard_shape"] == [1, 8, 2, 8]
  # K cache (one buffer per layer) [N=16, K=2, Dh=8, S=16]: rows split over data*fsdp, kv heads over 'tensor'
  # (tp: rows over data*fsdp/2, the 4 repeated kv heads over 2*tensor), never whole.
  assert sh["cache_local"] and not sh["cache_whole"], sh
  # The weights were put into the decode layout once, before the loop: inside it no collective moves a weight, and
  # the activations' collectives stay within the layout's per-token budget (none without a tensor axis).
  d = r["shard"]["decode"]
  assert d["layout"] == ("tp=2" if decode_tp else "gathered") and d["weights"] == [], d
  assert (d["per_token"] == {}) == (shape == "8,1,1"), d
  if decode_tp:
    # XLA:CPU splits the sampler's per-row vectors (done flags, tokens) finer than the rows and gathers them back:
    # 1-D [rows] all-gathers beyond the budget; every other collective is within it.
    within = {k: n - d["row_vector_gathers"] * (k == "all-gather") for k, n in d["per_token"].items()}
    assert d["row_vector_gathers"] <= 3, d
  else:
    within = d["per_token"]
  assert all(n <= d["budget"].get(kind, 0) for kind, n in within.items()), d
  assert r["tokens"] == ref["tokens"]
  # (the first step's loss is exactly 0 on every mesh — ρ = 1 and advantages sum to 0 per group — so it cannot tell
  # meshes apart; the entropy of the training forward can)
  assert ref["entropy"] > 0.1 and abs(r["entropy"] - ref["entropy"]) < 1e-5
  assert abs(r["grad_norm"] - ref["grad_norm"]) < 1e-4 * max(1.0, ref["grad_norm"])
  for a, b in zip(r["params"], ref["params"]):
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
