"""The memory planner: exact parameter bytes, sharding arithmetic, and agreement with XLA's buffer assignment."""
import json
import os

import jax
import pytest

import conftest  # tests/conftest.py: no_compilation_cache

from grpo_jax.config import config_lib
from grpo_jax.rollout import decode_layout
from grpo_jax.perf import plan_cli
from grpo_jax.rl import memory_plan

ONE = dict(data=1, fsdp=1, tensor=1)


def test_qwen_presets_have_the_published_parameter_counts():
  # Hand count for Qwen2.5-0.5B: embed 151936·896; per layer q 896·896+896, k and v 896·128+128 each, o 896·896,
  # MLP 3·896·4864, two norms 2·896; 24 layers; final norm 896 = 494,032,768 (HF's count).
  per_layer = 896 * 896 + 896 + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
  assert 151936 * 896 + 24 * per_layer + 896 == 494_032_768
  mcfg = lambda m: memory_plan.model_lib.ModelConfig.from_config(memory_plan.workload_config(m).model)
  assert memory_plan.param_bytes_per_device(mcfg("qwen2.5-0.5b"), ONE) == (4 * 494_032_768, 494_032_768)
  assert memory_plan.param_bytes_per_device(mcfg("qwen2.5-1.5b"), ONE)[1] == 1_543_714_304
  assert memory_plan.param_bytes_per_device(mcfg("qwen2.5-7b"), ONE)[1] == 7_615_616_512


def test_sharding_divides_param_bytes_per_rule():
  mcfg = memory_plan.model_lib.ModelConfig.from_config(memory_plan.workload_config("tiny").model)
  full, n = memory_plan.param_bytes_per_device(mcfg, ONE)
  # Every tiny leaf has an 'embed' dim except q/k/v biases (2·(4+2+2)·16 floats): fsdp=4 splits all the rest.
  bias = 2 * (4 + 2 + 2) * 16 * 4
  assert memory_plan.param_bytes_per_device(mcfg, dict(data=1, fsdp=4, tensor=1))[0] == (full - bias) // 4 + bias
  # 'data' replicates parameters.
  assert memory_plan.param_bytes_per_device(mcfg, dict(data=8, fsdp=1, tensor=1))[0] == full


def test_plan_components_follow_the_mesh_and_remat():
  c = memory_plan.workload_config("qwen2.5-0.5b", prompts=16, G=8, prompt_len=256, L=512)
  p16 = memory_plan.plan(c, dict(data=1, fsdp=16, tensor=1))
  p8 = memory_plan.plan(c, dict(data=1, fsdp=8, tensor=1))
  assert p16.resident["optimizer (adam m, v)"] == 2 * p16.resident["policy"]
  assert p16.resident["reference"] == p16.resident["policy"]
  # 128 rows over 16 devices = 8 rows; KV cache bf16: 2 · 24 layers · 8 rows · 2 kv heads · 64 · 768 slots · 2 B.
  assert p16.rollout["kv cache"] == 2 * 24 * 8 * 2 * 64 * 768 * 2
  assert p8.rollout["kv cache"] == 2 * p16.rollout["kv cache"]
  saved = lambda remat: memory_plan.plan(memory_plan.workload_config("tiny", remat=remat), ONE).update
  full, dots, none = (sum(v for k, v in saved(r).items() if k.startswith("saved")) for r in ("full", "dots", "none"))
  assert full < dots < none
  # remat=full keeps one [tokens, hidden] bf16 input per layer: 2 layers · 128 rows · 768 tokens · 64 · 2 B.
  assert full == 2 * 128 * 768 * 64 * 2
  ppo = memory_plan.workload_config("tiny", algo="ppo")
  assert memory_plan.plan(ppo, ONE).resident["critic"] == memory_plan.plan(ppo, ONE).resident["policy"]


