"""configs/gsm8k.py:small end to end: 2 GRPO steps on mock GSM8K from a HF-format checkpoint (hf: hook), with
the Python math reward called through jax.pure_callback and held-out eval verified on the host (steps 0 and 2);
one run shared by the tests (module fixture)."""
import dataclasses
import json
import re

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from grpo_jax.config import config_lib
from grpo_jax.hf import hf_io
from grpo_jax.hf import hf_save
from grpo_jax.model import model as model_lib
from grpo_jax.run import train
from grpo_jax.tasks import gsm8k, math_answer, registry


def _records(n):
  return [{"question": f"Tom has {i} apples and buys 3 more. How many?".encode(),
           "answer": f"{i} + 3 = <<{i}+3={i + 3}>>{i + 3}\n#### {i + 3}".encode()} for i in range(n)]


def _fake_source(self, split, **kwargs):
  del self, kwargs
  return _records(8 if split == "train" else 4)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  config = config_lib.load_config("configs/gsm8k.py", "small")
  mcfg = model_lib.ModelConfig.from_config(config.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(7))  # not config.seed's init: the hook must load these
  hf_dir = str(tmp_path_factory.mktemp("hf"))
  hf_save.save_hf(hf_dir, mcfg, params)
  calls = []

  accuracy = gsm8k.make_rewards(gsm8k.tokenizer_lib.load())["math_accuracy"]

  def recorded_reward(texts, token_ids, batch):
    out = accuracy(texts, token_ids, batch)
    calls.append((list(texts), batch, list(out)))
    return out

  verified = []
  spec = registry.TASKS["gsm8k"]

  def recording_verifier(tok):
    verify = spec.host_verifier(tok)

    def rec(tokens_NxL, mask_NxL, fields, **kw):  # kw: group (the rows per prompt)
      out = verify(tokens_NxL, mask_NxL, fields, **kw)
      verified.append((tokens_NxL, mask_NxL, fields, out))
      return out
    return rec

  workdir = str(tmp_path_factory.mktemp("run"))
  with config.unlocked():
    config.train.init_from = f"hf:{hf_dir}"
    config.log.plots = False
  registry.TASKS["gsm8k"] = dataclasses.replace(spec, host_verifier=recording_verifier)
  try:
    with tfds.testing.mock_data(as_data_source_fn=_fake_source):
      train.run_rl(config, workdir, python_fns={"math_accuracy": recorded_reward})
  finally:
    registry.TASKS["gsm8k"] = spec
  with open(f"{workdir}/metrics.jsonl") as f:
    all_rows = [json.loads(l) for l in f]
  rows = [r for r in all_rows if "train/reward_mean" in r]
  eval_rows = [r for r in all_rows if "eval/accuracy" in r]
  with open(f"{workdir}/samples.jsonl") as f:
    samples = [json.loads(l) for l in f]
  return dict(config=config, params=params, mcfg=mcfg, hf_dir=hf_dir, calls=calls, rows=rows,
              eval_rows=eval_rows, verified=verified, samples=samples)


def test_samples_hold_the_prompt_and_the_reference_answer(run):
  """samples.jsonl: each logged completion with the question it answered and that question's reference answer
  (the mock's question i has answer i + 3)."""
  assert run["samples"] and all(s["step"] == 2 for s in run["samples"])
  for s in run["samples"]:
    i = int(re.search(r"Tom has (\d+) apples", s["prompt"]).group(1))
    assert s["reference"] == str(i + 3), s
    assert s["prompt"].rstrip().endswith("Assistant:"), s["prompt"][-80:]


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
    # Independent check of the scores: the answer read from the decoded text (a truncated row's last number is
    # not an answer), compared by value.
    assert out == [float(math_answer.equal(math_answer.extract_answer(t, last_number_ok=bool(e)),
                                           gsm8k.decode_answer(a)))
                   for t, a, e in zip(texts, batch["answer_chars_NxA"], batch["ended_N"])]


def test_policy_started_from_the_hf_checkpoint(run):
  # Step 1's logged param_norm is after one update; with every group's rewards equal (all 0) the GRPO advantage is
  # 0 and the KL to the identical reference has zero gradient, so the params are the checkpoint's.
  row = run["rows"][0]
  assert row["train/frac_zero_std_groups"] == 1.0 and row["train/update_norm"] < 1e-6
  want = np.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64)))) for x in jax.tree.leaves(run["params"])))
  np.testing.assert_allclose(row["train/param_norm"], want, rtol=1e-5)


def test_hf_hook_rejects_a_shape_mismatch(run):
  wrong = dataclasses.replace(run["mcfg"], inter=run["mcfg"].inter * 2)
  with pytest.raises(ValueError, match=r"disagrees with its config.json in 1 field\(s\): model\.inter=128 \(checkpoint: 64\)"):
    train.load_hf_params(run["hf_dir"], wrong, None)


def test_held_out_eval_ran_on_the_host_verifier(run):
  c = run["config"]
  rows = run["eval_rows"]
  assert [r["step"] for r in rows] == [0, 2]
  n, size = c.eval.n_samples, c.eval.size
  # Per eval: one greedy chunk of `size` rows, then sampled chunks of batch // n questions × n samples.
  per_eval = 1 + size * n // c.eval.batch
  assert len(run["verified"]) == 2 * per_eval
  for e, row in enumerate(rows):
    calls = run["verified"][e * per_eval:(e + 1) * per_eval]
    tokens, mask, fields, (acc, fmt, _) = calls[0]
    assert tokens.shape == (size, c.sampling.max_new_tokens)
    # the gold answers are the test split's, in order (mock test records 0..3 → 3..6)
    assert [gsm8k.decode_answer(a) for a in fields["answer_chars_NxA"]] == ["3", "4", "5", "6"]
    # Independent re-grading of the greedy rows from their decoded text: the last <answer> body, else the last
    # \boxed{}, else (only for a row that ended at EOS) the last number.
    tok = gsm8k.tokenizer_lib.load()
    for t, m, a, g, f in zip(tokens, mask, fields["answer_chars_NxA"], acc, fmt):
      ids = t[m > 0].tolist()
      ended = ids[-1:] == [tok.eos_id]
      text = tok.decode(ids[:-1] if ended else ids)
      bodies = re.findall(r"<answer>(.*?)</answer>", text, re.S)
      answer = bodies[-1] if bodies else math_answer.last_boxed(text)
      if answer is None and ended:
        answer = math_answer.last_number(text)
      assert g == float(math_answer.equal(answer, gsm8k.decode_answer(a)))
      assert f == float(re.fullmatch(r"\s*<think>[^<]*</think>\s*<answer>[^<]*</answer>\s*", text) is not None)
    np.testing.assert_allclose(row["eval/accuracy"], acc.mean(), atol=1e-6)
    np.testing.assert_allclose(row["eval/format_rate"], fmt.mean(), atol=1e-6)
    np.testing.assert_allclose(row["eval/completion_len_mean"], mask.sum(-1).mean(), atol=1e-6)
    sampled_acc = np.concatenate([x[3][0] for x in calls[1:]])
    assert sampled_acc.shape == (size * n,)
    np.testing.assert_allclose(row["eval/accuracy_sampled"], sampled_acc.mean(), atol=1e-6)
    np.testing.assert_allclose(row["eval/pass@1"], sampled_acc.mean(), atol=1e-6)
    for k in ("eval/pass@2", f"eval/cons@{n}"):
      assert 0.0 <= row[k] <= 1.0
