"""Every user input error the CLI can meet is ONE line with exit status 2, names the key or path, and writes nothing.

The cases run `main.execute` in-process (the CLI after flag parsing: preflight, lock, plan) — validation happens
before anything compiles, so each case costs milliseconds; the flag-parsing cases run the real CLI. The list is
docs/reliability.md's table of input-error kinds (keep them in sync).
"""
import json
import os
import resource
import subprocess
import sys

import pytest

import conftest  # tests/conftest.py: requires

from grpo_jax.infra import errors
from grpo_jax import cli
from grpo_jax import main
from grpo_jax.infra import workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
  root = tmp_path_factory.mktemp("inputs")
  (root / "a_file").write_text("not a directory")
  (root / "hf_empty").mkdir()
  (root / "hf_noweights").mkdir()
  (root / "hf_noweights" / "config.json").write_text(json.dumps(
      {"model_type": "qwen2", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "intermediate_size": 128}))
  (root / "hf_partial").mkdir()
  (root / "hf_partial" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
  (root / "hf_gpt2").mkdir()
  (root / "hf_gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  (root / "hf_gpt2" / "model.safetensors").write_bytes(b"\0" * 8)
  (root / "hf_badjson").mkdir()
  (root / "hf_badjson" / "config.json").write_text("{not json")
  (root / "hf_badjson" / "model.safetensors").write_bytes(b"\0" * 8)
  # params checkpoints: a run dir, one training-state step, a params checkpoint of another model; .bin-only HF dir
  (root / "a_run" / "checkpoints").mkdir(parents=True)
  (root / "a_step" / "state").mkdir(parents=True)
  import jax
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  from configs import grpo_arith
  from tests import hf_dirs
  import numpy as np

  def zeros(m):
    """Params of model config m's shapes and dtypes, as NumPy zeros: every case reads their shapes, none their
    values, and init_params compiled each model's init (~1.7 s apiece, 4 models)."""
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), model_lib.param_shapes(m))

  c = grpo_arith.get_config("small")
  c.model.hidden = 32
  params_ckpt.save_params(str(root / "other_params"), zeros(model_lib.ModelConfig.from_config(c.model)))
  # a training-state tree (DIR/checkpoints/<n>/state) given as init_from, and the checkpoints dir holding it
  params = zeros(model_lib.ModelConfig.from_config(grpo_arith.get_config("small").model))
  params_ckpt.save_params(str(root / "a_run2" / "checkpoints" / "3" / "state"),
                          {"params": params, "opt_state": {"mu": params}, "step": 3})
  # HF dirs (random tiny Qwen2-shaped weights, ours saved as HF): one without tokenizer files (its vocab is not the
  # shipped tokenizer's), one holding a Llama-3-style tokenizer under a config with 2,000 more embedding rows and
  # another eos id
  from grpo_jax.hf import hf_save
  import dataclasses
  mcfg = model_lib.ModelConfig.from_config(grpo_arith.get_config("small").model)

  def hf_dir(name, vocab, **cfg):
    m = dataclasses.replace(mcfg, vocab_size=vocab, max_len=512)
    hf_save.save_hf(str(root / name), m, zeros(m), model_type="qwen2")
    path = root / name / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **cfg}))

  hf_dir("hf_notok", 600)
  llama_tok = hf_dirs.train_tokenizer(hf_dirs.LLAMA_SPECIALS, split=hf_dirs.LLAMA3_SPLIT, nfc=False)
  n = llama_tok.get_vocab_size()
  hf_dir("hf_llama_in_qwen", n + 2000, eos_token_id=n + 1500, bos_token_id=n + 1499)
  hf_dirs.write_tokenizer(str(root / "hf_llama_in_qwen"), llama_tok, {"bos_token": "<|begin_of_text|>",
                                                                       "eos_token": "<|end_of_text|>"})
  (root / "hf_bin").mkdir()
  (root / "hf_bin" / "config.json").write_text((root / "hf_noweights" / "config.json").read_text())
  (root / "hf_bin" / "pytorch_model.bin").write_bytes(b"\0" * 8)
  # the shipped sentencepiece model with its four tags renamed ([think] ...): no piece is a tag
  from sentencepiece import sentencepiece_model_pb2
  from grpo_jax.tasks import tokenizer as tokenizer_lib
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(open(tokenizer_lib.ASSET, "rb").read())
  for piece in proto.pieces:
    if piece.piece in tokenizer_lib.TAGS:
      piece.piece = piece.piece.replace("<", "[").replace(">", "]")
  (root / "notags.model").write_bytes(proto.SerializeToString())
  # GSM8K-format data dirs: none of the layouts; a test split smaller than eval.size; a question too long
  (root / "gsm8k_none").mkdir()
  (root / "gsm8k_none" / "notes.txt").write_text("no data here")
  hf_dirs.gsm8k_jsonl(str(root / "gsm8k_small_test"), n_train=8, n_test=2)
  hf_dirs.gsm8k_jsonl(str(root / "gsm8k_long"), n_train=8, n_test=4)
  with open(root / "gsm8k_long" / "train.jsonl", "a") as f:
    f.write(json.dumps({"question": "How many apples? " * 80, "answer": "1 + 1 = 2\n#### 2"}) + "\n")
  return root


