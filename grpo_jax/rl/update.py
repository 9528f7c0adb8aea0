"""What every family's step shares: the optimizer, one gradient update that a non-finite value skips, μ epochs ×
minibatches as `lax.scan`, and the update's metrics tail. Pure functions; rl_step, ppo_step and sft_step compose them.
"""
import functools
import numbers
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from grpo_jax.infra import sharding

LR = "learning_rate"
# The vmap axis of stacked runs (studies/vmapped_runs.py): the training-length bucket is reduced over it.
RUNS_AXIS = "runs"


def warmup_schedule(lr, warmup_steps: int) -> optax.Schedule:
  """Linear from 0 to `lr` over `warmup_steps` updates (so the first update applies lr 0), then constant."""
  if warmup_steps <= 0:
    return optax.constant_schedule(lr)
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), optax.constant_schedule(lr)],
                              [warmup_steps])


class Optimizer(NamedTuple):
  """An optax transformation whose state carries its learning rate, and the warm-up applied to that rate."""
  tx: optax.GradientTransformation
  warmup_steps: int

  def lr(self, opt_state) -> jax.Array:
    """The learning rate the next update of `opt_state` applies."""
    return warmup_schedule(opt_state.hyperparams[LR], self.warmup_steps)(opt_state.count)


NO_DECAY = ("scale", "bias")  # the leaves weight decay leaves alone: norm scales and biases


def decay_mask(params: Any) -> Any:
  """True for the leaves weight decay shrinks: matmul kernels, the embedding table, the head and LoRA adapters
  (nanoGPT's and Hugging Face Trainer's rule: every weight but biases and norm scales; embeddings decayed as both
  do). Decaying a norm scale pulls it towards 0, not towards its init of 1."""
  return jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[-1], "key", None) not in NO_DECAY, params)


def make_optimizer(optim_cfg, lr: float | None = None) -> Optimizer:
  """AdamW (+ global-norm clipping, + linear warm-up) from the `optim` config group; `lr` overrides optim.lr.
  optim.weight_decay reaches the leaves `decay_mask` selects (no norm scale, no bias).

  The learning rate is a hyper-parameter IN the optimizer state (`opt_state.hyperparams['learning_rate']`), so a
  main run and a vmapped run with one learning rate per run (studies/vmapped_runs.py) have the same state structure: a sweep
  point's checkpoint resumes with `main`.
  """
  warm = int(optim_cfg.warmup_steps)

  def adamw(learning_rate):
    return optax.chain(
        optax.clip_by_global_norm(optim_cfg.grad_clip) if optim_cfg.grad_clip > 0 else optax.identity(),
        optax.adamw(warmup_schedule(learning_rate, warm), b1=optim_cfg.b1, b2=optim_cfg.b2,
                    eps=optim_cfg.eps, weight_decay=optim_cfg.weight_decay,
                    mask=decay_mask if optim_cfg.weight_decay else None))  # None: the state has no mask node

  tx = optax.inject_hyperparams(adamw, hyperparam_dtype=jnp.float32)(
      learning_rate=optim_cfg.lr if lr is None else lr)
  return Optimizer(tx, warm)


def select(pred: jax.Array, new: Any, old: Any) -> Any:
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def finite_select(new: Any, old: Any, *values: jax.Array) -> tuple[Any, jax.Array]:
  """(`new` if every value — loss, gradient norms, optimizer-update norms — is finite, else `old`; finite)."""
  finite = jnp.asarray(True)
  for v in values:
    finite = finite & jnp.isfinite(v)
  return select(finite, new, old), finite


def gradient_step(loss_fn: Callable, opts: Sequence[Optimizer], params: tuple, opt_states: tuple,
                  batch: Any, value_and_grad: Callable | None = None) -> tuple[tuple, tuple, dict[str, jax.Array]]:
  """One update of one or more parameter sets, each with its own optimizer (PPO: policy and critic).

  `loss_fn(params, batch) -> (loss, aux)`; `value_and_grad(params, batch) -> ((loss, aux), grads)` replaces
  jax.value_and_grad(loss_fn) (rl.packing: gradients summed over packed micro-batches). A non-finite loss, gradient or optimizer update in ANY set skips the
  whole update (params and optimizer states stay as they were) and is counted. Metrics (aux plus loss, grad_norm,
  update_norm, lr, nonfinite) describe the first set, the policy.
  """
  vg = value_and_grad or jax.value_and_grad(loss_fn, has_aux=True)
  (loss, aux), grads = vg(params, batch)
  lr = opts[0].lr(opt_states[0])
  new_params, new_opts, norms = [], [], []
  for opt, g, s, p in zip(opts, grads, opt_states, params):
    updates, s_new = opt.tx.update(g, s, p)
    new_params.append(optax.apply_updates(p, updates))
    new_opts.append(s_new)
    norms += [optax.tree.norm(g), optax.tree.norm(updates)]
  (params, opt_states), finite = finite_select((tuple(new_params), tuple(new_opts)), (params, opt_states), loss,
                                               *norms)
  m = dict(aux, loss=loss, grad_norm=norms[0], update_norm=jnp.where(finite, norms[1], 0.0),
           lr=lr, nonfinite=1 - finite.astype(jnp.int32))
  return params, opt_states, m


