"""Format / accuracy / step verifiers: hand-computed cases, and JAX == Python on >= 1,000 adversarial outputs."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.tasks import base, cot, registry, tokenizer as tokenizer_lib, verify_jax, verify_py

import adversarial  # tests/adversarial.py

L = 192
# Every call is padded to 1,024 rows, so each task's program compiles once. The programs compile with XLA's backend
# optimisations, which the suite's flags switch off (conftest.py): integer parsing over token tables, whose results
# do not depend on them, and which ran ~30x slower without them (the countdown verifier on 1,024 rows: 6.0 CPU-s a
# call unoptimised, 0.19 s optimised, for ~1.1 CPU-s more compile; 2026-12-07).
N = 1024
OPTIMISED = {"xla_backend_optimization_level": 3}
M = 6  # countdown numbers padded to 6 columns (numbers_mask marks the real ones)
MAX_STEPS = 12


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load()


@pytest.fixture(scope="module")
def fns(tok):
  """Compiled once per module: one program per task (format, answer value, accuracy, and steps for arith)."""
  tables = verify_jax.token_tables(tok)

  def arith(tokens, mask, batch):
    return (verify_jax.format_reward(tokens, mask, tables), verify_jax.answer_value("arith", tokens, mask, batch, tables),
            registry.accuracy_reward("arith", tokens, mask, batch, tables),
            verify_jax.step_rewards("arith", tokens, mask, batch, MAX_STEPS, tables))

  def countdown(tokens, mask, batch):
    return (verify_jax.format_reward(tokens, mask, tables),
            verify_jax.answer_value("countdown", tokens, mask, batch, tables),
            registry.accuracy_reward("countdown", tokens, mask, batch, tables))

  jitted = {"arith": jax.jit(arith, compiler_options=OPTIMISED),
            "countdown": jax.jit(countdown, compiler_options=OPTIMISED)}

  def call(name, tokens, mask, batch):
    n = len(tokens)
    assert n <= N and tokens.shape[1] == L
    pad = lambda x: np.concatenate([np.asarray(x), np.zeros((N - n,) + np.shape(x)[1:], np.asarray(x).dtype)])
    out = jitted[name](pad(tokens), pad(mask), {k: pad(v) for k, v in batch.items()})
    return jax.tree.map(lambda x: np.asarray(x)[:n], out)

  return call


def _pack(tok, completions, length=L):
  """Rows of ids (already ending in EOS where intended) -> tokens/mask (mask up to and incl. first EOS)."""
  tokens = np.zeros((len(completions), length), np.int32)
  mask = np.zeros_like(tokens)
  for r, ids in enumerate(completions):
    ids = list(ids)[:length]
    tokens[r, :len(ids)] = ids
    stop = ids.index(tok.eos_id) + 1 if tok.eos_id in ids else len(ids)
    mask[r, :stop] = 1
  return tokens, mask


def _text_rows(tok, texts):
  return _pack(tok, [tok.encode(t) + [tok.eos_id] for t in texts])


def _pad_numbers(batch, m=M):
  n, k = batch["numbers_NxM"].shape
  out = dict(batch)
  out["numbers_NxM"] = np.zeros((n, m), np.int32)
  out["numbers_NxM"][:, :k] = batch["numbers_NxM"]
  out["numbers_mask_NxM"] = np.zeros((n, m), bool)
  out["numbers_mask_NxM"][:, :k] = batch["numbers_mask_NxM"]
  return out


def _cat(*batches):
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


FORMAT_CASES = [  # (text, format ok) -- EOS appended
    ("<think> x </think> <answer> 5 </answer>", 1),
    ("<think></think><answer></answer>", 1),  # empty bodies are well-formed
    ("<think> x </think>   <answer> 5 </answer>", 1),  # whitespace between is allowed
    ("<think> x </think> so <answer> 5 </answer>", 0),  # text between is not
    ("<think> x </think> <answer> 5 </answer> ok", 0),  # nothing but EOS after </answer>
    ("<think> x </think> <answer> 5 </answer> ", 0),
    (" <think> x </think> <answer> 5 </answer>", 0),  # must start with <think>
    ("<think> x <think> y </think> <answer> 5 </answer>", 0),  # repeated / nested
    ("<think> x </think> <answer> 5 <answer> </answer>", 0),
    ("<think> x <answer> 5 </answer> </think>", 0),  # out of order
    ("<think> x </think> <answer> 5", 0),  # unclosed
    ("<answer> 5 </answer>", 0),  # missing think
]


def test_format_hand_cases(tok, fns):
  texts = [t for t, _ in FORMAT_CASES]
  tokens, mask = _text_rows(tok, texts)
  want = np.asarray([ok for _, ok in FORMAT_CASES], np.float32)
  got = np.asarray(fns("arith", tokens, mask, {"answer_N": np.zeros(len(texts), np.int32)})[0])
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(verify_py.format_reward(tokens, mask, tok), want)


def test_format_token_level_details(tok, fns):
  T, ET, A, EA = (tok.tag_ids[t] for t in tokenizer_lib.TAGS)
  good = [T] + tok.encode(" x ") + [ET, A] + tok.encode("5") + [EA]
  spelled = [i for ch in "<think>" for i in tok.encode(ch)]
  assert tok.decode(spelled) == "<think>" and T not in spelled
  rows = [good + [tok.eos_id],
          spelled + good[1:] + [tok.eos_id],  # '<think>' spelled from pieces is not the tag
          good,  # no EOS: truncated
          good[:3] + [tok.bos_id] + good[3:] + [tok.eos_id],  # control token inside a body
          good + [tok.eos_id, 9, 9, 9]]  # junk after EOS is outside the mask
  tokens, mask = _pack(tok, rows)
  want = np.asarray([1, 0, 0, 0, 1], np.float32)
  got = fns("arith", tokens, mask, {"answer_N": np.full(5, 5, np.int32)})
  np.testing.assert_array_equal(np.asarray(got[0]), want)
  np.testing.assert_array_equal(np.asarray(got[2]), want)  # answer 5 is right wherever the format is OK
  np.testing.assert_array_equal(verify_py.format_reward(tokens, mask, tok), want)
  # the mask is a prefix mask: a hole ends the completion (before the EOS here, so no EOS -> 0)
  mask[0, 2] = 0
  assert float(fns("arith", tokens, mask, {"answer_N": np.full(5, 5, np.int32)})[0][0]) == 0.0
  assert verify_py.format_reward(tokens[:1], mask[:1], tok)[0] == 0.0


ARITH_CASES = [  # (answer body, target, right)
    (" -25 ", -25, 1), ("-25", -25, 1), ("- 25", -25, 0), ("25", -25, 0), ("+25", 25, 0),
    ("000000025", 25, 1),  # 9 digits: fine
    ("0000000025", 25, 0),  # 10 digits: overflow scores 0
    ("999999999", 999999999, 1), ("1000000000", 1000000000 % 2**31, 0),
    ("1,000", 1000, 0), ("", 0, 0), ("  ", 0, 0), ("7 7", 77, 0), ("-0", 0, 1), ("12.", 12, 0),
]


def test_arith_accuracy_hand_cases(tok, fns):
  texts = [f"<think> x </think> <answer>{a}</answer>" for a, _, _ in ARITH_CASES]
  tokens, mask = _text_rows(tok, texts)
  batch = {"answer_N": np.asarray([t for _, t, _ in ARITH_CASES], np.int32)}
  want = np.asarray([r for _, _, r in ARITH_CASES], np.float32)
  np.testing.assert_array_equal(np.asarray(fns("arith", tokens, mask, batch)[2]), want)
  np.testing.assert_array_equal(verify_py.accuracy_reward("arith", tokens, mask, batch, tok), want)


CD_NUMBERS = [2, 3, 4, 6]
CD_CASES = [  # (answer body, target, right)
    ("2 * 3 + 4", 10, 1), ("4 + 6", 10, 1), ("(6 - 2) * (4 - 3)", 4, 1), ("6 / 3 * 4", 8, 1),
    ("6 / 4 * 2", 3, 0),  # 6 / 4 is not exact
    ("2 * 2 + 6", 10, 0),  # 2 used twice
    ("3 * 4 - 6 / 2", 9, 1), ("3 * (4 - 6 / 2)", 3, 1), ("6 - 4 - 2", 0, 1), ("6 - (4 - 2)", 4, 1),
    ("-2 + 6", 4, 0),  # no unary minus
    ("2 3", 23, 0), ("23", 23, 0), ("(4 + 6", 10, 0), ("4 + 6)", 10, 0), ("()", 0, 0), ("4 +", 4, 0), ("", 0, 0),
    ("4 + 6 = 10", 10, 0), ("((((((((4 + 6))))))))", 10, 1),  # depth 8 is allowed
    ("(((((((((4 + 6)))))))))", 10, 0),  # depth 9 is not
    ("0004 + 6", 10, 1), ("0000000004 + 6", 10, 0),  # a 10-digit literal overflows
    ("6 * 4 / (3 - 3)", 0, 0),
]


def test_countdown_accuracy_hand_cases(tok, fns):
  texts = [f"<think> x </think> <answer> {a} </answer>" for a, _, _ in CD_CASES]
  tokens, mask = _text_rows(tok, texts)
  n = len(CD_CASES)
  numbers = np.zeros((n, M), np.int32)
  numbers[:, :4] = CD_NUMBERS
  numbers[-1, :5] = [2, 3, 4, 6, 3]  # the row that divides by (3 - 3) has two 3s
  nmask = numbers > 0
  batch = {"numbers_NxM": numbers, "numbers_mask_NxM": nmask, "target_N": np.asarray([t for _, t, _ in CD_CASES])}
  want = np.asarray([r for _, _, r in CD_CASES], np.float32)
  np.testing.assert_array_equal(np.asarray(fns("countdown", tokens, mask, batch)[2]), want)
  np.testing.assert_array_equal(verify_py.accuracy_reward("countdown", tokens, mask, batch, tok), want)


def test_countdown_intermediate_overflow(tok, fns):
  texts = ["<think></think><answer>50000 * 50000 / 50000</answer>", "<think></think><answer>30000 * 30000</answer>"]
  tokens, mask = _text_rows(tok, texts)
  batch = {"numbers_NxM": np.asarray([[50000, 50000, 50000, 0, 0, 0], [30000, 30000, 0, 0, 0, 0]], np.int32),
           "target_N": np.asarray([50000, 900000000])}
  batch["numbers_mask_NxM"] = batch["numbers_NxM"] > 0
  want = np.asarray([0, 1], np.float32)  # 2.5e9 overflows mid-way; 9e8 < 1e9 is fine
  np.testing.assert_array_equal(np.asarray(fns("countdown", tokens, mask, batch)[2]), want)
  np.testing.assert_array_equal(verify_py.accuracy_reward("countdown", tokens, mask, batch, tok), want)


def test_step_rewards_hand_case(tok, fns):
  think = " add 8 + 5 = 13 ; x 2 * 3 = 7 ; y ; 10 / 4 = 2 ; 9 - 12 = -3 ; tail "
  ids = [tok.tag_ids["<think>"]] + tok.encode(think) + [tok.tag_ids["</think>"], tok.tag_ids["<answer>"]]
  ids += tok.encode("1") + [tok.tag_ids["</answer>"], tok.eos_id]
  tokens, mask = _pack(tok, [ids, ids[:-1]])  # second row: no EOS -> no valid steps
  scores, ends, valid = (np.asarray(x) for x in fns("arith", tokens, mask, {"answer_N": np.ones(2, np.int32)})[3])
  semis = [k for k, i in enumerate(ids) if ";" in tok.decode([i])]
  assert len(semis) == 5
  np.testing.assert_array_equal(scores[0, :6], [1, 0, 0, 0, 1, 0])
  np.testing.assert_array_equal(ends[0, :5], semis)
  np.testing.assert_array_equal(valid[0], np.arange(MAX_STEPS) < 5)
  assert not valid[1].any() and not scores[1].any()
  py = verify_py.step_rewards("arith", tokens, mask, None, MAX_STEPS, tok)
  for a, b in zip((scores, ends, valid), py):
    np.testing.assert_array_equal(a, b)


def test_agreement_on_adversarial_outputs(tok, fns):
  """>= 1,000 outputs per task in ONE batched call each: JAX and Python verifiers agree on every row."""
  per_category = 60
  for name in ("arith", "countdown"):
    task = registry.get_task(name)
    tokens, mask, batch, cats = adversarial.make(task, tok, per_category, seed=0, length=L)
    if name == "countdown":
      batch = _pad_numbers(batch)
    assert len(cats) >= 1000 and collections.Counter(cats) == {c: per_category for c in adversarial.CATEGORIES}
    out = fns(name, tokens, mask, batch)
    fmt, (ok, val), acc = np.asarray(out[0]), (np.asarray(out[1][0]), np.asarray(out[1][1])), np.asarray(out[2])
    np.testing.assert_array_equal(fmt, verify_py.format_reward(tokens, mask, tok))
    py_ok, py_val = verify_py.answer_value(name, tokens, mask, batch, tok)
    np.testing.assert_array_equal(ok, py_ok)
    np.testing.assert_array_equal(val, py_val)
    np.testing.assert_array_equal(acc, verify_py.accuracy_reward(name, tokens, mask, batch, tok))
    if name == "arith":
      for a, b in zip(out[3], verify_py.step_rewards(name, tokens, mask, batch, MAX_STEPS, tok)):
        np.testing.assert_array_equal(np.asarray(a), b)
      assert np.asarray(out[3][2]).sum() > 500  # many valid steps were compared
    # The categories mean what they say (so agreement is not vacuous).
    cats = np.asarray(cats)
    assert acc[cats == "right"].all() and fmt[cats == "space_between"].all()
    for c in ("missing_tag", "nested_tag", "unclosed_tag", "repeated_tag", "spelled_tag", "text_around",
              "truncated", "control_token"):
      assert not fmt[cats == c].any(), c
    assert fmt[cats == "empty_answer"].all() and not acc[cats == "empty_answer"].any()
    assert not acc[cats == "overflow"].all()
    assert 0 < fmt[cats == "random_tokens"].mean() < 1
    assert ok[cats == "wrong"].sum() > 10  # valid-but-wrong answers are compared by value


def test_reference_solutions_solvable_by_both_verifiers(tok, fns):
  rows, batches = [], []
  for knobs in ({}, {"num_numbers": 6, "max_number": 100, "max_target": 1000}):
    task = registry.get_task("countdown", **knobs)
    exs = [task.generate(base.rng_for("solvable", i, str(knobs))) for i in range(100)]
    rows += [tok.encode(cot.solution(ex, "ab"[i % 2])) + [tok.eos_id] for i, ex in enumerate(exs)]
    batches.append(_pad_numbers(task.batch_fields(exs)))
  tokens, mask = _pack(tok, rows)
  batch = _cat(*batches)
  np.testing.assert_array_equal(np.asarray(fns("countdown", tokens, mask, batch)[2]), np.ones(len(rows)))
  np.testing.assert_array_equal(verify_py.accuracy_reward("countdown", tokens, mask, batch, tok), np.ones(len(rows)))


def test_hf_tokenizer_with_tag_tokens_no_unk_and_two_eos_ids(tmp_path):
  """An HF tokenizer with the four tags as tokens (added last) and no unk token: unk_id -1 indexed the token
  tables' last row, so verify_jax took '</answer>' for a control token and failed every well-formed completion
  that verify_py passed. And a row that stopped at the tokenizer's other eos id (generation_config.json's
  [<|im_end|>, <|endoftext|>]: the sampler stops at either) failed both as truncated."""
  tokenizers = pytest.importorskip("tokenizers")
  from grpo_jax.tasks import hf_tokenizer
  from tests import hf_dirs
  tk = hf_dirs.train_tokenizer(hf_dirs.QWEN_SPECIALS)
  tk.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in tokenizer_lib.TAGS])
  eot, im_end = tk.token_to_id("<|endoftext|>"), tk.token_to_id("<|im_end|>")
  d = str(tmp_path / "tok")
  hf_dirs.write_tokenizer(d, tk, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
                          generation={"eos_token_id": [im_end, eot]})
  hf = hf_tokenizer.HFTokenizer(d)
  assert hf.unk_id == -1 and hf.tag_ids["</answer>"] == hf.vocab_size - 1 and hf.eos_ids == (im_end, eot)
  good = hf.encode("<think> 2 + 3 = 5 </think> <answer> 5 </answer>")
  rows = [good + [im_end], good + [eot], good, hf.encode("<think> x </think> <answer> 4 </answer>") + [eot]]
  tokens, mask = np.zeros((4, 40), np.int32), np.zeros((4, 40), np.int32)
  for r, ids in enumerate(rows):
    tokens[r, :len(ids)], mask[r, :len(ids)] = ids, 1
  batch = {"answer_N": np.full(4, 5, np.int32)}
  tables = verify_jax.tables_for(hf)
  want_fmt, want_acc = [1, 1, 0, 1], [1, 1, 0, 0]
  # one jitted program (run eagerly, the parsers' ops compiled one by one)
  fmt, acc = jax.jit(lambda t, m, b: (verify_jax.format_reward(t, m, tables),
                                      registry.accuracy_reward("arith", t, m, b, tables)))(tokens, mask, batch)
  np.testing.assert_array_equal(verify_py.format_reward(tokens, mask, hf), want_fmt)
  np.testing.assert_array_equal(np.asarray(fmt), want_fmt)
  np.testing.assert_array_equal(verify_py.accuracy_reward("arith", tokens, mask, batch, hf), want_acc)
  np.testing.assert_array_equal(np.asarray(acc), want_acc)


def test_vmap_over_leading_axis(tok):
  tables = verify_jax.token_tables(tok)
  tokens, mask = _text_rows(tok, [t for t, _ in FORMAT_CASES])
  f = lambda t, m: verify_jax.format_reward(t, m, tables)
  stacked = jax.jit(jax.vmap(f))(jnp.stack([tokens, tokens[::-1]]), jnp.stack([mask, mask[::-1]]))  # 0.8 -> 0.2 CPU-s
  want = np.asarray([ok for _, ok in FORMAT_CASES], np.float32)
  np.testing.assert_array_equal(np.asarray(stacked), np.stack([want, want[::-1]]))


def test_tables_argument_forms(tok):
  tokens, mask = _text_rows(tok, ["<think> x </think> <answer> 5 </answer>"])
  # tag_ids dict of the shipped tokenizer (jitted: one program instead of the parser's ops one by one)
  assert float(jax.jit(lambda t, m: verify_jax.format_reward(t, m, tok.tag_ids))(tokens, mask)[0]) == 1.0
  with pytest.raises(ValueError, match="tables="):
    verify_jax.format_reward(tokens, mask, {"<think>": 99})


def test_bad_task_name(tok):
  with pytest.raises(ValueError, match="task="):
    registry.accuracy_reward("sudoku", np.zeros((1, 4), np.int32), np.ones((1, 4), np.int32), {})
  with pytest.raises(ValueError, match="task="):
    verify_py.accuracy_reward("sudoku", np.asarray([[4, 5, 6, 7, 2]]), np.ones((1, 5)), {}, tok)


class _Shouting:
  """The shipped tokenizer with every piece decoding to upper case: same ids, other piece texts."""

  def __init__(self, tok):
    self.tok = tok

  def __getattr__(self, name):
    return getattr(self.tok, name)

  def piece_texts(self):
    return [t.upper() for t in self.tok.piece_texts()]


def test_the_vocabulary_cache_never_hands_one_tokenizer_another_ones_pieces(tok, monkeypatch):
  """verify_py cached each tokenizer's piece texts by id(tok): a tokenizer made after another was collected can get
  its id and decode with the other's texts. `id` is pinned so the reuse is certain."""
  monkeypatch.setattr(verify_py, "id", lambda _: 7, raising=False)
  ids = tok.encode("<think> ok </think> <answer> abc </answer>") + [tok.eos_id]
  first = _Shouting(tok)
  assert verify_py.span_text(ids, verify_py.parse(ids, tok=first)[1], first).strip() == "ABC"
  del first
  assert verify_py.span_text(ids, verify_py.parse(ids, tok=tok)[1], tok).strip() == "abc"


