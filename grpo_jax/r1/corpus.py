"""The SFT-side data of R1: the base's raw pre-training text, the cold-start set, stage 4's records, packed batches.

Every batch is a pure function of (seed, step), so a resumed stage sees exactly the batches it would have seen.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Iterator, Sequence

import ml_collections
import numpy as np

from grpo_jax.envs import calculator
from grpo_jax.envs import formats
from grpo_jax.infra import errors
from grpo_jax.tasks import base, cot
from grpo_jax.tasks import data as data_lib

Batches = Callable[[int], Iterator[dict[str, np.ndarray]]]  # start_step -> endless SFT batches (train.run_sft)


def _other(lang: str) -> str:
  return "b" if lang == "a" else "a"


def mixed_solution(ex: dict, lang: str, mistake: bool, tagged: bool, switch_at: int, verify: bool = False,
                   **kw) -> str:
  """Worked solution whose steps from index `switch_at` on (and the ending) are in the other language; `kw` are
  cot.solution's re-check arguments (recheck, marks)."""
  own = cot.solution(ex, lang, mistake, tagged, verify, **kw).split(";")
  other = cot.solution(ex, _other(lang), mistake, tagged, verify, **kw).split(";")
  return ";".join(own[:switch_at] + other[switch_at:])


def insert_word(text: str, word: str, at: int) -> str:
  """`word` placed before step `at` (>= 1, so a tagged text still starts with <think>)."""
  parts = text.split(";")
  parts[at] = f" {word}{parts[at]}"
  return ";".join(parts)


def calculator_calls(ex: dict, rng: np.random.Generator, frac: float, fmt: str = "plain") -> list[str]:
  """Per step of `ex`'s worked solution, with probability `frac`: a calculator call on the step's `A op B` in
  tools.format `fmt` followed by the calculator's own observation (envs/calculator.py), else ''."""
  f, tool, steps = formats.get(fmt), calculator.Calculator.tool, cot.steps_of(ex)
  out = []
  for step, u in zip(steps, rng.random(len(steps))):
    expr = f"{step.a} {step.op} {step.b}"
    out.append(f.call_text(tool, expr) + f.observation(calculator.result_text(expr)[0]) if u < frac else "")
  return out


def pretrain_document(task, ex: dict, lang: str, rng: np.random.Generator, p) -> tuple[str, str]:
  """(head, tail) text of one pre-training document; head is the R1-Zero prompt for web-like chat transcripts.

  Plain documents (1 - template_frac): question + untagged solution. Chat transcripts (template_frac): the R1-Zero
  prompt + a solution that uses the tags with probability tag_frac. A solution works step by step with probability
  cot_frac, else answers directly (cot.brief); a worked one may switch language mid-solution (mix_frac), carry an
  err-recheck-correct step (mistake_frac), a re-check that finds nothing to fix (verify_frac), or a forbidden word
  (noise_frac): the raw web text that R1's later stages clean up. recheck_per "document": at most one of each per
  document; "step": each step drawn on its own. recheck_style: how a re-check is written (cot._recheck). tool_frac:
  each step of a worked one calls the calculator first (`calculator_calls`, in p.tool_format), so a base learns to
  call it sometimes (configs/tools_calc.py).
  """
  template = rng.random() < p.template_frac
  tagged = template and rng.random() < p.tag_frac
  # Drawn only when the mix has direct answers, so cot_frac = 1 keeps every earlier document as it was.
  if p.cot_frac < 1.0 and rng.random() >= p.cot_frac:
    body = cot.brief(ex, lang, tagged)
    return (base.prompt(task, ex, lang), body) if template else ("", task.question(ex, lang) + " " + body)
  kw = {"recheck": p.get("recheck_style", "repeat")}
  if p.get("recheck_per", "document") == "step":
    # Every step on its own: a mistake (then its re-check) with mistake_frac, else a re-check of the right step
    # with verify_frac, so a chain can re-check any number of its steps and RL can select re-checks per step.
    u = rng.random(cot.steps_written(cot.solution(ex, lang)))
    kw["marks"] = ["mistake" if x < p.mistake_frac else "verify" if x < p.mistake_frac + p.verify_frac else ""
                   for x in u]
    mistake = verify = False
  else:
    mistake = bool(rng.random() < p.mistake_frac)
    verify = p.verify_frac > 0 and bool(rng.random() < p.verify_frac)
  if p.get("tool_frac", 0.0) > 0:  # drawn only then, so tool_frac = 0 keeps every earlier document as it was
    kw["calls"] = calculator_calls(ex, rng, p.tool_frac, p.get("tool_format", "plain"))
  n_parts = len(cot.solution(ex, lang, mistake, tagged, verify, **kw).split(";"))
  switch = int(rng.integers(1, n_parts)) if rng.random() < p.mix_frac else n_parts
  body = mixed_solution(ex, lang, mistake, tagged, switch, verify, **kw)
  if rng.random() < p.noise_frac and n_parts > 2:
    body = insert_word(body, str(rng.choice(list(p.forbidden))), int(rng.integers(1, n_parts - 1)))
  if template:
    return base.prompt(task, ex, lang), body
  return "", task.question(ex, lang) + " " + body