def make_update(loss_fn: Callable, opts: Sequence[Optimizer],
                value_and_grad: Callable | None = None) -> Callable[[Any, Any], tuple[Any, dict]]:
  """`gradient_step` as minibatch_scan's update: the carry is (params tuple, optimizer states tuple)."""
  def update(carry, mb):
    params, opt_states, m = gradient_step(loss_fn, opts, *carry, mb, value_and_grad)
    return (params, opt_states), m
  return update


def minibatch_scan(update: Callable[[Any, Any], tuple[Any, dict]], carry: Any, data: Any, rng: jax.Array, *,
                   mu: int, minibatches: int, first_key: str | None = None,
                   rng_key: str | None = None) -> tuple[Any, dict[str, jax.Array]]:
  """μ epochs × `minibatches` of `update(carry, minibatch) -> (carry, metrics)` as nested lax.scan.

  `data` is a pytree of arrays with the same leading row axis N; each epoch visits a fresh random permutation of
  the rows in N / minibatches slices (one on-policy update, μ = 1 with one minibatch, keeps the row order: the
  gather would only cost time). `first_key` (data a dict): each minibatch gets `mb[first_key]`, a bool scalar
  True for the step's first update only, the one that runs at the params the data was recorded with
  (rl_step.old_logp). `rng_key` (data a dict): each minibatch gets `mb[rng_key]`, a PRNG key of its own update (from
  the epoch's key, folded apart from its permutation), for randomness drawn afresh per update (Clip-Cov's choice:
  rl_step.select_uniforms). Returns the final carry and each metric stacked over the μ·minibatches updates.
  """
  N = jax.tree.leaves(data)[0].shape[0]
  # a step built without validation (studies, benchmarks) gets the config check's words, not a reshape TypeError
  # (minibatches not dividing N) or a silent step with no update at all (mu = 0)
  if not (isinstance(mu, numbers.Integral) and mu >= 1):
    raise ValueError(f"rl.mu={mu!r}: must be an integer >= 1 (epochs over the batch per step).")
  if not (isinstance(minibatches, numbers.Integral) and minibatches >= 1 and N % minibatches == 0):
    raise ValueError(f"rl.minibatches={minibatches!r}: must be a positive integer dividing the update's {N} rows; "
                     "use a divisor of them.")

  def one_minibatch(carry, xs):
    rows, first, key = xs
    mb = jax.tree.map(lambda x: sharding.constrain_batch(jnp.take(x, rows, axis=0)), data)
    if first_key is not None:
      mb = dict(mb, **{first_key: first})
    if rng_key is not None:
      mb = dict(mb, **{rng_key: key})
    return update(carry, mb)

  def one_epoch(carry, xs):
    key, epoch = xs
    perm = jnp.arange(N) if mu == 1 and minibatches == 1 else jax.random.permutation(key, N)
    first = (epoch == 0) & (jnp.arange(minibatches) == 0)
    keys = None if rng_key is None else jax.random.split(jax.random.fold_in(key, 1), minibatches)
    return jax.lax.scan(one_minibatch, carry, (perm.reshape(minibatches, N // minibatches), first, keys))

  carry, m = jax.lax.scan(one_epoch, carry, (jax.random.split(rng, mu), jnp.arange(mu)))
  return carry, jax.tree.map(lambda x: x.reshape(-1), m)


# Per-update metrics that are means over the minibatch's loss tokens: NaN in an update whose minibatch has none (the
# rollout correction or the staleness mask can remove every token of one), where 0 read as a measurement (an entropy
# of 0: a collapsed policy). packing.combine sums them over micro-batches by token share.
# select_frac (rl.token_select's share of the tokens) among them: an update without tokens read 0 and pulled the step's
# mean down (top_entropy's 0.2 of the tokens logged as 0.1 when a correction or the staleness mask emptied half the
# updates).
TOKEN_MEANS = ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "ratio_mean", "kl", "kl_clamp_frac", "entropy",
               "value_clip_frac", "gate_mean", "gated_frac", "select_frac")
# Per-update metrics reported as train/<key>: the mean over the step's updates, except the ratio's extremes, and
# the means over tokens (NaN in an update that had none: TOKEN_MEANS, and the means over picked tokens), averaged
# over the updates that had any.
_NANMEAN = ("select_entropy", "select_cov") + TOKEN_MEANS
_REPORTED = ("loss", "grad_norm", "update_norm", "lr", "clip_frac_low", "clip_frac_high", "clip_frac_dual",
             "kl_clamp_frac", "ratio_mean", "ratio_max", "ratio_min", "entropy", "value_loss", "tokens", "pack_rows",
             "gate_mean", "gated_frac", "select_frac", "select_entropy", "select_cov")


def step_metrics(um: dict[str, jax.Array], params: Any, reward_ok: jax.Array | None = None) -> dict[str, jax.Array]:
  """The metrics tail of every family: per-update metrics reduced over the step's updates, non-finite and skipped
  update counts (a failed reward skips all of them), and the norm of the params the step returns."""
  m = {}
  for k in _REPORTED:
    if k in um:
      reduce = (jnp.max if k == "ratio_max" else jnp.min if k == "ratio_min" else jnp.nanmean if k in _NANMEAN
                else jnp.mean)
      m[f"train/{k}"] = reduce(um[k])
  bad = jnp.sum(um["nonfinite"])
  m["train/nonfinite_updates"] = bad
  m["train/skipped_updates"] = bad if reward_ok is None else jnp.where(reward_ok, bad, jnp.size(um["nonfinite"]))
  m["train/param_norm"] = optax.tree.norm(params)
  return m


def no_tokens_nan(aux: dict[str, jax.Array], mask_NxL: jax.Array) -> dict[str, jax.Array]:
  """`aux` with its TOKEN_MEANS NaN when `mask_NxL` has no token (their masked means divided 0 by 1: 0)."""
  empty = jnp.sum(mask_NxL > 0) == 0
  return {k: jnp.where(empty, jnp.nan, v) if k in TOKEN_MEANS else v for k, v in aux.items()}


# ---------------------------------------------------------------------------------- training-length buckets


def train_lengths(L: int, n: int) -> tuple[int, ...]:
  """The static completion lengths the update may train on, ascending, the longest L: L, L/2, ..., L/2^(n-1), each
  rounded up to a multiple of a = min(128, L // 2^(n-1)). Multiples of 128 once the shortest bucket reaches 128
  tokens (the TPU attention and matmul tiles want them); finer on small configs, where a 128 grain would leave a
  single bucket. Every length is a compiled branch of the update (a forward+backward each): keep n small."""
  if n < 1:
    raise ValueError(f"rl.train_buckets={n}: must be >= 1 (1 = always train on sampling.max_new_tokens).")
  a = max(1, min(128, L >> (n - 1)))
  return tuple(sorted({min(L, -(-L // (2 ** k) // a) * a if k else L) for k in range(n)}))


def bucket_index(lengths_N: jax.Array, sizes: Sequence[int]) -> jax.Array:
  """Index into `sizes` of the shortest length covering the longest completion. Under studies/vmapped_runs.py's vmap the index is
  the max over the runs: a per-run (batched) index would turn `lax.switch` into a select that runs every branch."""
  return max_over_runs(jnp.sum(jnp.asarray(sizes[:-1], jnp.int32) < jnp.max(lengths_N).astype(jnp.int32)))


def max_over_runs(x: jax.Array) -> jax.Array:
  """`x` reduced (max) over seeds.py's runs vmap, so a length bucket or loop trip count stays unbatched; one run's
  own `x` outside it."""
  try:
    return jax.lax.pmax(x, RUNS_AXIS)
  except NameError:  # not under the runs vmap
    return x


def by_length(idx: jax.Array, sizes: Sequence[int], fn: Callable, *operands: Any) -> Any:
  """`fn(size, *operands)` for sizes[idx], as `lax.switch` over one static branch per size (nothing recompiles
  when the length changes). Outputs must not depend on the size in shape."""
  if len(sizes) == 1:
    return fn(sizes[0], *operands)
  return jax.lax.switch(idx, [functools.partial(fn, s) for s in sizes], *operands)


def cut(data: Any, P: int, Lb: int) -> Any:
  """`data` with its completion axis cut to Lb tokens: `*_NxL` leaves to [:, :Lb], the `seq` tuple (prompt +
  completion, T = P + L) to [:, :P + Lb]. Positions past every completion are masked, so the loss is unchanged."""
  out = {}
  for k, v in data.items():
    if k == "seq":
      out[k] = tuple(x[:, :P + Lb] for x in v)
    elif k.endswith("_NxL"):
      out[k] = v[:, :Lb]
    else:
      out[k] = v
  return out
