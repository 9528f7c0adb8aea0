"""Training tables on a generated task (h, k, l): S seeds of each variant in ONE vmapped program on arithmetic.

The task (`cfg.run.task`, arith) is contamination-free by construction: every example is a pure function of the
task's knobs, seed, split and index, and a train example is redrawn while it collides with a test example
(tasks/base.py), so the held-out prompts are in no data the model saw. Every seed and variant starts from one SFT
policy trained on the train split's reference chains of thought (`cfg.run.sft`), run once into a cache directory
under the system temp dir named by the hash of what it reads (a rerun, another variant or another of these tables
reuses it; delete it to rebuild). A variant is `(name, overrides)` of `cfg.run`, as in train_table; its S seeds
differ in their rollouts and train on the same batches through train_table.train_seeds (train.rl_loop).

Recorded per seed: the reward terms' training curves (terms at weight 0 are measured, not trained on), held-out
greedy accuracy on `cfg.run.eval.size` test prompts every `eval_every` steps, and with `cfg.passk_n` > 0 the
unbiased pass@k curve (evaluation.pass_at_k_curve) of `cfg.passk_prompts` test prompts from `passk_n` samples each
at step 0 (the start: the base) and at the end, from one sampled generate call per chunk of prompts.
"""
import hashlib
import json
import os
import tempfile

import jax
import ml_collections
import numpy as np

from grpo_jax.config import config_lib
from grpo_jax.config import presets
from grpo_jax.infra import params_ckpt
from grpo_jax.infra import sharding
from grpo_jax.infra import workdir_lock
from grpo_jax.model import model as model_lib
from grpo_jax.rl import auto
from grpo_jax.rl import state as state_lib
from grpo_jax.rollout import sampling
from grpo_jax.run import evaluation
from grpo_jax.run import train
from grpo_jax.run import validate
from grpo_jax.studies import stats
from grpo_jax.studies import vmapped_runs as seeds_lib
from grpo_jax.studies.ablations import train_table
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import registry
from grpo_jax.tasks import tokenizer_factory as tok_lib
from grpo_jax.tasks import verify_jax

TITLE = "Training ablation on a generated task"
CLAIM = ""
# the pass@k curve's k (every k of 1..passk_n is computed for the crossover; these are stored and plotted)
CURVE_K = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def run_config(small: bool) -> ml_collections.ConfigDict:
  """The tables' run: 1-digit + and − (200 distinct problems: 50 held out, the other 150 the train split's), a
  2-layer 64-wide model SFT'd on the train split's worked solutions, then GRPO (its preset) on 8 prompts × G = 8 per
  step, lr 1e-4 as the main job (configs/grpo_arith.py)."""
  c = presets.apply(config_lib.base_config(), "grpo")
  c.model.update(hidden=64, layers=2, heads=4, kv_heads=2, inter=192, max_len=96)
  c.task.update(name="arith", max_digits=1, ops="+-", prompt_len=40, language="a", test_size=50)
  c.sampling.max_new_tokens = 48
  c.sft.update(steps=300, batch=32, lr=3e-3, warmup_steps=30, loss_on="completion")
  c.rl.update(G=8, prompts_per_step=8, mu=1, minibatches=1, packing="off")
  c.optim.update(lr=1e-4, warmup_steps=0, grad_clip=1.0)
  c.eval.update(size=50, batch=50, n_samples=5, pass_k=(1, 5))
  c.rewards = (("accuracy", 1.0),)
  c.log.update(tensorboard=False, plots=False)
  if small:
    c.model.update(hidden=32, layers=1, heads=2, kv_heads=1, inter=64)
    c.sft.update(steps=4, batch=8, warmup_steps=0)
    c.rl.update(G=4, prompts_per_step=2)
    c.task.update(test_size=16)
    c.sampling.max_new_tokens = 40  # the longest worked solution (40 tokens with EOS): a right answer fits
    c.eval.update(size=8, batch=8, n_samples=4, pass_k=(1, 2))
  return c


