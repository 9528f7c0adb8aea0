"""Batches for RL (prompts + verifier fields) and SFT (token sequences with loss masks), from the TFDS splits.

Every batch is a pure function of (data, seed, step): example order is a per-epoch permutation seeded by
(seed, epoch), so resuming needs only the step number. Prompts are LEFT-padded with pad_id and start with bos.
`task_cfg` is a dict or ConfigDict with `name`, the task's knobs, and optionally `language` ('a'|'b'|'mixed'),
`data_dir`, `split_seed`, `train_size`, `test_size`. What differs between tasks comes from registry.TASKS.
"""
from __future__ import annotations

import dataclasses
import json
import weakref
from typing import Any, Iterator, Sequence

import numpy as np

from grpo_jax.tasks import base, cot, prompts, registry, tokenizer as tokenizer_lib

_DEFAULTS = {"language": "a", "data_dir": None, "split_seed": 0, "train_size": 10_000, "test_size": 500,
             "prompt_format": "r1_zero", "overlong_prompts": "error", "train_indices": ()}
OVERLONG = ("error", "drop", "truncate")  # task.overlong_prompts
# Prompt lengths of a split's examples by example index, under what determines them: preflight, the RL batches and
# the eval set of one process (and every stage of an R1 pipeline) measure an example once. Held per tokenizer
# object, weakly: an id(tok) key was reused by a tokenizer made after the first was collected (lru eviction), which
# then read the other vocabulary's lengths.
_LENGTHS: weakref.WeakKeyDictionary[Any, dict[tuple, dict[int, int]]] = weakref.WeakKeyDictionary()


def _get(cfg: Any, key: str):
  if isinstance(cfg, dict):
    return cfg.get(key, _DEFAULTS.get(key))
  return getattr(cfg, key, _DEFAULTS.get(key)) if hasattr(cfg, key) else _DEFAULTS.get(key)


def make_task(task_cfg: Any):
  """The task object the config names, with the knobs its class takes read from the config."""
  name = _get(task_cfg, "name")
  cls = registry.get(name).task_class
  if cls is None:
    raise ValueError(f"task.name={name!r} has no text examples ({registry.get(name).doc}); use one of "
                     f"{registry.names('task_class')}")
  if not dataclasses.is_dataclass(cls):
    return cls()
  return registry.get_task(name, **{f.name: _get(task_cfg, f.name) for f in dataclasses.fields(cls)
                                    if f.name != "name" and _get(task_cfg, f.name) is not None})


def load_examples(task_cfg: Any, split: str) -> list[dict]:
  """The split's examples in index order; an empty split is one line (batches of it divided by zero)."""
  task = make_task(task_cfg)
  examples = registry.get(task.name).load(
      task, split, data_dir=_get(task_cfg, "data_dir"), split_seed=int(_get(task_cfg, "split_seed")),
      train_size=int(_get(task_cfg, "train_size")), test_size=int(_get(task_cfg, "test_size")))
  if not examples:
    where = _get(task_cfg, "data_dir") or "the default data dir"
    raise ValueError(f"task.data_dir: the {task.name} {split} split in {where} has no examples; point "
                     "task.data_dir at a copy that has them (or prepare it again).")
  return examples


def _split_languages(task_cfg) -> tuple[str, ...]:
  """The languages a split's prompts can be asked in (both under 'mixed')."""
  lang = _get(task_cfg, "language")
  return tuple(base.LANGUAGES) if lang == "mixed" else (lang,)


def prompt_lengths(task_cfg, tok, split: str, examples: list[dict] | None = None,
                   tools: Sequence[dict] = ()) -> np.ndarray:
  """Token length of the prompt of each of `examples` (default: the whole split, in index order), the longest over
  the languages it can be asked in; `tools`: the tool schemas the prompts list (tools.format='qwen':
  envs/batch.py prompt_tools). Cached by example index: `examples` may be any of the split's (train_indices),
  in any order, before or after the whole split was measured."""
  task = make_task(task_cfg)
  key = (repr(task), split, *(str(_get(task_cfg, k)) for k in ("data_dir", "split_seed", "train_size", "test_size",
                                                                "prompt_format")), _split_languages(task_cfg),
         json.dumps(list(tools), sort_keys=True))
  known = _LENGTHS.setdefault(tok, {}).setdefault(key, {})
  examples = load_examples(task_cfg, split) if examples is None else examples
  fmt = _get(task_cfg, "prompt_format")
  for ex in examples:
    if ex["index"] not in known:
      known[ex["index"]] = max(len(prompts.prompt_ids(task, ex, lang, tok, fmt, tools))
                               for lang in _split_languages(task_cfg))
  return np.asarray([known[ex["index"]] for ex in examples], np.int64)


