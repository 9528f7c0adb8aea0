"""TFDS build/read-back, RL/SFT/eval batches (shapes, left padding, determinism, resume), GSM8K under mock data."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from grpo_jax.tasks import base, cot, data, gsm8k, tfds_builders, tokenizer as tokenizer_lib, verify_py

P = 96


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load()


@pytest.fixture(scope="module")
def cfgs(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("tfds"))
  common = {"data_dir": d, "train_size": 120, "test_size": 30, "language": "mixed"}
  return {"arith": dict(common, name="arith", max_digits=2), "countdown": dict(common, name="countdown")}


def test_tfds_roundtrip_matches_generator(cfgs, tmp_path):
  task = data.make_task(cfgs["countdown"])
  train = data.load_examples(cfgs["countdown"], "train")
  assert [ex["index"] for ex in train] == list(range(120))
  assert train == task.examples(0, "train", 120, 30)
  # Built again into another dir: identical content (deterministic build).
  again = tfds_builders.load_split(task, "train", 0, 120, 30, str(tmp_path))
  assert again == train
  test = data.load_examples(cfgs["countdown"], "test")
  assert not {task.key(e) for e in test} & {task.key(e) for e in train}


def test_a_split_is_read_once_per_process(cfgs, monkeypatch, tmp_path):
  """A second load of the same split (same data dir, task knobs, seed and sizes) comes from memory, as the
  caller's own copy; another data dir is read (built) there."""
  first = data.load_examples(cfgs["arith"], "train")

  def no_read(*args, **kwargs):
    raise AssertionError("read again")

  monkeypatch.setattr(tfds, "data_source", no_read)
  again = data.load_examples(cfgs["arith"], "train")
  assert again == first and again is not first and again[0] is not first[0]
  again[0]["answer"] = -1
  assert data.load_examples(cfgs["arith"], "train")[0] == first[0]
  with pytest.raises(AssertionError, match="read again"):
    tfds_builders.load_split(data.make_task(cfgs["arith"]), "train", 0, 120, 30, str(tmp_path))


def test_a_damaged_generated_split_is_one_line_naming_what_to_delete(tmp_path):
  """A generated split cut or edited on disk was an array_record RuntimeError (or protobuf ParseError) traceback."""
  task = data.make_task(dict(name="arith", max_digits=2, language="mixed", train_size=20, test_size=10))
  tfds_builders.load_split(task, "test", 0, 20, 10, str(tmp_path))
  (rec,) = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs if "test.array_record" in f]
  os.truncate(rec, 2000)
  tfds_builders._READ.clear()  # pylint: disable=protected-access  (a fresh process reads the disk)
  with pytest.raises(ValueError) as e:
    tfds_builders.load_split(task, "test", 0, 20, 10, str(tmp_path))
  msg = str(e.value)
  assert "cannot be read" in msg and "delete that directory" in msg and "\n" not in msg, msg


_BUILD_ONE = """
import json, sys
from grpo_jax.tasks import data, tfds_builders
task = data.make_task(dict(name="arith", max_digits=2, language="mixed", train_size=3000, test_size=30))
exs = tfds_builders.load_split(task, "train", 0, 3000, 30, sys.argv[1])
print(json.dumps([len(exs), exs[0]["index"], exs[-1]["index"], exs[7]["answer"]]))
"""


