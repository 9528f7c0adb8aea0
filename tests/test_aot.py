"""The TPU compile tool: analytic FLOPs and roofline by hand, and one real TPU compile in a subprocess (libtpu)."""
import json
import os
import subprocess
import sys

import jax
import pytest

import conftest  # tests/conftest.py: requires
from tests import script_parts

from grpo_jax.perf import aot
from grpo_jax.rollout import decode_layout
from grpo_jax.perf import hlo_collectives
from grpo_jax.rl import memory_plan
from grpo_jax.model import model as model_lib
from grpo_jax.perf import roofline as roofline_lib

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
  chip = aot.Chip(hbm_gib=16, bf16_tflops=100, hbm_gbs=1)  # 1 GB/s: every phase is HBM-bound
  mesh = dict(data=1, fsdp=4, tensor=1)
  r = aot.roofline(c, mesh, chip)
  assert r["compute_seconds"]["policy fwd+bwd"] == pytest.approx(r["flops"]["policy fwd+bwd"] / (4 * 100e12))
  mcfg = model_lib.ModelConfig.from_config(c.model)
  weights = aot.matmul_params(mcfg) * 2
  kv = 2 * 2 * (8 / 4) * 2 * 16 * 64 * 2  # 2 · layers · rows/device · kv heads · head_dim · slots · bf16
  assert r["decode_hbm_seconds"] == pytest.approx(48 * (weights + kv) / 1e9)
  # The update reads the bf16 weights 3 times (forward, backward's two matmuls) and 7 fp32 shards (optimizer).
  shard = 4 * aot.matmul_params(mcfg) / 4
  assert r["hbm_seconds"]["policy fwd+bwd"] == pytest.approx((3 * weights + 7 * shard) / 1e9)
  assert r["ici_seconds"]["rollout decode"] == 0 and r["ici"] == {}  # no compiled program: ICI not modelled
  for k, sec in r["seconds"].items():
    assert sec == max(r["compute_seconds"][k], r["hbm_seconds"][k], r["ici_seconds"][k])
  assert r["step_seconds"] == pytest.approx(sum(r["seconds"].values()))
  # An ICI term from a compiled program's collectives bounds its phase when it is the largest.
  ici = {"rollout decode": dict(seconds=1e3, collectives=10, bytes=1.0)}
  assert aot.roofline(c, mesh, chip, ici=ici)["seconds"]["rollout decode"] == 1e3


def test_roofline_lora_takes_no_base_weight_gradient_by_hand():
  """LoRA (rank 4 on all seven projections): the frozen base's backward computes input gradients only, so the
  policy's matmuls cost 2 forwards (XLA's cost analysis of a LoRA model's forward and adapter gradient on the CPU:
  1.93x its forward), its attention still 3; the optimizer reads and writes the adapters' fp32 shard, not the
  base's. tiny's adapters per layer: q 64·4 + 4·64, k and v 64·4 + 4·32, o 64·4 + 4·64, gate and up 64·4 + 4·128,
  down 128·4 + 4·64 = 4,096; 2 layers = 8,192."""
  full, lo = _tiny(dtype="float32", remat="none"), _tiny(dtype="float32", remat="none", lora_rank=4)
  ff, fl = aot.analytic_flops(full, plat="cpu"), aot.analytic_flops(lo, plat="cpu")
  pm = aot.matmul_params(model_lib.ModelConfig.from_config(full.model))
  assert fl["policy fwd+bwd"] == ff["policy fwd+bwd"] - 2 * pm * 8 * 64
  assert {k: v for k, v in fl.items() if k != "policy fwd+bwd"} == {k: v for k, v in ff.items() if k != "policy fwd+bwd"}
  mesh = dict(data=1, fsdp=4, tensor=1)
  weights = pm * 4  # fp32 compute
  assert roofline_lib.hbm_bytes(lo, mesh)["policy fwd+bwd"] == 2 * weights + 7 * 4 * 8192 / 4
  assert roofline_lib.hbm_bytes(full, mesh)["policy fwd+bwd"] == 3 * weights + 7 * 4 * pm / 4