def fit_prompts(task_cfg, tok, split: str, examples: list[dict], prompt_len: int,
                tools: Sequence[dict] = ()) -> list[dict]:
  """`examples` under task.overlong_prompts: all of them ('error' raises one line naming the count and the length
  that fits; 'truncate' keeps them for encode_prompts to cut), or those that fit ('drop'; none is an error)."""
  lengths = prompt_lengths(task_cfg, tok, split, examples, tools)
  over = np.flatnonzero(lengths > prompt_len)
  policy = _get(task_cfg, "overlong_prompts")
  if not len(over) or policy == "truncate":
    return examples
  if policy == "drop" and len(over) < len(lengths):
    return [ex for ex, n in zip(examples, lengths) if n <= prompt_len]
  if policy == "drop":  # nothing left to draw batches from (the batch order divided by 0 examples)
    raise ValueError(f"task.overlong_prompts=drop: all {len(lengths)} {split} prompts are longer than "
                     f"task.prompt_len={prompt_len} tokens (shortest {int(lengths.min())}); set task.prompt_len >= "
                     f"{int(lengths.min())}.")
  raise ValueError(f"task.prompt_len: {len(over)} of the {len(lengths)} {split} prompts are longer than "
                   f"task.prompt_len={prompt_len} tokens (longest {int(lengths.max())}, example "
                   f"{examples[int(over[0])]['index']} first); set task.prompt_len={int(lengths.max())}, or "
                   "task.overlong_prompts=drop (skip them, counted) or =truncate (keep bos and the last tokens).")


def overlong_count(task_cfg, tok, split: str, prompt_len: int, tools: Sequence[dict] = ()) -> tuple[int, int]:
  """(prompts longer than prompt_len, prompts) of a split."""
  lengths = prompt_lengths(task_cfg, tok, split, tools=tools)
  return int((lengths > prompt_len).sum()), len(lengths)


def repeated_questions(task_cfg) -> dict[str, list[int]]:
  """Example indices whose question (language 'a', whitespace collapsed) is asked before: test examples that a train
  example also asks ('test_in_train': held-out accuracy on them is not held out), and repeats within the test split
  ('test_repeats') and, for a dataset task, within the train split ('train_repeats'; a generated train split draws
  with replacement by design, its test split never repeats and never meets it)."""
  task = make_task(task_cfg)
  ask = lambda ex: " ".join(task.question(ex, "a").split())
  train, test = load_examples(task_cfg, "train"), load_examples(task_cfg, "test")

  def repeats(examples):
    seen, out = set(), []
    for ex in examples:
      q = ask(ex)
      if q in seen:
        out.append(ex["index"])
      seen.add(q)
    return out, seen
  train_repeats, train_questions = repeats(train)
  return {"test_in_train": [ex["index"] for ex in test if ask(ex) in train_questions],
          "test_repeats": repeats(test)[0],
          "train_repeats": [] if registry.generated(task.name) else train_repeats}


_BY_INDEX: dict[tuple, dict[int, dict]] = {}


def sample_context(task_cfg, tok, split: str, samples: dict) -> dict[str, list[str]]:
  """samples.jsonl's context of the logged samples (the step's `samples/*` on the host): each one's prompt as text
  and its example's reference answer (the task's answer_text), where the step reports them."""
  out = {}
  if "samples/prompt_NxP" in samples:
    out["prompts"] = [tok.decode(p[mk > 0].tolist()) for p, mk in zip(samples["samples/prompt_NxP"],
                                                                      samples["samples/prompt_mask_NxP"])]
  if "samples/index_N" in samples:
    task = make_task(task_cfg)
    # Everything the split's examples depend on: a generated train example avoids the test split's keys, so the
    # same index is another example under another test_size (a sweep over it in one process).
    key = (repr(task), split, *(str(_get(task_cfg, k)) for k in ("data_dir", "split_seed", "train_size", "test_size")))
    if key not in _BY_INDEX:
      _BY_INDEX[key] = {ex["index"]: ex for ex in load_examples(task_cfg, split)}
    out["references"] = [task.answer_text(_BY_INDEX[key][int(i)]) for i in samples["samples/index_N"]]
  return out