# (config, overrides, substring of the one error line). `{p}` is the `paths` fixture's directory.
CASES = [
    # config values
    ("grpo", {"rl.G": 1}, "config.rl.G"),
    # 10**12 rows: the split planner listed every number up to the rows, then planned every pair (no end in sight)
    ("grpo", {"rl.G": 10**12}, "config.rl.rollout_chunks=1, rl.minibatches=1 (set): the step plans"),
    ("grpo", {"rl.prompts_per_step": -2}, "config.rl.prompts_per_step"),
    ("grpo", {"rl.algo": "grpoo"}, "config.rl.algo"),
    ("grpo", {"rl.kl_estimator": "k4"}, "config.rl.kl_estimator"),
    ("grpo", {"rl.kl_in": "both"}, "config.rl.kl_in"),
    ("grpo", {"rl.loss_agg": "sum"}, "config.rl.loss_agg"),
    ("grpo", {"rl.eps_low": 1.5}, "config.rl.eps_low"),
    ("grpo", {"rl.beta": float("nan")}, "config.rl.beta"),
    ("grpo", {"rl.std_ddof": 2}, "config.rl.std_ddof"),
    ("grpo", {"rl.mu": 0}, "config.rl.mu"),
    ("grpo", {"rl.rollout_correction": "mis", "rl.mis_lo": 3.0}, "config.rl.mis_lo: 3.0 and rl.mis_hi=2.0"),
    ("grpo", {"rl.minibatches": 3}, "config.rl.minibatches"),
    ("grpo", {"rl.reward_fallback": "zero"}, "config.rl.reward_fallback"),
    ("grpo", {"rl.process_weight": 0.5}, "config.rl.process_weight"),
    ("grpo", {"rl.reward_timeout_s": 0.0}, "config.rl.reward_timeout_s"),
    ("grpo", {"rl.reward_timeout_s": -1.0}, "config.rl.reward_timeout_s"),
    ("grpo", {"rl.advantage": "reinforce_pp", "rl.kl_in": "loss"}, "config.rl.kl_in"),
    ("grpo", {"sampling.top_p": 1.5}, "config.sampling.top_p"),
    ("grpo", {"sampling.top_k": -1}, "config.sampling.top_k"),
    ("grpo", {"sampling.temperature": 0.0}, "config.sampling.temperature"),
    ("grpo", {"sampling.max_new_tokens": 1000}, "model.max_len"),
    ("grpo", {"optim.lr": -1.0}, "config.optim.lr"),
    ("grpo", {"optim.lr": 0.0}, "config.optim.lr"),
    ("grpo", {"optim.b2": 1.2}, "config.optim.b2"),
    ("grpo", {"model.kv_heads": 3}, "config.model.kv_heads"),
    ("grpo", {"model.hidden": 0}, "config.model.hidden"),
    ("grpo", {"model.head_dim": 3}, "config.model.head_dim"),
    ("grpo", {"model.dtype": "float16"}, "config.model.dtype"),
    ("grpo", {"model.remat": "some"}, "config.model.remat"),
    ("grpo", {"model.vocab_size": 500}, "config.model.vocab_size"),
    # sizes no host can trace: a MemoryError traceback from the memory planner (numpy's RoPE table of head_dim / 2)
    ("grpo", {"model.hidden": 10**12}, "config.model: tracing its shapes for the memory plan ran out of host memory"),
    ("grpo", {"model.head_dim": 10**12}, "check them for a typo"),
    ("grpo", {"model.attention": "flash"}, "model.attention"),
    ("grpo", {"model.layer_unroll": "some"}, "model.layer_unroll"),
    ("grpo", {"task.name": "sudoku"}, "task.name"),
    ("grpo", {"task.language": "c"}, "task.language"),
    ("grpo", {"task.ops": "+/"}, "task.ops"),
    ("grpo", {"task.max_digits": 0}, "task.max_digits"),
    ("grpo", {"mesh.data": 16}, "config.mesh"),
    ("grpo", {"mesh.data": 0}, "config.mesh.data"),
    ("grpo", {"ppo.lam": 1.5}, "config.ppo.lam"),
    ("grpo", {"train.steps": 0}, "config.train.steps"),
    # JAX keeps a seed's low 32 bits (2**32 ran seed 0's run, -7 ran 2**32 - 7's); 2**63 was an OverflowError late
    ("grpo", {"seed": 2**32}, "config.seed: must be an integer in [0, 2**31), got 4294967296"),
    ("grpo", {"seed": -7}, "config.seed"),
    ("grpo", {"run_seed": 2**63}, "config.run_seed: must be an integer in [0, 2**31) or -1 (= seed)"),
    ("grpo", {"train.ckpt_every": 0}, "config.train.ckpt_every"),
    ("grpo", {"train.keep_checkpoints": 0}, "config.train.keep_checkpoints"),
    ("grpo", {"eval.batch": 250}, "eval.batch=250"),
    ("grpo", {"eval.size": 1000}, "config.eval.size"),
    ("grpo", {"eval.pass_k": (1, 8)}, "config.eval.pass_k"),
    ("grpo", {"job": "ppo"}, "job=grpo rl.algo=ppo"),
    ("grpo", {"job": "nope"}, "config.job"),
    ("grpo", {"rewards": (("nosuch", 1.0),)}, "config.rewards[0]: unknown reward term 'nosuch'"),
    ("grpo", {"rewards": (("accuracy",),)}, "config.rewards[0]"),
    # reward lists: a NaN weight stopped the run at step 1, () or all-0 weights trained nothing, a repeated term
    # doubled its score under one metric, a malformed entry beside rl.process_weight / in r1.*.rewards was a traceback
    ("grpo", {"rewards": (("accuracy", float("nan")),)}, "config.rewards[0]: must be a (name, weight) pair with a "
                                                          "finite weight"),
    ("grpo", {"rewards": (("accuracy", 1e39),)}, "config.rewards[0]"),  # inf in float32
    ("grpo", {"rewards": ()}, "config.rewards: is (): every reward would be 0"),
    ("grpo", {"rewards": (("accuracy", 0.0), ("format", 0))}, "config.rewards: is (('accuracy', 0.0), ('format', 0))"),
    ("grpo", {"rewards": (("accuracy", 1.0), ("accuracy", 1.0))}, "config.rewards[1]: names 'accuracy' a second time"),
    ("grpo", {"rl.process_weight": 0.5, "rewards": (("process",),)}, "config.rewards[0]"),
    ("r1", {"r1.zero.rewards": (("format",),)}, "config.r1.zero.rewards[0]"),
    ("r1", {"r1.final.rewards": ()}, "config.r1.final.rewards: is ()"),
    ("gsm8k", {"task.data_dir": "{p}/gsm8k_small_test", "rewards": (("incorrect", 1.0),)},
     "config.rewards: the 'incorrect' term parses answers in-graph"),
    ("grpo", {"task.train_indices": (5, 5)}, "config.task.train_indices: (5, 5): give distinct integers"),
    # a split generated whole before the first step: 10**12 examples hung in the TFDS build (a few thousand a second)
    ("grpo", {"task.train_size": 10**12}, "config.task.train_size: 1,000,000,000,000 examples would be generated "
                                          "before the first step"),
    ("sft", {"task.test_size": 10**8}, "config.task.test_size: 100,000,000 examples would be generated"),
    ("grpo", {"rl.ref_reset_every": 5, "rl.beta": 0.0}, "config.rl.ref_reset_every: is 5 but rl.beta = 0"),
    ("grpo", {"train.allow_config_change": "rl.GG"}, "config.train.allow_config_change: 'rl.GG'"),
    ("grpo", {"train.rerun_stages": "r1_zero"}, "config.train.rerun_stages: 'r1_zero'"),
    ("grpo", {"train.rerun_stages": "rl"}, "is the run in --workdir itself"),
    ("grpo", {"sft.batch": 0}, "config.sft.batch"),  # the job's SFT stage: its keys are checked before anything
    ("grpo", {"sft.steps": -5}, "config.sft.steps"),  # not "no SFT stage"
    ("grpo", {"sft.lr": -1.0}, "config.sft.lr"),
    # one rule per kind: every learning rate finite and > 0, every fallback finite, every scale finite
    ("grpo", {"sft.lr": 0.0}, "config.sft.lr: is 0: nothing would train"),
    ("grpo", {"rl.reward_fallback": "nan"}, "config.rl.reward_fallback: must be '' (stop on a failure) or a finite"),
    ("grpo", {"rl.reward_fallback": "inf"}, "config.rl.reward_fallback"),
    ("grpo", {"rl.reward_fallback": "1e39"}, "config.rl.reward_fallback"),  # finite, but inf in the step's float32
    ("grpo", {"model.rope_theta": float("inf")}, "config.model.rope_theta"),
    ("grpo", {"model.rope_scaling_factor": float("nan")}, "config.model.rope_scaling_factor"),
    ("grpo", {"optim.lr": float("nan")}, "config.optim.lr: must be a finite learning rate"),
    ("grpo", {"optim.lr": 1e39}, "config.optim.lr: must be a finite learning rate"),  # inf in float32
    # finite but no setting (validate.MAX_LR, MAX_TEMPERATURE): they ran, the model overwritten / sampling uniform
    ("grpo", {"optim.lr": 1e30}, "config.optim.lr: is 1e+30: AdamW moves every weight by about the learning rate"),
    ("sft", {"sft.lr": 10.0}, "config.sft.lr: is 10.0: AdamW moves every weight"),
    ("r1", {"r1.final.lr": 5.0}, "config.r1.final.lr: is 5.0: AdamW"),
    ("grpo", {"sampling.temperature": 1e30}, "config.sampling.temperature: is 1e+30: sampling draws from "
                                             "softmax(logits / temperature), which past 100 is all but uniform"),
    ("r1", {"r1.rejection.temperature": 1000.0}, "config.r1.rejection.temperature: is 1000.0: sampling draws"),
    ("r1", {"r1.pretrain.lr": 0.0}, "config.sft.lr: is 0: nothing would train; set a positive learning rate (stage "
                                    "base takes sft.steps/batch/lr/warmup_steps from r1.pretrain)"),
    ("r1", {"r1.final.lr": float("nan")}, "config.r1.final.lr: must be a finite learning rate > 0 (or 0 = optim.lr)"),
    ("grpo", {"sft.loss_on": "some"}, "config.sft.loss_on"),
    ("grpo", {"train.sample_every": -1}, "config.train.sample_every"),
    ("grpo", {"task.overlong_prompts": "cut"}, "config.task.overlong_prompts"),
    ("grpo", {"task.prompt_len": 8}, "config.task.prompt_len: 20000 of the 20000 train prompts are longer"),
    ("sft", {"sft.steps": 0}, "config.sft.steps"),
    ("sft", {"sft.loss_on": "some"}, "config.sft.loss_on"),
    ("sft", {"sft.batch": 0}, "config.sft.batch"),
    # the AdamW keys an SFT job reads (it ran on with optim.b2 = 5: NaN losses, exit 0)
    ("sft", {"optim.b2": 5.0}, "config.optim.b2"),
    ("sft", {"optim.grad_clip": -1.0}, "config.optim.grad_clip"),
    ("sft", {"optim.eps": float("nan")}, "config.optim.eps"),
    ("grpo", {"optim.eps": 0.0}, "config.optim.eps"),
    # an SFT sequence longer than model.max_len: was a ValueError traceback at the first batch, files written
    ("sft", {"model.max_len": 64}, "config.model.max_len: 64 tokens are too few for the SFT stage: "),
    ("grpo", {"model.max_len": 100, "task.prompt_len": 60, "sampling.max_new_tokens": 40},
     "config.model.max_len: 100 tokens are too few for the SFT stage"),
    ("r1", {"r1.stages": ("nope",)}, "config.r1.stages"),
    ("r1", {"r1.rejection.general_frac": 1.0}, "config.r1.rejection.general_frac"),
    ("r1", {"r1.zero.rewards": (("nosuch", 1.0),)}, "config.r1.zero.rewards"),
    # a subset of stages whose upstream never ran here: was a FileNotFoundError traceback (no data.jsonl)
    ("r1", {"r1.stages": ("r1_4_sft",)}, "config.r1.stages: ('r1_4_sft',) runs r1_4_sft, which reads the outputs "
                                         "of base, but "),
    # multi-turn tools (configs/tools_calc.py:small; docs/tools.md)
    ("tools", {"tools.env": "no_such_module_x:Env"}, "config.tools.env='no_such_module_x:Env': module"),
    ("tools", {"tools.stop_markers": ("</calc>",)}, "config.tools.stop_markers: '</calc>' is not one token"),
    ("tools", {"tools.max_turns": 0}, "config.tools.max_turns: must be an integer >= 1"),
    ("tools", {"sampling.engine": "static"}, "config.tools.env: 'calculator': rows pause for the environment"),
    # rejection sampling runs the environment in the continuous engine (before, tools.env with it was refused)
    ("tools", {"r1.stages": ("r1_3_rejection",), "sampling.engine": "static"},
     "config.sampling.engine: 'static': rejection sampling (r1_3_rejection) with tools.env='calculator'"),
    ("tools", {"r1.pretrain.mistake_frac": 0.2}, "config.r1.pretrain.tool_frac"),
    # a fallback reward no reward term reads (was dropped without a word)
    ("tools", {"tools.fallback_reward": -1.0}, "config.tools.fallback_reward: -1.0 reaches training only through"),
    # a looping sandbox call outlived tools.timeout_s: abandoned, not answered 'timed out'; four at once: exit 3
    ("tools", {"tools.env": "python", "tools.sandbox.time_s": 9.5}, "config.tools.sandbox.time_s: 9.5 s leaves less"),
    # paths and files
    ("grpo", {"task.tokenizer": "/nonexistent/tok.model"}, "/nonexistent/tok.model"),
    ("grpo", {"task.tokenizer": "hf:/nonexistent_hf_dir"}, "/nonexistent_hf_dir"),
    ("grpo", {"task.tokenizer": "init_from"}, "task.tokenizer='init_from' needs train.init_from=hf:"),
    ("grpo", {"task.data_dir": "{p}/a_file"}, "config.task.data_dir"),
    ("grpo", {"task.tokenizer": "{p}/a_file"}, "is not a sentencepiece model"),
    # an in-graph task's tokenizer without the tags as pieces (trained silently with <unk> as every tag)
    ("grpo", {"task.tokenizer": "{p}/notags.model"}, "config.task.tokenizer: task 'arith' is verified in-graph on "
                                                     "token ids and needs <think>, </think>, <answer>, </answer>"),
    ("gsm8k", {"task.data_dir": "{p}/gsm8k_none"}, "has no train.jsonl, no train parquet"),
    ("gsm8k", {"task.data_dir": "{p}/gsm8k_small_test"}, "config.eval.size: 4 exceeds the 2 usable examples"),
    ("gsm8k", {"task.data_dir": "{p}/gsm8k_long"}, "config.task.prompt_len: 1 of the 9 train prompts are longer"),
    ("grpo", {"train.init_from": "/nonexistent/params"}, "config.train.init_from=/nonexistent/params does not exist"),
    ("grpo", {"train.init_from": "{p}/a_file"}, "is a file"),
    ("grpo", {"train.init_from": "hf:/nonexistent_hf_dir"}, "is not a directory"),
    ("grpo", {"train.init_from": "hf:{p}/hf_empty"}, "config.json is missing"),
    ("grpo", {"train.init_from": "hf:{p}/hf_noweights"}, "no *.safetensors"),
    ("grpo", {"train.init_from": "hf:{p}/hf_bin"}, "holds PyTorch .bin/.pt weights only"),
    ("grpo", {"train.init_from": "{p}/a_run"}, "is a run directory, not a params checkpoint"),
    ("grpo", {"train.init_from": "{p}/a_step"}, "is one step of a run's training checkpoints"),
    ("grpo", {"train.init_from": "{p}/a_run2/checkpoints/3/state"}, "is a training-state tree (params, optimizer "
                                                                    "state, step, rng"),
    ("grpo", {"train.init_from": "{p}/a_run2/checkpoints"}, "is a run's checkpoints directory"),
    ("gsm8k", {"train.init_from": "hf:{p}/hf_notok"}, "hf_notok, whose own tokenizer cannot be read: {p}/hf_notok "
                                                       "has no tokenizer.json (nor any other tokenizer file)"),
    ("gsm8k", {"train.init_from": "hf:{p}/hf_notok", "task.tokenizer": "init_from"},
     "{p}/hf_notok has no tokenizer.json (nor any other tokenizer file)"),
    ("gsm8k", {"train.init_from": "hf:{p}/hf_llama_in_qwen", "task.tokenizer": "init_from"},
     "does not look like the model's"),
    ("grpo", {"train.init_from": "{p}/other_params"}, "the checkpoint holds a different model (14 params of another shape, e.g. ['embed']['embedding'] (512, 32)"),
    ("grpo", {"train.init_from": "hf:{p}/hf_partial"}, "lacks vocab_size, hidden_size"),
    ("grpo", {"train.init_from": "hf:{p}/hf_gpt2"}, "model_type='gpt2'"),
    ("grpo", {"train.init_from": "hf:{p}/hf_badjson"}, "hf_badjson/config.json"),
    ("sft", {"sft.init_from": "/nonexistent/params"}, "config.sft.init_from"),
    # partial rollouts (rl.partial_rollouts, rollout/carry.py)
    ("grpo", {"sampling.engine": "continuous", "rl.partial_rollouts": True, "rl.rollout_budget": -1},
     "config.rl.rollout_budget: must be an integer >= 0"),
    ("grpo", {"sampling.engine": "continuous", "rl.partial_rollouts": True, "rl.max_staleness": -1},
     "config.rl.max_staleness: must be an integer >= 0"),
    ("grpo", {"sampling.engine": "static", "rl.partial_rollouts": True}, "set sampling.engine='continuous'"),
    ("grpo", {"sampling.engine": "continuous", "rl.partial_rollouts": True, "rl.dynamic_sampling": True},
     "with rl.dynamic_sampling"),
    ("grpo", {"sampling.engine": "continuous", "rl.partial_rollouts": True, "rl.staleness_policy": "drop"},
     "config.rl.staleness_policy: unknown value 'drop'"),
    # a bool on a count / a non-bool on a switch (docs/reliability.md item 130): top_k=True ran as top_k=1
    ("grpo", {"sampling.top_k": True}, "config.sampling.top_k: is True, a bool where an integer is expected"),
    ("grpo", {"rl.G": False}, "config.rl.G: is False, a bool where an integer is expected"),
    # a config file's key the base config does not declare: read by nothing, the run trained with the default
    ("grpo", {"rl.select_fraction": 0.3}, "config.rl.select_fraction: no such key: nothing reads it (the keys: "
                                          "grpo_jax/config/config_lib.py); did you mean config.rl.select_frac?"),
    # work directories
    ("grpo", {"@workdir": "{p}/a_file"}, "is a file, not a directory"),
    ("grpo", {"@workdir": "{p}/a_file/run"}, "cannot be created"),
    ("grpo", {"@workdir": ""}, "--workdir is required"),
    # gs://: config.json, metrics.jsonl and the stage records went to a local directory gs:/..., the checkpoints to
    # the bucket
    ("grpo", {"@workdir": "gs://bucket/run"}, "--workdir=gs://bucket/run: an object-store workdir is not supported"),
]


