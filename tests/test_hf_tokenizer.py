"""HF tokenizer.json adapter (tasks/hf_tokenizer.py): special ids, encode/decode, tags, chat template, selection by
config, the GSM8K data path and math reward on it; checked against transformers on tokenizers the test trains."""
import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

tokenizers = pytest.importorskip("tokenizers")

from grpo_jax.tasks import base, data, gsm8k, hf_tokenizer, prompts  # noqa: E402
from grpo_jax.tasks import tokenizer_factory as tok_lib  # noqa: E402
from tests import hf_dirs  # noqa: E402

CORPUS = ["Tom has 5 apples and buys 3 more. How many apples does he have?",
          "Think step by step. <think>5 + 3 = 8</think> <answer>8</answer>",
          "A conversation between User and Assistant. The answer is 1,200 dollars."] * 10 + hf_dirs.CORPUS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
CHAT = hf_dirs.QWEN25_CHAT_TEMPLATE  # the real Qwen2.5-Instruct template


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
  assert [q.decode(r) for r in np.array([ids + [q.pad_id], [q.pad_id] + ids])] == ["buys 3 more"] * 2
  # other specials are text, as sentencepiece's user-defined symbols are
  assert q.decode([dirs["plain"].token_to_id("<|im_start|>")]) == "<|im_start|>"
  texts = q.piece_texts()
  assert len(texts) == 312 and texts[q.eos_id] == "" and texts[305] == ""
  assert "".join(texts[i] for i in ids) == "buys 3 more"
  i = hf_tokenizer.HFTokenizer(dirs["instruct"])
  assert i.encode("<think>") == [i.tag_ids["<think>"]] and i.decode([i.tag_ids["</answer>"]]) == "</answer>"


def test_selected_by_config_and_path(dirs):
  from grpo_jax.config import config_lib
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
  # the model from sft.init_from=hf:<dir> (job=sft, or an SFT stage first): its tokenizer too, as model_source reads
  # it (was 'needs train.init_from=hf:', while validate's vocab hint told that job to set task.tokenizer=init_from)
  im_end = dirs["tagged"].token_to_id("<|im_end|>")
  c.train.init_from, c.sft.init_from, c.sft.steps = "", f"hf:{dirs['instruct']}", 5
  assert tok_lib.spec_for_config(c) == f"hf:{dirs['instruct']}" and tok_lib.for_config(c).eos_id == im_end
  c.job = "sft"
  assert tok_lib.for_config(c).eos_id == im_end
  c.job, c.sft.steps = "grpo", 0  # no SFT stage: the model is not the sft checkpoint's
  with pytest.raises(ValueError, match=r"needs train.init_from=hf:<dir> .*, got train.init_from=''"):
    tok_lib.for_config(c)
  c.task.tokenizer = ""
  assert tok_lib.for_config(c) is shipped


def test_bad_directories_raise_one_line_errors(dirs):
  root, plain = dirs["root"], dirs["plain"]
  with pytest.raises(ValueError, match="names no eos token"):
    hf_tokenizer.HFTokenizer(write_dir(root / "no_eos", plain, {"pad_token": "<|endoftext|>"}))
  with pytest.raises(ValueError, match=r"vocab_size=100 but the tokenizer has 300 tokens"):
    hf_tokenizer.HFTokenizer(write_dir(root / "small", plain, {"eos_token": "<|endoftext|>"}, 100))
  for bad in ("312", [312], True, 312.0):  # was a TypeError traceback ('<' between str and int), or True taken as 1
    with pytest.raises(ValueError) as e:
      hf_tokenizer.HFTokenizer(write_dir(root / "str_vocab", plain, {"eos_token": "<|endoftext|>"}, bad))
    assert f"config.json has vocab_size={bad!r}, not an integer" in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"eos_token='</s>' is not a token"):
    hf_tokenizer.HFTokenizer(write_dir(root / "wrong", plain, {"eos_token": "</s>"}))
  with pytest.raises(ValueError, match="does not exist"):
    hf_tokenizer.HFTokenizer(str(root / "missing"))
  q = hf_tokenizer.HFTokenizer(write_dir(root / "no_chat", plain, {"eos_token": "<|endoftext|>"}))
  with pytest.raises(ValueError, match="no chat_template"):
    q.apply_chat_template([{"role": "user", "content": "hi"}])
  # damaged files: were a bare tokenizers Exception / AttributeError (traceback, exit 1) or a JSON error naming no file
  for name, damage, needle in (("truncated", lambda d: open(os.path.join(d, "tokenizer.json"), "r+b").truncate(500),
                                "tokenizer.json cannot be read"),
                               ("bad_config", lambda d: open(os.path.join(d, "tokenizer_config.json"), "w").write("{"),
                                "tokenizer_config.json is not valid JSON"),
                               ("map_list", lambda d: open(os.path.join(d, "special_tokens_map.json"), "w").write("[]"),
                                "special_tokens_map.json holds a JSON list")):
    d = write_dir(root / name, plain, {"eos_token": "<|endoftext|>"})
    damage(d)
    with pytest.raises(ValueError) as e:
      hf_tokenizer.HFTokenizer(d)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
  q = hf_tokenizer.HFTokenizer(write_dir(root / "bad_template", plain, {"eos_token": "<|endoftext|>",
                                                                       "chat_template": "{% if %}"}))
  with pytest.raises(ValueError) as e:  # was jinja's TemplateSyntaxError traceback (exit 1) with prompt=chat
    q.apply_chat_template([{"role": "user", "content": "hi"}])
  assert "chat_template of" in str(e.value) and "TemplateSyntaxError" in str(e.value) and "\n" not in str(e.value)


