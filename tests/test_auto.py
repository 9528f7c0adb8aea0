"""rl/auto.py's rl.rollout_chunks × rl.minibatches knob (0 = auto): the fewest counts whose planned bytes fit the
device, the one-line error when none do, the step builders' refusal of an unresolved config, and every entry path
that builds a step resolving it (the main job, R1 stages, vmapped sweep lanes, the ablation tables, aot, the
planner CLI)."""
import contextlib
import json
import logging
import os

import pytest

from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.perf import aot
from grpo_jax.rl import auto
from grpo_jax.rl import families
from grpo_jax.perf import plan_cli
from grpo_jax.rl import memory_plan
from grpo_jax.rl import update
from grpo_jax.run import validate
from grpo_jax.studies import vmapped_runs

MESH1 = dict(data=1, fsdp=1, tensor=1)
AUTO = {"rl.rollout_chunks": 0, "rl.minibatches": 0}

# Hand-computed planner figures (memory_plan.plan's formulas) for the `tiny` preset (hidden D=64, 2 layers, 4 heads of
# 16, 2 KV heads, inter F=128, vocab 512, tied), fp32, remat=none, 4 prompts × G 4 = 16 rows of P 16 + L 48 = T 64
# tokens on one CPU device (the einsum attention path: fp32 [rows, heads, T, T] scores).
PARAM_BYTES = 107072 * 4
RESIDENT = 4 * PARAM_BYTES + 4 * (2 * 16 + 4) * 4  # policy, reference, Adam m and v; the batch
CARRIED = 16 * 48 * 4 * 6 + 16 * 64 * 4 * 3  # the rollout outputs every phase holds
# per training row of a minibatch: saved activations 2 layers × (64·(5D + 8·16 + 4F)·4 + 4·64²·(4+4)), one
# layer's backward 64·(4D + 8·16 + 4F)·4 + 4·64²·8, the logits chunk 3·48·512·4 + 48·D·4
UPDATE_PER_ROW = 2 * (64 * 960 * 4 + 4 * 64 * 64 * 8) + (64 * 896 * 4 + 4 * 64 * 64 * 8) + (3 * 48 * 2048 + 48 * 256)
# per scored row of a rollout chunk (the reference forward): one layer 64·(3D + 8·16 + 2F)·4 + 4·64²·8, its input
# 64·D·4, the logits chunk 2·48·512·4 + 48·D·4
SCORE_PER_ROW = (64 * 576 * 4 + 4 * 64 * 64 * 8) + 64 * 256 + (2 * 48 * 2048 + 48 * 256)


def hand_total(chunks: int, minibatches: int) -> int:
  update = PARAM_BYTES + CARRIED + UPDATE_PER_ROW * 16 // minibatches  # + the gradients
  return RESIDENT + max(CARRIED + SCORE_PER_ROW * 16 // chunks, update)  # the rollout phase peaks lower here


def _tiny(**over):
  c = memory_plan.workload_config("tiny", 4, 4, 16, 48, MESH1, dtype="float32", remat="none")
  return config_lib.override(c, {**AUTO, **over})


def test_the_planner_figures_the_chooser_reads_are_the_hand_computed_ones():
  for c, m in [(1, 1), (1, 2), (1, 4), (2, 4), (16, 16)]:
    p = memory_plan.plan(config_lib.override(_tiny(), {"rl.rollout_chunks": c, "rl.minibatches": m}), MESH1, "cpu")
    assert sum(p.rollout.values()) < sum(p.score.values())
    assert p.total_bytes == hand_total(c, m), (c, m, p.as_dict())
  assert hand_total(1, 1) == 24_913_728 and hand_total(1, 2) == 13_543_232 and hand_total(1, 4) == 9_805_376


@pytest.mark.parametrize("budget,want", [
    (30_000_000, (1, 1)),  # everything fits in one pass: 24.9 MB
    (14_000_000, (1, 2)),  # one minibatch plans 24.9 MB; two 13.5 MB
    (10_000_000, (1, 4)),  # two plan 13.5 MB; four 9.8 MB (the scoring forward now peaks)
    (8_000_000, (2, 4)),   # one chunk's scoring forward alone is 9.8 MB: two chunks, four minibatches, 7.9 MB
])
def test_the_fewest_chunks_then_minibatches_that_fit(budget, want, caplog):
  ctx = auto.Context(MESH1, budget, "cpu")
  assert auto.split_candidates(_tiny(), ctx)[:6] == [(1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (2, 1)]
  with caplog.at_level(logging.INFO):
    out, chosen = auto.resolve(_tiny(), ctx)
  assert (out.rl.rollout_chunks, out.rl.minibatches) == want
  assert hand_total(*want) <= budget
  fewer = [(c, m) for c in (1, 2, 4, 8, 16) for m in (1, 2, 4, 8, 16) if (c, m) < want]
  assert all(hand_total(c, m) > budget for c, m in fewer)
  why = f"planned {hand_total(*want) / 2**20:.2f} MiB of {budget / 2**20:.2f} MiB per device"
  assert chosen["rl.minibatches"] == f"{want[1]} ({why}" + (")" if want == (1, 1) else
                                                           f"; 1 chunk(s) x 1 minibatch(es) would plan 23.76 MiB)")
  line = f"auto rl.rollout_chunks = {want[0]}, rl.minibatches = {want[1]} ({why}"
  assert any(r.getMessage().startswith(line) for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_nothing_fits_is_one_config_line_naming_the_keys():
  with pytest.raises(validate.ConfigError) as e:  # 16 chunks × 16 minibatches still plan 3.6 MB
    auto.resolve(_tiny(), auto.Context(MESH1, 3_000_000, "cpu"))
  msg = str(e.value)
  assert msg.startswith("config.rl.rollout_chunks, rl.minibatches: auto (0) finds no split that fits 2.86 MiB"), msg
  assert "rl.rollout_chunks=16 x rl.minibatches=16, still plans 3.43 MiB" in msg and "\n" not in msg
  assert msg.endswith("; lower rl.prompts_per_step, rl.G or sampling.max_new_tokens, set model.remat=full, or add "
                      "devices (mesh.fsdp)."), msg  # _tiny is remat=none
  # at remat=full already, setting it is no way forward: not advised (it was, to every config)
  with pytest.raises(validate.ConfigError) as e:
    auto.resolve(_tiny(**{"model.remat": "full"}), auto.Context(MESH1, 1_000_000, "cpu"))
  assert str(e.value).endswith("; lower rl.prompts_per_step, rl.G or sampling.max_new_tokens, or add devices "
                               "(mesh.fsdp)."), e.value
  # only minibatches auto, the scoring forward of one chunk too big: the fix names rl.rollout_chunks
  with pytest.raises(validate.ConfigError, match=r"^config.rl.minibatches: auto .* set rl.rollout_chunks=0 \(auto\) "
                     "too \\(the score phase peaks\\)"):
    auto.resolve(_tiny(**{"rl.rollout_chunks": 1}), auto.Context(MESH1, 8_000_000, "cpu"))
  # ... and only rollout_chunks auto with one minibatch set, the update too big: the fix names rl.minibatches
  with pytest.raises(validate.ConfigError, match=r"^config.rl.rollout_chunks: auto .* set rl.minibatches=0 \(auto\) "
                     "too \\(the update phase peaks\\)"):
    auto.resolve(_tiny(**{"rl.minibatches": 1}), auto.Context(MESH1, 14_000_000, "cpu"))
  fixed, chosen = auto.resolve(_tiny(**{"rl.rollout_chunks": 2}), auto.Context(MESH1, 8_000_000, "cpu"))
  assert (fixed.rl.rollout_chunks, fixed.rl.minibatches) == (2, 4)
  assert "rl.minibatches" in chosen and "rl.rollout_chunks" not in chosen  # the set one is left as it is


def test_no_memory_limit_picks_one_and_says_so():
  out, chosen = auto.resolve(_tiny(), auto.Context(MESH1, None))
  assert (out.rl.rollout_chunks, out.rl.minibatches) == (1, 1)
  assert chosen["rl.minibatches"] == "1 (no device memory limit known: the fewest)"
  out, _ = auto.resolve(_tiny(**{"rl.minibatches": 4}), auto.Context(MESH1, None))
  assert (out.rl.rollout_chunks, out.rl.minibatches) == (1, 4)


def test_candidates_are_the_divisors_the_mesh_split_allows():
  c = _tiny()  # 16 rows over data × fsdp = 4: 4 rows a device, so 1, 2 or 4 parts
  assert auto.split_counts(c, auto.Context(dict(data=1, fsdp=4, tensor=1), None)) == [1, 2, 4]
  assert auto.split_counts(config_lib.override(c, {"rl.prompts_per_step": 3}),
                           auto.Context(dict(data=2, fsdp=1, tensor=1), None)) == [1, 2, 3, 6]
  for ppg, G in ((9, 4), (25, 1), (7, 1), (720, 7)):  # against every number up to the rows: squares, primes
    n = ppg * G
    got = auto.split_counts(config_lib.override(c, {"rl.prompts_per_step": ppg, "rl.G": G}), auto.Context(MESH1, None))
    assert got == [d for d in range(1, n + 1) if n % d == 0], (ppg, G)


def _validated(**over):
  c = config_lib.base_config()
  c.mesh.update(data=1, fsdp=2, tensor=1)
  c.eval.update(batch=2 * c.eval.n_samples, size=2 * c.eval.n_samples)
  validate.validate_rl(config_lib.override(c, over), num_devices=2)


def test_validation_takes_zero_as_auto_and_refuses_bad_counts():
  _validated(**AUTO)  # 64 rows over 2 devices
  for key in AUTO:
    for bad, needle in [(-1, "must be a positive integer, or 0 (auto"), (3, "or 0 (auto)"),
                        (64, "divisible by mesh data*fsdp=2")]:
      with pytest.raises(validate.ConfigError) as e:
        _validated(**{key: bad})
      assert str(e.value).startswith(f"config.{key}:") and needle in str(e.value), str(e.value)


def test_step_builders_refuse_an_unresolved_auto():
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.tasks import digits
  import jax
  c = config_lib.override(digits.bench_config(vocab=64, hidden=32, layers=1, heads=2, kv=1, inter=64, prompts=2, G=2,
                                              L=4), {"rl.minibatches": 0})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  for cfg in (c, config_lib.override(c, {"rl.minibatches": 1, "rl.rollout_chunks": 0})):
    key = "rl.minibatches" if cfg.rl.minibatches == 0 else "rl.rollout_chunks"
    with pytest.raises(RuntimeError, match=f"config.{key}=0 \\(auto\\) reached the step builder unresolved"):
      families.make_step(cfg, mesh, mcfg, spec, spec.ctx.tokenizer)
    with pytest.raises(RuntimeError, match=f"config.{key}=0"):
      vmapped_runs.make_steps(cfg, mesh, mcfg, spec, spec.ctx.tokenizer)
  from grpo_jax.config import presets
  from grpo_jax.rl import ppo_step
  with pytest.raises(RuntimeError, match="config.rl.minibatches=0"):
    ppo_step.build_step(presets.apply(c, "ppo"), mcfg, spec, spec.ctx.tokenizer)


class _Built(Exception):
  """Raised by a patched step builder once it has seen the config it was handed."""


def _capture(monkeypatch, module, name="make_step"):
  seen = []

  def fake(config, *a, **k):
    seen.append((config.rl.rollout_chunks, config.rl.minibatches))
    raise _Built()
  monkeypatch.setattr(module, name, fake)
  return seen


def _squeeze(monkeypatch, config, lanes: int = 1) -> tuple[int, int]:
  """Makes this process's device one byte too small for `config` in one chunk and one minibatch; -> the
  (chunks, minibatches) the chooser picks there for `lanes` vmapped runs sharing it (not (1, 1))."""
  from grpo_jax.rollout import decode_layout
  hbm = memory_plan.plan(config_lib.override(config, dict.fromkeys(auto.SPLIT_KEYS, 1)), MESH1).total_bytes - 1
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [hbm])
  out, _ = auto.resolve(config, auto.Context(MESH1, hbm // lanes))
  assert (out.rl.rollout_chunks, out.rl.minibatches) != (1, 1)
  return out.rl.rollout_chunks, out.rl.minibatches


def _arith():
  from configs import grpo_arith  # pylint: disable=g-import-not-at-top
  return config_lib.override(grpo_arith.get_config("small"), {
      "model.hidden": 32, "model.layers": 1, "model.heads": 2, "model.kv_heads": 1, "model.inter": 64,
      "model.max_len": 64, "sft.steps": 0, "rl.G": 4, "rl.prompts_per_step": 2, "sampling.max_new_tokens": 8,
      "eval.size": 4, "eval.batch": 4, "eval.n_samples": 2, "eval.pass_k": (1, 2), "log.tensorboard": False,
      "log.plots": False, "train.steps": 2, "train.plot_every": 0, "train.sample_every": 0, **AUTO})


def test_the_main_job_resolves_before_building_the_step(monkeypatch, tmp_path, caplog):
  """... and logs each knob it chose exactly once (preflight's checks resolve silently), the keys DIR/auto.json
  records."""
  from grpo_jax.run import jobs
  want = _squeeze(monkeypatch, _arith())
  seen = _capture(monkeypatch, families)
  with caplog.at_level(logging.INFO), pytest.raises(_Built):
    jobs.run(_arith(), str(tmp_path / "run"))
  assert seen == [want]
  assert json.load(open(tmp_path / "run" / "config.json"))["rl"]["minibatches"] == 0  # the run records `auto`
  said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("auto ")]
  keys = [k.split(" = ")[0] for line in said for k in line[len("auto "):].split(" (")[0].split(", ")]
  assert sorted(keys) == sorted(json.load(open(tmp_path / "run" / "auto.json"))) and len(set(keys)) == len(keys), said
  assert "rl.minibatches" in keys


def test_an_r1_rl_stage_resolves(monkeypatch, tmp_path):
  from configs import r1_pipeline  # pylint: disable=g-import-not-at-top
  from grpo_jax.r1 import pipeline
  from grpo_jax.r1 import stage_config
  c = r1_pipeline.get_config("small")
  c.model.update(hidden=16, layers=1, heads=2, kv_heads=1, inter=32, max_len=96)
  c.task.train_size = 256
  c.rl.update(G=2, prompts_per_step=2, minibatches=0, rollout_chunks=0)
  c.eval.update(size=4, batch=4, n_samples=2, pass_k=(1, 2))
  want = _squeeze(monkeypatch, stage_config.for_stage(c, "r1_zero"))
  seen = _capture(monkeypatch, families)
  with pytest.raises(_Built):
    pipeline._run_rl(c, str(tmp_path), "r1_zero", None)  # pylint: disable=protected-access
  assert seen == [want]


def test_vmapped_sweep_lanes_resolve(monkeypatch, tmp_path, caplog):
  """Two lanes in one program share each device: they are planned against half its memory. Their evaluations' plan
  (one: the lanes differ in traceable knobs only) is logged once."""
  from grpo_jax.studies import sweep_vmap
  want = _squeeze(monkeypatch, _arith(), lanes=2)
  assert want != _squeeze(monkeypatch, _arith())  # the halving matters here
  seen = _capture(monkeypatch, vmapped_runs, "make_steps")
  lanes = [config_lib.override(_arith(), {"optim.lr": lr}) for lr in (1e-2, 3e-2)]
  with caplog.at_level(logging.INFO), pytest.raises(_Built):
    sweep_vmap.run_group(lanes, [str(tmp_path / "a"), str(tmp_path / "b")], log=lambda line: None)
  assert seen == [want]
  assert sum(r.getMessage().startswith("evaluation (") for r in caplog.records) == 1


def test_ablation_tables_resolve(monkeypatch, caplog):
  import os  # pylint: disable=g-import-not-at-top
  from grpo_jax.config import presets
  from grpo_jax.studies.ablations import r1_table
  from grpo_jax.studies.ablations import train_table
  from grpo_jax.tasks import digits
  seen = _capture(monkeypatch, vmapped_runs, "make_steps")
  # the training tables (d, e, f), from a random init (the shared pre-trained base is not under test here)
  cfg = train_table.table_config("small", (("grpo", presets.overrides("grpo")),))
  cfg.run = config_lib.override(cfg.run, AUTO)
  monkeypatch.setattr(train_table, "start_params", lambda cfg, mcfg, seeds: {"params": None})
  c = train_table.build_config(cfg, {})
  want = [_squeeze(monkeypatch, c, lanes=2)]
  with caplog.at_level(logging.INFO), pytest.raises(_Built):
    train_table.make_runs(cfg, c, digits.toy_reward_spec(c.rewards, c.model.vocab_size), [0, 1])
  # logged once, as a main run logs it (the cell resolved silently and recorded nothing)
  said = [r.getMessage() for r in caplog.records if "rl.rollout_chunks = " in r.getMessage()]
  assert [m.split(" (")[0] for m in said] == ["auto rl.rollout_chunks = %d, rl.minibatches = %d" % want[0]], said
  # the R1-stage table (g)
  cfg = config_lib.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                            "ablations", "gdpo.py"), "small")
  cfg.run = config_lib.override(cfg.run, AUTO)
  variant = r1_table.variants(cfg)[0]
  want.append(_squeeze(monkeypatch, r1_table.build_config(cfg, dict(cfg.variants)[variant]), lanes=2))
  with pytest.raises(_Built):
    r1_table.run_cell(cfg, variant, [0, 1])
  assert seen == want
  # the memory table (c) compiles its workload's step as a run resolves it (it compiled the unresolved reference
  # path: the static engine whatever the workload's length)
  from grpo_jax.studies.ablations import memory_table
  compiled = []

  def compile_step(config, *args, **kwargs):
    compiled.append(config)
    raise _Built()
  monkeypatch.setattr(aot, "compile_step", compile_step)
  cfg = config_lib.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                            "ablations", "memory.py"), "small")
  cfg.workload.L = auto.LONG_COMPLETIONS  # a workload long enough for the continuous engine
  with pytest.raises(_Built):
    memory_table.compile_step(cfg, config_lib.override(config_lib.base_config(), {
        "model.layers": 1, "model.hidden": 32, "model.heads": 2, "model.kv_heads": 1, "model.inter": 64}))
  from grpo_jax.rollout import engine  # pylint: disable=g-import-not-at-top
  # the compaction sizes the slots chosen for the squeezed device halve to (at most 8)
  got = compiled[0].sampling
  assert (got.engine, got.compaction) == ("continuous", len(engine.compaction_sizes(got.slots, config_lib.COMPACTION)))


