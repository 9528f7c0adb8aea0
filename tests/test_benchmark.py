"""The benchmark's own arithmetic (scaling fits, HLO loop-body op counts, the same-run matmul peak, its config) and the
realistic-lengths mode: the shared checkpoint and tokenizer (make_stop_checkpoint.py), grpo_step.py --model-dir."""
import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.jit_call import jit_call

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import grpo_step  # noqa: E402
import profile_parts  # noqa: E402


def test_scaling_fits_recover_known_coefficients():
  Ls = [8, 16, 32, 64]
  ts = [0.05 + 2e-3 * L + 3e-5 * L * L for L in Ls]
  np.testing.assert_allclose(grpo_step.fit_scaling(Ls, ts, 2), [0.05, 2e-3, 3e-5], rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose(grpo_step.fit_scaling([2, 4, 8], [0.1, 0.18, 0.34], 1), [0.02, 0.04], atol=1e-9)


def test_loop_body_ops_finds_scan_bodies():
  def body(c, x):
    return jnp.sin(c) * x + 1.0, None

  with_loop = jax.jit(lambda c, xs: jax.lax.scan(body, c, xs)[0]).lower(
      jnp.ones(3), jnp.ones((5, 3))).compile().as_text()
  counts = profile_parts.loop_body_ops(with_loop)
  assert len(counts) == 1 and list(counts.values())[0] >= 2, counts
  no_loop = jax.jit(lambda c: jnp.sin(c) + 1.0).lower(jnp.ones(3)).compile().as_text()
  assert profile_parts.loop_body_ops(no_loop) == {}


def test_matmul_peaks_take_the_best_measured_rate():
  pk = grpo_step.matmul_peaks(256, 64, 128, reps=3, square=256)
  assert set(pk) == {"xla_model_shape", "xla_square", "numpy_square", "peak"}
  assert pk["peak"] == max(v for k, v in pk.items() if k != "peak")
  assert all(1e8 < v < 1e13 for v in pk.values()), pk  # 0.1 GFLOP/s .. 10 TFLOP/s on any CPU


def test_accelerator_line_is_per_device_at_the_compute_dtype():
  """MFU per device against the compute dtype's peak, decode bytes at the compute dtype, by hand (flops.py's TINY
  shape: 184 weight params read per decode step, 2 rows, prompt 3, L 3 = 2 decode steps)."""
  from grpo_jax.model import model as model_lib
  tiny = model_lib.ModelConfig(vocab_size=10, hidden=4, layers=1, heads=2, kv_heads=1, head_dim=2, inter=8, max_len=8)
  # bf16: weights 184·2 B × 2 steps = 736; K+V slot 2·1·2·2 B = 8 B: reads 2·(4+5)·8 = 144, writes 2·2·8 = 32 -> 912
  # the step's 989 TFLOP/s over 2 devices is half an H100 each; decode at 912 B / s_ro = half of 3.35 TB/s
  s_ro = 912 / (0.5 * 3.35e12)
  line = grpo_step.accelerator_line(tiny, "bfloat16", "NVIDIA H100 80GB HBM3", 2, 3, 3, 989e12, 2, 989e12 / 4, s_ro)
  assert "MFU step 50.0% update 25.0% (bfloat16 peak 989 TFLOP/s)" in line, line
  assert "decode HBM 1675 GB/s = 50.0% of 3.35 TB/s" in line, line
  # fp32 at JAX's default precision runs on TF32 tensor cores (half the bf16 peak), not at the 67 TFLOP/s of CUDA cores
  line = grpo_step.accelerator_line(tiny, "float32", "NVIDIA H100 80GB HBM3", 2, 3, 3, 494.5e12, 1, 1.0, 1.0)
  assert "MFU step 100.0%" in line and "(float32 peak 494 TFLOP/s)" in line, line
  # a v5p TPU VM's device_kind is "TPU v5"; a CPU has no row
  assert "(float32 peak 459 TFLOP/s)" in grpo_step.accelerator_line(tiny, "float32", "TPU v5", 2, 3, 3, 1, 1, 1, 1)
  assert grpo_step.accelerator_line(tiny, "float32", "cpu", 2, 3, 3, 1.0, 1, 1.0, 1.0) is None


def test_part_times_count_the_tokens_drawn_not_padding(monkeypatch):
  """decode tokens/s counts the rollout's completion tokens: at vocab 16 a random model draws EOS once in ~16
  tokens, so most of the 4 rows × 24 positions are padding after EOS."""
  a = argparse.Namespace(hidden=16, layers=1, heads=2, kv=1, inter=32, vocab=16, prompts=2, G=2, L=24,
                         dtype="float32", attention="auto")
  built, parts = [], profile_parts.parts

  def rollout_only(*x, **k):  # the rollout program alone: no reference or update to compile
    mesh, fns = parts(*x, **k)
    built.append(fns["rollout"])
    return mesh, {"rollout": fns["rollout"]}
  monkeypatch.setattr(profile_parts, "parts", rollout_only)
  monkeypatch.setattr(profile_parts, "time_fn", lambda fn, args, reps: 1.0)  # the count, not the clock
  pt = grpo_step.part_times(a, reps=1)
  fn, args = built[0]
  lens_N = np.asarray(jax.jit(fn)(*args).mask_NxL).sum(1)  # the same function parts() ran: compiled once
  want = int(lens_N.sum())
  assert pt["rollout"] == 1.0 and pt["rollout_tokens"] == want and want < 4 * 24, (pt, want)
  np.testing.assert_array_equal(pt["completion_lens_N"], lens_N)
  from grpo_jax.tasks import digits
  pmask = next(digits.make_batches(a.prompts, 1))["prompt_mask_NxP"]  # each prompt G times
  np.testing.assert_array_equal(pt["prompt_lens_N"], np.repeat(np.asarray(pmask).sum(1), a.G))


def test_update_flops_per_second_divides_the_parts_batch_flops_by_the_parts_time(monkeypatch):
  """The update's FLOP/s is the FLOPs of the batch the timed update/reference programs ran on (the parts' rollout),
  not of the timed run's batches: here the run's completions are 4x longer than the parts' (by hand: one row,
  prompt 3, completion 1 -> one forward over 4 tokens with the head at 1; update = 4 forwards)."""
  from grpo_jax.model import model as model_lib
  tiny = model_lib.ModelConfig(vocab_size=10, hidden=4, layers=1, heads=2, kv_heads=1, head_dim=2, inter=8, max_len=8)
  # per token 2·(4·2·2·2 + 4·1·2·2 + 3·4·8) = 2·(32 + 16 + 96) = 288; attention 2·2·1·2·2·(4·5/2) = 160; head 2·4·10
  fwd = 288 * 4 + 160 + 80
  pt = dict(rollout=1.0, reference=0.25, update=0.75, rollout_tokens=1, prompt_lens_N=np.array([3]),
            completion_lens_N=np.array([1]))
  monkeypatch.setattr(grpo_step, "part_times", lambda a: pt)
  monkeypatch.setattr(grpo_step, "matmul_peaks", lambda m, k, n: dict(xla_model_shape=1.0, xla_square=1.0,
                                                                       numpy_square=1.0, peak=1.0))
  a = argparse.Namespace(prompts=1, G=1, L=4, hidden=4, inter=8, dtype="float32")
  ours = dict(mcfg=tiny, times=[1.0], median=1.0, prompt_lens=np.array([3]), completion_lens=np.array([4]),
              old_logprobs=False, step_devices=1)
  grpo_step.perf_report(a, ours)
  assert ours["update_fps"] == pytest.approx(4 * fwd / (0.25 + 0.75)), (ours["update_fps"], 4 * fwd)


def test_peers_run_our_flags_and_one_step_more(tmp_path, capsys):
  """A stand-in peer interpreter echoes its flags in its RESULT line: same shape, prompts, G and L as ours, and one
  step more, so that, leaving its first (compiling) step out as ours leaves batch 0, it counts batches 1..steps."""
  fake = tmp_path / "python"
  fake.write_text('#!/bin/sh\nshift\necho "RESULT trl_s_per_step=0.5 $*"\n')
  fake.chmod(0o755)
  a = argparse.Namespace(**{**grpo_step.FLAGS, "steps": 4, "model_dir": ""})
  got = grpo_step.run_peer(str(fake), "trl_grpo_bench.py", a, "trl_s_per_step")
  assert got == {"trl_s_per_step": 0.5, **{k: float(v) for k, v in grpo_step.FLAGS.items()}, "steps": 5.0}, got


def test_bench_config_logs_every_row_and_sets_attention():
  a = argparse.Namespace(hidden=32, layers=1, heads=2, kv=1, inter=64, vocab=64, prompts=3, G=4, L=8,
                         dtype="float32", remat="none", attention="dot_product")
  c = grpo_step.bench_config(a)
  assert c.train.num_samples_logged == 12  # FLOPs count each row's real completion length
  assert c.model.attention == "dot_product" and c.rl.G == 4 and c.sampling.max_new_tokens == 8


def test_early_exit_tokenizer_ends_rows_early_but_never_on_the_answer_or_pad():
  """--early-exit's EOS set: the workload's EOS plus the top sixth of the ids (a random model draws one every ~6
  tokens), never the pad or a digit the reward reads."""
  from grpo_jax.tasks import digits
  tok = grpo_step.EndsEarly(2048)
  ids = set(tok.eos_ids)
  assert digits.EOS in ids and len(ids) == 1 + 2048 // 6 and max(ids) == 2047
  assert not ids & ({digits.PAD} | set(range(digits.DIGIT0, digits.DIGIT0 + 10)))
  assert (1 - (len(ids) - 1) / 2048) ** 64 * 64 < 1e-3  # a batch of 64 rows ends by 64 tokens almost surely


# ------------------------------------------------------------------ realistic lengths (grpo_step.py --model-dir)

TINY_SHAPE = dict(hidden=32, layers=1, heads=2, kv=1, inter=64, vocab=64)


def _digit_ids(n: int) -> list[int]:
  from grpo_jax.tasks import digits
  return [digits.DIGIT0 + int(c) for c in str(n)]


def test_stop_tokenizer_has_the_digit_workloads_ids_in_every_loader(tmp_path):
  """The shared tokenizer.json gives "what is A + B =" the ids digits.py uses, through `tokenizers`, our
  hf_tokenizer and transformers' PreTrainedTokenizerFast (what the peers load), and decodes digit runs as the number
  (so the peers' `str(A + B) in completion` is our contiguous-digit-ids reward)."""
  pytest.importorskip("tokenizers")
  transformers = pytest.importorskip("transformers")
  import make_stop_checkpoint as msc
  from grpo_jax.tasks import digits, hf_tokenizer
  tok = msc.make_tokenizer(64)
  msc.save_tokenizer(str(tmp_path), tok)
  text = "what is 907 + 35 ="
  want = [12, 13] + _digit_ids(907) + [14] + _digit_ids(35) + [15]  # WHAT IS 9 0 7 PLUS 3 5 EQ, by hand
  assert want == [digits.WHAT, digits.IS, 11, 2, 9, digits.PLUS, 5, 7, digits.EQ]
  ours = hf_tokenizer.load(str(tmp_path))
  hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
  assert tok.encode(text).ids == ours.encode(text) == hf(text).input_ids == want
  assert (ours.eos_id, ours.pad_id, hf.eos_token_id, hf.pad_token_id) == (digits.EOS, digits.PAD) * 2
  assert hf.bos_token_id is None and hf.padding_side == "left"
  # A filler word between digits survives decoding (no digit in its name, not special): "9<b>42", not "942".
  comp = _digit_ids(9) + [digits.FILLER0 + 1] + _digit_ids(42) + [digits.EOS, digits.PAD]
  assert hf.decode(comp, skip_special_tokens=True) == "9<b>42"
  assert hf.decode(_digit_ids(942) + [digits.EOS], skip_special_tokens=True) == "942"
  names = [t for t, i in tok.get_vocab().items() if i >= digits.FILLER0]
  assert len(names) == 64 - digits.FILLER0 and not any(ch.isdigit() for n in names for ch in n)
  # The peers' loader (peers/stop_prompts.py) accepts it, and refuses a tokenizer that pads on the right.
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "peers"))
  import stop_prompts
  prompts = [r["prompt"] for r in stop_prompts.rows(16)]
  assert stop_prompts.hf_tokenizer(str(tmp_path), prompts)(prompts[:1]).input_ids == [ours.encode(prompts[0])]
  cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(dict(cfg, padding_side="right")))
  with pytest.raises(SystemExit, match="padding right"):
    stop_prompts.hf_tokenizer(str(tmp_path), prompts)