def test_roofline_carry_kv_recompute_by_hand():
  """rl.carry_kv=recompute: every step one forward of the layers (no LM head) over all S slots' P + L positions,
  carry._recompute_slots' static shape (tiny: 2 layers of 64·(4 + 2·2)·16 + 4·16·64 + 3·64·128 = 36,864 weights;
  4·2·4·16 = 512 FLOPs per attention pair, the CPU's einsum path: all 64×64). HBM per chip: the layer weights
  once (fp32) and K, V of its slots' 64 positions (2·2 layers·2 KV heads·16·4 bytes = 512 per position). 'keep'
  has no such phase and the others are the same."""
  keep, rec = _tiny_carry("keep"), _tiny_carry("recompute")
  fk, fr = aot.analytic_flops(keep, plat="cpu"), aot.analytic_flops(rec, plat="cpu")
  assert fr.pop("carry KV recompute") == 2 * 73728 * 8 * 64 + 512 * 8 * 64 * 64 == 92_274_688  # S = N = 8 slots
  assert fr == fk
  assert aot.analytic_flops(_tiny_carry("recompute", slots=4), plat="cpu")["carry KV recompute"] == 92_274_688 // 2
  mesh = dict(data=1, fsdp=2, tensor=1)
  hk, hr = roofline_lib.hbm_bytes(keep, mesh), roofline_lib.hbm_bytes(rec, mesh)
  assert hr.pop("carry KV recompute") == 73728 * 4 + 512 * 4 * 64 == 425_984  # 4 of the 8 slots on each chip
  assert hr == hk
  r = aot.roofline(rec, mesh, aot.Chip(hbm_gib=16, bf16_tflops=100, hbm_gbs=1))
  assert r["seconds"]["carry KV recompute"] == pytest.approx(425_984 / 1e9)  # HBM-bound at 1 GB/s
  assert r["step_seconds"] == pytest.approx(aot.roofline(keep, mesh, aot.Chip(16, 100, 1))["step_seconds"]
                                            + 425_984 / 1e9)


def test_roofline_prefill_rows_without_stated_lengths():
  """With no completion lengths stated (every row to L), the continuous engine still prefills each of the B prompts
  once and the carry its table of (1 + max_staleness)·B prompts, as with lengths stated; it counted every one of the
  N = B·G rows (G× the continuous engine's prefill FLOPs and KV writes)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  cont = _tiny(dtype="float32", remat="none", engine="continuous")  # 2 prompts × G 4
  assert roofline_lib.decode_work(cont)["prefill_rows"] == roofline_lib.decode_work(cont, np.full(8, 48))[
      "prefill_rows"] == 2
  assert roofline_lib.decode_work(_tiny(dtype="float32", remat="none"))["prefill_rows"] == 8  # static: every row
  assert roofline_lib.decode_work(_tiny_carry("keep"))["prefill_rows"] == 4  # max_staleness 1: 2 × 2 prompts
  pm, attn = aot.matmul_params(model_lib.ModelConfig.from_config(cont.model)), 4 * 2 * 4 * 16
  assert aot.analytic_flops(cont, plat="cpu")["rollout prefill"] == 2 * pm * 2 * 16 + attn * 2 * 16 * 16


def _tiny_carry(kv: str, slots: int = 0):
  c = memory_plan.workload_config("tiny", prompts=2, G=4, prompt_len=16, L=48, dtype="float32", remat="none",
                                  engine="continuous", slots=slots, partial_rollouts=True,
                                  mesh=dict(data=1, fsdp=2, tensor=1))
  c.rl.carry_kv = kv
  return c


# A hand-written optimised HLO module: a while loop (counter 2 → 7: 5 trips) whose body all-gathers [4,32] → [16,32]
# f32 over 4 devices as an async -start/-done pair, and an all-reduce of f32[4,32] over pairs in the entry.
_HLO = """HloModule jit_step, entry_computation_layout={(f32[4,32]{1,0})->f32[4,32]{1,0}}, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body.1 (p: (s32[], f32[4,32])) -> (s32[], f32[4,32]) {
  %p = (s32[], f32[4,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4,32]{1,0} get-tuple-element(%p), index=1
  %ags = (f32[4,32]{1,0}, f32[16,32]{1,0}) all-gather-start(%x), channel_id=1, replica_groups=[1,4]<=[4],
    dimensions={0}, metadata={op_name="jit(step)/decode/while/body/Block/q/dot_general"}
  %agd = f32[16,32]{1,0} all-gather-done(%ags)
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4,32]{1,0}) tuple(%i1, %x)
}