def test_cli_json_and_errors(capsys):
  assert plan_cli.main(["--model=qwen2.5-7b", "--mesh", "data=1,fsdp=16,tensor=1", "--hbm-gib", "16",
                           "--json"]) == 0
  r = json.loads(capsys.readouterr().out)
  assert r["mesh"] == dict(data=1, fsdp=16, tensor=1) and r["params"] == 7_615_616_512
  assert r["total_bytes"] == r["resident_bytes"] + r["temp_bytes"]
  assert r["resident"]["policy"] == pytest.approx(4 * 7_615_616_512 / 16, rel=0.01)
  assert plan_cli.main(["--mesh", "data=1,fsdp=x"]) == 2
  assert "--mesh: bad entry 'fsdp=x'" in capsys.readouterr().err
  assert plan_cli.main(["--mesh", "fsdp=-1"]) == 2
  assert "explicit sizes" in capsys.readouterr().err
  # a step no run builds is refused as a run is (aot did; the planner planned it): the carry on the static engine,
  # the carry beside PPO's critic
  assert plan_cli.main(["--partial-rollouts"]) == 2
  assert capsys.readouterr().err.startswith("error: config.rl.partial_rollouts: carries rows in the continuous engine's")
  assert plan_cli.main(["--partial-rollouts", "--engine", "continuous", "--algo", "ppo"]) == 2
  assert "not supported with algo='ppo'" in capsys.readouterr().err
  assert plan_cli.main(["--partial-rollouts", "--engine", "continuous", "--json"]) == 0
  assert "carry slot kv (S x L)" in json.loads(capsys.readouterr().out)["resident"]  # the carry's state, planned
  # a count of 0 or below planned a step of nothing and exited 0; --hbm-gib inf was an OverflowError traceback;
  # every usage error is one line naming the flag (it printed argparse's 15-line usage block above it)
  for args, needle in [(["--prompts", "0"], "argument --prompts: '0': must be an integer >= 1"),
                       (["--G", "-4"], "argument --G"), (["--L", "0"], "argument --L"),
                       (["--prompt-len", "-1"], "argument --prompt-len"), (["--slots", "-3"], "argument --slots"),
                       (["--max-staleness", "-1"], "argument --max-staleness"),
                       (["--rollout-budget", "-5"], "argument --rollout-budget"),
                       (["--pack-rows", "-1"], "argument --pack-rows"),
                       (["--hbm-gib", "inf"], "argument --hbm-gib: 'inf': must be a finite number of GiB >= 0"),
                       (["--hbm-gib", "-5"], "argument --hbm-gib"), (["--nosuch"], "unrecognized arguments")]:
    with pytest.raises(SystemExit) as e:
      plan_cli.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err)


@pytest.fixture(scope="module")
def cpu_compiled(tmp_path_factory):
  """One small RL step compiled for the CPU (shared; ~20 s on a busy 2-core machine), its HLO dumped."""
  from grpo_jax.perf import aot
  cfg = memory_plan.workload_config("tiny", prompts=2, G=4, prompt_len=16, L=48, mesh=ONE, dtype="float32",
                                    remat="none")
  dump = str(tmp_path_factory.mktemp("xla_dump"))
  # Not from the suite's compilation cache: its key leaves out xla_dump_to, and a cache hit writes no dump.
  with conftest.no_compilation_cache():
    compiled, _ = aot.compile_step(cfg, jax.devices()[:1], ONE, compiler_options={"xla_dump_to": dump})
  return cfg, aot.memory_report(compiled, None), dump


def test_buffer_assignment_summary_equals_memory_analysis(cpu_compiled, tmp_path):
  # aot --buffers reads per-device bytes from XLA's dump (how the 1.5B/7B TPU rows in docs/scale.md were taken from
  # compiles cut off after buffer assignment); it must equal what memory_analysis() reports for the same compile.
  from grpo_jax.perf import aot
  _, mem, dump = cpu_compiled
  b = aot.buffer_assignment_summary(dump)
  assert (b["argument_bytes"], b["temp_bytes"]) == (mem["argument_bytes"], mem["temp_bytes"])
  sizes = [v["bytes"] for v in b["largest_temp_values"]]
  assert sizes == sorted(sizes, reverse=True) and 0 < sizes[0] <= mem["temp_bytes"]
  with pytest.raises(ValueError, match="no \\*jit_step"):
    aot.buffer_assignment_summary(str(tmp_path))


