"""The shipped sentencepiece tokenizer (BPE, ~512 pieces) for the synthetic tasks.

Tags are user-defined symbols, so `<think>` in text always encodes to its single tag id; a completion that spells
the same characters from other pieces is not a tag. Normalization is off (identity, no dummy prefix, spaces kept),
so decode(encode(text)) == text for the ASCII task text. Control ids: pad=0, bos=1, eos=2, unk=3. Another
sentencepiece model (task.tokenizer=<file>.model) has in `tag_ids` only the tags that are its pieces; the tasks
verified in-graph on token ids need all four (validate.validate_tokenizer).

The shipped model has no tool-call markers (`<tool_call>` encodes to 8 pieces). `task.tokenizer='tools'` selects
`load_tools()`: the same model with TOOL_MARKERS appended as user-defined pieces (ids 512-515), every other id and
every other text's encoding unchanged (tests/test_envs.py), so a marker is one token a row can stop on, and a
user-defined piece splits the text around it, so an observation tokenised alone joins a transcript exactly as the
whole text would tokenise (docs/tools.md).
"""
from __future__ import annotations

import functools
import os

import sentencepiece as spm

ASSET = os.path.join(os.path.dirname(__file__), "assets", "tokenizer.model")
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# Qwen2.5's spelling of a tool call and its response (envs/formats.py); `tools` names the shipped model with them.
TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
TOOLS_SPEC = "tools"


class Tokenizer:
  """Thin wrapper so the rest of the code sees ints and numpy arrays, not sentencepiece objects."""

  def __init__(self, model_proto: bytes, path: str = "the model"):
    try:
      self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError:  # sentencepiece's parse error is a multi-line C++ message
      raise ValueError(f"{path} is not a sentencepiece model (it does not parse); pass a .model file written by "
                       "sentencepiece (python -m grpo_jax.tasks.build_tokenizer), hf:<dir> for a Hugging Face "
                       "tokenizer.json, or '' for the shipped one") from None
    self.vocab_size = self.sp.get_piece_size()
    self.pad_id, self.bos_id, self.eos_id, self.unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    self.eos_ids = (EOS_ID,)  # the ids that end a completion (an HF tokenizer may have several)
    # The tags that are pieces of this model: piece_to_id gives unk_id (3) for a missing piece, which made a model
    # without them (a task.tokenizer=<file>.model trained without the user-defined symbols) count <unk> as every tag.
    self.tag_ids = {t: i for t in TAGS if self.sp.id_to_piece(i := self.sp.piece_to_id(t)) == t}
    have = (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.unk_id())
    if have != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):  # -1: the model has none
      raise ValueError(f"{path} has pad={have[0]} bos={have[1]} eos={have[2]} unk={have[3]}, and the code needs pad=0 "
                       "bos=1 eos=2 unk=3; train it with pad_id=0, bos_id=1, eos_id=2, unk_id=3 (as python -m "
                       "grpo_jax.tasks.build_tokenizer does)")

  @property
  def has_tag_tokens(self) -> bool:
    """All four format tags are pieces, so token-id verifiers (verify_py/verify_jax) apply."""
    return len(self.tag_ids) == len(TAGS)

  def encode(self, text: str) -> list[int]:
    return self.sp.encode(text)

  def decode(self, ids) -> str:
    """Decodes every id given (no stopping at eos: the caller cuts); control ids decode to ''."""
    return self.sp.decode([int(i) for i in ids])

  def piece_texts(self) -> list[str]:
    """Surface text of each id as decode() would emit it inside a sequence ('' for control ids)."""
    out = []
    for i in range(self.vocab_size):
      if self.sp.is_control(i):
        out.append("")
      elif self.sp.is_unknown(i):
        out.append(self.sp.decode([i]))
      else:
        out.append(self.sp.id_to_piece(i).replace("\u2581", " "))
    return out


@functools.lru_cache(maxsize=4)
def _load_cached(path: str) -> Tokenizer:
  if os.path.isdir(path):
    raise ValueError(f"{path} is a directory; a sentencepiece tokenizer is a .model file (a Hugging Face "
                     "tokenizer directory is given as hf:<dir>)")
  with open(path, "rb") as f:
    return Tokenizer(f.read(), path)


def with_pieces(model_proto: bytes, pieces) -> bytes:
  """`model_proto` with `pieces` appended as user-defined symbols (new ids after the last; existing ids kept)."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top  (protobuf: only here)
  m = sentencepiece_model_pb2.ModelProto()
  m.ParseFromString(model_proto)
  have = {p.piece for p in m.pieces}
  for text in pieces:
    if text in have:
      raise ValueError(f"piece {text!r} is already in the model")
    p = m.pieces.add()
    p.piece, p.score, p.type = text, 0.0, sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
  return m.SerializeToString()


@functools.lru_cache(maxsize=1)
def load_tools() -> Tokenizer:
  """The shipped tokenizer with TOOL_MARKERS as single pieces (vocab 516): `task.tokenizer='tools'`."""
  with open(ASSET, "rb") as f:
    return Tokenizer(with_pieces(f.read(), TOOL_MARKERS), f"{ASSET} + tool markers")


def load(path: str | None = None) -> Tokenizer:
  """The shipped tokenizer, or the sentencepiece model file at `path` (any kind of tokenizer: tokenizer_factory)."""
  path = path or ASSET
  if not os.path.exists(path):
    raise ValueError(f"tokenizer model {path} is missing; run `python -m grpo_jax.tasks.build_tokenizer`")
  return _load_cached(os.path.abspath(path))
