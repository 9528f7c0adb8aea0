"""Table g: an R1 RL stage's variants (GRPO's summed vs GDPO's per-term reward normalisation), S seeds vmapped.

The stage (`cfg.stage`, the R1 pipeline's r1_2_grpo: accuracy + 0.5·format + 0.5·language consistency, the other
tracked terms at weight 0) runs from the pipeline's own cold-start params: its `base` and `r1_1_cold_start` stages
are run once into a cache directory under the system temp dir, named by the hash of `cfg.run` (so a rerun, or the
other variant, reuses them; delete it to rebuild), or from one shared random init (`cfg.start_from='random'`, the
`:small` plumbing check). Each variant is `(name, overrides)` of the stage's config, as in train_table; its S seeds
differ in their rollouts and train in ONE vmapped program on the same prompts. Recorded per seed: every weighted
term's training curve, the fraction of groups without signal, and held-out greedy accuracy (tagged: format and
answer), format rate and language consistency (r1/heldout.py's evaluator) every `eval_every` steps.
"""
import hashlib
import json
import os
import tempfile

import jax
import numpy as np

from grpo_jax.infra import params_ckpt
from grpo_jax.config import config_lib
from grpo_jax.model import model as model_lib
from grpo_jax.studies import vmapped_runs as seeds_lib
from grpo_jax.studies.ablations import train_table
from grpo_jax.infra import sharding
from grpo_jax.infra import workdir_lock
from grpo_jax.rl import state as state_lib
from grpo_jax.run import train
from grpo_jax.run import validate
from grpo_jax.studies import stats
from grpo_jax.r1 import heldout
from grpo_jax.r1 import layout
from grpo_jax.r1 import pipeline
from grpo_jax.r1 import rewards as r1_rewards
from grpo_jax.r1 import stage_config
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib

TITLE = "R1 stage ablation"
CLAIM = ""
HELDOUT = (("accuracy", "accuracy_N"), ("format", "format_N"))  # held-out greedy metrics from Rollouts fields


def variants(cfg) -> list[str]:
  return [name for name, _ in cfg.variants]


def build_config(cfg, overrides):
  """The stage's run config (r1/stage_config.for_stage: its steps and reward mix) with a variant's overrides,
  validated like a run of `main` (one line naming the key on a bad value). The statistics the pipeline tracks at
  weight 0 are left out: they change nothing in training and each costs a host call per step."""
  c = config_lib.override(stage_config.for_stage(cfg.run, cfg.stage), overrides)
  c.rewards = tuple((n, w) for n, w in c.rewards if w != 0)
  validate.validate_rl(c, 1, tok_lib.for_config(c))
  return train_table.table_run(c, c.train.steps, cfg.eval_every)


def _fingerprint(config) -> str:
  return hashlib.sha1(json.dumps(json.loads(config.to_json_best_effort()), sort_keys=True).encode()).hexdigest()[:12]


_STARTS: dict[str, object] = {}
_EVALUATORS: dict[str, object] = {}


def evaluator(c):
  """heldout.make_evaluator(c), shared by the variants: they differ in rl.* only, which evaluation does not read,
  so its generate functions compile once per table."""
  key = "-".join(_fingerprint(g) for g in (c.model, c.task, c.sampling, c.mesh, c.r1.report))
  if key not in _EVALUATORS:
    _EVALUATORS[key] = heldout.make_evaluator(c)
  return _EVALUATORS[key]


def start_params(cfg, mcfg):
  """The shared starting policy (and reference) of every seed and variant (see the module docstring); None for
  'random': init_states then draws one init from cfg.run.seed for every run."""
  key = f"{cfg.start_from}-{_fingerprint(cfg.run)}"
  if cfg.start_from == "random":
    return None
  if key in _STARTS:
    return _STARTS[key]
  if cfg.start_from == "cold_start":
    workdir = os.path.join(tempfile.gettempdir(), f"grpo_jax_r1_start_{key}")
    # shared by every table of this config on the machine: two tables building it at once would write the same
    # checkpoints, so the second is refused naming the first (DIR/run.lock, workdir_lock.py)
    with workdir_lock.WorkdirLock(workdir):
      pipeline.run_pipeline(cfg.run, workdir, stages=("base", "r1_1_cold_start"), report_md=False)
      if not layout.stage_done(workdir, "r1_1_cold_start"):
        raise RuntimeError(f"the cold-start stage in {workdir} stopped before its end; run the table again.")
      abstract = state_lib.abstract_params(sharding.make_mesh(cfg.run.mesh, jax.devices()[:1]), mcfg)
      params = params_ckpt.load_params(layout.params_path(workdir, "r1_1_cold_start"), abstract)
  else:
    raise ValueError(f"config.start_from={cfg.start_from!r}: use 'cold_start' or 'random'.")
  _STARTS[key] = params
  return params


