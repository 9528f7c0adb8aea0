"""LoRA runs end to end on a transformers Qwen2 base (train.init_from=hf:): checkpoints hold adapters + optimizer
state + the base's identity; a PEFT user loads the exported adapter directory and gets our logits; the merged export
equals them; a resume onto another base is refused in one line."""
import functools
import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grpo_jax.config import config_lib  # noqa: E402
from grpo_jax.hf import export as export_lib  # noqa: E402
from grpo_jax.hf import hf_io  # noqa: E402
from grpo_jax.infra import checkpoint  # noqa: E402
from grpo_jax.infra import errors  # noqa: E402
from grpo_jax.model import lora  # noqa: E402
from grpo_jax.model import model as model_lib  # noqa: E402
from grpo_jax.run import train  # noqa: E402
from tests import metrics_contract  # noqa: E402
from tests import noise  # noqa: E402


def _peft():
  """peft, imported by the tests that read adapters back, not at collection: its import (transformers' model
  registry) takes ~4.5 CPU-s, which every xdist worker paid to collect this module whether it ran it or not."""
  return pytest.importorskip("peft")


TOKENS = np.array([[0, 0, 5, 9, 11, 3, 7, 1, 2, 40], [4, 8, 2, 6, 1, 17, 5, 60, 33, 12]], np.int64)
MASK = np.array([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 10], np.int64)
POS = np.clip(np.cumsum(MASK, 1) - 1, 0, None)


def _save_qwen2(path, seed):
  """A random transformers Qwen2 of the arith :small shape (shipped 512-piece tokenizer), default (0.02) init with
  random norms and biases, saved with save_pretrained."""
  cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                 rms_norm_eps=1e-6, rope_theta=10_000.0, tie_word_embeddings=True)
  torch.manual_seed(seed)
  model = transformers.Qwen2ForCausalLM(cfg).float()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif name.endswith("bias") and "o_proj" not in name:
        p.copy_(0.02 * torch.randn_like(p))
  model.eval().save_pretrained(path)
  return model


def _config(hf_dir):
  c = config_lib.load_config("configs/grpo_arith.py", "small,lora=True")
  return config_lib.override(c, {
      "sft.steps": 0, "train.steps": 2, "train.ckpt_every": 2, "train.eval_every": 2, "train.plot_every": 0,
      "train.sample_every": 0, "eval.size": 16, "eval.batch": 16, "eval.n_samples": 1, "eval.pass_k": (1,),
      "sampling.max_new_tokens": 12, "task.train_size": 64, "task.test_size": 32, "log.tensorboard": False,
      "log.plots": False, "model.lora.rank": 4, "model.lora.alpha": 8.0, "optim.lr": 2e-2,
      "train.init_from": f"hf:{hf_dir}"})


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("lora_run")
  hf_dir = str(root / "base")
  base_model = _save_qwen2(hf_dir, seed=0)
  run_dir = str(root / "run")
  c = _config(hf_dir)
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    f.write(c.to_json())
  train.run_rl(c, run_dir)
  return dict(root=root, hf_dir=hf_dir, run_dir=run_dir, config=c, base_model=base_model)


def _ours(run_dir, hf_dir, config):
  """Our LoRA forward on the run's last checkpoint: the base from hf_dir, the checkpoint's adapters."""
  mcfg = model_lib.ModelConfig.from_config(config.model)
  got = export_lib.restore_params(run_dir, mcfg, 0, config, want_adapters=True)
  (base, adapters), step = got.params, got.step
  logits = _forward(mcfg, lora.combine(base, adapters), TOKENS.astype(np.int32), POS.astype(np.int32),
                    MASK.astype(np.int32))
  return np.asarray(logits), step, adapters


# the forwards compiled as the product runs them: op by op each was ~45 single-op compiles
_forward = jax.jit(model_lib.forward, static_argnums=0)


@functools.partial(jax.jit, static_argnums=0)
def _perturbed(mcfg, scale, key, init_key):
  """init_adapters plus scale·N(0, 1) on every leaf (B ≠ 0: a trained adapter), in one program (per leaf and op
  eagerly: three compiles a leaf shape), from one normal draw over all leaves (tests/noise.py: a draw per leaf
  compiled a threefry per leaf)."""
  return noise.add_noise(lora.init_adapters(mcfg, init_key), key, scale)