@pytest.fixture(scope="module")
def stop_checkpoint(tmp_path_factory):
  """A tiny checkpoint trained 40 SFT steps to answer and stop, written by make_stop_checkpoint.write."""
  pytest.importorskip("tokenizers")
  import make_stop_checkpoint as msc
  a = argparse.Namespace(**TINY_SHAPE, steps=40, batch=32, lr=1e-2, max_len=256, seed=0)
  out = str(tmp_path_factory.mktemp("stop"))
  tok = msc.make_tokenizer(a.vocab)
  mcfg, params, losses = msc.train(a, tok)
  msc.write(out, mcfg, params, tok)
  return dict(dir=out, mcfg=mcfg, params=params, losses=losses, tok=tok)


def test_stop_checkpoint_round_trips_and_stops(stop_checkpoint):
  """hf_io.load_hf gives back the trained params and their logits exactly; the training taught the model to end
  its answer: sampled completions (temperature 1, up to 16 tokens) end within 8 (after 1 step instead of 40 they
  averaged 13 of 16 tokens)."""
  import make_stop_checkpoint as msc
  from grpo_jax.hf import hf_io
  from grpo_jax.model import model as model_lib
  s = stop_checkpoint
  mcfg, params = hf_io.load_hf(s["dir"])
  assert (mcfg.hidden, mcfg.layers, mcfg.vocab_size, mcfg.tie_embeddings) == (32, 1, 64, True)
  for x, y in zip(jax.tree.leaves(s["params"]), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  toks, mask = msc.encode_prompts(s["tok"], ["what is 12 + 345 =", "what is 999 + 999 ="])
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  # The forwards as one program, as every caller runs them (eagerly, ~50 one-op programs compiled): the same program
  # for both (the configs are equal), so equal logits still mean equal weights.
  np.testing.assert_array_equal(jit_call(model_lib.forward, s["mcfg"], s["params"], toks, pos, mask),
                                jit_call(model_lib.forward, mcfg, params, toks, pos, mask))
  assert np.mean(s["losses"][-5:]) < 0.6 * np.mean(s["losses"][:5]), s["losses"]
  ev = msc.evaluate(mcfg, params, s["tok"], 32, 16, 0)
  assert ev["sampled_len_max"] <= 8 and 2 <= ev["sampled_len_mean"] <= 6, ev


def test_stop_batches_are_the_shared_prompts_as_digit_ids(stop_checkpoint):
  """grpo_step's --model-dir batches: peers/stop_prompts.rows in order, tokenized, left-padded to 10."""
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "peers"))
  import stop_prompts
  from grpo_jax.tasks import hf_tokenizer
  rows = stop_prompts.rows(6)
  assert rows == stop_prompts.rows(6) and rows[0] != rows[1]
  # The weights check's fingerprint: weights -3..3 cycling over the ids, mean over the vocabulary (by hand).
  assert stop_prompts.fingerprint([1, 0, 0, 0, 0, 0, 0, 2]) == (1 * -3 + 2 * -3) / 8
  assert stop_prompts.fingerprint([0, 0, 0, 0, 0, 0, 5]) == 5 * 3 / 7
  b0, b1 = list(grpo_step.stop_batches(hf_tokenizer.load(stop_checkpoint["dir"]), 3, 2))
  for b, rs in ((b0, rows[:3]), (b1, rows[3:])):
    for i, r in enumerate(rs):
      a, c = (int(x) for x in r["prompt"][len("what is "):-2].split(" + "))
      ids = [12, 13] + _digit_ids(a) + [14] + _digit_ids(c) + [15]
      assert b["prompt_NxP"][i].tolist() == [0] * (10 - len(ids)) + ids
      assert b["prompt_mask_NxP"][i].tolist() == [0] * (10 - len(ids)) + [1] * len(ids)
      ans = _digit_ids(a + c)
      assert b["answer_ids_NxA"][i].tolist() == ans + [-1] * (4 - len(ans)) and r["answer"] == str(a + c)


