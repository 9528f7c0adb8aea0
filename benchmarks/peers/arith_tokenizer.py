"""The peers' shared tokenizer: a byte-level BPE trained on 5000 "what is A + B = C" lines drawn from `random`
seeded 0, so both harnesses see the same vocabulary and continue the same random stream for their prompts."""
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def make(vocab: int) -> PreTrainedTokenizerFast:
  random.seed(0)
  corpus = [f"what is {random.randint(0,999)} + {random.randint(0,999)} = {random.randint(0,1999)}" for _ in range(5000)]
  tok = Tokenizer(models.BPE(unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|pad|>"],
                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>",
                                 padding_side="left")