def table_config(arg: str | None, variants: tuple, *, steps: int = 100, eval_every: int = 20,
                 passk_n: int = 0) -> ml_collections.ConfigDict:
  """The shared config of tables h, k, l (configs/ablations/*.py start from it); `arg`: nothing or `small` (a
  plumbing check: a tiny model from a 4-step SFT, a few steps, 2 seeds; not a measurement). `passk_n` > 0: pass@k
  curves from that many samples per prompt at the start and the end."""
  small = config_lib.parse_arg(arg, small=False).small
  c = ml_collections.ConfigDict()
  c.table = "task_table"
  c.seeds = 5
  c.steps, c.eval_every = steps, eval_every
  c.fast_compile = False  # the 72-token rollouts run long enough for XLA's optimisations to pay for their compile
  c.passk_n, c.passk_prompts, c.passk_chunk = passk_n, 50, 5  # samples per prompt, prompts, prompts per call
  # > 0: the training accuracy a run must reach to count as saturated, and the one-shot readings (table l); 0 = off
  c.saturation = 0.0
  c.run = run_config(small)
  c.variants = variants
  if small:
    c.seeds, c.steps, c.eval_every = 2, 3, 3
    c.passk_n, c.passk_prompts, c.passk_chunk = min(passk_n, 8), 4, 4
  return c


def variants(cfg) -> list[str]:
  return [name for name, _ in cfg.variants]


def _fingerprint(tree) -> str:
  text = json.dumps(json.loads(tree.to_json_best_effort()), sort_keys=True)
  return hashlib.sha1(text.encode()).hexdigest()[:12]


def build_config(cfg, overrides) -> ml_collections.ConfigDict:
  """A variant's run config: `cfg.run` with its overrides, validated like a run of `main` (one line naming the key
  on a bad value), run for the table's steps with its measurements every `eval_every` (train_table.table_run)."""
  c = config_lib.override(cfg.run, overrides)
  validate.validate_rl(c, 1, tok_lib.for_config(c))
  validate.validate_groups(c)
  if int(cfg.get("passk_n", 0)) > 0 and registry.generated(c.task.name) and cfg.passk_prompts > c.task.test_size:
    # was refused only at the base's pass@k, after the start policy had trained, and as 'eval.size' (a key not set)
    raise config_lib.ConfigError(f"config.passk_prompts={cfg.passk_prompts} exceeds the test split's "
                                 f"run.task.test_size={c.task.test_size} prompts; lower it or raise "
                                 "config.run.task.test_size.")
  return train_table.table_run(c, cfg.steps, cfg.eval_every)


_STARTS: dict[str, object] = {}


def start_params(cfg, mcfg):
  """The SFT policy every seed and variant starts from (and its reference), trained once per (model, task, sft,
  seed) into the temp dir and reused (train.run_sft; its final params checkpoint is checksummed)."""
  c = cfg.run
  key = "-".join(_fingerprint(g) for g in (c.model, c.task, c.sft)) + f"-{c.seed}"
  if key in _STARTS:
    return _STARTS[key]
  workdir = os.path.join(tempfile.gettempdir(), f"grpo_jax_task_start_{key}")
  path = os.path.join(workdir, "params")
  # shared by every table of this config on the machine: two tables training it at once would write the same
  # checkpoints, so the second is refused naming the first (DIR/run.lock, workdir_lock.py)
  with workdir_lock.WorkdirLock(workdir):
    if not os.path.exists(path):
      train.run_sft(c, workdir, evaluate_at_end=False)
    abstract = state_lib.abstract_params(sharding.make_mesh(c.mesh, jax.devices()[:1]), mcfg)
    _STARTS[key] = params_ckpt.load_params(path, abstract)
  return _STARTS[key]


_EVALUATORS: dict[str, object] = {}


def _greedy(c, mcfg, tok, mesh):
  """The held-out greedy evaluator, shared by the variants (they differ in rl.* and rewards, which it does not
  read): its generate program compiles once per table."""
  key = "-".join(_fingerprint(g) for g in (c.model, c.task, c.sampling, c.eval))
  if key not in _EVALUATORS:
    _EVALUATORS[key] = evaluation.Evaluator(c, mcfg, tok, mesh, data_lib.eval_set(c.task, tok, c.eval.size,
                                                                                   c.task.prompt_len), readings={})
  return _EVALUATORS[key]