def test_plan_within_15_percent_of_xla_on_cpu(cpu_compiled):
  cfg, mem, _ = cpu_compiled
  p = memory_plan.plan(cfg, ONE)
  # Arguments are the state and the batch: the planner's resident bytes, up to the tiny step/rng scalars.
  assert abs(mem["argument_bytes"] - p.resident_bytes) <= 64
  xla = mem["argument_bytes"] + mem["temp_bytes"]
  # Temporaries dominate in this config, so the check is on the activation model, not just the param count.
  assert mem["temp_bytes"] > 5 * mem["argument_bytes"]
  assert abs(p.total_bytes / xla - 1) < 0.15, (p.as_dict(), mem)


def test_ppo_plan_within_15_percent_of_xla_on_cpu():
  """PPO with a separate critic (the cpu_compiled step's shape): one gradient over (policy, critic), whose own trunk
  saves its activations beside the policy's. The plan left them out: 15.24 MB against XLA's 21.38 MB (0.71x, the
  side where `auto` picks a split that does not fit); 21.27 MB with them. Arguments: the state (with the critic and
  its AdamW state) and the batch, up to the step scalars."""
  from grpo_jax.perf import aot
  from grpo_jax.rl import auto
  c = memory_plan.workload_config("tiny", prompts=2, G=4, prompt_len=16, L=48, mesh=ONE, dtype="float32",
                                  remat="none", algo="ppo")
  c, _ = auto.resolve(c, auto.Context(ONE, None, "cpu"), log=False)
  mem = aot.memory_report(aot.compile_step(c, jax.devices()[:1], ONE)[0], None)
  p = memory_plan.plan(c, ONE, "cpu")
  assert abs(mem["argument_bytes"] - p.resident_bytes) <= 1024
  assert p.update["critic saved activations"] == p.update["saved activations (remat=none)"]
  assert abs(p.total_bytes / (mem["argument_bytes"] + mem["temp_bytes"]) - 1) < 0.15, (p.as_dict(), mem)


def test_packed_passes_plan_logits_for_every_packed_position_and_the_trained_gradient():
  """Under rl.packing the LM head scores every position of a packed row (63 targets of pack_len 64 here, XLA:CPU's
  f32[8,63,512]), not the L = 48 of a padded completion: the logits chunk was planned at 48 positions, the plan
  0.935x XLA's for this step (14.97 MB; 0.987x with the packed length). Tiny, fp32, one micro-batch of 8 rows."""
  from grpo_jax.rl import auto
  c = memory_plan.workload_config("tiny", prompts=2, G=4, prompt_len=16, L=48, mesh=ONE, dtype="float32",
                                  remat="none", packing="on")
  c, _ = auto.resolve(c, auto.Context(ONE, None, "cpu"), log=False)
  assert (c.rl.pack_len, c.rl.pack_rows) == (64, 8)
  p = memory_plan.plan(c, ONE, "cpu")
  # 3 fp32 [rows, positions, V] arrays (logits, log-softmax, their gradient) + the rows' fp32 hidden states
  assert p.update["logits chunk"] == 3 * 8 * 64 * 512 * 4 + 8 * 64 * 64 * 4
  assert p.score["logits chunk"] == 2 * 8 * 64 * 512 * 4 + 8 * 64 * 64 * 4
  # LoRA: the micro-batches' summed gradient is the adapters' (rank 4 on the 7 projections of 2 layers: 2 x (2 x 512
  # + 2 x 384 + 3 x 768) = 8,192 fp32), not the whole model's 107,072 (the plan was 1.07x XLA's with packing + LoRA)
  lora = config_lib.override(c, {"model.lora.rank": 4, "model.lora.alpha": 8.0})
  assert memory_plan.plan(lora, ONE, "cpu").update["gradient accumulator"] == 8192 * 4
  assert memory_plan.plan(memory_plan.workload_config(
      "tiny", prompts=2, G=4, prompt_len=16, L=48, mesh=ONE, dtype="float32", remat="none",
      rollout_chunks=1, minibatches=1), ONE, "cpu").update["logits chunk"] == 3 * 8 * 48 * 512 * 4 + 8 * 48 * 64 * 4