def _languages(task_cfg, n: int, seed: int, step: int) -> np.ndarray:
  lang = _get(task_cfg, "language")
  if lang == "mixed":
    return base.rng_for("language", seed, step).integers(0, 2, size=n).astype(np.int32)
  if lang not in base.LANGUAGES:
    raise ValueError(f"task.language={lang!r} is unknown; use 'a', 'b' or 'mixed'")
  return np.full(n, base.LANGUAGES.index(lang), np.int32)


def _order(n_examples: int, seed: int, step: int, batch: int) -> np.ndarray:
  pos = step * batch + np.arange(batch)
  epochs = pos // n_examples
  out = np.empty(batch, np.int64)
  for e in np.unique(epochs):
    perm = base.rng_for("order", seed, int(e)).permutation(n_examples)
    sel = epochs == e
    out[sel] = perm[pos[sel] % n_examples]
  return out


def encode_prompts(task, examples, languages_N, tok, prompt_len: int, prompt_format: str = "r1_zero",
                   truncate: bool = False, tools: Sequence[dict] = ()) -> tuple[np.ndarray, np.ndarray]:
  n = len(examples)
  prompt = np.full((n, prompt_len), tok.pad_id, np.int32)
  mask = np.zeros((n, prompt_len), np.int32)
  for i, (ex, lang) in enumerate(zip(examples, languages_N)):
    ids = prompts.prompt_ids(task, ex, base.LANGUAGES[int(lang)], tok, prompt_format, tools)
    if len(ids) > prompt_len and truncate:  # task.overlong_prompts=truncate: bos, then the prompt's end (the
      ids = ids[:1] + ids[len(ids) - prompt_len + 1:]  # question's last words and the answer cue)
    if len(ids) > prompt_len:
      raise ValueError(f"task.prompt_len={prompt_len} is too short for a {len(ids)}-token prompt (example "
                       f"{ex['index']}); set task.prompt_len >= {len(ids)} or make the task smaller")
    prompt[i, prompt_len - len(ids):] = ids
    mask[i, prompt_len - len(ids):] = 1
  return prompt, mask


def rl_batch(task, examples, languages_N, tok, prompt_len, prompt_format: str = "r1_zero",
             truncate: bool = False, tools: Sequence[dict] = ()) -> dict[str, np.ndarray]:
  """Prompts (left-padded to prompt_len, in `prompt_format`: tasks/prompts.py, listing `tools`) and the task's
  fields of `examples`, asked in `languages_N`."""
  prompt, mask = encode_prompts(task, examples, languages_N, tok, prompt_len, prompt_format, truncate, tools)
  out = {"prompt_NxP": prompt, "prompt_mask_NxP": mask, "language_N": languages_N,
         "index_N": np.asarray([ex["index"] for ex in examples], np.int32)}
  out.update(task.batch_fields(examples))
  return out


def rl_batches(task_cfg, tok: tokenizer_lib.Tokenizer, split: str, batch_prompts: int, seed: int,
               start_step: int, prompt_len: int, tools: Sequence[dict] = ()) -> Iterator[dict[str, np.ndarray]]:
  """Endless iterator; the batch yielded k-th is batch number start_step + k (a pure function of seed and it).
  `tools`: the tool schemas the prompts list (tools.format='qwen'; envs/batch.py prompt_tools)."""
  if batch_prompts < 1:
    raise ValueError(f"batch_prompts={batch_prompts} must be >= 1")
  task = make_task(task_cfg)
  examples = load_examples(task_cfg, split)
  if split == "train" and len(_get(task_cfg, "train_indices")):
    examples = train_subset(examples, _get(task_cfg, "train_indices"))
  examples = fit_prompts(task_cfg, tok, split, examples, prompt_len, tools)
  truncate = _get(task_cfg, "overlong_prompts") == "truncate"
  step = start_step
  while True:
    chosen = [examples[i] for i in _order(len(examples), seed, step, batch_prompts)]
    yield rl_batch(task, chosen, _languages(task_cfg, batch_prompts, seed, step), tok, prompt_len,
                   _get(task_cfg, "prompt_format"), truncate, tools)
    step += 1