def _hf_logits(model):
  with torch.no_grad():
    return model(input_ids=torch.tensor(TOKENS), attention_mask=torch.tensor(MASK),
                 position_ids=torch.tensor(POS)).logits.numpy()


def test_lora_run_rows_keep_the_metrics_contract(lora_run):
  """A LoRA run's metrics.jsonl as docs/metrics.md says (tests/metrics_contract.py)."""
  rows = metrics_contract.check_run(lora_run["run_dir"])
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
  assert [r["step"] for r in rows if "perf/eval_time_s" in r] == [0, 2]


def test_checkpoint_holds_adapters_and_the_base_identity(lora_run):
  ck = os.path.join(lora_run["run_dir"], "checkpoints")
  meta = checkpoint.read_meta(ck, 2)
  assert meta["base"]["source"] == f"hf:{lora_run['hf_dir']}" and len(meta["base"]["checksum"]) == 16
  names = set(os.listdir(os.path.join(ck, "2", "state")))
  saved = json.dumps(sorted(names)) + open(os.path.join(ck, "2", "state", "_METADATA")).read()
  assert "lora_a" in saved and "'base'" not in saved and '"base"' not in saved and "ref_params" not in saved


def test_peft_loads_our_adapter_dir_and_its_logits_equal_ours(lora_run):
  real = MASK > 0
  ours, step, adapters = _ours(lora_run["run_dir"], lora_run["hf_dir"], lora_run["config"])
  assert step == 2 and float(np.abs(np.asarray(adapters["layers"]["q"]["lora_b"])).max()) > 1e-4  # trained
  out = str(lora_run["root"] / "peft")
  summary = export_lib.export(lora_run["run_dir"], out, format="peft")
  assert summary["files"] == ["adapter_config.json", "adapter_model.safetensors"]
  base = transformers.AutoModelForCausalLM.from_pretrained(lora_run["hf_dir"]).float().eval()
  base_logits = _hf_logits(base)
  model = _peft().PeftModel.from_pretrained(base, out).eval()
  got = _hf_logits(model)
  np.testing.assert_allclose(got[real], ours[real], atol=1e-5, rtol=0)
  assert np.abs(got[real] - base_logits[real]).max() > 1e-3  # the adapters change the model

  merged_dir = str(lora_run["root"] / "merged")
  export_lib.export(lora_run["run_dir"], merged_dir)
  merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).float().eval()
  np.testing.assert_allclose(_hf_logits(merged)[real], ours[real], atol=1e-5, rtol=0)
  # and PEFT's own merge of our adapters gives the weights we wrote
  w_peft = model.merge_and_unload().model.layers[1].self_attn.q_proj.weight.detach().numpy()
  np.testing.assert_allclose(merged.model.layers[1].self_attn.q_proj.weight.detach().numpy(), w_peft, atol=1e-6)


def test_merged_export_of_a_bfloat16_base_keeps_the_adapter_delta():
  """model.lora.base_dtype=bfloat16: the merged export's W + scale·A·B was rounded to bfloat16 (the base kernel's
  dtype), which lost ~12% of a small adapter's effect on the logits; it is merged in float32 now and equals the
  policy the run trained (bf16 base + float32 adapters)."""
  import dataclasses
  from grpo_jax.model.model_config import LoraConfig
  plain = model_lib.ModelConfig(vocab_size=64, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, max_len=64,
                                qkv_bias=True, tie_embeddings=False)
  mcfg = dataclasses.replace(plain, lora=LoraConfig(8, 16.0, base_dtype="bfloat16"))
  # the set-up and the forwards jitted: op by op they were ~150 single-op compiles (4.5 -> 3.6 CPU-s, 2026-12-07)
  base, adapters = jax.jit(lambda: (
      lora.hold_base(mcfg, model_lib.init_params(plain, jax.random.PRNGKey(0))),
      # B ~ 1e-3: a few steps of training (one normal draw over the leaves: tests/noise.py)
      noise.add_noise(lora.init_adapters(mcfg, jax.random.PRNGKey(1)), jax.random.PRNGKey(2), 1e-3)))()
  forward = jax.jit(model_lib.forward, static_argnums=0)
  tokens, pos, mask = (np.asarray(x, np.int32) for x in (TOKENS, POS, MASK))
  f32 = lambda p: jax.tree.map(lambda x: x.astype(np.float32), p)
  policy = np.asarray(forward(mcfg, lora.combine(base, adapters), tokens, pos, mask))
  effect = np.abs(policy - np.asarray(forward(plain, f32(base), tokens, pos, mask))).max()
  merged = export_lib.merged_policy(mcfg, base, adapters)
  assert merged["layers"]["q"]["kernel"].dtype == np.float32 and "lora_a" not in merged["layers"]["q"]
  err = np.abs(np.asarray(forward(plain, f32(merged), tokens, pos, mask)) - policy).max()
  assert effect > 5e-3 and err < 1e-3 * effect, (effect, err)