def _sampler(c, mcfg, tok, mesh, n: int):
  """One sampled generate program for chunks of prompts × n samples (temperature sampling.temperature, untruncated),
  scored in-graph: -> fn(params, arrays of a chunk, rng) -> correct [prompts × n]."""
  key = "passk-" + "-".join(_fingerprint(g) for g in (c.model, c.task, c.sampling)) + f"-{n}"
  if key not in _EVALUATORS:
    scfg = sampling.SamplingConfig.from_config(c.sampling, eos_id=getattr(tok, "eos_ids", tok.eos_id),
                                               pad_id=tok.pad_id, top_k=0, top_p=1.0)
    gen = evaluation.make_generate(mcfg, scfg, mesh, c.task.name, tok.tag_ids, config=c, group=n,
                                   tables=verify_jax.tables_for(tok))

    def fn(params, arrays, rng):
      rows = {k: np.repeat(v, n, axis=0) for k, v in arrays.items()}
      fields = {k: v for k, v in rows.items() if k not in ("prompt_NxP", "prompt_mask_NxP")}
      out = evaluation.to_host(gen(params, rows["prompt_NxP"], rows["prompt_mask_NxP"], fields, rng))
      return out[3].reshape(-1, n)
    _EVALUATORS[key] = fn
  return _EVALUATORS[key]


def passk_counts(cfg, c, mcfg, tok, mesh, params, rng) -> np.ndarray:
  """Right samples per prompt (Q) out of cfg.passk_n, for the first cfg.passk_prompts test prompts."""
  n, Q, chunk = int(cfg.passk_n), int(cfg.passk_prompts), int(cfg.passk_chunk)
  arrays = data_lib.eval_set(c.task, tok, Q, c.task.prompt_len)
  fn = _sampler(c, mcfg, tok, mesh, n)
  counts = []
  for i, s in enumerate(range(0, Q, chunk)):
    part = {k: v[s:s + chunk] for k, v in arrays.items()}
    counts.append(fn(params, part, jax.random.fold_in(rng, i)).sum(1))
  return np.concatenate(counts).astype(np.int64)


def curve(counts_Q: np.ndarray, n: int, ks) -> np.ndarray:
  """Mean over prompts of the unbiased pass@k (evaluation.pass_at_k) for each k of `ks`."""
  return np.asarray([np.mean([evaluation.pass_at_k(n, int(c), int(k)) for c in counts_Q]) for k in ks])


def crossover_k(rl_K: np.ndarray, base_K: np.ndarray, ks) -> float:
  """Yue et al. 2025's crossover: where RL is ahead at the first k and the base strictly ahead at the last, the
  smallest k (of `ks`, ascending) from which the RL policy is never again at least the base; nan otherwise (RL
  ahead or tied at the last k: no crossover up to k = n; RL not ahead at k = 1: the base is never behind)."""
  if not (rl_K[0] > base_K[0] and base_K[-1] > rl_K[-1]):
    return float("nan")
  last = int(np.flatnonzero(rl_K >= base_K)[-1])
  return float(ks[last + 1])


def eval_configs(cfg, c, mesh, lanes: int):
  """(the greedy Evaluator's config, the pass@k sampler's): `c` unresolved, each decode planned for what it decodes
  (auto.resolve_eval: eval.batch rows; passk_chunk prompts x passk_n), beside the seeds' resident state; not the
  rollout's plan, which the variants' rl.* change."""
  n = max(int(cfg.passk_n), 1)
  passk = config_lib.override(c, {"eval.batch": int(cfg.passk_chunk) * n, "eval.n_samples": n})
  return tuple(auto.resolve_eval_here(x, mesh, rl_state=True, lanes=lanes)[0] for x in (c, passk))