def _records(n):
  return [{"question": f"Tom has {i} apples and buys 3 more. How many?".encode(),
           "answer": f"{i} + 3 = <<{i}+3={i + 3}>>{i + 3}\n#### {i + 3}".encode()} for i in range(n)]


def test_gsm8k_prompts_through_the_hf_tokenizer(dirs):
  """r1_zero: bos + DeepSeek-R1's R1-Zero template; chat: the tokenizer's chat template with the boxed-answer
  system turn, token for token what transformers' apply_chat_template(tokenize=True) gives."""
  transformers = pytest.importorskip("transformers")
  q = hf_tokenizer.HFTokenizer(dirs["qwen"])
  ref = transformers.AutoTokenizer.from_pretrained(dirs["qwen"])
  for fmt in ("r1_zero", "chat"):
    task_cfg = dict(name="gsm8k", language="a", prompt_format=fmt)
    with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kw: _records(6 if split == "train" else 4)):
      batch = next(data.rl_batches(task_cfg, q, "train", 3, seed=0, start_step=0, prompt_len=320))
      ev = data.eval_set(task_cfg, q, 4, 320)
    for b in (batch, ev):
      assert (b["prompt_format_N"] == gsm8k.PROMPT_FORMATS.index(fmt)).all()
      for row, m, idx in zip(b["prompt_NxP"], b["prompt_mask_NxP"], b["index_N"]):
        ids = row[m > 0].tolist()
        assert (row[m == 0] == q.pad_id).all() and m[-1] == 1  # left-padded
        question = f"Tom has {idx} apples and buys 3 more. How many?"
        if fmt == "r1_zero":
          assert ids[0] == q.bos_id  # <|endoftext|> before the prompt, as Qwen's documents start
          assert q.decode(ids) == gsm8k.R1_ZERO.format(question=question)
          assert ids[1:] == q.encode(base.prompt(gsm8k.GSM8K(), {"question": question}, "a"))
        else:
          msgs = [{"role": "system", "content": gsm8k.CHAT_SYSTEM}, {"role": "user", "content": question}]
          want = ref.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
          assert ids == list(want["input_ids"] if hasattr(want, "keys") else want)
    assert [gsm8k.decode_answer(a) for a in ev["answer_chars_NxA"]] == ["3", "4", "5", "6"]


def test_chat_format_needs_a_chat_template(dirs):
  from grpo_jax.config import config_lib
  from grpo_jax.run import validate
  with pytest.raises(ValueError, match="needs a tokenizer with a chat template, but the shipped tokenizer has none"):
    prompts.check("chat", tok_lib.load())
  c = config_lib.override(config_lib.load_config("configs/gsm8k.py", "small,prompt=chat"), {})
  with pytest.raises(validate.ConfigError, match=r"^config.task.prompt_format='chat' needs a tokenizer"):
    validate.validate_rl(c, 1, tok_lib.load())
  with pytest.raises(ValueError, match="unknown"):
    prompts.check("plain", tok_lib.load())


def test_an_in_graph_task_needs_the_tags_as_tokens(dirs):
  """arith (verified in-graph on token ids) with a tokenizer.json without the four tags: was a ValueError traceback
  from verify_jax at the first evaluation, after the run's files were written; now one config line."""
  from configs import grpo_arith
  from grpo_jax.run import validate
  c = grpo_arith.get_config("small")
  c.task.tokenizer, c.model.vocab_size = f"hf:{dirs['qwen']}", 312
  with pytest.raises(validate.ConfigError, match=r"^config.task.tokenizer: task 'arith' is verified in-graph .* "
                     r"lacks <think>, </think>, <answer>, </answer>; use the shipped tokenizer"):
    validate.validate_rl(c, 1, hf_tokenizer.HFTokenizer(dirs["qwen"]))
  c.task.tokenizer, c.model.vocab_size = f"hf:{dirs['instruct']}", 304
  validate.validate_rl(c, 1, hf_tokenizer.HFTokenizer(dirs["instruct"]))  # its tags are single tokens


