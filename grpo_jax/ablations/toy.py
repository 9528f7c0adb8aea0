"""A toy task a random tiny model learns in minutes on a CPU, so ablations can train many seeds × variants.

The peers' prompt "what is a + b =" with single digits a + b ≤ 8 (the answer is one digit token). Reward terms,
all in-graph: `acc` (the first completion token is the answer), `fmt` (the completion is exactly digit, EOS),
`proc` (two rule-checked steps: a digit first, EOS second; per-step scores for process advantages).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import config_lib
from grpo_jax import model as model_lib
from grpo_jax import peer_workload as pw
from grpo_jax import rewards
from grpo_jax import sampling
from grpo_jax import sft_step
from grpo_jax import sharding

P_LEN = 6  # what is a + b =


def batches(n: int, seed: int, held_out: bool = False):
  """Endless batches of n prompts; train prompts have even a, held-out prompts odd a (disjoint pairs)."""
  rng = np.random.default_rng(seed)
  while True:
    a = rng.integers(0, 5, n)
    b = rng.integers(0, 5, n)
    a = np.where((a % 2 == 1) == held_out, a, (a + 1) % 5)  # train: even a (0,2,4); held-out: odd a (1,3)
    yield encode(a, b)


def encode(a: np.ndarray, b: np.ndarray) -> dict:
  prompt = np.stack([np.full_like(a, pw.WHAT), np.full_like(a, pw.IS), pw.DIGIT0 + a, np.full_like(a, pw.PLUS),
                     pw.DIGIT0 + b, np.full_like(a, pw.EQ)], 1).astype(np.int32)
  return {"prompt_NxP": prompt, "prompt_mask_NxP": np.ones_like(prompt),
          "answer_N": (pw.DIGIT0 + a + b).astype(np.int32)}


def held_out_set() -> dict:
  """All 10 held-out pairs (odd a), fixed."""
  a, b = np.meshgrid(np.array([1, 3]), np.arange(5), indexing="ij")
  return encode(a.reshape(-1), b.reshape(-1))


def train_set() -> dict:
  """All 15 training pairs (even a), fixed: the policy's greedy accuracy on the prompts it trains on."""
  a, b = np.meshgrid(np.array([0, 2, 4]), np.arange(5), indexing="ij")
  return encode(a.reshape(-1), b.reshape(-1))


FILLER0 = pw.EQ + 1  # ids FILLER0..vocab-1: "words" a completion may carry after its answer


def base_documents(n: int, L: int, vocab: int, p_correct: float, rng: np.random.Generator) -> dict:
  """What the toy's "base model" is pre-trained on: any of the 25 pairs; the answer digit is right with
  probability p_correct (else a random digit), then 0..L-2 filler words, then EOS. Lengths are uniform, equally
  for right and wrong answers, so a length bias later comes from the RL objective, not from the base."""
  a, b = rng.integers(0, 5, n), rng.integers(0, 5, n)
  enc = encode(a, b)
  right = rng.random(n) < p_correct
  first = np.where(right, enc["answer_N"], pw.DIGIT0 + rng.integers(0, 10, n))
  n_fill = rng.integers(0, L - 1, n)
  comp_NxL = np.full((n, L), pw.PAD, np.int32)
  comp_NxL[:, 0] = first
  fill_NxL = rng.integers(FILLER0, vocab, (n, L))
  cols = np.arange(L)[None, :]
  comp_NxL = np.where((cols >= 1) & (cols <= n_fill[:, None]), fill_NxL, comp_NxL)
  comp_NxL[np.arange(n), n_fill + 1] = pw.EOS
  mask_NxL = (cols <= n_fill[:, None] + 1).astype(np.int32)
  return {"tokens_NxT": np.concatenate([enc["prompt_NxP"], comp_NxL], 1),
          "loss_mask_NxT": np.concatenate([np.zeros_like(enc["prompt_NxP"]), mask_NxL], 1)}


