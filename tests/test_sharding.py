"""One RL step on 8 simulated CPU devices with meshes (8,1,1), (2,2,2), (1,4,2) against the 1-device run (one
rollout chunk). (8,1,1) and (2,2,2) decode in the default (gathered) layout, (1,4,2) in tensor-parallel decode over 2
fsdp devices × tensor 2 (TP degree 4 over 2 KV heads: each repeated twice); (2,2,2) and (1,4,2) sample in 2 rollout
row chunks (rl.rollout_chunks) that share the one decode layout made before the chunk loop. Held-out generation
(evaluation.make_generate) decodes in the same layout, checked on the same meshes.

Runs in a subprocess: the device count is fixed when JAX starts.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests import script_parts

SCRIPT = textwrap.dedent(r"""
  import json, sys
  import jax, numpy as np
  from jax.sharding import PartitionSpec as P
  import flax.linen as nn
  from grpo_jax.rl import families
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import rl_step
  from grpo_jax.infra import sharding
  from grpo_jax.tasks import digits

  def run(mesh_shape, chunks, decode_tp):
    c = digits.bench_config(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=6)
    c.optim.lr = 1e-3
    c.rl.rollout_chunks = chunks
    if decode_tp:
      c.sampling.update(decode_layout="tp", decode_tp=decode_tp)
    devs = jax.devices()[:int(np.prod(mesh_shape))]
    c.mesh.update(data=mesh_shape[0], fsdp=mesh_shape[1], tensor=mesh_shape[2])
    mesh = sharding.make_mesh(c.mesh, devs)
    # the decode layout resolved before tracing, as every command does (rl/auto.py); the padded static path pinned
    from grpo_jax.rl import auto
    c.sampling.engine, c.rl.packing = "static", "off"
    c, _ = auto.resolve_here(c, mesh, log=False)
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
    # prompts of seed 2 with single-digit answers, which the random model sometimes samples (reward mean 0.25):
    # groups with reward variance, so the step's gradient is real (grad norm 0.65). Seed 1's full answers gave every
    # row reward 0, zero advantages and a gradient of rounding residue (8e-10) that AdamW amplifies differently on
    # each mesh: the params compared below were not a trained step's.
    batch = next(digits.make_batches(c.rl.prompts_per_step, 1, seed=2))
    batch["answer_ids_NxA"][:, 1:] = -1
    from grpo_jax.run.train import device_batch
    batch = device_batch(mesh, batch)
    # The per-device KV-cache buffers XLA actually allocates inside the compiled step.
    hlo = step.lower(state, batch).compile().as_text()
    dp, tp = mesh_shape[0] * mesh_shape[1], mesh_shape[2]
    # (the decode loop carries them: look in the signatures of the while ops). Tensor-parallel decode splits the
    # rows over data × fsdp / decode_tp and the KV heads (repeated up to the TP degree) over decode_tp × tensor.
    rows, heads = 16 // chunks // (dp // max(decode_tp, 1)), max(2 // (tp * max(decode_tp, 1)), 1)
    loops = [ln for ln in hlo.splitlines() if " while(" in ln]
    shard["cache_local"] = any(f"f32[{rows},{heads},8,16]" in ln for ln in loops)
    shard["cache_whole"] = any(f"f32[{16 // chunks},2,8,16]" in ln for ln in loops)
    # The decode loop's collectives per token, weights told apart from activations by shape.
    from grpo_jax.rollout import decode_layout
    from grpo_jax.rl import memory_plan
    from grpo_jax.perf import hlo_collectives
    sizes = dict(mesh.shape)
    layout, _ = memory_plan.choose_decode(c, sizes, decode_layout.device_memory_bytes())
    # (inside the decode loop: run decode_trips times per chunk; the once-per-chunk reshards into the view run `chunks`
    # times)
    from grpo_jax.rollout import sampling
    steps = sampling.decode_trips(c.sampling.max_new_tokens, sampling.SamplingConfig.from_config(
        c.sampling, eos_id=0, pad_id=0).exit_chunk) * chunks
    colls = hlo_collectives.collectives(hlo)
    loop = hlo_collectives.in_loop(colls, "rollout decode", min_count=steps)
    per_token = {}
    for cl in loop:
      per_token[cl.kind] = per_token.get(cl.kind, 0) + cl.count / steps
    shard["decode"] = dict(layout=str(layout), per_token=per_token,
                           # executions of the layout step's collectives: once per rollout, not once per chunk
                           layout_counts=sorted({cl.count for cl in colls if cl.phase == "decode layout"}),
                           budget=decode_layout.per_token_budget(mcfg, sizes, layout),
                           row_vector_gathers=sum(cl.count for cl in loop if cl.kind == "all-gather"
                                                  and len(cl.shapes[0][1]) == 1) / steps,
                           weights=[(cl.kind, cl.shapes) for cl in
                                    decode_layout.weight_collectives(loop, mcfg, sizes, layout)])
    # Held-out generation (evaluation.make_generate) decodes in the same layout, laid out once before its decode
    # loop: no weight collective in the decode program, the layout step's once; tokens as on one device. (Before the
    # step, which donates the params.) Its 4 prompt rows split over data*fsdp only where that divides them.
    if 4 % dp == 0:
      from grpo_jax.run import evaluation
      from grpo_jax.rollout import sampling
      tok = spec.ctx.tokenizer
      scfg = sampling.SamplingConfig.from_config(c.sampling, eos_id=tok.eos_id, pad_id=tok.pad_id)
      gen = evaluation.make_generate(mcfg, scfg, mesh, "digits", {}, in_graph=False, config=c)
      args = (state["params"], batch["prompt_NxP"], batch["prompt_mask_NxP"], {}, jax.random.PRNGKey(3))
      with sharding.mesh_context(mesh):
        compiled = gen.jitted.lower(*args).compile()
        eval_tokens = np.asarray(compiled(*args)[0]).tolist()
      ecolls = hlo_collectives.collectives(compiled.as_text())
      weights = lambda phase: len(decode_layout.weight_collectives(
          hlo_collectives.in_loop(ecolls, phase, min_count=1), mcfg, sizes, layout))
      shard["eval"] = dict(tokens=eval_tokens, decode=weights("rollout decode"), layout_step=weights("decode layout"),
                           layout_counts=sorted({cl.count for cl in ecolls if cl.phase == "decode layout"}))
    state, m = step(state, batch)
    m = jax.device_get(m)
    shard["samples"] = str(m["samples/tokens_NxL"].shape)
    return dict(shard=shard, tokens=np.asarray(m["samples/tokens_NxL"]).tolist(),
                entropy=float(m["train/entropy"]), grad_norm=float(m["train/grad_norm"]),
                reward=float(m["train/reward_mean"]),
                params=[np.asarray(x).ravel()[:64].tolist() for x in jax.tree.leaves(jax.device_get(state["params"]))])

  # The training log-prob path's LM-head chunks on 8 FSDP devices: the per-device [rows, chunk, V] logits buffers of
  # the compiled forward+backward. Head [D=256, V=4096] split over fsdp on D (the param layout), 8 rows of 64 targets,
  # chunks of 16: the head is larger than the chunk's activations, which is when the partitioner would rather
  # all-gather the rows and split the contraction than move the head.
  def head():
    import re
    import jax.numpy as jnp
    mesh = sharding.make_mesh(dict(data=1, fsdp=8, tensor=1), jax.devices())
    mcfg = model_lib.ModelConfig(vocab_size=4096, hidden=256, layers=1, heads=4, kv_heads=2, inter=64, max_len=64,
                                 tie_embeddings=False, dtype="float32")
    head_sharding = sharding.tree_shardings(mesh, model_lib.param_axes(mcfg))["lm_head"]["kernel"]
    h = jax.ShapeDtypeStruct((8, 64, 256), jnp.float32, sharding=sharding.batch_sharding(mesh, 3))
    w = jax.ShapeDtypeStruct((256, 4096), jnp.float32, sharding=head_sharding)
    targets = jax.ShapeDtypeStruct((8, 64), jnp.int32, sharding=sharding.batch_sharding(mesh, 2))
    loss = lambda h, w, t: model_lib.target_logprobs(mcfg, h, w, t, chunk=16)[0].sum()
    with sharding.mesh_context(mesh):
      text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(h, w, targets).compile().as_text()
    return dict(head_spec=str(head_sharding.spec),
                rows=sorted({int(r) for r in re.findall(r"f32\[(\d+),16,4096\]", text)}))

  # each case of argv ("shape:chunks:decode_tp", or "head") its own config, mesh, step and state, in this one process
  # (one JAX start-up for all), each result or its traceback under its own key: a failing case fails only its tests
  import traceback
  out = {}
  for case in sys.argv[1:]:
    try:
      if case == "head":
        out[case] = head()
      else:
        shape, chunks, decode_tp = case.split(":")
        out[case] = run(tuple(int(x) for x in shape.split(",")), int(chunks), int(decode_tp))
    except Exception:
      out[case] = dict(error=traceback.format_exc())
  print("JSON" + json.dumps(out))
