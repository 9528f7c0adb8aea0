"""The TPU compile tool: analytic FLOPs and roofline by hand, and one real TPU compile in a subprocess (libtpu)."""
import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest

from grpo_jax import aot
from grpo_jax import memory_plan
from grpo_jax import model as model_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny(**kw):
  return memory_plan.workload_config("tiny", prompts=2, G=4, prompt_len=16, L=48, **kw)


def test_matmul_params_match_the_param_tree():
  # Independent count: every kernel in the initialised tree, plus the tied head (the embedding used as D×V).
  for name in ("tiny", "small"):
    mcfg = model_lib.ModelConfig.from_config(memory_plan.workload_config(name).model)
    abstract = jax.eval_shape(lambda: model_lib.init_params(mcfg, jax.random.PRNGKey(0)))
    kernels = sum(x.size for p, x in jax.tree_util.tree_flatten_with_path(abstract)[0]
                  if "kernel" in jax.tree_util.keystr(p))
    assert aot.matmul_params(mcfg) == kernels + mcfg.hidden * mcfg.vocab_size


def test_analytic_flops_by_hand():
  c = _tiny(dtype="float32", remat="none")
  f = aot.analytic_flops(c, plat="cpu")  # T = 64 < 384 on the CPU: the einsum path, all T×T pairs
  pm = aot.matmul_params(model_lib.ModelConfig.from_config(c.model))
  N, P, L, T = 8, 16, 48, 64
  attn = 4 * 2 * 4 * 16  # 4 · layers · heads · head_dim per (query, key) pair
  assert f["rollout prefill"] == 2 * pm * N * P + attn * N * P * P
  assert f["rollout decode"] == 2 * pm * N * L + attn * N * L * T
  assert f["reference forward"] == 2 * pm * N * T + attn * N * T * T
  assert f["policy fwd+bwd"] == 3 * f["reference forward"]
  assert set(f) == {"rollout prefill", "rollout decode", "reference forward", "policy fwd+bwd"}
  g = aot.analytic_flops(_tiny(dtype="bfloat16", remat="full"), plat="cpu")
  assert g["old log-probs forward"] == g["remat recompute"] == f["reference forward"]
  # TPU (splash): T is padded to one 128 tile, computed whole (the diagonal block).
  t = aot.analytic_flops(c)
  assert t["reference forward"] == 2 * pm * N * T + attn * N * 128 * 128
  assert t["rollout prefill"] == 2 * pm * N * P + attn * N * 128 * 128
  # Long context on the CPU (blockwise, 128 blocks): T = 4096 is 32 blocks, of which 32·33/2 are on or below the
  # diagonal; splash on TPU takes 512 tiles: 8·9/2 of 8·8.
  lc = memory_plan.workload_config("tiny", prompts=2, G=4, prompt_len=16, L=4080, dtype="float32", remat="none")
  assert aot.analytic_flops(lc, plat="cpu")["reference forward"] == 2 * pm * N * 4096 + attn * N * 528 * 128 * 128
  assert aot.analytic_flops(lc)["reference forward"] == 2 * pm * N * 4096 + attn * N * 36 * 512 * 512
  # β = 0: no reference model, no reference forward.
  assert "reference forward" not in aot.analytic_flops(_tiny(algo="dr_grpo"))


def test_roofline_by_hand():
  c = _tiny(dtype="bfloat16", remat="none")
  chip = aot.Chip(hbm_gib=16, bf16_tflops=100, hbm_gbs=1)  # 1 GB/s: decode is HBM-bound
  mesh = dict(data=1, fsdp=4, tensor=1)
  r = aot.roofline(c, mesh, chip)
  assert r["seconds"]["policy fwd+bwd"] == pytest.approx(r["flops"]["policy fwd+bwd"] / (4 * 100e12))
  mcfg = model_lib.ModelConfig.from_config(c.model)
  weights = aot.matmul_params(mcfg) * 2
  kv = 2 * 2 * (8 / 4) * 2 * 16 * 64 * 2  # 2 · layers · rows/device · kv heads · head_dim · slots · bf16
  assert r["decode_hbm_seconds"] == pytest.approx(48 * (weights + kv) / 1e9)
  assert r["seconds"]["rollout decode"] == r["decode_hbm_seconds"]
  assert r["step_seconds"] == pytest.approx(sum(r["seconds"].values()))


def test_chip_table_and_bad_topology():
  assert aot.chip_of("v5e:4x4") == aot.Chip(16, 197, 819)
  assert aot.chip_of("v5p:2x2x2").hbm_gib == 95
  assert aot.chip_of("v6e:2x2").bf16_tflops == 918
  with pytest.raises(ValueError, match="--topology='v9:2x2'"):
    aot.chip_of("v9:2x2")


def test_abstract_batch_shards_rows_when_they_divide():
  mesh = jax.sharding.Mesh([[[jax.devices()[0]]]], ("data", "fsdp", "tensor"))
  b = aot.abstract_batch(_tiny(), mesh)
  assert b["prompt_NxP"].shape == (2, 16) and b["answer_ids_NxA"].shape == (2, 4)
  assert b["prompt_NxP"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)