def test_two_processes_building_one_dataset_both_get_it(tmp_path):
  """Two runs started together on an empty data dir (a parallel sweep): both get the whole split, generated once
  under tfds_builders' per-dataset lock (unlocked, the second's final rename failed with FileExistsError)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(sys.path))
  procs = [subprocess.Popen([sys.executable, "-c", _BUILD_ONE, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
  outs = [p.communicate(timeout=240) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  first, second = (o.strip().splitlines()[-1] for o, _ in outs)
  assert first == second and first.startswith("[3000, 0, 2999,")


@pytest.mark.parametrize("name", ["arith", "countdown"])
def test_rl_batch_shapes_padding_and_fields(cfgs, tok, name):
  cfg = cfgs[name]
  task = data.make_task(cfg)
  examples = data.load_examples(cfg, "train")
  b = next(data.rl_batches(cfg, tok, "train", 8, seed=3, start_step=0, prompt_len=P))
  assert b["prompt_NxP"].shape == (8, P) and b["prompt_NxP"].dtype == np.int32
  for r in range(8):
    m = b["prompt_mask_NxP"][r]
    k = int(m.sum())
    assert (m[:P - k] == 0).all() and (m[P - k:] == 1).all()  # left padded
    assert (b["prompt_NxP"][r, :P - k] == tok.pad_id).all() and b["prompt_NxP"][r, P - k] == tok.bos_id
    ex = examples[b["index_N"][r]]
    lang = base.LANGUAGES[b["language_N"][r]]
    assert tok.decode(b["prompt_NxP"][r, P - k + 1:]) == base.prompt(task, ex, lang)
    if name == "arith":
      assert b["answer_N"][r] == ex["answer"]
    else:
      assert list(b["numbers_NxM"][r]) == list(ex["numbers"]) and b["target_N"][r] == ex["target"]
      assert b["numbers_mask_NxM"][r].all()


def test_rl_determinism_resume_and_epochs(cfgs, tok):
  cfg = cfgs["arith"]
  it = data.rl_batches(cfg, tok, "train", 8, seed=5, start_step=0, prompt_len=P)
  first = [next(it) for _ in range(20)]
  again = data.rl_batches(cfg, tok, "train", 8, seed=5, start_step=0, prompt_len=P)
  resumed = data.rl_batches(cfg, tok, "train", 8, seed=5, start_step=13, prompt_len=P)
  a0 = next(again)
  for k in first[0]:
    np.testing.assert_array_equal(a0[k], first[0][k])
  for step in (13, 14):
    r = next(resumed)
    for k in r:
      np.testing.assert_array_equal(r[k], first[step][k])
  # 120 examples / 8 per batch = 15 steps per epoch: each example exactly once per epoch.
  seen = np.concatenate([b["index_N"] for b in first[:15]])
  assert sorted(seen) == list(range(120))
  other = next(data.rl_batches(cfg, tok, "train", 8, seed=6, start_step=0, prompt_len=P))
  assert not np.array_equal(other["index_N"], first[0]["index_N"])
  langs = np.concatenate([b["language_N"] for b in first])
  assert 0.3 < langs.mean() < 0.7  # 'mixed'


def test_train_indices_repeat_one_example(cfgs, tok):
  """task.train_indices: one index -> every prompt of every batch is that example (one-shot RLVR); two -> only
  those, each once per epoch; the test split is untouched; a bad index names the key."""
  cfg = dict(cfgs["arith"], language="a")
  full = data.rl_batches(cfg, tok, "train", 4, seed=5, start_step=0, prompt_len=P)
  want = data.load_examples(cfg, "train")[7]
  one = data.rl_batches(dict(cfg, train_indices=(7,)), tok, "train", 4, seed=5, start_step=0, prompt_len=P)
  for b in [next(one) for _ in range(3)]:
    assert (b["index_N"] == 7).all() and (b["answer_N"] == want["answer"]).all()
    assert (b["prompt_NxP"] == b["prompt_NxP"][:1]).all()
  assert len(set(next(full)["index_N"].tolist())) > 1
  two = data.rl_batches(dict(cfg, train_indices=(7, 11)), tok, "train", 2, seed=5, start_step=0, prompt_len=P)
  assert all(sorted(next(two)["index_N"].tolist()) == [7, 11] for _ in range(4))  # 2 examples, 2 per batch
  assert data.eval_set(dict(cfg, train_indices=(7,)), tok, 4, P)["index_N"].tolist() == [0, 1, 2, 3]
  with pytest.raises(ValueError, match="task.train_indices"):
    next(data.rl_batches(dict(cfg, train_indices=(120,)), tok, "train", 2, seed=5, start_step=0, prompt_len=P))


def test_prompt_too_long_names_the_key(cfgs, tok):
  with pytest.raises(ValueError, match="task.prompt_len"):
    next(data.rl_batches(cfgs["countdown"], tok, "train", 2, seed=0, start_step=0, prompt_len=10))
  with pytest.raises(ValueError, match="task.language"):
    next(data.rl_batches(dict(cfgs["arith"], language="c"), tok, "train", 2, seed=0, start_step=0, prompt_len=P))
  with pytest.raises(ValueError, match="task.name"):
    data.make_task({"name": "sudoku"})


def test_overlong_prompts_error_drop_or_truncate_counted(cfgs, tok):
  """task.overlong_prompts over the whole split: 'error' names the count and the length that fits; 'drop' leaves
  out exactly the prompts longer than prompt_len (never sampled); 'truncate' keeps every example, each prompt cut
  to bos + its last prompt_len - 1 tokens."""
  c = cfgs["countdown"]
  lengths = data.prompt_lengths(c, tok, "train")
  ex = data.load_examples(c, "train")
  assert len(lengths) == len(ex) == 120
  cut = int(np.median(lengths))
  over = int((lengths > cut).sum())
  assert 0 < over < 120 and data.overlong_count(c, tok, "train", cut) == (over, 120)
  with pytest.raises(ValueError, match=rf"task.prompt_len: {over} of the 120 train prompts are longer than "
                                       rf"task.prompt_len={cut} tokens \(longest {lengths.max()}"):
    data.fit_prompts(c, tok, "train", ex, cut)
  kept = data.fit_prompts(dict(c, overlong_prompts="drop"), tok, "train", ex, cut)
  assert [e["index"] for e in kept] == [e["index"] for e, n in zip(ex, lengths) if n <= cut]
  batches = data.rl_batches(dict(c, overlong_prompts="drop"), tok, "train", 8, seed=0, start_step=0, prompt_len=cut)
  seen = {int(i) for _ in range(30) for i in next(batches)["index_N"]}
  assert seen <= {e["index"] for e in kept} and len(seen) > 8
  assert data.fit_prompts(dict(c, overlong_prompts="truncate"), tok, "train", ex, cut) == ex
  b = data.rl_batch(data.make_task(c), ex, np.zeros(120, np.int32), tok, cut, truncate=True)
  task = data.make_task(c)
  for row, m, e in zip(b["prompt_NxP"], b["prompt_mask_NxP"], ex):
    ids = data.prompts.prompt_ids(task, e, "a", tok)
    want = ids if len(ids) <= cut else ids[:1] + ids[len(ids) - cut + 1:]
    assert row[m > 0].tolist() == want


def test_dropping_overlong_prompts_of_train_indices_after_the_split_was_measured(cfgs, tok):
  """preflight measures the whole train split first; the RL batches then fit task.train_indices' examples. The
  lengths were cached by position in the split, so the subset was judged by the lengths of the split's first
  examples: an overlong one was kept (the batch raised mid-run) and a fitting one dropped."""
  c = dict(cfgs["countdown"], overlong_prompts="drop")
  lengths = data.prompt_lengths(c, tok, "train")  # as preflight's fit_prompts of the whole split
  cut = int(np.median(lengths))
  longer, fit = np.flatnonzero(lengths > cut), np.flatnonzero(lengths <= cut)
  # Overlong ones first, where the split's first examples may fit, and fitting ones after.
  indices = tuple(int(i) for i in longer[-3:]) + tuple(int(i) for i in fit[-3:])
  assert sorted(data.prompt_lengths(c, tok, "train", [{"index": i} for i in indices])) == sorted(lengths[list(indices)])
  b = next(data.rl_batches(dict(c, train_indices=indices), tok, "train", 6, seed=0, start_step=0, prompt_len=cut))
  assert set(b["index_N"].tolist()) == {int(i) for i in fit[-3:]}


def test_dropping_every_prompt_is_one_line(cfgs, tok):
  """overlong_prompts=drop with a prompt_len no prompt fits: batches had no examples to draw from (numpy's divide
  by zero, then an IndexError); now one line naming the shortest prompt."""
  c = dict(cfgs["countdown"], overlong_prompts="drop")
  shortest = int(data.prompt_lengths(c, tok, "train").min())
  with pytest.raises(ValueError, match=rf"task.overlong_prompts=drop: all 120 train prompts are longer than "
                                       rf"task.prompt_len={shortest - 1} tokens \(shortest {shortest}\)"):
    next(data.rl_batches(c, tok, "train", 4, seed=0, start_step=0, prompt_len=shortest - 1))
  assert len(data.fit_prompts(c, tok, "train", data.load_examples(c, "train"), shortest)) >= 1


def test_sample_references_follow_the_split_sizes(cfgs, tok):
  """samples.jsonl's reference answers come from the examples of the config asked about: a generated train example
  avoids the test split's keys, so under another test_size the same index is another example. The lookup was
  cached without the sizes, so the second config of one process (a sweep over test_size) got the first's."""
  a = dict(cfgs["arith"], max_digits=1, train_size=40, test_size=5)
  b = dict(a, test_size=60)
  ea, eb = data.load_examples(a, "train"), data.load_examples(b, "train")
  i = next(i for i in range(40) if data.make_task(a).answer_text(ea[i]) != data.make_task(b).answer_text(eb[i]))
  for c, exs in ((a, ea), (b, eb)):
    got = data.sample_context(c, tok, "train", {"samples/index_N": np.asarray([i])})["references"]
    assert got == [data.make_task(c).answer_text(exs[i])]