def packed_len(head: Sequence[int], tail: Sequence[int]) -> int:
  """A packed row's tokens: bos + head + tail + eos."""
  return len(head) + len(tail) + 2


def pack(seqs: Sequence[tuple], tok, seq_len: int, key: str = "model.max_len") -> dict[str, np.ndarray]:
  """Right-padded SFT batch from (head ids, tail ids, loss on head too[, tail_obs]); loss never on bos; eos ends each
  row. `tail_obs` (len(tail) + 1 zeros and ones, the last for the eos): 1 marks an environment's observation token,
  which the row holds (attended to) but the loss leaves out. `key`: the config key that sets seq_len, named when a
  sequence does not fit."""
  n = len(seqs)
  tokens = np.full((n, seq_len), tok.pad_id, np.int32)
  mask = np.zeros((n, seq_len), np.int32)
  loss = np.zeros((n, seq_len), np.int32)
  for i, (head, tail, loss_on_head, *obs) in enumerate(seqs):
    ids = [tok.bos_id] + list(head) + list(tail) + [tok.eos_id]
    if len(ids) > seq_len:  # a one-line input error (was a ValueError traceback mid-stage)
      raise errors.InputError(f"config.{key}: {seq_len} is too short for a {len(ids)}-token SFT sequence "
                              "(bos + text + eos); raise it")
    tokens[i, :len(ids)] = ids
    mask[i, :len(ids)] = 1
    loss[i, (1 if loss_on_head else 1 + len(head)):len(ids)] = 1
    if obs and obs[0] is not None:
      loss[i, 1 + len(head):len(ids)] *= 1 - np.asarray(obs[0], np.int32)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  return {"tokens_NxT": tokens, "positions_NxT": positions, "mask_NxT": mask, "loss_mask_NxT": loss}