def test_cons_at_k_votes_on_verified_values(tok, fns):
  """cons@k of an in-graph task votes on the verifier's value: right answers written differently vote together, a
  row the verifier rejects casts no vote (the <answer> span's token ids split them: this group voted the wrong
  '9 + 5', written twice, over three different right expressions)."""
  from grpo_jax.run import evaluation
  right = ["3 + 4", "4 + 3", "(9 - 5) + 3"]
  texts = [f"<think> x </think> <answer> {a} </answer>" for a in right + ["9 + 5", "9 + 5"]]
  tokens, mask = _text_rows(tok, texts + ["<think> x </think> <answer> 9 + 5 </answer> ok"])  # malformed: no vote
  n = len(texts) + 1
  batch = _pad_numbers({"numbers_NxM": np.tile([[3, 4, 5, 9]], (n, 1)).astype(np.int32),
                        "numbers_mask_NxM": np.ones((n, 4), bool), "target_N": np.full(n, 7, np.int32)})
  _, (ok, val), acc = fns("countdown", tokens, mask, batch)
  answers = evaluation.verified_answers("countdown", tokens, mask, batch, tok)
  assert answers == [7, 7, 7, 14, 14, None]
  assert answers == [int(v) if o else None for o, v in zip(ok, val)]  # the in-graph verifier's values
  assert evaluation.group_metrics(acc, answers, n, (1,))["cons@6"] == 1.0
  # arith: '012' and '12' are one answer (two votes for 12 against two for 13: the tie goes to the earliest)
  tokens, mask = _text_rows(tok, [f"<think> x </think> <answer> {a} </answer>" for a in ("13", "012", "12", "13")])
  batch = {"answer_N": np.full(4, 12, np.int32)}
  acc = fns("arith", tokens, mask, batch)[2]
  answers = evaluation.verified_answers("arith", tokens, mask, batch, tok)
  assert answers == [13, 12, 12, 13]
  assert evaluation.group_metrics(acc, answers, 4, (1,))["cons@4"] == 0.0  # 13 comes first
  answers = evaluation.verified_answers("arith", tokens[[1, 0, 2, 3]], mask[[1, 0, 2, 3]], batch, tok)
  assert evaluation.group_metrics(acc[[1, 0, 2, 3]], answers, 4, (1,))["cons@4"] == 1.0
