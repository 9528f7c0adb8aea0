"""Hugging Face checkpoint directories shaped like real ones, built offline for tests: random transformers models
(tiny dims) saved with save_pretrained, plus tokenizer.json trained here with `tokenizers`, tokenizer_config.json
(with Qwen2.5's real chat template), special_tokens_map.json and generation_config.json."""
import json
import os

from grpo_jax.tasks import gsm8k

# Qwen2.5-Instruct's chat_template (tokenizer_config.json of the Qwen2.5 instruct releases), tools branch included.
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")

QUESTIONS = [f"Tom has {i} apples and buys {i + 3} more. How many apples does he have now?" for i in range(12)]
CORPUS = ([gsm8k.R1_ZERO.format(question=q) for q in QUESTIONS] + [gsm8k.CHAT_SYSTEM] + QUESTIONS +
          ["<think>5 + 3 = 8</think> <answer>8</answer>", "You are Qwen, created by Alibaba Cloud.",
           "The answer is \\boxed{8}.", "system user assistant"]) * 4
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]


# The pre-tokenizer split patterns of the real tokenizer.json files (Qwen2/2.5: one digit per piece, NFC first;
# Llama-3: up to three digits per piece); transformers rebuilds Qwen2's pipeline with the same pattern.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def train_tokenizer(specials, vocab_size=400, split=QWEN_SPLIT, nfc=True, extra=()):
  """A byte-level BPE trained on CORPUS (and `extra` texts), `specials` first."""
  import tokenizers
  from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers
  tk = tokenizers.Tokenizer(models.BPE())
  if nfc:
    tk.normalizer = normalizers.NFC()
  tk.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tk.decoder = decoders.ByteLevel()
  tk.train_from_iterator(CORPUS + list(extra), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return tk


def _dump(path, name, obj):
  with open(os.path.join(path, name), "w") as f:
    json.dump(obj, f, indent=2)


def write_tokenizer(path, tk, tokenizer_config: dict, special_map: dict | None = None, generation: dict | None = None):
  os.makedirs(path, exist_ok=True)
  tk.save(os.path.join(path, "tokenizer.json"))
  _dump(path, "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", **tokenizer_config})
  if special_map is not None:
    _dump(path, "special_tokens_map.json", special_map)
  if generation is not None:
    _dump(path, "generation_config.json", generation)


def random_model(kind: str, config: dict, seed: int):
  """A transformers Qwen2/Llama model with O(1) random weights (HF init leaves biases 0 and norms 1)."""
  import torch
  import transformers
  cls_cfg, cls = ((transformers.Qwen2Config, transformers.Qwen2ForCausalLM) if kind == "qwen2" else
                  (transformers.LlamaConfig, transformers.LlamaForCausalLM))
  torch.manual_seed(seed)
  model = cls(cls_cfg(**config)).float()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
      if name.endswith("o_proj.bias"):
        p.zero_()
  return model.eval()


def qwen_instruct_dir(path, seed: int = 0, dtype: str = "bfloat16") -> str:
  """Qwen2.5-Instruct-shaped: q/k/v biases, tied embeddings, θ 1e6, padded vocab, <|im_end|> eos, chat template."""
  import torch
  tk = train_tokenizer(QWEN_SPECIALS)
  vocab = tk.get_vocab_size() + 16  # Qwen's embedding has padding rows beyond the tokenizer
  eot, im_end = tk.token_to_id("<|endoftext|>"), tk.token_to_id("<|im_end|>")
  cfg = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1e6,
             tie_word_embeddings=True, use_sliding_window=False, bos_token_id=eot, eos_token_id=im_end)
  model = random_model("qwen2", cfg, seed)
  model.to(getattr(torch, dtype)).save_pretrained(path)
  write_tokenizer(path, tk, {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
                             "pad_token": "<|endoftext|>", "bos_token": None,
                             "chat_template": QWEN25_CHAT_TEMPLATE, "model_max_length": 512},
                  {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                  {"bos_token_id": eot, "eos_token_id": [im_end, eot], "pad_token_id": eot, "do_sample": True})
  return str(path)


def llama31_dir(path, seed: int = 0) -> str:
  """Llama-3.1-shaped: no biases, GQA, untied head, explicit head_dim, rms_norm_eps 1e-5, 'llama3' RoPE scaling
  (θ and original_max_position_embeddings small, so that the scaling changes the logits at these positions)."""
  tk = train_tokenizer(LLAMA_SPECIALS, split=LLAMA3_SPLIT, nfc=False)
  bos, eos, eot = (tk.token_to_id(t) for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"))
  cfg = dict(vocab_size=tk.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
             rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
             rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=32),
             bos_token_id=bos, eos_token_id=eos)
  random_model("llama", cfg, seed).save_pretrained(path)
  with open(os.path.join(path, "config.json")) as f:  # transformers 5 writes rope_parameters; the hub files have
    saved = json.load(f)                               # the v4 keys, which it reads too
  rope = saved.pop("rope_parameters")
  saved.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope, torch_dtype="float32")
  saved.pop("dtype", None)
  _dump(path, "config.json", saved)
  write_tokenizer(path, tk, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                             "model_max_length": 512},
                  generation={"bos_token_id": bos, "eos_token_id": [eos, eot], "do_sample": True})
  return str(path)


