"""The training ablations' model side of the toy task (grpo_jax/tasks/digits.py): the pre-trained base policy (one
shared by a table's seeds, or one per seed) and a vmapped greedy evaluation, so ablations can train many seeds ×
variants from a base on a CPU."""
import collections
import functools
import hashlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.rl import families
from grpo_jax.model import model as model_lib
from grpo_jax.rollout import sampling
from grpo_jax.rl import sft_step
from grpo_jax.infra import sharding
from grpo_jax.tasks import digits


def base_params(mcfg: model_lib.ModelConfig, L: int, steps: int, p_correct: float, seed: int = 0):
  """The training ablations' starting policy (and reference): a random model pre-trained with AdamW (sft_step, loss
  on the completions) on digits.base_documents for `steps` steps of 64. RL is applied to a base model, as in
  practice, so it refines a policy that already answers (at ~p_correct) with varied lengths instead of searching a
  uniform 32-way guess. Pre-trained once per process for each (model, L, steps, p_correct, seed): a table's cells
  share their bases (train_table.start_params)."""
  # the arguments normalised, so `seed=0` and the default (or 300 and 300.0) are one cache entry, not two pre-trainings
  return _cached_base(mcfg, int(L), int(steps), float(p_correct), int(seed))


# Bounded for a long-lived process; 64 covers a per-seed table (train_table's base='per_seed') of up to 64 seeds,
# whose bases would otherwise be pre-trained again in every cell (at 4, a 5-seed table's were). A toy base is ~100 kB.
@functools.lru_cache(maxsize=64)
def _cached_base(mcfg: model_lib.ModelConfig, L: int, steps: int, p_correct: float, seed: int):
  return pretrain(mcfg, L, steps, p_correct, seed)


def pretrain(mcfg: model_lib.ModelConfig, L: int, steps: int, p_correct: float, seed: int):
  """base_params without its cache: the init and the documents drawn from `seed`."""
  c = base_config()
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  # one program for every seed's pre-training (~4 of the ~6 CPU-s of a 300-step base was compiling a step built
  # again per base); the same program on the same inputs gives the same base
  step = shared_program("base_sft_step", mcfg, L, None, lambda: families.make_step(c, mesh, mcfg, family=sft_step))
  state = sft_step.init(c, mesh, mcfg, params=model_lib.init_params(mcfg, jax.random.PRNGKey(10_000 + seed)))
  rng = np.random.default_rng(seed)
  for _ in range(steps):
    d = digits.base_documents(64, L, mcfg.vocab_size, p_correct, rng)
    mask_NxT = ((d["tokens_NxT"] != digits.PAD)
                | (np.arange(d["tokens_NxT"].shape[1]) < digits.TOY_PROMPT_LEN)).astype(np.int32)
    pos_NxT = np.broadcast_to(np.arange(mask_NxT.shape[1], dtype=np.int32), mask_NxT.shape)
    state, _ = step(state, {**d, "mask_NxT": mask_NxT, "positions_NxT": pos_NxT})
  return state["params"]


def base_config():
  """The pre-training's config: optax.adamw(3e-3)'s defaults, no clipping, no warm-up (decay: update.decay_mask)."""
  c = config_lib.base_config()
  c.optim.update(b1=0.9, b2=0.999, weight_decay=1e-4, grad_clip=0.0)
  c.sft.update(lr=3e-3, warmup_steps=0)
  return c


_PROGRAMS: collections.OrderedDict = collections.OrderedDict()  # (kind, model, length, prompts) -> jitted program
_MAX_PROGRAMS = 16


def shared_program(kind: str, mcfg, max_new_tokens: int, prompts: dict | None, build: Callable[[], Callable]):
  """`build()`'s jitted program, built once per (kind, model config, completion length, prompt arrays) in a process
  and shared by a table's cells: each cell built its own jit of the same program, which traced and compiled it again
  per cell (table d :small, 3 cells: ~5 CPU-s of its held-out and training-prompt evaluations, ~1/3 needed)."""
  digest = None
  if prompts is not None:
    h = hashlib.sha1()
    for k in sorted(prompts):
      a = np.ascontiguousarray(prompts[k])
      h.update(f"{k}:{a.dtype}:{a.shape};".encode())
      h.update(a.tobytes())
    digest = h.hexdigest()
  key = (kind, mcfg, int(max_new_tokens), digest)
  if key not in _PROGRAMS:
    _PROGRAMS[key] = build()
    while len(_PROGRAMS) > _MAX_PROGRAMS:
      _PROGRAMS.popitem(last=False)
  return _PROGRAMS[key]


def make_eval(mcfg, max_new_tokens: int, prompts: dict | None = None):
  """vmapped greedy accuracy: params_S → acc_S, the fraction of `prompts` (default: the 10 held-out prompts)
  answered right; one program per model, length and prompts (shared_program)."""
  return shared_program("greedy_accuracy", mcfg, max_new_tokens, prompts,
                        lambda: _make_eval(mcfg, max_new_tokens, prompts))


def _make_eval(mcfg, max_new_tokens: int, prompts: dict | None):
  scfg = sampling.SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens, greedy=True, eos_id=digits.EOS,
                                 pad_id=digits.PAD)
  ho = {k: jnp.asarray(v) for k, v in (digits.held_out_set() if prompts is None else prompts).items()}

  def acc(params):
    ro = sampling.sample(mcfg, params, ho["prompt_NxP"], ho["prompt_mask_NxP"], jax.random.PRNGKey(0), scfg)
    return jnp.mean(ro.tokens_NxL[:, 0] == ho["answer_N"])

  return jax.jit(jax.vmap(acc))
