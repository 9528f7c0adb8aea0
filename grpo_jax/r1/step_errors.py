"""Where a model's running totals on `sums` go wrong (issue #29's premise): per step, is its first operand the previous
total (copy), its second the question's next operand (look-up), its result their sum (addition)?

  python -m grpo_jax.r1.step_errors --workdir=DIR [--stage=base] [--seed=123]

Samples the held-out report's prompts (r1.report's sizes, temperature sampling) from DIR/<stage>/params and prints
one JSON line. `heldout.premise` says THAT step-by-step answers lose; this says which part of a step does, and
(`recheck`) whether the model's own re-checks end right more often than its first-written steps.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from grpo_jax.tasks import cot

KINDS = ("copy", "operand", "sum")
_PHRASE_WORDS = {w for p in cot.RECHECK.values() for w in p.split()}
_TO_A = dict(zip(cot.WORDS_B, cot.WORDS_A))
MAX_K = 16  # steps counted per text


def step_errors(texts: list[str], terms: list[tuple[int, ...]]) -> dict:
  """Error rates of the steps of each text against its operands `terms`. A re-check's re-written step replaces the
  step it checks and its column steps are not counted (`cot.final_steps`; a caught mistake counts as fixed); the
  running total follows what was written, so one wrong step is counted once. `chains_right`: step-by-step texts
  whose every step is right and that write exactly len(terms) - 1."""
  n_RxK = np.zeros((len(KINDS) + 1, MAX_K), np.int64)  # row 0: steps seen at index k; rows 1..3: KINDS' errors
  stepwise = chains = 0
  for text, ts in zip(texts, terms):
    steps = cot.final_steps(text)
    if not steps:
      continue
    stepwise += 1
    acc, ok = ts[0], len(steps) == len(ts) - 1
    for k, s in enumerate(steps[:MAX_K], start=1):
      m = cot.STEP_RE.fullmatch(s)
      if m is None or k >= len(ts):
        ok = False
        continue
      a, b, c = int(m.group(1)), int(m.group(3)), int(m.group(5)) * (-1 if m.group(4) else 1)
      wrong = (a != acc, b != ts[k], m.group(2) != "+" or a + b != c)
      n_RxK[0, k] += 1
      n_RxK[1:, k] += wrong
      ok &= not any(wrong)
      acc = c
    chains += ok
  seen = max(int(n_RxK[0].sum()), 1)
  return {"stepwise": stepwise, "chains_right": chains, "steps": int(n_RxK[0].sum()),
          **{f"{kind}_wrong": float(n_RxK[1 + i].sum() / seen) for i, kind in enumerate(KINDS)},
          "by_step": {int(k): {"n": int(n_RxK[0, k]), **{kind: int(n_RxK[1 + i, k]) for i, kind in enumerate(KINDS)}}
                      for k in range(1, MAX_K) if n_RxK[0, k]}}


def recheck_reliability(texts: list[str]) -> dict:
  """Whether a re-check can pay: of the steps written first (not inside a re-check), how many are right; of the
  re-checks that re-write their step (cot.spans), how many end right, how many check a wrong step, and
  how many of those they fix. A re-check pays when its re-written step is right more often than a first-written
  one, and re-checks that break a right step are rarer than fixes."""
  first = first_right = checks = rewritten = rewritten_right = checked_wrong = fixed = broken = 0
  by_word: dict[str, list[int]] = {}  # the re-checks' own steps (column additions, carries, combines): [n, right]
  for text in texts:
    steps = cot.split_steps(cot.think_body(text))
    for i, j in cot.spans(steps):
      if j is None:
        first += 1
        first_right += cot.score_step(steps[i])
        continue
      checks += 1
      if j < 0:
        continue
      for inner in steps[i:j]:
        words = [w for w in cot.STEP_WORD_RE.findall(inner) if w not in _PHRASE_WORDS]
        word = words[-1] if words else ""
        n_ok = by_word.setdefault(_TO_A.get(word, word), [0, 0])  # language b's words under language a's
        n_ok[0] += 1
        n_ok[1] += cot.score_step(inner)
      was, now = cot.score_step(steps[i - 1]), cot.score_step(steps[j])
      rewritten += 1
      rewritten_right += now
      checked_wrong += not was
      fixed += now and not was
      broken += was and not now
  rate = lambda a, b: a / b if b else float("nan")
  return {"first_steps": first, "first_right_rate": rate(first_right, first), "rechecks": checks,
          "rechecks_rewriting": rewritten, "rewritten_right_rate": rate(rewritten_right, rewritten),
          "checked_wrong": checked_wrong, "fixed": fixed, "broken": broken,
          "check_steps": {w: {"n": n, "right_rate": ok / n} for w, (n, ok) in sorted(by_word.items())}}


def main(argv: list[str]) -> None:
  import argparse

  import jax
  import ml_collections

  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  from grpo_jax.r1 import heldout, layout, stage_config
  from grpo_jax.rl import state as state_lib
  from grpo_jax.tasks import data as data_lib
  from grpo_jax.tasks import tokenizer_factory as tok_lib

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--stage", default="base")
  ap.add_argument("--seed", type=int, default=123)
  args = ap.parse_args(argv)
  with open(f"{args.workdir}/config.json") as f:
    config = ml_collections.ConfigDict(json.load(f))
  c = stage_config.for_heldout(config)
  exs = data_lib.fit_prompts(c.task, tok_lib.for_config(c), "test", data_lib.load_examples(c.task, "test"),
                             c.task.prompt_len)[:c.eval.size]
  if "terms" not in exs[0]:
    sys.exit(f"task.name={config.task.name!r} has no operand list ('terms'): step_errors reads running totals of "
             "task 'sums'")
  ev = heldout.make_evaluator(config)
  params = params_ckpt.load_params(layout.params_path(args.workdir, args.stage), state_lib.abstract_params(
      ev.mesh, model_lib.ModelConfig.from_config(config.model)))
  s = ev.rollouts(params, jax.random.PRNGKey(args.seed), sampled=True)
  out = step_errors(s.texts, [exs[i // c.eval.n_samples]["terms"] for i in range(len(s.texts))])
  print(json.dumps(dict(out, recheck=recheck_reliability(s.texts))))


if __name__ == "__main__":
  main(sys.argv[1:])