def train_subset(examples: list[dict], indices) -> list[dict]:
  """task.train_indices: those examples of the train split, in the order given (a batch then draws them by the usual
  per-epoch permutation; one index: every prompt of every batch is that example)."""
  bad = [i for i in indices if not (isinstance(i, int) and 0 <= i < len(examples))]
  if bad or len(set(indices)) != len(indices):
    raise ValueError(f"task.train_indices={tuple(indices)!r}: give distinct indices of the train split's "
                     f"{len(examples)} examples (task.train_size), each in [0, {len(examples)}).")
  return [examples[i] for i in indices]


def eval_set(task_cfg, tok: tokenizer_lib.Tokenizer, n: int, prompt_len: int,
             tools: Sequence[dict] = ()) -> dict[str, np.ndarray]:
  """The first n held-out (test split) examples, same fields as an RL batch (prompts listing `tools` as the RL
  batches' do); language 'mixed' alternates a/b."""
  task = make_task(task_cfg)
  examples = fit_prompts(task_cfg, tok, "test", load_examples(task_cfg, "test"), prompt_len, tools)
  if n > len(examples):
    raise ValueError(f"eval.size: {n} exceeds the {len(examples)} usable examples of the test split; lower "
                     "eval.size (or raise task.test_size for a generated task)")
  examples = examples[:n]
  lang = _get(task_cfg, "language")
  langs = (np.arange(n) % 2 if lang == "mixed" else np.full(n, base.LANGUAGES.index(lang))).astype(np.int32)
  return rl_batch(task, examples, langs, tok, prompt_len, _get(task_cfg, "prompt_format"),
                  _get(task_cfg, "overlong_prompts") == "truncate", tools)


_FIELDS: dict[tuple, dict[str, tuple]] = {}


def prompt_fields(task_cfg, tok: tokenizer_lib.Tokenizer, prompt_len: int) -> dict[str, tuple]:
  """name -> (per-prompt shape, dtype name) of every field of an RL batch: what a state that holds prompts across
  steps allocates (rollout/carry.py). Read off one held-out example's batch, once per task config."""
  key = (repr(sorted(_task_items(task_cfg))), prompt_len, getattr(tok, "vocab_size", None), type(tok).__name__)
  if key not in _FIELDS:
    b = eval_set(task_cfg, tok, 1, prompt_len)
    _FIELDS[key] = {k: (tuple(v.shape[1:]), v.dtype.name) for k, v in b.items()}
  return dict(_FIELDS[key])


def _task_items(task_cfg) -> list:
  return list(task_cfg.items()) if hasattr(task_cfg, "items") else list(vars(task_cfg).items())


def _solution(task, ex: dict, lang: str, mistake: bool, tagged: bool) -> str:
  """An example's SFT target: the task's own (its records' worked solution: registry data_solutions), else the
  one tasks/cot.py writes."""
  if registry.get(task.name).data_solutions:
    return task.sft_completion(ex, tagged=tagged)
  return cot.solution(ex, lang, mistake=mistake, tagged=tagged)


def _sft_ids(task, ex: dict, lang: str, tok, mode: str, mistake: bool) -> tuple[list[int], list[int]]:
  """(head, tail) of one SFT sequence (sft_batches' layout; the loss is on the tail)."""
  if mode == "completion":
    return ([tok.bos_id] + tok.encode(base.prompt(task, ex, lang)),
            tok.encode(_solution(task, ex, lang, mistake, True)) + [tok.eos_id])
  return [tok.bos_id], tok.encode(task.question(ex, lang) + " " + _solution(task, ex, lang, mistake, False)) + [
      tok.eos_id]


_SFT_LENGTHS: weakref.WeakKeyDictionary[Any, dict[tuple, np.ndarray]] = weakref.WeakKeyDictionary()  # as _LENGTHS


