"""Held-out evaluation: greedy accuracy, sampled accuracy, unbiased pass@k, cons@k (majority vote), format rate.

Tasks with an in-graph verifier (arith, countdown) score inside the generate program; tasks verified in Python
(GSM8K: math_answer on decoded text) generate in-graph, gather the rows to the host and score them there with the
same function their training reward uses (the task's host_verifier in tasks/registry.py). Either way every process
computes the same metrics. `Evaluator.rollouts` hands the gathered, graded rows to callers that score more (the R1
report: the last-number rule, language consistency, forbidden words), through the same chunking, sampling and gather.
With tools.env the verifiers and readings read the model's own tokens, as the RL step's reward terms do
(obs_mask.own_tokens); the rows handed back keep the whole transcript and its observation mask.
"""
import collections
import contextlib
import math
import numbers
from typing import Callable, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from grpo_jax.config import config_lib
from grpo_jax.envs import batch as env_batch
from grpo_jax.envs import transcript
from grpo_jax.rl import auto
from grpo_jax.rl import obs_mask
from grpo_jax.rl import reward_spec
from grpo_jax.rl import rewards as rewards_lib
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rollout import engine
from grpo_jax.rollout import sampling
from grpo_jax.rollout import turns
from grpo_jax.infra import host_calls
from grpo_jax.infra import sharding
from grpo_jax.tasks import cot
from grpo_jax.tasks import registry
from grpo_jax.tasks import verify_jax
from grpo_jax.tasks import verify_py

