"""Named reward terms, in-graph (JAX on token ids) or Python (via jax.pure_callback), summed with weights.

A term maps a rollout to outcome scores `r_N` and optionally step scores (`step_r_NxS`, `step_end_NxS`,
`step_valid_NxS`); with an environment it reads the model's own tokens (compute). Python terms never let an
exception cross the callback (undefined behaviour, and the state is donated): they return a status, the step skips
its update in-graph, and the host raises afterwards naming the term.
"""
import math
import threading
from typing import Callable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import errors
from grpo_jax.infra import host_calls
from grpo_jax.rl import obs_mask
from grpo_jax.rl import reward_spec
from grpo_jax.rollout import turns
from grpo_jax.tasks import registry
from grpo_jax.tasks import verify_jax

REGISTRY: dict[str, Callable[..., reward_spec.InGraphFn]] = {}


def register(name: str):
  def deco(make):
    REGISTRY[name] = make
    return make
  return deco


# The in-graph terms read the token tables of the run's tokenizer (verify_jax.tables_for: the shipped one's, or the
# `tools` tokenizer's with its marker pieces); a tokenizer they cannot be built for keeps the old arguments.
@register("format")
def _make_format(ctx: reward_spec.Context) -> reward_spec.InGraphFn:
  tables = verify_jax.tables_for(ctx.tokenizer)
  tables = ctx.tokenizer.tag_ids if tables is None else tables
  return lambda tokens, mask, batch, ctx: reward_spec.outcome(verify_jax.format_reward(tokens, mask, tables))


@register("accuracy")
def _make_accuracy(ctx: reward_spec.Context) -> reward_spec.InGraphFn:
  tables = verify_jax.tables_for(ctx.tokenizer)
  return lambda tokens, mask, batch, ctx: reward_spec.outcome(registry.accuracy_reward(ctx.task, tokens, mask,
                                                                                       batch, tables))


@register("process")
def _make_process(ctx: reward_spec.Context) -> reward_spec.InGraphFn:
  """Rule-checked chain-of-thought steps: outcome = fraction of right steps; per-step scores for process GRPO."""
  tables = verify_jax.tables_for(ctx.tokenizer)

  def fn(tokens, mask, batch, ctx):
    s_r, s_end, s_valid = verify_jax.step_rewards(ctx.task, tokens, mask, batch, ctx.max_steps, tables)
    n = jnp.maximum(s_valid.sum(-1), 1)
    return reward_spec.outcome((s_r * s_valid).sum(-1) / n, (s_r, s_end, s_valid))
  return fn


@register("random")
def _make_random(ctx: reward_spec.Context) -> reward_spec.InGraphFn:
  """Bernoulli(rl.random_reward_rate) per sample, whatever it says (reward_spec.random_reward)."""
  del ctx
  return reward_spec.random_reward


@register("incorrect")
def _make_incorrect(ctx: reward_spec.Context) -> reward_spec.InGraphFn:
  """1 for a well-formed answer that is wrong (format OK, the answer parses, and it is not the reference), else 0:
  spurious rewards' "incorrect" reward (Shao et al. 2025, arXiv 2506.10947, which rewards one wrong label; here
  every wrong answer), the opposite of `accuracy` on the answers that parse."""
  if ctx.task not in verify_jax.INTEGER_ANSWER + ("countdown",):
    raise errors.ConfigError(f"config.rewards: the 'incorrect' term parses answers in-graph, which task "
                             f"{ctx.task!r} does not; use it with {list(verify_jax.INTEGER_ANSWER + ('countdown',))}.")
  tables = verify_jax.tables_for(ctx.tokenizer)

  def fn(tokens, mask, batch, ctx):
    ok_N, _ = verify_jax.answer_value(ctx.task, tokens, mask, batch, tables)
    right_N = registry.accuracy_reward(ctx.task, tokens, mask, batch, tables) > 0.5
    return reward_spec.outcome(ok_N & ~right_N)
  return fn


ENV_FIELDS = ("env_step_r_NxS", "env_step_end_NxS", "env_step_valid_NxS")  # what the rollout adds to the batch