def test_lm_head_terms_follow_fsdp_and_dtype():
  c = memory_plan.workload_config("qwen2.5-1.5b")
  D, V = 1536, 151936
  mesh = dict(data=1, fsdp=8, tensor=1)
  p = memory_plan.plan(c, mesh, decode=decode_layout.Layout("fsdp"))
  # FSDP: the bf16 head is gathered whole for the forward; its fp32 gradient is whole before the reduce-scatter.
  assert p.update["lm head, gathered"] == p.rollout["lm head, gathered per token"] == D * V * 2
  assert p.update["lm head gradient, unreduced"] == D * V * 4
  # One device, fp32: the head is used in place and its gradient is the `gradients` entry.
  p1 = memory_plan.plan(memory_plan.workload_config("qwen2.5-1.5b", dtype="float32"), ONE)
  assert p1.update["lm head, gathered"] == p1.update["lm head gradient, unreduced"] == 0
  # Logits are scored on the L completion positions, model.logprob_chunk (16 for a 152k vocab) at a time.
  assert p.update["logits chunk"] == 3 * 16 * 16 * V * 4 + 16 * 512 * D * 4


def test_decode_layouts_in_the_plan():
  c = memory_plan.workload_config("qwen2.5-1.5b")
  mesh = dict(data=1, fsdp=8, tensor=1)
  n = 1_543_714_304
  # Norm scales stay fp32 (2·28+1 of them, 1536 each); every other weight is bf16 and whole on every chip.
  scales = (2 * 28 + 1) * 1536
  g = memory_plan.plan(c, mesh, decode=decode_layout.Layout("gathered"))
  assert g.rollout["decode weights (gathered)"] == 2 * (n - scales) + 4 * scales
  assert "lm head, gathered per token" not in g.rollout
  # auto with no memory limit: gathered; against a chip too small for it, the smallest tp degree that fits.
  assert memory_plan.plan(c, mesh).rollout == g.rollout
  # 4 minibatches: the update's peak drops below the gathered rollout's, so the decode layout sets the total.
  c4 = memory_plan.workload_config("qwen2.5-1.5b", minibatches=4)
  g4 = memory_plan.plan(c4, mesh, decode=decode_layout.Layout("gathered"))
  assert g4.peak_phase == "rollout"
  layout, why = memory_plan.choose_decode(c4, mesh, g4.total_bytes - 1)
  assert layout == decode_layout.Layout("tp", 2) and "the planner puts the step at" in why
  assert memory_plan.plan(c4, mesh, decode=layout).total_bytes < g4.total_bytes
  # tp=2 over 8 fsdp chips: each decode group of 2 holds half the weights, and the rows of 4 chips' worth of
  # groups: 128 rows / 4 groups = 32 rows per chip, KV heads (2) split 2 ways.
  t2 = memory_plan.plan(c, mesh, decode=decode_layout.Layout("tp", 2))
  assert t2.rollout["kv cache"] == 2 * 28 * 32 * 1 * 128 * 768 * 2
  assert t2.rollout["decode weights (tp=2)"] < 0.55 * g.rollout["decode weights (gathered)"]
  # tp=4 exceeds the 2 KV heads: each is repeated twice, so the cache per chip stays at one head.
  t4 = memory_plan.plan(c, mesh, decode=decode_layout.Layout("tp", 4))
  assert t4.rollout["kv cache"] == 2 * 28 * 64 * 1 * 128 * 768 * 2
  # Nothing fits: the training layout, said so.
  layout, why = memory_plan.choose_decode(c, mesh, 1)
  assert layout.kind == "fsdp" and "no decode layout fits" in why
  c.sampling.decode_layout = "tp"  # set: stays tp (the largest degree: 4 of 12 heads), as a resume reading it runs
  layout, why = memory_plan.choose_decode(c, mesh, 1)
  assert layout == decode_layout.Layout("tp", 4) and "sampling.decode_layout=tp (set)" in why
  c.sampling.decode_layout = "auto"
  with pytest.raises(ValueError, match="sampling.decode_tp=3: must be >= 2 and divide mesh.fsdp=8"):
    memory_plan.plan(c, mesh, decode=decode_layout.Layout("tp", 3))


