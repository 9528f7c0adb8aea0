"""A toy task a random tiny model learns in minutes on a CPU, so ablations can train many seeds × variants.

The peers' prompt "what is a + b =" with single digits a + b ≤ 8 (the answer is one digit token). Reward terms,
all in-graph: `acc` (the first completion token is the answer), `fmt` (the completion is exactly digit, EOS),
`proc` (two rule-checked steps: a digit first, EOS second; per-step scores for process advantages).
"""
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import peer_workload as pw
from grpo_jax import rewards
from grpo_jax import sampling

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


def make_eval(mcfg, max_new_tokens: int):
  """vmapped greedy held-out accuracy: params_S → acc_S (fraction of the 10 held-out prompts answered right)."""
  scfg = sampling.SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens, greedy=True, eos_id=pw.EOS,
                                 pad_id=pw.PAD)
  ho = {k: jnp.asarray(v) for k, v in held_out_set().items()}

  def acc(params):
    ro = sampling.sample(mcfg, params, ho["prompt_NxP"], ho["prompt_mask_NxP"], jax.random.PRNGKey(0), scfg)
    return jnp.mean(ro.tokens_NxL[:, 0] == ho["answer_N"])

  return jax.jit(jax.vmap(acc))