def sft_drawn(n_examples: int, seed: int, steps: int, batch: int) -> np.ndarray:
  """The example indices (ascending, each once) that `steps` SFT batches of `batch` from step 0 draw (sft_batches'
  order): what the stage trains on, so what its sequence length must hold."""
  if steps * batch >= n_examples:
    return np.arange(n_examples)
  return np.unique(np.concatenate([_order(n_examples, seed, t, batch) for t in range(steps)]))


def sft_lengths(task_cfg, tok, split: str, mode: str = "completion", mistakes: bool = False,
                indices: np.ndarray | None = None) -> np.ndarray:
  """Token length of the SFT sequences of `split` at `indices` (default: all, in index order; sft_batches'
  layout): the longest over the languages it can be written in and, with `mistakes`, over the solution with and
  without one. What the SFT stage's seq_len (model.max_len) must hold; read by preflight before anything is written
  (once per process and key). Tokenizing a 20,000-example split took ~2 s a run start, so preflight passes the
  examples the stage draws (`sft_drawn`)."""
  task = make_task(task_cfg)
  examples = load_examples(task_cfg, split)
  idx = np.arange(len(examples)) if indices is None else np.asarray(indices, np.int64)
  key = (repr(task), split, *(str(_get(task_cfg, k)) for k in ("data_dir", "split_seed", "train_size", "test_size")),
         _split_languages(task_cfg), mode, mistakes, idx.tobytes())
  known = _SFT_LENGTHS.setdefault(tok, {})
  if key not in known:
    known[key] = np.asarray([max(sum(map(len, _sft_ids(task, examples[i], lang, tok, mode, m)))
                                        for lang in _split_languages(task_cfg) for m in {False, mistakes})
                                    for i in idx], np.int64)
  return known[key]


def sft_batches(task_cfg, tok: tokenizer_lib.Tokenizer, split: str, batch_size: int, seed: int, start_step: int,
                seq_len: int, mode: str = "completion", mistake_rate: float = 0.0) -> Iterator[dict[str, np.ndarray]]:
  """SFT sequences, right-padded. mode='completion': bos + prompt + tagged CoT solution + eos, loss on the
  completion and eos (cold-start SFT). mode='all': bos + question + untagged worked solution + eos, loss on every
  token after bos (base pretraining). loss_mask_NxT[t] = 1 where token t is a target."""
  if mode not in ("completion", "all"):
    raise ValueError(f"mode={mode!r} is unknown; use 'completion' or 'all'")
  task = make_task(task_cfg)
  if not (registry.get(task.name).worked_solutions or registry.get(task.name).data_solutions):
    raise ValueError(f"task.name={task.name!r} has no step-by-step reference solutions here; SFT uses one of "
                     f"{sorted(registry.names('worked_solutions') + registry.names('data_solutions'))}")
  examples = load_examples(task_cfg, split)
  step = start_step
  while True:
    chosen = [examples[i] for i in _order(len(examples), seed, step, batch_size)]
    langs = _languages(task_cfg, batch_size, seed, step)
    mistakes = base.rng_for("mistakes", seed, step).random(batch_size) < mistake_rate
    tokens = np.full((batch_size, seq_len), tok.pad_id, np.int32)
    loss = np.zeros((batch_size, seq_len), np.int32)
    mask = np.zeros((batch_size, seq_len), np.int32)
    for i, ex in enumerate(chosen):
      head, tail = _sft_ids(task, ex, base.LANGUAGES[int(langs[i])], tok, mode, bool(mistakes[i]))
      ids = head + tail
      if len(ids) > seq_len:  # preflight.check_sft_lengths refuses a drawn one first (sft_lengths)
        raise ValueError(f"seq_len={seq_len} is too short for a {len(ids)}-token SFT sequence (example "
                         f"{ex['index']}); raise it to >= {len(ids)}")
      tokens[i, :len(ids)] = ids
      mask[i, :len(ids)] = 1
      loss[i, len(head):len(ids)] = 1
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    yield {"tokens_NxT": tokens, "positions_NxT": positions, "mask_NxT": mask, "loss_mask_NxT": loss,
           "language_N": langs, "index_N": np.asarray([ex["index"] for ex in chosen], np.int32)}
    step += 1
