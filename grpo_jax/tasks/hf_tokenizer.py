"""A Hugging Face `tokenizer.json` (e.g. Qwen2.5's byte-level BPE) behind the shipped tokenizer's interface.

Needs the `tokenizers` package (the `hf` extra) and nothing else: no `transformers`, no download. Selected with
`task.tokenizer="hf:<dir>"` (or a path ending in `tokenizer.json`; tokenizer_factory.load / for_config).

Special ids come from the files next to it, as transformers reads them: `tokenizer_config.json`, else
`special_tokens_map.json`, else `generation_config.json`'s ids. `eos_ids` is every id that ends a completion: the
eos token and every `eos_token_id` of generation_config.json (Qwen2.5-Instruct: `<|im_end|>` and `<|endoftext|>`;
Llama-3.1-Instruct: `<|end_of_text|>`, `<|eom_id|>`, `<|eot_id|>`); `eos_id` is the one SFT data ends with (the
eos token). `pad_token` pads (Qwen: `<|endoftext|>`); `bos_token` starts every R1-Zero prompt (data.py puts bos
first; a chat template writes its own). Qwen has no bos token, so bos falls back to pad: `<|endoftext|>` is the
document separator Qwen saw before every pre-training document, the closest thing it has to a BOS.

The chat template is tokenizer_config.json's `chat_template` (or `chat_template.jinja`, where transformers v5 saves
it), rendered as transformers' apply_chat_template renders it (sandboxed Jinja, trim_blocks/lstrip_blocks, the
special tokens by name, `raise_exception`, `strftime_now`, `tojson`).

`vocab_size` is the MODEL's id space when the directory has a `config.json` (Qwen2.5: 151,936 embedding rows for
151,665 tokens), so validation against `model.vocab_size` passes; ids the tokenizer does not know (the padding
rows a random or lightly trained model may sample) decode to ''.

`tag_ids` holds the `<think>`/`</think>`/`<answer>`/`</answer>` tags that are single tokens in this vocabulary
(Qwen3 and R1-distill tokenizers have the think tags; Qwen2.5 has none). Token-level verifiers need all four
(`has_tag_tokens`); otherwise tasks check the format on decoded text (gsm8k.grade).
"""
from __future__ import annotations

import functools
import json
import os
import re
from typing import Any, Sequence


from grpo_jax.tasks import tokenizer as tokenizer_lib


def _token_text(v: Any) -> str | None:
  """tokenizer_config.json stores a special token as a string or as an AddedToken dict {'content': ...}."""
  if isinstance(v, dict):
    return v.get("content")
  return v if isinstance(v, str) else None


