"""configs/gsm8k_qwen.py:small end to end: 2 GRPO steps on mock GSM8K from a HF-format checkpoint (hf: hook), with
the Python math reward called through jax.pure_callback; one run shared by the tests (module fixture)."""
import json

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import gsm8k_qwen
from grpo_jax import hf_io
from grpo_jax import model as model_lib
from grpo_jax import train
from grpo_jax.tasks import gsm8k, math_answer


def _records(n):
  return [{"question": f"Tom has {i} apples and buys 3 more. How many?".encode(),
           "answer": f"{i} + 3 = <<{i}+3={i + 3}>>{i + 3}\n#### {i + 3}".encode()} for i in range(n)]


def _fake_source(self, split, **kwargs):
  del self, kwargs
  return _records(8 if split == "train" else 4)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  config = gsm8k_qwen.get_config("small")
  mcfg = model_lib.ModelConfig.from_config(config.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(7))  # not config.seed's init: the hook must load these
  hf_dir = str(tmp_path_factory.mktemp("hf"))
  hf_io.save_hf(hf_dir, mcfg, params)
  calls = []

  def recorded_reward(texts, token_ids, batch):
    out = gsm8k.math_reward(texts, token_ids, batch)
    calls.append((list(texts), batch, list(out)))
    return out

  workdir = str(tmp_path_factory.mktemp("run"))
  with config.unlocked():
    config.train.init_from = f"hf:{hf_dir}"
  with tfds.testing.mock_data(as_data_source_fn=_fake_source):
    train.run_rl(config, workdir, python_fns={"math_accuracy": recorded_reward})
  with open(f"{workdir}/metrics.jsonl") as f:
    rows = [json.loads(l) for l in f]
  return dict(config=config, params=params, mcfg=mcfg, hf_dir=hf_dir, calls=calls, rows=rows)


def test_two_steps_logged_with_reward_metrics(run):
  rows = run["rows"]
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    for k in ("train/reward_mean", "train/reward/math_accuracy", "train/kl", "train/grad_norm", "train/entropy"):
      assert np.isfinite(r[k]), k
    assert r["train/reward_fallbacks"] == 0 and r["train/nonfinite_updates"] == 0


def test_python_reward_ran_through_the_callback(run):
  c = run["config"]
  n = c.rl.prompts_per_step * c.rl.G
  assert len(run["calls"]) == 2  # once per step, N completions each
  for (texts, batch, out), row in zip(run["calls"], run["rows"]):
    assert len(texts) == len(out) == n
    # The gold answer travels as char codes; it must be the mock record's '####' answer for that row's question.
    for k in range(n):
      assert gsm8k.decode_answer(batch["answer_chars_NxA"][k]) == str(int(batch["index_N"][k]) + 3)
    np.testing.assert_allclose(row["train/reward/math_accuracy"], np.mean(out), atol=1e-6)
    # Independent check of the scores: a random model writes no well-formed <answer> with the right number.
    assert out == [float(math_answer.is_correct(t, gsm8k.decode_answer(a)) and "<answer>" in t)
                   for t, a in zip(texts, batch["answer_chars_NxA"])]


def test_policy_started_from_the_hf_checkpoint(run):
  # Step 1's logged param_norm is after one update; with every group's rewards equal (all 0) the GRPO advantage is
  # 0 and the KL to the identical reference has zero gradient, so the params are the checkpoint's.
  row = run["rows"][0]
  assert row["train/frac_zero_std_groups"] == 1.0 and row["train/update_norm"] < 1e-6
  want = np.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64)))) for x in jax.tree.leaves(run["params"])))
  np.testing.assert_allclose(row["train/param_norm"], want, rtol=1e-5)


def test_hf_hook_rejects_a_shape_mismatch(run):
  import dataclasses
  wrong = dataclasses.replace(run["mcfg"], inter=run["mcfg"].inter * 2)
  with pytest.raises(ValueError, match=r"config\.model\.inter=128 but the checkpoint has 64"):
    train.load_hf_params(run["hf_dir"], wrong, None)