def test_plan_within_15_percent_of_the_measured_tpu_buffer_assignment():
  # XLA:TPU (libtpu 0.0.42.1) buffer assignment of rl_step for Qwen2.5-1.5B on v5p:2x2x2, fsdp=8, 16 prompts × G16,
  # 512+8192 tokens, bf16, remat=full, 4 minibatches, 4 rollout chunks, splash attention (docs/scale.md,
  # 2026-12-01): arguments 2.876 GiB + temp 13.875 GiB. Qwen2.5-7B, v5p:4x4x4, 32 × G16, 512+16384, 4 minibatches,
  # 8 chunks: 1.775 + 15.049 GiB. Update these only from new compiles (python -m grpo_jax.aot ... --rollout-chunks
  # with XLA_FLAGS=--xla_dump_to, then aot --buffers). Both were compiled in the training decode layout (fsdp: the
  # decode loop all-gathers every weight at every token), so they are planned in it.
  G = memory_plan.GiB
  c = memory_plan.workload_config("qwen2.5-1.5b", prompts=16, G=16, prompt_len=512, L=8192, minibatches=4,
                                  rollout_chunks=4)
  fsdp = decode_layout.Layout("fsdp")
  p = memory_plan.plan(c, dict(data=1, fsdp=8, tensor=1), plat="tpu", decode=fsdp)
  assert abs(p.resident_bytes / (2.876 * G) - 1) < 0.01
  assert abs(p.total_bytes / ((2.876 + 13.875) * G) - 1) < 0.15, p.as_dict()
  # The buffer assignment is a lower bound on TPU (later passes add temporaries): the planner stays above it.
  c7 = memory_plan.workload_config("qwen2.5-7b", prompts=32, G=16, prompt_len=512, L=16384, minibatches=4,
                                   rollout_chunks=8)
  p7 = memory_plan.plan(c7, dict(data=1, fsdp=64, tensor=1), plat="tpu", decode=fsdp)
  assert abs(p7.resident_bytes / (1.775 * G) - 1) < 0.01
  assert 1.0 < p7.total_bytes / ((1.775 + 15.049) * G) < 1.3, p7.as_dict()