def test_aot_and_the_planner_cli_resolve(capsys):
  # aot (no compile): the chip's 16 GiB takes the 0.5B step (remat=dots, 64 × G 8, 320 + 512 tokens) only with
  # more minibatches; the report says which and why
  flags = ["--model=qwen2.5-0.5b", "--prompts", "64", "--G", "8", "--prompt-len", "320", "--L", "512", "--remat",
           "dots", "--minibatches", "auto", "--rollout-chunks", "auto", "--json"]
  assert aot.main(flags + ["--topology=v5e:1x1", "--mesh", "data=1,fsdp=1,tensor=1", "--no-compile"]) == 0
  r = json.loads(capsys.readouterr().out)
  c = memory_plan.workload_config("qwen2.5-0.5b", 64, 8, 320, 512, MESH1, remat="dots")
  fit = lambda cm: memory_plan.plan(config_lib.override(c, dict(zip(auto.SPLIT_KEYS, cm))), MESH1, "tpu").total_bytes
  got = (r["rollout_chunks"], r["minibatches"])
  assert got != (1, 1) and fit(got) <= 16 * 2**30 < fit((1, 1)), got
  assert r["auto"]["rl.minibatches"].startswith(f"{got[1]} (planned "), r["auto"]
  # the planner CLI: against --hbm-gib, and with no limit (1, said so)
  assert plan_cli.main(flags + ["--mesh", "data=1,fsdp=1,tensor=1", "--platform", "tpu", "--hbm-gib", "16"]) == 0
  p = json.loads(capsys.readouterr().out)
  assert p["total_bytes"] == fit(got) and p["auto"] == r["auto"]
  assert plan_cli.main(flags[:-1] + ["--mesh", "data=1,fsdp=1,tensor=1"]) == 0
  assert "auto rl.minibatches = 1 (no device memory limit known: the fewest)" in capsys.readouterr().out
  assert plan_cli.main(flags + ["--mesh", "data=1,fsdp=1,tensor=1", "--hbm-gib", "1"]) == 2
  assert "error: config.rl.rollout_chunks, rl.minibatches: auto (0) finds no split" in capsys.readouterr().err


def test_the_word_auto_on_the_command_line_is_the_integer_knobs_auto_value():
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from grpo_jax import cli
  from grpo_jax.config import sweep_points
  registered = [k for knob in auto.REGISTRY.values() for k in knob.keys()]
  assert sorted(registered) == sorted(config_lib.AUTO_KEYS)  # every knob's auto value declared once, in config_lib
  base = config_lib.base_config()
  for k in registered:  # ... and every knob asks for a choice in the base config, but the mesh-free split's
    assert auto._get(base, k) == config_lib.auto_value(k) or k in ("rl.rollout_chunks", "rl.minibatches"), k
  flag = cli.auto_flag
  assert flag("--config.rl.minibatches=auto") == "--config.rl.minibatches=0"
  assert flag("--config.sampling.exit_chunk=auto") == "--config.sampling.exit_chunk=-1"
  assert flag("--config.sampling.engine=auto") == "--config.sampling.engine=auto"
  assert flag("--config.rl.G=auto") == "--config.rl.G=auto"
  assert sweep_points.parse("rl.rollout_chunks=auto,2", config_lib.base_config())[0].overrides == (
      ("rl.rollout_chunks", 0),)
  # through the CLI: the words parse, and validation (which takes 0 as auto) then names the one bad key
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_arith.py:small",
                      "--workdir=/nonexistent/never-written", "--config.rl.minibatches=auto",
                      "--config.rl.rollout_chunks=auto", "--config.rl.mu=0"], cwd=repo, capture_output=True,
                     text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("Config error: config.rl.mu:"), r.stderr