@pytest.mark.parametrize("kind,rank,targets,rslora", [
    ("llama", 3, ("q_proj", "o_proj", "down_proj"), True),  # head_dim 12 != hidden / heads, GQA, rsLoRA scale
    ("qwen2", 1, ("k_proj", "v_proj", "gate_proj", "up_proj"), False)])
def test_peft_loads_adapters_of_any_rank_and_targets(tmp_path, kind, rank, targets, rslora):
  """save_peft's layout for a subset of targets, rank 1, rsLoRA's alpha/sqrt(r) and an explicit head_dim (o's two
  input axes, k/v's kv heads), against PEFT's own forward; the end-to-end test above covers the default targets."""
  import dataclasses
  from grpo_jax.hf import peft_export
  from grpo_jax.model.model_config import LoraConfig
  cls_cfg, cls = ((transformers.Qwen2Config, transformers.Qwen2ForCausalLM) if kind == "qwen2" else
                  (transformers.LlamaConfig, transformers.LlamaForCausalLM))
  torch.manual_seed(0)
  hf = cls(cls_cfg(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=12, max_position_embeddings=64, tie_word_embeddings=False)).float()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
  hf.eval().save_pretrained(tmp_path / "base")
  mcfg, base = hf_io.load_hf(str(tmp_path / "base"))
  mcfg = dataclasses.replace(mcfg, lora=LoraConfig(rank, 7.0, targets, rslora))
  adapters = _perturbed(mcfg, 0.2, jax.random.PRNGKey(2), jax.random.PRNGKey(1))
  ours = np.asarray(_forward(mcfg, lora.combine(base, adapters), TOKENS.astype(np.int32), POS.astype(np.int32),
                             MASK.astype(np.int32)))
  peft_export.save_peft(str(tmp_path / "peft"), mcfg, adapters)
  plain = _hf_logits(hf)  # before PEFT wraps hf (it injects the adapters in place)
  got = _hf_logits(_peft().PeftModel.from_pretrained(hf, str(tmp_path / "peft")).eval())
  real = MASK > 0
  np.testing.assert_allclose(got[real], ours[real], atol=5e-5, rtol=0)
  assert np.abs(got[real] - plain[real]).max() > 0.1  # the adapters change the model


def test_resume_onto_another_base_is_refused_in_one_line(lora_run):
  _save_qwen2(lora_run["hf_dir"], seed=1)  # the same path now holds another model
  c = config_lib.override(lora_run["config"], {"train.steps": 4})
  with pytest.raises(errors.InputError) as e:
    train.run_rl(config_lib.override(c, {"train.allow_config_change": "train.steps"}), lora_run["run_dir"])
  msg = str(e.value)
  assert "\n" not in msg and "checksum" in msg and "train.init_from" in msg, msg
  with pytest.raises(config_lib.ConfigError, match="checksum"):
    export_lib.export(lora_run["run_dir"], str(lora_run["root"] / "merged2"))