def test_preflight_says_how_many_prompts_are_skipped_or_cut(cfgs, tok, caplog):
  """task.overlong_prompts=drop logged how many prompts it skips; =truncate cut prompts without a word."""
  import logging
  from grpo_jax.config import config_lib
  from grpo_jax.run import preflight
  c = config_lib.override(config_lib.load_config("configs/grpo_arith.py", "small"), {
      "task.name": "countdown", "task.data_dir": cfgs["countdown"]["data_dir"], "task.train_size": 120,
      "task.test_size": 30, "eval.size": 4})
  lengths = data.prompt_lengths(c.task, tok, "train")
  cut = int(np.median(lengths))
  over = int((lengths > cut).sum())
  for policy, verb in (("drop", "are skipped"), ("truncate", f"are cut to bos + their last {cut - 1} tokens")):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      preflight.check_data(config_lib.override(c, {"task.prompt_len": cut, "task.overlong_prompts": policy}), tok)
    assert (f"task.overlong_prompts={policy}: {over} of the 120 train prompts are longer than task.prompt_len={cut} "
            f"tokens and {verb}.") in caplog.text, caplog.text


def test_eval_set_fixed_held_out(cfgs, tok):
  e1 = data.eval_set(cfgs["countdown"], tok, 10, P)
  e2 = data.eval_set(cfgs["countdown"], tok, 10, P)
  for k in e1:
    np.testing.assert_array_equal(e1[k], e2[k])
  np.testing.assert_array_equal(e1["index_N"], np.arange(10))
  np.testing.assert_array_equal(e1["language_N"], np.arange(10) % 2)
  test = data.load_examples(cfgs["countdown"], "test")
  np.testing.assert_array_equal(e1["target_N"], [ex["target"] for ex in test[:10]])