def test_slots_resolve_after_the_chunks_that_bound_them():
  """The registry's order: the path (engine, packing, their lengths) first, then the KV store (every memory plan
  after it depends on it), then sampling.slots' candidates divide the rows by the rollout chunks chosen before them;
  the decode layout last (its plan costs every other choice)."""
  assert list(auto.REGISTRY) == ["sampling.engine", "rl.packing", "rl.train_buckets", "sampling.exit_chunk",
                                 "sampling.decode_attention", "rl.rollout_chunks", "sampling.slots",
                                 "sampling.compaction", "rl.pack_len", "rl.pack_rows", "sampling.decode_layout",
                                 "rl.carry_kv_groups"]  # after the slots it divides
  c = _tiny(**{"sampling.engine": "continuous"})
  free, _ = auto.resolve(c, auto.Context(MESH1, None, "cpu"))
  assert (free.rl.rollout_chunks, free.sampling.slots) == (1, 16)
  tight, chosen = auto.resolve(c, auto.Context(MESH1, 8_000_000, "cpu"))
  assert tight.rl.rollout_chunks == 2 and tight.sampling.slots <= 16 // 2, chosen


def test_registry_is_complete_without_importing_any_step_module():
  """Every auto knob is registered by rl/auto.py itself: a fresh copy of the module, executed on its own, holds all
  of config_lib.AUTO_KEYS. rl.carry_kv_groups was registered by rl/partial.py, so auto.check_choosable in a process
  that had not imported the step yet (validate.py and rl/auto.py alone) skipped its check."""
  import importlib.util
  spec = importlib.util.spec_from_file_location("fresh_auto", auto.__file__)
  fresh = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(fresh)
  assert list(fresh.REGISTRY) == list(auto.REGISTRY)
  assert sorted(k for knob in fresh.REGISTRY.values() for k in knob.keys()) == sorted(config_lib.AUTO_KEYS)
  c = config_lib.override(config_lib.load_config("configs/grpo_arith.py", "small"),
                          {"sampling.engine": "continuous", "rl.partial_rollouts": True, "rl.carry_kv_groups": 3})
  with pytest.raises(config_lib.ConfigError, match="config.rl.carry_kv_groups: 3 must divide each device's 32 slots"):
    fresh.check_choosable(c, MESH1, None)


def test_nothing_fits_stops_the_job_before_anything_is_written(monkeypatch, tmp_path):
  """preflight (and the R1 stages' config checks) run the choice once: a device that no split fits is one config
  line before config.json is written, not an error after it. The R1 pipeline's stages are checked in order: its
  SFT stage (base) is refused first (memory_plan.check_sft_fits), then, without it, its first RL stage."""
  from grpo_jax.rollout import decode_layout
  from grpo_jax.run import jobs
  from configs import r1_pipeline  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(decode_layout, "_HBM_OVERRIDE", [1 << 16])  # a 64 KiB device (the tiny steps plan ~0.8 MiB)
  r1 = config_lib.override(r1_pipeline.get_config("small"), {**AUTO, "rl.G": 2, "rl.prompts_per_step": 2})
  split = "^config.rl.rollout_chunks, rl.minibatches: auto \\(0\\) finds no"
  for c, needle in ((_arith(), split), (r1, r"^config.sft.batch: the SFT step .* \(stage base takes"),
                    (config_lib.override(r1, {"r1.stages": ("r1_zero",)}), split)):
    with pytest.raises(validate.ConfigError, match=needle):
      jobs.run(c, str(tmp_path / c.job))
    assert not (tmp_path / c.job).exists()


def test_a_set_split_that_does_not_fit_is_refused_as_auto_is(monkeypatch, tmp_path, caplog):
  """rl.rollout_chunks / rl.minibatches set by hand are held to auto's rule: a split the planner puts over the
  device is one config line naming the set keys and the value auto picks, before config.json is written (it passed
  preflight and ran out of memory in the compile or the first step); a set split that fits passes; a config the
  planner cannot cost is a warning, not a refusal."""
  from grpo_jax.run import jobs
  want = _squeeze(monkeypatch, _arith())  # the device is one byte short of the 1 x 1 split
  one = config_lib.override(_arith(), dict.fromkeys(auto.SPLIT_KEYS, 1))
  fix = ", ".join(f"{k}={v}" for k, v in zip(auto.SPLIT_KEYS, want) if v != 1)
  with pytest.raises(validate.ConfigError, match=(r"^config.rl.rollout_chunks=1, rl.minibatches=1 \(set\): the step "
                                                  rf"plans .* more than the device holds; set {fix} \(what auto")):
    jobs.run(one, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
  fitting = config_lib.override(_arith(), dict(zip(auto.SPLIT_KEYS, want)))
  mesh = validate.validate_mesh(fitting, 1)
  auto.check_choosable(fitting, mesh)
  monkeypatch.setattr(memory_plan, "plan", lambda *a, **k: (_ for _ in ()).throw(ValueError("no such shape")))
  with caplog.at_level(logging.WARNING):
    auto.check_choosable(config_lib.override(one, {"sampling.decode_layout": "gathered"}), mesh)
  assert "the memory planner cannot cost this config (ValueError: no such shape)" in caplog.text


def test_compaction_only_where_completions_are_long():
  """sampling.compaction=0 (auto): 8 sizes from max_new_tokens 256 (a tail long enough to pay for the decode step
  each size compiles), none below; explicit values kept; a static engine leaves it (a step reads the unresolved 8)."""
  ctx = auto.Context(MESH1, None)
  cont = lambda **o: config_lib.override(config_lib.base_config(), {"sampling.engine": "continuous", **o})
  for L, want in ((48, 1), (255, 1), (256, config_lib.COMPACTION), (1024, config_lib.COMPACTION)):
    c = cont(**{"sampling.max_new_tokens": L, "model.max_len": L + 32, "rl.prompts_per_step": 32})  # 256 slots: 8 sizes
    got, chosen = auto.resolve(c, ctx, log=False)
    assert got.sampling.compaction == want and chosen["sampling.compaction"].startswith(f"{want} (max_new_tokens {L}")
  assert auto.resolve(cont(**{"sampling.compaction": 4}), ctx, log=False)[0].sampling.compaction == 4
  static = auto.resolve(config_lib.override(config_lib.base_config(), {"sampling.engine": "static"}), ctx, log=False)[0]
  assert static.sampling.compaction == 0 and config_lib.setting(static, "sampling.compaction") == config_lib.COMPACTION


def test_compaction_auto_picks_the_sizes_the_slots_halve_to_and_a_recorded_cut_is_said(caplog):
  """3 prompts x G 8 = 24 rows over mesh data=8 at L 256: the slots (24) halve to no other multiple of 8, so the engine
  runs one slot count. auto picked, logged and recorded 8 sizes for it (engine.compaction_sizes cut them to 1 without
  a word); it picks 1 there, and 3 where 32 slots halve to 32, 16, 8. A resume that reuses a recorded 8 over such
  slots says what it runs as (as it ran when recorded: the same program)."""
  from grpo_jax.rollout import engine  # pylint: disable=g-import-not-at-top
  c = lambda prompts: config_lib.override(config_lib.base_config(), {
      "sampling.engine": "continuous", "sampling.max_new_tokens": 256, "model.max_len": 288,
      "rl.prompts_per_step": prompts, "rl.G": 8})
  ctx = auto.Context(dict(data=8, fsdp=1, tensor=1), None, "cpu")
  for prompts, slots, want in ((3, 24, 1), (4, 32, 3)):
    got, chosen = auto.resolve(c(prompts), ctx, log=False)
    assert (got.sampling.slots, got.sampling.compaction) == (slots, want), chosen
    assert len(engine.compaction_sizes(slots, want, 8)) == want  # what the engine runs is what is recorded
    assert chosen["sampling.compaction"].endswith(f"halves to {want} multiple(s) of mesh data*fsdp=8: "
                                                  f"{engine.compaction_sizes(slots, 8, 8)})"), chosen
  # one device: 32 slots halve to 32, 16, ..., 1 (6 sizes); 256 to 8 sizes, the most auto takes
  assert auto.resolve(c(4), auto.Context(MESH1, None, "cpu"), log=False)[0].sampling.compaction == 6
  assert auto.resolve(c(32), auto.Context(MESH1, None, "cpu"), log=False)[0].sampling.compaction == 8
  recorded = {"sampling.engine": "continuous", "sampling.slots": 24, "sampling.compaction": 8}
  with caplog.at_level(logging.INFO):
    auto.resolve(c(3), ctx, recorded=recorded)
  hits = [r for r in caplog.records if r.getMessage().startswith("recorded sampling.compaction = 8 (")]
  assert len(hits) == 1 and hits[0].getMessage().endswith(
      ": runs as 1 slot counts (24,): sampling.slots 24 halves to only 1 multiple(s) of mesh data*fsdp=8; set "
      "sampling.compaction <= 1"), [r.getMessage() for r in caplog.records]


def test_a_set_key_the_resolved_path_does_not_use_is_logged(caplog):
  """A key set for the other path is said to have no effect, not dropped silently: slots / compaction under an
  explicit static engine and pack keys under explicit padded passes as warnings; train buckets (a config's choice
  for the padded passes) beside its "(set)" line when packing is on. Keys the path uses say nothing more."""
  ctx = auto.Context(MESH1, None, "cpu")
  base = config_lib.base_config()
  cases = [({"sampling.engine": "static", "sampling.slots": 8}, logging.WARNING,
            "sampling.slots = 8 (set): no effect with sampling.engine = static"),
           ({"sampling.engine": "static", "sampling.compaction": 2}, logging.WARNING,
            "sampling.compaction = 2 (set): no effect with sampling.engine = static"),
           ({"rl.packing": "off", "rl.pack_len": 128}, logging.WARNING,
            "rl.pack_len = 128 (set): no effect with rl.packing = off"),
           ({"rl.packing": "on", "rl.train_buckets": 3}, logging.INFO,
            "rl.train_buckets = 3 (set): no effect with rl.packing = on")]
  for over, level, line in cases:
    caplog.clear()
    with caplog.at_level(logging.INFO):
      auto.resolve(config_lib.override(base, over), ctx)
    hits = [r for r in caplog.records if r.getMessage().startswith(line)]
    assert len(hits) == 1 and hits[0].levelno == level, [r.getMessage() for r in caplog.records]
  for over in ({"sampling.engine": "continuous", "sampling.slots": 8}, {"rl.packing": "off", "rl.train_buckets": 3},
               {"rl.packing": "on", "rl.pack_len": 128}):
    caplog.clear()
    with caplog.at_level(logging.INFO):
      auto.resolve(config_lib.override(base, over), ctx)
    assert not any("no effect" in r.getMessage() for r in caplog.records), over



def test_a_set_key_for_the_other_path_is_a_warning_only_where_the_user_set_it(caplog):
  """Under a command's record of the keys the user set (config_lib.user_keys_set), a key for the path not taken is a
  warning where the user set it and an info line where only the config (a file, a table's run config) set it; with
  no record (a library caller) every such key is a warning, as above."""
  ctx = auto.Context(MESH1, None, "cpu")
  c = config_lib.override(config_lib.base_config(), {"sampling.engine": "static", "sampling.slots": 8})
  line = "sampling.slots = 8 (set): no effect with sampling.engine = static"
  for user, level in (({"sampling.engine"}, logging.INFO), ({"sampling.slots"}, logging.WARNING),
                      (None, logging.WARNING)):
    caplog.clear()
    with caplog.at_level(logging.INFO), (config_lib.user_keys_set(user) if user is not None
                                         else contextlib.nullcontext()):
      auto.resolve(c, ctx)
    hits = [r for r in caplog.records if r.getMessage().startswith(line)]
    assert len(hits) == 1 and hits[0].levelno == level, (user, [r.getMessage() for r in caplog.records])


def test_a_set_value_the_step_cannot_take_as_set_is_logged_as_it_runs(caplog):
  """More packed rows than a device holds, more train buckets than max_new_tokens has distinct halvings and more
  compaction sizes than the slots halve to were cut without a word (packing.microbatch_rows, update.train_lengths,
  engine.compaction_sizes); now a warning beside the "(set)" line."""
  ctx = auto.Context(MESH1, None, "cpu")  # _tiny: 4 prompts x G 4 = 16 rows on one device, L 48
  cases = [({"rl.packing": "on", "rl.pack_rows": 32, "rl.minibatches": 1},
            "rl.pack_rows = 32 (set): runs as 16: a device holds 16 rows"),
           ({"rl.packing": "on", "rl.pack_rows": 8, "rl.minibatches": 4},
            "rl.pack_rows = 8 (set): runs as 8 in the scoring passes, 4 in the update's (4 minibatches)"),
           ({"rl.packing": "off", "rl.train_buckets": 8},
            f"rl.train_buckets = 8 (set): runs as 7 training lengths {update.train_lengths(48, 8)}"),
           # 12 slots halve to 12, 6, 3 (engine.compaction_sizes): 8 set counts ran as 3 without a word
           ({"sampling.engine": "continuous", "sampling.slots": 12, "sampling.compaction": 8},
            "sampling.compaction = 8 (set): runs as 3 slot counts (12, 6, 3)"),
           ({"sampling.engine": "continuous", "sampling.compaction": 8},  # auto slots: 16, 8, 4, 2, 1
            "sampling.compaction = 8 (set): runs as 5 slot counts (16, 8, 4, 2, 1)")]
  for over, line in cases:
    caplog.clear()
    with caplog.at_level(logging.INFO):
      auto.resolve(_tiny(**over), ctx)
    hits = [r for r in caplog.records if r.getMessage().startswith(line)]
    assert len(hits) == 1 and hits[0].levelno == logging.WARNING, [r.getMessage() for r in caplog.records]
  for over in ({"rl.packing": "on", "rl.pack_rows": 16, "rl.minibatches": 1},
               {"rl.packing": "off", "rl.train_buckets": 7},
               {"sampling.engine": "continuous", "sampling.slots": 12, "sampling.compaction": 3}):
    caplog.clear()
    with caplog.at_level(logging.INFO):
      auto.resolve(_tiny(**over), ctx)
    assert not any("runs as" in r.getMessage() for r in caplog.records), over

def _resolve_cpu(c):
  return auto.resolve(c, auto.Context(MESH1, None, "cpu"), log=False)


def test_the_path_rules():
  """sampling.engine / rl.packing / rl.train_buckets / sampling.exit_chunk (rl/auto.py's rules, docs/performance.md):
  continuous from 256 new tokens, for partial rollouts or a continuous-only key; packing from 20 RL steps on 256 new
  tokens or more, or a packing key; buckets 1 under packing, 2 for a long padded run on long completions; exit
  chunks that divide L."""
  def run(**over):
    return _resolve_cpu(config_lib.override(config_lib.base_config(), {"model.max_len": 2100, **over}))[0]
  r = run(**{"sampling.max_new_tokens": 255, "train.steps": 19})
  assert (r.sampling.engine, r.rl.packing, r.rl.train_buckets, r.sampling.exit_chunk) == ("static", "off", 1, 15)
  r = run(**{"sampling.max_new_tokens": 256, "train.steps": 20})
  # compaction: the 64 slots halve to 7 sizes (64 ... 1) on one device
  assert (r.sampling.engine, r.rl.packing, r.rl.train_buckets, r.sampling.compaction) == ("continuous", "on", 1, 7)
  r = run(**{"sampling.max_new_tokens": 255, "train.steps": 1000})  # short completions: padded, however long the run
  assert (r.sampling.engine, r.rl.packing, r.rl.train_buckets) == ("static", "off", 1)
  assert run(**{"sampling.max_new_tokens": 256, "train.steps": 19}).rl.packing == "off"
  # any spelling validation takes as auto (config_lib.switch) is resolved, not run as if set (it ran padded)
  assert run(**{"sampling.max_new_tokens": 256, "train.steps": 20, "rl.packing": "AUTO"}).rl.packing == "on"
  r = run(**{"sampling.max_new_tokens": 512, "rl.packing": False})  # explicit off: the padded passes' buckets
  assert (r.rl.packing, r.rl.train_buckets) == ("off", 2)
  assert run(**{"sampling.slots": 16}).sampling.engine == "continuous"
  assert run(**{"sampling.decode_attention": "paged"}).sampling.engine == "continuous"
  assert run(**{"train.steps": 2, "rl.pack_rows": 2}).rl.packing == "on"
  assert run(**{"sampling.engine": "static", "sampling.max_new_tokens": 1024}).sampling.engine == "static"  # set
  with_partial = config_lib.base_config()
  with_partial.rl.partial_rollouts = True  # the carry (issue #39): continuous whatever L
  assert _resolve_cpu(with_partial)[0].sampling.engine == "continuous"
  from grpo_jax.rollout import sampling
  assert [sampling.default_exit_chunk(L) for L in (12, 16, 20, 48, 72, 97, 100, 512)] == [16, 16, 20, 16, 18, 16, 20,
                                                                                            16]
  for L in range(17, 300):  # a divisor of L nearest 16 in [8, 32], else 16
    c = sampling.default_exit_chunk(L)
    assert c == 16 or (L % c == 0 and 8 <= c <= 32 and all(L % d for d in range(8, 33) if abs(d - 16) < abs(c - 16)))


def _table_rows() -> dict[str, list[str]]:
  import os  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "docs", "performance.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("## What `auto` resolves to, and why")[1].split("\n## ")[0]
  rows = {}
  for line in section.splitlines():
    cells = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(cells) == 10 and (cells[0].startswith("`configs/") or cells[0].startswith("bench-")):
      rows[re.sub(r" \(.*\)", "", cells[0].replace("`", ""))] = cells[1:8]
  return rows


def test_the_docs_table_is_what_auto_resolves_for_every_shipped_config():
  """docs/performance.md's table, row by row, against auto.resolve on one CPU device (R1 configs: each RL stage's
  config), and every shipped config file has its rows."""
  import glob  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from grpo_jax.r1 import stage_config
  from grpo_jax.tasks import digits
  rows = _table_rows()
  seen_files = set()
  for name, want in rows.items():
    if name.startswith("bench-"):
      c = digits.bench_config(L=int(want[0]))
    else:
      spec, _, stage = name.partition(" ")
      path, _, arg = spec.partition(":")
      seen_files.add(path)
      c = config_lib.load_config(path, arg or None)
      if stage:
        c = stage_config.for_stage(c, stage)
    r = _resolve_cpu(c)[0]
    got = [str(r.sampling.max_new_tokens), str(r.train.steps), r.sampling.engine, r.rl.packing,
           str(r.rl.train_buckets), str(r.sampling.exit_chunk),
           str(r.sampling.compaction) if r.sampling.engine == "continuous" else "-"]
    assert got == want, (name, got, want)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  shipped = {os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "configs", "*.py"))}
  assert shipped == seen_files, shipped ^ seen_files


