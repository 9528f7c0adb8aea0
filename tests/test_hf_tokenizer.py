"""HF tokenizer.json adapter (tasks/hf_tokenizer.py): special ids, encode/decode, tags, chat template, selection by
config, the GSM8K data path and math reward on it; checked against transformers on tokenizers the test trains."""
import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

tokenizers = pytest.importorskip("tokenizers")

from grpo_jax.tasks import base, data, gsm8k, hf_tokenizer  # noqa: E402
from grpo_jax.tasks import tokenizer as tok_lib  # noqa: E402

CORPUS = ["Tom has 5 apples and buys 3 more. How many apples does he have?",
          "Think step by step. <think>5 + 3 = 8</think> <answer>8</answer>",
          "A conversation between User and Assistant. The answer is 1,200 dollars."] * 10
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
# Qwen2.5's chat template, cut to the system/user/assistant messages (no tools).
CHAT = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def train_bpe(tags: bool) -> "tokenizers.Tokenizer":
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tk = tokenizers.Tokenizer(models.BPE())
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = decoders.ByteLevel()
  tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  if tags:  # as Qwen3 / R1-distill add <think>: plain (non-special) added tokens
    tk.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in TAGS])
  return tk


def write_dir(path, tk, tcfg: dict, model_vocab: int | None = None) -> str:
  os.makedirs(path, exist_ok=True)
  tk.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", **tcfg}, f)
  if model_vocab is not None:
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump({"vocab_size": model_vocab}, f)
  return str(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("tok")
  plain = train_bpe(tags=False)
  tagged = train_bpe(tags=True)
  # Qwen2.5 base: eos = pad = <|endoftext|>, no bos, 12 padding rows in the model's embedding.
  qwen = write_dir(root / "qwen", plain, {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                                          "bos_token": None, "chat_template": CHAT}, plain.get_vocab_size() + 12)
  # Instruct-style: eos <|im_end|>, pad given as an AddedToken dict, single-token tags, no config.json.
  instruct = write_dir(root / "instruct", tagged, {
      "eos_token": "<|im_end|>", "bos_token": None,
      "pad_token": {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": False, "rstrip": False, "special": True}})
  return dict(qwen=qwen, instruct=instruct, plain=plain, tagged=tagged, root=root)


def test_special_ids_vocab_and_tags(dirs):
  q = hf_tokenizer.HFTokenizer(dirs["qwen"])
  plain = dirs["plain"]
  eot = plain.token_to_id("<|endoftext|>")
  assert (q.eos_id, q.pad_id, q.bos_id, q.unk_id) == (eot, eot, eot, -1)  # no bos: falls back to pad
  assert q.num_tokens == 300 and q.vocab_size == 312  # the model's id space, from config.json
  assert q.tag_ids == {} and not q.has_tag_tokens
  i = hf_tokenizer.HFTokenizer(dirs["instruct"])
  tagged = dirs["tagged"]
  assert i.eos_id == tagged.token_to_id("<|im_end|>") and i.pad_id == tagged.token_to_id("<|endoftext|>")
  assert i.vocab_size == i.num_tokens == 304
  assert i.tag_ids == {t: tagged.token_to_id(t) for t in TAGS} and i.has_tag_tokens
  assert len(set(i.tag_ids.values())) == 4 and min(i.tag_ids.values()) >= 300


def test_matches_transformers(dirs):
  transformers = pytest.importorskip("transformers")
  for name in ("qwen", "instruct"):
    ours, ref = hf_tokenizer.HFTokenizer(dirs[name]), transformers.AutoTokenizer.from_pretrained(dirs[name])
    assert (ours.eos_id, ours.pad_id) == (ref.eos_token_id, ref.pad_token_id), name
    for text in CORPUS[:3] + ["Ünïcödé 12,345 <think>x</think> <answer>7</answer>"]:
      ids = ours.encode(text)
      assert ids == ref.encode(text, add_special_tokens=False), (name, text)
      assert ours.decode(ids) == ref.decode(ids) == text
  q = hf_tokenizer.HFTokenizer(dirs["qwen"])
  msgs = [{"role": "user", "content": "Tom has 5 apples. How many?"}]
  ref = transformers.AutoTokenizer.from_pretrained(dirs["qwen"])
  want = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
  assert q.apply_chat_template(msgs) == want
  assert want.endswith("<|im_start|>assistant\n") and "You are a helpful assistant." in want


def test_decode_drops_control_and_unknown_ids(dirs):
  q = hf_tokenizer.HFTokenizer(dirs["qwen"])
  ids = q.encode("buys 3 more")
  # pad/eos (same id here), ids the model has but the tokenizer lacks (300..311): all ''.
  assert q.decode([q.bos_id] + ids + [q.eos_id, 305, 311]) == "buys 3 more"
  assert q.decode_batch(np.array([ids + [q.pad_id], [q.pad_id] + ids])) == ["buys 3 more"] * 2
  # other specials are text, as sentencepiece's user-defined symbols are
  assert q.decode([dirs["plain"].token_to_id("<|im_start|>")]) == "<|im_start|>"
  texts = q.piece_texts()
  assert len(texts) == 312 and texts[q.eos_id] == "" and texts[305] == ""
  assert "".join(texts[i] for i in ids) == "buys 3 more"
  i = hf_tokenizer.HFTokenizer(dirs["instruct"])
  assert i.encode("<think>") == [i.tag_ids["<think>"]] and i.decode([i.tag_ids["</answer>"]]) == "</answer>"


def test_selected_by_config_and_path(dirs):
  from grpo_jax import config_lib
  shipped = tok_lib.load()
  assert isinstance(tok_lib.load(f"hf:{dirs['qwen']}"), hf_tokenizer.HFTokenizer)
  by_file = tok_lib.load(os.path.join(dirs["qwen"], "tokenizer.json"))
  assert isinstance(by_file, hf_tokenizer.HFTokenizer) and by_file.vocab_size == 312
  c = config_lib.base_config()
  assert tok_lib.for_config(c) is shipped  # base config has no task.tokenizer: the shipped one
  c.task.tokenizer = "init_from"
  c.train.init_from = f"hf:{dirs['instruct']}"
  assert tok_lib.for_config(c).eos_id == dirs["tagged"].token_to_id("<|im_end|>")
  c.train.init_from = "/ckpt/params"
  with pytest.raises(ValueError, match=r"task.tokenizer='init_from' needs train.init_from=hf:"):
    tok_lib.for_config(c)
  c.task.tokenizer = ""
  assert tok_lib.for_config(c) is shipped


def test_bad_directories_raise_one_line_errors(dirs):
  root, plain = dirs["root"], dirs["plain"]
  with pytest.raises(ValueError, match="names no eos token"):
    hf_tokenizer.HFTokenizer(write_dir(root / "no_eos", plain, {"pad_token": "<|endoftext|>"}))
  with pytest.raises(ValueError, match=r"vocab_size=100 but the tokenizer has 300 tokens"):
    hf_tokenizer.HFTokenizer(write_dir(root / "small", plain, {"eos_token": "<|endoftext|>"}, 100))
  with pytest.raises(ValueError, match=r"eos_token='</s>' is not a token"):
    hf_tokenizer.HFTokenizer(write_dir(root / "wrong", plain, {"eos_token": "</s>"}))
  with pytest.raises(ValueError, match="does not exist"):
    hf_tokenizer.HFTokenizer(str(root / "missing"))
  q = hf_tokenizer.HFTokenizer(write_dir(root / "no_chat", plain, {"eos_token": "<|endoftext|>"}))
  with pytest.raises(ValueError, match="no chat_template"):
    q.apply_chat_template([{"role": "user", "content": "hi"}])


def _records(n):
  return [{"question": f"Tom has {i} apples and buys 3 more. How many?".encode(),
           "answer": f"{i} + 3 = <<{i}+3={i + 3}>>{i + 3}\n#### {i + 3}".encode()} for i in range(n)]


def test_gsm8k_prompts_through_the_hf_tokenizer(dirs):
  q = hf_tokenizer.HFTokenizer(dirs["qwen"])
  task_cfg = dict(name="gsm8k", language="a")
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kw: _records(6 if split == "train" else 4)):
    batch = next(data.rl_batches(task_cfg, q, "train", 3, seed=0, start_step=0, prompt_len=256))
    ev = data.eval_set(task_cfg, q, 4, 256)
  for b in (batch, ev):
    for row, m, idx in zip(b["prompt_NxP"], b["prompt_mask_NxP"], b["index_N"]):
      ids = row[m > 0].tolist()
      assert (row[m == 0] == q.pad_id).all() and m[-1] == 1  # left-padded
      assert ids[0] == q.bos_id  # <|endoftext|> before the prompt, as Qwen's documents start
      ex = {"question": f"Tom has {idx} apples and buys 3 more. How many?"}
      assert ids[1:] == q.encode(base.prompt(gsm8k.GSM8K(), ex, "a"))
      assert q.decode(ids) == base.prompt(gsm8k.GSM8K(), ex, "a")
  assert [gsm8k.decode_answer(a) for a in ev["answer_chars_NxA"]] == ["3", "4", "5", "6"]


@pytest.mark.parametrize("name", ["qwen", "instruct"])
def test_math_reward_on_hf_tokenizer(dirs, name):
  tok = hf_tokenizer.HFTokenizer(dirs[name])
  completions = {
      "<think>5 + 3 = 8</think> <answer>8</answer>": 1.0,
      "<think>5 + 3</think><answer>$8.00</answer>": 1.0,
      "<think>5 + 3</think><answer>8</answer>\n": 0.0,               # only EOS may follow </answer>
      " <think>5 + 3</think><answer>8</answer>": 0.0,                # the completion starts with <think>
      "<think>5 + 3 = 9</think> <answer>9</answer>": 0.0,          # wrong value
      "<answer>8</answer>": 0.0,                                     # no think
      "<think>x</think> <answer>8</answer> so 8": 0.0,              # text after </answer>
      "<think>a</think> <answer>8</answer><answer>8</answer>": 0.0,  # a tag twice
      "The answer is \\boxed{8}": 0.0,                               # right number, no format
  }
  texts = list(completions)
  ids = [tok.encode(t) for t in texts]  # the callback hands ids without their EOS
  batch = {"answer_chars_NxA": gsm8k.encode_answers(["8"] * len(texts))}
  fn = gsm8k.make_math_reward(tok)
  assert fn(texts, ids, batch) == list(completions.values())
  # Token-id tags (instruct) and text tags (qwen) agree here; where the tags are tokens, the same characters spelled
  # from other pieces are not a tag (verify_py's rule), which only the token path can see.
  if tok.has_tag_tokens:
    spelled = [tok.tk.token_to_id(c) for c in "<think>"]
    assert None not in spelled
    row = spelled + tok.encode("x</think> <answer>8</answer>")
    assert fn(["?"], [row], {"answer_chars_NxA": gsm8k.encode_answers(["8"])}) == [0.0]
  # Truncated (no EOS) fails the format in evaluation's grading; with EOS it passes.
  assert gsm8k.grade(ids[0], "8", tok)[:2] == (0.0, 0.0)
  assert gsm8k.grade(ids[0] + [tok.eos_id, tok.pad_id], "8", tok) == (1.0, 1.0, "8")
