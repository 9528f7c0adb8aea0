"""The one planner for `auto` config values: each knob registers its candidates and a chooser; `resolve` returns
the config with every `auto` replaced by its choice (and why), once, before anything is traced: the traced step
only reads resolved values (config_lib.setting gives the reference path's value to a step built from an unresolved
config, as tests build them).

A chooser sees the config, the mesh's axis sizes, the device memory and the platform, and may ask the memory planner
(memory_plan.plan, bytes per device) and a time model of its own. Registered here, in the order they resolve (a
later knob's plan sees the earlier choices):
  sampling.engine       static | continuous, by completion length and continuous-only keys (the rule below)
  rl.packing            on for runs of LONG_RUN_STEPS steps or more on LONG_COMPLETIONS tokens or more, else off
  rl.train_buckets      1 under packing; the padded passes' static lengths otherwise (0 = auto)
  sampling.exit_chunk   the divisor of max_new_tokens nearest 16 (sampling.default_exit_chunk; -1 = auto)
  sampling.decode_attention   the continuous engine's KV store and kernel
  rl.rollout_chunks × rl.minibatches   the fewest that fit (chosen jointly; 0 = auto; `required`)
  sampling.slots        the continuous engine's slot count (0)
  sampling.compaction   its slot counts S, S/2, ... only for long completions (0)
  rl.pack_len, rl.pack_rows   rl.packing's row length and rows per micro-batch (0)
  sampling.decode_layout × decode_tp   where the weights live while the rollout decodes (memory_plan.choose_decode)
  rl.carry_kv_groups    the rollout carry's KV read groups: the most up to 8 dividing a device's slots
Each that applies to the resolved path logs one line, `auto <key> = <value> (<why>)`, `recorded <key> = <value> (<why>)`
where a resume reuses the run's record (below), or `<key> = <value> (set)`
where the config names it (a set key of a path not taken: a warning that it has no effect; the others, slots under
the static engine, say nothing). The rules and the measurements behind them: docs/performance.md ("What `auto`
resolves to"). A run records what was resolved (run/loop_guard.py: `resolved.<key>` in every checkpoint's config
view, and DIR/auto.json); a resume reuses the recorded values (`recorded=`), so it runs the program it started with
even where today's rule would choose otherwise (logged), unless they no longer fit the device (check_recorded_fits:
refused) or cannot run on its platform (Knob.runs_on: the TPU kernel on a CPU, refused naming today's pick). A
`required` knob has no unresolved default: the step builders refuse it (`check_resolved`).
"""
import dataclasses
import json
import math
import os
from typing import Any, Callable

import jax
import ml_collections
from absl import logging

from grpo_jax.config import config_lib
from grpo_jax.infra.errors import ConfigError
from grpo_jax.infra.errors import integer
from grpo_jax.model import model_config
from grpo_jax.model import paged_attention
from grpo_jax.rl import memory_plan
from grpo_jax.rl import packing
from grpo_jax.rl import plan_terms
from grpo_jax.rl import update as update_lib
from grpo_jax.rollout import carry as carry_lib
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import engine
from grpo_jax.rollout import sampling

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Context:
  mesh: dict[str, int]  # axis sizes
  hbm_bytes: int | None  # per device; None = no limit
  platform: str | None = None  # the backend the step is for (None: JAX's default)
  # an evaluation's decode (resolve_eval): the decode layout is fitted to the resident state and the rollout phase
  # alone (memory_plan.decode_bytes), no scoring forwards or update after it
  decode_only: bool = False


@dataclasses.dataclass(frozen=True)
class Knob:
  key: str  # dotted config key, e.g. "sampling.slots"
  candidates: Callable[[Any, Context], list]  # the values it may take, for this config and mesh
  choose: Callable[[Any, Context, list], tuple[Any, str]]  # (value, why) among them
  applies: Callable[[Any], bool] = lambda config: True  # False: the knob means nothing for this config, left as is
  joint: tuple[str, ...] = ()  # more keys chosen with `key`: candidates and choices are then tuples, one per key
  required: bool = False  # no default for a step built unresolved: the step builders refuse its auto value
  # whether the config asks for a choice; default: any of the keys at its auto value (config_lib.auto_value). Either
  # way a key the config sets is never written (nor logged or recorded as auto's): a set value wins.
  pending: Callable[[Any], bool] | None = None
  warn: Callable[[Any], bool] = lambda pick: False  # log the choice as a warning (a slow fallback)
  # why a set value means nothing under the keys resolved before it (None: it is used). Logged, not silently
  # dropped: a warning where the knob does not apply (only an explicit choice of the other key gets there), else
  # beside its "(set)" line (a config's value for the other path, e.g. train buckets for the padded passes)
  unused: Callable[[Any], str | None] = lambda config: None
  # a value the config sets, checked against the resolved config (check_choosable: before anything is written);
  # raises ConfigError
  check: Callable[[Any, Context], None] | None = None
  # the chooser picks by the planner's bytes: a set value is checked against the device's memory too (check_fits)
  planned: bool = False
  # how a set value runs where the step cannot take it as set (None: as set), e.g. more packed rows than a device
  # holds: logged as a warning beside its "(set)" line, never silently cut
  runs_as: Callable[[Any, Context], str | None] = lambda config, ctx: None
  # why a value (the pick: a tuple for a joint knob) cannot run on ctx's platform at all (None: it can), e.g. the TPU
  # kernel on a CPU: a set value is refused, and so is a recorded one a resume would reuse (a run moved off the
  # devices it started on), naming what auto picks here
  runs_on: Callable[[Any, Context], str | None] = lambda value, ctx: None
  # what the step runs for the resolved key (None: its value), e.g. the compaction sizes a count halves to: runs of
  # one program are compared by it (program_values), so a recorded 8 and today's 7 of 64 slots are one program
  runs: Callable[[Any, Context], Any] | None = None

  def keys(self) -> tuple[str, ...]:
    return (self.key,) + self.joint

  def asks(self, config) -> bool:
    if self.pending is not None:
      return self.pending(config)
    return any(is_auto(k, _get(config, k)) for k in self.keys())


REGISTRY: dict[str, Knob] = {}


def register(knob: Knob) -> Knob:
  missing = [k for k in knob.keys() if k not in config_lib.AUTO_KEYS]
  if missing:
    raise ValueError(f"auto knob {missing}: declare its auto value in config_lib (AUTO_INT / AUTO_STR).")
  REGISTRY[knob.key] = knob
  return knob


