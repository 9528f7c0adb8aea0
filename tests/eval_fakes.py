"""Stand-ins for evaluation.make_generate's jitted functions: fixed completions per question, so a test checks the
host side of evaluation (gather, decode, verifiers, readings, metrics) exactly."""
from typing import Callable

import numpy as np


def fake_generate(tok, length: int, table: dict, n: int, ids_of: Callable, verify: Callable | None = None):
  """Row r of a chunk is sample r % n of question index_N[r]: `ids_of(tok, table entry, r, fields)` -> its ids.
  With `verify` ((tokens, mask, fields) -> (accuracy_N, format_N)) the in-graph form (5 outputs), else the host form
  (tokens, mask, lengths)."""

  def gen(params, prompt_NxP, pmask_NxP, fields, rng):
    del params, prompt_NxP, pmask_NxP, rng
    rows = len(fields["index_N"])
    tokens = np.full((rows, length), tok.pad_id, np.int32)
    mask = np.zeros((rows, length), np.int32)
    for r, q in enumerate(fields["index_N"]):
      ids = ids_of(tok, table[int(q)] if n == 1 else table[int(q)][r % n], r, fields)
      tokens[r, :len(ids)], mask[r, :len(ids)] = ids, 1
    out = (tokens, mask, mask.sum(-1).astype(np.int32))
    return out if verify is None else out + tuple(verify(tokens, mask, fields))
  return gen