def _config(kind: str, overrides: dict, p: str):
  from configs import grpo_arith, gsm8k, r1_pipeline, tools_calc
  c = {"r1": r1_pipeline, "gsm8k": gsm8k, "tools": tools_calc}.get(kind, grpo_arith).get_config("small")
  if kind == "sft":
    c.job = "sft"
  for key, value in overrides.items():
    if key.startswith("@"):
      continue
    value = value.replace("{p}", p) if isinstance(value, str) else value
    *parents, leaf = key.split(".")
    node, parent = c, None
    for part in parents:
      node, parent = node[part], node
    old = node.get(leaf)
    if isinstance(value, bool) and isinstance(old, (int, float)) and not isinstance(old, bool):
      # refused as it is set (config_lib._Declared); a config file building its own group dict gets it to the run
      parent[parents[-1]] = {**node.to_dict(), leaf: value}
    else:
      node[leaf] = value
  return c


@pytest.mark.parametrize("kind,overrides,needle", CASES, ids=[f"{k}:{o}" for k, o, _ in CASES])
def test_input_error_is_one_line_exit_2_and_writes_nothing(kind, overrides, needle, paths, tmp_path, capsys):
  p = str(paths)
  workdir = overrides.get("@workdir", str(tmp_path / "run")).replace("{p}", p)
  code = main.execute(_config(kind, overrides, p), workdir)
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if l.startswith(("Error:", "Config error:"))]
  assert code == errors.EXIT_INPUT, err[-3000:]
  assert len(lines) == 1 and needle.replace("{p}", p) in lines[0], err[-3000:]
  assert "Traceback" not in err
  assert not os.path.exists(tmp_path / "run")  # validation runs before the lock creates the workdir
  assert "://" not in workdir or not os.path.exists(os.path.abspath(workdir))  # gs://b/run was ./gs:/b/run