def test_eos_ids_and_special_tokens_from_every_file(dirs, tmp_path):
  """generation_config.json adds EOS ids; special_tokens_map.json stands in for a tokenizer_config without the
  tokens; transformers reads the same ids."""
  transformers = pytest.importorskip("transformers")
  plain = dirs["plain"]
  eot, im_end = plain.token_to_id("<|endoftext|>"), plain.token_to_id("<|im_end|>")
  d = write_dir(tmp_path / "gen", plain, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
  with open(os.path.join(d, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [im_end, eot], "bos_token_id": eot}, f)
  t = hf_tokenizer.HFTokenizer(d)
  assert (t.eos_id, t.eos_ids, t.pad_id) == (im_end, (im_end, eot), eot)
  assert list(t.eos_ids) == transformers.GenerationConfig.from_pretrained(d).eos_token_id
  assert t.decode([eot] + t.encode("buys 3 more") + [im_end]) == "buys 3 more"  # every EOS id decodes to ''
  m = write_dir(tmp_path / "map", plain, {})
  with open(os.path.join(m, "special_tokens_map.json"), "w") as f:
    json.dump({"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<|im_start|>"}, f)
  t = hf_tokenizer.HFTokenizer(m)
  ref = transformers.AutoTokenizer.from_pretrained(m)
  assert (t.eos_id, t.bos_id, t.eos_ids) == (ref.eos_token_id, ref.bos_token_id, (eot,))
  g = write_dir(tmp_path / "genonly", plain, {})
  with open(os.path.join(g, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": eot}, f)
  assert hf_tokenizer.HFTokenizer(g).eos_ids == (eot,)
  with open(os.path.join(g, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [eot, 100_000]}, f)
  with pytest.raises(ValueError, match=r"generation_config.json's eos_token_id=100000 is not a token id"):
    hf_tokenizer.HFTokenizer(g)


def test_chat_template_from_its_jinja_file(dirs, tmp_path):
  """transformers v5 saves the template as chat_template.jinja; it renders the same."""
  transformers = pytest.importorskip("transformers")
  d = write_dir(tmp_path / "jinja", dirs["plain"], {"eos_token": "<|im_end|>"})
  with open(os.path.join(d, "chat_template.jinja"), "w") as f:
    f.write(CHAT)
  msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "5 + 3?"},
          {"role": "assistant", "content": "8"}, {"role": "user", "content": "and 6 + 1?"}]
  ours = hf_tokenizer.HFTokenizer(d).apply_chat_template(msgs)
  assert ours == transformers.AutoTokenizer.from_pretrained(d).apply_chat_template(
      msgs, tokenize=False, add_generation_prompt=True)
  assert ours.count("<|im_start|>") == 5 and "You are Qwen" not in ours


def test_a_template_writing_bos_token_renders_as_transformers_without_one(dirs, tmp_path):
  """A tokenizer without a bos token (Qwen's) and a template that writes {{ bos_token }}: transformers renders ''
  there; ours rendered its fallback bos (the pad, <|endoftext|>) into every chat prompt."""
  transformers = pytest.importorskip("transformers")
  tmpl = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  d = write_dir(tmp_path / "bos", dirs["plain"], {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                  "bos_token": None, "chat_template": tmpl})
  msgs = [{"role": "user", "content": "5 + 3?"}]
  ours = hf_tokenizer.HFTokenizer(d).apply_chat_template(msgs)
  assert ours == transformers.AutoTokenizer.from_pretrained(d).apply_chat_template(
      msgs, tokenize=False, add_generation_prompt=True)
  assert ours == "<|im_start|>user\n5 + 3?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name", ["qwen", "instruct"])
