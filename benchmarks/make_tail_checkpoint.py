"""The long-tail benchmark's shared checkpoint: a model of the benchmark's shape that writes as many tokens as its
prompt says, then EOS (`grpo_step.py --model-dir DIR --workload tail`).

A prompt "what is <n>" names a count n with one word (peers/tail_prompts.py); the answer is the count words of n−1,
…, 1 and EOS: n tokens incl. EOS. Every next token is a function of the previous one (count down by one; EOS after
"<b>" = 1), a rule the model learns for every count up to L whatever the position, so the completion lengths are
the prompts' numbers, and the benchmark draws those long-tailed (lognormal, median L/8, kept in [2, L]). Training is
our SFT step (make_stop_checkpoint.train, seeded) on counts drawn uniform in [1, L], a quarter of them L, so every
step of every count is trained; the checkpoint is written by make_stop_checkpoint.write (hf_save.save_hf + the
shared tokenizer, here with the count words as added tokens so that the prompt's word is one token on every side).

  python benchmarks/make_tail_checkpoint.py --out /tmp/tail_small      # bench-small shape, L = 512

After training it samples the benchmark's prompts (held-out seed) at temperature 1 with up to L new tokens and
prints the completion lengths' median / mean / p90 / max against the prompts' targets, and the fraction of rows
whose length is exactly their target.
"""
import argparse
import time

import numpy as np

import make_stop_checkpoint as msc  # benchmarks/ (the script's directory): it puts benchmarks/peers on sys.path
import tail_prompts
from grpo_jax.tasks import digits

SHAPE = dict(hidden=256, layers=4, heads=8, kv=4, inter=1024, vocab=2048)  # bench-small (grpo_step.py's docstring)
PROMPT_LEN = 3  # "what is <n>": what, is, the count word


def count_id(k):
  """The token id of count word k (tail_prompts.word(k)): the filler id FILLER0 + k."""
  return digits.FILLER0 + k


def make_tokenizer(vocab: int, L: int):
  """make_stop_checkpoint's tokenizer with the count words 1..L as added tokens: its Whitespace pre-tokenizer would
  split "<b>" into "<", "b", ">" (all unknown)."""
  from tokenizers import AddedToken
  if count_id(L) >= vocab:
    raise SystemExit(f"--vocab {vocab}: the count words of 1..{L} need ids up to {count_id(L)}; use --vocab "
                     f"{count_id(L) + 1} or more (or a smaller --L).")
  tok = msc.make_tokenizer(vocab)
  tok.add_tokens([AddedToken(tail_prompts.word(k), normalized=False) for k in range(1, L + 1)])
  return tok


def train_counts(rng: np.random.Generator, n: int, L: int) -> np.ndarray:
  """Training counts: uniform in [1, L], a quarter of them L (the rows that hold every count's step)."""
  return np.where(rng.random(n) < 0.25, L, rng.integers(1, L + 1, n))


def sft_batch(tok, rng: np.random.Generator, n: int, L: int) -> dict:
  """n sequences ["what is <k>" | <k−1> … <b> EOS, right-padded to L], loss on the completion incl. EOS."""
  counts = train_counts(rng, n, L)
  prompt, pmask = msc.encode_prompts(tok, [f"what is {tail_prompts.word(int(k))}" for k in counts], PROMPT_LEN)
  steps_L = np.arange(L)
  cmask = (steps_L[None] < counts[:, None]).astype(np.int32)  # k tokens: k−1 count words, then EOS
  comp = np.where(steps_L[None] < counts[:, None] - 1, count_id(counts[:, None] - 1 - steps_L[None]), digits.PAD)
  comp = np.where(steps_L[None] == counts[:, None] - 1, digits.EOS, comp).astype(np.int32)
  mask = np.concatenate([pmask, cmask], 1)
  return {"tokens_NxT": np.concatenate([prompt, comp], 1), "mask_NxT": mask,
          "positions_NxT": np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32),
          "loss_mask_NxT": np.concatenate([np.zeros_like(pmask), cmask], 1)}


def sampled_lengths(mcfg, params, tok, rows: list[dict], L: int, seed: int, exit_chunk: int = 16) -> np.ndarray:
  """Completion lengths (incl. EOS; L for a row without one) of `rows` sampled at temperature 1, up to L new
  tokens, the prompts left-padded to the benchmark's prompt length as grpo_step.py feeds them."""
  import jax
  from grpo_jax.rollout import sampling
  prompt, pmask = msc.encode_prompts(tok, [r["prompt"] for r in rows])
  scfg = sampling.SamplingConfig(temperature=1.0, max_new_tokens=L, eos_id=digits.EOS, pad_id=digits.PAD,
                                 exit_chunk=exit_chunk)
  ro = jax.jit(lambda p, x, m, k: sampling.sample(mcfg, p, x, m, k, scfg))(params, prompt, pmask,
                                                                           jax.random.PRNGKey(seed))
  return np.asarray(ro.lengths_N)


def check(mcfg, params, tok, n: int, L: int, seed: int) -> dict:
  """Sampled lengths of n held-out benchmark prompts (tail_prompts.rows with seed + 1) against their targets."""
  rows = tail_prompts.rows(n, L, seed + 1)
  got = sampled_lengths(mcfg, params, tok, rows, L, seed)
  want = np.asarray([r["length"] for r in rows])
  return dict(got=tail_prompts.stats(got.tolist()), want=tail_prompts.stats(want.tolist()),
              exact=float(np.mean(got == want)), mean_abs_err=float(np.mean(np.abs(got - want))))


def report(ev: dict, n: int, L: int) -> list[str]:
  g, w = ev["got"], ev["want"]
  return [f"held-out {n} prompts, sampled at temperature 1 (L = {L}), completion length incl. EOS vs target: "
          + "  ".join(f"{k} {g[k]:.1f}/{w[k]:.1f}" for k in ("median", "mean", "p90", "max"))
          + f"; exact {ev['exact']:.3f}, mean |error| {ev['mean_abs_err']:.2f} tokens",
          f"RESULT tail_len_median={g['median']:.1f} tail_len_mean={g['mean']:.2f} tail_len_p90={g['p90']:.0f} "
          f"tail_len_max={g['max']} target_median={w['median']:.1f} target_mean={w['mean']:.2f} "
          f"target_p90={w['p90']:.0f} target_max={w['max']} exact={ev['exact']:.3f} L={L}"]


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True, help="the checkpoint directory to write (created)")
  for k, v in SHAPE.items():
    ap.add_argument(f"--{k}", type=int, default=v)
  ap.add_argument("--L", type=int, default=512, help="the longest count (the benchmark's L)")
  ap.add_argument("--steps", type=int, default=200, help="SFT steps")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--max-len", type=int, default=2048, help="max_position_embeddings of the checkpoint")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--eval", type=int, default=128, help="held-out prompts for the printed length check")
  a = ap.parse_args()
  t0 = time.perf_counter()
  tok = make_tokenizer(a.vocab, a.L)
  mcfg, params, losses = msc.train(a, tok, lambda tok, rng, n: sft_batch(tok, rng, n, a.L))
  msc.write(a.out, mcfg, params, tok)
  k = max(1, a.steps // 10)
  print(f"SFT {a.steps} steps x {a.batch} (L = {a.L}): loss first {np.mean(losses[:k]):.4f} last "
        f"{np.mean(losses[-k:]):.4f}; {time.perf_counter() - t0:.1f}s; wrote {a.out}", flush=True)
  for line in report(check(mcfg, params, tok, a.eval, a.L, a.seed), a.eval, a.L):
    print(line)


if __name__ == "__main__":
  main()