def test_attention_terms_follow_the_path_chunks_and_beta():
  # Qwen2.5-1.5B long context on 8 chips: 12 heads, 2 KV heads, head_dim 128, T = 8704, 8 rows per chip in the update.
  c = memory_plan.workload_config("qwen2.5-1.5b", prompts=16, G=16, prompt_len=512, L=8192, minibatches=4)
  mesh = dict(data=1, fsdp=8, tensor=1)
  tpu, cpu = memory_plan.plan(c, mesh, plat="tpu"), memory_plan.plan(c, mesh, plat="cpu")
  T, tok = 8704, 8 * 8704
  mlp = tok * (4 * 1536 + (12 + 4) * 128 + 4 * 8960) * 2
  # Splash: fp32 max/logsumexp residuals lane-replicated [rows, 12, T, 128] ×3, and q/k/v/o/dO copies in bf16.
  assert tpu.update["layer backward"] == mlp + tok * (3 * 12 * 128 * 4 + 4 * 14 * 128 * 2)
  # Blockwise (the CPU's auto at this T): 16 fp32 [rows, T, (12+2)·128] arrays and four 128×128 score tiles per head.
  assert cpu.update["layer backward"] == mlp + tok * 16 * 14 * 128 * 4 + 4 * 8 * 12 * 128 * 128 * 4
  # The einsum path would hold two fp32 [rows, 12, T, T] arrays: 58 GiB per chip.
  xla = memory_plan.plan(_override(c, {"model.attention": "xla"}), mesh, plat="tpu")
  assert xla.update["layer backward"] == mlp + 2 * 8 * 12 * T * T * 4
  # Rollout chunks: the KV cache and the scoring forwards are one chunk's (32 → 8 rows per chip).
  c4 = _override(c, {"rl.rollout_chunks": 4})
  p4 = memory_plan.plan(c4, mesh, plat="tpu")
  assert tpu.rollout["kv cache"] == 2 * 28 * 32 * 2 * 128 * T * 2 == 4 * p4.rollout["kv cache"]
  assert tpu.score["forward layer"] == 4 * p4.score["forward layer"]
  assert p4.update == tpu.update
  # β = 0 (dr_grpo) keeps no reference; under fp32 it has no scoring forward at all (old log-probs come from the
  # sampler).
  zero = memory_plan.workload_config("tiny", algo="dr_grpo", dtype="float32")
  pz = memory_plan.plan(zero, ONE, plat="cpu")
  assert "reference" not in pz.resident and pz.score == {}
  pg = memory_plan.plan(memory_plan.workload_config("tiny", dtype="float32"), ONE, plat="cpu")
  assert pg.resident["reference"] == pg.resident["policy"] and pg.score


def _override(c, values):
  from grpo_jax.config import config_lib
  return config_lib.override(c, values)