def _read_json(path: str) -> dict:
  """A JSON object file next to tokenizer.json ({} when absent); a damaged one is one line naming it."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      out = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"task.tokenizer: {path} is not valid JSON ({e}); re-download it or fix it.") from None
  if not isinstance(out, dict):
    raise ValueError(f"task.tokenizer: {path} holds a JSON {type(out).__name__}, expected an object; re-download it "
                     "or fix it.")
  return out


# Tokenizer files other than tokenizer.json that a Hugging Face directory may hold (transformers converts them).
OTHER_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "merges.txt", "tokenizer_config.json")


def missing_tokenizer_json(directory: str) -> str:
  """What to say about a directory without tokenizer.json: the file is named, and what the directory has instead."""
  have = [n for n in OTHER_TOKENIZER_FILES if os.path.isfile(os.path.join(directory, n))]
  return (f"{directory} has no tokenizer.json (" + (f"it has {', '.join(have)}: transformers' "
          f"AutoTokenizer.from_pretrained(dir).save_pretrained(dir) writes tokenizer.json from them)" if have else
          "nor any other tokenizer file)"))


def resolve(path: str) -> tuple[str, str]:
  """(directory, tokenizer.json file) for a directory or a tokenizer.json path."""
  if os.path.isdir(path):
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
      raise ValueError(f"task.tokenizer: {missing_tokenizer_json(path)}; the HF tokenizer is read from "
                       "tokenizer.json: add it, or point task.tokenizer at a directory that has it.")
    path = os.path.join(path, "tokenizer.json")
  if not os.path.isfile(path):
    raise ValueError(f"task.tokenizer: {path} does not exist; point it at a HF model dir holding tokenizer.json "
                     "(hf:<dir>) or at the tokenizer.json file itself.")
  return os.path.dirname(os.path.abspath(path)), path


class HFTokenizer:
  """Same surface as tokenizer.Tokenizer: vocab_size, pad/bos/eos/unk ids, tag_ids, encode, decode, piece_texts."""

  def __init__(self, path: str):
    try:
      import tokenizers
    except ImportError as e:
      raise ValueError("task.tokenizer: a HF tokenizer.json needs the `tokenizers` package; "
                       "pip install 'grpo_jax[hf]' (or tokenizers==0.23.3).") from e
    self.directory, self.file = resolve(path)
    try:
      self.tk = tokenizers.Tokenizer.from_file(self.file)
    except Exception as e:  # pylint: disable=broad-except  (tokenizers raises a bare Exception for a damaged file)
      raise ValueError(f"task.tokenizer: {self.file} cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                       "it is damaged or not a tokenizers file: re-download it.") from None
    self.num_tokens = self.tk.get_vocab_size(with_added_tokens=True)
    tcfg = _read_json(os.path.join(self.directory, "tokenizer_config.json"))
    smap = _read_json(os.path.join(self.directory, "special_tokens_map.json"))
    gen = _read_json(os.path.join(self.directory, "generation_config.json"))
    model_vocab = _read_json(os.path.join(self.directory, "config.json")).get("vocab_size")
    if model_vocab is not None and (isinstance(model_vocab, bool) or not isinstance(model_vocab, int)):
      raise ValueError(f"task.tokenizer: {self.directory}/config.json has vocab_size={model_vocab!r}, not an integer "
                       "(the model's embedding rows); fix the file or re-download it.")
    if model_vocab is not None and model_vocab < self.num_tokens:
      raise ValueError(f"task.tokenizer: {self.directory}/config.json has vocab_size={model_vocab} but the "
                       f"tokenizer has {self.num_tokens} tokens; the model cannot emit them all.")
    self.vocab_size = int(model_vocab or self.num_tokens)

    self.special_tokens: dict[str, str] = {}

    def special(key: str) -> int | None:
      for name, src in (("tokenizer_config.json", tcfg), ("special_tokens_map.json", smap)):
        text = _token_text(src.get(key))
        if text is None:
          continue
        i = self.tk.token_to_id(text)
        if i is None:
          raise ValueError(f"task.tokenizer: {self.directory}/{name}'s {key}={text!r} is not a token of "
                           f"{self.file}; fix the file or the tokenizer.")
        self.special_tokens[key] = text
        return i
      gen_id = gen.get(key + "_id")
      gen_ids = gen_id if isinstance(gen_id, list) else [gen_id] if gen_id is not None else []
      return self._check_id(gen_ids[0], key) if gen_ids else None

    gen_eos = gen.get("eos_token_id")
    gen_eos = [self._check_id(i, "eos_token_id") for i in (gen_eos if isinstance(gen_eos, list) else
                                                            [gen_eos] if gen_eos is not None else [])]
    eos = special("eos_token")
    if eos is None:
      raise ValueError(f"task.tokenizer: {self.directory} names no eos token (tokenizer_config.json / "
                       "special_tokens_map.json eos_token, generation_config.json eos_token_id); completions need "
                       "one to end (set eos_token, e.g. '<|endoftext|>').")
    self.eos_id = eos
    self.eos_ids = tuple(dict.fromkeys([eos] + gen_eos))  # the eos token first, then generation_config's
    pad = special("pad_token")
    self.pad_id = eos if pad is None else pad
    bos = special("bos_token")
    self.bos_id = self.pad_id if bos is None else bos
    unk = special("unk_token")
    self.unk_id = -1 if unk is None else unk  # byte-level BPE never needs one; -1 matches no id
    self.tag_ids = {t: i for t in tokenizer_lib.TAGS if (i := self.tk.token_to_id(t)) is not None}
    self.chat_template = _chat_template(self.directory, tcfg)
    self._control = {self.pad_id, self.bos_id, *self.eos_ids}
    self._plain = None  # encode_text's tokenizer (built on first use)

  def _check_id(self, i, key: str) -> int:
    if not isinstance(i, int) or not 0 <= i < self.num_tokens:
      raise ValueError(f"task.tokenizer: {self.directory}/generation_config.json's {key}={i!r} is not a token id "
                       f"of {self.file} (0..{self.num_tokens - 1}).")
    return i

  @property
  def has_tag_tokens(self) -> bool:
    """All four format tags are single tokens, so token-id verifiers (verify_py/verify_jax) apply."""
    return len(self.tag_ids) == len(tokenizer_lib.TAGS)

  def encode(self, text: str) -> list[int]:
    # No template specials: data.py adds bos itself, the sampler or data path eos.
    return self.tk.encode(text, add_special_tokens=False).ids

  def encode_text(self, text: str) -> list[int]:
    """`text` as plain text: an added token's string in it (`<|im_end|>`, `<tool_call>`, ...) is encoded as the
    pieces of its characters, never as the token. What a tool's output is encoded with (formats.Qwen): a tool
    printing '<|im_end|>' must not end the turn."""
    if self._plain is None:
      import tokenizers
      spec = json.loads(self.tk.to_str())
      spec["added_tokens"] = []  # the added vocabulary is what matches token strings in the text
      self._plain = tokenizers.Tokenizer.from_str(json.dumps(spec))
    return self._plain.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes every id given, like the sentencepiece wrapper: pad/bos/eos and unknown ids decode to ''."""
    keep = [int(i) for i in ids if 0 <= int(i) < self.num_tokens and int(i) not in self._control]
    return self.tk.decode(keep, skip_special_tokens=False)

  def piece_texts(self) -> list[str]:
    """Surface text of each id of the model's id space ('' for control and unknown ids). A byte-level piece that
    is part of a multi-byte character decodes alone to U+FFFD: token tables see it as non-digit, non-space text."""
    return [self.decode([i]) for i in range(self.vocab_size)]

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                          tools: list[dict] | None = None) -> str:
    """The prompt text transformers' apply_chat_template(tokenize=False, tools=...) renders, for instruct
    checkpoints. `tools`: JSON function schemas (envs/formats.Tool.schema), as transformers passes them."""
    if not self.chat_template:
      raise ValueError(f"task.tokenizer: {self.directory}/tokenizer_config.json has no chat_template; use a "
                       "plain prompt (base models) or an instruct checkpoint's tokenizer.")
    import datetime
    import jinja2.sandbox
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    # The special tokens the files name, as transformers passes them: not our fallbacks (Qwen's bos is its pad),
    # which a template writing {{ bos_token }} would render where transformers renders ''.
    tokens = dict(self.special_tokens)
    try:
      tmpl = env.from_string(self.chat_template)
      return tmpl.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **tokens)
    except jinja2.TemplateError as e:  # a damaged or edited template: one line naming it, not jinja's traceback
      line = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
      raise ValueError(f"task.tokenizer: the chat_template of {self.directory} cannot be rendered{line} "
                       f"({type(e).__name__}: {errors_one_line(str(e))}); fix tokenizer_config.json's chat_template "
                       "(or chat_template.jinja), or use a plain prompt.") from None


