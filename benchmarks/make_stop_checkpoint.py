"""The realistic-lengths benchmark's shared checkpoint: a model of the benchmark's shape that answers and stops.

A random model never draws EOS, so every system decodes to L. This script trains one briefly (SFT with our code) to
answer "what is A + B =" with digits and then EOS, and writes it as a Hugging Face Qwen2 directory (hf_save.save_hf)
with a tokenizer.json that grpo_jax, TRL and tunix all load: `grpo_step.py --model-dir DIR` runs the three on it.

The tokenizer (a `tokenizers` WordLevel model) has digits.py's ids: 0 <|pad|>, 1 <|endoftext|> (EOS), 2..11 the
digits, 12..15 "what" "is" "+" "=", 16 <unk>, the rest letter-named words ("<ab>") that hold no digit. Digits are
split one per token; the decoder fuses tokens without spaces, so the peers' text reward `str(A + B) in completion`
is true exactly when our token reward (the answer's digit ids appear contiguously) is.

  python benchmarks/make_stop_checkpoint.py --out /tmp/stop_tiny  --hidden 64 --layers 2 --heads 4 --kv 2 --inter 128 --vocab 512
  python benchmarks/make_stop_checkpoint.py --out /tmp/stop_small --hidden 256 --layers 4 --heads 8 --kv 4 --inter 1024 --vocab 2048

Deterministic for a given --seed. Prints the training loss, the greedy accuracy (exact sum, then EOS) and the mean
completion length, greedy and sampled at temperature 1 (the benchmark's).
"""
import argparse
import json
import os
import time

import sys

import numpy as np

from grpo_jax.tasks import digits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import tail_prompts  # noqa: E402  (benchmarks/peers: plain Python the peers' venvs import too)

SHAPE = dict(hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=512)
PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<|pad|>", "<|endoftext|>", "<unk>"
WORDS = {digits.WHAT: "what", digits.IS: "is", digits.PLUS: "+", digits.EQ: "="}
ANSWER_LEN = 5  # completion slots in training: up to 4 sum digits (A + B <= 1998) and EOS


def _filler(i: int) -> str:
  """A digit-free name for filler id i (>= FILLER0 + 1): tail_prompts.word(i - FILLER0), base-26 letters, so a
  decoded completion holds digits only where the model wrote digit tokens."""
  return tail_prompts.word(i - digits.FILLER0)


def vocab_map(vocab: int) -> dict[str, int]:
  if vocab <= digits.FILLER0:
    raise SystemExit(f"--vocab {vocab}: needs at least {digits.FILLER0 + 1} ids (pad, EOS, 10 digits, 4 words, unk).")
  v = {PAD_TOKEN: digits.PAD, EOS_TOKEN: digits.EOS, UNK_TOKEN: digits.FILLER0}
  v.update({str(d): digits.DIGIT0 + d for d in range(10)})
  v.update({w: i for i, w in WORDS.items()})
  v.update({_filler(i): i for i in range(digits.FILLER0 + 1, vocab)})
  return v


def make_tokenizer(vocab: int):
  """The shared `tokenizers.Tokenizer`: whitespace/punctuation split, one token per digit, no BOS, fused decoding."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
  tok = Tokenizer(models.WordLevel(vocab_map(vocab), unk_token=UNK_TOKEN))
  tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                               pre_tokenizers.Digits(individual_digits=True)])
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens([AddedToken(t, special=True) for t in (PAD_TOKEN, EOS_TOKEN)])
  return tok


def save_tokenizer(out: str, tok) -> None:
  """tokenizer.json plus the tokenizer_config.json transformers (TRL, tunix) and our hf_tokenizer read. No unk_token
  there: transformers would treat it as special and drop it when decoding, joining digits our reward sees apart.
  Load it with PreTrainedTokenizerFast.from_pretrained: transformers 5's AutoTokenizer picks Qwen2Tokenizer from
  config.json's model_type, whose own pre-tokenizer drops "what" and "is"."""
  tok.save(os.path.join(out, "tokenizer.json"))
  cfg = dict(tokenizer_class="PreTrainedTokenizerFast", eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, bos_token=None, padding_side="left", clean_up_tokenization_spaces=False, model_max_length=4096)
  with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump(cfg, f, indent=2)


def write(out: str, mcfg, params, tok) -> None:
  """The checkpoint directory: hf_save.save_hf (EOS / pad = digits.py's, no BOS) plus the shared tokenizer."""
  from grpo_jax.hf import hf_save
  os.makedirs(out, exist_ok=True)
  hf_save.save_hf(out, mcfg, params, base_config=dict(eos_token_id=digits.EOS, pad_token_id=digits.PAD,
                                                    bos_token_id=None))
  save_tokenizer(out, tok)


