"""The peers' GRPO benchmark workload (../shared/peers/trl_grpo_bench.py) in our terms.

Prompts "what is A + B =" with digits as single tokens, reward 1 if the answer's digits appear anywhere in the
completion (TRL's `ans in completion`), computed in-graph. Used by benchmarks/grpo_step.py, the TPU compile tool and
the RL-step tests, which need a reward that does not depend on a trained tokenizer.
"""
import jax.numpy as jnp
import numpy as np

from grpo_jax import rewards

PAD, EOS, DIGIT0 = 0, 1, 2          # ids 2..11 are the digits 0..9
WHAT, IS, PLUS, EQ = 12, 13, 14, 15


class BenchTokenizer:
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


def make_batches(prompts: int, steps: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  P, A = 4 + 3 + 3, 4
  for _ in range(steps):
    prompt = np.zeros((prompts, P), np.int32)
    pmask = np.zeros((prompts, P), np.int32)
    ans = np.full((prompts, A), -1, np.int32)
    for i in range(prompts):
      a, b = rng.integers(0, 1000, 2)
      ids = [WHAT, IS] + BenchTokenizer.digits(a) + [PLUS] + BenchTokenizer.digits(b) + [EQ]
      prompt[i, P - len(ids):] = ids  # left padding
      pmask[i, P - len(ids):] = 1
      d = BenchTokenizer.digits(a + b)
      ans[i, :len(d)] = d
    yield {"prompt_NxP": prompt, "prompt_mask_NxP": pmask, "answer_ids_NxA": ans}


def contains_answer(tokens_NxL, mask_NxL, batch, ctx):
  """1 if the answer's digit ids appear contiguously in the completion (the peers' `ans in completion`)."""
  ans_NxA = batch["answer_ids_NxA"]
  A, L = ans_NxA.shape[1], tokens_NxL.shape[1]
  toks = jnp.where(mask_NxL > 0, tokens_NxL, -2)
  toks = jnp.pad(toks, ((0, 0), (0, A)), constant_values=-2)
  valid_A = ans_NxA >= 0
  hit = jnp.zeros(tokens_NxL.shape, bool) | True
  for j in range(A):
    hit = hit & ((toks[:, j:j + L] == ans_NxA[:, j:j + 1]) | ~valid_A[:, j:j + 1])
  return rewards.outcome(jnp.any(hit, axis=1).astype(jnp.float32))




def contains_answer_py(texts, ids, batch) -> list[float]:
  """The same reward in plain Python over token ids, for the jax.pure_callback path."""
  out = []
  for row_ids, ans in zip(ids, batch["answer_ids_NxA"]):
    a = [int(x) for x in ans if x >= 0]
    out.append(float(any(row_ids[i:i + len(a)] == a for i in range(len(row_ids) - len(a) + 1))))
  return out


def reward_spec(vocab: int, python: bool = False) -> rewards.RewardSpec:
  tok = BenchTokenizer(vocab)
  ctx = rewards.Context("bench", tok)
  if python:
    return rewards.build((("contains", 1.0),), ctx, {"contains": contains_answer_py})
  return rewards.RewardSpec(("contains",), (1.0,), (contains_answer,), {}, ctx)


def bench_config(*, hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=512, prompts=8, G=8, L=64,
                 dtype="float32", remat="none"):
  """The peers' hyper-parameters: β=0.04, μ=1, lr 1e-5, temperature 1, tied embeddings, QKV bias."""
  from grpo_jax import config_lib
  c = config_lib.base_config()
  c.model.update(vocab_size=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv, inter=inter,
                 max_len=16 + L, tie_embeddings=True, qkv_bias=True, dtype=dtype, remat=remat)
  c.sampling.update(temperature=1.0, max_new_tokens=L)
  c.task.prompt_len = 10
  c.rl.update(algo="grpo", G=G, prompts_per_step=prompts, beta=0.04, mu=1, minibatches=1)
  c.optim.update(lr=1e-5, grad_clip=1.0)
  c.mesh.update(data=-1, fsdp=1, tensor=1)
  c.train.num_samples_logged = 1
  c.eval.update(batch=4 * prompts, size=4 * prompts)  # evaluation is not part of this workload
  return c