def test_math_rewards_on_hf_tokenizer(dirs, name):
  tok = hf_tokenizer.HFTokenizer(dirs[name])
  completions = {  # text -> (math_accuracy, math_format)
      "<think>5 + 3 = 8</think> <answer>8</answer>": (1.0, 1.0),
      "<think>5 + 3</think><answer>$8.00</answer>": (1.0, 1.0),
      "<think>5 + 3</think><answer>8</answer>\n": (1.0, 1.0),        # a newline before EOS
      " <think>5 + 3</think><answer>8</answer>": (1.0, 1.0),         # the natural first token after "Assistant:"
      "<think>5 + 3 = 9</think> <answer>9</answer>": (0.0, 1.0),     # wrong value
      "<answer>8</answer>": (1.0, 0.0),                              # no think
      "<think>x</think> <answer>8</answer> so 8": (1.0, 0.0),        # text after </answer>
      "<think>a</think> <answer>8</answer><answer>8</answer>": (1.0, 0.0),  # a tag twice
      "The answer is \\boxed{8}": (1.0, 0.0),                         # right number, no tags
      "The answer is \\boxed{9}": (0.0, 0.0),
  }
  texts = list(completions)
  ids = [tok.encode(t) for t in texts]  # the callback hands ids without their EOS
  batch = {"answer_chars_NxA": gsm8k.encode_answers(["8"] * len(texts))}
  terms = gsm8k.make_rewards(tok)
  assert terms["math_accuracy"](texts, ids, batch) == [a for a, _ in completions.values()]
  assert terms["math_format"](texts, ids, batch) == [f for _, f in completions.values()]
  # Where the tags are tokens, the same characters spelled from other pieces are not a tag (verify_py's rule).
  if tok.has_tag_tokens:
    spelled = [tok.tk.token_to_id(c) for c in "<think>"]
    assert None not in spelled
    row = spelled + tok.encode("x</think> <answer>8</answer>")
    assert terms["math_format"](["?"], [row], {"answer_chars_NxA": gsm8k.encode_answers(["8"])}) == [0.0]
  # Evaluation grades ids up to and including EOS; a tagged answer needs no EOS, the last-number fallback does.
  assert gsm8k.grade(ids[0], "8", tok) == (1.0, 1.0, "8")
  assert gsm8k.grade(ids[0] + [tok.eos_id, tok.pad_id][:1], "8", tok) == (1.0, 1.0, "8")
  untagged = tok.encode("so it is 8")
  assert gsm8k.grade(untagged, "8", tok)[0] == 0.0 and gsm8k.grade(untagged + [tok.eos_id], "8", tok)[0] == 1.0


def test_tokenizer_checked_against_the_model(dirs, tmp_path):
  """A tokenizer that is not the model's: far fewer tokens than embedding rows (Llama-3's 128,256 under Qwen2.5's
  151,936, here 2,000 rows), the model's eos / bos ids not the tokenizer's, a chat template whose special tokens the
  tokenizer lacks. The model's own (12 spare rows, its eos) passes. preflight: one line naming both; the override
  key runs it with a warning."""
  import ml_collections
  from grpo_jax.infra import errors
  from grpo_jax.run import preflight
  import shutil
  qwen = shutil.copytree(dirs["qwen"], tmp_path / "qwen")
  own = hf_tokenizer.HFTokenizer(str(qwen))
  eot = own.tk.token_to_id("<|endoftext|>")
  with open(qwen / "config.json", "w") as f:
    json.dump({"vocab_size": own.num_tokens + 12, "eos_token_id": eot, "bos_token_id": eot}, f)
  assert hf_tokenizer.model_mismatches(own, str(qwen), chat=True) == []
  llama = hf_dirs.train_tokenizer(hf_dirs.LLAMA_SPECIALS, split=hf_dirs.LLAMA3_SPLIT, nfc=False)
  n = llama.get_vocab_size()
  d = str(tmp_path / "llama_in_qwen")
  hf_dirs.write_tokenizer(d, llama, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                                     "chat_template": CHAT})
  with open(os.path.join(d, "config.json"), "w") as f:  # Qwen-shaped: its eos/bos ids are beyond this tokenizer
    json.dump({"vocab_size": n + 2000, "eos_token_id": n + 5, "bos_token_id": n + 4}, f)
  tok = hf_tokenizer.HFTokenizer(d)
  problems = hf_tokenizer.model_mismatches(tok, d, chat=True)
  assert len(problems) == 4, problems
  assert f"{n + 2000:,} rows but the tokenizer has {n:,} tokens" in problems[0]
  assert f"ends with token id {n + 5}" in problems[1] and "'<|end_of_text|>'" in problems[1]
  assert f"bos_token_id is {n + 4}" in problems[2] and "<|im_start|>" in problems[3]
  # a few hundred spare rows (Qwen2.5: 271) are a model's own padding, not a mismatch
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"vocab_size": n + 271}, f)
  assert hf_tokenizer.model_mismatches(tok, d) == []
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"vocab_size": n + 2000, "eos_token_id": n + 5}, f)
  c = ml_collections.ConfigDict({"job": "grpo", "train": {"init_from": f"hf:{d}"}, "sft": {"steps": 0},
                                 "task": {"prompt_format": "r1_zero", "allow_tokenizer_mismatch": False}})
  with pytest.raises(errors.ConfigError) as e:
    preflight.check_tokenizer_model(c, tok)
  line = str(e.value)
  assert "\n" not in line and line.startswith("config.task.tokenizer: the tokenizer ") and d in line, line
  assert "task.allow_tokenizer_mismatch=True" in line and "rows no token reaches" in line, line
  c.task.allow_tokenizer_mismatch = True
  preflight.check_tokenizer_model(c, tok)  # the rare real case: allowed, with a warning
