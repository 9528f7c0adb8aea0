"""The long-tail benchmark's prompts (`grpo_step.py --model-dir DIR --workload tail`), shared by every side.

A prompt names a count n with one word, "what is <n>"; the checkpoint of make_tail_checkpoint.py answers with the
count words of n−1, …, 1 and then EOS: n tokens incl. EOS, decided by the prompt. n is drawn lognormal (median L/8,
σ = 1: mean ≈ L/5 before the cap), rounded and kept in [2, L], so a batch's completion lengths are long-tailed: most
rows stop near L/8 while about 2% run to L. Plain Python with its own `random.Random(seed)`, like stop_prompts.py, so
every side builds the same rows in the same order from any interpreter.
"""
import math
import random
import statistics
import string

SIGMA = 1.0  # of log n: the median-to-mean ratio exp(σ²/2) ≈ 1.65 of the R1-like distribution


def word(k: int) -> str:
  """The digit-free word of count k >= 1 (base-26 letters, "<b>" = 1, "<ba>" = 26): the name of filler id
  digits.FILLER0 + k in the benchmarks' tokenizer, so a decoded completion holds digits only where digits were
  written."""
  s = ""
  while True:
    k, r = divmod(k, 26)
    s = string.ascii_lowercase[r] + s
    if k == 0:
      return f"<{s}>"


def lengths(n: int, L: int, seed: int = 0) -> list[int]:
  """n target completion lengths (tokens incl. EOS): round(lognormal(median L/8, SIGMA)) kept in [2, L]."""
  rng = random.Random(seed)
  return [min(L, max(2, round(rng.lognormvariate(math.log(L / 8), SIGMA)))) for _ in range(n)]


def rows(n: int, L: int, seed: int = 0) -> list[dict]:
  """n rows {"prompt": "what is <k>", "answer": "<b>", "length": k}: the right completion counts down to "<b>" (1)
  and ends, so the peers' reward `answer in completion` is 1 for a row that counted down to the end (also one that
  skipped counts on the way)."""
  return [{"prompt": f"what is {word(k)}", "answer": word(1), "length": k} for k in lengths(n, L, seed)]


def stats(lens) -> dict:
  """median / mean / p90 / max / total of a list of lengths (plain Python: every side prints the same fields)."""
  s = sorted(lens)
  p90 = s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]  # the nearest-rank percentile
  return dict(median=float(statistics.median(s)), mean=sum(s) / len(s), p90=float(p90), max=s[-1],
              total=sum(s))


def describe(lens) -> str:
  st = stats(lens)
  return (f"median {st['median']:.1f} mean {st['mean']:.2f} p90 {st['p90']:.0f} max {st['max']} "
          f"total {st['total']} tokens")


def result_fields(name: str, rollout_s: list[float], lens: list[list[int]], skip: int = 1) -> str:
  """A peer's RESULT fields over its counted rollouts (the first `skip` compile or warm up): the median rollout time
  and the completion lengths (tokens incl. EOS) of every counted row."""
  if len(rollout_s) != len(lens) or len(lens) <= skip:
    raise SystemExit(f"{name}: {len(rollout_s)} rollout times and {len(lens)} length lists; need more than {skip}.")
  st = stats([x for step in lens[skip:] for x in step])
  return (f" {name}_rollout_s={statistics.median(rollout_s[skip:]):.4f} {name}_len_median={st['median']:.1f} "
          f"{name}_len_mean={st['mean']:.2f} {name}_len_max={st['max']} {name}_tokens={st['total']}")