# (tokens_NxL, mask_NxL, fields, group=G) -> (accuracy_N, format_N, answers_N); answers vote in cons@k, within each
# run of G rows (one prompt's samples: G = eval.n_samples sampled, 1 greedy). A task's `host_verifier(tokenizer)` in
# tasks/registry.py returns one.
HostVerifier = Callable[..., tuple[np.ndarray, np.ndarray, list]]


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased estimator of pass@k from n samples with c correct (Chen et al. 2021): 1 − C(n−c, k)/C(n, k)."""
  if k > n:
    raise ValueError(f"eval.pass_k: k={k} exceeds eval.n_samples={n}; raise n_samples or lower k.")
  if k < 1 or not 0 <= c <= n:  # c > n gave 1.0 and c < 0 a negative "probability"; pass@0 is no metric
    raise ValueError(f"pass_at_k: need 1 <= k <= n and 0 <= c <= n right samples of n, got n={n}, c={c}, k={k}.")
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_curve(ok_QxN: np.ndarray, ks) -> dict[int, float]:
  """Mean over prompts of the unbiased pass@k for each k (every k ≤ n = samples per prompt), from one matrix of
  per-sample correctness (Q prompts × n samples, as one sampled generate call with eval.n_samples returns them):
  what a pass@k curve up to k = n (e.g. 256) is read from. Refused (ValueError), as they were read silently: a k
  that is no integer (int() made k = 1.5 pass@1), no prompt (a mean of nothing: NaN) and a NaN correctness (read as
  wrong)."""
  ok_QxN = np.asarray(ok_QxN)
  if ok_QxN.ndim != 2 or ok_QxN.shape[0] == 0:
    raise ValueError(f"pass_at_k_curve: needs a [prompts, samples] correctness matrix with at least one prompt, got "
                     f"shape {ok_QxN.shape}.")
  if not np.all(np.isfinite(ok_QxN.astype(np.float64))):
    raise ValueError("pass_at_k_curve: the correctness matrix holds NaN or inf; score every sample 0 or 1.")
  bad = [k for k in ks if not isinstance(k, numbers.Integral) or isinstance(k, bool)]
  if bad:
    raise ValueError(f"pass_at_k_curve: k={bad[0]!r} is no integer; pass integers 1 <= k <= n.")
  ok_QxN = ok_QxN > 0.5
  n = ok_QxN.shape[1]
  c_Q = ok_QxN.sum(1)
  return {int(k): float(np.mean([pass_at_k(n, int(c), int(k)) for c in c_Q])) for k in ks}


def verified_answers(task: str, tokens_NxL: np.ndarray, mask_NxL: np.ndarray, fields: dict, tok) -> list:
  """What cons@k votes on for a task verified in-graph: each row's answer VALUE where the verifier reads one (format
  OK and the body valid: arith's integer, countdown's expression's value; verify_py.answer_value, verify_jax's
  twin), None elsewhere. Equal answers vote together ('12' / '012', countdown's '3 + 4' / '(4+3)': two right
  expressions are one right answer), a malformed row casts no vote, and every voter of one value is right or wrong
  alike. (The <answer> span's token ids split equal answers and let rows the verifier rejects vote: a wrong
  expression written twice out-voted three different right ones.)"""
  ok_N, val_N = verify_py.answer_value(task, tokens_NxL, mask_NxL, fields, tok)
  return [int(v) if o else None for o, v in zip(ok_N, val_N)]


def cons_at_k(answers: list, correct: list[bool], k: int) -> float:
  """Majority vote over the first k samples' answers (ties → the answer voted first); 1 if the voted answer is
  correct. `answers` are keys, equal where the task's grader calls the answers equal (gsm8k.vote_keys; the in-graph
  tasks' values, verified_answers).
  Self-consistency's vote (Wang et al. 2022, arXiv 2203.11171), reported as cons@k by DeepSeek-R1 (arXiv 2501.12948,
  Table 2). A sample without an answer (None: the verifier found none, a malformed completion) casts no vote."""
  votes = [(a, c) for a, c in zip(answers[:k], correct[:k]) if a is not None]
  if not votes:
    return 0.0
  counts = collections.Counter(a for a, _ in votes)
  best = max(counts.values())
  winner = next(a for a, _ in votes if counts[a] == best)
  return float(any(c for a, c in votes if a == winner))


# make_generate's programs within one job (`shared_programs`), by everything they read. A job's stages build their
# Evaluators anew (SFT's at its end, RL's at its first eval, every R1 stage its own) on the same model, mesh and
# eval settings: the same program, which JAX traces and lowers again per jax.jit object (~0.5 s each for a tiny
# model, more at scale). Only inside a job: the job's process state that tracing also reads (the platform, the
# device memory the decode layout is planned for) is fixed there; outside one, each call builds its own program.
_GENERATE_CACHE: list[collections.OrderedDict] = []
_GENERATE_CACHE_SIZE = 8  # a sweep's points with their own sampling settings add entries; the oldest go


@contextlib.contextmanager
def shared_programs():
  """make_generate returns one program per distinct argument set while this is open (main.execute: one CLI job)."""
  _GENERATE_CACHE.append(collections.OrderedDict())
  try:
    yield
  finally:
    _GENERATE_CACHE.pop()


def generate_view(config):
  """The part of a run's config a generate program reads: `sampling` (its engine, compaction, decode layout and
  attention) and `tools` (the environment's chunk and turn limit); None for None. make_generate builds its program
  from this view alone, so reading any other key fails where the program is traced, and keys its shared programs by
  it: a job's stages that differ elsewhere (an R1 pipeline's RL stages: their rewards and β) share one program per
  sampling setting, where the whole config's JSON gave each RL stage its own, traced and compiled again."""
  if config is None:
    return None
  view = ml_collections.ConfigDict({"sampling": config.sampling.to_dict()})
  if config.get("tools") is not None:
    view.tools = config.tools.to_dict()
  return view


def make_generate(mcfg, scfg: sampling.SamplingConfig, mesh, task: str, tag_ids: dict,
                  in_graph: bool = True, config=None, group: int = 1, tables=None, env=None) -> Callable:
  """make_generate_uncached's program, from the config's generate_view; inside `shared_programs` the same one for
  the same arguments (the view compared by its JSON)."""
  config = generate_view(config)
  if not _GENERATE_CACHE:
    return make_generate_uncached(mcfg, scfg, mesh, task, tag_ids, in_graph, config, group, tables, env)
  cache = _GENERATE_CACHE[-1]
  key = (mcfg, scfg, mesh, task, tuple(sorted(tag_ids.items())), in_graph, group,
         None if config is None else config.to_json(sort_keys=True), id(tables), id(env))
  if key in cache:
    cache.move_to_end(key)
    return cache[key]
  run = cache[key] = make_generate_uncached(mcfg, scfg, mesh, task, tag_ids, in_graph, config, group, tables, env)
  while len(cache) > _GENERATE_CACHE_SIZE:
    cache.popitem(last=False)
  return run