def env_fields(env, max_turns: int) -> dict[str, jax.Array]:
  """The batch fields the 'env' term reads, from a rollout's environment outputs (rollout/turns.py Result: its
  reward_NxL and step_NxL): each answered stop marker a step (turns.step_scores, S = tools.max_turns + 1). The RL
  rollout adds them to its batch; R1 rejection sampling's generate computes the term from them too."""
  return dict(zip(ENV_FIELDS, turns.step_scores(env.reward_NxL, env.step_NxL, int(max_turns) + 1)))


def env_term(tokens, mask, batch, ctx=None) -> reward_spec.TermOutput:
  """The 'env' term on a batch holding env_fields: outcome = the sum of a row's valid step rewards, with the steps."""
  del tokens, mask, ctx
  if ENV_FIELDS[0] not in batch:
    raise ValueError("reward term 'env' reads the environment's rewards: set tools.env (docs/tools.md).")
  s_r, s_end, s_valid = (batch[k] for k in ENV_FIELDS)
  return reward_spec.outcome(jnp.sum(jnp.where(s_valid, s_r, 0.0), axis=-1), (s_r, s_end, s_valid))


@register("env")
def _make_env(ctx: reward_spec.Context) -> reward_spec.InGraphFn:
  """The environment's rewards (tools.env): outcome = the sum of a row's step rewards; each step (an answered stop
  marker, at its position) is a process-reward step, so rl.process_weight gives step-level advantages over turns.
  The rollout puts them into the batch (rollout/turns.py step_scores); without an environment there are none."""
  del ctx
  return env_term


# ----------------------------------------------------------------------------------------------- Python terms

class PythonTermError(errors.RunStopped):
  """Raised on the host after a step whose Python reward term failed (the state was left unchanged)."""