def test_grpo_step_model_dir_runs_on_the_checkpoint(stop_checkpoint):
  """--model-dir: the shape comes from the checkpoint, the state starts from its weights, and a timed step ends
  its decode early (exit_chunk 4 of L = 16) and trains on the shortest length (the padded passes, set: auto would
  pack at the bench config's 20 steps), with one compile."""
  a = argparse.Namespace(model_dir=stop_checkpoint["dir"], hidden=None, layers=None, heads=None, kv=None, inter=None,
                         vocab=None, prompts=2, G=4, L=16, steps=1, dtype="float32", remat="none",
                         attention="auto", exit_chunk=4, train_buckets=2, overrides={"rl.packing": "off"})
  grpo_step.shape_from_checkpoint(a)
  assert {k: getattr(a, k) for k in TINY_SHAPE} == TINY_SHAPE
  o = grpo_step.Ours(a)
  for x, y in zip(jax.tree.leaves(stop_checkpoint["params"]), jax.tree.leaves(o.p0)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  from grpo_jax.model import model as model_lib
  ids = np.asarray([stop_checkpoint["tok"].encode("what is 12 + 345 =").ids])
  # Eager on purpose: Ours' check_fingerprint just ran this forward eagerly on these shapes, so its ops are compiled
  # already (a jit here compiled one program more).
  last_V = np.asarray(model_lib.forward(stop_checkpoint["mcfg"], stop_checkpoint["params"], ids,
                                        np.arange(ids.shape[1])[None], np.ones_like(ids)))[0, -1]
  assert abs(o.fingerprint - np.mean(last_V * (np.arange(64) % 7 - 3))) < 1e-6
  o.run(1)
  res = o.finish()
  assert res["recompiles"] == 0 and len(res["completion_lens"]) == 8
  # Rewards all 0 (the tiny model cannot add): zero gradient, accepted only because no update was skipped.
  assert res["zero_gradient"] == (res["reward"] == 0.0) and o.skipped == [0, 0]
  longest = int(res["completion_lens"].max())
  # Token k is emitted by decode step k (sampling.py: emit, then decode), so the loop stops at the first chunk
  # boundary at or after the longest completion's EOS.
  assert longest <= 8 and res["decode_steps"] == [4 * -(-longest // 4)], res
  assert res["train_lens"] == [8]  # train_lengths(16, 2) = (8, 16)
  bad = argparse.Namespace(model_dir=stop_checkpoint["dir"], **dict(TINY_SHAPE, hidden=64))
  with pytest.raises(SystemExit, match="--hidden 64 \\(checkpoint: 32\\)"):
    grpo_step.shape_from_checkpoint(bad)


# ------------------------------------------------------------ long-tail lengths (grpo_step.py --workload tail)

TAIL_L = 16


def test_tail_prompt_lengths_follow_the_clipped_lognormal():
  """tail_prompts.lengths: round(lognormal(median L/8, σ = 1)) kept in [2, L], against the distribution's own
  values computed independently (numpy, on a fine grid of the normal's quantiles)."""
  import math
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "peers"))
  import tail_prompts
  L, n = 512, 40_000
  got = np.asarray(tail_prompts.lengths(n, L, seed=3))
  assert got.min() >= 2 and got.max() == L and tail_prompts.lengths(5, L, 3) == got[:5].tolist()
  z = (np.arange(200_000) + 0.5) / 200_000  # quantiles of the standard normal, by its inverse CDF
  from statistics import NormalDist
  want = np.clip(np.round(np.exp(math.log(L / 8) + np.array([NormalDist().inv_cdf(q) for q in z[::10]]))), 2, L)
  assert abs(np.median(got) - np.median(want)) <= 2  # 64 = L/8
  assert abs(got.mean() - want.mean()) < 0.02 * want.mean()  # ≈ 103 ≈ L/5
  p_cap = 1 - NormalDist().cdf(math.log((L - 0.5) / 64))  # P(row reaches L) ≈ 0.019
  assert abs(np.mean(got == L) - p_cap) < 4 * math.sqrt(p_cap * (1 - p_cap) / n)
  assert np.percentile(got, 90) > 3 * np.median(got)  # long-tailed: p90 ≈ 3.6 × median
  st = tail_prompts.stats([1, 2, 3, 10])
  assert st == dict(median=2.5, mean=4.0, p90=10.0, max=10, total=16)
  assert [tail_prompts.word(k) for k in (1, 2, 25, 26, 27)] == ["<b>", "<c>", "<z>", "<ba>", "<bb>"]
  r = tail_prompts.rows(3, L, seed=3)
  assert [x["length"] for x in r] == got[:3].tolist() and r[0]["prompt"] == f"what is {tail_prompts.word(got[0])}"
  fields = tail_prompts.result_fields("x", [9.0, 1.0, 3.0], [[5, 5], [2, 4], [6]])
  assert fields == " x_rollout_s=2.0000 x_len_median=4.0 x_len_mean=4.00 x_len_max=6 x_tokens=12"


def test_tail_tokenizer_and_sft_batch_count_down_to_eos(tmp_path):
  """The count word of k is one token (id FILLER0 + k) in tokenizers, our hf_tokenizer and transformers; an SFT
  row for count k is "what is <k>" then the words of k−1 … 1 (as the tokenizer encodes them) and EOS, loss on
  those k."""
  pytest.importorskip("tokenizers")
  transformers = pytest.importorskip("transformers")
  import make_tail_checkpoint as mtc
  import make_stop_checkpoint as msc
  import tail_prompts
  from grpo_jax.tasks import digits, hf_tokenizer
  tok = mtc.make_tokenizer(64, TAIL_L)
  msc.save_tokenizer(str(tmp_path), tok)
  ours = hf_tokenizer.load(str(tmp_path))
  hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
  text = "what is <l>"  # count 11
  want = [digits.WHAT, digits.IS, digits.FILLER0 + 11]
  assert tok.encode(text).ids == ours.encode(text) == hf(text).input_ids == want
  assert hf.decode([digits.FILLER0 + 3, digits.FILLER0 + 1, digits.EOS], skip_special_tokens=True) == "<d><b>"
  b = mtc.sft_batch(tok, np.random.default_rng(0), 32, TAIL_L)
  counts = b["tokens_NxT"][:, 2] - digits.FILLER0
  assert counts.min() >= 1 and counts.max() == TAIL_L and (counts == TAIL_L).sum() >= 4
  for row, mask, k in zip(b["tokens_NxT"], b["loss_mask_NxT"], counts):
    words = " ".join(tail_prompts.word(j) for j in range(k - 1, 0, -1))
    want = (tok.encode(words).ids if k > 1 else []) + [digits.EOS]
    assert row[3:3 + k].tolist() == want and row[3 + k:].tolist() == [digits.PAD] * (TAIL_L - k)
    assert mask.tolist() == [0, 0, 0] + [1] * k + [0] * (TAIL_L - k)
  np.testing.assert_array_equal(b["positions_NxT"][:, :4], np.tile(np.arange(4), (32, 1)))
  with pytest.raises(SystemExit, match="--vocab 48 or more"):
    mtc.make_tokenizer(40, 31)


@pytest.fixture(scope="module")
def tail_checkpoint(tmp_path_factory):
  """A tiny checkpoint trained to count down from its prompt (L = 16), written by make_stop_checkpoint.write."""
  pytest.importorskip("tokenizers")
  import make_tail_checkpoint as mtc
  import make_stop_checkpoint as msc
  a = argparse.Namespace(**TINY_SHAPE, steps=120, batch=16, lr=1e-2, max_len=256, seed=0)
  out = str(tmp_path_factory.mktemp("tail"))
  tok = mtc.make_tokenizer(a.vocab, TAIL_L)
  mcfg, params, losses = msc.train(a, tok, lambda tok, rng, n: mtc.sft_batch(tok, rng, n, TAIL_L))
  msc.write(out, mcfg, params, tok)
  return dict(dir=out, mcfg=mcfg, params=params, losses=losses, tok=tok)


def test_tail_checkpoint_round_trips_and_writes_its_target_lengths(tail_checkpoint):
  """Written and read back exactly; sampled at temperature 1, the completions have the prompts' lengths (a random
  init never draws EOS in 16 tokens at this vocabulary: all rows would be 16)."""
  import make_tail_checkpoint as mtc
  from grpo_jax.hf import hf_io
  s = tail_checkpoint
  mcfg, params = hf_io.load_hf(s["dir"])
  for x, y in zip(jax.tree.leaves(s["params"]), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert np.mean(s["losses"][-10:]) < 0.05 * np.mean(s["losses"][:10]), s["losses"][::10]
  ev = mtc.check(mcfg, params, s["tok"], 64, TAIL_L, 0)
  assert ev["exact"] >= 0.9, ev
  assert abs(ev["got"]["mean"] - ev["want"]["mean"]) <= 1.0 and ev["got"]["max"] <= TAIL_L, ev
  assert ev["want"]["median"] == 2.0 and ev["want"]["max"] > 4 * ev["want"]["median"]  # L/8 = 2, long-tailed
  assert "tail_len_median=" in mtc.report(ev, 64, TAIL_L)[1]


def test_tail_bench_variants_check_their_keys():
  """--engine / --packing / --config-override set keys only where the config has them, else a one-line error."""
  import tail_bench
  a = argparse.Namespace(**TINY_SHAPE, prompts=2, G=4, L=16, dtype="float32", remat="none", attention="auto",
                         model_dir="", engine="", packing="", config_override=["rl.rollout_chunks=2"])
  assert tail_bench.variants(a) == [("default", {"rl.rollout_chunks": 2})]
  c = grpo_step.bench_config(a)
  tail_bench.set_key(c, "rl.rollout_chunks", 2)
  assert c.rl.rollout_chunks == 2
  for bad, msg in ((dict(config_override=["rl.nope=1"]), "rl.nope: this tree's config has no such key"),
                   (dict(config_override=["rl.G"]), "expected KEY=VALUE")):
    with pytest.raises(SystemExit, match=msg):
      tail_bench.variants(argparse.Namespace(**dict(vars(a), **bad)))
  has = {k: k.split(".")[1] in c[k.split(".")[0]] for k in ("sampling.engine", "rl.packing")}
  for key, flag, vals in (("sampling.engine", "engine", ("static", "continuous")), ("rl.packing", "packing", ("off", "on"))):
    b = argparse.Namespace(**dict(vars(a), config_override=[], **{flag: ",".join(vals)}))
    if has[key]:  # the engine / packing work has landed: two variants, labelled by the value
      assert [v for v, _ in tail_bench.variants(b)] == [f"{key.split('.')[1]}={x}" for x in vals]
    else:
      with pytest.raises(SystemExit, match=f"{key}: this tree's config has no such key .*leave --{flag} out"):
        tail_bench.variants(b)


def test_tail_workload_runs_rollout_and_step_on_the_checkpoint(tail_checkpoint, capsys):
  """grpo_step --model-dir --workload tail, ours only: the rollout program's completions have the prompts'
  lengths, decode steps stop at the exit chunk after the longest, the RESULT line carries the tail fields."""
  import tail_bench
  import tail_prompts
  a = argparse.Namespace(model_dir=tail_checkpoint["dir"], hidden=None, layers=None, heads=None, kv=None,
                         inter=None, vocab=None, prompts=2, G=4, L=TAIL_L, steps=2, dtype="float32", remat="none",
                         attention="auto", exit_chunk=4, train_buckets=2, workload="tail", early_exit=False,
                         scaling="", vs_trl="", vs_tunix="", vs_vllm="", engine="", packing="", config_override=[])
  grpo_step.shape_from_checkpoint(a)
  (o,) = tail_bench.main(a)
  out = capsys.readouterr().out
  result = dict(kv.split("=") for kv in out.strip().splitlines()[-1].split()[1:])
  assert result["workload"] == "tail" and result["recompiles"] == "0" and result["same_weights"] == "1"
  # Timed batches 1 and 2 (batch 0 compiles): each prompt's G rows should have its target length.
  want = np.repeat([r["length"] for r in tail_prompts.rows(2 * 4, TAIL_L)][2:6], 4)
  got = np.concatenate(o.roll_lens)
  assert np.mean(got == want) >= 0.9, (got, want)
  # Early exit: the first multiple of exit_chunk at or after the longest row, at most L − 1 decode steps.
  assert o.roll_steps == [min(4 * -(-int(x.max()) // 4), TAIL_L - 1) for x in o.roll_lens], (o.roll_steps, got)
  util = np.mean([x.sum() / (8 * (k + 1)) for x, k in zip(o.roll_lens, o.roll_steps)])
  assert abs(float(result["slot_util"]) - util) < 1e-3 and float(result["completion_len"]) == round(got.mean(), 2)
  assert float(result["rollout_s"]) > 0 and f"decode steps {o.roll_steps} of {TAIL_L - 1}" in out
  # trained tokens/s: the completion tokens the timed steps trained (their own rows, not the separately timed
  # rollout's, drawn with another rng) over the steps' time
  trained = int(np.concatenate(o.completion_lens[1:]).sum())
  assert result["trained_tps"] == f"{trained / sum(o.times):.0f}", (result["trained_tps"], trained, got.sum())
  # here the tail checkpoint's rows have their prompts' lengths in both draws; had the steps' rows differed from
  # the timed rollout's, the steps' would count
  o.completion_lens = [2 * x for x in o.completion_lens]
  assert o.summary()["trained_tps"] == pytest.approx(2 * trained / sum(o.times))


def test_workload_flags_the_bench_cannot_honour_are_one_line():
  """--steps 0 (or -3) ran two timed steps of ours and reported them as the median, the peers counting none;
  --vocab 10 put the prompt's ids (up to 15) past the embedding table, whose gather clamps: another workload, no
  error. Both are refused in one line (parse only: nothing runs)."""
  import argparse
  from grpo_jax.config import config_lib
  from grpo_jax.tasks import digits
  for steps in (1, 0, -3):
    with pytest.raises(SystemExit, match=rf"--steps {steps}: the peers drop their first \(compiling\) step"):
      grpo_step.check_flags(argparse.Namespace(**dict(grpo_step.FLAGS, steps=steps)))
  grpo_step.check_flags(argparse.Namespace(**dict(grpo_step.FLAGS, steps=2)))
  with pytest.raises(config_lib.ConfigError, match="vocab=15: the digits workload's prompts use ids 0..15"):
    digits.bench_config(vocab=15)
  assert digits.bench_config(vocab=16).model.vocab_size == 16
