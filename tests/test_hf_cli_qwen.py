"""A user's path with a Qwen2.5-Instruct-shaped checkpoint (bf16 safetensors, the real Qwen2.5 chat template,
`<|im_end|>` and `<|endoftext|>` as EOS ids), through the CLI: `python -m grpo_jax.main
--config=configs/gsm8k.py:small,model=checkpoint,prompt=chat` with only `--config.train.init_from=hf:DIR` (and the
data dir) -> two GRPO steps on chat-template prompts -> `job=export` -> transformers: logits within 1e-4 of ours,
the same greedy tokens."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("transformers")

from tests import hf_dirs  # noqa: E402

CONFIG = "--config=configs/gsm8k.py:small,model=checkpoint,prompt=chat"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  root = tmp_path_factory.mktemp("qwen_cli")
  src = hf_dirs.qwen_instruct_dir(str(root / "hf"))
  data = hf_dirs.gsm8k_jsonl(str(root / "gsm8k"))
  work, out = str(root / "run"), str(root / "export")
  common = [CONFIG, f"--workdir={work}", f"--config.train.init_from=hf:{src}", f"--config.task.data_dir={data}"]
  # weight decay moves the params (see test_hf_cli_llama.py)
  r = hf_dirs.run_cli(common + ["--config.optim.weight_decay=0.1", "--config.log.plots=False"])
  assert r.returncode == 0, r.stderr[-4000:]
  e = hf_dirs.run_cli(common + ["--config.job=export", f"--config.export.out_dir={out}"])
  assert e.returncode == 0, e.stderr[-4000:]
  return dict(src=src, data=data, work=work, out=out, stdout=e.stdout, common=common)


def test_model_and_prompts_came_from_the_checkpoint(run):
  from grpo_jax.config import config_lib
  from grpo_jax.hf import model_source
  from grpo_jax.tasks import data, hf_tokenizer
  with open(os.path.join(run["work"], "config.json")) as f:
    saved = json.load(f)
  model = saved["model"]
  with open(os.path.join(run["src"], "config.json")) as f:
    hf = json.load(f)
  assert (model["vocab_size"], model["qkv_bias"], model["tie_embeddings"], model["rope_theta"], model["max_len"],
          model["rope_scaling_factor"]) == (hf["vocab_size"], True, True, 1e6, 512, 0.0)
  assert saved["task"]["prompt_format"] == "chat" and saved["task"]["tokenizer"] == "init_from"
  # The run's prompts are the chat template's, token for token as transformers tokenizes them.
  import transformers
  cfg = model_source.resolve(config_lib.override(config_lib.load_config("configs/gsm8k.py",
                                                                        "small,model=checkpoint,prompt=chat"),
                                                 {"train.init_from": f"hf:{run['src']}",
                                                  "task.data_dir": run["data"]}))
  tok = hf_tokenizer.HFTokenizer(run["src"])
  batch = next(data.rl_batches(cfg.task, tok, "train", 2, seed=0, start_step=0, prompt_len=cfg.task.prompt_len))
  ref = transformers.AutoTokenizer.from_pretrained(run["src"])
  for row, m, i in zip(batch["prompt_NxP"], batch["prompt_mask_NxP"], batch["index_N"]):
    with open(os.path.join(run["data"], "train.jsonl")) as f:
      q = json.loads(f.readlines()[i])["question"]
    msgs = [{"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
            {"role": "user", "content": q}]
    want = ref.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    assert row[m > 0].tolist() == want


def test_export_matches_transformers_logits_and_greedy_tokens(run):
  from grpo_jax.hf import hf_io
  from grpo_jax.tasks import hf_tokenizer
  tok = hf_tokenizer.HFTokenizer(run["out"])
  prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": hf_dirs.QUESTIONS[2]}]))
  diff, scale, ours, theirs, (_, params, _) = hf_dirs.ours_vs_transformers(run["work"], run["out"], prompt)
  assert diff < 1e-4 and scale > 1.0, (diff, scale)
  assert ours == theirs and len(ours) > 0, (ours, theirs)
  _, exported = hf_io.load_hf(run["out"])
  _, initial = hf_io.load_hf(run["src"])
  import jax
  leaves = lambda t: [np.asarray(x) for x in jax.tree.leaves(t)]
  for x, y in zip(leaves(params), leaves(exported)):
    np.testing.assert_array_equal(x, y)
  assert any(not np.array_equal(x, z) for x, z in zip(leaves(params), leaves(initial)))


def test_export_keeps_the_tokenizer_chat_template_and_eos_ids(run):
  import transformers
  for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
    with open(os.path.join(run["src"], name)) as a, open(os.path.join(run["out"], name)) as b:
      assert a.read() == b.read(), name
  with open(os.path.join(run["out"], "config.json")) as f:
    cfg = json.load(f)
  assert cfg["model_type"] == "qwen2" and cfg["torch_dtype"] == "float32" and cfg["tie_word_embeddings"]
  msgs = [{"role": "user", "content": "hi"}]
  ref = transformers.AutoTokenizer.from_pretrained(run["out"])
  assert ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True).endswith("<|im_start|>assistant\n")
  assert "exported" in run["stdout"] and "step 2" in run["stdout"]


def test_rerun_with_a_disagreeing_model_field_lists_every_mismatch(run, tmp_path, capsys):
  """main.execute, the CLI after its flags, in-process (the subprocess's exit-2 path for a config error is
  tests/test_input_errors.py's): one line listing every field that disagrees with the checkpoint, before any state."""
  from grpo_jax import main
  from grpo_jax.config import config_lib
  from grpo_jax.infra import errors
  c = config_lib.override(config_lib.load_config("configs/gsm8k.py", "small,model=checkpoint,prompt=chat"),
                          {"train.init_from": f"hf:{run['src']}", "task.data_dir": run["data"], "model.hidden": 32,
                           "model.rope_theta": 10000.0, "model.max_len": 4096})
  code = main.execute(c, str(tmp_path / "w"))
  err = capsys.readouterr().err
  assert code == errors.EXIT_INPUT, err[-3000:]
  line = err.strip().splitlines()[-1]
  assert line.startswith("Config error:") and "3 field(s)" in line, line
  for needle in ("model.hidden=32 (checkpoint: 64)", "model.rope_theta=10000.0 (checkpoint: 1000000.0)",
                 "model.max_len=4096 exceeds the checkpoint's max_position_embeddings=512"):
    assert needle in line, line
  assert not os.path.exists(tmp_path / "w" / "checkpoints")  # refused before any state was built