def test_sft_completion_batches(cfgs, tok):
  cfg = cfgs["countdown"]
  examples = data.load_examples(cfg, "train")
  T = 224
  b = next(data.sft_batches(cfg, tok, "train", 6, seed=1, start_step=0, seq_len=T, mistake_rate=0.5))
  assert b["tokens_NxT"].shape == (6, T)
  for r in range(6):
    m, lm, t = b["mask_NxT"][r], b["loss_mask_NxT"][r], b["tokens_NxT"][r]
    n = int(m.sum())
    assert (m[:n] == 1).all() and (m[n:] == 0).all() and (t[n:] == tok.pad_id).all()  # right padded
    np.testing.assert_array_equal(b["positions_NxT"][r, :n], np.arange(n))
    comp = t[lm == 1]
    assert comp[-1] == tok.eos_id and t[n - 1] == tok.eos_id
    assert lm[:n][-len(comp):].all() and not lm[:n - len(comp)].any()  # loss only on the completion
    ex = examples[b["index_N"][r]]
    text = tok.decode(comp[:-1])
    lang = base.LANGUAGES[b["language_N"][r]]
    assert text in (cot.solution(ex, lang), cot.solution(ex, lang, mistake=True))
    assert verify_py.format_ok(list(comp), tok=tok)
    body = verify_py.span_text(list(comp), verify_py.parse(list(comp), tok=tok)[1], tok)
    assert verify_py.accuracy_countdown(body, ex["numbers"], ex["target"]) == 1.0
  resumed = next(data.sft_batches(cfg, tok, "train", 6, seed=1, start_step=0, seq_len=T, mistake_rate=0.5))
  np.testing.assert_array_equal(resumed["tokens_NxT"], b["tokens_NxT"])
  with pytest.raises(ValueError, match="seq_len"):
    next(data.sft_batches(cfg, tok, "train", 2, seed=1, start_step=0, seq_len=20))