def test_tpu_rollout_terms_against_the_7b_lora_compiles():
  # XLA:TPU (libtpu 0.0.42.1) buffer assignments of the LoRA rl_step, Qwen2.5-7B rank 64 with a bf16 base on v5e:2x4
  # (fsdp 8), 8 prompts × G8, 512+2048, decode tp=2 (docs/scale.md, 2026-12-01). One minibatch: 17297593856 bytes
  # per device, the peak inside the decode loop with the update's remat-saved inputs bf16[28,20480,3584] (3.83 GiB)
  # already allocated (the planner had the phases apart: 13.93 GiB, 0.81×). Four minibatches: 15176342016 bytes,
  # the peak where the decode starts, with the prefill's gathered bf16[3584,152064] head live; the saved inputs
  # are allocated inside the update loop. Update only from new compiles.
  c = memory_plan.workload_config("qwen2.5-7b", prompts=8, G=8, prompt_len=512, L=2048, lora_rank=64,
                                  lora_base_dtype="bfloat16")
  mesh, tp2 = dict(data=1, fsdp=8, tensor=1), decode_layout.Layout("tp", 2)
  p = memory_plan.plan(c, mesh, plat="tpu", decode=tp2)
  held = 28 * (64 * 2560 // 8) * 3584 * 2
  assert p.rollout[memory_plan.HELD_EARLY] == p.score[memory_plan.HELD_EARLY] == held
  assert p.update["saved activations (remat=full)"] == held
  assert p.rollout[memory_plan.PREFILL_HEAD] == 3584 * 152064 * 2
  assert p.peak_phase == "rollout"
  assert abs(p.total_bytes / 17297593856 - 1) < 0.05, p.as_dict()
  p4 = memory_plan.plan(_override(c, {"rl.minibatches": 4}), mesh, plat="tpu", decode=tp2)
  assert memory_plan.HELD_EARLY not in p4.rollout and p4.peak_phase == "rollout"
  assert abs(p4.total_bytes / 15176342016 - 1) < 0.10, p4.as_dict()
  # Planned on TPU only (the XLA:CPU check above holds within 15% without it); the gathered layout's copy is the
  # head the prefill uses.
  cpu = memory_plan.plan(c, mesh, plat="cpu", decode=tp2)
  assert memory_plan.HELD_EARLY not in cpu.rollout and memory_plan.HELD_EARLY not in cpu.score
  g = memory_plan.plan(c, mesh, plat="tpu", decode=decode_layout.Layout("gathered"))
  assert memory_plan.PREFILL_HEAD not in g.rollout


def test_sft_plan_within_5_percent_of_xla_on_cpu():
  """memory_plan.plan_sft (the SFT step: job=sft / pretrain, the SFT stages) against XLA's own figures for the
  compiled SFT step: arguments are the trained params, AdamW's moments and the batch (the planner's resident, up
  to the step/rng scalars); the total within 5% (3.6% when written: 13.86 MB planned, 13.38 MB by XLA)."""
  import jax.numpy as jnp
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.perf import aot
  from grpo_jax.rl import families, sft_step
  from grpo_jax.rl import state as state_lib
  c = memory_plan.workload_config("tiny", mesh=ONE, dtype="float32", remat="none")
  c.sft.batch, c.model.max_len, c.job = 8, 64, "sft"
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = sft_step.model_config(c, model_lib.ModelConfig.from_config(c.model))
  step = families.make_step(c, mesh, mcfg, family=sft_step)
  batch = {k: jax.ShapeDtypeStruct((8, 64), jnp.int32, sharding=sharding.batch_sharding(mesh, 2))
           for k in ("tokens_NxT", "positions_NxT", "mask_NxT", "loss_mask_NxT")}
  mem = aot.memory_report(step.lower(state_lib.with_shardings(*sft_step.state_spec(c, mesh, mcfg)), batch).compile(),
                          None)
  p = memory_plan.plan_sft(c, ONE, "cpu")
  assert p.resident == {"policy": 107072 * 4, "optimizer (adam m, v)": 2 * 107072 * 4, "batch": 8 * 64 * 4 * 4}
  assert abs(mem["argument_bytes"] - p.resident_bytes) <= 64
  assert abs(p.total_bytes / (mem["argument_bytes"] + mem["temp_bytes"]) - 1) < 0.05, (p.as_dict(), mem)


def test_an_sft_batch_no_device_holds_is_refused_before_anything_is_written(monkeypatch, tmp_path):
  """job=sft ran no memory check (the RL jobs have auto.check_choosable): a batch too large for the device was an
  out-of-memory error in the compile or the first step. Now preflight refuses it in one line naming sft.batch;
  one byte more memory and it passes. So does the grpo job's SFT stage."""
  from grpo_jax.config import config_lib
  from grpo_jax.run import preflight
  from grpo_jax.run import validate
  c = config_lib.override(config_lib.load_config("configs/grpo_arith.py", "small"),
                          {"job": "sft", "log.plots": False, "log.tensorboard": False})
  need = memory_plan.plan_sft(c, validate.validate_mesh(c, 1)).total_bytes
  wd = str(tmp_path / "run")
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [need - 1])
  with pytest.raises(validate.ConfigError, match=r"^config.sft.batch: the SFT step of 32 rows of model.max_len=128 "
                     r"tokens plans .* per device, more than the device's .*; lower sft.batch") as e:
    preflight.check(c, wd)
  assert "\n" not in str(e.value) and not os.path.exists(wd)
  grpo = config_lib.override(c, {"job": "grpo", "sft.steps": 5})
  with pytest.raises(validate.ConfigError, match=r"^config.sft.batch: the SFT step"):
    preflight.check(grpo, wd)
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [need])
  preflight.check(c, wd)