def test_peft_export_of_a_params_checkpoint_base_says_how_to_export_the_base(tmp_path):
  """A LoRA run whose base is a params checkpoint (the main job's DIR/sft/params), not hf:<dir>: its PEFT export
  cannot name a base (base_model_name_or_path null) and its summary says to export the base, with the command;
  `--format=base` writes that base (checked against the checkpoint's identity), and PEFT on it gives the merged
  export's logits."""
  c = config_lib.override(_config(""), {"train.init_from": str(tmp_path / "sft" / "params")})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  base = model_lib.init_params(mcfg, jax.random.PRNGKey(3))
  from grpo_jax.infra import params_ckpt
  params_ckpt.save_params(c.train.init_from, base)
  adapters = _perturbed(mcfg, 0.05, jax.random.PRNGKey(5), jax.random.PRNGKey(4))
  run = tmp_path / "run"
  ck = checkpoint.Checkpointer(str(run / "checkpoints"), save_every=2, keep=3, async_save=False)
  ck.set_frozen(c.train.init_from, lora.hold_base(mcfg, base))
  ck.maybe_save(2, {"params": adapters, "base": lora.hold_base(mcfg, base)}, {"step": 2})
  ck.close()
  (run / "config.json").write_text(c.to_json())
  summary = export_lib.export(str(run), str(tmp_path / "peft"), format="peft")
  assert "not a Hugging Face checkpoint" in summary["base"] and c.train.init_from in summary["base"]
  assert f"python -m grpo_jax.export {run} BASE_DIR --format=base --step 2" in summary["base"], summary["base"]
  assert json.load(open(tmp_path / "peft" / "adapter_config.json"))["base_model_name_or_path"] is None
  assert "; base: the adapters were trained on" in export_lib.describe(summary, str(tmp_path / "peft"))
  got = export_lib.export(str(run), str(tmp_path / "base"), format="base")
  assert got["step"] == 2 and got["source"].startswith("the frozen base of ")
  for a, b in zip(jax.tree.leaves(hf_io.load_params(str(tmp_path / "base"), mcfg)), jax.tree.leaves(base)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  export_lib.export(str(run), str(tmp_path / "merged"))
  real = MASK > 0
  base_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).float().eval()
  with_adapters = _peft().PeftModel.from_pretrained(base_model, str(tmp_path / "peft")).eval()
  merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).float().eval()
  np.testing.assert_allclose(_hf_logits(with_adapters)[real], _hf_logits(merged)[real], atol=1e-5, rtol=0)


def test_peft_export_names_the_base_the_adapters_trained_on_not_the_sft_source(tmp_path):
  """A grpo job whose SFT stage starts from sft.init_from=hf:X trains its adapters on DIR/sft/params (the SFT'd
  model, recorded in the checkpoint), but the PEFT export named X (the config's model source) in adapter_config.json
  and its summary: PeftModel on X is the model without its SFT. It names the recorded base now: a params
  checkpoint, so no name and the hint to export that base."""
  hf_dir = tmp_path / "hf"
  hf_dir.mkdir()  # the config's model source (the peft export reads no file of it)
  run = tmp_path / "run"
  sft_params = str(run / "sft" / "params")
  c = config_lib.override(_config(""), {"train.init_from": "", "sft.steps": 2, "sft.init_from": f"hf:{hf_dir}"})
  mcfg = model_lib.ModelConfig.from_config(c.model)
  from grpo_jax.infra import params_ckpt
  base = model_lib.init_params(mcfg, jax.random.PRNGKey(3))
  params_ckpt.save_params(sft_params, base)
  adapters = lora.init_adapters(mcfg, jax.random.PRNGKey(4))
  ck = checkpoint.Checkpointer(str(run / "checkpoints"), save_every=2, keep=3, async_save=False)
  ck.set_frozen(sft_params, lora.hold_base(mcfg, base))  # as jobs.run_group's RL stage: init_from=DIR/sft/params
  ck.maybe_save(2, {"params": adapters, "base": lora.hold_base(mcfg, base)}, {"step": 2})
  ck.close()
  (run / "config.json").write_text(c.to_json())
  summary = export_lib.export(str(run), str(tmp_path / "peft"), format="peft")
  assert json.load(open(tmp_path / "peft" / "adapter_config.json"))["base_model_name_or_path"] is None
  assert sft_params in summary["base"] and "--format=base" in summary["base"], summary["base"]