def is_auto(key: str, value) -> bool:
  """`value` asks for `key`'s choice: its auto value, for a switch knob (rl.packing) in any spelling validation
  takes ('auto', 'AUTO', ...; config_lib.switch), as run_config reads a record."""
  if key in config_lib.SWITCH_KEYS:
    return config_lib.switch(value) == "auto"
  return value == config_lib.auto_value(key)


def chosen_with(key: str) -> tuple[str, ...]:
  """The keys one knob chooses together with `key` (a joint knob's; else `key` alone): a resume's fix must name every
  one of them whose pick differs, since a key set to its auto value leaves the recorded pick of the others in place."""
  for knob in REGISTRY.values():
    if key in knob.keys():
      return knob.keys()
  return (key,)


def _get(config, key: str):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def _set(config, key: str, value) -> None:
  section, name = key.rsplit(".", 1)
  _get(config, section)[name] = value


def resolve(config: ml_collections.ConfigDict, ctx: Context, log: bool = True,
            recorded: dict[str, Any] | None = None) -> tuple[ml_collections.ConfigDict, dict[str, str]]:
  """A copy of `config` with every registered knob that asks for a choice resolved; -> (config, {key: 'value
  (why)'} of the keys resolved). `recorded`: {key: value} a run resolved before (its checkpoint's record): a knob
  whose keys are all there takes them instead of choosing again."""
  out = ml_collections.ConfigDict(config.to_dict())
  chosen = {}
  recorded = recorded or {}
  for key, knob in REGISTRY.items():
    keys = knob.keys()
    try:
      values = [_get(out, k) for k in keys]
    except (KeyError, AttributeError):
      continue
    if not knob.applies(out):
      if log and not knob.asks(out) and knob.unused(out):
        # a warning where the user set it (a flag, a sweep point, a variant: config_lib.set_by_user); a config file's
        # own value for the other path is its author's business, said at info level
        base = config_lib.defaults()
        by_user = any(config_lib.set_by_user(k, v, _get(base, k)) for k, v in zip(keys, values))
        (logging.warning if by_user else logging.info)(
            "%s (set): no effect %s", ", ".join(f"{k} = {v}" for k, v in zip(keys, values)), knob.unused(out))
      continue
    if not knob.asks(out):
      bad = knob.runs_on(tuple(values) if knob.joint else values[0], ctx)
      if bad:
        raise ConfigError(f"config.{', '.join(f'{k}={v!r}' for k, v in zip(keys, values))} (set): {bad}; set "
                          f"{' '.join(f'{k}=auto' for k in keys)} (or a value for this platform).")
      if log:
        unused, cut = knob.unused(out), knob.runs_as(out, ctx)
        (logging.warning if cut else logging.info)(
            "%s (set)%s", ", ".join(f"{k} = {v}" for k, v in zip(keys, values)),
            f": no effect {unused}" if unused else f": runs as {cut}" if cut else "")
      continue
    # A record is reused where the run chose this knob: a recorded auto value means it did not apply then (slots
    # under the static engine; an allowed change of the path makes it apply now), and a joint key set to another
    # value than the record's (an allowed change) means the record's choice was made beside the old value: both
    # choose again, as a fresh run would.
    if (key in recorded and not is_auto(key, recorded[key])
        and all(is_auto(k, v) or recorded.get(k, v) == v for k, v in zip(keys, values))):
      # a joint key the record holds at the value it has now (or not at all) was left as set (None)
      pick = (tuple(None if i and recorded.get(k, v) == v else recorded[k]
                    for i, (k, v) in enumerate(zip(keys, values))) if knob.joint else recorded[key])
      why = "recorded with this run: a resume runs the program it started with"
      # what each runs with: a joint pick's None is the key's value as set
      runs = lambda p: tuple(v if x is None else x for x, v in zip(p, values)) if knob.joint else p
      try:
        today, today_why = knob.choose(out, ctx, knob.candidates(out, ctx))
        # a knob's Knob.runs compares what the step runs: a recorded 8 compaction sizes is today's 7 of 64 slots
        ran = (lambda p: knob.runs(_with(out, {key: p}), ctx)) if knob.runs and not knob.joint else runs
        if ran(today) != ran(pick):
          why += f"; today's rule picks {today} ({today_why})"
      except (ConfigError, ValueError) as e:
        today, why = None, why + f"; today's rule finds nothing ({e})"
      bad = knob.runs_on(runs(pick), ctx)
      if bad:  # the run moved to devices the recorded program cannot run on: refused as check_recorded_fits does
        named = ", ".join(f"{k}={p!r}" for k, p in zip(keys, runs(pick) if knob.joint else (pick,)))
        other = [(k, t) for k, t, p in zip(keys, runs(today) if knob.joint else (today,),
                                            runs(pick) if knob.joint else (pick,)) if t != p] if today is not None else []
        fix = (f"resume with {' '.join(f'--config.{k}={t}' for k, t in other)} --config.train.allow_config_change="
               f"{','.join(k for k, _ in other)} (what auto picks here; a change of the run's program), or "
               if other else "")
        raise ConfigError(f"config.{named} (recorded: this run's `auto` choice, which a resume reuses): {bad}; "
                          f"{fix}resume on devices like the ones it started on.")
      said = "recorded"  # not auto's choice today: the value the run started with (its record)
    else:
      pick, why = knob.choose(out, ctx, knob.candidates(out, ctx))
      said = "auto"
    picked = []
    for k, value, p in zip(keys, values, pick if knob.joint else (pick,)):
      if p is not None and is_auto(k, value):
        _set(out, k, p)
        chosen[k] = f"{p} ({why})"
        picked.append(f"{k} = {p}")
    if log and picked:
      # a recorded value past what the slots or rows give runs as less, as it did when recorded: said, not warned
      cut = knob.runs_as(out, ctx)
      (logging.warning if knob.warn(pick) else logging.info)(
          "%s %s (%s)%s", said, ", ".join(picked), why, f": runs as {cut}" if cut else "")
  return out, chosen