def gsm8k_jsonl(path, n_train: int = 8, n_test: int = 4) -> str:
  """train.jsonl / test.jsonl in the openai/grade-school-math format."""
  os.makedirs(path, exist_ok=True)
  for split, n in (("train", n_train), ("test", n_test)):
    with open(os.path.join(path, f"{split}.jsonl"), "w") as f:
      for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)]
        f.write(json.dumps({"question": q, "answer": f"{i} + {i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3}\n"
                                                     f"#### {2 * i + 3:,}"}) + "\n")
  return str(path)


# --------------------------------------------------------------------------------- the CLI round trip, shared

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(args: list[str], timeout: int = 300, module: str = "grpo_jax.main"):
  import subprocess
  import sys
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                        cwd=REPO, env=env)


def ours_vs_transformers(run_dir: str, out_dir: str, prompt_ids: list[int], new_tokens: int = 8):
  """(max |logit difference| over a prompt + continuation, our greedy tokens, transformers' greedy tokens): our model
  on the run's newest params against transformers on the exported directory."""
  import jax
  import numpy as np
  import torch
  import transformers
  from grpo_jax.hf import export
  from grpo_jax.model import model as model_lib
  from grpo_jax.rollout import sampling
  from grpo_jax.tasks import hf_tokenizer
  config = export.run_config(run_dir)
  mcfg = model_lib.ModelConfig.from_config(config.model)
  params = export.restore_params(run_dir, mcfg).params
  hf = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
  tok = hf_tokenizer.HFTokenizer(out_dir)
  gen = transformers.GenerationConfig.from_pretrained(out_dir)
  eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
  assert tuple(eos) == tok.eos_ids, (eos, tok.eos_ids)
  # Greedy: ours through the sampler (left-padded prompt), transformers' generate on the bare prompt.
  p = len(prompt_ids) + 3
  prompt = np.full((1, p), tok.pad_id, np.int32)
  prompt[0, 3:] = prompt_ids
  mask = (np.arange(p) >= 3).astype(np.int32)[None]
  scfg = sampling.SamplingConfig(greedy=True, max_new_tokens=new_tokens, eos_id=tok.eos_ids, pad_id=tok.pad_id)
  ro = jax.jit(lambda pr, m: sampling.sample(mcfg, params, pr, m, jax.random.PRNGKey(0), scfg))(prompt, mask)
  ours = [int(t) for t, m in zip(np.asarray(ro.tokens_NxL)[0], np.asarray(ro.mask_NxL)[0]) if m]
  with torch.no_grad():
    out = hf.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                      do_sample=False, max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=tok.pad_id)
  theirs = out[0, len(prompt_ids):].tolist()
  theirs = theirs[:next((i + 1 for i, t in enumerate(theirs) if t in eos), len(theirs))]
  # Logits over the prompt and transformers' continuation.
  seq = np.asarray([prompt_ids + theirs], np.int32)
  pos = np.arange(seq.shape[1], dtype=np.int32)[None]
  got = np.asarray(model_lib.forward(mcfg, params, seq, pos, np.ones_like(seq)))
  with torch.no_grad():
    want = hf(input_ids=torch.tensor(seq, dtype=torch.long)).logits.numpy()
  return float(np.abs(got - want).max()), float(np.abs(want).max()), ours, theirs, (mcfg, params, seq)