def test_optional_package_missing_is_one_line_before_anything(monkeypatch, tmp_path, capsys):
  """log.wandb_project without wandb installed: one line naming the key before the workdir exists (was an
  ImportError after the whole SFT stage). find_spec is made to miss so the case holds where wandb is installed."""
  from grpo_jax.run import preflight
  real = preflight.importlib.util.find_spec
  monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
  code = main.execute(_config("grpo", {"log.wandb_project": "proj"}, str(tmp_path)), str(tmp_path / "run"))
  err = capsys.readouterr().err
  assert code == errors.EXIT_INPUT and "Config error: config.log.wandb_project: needs the wandb package" in err, err
  assert not os.path.exists(tmp_path / "run")


def test_x64_mode_is_one_line_before_anything(tmp_path, capsys):
  """jax_enable_x64 (JAX_ENABLE_X64=1): the step did not trace (int64 and int32 indices) — a traceback after the
  workdir, the lock and the SFT stage; now one line before anything is written."""
  import jax
  with jax.enable_x64(True):
    code = main.execute(_config("grpo", {}, str(tmp_path)), str(tmp_path / "run"))
  err = capsys.readouterr().err
  assert code == errors.EXIT_INPUT and "Error: jax_enable_x64 is on" in err and "unset JAX_ENABLE_X64" in err, err
  assert "Traceback" not in err and not os.path.exists(tmp_path / "run")