@functools.lru_cache(maxsize=4)
def base_params(mcfg: model_lib.ModelConfig, L: int, steps: int, p_correct: float, seed: int = 0):
  """The shared starting policy (and reference) of the training ablations: a random model pre-trained with
  AdamW (sft_step, loss on the completions) on base_documents for `steps` steps of 64. RL is applied to a base
  model, as in practice, so it refines a policy that already answers (at ~p_correct) with varied lengths instead
  of searching a uniform 32-way guess."""
  tx = optax.adamw(3e-3)
  mesh = sharding.make_mesh(config_lib.base_config().mesh, jax.devices()[:1])
  step = sft_step.make_sft_step(mcfg, tx, mesh)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(10_000 + seed))
  state = dict(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32), rng=jax.random.PRNGKey(0))
  rng = np.random.default_rng(seed)
  for _ in range(steps):
    d = base_documents(64, L, mcfg.vocab_size, p_correct, rng)
    mask_NxT = ((d["tokens_NxT"] != pw.PAD) | (np.arange(d["tokens_NxT"].shape[1]) < P_LEN)).astype(np.int32)
    pos_NxT = np.broadcast_to(np.arange(mask_NxT.shape[1], dtype=np.int32), mask_NxT.shape)
    state, _ = step(state, {**d, "mask_NxT": mask_NxT, "positions_NxT": pos_NxT})
  return state["params"]


def _acc(tokens_NxL, mask_NxL, batch, ctx):
  return rewards.outcome((tokens_NxL[:, 0] == batch["answer_N"]) & (mask_NxL[:, 0] > 0))


def _is_digit(t):
  return (t >= pw.DIGIT0) & (t < pw.DIGIT0 + 10)


def _fmt(tokens_NxL, mask_NxL, batch, ctx):
  ok = _is_digit(tokens_NxL[:, 0]) & (tokens_NxL[:, 1] == pw.EOS) & (mask_NxL.sum(-1) == 2)
  return rewards.outcome(ok)


def _proc(tokens_NxL, mask_NxL, batch, ctx):
  s_r = jnp.stack([_is_digit(tokens_NxL[:, 0]), tokens_NxL[:, 1] == pw.EOS], 1).astype(jnp.float32)
  s_end = jnp.broadcast_to(jnp.array([0, 1], jnp.int32), s_r.shape)
  s_valid = jnp.stack([mask_NxL[:, 0] > 0, mask_NxL[:, 1] > 0], 1).astype(jnp.float32)
  return rewards.outcome(s_r.mean(-1), (s_r, s_end, s_valid))


TERMS = {"acc": _acc, "fmt": _fmt, "proc": _proc}


def reward_spec(terms: tuple[tuple[str, float], ...], vocab: int) -> rewards.RewardSpec:
  names = tuple(n for n, _ in terms)
  unknown = [n for n in names if n not in TERMS]
  if unknown:
    raise ValueError(f"toy rewards {unknown} unknown; choose from {sorted(TERMS)}.")
  return rewards.RewardSpec(names, tuple(float(w) for _, w in terms), tuple(TERMS[n] for n in names), {},
                            rewards.Context("toy", pw.BenchTokenizer(vocab)))


def make_eval(mcfg, max_new_tokens: int, prompts: dict | None = None):
  """vmapped greedy accuracy: params_S → acc_S, the fraction of `prompts` (default: the 10 held-out prompts)
  answered right."""
  scfg = sampling.SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens, greedy=True, eos_id=pw.EOS,
                                 pad_id=pw.PAD)
  ho = {k: jnp.asarray(v) for k, v in (held_out_set() if prompts is None else prompts).items()}

  def acc(params):
    ro = sampling.sample(mcfg, params, ho["prompt_NxP"], ho["prompt_mask_NxP"], jax.random.PRNGKey(0), scfg)
    return jnp.mean(ro.tokens_NxL[:, 0] == ho["answer_N"])

  return jax.jit(jax.vmap(acc))