def test_sft_drawn_is_what_the_sft_batches_draw(cfgs, tok):
  """preflight checks model.max_len against the examples the SFT stage draws (data.sft_drawn), not the whole split
  (tokenizing 20,000 examples was ~2 s of every run start): it must be exactly the examples sft_batches yields."""
  cfg = cfgs["countdown"]
  examples = data.load_examples(cfg, "train")
  for steps, batch in ((3, 5), (2, len(examples))):  # part of an epoch; past one (every example)
    it = data.sft_batches(cfg, tok, "train", batch, seed=3, start_step=0, seq_len=224)
    seen = {int(i) for _ in range(steps) for i in next(it)["index_N"]}
    drawn = data.sft_drawn(len(examples), 3, steps, batch)
    assert seen == {examples[i]["index"] for i in drawn} and len(drawn) == len(set(drawn.tolist()))
    lengths = data.sft_lengths(cfg, tok, "train", indices=drawn)
    np.testing.assert_array_equal(lengths, data.sft_lengths(cfg, tok, "train")[drawn])

def test_sft_all_tokens_for_pretraining(cfgs, tok):
  b = next(data.sft_batches(cfgs["arith"], tok, "train", 4, seed=0, start_step=2, seq_len=160, mode="all"))
  for r in range(4):
    n = int(b["mask_NxT"][r].sum())
    np.testing.assert_array_equal(b["loss_mask_NxT"][r, :n], np.r_[0, np.ones(n - 1)])  # all but bos
    assert b["tokens_NxT"][r, 0] == tok.bos_id and b["tokens_NxT"][r, n - 1] == tok.eos_id
    text = tok.decode(b["tokens_NxT"][r, 1:n - 1])
    assert "<think>" not in text and text.endswith(" " + str(data.load_examples(cfgs["arith"], "train")[
        b["index_N"][r]]["answer"]))


def _gsm8k_records(n):
  return [{"question": f"Tom has {i} apples and buys 1,000 more. How many?".encode(),
           "answer": f"He has {i} + 1000 = <<{i}+1000={i + 1000}>>{i + 1000} apples.\n#### {i + 1000:,}".encode()}
          for i in range(n)]


def test_an_empty_split_is_one_line(tok):
  """A prepared TFDS gsm8k split with no records loaded as [] (the JSONL and parquet readers refuse theirs), and the
  first batch divided by zero examples: numpy warnings, then an IndexError."""
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kwargs: []):
    with pytest.raises(ValueError, match=r"^task.data_dir: the gsm8k train split in the default data dir has no "
                                         r"examples;"):
      next(data.rl_batches({"name": "gsm8k", "language": "a"}, tok, "train", 2, seed=0, start_step=0, prompt_len=256))


def test_gsm8k_mock_flows_through(tok):
  def fake_source(self, split, **kwargs):
    del self, kwargs
    return _gsm8k_records(12 if split == "train" else 4)

  with tfds.testing.mock_data(as_data_source_fn=fake_source):
    exs = gsm8k.load_split("train")
    assert exs[3]["final"] == "1003" and exs[3]["question"].startswith("Tom has 3")
    b = next(data.rl_batches({"name": "gsm8k", "language": "a"}, tok, "train", 4, seed=0, start_step=0,
                             prompt_len=256))
  assert b["prompt_NxP"].shape == (4, 256)
  for r in range(4):
    i = b["index_N"][r]
    assert gsm8k.decode_answer(b["answer_chars_NxA"][r]) == str(1000 + i)
    assert f"Tom has {i} apples" in tok.decode(b["prompt_NxP"][r])
  finals = [gsm8k.decode_answer(a) for a in b["answer_chars_NxA"]]
  comps = [f"<think> x </think> <answer> {int(finals[0]):,} </answer>",
           f"<think> x </think> <answer> ${finals[1]} </answer>",
           f"<think> x </think> <answer> {finals[2]}1 </answer>",
           f"<think> x </think> {finals[3]}"]
  tokens = np.zeros((4, 40), np.int32)
  mask = np.zeros_like(tokens)
  for r, c in enumerate(comps):
    ids = tok.encode(c) + [tok.eos_id]
    tokens[r, :len(ids)], mask[r, :len(ids)] = ids, 1
  acc, fmt, _ = gsm8k.host_verifier(tok)(tokens, mask, b)
  np.testing.assert_array_equal(acc, [1, 1, 0, 1])  # the last row is untagged: its last number is the answer
  np.testing.assert_array_equal(fmt, [1, 1, 1, 0])
  # The reward_spec.PyRewardFn form: ids without the trailing EOS, plus decoded text.
  ids = [list(t[m > 0][:-1]) for t, m in zip(tokens, mask)]
  assert gsm8k.make_rewards(tok)["math_accuracy"]([tok.decode(i) for i in ids], ids, b) == [1.0, 1.0, 0.0, 1.0]
  with pytest.raises(ValueError, match="####"):
    gsm8k.final_answer("no marker")