def test_case_count():
  assert len(CASES) >= 40


def test_workdir_in_use(tmp_path, capsys):
  held = workdir_lock.WorkdirLock(str(tmp_path))
  held.acquire_local()
  try:
    code = main.execute(_config("grpo", {}, ""), str(tmp_path))
  finally:
    held.release()
  err = capsys.readouterr().err
  assert code == errors.EXIT_INPUT and f"is in use by another run (pid {os.getpid()}" in err, err[-2000:]
  assert os.listdir(tmp_path) == []


def test_storage_errors_are_one_line():
  """Disk full / read-only / quota / permissions anywhere in an exception chain (orbax wraps its async errors)."""
  import errno
  inner = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/ckpt/4/state/d/x")
  try:
    try:
      raise inner
    except OSError as e:
      raise RuntimeError("async save failed") from e
  except RuntimeError as wrapped:
    code, line = errors.classify(wrapped)
  assert code == 2 and line.startswith("Error: the disk is full writing /ckpt/4/state/d/x") and "\n" not in line
  code, line = errors.classify(ExceptionGroup("many", [ValueError("x"), OSError(errno.EROFS, "ro", "/w")]))
  assert code == 2 and "read-only writing /w" in line
  assert errors.classify(RuntimeError("a bug")) is None
  # tensorstore, orbax's array writer, puts the OS error in a ValueError's text (a real disk-full message):
  ts = ValueError('RESOURCE_EXHAUSTED: Error writing local file "/w/6.orbax-checkpoint-tmp/state/_sharding": Failed '
                  'writing: "/w/6.orbax-checkpoint-tmp/state/_sharding.__lock": Failed to write 19393 bytes to file '
                  "6: No space left on device [os_error_code='28']")
  code, line = errors.classify(ts)
  assert code == 2 and line.startswith("Error: the disk is full writing /w/6.orbax-checkpoint-tmp/state/_sharding.__lock")


