"""A user's path with a Llama-3.1-shaped checkpoint, through the CLI: `python -m grpo_jax.main` with only
`--config.train.init_from=hf:DIR` (and the data dir; no model overrides) -> two GRPO steps -> `python -m
grpo_jax.export` -> transformers loads the export: logits within 1e-4 of ours, the same greedy tokens.

The checkpoint (tests/hf_dirs.py) has 'llama3' RoPE scaling with a small original context, so a model that dropped
the scaling would differ (checked), two EOS ids in generation_config.json, no biases, an untied head."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests import hf_dirs  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  root = tmp_path_factory.mktemp("llama_cli")
  src = hf_dirs.llama31_dir(str(root / "hf"))
  data = hf_dirs.gsm8k_jsonl(str(root / "gsm8k"))
  work, out = str(root / "run"), str(root / "export")
  # weight decay: with a random model every reward is 0 (no advantage), so decay is what moves the params at step
  # 1, and the KL to the reference then gives step 2 a gradient: the export must carry trained params.
  r = hf_dirs.run_cli(["--config=configs/gsm8k.py:small,model=checkpoint", f"--workdir={work}",
                       f"--config.train.init_from=hf:{src}", f"--config.task.data_dir={data}",
                       "--config.optim.weight_decay=0.1", "--config.log.plots=False"])
  assert r.returncode == 0, r.stderr[-4000:]
  e = hf_dirs.run_cli([work, out], module="grpo_jax.hf.export")
  assert e.returncode == 0, e.stderr[-4000:]
  return dict(src=src, data=data, work=work, out=out, stdout=e.stdout)


def test_every_model_field_came_from_the_checkpoint(run):
  with open(os.path.join(run["work"], "config.json")) as f:
    model = json.load(f)["model"]
  with open(os.path.join(run["src"], "config.json")) as f:
    hf = json.load(f)
  rs = hf["rope_scaling"]
  assert (model["vocab_size"], model["hidden"], model["layers"], model["heads"], model["kv_heads"],
          model["head_dim"], model["inter"]) == (hf["vocab_size"], 64, 2, 4, 2, 16, 128)
  assert (model["rope_theta"], model["rms_eps"], model["tie_embeddings"], model["qkv_bias"], model["max_len"]) == (
      1e4, 1e-5, False, False, 512)
  assert (model["rope_scaling_factor"], model["rope_low_freq_factor"], model["rope_high_freq_factor"],
          model["rope_original_max_len"]) == (rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                                              rs["original_max_position_embeddings"])
  with open(os.path.join(run["work"], "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
  assert any("eval/accuracy" in r for r in rows)


def test_export_matches_transformers_logits_and_greedy_tokens(run):
  from grpo_jax.hf import hf_io
  from grpo_jax.model import model as model_lib
  from grpo_jax.tasks import hf_tokenizer, gsm8k
  tok = hf_tokenizer.HFTokenizer(run["out"])
  q = hf_dirs.QUESTIONS[1]
  prompt = [tok.bos_id] + tok.encode(gsm8k.R1_ZERO.format(question=q))
  diff, scale, ours, theirs, (mcfg, params, seq) = hf_dirs.ours_vs_transformers(run["work"], run["out"], prompt)
  assert diff < 1e-4 and scale > 1.0, (diff, scale)
  assert ours == theirs and len(ours) > 0, (ours, theirs)
  # The llama3 scaling matters here: without it the logits are far off.
  import dataclasses
  no_scaling = dataclasses.replace(mcfg, rope_scaling_factor=0.0)
  pos = np.arange(seq.shape[1], dtype=np.int32)[None]
  a = np.asarray(model_lib.forward(mcfg, params, seq, pos, np.ones_like(seq)))
  b = np.asarray(model_lib.forward(no_scaling, params, seq, pos, np.ones_like(seq)))
  assert np.abs(a - b).max() > 1e-2
  # The export holds the trained params bit for bit (float32), and they moved away from the checkpoint's.
  _, exported = hf_io.load_hf(run["out"])
  _, initial = hf_io.load_hf(run["src"])
  for x, y, z in zip(*(jax_leaves(t) for t in (params, exported, initial))):
    np.testing.assert_array_equal(x, y)
  assert any(not np.array_equal(x, z) for x, z in zip(jax_leaves(params), jax_leaves(initial)))


def jax_leaves(tree):
  import jax
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_export_directory_is_a_complete_hf_checkpoint(run):
  import transformers
  files = set(os.listdir(run["out"]))
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "generation_config.json"} <= files, files
  with open(os.path.join(run["out"], "config.json")) as f:
    cfg = json.load(f)
  with open(os.path.join(run["src"], "config.json")) as f:
    src = json.load(f)
  assert cfg["model_type"] == "llama" and cfg["rope_scaling"]["rope_type"] == "llama3"
  assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["max_position_embeddings"]) == (
      src["bos_token_id"], src["eos_token_id"], 512)
  from grpo_jax.tasks import hf_tokenizer
  ref, ours = transformers.AutoTokenizer.from_pretrained(run["out"]), hf_tokenizer.HFTokenizer(run["out"])
  for q in hf_dirs.QUESTIONS[:3]:
    assert ref.encode(q, add_special_tokens=False) == ours.encode(q)
  assert ref.bos_token_id == ours.bos_id and ref.eos_token_id == ours.eos_id
  assert "step 2" in run["stdout"]