# A model's own tokenizer leaves at most a few hundred embedding rows without a token (Qwen2.5: 151,936 rows for
# 151,665 tokens; DeepSeek-V3: 465; OLMo: 74): more than this is a smaller model family's tokenizer (Llama-3's
# 128,256 tokens under Qwen2.5's 151,936 rows).
SPARE_ROWS, SPARE_FRAC = 1024, 0.01
_CHAT_SPECIAL = re.compile(r"<\|[^|<>\s]{1,48}\|>")  # <|im_start|>, <|eot_id|>, <|start_header_id|>, ...


def _ids(value) -> list[int]:
  values = value if isinstance(value, list) else [value]
  return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def model_mismatches(tok: HFTokenizer, model_dir: str, chat: bool = False) -> list[str]:
  """How `tok` is not the tokenizer of the Hugging Face model in `model_dir` ([] = nothing found): an embedding
  with far more rows than the tokenizer has tokens, end-of-sequence ids of config.json / generation_config.json
  that the tokenizer does not end with, a bos id that differs from the tokenizer's bos token, and (chat) special
  tokens the chat template writes that are not single tokens of the tokenizer."""
  cfg = _read_json(os.path.join(model_dir, "config.json"))
  gen = _read_json(os.path.join(model_dir, "generation_config.json"))
  out = []
  rows = cfg.get("vocab_size")
  if isinstance(rows, int) and rows - tok.num_tokens > max(SPARE_ROWS, SPARE_FRAC * rows):
    out.append(f"the model's embedding has {rows:,} rows but the tokenizer has {tok.num_tokens:,} tokens "
               f"({rows - tok.num_tokens:,} rows no token reaches; a model's own tokenizer leaves at most a few "
               "hundred)")
  name = lambda i: repr(tok.tk.id_to_token(i)) if 0 <= i < tok.num_tokens else "no token"
  model_eos = list(dict.fromkeys(_ids(cfg.get("eos_token_id")) + _ids(gen.get("eos_token_id"))))
  if model_eos and not set(model_eos) & set(tok.eos_ids):
    out.append(f"the model ends with token id {'/'.join(map(str, model_eos))} (config.json / generation_config.json "
               f"eos_token_id: {', '.join(name(i) for i in model_eos)}) but the tokenizer's eos is "
               f"{'/'.join(map(str, tok.eos_ids))} ({', '.join(name(i) for i in tok.eos_ids)})")
  bos = _ids(cfg.get("bos_token_id")) or _ids(gen.get("bos_token_id"))
  if bos and "bos_token" in tok.special_tokens and bos[0] != tok.bos_id:
    out.append(f"the model's bos_token_id is {bos[0]} ({name(bos[0])}) but the tokenizer's bos token is "
               f"{tok.bos_id} ({name(tok.bos_id)})")
  if chat and tok.chat_template:
    unknown = sorted({t for t in _CHAT_SPECIAL.findall(tok.chat_template) if tok.tk.token_to_id(t) is None})
    if unknown:
      out.append(f"the chat template writes {', '.join(unknown[:4])}, which the tokenizer does not have as tokens "
                 "(they would be split into pieces the model never saw)")
  return out


def _chat_template(directory: str, tcfg: dict) -> str | None:
  """tokenizer_config.json's chat_template (a string, or named templates: the 'default' one), else the
  chat_template.jinja file transformers v5 writes next to it."""
  t = tcfg.get("chat_template")
  if isinstance(t, list):
    t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
  if t:
    return t
  path = os.path.join(directory, "chat_template.jinja")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  return None


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  """transformers' `tojson` (jinja2's own escapes HTML characters, which would change the rendered prompt)."""
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def errors_one_line(text: str) -> str:
  return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())[:200]


def _raise_exception(message: str):
  raise ValueError(f"chat_template: {message}")


@functools.lru_cache(maxsize=4)
def load(path: str) -> HFTokenizer:
  """The adapter for a directory holding tokenizer.json (and tokenizer_config.json), or for the file itself."""
  return HFTokenizer(os.path.abspath(path))