def run_cell(cfg, variant: str, seeds: list[int]) -> dict:
  c = build_config(cfg, dict(cfg.variants)[variant])
  tok = tok_lib.for_config(c)
  unresolved = c
  spec = train.reward_terms(c, tok)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  c, mesh, mcfg, states, program, chosen = train_table.make_runs(cfg, c, spec, seeds, tok, start_params(cfg, mcfg),
                                                         init_seeds=[c.seed] * len(seeds))
  S, steps = len(seeds), int(cfg.steps)
  c_eval, c_passk = eval_configs(cfg, unresolved, mesh, S)
  greedy = _greedy(c_eval, mcfg, tok, mesh)
  train_curves = {n: [] for n in spec.names}
  zero_std, kl, resets, eval_x, heldout = [], [], [], [], []
  counts: dict[int, list[np.ndarray]] = {}

  def evaluate(t, states):  # step 0, every eval_every steps, the last step
    eval_x.append(t)
    params_S = [seeds_lib.unstack(states["params"], s) for s in range(S)]
    heldout.append([float(greedy.rollouts(p, jax.random.PRNGKey(0)).accuracy_N.mean()) for p in params_S])
    if cfg.passk_n > 0 and t in (0, steps):
      counts[t] = [passk_counts(cfg, c_passk, mcfg, tok, mesh, p, jax.random.PRNGKey(1000 * seeds[s] + t))
                   for s, p in enumerate(params_S)]

  def observe(t, batch, m):
    sm = seeds_lib.host_scalars(m)
    for n in spec.names:
      train_curves[n].append(sm[f"train/reward/{n}"])
    zero_std.append(sm["train/frac_zero_std_groups"])
    kl.append(sm["train/kl"] if "train/kl" in sm else np.zeros(S))
    resets.append(sm["train/ref_reset"] if "train/ref_reset" in sm else np.zeros(S))

  n_prompts = c.rl.prompts_per_step * (c.rl.oversample if c.rl.dynamic_sampling else 1)
  data = data_lib.rl_batches(c.task, tok, "train", n_prompts, c.seed, 0, c.task.prompt_len)  # shared by the seeds
  train_table.train_seeds(c, mesh, mcfg, states, program, spec, tok, batches=data, evaluate=evaluate,
                          observe=observe)
  as_sxt = lambda rows: np.asarray(rows, np.float64).T  # [steps][seeds] -> seeds × steps
  held, tail, x = as_sxt(heldout), slice(int(steps * 0.8), None), list(range(1, steps + 1))
  scalars = {"heldout_acc_final": held[:, -1].tolist(), "heldout_gain": (held[:, -1] - held[:, 0]).tolist()}
  for n, v in train_curves.items():
    scalars[f"train_{n}_last20%"] = as_sxt(v)[:, tail].mean(1).tolist()
    scalars[f"train_{n}_first10"] = as_sxt(v)[:, :10].mean(1).tolist()
  scalars["frac_zero_std_groups_mean"] = as_sxt(zero_std).mean(1).tolist()
  scalars["kl_last20%"] = as_sxt(kl)[:, tail].mean(1).tolist()
  curves = {f"train reward: {n}": {"x": x, "y": as_sxt(v).tolist()} for n, v in train_curves.items()}
  curves["fraction of groups without signal"] = {"x": x, "y": as_sxt(zero_std).tolist()}
  curves["KL to the reference (k3)"] = {"x": x, "y": as_sxt(kl).tolist()}
  curves["held-out greedy accuracy"] = {"x": eval_x, "y": held.tolist()}
  if cfg.saturation > 0 and "accuracy" in train_curves:
    acc = as_sxt(train_curves["accuracy"])
    scalars.update(_saturation(cfg, acc, held, eval_x))
  if counts:
    scalars.update(_passk_scalars(cfg, counts[0], counts[steps], curves))
  if resets and np.asarray(resets).any():
    scalars["ref_resets"] = as_sxt(resets).sum(1).tolist()
  return {"scalars": scalars, "curves": curves, "auto": chosen}


def _saturation(cfg, acc_SxT: np.ndarray, held_SxE: np.ndarray, eval_x: list[int]) -> dict:
  """One-shot RLVR's reading (table l): the first step whose sampled training accuracy reaches cfg.saturation (nan
  if none), the held-out accuracy at the first evaluation from that step on, and its change to the end."""
  out = {"saturation_step": [], "heldout_at_saturation": [], "heldout_after_saturation": []}
  for acc, held in zip(acc_SxT, held_SxE):
    hit = np.flatnonzero(acc >= cfg.saturation - 1e-9)
    t = float(hit[0] + 1) if hit.size else float("nan")
    at = [i for i, x in enumerate(eval_x) if np.isfinite(t) and x >= t]
    out["saturation_step"].append(t)
    out["heldout_at_saturation"].append(float(held[at[0]]) if at else float("nan"))
    out["heldout_after_saturation"].append(float(held[-1] - held[at[0]]) if at else float("nan"))
  return out