class _Repeat:
  """A tokenizer writing every piece `k` times: its prompts are k times as long as `tok`'s."""

  def __init__(self, tok, k):
    self.tok, self.k = tok, k

  def __getattr__(self, name):
    return getattr(self.tok, name)

  def encode(self, text):
    return [i for i in self.tok.encode(text) for _ in range(self.k)]


def test_length_caches_never_hand_one_tokenizer_another_ones_lengths(cfgs, tok, monkeypatch):
  """The prompt and SFT length caches were keyed by id(tok): a tokenizer made after another was collected (the
  tokenizer loaders' lru eviction) can get its id and read the other vocabulary's lengths. `id` is pinned here so
  the reuse is certain; both caches must measure the second tokenizer afresh."""
  monkeypatch.setattr(data, "id", lambda _: 7, raising=False)
  c = cfgs["arith"]
  first = _Repeat(tok, 1)
  once = data.prompt_lengths(c, first, "train")
  sft_once = data.sft_lengths(c, first, "train")
  del first
  twice = data.prompt_lengths(c, _Repeat(tok, 2), "train")
  sft_twice = data.sft_lengths(c, _Repeat(tok, 2), "train")
  # bos once, the question's pieces doubled
  np.testing.assert_array_equal(twice, 2 * once - 1)
  assert (sft_twice > sft_once).all()
  np.testing.assert_array_equal(data.prompt_lengths(c, tok, "train"), once)  # the real one keeps its own entry


def test_numpy_ints_draw_the_python_ints_order(cfgs, tok):
  """A seed or step given as a numpy integer (a value read from an array, a checkpoint's metadata) drew another
  example order and language draw: base.rng_for hashed repr(parts), and numpy 2 writes np.int64(5) as
  'np.int64(5)'. Now the same batches as the Python ints."""
  want = next(data.rl_batches(cfgs["arith"], tok, "train", 8, seed=5, start_step=3, prompt_len=P))
  got = next(data.rl_batches(cfgs["arith"], tok, "train", 8, seed=np.int64(5), start_step=np.int64(3), prompt_len=P))
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  assert base.rng_for("order", np.int32(5), 0).integers(1 << 30) == base.rng_for("order", 5, 0).integers(1 << 30)


def test_a_data_dir_built_by_other_generator_code_is_not_read_as_this_one(tmp_path, monkeypatch):
  """The dataset's name held the task's knobs, seed and sizes only: after a change to a generator, a data dir built
  before it was read back as the same dataset (and a host with a fresh dir drew other examples than one with an old
  dir). The name now holds a digest of the generating code: arith with its operands swapped builds its own copy."""
  import importlib.util
  import inspect
  from grpo_jax.tasks import arith
  task = data.make_task(dict(name="arith", max_digits=2))
  old = tfds_builders.load_split(task, "test", 0, 20, 10, str(tmp_path))
  src = inspect.getsource(arith)
  changed = src.replace('return {"a": a, "b": b, "op": op, "answer": evaluate(a, op, b)}',
                        'return {"a": b, "b": a, "op": op, "answer": evaluate(b, op, a)}')
  assert changed != src
  (tmp_path / "arith_swapped.py").write_text(changed)
  spec = importlib.util.spec_from_file_location("arith_swapped", tmp_path / "arith_swapped.py")
  module = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, "arith_swapped", module)
  spec.loader.exec_module(module)
  swapped = module.Arith(max_digits=2)
  assert (swapped.name, swapped.knobs()) == (task.name, task.knobs())
  new = tfds_builders.load_split(swapped, "test", 0, 20, 10, str(tmp_path))
  assert new == swapped.examples(0, "test", 10, 10)
  assert [(e["a"], e["b"]) for e in new] == [(e["b"], e["a"]) for e in old] != [(e["a"], e["b"]) for e in old]
  assert tfds_builders.load_split(task, "test", 0, 20, 10, str(tmp_path)) == old  # each reads its own copy