""")

CASES = [("8,1,1", 1, 0), ("2,2,2", 2, 0), ("1,4,2", 2, 2)]


@pytest.fixture(scope="module")
def runs() -> dict:
  """SCRIPT's results for the 1-device reference, every case of CASES, keyed "shape:chunks:decode_tp", and the LM
  head's compile ("head"): one subprocess of 8 simulated devices runs them all, one after another (one JAX start-up
  instead of five; the reference's mesh is devices[:1], a one-device mesh as in a 1-device process)."""
  cases = [f"{shape}:{chunks}:{tp}" for shape, chunks, tp in [("1,1,1", 1, 0)] + CASES] + ["head"]
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, "-c", SCRIPT, *cases], capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  return json.loads(out.stdout.split("JSON", 1)[1])


@pytest.mark.parametrize("shape,chunks,decode_tp", CASES)
def test_sharded_step_matches_single_device(runs, shape, chunks, decode_tp):
  ref, r = script_parts.part(runs, "1,1,1:1:0"), script_parts.part(runs, f"{shape}:{chunks}:{decode_tp}")
  sh = r["shard"]
  # The reference shares the policy's layout; pure data parallelism replicates params; FSDP/tensor split them.
  assert sh["ref_q_kernel"] == sh["q_kernel"] == "(None, 'fsdp', 'tensor', None)"
  assert sh["gate_kernel"] == "(None, 'fsdp', 'tensor')"
  assert sh["q_replicated"] == (shape == "8,1,1")
  if shape == "1,4,2":
    # q kernel [layers=1, D=32, H=4, Dh=8]: D split 4 ways over fsdp, H split 2 ways over tensor.
    assert sh["q_shard_shape"] == [1, 8, 2, 8]
  # K cache (one buffer per layer) [N=16 (8 per chunk), K=2, Dh=8, S=16]: rows split over data*fsdp, kv heads over
  # 'tensor' (tp: rows over data*fsdp/2, the 4 repeated kv heads over 2*tensor), never whole.
  assert sh["cache_local"] and not sh["cache_whole"], sh
  # The weights were put into the decode layout once, before the loop: inside it no collective moves a weight, and
  # the activations' collectives stay within the layout's per-token budget (none without a tensor axis).
  d = r["shard"]["decode"]
  assert d["layout"] == ("tp=2" if decode_tp else "gathered") and d["weights"] == [], d
  assert (d["per_token"] == {}) == (shape == "8,1,1"), d
  assert d["layout_counts"] in ([], [1]), d
  if decode_tp:
    # XLA:CPU splits the sampler's per-row vectors (done flags, tokens) finer than the rows and gathers them back:
    # 1-D [rows] all-gathers beyond the budget; every other collective is within it.
    within = {k: n - d["row_vector_gathers"] * (k == "all-gather") for k, n in d["per_token"].items()}
    assert d["row_vector_gathers"] <= 3, d
  else:
    within = d["per_token"]
  assert all(n <= d["budget"].get(kind, 0) for kind, n in within.items()), d
  assert r["tokens"] == ref["tokens"]
  if shape != "8,1,1":
    # Evaluation's generate in the run's decode layout: the weights moved once by the layout step (XLA:CPU would
    # hoist the training layout's per-token gathers out of the loop, but they would still be the decode program's),
    # none by the decode program, and the 1-device tokens.
    e = sh["eval"]
    assert e["decode"] == 0 and e["layout_step"] > 0 and e["layout_counts"] == [1], e
    assert e["tokens"] == ref["shard"]["eval"]["tokens"] and len({tuple(t) for t in e["tokens"]}) > 1, e
  # (the first step's loss is exactly 0 on every mesh — ρ = 1 and advantages sum to 0 per group — so it cannot tell
  # meshes apart; the entropy of the training forward can)
  assert ref["entropy"] > 0.1 and abs(r["entropy"] - ref["entropy"]) < 1e-5
  # a real gradient (not rounding residue of a zero-advantage batch, which AdamW would amplify into moves no
  # tolerance can compare), so the params below are compared after a real update
  assert ref["grad_norm"] > 1e-3, ref["grad_norm"]
  assert abs(r["grad_norm"] - ref["grad_norm"]) < 1e-4 * max(1.0, ref["grad_norm"])
  # Params after one AdamW step of that real gradient within 2e-6 = 0.002·lr (measured 3.4e-8 to 6.0e-8 on the three
  # meshes, 2026-12-06). The bound was 2e-5 (with 1e-5 failing on another CPU: 1.18e-5) while the step's gradient was
  # rounding residue: Adam divides each gradient by its own scale, so residue that differs with the sum order of a
  # sharded reduction moved elements by visible fractions of lr; a real gradient leaves only rounding.
  for a, b in zip(r["params"], ref["params"]):
    assert max(abs(x - y) for x, y in zip(a, b)) < 2e-6