def reward_terms(c, tok):
  """The stage's reward terms as the pipeline builds them (train.reward_terms with r1's Python terms: pipeline.py),
  not a copy that drifts: the copy dropped rl.reward_fallback and tools.env's environment."""
  return train.reward_terms(c, tok, r1_rewards.config_fns(c))


def run_cell(cfg, variant: str, seeds: list[int]) -> dict:
  c = build_config(cfg, dict(cfg.variants)[variant])
  tok = tok_lib.for_config(c)
  spec = reward_terms(c, tok)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  # every seed from one init (the stage's start), their rollouts differ
  c, mesh, mcfg, states, program, chosen = train_table.make_runs(cfg, c, spec, seeds, tok, start_params(cfg, mcfg),
                                                         init_seeds=[cfg.run.seed] * len(seeds))
  n_prompts = c.rl.prompts_per_step * (c.rl.oversample if c.rl.dynamic_sampling else 1)
  ev = evaluator(c)
  terms = [n for n, w in c.rewards if w != 0]
  train_curves = {n: [] for n in terms}
  zero_std, eval_x = [], []
  held = {name: [] for name, _ in HELDOUT + (("language", None),)}

  def evaluate(t, states):  # step 0, every eval_every steps, the last step
    eval_x.append(t)
    per_seed = [ev.rollouts(seeds_lib.unstack(states["params"], s), jax.random.PRNGKey(0))  # greedy: the key is unused
                for s in range(len(seeds))]
    for name, field in HELDOUT:
      held[name].append([float(getattr(g, field).mean()) for g in per_seed])
    held["language"].append([float(g.readings["language"].mean()) for g in per_seed])

  def observe(t, batch, m):  # (a failing Python reward term stops rl_loop itself)
    sm = seeds_lib.host_scalars(m)
    for n in terms:
      train_curves[n].append(sm[f"train/reward/{n}"])
    zero_std.append(sm["train/frac_zero_std_groups"])

  data = data_lib.rl_batches(c.task, tok, "train", n_prompts, c.seed, 0, c.task.prompt_len)  # shared by all seeds
  train_table.train_seeds(c, mesh, mcfg, states, program, spec, tok, batches=data, evaluate=evaluate,
                          observe=observe)
  as_sxt = lambda rows: np.asarray(rows, np.float64).T  # [steps][seeds] -> seeds × steps
  tail = slice(int(c.train.steps * 0.8), None)
  x = list(range(1, c.train.steps + 1))
  scalars = {f"heldout_{n}_final": as_sxt(v)[:, -1].tolist() for n, v in held.items()}
  scalars.update({f"train_{n}_last20%": as_sxt(v)[:, tail].mean(1).tolist() for n, v in train_curves.items()})
  scalars["frac_zero_std_groups_mean"] = as_sxt(zero_std).mean(1).tolist()
  curves = {f"train reward: {n}": {"x": x, "y": as_sxt(v).tolist()} for n, v in train_curves.items()}
  curves["fraction of groups without signal"] = {"x": x, "y": as_sxt(zero_std).tolist()}
  curves.update({f"held-out greedy {n}": {"x": eval_x, "y": as_sxt(v).tolist()} for n, v in held.items()})
  return {"scalars": scalars, "curves": curves, "auto": chosen}


def header(cfg) -> str:
  c = stage_config.for_stage(cfg.run, cfg.stage)
  weighted = ", ".join(f"{w:g}·{n}" for n, w in c.rewards if w != 0)
  start = ("the R1 pipeline's cold-start params (its base and r1_1_cold_start stages)" if cfg.start_from ==
           "cold_start" else "one shared random init")
  return (f"Stage `{cfg.stage}` from {start}: reward {weighted}; {c.train.steps} steps of {c.rl.prompts_per_step} "
          f"prompts × G={c.rl.G}, lr {c.optim.lr:g}; {cfg.seeds} seeds per variant (their rollouts differ; same "
          f"prompts), held-out greedy metrics on {c.r1.report.size} test prompts every {cfg.eval_every} steps.")


def verdict(cfg, summaries) -> str:
  """The per-term difference between the first two variants, against what the seeds resolve, in plain words."""
  names = variants(cfg)
  if len(names) < 2:
    return ""
  a, b = names[0], names[1]
  parts = []
  for m in cfg.columns:
    sa, sb = summaries[a].get(m), summaries[b].get(m)
    if sa is None or sb is None:
      continue
    d = stats.resolvable_difference([sa, sb])
    diff = sb.mean - sa.mean
    word = "resolved" if abs(diff) > d else "not resolved"
    parts.append(f"{m}: {b} − {a} = {diff:+.3g} (resolution ±{d:.2g}: {word})")
  return "; ".join(parts) + "."