def test_every_ablation_variant_resolves_to_the_short_completion_path():
  """Every variant of every table in configs/ablations/ (both sizes), built by its table module and resolved as the
  table's runs are (train_table.make_runs: one CPU device, its seeds sharing it): no knob fails to choose, none is
  left at auto, and each takes the path the rules give its completions, all shorter than LONG_COMPLETIONS: the static
  decoder, padded passes, one training length, exit chunks dividing L (the docs table above covers configs/*.py; the
  tables were covered only by their first variant)."""
  import glob  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from grpo_jax.infra import sharding
  from grpo_jax.rollout import sampling
  from grpo_jax.studies import ablate
  mesh = sharding.make_mesh(config_lib.base_config().mesh, jax.devices()[:1])
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  tables, cells = set(), 0
  for path in sorted(glob.glob(os.path.join(root, "configs", "ablations", "*.py"))):
    for arg in (None, "small"):
      cfg = config_lib.load_config(path, arg)
      if "variants" not in cfg:
        continue
      for name, overrides in cfg.variants:
        r, _ = auto.resolve_here(ablate.load_table(cfg).build_config(cfg, overrides), mesh, lanes=cfg.seeds, log=False)
        auto.check_resolved(r)
        L = r.sampling.max_new_tokens
        assert L < auto.LONG_COMPLETIONS and [r.sampling.engine, r.rl.packing, r.rl.train_buckets,
                                              r.sampling.exit_chunk] == ["static", "off", 1,
                                                                         sampling.default_exit_chunk(L)], (path, name)
        tables.add(os.path.basename(path))
        cells += 1
  # the bandit table has no RL run; the memory table compiles its workload as a run resolves it (test above)
  assert tables == {os.path.basename(p) for p in glob.glob(os.path.join(root, "configs", "ablations", "*.py"))} - {
      "baselines.py", "memory.py"} and cells == 92, (sorted(tables), cells)
  # the validators and the resolver read the shared, never-copied config_lib.defaults(): 92 configs built, validated
  # and resolved left it as declared
  assert config_lib.defaults() == config_lib._declared(config_lib._base_config())  # pylint: disable=protected-access


def test_the_traced_step_reads_resolved_values_and_plans_nothing(monkeypatch):
  """The decode layout (and every other knob) is chosen by resolve, before tracing: tracing the whole step with the
  planner patched to fail works; decode_layout.from_config reads the resolved values (an unresolved config: no
  planner, gathered without an fsdp split, the training layout with one)."""
  import jax  # pylint: disable=g-import-not-at-top
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import state as state_lib
  from grpo_jax.rollout import decode_layout
  from grpo_jax.tasks import digits
  c = digits.bench_config(vocab=64, hidden=32, layers=1, heads=2, kv=1, inter=64, prompts=2, G=2, L=4)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  c, chosen = auto.resolve_here(c, mesh, log=False)
  assert c.sampling.decode_layout == "gathered" and "sampling.decode_layout" in chosen

  def planned(*args, **kwargs):
    raise AssertionError("the memory planner ran while the step was traced")
  monkeypatch.setattr(memory_plan, "choose_decode", planned)
  monkeypatch.setattr(memory_plan, "plan", planned)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  step.lower(state_lib.with_shardings(*families.for_config(c).state_spec(c, mesh, mcfg)), aot.abstract_batch(c, mesh))
  m = model_lib.ModelConfig.from_config(config_lib.override(config_lib.base_config(), {}).model)
  fsdp4 = dict(data=1, fsdp=4, tensor=1)
  sc = lambda kind, tp=0: config_lib.override(config_lib.base_config(), {"sampling.decode_layout": kind,
                                                                       "sampling.decode_tp": tp}).sampling
  assert decode_layout.from_config(m, sc("tp", 2), fsdp4) == decode_layout.Layout("tp", 2)
  assert decode_layout.from_config(m, sc("tp"), fsdp4) == decode_layout.Layout("tp", decode_layout.tp_degrees(
      m, fsdp4)[0])
  assert decode_layout.from_config(m, sc("auto"), fsdp4) == decode_layout.Layout("fsdp")
  assert decode_layout.from_config(m, sc("auto"), MESH1) == decode_layout.Layout("gathered")


