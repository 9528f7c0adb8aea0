"""Digit-token addition, "what is a + b =": the benchmark workload and the ablations' toy task, on token ids.

Each digit and each prompt word is one token id, so neither workload needs a trained tokenizer: a random model can
be benchmarked, and a tiny one learns the toy in minutes. Its batches are built here, not by the text pipeline
(data.py).

- Benchmark (`make_batches`, `reward_spec`, `bench_config`): the workload of the peers' GRPO benchmark (TRL's GRPO
  trainer on the same flags): a, b in [0, 1000), reward 1 if the answer's digits appear anywhere in the completion
  (TRL's `ans in completion`), computed in-graph; β=0.04, μ=1, lr 1e-5, temperature 1. Used by
  benchmarks/grpo_step.py, the TPU compile check (aot.py) and the RL-step tests.
- Toy (`toy_batches`, `held_out_set`, `train_set`, `base_documents`, `toy_reward_spec`): a, b ≤ 4, so the answer
  is one digit token; training prompts have even a, held-out prompts odd a. Reward terms, all in-graph: `acc` (the
  first completion token is the answer), `fmt` (the completion is exactly digit, EOS), `proc` (two rule-checked
  steps: a digit first, EOS second; per-step scores for process advantages), and the spurious rewards `incorrect`
  (a wrong digit answer) and `random` (reward_spec.random_reward). Used by the training ablations.
"""
import jax.numpy as jnp
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.rl import reward_spec as spec_lib

PAD, EOS, DIGIT0 = 0, 1, 2          # ids 2..11 are the digits 0..9
WHAT, IS, PLUS, EQ = 12, 13, 14, 15
FILLER0 = EQ + 1                    # ids FILLER0..vocab-1: "words" a toy completion may carry after its answer
BENCH_PROMPT_LEN = 10               # what is AAA + BBB =
TOY_PROMPT_LEN = 6                  # what is a + b =
TASK = "digits"                     # its entry in registry.TASKS (reward_spec.Context names it)


class Tokenizer:
  """Digits as single tokens plus the four words of the prompt; the rest of the vocab is unused ids."""
  pad_id, eos_id, bos_id = PAD, EOS, PAD
  tag_ids: dict = {}

  def __init__(self, vocab):
    self.vocab_size = vocab

  @staticmethod
  def decode(ids) -> str:
    return " ".join(str(i) for i in ids)

  @staticmethod
  def digits(n: int) -> list[int]:
    return [DIGIT0 + int(ch) for ch in str(n)]


# ------------------------------------------------------------------------------------------------ benchmark


BATCH_FIELDS = {"answer_ids_NxA": ((4,), "int32")}  # make_batches' fields besides the prompts: (shape, dtype) a prompt


def make_batches(prompts: int, steps: int, seed: int = 0):
  """`steps` batches of `prompts` prompts, left-padded to BENCH_PROMPT_LEN; answer digit ids padded with -1."""
  rng = np.random.default_rng(seed)
  P, A = BENCH_PROMPT_LEN, 4
  for _ in range(steps):
    prompt = np.zeros((prompts, P), np.int32)
    pmask = np.zeros((prompts, P), np.int32)
    ans = np.full((prompts, A), -1, np.int32)
    for i in range(prompts):
      a, b = rng.integers(0, 1000, 2)
      ids = [WHAT, IS] + Tokenizer.digits(a) + [PLUS] + Tokenizer.digits(b) + [EQ]
      prompt[i, P - len(ids):] = ids  # left padding
      pmask[i, P - len(ids):] = 1
      d = Tokenizer.digits(a + b)
      ans[i, :len(d)] = d
    yield {"prompt_NxP": prompt, "prompt_mask_NxP": pmask, "answer_ids_NxA": ans}


def contains_answer(tokens_NxL, mask_NxL, batch, ctx):
  """1 if the answer's digit ids appear contiguously in the completion (the peers' `ans in completion`)."""
  ans_NxA = batch["answer_ids_NxA"]
  A, L = ans_NxA.shape[1], tokens_NxL.shape[1]
  toks = jnp.where(mask_NxL > 0, tokens_NxL, -2)
  toks = jnp.pad(toks, ((0, 0), (0, A)), constant_values=-2)
  valid_A = ans_NxA >= 0
  hit = jnp.ones(tokens_NxL.shape, bool)
  for j in range(A):
    hit = hit & ((toks[:, j:j + L] == ans_NxA[:, j:j + 1]) | ~valid_A[:, j:j + 1])
  return spec_lib.outcome(jnp.any(hit, axis=1).astype(jnp.float32))