def make_generate_uncached(mcfg, scfg: sampling.SamplingConfig, mesh, task: str, tag_ids: dict,
                           in_graph: bool = True, config=None, group: int = 1, tables=None, env=None) -> Callable:
  """Jitted (params, prompts, fields, rng) -> (tokens_NxL, mask_NxL, lengths_N[, accuracy_N, format_N]); the
  last two only with `in_graph` (a task verified on the host gets its rows back unscored).

  `config`: the run's config; its `sampling.decode_layout` puts the weights into the decode layout once per call,
  before the decode loop, as the RL step's rollout does (rollout.for_rollout: no weight all-gather per token
  under FSDP). None decodes in the params' own layout. `group`: rows come in runs of `group` copies of one prompt
  (eval.n_samples); the continuous engine (config.sampling.engine) prefills each prompt once for its run.
  `tables`: the tokenizer's verify_jax.tables_for (None: the shipped tokenizer's, checked against `tag_ids`).
  `env`: the run's EnvBatch (tools.env, the continuous engine): rows call it as in the RL step, and the outputs end
  with (events_NxE, status_N, obs_NxL, env_r_N): the calls' event counts and worst status, the observation mask
  (the rows' mask covers the observations; the verifiers read the model's own tokens, obs_mask.own_tokens, as the
  RL step's reward terms do), and the 'env' reward term's outcome per row (rl/rewards.py env_term, as the RL step
  computes it: the sum of the row's environment step rewards)."""
  continuous = config is not None and config_lib.setting(config, "sampling.engine") == "continuous"
  if env is not None and not continuous:
    raise ValueError("evaluation with tools.env runs the continuous engine (sampling.engine='continuous').")
  tools = None if env is None else turns.tools_for(config, env)

  def gen(params, prompt_NxP, pmask_NxP, fields, rng):
    decode = None if config is None else rollout_lib.for_rollout(config, mcfg, params)
    if continuous:  # the static engine's uniforms (sampling.uniforms(rng, ...)): the same samples
      u_LxN = sampling.uniforms(rng, scfg.max_new_tokens, prompt_NxP.shape[0])
      levels = int(config_lib.setting(config, "sampling.compaction"))
      env_kw = {} if tools is None else dict(tools=tools, env_fields={k: v[::group] for k, v in fields.items()})
      ro, stats = engine.sample_groups(mcfg, params, prompt_NxP[::group], pmask_NxP[::group], group, scfg,
                                       u_LxN=u_LxN, levels=levels, split=engine.batch_split(), decode=decode,
                                       **engine.attention_kwargs(config, mcfg), **env_kw)
    else:
      ro = sampling.sample(mcfg, params, sharding.constrain_batch(prompt_NxP), pmask_NxP, rng, scfg, decode=decode)
    obs, lengths_N = (), ro.lengths_N
    if tools is not None:  # lengths count the model's own tokens, as the RL step's do
      # the environment's per-row events and the calls' worst status (per row: the outputs are gathered by rows)
      status_N = jnp.full(ro.lengths_N.shape, stats.env.status, jnp.int32)
      env_r_N = rewards_lib.env_term(ro.tokens_NxL, ro.mask_NxL,
                                     rewards_lib.env_fields(stats.env, config.tools.max_turns)).r_N
      obs = (stats.env.events_NxE, status_N, stats.env.obs_NxL, env_r_N)
      lengths_N = ro.lengths_N - stats.env.obs_NxL.sum(axis=1)
    if not in_graph:
      return (ro.tokens_NxL, ro.mask_NxL, lengths_N) + obs
    own = (ro.tokens_NxL, ro.mask_NxL) if tools is None else obs_mask.own_tokens(
        ro.tokens_NxL, ro.mask_NxL, stats.env.obs_NxL, stats.env.events_NxE[:, env_batch.ENDED] > 0, scfg)
    acc = registry.accuracy_reward(task, *own, fields, tables)
    fmt = verify_jax.format_reward(*own, tag_ids if tables is None else tables)
    return (ro.tokens_NxL, ro.mask_NxL, lengths_N, acc, fmt) + obs

  jitted = jax.jit(gen)

  def run(*args):
    if len(args) > 2:  # (params, prompt_NxP, pmask_NxP, fields, rng)
      sampling.check_left_padded(args[2], "generate")
    with sharding.mesh_context(mesh):
      return jitted(*args)
  run.jitted = jitted  # for reading its compiled program (lower/compile under sharding.mesh_context)
  return run