def test_a_recorded_value_that_no_longer_fits_is_one_config_line():
  """A resume reuses the slots it recorded (32 of 32 rows); with prompts_per_step halved through
  train.allow_config_change they exceed the rows: train.check_recorded names the key and the fix (it was a traceback
  in the engine, exit 1)."""
  from grpo_jax.infra import errors  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import train  # pylint: disable=g-import-not-at-top
  c = config_lib.override(_arith(), {"sampling.engine": "continuous", "sampling.slots": 32, "rl.prompts_per_step": 4})
  train.check_recorded(c, {})  # a fresh run: the rules chose, nothing to check again
  with pytest.raises(errors.ConfigError,
                     match=r"config.sampling.slots: 32 exceeds the 16 .*on resume: sampling.slots=32, the value"):
    train.check_recorded(c, {"sampling.slots": 32})
  # a refusal that names no recorded key: concrete advice (it printed `train.allow_config_change=<key>`)
  with pytest.raises(errors.ConfigError) as e:
    train.check_recorded(c, {"rl.train_buckets": 1, "sampling.exit_chunk": 8})
  assert str(e.value).endswith(" (on resume; change config.sampling.slots to fit the values this run recorded and a "
                               "resume reuses (rl.train_buckets=1, sampling.exit_chunk=8), or use a new --workdir)"), (
                                   e.value)
  assert "<" not in str(e.value), e.value


def test_a_recorded_value_that_no_longer_fits_is_refused_before_config_json_is_rewritten(monkeypatch, tmp_path):
  """The same refusal through the job: it came from the RL set-up after DIR/config.json had been rewritten with the
  refused config (the run's record of what it ran, lost); now from jobs.run_group once the plan accepts the resume,
  before any write. A finished run recorded slots 8 (2 prompts x G 4); prompts_per_step 1 is allowed, the slots
  are not."""
  from grpo_jax.infra import errors  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import jobs, run_config, stages  # pylint: disable=g-import-not-at-top
  wd = str(tmp_path / "run")
  c = config_lib.override(_arith(), {"sampling.engine": "continuous", "train.ckpt_every": 1})
  view = run_config.with_resolved(run_config.view(c, "rl"), {"sampling.slots": 8})
  stages.mark_done(stages.Stage("rl", wd, view, steps=2, own_dir=False))
  os.makedirs(os.path.join(wd, "checkpoints"))
  (tmp_path / "run" / "config.json").write_text("the first run's")
  from grpo_jax.infra import checkpoint  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(checkpoint, "newest_meta", lambda d: (2, {"config": view}))  # what the run saved
  c2 = config_lib.override(c, {"rl.prompts_per_step": 1, "train.allow_config_change": "rl.prompts_per_step"})
  # ... naming the flags that resume with what auto picks for the 4 rows now (it said "set it explicitly", no value)
  with pytest.raises(errors.ConfigError, match=r"config.sampling.slots: 8 exceeds the 4 .*on resume: sampling.slots=8, "
                     r".*; resume with --config.sampling.slots=4 --config.train.allow_config_change="
                     r"rl.prompts_per_step,sampling.slots \(what auto picks here"):
    jobs.run(c2, wd)
  assert (tmp_path / "run" / "config.json").read_text() == "the first run's"
  from grpo_jax.run import preflight  # pylint: disable=g-import-not-at-top
  preflight.check_recorded_values(config_lib.override(c2, {  # the advice followed: accepted
      "sampling.slots": 4, "train.allow_config_change": "rl.prompts_per_step,sampling.slots"}), wd)


def test_a_resume_on_more_devices_than_recorded_is_refused_with_what_auto_picks_there(monkeypatch, tmp_path):
  """A run recorded 4 slots on one device (mesh data=-1: the same config on any device count); resumed on 8 devices
  (validate.elsewhere: the checks' device count) its slots no longer divide over mesh data*fsdp: one line naming the
  recorded value, the devices' rule and the flags that resume with auto's pick there (8)."""
  from grpo_jax.infra import checkpoint, errors  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import preflight, run_config  # pylint: disable=g-import-not-at-top
  c = config_lib.override(_arith(), {"sampling.engine": "continuous"})  # 2 prompts x G 4 = 8 rows
  os.makedirs(tmp_path / "checkpoints")
  view = run_config.with_resolved(run_config.view(c, "rl"), {"sampling.slots": 4})
  monkeypatch.setattr(checkpoint, "newest_meta", lambda d: (2, {"config": view}))
  preflight.check_recorded_values(c, str(tmp_path))  # where it ran: accepted
  with validate.elsewhere(8, None), pytest.raises(errors.ConfigError, match=(
      r"^config.sampling.slots: 4 must be divisible by mesh data\*fsdp=8 .*\(on resume: sampling.slots=4, .*; "
      r"resume with --config.sampling.slots=8 --config.train.allow_config_change=sampling.slots \(what auto picks")):
    preflight.check_recorded_values(c, str(tmp_path))


def test_a_recorded_tp_decode_layout_resumed_on_fewer_devices_names_a_fix_that_resumes(monkeypatch, tmp_path):
  """A run recorded the tensor-parallel decode layout of degree 2 (mesh.fsdp 2); resumed on one device the degree no
  longer divides mesh.fsdp. The refusal advised --config.sampling.decode_tp=0, decode_tp's auto value: with the
  layout still auto the resume took the recorded (tp, 2) again and was refused again, naming the same flags. It names
  the joint key whose pick here is a value: the gathered layout, which resumes."""
  from grpo_jax.infra import checkpoint, errors  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import preflight, run_config  # pylint: disable=g-import-not-at-top
  c = _arith()
  os.makedirs(tmp_path / "checkpoints")
  view = run_config.with_resolved(run_config.view(c, "rl"), {"sampling.decode_layout": "tp", "sampling.decode_tp": 2})
  monkeypatch.setattr(checkpoint, "newest_meta", lambda d: (2, {"config": view}))
  fix = ("--config.sampling.decode_layout=gathered --config.train.allow_config_change=sampling.decode_layout (what "
         "auto picks here")
  with validate.elsewhere(1, None), pytest.raises(errors.ConfigError) as e:
    preflight.check_recorded_values(c, str(tmp_path))
  assert str(e.value).startswith("config.sampling.decode_tp=2: must be >= 2 and divide mesh.fsdp=1") and fix in str(
      e.value), e.value
  with validate.elsewhere(1, None):  # the advice followed: accepted
    preflight.check_recorded_values(config_lib.override(c, {"sampling.decode_layout": "gathered",
                                                            "train.allow_config_change": "sampling.decode_layout"}),
                                    str(tmp_path))


def test_an_r1_stage_resume_whose_recorded_value_no_longer_fits_is_refused_naming_the_stage(monkeypatch, tmp_path):
  """The same refusal for an R1 pipeline's RL stage (each RL stage resolves and records its own `auto` values, in its
  own directory): before DIR/config.json is rewritten, naming the stage whose record it is (it did not)."""
  from configs import r1_pipeline  # pylint: disable=g-import-not-at-top
  from grpo_jax.infra import checkpoint, errors  # pylint: disable=g-import-not-at-top
  from grpo_jax.r1 import pipeline  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import jobs, run_config, stages  # pylint: disable=g-import-not-at-top
  c = r1_pipeline.get_config("small")
  c.model.update(hidden=16, layers=1, heads=2, kv_heads=1, inter=32, max_len=96)
  c.rl.update(G=2, prompts_per_step=4, minibatches=1, rollout_chunks=1)
  c.sampling.engine = "continuous"
  c.eval.update(size=4, batch=4, n_samples=2, pass_k=(1, 2))
  c.r1.stages = ("base", "r1_zero")
  wd = str(tmp_path / "run")
  base, zero = pipeline.stage_list(c, wd, ["base", "r1_zero"])
  stages.mark_done(base)  # the base finished; r1_zero saved step 3 with 8 slots (4 prompts x G 2)
  stages.mark_running(zero)
  os.makedirs(os.path.join(zero.directory, "checkpoints", "3"))
  view = run_config.with_resolved(zero.view, {"sampling.slots": 8})
  ours = lambda d: d.startswith(zero.directory)
  newest, committed = checkpoint.newest_meta, checkpoint.all_committed_steps
  monkeypatch.setattr(checkpoint, "newest_meta", lambda d: (3, {"config": view}) if ours(d) else newest(d))
  monkeypatch.setattr(checkpoint, "all_committed_steps", lambda d: [3] if ours(d) else committed(d))
  (tmp_path / "run" / "config.json").write_text("the first run's")
  c2 = config_lib.override(c, {"rl.prompts_per_step": 2, "train.allow_config_change": "rl.prompts_per_step"})
  with pytest.raises(errors.ConfigError, match=r"^config.sampling.slots: 8 exceeds the 4 .*on resume: sampling.slots=8.*"
                     rf"--config.sampling.slots=4 .* \(stage r1_zero, {zero.directory}\)\.$"):
    jobs.run(c2, wd)
  assert (tmp_path / "run" / "config.json").read_text() == "the first run's"


def test_a_group_whose_runs_recorded_other_choices_is_refused_before_anything_is_written(monkeypatch, tmp_path):
  """Two runs of one vmapped program (a sweep group): one resumes with exit chunks of 8 recorded (an older rule), the
  other starts fresh (16 for L 8). train_group refused them, but only after both config.json files were written (and
  a new run's SFT stage had run); now jobs.run_group refuses before, naming each run's values."""
  from grpo_jax.infra import checkpoint, errors  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import jobs, run_config, stages  # pylint: disable=g-import-not-at-top
  c = _arith()
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  rl = jobs.grpo_stages(c, a)[-1]
  stages.mark_running(rl)
  os.makedirs(os.path.join(a, "checkpoints", "1"))
  view = run_config.with_resolved(rl.view, {"sampling.exit_chunk": 8})
  newest, committed = checkpoint.newest_meta, checkpoint.all_committed_steps
  ours = lambda d: d.startswith(a + os.sep)
  monkeypatch.setattr(checkpoint, "newest_meta", lambda d: (1, {"config": view}) if ours(d) else newest(d))
  monkeypatch.setattr(checkpoint, "all_committed_steps", lambda d: [1] if ours(d) else committed(d))
  (tmp_path / "a" / "config.json").write_text("the first run's")
  with pytest.raises(errors.InputError) as e:
    jobs.run_group([c, config_lib.override(c, {"optim.lr": 2 * c.optim.lr})], [a, b])
  assert (tmp_path / "a" / "config.json").read_text() == "the first run's"
  assert not (tmp_path / "b" / "config.json").exists()
  assert str(e.value).startswith("the runs of one program resolved sampling.exit_chunk differently (a: "
                                 "sampling.exit_chunk=8, b: sampling.exit_chunk=16; "), e.value