_FSIZE_SCRIPT = r'''
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
sys.argv = ["main", "--config=configs/grpo_arith.py:runlocal", "--workdir=" + sys.argv[1]]
from grpo_jax import main
main._entry()
'''


def test_cli_write_failure_is_one_line(tmp_path):
  """A write the storage refuses (here: a file-size limit on config.json) ends as one line and exit 2."""
  out = subprocess.run([sys.executable, "-c", _FSIZE_SCRIPT, str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert out.returncode == 2, out.stderr[-3000:]
  assert out.stderr.strip().splitlines()[-1].startswith("Error: the file size limit is exceeded writing "), out.stderr
  assert "Traceback" not in out.stderr


# The real CLI for what fails while parsing flags (no JAX import happens before these errors).
CLI_CASES = [
    (["--config=configs/nope.py"], "Error: --config:"),
    (["--config=configs/grpo_arith.py", "--config.rl.nokey=3"], "Config error: config.rl.nokey: no such key"),
    (["--config=configs/grpo_arith.py", "--config.rl.G=abc"], "--config.rl.G=abc"),
    (["--config=configs/grpo_arith.py", "--nosuchflag"], "nosuchflag"),
    ([], "Error: --config is required"),
    (["--config=configs/grpo_arith.py", "stray"], "unexpected argument 'stray'"),
    # a group that does not exist names the key (it blamed the config file); an unknown :arg is its one line
    (["--config=configs/grpo_arith.py", "--config.foo.bar=1"], "Config error: config.foo.bar: no such key"),
    (["--config=configs/grpo_arith.py:bogus"], "Config error: --config: config arg 'bogus' is unknown; accepted:"),
    # a typo near a declared key: ml_collections' own "Did you mean" made this two garbled lines naming 'betta' alone
    (["--config=configs/grpo_arith.py", "--config.rl.G=4", "--config.rl.betta=0.1"],
     "Config error: config.rl.betta: no such key; did you mean config.rl.beta?"),
    # an ablation table's config given to main: it has no `job` (it was AttributeError "'job'", a traceback, exit 1)
    (["--config=configs/ablations/gdpo.py:small"],
     "Error: --config=configs/ablations/gdpo.py:small is an ablation table config; run it with python -m grpo_jax.ablate"),
]


def test_cli_flag_errors_are_one_line(tmp_path):
  for args, needle in CLI_CASES:
    out = subprocess.run([sys.executable, "-m", "grpo_jax.main", f"--workdir={tmp_path / 'run'}", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
    assert out.returncode == 2, (args, out.stderr[-2000:])
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr[-2000:])
  assert not os.path.exists(tmp_path / "run")


def test_a_config_file_giving_a_count_a_bool_is_one_line(tmp_path):
  """A config file's `c.sampling.top_k = True` (ConfigDict keeps a bool on an int key) ran as top_k=1, its
  `c.optim.lr = True` at lr 1.0 (ConfigDict casts it to the float; refused as it is set, config_lib._Declared); its
  `c.rl = ConfigDict({..., 'partial_rollouts': 'False'})` ran the carry ('False' is true). Exit 2, nothing written."""
  for body, needle in (
      ("c.sampling.top_k = True", "Config error: --config: config.sampling.top_k: is True, a bool where an integer"),
      ("c.optim.lr = True", "Config error: --config: config.optim.lr: is True, a bool where a number is expected"),
      ("c.rl = ml_collections.ConfigDict({**c.rl.to_dict(), 'partial_rollouts': 'False'})",
       "Config error: config.rl.partial_rollouts: must be True or False, got 'False'"),
      # the command line's word for an integer knob's auto, in a config file: ml_collections' cast error, which named
      # neither the group nor the number to write
      ("c.sampling.exit_chunk = 'auto'", "Config error: --config: config.sampling.exit_chunk = 'auto' in a config "
                                         "file: an integer knob's `auto` is its number there, -1")):
    cfg = tmp_path / "bool_config.py"
    cfg.write_text("import ml_collections\nfrom configs import grpo_arith\n\n\ndef get_config(arg=None):\n"
                   f"  c = grpo_arith.get_config(arg)\n  {body}\n  return c\n")
    out = subprocess.run([sys.executable, "-m", "grpo_jax.main", f"--workdir={tmp_path / 'run'}",
                          f"--config={cfg}:small"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
    assert out.returncode == 2, out.stderr[-2000:]
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
    assert not os.path.exists(tmp_path / "run")


def test_library_noise_is_one_line_once(capsys):
  """Without --verbose: an asyncio/orbax-style record with a traceback, logged from many tasks, is one line without
  the traceback; a library thread's exception and an unraisable one during cleanup are one line each, once."""
  import logging as std_logging
  import threading
  root = std_logging.getLogger()
  handler = std_logging.StreamHandler(sys.stderr)
  root.addHandler(handler)
  hooks = (threading.excepthook, sys.unraisablehook)
  try:
    cli.setup_logging(verbose=False)
    for _ in range(5):
      try:
        raise RuntimeError("Event loop is closed")
      except RuntimeError:
        std_logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=True)
    for _ in range(3):
      t = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError("Event loop is closed")))
      t.start()
      t.join()
  finally:
    threading.excepthook, sys.unraisablehook = hooks
    root.removeHandler(handler)
    for h in root.handlers + [handler]:
      h.filters.clear()
    std_logging.getLogger("absl").filters.clear()
  err = capsys.readouterr().err
  assert "Traceback" not in err, err
  assert err.count("Task exception was never retrieved") == 1, err
  assert err.count("a library thread failed: RuntimeError: Event loop is closed") == 1, err


def test_cpu_default_platform_only_without_an_accelerator(tmp_path):
  """grpo_jax sets JAX_PLATFORMS=cpu only when nothing is requested and no accelerator is attached (infra/
  console.py): a Google TPU on the PCI bus, an accel/vfio device, a GPU device node, or an explicit request leave
  JAX's choice alone."""
  from grpo_jax.infra import console
  bare = tmp_path / "bare"
  (bare / "sys/bus/pci/devices/0000:00:04.0").mkdir(parents=True)
  (bare / "sys/bus/pci/devices/0000:00:04.0/vendor").write_text("0x1af4\n")  # virtio: not an accelerator
  (bare / "dev").mkdir()
  env = {}
  assert console.default_platform(env, str(bare)) == "cpu" and env == {"JAX_PLATFORMS": "cpu"}
  for requested in ({"JAX_PLATFORMS": ""}, {"JAX_PLATFORMS": "tpu"}, {"JAX_FORCE_TPU_INIT": "1"},
                    {"TPU_ACCELERATOR_TYPE": "v5p-8"}):
    env = dict(requested)
    assert console.default_platform(env, str(bare)) is None and env == requested
  for name, make in (("tpu", lambda r: (r / "sys/bus/pci/devices/0000:00:05.0").mkdir(parents=True) or
                      (r / "sys/bus/pci/devices/0000:00:05.0/vendor").write_text("0x1ae0\n")),
                     ("accel", lambda r: (r / "dev").mkdir(parents=True) or (r / "dev/accel0").write_text("")),
                     ("nvidia", lambda r: (r / "dev").mkdir(parents=True) or (r / "dev/nvidiactl").write_text(""))):
    root = tmp_path / name
    make(root)
    env = {}
    assert console.default_platform(env, str(root)) is None and env == {}, name


def test_an_error_line_is_the_last_line(capsys):
  """Once the error line is decided, library records and library thread exceptions print nothing (orbax's writers,
  failing on a full disk, logged around and after it); the next setup_logging (a new command) clears that."""
  import logging as std_logging
  import threading
  from grpo_jax.infra import console
  root = std_logging.getLogger()
  handler = std_logging.StreamHandler(sys.stderr)
  root.addHandler(handler)
  hooks = (threading.excepthook, sys.unraisablehook)
  try:
    cli.setup_logging(verbose=False)
    console.silence_libraries()
    std_logging.getLogger("orbax").error("Failed to write metadata")
    t = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError("Event loop is closed")))
    t.start()
    t.join()
    assert capsys.readouterr().err == ""
    cli.setup_logging(verbose=False)
    std_logging.getLogger("orbax").error("Failed to write metadata")
    assert "Failed to write metadata" in capsys.readouterr().err
  finally:
    threading.excepthook, sys.unraisablehook = hooks
    root.removeHandler(handler)
    for h in root.handlers + [handler]:
      h.filters.clear()
    std_logging.getLogger("absl").filters.clear()


NEEDS_LIBTPU = conftest.requires("libtpu", "libtpu is not installed: a CPU run is quiet without it anyway")


@NEEDS_LIBTPU
def test_a_cpu_cli_run_prints_no_libtpu_errors(tmp_path):
  """With libtpu installed and no JAX_PLATFORMS set, a CLI run that starts JAX's backend (preflight counts the
  devices) printed five lines of libtpu errors before its own; on a machine without an accelerator it prints only
  its own line now."""
  from grpo_jax.infra import console
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT", "TPU_ACCELERATOR_TYPE")}
  out = subprocess.run([sys.executable, "-m", "grpo_jax.main", f"--workdir={tmp_path / 'run'}",
                        "--config=configs/grpo_arith.py:small", "--config.mesh.data=64"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=dict(env, PYTHONPATH=ROOT))
  assert out.returncode == 2 and "config.mesh" in out.stderr, out.stderr[-3000:]
  if not console.accelerator_present():  # CI and this machine; with an accelerator JAX's own choice stands
    assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
    assert "TPU" not in out.stderr and "libtpu" not in out.stderr, out.stderr
