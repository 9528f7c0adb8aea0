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
  np.testing.assert_array_equal(model_lib.forward(s["mcfg"], s["params"], toks, pos, mask),
                                model_lib.forward(mcfg, params, toks, pos, mask))
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
  its decode early (exit_chunk 4 of L = 16) and trains on the shortest length, with one compile."""
  a = argparse.Namespace(model_dir=stop_checkpoint["dir"], hidden=None, layers=None, heads=None, kv=None, inter=None,
                         vocab=None, prompts=2, G=4, L=16, steps=1, dtype="float32", remat="none",
                         attention="auto", exit_chunk=4, train_buckets=2)
  grpo_step.shape_from_checkpoint(a)
  assert {k: getattr(a, k) for k in TINY_SHAPE} == TINY_SHAPE
  o = grpo_step.Ours(a)
  for x, y in zip(jax.tree.leaves(stop_checkpoint["params"]), jax.tree.leaves(o.p0)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  from grpo_jax.model import model as model_lib
  ids = np.asarray([stop_checkpoint["tok"].encode("what is 12 + 345 =").ids])
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