def test_a_group_compares_the_compaction_sizes_that_run_not_the_recorded_count(monkeypatch, caplog):
  """sampling.compaction=auto resolves to the sizes 64 slots halve to (7: 64 ... 1); an older run recorded 8, which
  engine.compaction_sizes cuts to the same 7. A group of that run and a new one is one program (it was refused as
  resolving sampling.compaction differently); a run recorded at 4 sizes is another program, still refused."""
  from grpo_jax.infra import errors  # pylint: disable=g-import-not-at-top
  from grpo_jax.rollout import engine  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import preflight  # pylint: disable=g-import-not-at-top
  c = config_lib.override(_arith(), {"sampling.engine": "continuous", "sampling.slots": 64, "rl.G": 32,
                                     "sampling.max_new_tokens": 256, "model.max_len": 320, "rl.rollout_chunks": 1})
  assert len(engine.compaction_sizes(64, 8)) == 7
  records = {"old": {"sampling.compaction": 8}, "new": {}}
  monkeypatch.setattr(preflight, "_recorded", lambda wd: records[wd])
  monkeypatch.setattr(preflight.validate, "device_memory", lambda: None)
  ctx = auto.Context({"data": 1}, None)
  new = auto.resolve(c, ctx, log=False)[0]
  assert new.sampling.compaction == 7  # today's rule: the sizes that run
  with caplog.at_level(logging.INFO):
    old = auto.resolve(c, ctx, recorded=records["old"])[0]
  assert old.sampling.compaction == 8  # the record, reused; today's 7 is the same program, not another pick
  said = [r.getMessage() for r in caplog.records if "sampling.compaction" in r.getMessage()]
  assert len(said) == 1 and said[0].startswith("recorded sampling.compaction = 8 (recorded with this run: a resume "
                                               "runs the program it started with)"), said
  assert "today's rule picks" not in said[0], said
  assert auto.program_values(old, ctx)["sampling.compaction"] == 7
  assert auto.disagree([old, new], ctx)[1] == []  # train_group's comparison
  preflight.check_group_resolves([c, c], ["old", "new"], lanes=2)  # jobs.run_group's: accepted
  records["old"] = {"sampling.compaction": 4}
  with pytest.raises(errors.InputError, match=r"^the runs of one program resolved sampling.compaction differently "
                     r"\(old: sampling.compaction=4, new: sampling.compaction=7; "):
    preflight.check_group_resolves([c, c], ["old", "new"], lanes=2)


def test_a_resume_reuses_the_recorded_resolution(tmp_path, caplog):
  """A run records what `auto` resolved (DIR/auto.json, `resolved.<key>` in each checkpoint's config); a resume
  takes the recorded values even where today's rule picks otherwise (and says so); an explicit value other than
  the recorded one is a config change, refused naming the key; the recorded value set explicitly is not."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from grpo_jax.infra import checkpoint as ckpt_lib
  from grpo_jax.infra import errors
  from grpo_jax.infra import sharding
  from grpo_jax.run import loop_guard
  c = config_lib.override(config_lib.base_config(), {"train.steps": 30, "sampling.max_new_tokens": 260,
                                                     "model.max_len": 512})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  guard = loop_guard.LoopGuard(c, str(tmp_path), "rl")
  first = guard.resolve(c, mesh)
  assert (first.rl.packing, first.sampling.exit_chunk) == ("on", 13) and guard.view["resolved.rl.packing"] == "on"
  with open(tmp_path / "auto.json") as f:
    assert json.load(f)["rl.packing"].startswith("on (train.steps 30 >= 20, max_new_tokens 260 >= 256")
  # the run's checkpoint, as if an older rule had chosen the padded passes and exit chunks of 8
  view = dict(guard.view, **{"resolved.rl.packing": "off", "resolved.sampling.exit_chunk": 8})
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), save_every=1, keep=1, run_config=view)
  ck.maybe_save(1, {"x": np.zeros(2, np.float32)}, {"step": 1}, force=True)
  ck.close()
  again = loop_guard.LoopGuard(c, str(tmp_path), "rl")
  with caplog.at_level(logging.INFO):
    resumed = again.resolve(c, mesh)
  assert (resumed.rl.packing, resumed.sampling.exit_chunk) == ("off", 8)
  assert resumed.rl.pack_len == 0  # packing's own knobs do not apply to the recorded padded passes
  lines = [r.getMessage() for r in caplog.records if "rl.packing = " in r.getMessage()]
  assert lines == ["recorded rl.packing = off (recorded with this run: a resume runs the program it started with; "
                   "today's rule picks on (train.steps 30 >= 20, max_new_tokens 260 >= 256: padding-free passes "
                   "(bench-tail's reference + update 3x faster than padded)))"], lines
  assert again.view["resolved.rl.packing"] == "off"  # recorded again with the next checkpoints
  with open(tmp_path / "auto.json") as f:
    record = f.read()
  assert json.loads(record)["rl.packing"].startswith("off (recorded with this run")  # the values it runs now
  loop_guard.LoopGuard(c, str(tmp_path), "rl").resolve(c, mesh)  # the same values again: the file is kept as it is
  with open(tmp_path / "auto.json") as f:
    assert f.read() == record
  os.remove(tmp_path / "auto.json")
  loop_guard.LoopGuard(c, str(tmp_path), "rl").resolve(c, mesh)  # a lost record is written again
  assert json.load(open(tmp_path / "auto.json"))["rl.packing"].startswith("off (")
  with pytest.raises(errors.InputError, match=r"rl.packing \('off' → 'on'\).*allow_config_change=rl.packing"):
    loop_guard.LoopGuard(config_lib.override(c, {"rl.packing": True}), str(tmp_path), "rl")
  loop_guard.LoopGuard(config_lib.override(c, {"rl.packing": False, "sampling.exit_chunk": 8}), str(tmp_path), "rl")
  # the run finishes: its stage record holds what it resolved (the checkpoints' `resolved.<key>`), so a rerun is
  # judged as a resume is: the resolved values set explicitly are no change (they were refused as 'auto' → 'off'),
  # another value is a change that names what the run ran with
  from grpo_jax.run import run_config, stages  # pylint: disable=g-import-not-at-top
  stage = lambda cfg: stages.Stage("rl", str(tmp_path), run_config.view(cfg, "rl"), steps=30, own_dir=False)
  stages.mark_done(stage(c))
  for same in ({}, {"rl.packing": False, "sampling.exit_chunk": 8}):
    cfg = config_lib.override(c, same)
    assert stages.plan([stage(cfg)], cfg, str(tmp_path)) == {"rl": "skip"}, same
  cfg = config_lib.override(c, {"rl.packing": True})
  with pytest.raises(errors.InputError, match=r"finished stage rl .* rl.packing \('off' → 'on'\)"):
    stages.plan([stage(cfg)], cfg, str(tmp_path))


def test_kl_cov_left_inert_by_the_resolved_split_is_said(tmp_path, caplog):
  """rl.token_select='kl_cov' with rl.mu 1 and rl.minibatches auto: auto picks one minibatch, every update is
  on-policy and KL-Cov's |log pi - log pi_old| is 0 with a zero gradient. validate.py said it only for a set
  minibatches=1 and promised the auto case 'at the check after it resolves'; no check said it on a fresh run. The
  run's resolution (LoopGuard.resolve) says it now; with two updates per batch it is not said."""
  import jax  # pylint: disable=g-import-not-at-top
  from grpo_jax.infra import sharding
  from grpo_jax.run import loop_guard
  c = config_lib.override(_arith(), {"rl.token_select": "kl_cov", "rl.mu": 1, "rl.minibatches": 0})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  for mu, want in ((1, 1), (2, 0)):
    caplog.clear()
    cfg = config_lib.override(c, {"rl.mu": mu})
    with caplog.at_level(logging.WARNING):
      resolved = loop_guard.LoopGuard(cfg, str(tmp_path / f"mu{mu}"), "rl").resolve(cfg, mesh)
    assert resolved.rl.minibatches == 1
    said = [r.getMessage() for r in caplog.records if "for KL-Cov to act" in r.getMessage()]
    assert len(said) == want, (mu, said)


def test_a_recorded_value_reused_on_resume_is_logged_as_the_records_not_autos(caplog):
  """A resume's reused sampling.compaction (8 sizes, recorded where today's rule picks 1 for L 72; and slots, recorded
  as today's rule picks them) is logged as the run's record, never as `auto`'s choice: it was `auto sampling.compaction
  = 8 (...)`, as if today's rule had chosen what it does not."""
  c = config_lib.override(_arith(), {"sampling.engine": "continuous"})
  ctx = auto.Context(MESH1, None, "cpu")
  first, _ = auto.resolve(c, ctx, log=False)
  assert first.sampling.compaction == 1  # today's rule at L 72
  recorded = dict(auto.resolved_values(first), **{"sampling.compaction": 8})
  with caplog.at_level(logging.INFO):
    out, chosen = auto.resolve(c, ctx, recorded=recorded)
  assert (out.sampling.compaction, out.sampling.slots) == (8, first.sampling.slots)
  said = {m.split(" = ")[0]: m for m in (r.getMessage() for r in caplog.records) if " = " in m}
  assert said["recorded sampling.compaction"].startswith(
      "recorded sampling.compaction = 8 (recorded with this run: a resume runs the program it started with; today's "
      "rule picks 1 ("), said
  assert said["recorded sampling.slots"] == (f"recorded sampling.slots = {first.sampling.slots} (recorded with this "
                                             "run: a resume runs the program it started with)"), said
  assert not [k for k in said if k.startswith("auto ")], said  # every auto key came from the record
  assert chosen["sampling.compaction"].startswith("8 (recorded with this run")  # DIR/auto.json's text


def test_a_set_decode_layout_wins_and_is_logged_as_set(caplog):
  """sampling.decode_layout='tp' asks for its degree only where decode_tp is auto: with both set it was logged and
  recorded (DIR/auto.json) as auto's choice, never as "(set)"; with only the degree auto, only the degree is auto's.
  On resume a set layout other than the recorded one (an allowed change) wins: it had been overwritten by the
  recorded layout."""
  fsdp4 = dict(data=1, fsdp=4, tensor=1)
  ctx = auto.Context(fsdp4, None, "cpu")
  c = lambda **o: config_lib.override(_tiny(**{"rl.rollout_chunks": 1, "rl.minibatches": 1}), o)
  with caplog.at_level(logging.INFO):
    out, chosen = auto.resolve(c(**{"sampling.decode_layout": "tp", "sampling.decode_tp": 2}), ctx)
  assert (out.sampling.decode_layout, out.sampling.decode_tp) == ("tp", 2) and not chosen.keys() & {
      "sampling.decode_layout", "sampling.decode_tp"}, chosen
  assert "sampling.decode_layout = tp, sampling.decode_tp = 2 (set)" in [r.getMessage() for r in caplog.records]
  out, chosen = auto.resolve(c(**{"sampling.decode_layout": "tp"}), ctx, log=False)
  assert out.sampling.decode_tp == 2 and "sampling.decode_tp" in chosen and "sampling.decode_layout" not in chosen
  recorded = {"sampling.decode_layout": "gathered", "sampling.decode_tp": 0}  # what an auto run resolved
  out, _ = auto.resolve(c(**{"sampling.decode_layout": "tp"}), ctx, log=False, recorded=recorded)
  assert (out.sampling.decode_layout, out.sampling.decode_tp) == ("tp", 2)
  out, _ = auto.resolve(c(), ctx, log=False, recorded=recorded)  # at auto: the record's
  assert (out.sampling.decode_layout, out.sampling.decode_tp) == ("gathered", 0)