def _passk_scalars(cfg, base_S: list, rl_S: list, curves: dict) -> dict:
  """pass@k of the start (base) and of the trained policy per seed, their paired difference, and the crossover."""
  n = int(cfg.passk_n)
  ks_all = list(range(1, n + 1))
  ks = [k for k in CURVE_K if k <= n]
  base_SxK = np.stack([curve(b, n, ks_all) for b in base_S])
  rl_SxK = np.stack([curve(r, n, ks_all) for r in rl_S])
  idx = [k - 1 for k in ks]
  curves["pass@k of the base (step 0)"] = {"x": ks, "y": base_SxK[:, idx].tolist(), "xlabel": "k", "xscale": "log"}
  curves["pass@k after RL"] = {"x": ks, "y": rl_SxK[:, idx].tolist(), "xlabel": "k", "xscale": "log"}
  curves["pass@k: after RL − base (paired)"] = {"x": ks, "y": (rl_SxK - base_SxK)[:, idx].tolist(), "xlabel": "k",
                                                "xscale": "log"}
  out = {}
  for k in sorted({1, min(16, n), n}):
    out[f"pass@{k}_base"] = base_SxK[:, k - 1].tolist()
    out[f"pass@{k}"] = rl_SxK[:, k - 1].tolist()
    out[f"pass@{k}_gain"] = (rl_SxK[:, k - 1] - base_SxK[:, k - 1]).tolist()
  out["crossover_k"] = [crossover_k(r, b, ks_all) for r, b in zip(rl_SxK, base_SxK)]
  out["crossed"] = [float(np.isfinite(x)) for x in out["crossover_k"]]
  return out


def header(cfg) -> str:
  c = cfg.run
  rewards = {name: ", ".join(f"{w:g}·{n}" for n, w in dict(o).get("rewards", c.rewards)) for name, o in cfg.variants}
  lines = [f"Task {c.task.name} ({c.task.max_digits}-digit, ops {c.task.ops!r}; contamination-free: generated, train "
           f"and test disjoint by construction). Start: a {c.model.layers}-layer, {c.model.hidden}-wide model after "
           f"{c.sft.steps} SFT steps of {c.sft.batch} worked solutions (train split), shared by every seed and "
           f"variant (and its reference). RL: {cfg.steps} steps of {c.rl.prompts_per_step} prompts × G={c.rl.G}, "
           f"lr {c.optim.lr:g}, L={c.sampling.max_new_tokens}; {cfg.seeds} seeds per variant (their rollouts "
           f"differ; same prompts), vmapped. Held-out greedy accuracy on {c.eval.size} test prompts every "
           f"{cfg.eval_every} steps."]
  if cfg.passk_n:
    lines.append(f"pass@k: the unbiased estimator from {cfg.passk_n} samples (temperature "
                 f"{c.sampling.temperature:g}) of each of the first {cfg.passk_prompts} test prompts, at step 0 (the "
                 "base) and at the end, per seed; crossover_k = the smallest k from which the base's pass@k stays "
                 "above the RL policy's, where RL leads at k = 1 and the base at k = n (nan: no crossover; `crossed` "
                 "= the share of seeds with one).")
  lines.append("Rewards per variant: " + "; ".join(f"{k}: {v}" for k, v in rewards.items()) + ".")
  return " ".join(lines)


def verdict(cfg, summaries) -> str:
  """Each variant's held-out gain over the start, and whether its interval excludes 0."""
  parts = []
  for name in variants(cfg):
    s = summaries[name].get("heldout_gain")
    if s is None:
      continue
    word = "excludes 0" if s.n >= 2 and (s.low > 0 or s.high < 0) else "includes 0"
    parts.append(f"{name}: held-out gain {s.fmt()} ({word})")
  return "; ".join(parts) + "."


def appendix(cfg, cells: dict) -> str:
  """Paired differences of every variant's held-out gain against the first variant's (the same seeds' rollouts
  differ, so the pairing is by seed index over the same starting policy and prompts)."""
  names = variants(cfg)
  if len(names) < 2:
    return ""
  first = np.asarray(cells[names[0]]["scalars"]["heldout_acc_final"], np.float64)
  lines = [f"### Held-out accuracy at the end against `{names[0]}` (paired by seed)", "",
           "| variant | difference | 95% CI |", "|---|---|---|"]
  for name in names[1:]:
    d = stats.summarize(np.asarray(cells[name]["scalars"]["heldout_acc_final"], np.float64) - first)
    lines.append(f"| {name} | {d.mean:+.4g} | [{d.low:+.3g}, {d.high:+.3g}] |")
  return "\n".join(lines) + "\n"