class PythonTerm:
  """Wraps `fn(texts, token_ids, batch_rows) -> scores` for `jax.pure_callback`, catching everything."""

  MAX_HUNG = 4  # abandoned (timed-out) calls still running; beyond this the term fails even with a fallback

  def __init__(self, name: str, fn: reward_spec.PyRewardFn, tokenizer, *, fallback: float | None = None,
               timeout_s: float = 60.0):
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
      raise errors.ConfigError(f"config.rl.reward_timeout_s: must be a number > 0 (seconds a Python reward call may "
                               f"take), got {timeout_s!r}.")
    self.name, self.fn, self.tokenizer = name, fn, tokenizer
    self.fallback, self.timeout_s = fallback, timeout_s
    self.last_error = ""
    # One worker thread (host_calls: a call that times out is abandoned with its daemon thread, counted while it runs).
    self._workers = host_calls.Workers(f"reward-{name}")
    self._lock = threading.Lock()

  def close(self) -> None:
    """Stops the idle worker; hung ones are daemon threads and die with the process."""
    self._workers.close()

  def hung_calls(self) -> int:
    return self._workers.hung()

  def _texts(self, tokens_NxL, mask_NxL):
    ids = [row[m > 0].tolist() for row, m in zip(tokens_NxL, mask_NxL)]
    eos = set(getattr(self.tokenizer, "eos_ids", (self.tokenizer.eos_id,)))  # an HF model may have several
    ended_N = np.asarray([bool(r) and r[-1] in eos for r in ids])
    ids = [r[:-1] if e else r for r, e in zip(ids, ended_N)]
    return [self.tokenizer.decode(r) for r in ids], ids, ended_N

  def host(self, tokens_NxL, mask_NxL, batch):
    """Runs on the host; returns (scores_N float32, status int32, fallbacks int32). Never raises."""
    n = tokens_NxL.shape[0]
    zeros = np.zeros((n,), np.float32)
    try:
      texts, ids, ended_N = self._texts(np.asarray(tokens_NxL), np.asarray(mask_NxL))
      batch_np = {**{k: np.asarray(v) for k, v in batch.items()}, "ended_N": ended_N}
      if self.hung_calls() >= self.MAX_HUNG:
        return self._fail(reward_spec.TIMEOUT, f"{self.MAX_HUNG} earlier calls timed out "
                          f"(reward_timeout_s={self.timeout_s}s) "
                          "and are still running", zeros, fallback_ok=False)
      status, out = self._workers.run(self.fn, [(texts, ids, batch_np)], self.timeout_s)[0]
      if status == reward_spec.TIMEOUT:
        return self._fail(reward_spec.TIMEOUT, f"did not return within reward_timeout_s={self.timeout_s}s", zeros)
      if status == reward_spec.RAISED:
        return self._fail(reward_spec.RAISED, f"{type(out).__name__}: {out}", zeros)
    except Exception as e:  # pylint: disable=broad-except
      return self._fail(reward_spec.RAISED, f"{type(e).__name__}: {e}", zeros)
    try:
      return self._scores(out, n, zeros)
    except Exception as e:  # pylint: disable=broad-except  # an output whose len / iteration raises
      return self._fail(reward_spec.WRONG_TYPE, f"returned {type(out).__name__}, whose scores cannot be read "
                        f"({type(e).__name__}: {e})", zeros)

  def _scores(self, out, n: int, zeros):
    """The function's output checked: n real numbers, each finite in float32 (what the step holds)."""
    try:
      count = len(out)
    except TypeError:  # no __len__, or a 0-d array's len()
      count = None
    if count is None or isinstance(out, host_calls.NOT_SEQUENCES):
      # a dict would be read as its keys, a set in no order, bytes-like as its byte values (b"\x01\x00": [1, 0])
      return self._fail(reward_spec.WRONG_TYPE, f"returned {type(out).__name__}, expected a sequence of {n} floats",
                        zeros)
    if count != n:
      return self._fail(reward_spec.WRONG_LENGTH, f"returned {count} scores for {n} completions", zeros)
    scores = np.zeros((n,), np.float32)
    bad = np.zeros((n,), bool)
    for i, v in enumerate(out):
      if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        why = f"score {i} is {type(v).__name__} ({host_calls.short(v)}), expected a float"
        if self.fallback is None:
          return self._fail(reward_spec.WRONG_TYPE, why, zeros)
        self.last_error = why  # replaced by the fallback: said in the log (train.log_fallbacks)
        bad[i] = True
        continue
      f = host_calls.finite_f32(v)
      if f is None:  # NaN, inf, or beyond float32 (1e39 would be inf in the step)
        why = f"score {i} is {host_calls.short(v)} (not a finite float32)"
        if self.fallback is None:
          return self._fail(reward_spec.NONFINITE, why, zeros)
        self.last_error = why
        bad[i] = True
        continue
      scores[i] = f
    scores[bad] = self.fallback if self.fallback is not None else 0.0
    return scores, np.int32(reward_spec.OK), np.int32(bad.sum())

  def _fail(self, status, msg, zeros, fallback_ok: bool = True):
    with self._lock:
      self.last_error = msg
    replaceable = (reward_spec.RAISED, reward_spec.TIMEOUT, reward_spec.WRONG_LENGTH, reward_spec.WRONG_TYPE)
    if fallback_ok and self.fallback is not None and status in replaceable:
      return np.full_like(zeros, self.fallback), np.int32(reward_spec.OK), np.int32(zeros.shape[0])
    return zeros, np.int32(status), np.int32(0)

  def in_graph(self) -> reward_spec.InGraphFn:
    def fn(tokens, mask, batch, ctx):
      n = tokens.shape[0]
      out_types = (jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32),
                   jax.ShapeDtypeStruct((), jnp.int32))
      # 'sequential': under vmap (seeds) each run calls the host once with its own rows.
      r, status, fb = jax.pure_callback(self.host, out_types, tokens, mask, batch, vmap_method="sequential")
      return reward_spec.TermOutput(r, status, fb)
    return fn

  def error_message(self, status: int) -> str:
    if self.fallback is None:
      fix = ("Fix the function, or set config.rl.reward_fallback to a float to replace bad scores per sample "
             "(counted in train/reward_fallbacks).")
    else:  # the fallback is set: it covers single bad calls, not calls that keep hanging
      fix = (f"config.rl.reward_fallback={self.fallback} is set but does not cover calls that keep hanging (at most "
             f"{self.MAX_HUNG} may run at once); make the function return within config.rl.reward_timeout_s, or "
             "raise that timeout.")
    return (f"reward term '{self.name}' ({getattr(self.fn, '__name__', self.fn)}) {reward_spec.STATUS_TEXT.get(status, status)}: "
            f"{self.last_error}. {fix}")


