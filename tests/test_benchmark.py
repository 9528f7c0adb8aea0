"""The benchmark's own arithmetic: scaling fits, HLO loop-body op counts, the same-run matmul peak, its config."""
import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

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