def _epoch_order(n: int, seed: int, step: int, batch: int, what: str) -> np.ndarray:
  """Row order of batch `step`: a fresh permutation per epoch, seeded by (what, seed, epoch)."""
  pos = step * batch + np.arange(batch)
  out = np.empty(batch, np.int64)
  for e in np.unique(pos // n):
    sel = pos // n == e
    out[sel] = base.rng_for(what, seed, int(e)).permutation(n)[pos[sel] % n]
  return out


def pretrain_batches(config, tok, examples: list[dict]) -> Batches:
  """The base's pre-training documents, drawn afresh for every (seed, step, row)."""
  task = data_lib.make_task(config.task)
  p = ml_collections.ConfigDict(dict(config.r1.pretrain.to_dict(), forbidden=tuple(config.r1.forbidden),
                                     tool_format=config.tools.format if "tools" in config else "plain"))
  batch = p.batch

  def gen(start: int):
    step = start
    while True:
      seqs = []
      for j, idx in enumerate(_epoch_order(len(examples), config.seed, step, batch, "pretrain")):
        rng = base.rng_for("pretrain_doc", config.seed, step, j)
        lang = base.LANGUAGES[int(rng.integers(2))]
        if config.task.language != "mixed":  # after the draw: a one-language run keeps the mixed run's documents
          lang = config.task.language
        head, tail = pretrain_document(task, examples[idx], lang, rng, p)
        seqs.append((tok.encode(head) if head else [], tok.encode(tail), True))
      yield pack(seqs, tok, p.seq_len or config.model.max_len, "r1.pretrain.seq_len" if p.seq_len else "model.max_len")
      step += 1
  return gen


def _cycle(config, tok, seqs, batch: int, what: str) -> Batches:
  """Epochs over a fixed list of sequences, reshuffled per epoch."""
  def gen(start: int):
    step = start
    while True:
      yield pack([seqs[i] for i in _epoch_order(len(seqs), config.seed, step, batch, what)], tok,
                 config.model.max_len)
      step += 1
  return gen


def cold_start_set(config, tok, examples: list[dict]) -> list[tuple[list[int], list[int], bool]]:
  """The small cold-start set: the first `examples` train problems, tagged, single-language, loss on completion."""
  task = data_lib.make_task(config.task)
  cs = config.r1.cold_start
  fixed = []
  for ex in examples[:cs.examples]:
    rng = base.rng_for("cold_start", config.seed, ex["index"])
    lang = base.LANGUAGES[int(rng.integers(2))] if config.task.language == "mixed" else config.task.language
    sol = cot.solution(ex, lang, mistake=bool(rng.random() < cs.mistake_frac))
    fixed.append((tok.encode(base.prompt(task, ex, lang)), tok.encode(sol), False))
  return fixed


def cold_start_batches(config, tok, examples: list[dict]) -> Batches:
  """Epochs over `cold_start_set`."""
  return _cycle(config, tok, cold_start_set(config, tok, examples), config.r1.cold_start.batch, "cold_start_order")


def records_batches(config, tok, records: list[dict]) -> Batches:
  """Stage 4's data: reasoning records (loss on the completion, less its observation tokens: `obs_mask`, written
  when rejection sampling ran an environment) and general text (loss on every token)."""
  seqs = [(r["prompt_ids"], r["completion_ids"], r["kind"] == "general", r.get("obs_mask")) for r in records]
  return _cycle(config, tok, seqs, config.r1.sft2.batch, "sft2_order")


def write_records(path: str, records: list[dict]) -> None:
  """One JSON object per line, through a temporary file: the file exists whole or not at all."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


def _check_obs_mask(rec: dict) -> None:
  """A record's `obs_mask` (absent: a record sampled without an environment, every token trained): one 0 or 1 per
  completion id and one for the eos that ends it, so that stage 4 never trains on a token the model did not write."""
  obs = rec.get("obs_mask")
  if obs is None:
    return
  if (not isinstance(obs, list) or not isinstance(rec["completion_ids"], list)
      or len(obs) != len(rec["completion_ids"]) + 1 or any(v not in (0, 1) for v in obs)):
    raise ValueError("obs_mask must hold a 0 or 1 per completion id and one for its eos")


KINDS = ("reasoning", "general")  # a record's kind: loss on its completion, or on every token (records_batches)


def _check_ids(rec: dict, vocab_size: int | None) -> None:
  """Token ids a model can embed: a list of ints in [0, vocab_size) each (an edited id past the vocabulary trained
  silently on a clamped embedding row, a negative one on a wrapped one, a float on its truncation)."""
  if rec["kind"] not in KINDS:
    raise ValueError(f"kind {rec['kind']!r} is not one of {list(KINDS)}")
  for key in ("prompt_ids", "completion_ids"):
    ids = rec[key]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
      raise ValueError(f"{key} is not a list of token ids")
    bad = [i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)]
    if bad:
      raise ValueError(f"{key} holds {bad[0]}, not a token id of the {vocab_size}-token vocabulary")


def read_records(path: str, vocab_size: int | None = None) -> list[dict]:
  """The records write_records wrote; a damaged file (edited, or torn by the storage) is one line naming it and
  the line, and how to write it again, not a JSON traceback. `vocab_size`: the ids must be tokens of it."""
  out = []
  with open(path, "rb") as f:
    for n, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8")
        if not line.strip():
          continue
        rec = json.loads(line)
        if not isinstance(rec, dict) or not all(k in rec for k in ("prompt_ids", "completion_ids", "kind")):
          raise ValueError("not a record with prompt_ids, completion_ids and kind")
        _check_ids(rec, vocab_size)
        _check_obs_mask(rec)
      except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise errors.InputError(
            f"{path} line {n} is damaged ({errors.one_line(str(e))[:120]}); write it again with "
            "--config.train.rerun_stages=r1_3_rejection (the old directory is kept under replaced/).") from None
      out.append(rec)
  if not out:  # truncated to nothing: stage 4's epochs over no records were an IndexError traceback
    raise errors.InputError(f"{path} holds no records; write it again with "
                            "--config.train.rerun_stages=r1_3_rejection (the old directory is kept under replaced/).")
  return out