def encode_prompts(tok, texts: list[str], P: int = digits.BENCH_PROMPT_LEN) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded [N, P] ids and mask, as every side pads (TRL and tunix pad left too)."""
  ids = [e.ids for e in tok.encode_batch(texts)]
  if max(map(len, ids)) > P:
    raise ValueError(f"a prompt has {max(map(len, ids))} tokens, more than P = {P}")
  prompt = np.full((len(ids), P), digits.PAD, np.int32)
  mask = np.zeros((len(ids), P), np.int32)
  for i, r in enumerate(ids):
    prompt[i, P - len(r):], mask[i, P - len(r):] = r, 1
  return prompt, mask


def sft_batch(tok, rng: np.random.Generator, n: int) -> dict:
  """n sequences [prompt (left-padded) | sum digits, EOS (right-padded)], loss on the completion incl. EOS."""
  a, b = rng.integers(0, 1000, n), rng.integers(0, 1000, n)
  prompt, pmask = encode_prompts(tok, [f"what is {x} + {y} =" for x, y in zip(a, b)])
  comp = np.full((n, ANSWER_LEN), digits.PAD, np.int32)
  cmask = np.zeros((n, ANSWER_LEN), np.int32)
  for i, e in enumerate(tok.encode_batch([str(s) for s in a + b])):
    r = e.ids + [digits.EOS]
    comp[i, :len(r)], cmask[i, :len(r)] = r, 1
  mask = np.concatenate([pmask, cmask], 1)
  return {"tokens_NxT": np.concatenate([prompt, comp], 1), "mask_NxT": mask,
          "positions_NxT": np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32),
          "loss_mask_NxT": np.concatenate([np.zeros_like(pmask), cmask], 1)}


def sft_config(a):
  c = digits.bench_config(hidden=a.hidden, layers=a.layers, heads=a.heads, kv=a.kv, inter=a.inter, vocab=a.vocab)
  c.job = "sft"
  c.model.max_len = a.max_len  # written as max_position_embeddings: a bound on prompt + L for any benchmark L
  c.sft.update(steps=a.steps, batch=a.batch, lr=a.lr, warmup_steps=20)
  return c


def train(a, tok, batch_fn=sft_batch) -> tuple:
  """(ModelConfig, params, losses): a.steps AdamW steps of our SFT step from the seed's random init, on
  batch_fn(tok, rng, a.batch) batches (rng: numpy, seeded with a.seed)."""
  import jax
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import families
  from grpo_jax.rl import sft_step
  from grpo_jax.infra import sharding
  c = sft_config(a)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  step = families.make_step(c, mesh, mcfg, family=sft_step)
  state = sft_step.init(c, mesh, mcfg, seed=a.seed)
  rng = np.random.default_rng(a.seed)
  losses = []
  for _ in range(a.steps):
    state, m = step(state, batch_fn(tok, rng, a.batch))
    losses.append(float(m["train/loss"]))
  return mcfg, jax.device_get(state["params"]), losses


def evaluate(mcfg, params, tok, n: int, L: int, seed: int) -> dict:
  """Greedy exact-answer accuracy and mean completion length (incl. EOS; L if no EOS) on n held-out prompts, and the
  mean / max length of completions sampled at temperature 1 with up to L new tokens."""
  import jax
  from grpo_jax.rollout import sampling
  rows = np.random.default_rng(seed + 1).integers(0, 1000, (n, 2))
  prompt, pmask = encode_prompts(tok, [f"what is {x} + {y} =" for x, y in rows])
  out = {}
  for name, greedy in (("greedy", True), ("sampled", False)):
    scfg = sampling.SamplingConfig(temperature=1.0, max_new_tokens=L, greedy=greedy, eos_id=digits.EOS,
                                   pad_id=digits.PAD, exit_chunk=8)
    ro = jax.jit(lambda p, x, m, k: sampling.sample(mcfg, p, x, m, k, scfg))(params, prompt, pmask,
                                                                             jax.random.PRNGKey(seed))
    toks, lens = np.asarray(ro.tokens_NxL), np.asarray(ro.lengths_N)
    out[f"{name}_len_mean"], out[f"{name}_len_max"] = float(lens.mean()), int(lens.max())
    if greedy:
      want = [tok.encode(str(x + y)).ids + [digits.EOS] for x, y in rows]
      out["greedy_acc"] = float(np.mean([list(t[:len(w)]) == w and len(w) == k for t, w, k in zip(toks, want, lens)]))
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True, help="the checkpoint directory to write (created)")
  for k, v in SHAPE.items():
    ap.add_argument(f"--{k}", type=int, default=v)
  ap.add_argument("--steps", type=int, default=300, help="SFT steps")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--max-len", type=int, default=2048, help="max_position_embeddings of the checkpoint")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--eval", type=int, default=256, help="held-out prompts for the printed accuracy and lengths")
  ap.add_argument("--eval-L", type=int, default=64, help="max new tokens of the evaluation's decodes")
  a = ap.parse_args()
  t0 = time.perf_counter()
  tok = make_tokenizer(a.vocab)
  mcfg, params, losses = train(a, tok)
  write(a.out, mcfg, params, tok)
  ev = evaluate(mcfg, params, tok, a.eval, a.eval_L, a.seed)
  k = max(1, a.steps // 10)
  print(f"SFT {a.steps} steps x {a.batch}: loss first {np.mean(losses[:k]):.3f} last {np.mean(losses[-k:]):.3f}; "
        f"{time.perf_counter() - t0:.1f}s; wrote {a.out}")
  print(f"held-out {a.eval} prompts, completion lengths incl. EOS (L = {a.eval_L}): greedy mean "
        f"{ev['greedy_len_mean']:.2f} max {ev['greedy_len_max']}, sampled (temperature 1) mean "
        f"{ev['sampled_len_mean']:.2f} max {ev['sampled_len_max']}")
  print(f"RESULT greedy_acc={ev['greedy_acc']:.3f} greedy_len_mean={ev['greedy_len_mean']:.2f} "
        f"sampled_len_mean={ev['sampled_len_mean']:.2f} sampled_len_max={ev['sampled_len_max']}")


if __name__ == "__main__":
  main()