def contains_answer_py(texts, ids, batch) -> list[float]:
  """The same reward in plain Python over token ids, for the jax.pure_callback path."""
  del texts
  out = []
  for row_ids, ans in zip(ids, batch["answer_ids_NxA"]):
    a = [int(x) for x in ans if x >= 0]
    out.append(float(any(row_ids[i:i + len(a)] == a for i in range(len(row_ids) - len(a) + 1))))
  return out


def python_rewards(tok) -> dict:
  """The Python reward terms of this task (registry.TASKS): the benchmark reward through jax.pure_callback."""
  del tok
  return {"contains": contains_answer_py}


def reward_spec(vocab: int) -> spec_lib.RewardSpec:
  """The benchmark reward, in-graph (its Python form, `python_rewards`, goes through rewards.build)."""
  return spec_lib.RewardSpec(("contains",), (1.0,), (contains_answer,), {}, spec_lib.Context(TASK, Tokenizer(vocab)))


def bench_config(*, hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=512, prompts=8, G=8, L=64,
                 dtype="float32", remat="none"):
  """The peers' hyper-parameters: β=0.04, μ=1, lr 1e-5, temperature 1, tied embeddings, QKV bias."""
  if vocab <= EQ:  # the prompt's ids past the table: the embedding gather clamps them, a silently other workload
    raise config_lib.ConfigError(f"vocab={vocab}: the digits workload's prompts use ids 0..{EQ} (pad, EOS, the ten "
                                 f"digits, 'what is + ='); use a vocab above {EQ}.")
  c = config_lib.base_config()
  c.model.update(vocab_size=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv, inter=inter,
                 max_len=16 + L, tie_embeddings=True, qkv_bias=True, dtype=dtype, remat=remat)
  c.sampling.update(temperature=1.0, max_new_tokens=L)
  c.task.prompt_len = BENCH_PROMPT_LEN
  c.rl.update(algo="grpo", G=G, prompts_per_step=prompts, beta=0.04, mu=1, minibatches=1)
  c.optim.update(lr=1e-5, grad_clip=1.0)
  c.mesh.update(data=-1, fsdp=1, tensor=1)
  c.train.num_samples_logged = 1
  c.eval.update(batch=4 * prompts, size=4 * prompts)  # evaluation is not part of this workload
  return c


# ------------------------------------------------------------------------------------------------------ toy


def toy_encode(a: np.ndarray, b: np.ndarray) -> dict:
  """Toy prompts for operand arrays a, b (single digits) with their one-token answers."""
  prompt = np.stack([np.full_like(a, WHAT), np.full_like(a, IS), DIGIT0 + a, np.full_like(a, PLUS),
                     DIGIT0 + b, np.full_like(a, EQ)], 1).astype(np.int32)
  return {"prompt_NxP": prompt, "prompt_mask_NxP": np.ones_like(prompt), "answer_N": (DIGIT0 + a + b).astype(np.int32)}


def toy_batches(n: int, seed: int, indices=()):
  """Endless batches of n training prompts: even a (0, 2, 4), so the held-out pairs (odd a) never occur.
  `indices` (task.train_indices): only those pairs of train_set(), drawn uniformly (one index: the batch is that
  prompt n times, one-shot RLVR); () = every training pair."""
  rng = np.random.default_rng(seed)
  if len(indices):
    pairs = train_set()
    bad = [i for i in indices if not 0 <= int(i) < len(pairs["answer_N"])]
    if bad or len(set(indices)) != len(indices):
      raise config_lib.ConfigError(f"config.task.train_indices={tuple(indices)!r}: the toy has "
                                   f"{len(pairs['answer_N'])} training pairs; give distinct indices in [0, "
                                   f"{len(pairs['answer_N'])}).")
    a_all = pairs["prompt_NxP"][:, 2] - DIGIT0
    b_all = pairs["prompt_NxP"][:, 4] - DIGIT0
    idx = np.asarray(indices, np.int64)
    while True:
      pick = idx[rng.integers(0, len(idx), n)]
      yield toy_encode(a_all[pick], b_all[pick])
  while True:
    a = rng.integers(0, 5, n)
    b = rng.integers(0, 5, n)
    a = np.where(a % 2 == 0, a, a + 1)  # odd a (1, 3) -> 2, 4
    yield toy_encode(a, b)


def held_out_set() -> dict:
  """All 10 held-out pairs (odd a), fixed."""
  a, b = np.meshgrid(np.array([1, 3]), np.arange(5), indexing="ij")
  return toy_encode(a.reshape(-1), b.reshape(-1))


