"""The training ablations' model side of the toy task (grpo_jax/tasks/digits.py): the shared pre-trained base
policy and a vmapped greedy evaluation, so ablations can train many seeds × variants from one start on a CPU."""
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


@functools.lru_cache(maxsize=4)
def base_params(mcfg: model_lib.ModelConfig, L: int, steps: int, p_correct: float, seed: int = 0):
  """The shared starting policy (and reference) of the training ablations: a random model pre-trained with
  AdamW (sft_step, loss on the completions) on digits.base_documents for `steps` steps of 64. RL is applied to a
  base model, as in practice, so it refines a policy that already answers (at ~p_correct) with varied lengths
  instead of searching a uniform 32-way guess."""
  c = config_lib.base_config()  # optax.adamw(3e-3)'s defaults: no clipping, no warm-up (decay: update.decay_mask)
  c.optim.update(b1=0.9, b2=0.999, weight_decay=1e-4, grad_clip=0.0)
  c.sft.update(lr=3e-3, warmup_steps=0)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  step = families.make_step(c, mesh, mcfg, family=sft_step)
  state = sft_step.init(c, mesh, mcfg, params=model_lib.init_params(mcfg, jax.random.PRNGKey(10_000 + seed)))
  rng = np.random.default_rng(seed)
  for _ in range(steps):
    d = digits.base_documents(64, L, mcfg.vocab_size, p_correct, rng)
    mask_NxT = ((d["tokens_NxT"] != digits.PAD)
                | (np.arange(d["tokens_NxT"].shape[1]) < digits.TOY_PROMPT_LEN)).astype(np.int32)
    pos_NxT = np.broadcast_to(np.arange(mask_NxT.shape[1], dtype=np.int32), mask_NxT.shape)
    state, _ = step(state, {**d, "mask_NxT": mask_NxT, "positions_NxT": pos_NxT})
  return state["params"]


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