def test_cli_without_compile(capsys):
  assert aot.main(["--model=qwen2.5-7b", "--topology=v5p:4x4x4", "--no-compile", "--json"]) == 0
  r = json.loads(capsys.readouterr().out)
  assert r["n_devices"] == 64 and r["mesh"] == dict(data=1, fsdp=64, tensor=1)
  assert r["params"] == 7_615_616_512 and r["plan"]["fits"] is True and "memory" not in r
  # Decode dominates a 512-token rollout: it is HBM-bound (every chip reads all bf16 weights per token).
  assert r["roofline"]["seconds"]["rollout decode"] == r["roofline"]["decode_hbm_seconds"]
  assert r["roofline"]["decode_hbm_seconds"] > r["roofline"]["seconds"]["policy fwd+bwd"]
  assert aot.main(["--topology=v5e:4xq", "--no-compile"]) == 2
  assert "GEN:AxB" in capsys.readouterr().err
  assert aot.main(["--topology=v5e:4x4", "--mesh", "data=3,fsdp=-1", "--no-compile"]) == 2
  assert "config.mesh" in capsys.readouterr().err


NEEDS_LIBTPU = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not importable: pip install libtpu==0.0.42.1 (the version jax "
                                  "0.10.2 pins)")


@NEEDS_LIBTPU
def test_tpu_compile_report_in_subprocess():
  # libtpu allows one process at a time: its users are this module's tests (one xdist worker under --dist
  # loadscope), each in its own process.
  cmd = [sys.executable, "-m", "grpo_jax.aot", "--model=small", "--topology=v5e:2x2", "--prompts=2", "--G=4",
         "--prompt-len=128", "--L=128", "--json"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  r = json.loads(out.stdout.strip().splitlines()[-1])
  assert r["n_devices"] == 4 and r["device_kind"] == "TPU v5 lite"
  assert r["mesh"] == dict(data=1, fsdp=4, tensor=1)
  m = r["memory"]
  assert m["hbm_bytes"] == 16 * 2 ** 30 and m["fits"] is True and 0.9 < m["headroom_frac"] < 1
  assert m["total_bytes"] == (m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"] + m["temp_bytes"]
                              + m["generated_code_bytes"])
  # The state is donated: its outputs alias its inputs.
  assert m["alias_bytes"] > 0.9 * m["argument_bytes"]
  # Arguments are the sharded state: policy + reference + Adam (4 fp32 copies) / 4 devices, padded to TPU tiles.
  cfg = memory_plan.workload_config("small", prompts=2, G=4, prompt_len=128, L=128)
  p = memory_plan.plan(cfg, r["mesh"])
  assert p.resident_bytes <= m["argument_bytes"] < 1.1 * p.resident_bytes
  # Measured 1.16 here (2026-11-29): the planner models XLA:CPU's buffers (within 15%, test_memory_plan); the TPU
  # compiler fuses the attention and logits temporaries tighter, so its temp is smaller for this toy.
  assert 0.8 < r["plan"]["vs_xla"] < 1.3, r
  # XLA counts each scan body once (128 decode steps, 2 layers), so it reports fewer FLOPs than the analytic count
  # (1.3× here; 18× for the 0.5B step in docs/scale.md, where the scans are longer).
  assert 0 < r["xla_cost_flops_per_device"] * r["n_devices"] < r["roofline"]["total_flops"]
  assert r["roofline"]["step_seconds"] > 0


# Lowers the model's training forward+backward for a v5e:2x2 slice (4 chips, FSDP) with model.attention=auto and
# =xla; prints the splash kernel names found in each lowering's custom calls.
_SPLASH_LOWERING = """
import json, re, jax, jax.numpy as jnp
from jax.experimental import topologies
from grpo_jax import model as M, sharding
devices = list(topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices)
mesh = sharding.make_mesh(dict(data=1, fsdp=-1, tensor=1), devices)
out = {}
for attention in ("auto", "xla"):
  mcfg = M.ModelConfig(vocab_size=512, hidden=256, layers=2, heads=4, kv_heads=2, inter=512, max_len=256,
                       dtype="bfloat16", remat="full", attention=attention)
  abstract = jax.eval_shape(lambda: M.init_params(mcfg, jax.random.PRNGKey(0)))
  shardings = sharding.tree_shardings(mesh, M.param_axes(mcfg))
  params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  ids = jax.ShapeDtypeStruct((8, 200), jnp.int32, sharding=sharding.batch_sharding(mesh, 2))
  loss = lambda p, t, pos, m: (M.token_logprobs(mcfg, p, t, pos, m)[0] * m).sum()
  with sharding.mesh_context(mesh):
    text = jax.jit(jax.grad(loss)).lower(params, ids, ids, ids).as_text()
  calls = [l for l in text.splitlines() if "tpu_custom_call" in l]
  out[attention] = sorted({n for l in calls for n in re.findall(r"splash_mha_[a-z_]+", l)} | {"calls=%d" % len(calls)})
print(json.dumps(out))
"""


@NEEDS_LIBTPU
def test_tpu_lowering_of_training_contains_the_splash_kernels():
  """On a TPU target, model.attention=auto lowers the training forward+backward to splash's Pallas kernels (forward,
  dq and dkv, with segment ids for the padding) inside shard_map; the einsum path has no kernel call."""
  out = subprocess.run([sys.executable, "-c", _SPLASH_LOWERING], cwd=REPO, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  r = json.loads(out.stdout.strip().splitlines()[-1])
  kernels = {"splash_mha_fwd_segmented_residuals", "splash_mha_dq_segmented_no_residuals",
             "splash_mha_dkv_segmented_no_residuals"}
  assert kernels <= set(r["auto"]), r
  assert r["xla"] == ["calls=0"], r