def train_set() -> dict:
  """All 15 training pairs (even a), fixed: the policy's greedy accuracy on the prompts it trains on."""
  a, b = np.meshgrid(np.array([0, 2, 4]), np.arange(5), indexing="ij")
  return toy_encode(a.reshape(-1), b.reshape(-1))


def base_documents(n: int, L: int, vocab: int, p_correct: float, rng: np.random.Generator) -> dict:
  """What the toy's "base model" is pre-trained on: any of the 25 pairs; the answer digit is right with
  probability p_correct (else a random digit), then 0..L-2 filler words, then EOS. Lengths are uniform, equally
  for right and wrong answers, so a length bias later comes from the RL objective, not from the base."""
  a, b = rng.integers(0, 5, n), rng.integers(0, 5, n)
  enc = toy_encode(a, b)
  right = rng.random(n) < p_correct
  first = np.where(right, enc["answer_N"], DIGIT0 + rng.integers(0, 10, n))
  n_fill = rng.integers(0, L - 1, n)
  comp_NxL = np.full((n, L), PAD, np.int32)
  comp_NxL[:, 0] = first
  fill_NxL = rng.integers(FILLER0, vocab, (n, L))
  cols = np.arange(L)[None, :]
  comp_NxL = np.where((cols >= 1) & (cols <= n_fill[:, None]), fill_NxL, comp_NxL)
  comp_NxL[np.arange(n), n_fill + 1] = EOS
  mask_NxL = (cols <= n_fill[:, None] + 1).astype(np.int32)
  return {"tokens_NxT": np.concatenate([enc["prompt_NxP"], comp_NxL], 1),
          "loss_mask_NxT": np.concatenate([np.zeros_like(enc["prompt_NxP"]), mask_NxL], 1)}


def _acc(tokens_NxL, mask_NxL, batch, ctx):
  return spec_lib.outcome((tokens_NxL[:, 0] == batch["answer_N"]) & (mask_NxL[:, 0] > 0))


def _is_digit(t):
  return (t >= DIGIT0) & (t < DIGIT0 + 10)


def _fmt(tokens_NxL, mask_NxL, batch, ctx):
  ok = _is_digit(tokens_NxL[:, 0]) & (tokens_NxL[:, 1] == EOS) & (mask_NxL.sum(-1) == 2)
  return spec_lib.outcome(ok)


def _proc(tokens_NxL, mask_NxL, batch, ctx):
  s_r = jnp.stack([_is_digit(tokens_NxL[:, 0]), tokens_NxL[:, 1] == EOS], 1).astype(jnp.float32)
  s_end = jnp.broadcast_to(jnp.array([0, 1], jnp.int32), s_r.shape)
  s_valid = jnp.stack([mask_NxL[:, 0] > 0, mask_NxL[:, 1] > 0], 1).astype(jnp.float32)
  return spec_lib.outcome(s_r.mean(-1), (s_r, s_end, s_valid))


def _incorrect(tokens_NxL, mask_NxL, batch, ctx):
  """A digit answer that is wrong (spurious rewards' "incorrect" reward on the toy: `acc`'s opposite among the
  completions that answer with a digit)."""
  answered = _is_digit(tokens_NxL[:, 0]) & (mask_NxL[:, 0] > 0)
  return spec_lib.outcome(answered & (tokens_NxL[:, 0] != batch["answer_N"]))


TOY_TERMS = {"acc": _acc, "fmt": _fmt, "proc": _proc, "incorrect": _incorrect, "random": spec_lib.random_reward}
TOY_STEP_TERMS = ("proc",)  # the terms that score steps (what rl.process_weight reads): validate_rl's step_terms


def toy_reward_spec(terms, vocab: int, random_rate: float = 0.5) -> spec_lib.RewardSpec:
  """A weighted sum of toy terms, `terms` = ((name, weight), ...) as in config.rewards; `random_rate`: the
  `random` term's (rl.random_reward_rate)."""
  names = tuple(n for n, _ in terms)
  unknown = [n for n in names if n not in TOY_TERMS]
  if unknown:
    raise ValueError(f"config.rewards: toy terms {unknown} are unknown; choose from {sorted(TOY_TERMS)}.")
  return spec_lib.RewardSpec(names, tuple(float(w) for _, w in terms), tuple(TOY_TERMS[n] for n in names), {},
                            spec_lib.Context(TASK, Tokenizer(vocab), random_rate=float(random_rate)))