def resolve_here(config: ml_collections.ConfigDict, mesh, lanes: int = 1, recorded: dict[str, Any] | None = None,
                 log: bool = True) -> tuple[ml_collections.ConfigDict, dict[str, str]]:
  """`resolve` for a step that runs on this process's devices over `mesh`; `lanes` vmapped runs share each
  device's memory (vmap stacks every array of the step once per run)."""
  return resolve(config, Context(dict(mesh.shape), decode_layout.device_memory_bytes() // lanes), log=log,
                 recorded=recorded)


# What an evaluation's generate reads of the `auto` knobs (run/evaluation.py make_generate): its plan.
EVAL_KEYS = ("sampling.engine", "sampling.exit_chunk", "sampling.decode_attention", "sampling.compaction",
             "sampling.decode_layout", "sampling.decode_tp")


def eval_view(config, rl_state: bool = False) -> ml_collections.ConfigDict:
  """The config an evaluation's decode is planned from: what it decodes, not the RL batch. Its rows are eval.batch,
  decoded in one call (Evaluator._chunks), each its own slot (sample_groups without `slots`), no carry, no chunks,
  nothing trained after them. `rl_state`: the run's RL state is resident beside the decode (held-out evaluation
  inside an RL run: its reference, critic, optimizer); else (SFT's final evaluation, the R1 report) rl.* is the base
  config's, β = 0: the run's rl.* is not read, so no RL knob the job ignores can change the plan."""
  c = ml_collections.ConfigDict(config.to_dict())
  if not rl_state:
    c.rl = ml_collections.ConfigDict(config_lib.defaults().rl.to_dict())
    c.rl.beta = 0.0  # the SFT state: the policy and its optimizer, no reference
  # G = 1: the greedy pass prefills every row's prompt (the sampled pass prefills one per eval.n_samples rows)
  c.rl.update(prompts_per_step=int(config.eval.batch), G=1, oversample=1, dynamic_sampling=False,
              partial_rollouts=False, rollout_chunks=1, minibatches=1, packing="off", train_buckets=1, pack_len=0,
              pack_rows=0, carry_kv_groups=0)
  return c


def resolve_eval(config, ctx: Context, rl_state: bool = False,
                 log: bool = True) -> tuple[ml_collections.ConfigDict, dict[str, str]]:
  """`config` with the `auto` knobs an evaluation's decode reads (EVAL_KEYS) resolved for what it decodes
  (eval_view), by the same choosers as a run's, once, before its generate is traced; a set value wins (the values
  an RL run resolved for its own rollout are not reused: resolve_eval takes the unresolved config). The other keys
  are left as they are (the evaluation does not read them). -> (config, {key: 'value (why)'} of the keys chosen);
  `log`: one line naming them."""
  view = eval_view(config, rl_state)
  ctx = dataclasses.replace(ctx, decode_only=True)
  chosen = {}
  if is_auto("sampling.engine", view.sampling.engine):  # before the slots are set to the rows below (a set key of
    # the continuous engine asks for it: a config's own choice, kept)
    engine_, why = choose_engine(view, ctx, [])
    view.sampling.engine = engine_
    chosen["sampling.engine"] = f"{engine_} ({why})"
  if view.sampling.engine == "continuous":
    view.sampling.slots = view.rl.prompts_per_step  # every row its own slot, as the evaluation decodes them
  resolved, picked = resolve(view, ctx, log=False)
  out = ml_collections.ConfigDict(config.to_dict())
  for k in EVAL_KEYS:
    _set(out, k, _get(view if k == "sampling.engine" else resolved, k))
    if k in picked:
      chosen[k] = picked[k]
  if log and chosen:
    logging.info("evaluation (eval.batch=%d rows): %s", config.eval.batch,
                 "; ".join(f"auto {k} = {v}" for k, v in chosen.items()))
  return out, chosen


def resolve_eval_here(config, mesh, rl_state: bool = False, lanes: int = 1,
                      log: bool = True) -> tuple[ml_collections.ConfigDict, dict[str, str]]:
  """`resolve_eval` on this process's devices over `mesh` (`lanes` vmapped runs share each device's memory)."""
  return resolve_eval(config, Context(dict(mesh.shape), decode_layout.device_memory_bytes() // lanes), rl_state,
                      log=log)


def check_choosable(config, mesh: dict[str, int], hbm_bytes: int | None = -1) -> None:
  """The input checks' part (preflight, the R1 stages' configs): a knob that cannot choose (nothing fits this
  process's devices) raises its ConfigError before anything is written; the choice itself is made again, and
  logged, where the step is built. So does a set value that does not fit the resolved config (Knob.check), and a
  set memory knob whose step the planner puts over the device's memory (check_fits). `hbm_bytes`: per device; -1
  this process's; None unknown (a command checked to run elsewhere: the choosers and the fit go unchecked)."""
  ctx = Context(mesh, decode_layout.device_memory_bytes() if hbm_bytes == -1 else hbm_bytes)
  try:
    resolved, _ = resolve(config, ctx, log=False)
    for knob in REGISTRY.values():
      if knob.check is not None and knob.applies(resolved):
        knob.check(resolved, ctx)
    check_fits(config, resolved, ctx)
  except MemoryError as e:  # the planner traces the model's shapes: a typo'd size (hidden=10**12) was a traceback
    m = config.model
    raise ConfigError(f"config.model: tracing its shapes for the memory plan ran out of host memory ({e}); "
                      f"hidden={m.hidden}, head_dim={m.head_dim}, inter={m.inter}, layers={m.layers}, "
                      f"vocab_size={m.vocab_size}: check them for a typo.") from None


def _less_memory(config) -> str:
  """What a step that fits no split needs: less of the batch, or less memory per token (remat=full where it is not:
  advised to a config already at full, it was no way forward)."""
  remat = "" if config.model.get("remat", "none") == "full" else "set model.remat=full, "
  return f"lower rl.prompts_per_step, rl.G or sampling.max_new_tokens, {remat}or add devices (mesh.fsdp)"


def set_memory_keys(config, resolved) -> list[str]:
  """The keys of the planned knobs (Knob.planned) that `config` sets (not at their auto value) and that apply."""
  out = []
  for knob in REGISTRY.values():
    try:
      if knob.planned and knob.applies(resolved):
        out += [k for k in knob.keys() if not is_auto(k, _get(config, k))]
    except (KeyError, AttributeError):  # a config without the knob's section (as `resolve` skips it)
      continue
  return out


def check_fits(config, resolved, ctx: Context) -> None:
  """A set memory knob is held to the rule `auto` is held to: the planner's bytes per device for the resolved step
  fit ctx's memory. Refused (ConfigError) naming the set keys and the values auto picks there; a warning where the
  planner cannot cost the config. A config with no such key set is the choosers' (they refuse or log a fallback)."""
  keys = set_memory_keys(config, resolved)
  if ctx.hbm_bytes is None or not keys:
    return
  try:
    p, fits, text = _planned(resolved, ctx)
  except (ValueError, KeyError, NotImplementedError) as e:
    logging.warning("%s (set): the memory planner cannot cost this config (%s: %s); whether it fits %s per device is "
                    "not checked before the compile.", ", ".join(keys), type(e).__name__, e, size(ctx.hbm_bytes))
    return
  if fits:
    return
  named = ", ".join(f"{k}={_get(config, k)}" for k in keys)
  try:
    auto_cfg, _ = resolve(_with(config, {k: config_lib.auto_value(k) for k in keys}), ctx, log=False)
    q, auto_fits, auto_text = _planned(auto_cfg, ctx)
  except ConfigError as e:
    auto_fits, auto_text = False, str(e).rstrip(".")
  if auto_fits:
    picks = ", ".join(f"{k}={_get(auto_cfg, k)}" for k in keys if _get(auto_cfg, k) != _get(config, k))
    fix = f"set {picks} (what auto picks: planned {auto_text}), or set them to auto"
  else:
    fix = f"auto finds no value that fits either; {_less_memory(config)}"
  raise ConfigError(f"config.{named} (set): the step plans {text} per device (peak in {p.peak_phase}), more than the "
                    f"device holds; {fix}.")


def check_recorded_fits(config, resolved, recorded: dict[str, Any], ctx: Context) -> None:
  """A resume reuses the memory knobs its run recorded (Knob.planned, at auto in `config`); they are held to this
  device's memory as set values are (check_fits): a run moved to fewer or smaller devices was resumed with a split
  planned for the old ones and ran out of memory in the compile or the first step. Refused (ConfigError) naming the
  recorded values and what auto picks here."""
  keys = [k for knob in REGISTRY.values() if knob.planned and knob.applies(resolved) for k in knob.keys()
          if k in recorded and is_auto(k, _get(config, k))]
  if ctx.hbm_bytes is None or not keys:
    return
  try:
    p, fits, text = _planned(resolved, ctx)
  except (ValueError, KeyError, NotImplementedError):
    return  # the planner cannot cost it: check_fits warns for set values; a recorded one ran before
  if fits:
    return
  named = ", ".join(f"{k}={_get(resolved, k)}" for k in keys)
  try:
    today, _ = resolve(config, ctx, log=False)
    other = [k for k in keys if _get(today, k) != _get(resolved, k)]
    fix = (f"resume with {' '.join(f'--config.{k}={_get(today, k)}' for k in other)} "
           f"--config.train.allow_config_change={','.join(other)} (what auto picks here; a change of the run's "
           "program), or ")
  except ConfigError:
    fix = "auto finds no value that fits here either; "
  raise ConfigError(f"config.{named} (recorded: this run's `auto` choice, which a resume reuses): the step plans "
                    f"{text} per device here (peak in {p.peak_phase}), more than the device holds; {fix}resume on "
                    "devices like the ones it started on.")


def check_resolved(config) -> None:
  """What the step builders call: a `required` knob still at its auto value means a path skipped `resolve`."""
  for key, knob in REGISTRY.items():
    for k in knob.keys() if knob.required else ():
      if is_auto(k, _get(config, k)):
        raise RuntimeError(f"config.{k}={config_lib.auto_value(k)!r} (auto) reached the step builder unresolved: "
                           "resolve the config first (auto.resolve / auto.resolve_here), as every entry path does.")


def resolved_values(config) -> dict[str, Any]:
  """{key: value} of every registered knob's keys in a resolved config (what a run records)."""
  out = {}
  for knob in REGISTRY.values():
    for k in knob.keys():
      try:
        out[k] = _get(config, k)
      except (KeyError, AttributeError):
        pass
  return out


def program_values(config, ctx: Context) -> dict[str, Any]:
  """resolved_values with each knob's key at what the step runs (Knob.runs): what the runs of one vmapped program
  (a sweep group, recorded under older rules or not) must agree on."""
  out = resolved_values(config)
  for knob in REGISTRY.values():
    if knob.runs is not None and knob.key in out:
      out[knob.key] = knob.runs(config, ctx)
  return out


def disagree(configs, ctx: Context) -> tuple[list[dict[str, Any]], list[str]]:
  """-> (each resolved config's program_values, the keys on which a run differs from the first)."""
  picked = [program_values(c, ctx) for c in configs]
  return picked, sorted({k for p in picked[1:] for k in p if p[k] != picked[0].get(k)})


def write_record(workdir: str, chosen: dict[str, str], *, resumed: bool = False) -> None:
  """DIR/auto.json: what `auto` resolved for this run and why (process 0; the checkpoints hold the values).
  A resume that resolved the values the file already holds keeps the file (only the 'why' would change, and the
  run's directory would differ from an uninterrupted run's); otherwise the file says what this process runs."""
  path = os.path.join(workdir, "auto.json")
  if jax.process_index() != 0 or not chosen:
    return
  if resumed and _recorded_values(path) == {k: v.split(" (", 1)[0] for k, v in chosen.items()}:
    return
  os.makedirs(workdir, exist_ok=True)
  tmp = os.path.join(workdir, f"auto.json.tmp-{os.getpid()}")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(dict(sorted(chosen.items())), f, indent=2)
    f.write("\n")
  os.replace(tmp, path)


def _recorded_values(path: str) -> dict[str, str] | None:
  """{key: value} of an auto.json (None where it is missing or unreadable: it is written again)."""
  try:
    with open(path, encoding="utf-8") as f:
      return {k: str(v).split(" (", 1)[0] for k, v in json.load(f).items()}
  except (OSError, ValueError, AttributeError):
    return None


def size(nbytes: int) -> str:
  return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def _planned(config, ctx: Context) -> tuple[memory_plan.Plan, bool, str]:
  """(the planner's bytes per device for `config`, whether they fit ctx's memory, 'X of Y' or 'no memory limit'):
  every chooser's fit test (no margin on top of the planner's figure)."""
  p = memory_plan.plan(config, ctx.mesh, ctx.platform, hbm_bytes=ctx.hbm_bytes)
  if ctx.hbm_bytes is None:
    return p, True, "no memory limit"
  return p, p.total_bytes <= ctx.hbm_bytes, f"{size(p.total_bytes)} of {size(ctx.hbm_bytes)}"


def _with(config, updates: dict) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(config.to_dict())
  for k, v in updates.items():
    section, name = k.rsplit(".", 1)
    _get(c, section)[name] = v
  return c


# ---------------------------------------------------------------------------- sampling.engine, rl.packing, ...
# The path a step takes. The measurements behind these rules (docs/performance.md, "What `auto` resolves to"), all
# same-invocation ratios on the 2-core CPU:
#   continuous engine   bench-tail (L = 512, long-tailed lengths): rollout 0.35x the static engine's, whole step
#                       4.06x TRL with packing against 1.13x as shipped before; bench-small (L = 128, every row to
#                       L): the same step time (4.87 vs 4.77 s); a 64-wide 2-layer model at L = 72: rollout 1.29x the
#                       static engine's (its per-step bookkeeping weighs on a tiny model; 2026-12-05, loaded
#                       machine). Compile: like the static decode with one slot count (12.5 vs 11.8 CPU-s).
#   packing             pays where the lengths have a tail: bench-tail's reference + update 0.33x the padded
#                       passes'. Where completions are short it does not: 2026-12-05 on this kind of machine, quiet,
#                       alternated, packed against padded: bench-tiny (L 64) 0.89x the padded step's speed, the main
#                       job's RL step (L 72, completions ~48 tokens) 0.94x, bench-small (L 128) 0.98-1.04x (an
#                       earlier machine measured bench-tiny 1.10x). Compile: +20% of the RL step's (3.7 vs 3.1
#                       CPU-s, the suite's flags, :small).
LONG_COMPLETIONS = 256  # tokens: where a rollout's length tail pays for the continuous engine and its compaction
LONG_RUN_STEPS = 20  # RL steps: a shorter run (smoke runs, :small variants) does not win back a costlier compile


def _continuous(config) -> bool:
  return config_lib.setting(config, "sampling.engine") == "continuous"


def choose_engine(config, ctx: Context, candidates: list[str]) -> tuple[str, str]:
  """continuous where rows carry over steps (rl.partial_rollouts) or pause for an environment (tools.env), where a
  continuous-only key is set, or for completions of LONG_COMPLETIONS tokens or more; else static."""
  del ctx, candidates
  s = config.sampling
  if config.rl.get("partial_rollouts", 0):
    return "continuous", "rl.partial_rollouts: rows carry over steps in the engine's slots"
  if config.get("tools") is not None and config.tools.get("env", ""):
    return "continuous", f"tools.env={config.tools.env!r}: rows pause for the environment in the engine's slots"
  forced = [k for k in ("sampling.slots", "sampling.compaction") if _get(config, k) != config_lib.auto_value(k)]
  forced += ["sampling.decode_attention"] if s.get("decode_attention", AUTO) in ("paged", "tpu_ragged") else []
  if forced:
    return "continuous", f"{', '.join(forced)} set: keys of the continuous engine"
  L = s.max_new_tokens
  if L >= LONG_COMPLETIONS:
    return "continuous", (f"max_new_tokens {L} >= {LONG_COMPLETIONS}: decode work follows the live rows "
                          "(bench-tail: 0.35x the static rollout)")
  return "static", (f"max_new_tokens {L} < {LONG_COMPLETIONS}: no tail to gain on, and the static decode's step is "
                    "as fast or faster there (bench-small, every row to L: the same; a 64-wide model: 1.29x faster)")


register(Knob("sampling.engine", lambda c, ctx: ["continuous", "static"], choose_engine))


def choose_packing(config, ctx: Context, candidates: list[str]) -> tuple[str, str]:
  """on for runs of LONG_RUN_STEPS RL steps or more on completions of LONG_COMPLETIONS tokens or more (or where a
  packing key is set); off for shorter runs or completions."""
  del ctx, candidates
  if config.rl.get("token_select", "all") != "all":
    return "off", (f"rl.token_select={config.rl.token_select!r} ranks the whole minibatch's tokens; the packed "
                   "passes hand the objective one micro-batch at a time")
  set_keys = [k for k in ("rl.pack_len", "rl.pack_rows") if _get(config, k)]
  if set_keys:
    return "on", f"{', '.join(set_keys)} set: keys of the packed passes"
  L, steps = config.sampling.max_new_tokens, config.train.steps
  if L < LONG_COMPLETIONS:
    return "off", (f"max_new_tokens {L} < {LONG_COMPLETIONS}: too short a tail for packing to pay (bench-tiny 0.89x, "
                   "the main job's RL step 0.94x, bench-small 1.0x the padded step)")
  if steps >= LONG_RUN_STEPS:
    return "on", (f"train.steps {steps} >= {LONG_RUN_STEPS}, max_new_tokens {L} >= {LONG_COMPLETIONS}: padding-free "
                  "passes (bench-tail's reference + update 3x faster than padded)")
  return "off", (f"train.steps {steps} < {LONG_RUN_STEPS}: the packed passes' extra compile (+20% of the step's) "
                 "outweighs what so few steps save")


register(Knob("rl.packing", lambda c, ctx: ["on", "off"], choose_packing))


def choose_buckets(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """1 under packing (unused: the packed passes follow the real tokens); 2 for the padded passes of a long run on
  long completions (bench-tail's padded rows ran `--train-buckets 2`); else 1 (each more length compiles one more
  forward + backward)."""
  del ctx, candidates
  if config_lib.packing_on(config):
    return 1, "rl.packing: the packed passes follow the real tokens"
  L, steps = config.sampling.max_new_tokens, config.train.steps
  if L >= LONG_COMPLETIONS and steps >= LONG_RUN_STEPS:
    return 2, f"padded passes, max_new_tokens {L}: rows that end by L/2 train on L/2"
  return 1, "padded passes: each more training length compiles one more forward + backward"


def buckets_run_as(config, ctx: Context) -> str | None:
  """A set rl.train_buckets past the distinct lengths update.train_lengths makes of max_new_tokens."""
  del ctx
  n, L = int(config.rl.train_buckets), config.sampling.max_new_tokens
  lengths = update_lib.train_lengths(L, n) if n >= 1 else ()
  if 0 < len(lengths) < n:
    return (f"{len(lengths)} training lengths {lengths}: max_new_tokens {L} halves to only {len(lengths)} distinct "
            f"ones; set rl.train_buckets <= {len(lengths)}")
  return None


register(Knob("rl.train_buckets", lambda c, ctx: [1, 2], choose_buckets,
              unused=lambda c: ("with rl.packing = on: the packed passes follow the real tokens (it applies to the "
                                "padded passes)") if config_lib.packing_on(c) else None,
              runs_as=buckets_run_as))


def choose_exit_chunk(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  del ctx, candidates
  L = config.sampling.max_new_tokens
  c = sampling.default_exit_chunk(L)
  if L <= 16:
    return c, f"max_new_tokens {L} <= 16: one scan"
  return c, (f"divides max_new_tokens {L}: the decode's {L} steps fill whole chunks" if L % c == 0
             else f"no divisor of max_new_tokens {L} in [8, 32]: the measured default")


register(Knob("sampling.exit_chunk", lambda c, ctx: [16], choose_exit_chunk))


# ------------------------------------------------------------------------------------------ sampling.decode_attention


def choose_attention(config, ctx: Context, candidates: list[str]) -> tuple[str, str]:
  """The TPU ragged paged attention kernel on a TPU when it supports the model's shape, else the plain-JAX live
  attention (paged_attention.choose; the fallback and its reason are logged by `resolve`). Registered before the
  memory-planned knobs: their plans depend on the KV store it picks."""
  del candidates
  if config.rl.get("partial_rollouts", False):
    return "plain", "rl.partial_rollouts: the rollout carry keeps its KV in the plain layout between steps"
  m = model_config.ModelConfig.from_config(config.model)
  return paged_attention.choose(m.head_dim, m.kv_heads, config.sampling.page_size, m.dtype,
                                ctx.platform or jax.default_backend())


register(Knob("sampling.decode_attention", lambda c, ctx: ["tpu_ragged", "plain"], choose_attention,
              applies=_continuous,
              runs_on=lambda v, ctx: paged_attention.platform_unsupported(v, ctx.platform or jax.default_backend())))


# ------------------------------------------------------------------------------ rl.rollout_chunks × rl.minibatches
# Registered before sampling.slots: its candidates divide the rows by rl.rollout_chunks.

SPLIT_KEYS = ("rl.rollout_chunks", "rl.minibatches")


def split_counts(config, ctx: Context) -> list[int]:
  """The counts that cut prompts_per_step*G rows into equal parts of a multiple of the mesh's row split
  (data × fsdp; validate.py's rule for both knobs): the divisors of rows / split, smallest first."""
  per = config.rl.prompts_per_step * config.rl.G // (ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1))
  low = [d for d in range(1, math.isqrt(per) + 1) if per % d == 0]  # with per // d: sqrt(per) steps, not per
  return sorted(set(low + [per // d for d in low]))


def split_candidates(config, ctx: Context) -> list[tuple[int, int]]:
  """(rollout_chunks, minibatches) pairs, the auto ones over split_counts, in order of cost: fewest rollout chunks
  first (each chunk decodes its rows in its own sequence of L steps: c chunks ≈ c× the decode's steps and weight
  reads), then fewest minibatches (each one more forward+backward pass over the weights). The two shrink different
  phases (chunks the rollout and scoring forwards, minibatches the update), so the first pair that fits is also the
  fewest of each."""
  counts = split_counts(config, ctx)
  chunks, mbs = (counts if int(_get(config, k)) == 0 else [int(_get(config, k))] for k in SPLIT_KEYS)
  return [(c, m) for c in chunks for m in mbs]


def choose_split(config, ctx: Context, candidates: list[tuple[int, int]]) -> tuple[tuple[int, int], str]:
  """The first candidate whose planned bytes per device fit ctx's memory; without a limit the first (1 where auto).
  Nothing fits: a ConfigError (exit 2) naming the keys and what to change, not a pick that would not run."""
  if ctx.hbm_bytes is None:
    return candidates[0], "no device memory limit known: the fewest"
  plan = lambda cm: _planned(_with(config, dict(zip(SPLIT_KEYS, cm))), ctx)
  # the most split plans the least: planned first, so when it does not fit, nothing else is planned (a typo'd
  # rl.G=10**12 planned ~10**4 pairs)
  (c, m), (p, fits, last_text) = candidates[-1], plan(candidates[-1])
  if fits:
    over = ""
    for cm in candidates[:-1]:
      q, q_fits, text = plan(cm)
      if q_fits:
        return cm, f"planned {text} per device{over}"
      over = over or f"; {cm[0]} chunk(s) x {cm[1]} minibatch(es) would plan {size(q.total_bytes)}"
    return (c, m), f"planned {last_text} per device{over}"
  auto_keys = [k for k in SPLIT_KEYS if int(_get(config, k)) == 0]
  fix = _less_memory(config)
  if "rl.rollout_chunks" not in auto_keys and p.peak_phase != "update":
    fix = f"set rl.rollout_chunks=0 (auto) too (the {p.peak_phase} phase peaks), or " + fix
  if "rl.minibatches" not in auto_keys and p.peak_phase == "update":
    fix = "set rl.minibatches=0 (auto) too (the update phase peaks), or " + fix
  raise ConfigError(f"config.{', '.join(auto_keys)}: auto (0) finds no split that fits {size(ctx.hbm_bytes)} per "
                    f"device (the most, rl.rollout_chunks={c} x rl.minibatches={m}, still plans {size(p.total_bytes)}, "
                    f"peak in {p.peak_phase}); {fix}.")


register(Knob(SPLIT_KEYS[0], split_candidates, choose_split, joint=SPLIT_KEYS[1:], required=True, planned=True))


# ------------------------------------------------------------------------------------------ sampling.slots


def _rows(config) -> int:
  rl = config.rl
  return rl.prompts_per_step * rl.G * (rl.oversample if rl.dynamic_sampling else 1)


def slot_candidates(config, ctx: Context) -> list[int]:
  """N / rl.rollout_chunks (the rollout chunks bound the slots), then halves, while a multiple of the mesh's row
  split (data × fsdp), largest first."""
  split = ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1)
  out, s = [], _rows(config) // int(config.rl.rollout_chunks)
  while s >= split and s % split == 0:
    out.append(s)
    if s % 2:
      break
    s //= 2
  return out


def worst_case_steps(n: int, slots: int, L: int) -> int:
  """Sequential decode steps when every row runs to L: ceil(N / S) waves of L (refill: a slot takes a row a step
  after its last one ends). Fewer slots cost time, not only memory saved (the issue's simulation: 8 of 64 slots
  need about twice the longest row's steps)."""
  return math.ceil(n / slots) * L


def choose_slots(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """The most slots whose step fits the device memory (the fewest sequential steps); the first candidate without a
  limit."""
  n, L = _rows(config), config.sampling.max_new_tokens
  if not candidates:
    raise ValueError(f"sampling.slots=auto: no slot count divides the {n} rows over mesh data*fsdp; set it.")
  for s in candidates:
    _, fits, limit = _planned(_with(config, {"sampling.slots": s, "sampling.engine": "continuous"}), ctx)
    if fits:
      return s, f"{limit}; at most {worst_case_steps(n, s, L)} decode steps"
  s = candidates[-1]
  return s, f"no slot count fits the device memory; the fewest, {s}"


_STATIC = lambda c: None if _continuous(c) else (
    "with sampling.engine = static: the static decoder has no slots; set sampling.engine=continuous (or auto) to use it")

register(Knob("sampling.slots", slot_candidates, choose_slots, applies=_continuous, unused=_STATIC, planned=True))


# ------------------------------------------------------------------------------------------ sampling.compaction

# Completions of LONG_COMPLETIONS tokens or more can end in a tail that compaction pays for; below it, every
# compaction size is a decode step compiled for nothing. bench-tail (L = 512, lognormal lengths) ran its rollout in
# 0.84x the time with 8 sizes instead of 4, and engine.simulate (bench-tail's per-step costs) puts no compaction at
# about 3x the decode time of 8 sizes; each size costs one more decode step to compile: 1.5-2 CPU-s at
# configs/grpo_arith.py:small's shape (benchmarks/compile_cost.py, docs/performance.md).


def choose_compaction(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """config_lib.COMPACTION sizes for completions of LONG_COMPLETIONS tokens or more, or as many as the (resolved)
  slots halve to over the mesh's row split; else one (no compaction)."""
  L = config.sampling.max_new_tokens
  if L >= LONG_COMPLETIONS:
    why = (f"max_new_tokens {L} >= {LONG_COMPLETIONS}: a long tail decodes on ever fewer slots (bench-tail: 0.84x "
           "the rollout of 4 sizes)")
    slots, split = int(config.sampling.slots), ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1)
    sizes = engine.compaction_sizes(slots, candidates[0], split) if slots > 0 else ()
    if 0 < len(sizes) < candidates[0]:  # what engine.compaction_sizes runs: 8 recorded and logged, 1 run, was silent
      return len(sizes), (f"{why}; sampling.slots {slots} halves to {len(sizes)} multiple(s) of mesh data*fsdp="
                          f"{split}: {sizes}")
    return candidates[0], why
  return candidates[-1], (f"max_new_tokens {L} < {LONG_COMPLETIONS}: too short a tail to pay for the decode step "
                          "each compaction size compiles")


def _compaction(config, ctx: Context) -> tuple[int, int, int, tuple[int, ...]]:
  """(levels set, slots, the mesh's row split, the sizes engine.compaction_sizes runs; () for one level)."""
  levels, split = int(config.sampling.compaction), ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1)
  slots = int(config.sampling.slots) or _rows(config) // int(config.rl.rollout_chunks)
  return levels, slots, split, engine.compaction_sizes(slots, levels, split) if levels > 1 and slots > 0 else ()


def compaction_runs(config, ctx: Context) -> int:
  """The number of slot counts the engine decodes with (Knob.runs): an older run's recorded 8 of 64 slots runs 7."""
  levels, _, _, sizes = _compaction(config, ctx)
  return len(sizes) or levels


def compaction_runs_as(config, ctx: Context) -> str | None:
  """A set sampling.compaction past the slot counts engine.compaction_sizes makes of the (resolved) slots: each
  halving must stay a multiple of the mesh's row split, so e.g. 24 slots give 4 counts, not 8."""
  levels, slots, split, sizes = _compaction(config, ctx)
  if 0 < len(sizes) < levels:
    return (f"{len(sizes)} slot counts {sizes}: sampling.slots {slots} halves to only {len(sizes)} multiple(s) of mesh "
            f"data*fsdp={split}; set sampling.compaction <= {len(sizes)}")
  return None


register(Knob("sampling.compaction", lambda c, ctx: [config_lib.COMPACTION, 1], choose_compaction,
              # the rollout carry (rl.partial_rollouts) decodes on its own fixed slots: no compaction to choose
              applies=lambda c: _continuous(c) and not c.rl.get("partial_rollouts", False), unused=_STATIC,
              runs_as=compaction_runs_as, runs=compaction_runs))



# ------------------------------------------------------------------------------------------ rl.pack_len


_PADDED = lambda c: None if config_lib.packing_on(c) else (
    "with rl.packing = off: a key of the packed passes; set rl.packing=on (or auto) to use it")


def pack_len_candidates(config, ctx: Context) -> list[int]:
  """packing.default_pack_len(P + L) for the context's backend (P + L rounded up to the 128-token tiles the
  attention kernels pad to; P + L itself on the CPU's einsum path), then P + L itself: attention per packed row
  grows with pack_len², so nothing longer is offered."""
  T = config.task.prompt_len + config.sampling.max_new_tokens
  return sorted({packing.default_pack_len(T, ctx.platform), T}, reverse=True)


def choose_pack_len(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """The longest candidate whose step fits the device memory (more room per row for the next sample)."""
  for n in candidates:
    _, fits, limit = _planned(_with(config, {"rl.pack_len": n}), ctx)
    if fits:
      T = config.task.prompt_len + config.sampling.max_new_tokens
      return n, (f"P + L = {T} to the 128 tile" if n > T else f"P + L = {T}") + f"; {limit}"
  return candidates[-1], "no pack_len fits the device memory; the shortest, P + L"


register(Knob("rl.pack_len", pack_len_candidates, choose_pack_len, applies=config_lib.packing_on, unused=_PADDED,
              planned=True))


# ------------------------------------------------------------------------------------------ rl.pack_rows


def _pass_rows(config, ctx: Context) -> tuple[int, int]:
  """(a device's rows of the packed scoring passes, pack_len): the rows the micro-batches are cut from."""
  split = ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1)
  T = config.task.prompt_len + config.sampling.max_new_tokens
  return -(-config.rl.prompts_per_step * config.rl.G // split), packing.pack_len(config, T, ctx.platform)


def pack_rows_candidates(config, ctx: Context) -> list[int]:
  """packing.default_pack_rows for this backend (the CPU: the fewest rows of CPU_MICROBATCH_TOKENS tokens; else an
  eighth of a device's rows), then halves down to 1: fewer rows per micro-batch hold fewer activations."""
  n_local, C = _pass_rows(config, ctx)
  r, out = packing.default_pack_rows(n_local, C, ctx.platform), []
  while r >= 1:
    out.append(r)
    r //= 2
  return out


def choose_pack_rows(config, ctx: Context, candidates: list[int]) -> tuple[int, str]:
  """The first candidate (the backend's default) whose step fits the device memory, else fewer rows."""
  n_local, C = _pass_rows(config, ctx)
  for r in candidates:
    _, fits, limit = _planned(_with(config, {"rl.pack_rows": r}), ctx)
    if fits:
      return r, f"{r * C} tokens per micro-batch of {n_local} rows' passes; {limit}"
  return candidates[-1], "no micro-batch fits the device memory; the fewest rows, 1"


def pack_rows_run_as(config, ctx: Context) -> str | None:
  """A set rl.pack_rows past a device's rows of a pass: packing.microbatch_rows takes the device's rows instead
  (the update's passes hold a minibatch's share of them)."""
  r, (n_local, _) = int(config.rl.pack_rows), _pass_rows(config, ctx)
  mb = config.rl.minibatches if integer(config.rl.minibatches) and config.rl.minibatches > 0 else 1
  n_update = -(-n_local // mb)
  if r <= n_update:
    return None
  where = (f"{min(r, n_local)} in the scoring passes, {n_update} in the update's ({mb} minibatches)"
           if n_update < n_local else str(n_local))
  return (f"{where}: a device holds {n_local} rows of the passes, a micro-batch at most that; set rl.pack_rows <= "
          f"{n_update} or 0 (auto)")


register(Knob("rl.pack_rows", pack_rows_candidates, choose_pack_rows, applies=config_lib.packing_on,
              unused=_PADDED, planned=True, runs_as=pack_rows_run_as))


# ------------------------------------------------------------------------------------ sampling.decode_layout


def choose_layout(config, ctx: Context, candidates: list) -> tuple[tuple[str, int | None], str]:
  """memory_plan.choose_decode with every other knob resolved (its plan costs them): gathered when it fits, else the
  smallest tensor-parallel degree that fits, else the training layout (a warning: every weight all-gathered at every
  token); an explicit `tp` stays tp: the smallest degree that fits for decode_tp 0, the largest where none does (a
  set layout is never replaced: the first run and a resume, which reads the set value, run the same). ->
  ((layout, decode_tp or None = left as set), why)."""
  del candidates
  layout, why = memory_plan.choose_decode(config, ctx.mesh, ctx.hbm_bytes, ctx.platform,
                                          decode_only=ctx.decode_only)
  return (layout.kind, layout.tp if layout.kind == "tp" else None), why


register(Knob("sampling.decode_layout", lambda c, ctx: [], choose_layout, joint=("sampling.decode_tp",),
              # a set `tp` asks for its degree only where decode_tp is auto (0); both set: "(set)", as any set knob
              pending=lambda c: c.sampling.decode_layout == "auto" or (c.sampling.decode_layout == "tp"
                                                                       and is_auto("sampling.decode_tp",
                                                                                   c.sampling.decode_tp)),
              warn=lambda pick: pick[0] == "fsdp", planned=True))


# ------------------------------------------------------------------------------------------ rl.carry_kv_groups
# Registered here, not in rl/partial.py: a knob registered where its step's module is imported was missing from the
# input checks (check_choosable) of any process that had not imported that module yet.


def _slots_per_device(config, ctx: Context) -> int:
  rl = config.rl
  slots = int(config.sampling.get("slots", 0)) or rl.prompts_per_step * rl.G
  return max(slots // max(ctx.mesh.get("data", 1) * ctx.mesh.get("fsdp", 1), 1), 1)


def _check_carry(c, ctx: Context) -> None:
  """What the resolved config must give the carry: a set rl.carry_kv_groups dividing each device's slots
  (carry.check), and a table that fits the device's memory by itself (the state holds it: plan_terms.carry_bytes)."""
  g, per = int(c.rl.carry_kv_groups), _slots_per_device(c, ctx)
  if g and per % g:
    raise ConfigError(f"config.rl.carry_kv_groups: {g} must divide each device's {per} slots (sampling.slots "
                      f"over mesh data*fsdp); set a divisor of {per}, or 0 (auto: the most up to 8 that do).")
  if ctx.hbm_bytes is None:
    return
  need = sum(plan_terms.carry_bytes(c, model_config.ModelConfig.from_config(c.model), ctx.mesh).values())
  if need > ctx.hbm_bytes:
    raise ConfigError(
        f"config.rl.max_staleness: the rollout carry's table of (1 + {c.rl.max_staleness}) x {c.rl.prompts_per_step} "
        f"groups alone needs {size(need)} per device, more than its {size(ctx.hbm_bytes)}; lower "
        "rl.max_staleness (or rl.prompts_per_step, rl.G, sampling.max_new_tokens), or add devices (mesh.fsdp).")


# rl.carry_kv_groups: how many groups of a device's slots read the completion KV, each to its own longest row
register(Knob(
    "rl.carry_kv_groups", applies=lambda c: bool(c.rl.get("partial_rollouts", False)),
    candidates=lambda c, ctx: [g for g in (1, 2, 4, 8) if _slots_per_device(c, ctx) % g == 0],
    choose=lambda c, ctx, cands: (carry_lib.kv_groups(0, _slots_per_device(c, ctx), 1),
                                  "the most up to 8 dividing a device's slots: a long row costs its group's KV read"),
    check=_check_carry))