def test_a_recorded_split_this_device_cannot_hold_is_refused_on_resume(monkeypatch, tmp_path):
  """A resume reuses the split its run recorded; resumed on a device that cannot hold it (fewer or smaller devices
  than the first run's) it was accepted and ran out of memory in the compile. Now one config line, before anything
  is written, naming the recorded values and what auto picks here; following its advice resumes, and a recorded
  split that fits is accepted."""
  from grpo_jax.infra import checkpoint  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import preflight, run_config  # pylint: disable=g-import-not-at-top
  c = _arith()
  want = _squeeze(monkeypatch, c)  # this device is one byte short of the 1 x 1 split
  os.makedirs(tmp_path / "checkpoints")
  recorded = lambda split: run_config.with_resolved(run_config.view(c, "rl"), dict(zip(auto.SPLIT_KEYS, split)))
  monkeypatch.setattr(checkpoint, "newest_meta", lambda d: (2, {"config": recorded((1, 1))}))  # a bigger device's
  other = [k for k, v in zip(auto.SPLIT_KEYS, want) if v != 1]
  advice = " ".join(f"--config.{k}={v}" for k, v in zip(auto.SPLIT_KEYS, want) if v != 1)
  with pytest.raises(validate.ConfigError, match=(
      r"^config.rl.rollout_chunks=1, rl.minibatches=1 \(recorded: .*\): the step plans .* more than the device holds; "
      rf"resume with {advice} --config.train.allow_config_change={','.join(other)} \(what auto picks here")):
    preflight.check_recorded_values(c, str(tmp_path))
  preflight.check_recorded_values(config_lib.override(c, {**dict(zip(auto.SPLIT_KEYS, want)),
                                                          "train.allow_config_change": ",".join(other)}),
                                  str(tmp_path))
  monkeypatch.setattr(checkpoint, "newest_meta", lambda d: (2, {"config": recorded(want)}))
  preflight.check_recorded_values(c, str(tmp_path))
  # ... but not by two vmapped runs sharing the device (a sweep group resumed: each gets half of it)
  with pytest.raises(validate.ConfigError, match=r"\(recorded: .* more than the device holds"):
    preflight.check_recorded_values(c, str(tmp_path), lanes=2)


def test_a_recorded_tpu_kernel_is_refused_on_a_cpu_resume(monkeypatch, tmp_path):
  """A run started on a TPU records sampling.decode_attention='tpu_ragged'; resumed on the CPU the record was reused
  and the first trace raised Pallas's 'Only interpret mode is supported on CPU backend' traceback. Now one config
  line before anything is written, naming the record and what auto picks here; its advice resumes; the record is
  still reused on a TPU. A set 'tpu_ragged' on the CPU is one line too."""
  from grpo_jax.infra import checkpoint  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import preflight, run_config  # pylint: disable=g-import-not-at-top
  c = _arith()
  c = config_lib.override(c, {"sampling.engine": "continuous", "model.hidden": 256, "model.heads": 2,
                              "model.kv_heads": 1, "model.head_dim": 128})
  os.makedirs(tmp_path / "checkpoints")
  view = run_config.with_resolved(run_config.view(c, "rl"), {"sampling.decode_attention": "tpu_ragged"})
  monkeypatch.setattr(checkpoint, "newest_meta", lambda d: (2, {"config": view}))
  with pytest.raises(validate.ConfigError, match=(
      r"^config.sampling.decode_attention='tpu_ragged' \(recorded: .*\): 'tpu_ragged' is JAX's TPU kernel, which "
      r"cannot run on platform cpu; resume with --config.sampling.decode_attention=plain "
      r"--config.train.allow_config_change=sampling.decode_attention \(what auto picks here")) as e:
    preflight.check_recorded_values(c, str(tmp_path))
  assert "\n" not in str(e.value)
  preflight.check_recorded_values(config_lib.override(c, {"sampling.decode_attention": "plain",
                                                          "train.allow_config_change": "sampling.decode_attention"}),
                                  str(tmp_path))
  recorded = run_config.recorded_settings(view)
  tpu, chosen = auto.resolve(c, auto.Context(MESH1, None, "tpu"), log=False, recorded=recorded)
  assert tpu.sampling.decode_attention == "tpu_ragged" and "recorded" in chosen["sampling.decode_attention"]
  with pytest.raises(validate.ConfigError, match=r"^config.sampling.decode_attention='tpu_ragged' \(set\): .*"
                     r"platform cpu; set sampling.decode_attention=auto"):
    auto.resolve(config_lib.override(c, {"sampling.decode_attention": "tpu_ragged"}), auto.Context(MESH1, None,
                                                                                                     "cpu"))


def _fake_object_store(root):
  """etils' epath mock: gs://<path> read from root/<path> (the checkpoint code's filesystem, no network)."""
  from etils.epath import testing as epath_testing  # pylint: disable=g-import-not-at-top
  loc = lambda p: os.path.join(str(root), os.fspath(p).split("://", 1)[1])
  return epath_testing.mock_epath(exists=lambda fn, p: os.path.exists(loc(p)), isdir=lambda fn, p: os.path.isdir(loc(p)),
                                  listdir=lambda fn, p: os.listdir(loc(p)),
                                  open=lambda fn, p, *a, **k: open(loc(p), *a, **k))


def test_resume_checks_read_object_store_paths_through_the_checkpoint_filesystem(tmp_path, caplog):
  """preflight skipped the resume check (and the init_from checks) for any '://' path: a gs:// run that recorded
  tpu_ragged resumed on a CPU passed preflight. They now read through epath, as the checkpoint code does (here a
  fake gs:// over a local directory); a store this host cannot read is skipped with a warning naming why."""
  from etils.epath import testing as epath_testing  # pylint: disable=g-import-not-at-top
  from grpo_jax.run import preflight, run_config  # pylint: disable=g-import-not-at-top
  c = config_lib.override(_arith(), {"sampling.engine": "continuous", "model.hidden": 256, "model.heads": 2,
                                     "model.kv_heads": 1, "model.head_dim": 128})
  step = tmp_path / "bucket" / "run" / "checkpoints" / "2"
  os.makedirs(step / "meta")
  (step / "commit_success.txt").write_text("")
  view = run_config.with_resolved(run_config.view(c, "rl"), {"sampling.decode_attention": "tpu_ragged"})
  (step / "meta" / "metadata").write_text(json.dumps({"step": 2, "config": view}))
  with _fake_object_store(tmp_path):
    with pytest.raises(validate.ConfigError, match=r"^config.sampling.decode_attention='tpu_ragged' \(recorded"):
      preflight.check_recorded_values(c, "gs://bucket/run")
    with pytest.raises(errors.InputError, match=r"^config.train.init_from=gs://bucket/run is a run directory"):
      preflight.check_init_from("train.init_from", "gs://bucket/run")
    with pytest.raises(errors.InputError, match=r"^config.train.init_from=gs://bucket/nothing does not exist"):
      preflight.check_init_from("train.init_from", "gs://bucket/nothing")
  def unreadable(fn, p):
    raise ImportError("Please install gcsfs to access Google Storage")
  caplog.set_level(logging.WARNING)
  with epath_testing.mock_epath(exists=unreadable, isdir=unreadable):
    preflight.check_recorded_values(c, "gs://bucket/run")
    preflight.check_init_from("train.init_from", "gs://bucket/run")
  warned = [r.getMessage() for r in caplog.records if "skipped: this host cannot read it" in r.getMessage()]
  assert len(warned) == 2 and "ImportError: Please install gcsfs" in warned[0], warned


def test_a_knob_that_did_not_apply_when_recorded_chooses_on_resume():
  """A run records every knob's value, also one that did not apply (slots, compaction, decode attention: still at
  auto under the static engine). A resume whose allowed change makes it apply (the continuous engine set) took those
  auto values as the record's choice: slots 0, the unresolved 8 compaction sizes, the backend's attention, logged
  as 'recorded'. Now they are chosen as a fresh run chooses them; what the record did choose is still reused."""
  from grpo_jax.run import run_config  # pylint: disable=g-import-not-at-top
  ctx = auto.Context(MESH1, None, "cpu")
  first, _ = auto.resolve(_tiny(**{"rl.packing": "off"}), ctx, log=False)  # static engine (L 48)
  assert first.sampling.engine == "static" and first.sampling.slots == 0
  recorded = run_config.recorded_settings(run_config.with_resolved(run_config.view(_tiny(), "rl"),
                                                                   auto.resolved_values(first)))
  changed = _tiny(**{"sampling.engine": "continuous", "rl.packing": "off"})
  fresh, _ = auto.resolve(changed, ctx, log=False)
  resumed, chosen = auto.resolve(changed, ctx, log=False, recorded=recorded)
  keys = ("sampling.slots", "sampling.compaction", "sampling.decode_attention")
  assert [auto._get(resumed, k) for k in keys] == [auto._get(fresh, k) for k in keys] == [16, 1, "plain"]
  assert not any("recorded" in chosen[k] for k in keys), chosen
  assert resumed.sampling.exit_chunk == first.sampling.exit_chunk and "recorded" in chosen["sampling.exit_chunk"]


# ------------------------------------------------------------------------------------- an evaluation's own plan


def _eval_plan(c, ctx, **kw) -> dict:
  out, _ = auto.resolve_eval(c, ctx, log=False, **kw)
  return {k: auto._get(out, k) for k in auto.EVAL_KEYS}  # pylint: disable=protected-access


# rl.* values an SFT job does not read, each of which fed the plan of its final evaluation (the RL batch, the carry,
# the memory splits, the reference, the packed passes, dynamic sampling's extra rows)
RL_ONLY = ({"rl.partial_rollouts": True}, {"rl.prompts_per_step": 64}, {"rl.G": 2}, {"rl.rollout_chunks": 4},
           {"rl.minibatches": 0}, {"rl.beta": 0.0}, {"rl.packing": "on"},
           {"rl.dynamic_sampling": True, "rl.oversample": 3})


def test_an_evaluations_decode_plan_is_what_it_decodes_not_the_rl_batch():
  """An evaluation's `auto` knobs (engine, exit chunk, compaction, decode attention and layout) are planned from what
  it decodes: eval.batch rows in one call, the mesh, the lengths (auto.resolve_eval). SFT's final evaluation resolved
  them for the RL step: rl.partial_rollouts turned the continuous engine on (its 8 compaction sizes unresolved),
  prompts_per_step x G sized the compaction and the decode layout's memory, and a device too small for the RL batch
  stopped the finished SFT run at its evaluation (no split fits), none of it a key the job reads."""
  c = config_lib.load_config("configs/grpo_arith.py", "small")  # L = 72: the static engine
  c.job = "sft"
  cpu = auto.Context(MESH1, None, "cpu")
  base = _eval_plan(c, cpu)
  assert base["sampling.engine"] == "static" and base["sampling.exit_chunk"] == 18
  for upd in RL_ONLY:
    assert _eval_plan(config_lib.override(c, upd), cpu) == base, upd
  # long completions over 4 devices of 1.84 MB: the continuous engine, compaction and the decode layout all planned
  c = config_lib.override(c, {"sampling.max_new_tokens": 256})
  small = auto.Context(dict(data=1, fsdp=4, tensor=1), 1_840_000, "gpu")
  base, few = _eval_plan(c, small), _eval_plan(config_lib.override(c, {"eval.batch": 8}), small)
  # they follow eval.batch: 32 rows halve to 4 sizes over 4 devices (32 ... 4), 8 rows to 2; 8 rows' decode fits
  # gathered (the policy, its Adam moments and the decode: 1.79 MB planned; with the RL state's reference of
  # rl.beta=0.04 beside it 1.90 MB, with the RL step's update far more), 32 rows' does not (4.9 MB)
  assert base["sampling.engine"] == "continuous" and c.eval.batch == 32
  assert base["sampling.compaction"] == 4 and base["sampling.decode_layout"] != "gathered"
  assert few["sampling.compaction"] == 2 and few["sampling.decode_layout"] == "gathered"
  for upd in RL_ONLY:
    assert _eval_plan(config_lib.override(c, upd), small) == base, upd
    assert _eval_plan(config_lib.override(c, {**upd, "eval.batch": 8}), small) == few, upd
  # a set value wins, as in a run
  assert _eval_plan(config_lib.override(c, {"sampling.engine": "static"}), small)["sampling.engine"] == "static"
  assert _eval_plan(config_lib.override(c, {"sampling.compaction": 3}), small)["sampling.compaction"] == 3