# fn(texts, completion ids, host fields) -> per-row values, a Python reward term's signature: what a caller reads off
# the decoded completions besides the verifier (language consistency, forbidden words, ...).
Reading = reward_spec.PyRewardFn


def default_readings(task: str) -> dict[str, Reading]:
  """`eval/language_consistency` for tasks with worked solutions (tasks/registry.py): their chains of thought are
  written in tasks/cot.py's two languages. Other tasks (GSM8K: English text) have no such reading."""
  if not registry.get(task).worked_solutions:
    return {}
  return {"language_consistency": cot.language_consistency_term}


def completions(tokens_NxL: np.ndarray, mask_NxL: np.ndarray, eos) -> list[tuple[int, ...]]:
  """Each row's completion ids without the EOS (`eos`: an id or a tuple of ids): what Python rewards and readings
  decode."""
  eos = {eos} if isinstance(eos, (int, np.integer)) else set(eos)
  out = []
  for t, m in zip(tokens_NxL, mask_NxL):
    ids = [int(x) for x in t[m > 0]]
    out.append(tuple(ids[:-1] if ids and ids[-1] in eos else ids))
  return out


def to_host(out) -> list[np.ndarray]:
  """A generate call's outputs as host arrays. Rows are split over the data axes, across processes too: gather them
  (a no-op copy on one process)."""
  return [np.asarray(x) for x in multihost_utils.process_allgather(out, tiled=True)]


def group_metrics(ok_N: np.ndarray, answers_N: list, n: int, pass_k) -> dict[str, float]:
  """pass@k for each k and cons@n over prompt-major groups of n samples (`ok_N` > 0.5: a right sample)."""
  ok_QxN = np.asarray(ok_N).reshape(-1, n)
  m = {f"pass@{k}": v for k, v in pass_at_k_curve(ok_QxN, pass_k).items()}
  ans_QxN = [answers_N[i * n:(i + 1) * n] for i in range(ok_QxN.shape[0])]
  m[f"cons@{n}"] = float(np.mean([cons_at_k(a, list(c > 0.5), n) for a, c in zip(ans_QxN, ok_QxN)]))
  return m


class Rollouts(NamedTuple):
  """One generate pass over the eval set, on the host; rows are prompt-major (`repeat` consecutive rows a prompt)."""
  tokens_NxL: np.ndarray
  mask_NxL: np.ndarray
  lengths_N: np.ndarray
  accuracy_N: np.ndarray
  format_N: np.ndarray
  answers_N: list                 # what cons@k votes on: the verifier's answer, None where it found none
  fields: dict[str, np.ndarray]   # the eval set's host fields (answer_N, language_N, ...), repeated like the rows
  texts: list[str] | None         # completions decoded without EOS (the model's own tokens: Evaluator.own); None
                                  # when the Evaluator has no readings
  readings: dict[str, np.ndarray]  # per-row value of each reading
  obs_NxL: np.ndarray | None = None  # tools.env: 1 where a token was fed from an observation (mask_NxL covers it)
  events_NxE: np.ndarray | None = None  # tools.env: per row, its calls' envs/batch.py event counts
  env_status: int | None = None  # tools.env: the calls' worst status (host_calls.OK unless a call failed whole)