def build(rewards_cfg: Sequence[tuple[str, float]], ctx: reward_spec.Context,
          python_fns: dict[str, reward_spec.PyRewardFn] | None = None, fallback: float | None = None,
          timeout_s: float = 60.0) -> reward_spec.RewardSpec:
  """`rewards_cfg` entries name in-graph terms from REGISTRY or Python functions given in `python_fns`."""
  python_fns = python_fns or {}
  names, weights, fns, py = [], [], [], {}
  for name, w in rewards_cfg:
    if name in python_fns:
      term = PythonTerm(name, python_fns[name], ctx.tokenizer, fallback=fallback, timeout_s=timeout_s)
      py[name] = term
      fns.append(term.in_graph())
    elif name in REGISTRY:
      fns.append(REGISTRY[name](ctx))
    else:
      known = sorted(set(REGISTRY) | set(python_fns))
      raise errors.ConfigError(f"config.rewards: unknown reward term '{name}'; choose from {known}.")
    names.append(name)
    weights.append(float(w))
  weighted = {n for n, w in zip(names, weights) if w != 0}
  if "process" in weighted and "accuracy" not in weighted:
    logging.warning("config.rewards weights 'process' but not 'accuracy': the process term scores the fraction of "
                    "arithmetically right steps whatever the answer, so padding with '1 + 1 = 2 ;' scores 1; add "
                    "('accuracy', w) (docs/algorithms.md, train/process_on_incorrect).")
  return reward_spec.RewardSpec(tuple(names), tuple(weights), tuple(fns), py, ctx)


def compute(spec: reward_spec.RewardSpec, tokens_NxL, mask_NxL, batch, obs_NxL=None,
            env_ended_N=None) -> tuple[jax.Array, dict, jax.Array, jax.Array, tuple | None]:
  """Weighted sum. Returns (r_N, per-term scores, status (max over terms), fallbacks, weighted step scores).

  With observations (`obs_NxL`, tools.env; `env_ended_N`: the rows the environment's done ended) every term reads
  the model's own tokens (obs_mask.own_tokens): a tool's output cannot be scored as the model's answer or format;
  the environment's reward is the 'env' term's. Step scores read off the own tokens end at their token's transcript
  position."""
  index_NxL = None
  if (obs_NxL is None) != (env_ended_N is None):
    raise ValueError("rewards.compute: give obs_NxL and env_ended_N together (the engine's EnvOut: obs_NxL and "
                     "events_NxE[:, ENDED] > 0), or neither.")
  if obs_NxL is not None:
    tokens_NxL, mask_NxL, index_NxL = obs_mask.own_tokens(tokens_NxL, mask_NxL, obs_NxL, env_ended_N,
                                                          spec.ctx.tokenizer, with_index=True)
  r_N = jnp.zeros((tokens_NxL.shape[0],), jnp.float32)
  per_term, statuses, fallbacks, steps = {}, [], [], None
  for name, w, fn in zip(spec.names, spec.weights, spec.fns):
    out = fn(tokens_NxL, mask_NxL, batch, spec.ctx)
    r_N = r_N + w * out.r_N
    per_term[name] = out.r_N
    statuses.append(out.status)
    fallbacks.append(out.fallbacks)
    if out.steps is not None:
      # terms with steps (process, env) keep their own steps side by side: their layouts differ (S, where they
      # end), and process_advantages normalises every valid step of a group together
      s_r, s_end, s_valid = out.steps
      if index_NxL is not None and name != "env":  # read off the own tokens: back to transcript positions ('env'
        at = jnp.take_along_axis(index_NxL, jnp.clip(s_end, 0, index_NxL.shape[1] - 1), axis=1)  # puts its
        s_end = jnp.where(s_valid, at, s_end).astype(s_end.dtype)  # steps there already)
      steps = (w * s_r, s_end, s_valid) if steps is None else tuple(
          jnp.concatenate([a, b], axis=1) for a, b in zip(steps, (w * s_r, s_end, s_valid)))
  status_vec = jnp.stack(statuses)
  return r_N, per_term, status_vec, jnp.sum(jnp.stack(fallbacks)), steps