%cond.1 (p: (s32[], f32[4,32])) -> pred[] {
  %p = (s32[], f32[4,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main.9 (a: f32[4,32]) -> f32[4,32] {
  %a = f32[4,32]{1,0} parameter(0)
  %z = s32[] constant(2)
  %init = (s32[], f32[4,32]{1,0}) tuple(%z, %a)
  %w = (s32[], f32[4,32]{1,0}) while(%init), condition=%cond.1, body=%body.1, metadata={op_name="jit(step)/decode/while"}
  %ar = f32[4,32]{1,0} all-reduce(%a), channel_id=2, replica_groups={{0,1},{2,3}}, to_apply=%add, metadata={op_name="jit(step)/update/transpose"}
  ROOT %cp = f32[4,32]{1,0} collective-permute(%ar), channel_id=3, source_target_pairs={{0,1},{1,0}}
}
"""


def test_hlo_collectives_count_loops_async_pairs_and_groups():
  colls = {c.kind: c for c in hlo_collectives.collectives(_HLO)}
  assert set(colls) == {"all-gather", "all-reduce", "collective-permute"}
  # no replica_groups: every device of the program (num_partitions); no JAX op: phase "other"
  cp = colls["collective-permute"]
  assert (cp.groups, cp.moved_bytes, cp.phase) == (((0, 1, 2, 3),), 4 * 32 * 4, "other")
  ag, ar = colls["all-gather"], colls["all-reduce"]
  # counted once per trip (the -start/-done pair once), sized by the gathered result
  assert (ag.count, ag.result_bytes, ag.groups, ag.phase) == (5, 16 * 32 * 4, ((0, 1, 2, 3),), "rollout decode")
  assert ag.moved_bytes == 16 * 32 * 4 * 3 / 4  # a ring all-gather sends (n-1)/n of the result
  assert (ar.count, ar.groups, ar.phase) == (1, ((0, 1), (2, 3)), "update")
  assert ar.moved_bytes == 2 * 4 * 32 * 4 / 2  # reduce-scatter + all-gather
  assert hlo_collectives.in_loop(colls.values(), "rollout decode") == [ag]
  # per iteration of its outermost loop (what a loop with a data-dependent trip count costs per step)
  assert (ag.loop, ag.per_iteration, ar.loop, ar.per_iteration) == ("body.1", 1, "", 0)
  assert hlo_collectives.per_iteration_of_busiest_loop(colls.values(), "rollout decode") == [ag]
  assert hlo_collectives.per_iteration_of_busiest_loop(colls.values(), "update") == []
  # The mesh spelling of replica groups: mesh['a'=2,'b'=2] {'b'} varies b (devices row-major).
  assert hlo_collectives.replica_groups("replica_groups=mesh['a'=2,'b'=2] {'b'}") == ((0, 1), (2, 3))
  assert hlo_collectives.replica_groups("replica_groups=[2,2]<=[2,2]T(1,0)") == ((0, 2), (1, 3))


def test_ici_pricing_by_hand():
  colls = hlo_collectives.collectives(_HLO)
  coords = [(i % 2, i // 2) for i in range(4)]  # a 2x2 v5e slice: no wraparound
  ici = roofline_lib.ici_seconds(colls, aot.chip_of("v5e:2x2"), "v5e:2x2", coords)
  # all-gather over the whole 2x2 (two axes, one 50 GB/s link each): 1536 B / 100 GB/s ≪ 2 hops × 1 µs latency.
  assert ici["rollout decode"] == dict(seconds=pytest.approx(5 * 2e-6), collectives=5, bytes=5 * 1536)
  # all-reduce over a pair: latency-bound (1 hop, twice: reduce-scatter then all-gather); the update's row.
  assert ici["policy fwd+bwd"]["seconds"] == pytest.approx(2e-6)
  # A large all-gather is bandwidth-bound: 1 GiB moved over the 16-chip axis of v5e:16x16 (wraparound: both
  # directions of the link, 2 × 50 GB/s).
  big = hlo_collectives.Collective("all-gather", "x", "c", (("bf16", (2 ** 29,)),), 2 ** 30, (tuple(range(16)),),
                                   1, "", "update")
  sec = roofline_lib.collective_seconds(big, aot.chip_of("v5e:16x16"), "v5e:16x16",
                                        [(i % 16, i // 16) for i in range(256)])
  assert sec == pytest.approx(2 ** 30 * 15 / 16 / 100e9)


def test_analytic_decode_ici_by_hand():
  c = _tiny(dtype="bfloat16")
  mesh = dict(data=1, fsdp=4, tensor=1)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  L = decode_layout.Layout
  # Training layout: every weight all-gathered at each of the 47 decode steps over the 2x2 slice (two axes, one
  # 50 GB/s link each, 2 hops): 12 stacked leaves per layer × 2 layers + the tied head = 25 collectives per token.
  f = roofline_lib.analytic_decode_ici(c, mesh, "v5e:2x2", L("fsdp"))["rollout decode"]
  moved = aot.matmul_params(mcfg) * 2 * 3 / 4
  assert f["collectives"] == 47 * 25 and f["bytes"] == pytest.approx(47 * moved)
  assert f["seconds"] == pytest.approx(47 * (moved / 100e9 + 25 * 2 * 1e-6))
  # Gathered over fsdp with no tensor axis: no collective at all.
  assert roofline_lib.analytic_decode_ici(c, mesh, "v5e:2x2", L("gathered")) == {}
  # tp=2: 5 all-reduces of [4 rows, 64] bf16 and one all-gather of [4, 512] fp32 logits over a pair of chips, each
  # latency-bound (all-reduce 2 hops' worth, all-gather 1).
  t = roofline_lib.analytic_decode_ici(c, mesh, "v5e:2x2", L("tp", 2))["rollout decode"]
  assert t["collectives"] == 47 * 6 and t["seconds"] == pytest.approx(47 * (5 * 2e-6 + 1e-6))
  assert t["bytes"] == pytest.approx(47 * (5 * 2 * 4 * 64 * 2 / 2 + 4 * 512 * 4 / 2))


def test_chip_table_and_bad_topology():
  assert aot.chip_of("v5e:4x4") == aot.Chip(16, 197, 819)
  assert aot.chip_of("v5p:2x2x2").hbm_gib == 95
  assert aot.chip_of("v6e:2x2").bf16_tflops == 918
  with pytest.raises(ValueError, match="--topology='v9:2x2'"):
    aot.chip_of("v9:2x2")
  # --lengths with a bad number said only "math domain error" / "could not convert string to float"
  for spec in ("lognormal:-5:1", "lognormal:abc:1", "lognormal:100:-1", "lognormal:nan:1"):
    with pytest.raises(ValueError, match=f"--lengths='{spec}': MEDIAN must be a number > 0"):
      aot.stated_lengths(spec, 4, 64)


def test_abstract_batch_shards_rows_when_they_divide():
  mesh = jax.sharding.Mesh([[[jax.devices()[0]]]], ("data", "fsdp", "tensor"))
  b = aot.abstract_batch(_tiny(), mesh)
  assert b["prompt_NxP"].shape == (2, 16) and b["answer_ids_NxA"].shape == (2, 4)
  assert b["prompt_NxP"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)


def test_libtpu_held_by_another_process_names_the_fix(monkeypatch):
  """libtpu's lockfile error (another process on the machine loaded libtpu) becomes one line naming what to do."""
  from jax.experimental import topologies

  def held(**_):
    raise RuntimeError('ABORTED: Internal error when accessing libtpu multi-process lockfile. Run "$ sudo rm '
                       '/tmp/libtpu_lockfile".\nC++ trace ...')
  monkeypatch.setattr(topologies, "get_topology_desc", held)
  with pytest.raises(RuntimeError, match="ALLOW_MULTIPLE_LIBTPU_LOAD=1") as e:
    aot.tpu_devices("v5e:2x2")
  assert "another process holds libtpu" in str(e.value) and "C++ trace" not in str(e.value)
  monkeypatch.setattr(topologies, "get_topology_desc", lambda **_: (_ for _ in ()).throw(RuntimeError("no plugin")))
  with pytest.raises(RuntimeError, match=r"no plugin\)\. Is libtpu installed"):
    aot.tpu_devices("v5e:2x2")


def test_cli_without_compile(capsys):
  assert aot.main(["--model=qwen2.5-7b", "--topology=v5p:4x4x4", "--no-compile", "--json"]) == 0
  r = json.loads(capsys.readouterr().out)
  assert r["n_devices"] == 64 and r["mesh"] == dict(data=1, fsdp=64, tensor=1)
  assert r["params"] == 7_615_616_512 and r["plan"]["fits"] is True and "memory" not in r
  # Decode dominates a 512-token rollout: in the gathered layout (auto: it fits 95 GiB) it is HBM-bound (every chip
  # reads all bf16 weights per token) with no collective; in the training layout ICI-bound (every weight
  # all-gathered per token).
  assert r["decode_layout"] == "gathered" and r["ici_source"] == "analytic (decode only)"
  assert r["roofline"]["seconds"]["rollout decode"] == r["roofline"]["decode_hbm_seconds"]
  assert r["roofline"]["decode_hbm_seconds"] > r["roofline"]["seconds"]["policy fwd+bwd"]
  assert aot.main(["--model=qwen2.5-7b", "--topology=v5p:4x4x4", "--no-compile", "--json",
                   "--decode-layout=fsdp"]) == 0
  f = json.loads(capsys.readouterr().out)
  assert f["roofline"]["seconds"]["rollout decode"] == f["roofline"]["ici_seconds"]["rollout decode"]
  assert f["roofline"]["step_seconds"] > 2 * r["roofline"]["step_seconds"]
  # the carry's KV rebuild under --carry-kv recompute is a phase of its own (roofline.carry_recompute_slots)
  carry = ["--model=qwen2.5-0.5b", "--topology=v5e:2x2", "--no-compile", "--json", "--engine=continuous",
           "--partial-rollouts", "--prompts=4", "--L=256"]
  assert aot.main(carry) == 0 and "carry KV recompute" not in json.loads(capsys.readouterr().out)["roofline"]["flops"]
  assert aot.main(carry + ["--carry-kv=recompute"]) == 0
  assert json.loads(capsys.readouterr().out)["roofline"]["flops"]["carry KV recompute"] > 0
  assert aot.main(["--topology=v5e:4xq", "--no-compile"]) == 2
  assert "GEN:AxB" in capsys.readouterr().err
  assert aot.main(["--topology=v5e:4x4", "--mesh", "data=3,fsdp=-1", "--no-compile"]) == 2
  assert "config.mesh" in capsys.readouterr().err
  # one line naming the flag; --stream-batches without --lengths changed nothing (it scales the --lengths draw)
  for args in (["--decode-tp", "-3"], ["--stream-batches", "0"], ["--G", "0"], ["--stream-batches", "3"]):
    with pytest.raises(SystemExit) as e:
      aot.main(["--no-compile", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {args[0]}" in err and len(err.strip().splitlines()) == 1, err


NEEDS_LIBTPU = conftest.requires("libtpu", "libtpu is not importable: pip install libtpu==0.0.42.1 (the version jax "
                                "0.10.2 pins)")


@NEEDS_LIBTPU
def test_tpu_compile_report_in_subprocess(tpu_programs):
  """`python -m grpo_jax.perf.aot ... --json`'s report (its main() with those flags, the `report` part of the libtpu
  subprocess below)."""
  r = script_parts.part(tpu_programs, "report")
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


# The four libtpu compiles below run in ONE subprocess (the `tpu_programs` fixture): each part is a function of the
# script, run in turn, its result (or its traceback) under its own key, so each test still asserts on its own part
# alone; the parts share one Python + JAX + libtpu start-up instead of four.
_TPU_HEAD = """
import json, re, jax, jax.numpy as jnp
from jax.experimental import topologies
from grpo_jax.perf import aot
from grpo_jax.rl import memory_plan
from grpo_jax.model import model as M
from grpo_jax.infra import sharding
"""

# Lowers the model's training forward+backward for a v5e:2x2 slice (4 chips, FSDP) with model.attention=auto and
# =xla; returns the splash kernel names found in each lowering's custom calls.
_SPLASH_LOWERING = """
def splash():
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
    out[attention] = sorted({n for l in calls for n in re.findall(r"splash_mha_[a-z_]+", l)}
                            | {"calls=%d" % len(calls)})
  return out
"""

# The command's compile report: its main() with the flags, its --json line parsed as the command's stdout would be.
_COMPILE_REPORT = """
def report():
  import contextlib, io
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    code = aot.main(["--model=small", "--topology=v5e:2x2", "--prompts=2", "--G=4", "--prompt-len=128", "--L=128",
                     "--json"])
  assert code == 0, code
  return json.loads(out.getvalue().strip().splitlines()[-1])
"""

_TPU_TAIL = script_parts.tail({"report": "report", "splash": "splash", "decode_collectives": "decode_collectives",
                                "continuous": "continuous"})


def _last_json_line_of(script: str, timeout: int) -> dict:
  """Runs a libtpu script in its own process (libtpu stays out of the worker) and parses its last stdout line."""
  out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tpu_programs():
  """One libtpu subprocess for the compile report, the splash lowering, the decode-collective and the continuous-engine
  compiles (each test reads its own part; a part that raised carries its traceback, which fails that test alone)."""
  import importlib.util
  if importlib.util.find_spec("libtpu") is None:  # only under CI=true: elsewhere NEEDS_LIBTPU skips its tests first
    pytest.fail("libtpu is missing under CI=true (the test extra installs it): the TPU compiles need it")
  return _last_json_line_of(_TPU_HEAD + _COMPILE_REPORT + _SPLASH_LOWERING + _DECODE_COLLECTIVES + _CONTINUOUS_DECODE
                            + _TPU_TAIL, timeout=1800)


@NEEDS_LIBTPU
def test_tpu_lowering_of_training_contains_the_splash_kernels(tpu_programs):
  """On a TPU target, model.attention=auto lowers the training forward+backward to splash's Pallas kernels (forward,
  dq and dkv, with segment ids for the padding) inside shard_map; the einsum path has no kernel call."""
  r = script_parts.part(tpu_programs, "splash")
  kernels = {"splash_mha_fwd_segmented_residuals", "splash_mha_dq_segmented_no_residuals",
             "splash_mha_dkv_segmented_no_residuals"}
  assert kernels <= set(r["auto"]), r
  assert r["xla"] == ["calls=0"], r


# Compiles the tiny RL step for a v5e:2x2 slice (4 chips, FSDP) in tensor-parallel decode (decode_tp=2); prints its
# report's decode-loop collective counts. Kept cheap to compile: one layer, β = 0 (dr_grpo: no reference forward),
# fp32 (no recomputed old log-probs), no remat. The default layout's counts are the compile report's (`report`: the
# `small` step, whose default layout is the same gathered one); a tiny step compiled in it as well was one more libtpu
# compile (~7 CPU-s) for the same four fields.
_DECODE_COLLECTIVES = """
def decode_collectives():
  devices = aot.tpu_devices("v5e:2x2")
  out = {}
  for knob, tp in (("tp", 2),):
    cfg = memory_plan.workload_config("tiny", prompts=2, G=4, prompt_len=16, L=8, dtype="float32", remat="none",
                                      algo="dr_grpo")
    cfg.model.layers = 1
    cfg.sampling.update(decode_layout=knob, decode_tp=tp)
    r = aot.check(cfg, "v5e:2x2", dict(data=1, fsdp=4, tensor=1), devices)
    out[knob] = {k: r[k] for k in ("decode_layout", "decode_collectives_per_token", "decode_collective_budget",
                                   "decode_weight_collectives_per_token", "decode_xla_collectives_per_token",
                                   "compile_seconds")}
    out[knob]["ici_decode"] = r["roofline"]["ici"].get("rollout decode", {})
  return out
"""


@NEEDS_LIBTPU
def test_tpu_decode_loop_collectives_per_layout(tpu_programs):
  """In the TPU compiler's program, the decode loop of the default layout (the compile report's step) moves no weight
  and runs no collective at all (tensor=1); tensor-parallel decode (a 1-layer step) stays within 2 all-reduces per
  layer plus the embedding's all-reduce and the logits' all-gather, and moves no weight (weights told apart from
  activations by shape)."""
  auto, tp = script_parts.part(tpu_programs, "report"), script_parts.part(tpu_programs, "decode_collectives")["tp"]
  assert auto["decode_layout"] == "gathered" and auto["decode_weight_collectives_per_token"] == 0, auto
  assert auto["decode_collective_budget"] == {} and auto["decode_collectives_per_token"] == {}, auto
  assert auto["decode_xla_collectives_per_token"]["count"] == 0, auto
  layers = 1
  assert tp["decode_layout"] == "tp=2" and tp["decode_weight_collectives_per_token"] == 0, tp
  assert tp["decode_collective_budget"] == {"all-reduce": 2 * layers + 1, "all-gather": 1}, tp
  # Measured (libtpu 0.0.42.1): exactly the budget, 3 all-reduces of the f32[4 rows, 64] activations and one
  # all-gather of the f32[4, 512] logits; plus tiny all-reduces XLA adds itself (bookkeeping, under 1 KiB).
  assert tp["decode_collectives_per_token"] == {"all-reduce": 2 * layers + 1, "all-gather": 1}, tp
  assert tp["decode_xla_collectives_per_token"]["bytes"] < 1024, tp


# Compiles a 1-layer RL step with the continuous engine for a v5e:2x2 slice (4 chips, FSDP: each chip decodes its
# own 4 of the 16 rows in its own 4 slots, then compacted to 2) in the default decode layout and in the training
# layout; prints each report's per-decode-step collective counts (aot.check: per iteration of a compaction phase's
# loop, whose trip count is data-dependent). Cheap to compile: β = 0, fp32, no remat, one compaction (two phases:
# 42 s of libtpu compiling with three phases, 28 s with two, the same counts), one layer (the decode step unrolls
# its layers: 16.7 CPU-s for the two compiles with one, 20.3 with two, 2026-12-08; the default layout's counts the
# same, the training layout's weight all-gathers 25 per step instead of 48).
_CONTINUOUS_DECODE = """
def continuous():
  devices = aot.tpu_devices("v5e:2x2")
  out = {}
  for knob in ("auto", "fsdp"):
    cfg = memory_plan.workload_config("tiny", prompts=4, G=4, prompt_len=16, L=8, dtype="float32", remat="none",
                                      algo="dr_grpo", engine="continuous", slots=16)
    cfg.model.layers = 1
    cfg.sampling.update(decode_layout=knob, compaction=2)
    r = aot.check(cfg, "v5e:2x2", dict(data=1, fsdp=4, tensor=1), devices)
    out[knob] = {k: r[k] for k in ("decode_layout", "decode_collectives_per_token",
                                   "decode_weight_collectives_per_token", "decode_xla_collectives_per_token",
                                   "decode_ici_bytes_per_token", "compile_seconds")}
  return out
"""


@NEEDS_LIBTPU
def test_tpu_continuous_engine_decode_moves_no_weight_and_no_row(tpu_programs):
  """The TPU compiler's program of the continuous engine's RL step: in the default (gathered) decode layout a decode
  step moves no weight, and no row either (rows stay on their device: only scalar all-reduces of the phase
  predicates and the live maximum, a few bytes per step); the training layout's per-token weight all-gathers are
  found in the same loops (so the count sees them)."""
  r = script_parts.part(tpu_programs, "continuous")
  auto, fsdp = r["auto"], r["fsdp"]
  assert auto["decode_layout"] == "gathered" and auto["decode_weight_collectives_per_token"] == 0, auto
  assert set(auto["decode_collectives_per_token"]) <= {"all-reduce"}, auto
  assert auto["decode_ici_bytes_per_token"] < 256, auto
  layers = 1  # every one of its 7 projections all-gathered per step, at least
  assert fsdp["decode_layout"] == "fsdp" and fsdp["decode_weight_collectives_per_token"] >= 7 * layers, fsdp


def test_weight_collectives_tell_weights_from_activations():
  # The classifier the TPU and CPU counts rely on: a gathered [D, F] MLP kernel of `tiny` (64 × 128) or one split
  # over tensor is a weight; the decode activations ([rows, D], [rows, V]) are not.
  mcfg = model_lib.ModelConfig.from_config(_tiny().model)
  mesh = dict(data=1, fsdp=4, tensor=2)
  mk = lambda dt, dims: hlo_collectives.Collective("all-gather", "x", "c", ((dt, dims),), 0, (), 7, "op", "d")
  weights = [mk("bf16", (64, 128)), mk("bf16", (64, 64)), mk("f32", (512, 64))]
  acts = [mk("bf16", (2, 64)), mk("f32", (2, 512)), mk("pred", (64,))]
  for layout in (decode_layout.Layout("gathered"), decode_layout.Layout("tp", 2)):
    assert decode_layout.weight_collectives(weights + acts, mcfg, mesh, layout) == weights