class Evaluator:
  """Evaluates params on a fixed held-out set; all shapes static so each generate function compiles once."""

  def __init__(self, config, mcfg, tokenizer, mesh, eval_arrays: dict, task: str | None = None,
               host_verifier: HostVerifier | None = None, readings: dict[str, Reading] | None = None):
    # The decode plan (engine, exit chunk, compaction, decode attention and layout) of what this evaluation decodes:
    # eval.batch rows, sized by auto.resolve_eval from eval.* and sampling.*, not from the RL batch (rl.* is not
    # read: an SFT job's evaluation was planned from rl.partial_rollouts and prompts_per_step x G). `config` is
    # unresolved, or resolved by resolve_eval already (an RL run's evaluation, train.train_group: planned beside its
    # resident RL state), which this leaves as it is; a config an RL run resolved for its rollout would reuse the
    # rollout's plan, so no caller passes one.
    config, _ = auto.resolve_eval_here(config, mesh)
    self.cfg, self.tok, self.mesh = config, tokenizer, mesh
    # tools.env: held-out rows call the environment as the RL step's do (with the continuous engine)
    self.env = None
    if config.get("tools") is not None and config.tools.env and config.sampling.get("engine") == "continuous":
      self.env = env_batch.build(config, tokenizer)
    self.task = task or config.task.name
    if host_verifier is None and registry.get(self.task).host_verifier is not None:
      host_verifier = registry.get(self.task).host_verifier(tokenizer)
    self.host_verifier = host_verifier
    self.readings = default_readings(self.task) if readings is None else dict(readings)
    # Generate decodes in the run's decode layout; a task verified on the host gets its rows back unscored.
    host = {"config": config} if host_verifier is None else {"in_graph": False, "config": config}
    host["tables"] = verify_jax.tables_for(tokenizer)  # the `tools` tokenizer's marker pieces are text
    host["env"] = self.env
    self.arrays = eval_arrays
    self.batch = config.eval.batch
    n = eval_arrays["prompt_NxP"].shape[0]
    if n % self.batch:
      raise ValueError(f"eval.size={n} must be a multiple of eval.batch={self.batch}.")
    scfg = lambda **kw: sampling.SamplingConfig.from_config(  # untruncated: top-k / top-p off
        config.sampling, eos_id=getattr(tokenizer, "eos_ids", tokenizer.eos_id), pad_id=tokenizer.pad_id, top_k=0, top_p=1.0, **kw)
    self.greedy = make_generate(mcfg, scfg(greedy=True, temperature=1.0), mesh, self.task, tokenizer.tag_ids, **host)
    self.sampled = make_generate(mcfg, scfg(), mesh, self.task, tokenizer.tag_ids, group=config.eval.n_samples,
                                 **host)

  def own(self, tokens_NxL: np.ndarray, mask_NxL: np.ndarray, obs_NxL: np.ndarray | None,
          events_NxE: np.ndarray | None):
    """The rows as the verifiers and readings read them: the model's own tokens (obs_mask.own_tokens)."""
    if obs_NxL is None:
      return tokens_NxL, mask_NxL
    return obs_mask.own_tokens(tokens_NxL, mask_NxL, obs_NxL, events_NxE[:, env_batch.ENDED] > 0, self.tok, xp=np)

  def _chunks(self, repeat: int):
    n = self.arrays["prompt_NxP"].shape[0]
    step = self.batch // repeat
    for s in range(0, n, step):
      yield {k: np.repeat(v[s:s + step], repeat, axis=0) for k, v in self.arrays.items()}

  def rollouts(self, params, rng, sampled: bool = False) -> Rollouts:
    """Greedy completions of every eval prompt, or `eval.n_samples` sampled ones each; chunk i draws from
    fold_in(rng, i)."""
    repeat = self.cfg.eval.n_samples if sampled else 1
    if self.batch % repeat:
      raise ValueError(f"eval.batch={self.batch} must be a multiple of eval.n_samples={repeat}.")
    fn = self.sampled if sampled else self.greedy
    outs, answers, chunk_fields = [], [], []
    for i, chunk in enumerate(self._chunks(repeat)):
      fields = {k: v for k, v in chunk.items() if k not in ("prompt_NxP", "prompt_mask_NxP")}
      out = to_host(fn(params, chunk["prompt_NxP"], chunk["prompt_mask_NxP"], fields, jax.random.fold_in(rng, i)))
      if self.env is not None:
        out.pop()  # the 'env' term's per-row reward: rejection sampling ranks by it; evaluation reports none
      obs = [out.pop(), out.pop(), out.pop()] if self.env is not None else None  # obs, status, events
      own = self.own(out[0], out[1], *((None, None) if obs is None else (obs[0], obs[2])))
      if self.host_verifier is not None:
        # fields: this chunk's host rows, same order; a prompt's `repeat` rows are consecutive, within the chunk
        acc, fmt, ans = self.host_verifier(*own, fields, group=repeat)
        out += [acc, fmt]
        answers += list(ans)
      else:
        answers += verified_answers(self.task, *own, fields, self.tok)
      outs.append(out + ([] if obs is None else obs))
      chunk_fields.append(fields)
    tokens, mask, lengths, acc, fmt, *obs = [np.concatenate(x) for x in zip(*outs)]
    obs, env_status, events = obs if obs else (None, None, None)
    fields = {k: np.concatenate([f[k] for f in chunk_fields]) for k in chunk_fields[0]}
    texts, readings = None, {}
    if self.readings:
      comps = completions(*self.own(tokens, mask, obs, events), getattr(self.tok, "eos_ids", self.tok.eos_id))
      texts = [self.tok.decode(c) for c in comps]
      readings = {name: np.asarray(f(texts, comps, fields), np.float32) for name, f in self.readings.items()}
    return Rollouts(tokens, mask, lengths, acc, fmt, answers, fields, texts, readings, obs, events,
                    None if env_status is None else int(env_status.max()))

  def __call__(self, params, rng, with_samples: bool = True) -> tuple[dict[str, float], list[str]]:
    g = self.rollouts(params, rng)
    right = g.accuracy_N > 0.5
    side_len = lambda sel: float(g.lengths_N[sel].mean()) if sel.any() else float("nan")  # none: no length
    m = {"eval/accuracy": float(g.accuracy_N.mean()), "eval/format_rate": float(g.format_N.mean()),
         "eval/completion_len_mean": float(g.lengths_N.mean()),
         "eval/completion_len_correct": side_len(right), "eval/completion_len_incorrect": side_len(~right)}
    m.update({f"eval/{name}": float(v.mean()) for name, v in g.readings.items()})
    if g.obs_NxL is not None:  # tool calls, turns, observation tokens, accuracy with and without a call
      r = transcript.readings(g.mask_NxL, g.obs_NxL, g.events_NxE)
      ev = g.events_NxE  # the environment's failures are counted as in training (they were not before)
      m.update({f"eval/{k}": v for k, v in transcript.summary(
          r, right, ev[:, env_batch.TOOL_ERROR], ev[:, env_batch.TOOL_TIMEOUT], ev[:, env_batch.FALLBACK]).items()})
      m["eval/tool_call_failed"] = float(g.env_status != host_calls.OK)
      if g.env_status != host_calls.OK:  # rows that waited for it ended: this evaluation is not the model's alone
        logging.warning("evaluation: %s (eval/tool_call_failed=1: the rows that waited for it ended there)",
                        self.env.error_message(g.env_status))
      elif ev[:, env_batch.FALLBACK].sum() and self.env.last_error:
        logging.warning("evaluation: %d environment step(s) fell back (eval/tool_fallbacks), e.g. %s",
                        int(ev[:, env_batch.FALLBACK].sum()), self.env.last_error)
    texts = [self.tok.decode(t[mk > 0].tolist()) for t, mk in zip(g.tokens_NxL[:3], g.mask_NxL[:3])]
    if with_samples:
      n = self.cfg.eval.n_samples
      s = self.rollouts(params, jax.random.fold_in(rng, 10_000), sampled=True)
      m["eval/accuracy_sampled"] = float(s.accuracy_N.reshape(-1, n).mean())
      m.update({f"eval/{k}": v for k, v in group_metrics(s.accuracy_N, s.answers_N, n, self.cfg.eval.pass_k).items()})
    return m, texts