def test_sft_evaluation_decodes_the_same_program_whatever_rl_says(tmp_path):
  """The same SFT job with other rl.* values evaluates with the same generate program (its lowered text), so it
  writes the same eval metrics; the Evaluator plans an unresolved config itself (rl.partial_rollouts made it the
  continuous engine's program)."""
  import jax  # pylint: disable=g-import-not-at-top
  from grpo_jax.infra import sharding
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import state as state_lib
  from grpo_jax.run import evaluation
  from grpo_jax.tasks import data as data_lib
  from grpo_jax.tasks import tokenizer_factory as tok_lib
  c = config_lib.override(_arith(), {"job": "sft", "sft.steps": 2})
  tok, mcfg = tok_lib.for_config(c), model_lib.ModelConfig.from_config(c.model)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  arrays = data_lib.eval_set(c.task, tok, c.eval.size, c.task.prompt_len)

  def lowered(cfg):
    ev = evaluation.Evaluator(cfg, mcfg, tok, mesh, arrays)
    fields = {k: v for k, v in arrays.items() if k not in ("prompt_NxP", "prompt_mask_NxP")}
    with sharding.mesh_context(mesh):
      text = ev.greedy.jitted.lower(state_lib.abstract_params(mesh, mcfg), arrays["prompt_NxP"],
                                    arrays["prompt_mask_NxP"], fields, jax.random.PRNGKey(0)).as_text()
    return ev.cfg, text
  cfg, text = lowered(c)
  other_cfg, other_text = lowered(config_lib.override(c, {"rl.partial_rollouts": True, "rl.G": 2,
                                                          "rl.prompts_per_step": 3}))
  assert cfg.sampling.engine == other_cfg.sampling.engine == "static"
  assert text == other_text


def test_a_rerun_setting_what_the_sft_stages_evaluation_resolved_is_no_change(monkeypatch, tmp_path):
  """The main job's SFT stage reads sampling.* (its final evaluation decodes with them) and its record held them as
  `auto`: a rerun setting sampling.engine=static etc. (what DIR/auto.json says the run resolved, and what that
  evaluation planned too) was refused by the finished SFT stage as 'auto' → 'static', against docs/performance.md's
  "a rerun that sets a key to what `auto` chose is no change". Its record now holds what its evaluation resolved;
  another value is still a change."""
  from grpo_jax.infra import errors
  from grpo_jax.infra import sharding
  from grpo_jax.run import evaluation, run_config, stages, train
  import jax  # pylint: disable=g-import-not-at-top

  class NoEval:  # the stage's evaluation itself is not the point (test_sft_evaluation_decodes_the_same_program...)
    def __init__(self, *a, **k):
      pass

    def __call__(self, *a, **k):
      return {}, []
  monkeypatch.setattr(evaluation, "Evaluator", NoEval)
  c = config_lib.override(_arith(), {"sft.steps": 1, "sft.batch": 4, "model.max_len": 128})
  sft = stages.Stage("sft", str(tmp_path / "sft"), run_config.view(c, "sft"), steps=1)
  stages.prepare(sft, "start", str(tmp_path))
  train.run_sft(c, sft.directory, record=sft.view)
  stages.mark_done(sft)
  planned, _ = auto.resolve_eval(c, auto.Context(dict(sharding.make_mesh(c.mesh, jax.devices()[:1]).shape),
                                                 None, "cpu"), log=False)
  same = {k: v for k, v in auto.resolved_values(planned).items() if k in auto.EVAL_KEYS}
  assert same["sampling.engine"] == "static", same
  # the RL stage after it, finished with what `auto` resolved for its rollout (its checkpoints' resolved.<key>)
  rl_resolved = auto.resolved_values(auto.resolve(c, auto.Context({"data": 1, "fsdp": 1, "tensor": 1}, None, "cpu"),
                                                  log=False)[0])
  assert all(rl_resolved[k] == v for k, v in same.items()), (rl_resolved, same)  # the values a user reads there
  stages.mark_done(stages.Stage("rl", str(tmp_path), run_config.with_resolved(
      run_config.view(c, "rl", extra={"stage.upstream": stages.upstream(sft)}), rl_resolved), steps=2, own_dir=False))

  def job(cfg):  # jobs.grpo_stages' two stages for `cfg`
    s = stages.Stage("sft", sft.directory, run_config.view(cfg, "sft"), steps=1)
    return [s, stages.Stage("rl", str(tmp_path), run_config.view(cfg, "rl", extra={"stage.upstream": stages.upstream(
        s)}), steps=2, own_dir=False)]
  for over in ({}, same):
    cfg = config_lib.override(c, over)
    # the RL stage was refused too, as 'stage sft it starts from changed': the SFT view's fingerprint moved with the
    # spelling ('auto' → 'static') although the SFT stage itself is no change
    assert stages.plan(job(cfg), cfg, str(tmp_path)) == {"sft": "skip", "rl": "skip"}, over
  cfg = config_lib.override(c, {"sampling.engine": "continuous"})
  with pytest.raises(errors.InputError, match=r"finished stage sft .* sampling.engine \('static' → 'continuous'\)"):
    stages.plan(job(cfg), cfg, str(tmp_path))
  cfg = config_lib.override(c, {"sampling.engine": "continuous", "train.allow_config_change": "sampling.engine"})
  with pytest.raises(errors.InputError, match=r"finished stage rl .* stage.upstream \(stage sft it starts from "):
    stages.plan(job(cfg), cfg, str(tmp_path))  # an upstream that continues with a change still moves its fingerprint


def test_an_rl_runs_evaluation_is_planned_from_its_unresolved_config(monkeypatch, tmp_path):
  """train_group plans the held-out evaluation before anything is traced, from the member's config as given (auto
  values unresolved: the rollout's choices are not the evaluation's), beside the resident RL state."""
  from grpo_jax.run import jobs
  seen = []
  real = auto.resolve_eval_here

  def spy(config, mesh, rl_state=False, lanes=1, log=True):
    seen.append((config.rl.minibatches, config.sampling.engine, rl_state))
    return real(config, mesh, rl_state=rl_state, lanes=lanes, log=log)
  monkeypatch.setattr(auto, "resolve_eval_here", spy)
  _capture(monkeypatch, families)
  with pytest.raises(_Built):
    jobs.run(_arith(), str(tmp_path / "run"))
  assert seen == [(0, "auto", True)]


def test_rejection_sampling_and_the_task_tables_plan_their_own_decodes():
  """The other decodes outside an RL step plan theirs as an evaluation does: R1's rejection sampling (one generate
  batch of r1.report.batch rows, n per prompt) decoded unresolved (on an FSDP mesh the training layout, every weight
  all-gathered at every token; under tools.env 8 compaction sizes for any length); the task tables' greedy
  evaluation and pass@k sampler reused the variant's rollout plan (rl.* their cache key leaves out)."""
  import types  # pylint: disable=g-import-not-at-top
  from configs import tools_calc  # pylint: disable=g-import-not-at-top
  from grpo_jax.r1 import rejection
  from grpo_jax.studies.ablations import task_table
  c = config_lib.override(tools_calc.get_config("small"), {"mesh.fsdp": 4, "mesh.data": 1})
  mesh = types.SimpleNamespace(shape=dict(data=1, fsdp=4, tensor=1))
  d = rejection.decode_config(c, mesh)
  rows = c.r1.report.batch // c.r1.rejection.n * c.r1.rejection.n
  assert d.sampling.engine == "continuous" and d.sampling.decode_layout == "gathered"  # tools.env; it fits
  assert d.sampling.compaction == 1 < config_lib.COMPACTION and c.sampling.max_new_tokens < auto.LONG_COMPLETIONS
  assert d.sampling.exit_chunk != -1 and d.eval.batch == rows
  cfg = types.SimpleNamespace(passk_n=8, passk_chunk=4)
  run = task_table.run_config(small=True)
  one = task_table.eval_configs(cfg, run, mesh, 2)
  other = task_table.eval_configs(cfg, config_lib.override(run, {"rl.partial_rollouts": True, "rl.G": 2}), mesh, 2)
  plan = lambda x: {k: auto._get(x, k) for k in auto.EVAL_KEYS}  # pylint: disable=protected-access
  assert [plan(x) for x in one] == [plan(x) for x in other]
  assert one[0].sampling.engine == "static" and one[1].eval.batch == 32 and one[1].eval.n_samples == 8


@pytest.mark.parametrize("bad, needle", [
    ({"sampling.engine": "foo"}, "config.sampling.engine: unknown value 'foo'"),
    ({"sampling.exit_chunk": -2}, "config.sampling.exit_chunk: must be an integer >= 0"),
    ({"sampling.decode_layout": "tp", "sampling.decode_tp": 3}, "config.sampling.decode_tp=3: must be >= 2"),
    ({"sampling.temperature": 0.0}, "config.sampling.temperature: must be > 0"),
    ({"sampling.max_new_tokens": 100}, "config.sampling.max_new_tokens: task.prompt_len + sampling.max_new_tokens"),
    # validation takes the kernel's shape (head_dim 128); the evaluation's plan (auto.resolve_eval) refuses it here
    ({"model.hidden": 256, "model.heads": 2, "sampling.decode_attention": "tpu_ragged"},
     "config.sampling.decode_attention='tpu_ragged' (set): 'tpu_ragged' is JAX's TPU kernel, which cannot run on "
     "platform cpu"),
])
def test_an_sft_jobs_evaluation_settings_are_refused_before_it_trains(tmp_path, bad, needle):
  """job=sft decodes once, in its final evaluation; the sampling keys it reads went unchecked by preflight (only
  validate_rl checked them), so a bad one failed, or decoded wrongly, after the whole SFT had trained. Now one line
  before anything is written."""
  from grpo_jax.run import jobs  # pylint: disable=g-import-not-at-top
  c = config_lib.override(_arith(), {"job": "sft", "sft.steps": 2, "model.max_len": 128, **bad})
  with pytest.raises(errors.ConfigError) as e:
    jobs.check(c, str(tmp_path / "run"))
  assert str(e.value).startswith(needle) and "\n" not in str(e.value), e.value
  assert not os.path.exists(tmp_path / "run")
  jobs.check(config_lib.override(c, {"job": "pretrain"}), str(tmp_path / "run"))  # it decodes nothing: not checked


def test_run_sft_checks_its_evaluations_settings_before_it_trains(tmp_path, monkeypatch):
  """train.run_sft called as a library (no preflight) checks them too, before its step is built."""
  from grpo_jax.run import train  # pylint: disable=g-import-not-at-top
  built = []
  monkeypatch.setattr(families, "make_step", lambda *a, **k: built.append(1))
  c = config_lib.override(_arith(), {"job": "sft", "sft.steps": 2, "model.max_len": 128, "sampling.engine": "foo"})
  with pytest.raises(errors.ConfigError, match="^config.sampling.engine: unknown value 'foo'"):
    train.run_sft(c, str(tmp_path / "run"))
  assert not built