def test_lm_head_chunk_keeps_its_rows_split_in_training(runs):
  """model.target_logprobs scores each device's own rows against the gathered head: every [rows, chunk, V] logits
  buffer of the compiled training forward+backward holds 1 row per device, never all 8 (which the partitioner
  picks when left alone: the 7B step on 64 chips computed every row's logits on every chip, docs/scale.md). (SCRIPT's
  "head" case, in the module's one 8-device process.)"""
  r = script_parts.part(runs, "head")
  assert r["head_spec"] == "P('fsdp', 'tensor')", r  # the param layout: D split over fsdp
  assert r["rows"] == [1], r


def test_dispatch_bounded_waits_for_the_item_a_window_back(monkeypatch):
  """Item i is dispatched only after item i - window finished (XLA:CPU deadlocks past 32 collective programs in
  flight per device); every item once, in order, results in order."""
  import jax

  from grpo_jax.infra import sharding
  events = []
  monkeypatch.setattr(jax, "block_until_ready", lambda x: events.append(("wait", x)) or x)
  out = sharding.dispatch_bounded(lambda x: events.append(("run", x)) or x * 10, range(7), window=3)
  assert out == [0, 10, 20, 30, 40, 50, 60]
  assert events == [("run", 0), ("run", 1), ("run", 2), ("wait", 0), ("run", 3), ("wait", 10), ("run", 4),
                    ("wait", 20), ("run", 5), ("wait", 30), ("run", 6)]
