"""Rebuilds assets/tokenizer.model byte-identically: fixed corpus (fixed seeds), one thread, fixed options.

Usage: python -m grpo_jax.tasks.build_tokenizer [--out PATH]
"""
from __future__ import annotations

import argparse
import io
import string

import sentencepiece as spm

from grpo_jax.tasks import base, cot, registry, tokenizer

VOCAB_SIZE = 512
_CORPUS_TASKS = (("arith", {"max_digits": 4}), ("countdown", {}),
                 ("countdown", {"num_numbers": 6, "max_number": 100, "max_target": 1000}))
_PER_TASK = 150


def corpus() -> list[str]:
  """Task text in both languages (prompts, tagged/untagged/mistake solutions) + every printable ASCII char once."""
  lines = []
  for name, knobs in _CORPUS_TASKS:
    task = registry.get_task(name, **knobs)
    for i in range(_PER_TASK):
      ex = task.generate(base.rng_for("tokenizer-corpus", name, i))
      for lang in base.LANGUAGES:
        lines.append(base.prompt(task, ex, lang))
        lines.append(cot.solution(ex, lang, mistake=bool(i % 3 == 0)))
        lines.append(cot.solution(ex, lang, tagged=False))
  # Printable ASCII (no tab/newline) so any such text encodes without <unk>, e.g. '<', 'k', '>' as plain pieces.
  lines.append(" ".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c"))
  return lines


def build() -> bytes:
  out = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(corpus()), model_writer=out, model_type="bpe", vocab_size=VOCAB_SIZE,
      user_defined_symbols=list(tokenizer.TAGS), split_digits=True, pad_id=0, bos_id=1, eos_id=2, unk_id=3,
      num_threads=1, normalization_rule_name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False,
      character_coverage=1.0, shuffle_input_sentence=False, hard_vocab_limit=True, minloglevel=2,
      max_sentence_length=100_000, seed_sentencepiece_size=100_000)
  return out.getvalue()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=tokenizer.ASSET)
  args = parser.parse_args()
  data = build()
  with open(args.out, "wb") as f:
    f.write(data)
  print(f"wrote {args.out} ({len(data)} bytes, vocab {VOCAB_SIZE})")


if __name__ == "__main__":
  main()
